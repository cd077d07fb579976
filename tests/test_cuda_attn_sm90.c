/* Tests for the sm_90a prefill attention kernel (rp_k_attn_prefill_sm90,
 * src/backend/cuda/kernels/attn_prefill_sm90.cu) against a host reference
 * (scores, softmax and the weighted sum in double over the bf16 inputs),
 * and against the existing mma.sync kernel (rp_k_attn_prefill).
 *
 * Layout checks come first (rp_k_sm90_debug_qk / _pv: one tile of S =
 * Q K^T and of O = P V through the kernel's own TMA boxes, descriptors and
 * fragment layouts), so that a wrong swizzle, descriptor or fragment shows
 * alone before the full kernel fails in a harder-to-read way.
 *
 * Inputs are fresh random values from a fixed, printed seed
 * (REPLAY_TEST_SEED runs another); pages are a random permutation. The
 * output buffer has guard rows before and after the T rows and is poisoned
 * with 0xFF bytes (bf16 NaN) before every launch: every output element
 * must be finite and within tolerance, every guard element untouched.
 *
 * Tolerance: per sequence, max |out - ref| <= 2e-2 x max |ref| and
 * relative L2 <= 1e-2. Why that is loose enough: the scores are exact
 * products of bf16 values summed in fp32; P is rounded to bf16 (relative
 * 2^-9) before P V and the output to bf16 (2^-9), so an element is off by
 * about 2^-8 of its size, far under 2e-2 of the largest output, while a
 * wrong row, key, head or mask is off by the size of the output itself.
 *
 * Skipped (clearly) without a GPU or on a GPU that is not sm_90. Label
 * "gpu" in CTest. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REPLAY_HAVE_CUDA

#include <cuda_runtime_api.h>

#include "test_cuda_util.h"

#include "backend/cuda/kernels.h"
#include "util/dtype.h"
#include "util/rng.h"

#define TEST_SEED 20261127ULL

static uint64_t g_seed, g_ctr;

static float frand(void) { return rp_rand_uniform(g_seed, 1, g_ctr++) * 2.0f - 1.0f; }
static uint32_t urand(uint32_t n) { return (uint32_t)(rp_rand_u64(g_seed, 2, g_ctr++) % n); }
static float bf(uint16_t h) { return rp_bf16_to_f32(h); }

static uint16_t *rand_bf16(size_t n, float scale) {
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = rp_f32_to_bf16(frand() * scale);
    return h;
}

/* 0: no GPU, 1: a GPU but not sm_90, 2: sm_90 */
static int gpu_kind(void) {
    int n = 0, dev = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        return 0;
    }
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0 ? 2 : 1;
}

#define NEED_SM90()                                                                   \
    do {                                                                              \
        const int k_ = gpu_kind();                                                    \
        if (k_ != 2) {                                                                \
            printf("%s: skipping sm_90a attention tests\n",                           \
                   k_ == 0 ? "no CUDA GPU" : "GPU is not sm_90 (H100/H200)");         \
            skip();                                                                   \
        }                                                                             \
    } while (0)

/* ---- layout checks ----------------------------------------------------- */

/* got against ref (both [rows][cols]): the first mismatch beyond tol x
 * max|ref| fails, naming the element (a misplaced swizzle chunk or
 * fragment shows as a pattern of (row, col)). */
static void expect_tile(const float *got, const double *ref, int rows, int cols, double tol, const char *what) {
    double mx = 0, err = 0;
    for (int i = 0; i < rows * cols; i++) mx = fmax(mx, fabs(ref[i]));
    for (int i = 0; i < rows * cols; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= tol * mx)) /* NaN fails too */
            fail_msg("%s: element (%d, %d) is %g, expected %g (max |ref| %g)", what, i / cols, i % cols,
                     (double)got[i], ref[i], mx);
        err = fmax(err, e);
    }
    printf("  %-58s max err %.2e of max |ref| %.2e\n", what, err, mx);
}

static void test_layout_qk(void **state) {
    (void)state;
    NEED_SM90();
    uint16_t *q = rand_bf16(64 * 128, 1.0f), *k = rand_bf16(128 * 128, 1.0f);
    uint16_t *d_q = dup_to_dev(q, 64 * 128 * 2), *d_k = dup_to_dev(k, 128 * 128 * 2);
    float *d_s = dalloc(64 * 128 * 4), *s = malloc(64 * 128 * 4);
    double *ref = malloc(64 * 128 * 8);
    LAUNCH(rp_k_sm90_debug_qk(d_q, d_k, d_s, 0));
    to_host(s, d_s, 64 * 128 * 4);
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 128; j++) {
            double acc = 0;
            for (int d = 0; d < 128; d++) acc += (double)bf(q[i * 128 + d]) * bf(k[j * 128 + d]);
            ref[i * 128 + j] = acc;
        }
    expect_tile(s, ref, 64, 128, 1e-4, "S = Q K^T (TMA 128B swizzle, K-major wgmma)");
    free(q), free(k), free(s), free(ref);
    cudaFree(d_q), cudaFree(d_k), cudaFree(d_s);
}

