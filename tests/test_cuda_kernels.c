/* Tests for the CUDA kernels (the .cu files in src/backend/cuda/kernels/) against CPU
 * references written here in float64 (or the host sampler).
 *
 * Inputs are random from a fixed seed (TEST_SEED, printed; REPLAY_TEST_SEED
 * runs another), poisons every output with 0xFF bytes (bf16/fp32 NaN) before
 * the launch, and fails on any NaN, so an element the kernel forgot to write
 * is caught. bf16 outputs must match within relative L2 1e-2; argmax and
 * greedy tokens exactly; dummy weights bit for bit; sampling token by token
 * against the host sampler and statistically against the softmax.
 *
 * REPLAY_TEST_SMALL=1 shrinks the largest shapes (for compute-sanitizer);
 * REPLAY_TEST_SKIP=pattern skips tests by name, REPLAY_TEST_ONLY=pattern
 * runs only those (cmocka wildcards: REPLAY_TEST_ONLY='*fp8*' runs the fp8
 * GEMV's and the fp8 KV cache's tests).
 *
 * The fp8 GEMV (e4m3 weights, a scale per row: --quantization fp8) is
 * checked against float64 over the e4m3 values, with x rounded as the
 * kernel promises (f16, saturated to +-65504, up to 8 tokens; f16_sat),
 * including inputs past f16's range.
 *
 * The fp8 KV cache (rp_kv_cache, RP_KV_FORMAT_E4M3): the attention tests
 * run again over e4m3 pages with per-layer scales that are not 1
 * (g_kv_fp8), against the same float64 reference over the dequantized
 * cache (e4m3 value x scale), and the store kernel's bytes are checked
 * against the host's rounding (rp_f32_to_f8e4m3) of its float64 reference.
 * Block-scaled fp8 weights (128 x 128 blocks: test_fp8_blocks_*): the
 * GEMV, the quantization kernels and cuBLASLt's block-scaled product (or,
 * where it has no algorithm, the dequantization that replaces it) against
 * float64 references over fresh random e4m3 bytes and scales.
 * Without a GPU every test is skipped. Label "gpu" in CTest. */
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

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "model/quant.h"
#include "util/dtype.h"
#include "util/rng.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t g_seed, g_ctr;
static int g_small;
/* the attention tests' caches: bf16 (0), or e4m3 with these scales (1) */
static int g_kv_fp8;
#define FP8_K_SCALE 0.0131f
#define FP8_V_SCALE 0.00297f

/* uniform in [-1, 1) */
static float frand(void) { return rp_rand_uniform(g_seed, 1, g_ctr++) * 2.0f - 1.0f; }
static uint32_t urand(uint32_t n) { return (uint32_t)(rp_rand_u64(g_seed, 2, g_ctr++) % n); }


static uint16_t *rand_bf16(size_t n, float scale) {
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = rp_f32_to_bf16(frand() * scale);
    return h;
}
static float *rand_f32(size_t n, float scale) {
    float *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = frand() * scale;
    return h;
}
static float bf(uint16_t h) { return rp_bf16_to_f32(h); }

/* e4m3 bytes of values spread over the whole range (+-448) */
static uint8_t *rand_e4m3(size_t n) {
    uint8_t *h = malloc(n);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = rp_f32_to_f8e4m3(frand() * 448.0f);
    return h;
}
/* n row scales around scale (0.5x to 1.5x) */
static float *rand_scales(size_t n, float scale) {
    float *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = scale * (1.0f + 0.5f * frand());
    return h;
}
/* v as an f16 value: nearest even (subnormals below 2^-14 in steps of
 * 2^-24), saturated to +-65504; how an activation enters the f16 mma of
 * the fp8 GEMV (kernels/fp8.cuh). */
static double f16_sat(double v) {
    if (isnan(v)) return v;
    const double a = fabs(v);
    double r;
    if (a < 0x1p-14) {
        r = nearbyint(a * 0x1p24) * 0x1p-24;
    } else {
        int e;
        frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): 11 significant bits */
        r = ldexp(nearbyint(ldexp(a, 11 - e)), e - 11);
    }
    if (r > 65504.0) r = 65504.0;
    return v < 0 ? -r : r;
}

/* Relative L2 error of got (bf16) against ref (double); NaN fails. */
static double rel_l2_bf16(const uint16_t *got, const double *ref, size_t n, const char *what) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = bf(got[i]);
        if (isnan(g)) fail_msg("%s: element %zu is NaN (not written?)", what, i);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static double rel_l2_f32(const float *got, const double *ref, size_t n, const char *what) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) fail_msg("%s: element %zu is NaN (not written?)", what, i);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static void expect_close(double err, double tol, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("  %-58s rel_l2 %.2e\n", buf, err);
    if (!(err < tol)) fail_msg("%s: relative L2 %.3e >= %.1e", buf, err, tol);
}

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
            printf("no CUDA GPU: skipping CUDA kernel tests\n");     \
            skip();                                                  \
        }                                                            \
    } while (0)

/* ---- block-scaled fp8 weights (128 x 128) -------------------------------- */

/* A random [N][K] e4m3 matrix (no NaN codes) and its compact grid
 * [ceil(N/128)][ceil(K/128)] of scales in [2^-9, 2^-5), and the grid as the
 * device takes it (rows ld = rp_fp8_grid_ld(K) apart, the padding `pad`). */
static void rand_blocks(int N, int K, uint8_t **w, float **grid, float **padded, float pad) {
    const int gr = (N + 127) / 128, gc = (K + 127) / 128, ld = rp_fp8_grid_ld(K);
    *w = malloc((size_t)N * K);
    *grid = malloc((size_t)gr * gc * 4);
    *padded = malloc((size_t)gr * ld * 4);
    assert_true(*w && *grid && *padded);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint8_t b = (uint8_t)urand(256);
        if ((b & 0x7f) == 0x7f) b ^= 1; /* NaN -> 448 */
        (*w)[i] = b;
    }
    for (int i = 0; i < gr; i++)
        for (int j = 0; j < ld; j++) {
            const float v = ldexpf(1.0f + 0.5f * (frand() + 1.0f), (int)urand(4) - 9);
            if (j < gc) (*grid)[i * gc + j] = v;
            (*padded)[i * ld + j] = j < gc ? v : pad;
        }
}

/* y[t][n] = sum_k x[t][k] * e4m3(w[n][k]) * grid[n/128][k/128] in double */
static double *blocks_ref(const uint16_t *x, const uint8_t *w, const float *grid, int T, int N, int K) {
    const int gc = (K + 127) / 128;
    double *ref = malloc((size_t)T * N * 8);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)bf(x[(size_t)t * K + k]) * rp_f8e4m3_to_f32(w[(size_t)n * K + k]) *
                       grid[(n / 128) * gc + k / 128];
            ref[(size_t)t * N + n] = acc;
        }
    return ref;
}

/* The block-scaled GEMV, bf16 input, bf16 and fp32 outputs, T = 1..8; the
 * grid's padding is NaN (never read) and the output's tail past T x N too
 * (never written). */
static void check_gemv_blocks(int N, int K) {
    uint8_t *w;
    float *grid, *padded;
    rand_blocks(N, K, &w, &grid, &padded, NAN);
    uint16_t *x = rand_bf16((size_t)RP_GEMV_MAX_T * K, 1.0f);
    const size_t gbytes = (size_t)((N + 127) / 128) * rp_fp8_grid_ld(K) * 4;
    uint8_t *d_w = dup_to_dev(w, (size_t)N * K);
    float *d_grid = dup_to_dev(padded, gbytes);
    uint16_t *d_x = dup_to_dev(x, (size_t)RP_GEMV_MAX_T * K * 2);
    double *ref = blocks_ref(x, w, grid, RP_GEMV_MAX_T, N, K);
    const size_t guard = 64;
    float *y = malloc(((size_t)RP_GEMV_MAX_T * N + guard) * 4);
    for (int T = 1; T <= RP_GEMV_MAX_T; T++)
        for (int f32 = 0; f32 < 2; f32++) {
            const size_t n = (size_t)T * N, eb = f32 ? 4 : 2;
            void *d_y = dalloc((n + guard) * eb);
            rp_gemv_in in = {.mode = RP_GEMV_IN_BF16, .x = d_x};
            rp_gemv_out out = {.mode = f32 ? RP_GEMV_OUT_F32 : RP_GEMV_OUT_BF16, .y = d_y};
            LAUNCH(rp_k_gemv_fused_fp8_blocks(d_w, d_grid, in, out, T, N, K, 0));
            to_host(y, d_y, (n + guard) * eb);
            char what[96];
            snprintf(what, sizeof what, "gemv fp8 blocks T=%d N=%d K=%d %s", T, N, K, f32 ? "f32" : "bf16");
            const double e = f32 ? rel_l2_f32(y, ref, n, what) : rel_l2_bf16((const uint16_t *)y, ref, n, what);
            /* fp32 sums of exact products: a wrong block's scale is off by a factor up to 16 */
            if (T == 1 || T == RP_GEMV_MAX_T) expect_close(e, f32 ? 1e-4 : 1e-2, "%s", what);
            else if (!(e < (f32 ? 1e-4 : 1e-2))) fail_msg("%s: relative L2 %.3e", what, e);
            const uint8_t *tail = (const uint8_t *)y + n * eb;
            for (size_t i = 0; i < guard * eb; i++)
                if (tail[i] != 0xff) fail_msg("%s: wrote past its output (byte %zu)", what, i);
            cudaFree(d_y);
        }
    free(w), free(grid), free(padded), free(x), free(ref), free(y);
    cudaFree(d_w), cudaFree(d_grid), cudaFree(d_x);
}

static void test_fp8_blocks_gemv(void **state) {
    (void)state;
    NEED_GPU();
    check_gemv_blocks(300, 320);   /* N and K end inside a block (and a 16-row group) */
    check_gemv_blocks(33, 208);
    check_gemv_blocks(640, 1040);
    check_gemv_blocks(1024, 1024); /* qwen3-0.6b's o, hidden */
    if (!g_small) check_gemv_blocks(3072, 1024);
    /* refused, not miscomputed: more tokens than the GEMV takes, K % 16, both or no scales */
    rp_gemv_in in = {.mode = RP_GEMV_IN_BF16};
    rp_gemv_out out = {.mode = RP_GEMV_OUT_F32};
    assert_int_equal(rp_k_gemv_fused_fp8_blocks(NULL, NULL, in, out, RP_GEMV_MAX_T + 1, 16, 16, 0),
                     (int)cudaErrorInvalidValue);
    assert_int_equal(rp_k_gemv_fused_fp8_blocks(NULL, NULL, in, out, 1, 16, 24, 0), (int)cudaErrorInvalidValue);
}

/* Dummy weights quantized per block on the GPU: the host's bytes and
 * scales (model/quant.c), the padding untouched. */
static void test_fp8_blocks_quant(void **state) {
    (void)state;
    NEED_GPU();
    const int R = 300, C = 320, gr = 3, gc = 3, ld = rp_fp8_grid_ld(C);
    uint16_t *w = rand_bf16((size_t)R * C, 0.05f);
    for (int i = 256; i < R; i++)
        for (int j = 256; j < C; j++) w[(size_t)i * C + j] = 0; /* a block of zeros: scale 1 */
    uint8_t *q = malloc((size_t)R * C), *gq = malloc((size_t)R * C);
    uint16_t *deq = malloc((size_t)R * C * 2);
    float grid[9], *ggrid = malloc((size_t)gr * ld * 4);
    rp_quant_fp8_blocks(w, R, C, q, grid, deq);
    uint16_t *d_w = dup_to_dev(w, (size_t)R * C * 2);
    uint8_t *d_q = dalloc((size_t)R * C);
    float *d_grid = dalloc((size_t)gr * ld * 4);
    LAUNCH(rp_k_quant_fp8_blocks(d_w, R, C, d_q, d_grid, ld, 0));
    to_host(gq, d_q, (size_t)R * C);
    to_host(ggrid, d_grid, (size_t)gr * ld * 4);
    assert_memory_equal(q, gq, (size_t)R * C);
    for (int i = 0; i < gr; i++)
        for (int j = 0; j < ld; j++) {
            uint32_t bits;
            memcpy(&bits, &ggrid[i * ld + j], 4);
            if (j < gc ? ggrid[i * ld + j] != grid[i * gc + j] : bits != 0xffffffffu)
                fail_msg("grid (%d, %d): %g, want %g", i, j, ggrid[i * ld + j], j < gc ? grid[i * gc + j] : NAN);
        }
    /* and back: the dequantization the cuBLASLt fallback runs is the host's */
    uint16_t *d_deq = dalloc((size_t)R * C * 2), *gdeq = malloc((size_t)R * C * 2);
    LAUNCH(rp_k_dequant_fp8_blocks(d_q, d_grid, ld, R, C, d_deq, 0));
    to_host(gdeq, d_deq, (size_t)R * C * 2);
    assert_memory_equal(deq, gdeq, (size_t)R * C * 2);
    printf("  fp8 blocks: %dx%d quantized and dequantized as the host does\n", R, C);
    free(w), free(q), free(gq), free(deq), free(ggrid), free(gdeq);
    cudaFree(d_w), cudaFree(d_q), cudaFree(d_grid), cudaFree(d_deq);
}

