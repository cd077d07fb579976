/* The one-shot all-reduce through peer memory (src/backend/cuda/comm_p2p.c,
 * kernels/p2p.cu), one thread per rank as the tensor-parallel backend runs
 * it: rank r on GPU r % (GPUs present), so on a machine with one GPU every
 * rank shares it (their slots are then one device's memory; the kernel and
 * the flags' protocol are the same). The inner communicator is the one-GPU
 * harness's (through the host), which takes the sums the peer path leaves
 * to it (not 16-byte vectors, larger than a slot).
 *
 * Fresh random f32 and bf16 values every call; every rank's result must be
 * bit for bit the sum in rank order computed here (f32, bf16 rounded once),
 * for sizes from one vector to a whole slot, several calls in a row (both
 * slot parities, twice), and from a CUDA graph replayed on new inputs. A
 * rank whose peer never comes returns once another thread aborts its
 * communicator. Label "gpu"; skipped without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REPLAY_HAVE_CUDA

#include <cuda_runtime.h>
#include <pthread.h>
#include <time.h>

#include "backend/cuda/cuda_backend.h"
#include "dist/comm.h"
#include "util/dtype.h"
#include "util/rng.h"

#define MAXN 4

typedef struct group {
    int n;
    rp_comm_local_group *inner_g, *host_g;
} group;

typedef struct rank_ctx {
    group *g;
    int rank, device;
    int graph; /* 1: the test's calls from a captured graph */
    uint64_t seed;
    int failed;
    char msg[600];
} rank_ctx;

#define FAIL(c, ...) do { snprintf((c)->msg, sizeof (c)->msg, __VA_ARGS__); (c)->failed = 1; goto out; } while (0)
#define GCU(c, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) FAIL(c, "%s: %s", #call, cudaGetErrorString(e_)); } while (0)

