/* Host-side sampler: penalties -> greedy | temperature -> top-k -> top-p ->
 * min-p -> renormalise -> inverse-CDF draw (docs/sampling.md).
 *
 * Every truncation and the final draw are defined over the candidates in
 * descending order of (penalised logit, then lower token id). That is a
 * total order, so results are deterministic, and they are what a full sort
 * would give; but sorting 152k tokens per step is too slow, so we never sort
 * the vocabulary. Each "walk the sorted list until the running count or
 * probability reaches X" (top-k, top-p, the draw) is a bucket select:
 *   1. put every candidate in a bucket by x = (max_logit - logit) / T, a
 *      monotone function of the logit, so bucket order is sampling order;
 *   2. sum the weight (1 or the mass) per bucket and walk the buckets to the
 *      one where the running weight reaches X;
 *   3. sort only that bucket's candidates and walk them.
 * Two passes over the candidates plus a sort of one bucket (typically tens
 * to hundreds of tokens), the same radix-select scheme a GPU kernel uses.
 *
 * Probabilities are computed in double from the fp32 penalised logits, as
 * exp((logit - max) / T), so tiny temperatures cannot overflow and the top
 * token's unnormalised mass is exactly 1.
 *
 * One prepare() does steps 1-7 and leaves the kept set and its normaliser in
 * the sampler; rp_sampler_sample draws from it (step 8), rp_sampler_probs
 * writes it out as a vector and keeps it for rp_sampler_draw and friends.
 * Speculative decoding's distributions are therefore the sampler's own, to
 * the bit, and cannot drift from it. */
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

/* Bucket select resolution: 64 buckets per unit of x = (max - logit) / T
 * (a factor e^(1/64) in probability) up to x = 64, where the mass is already
 * below e^-64 of the top token's; one last bucket holds everything further. */
enum { BUCKETS_PER_UNIT = 64, N_BUCKETS = 64 * BUCKETS_PER_UNIT + 1 };
/* Below this many candidates a plain sort beats clearing the buckets. */
enum { SMALL_SORT = 256 };

/* The distribution of the row last prepared (steps 1-7), which the draw
 * (step 8), rp_sampler_probs and the functions after it read. */
typedef struct rp_dist {
    int point;          /* all mass on argmax: greedy, or an all -inf row */
    int32_t argmax;
    float max_logit;
    double temperature; /* 1 when point (logprobs are the log-softmax at T = 1) */
    int n;              /* sampled: s->cand[0, n) is the kept set, masses set */
    double total;       /* sampled: the kept masses' sum in that array order */
    double log_norm;    /* sampled: log(total); point: log-sum-exp at T = 1
                           (rp_sampler_probs only; NaN until then) */
    float last_logit;   /* the kept set's last token in the sampling order */
    int32_t last_id;    /* (rp_sampler_probs only) */
    int drawn;          /* a draw consumed s->cand */
    int from_probs;     /* prepared by rp_sampler_probs (not by a sample) */
} rp_dist;

struct rp_sampler {
    int vocab_size;
    rp_dist dist;           /* of the last call */
    rp_cand *cand;          /* [vocab] candidates of the current call */
    rp_cand *bucket_cands;  /* [vocab] the one bucket being sorted */
    double *bucket_weight;  /* [N_BUCKETS] */
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
    p->top_logprobs = 0;
}

