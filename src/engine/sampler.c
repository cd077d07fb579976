/* Host-side sampler: penalties -> greedy | temperature -> top-k -> top-p ->
 * min-p -> renormalise -> inverse-CDF draw (docs/sampling.md).
 *
 * Every truncation and the final draw are defined over the candidates in
 * descending order of (penalised logit, then lower token id first). That
 * order is a total order, so the result is deterministic, and it is what a
 * full sort would give; but a 152k-token sort per step is too slow, so we
 * never sort the whole vocabulary. Instead:
 *   - top-k is a quickselect on the key (expected O(vocab));
 *   - top-p and the draw are a "weighted quickselect": partition around a
 *     pivot, sum the probability mass of the part that comes first in the
 *     order, and descend into whichever side the running mass crosses the
 *     target in (expected O(vocab)).
 * Only the last small range (or a pathological one) is actually sorted.
 *
 * Probabilities are computed in double from the fp32 penalised logits, as
 * exp((logit - max) / T), so tiny temperatures cannot overflow and the top
 * token's unnormalised mass is exactly 1. */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "util/rng.h"

/* One surviving token. mass = exp((logit - max_logit) / T), unnormalised. */
typedef struct rp_cand {
    double mass;
    float logit;
    int32_t id;
} rp_cand;

struct rp_sampler {
    int vocab_size;
    rp_cand *cand;          /* [vocab] candidates of the current call */
    uint32_t *out_count;    /* [vocab] generated-token counts; all zero between calls */
    uint8_t *seen;          /* [vocab] prompt-or-output marks; all zero between calls */
};

void rp_sampling_params_default(rp_sampling_params *p) {
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->has_seed = 0;
}

