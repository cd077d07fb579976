/* --quantization fp8: a bf16 matrix to e4m3 with one scale per row (the
 * weights at load; the activations of a product of many tokens, per
 * token), back to bf16, and the two scales applied to an FP8 matmul's raw
 * sums. Block-scaled fp8 (the official FP8 checkpoints' 128 x 128 blocks):
 * dummy weights quantized per block, the activations per token and 128 k
 * for cuBLASLt's block-scaled matmul, and the weights back to bf16 where
 * cuBLASLt has none. The weights' arithmetic is model/quant.c's rp_quant_fp8_rows step
 * for step (max, an exactly rounded division, the hardware's
 * round-to-nearest-even saturating conversion), so a model quantized here
 * and one quantized on the host are the same bytes. None of these runs in
 * a decode step of up to 16 tokens (the fp8 GEMV's). */
#include "common.cuh"
#include "fp8.cuh"

#define QUANT_THREADS 256

/* The block's scale from each thread's max |w| (QUANT_THREADS threads):
 * max / 448 rounded as the host divides, 1 for all zeros. */
static __device__ float block_scale(float amax) {
    __shared__ float part[QUANT_THREADS / 32];
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(RP_FULL_MASK, amax, m));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < QUANT_THREADS / 32; i++) amax = fmaxf(amax, part[i]);
    return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
}

/* One block per row: the row's max |w|, then every element over it. */
__global__ void quant_fp8_rows_kernel(const uint16_t *__restrict__ w, int64_t cols, uint8_t *__restrict__ q,
                                      float *__restrict__ scale) {
    const uint16_t *wr = w + blockIdx.x * cols;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) amax = fmaxf(amax, fabsf(rp_bf16_f32(wr[c])));
    const float s = block_scale(amax);
    if (threadIdx.x == 0) scale[blockIdx.x] = s;
    uint8_t *qr = q + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        qr[c] = rp_f32_e4m3(__fdiv_rn(rp_bf16_f32(wr[c]), s));
}

__global__ void dequant_fp8_rows_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale, int64_t rows,
                                        int64_t cols, uint16_t *__restrict__ out) {
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = rp_f32_bf16(rp_e4m3_f32(q[i]) * scale[i / cols]);
    }
}

/* Activations per token (W8A8's x, a step's T rows): the weights'
 * arithmetic (rp_quant_fp8_rows), but a row is one block's registers, read
 * once with 16-byte loads: V uint4 (8 k) a thread. The weights' kernel
 * (a row read twice with 2-byte loads, one block per row) took 10 us at
 * K = 4096 and 23 at 14336 for 32 tokens, half the FP8 product's time at
 * decode batch sizes (bench/RESULTS.md, issue 39). Launched under PDL: x
 * is the previous kernel's output. */
template <int V>
__global__ void __launch_bounds__(QUANT_THREADS) quant_fp8_act_rows_kernel(const uint16_t *__restrict__ x, int K,
                                                                           uint8_t *__restrict__ xq,
                                                                           float *__restrict__ sx) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int n8 = K / 8;
    const uint16_t *xr = x + (int64_t)blockIdx.x * K;
    uint4 v[V];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * QUANT_THREADS;
        v[j] = i < n8 ? rp_ld_act(xr + 8 * i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < V; j++) {
        const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int h = 0; h < 4; h++) amax = fmaxf(amax, fmaxf(fabsf(rp_bf16_lo(w[h])), fabsf(rp_bf16_hi(w[h]))));
    }
    const float s = block_scale(amax);
    if (threadIdx.x == 0) sx[blockIdx.x] = s;
    uint8_t *qr = xq + (int64_t)blockIdx.x * K;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = threadIdx.x + j * QUANT_THREADS;
        if (i >= n8) break;
        const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
        uint32_t q[2] = {0, 0};
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const uint32_t lo = rp_f32_e4m3(__fdiv_rn(rp_bf16_lo(w[h]), s)),
                           hi = rp_f32_e4m3(__fdiv_rn(rp_bf16_hi(w[h]), s));
            q[h / 2] |= (lo | hi << 8) << (16 * (h & 1));
        }
        *reinterpret_cast<uint2 *>(qr + 8 * i) = make_uint2(q[0], q[1]);
    }
}