/* Activations per token (W8A8's x): the host's bytes and scales
 * (model/quant.c's rp_quant_fp8_rows, as the weights), from the
 * registers kernel (K % 8 == 0, up to 32,768) and the row-by-row one it
 * falls back to (K = 1004, 40,000), zero rows included. */
static void test_fp8_act_rows(void **state) {
    (void)state;
    NEED_GPU();
    const int Ts[] = {1, 5, 32, 33}, Ks[] = {4096, 14336, 1000, 1004, 24, 40000};
    for (int ti = 0; ti < 4; ti++)
        for (int ki = 0; ki < 6; ki++) {
            const int T = Ts[ti], K = Ks[ki];
            uint16_t *x = rand_bf16((size_t)T * K, 3.0f);
            if (T > 1) memset(x + K, 0, (size_t)K * 2); /* a zero row: scale 1 */
            uint8_t *q = malloc((size_t)T * K), *gq = malloc((size_t)T * K);
            float *sc = malloc((size_t)T * 4), *gsc = malloc((size_t)T * 4);
            uint16_t *deq = malloc((size_t)T * K * 2);
            rp_quant_fp8_rows(x, T, K, q, sc, deq);
            uint16_t *d_x = dup_to_dev(x, (size_t)T * K * 2);
            uint8_t *d_q = dalloc((size_t)T * K);
            float *d_sc = dalloc((size_t)T * 4);
            LAUNCH(rp_k_quant_fp8_act_rows(d_x, T, K, d_q, d_sc, 0));
            to_host(gq, d_q, (size_t)T * K);
            to_host(gsc, d_sc, (size_t)T * 4);
            if (memcmp(q, gq, (size_t)T * K) || memcmp(sc, gsc, (size_t)T * 4))
                fail_msg("fp8 activations T=%d K=%d: not the host's bytes and scales", T, K);
            free(x), free(q), free(gq), free(sc), free(gsc), free(deq);
            cudaFree(d_x), cudaFree(d_q), cudaFree(d_sc);
        }
    printf("  fp8 activations per token: the host's bytes and scales at T = 1..33, K = 24..40000\n");
}

/* Activations per token and 128 k (the host's arithmetic: max|x| / 448,
 * then the nearest code; the rows padding T to RP_GEMM_FP8_BLOCKS_T_ALIGN
 * zeros with scale 1), then cuBLASLt's block-scaled product of the padded
 * count against float64 over those quantized activations (the pad rows'
 * outputs zero); where cuBLASLt has no algorithm the test says so (the
 * backend then dequantizes: checked above). */
static void check_gemm_blocks(rp_gemm *g, int T, int N, int K, int out_f32) {
    uint8_t *w;
    float *grid, *padded;
    rand_blocks(N, K, &w, &grid, &padded, 0.0f);
    uint16_t *x = rand_bf16((size_t)T * K, 1.0f);
    const int Tp = rp_gemm_fp8_blocks_pad(T), groups = (K + 127) / 128, ldt = rp_fp8_act_ld(Tp);
    uint16_t *d_x = dup_to_dev(x, (size_t)T * K * 2);
    uint8_t *d_xq = dalloc((size_t)Tp * K), *xq = malloc((size_t)Tp * K);
    float *d_sx = dalloc((size_t)groups * ldt * 4), *sx = malloc((size_t)groups * ldt * 4);
    LAUNCH(rp_k_quant_fp8_act_groups(d_x, T, Tp, K, d_xq, d_sx, 0));
    to_host(xq, d_xq, (size_t)Tp * K);
    to_host(sx, d_sx, (size_t)groups * ldt * 4);
    for (int t = T; t < Tp; t++) {
        for (int gi = 0; gi < groups; gi++)
            if (sx[(size_t)gi * ldt + t] != 1.0f) fail_msg("pad row %d's scale %d: %g", t, gi, sx[(size_t)gi * ldt + t]);
        for (int k = 0; k < K; k++)
            if (xq[(size_t)t * K + k]) fail_msg("pad row %d byte %d: %02x", t, k, xq[(size_t)t * K + k]);
    }
    double *xd = malloc((size_t)T * K * 8); /* x as quantized: the reference's input */
    for (int t = 0; t < T; t++)
        for (int gi = 0; gi < groups; gi++) {
            float amax = 0;
            for (int k = gi * 128; k < K && k < (gi + 1) * 128; k++) amax = fmaxf(amax, fabsf(bf(x[(size_t)t * K + k])));
            const float s = amax > 0 ? amax / 448.0f : 1.0f;
            if (sx[(size_t)gi * ldt + t] != s) fail_msg("act scale t=%d g=%d: %g, want %g", t, gi, sx[(size_t)gi * ldt + t], s);
            for (int k = gi * 128; k < K && k < (gi + 1) * 128; k++) {
                const uint8_t want = rp_f32_to_f8e4m3(bf(x[(size_t)t * K + k]) / s);
                if (xq[(size_t)t * K + k] != want) fail_msg("act byte t=%d k=%d: %02x, want %02x", t, k, xq[(size_t)t * K + k], want);
                xd[(size_t)t * K + k] = (double)rp_f8e4m3_to_f32(want) * s;
            }
        }
    rp_err err;
    if (!rp_gemm_fp8_blocks_supported(g, Tp, N, K, out_f32, &err)) {
        printf("  gemm fp8 blocks T=%d (padded %d) N=%d K=%d: %s (the backend dequantizes)\n", T, Tp, N, K, err.msg);
    } else {
        const size_t n = (size_t)T * N, eb = out_f32 ? 4 : 2, np = (size_t)Tp * N;
        uint8_t *d_w = dup_to_dev(w, (size_t)N * K);
        float *d_grid = dup_to_dev(padded, (size_t)((N + 127) / 128) * rp_fp8_grid_ld(K) * 4);
        void *d_y = dalloc(np * eb), *y = malloc(np * eb);
        if (rp_gemm_run_fp8_blocks(g, d_w, d_grid, d_xq, d_sx, d_y, Tp, N, K, out_f32, 0, &err)) fail_msg("%s", err.msg);
        CU(cudaDeviceSynchronize());
        to_host(y, d_y, np * eb);
        for (size_t i = n * eb; i < np * eb; i++)
            if (((uint8_t *)y)[i]) fail_msg("pad rows' output not zero at byte %zu", i - n * eb);
        double *ref = malloc(n * 8);
        const int gc = (K + 127) / 128;
        for (int t = 0; t < T; t++)
            for (int nn = 0; nn < N; nn++) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += xd[(size_t)t * K + k] * rp_f8e4m3_to_f32(w[(size_t)nn * K + k]) * grid[(nn / 128) * gc + k / 128];
                ref[(size_t)t * N + nn] = acc;
            }
        char what[96];
        snprintf(what, sizeof what, "gemm fp8 blocks T=%d (%d) N=%d K=%d %s", T, Tp, N, K, out_f32 ? "f32" : "bf16");
        /* FP8 tensor cores sum a block's products at reduced precision; a
         * scale read from the wrong place is off by a factor up to 16 */
        expect_close(out_f32 ? rel_l2_f32(y, ref, n, what) : rel_l2_bf16(y, ref, n, what), out_f32 ? 2e-3 : 1e-2, "%s",
                     what);
        free(ref), free(y);
        cudaFree(d_w), cudaFree(d_grid), cudaFree(d_y);
    }
    free(w), free(grid), free(padded), free(x), free(xq), free(sx), free(xd);
    cudaFree(d_x), cudaFree(d_xq), cudaFree(d_sx);
}

static void test_fp8_blocks_gemm(void **state) {
    (void)state;
    NEED_GPU();
    rp_gemm g;
    rp_err err;
    if (rp_gemm_init(&g, 32u << 20, &err)) fail_msg("%s", err.msg);
    check_gemm_blocks(&g, 37, 384, 1024, 1); /* tokens not a multiple of 4: the scales' padded stride */
    check_gemm_blocks(&g, 64, 640, 1024, 0);
    check_gemm_blocks(&g, 24, 256, 320, 1);  /* K ends inside a block */
    check_gemm_blocks(&g, 9, 1024, 3072, 1); /* the fewest tokens it takes (past the GEMV's 8) */
    rp_gemm_destroy(&g);
}

/* cuBLASLt's FP8 product with a scale per weight row and per token applied
 * inside (outer vectors): activations quantized per token on the GPU (the
 * bytes and scales read back are the reference's input), against float64.
 * Where cuBLASLt has no such algorithm the test says so (the backend then
 * takes the raw sums and rp_k_scale_outer, test_fp8_vs_cpu). */
static void check_gemm_outer(rp_gemm *g, int T, int N, int K, int out_f32) {
    uint8_t *w = malloc((size_t)N * K), *xq = malloc((size_t)T * K);
    float *sw = malloc((size_t)N * 4), *sx = malloc((size_t)T * 4);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint8_t b = (uint8_t)urand(256);
        if ((b & 0x7f) == 0x7f) b ^= 1; /* NaN -> 448 */
        w[i] = b;
    }
    for (int n = 0; n < N; n++) sw[n] = ldexpf(1.0f + 0.5f * (frand() + 1.0f), (int)urand(4) - 9);
    uint16_t *x = rand_bf16((size_t)T * K, 1.0f);
    uint16_t *d_x = dup_to_dev(x, (size_t)T * K * 2);
    uint8_t *d_xq = dalloc((size_t)T * K), *d_w = dup_to_dev(w, (size_t)N * K);
    float *d_sx = dalloc((size_t)T * 4), *d_sw = dup_to_dev(sw, (size_t)N * 4);
    LAUNCH(rp_k_quant_fp8_rows(d_x, T, K, d_xq, d_sx, 0));
    to_host(xq, d_xq, (size_t)T * K);
    to_host(sx, d_sx, (size_t)T * 4);
    rp_err err;
    if (!rp_gemm_fp8_outer_supported(g, T, N, K, out_f32, &err)) {
        printf("  gemm fp8 outer T=%d N=%d K=%d: %s (the backend scales cuBLASLt's raw sums)\n", T, N, K, err.msg);
    } else {
        const size_t n = (size_t)T * N, eb = out_f32 ? 4 : 2;
        void *d_y = dalloc(n * eb), *y = malloc(n * eb);
        if (rp_gemm_run_fp8_outer(g, d_w, d_sw, d_xq, d_sx, d_y, T, N, K, out_f32, 0, &err)) fail_msg("%s", err.msg);
        CU(cudaDeviceSynchronize());
        to_host(y, d_y, n * eb);
        double *ref = malloc(n * 8);
        for (int t = 0; t < T; t++)
            for (int nn = 0; nn < N; nn++) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += (double)rp_f8e4m3_to_f32(xq[(size_t)t * K + k]) * rp_f8e4m3_to_f32(w[(size_t)nn * K + k]);
                ref[(size_t)t * N + nn] = acc * sx[t] * sw[nn];
            }
        char what[96];
        snprintf(what, sizeof what, "gemm fp8 outer T=%d N=%d K=%d %s", T, N, K, out_f32 ? "f32" : "bf16");
        /* a scale taken per column instead of per row (or none) is off by
         * factors up to 16 */
        expect_close(out_f32 ? rel_l2_f32(y, ref, n, what) : rel_l2_bf16(y, ref, n, what), out_f32 ? 2e-3 : 1e-2, "%s",
                     what);
        free(ref), free(y);
        cudaFree(d_y);
    }
    free(w), free(xq), free(sw), free(sx), free(x);
    cudaFree(d_x), cudaFree(d_xq), cudaFree(d_w), cudaFree(d_sx), cudaFree(d_sw);
}

static void test_fp8_outer_gemm(void **state) {
    (void)state;
    NEED_GPU();
    rp_gemm g;
    rp_err err;
    if (rp_gemm_init(&g, 32u << 20, &err)) fail_msg("%s", err.msg);
    check_gemm_outer(&g, 37, 384, 1024, 1); /* an odd token count */
    check_gemm_outer(&g, 64, 640, 1024, 0);
    check_gemm_outer(&g, 17, 1024, 3072, 1); /* the fewest tokens it takes (past the fp8 GEMV's 16) */
    rp_gemm_destroy(&g);
}

/* ---- embedding, norms, elementwise -------------------------------------- */

