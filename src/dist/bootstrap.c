/* The bootstrap protocol (bootstrap.h): node 0's side, the other nodes'
 * side, and the wire format. Every message has a fixed size and its
 * integers are little-endian:
 *
 *   hello (node k -> node 0), 64 bytes:
 *     0 magic "rpTP" | 4 version u32 | 8 node_rank u32 | 12 nnodes u32 |
 *     16 gpus_per_node u32 | 20 zero | 24 fingerprint u64 | 32..63 zero
 *   welcome (node 0 -> node k), 448 bytes:
 *     0 magic | 4 version u32 | 8 status u32 (0: welcome, 1: refused) |
 *     12 nnodes u32 | 16 gpus_per_node u32 | 20 node_rank u32 (node k's) |
 *     24 fingerprint u64 | 32..63 zero | 64 unique id (128 bytes) |
 *     192 reason (status 1; 256 bytes, NUL-terminated)
 *
 * The sockets come from the transport; reads and writes here poll with the
 * time left, so a silent peer costs a timeout, never a hang. */
#include "dist/bootstrap.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist/tp_plan.h"
#include "util/log.h"

#define HELLO_BYTES 64
#define WELCOME_BYTES 448
#define WELCOME_ID_AT 64
#define WELCOME_REASON_AT 192
#define REASON_BYTES 256
#define STATUS_WELCOME 0
#define STATUS_REFUSED 1
/* How long node 0 waits for a connected peer's hello before dropping it,
 * and the backoff of the other nodes' connection attempts. */
#define HELLO_WAIT_MS 5000
#define RETRY_FIRST_MS 50
#define RETRY_MAX_MS 1000
#define CONNECT_ATTEMPT_MS 2000

_Static_assert(RP_BS_MAX_NODES >= RP_TP_MAX_SIZE, "a launch has at most one node per rank");

