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

/* Under tensor parallelism, the end of a phase whose rows are summed over
 * the ranks (o, down): its epilogues sent the partial rows to every rank as
 * tagged words (rp_decode_step_tp), which the next staging waits for word
 * by word (stage_norm_tp), so no block waits here and no fence publishes
 * them (a barrier over every rank's blocks, a system-scope fence and
 * counters on every GPU, cost 2.5-3.8 us of release a sum on two H200s:
 * bench/RESULTS.md, issue 42). The consumers finish the phase (x is staged
 * next), and the block still counts its arrival on the local counter, as
 * grid_sync does, so that the barriers after it and the producer's count
 * of arrivals (arrived: five a layer) stay as they are. bt (the trace
 * build): arrival and release both now; the wait for the ranks' rows is in
 * the staging's time. */
__device__ __forceinline__ void tp_arrive(unsigned *ctr, unsigned &target, int grid, uint64_t *bt,
                                          volatile int *arrived) {
    cbar();
    if (threadIdx.x == 0) {
        target += (unsigned)grid;
        asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        if (arrived) *arrived = (int)(target / (unsigned)grid);
        if (bt) {
            const unsigned k = target / (unsigned)grid - 1;
            const uint64_t t = ds_now();
            bt[RP_DECODE_STEP_TRACE_FENCE - 16 + k] = t;
            bt[2 * k] = t;
            bt[2 * k + 1] = t;
        }
    }
}

#endif
