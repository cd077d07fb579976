/* The multi-node bootstrap (src/dist/bootstrap.c): node 0 and the other
 * nodes as threads, over a fake transport (socketpairs; connections
 * refused until node 0 listens) and over loopback TCP on an ephemeral port,
 * the code path two machines take. Every node gets node 0's unique id; the
 * refusals (wrong magic, protocol version, world size, duplicate node rank,
 * another model, timeouts) each reach node 0 and the nodes with the
 * reason. */
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist/bootstrap.h"
#include "test_util.h"

#define FP 0x1234abcd5678ef00ull

/* ---- a fake transport: socketpairs through an in-process queue ------------ */

typedef struct fake {
    rp_bs_transport base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int listening;
    int queue[32], nq;
    int refusals; /* connection attempts refused (node 0 not listening yet) */
} fake;

static int fake_listen(rp_bs_transport *t, const char *host, int port, int *bound, rp_err *err) {
    (void)host, (void)port, (void)err;
    fake *f = (fake *)t;
    pthread_mutex_lock(&f->mu);
    f->listening = 1;
    pthread_mutex_unlock(&f->mu);
    *bound = 4242;
    return 0;
}

static int fake_accept(rp_bs_transport *t, int timeout_ms, int *fd, rp_err *err) {
    (void)err;
    fake *f = (fake *)t;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) dl.tv_sec++, dl.tv_nsec -= 1000000000;
    pthread_mutex_lock(&f->mu);
    while (!f->nq)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &dl)) break;
    int rc = RP_BS_TIMEOUT;
    if (f->nq) {
        *fd = f->queue[0];
        memmove(f->queue, f->queue + 1, (size_t)--f->nq * sizeof f->queue[0]);
        rc = 0;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int fake_connect(rp_bs_transport *t, const char *host, int port, int timeout_ms, int *fd, rp_err *err) {
    (void)host, (void)port, (void)timeout_ms;
    fake *f = (fake *)t;
    pthread_mutex_lock(&f->mu);
    int rc = RP_BS_RETRY;
    if (!f->listening) {
        f->refusals++;
        rp_errf(err, "Connection refused");
    } else {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        f->queue[f->nq++] = sv[0];
        *fd = sv[1];
        pthread_cond_signal(&f->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void fake_destroy(rp_bs_transport *t) {
    fake *f = (fake *)t;
    for (int i = 0; i < f->nq; i++) close(f->queue[i]);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

static fake *fake_new(void) {
    fake *f = calloc(1, sizeof *f);
    f->base = (rp_bs_transport){fake_listen, fake_accept, fake_connect, fake_destroy};
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    return f;
}

/* ---- nodes as threads ----------------------------------------------------- */

typedef struct node {
    rp_bs_transport *t; /* node 0: listening; others: for connecting */
    const char *host;
    int port;
    rp_bs_world w;
    int timeout_ms;
    int delay_ms; /* node 0: before listening (others must retry) */
    uint8_t id[RP_BS_UNIQUE_ID_BYTES];
    int keep_links;                /* leave the connections open */
    int links[RP_BS_MAX_NODES];    /* node 0: one per node; others: links[0], to node 0 */
    int rc;
    rp_err err;
    pthread_t th;
} node;

static void nap(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void *node_main(void *arg) {
    node *n = arg;
    if (n->w.node_rank == 0) {
        nap(n->delay_ms);
        int bound;
        n->rc = n->t->listen(n->t, n->host, n->port, &bound, &n->err);
        if (!n->rc)
            n->rc = rp_bootstrap_serve(n->t, "test:4242", &n->w, n->id, n->timeout_ms, n->keep_links ? n->links : NULL,
                                       &n->err);
    } else {
        n->rc = rp_bootstrap_join(n->t, n->host, n->port, &n->w, n->timeout_ms, n->id,
                                  n->keep_links ? &n->links[0] : NULL, &n->err);
    }
    return NULL;
}

static void start(node *n) {
    assert_int_equal(pthread_create(&n->th, NULL, node_main, n), 0);
}
static void finish(node *n) {
    assert_int_equal(pthread_join(n->th, NULL), 0);
}

static node make_node(rp_bs_transport *t, int rank, int nnodes, int gpus, uint64_t fp, int timeout_ms) {
    node n;
    memset(&n, 0, sizeof n);
    n.t = t, n.host = "test", n.port = 4242, n.timeout_ms = timeout_ms;
    n.w = (rp_bs_world){.nnodes = nnodes, .gpus_per_node = gpus, .node_rank = rank, .fingerprint = fp};
    return n;
}

static void set_id(uint8_t *id, int seed) {
    for (int i = 0; i < RP_BS_UNIQUE_ID_BYTES; i++) id[i] = (uint8_t)(i * 7 + seed);
}

static void expect_msg(const node *n, const char *want) {
    if (n->rc == 0) fail_msg("node %d succeeded, expected \"%s\"", n->w.node_rank, want);
    if (!strstr(n->err.msg, want)) fail_msg("node %d: \"%s\" lacks \"%s\"", n->w.node_rank, n->err.msg, want);
}

/* Four nodes of two GPUs; the others start first and are refused until
 * node 0 listens. */
static void test_fake_world(void **state) {
    (void)state;
    fake *f = fake_new();
    node n[4];
    for (int k = 0; k < 4; k++) n[k] = make_node(&f->base, k, 4, 2, FP, 5000);
    set_id(n[0].id, 3);
    n[0].delay_ms = 200;
    for (int k = 3; k >= 0; k--) start(&n[k]);
    for (int k = 0; k < 4; k++) finish(&n[k]);
    for (int k = 0; k < 4; k++) {
        if (n[k].rc) fail_msg("node %d: %s", k, n[k].err.msg);
        assert_memory_equal(n[k].id, n[0].id, RP_BS_UNIQUE_ID_BYTES);
    }
    assert_true(f->refusals >= 3); /* each retried at least once */
    f->base.destroy(&f->base);
}

/* Loopback TCP, port 0: two nodes, then four, through the real sockets. */
static void tcp_world(int nnodes) {
    rp_err err;
    rp_bs_transport *srv = rp_bs_tcp_new(&err);
    assert_non_null(srv);
    int port = 0;
    if (srv->listen(srv, "127.0.0.1", 0, &port, &err)) fail_msg("%s", err.msg);
    assert_true(port > 0);
    node n[4];
    rp_bs_transport *cli[4] = {0};
    for (int k = 0; k < nnodes; k++) {
        cli[k] = k ? rp_bs_tcp_new(&err) : srv;
        n[k] = make_node(cli[k], k, nnodes, 8 / nnodes, FP, 5000);
        n[k].host = "127.0.0.1";
        n[k].port = port;
    }
    set_id(n[0].id, 11);
    for (int k = 1; k < nnodes; k++) start(&n[k]);
    n[0].rc = rp_bootstrap_serve(srv, "127.0.0.1", &n[0].w, n[0].id, 5000, NULL, &n[0].err);
    for (int k = 1; k < nnodes; k++) finish(&n[k]);
    for (int k = 0; k < nnodes; k++) {
        if (n[k].rc) fail_msg("tcp node %d of %d: %s", k, nnodes, n[k].err.msg);
        assert_memory_equal(n[k].id, n[0].id, RP_BS_UNIQUE_ID_BYTES);
        cli[k]->destroy(cli[k]);
    }
}

static void test_tcp_loopback(void **state) {
    (void)state;
    tcp_world(2);
    tcp_world(4);
}

/* A node that starts before node 0 over TCP: refused, retried, joined. */
static void test_tcp_node_first(void **state) {
    (void)state;
    rp_err err;
    rp_bs_transport *probe = rp_bs_tcp_new(&err);
    int port = 0;
    assert_int_equal(probe->listen(probe, "127.0.0.1", 0, &port, &err), 0);
    probe->destroy(probe); /* the port is free again: node 1 is refused until node 0 takes it */
    rp_bs_transport *srv = rp_bs_tcp_new(&err), *cli = rp_bs_tcp_new(&err);
    node n0 = make_node(srv, 0, 2, 1, FP, 5000), n1 = make_node(cli, 1, 2, 1, FP, 5000);
    n0.host = n1.host = "127.0.0.1";
    n0.port = n1.port = port;
    n0.delay_ms = 300;
    set_id(n0.id, 5);
    start(&n1);
    start(&n0);
    finish(&n0);
    finish(&n1);
    if (n0.rc) fail_msg("node 0: %s", n0.err.msg);
    if (n1.rc) fail_msg("node 1: %s", n1.err.msg);
    assert_memory_equal(n0.id, n1.id, RP_BS_UNIQUE_ID_BYTES);
    srv->destroy(srv);
    cli->destroy(cli);
}

/* ---- refusals --------------------------------------------------------------- */

/* A hello written by hand from the documented layout (bootstrap.c). */
static void raw_hello(uint8_t *m, const char *mg, uint32_t version, uint32_t rank, uint32_t nnodes, uint32_t gpus,
                      uint64_t fp) {
    memset(m, 0, 64);
    memcpy(m, mg, 4);
    for (int i = 0; i < 4; i++) {
        m[4 + i] = (uint8_t)(version >> (8 * i));
        m[8 + i] = (uint8_t)(rank >> (8 * i));
        m[12 + i] = (uint8_t)(nnodes >> (8 * i));
        m[16 + i] = (uint8_t)(gpus >> (8 * i));
    }
    for (int i = 0; i < 8; i++) m[24 + i] = (uint8_t)(fp >> (8 * i));
}

static int raw_connect(fake *f) {
    int fd;
    rp_err err;
    assert_int_equal(fake_connect(&f->base, "x", 1, 100, &fd, &err), 0);
    return fd;
}

/* Not replay (garbage where the magic should be, or silence then close):
 * dropped, and node 0 still serves the real node. */
static void test_stray_dropped(void **state) {
    (void)state;
    fake *f = fake_new();
    node n0 = make_node(&f->base, 0, 2, 1, FP, 3000), n1 = make_node(&f->base, 1, 2, 1, FP, 3000);
    set_id(n0.id, 9);
    int bound;
    f->base.listen(&f->base, "x", 1, &bound, NULL);
    uint8_t junk[64];
    memset(junk, 'G', sizeof junk); /* "GET / HTTP/1.1" would look the same */
    int stray = raw_connect(f);
    assert_int_equal(write(stray, junk, sizeof junk), (ssize_t)sizeof junk);
    int silent = raw_connect(f);
    close(silent);
    start(&n0);
    nap(100);
    start(&n1);
    finish(&n0);
    finish(&n1);
    if (n0.rc) fail_msg("node 0: %s", n0.err.msg);
    if (n1.rc) fail_msg("node 1: %s", n1.err.msg);
    assert_memory_equal(n0.id, n1.id, RP_BS_UNIQUE_ID_BYTES);
    close(stray);
    f->base.destroy(&f->base);
}

/* A raw hello to node 0; returns node 0's answer's status and reason. */
static void raw_refused(const uint8_t *hello, const char *want_server) {
    fake *f = fake_new();
    node n0 = make_node(&f->base, 0, 2, 1, FP, 3000);
    start(&n0);
    nap(50);
    int fd = raw_connect(f);
    assert_int_equal(write(fd, hello, 64), 64);
    uint8_t m[448];
    size_t got = 0;
    while (got < sizeof m) {
        ssize_t k = read(fd, m + got, sizeof m - got);
        assert_true(k > 0);
        got += (size_t)k;
    }
    finish(&n0);
    expect_msg(&n0, want_server);
    assert_memory_equal(m, "rpTP", 4);
    assert_int_equal(m[8], 1); /* refused */
    if (!strstr((const char *)m + 192, want_server)) fail_msg("reason sent: \"%s\"", (const char *)m + 192);
    close(fd);
    f->base.destroy(&f->base);
}

static void test_version_mismatch(void **state) {
    (void)state;
    uint8_t h[64];
    raw_hello(h, "rpTP", 2, 1, 2, 1, FP);
    raw_refused(h, "a node speaks bootstrap protocol version 2, node 0 version 1");
    raw_hello(h, "rpTP", 1, 5, 2, 1, FP);
    raw_refused(h, "a node says --node-rank 5, but with --nnodes 2 the other nodes are 1..1");
}

/* Node 0 refuses; the offender hears why, a node already waiting hears
 * that the launch is off. */
static void refused_world(node *n, int count, int offender, const char *want) {
    for (int k = 0; k < count; k++) start(&n[k]);
    for (int k = 0; k < count; k++) finish(&n[k]);
    expect_msg(&n[0], want);
    for (int k = 1; k < count; k++) {
        char full[256];
        snprintf(full, sizeof full, "node 0 refused this node: %s%s", k == offender ? "" : "launch aborted: ", want);
        expect_msg(&n[k], full);
    }
}

static void test_world_mismatch(void **state) {
    (void)state;
    fake *f = fake_new();
    node n[2] = {make_node(&f->base, 0, 2, 2, FP, 3000), make_node(&f->base, 1, 2, 1, FP, 3000)};
    refused_world(n, 2, 1, "node 1 was launched with --nnodes 2 and 1 GPUs per node, node 0 with --nnodes 2 and 2");
    f->base.destroy(&f->base);
}

static void test_duplicate_rank(void **state) {
    (void)state;
    fake *f = fake_new();
    node n[3] = {make_node(&f->base, 0, 4, 1, FP, 3000), make_node(&f->base, 1, 4, 1, FP, 3000),
                 make_node(&f->base, 1, 4, 1, FP, 3000)};
    for (int k = 0; k < 3; k++) start(&n[k]);
    for (int k = 0; k < 3; k++) finish(&n[k]);
    expect_msg(&n[0], "two nodes say --node-rank 1");
    /* whichever came second is the offender, the other was aborted */
    int refused = !!strstr(n[1].err.msg, "refused this node: two nodes") + !!strstr(n[2].err.msg, "refused this node: two nodes");
    int aborted = !!strstr(n[1].err.msg, "launch aborted: two nodes") + !!strstr(n[2].err.msg, "launch aborted: two nodes");
    assert_int_equal(refused, 1);
    assert_int_equal(aborted, 1);
    f->base.destroy(&f->base);
}

static void test_other_model(void **state) {
    (void)state;
    fake *f = fake_new();
    node n[3] = {make_node(&f->base, 0, 4, 1, FP, 3000), make_node(&f->base, 1, 4, 1, FP, 3000),
                 make_node(&f->base, 2, 4, 1, FP + 1, 3000)};
    start(&n[0]);
    start(&n[1]);
    nap(500); /* node 1 is held when node 2 arrives */
    start(&n[2]);
    for (int k = 0; k < 3; k++) finish(&n[k]);
    expect_msg(&n[0], "node 2 runs a different model or tensor-parallel size");
    expect_msg(&n[2], "node 0 refused this node: node 2 runs a different model");
    expect_msg(&n[1], "node 0 refused this node: launch aborted: node 2 runs a different model");
    f->base.destroy(&f->base);
}

static void test_timeouts(void **state) {
    (void)state;
    /* node 0 waits for nodes 2 and 3, which never come; node 1 hears it */
    fake *f = fake_new();
    node n[2] = {make_node(&f->base, 0, 4, 2, FP, 400), make_node(&f->base, 1, 4, 2, FP, 3000)};
    refused_world(n, 2, -1, "timed out after 0.4 s waiting for node(s) 2, 3 of 4 to connect to test:4242");
    f->base.destroy(&f->base);
    /* no node 0 at all */
    f = fake_new();
    node lone = make_node(&f->base, 1, 2, 1, FP, 300);
    start(&lone);
    finish(&lone);
    expect_msg(&lone, "could not reach node 0 at test:4242 within 0.3 s");
    expect_msg(&lone, "Connection refused");
    assert_true(f->refusals >= 3); /* with backoff: 50, 100, 150 (the rest) ms */
    f->base.destroy(&f->base);
    /* node 0 takes the hello and says nothing */
    f = fake_new();
    int bound;
    f->base.listen(&f->base, "x", 1, &bound, NULL);
    lone = make_node(&f->base, 1, 2, 1, FP, 300);
    start(&lone);
    finish(&lone);
    expect_msg(&lone, "took this node's hello but sent no NCCL unique id within 0.3 s");
    f->base.destroy(&f->base);
}

/* What answers at the address is not replay's node 0, or is another build. */
static void *bad_server(void *arg) {
    void **a = arg;
    fake *f = a[0];
    const uint8_t *answer = a[1];
    int fd;
    assert_int_equal(fake_accept(&f->base, 3000, &fd, NULL), 0);
    uint8_t h[64];
    size_t got = 0;
    while (got < sizeof h) {
        ssize_t k = read(fd, h + got, sizeof h - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    assert_int_equal(write(fd, answer, 448), 448);
    close(fd);
    return NULL;
}

static void client_against(const uint8_t *answer, const char *want) {
    fake *f = fake_new();
    int bound;
    f->base.listen(&f->base, "x", 1, &bound, NULL);
    void *args[2] = {f, (void *)answer};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bad_server, args), 0);
    node n1 = make_node(&f->base, 1, 2, 1, FP, 3000);
    start(&n1);
    finish(&n1);
    pthread_join(th, NULL);
    expect_msg(&n1, want);
    f->base.destroy(&f->base);
}

static void test_bad_node0(void **state) {
    (void)state;
    uint8_t m[448];
    memset(m, 'H', sizeof m);
    client_against(m, "test:4242 answered, but not as replay's node 0");
    memset(m, 0, sizeof m);
    memcpy(m, "rpTP", 4);
    m[4] = 3; /* version 3 */
    client_against(m, "node 0 speaks bootstrap protocol version 3, this node version 1");
}

/* The connections kept open carry messages both ways: node 0 to each
 * node and back, empty and 1 MiB ones, over socketpairs and TCP; a receive
 * with nothing sent times out; a message larger than the buffer and a
 * closed link are errors. */
typedef struct big_send {
    int fd;
    const void *buf;
    size_t n;
    int rc;
} big_send;

static void *send_big(void *arg) {
    big_send *b = arg;
    b->rc = rp_bs_send_msg(b->fd, b->buf, b->n, 5000, NULL);
    return NULL;
}

static void exchange(node *n, int count) {
    static uint8_t big[1 << 20], got[1 << 20];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 31 + 7);
    rp_err err;
    size_t len;
    for (int k = 1; k < count; k++) {
        assert_true(n[0].links[k] >= 0 && n[k].links[0] >= 0);
        char msg[32];
        snprintf(msg, sizeof msg, "step for node %d", k);
        assert_int_equal(rp_bs_send_msg(n[0].links[k], msg, strlen(msg), 1000, &err), 0);
        assert_int_equal(rp_bs_send_msg(n[0].links[k], NULL, 0, 1000, &err), 0);
        char buf[64];
        assert_int_equal(rp_bs_recv_msg(n[k].links[0], buf, sizeof buf, &len, 1000, &err), 0);
        assert_int_equal(len, strlen(msg));
        assert_memory_equal(buf, msg, len);
        assert_int_equal(rp_bs_recv_msg(n[k].links[0], buf, sizeof buf, &len, 1000, &err), 0);
        assert_int_equal(len, 0);
        assert_int_equal(rp_bs_recv_msg(n[k].links[0], buf, sizeof buf, &len, 50, &err), RP_BS_TIMEOUT);
    }
    /* 1 MiB from node 1 on its own thread: the socket buffers cannot hold
     * it, so the receiver reads while the sender writes */
    big_send bs = {.fd = n[1].links[0], .buf = big, .n = sizeof big};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, send_big, &bs), 0);
    assert_int_equal(rp_bs_recv_msg(n[0].links[1], got, sizeof got, &len, 5000, &err), 0);
    pthread_join(th, NULL);
    assert_int_equal(bs.rc, 0);
    assert_int_equal(len, sizeof big);
    assert_memory_equal(got, big, sizeof big);
    /* too large for the receiver's buffer */
    char small[4];
    assert_int_equal(rp_bs_send_msg(n[0].links[1], "12345678", 8, 1000, &err), 0);
    assert_int_equal(rp_bs_recv_msg(n[1].links[0], small, sizeof small, &len, 1000, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "a message of 8 bytes, room for 4"));
    /* node 1 goes away: node 0 sees the link closed */
    close(n[1].links[0]);
    assert_int_equal(rp_bs_recv_msg(n[0].links[1], small, sizeof small, &len, 1000, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "closed"));
    for (int k = 1; k < count; k++) {
        close(n[0].links[k]);
        if (k > 1) close(n[k].links[0]);
    }
}

static void test_links(void **state) {
    (void)state;
    fake *f = fake_new();
    node n[4];
    for (int k = 0; k < 4; k++) n[k] = make_node(&f->base, k, 4, 2, FP, 5000), n[k].keep_links = 1;
    for (int k = 0; k < 4; k++) start(&n[k]);
    for (int k = 0; k < 4; k++) finish(&n[k]);
    for (int k = 0; k < 4; k++)
        if (n[k].rc) fail_msg("node %d: %s", k, n[k].err.msg);
    assert_int_equal(n[0].links[0], -1);
    exchange(n, 4);
    f->base.destroy(&f->base);

    rp_err err;
    rp_bs_transport *srv = rp_bs_tcp_new(&err), *cli = rp_bs_tcp_new(&err);
    int port = 0;
    assert_int_equal(srv->listen(srv, "127.0.0.1", 0, &port, &err), 0);
    node t[2] = {make_node(srv, 0, 2, 1, FP, 5000), make_node(cli, 1, 2, 1, FP, 5000)};
    t[1].host = "127.0.0.1", t[1].port = port, t[1].keep_links = 1;
    start(&t[1]);
    t[0].rc = rp_bootstrap_serve(srv, "127.0.0.1", &t[0].w, t[0].id, 5000, t[0].links, &t[0].err);
    finish(&t[1]);
    if (t[0].rc || t[1].rc) fail_msg("tcp: %s / %s", t[0].err.msg, t[1].err.msg);
    exchange(t, 2);
    srv->destroy(srv);
    cli->destroy(cli);
}

static void test_parse_addr(void **state) {
    (void)state;
    char host[64];
    int port;
    assert_int_equal(rp_bs_parse_addr("10.0.0.1:5000", host, sizeof host, &port, NULL), 0);
    assert_string_equal(host, "10.0.0.1");
    assert_int_equal(port, 5000);
    assert_int_equal(rp_bs_parse_addr("node0.cluster:29500", host, sizeof host, &port, NULL), 0);
    assert_string_equal(host, "node0.cluster");
    assert_int_equal(rp_bs_parse_addr("[fe80::1]:29500", host, sizeof host, &port, NULL), 0);
    assert_string_equal(host, "fe80::1");
    assert_int_equal(port, 29500);
    const char *bad[] = {"host", "host:", ":5000", "host:0", "host:70000", "host:12a", "fe80::1:5", "[fe80::1:5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rp_err err;
        if (!rp_bs_parse_addr(bad[i], host, sizeof host, &port, &err)) fail_msg("\"%s\" accepted", bad[i]);
        assert_non_null(strstr(err.msg, "expected HOST:PORT"));
        assert_string_equal(err.param, "dist_init_addr");
    }
}

static void test_world_check(void **state) {
    (void)state;
    rp_err err;
    assert_int_equal(rp_bs_world_check(&(rp_bs_world){.nnodes = 2, .gpus_per_node = 4, .node_rank = 1}, &err), 0);
    assert_int_equal(rp_bs_world_check(&(rp_bs_world){.nnodes = 0, .gpus_per_node = 4}, &err), RP_ERR);
    assert_int_equal(rp_bs_world_check(&(rp_bs_world){.nnodes = 2, .gpus_per_node = 4, .node_rank = 2}, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "--node-rank 2 is outside 0..1"));
    assert_int_equal(rp_bs_world_check(&(rp_bs_world){.nnodes = 3, .gpus_per_node = 1}, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "makes 3 tensor-parallel ranks"));
    assert_int_equal(rp_bs_world_check(&(rp_bs_world){.nnodes = 2, .gpus_per_node = 8}, &err), RP_ERR);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_world),     cmocka_unit_test(test_tcp_loopback),
        cmocka_unit_test(test_tcp_node_first), cmocka_unit_test(test_stray_dropped),
        cmocka_unit_test(test_version_mismatch), cmocka_unit_test(test_world_mismatch),
        cmocka_unit_test(test_duplicate_rank), cmocka_unit_test(test_other_model),
        cmocka_unit_test(test_timeouts),       cmocka_unit_test(test_bad_node0),
        cmocka_unit_test(test_links),          cmocka_unit_test(test_parse_addr),
        cmocka_unit_test(test_world_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
