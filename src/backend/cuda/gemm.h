/* Matrix products for the CUDA backend: y[T][N] = x[T][K] . W[N][K]^T.
 *
 * Small T (decode) goes to replay's GEMV kernel, which streams W once near
 * HBM bandwidth; larger T goes to cuBLASLt (tensor cores). cuBLASLt
 * descriptors and the chosen algorithm are cached per shape, so a prefill
 * step pays the heuristic once and graph capture records plain launches. */
#ifndef RP_BACKEND_CUDA_GEMM_H
#define RP_BACKEND_CUDA_GEMM_H

#include <cublasLt.h>

#include "backend/cuda/kernels.h"
#include "util/err.h"

#define RP_GEMM_CACHE 96

typedef struct rp_gemm_plan {
    int T, N, K, out_f32;
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
    int force_lt; /* bench/tests: use cuBLASLt even for small T */
} rp_gemm;

int rp_gemm_init(rp_gemm *g, size_t workspace_bytes, rp_err *err);
void rp_gemm_destroy(rp_gemm *g);
/* y is bf16 ([T][N]) unless out_f32, then fp32. */
int rp_gemm_run(rp_gemm *g, const rp_bf16 *W, const rp_bf16 *x, void *y, int T, int N, int K, int out_f32,
                cudaStream_t stream, rp_err *err);

#endif
