/* The tensor-parallel group's NCCL communicator: one per GPU (one per GPU
 * thread, docs/tensor-parallel.md), made from the unique id node 0 creates
 * and the bootstrap hands out (dist/bootstrap.h).
 *
 * The collectives are enqueued on the caller's stream and do nothing else
 * (no allocation, no synchronisation), so a decode step's graph can
 * capture them like its kernels. NVLink multicast (NVLS) stays off:
 * NCCL_NVLS_ENABLE=0 is set in the process before the first NCCL call
 * unless the user set it, and nothing here creates multicast objects.
 *
 * Built only with CUDA and NCCL (CMakeLists.txt: into replay_core). */
#ifndef RP_DIST_NCCL_COMM_H
#define RP_DIST_NCCL_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dist/bootstrap.h"
#include "util/err.h"

typedef enum rp_nccl_dtype { RP_NCCL_BF16 = 0, RP_NCCL_F32 } rp_nccl_dtype;

typedef struct rp_nccl_comm rp_nccl_comm;

/* Node 0 only: a fresh unique id for the group. */
int rp_nccl_unique_id(uint8_t id[RP_BS_UNIQUE_ID_BYTES], rp_err *err);

/* Rank `rank` of `nranks` on CUDA device `device` (made current on the
 * calling thread): waits until every rank of the group has called it, at
 * most timeout_ms (<= 0: no limit), and gives up at once when *cancel
 * (may be NULL) becomes nonzero. The communicator is non-blocking: no call
 * of this file waits inside NCCL, so abort, from another thread, ends
 * whatever waits. */
rp_nccl_comm *rp_nccl_comm_new(const uint8_t id[RP_BS_UNIQUE_ID_BYTES], int nranks, int rank, int device,
                               int timeout_ms, const atomic_int *cancel, rp_err *err);

/* recv[i] = the sum over ranks of send[i], i < count (send == recv: in
 * place). */
int rp_nccl_all_reduce_sum(rp_nccl_comm *c, const void *send, void *recv, size_t count, rp_nccl_dtype dtype,
                           cudaStream_t stream, rp_err *err);

/* recv = the ranks' send buffers one after the other, rank order
 * (send_count elements each; recv holds nranks * send_count). */
int rp_nccl_all_gather(rp_nccl_comm *c, const void *send, void *recv, size_t send_count, rp_nccl_dtype dtype,
                       cudaStream_t stream, rp_err *err);

/* An error a collective hit after it was enqueued (a peer gone, a network
 * failure): 0 while there is none. */
int rp_nccl_check(rp_nccl_comm *c, rp_err *err);

int rp_nccl_comm_rank(const rp_nccl_comm *c);
int rp_nccl_comm_size(const rp_nccl_comm *c);

/* Ends the communicator now (ncclCommAbort): collectives in flight on any
 * rank fail instead of waiting for this one. From any thread, at any time
 * (the watchdog's); later calls on it fail. Free it as usual. */
void rp_nccl_comm_abort(rp_nccl_comm *c);

/* Waits for the communicator's work to finish and frees it. */
void rp_nccl_comm_free(rp_nccl_comm *c);

#endif
