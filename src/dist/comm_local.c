/* The local communicator (comm.h): tensor-parallel ranks as threads of one
 * process, over host memory. The CPU backend's shards sum and gather
 * through it, so tensor parallelism's arithmetic is tested without GPUs.
 *
 * A collective publishes each rank's buffer in the group, then every rank
 * reads the others' between barriers. The all-reduce is a reduce-scatter
 * then an all-gather done in the buffers themselves: rank r sums chunk r
 * over all ranks (rank 0's value first, then 1's, ...) into its own buffer,
 * then copies the other ranks' summed chunks from theirs. Every element is
 * summed in the same order on every rank, so all ranks hold the same bits,
 * which sampling relies on (each rank draws the same token). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "util/dtype.h"

#define LOCAL_MAX_RANKS 64

struct rp_comm_local_group {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t generation;
    int aborted;
    /* the buffers of the collective in progress, one per rank */
    void *bufs[LOCAL_MAX_RANKS];
    const void *sends[LOCAL_MAX_RANKS];
};

typedef struct local_comm {
    rp_comm base;
    rp_comm_local_group *g;
} local_comm;

rp_comm_local_group *rp_comm_local_group_new(int size, rp_err *err) {
    if (size < 1 || size > LOCAL_MAX_RANKS) {
        rp_errf(err, "local communicator: %d ranks (1 to %d)", size, LOCAL_MAX_RANKS);
        return NULL;
    }
    rp_comm_local_group *g = calloc(1, sizeof *g);
    if (!g) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    g->size = size;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

void rp_comm_local_group_free(rp_comm_local_group *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

/* Waits until every rank has arrived; an error once any rank aborted (then
 * every later collective fails too: the group is unusable). A barrier that
 * every rank reached has passed, even if a rank aborts before this one
 * wakes up to see it. */
static int group_barrier(rp_comm_local_group *g, rp_err *err) {
    pthread_mutex_lock(&g->mu);
    int passed = 0;
    if (!g->aborted) {
        uint64_t gen = g->generation;
        if (++g->arrived == g->size) {
            g->arrived = 0;
            g->generation++;
            pthread_cond_broadcast(&g->cv);
        } else {
            while (gen == g->generation && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        }
        passed = gen != g->generation;
    }
    pthread_mutex_unlock(&g->mu);
    return passed ? 0 : rp_errf(err, "a tensor-parallel rank failed: the collective was abandoned");
}

static size_t dtype_bytes(rp_comm_dtype t) {
    return t == RP_COMM_F32 ? 4 : 2;
}

static int local_all_reduce_sum(rp_comm *c, void *buf, size_t count, rp_comm_dtype dtype, void *stream,
                                rp_err *err) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    rp_comm_local_group *g = lc->g;
    const int n = g->size, r = c->rank;
    if (n == 1) return 0;
    g->bufs[r] = buf;
    if (group_barrier(g, err)) return RP_ERR;
    /* chunk r: [lo, hi) */
    size_t per = (count + (size_t)n - 1) / (size_t)n;
    size_t lo = per * (size_t)r < count ? per * (size_t)r : count;
    size_t hi = lo + per < count ? lo + per : count;
    if (dtype == RP_COMM_F32) {
        for (size_t i = lo; i < hi; i++) {
            float s = ((const float *)g->bufs[0])[i];
            for (int k = 1; k < n; k++) s += ((const float *)g->bufs[k])[i];
            ((float *)buf)[i] = s;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            float s = rp_bf16_to_f32(((const uint16_t *)g->bufs[0])[i]);
            for (int k = 1; k < n; k++) s += rp_bf16_to_f32(((const uint16_t *)g->bufs[k])[i]);
            ((uint16_t *)buf)[i] = rp_f32_to_bf16(s);
        }
    }
    if (group_barrier(g, err)) return RP_ERR;
    const size_t eb = dtype_bytes(dtype);
    for (int k = 0; k < n; k++) {
        if (k == r) continue;
        size_t klo = per * (size_t)k < count ? per * (size_t)k : count;
        size_t khi = klo + per < count ? klo + per : count;
        if (khi > klo) memcpy((uint8_t *)buf + klo * eb, (const uint8_t *)g->bufs[k] + klo * eb, (khi - klo) * eb);
    }
    /* nobody reuses its buffer while another rank still reads it */
    return group_barrier(g, err);
}

static int local_all_gather(rp_comm *c, const void *send, void *recv, size_t send_count, rp_comm_dtype dtype,
                            void *stream, rp_err *err) {
    (void)stream;
    local_comm *lc = (local_comm *)c;
    rp_comm_local_group *g = lc->g;
    const size_t bytes = send_count * dtype_bytes(dtype);
    g->sends[c->rank] = send;
    if (group_barrier(g, err)) return RP_ERR;
    for (int k = 0; k < g->size; k++)
        if (bytes) memmove((uint8_t *)recv + (size_t)k * bytes, g->sends[k], bytes);
    return group_barrier(g, err);
}

static int local_barrier(rp_comm *c, void *stream, rp_err *err) {
    (void)stream;
    return group_barrier(((local_comm *)c)->g, err);
}

static int local_check(rp_comm *c, rp_err *err) {
    rp_comm_local_group *g = ((local_comm *)c)->g;
    pthread_mutex_lock(&g->mu);
    const int aborted = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return aborted ? rp_errf(err, "the tensor-parallel group was aborted") : 0;
}

/* Wakes every rank waiting in a collective of the group (all fail), not
 * only this one: the ranks of one process share the meeting point, as
 * NCCL's ranks share a fate once one aborts. */
static void local_abort(rp_comm *c) {
    rp_comm_local_group *g = ((local_comm *)c)->g;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void local_free(rp_comm *c) {
    free(c);
}

static const rp_comm_ops local_ops = {.all_reduce_sum = local_all_reduce_sum,
                                      .all_gather = local_all_gather,
                                      .barrier = local_barrier,
                                      .check = local_check,
                                      .abort = local_abort,
                                      .free = local_free};

rp_comm *rp_comm_local_new(rp_comm_local_group *g, int rank, rp_err *err) {
    if (rank < 0 || rank >= g->size) {
        rp_errf(err, "local communicator: rank %d of %d", rank, g->size);
        return NULL;
    }
    local_comm *c = calloc(1, sizeof *c);
    if (!c) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    c->base.ops = &local_ops;
    c->base.rank = rank;
    c->base.size = g->size;
    c->g = g;
    return &c->base;
}
