/* Tests for speculative decoding's verification (src/engine/speculative.c).
 *
 * The "model" is a fixed pseudo-random function from the context's last two
 * tokens to a row of logits, so any context can be scored at will:
 *   - greedy: decoding token by token with rp_sampler_sample and decoding in
 *     speculative rounds (drafts random, or the true continuation corrupted
 *     at a rate) give the same tokens and the same logprobs, bit for bit;
 *   - sampling: the joint distribution of the first three tokens under
 *     speculation (point-mass and random drafters) against the exact joint,
 *     enumerated from the sampler's own distributions, by chi-square; wrong
 *     acceptance rules must fail the same check (negative controls);
 *   - seeds, logprobs, edge cases and errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "util/rng.h"

enum { MAX_K = 8, MAX_VOCAB = 64, MAX_CTX = 256 };

/* ---- the toy model ---- */

typedef struct toy {
    uint64_t key; /* which random function */
    int vocab;
    float scale;  /* logit spread */
    float *table; /* [(vocab + 1)^2][vocab]: every row, computed once */
} toy;

/* Logits after ctx[0, n): normals keyed by the last two tokens (vocab
 * stands for "no token" at the start). */
static const float *toy_row(const toy *m, const int32_t *ctx, int n) {
    int a = n >= 1 ? ctx[n - 1] : m->vocab, b = n >= 2 ? ctx[n - 2] : m->vocab;
    return m->table + ((size_t)a * (size_t)(m->vocab + 1) + (size_t)b) * (size_t)m->vocab;
}

static void toy_logits(const toy *m, const int32_t *ctx, int n, float *out) {
    memcpy(out, toy_row(m, ctx, n), (size_t)m->vocab * sizeof *out);
}

static toy toy_new(uint64_t key, int vocab, float scale) {
    toy m = {.key = key, .vocab = vocab, .scale = scale};
    size_t rows = (size_t)(vocab + 1) * (size_t)(vocab + 1);
    m.table = malloc(rows * (size_t)vocab * sizeof *m.table);
    assert_non_null(m.table);
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < vocab; j++)
            m.table[r * (size_t)vocab + (size_t)j] = (float)(scale * rp_rand_normal(key, 1000 + r, (uint64_t)j));
    return m;
}

static void toy_free(toy *m) { free(m->table); }

static rp_sampling_params sp(float temperature, int top_k, float top_p, float min_p, float rep, float freq,
                             float pres) {
    rp_sampling_params p;
    rp_sampling_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = rep;
    p.frequency_penalty = freq;
    p.presence_penalty = pres;
    p.has_seed = 1;
    return p;
}

/* One round's input: the target's rows for ctx = prompt + output[0, n) +
 * draft[0, i), i = 0..k. */
typedef struct round_buf {
    float rows[MAX_K + 1][MAX_VOCAB];
    float *row_ptr[MAX_K + 1];
    double q[MAX_K][MAX_VOCAB];
    const double *q_ptr[MAX_K];
    int32_t draft[MAX_K];
    int32_t ctx[MAX_CTX];
} round_buf;

static void score_round(round_buf *r, const toy *target, const int32_t *prompt, int n_prompt, const int32_t *output,
                        int n_output, int k) {
    int n = 0;
    for (int i = 0; i < n_prompt; i++) r->ctx[n++] = prompt[i];
    for (int i = 0; i < n_output; i++) r->ctx[n++] = output[i];
    for (int i = 0; i <= k; i++) {
        toy_logits(target, r->ctx, n + i, r->rows[i]);
        r->row_ptr[i] = r->rows[i];
        if (i < k) r->ctx[n + i] = r->draft[i];
    }
}

/* ---- greedy: identical to decoding without speculation ---- */

typedef enum { DRAFT_RANDOM, DRAFT_ORACLE, DRAFT_RANDOM_Q } draft_kind;

/* Decodes n_tokens greedily in speculative rounds and checks every token and
 * logprob against ref/ref_lp (the plain decode). Returns the rounds used. */
