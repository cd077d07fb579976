/* A layer's attention inside the step: (sequence, kv head, split) items
 * spread over the blocks, q/k norm and RoPE, the new k and v stored in the
 * paged cache, an online softmax over the cached keys (prefetched into L2 a
 * layer ahead), the partial results published as tagged words and merged
 * by the block of each query head. */
#ifndef RP_DECODE_STEP_ATTENTION_CUH
#define RP_DECODE_STEP_ATTENTION_CUH

#include "sync.cuh"
#include "trace.cuh"

/* 2^x in one MUFU.EX2 (2 ulp; expf is ~8 instructions): attention runs
 * once per layer on the step's critical path, where its instruction count
 * shows (ncu: instruction-fetch and issue stalls in the score loop). 2^-inf
 * is 0. */
__device__ __forceinline__ float ds_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* A lane's q and k norm weights (dims lane + 32 p and + HD / 2) and RoPE
 * frequencies, loaded between the halves of the barrier after qkv
 * (constants: no block writes them), so that attention's first loads after
 * the release are the new q, k and v alone. */
template <int HD>
struct ds_qkw {
    float qa[HD / 64], qb[HD / 64], ka[HD / 64], kb[HD / 64], fr[HD / 64];
};
template <int HD>
__device__ __forceinline__ void load_qkw(ds_qkw<HD> &w, const rp_decode_step &s, int l) {
    const int lane = threadIdx.x & 31;
    const uint16_t *qn = ds_norm(s, l, 2), *kn = ds_norm(s, l, 3);
#pragma unroll
    for (int p = 0; p < HD / 64; p++) {
        const int i = lane + 32 * p;
        w.fr[p] = s.inv_freq[i];
        if (qn) {
            w.qa[p] = rp_bf16_f32(qn[i]), w.qb[p] = rp_bf16_f32(qn[i + HD / 2]);
            w.ka[p] = rp_bf16_f32(kn[i]), w.kb[p] = rp_bf16_f32(kn[i + HD / 2]);
        }
    }
}

/* q or k head: per-head RMSNorm (when norm, with the weights na, nb),
 * rotate_half RoPE at pos with cos and sin times rope_scale, rounded to bf16
 * as qk_norm_rope_store does (same expressions, same order). */
template <int HD>
__device__ void norm_rope_head(const uint16_t *src, bool norm, const float (&na)[HD / 64], const float (&nb)[HD / 64],
                               const float (&fr)[HD / 64], float pos, float rope_scale, float eps, float *dst,
                               uint16_t *cache) {
    constexpr int half = HD / 2, PAIRS = HD / 64;
    const int lane = threadIdx.x & 31;
    float a[PAIRS], b[PAIRS], ss = 0.0f;
#pragma unroll
    for (int p = 0; p < PAIRS; p++) {
        const int i = lane + 32 * p;
        a[p] = rp_bf16_f32(ld_cg_u16(src + i));
        b[p] = rp_bf16_f32(ld_cg_u16(src + i + half));
    }
#pragma unroll
    for (int p = 0; p < PAIRS; p++) ss += a[p] * a[p] + b[p] * b[p];
    float inv = 1.0f;
    if (norm) {
        ss = rp_warp_sum(ss);
        inv = 1.0f / sqrtf(ss / (float)HD + eps);
    }
#pragma unroll
    for (int p = 0; p < PAIRS; p++) {
        const int i = lane + 32 * p;
        float av = a[p], bv = b[p];
        if (norm) {
            av = na[p] * (av * inv);
            bv = nb[p] * (bv * inv);
        }
        float s, c;
        sincosf(pos * fr[p], &s, &c);
        c *= rope_scale;
        s *= rope_scale;
        const uint16_t oa = rp_f32_bf16(av * c - bv * s), ob = rp_f32_bf16(bv * c + av * s);
        dst[i] = rp_bf16_f32(oa);
        dst[i + half] = rp_bf16_f32(ob);
        if (cache) {
            cache[i] = oa;
            cache[i + half] = ob;
        }
    }
}

/* The warp sums of v[0..G-1], in every lane: G - 1 + 5 - log2(G)
 * shuffles instead of 5 G. Each exchange step halves the values a lane
 * holds (lanes with the step's bit set keep the upper half and send the
 * lower), so after log2(G) steps lane l holds one head's partial, the
 * remaining steps finish it, and G shuffles hand every head to every
 * lane. The additions per head run in a fixed order. */
