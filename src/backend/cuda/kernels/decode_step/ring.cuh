/* The step's schedule, walked the same way by the producer and the
 * consumers (phase matrices, static and dynamic units, a block's static
 * pieces), and the producer that streams those pieces into the ring of
 * shared-memory stages. */
#ifndef RP_DECODE_STEP_RING_CUH
#define RP_DECODE_STEP_RING_CUH

#include "sync.cuh"
#include "trace.cuh"

/* ---- the step's schedule: the same walk for producer and consumers ------- */

struct ds_mat {
    const uint8_t *w;   /* bf16 weights, or e4m3 bytes (eb 1) */
    int N;              /* output rows (gate_up: F, one per gate/up pair) */
    int K;
    int runs;           /* 1, or 2 (gate rows, then up rows at run_off) */
    int run_off;        /* rows between run 0 and run 1 */
    int eb;             /* bytes per weight: 2, or 1 for e4m3 */
    const float *scale; /* e4m3: each row's scale (run 1's at run_off); else NULL */
};

/* W8: the kernel built for e4m3 layer matrices (rp_decode_step.fp8); the
 * bf16 kernel has no e4m3 code at all (compiled in but unused, it cost the
 * bf16 step 1-2%: bench/RESULTS.md, 2026-11-29). */
template <bool W8> __device__ __forceinline__ ds_mat phase_mat(const rp_decode_step &s, int p) {
    const int L = s.num_layers;
    if (p == 4 * L) return ds_mat{reinterpret_cast<const uint8_t *>(s.lm_head), s.V, s.H, 1, 0, 2, nullptr};
    const rp_decode_layer *ly = &s.layers[p >> 2];
    const int q_dim = s.nh * s.hd, qkv = q_dim + 2 * s.nkv * s.hd, eb = W8 ? 1 : 2;
    switch (p & 3) {
    case 0: return ds_mat{static_cast<const uint8_t *>(ly->wqkv), qkv, s.H, 1, 0, eb, W8 ? ly->sqkv : nullptr};
    case 1: return ds_mat{static_cast<const uint8_t *>(ly->wo), s.H, q_dim, 1, 0, eb, W8 ? ly->so : nullptr};
    case 2: return ds_mat{static_cast<const uint8_t *>(ly->wgu), s.F, s.H, 2, s.F, eb, W8 ? ly->sgu : nullptr};
    default: return ds_mat{static_cast<const uint8_t *>(ly->wdown), s.H, s.F, 1, 0, eb, W8 ? ly->sdown : nullptr};
    }
}

/* k per ring piece of matrix m: a.kc is the bf16 width, and a piece's
 * bytes stay the same for e4m3 (twice the k: the stage's rows hold the
 * same bytes, a step of a row stays 64 bytes). */
__device__ __forceinline__ int ds_kc(const ds_args &a, const ds_mat &m) { return m.eb == 1 ? 2 * a.kc : a.kc; }

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

template <bool W8> __device__ __forceinline__ void walk_phase(const ds_args &a, ds_walk &w) {
    for (const int NP = 4 * a.s.num_layers + 1; w.p < NP; w.p++) {
        w.m = phase_mat<W8>(a.s, w.p);
        const int S = static_units(w.m.N / DS_ROWS, a);
        w.u = (int)((int64_t)blockIdx.x * S / a.grid), w.u1 = (int)((int64_t)(blockIdx.x + 1) * S / a.grid);
        w.r = w.kc = 0;
        if (w.u < w.u1) return;
    }
}

template <bool W8> __device__ __forceinline__ void walk_next(const ds_args &a, ds_walk &w) {
    if ((w.kc += ds_kc(a, w.m)) < w.m.K) return;
    w.kc = 0;
    if (++w.r < w.m.runs) return;
    w.r = 0;
    if (++w.u < w.u1) return;
    w.p++;
    walk_phase<W8>(a, w);
}

template <bool W8> __device__ __forceinline__ void prefetch_piece(const ds_args &a, const ds_walk &w) {
    const unsigned row_bytes = (unsigned)(min(ds_kc(a, w.m), w.m.K - w.kc) * w.m.eb);
    const uint8_t *src =
        w.m.w + (((int64_t)w.r * w.m.run_off + (int64_t)w.u * DS_ROWS) * w.m.K + w.kc) * w.m.eb;
    for (int j = 0; j < DS_ROWS; j++)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + (int64_t)j * w.m.K * w.m.eb),
                     "r"(row_bytes)
                     : "memory");
}