static void test_embed(void **state) {
    (void)state;
    NEED_GPU();
    const int Hs[] = {1024, 100, 4096};
    for (size_t hi = 0; hi < sizeof Hs / sizeof Hs[0]; hi++) {
        const int H = Hs[hi], V = 97, T = 5;
        uint16_t *emb = rand_bf16((size_t)V * H, 1.0f);
        /* odd positions hold token references into the previous step's
         * sampled tokens (prev); tok is what each position must read */
        int32_t tok[5], meta[5], prev[3];
        for (int r = 0; r < 3; r++) prev[r] = (int32_t)urand(V);
        for (int t = 0; t < T; t++) {
            meta[t] = t % 2 ? -(t % 3) - 1 : (int32_t)urand(V);
            tok[t] = t % 2 ? prev[t % 3] : meta[t];
        }
        uint16_t *d_emb = dup_to_dev(emb, (size_t)V * H * 2);
        int32_t *d_tok = dup_to_dev(meta, sizeof meta), *d_prev = dup_to_dev(prev, sizeof prev);
        float *d_res = dalloc((size_t)T * H * 4);
        const int parts = 7;
        float *d_ss = dalloc((size_t)parts * RP_GEMV_MAX_T * 4), ss[7 * RP_GEMV_MAX_T];
        LAUNCH(rp_k_embed(d_emb, d_tok, d_prev, d_res, hi == 0 ? d_ss : NULL, parts, T, H, 0));
        float *res = malloc((size_t)T * H * 4);
        to_host(res, d_res, (size_t)T * H * 4);
        to_host(ss, d_ss, sizeof ss);
        for (int t = 0; t < T; t++) {
            double want = 0;
            for (int i = 0; i < H; i++) {
                if (memcmp(&res[t * H + i], &(float){bf(emb[(size_t)tok[t] * H + i])}, 4))
                    fail_msg("embed H=%d t=%d i=%d", H, t, i);
                want += (double)res[t * H + i] * res[t * H + i];
            }
            if (hi != 0) continue;
            /* part 0 holds the row's sum of squares, the other parts 0 */
            if (!(fabs(ss[t] - want) <= 1e-5 * want)) fail_msg("embed ss t=%d: %g != %g", t, ss[t], want);
            for (int q = 1; q < parts; q++)
                if (ss[q * RP_GEMV_MAX_T + t] != 0.0f) fail_msg("embed ss part %d t=%d not 0", q, t);
        }
        printf("  embed H=%-5d exact, token references resolved%s\n", H, hi == 0 ? ", sum of squares within 1e-5" : "");
        free(emb), free(res);
        cudaFree(d_emb), cudaFree(d_tok), cudaFree(d_prev), cudaFree(d_res), cudaFree(d_ss);
    }
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    NEED_GPU();
    const int Hs[] = {4096, 1000, 30, 5120};
    for (size_t hi = 0; hi < sizeof Hs / sizeof Hs[0]; hi++)
        for (int with_delta = 0; with_delta < 2; with_delta++) {
            const int H = Hs[hi], T = 3;
            const float eps = 1e-6f;
            float *res = rand_f32((size_t)T * H, 3.0f), *delta = rand_f32((size_t)T * H, 1.0f);
            uint16_t *w = rand_bf16(H, 1.0f);
            float *d_res = dup_to_dev(res, (size_t)T * H * 4), *d_delta = dup_to_dev(delta, (size_t)T * H * 4);
            uint16_t *d_w = dup_to_dev(w, (size_t)H * 2);
            uint16_t *d_out = dalloc((size_t)T * H * 2);
            LAUNCH(rp_k_add_rmsnorm(d_res, with_delta ? d_delta : NULL, d_w, d_out, T, H, eps, 0));
            float *res2 = malloc((size_t)T * H * 4);
            uint16_t *out = malloc((size_t)T * H * 2);
            double *ref_r = malloc((size_t)T * H * 8), *ref_o = malloc((size_t)T * H * 8);
            to_host(res2, d_res, (size_t)T * H * 4);
            to_host(out, d_out, (size_t)T * H * 2);
            for (int t = 0; t < T; t++) {
                double ss = 0;
                for (int i = 0; i < H; i++) {
                    double x = res[t * H + i] + (with_delta ? delta[t * H + i] : 0.0);
                    ref_r[t * H + i] = x;
                    ss += x * x;
                }
                double inv = 1.0 / sqrt(ss / H + eps);
                for (int i = 0; i < H; i++) ref_o[t * H + i] = ref_r[t * H + i] * inv * bf(w[i]);
            }
            expect_close(rel_l2_f32(res2, ref_r, (size_t)T * H, "residual"), 1e-6, "add_rmsnorm residual H=%d delta=%d",
                         H, with_delta);
            expect_close(rel_l2_bf16(out, ref_o, (size_t)T * H, "norm out"), 1e-2, "add_rmsnorm out H=%d delta=%d", H,
                         with_delta);
            free(res), free(delta), free(w), free(res2), free(out), free(ref_r), free(ref_o);
            cudaFree(d_res), cudaFree(d_delta), cudaFree(d_w), cudaFree(d_out);
        }
}

/* The W8A8 folds (rp_k_add_rmsnorm_fp8): a raw FP8 delta scaled and added,
 * the output quantized per token, in every combination, against the
 * kernels they replace run one after another (rp_k_scale_outer,
 * rp_k_add_rmsnorm, rp_k_quant_fp8_act_rows): the same bits in residual,
 * out, the e4m3 bytes and the scales; sx written over dsx (the chain's
 * one scale buffer). */
static void test_add_rmsnorm_fp8(void **state) {
    (void)state;
    NEED_GPU();
    const int Hs[] = {4096, 1000, 30};
    for (size_t hi = 0; hi < sizeof Hs / sizeof Hs[0]; hi++)
        for (int mode = 1; mode < 4; mode++) {
            const int H = Hs[hi], T = 5, ds = mode & 1, q = mode & 2;
            const float eps = 1e-6f;
            float *res = rand_f32((size_t)T * H, 3.0f), *raw = rand_f32((size_t)T * H, 50.0f);
            float *sx = rand_scales(T, 1e-2f), *sw = rand_scales(H, 1e-2f);
            uint16_t *w = rand_bf16(H, 1.0f);
            float *d_res[2], *d_raw[2], *d_sx[2];
            uint16_t *d_out[2];
            uint8_t *d_q[2];
            uint16_t *d_w = dup_to_dev(w, (size_t)H * 2);
            float *d_sw = dup_to_dev(sw, (size_t)H * 4);
            for (int k = 0; k < 2; k++) {
                d_res[k] = dup_to_dev(res, (size_t)T * H * 4);
                d_raw[k] = dup_to_dev(raw, (size_t)T * H * 4);
                d_sx[k] = dup_to_dev(sx, (size_t)T * 4);
                d_out[k] = dalloc((size_t)T * H * 2);
                d_q[k] = dalloc((size_t)T * H);
            }
            /* k = 0: the separate kernels; k = 1: the fold */
            if (ds) LAUNCH(rp_k_scale_outer(d_raw[0], d_sx[0], d_sw, d_raw[0], 1, T, H, 0));
            LAUNCH(rp_k_add_rmsnorm(d_res[0], d_raw[0], d_w, d_out[0], T, H, eps, 0));
            if (q) LAUNCH(rp_k_quant_fp8_act_rows(d_out[0], T, H, d_q[0], d_sx[0], 0));
            LAUNCH(rp_k_add_rmsnorm_fp8(d_res[1], d_raw[1], ds ? d_sx[1] : NULL, ds ? d_sw : NULL, d_w, d_out[1],
                                        q ? d_q[1] : NULL, q ? d_sx[1] : NULL, T, H, eps, 0));
            const size_t sizes[4] = {(size_t)T * H * 4, (size_t)T * H * 2, (size_t)T * H, (size_t)T * 4};
            for (int b = 0; b < 4; b++) {
                if (b >= 2 && !q) continue;
                void *h[2];
                for (int k = 0; k < 2; k++) {
                    h[k] = malloc(sizes[b]);
                    const void *src = b == 0 ? (void *)d_res[k] : b == 1 ? (void *)d_out[k] : b == 2 ? (void *)d_q[k]
                                                                                                      : (void *)d_sx[k];
                    to_host(h[k], src, sizes[b]);
                }
                static const char *what[4] = {"residual", "out", "e4m3 bytes", "scales"};
                if (memcmp(h[0], h[1], sizes[b]))
                    fail_msg("add_rmsnorm_fp8 H=%d%s%s: %s differ from the separate kernels'", H,
                             ds ? " scaled delta" : "", q ? " quantized" : "", what[b]);
                free(h[0]), free(h[1]);
            }
            free(res), free(raw), free(sx), free(sw), free(w);
            cudaFree(d_w), cudaFree(d_sw);
            for (int k = 0; k < 2; k++)
                cudaFree(d_res[k]), cudaFree(d_raw[k]), cudaFree(d_sx[k]), cudaFree(d_out[k]), cudaFree(d_q[k]);
        }
    printf("  add_rmsnorm_fp8: the separate kernels' bits (H = 4096, 1000, 30)\n");
}

static void test_silu_mul_gather(void **state) {
    (void)state;
    NEED_GPU();
    const int Fs[] = {4096, 1001};
    for (size_t fi = 0; fi < 2; fi++) {
        const int F = Fs[fi], T = 3;
        float *gu = rand_f32((size_t)T * 2 * F, 4.0f), *d_gu = dup_to_dev(gu, (size_t)T * 2 * F * 4);
        uint16_t *d_out = dalloc((size_t)T * F * 2);
        LAUNCH(rp_k_silu_mul(d_gu, d_out, T, F, 0));
        uint16_t *out = malloc((size_t)T * F * 2);
        double *ref = malloc((size_t)T * F * 8);
        to_host(out, d_out, (size_t)T * F * 2);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < F; i++) {
                double g = gu[(size_t)t * 2 * F + i], u = gu[(size_t)t * 2 * F + F + i];
                ref[t * F + i] = g / (1.0 + exp(-g)) * u;
            }
        expect_close(rel_l2_bf16(out, ref, (size_t)T * F, "silu"), 1e-2, "silu_mul F=%d", F);
        free(gu), free(out), free(ref);
        cudaFree(d_gu), cudaFree(d_out);
    }
    const int Hs[] = {1024, 77};
    for (size_t hi = 0; hi < 2; hi++) {
        const int H = Hs[hi], rows_in = 9, n = 4;
        int32_t rows[4] = {8, 0, 3, 3};
        uint16_t *in = rand_bf16((size_t)rows_in * H, 1.0f);
        uint16_t *d_in = dup_to_dev(in, (size_t)rows_in * H * 2), *d_out = dalloc((size_t)n * H * 2);
        int32_t *d_rows = dup_to_dev(rows, sizeof rows);
        LAUNCH(rp_k_gather_rows(d_in, d_rows, d_out, n, H, 0));
        uint16_t *out = malloc((size_t)n * H * 2);
        to_host(out, d_out, (size_t)n * H * 2);
        for (int i = 0; i < n; i++)
            assert_memory_equal(out + (size_t)i * H, in + (size_t)rows[i] * H, (size_t)H * 2);
        printf("  gather_rows H=%-4d exact\n", H);
        free(in), free(out);
        cudaFree(d_in), cudaFree(d_out), cudaFree(d_rows);
    }
}

/* Tensor parallelism (kernels/tp.cu): the embedding of a vocabulary shard
 * (the shard's rows, zeros for the others' tokens, token references
 * resolved) and the gathered logit shards laid out whole, padding dropped;
 * both are copies, so exact. */
static void test_tp_kernels(void **state) {
    (void)state;
    NEED_GPU();
    const int V = 203, H = 72, T = 6, ranks = 4, vpr = 64; /* the last rank holds 11 real rows, 53 padding */
    uint16_t *emb = rand_bf16((size_t)V * H, 1.0f);
    int32_t meta[6] = {0, 63, 64, -1, 202, -2}, prev[2] = {130, 7}, tok[6];
    for (int t = 0; t < T; t++) tok[t] = meta[t] < 0 ? prev[-meta[t] - 1] : meta[t];
    int32_t *d_tok = dup_to_dev(meta, sizeof meta), *d_prev = dup_to_dev(prev, sizeof prev);
    float *d_res = dalloc((size_t)T * H * 4), *res = malloc((size_t)T * H * 4);
    for (int r = 0; r < ranks; r++) {
        const int64_t start = (int64_t)r * vpr, count = start + vpr <= V ? vpr : V - start;
        uint16_t *d_emb = dup_to_dev(emb + start * H, (size_t)count * H * 2);
        LAUNCH(rp_k_embed_shard(d_emb, d_tok, d_prev, d_res, start, count, T, H, 0));
        to_host(res, d_res, (size_t)T * H * 4);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H; i++) {
                const int mine = tok[t] >= start && tok[t] < start + count;
                const float want = mine ? rp_bf16_to_f32(emb[(size_t)tok[t] * H + i]) : 0.0f;
                if (res[(size_t)t * H + i] != want)
                    fail_msg("embed_shard rank %d token %d [%d]: %g != %g", r, t, i, res[(size_t)t * H + i], want);
            }
        cudaFree(d_emb);
    }
    printf("  embed_shard (4 ranks, references, padding) exact\n");
    const int rows = 3;
    float *gathered = rand_f32((size_t)ranks * rows * vpr, 3.0f), *logits = malloc((size_t)rows * V * 4);
    float *d_g = dup_to_dev(gathered, (size_t)ranks * rows * vpr * 4), *d_l = dalloc((size_t)rows * V * 4);
    LAUNCH(rp_k_tp_unshard_logits(d_g, d_l, rows, ranks, vpr, V, 0));
    to_host(logits, d_l, (size_t)rows * V * 4);
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < V; v++) {
            const float want = gathered[((size_t)(v / vpr) * rows + i) * vpr + v % vpr];
            if (logits[(size_t)i * V + v] != want) fail_msg("unshard row %d token %d", i, v);
        }
    printf("  tp_unshard_logits exact\n");
    free(emb), free(res), free(gathered), free(logits);
    cudaFree(d_tok), cudaFree(d_prev), cudaFree(d_res), cudaFree(d_g), cudaFree(d_l);
}