template <int G>
__device__ __forceinline__ void warp_sum_heads(float (&v)[G]) {
    if constexpr ((G & (G - 1)) != 0) {
        /* groups of 5 or 6 heads (Qwen2.5): each head's sum on its own */
#pragma unroll
        for (int g = 0; g < G; g++) v[g] = rp_warp_sum(v[g]);
        return;
    }
    const int lane = threadIdx.x & 31;
    int n = G, off = 16, steps = 0;
#pragma unroll
    for (; n > 1; n >>= 1, off >>= 1, steps++) {
        const bool up = lane & off;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = up ? v[n / 2 + i] : v[i], send = up ? v[i] : v[n / 2 + i];
            v[i] = keep + __shfl_xor_sync(RP_FULL_MASK, send, off);
        }
    }
#pragma unroll
    for (; off > 0; off >>= 1) v[0] += __shfl_xor_sync(RP_FULL_MASK, v[0], off);
    const float r = v[0];
#pragma unroll
    for (int g = 0; g < G; g++) {
        /* head g's sum sits in the lanes whose step bits (16, 8, ...) spell g */
        int src = 0;
#pragma unroll
        for (int k = 0, b = 16; k < steps; k++, b >>= 1)
            if ((g >> (steps - 1 - k)) & 1) src |= b;
        v[g] = __shfl_sync(RP_FULL_MASK, r, src);
    }
}

/* A lane's DPL = HD / 32 consecutive dims of a K or V row. */
template <int DPL> struct lane_row;
template <> struct lane_row<4> {
    uint2 v;
    __device__ __forceinline__ void zero(void) { v = make_uint2(0, 0); }
    __device__ __forceinline__ void load(const uint16_t *p) { v = __ldcg(reinterpret_cast<const uint2 *>(p)); }
    __device__ __forceinline__ void get(float *f) const {
        f[0] = rp_bf16_lo(v.x), f[1] = rp_bf16_hi(v.x), f[2] = rp_bf16_lo(v.y), f[3] = rp_bf16_hi(v.y);
    }
};
template <> struct lane_row<2> {
    unsigned v;
    __device__ __forceinline__ void zero(void) { v = 0; }
    __device__ __forceinline__ void load(const uint16_t *p) { v = __ldcg(reinterpret_cast<const unsigned *>(p)); }
    __device__ __forceinline__ void get(float *f) const { f[0] = rp_bf16_lo(v), f[1] = rp_bf16_hi(v); }
};

#define ATT_UNROLL 4 /* keys per warp in flight */

/* The sequence's values attention needs every layer, read once per launch
 * (the step's metadata does not change within it), and the cache rows
 * (page * page_size + offset) of this warp's first batch of keys in the
 * block's first item: every layer's first K/V loads then wait for one
 * round trip to L2, not for the metadata, the page table and then the
 * rows (three in a row). */
struct ds_seq {
    int len, pos, ps;
    int64_t slot_new;
    const int32_t *prow;
    int row[ATT_UNROLL]; /* -1: not a cached key */
};

/* Sequence b's metadata (its token is token b of the step). */
__device__ __forceinline__ void seq_meta(const ds_args &a, int b, ds_seq &q) {
    const rp_decode_step &s = a.s;
    q.len = s.meta.seq_kv_len[b], q.pos = s.positions[b], q.ps = s.meta.page_size;
    q.slot_new = s.slots[b];
    q.prow = s.meta.page_table + (int64_t)s.meta.seq_page_row[b] * s.meta.page_table_stride;
}

/* Attention items: (sequence, kv head, split), numbered in that order. */
template <int NB>
__device__ ds_seq seq_of(const ds_args &a) {
    const rp_decode_step &s = a.s;
    const int NS = a.splits, it = blockIdx.x, split = it % NS;
    const int nb = NB == 1 ? 1 : a.nb;
    ds_seq q;
    seq_meta(a, NB == 1 ? 0 : min(it / (s.nkv * NS), nb - 1), q);
    const int per = (q.len + NS - 1) / NS;
    const int j0 = split * per, j1 = min(q.len, j0 + per), jb = j0 + (int)(threadIdx.x >> 5);
#pragma unroll
    for (int u = 0; u < ATT_UNROLL; u++) {
        const int j = jb + u * DS_CONSUMERS;
        q.row[u] = it < nb * s.nkv * NS && j < j1 && j != q.pos ? q.prow[j / q.ps] * q.ps + j % q.ps : -1;
    }
    return q;
}

