/* The grid barrier between phases: a counter with release/acquire at gpu
 * scope (docs/memory-model.md), split in two halves so that loads no block
 * writes can run between arrival and wait. */
#ifndef RP_DECODE_STEP_BARRIER_CUH
#define RP_DECODE_STEP_BARRIER_CUH

#include "sync.cuh"
#include "trace.cuh"

/* Every consumer of every block has arrived (release of this block's
 * writes, acquire of everyone's), in two halves: grid_arrive, then
 * grid_wait, with loads between them that no block's writes in this step
 * feed (grid_sync's between): after qkv, the first cached K/V rows
 * (first_kv) and the q/k norm weights (load_qkw), a barrier earlier than
 * attention would load them; after attention, the next layer's K/V
 * prefetch, whose page-table loads would be an L2 round trip on the critical
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

/* Under tensor parallelism, the barrier after a phase whose rows are
 * summed over the ranks (the embedding, o, down: rp_decode_step_tp): every
 * block of every rank arrives at every rank's counter, after a release at
 * system scope (its partial rows went to the other GPUs' memory), and waits
 * on its own GPU's counter for all ranks' blocks (tp_target: every sum of
 * every earlier launch and of this one counted, wrapping). With `local`
 * (the o and down barriers) the local counter is counted as by grid_sync,
 * so the barriers after it and the producer's count of arrivals (arrived:
 * five a layer) stay as they are; the embedding's barrier, which the
 * kernel has only under tensor parallelism, counts neither. bt (the trace
 * build; local barriers only): as grid_sync's, its release counting every
 * rank's blocks. */
template <class F>
__device__ __forceinline__ void grid_sync_tp(const rp_decode_step_tp &tp, unsigned *ctr, unsigned &target, int grid,
                                             unsigned tp_target, bool local, uint64_t *bt, volatile int *arrived,
                                             F &&between) {
    cbar();
    uint64_t t0 = 0;
    if (threadIdx.x == 0) {
        if (bt) t0 = ds_now();
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        if (local) {
            target += (unsigned)grid;
            if (bt) bt[RP_DECODE_STEP_TRACE_FENCE - 16 + target / (unsigned)grid - 1] = ds_now();
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        }
        for (int k = 0; k < tp.n; k++) asm volatile("red.relaxed.sys.global.add.u32 [%0], 1;" ::"l"(tp.ctr[k]) : "memory");
        if (local && arrived) *arrived = (int)(target / (unsigned)grid);
    }
    between();
    if (threadIdx.x == 0) {
        unsigned v;
        for (unsigned spins = 0;; spins++) {
            asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(tp.ctr[tp.rank]) : "memory");
            if ((int)(v - tp_target) >= 0 || ((spins & 255) == 255 && *(const volatile int *)tp.abort)) break;
        }
        if (bt && local) {
            const unsigned k = target / (unsigned)grid - 1;
            bt[2 * k] = t0;
            bt[2 * k + 1] = ds_now();
        }
    }
    cbar();
}

#endif