static void test_layout_pv(void **state) {
    (void)state;
    NEED_SM90();
    float *p = malloc(64 * 128 * 4), *o = malloc(64 * 128 * 4);
    for (int i = 0; i < 64 * 128; i++) p[i] = (frand() + 1.0f) * 0.5f;
    uint16_t *v = rand_bf16(128 * 128, 1.0f);
    float *d_p = dup_to_dev(p, 64 * 128 * 4), *d_o = dalloc(64 * 128 * 4);
    uint16_t *d_v = dup_to_dev(v, 128 * 128 * 2);
    double *ref = malloc(64 * 128 * 8);
    LAUNCH(rp_k_sm90_debug_pv(d_p, d_v, d_o, 0));
    to_host(o, d_o, 64 * 128 * 4);
    for (int i = 0; i < 64; i++)
        for (int n = 0; n < 128; n++) {
            double acc = 0;
            for (int j = 0; j < 128; j++) acc += (double)bf(rp_f32_to_bf16(p[i * 128 + j])) * bf(v[j * 128 + n]);
            ref[i * 128 + n] = acc;
        }
    expect_tile(o, ref, 64, 128, 1e-4, "O = P V (P from registers, V transposed B)");
    free(p), free(o), free(v), free(ref);
    cudaFree(d_p), cudaFree(d_o), cudaFree(d_v);
}

/* ---- the kernel ----------------------------------------------------------- */

/* A batch: S sequences, q_len[s] new tokens after kv_len[s] - q_len[s]
 * cached ones, nh query and nkv kv heads of 128, pages of ps slots in a
 * random permutation (page-table rows in reverse sequence order). */
typedef struct batch {
    int S, nh, nkv, hd, ps, T, max_q, max_kv, stride, num_pages, row;
    const int *q_len, *kv_len;
    uint16_t *qkv, *k, *v; /* host */
    int32_t *table, *page_row, *start;
    uint16_t *d_qkv, *d_k, *d_v;
    int32_t *d_table, *d_page_row, *d_kv_len, *d_start;
} batch;