/* y[t][n] = raw[t][n] * sx[t] * sw[n], fp32 or bf16 out (y may be raw).
 * Launched under PDL (raw is the matmul's output). */
template <bool F32>
__global__ void scale_outer_kernel(const float *raw, const float *__restrict__ sx, const float *__restrict__ sw,
                                   void *y, int T, int N) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = raw[i] * (sx[i / N] * sw[i % N]);
        if (F32) static_cast<float *>(y)[i] = v;
        else static_cast<uint16_t *>(y)[i] = rp_f32_bf16(v);
    }
}

/* One block of 256 threads per 128 x 128 weight block: its max |w|, then
 * every element over it (rp_quant_fp8_blocks' arithmetic). */
__global__ void quant_fp8_blocks_kernel(const uint16_t *__restrict__ w, int64_t rows, int64_t cols,
                                        uint8_t *__restrict__ q, float *__restrict__ grid, int ld) {
    const int64_t r0 = (int64_t)blockIdx.y * RP_FP8_BLOCK, c0 = (int64_t)blockIdx.x * RP_FP8_BLOCK;
    const int nr = (int)min((int64_t)RP_FP8_BLOCK, rows - r0), nc = (int)min((int64_t)RP_FP8_BLOCK, cols - c0);
    float amax = 0.0f;
    for (int i = threadIdx.x; i < nr * nc; i += blockDim.x)
        amax = fmaxf(amax, fabsf(rp_bf16_f32(w[(r0 + i / nc) * cols + c0 + i % nc])));
    const float s = block_scale(amax);
    if (threadIdx.x == 0) grid[(int64_t)blockIdx.y * ld + blockIdx.x] = s;
    for (int i = threadIdx.x; i < nr * nc; i += blockDim.x) {
        const int64_t o = (r0 + i / nc) * cols + c0 + i % nc;
        q[o] = rp_f32_e4m3(__fdiv_rn(rp_bf16_f32(w[o]), s));
    }
}

/* One warp per (token, group of 128 k), 4 k a lane. */
__global__ void quant_fp8_act_groups_kernel(const uint16_t *__restrict__ x, int T, int T_pad, int K,
                                            uint8_t *__restrict__ xq, float *__restrict__ sx, int ld) {
    const int groups = (K + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (item >= (int64_t)T_pad * groups) return; /* warp-uniform */
    const int t = (int)(item / groups), g = (int)(item % groups), lane = threadIdx.x & 31;
    const uint16_t *xr = x + (int64_t)t * K; /* read below T only: a pad row is zeros */
    float v[4], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = g * RP_FP8_BLOCK + lane * 4 + j;
        v[j] = k < K && t < T ? rp_bf16_f32(xr[k]) : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(RP_FULL_MASK, amax, m));
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (lane == 0) sx[(int64_t)g * ld + t] = s;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = g * RP_FP8_BLOCK + lane * 4 + j;
        if (k < K) xq[(int64_t)t * K + k] = rp_f32_e4m3(__fdiv_rn(v[j], s));
    }
}

__global__ void dequant_fp8_blocks_kernel(const uint8_t *__restrict__ q, const float *__restrict__ grid, int ld,
                                          int64_t rows, int64_t cols, uint16_t *__restrict__ out) {
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        out[i] = rp_f32_bf16(rp_e4m3_f32(q[i]) * grid[r / RP_FP8_BLOCK * ld + c / RP_FP8_BLOCK]);
    }
}

