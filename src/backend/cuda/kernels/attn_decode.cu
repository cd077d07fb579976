/* Decode attention over the paged KV cache (flash-decoding).
 *
 * One query token per sequence. A block owns (sequence, kv head, split):
 * all G = nh / nkv query heads that share the kv head are the M side of a
 * tensor-core mma (padded to 16 rows), so each K and V row is read from
 * memory once for the whole group. The keys of a sequence are cut into
 * num_splits ranges, fixed per graph; the range length is computed on the
 * device from seq_kv_len, so a captured graph stays valid as sequences grow,
 * and ranges past a sequence's end are empty. A second kernel merges the
 * splits' (max, sum, unnormalised output) into the bf16 result (with one
 * split the first kernel writes it, and there is no second launch).
 *
 * Within a block, 4 warps take 16-key tiles in turn (two at a time in
 * flight in the heads-as-M kernel) and keep their own online-softmax
 * state in registers; the warps meet once, at the end,
 * through shared memory (no communication between blocks: the merge is a
 * separate launch). Each warp loads its tile straight into registers, with
 * one page lookup per tile: at every batch size that is ahead of a cp.async
 * ring per warp (bench/RESULTS.md).
 *
 * Where the grid has at least three blocks per SM, attn_decode_t_kernel
 * does the same with the tile's products transposed (keys as M, heads as
 * N: no padded rows, half the mma and accumulators, four blocks per SM);
 * dec_trans says when and why.
 *
 * Fragment trick (see gemv.cu): a dot product does not care how its index is
 * numbered, so each thread loads 8 (K) or 8/16 (V) consecutive bf16 with one
 * or two 16-byte loads and the mma's k/n numbering is permuted to match.
 * For V the output dimension is permuted: n-tile j, column n holds dim
 * n * (hd / 8) + j, undone when the result is stored.
 *
 * An e4m3 cache (FP8: --kv-cache-dtype fp8) is read the same way at half
 * the bytes, 8 elements per 8-byte load, widened in registers to f16 by one
 * cvt per pair (exact: fp8.cuh), and the products are f16 mma (fp32
 * accumulate): q is converted to f16 once as it is loaded (saturated to
 * +-65504) and the probabilities are packed as f16 instead of bf16 (they
 * lie in [0, 1]: 3 more bits). Widening to bf16 cost four instructions a
 * pair in the inner loop, which made the fp8 cache's attention ~3x slower
 * than bf16's at batch 32. The fragments are the bf16 kernel's, element for
 * element. The scales are the caller's: k_scale joins the
 * softmax scale (q . k = k_scale q . k8), v_scale multiplies the output
 * (sum p v = v_scale sum p v8), where the warps' results are combined. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "attn_split.cuh"
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"

#define DEC_WARPS 4
#define DEC_TILE 16 /* keys per warp iteration */
#define DEC_MAX_GROUP 16

static __device__ __forceinline__ int64_t key_slot(const int32_t *row, int page_size, int j) {
    return (int64_t)row[j / page_size] * page_size + j % page_size;
}

/* What a block of either kernel owns, (sequence, kv head, split), and the
 * split's key range, from the device-side length (multiples of the block's
 * tile sweep, so that few tiles are partial; ranges past a sequence's end
 * are empty). */
struct dec_block {
    int s, kvh, split, G, warp, g, c, begin, end;
    int64_t kv_stride;
    const int32_t *prow;
    /* A tile starts at a multiple of 16 keys, so where pages hold a
     * multiple of 16 keys its keys share one page: one page-table load and
     * one division per tile instead of six of each per thread. */
    bool tile_in_page;
};

/* Also the kernel's PDL point: everything below reads the step's metadata,
 * which the kernel before may still be writing. */
template <int HD>
static __device__ __forceinline__ dec_block dec_block_of(const rp_attn_meta &meta, int nh, int nkv, int num_splits) {
    rp_pdl_trigger();
    rp_pdl_wait();
    dec_block b;
    b.s = blockIdx.z, b.kvh = blockIdx.y, b.split = blockIdx.x;
    /* past a step's decodes (rp_k_attn_step's grid is the bucket's): nothing
     * of the sequence is read, the kernel returns */
    if (meta.hdr && b.s >= meta.hdr[RP_ATTN_HDR_DECODE_SEQS]) {
        b.s = -1;
        return b;
    }
    b.G = nh / nkv;
    b.warp = threadIdx.x >> 5;
    b.g = (threadIdx.x & 31) >> 2, b.c = threadIdx.x & 3;
    const int kv_len = meta.seq_kv_len[b.s];
    b.kv_stride = (int64_t)nkv * HD;
    b.prow = meta.page_table + (int64_t)meta.seq_page_row[b.s] * meta.page_table_stride;
    const int sweep = DEC_WARPS * DEC_TILE;
    int chunk = (kv_len + num_splits - 1) / num_splits;
    chunk = (chunk + sweep - 1) / sweep * sweep;
    b.begin = b.split * chunk;
    b.end = min(kv_len, b.begin + chunk);
    b.tile_in_page = meta.page_size % DEC_TILE == 0;
    return b;
}

