/* Token references for overlapped steps (token_refs.cu). */
#ifndef RP_BACKEND_CUDA_TOKEN_REFS_H
#define RP_BACKEND_CUDA_TOKEN_REFS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* tokens[i] < 0 becomes prev_sampled[-tokens[i] - 1], in place, i < T. */
int rp_k_resolve_token_refs(int32_t *tokens, const int32_t *prev_sampled, int T, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
