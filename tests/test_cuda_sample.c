/* Tests for the device sampler (src/backend/cuda/kernels/sample.cu) against
 * the host sampler (src/engine/sampler.c), which defines the semantics.
 *
 * Greedy must match exactly (ties, NaN, +inf, all -inf); sampled tokens
 * token by token on the same (seed, step) draws, allowing 1 row in 50 to
 * differ (a draw within rounding of a CDF boundary: the host sums double
 * masses, the device 2^44 fixed point; in practice every row agrees);
 * logprobs within 1e-3; the same launch twice gives the same tokens; over
 * many draws the counts follow the softmax. Shapes cover the fast cluster
 * path (one bin opened or several, top-k/top-p/min-p boundaries inside a
 * bin), its fall back to the exact slow path (thousands of tied logits),
 * rows that are not 16-byte aligned, tiny vocabularies and batches of 256.
 *
 * Inputs are random from a fixed seed (TEST_SEED, printed;
 * REPLAY_TEST_SEED runs another); outputs are poisoned before each launch.
 * REPLAY_TEST_SMALL=1 shrinks the shapes (for compute-sanitizer memcheck),
 * REPLAY_TEST_SMALL=2 further (racecheck: a few rows, vocabularies down
 * to 8000-10000, the same kernel paths: cluster fast path, tie slow path);
 * REPLAY_TEST_SKIP=pattern skips tests by name, REPLAY_TEST_ONLY=pattern
 * runs only those (cmocka wildcards);
 * Top logprobs (rp_k_sample_kept + rp_k_top_logprobs): ids exactly the
 * first n of a full sort, logprobs against float64 (greedy) and the host
 * sampler (sampled rows), eager and graph-replayed alike.
 * Token masks (rp_k_apply_token_mask, structured output): the masked
 * logits exactly the CPU reference's (rp_sampler_apply_mask), rows
 * without a mask untouched, and the sampling kernels on them against the
 * host sampler on the masked row (masked_sampling.h): every token allowed,
 * greedy exact, top logprobs finite only for allowed tokens; the skip flag
 * (a deferred step's) leaves the sampling kernels' outputs unwritten.
 * REPLAY_SAMPLE_BENCH=1 also prints rp_k_sample timings (eager and graph)
 * for rows 1, 8, 64, 256 at vocab 151936. Label "gpu" in CTest. */
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

#ifdef REPLAY_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "test_cuda_util.h"

#include "backend/cuda/kernels.h"
#include "backend/cuda/sample_top.h"
#include "backend/cuda/token_mask.h"
#include "engine/sampler.h"
#include "masked_sampling.h"
#include "util/rng.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t g_seed, g_ctr;
static int g_small; /* REPLAY_TEST_SMALL: 0, 1 or 2 */

/* A test's row count or vocabulary at the three sizes. */
static int size_at(int full, int small, int tiny) { return g_small >= 2 ? tiny : g_small ? small : full; }

static uint32_t urand(uint32_t n) { return (uint32_t)(rp_rand_u64(g_seed, 2, g_ctr++) % n); }


static int have_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return 0;
    }
    return 1;
}

#define NEED_GPU()                                                   \
    do {                                                             \
        if (!have_gpu()) {                                           \
            printf("no CUDA GPU: skipping CUDA sampler tests\n");    \
            skip();                                                  \
        }                                                            \
    } while (0)