static int greedy_spec_run(rp_spec *v, const toy *target, const rp_sampling_params *p, const int32_t *prompt,
                           int n_prompt, const int32_t *ref, const float *ref_lp, int n_tokens, int k,
                           draft_kind kind, double corrupt, uint64_t draft_seed) {
    static round_buf r;
    int32_t out[MAX_CTX];
    float lp[MAX_K + 1];
    int n = 0, rounds = 0;
    int vocab = target->vocab;
    while (n < n_tokens) {
        for (int i = 0; i < k; i++) {
            uint64_t x = rp_rand_u64(draft_seed, 20 + (uint64_t)i, (uint64_t)n);
            int32_t rnd = (int32_t)(x % (uint64_t)vocab);
            if (kind == DRAFT_ORACLE) {
                /* the true continuation, corrupted at the given rate */
                int32_t truth = ref[n + i];
                double u = (double)(x >> 11) * 0x1p-53;
                r.draft[i] = u < corrupt ? (truth + 1 + rnd % (vocab - 1)) % vocab : truth;
            } else {
                r.draft[i] = rnd;
            }
            if (kind == DRAFT_RANDOM_Q) { /* a drafter with its own q, which greedy ignores */
                for (int t = 0; t < vocab; t++) r.q[i][t] = 0.5 / (vocab - 1);
                r.q[i][r.draft[i]] = 0.5;
                r.q_ptr[i] = r.q[i];
            }
        }
        score_round(&r, target, prompt, n_prompt, out, n, k);
        rp_err err = {0};
        int m = rp_spec_verify(v, p, r.row_ptr, r.draft, kind == DRAFT_RANDOM_Q ? r.q_ptr : NULL, k, prompt, n_prompt,
                               out, n, (uint64_t)n, lp, &err);
        if (m < 1) fail_msg("rp_spec_verify failed: %s", err.msg);
        assert_true(m <= k + 1);
        for (int j = 0; j < m; j++) {
            if (out[n + j] != ref[n + j])
                fail_msg("k=%d kind=%d: token %d is %d, without speculation %d", k, (int)kind, n + j, out[n + j],
                         ref[n + j]);
            if (memcmp(&lp[j], &ref_lp[n + j], sizeof(float)) != 0)
                fail_msg("k=%d: logprob of token %d is %.9g, without speculation %.9g", k, n + j, lp[j], ref_lp[n + j]);
            /* the kept drafts are the drafts; the last token ends the run */
            if (j < m - 1) assert_int_equal(out[n + j], r.draft[j]);
        }
        if (m <= k) assert_true(out[n + m - 1] != r.draft[m - 1]);
        n += m;
        rounds++;
    }
    return rounds;
}

static void test_greedy_exact(void **state) {
    (void)state;
    const int vocab = 50, n_tokens = 80, n_prompt = 5;
    toy target = toy_new(11, vocab, 2.0f);
    int32_t prompt[] = {3, 17, 42, 8, 17};
    rp_sampling_params cases[] = {
        sp(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f), sp(0.0f, 0, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f),
        sp(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.6f, 0.4f), sp(0.0f, 0, 1.0f, 0.0f, 0.8f, 0.3f, -0.5f),
        sp(0.0f, 5, 0.5f, 0.2f, 1.2f, 1.0f, 1.0f), /* truncations do not matter to greedy */
    };
    rp_sampler *s = rp_sampler_new(vocab);
    rp_spec *v = rp_spec_new(vocab);
    assert_non_null(v);
    int32_t ref[MAX_CTX], ctx[MAX_CTX];
    float ref_lp[MAX_CTX], row[MAX_VOCAB];
    long rounds_oracle0 = 0, tokens_oracle0 = 0, rounds_random = 0, tokens_random = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rp_sampling_params p = cases[c];
        /* Plain decoding, MAX_K beyond n_tokens so the oracle can look ahead. */
        memcpy(ctx, prompt, sizeof prompt);
        for (int n = 0; n < n_tokens + MAX_K; n++) {
            toy_logits(&target, ctx, n_prompt + n, row);
            ref[n] = rp_sampler_sample(s, &p, row, prompt, n_prompt, ref, n, (uint64_t)n, &ref_lp[n]);
            ctx[n_prompt + n] = ref[n];
        }
        for (int k = 1; k <= MAX_K; k++) {
            uint64_t ds = c * 100 + (uint64_t)k;
            int rr = greedy_spec_run(v, &target, &p, prompt, n_prompt, ref, ref_lp, n_tokens, k, DRAFT_RANDOM, 0, ds);
            rounds_random += rr;
            tokens_random += n_tokens;
            greedy_spec_run(v, &target, &p, prompt, n_prompt, ref, ref_lp, n_tokens, k, DRAFT_RANDOM_Q, 0, ds);
            /* a perfect oracle: every round emits k + 1 (the last may run over) */
            int r0 = greedy_spec_run(v, &target, &p, prompt, n_prompt, ref, ref_lp, n_tokens, k, DRAFT_ORACLE, 0.0, ds);
            assert_int_equal(r0, (n_tokens + k) / (k + 1));
            rounds_oracle0 += r0;
            tokens_oracle0 += n_tokens;
            const double rates[] = {0.1, 0.3, 0.5, 0.9, 1.0};
            for (size_t ri = 0; ri < sizeof rates / sizeof rates[0]; ri++)
                greedy_spec_run(v, &target, &p, prompt, n_prompt, ref, ref_lp, n_tokens, k, DRAFT_ORACLE, rates[ri],
                                ds);
        }
    }
    printf("  greedy: oracle 0%% corrupt %.2f tokens/round, random drafts %.2f tokens/round\n",
           (double)tokens_oracle0 / rounds_oracle0, (double)tokens_random / rounds_random);
    rp_spec_free(v);
    rp_sampler_free(s);
    toy_free(&target);
}