static void batch_make(batch *b, int nh, int nkv, int ps, const int *q_len, const int *kv_len, int S) {
    memset(b, 0, sizeof *b);
    b->S = S, b->nh = nh, b->nkv = nkv, b->hd = 128, b->ps = ps, b->q_len = q_len, b->kv_len = kv_len;
    int total_pages = 0, max_pages = 0;
    for (int s = 0; s < S; s++) {
        assert_true(kv_len[s] >= q_len[s]);
        const int np = (kv_len[s] + ps - 1) / ps;
        total_pages += np;
        if (np > max_pages) max_pages = np;
        b->T += q_len[s];
        if (q_len[s] > b->max_q) b->max_q = q_len[s];
        if (kv_len[s] > b->max_kv) b->max_kv = kv_len[s];
    }
    b->num_pages = total_pages + 3;
    b->stride = max_pages + 1;
    b->row = (nh + 2 * nkv) * b->hd;
    const size_t n = (size_t)b->num_pages * ps * nkv * b->hd;
    b->k = rand_bf16(n, 1.0f);
    b->v = rand_bf16(n, 1.0f);
    b->qkv = rand_bf16((size_t)b->T * b->row, 3.0f);
    int32_t *perm = malloc((size_t)b->num_pages * 4);
    for (int i = 0; i < b->num_pages; i++) perm[i] = i;
    for (int i = b->num_pages - 1; i > 0; i--) {
        const int j = (int)urand((uint32_t)i + 1), tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    b->table = malloc((size_t)S * b->stride * 4);
    b->page_row = malloc((size_t)S * 4);
    b->start = malloc((size_t)(S + 1) * 4);
    for (int i = 0; i < S * b->stride; i++) b->table[i] = -1;
    int next = 0;
    b->start[0] = 0;
    for (int s = 0; s < S; s++) {
        const int r = S - 1 - s;
        b->page_row[s] = r;
        for (int j = 0; j < (kv_len[s] + ps - 1) / ps; j++) b->table[r * b->stride + j] = perm[next++];
        b->start[s + 1] = b->start[s] + q_len[s];
    }
    free(perm);
    b->d_qkv = dup_to_dev(b->qkv, (size_t)b->T * b->row * 2);
    b->d_k = dup_to_dev(b->k, n * 2);
    b->d_v = dup_to_dev(b->v, n * 2);
    b->d_table = dup_to_dev(b->table, (size_t)S * b->stride * 4);
    b->d_page_row = dup_to_dev(b->page_row, (size_t)S * 4);
    b->d_kv_len = dup_to_dev(kv_len, (size_t)S * 4);
    b->d_start = dup_to_dev(b->start, (size_t)(S + 1) * 4);
}

static rp_attn_meta batch_meta(const batch *b) {
    rp_attn_meta m = {.seq_start = b->d_start, .seq_kv_len = b->d_kv_len, .seq_page_row = b->d_page_row,
                      .page_table = b->d_table, .page_table_stride = b->stride, .page_size = b->ps};
    return m;
}

static void batch_free(batch *b) {
    free(b->qkv), free(b->k), free(b->v), free(b->table), free(b->page_row), free(b->start);
    cudaFree(b->d_qkv), cudaFree(b->d_k), cudaFree(b->d_v), cudaFree(b->d_table), cudaFree(b->d_page_row),
        cudaFree(b->d_kv_len), cudaFree(b->d_start);
}

static const uint16_t *kv_at(const batch *b, const uint16_t *cache, int s, int j, int kvh) {
    const int64_t page = b->table[b->page_row[s] * b->stride + j / b->ps];
    return cache + ((page * b->ps + j % b->ps) * b->nkv + kvh) * b->hd;
}

/* ref[T][nh][hd]: query i of sequence s attends to keys 0..kv_len - n_new + i. */
static double *batch_reference(const batch *b) {
    const int hd = b->hd, G = b->nh / b->nkv;
    double *ref = malloc((size_t)b->T * b->nh * hd * 8), *sc = malloc((size_t)b->max_kv * 8);
    float *kf = malloc((size_t)b->max_kv * hd * 4), *vf = malloc((size_t)b->max_kv * hd * 4);
    for (int s = 0; s < b->S; s++)
        for (int kvh = 0; kvh < b->nkv; kvh++) {
            const int kv = b->kv_len[s], n_new = b->q_len[s];
            for (int j = 0; j < kv; j++)
                for (int d = 0; d < hd; d++) {
                    kf[(size_t)j * hd + d] = bf(kv_at(b, b->k, s, j, kvh)[d]);
                    vf[(size_t)j * hd + d] = bf(kv_at(b, b->v, s, j, kvh)[d]);
                }
            for (int i = 0; i < n_new; i++)
                for (int h = kvh * G; h < (kvh + 1) * G; h++) {
                    const int t = b->start[s] + i, n = kv - n_new + i + 1;
                    const uint16_t *q = b->qkv + (size_t)t * b->row + (size_t)h * hd;
                    float qf[128];
                    for (int d = 0; d < hd; d++) qf[d] = bf(q[d]);
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j < n; j++) {
                        double acc = 0;
                        for (int d = 0; d < hd; d++) acc += (double)qf[d] * kf[(size_t)j * hd + d];
                        sc[j] = acc / sqrt((double)hd);
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int j = 0; j < n; j++) sum += (sc[j] = exp(sc[j] - mx));
                    double *o = ref + ((size_t)t * b->nh + h) * hd;
                    for (int d = 0; d < hd; d++) o[d] = 0;
                    for (int j = 0; j < n; j++) {
                        const double w = sc[j] / sum;
                        for (int d = 0; d < hd; d++) o[d] += w * vf[(size_t)j * hd + d];
                    }
                }
        }
    free(sc), free(kf), free(vf);
    return ref;
}

#define GUARD_ROWS 3 /* output rows poisoned before and after the T rows */

/* Every element of sequence s's rows against ref: finite, max error <=
 * 2e-2 of the largest |ref|, relative L2 <= 1e-2. */
