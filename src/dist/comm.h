/* The tensor-parallel group's communicator, as the backends see it: the
 * sums and gathers between a model's shards (docs/tensor-parallel.md).
 *
 * Two implementations behind one table of operations:
 *  - local (comm_local.c): the ranks are threads of this process working on
 *    host memory, meeting at a barrier; the CPU backend and the CPU tests
 *    run tensor parallelism on it;
 *  - NCCL (nccl/comm_nccl.c): one communicator per GPU thread; the
 *    collectives are enqueued on the caller's CUDA stream (passed as
 *    `stream`, a cudaStream_t) and return at once, so a decode step's graph
 *    captures them with its kernels.
 * The interface names no CUDA type, so backend.h can carry it. Every rank
 * makes the same calls in the same order with the same counts: that is
 * what makes a collective meet.
 *
 * Faults: a rank that is gone never arrives at a collective, and the
 * others would wait for it forever. check and abort exist for whoever
 * watches the ranks (the tensor-parallel backend's watchdog, on another
 * thread than the rank's): check reports an error the communicator met on
 * its own (NCCL: a peer's connection lost), abort ends every collective in
 * flight or to come on this rank with an error, so that a rank thread
 * blocked in one returns. Both may be called from any thread at any time. */
#ifndef RP_DIST_COMM_H
#define RP_DIST_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef enum rp_comm_dtype { RP_COMM_F32 = 0, RP_COMM_BF16 } rp_comm_dtype;

typedef struct rp_comm rp_comm;

typedef struct rp_comm_ops {
    /* buf[i] = the sum over ranks of buf[i], i < count, in place */
    int (*all_reduce_sum)(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream, rp_err *err);
    /* recv = every rank's send (send_count elements each), in rank order */
    int (*all_gather)(rp_comm *c, const void *send, void *recv, size_t send_count, rp_comm_dtype dtype,
                      void *stream, rp_err *err);
    /* every rank has reached this point (host side; NCCL: its stream's
     * work so far is done on every rank) */
    int (*barrier)(rp_comm *c, void *stream, rp_err *err);
    /* An error the communicator met by itself since it was made (0: none;
     * after abort: an error saying so). */
    int (*check)(rp_comm *c, rp_err *err);
    /* A rank that fails between collectives calls this so that the others,
     * waiting for it in a collective, fail too instead of waiting forever;
     * the watchdog calls it on every rank when a step does not finish. */
    void (*abort)(rp_comm *c);
    void (*free)(rp_comm *c);
} rp_comm_ops;

struct rp_comm {
    const rp_comm_ops *ops;
    int rank, size;
};

static inline int rp_comm_all_reduce_sum(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream,
                                         rp_err *err) {
    return c->ops->all_reduce_sum(c, buf, count, dtype, stream, err);
}
static inline int rp_comm_all_gather(rp_comm *c, const void *send, void *recv, size_t send_count,
                                     rp_comm_dtype dtype, void *stream, rp_err *err) {
    return c->ops->all_gather(c, send, recv, send_count, dtype, stream, err);
}
static inline int rp_comm_barrier(rp_comm *c, void *stream, rp_err *err) {
    return c->ops->barrier(c, stream, err);
}
static inline int rp_comm_check(rp_comm *c, rp_err *err) {
    return c ? c->ops->check(c, err) : 0;
}
static inline void rp_comm_abort(rp_comm *c) {
    if (c) c->ops->abort(c);
}
static inline void rp_comm_free(rp_comm *c) {
    if (c) c->ops->free(c);
}

/* ---- local: threads of one process ------------------------------------- */

/* What the `size` local communicators of one group share (the meeting
 * point); freed after every communicator made from it. */
typedef struct rp_comm_local_group rp_comm_local_group;
rp_comm_local_group *rp_comm_local_group_new(int size, rp_err *err);
void rp_comm_local_group_free(rp_comm_local_group *g);
/* Rank `rank` of the group; each rank's calls come from its own thread. */
rp_comm *rp_comm_local_new(rp_comm_local_group *g, int rank, rp_err *err);

/* ---- NCCL: one GPU per rank ---------------------------------------------- */

#define RP_COMM_UNIQUE_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES, as the bootstrap carries it */

/* 1 when this build has NCCL (CUDA builds where it was found). */
int rp_comm_nccl_available(void);
/* Node 0: a fresh unique id for the group. */
int rp_comm_nccl_unique_id(uint8_t id[RP_COMM_UNIQUE_ID_BYTES], rp_err *err);
/* Rank `rank` of `size` on CUDA device `device` (made current on the
 * calling thread, which blocks until every rank has called it, or fails
 * after timeout_ms, or at once when *cancel becomes nonzero: another rank
 * of this process failed). */
rp_comm *rp_comm_nccl_new(const uint8_t id[RP_COMM_UNIQUE_ID_BYTES], int size, int rank, int device, int timeout_ms,
                          const atomic_int *cancel, rp_err *err);

#endif