/* ---- sampling: the exact distribution, by chi-square ---- */

enum { SV = 6, N_GEN = 3, N_OUTCOMES = SV * SV * SV };

/* The 0.999 quantile of chi-square with df degrees of freedom by the
 * Wilson-Hilferty cube-root normal approximation, df (1 - 2/(9 df) + z
 * sqrt(2/(9 df)))^3 with z = Phi^-1(0.999) = 3.0902323: within 1% of the
 * exact quantile from df = 10 (e.g. df 100: 149.3 vs 149.4), and our df is
 * in the tens to hundreds. */
static double chi2_q999(int df) {
    double a = 2.0 / (9.0 * df), z = 3.0902323061678132;
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Exact joint of the first N_GEN tokens: the product of the sampler's own
 * distributions (rp_sampler_probs, which test_sampler ties bit for bit to
 * rp_sampler_sample) along each path, penalties included. */
static void exact_joint(const toy *target, const rp_sampling_params *p, const int32_t *prompt, int n_prompt,
                        double *joint) {
    rp_sampler *s = rp_sampler_new(SV);
    int32_t ctx[16], out[N_GEN];
    float row[SV];
    double probs[N_GEN][SV];
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    for (int o = 0; o < N_OUTCOMES; o++) {
        double pr = 1.0;
        int code = o;
        for (int j = N_GEN - 1; j >= 0; j--) {
            out[j] = code % SV;
            code /= SV;
        }
        for (int j = 0; j < N_GEN; j++) {
            toy_logits(target, ctx, n_prompt + j, row);
            rp_sampler_probs(s, p, row, prompt, n_prompt, out, j, probs[j]);
            pr *= probs[j][out[j]];
            ctx[n_prompt + j] = out[j];
        }
        joint[o] = pr;
    }
    rp_sampler_free(s);
}

typedef enum {
    VERIFY_EXACT,       /* rp_spec_verify */
    VERIFY_ALWAYS,      /* negative control: keep every draft */
    VERIFY_RESAMPLE_P,  /* negative control: after a rejection, draw from p, not the residual */
} verify_rule;

typedef enum { DRAFTER_POINT, DRAFTER_Q } drafter_kind;

/* The drafter: a second toy model. Point: its argmax (q a point mass).
 * Q: its softmax at temperature 1.3 restricted to its top 4 tokens (so q
 * misses tokens p has, and has tokens p cut), sampled with the drafter's
 * own stream (10 + i; never the verifier's 0, 1, 2). */
static void draft_round(round_buf *r, const toy *drafter, drafter_kind kind, const int32_t *prompt, int n_prompt,
                        const int32_t *output, int n_output, int k, uint64_t seed) {
    int n = 0;
    float row[SV];
    for (int i = 0; i < n_prompt; i++) r->ctx[n++] = prompt[i];
    for (int i = 0; i < n_output; i++) r->ctx[n++] = output[i];
    for (int i = 0; i < k; i++) {
        toy_logits(drafter, r->ctx, n + i, row);
        int order[SV];
        for (int t = 0; t < SV; t++) order[t] = t;
        for (int a = 1; a < SV; a++) /* by logit descending */
            for (int b = a; b > 0 && row[order[b]] > row[order[b - 1]]; b--) {
                int tmp = order[b];
                order[b] = order[b - 1];
                order[b - 1] = tmp;
            }
        if (kind == DRAFTER_POINT) {
            r->draft[i] = order[0];
        } else {
            double sum = 0;
            for (int t = 0; t < SV; t++) r->q[i][t] = 0.0;
            for (int j = 0; j < 4; j++) sum += r->q[i][order[j]] = exp((row[order[j]] - row[order[0]]) / 1.3);
            for (int t = 0; t < SV; t++) r->q[i][t] /= sum;
            double u = rp_rand_uniform(seed, 10 + (uint64_t)i, (uint64_t)n_output), cum = 0;
            int pick = order[3];
            for (int j = 0; j < 4; j++) {
                cum += r->q[i][order[j]];
                if (u < cum) {
                    pick = order[j];
                    break;
                }
            }
            r->draft[i] = pick;
            r->q_ptr[i] = r->q[i];
        }
        r->ctx[n + i] = r->draft[i];
    }
}

/* The negative controls' verification, built from the same sampler calls
 * with one rule broken. */
static int verify_wrong(verify_rule rule, rp_sampler *s, const rp_sampling_params *p, round_buf *r, int k,
                        const double *const *q, const int32_t *prompt, int n_prompt, int32_t *out, int n) {
    double probs[SV];
    for (int i = 0; i < k; i++) {
        uint64_t step = (uint64_t)(n + i);
        if (rule == VERIFY_ALWAYS) {
            out[n + i] = r->draft[i];
            continue;
        }
        rp_sampler_probs(s, p, r->row_ptr[i], prompt, n_prompt, out, n + i, probs);
        double u = rp_rand_uniform(p->seed, RP_SPEC_STREAM_ACCEPT, step);
        if (u < probs[r->draft[i]] / (q ? q[i][r->draft[i]] : 1.0)) {
            out[n + i] = r->draft[i];
            continue;
        }
        out[n + i] = rp_sampler_draw(s, rp_rand_uniform(p->seed, RP_SPEC_STREAM_RESIDUAL, step), NULL);
        return i + 1;
    }
    out[n + k] = rp_sampler_sample(s, p, r->row_ptr[k], prompt, n_prompt, out, n + k, (uint64_t)(n + k), NULL);
    return k + 1;
}

typedef struct chi2_result {
    double stat, limit;
    int df;
    long impossible; /* draws of outcomes the exact joint gives probability 0 */
    double tokens_per_round;
} chi2_result;

/* n_trials generations of N_GEN tokens, one seed each, in rounds of k
 * drafts; the joint outcome's histogram against the exact joint. Outcomes
 * expected fewer than 5 times are pooled into one bin. */
static chi2_result run_chi2(const toy *target, const toy *drafter, const rp_sampling_params *base, drafter_kind dk,
                            int k, verify_rule rule, long n_trials) {
    static const int32_t prompt[] = {1, 4};
    const int n_prompt = 2;
    double joint[N_OUTCOMES];
    exact_joint(target, base, prompt, n_prompt, joint);
    long *count = calloc(N_OUTCOMES, sizeof *count);
    rp_spec *v = rp_spec_new(SV);
    rp_sampler *s = rp_sampler_new(SV);
    static round_buf r;
    long rounds = 0, tokens = 0;
    for (long trial = 0; trial < n_trials; trial++) {
        rp_sampling_params p = *base;
        p.seed = 0x5eed0000ull + (uint64_t)trial;
        int32_t out[N_GEN + MAX_K + 1];
        int n = 0;
        while (n < N_GEN) {
            draft_round(&r, drafter, dk, prompt, n_prompt, out, n, k, p.seed);
            score_round(&r, target, prompt, n_prompt, out, n, k);
            const double *const *q = dk == DRAFTER_Q ? r.q_ptr : NULL;
            int m;
            if (rule == VERIFY_EXACT) {
                rp_err err;
                m = rp_spec_verify(v, &p, r.row_ptr, r.draft, q, k, prompt, n_prompt, out, n, (uint64_t)n, NULL, &err);
                if (m < 1) fail_msg("rp_spec_verify: %s", err.msg);
            } else {
                m = verify_wrong(rule, s, &p, &r, k, q, prompt, n_prompt, out, n);
            }
            n += m;
            rounds++;
            tokens += m;
        }
        count[(out[0] * SV + out[1]) * SV + out[2]]++;
    }
    chi2_result res = {0};
    double pooled_obs = 0, pooled_exp = 0;
    int bins = 0;
    for (int o = 0; o < N_OUTCOMES; o++) {
        double expect = joint[o] * (double)n_trials;
        if (joint[o] == 0) {
            res.impossible += count[o];
            continue;
        }
        if (expect < 5) {
            pooled_obs += (double)count[o];
            pooled_exp += expect;
            continue;
        }
        res.stat += (count[o] - expect) * (count[o] - expect) / expect;
        bins++;
    }
    if (pooled_exp > 0) {
        res.stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
        bins++;
    }
    res.df = bins - 1;
    res.limit = chi2_q999(res.df);
    res.tokens_per_round = (double)tokens / (double)rounds;
    free(count);
    rp_spec_free(v);
    rp_sampler_free(s);
    return res;
}

static int chi2_passes(const chi2_result *r) { return r->impossible == 0 && r->stat <= r->limit; }

enum { N_TRIALS = 200000 };

typedef struct sampling_case {
    const char *name;
    rp_sampling_params p;
} sampling_case;

static void test_sampling_exact(void **state) {
    (void)state;
    toy target = toy_new(21, SV, 1.2f);
    toy drafter = toy_new(22, SV, 1.2f); /* a different model: drafts are often wrong */
    sampling_case cases[] = {
        {"temperature 1", sp(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f)},
        {"temperature 0.6, top-k 3", sp(0.6f, 3, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f)},
        {"temperature 1.4, top-p 0.8", sp(1.4f, 0, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f)},
        {"min-p 0.25", sp(1.0f, 0, 1.0f, 0.25f, 1.0f, 0.0f, 0.0f)},
        {"penalties, top-k 4", sp(0.9f, 4, 1.0f, 0.0f, 1.5f, 0.7f, 0.5f)},
        {"top-k 5, top-p 0.9, min-p 0.1", sp(1.1f, 5, 0.9f, 0.1f, 1.0f, 0.0f, 0.0f)},
    };
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int dk = DRAFTER_POINT; dk <= DRAFTER_Q; dk++) {
            int k = dk == DRAFTER_POINT ? 2 : 3;
            chi2_result r = run_chi2(&target, &drafter, &cases[c].p, (drafter_kind)dk, k, VERIFY_EXACT, N_TRIALS);
            printf("  %-30s %-5s k=%d: chi2 %7.1f  df %3d  limit(0.999) %6.1f  %.2f tokens/round%s\n", cases[c].name,
                   dk == DRAFTER_POINT ? "point" : "q", k, r.stat, r.df, r.limit, r.tokens_per_round,
                   chi2_passes(&r) ? "" : "  FAIL");
            if (r.impossible) printf("    %ld draws of outcomes with probability 0\n", r.impossible);
            failed += !chi2_passes(&r);
        }
    }
    toy_free(&target);
    toy_free(&drafter);
    if (failed) fail_msg("%d of %zu speculative distributions differ from the target's", failed,
                         2 * sizeof cases / sizeof cases[0]);
}

