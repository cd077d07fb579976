/* Prefill attention: variable-length sequences, causal, keys read from the
 * paged cache (which already holds this step's keys, so a cached prefix,
 * i.e. chunked prefill, costs nothing special: query i of a sequence with
 * n_new new tokens sits at position kv_len - n_new + i).
 *
 * FlashAttention-2 on the tensor cores (mma.sync m16n8k16, bf16 in, fp32
 * accumulate): a block owns 64 queries of one (sequence, head); each of its
 * 4 warps owns 16 query rows and keeps S, the online-softmax state and O in
 * registers. K and V tiles of 64 keys are gathered page by page with
 * cp.async into double-buffered shared memory, so the next tile's loads run
 * under the current tile's math. Rows are padded by 16 bytes so that
 * ldmatrix reads of 8 consecutive rows hit 8 different bank groups. */
#include <math.h>

#include "common.cuh"
#include "mma.cuh"

#define PF_BM 64
#define PF_BN 64
#define PF_WARPS 4

template <int HD> struct pf_smem {
    static constexpr int LD = HD + 8; /* padded row, bf16 elements */
    static constexpr int TILE = PF_BN * LD;
    static constexpr size_t BYTES = (size_t)(PF_BM * LD + 4 * TILE) * sizeof(uint16_t);
};

template <int HD>
__global__ void __launch_bounds__(PF_WARPS * 32)
    attn_prefill_kernel(const uint16_t *__restrict__ qkv, const uint16_t *__restrict__ k_cache,
                        const uint16_t *__restrict__ v_cache, rp_attn_meta meta, uint16_t *__restrict__ out, int nh,
                        int nkv) {
    constexpr int LD = pf_smem<HD>::LD, TILE = pf_smem<HD>::TILE;
    constexpr int KS = HD / 16; /* k-steps over head_dim */
    constexpr int ON = HD / 8;  /* O n-tiles */
    constexpr int CPR = HD / 8; /* 16-byte chunks per row */
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sq = smem, *sk = smem + PF_BM * LD, *sv = sk + 2 * TILE;
    rp_pdl_trigger();
    rp_pdl_wait();

    const int s = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * PF_BM;
    const int tok0 = meta.seq_start[s], n_new = meta.seq_start[s + 1] - tok0;
    if (i0 >= n_new) return;
    const int kv_len = meta.seq_kv_len[s];
    const int offset = kv_len - n_new; /* position of new query 0 */
    const int G = nh / nkv, kvh = h / G;
    const int row_stride = (nh + 2 * nkv) * HD;
    const int64_t kv_stride = (int64_t)nkv * HD;
    const int32_t *prow = meta.page_table + (int64_t)meta.seq_page_row[s] * meta.page_table_stride;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int kv_end = offset + min(i0 + PF_BM, n_new); /* keys this block needs */
    const int n_tiles = (kv_end + PF_BN - 1) / PF_BN;

    /* Q tile; rows past the sequence are zero. */
    for (int i = threadIdx.x; i < PF_BM * CPR; i += PF_WARPS * 32) {
        const int r = i / CPR, ch = i % CPR;
        const bool ok = i0 + r < n_new;
        const uint16_t *src = qkv + (int64_t)(tok0 + (ok ? i0 + r : 0)) * row_stride + (int64_t)h * HD + ch * 8;
        rp_cp_async16(sq + r * LD + ch * 8, src, ok ? 16 : 0);
    }
    auto load_kv = [&](int tile, int buf) {
        for (int i = threadIdx.x; i < PF_BN * CPR; i += PF_WARPS * 32) {
            const int r = i / CPR, ch = i % CPR, j = tile * PF_BN + r;
            const bool ok = j < kv_len;
            const int64_t slot = ok ? (int64_t)prow[j / meta.page_size] * meta.page_size + j % meta.page_size : 0;
            const int64_t off = slot * kv_stride + (int64_t)kvh * HD + ch * 8;
            rp_cp_async16(sk + buf * TILE + r * LD + ch * 8, k_cache + off, ok ? 16 : 0);
            rp_cp_async16(sv + buf * TILE + r * LD + ch * 8, v_cache + off, ok ? 16 : 0);
        }
    };
    load_kv(0, 0);
    rp_cp_async_commit();

    const float qk_scale = rsqrtf((float)HD) * 1.4426950408889634f;
    uint32_t qf[KS][4];
    float o[ON][4];
#pragma unroll
    for (int j = 0; j < ON; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    const int pos_lo = offset + i0 + warp * 16 + g, pos_hi = pos_lo + 8; /* this thread's rows */
    const int warp_first_pos = offset + i0 + warp * 16;

    for (int t = 0; t < n_tiles; t++) {
        const int buf = t & 1;
        if (t + 1 < n_tiles) load_kv(t + 1, buf ^ 1);
        rp_cp_async_commit();
        rp_cp_async_wait<1>();
        __syncthreads();
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                rp_ldmatrix_x4(qf[kk], sq + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 +
                                           (lane >> 4) * 8);
        }
        const int key0 = t * PF_BN;
        /* Whole tile above this warp's diagonal: nothing to do (the loads
         * and barriers above are still shared with the other warps). */
        if (key0 <= warp_first_pos + 15) {
            const uint16_t *kt = sk + buf * TILE, *vt = sv + buf * TILE;
            float sc[PF_BN / 8][4];
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; nt += 2)
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    uint32_t b[4];
                    rp_ldmatrix_x4(b, kt + (nt * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                                          ((lane >> 3) & 1) * 8);
                    rp_mma_16816(sc[nt], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
                    rp_mma_16816(sc[nt + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
                }
            const bool diag = key0 + PF_BN - 1 > warp_first_pos;
            float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = key0 + nt * 8 + 2 * c + e;
                    sc[nt][e] = (!diag || j <= pos_lo) ? sc[nt][e] * qk_scale : -INFINITY;
                    sc[nt][2 + e] = (!diag || j <= pos_hi) ? sc[nt][2 + e] * qk_scale : -INFINITY;
                    mx_lo = fmaxf(mx_lo, sc[nt][e]);
                    mx_hi = fmaxf(mx_hi, sc[nt][2 + e]);
                }
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(RP_FULL_MASK, mx_lo, 1));
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(RP_FULL_MASK, mx_lo, 2));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(RP_FULL_MASK, mx_hi, 1));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(RP_FULL_MASK, mx_hi, 2));
            /* Key 0 is visible to every row and sits in tile 0, so after the
             * first tile every row's max is finite. A row may see no key of a
             * later diagonal tile: then mx = -inf and the max stays. */
            const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
            const float a_lo = exp2f(m_lo - mn_lo), a_hi = exp2f(m_hi - mn_hi);
            m_lo = mn_lo;
            m_hi = mn_hi;
            float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
            for (int nt = 0; nt < PF_BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[nt][e] = exp2f(sc[nt][e] - mn_lo);
                    sc[nt][2 + e] = exp2f(sc[nt][2 + e] - mn_hi);
                    ps_lo += sc[nt][e];
                    ps_hi += sc[nt][2 + e];
                }
            l_lo = l_lo * a_lo + ps_lo;
            l_hi = l_hi * a_hi + ps_hi;
