/* Device helpers shared by replay's kernels: bf16 packing, warp and block
 * reductions, the counter-based RNG (a device copy of src/util/rng.h, kept
 * bit-identical: the fill_dummy test compares the two element by element),
 * cache-hinted loads and the launch-check idiom. Nothing here allocates. */
#ifndef RP_KERNELS_COMMON_CUH
#define RP_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/kernels.h"

#define RP_WARP 32
#define RP_FULL_MASK 0xffffffffu

/* Every launcher ends with this: it reports the launch error of the kernel
 * just enqueued (bad configuration, too much shared memory). */
static inline int rp_launch_result(void) { return (int)cudaGetLastError(); }

/* ---- bf16 <-> fp32 ------------------------------------------------------ */

/* bf16 -> fp32 is a shift; doing it on raw bits keeps the compiler from
 * going through the __nv_bfloat16 class and lets two values share a word. */
__device__ __forceinline__ float rp_bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float rp_bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float rp_bf16_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round to nearest even, NaN stays NaN: the same as rp_f32_to_bf16 and
 * torch's .to(torch.bfloat16). */
__device__ __forceinline__ uint16_t rp_f32_bf16(float f) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}

__device__ __forceinline__ uint32_t rp_pack_bf16x2(float lo, float hi) {
    return (uint32_t)rp_f32_bf16(lo) | ((uint32_t)rp_f32_bf16(hi) << 16);
}

/* ---- loads -------------------------------------------------------------- */

/* Weights are read once per step: keep them out of L1 so that the small,
 * reused operands (activations) stay there. Read-only path. */
__device__ __forceinline__ uint4 rp_ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 rp_ld_nc(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

/* ---- reductions --------------------------------------------------------- */

__device__ __forceinline__ float rp_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RP_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float rp_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(RP_FULL_MASK, v, o));
    return v;
}

/* Sum over the block; every thread gets the result. scratch: >= 33 floats.
 * Contains barriers: every thread of the block must call it. */
__device__ __forceinline__ float rp_block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = rp_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? scratch[lane] : 0.0f;
    return rp_warp_sum(r);
}

/* ---- RNG: device twin of src/util/rng.h --------------------------------- */

__host__ __device__ __forceinline__ uint64_t rp_d_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__host__ __device__ __forceinline__ float rp_d_rand_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r = rp_d_mix64(rp_d_mix64(seed ^ rp_d_mix64(stream)) + counter);
    /* 24 bits: the product is exact, so no rounding mode question. */
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}

#endif
