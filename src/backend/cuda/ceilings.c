/* The matrix-multiply ceiling measured on this device, for benchmarks that
 * print a workload's lower bound on time: a large bf16 GEMM through the same
 * cuBLASLt path prefill uses. */
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gemm.h"

int rp_cuda_matmul_tflops(int device, double *tflops) {
    const int M = 8192, N = 8192, K = 8192;
    rp_err err;
    rp_gemm g;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    float best = 1e30f;
    if (cudaSetDevice(device) != cudaSuccess) return -1;
    if (rp_gemm_init(&g, 64u << 20, &err)) return -1;
    if (cudaMalloc(&a, (size_t)M * K * 2) != cudaSuccess || cudaMalloc(&b, (size_t)N * K * 2) != cudaSuccess ||
        cudaMalloc(&c, (size_t)M * N * 2) != cudaSuccess)
        goto out;
    /* random-ish non-zero data: zeros run faster than real data (METHOD.md) */
    if (rp_k_fill_dummy(a, (int64_t)M * K, 1, 1, 1.0f, 0, 0) != cudaSuccess ||
        rp_k_fill_dummy(b, (int64_t)N * K, 1, 2, 1.0f, 0, 0) != cudaSuccess)
        goto out;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int rep = 0; rep < 6; rep++) {
        cudaEventRecord(e0, 0);
        if (rp_gemm_run(&g, b, a, c, M, N, K, 0, 0, &err)) goto out;
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (rep > 0 && ms < best) best = ms;
    }
    *tflops = 2.0 * M * N * (double)K / (best * 1e-3) / 1e12;
    rc = 0;
out:
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    rp_gemm_destroy(&g);
    return rc;
}