extern "C" int rp_k_quant_fp8_blocks(const rp_bf16 *w, int64_t rows, int64_t cols, uint8_t *q, float *grid, int ld,
                                     cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int64_t gr = (rows + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK, gc = (cols + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK;
    if (gr > 65535 || gc > 0x7fffffff || ld < gc) return (int)cudaErrorInvalidValue;
    quant_fp8_blocks_kernel<<<dim3((unsigned)gc, (unsigned)gr), QUANT_THREADS, 0, stream>>>(w, rows, cols, q, grid,
                                                                                            ld);
    return rp_launch_result();
}

extern "C" int rp_k_quant_fp8_act_groups(const rp_bf16 *x, int T, int T_pad, int K, uint8_t *xq, float *sx,
                                         cudaStream_t stream) {
    if (T_pad < T) return (int)cudaErrorInvalidValue;
    if (T_pad <= 0 || K <= 0) return cudaSuccess;
    const int64_t items = (int64_t)T_pad * ((K + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK), per_block = QUANT_THREADS / 32;
    quant_fp8_act_groups_kernel<<<(unsigned)((items + per_block - 1) / per_block), QUANT_THREADS, 0, stream>>>(
        x, T, T_pad, K, xq, sx, rp_fp8_act_ld(T_pad));
    return rp_launch_result();
}

extern "C" int rp_k_dequant_fp8_blocks(const uint8_t *q, const float *grid, int ld, int64_t rows, int64_t cols,
                                       rp_bf16 *out, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int64_t blocks = (rows * cols + 255) / 256;
    dequant_fp8_blocks_kernel<<<(int)(blocks > 16384 ? 16384 : blocks), 256, 0, stream>>>(q, grid, ld, rows, cols,
                                                                                         out);
    return rp_launch_result();
}

extern "C" int rp_k_scale_outer(const float *raw, const float *sx, const float *sw, void *y, int out_f32, int T,
                                int N, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    const int64_t blocks = ((int64_t)T * N + 255) / 256;
    const int grid = (int)(blocks > 16384 ? 16384 : blocks);
    return out_f32 ? rp_launch(scale_outer_kernel<true>, dim3(grid), dim3(256), 0, stream, raw, sx, sw, y, T, N)
                   : rp_launch(scale_outer_kernel<false>, dim3(grid), dim3(256), 0, stream, raw, sx, sw, y, T, N);
}

extern "C" int rp_k_quant_fp8_act_rows(const rp_bf16 *x, int T, int K, uint8_t *xq, float *sx, cudaStream_t stream) {
    if (T <= 0 || K <= 0) return cudaSuccess;
    const int per_thread = (K / 8 + QUANT_THREADS - 1) / QUANT_THREADS;
    if (K % 8 != 0 || (uintptr_t)x % 16 != 0 || (uintptr_t)xq % 8 != 0 || per_thread > 16) /* the row-by-row kernel */
        return rp_k_quant_fp8_rows(x, T, K, xq, sx, stream);
    const dim3 grid((unsigned)T), block(QUANT_THREADS);
    if (per_thread <= 2) return rp_launch(quant_fp8_act_rows_kernel<2>, grid, block, 0, stream, x, K, xq, sx);
    if (per_thread <= 4) return rp_launch(quant_fp8_act_rows_kernel<4>, grid, block, 0, stream, x, K, xq, sx);
    if (per_thread <= 8) return rp_launch(quant_fp8_act_rows_kernel<8>, grid, block, 0, stream, x, K, xq, sx);
    return rp_launch(quant_fp8_act_rows_kernel<16>, grid, block, 0, stream, x, K, xq, sx);
}

extern "C" int rp_k_quant_fp8_rows(const rp_bf16 *w, int64_t rows, int64_t cols, uint8_t *q, float *scale,
                                   cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    if (rows > 0x7fffffff) return (int)cudaErrorInvalidValue;
    quant_fp8_rows_kernel<<<(unsigned)rows, QUANT_THREADS, 0, stream>>>(w, cols, q, scale);
    return rp_launch_result();
}

extern "C" int rp_k_dequant_fp8_rows(const uint8_t *q, const float *scale, int64_t rows, int64_t cols, rp_bf16 *out,
                                     cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int64_t blocks = (rows * cols + 255) / 256;
    dequant_fp8_rows_kernel<<<(int)(blocks > 16384 ? 16384 : blocks), 256, 0, stream>>>(q, scale, rows, cols, out);
    return rp_launch_result();
}
