/* Shared by the GPU tests: checked CUDA calls (a failure fails the test with
 * the call named) and device buffers poisoned with 0xff (bf16/fp32 NaN) so
 * an unwritten output never passes. Include after cmocka (test_util.h). */
#ifndef RP_TEST_CUDA_UTIL_H
#define RP_TEST_CUDA_UTIL_H

#include <cuda_runtime_api.h>

#define CU(call)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) fail_msg("%s: %s (line %d)", #call, cudaGetErrorString(e_), __LINE__); \
    } while (0)

/* A launcher's result, then the kernel's own completion. */
#define LAUNCH(call)                                                                                  \
    do {                                                                                              \
        int r_ = (call);                                                                              \
        if (r_ != 0) fail_msg("%s: %s (line %d)", #call, cudaGetErrorString((cudaError_t)r_), __LINE__); \
        CU(cudaDeviceSynchronize());                                                                  \
    } while (0)

static inline void *dalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 16));
    CU(cudaMemset(p, 0xff, bytes ? bytes : 16));
    return p;
}
static inline void *dup_to_dev(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static inline void to_host(void *h, const void *d, size_t bytes) {
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

#endif
