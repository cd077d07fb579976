/* decode_step_kernel: one block per SM for the whole step; warp 8's lane 0
 * produces the weight stream, eight consumer warps run the phases, the
 * grid barriers and attention (decode_step.cu describes the design). */
#ifndef RP_DECODE_STEP_KERNEL_CUH
#define RP_DECODE_STEP_KERNEL_CUH

#include "attention.cuh"
#include "barrier.cuh"
#include "phases.cuh"
#include "pick.cuh"

/* NB: sequences decoded together (1, 2 or 4, one token each), all through
 * the same weight stream. DYNK: one sequence on a shape with dynamic units
 * (ds_args.poll_ns, apace_ns), a kernel of its own so that the others do
 * not carry that code. PK: every sequence samples greedily and asks for no
 * top logprobs, so the kernel picks the token itself (pick_slice,
 * pick_finish) and no sampling kernel follows; a kernel of its own, so
 * that the others keep their code. TP: one sequence of a tensor-parallel
 * shard, the embedding, o and down sums over the ranks inside the kernel
 * (rp_decode_step_tp: partial rows into every rank's memory, barriers that
 * count every rank's blocks, the stagings adding the ranks' rows; with
 * PK the ranks' best tokens meet in pick_finish); a kernel of its own too.
 * In the trace build (DS_TRACE) the one-sequence kernels record where
 * their time goes into s.trace. */
template <int G, int HD, int NB, bool DYNK, bool PK, bool W8, bool TP>
__global__ void __launch_bounds__(DS_THREADS, 1) decode_step_kernel(const __grid_constant__ ds_args a) {
    constexpr bool TRACE = DS_TRACE && NB == 1;
    extern __shared__ __align__(128) uint8_t smem[];
    const ds_layout Lo = ds_plan(a.stages, a.kmax, G, 4 * a.s.num_layers + 1, a.keep_res ? a.s.H : 0, NB,
                                 NB == 1 && !TP ? DS_STAGE : a.stage_bytes);
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
            produce<NB, DYNK, W8, TP>(a, ws, ring, full, empty, info, pend, pace_flag, arrived);
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
    /* tensor parallelism (one sequence): sum c's barrier waits for every
     * rank's blocks of every sum so far, this launch's and the earlier ones'
     * (2 L + 1 a launch; wrapping) */
    const rp_decode_step_tp &tp = s.tp;
    const unsigned tp_all = (unsigned)a.grid * (unsigned)tp.n, tp_base = launch * (2u * (unsigned)L + 1u) * tp_all;
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (b >= nb) break;
        token[b] = rp_step_token(s.tokens, s.prev_sampled, b);
        const int h0 = (int)((int64_t)blockIdx.x * H / a.grid), h1 = (int)((int64_t)(blockIdx.x + 1) * H / a.grid);
        if constexpr (TP) {
            /* the shard's row (zeros for another rank's token) into every
             * rank's recv: sum 0 */
            const int64_t row = (int64_t)token[0] - tp.vocab_start;
            const bool mine = row >= 0 && row < tp.vocab_count;
            const uint16_t *e = s.embed + (mine ? row : 0) * H;
            for (int k = h0 + (int)threadIdx.x; k < h1; k += DS_CONSUMERS * 32) {
                const float v = mine ? rp_bf16_f32(e[k]) : 0.0f;
                for (int r = 0; r < tp.n; r++) tp.recv[r][((size_t)(launch & 1u) * tp.n + tp.rank) * H + k] = v;
            }
            break;
        }
        /* the residual stream starts as the embedding row: each block
         * writes its share (first read after two grid barriers) */
        const uint16_t *e = s.embed + (int64_t)token[b] * H;
        for (int k = h0 + (int)threadIdx.x; k < h1; k += DS_CONSUMERS * 32)
            s.residual[(int64_t)b * H + k] = rp_bf16_f32(e[k]);
    }
    if constexpr (TP) grid_sync_tp(tp, ws.sync, target, a.grid, tp_base + tp_all, false, nullptr, arrived, [] {});
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
/* f16: x for an e4m3 phase (the f16 mma's operand); lm_head stays bf16 */
#define DS_NORM(first, l_, which, keep, f16)                                                                           \
    if constexpr (NB == 1) {                                                                                           \
        if constexpr (TP)                                                                                              \
            stage_norm_tp<f16>(xs, tp, 2 * (l_) + (which), launch, nw, H, s.eps, red, a.grid);                              \
        else                                                                                                           \
            stage_norm<f16>(xs, s.residual, first ? s.embed + (int64_t)token[0] * H : nullptr, nw, H, s.eps, red,      \
                            keep ? rs : nullptr);                                                                      \
    } else                                                                                                             \
        stage_norm_nb<NB, f16>(xs, xst, nb, s.residual, first ? s.embed : nullptr, token, ds_norm(s, l_, which), H,    \
                               s.eps, red, keep ? rs : nullptr)