/* Comparisons are written so that NaN fails them. */
int rp_sampling_params_validate(const rp_sampling_params *p, int vocab_size, rp_err *err) {
    if (vocab_size < 1) return rp_errf(err, "vocab_size must be at least 1, got %d", vocab_size);
    if (!(p->temperature >= 0.0f)) return rp_errf(err, "temperature must be non-negative, got %g", p->temperature);
    if (!isfinite(p->temperature)) return rp_errf(err, "temperature must be a finite number, got %g", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return rp_errf(err, "top_p must be in (0, 1], got %g", p->top_p);
    if (p->top_k < -1) return rp_errf(err, "top_k must be 0 (disable), or at least 1, got %d", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return rp_errf(err, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return rp_errf(err, "repetition_penalty must be greater than zero, got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return rp_errf(err, "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return rp_errf(err, "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    return RP_OK;
}

int rp_sampling_is_greedy(const rp_sampling_params *p) { return p->temperature == 0.0f; }

rp_sampler *rp_sampler_new(int vocab_size) {
    if (vocab_size < 1) return NULL;
    rp_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab_size = vocab_size;
    s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
    s->out_count = calloc((size_t)vocab_size, sizeof *s->out_count);
    s->seen = calloc((size_t)vocab_size, sizeof *s->seen);
    if (!s->cand || !s->out_count || !s->seen) {
        rp_sampler_free(s);
        return NULL;
    }
    return s;
}

void rp_sampler_free(rp_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->out_count);
    free(s->seen);
    free(s);
}

/* ---- penalties (vLLM: repetition, then frequency, then presence) ---- */

static void apply_penalties(rp_sampler *s, const rp_sampling_params *p, float *logits,
                            const int32_t *prompt, int n_prompt, const int32_t *output, int n_output) {
    int vocab = s->vocab_size;
    for (int i = 0; i < n_prompt; i++) RP_ASSERT(prompt[i] >= 0 && prompt[i] < vocab);
    for (int i = 0; i < n_output; i++) RP_ASSERT(output[i] >= 0 && output[i] < vocab);

    /* Repetition: once per distinct token of prompt + output. Mark, then
     * apply on the first marked occurrence and clear, so the scratch is zero
     * again on return without an O(vocab) reset. */
    if (p->repetition_penalty != 1.0f) {
        float rep = p->repetition_penalty;
        for (int i = 0; i < n_prompt; i++) s->seen[prompt[i]] = 1;
        for (int i = 0; i < n_output; i++) s->seen[output[i]] = 1;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (!s->seen[t]) continue;
                s->seen[t] = 0;
                logits[t] = logits[t] > 0.0f ? logits[t] / rep : logits[t] * rep;
            }
        }
    }

    /* Frequency and presence: generated tokens only. vLLM computes
     * logits -= f * count; logits -= p * (count > 0), in fp32. */
    if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) {
        for (int i = 0; i < n_output; i++) s->out_count[output[i]]++;
        for (int i = 0; i < n_output; i++) {
            int32_t t = output[i];
            uint32_t count = s->out_count[t];
            if (!count) continue; /* already applied */
            s->out_count[t] = 0;
            logits[t] -= p->frequency_penalty * (float)count;
            logits[t] -= p->presence_penalty;
        }
    }
}

/* NaN carries no information: it must never win. +inf would make the softmax
 * NaN; FLT_MAX gives the limit (all mass on the +inf tokens). */
static inline float sanitize_logit(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    return x;
}

/* ---- ordering and selection over candidates ---- */

/* The sampling order: higher logit first, then lower id. A total order. */
static inline int cand_before(const rp_cand *a, const rp_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *a, const void *b) {
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static inline void cand_swap(rp_cand *a, rp_cand *b) {
    rp_cand t = *a;
    *a = *b;
    *b = t;
}

static void sort_cands(rp_cand *c, int n) {
    if (n > 32) {
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        return;
    }
    for (int i = 1; i < n; i++) {
        rp_cand x = c[i];
        int j = i;
        for (; j > 0 && cand_before(&x, &c[j - 1]); j--) c[j] = c[j - 1];
        c[j] = x;
    }
}

/* Partitions c[lo, hi) around a median-of-three pivot. On return the pivot
 * is at the returned index m, c[lo, m) come before it in the sampling order
 * and c(m, hi) after it; *mass_before is the mass of c[lo, m). */
static int partition(rp_cand *c, int lo, int hi, double *mass_before) {
    int mid = lo + (hi - lo) / 2, last = hi - 1;
    /* Order c[lo], c[mid], c[last]; the median ends up at mid. */
    if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
    if (cand_before(&c[last], &c[mid])) cand_swap(&c[last], &c[mid]);
    if (cand_before(&c[mid], &c[lo])) cand_swap(&c[mid], &c[lo]);
    cand_swap(&c[mid], &c[last]);
    rp_cand pivot = c[last];
    int store = lo;
    double mass = 0.0;
    for (int i = lo; i < last; i++) {
        if (cand_before(&c[i], &pivot)) {
            mass += c[i].mass;
            cand_swap(&c[i], &c[store]);
            store++;
        }
    }
    cand_swap(&c[store], &c[last]);
    *mass_before = mass;
    return store;
}

/* Quickselect bounds: below SMALL we sort; after MAX_ROUNDS partitions
 * (only reached on adversarial input) we sort what is left. */
enum { SELECT_SMALL = 16, SELECT_MAX_ROUNDS = 64 };

/* Reorders c[0, n) so that c[0, k) are the first k in the sampling order. */
static void select_first_k(rp_cand *c, int n, int k) {
    int lo = 0, hi = n;
    for (int round = 0; hi - lo > SELECT_SMALL && round < SELECT_MAX_ROUNDS; round++) {
        double unused;
        int m = partition(c, lo, hi, &unused);
        if (m == k || m == k - 1) return;
        if (m < k) lo = m + 1;
        else hi = m;
    }
    sort_cands(c + lo, hi - lo);
}

/* Whether the running mass `mass` has reached `target`: mass >= target for
 * top-p (smallest prefix whose mass reaches top_p), mass > target for the
 * inverse-CDF draw (a zero-mass token can never be drawn). */
static inline int reached(double mass, double target, int inclusive) {
    return inclusive ? mass >= target : mass > target;
}

/* Walks c[0, n) in the sampling order and returns the index (after
 * reordering) of the first candidate at which the running mass reaches
 * target. On return c[0, idx) are exactly the candidates that come before
 * it. If rounding leaves target unreached, returns the last candidate of
 * the range it ended in (the last overall when target exceeds the total). */
static int select_by_mass(rp_cand *c, int n, double target, int inclusive) {
    int lo = 0, hi = n;
    for (int round = 0; hi - lo > SELECT_SMALL && round < SELECT_MAX_ROUNDS; round++) {
        double before;
        int m = partition(c, lo, hi, &before);
        if (m > lo && reached(before, target, inclusive)) {
            hi = m;
            continue;
        }
        target -= before;
        if (reached(c[m].mass, target, inclusive) || m + 1 == hi) return m;
        target -= c[m].mass;
        lo = m + 1;
    }
    sort_cands(c + lo, hi - lo);
    for (int i = lo; i < hi; i++) {
        if (reached(c[i].mass, target, inclusive)) return i;
        target -= c[i].mass;
    }
    return hi - 1;
}

static double total_mass(const rp_cand *c, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += c[i].mass;
    return sum;
}

/* ---- the two paths ---- */

static int sample_greedy(const float *logits, int vocab, float *logprob_out) {
    int best = 0;
    float best_logit = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] > best_logit) { /* strict: ties keep the lower id */
            best_logit = logits[i];
            best = i;
        }
    }
    if (logprob_out) {
        if (best_logit == -INFINITY) {
            *logprob_out = -INFINITY;
        } else {
            double sum = 0.0;
            for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - (double)best_logit);
            *logprob_out = (float)(-log(sum));
        }
    }
    return best;
}

