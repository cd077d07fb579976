/* The NCCL communicator wrapper (nccl_comm.h): every NCCL and CUDA return
 * code checked and turned into an rp_err naming the call. */
#include "dist/nccl/nccl_comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

_Static_assert(RP_BS_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the bootstrap carries NCCL's unique id as it is");

/* The communicator is non-blocking (config.blocking = 0): creating it and
 * enqueueing a collective return at once, possibly with ncclInProgress,
 * and this file polls ncclCommGetAsyncError until the call is done. So no
 * thread ever sits inside NCCL waiting for a peer that may be gone: the
 * poll gives up at a deadline or when the communicator was aborted, and a
 * watchdog thread can abort it meanwhile (NCCL's own answer to a lost
 * peer: ncclCommAbort, after which nothing of the communicator waits).
 * mu serialises every NCCL call on the communicator, since the watchdog's
 * check and abort come from another thread than the rank's collectives. */
struct rp_nccl_comm {
    ncclComm_t comm;
    int rank, nranks, device;
    pthread_mutex_t mu;
    int aborted; /* under mu */
};

/* How long a healthy communicator may take to finish its work when freed
 * (every rank frees at once, at the end of a run): past it, it is aborted. */
#define FINALIZE_TIMEOUT_MS 30000

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Between two polls of a call in progress: short against a step, long
 * enough not to keep a core busy while a peer connects. */
static void poll_pause(void) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

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

/* Waits, polling, until the communicator's call in progress is done: 0,
 * or an error (the call failed, the deadline passed, *cancel was set, the
 * communicator was aborted). deadline < 0: none. Called without mu held. */
static int wait_done(rp_nccl_comm *c, const char *what, int64_t deadline, int timeout_ms, const atomic_int *cancel,
                     rp_err *err) {
    for (;;) {
        pthread_mutex_lock(&c->mu);
        ncclResult_t state = ncclSuccess, r = ncclSuccess;
        if (!c->aborted) r = ncclCommGetAsyncError(c->comm, &state);
        const int aborted = c->aborted;
        pthread_mutex_unlock(&c->mu);
        if (aborted) return rp_errf(err, "%s: the communicator was aborted", what);
        if (r != ncclSuccess)
            return rp_errf(err, "%s: ncclCommGetAsyncError failed: %s", what, ncclGetErrorString(r));
        if (state == ncclSuccess) return 0;
        if (state != ncclInProgress)
            return rp_errf(err, "%s: %s (%s)", what, ncclGetErrorString(state), ncclGetLastError(c->comm));
        if (cancel && atomic_load(cancel)) return rp_errf(err, "%s: cancelled (another rank failed)", what);
        if (deadline >= 0 && now_ms() >= deadline)
            return rp_errf(err, "%s: not done within %.1f s (a rank that never came?)", what, timeout_ms / 1e3);
        poll_pause();
    }
}

/* A collective's enqueue: done at once, or in progress until wait_done. */
static int enqueued(rp_nccl_comm *c, ncclResult_t r, const char *what, rp_err *err) {
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress)
        return rp_errf(err, "%s failed: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(c->comm));
    return wait_done(c, what, -1, 0, NULL, err);
}

static int comm_init(rp_nccl_comm *c, const uint8_t *id, int timeout_ms, const atomic_int *cancel, rp_err *err) {
    pthread_once(&env_once, set_env);
    CUDA_TRY(cudaSetDevice(c->device), err);
    ncclUniqueId uid;
    memcpy(uid.internal, id, RP_BS_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const int64_t deadline = timeout_ms > 0 ? now_ms() + timeout_ms : -1;
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, c->nranks, uid, c->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (c->comm) ncclCommAbort(c->comm);
        c->comm = NULL;
        return rp_errf(err, "ncclCommInitRankConfig failed: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    if (wait_done(c, "ncclCommInitRankConfig", deadline, timeout_ms, cancel, err)) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
        return RP_ERR;
    }
    return 0;
}

rp_nccl_comm *rp_nccl_comm_new(const uint8_t id[RP_BS_UNIQUE_ID_BYTES], int nranks, int rank, int device,
                               int timeout_ms, const atomic_int *cancel, rp_err *err) {
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
    pthread_mutex_init(&c->mu, NULL);
    if (comm_init(c, id, timeout_ms, cancel, err)) {
        rp_err_wrap(err, "NCCL rank %d of %d on GPU %d", rank, nranks, device);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    return c;
}

int rp_nccl_all_reduce_sum(rp_nccl_comm *c, const void *send, void *recv, size_t count, rp_nccl_dtype dtype,
                           cudaStream_t stream, rp_err *err) {
    pthread_mutex_lock(&c->mu);
    const ncclResult_t r =
        c->aborted ? ncclInvalidUsage : ncclAllReduce(send, recv, count, nccl_type(dtype), ncclSum, c->comm, stream);
    const int aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (aborted) return rp_errf(err, "ncclAllReduce: the communicator was aborted");
    return enqueued(c, r, "ncclAllReduce", err);
}

int rp_nccl_all_gather(rp_nccl_comm *c, const void *send, void *recv, size_t send_count, rp_nccl_dtype dtype,
                       cudaStream_t stream, rp_err *err) {
    pthread_mutex_lock(&c->mu);
    const ncclResult_t r =
        c->aborted ? ncclInvalidUsage : ncclAllGather(send, recv, send_count, nccl_type(dtype), c->comm, stream);
    const int aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (aborted) return rp_errf(err, "ncclAllGather: the communicator was aborted");
    return enqueued(c, r, "ncclAllGather", err);
}

int rp_nccl_check(rp_nccl_comm *c, rp_err *err) {
    pthread_mutex_lock(&c->mu);
    ncclResult_t state = ncclSuccess, r = ncclSuccess;
    if (!c->aborted) r = ncclCommGetAsyncError(c->comm, &state);
    const int aborted = c->aborted;
    pthread_mutex_unlock(&c->mu);
    if (aborted) return rp_errf(err, "NCCL rank %d of %d: the communicator was aborted", c->rank, c->nranks);
    if (r != ncclSuccess) return rp_errf(err, "ncclCommGetAsyncError failed: %s", ncclGetErrorString(r));
    if (state != ncclSuccess && state != ncclInProgress)
        return rp_errf(err, "NCCL rank %d of %d: %s (%s)", c->rank, c->nranks, ncclGetErrorString(state),
                       ncclGetLastError(c->comm));
    return 0;
}

int rp_nccl_comm_rank(const rp_nccl_comm *c) {
    return c->rank;
}

int rp_nccl_comm_size(const rp_nccl_comm *c) {
    return c->nranks;
}

/* From any thread: the caller's current device is restored, since the
 * watchdog's thread is not the rank's. */
void rp_nccl_comm_abort(rp_nccl_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (!c->aborted && c->comm) {
        int prev = -1;
        cudaGetDevice(&prev);
        cudaSetDevice(c->device);
        ncclCommAbort(c->comm);
        if (prev >= 0) cudaSetDevice(prev);
    }
    c->aborted = 1;
    c->comm = NULL;
    pthread_mutex_unlock(&c->mu);
}

void rp_nccl_comm_free(rp_nccl_comm *c) {
    if (!c) return;
    if (c->comm && !c->aborted) {
        /* a healthy communicator finishes its pending work first (every
         * rank frees at once); one that hit an error, or cannot finish in
         * time, is aborted, since waiting on a lost peer never ends */
        cudaSetDevice(c->device);
        ncclResult_t async = ncclSuccess;
        int healthy = ncclCommGetAsyncError(c->comm, &async) == ncclSuccess && async == ncclSuccess;
        if (healthy) {
            ncclResult_t r = ncclCommFinalize(c->comm);
            healthy = (r == ncclSuccess || r == ncclInProgress) &&
                      !wait_done(c, "ncclCommFinalize", now_ms() + FINALIZE_TIMEOUT_MS, FINALIZE_TIMEOUT_MS, NULL,
                                 NULL);
        }
        if (healthy) ncclCommDestroy(c->comm);
        else ncclCommAbort(c->comm);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}
