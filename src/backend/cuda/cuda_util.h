/* Error checking and counted device allocation for the CUDA backend.
 *
 * Every CUDA call goes through RP_CUDA_TRY, which turns a failure into an
 * rp_err naming the call. Device memory is taken only through
 * rp_cuda_malloc, which counts, so tests can assert that nothing is
 * allocated after startup (the graph-safety rule). */
#ifndef RP_BACKEND_CUDA_UTIL_H
#define RP_BACKEND_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "util/err.h"

#define RP_CUDA_TRY(call, err)                                                                         \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess)                                                                         \
            return rp_errf((err), "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

/* Kernel launchers return a cudaError_t as int. */
#define RP_LAUNCH(call, err) RP_CUDA_TRY((cudaError_t)(call), err)

int rp_cuda_malloc(void **ptr, size_t bytes, const char *what, rp_err *err);
void rp_cuda_free(void *ptr);
/* Device allocations made by this process so far (never decreases). */
uint64_t rp_cuda_alloc_count(void);

#endif
