/* Structured output's token masks on the device: before a deferred step is
 * sampled (cuda_backend.c's sample_masked), the logit of every token that a
 * row's mask does not allow becomes -inf, so the sampling kernels draw from
 * the masked distribution and report its logprobs, as the host sampler does
 * after rp_sampler_apply_mask (its CPU reference, src/engine/sampler.c).
 *
 * One thread per token: the 32 threads of a warp read the same mask word
 * (one broadcast load) and only the disallowed tokens are written, so a row
 * costs a read of its mask (19 KB at a 152k vocabulary) and the writes of
 * the tokens it removes. Rows without a mask return at once. */
#include "backend/cuda/token_mask.h"
#include "common.cuh"

#define TM_THREADS 256
#define TM_TOKENS_PER_THREAD 8 /* grid.x = vocab / 2048: ~75 blocks a row at 152k */

__global__ void __launch_bounds__(TM_THREADS)
    apply_token_mask_kernel(float *logits, const int32_t *__restrict__ mask_of_row,
                            const uint32_t *__restrict__ masks, int vocab, int words) {
    rp_pdl_trigger(); /* the sampling kernels after it may be placed now; they wait for its writes */
    rp_pdl_wait();    /* a no-op here (an ordinary launch), kept so that a PDL launch stays correct */
    const int r = blockIdx.y, m = mask_of_row[r];
    if (m < 0) return;
    const uint32_t *mask = masks + (int64_t)m * words;
    float *row = logits + (int64_t)r * vocab;
    for (int id = blockIdx.x * TM_THREADS + threadIdx.x; id < vocab; id += gridDim.x * TM_THREADS)
        if (!(mask[id >> 5] >> (id & 31) & 1u)) row[id] = -INFINITY;
}

extern "C" int rp_k_apply_token_mask(float *logits, const int32_t *mask_of_row, const uint32_t *masks, int rows,
                                     int vocab, int words, cudaStream_t stream) {
    if (rows <= 0) return cudaSuccess;
    if (vocab <= 0 || rows > 65535 || words * 32 < vocab || !logits || !mask_of_row || !masks)
        return (int)cudaErrorInvalidValue;
    const int per_block = TM_THREADS * TM_TOKENS_PER_THREAD;
    /* An ordinary launch, not rp_launch's PDL: in sample_masked it follows a
     * wait for the mask upload on another stream, which must hold in full
     * (the sampling kernels after it may still start early on it). */
    apply_token_mask_kernel<<<dim3((vocab + per_block - 1) / per_block, rows), TM_THREADS, 0, stream>>>(
        logits, mask_of_row, masks, vocab, words);
    return rp_launch_result();
}
