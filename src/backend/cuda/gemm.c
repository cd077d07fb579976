/* GEMV/cuBLASLt dispatch and the cuBLASLt plan cache. */
#include "backend/cuda/gemm.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_util.h"

#define LT_TRY(call, err)                                                                       \
    do {                                                                                        \
        cublasStatus_t s_ = (call);                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                        \
            return rp_errf((err), "%s failed: cuBLAS status %d (%s:%d)", #call, (int)s_, __FILE__, __LINE__); \
    } while (0)

int rp_gemm_init(rp_gemm *g, size_t workspace_bytes, rp_err *err) {
    memset(g, 0, sizeof *g);
    LT_TRY(cublasLtCreate(&g->lt), err);
    g->workspace_bytes = workspace_bytes;
    return rp_cuda_malloc(&g->workspace, workspace_bytes, "cuBLASLt workspace", err);
}

static void plan_destroy(rp_gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

void rp_gemm_destroy(rp_gemm *g) {
    for (int i = 0; i < g->num_plans; i++) plan_destroy(&g->plans[i]);
    rp_cuda_free(g->workspace);
    if (g->lt) cublasLtDestroy(g->lt);
    memset(g, 0, sizeof *g);
}

/* Row-major y[T][N] = x[T][K] W[N][K]^T is, in cuBLAS's column-major terms,
 * C(N x T) = op(A) B with A = W viewed as K x N (transposed) and B = x
 * viewed as K x T. */
/* FP8 (fp8 = RP_GEMM_FP8_RAW): A and B are e4m3 without scales and the
 * output fp32 (the raw sums: the caller applies the per-row and per-token
 * scales, which cuBLASLt's outer-vector mode would, but it has no Hopper
 * algorithm for it), in the layout cuBLASLt's FP8 takes on Hopper (A
 * transposed, B not: "TN"). RP_GEMM_FP8_BLOCKS: the same with A's 128 x
 * 128 block scales and B's 1 x 128 group scales applied by cuBLASLt (their
 * pointers are set per call: rp_gemm_run_fp8_blocks), output bf16 or fp32.
 * RP_GEMM_FP8_OUTER: a scale per row of W and per token (outer vectors),
 * likewise. */
static int make_plan_in(rp_gemm *g, rp_gemm_plan *p, int T, int N, int K, int out_f32, int fp8, rp_err *err) {
    memset(p, 0, sizeof *p);
    p->T = T;
    p->N = N;
    p->K = K;
    p->out_f32 = out_f32;
    p->fp8 = fp8;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), err);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), err);
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), err);
    if (fp8 == RP_GEMM_FP8_BLOCKS || fp8 == RP_GEMM_FP8_OUTER) {
        const int outer = fp8 == RP_GEMM_FP8_OUTER;
        const int32_t a_mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                     : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      b_mode = outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode), err);
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode), err);
        /* The heuristic refuses these modes without scale pointers (status 7,
         * "requires a custom pointer"): any device address will do until
         * rp_gemm_run_fp8_blocks sets the call's own. */
        const void *any = g->workspace;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof any), err);
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof any), err);
    }
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    LT_TRY(cublasLtMatrixLayoutCreate(&p->a, in, (uint64_t)K, (uint64_t)N, K), err);
    LT_TRY(cublasLtMatrixLayoutCreate(&p->b, in, (uint64_t)K, (uint64_t)T, K), err);
    LT_TRY(cublasLtMatrixLayoutCreate(&p->c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)N, (uint64_t)T, N), err);
    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), err);
    size_t ws = g->workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        return rp_errf(err, "cuBLASLt has no %salgorithm for %dx%dx%d (status %d)",
                       fp8 == RP_GEMM_FP8_BLOCKS  ? "block-scaled FP8 "
                       : fp8 == RP_GEMM_FP8_OUTER ? "outer-vector scaled FP8 "
                       : fp8                      ? "FP8 "
                                                  : "",
                       T, N, K, (int)st);
    p->algo = res.algo;
    return 0;
}

static int make_plan(rp_gemm *g, rp_gemm_plan *p, int T, int N, int K, int out_f32, int fp8, rp_err *err) {
    if (!make_plan_in(g, p, T, N, K, out_f32, fp8, err)) return 0;
    plan_destroy(p); /* what was made before the failure */
    return RP_ERR;
}