static void fill_normal(float *x, int n, float scale) {
    for (int i = 0; i < n; i++) {
        double u1 = rp_rand_uniform(g_seed, 3, g_ctr++) + 1e-9, u2 = rp_rand_uniform(g_seed, 3, g_ctr++);
        x[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

/* Logits shaped like a model's: a normal bulk, a peaked head, some equal
 * pairs. */
static void fill_model_like(float *x, int vocab) {
    fill_normal(x, vocab, 2.5f);
    for (int i = 0; i < 200; i++) x[urand(vocab)] += 8.0f;
    for (int i = 0; i < 50; i++) x[urand(vocab)] = x[urand(vocab)];
}

/* One launch; a NULL workspace size check is part of the contract. The
 * logprob buffer is optional (with_lp). */
static void run_sample_lp(const float *d_logits, const rp_sampling_params *params, int rows, int vocab, int32_t *tok,
                          float *lp, int with_lp) {
    rp_sampling_params *d_p = dup_to_dev(params, (size_t)rows * sizeof *params);
    int32_t *d_tok = dalloc((size_t)rows * 4);
    float *d_lp = dalloc((size_t)rows * 4);
    void *d_ws = dalloc(rp_sample_workspace_bytes(rows, vocab));
    LAUNCH(rp_k_sample(d_logits, d_p, d_tok, with_lp ? d_lp : NULL, d_ws, rows, vocab, 0));
    to_host(tok, d_tok, (size_t)rows * 4);
    if (with_lp) to_host(lp, d_lp, (size_t)rows * 4);
    cudaFree(d_p), cudaFree(d_tok), cudaFree(d_lp), cudaFree(d_ws);
}
static void run_sample(const float *d_logits, const rp_sampling_params *params, int rows, int vocab, int32_t *tok,
                       float *lp) {
    run_sample_lp(d_logits, params, rows, vocab, tok, lp, 1);
}

/* The host sampler on one row (it overwrites its input: work on a copy). */
static int host_sample(rp_sampler *smp, const float *row, int vocab, const rp_sampling_params *p, float *tmp,
                       float *lp) {
    rp_sampling_params hp;
    rp_sampling_params_default(&hp);
    hp.temperature = p->temperature, hp.top_p = p->top_p, hp.top_k = p->top_k, hp.min_p = p->min_p;
    hp.seed = p->seed;
    memcpy(tmp, row, (size_t)vocab * 4);
    return rp_sampler_sample(smp, &hp, tmp, NULL, 0, NULL, 0, p->step, lp);
}

/* Device against host on rows (logits [rows][vocab]), twice for
 * determinism; fails past 1 disagreement in 50 or a logprob off by 1e-3. */
static void check_vs_host(const char *what, const float *logits, const rp_sampling_params *params, int rows,
                          int vocab) {
    float *d_logits = dup_to_dev(logits, (size_t)rows * vocab * 4);
    int32_t *tok = malloc((size_t)rows * 4), *tok2 = malloc((size_t)rows * 4);
    float *lp = malloc((size_t)rows * 4), *lp2 = malloc((size_t)rows * 4), *tmp = malloc((size_t)vocab * 4);
    run_sample(d_logits, params, rows, vocab, tok, lp);
    run_sample(d_logits, params, rows, vocab, tok2, lp2);
    assert_memory_equal(tok, tok2, (size_t)rows * 4); /* same seed, same token */
    assert_memory_equal(lp, lp2, (size_t)rows * 4);
    rp_sampler *smp = rp_sampler_new(vocab);
    int agree = 0;
    double max_lp_err = 0;
    for (int r = 0; r < rows; r++) {
        float want_lp;
        const int want = host_sample(smp, logits + (size_t)r * vocab, vocab, &params[r], tmp, &want_lp);
        if (tok[r] < 0 || tok[r] >= vocab) fail_msg("%s row %d: token %d out of range", what, r, tok[r]);
        if (tok[r] == want) {
            agree++;
            if (!(isinf(want_lp) && want_lp == lp[r])) {
                const double e = fabs((double)lp[r] - want_lp);
                if (!(e <= max_lp_err)) max_lp_err = e; /* NaN sticks */
            }
        }
    }
    printf("  %-52s agree with host %d/%d, logprob err %.1e\n", what, agree, rows, max_lp_err);
    if (agree < rows - rows / 50) fail_msg("%s: device and host disagree on %d of %d rows", what, rows - agree, rows);
    if (!(max_lp_err <= 1e-3)) fail_msg("%s: logprob differs by %g", what, max_lp_err);
    rp_sampler_free(smp);
    free(tok), free(tok2), free(lp), free(lp2), free(tmp);
    cudaFree(d_logits);
}

/* ---- tests -------------------------------------------------------------- */

static void test_sample_greedy(void **state) {
    (void)state;
    NEED_GPU();
    const int rows = 6, vocab = g_small ? 32000 : 152064;
    float *logits = malloc((size_t)rows * vocab * 4);
    fill_normal(logits, rows * vocab, 3.0f);
    /* planted ties: the lowest id must win */
    logits[0 * vocab + 5000] = 100.0f, logits[0 * vocab + 7] = 100.0f, logits[0 * vocab + vocab - 1] = 100.0f;
    logits[1 * vocab + vocab - 1] = 50.0f;
    logits[2 * vocab + 3] = NAN, logits[2 * vocab + 4] = INFINITY, logits[2 * vocab + 9] = INFINITY;
    for (int i = 0; i < vocab; i++) logits[3 * vocab + i] = -INFINITY;
    logits[4 * vocab + 0] = 40.0f;
    rp_sampling_params params[6];
    memset(params, 0, sizeof params);
    for (int r = 0; r < rows; r++) params[r].top_p = 1.0f; /* greedy ignores it; the host validates it */
    float *d_logits = dup_to_dev(logits, (size_t)rows * vocab * 4);
    int32_t tok[6], tok2[6];
    float lp[6];
    run_sample(d_logits, params, rows, vocab, tok, lp);
    run_sample_lp(d_logits, params, rows, vocab, tok2, NULL, 0); /* logprobs are optional */
    assert_memory_equal(tok, tok2, sizeof tok);
    rp_sampler *smp = rp_sampler_new(vocab);
    float *tmp = malloc((size_t)vocab * 4);
    for (int r = 0; r < rows; r++) {
        float want_lp;
        const int want = host_sample(smp, logits + (size_t)r * vocab, vocab, &params[r], tmp, &want_lp);
        if (tok[r] != want) fail_msg("greedy row %d: %d != %d", r, tok[r], want);
        if (!(isinf(want_lp) && isinf(lp[r])) && !(fabsf(lp[r] - want_lp) < 1e-3f * (1 + fabsf(want_lp))))
            fail_msg("greedy row %d logprob %g != %g", r, lp[r], want_lp);
    }
    printf("  greedy: %d rows exact (ties, NaN, +inf, all -inf), logprobs within 1e-3\n", rows);
    free(logits), free(tmp);
    rp_sampler_free(smp);
    cudaFree(d_logits);
}

/* Token by token against the host sampler: rows share logits, differ in
 * step (the RNG counter); one configuration per launch. */
static void test_sample_vs_host(void **state) {
    (void)state;
    NEED_GPU();
    const int vocab = size_at(152064, 32000, 8000), rows = size_at(128, 32, 1);
    struct {
        float t, p, minp;
        int k;
    } cfg[] = {{1.0f, 1.0f, 0.0f, 0},    {0.7f, 0.9f, 0.0f, 0},   {1.0f, 1.0f, 0.0f, 50},    {0.8f, 0.95f, 0.05f, 40},
               {1.3f, 1.0f, 0.1f, 0},    {0.005f, 1.0f, 0.0f, 0}, {1.0f, 0.5f, 0.0f, 5000},  {1.0f, 1.0f, 0.0f, 1},
               {1.0f, 0.9f, 0.0f, 0},    {1.0f, 1.0f, 0.05f, 0},  {2.0f, 0.99f, 0.0f, 0},    {1.0f, 1.0f, 1e-30f, 0},
               {0.6f, 1.0f, 1.0f, 0},    {1.0f, 1.0f, 0.0f, 100000}, {1.0f, 0.95f, 0.02f, 1000}};
    const int ncfg = sizeof cfg / sizeof cfg[0];
    float *logits = malloc((size_t)rows * vocab * 4);
    fill_model_like(logits, vocab);
    for (int r = 1; r < rows; r++) memcpy(logits + (size_t)r * vocab, logits, (size_t)vocab * 4);
    rp_sampling_params *params = calloc((size_t)rows, sizeof *params);
    for (int c = 0; c < ncfg; c++) {
        for (int r = 0; r < rows; r++)
            params[r] = (rp_sampling_params){.temperature = cfg[c].t, .top_p = cfg[c].p, .top_k = cfg[c].k,
                                           .min_p = cfg[c].minp, .seed = g_seed + 17, .step = (uint64_t)r * 7 + 3};
        char what[96];
        snprintf(what, sizeof what, "T=%.3g top_p=%.2g min_p=%.2g top_k=%d", cfg[c].t, cfg[c].p, cfg[c].minp,
                 cfg[c].k);
        check_vs_host(what, logits, params, rows, vocab);
    }
    free(logits), free(params);
}

/* One of four row shapes, at random: model-like, nearly flat (the bins
 * adapt to the range), very peaked, or masked tokens with a NaN. */
static void fill_mixed_row(float *x, int vocab) {
    const int shape = urand(4);
    if (shape == 0) fill_model_like(x, vocab);
    else if (shape == 1) fill_normal(x, vocab, 0.05f);
    else if (shape == 2) fill_normal(x, vocab, 20.0f);
    else {
        fill_normal(x, vocab, 1.0f);
        for (int i = 0; i < vocab; i += 3) x[i] = -INFINITY;
        x[urand(vocab)] = NAN;
    }
}

/* A batch: every row its own logits and its own parameters (mixed greedy
 * and sampled rows in one launch), at a vocabulary whose rows are not
 * 16-byte aligned and one that is. */
static void test_sample_batch(void **state) {
    (void)state;
    NEED_GPU();
    const int vocabs[] = {g_small ? 4003 : 32003, g_small ? 8000 : 151936};
    const int rows = size_at(256, 16, 6);
    for (int vi = 0; vi < 2; vi++) {
        const int vocab = vocabs[vi];
        float *logits = malloc((size_t)rows * vocab * 4);
        rp_sampling_params *params = calloc((size_t)rows, sizeof *params);
        for (int r = 0; r < rows; r++) {
            float *x = logits + (size_t)r * vocab;
            fill_mixed_row(x, vocab);
            const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
            params[r].temperature = temps[urand(5)];
            params[r].top_p = urand(2) ? 1.0f : 0.5f + 0.5f * (float)urand(100) / 100.0f;
            params[r].top_k = urand(2) ? 0 : 1 + (int)urand(200);
            params[r].min_p = urand(3) ? 0.0f : (float)urand(100) / 400.0f;
            params[r].seed = g_seed + (uint64_t)r;
            params[r].step = urand(1000);
        }
        char what[96];
        snprintf(what, sizeof what, "batch of %d mixed rows, vocab %d", rows, vocab);
        check_vs_host(what, logits, params, rows, vocab);
        free(logits), free(params);
    }
}

/* Thousands of exactly tied logits at the top: the bin is too large to
 * open in block 0, so the row goes to the exact slow path. Also a fully
 * flat row, special values in sampled rows, and tiny vocabularies (slices
 * of zero length in the cluster). */
static void test_sample_ties_and_edges(void **state) {
    (void)state;
    NEED_GPU();
    const int vocab = size_at(151936, 20000, 10000), rows = 8;
    float *logits = malloc((size_t)rows * vocab * 4);
    rp_sampling_params params[8];
    for (int r = 0; r < rows; r++) {
        float *x = logits + (size_t)r * vocab;
        fill_model_like(x, vocab);
        params[r] = (rp_sampling_params){.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .min_p = 0.0f,
                                       .seed = g_seed + 99, .step = (uint64_t)r};
    }
    for (int i = 0; i < vocab; i += 7) logits[0 * (size_t)vocab + i] = 12.0f; /* ~21k tied at the top */
    for (int i = 0; i < vocab; i += 7) logits[1 * (size_t)vocab + i] = 12.0f;
    params[1].top_k = 3000, params[1].top_p = 0.3f;
    for (int i = 0; i < vocab; i++) logits[2 * (size_t)vocab + i] = 0.5f; /* flat */
    params[2].top_p = 0.7f;
    logits[3 * (size_t)vocab + 10] = INFINITY, logits[3 * (size_t)vocab + 20] = INFINITY; /* share all mass */
    logits[3 * (size_t)vocab + 30] = NAN, logits[3 * (size_t)vocab + 40] = -INFINITY;
    for (int i = 0; i < vocab; i++) logits[4 * (size_t)vocab + i] = -INFINITY;
    logits[4 * (size_t)vocab + vocab - 1] = -3.0f; /* a single finite token */
    for (int i = 0; i < vocab; i++) logits[5 * (size_t)vocab + i] = -INFINITY; /* nothing: token 0 */
    for (int i = 0; i < 3000; i++) logits[6 * (size_t)vocab + urand(vocab)] = -0.0f; /* signed zeros tie */
    for (int i = 0; i < 3000; i++) logits[6 * (size_t)vocab + urand(vocab)] = 0.0f;
    params[6].temperature = 0.01f;
    params[7].temperature = 0.001f, params[7].top_k = 2; /* clamped to 0.01 */
    check_vs_host("ties (slow path), flat, inf/NaN, signed zeros", logits, params, rows, vocab);
    free(logits);

    const int small_vocabs[] = {1, 5, 40, 129};
    for (int vi = 0; vi < 4; vi++) {
        const int v = small_vocabs[vi], n = size_at(64, 64, 16);
        float *l = malloc((size_t)n * v * 4);
        rp_sampling_params *ps = calloc(n, sizeof *ps);
        for (int r = 0; r < n; r++) {
            fill_normal(l + (size_t)r * v, v, 2.0f);
            ps[r] = (rp_sampling_params){.temperature = r % 4 ? 1.0f : 0.0f, .top_p = r % 3 ? 1.0f : 0.8f,
                                       .top_k = r % 5 ? 0 : 3, .seed = g_seed, .step = (uint64_t)r};
        }
        char what[64];
        snprintf(what, sizeof what, "vocab %d", v);
        check_vs_host(what, l, ps, n, v);
        free(l), free(ps);
    }
}

/* ---- top logprobs (rp_k_sample_kept + rp_k_top_logprobs) ------------------- */

/* The sampler's view of a logit: NaN -> -inf, +inf -> FLT_MAX. */
static double ref_sanitize(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    return (double)x;
}

static const float *g_ref_row;
static int ref_order_cmp(const void *a, const void *b) {
    const int i = *(const int *)a, j = *(const int *)b;
    const double x = ref_sanitize(g_ref_row[i]), y = ref_sanitize(g_ref_row[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : i > j ? 1 : 0;
}

/* Both kernels as the backend runs them, eagerly, or captured in a graph and
 * replayed (with_graph), into poisoned buffers; the sampler also writes the
 * tokens and logprobs into host slot 1 of two mapped pinned buffers
 * (rp_sample_host), which must then hold exactly the device's, slot 0 left
 * as poisoned. */
static void run_top(const float *d_logits, const rp_sampling_params *params, int rows, int vocab, int with_graph,
                    int32_t *tok, float *lp, rp_top_logprobs *top) {
    rp_sampling_params *d_p = dup_to_dev(params, (size_t)rows * sizeof *params);
    int32_t *d_tok = dalloc((size_t)rows * 4), *d_kept = dalloc((size_t)rows * 4);
    float *d_lp = dalloc((size_t)rows * 4);
    rp_top_logprobs *d_top = dalloc((size_t)rows * sizeof *d_top);
    void *d_ws = dalloc(rp_sample_workspace_bytes(rows, vocab));
    const int32_t one = 1;
    int32_t *h_res[2];
    rp_sample_host host = {.slot = dup_to_dev(&one, 4), .stride = rows};
    for (int k = 0; k < 2; k++) {
        CU(cudaHostAlloc((void **)&h_res[k], (size_t)rows * 8, cudaHostAllocMapped));
        memset(h_res[k], 0xff, (size_t)rows * 8);
        CU(cudaHostGetDevicePointer((void **)&host.rows[k], h_res[k], 0));
    }
    if (with_graph) {
        cudaStream_t st;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        /* the first launch sets the kernels' attributes, outside the capture */
        LAUNCH(rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, &host, NULL, d_ws, rows, vocab, st));
        CU(cudaStreamSynchronize(st));
        memset(h_res[1], 0xff, (size_t)rows * 8);
        CU(cudaMemset(d_tok, 0xff, (size_t)rows * 4));
        CU(cudaMemset(d_lp, 0xff, (size_t)rows * 4));
        CU(cudaMemset(d_kept, 0xff, (size_t)rows * 4));
        CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        int r1 = rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, &host, NULL, d_ws, rows, vocab, st);
        int r2 = rp_k_top_logprobs(d_logits, d_p, d_tok, d_lp, d_kept, d_top, NULL, rows, vocab, st);
        CU(cudaStreamEndCapture(st, &g));
        if (r1 || r2) fail_msg("launch under capture failed: %d %d", r1, r2);
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphLaunch(ge, st));
        CU(cudaStreamSynchronize(st));
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
        CU(cudaStreamDestroy(st));
    } else {
        LAUNCH(rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, &host, NULL, d_ws, rows, vocab, 0));
        LAUNCH(rp_k_top_logprobs(d_logits, d_p, d_tok, d_lp, d_kept, d_top, NULL, rows, vocab, 0));
    }
    to_host(tok, d_tok, (size_t)rows * 4);
    to_host(lp, d_lp, (size_t)rows * 4);
    to_host(top, d_top, (size_t)rows * sizeof *top);
    assert_memory_equal(h_res[1], tok, (size_t)rows * 4);
    assert_memory_equal(h_res[1] + rows, lp, (size_t)rows * 4);
    for (int i = 0; i < 2 * rows; i++)
        if (h_res[0][i] != -1) fail_msg("host slot 0 written at %d though the kernel was told slot 1", i);
    for (int k = 0; k < 2; k++) cudaFreeHost(h_res[k]);
    cudaFree((void *)host.slot);
    cudaFree(d_p), cudaFree(d_tok), cudaFree(d_kept), cudaFree(d_lp), cudaFree(d_top), cudaFree(d_ws);
}

/* Device top logprobs against float64 references, row by row:
 *  - ids: exactly the first n of a full sort by (logit desc, id asc);
 *  - greedy rows: logprobs = float64 log-softmax at temperature 1 (1e-3);
 *  - sampled rows: the host sampler's list (it is tested against a float64
 *    reference in test_sampler.c) where host and device drew the same token;
 *    allowing 1 row in 50 to differ, as check_vs_host;
 *  - descending, the sampled token's entry equal to its logprob bit for bit,
 *    n = 0 for rows that did not ask; graph replay = eager, bit for bit. */
static void check_top_vs_host(const char *what, const float *logits, const rp_sampling_params *params, int rows,
                              int vocab) {
    float *d_logits = dup_to_dev(logits, (size_t)rows * vocab * 4);
    int32_t *tok = malloc((size_t)rows * 4), *tok_g = malloc((size_t)rows * 4);
    float *lp = malloc((size_t)rows * 4), *lp_g = malloc((size_t)rows * 4), *tmp = malloc((size_t)vocab * 4);
    rp_top_logprobs *top = malloc((size_t)rows * sizeof *top), *top_g = malloc((size_t)rows * sizeof *top);
    int *order = malloc((size_t)vocab * sizeof *order);
    run_top(d_logits, params, rows, vocab, 0, tok, lp, top);
    run_top(d_logits, params, rows, vocab, 1, tok_g, lp_g, top_g);
    assert_memory_equal(tok, tok_g, (size_t)rows * 4);
    rp_sampler *smp = rp_sampler_new(vocab);
    int agree = 0, sampled = 0;
    double max_err = 0;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * vocab;
        const rp_sampling_params *p = &params[r];
        const int n = p->top_logprobs < vocab ? p->top_logprobs : vocab;
        const rp_top_logprobs *t = &top[r];
        if (t->n != n) fail_msg("%s row %d: n = %d, want %d", what, r, t->n, n);
        if (n == 0) continue;
        if (memcmp(t, &top_g[r], sizeof *t) != 0) fail_msg("%s row %d: graph replay differs from eager", what, r);
        for (int i = 0; i < vocab; i++) order[i] = i;
        g_ref_row = row;
        qsort(order, (size_t)vocab, sizeof *order, ref_order_cmp);
        for (int j = 0; j < n; j++) {
            if (t->ids[j] != order[j]) fail_msg("%s row %d: top id %d is %d, want %d", what, r, j, t->ids[j], order[j]);
            if (isnan(t->logprobs[j]) || t->logprobs[j] > 1e-6f || (j && t->logprobs[j] > t->logprobs[j - 1]))
                fail_msg("%s row %d: logprob %d = %g (not a descending logprob)", what, r, j, t->logprobs[j]);
            if (t->ids[j] == tok[r] && memcmp(&t->logprobs[j], &lp[r], 4) != 0)
                fail_msg("%s row %d: the sampled token's entry %g != its logprob %g", what, r, t->logprobs[j], lp[r]);
        }
        double want[RP_MAX_TOP_LOGPROBS];
        if (p->temperature == 0.0f) {
            double mx = ref_sanitize(row[order[0]]), sum = 0;
            for (int i = 0; i < vocab && mx != -INFINITY; i++) sum += exp(ref_sanitize(row[i]) - mx);
            for (int j = 0; j < n; j++) {
                const double x = ref_sanitize(row[order[j]]);
                want[j] = mx == -INFINITY || x == -INFINITY ? -INFINITY : x - mx - log(sum);
            }
        } else {
            sampled++;
            rp_sampling_params hp;
            rp_sampling_params_default(&hp);
            hp.temperature = p->temperature, hp.top_p = p->top_p, hp.top_k = p->top_k, hp.min_p = p->min_p;
            hp.seed = p->seed, hp.top_logprobs = p->top_logprobs;
            rp_top_logprobs ht;
            memcpy(tmp, row, (size_t)vocab * 4);
            const int host_tok = rp_sampler_sample_top(smp, &hp, tmp, NULL, 0, NULL, 0, p->step, NULL, &ht);
            if (host_tok != tok[r]) continue; /* a draw on a CDF boundary: counted below */
            agree++;
            assert_int_equal(ht.n, n);
            for (int j = 0; j < n; j++) want[j] = ht.logprobs[j];
        }
        for (int j = 0; j < n; j++) {
            const double got = t->logprobs[j];
            if (isinf(want[j]) || isinf(got)) {
                if (!(isinf(want[j]) && isinf(got)))
                    fail_msg("%s row %d (T=%g top_k=%d top_p=%g min_p=%g): logprob %d = %g, want %g", what, r,
                             p->temperature, p->top_k, p->top_p, p->min_p, j, got, want[j]);
                continue;
            }
            const double e = fabs(got - want[j]) / (1 + fabs(want[j]));
            if (!(e <= max_err)) max_err = e;
        }
    }
    printf("  %-52s ids exact, sampled rows agree %d/%d, logprob rel err %.1e\n", what, agree, sampled, max_err);
    if (agree < sampled - sampled / 50) fail_msg("%s: device and host disagree on %d of %d rows", what,
                                                 sampled - agree, sampled);
    if (!(max_err <= 1e-3)) fail_msg("%s: top logprobs differ by %g", what, max_err);
    rp_sampler_free(smp);
    free(tok), free(tok_g), free(lp), free(lp_g), free(tmp), free(top), free(top_g), free(order);
    cudaFree(d_logits);
}