/* The sequence of item it: sq for the block's first item, else read
 * (only where there are more items than blocks, one split each). */
template <int NB>
__device__ __forceinline__ ds_seq item_seq(const ds_args &a, int it, const ds_seq &sq) {
    if (NB == 1 || it == (int)blockIdx.x) return sq;
    ds_seq q = sq;
    seq_meta(a, it / (a.s.nkv * a.splits), q);
    return q;
}

/* The K and V rows of keys jb, jb + 8, ... (ATT_UNROLL of them, this
 * lane's dims at offset off) that are in [.., j1) and not the new one. */
template <int DPL>
__device__ __forceinline__ void load_kv(lane_row<DPL> (&kr)[ATT_UNROLL], lane_row<DPL> (&vr)[ATT_UNROLL], int jb,
                                        int j1, int pos, const int32_t *prow, int ps, const uint16_t *kc,
                                        const uint16_t *vc, int64_t off, int kv_dim) {
#pragma unroll
    for (int u = 0; u < ATT_UNROLL; u++) {
        const int j = jb + u * DS_CONSUMERS;
        kr[u].zero();
        vr[u].zero();
        if (j < j1 && j != pos) {
            const int64_t e = ((int64_t)prow[j / ps] * ps + j % ps) * kv_dim + off;
            kr[u].load(kc + e);
            vr[u].load(vc + e);
        }
    }
}

/* The same for the rows seq_of found (-1: none). */
template <int DPL>
__device__ __forceinline__ void load_kv_rows(lane_row<DPL> (&kr)[ATT_UNROLL], lane_row<DPL> (&vr)[ATT_UNROLL],
                                             const int (&row)[ATT_UNROLL], const uint16_t *kc, const uint16_t *vc,
                                             int64_t off, int kv_dim) {
#pragma unroll
    for (int u = 0; u < ATT_UNROLL; u++) {
        kr[u].zero();
        vr[u].zero();
        if (row[u] >= 0) {
            const int64_t e = (int64_t)row[u] * kv_dim + off;
            kr[u].load(kc + e);
            vr[u].load(vc + e);
        }
    }
}

/* Query head g of kv head kvh: its NS split results merged into out
 * (bf16). Run by the block of split g (mod NS) right after its own item;
 * it polls the other splits' tagged words, so it waits only for the
 * slowest split, with no fence or counter between them. Thread t sums the
 * splits t / HD, + R, + 2R, ... of dimension t % HD (every load in flight
 * before the first wait), then the R partial sums are added in order: a
 * fixed order, whichever split was last. It cannot wait on itself: there
 * are at most as many items as blocks (splits = grid / nkv), or, with more
 * kv heads than blocks, one split per kv head, which is its own merger. */