static rp_gemm_plan *find_plan(rp_gemm *g, int T, int N, int K, int out_f32, int fp8, rp_err *err) {
    for (int i = 0; i < g->num_plans; i++) {
        rp_gemm_plan *p = &g->plans[i];
        if (p->T == T && p->N == N && p->K == K && p->out_f32 == out_f32 && p->fp8 == fp8) return p;
    }
    rp_gemm_plan *p;
    if (g->num_plans < RP_GEMM_CACHE) {
        p = &g->plans[g->num_plans++];
    } else { /* prefill with many distinct lengths: recycle round-robin */
        p = &g->plans[g->next_evict];
        g->next_evict = (g->next_evict + 1) % RP_GEMM_CACHE;
        plan_destroy(p);
    }
    if (make_plan(g, p, T, N, K, out_f32, fp8, err)) {
        memset(p, 0, sizeof *p);
        p->T = -1;
        return NULL;
    }
    return p;
}

int rp_gemm_algo_sweep(rp_gemm *g, const void *W, const void *x, void *y, int T, int N, int K, int out_f32, int fp8,
                       int max, float *us, int *identical, int *splitk, rp_err *err) {
    enum { MAX_ALGOS = 32, WARM = 3, REPS = 20 };
    if (max > MAX_ALGOS) max = MAX_ALGOS;
    if (fp8 == RP_GEMM_FP8_RAW) out_f32 = 1;
    rp_gemm_plan p;
    if (make_plan(g, &p, T, N, K, out_f32, fp8, err)) return -1;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int found = 0, n = -1;
    const size_t bytes = (size_t)T * N * (out_f32 ? 4 : 2);
    void *ref = malloc(bytes), *got = malloc(bytes);
    float *scales = NULL; /* the outer mode's: zeros, N for W then T for x */
    cudaEvent_t e0 = NULL, e1 = NULL;
    const float alpha = 1.0f, beta = 0.0f;
    if (!ref || !got) {
        rp_errf(err, "out of memory");
        goto out;
    }
    if (fp8 == RP_GEMM_FP8_OUTER) {
        if (cudaMalloc((void **)&scales, (size_t)(N + T) * sizeof(float)) != cudaSuccess ||
            cudaMemset(scales, 0, (size_t)(N + T) * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            rp_errf(err, "cudaMalloc of %d scales failed", N + T);
            goto out;
        }
        const float *sw = scales, *sx = scales + N;
        if (cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw) ||
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx)) {
            rp_errf(err, "cuBLASLt refused the scale pointers");
            goto out;
        }
    } else if (fp8 != RP_GEMM_BF16 && fp8 != RP_GEMM_FP8_RAW) {
        rp_errf(err, "the algorithm sweep takes bf16, raw FP8 or outer-vector FP8 products");
        goto out;
    }
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) {
        rp_errf(err, "cublasLtMatmulPreferenceCreate failed");
        goto out;
    }
    size_t ws = g->workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    /* FP8: half the room for the split-K variants below */
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(g->lt, p.desc, p.a, p.b, p.c, p.c, pref, fp8 ? max / 2 : max, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        rp_errf(err, "cuBLASLt has no algorithm for %dx%dx%d", T, N, K);
        goto out;
    }
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        rp_errf(err, "cudaEventCreate failed");
        goto out;
    }
    /* split-K variants of the first candidates (FP8: few tiles along N
     * at decode's token counts), reduced through the workspace in fp32 (a
     * fixed order, unlike the in-place scheme's) */
    int total = found;
    for (int i = 0; i < found && i < 4 && fp8; i++)
        for (int32_t sk = 2; sk <= 16 && total < max; sk *= 2) {
            cublasLtMatmulAlgo_t a = res[i].algo;
            const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            cublasLtMatmulHeuristicResult_t chk;
            if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ||
                cublasLtMatmulAlgoCheck(g->lt, p.desc, p.a, p.b, p.c, p.c, &a, &chk) ||
                chk.workspaceSize > g->workspace_bytes)
                continue;
            res[total].algo = a;
            if (splitk) splitk[total] = sk;
            total++;
        }
    for (int i = 0; i < total; i++) {
        if (splitk && i < found) splitk[i] = 1;
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r < WARM + REPS && s == CUBLAS_STATUS_SUCCESS; r++) {
            if (r == WARM) cudaEventRecord(e0, 0);
            s = cublasLtMatmul(g->lt, p.desc, &alpha, W, p.a, x, p.b, &beta, y, p.c, y, p.c, &res[i].algo,
                               g->workspace, g->workspace_bytes, 0);
        }
        cudaEventRecord(e1, 0);
        float ms = 0;
        if (s != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess ||
            cudaMemcpy(i ? got : ref, y, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
            rp_errf(err, "cuBLASLt candidate %d of %dx%dx%d failed", i, T, N, K);
            goto out;
        }
        us[i] = ms * 1e3f / REPS;
        identical[i] = i == 0 || memcmp(ref, got, bytes) == 0;
    }
    n = total;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (scales) cudaFree(scales);
    free(ref);
    free(got);
    plan_destroy(&p);
    return n;
}

