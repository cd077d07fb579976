/* Layout checks for the sm_90a prefill attention kernel
 * (attn_prefill_sm90.cu): each runs one piece of its data path on one
 * 64 x 128 tile with the kernel's own layout helpers
 * (attn_prefill_sm90.cuh), so that the first GPU run says which piece is
 * wrong, if one is:
 *  - rp_k_sm90_debug_qk: TMA boxes with the 128B swizzle (Q as one box of
 *    64 rows per half, K as 8 boxes of 16 rows per half, as with pages of
 *    16), K-major descriptors stepping 32 bytes inside the swizzle atom,
 *    and the accumulator's fragment layout;
 *  - rp_k_sm90_debug_pv: the A fragment from registers (P packed to bf16
 *    from the accumulator layout) and V as the transposed (MN-major) B
 *    operand, its LBO / SBO.
 * One warpgroup, one block; tests/test_cuda_attn_sm90.c compares with a
 * host matmul. */
#include "attn_prefill_sm90.cuh"
#include "common.cuh"

#define DBG_SMEM (2 * A90_Q_HALF + A90_KV_BYTES + 1024 + 64)

/* Where thread (warp w, lane) keeps element (row, col) of a 64 x 128
 * accumulator, as written in sm90.cuh. */
__device__ __forceinline__ void dbg_store_acc(const float (&d)[64], float *dst) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int r = warp * 16 + g, col = 8 * i + 2 * c;
        dst[r * 128 + col] = d[4 * i];
        dst[r * 128 + col + 1] = d[4 * i + 1];
        dst[(r + 8) * 128 + col] = d[4 * i + 2];
        dst[(r + 8) * 128 + col + 1] = d[4 * i + 3];
    }
}

__global__ void __launch_bounds__(128) sm90_debug_qk_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                             const __grid_constant__ CUtensorMap tm_k, float *s_out) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (rp_sm90_saddr(smem_raw) & 1023)) & 1023);
    uint8_t *sq = smem, *sk = smem + 2 * A90_Q_HALF; /* Q: 64 rows per half (the kernel has 128) */
    uint64_t *bar = reinterpret_cast<uint64_t *>(sk + A90_KV_BYTES);
    if (threadIdx.x == 0) {
        rp_mbar_init(bar, 1);
        rp_mbar_fence_init();
    }
    __syncthreads();
    const int q_half = 64 * A90_ROW_BYTES;
    if (threadIdx.x == 0) {
        rp_mbar_arrive_expect_tx(bar, 2 * q_half + A90_KV_BYTES);
        rp_tma_load_2d(sq, &tm_q, 0, 0, bar);
        rp_tma_load_2d(sq + q_half, &tm_q, 64, 0, bar);
        for (int b = 0; b < 8; b++) { /* 16-row boxes, loaded in reverse order to mimic scattered pages */
            const int r = (7 - b) * 16;
            rp_tma_load_2d(sk + r * A90_ROW_BYTES, &tm_k, 0, r, bar);
            rp_tma_load_2d(sk + A90_KV_HALF + r * A90_ROW_BYTES, &tm_k, 64, r, bar);
        }
    }
    rp_mbar_wait(bar, 0);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    rp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        rp_wgmma_m64n128k16_ss(d, a90_desc_kmajor(rp_sm90_saddr(sq), q_half, kk),
                               a90_desc_kmajor(rp_sm90_saddr(sk), A90_KV_HALF, kk), kk > 0);
    rp_wgmma_commit();
    rp_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; i++) rp_reg_fence(d[i]);
    dbg_store_acc(d, s_out);
}

__global__ void __launch_bounds__(128) sm90_debug_pv_kernel(const __grid_constant__ CUtensorMap tm_v, const float *p_in,
                                                             float *o_out) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (rp_sm90_saddr(smem_raw) & 1023)) & 1023);
    uint8_t *sv = smem;
    uint64_t *bar = reinterpret_cast<uint64_t *>(sv + A90_KV_BYTES);
    if (threadIdx.x == 0) {
        rp_mbar_init(bar, 1);
        rp_mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        rp_mbar_arrive_expect_tx(bar, A90_KV_BYTES);
        for (int b = 0; b < 8; b++) {
            const int r = b * 16;
            rp_tma_load_2d(sv + r * A90_ROW_BYTES, &tm_v, 0, r, bar);
            rp_tma_load_2d(sv + A90_KV_HALF + r * A90_ROW_BYTES, &tm_v, 64, r, bar);
        }
    }
    /* P in the accumulator layout, packed as the kernel packs it */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    float s[64];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int r = warp * 16 + g, col = 8 * i + 2 * c;
        s[4 * i] = p_in[r * 128 + col];
        s[4 * i + 1] = p_in[r * 128 + col + 1];
        s[4 * i + 2] = p_in[(r + 8) * 128 + col];
        s[4 * i + 3] = p_in[(r + 8) * 128 + col + 1];
    }
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < 32; i++) p[i] = rp_pack_bf16x2(s[2 * i], s[2 * i + 1]);
    rp_mbar_wait(bar, 0);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;
    rp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        rp_wgmma_m64n128k16_rs_tb(d, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                  a90_desc_v(rp_sm90_saddr(sv), kk));
    rp_wgmma_commit();
    rp_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; i++) rp_reg_fence(d[i]);
    dbg_store_acc(d, o_out);
}

static int dbg_smem_attr(const void *kernel) {
    return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DBG_SMEM);
}

extern "C" int rp_k_sm90_debug_qk(const rp_bf16 *q, const rp_bf16 *k, float *s, cudaStream_t stream) {
    CUtensorMap tm_q, tm_k;
    int rc = a90_tensor_map(&tm_q, q, 128, 64, 64);
    if (!rc) rc = a90_tensor_map(&tm_k, k, 128, 128, 16);
    if (!rc) rc = dbg_smem_attr((const void *)sm90_debug_qk_kernel);
    if (rc) return rc;
    sm90_debug_qk_kernel<<<1, 128, DBG_SMEM, stream>>>(tm_q, tm_k, s);
    return rp_launch_result();
}

extern "C" int rp_k_sm90_debug_pv(const float *p, const rp_bf16 *v, float *o, cudaStream_t stream) {
    CUtensorMap tm_v;
    int rc = a90_tensor_map(&tm_v, v, 128, 128, 16);
    if (!rc) rc = dbg_smem_attr((const void *)sm90_debug_pv_kernel);
    if (rc) return rc;
    sm90_debug_pv_kernel<<<1, 128, DBG_SMEM, stream>>>(tm_v, p, o);
    return rp_launch_result();
}