static int gpus(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* Rank r's value i of call `call`, the same on every thread. */
static float value(uint64_t seed, int r, int call, size_t i) {
    return rp_rand_uniform(seed, (uint64_t)r << 32 | (uint64_t)call, i) * 4.0f - 2.0f;
}

/* The sums every call must give: counts (f32 / bf16 elements), among them
 * ones the peer path leaves to the inner communicator. */
typedef struct call_spec {
    size_t count;
    int bf16;
} call_spec;
static const call_spec CALLS[] = {
    {4096, 0},                         /* llama3-8b's hidden size, one token: 16 KB */
    {4, 0},                            /* one vector */
    {8, 1},                            /* one vector of bf16 */
    {RP_P2P_SLOT_BYTES / 4, 0},        /* a whole slot */
    {8192 * 3, 1},                     /* 48 KB of bf16 */
    {4099, 0},                         /* not whole vectors: the inner communicator */
    {RP_P2P_SLOT_BYTES / 4 + 4, 0},    /* past a slot: the inner communicator */
    {4096 * 7, 0},
    {12, 0},
};
#define NCALLS ((int)(sizeof CALLS / sizeof CALLS[0]))

static int check_sum(rank_ctx *c, const void *got, const call_spec *cs, int call) {
    for (size_t i = 0; i < cs->count; i++) {
        float s = 0.0f;
        for (int k = 0; k < c->g->n; k++) {
            float v = value(c->seed, k, call, i);
            s += cs->bf16 ? rp_bf16_to_f32(rp_f32_to_bf16(v)) : v;
        }
        if (cs->bf16) {
            const uint16_t want = rp_f32_to_bf16(s), have = ((const uint16_t *)got)[i];
            if (want != have) {
                snprintf(c->msg, sizeof c->msg, "rank %d call %d (%zu bf16): element %zu is %#x, want %#x", c->rank,
                         call, cs->count, i, have, want);
                return 1;
            }
        } else {
            const float have = ((const float *)got)[i];
            if (memcmp(&have, &s, 4)) {
                snprintf(c->msg, sizeof c->msg, "rank %d call %d (%zu f32): element %zu is %.9g, want %.9g", c->rank,
                         call, cs->count, i, (double)have, (double)s);
                return 1;
            }
        }
    }
    return 0;
}

static void fill(const rank_ctx *c, void *h, const call_spec *cs, int call) {
    for (size_t i = 0; i < cs->count; i++) {
        const float v = value(c->seed, c->rank, call, i);
        if (cs->bf16) ((uint16_t *)h)[i] = rp_f32_to_bf16(v);
        else ((float *)h)[i] = v;
    }
}

static rp_comm *make(rank_ctx *c, rp_err *err) {
    if (cudaSetDevice(c->device) != cudaSuccess) {
        rp_errf(err, "cudaSetDevice(%d)", c->device);
        return NULL;
    }
    rp_comm *inner = rp_comm_one_gpu_new(c->g->inner_g, c->rank, c->device, err);
    rp_comm *host = inner ? rp_comm_local_new(c->g->host_g, c->rank, err) : NULL;
    rp_comm *p = host ? rp_comm_p2p_new(inner, host, c->device, RP_P2P_SLOT_BYTES, 0, err) : NULL;
    rp_comm_free(host);
    if (!p) rp_comm_free(inner);
    if (p == inner) {
        rp_errf(err, "the peer path was not made (GPUs that cannot reach each other?)");
        rp_comm_free(p);
        return NULL;
    }
    return p;
}

/* Every call of CALLS twice (both slot parities, the counters past 2),
 * eagerly or each from a graph captured once and replayed on new inputs. */
static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    rp_err err;
    cudaStream_t s = NULL;
    void *d = NULL, *h = NULL, *hin = NULL;
    cudaGraphExec_t exec[NCALLS] = {0};
    rp_comm *comm = make(c, &err);
    if (!comm) FAIL(c, "rank %d: %s", c->rank, err.msg);
    GCU(c, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t cap = (RP_P2P_SLOT_BYTES + 64) * 2;
    GCU(c, cudaMalloc(&d, cap));
    GCU(c, cudaMallocHost(&h, cap));
    GCU(c, cudaMallocHost(&hin, cap)); /* the copy to the device reads it after the call returns */
    if (c->graph)
        for (int k = 0; k < NCALLS; k++) {
            const size_t bytes = CALLS[k].count * (CALLS[k].bf16 ? 2 : 4);
            if (bytes > RP_P2P_SLOT_BYTES || bytes % 16) continue; /* the inner communicator's: eager */
            cudaGraph_t gr;
            GCU(c, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            if (rp_comm_all_reduce_sum(comm, d, CALLS[k].count, CALLS[k].bf16 ? RP_COMM_BF16 : RP_COMM_F32, s, &err))
                FAIL(c, "rank %d: capture: %s", c->rank, err.msg);
            GCU(c, cudaStreamEndCapture(s, &gr));
            GCU(c, cudaGraphInstantiate(&exec[k], gr, 0));
            GCU(c, cudaGraphDestroy(gr));
        }
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < NCALLS; k++) {
            const call_spec *cs = &CALLS[k];
            const int call = round * NCALLS + k;
            const size_t bytes = cs->count * (cs->bf16 ? 2 : 4);
            fill(c, hin, cs, call);
            GCU(c, cudaMemcpyAsync(d, hin, bytes, cudaMemcpyHostToDevice, s));
            memset(h, 0xff, bytes); /* poison: what comes back must be the sum */
            if (exec[k]) GCU(c, cudaGraphLaunch(exec[k], s));
            else if (rp_comm_all_reduce_sum(comm, d, cs->count, cs->bf16 ? RP_COMM_BF16 : RP_COMM_F32, s, &err))
                FAIL(c, "rank %d call %d: %s", c->rank, call, err.msg);
            GCU(c, cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s));
            GCU(c, cudaStreamSynchronize(s));
            if (check_sum(c, h, cs, call)) {
                c->failed = 1;
                goto out;
            }
        }
    if (rp_comm_check(comm, &err)) FAIL(c, "rank %d: check: %s", c->rank, err.msg);
out:
    for (int k = 0; k < NCALLS; k++)
        if (exec[k]) cudaGraphExecDestroy(exec[k]);
    if (s) cudaStreamSynchronize(s);
    if (d) cudaFree(d);
    if (h) cudaFreeHost(h);
    if (hin) cudaFreeHost(hin);
    if (s) cudaStreamDestroy(s);
    rp_comm_free(comm);
    return NULL;
}

