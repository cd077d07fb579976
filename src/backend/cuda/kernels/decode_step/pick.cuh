/* The greedy pick inside the step (decode_step_kernel's PK): each block's
 * slice of the logits, then the last block out merges the slices. */
#ifndef RP_DECODE_STEP_PICK_CUH
#define RP_DECODE_STEP_PICK_CUH

#include "sync.cuh"

/* ---- the greedy pick: the token chosen inside the step ------------------ */

/* Unsigned order of floats: a larger key is a larger logit. */
__device__ __forceinline__ unsigned pick_order(float x) {
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float pick_unorder(unsigned o) {
    return __uint_as_float((o & 0x80000000u) ? o & 0x7fffffffu : ~o);
}
__device__ __forceinline__ unsigned long long pick_max(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

/* After the barrier that follows lm_head, this block's fixed slice
 * [blk V / grid, (blk + 1) V / grid) of each sequence's logits (at most
 * DS_PICK_PER_THREAD per consumer thread, kept in registers): its best
 * (logit, ~id) key, so the largest logit and its lowest id win, and the sum
 * of exp(x - max), both in a fixed order, into the workspace. So the pick
 * does not depend on which block took which lm_head unit, and a replay
 * picks bit-identically to an eager run. scratch: 32 floats (the matrix
 * phases' partial sums, free by then). */
#define DS_PICK_PER_THREAD 8
__device__ void pick_slice(const rp_decode_step &s, const ds_ws &ws, int nb, int grid, float *scratch) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, NT = DS_CONSUMERS * 32;
    const int i0 = (int)((int64_t)blockIdx.x * s.V / grid), i1 = (int)((int64_t)(blockIdx.x + 1) * s.V / grid);
    /* under tensor parallelism the logits are this rank's vocabulary rows:
     * ids from vocab_start, and the padding past vocab_count is no token */
    const int id0 = s.tp.n ? (int)s.tp.vocab_start : 0, real = s.tp.n ? (int)s.tp.vocab_count : s.V;
    unsigned long long *wkey = reinterpret_cast<unsigned long long *>(scratch + 16);
    for (int b = 0; b < nb; b++) {
        const float *row = s.logits + (int64_t)b * s.V;
        float x[DS_PICK_PER_THREAD];
        unsigned long long key = 0;
#pragma unroll
        for (int j = 0; j < DS_PICK_PER_THREAD; j++) {
            const int i = i0 + t + j * NT;
            const bool in = i < i1 && i < real;
            x[j] = in ? rp_sanitize_logit(__ldcg(row + i)) : -INFINITY;
            if (in) key = pick_max(key, (unsigned long long)pick_order(x[j]) << 32 | (unsigned)~(id0 + i));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) key = pick_max(key, __shfl_xor_sync(RP_FULL_MASK, key, o));
        if (lane == 0) wkey[warp] = key;
        cbar();
        for (int w = 0; w < DS_CONSUMERS; w++) key = pick_max(key, wkey[w]);
        const float mx = key ? pick_unorder((unsigned)(key >> 32)) : -INFINITY;
        float e = 0.0f;
#pragma unroll
        for (int j = 0; j < DS_PICK_PER_THREAD; j++)
            if (x[j] != -INFINITY) e += expf(x[j] - mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) e += __shfl_xor_sync(RP_FULL_MASK, e, o);
        if (lane == 0) scratch[warp] = e;
        cbar();
        if (t == 0) {
            float sum = 0.0f;
            for (int w = 0; w < DS_CONSUMERS; w++) sum += scratch[w];
            ws.pick[blockIdx.x * 4 + b] = make_float4(mx, sum, __uint_as_float((unsigned)key),
                                                      __uint_as_float((unsigned)(key >> 32)));
        }
        cbar(); /* scratch is free again */
    }
}

/* Under tensor parallelism (one sequence), warp 0 of each rank's last
 * block: this rank's best (key, sum of exp(x - its max)) to every rank as
 * tagged words (rp_decode_step_tp.pick; one launch's tag), then the N
 * ranks' in rank order: the largest key (the lowest id among equal
 * logits, as on one GPU) and the sums rescaled to its max. A rank writes
 * its next launch's words only after every rank's sums of that launch,
 * which each rank makes only after this launch has ended on it. */
__device__ void pick_ranks(const rp_decode_step_tp &tp, unsigned launch, unsigned long long &key, double &sum) {
    const int lane = threadIdx.x & 31;
    const unsigned tag = launch + 1u;
    const unsigned long long sb = (unsigned long long)__double_as_longlong(sum);
    if (lane == 0)
        for (int k = 0; k < tp.n; k++) {
            unsigned long long *w = tp.pick[k] + tp.rank * 4;
            ll_store_sys(w, (unsigned)(key >> 32), tag);
            ll_store_sys(w + 1, (unsigned)key, tag);
            ll_store_sys(w + 2, (unsigned)sb, tag);
            ll_store_sys(w + 3, (unsigned)(sb >> 32), tag);
        }
    unsigned long long rk = 0, rs = 0;
    if (lane < tp.n) {
        const unsigned long long *w = tp.pick[tp.rank] + lane * 4;
        unsigned h[4];
#pragma unroll
        for (int q = 0; q < 4; q++) h[q] = ll_wait_sys(ll_load_sys(w + q), w + q, tag, tp.abort);
        rk = (unsigned long long)h[0] << 32 | h[1];
        rs = (unsigned long long)h[3] << 32 | h[2];
    }
    key = 0;
    for (int k = 0; k < tp.n; k++) key = pick_max(key, __shfl_sync(RP_FULL_MASK, rk, k));
    const float mx = pick_unorder((unsigned)(key >> 32));
    sum = 0.0;
    for (int k = 0; k < tp.n; k++) {
        const unsigned long long kk = __shfl_sync(RP_FULL_MASK, rk, k);
        const double sk = __longlong_as_double((long long)__shfl_sync(RP_FULL_MASK, rs, k));
        if (sk > 0.0) sum += sk * (double)expf(pick_unorder((unsigned)(kk >> 32)) - mx);
    }
}

/* Warp 0 of the last block out, after every block's pick_slice: the token
 * and its logprob (log-softmax at temperature 1, as the sampler reports
 * it) per sequence; the blocks' sums rescaled to the row's max and added
 * in block order (under tensor parallelism, then the ranks': pick_ranks).
 * Also into the host's pinned buffer of this step's slot: a copy after the
 * kernel costs ~8 us a step (bench/RESULTS.md); the host reads it after the
 * step's event, so after the kernel has completed and its writes are
 * visible. */
__device__ void pick_finish(const rp_decode_step &s, const ds_ws &ws, int nb, int grid, unsigned launch) {
    const int lane = threadIdx.x & 31;
    for (int b = 0; b < nb; b++) {
        /* every load in flight at once: this is the step's last L2 round trip */
        float4 p[DS_PICK_MAX_GRID / 32];
#pragma unroll
        for (int k = 0; k < DS_PICK_MAX_GRID / 32; k++) {
            const int j = lane + 32 * k;
            p[k] = j < grid ? __ldcg(ws.pick + j * 4 + b) : make_float4(-INFINITY, 0.0f, 0.0f, 0.0f);
        }
        unsigned long long key = 0;
#pragma unroll
        for (int k = 0; k < DS_PICK_MAX_GRID / 32; k++)
            key = pick_max(key, (unsigned long long)__float_as_uint(p[k].w) << 32 | __float_as_uint(p[k].z));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) key = pick_max(key, __shfl_xor_sync(RP_FULL_MASK, key, o));
        const float mx = pick_unorder((unsigned)(key >> 32));
        double sum = 0.0;
#pragma unroll
        for (int k = 0; k < DS_PICK_MAX_GRID / 32; k++)
            if (p[k].y > 0.0f) sum += (double)p[k].y * (double)expf(p[k].x - mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(RP_FULL_MASK, sum, o);
        float mxa = mx;
        if (s.tp.n) {
            pick_ranks(s.tp, launch, key, sum);
            mxa = pick_unorder((unsigned)(key >> 32));
        }
        if (lane == 0) {
            const int32_t tok = mxa == -INFINITY ? 0 : (int32_t)~(unsigned)key;
            const float lp = mxa == -INFINITY ? -INFINITY : (float)-log(sum);
            s.pick_tokens[b] = tok; /* where the next step's token reference reads it */
            s.pick_logprobs[b] = lp;
            int32_t *h = s.pick_host[*s.pick_slot & 1];
            h[b] = tok;
            reinterpret_cast<float *>(h + s.pick_host_stride)[b] = lp;
        }
    }
}

__device__ __forceinline__ uint16_t ld_cg_u16(const uint16_t *p) {
    uint16_t v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

#endif
