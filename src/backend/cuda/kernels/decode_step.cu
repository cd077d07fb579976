/* The whole decode step of one to four sequences (one token each) in one
 * persistent kernel; what follows describes one, and gemv_phase how the
 * others share its weight stream.
 *
 * Why: at batch 1 a step is ~6 launches per layer, and every launch boundary
 * costs a ramp-up and a drain (~3-5 us each even under PDL), which on the
 * small models is more than the weight streaming itself (qwen3-0.6b:
 * 0.41 ms of bytes, 1.19 ms per step as a chain of kernels). Here one block
 * per SM lives for the whole step, and the weight stream never stops at a
 * layer or phase boundary:
 *  - the step is a fixed sequence of matrix phases (per layer: qkv, o,
 *    gate_up, down; then lm_head). Each matrix is cut into units of 8 rows
 *    (gate_up: 8 gate rows and the 8 matching up rows) and block b owns the
 *    contiguous range [b S / G, (b+1) S / G) of a phase's first S units.
 *    So every block knows, before anything runs, most of the weight bytes
 *    it will read in the whole step;
 *  - one producer thread per block walks that list from the first
 *    instruction, copying each unit in pieces of 8 rows x 1536 k (1024
 *    on the smallest shapes, ds_kc; one bulk copy per row,
 *    cp.async.bulk, completion counted in bytes on the stage's mbarrier)
 *    into a ring of 8 shared-memory stages. It waits only
 *    for a free stage, never for an activation: while the consumers sit in
 *    a grid barrier or in attention, the next phase's weights keep
 *    arriving (and when its ring is full it prefetches the next pieces
 *    into L2). On the large shapes the last seven eighths of each large
 *    phase's units are not cut in advance: producers take them one at a
 *    time from a counter, so blocks that stream faster take more
 *    (static_units; the 1B-class shapes cut everything in advance);
 *  - eight consumer warps stage the phase's input vector in shared memory
 *    (the RMSNorm, SwiGLU and attention output are made there); ring piece
 *    i belongs to warp i % 8, which multiplies it against x on the tensor
 *    cores and leaves 8 partial sums; the warp that finishes a unit's last
 *    piece adds them in piece order and writes the phase's output with its
 *    epilogue fused (qkv bf16, residual += y, bf16(silu(gate) * up), fp32
 *    logits);
 *  - phases meet at a grid barrier (a counter with release/acquire at gpu
 *    scope; docs/memory-model.md), five per layer;
 *  - attention: (kv head, split) items spread over the blocks; each item
 *    does q/k norm and RoPE for its heads (the item that holds the new
 *    position also stores the new k and v in the paged cache), an online
 *    softmax over its keys (K/V prefetched into L2 a layer ahead), and
 *    publishes its partial result as tagged words; the block of split g
 *    merges query head g by polling the splits' words (merge_head), in
 *    split order.
 * Every sum is taken in a fixed order (per lane, then per warp in warp
 * order), so a replay is bit-identical to an eager run. The rounding points
 * are those of the chain of kernels (bf16 qkv, fp32 projections added to
 * the fp32 residual, fp32 SwiGLU input and bf16 output, fp32 logits); only
 * the order of some fp32 sums differs.
 *
 * Requirements (rp_decode_step_check): head_dim 64 or 128, GQA group 1/2/4/8,
 * hidden, q and intermediate sizes multiples of 256, hidden <= 8192, row
 * counts multiples of 8. Anything else runs the chain of kernels. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "common.cuh"
#include "mma.cuh"

#define DS_CONSUMERS 8
/* Two consumer warpgroups and a producer warpgroup, of which one thread
 * works. With nine warps ptxas caps a thread at 168 registers (a quarter
 * of the register file holds three of them) and the consumers spill; with
 * whole warpgroups the producer warpgroup hands its registers to the
 * consumers (setmaxnreg). The block keeps the registers it was launched
 * with (168 x 384), so the two counts must fit in those: a consumer's
 * setmaxnreg.inc waits for registers nobody gives back (80 producer
 * registers hung). 72 measured the same as 64. */
#define DS_THREADS ((DS_CONSUMERS + 4) * 32)
#define DS_CONSUMER_REGS 216
#define DS_PRODUCER_REGS 64
#define DS_LAUNCH_REGS (65536 / DS_THREADS / 8 * 8)
static_assert(DS_CONSUMER_REGS * DS_CONSUMERS * 32 + DS_PRODUCER_REGS * 128 <= DS_LAUNCH_REGS * DS_THREADS,
              "setmaxnreg counts exceed the block's registers");
#define DS_KC 1536            /* the widest ring piece: 8 rows x 1536 k (ds_args.kc) */
/* A piece's rows are 64 bytes apart in bank terms (3072 + 64), so the mma
 * B-fragment loads (4 threads x 16 bytes of rows g and g + 1 per phase) hit
 * disjoint banks. */
#define DS_ROW_STRIDE (DS_KC * 2 + 64)
#define DS_STAGE (8 * DS_ROW_STRIDE) /* bytes per ring stage */
#define DS_SEG 256            /* widths must be multiples of this */
#define DS_ROWS 8             /* rows per unit (per run) */
#define DS_HD 128
#define DS_MAX_SPLITS 32
/* Ring stages: a multiple of the consumer warps, so that a stage is always
 * used by the same warp (piece i: stage i % 8, warp i % 8). A warp then
 * waits on a stage's mbarrier at most one phase ahead, which the parity
 * wait requires. */
#define DS_STAGES 8
#define DS_MAX_STAGES 16
#define DS_MAX_H 8192               /* stage_norm keeps the row in registers */
#define DS_MAX_PHASES (4 * 128 + 1) /* 128 layers */
#define DS_PICK_MAX_GRID 256 /* blocks whose pick partials the workspace holds (pick_finish: 8 a lane) */

struct ds_args {
    rp_decode_step s;
    int grid, splits, stages, kmax;
    int kc;          /* k per ring piece: a multiple of 256, at most DS_KC (make_args) */
    int prefetch;    /* static pieces the producer may prefetch into L2 while it waits */
    int prefetch_now; /* of those, issued at once when it starts to wait (produce) */
    int keep_res;     /* the residual row stays in shared memory for the o and down epilogues */
    int dyn_eighths; /* eighths of a large phase's units taken dynamically */
    /* The kernel for one sequence on shapes with dynamic units (DYNK): past
     * its static pieces a consumer polls for a phase's end every poll_ns
     * (gemv_phase), and while the consumers are at a grid barrier or in
     * attention the producer waits apace_ns between pieces (produce; with
     * apace_all 0 only from the qkv phase's end to the release after
     * attention). */
    int poll_ns, apace_ns, apace_all;
    int norm_pf; /* prefetch the next norms' weights into L2 (prefetch_norms) */
    int tail_hold; /* a block that took one of a phase's last tail_hold units issues no more until it arrives */
    /* Several sequences (NB > 1): how many (nb <= NB; the rest of the
     * kernel's rows are left alone, so that 3 sequences get the same
     * arithmetic alone as padded to 4), the ring's geometry for kc, and x's
     * row stride in elements. One sequence uses the constants. */
    int nb, row_stride, stage_bytes, xstride;
};

/* A stage's rows 2 kc + 64 bytes apart (see DS_ROW_STRIDE); x rows kmax +
 * 32 elements apart, so that the matrix loop's x loads for two sequences
 * (64 bytes each) fall on the two halves of the banks. */
__host__ __device__ static inline int ds_row_stride(int kc) { return kc * 2 + 64; }
__host__ __device__ static inline int ds_xstride(int kmax, int nb) { return nb == 1 ? kmax : kmax + 32; }

/* Shared memory: mbarriers, the ring, one region used either as x (bf16,
 * kmax) or as attention scratch, the per-piece partial sums and per-unit
 * counters, the pieces' info, the phase ends, a reduction scratch and
 * (res floats, where it fits) the residual row (stage_norm). */
struct ds_layout {
    size_t ring, xs, attn, part, ucnt, info, pend, red, rs, total;
};

/* What the producer tells the consumers about ring piece i (in info[i %
 * stages]): its unit, the unit's first piece and its number in the block's
 * unit sequence. */
struct ds_info {
    int unit, first, useq, pad;
};

/* Per-piece partial sums in flight: a unit's P pieces plus what the other
 * warps can take meanwhile (< 8 + stages) must fit, so P <= 16. */
#define DS_PART_SLOTS 32

__host__ __device__ static inline size_t ds_attn_bytes(int G) {
    /* q [G][128], new k and v [128], per-warp m and l [8][G], per-warp
     * output [8][G][128], a flag */
    return ((size_t)G * DS_HD + 2 * DS_HD + 2 * 8 * (size_t)G + 8 * (size_t)G * DS_HD) * 4 + 16;
}

/* nb sequences: x, the partial sums and the kept residual rows per
 * sequence; stage_bytes: the ring's stage (DS_STAGE for one sequence). */
__host__ __device__ static inline ds_layout ds_plan(int stages, int kmax, int G, int phases, int res, int nb = 1,
                                                    int stage_bytes = DS_STAGE) {
    ds_layout L;
    L.ring = 256; /* 2 * DS_MAX_STAGES mbarriers */
    L.xs = L.ring + (size_t)stages * stage_bytes;
    L.attn = L.xs; /* x and the attention scratch are never live together */
    size_t x_bytes = ((size_t)nb * ds_xstride(kmax, nb) * 2 + 127) / 128 * 128,
           a_bytes = (ds_attn_bytes(G) + 127) / 128 * 128;
    L.part = L.xs + (x_bytes > a_bytes ? x_bytes : a_bytes);
    L.ucnt = L.part + (size_t)DS_PART_SLOTS * DS_ROWS * 4 * nb;
    L.info = L.ucnt + (size_t)DS_PART_SLOTS * 4;
    L.pend = L.info + (size_t)stages * sizeof(ds_info);
    L.red = (L.pend + (size_t)phases * 4 + 15) / 16 * 16;
    L.rs = L.red + 64 * 4;
    L.total = L.rs + (size_t)res * nb * 4;
    return L;
}