/* A cache element: bf16 bits or an e4m3 byte. */
template <bool FP8> struct dec_kv_elem { typedef uint16_t type; };
template <> struct dec_kv_elem<true> { typedef uint8_t type; };

/* 8 cache elements as loaded: one 16-byte load of bf16, or one 8-byte
 * load of e4m3. A tile stays like this in registers until its products,
 * and e4m3 is widened there (dec_widen8), not at the load: the cvts then sat
 * in each load's branch (keys past the end load nothing), and ptxas issued
 * the split kernel's next loads only after they had waited for the data,
 * 12 dependent rounds of loads per two tiles instead of one (bench/RESULTS.md,
 * issue 39). */
template <bool FP8> struct dec_kv_raw { typedef uint4 type; };
template <> struct dec_kv_raw<true> { typedef uint2 type; };

template <bool FP8>
static __device__ __forceinline__ typename dec_kv_raw<FP8>::type dec_load8(const typename dec_kv_elem<FP8>::type *p) {
    if constexpr (FP8) return rp_ld_act8(p);
    else return rp_ld_act(p);
}

/* Nothing loaded (a key past the end): zeros, which widen to zeros. */
template <bool FP8> static __device__ __forceinline__ typename dec_kv_raw<FP8>::type dec_zero8(void) {
    if constexpr (FP8) return make_uint2(0, 0);
    else return make_uint4(0, 0, 0, 0);
}

/* 8 loaded cache elements as the mma's operands: bf16 as they are, e4m3
 * widened to 8 f16 by four cvts. */
template <bool FP8> static __device__ __forceinline__ uint4 dec_widen8(const typename dec_kv_raw<FP8>::type &w) {
    if constexpr (FP8) return rp_e4m3x8_f16x8(w.x, w.y);
    else return w;
}

/* A tile's 4 V rows (N loads each) as the mma's operands: the loaded
 * bf16 rows themselves, or the e4m3 rows widened into w. */
template <bool FP8, int N>
static __device__ __forceinline__ const uint4 (*dec_widen_rows(const typename dec_kv_raw<FP8>::type (&vr)[4][N],
                                                               uint4 (&w)[4][N]))[N] {
    if constexpr (FP8) {
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int u = 0; u < N; u++) w[r][u] = dec_widen8<FP8>(vr[r][u]);
        return w;
    } else {
        return vr;
    }
}

/* 8 q elements (bf16 in qkv, loaded as they are) as the mma's operands:
 * f16 against an e4m3 cache, converted after all of q's loads were issued
 * (zeros stay zeros). */
template <bool FP8> static __device__ __forceinline__ uint4 dec_q8(const uint4 &q) {
    return FP8 ? rp_bf16x8_f16x8_sat(q) : q;
}

/* Two probabilities as an mma operand pair: bf16, or f16 against an e4m3
 * cache. */
template <bool FP8>
static __device__ __forceinline__ uint32_t dec_pack_p(float lo, float hi) {
    return FP8 ? rp_pack_f16x2_sat(lo, hi) : rp_pack_bf16x2(lo, hi);
}

/* The tile's products: bf16 mma, or f16 mma for an e4m3 cache. */
template <bool FP8>
static __device__ __forceinline__ void dec_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    if constexpr (FP8) rp_mma_16816_f16(d, a0, a1, a2, a3, b0, b1);
    else rp_mma_16816(d, a0, a1, a2, a3, b0, b1);
}

/* This thread's part of the tile at key base (< end; keys past end:
 * zeros), as loaded (dec_kv_raw): K rows of keys base + g (kr[0]) and
 * base + g + 8 (kr[1]), 8 dims at c * 8 + 32 ch each; V rows of keys
 * base + 2c, + 1, + 8, + 9 (vr[0..3]), dims g * HD / 8 .. + HD / 8 - 1. */
