/* Tensor-parallel ranks sharing one GPU (rp_tp_backend_config.one_gpu): a
 * harness that runs the CUDA backend's split (the shards, their slices of
 * the KV heads and the vocabulary, the collective points, the logit
 * gather) on a machine with a single GPU, so that the split is checked
 * against one rank running the whole model where no multi-GPU machine is
 * at hand (tests/test_cuda_tp.c). NCCL refuses two ranks on one device.
 *
 * Each collective copies its device buffer to host memory on the rank's
 * stream and waits for it, meets the other ranks in the local communicator (comm.h:
 * the same deterministic sums in rank order the CPU backend's shards use)
 * and copies the result back. That makes every collective a host round
 * trip, slow and impossible to capture in a graph: the harness runs with
 * CUDA graphs off (rp_backend_tp_new refuses otherwise). Correctness only;
 * timing tensor parallelism needs the GPUs it runs on. */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "dist/comm.h"

typedef struct one_gpu_comm {
    rp_comm base;
    rp_comm *host; /* the local communicator the sums go through */
    void *send, *recv;
    size_t send_cap, recv_cap;
} one_gpu_comm;

static size_t elem_bytes(rp_comm_dtype t) {
    return t == RP_COMM_F32 ? 4 : 2;
}

static int grow(void **p, size_t *cap, size_t bytes, rp_err *err) {
    if (bytes <= *cap) return 0;
    void *q = realloc(*p, bytes);
    if (!q) return rp_errf(err, "out of memory (%zu bytes of collective staging)", bytes);
    *p = q;
    *cap = bytes;
    return 0;
}

static int cuda_ok(cudaError_t e, const char *what, rp_err *err) {
    return e == cudaSuccess ? 0 : rp_errf(err, "%s: %s", what, cudaGetErrorString(e));
}

/* Copies on the rank's stream, each waited for: a plain cudaMemcpy runs on
 * the legacy stream, which the ranks' non-blocking streams do not wait for,
 * and from pageable memory it may return before its DMA has finished (the
 * next kernel on the rank's stream read the tail of a gathered buffer
 * before it had arrived). */
static int copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s, const char *what,
                rp_err *err) {
    if (cuda_ok(cudaMemcpyAsync(dst, src, bytes, kind, s), what, err)) return RP_ERR;
    return cuda_ok(cudaStreamSynchronize(s), what, err);
}

static int one_gpu_all_reduce_sum(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream,
                                  rp_err *err) {
    one_gpu_comm *oc = (one_gpu_comm *)c;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t bytes = count * elem_bytes(dtype);
    if (grow(&oc->send, &oc->send_cap, bytes, err) ||
        copy(oc->send, buf, bytes, cudaMemcpyDeviceToHost, s, "all-reduce: to the host", err) ||
        rp_comm_all_reduce_sum(oc->host, oc->send, count, dtype, NULL, err))
        return RP_ERR;
    return copy(buf, oc->send, bytes, cudaMemcpyHostToDevice, s, "all-reduce: back to the GPU", err);
}

static int one_gpu_all_gather(rp_comm *c, const void *send, void *recv, size_t send_count, rp_comm_dtype dtype,
                              void *stream, rp_err *err) {
    one_gpu_comm *oc = (one_gpu_comm *)c;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t bytes = send_count * elem_bytes(dtype), all = bytes * (size_t)c->size;
    if (grow(&oc->send, &oc->send_cap, bytes, err) || grow(&oc->recv, &oc->recv_cap, all, err) ||
        copy(oc->send, send, bytes, cudaMemcpyDeviceToHost, s, "all-gather: to the host", err) ||
        rp_comm_all_gather(oc->host, oc->send, oc->recv, send_count, dtype, NULL, err))
        return RP_ERR;
    return copy(recv, oc->recv, all, cudaMemcpyHostToDevice, s, "all-gather: back to the GPU", err);
}

static int one_gpu_barrier(rp_comm *c, void *stream, rp_err *err) {
    one_gpu_comm *oc = (one_gpu_comm *)c;
    if (cuda_ok(cudaStreamSynchronize((cudaStream_t)stream), "barrier: the rank's stream", err)) return RP_ERR;
    return rp_comm_barrier(oc->host, NULL, err);
}

static int one_gpu_check(rp_comm *c, rp_err *err) {
    return rp_comm_check(((one_gpu_comm *)c)->host, err);
}

static void one_gpu_abort(rp_comm *c) {
    rp_comm_abort(((one_gpu_comm *)c)->host);
}

static void one_gpu_free(rp_comm *c) {
    one_gpu_comm *oc = (one_gpu_comm *)c;
    rp_comm_free(oc->host);
    free(oc->send);
    free(oc->recv);
    free(oc);
}

static const rp_comm_ops one_gpu_ops = {.all_reduce_sum = one_gpu_all_reduce_sum,
                                        .all_gather = one_gpu_all_gather,
                                        .barrier = one_gpu_barrier,
                                        .check = one_gpu_check,
                                        .abort = one_gpu_abort,
                                        .free = one_gpu_free};

rp_comm *rp_comm_one_gpu_new(rp_comm_local_group *g, int rank, int device, rp_err *err) {
    if (cuda_ok(cudaSetDevice(device), "cudaSetDevice", err)) return NULL;
    rp_comm *host = rp_comm_local_new(g, rank, err);
    if (!host) return NULL;
    one_gpu_comm *c = calloc(1, sizeof *c);
    if (!c) {
        rp_comm_free(host);
        rp_errf(err, "out of memory");
        return NULL;
    }
    c->base.ops = &one_gpu_ops;
    c->base.rank = host->rank;
    c->base.size = host->size;
    c->host = host;
    return &c->base;
}
