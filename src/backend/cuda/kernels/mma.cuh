/* Tensor-core building blocks shared by the GEMV and attention kernels:
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix, cp.async. Plain
 * sm_80+ instructions; they keep the kernels readable next to wgmma. */
#ifndef RP_KERNELS_MMA_CUH
#define RP_KERNELS_MMA_CUH

#include <stdint.h>

#include "common.cuh"
/* fp8 weights and the fp8 KV cache's decode attention feed the f16 mma
 * below, prefill attention over an fp8 cache the bf16 one, widened in
 * registers by fp8.cuh's helpers (every user of mma.cuh gets them) */
#include "fp8.cuh"

/* d += A(16x16, row) * B(16x8, col). Fragment layout (PTX ISA, m16n8k16):
 * g = lane / 4, c = lane % 4; a0: A[g][2c..2c+1], a1: A[g+8][2c..],
 * a2: A[g][2c+8..], a3: A[g+8][2c+8..]; b0: B[2c..2c+1][g], b1:
 * B[2c+8..2c+9][g]; d0,d1: D[g][2c..2c+1], d2,d3: D[g+8][2c..2c+1]. */
__device__ __forceinline__ void rp_mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The same product with f16 operands (fp32 accumulate, the same fragment
 * layout): e4m3 weights widened by one cvt per pair (fp8.cuh) against
 * activations converted to f16 where they are staged. */
__device__ __forceinline__ void rp_mma_16816_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t rp_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void rp_ldmatrix_x4(uint32_t (&r)[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(rp_smem_addr(smem)));
}

__device__ __forceinline__ void rp_ldmatrix_x4_trans(uint32_t (&r)[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(rp_smem_addr(smem)));
}

/* 16-byte global -> shared copy; src_bytes 0 fills zeros (masked rows). */
__device__ __forceinline__ void rp_cp_async16(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(rp_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void rp_cp_async_commit(void) { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void rp_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

#endif