template <int HD, bool FP8>
static __device__ __forceinline__ void dec_load_tile(const dec_block &b, const rp_attn_meta &meta,
                                                     const typename dec_kv_elem<FP8>::type *k_cache,
                                                     const typename dec_kv_elem<FP8>::type *v_cache, int base,
                                                     typename dec_kv_raw<FP8>::type (&kr)[2][HD / 32],
                                                     typename dec_kv_raw<FP8>::type (&vr)[4][HD / 64]) {
    typedef typename dec_kv_elem<FP8>::type KV;
    const int64_t slot0 = b.tile_in_page ? key_slot(b.prow, meta.page_size, base) - base : 0;
    auto slot = [&](int j) { return b.tile_in_page ? slot0 + j : key_slot(b.prow, meta.page_size, j); };
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = base + h * 8 + b.g;
        const bool ok = j < b.end;
        const KV *kp = k_cache + (ok ? slot(j) : 0) * b.kv_stride + (int64_t)b.kvh * HD + b.c * 8;
#pragma unroll
        for (int ch = 0; ch < HD / 32; ch++) kr[h][ch] = ok ? dec_load8<FP8>(kp + ch * 32) : dec_zero8<FP8>();
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int j = base + 2 * b.c + (r & 1) + (r >> 1) * 8;
        const bool ok = j < b.end;
        const KV *vp = v_cache + (ok ? slot(j) : 0) * b.kv_stride + (int64_t)b.kvh * HD + b.g * (HD / 8);
#pragma unroll
        for (int u = 0; u < HD / 64; u++) vr[r][u] = ok ? dec_load8<FP8>(vp + u * 8) : dec_zero8<FP8>();
    }
}

/* Shared memory of both kernels: the warps' partial results for the merge. */
template <int HD> static constexpr __host__ __device__ size_t dec_merge_bytes(void) {
    return (size_t)DEC_WARPS * DEC_MAX_GROUP * (HD + 1) * 4 + 2 * (size_t)DEC_WARPS * DEC_MAX_GROUP * 4;
}

/* Where those lie: per warp and query head, the unnormalised output row
 * (padded by one float), then the running maxima, then the sums. */
template <int HD> struct dec_merge_smem {
    float (*o)[DEC_MAX_GROUP][HD + 1];
    float (*m)[DEC_MAX_GROUP];
    float (*l)[DEC_MAX_GROUP];
};
template <int HD> __device__ __forceinline__ dec_merge_smem<HD> dec_merge_smem_at(uint4 *smem) {
    dec_merge_smem<HD> sm;
    sm.o = reinterpret_cast<float (*)[DEC_MAX_GROUP][HD + 1]>(smem);
    sm.m = reinterpret_cast<float (*)[DEC_MAX_GROUP]>(sm.o + DEC_WARPS);
    sm.l = sm.m + DEC_WARPS;
    return sm;
}

/* The block's warps' (max, sum, unnormalised output) per query head,
 * combined in warp order: the split's partial result (ws_o, ws_ml), or with
 * one split (out set) the bf16 result itself, without the merge launch.
 * An e4m3 cache's output times v_scale (FP8): the merge of splits is
 * linear in it. */
template <int HD, bool FP8>
__device__ void dec_merge_warps(const dec_merge_smem<HD> &sm, float *ws_o, float2 *ws_ml, uint16_t *out, int s,
                                int kvh, int G, int nh, int num_splits, int split, float v_scale) {
    for (int i = threadIdx.x; i < G * HD; i += DEC_WARPS * 32) {
        const int r = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, sm.m[w][r]);
        float acc = 0.0f, L = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                const float f = exp2f(sm.m[w][r] - M); /* 0 for a warp that saw no key */
                acc += f * sm.o[w][r][d];
                L += f * sm.l[w][r];
            }
        }
        if (FP8) acc *= v_scale;
        const int h = kvh * G + r;
        const int64_t idx = ((int64_t)s * nh + h) * num_splits + split;
        if (out) {
            out[idx * HD + d] = rp_f32_bf16(L > 0.0f ? acc / L : 0.0f);
            continue;
        }
        ws_o[idx * HD + d] = acc;
        if (d == 0) ws_ml[idx] = make_float2(M, L);
    }
}

template <int HD, bool FP8>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    attn_decode_split_kernel(const uint16_t *__restrict__ qkv, const typename dec_kv_elem<FP8>::type *__restrict__ k_cache,
                             const typename dec_kv_elem<FP8>::type *__restrict__ v_cache, rp_attn_meta meta, float *__restrict__ ws_o,
                             float2 *__restrict__ ws_ml, uint16_t *__restrict__ out, int nh, int nkv, int num_splits,
                             float k_scale, float v_scale) {
    constexpr int KCH = HD / 32; /* 32-dim chunks: one uint4 of K per thread each */
    constexpr int DPT = HD / 8;  /* V dims per thread = PV n-tiles */
    extern __shared__ uint4 dec_smem[];
    const dec_merge_smem<HD> sm = dec_merge_smem_at<HD>(dec_smem);
    const dec_block b = dec_block_of<HD>(meta, nh, nkv, num_splits);
    if (b.s < 0) return;
    const int G = b.G, warp = b.warp, g = b.g, c = b.c;

    /* q of heads g and g + 8 of this group, raw bf16 words (exact; f16 for an e4m3 cache). */
    const uint16_t *qbase = qkv + (int64_t)b.s * (nh + 2 * nkv) * HD + (int64_t)b.kvh * G * HD;
    uint4 q_lo[KCH], q_hi[KCH];
#pragma unroll
    for (int ch = 0; ch < KCH; ch++) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        q_lo[ch] = g < G ? rp_ld_act(qbase + (int64_t)g * HD + ch * 32 + c * 8) : z;
        q_hi[ch] = g + 8 < G ? rp_ld_act(qbase + (int64_t)(g + 8) * HD + ch * 32 + c * 8) : z;
    }