/* Workspace (device memory, zeroed once at startup; every counter but the
 * launch count is back at 0 when a launch ends): the attention items'
 * partial results as tagged words (ll_store), the grid barrier's counter,
 * the exit counter that resets it, the launch count that tags the words,
 * and the dynamic-unit counters. */
struct ds_ws {
    unsigned long long *o;  /* [nkv * splits][G][128]: unnormalised outputs */
    unsigned long long *ml; /* [nkv * splits][G][2]: running max, sum */
    unsigned *sync, *exitc, *launch;
    unsigned *claim; /* [DS_MAX_PHASES]: dynamic units taken per phase */
    /* the greedy pick (decode_step_kernel's PK): each block's (max, sum, key) of
     * its slice of each sequence's logits (pick_slice, pick_finish) */
    float4 *pick; /* [DS_PICK_MAX_GRID][4] */
};

__host__ __device__ static inline ds_ws ds_ws_at(void *base, int nh) {
    ds_ws w;
    uint8_t *p = (uint8_t *)base;
    w.o = (unsigned long long *)p;
    p += (size_t)nh * DS_MAX_SPLITS * DS_HD * 8;
    w.ml = (unsigned long long *)p;
    p += (size_t)nh * DS_MAX_SPLITS * 2 * 8;
    w.sync = (unsigned *)p;
    w.exitc = w.sync + 4;
    w.launch = w.sync + 5;
    w.claim = w.sync + 8;
    p = (uint8_t *)(w.claim + DS_MAX_PHASES);
    p = (uint8_t *)(((uintptr_t)p + 15) & ~(uintptr_t)15);
    w.pick = (float4 *)p;
    return w;
}

/* A value another block will read travels as one 64-bit word, the float in
 * the low half and a tag in the high half. A 64-bit access is single-copy
 * atomic, so a reader that sees the tag it expects sees the value written
 * with it, and no fence or counter is needed to publish it (the idea of
 * NCCL's LL protocol). Tags, (launch << 8) | (layer + 1), never repeat
 * what a word held before: an earlier layer or the previous launch. */
__device__ __forceinline__ unsigned ll_tag(unsigned launch, int layer) {
    return (launch << 8) | (unsigned)(layer + 1);
}
__device__ __forceinline__ void ll_store(unsigned long long *w, float v, unsigned tag) {
    const unsigned long long x = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(w), "l"(x) : "memory");
}
__device__ __forceinline__ unsigned long long ll_load(const unsigned long long *w) {
    unsigned long long x;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(w) : "memory");
    return x;
}
/* x, reloaded from w until it carries tag; its float. */
__device__ __forceinline__ float ll_value(unsigned long long x, const unsigned long long *w, unsigned tag) {
    while ((unsigned)(x >> 32) != tag) x = ll_load(w);
    return __uint_as_float((unsigned)x);
}

/* ---- mbarriers and the bulk copy (PTX ISA 8.0, sm_90) -------------------- */

