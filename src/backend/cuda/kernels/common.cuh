/* Device helpers shared by replay's kernels: bf16 packing, warp and block
 * reductions, the counter-based RNG (a device copy of src/util/rng.h, kept
 * bit-identical: the fill_dummy test compares the two element by element),
 * cache-hinted loads and the launch-check idiom. Nothing here allocates. */
#ifndef RP_KERNELS_COMMON_CUH
#define RP_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <float.h>
#include <stdint.h>

#include "backend/cuda/kernels.h"

#define RP_WARP 32
#define RP_FULL_MASK 0xffffffffu

/* Every launcher ends with this: it reports the launch error of the kernel
 * just enqueued (bad configuration, too much shared memory). */
static inline int rp_launch_result(void) { return (int)cudaGetLastError(); }

/* Kernel attributes (cudaFuncSetAttribute: the shared-memory opt-in) hold
 * for the current device only, and under tensor parallelism each GPU's
 * thread launches the same kernels: a launcher sets them once per device.
 * True the first time it is asked for the current device (and marks it in
 * *mask, one bit a device). One thread per device, so a device's bit is
 * never raced for; the atomic keeps the devices' bits apart. */
static inline bool rp_first_on_device(unsigned *mask) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const unsigned bit = 1u << (dev & 31);
    return !(__atomic_fetch_or(mask, bit, __ATOMIC_RELAXED) & bit);
}

/* ---- programmatic dependent launch (PDL) ---------------------------------
 *
 * Decode is a chain of ~300 short kernels; each would otherwise pay a full
 * launch, ramp-up and drain. Launched through rp_launch, a kernel may start
 * while its predecessor is still running (cudaLaunchAttributeProgrammatic-
 * StreamSerialization; graphs record it as a programmatic edge). The rules
 * every kernel launched this way follows:
 *  - rp_pdl_trigger() first: lets the next kernel be scheduled as soon as
 *    this grid's blocks are all running (it still waits for our results);
 *  - before rp_pdl_wait() only constant data (weights, norm weights, the
 *    RoPE table) is read and nothing at all is written: every activation,
 *    metadata value and cache entry may still be in flight from an earlier
 *    kernel. After rp_pdl_wait() the previous grid has finished and its
 *    writes are visible (PTX: griddepcontrol.wait), and so, transitively,
 *    have all earlier grids. Activations are then read with .cg loads (L2)
 *    rather than the non-coherent path.
 * Both are no-ops in a kernel launched without the attribute. */
__device__ __forceinline__ void rp_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void rp_pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* cluster_x > 1 launches thread-block clusters of cluster_x blocks along x
 * (grid.x a multiple of it): blocks of a cluster share shared memory
 * (DSMEM) and a barrier, which lets a kernel split a reduction over several
 * SMs without a second launch or global atomics. */
template <typename... KArgs, typename... Args>
static int rp_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             int cluster_x, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    int n = 0;
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; /* every launch under PDL */
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = (unsigned)cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return (int)e;
    }
    return rp_launch_result();
}

template <typename... KArgs, typename... Args>
static int rp_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args... args) {
    return rp_launch_cluster(kernel, grid, block, smem, stream, 1, args...);
}

/* Token t of a step: tokens[t] < 0 stands for the token sampled in logit
 * row -tokens[t] - 1 of the previous step (a token reference, backend.h),
 * still in prev_sampled: the engine packs step N + 1 before it has read step
 * N's tokens (overlap), and the ids never travel through the host. Every
 * kernel that reads a step's tokens reads them through this, before this
 * step's sampling overwrites prev_sampled (stream order). */
__device__ __forceinline__ int32_t rp_step_token(const int32_t *tokens, const int32_t *prev_sampled, int t) {
    const int32_t v = tokens[t];
    return v < 0 ? prev_sampled[-(int64_t)v - 1] : v;
}

/* ---- bf16 <-> fp32 ------------------------------------------------------ */

/* bf16 -> fp32 is a shift; doing it on raw bits keeps the compiler from
 * going through the __nv_bfloat16 class and lets two values share a word. */
__device__ __forceinline__ float rp_bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float rp_bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float rp_bf16_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* A logit as the samplers see it: NaN never wins, +inf is the largest
 * finite value, and -0 is +0 (one key, so ties go by id as on the host). */
__device__ __forceinline__ float rp_sanitize_logit(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    if (x == 0.0f) return 0.0f;
    return x;
}

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

/* Asks the bulk copy engine to bring [p, p + bytes) into L2 (bytes a
 * multiple of 16, p 16-byte aligned). No registers, no completion to wait
 * for: a hint that keeps DRAM busy while the issuing thread waits. */
__device__ __forceinline__ void rp_prefetch_l2(const void *p, int bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ uint4 rp_ld_nc(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

/* Activations written by an earlier kernel of the step: L2 (.cg). */
__device__ __forceinline__ uint4 rp_ld_act(const void *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ float4 rp_ld_act_f4(const float *p) { return __ldcg(reinterpret_cast<const float4 *>(p)); }

/* SwiGLU of 8 consecutive elements: bf16(silu(g) * u) from fp32 gate and up
 * (16-byte aligned), as 4 bf16 pairs; rp_silu_mul8_f32 leaves the products
 * in fp32 (the fp8 GEMV rounds them to f16). One expression for every
 * kernel that makes it, so they agree bit for bit. */
__device__ __forceinline__ float rp_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ uint4 rp_silu_mul8(const float *g, const float *u) {
    const float4 g0 = rp_ld_act_f4(g), g1 = rp_ld_act_f4(g + 4), u0 = rp_ld_act_f4(u), u1 = rp_ld_act_f4(u + 4);
    const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        o[j] = rp_pack_bf16x2(rp_silu_mul(gv[2 * j], uv[2 * j]), rp_silu_mul(gv[2 * j + 1], uv[2 * j + 1]));
    return make_uint4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ void rp_silu_mul8_f32(const float *g, const float *u, float (&o)[8]) {
    const float4 g0 = rp_ld_act_f4(g), g1 = rp_ld_act_f4(g + 4), u0 = rp_ld_act_f4(u), u1 = rp_ld_act_f4(u + 4);
    const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = rp_silu_mul(gv[j], uv[j]);
}

/* ---- reductions --------------------------------------------------------- */

__device__ __forceinline__ float rp_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RP_FULL_MASK, v, o);
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