#pragma unroll
    for (int ch = 0; ch < KCH; ch++) q_lo[ch] = dec_q8<FP8>(q_lo[ch]), q_hi[ch] = dec_q8<FP8>(q_hi[ch]);
    /* exp2 domain; an e4m3 cache's k_scale folded in (bf16: the product as it was) */
    const float qk_scale = rsqrtf((float)HD) * 1.4426950408889634f * (FP8 ? k_scale : 1.0f);

    float o[DPT][4];
#pragma unroll
    for (int j = 0; j < DPT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

    const int end = b.end;
    typedef typename dec_kv_raw<FP8>::type KVR;
    auto tile = [&](int base, const KVR (&kr)[2][KCH], const KVR (&vr)[4][DPT / 8]) {

        /* S = Q K^T for the 16 keys: two n-tiles of 8. */
        float sc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int ch = 0; ch < KCH; ch++) {
                const uint4 k = dec_widen8<FP8>(kr[nt][ch]);
                dec_mma<FP8>(sc[nt], q_lo[ch].x, q_hi[ch].x, q_lo[ch].y, q_hi[ch].y, k.x, k.y);
                dec_mma<FP8>(sc[nt], q_lo[ch].z, q_hi[ch].z, q_lo[ch].w, q_hi[ch].w, k.z, k.w);
            }
        }
        /* Column n of n-tile nt is key base + nt*8 + n. */
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool ok = base + nt * 8 + 2 * c + e < end;
                sc[nt][e] = ok ? sc[nt][e] * qk_scale : -INFINITY;
                sc[nt][2 + e] = ok ? sc[nt][2 + e] * qk_scale : -INFINITY;
                mx_lo = fmaxf(mx_lo, sc[nt][e]);
                mx_hi = fmaxf(mx_hi, sc[nt][2 + e]);
            }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(RP_FULL_MASK, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(RP_FULL_MASK, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(RP_FULL_MASK, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(RP_FULL_MASK, mx_hi, 2));
        /* The tile holds at least one valid key, so the new max is finite. */
        const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
        const float a_lo = exp2f(m_lo - mn_lo), a_hi = exp2f(m_hi - mn_hi);
        m_lo = mn_lo;
        m_hi = mn_hi;
        float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                sc[nt][e] = exp2f(sc[nt][e] - mn_lo);
                sc[nt][2 + e] = exp2f(sc[nt][2 + e] - mn_hi);
                ps_lo += sc[nt][e];
                ps_hi += sc[nt][2 + e];
            }
        l_lo = l_lo * a_lo + ps_lo;
        l_hi = l_hi * a_hi + ps_hi;
        const uint32_t p0 = dec_pack_p<FP8>(sc[0][0], sc[0][1]), p1 = dec_pack_p<FP8>(sc[0][2], sc[0][3]);
        const uint32_t p2 = dec_pack_p<FP8>(sc[1][0], sc[1][1]), p3 = dec_pack_p<FP8>(sc[1][2], sc[1][3]);

        /* O = O * alpha + P V; n-tile j takes element j of each V row. */
        uint4 vw[4][DPT / 8];
        const uint4 (*const vrow)[DPT / 8] = dec_widen_rows<FP8>(vr, vw);
        const uint32_t *v0 = reinterpret_cast<const uint32_t *>(vrow[0]);
        const uint32_t *v1 = reinterpret_cast<const uint32_t *>(vrow[1]);
        const uint32_t *v2 = reinterpret_cast<const uint32_t *>(vrow[2]);
        const uint32_t *v3 = reinterpret_cast<const uint32_t *>(vrow[3]);
#pragma unroll
        for (int j = 0; j < DPT; j++) {
            o[j][0] *= a_lo;
            o[j][1] *= a_lo;
            o[j][2] *= a_hi;
            o[j][3] *= a_hi;
            const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;
            const uint32_t b0 = __byte_perm(v0[j >> 1], v1[j >> 1], sel);
            const uint32_t b1 = __byte_perm(v2[j >> 1], v3[j >> 1], sel);
            dec_mma<FP8>(o[j], p0, p1, p2, p3, b0, b1);
        }
        };
    /* Two tiles' loads in flight per warp before either is computed (the
     * same tiles per warp in the same order as one at a time, so the same
     * sums): with few blocks per SM (few sequences, long contexts) one tile
     * at a time left HBM idle while the warp computed. One sequence at
     * 32,768 tokens, llama3-8b heads, 32 splits: 58.9 -> 56.9 us, 16
     * splits 74.2 -> 60.8; batch 128 at 4096 unchanged (H100,
     * bench/RESULTS.md). An L2 prefetch of the next tile instead lost
     * everywhere but there (batch 128 at 4096: 728 -> 777 us). */
    for (int base = b.begin + warp * DEC_TILE; base < end; base += 2 * DEC_WARPS * DEC_TILE) {
        KVR kr0[2][KCH], kr1[2][KCH];
        KVR vr0[4][DPT / 8], vr1[4][DPT / 8];
        const int base1 = base + DEC_WARPS * DEC_TILE;
        dec_load_tile<HD, FP8>(b, meta, k_cache, v_cache, base, kr0, vr0);
        if (base1 < end) dec_load_tile<HD, FP8>(b, meta, k_cache, v_cache, base1, kr1, vr1);
        tile(base, kr0, vr0);
        if (base1 < end) tile(base1, kr1, vr1);
    }

    /* Per-thread partial row sums -> row sums. */
    l_lo += __shfl_xor_sync(RP_FULL_MASK, l_lo, 1);
    l_lo += __shfl_xor_sync(RP_FULL_MASK, l_lo, 2);
    l_hi += __shfl_xor_sync(RP_FULL_MASK, l_hi, 1);
    l_hi += __shfl_xor_sync(RP_FULL_MASK, l_hi, 2);

    /* Meet the other warps: rows < G only. */
    if (c == 0) {
        if (g < G) {
            sm.m[warp][g] = m_lo;
            sm.l[warp][g] = l_lo;
        }
        if (g + 8 < G) {
            sm.m[warp][g + 8] = m_hi;
            sm.l[warp][g + 8] = l_hi;
        }
    }