static void test_top_logprobs(void **state) {
    (void)state;
    NEED_GPU();
    /* mixed rows: greedy and sampled with every truncation, n in 0..20 */
    const int vocabs[] = {g_small ? 4003 : 32003, size_at(151936, 32000, 8000)};
    const int rows = size_at(96, 24, 6);
    for (int vi = 0; vi < 2; vi++) {
        const int vocab = vocabs[vi];
        float *logits = malloc((size_t)rows * vocab * 4);
        rp_sampling_params *params = calloc((size_t)rows, sizeof *params);
        for (int r = 0; r < rows; r++) {
            float *x = logits + (size_t)r * vocab;
            fill_mixed_row(x, vocab);
            x[urand(vocab)] = x[urand(vocab)] = x[urand(vocab)] = 60.0f; /* tied at the top: lower id first */
            const float temps[] = {0.0f, 0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
            params[r].temperature = temps[urand(6)];
            params[r].top_p = urand(2) ? 1.0f : 0.5f + 0.5f * (float)urand(100) / 100.0f;
            params[r].top_k = urand(2) ? 0 : 1 + (int)urand(30);
            params[r].min_p = urand(3) ? 0.0f : (float)urand(100) / 400.0f;
            params[r].seed = g_seed + (uint64_t)r;
            params[r].step = urand(1000);
            params[r].top_logprobs = r % 7 == 0 ? 0 : r % 5 == 0 ? RP_MAX_TOP_LOGPROBS : 1 + (int)urand(20);
        }
        char what[96];
        snprintf(what, sizeof what, "top logprobs, %d mixed rows, vocab %d", rows, vocab);
        check_top_vs_host(what, logits, params, rows, vocab);
        free(logits), free(params);
    }

    /* the exact slow path (thousands of ties), flat rows, inf/NaN, a single
     * finite token, an all -inf row */
    const int vocab = size_at(151936, 20000, 10000), n_edge = 7;
    float *logits = malloc((size_t)n_edge * vocab * 4);
    rp_sampling_params params[7];
    for (int r = 0; r < n_edge; r++) {
        fill_model_like(logits + (size_t)r * vocab, vocab);
        params[r] = (rp_sampling_params){.temperature = 1.0f, .top_p = 1.0f, .seed = g_seed + 5, .step = (uint64_t)r,
                                       .top_logprobs = RP_MAX_TOP_LOGPROBS};
    }
    for (int i = 0; i < vocab; i += 7) logits[0 * (size_t)vocab + i] = 12.0f; /* ~21k tied at the top */
    params[0].top_p = 0.3f;
    for (int i = 0; i < vocab; i += 7) logits[1 * (size_t)vocab + i] = 12.0f;
    params[1].top_k = 3000, params[1].top_p = 0.3f;
    for (int i = 0; i < vocab; i++) logits[2 * (size_t)vocab + i] = 0.5f; /* flat */
    params[2].top_p = 0.7f;
    logits[3 * (size_t)vocab + 10] = INFINITY, logits[3 * (size_t)vocab + 20] = INFINITY;
    logits[3 * (size_t)vocab + 30] = NAN, logits[3 * (size_t)vocab + 40] = -INFINITY;
    for (int i = 0; i < vocab; i++) logits[4 * (size_t)vocab + i] = -INFINITY;
    logits[4 * (size_t)vocab + vocab - 1] = -3.0f; /* a single finite token: the rest -inf, by id */
    for (int i = 0; i < vocab; i++) logits[5 * (size_t)vocab + i] = -INFINITY; /* nothing: token 0, all -inf */
    params[6].temperature = 0.0f;
    for (int i = 0; i < vocab; i += 7) logits[6 * (size_t)vocab + i] = 12.0f; /* greedy over ties */
    check_top_vs_host("top logprobs: slow path, flat, inf/NaN, -inf rows", logits, params, n_edge, vocab);
    free(logits);

    /* vocabularies smaller than n */
    const int small_vocabs[] = {1, 5, 19};
    for (int vi = 0; vi < 3; vi++) {
        const int v = small_vocabs[vi], n = size_at(16, 16, 8);
        float *l = malloc((size_t)n * v * 4);
        rp_sampling_params *ps = calloc(n, sizeof *ps);
        for (int r = 0; r < n; r++) {
            fill_normal(l + (size_t)r * v, v, 2.0f);
            ps[r] = (rp_sampling_params){.temperature = r % 4 ? 1.0f : 0.0f, .top_p = r % 3 ? 1.0f : 0.8f,
                                       .top_k = r % 5 ? 0 : 3, .seed = g_seed, .step = (uint64_t)r,
                                       .top_logprobs = RP_MAX_TOP_LOGPROBS};
        }
        char what[64];
        snprintf(what, sizeof what, "top logprobs, vocab %d", v);
        check_top_vs_host(what, l, ps, n, v);
        free(l), free(ps);
    }
}

/* Over many steps the draws follow softmax(logits / T) (restricted by
 * top-k): every token's count within 5 sigma of its expectation. */
static void test_sample_distribution(void **state) {
    (void)state;
    NEED_GPU();
    const int vocab = 40, rows = size_at(20000, 2000, 100);
    float logits[40];
    fill_normal(logits, vocab, 1.5f);
    for (int cfgi = 0; cfgi < 2; cfgi++) {
        const float temp = cfgi ? 0.8f : 1.0f;
        const int top_k = cfgi ? 10 : 0;
        float *all = malloc((size_t)rows * vocab * 4);
        for (int r = 0; r < rows; r++) memcpy(all + (size_t)r * vocab, logits, sizeof logits);
        float *d_logits = dup_to_dev(all, (size_t)rows * vocab * 4);
        rp_sampling_params *params = calloc((size_t)rows, sizeof *params);
        for (int r = 0; r < rows; r++)
            params[r] = (rp_sampling_params){.temperature = temp, .top_p = 1.0f, .top_k = top_k, .seed = g_seed + 5,
                                           .step = (uint64_t)r};
        int32_t *tok = malloc((size_t)rows * 4);
        float *lp = malloc((size_t)rows * 4);
        run_sample(d_logits, params, rows, vocab, tok, lp);
        double prob[40], mx = -INFINITY, sum = 0;
        int order[40];
        for (int i = 0; i < vocab; i++) order[i] = i, mx = logits[i] > mx ? logits[i] : mx;
        for (int i = 0; i < vocab; i++)
            for (int j = i + 1; j < vocab; j++)
                if (logits[order[j]] > logits[order[i]]) {
                    int t = order[i];
                    order[i] = order[j], order[j] = t;
                }
        for (int i = 0; i < vocab; i++) prob[i] = 0;
        for (int i = 0; i < (top_k ? top_k : vocab); i++) sum += prob[order[i]] = exp((logits[order[i]] - mx) / temp);
        int count[40] = {0};
        for (int r = 0; r < rows; r++) {
            assert_true(tok[r] >= 0 && tok[r] < vocab);
            count[tok[r]]++;
        }
        double worst = 0;
        for (int i = 0; i < vocab; i++) {
            double pr = prob[i] / sum, e = rows * pr, sd = sqrt(rows * pr * (1 - pr)) + 1e-9;
            if (pr == 0 && count[i]) fail_msg("token %d outside top-k drawn %d times", i, count[i]);
            double z = fabs(count[i] - e) / sd;
            if (pr > 0 && z > worst) worst = z;
        }
        printf("  distribution T=%.1f top_k=%d over %d draws: worst |z| = %.2f\n", temp, top_k, rows, worst);
        if (worst > 5.0) fail_msg("sampled distribution deviates from softmax (|z| = %.2f)", worst);
        free(all), free(params), free(tok), free(lp);
        cudaFree(d_logits);
    }
}

/* ---- token masks (rp_k_apply_token_mask) ----------------------------------- */

/* Rows of every kind of mask (dense, sparse, one token, everything
 * allowed, none: -1), greedy and sampled, some with top logprobs, at a
 * vocabulary that ends inside a mask word and at Qwen3's: the masked logits
 * bit for bit the CPU reference's, then the sampling kernels on them
 * against the host sampler on the masked rows. */
static void test_apply_token_mask(void **state) {
    (void)state;
    NEED_GPU();
    const int vocabs[] = {size_at(32003, 4003, 4003), size_at(151936, 32000, 8000)};
    enum { ROWS = 12 };
    static const int per_mille[ROWS] = {500, 20, 0, 1000, -1, 300, 5, -1, 100, 990, 1, 50};
    for (int vi = 0; vi < 2; vi++) {
        const int V = vocabs[vi], W = rp_token_mask_words(V);
        float *logits = malloc((size_t)ROWS * V * 4), *masked = malloc((size_t)ROWS * V * 4);
        float *got = malloc((size_t)ROWS * V * 4), *tmp = malloc((size_t)V * 4);
        uint32_t *masks = calloc((size_t)ROWS * W, 4);
        int32_t mask_of_row[ROWS];
        rp_sampling_params params[ROWS];
        int nm = 0;
        for (int r = 0; r < ROWS; r++) {
            fill_mixed_row(logits + (size_t)r * V, V);
            params[r] = (rp_sampling_params){.temperature = r % 3 == 0 ? 0.0f : r % 3 == 1 ? 1.0f : 0.7f,
                                             .top_p = r % 4 == 1 ? 0.9f : 1.0f, .top_k = r % 5 == 2 ? 20 : 0,
                                             .seed = g_seed + (uint64_t)r, .step = (uint64_t)r * 3,
                                             .top_logprobs = r % 2 ? 5 : 0};
            mask_of_row[r] = -1;
            if (per_mille[r] < 0) continue;
            /* the kept token: one the row gives a finite logit */
            int keep = (int)urand(V);
            while (!isfinite(logits[(size_t)r * V + keep])) keep = (keep + 1) % V;
            ms_random_mask(masks + (size_t)nm * W, V, per_mille[r], keep, g_seed, 100 + (uint64_t)r);
            mask_of_row[r] = nm++;
        }
        /* the CPU reference of the kernel */
        memcpy(masked, logits, (size_t)ROWS * V * 4);
        for (int r = 0; r < ROWS; r++)
            if (mask_of_row[r] >= 0)
                rp_sampler_apply_mask(masked + (size_t)r * V, V, masks + (size_t)mask_of_row[r] * W);
        float *d_logits = dup_to_dev(logits, (size_t)ROWS * V * 4);
        int32_t *d_rows = dup_to_dev(mask_of_row, sizeof mask_of_row);
        uint32_t *d_masks = dup_to_dev(masks, (size_t)ROWS * W * 4);
        LAUNCH(rp_k_apply_token_mask(d_logits, d_rows, d_masks, ROWS, V, W, 0));
        to_host(got, d_logits, (size_t)ROWS * V * 4);
        for (size_t i = 0; i < (size_t)ROWS * V; i++)
            if (memcmp(&got[i], &masked[i], 4) && !(isnan(got[i]) && isnan(masked[i])))
                fail_msg("vocab %d row %zu id %zu: %g, the reference %g", V, i / V, i % V, got[i], masked[i]);
        /* sampling on the masked rows, as sample_masked runs it */
        rp_sampling_params *d_p = dup_to_dev(params, sizeof params);
        int32_t *d_tok = dalloc(ROWS * 4), *d_kept = dalloc(ROWS * 4);
        float *d_lp = dalloc(ROWS * 4);
        rp_top_logprobs *d_top = dalloc(ROWS * sizeof(rp_top_logprobs));
        void *d_ws = dalloc(rp_sample_workspace_bytes(ROWS, V));
        LAUNCH(rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, NULL, NULL, d_ws, ROWS, V, 0));
        LAUNCH(rp_k_top_logprobs(d_logits, d_p, d_tok, d_lp, d_kept, d_top, NULL, ROWS, V, 0));
        int32_t tok[ROWS];
        float lp[ROWS];
        rp_top_logprobs top[ROWS];
        to_host(tok, d_tok, sizeof tok);
        to_host(lp, d_lp, sizeof lp);
        to_host(top, d_top, sizeof top);
        rp_sampler *smp = rp_sampler_new(V);
        int agree = 0;
        for (int r = 0; r < ROWS; r++) {
            const uint32_t *mask = mask_of_row[r] >= 0 ? masks + (size_t)mask_of_row[r] * W : NULL;
            float want_lp;
            const int want = ms_host_sample(smp, logits + (size_t)r * V, V, mask, &params[r], tmp, &want_lp, NULL);
            if (mask && !ms_allows(mask, tok[r])) fail_msg("vocab %d row %d: token %d is not allowed", V, r, tok[r]);
            if (params[r].temperature == 0.0f && tok[r] != want)
                fail_msg("vocab %d row %d: greedy %d, the host %d", V, r, tok[r], want);
            agree += tok[r] == want;
            for (int j = 0; mask && j < top[r].n; j++)
                if (!ms_allows(mask, top[r].ids[j]) && isfinite(top[r].logprobs[j]))
                    fail_msg("vocab %d row %d: top logprob %g for %d, which the mask forbids", V, r,
                             top[r].logprobs[j], top[r].ids[j]);
        }
        printf("  token masks, vocab %d: masked logits exact, %d/%d rows sampled as the host\n", V, agree, ROWS);
        if (agree < ROWS - 1) fail_msg("vocab %d: only %d of %d rows sampled as the host", V, agree, ROWS);
        /* the skip flag: set, the kernels write nothing; cleared, they sample */
        const int32_t one = 1, zero = 0;
        int32_t *d_skip = dup_to_dev(&one, 4);
        CU(cudaMemset(d_tok, 0xff, ROWS * 4));
        CU(cudaMemset(d_top, 0xff, ROWS * sizeof(rp_top_logprobs)));
        LAUNCH(rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, NULL, d_skip, d_ws, ROWS, V, 0));
        LAUNCH(rp_k_top_logprobs(d_logits, d_p, d_tok, d_lp, d_kept, d_top, d_skip, ROWS, V, 0));
        int32_t skipped[ROWS];
        to_host(skipped, d_tok, sizeof skipped);
        for (int r = 0; r < ROWS; r++) assert_int_equal(skipped[r], -1);
        rp_top_logprobs top_skipped;
        to_host(&top_skipped, d_top, sizeof top_skipped);
        assert_int_equal(top_skipped.n, -1);
        CU(cudaMemcpy(d_skip, &zero, 4, cudaMemcpyHostToDevice));
        LAUNCH(rp_k_sample_kept(d_logits, d_p, d_tok, d_lp, d_kept, NULL, d_skip, d_ws, ROWS, V, 0));
        to_host(skipped, d_tok, sizeof skipped);
        assert_memory_equal(skipped, tok, sizeof tok);
        rp_sampler_free(smp);
        cudaFree(d_skip), cudaFree(d_p), cudaFree(d_tok), cudaFree(d_kept), cudaFree(d_lp), cudaFree(d_top);
        cudaFree(d_ws), cudaFree(d_logits), cudaFree(d_rows), cudaFree(d_masks);
        free(logits), free(masked), free(got), free(tmp), free(masks);
    }
}

