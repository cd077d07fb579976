/* The trace build (cmake -DREPLAY_DECODE_STEP_TRACE=ON): where a block's
 * time goes, per kind of work, per barrier and per ring piece
 * (kernels.h's RP_DECODE_STEP_TRACE_*). In every other build DS_TRACE is
 * false and the kernel holds none of this code: the trace's clock reads and
 * stores alone cost the step 0.4-2.7%. */
#ifndef RP_DECODE_STEP_TRACE_CUH
#define RP_DECODE_STEP_TRACE_CUH

#include "layout.cuh"

#ifdef REPLAY_DECODE_STEP_TRACE
#define DS_TRACE true
#else
#define DS_TRACE false
#endif

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

#endif