#pragma unroll
    for (int j = 0; j < DPT; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = (2 * c + e) * DPT + j;
            if (g < G) sm.o[warp][g][d] = o[j][e];
            if (g + 8 < G) sm.o[warp][g + 8][d] = o[j][2 + e];
        }
    __syncthreads();
    dec_merge_warps<HD, FP8>(sm, ws_o, ws_ml, out, b.s, b.kvh, G, nh, num_splits, b.split, v_scale);
}

/* The same attention with the tile's products transposed: keys are the
 * mma's M (16 per tile) and the group's query heads its N (8 per n-tile),
 * so S^T = K Q^T and O^T += V^T P^T. With a group of up to 8 heads nothing
 * is padding (q as M padded G heads to 16 rows): half the mma, and the
 * accumulators of O^T take 32 registers instead of 64. P^T's B fragments
 * come from S^T's accumulators through movmatrix (an 8 x 8 transpose in
 * registers). Loads and the split range are those of the kernel above. */
/* four blocks per SM: 128 registers (12 bytes of spills); without the
 * bound (140 registers, three per SM) batch 128 is 1% slower */
#define DEC_T_MIN_BLOCKS 4
template <int HD, int NT, bool FP8>
__global__ void __launch_bounds__(DEC_WARPS * 32, DEC_T_MIN_BLOCKS)
    attn_decode_t_kernel(const uint16_t *__restrict__ qkv, const typename dec_kv_elem<FP8>::type *__restrict__ k_cache,
                         const typename dec_kv_elem<FP8>::type *__restrict__ v_cache, rp_attn_meta meta, float *__restrict__ ws_o,
                         float2 *__restrict__ ws_ml, uint16_t *__restrict__ out, int nh, int nkv, int num_splits,
                         float k_scale, float v_scale) {
    constexpr int KCH = HD / 32; /* 32-dim chunks: one uint4 of a K row per thread each */
    constexpr int DPT = HD / 8;  /* V dims per thread */
    constexpr int MT = HD / 16;  /* m-tiles of O^T: thread (g, c) row g is dim g * DPT + 2 mt, row g + 8 the next */
    constexpr int VU4 = DPT / 8; /* uint4 per V row per thread */
    extern __shared__ uint4 dec_smem[];
    const dec_merge_smem<HD> sm = dec_merge_smem_at<HD>(dec_smem);
    const dec_block b = dec_block_of<HD>(meta, nh, nkv, num_splits);
    if (b.s < 0) return;
    const int G = b.G, warp = b.warp, g = b.g, c = b.c, end = b.end;

    /* B fragments of Q^T: head nt * 8 + g, dims ch * 32 + c * 8 .. + 7 (k-step 0: x, y; 1: z, w) */
    const uint16_t *qbase = qkv + (int64_t)b.s * (nh + 2 * nkv) * HD + (int64_t)b.kvh * G * HD;
    uint4 qb[NT][KCH];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int ch = 0; ch < KCH; ch++)
            qb[nt][ch] = nt * 8 + g < G ? rp_ld_act(qbase + (int64_t)(nt * 8 + g) * HD + ch * 32 + c * 8)
                                        : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int ch = 0; ch < KCH; ch++) qb[nt][ch] = dec_q8<FP8>(qb[nt][ch]);
    /* exp2 domain; an e4m3 cache's k_scale folded in (bf16: the product as it was) */
    const float qk_scale = rsqrtf((float)HD) * 1.4426950408889634f * (FP8 ? k_scale : 1.0f);

    /* per n-tile: heads nt * 8 + 2c (index 0) and + 1 (index 1) */
    float o[NT][MT][4], m[NT][2], l[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        m[nt][0] = m[nt][1] = -INFINITY;
        l[nt][0] = l[nt][1] = 0.0f;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) o[nt][mt][0] = o[nt][mt][1] = o[nt][mt][2] = o[nt][mt][3] = 0.0f;
    }
    for (int base = b.begin + warp * DEC_TILE; base < end; base += DEC_WARPS * DEC_TILE) {
        typename dec_kv_raw<FP8>::type kl[2][KCH], vl[4][VU4];
        dec_load_tile<HD, FP8>(b, meta, k_cache, v_cache, base, kl, vl);
        uint4 kr[2][KCH], vr[4][VU4];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int ch = 0; ch < KCH; ch++) kr[h][ch] = dec_widen8<FP8>(kl[h][ch]);
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int u = 0; u < VU4; u++) vr[r][u] = dec_widen8<FP8>(vl[r][u]);
        /* S^T: rows keys base + g, + 8; columns heads nt * 8 + 2c, + 1 */
        float sc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int ch = 0; ch < KCH; ch++) {
                dec_mma<FP8>(sc[nt], kr[0][ch].x, kr[1][ch].x, kr[0][ch].y, kr[1][ch].y, qb[nt][ch].x, qb[nt][ch].y);
                dec_mma<FP8>(sc[nt], kr[0][ch].z, kr[1][ch].z, kr[0][ch].w, kr[1][ch].w, qb[nt][ch].z, qb[nt][ch].w);
            }
        }
        const bool ok_lo = base + g < end, ok_hi = base + g + 8 < end;
        uint32_t pb[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float mx[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                sc[nt][e] = ok_lo ? sc[nt][e] * qk_scale : -INFINITY;
                sc[nt][2 + e] = ok_hi ? sc[nt][2 + e] * qk_scale : -INFINITY;
                mx[e] = fmaxf(sc[nt][e], sc[nt][2 + e]);
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(RP_FULL_MASK, mx[e], 4));
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(RP_FULL_MASK, mx[e], 8));
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(RP_FULL_MASK, mx[e], 16));
                /* key base is in range, so the new max is finite */
                const float mn = fmaxf(m[nt][e], mx[e]), a = exp2f(m[nt][e] - mn);
                m[nt][e] = mn;
                sc[nt][e] = exp2f(sc[nt][e] - mn);
                sc[nt][2 + e] = exp2f(sc[nt][2 + e] - mn);
                l[nt][e] = l[nt][e] * a + (sc[nt][e] + sc[nt][2 + e]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    o[nt][mt][e] *= a;
                    o[nt][mt][2 + e] *= a;
                }
            }
            /* P^T's B fragments: transpose (key g, heads 2c, 2c + 1) into (head g, keys 2c, 2c + 1) */
            const uint32_t p_lo = dec_pack_p<FP8>(sc[nt][0], sc[nt][1]), p_hi = dec_pack_p<FP8>(sc[nt][2], sc[nt][3]);
            asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[nt][0]) : "r"(p_lo));
            asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[nt][1]) : "r"(p_hi));
        }
        /* O^T += V^T P^T: row g of m-tile mt is dim g * DPT + 2 mt (the low half of V word mt), row g + 8 the high half */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const uint32_t v0 = reinterpret_cast<const uint32_t *>(vr[0])[mt];
            const uint32_t v1 = reinterpret_cast<const uint32_t *>(vr[1])[mt];
            const uint32_t v2 = reinterpret_cast<const uint32_t *>(vr[2])[mt];
            const uint32_t v3 = reinterpret_cast<const uint32_t *>(vr[3])[mt];
            const uint32_t a0 = __byte_perm(v0, v1, 0x5410), a1 = __byte_perm(v0, v1, 0x7632);
            const uint32_t a2 = __byte_perm(v2, v3, 0x5410), a3 = __byte_perm(v2, v3, 0x7632);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) dec_mma<FP8>(o[nt][mt], a0, a1, a2, a3, pb[nt][0], pb[nt][1]);
        }
    }
    /* the warp's sums over its keys: lanes of one c hold the same heads */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            l[nt][e] += __shfl_xor_sync(RP_FULL_MASK, l[nt][e], 4);
            l[nt][e] += __shfl_xor_sync(RP_FULL_MASK, l[nt][e], 8);
            l[nt][e] += __shfl_xor_sync(RP_FULL_MASK, l[nt][e], 16);
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = nt * 8 + 2 * c + e;
            if (h >= G) continue;
            if (g == 0) sm.m[warp][h] = m[nt][e], sm.l[warp][h] = l[nt][e];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                sm.o[warp][h][g * DPT + 2 * mt] = o[nt][mt][e];
                sm.o[warp][h][g * DPT + 2 * mt + 1] = o[nt][mt][2 + e];
            }
        }
    __syncthreads();
    dec_merge_warps<HD, FP8>(sm, ws_o, ws_ml, out, b.s, b.kvh, G, nh, num_splits, b.split, v_scale);
}