int rp_gemm_uses_gemv(const rp_gemm *g, int T, int N, int K) {
    (void)g;
    return T <= RP_GEMV_MAX_T && (T <= 1 || (long long)N * K < RP_GEMM_LT_ELEMS);
}

int rp_gemm_run(rp_gemm *g, const rp_bf16 *W, const rp_bf16 *x, void *y, int T, int N, int K, int out_f32,
                cudaStream_t stream, rp_err *err) {
    if (rp_gemm_uses_gemv(g, T, N, K)) {
        if (out_f32) RP_LAUNCH(rp_k_gemv_f32out(W, x, y, T, N, K, stream), err);
        else RP_LAUNCH(rp_k_gemv(W, x, y, T, N, K, stream), err);
        return 0;
    }
    rp_gemm_plan *p = find_plan(g, T, N, K, out_f32, 0, err);
    if (!p) return RP_ERR;
    const float alpha = 1.0f, beta = 0.0f;
    LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, W, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                          g->workspace, g->workspace_bytes, stream),
           err);
    return 0;
}

int rp_gemm_run_fp8(rp_gemm *g, const uint8_t *W, const uint8_t *xq, float *y, int T, int N, int K,
                    cudaStream_t stream, rp_err *err) {
    rp_gemm_plan *p = find_plan(g, T, N, K, 1, RP_GEMM_FP8_RAW, err);
    if (!p) return RP_ERR;
    const float alpha = 1.0f, beta = 0.0f;
    LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, W, p->a, xq, p->b, &beta, y, p->c, y, p->c, &p->algo,
                          g->workspace, g->workspace_bytes, stream),
           err);
    return 0;
}

int rp_gemm_fp8_supported(rp_gemm *g, int T, int N, int K, rp_err *err) {
    rp_gemm_plan p;
    if (make_plan(g, &p, T, N, K, 1, RP_GEMM_FP8_RAW, err)) return 0;
    plan_destroy(&p);
    return 1;
}

/* Both scaled modes: the scales belong to this matrix and these
 * activations, set on the cached descriptor before each launch (a captured
 * graph keeps them). */
static int run_scaled(rp_gemm *g, rp_gemm_plan *p, const uint8_t *W, const float *sw, const uint8_t *xq,
                      const float *sx, void *y, cudaStream_t stream, rp_err *err) {
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw), err);
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx), err);
    const float alpha = 1.0f, beta = 0.0f;
    LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, W, p->a, xq, p->b, &beta, y, p->c, y, p->c, &p->algo,
                          g->workspace, g->workspace_bytes, stream),
           err);
    return 0;
}

int rp_gemm_run_fp8_outer(rp_gemm *g, const uint8_t *W, const float *sw, const uint8_t *xq, const float *sx, void *y,
                          int T, int N, int K, int out_f32, cudaStream_t stream, rp_err *err) {
    rp_gemm_plan *p = find_plan(g, T, N, K, out_f32, RP_GEMM_FP8_OUTER, err);
    return p ? run_scaled(g, p, W, sw, xq, sx, y, stream, err) : RP_ERR;
}

int rp_gemm_fp8_outer_supported(rp_gemm *g, int T, int N, int K, int out_f32, rp_err *err) {
    rp_gemm_plan p;
    if (make_plan(g, &p, T, N, K, out_f32, RP_GEMM_FP8_OUTER, err)) return 0;
    plan_destroy(&p);
    return 1;
}

static int blocks_t_ok(int T, rp_err *err) {
    if (T > 0 && T % RP_GEMM_FP8_BLOCKS_T_ALIGN == 0) return 1;
    rp_errf(err, "block-scaled FP8 matmul of %d tokens: the count must be padded to a multiple of %d", T,
            RP_GEMM_FP8_BLOCKS_T_ALIGN);
    return 0;
}

int rp_gemm_run_fp8_blocks(rp_gemm *g, const uint8_t *W, const float *grid, const uint8_t *xq, const float *sx,
                           void *y, int T, int N, int K, int out_f32, cudaStream_t stream, rp_err *err) {
    if (!blocks_t_ok(T, err)) return RP_ERR;
    rp_gemm_plan *p = find_plan(g, T, N, K, out_f32, RP_GEMM_FP8_BLOCKS, err);
    return p ? run_scaled(g, p, W, grid, xq, sx, y, stream, err) : RP_ERR;
}

int rp_gemm_fp8_blocks_supported(rp_gemm *g, int T, int N, int K, int out_f32, rp_err *err) {
    if (!blocks_t_ok(T, err)) return 0;
    rp_gemm_plan p;
    if (make_plan(g, &p, T, N, K, out_f32, RP_GEMM_FP8_BLOCKS, err)) return 0;
    plan_destroy(&p);
    return 1;
}