#define MERGE_BATCH 8
template <int HD, bool TOGETHER>
__device__ void merge_head(const ds_ws &ws, uint16_t *out, int kvh, int item0, int g, int G, int NS, unsigned tag,
                           uint8_t *scratch) {
    constexpr int R = DS_CONSUMERS * 32 / HD; /* threads per dimension */
    float *m = reinterpret_cast<float *>(scratch), *f = m + DS_MAX_SPLITS, *l = f + DS_MAX_SPLITS;
    float *acc = l + DS_MAX_SPLITS; /* [R][HD] */
    const int t = threadIdx.x, d = t % HD, r = t / HD;
    /* item0: the item of split 0 */
    const unsigned long long *o = ws.o + ((int64_t)item0 * G + g) * HD + d;
    unsigned long long x[MERGE_BATCH];
#pragma unroll
    for (int k = 0; k < MERGE_BATCH; k++)
        if (r + k * R < NS) x[k] = ll_load(o + (int64_t)(r + k * R) * G * HD);
    if constexpr (TOGETHER) {
        /* The (max, sum) word and the first batch of outputs polled
         * together, every stale one reloaded each round: the last split's
         * words are found one round trip after they land, where polled one
         * after the other its outputs (loaded before its (max, sum) have
         * landed) take another round trip. Only with at most two query
         * heads per kv head: with four, twice as many blocks merge, and
         * their polls cost more than the round trip (qwen3-0.6b 0.777 ->
         * 0.767 ms, qwen3-4b 3.057 -> 3.072; bench/RESULTS.md). */
        const int tm = t < 2 * NS ? t : 0;
        const unsigned long long *w = ws.ml + (((int64_t)item0 + tm / 2) * G + g) * 2 + (tm & 1);
        unsigned long long mw = t < 2 * NS ? ll_load(w) : 0;
        for (;;) {
            bool stale = t < 2 * NS && (unsigned)(mw >> 32) != tag;
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++) stale |= r + k * R < NS && (unsigned)(x[k] >> 32) != tag;
            if (!stale) break;
            if (t < 2 * NS && (unsigned)(mw >> 32) != tag) mw = ll_load(w);
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++)
                if (r + k * R < NS && (unsigned)(x[k] >> 32) != tag) x[k] = ll_load(o + (int64_t)(r + k * R) * G * HD);
        }
        if (t < 2 * NS) (t & 1 ? l : m)[t / 2] = __uint_as_float((unsigned)mw);
    } else if (t < 2 * NS) {
        const unsigned long long *w = ws.ml + (((int64_t)item0 + t / 2) * G + g) * 2 + (t & 1);
        (t & 1 ? l : m)[t / 2] = ll_value(ll_load(w), w, tag);
    }
    cbar();
    if (t < NS) {
        float M = -INFINITY;
        for (int sp = 0; sp < NS; sp++) M = fmaxf(M, m[sp]);
        f[t] = m[t] == -INFINITY ? 0.0f : ds_exp2(m[t] - M);
    }
    cbar();
    float A = 0.0f;
    for (int k0 = 0; r + k0 * R < NS; k0 += MERGE_BATCH) {
        if (k0 > 0) {
#pragma unroll
            for (int k = 0; k < MERGE_BATCH; k++)
                if (r + (k0 + k) * R < NS) x[k] = ll_load(o + (int64_t)(r + (k0 + k) * R) * G * HD);
        }
#pragma unroll
        for (int k = 0; k < MERGE_BATCH; k++) {
            const int sp = r + (k0 + k) * R;
            if (sp < NS) A += f[sp] * ll_value(x[k], o + (int64_t)sp * G * HD, tag);
        }
    }
    acc[r * HD + d] = A;
    cbar();
    if (t < HD) {
        float Ls = 0.0f, S = acc[t];
        for (int sp = 0; sp < NS; sp++) Ls += f[sp] * l[sp];
        for (int q = 1; q < R; q++) S += acc[q * HD + t];
        out[((int64_t)kvh * G + g) * HD + t] = rp_f32_bf16(S / Ls);
    }
    cbar(); /* the scratch is reused */
}

/* Layer l's cached keys and values for this block's attention items, into
 * L2 ahead of time (the first ATT_PREFETCH keys of each item). In the
 * attention phase every SM's producer is streaming weights at full speed
 * and a load that misses L2 waits behind them; issued a layer ahead, the
 * first K/V batch is an L2 hit. */
#define ATT_PREFETCH 128
template <int HD, int NB>
__device__ void prefetch_kv(const ds_args &a, int l, const ds_seq &sq0) {
    constexpr int LINES = HD * 2 / 128; /* 128-byte lines per key row */
    const rp_decode_step &s = a.s;
    const int nkv = s.nkv, kv_dim = nkv * HD, NS = a.splits;
    const uint16_t *kc = s.k_cache + (size_t)l * s.kv_layer_elems, *vc = s.v_cache + (size_t)l * s.kv_layer_elems;
    for (int it = blockIdx.x; it < (NB == 1 ? 1 : a.nb) * nkv * NS; it += a.grid) {
        const ds_seq sq = item_seq<NB>(a, it, sq0);
        const int len = sq.len, pos = sq.pos, ps = sq.ps;
        const int32_t *prow = sq.prow;
        const int kvh = NB == 1 ? it / NS : (it / NS) % nkv, split = it - (it / NS) * NS;
        const int per = (len + NS - 1) / NS, j0 = split * per, j1 = min(min(len, j0 + per), j0 + ATT_PREFETCH);
        for (int e = threadIdx.x; e < (j1 - j0) * 2 * LINES; e += DS_CONSUMERS * 32) {
            const int j = j0 + e / (2 * LINES), r = e % (2 * LINES);
            if (j == pos) continue; /* written in this step */
            const int64_t off = ((int64_t)prow[j / ps] * ps + j % ps) * kv_dim + kvh * HD + (r % LINES) * 64;
            const uint16_t *p = (r < LINES ? kc : vc) + off;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
        }
    }
}