__device__ __forceinline__ uint32_t ds_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(ds_saddr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ds_saddr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(ds_saddr(bar)) : "memory");
}
/* [src, src + bytes) into shared memory; bytes a multiple of 16. Weights
 * are read once per step: evict-first keeps L2 for the KV cache and the
 * activations. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(ds_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(ds_saddr(bar)), "l"(policy)
                 : "memory");
}

/* The eight consumer warps' barrier (the producer never joins). */
__device__ __forceinline__ void cbar(void) { asm volatile("bar.sync 1, %0;" ::"n"(DS_CONSUMERS * 32) : "memory"); }

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
    unsigned long long *wkey = reinterpret_cast<unsigned long long *>(scratch + 16);
    for (int b = 0; b < nb; b++) {
        const float *row = s.logits + (int64_t)b * s.V;
        float x[DS_PICK_PER_THREAD];
        unsigned long long key = 0;
#pragma unroll
        for (int j = 0; j < DS_PICK_PER_THREAD; j++) {
            const int i = i0 + t + j * NT;
            x[j] = i < i1 ? rp_sanitize_logit(__ldcg(row + i)) : -INFINITY;
            if (i < i1) key = pick_max(key, (unsigned long long)pick_order(x[j]) << 32 | (unsigned)~i);
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

/* Warp 0 of the last block out, after every block's pick_slice: the token
 * and its logprob (log-softmax at temperature 1, as the sampler reports
 * it) per sequence; the blocks' sums rescaled to the row's max and added
 * in block order. Also into the host's pinned buffer of this step's slot:
 * a copy after the kernel costs ~8 us a step (bench/RESULTS.md,
 * eighteenth session); the host reads it after the step's event, so after
 * the kernel has completed and its writes are visible. */
__device__ void pick_finish(const rp_decode_step &s, const ds_ws &ws, int nb, int grid) {
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
        if (lane == 0) {
            const int32_t tok = mx == -INFINITY ? 0 : (int32_t)~(unsigned)key;
            const float lp = mx == -INFINITY ? -INFINITY : (float)-log(sum);
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

/* ---- optional trace (REPLAY_DECODE_STEP_TRACE): where a block's time goes --- */

enum {
    TR_WAIT_FULL, TR_WAIT_EMPTY, TR_SYNC, TR_ATTN, TR_ATT_LOAD, TR_ATT_SCORE, TR_ATT_PUBLISH, TR_ATT_MERGE, TR_STAGE,
    TR_GEMV, TR_TOTAL, TR_PIECES,
    TR_N = RP_DECODE_STEP_TRACE_STRIDE
};
static_assert(TR_PIECES + 1 == RP_DECODE_STEP_TRACE_SLOTS, "trace slots and their names");

__device__ __forceinline__ uint64_t ds_now(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Adds the time since *t to tr[kind] and restarts *t (thread 0 only). */
__device__ __forceinline__ void ds_lap(uint64_t *tr, int kind, uint64_t &t) {
    if (!tr) return;
    const uint64_t now = ds_now();
    tr[kind] += now - t;
    t = now;
}

/* 2^x in one MUFU.EX2 (2 ulp; expf is ~8 instructions): attention runs
 * once per layer on the step's critical path, where its instruction count
 * shows (ncu: instruction-fetch and issue stalls in the score loop). 2^-inf
 * is 0. */
__device__ __forceinline__ float ds_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ---- the step's schedule: the same walk for producer and consumers ------- */

struct ds_mat {
    const uint16_t *w;
    int N;       /* output rows (gate_up: F, one per gate/up pair) */
    int K;
    int runs;    /* 1, or 2 (gate rows, then up rows at run_off) */
    int run_off; /* rows between run 0 and run 1 */
};

__device__ __forceinline__ ds_mat phase_mat(const rp_decode_step &s, int p) {
    const int L = s.num_layers;
    if (p == 4 * L) return ds_mat{s.lm_head, s.V, s.H, 1, 0};
    const rp_decode_layer *ly = &s.layers[p >> 2];
    const int q_dim = s.nh * s.hd, qkv = q_dim + 2 * s.nkv * s.hd;
    switch (p & 3) {
    case 0: return ds_mat{ly->wqkv, qkv, s.H, 1, 0};
    case 1: return ds_mat{ly->wo, s.H, q_dim, 1, 0};
    case 2: return ds_mat{ly->wgu, s.F, s.H, 2, s.F};
    default: return ds_mat{ly->wdown, s.H, s.F, 1, 0};
    }
}

/* Units of a phase: the first S are cut statically (block b: [b S / G,
 * (b+1) S / G)), so the producer knows them before anything runs; the last
 * U - S are taken one at a time from a counter by whichever producer has
 * room first. Blocks do not stream at the same rate (their share of HBM
 * and L2 differs), and every phase ends in a grid barrier: the dynamic tail
 * lets the fast blocks take more instead of waiting for the slow ones. The
 * drift grows with the bytes per phase, so the large shapes leave 7/8 of a
 * phase to the counter, the small ones none (make_args; the barrier trace
 * shows the spread). */
__device__ __forceinline__ int static_units(int U, const ds_args &a) {
    return U >= 2 * a.grid ? U - U * a.dyn_eighths / 8 : U;
}

/* Whether the mbarrier's phase of this parity has completed (op: try_wait,
 * which may suspend the thread until it does or a system-defined time limit
 * passes, or test_wait, which never suspends). */
#define DS_MBAR_WAIT(op, bar, parity)                                                                                  \
    uint32_t ok;                                                                                                       \
    asm volatile("{\n"                                                                                                 \
                 ".reg .pred done;\n"                                                                                  \
                 "mbarrier." op ".parity.shared::cta.b64 done, [%1], %2;\n"                                            \
                 "selp.u32 %0, 1, 0, done;\n"                                                                          \
                 "}"                                                                                                   \
                 : "=r"(ok)                                                                                            \
                 : "r"(ds_saddr(bar)), "r"(parity)                                                                     \
                 : "memory");                                                                                          \
    return ok != 0

__device__ __forceinline__ bool mbar_try(uint64_t *bar, unsigned parity) { DS_MBAR_WAIT("try_wait", bar, parity); }
__device__ __forceinline__ bool mbar_test(uint64_t *bar, unsigned parity) { DS_MBAR_WAIT("test_wait", bar, parity); }
#undef DS_MBAR_WAIT

/* This block's static pieces in the producer's order (phase, unit, run,
 * column): where the L2 prefetch walks ahead of the ring. */
struct ds_walk {
    ds_mat m;
    int p, u, u1, r, kc;
};

__device__ __forceinline__ void walk_phase(const ds_args &a, ds_walk &w) {
    for (const int NP = 4 * a.s.num_layers + 1; w.p < NP; w.p++) {
        w.m = phase_mat(a.s, w.p);
        const int S = static_units(w.m.N / DS_ROWS, a);
        w.u = (int)((int64_t)blockIdx.x * S / a.grid), w.u1 = (int)((int64_t)(blockIdx.x + 1) * S / a.grid);
        w.r = w.kc = 0;
        if (w.u < w.u1) return;
    }
}

__device__ __forceinline__ void walk_next(const ds_args &a, ds_walk &w) {
    if ((w.kc += a.kc) < w.m.K) return;
    w.kc = 0;
    if (++w.r < w.m.runs) return;
    w.r = 0;
    if (++w.u < w.u1) return;
    w.p++;
    walk_phase(a, w);
}

__device__ __forceinline__ void prefetch_piece(const ds_args &a, const ds_walk &w) {
    const unsigned row_bytes = (unsigned)min(a.kc, w.m.K - w.kc) * 2u;
    const uint16_t *src = w.m.w + ((int64_t)w.r * w.m.run_off + (int64_t)w.u * DS_ROWS) * w.m.K + w.kc;
    for (int j = 0; j < DS_ROWS; j++)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + (int64_t)j * w.m.K), "r"(row_bytes)
                     : "memory");
}

/* Up to n more of this block's static pieces into L2, at most `ahead`
 * past the n_static the ring has taken (the walk first skips what the
 * ring took meanwhile). */
__device__ __forceinline__ void prefetch_ahead(const ds_args &a, ds_walk &pw, int &n_walked, int n_static, int ahead,
                                               int n) {
    const int NP = 4 * a.s.num_layers + 1;
    for (; n_walked < n_static && pw.p < NP; n_walked++) walk_next(a, pw);
    for (; n > 0 && n_walked < n_static + ahead && pw.p < NP; n--, n_walked++) {
        prefetch_piece(a, pw);
        walk_next(a, pw);
    }
}

/* Producer: every piece of every unit of every phase this block takes, in
 * order, into ring stage i % stages; info says which unit a piece belongs
 * to, pend[p] where phase p's pieces end (the consumers stop there).
 * While it waits for a free stage (the consumers are in a barrier, in
 * attention or behind), it prefetches its next static pieces into L2, so
 * HBM keeps working through the stall and those copies later come from
 * L2: a.prefetch_now of them at once when the wait starts, then one more
 * each time try_wait gives up, up to a.prefetch. (try_wait sleeps until
 * the stage is free or a long system time limit passes, so the second kind
 * is rare: about one per stall.) */
template <int NB, bool TRACE, bool DYNK>
__device__ void produce(const ds_args &a, const ds_ws &ws, uint8_t *ring, uint64_t *full, uint64_t *empty,
                        ds_info *info, volatile int *pend, volatile int *pace_flag, volatile int *arrived) {
    uint64_t policy, waited = 0;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const int NP = 4 * a.s.num_layers + 1, st = a.stages;
    const int stage_b = NB == 1 ? DS_STAGE : a.stage_bytes, row_b = NB == 1 ? DS_ROW_STRIDE : a.row_stride;
    int i = 0, useq = 0, n_static = 0, n_walked = 0;
    bool tail = false;
    ds_walk pw;
    pw.p = 0;
    walk_phase(a, pw);
    const uint16_t *w_next = phase_mat(a.s, 0).w;
    for (int p = 0; p < NP; p++) {
        ds_mat m = phase_mat(a.s, p);
        /* the matrix's address was loaded a phase ahead: the layer table is
         * an L2 round trip away (every grid barrier's acquire spin
         * invalidates L1), which the phase's first copy would wait for */
        m.w = w_next;
        if (p + 1 < NP) w_next = phase_mat(a.s, p + 1).w;
        const int U = m.N / DS_ROWS, S = static_units(U, a);
        int u = (int)((int64_t)blockIdx.x * S / a.grid), u_end = (int)((int64_t)(blockIdx.x + 1) * S / a.grid);
        bool dyn = false;
        /* This block took one of phase p - 1's last units, so it is likely
         * to arrive last at that phase's barrier, where its release fence
         * waits for every copy queued on its SM (~1 us under the stream;
         * bench_fence_probe): it queues nothing more until it has arrived.
         * The other blocks' rings are full by then, and the next phase's
         * dynamic units even out its late start. */
        if (DYNK && tail) {
            const int q = p - 1, bar = 5 * (q >> 2) + ((q & 3) ? (q & 3) + 1 : 0); /* barriers: 5 a layer */
            while (*arrived <= bar) __nanosleep(32);
            tail = false;
        }
        for (;; u++, useq++) {
            if (u >= u_end) {
                if (S == U) break;
                u = S + (int)atomicAdd(ws.claim + p, 1u);
                if (u >= U) break;
                tail |= DYNK && u >= U - a.tail_hold;
                u_end = u + 1;
                dyn = true;
            }
            const int first = i;
            for (int r = 0; r < m.runs; r++) {
                const uint16_t *src = m.w + ((int64_t)r * m.run_off + (int64_t)u * DS_ROWS) * m.K;
                for (int kc = 0; kc < m.K; kc += a.kc, i++) {
                    const unsigned row_bytes = (unsigned)min(a.kc, m.K - kc) * 2u;
                    const int slot = i % st;
                    if (i >= st) {
                        const uint64_t t0 = TRACE ? ds_now() : 0;
                        const unsigned par = (unsigned)((i / st) - 1) & 1u;
                        if (n_walked < n_static + a.prefetch_now && !mbar_test(&empty[slot], par))
                            prefetch_ahead(a, pw, n_walked, n_static, a.prefetch_now, a.prefetch_now);
                        while (!mbar_try(&empty[slot], par)) prefetch_ahead(a, pw, n_walked, n_static, a.prefetch, 1);
                        if (TRACE) waited += ds_now() - t0;
                    }
                    /* A barrier's release and attention's loads are latency-bound, and a
                     * ring refill issued all at once (a phase's last stages free together)
                     * queues ahead of them in L2; spread out, it lands in time for the next
                     * phase (qwen3-4b 3.29 -> 3.17 ms, llama3-8b 5.51 -> 5.37; only in the
                     * attention window: 3.26 / 5.45; bench/RESULTS.md, fifteenth session). */
                    if (DYNK && a.apace_ns && *pace_flag) __nanosleep(a.apace_ns);
                    info[slot] = ds_info{u, first, useq, 0};
                    /* releases the info store with the arrival */
                    mbar_expect_tx(&full[slot], DS_ROWS * row_bytes);
                    /* one copy per row: the rows land apart, see DS_ROW_STRIDE */
                    for (int j = 0; j < DS_ROWS; j++)
                        bulk_copy(ring + (size_t)slot * stage_b + j * row_b, src + (int64_t)j * m.K + kc, row_bytes,
                                  &full[slot], policy);
                    n_static += !dyn;
                    if (TRACE && a.s.timeline && i < RP_DECODE_STEP_TL_PIECES) {
                        uint64_t *t = a.s.timeline + ((size_t)blockIdx.x * RP_DECODE_STEP_TL_PIECES + i) * 4;
                        t[0] = ds_now();
                        t[3] = (uint64_t)p << 40 | (uint64_t)DS_ROWS * row_bytes;
                    }
                }
            }
        }
        pend[p] = i; /* before any piece of phase p + 1 is announced */
    }
    if (TRACE) {
        a.s.trace[blockIdx.x * TR_N + TR_WAIT_EMPTY] = waited;
        a.s.trace[blockIdx.x * TR_N + TR_PIECES] = (uint64_t)i;
    }
}

/* ---- consumer pieces ---------------------------------------------------- */

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    float s = rp_bf16_lo(w.x) * rp_bf16_lo(x.x);
    s = fmaf(rp_bf16_hi(w.x), rp_bf16_hi(x.x), s);
    s = fmaf(rp_bf16_lo(w.y), rp_bf16_lo(x.y), s);
    s = fmaf(rp_bf16_hi(w.y), rp_bf16_hi(x.y), s);
    s = fmaf(rp_bf16_lo(w.z), rp_bf16_lo(x.z), s);
    s = fmaf(rp_bf16_hi(w.z), rp_bf16_hi(x.z), s);
    s = fmaf(rp_bf16_lo(w.w), rp_bf16_lo(x.w), s);
    s = fmaf(rp_bf16_hi(w.w), rp_bf16_hi(x.w), s);
    return s;
}

/* Sum over the 256 consumer threads, the same value in all (fixed order). */
__device__ __forceinline__ float csum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = rp_warp_sum(v);
    if (lane == 0) red[warp] = v;
    cbar();
    float r = 0.0f;
#pragma unroll
    for (int w = 0; w < DS_CONSUMERS; w++) r += red[w];
    cbar(); /* red is reused by the next call */
    return r;
}

/* Layer l's RMSNorm weights (which: 0 attn_norm, 1 mlp_norm, 2 q_norm, 3
 * k_norm; l = num_layers: the final norm): addresses computed, not loaded
 * (rp_decode_step.norms), so a norm's first load does not wait for a
 * pointer; nullptr where the model has no q/k norm. */
__device__ __forceinline__ const uint16_t *ds_norm(const rp_decode_step &s, int l, int which) {
    if (l == s.num_layers) return s.final_norm;
    if (which >= 2 && !s.qk_norm) return nullptr;
    const uint16_t *n = s.norms + (size_t)l * (2 * s.H + 2 * s.hd);
    return which < 2 ? n + which * s.H : n + 2 * s.H + (which - 2) * s.hd;
}

/* A thread's share of a norm's weights, in registers: loaded between the
 * halves of the grid barrier before the staging (the weights feed nothing
 * a block writes), so that after the release the staging waits only for
 * the residual row. */
struct ds_nw {
    uint4 g[DS_MAX_H / (DS_CONSUMERS * 32 * 8)];
};
__device__ __forceinline__ void load_nw(ds_nw &n, const uint16_t *w, int H) {
#pragma unroll
    for (int j = 0; j < DS_MAX_H / (DS_CONSUMERS * 32 * 8); j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) n.g[j] = rp_ld_nc(w + i);
    }
}

