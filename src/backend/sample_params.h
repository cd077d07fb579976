/* Per-row sampling parameters a backend can apply on the device, so that
 * only token ids leave the GPU. Plain C: shared by the engine, the backends
 * and the CUDA kernels. Penalties need the request's token history and stay
 * on the host sampler (src/engine/sampler.c). */
#ifndef RP_BACKEND_SAMPLE_PARAMS_H
#define RP_BACKEND_SAMPLE_PARAMS_H

#include <stdint.h>

#include "replay/limits.h"

typedef struct rp_sample_params {
    float temperature; /* 0 = greedy */
    float top_p;       /* 1 = off */
    int32_t top_k;     /* <= 0 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;
    uint64_t step;     /* RNG counter: index of the token being generated */
    int32_t top_logprobs; /* 0..RP_MAX_TOP_LOGPROBS: report that many most likely tokens */
} rp_sample_params;

/* The top_logprobs most likely tokens of one sampled row, most likely first
 * (ties: lower id first), with their logprobs under the same distribution as
 * the sampled token's logprob (docs/sampling.md). n = 0 when none were asked. */
typedef struct rp_top_logprobs {
    int32_t n;
    int32_t ids[RP_MAX_TOP_LOGPROBS];
    float logprobs[RP_MAX_TOP_LOGPROBS];
} rp_top_logprobs;

#endif
