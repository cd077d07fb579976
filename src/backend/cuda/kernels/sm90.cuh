/* Hopper (sm_90a) building blocks for the FlashAttention-3-style prefill
 * kernel (attn_prefill_sm90.cu) and its layout checks
 * (attn_prefill_sm90_debug.cu): mbarriers, the bulk tensor copy (TMA),
 * warpgroup matrix multiplies (wgmma) and their shared-memory descriptors.
 * Each wrapper names the PTX ISA section it follows; the layout facts they
 * rely on are written next to them, because a wrong bit here does not fail
 * to compile: it computes garbage. */
#ifndef RP_KERNELS_SM90_CUH
#define RP_KERNELS_SM90_CUH

#include <cuda.h> /* CUtensorMap (a type only: nothing links against the driver) */
#include <stdint.h>

__device__ __forceinline__ uint32_t rp_sm90_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarrier (PTX ISA 9.7.13.15, "Parallel Synchronization and
 * Communication Instructions: mbarrier") ------------------------------------
 * A phase completes when its pending arrivals reach zero and its
 * transaction count (bytes announced by expect_tx, paid back by the copy
 * engine's complete_tx) is zero. try_wait.parity(P) succeeds once the phase
 * of parity P has completed; on a fresh barrier (phase 0 running) parity 1
 * counts as the completed "previous" phase, which is why a producer's first
 * wait on an empty slot passes at once (parity (round & 1) ^ 1). */
__device__ __forceinline__ void rp_mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(rp_sm90_saddr(bar)), "r"(count) : "memory");
}
/* Makes the initialised barriers visible to the async proxy (the copy
 * engine) before any thread uses them; a __syncthreads follows. */
__device__ __forceinline__ void rp_mbar_fence_init(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void rp_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rp_sm90_saddr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void rp_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(rp_sm90_saddr(bar)) : "memory");
}
__device__ __forceinline__ void rp_mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t a = rp_sm90_saddr(bar);
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- bulk tensor copy (PTX ISA 9.7.9.25.5.1, cp.async.bulk.tensor) -------
 * Copies the box of the tensor map at coordinates (c0 innermost, c1) to
 * shared memory and pays its bytes to the mbarrier's transaction count.
 * Elements outside the tensor's extent are filled with zeros and still
 * counted (the box is always paid in full). The map lives in kernel
 * parameter space (__grid_constant__), addressed generically. With
 * CU_TENSOR_MAP_SWIZZLE_128B a box of 128-byte rows lands as rows of 128
 * bytes whose 16-byte chunk c sits at chunk c ^ (row % 8), the row counted
 * from a 1024-byte boundary of the shared address: destinations must be
 * 1024-byte aligned for that to match the wgmma descriptor's view. */
__device__ __forceinline__ void rp_tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(rp_sm90_saddr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(rp_sm90_saddr(bar))
                 : "memory");
}

/* Shared memory written by ordinary stores that the async proxy (wgmma,
 * the copy engine) reads next: each writing thread fences, then a barrier
 * (PTX ISA 9.7.13.4, membar/fence: fence.proxy.async). */
__device__ __forceinline__ void rp_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Named barrier over n threads (a warpgroup: 128), id 1..15 (0 is
 * __syncthreads). */
