// Resolves token references in a step's metadata: a token id < 0 stands for
// "the token sampled in logit row -id-1 of the previous step", which the
// device already holds. This lets the engine pack and launch step N+1 before
// it has read step N's tokens back (overlap): the ids never make a round
// trip through the host. Launched after the metadata copy and before the
// step's kernels, on the same stream, so it reads the previous step's
// sampled tokens before this step's sampling overwrites them.
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/token_refs.h"

__global__ void resolve_token_refs_kernel(int32_t *tokens, const int32_t *prev_sampled, int T) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T) return;
    int32_t t = tokens[i];
    if (t < 0) tokens[i] = prev_sampled[-t - 1];
}

extern "C" int rp_k_resolve_token_refs(int32_t *tokens, const int32_t *prev_sampled, int T, cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    resolve_token_refs_kernel<<<(T + 255) / 256, 256, 0, stream>>>(tokens, prev_sampled, T);
    return (int)cudaGetLastError();
}