/* A rank's slice of a dummy tensor made on the GPU: rows with padding
 * (a vocabulary shard), columns (o_proj, down_proj), each element the
 * host generator's value of its place in the whole tensor. */
static void test_fill_dummy_slice(void **state) {
    (void)state;
    NEED_GPU();
    const uint64_t seed = g_seed + 5, stream = 100003u * 9 + 2;
    const double std = 0.02;
    const int64_t R = 37, C = 51; /* the whole tensor: odd, so pairs straddle rows */
    struct {
        int64_t rows, cols, row0, col0, valid;
    } cases[] = {{16, C, 30, 0, 7}, {R, 17, 0, 34, R}, {R, 20, 0, 11, R}, {5, C, 3, 0, 5}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int64_t n = cases[k].rows * cases[k].cols;
        uint16_t *d = dalloc((size_t)n * 2), *h = malloc((size_t)n * 2);
        LAUNCH(rp_k_fill_dummy_slice(d, cases[k].rows, cases[k].cols, C, cases[k].row0, cases[k].col0, cases[k].valid,
                                     seed, stream, std, 0, 0));
        to_host(h, d, (size_t)n * 2);
        for (int64_t r = 0; r < cases[k].rows; r++)
            for (int64_t c = 0; c < cases[k].cols; c++) {
                const int64_t e = (cases[k].row0 + r) * C + cases[k].col0 + c;
                const uint16_t want = r < cases[k].valid ? rp_dummy_bf16(rp_rand_normal(seed, stream, (uint64_t)e), std) : 0;
                if (h[r * cases[k].cols + c] != want)
                    fail_msg("fill_dummy_slice case %zu [%lld][%lld]: %04x != %04x", k, (long long)r, (long long)c,
                             h[r * cases[k].cols + c], want);
            }
        free(h);
        cudaFree(d);
    }
    printf("  fill_dummy_slice: row slices with padding and column slices bit-identical to the host generator\n");
}

static void test_fill_dummy(void **state) {
    (void)state;
    NEED_GPU();
    const int64_t n = 300007; /* odd: the last pair has one element */
    uint16_t *d = dalloc((size_t)n * 2), *h = malloc((size_t)n * 2);
    for (int is_norm = 0; is_norm < 2; is_norm++) {
        const uint64_t seed = g_seed + 11, stream = 100003u * 5 + 7;
        const double std = is_norm ? 0.0 : 0.02;
        LAUNCH(rp_k_fill_dummy(d, n, seed, stream, std, is_norm, 0));
        to_host(h, d, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            uint16_t want = is_norm ? 0x3f80 : rp_dummy_bf16(rp_rand_normal(seed, stream, (uint64_t)i), std);
            if (h[i] != want) fail_msg("fill_dummy is_norm=%d i=%lld: %04x != %04x", is_norm, (long long)i, h[i], want);
        }
        printf("  fill_dummy is_norm=%d bit-identical to the host generator (%lld values)\n", is_norm, (long long)n);
    }
    free(h);
    cudaFree(d);
}

/* ---- GEMV --------------------------------------------------------------- */

static void check_gemv(int T, int N, int K) {
    uint16_t *W = rand_bf16((size_t)N * K, 1.0f), *x = rand_bf16((size_t)T * K, 1.0f);
    uint16_t *d_W = dup_to_dev(W, (size_t)N * K * 2), *d_x = dup_to_dev(x, (size_t)T * K * 2);
    uint16_t *d_y = dalloc((size_t)T * N * 2);
    float *d_yf = dalloc((size_t)T * N * 4);
    LAUNCH(rp_k_gemv(d_W, d_x, d_y, T, N, K, 0));
    LAUNCH(rp_k_gemv_f32out(d_W, d_x, d_yf, T, N, K, 0));
    uint16_t *y = malloc((size_t)T * N * 2);
    float *yf = malloc((size_t)T * N * 4);
    double *ref = malloc((size_t)T * N * 8);
    float *xf = malloc((size_t)T * K * 4), *wr = malloc((size_t)K * 4);
    to_host(y, d_y, (size_t)T * N * 2);
    to_host(yf, d_yf, (size_t)T * N * 4);
    for (size_t i = 0; i < (size_t)T * K; i++) xf[i] = bf(x[i]);
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) wr[k] = bf(W[(size_t)n * K + k]);
        for (int t = 0; t < T; t++) {
            double acc = 0;
            const float *xt = xf + (size_t)t * K;
            for (int k = 0; k < K; k++) acc += (double)wr[k] * xt[k];
            ref[(size_t)t * N + n] = acc;
        }
    }
    expect_close(rel_l2_bf16(y, ref, (size_t)T * N, "gemv"), 1e-2, "gemv T=%d N=%d K=%d bf16", T, N, K);
    expect_close(rel_l2_f32(yf, ref, (size_t)T * N, "gemv f32"), 1e-4, "gemv T=%d N=%d K=%d f32", T, N, K);
    /* The sums are taken in a fixed order: a second run gives the same bits
     * (what graph == eager relies on). */
    float *yf2 = malloc((size_t)T * N * 4);
    cudaMemset(d_yf, 0xff, (size_t)T * N * 4);
    LAUNCH(rp_k_gemv_f32out(d_W, d_x, d_yf, T, N, K, 0));
    to_host(yf2, d_yf, (size_t)T * N * 4);
    if (memcmp(yf, yf2, (size_t)T * N * 4) != 0) fail_msg("gemv T=%d N=%d K=%d: two runs differ", T, N, K);
    free(yf2);
    free(W), free(x), free(y), free(yf), free(ref), free(xf), free(wr);
    cudaFree(d_W), cudaFree(d_x), cudaFree(d_y), cudaFree(d_yf);
}

/* The fp8 GEMV (e4m3 weights, a scale per row) against float64 over the
 * e4m3 values: up to RP_GEMV_MAX_T tokens x enters as f16 (from bf16,
 * saturated to +-65504), 9-16 tokens (two 8-token groups) as bf16. big: a
 * few x elements past f16's range (7e4, 3e5), which must be clipped to
 * 65504, neither infinite nor kept. The products are exact and the sums
 * fp32, so the f32 output is held to 1e-4 as the bf16 GEMV's. */
static void check_gemv_fp8(int T, int N, int K, int big) {
    uint8_t *W = rand_e4m3((size_t)N * K);
    float *sc = rand_scales(N, 1e-3f);
    uint16_t *x = rand_bf16((size_t)T * K, 1.0f);
    if (big)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 4; j++) x[(size_t)t * K + urand((uint32_t)K)] = rp_f32_to_bf16((j & 1 ? -1.0f : 1.0f) * (j < 2 ? 7e4f : 3e5f));
    uint8_t *d_W = dup_to_dev(W, (size_t)N * K);
    float *d_sc = dup_to_dev(sc, (size_t)N * 4);
    uint16_t *d_x = dup_to_dev(x, (size_t)T * K * 2), *d_y = dalloc((size_t)T * N * 2);
    float *d_yf = dalloc((size_t)T * N * 4);
    LAUNCH(rp_k_gemv_fp8(d_W, d_sc, d_x, d_y, 0, T, N, K, 0));
    LAUNCH(rp_k_gemv_fp8(d_W, d_sc, d_x, d_yf, 1, T, N, K, 0));
    uint16_t *y = malloc((size_t)T * N * 2);
    float *yf = malloc((size_t)T * N * 4);
    double *ref = malloc((size_t)T * N * 8), *xq = malloc((size_t)T * K * 8), *wr = malloc((size_t)K * 8);
    to_host(y, d_y, (size_t)T * N * 2);
    to_host(yf, d_yf, (size_t)T * N * 4);
    for (size_t i = 0; i < (size_t)T * K; i++) xq[i] = T <= RP_GEMV_MAX_T ? f16_sat(bf(x[i])) : bf(x[i]);
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) wr[k] = rp_f8e4m3_to_f32(W[(size_t)n * K + k]);
        for (int t = 0; t < T; t++) {
            double acc = 0;
            const double *xt = xq + (size_t)t * K;
            for (int k = 0; k < K; k++) acc += wr[k] * xt[k];
            ref[(size_t)t * N + n] = acc * sc[n];
        }
    }
    expect_close(rel_l2_bf16(y, ref, (size_t)T * N, "gemv fp8"), 1e-2, "gemv fp8 T=%d N=%d K=%d%s bf16", T, N, K,
                 big ? " (x past 65504)" : "");
    expect_close(rel_l2_f32(yf, ref, (size_t)T * N, "gemv fp8 f32"), 1e-4, "gemv fp8 T=%d N=%d K=%d%s f32", T, N, K,
                 big ? " (x past 65504)" : "");
    for (size_t i = 0; i < (size_t)T * N; i++)
        if (!isfinite(yf[i])) fail_msg("gemv fp8 T=%d N=%d K=%d: output %zu is %g", T, N, K, i, (double)yf[i]);
    free(W), free(sc), free(x), free(y), free(yf), free(ref), free(xq), free(wr);
    cudaFree(d_W), cudaFree(d_sc), cudaFree(d_x), cudaFree(d_y), cudaFree(d_yf);
}

static void test_gemv_fp8(void **state) {
    (void)state;
    NEED_GPU();
    check_gemv_fp8(1, 4096, 4096, 0);
    check_gemv_fp8(8, 1000, 1040, 0);
    check_gemv_fp8(3, 17, 64, 0);
    check_gemv_fp8(2, 1024, 2048, 1);  /* saturation */
    check_gemv_fp8(8, 777, 4096, 1);
    check_gemv_fp8(12, 1000, 1024, 0); /* two 8-token groups */
    check_gemv_fp8(16, 4096, 1024, 0);
    if (!g_small) check_gemv_fp8(4, 4096, 14336, 0);
}

static void test_gemv(void **state) {
    (void)state;
    NEED_GPU();
    check_gemv(1, 4096, 4096);
    check_gemv(8, 1000, 1032);
    check_gemv(3, 17, 64);
    check_gemv(5, 4100, 8);
    check_gemv(2, 33, 4104);
    check_gemv(7, 1024, 3072);
    check_gemv(4, 6144, 1024);
    check_gemv(1, 1024, 2048); /* qwen3-0.6b o */
    check_gemv(1, 2560, 9728); /* qwen3-4b down: 160 tiles (the one-wave warp rule) */
    if (!g_small) check_gemv(8, 2048, 14336);
    /* unsupported shapes are refused, not miscomputed */
    assert_int_equal(rp_k_gemv(NULL, NULL, NULL, 9, 16, 16, 0), (int)cudaErrorInvalidValue);
    assert_int_equal(rp_k_gemv(NULL, NULL, NULL, 1, 16, 12, 0), (int)cudaErrorInvalidValue);
}

/* The fused decode GEMVs, chained the way the backend uses them: a
 * RESIDUAL-output GEMV (BF16 or SILU input) updates a residual and leaves
 * partial sums of squares; a RMSNORM-input GEMV (with a row list, as for
 * the lm_head) normalises from them. References in double from the same
 * bf16 roundings the kernels promise (the SwiGLU input and the product
 * added to the residual are fp32: a bf16 rounding there, ~1e-3, fails the
 * 1e-4). */
/* fp8: the same chain on e4m3 weights with row scales
 * (rp_k_gemv_fused_fp8), whose x enters as f16 (saturated; f16_sat in the
 * references): the normed product then within 5e-4, which bf16 x (~1e-3)
 * would not meet. big (fp8): a few inputs past f16's range. */