static void expect_seq(const uint16_t *out, const double *ref, const batch *b, int s, const char *who) {
    const size_t w = (size_t)b->nh * b->hd, off = (size_t)b->start[s] * w, n = (size_t)b->q_len[s] * w;
    double mx = 0, err = 0, num = 0, den = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[off + i]));
    for (size_t i = 0; i < n; i++) {
        const double g = bf(out[off + i]), e = fabs(g - ref[off + i]);
        if (!isfinite(g))
            fail_msg("%s: seq %d token %zu head %zu dim %zu is not finite (not written?)", who, s, i / w,
                     i % w / b->hd, i % b->hd);
        if (!(e <= 2e-2 * mx))
            fail_msg("%s: seq %d (%d new of %d keys) token %zu head %zu dim %zu: %g, expected %g (max |ref| %g)",
                     who, s, b->q_len[s], b->kv_len[s], i / w, i % w / b->hd, i % b->hd, g, ref[off + i], mx);
        err = fmax(err, e);
        num += (g - ref[off + i]) * (g - ref[off + i]);
        den += ref[off + i] * ref[off + i];
    }
    const double l2 = sqrt(num / (den > 0 ? den : 1e-300));
    if (!(l2 <= 1e-2)) fail_msg("%s: seq %d relative L2 %.3e > 1e-2", who, s, l2);
    printf("    %-6s seq %d: %5d new of %5d keys  max err %.2e (max |ref| %.2e)  rel L2 %.2e\n", who, s,
           b->q_len[s], b->kv_len[s], err, mx, l2);
}

/* The guard rows around the output kept their poison. */
static void expect_guards(const uint16_t *buf, const batch *b, const char *who) {
    const size_t w = (size_t)b->nh * b->hd, g = (size_t)GUARD_ROWS * w, T = (size_t)b->T * w;
    for (size_t i = 0; i < g; i++) {
        if (buf[i] != 0xFFFF) fail_msg("%s: guard row before the output written (element %zu)", who, i);
        if (buf[g + T + i] != 0xFFFF) fail_msg("%s: guard row after the output written (element %zu)", who, i);
    }
}

/* One batch through both kernels, each checked against the reference; the
 * new kernel also against the old one (the same bound). */
static void check_batch(int nh, int nkv, int ps, const int *q_len, const int *kv_len, int S) {
    batch b;
    batch_make(&b, nh, nkv, ps, q_len, kv_len, S);
    printf("  nh %d nkv %d page %d, %d seqs, T %d\n", nh, nkv, ps, S, b.T);
    double *ref = batch_reference(&b);
    const size_t w = (size_t)nh * b.hd, rows = (size_t)b.T + 2 * GUARD_ROWS;
    uint16_t *d_buf = dalloc(rows * w * 2), *d_out = d_buf + GUARD_ROWS * w;
    uint16_t *buf = malloc(rows * w * 2), *out = buf + GUARD_ROWS * w;
    uint16_t *old = malloc((size_t)b.T * w * 2);

    /* the existing kernel, the launcher's own choice of block and split */
    int sms = 0, dev = 0;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t ws_bytes = rp_attn_prefill_workspace_bytes(b.T, nh, b.hd, sms);
    void *d_ws = dalloc(ws_bytes);
    CU(cudaMemset(d_buf, 0xff, rows * w * 2));
    LAUNCH(rp_k_attn_prefill(b.d_qkv, rp_kv_cache_bf16(b.d_k, b.d_v), batch_meta(&b), d_out, d_ws, ws_bytes, b.T, S,
                             b.max_q, b.max_kv, nh, nkv, b.hd, 0));
    to_host(buf, d_buf, rows * w * 2);
    memcpy(old, out, (size_t)b.T * w * 2);
    for (int s = 0; s < S; s++) expect_seq(out, ref, &b, s, "mma");

    CU(cudaMemset(d_buf, 0xff, rows * w * 2));
    LAUNCH(rp_k_attn_prefill_sm90(b.d_qkv, b.d_k, b.d_v, batch_meta(&b), d_out, b.T, S, b.max_q, b.max_kv, nh, nkv,
                                  b.hd, 0));
    to_host(buf, d_buf, rows * w * 2);
    expect_guards(buf, &b, "sm90");
    for (int s = 0; s < S; s++) expect_seq(out, ref, &b, s, "sm90");
    /* against the old kernel: the same bound, the reference's scale */
    for (int s = 0; s < S; s++) {
        const size_t off = (size_t)b.start[s] * w, n = (size_t)q_len[s] * w;
        double mx = 0;
        for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[off + i]));
        for (size_t i = 0; i < n; i++)
            if (!(fabs((double)bf(out[off + i]) - bf(old[off + i])) <= 2e-2 * mx))
                fail_msg("sm90 vs mma: seq %d element %zu: %g vs %g", s, i, (double)bf(out[off + i]),
                         (double)bf(old[off + i]));
    }
    free(ref), free(buf), free(old);
    cudaFree(d_buf), cudaFree(d_ws);
    batch_free(&b);
}

