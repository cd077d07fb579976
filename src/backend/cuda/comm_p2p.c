/* The one-shot all-reduce through peer memory, over another communicator
 * (docs/tensor-parallel.md, "A one-shot all-reduce"): vLLM's and
 * TensorRT-LLM's custom all-reduce, for the sums where NCCL's latency is
 * the cost. A decode step at batch 1 on llama3-8b has 65 all-reduces of 16
 * KB; each NCCL one is a kernel of several microseconds of protocol, where
 * one kernel that copies, signals its peers through NVLink and sums their
 * slots needs about one round trip.
 *
 * Only where every rank is a thread of this process (one node: the ranks
 * swap their device pointers in host memory) and every pair of GPUs can
 * address each other's memory; elsewhere the inner communicator (NCCL)
 * stays the only one, which it also is for gathers, barriers and sums
 * larger than the slots or not in 16-byte vectors. Ranks sharing one GPU
 * (the one-GPU harness) use it too: their memory is one device's. */
#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/kernels.h"
#include "dist/comm.h"
#include "util/log.h"

typedef struct p2p_comm {
    rp_comm base;
    rp_comm *inner;
    rp_p2p_args args;
    /* this rank's: two slots, the flags, then the one-kernel decode step's
     * part (step_floats > 0): recv [2][size][step_floats], the residual
     * after sums of each parity [2][step_floats], the picks [size][4]
     * tagged words, its arrival counter */
    uint8_t *region;
    size_t step_floats;
    float *step_recv[RP_P2P_MAX_RANKS];
    unsigned *step_ctr[RP_P2P_MAX_RANKS];
    unsigned long long *step_pick[RP_P2P_MAX_RANKS];
    float *step_res;
    uint32_t *calls;
    int *abort_word; /* host-mapped */
    atomic_int aborted;
} p2p_comm;

static size_t flag_bytes(void) {
    return (size_t)RP_P2P_BLOCKS * RP_P2P_MAX_RANKS * sizeof(uint32_t);
}

static int p2p_all_reduce_sum(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream, rp_err *err) {
    p2p_comm *pc = (p2p_comm *)c;
    const size_t bytes = count * (dtype == RP_COMM_F32 ? 4 : 2);
    /* Every rank must take the same path: the size is the same on all of
     * them, and so is the buffer's alignment, since the ranks' backends
     * allocate the same buffers for shards of the same shapes. */
    if (bytes == 0 || bytes > pc->args.slot_bytes || bytes % 16 || ((uintptr_t)buf & 15))
        return rp_comm_all_reduce_sum(pc->inner, buf, count, dtype, stream, err);
    if (atomic_load(&pc->aborted)) return rp_errf(err, "all-reduce: the tensor-parallel group was aborted");
    const int rc = rp_k_p2p_all_reduce(&pc->args, buf, (int)(bytes / 16), dtype == RP_COMM_BF16, (cudaStream_t)stream);
    return rc ? rp_errf(err, "peer all-reduce: %s", cudaGetErrorString((cudaError_t)rc)) : 0;
}

static int p2p_all_gather(rp_comm *c, const void *send, void *recv, size_t send_count, rp_comm_dtype dtype,
                          void *stream, rp_err *err) {
    return rp_comm_all_gather(((p2p_comm *)c)->inner, send, recv, send_count, dtype, stream, err);
}

static int p2p_barrier(rp_comm *c, void *stream, rp_err *err) {
    return rp_comm_barrier(((p2p_comm *)c)->inner, stream, err);
}

static int p2p_check(rp_comm *c, rp_err *err) {
    p2p_comm *pc = (p2p_comm *)c;
    if (atomic_load(&pc->aborted)) return rp_errf(err, "the tensor-parallel group was aborted");
    return rp_comm_check(pc->inner, err);
}

/* From any thread: a kernel spinning for a peer that never comes reads the
 * word and returns (its buffer is then not summed; the step fails). */
static void p2p_abort(rp_comm *c) {
    p2p_comm *pc = (p2p_comm *)c;
    atomic_store(&pc->aborted, 1);
    *(volatile int *)pc->abort_word = 1;
    rp_comm_abort(pc->inner);
}

static void release(p2p_comm *pc) {
    cudaFree(pc->region);
    cudaFree(pc->calls);
    if (pc->abort_word) cudaFreeHost(pc->abort_word);
}

static void p2p_free(rp_comm *c) {
    p2p_comm *pc = (p2p_comm *)c;
    release(pc);
    rp_comm_free(pc->inner);
    free(pc);
}

static const rp_comm_ops p2p_ops = {.all_reduce_sum = p2p_all_reduce_sum,
                                    .all_gather = p2p_all_gather,
                                    .barrier = p2p_barrier,
                                    .check = p2p_check,
                                    .abort = p2p_abort,
                                    .free = p2p_free};

/* What each rank tells the others (host comm all-gather: 4-byte words). */
typedef struct p2p_info {
    uint64_t slot, flags, step_recv, step_pick, step_ctr;
    int32_t device, ok;
} p2p_info;
#define INFO_WORDS ((int)(sizeof(p2p_info) / 4))

/* 1 when every rank made its part (ok). */
static int all_ok(const p2p_info *all, int n) {
    for (int k = 0; k < n; k++)
        if (!all[k].ok) return 0;
    return 1;
}

/* Whether every pair of the ranks' GPUs can address each other's memory
 * (the same answer on every rank: each asks for every pair). */
static int peers_reachable(const p2p_info *all, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int can = 0;
            if (all[i].device == all[j].device) continue;
            if (cudaDeviceCanAccessPeer(&can, all[i].device, all[j].device) != cudaSuccess || !can) return 0;
        }
    return 1;
}

