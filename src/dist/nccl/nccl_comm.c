/* The NCCL communicator wrapper (nccl_comm.h): every NCCL and CUDA return
 * code checked and turned into an rp_err naming the call. */
#include "dist/nccl/nccl_comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

_Static_assert(RP_BS_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the bootstrap carries NCCL's unique id as it is");

struct rp_nccl_comm {
    ncclComm_t comm;
    int rank, nranks, device;
};

#define NCCL_TRY(call, comm, err)                                                                          \
    do {                                                                                                   \
        ncclResult_t r_ = (call);                                                                          \
        if (r_ != ncclSuccess)                                                                             \
            return rp_errf((err), "%s failed: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(comm)); \
    } while (0)

#define CUDA_TRY(call, err)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return rp_errf((err), "%s failed: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

/* NVLink multicast off before NCCL reads its environment (once per
 * process, whichever GPU thread gets here first); a value the user set
 * stays. */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static void set_env(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
}

static ncclDataType_t nccl_type(rp_nccl_dtype t) {
    return t == RP_NCCL_F32 ? ncclFloat32 : ncclBfloat16;
}

int rp_nccl_unique_id(uint8_t id[RP_BS_UNIQUE_ID_BYTES], rp_err *err) {
    pthread_once(&env_once, set_env);
    ncclUniqueId uid;
    NCCL_TRY(ncclGetUniqueId(&uid), NULL, err);
    memcpy(id, uid.internal, RP_BS_UNIQUE_ID_BYTES);
    return 0;
}

static int comm_init(rp_nccl_comm *c, const uint8_t *id, rp_err *err) {
    pthread_once(&env_once, set_env);
    CUDA_TRY(cudaSetDevice(c->device), err);
    ncclUniqueId uid;
    memcpy(uid.internal, id, RP_BS_UNIQUE_ID_BYTES);
    NCCL_TRY(ncclCommInitRank(&c->comm, c->nranks, uid, c->rank), NULL, err);
    return 0;
}

rp_nccl_comm *rp_nccl_comm_new(const uint8_t id[RP_BS_UNIQUE_ID_BYTES], int nranks, int rank, int device,
                               rp_err *err) {
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        rp_errf(err, "NCCL: rank %d of %d", rank, nranks);
        return NULL;
    }
    rp_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    c->rank = rank, c->nranks = nranks, c->device = device;
    if (comm_init(c, id, err)) {
        rp_err_wrap(err, "NCCL rank %d of %d on GPU %d", rank, nranks, device);
        free(c);
        return NULL;
    }
    return c;
}

int rp_nccl_all_reduce_sum(rp_nccl_comm *c, const void *send, void *recv, size_t count, rp_nccl_dtype dtype,
                           cudaStream_t stream, rp_err *err) {
    NCCL_TRY(ncclAllReduce(send, recv, count, nccl_type(dtype), ncclSum, c->comm, stream), c->comm, err);
    return 0;
}

int rp_nccl_all_gather(rp_nccl_comm *c, const void *send, void *recv, size_t send_count, rp_nccl_dtype dtype,
                       cudaStream_t stream, rp_err *err) {
    NCCL_TRY(ncclAllGather(send, recv, send_count, nccl_type(dtype), c->comm, stream), c->comm, err);
    return 0;
}

int rp_nccl_check(rp_nccl_comm *c, rp_err *err) {
    ncclResult_t async = ncclSuccess;
    NCCL_TRY(ncclCommGetAsyncError(c->comm, &async), c->comm, err);
    if (async != ncclSuccess && async != ncclInProgress)
        return rp_errf(err, "NCCL rank %d of %d: %s (%s)", c->rank, c->nranks, ncclGetErrorString(async),
                       ncclGetLastError(c->comm));
    return 0;
}

int rp_nccl_comm_rank(const rp_nccl_comm *c) {
    return c->rank;
}

int rp_nccl_comm_size(const rp_nccl_comm *c) {
    return c->nranks;
}

void rp_nccl_comm_abort(rp_nccl_comm *c) {
    if (!c || !c->comm) return;
    cudaSetDevice(c->device);
    ncclCommAbort(c->comm);
    c->comm = NULL;
}

void rp_nccl_comm_free(rp_nccl_comm *c) {
    if (!c) return;
    if (c->comm) {
        /* a healthy communicator finishes its pending work first; one that
         * hit an error is aborted, since waiting on a lost peer never ends */
        cudaSetDevice(c->device);
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &async) == ncclSuccess && async == ncclSuccess &&
            ncclCommFinalize(c->comm) == ncclSuccess)
            ncclCommDestroy(c->comm);
        else
            ncclCommAbort(c->comm);
    }
    free(c);
}
