/* Attention input preparation for one step, fused: the q/k/v biases
 * (Qwen2), per-head RMSNorm of q and k (Qwen3), rotate_half RoPE of q and k
 * at each token's position (cos and sin scaled by yarn's attention factor),
 * and the store of k and v into the paged KV cache at the token's slot. The
 * fused QKV output is rewritten in place so that attention reads rotated q
 * (and, for prefill, the cache already holds this step's keys). The bias is
 * added here rather than in the products' epilogues because this kernel
 * reads every q, k and v element once anyway, on every path (GEMV,
 * cuBLASLt, any batch); the product's bf16 rounding comes first, one more
 * rounding than transformers' bf16 path, far inside the test tolerance.
 *
 * One warp per (token, head); norm and rotation stay in fp32 and round to
 * bf16 once, which is closer to the fp32 reference than transformers' bf16
 * path and well within the test tolerance.
 *
 * An e4m3 cache (FP8, --kv-cache-dtype fp8) gets e4m3(k / k_scale) and
 * e4m3(v / v_scale) of the fp32 values, not of their bf16 rounding: one
 * rounding, not two, as the CPU backend quantizes its fp32 K/V. The
 * division is exactly rounded (__fdiv_rn), as the host's. */
#include "common.cuh"
#include "fp8.cuh"

#define ROPE_WARPS 8
#define ROPE_MAX_PAIRS 4 /* head_dim <= 2 * 32 * 4 = 256 */

/* KV: uint16_t (bf16 bits) or uint8_t (e4m3) cache elements. */
template <typename KV>
__global__ void __launch_bounds__(ROPE_WARPS * 32)
    qk_norm_rope_store_kernel(uint16_t *__restrict__ qkv, const uint16_t *__restrict__ bias,
                              const uint16_t *__restrict__ q_norm, const uint16_t *__restrict__ k_norm,
                              const float *__restrict__ inv_freq, float rope_scale,
                              const int32_t *__restrict__ positions, const int32_t *__restrict__ slot_mapping,
                              KV *__restrict__ k_cache, KV *__restrict__ v_cache, float k_scale, float v_scale,
                              int nh, int nkv, int hd, float eps) {
    constexpr bool FP8 = sizeof(KV) == 1;
    rp_pdl_trigger();
    rp_pdl_wait();
    const int t = blockIdx.x;
    const int head = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int heads = nh + 2 * nkv;
    if (head >= heads) return;
    const int half = hd / 2;
    uint16_t *x = qkv + (int64_t)t * heads * hd + (int64_t)head * hd;
    const uint16_t *bx = bias ? bias + (int64_t)head * hd : nullptr; /* this head's bias */
    /* A negative slot marks a token whose KV must not be stored. */
    const int64_t slot = slot_mapping[t];
    const int64_t kv_row = slot * nkv * hd;

    if (head >= nh + nkv) { /* v head: its bias, then copy to the cache */
        const int kvh = head - nh - nkv;
        for (int i = lane; i < hd; i += 32) {
            uint16_t v = x[i];
            if constexpr (FP8) { /* from the fp32 sum, not its bf16 rounding */
                float vf = rp_bf16_f32(v);
                if (bx) {
                    vf += rp_bf16_f32(bx[i]);
                    x[i] = rp_f32_bf16(vf);
                }
                if (slot >= 0) v_cache[kv_row + (int64_t)kvh * hd + i] = rp_f32_e4m3(__fdiv_rn(vf, v_scale));
            } else {
                if (bx) x[i] = v = rp_f32_bf16(rp_bf16_f32(v) + rp_bf16_f32(bx[i]));
                if (slot >= 0) v_cache[kv_row + (int64_t)kvh * hd + i] = v;
            }
        }
        return;
    }
    const bool is_k = head >= nh;
    const uint16_t *nw = is_k ? k_norm : q_norm;

    float a[ROPE_MAX_PAIRS], b[ROPE_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int p = 0; p < ROPE_MAX_PAIRS; p++) {
        const int i = lane + 32 * p;
        a[p] = b[p] = 0.0f;
        if (i < half) {
            a[p] = rp_bf16_f32(x[i]);
            b[p] = rp_bf16_f32(x[i + half]);
            if (bx) {
                a[p] += rp_bf16_f32(bx[i]);
                b[p] += rp_bf16_f32(bx[i + half]);
            }
            ss += a[p] * a[p] + b[p] * b[p];
        }
    }
    float inv = 1.0f;
    if (nw) {
        ss = rp_warp_sum(ss);
        inv = 1.0f / sqrtf(ss / (float)hd + eps);
    }
    const float pos = (float)positions[t];
    KV *kc = is_k && slot >= 0 ? k_cache + kv_row + (int64_t)(head - nh) * hd : nullptr;
#pragma unroll
    for (int p = 0; p < ROPE_MAX_PAIRS; p++) {
        const int i = lane + 32 * p;
        if (i >= half) continue;
        float av = a[p], bv = b[p];
        if (nw) {
            av = rp_bf16_f32(nw[i]) * (av * inv);
            bv = rp_bf16_f32(nw[i + half]) * (bv * inv);
        }
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c); /* full-precision: angles reach 1e5 rad */
        c *= rope_scale;
        s *= rope_scale;
        const float fa = av * c - bv * s, fb = bv * c + av * s;
        const uint16_t oa = rp_f32_bf16(fa), ob = rp_f32_bf16(fb);
        x[i] = oa;
        x[i + half] = ob;
        if (kc) {
            if constexpr (FP8) {
                kc[i] = rp_f32_e4m3(__fdiv_rn(fa, k_scale));
                kc[i + half] = rp_f32_e4m3(__fdiv_rn(fb, k_scale));
            } else {
                kc[i] = oa;
                kc[i + half] = ob;
            }
        }
    }
}

extern "C" int rp_k_qk_norm_rope_store(rp_bf16 *qkv, const rp_bf16 *bias, const rp_bf16 *q_norm,
                                       const rp_bf16 *k_norm, const float *inv_freq, float rope_scale,
                                       const int32_t *positions, const int32_t *slot_mapping, rp_kv_cache kv, int T,
                                       int nh, int nkv, int hd, float eps, cudaStream_t stream) {
    if (T <= 0) return cudaSuccess;
    if (hd % 2 != 0 || hd > 2 * 32 * ROPE_MAX_PAIRS || nh <= 0 || nkv <= 0) return (int)cudaErrorInvalidValue;
    dim3 grid(T, (nh + 2 * nkv + ROPE_WARPS - 1) / ROPE_WARPS);
    if (kv.format == RP_KV_FORMAT_E4M3) {
        if (!(kv.k_scale > 0.0f) || !(kv.v_scale > 0.0f)) return (int)cudaErrorInvalidValue;
        return rp_launch(qk_norm_rope_store_kernel<uint8_t>, grid, dim3(ROPE_WARPS * 32), 0, stream, qkv, bias,
                         q_norm, k_norm, inv_freq, rope_scale, positions, slot_mapping, (uint8_t *)kv.k,
                         (uint8_t *)kv.v, kv.k_scale, kv.v_scale, nh, nkv, hd, eps);
    }
    return rp_launch(qk_norm_rope_store_kernel<uint16_t>, grid, dim3(ROPE_WARPS * 32), 0, stream, qkv, bias, q_norm,
                     k_norm, inv_freq, rope_scale, positions, slot_mapping, (uint16_t *)kv.k, (uint16_t *)kv.v, 1.0f,
                     1.0f, nh, nkv, hd, eps);
}