static void check_gemv_fused_w(int T, int H, int F, int N, int silu, int fp8, int big) {
    const float eps = 1e-6f;
    const int K1 = silu ? F : H; /* first GEMV: [H][K1], input [T][K1] or gate_up [T][2F] */
    const size_t xin_n = (size_t)T * (silu ? 2 * F : K1);
    uint16_t *W1 = rand_bf16((size_t)H * K1, 0.05f), *xin = rand_bf16(xin_n, 1.0f);
    float *gu = rand_f32(xin_n, 3.0f);
    if (big)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 4; j++) {
                const int k = (int)urand((uint32_t)K1);
                /* silu(400) * 400 = 1.6e5; bf16 7e4 and 3e5 */
                if (silu) gu[(size_t)t * 2 * F + k] = 400.0f, gu[(size_t)t * 2 * F + F + k] = j & 1 ? -400.0f : 400.0f;
                else xin[(size_t)t * K1 + k] = rp_f32_to_bf16((j & 1 ? -1.0f : 1.0f) * (j < 2 ? 7e4f : 3e5f));
            }
    float *d_gu = dup_to_dev(gu, xin_n * 4);
    uint16_t *W2 = rand_bf16((size_t)N * H, 1.0f), *nw = rand_bf16(H, 1.0f);
    /* fp8: e4m3 bytes whose values x scale have about the bf16 weights' spread */
    uint8_t *W1q = fp8 ? rand_e4m3((size_t)H * K1) : NULL, *W2q = fp8 ? rand_e4m3((size_t)N * H) : NULL;
    float *sc1 = fp8 ? rand_scales(H, 0.05f / 256.0f) : NULL, *sc2 = fp8 ? rand_scales(N, 1.0f / 256.0f) : NULL;
    float *res0 = rand_f32((size_t)T * H, 2.0f);
    const int parts = rp_gemv_ss_parts(H);
    void *d_W1 = fp8 ? dup_to_dev(W1q, (size_t)H * K1) : dup_to_dev(W1, (size_t)H * K1 * 2);
    void *d_W2 = fp8 ? dup_to_dev(W2q, (size_t)N * H) : dup_to_dev(W2, (size_t)N * H * 2);
    float *d_s1 = fp8 ? dup_to_dev(sc1, (size_t)H * 4) : NULL, *d_s2 = fp8 ? dup_to_dev(sc2, (size_t)N * 4) : NULL;
    uint16_t *d_xin = dup_to_dev(xin, xin_n * 2);
    uint16_t *d_nw = dup_to_dev(nw, (size_t)H * 2);
    float *d_res = dup_to_dev(res0, (size_t)T * H * 4);
    float *d_ss = dalloc((size_t)parts * RP_GEMV_MAX_T * 4), *d_y = dalloc((size_t)T * N * 4);
    int32_t rows[RP_GEMV_MAX_T];
    for (int t = 0; t < T; t++) rows[t] = T - 1 - t; /* reversed: the indirection is used */
    int32_t *d_rows = dup_to_dev(rows, sizeof rows);
    rp_gemv_in in1 = {.mode = silu ? RP_GEMV_IN_SILU : RP_GEMV_IN_BF16, .x = d_xin, .gate_up = d_gu};
    rp_gemv_out out1 = {.mode = RP_GEMV_OUT_RESIDUAL, .residual = d_res, .ss_parts = d_ss};
    if (fp8) LAUNCH(rp_k_gemv_fused_fp8(d_W1, d_s1, in1, out1, T, H, K1, 0));
    else LAUNCH(rp_k_gemv_fused(d_W1, in1, out1, T, H, K1, 0));
    rp_gemv_in in2 = {.mode = RP_GEMV_IN_RMSNORM, .residual = d_res, .ss_parts = d_ss, .num_parts = parts,
                      .norm_w = d_nw, .rows = d_rows, .eps = eps};
    rp_gemv_out out2 = {.mode = RP_GEMV_OUT_F32, .y = d_y};
    if (fp8) LAUNCH(rp_k_gemv_fused_fp8(d_W2, d_s2, in2, out2, T, N, H, 0));
    else LAUNCH(rp_k_gemv_fused(d_W2, in2, out2, T, N, H, 0));
    float *res = malloc((size_t)T * H * 4), *ss = malloc((size_t)parts * RP_GEMV_MAX_T * 4), *y = malloc((size_t)T * N * 4);
    to_host(res, d_res, (size_t)T * H * 4);
    to_host(ss, d_ss, (size_t)parts * RP_GEMV_MAX_T * 4);
    to_host(y, d_y, (size_t)T * N * 4);
    /* reference: x1 (bf16-rounded SwiGLU when silu; fp8: f16), residual + x1 W1^T */
    double *ref_r = malloc((size_t)T * H * 8), *ref_y = malloc((size_t)T * N * 8);
    double *x1 = malloc((size_t)K1 * 8), *xn = malloc((size_t)H * 8);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K1; k++) {
            if (silu) {
                double g = gu[(size_t)t * 2 * F + k], u = gu[(size_t)t * 2 * F + F + k];
                const float h = (float)(g / (1.0 + exp(-g)) * u);
                x1[k] = fp8 ? f16_sat(h) : bf(rp_f32_to_bf16(h));
            } else {
                x1[k] = fp8 ? f16_sat(bf(xin[(size_t)t * K1 + k])) : bf(xin[(size_t)t * K1 + k]);
            }
        }
        for (int n = 0; n < H; n++) {
            double acc = 0;
            if (fp8) {
                for (int k = 0; k < K1; k++) acc += (double)rp_f8e4m3_to_f32(W1q[(size_t)n * K1 + k]) * x1[k];
                acc *= sc1[n];
            } else {
                for (int k = 0; k < K1; k++) acc += (double)bf(W1[(size_t)n * K1 + k]) * x1[k];
            }
            ref_r[(size_t)t * H + n] = res0[(size_t)t * H + n] + acc;
        }
    }
    expect_close(rel_l2_f32(res, ref_r, (size_t)T * H, "residual"), 1e-4, "gemv_fused%s T=%d %s -> residual H=%d%s",
                 fp8 ? " fp8" : "", T, silu ? "silu" : "bf16", H, big ? " (x past 65504)" : "");
    for (int t = 0; t < T; t++) { /* the parts add up to the new residual's sum of squares */
        double got = 0, want = 0;
        for (int q = 0; q < parts; q++) got += ss[q * RP_GEMV_MAX_T + t];
        for (int n = 0; n < H; n++) want += (double)res[(size_t)t * H + n] * res[(size_t)t * H + n];
        if (!(fabs(got - want) <= 1e-5 * want)) fail_msg("ss parts t=%d: %g != %g", t, got, want);
    }
    for (int q = 0; q < parts; q++)
        for (int t = T; t < RP_GEMV_MAX_T; t++)
            if (ss[q * RP_GEMV_MAX_T + t] != 0.0f) fail_msg("ss part %d, unused token %d not 0", q, t);
    /* second GEMV from the kernel's own residual: rmsnorm of row rows[t] */
    for (int t = 0; t < T; t++) {
        const float *r = res + (size_t)rows[t] * H;
        double s2 = 0;
        for (int k = 0; k < H; k++) s2 += (double)r[k] * r[k];
        const double inv = 1.0 / sqrt(s2 / H + eps);
        for (int k = 0; k < H; k++) xn[k] = (float)(r[k] * inv * bf(nw[k]));
        for (int n = 0; n < N; n++) {
            double acc = 0;
            if (fp8) {
                for (int k = 0; k < H; k++) acc += (double)rp_f8e4m3_to_f32(W2q[(size_t)n * H + k]) * xn[k];
                acc *= sc2[n];
            } else {
                for (int k = 0; k < H; k++) acc += (double)bf(W2[(size_t)n * H + k]) * xn[k];
            }
            ref_y[(size_t)t * N + n] = acc;
        }
    }
    expect_close(rel_l2_f32(y, ref_y, (size_t)T * N, "normed gemv"), fp8 ? 5e-4 : 1e-2,
                 "gemv_fused%s T=%d rmsnorm(rows) -> f32 N=%d", fp8 ? " fp8" : "", T, N);
    free(W1), free(xin), free(gu), free(W2), free(nw), free(res0), free(res), free(ss), free(y), free(ref_r),
        free(ref_y), free(x1), free(xn), free(W1q), free(W2q), free(sc1), free(sc2);
    cudaFree(d_W1), cudaFree(d_xin), cudaFree(d_gu), cudaFree(d_W2), cudaFree(d_nw), cudaFree(d_res), cudaFree(d_ss), cudaFree(d_y),
        cudaFree(d_rows), cudaFree(d_s1), cudaFree(d_s2);
}
static void check_gemv_fused(int T, int H, int F, int N, int silu) { check_gemv_fused_w(T, H, F, N, silu, 0, 0); }

static void test_gemv_fused(void **state) {
    (void)state;
    NEED_GPU();
    check_gemv_fused(1, 1024, 3072, 4096, 1); /* qwen3-0.6b down (+silu) then qkv */
    check_gemv_fused(8, 1024, 3072, 1000, 0);
    check_gemv_fused(3, 2056, 520, 777, 1);   /* rows not a multiple of 16 */
    check_gemv_fused(5, 4096, 4096, 6144, 0); /* llama3-8b o then qkv */
    check_gemv_fused(1, 2560, 9728, 6144, 1); /* qwen3-4b down (+silu, split K) then qkv */
    if (!g_small) check_gemv_fused(2, 4096, 14336, 2048, 1);
    /* missing pointers are refused */
    rp_gemv_in in = {.mode = RP_GEMV_IN_RMSNORM};
    rp_gemv_out out = {.mode = RP_GEMV_OUT_BF16};
    assert_int_equal(rp_k_gemv_fused(NULL, in, out, 1, 16, 16, 0), (int)cudaErrorInvalidValue);
    /* a staged input larger than a block's shared memory is refused */
    rp_gemv_in big = {.mode = RP_GEMV_IN_SILU};
    assert_false(rp_gemv_stage_fits(8, 14336));
    assert_int_equal(rp_k_gemv_fused(NULL, big, out, 8, 16, 14336, 0), (int)cudaErrorInvalidValue);
}

/* The fused chain on e4m3 weights (x as f16 in every input mode). */
static void test_gemv_fused_fp8(void **state) {
    (void)state;
    NEED_GPU();
    check_gemv_fused_w(1, 1024, 3072, 4096, 1, 1, 0); /* qwen3-0.6b down (+silu) then qkv */
    check_gemv_fused_w(8, 1024, 3072, 1000, 0, 1, 0);
    check_gemv_fused_w(3, 2064, 528, 777, 1, 1, 0);   /* rows not a multiple of 16 */
    check_gemv_fused_w(5, 4096, 4096, 6144, 0, 1, 0); /* llama3-8b o then qkv */
    check_gemv_fused_w(4, 1024, 3072, 2048, 1, 1, 1); /* SwiGLU past 65504 */
    check_gemv_fused_w(2, 1024, 2048, 2048, 0, 1, 1); /* bf16 x past 65504 */
    if (!g_small) check_gemv_fused_w(2, 4096, 14336, 2048, 1, 1, 0);
}

/* ---- Q/K norm, RoPE, KV store ------------------------------------------- */

/* use_bias: Qwen2's q/k/v biases (one vector laid out as a qkv row);
 * rope_scale: yarn's factor on cos and sin (1 otherwise). */