/* x = bf16(w * (row * inv)), row from the fp32 residual or (layer 0) the
 * embedding row; the same expression as the RMSNORM GEMV input. rs, if
 * given, keeps the row: the residual does not change between this staging
 * and the next o or down epilogue, which then add to it without an L2
 * round trip. */
__device__ void stage_norm(uint16_t *xs, const float *res, const uint16_t *emb, const ds_nw &nw, int H, float eps,
                           float *red, float *rs) {
    constexpr int J = DS_MAX_H / (DS_CONSUMERS * 32 * 8);
    float v[J][8];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) {
            if (emb) {
                const uint4 e = rp_ld_nc(emb + i);
                v[j][0] = rp_bf16_lo(e.x), v[j][1] = rp_bf16_hi(e.x), v[j][2] = rp_bf16_lo(e.y);
                v[j][3] = rp_bf16_hi(e.y), v[j][4] = rp_bf16_lo(e.z), v[j][5] = rp_bf16_hi(e.z);
                v[j][6] = rp_bf16_lo(e.w), v[j][7] = rp_bf16_hi(e.w);
            } else {
                const float4 r0 = rp_ld_act_f4(res + i), r1 = rp_ld_act_f4(res + i + 4);
                v[j][0] = r0.x, v[j][1] = r0.y, v[j][2] = r0.z, v[j][3] = r0.w;
                v[j][4] = r1.x, v[j][5] = r1.y, v[j][6] = r1.z, v[j][7] = r1.w;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[j][e] * v[j][e];
            if (rs) {
                *reinterpret_cast<float4 *>(rs + i) = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
                *reinterpret_cast<float4 *>(rs + i + 4) = make_float4(v[j][4], v[j][5], v[j][6], v[j][7]);
            }
        }
    }
    const float inv = 1.0f / sqrtf(csum(ss, red) / (float)H + eps);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) {
            const uint4 g = nw.g[j];
            *reinterpret_cast<uint4 *>(xs + i) =
                make_uint4(rp_pack_bf16x2(rp_bf16_lo(g.x) * (v[j][0] * inv), rp_bf16_hi(g.x) * (v[j][1] * inv)),
                           rp_pack_bf16x2(rp_bf16_lo(g.y) * (v[j][2] * inv), rp_bf16_hi(g.y) * (v[j][3] * inv)),
                           rp_pack_bf16x2(rp_bf16_lo(g.z) * (v[j][4] * inv), rp_bf16_hi(g.z) * (v[j][5] * inv)),
                           rp_pack_bf16x2(rp_bf16_lo(g.w) * (v[j][6] * inv), rp_bf16_hi(g.w) * (v[j][7] * inv)));
        }
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

__device__ void stage_bf16(uint16_t *xs, const uint16_t *src, int K) {
    for (int i = threadIdx.x * 8; i < K; i += DS_CONSUMERS * 32 * 8)
        *reinterpret_cast<uint4 *>(xs + i) = rp_ld_act(src + i);
    cbar(); /* x is complete before any warp multiplies with it */
}

/* Several sequences' x (NB > 1): stage_norm for all of them at once, every
 * row's loads in flight together and one reduction for all the norms
 * (one row at a time was an L2 round trip and two barriers per row:
 * qwen3-0.6b's four sequences took 1.13 ms against 0.83 for one). The same
 * sums in the same order as stage_norm. emb: the embedding table (layer 0;
 * row token[b]), else the residual rows. */
/* rows held in registers: four sequences' at up to 2048 (more spilled),
 * two sequences' at up to 4096 */
__host__ __device__ constexpr int ds_max_h_nb(int nb) { return nb > 2 ? 2048 : 4096; }
template <int NB>
__device__ void stage_norm_nb(uint16_t *xs, int xst, int nb, const float *res, const uint16_t *emb,
                              const int32_t (&token)[NB], const uint16_t *w, int H, float eps, float *red, float *rs) {
    constexpr int J = ds_max_h_nb(NB) / (DS_CONSUMERS * 32 * 8);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v[NB][J][8], ss[NB];
    uint4 gw[J];
#pragma unroll
    for (int b = 0; b < NB; b++) ss[b] = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i >= H) continue;
        gw[j] = rp_ld_nc(w + i);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= nb) continue;
            float *f = v[b][j];
            if (emb) {
                const uint4 e = rp_ld_nc(emb + (int64_t)token[b] * H + i);
                f[0] = rp_bf16_lo(e.x), f[1] = rp_bf16_hi(e.x), f[2] = rp_bf16_lo(e.y), f[3] = rp_bf16_hi(e.y);
                f[4] = rp_bf16_lo(e.z), f[5] = rp_bf16_hi(e.z), f[6] = rp_bf16_lo(e.w), f[7] = rp_bf16_hi(e.w);
            } else {
                const float4 r0 = rp_ld_act_f4(res + (int64_t)b * H + i), r1 = rp_ld_act_f4(res + (int64_t)b * H + i + 4);
                f[0] = r0.x, f[1] = r0.y, f[2] = r0.z, f[3] = r0.w, f[4] = r1.x, f[5] = r1.y, f[6] = r1.z, f[7] = r1.w;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss[b] += f[e] * f[e];
            if (rs) {
                *reinterpret_cast<float4 *>(rs + b * H + i) = make_float4(f[0], f[1], f[2], f[3]);
                *reinterpret_cast<float4 *>(rs + b * H + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        ss[b] = rp_warp_sum(ss[b]);
        if (lane == 0) red[warp * NB + b] = ss[b];
    }
    cbar();
    float inv[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        float r = 0.0f;
#pragma unroll
        for (int k = 0; k < DS_CONSUMERS; k++) r += red[k * NB + b];
        inv[b] = 1.0f / sqrtf(r / (float)H + eps);
    }
    cbar(); /* red is reused by the next call */
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i >= H) continue;
        const uint4 g = gw[j];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= nb) continue;
            const float *f = v[b][j];
            const float n = inv[b];
            *reinterpret_cast<uint4 *>(xs + b * xst + i) =
                make_uint4(rp_pack_bf16x2(rp_bf16_lo(g.x) * (f[0] * n), rp_bf16_hi(g.x) * (f[1] * n)),
                           rp_pack_bf16x2(rp_bf16_lo(g.y) * (f[2] * n), rp_bf16_hi(g.y) * (f[3] * n)),
                           rp_pack_bf16x2(rp_bf16_lo(g.z) * (f[4] * n), rp_bf16_hi(g.z) * (f[5] * n)),
                           rp_pack_bf16x2(rp_bf16_lo(g.w) * (f[6] * n), rp_bf16_hi(g.w) * (f[7] * n)));
        }
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

/* stage_bf16 for several sequences: rows K apart, every load of a pass in
 * flight at once. */
template <int NB>
__device__ void stage_bf16_nb(uint16_t *xs, int xst, int nb, const uint16_t *src, int K) {
    constexpr int J = 8 / NB, STEP = DS_CONSUMERS * 32 * 8;
    for (int i0 = threadIdx.x * 8; i0 < K; i0 += J * STEP) {
        uint4 t[NB][J];
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb && i0 + j * STEP < K) t[b][j] = rp_ld_act(src + (int64_t)b * K + i0 + j * STEP);
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb && i0 + j * STEP < K) *reinterpret_cast<uint4 *>(xs + b * xst + i0 + j * STEP) = t[b][j];
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

enum { EPI_BF16, EPI_RESIDUAL, EPI_SWIGLU, EPI_F32 };

/* One matrix phase: every unit this block owns, against x in xs, on the
 * tensor cores. Piece i of the ring (8 rows x up to 1536 k) belongs to
 * warp i % 8, which does all of it with mma m16n8k16, four independent
 * accumulators. Thread (g, c) loads 8 consecutive k of row g with one
 * 16-byte load (a sum over k does not care how k is numbered; gemv.cu does
 * the same) and puts them in A: the first four k in row g, the last four in
 * row g + 8. B's column 0 holds the matching first halves of x, column 1
 * the second halves (lanes g = 0, 1 load them; the other columns are never
 * read), so row g's sum is D[g][0] + D[g + 8][1] (d0 + d3 of lane (g, 0))
 * and one mma covers 8 rows x 32 k. (With the rows as N and x in A it
 * covered 16 k: the same loads and twice the mma; 1.1-1.4% slower on
 * qwen3-0.6b, llama3.2-1b and qwen3-4b; bench/RESULTS.md, ninth session.)
 * Lanes (g, 0) leave row g in part[i % 32]; the warp that finishes a
 * unit's last piece (a shared counter per unit) adds the unit's pieces in
 * piece order and applies the epilogue, so the result does not depend on
 * which warp was last. i and useq are the ring and unit
 * positions (the producer walks the same sequence). rs: the residual row
 * kept by stage_norm, or null (the residual epilogue reads L2).
 * NB sequences (up to 4): B's columns 2b and 2b + 1 hold sequence b's x
 * halves, so the same mma covers all of them, and lane (g, b) holds row
 * g of sequence b. */