static void run_group(int n, int graph) {
    const int ng = gpus();
    group g = {.n = n};
    rp_err err;
    g.inner_g = rp_comm_local_group_new(n, &err);
    g.host_g = rp_comm_local_group_new(n, &err);
    assert_non_null(g.inner_g);
    assert_non_null(g.host_g);
    rank_ctx ctx[MAXN];
    pthread_t th[MAXN];
    for (int r = 0; r < n; r++) {
        ctx[r] = (rank_ctx){.g = &g, .rank = r, .device = r % ng, .graph = graph, .seed = 0x9e3779b97f4a7c15ULL + (uint64_t)time(NULL)};
        if (r) ctx[r].seed = ctx[0].seed;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &ctx[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        if (ctx[r].failed)
            fail_msg("N=%d%s, seed %llu: %s", n, graph ? " (graphs)" : "", (unsigned long long)ctx[0].seed, ctx[r].msg);
    printf("  N=%d on %d GPU%s%s: %d sums, every rank bit-exact\n", n, ng < n ? ng : n, ng < n && ng == 1 ? "" : "s",
           graph ? ", from graphs" : "", 2 * NCALLS);
    rp_comm_local_group_free(g.inner_g);
    rp_comm_local_group_free(g.host_g);
}

static void test_two(void **state) {
    (void)state;
    run_group(2, 0);
}
static void test_four(void **state) {
    (void)state;
    run_group(4, 0);
}
static void test_two_graphs(void **state) {
    (void)state;
    run_group(2, 1);
}
static void test_four_graphs(void **state) {
    (void)state;
    run_group(4, 1);
}

/* Rank 1 makes its communicator and then never calls: rank 0's kernel
 * spins for it until another thread aborts rank 0's communicator. */
typedef struct stall_ctx {
    rank_ctx rc;
    rp_comm *comm;
    int made;
} stall_ctx;

static void *made_main(void *arg) {
    stall_ctx *sc = arg;
    rp_err err;
    sc->comm = make(&sc->rc, &err);
    if (!sc->comm) snprintf(sc->rc.msg, sizeof sc->rc.msg, "rank %d: %s", sc->rc.rank, err.msg);
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void test_abort_wakes(void **state) {
    (void)state;
    const int ng = gpus();
    group g = {.n = 2};
    rp_err err;
    g.inner_g = rp_comm_local_group_new(2, &err);
    g.host_g = rp_comm_local_group_new(2, &err);
    stall_ctx sc[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        sc[r] = (stall_ctx){.rc = {.g = &g, .rank = r, .device = r % ng}};
        assert_int_equal(pthread_create(&th[r], NULL, made_main, &sc[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        if (!sc[r].comm) fail_msg("%s", sc[r].rc.msg);
    cudaStream_t s;
    void *d;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMalloc(&d, 4096 * 4), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, 4096 * 4), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(rp_comm_all_reduce_sum(sc[0].comm, d, 4096, RP_COMM_F32, s, &err), 0);
    /* still spinning a while later: rank 1 never came */
    const double t0 = now_s();
    while (now_s() - t0 < 0.3) assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(rp_comm_check(sc[0].comm, &err), 0);
    rp_comm_abort(sc[0].comm);
    const double t1 = now_s();
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    const double waited = now_s() - t1;
    printf("  rank 0's all-reduce returned %.3f s after the abort\n", waited);
    assert_true(waited < 2.0);
    assert_int_not_equal(rp_comm_check(sc[0].comm, &err), 0);
    assert_non_null(strstr(err.msg, "aborted"));
    /* later calls fail at once */
    assert_int_not_equal(rp_comm_all_reduce_sum(sc[0].comm, d, 4096, RP_COMM_F32, s, &err), 0);
    cudaFree(d);
    cudaStreamDestroy(s);
    for (int r = 0; r < 2; r++) rp_comm_free(sc[r].comm);
    rp_comm_local_group_free(g.inner_g);
    rp_comm_local_group_free(g.host_g);
}

int main(void) {
    if (gpus() < 1) {
        printf("no CUDA device: test_cuda_p2p skipped\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two),        cmocka_unit_test(test_four),      cmocka_unit_test(test_two_graphs),
        cmocka_unit_test(test_four_graphs), cmocka_unit_test(test_abort_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static void test_skipped(void **state) {
    (void)state;
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