static void check_rope(int nh, int nkv, int hd, int use_norm, int use_bias, float rope_scale) {
    const int fp8 = g_kv_fp8;
    const int T = 7, heads = nh + 2 * nkv, row = heads * hd, num_slots = 64;
    const float eps = 1e-6f;
    uint16_t *qkv = rand_bf16((size_t)T * row, 2.0f), *bias = rand_bf16((size_t)row, 3.0f);
    uint16_t *qn = rand_bf16(hd, 1.0f), *kn = rand_bf16(hd, 1.0f);
    for (int i = 0; i < hd; i++) qn[i] = rp_f32_to_bf16(1.0f + 0.2f * bf(qn[i])), kn[i] = rp_f32_to_bf16(1.0f + 0.2f * bf(kn[i]));
    float *inv_freq = malloc((size_t)hd / 2 * 4);
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = 1.0f / powf(1000000.0f, (float)(2 * i) / (float)hd);
    int32_t pos[7], slot[7];
    for (int t = 0; t < T; t++) {
        pos[t] = t == 0 ? 0 : (int32_t)urand(t == 1 ? 8 : 100000);
        slot[t] = (int32_t)(t * 9 % num_slots); /* distinct */
    }
    uint16_t *d_qkv = dup_to_dev(qkv, (size_t)T * row * 2), *d_qn = dup_to_dev(qn, (size_t)hd * 2),
             *d_kn = dup_to_dev(kn, (size_t)hd * 2), *d_bias = dup_to_dev(bias, (size_t)row * 2);
    float *d_if = dup_to_dev(inv_freq, (size_t)hd / 2 * 4);
    int32_t *d_pos = dup_to_dev(pos, sizeof pos), *d_slot = dup_to_dev(slot, sizeof slot);
    const size_t cache_n = (size_t)num_slots * nkv * hd, eb = fp8 ? 1 : 2;
    uint16_t *d_kc = dalloc(cache_n * eb), *d_vc = dalloc(cache_n * eb);
    rp_kv_cache kv = rp_kv_cache_bf16(d_kc, d_vc);
    /* scales that put k (|k| up to ~6) and v (up to ~5) well inside e4m3's range */
    if (fp8) kv.format = RP_KV_FORMAT_E4M3, kv.k_scale = 0.0371f, kv.v_scale = 0.0213f;
    LAUNCH(rp_k_qk_norm_rope_store(d_qkv, use_bias ? d_bias : NULL, use_norm ? d_qn : NULL, use_norm ? d_kn : NULL,
                                   d_if, rope_scale, d_pos, d_slot, kv, T, nh, nkv, hd, eps, 0));
    uint16_t *got = malloc((size_t)T * row * 2), *kc = malloc(cache_n * 2), *vc = malloc(cache_n * 2);
    uint8_t *kc8 = malloc(cache_n), *vc8 = malloc(cache_n);
    to_host(got, d_qkv, (size_t)T * row * 2);
    to_host(fp8 ? (void *)kc8 : (void *)kc, d_kc, cache_n * eb);
    to_host(fp8 ? (void *)vc8 : (void *)vc, d_vc, cache_n * eb);
    double *ref = malloc((size_t)T * row * 8);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++) {
            const uint16_t *x = qkv + (size_t)t * row + (size_t)h * hd;
            double *r = ref + (size_t)t * row + (size_t)h * hd;
            for (int i = 0; i < hd; i++) r[i] = bf(x[i]) + (use_bias ? bf(bias[(size_t)h * hd + i]) : 0.0);
            if (h >= nh + nkv) continue; /* v: only its bias */
            if (use_norm) {
                const uint16_t *w = h < nh ? qn : kn;
                double ss = 0;
                for (int i = 0; i < hd; i++) ss += r[i] * r[i];
                double inv = 1.0 / sqrt(ss / hd + eps);
                for (int i = 0; i < hd; i++) r[i] = r[i] * inv * bf(w[i]);
            }
            for (int i = 0; i < hd / 2; i++) {
                float ang = (float)pos[t] * inv_freq[i]; /* fp32 angle, like transformers */
                double c = cos((double)ang) * rope_scale, s = sin((double)ang) * rope_scale, a = r[i], b = r[i + hd / 2];
                r[i] = a * c - b * s;
                r[i + hd / 2] = b * c + a * s;
            }
        }
    expect_close(rel_l2_bf16(got, ref, (size_t)T * row, "rope qkv"), 1e-2,
                 "qk_norm_rope nh=%d nkv=%d hd=%d norm=%d bias=%d rope_scale=%g", nh, nkv, hd, use_norm, use_bias,
                 (double)rope_scale);
    /* cache rows: k and v of each token at its slot */
    double *refk = malloc((size_t)T * nkv * hd * 8), *refv = malloc((size_t)T * nkv * hd * 8);
    uint16_t *gk = malloc((size_t)T * nkv * hd * 2), *gv = malloc((size_t)T * nkv * hd * 2);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < nkv * hd; i++) {
            refk[t * nkv * hd + i] = ref[(size_t)t * row + (size_t)nh * hd + i];
            refv[t * nkv * hd + i] = ref[(size_t)t * row + (size_t)(nh + nkv) * hd + i];
            gk[t * nkv * hd + i] = fp8 ? 0 : kc[(size_t)slot[t] * nkv * hd + i];
            gv[t * nkv * hd + i] = fp8 ? 0 : vc[(size_t)slot[t] * nkv * hd + i];
        }
    if (fp8) {
        /* e4m3 of ref / scale, as the host rounds it: the kernel's fp32
         * value may differ from the float64 reference in its last bits, so
         * a byte may be its neighbour where the quotient sits on a rounding
         * boundary; the dequantized rows must match within e4m3's step */
        int exact = 0, n = T * nkv * hd;
        double num_k = 0, den_k = 0, num_v = 0, den_v = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < nkv * hd; i++) {
                const size_t at = (size_t)slot[t] * nkv * hd + i;
                const double rk = refk[t * nkv * hd + i], rv = refv[t * nkv * hd + i];
                const uint8_t wk = rp_f32_to_f8e4m3((float)(rk / kv.k_scale)), wv = rp_f32_to_f8e4m3((float)(rv / kv.v_scale));
                exact += (kc8[at] == wk) + (vc8[at] == wv);
                const int dk = abs((int)(kc8[at] & 0x7f) - (int)(wk & 0x7f)), dv = abs((int)(vc8[at] & 0x7f) - (int)(wv & 0x7f));
                if ((dk > 1 || dv > 1) && fabs(rk) > 1e-3 && fabs(rv) > 1e-3)
                    fail_msg("fp8 cache token %d element %d: k byte 0x%02x (want 0x%02x), v byte 0x%02x (want 0x%02x)", t, i,
                             kc8[at], wk, vc8[at], wv);
                const double gk8 = rp_f8e4m3_to_f32(kc8[at]) * (double)kv.k_scale;
                const double gv8 = rp_f8e4m3_to_f32(vc8[at]) * (double)kv.v_scale;
                num_k += (gk8 - rk) * (gk8 - rk), den_k += rk * rk;
                num_v += (gv8 - rv) * (gv8 - rv), den_v += rv * rv;
            }
        printf("  fp8 cache: %d of %d bytes as the host rounds them\n", exact, 2 * n);
        assert_true(exact > 2 * n * 95 / 100);
        /* e4m3 keeps 3 mantissa bits: a relative step of 1/16 at most, ~2.5% rms */
        expect_close(sqrt(num_k / den_k), 4e-2, "  k cache (e4m3 x k_scale)");
        expect_close(sqrt(num_v / den_v), 4e-2, "  v cache (e4m3 x v_scale)");
    } else {
        expect_close(rel_l2_bf16(gk, refk, (size_t)T * nkv * hd, "k cache"), 1e-2, "  k cache");
        /* a copy, or the sum with the bias rounded to bf16 once */
        expect_close(rel_l2_bf16(gv, refv, (size_t)T * nkv * hd, "v cache"), use_bias ? 1e-2 : 1e-6, "  v cache");
    }
    free(bias), free(qkv), free(qn), free(kn), free(inv_freq), free(got), free(kc), free(vc), free(ref), free(refk), free(refv),
        free(gk), free(gv), free(kc8), free(vc8);
    cudaFree(d_qkv), cudaFree(d_bias), cudaFree(d_qn), cudaFree(d_kn), cudaFree(d_if), cudaFree(d_pos), cudaFree(d_slot), cudaFree(d_kc),
        cudaFree(d_vc);
}

static void test_qk_norm_rope_store(void **state) {
    (void)state;
    NEED_GPU();
    check_rope(16, 8, 128, 1, 0, 1.0f);
    check_rope(32, 8, 64, 0, 0, 1.0f);
    check_rope(12, 2, 128, 0, 0, 1.0f);
    check_rope(28, 4, 128, 0, 1, 1.0f);                 /* qwen2.5-7b: biases */
    check_rope(16, 8, 128, 1, 1, 1.1386294f);           /* biases, norm and yarn's scale (factor 4) together */
    check_rope(32, 8, 64, 0, 0, 0.1f * logf(8.0f) + 1); /* yarn alone */
}

/* The same into an e4m3 cache (--kv-cache-dtype fp8). */
static void test_qk_norm_rope_store_fp8(void **state) {
    (void)state;
    NEED_GPU();
    g_kv_fp8 = 1;
    check_rope(16, 8, 128, 1, 0, 1.0f);
    check_rope(32, 8, 64, 0, 0, 1.0f);
    check_rope(28, 4, 128, 0, 1, 1.0f);
    check_rope(16, 8, 128, 1, 1, 1.1386294f);
    g_kv_fp8 = 0;
}

/* ---- attention ---------------------------------------------------------- */

/* A paged KV cache with random contents and per-sequence page tables whose
 * pages are a random permutation (so contiguity is never assumed). With
 * g_kv_fp8 the device holds e4m3 bytes of random values / scale, and the
 * host arrays their e4m3 values (exact in bf16), which the reference
 * multiplies by the scales. */
typedef struct paged_kv {
    int nkv, hd, ps, num_pages, num_seqs, stride;
    int fp8;
    float k_scale, v_scale;  /* 1 for bf16 */
    uint16_t *k, *v;         /* host [slots][nkv][hd] */
    int32_t *table;          /* [num_seqs][stride] */
    int32_t *page_row;       /* [num_seqs] */
    uint16_t *d_k, *d_v;
    int32_t *d_table, *d_page_row, *d_kv_len, *d_seq_start;
} paged_kv;

static void paged_kv_make(paged_kv *p, int nkv, int hd, int ps, const int *kv_len, const int *q_len, int num_seqs) {
    memset(p, 0, sizeof *p);
    p->nkv = nkv, p->hd = hd, p->ps = ps, p->num_seqs = num_seqs;
    int total_pages = 0, max_pages = 0;
    for (int s = 0; s < num_seqs; s++) {
        int np = (kv_len[s] + ps - 1) / ps;
        total_pages += np;
        if (np > max_pages) max_pages = np;
    }
    p->num_pages = total_pages + 3;
    p->stride = max_pages + 1;
    const size_t n = (size_t)p->num_pages * ps * nkv * hd;
    p->k = rand_bf16(n, 1.0f);
    p->v = rand_bf16(n, 1.0f);
    p->fp8 = g_kv_fp8;
    p->k_scale = p->fp8 ? FP8_K_SCALE : 1.0f;
    p->v_scale = p->fp8 ? FP8_V_SCALE : 1.0f;
    uint8_t *k8 = NULL, *v8 = NULL;
    if (p->fp8) {
        k8 = malloc(n), v8 = malloc(n);
        for (size_t i = 0; i < n; i++) {
            k8[i] = rp_f32_to_f8e4m3(bf(p->k[i]) / p->k_scale);
            v8[i] = rp_f32_to_f8e4m3(bf(p->v[i]) / p->v_scale);
            p->k[i] = rp_f32_to_bf16(rp_f8e4m3_to_f32(k8[i]));
            p->v[i] = rp_f32_to_bf16(rp_f8e4m3_to_f32(v8[i]));
        }
    }
    int32_t *perm = malloc((size_t)p->num_pages * 4);
    for (int i = 0; i < p->num_pages; i++) perm[i] = i;
    for (int i = p->num_pages - 1; i > 0; i--) {
        int j = (int)urand((uint32_t)i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    p->table = malloc((size_t)num_seqs * p->stride * 4);
    p->page_row = malloc((size_t)num_seqs * 4);
    for (size_t i = 0; i < (size_t)num_seqs * p->stride; i++) p->table[i] = -1;
    int next = 0;
    for (int s = 0; s < num_seqs; s++) {
        int r = num_seqs - 1 - s; /* rows in reverse: the indirection is exercised */
        p->page_row[s] = r;
        for (int j = 0; j < (kv_len[s] + ps - 1) / ps; j++) p->table[r * p->stride + j] = perm[next++];
    }
    int32_t *starts = malloc((size_t)(num_seqs + 1) * 4);
    starts[0] = 0;
    for (int s = 0; s < num_seqs; s++) starts[s + 1] = starts[s] + q_len[s];
    p->d_k = p->fp8 ? dup_to_dev(k8, n) : dup_to_dev(p->k, n * 2);
    p->d_v = p->fp8 ? dup_to_dev(v8, n) : dup_to_dev(p->v, n * 2);
    free(k8), free(v8);
    p->d_table = dup_to_dev(p->table, (size_t)num_seqs * p->stride * 4);
    p->d_page_row = dup_to_dev(p->page_row, (size_t)num_seqs * 4);
    p->d_kv_len = dup_to_dev(kv_len, (size_t)num_seqs * 4);
    p->d_seq_start = dup_to_dev(starts, (size_t)(num_seqs + 1) * 4);
    free(perm), free(starts);
}

static rp_attn_meta paged_kv_meta(const paged_kv *p) {
    rp_attn_meta m = {.seq_start = p->d_seq_start, .seq_kv_len = p->d_kv_len, .seq_page_row = p->d_page_row,
                      .page_table = p->d_table, .page_table_stride = p->stride, .page_size = p->ps};
    return m;
}

static rp_kv_cache paged_kv_cache(const paged_kv *p) {
    rp_kv_cache c = rp_kv_cache_bf16(p->d_k, p->d_v);
    if (p->fp8) c.format = RP_KV_FORMAT_E4M3, c.k_scale = p->k_scale, c.v_scale = p->v_scale;
    return c;
}

static void paged_kv_free(paged_kv *p) {
    free(p->k), free(p->v), free(p->table), free(p->page_row);
    cudaFree(p->d_k), cudaFree(p->d_v), cudaFree(p->d_table), cudaFree(p->d_page_row), cudaFree(p->d_kv_len),
        cudaFree(p->d_seq_start);
}

static const uint16_t *kv_row(const paged_kv *p, const uint16_t *cache, int s, int j, int kvh) {
    int64_t page = p->table[p->page_row[s] * p->stride + j / p->ps];
    int64_t slot = page * p->ps + j % p->ps;
    return cache + (slot * p->nkv + kvh) * p->hd;
}

/* out[hd] = softmax(q . K[0..n) / sqrt(hd)) V, in double. */
static void attend_ref(const paged_kv *p, int s, int kvh, const uint16_t *q, int n, double *out, double *sc) {
    const int hd = p->hd;
    double mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        const uint16_t *k = kv_row(p, p->k, s, j, kvh);
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)bf(q[i]) * bf(k[i]);
        sc[j] = d * p->k_scale / sqrt((double)hd);
        if (sc[j] > mx) mx = sc[j];
    }
    double sum = 0;
    for (int j = 0; j < n; j++) sum += (sc[j] = exp(sc[j] - mx));
    for (int i = 0; i < hd; i++) out[i] = 0;
    for (int j = 0; j < n; j++) {
        const uint16_t *v = kv_row(p, p->v, s, j, kvh);
        for (int i = 0; i < hd; i++) out[i] += sc[j] / sum * bf(v[i]) * p->v_scale;
    }
}

