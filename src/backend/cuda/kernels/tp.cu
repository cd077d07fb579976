/* Tensor parallelism's two kernels (docs/tensor-parallel.md): the
 * embedding of one vocabulary shard (zeros for the other ranks' tokens,
 * summed over the ranks by the all-reduce after it), and the gathered logit
 * shards laid out as the whole vocabulary for sampling and read_logits.
 * Both move little memory; plain loops. */
#include "common.cuh"

#define TP_THREADS 256

__global__ void embed_shard_kernel(const uint16_t *__restrict__ embed, const int32_t *__restrict__ tokens,
                                   const int32_t *prev_sampled, float *__restrict__ residual, int64_t vocab_start,
                                   int64_t vocab_count, int H) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int t = blockIdx.x;
    const int64_t row = (int64_t)rp_step_token(tokens, prev_sampled, t) - vocab_start;
    float *dst = residual + (int64_t)t * H;
    if (row < 0 || row >= vocab_count) { /* block-uniform */
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = 0.0f;
        return;
    }
    const uint16_t *src = embed + row * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = rp_bf16_f32(src[i]);
}

extern "C" int rp_k_embed_shard(const rp_bf16 *embed, const int32_t *tokens, const int32_t *prev_sampled,
                                float *residual, int64_t vocab_start, int64_t vocab_count, int T, int H,
                                cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    return rp_launch(embed_shard_kernel, dim3(T), dim3(TP_THREADS), 0, stream, embed, tokens, prev_sampled, residual,
                     vocab_start, vocab_count, H);
}

/* grid (column blocks, rows) */
__global__ void unshard_logits_kernel(const float *__restrict__ gathered, float *__restrict__ logits, int rows,
                                      int vocab_per_rank, int vocab) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int i = blockIdx.y;
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= vocab) return;
    const int k = v / vocab_per_rank, j = v - k * vocab_per_rank;
    logits[(int64_t)i * vocab + v] = gathered[((int64_t)k * rows + i) * vocab_per_rank + j];
}

extern "C" int rp_k_tp_unshard_logits(const float *gathered, float *logits, int rows, int ranks, int vocab_per_rank,
                                      int vocab, cudaStream_t stream) {
    if (rows <= 0) return cudaSuccess;
    if (vocab > (int64_t)ranks * vocab_per_rank) return (int)cudaErrorInvalidValue;
    return rp_launch(unshard_logits_kernel, dim3((vocab + TP_THREADS - 1) / TP_THREADS, rows), dim3(TP_THREADS), 0,
                     stream, gathered, logits, rows, vocab_per_rank, vocab);
}