template <int NB, bool DYNK>
__device__ void gemv_phase(const ds_args &a, int p, int epi, const float *rs, int &iw, const uint8_t *ring,
                           uint64_t *full, uint64_t *empty, const uint16_t *xs, float *part, unsigned *ucnt,
                           const ds_info *info, volatile int *pend, uint64_t *tr, uint64_t *tl) {
    const int lane = threadIdx.x & 31, st = a.stages, g = lane >> 2, c = lane & 3;
    const ds_mat m = phase_mat(a.s, p);
    const int nch = (m.K + a.kc - 1) / a.kc, P = m.runs * nch;
    const int stage_b = NB == 1 ? DS_STAGE : a.stage_bytes, row_b = NB == 1 ? DS_ROW_STRIDE : a.row_stride;
    /* this lane's B column g: sequence g / 2 (past 2 NB, columns that are
     * never read) */
    const int tb = min(g >> 1, NB - 1);
    /* Where the phase has a dynamic tail, this block's static pieces,
     * [first, certain), are sure to come; past them the phase ends where the
     * producer's claims run out (pend[p]). A warp sleeping in try_wait there
     * wakes only when its stage's next piece lands, which then belongs to the
     * next phase and comes a claim and a copy later (qwen3-4b: 1.7-4.2 us
     * from a phase's last piece to its last barrier arrival, against 0.7
     * with static units only; tools/step_timeline.py), so there it polls. */
    const int U = m.N / DS_ROWS, S = static_units(U, a);
    const int certain = DYNK && S < U && a.poll_ns ? (p == 0 ? 0 : pend[p - 1]) +
                                                 ((int)(blockIdx.x + 1) * S / a.grid - (int)blockIdx.x * S / a.grid) * P
                                           : INT_MAX;
    for (;; iw += DS_CONSUMERS) {
        /* piece iw, unless the phase ends before it */
        const int slot = iw % st;
        const unsigned par = (unsigned)(iw / st) & 1u;
        const uint64_t t0 = tr ? ds_now() : 0;
        bool ready = false;
        if (DYNK && iw >= certain) {
            while (iw < pend[p] && !(ready = mbar_test(&full[slot], par))) __nanosleep(a.poll_ns);
        } else {
            while (iw < pend[p] && !(ready = mbar_try(&full[slot], par))) {
            }
        }
        if (tr) tr[TR_WAIT_FULL] += ds_now() - t0;
        if (!ready || iw >= pend[p]) break;
        uint64_t *tp = tl && lane == 0 && iw < RP_DECODE_STEP_TL_PIECES ? tl + (size_t)iw * 4 : nullptr;
        if (tp) tp[1] = ds_now();
        const ds_info in = info[slot];
        const int j = iw - in.first, kc = (j % nch) * a.kc, steps = min(a.kc, m.K - kc) / 32;
        /* The residual epilogue's input, loaded before the multiply in case
         * this warp finishes the unit: the L2 round trip then overlaps the
         * mma loop instead of delaying the phase's end (unless the row is in
         * shared memory). Only the unit's own epilogue writes these rows, and
         * it runs after every piece's load. */
        float rres = 0.0f;
        if (epi == EPI_RESIDUAL && !rs && lane < DS_ROWS * (NB == 1 ? 1 : a.nb))
            rres = __ldcg(a.s.residual + (NB == 1 ? 0 : (lane >> 3) * m.N) + in.unit * DS_ROWS + (lane & 7));
        const uint8_t *wrow = ring + (size_t)slot * stage_b + g * row_b + c * 16;
        /* x: this lane's column (g & 1: which half of each 8 k) */
        const uint8_t *xb =
            reinterpret_cast<const uint8_t *>(xs + (NB == 1 ? 0 : tb * a.xstride) + kc) + c * 16 + (g & 1) * 8;
        float acc[4][4] = {};
        for (int kk = 0; kk < steps; kk += 8) { /* steps is a multiple of 8 (K % 256 == 0) */
            uint4 w[8];
            uint2 x[8];
#pragma unroll
            for (int q = 0; q < 8; q++) {
                w[q] = *reinterpret_cast<const uint4 *>(wrow + (kk + q) * 64);
                x[q] = *reinterpret_cast<const uint2 *>(xb + (kk + q) * 64);
            }
#pragma unroll
            for (int q = 0; q < 8; q++) rp_mma_16816(acc[q & 3], w[q].x, w[q].z, w[q].y, w[q].w, x[q].x, x[q].y);
        }
        if (c < NB) {
            const float d0 = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
            const float d3 = (acc[0][3] + acc[1][3]) + (acc[2][3] + acc[3][3]);
            part[((iw & (DS_PART_SLOTS - 1)) * NB + (NB == 1 ? 0 : c)) * DS_ROWS + g] = d0 + d3;
        }
        __syncwarp();
        int last = 0;
        if (tp) tp[2] = ds_now();
        if (lane == 0) {
            mbar_arrive(&empty[slot]); /* info and the stage are read */
            __threadfence_block();
            last = atomicAdd(&ucnt[in.useq & (DS_PART_SLOTS - 1)], 1u) == (unsigned)P - 1;
        }
        last = __shfl_sync(RP_FULL_MASK, last, 0);
        if (!last) continue;
        /* lane 0 saw the other warps' counts: its fence, then the warp
         * barrier, order every lane's reads of their partials after them */
        if (lane == 0) __threadfence_block();
        __syncwarp();
        if (lane < DS_ROWS * (NB == 1 ? 1 : a.nb)) {
            /* row r of sequence b; the output rows are m.N apart */
            const int r = NB == 1 ? lane : lane & 7, b = NB == 1 ? 0 : lane >> 3;
            float v0 = 0.0f, v1 = 0.0f;
            for (int q = 0; q < nch; q++) {
                v0 += part[(((in.first + q) & (DS_PART_SLOTS - 1)) * NB + b) * DS_ROWS + r];
                if (m.runs == 2) v1 += part[(((in.first + nch + q) & (DS_PART_SLOTS - 1)) * NB + b) * DS_ROWS + r];
            }
            const int n = (NB == 1 ? 0 : b * m.N) + in.unit * DS_ROWS + r;
            switch (epi) {
            case EPI_BF16: a.s.qkv[n] = rp_f32_bf16(v0); break;
            case EPI_RESIDUAL:
                a.s.residual[n] = (rs ? rs[n] : rres) + v0;
                break;
            case EPI_SWIGLU: {
                a.s.act[n] = rp_f32_bf16(v0 / (1.0f + expf(-v0)) * v1);
                break;
            }
            default: a.s.logits[n] = v0;
            }
        }
        if (lane == 0) ucnt[in.useq & (DS_PART_SLOTS - 1)] = 0;
    }
}

/* Every consumer of every block has arrived (release of this block's
 * writes, acquire of everyone's), in two halves: grid_arrive, then
 * grid_wait, with loads between them that no block's writes in this step
 * feed (grid_sync's between): after qkv, the first cached K/V rows
 * (first_kv) and the q/k norm weights (load_qkw), a barrier earlier than
 * attention would load them; after attention, the next layer's K/V
 * prefetch, whose page-table loads were an L2 round trip on the critical
 * path from the merge to the arrival, and the norms' L2 prefetch; after o
 * and down, the next norm's weights (load_nw). The release's fence waits
 * for every transfer queued on this SM, the ring's copies too (~1 us for
 * the last block under the stream; bench_fence_probe), which the paced
 * refill keeps short. */
__device__ __forceinline__ void grid_arrive(unsigned *ctr, unsigned &target, int grid, uint64_t *bt, uint64_t &t0,
                                            volatile int *arrived) {
    cbar();
    if (threadIdx.x == 0) {
        target += (unsigned)grid;
        if (bt) {
            /* the trace times the release's fence apart: a fence then a
             * relaxed add is the same release */
            t0 = ds_now();
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            bt[RP_DECODE_STEP_TRACE_FENCE - 16 + target / (unsigned)grid - 1] = ds_now();
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        } else {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        }
        if (arrived) *arrived = (int)(target / (unsigned)grid); /* after the release's fence */
    }
}

__device__ __forceinline__ void grid_wait(unsigned *ctr, unsigned target, int grid, uint64_t *bt, uint64_t t0) {
    if (threadIdx.x == 0) {
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while (v < target);
        if (bt) { /* arrival and release times of this barrier */
            const unsigned k = target / (unsigned)grid - 1;
            bt[2 * k] = t0;
            bt[2 * k + 1] = ds_now();
        }
    }
    cbar();
}

/* A grid barrier with between() run after this block's arrival, before its
 * wait (loads that no block writes in the step). */