/* The reference of prefill attention: sequence s's new token i (rows of
 * qkv in order) sees keys 0 .. kv_len[s] - q_len[s] + i. */
static void prefill_ref(const paged_kv *p, const uint16_t *qkv, const int *q_len, const int *kv_len, int S, int nh,
                        double *ref, double *sc) {
    const int hd = p->hd, row = (nh + 2 * p->nkv) * hd;
    int t = 0;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < q_len[s]; i++, t++)
            for (int h = 0; h < nh; h++)
                attend_ref(p, s, h / (nh / p->nkv), qkv + (size_t)t * row + (size_t)h * hd,
                           kv_len[s] - q_len[s] + i + 1, ref + ((size_t)t * nh + h) * hd, sc);
}

static void check_decode(int nh, int nkv, int hd, int ps, int num_splits) {
    int kv_len[] = {1, 7, 100, 1000, 4097, 33};
    const int S = 6;
    if (g_small) kv_len[4] = 700;
    int q_len[6] = {1, 1, 1, 1, 1, 1};
    paged_kv p;
    paged_kv_make(&p, nkv, hd, ps, kv_len, q_len, S);
    const int row = (nh + 2 * nkv) * hd;
    uint16_t *qkv = rand_bf16((size_t)S * row, 3.0f);
    uint16_t *d_qkv = dup_to_dev(qkv, (size_t)S * row * 2), *d_out = dalloc((size_t)S * nh * hd * 2);
    const size_t ws_bytes = rp_attn_decode_workspace_bytes(S, nh, hd, num_splits);
    void *d_ws = dalloc(ws_bytes);
    LAUNCH(rp_k_attn_decode(d_qkv, paged_kv_cache(&p), paged_kv_meta(&p), d_out, d_ws, S, nh, nkv, hd, num_splits, 0));
    uint16_t *out = malloc((size_t)S * nh * hd * 2);
    to_host(out, d_out, (size_t)S * nh * hd * 2);
    double *ref = malloc((size_t)S * nh * hd * 8), *sc = malloc(5000 * 8);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < nh; h++)
            attend_ref(&p, s, h / (nh / nkv), qkv + (size_t)s * row + (size_t)h * hd, kv_len[s],
                       ref + ((size_t)s * nh + h) * hd, sc);
    expect_close(rel_l2_bf16(out, ref, (size_t)S * nh * hd, "decode"), 1e-2,
                 "attn_decode%s nh=%d nkv=%d hd=%d page=%d splits=%d", p.fp8 ? " (fp8 KV)" : "", nh, nkv, hd, ps,
                 num_splits);
    free(qkv), free(out), free(ref), free(sc);
    cudaFree(d_qkv), cudaFree(d_out), cudaFree(d_ws);
    paged_kv_free(&p);
}

static void test_attn_decode(void **state) {
    (void)state;
    NEED_GPU();
    for (int mode = 1; mode >= 0; mode--) { /* heads as the mma's M; keys as M */
        rp_k_attn_decode_set_trans(mode == 0);
        printf("  attn_decode %s\n", mode ? "heads as M" : "keys as M");
        check_decode(32, 8, 128, 16, 8); /* llama3-8b: G = 4 */
        check_decode(8, 8, 64, 1, 3);    /* G = 1, page size 1 */
        check_decode(16, 2, 128, 16, 1); /* G = 8, no split */
        check_decode(16, 1, 64, 16, 32); /* G = 16, many (partly empty) splits */
        check_decode(12, 2, 128, 1, 16); /* G = 6 */
        check_decode(32, 8, 128, 16, 1); /* llama3-8b, no split */
    }
    rp_k_attn_decode_set_trans(-1);
}

/* Decode attention over e4m3 pages: both tile layouts, splits and none. */
static void test_attn_decode_fp8(void **state) {
    (void)state;
    NEED_GPU();
    g_kv_fp8 = 1;
    for (int mode = 1; mode >= 0; mode--) {
        rp_k_attn_decode_set_trans(mode == 0);
        printf("  attn_decode, fp8 KV, %s\n", mode ? "heads as M" : "keys as M");
        check_decode(32, 8, 128, 16, 8);
        check_decode(8, 8, 64, 1, 3);
        check_decode(16, 1, 64, 16, 32);
        check_decode(32, 8, 128, 16, 1);
    }
    rp_k_attn_decode_set_trans(-1);
    g_kv_fp8 = 0;
}