/* out[r] = sum_i o_i 2^(m_i - M) / sum_i l_i 2^(m_i - M) over splits
 * (attn_split.cuh's layout; prefill attention's split merges here too):
 * row sh, dimension threadIdx.x. */
template <int HD>
__device__ __forceinline__ void merge_row(const float *__restrict__ ws_o, const float2 *__restrict__ ws_ml,
                                          uint16_t *__restrict__ out, int num_splits, int64_t sh) {
    const int d = threadIdx.x;
    const float2 *ml = ws_ml + sh * num_splits;
    float M = -INFINITY;
    for (int i = 0; i < num_splits; i++) M = fmaxf(M, ml[i].x);
    float acc = 0.0f, L = 0.0f;
    if (M != -INFINITY)
        for (int i = 0; i < num_splits; i++) {
            const float f = exp2f(ml[i].x - M);
            acc += f * ws_o[(sh * num_splits + i) * HD + d];
            L += f * ml[i].y;
        }
    out[sh * HD + d] = rp_f32_bf16(L > 0.0f ? acc / L : 0.0f);
}

/* A block per row (query * nh + head). */
template <int HD>
__global__ void attn_merge_splits_kernel(const float *__restrict__ ws_o, const float2 *__restrict__ ws_ml,
                                         uint16_t *__restrict__ out, int num_splits) {
    rp_pdl_trigger();
    rp_pdl_wait();
    merge_row<HD>(ws_o, ws_ml, out, num_splits, blockIdx.x);
}