/* One sequence, no cached prefix, at lengths around and across the
 * 128-row / 128-key tiles, up to 2100 tokens. */
static void test_single_sequence(void **state) {
    (void)state;
    NEED_SM90();
    const int lens[] = {1, 2, 17, 63, 127, 128, 129, 255, 257, 383, 1001, 2100};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) check_batch(8, 2, 16, &lens[i], &lens[i], 1);
}

/* Several sequences of different lengths (some with a cached prefix) in
 * one launch, at GQA groups of 1, 2 and 4 and llama3-8b's heads. */
static void test_batch_gqa(void **state) {
    (void)state;
    NEED_SM90();
    const int q_len[] = {1, 300, 7, 129, 64, 1000, 2};
    const int kv_len[] = {1, 300, 100, 1129, 64, 1000, 2};
    check_batch(4, 4, 16, q_len, kv_len, 7); /* G = 1 */
    check_batch(4, 2, 16, q_len, kv_len, 7); /* G = 2 */
    check_batch(8, 2, 16, q_len, kv_len, 7); /* G = 4 */
    const int q2[] = {513, 130}, kv2[] = {513, 900};
    check_batch(32, 8, 16, q2, kv2, 2); /* llama3-8b's heads */
}

/* A cached prefix: a few new tokens after 5000 keys (1 and 3: decode rows
 * in a prefill batch; the block's other rows are padding), and a chunk
 * after an unaligned prefix. */
static void test_cached_prefix(void **state) {
    (void)state;
    NEED_SM90();
    const int q_len[] = {1, 3, 200, 129}, kv_len[] = {5001, 5003, 977, 4000};
    check_batch(8, 2, 16, q_len, kv_len, 4);
    check_batch(4, 1, 16, q_len, kv_len, 4);
}

/* Pages of 64 (a tile is 2 pages), 128 (one) and 256 (half of one). */
static void test_page_sizes(void **state) {
    (void)state;
    NEED_SM90();
    const int q_len[] = {1, 3, 300, 130, 1000}, kv_len[] = {5001, 5003, 300, 1000, 1000};
    check_batch(8, 2, 64, q_len, kv_len, 5);
    check_batch(8, 2, 128, q_len, kv_len, 5);
    check_batch(8, 2, 256, q_len, kv_len, 5);
}

/* What the kernel does not take, it refuses (and says so beforehand). */
static void test_unsupported(void **state) {
    (void)state;
    NEED_SM90();
    assert_true(rp_attn_prefill_sm90_supported(128, 16));
    assert_true(rp_attn_prefill_sm90_supported(128, 64));
    assert_false(rp_attn_prefill_sm90_supported(64, 16));
    assert_false(rp_attn_prefill_sm90_supported(128, 8));
    assert_false(rp_attn_prefill_sm90_supported(128, 48));
    const int q_len[] = {5}, kv_len[] = {5};
    batch b;
    batch_make(&b, 4, 2, 16, q_len, kv_len, 1);
    rp_attn_meta m = batch_meta(&b);
    uint16_t *d_out = dalloc((size_t)5 * 4 * 128 * 2);
    assert_int_equal(rp_k_attn_prefill_sm90(b.d_qkv, b.d_k, b.d_v, m, d_out, 5, 1, 5, 5, 4, 2, 64, 0),
                     cudaErrorInvalidValue);
    m.page_size = 8;
    assert_int_equal(rp_k_attn_prefill_sm90(b.d_qkv, b.d_k, b.d_v, m, d_out, 5, 1, 5, 5, 4, 2, 128, 0),
                     cudaErrorInvalidValue);
    CU(cudaDeviceSynchronize());
    cudaFree(d_out);
    batch_free(&b);
}

int main(void) {
    const char *env = getenv("REPLAY_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : TEST_SEED;
    printf("test_cuda_attn_sm90: seed %llu (REPLAY_TEST_SEED=N runs another)\n", (unsigned long long)g_seed);
    if (getenv("REPLAY_TEST_SKIP")) cmocka_set_skip_filter(getenv("REPLAY_TEST_SKIP"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_qk),     cmocka_unit_test(test_layout_pv),
        cmocka_unit_test(test_single_sequence), cmocka_unit_test(test_batch_gqa),
        cmocka_unit_test(test_cached_prefix), cmocka_unit_test(test_page_sizes),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no CUDA toolkit at build time */

static void test_no_cuda(void **state) {
    (void)state;
    printf("built without CUDA: skipping sm_90a attention tests\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_cuda)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
