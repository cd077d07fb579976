/* Prefill attention for Hopper (sm_90a), FlashAttention-3 style: the same
 * function as rp_k_attn_prefill (attn_prefill.cu; variable-length
 * sequences, causal with a cached prefix, keys and values read from the
 * paged cache, GQA, fp32 softmax, bf16 out) on wgmma and the bulk tensor
 * copy engine instead of mma.sync and cp.async. Standalone: tested
 * (tests/test_cuda_attn_sm90.c) and timed (`replay bench kernels`), not
 * yet called by the forward.
 *
 * Design, and why:
 *  - A block is 3 warpgroups: a producer (one warp of it works) and two
 *    consumers, each owning 64 query rows of one head (BM = 128). wgmma
 *    is issued per warpgroup and its M is 64, so two consumers give the
 *    128-row tile that amortises each K/V tile over enough FLOPs, and the
 *    producer keeps address arithmetic and waits off the math warps.
 *  - K and V tiles of 128 keys come through a ring of A90_STAGES stages
 *    in shared memory, one TMA box per page (or 128 keys of a larger
 *    page) and per 64-column half, completing on "full" mbarriers; the
 *    consumers hand a stage back on "empty" mbarriers. K and V have
 *    separate barriers: S = Q K^T can start before V lands, and K's slot
 *    is refilled as soon as S is done, one step before V's. The tensor
 *    map views a layer's cache as a 2-D [slot][nkv * hd] matrix, so a box
 *    is a run of consecutive slots of one kv head: a page. The 128B
 *    swizzle makes the boxes exactly the layout wgmma reads without bank
 *    conflicts (attn_prefill_sm90.cuh).
 *  - S = Q K^T: wgmma m64n128k16 with both operands in shared memory (Q
 *    is loaded once per block, K-major; K rows are K-major too). O += P V:
 *    P stays in registers (the S accumulator's layout is the A fragment's,
 *    packed to bf16) and V is the B operand read transposed (MN-major,
 *    allowed for 16-bit types), so V needs no transpose anywhere.
 *  - Online softmax in fp32 registers, in the exp2 domain with
 *    1/sqrt(hd) * log2(e) folded into one FMA; row sums are kept per
 *    thread and reduced across the quad once at the end.
 *  - Intra-warpgroup overlap (FA3 section 3.2): tile t's S = Q K_t^T and
 *    tile t-1's O += P V_{t-1} are issued back to back; the softmax of S_t
 *    runs while the tensor cores still work on P V_{t-1}. O's rescale
 *    waits for that product. Registers: S (64) + O (64) + P (32) per
 *    thread, hence setmaxnreg (producer 40, consumers 232).
 *  - Causal: a block only loads the key tiles up to its last query's
 *    position; masking happens only on tiles that cross a consumer's
 *    first row position or the end of the keys. Query rows past the
 *    sequence clamp their visible keys to the sequence's keys, so no row
 *    ever sees an unloaded key.
 *  - Values past the sequence's last key in the last tile (the rest of a
 *    partly filled page, or boxes never loaded) are zeroed in shared
 *    memory before P V reads them: their weights are 0, but 0 x NaN is
 *    NaN and that memory is not ours to trust. Keys there need nothing:
 *    their scores are replaced by -inf, never multiplied.
 *  - Work order: the block's (sequence, query tile, head) comes from one
 *    function of blockIdx (a90_work_of) with the highest query tiles
 *    (most keys) first and the heads innermost, so that a wave's blocks
 *    share K/V tiles in L2 and the short tiles fill the tail. Blocks past
 *    a sequence's end return before touching anything.
 *
 * Measured (H100, llama3-8b heads, causal, one sequence): 382 TFLOP/s at
 * 2048 tokens, 464 at 4096, 499 at 8192, 506 at 16384; the mma.sync
 * kernel 151 / 195 / 226 / 252 (`replay bench kernels`).
 *
 * Tried, and slower (git history has them): ping-pong scheduling of the
 * two consumers (FA3's inter-warpgroup overlap: turns taken on named
 * barriers), 1-3% slower; a third ring stage, 1-2% slower.
 *
 * Not done yet:
 *  - a persistent grid (a block's prologue and epilogue under the previous
 *    tile's work) and a work list read from the step's metadata (the
 *    graph-captured form);
 *  - the output goes straight from registers to global memory (4-byte
 *    stores), not through shared memory and a TMA store;
 *  - GQA head packing (the heads of a kv group at the same positions as
 *    M rows, as attn_prefill.cu's two-head block does): a block is one head;
 *  - split keys for few new tokens after a long prefix (attn_prefill.cu's
 *    flash-decoding split): each block walks its whole key range;
 *  - head dim 64 (rp_attn_prefill_sm90_supported says no). */