#define DS_BF16(src, K, f16)                                                                                           \
    if constexpr (NB == 1)                                                                                             \
        stage_bf16<f16>(xs, src, K);                                                                                   \
    else                                                                                                               \
        stage_bf16_nb<NB, f16>(xs, xst, nb, src, K)
    for (int l = 0; l < L; l++) {
        DS_T(TR_STAGE, DS_NORM(l == 0, l, 0, rs, W8));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK, W8, TP>(a, 4 * l, EPI_BF16, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr, tl, launch));
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
        DS_T(TR_STAGE, DS_BF16(s.attn, q_dim, W8));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK, W8, TP>(a, 4 * l + 1, EPI_RESIDUAL, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl, launch));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        if constexpr (TP)
            DS_T(TR_SYNC, grid_sync_tp(tp, ws.sync, target, a.grid, tp_base + (2u * l + 2u) * tp_all, true, bt, arrived,
                                       [&] { load_nw(nw, ds_norm(s, l, 1), H); }));
        else
            DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                     if constexpr (NB == 1) load_nw(nw, ds_norm(s, l, 1), H);
                 }));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 1] = 0;
        DS_T(TR_STAGE, DS_NORM(false, l, 1, rs, W8));
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK, W8, TP>(a, 4 * l + 2, EPI_SWIGLU, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl, launch));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [] {}));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 2] = 0;
        DS_T(TR_STAGE, DS_BF16(s.act, s.F, false) /* f16 already with W8 */);
        DS_T(TR_GEMV,
             gemv_phase<NB, DYNK, W8, TP>(a, 4 * l + 3, EPI_RESIDUAL, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr,
                                  tl, launch));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 1;
        if constexpr (TP)
            DS_T(TR_SYNC, grid_sync_tp(tp, ws.sync, target, a.grid, tp_base + (2u * l + 3u) * tp_all, true, bt, arrived,
                                       [&] { load_nw(nw, ds_norm(s, l + 1, 0), H); }));
        else
            DS_T(TR_SYNC, grid_sync(ws.sync, target, a.grid, bt, arrived, [&] {
                     if constexpr (NB == 1) load_nw(nw, ds_norm(s, l + 1, 0), H);
                 }));
        if (DYNK && a.apace_all && threadIdx.x == 0) *pace_flag = 0;
        if (blockIdx.x == 0 && threadIdx.x == 0) ws.claim[4 * l + 3] = 0;
    }
    DS_T(TR_STAGE, DS_NORM(false, L, 0, false, false));
    DS_T(TR_GEMV,
         gemv_phase<NB, DYNK, W8, TP>(a, 4 * L, EPI_F32, rs, i, ring, full, empty, xs, part, ucnt, info, pend, tr, tl, launch));
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
        if (PK && __shfl_sync(RP_FULL_MASK, last, 0)) pick_finish(s, ws, nb, a.grid, launch);
    }
}

#endif
