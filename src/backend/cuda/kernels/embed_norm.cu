/* The residual stream's entry and its norms: embedding gather into the fp32
 * residual, and RMSNorm fused with the residual add (one pass reads the
 * delta, updates the residual and produces the normalised bf16 activations
 * the next matrix product reads). One block per token: T is small in
 * decode and these kernels move little memory, so simplicity wins. */
#include "common.cuh"
#include "fp8.cuh"

#define NORM_THREADS 256

/* residual[t] = float(embed[tokens[t]]); 8 bf16 per 16-byte load. With
 * ss_parts, the row's sum of squares for the first RMSNORM-input GEMV. */
template <bool VEC>
__global__ void embed_kernel(const uint16_t *__restrict__ embed, const int32_t *__restrict__ tokens,
                             const int32_t *prev_sampled, float *__restrict__ residual,
                             float *__restrict__ ss_parts, int num_parts, int H) {
    __shared__ float scratch[33];
    rp_pdl_trigger();
    rp_pdl_wait();
    const int t = blockIdx.x;
    const uint16_t *src = embed + (int64_t)rp_step_token(tokens, prev_sampled, t) * H;
    float *dst = residual + (int64_t)t * H;
    float ss = 0.0f;
    if (VEC) {
        for (int i = threadIdx.x * 8; i < H; i += blockDim.x * 8) {
            uint4 v = rp_ld_nc(src + i);
            float4 a = make_float4(rp_bf16_lo(v.x), rp_bf16_hi(v.x), rp_bf16_lo(v.y), rp_bf16_hi(v.y));
            float4 b = make_float4(rp_bf16_lo(v.z), rp_bf16_hi(v.z), rp_bf16_lo(v.w), rp_bf16_hi(v.w));
            *reinterpret_cast<float4 *>(dst + i) = a;
            *reinterpret_cast<float4 *>(dst + i + 4) = b;
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) {
            const float x = rp_bf16_f32(src[i]);
            dst[i] = x;
            ss += x * x;
        }
    }
    if (!ss_parts) return; /* block-uniform */
    ss = rp_block_sum(ss, scratch);
    for (int q = threadIdx.x; q < num_parts; q += blockDim.x) ss_parts[q * RP_GEMV_MAX_T + t] = q == 0 ? ss : 0.0f;
}

extern "C" int rp_k_embed(const rp_bf16 *embed, const int32_t *tokens, const int32_t *prev_sampled, float *residual,
                          float *ss_parts, int num_parts, int T, int H, cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    if (ss_parts && (T > RP_GEMV_MAX_T || num_parts <= 0)) return (int)cudaErrorInvalidValue;
    if (H % 8 == 0)
        return rp_launch(embed_kernel<true>, dim3(T), dim3(NORM_THREADS), 0, stream, embed, tokens, prev_sampled,
                         residual, ss_parts, num_parts, H);
    return rp_launch(embed_kernel<false>, dim3(T), dim3(NORM_THREADS), 0, stream, embed, tokens, prev_sampled, residual,
                     ss_parts, num_parts, H);
}

/* VEC: 4 elements per access (float4 residual, 8-byte bf16 quads). The
 * second pass re-reads the residual this thread just wrote (L1/L2), which
 * keeps the kernel independent of H.
 * For W8A8 products (rp_k_add_rmsnorm_fp8) two passes of their own fold in:
 * DS: delta is an FP8 matmul's raw sums, scaled here by dsx[t] * dsw[i]
 *     (the scaling pass's expression, so the same bits);
 * Q:  the output row is also quantized per token for the next product
 *     (rp_k_quant_fp8_act_rows' arithmetic on the bf16 values this block
 *     just wrote, which it reads back). */