__device__ __forceinline__ void rp_named_barrier(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

/* ---- wgmma (PTX ISA 9.7.15, "Asynchronous Warpgroup Level Matrix
 * Multiply-Accumulate Instructions") ----------------------------------------
 *
 * Shared-memory matrix descriptor (9.7.15.5.1): bits 0-13 start address
 * >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
 * byte offset >> 4, 49-51 base offset (0: our tiles start 1024-byte
 * aligned, so the swizzle pattern starts at the atom), 62-63 swizzle
 * (1 = 128B).
 *
 * The tiles here are all "rows of 128 bytes, 128B swizzle": 64 bf16 per
 * row, 8-row atoms of 1024 bytes, atoms stacked one after another.
 *  - K-major operand (Q as A, K as B of S = Q K^T; rows = M or N, the 64
 *    elements of a row = K): a k16 step reads 32 bytes of each row, so it
 *    starts 32 * (k % 4) bytes into the row (the hardware applies the XOR
 *    to the final address, which is why a start inside the atom works);
 *    SBO = 1024 (next 8 rows); LBO unused for swizzled K-major (set 16).
 *  - MN-major operand (V as B of O = P V, transposed, imm-trans-b = 1):
 *    rows = K (keys), a row's 64 elements = N (head dims). SBO = 1024 (the
 *    next 8 keys, along K), LBO = the byte distance between the 64-column
 *    halves of N (the next "repeat" along MN).
 * Both are checked on the GPU in isolation by attn_prefill_sm90_debug.cu
 * (tests/test_cuda_attn_sm90.c runs them first). */
__device__ __forceinline__ uint64_t rp_wgmma_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

/* Ordering (9.7.15.6-9.7.15.8): wgmma.fence before the first wgmma of a
 * sequence whenever its accumulator or A registers were touched by other
 * instructions; commit_group closes a group of issued wgmma; wait_group N
 * returns once at most N groups are pending. The accumulators and A
 * registers of a pending group must not be read or written. */
__device__ __forceinline__ void rp_wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void rp_wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void rp_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Ties registers to this point of the instruction stream: the compiler may
 * not move their reads or writes across it (used around wgmma groups,
 * whose register effects the compiler cannot see). */
__device__ __forceinline__ void rp_reg_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void rp_reg_fence(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

/* Accumulator fragment of m64nNk16, f32 (9.7.15.5.1, "Register fragments"):
 * warp w of the warpgroup holds rows 16w..16w+15; with g = lane / 4 and
 * c = lane % 4, d[4i + 0..1] = D[16w + g][8i + 2c + 0..1] and
 * d[4i + 2..3] = D[16w + g + 8][8i + 2c + 0..1]. The A fragment from
 * registers (bf16, m64 x k16) has the same per-warp shape as mma.sync
 * m16n8k16: a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] =
 * A[g][2c+8..], a[3] = A[g+8][2c+8..] (pairs packed low element first). So
 * the accumulator of S, 16 keys at a time, is already P's A fragment. */

/* The 64 fp32 accumulators of an m64n128 wgmma, operands %0..%63: their
 * place in the instruction and their constraints. */
#define RP_WGMMA_D64_REGS                                                                      \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "          \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "          \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define RP_WGMMA_D8_OUTS(d, i)                                                                 \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define RP_WGMMA_D64_OUTS(d)                                                                   \
    RP_WGMMA_D8_OUTS(d, 0), RP_WGMMA_D8_OUTS(d, 8), RP_WGMMA_D8_OUTS(d, 16), RP_WGMMA_D8_OUTS(d, 24), \
        RP_WGMMA_D8_OUTS(d, 32), RP_WGMMA_D8_OUTS(d, 40), RP_WGMMA_D8_OUTS(d, 48), RP_WGMMA_D8_OUTS(d, 56)

/* D(64x128, f32) (+)= A(64x16, smem) * B(16x128, smem), both K-major. */
__device__ __forceinline__ void rp_wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                       int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 RP_WGMMA_D64_REGS
                 "%64, %65, p, 1, 1, 0, 0;\n}"
                 : RP_WGMMA_D64_OUTS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* D(64x128, f32) += A(64x16, registers, bf16) * B(16x128, smem), B
 * MN-major (imm-trans-b = 1: bf16 allows the transpose, 9.7.15.5). */
__device__ __forceinline__ void rp_wgmma_m64n128k16_rs_tb(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2,
                                                          uint32_t a3, uint64_t desc_b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 RP_WGMMA_D64_REGS
                 "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;"
                 : RP_WGMMA_D64_OUTS(d)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

/* 2^x, the SFU's approximation (flush-to-zero): what exp2f becomes under
 * fast math; -inf gives 0. */
__device__ __forceinline__ float rp_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#endif