static int num_sms(void) {
    int dev = 0, n = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

/* Prefill attention of S sequences, q_len[s] new tokens after kv_len[s] -
 * q_len[s] cached ones, against attend_ref: one set of inputs and one
 * reference, then every (block shape, split count) of modes x splits (-1:
 * the launcher's choice) with the output poisoned before each run, checked
 * over each sequence's rows (so that one short sequence cannot hide in the
 * total) and over all. The workspace is what the backend gives the rule
 * (rp_attn_prefill_workspace_bytes) or what the largest forced split
 * needs, whichever is more. */
static void check_prefill_runs(int nh, int nkv, int hd, int ps, const int *q_len, const int *kv_len, int S,
                               const int *modes, int n_modes, const int *splits, int n_splits) {
    int T = 0, max_q = 0, max_kv = 0;
    for (int s = 0; s < S; s++) {
        T += q_len[s];
        if (q_len[s] > max_q) max_q = q_len[s];
        if (kv_len[s] > max_kv) max_kv = kv_len[s];
    }
    paged_kv p;
    paged_kv_make(&p, nkv, hd, ps, kv_len, q_len, S);
    const int row = (nh + 2 * nkv) * hd;
    const size_t out_n = (size_t)T * nh * hd;
    uint16_t *qkv = rand_bf16((size_t)T * row, 3.0f);
    uint16_t *d_qkv = dup_to_dev(qkv, (size_t)T * row * 2), *d_out = dalloc(out_n * 2);
    size_t ws_bytes = rp_attn_prefill_workspace_bytes(T, nh, hd, num_sms());
    for (int k = 0; k < n_splits; k++)
        if (splits[k] > 1 && rp_attn_prefill_split_bytes(T, nh, hd, splits[k]) > ws_bytes)
            ws_bytes = rp_attn_prefill_split_bytes(T, nh, hd, splits[k]);
    void *d_ws = dalloc(ws_bytes);
    uint16_t *out = malloc(out_n * 2);
    double *ref = malloc(out_n * 8), *sc = malloc((size_t)max_kv * 8);
    prefill_ref(&p, qkv, q_len, kv_len, S, nh, ref, sc);
    for (int mi = 0; mi < n_modes; mi++)
        for (int si = 0; si < n_splits; si++) {
            rp_k_attn_prefill_set_mode(modes[mi]);
            rp_k_attn_prefill_set_splits(splits[si]);
            CU(cudaMemset(d_out, 0xff, out_n * 2));
            CU(cudaMemset(d_ws, 0xff, ws_bytes)); /* partial results no split wrote fail too */
            LAUNCH(rp_k_attn_prefill(d_qkv, paged_kv_cache(&p), paged_kv_meta(&p), d_out, d_ws, ws_bytes, T, S, max_q,
                                     max_kv, nh, nkv, hd, 0));
            to_host(out, d_out, out_n * 2);
            const int n = splits[si] > 0 ? splits[si]
                                         : rp_attn_prefill_splits(num_sms(), T, S, max_q, max_kv, nh, nkv, hd,
                                                                  ws_bytes);
            size_t off = 0;
            for (int s = 0; s < S; s++) {
                const size_t len = (size_t)q_len[s] * nh * hd;
                expect_close(rel_l2_bf16(out + off, ref + off, len, "prefill"), 1e-2,
                             "attn_prefill%s nh=%d nkv=%d hd=%d page=%d mode=%d splits=%d seq %d (%d new of %d)",
                             p.fp8 ? " (fp8 KV)" : "", nh, nkv, hd, ps, modes[mi], n, s, q_len[s], kv_len[s]);
                off += len;
            }
            expect_close(rel_l2_bf16(out, ref, out_n, "prefill"), 1e-2,
                         "attn_prefill nh=%d nkv=%d hd=%d page=%d mode=%d splits=%d", nh, nkv, hd, ps, modes[mi],
                         n);
        }
    rp_k_attn_prefill_set_mode(-1);
    rp_k_attn_prefill_set_splits(-1);
    free(qkv), free(out), free(ref), free(sc);
    cudaFree(d_qkv), cudaFree(d_out), cudaFree(d_ws);
    paged_kv_free(&p);
}

static const int pf_all_modes[] = {RP_PREFILL_ROWS16, RP_PREFILL_ROWS32, RP_PREFILL_HEADS2};

static void check_prefill(int nh, int nkv, int hd, int ps) {
    /* 600 new tokens: several 128-query tiles, warps past and before the diagonal */
    int q_len[] = {1, 7, 100, 600, 130, 1};
    int kv_len[] = {1, 7, 100, 1000, 4097, 500};
    if (g_small) kv_len[4] = 300;
    /* every block shape, unsplit and as the rule says (which splits some) */
    const int splits[] = {1, -1};
    check_prefill_runs(nh, nkv, hd, ps, q_len, kv_len, 6, pf_all_modes, 3, splits, 2);
}

static void test_attn_prefill(void **state) {
    (void)state;
    NEED_GPU();
    check_prefill(8, 2, 128, 16); /* G = 4 */
    check_prefill(4, 4, 64, 1);   /* G = 1 (two heads: falls back to 32 rows), page size 1 */
    check_prefill(8, 1, 128, 1);  /* G = 8 */
    check_prefill(8, 1, 64, 16);
    check_prefill(6, 3, 128, 16); /* G = 2 */
}

/* Prefill attention over e4m3 pages (staged and widened in shared
 * memory): every block shape, unsplit and split. */
static void test_attn_prefill_fp8(void **state) {
    (void)state;
    NEED_GPU();
    g_kv_fp8 = 1;
    check_prefill(8, 2, 128, 16);
    check_prefill(4, 4, 64, 1);
    check_prefill(6, 3, 128, 16);
    {   /* a short chunk after a long prefix, forced splits */
        int q_len[] = {64, 1, 17}, kv_len[] = {g_small ? 1000 : 8064, 3000, 2049};
        const int modes[] = {-1, RP_PREFILL_ROWS16, RP_PREFILL_ROWS32, RP_PREFILL_HEADS2};
        const int splits[] = {1, 3, -1};
        check_prefill_runs(32, 8, 128, 16, q_len, kv_len, 3, modes, 4, splits, 3);
    }
    g_kv_fp8 = 0;
}

/* A long cached prefix and few new tokens: the keys split into ranges
 * (attn_prefill.cu), forced on at several counts (2; a few; 32, where most
 * ranges of the short sequences are empty and rows before a range's first
 * key see none of it) and off, and as the rule chooses. */
static void test_attn_prefill_split(void **state) {
    (void)state;
    NEED_GPU();
    const int dflt[] = {-1};
    {   /* llama3-8b's heads: a mixed batch, every block shape; 8064 / 64 is the TTFT case */
        int q_len[] = {64, 1, 17, 100, 1, 130};
        int kv_len[] = {8064, 3000, 2049, 100, 1, 700};
        if (g_small) kv_len[0] = 1000, kv_len[1] = 600;
        const int modes[] = {-1, RP_PREFILL_ROWS16, RP_PREFILL_ROWS32, RP_PREFILL_HEADS2};
        const int splits[] = {1, 2, 5, 32, -1};
        check_prefill_runs(32, 8, 128, 16, q_len, kv_len, 6, modes, 4, splits, 5);
    }
    {   /* one sequence each, where the rule splits: llama3-8b, 64 new after 8000 */
        int q_len[] = {64}, kv_len[] = {g_small ? 1600 : 8064};
        const int splits[] = {-1, 1, 3};
        check_prefill_runs(32, 8, 128, 16, q_len, kv_len, 1, dflt, 1, splits, 3);
    }
    {   /* an odd group (one head per block), head dim 64, page size 1 */
        int q_len[] = {17}, kv_len[] = {2049};
        const int modes[] = {-1, RP_PREFILL_ROWS32};
        const int splits[] = {-1, 1, 3, 32};
        check_prefill_runs(12, 4, 64, 1, q_len, kv_len, 1, modes, 2, splits, 4);
    }
    {   /* one new token (a decode row inside a prefill batch), qwen3-like heads */
        int q_len[] = {1, 2}, kv_len[] = {3000, 1500};
        const int splits[] = {-1, 1, 7};
        check_prefill_runs(16, 8, 128, 16, q_len, kv_len, 2, dflt, 1, splits, 3);
    }
}

/* A step's attention (rp_k_attn_step): the batch's leading one-token
 * sequences by decode attention, the rest (one-token ones among them) by
 * the work list, padded to a bucket of `tokens` rows, against attend_ref;
 * the output poisoned first, so every row the step must write is checked
 * and the padding rows must still hold the poison. want_split: the plan
 * must (1) or must not (0) split the prefill keys (-1: either). */
static void check_step(int nh, int nkv, int hd, int ps, const int *q_len, const int *kv_len, int S, int tokens,
                       int max_seqs, int dec_splits, int want_split) {
    int T = 0, max_kv = 0;
    for (int s = 0; s < S; s++) {
        T += q_len[s];
        if (kv_len[s] > max_kv) max_kv = kv_len[s];
    }
    paged_kv p;
    paged_kv_make(&p, nkv, hd, ps, kv_len, q_len, S > 0 ? S : 1); /* an empty step still needs a cache */
    const int row = (nh + 2 * nkv) * hd;
    const size_t out_n = (size_t)tokens * nh * hd;
    uint16_t *qkv = rand_bf16((size_t)tokens * row, 3.0f);
    uint16_t *d_qkv = dup_to_dev(qkv, (size_t)tokens * row * 2), *d_out = dalloc(out_n * 2);
    size_t ws_bytes = rp_attn_prefill_workspace_bytes(tokens, nh, hd, num_sms());
    if (rp_attn_decode_workspace_bytes(max_seqs, nh, hd, dec_splits) > ws_bytes)
        ws_bytes = rp_attn_decode_workspace_bytes(max_seqs, nh, hd, dec_splits);
    void *d_ws = dalloc(ws_bytes);
    const rp_attn_step_shape sh = rp_attn_step_shape_for(tokens, max_seqs, dec_splits, num_sms(), nh, nkv, hd, ps,
                                                         ws_bytes, p.fp8 ? RP_KV_FORMAT_E4M3 : RP_KV_FORMAT_BF16);
    if (p.fp8) assert_int_not_equal(sh.pf_mode, RP_PREFILL_SM90); /* the Hopper kernel reads bf16 pages only */
    int32_t hdr[RP_ATTN_HDR_LEN], *items = malloc((size_t)sh.pf_items * RP_ATTN_ITEM_INTS * 4);
    int32_t *starts = malloc((size_t)(S + 1) * 4);
    starts[0] = 0;
    for (int s = 0; s < S; s++) starts[s + 1] = starts[s] + q_len[s];
    assert_int_equal(rp_attn_step_plan(&sh, starts, kv_len, S, num_sms(), nh, nkv, hd, hdr, items), 0);
    if (want_split >= 0) assert_int_equal(hdr[RP_ATTN_HDR_PF_SPLITS] > 1, want_split);
    int32_t *d_hdr = dup_to_dev(hdr, sizeof hdr), *d_items = dup_to_dev(items, (size_t)sh.pf_items * 12);
    rp_attn_meta m = paged_kv_meta(&p);
    m.hdr = d_hdr, m.pf_items = d_items;
    CU(cudaMemset(d_out, 0xff, out_n * 2));
    CU(cudaMemset(d_ws, 0xff, ws_bytes));
    LAUNCH(rp_k_attn_step(d_qkv, paged_kv_cache(&p), m, d_out, d_ws, &sh, nh, nkv, hd, 0));
    uint16_t *out = malloc(out_n * 2);
    to_host(out, d_out, out_n * 2);
    double *ref = malloc((size_t)T * nh * hd * 8), *sc = malloc((size_t)max_kv * 8);
    prefill_ref(&p, qkv, q_len, kv_len, S, nh, ref, sc);
    size_t off = 0;
    for (int s = 0; s < S; s++) {
        const size_t len = (size_t)q_len[s] * nh * hd;
        expect_close(rel_l2_bf16(out + off, ref + off, len, "step"), 1e-2,
                     "attn_step%s nh=%d nkv=%d hd=%d page=%d bucket %d, %d decodes, %d prefill splits, dec splits "
                     "%d: seq %d (%d new of %d)",
                     p.fp8 ? " (fp8 KV)" : "", nh, nkv, hd, ps, tokens, hdr[RP_ATTN_HDR_DECODE_SEQS], hdr[RP_ATTN_HDR_PF_SPLITS], dec_splits,
                     s, q_len[s], kv_len[s]);
        off += len;
    }
    for (size_t i = (size_t)T * nh * hd; i < out_n; i++)
        if (out[i] != 0xffff) fail_msg("attn_step wrote padding row %zu", i / ((size_t)nh * hd));
    printf("  attn_step nh=%d nkv=%d hd=%d: %d seqs, %d tokens in a bucket of %d: %d decodes, %d items, %d splits\n",
           nh, nkv, hd, S, T, tokens, hdr[RP_ATTN_HDR_DECODE_SEQS], hdr[RP_ATTN_HDR_PF_ITEMS],
           hdr[RP_ATTN_HDR_PF_SPLITS]);
    free(qkv), free(out), free(ref), free(sc), free(items), free(starts);
    cudaFree(d_qkv), cudaFree(d_out), cudaFree(d_ws), cudaFree(d_hdr), cudaFree(d_items);
    paged_kv_free(&p);
}

static void test_attn_step(void **state) {
    (void)state;
    NEED_GPU();
    {   /* decodes first, then chunks (one of one token, after the decodes' run), llama3-8b's heads */
        int q_len[] = {1, 1, 1, 100, 1, 600, 130, 17};
        int kv_len[] = {1, 700, 4097, 100, 3000, 1000, 700, 2049};
        if (g_small) kv_len[2] = 300, kv_len[4] = 400;
        check_step(32, 8, 128, 16, q_len, kv_len, 8, 1024, 64, 1, -1);
        check_step(32, 8, 128, 16, q_len, kv_len, 8, 1024, 64, 3, -1); /* decode keys split and merged */
        check_step(32, 8, 128, 16, q_len, kv_len, 8, 4096, 256, 1, 0); /* a large bucket: two-head blocks */
    }
    {   /* a short chunk after a long prefix with two decodes: the plan splits it */
        int q_len[] = {1, 1, 64}, kv_len[] = {50, 900, g_small ? 1600 : 8064};
        check_step(32, 8, 128, 16, q_len, kv_len, 3, 128, 128, 1, 1);
    }
    {   /* odd group (32-row blocks in a large bucket), head dim 64, page size 1, no decodes */
        int q_len[] = {300, 2, 1}, kv_len[] = {300, 2049, 5};
        check_step(12, 4, 64, 1, q_len, kv_len, 3, 2048, 16, 1, -1);
        check_step(12, 4, 64, 1, q_len, kv_len, 3, 512, 16, 2, -1);
    }
    {   /* only decodes, and an empty step (all padding) */
        int q_len[] = {1, 1}, kv_len[] = {33, 2000};
        check_step(16, 8, 128, 16, q_len, kv_len, 2, 16, 16, 2, 0);
        check_step(16, 8, 128, 16, q_len, kv_len, 0, 16, 16, 1, 0);
    }
}

/* A step's attention over e4m3 pages: the buckets where bf16 takes the
 * Hopper kernel take the mma.sync blocks (rp_attn_step_shape_for). */
static void test_attn_step_fp8(void **state) {
    (void)state;
    NEED_GPU();
    g_kv_fp8 = 1;
    {
        int q_len[] = {1, 1, 1, 100, 1, 600, 130, 17};
        int kv_len[] = {1, 700, 4097, 100, 3000, 1000, 700, 2049};
        if (g_small) kv_len[2] = 300, kv_len[4] = 400;
        check_step(32, 8, 128, 16, q_len, kv_len, 8, 1024, 64, 3, -1);
        check_step(32, 8, 128, 16, q_len, kv_len, 8, 4096, 256, 1, 0);
    }
    {
        int q_len[] = {1, 1, 64}, kv_len[] = {50, 900, g_small ? 1600 : 8064};
        check_step(32, 8, 128, 16, q_len, kv_len, 3, 128, 128, 1, 1);
    }
    {
        int q_len[] = {300, 2, 1}, kv_len[] = {300, 2049, 5};
        check_step(12, 4, 64, 1, q_len, kv_len, 3, 2048, 16, 1, -1);
    }
    g_kv_fp8 = 0;
}

/* rp_attn_prefill_workspace_bytes bounds every split the rule makes: over
 * many shapes, the rule chooses the same split count with that workspace
 * as with an unbounded one (a CPU check of the bound's derivation). */
static void test_attn_prefill_split_bound(void **state) {
    (void)state;
    const int sms[] = {132, 114, 78, 16};
    const int heads[][2] = {{32, 8}, {16, 8}, {12, 4}, {8, 1}, {64, 8}, {40, 8}, {14, 2}, {4, 4}};
    const int qs[] = {1, 2, 17, 63, 64, 65, 100, 128, 200, 256, 300, 513, 1000, 2048};
    const int max_tokens = 8192;
    int checked = 0, split = 0;
    for (size_t a = 0; a < sizeof sms / sizeof sms[0]; a++)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
            for (int hd = 64; hd <= 128; hd += 64)
                for (int S = 1; S <= 8; S++)
                    for (size_t qi = 0; qi < sizeof qs / sizeof qs[0]; qi++) {
                        const int q = qs[qi], T = S * q;
                        if (T > max_tokens) continue;
                        const int kvs[] = {q, 2 * q, 2 * q + 700, 4096, 8064, 32768, 131072};
                        const size_t bound =
                            rp_attn_prefill_workspace_bytes(max_tokens, heads[h][0], hd, sms[a]);
                        for (size_t ki = 0; ki < sizeof kvs / sizeof kvs[0]; ki++) {
                            if (kvs[ki] < q) continue;
                            const int want = rp_attn_prefill_splits(sms[a], T, S, q, kvs[ki], heads[h][0],
                                                                    heads[h][1], hd, SIZE_MAX);
                            const int got = rp_attn_prefill_splits(sms[a], T, S, q, kvs[ki], heads[h][0],
                                                                   heads[h][1], hd, bound);
                            if (want != got)
                                fail_msg("prefill split bound: %d SMs, nh %d nkv %d hd %d, %d seqs of %d new, kv "
                                         "%d: %d splits unbounded, %d within %zu bytes",
                                         sms[a], heads[h][0], heads[h][1], hd, S, q, kvs[ki], want, got, bound);
                            checked++;
                            split += want > 1;
                        }
                    }
    printf("  prefill split bound: %d shapes, %d of them split\n", checked, split);
    assert_true(split > 0);
}

/* Every run draws the same inputs unless REPLAY_TEST_SEED says otherwise. */
#define TEST_SEED 20261127ULL

int main(void) {
    const char *env = getenv("REPLAY_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : TEST_SEED;
    g_small = getenv("REPLAY_TEST_SMALL") != NULL;
    printf("test_cuda_kernels: seed %llu%s (REPLAY_TEST_SEED=N runs another)\n", (unsigned long long)g_seed,
           g_small ? ", small shapes" : "");
    if (getenv("REPLAY_TEST_SKIP")) cmocka_set_skip_filter(getenv("REPLAY_TEST_SKIP"));
    if (getenv("REPLAY_TEST_ONLY")) cmocka_set_test_filter(getenv("REPLAY_TEST_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),           cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_silu_mul_gather), cmocka_unit_test(test_fill_dummy),
        cmocka_unit_test(test_gemv),            cmocka_unit_test(test_gemv_fused),
        cmocka_unit_test(test_gemv_fp8),        cmocka_unit_test(test_fp8_act_rows), cmocka_unit_test(test_add_rmsnorm_fp8),        cmocka_unit_test(test_gemv_fused_fp8),
        cmocka_unit_test(test_qk_norm_rope_store),
        cmocka_unit_test(test_attn_decode),     cmocka_unit_test(test_attn_prefill),
        cmocka_unit_test(test_attn_prefill_split), cmocka_unit_test(test_attn_prefill_split_bound),
        cmocka_unit_test(test_attn_step),       cmocka_unit_test(test_tp_kernels),
        cmocka_unit_test(test_fill_dummy_slice),
        cmocka_unit_test(test_fp8_blocks_gemv),        cmocka_unit_test(test_fp8_blocks_quant),
        cmocka_unit_test(test_fp8_blocks_gemm),
        cmocka_unit_test(test_fp8_outer_gemm),
        cmocka_unit_test(test_qk_norm_rope_store_fp8), cmocka_unit_test(test_attn_decode_fp8),
        cmocka_unit_test(test_attn_prefill_fp8),       cmocka_unit_test(test_attn_step_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no CUDA toolkit at build time */

static void test_no_cuda(void **state) {
    (void)state;
    printf("built without CUDA: skipping CUDA kernel tests\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_cuda)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
