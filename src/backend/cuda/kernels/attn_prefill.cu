/* Prefill attention: variable-length sequences, causal, keys read from the
 * paged cache (which already holds this step's keys, so a cached prefix,
 * i.e. chunked prefill, costs nothing special: query i of a sequence with
 * n_new new tokens sits at position kv_len - n_new + i).
 *
 * FlashAttention-2 on the tensor cores (mma.sync m16n8k16, bf16 in, fp32
 * accumulate): each of a block's 4 warps owns MI m-tiles of 16 query rows
 * and keeps S, the online-softmax state and O in registers. K and V tiles of
 * 64 keys are gathered page by page with cp.async into double-buffered
 * shared memory, so the next tile's loads run under the current tile's
 * math. Rows are padded by 16 bytes so that ldmatrix reads of 8
 * consecutive rows hit 8 different bank groups.
 *
 * Block shapes (rp_k_attn_prefill_set_mode): 64 queries of one head (MI 1);
 * 128 queries of one head (MI 2); 64 positions of two heads of one kv group
 * (MI 2, HM 2: both heads read the same K/V tile, so a block gathers half
 * the K/V per query row and every K/V fragment feeds two mma). Large grids
 * take the two-head block (llama3-8b's shape, one sequence of 8192: 3154 ->
 * 2433 us, 174 -> 226 TFLOP/s; 2048: 261 -> 221 us); where it would leave
 * SMs idle the one-head 64-query block is faster (512 tokens: 29 against 36
 * us; bench/RESULTS.md).
 *
 * Split keys (flash-decoding for prefill): a few new tokens after a long
 * cached prefix make a grid of a few dozen blocks, each walking every key
 * tile in turn (llama3-8b, 64 new tokens after 8000 cached: 32 blocks of
 * 126 tiles on 132 SMs). There the launcher cuts each block's key range
 * into num_splits chunks of whole tiles, one block each (grid x = query
 * tile x splits); each runs the same online softmax over its chunk and
 * writes its rows' unnormalised output, max and sum to a workspace, and
 * decode attention's merge kernel combines them (attn_split.cuh). The split
 * is a separate instantiation (SPLIT): the unsplit one compiles to the
 * kernel as it was before the split came (the same PTX but for three unused
 * parameters). prefill_plan says when to split and how many ways.
 *
 * An e4m3 cache (FP8: --kv-cache-dtype fp8): cp.async copies bytes, it
 * cannot widen them, so a tile's K and V bytes are staged in shared memory
 * (half a bf16 tile each) and widened there into the bf16 tile the mma
 * reads, once per tile by the whole block. The stage is refilled with the
 * next tile's bytes while the block computes on the widened one, so one
 * bf16 tile suffices (not two): less shared memory than the bf16 kernel.
 * k_scale joins the softmax scale and v_scale multiplies the output
 * (decode attention's rule, attn_decode.cu). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_split.cuh"
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"

#define PF_BN 64
#define PF_WARPS 4

/* MI m-tiles of 16 query rows per warp: a block owns 64 MI queries. With
 * two, every K and V fragment a warp reads from shared memory feeds two
 * mma instead of one: ldmatrix traffic per FLOP halves, which is what holds
 * a 16-row warp back (shared memory feeds ~16 FLOP per byte read there). */
template <int HD, int MI, int HM, bool FP8 = false> struct pf_smem {
    static constexpr int ROWS = 16 * PF_WARPS * MI; /* Q rows: HM heads x BM positions */
    static constexpr int BM = ROWS / HM;
    static constexpr int LD = HD + 8; /* padded row, bf16 elements */
    static constexpr int TILE = PF_BN * LD;
    /* bf16: Q, then K and V tiles double-buffered; FP8: Q, one K and one V
     * tile, then the e4m3 stage of K and of V (PF_BN x HD bytes each) */
    static constexpr size_t BYTES = FP8 ? (size_t)(ROWS * LD + 2 * TILE) * sizeof(uint16_t) + 2 * (size_t)PF_BN * HD
                                        : (size_t)(ROWS * LD + 4 * TILE) * sizeof(uint16_t);
};

/* SPLIT: grid x is query tile * num_splits + split, and the block's
 * partial results go to ws_o / ws_ml (attn_split.cuh) instead of out.
 * LIST (with SPLIT): grid x is the step's work list (rp_k_attn_step): the
 * block's sequence, query tile and split come from meta.pf_items, the
 * split count from the step's header, and blocks past the list return. */