/* Layer l's mlp norm and layer l + 1's other norms (or the final norm)
 * into L2, a phase or more before their loads (load_nw, load_qkw): read
 * once a step, they need not have stayed in L2. Block b takes line b of
 * them all. */
__device__ void prefetch_norms(const ds_args &a, int l) {
    const rp_decode_step &s = a.s;
    if (threadIdx.x != 32) return; /* warp 1: thread 0 polls the barrier */
    const int hl = s.H * 2 / 128, dl = s.hd * 2 / 128;
    int k = blockIdx.x;
    const uint16_t *p = nullptr;
    if (k < hl) p = ds_norm(s, l, 1) + k * 64;
    else if ((k -= hl) < hl) p = ds_norm(s, l + 1, 0) + k * 64;
    else if (l + 1 < s.num_layers && s.qk_norm && (k -= hl) < 2 * dl)
        p = ds_norm(s, l + 1, 2 + k / dl) + (k % dl) * 64;
    if (p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* The block's first item's first batch of cached keys and values (layer
 * l), into registers: cached rows are not written in this step, so the
 * loads may start before the barrier after qkv releases (after this
 * block's arrival, so that its release fence does not wait for them). */
template <int HD>
__device__ __forceinline__ void first_kv(const ds_args &a, int l, const ds_seq &sq, lane_row<HD / 32> (&kr)[ATT_UNROLL],
                                         lane_row<HD / 32> (&vr)[ATT_UNROLL]) {
    const rp_decode_step &s = a.s;
    const int NS = a.splits, kvh = ((int)blockIdx.x / NS) % s.nkv, lane = threadIdx.x & 31;
    load_kv_rows<HD / 32>(kr, vr, sq.row, s.k_cache + (size_t)l * s.kv_layer_elems,
                          s.v_cache + (size_t)l * s.kv_layer_elems, (int64_t)kvh * HD + lane * (HD / 32), s.nkv * HD);
}

/* Layer l's attention for the NB sequences into s.attn; kr, vr: the first
 * item's first K/V batch (first_kv). */
template <int G, int HD, int NB>
__device__ void attention_phase(const ds_args &a, int l, uint8_t *scratch, const ds_ws &ws, uint64_t *tr,
                                unsigned launch, const ds_seq &sq0, lane_row<HD / 32> (&kr)[ATT_UNROLL],
                                lane_row<HD / 32> (&vr)[ATT_UNROLL], const ds_qkw<HD> &qw) {
    uint64_t tl = tr ? ds_now() : 0;
    constexpr int DPL = HD / 32;
    const rp_decode_step &s = a.s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nkv = s.nkv, q_dim = s.nh * HD, kv_dim = nkv * HD, NS = a.splits;
    float *qs = reinterpret_cast<float *>(scratch); /* [G][HD] */
    float *kn = qs + G * HD, *vn = kn + HD;
    float *wm = vn + HD, *wl = wm + 8 * G, *wacc = wl + 8 * G;
    uint16_t *kc = s.k_cache + (size_t)l * s.kv_layer_elems, *vc = s.v_cache + (size_t)l * s.kv_layer_elems;
    /* scores in log2 units (q scaled by log2(e) / sqrt(HD)), so that each
     * softmax exponential is one ex2 (ds_exp2) */
    const float scale = 1.4426950408889634f / sqrtf((float)HD);
    const unsigned tag = ll_tag(launch, l);
    for (int it = blockIdx.x; it < (NB == 1 ? 1 : a.nb) * nkv * NS; it += a.grid) {
        const ds_seq sq = item_seq<NB>(a, it, sq0);
        const int len = sq.len, pos = sq.pos, ps = sq.ps;
        const int64_t slot_new = sq.slot_new;
        const int32_t *prow = sq.prow;
        /* sequence b's rows of qkv and attn */
        const int b = NB == 1 ? 0 : it / (nkv * NS), kvh = NB == 1 ? it / NS : (it / NS) % nkv;
        const int split = it - (it / NS) * NS;
        const uint16_t *qkv = s.qkv + (NB == 1 ? 0 : (int64_t)b * (q_dim + 2 * kv_dim));
        const int per = (len + NS - 1) / NS, j0 = split * per, j1 = min(len, j0 + per);
        const bool has_new = pos >= j0 && pos < j1;
        /* the item's stamps (trace): its start, then each lap */
        uint64_t *as = tr && it == (int)blockIdx.x ? s.trace + blockIdx.x * TR_N + RP_DECODE_STEP_TRACE_ATT + l * 8
                                                   : nullptr;
        if (as) as[0] = tl;
        /* The cached keys and values are from earlier steps: the first
         * batch is in flight while q and k are normalised and rotated (the
         * first item's since the barrier, first_kv). */
        if (it != (int)blockIdx.x)
            load_kv<DPL>(kr, vr, j0 + warp, j1, pos, prow, ps, kc, vc, (int64_t)kvh * HD + lane * DPL, kv_dim);
        for (int task = warp; task < G + 2; task += DS_CONSUMERS) {
            if (task < G) {
                norm_rope_head<HD>(qkv + (kvh * G + task) * HD, s.qk_norm, qw.qa, qw.qb, qw.fr, (float)pos,
                                   s.rope_scale, s.eps, qs + task * HD, nullptr);
            } else if (task == G && has_new) {
                norm_rope_head<HD>(qkv + q_dim + kvh * HD, s.qk_norm, qw.ka, qw.kb, qw.fr, (float)pos, s.rope_scale,
                                   s.eps, kn, slot_new >= 0 ? kc + slot_new * kv_dim + kvh * HD : nullptr);
            } else if (task == G + 1 && has_new) {
                const uint16_t *src = qkv + q_dim + kv_dim + kvh * HD;
                for (int d = lane; d < HD; d += 32) {
                    const uint16_t v = ld_cg_u16(src + d);
                    vn[d] = rp_bf16_f32(v);
                    if (slot_new >= 0) vc[slot_new * kv_dim + kvh * HD + d] = v;
                }
            }
        }
        cbar();
        ds_lap(tr, TR_ATT_LOAD, tl);
        if (as) as[1] = tl;
        float q[G][DPL], m[G], lsum[G], o[G][DPL];
#pragma unroll
        for (int g = 0; g < G; g++) {
            m[g] = -INFINITY, lsum[g] = 0.0f;
#pragma unroll
            for (int d = 0; d < DPL; d++) q[g][d] = qs[g * HD + lane * DPL + d] * scale, o[g][d] = 0.0f;
        }
        for (int jb = j0 + warp; jb < j1; jb += DS_CONSUMERS * ATT_UNROLL) {
            if (jb != j0 + warp)
                load_kv<DPL>(kr, vr, jb, j1, pos, prow, ps, kc, vc, (int64_t)kvh * HD + lane * DPL, kv_dim);
            /* With one or two heads per kv head, the batch's scores at
             * once (one warp reduction for all of them), then one
             * online-softmax update per head: a short dependent chain
             * instead of one per key (qwen3-0.6b 0.950 -> 0.920 ms). With
             * four heads or more that is slower (qwen3-4b 3.49 -> 3.54,
             * llama3.2-1b 1.194 -> 1.208): there, one key at a time. */
            if constexpr (G <= 2) {
                float sc[ATT_UNROLL * G], vf[ATT_UNROLL][DPL];
#pragma unroll
                for (int u = 0; u < ATT_UNROLL; u++) {
                    float kf[DPL];
                    if (jb + u * DS_CONSUMERS == pos && pos < j1) { /* kn, vn: only where has_new */
#pragma unroll
                        for (int d = 0; d < DPL; d++) kf[d] = kn[lane * DPL + d], vf[u][d] = vn[lane * DPL + d];
                    } else { /* zeros past j1 (load_kv) */
                        kr[u].get(kf);
                        vr[u].get(vf[u]);
                    }
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        float t = q[g][0] * kf[0];
#pragma unroll
                        for (int d = 1; d < DPL; d++) t = fmaf(q[g][d], kf[d], t);
                        sc[u * G + g] = t;
                    }
                }
                warp_sum_heads<ATT_UNROLL * G>(sc);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float x[ATT_UNROLL], mn = m[g];
#pragma unroll
                    for (int u = 0; u < ATT_UNROLL; u++) { /* keys past j1 score -inf */
                        x[u] = jb + u * DS_CONSUMERS < j1 ? sc[u * G + g] : -INFINITY;
                        mn = fmaxf(mn, x[u]);
                    }
                    /* key jb is in range, so mn is finite; corr is 0 while m is -inf */
                    const float corr = ds_exp2(m[g] - mn);
                    float pl = 0.0f;
#pragma unroll
                    for (int d = 0; d < DPL; d++) o[g][d] *= corr;
#pragma unroll
                    for (int u = 0; u < ATT_UNROLL; u++) {
                        const float pe = ds_exp2(x[u] - mn);
                        pl += pe;
#pragma unroll
                        for (int d = 0; d < DPL; d++) o[g][d] = fmaf(pe, vf[u][d], o[g][d]);
                    }
                    lsum[g] = lsum[g] * corr + pl;
                    m[g] = mn;
                }
            } else {
#pragma unroll
                for (int u = 0; u < ATT_UNROLL; u++) {
                    const int j = jb + u * DS_CONSUMERS;
                    if (j >= j1) break;
                    float kf[DPL], vf[DPL];
                    if (j == pos) {
#pragma unroll
                        for (int d = 0; d < DPL; d++) kf[d] = kn[lane * DPL + d], vf[d] = vn[lane * DPL + d];
                    } else {
                        kr[u].get(kf);
                        vr[u].get(vf);
                    }
                    float sc[G];
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        sc[g] = q[g][0] * kf[0];
#pragma unroll
                        for (int d = 1; d < DPL; d++) sc[g] = fmaf(q[g][d], kf[d], sc[g]);
                    }
                    warp_sum_heads<G>(sc);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        const float x = sc[g];
                        const float mn = fmaxf(m[g], x), corr = ds_exp2(m[g] - mn), pe = ds_exp2(x - mn);
                        lsum[g] = lsum[g] * corr + pe;
#pragma unroll
                        for (int d = 0; d < DPL; d++) o[g][d] = o[g][d] * corr + pe * vf[d];
                        m[g] = mn;
                    }
                }
            }
        }
        if (as) as[2] = ds_now();
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (lane == 0) wm[warp * G + g] = m[g], wl[warp * G + g] = lsum[g];
#pragma unroll
            for (int d = 0; d < DPL; d++) wacc[(warp * G + g) * HD + lane * DPL + d] = o[g][d];
        }
        cbar();
        ds_lap(tr, TR_ATT_SCORE, tl);
        if (as) as[3] = tl;
        /* the item's (max, sum, unnormalised output), warps in order */
        for (int e = threadIdx.x; e < G * HD; e += DS_CONSUMERS * 32) {
            const int g = e / HD, d = e - g * HD;
            float M = -INFINITY;
            for (int w = 0; w < DS_CONSUMERS; w++) M = fmaxf(M, wm[w * G + g]);
            float A = 0.0f, Ls = 0.0f;
            for (int w = 0; w < DS_CONSUMERS; w++) {
                const float mw = wm[w * G + g];
                const float f = mw == -INFINITY ? 0.0f : ds_exp2(mw - M);
                A += f * wacc[(w * G + g) * HD + d];
                Ls += f * wl[w * G + g];
            }
            ll_store(ws.o + ((int64_t)it * G + g) * HD + d, A, tag);
            if (d == 0) {
                ll_store(ws.ml + ((int64_t)it * G + g) * 2, M, tag);
                ll_store(ws.ml + ((int64_t)it * G + g) * 2 + 1, Ls, tag);
            }
        }
        cbar(); /* the scratch is reused */
        ds_lap(tr, TR_ATT_PUBLISH, tl);
        if (as) as[4] = tl;
        for (int g = split; g < G; g += NS)
            merge_head<HD, G <= 2>(ws, s.attn + (NB == 1 ? 0 : (int64_t)b * q_dim), kvh, it - split, g, G, NS, tag, scratch);
        ds_lap(tr, TR_ATT_MERGE, tl);
        if (as) as[5] = tl;
    }
}

#endif