template <bool VEC, bool DS, bool Q>
__global__ void add_rmsnorm_kernel(float *__restrict__ residual, const float *__restrict__ delta,
                                   const float *dsx, const float *__restrict__ dsw, const uint16_t *__restrict__ w,
                                   uint16_t *__restrict__ out, uint8_t *__restrict__ xq, float *sxo, int H, float eps) {
    /* dsx and sxo may be one array (not restrict): each block reads its row's
     * dsx[t] before the two syncs that precede its sxo[t] write */
    __shared__ float scratch[33];
    rp_pdl_trigger();
    rp_pdl_wait();
    const int t = blockIdx.x;
    float *r = residual + (int64_t)t * H;
    const float *d = delta ? delta + (int64_t)t * H : nullptr;
    const float st = DS && d ? dsx[t] : 0.0f;
    uint16_t *o = out + (int64_t)t * H;
    float ss = 0.0f;
    if (VEC) {
        for (int i = threadIdx.x * 4; i < H; i += blockDim.x * 4) {
            float4 x = *reinterpret_cast<float4 *>(r + i);
            if (d) {
                float4 dv = *reinterpret_cast<const float4 *>(d + i);
                if (DS) { /* rounded before the add, as the scaling pass stores it (no FMA) */
                    const float4 sw = *reinterpret_cast<const float4 *>(dsw + i);
                    dv.x = __fmul_rn(dv.x, st * sw.x);
                    dv.y = __fmul_rn(dv.y, st * sw.y);
                    dv.z = __fmul_rn(dv.z, st * sw.z);
                    dv.w = __fmul_rn(dv.w, st * sw.w);
                }
                x.x += dv.x;
                x.y += dv.y;
                x.z += dv.z;
                x.w += dv.w;
                *reinterpret_cast<float4 *>(r + i) = x;
            }
            ss += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) {
            float x = r[i];
            if (d) {
                x += DS ? __fmul_rn(d[i], st * dsw[i]) : d[i];
                r[i] = x;
            }
            ss += x * x;
        }
    }
    ss = rp_block_sum(ss, scratch);
    /* transformers: x * rsqrt(mean(x^2) + eps) * weight, all fp32 */
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    float amax = 0.0f;
    if (VEC) {
        for (int i = threadIdx.x * 4; i < H; i += blockDim.x * 4) {
            float4 x = *reinterpret_cast<const float4 *>(r + i);
            uint2 wv = *reinterpret_cast<const uint2 *>(w + i);
            uint2 ov;
            ov.x = rp_pack_bf16x2(rp_bf16_lo(wv.x) * (x.x * inv), rp_bf16_hi(wv.x) * (x.y * inv));
            ov.y = rp_pack_bf16x2(rp_bf16_lo(wv.y) * (x.z * inv), rp_bf16_hi(wv.y) * (x.w * inv));
            *reinterpret_cast<uint2 *>(o + i) = ov;
            if (Q)
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(rp_bf16_lo(ov.x)), fabsf(rp_bf16_hi(ov.x))),
                                         fmaxf(fabsf(rp_bf16_lo(ov.y)), fabsf(rp_bf16_hi(ov.y)))));
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) {
            o[i] = rp_f32_bf16(rp_bf16_f32(w[i]) * (r[i] * inv));
            if (Q) amax = fmaxf(amax, fabsf(rp_bf16_f32(o[i])));
        }
    }
    if constexpr (Q) {
        /* the row's max |x| (scratch is free again after rp_block_sum's last read: the sync below orders it) */
        for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(RP_FULL_MASK, amax, m));
        __syncthreads();
        if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = amax;
        __syncthreads();
        amax = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) amax = fmaxf(amax, scratch[i]);
        const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
        if (threadIdx.x == 0) sxo[t] = s;
        uint8_t *q = xq + (int64_t)t * H;
        for (int i = threadIdx.x; i < H; i += blockDim.x) /* this block's own writes: plain loads */
            q[i] = rp_f32_e4m3(__fdiv_rn(rp_bf16_f32(o[i]), s));
    }
}

extern "C" int rp_k_add_rmsnorm(float *residual, const float *delta, const rp_bf16 *w, rp_bf16 *out, int T,
                                int H, float eps, cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    if (H % 4 == 0)
        return rp_launch(add_rmsnorm_kernel<true, false, false>, dim3(T), dim3(NORM_THREADS), 0, stream, residual,
                         delta, (const float *)NULL, (const float *)NULL, w, out, (uint8_t *)NULL, (float *)NULL, H,
                         eps);
    return rp_launch(add_rmsnorm_kernel<false, false, false>, dim3(T), dim3(NORM_THREADS), 0, stream, residual, delta,
                     (const float *)NULL, (const float *)NULL, w, out, (uint8_t *)NULL, (float *)NULL, H, eps);
}

template <bool DS, bool Q>
static int add_rmsnorm_fp8(float *residual, const float *delta, const float *dsx, const float *dsw, const rp_bf16 *w,
                           rp_bf16 *out, uint8_t *xq, float *sx, int T, int H, float eps, cudaStream_t stream) {
    if (H % 4 == 0 && (uintptr_t)dsw % 16 == 0)
        return rp_launch(add_rmsnorm_kernel<true, DS, Q>, dim3(T), dim3(NORM_THREADS), 0, stream, residual, delta, dsx,
                         dsw, w, out, xq, sx, H, eps);
    return rp_launch(add_rmsnorm_kernel<false, DS, Q>, dim3(T), dim3(NORM_THREADS), 0, stream, residual, delta, dsx,
                     dsw, w, out, xq, sx, H, eps);
}

extern "C" int rp_k_add_rmsnorm_fp8(float *residual, const float *delta, const float *dsx, const float *dsw,
                                    const rp_bf16 *w, rp_bf16 *out, uint8_t *xq, float *sx, int T, int H, float eps,
                                    cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    if (!dsx != !dsw || !xq != !sx || (dsx && !delta)) return (int)cudaErrorInvalidValue;
    if (dsx && xq) return add_rmsnorm_fp8<true, true>(residual, delta, dsx, dsw, w, out, xq, sx, T, H, eps, stream);
    if (dsx) return add_rmsnorm_fp8<true, false>(residual, delta, dsx, dsw, w, out, xq, sx, T, H, eps, stream);
    if (xq) return add_rmsnorm_fp8<false, true>(residual, delta, dsx, dsw, w, out, xq, sx, T, H, eps, stream);
    return rp_k_add_rmsnorm(residual, delta, w, out, T, H, eps, stream);
}
