/* Per-row sampling parameters a backend can apply on the device, so that
 * only token ids leave the GPU. Plain C: shared by the engine, the backends
 * and the CUDA kernels. Penalties need the request's token history and stay
 * on the host sampler (src/engine/sampler.c). */
#ifndef RP_BACKEND_SAMPLE_PARAMS_H
#define RP_BACKEND_SAMPLE_PARAMS_H

#include <stdint.h>

typedef struct rp_sample_params {
    float temperature; /* 0 = greedy */
    float top_p;       /* 1 = off */
    int32_t top_k;     /* <= 0 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    uint64_t step;     /* RNG counter: index of the token being generated */
} rp_sample_params;

#endif