/* The same over the rows [range[0], range[1]) with splits from the device,
 * a fixed grid striding over them: graph-safe, and nearly free when the
 * range is empty. */
template <int HD>
__global__ void attn_merge_range_kernel(const float *__restrict__ ws_o, const float2 *__restrict__ ws_ml,
                                        uint16_t *__restrict__ out, const int32_t *__restrict__ range,
                                        const int32_t *__restrict__ splits) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int end = range[1], num_splits = *splits;
    for (int sh = range[0] + blockIdx.x; sh < end; sh += gridDim.x) merge_row<HD>(ws_o, ws_ml, out, num_splits, sh);
}

int rp_attn_merge_range(const float *ws_o, const float2 *ws_ml, uint16_t *out, const int32_t *range,
                        const int32_t *splits, int blocks, int hd, cudaStream_t stream) {
    if (hd == 128)
        return rp_launch(attn_merge_range_kernel<128>, dim3(blocks), dim3(128), 0, stream, ws_o, ws_ml, out, range,
                         splits);
    if (hd == 64)
        return rp_launch(attn_merge_range_kernel<64>, dim3(blocks), dim3(64), 0, stream, ws_o, ws_ml, out, range,
                         splits);
    return (int)cudaErrorInvalidValue;
}

int rp_attn_merge_splits(const float *ws_o, const float2 *ws_ml, uint16_t *out, int rows, int hd, int splits,
                         cudaStream_t stream) {
    if (hd == 128)
        return rp_launch(attn_merge_splits_kernel<128>, dim3(rows), dim3(128), 0, stream, ws_o, ws_ml, out, splits);
    if (hd == 64)
        return rp_launch(attn_merge_splits_kernel<64>, dim3(rows), dim3(64), 0, stream, ws_o, ws_ml, out, splits);
    return (int)cudaErrorInvalidValue;
}

