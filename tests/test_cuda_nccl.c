/* The NCCL communicator wrapper (src/dist/nccl/nccl_comm.c) on every GPU
 * of the machine, one thread per GPU as the tensor-parallel backend will
 * run it: a bf16 sum all-reduce and an f32 all-gather against their values
 * computed here, the all-reduce captured in a CUDA graph and replayed on
 * new inputs, and NCCL_NVLS_ENABLE=0 set unless the environment set it.
 * One GPU makes a group of one (the collectives are copies); the sums
 * need two or more. Faults (the communicators are non-blocking): a group
 * whose other rank never comes fails at the deadline, or at once when
 * cancelled; with two GPUs, a rank whose stream waits in an all-reduce
 * that the other rank never joins returns once another thread aborts its
 * communicator (the tensor-parallel watchdog's way out). Label "gpu" in
 * CTest; without NCCL or a GPU every test is skipped. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(REPLAY_HAVE_CUDA) && defined(REPLAY_HAVE_NCCL)

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "test_cuda_util.h"

#include "dist/nccl/nccl_comm.h"
#include "util/dtype.h"

#define COUNT 4099 /* not a multiple of anything NCCL chunks by */

typedef struct gpu {
    int rank, nranks;
    const uint8_t *id;
    int failed;
    char msg[600];
} gpu;

#define FAIL(g, ...) do { snprintf((g)->msg, sizeof (g)->msg, __VA_ARGS__); (g)->failed = 1; return NULL; } while (0)
#define GCU(g, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) FAIL(g, "%s: %s", #call, cudaGetErrorString(e_)); } while (0)

/* Rank r's element i: small integers, so bf16 sums of up to 8 are exact. */
static float value(int r, int i, int round) {
    return (float)((r + 1) * ((i % 13) - 6) + round);
}

static void *gpu_main(void *arg) {
    gpu *g = arg;
    rp_err err;
    rp_nccl_comm *c = rp_nccl_comm_new(g->id, g->nranks, g->rank, g->rank, 60000, NULL, &err);
    if (!c) FAIL(g, "%s", err.msg);
    if (rp_nccl_comm_rank(c) != g->rank || rp_nccl_comm_size(c) != g->nranks) FAIL(g, "rank/size");
    cudaStream_t s;
    GCU(g, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint16_t *h = malloc(COUNT * 2), *d = NULL;
    float *hf = malloc((size_t)COUNT * g->nranks * 4), *df = NULL, *dg = NULL;
    GCU(g, cudaMalloc((void **)&d, COUNT * 2));
    GCU(g, cudaMalloc((void **)&df, COUNT * 4));
    GCU(g, cudaMalloc((void **)&dg, (size_t)COUNT * g->nranks * 4));

    /* all-reduce, eager then captured and replayed twice on new inputs */
    cudaGraphExec_t exec = NULL;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < COUNT; i++) h[i] = rp_f32_to_bf16(value(g->rank, i, round));
        GCU(g, cudaMemcpyAsync(d, h, COUNT * 2, cudaMemcpyHostToDevice, s));
        if (round == 0) {
            if (rp_nccl_all_reduce_sum(c, d, d, COUNT, RP_NCCL_BF16, s, &err)) FAIL(g, "%s", err.msg);
        } else {
            if (!exec) {
                cudaGraph_t graph;
                GCU(g, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                if (rp_nccl_all_reduce_sum(c, d, d, COUNT, RP_NCCL_BF16, s, &err)) FAIL(g, "capture: %s", err.msg);
                GCU(g, cudaStreamEndCapture(s, &graph));
                GCU(g, cudaGraphInstantiate(&exec, graph, 0));
                GCU(g, cudaGraphDestroy(graph));
            }
            GCU(g, cudaGraphLaunch(exec, s));
        }
        GCU(g, cudaMemcpyAsync(h, d, COUNT * 2, cudaMemcpyDeviceToHost, s));
        GCU(g, cudaStreamSynchronize(s));
        if (rp_nccl_check(c, &err)) FAIL(g, "%s", err.msg);
        for (int i = 0; i < COUNT; i++) {
            float want = 0;
            for (int r = 0; r < g->nranks; r++) want += value(r, i, round);
            if (rp_bf16_to_f32(h[i]) != want)
                FAIL(g, "round %d: all-reduce element %d is %g, want %g", round, i, rp_bf16_to_f32(h[i]), want);
        }
    }
    GCU(g, cudaGraphExecDestroy(exec));

    /* all-gather: rank order */
    for (int i = 0; i < COUNT; i++) hf[i] = value(g->rank, i, 7) + 0.25f;
    GCU(g, cudaMemcpyAsync(df, hf, COUNT * 4, cudaMemcpyHostToDevice, s));
    if (rp_nccl_all_gather(c, df, dg, COUNT, RP_NCCL_F32, s, &err)) FAIL(g, "%s", err.msg);
    GCU(g, cudaMemcpyAsync(hf, dg, (size_t)COUNT * g->nranks * 4, cudaMemcpyDeviceToHost, s));
    GCU(g, cudaStreamSynchronize(s));
    for (int r = 0; r < g->nranks; r++)
        for (int i = 0; i < COUNT; i++)
            if (hf[(size_t)r * COUNT + i] != value(r, i, 7) + 0.25f) FAIL(g, "all-gather rank %d element %d", r, i);
    cudaFree(d), cudaFree(df), cudaFree(dg);
    free(h), free(hf);
    cudaStreamDestroy(s);
    rp_nccl_comm_free(c);
    return NULL;
}

