/* The NCCL communicator as an rp_comm (comm.h): what the CUDA backend's
 * shards call to sum and gather, enqueued on the step's stream (and so
 * captured into its graphs). A thin layer over nccl_comm.c, which checks
 * every NCCL and CUDA return code. Built only where NCCL is (CMakeLists.txt
 * defines REPLAY_HAVE_NCCL); comm_nccl_stub.c answers otherwise. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "dist/comm.h"
#include "dist/nccl/nccl_comm.h"

_Static_assert(RP_COMM_UNIQUE_ID_BYTES == RP_BS_UNIQUE_ID_BYTES, "one unique id size everywhere");

typedef struct nccl_rp_comm {
    rp_comm base;
    rp_nccl_comm *nc;
    int device;
    float *d_one; /* the barrier's all-reduce: one float on the device */
} nccl_rp_comm;

static rp_nccl_dtype nccl_dtype(rp_comm_dtype t) {
    return t == RP_COMM_F32 ? RP_NCCL_F32 : RP_NCCL_BF16;
}

static int n_all_reduce_sum(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream, rp_err *err) {
    return rp_nccl_all_reduce_sum(((nccl_rp_comm *)c)->nc, buf, buf, count, nccl_dtype(dtype), (cudaStream_t)stream,
                                  err);
}

static int n_all_gather(rp_comm *c, const void *send, void *recv, size_t send_count, rp_comm_dtype dtype,
                        void *stream, rp_err *err) {
    return rp_nccl_all_gather(((nccl_rp_comm *)c)->nc, send, recv, send_count, nccl_dtype(dtype),
                              (cudaStream_t)stream, err);
}

/* An all-reduce of one float meets every rank; then the stream is drained,
 * so the host knows every rank got there. Not for captured work. */
static int n_barrier(rp_comm *c, void *stream, rp_err *err) {
    nccl_rp_comm *n = (nccl_rp_comm *)c;
    if (rp_nccl_all_reduce_sum(n->nc, n->d_one, n->d_one, 1, RP_NCCL_F32, (cudaStream_t)stream, err)) return RP_ERR;
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) return rp_errf(err, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
    return rp_nccl_check(n->nc, err);
}

/* A rank failed: its collectives will never come, so this rank's (in
 * flight or to come) must not wait for them. */
static void n_abort(rp_comm *c) {
    rp_nccl_comm_abort(((nccl_rp_comm *)c)->nc);
}

static int n_check(rp_comm *c, rp_err *err) {
    return rp_nccl_check(((nccl_rp_comm *)c)->nc, err);
}

static void n_free(rp_comm *c) {
    nccl_rp_comm *n = (nccl_rp_comm *)c;
    rp_nccl_comm_free(n->nc);
    if (n->d_one) cudaFree(n->d_one);
    free(n);
}

static const rp_comm_ops nccl_ops = {.all_reduce_sum = n_all_reduce_sum,
                                     .all_gather = n_all_gather,
                                     .barrier = n_barrier,
                                     .check = n_check,
                                     .abort = n_abort,
                                     .free = n_free};

int rp_comm_nccl_available(void) {
    return 1;
}

int rp_comm_nccl_unique_id(uint8_t id[RP_COMM_UNIQUE_ID_BYTES], rp_err *err) {
    return rp_nccl_unique_id(id, err);
}

rp_comm *rp_comm_nccl_new(const uint8_t id[RP_COMM_UNIQUE_ID_BYTES], int size, int rank, int device, int timeout_ms,
                          const atomic_int *cancel, rp_err *err) {
    nccl_rp_comm *c = calloc(1, sizeof *c);
    if (!c) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    c->nc = rp_nccl_comm_new(id, size, rank, device, timeout_ms, cancel, err);
    if (!c->nc) {
        free(c);
        return NULL;
    }
    cudaError_t e = cudaMalloc((void **)&c->d_one, sizeof(float));
    if (e != cudaSuccess) {
        rp_nccl_comm_free(c->nc);
        free(c);
        rp_errf(err, "cudaMalloc: %s", cudaGetErrorString(e));
        return NULL;
    }
    c->base.ops = &nccl_ops;
    c->base.rank = rank;
    c->base.size = size;
    c->device = device;
    return &c->base;
}