/* The check above can fail: the same statistic on verifiers with a broken
 * rule must exceed the limit. Keeping every draft emits the drafter's
 * tokens; drawing from p instead of the residual after a rejection gives
 * the rejected draft a second chance (the classic mistake). */
static void test_negative_controls(void **state) {
    (void)state;
    toy target = toy_new(21, SV, 1.2f);
    toy drafter = toy_new(22, SV, 1.2f);
    rp_sampling_params p = sp(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    rp_sampling_params pk = sp(0.6f, 3, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    struct {
        const char *name;
        const rp_sampling_params *p;
        drafter_kind dk;
        verify_rule rule;
    } controls[] = {
        {"always accept, point drafter", &p, DRAFTER_POINT, VERIFY_ALWAYS},
        {"always accept, q drafter", &p, DRAFTER_Q, VERIFY_ALWAYS},
        {"resample from p, point drafter", &p, DRAFTER_POINT, VERIFY_RESAMPLE_P},
        {"resample from p, q drafter", &p, DRAFTER_Q, VERIFY_RESAMPLE_P},
        {"resample from p, top-k 3, q", &pk, DRAFTER_Q, VERIFY_RESAMPLE_P},
    };
    for (size_t c = 0; c < sizeof controls / sizeof controls[0]; c++) {
        chi2_result r = run_chi2(&target, &drafter, controls[c].p, controls[c].dk, 2, controls[c].rule, N_TRIALS / 2);
        printf("  negative control, %-32s chi2 %9.1f  df %3d  limit(0.999) %6.1f  impossible %ld\n", controls[c].name,
               r.stat, r.df, r.limit, r.impossible);
        if (chi2_passes(&r)) fail_msg("negative control \"%s\" passed the chi-square check", controls[c].name);
    }
    toy_free(&target);
    toy_free(&drafter);
}

/* ---- seeds, logprobs and the bonus draw ---- */

/* Generates n_tokens sampled tokens in rounds (drafter with its own q). */
static void sample_run(rp_spec *v, const toy *target, const toy *drafter, const rp_sampling_params *p, int k,
                       int n_tokens, int32_t *out, float *lps) {
    static const int32_t prompt[] = {2, 3};
    static round_buf r;
    int n = 0;
    while (n < n_tokens) {
        draft_round(&r, drafter, DRAFTER_Q, prompt, 2, out, n, k, p->seed);
        score_round(&r, target, prompt, 2, out, n, k);
        rp_err err;
        int m = rp_spec_verify(v, p, r.row_ptr, r.draft, r.q_ptr, k, prompt, 2, out, n, (uint64_t)n, lps + n, &err);
        if (m < 1) fail_msg("%s", err.msg);
        n += m;
    }
}

static void test_seeds_reproduce(void **state) {
    (void)state;
    toy target = toy_new(31, SV, 1.0f), drafter = toy_new(32, SV, 1.0f);
    rp_spec *v = rp_spec_new(SV), *w = rp_spec_new(SV);
    rp_sampler *s = rp_sampler_new(SV);
    enum { N = 120 };
    int32_t a[N + MAX_K + 1], b[N + MAX_K + 1];
    float la[N + MAX_K + 1], lb[N + MAX_K + 1];
    for (int k = 1; k <= MAX_K; k += 7) {
        rp_sampling_params p = sp(1.0f, 0, 0.95f, 0.0f, 1.2f, 0.2f, 0.0f);
        p.seed = 77;
        sample_run(v, &target, &drafter, &p, k, N, a, la);
        sample_run(w, &target, &drafter, &p, k, N, b, lb); /* another object, same seed */
        assert_memory_equal(a, b, N * sizeof *a);
        assert_memory_equal(la, lb, N * sizeof *la);
        p.seed = 78;
        sample_run(w, &target, &drafter, &p, k, N, b, lb);
        int differ = 0;
        for (int i = 0; i < N; i++) differ += a[i] != b[i];
        if (differ < N / 3) fail_msg("k=%d: seeds 77 and 78 differ at only %d of %d tokens", k, differ, N);

        /* Each emitted token's logprob is what the sampler reports for it at
         * its position: its entry in the full top list, bit for bit. */
        int32_t ctx[N + 8] = {2, 3};
        for (int i = 0; i < N; i++) {
            float row[SV], lp;
            rp_top_logprobs top;
            rp_sampling_params pt = p;
            pt.seed = 77;
            pt.top_logprobs = SV;
            toy_logits(&target, ctx, 2 + i, row);
            rp_sampler_sample_top(s, &pt, row, ctx, 2, a, i, (uint64_t)i, &lp, &top);
            int found = 0;
            for (int j = 0; j < top.n; j++)
                if (top.ids[j] == a[i]) {
                    assert_memory_equal(&top.logprobs[j], &la[i], sizeof lp);
                    assert_true(isfinite(la[i]));
                    found = 1;
                }
            assert_true(found);
            ctx[2 + i] = a[i];
        }
    }
    rp_sampler_free(s);
    rp_spec_free(v);
    rp_spec_free(w);
    toy_free(&target);
    toy_free(&drafter);
}

/* k = 0 is one rp_sampler_sample. A drafter whose q is the target's p
 * exactly, drawn with the sampler's own stream 0 (the self-draft case): every
 * draft is kept, and the bonus is drawn at its own step, so the output is
 * the non-speculative output of the same seed token for token. */
static void test_self_draft_and_k0(void **state) {
    (void)state;
    toy target = toy_new(41, SV, 1.5f);
    rp_spec *v = rp_spec_new(SV);
    rp_sampler *s = rp_sampler_new(SV), *d = rp_sampler_new(SV);
    static const int32_t prompt[] = {0, 5};
    enum { N = 200 };
    rp_sampling_params cases[] = {sp(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f),
                                  sp(0.7f, 4, 0.9f, 0.05f, 1.2f, 0.3f, 0.2f)};
    for (size_t c = 0; c < 2; c++) {
        rp_sampling_params p = cases[c];
        p.seed = 99 + c;
        int32_t ref[N + MAX_K + 1], out[N + MAX_K + 1], ctx[N + MAX_K + 4];
        float ref_lp[N + MAX_K + 1], lp[MAX_K + 1], row[SV];
        memcpy(ctx, prompt, sizeof prompt);
        for (int n = 0; n < N + MAX_K; n++) {
            toy_logits(&target, ctx, 2 + n, row);
            ref[n] = rp_sampler_sample(s, &p, row, prompt, 2, ref, n, (uint64_t)n, &ref_lp[n]);
            ctx[2 + n] = ref[n];
        }
        for (int k = 0; k <= MAX_K; k++) {
            static round_buf r;
            int n = 0;
            while (n < N) {
                /* self-draft: d_i ~ p_i with stream 0 at its step, q_i = p_i */
                memcpy(r.ctx, prompt, sizeof prompt);
                memcpy(r.ctx + 2, out, (size_t)n * sizeof *out);
                int32_t hist[N + MAX_K + 1];
                memcpy(hist, out, (size_t)n * sizeof *out);
                for (int i = 0; i < k; i++) {
                    toy_logits(&target, r.ctx, 2 + n + i, row);
                    rp_sampler_probs(d, &p, row, prompt, 2, hist, n + i, r.q[i]);
                    r.draft[i] = rp_sampler_draw(d, rp_rand_uniform(p.seed, 0, (uint64_t)(n + i)), NULL);
                    r.q_ptr[i] = r.q[i];
                    hist[n + i] = r.draft[i];
                    r.ctx[2 + n + i] = r.draft[i];
                }
                score_round(&r, &target, prompt, 2, out, n, k);
                rp_err err;
                int m = rp_spec_verify(v, &p, r.row_ptr, r.draft, r.q_ptr, k, prompt, 2, out, n, (uint64_t)n, lp, &err);
                assert_int_equal(m, k + 1);
                for (int j = 0; j < m; j++) {
                    assert_int_equal(out[n + j], ref[n + j]);
                    assert_memory_equal(&lp[j], &ref_lp[n + j], sizeof(float));
                }
                n += m;
            }
        }
    }
    rp_sampler_free(s);
    rp_sampler_free(d);
    rp_spec_free(v);
    toy_free(&target);
}

/* ---- edge cases ---- */

static void test_all_rejected(void **state) {
    (void)state;
    const int vocab = 20;
    rp_spec *v = rp_spec_new(vocab);
    rp_sampler *s = rp_sampler_new(vocab);
    static round_buf r;
    int32_t out[MAX_K + 1];
    float lp[MAX_K + 1];
    for (int k = 1; k <= MAX_K; k += MAX_K - 1) {
        /* Greedy: drafts that are never the argmax; one token, the sampler's. */
        for (uint64_t t = 0; t < 50; t++) {
            for (int i = 0; i <= k; i++)
                for (int j = 0; j < vocab; j++) r.rows[i][j] = (float)rp_rand_normal(t, (uint64_t)i, (uint64_t)j);
            for (int i = 0; i <= k; i++) r.row_ptr[i] = r.rows[i];
            float row0[MAX_VOCAB], want_lp;
            memcpy(row0, r.rows[0], sizeof row0);
            rp_sampling_params p = sp(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            int want = rp_sampler_sample(s, &p, row0, NULL, 0, NULL, 0, 5, &want_lp);
            for (int i = 0; i < k; i++) r.draft[i] = (int32_t)((want + 1 + i) % vocab);
            rp_err err;
            assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, NULL, k, NULL, 0, out, 0, 5, lp, &err), 1);
            assert_int_equal(out[0], want);
            assert_memory_equal(&lp[0], &want_lp, sizeof want_lp);
        }
        /* Sampled: drafts the target cuts (top-k 3 and -inf); one token each
         * round, from the target's support, with its logprob under p. */
        int hits[MAX_VOCAB] = {0};
        for (uint64_t t = 0; t < 3000; t++) {
            for (int i = 0; i <= k; i++) {
                for (int j = 0; j < vocab; j++) r.rows[i][j] = (float)j * 0.1f;
                r.rows[i][0] = -INFINITY;
                r.row_ptr[i] = r.rows[i];
            }
            rp_sampling_params p = sp(1.0f, 3, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            p.seed = t;
            for (int i = 0; i < k; i++) r.draft[i] = i % 2 ? 0 : (int32_t)(i % 10);
            rp_err err;
            assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, NULL, k, NULL, 0, out, 0, 0, lp, &err), 1);
            assert_true(out[0] >= vocab - 3);
            hits[out[0]]++;
            double lse = log(exp(0.0) + exp(-0.1) + exp(-0.2));
            assert_float_equal(lp[0], (out[0] - (vocab - 1)) * 0.1 - lse, 1e-5);
        }
        /* the draw is p's: probabilities e^0 : e^-0.1 : e^-0.2 (about 0.366, 0.331, 0.300) */
        assert_in_range(hits[vocab - 1], 990, 1210);
        assert_in_range(hits[vocab - 3], 800, 1000);
    }
    rp_sampler_free(s);
    rp_spec_free(v);
}

