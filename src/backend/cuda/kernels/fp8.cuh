/* OCP FP8 E4M3 (torch.float8_e4m3fn) in registers, for every kernel that
 * reads or writes it: the fp8 weights' GEMVs (gemv.cu) and the one-kernel
 * decode step's weight stream (decode_step/phases.cuh; mma.cuh includes
 * this), the load-time quantization (quant.cu) and the fp8 KV cache
 * (rope_kv.cu stores it, attn_decode.cu and attn_prefill.cu read it). One place, so that the GPU
 * rounds as model/quant.c's host functions do (rp_f32_to_f8e4m3:
 * round-to-nearest-even, saturating to +-448, the hardware's
 * cvt.rn.satfinite) and widens exactly.
 *
 * Widening: every e4m3 value is a normal f16 (e4m3's 3 mantissa bits and
 * exponents 2^-9..2^8 fit f16's 10 bits and 2^-14..2^15), so one hardware
 * conversion per pair (cvt.rn.f16x2.e4m3x2) gives the exact value. The
 * decode products (the fp8 GEMV, the one-kernel step's consumers) feed
 * that pair straight to an f16 mma (fp32 accumulate), with the activations
 * converted to f16 once where they are made or staged: widening to bf16
 * instead costs three more instructions per pair (f16 -> f32 -> bf16),
 * which left the one-kernel step reading at half the bandwidth. bf16 also
 * holds every e4m3 value exactly (rp_e4m3x2_bf16x2), for kernels whose
 * other operand stays bf16.
 *
 * f16 tops out at 65504: an activation entering an f16 product is
 * saturated to +-65504 (rp_pack_f16x2_sat; NaN stays NaN), where bf16
 * would have kept it. The sums stay fp32 and a weight row's scale
 * multiplies the finished sum, so only an activation element of that size
 * is clipped (the residual stream itself stays fp32). */
#ifndef RP_KERNELS_FP8_CUH
#define RP_KERNELS_FP8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"

/* One e4m3 byte as a float, exactly. */
__device__ __forceinline__ float rp_e4m3_f32(uint8_t v) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(*reinterpret_cast<const __half *>(&h));
}

/* A float to e4m3: nearest even, saturating at +-448 (NaN stays NaN). */
__device__ __forceinline__ uint8_t rp_f32_e4m3(float f) {
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}

/* Two e4m3 (the low and high byte of v) as a bf16 pair, in that order. */
__device__ __forceinline__ uint32_t rp_e4m3x2_bf16x2(uint16_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    return rp_pack_bf16x2(f.x, f.y);
}

/* Two e4m3 (the low and high byte of v) as an f16 pair, in that order:
 * one cvt.rn.f16x2.e4m3x2, exact. */
__device__ __forceinline__ uint32_t rp_e4m3x2_f16x2(uint16_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* Two floats as an f16 pair (lo in the low half), nearest even, saturated
 * to +-65504 (cvt.rn.satfinite: a finite f16 operand for every finite or
 * infinite input, NaN stays NaN): how an activation enters an f16 mma. */
__device__ __forceinline__ uint32_t rp_pack_f16x2_sat(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* One float as f16 bits, saturated as rp_pack_f16x2_sat. */
__device__ __forceinline__ uint16_t rp_f32_f16_sat(float f) {
    uint16_t d;
    asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(d) : "f"(f));
    return d;
}

/* A bf16 pair as an f16 pair, saturated as rp_pack_f16x2_sat (bf16 values
 * under 2^-14 lose bits as f16 subnormals; such activations add nothing
 * visible to a sum of products). */
__device__ __forceinline__ uint32_t rp_bf16x2_f16x2_sat(uint32_t v) {
    return rp_pack_f16x2_sat(rp_bf16_lo(v), rp_bf16_hi(v));
}
__device__ __forceinline__ uint4 rp_bf16x8_f16x8_sat(uint4 v) {
    return make_uint4(rp_bf16x2_f16x2_sat(v.x), rp_bf16x2_f16x2_sat(v.y), rp_bf16x2_f16x2_sat(v.z),
                      rp_bf16x2_f16x2_sat(v.w));
}

/* 8 e4m3 (lo: bytes 0-3, hi: bytes 4-7) as 8 f16 (one uint4), in order:
 * four cvts. */
__device__ __forceinline__ uint4 rp_e4m3x8_f16x8(uint32_t lo, uint32_t hi) {
    return make_uint4(rp_e4m3x2_f16x2((uint16_t)lo), rp_e4m3x2_f16x2((uint16_t)(lo >> 16)),
                      rp_e4m3x2_f16x2((uint16_t)hi), rp_e4m3x2_f16x2((uint16_t)(hi >> 16)));
}

/* 8 e4m3 (lo: bytes 0-3, hi: bytes 4-7) as 8 bf16 (one uint4), in order. */
__device__ __forceinline__ uint4 rp_e4m3x8_bf16x8(uint32_t lo, uint32_t hi) {
    return make_uint4(rp_e4m3x2_bf16x2((uint16_t)lo), rp_e4m3x2_bf16x2((uint16_t)(lo >> 16)),
                      rp_e4m3x2_bf16x2((uint16_t)hi), rp_e4m3x2_bf16x2((uint16_t)(hi >> 16)));
}

/* 8 activation bytes (8-byte aligned), through L2 as rp_ld_act loads 16:
 * the KV cache is written by an earlier kernel of the same step. */
__device__ __forceinline__ uint2 rp_ld_act8(const void *p) { return __ldcg(reinterpret_cast<const uint2 *>(p)); }

#endif