/* ---- timing (REPLAY_SAMPLE_BENCH=1) --------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median over 15 timings of 20 back-to-back launches, eager and as one
 * graph; microseconds per launch. */
static void time_sample(const float *d_logits, const rp_sampling_params *d_p, int32_t *d_tok, float *d_lp, void *d_ws,
                        int rows, int vocab, cudaStream_t st, float *eager_us, float *graph_us) {
    enum { REPS = 20, TRIALS = 15 };
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float t[TRIALS];
    for (int w = 0; w < 3; w++) LAUNCH(rp_k_sample(d_logits, d_p, d_tok, d_lp, d_ws, rows, vocab, st));
    for (int k = 0; k < TRIALS; k++) {
        CU(cudaEventRecord(e0, st));
        for (int i = 0; i < REPS; i++)
            if (rp_k_sample(d_logits, d_p, d_tok, d_lp, d_ws, rows, vocab, st)) fail_msg("launch failed");
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&t[k], e0, e1));
    }
    qsort(t, TRIALS, sizeof t[0], cmp_float);
    *eager_us = t[TRIALS / 2] * 1000.0f / REPS;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < REPS; i++)
        if (rp_k_sample(d_logits, d_p, d_tok, d_lp, d_ws, rows, vocab, st)) fail_msg("launch in capture failed");
    CU(cudaStreamEndCapture(st, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    CU(cudaGraphLaunch(ge, st));
    CU(cudaStreamSynchronize(st));
    for (int k = 0; k < TRIALS; k++) {
        CU(cudaEventRecord(e0, st));
        CU(cudaGraphLaunch(ge, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&t[k], e0, e1));
    }
    qsort(t, TRIALS, sizeof t[0], cmp_float);
    *graph_us = t[TRIALS / 2] * 1000.0f / REPS;
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
}

static void bench_sample(void) {
    const int vocab = 151936, max_rows = 256, rows_list[] = {1, 8, 64, 256};
    struct {
        const char *name;
        float t, p, minp;
        int k;
    } cfg[] = {{"greedy (+ logprob)", 0.0f, 1.0f, 0.0f, 0},
               {"T=1", 1.0f, 1.0f, 0.0f, 0},
               {"T=1 top_k=50", 1.0f, 1.0f, 0.0f, 50},
               {"T=1 top_p=0.9", 1.0f, 0.9f, 0.0f, 0},
               {"T=1 min_p=0.05", 1.0f, 1.0f, 0.05f, 0}};
    /* model-like rows: one base row, each row a rotation of it */
    float *base = malloc((size_t)vocab * 4), *all = malloc((size_t)max_rows * vocab * 4);
    fill_model_like(base, vocab);
    for (int r = 0; r < max_rows; r++)
        for (int i = 0; i < vocab; i++) all[(size_t)r * vocab + i] = base[(i + (size_t)r * 9973) % vocab];
    float *d_logits = dup_to_dev(all, (size_t)max_rows * vocab * 4);
    int32_t *d_tok = dalloc(max_rows * 4);
    float *d_lp = dalloc(max_rows * 4);
    void *d_ws = dalloc(rp_sample_workspace_bytes(max_rows, vocab));
    rp_sampling_params *hp = calloc(max_rows, sizeof *hp);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("\nrp_k_sample, vocab %d, us per launch (median; eager / graph)\n", vocab);
    printf("| mode | rows 1 | rows 8 | rows 64 | rows 256 |\n| --- | --- | --- | --- | --- |\n");
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        printf("| %s |", cfg[c].name);
        for (int ri = 0; ri < 4; ri++) {
            const int rows = rows_list[ri];
            for (int r = 0; r < rows; r++)
                hp[r] = (rp_sampling_params){.temperature = cfg[c].t, .top_p = cfg[c].p, .top_k = cfg[c].k, .min_p = cfg[c].minp, .seed = 1234, .step = (uint64_t)r};
            rp_sampling_params *d_p = dup_to_dev(hp, (size_t)rows * sizeof *hp);
            float eager, graph;
            time_sample(d_logits, d_p, d_tok, d_lp, d_ws, rows, vocab, st, &eager, &graph);
            printf(" %.1f / %.1f |", eager, graph);
            fflush(stdout);
            cudaFree(d_p);
        }
        printf("\n");
    }
    CU(cudaStreamDestroy(st));
    free(base), free(all), free(hp);
    cudaFree(d_logits), cudaFree(d_tok), cudaFree(d_lp), cudaFree(d_ws);
}

