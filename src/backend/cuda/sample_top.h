/* Top logprobs on the device (kernels/sample.cu): the sampling kernel that
 * also reports how many tokens each row's draw was made from, and the kernel
 * that finds each row's most likely tokens and their logprobs. Both read and
 * write only fixed device buffers (graph safe); only the small
 * rp_top_logprobs rows leave the GPU. */
#ifndef RP_BACKEND_CUDA_SAMPLE_TOP_H
#define RP_BACKEND_CUDA_SAMPLE_TOP_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/sample_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the sampling kernel also puts each row's token and logprob: the
 * host's pinned result buffer of the step's slot, mapped (rows[*slot & 1]:
 * the tokens, then the logprobs stride entries further), so that no copy
 * follows the kernel (a copy node costs ~8 us a step: bench/RESULTS.md).
 * The slot is read when the kernel runs, so a graph
 * serves both. */
typedef struct rp_sample_host {
    int32_t *rows[2];
    const int32_t *slot;
    int stride;
} rp_sample_host;

/* rp_k_sample, and kept[r] (when kept != NULL): how many tokens of the
 * sampling order (logit descending, id ascending) row r's draw was made
 * from, i.e. survived top-k, top-p and min-p; vocab for greedy rows. It is
 * computed (at a cost only on the exact slow path) for rows with
 * params[r].top_logprobs > 0; other rows' entries may be left unwritten.
 * host (nullable): tokens and logprobs also go there. skip (nullable, on the
 * device): where *skip != 0 when the kernel runs, it does nothing (a
 * captured step whose sampling waits for token masks: the step's metadata
 * says so, cuda_backend.c). */
int rp_k_sample_kept(const float *logits, const rp_sampling_params *params, int32_t *tokens, float *logprobs,
                     int32_t *kept, const rp_sample_host *host, const int32_t *skip, void *workspace, int rows,
                     int vocab, cudaStream_t stream);

/* After rp_k_sample_kept on the same rows: top[r] = the min(top_logprobs,
 * vocab) first tokens of row r's sampling order, with their logprobs under
 * the distribution logprobs[r] was computed from (docs/sampling.md): greedy
 * rows the log-softmax at temperature 1, sampled rows the renormalised
 * distribution the token was drawn from, -inf for tokens outside it. Rows
 * with top_logprobs == 0 get n = 0 and cost one block that returns at once.
 * logprobs and kept must be the sampling kernel's outputs (not NULL). skip:
 * as rp_k_sample_kept's. */
int rp_k_top_logprobs(const float *logits, const rp_sampling_params *params, const int32_t *tokens,
                      const float *logprobs, const int32_t *kept, rp_top_logprobs *top, const int32_t *skip,
                      int rows, int vocab, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
