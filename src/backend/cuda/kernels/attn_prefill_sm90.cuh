/* The tile geometry of the sm_90a prefill attention kernel
 * (attn_prefill_sm90.cu) and the pieces its layout checks
 * (attn_prefill_sm90_debug.cu) share with it: where a Q, K or V tile sits
 * in shared memory, the wgmma descriptors that read it, and the tensor maps
 * that fill it. One definition, so that a check that passes on the GPU
 * vouches for the kernel's own layout. */
#ifndef RP_KERNELS_ATTN_PREFILL_SM90_CUH
#define RP_KERNELS_ATTN_PREFILL_SM90_CUH

#include "sm90.cuh"

#define A90_HD 128 /* head dim: two 64-column halves of 128-byte rows */
#define A90_BM 128 /* query rows per block: 2 consumer warpgroups x 64 */
#define A90_BN 128 /* keys per K/V tile */
#define A90_ROW_BYTES 128 /* one swizzled smem row: 64 bf16 */
#define A90_Q_HALF (A90_BM * A90_ROW_BYTES)  /* bytes of Q's columns 0-63 (then 64-127) */
#define A90_KV_HALF (A90_BN * A90_ROW_BYTES) /* bytes of a K/V tile's columns 0-63 */
#define A90_Q_BYTES (2 * A90_Q_HALF)
#define A90_KV_BYTES (2 * A90_KV_HALF)

/* A tile of R rows x 128 head dims is stored as two halves, columns 0-63
 * of every row then columns 64-127, each half R rows of 128 bytes in the
 * 128B swizzle: exactly what two TMA boxes of {64 columns, R rows} write
 * (sm90.cuh), and the canonical layout wgmma reads.
 *
 * Descriptor of k-step kk (16 head dims) of a K-major operand (Q as A, K as
 * B of S = Q K^T) whose halves are half_bytes apart, starting at row 0 of
 * the region at saddr (8-row aligned). */
__device__ __forceinline__ uint64_t a90_desc_kmajor(uint32_t saddr, uint32_t half_bytes, int kk) {
    return rp_wgmma_desc(saddr + (uint32_t)(kk >> 2) * half_bytes + (uint32_t)(kk & 3) * 32, 16, 1024);
}
/* Descriptor of k-step kk (keys 16kk..16kk+15) of V as the MN-major B of
 * O = P V: 16 rows down the tile (SBO 1024 per 8 rows), the N dimension
 * (head dims) crossing from the first half to the second after 64
 * columns (LBO = the half's bytes). */
__device__ __forceinline__ uint64_t a90_desc_v(uint32_t saddr, int kk) {
    return rp_wgmma_desc(saddr + (uint32_t)kk * 16 * A90_ROW_BYTES, A90_KV_HALF, 1024);
}

/* Host: a tensor map over a row-major bf16 matrix of `rows` rows of
 * row_elems elements (row pitch row_elems * 2 bytes, a multiple of 16),
 * with boxes of 64 columns x box_rows rows and the 128B swizzle. Returns
 * cudaSuccess, cudaErrorNotSupported (no driver entry point) or
 * cudaErrorInvalidValue (the driver refused the shape). */
int a90_tensor_map(CUtensorMap *map, const void *base, uint64_t row_elems, uint64_t rows, uint32_t box_rows);

#endif
