/* Counted device allocation. */
#include "backend/cuda/cuda_util.h"

#include <stdatomic.h>

static atomic_uint_fast64_t g_allocs;

int rp_cuda_malloc(void **ptr, size_t bytes, const char *what, rp_err *err) {
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        return rp_errf(err, "cannot allocate %.2f GiB of GPU memory for %s (%.2f GiB free): %s",
                       (double)bytes / (1 << 30), what, (double)free_b / (1 << 30), cudaGetErrorString(e));
    }
    atomic_fetch_add(&g_allocs, 1);
    return 0;
}

void rp_cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

uint64_t rp_cuda_alloc_count(void) { return atomic_load(&g_allocs); }
