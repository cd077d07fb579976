/* Sampling parameters: one struct for the engine, the host sampler
 * (src/engine/sampler.c, which owns their meaning, vLLM's, and validates
 * them) and the backends, which take one per logit row so that a device
 * samples and only token ids leave it. Plain C, read by the CUDA kernels.
 * The penalties need the request's token history: a device sampler ignores
 * them, and the engine samples a request that sets them on the host. */
#ifndef RP_BACKEND_SAMPLE_PARAMS_H
#define RP_BACKEND_SAMPLE_PARAMS_H

#include <stdint.h>

#include "replay/limits.h"

typedef struct rp_sampling_params {
    float temperature;        /* 0 = greedy; default 1.0; must be >= 0 and finite */
    float top_p;              /* (0, 1]; 1 = off */
    int32_t top_k;            /* -1 or 0 = off; else >= 1 (larger than the vocab = off) */
    float min_p;              /* [0, 1]; 0 = off */
    uint64_t seed;            /* always used: the engine draws one at submit for
                                 requests that did not set one */
    uint64_t step;            /* RNG counter: index of the token being generated (per row, in a batch) */
    int32_t top_logprobs;     /* [0, RP_MAX_TOP_LOGPROBS]: most likely tokens to report with their logprobs */
    int32_t has_seed;         /* whether the user set seed (informational) */
    float repetition_penalty; /* > 0; 1 = off. Prompt AND generated tokens:
                                 logit > 0 ? logit / p : logit * p */
    float presence_penalty;   /* [-2, 2]; generated tokens only: logit -= p if count > 0 */
    float frequency_penalty;  /* [-2, 2]; generated tokens only: logit -= p * count */
} rp_sampling_params;

/* The top_logprobs most likely tokens of one sampled row, most likely first
 * (ties: lower id first), with their logprobs under the same distribution as
 * the sampled token's logprob (docs/sampling.md). n = 0 when none were asked. */
typedef struct rp_top_logprobs {
    int32_t n;
    int32_t ids[RP_MAX_TOP_LOGPROBS];
    float logprobs[RP_MAX_TOP_LOGPROBS];
} rp_top_logprobs;

#endif