#pragma unroll
            for (int j = 0; j < ON; j++) {
                o[j][0] *= a_lo;
                o[j][1] *= a_lo;
                o[j][2] *= a_hi;
                o[j][3] *= a_hi;
            }
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                const uint32_t p0 = rp_pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]);
                const uint32_t p1 = rp_pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]);
                const uint32_t p2 = rp_pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                const uint32_t p3 = rp_pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
                for (int j = 0; j < ON; j += 2) {
                    uint32_t b[4];
                    rp_ldmatrix_x4_trans(b, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + j * 8 +
                                                (lane >> 4) * 8);
                    rp_mma_16816(o[j], p0, p1, p2, p3, b[0], b[1]);
                    rp_mma_16816(o[j + 1], p0, p1, p2, p3, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* this buffer is refilled two iterations on */
    }
    rp_cp_async_wait<0>();

    l_lo += __shfl_xor_sync(RP_FULL_MASK, l_lo, 1);
    l_lo += __shfl_xor_sync(RP_FULL_MASK, l_lo, 2);
    l_hi += __shfl_xor_sync(RP_FULL_MASK, l_hi, 1);
    l_hi += __shfl_xor_sync(RP_FULL_MASK, l_hi, 2);
    const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
    const int r_lo = i0 + warp * 16 + g, r_hi = r_lo + 8;
#pragma unroll
    for (int j = 0; j < ON; j++) {
        const int d = j * 8 + 2 * c;
        if (r_lo < n_new)
            *reinterpret_cast<uint32_t *>(out + (int64_t)(tok0 + r_lo) * nh * HD + (int64_t)h * HD + d) =
                rp_pack_bf16x2(o[j][0] * inv_lo, o[j][1] * inv_lo);
        if (r_hi < n_new)
            *reinterpret_cast<uint32_t *>(out + (int64_t)(tok0 + r_hi) * nh * HD + (int64_t)h * HD + d) =
                rp_pack_bf16x2(o[j][2] * inv_hi, o[j][3] * inv_hi);
    }
}

template <int HD>
static int prefill_launch(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache, rp_attn_meta meta,
                          rp_bf16 *out, int num_seqs, int max_q_len, int nh, int nkv, cudaStream_t stream) {
    /* Raising the dynamic shared-memory limit is idempotent; doing it once
     * keeps it out of captured streams after the first (eager) call. */
    static int attr_set = 0;
    const size_t bytes = pf_smem<HD>::BYTES;
    if (!attr_set) {
        cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)bytes);
        if (e != cudaSuccess) return (int)e;
        attr_set = 1;
    }
    dim3 grid((max_q_len + PF_BM - 1) / PF_BM, nh, num_seqs);
    return rp_launch(attn_prefill_kernel<HD>, grid, dim3(PF_WARPS * 32), bytes, stream, qkv, k_cache, v_cache, meta, out,
                     nh, nkv);
}

extern "C" int rp_k_attn_prefill(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache,
                                 rp_attn_meta meta, rp_bf16 *out, int T, int num_seqs, int max_q_len, int nh,
                                 int nkv, int hd, cudaStream_t stream) {
    if (T <= 0 || num_seqs <= 0 || max_q_len <= 0) return cudaSuccess;
    if (nkv <= 0 || nh % nkv != 0 || meta.page_size <= 0) return (int)cudaErrorInvalidValue;
    if (hd == 128) return prefill_launch<128>(qkv, k_cache, v_cache, meta, out, num_seqs, max_q_len, nh, nkv, stream);
    if (hd == 64) return prefill_launch<64>(qkv, k_cache, v_cache, meta, out, num_seqs, max_q_len, nh, nkv, stream);
    return (int)cudaErrorInvalidValue;
}