static int dec_trans_mode = -1;
extern "C" void rp_k_attn_decode_set_trans(int mode) { dec_trans_mode = mode < 0 ? -1 : mode != 0; }
/* Keys as M (attn_decode_t_kernel) where the grid has at least three
 * blocks per SM: its longer chain per tile pays only with more blocks
 * resident (it fits four per SM, the other two). llama3-8b's shape alone,
 * 128 x 512 keys 108.8 -> 94.7 us, 128 x 4096 794 -> 704 (100% of the
 * read bandwidth); but 32 x 512 in 256 blocks 30.1 -> 31.4 (bench/RESULTS.md).
 * Tests force either with rp_k_attn_decode_set_trans. */
static bool dec_trans(int blocks) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
            sms = 132;
    }
    return dec_trans_mode >= 0 ? dec_trans_mode != 0 : blocks >= 3 * sms;
}

template <int HD, bool FP8>
static int dec_launch(dim3 grid, const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, float *ws_o,
                      float2 *ws_ml, int num_seqs, int nh, int nkv, int num_splits, cudaStream_t stream) {
    int rc;
    const void *k_cache = kv.k, *v_cache = kv.v;
    /* bf16: scales of exactly 1 (the products by them change no bit) */
    const float ks = FP8 ? kv.k_scale : 1.0f, vs = FP8 ? kv.v_scale : 1.0f;
    /* one split: the split kernel writes the result (bit-identical: the
     * merge of one split scales it by exp2(0) = 1) */
    uint16_t *direct = num_splits == 1 ? out : nullptr;
    if (dec_trans(num_seqs * nkv * num_splits))
        rc = nh / nkv <= 8
                 ? rp_launch(attn_decode_t_kernel<HD, 1, FP8>, grid, dim3(DEC_WARPS * 32), dec_merge_bytes<HD>(),
                             stream, qkv, k_cache, v_cache, meta, ws_o, ws_ml, direct, nh, nkv, num_splits, ks, vs)
                 : rp_launch(attn_decode_t_kernel<HD, 2, FP8>, grid, dim3(DEC_WARPS * 32), dec_merge_bytes<HD>(),
                             stream, qkv, k_cache, v_cache, meta, ws_o, ws_ml, direct, nh, nkv, num_splits, ks, vs);
    else
        rc = rp_launch(attn_decode_split_kernel<HD, FP8>, grid, dim3(DEC_WARPS * 32), dec_merge_bytes<HD>(), stream,
                       qkv, k_cache, v_cache, meta, ws_o, ws_ml, direct, nh, nkv, num_splits, ks, vs);
    if (rc == 0 && !direct)
        rc = meta.hdr ? rp_attn_merge_range(ws_o, ws_ml, out, meta.hdr + RP_ATTN_HDR_DEC_MERGE_BEGIN,
                                            meta.hdr + RP_ATTN_HDR_DEC_SPLITS, rp_attn_merge_blocks(num_seqs * nh),
                                            HD, stream)
                      : rp_attn_merge_splits(ws_o, ws_ml, out, num_seqs * nh, HD, num_splits, stream);
    return rc;
}

extern "C" size_t rp_attn_decode_workspace_bytes(int num_seqs, int nh, int hd, int num_splits) {
    return rp_attn_split_bytes((size_t)num_seqs * nh, num_splits, hd);
}

extern "C" int rp_k_attn_decode(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out,
                                void *workspace, int num_seqs, int nh, int nkv, int hd, int num_splits,
                                cudaStream_t stream) {
    if (num_seqs <= 0) return cudaSuccess;
    if (nkv <= 0 || nh % nkv != 0 || nh / nkv > DEC_MAX_GROUP || num_splits <= 0 || num_splits > 65535 ||
        meta.page_size <= 0 || (hd != 64 && hd != 128))
        return (int)cudaErrorInvalidValue;
    const bool fp8 = kv.format == RP_KV_FORMAT_E4M3;
    if (fp8 && (!(kv.k_scale > 0.0f) || !(kv.v_scale > 0.0f))) return (int)cudaErrorInvalidValue;
    float *ws_o;
    float2 *ws_ml;
    rp_attn_split_at(workspace, (size_t)num_seqs * nh, num_splits, hd, &ws_o, &ws_ml);
    dim3 grid(num_splits, nkv, num_seqs);
#define DEC_ARGS grid, qkv, kv, meta, out, ws_o, ws_ml, num_seqs, nh, nkv, num_splits, stream
    if (hd == 128) return fp8 ? dec_launch<128, true>(DEC_ARGS) : dec_launch<128, false>(DEC_ARGS);
    return fp8 ? dec_launch<64, true>(DEC_ARGS) : dec_launch<64, false>(DEC_ARGS);
#undef DEC_ARGS
}