static void test_sample_bench(void **state) {
    (void)state;
    NEED_GPU();
    if (!getenv("REPLAY_SAMPLE_BENCH")) {
        printf("  (REPLAY_SAMPLE_BENCH=1 prints rp_k_sample timings)\n");
        return;
    }
    bench_sample();
}

/* Every run draws the same inputs unless REPLAY_TEST_SEED says otherwise. */
#define TEST_SEED 20261127ULL

int main(void) {
    const char *env = getenv("REPLAY_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : TEST_SEED;
    env = getenv("REPLAY_TEST_SMALL");
    g_small = !env ? 0 : atoi(env) >= 2 ? 2 : 1;
    printf("test_cuda_sample: seed %llu%s (REPLAY_TEST_SEED=N runs another)\n", (unsigned long long)g_seed,
           g_small ? ", small shapes" : "");
    if (getenv("REPLAY_TEST_SKIP")) cmocka_set_skip_filter(getenv("REPLAY_TEST_SKIP"));
    if (getenv("REPLAY_TEST_ONLY")) cmocka_set_test_filter(getenv("REPLAY_TEST_ONLY"));
    if (getenv("REPLAY_SAMPLE_BENCH")) cmocka_set_test_filter("test_sample_bench");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_greedy),         cmocka_unit_test(test_sample_vs_host),
        cmocka_unit_test(test_sample_batch),          cmocka_unit_test(test_sample_ties_and_edges),
        cmocka_unit_test(test_sample_distribution),   cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_apply_token_mask),      cmocka_unit_test(test_sample_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no CUDA toolkit at build time */

static void test_no_cuda(void **state) {
    (void)state;
    printf("built without CUDA: skipping CUDA sampler tests\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_cuda)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