#include <math.h>

#include "attn_prefill_sm90.cuh"
#include "common.cuh"

#define A90_STAGES 2
#define A90_THREADS 384
/* 40 x 128 + 232 x 256 = 64512 = 168 x 384, the registers the block is
 * launched with under __launch_bounds__(384, 1): setmaxnreg only moves
 * registers between warpgroups, it never adds any. */
#define A90_PRODUCER_REGS 40
#define A90_CONSUMER_REGS 232
static_assert(A90_PRODUCER_REGS * 128 + A90_CONSUMER_REGS * 256 <= 168 * A90_THREADS, "setmaxnreg budget");

/* Shared memory from a 1024-byte aligned base: Q, the K ring, the V ring,
 * then the mbarriers. */
#define A90_OFF_K A90_Q_BYTES
#define A90_OFF_V (A90_OFF_K + A90_STAGES * A90_KV_BYTES)
#define A90_OFF_BAR (A90_OFF_V + A90_STAGES * A90_KV_BYTES)
#define A90_NUM_BARS (1 + 4 * A90_STAGES)
#define A90_SMEM_BYTES (A90_OFF_BAR + 8 * A90_NUM_BARS + 1024 /* alignment slack */)

/* What one block computes. */
typedef struct a90_work {
    int seq, head, q0; /* q0: the first new-token index of its query tile */
} a90_work;

/* The block's work, from its index alone: heads innermost, then sequences,
 * then query tiles from the last (most keys under the causal mask) to the
 * first. Returns false past the grid's work. (Later: an entry of a work
 * list in the step's metadata, so that a captured graph's fixed grid
 * serves any batch.) */
__device__ __forceinline__ bool a90_work_of(int block, const rp_attn_meta &meta, int nh, int num_seqs, int q_tiles,
                                            a90_work *w) {
    w->head = block % nh;
    const int rest = block / nh;
    if (meta.pf_items) { /* a step's work list (rp_k_attn_step), longest first */
        if (rest >= meta.hdr[RP_ATTN_HDR_PF_ITEMS]) return false;
        w->seq = meta.pf_items[rest * RP_ATTN_ITEM_INTS];
        w->q0 = meta.pf_items[rest * RP_ATTN_ITEM_INTS + 1];
        return true;
    }
    w->seq = rest % num_seqs;
    const int tile_from_end = rest / num_seqs;
    w->q0 = (q_tiles - 1 - tile_from_end) * A90_BM;
    return tile_from_end < q_tiles;
}

/* Every register of S, O and P, at this point of the instruction stream. */
__device__ __forceinline__ void a90_fence_all(float (&s)[64], float (&o)[64], uint32_t (&p)[32]) {
#pragma unroll
    for (int i = 0; i < 64; i++) {
        rp_reg_fence(s[i]);
        rp_reg_fence(o[i]);
    }
#pragma unroll
    for (int i = 0; i < 32; i++) rp_reg_fence(p[i]);
}