static const uint8_t magic[4] = {'r', 'p', 'T', 'P'};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline) {
    int64_t l = deadline - now_ms();
    return l < 0 ? 0 : l > 1 << 30 ? 1 << 30 : (int)l;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Sends or receives exactly n bytes before the deadline (< 0: none): 0,
 * RP_BS_TIMEOUT, or RP_ERR (closed by the peer, a socket error). */
static int io_all(int fd, void *buf, size_t n, int sending, int64_t deadline, rp_err *err) {
    size_t done = 0;
    while (done < n) {
        struct pollfd pfd = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        int pr = poll(&pfd, 1, deadline < 0 ? -1 : left_ms(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return rp_errf(err, "poll: %s", strerror(errno));
        if (pr == 0) return RP_BS_TIMEOUT;
        ssize_t k = sending ? send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, n - done, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0 && (errno == ECONNRESET || errno == EPIPE)) return rp_errf(err, "the connection was closed (reset)");
        if (k < 0) return rp_errf(err, "%s", strerror(errno));
        if (k == 0) return rp_errf(err, "the connection was closed");
        done += (size_t)k;
    }
    return 0;
}

static void encode_hello(uint8_t *m, const rp_bs_world *w) {
    memset(m, 0, HELLO_BYTES);
    memcpy(m, magic, 4);
    put32(m + 4, RP_BS_PROTOCOL_VERSION);
    put32(m + 8, (uint32_t)w->node_rank);
    put32(m + 12, (uint32_t)w->nnodes);
    put32(m + 16, (uint32_t)w->gpus_per_node);
    put64(m + 24, w->fingerprint);
}

static void encode_welcome(uint8_t *m, const rp_bs_world *w, int node_rank, const uint8_t *unique_id,
                           const char *reason) {
    memset(m, 0, WELCOME_BYTES);
    memcpy(m, magic, 4);
    put32(m + 4, RP_BS_PROTOCOL_VERSION);
    put32(m + 8, reason ? STATUS_REFUSED : STATUS_WELCOME);
    put32(m + 12, (uint32_t)w->nnodes);
    put32(m + 16, (uint32_t)w->gpus_per_node);
    put32(m + 20, (uint32_t)node_rank);
    put64(m + 24, w->fingerprint);
    if (unique_id) memcpy(m + WELCOME_ID_AT, unique_id, RP_BS_UNIQUE_ID_BYTES);
    if (reason) snprintf((char *)m + WELCOME_REASON_AT, REASON_BYTES, "%s", reason);
}

int rp_bs_world_check(const rp_bs_world *w, rp_err *err) {
    if (w->nnodes < 1) return rp_errp(err, "nnodes", "--nnodes %d: at least 1", w->nnodes);
    if (w->node_rank < 0 || w->node_rank >= w->nnodes)
        return rp_errp(err, "node_rank", "--node-rank %d is outside 0..%d (--nnodes %d)", w->node_rank, w->nnodes - 1,
                       w->nnodes);
    if (w->gpus_per_node < 1 || (int64_t)w->nnodes * w->gpus_per_node > RP_TP_MAX_SIZE ||
        rp_tp_size_check(w->nnodes * w->gpus_per_node, NULL))
        return rp_errp(err, "tensor_parallel_size",
                       "--nnodes %d with %d GPUs per node makes %lld tensor-parallel ranks (1, 2, 4 or 8 are "
                       "supported)", w->nnodes, w->gpus_per_node, (long long)w->nnodes * w->gpus_per_node);
    return 0;
}

int rp_bs_parse_addr(const char *addr, char *host, size_t host_size, int *port, rp_err *err) {
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    if (colon && addr[0] == '[') { /* [v6]:port */
        if (hl < 2 || addr[hl - 1] != ']') colon = NULL;
        h = addr + 1, hl -= 2;
    } else if (colon && memchr(addr, ':', hl)) {
        colon = NULL; /* a bare IPv6 address: ambiguous without brackets */
    }
    char *end = NULL;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || hl == 0 || hl >= host_size || !end || *end || end == colon + 1 || p < 1 || p > 65535)
        return rp_errp(err, "dist_init_addr", "--dist-init-addr \"%s\": expected HOST:PORT (IPv6: [ADDR]:PORT), the "
                                              "port 1..65535", addr);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
}

/* ---- node 0 ---------------------------------------------------------------- */

/* Refuses the node on `fd` (when >= 0) with the reason, tells every node
 * already held that the launch is off, and closes them all. */
static int abort_launch(int fd, int offender, int *held, const rp_bs_world *w, rp_err *err) {
    uint8_t m[WELCOME_BYTES];
    char reason[REASON_BYTES];
    const size_t n = strnlen(err->msg, sizeof reason - 1);
    memcpy(reason, err->msg, n);
    reason[n] = 0;
    const int64_t deadline = now_ms() + 1000;
    if (fd >= 0) {
        encode_welcome(m, w, offender, NULL, reason);
        rp_err ignored;
        io_all(fd, m, sizeof m, 1, deadline, &ignored);
        close(fd);
    }
    char other[REASON_BYTES + 32];
    snprintf(other, sizeof other, "launch aborted: %s", reason);
    for (int k = 1; k < w->nnodes; k++) {
        if (held[k] < 0) continue;
        encode_welcome(m, w, k, NULL, other);
        rp_err ignored;
        io_all(held[k], m, sizeof m, 1, deadline, &ignored);
        close(held[k]);
        held[k] = -1;
    }
    return RP_ERR;
}

/* Checks a hello against node 0's world: 0 (node_rank set), 1 (not a
 * replay node: drop it), or RP_ERR with the reason the launch fails. */
static int check_hello(const uint8_t *m, const rp_bs_world *w, const int *held, int *node_rank, rp_err *err) {
    if (memcmp(m, magic, 4)) return 1;
    const uint32_t version = get32(m + 4), rank = get32(m + 8), nnodes = get32(m + 12), gpus = get32(m + 16);
    const uint64_t fp = get64(m + 24);
    *node_rank = (int)rank;
    if (version != RP_BS_PROTOCOL_VERSION)
        return rp_errf(err, "a node speaks bootstrap protocol version %u, node 0 version %d: run the same replay build "
                            "on every node", version, RP_BS_PROTOCOL_VERSION);
    if (nnodes != (uint32_t)w->nnodes || gpus != (uint32_t)w->gpus_per_node)
        return rp_errf(err, "node %u was launched with --nnodes %u and %u GPUs per node, node 0 with --nnodes %d and "
                            "%d GPUs per node", rank, nnodes, gpus, w->nnodes, w->gpus_per_node);
    if (rank < 1 || rank >= (uint32_t)w->nnodes)
        return rp_errf(err, "a node says --node-rank %u, but with --nnodes %d the other nodes are 1..%d", rank,
                       w->nnodes, w->nnodes - 1);
    if (held[rank] >= 0) return rp_errf(err, "two nodes say --node-rank %u", rank);
    if (fp != w->fingerprint)
        return rp_errf(err, "node %u runs a different model or tensor-parallel size (fingerprint %016llx, node 0 "
                            "%016llx): launch every node with the same model and flags", rank,
                       (unsigned long long)fp, (unsigned long long)w->fingerprint);
    return 0;
}

int rp_bootstrap_serve(rp_bs_transport *t, const char *addr, const rp_bs_world *w,
                       const uint8_t unique_id[RP_BS_UNIQUE_ID_BYTES], int timeout_ms, int links[RP_BS_MAX_NODES],
                       rp_err *err) {
    rp_err local;
    if (!err) err = &local; /* abort_launch passes the reason on */
    if (rp_bs_world_check(w, err)) return RP_ERR;
    RP_ASSERT(w->node_rank == 0 && w->nnodes <= RP_BS_MAX_NODES);
    int held[RP_BS_MAX_NODES];
    for (int k = 0; k < RP_BS_MAX_NODES; k++) held[k] = -1;
    if (links)
        for (int k = 0; k < RP_BS_MAX_NODES; k++) links[k] = -1;
    const int64_t deadline = now_ms() + timeout_ms;
    int arrived = 0, dropped = 0;
    while (arrived < w->nnodes - 1) {
        int fd = -1;
        int rc = left_ms(deadline) ? t->accept(t, left_ms(deadline), &fd, err) : RP_BS_TIMEOUT;
        if (rc == RP_BS_TIMEOUT && left_ms(deadline)) continue;
        if (rc == RP_BS_TIMEOUT) {
            char missing[64] = "";
            for (int k = 1, o = 0; k < w->nnodes; k++)
                if (held[k] < 0) o += snprintf(missing + o, sizeof missing - (size_t)o, "%s%d", o ? ", " : "", k);
            rp_errf(err, "timed out after %.1f s waiting for node(s) %s of %d to connect to %s (each started with "
                         "--dist-init-addr %s --node-rank K)%s", timeout_ms / 1000.0, missing, w->nnodes, addr, addr,
                    dropped ? "; connections that did not speak replay's bootstrap protocol were dropped" : "");
            return abort_launch(-1, 0, held, w, err);
        }
        if (rc) {
            rp_err_wrap(err, "waiting for nodes on %s", addr);
            return abort_launch(-1, 0, held, w, err);
        }
        uint8_t m[HELLO_BYTES];
        int wait = left_ms(deadline) < HELLO_WAIT_MS ? left_ms(deadline) : HELLO_WAIT_MS;
        rp_err io_err;
        int node = 0;
        if (io_all(fd, m, sizeof m, 0, now_ms() + wait, &io_err) || (rc = check_hello(m, w, held, &node, err)) == 1) {
            rp_log_warn("bootstrap: dropped a connection to %s that is not a replay node", addr);
            close(fd);
            dropped++;
            continue;
        }
        if (rc) return abort_launch(fd, node, held, w, err);
        held[node] = fd;
        arrived++;
    }
    for (int k = 1; k < w->nnodes; k++) {
        uint8_t m[WELCOME_BYTES];
        encode_welcome(m, w, k, unique_id, NULL);
        int rc = io_all(held[k], m, sizeof m, 1, now_ms() + HELLO_WAIT_MS, err);
        if (rc) {
            if (rc == RP_BS_TIMEOUT) rp_errf(err, "timed out");
            rp_err_wrap(err, "sending node %d the NCCL unique id", k);
            return abort_launch(-1, 0, held, w, err);
        }
    }
    for (int k = 1; k < w->nnodes; k++) {
        if (links) links[k] = held[k];
        else close(held[k]);
    }
    return 0;
}

/* ---- the other nodes ---------------------------------------------------- */

static int connect_retrying(rp_bs_transport *t, const char *host, int port, int64_t deadline, int timeout_ms, int *fd,
                            rp_err *err) {
    int backoff = RETRY_FIRST_MS;
    for (;;) {
        int attempt = left_ms(deadline) < CONNECT_ATTEMPT_MS ? left_ms(deadline) : CONNECT_ATTEMPT_MS;
        int rc = t->connect(t, host, port, attempt, fd, err);
        if (rc != RP_BS_RETRY) return rc;
        if (!left_ms(deadline)) {
            rp_err_wrap(err, "could not reach node 0 at %s:%d within %.1f s (is node 0 started with --dist-init-addr "
                             "%s:%d?)", host, port, timeout_ms / 1000.0, host, port);
            return RP_ERR;
        }
        int nap = backoff < left_ms(deadline) ? backoff : left_ms(deadline);
        struct timespec ts = {.tv_sec = nap / 1000, .tv_nsec = (long)(nap % 1000) * 1000000};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 < RETRY_MAX_MS ? backoff * 2 : RETRY_MAX_MS;
    }
}

static int read_welcome(const uint8_t *m, const char *host, int port, const rp_bs_world *w,
                        uint8_t unique_id[RP_BS_UNIQUE_ID_BYTES], rp_err *err) {
    if (memcmp(m, magic, 4))
        return rp_errf(err, "%s:%d answered, but not as replay's node 0 (is --dist-init-addr the address of node 0?)",
                       host, port);
    const uint32_t version = get32(m + 4);
    if (version != RP_BS_PROTOCOL_VERSION)
        return rp_errf(err, "node 0 speaks bootstrap protocol version %u, this node version %d: run the same replay "
                            "build on every node", version, RP_BS_PROTOCOL_VERSION);
    if (get32(m + 8) != STATUS_WELCOME) {
        char reason[REASON_BYTES];
        memcpy(reason, m + WELCOME_REASON_AT, REASON_BYTES);
        reason[REASON_BYTES - 1] = 0;
        return rp_errf(err, "node 0 refused this node: %s", reason);
    }
    if (get32(m + 12) != (uint32_t)w->nnodes || get32(m + 16) != (uint32_t)w->gpus_per_node ||
        get32(m + 20) != (uint32_t)w->node_rank || get64(m + 24) != w->fingerprint)
        return rp_errf(err, "node 0's welcome does not describe this node's launch (a protocol error)");
    memcpy(unique_id, m + WELCOME_ID_AT, RP_BS_UNIQUE_ID_BYTES);
    return 0;
}

int rp_bootstrap_join(rp_bs_transport *t, const char *host, int port, const rp_bs_world *w, int timeout_ms,
                      uint8_t unique_id[RP_BS_UNIQUE_ID_BYTES], int *link, rp_err *err) {
    if (link) *link = -1;
    if (rp_bs_world_check(w, err)) return RP_ERR;
    RP_ASSERT(w->node_rank > 0);
    const int64_t deadline = now_ms() + timeout_ms;
    int fd = -1;
    if (connect_retrying(t, host, port, deadline, timeout_ms, &fd, err)) return RP_ERR;
    uint8_t hello[HELLO_BYTES], m[WELCOME_BYTES];
    encode_hello(hello, w);
    int rc = io_all(fd, hello, sizeof hello, 1, deadline, err);
    if (!rc) rc = io_all(fd, m, sizeof m, 0, deadline, err);
    if (rc == RP_BS_TIMEOUT)
        rc = rp_errf(err, "node 0 at %s:%d took this node's hello but sent no NCCL unique id within %.1f s (are all "
                          "%d nodes started?)", host, port, timeout_ms / 1000.0, w->nnodes);
    else if (rc) rc = rp_err_wrap(err, "node 0 at %s:%d", host, port);
    else rc = read_welcome(m, host, port, w, unique_id, err);
    if (!rc && link) *link = fd;
    else close(fd);
    return rc;
}

/* ---- messages on a link ---------------------------------------------------- */

/* Once a message has begun, the rest must follow within this. */
#define MSG_REST_MS 30000

int rp_bs_send_msg(int fd, const void *buf, size_t n, int timeout_ms, rp_err *err) {
    if (n > RP_BS_MAX_MSG_BYTES) return rp_errf(err, "a message of %zu bytes (at most %u)", n, RP_BS_MAX_MSG_BYTES);
    uint8_t len[4];
    put32(len, (uint32_t)n);
    const int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    int rc = io_all(fd, len, sizeof len, 1, deadline, err);
    if (!rc && n) rc = io_all(fd, (void *)buf, n, 1, deadline, err);
    if (rc == RP_BS_TIMEOUT) return rp_errf(err, "sending a message: timed out");
    return rc;
}

int rp_bs_recv_msg(int fd, void *buf, size_t cap, size_t *n, int timeout_ms, rp_err *err) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr;
    while ((pr = poll(&pfd, 1, timeout_ms < 0 ? -1 : timeout_ms)) < 0 && errno == EINTR) {}
    if (pr < 0) return rp_errf(err, "poll: %s", strerror(errno));
    if (pr == 0) return RP_BS_TIMEOUT;
    uint8_t len[4];
    const int64_t rest = now_ms() + MSG_REST_MS;
    int rc = io_all(fd, len, sizeof len, 0, rest, err);
    const uint32_t size = rc ? 0 : get32(len);
    if (!rc && size > cap) return rp_errf(err, "a message of %u bytes, room for %zu", size, cap);
    if (!rc && size) rc = io_all(fd, buf, size, 0, rest, err);
    if (rc == RP_BS_TIMEOUT) return rp_errf(err, "a message stopped halfway");
    if (rc) return RP_ERR;
    *n = size;
    return 0;
}