template <int HD, int MI, int HM, bool SPLIT, bool LIST = false, bool FP8 = false>
__global__ void __launch_bounds__(PF_WARPS * 32)
    attn_prefill_kernel(const uint16_t *__restrict__ qkv, const void *__restrict__ k_cache_in,
                        const void *__restrict__ v_cache_in, rp_attn_meta meta, uint16_t *__restrict__ out, int nh,
                        int nkv, float *__restrict__ ws_o, float2 *__restrict__ ws_ml, int num_splits, float k_scale,
                        float v_scale) {
    using SM = pf_smem<HD, MI, HM, FP8>;
    const uint16_t *__restrict__ k_cache = static_cast<const uint16_t *>(k_cache_in);
    const uint16_t *__restrict__ v_cache = static_cast<const uint16_t *>(v_cache_in);
    constexpr int ROWS = SM::ROWS, BM = SM::BM, LD = SM::LD, TILE = SM::TILE;
    constexpr int PW = BM / PF_WARPS; /* positions per warp */
    constexpr int KS = HD / 16; /* k-steps over head_dim */
    constexpr int ON = HD / 8;  /* O n-tiles */
    constexpr int CPR = HD / 8; /* 16-byte chunks per row */
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sq = smem, *sk = smem + ROWS * LD, *sv = sk + (FP8 ? 1 : 2) * TILE;
    uint8_t *stage_k = reinterpret_cast<uint8_t *>(sv + TILE), *stage_v = stage_k + PF_BN * HD; /* FP8 only */
    rp_pdl_trigger();
    rp_pdl_wait();

    /* the longest query tiles (most keys under the causal mask) first, so
     * that the short ones fill the tail. (The unsplit kernel's expressions
     * here and in the tile loop are spelled as they were before the split
     * came: spelled otherwise, the same values compiled to other code.) */
    const int h0 = blockIdx.y * HM;
    const int32_t *item = LIST ? meta.pf_items + (int64_t)blockIdx.x * RP_ATTN_ITEM_INTS : nullptr;
    if (LIST) {
        if ((int)blockIdx.x >= meta.hdr[RP_ATTN_HDR_PF_ITEMS]) return;
        num_splits = meta.hdr[RP_ATTN_HDR_PF_SPLITS];
    }
    const int s = LIST ? item[0] : blockIdx.z;
    const int i0 = LIST    ? item[1]
                   : SPLIT ? (gridDim.x / num_splits - 1 - blockIdx.x / num_splits) * BM
                           : (gridDim.x - 1 - blockIdx.x) * BM;
    const int tok0 = meta.seq_start[s], n_new = meta.seq_start[s + 1] - tok0;
    if (i0 >= n_new) return;
    const int kv_len = meta.seq_kv_len[s];
    const int offset = kv_len - n_new; /* position of new query 0 */
    const int G = nh / nkv, kvh = h0 / G; /* the HM heads share it (G % HM == 0) */
    const int row_stride = (nh + 2 * nkv) * HD;
    const int64_t kv_stride = (int64_t)nkv * HD;
    const int32_t *prow = meta.page_table + (int64_t)meta.seq_page_row[s] * meta.page_table_stride;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int kv_end = offset + min(i0 + BM, n_new); /* keys this block needs */
    const int n_tiles = (kv_end + PF_BN - 1) / PF_BN;
    /* Split: this block's chunk, tiles [t_begin, t_end), an even share of
     * the n_tiles (empty where there are fewer tiles than splits). Chunk
     * edges are key positions: the causal mask below is the same. */
    const int split = LIST ? item[2] : SPLIT ? blockIdx.x % num_splits : 0;
    const int t_begin = SPLIT ? split * n_tiles / num_splits : 0;
    const int t_end = SPLIT ? (split + 1) * n_tiles / num_splits : n_tiles;

    /* Q tile; rows past the sequence are zero. */
    for (int i = threadIdx.x; i < ROWS * CPR; i += PF_WARPS * 32) {
        const int r = i / CPR, ch = i % CPR, pr = r % BM; /* row r: head h0 + r / BM, position i0 + pr */
        const bool ok = i0 + pr < n_new;
        const uint16_t *src =
            qkv + (int64_t)(tok0 + (ok ? i0 + pr : 0)) * row_stride + (int64_t)(h0 + r / BM) * HD + ch * 8;
        rp_cp_async16(sq + r * LD + ch * 8, src, ok ? 16 : 0);
    }
    /* A thread copies chunk ch of rows r0, r0 + RSTEP, ...: one page lookup
     * per row, not per chunk. */
    constexpr int RSTEP = PF_WARPS * 32 / CPR;
    const int ch = threadIdx.x % CPR, r0 = threadIdx.x / CPR;
    auto load_kv = [&](int tile, int buf) {
#pragma unroll
        for (int k = 0; k < PF_BN / RSTEP; k++) {
            const int r = r0 + k * RSTEP, j = tile * PF_BN + r;
            const bool ok = j < kv_len;
            const int64_t slot = ok ? (int64_t)prow[j / meta.page_size] * meta.page_size + j % meta.page_size : 0;
            const int64_t off = slot * kv_stride + (int64_t)kvh * HD + ch * 8;
            rp_cp_async16(sk + buf * TILE + r * LD + ch * 8, k_cache + off, ok ? 16 : 0);
            rp_cp_async16(sv + buf * TILE + r * LD + ch * 8, v_cache + off, ok ? 16 : 0);
        }
    };
    /* FP8: tile `tile`'s e4m3 K and V rows into the stage, 16 bytes a
     * copy, and the stage widened into the bf16 tile (sk, sv) */
    constexpr int CPR8 = HD / 16;
    auto load_stage = [&](int tile) {
        const uint8_t *k8 = static_cast<const uint8_t *>(k_cache_in), *v8 = static_cast<const uint8_t *>(v_cache_in);
        for (int i = threadIdx.x; i < PF_BN * CPR8; i += PF_WARPS * 32) {
            const int r = i / CPR8, c8 = i % CPR8, j = tile * PF_BN + r;
            const bool ok = j < kv_len;
            const int64_t slot = ok ? (int64_t)prow[j / meta.page_size] * meta.page_size + j % meta.page_size : 0;
            const int64_t off = slot * kv_stride + (int64_t)kvh * HD + c8 * 16;
            rp_cp_async16(stage_k + r * HD + c8 * 16, k8 + off, ok ? 16 : 0);
            rp_cp_async16(stage_v + r * HD + c8 * 16, v8 + off, ok ? 16 : 0);
        }
    };
    auto widen_stage = [&]() {
        for (int i = threadIdx.x; i < PF_BN * CPR8; i += PF_WARPS * 32) {
            const int r = i / CPR8, c8 = i % CPR8;
            const uint4 wk = *reinterpret_cast<const uint4 *>(stage_k + r * HD + c8 * 16);
            const uint4 wv = *reinterpret_cast<const uint4 *>(stage_v + r * HD + c8 * 16);
            uint4 *dk = reinterpret_cast<uint4 *>(sk + r * LD + c8 * 16), *dv = reinterpret_cast<uint4 *>(sv + r * LD + c8 * 16);
            dk[0] = rp_e4m3x8_bf16x8(wk.x, wk.y);
            dk[1] = rp_e4m3x8_bf16x8(wk.z, wk.w);
            dv[0] = rp_e4m3x8_bf16x8(wv.x, wv.y);
            dv[1] = rp_e4m3x8_bf16x8(wv.z, wv.w);
        }
    };
    const int t_first = SPLIT ? t_begin : 0, t_stop = SPLIT ? t_end : n_tiles;
    if constexpr (FP8) {
        if (t_first < t_stop) load_stage(t_first);
    } else {
        if (!SPLIT) load_kv(0, 0);
        else if (t_begin < t_end) load_kv(t_begin, 0);
    }
    rp_cp_async_commit(); /* with the Q tile */

    /* an e4m3 cache's k_scale folded in (bf16: the product as it was) */
    const float qk_scale = rsqrtf((float)HD) * 1.4426950408889634f * (FP8 ? k_scale : 1.0f);
    float o[MI][ON][4], m[MI][2], l[MI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        m[mi][0] = m[mi][1] = -INFINITY;
        l[mi][0] = l[mi][1] = 0.0f;
#pragma unroll
        for (int j = 0; j < ON; j++) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.0f;
    }
    /* This warp's rows: positions warp_first_pos .. + PW - 1. M-tile mi is
     * head h0 + mi at the same 16 positions (HM = MI) or the next 16
     * positions of head h0 (HM = 1); its row g (index 0) or g + 8 (1). */
    const int warp_first_pos = offset + i0 + warp * PW;
    auto mt_head = [](int mi) { return HM == 1 ? 0 : mi; };
    auto mt_pos = [](int mi) { return HM == 1 ? mi * 16 : 0; };
    const uint16_t *qw = sq + (warp * PW + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;

    for (int t = SPLIT ? t_begin : 0; t < (SPLIT ? t_end : n_tiles); t++) {
        int buf;
        if constexpr (FP8) {
            /* the stage holds tile t (and every warp is past the last
             * tile's math: the loop's closing barrier); widen it, then
             * refill the stage with tile t + 1 under this tile's math */
            buf = 0;
            rp_cp_async_wait<0>();
            __syncthreads();
            widen_stage();
            __syncthreads();
            if (t + 1 < t_stop) load_stage(t + 1);
            rp_cp_async_commit();
        } else {
            buf = SPLIT ? (t - t_begin) & 1 : t & 1;
            if (t + 1 < (SPLIT ? t_end : n_tiles)) load_kv(t + 1, buf ^ 1);
            rp_cp_async_commit();
            rp_cp_async_wait<1>();
            __syncthreads();
        }
        const int key0 = t * PF_BN;
        /* Whole tile above this warp's diagonal: nothing to do (the loads
         * and barriers above are still shared with the other warps). */
        if (key0 <= warp_first_pos + PW - 1) {
            const uint16_t *kt = sk + buf * TILE, *vt = sv + buf * TILE;
            float sc[MI][PF_BN / 8][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; nt++)
                    sc[mi][nt][0] = sc[mi][nt][1] = sc[mi][nt][2] = sc[mi][nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t qf[MI][4]; /* Q from shared memory each tile: registers go to O */
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
                    rp_ldmatrix_x4(qf[mi], qw + (mt_head(mi) * BM + mt_pos(mi)) * LD + kk * 16);
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; nt += 2) {
                    uint32_t b[4];
                    rp_ldmatrix_x4(b, kt + (nt * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
                                          ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        rp_mma_16816(sc[mi][nt], qf[mi][0], qf[mi][1], qf[mi][2], qf[mi][3], b[0], b[1]);
                        rp_mma_16816(sc[mi][nt + 1], qf[mi][0], qf[mi][1], qf[mi][2], qf[mi][3], b[2], b[3]);
                    }
                }
            }
            const bool diag = key0 + PF_BN - 1 > warp_first_pos;
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                const int pos[2] = {warp_first_pos + mt_pos(mi) + g, warp_first_pos + mt_pos(mi) + g + 8};
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int j = key0 + nt * 8 + 2 * c + (e & 1);
                        sc[mi][nt][e] = (!diag || j <= pos[e >> 1]) ? sc[mi][nt][e] * qk_scale : -INFINITY;
                        mx[e >> 1] = fmaxf(mx[e >> 1], sc[mi][nt][e]);
                    }
                float a[2], sub[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(RP_FULL_MASK, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(RP_FULL_MASK, mx[r], 2));
                    /* Key 0 is visible to every row and sits in tile 0, so
                     * after the first tile every row's max is finite. A row
                     * may see no key of a later diagonal tile: then mx =
                     * -inf and the max stays. In a split, a row before its
                     * chunk's first key sees no key of the chunk at all: its
                     * max stays -inf, and 0 is subtracted instead, so that
                     * its weights and its rescale are 0, not NaN. */
                    const float mn = fmaxf(m[mi][r], mx[r]);
                    if (SPLIT) {
                        sub[r] = mn == -INFINITY ? 0.0f : mn;
                        a[r] = exp2f(m[mi][r] - sub[r]);
                    } else {
                        a[r] = exp2f(m[mi][r] - mn);
                    }
                    m[mi][r] = mn;
                }
                float ps[2] = {0.0f, 0.0f};
#pragma unroll
                for (int nt = 0; nt < PF_BN / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        sc[mi][nt][e] = exp2f(sc[mi][nt][e] - (SPLIT ? sub[e >> 1] : m[mi][e >> 1]));
                        ps[e >> 1] += sc[mi][nt][e];
                    }
                l[mi][0] = l[mi][0] * a[0] + ps[0];
                l[mi][1] = l[mi][1] * a[1] + ps[1];
#pragma unroll
                for (int j = 0; j < ON; j++) {
                    o[mi][j][0] *= a[0];
                    o[mi][j][1] *= a[0];
                    o[mi][j][2] *= a[1];
                    o[mi][j][3] *= a[1];
                }
            }
            /* O += P V, 16 keys at a time; P packed to bf16 as the A operand
             * just before use, so its registers are those of S */
#pragma unroll
            for (int kk = 0; kk < PF_BN / 16; kk++) {
                uint32_t pa[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; mi++) {
                    pa[mi][0] = rp_pack_bf16x2(sc[mi][2 * kk][0], sc[mi][2 * kk][1]);
                    pa[mi][1] = rp_pack_bf16x2(sc[mi][2 * kk][2], sc[mi][2 * kk][3]);
                    pa[mi][2] = rp_pack_bf16x2(sc[mi][2 * kk + 1][0], sc[mi][2 * kk + 1][1]);
                    pa[mi][3] = rp_pack_bf16x2(sc[mi][2 * kk + 1][2], sc[mi][2 * kk + 1][3]);
                }
#pragma unroll
                for (int j = 0; j < ON; j += 2) {
                    uint32_t b[4];
                    rp_ldmatrix_x4_trans(b, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + j * 8 +
                                                (lane >> 4) * 8);
#pragma unroll
                    for (int mi = 0; mi < MI; mi++) {
                        rp_mma_16816(o[mi][j], pa[mi][0], pa[mi][1], pa[mi][2], pa[mi][3], b[0], b[1]);
                        rp_mma_16816(o[mi][j + 1], pa[mi][0], pa[mi][1], pa[mi][2], pa[mi][3], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads(); /* this buffer is refilled two iterations on */
    }
    rp_cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float L = l[mi][r];
            L += __shfl_xor_sync(RP_FULL_MASK, L, 1);
            L += __shfl_xor_sync(RP_FULL_MASK, L, 2);
            const float inv = (FP8 ? v_scale : 1.0f) / L;
            const int row = i0 + warp * PW + mt_pos(mi) + g + 8 * r;
            if (row >= n_new) continue;
            if (SPLIT && (!LIST || num_splits > 1)) { /* the chunk's partial result, unnormalised */
                const int64_t part = ((int64_t)(tok0 + row) * nh + h0 + mt_head(mi)) * num_splits + split;
                float *dst = ws_o + part * HD + 2 * c;
#pragma unroll
                for (int j = 0; j < ON; j++)
                    *reinterpret_cast<float2 *>(dst + j * 8) = FP8 ? make_float2(o[mi][j][2 * r] * v_scale,
                                                                                 o[mi][j][2 * r + 1] * v_scale)
                                                                   : make_float2(o[mi][j][2 * r], o[mi][j][2 * r + 1]);
                if (c == 0) ws_ml[part] = make_float2(m[mi][r], L);
                continue;
            }
            uint16_t *dst = out + (int64_t)(tok0 + row) * nh * HD + (int64_t)(h0 + mt_head(mi)) * HD + 2 * c;
#pragma unroll
            for (int j = 0; j < ON; j++)
                *reinterpret_cast<uint32_t *>(dst + j * 8) =
                    rp_pack_bf16x2(o[mi][j][2 * r] * inv, o[mi][j][2 * r + 1] * inv);
        }
}

template <int HD, int MI, int HM, bool SPLIT, bool FP8>
static int prefill_launch(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, float *ws_o,
                          float2 *ws_ml, int num_splits, int num_seqs, int max_q_len, int nh, int nkv,
                          cudaStream_t stream) {
    /* Raising the dynamic shared-memory limit is idempotent; doing it once
     * keeps it out of captured streams after the first (eager) call. */
    static unsigned attr_set; /* per device (rp_first_on_device) */
    using SM = pf_smem<HD, MI, HM, FP8>;
    if (rp_first_on_device(&attr_set)) {
        cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<HD, MI, HM, SPLIT, false, FP8>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM::BYTES);
        if (e != cudaSuccess) return (int)e;
    }
    dim3 grid((max_q_len + SM::BM - 1) / SM::BM * num_splits, nh / HM, num_seqs);
    return rp_launch(attn_prefill_kernel<HD, MI, HM, SPLIT, false, FP8>, grid, dim3(PF_WARPS * 32), SM::BYTES, stream,
                     qkv, (const void *)kv.k, (const void *)kv.v, meta, out, nh, nkv, ws_o, ws_ml, num_splits,
                     FP8 ? kv.k_scale : 1.0f, FP8 ? kv.v_scale : 1.0f);
}

/* The kernel of block shape mode, split num_splits ways (the partial
 * results in workspace, then the merge into out) or not. */
template <int HD, bool FP8>
static int prefill_mode(int mode, int num_splits, void *workspace, const rp_bf16 *qkv, rp_kv_cache kv,
                        rp_attn_meta meta, rp_bf16 *out, int T, int num_seqs, int max_q_len, int nh, int nkv,
                        cudaStream_t stream) {
#define PF_ARGS qkv, kv, meta, out, ws_o, ws_ml, num_splits, num_seqs, max_q_len, nh, nkv, stream
    float *ws_o = nullptr;
    float2 *ws_ml = nullptr;
    if (num_splits == 1) switch (mode) {
        case RP_PREFILL_ROWS16: return prefill_launch<HD, 1, 1, false, FP8>(PF_ARGS);
        case RP_PREFILL_ROWS32: return prefill_launch<HD, 2, 1, false, FP8>(PF_ARGS);
        default: return prefill_launch<HD, 2, 2, false, FP8>(PF_ARGS);
        }
    rp_attn_split_at(workspace, (size_t)T * nh, num_splits, HD, &ws_o, &ws_ml);
    int rc;
    switch (mode) {
    case RP_PREFILL_ROWS16: rc = prefill_launch<HD, 1, 1, true, FP8>(PF_ARGS); break;
    case RP_PREFILL_ROWS32: rc = prefill_launch<HD, 2, 1, true, FP8>(PF_ARGS); break;
    default: rc = prefill_launch<HD, 2, 2, true, FP8>(PF_ARGS); break;
    }
#undef PF_ARGS
    return rc ? rc : rp_attn_merge_splits(ws_o, ws_ml, out, T * nh, HD, num_splits, stream);
}

/* When to split the keys, and into how many chunks. A block's key tiles
 * run one after another, so a grid that the GPU holds at once (two blocks
 * per SM: the 128-dim blocks' shared memory and registers allow no more)
 * takes as long as its longest block. The split is made where the grid is
 * under that and the keys are mostly a cached prefix (at least twice the
 * new tokens: without one, causal blocks' ranges run from one tile to all,
 * the grid's own spread evens them out, and the partial results' traffic
 * would not pay): enough chunks to fill the GPU at two blocks per SM, each
 * of at least PF_SPLIT_MIN_TILES tiles (its Q tile, pipeline ramp and
 * partial results paid over 512 keys), at most PF_MAX_SPLITS, and no more
 * than the workspace holds. Split blocks take two heads of a kv group
 * where the group is even (every K/V tile feeds both), else one. Not yet
 * measured against other choices: `replay bench kernels --attn-sweep`
 * times every split count at the long-prefix shapes. */
#define PF_SPLIT_BLOCKS_PER_SM 2
#define PF_SPLIT_MIN_TILES 8
#define PF_MAX_SPLITS 32

typedef struct pf_plan {
    int mode, splits;
} pf_plan;

static pf_plan prefill_plan(int num_sms, int T, int num_seqs, int max_q_len, int max_kv_len, int nh, int nkv, int hd,
                            size_t workspace_bytes) {
    const bool odd_group = (nh / nkv) % 2 != 0;
    const int64_t q_tiles = (max_q_len + 63) / 64;
    /* the two-head block, unless its grid would not cover the SMs (with an
     * odd group, 32 rows of one head in its place) */
    const int64_t big = q_tiles * (nh / 2) * num_seqs;
    pf_plan p = {big >= num_sms ? (odd_group ? RP_PREFILL_ROWS32 : RP_PREFILL_HEADS2) : RP_PREFILL_ROWS16, 1};
    const int64_t grid = p.mode == RP_PREFILL_HEADS2   ? big
                         : p.mode == RP_PREFILL_ROWS32 ? (int64_t)(max_q_len + 127) / 128 * nh * num_seqs
                                                       : q_tiles * nh * num_seqs;
    const int64_t target = (int64_t)PF_SPLIT_BLOCKS_PER_SM * num_sms;
    if (grid >= target || max_kv_len < 2 * (int64_t)max_q_len) return p;
    const int64_t base = q_tiles * (odd_group ? nh : nh / 2) * num_seqs; /* the split blocks per chunk */
    int64_t n = (target + base - 1) / base;
    if (n > ((int64_t)max_kv_len + PF_BN - 1) / PF_BN / PF_SPLIT_MIN_TILES)
        n = ((int64_t)max_kv_len + PF_BN - 1) / PF_BN / PF_SPLIT_MIN_TILES;
    if (n > PF_MAX_SPLITS) n = PF_MAX_SPLITS;
    while (n >= 2 && rp_attn_split_bytes((size_t)T * nh, (int)n, hd) > workspace_bytes) n--;
    if (n >= 2) {
        p.mode = odd_group ? RP_PREFILL_ROWS16 : RP_PREFILL_HEADS2;
        p.splits = (int)n;
    }
    return p;
}

extern "C" int rp_attn_prefill_splits(int num_sms, int T, int num_seqs, int max_q_len, int max_kv_len, int nh,
                                      int nkv, int hd, size_t workspace_bytes) {
    if (T <= 0 || num_seqs <= 0 || max_q_len <= 0 || nkv <= 0 || nh % nkv != 0) return 1;
    return prefill_plan(num_sms, T, num_seqs, max_q_len, max_kv_len, nh, nkv, hd, workspace_bytes).splits;
}

/* The plan splits only a grid under target = PF_SPLIT_BLOCKS_PER_SM x SMs
 * blocks, into n <= ceil(target / base) chunks where base, the split grid,
 * is q_tiles x nh / HM x seqs blocks of 64 positions and HM heads: n >= 2
 * needs base < target, and the T <= 64 q_tiles seqs tokens make T nh <= 64
 * HM base, so T nh n < 64 HM (target + base) < 128 HM target (<= 256
 * target) partial rows; never more than max_tokens x nh x PF_MAX_SPLITS. */
extern "C" size_t rp_attn_prefill_workspace_bytes(int max_tokens, int nh, int hd, int num_sms) {
    size_t rows = (size_t)256 * PF_SPLIT_BLOCKS_PER_SM * num_sms;
    const size_t cap = (size_t)max_tokens * nh * PF_MAX_SPLITS;
    if (rows > cap) rows = cap;
    return rp_attn_split_bytes(rows, 1, hd);
}

extern "C" size_t rp_attn_prefill_split_bytes(int T, int nh, int hd, int num_splits) {
    return rp_attn_split_bytes((size_t)T * nh, num_splits, hd);
}

static int pf_mode_set = -1, pf_splits_set = -1;
extern "C" void rp_k_attn_prefill_set_mode(int mode) { pf_mode_set = mode; }
extern "C" void rp_k_attn_prefill_set_splits(int num_splits) { pf_splits_set = num_splits; }

extern "C" int rp_k_attn_prefill(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out,
                                 void *workspace, size_t workspace_bytes, int T, int num_seqs, int max_q_len,
                                 int max_kv_len, int nh, int nkv, int hd, cudaStream_t stream) {
    if (T <= 0 || num_seqs <= 0 || max_q_len <= 0) return cudaSuccess;
    if (nkv <= 0 || nh % nkv != 0 || meta.page_size <= 0) return (int)cudaErrorInvalidValue;
    const bool fp8 = kv.format == RP_KV_FORMAT_E4M3;
    if (fp8 && (!(kv.k_scale > 0.0f) || !(kv.v_scale > 0.0f))) return (int)cudaErrorInvalidValue;
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
            sms = 132;
    }
    if (!workspace) workspace_bytes = 0;
    pf_plan p = prefill_plan(sms, T, num_seqs, max_q_len, max_kv_len, nh, nkv, hd, workspace_bytes);
    if (pf_splits_set == 1) p = prefill_plan(sms, T, num_seqs, max_q_len, max_kv_len, nh, nkv, hd, 0);
    if (pf_splits_set > 1) {
        p.splits = pf_splits_set;
        p.mode = (nh / nkv) % 2 ? RP_PREFILL_ROWS16 : RP_PREFILL_HEADS2;
        if (rp_attn_split_bytes((size_t)T * nh, p.splits, hd) > workspace_bytes) return (int)cudaErrorInvalidValue;
    }
    if (pf_mode_set >= RP_PREFILL_ROWS16 && pf_mode_set <= RP_PREFILL_HEADS2) p.mode = pf_mode_set;
    if (p.mode == RP_PREFILL_HEADS2 && (nh / nkv) % 2) p.mode = RP_PREFILL_ROWS32;
#define PF_ARGS p.mode, p.splits, workspace, qkv, kv, meta, out, T, num_seqs, max_q_len, nh, nkv, stream
    if (hd == 128) return fp8 ? prefill_mode<128, true>(PF_ARGS) : prefill_mode<128, false>(PF_ARGS);
    if (hd == 64) return fp8 ? prefill_mode<64, true>(PF_ARGS) : prefill_mode<64, false>(PF_ARGS);
#undef PF_ARGS
    return (int)cudaErrorInvalidValue;
}

/* ---- a step's attention over its work list (rp_k_attn_step) ---------- */

/* Query positions a work item covers in each block shape. */
static int pf_mode_rows(int mode) { return mode == RP_PREFILL_ROWS32 || mode == RP_PREFILL_SM90 ? 128 : 64; }
static int pf_mode_heads(int mode) { return mode == RP_PREFILL_HEADS2 ? 2 : 1; }

/* Items of a step up to tokens tokens and max_seqs sequences, unsplit: each
 * sequence's last tile may be partial. With splits the plan keeps items x
 * heads x splits under target + items x heads (prefill_plan's bound), so
 * target / heads + 1 more items cover every split. */
static int pf_item_cap(int tokens, int max_seqs, int mode, int nh, int num_sms) {
    const int rows = pf_mode_rows(mode), heads = nh / pf_mode_heads(mode);
    const int seqs = max_seqs < tokens ? max_seqs : tokens;
    const int q_cap = (tokens + rows - 1) / rows + seqs;
    return 2 * q_cap + PF_SPLIT_BLOCKS_PER_SM * num_sms / heads + 1;
}

extern "C" int rp_attn_step_max_items(int max_tokens, int max_seqs, int num_sms, int nh, int nkv) {
    (void)nkv;
    return pf_item_cap(max_tokens, max_seqs, RP_PREFILL_ROWS16, nh, num_sms); /* the most: 64-row items, one head */
}

/* The block shape is the bucket's, as prefill_plan picks it for one
 * sequence of the bucket's tokens: the two-head block where that grid covers
 * the SMs (32 rows of one head where the group is odd), else 64 rows of one
 * head. Every step of the bucket then runs the same kernel, eager or
 * captured. */
extern "C" rp_attn_step_shape rp_attn_step_shape_for(int tokens, int max_seqs, int dec_splits, int num_sms, int nh,
                                                     int nkv, int hd, int page_size, size_t ws_bytes,
                                                     rp_kv_format kv_format) {
    rp_attn_step_shape sh;
    memset(&sh, 0, sizeof sh);
    const bool odd_group = nkv <= 0 || (nh / nkv) % 2 != 0;
    const int64_t big = (int64_t)(tokens + 63) / 64 * (nh / 2);
    sh.tokens = tokens;
    sh.dec_seqs = max_seqs < tokens ? max_seqs : tokens;
    sh.dec_splits = dec_splits > 0 ? dec_splits : 1;
    sh.pf_mode = big >= num_sms ? (odd_group ? RP_PREFILL_ROWS32 : RP_PREFILL_HEADS2) : RP_PREFILL_ROWS16;
    sh.pf_rows = pf_mode_rows(sh.pf_mode);
    sh.pf_items = pf_item_cap(tokens, max_seqs, sh.pf_mode, nh, num_sms);
    sh.parts = ws_bytes > 256 ? (ws_bytes - 256) / ((size_t)hd * sizeof(float) + sizeof(float2)) : 0;
    /* a split needs room for at least two partial results of every token */
    sh.pf_split = sh.parts >= (size_t)2 * tokens * nh;
    const bool small_grid = sh.pf_mode == RP_PREFILL_ROWS16;
    /* where the keys may be split, the two-head block (as prefill_plan
     * takes for a split): every K/V tile it reads feeds two heads, which is
     * what a short chunk after a long prefix is bound by */
    if (sh.pf_split && !odd_group && sh.pf_mode == RP_PREFILL_ROWS16) {
        sh.pf_mode = RP_PREFILL_HEADS2;
        sh.pf_rows = pf_mode_rows(sh.pf_mode);
        sh.pf_items = pf_item_cap(tokens, max_seqs, sh.pf_mode, nh, num_sms);
    }
    /* Where the grid is large, the Hopper kernel (2.0-2.6x the mma.sync
     * one at 2k-16k tokens; bench/RESULTS.md), which does not split; bf16
     * caches only: its bulk copies bring K/V pages into the wgmma's shared
     * memory as they are, with no step to widen e4m3 */
    if (!small_grid && kv_format == RP_KV_FORMAT_BF16 && rp_attn_prefill_sm90_supported(hd, page_size)) {
        sh.pf_mode = RP_PREFILL_SM90;
        sh.pf_rows = pf_mode_rows(sh.pf_mode);
        sh.pf_items = pf_item_cap(tokens, max_seqs, sh.pf_mode, nh, num_sms);
        sh.pf_split = 0;
    }
    return sh;
}

typedef struct pf_item_key {
    int32_t work, s, i0;
} pf_item_key;

/* Most keys first (the causal tiles that take longest), so that short ones
 * fill the tail; then by sequence and row, so the order is total. */
static int pf_item_cmp(const void *a, const void *b) {
    const pf_item_key *x = (const pf_item_key *)a, *y = (const pf_item_key *)b;
    if (x->work != y->work) return x->work > y->work ? -1 : 1;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->i0 < y->i0 ? -1 : x->i0 > y->i0;
}

extern "C" int rp_attn_step_plan(const rp_attn_step_shape *sh, const int32_t *seq_start, const int32_t *seq_kv_len,
                                 int num_seqs, int num_sms, int nh, int nkv, int hd, int32_t *hdr, int32_t *items) {
    (void)nkv;
    memset(hdr, 0, RP_ATTN_HDR_LEN * sizeof *hdr);
    const int T = num_seqs > 0 ? seq_start[num_seqs] : 0;
    if (T > sh->tokens || num_seqs > sh->tokens) return -1;
    int n_dec = 0;
    while (n_dec < num_seqs && n_dec < sh->dec_seqs && seq_start[n_dec + 1] - seq_start[n_dec] == 1) n_dec++;
    const int rows = sh->pf_rows, heads = nh / pf_mode_heads(sh->pf_mode);
    /* the items, unsplit, into items[] as keys first (sorted in place) */
    int n = 0, max_q = 0, max_kv = 0;
    const int cap = sh->pf_items;
    pf_item_key *keys = (pf_item_key *)items; /* 3 ints each, as an item */
    static_assert(sizeof(pf_item_key) == RP_ATTN_ITEM_INTS * sizeof(int32_t), "a key is an item's size");
    for (int s = n_dec; s < num_seqs; s++) {
        const int q = seq_start[s + 1] - seq_start[s], kv = seq_kv_len[s];
        if (q <= 0) continue;
        if (q > max_q) max_q = q;
        if (kv > max_kv) max_kv = kv;
        for (int i0 = 0; i0 < q; i0 += rows) {
            if (n >= cap) return -1;
            const int end = i0 + rows < q ? i0 + rows : q;
            keys[n++] = (pf_item_key){kv - q + end, s, i0};
        }
    }
    qsort(keys, (size_t)n, sizeof *keys, pf_item_cmp);
    /* prefill_plan's split rule over the list: where its blocks do not fill
     * the GPU and the keys are mostly a cached prefix */
    int splits = 1;
    const int64_t target = (int64_t)PF_SPLIT_BLOCKS_PER_SM * num_sms, base = (int64_t)n * heads;
    if (sh->pf_split && n > 0 && base < target && max_kv >= 2 * (int64_t)max_q) {
        int64_t k = (target + base - 1) / base;
        const int64_t tiles = ((int64_t)max_kv + PF_BN - 1) / PF_BN / PF_SPLIT_MIN_TILES;
        if (k > tiles) k = tiles;
        if (k > PF_MAX_SPLITS) k = PF_MAX_SPLITS;
        while (k >= 2 && ((size_t)T * nh * (size_t)k > sh->parts || (int64_t)n * k > cap)) k--;
        if (k >= 2) splits = (int)k;
    }
    /* keys -> items (s, i0, split), each unsplit item becoming splits items
     * side by side, written from the back so nothing unread is overwritten */
    for (int i = n - 1; i >= 0; i--) {
        const pf_item_key key = keys[i];
        for (int k = splits - 1; k >= 0; k--) {
            int32_t *it = items + ((int64_t)i * splits + k) * RP_ATTN_ITEM_INTS;
            it[0] = key.s, it[1] = key.i0, it[2] = k;
        }
    }
    hdr[RP_ATTN_HDR_DECODE_SEQS] = n_dec;
    hdr[RP_ATTN_HDR_PF_ITEMS] = n * splits;
    hdr[RP_ATTN_HDR_PF_SPLITS] = splits;
    if (splits > 1) {
        hdr[RP_ATTN_HDR_PF_MERGE_BEGIN] = seq_start[n_dec] * nh;
        hdr[RP_ATTN_HDR_PF_MERGE_END] = T * nh;
    }
    hdr[RP_ATTN_HDR_DEC_SPLITS] = sh->dec_splits;
    if (sh->dec_splits > 1) hdr[RP_ATTN_HDR_DEC_MERGE_END] = n_dec * nh;
    (void)hd;
    return 0;
}

template <int HD, int MI, int HM, bool FP8>
static int prefill_list_launch(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, float *ws_o,
                               float2 *ws_ml, const rp_attn_step_shape *sh, int nh, int nkv, cudaStream_t stream) {
    static unsigned attr_set; /* per device (rp_first_on_device) */
    using SM = pf_smem<HD, MI, HM, FP8>;
    if (rp_first_on_device(&attr_set)) {
        cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<HD, MI, HM, true, true, FP8>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM::BYTES);
        if (e != cudaSuccess) return (int)e;
    }
    return rp_launch(attn_prefill_kernel<HD, MI, HM, true, true, FP8>, dim3(sh->pf_items, nh / HM, 1),
                     dim3(PF_WARPS * 32), SM::BYTES, stream, qkv, (const void *)kv.k, (const void *)kv.v, meta, out,
                     nh, nkv, ws_o, ws_ml, 1, FP8 ? kv.k_scale : 1.0f, FP8 ? kv.v_scale : 1.0f);
}