template <class F>
__device__ __forceinline__ void grid_sync(unsigned *ctr, unsigned &target, int grid, uint64_t *bt,
                                          volatile int *arrived, F &&between) {
    uint64_t t0 = 0;
    grid_arrive(ctr, target, grid, bt, t0, arrived);
    between();
    grid_wait(ctr, target, grid, bt, t0);
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
 * rotate_half RoPE at pos, rounded to bf16 as qk_norm_rope_store does (same
 * expressions, same order). */
template <int HD>
__device__ void norm_rope_head(const uint16_t *src, bool norm, const float (&na)[HD / 64], const float (&nb)[HD / 64],
                               const float (&fr)[HD / 64], float pos, float eps, float *dst, uint16_t *cache) {
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
         * after the other its outputs (loaded before its (max, sum) had
         * landed) took another round trip. Only with at most two query
         * heads per kv head: with four, twice as many blocks merge, and
         * their polls cost more than the round trip (qwen3-0.6b 0.777 ->
         * 0.767 ms, qwen3-4b 3.057 -> 3.072; bench/RESULTS.md, seventeenth
         * session). */
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
                norm_rope_head<HD>(qkv + (kvh * G + task) * HD, s.qk_norm, qw.qa, qw.qb, qw.fr, (float)pos, s.eps,
                                   qs + task * HD, nullptr);
            } else if (task == G && has_new) {
                norm_rope_head<HD>(qkv + q_dim + kvh * HD, s.qk_norm, qw.ka, qw.kb, qw.fr, (float)pos, s.eps, kn,
                                   slot_new >= 0 ? kc + slot_new * kv_dim + kvh * HD : nullptr);
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

/* TRACE: the kernel that records where its time goes (s.trace set); the
 * other has none of that code, which alone makes it 0.4-2.7% faster.
 * NB: sequences decoded together (1, 2 or 4, one token each), all through
 * the same weight stream. */
/* PK: every sequence samples greedily and asks for no top logprobs, so
 * the kernel picks the token itself (pick_slice, pick_finish) and no
 * sampling kernel follows; a kernel of its own, so that the others keep
 * their code. */
template <int G, int HD, int NB, bool TRACE, bool DYNK, bool PK = false>
__global__ void __launch_bounds__(DS_THREADS, 1) decode_step_kernel(const __grid_constant__ ds_args a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const ds_layout Lo = ds_plan(a.stages, a.kmax, G, 4 * a.s.num_layers + 1, a.keep_res ? a.s.H : 0, NB,
                                 NB == 1 ? DS_STAGE : a.stage_bytes);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + DS_MAX_STAGES;
    uint8_t *ring = smem + Lo.ring;
    uint16_t *xs = reinterpret_cast<uint16_t *>(smem + Lo.xs);
    float *part = reinterpret_cast<float *>(smem + Lo.part), *red = reinterpret_cast<float *>(smem + Lo.red);
    float *rs = a.keep_res ? reinterpret_cast<float *>(smem + Lo.rs) : nullptr;
    /* set from a phase's end to the release after its barrier, and through
     * attention (DYNK; the last word of the reduction scratch: csum uses 8,
     * stage_norm_nb 32) */
    volatile int *pace_flag = reinterpret_cast<volatile int *>(red + 63);
    if (DYNK && threadIdx.x == 0) *pace_flag = 0;
    /* grid barriers this block has arrived at, its release fence done (the
     * producer's tail hold; only with dynamic units) */
    volatile int *arrived = DYNK ? reinterpret_cast<volatile int *>(red + 62) : nullptr;
    if (DYNK && threadIdx.x == 0) *arrived = 0;
    unsigned *ucnt = reinterpret_cast<unsigned *>(smem + Lo.ucnt);
    ds_info *info = reinterpret_cast<ds_info *>(smem + Lo.info);
    volatile int *pend = reinterpret_cast<volatile int *>(smem + Lo.pend);
    for (int k = threadIdx.x; k < DS_PART_SLOTS; k += blockDim.x) ucnt[k] = 0;
    for (int k = threadIdx.x; k < 4 * a.s.num_layers + 1; k += blockDim.x) pend[k] = 0x7fffffff; /* not known yet */
    const ds_ws ws = ds_ws_at(a.s.workspace, a.s.nh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int k = 0; k < a.stages; k++) {
            mbar_init(&full[k], 1);
            mbar_init(&empty[k], 1); /* the one warp that used the piece */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* sampling (launched with PDL) may be placed as this grid's blocks exit */
    rp_pdl_trigger();
    if (warp >= DS_CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(DS_PRODUCER_REGS));
        /* weights are constant: stream them before (and regardless of) the
         * wait for the previous kernel */
        if (warp == DS_CONSUMERS && lane == 0)
            produce<NB, TRACE, DYNK>(a, ws, ring, full, empty, info, pend, pace_flag, arrived);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(DS_CONSUMER_REGS));
    rp_pdl_wait();
    const unsigned launch = __ldcg(ws.launch);
    const ds_seq sq = seq_of<NB>(a);
    prefetch_kv<HD, NB>(a, 0, sq);
    const rp_decode_step &s = a.s;
    const int L = s.num_layers, H = s.H, q_dim = s.nh * HD;
    /* sequence b's x at xs + b * xst */
    const int xst = NB == 1 ? 0 : a.xstride, nb = NB == 1 ? 1 : a.nb;
    int i = threadIdx.x >> 5; /* this warp's next ring piece */
    unsigned target = 0;
    int32_t token[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (b >= nb) break;
        token[b] = rp_step_token(s.tokens, s.prev_sampled, b);
        /* the residual stream starts as the embedding row: each block
         * writes its share (first read after two grid barriers) */
        const uint16_t *e = s.embed + (int64_t)token[b] * H;
        const int h0 = (int)((int64_t)blockIdx.x * H / a.grid), h1 = (int)((int64_t)(blockIdx.x + 1) * H / a.grid);
        for (int k = h0 + (int)threadIdx.x; k < h1; k += DS_CONSUMERS * 32)
            s.residual[(int64_t)b * H + k] = rp_bf16_f32(e[k]);
    }
    /* trace: thread 0's time per kind of work (its warp's view) */
    uint64_t trl[TR_PIECES + 1] = {}, *tr = TRACE && threadIdx.x == 0 ? trl : nullptr;
    uint64_t *bt = tr ? s.trace + blockIdx.x * TR_N + 16 : nullptr;
    /* timeline: every consumer warp's lane 0 stamps its pieces */
    uint64_t *tl = TRACE && s.timeline ? s.timeline + (size_t)blockIdx.x * RP_DECODE_STEP_TL_PIECES * 4 : nullptr;
    uint64_t tk = tr ? ds_now() : 0;
#define DS_T(kind, ...)                                                                                                \
    do {                                                                                                               \
        const uint64_t t0_ = tr ? ds_now() : 0;                                                                        \
        __VA_ARGS__;                                                                                                   \
        if (tr) tr[kind] += ds_now() - t0_;                                                                            \
    } while (0)
    const uint64_t t_begin = tk;
    /* x from the residual (norm) or a bf16 buffer, for each sequence */
    /* one sequence: the next norm's weights, loaded a barrier ahead (load_nw) */
    ds_nw nw;
    if constexpr (NB == 1) load_nw(nw, ds_norm(s, 0, 0), H);
#define DS_NORM(first, l_, which, keep)                                                                                \
    if constexpr (NB == 1)                                                                                             \
        stage_norm(xs, s.residual, first ? s.embed + (int64_t)token[0] * H : nullptr, nw, H, s.eps, red,             \
                   keep ? rs : nullptr);                                                                               \
    else                                                                                                               \
        stage_norm_nb<NB>(xs, xst, nb, s.residual, first ? s.embed : nullptr, token, ds_norm(s, l_, which), H, s.eps, \
                          red, keep ? rs : nullptr)
#define DS_BF16(src, K)                                                                                                \
    if constexpr (NB == 1)                                                                                             \
        stage_bf16(xs, src, K);                                                                                        \
    else                                                                                                               \
        stage_bf16_nb<NB>(xs, xst, nb, src, K)
    for (int l = 0; l < L; l++) {
        DS_T(TR_STAGE, DS_NORM(l == 0, l, 0, rs));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK>(a, 4 * l, EPI_BF16, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr, tl));
        if (DYNK && threadIdx.x == 0) *pace_flag = 1;
        lane_row<HD / 32> kr[ATT_UNROLL], vr[ATT_UNROLL];
        ds_qkw<HD> qw;
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                 first_kv<HD>(a, l, sq, kr, vr);
                 load_qkw<HD>(qw, s, l);
             }));
        /* Past a phase's barrier no producer takes from its counter again. */
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l] = 0;
        DS_T(TR_ATTN, attention_phase<G, HD, NB>(a, l, smem + Lo.attn, ws, tr, launch, sq, kr, vr, qw));
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                 if (l + 1 < L) prefetch_kv<HD, NB>(a, l + 1, sq);
                 if (a.norm_pf) prefetch_norms(a, l);
             }));
        if (DYNK && threadIdx.x == 0) *pace_flag = 0;
        DS_T(TR_STAGE, DS_BF16(s.attn, q_dim));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK>(a, 4 * l + 1, EPI_RESIDUAL, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                 if constexpr (NB == 1) load_nw(nw, ds_norm(s, l, 1), H);
             }));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 1] = 0;
        DS_T(TR_STAGE, DS_NORM(false, l, 1, rs));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK>(a, 4 * l + 2, EPI_SWIGLU, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [] {}));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 2] = 0;
        DS_T(TR_STAGE, DS_BF16(s.act, s.F));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK>(a, 4 * l + 3, EPI_RESIDUAL, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                 if constexpr (NB == 1) load_nw(nw, ds_norm(s, l + 1, 0), H);
             }));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 3] = 0;
    }
    DS_T(TR_STAGE, DS_NORM(false, L, 0, false));
    DS_T(TR_GEMV,
         gemv_phase<NB, DYNK>(a, 4 * L, EPI_F32, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr, tl));
#undef DS_NORM
#undef DS_BF16
#undef DS_T
    if (tr) {
        tr[TR_TOTAL] = ds_now() - t_begin;
        for (int k = 0; k <= TR_PIECES; k++)
            if (k != TR_WAIT_EMPTY && k != TR_PIECES) s.trace[blockIdx.x * TR_N + k] = tr[k];
    }
    /* The greedy pick: every block's logits are in after one more barrier
     * (not traced: the trace has five per layer). */
    if constexpr (PK) {
        grid_sync(ws.sync, target, a.grid, nullptr, arrived, [] {});
        pick_slice(s, ws, nb, a.grid, part);
    }
    /* The last block out puts the barrier back to 0 for the next launch:
     * every block has passed its last grid barrier before it counts here.
     * With the pick it also finishes it: thread 0's fence releases its
     * block's slice (written by thread 0), the last block's fence after
     * the count acquires everyone's. */
    cbar();
    if (warp == 0) {
        unsigned last = 0;
        if (lane == 0) {
            if (PK) __threadfence();
            const unsigned prev = atomicAdd(ws.exitc, 1u);
            last = prev == (unsigned)a.grid - 1;
            if (last) {
                *ws.sync = 0;
                *ws.exitc = 0;
                *ws.launch += 1; /* every block read it at its start */
                ws.claim[4 * L] = 0;
                if (PK) __threadfence();
            }
        }
        if (PK && __shfl_sync(RP_FULL_MASK, last, 0)) pick_finish(s, ws, nb, a.grid);
    }
}

