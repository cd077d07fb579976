/* Structured output's token masks on the device (kernels/token_mask.cu):
 * the kernel that sampling with masks (cuda_backend.c's sample_masked)
 * runs before the sampling kernels. Reads and writes device buffers only. */
#ifndef RP_BACKEND_CUDA_TOKEN_MASK_H
#define RP_BACKEND_CUDA_TOKEN_MASK_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* For r < rows with mask_of_row[r] >= 0: logits[r][id] = -inf for every
 * id < vocab whose bit (bit id % 32 of word id / 32) in mask row
 * mask_of_row[r] of masks (rows `words` apart: backend.h's
 * rp_token_mask_words) is 0; rows with -1 are left as they are. The CPU
 * reference is rp_sampler_apply_mask (src/engine/sampler.c). */
int rp_k_apply_token_mask(float *logits, const int32_t *mask_of_row, const uint32_t *masks, int rows, int vocab,
                          int words, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