template <int HD, bool FP8>
static int step_prefill(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, void *workspace,
                        const rp_attn_step_shape *sh, int nh, int nkv, cudaStream_t stream) {
    float *ws_o = nullptr;
    float2 *ws_ml = nullptr;
    rp_attn_split_at(workspace, sh->parts, 1, HD, &ws_o, &ws_ml);
    int rc;
#define PF_ARGS qkv, kv, meta, out, ws_o, ws_ml, sh, nh, nkv, stream
    switch (sh->pf_mode) {
    case RP_PREFILL_ROWS16: rc = prefill_list_launch<HD, 1, 1, FP8>(PF_ARGS); break;
    case RP_PREFILL_ROWS32: rc = prefill_list_launch<HD, 2, 1, FP8>(PF_ARGS); break;
    default: rc = prefill_list_launch<HD, 2, 2, FP8>(PF_ARGS); break;
    }
#undef PF_ARGS
    if (rc || !sh->pf_split) return rc;
    return rp_attn_merge_range(ws_o, ws_ml, out, meta.hdr + RP_ATTN_HDR_PF_MERGE_BEGIN,
                               meta.hdr + RP_ATTN_HDR_PF_SPLITS, rp_attn_merge_blocks(sh->tokens * nh), HD, stream);
}

extern "C" int rp_k_attn_step(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, void *workspace,
                              const rp_attn_step_shape *sh, int nh, int nkv, int hd, cudaStream_t stream) {
    if (!meta.hdr || !meta.pf_items || sh->tokens <= 0 || nkv <= 0 || nh % nkv != 0 || meta.page_size <= 0)
        return (int)cudaErrorInvalidValue;
    if (sh->pf_mode == RP_PREFILL_HEADS2 && (nh / nkv) % 2) return (int)cudaErrorInvalidValue;
    const bool fp8 = kv.format == RP_KV_FORMAT_E4M3;
    /* the Hopper kernel reads bf16 pages only (rp_attn_step_shape_for) */
    if (fp8 && sh->pf_mode == RP_PREFILL_SM90) return (int)cudaErrorInvalidValue;
    int rc = rp_k_attn_decode(qkv, kv, meta, out, workspace, sh->dec_seqs, nh, nkv, hd, sh->dec_splits, stream);
    if (rc) return rc;
    if (sh->pf_mode == RP_PREFILL_SM90)
        return rp_k_attn_prefill_sm90_list(qkv, (const rp_bf16 *)kv.k, (const rp_bf16 *)kv.v, meta, out, sh->tokens,
                                           sh->pf_items, nh, nkv, hd, stream);
#define PF_ARGS qkv, kv, meta, out, workspace, sh, nh, nkv, stream
    if (hd == 128) return fp8 ? step_prefill<128, true>(PF_ARGS) : step_prefill<128, false>(PF_ARGS);
    if (hd == 64) return fp8 ? step_prefill<64, true>(PF_ARGS) : step_prefill<64, false>(PF_ARGS);
#undef PF_ARGS
    return (int)cudaErrorInvalidValue;
}