int rp_sampler_sample(rp_sampler *s, const rp_sampling_params *p, float *logits,
                      const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                      uint64_t step, float *logprob_out) {
    RP_ASSERT(s && p && logits);
    RP_ASSERT(rp_sampling_params_validate(p, s->vocab_size, NULL) == RP_OK);
    int vocab = s->vocab_size;

    apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
    for (int i = 0; i < vocab; i++) logits[i] = sanitize_logit(logits[i]);

    if (rp_sampling_is_greedy(p)) return sample_greedy(logits, vocab, logprob_out);

    /* Candidates: every token with a finite logit. */
    rp_cand *c = s->cand;
    int n = 0;
    float max_logit = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        if (logits[i] > max_logit) max_logit = logits[i];
        c[n].mass = 0.0;
        c[n].logit = logits[i];
        c[n].id = i;
        n++;
    }
    if (n == 0) { /* nothing can be sampled: the argmax, i.e. token 0 */
        if (logprob_out) *logprob_out = -INFINITY;
        return 0;
    }

    double temperature = p->temperature < RP_SAMPLING_MIN_TEMPERATURE ? RP_SAMPLING_MIN_TEMPERATURE
                                                                       : p->temperature;

    /* top-k: keep exactly the first k (ties at the boundary go to lower ids). */
    if (p->top_k > 0 && p->top_k < n) {
        select_first_k(c, n, p->top_k);
        n = p->top_k;
    }

    /* Softmax numerators. Tokens whose mass underflows to 0 can never be
     * drawn and do not change top-p or min-p; dropping them keeps every
     * candidate positive. The max token has mass exactly 1. */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        double mass = exp(((double)c[i].logit - (double)max_logit) / temperature);
        if (mass > 0.0) {
            c[kept] = c[i];
            c[kept].mass = mass;
            kept++;
        }
    }
    n = kept;

    /* top-p: the smallest prefix whose probability reaches top_p. */
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * total_mass(c, n);
        n = select_by_mass(c, n, target, 1) + 1;
    }

    /* min-p: drop tokens with prob < min_p * max prob (max mass is 1). */
    if (p->min_p > 0.0f) {
        kept = 0;
        for (int i = 0; i < n; i++)
            if (c[i].mass >= (double)p->min_p) c[kept++] = c[i];
        n = kept;
    }

    /* Renormalise and draw by inverse CDF in the sampling order. */
    double total = total_mass(c, n);
    double u = (double)rp_rand_uniform(p->seed, 0, step);
    int idx = select_by_mass(c, n, u * total, 0);
    if (logprob_out)
        *logprob_out = (float)(((double)c[idx].logit - (double)max_logit) / temperature - log(total));
    return c[idx].id;
}