/* ---- host side ------------------------------------------------------------ */

extern "C" const char *const rp_decode_step_trace_names[RP_DECODE_STEP_TRACE_SLOTS] = {
    "wait for weights", "producer waits for a stage", "grid barriers", "attention", " .. loads, q/k norm, RoPE",
    " .. scores and values", " .. partials out", " .. merge (merging blocks)", "staging x",
    "matrix phases (incl. waits)", "total", "ring pieces"};

extern "C" size_t rp_decode_step_workspace_bytes(int nh, int nkv) {
    (void)nkv;
    ds_ws w = ds_ws_at(nullptr, nh);
    return (size_t)((uint8_t *)(w.pick + DS_PICK_MAX_GRID * 4) - (uint8_t *)nullptr);
}

static int kmax_of(const rp_decode_step *s) {
    int k = s->H;
    if (s->nh * s->hd > k) k = s->nh * s->hd;
    if (s->F > k) k = s->F;
    return k;
}

/* A tuning knob from the environment (read once), or dflt. */
static int env_knob(const char *name, int lo, int hi, int dflt, int *cache) {
    if (*cache == INT_MIN) {
        const char *v = getenv(name);
        *cache = v && atoi(v) >= lo && atoi(v) <= hi ? atoi(v) : -1;
    }
    return *cache >= 0 ? *cache : dflt;
}

/* Weight bytes each block streams per layer. */
static int64_t layer_bytes_per_sm(const rp_decode_step *s, int num_sms) {
    const int64_t q_dim = (int64_t)s->nh * s->hd, kv_dim = (int64_t)s->nkv * s->hd;
    return 2 * (int64_t)s->H * (q_dim + 2 * kv_dim + q_dim + 3 * (int64_t)s->F) / num_sms;
}

/* k per ring piece, 1024 or 1536. Where every unit of a phase is cut in
 * advance (under 1 MiB per block per layer: no dynamic tail), a block's
 * phase ends with its last piece, so an uneven split costs:
 *  - on the smallest shapes (under 256 KiB: qwen3-0.6b) most blocks hold
 *    one unit of the o and down phases, and 1024 splits those widths (2048,
 *    3072) evenly where 1536 leaves one piece half again as long
 *    (qwen3-0.6b 1.044 -> 0.97 ms, fourth session);
 *  - on the 1B-class ones the down phase is the largest, and 1024 pays
 *    where it splits the intermediate size evenly and 1536 does not
 *    (llama3.2-1b, 8192: 1.204 -> 1.190; qwen3-1.7b, 6144 = 4 x 1536, is
 *    slower at 1024: 1.729 -> 1.754; seventh session).
 * Elsewhere 1024 only adds pieces (qwen3-4b 3.53 -> 3.92, fourth session;
 * llama3-8b 5.69 -> 5.72 and qwen3-8b 5.79 -> 5.87, seventh).
 * bench/RESULTS.md has the sweeps. REPLAY_DECODE_STEP_KC overrides (a
 * multiple of 256). */
static int ds_kc(const rp_decode_step *s, int num_sms) {
    static int knob = INT_MIN;
    const int64_t b = layer_bytes_per_sm(s, num_sms);
    const bool narrow = b < (256 << 10) || (b < (1 << 20) && s->F % 1536 && s->F % 1024 == 0);
    const int v = env_knob("REPLAY_DECODE_STEP_KC", 256, DS_KC, narrow ? 1024 : DS_KC, &knob);
    return v % 256 ? DS_KC : v;
}

/* The pieces of the longest unit at piece width kc: with those the other
 * warps can take meanwhile (< 8 + stages) they must fit the 32 partial-sum
 * slots, so at most 16. */
static bool ds_pieces_fit(const rp_decode_step *s, int kc) {
    const int gu = 2 * ((s->H + kc - 1) / kc), dn = (kmax_of(s) + kc - 1) / kc;
    return gu <= 16 && dn <= 16;
}

extern "C" const char *rp_decode_step_check(const rp_decode_step *s) {
    if (s->hd != 64 && s->hd != DS_HD) return "head_dim is not 64 or 128";
    if (s->nkv <= 0 || s->nh % s->nkv) return "heads do not divide into kv groups";
    const int G = s->nh / s->nkv;
    if (G != 1 && G != 2 && G != 4 && G != 8) return "GQA group is not 1, 2, 4 or 8";
    if (s->H % DS_SEG || s->F % DS_SEG || (s->nh * s->hd) % DS_SEG) return "a matrix width is not a multiple of 256";
    if (s->H > DS_MAX_H) return "hidden size above 8192";
    if (4 * s->num_layers + 1 > DS_MAX_PHASES) return "more than 128 layers";
    /* a unit's pieces must fit the partial-sum slots (gemv_phase) */
    if (!ds_pieces_fit(s, DS_KC)) return "a matrix width above 24576";
    /* shared memory: the ring and x (227 KiB on Hopper) */
    if (ds_plan(DS_STAGES, kmax_of(s), s->nh / s->nkv, 4 * s->num_layers + 1, 0).total > 227 * 1024)
        return "x does not fit beside the ring";
    if (s->V % DS_ROWS) return "vocabulary not a multiple of 8";
    return NULL;
}

typedef void (*ds_kernel_fn)(const ds_args);

#define DS_KERNELS(NB, T, P, K)                                                                                        \
    {{decode_step_kernel<1, 64, NB, T, P, K>, decode_step_kernel<2, 64, NB, T, P, K>,                                  \
      decode_step_kernel<4, 64, NB, T, P, K>, decode_step_kernel<8, 64, NB, T, P, K>},                                 \
     {decode_step_kernel<1, 128, NB, T, P, K>, decode_step_kernel<2, 128, NB, T, P, K>,                                \
      decode_step_kernel<4, 128, NB, T, P, K>, decode_step_kernel<8, 128, NB, T, P, K>}}

/* The kernel for a GQA group, head size and sequence count, with or
 * without the trace (one sequence only), its dynamic shared memory limit
 * raised to smem (once per kernel and size). dyn: one sequence on a shape
 * with dynamic units (ds_args.poll_ns, apace_ns); a kernel of its own, so
 * that the others keep their code as it was (qwen3-0.6b measured 1-2%
 * slower with that code compiled in and switched off: code layout). The
 * trace kernel has it, used where the knobs say. pick: one sequence with
 * the greedy pick (PK; the same reason, eighteenth session: +0.3% on
 * qwen3-4b with it compiled in and switched off). */