/* Comparisons are written so that NaN fails them. */
int rp_sampling_params_validate(const rp_sampling_params *p, int vocab_size, rp_err *err) {
    if (vocab_size < 1) return rp_errf(err, "vocab_size must be at least 1, got %d", vocab_size);
    if (!(p->temperature >= 0.0f)) return rp_errp(err, "temperature", "temperature must be non-negative, got %g", p->temperature);
    if (!isfinite(p->temperature)) return rp_errp(err, "temperature", "temperature must be a finite number, got %g", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return rp_errp(err, "top_p", "top_p must be in (0, 1], got %g", p->top_p);
    if (p->top_k < -1) return rp_errp(err, "top_k", "top_k must be 0 (disable), or at least 1, got %d", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return rp_errp(err, "min_p", "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || !isfinite(p->repetition_penalty))
        return rp_errp(err, "repetition_penalty", "repetition_penalty must be greater than zero, got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return rp_errp(err, "presence_penalty", "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return rp_errp(err, "frequency_penalty", "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (p->top_logprobs < 0 || p->top_logprobs > RP_MAX_TOP_LOGPROBS)
        return rp_errp(err, "top_logprobs", "top_logprobs must be in [0, %d], got %d", RP_MAX_TOP_LOGPROBS, p->top_logprobs);
    return RP_OK;
}

int rp_sampling_is_greedy(const rp_sampling_params *p) { return p->temperature == 0.0f; }

void rp_sampler_apply_mask(float *logits, int vocab_size, const uint32_t *mask) {
    for (int w = 0; w < (vocab_size + 31) / 32; w++) {
        if (mask[w] == 0xffffffffu) continue;
        const int end = w * 32 + 32 < vocab_size ? w * 32 + 32 : vocab_size;
        for (int id = w * 32; id < end; id++)
            if (!(mask[w] >> (id % 32) & 1u)) logits[id] = -INFINITY;
    }
}

rp_sampler *rp_sampler_new(int vocab_size) {
    if (vocab_size < 1) return NULL;
    rp_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab_size = vocab_size;
    s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
    s->bucket_cands = malloc((size_t)vocab_size * sizeof *s->bucket_cands);
    s->bucket_weight = malloc(N_BUCKETS * sizeof *s->bucket_weight);
    s->out_count = calloc((size_t)vocab_size, sizeof *s->out_count);
    s->seen = calloc((size_t)vocab_size, sizeof *s->seen);
    if (!s->cand || !s->bucket_cands || !s->bucket_weight || !s->out_count || !s->seen) {
        rp_sampler_free(s);
        return NULL;
    }
    return s;
}

void rp_sampler_free(rp_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->bucket_cands);
    free(s->bucket_weight);
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

/* What a prefix walk measures: how many tokens (top-k) or how much mass,
 * and whether it stops at running >= target (top-k, top-p: the smallest
 * prefix that reaches it) or running > target (the inverse-CDF draw, so
 * u = 0 picks the first token). */
typedef struct prefix_goal {
    int by_mass;
    int inclusive;
    double target;
} prefix_goal;

static inline double cand_weight(const rp_cand *c, const prefix_goal *g) { return g->by_mass ? c->mass : 1.0; }

static inline int goal_reached(double weight, double target, const prefix_goal *g) {
    return g->inclusive ? weight >= target : weight > target;
}

/* x = (max - logit) / T scaled to a bucket; monotone, so a higher logit
 * never lands in a later bucket, and equal logits share one. */
static inline int bucket_of(float logit, double max_logit, double per_logit) {
    double b = ((double)max_logit - (double)logit) * per_logit;
    return b < (double)(N_BUCKETS - 1) ? (int)b : N_BUCKETS - 1;
}

/* Walks cand[0, n) in the sampling order until the running weight reaches
 * the goal, and keeps exactly the walked prefix: on return cand[0, kept)
 * holds it (in no particular order) with the candidate that reached the
 * goal last, at cand[kept - 1]. If rounding leaves the goal unreached, the
 * whole list is the prefix. n >= 1. */
static int keep_prefix(rp_sampler *s, int n, double max_logit, double temperature, prefix_goal goal) {
    rp_cand *c = s->cand;
    double target = goal.target;
    if (n <= SMALL_SORT) { /* cheaper than clearing the buckets */
        sort_cands(c, n);
        int last = 0;
        for (; last < n - 1; last++) {
            double w = cand_weight(&c[last], &goal);
            if (goal_reached(w, target, &goal)) break;
            target -= w;
        }
        return last + 1;
    }

    double *weight = s->bucket_weight;
    double per_logit = BUCKETS_PER_UNIT / temperature;
    for (int b = 0; b < N_BUCKETS; b++) weight[b] = 0.0;
    for (int i = 0; i < n; i++) weight[bucket_of(c[i].logit, max_logit, per_logit)] += cand_weight(&c[i], &goal);

    /* The bucket in which the running weight reaches the target. Every
     * candidate has positive weight, so empty buckets have weight 0. */
    int hit = -1, hit_reached = 0;
    for (int b = 0; b < N_BUCKETS; b++) {
        if (weight[b] == 0.0) continue;
        hit = b;
        if (goal_reached(weight[b], target, &goal)) {
            hit_reached = 1;
            break;
        }
        target -= weight[b];
    }
    RP_ASSERT(hit >= 0);
    if (!hit_reached) target += weight[hit]; /* ran off the end: walk the last bucket whole */

    /* Earlier buckets are kept whole; the hit bucket is sorted and walked. */
    rp_cand *in_hit = s->bucket_cands;
    int kept = 0, n_hit = 0;
    for (int i = 0; i < n; i++) {
        int b = bucket_of(c[i].logit, max_logit, per_logit);
        if (b < hit) c[kept++] = c[i];
        else if (b == hit) in_hit[n_hit++] = c[i];
    }
    sort_cands(in_hit, n_hit);
    int last = 0;
    for (; last < n_hit - 1; last++) {
        double w = cand_weight(&in_hit[last], &goal);
        if (goal_reached(w, target, &goal)) break;
        target -= w;
    }
    for (int j = 0; j <= last; j++) c[kept++] = in_hit[j];
    return kept;
}

static double total_mass(const rp_cand *c, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += c[i].mass;
    return sum;
}

/* ---- sampling ---- */

/* log(sum_i exp(logit_i - max)): the log-softmax at temperature 1 of a
 * token is logit - max - this. */
static double log_sum_exp_shifted(const float *logits, int vocab, float max_logit) {
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - (double)max_logit);
    return log(sum);
}

/* ids[0, n) = the first n tokens of the sampling order over the whole
 * vocabulary (logit descending, then lower id), n <= RP_MAX_TOP_LOGPROBS and
 * <= vocab: one pass keeping a sorted list; a token enters only if it beats
 * the list's last, and equal logits keep the earlier (lower) id first. */
static void top_ids(const float *logits, int vocab, int n, int32_t *ids) {
    float xs[RP_MAX_TOP_LOGPROBS];
    int k = 0;
    for (int i = 0; i < vocab; i++) {
        float x = logits[i];
        if (k == n && !(x > xs[n - 1])) continue;
        int j = k < n ? k++ : n - 1;
        for (; j > 0 && x > xs[j - 1]; j--) {
            xs[j] = xs[j - 1];
            ids[j] = ids[j - 1];
        }
        xs[j] = x;
        ids[j] = i;
    }
}

/* Fills top (n already set, ids chosen by top_ids) with logprobs under the
 * distribution the sampled token's logprob uses: kept = how many tokens of
 * the sampling order survived the truncations (the kept set is always a
 * prefix of the order), lp = (logit - max) / temperature - log_norm for
 * those (the sampled token's formula, so its entry is bit-identical), -inf
 * for the rest. */
static void top_fill(rp_top_logprobs *top, const float *logits, float max_logit, double temperature,
                     double log_norm, int kept) {
    for (int j = 0; j < top->n; j++) {
        float x = logits[top->ids[j]];
        top->logprobs[j] = j < kept && x != -INFINITY
                               ? (float)(((double)x - (double)max_logit) / temperature - log_norm)
                               : -INFINITY;
    }
}

/* Steps 1-7 of docs/sampling.md for one row, shared by rp_sampler_sample
 * and rp_sampler_probs so that both mean one distribution, bit for bit:
 * penalties and sanitising in place, the argmax, and for a sampled row the
 * kept set in s->cand[0, n) with its masses and their sum. Leaves it in
 * s->dist for the draw (step 8). */
static void prepare(rp_sampler *s, const rp_sampling_params *p, float *logits, const int32_t *prompt, int n_prompt,
                    const int32_t *output, int n_output) {
    RP_ASSERT(s && p && logits);
    RP_ASSERT(rp_sampling_params_validate(p, s->vocab_size, NULL) == RP_OK);
    int vocab = s->vocab_size;
    rp_dist *d = &s->dist;

    apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);

    /* Sanitize and find the argmax (strict >: ties keep the lower id; if
     * everything is -inf the argmax is token 0). */
    int argmax = 0;
    float max_logit = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float x = sanitize_logit(logits[i]);
        logits[i] = x;
        if (x > max_logit) {
            max_logit = x;
            argmax = i;
        }
    }
    d->argmax = argmax;
    d->max_logit = max_logit;
    d->log_norm = NAN;
    d->drawn = 0;
    d->from_probs = 0;
    /* greedy, or nothing can be sampled: all the mass on the argmax (token 0
     * for an all -inf row) */
    d->point = rp_sampling_is_greedy(p) || max_logit == -INFINITY;
    if (d->point) {
        d->temperature = 1.0; /* greedy logprobs are the log-softmax at T = 1 */
        d->n = 0;
        d->total = 0.0;
        return;
    }

    double temperature = p->temperature < RP_SAMPLING_MIN_TEMPERATURE ? RP_SAMPLING_MIN_TEMPERATURE
                                                                       : p->temperature;

    /* Candidates. A token whose mass exp((logit - max) / T) underflows to 0
     * can never be drawn and does not move top-p or min-p, so it is skipped;
     * without top-p, min-p is a pure logit threshold (it commutes with top-k)
     * and skips everything below max + T log(min_p) too. Both bounds are a
     * little loose on purpose: the exact tests on the mass come later. */
    double floor_logit = (double)max_logit - 760.0 * temperature;
    if (p->min_p > 0.0f && p->top_p >= 1.0f) {
        double minp_logit = (double)max_logit + temperature * log((double)p->min_p);
        minp_logit -= 1e-6 * (fabs(minp_logit) + temperature);
        if (minp_logit > floor_logit) floor_logit = minp_logit;
    }
    rp_cand *c = s->cand;
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if ((double)logits[i] < floor_logit) continue;
        c[n].mass = 0.0;
        c[n].logit = logits[i];
        c[n].id = i;
        n++;
    }

    /* top-k: keep exactly the first k (ties at the boundary go to lower ids). */
    if (p->top_k > 0 && p->top_k < n) {
        prefix_goal first_k = {.by_mass = 0, .inclusive = 1, .target = p->top_k};
        n = keep_prefix(s, n, max_logit, temperature, first_k);
        RP_ASSERT(n == p->top_k);
    }

    /* Softmax numerators; the max token has mass exactly 1. */
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
        prefix_goal nucleus = {.by_mass = 1, .inclusive = 1, .target = (double)p->top_p * total_mass(c, n)};
        n = keep_prefix(s, n, max_logit, temperature, nucleus);
    }

    /* min-p: drop tokens with prob < min_p * max prob (max mass is 1). */
    if (p->min_p > 0.0f) {
        kept = 0;
        for (int i = 0; i < n; i++)
            if (c[i].mass >= (double)p->min_p) c[kept++] = c[i];
        n = kept;
    }

    /* c[0, n) is now the kept set: the first n tokens of the sampling order
     * (in no particular order in the array). Its sum, in this array order,
     * is the normaliser of every probability and logprob of this row. */
    d->temperature = temperature;
    d->n = n;
    d->total = total_mass(c, n);
    d->log_norm = log(d->total);
}

