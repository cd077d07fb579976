/* The local communicator (src/dist/comm_local.c): ranks as threads of one
 * process. Sum all-reduces in f32 and bf16 of counts that do and do not
 * split evenly over the ranks (fewer elements than ranks too), in place,
 * every rank with the same bits; all-gathers in rank order; and a rank that
 * aborts releases the others from a collective with an error instead of
 * leaving them waiting, and so does an abort from a thread that is no
 * rank's (the tensor-parallel backend's watchdog) when a rank never comes. */
#include <pthread.h>
#include <time.h>

#include "dist/comm.h"
#include "test_util.h"
#include "util/dtype.h"

#define RANKS 4

typedef struct rank_arg {
    rp_comm *c;
    int failed;
    char msg[600];
    int abort_at; /* this rank aborts instead of its second barrier */
    int aborted_seen;
} rank_arg;

static float value(int r, size_t i) {
    return (float)((int)(i % 17) - 8) * 0.25f + (float)r;
}

#define RFAIL(a, ...)                                               \
    do {                                                            \
        snprintf((a)->msg, sizeof (a)->msg, __VA_ARGS__);           \
        (a)->failed = 1;                                            \
        return NULL;                                                \
    } while (0)

static void *rank_main(void *p) {
    rank_arg *a = p;
    rp_comm *c = a->c;
    rp_err err;
    const size_t counts[] = {1, 3, 4, 1001, 4096};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t n = counts[k];
        float *f = malloc(n * 4);
        uint16_t *h = malloc(n * 2);
        for (size_t i = 0; i < n; i++) f[i] = value(c->rank, i), h[i] = rp_f32_to_bf16(value(c->rank, i));
        if (rp_comm_all_reduce_sum(c, f, n, RP_COMM_F32, NULL, &err)) RFAIL(a, "%s", err.msg);
        if (rp_comm_all_reduce_sum(c, h, n, RP_COMM_BF16, NULL, &err)) RFAIL(a, "%s", err.msg);
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < RANKS; r++) want += value(r, i); /* exact: quarters */
            if (f[i] != want) RFAIL(a, "f32 n=%zu [%zu]: %g != %g", n, i, f[i], want);
            if (rp_bf16_to_f32(h[i]) != want) RFAIL(a, "bf16 n=%zu [%zu]: %g != %g", n, i, rp_bf16_to_f32(h[i]), want);
        }
        /* all-gather: every rank's f32 block in rank order */
        float *send = malloc(n * 4), *recv = malloc(n * RANKS * 4);
        for (size_t i = 0; i < n; i++) send[i] = value(c->rank, i) * 3;
        if (rp_comm_all_gather(c, send, recv, n, RP_COMM_F32, NULL, &err)) RFAIL(a, "%s", err.msg);
        for (int r = 0; r < RANKS; r++)
            for (size_t i = 0; i < n; i++)
                if (recv[r * n + i] != value(r, i) * 3) RFAIL(a, "gather n=%zu rank %d [%zu]", n, r, i);
        free(f), free(h), free(send), free(recv);
    }
    if (rp_comm_barrier(c, NULL, &err)) RFAIL(a, "%s", err.msg);
    if (a->abort_at) {
        rp_comm_abort(c);
        return NULL;
    }
    /* the aborting rank never comes: the others are released with an error */
    if (!rp_comm_barrier(c, NULL, &err)) RFAIL(a, "a barrier missing a rank succeeded");
    a->aborted_seen = strstr(err.msg, "rank failed") != NULL;
    float x = 1;
    if (!rp_comm_all_reduce_sum(c, &x, 1, RP_COMM_F32, NULL, &err)) RFAIL(a, "a collective after an abort succeeded");
    return NULL;
}

static void test_local_group(void **state) {
    (void)state;
    rp_err err;
    rp_comm_local_group *g = rp_comm_local_group_new(RANKS, &err);
    assert_non_null(g);
    rank_arg args[RANKS] = {0};
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        args[r].c = rp_comm_local_new(g, r, &err);
        assert_non_null(args[r].c);
        assert_int_equal(args[r].c->rank, r);
        assert_int_equal(args[r].c->size, RANKS);
        args[r].abort_at = r == 2;
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        if (args[r].failed) fail_msg("rank %d: %s", r, args[r].msg);
        if (r != 2) assert_true(args[r].aborted_seen);
        rp_comm_free(args[r].c);
    }
    rp_comm_local_group_free(g);
    /* refusals */
    assert_null(rp_comm_local_group_new(0, &err));
    g = rp_comm_local_group_new(2, &err);
    assert_null(rp_comm_local_new(g, 2, &err));
    rp_comm_local_group_free(g);
}

typedef struct waiter {
    rp_comm *c;
    int rc;
    rp_err err;
} waiter;

static void *wait_in_all_reduce(void *p) {
    waiter *w = p;
    float x[5] = {1, 2, 3, 4, 5};
    w->rc = rp_comm_all_reduce_sum(w->c, x, 5, RP_COMM_F32, NULL, &w->err);
    return NULL;
}

/* Ranks 0 and 1 wait in an all-reduce that rank 2 never joins; another
 * thread checks (nothing wrong yet), then aborts through rank 2's
 * communicator: both return with an error, and check says aborted. */
static void test_abort_from_outside(void **state) {
    (void)state;
    rp_err err;
    rp_comm_local_group *g = rp_comm_local_group_new(3, &err);
    rp_comm *c[3];
    for (int r = 0; r < 3; r++) assert_non_null(c[r] = rp_comm_local_new(g, r, &err));
    waiter w[2] = {{.c = c[0]}, {.c = c[1]}};
    pthread_t th[2];
    for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, wait_in_all_reduce, &w[r]), 0);
    struct timespec pause = {0, 50000000};
    nanosleep(&pause, NULL);
    for (int r = 0; r < 3; r++) assert_int_equal(rp_comm_check(c[r], &err), 0);
    rp_comm_abort(c[2]);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        assert_int_not_equal(w[r].rc, 0);
        assert_non_null(strstr(w[r].err.msg, "abandoned"));
    }
    for (int r = 0; r < 3; r++) {
        assert_int_not_equal(rp_comm_check(c[r], &err), 0);
        assert_non_null(strstr(err.msg, "aborted"));
        rp_comm_free(c[r]);
    }
    rp_comm_local_group_free(g);
}

/* A group of one: the collectives are copies. */
static void test_group_of_one(void **state) {
    (void)state;
    rp_err err;
    rp_comm_local_group *g = rp_comm_local_group_new(1, &err);
    rp_comm *c = rp_comm_local_new(g, 0, &err);
    float x[3] = {1, 2, 3}, y[3];
    assert_int_equal(rp_comm_all_reduce_sum(c, x, 3, RP_COMM_F32, NULL, &err), 0);
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    assert_int_equal(rp_comm_all_gather(c, x, y, 3, RP_COMM_F32, NULL, &err), 0);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(rp_comm_barrier(c, NULL, &err), 0);
    assert_int_equal(rp_comm_check(c, &err), 0);
    rp_comm_free(c);
    rp_comm_local_group_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_local_group), cmocka_unit_test(test_group_of_one),
                                       cmocka_unit_test(test_abort_from_outside)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