static ds_kernel_fn kernel_for(int G, int HD, int nb, bool trace, bool dyn, bool pick, size_t smem, cudaError_t *e) {
    static const ds_kernel_fn fns[7][2][4] = {
        DS_KERNELS(1, false, false, false), DS_KERNELS(1, true, true, false),  DS_KERNELS(2, false, false, false),
        DS_KERNELS(4, false, false, false), DS_KERNELS(1, false, true, false), DS_KERNELS(1, false, false, true),
        DS_KERNELS(1, false, true, true)};
    static size_t set_for[7][2][4];
    const int v = nb == 1 ? (trace ? 1 : pick ? (dyn ? 6 : 5) : dyn ? 4 : 0) : nb == 2 ? 2 : 3, h = HD == 128;
    const int g = G == 1 ? 0 : G == 2 ? 1 : G == 4 ? 2 : 3;
    *e = cudaSuccess;
    if (set_for[v][h][g] != smem) {
        *e = cudaFuncSetAttribute(fns[v][h][g], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (*e != cudaSuccess) return nullptr;
        set_for[v][h][g] = smem;
    }
    return fns[v][h][g];
}
#undef DS_KERNELS

/* The kernel's sequence count for nb sequences: 1, 2 or 4. */
static int ds_nb_kernel(int nb) { return nb <= 2 ? nb : 4; }

/* Arguments for nb sequences, the kernel's count (ds_nb_kernel) setting
 * everything but the loops over them, and its shared memory. */
static int make_args(const rp_decode_step *s, int nb_real, int num_sms, ds_args *a, size_t *smem) {
    const int nb = ds_nb_kernel(nb_real);
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return -1;
    a->s = *s;
    a->nb = nb_real;
    a->grid = num_sms;
    a->kmax = kmax_of(s);
    /* attention items (sequence, kv head, split): at most one per block,
     * and the partials' workspace holds DS_MAX_SPLITS per query head */
    a->splits = num_sms / (s->nkv * nb);
    if (a->splits < 1) a->splits = 1;
    if (a->splits > DS_MAX_SPLITS / nb) a->splits = DS_MAX_SPLITS / nb;
    a->stages = DS_STAGES;
    a->kc = ds_kc(s, num_sms);
    if (!ds_pieces_fit(s, a->kc)) a->kc = DS_KC; /* narrower pieces would overflow the slots */
    const int plan_phases = 4 * s->num_layers + 1, G = s->nh / s->nkv;
    a->xstride = ds_xstride(a->kmax, nb);
    a->row_stride = DS_ROW_STRIDE;
    a->stage_bytes = DS_STAGE;
    if (nb > 1) {
        /* x for every sequence beside the ring: stages as wide as the
         * piece, and narrower pieces where that does not fit, down to 1024
         * (qwen3-8b's 4 sequences at 768: 7.71 ms against 7.07 as a chain;
         * bench/RESULTS.md, tenth session) */
        bool fits = false;
        for (int kc = a->kc; kc >= 1024 && !fits; kc -= 256) {
            a->kc = kc;
            a->row_stride = ds_row_stride(kc);
            a->stage_bytes = DS_ROWS * a->row_stride;
            fits = ds_pieces_fit(s, kc) &&
                   ds_plan(a->stages, a->kmax, G, plan_phases, 0, nb, a->stage_bytes).total <= (size_t)optin;
        }
        if (!fits) return -1;
    }
    static int pf = INT_MIN, dyn = INT_MIN, pfn = INT_MIN, kres = INT_MIN;
    const int64_t lb = layer_bytes_per_sm(s, num_sms);
    /* How far ahead of the ring the producer may prefetch: 8 pieces on the
     * smallest shapes (qwen3-0.6b 0.861 -> 0.850 ms against 4; 12 and 16 the
     * same as 8), 4 elsewhere (8 or 16 the same there; 0 is 1.4-2.3%
     * slower on the 4B and 8B shapes; bench/RESULTS.md, ninth session). */
    a->prefetch = env_knob("REPLAY_DECODE_STEP_PF", 0, 64, lb < (256 << 10) ? 8 : 4, &pf);
    /* Pieces prefetched at once when a wait starts: 4 on the smallest
     * shapes (qwen3-0.6b 0.948 -> 0.931 ms), where a block's ring holds
     * half a layer, so HBM has little else to do in a stall; one on the
     * 4B class (1-2 MiB: qwen3-4b 3.046 -> 3.023 ms, 2 the same, 3 +0.3%;
     * there the ring fills ~8 us into attention's stretch and stays full
     * ~4.5 us, bench/RESULTS.md, nineteenth session); elsewhere none
     * (llama3.2-1b +2%, the 8B shapes +1-4% at 2 in the sixth session, the
     * extra requests competing with the rings' own; qwen3-8b -0.2% at 1,
     * +0.3% at 2 in the nineteenth). REPLAY_DECODE_STEP_PFN overrides. */
    a->prefetch_now = env_knob("REPLAY_DECODE_STEP_PFN", 0, 64,
                               lb < (256 << 10) ? 4 : lb >= (1 << 20) && lb < (2 << 20) ? 1 : 0, &pfn);
    if (a->prefetch < a->prefetch_now) a->prefetch = a->prefetch_now;
    /* How much of a phase to leave to the counter: blocks drift apart in
     * proportion to the bytes each streams per phase, so the 8B shapes
     * (~3 MiB per block per layer) settle best with 7/8 dynamic (llama3-8b
     * 5.73 -> 5.69 ms against 6/8; all of it is worse again), qwen3-4b
     * (1.5 MiB) with 6/8 (3.497 -> 3.480 against 7/8, seventh session).
     * On the 1B-class ones (~0.25-0.9 MiB), where a claim's round trip
     * weighs more than the drift it evens out, nothing is dynamic
     * (qwen3-0.6b 0.99 -> 0.945 ms, llama3.2-1b 1.228 -> 1.195 against 1/4;
     * the 4B and 8B shapes lose 3-6% that way; bench/RESULTS.md, 2026-11-23
     * fifth session). */
    a->dyn_eighths = env_knob("REPLAY_DECODE_STEP_DYN", 0, 8, lb >= (2 << 20) ? 7 : lb >= (1 << 20) ? 6 : 0, &dyn);
    /* Polling for a dynamic phase's end (gemv_phase), every 64 ns: qwen3-4b
     * 3.33 -> 3.29 ms, the 8B shapes the same (32 and 128 ns the same;
     * bench/RESULTS.md, fifteenth session). One sequence only (the kernels
     * for several keep their code). REPLAY_DECODE_STEP_POLL_NS=0 sleeps in
     * try_wait as before. */
    static int poll = INT_MIN;
    a->poll_ns = nb == 1 && a->dyn_eighths > 0 ? env_knob("REPLAY_DECODE_STEP_POLL_NS", 0, 10000, 64, &poll) : 0;
    /* The producer's pause between pieces while its consumers are at a
     * barrier or in attention (produce), same kernel: 500 ns, qwen3-4b 3.29
     * -> 3.17 ms, llama3-8b 5.51 -> 5.37, qwen3-8b 5.59 -> 5.46 (400 ns about
     * the same, 250 and 700-1000 ns less; in the attention window alone 3.26,
     * 5.45). On qwen3-0.6b (no dynamic units) it lost 3%, so the shapes
     * without dynamic units run their own kernel without it unless
     * REPLAY_DECODE_STEP_APACE is set (llama3.2-1b: -0.6% at 500). 0 turns it
     * off; REPLAY_DECODE_STEP_APACE_ALL=0 keeps it to the attention window. */
    static int apace = INT_MIN;
    a->apace_ns = nb == 1 ? env_knob("REPLAY_DECODE_STEP_APACE", 0, 100000, a->dyn_eighths > 0 ? 500 : 0, &apace) : 0;
    /* The next norms' weights prefetched into L2 at the barrier after
     * attention (prefetch_norms): qwen3-4b 3.062 -> 3.052 ms, the others the
     * same (bench/RESULTS.md, seventeenth session). */
    static int npf = INT_MIN;
    a->norm_pf = env_knob("REPLAY_DECODE_STEP_NPF", 0, 1, 1, &npf);
    static int apace_all = INT_MIN;
    a->apace_all = env_knob("REPLAY_DECODE_STEP_APACE_ALL", 0, 1, 1, &apace_all);
    /* The blocks that take the last quarter-grid of a phase's dynamic units
     * queue no copies until they arrive at its barrier (produce): qwen3-4b
     * 3.021-3.025 -> 3.009-3.014 ms, llama3-8b and qwen3-8b -0.7..-0.8%
     * (24 and 40 about the same, 48 and 64 less; bench/RESULTS.md,
     * twenty-first session). */
    static int tail_hold = INT_MIN;
    a->tail_hold =
        env_knob("REPLAY_DECODE_STEP_TAILHOLD", 0, 1 << 20, a->dyn_eighths > 0 ? num_sms / 4 : 0, &tail_hold);
    /* The residual row in shared memory where it fits beside the ring
     * (hidden size up to 2048: qwen3-0.6b and 1.7b, llama3.2-1b): the o and
     * down epilogues then skip an L2 round trip (qwen3-0.6b 0.961 -> 0.957
     * ms, qwen3-1.7b 1.779 -> 1.748, llama3.2-1b 1.215 -> 1.211;
     * REPLAY_DECODE_STEP_RES=0 turns it off). */
    const bool res_fits =
        ds_plan(a->stages, a->kmax, G, plan_phases, s->H, nb, a->stage_bytes).total <= (size_t)optin;
    a->keep_res = env_knob("REPLAY_DECODE_STEP_RES", 0, 1, 1, &kres) && res_fits;
    *smem = ds_plan(a->stages, a->kmax, G, plan_phases, a->keep_res ? s->H : 0, nb, a->stage_bytes).total;
    return *smem > (size_t)optin ? -1 : 0;
}

extern "C" const char *rp_decode_step_check_device(const rp_decode_step *s, int nb, int num_sms) {
    const char *why = rp_decode_step_check(s);
    if (why) return why;
    if (nb < 1 || nb > 4) return "more than 4 sequences";
    if (nb > 1 && s->H > ds_max_h_nb(ds_nb_kernel(nb)))
        return nb > 2 ? "hidden size above 2048 (3-4 sequences)" : "hidden size above 4096 (2 sequences)";
    ds_args a;
    size_t smem;
    int dev = 0, coop = 0, per_sm = 0;
    if (make_args(s, nb, num_sms, &a, &smem)) return "not enough shared memory per block";
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess || !coop)
        return "the device cannot launch cooperative kernels";
    cudaError_t e;
    ds_kernel_fn fn = kernel_for(s->nh / s->nkv, s->hd, ds_nb_kernel(nb), s->trace != nullptr,
                                 a.poll_ns > 0 || a.apace_ns > 0, false, smem, &e);
    if (!fn || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, DS_THREADS, smem) != cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        return "a block per SM does not fit";
    }
    return NULL;
}

/* One sequence (the kernel with the pick is built for one only; the trace
 * kernel has none), the workspace holds every block's pick, and a block's
 * slice of the vocabulary fits pick_slice's registers. */
extern "C" int rp_decode_step_pick_ok(const rp_decode_step *s, int nb, int num_sms) {
    return nb == 1 && !s->trace && num_sms >= 1 && num_sms <= DS_PICK_MAX_GRID && !rp_decode_step_check(s) &&
           (s->V + num_sms - 1) / num_sms <= DS_PICK_PER_THREAD * DS_CONSUMERS * 32;
}

extern "C" int rp_k_decode_step(const rp_decode_step *s, int nb, int num_sms, int greedy, cudaStream_t stream) {
    ds_args a;
    size_t smem;
    if (rp_decode_step_check(s) || num_sms <= 0 || nb < 1 || nb > 4 || make_args(s, nb, num_sms, &a, &smem) ||
        (greedy && (!s->pick_tokens || !s->pick_logprobs || !s->pick_slot || !s->pick_host[0] || !s->pick_host[1] ||
                    !rp_decode_step_pick_ok(s, nb, num_sms))))
        return (int)cudaErrorInvalidValue;
    cudaError_t e;
    ds_kernel_fn fn = kernel_for(s->nh / s->nkv, s->hd, ds_nb_kernel(nb), s->trace != nullptr,
                                 a.poll_ns > 0 || a.apace_ns > 0, greedy != 0, smem, &e);
    if (!fn) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(a.grid);
    cfg.blockDim = dim3(DS_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    /* every block must be resident at once (grid barriers) */
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, fn, a);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return (int)e;
    }
    return rp_launch_result();
}