__global__ void __launch_bounds__(A90_THREADS, 1)
    attn_prefill_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v, rp_attn_meta meta, uint16_t *__restrict__ out,
                             int nh, int nkv, int num_seqs, int q_tiles, int box_rows) {
    rp_pdl_trigger();
    rp_pdl_wait(); /* the metadata and this step's keys come from earlier kernels */
    a90_work w;
    if (!a90_work_of(blockIdx.x, meta, nh, num_seqs, q_tiles, &w)) return;
    const int tok0 = meta.seq_start[w.seq], n_new = meta.seq_start[w.seq + 1] - tok0;
    if (w.q0 >= n_new) return; /* a tile past this sequence's end */
    const int kv_len = meta.seq_kv_len[w.seq];
    const int offset = kv_len - n_new; /* position of new token 0 */
    const int kv_end = offset + min(w.q0 + A90_BM, n_new); /* keys any row of the block sees */
    const int n_tiles = (kv_end + A90_BN - 1) / A90_BN;

    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (rp_sm90_saddr(smem_raw) & 1023)) & 1023);
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + A90_OFF_BAR);
    uint64_t *q_full = bars, *k_full = bars + 1, *v_full = k_full + A90_STAGES, *k_empty = v_full + A90_STAGES,
             *v_empty = k_empty + A90_STAGES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        rp_mbar_init(q_full, 1);
        for (int s = 0; s < A90_STAGES; s++) {
            rp_mbar_init(&k_full[s], 1);
            rp_mbar_init(&v_full[s], 1);
            rp_mbar_init(&k_empty[s], 8); /* one arrival per consumer warp */
            rp_mbar_init(&v_empty[s], 8);
        }
        rp_mbar_fence_init();
    }
    __syncthreads();

    if (wg == 0) { /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(A90_PRODUCER_REGS));
        if (warp != 0) return;
        const int kvh = w.head / (nh / nkv), ps = meta.page_size;
        const int32_t *prow = meta.page_table + (int64_t)meta.seq_page_row[w.seq] * meta.page_table_stride;
        if (lane == 0) {
            rp_mbar_arrive_expect_tx(q_full, A90_Q_BYTES);
            rp_tma_load_2d(smem, &tm_q, w.head * A90_HD, tok0 + w.q0, q_full);
            rp_tma_load_2d(smem + A90_Q_HALF, &tm_q, w.head * A90_HD + 64, tok0 + w.q0, q_full);
        }
        const int boxes = A90_BN / box_rows; /* <= 8: a lane a box */
        for (int t = 0; t < n_tiles; t++) {
            const int st = t % A90_STAGES;
            const uint32_t parity = ((t / A90_STAGES) & 1) ^ 1; /* passes at once in the first round */
            const int key0 = t * A90_BN;
            /* boxes holding at least one of the sequence's keys; the rest
             * of the tile is never loaded (zeroed by the consumers) */
            const int nb = min(boxes, (kv_len - key0 + box_rows - 1) / box_rows);
            const uint32_t bytes = (uint32_t)nb * box_rows * A90_ROW_BYTES * 2;
            int64_t slot = 0;
            if (lane < nb) {
                const int j = key0 + lane * box_rows;
                slot = (int64_t)prow[j / ps] * ps + j % ps;
            }
            uint8_t *k_dst = smem + A90_OFF_K + st * A90_KV_BYTES + lane * box_rows * A90_ROW_BYTES;
            uint8_t *v_dst = smem + A90_OFF_V + st * A90_KV_BYTES + lane * box_rows * A90_ROW_BYTES;
            if (lane == 0) {
                rp_mbar_wait(&k_empty[st], parity);
                rp_mbar_arrive_expect_tx(&k_full[st], bytes);
            }
            __syncwarp();
            if (lane < nb) {
                rp_tma_load_2d(k_dst, &tm_k, kvh * A90_HD, (int)slot, &k_full[st]);
                rp_tma_load_2d(k_dst + A90_KV_HALF, &tm_k, kvh * A90_HD + 64, (int)slot, &k_full[st]);
            }
            if (lane == 0) {
                rp_mbar_wait(&v_empty[st], parity);
                rp_mbar_arrive_expect_tx(&v_full[st], bytes);
            }
            __syncwarp();
            if (lane < nb) {
                rp_tma_load_2d(v_dst, &tm_v, kvh * A90_HD, (int)slot, &v_full[st]);
                rp_tma_load_2d(v_dst + A90_KV_HALF, &tm_v, kvh * A90_HD + 64, (int)slot, &v_full[st]);
            }
        }
        return;
    }

    /* ---- consumers: warpgroup c owns block rows 64c..64c+63 ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(A90_CONSUMER_REGS));
    const int c = wg - 1, g = lane >> 2, q4 = lane & 3;
    const int row0 = c * 64 + (warp & 3) * 16 + g; /* this thread's rows: row0 and row0 + 8 */
    const int pos0 = offset + w.q0 + row0;
    /* the last key each row sees (rows past the sequence: its last key) */
    const int lim0 = min(pos0, kv_len - 1), lim1 = min(pos0 + 8, kv_len - 1);
    /* the smallest of those in this warpgroup: tiles past it need the mask */
    const int mask_from = min(offset + w.q0 + c * 64, kv_len - 1);
    const float scale_log2 = rsqrtf((float)A90_HD) * 1.4426950408889634f;
    const uint32_t q_addr = rp_sm90_saddr(smem) + c * 64 * A90_ROW_BYTES;
    const uint32_t k_addr = rp_sm90_saddr(smem + A90_OFF_K), v_addr = rp_sm90_saddr(smem + A90_OFF_V);

    float o[64], s[64];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) p[i] = 0;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    /* S = Q K_t^T for tile t (stage st) */
    auto issue_s = [&](int st) {
#pragma unroll
        for (int kk = 0; kk < A90_HD / 16; kk++)
            rp_wgmma_m64n128k16_ss(s, a90_desc_kmajor(q_addr, A90_Q_HALF, kk),
                                   a90_desc_kmajor(k_addr + st * A90_KV_BYTES, A90_KV_HALF, kk), kk > 0);
        rp_wgmma_commit();
    };
    /* O += P V for the tile in stage st */
    auto issue_pv = [&](int st) {
#pragma unroll
        for (int kk = 0; kk < A90_BN / 16; kk++)
            rp_wgmma_m64n128k16_rs_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                      a90_desc_v(v_addr + st * A90_KV_BYTES, kk));
        rp_wgmma_commit();
    };
    /* Online softmax of S (tile t): s becomes P (fp32), the row state
     * moves on, and alpha is what O must be scaled by. Row row0 holds
     * s[4i], s[4i+1], row row0 + 8 holds s[4i+2], s[4i+3], keys
     * t * BN + 8i + 2 q4 (+1). */
    float alpha0, alpha1;
    auto softmax = [&](int t) {
        const int key0 = t * A90_BN;
        if (key0 + A90_BN - 1 > mask_from) {
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = key0 + 8 * i + 2 * q4 + (e & 1);
                    s[4 * i + e] = j <= ((e & 2) ? lim1 : lim0) ? s[4 * i + e] : -INFINITY;
                }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(RP_FULL_MASK, mx0, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(RP_FULL_MASK, mx1, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(RP_FULL_MASK, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(RP_FULL_MASK, mx1, 2));
        /* Key 0 is in tile 0 and visible to every row, so m is finite from
         * tile 0 on; a row that sees no key of a later tile keeps its m. */
        const float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
        alpha0 = rp_ex2(m0 - mn0), alpha1 = rp_ex2(m1 - mn1);
        m0 = mn0, m1 = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            s[4 * i] = rp_ex2(fmaf(s[4 * i], scale_log2, -mn0));
            s[4 * i + 1] = rp_ex2(fmaf(s[4 * i + 1], scale_log2, -mn0));
            s[4 * i + 2] = rp_ex2(fmaf(s[4 * i + 2], scale_log2, -mn1));
            s[4 * i + 3] = rp_ex2(fmaf(s[4 * i + 3], scale_log2, -mn1));
            sum0 += s[4 * i] + s[4 * i + 1];
            sum1 += s[4 * i + 2] + s[4 * i + 3];
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
    };
    auto release = [&](uint64_t *bar) {
        __syncwarp();
        if (lane == 0) rp_mbar_arrive(bar);
    };
    auto pack_p = [&]() {
#pragma unroll
        for (int i = 0; i < 32; i++) p[i] = rp_pack_bf16x2(s[2 * i], s[2 * i + 1]);
    };

    /* Tile 0 alone (no P V before it), so that the loop below has one
     * shape: ptxas keeps wgmma groups asynchronous only where it can see
     * every wait that retires them, and a "t > 0" branch hides that. */
    rp_mbar_wait(q_full, 0);
    rp_mbar_wait(&k_full[0], 0);
    a90_fence_all(s, o, p);
    rp_wgmma_fence();
    issue_s(0);
    rp_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; i++) rp_reg_fence(s[i]);
    release(&k_empty[0]);
    softmax(0); /* O is 0: no rescale */
    pack_p();

    for (int t = 1; t < n_tiles; t++) {
        const int st = t % A90_STAGES, pst = (t - 1) % A90_STAGES;
        rp_mbar_wait(&k_full[st], (t / A90_STAGES) & 1);
        /* s, o and p were written since the last wgmma: pin those writes
         * before the fence (the compiler would otherwise sink them into
         * the wgmma sequence, which serialises it) */
        a90_fence_all(s, o, p);
        rp_wgmma_fence();
        issue_s(st); /* S = Q K_t^T */
        rp_mbar_wait(&v_full[pst], ((t - 1) / A90_STAGES) & 1);
        issue_pv(pst); /* O += P V_{t-1} */
        rp_wgmma_wait<1>(); /* S is done; P V_{t-1} may still run */
#pragma unroll
        for (int i = 0; i < 64; i++) rp_reg_fence(s[i]);
        release(&k_empty[st]);
        softmax(t); /* under P V_{t-1} */
        rp_wgmma_wait<0>(); /* P V_{t-1} done: O may be rescaled, P rewritten */
        a90_fence_all(s, o, p);
        release(&v_empty[pst]);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            o[4 * i] *= alpha0;
            o[4 * i + 1] *= alpha0;
            o[4 * i + 2] *= alpha1;
            o[4 * i + 3] *= alpha1;
        }
        pack_p();
    }

    /* the last tile's O += P V */
    {
        const int last = n_tiles - 1, lst = last % A90_STAGES, key0 = last * A90_BN;
        rp_mbar_wait(&v_full[lst], (last / A90_STAGES) & 1);
        if (key0 + A90_BN > kv_len) {
            /* zero V rows kv_len - key0 .. BN - 1 of both halves (whole
             * 128-byte rows: the swizzle only permutes within a row). Both
             * consumers write the same zeros. */
            uint4 *vt = reinterpret_cast<uint4 *>(smem + A90_OFF_V + lst * A90_KV_BYTES);
            const int first = kv_len - key0, n16 = (A90_BN - first) * 8; /* 16-byte chunks per half */
            for (int i = threadIdx.x - 128 * wg; i < 2 * n16; i += 128) {
                const int half = i / n16, k = i % n16;
                vt[(half * A90_KV_HALF + first * A90_ROW_BYTES) / 16 + k] = make_uint4(0, 0, 0, 0);
            }
            rp_fence_proxy_async(); /* generic-proxy writes, read next by wgmma */
            if (c == 0)
                rp_named_barrier(1, 128);
            else
                rp_named_barrier(2, 128);
        }
        a90_fence_all(s, o, p);
        rp_wgmma_fence();
        issue_pv(lst);
        rp_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; i++) rp_reg_fence(o[i]);
    }

    l0 += __shfl_xor_sync(RP_FULL_MASK, l0, 1);
    l1 += __shfl_xor_sync(RP_FULL_MASK, l1, 1);
    l0 += __shfl_xor_sync(RP_FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(RP_FULL_MASK, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const int64_t out_stride = (int64_t)nh * A90_HD;
    uint16_t *dst0 = out + (int64_t)(tok0 + w.q0 + row0) * out_stride + w.head * A90_HD + 2 * q4;
    uint16_t *dst1 = dst0 + 8 * out_stride;
    const bool ok0 = w.q0 + row0 < n_new, ok1 = w.q0 + row0 + 8 < n_new;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if (ok0) *reinterpret_cast<uint32_t *>(dst0 + 8 * i) = rp_pack_bf16x2(o[4 * i] * inv0, o[4 * i + 1] * inv0);
        if (ok1)
            *reinterpret_cast<uint32_t *>(dst1 + 8 * i) = rp_pack_bf16x2(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
}

/* ---- host ---------------------------------------------------------------- */

typedef CUresult (*a90_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled through the runtime's driver entry point, so that
 * nothing links against libcuda. */
static a90_encode_fn a90_encoder(void) {
    static a90_encode_fn fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (a90_encode_fn)p;
        else
            cudaGetLastError();
    }
    return fn;
}

int a90_tensor_map(CUtensorMap *map, const void *base, uint64_t row_elems, uint64_t rows, uint32_t box_rows) {
    a90_encode_fn enc = a90_encoder();
    if (!enc) return (int)cudaErrorNotSupported;
    const cuuint64_t dims[2] = {row_elems, rows};
    const cuuint64_t strides[1] = {row_elems * 2};
    const cuuint32_t box[2] = {64, box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides, box,
                     elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? (int)cudaSuccess : (int)cudaErrorInvalidValue;
}

extern "C" int rp_attn_prefill_sm90_supported(int hd, int page_size) {
    return hd == A90_HD && page_size >= 16 && (page_size & (page_size - 1)) == 0;
}

static int a90_launch(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache, rp_attn_meta meta,
                      rp_bf16 *out, int T, int num_seqs, int q_tiles, int64_t items, int nh, int nkv, int hd,
                      cudaStream_t stream);

extern "C" int rp_k_attn_prefill_sm90(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache,
                                      rp_attn_meta meta, rp_bf16 *out, int T, int num_seqs, int max_q_len,
                                      int max_kv_len, int nh, int nkv, int hd, cudaStream_t stream) {
    (void)max_kv_len; /* no split: every block walks its own key range */
    if (T <= 0 || num_seqs <= 0 || max_q_len <= 0) return cudaSuccess;
    const int q_tiles = (max_q_len + A90_BM - 1) / A90_BM;
    meta.hdr = nullptr, meta.pf_items = nullptr;
    return a90_launch(qkv, k_cache, v_cache, meta, out, T, num_seqs, q_tiles, (int64_t)q_tiles * num_seqs, nh, nkv,
                      hd, stream);
}

/* The step's form: the grid is the bucket's items x heads; what each block
 * does comes from the work list (meta.hdr, meta.pf_items). */
extern "C" int rp_k_attn_prefill_sm90_list(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache,
                                           rp_attn_meta meta, rp_bf16 *out, int T, int max_items, int nh, int nkv,
                                           int hd, cudaStream_t stream) {
    if (!meta.hdr || !meta.pf_items || T <= 0 || max_items <= 0) return (int)cudaErrorInvalidValue;
    return a90_launch(qkv, k_cache, v_cache, meta, out, T, 1, 0, max_items, nh, nkv, hd, stream);
}

static int a90_launch(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache, rp_attn_meta meta,
                      rp_bf16 *out, int T, int num_seqs, int q_tiles, int64_t items, int nh, int nkv, int hd,
                      cudaStream_t stream) {
    if (nkv <= 0 || nh % nkv != 0 || !rp_attn_prefill_sm90_supported(hd, meta.page_size))
        return (int)cudaErrorInvalidValue;
    static unsigned attr_set; /* per device (rp_first_on_device) */
    if (rp_first_on_device(&attr_set)) {
        cudaError_t e = cudaFuncSetAttribute(attn_prefill_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             A90_SMEM_BYTES);
        if (e != cudaSuccess) return (int)e;
    }
    /* The cache's slot count is not an argument: the map claims as many
     * rows as its stride allows (the blocks only address slots of pages in
     * the table, so the extent is never reached). */
    const uint64_t kv_row = (uint64_t)nkv * hd, q_row = (uint64_t)(nh + 2 * nkv) * hd;
    uint64_t slots = (1ull << 40) / (kv_row * 2);
    if (slots > (1ull << 31)) slots = 1ull << 31;
    const uint32_t box_rows = meta.page_size < A90_BN ? (uint32_t)meta.page_size : A90_BN;
    CUtensorMap tm_q, tm_k, tm_v;
    int rc = a90_tensor_map(&tm_q, qkv, q_row, (uint64_t)T, A90_BM);
    if (!rc) rc = a90_tensor_map(&tm_k, k_cache, kv_row, slots, box_rows);
    if (!rc) rc = a90_tensor_map(&tm_v, v_cache, kv_row, slots, box_rows);
    if (rc) return rc;
    const int64_t blocks = items * nh;
    if (blocks > 0x7fffffff) return (int)cudaErrorInvalidValue;
    return rp_launch(attn_prefill_sm90_kernel, dim3((unsigned)blocks), dim3(A90_THREADS), A90_SMEM_BYTES, stream,
                     tm_q, tm_k, tm_v, meta, out, nh, nkv, num_seqs, q_tiles, (int)box_rows);
}
