/* Matrix products for the CUDA backend: y[T][N] = x[T][K] . W[N][K]^T.
 *
 * Small T (decode) goes to replay's GEMV kernel, which streams W once near
 * HBM bandwidth; larger T, and from 2 tokens the large matrices
 * (RP_GEMM_LT_ELEMS), go to cuBLASLt (tensor cores). The choice depends on
 * T and the shape only, so a graph and an eager run agree. cuBLASLt
 * descriptors and the chosen algorithm are cached per shape, so a prefill
 * step pays the heuristic once and graph capture records plain launches. */
#ifndef RP_BACKEND_CUDA_GEMM_H
#define RP_BACKEND_CUDA_GEMM_H

#include <cublasLt.h>

#include "backend/cuda/kernels.h"
#include "util/err.h"

#define RP_GEMM_CACHE 96
/* From 2 tokens, matrices of at least this many elements go to cuBLASLt:
 * at 2-8 tokens it streams them faster than the GEMV (H100: llama3-8b
 * 7.13 -> 6.62 ms per step at batch 8, qwen3-4b 4.82 -> 4.43, llama3.2-1b
 * 1.50 -> 1.45; H200, the chain at batch 2: llama3-8b 5.07 -> 4.91,
 * qwen3-8b 5.24 -> 4.98, llama3.2-1b 1.14 -> 1.07), while the GEMV stays
 * ahead on the small ones (qwen3-0.6b's 1024 x 6144 gate_up: all of it
 * through cuBLASLt took batch 8 1.36 -> 1.49 ms; qwen3-4b's 2560 x 4096 o
 * is faster through cuBLASLt). One token stays on the GEMV.
 * bench/RESULTS.md. */
#define RP_GEMM_LT_ELEMS (8LL << 20)
/* FP8 with row scales (W8A8, past the fp8 GEMV): from this many tokens
 * cuBLASLt applies both scales itself (rp_gemm_run_fp8_outer); below, its
 * raw sums and rp_k_scale_outer's pass are faster, its outer-vector
 * algorithms being slow at few tokens. llama3-8b decode on an H200, ms a
 * step raw+pass / outer: batch 32 5.37 / 6.41, 64 6.31 / 6.78, 128 8.30 /
 * 8.08, 256 12.62 / 11.88; 16 x 4096-token prefill 10.77 / 12.24
 * requests/s (bench/RESULTS.md). */
#define RP_FP8_OUTER_MIN_T 128

/* A plan's kind of product (rp_gemm_plan.fp8). */
enum { RP_GEMM_BF16 = 0, RP_GEMM_FP8_RAW = 1, RP_GEMM_FP8_BLOCKS = 2, RP_GEMM_FP8_OUTER = 3 };

typedef struct rp_gemm_plan {
    int T, N, K, out_f32, fp8; /* fp8: RP_GEMM_* */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} rp_gemm_plan;

typedef struct rp_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    rp_gemm_plan plans[RP_GEMM_CACHE];
    int num_plans, next_evict;
} rp_gemm;

int rp_gemm_init(rp_gemm *g, size_t workspace_bytes, rp_err *err);
void rp_gemm_destroy(rp_gemm *g);
/* Whether y = x W^T for T tokens and an N x K matrix runs the GEMV. */
int rp_gemm_uses_gemv(const rp_gemm *g, int T, int N, int K);
/* For tuning (`replay bench kernels --gemm-algos`): times up to max of
 * cuBLASLt's candidates for this shape, in its heuristic order (candidate
 * 0 is what rp_gemm_run uses), each the mean of 20 runs after 3; us[i] its
 * time, identical[i] whether its output is bit-identical to candidate 0's
 * (the same sums: swapping it in would change no result). fp8
 * (RP_GEMM_FP8_RAW or RP_GEMM_FP8_OUTER; W and x then e4m3 bytes, the
 * outer mode's scales zeros): the FP8 products' candidates, then split-K
 * variants of the first four (splitk[i], if not NULL: 1, or the split).
 * Returns how many were timed, or -1 with err. */
int rp_gemm_algo_sweep(rp_gemm *g, const void *W, const void *x, void *y, int T, int N, int K, int out_f32, int fp8,
                       int max, float *us, int *identical, int *splitk, rp_err *err);
/* y is bf16 ([T][N]) unless out_f32, then fp32. */
int rp_gemm_run(rp_gemm *g, const rp_bf16 *W, const rp_bf16 *x, void *y, int T, int N, int K, int out_f32,
                cudaStream_t stream, rp_err *err);
/* FP8 tensor cores (cuBLASLt, always): the raw sums y[t][n] = sum_k
 * xq[t][k] W[n][k] in fp32, W and xq e4m3 ([N][K], [T][K]) without scales
 * (the caller's: rp_k_scale_outer). K % 16 == 0. */
int rp_gemm_run_fp8(rp_gemm *g, const uint8_t *W, const uint8_t *xq, float *y, int T, int N, int K,
                    cudaStream_t stream, rp_err *err);
/* Whether cuBLASLt has such an FP8 algorithm for this product: 0 with err
 * saying why not. */
int rp_gemm_fp8_supported(rp_gemm *g, int T, int N, int K, rp_err *err);
/* FP8 with a scale per weight row and per token applied by cuBLASLt
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both, Hopper only): y[t][n]
 * = sum_k xq[t][k] W[n][k] * sx[t] * sw[n], y bf16 or fp32; the raw sums and
 * rp_k_scale_outer's pass over them in one launch. K % 16 == 0. */
int rp_gemm_run_fp8_outer(rp_gemm *g, const uint8_t *W, const float *sw, const uint8_t *xq, const float *sx, void *y,
                          int T, int N, int K, int out_f32, cudaStream_t stream, rp_err *err);
int rp_gemm_fp8_outer_supported(rp_gemm *g, int T, int N, int K, int out_f32, rp_err *err);
/* Block-scaled FP8 tensor cores (cuBLASLt from CUDA 12.9, Hopper): y[t][n]
 * = sum_k (xq[t][k] sx) (W[n][k] grid), the scales applied inside: W's one
 * per 128 x 128 block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, the
 * grid as kernels.h lays it out), xq's one per token and 128 k
 * (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, as rp_k_quant_fp8_act_groups
 * writes them). y bf16, or fp32 with out_f32. K % 16 == 0. */
int rp_gemm_run_fp8_blocks(rp_gemm *g, const uint8_t *W, const float *grid, const uint8_t *xq, const float *sx,
                           void *y, int T, int N, int K, int out_f32, cudaStream_t stream, rp_err *err);
/* cuBLASLt (CUDA 13.0, an H200) has block-scaled algorithms for 24 and 64
 * tokens but none for 9 or 37 (status 15): callers pad the token count to a
 * multiple of this, with zero rows (rp_k_quant_fp8_act_groups' T_pad), and
 * their y has room for the pad rows. */
#define RP_GEMM_FP8_BLOCKS_T_ALIGN 8
static inline int rp_gemm_fp8_blocks_pad(int T) {
    return (T + RP_GEMM_FP8_BLOCKS_T_ALIGN - 1) / RP_GEMM_FP8_BLOCKS_T_ALIGN * RP_GEMM_FP8_BLOCKS_T_ALIGN;
}
/* Whether cuBLASLt has a block-scaled algorithm for this product (asked
 * at setup, as rp_gemm_fp8_supported): 0 with err saying why not. For
 * both, T a multiple of RP_GEMM_FP8_BLOCKS_T_ALIGN (refused otherwise). */
int rp_gemm_fp8_blocks_supported(rp_gemm *g, int T, int N, int K, int out_f32, rp_err *err);

#endif
