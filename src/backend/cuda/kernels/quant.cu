/* --quantization fp8: a bf16 matrix to e4m3 with one scale per row (the
 * weights at load; the activations of a product of many tokens, per
 * token), back to bf16, and the two scales applied to an FP8 matmul's raw
 * sums. The weights' arithmetic is model/quant.c's rp_quant_fp8_rows step
 * for step (max, an exactly rounded division, the hardware's
 * round-to-nearest-even saturating conversion), so a model quantized here
 * and one quantized on the host are the same bytes. None of these runs in
 * a decode step of up to 16 tokens (the fp8 GEMV's). */
#include "common.cuh"
#include "fp8.cuh"

#define QUANT_THREADS 256

/* One block per row: the row's max |w|, then every element over it. */
__global__ void quant_fp8_rows_kernel(const uint16_t *__restrict__ w, int64_t cols, uint8_t *__restrict__ q,
                                      float *__restrict__ scale) {
    __shared__ float part[QUANT_THREADS / 32];
    const uint16_t *wr = w + blockIdx.x * cols;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) amax = fmaxf(amax, fabsf(rp_bf16_f32(wr[c])));
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(RP_FULL_MASK, amax, m));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < QUANT_THREADS / 32; i++) amax = fmaxf(amax, part[i]);
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
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

/* y[t][n] = raw[t][n] * sx[t] * sw[n], fp32 or bf16 out (y may be raw). */
template <bool F32>
__global__ void scale_outer_kernel(const float *raw, const float *__restrict__ sx, const float *__restrict__ sw,
                                   void *y, int T, int N) {
    const int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = raw[i] * (sx[i / N] * sw[i % N]);
        if (F32) static_cast<float *>(y)[i] = v;
        else static_cast<uint16_t *>(y)[i] = rp_f32_bf16(v);
    }
}

extern "C" int rp_k_scale_outer(const float *raw, const float *sx, const float *sw, void *y, int out_f32, int T,
                                int N, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    const int64_t blocks = ((int64_t)T * N + 255) / 256;
    const int grid = (int)(blocks > 16384 ? 16384 : blocks);
    if (out_f32) scale_outer_kernel<true><<<grid, 256, 0, stream>>>(raw, sx, sw, y, T, N);
    else scale_outer_kernel<false><<<grid, 256, 0, stream>>>(raw, sx, sw, y, T, N);
    return rp_launch_result();
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
