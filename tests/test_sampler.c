/* Tests for the host sampler (src/engine/sampler.c).
 *
 * The checks compare against a plain float64 reference written here: full
 * sort, softmax, then top-k / top-p / min-p exactly as docs/sampling.md
 * states them. Distributions are checked two ways: draw by draw (the
 * sampler's token for step n must be the reference inverse-CDF pick for
 * u = rp_rand_uniform(seed, 0, n)), and statistically (chi-square of many
 * draws against the reference probabilities, excluded tokens never drawn). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/logit_proc.h"
#include "engine/prompt_logprobs.h"
#include "engine/sampler.h"
#include "util/rng.h"

/* ---- helpers ---- */

/* Deterministic roughly-normal logits: Box-Muller on the project RNG. */
static void fill_logits(float *logits, int vocab, uint64_t seed, float scale) {
    for (int i = 0; i < vocab; i++) {
        double u1 = rp_rand_uniform(seed, 7, 2 * (uint64_t)i) + 1e-9;
        double u2 = rp_rand_uniform(seed, 7, 2 * (uint64_t)i + 1);
        logits[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

static rp_sampling_params params(float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    rp_sampling_params p;
    rp_sampling_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    p.has_seed = 1;
    return p;
}

/* Samples from a copy of logits (the sampler rewrites its input). */
static int sample_copy(rp_sampler *s, const rp_sampling_params *p, const float *logits, int vocab,
                       float *scratch, uint64_t step, float *logprob) {
    memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
    return rp_sampler_sample(s, p, scratch, NULL, 0, NULL, 0, step, logprob);
}

/* ---- float64 reference ---- */

static const float *g_sort_logits;
static int ref_cmp(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float li = g_sort_logits[i], lj = g_sort_logits[j];
    if (li != lj) return li > lj ? -1 : 1;
    return i < j ? -1 : i > j ? 1 : 0;
}

typedef struct ref_dist {
    int vocab;
    int *order;   /* token ids, descending (logit, then lower id) */
    double *prob; /* [vocab] final probability; 0 = excluded */
} ref_dist;

/* The reference: sort everything, softmax(l / T), keep the first top_k,
 * renormalise, keep the smallest prefix whose cumulative prob >= top_p,
 * renormalise, drop prob < min_p * max prob, renormalise. Logits are the
 * already-penalised values; no NaN/inf here. */
static void ref_build(ref_dist *r, const float *logits, int vocab, const rp_sampling_params *p) {
    r->vocab = vocab;
    r->order = malloc((size_t)vocab * sizeof *r->order);
    r->prob = calloc((size_t)vocab, sizeof *r->prob);
    assert_non_null(r->order);
    assert_non_null(r->prob);
    for (int i = 0; i < vocab; i++) r->order[i] = i;
    g_sort_logits = logits;
    qsort(r->order, (size_t)vocab, sizeof *r->order, ref_cmp);

    double T = p->temperature < 0.01f ? 0.01f : p->temperature;
    double max = logits[r->order[0]];
    int n = vocab;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double *pr = malloc((size_t)vocab * sizeof *pr); /* by rank */
    double sum = 0;
    for (int k = 0; k < n; k++) sum += pr[k] = exp(((double)logits[r->order[k]] - max) / T);
    for (int k = 0; k < n; k++) pr[k] /= sum;
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int k = 0; k < n; k++) {
            cum += pr[k];
            if (cum >= p->top_p) {
                keep = k + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int k = 0; k < n; k++) sum += pr[k];
        for (int k = 0; k < n; k++) pr[k] /= sum;
    }
    if (p->min_p > 0.0f) {
        double threshold = p->min_p * pr[0];
        int keep = 0;
        while (keep < n && pr[keep] >= threshold) keep++; /* descending, so a prefix */
        n = keep;
        sum = 0;
        for (int k = 0; k < n; k++) sum += pr[k];
        for (int k = 0; k < n; k++) pr[k] /= sum;
    }
    for (int k = 0; k < n; k++) r->prob[r->order[k]] = pr[k];
    free(pr);
}

/* Inverse CDF over the reference order: first token whose cumulative
 * probability exceeds u. */
static int ref_pick(const ref_dist *r, double u) {
    double cum = 0;
    int last = r->order[0];
    for (int k = 0; k < r->vocab; k++) {
        int t = r->order[k];
        if (r->prob[t] == 0) continue;
        cum += r->prob[t];
        last = t;
        if (cum > u) return t;
    }
    return last;
}

static void ref_free(ref_dist *r) {
    free(r->order);
    free(r->prob);
}

/* Draw by draw: the sampler's pick equals the reference pick for the same
 * uniform, and its logprob equals the reference log-probability. */
static void check_draws_match_reference(const float *logits, int vocab, const rp_sampling_params *p, int n_draws) {
    ref_dist r;
    ref_build(&r, logits, vocab, p);
    rp_sampler *s = rp_sampler_new(vocab);
    assert_non_null(s);
    float *scratch = malloc((size_t)vocab * sizeof *scratch);
    for (int step = 0; step < n_draws; step++) {
        float lp;
        int tok = sample_copy(s, p, logits, vocab, scratch, (uint64_t)step, &lp);
        int want = ref_pick(&r, rp_rand_uniform(p->seed, 0, (uint64_t)step));
        if (tok != want)
            fail_msg("step %d: sampler picked %d, reference %d (T=%g k=%d p=%g min_p=%g vocab=%d)", step, tok,
                     want, p->temperature, p->top_k, p->top_p, p->min_p, vocab);
        assert_true(r.prob[tok] > 0);
        assert_float_equal(lp, log(r.prob[tok]), 1e-4);
    }
    free(scratch);
    rp_sampler_free(s);
    ref_free(&r);
}

/* Statistically: n_draws draws (steps 0..n-1) never hit an excluded token and
 * their histogram passes a chi-square test against the reference. Tokens
 * with expected count < 5 are pooled into one bin. */
static void check_distribution(const float *logits, int vocab, const rp_sampling_params *p, int n_draws) {
    ref_dist r;
    ref_build(&r, logits, vocab, p);
    rp_sampler *s = rp_sampler_new(vocab);
    assert_non_null(s);
    float *scratch = malloc((size_t)vocab * sizeof *scratch);
    long *count = calloc((size_t)vocab, sizeof *count);
    for (int step = 0; step < n_draws; step++) {
        int tok = sample_copy(s, p, logits, vocab, scratch, (uint64_t)step, NULL);
        assert_true(tok >= 0 && tok < vocab);
        count[tok]++;
    }
    double chi2 = 0, pooled_obs = 0, pooled_exp = 0;
    int bins = 0;
    for (int t = 0; t < vocab; t++) {
        double expect = r.prob[t] * n_draws;
        if (r.prob[t] == 0) {
            if (count[t] != 0) fail_msg("token %d drawn %ld times but excluded by the reference", t, count[t]);
            continue;
        }
        if (expect < 5) {
            pooled_obs += count[t];
            pooled_exp += expect;
            continue;
        }
        chi2 += (count[t] - expect) * (count[t] - expect) / expect;
        bins++;
        /* Also a per-token bound: 6 standard deviations. */
        double sd = sqrt(n_draws * r.prob[t] * (1 - r.prob[t]));
        if (fabs(count[t] - expect) > 6 * sd + 1)
            fail_msg("token %d: %ld draws, expected %.1f (sd %.1f)", t, count[t], expect, sd);
    }
    if (pooled_exp > 0) {
        chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
        bins++;
    }
    int df = bins > 1 ? bins - 1 : 1;
    /* Mean df, sd sqrt(2 df): 6 sd above the mean never happens by chance. */
    double limit = df + 6 * sqrt(2.0 * df);
    if (chi2 > limit) fail_msg("chi-square %.1f over %d bins exceeds %.1f", chi2, bins, limit);
    free(count);
    free(scratch);
    rp_sampler_free(s);
    ref_free(&r);
}

/* ---- validation ---- */

static void expect_invalid(const rp_sampling_params *p, int vocab, const char *msg) {
    rp_err err = {0};
    assert_int_equal(rp_sampling_params_validate(p, vocab, &err), RP_ERR);
    if (!strstr(err.msg, msg)) fail_msg("message \"%s\" does not contain \"%s\"", err.msg, msg);
}

static void expect_valid(const rp_sampling_params *p, int vocab) {
    rp_err err = {0};
    int rc = rp_sampling_params_validate(p, vocab, &err);
    if (rc != RP_OK) fail_msg("rejected: %s", err.msg);
}

static void test_defaults(void **state) {
    (void)state;
    rp_sampling_params p;
    memset(&p, 0xff, sizeof p);
    rp_sampling_params_default(&p);
    assert_true(p.temperature == 1.0f);
    assert_true(p.top_p == 1.0f);
    assert_true(p.top_k == 0 || p.top_k == -1);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_int_equal(p.has_seed, 0);
    assert_false(rp_sampling_is_greedy(&p));
    expect_valid(&p, 100);
    p.temperature = 0.0f;
    assert_true(rp_sampling_is_greedy(&p));
    p.temperature = 1e-6f;
    assert_false(rp_sampling_is_greedy(&p));
}

static void test_validate_boundaries(void **state) {
    (void)state;
    rp_sampling_params d, p;
    rp_sampling_params_default(&d);

    /* temperature */
    p = d; p.temperature = 0.0f; expect_valid(&p, 10);
    p = d; p.temperature = 1e-6f; expect_valid(&p, 10);
    p = d; p.temperature = 100.0f; expect_valid(&p, 10);
    p = d; p.temperature = -1.0f; expect_invalid(&p, 10, "temperature must be non-negative, got -1");
    p = d; p.temperature = -1e-7f; expect_invalid(&p, 10, "temperature must be non-negative");
    p = d; p.temperature = NAN; expect_invalid(&p, 10, "temperature");
    p = d; p.temperature = INFINITY; expect_invalid(&p, 10, "temperature must be a finite number, got inf");

    /* top_p */
    p = d; p.top_p = 1.0f; expect_valid(&p, 10);
    p = d; p.top_p = 1e-9f; expect_valid(&p, 10);
    p = d; p.top_p = 0.0f; expect_invalid(&p, 10, "top_p must be in (0, 1], got 0");
    p = d; p.top_p = -0.5f; expect_invalid(&p, 10, "top_p must be in (0, 1], got -0.5");
    p = d; p.top_p = 1.0001f; expect_invalid(&p, 10, "top_p must be in (0, 1], got 1.0001");
    p = d; p.top_p = NAN; expect_invalid(&p, 10, "top_p must be in (0, 1]");

    /* top_k: -1 and 0 disable, >= 1 keeps k, larger than the vocab is fine */
    p = d; p.top_k = -1; expect_valid(&p, 10);
    p = d; p.top_k = 0; expect_valid(&p, 10);
    p = d; p.top_k = 1; expect_valid(&p, 10);
    p = d; p.top_k = 1000000; expect_valid(&p, 10);
    p = d; p.top_k = -2; expect_invalid(&p, 10, "top_k must be 0 (disable), or at least 1, got -2");

    /* min_p */
    p = d; p.min_p = 0.0f; expect_valid(&p, 10);
    p = d; p.min_p = 1.0f; expect_valid(&p, 10);
    p = d; p.min_p = -0.01f; expect_invalid(&p, 10, "min_p must be in [0, 1], got -0.01");
    p = d; p.min_p = 1.5f; expect_invalid(&p, 10, "min_p must be in [0, 1], got 1.5");
    p = d; p.min_p = NAN; expect_invalid(&p, 10, "min_p must be in [0, 1]");

    /* repetition_penalty */
    p = d; p.repetition_penalty = 1e-3f; expect_valid(&p, 10);
    p = d; p.repetition_penalty = 5.0f; expect_valid(&p, 10);
    p = d; p.repetition_penalty = 0.0f; expect_invalid(&p, 10, "repetition_penalty must be greater than zero, got 0");
    p = d; p.repetition_penalty = -2.0f; expect_invalid(&p, 10, "repetition_penalty must be greater than zero, got -2");
    p = d; p.repetition_penalty = NAN; expect_invalid(&p, 10, "repetition_penalty");

    /* presence / frequency */
    p = d; p.presence_penalty = -2.0f; expect_valid(&p, 10);
    p = d; p.presence_penalty = 2.0f; expect_valid(&p, 10);
    p = d; p.presence_penalty = 2.01f; expect_invalid(&p, 10, "presence_penalty must be in [-2, 2], got 2.01");
    p = d; p.presence_penalty = -2.5f; expect_invalid(&p, 10, "presence_penalty must be in [-2, 2], got -2.5");
    p = d; p.frequency_penalty = -2.0f; expect_valid(&p, 10);
    p = d; p.frequency_penalty = 2.0f; expect_valid(&p, 10);
    p = d; p.frequency_penalty = 3.0f; expect_invalid(&p, 10, "frequency_penalty must be in [-2, 2], got 3");
    p = d; p.frequency_penalty = NAN; expect_invalid(&p, 10, "frequency_penalty");

    /* vocab */
    p = d; expect_invalid(&p, 0, "vocab_size must be at least 1, got 0");
    assert_null(rp_sampler_new(0));
}

/* ---- greedy ---- */

static void test_greedy_is_argmax(void **state) {
    (void)state;
    int vocab = 1000;
    rp_sampler *s = rp_sampler_new(vocab);
    float *logits = malloc(vocab * sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
    rp_sampling_params p = params(0.0f, 0, 1.0f, 0.0f, 1);
    for (uint64_t trial = 0; trial < 50; trial++) {
        fill_logits(logits, vocab, trial, 3.0f);
        int best = 0;
        for (int i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        double sum = 0;
        for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - logits[best]);
        float lp;
        /* Greedy ignores seed and step. */
        p.seed = trial * 31;
        assert_int_equal(sample_copy(s, &p, logits, vocab, scratch, trial, &lp), best);
        assert_float_equal(lp, -log(sum), 1e-5);
    }
    /* Ties go to the lowest id. */
    for (int i = 0; i < vocab; i++) logits[i] = (i == 17 || i == 400 || i == 999) ? 5.0f : 1.0f;
    assert_int_equal(sample_copy(s, &p, logits, vocab, scratch, 0, NULL), 17);
    for (int i = 0; i < vocab; i++) logits[i] = 0.0f;
    float lp;
    assert_int_equal(sample_copy(s, &p, logits, vocab, scratch, 0, &lp), 0);
    assert_float_equal(lp, -log((double)vocab), 1e-5);
    free(logits);
    free(scratch);
    rp_sampler_free(s);
}

/* ---- determinism ---- */

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    int vocab = 500, steps = 2000;
    float *logits = malloc(vocab * sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
    fill_logits(logits, vocab, 42, 1.0f);
    rp_sampler *a = rp_sampler_new(vocab), *b = rp_sampler_new(vocab);
    rp_sampling_params p1 = params(1.0f, 0, 1.0f, 0.0f, 1234);
    rp_sampling_params p2 = params(1.0f, 0, 1.0f, 0.0f, 1235);
    int *seq = malloc(steps * sizeof *seq);
    int differ = 0;
    for (int step = 0; step < steps; step++) {
        seq[step] = sample_copy(a, &p1, logits, vocab, scratch, (uint64_t)step, NULL);
        /* Another sampler (fresh scratch) with the same seed agrees. */
        assert_int_equal(sample_copy(b, &p1, logits, vocab, scratch, (uint64_t)step, NULL), seq[step]);
        differ += sample_copy(b, &p2, logits, vocab, scratch, (uint64_t)step, NULL) != seq[step];
    }
    /* With ~500 plausible tokens two seeds agree on well under 10% of steps. */
    if (differ < steps * 9 / 10) fail_msg("seeds 1234 and 1235 differ at only %d of %d steps", differ, steps);
    /* No dependence on history: steps in reverse order give the same tokens. */
    for (int step = steps - 1; step >= 0; step--)
        assert_int_equal(sample_copy(b, &p1, logits, vocab, scratch, (uint64_t)step, NULL), seq[step]);
    /* Successive steps are not stuck on one token. */
    int distinct_from_first = 0;
    for (int step = 1; step < steps; step++) distinct_from_first += seq[step] != seq[0];
    assert_true(distinct_from_first > steps / 2);
    free(seq);
    free(logits);
    free(scratch);
    rp_sampler_free(a);
    rp_sampler_free(b);
}

/* ---- distributions ---- */

static void test_distribution_temperature(void **state) {
    (void)state;
    /* A vocabulary above the small-list cut-off goes through the bucket select. */
    float wide[1000];
    fill_logits(wide, 1000, 6, 1.0f);
    rp_sampling_params pw = params(1.0f, 0, 1.0f, 0.0f, 98);
    check_distribution(wide, 1000, &pw, 50000);

    int vocab = 40;
    float logits[40];
    fill_logits(logits, vocab, 5, 1.5f);
    const float temps[] = {1.0f, 0.5f, 2.0f, 0.05f};
    for (size_t i = 0; i < sizeof temps / sizeof temps[0]; i++) {
        rp_sampling_params p = params(temps[i], 0, 1.0f, 0.0f, 99 + i);
        check_distribution(logits, vocab, &p, 100000);
        check_draws_match_reference(logits, vocab, &p, 5000);
    }
}

static void test_tiny_temperature_is_clamped(void **state) {
    (void)state;
    /* vLLM raises 0 < T < 0.01 to 0.01: the draws must be identical. */
    int vocab = 64;
    float logits[64], scratch[64];
    for (int i = 0; i < vocab; i++) logits[i] = 0.01f * (float)(i % 7); /* close logits: T matters */
    rp_sampler *s = rp_sampler_new(vocab);
    rp_sampling_params tiny = params(1e-4f, 0, 1.0f, 0.0f, 3), floor = params(0.01f, 0, 1.0f, 0.0f, 3);
    int not_greedy = 0;
    for (int step = 0; step < 500; step++) {
        float lp1, lp2;
        int t1 = sample_copy(s, &tiny, logits, vocab, scratch, (uint64_t)step, &lp1);
        int t2 = sample_copy(s, &floor, logits, vocab, scratch, (uint64_t)step, &lp2);
        assert_int_equal(t1, t2);
        assert_float_equal(lp1, lp2, 1e-6);
        not_greedy += t1 != 6;
    }
    assert_true(not_greedy > 100); /* at T = 0.01 a 0.01 logit gap is e^-1, not greedy */
    check_draws_match_reference(logits, vocab, &tiny, 2000);
    rp_sampler_free(s);
}

static void test_distribution_top_k(void **state) {
    (void)state;
    int vocab = 60;
    float logits[60];
    fill_logits(logits, vocab, 11, 1.0f);
    const int ks[] = {1, 2, 5, 17, 59, 60, 1000};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        rp_sampling_params p = params(0.8f, ks[i], 1.0f, 0.0f, 7 + i);
        check_distribution(logits, vocab, &p, 100000);
        check_draws_match_reference(logits, vocab, &p, 3000);
    }
}

static void test_distribution_top_p(void **state) {
    (void)state;
    int vocab = 60;
    float logits[60];
    fill_logits(logits, vocab, 12, 1.5f);
    const float ps[] = {0.3f, 0.6f, 0.9f, 0.999f};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        rp_sampling_params p = params(1.0f, 0, ps[i], 0.0f, 70 + i);
        check_distribution(logits, vocab, &p, 100000);
        check_draws_match_reference(logits, vocab, &p, 3000);
    }
}

static void test_distribution_min_p(void **state) {
    (void)state;
    int vocab = 60;
    float logits[60];
    fill_logits(logits, vocab, 13, 1.5f);
    const float mps[] = {0.01f, 0.1f, 0.5f, 1.0f};
    for (size_t i = 0; i < sizeof mps / sizeof mps[0]; i++) {
        rp_sampling_params p = params(1.0f, 0, 1.0f, mps[i], 170 + i);
        check_distribution(logits, vocab, &p, 100000);
        check_draws_match_reference(logits, vocab, &p, 3000);
    }
}

static void test_distribution_combined(void **state) {
    (void)state;
    int vocab = 300;
    float logits[300];
    fill_logits(logits, vocab, 14, 2.0f);
    rp_sampling_params p = params(0.7f, 40, 0.85f, 0.02f, 5);
    check_distribution(logits, vocab, &p, 50000);
    check_draws_match_reference(logits, vocab, &p, 3000);
    /* min_p without top_p takes the logit pre-filter path. */
    p = params(0.7f, 100, 1.0f, 0.02f, 9);
    check_distribution(logits, vocab, &p, 50000);
    check_draws_match_reference(logits, vocab, &p, 3000);
    p = params(1.3f, 200, 0.95f, 0.001f, 6);
    check_distribution(logits, vocab, &p, 50000);
    check_draws_match_reference(logits, vocab, &p, 3000);
}

/* Larger vocabularies exercise the partition-based selection on big ranges,
 * including many exactly tied logits (quantised values). */
static void test_draws_match_reference_large(void **state) {
    (void)state;
    int vocab = 5000;
    float *logits = malloc(vocab * sizeof *logits);
    fill_logits(logits, vocab, 15, 2.5f);
    rp_sampling_params cfgs[] = {
        params(1.0f, 0, 1.0f, 0.0f, 1),   params(0.6f, 50, 1.0f, 0.0f, 2),
        params(1.0f, 0, 0.9f, 0.0f, 3),   params(1.0f, 0, 1.0f, 0.05f, 4),
        params(0.9f, 1000, 0.95f, 0.001f, 5),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_draws_match_reference(logits, vocab, &cfgs[i], 1000);
    for (int i = 0; i < vocab; i++) logits[i] = roundf(logits[i] * 2.0f) / 2.0f; /* heavy ties */
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_draws_match_reference(logits, vocab, &cfgs[i], 1000);
    free(logits);
}

/* ---- exact boundaries (equal logits give exactly equal masses) ---- */

/* top-p keeps the smallest prefix whose probability reaches top_p: with n
 * equal tokens and top_p = 1/2 that is exactly n/2 tokens (vLLM drops a
 * token once the mass before it is >= top_p). The inverse-CDF draw picks
 * the first token whose cumulative probability exceeds u, so a u exactly on
 * a boundary goes to the next token. Both the sorted path (small lists) and
 * the bucket path (large lists) must agree. */
static void test_exact_boundaries(void **state) {
    (void)state;
    const int sizes[] = {4, 1024};
    for (size_t si = 0; si < 2; si++) {
        int vocab = sizes[si];
        float *logits = calloc(vocab, sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
        rp_sampler *s = rp_sampler_new(vocab);
        rp_sampling_params half = params(1.0f, 0, 0.5f, 0.0f, 5), three_q = params(1.0f, 0, 0.75f, 0.0f, 5);
        int max_half = -1, max_three_q = -1;
        for (int step = 0; step < 4000; step++) {
            float lp;
            int t = sample_copy(s, &half, logits, vocab, scratch, (uint64_t)step, &lp);
            if (t > max_half) max_half = t;
            assert_float_equal(lp, -log(vocab / 2.0), 1e-5);
            t = sample_copy(s, &three_q, logits, vocab, scratch, (uint64_t)step, NULL);
            if (t > max_three_q) max_three_q = t;
        }
        assert_int_equal(max_half, vocab / 2 - 1);
        assert_int_equal(max_three_q, vocab * 3 / 4 - 1);

        /* Find steps whose uniform is exactly a multiple of 1/4. */
        rp_sampling_params plain = params(1.0f, 0, 1.0f, 0.0f, 6);
        int found = 0;
        for (uint64_t step = 0; found < 3 && step < (1ull << 28); step++) {
            float u = rp_rand_uniform(plain.seed, 0, step);
            if (u * 4.0f != floorf(u * 4.0f)) continue;
            int want = (int)(u * vocab); /* cum(i) = (i + 1) / vocab > u */
            assert_int_equal(sample_copy(s, &plain, logits, vocab, scratch, step, NULL), want);
            found++;
        }
        assert_int_equal(found, 3);
        free(logits);
        free(scratch);
        rp_sampler_free(s);
    }
}

/* ---- truncations that must reduce to greedy ---- */

static void test_top_k_1_and_tiny_top_p_are_greedy(void **state) {
    (void)state;
    int vocab = 777;
    rp_sampler *s = rp_sampler_new(vocab);
    float *logits = malloc(vocab * sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
    rp_sampling_params greedy = params(0.0f, 0, 1.0f, 0.0f, 0);
    rp_sampling_params k1 = params(1.5f, 1, 1.0f, 0.0f, 0);
    rp_sampling_params tiny_p = params(1.5f, 0, 1e-6f, 0.0f, 0);
    rp_sampling_params min_p1 = params(1.5f, 0, 1.0f, 1.0f, 0);
    for (uint64_t trial = 0; trial < 200; trial++) {
        fill_logits(logits, vocab, 1000 + trial, 1.0f);
        if (trial % 2) /* ties at the top: lowest id must win everywhere */
            for (int i = 0; i < vocab; i++) logits[i] = fminf(roundf(logits[i]), 2.0f);
        k1.seed = tiny_p.seed = min_p1.seed = trial;
        int want = sample_copy(s, &greedy, logits, vocab, scratch, trial, NULL);
        float lp;
        assert_int_equal(sample_copy(s, &k1, logits, vocab, scratch, trial, &lp), want);
        assert_float_equal(lp, 0.0f, 1e-6);
        assert_int_equal(sample_copy(s, &tiny_p, logits, vocab, scratch, trial, &lp), want);
        assert_float_equal(lp, 0.0f, 1e-6);
        /* min_p = 1 keeps exactly the tokens tied with the max. */
        int t = sample_copy(s, &min_p1, logits, vocab, scratch, trial, NULL);
        assert_true(logits[t] == logits[want]);
    }
    free(logits);
    free(scratch);
    rp_sampler_free(s);
}

/* ---- penalties ---- */

static void test_repetition_penalty(void **state) {
    (void)state;
    int vocab = 8;
    rp_sampler *s = rp_sampler_new(vocab);
    rp_sampling_params p = params(0.0f, 0, 1.0f, 0.0f, 0);
    p.repetition_penalty = 2.0f;
    float logits[8] = {3.0f, -3.0f, 0.0f, 5.0f, -1.5f, 4.0f, 2.0f, -0.5f};
    /* 0 (positive) in prompt twice, 1 (negative) in output, 2 (zero) in both,
     * 3 not seen, 4 (negative) in prompt, 5 (positive) in prompt and output. */
    int32_t prompt[] = {0, 4, 2, 0, 5};
    int32_t output[] = {1, 2, 5, 5, 1};
    float want[8] = {1.5f, -6.0f, 0.0f, 5.0f, -3.0f, 2.0f, 2.0f, -0.5f};
    float lp;
    int tok = rp_sampler_sample(s, &p, logits, prompt, 5, output, 5, 0, &lp);
    for (int i = 0; i < vocab; i++) assert_float_equal(logits[i], want[i], 1e-6);
    assert_int_equal(tok, 3);
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp(want[i] - 5.0);
    assert_float_equal(lp, -log(sum), 1e-5);

    /* Penalty < 1 encourages repeats: 5 / 0.5 = 10 now beats 3. */
    float logits2[8] = {3.0f, -3.0f, 0.0f, 5.0f, -1.5f, 4.0f, 2.0f, -0.5f};
    p.repetition_penalty = 0.5f;
    assert_int_equal(rp_sampler_sample(s, &p, logits2, prompt, 5, output, 5, 0, NULL), 5);
    assert_float_equal(logits2[5], 8.0f, 1e-6);
    assert_float_equal(logits2[1], -1.5f, 1e-6);

    /* The scratch is clean afterwards: no penalty without history. */
    float logits3[8] = {3.0f, -3.0f, 0.0f, 5.0f, -1.5f, 4.0f, 2.0f, -0.5f};
    p.repetition_penalty = 2.0f;
    rp_sampler_sample(s, &p, logits3, NULL, 0, NULL, 0, 0, NULL);
    assert_float_equal(logits3[0], 3.0f, 0);
    assert_float_equal(logits3[5], 4.0f, 0);
    rp_sampler_free(s);
}

static void test_frequency_presence_penalty(void **state) {
    (void)state;
    int vocab = 6;
    rp_sampler *s = rp_sampler_new(vocab);
    rp_sampling_params p = params(0.0f, 0, 1.0f, 0.0f, 0);
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    /* Prompt tokens are not penalised by frequency / presence. */
    int32_t prompt[] = {0, 0, 0, 4};
    int32_t output[] = {1, 1, 1, 2, 3, 3};
    float logits[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.9f};
    float want[6] = {1.0f, 1.0f - 1.5f - 0.25f, 1.0f - 0.5f - 0.25f, 1.0f - 1.0f - 0.25f, 1.0f, 0.9f};
    int tok = rp_sampler_sample(s, &p, logits, prompt, 4, output, 6, 0, NULL);
    for (int i = 0; i < vocab; i++) assert_float_equal(logits[i], want[i], 1e-6);
    assert_int_equal(tok, 0);

    /* Negative penalties reward repeats. */
    float logits2[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.9f};
    p.frequency_penalty = -2.0f;
    p.presence_penalty = -2.0f;
    assert_int_equal(rp_sampler_sample(s, &p, logits2, prompt, 4, output, 6, 0, NULL), 1);
    assert_float_equal(logits2[1], 1.0f + 6.0f + 2.0f, 1e-6);

    /* All three together, in vLLM's order: repetition, frequency, presence. */
    float logits3[6] = {2.0f, 2.0f, -2.0f, 1.0f, 1.0f, 0.0f};
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 1.0f;
    float want3[6] = {1.0f, 1.0f - 1.5f - 1.0f, -4.0f - 0.5f - 1.0f, 0.5f - 1.0f - 1.0f, 0.5f, 0.0f};
    rp_sampler_sample(s, &p, logits3, prompt, 4, output, 6, 0, NULL);
    for (int i = 0; i < vocab; i++) assert_float_equal(logits3[i], want3[i], 1e-6);

    /* Scratch counts were reset: a second identical call gives the same. */
    float logits4[6] = {2.0f, 2.0f, -2.0f, 1.0f, 1.0f, 0.0f};
    rp_sampler_sample(s, &p, logits4, prompt, 4, output, 6, 0, NULL);
    for (int i = 0; i < vocab; i++) assert_float_equal(logits4[i], want3[i], 1e-6);
    rp_sampler_free(s);
}

/* Penalties feed the sampled distribution: draws follow the reference built
 * on the hand-penalised logits. */
static void test_penalised_distribution(void **state) {
    (void)state;
    int vocab = 30;
    float logits[30], penalised[30], scratch[30];
    fill_logits(logits, vocab, 21, 1.0f);
    int32_t prompt[] = {3, 4, 5};
    int32_t output[] = {4, 7, 7, 7, 9};
    rp_sampling_params p = params(1.0f, 0, 0.95f, 0.0f, 8);
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.1f;
    memcpy(penalised, logits, sizeof logits);
    for (int t = 0; t < vocab; t++) {
        int in_prompt = t == 3 || t == 4 || t == 5, count = 0;
        for (int i = 0; i < 5; i++) count += output[i] == t;
        if (in_prompt || count) penalised[t] = penalised[t] > 0 ? penalised[t] / 1.3f : penalised[t] * 1.3f;
        penalised[t] -= 0.2f * (float)count;
        if (count) penalised[t] -= 0.1f;
    }
    ref_dist r;
    ref_build(&r, penalised, vocab, &p);
    rp_sampler *s = rp_sampler_new(vocab);
    for (int step = 0; step < 3000; step++) {
        memcpy(scratch, logits, sizeof logits);
        int tok = rp_sampler_sample(s, &p, scratch, prompt, 3, output, 5, (uint64_t)step, NULL);
        assert_int_equal(tok, ref_pick(&r, rp_rand_uniform(p.seed, 0, (uint64_t)step)));
    }
    ref_free(&r);
    rp_sampler_free(s);
}

/* ---- NaN / inf ---- */

static void test_nan_and_inf(void **state) {
    (void)state;
    int vocab = 50;
    rp_sampler *s = rp_sampler_new(vocab);
    float logits[50], scratch[50], lp;
    rp_sampling_params greedy = params(0.0f, 0, 1.0f, 0.0f, 0);
    rp_sampling_params rnd = params(1.0f, 0, 1.0f, 0.0f, 4);
    rp_sampling_params rnd_trunc = params(1.0f, 10, 0.5f, 0.1f, 4);

    /* NaN is never chosen. */
    for (int i = 0; i < vocab; i++) logits[i] = i % 2 ? NAN : 0.0f;
    for (int step = 0; step < 500; step++) {
        assert_int_equal(sample_copy(s, &rnd, logits, vocab, scratch, (uint64_t)step, &lp) % 2, 0);
        assert_float_equal(lp, -log(25.0), 1e-5);
    }
    logits[0] = NAN;
    assert_int_equal(sample_copy(s, &greedy, logits, vocab, scratch, 0, NULL), 2);

    /* All NaN or -inf: token 0, logprob -inf, in every mode. */
    for (int i = 0; i < vocab; i++) logits[i] = i % 3 ? NAN : -INFINITY;
    assert_int_equal(sample_copy(s, &greedy, logits, vocab, scratch, 0, &lp), 0);
    assert_true(isinf(lp) && lp < 0);
    assert_int_equal(sample_copy(s, &rnd, logits, vocab, scratch, 0, &lp), 0);
    assert_true(isinf(lp) && lp < 0);
    assert_int_equal(sample_copy(s, &rnd_trunc, logits, vocab, scratch, 0, &lp), 0);

    /* -inf tokens are never chosen, even with everything else tiny. */
    for (int i = 0; i < vocab; i++) logits[i] = i == 13 ? -1e30f : -INFINITY;
    for (int step = 0; step < 50; step++)
        assert_int_equal(sample_copy(s, &rnd, logits, vocab, scratch, (uint64_t)step, NULL), 13);

    /* +inf takes all the mass; two +inf tokens share it. */
    fill_logits(logits, vocab, 2, 10.0f);
    logits[31] = INFINITY;
    for (int step = 0; step < 100; step++) {
        assert_int_equal(sample_copy(s, &rnd, logits, vocab, scratch, (uint64_t)step, &lp), 31);
        assert_float_equal(lp, 0.0f, 1e-6);
        assert_int_equal(sample_copy(s, &rnd_trunc, logits, vocab, scratch, (uint64_t)step, NULL), 31);
    }
    assert_int_equal(sample_copy(s, &greedy, logits, vocab, scratch, 0, &lp), 31);
    assert_false(isnan(lp));
    logits[7] = INFINITY;
    int hits7 = 0;
    for (int step = 0; step < 2000; step++) {
        int t = sample_copy(s, &rnd, logits, vocab, scratch, (uint64_t)step, NULL);
        assert_true(t == 7 || t == 31);
        hits7 += t == 7;
    }
    assert_in_range(hits7, 850, 1150);
    assert_int_equal(sample_copy(s, &greedy, logits, vocab, scratch, 0, NULL), 7);

    /* Huge finite logits and a repetition penalty < 1 (overflow to +inf). */
    for (int i = 0; i < vocab; i++) logits[i] = i == 20 ? 3e38f : -3e38f;
    int32_t out[] = {20, 21};
    rp_sampling_params pen = rnd;
    pen.repetition_penalty = 0.1f;
    for (int step = 0; step < 20; step++) {
        memcpy(scratch, logits, sizeof logits);
        assert_int_equal(rp_sampler_sample(s, &pen, scratch, NULL, 0, out, 2, (uint64_t)step, &lp), 20);
        assert_false(isnan(lp));
    }
    rp_sampler_free(s);
}

/* ---- top logprobs ---- */

/* rp_sampler_sample_top against the float64 reference: the ids are the
 * first n of the reference order (ties: lower id first), the logprobs
 * log(reference prob) (-inf for tokens cut by top-k/top-p/min-p), for greedy
 * the log-softmax at temperature 1; the sampled token's logprob equals its
 * entry bit for bit; and the token drawn is the one rp_sampler_sample draws. */
static void check_top(rp_sampler *s, const float *logits, int vocab, const rp_sampling_params *p, uint64_t step,
                      float *scratch) {
    rp_top_logprobs top;
    float lp, lp_plain;
    memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
    int tok = rp_sampler_sample_top(s, p, scratch, NULL, 0, NULL, 0, step, &lp, &top);
    assert_int_equal(tok, sample_copy(s, p, logits, vocab, scratch, step, &lp_plain));
    assert_true(lp == lp_plain);
    int n = p->top_logprobs < vocab ? p->top_logprobs : vocab;
    assert_int_equal(top.n, n);
    rp_sampling_params rp = *p;
    if (rp_sampling_is_greedy(p)) rp = params(1.0f, 0, 1.0f, 0.0f, 0); /* greedy: softmax at T = 1 */
    ref_dist ref;
    ref_build(&ref, logits, vocab, &rp);
    for (int j = 0; j < n; j++) {
        assert_int_equal(top.ids[j], ref.order[j]);
        double want = ref.prob[ref.order[j]] > 0 ? log(ref.prob[ref.order[j]]) : -INFINITY;
        if (isinf(want)) assert_true(isinf(top.logprobs[j]) && top.logprobs[j] < 0);
        else assert_true(fabs(top.logprobs[j] - want) <= 1e-5 * (1 + fabs(want)));
        if (j > 0) assert_true(top.logprobs[j] <= top.logprobs[j - 1]);
        if (top.ids[j] == tok) assert_true(top.logprobs[j] == lp); /* bit for bit */
    }
    ref_free(&ref);
}

static void test_top_logprobs(void **state) {
    (void)state;
    const int vocab = 3000;
    rp_sampler *s = rp_sampler_new(vocab);
    float *logits = malloc(vocab * sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
    struct {
        float t, top_p, min_p;
        int top_k, n;
    } cfg[] = {{0.0f, 1.0f, 0.0f, 0, 20}, {0.0f, 1.0f, 0.0f, 0, 1},   {1.0f, 1.0f, 0.0f, 0, 20},
               {0.7f, 0.9f, 0.0f, 0, 20}, {1.0f, 1.0f, 0.0f, 5, 20},  {0.8f, 0.95f, 0.05f, 40, 7},
               {1.3f, 1.0f, 0.1f, 0, 20}, {0.005f, 1.0f, 0.0f, 0, 3}, {1.0f, 0.3f, 0.0f, 0, 20},
               {2.0f, 1.0f, 0.0f, 1, 4}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (uint64_t seed = 1; seed <= 3; seed++) {
            fill_logits(logits, vocab, seed, seed == 3 ? 0.5f : 3.0f);
            /* planted ties at the top: lower id first */
            logits[2000] = logits[17] = logits[999] = 12.0f;
            rp_sampling_params p = params(cfg[c].t, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, seed);
            p.top_logprobs = cfg[c].n;
            for (uint64_t step = 0; step < 5; step++) check_top(s, logits, vocab, &p, step, scratch);
        }
    }

    /* not asked: n = 0; asked on a vocabulary smaller than n: the vocabulary */
    rp_top_logprobs top;
    rp_sampling_params p = params(1.0f, 0, 1.0f, 0.0f, 1);
    fill_logits(logits, vocab, 9, 2.0f);
    memcpy(scratch, logits, vocab * sizeof *scratch);
    top.n = 99;
    rp_sampler_sample_top(s, &p, scratch, NULL, 0, NULL, 0, 0, NULL, &top);
    assert_int_equal(top.n, 0);
    rp_sampler *small = rp_sampler_new(3);
    float three[3] = {0.5f, 2.0f, 0.5f}, three_scratch[3];
    p.top_logprobs = 20;
    check_top(small, three, 3, &p, 0, three_scratch);
    p.temperature = 0.0f;
    check_top(small, three, 3, &p, 0, three_scratch);

    /* NaN and -inf rank last (-inf logprob); an all -inf row is -inf throughout */
    for (int i = 0; i < 3; i++) three[i] = -INFINITY;
    three[2] = 1.0f;
    three[0] = NAN;
    memcpy(three_scratch, three, sizeof three);
    assert_int_equal(rp_sampler_sample_top(small, &p, three_scratch, NULL, 0, NULL, 0, 0, NULL, &top), 2);
    assert_int_equal(top.n, 3);
    assert_int_equal(top.ids[0], 2);
    assert_float_equal(top.logprobs[0], 0.0f, 1e-7);
    assert_int_equal(top.ids[1], 0);
    assert_int_equal(top.ids[2], 1);
    assert_true(isinf(top.logprobs[1]) && isinf(top.logprobs[2]));
    for (int i = 0; i < 3; i++) three[i] = -INFINITY;
    p.temperature = 1.0f;
    memcpy(three_scratch, three, sizeof three);
    assert_int_equal(rp_sampler_sample_top(small, &p, three_scratch, NULL, 0, NULL, 0, 0, NULL, &top), 0);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(top.ids[j], j);
        assert_true(isinf(top.logprobs[j]) && top.logprobs[j] < 0);
    }

    /* penalties apply first: the list ranks the penalised logits */
    float pen_logits[4] = {3.0f, 2.0f, 1.0f, 0.0f}, pen_scratch[4];
    rp_sampler *s4 = rp_sampler_new(4);
    rp_sampling_params pen = params(0.0f, 0, 1.0f, 0.0f, 0);
    pen.frequency_penalty = 2.0f;
    pen.top_logprobs = 2;
    int32_t out[] = {0};
    memcpy(pen_scratch, pen_logits, sizeof pen_logits);
    assert_int_equal(rp_sampler_sample_top(s4, &pen, pen_scratch, NULL, 0, out, 1, 0, NULL, &top), 1);
    assert_int_equal(top.ids[0], 1); /* token 0: 3 - 2 = 1, tied with token 2, which has the higher id */
    assert_int_equal(top.ids[1], 0);

    /* validation */
    rp_err err;
    p = params(1.0f, 0, 1.0f, 0.0f, 1);
    p.top_logprobs = RP_MAX_TOP_LOGPROBS;
    assert_int_equal(rp_sampling_params_validate(&p, 10, &err), RP_OK);
    p.top_logprobs = RP_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(rp_sampling_params_validate(&p, 10, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "top_logprobs must be in [0, 20], got 21"));
    p.top_logprobs = -1;
    assert_int_equal(rp_sampling_params_validate(&p, 10, &err), RP_ERR);
    rp_sampler_free(s4);
    rp_sampler_free(small);
    rp_sampler_free(s);
    free(logits);
    free(scratch);
}

/* ---- the distribution as a vector (rp_sampler_probs and its draws) ---- */

/* A random row and parameter set: logits with planted ties, -inf, NaN, +inf
 * or an all -inf row by case; every truncation, penalties over a random
 * history, greedy and tiny temperatures. */
static void random_case(uint64_t seed, float *logits, int vocab, int32_t *hist, int n_hist, rp_sampling_params *p) {
    int mode = (int)(seed % 7);
    for (int i = 0; i < vocab; i++) {
        double u = rp_rand_uniform(seed, 11, (uint64_t)i), z = rp_rand_normal(seed, 12, (uint64_t)i);
        float x = (float)(z * (1 + (int)(seed % 5)));
        if (mode == 1) x = (float)floor(z * 2); /* many ties */
        if (mode == 2 && u < 0.1) x = -INFINITY;
        if (mode == 3 && u < 0.05) x = NAN;
        if (mode == 4 && u < 0.02) x = INFINITY;
        if (mode == 5) x = (float)(z * 40); /* masses that underflow */
        logits[i] = x;
    }
    if (seed % 53 == 7)
        for (int i = 0; i < vocab; i++) logits[i] = -INFINITY;
    for (int i = 0; i < n_hist; i++) hist[i] = (int32_t)(rp_rand_u64(seed, 13, (uint64_t)i) % (uint64_t)vocab);
    static const float temps[] = {0.0f, 1.0f, 0.7f, 0.005f, 2.5f, 0.3f, 100.0f};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.99f, 0.1f};
    static const int top_ks[] = {0, 1, 5, 50, 300, -1};
    static const float min_ps[] = {0.0f, 0.05f, 0.2f, 1.0f};
    uint64_t r = rp_rand_u64(seed, 14, 0);
    *p = params(temps[r % 7], top_ks[(r / 7) % 6], top_ps[(r / 42) % 5], min_ps[(r / 210) % 4], seed * 3 + 1);
    r /= 840;
    p->repetition_penalty = r % 3 == 0 ? 1.0f : r % 3 == 1 ? 1.3f : 0.8f;
    p->frequency_penalty = (r / 3) % 2 ? 0.5f : 0.0f;
    p->presence_penalty = (r / 6) % 2 ? -0.7f : 0.0f;
    p->top_logprobs = (int)((r / 12) % 21);
}

/* rp_sampler_probs + rp_sampler_draw is rp_sampler_sample, bit for bit (token,
 * logprob, penalised row), for every kind of row and parameter set, through
 * the small-list sort (< 256 candidates) and the bucket select alike; the
 * vector is a distribution whose support holds the token; rp_sampler_logprob
 * gives the sampled token's logprob and the top list's, bit for bit; and a
 * draw from the vector as plain weights picks the same token. */
static void test_probs_draw_is_sample(void **state) {
    (void)state;
    static const int vocabs[] = {1, 3, 40, 300, 3000};
    int32_t hist[60];
    int weights_differ = 0, cases = 0;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        int vocab = vocabs[vi];
        rp_sampler *s = rp_sampler_new(vocab);
        float *logits = malloc(vocab * sizeof *logits), *a = malloc(vocab * sizeof *a), *b = malloc(vocab * sizeof *b);
        double *probs = malloc(vocab * sizeof *probs);
        int trials = vocab >= 3000 ? 25 : 150;
        for (int t = 0; t < trials; t++) {
            uint64_t seed = (uint64_t)vi * 1000 + (uint64_t)t;
            rp_sampling_params p;
            random_case(seed, logits, vocab, hist, 60, &p);
            int n_prompt = (int)(seed % 20), n_output = (int)(seed % 40);
            for (uint64_t step = 0; step < 4; step++) {
                rp_top_logprobs top;
                float lp, lp_draw;
                memcpy(a, logits, vocab * sizeof *a);
                int tok = rp_sampler_sample_top(s, &p, a, hist, n_prompt, hist + 20, n_output, step, &lp, &top);

                memcpy(b, logits, vocab * sizeof *b);
                int support = rp_sampler_probs(s, &p, b, hist, n_prompt, hist + 20, n_output, probs);
                assert_memory_equal(a, b, vocab * sizeof *a);
                double sum = 0;
                int positive = 0;
                for (int i = 0; i < vocab; i++) {
                    assert_true(probs[i] >= 0.0 && probs[i] <= 1.0);
                    sum += probs[i];
                    positive += probs[i] > 0;
                }
                assert_int_equal(support, positive);
                assert_true(fabs(sum - 1.0) < 1e-12);
                assert_true(probs[tok] > 0.0);
                double u = (double)rp_rand_uniform(p.seed, 0, step);
                assert_int_equal(rp_sampler_draw(s, u, &lp_draw), tok);
                assert_memory_equal(&lp_draw, &lp, sizeof lp);
                float lp_tok = rp_sampler_logprob(s, b, tok);
                assert_memory_equal(&lp_tok, &lp, sizeof lp);
                for (int j = 0; j < top.n; j++) {
                    float lp_j = rp_sampler_logprob(s, b, top.ids[j]);
                    assert_memory_equal(&lp_j, &top.logprobs[j], sizeof lp_j);
                    /* cut tokens: -inf logprob and probability 0 (an
                     * underflowing kept token may have a finite logprob
                     * and a probability that rounds to 0) */
                    if (isinf(lp_j) && !isinf(lp)) assert_true(probs[top.ids[j]] == 0.0);
                }

                /* Walking the rounded probabilities instead of the masses can
                 * only differ when u lands within rounding (1e-16) of a CDF
                 * boundary: u has 24 bits, so never here. */
                memcpy(b, logits, vocab * sizeof *b);
                rp_sampler_probs(s, &p, b, hist, n_prompt, hist + 20, n_output, probs);
                weights_differ += rp_sampler_draw_weights(s, probs, u) != tok;
                cases++;
            }
        }
        free(logits);
        free(a);
        free(b);
        free(probs);
        rp_sampler_free(s);
    }
    if (weights_differ)
        fail_msg("the draw from the probability vector differs in %d of %d cases", weights_differ, cases);
}

/* The vector against the float64 reference (full sort, then each truncation
 * as docs/sampling.md states it); greedy is one-hot on the argmax. */
static void test_probs_match_reference(void **state) {
    (void)state;
    const int vocab = 500;
    rp_sampler *s = rp_sampler_new(vocab);
    float *logits = malloc(vocab * sizeof *logits), *row = malloc(vocab * sizeof *row);
    double *probs = malloc(vocab * sizeof *probs);
    struct {
        float t, top_p, min_p;
        int top_k;
    } cfg[] = {{1.0f, 1.0f, 0.0f, 0}, {0.6f, 0.9f, 0.0f, 0}, {1.2f, 1.0f, 0.0f, 17}, {1.0f, 1.0f, 0.1f, 0},
               {0.8f, 0.95f, 0.05f, 40}, {0.005f, 1.0f, 0.0f, 0}, {1.0f, 0.3f, 0.0f, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (uint64_t seed = 1; seed <= 4; seed++) {
            fill_logits(logits, vocab, seed, seed == 4 ? 0.5f : 2.5f);
            logits[3] = logits[100] = logits[400] = 9.0f; /* ties at the top */
            rp_sampling_params p = params(cfg[c].t, cfg[c].top_k, cfg[c].top_p, cfg[c].min_p, seed);
            ref_dist ref;
            ref_build(&ref, logits, vocab, &p);
            memcpy(row, logits, vocab * sizeof *row);
            rp_sampler_probs(s, &p, row, NULL, 0, NULL, 0, probs);
            for (int i = 0; i < vocab; i++) {
                if ((probs[i] > 0) != (ref.prob[i] > 0))
                    fail_msg("config %zu seed %d token %d: probability %g, reference %g", c, (int)seed, i, probs[i],
                             ref.prob[i]);
                assert_true(fabs(probs[i] - ref.prob[i]) <= 1e-12 + 1e-9 * ref.prob[i]);
                float lp = rp_sampler_logprob(s, row, i);
                if (ref.prob[i] > 1e-300) { /* subnormal references have few digits */
                    double want = log(ref.prob[i]);
                    if (!(fabs(lp - want) <= 1e-5 * (1 + fabs(want))))
                        fail_msg("config %zu seed %d token %d: logprob %.9g, reference %.9g", c, (int)seed, i, lp,
                                 want);
                } else if (ref.prob[i] == 0 && !(lp < -700.0f)) {
                    /* cut: -inf; or a subnormal mass whose probability rounds
                     * to 0 (kept by the sampler, it just can never be drawn) */
                    fail_msg("config %zu seed %d token %d: cut, logprob %g (logit %g)", c, (int)seed, i, lp, row[i]);
                }
            }
            ref_free(&ref);
        }
    }
    /* greedy: all the mass on the argmax (ties to the lower id); logprobs are
     * the log-softmax at temperature 1 */
    rp_sampling_params g = params(0.0f, 0, 1.0f, 0.0f, 1);
    fill_logits(logits, vocab, 9, 2.0f);
    logits[7] = logits[8] = 20.0f;
    memcpy(row, logits, vocab * sizeof *row);
    assert_int_equal(rp_sampler_probs(s, &g, row, NULL, 0, NULL, 0, probs), 1);
    for (int i = 0; i < vocab; i++) assert_true(probs[i] == (i == 7 ? 1.0 : 0.0));
    double lse = 0;
    for (int i = 0; i < vocab; i++) lse += exp((double)logits[i] - 20.0);
    assert_float_equal(rp_sampler_logprob(s, row, 7), -log(lse), 1e-6);
    assert_float_equal(rp_sampler_logprob(s, row, 0), (double)logits[0] - 20.0 - log(lse), 1e-5);
    free(logits);
    free(row);
    free(probs);
    rp_sampler_free(s);
}

/* rp_sampler_draw_weights: inverse CDF of arbitrary weights over the
 * support, in the sampling order, checked against the reference order for
 * many uniforms (the pick's CDF interval holds u, up to rounding); weights
 * outside the support are not read; no positive weight gives -1. */
static void test_draw_weights(void **state) {
    (void)state;
    static const int vocabs[] = {30, 3000}; /* small-list sort and bucket select */
    for (size_t vi = 0; vi < 2; vi++) {
        int vocab = vocabs[vi];
        rp_sampler *s = rp_sampler_new(vocab);
        float *logits = malloc(vocab * sizeof *logits), *row = malloc(vocab * sizeof *row);
        double *probs = malloc(vocab * sizeof *probs), *w = malloc(vocab * sizeof *w);
        rp_sampling_params p = params(1.0f, 0, vi ? 0.95f : 1.0f, 0.0f, 5);
        fill_logits(logits, vocab, 21 + vi, 1.5f);
        logits[2] = logits[5] = logits[9] = 10.0f;
        ref_dist ref;
        ref_build(&ref, logits, vocab, &p);
        double sum = 0;
        for (int i = 0; i < vocab; i++) {
            uint64_t r = rp_rand_u64(77, 1, (uint64_t)i);
            w[i] = ref.prob[i] > 0 ? (r % 4 == 0 ? 0.0 : (double)(r % 1000) * 1e-3 + 1e-6) : 1e300;
            if (ref.prob[i] > 0) sum += w[i];
        }
        for (int draw = 0; draw < 2000; draw++) {
            double u = (double)rp_rand_uniform(3, 9, (uint64_t)draw);
            memcpy(row, logits, vocab * sizeof *row);
            rp_sampler_probs(s, &p, row, NULL, 0, NULL, 0, probs);
            int tok = rp_sampler_draw_weights(s, w, u);
            assert_true(tok >= 0 && tok < vocab && ref.prob[tok] > 0 && w[tok] > 0);
            double before = 0;
            for (int k = 0; ref.order[k] != tok; k++)
                if (ref.prob[ref.order[k]] > 0) before += w[ref.order[k]];
            if (!(before / sum <= u + 1e-12 && u < (before + w[tok]) / sum + 1e-12))
                fail_msg("u %.9f picked %d with CDF [%.9f, %.9f)", u, tok, before / sum, (before + w[tok]) / sum);
        }
        for (int i = 0; i < vocab; i++) w[i] = ref.prob[i] > 0 ? 0.0 : 1.0;
        memcpy(row, logits, vocab * sizeof *row);
        rp_sampler_probs(s, &p, row, NULL, 0, NULL, 0, probs);
        assert_int_equal(rp_sampler_draw_weights(s, w, 0.5), -1);
        /* greedy: the support is the argmax alone */
        rp_sampling_params g = params(0.0f, 0, 1.0f, 0.0f, 5);
        memcpy(row, logits, vocab * sizeof *row);
        rp_sampler_probs(s, &g, row, NULL, 0, NULL, 0, probs);
        w[2] = 0.5;
        assert_int_equal(rp_sampler_draw_weights(s, w, 0.9), 2);
        w[2] = 0.0;
        assert_int_equal(rp_sampler_draw_weights(s, w, 0.9), -1);
        ref_free(&ref);
        free(logits);
        free(row);
        free(probs);
        free(w);
        rp_sampler_free(s);
    }
}

/* ---- a real vocabulary size ---- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void test_huge_vocab(void **state) {
    (void)state;
    int vocab = 151936;
    float *logits = malloc(vocab * sizeof *logits), *scratch = malloc(vocab * sizeof *scratch);
    fill_logits(logits, vocab, 77, 3.0f);
    rp_sampler *s = rp_sampler_new(vocab);
    int32_t history[512];
    for (int i = 0; i < 512; i++) history[i] = (int32_t)((i * 7919) % vocab);
    struct {
        const char *name;
        rp_sampling_params p;
    } cfgs[] = {
        {"greedy", params(0.0f, 0, 1.0f, 0.0f, 1)},
        {"temperature", params(1.0f, 0, 1.0f, 0.0f, 1)},
        {"top_k=50", params(0.7f, 50, 1.0f, 0.0f, 1)},
        {"top_p=0.9", params(1.0f, 0, 0.9f, 0.0f, 1)},
        {"min_p=0.05", params(1.0f, 0, 1.0f, 0.05f, 1)},
        {"all+penalties", params(0.7f, 20, 0.8f, 0.05f, 1)},
    };
    cfgs[5].p.repetition_penalty = 1.1f;
    cfgs[5].p.frequency_penalty = 0.3f;
    cfgs[5].p.presence_penalty = 0.3f;
    int reps = 50;
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        double t0 = now_ms();
        for (int r = 0; r < reps; r++) {
            memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
            int tok = rp_sampler_sample(s, &cfgs[c].p, scratch, history, 256, history + 256, 256, (uint64_t)r, NULL);
            assert_true(tok >= 0 && tok < vocab);
        }
        double ms = (now_ms() - t0) / reps;
        printf("  vocab %d, %-14s %.3f ms/token (incl. 0.6 MB logits copy)\n", vocab, cfgs[c].name, ms);
        /* Informational: speed is measured here, not asserted (bench/RESULTS.md). */
    }
    /* Correctness at this size too, with a few draws. */
    check_draws_match_reference(logits, vocab, &cfgs[1].p, 30);
    check_draws_match_reference(logits, vocab, &cfgs[3].p, 30);
    check_draws_match_reference(logits, vocab, &cfgs[4].p, 30);
    free(logits);
    free(scratch);
    rp_sampler_free(s);
}


/* The logit processors before the sampler (engine/logit_proc.c): the bias
 * adds (a repeated id adds twice), min_tokens sets EOS (unless ignore_eos)
 * and the stop ids to -inf while the output is short, and only then; +100
 * makes greedy pick a token with logprob ~0, -100 bans the argmax. */
static void test_logit_proc(void **state) {
    (void)state;
    enum { V = 16 };
    rp_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = V;
    cfg.num_eos_token_ids = 2;
    cfg.eos_token_ids[0] = 3;
    cfg.eos_token_ids[1] = 9;
    int32_t stop[1] = {5}, ids[2] = {7, 7};
    float bias[2] = {1.5f, 2.0f};
    rp_request r;
    memset(&r, 0, sizeof r);
    r.min_tokens = 2;
    r.stop_ids = stop;
    r.num_stop_ids = 1;
    r.bias_ids = ids;
    r.bias = bias;
    r.num_bias = 2;
    float l[V];
    for (int k = 0; k < 3; k++)
        for (int ignore = 0; ignore < 2; ignore++) {
            r.ignore_eos = ignore;
            for (int i = 0; i < V; i++) l[i] = 0.25f * (float)i;
            rp_logit_proc_apply(&r, &cfg, k, l);
            for (int i = 0; i < V; i++) {
                float want = 0.25f * (float)i + (i == 7 ? 3.5f : 0.0f);
                if (k < 2 && (i == 5 || (!ignore && (i == 3 || i == 9)))) want = -INFINITY;
                if (l[i] != want) fail_msg("k %d ignore_eos %d: token %d is %g, expected %g", k, ignore, i, l[i], want);
            }
        }
    assert_true(rp_logit_proc_active(&r, 5)); /* a bias: always */
    r.num_bias = 0;
    assert_true(rp_logit_proc_active(&r, 1) && !rp_logit_proc_active(&r, 2)); /* min_tokens: while short */
    /* through the greedy sampler */
    rp_sampler *s = rp_sampler_new(V);
    rp_sampling_params p;
    rp_sampling_params_default(&p);
    p.temperature = 0;
    r.min_tokens = 0;
    r.num_bias = 1;
    bias[0] = 100.0f;
    ids[0] = 2;
    for (int i = 0; i < V; i++) l[i] = 0.25f * (float)i;
    rp_logit_proc_apply(&r, &cfg, 0, l);
    float lp;
    assert_int_equal(rp_sampler_sample(s, &p, l, NULL, 0, NULL, 0, 0, &lp), 2);
    assert_true(lp <= 0 && lp > -1e-6f);
    bias[0] = -100.0f;
    ids[0] = V - 1; /* the argmax, banned */
    for (int i = 0; i < V; i++) l[i] = 0.25f * (float)i;
    rp_logit_proc_apply(&r, &cfg, 0, l);
    assert_int_equal(rp_sampler_sample(s, &p, l, NULL, 0, NULL, 0, 0, &lp), V - 2);
    rp_sampler_free(s);
    /* validation names the field */
    rp_request_params rp;
    memset(&rp, 0, sizeof rp);
    rp.max_tokens = 4;
    rp.min_tokens = 5;
    rp_err err;
    assert_int_equal(rp_logit_proc_validate(&rp, V, &err), RP_ERR);
    assert_string_equal(err.param, "min_tokens");
    rp.min_tokens = 4;
    rp.logit_bias_ids = ids;
    rp.logit_bias = bias;
    rp.num_logit_bias = 1;
    ids[0] = V;
    assert_int_equal(rp_logit_proc_validate(&rp, V, &err), RP_ERR);
    assert_string_equal(err.param, "logit_bias");
    ids[0] = 0;
    bias[0] = -100.01f;
    assert_int_equal(rp_logit_proc_validate(&rp, V, &err), RP_ERR);
    bias[0] = -100.0f;
    assert_int_equal(rp_logit_proc_validate(&rp, V, &err), RP_OK);
}

/* A prompt token's entry (engine/prompt_logprobs.c) against float64 on a
 * row with ties, -inf and NaN: log-softmax, vLLM's rank (ties count), the
 * top list in (logit desc, id asc) order, capped by the vocabulary. */
static void test_prompt_logprob_entry(void **state) {
    (void)state;
    enum { V = 10 };
    float l[V] = {1.0f, 3.0f, 3.0f, -INFINITY, 0.5f, NAN, 2.0f, 3.0f, -1.0f, 0.0f};
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (isfinite(l[i])) sum += exp((double)l[i] - 3.0);
    const double lse = 3.0 + log(sum);
    rp_prompt_logprob e;
    rp_prompt_logprob_compute(l, V, 6, 4, &e);
    assert_int_equal(e.token, 6);
    assert_true(fabs(e.logprob - (2.0 - lse)) < 1e-6);
    assert_int_equal(e.rank, 4); /* three at 3.0, and itself */
    assert_int_equal(e.num_top, 4);
    const int32_t order[4] = {1, 2, 7, 6};
    for (int j = 0; j < 4; j++) {
        assert_int_equal(e.top_ids[j], order[j]);
        assert_true(fabs(e.top_logprobs[j] - ((double)l[order[j]] - lse)) < 1e-6);
    }
    rp_prompt_logprob_compute(l, V, 5, 0, &e); /* NaN: -inf, last in rank */
    assert_true(e.logprob == -INFINITY && e.rank == V && e.num_top == 0);
    rp_prompt_logprob_compute(l, V, 1, 30, &e); /* more alternatives than the vocabulary */
    assert_int_equal(e.num_top, V);
    assert_int_equal(e.rank, 3);
    assert_true(e.top_logprobs[V - 1] == -INFINITY);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_validate_boundaries),
        cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_distribution_temperature),
        cmocka_unit_test(test_tiny_temperature_is_clamped),
        cmocka_unit_test(test_distribution_top_k),
        cmocka_unit_test(test_distribution_top_p),
        cmocka_unit_test(test_distribution_min_p),
        cmocka_unit_test(test_distribution_combined),
        cmocka_unit_test(test_draws_match_reference_large),
        cmocka_unit_test(test_exact_boundaries),
        cmocka_unit_test(test_top_k_1_and_tiny_top_p_are_greedy),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_frequency_presence_penalty),
        cmocka_unit_test(test_penalised_distribution),
        cmocka_unit_test(test_nan_and_inf),
        cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_probs_draw_is_sample),
        cmocka_unit_test(test_probs_match_reference),
        cmocka_unit_test(test_draw_weights),
        cmocka_unit_test(test_huge_vocab),
        cmocka_unit_test(test_logit_proc),
        cmocka_unit_test(test_prompt_logprob_entry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