/* Step 8: inverse CDF over the kept set in the sampling order, for the
 * uniform u in [0, 1): the first token whose running mass exceeds u * total.
 * Consumes s->cand (keep_prefix reorders and truncates it). */
static int draw_kept(rp_sampler *s, double u, float *logprob_out) {
    rp_dist *d = &s->dist;
    RP_ASSERT(!d->point && !d->drawn);
    d->drawn = 1;
    prefix_goal draw = {.by_mass = 1, .inclusive = 0, .target = u * d->total};
    const rp_cand *pick = &s->cand[keep_prefix(s, d->n, d->max_logit, d->temperature, draw) - 1];
    if (logprob_out)
        *logprob_out = (float)(((double)pick->logit - (double)d->max_logit) / d->temperature - d->log_norm);
    return pick->id;
}

int rp_sampler_sample(rp_sampler *s, const rp_sampling_params *p, float *logits,
                      const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                      uint64_t step, float *logprob_out) {
    return rp_sampler_sample_top(s, p, logits, prompt, n_prompt, output, n_output, step, logprob_out, NULL);
}

int rp_sampler_sample_top(rp_sampler *s, const rp_sampling_params *p, float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          uint64_t step, float *logprob_out, rp_top_logprobs *top_out) {
    prepare(s, p, logits, prompt, n_prompt, output, n_output);
    const rp_dist *d = &s->dist;
    int vocab = s->vocab_size;

    rp_top_logprobs *top = top_out && p->top_logprobs > 0 ? top_out : NULL;
    if (top_out) top_out->n = 0;
    if (top) {
        top->n = p->top_logprobs < vocab ? p->top_logprobs : vocab;
        top_ids(logits, vocab, top->n, top->ids);
    }

    if (d->point) {
        /* the log-softmax at temperature 1, -inf everywhere for an all -inf
         * row; only computed when asked (it costs an exp per token) */
        double log_norm = INFINITY;
        if (d->max_logit != -INFINITY && (logprob_out || top))
            log_norm = log_sum_exp_shifted(logits, vocab, d->max_logit);
        if (logprob_out) *logprob_out = d->max_logit == -INFINITY ? -INFINITY : (float)(0.0 - log_norm);
        if (top) top_fill(top, logits, d->max_logit, 1.0, log_norm, vocab);
        return d->argmax;
    }

    if (top) top_fill(top, logits, d->max_logit, d->temperature, d->log_norm, d->n);
    return draw_kept(s, (double)rp_rand_uniform(p->seed, 0, step), logprob_out);
}