/* Up to n more of this block's static pieces into L2, at most `ahead`
 * past the n_static the ring has taken (the walk first skips what the
 * ring took meanwhile). */
template <bool W8> __device__ __forceinline__ void prefetch_ahead(const ds_args &a, ds_walk &pw, int &n_walked, int n_static, int ahead,
                                               int n) {
    const int NP = 4 * a.s.num_layers + 1;
    for (; n_walked < n_static && pw.p < NP; n_walked++) walk_next<W8>(a, pw);
    for (; n > 0 && n_walked < n_static + ahead && pw.p < NP; n--, n_walked++) {
        prefetch_piece<W8>(a, pw);
        walk_next<W8>(a, pw);
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
template <int NB, bool DYNK, bool W8, bool TP>
__device__ void produce(const ds_args &a, const ds_ws &ws, uint8_t *ring, uint64_t *full, uint64_t *empty,
                        ds_info *info, volatile int *pend, volatile int *pace_flag, volatile int *arrived) {
    constexpr bool TRACE = DS_TRACE && NB == 1; /* the trace build traces one sequence */
    uint64_t policy, waited = 0;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const int NP = 4 * a.s.num_layers + 1, st = a.stages;
    /* one sequence on one GPU: the stage's size a constant (ds_make_args) */
    constexpr bool fixed = NB == 1 && !TP;
    const int stage_b = fixed ? DS_STAGE : a.stage_bytes, row_b = fixed ? DS_ROW_STRIDE : a.row_stride;
    int i = 0, useq = 0, n_static = 0, n_walked = 0;
    bool tail = false;
    ds_walk pw;
    pw.p = 0;
    walk_phase<W8>(a, pw);
    const uint8_t *w_next = phase_mat<W8>(a.s, 0).w;
    for (int p = 0; p < NP; p++) {
        ds_mat m = phase_mat<W8>(a.s, p);
        /* the matrix's address was loaded a phase ahead: the layer table is
         * an L2 round trip away (every grid barrier's acquire spin
         * invalidates L1), which the phase's first copy would wait for */
        m.w = w_next;
        if (p + 1 < NP) w_next = phase_mat<W8>(a.s, p + 1).w;
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
                const uint8_t *src = m.w + ((int64_t)r * m.run_off + (int64_t)u * DS_ROWS) * m.K * m.eb;
                const int kcm = ds_kc(a, m);
                for (int kc = 0; kc < m.K; kc += kcm, i++) {
                    const unsigned row_bytes = (unsigned)(min(kcm, m.K - kc) * m.eb);
                    const int slot = i % st;
                    if (i >= st) {
                        const uint64_t t0 = TRACE ? ds_now() : 0;
                        const unsigned par = (unsigned)((i / st) - 1) & 1u;
                        if (n_walked < n_static + a.prefetch_now && !mbar_test(&empty[slot], par))
                            prefetch_ahead<W8>(a, pw, n_walked, n_static, a.prefetch_now, a.prefetch_now);
                        while (!mbar_try(&empty[slot], par)) prefetch_ahead<W8>(a, pw, n_walked, n_static, a.prefetch, 1);
                        if (TRACE) waited += ds_now() - t0;
                    }
                    /* A barrier's release and attention's loads are latency-bound, and a
                     * ring refill issued all at once (a phase's last stages free together)
                     * queues ahead of them in L2; spread out, it lands in time for the next
                     * phase (qwen3-4b 3.29 -> 3.17 ms, llama3-8b 5.51 -> 5.37; only in the
                     * attention window: 3.26 / 5.45; bench/RESULTS.md). */
                    if (DYNK && a.apace_ns && *pace_flag) __nanosleep(a.apace_ns);
                    info[slot] = ds_info{u, first, useq, 0};
                    /* releases the info store with the arrival */
                    mbar_expect_tx(&full[slot], DS_ROWS * row_bytes);
                    /* one copy per row: the rows land apart, see DS_ROW_STRIDE */
                    for (int j = 0; j < DS_ROWS; j++)
                        bulk_copy(ring + (size_t)slot * stage_b + j * row_b, src + ((int64_t)j * m.K + kc) * m.eb,
                                  row_bytes, &full[slot], policy);
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

#endif