static void test_all_inf_row(void **state) {
    (void)state;
    const int vocab = 10;
    rp_spec *v = rp_spec_new(vocab);
    rp_sampler *s = rp_sampler_new(vocab);
    static round_buf r;
    int32_t out[4];
    float lp[4];
    rp_sampling_params modes[] = {sp(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f), sp(1.0f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f)};
    for (int m = 0; m < 2; m++) {
        /* an all -inf (or NaN) row: token 0 with logprob -inf, as the sampler */
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < vocab; j++) r.rows[i][j] = j % 2 ? NAN : -INFINITY;
            r.row_ptr[i] = r.rows[i];
        }
        r.draft[0] = 3;
        r.draft[1] = 0;
        rp_err err;
        assert_int_equal(rp_spec_verify(v, &modes[m], r.row_ptr, r.draft, NULL, 2, NULL, 0, out, 0, 0, lp, &err), 1);
        assert_int_equal(out[0], 0);
        assert_true(isinf(lp[0]) && lp[0] < 0);
        /* a draft of 0 on such a row is the sampler's token: kept */
        r.draft[0] = 0;
        for (int j = 0; j < vocab; j++) r.rows[0][j] = -INFINITY;
        for (int j = 0; j < vocab; j++) r.rows[1][j] = -INFINITY;
        for (int j = 0; j < vocab; j++) r.rows[2][j] = j == 7 ? 1.0f : -INFINITY;
        assert_int_equal(rp_spec_verify(v, &modes[m], r.row_ptr, r.draft, NULL, 2, NULL, 0, out, 0, 0, lp, &err), 3);
        assert_int_equal(out[0], 0);
        assert_int_equal(out[1], 0);
        assert_int_equal(out[2], 7);
        assert_true(isinf(lp[0]) && isinf(lp[1]) && lp[2] == 0.0f);
    }
    rp_sampler_free(s);
    rp_spec_free(v);
}