/* ---- the distribution as a vector (speculative decoding) ---- */

int rp_sampler_probs(rp_sampler *s, const rp_sampling_params *p, float *logits,
                     const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                     double *probs_out) {
    prepare(s, p, logits, prompt, n_prompt, output, n_output);
    rp_dist *d = &s->dist;
    int vocab = s->vocab_size;
    d->from_probs = 1;
    for (int i = 0; i < vocab; i++) probs_out[i] = 0.0;

    if (d->point) {
        /* rp_sampler_sample always returns the argmax here; its logprob is
         * the log-softmax at T = 1 (-inf for an all -inf row) */
        d->log_norm = d->max_logit == -INFINITY ? INFINITY : log_sum_exp_shifted(logits, vocab, d->max_logit);
        d->last_logit = d->max_logit;
        d->last_id = d->argmax;
        probs_out[d->argmax] = 1.0;
        return 1;
    }

    /* The kept set is a prefix of the sampling order: remember its last
     * token, so that rp_sampler_logprob can tell kept from cut in O(1). */
    const rp_cand *c = s->cand, *last = &c[0];
    int support = 0;
    for (int i = 0; i < d->n; i++) {
        double prob = c[i].mass / d->total;
        probs_out[c[i].id] = prob;
        support += prob > 0.0;
        if (cand_before(last, &c[i])) last = &c[i];
    }
    d->last_logit = last->logit;
    d->last_id = last->id;
    return support;
}