rp_comm *rp_comm_p2p_new(rp_comm *inner, rp_comm *host, int device, size_t slot_bytes, size_t step_floats,
                         rp_err *err) {
    const int n = host->size, rank = host->rank;
    if (n != inner->size || rank != inner->rank || n > RP_P2P_MAX_RANKS || slot_bytes % 16 || !slot_bytes) {
        rp_errf(err, "peer all-reduce: rank %d of %d over rank %d of %d, %zu-byte slots", rank, n, inner->rank,
                inner->size, slot_bytes);
        return NULL;
    }
    p2p_comm *pc = calloc(1, sizeof *pc);
    p2p_info *all = calloc((size_t)n, sizeof *all);
    if (!pc || !all) {
        free(pc);
        free(all);
        rp_errf(err, "out of memory");
        return NULL;
    }
    p2p_info me = {.device = device, .ok = 0};
    const size_t step_recv = 2 * (size_t)n * step_floats * 4, step_res = 2 * step_floats * 4,
                 step_pick = 32 * (size_t)n, step_off = 2 * slot_bytes + flag_bytes(),
                 region = step_off + step_recv + step_res + step_pick + 256;
    void *abort_dev = NULL;
    if (cudaSetDevice(device) == cudaSuccess && cudaMalloc((void **)&pc->region, region) == cudaSuccess &&
        cudaMemset(pc->region, 0, region) == cudaSuccess &&
        cudaMalloc((void **)&pc->calls, RP_P2P_BLOCKS * sizeof(uint32_t)) == cudaSuccess &&
        cudaMemset(pc->calls, 0, RP_P2P_BLOCKS * sizeof(uint32_t)) == cudaSuccess &&
        cudaHostAlloc((void **)&pc->abort_word, sizeof(int), cudaHostAllocMapped) == cudaSuccess &&
        cudaHostGetDevicePointer(&abort_dev, pc->abort_word, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess) {
        *pc->abort_word = 0;
        me.slot = (uint64_t)(uintptr_t)pc->region;
        me.flags = (uint64_t)(uintptr_t)(pc->region + 2 * slot_bytes);
        me.step_recv = (uint64_t)(uintptr_t)(pc->region + step_off);
        me.step_pick = (uint64_t)(uintptr_t)(pc->region + step_off + step_recv + step_res);
        me.step_ctr = (uint64_t)(uintptr_t)(pc->region + step_off + step_recv + step_res + step_pick);
        pc->step_res = (float *)(pc->region + step_off + step_recv);
        me.ok = 1;
    }
    cudaGetLastError();
    /* every rank learns every rank's addresses, then turns on its access
     * to the other GPUs; a second exchange agrees that all could */
    if (rp_comm_all_gather(host, &me, all, INFO_WORDS, RP_COMM_F32, NULL, err)) goto fail;
    int use = all_ok(all, n) && peers_reachable(all, n);
    for (int k = 0; use && k < n; k++) {
        if (all[k].device == device) continue;
        cudaError_t e = cudaDeviceEnablePeerAccess(all[k].device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else if (e != cudaSuccess) me.ok = 0, cudaGetLastError();
    }
    /* the same addresses again, with each rank's ok after enabling */
    if (rp_comm_all_gather(host, &me, all, INFO_WORDS, RP_COMM_F32, NULL, err)) goto fail;
    use = use && all_ok(all, n);
    if (!use) {
        if (rank == 0)
            rp_log_warn("tensor parallel: the GPUs cannot all reach each other's memory; every all-reduce "
                        "goes through NCCL");
        release(pc);
        free(pc);
        free(all);
        return inner;
    }
    pc->base.ops = &p2p_ops;
    pc->base.rank = rank;
    pc->base.size = n;
    pc->inner = inner;
    for (int k = 0; k < n; k++) {
        pc->args.slot[k] = (uint8_t *)(uintptr_t)all[k].slot;
        pc->args.flags[k] = (uint32_t *)(uintptr_t)all[k].flags;
        pc->step_recv[k] = (float *)(uintptr_t)all[k].step_recv;
        pc->step_ctr[k] = (unsigned *)(uintptr_t)all[k].step_ctr;
        pc->step_pick[k] = (unsigned long long *)(uintptr_t)all[k].step_pick;
    }
    pc->step_floats = step_floats;
    pc->args.calls = pc->calls;
    pc->args.abort = (const int *)abort_dev;
    pc->args.slot_bytes = slot_bytes;
    pc->args.rank = rank;
    pc->args.size = n;
    atomic_init(&pc->aborted, 0);
    free(all);
    return &pc->base;
fail:
    release(pc);
    free(pc);
    free(all);
    return NULL;
}

int rp_comm_p2p_decode_step(rp_comm *c, int H, rp_decode_step_tp *out) {
    if (!c || c->ops != &p2p_ops) return -1;
    p2p_comm *pc = (p2p_comm *)c;
    if (H <= 0 || (size_t)H > pc->step_floats || c->size > RP_DECODE_STEP_TP_MAX) return -1;
    *out = (rp_decode_step_tp){.n = c->size, .rank = c->rank, .abort = pc->args.abort};
    for (int k = 0; k < c->size; k++) {
        out->recv[k] = pc->step_recv[k];
        out->ctr[k] = pc->step_ctr[k];
        out->pick[k] = pc->step_pick[k];
    }
    /* the residual's two parities, H floats apart */
    out->res[0] = pc->step_res;
    out->res[1] = pc->step_res + H;
    return 0;
}