static void test_group(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) skip();
    if (n > 8) n = 8;
    const char *before = getenv("NCCL_NVLS_ENABLE");
    char user[64] = "";
    if (before) snprintf(user, sizeof user, "%s", before);
    uint8_t id[RP_BS_UNIQUE_ID_BYTES];
    rp_err err;
    if (rp_nccl_unique_id(id, &err)) fail_msg("%s", err.msg);
    const char *after = getenv("NCCL_NVLS_ENABLE");
    assert_non_null(after);
    assert_string_equal(after, before ? user : "0");
    gpu g[8];
    pthread_t th[8];
    for (int r = 0; r < n; r++) {
        g[r] = (gpu){.rank = r, .nranks = n, .id = id};
        assert_int_equal(pthread_create(&th[r], NULL, gpu_main, &g[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        if (g[r].failed) fail_msg("GPU %d of %d: %s", r, n, g[r].msg);
    printf("NCCL group of %d GPU(s): all-reduce (eager and graph), all-gather ok\n", n);
}

static void test_bad_rank(void **state) {
    (void)state;
    uint8_t id[RP_BS_UNIQUE_ID_BYTES] = {0};
    rp_err err;
    assert_null(rp_nccl_comm_new(id, 2, 2, 0, 60000, NULL, &err));
    assert_non_null(strstr(err.msg, "rank 2 of 2"));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *cancel_later(void *arg) {
    struct timespec pause = {0, 500000000};
    nanosleep(&pause, NULL);
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

/* Rank 0 of 2, rank 1 never comes: the creation gives up at its deadline,
 * and at once when cancelled, instead of waiting forever. */
static void test_missing_rank(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) skip();
    uint8_t id[RP_BS_UNIQUE_ID_BYTES];
    rp_err err;
    if (rp_nccl_unique_id(id, &err)) fail_msg("%s", err.msg);
    double t0 = now_s();
    assert_null(rp_nccl_comm_new(id, 2, 0, 0, 2000, NULL, &err));
    double took = now_s() - t0;
    printf("a missing rank: %.2f s: %s\n", took, err.msg);
    assert_true(took >= 1.9 && took < 30);
    assert_non_null(strstr(err.msg, "not done within 2.0 s"));
    if (rp_nccl_unique_id(id, &err)) fail_msg("%s", err.msg);
    atomic_int cancel;
    atomic_init(&cancel, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cancel_later, &cancel), 0);
    t0 = now_s();
    assert_null(rp_nccl_comm_new(id, 2, 0, 0, 600000, &cancel, &err));
    took = now_s() - t0;
    pthread_join(th, NULL);
    printf("cancelled: %.2f s: %s\n", took, err.msg);
    assert_true(took < 30);
    assert_non_null(strstr(err.msg, "cancelled"));
}

typedef struct stalled {
    int rank;
    const uint8_t *id;
    rp_nccl_comm *c;
    atomic_int ready, done;
    int failed;
    char msg[600];
} stalled;

/* Both ranks make the communicator; rank 0 then waits for an all-reduce
 * that rank 1 never joins. */
static void *stalled_main(void *arg) {
    stalled *g = arg;
    rp_err err;
    g->c = rp_nccl_comm_new(g->id, 2, g->rank, g->rank, 60000, NULL, &err);
    if (!g->c) {
        snprintf(g->msg, sizeof g->msg, "%s", err.msg);
        g->failed = 1;
        atomic_store(&g->ready, 1);
        atomic_store(&g->done, 1);
        return NULL;
    }
    atomic_store(&g->ready, 1);
    if (g->rank == 0) {
        cudaStream_t s;
        float *d = NULL;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMalloc((void **)&d, 4096 * 4) == cudaSuccess &&
            !rp_nccl_all_reduce_sum(g->c, d, d, 4096, RP_NCCL_F32, s, &err)) {
            cudaStreamSynchronize(s); /* returns once the communicator is aborted */
        }
        cudaFree(d);
        cudaStreamDestroy(s);
    }
    atomic_store(&g->done, 1);
    return NULL;
}

static void test_abort_wakes(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) skip();
    uint8_t id[RP_BS_UNIQUE_ID_BYTES];
    rp_err err;
    if (rp_nccl_unique_id(id, &err)) fail_msg("%s", err.msg);
    stalled g[2] = {{.rank = 0, .id = id}, {.rank = 1, .id = id}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        atomic_init(&g[r].ready, 0);
        atomic_init(&g[r].done, 0);
        assert_int_equal(pthread_create(&th[r], NULL, stalled_main, &g[r]), 0);
    }
    pthread_join(th[1], NULL);
    if (g[1].failed) fail_msg("rank 1: %s", g[1].msg);
    while (!atomic_load(&g[0].ready)) sched_yield();
    if (g[0].failed) fail_msg("rank 0: %s", g[0].msg);
    struct timespec pause = {1, 0};
    nanosleep(&pause, NULL);
    assert_int_equal(atomic_load(&g[0].done), 0); /* waiting for rank 1 */
    assert_int_equal(rp_nccl_check(g[0].c, &err), 0);
    const double t0 = now_s();
    rp_nccl_comm_abort(g[0].c);
    while (!atomic_load(&g[0].done) && now_s() - t0 < 30) {
        struct timespec tick = {0, 10000000};
        nanosleep(&tick, NULL);
    }
    printf("abort: the waiting stream returned after %.2f s\n", now_s() - t0);
    if (!atomic_load(&g[0].done)) fail_msg("rank 0 still waits 30 s after the abort"); /* its thread leaks */
    pthread_join(th[0], NULL);
    assert_int_not_equal(rp_nccl_check(g[0].c, &err), 0);
    assert_non_null(strstr(err.msg, "aborted"));
    assert_int_not_equal(rp_nccl_all_reduce_sum(g[0].c, NULL, NULL, 1, RP_NCCL_F32, 0, &err), 0);
    rp_nccl_comm_free(g[0].c);
    rp_nccl_comm_abort(g[1].c); /* its peer is gone: finalizing would wait for it */
    rp_nccl_comm_free(g[1].c);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_group), cmocka_unit_test(test_bad_rank),
                                       cmocka_unit_test(test_missing_rank), cmocka_unit_test(test_abort_wakes)};
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