int rp_sampler_draw(rp_sampler *s, double u, float *logprob_out) {
    const rp_dist *d = &s->dist;
    RP_ASSERT(d->from_probs && u >= 0.0 && u < 1.0);
    if (d->point) {
        if (logprob_out) *logprob_out = d->max_logit == -INFINITY ? -INFINITY : (float)(0.0 - d->log_norm);
        return d->argmax;
    }
    return draw_kept(s, u, logprob_out);
}

int rp_sampler_draw_weights(rp_sampler *s, const double *weights, double u) {
    rp_dist *d = &s->dist;
    RP_ASSERT(d->from_probs && u >= 0.0 && u < 1.0);
    if (d->point) return weights[d->argmax] > 0.0 ? d->argmax : -1;
    RP_ASSERT(!d->drawn);
    d->drawn = 1;

    /* The support with the new weights (the bucket walk needs every weight
     * positive), then the same inverse-CDF walk as the draw. */
    rp_cand *c = s->cand;
    int n = 0;
    for (int i = 0; i < d->n; i++) {
        double w = weights[c[i].id];
        RP_ASSERT(!(w > DBL_MAX)); /* finite, or the walk is meaningless */
        if (!(w > 0.0)) continue;
        c[n] = c[i];
        c[n].mass = w;
        n++;
    }
    if (n == 0) return -1;
    prefix_goal draw = {.by_mass = 1, .inclusive = 0, .target = u * total_mass(c, n)};
    return c[keep_prefix(s, n, d->max_logit, d->temperature, draw) - 1].id;
}

float rp_sampler_logprob(const rp_sampler *s, const float *logits, int32_t token) {
    const rp_dist *d = &s->dist;
    RP_ASSERT(d->from_probs && token >= 0 && token < s->vocab_size);
    float x = logits[token];
    if (d->max_logit == -INFINITY || x == -INFINITY) return -INFINITY;
    /* cut by top-k, top-p, min-p or underflow: after the kept set's last token */
    if (!d->point && (x < d->last_logit || (x == d->last_logit && token > d->last_id))) return -INFINITY;
    /* the formula of the sampled token's logprob and of top_fill, so the
     * values are the same bits */
    return (float)(((double)x - (double)d->max_logit) / d->temperature - d->log_norm);
}
