/* Small elementwise kernels: SwiGLU (silu(gate) * up), the row gather that
 * feeds the lm_head only the rows that need logits, and the on-device dummy
 * weight generator (bit-identical to src/model/weights.c so CPU and GPU
 * benchmarks and tests see the same model). */
#include "common.cuh"

/* gate_up[t] = [gate (F) | up (F)], fp32 (the products' own sums: bf16
 * there would be the largest rounding error of the chain after the GEMMs'
 * inputs); 8 elements per thread when aligned. */
template <bool VEC>
__global__ void silu_mul_kernel(const float *__restrict__ gate_up, uint16_t *__restrict__ out, int T, int F) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int64_t per_row = VEC ? F / 8 : F;
    const int64_t total = (int64_t)T * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / per_row, c = i % per_row;
        const float *g = gate_up + t * 2 * F;
        if (VEC) {
            *reinterpret_cast<uint4 *>(out + t * F + c * 8) = rp_silu_mul8(g + c * 8, g + F + c * 8);
        } else {
            const float gf = g[c];
            out[t * F + c] = rp_f32_bf16(gf / (1.0f + expf(-gf)) * g[F + c]);
        }
    }
}

static int grid_for(int64_t work, int threads) {
    int64_t b = (work + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" int rp_k_silu_mul(const float *gate_up, rp_bf16 *out, int T, int F, cudaStream_t stream) {
    if (T <= 0 || F <= 0) return cudaSuccess;
    if (F % 8 == 0)
        return rp_launch(silu_mul_kernel<true>, dim3(grid_for((int64_t)T * F / 8, 256)), dim3(256), 0, stream,
                         gate_up, out, T, F);
    return rp_launch(silu_mul_kernel<false>, dim3(grid_for((int64_t)T * F, 256)), dim3(256), 0, stream, gate_up, out,
                     T, F);
}

template <bool VEC>
__global__ void gather_rows_kernel(const uint16_t *__restrict__ in, const int32_t *__restrict__ rows,
                                   uint16_t *__restrict__ out, int H) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const uint16_t *src = in + (int64_t)rows[blockIdx.x] * H;
    uint16_t *dst = out + (int64_t)blockIdx.x * H;
    if (VEC) {
        for (int i = threadIdx.x * 8; i < H; i += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(dst + i) = *reinterpret_cast<const uint4 *>(src + i);
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
    }
}

extern "C" int rp_k_gather_rows(const rp_bf16 *in, const int32_t *rows, rp_bf16 *out, int n, int H,
                                cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (H % 8 == 0) return rp_launch(gather_rows_kernel<true>, dim3(n), dim3(256), 0, stream, in, rows, out, H);
    return rp_launch(gather_rows_kernel<false>, dim3(n), dim3(256), 0, stream, in, rows, out, H);
}

/* The _rn intrinsics forbid fused multiply-adds, which would round once
 * where the host rounds twice and break bit-identity with weights.c. */
__global__ void fill_dummy_kernel(uint16_t *__restrict__ dst, int64_t n, uint64_t seed, uint64_t stream_id,
                                  float scale, int is_norm) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float u = __fsub_rn(__fmul_rn(rp_d_rand_uniform(seed, stream_id, (uint64_t)i), 2.0f), 1.0f);
        float v = __fmul_rn(__fmul_rn(u, 1.7320508f), scale);
        dst[i] = rp_f32_bf16(is_norm ? __fadd_rn(1.0f, v) : v);
    }
}

extern "C" int rp_k_fill_dummy(rp_bf16 *dst, int64_t n, uint64_t seed, uint64_t stream_id, float scale,
                               int is_norm, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    int64_t blocks = (n + 255) / 256;
    fill_dummy_kernel<<<(int)(blocks > 16384 ? 16384 : blocks), 256, 0, stream>>>(dst, n, seed, stream_id, scale,
                                                                                  is_norm);
    return rp_launch_result();
}