static void test_errors(void **state) {
    (void)state;
    const int vocab = 10;
    rp_spec *v = rp_spec_new(vocab);
    assert_null(rp_spec_new(0));
    rp_spec_free(NULL);
    static round_buf r;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < vocab; j++) r.rows[i][j] = (float)j;
        r.row_ptr[i] = r.rows[i];
    }
    int32_t out[4] = {-7, -7, -7, -7};
    rp_sampling_params p = sp(1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    rp_err err;
    const int32_t bad[][2] = {{1, -1}, {vocab, 2}, {2, 1000000}};
    for (int b = 0; b < 3; b++) {
        memset(&err, 0, sizeof err);
        r.draft[0] = bad[b][0];
        r.draft[1] = bad[b][1];
        assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, NULL, 2, NULL, 0, out, 0, 0, NULL, &err), RP_ERR);
        if (!strstr(err.msg, "outside the vocabulary [0, 10)")) fail_msg("message: %s", err.msg);
        assert_int_equal(out[0], -7); /* nothing written */
    }
    /* a drafter that gives its own draft no probability */
    r.draft[0] = 2;
    r.draft[1] = 3;
    for (int i = 0; i < 2; i++) {
        for (int t = 0; t < vocab; t++) r.q[i][t] = 0.1;
        r.q_ptr[i] = r.q[i];
    }
    r.q[1][3] = 0.0;
    assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, r.q_ptr, 2, NULL, 0, out, 0, 0, NULL, &err), RP_ERR);
    if (!strstr(err.msg, "probability of its draft token 3 (draft 1) is 0")) fail_msg("message: %s", err.msg);
    r.q[1][3] = NAN;
    assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, r.q_ptr, 2, NULL, 0, out, 0, 0, NULL, &err), RP_ERR);
    /* parameters are validated, with the parameter named */
    rp_sampling_params bad_p = p;
    bad_p.top_p = 0.0f;
    assert_int_equal(rp_spec_verify(v, &bad_p, r.row_ptr, r.draft, NULL, 2, NULL, 0, out, 0, 0, NULL, &err), RP_ERR);
    assert_string_equal(err.param, "top_p");
    assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, r.draft, NULL, -1, NULL, 0, out, 0, 0, NULL, &err), RP_ERR);
    assert_int_equal(out[0], -7);
    /* k = 0: one token, rp_sampler_sample's, bit for bit */
    rp_sampler *s = rp_sampler_new(vocab);
    for (uint64_t step = 0; step < 200; step++) {
        float row[10], lp, lp_ref;
        for (int j = 0; j < vocab; j++) r.rows[0][j] = row[j] = (float)rp_rand_normal(step, 1, (uint64_t)j);
        p.seed = step * 3;
        int want = rp_sampler_sample(s, &p, row, NULL, 0, NULL, 0, step, &lp_ref);
        assert_int_equal(rp_spec_verify(v, &p, r.row_ptr, NULL, NULL, 0, NULL, 0, out, 0, step, &lp, &err), 1);
        assert_int_equal(out[0], want);
        assert_memory_equal(&lp, &lp_ref, sizeof lp);
    }
    rp_sampler_free(s);
    rp_spec_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_exact),      cmocka_unit_test(test_sampling_exact),
        cmocka_unit_test(test_negative_controls), cmocka_unit_test(test_seeds_reproduce),
        cmocka_unit_test(test_self_draft_and_k0), cmocka_unit_test(test_all_rejected),
        cmocka_unit_test(test_all_inf_row),       cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
