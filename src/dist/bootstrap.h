/* Multi-node start-up for tensor parallelism: node 0 hands every other node
 * the NCCL unique id and checks that they were all launched alike, as
 * SGLang's --dist-init-addr does (docs/tensor-parallel.md).
 *
 * Node 0 listens on --dist-init-addr HOST:PORT. Each other node connects
 * (retrying with backoff until its timeout: the nodes may start in any
 * order) and sends a hello: magic, protocol version, its --node-rank, its
 * --nnodes and GPUs per node, and the model fingerprint (tp_plan.h). Once
 * every node has said hello and all agree, node 0 answers each with a
 * welcome carrying the 128-byte NCCL unique id; then every GPU thread of
 * every node calls ncclCommInitRank. A node that disagrees (protocol
 * version, world size, GPUs per node, a node rank out of range or taken
 * twice, another model) fails the launch on node 0 and on every node that
 * connected, each with the reason; a connection that does not start with
 * the magic is not replay and is dropped. The wire format is in bootstrap.c.
 *
 * The connections stay open where the caller asks for them: they are the
 * control channel over which node 0 sends each step to the other nodes
 * (length-prefixed messages, rp_bs_send_msg / rp_bs_recv_msg).
 *
 * Sockets come from a transport (listen, accept, connect) so tests can run
 * the same protocol code over socketpairs as over loopback TCP. */
#ifndef RP_DIST_BOOTSTRAP_H
#define RP_DIST_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define RP_BS_UNIQUE_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define RP_BS_PROTOCOL_VERSION 1
/* What a transport's accept and connect return besides 0 and RP_ERR. */
#define RP_BS_TIMEOUT (-2) /* no connection within the time given */
#define RP_BS_RETRY (-3)   /* the peer is not listening yet */
#define RP_BS_MAX_NODES 8  /* nodes of one launch: at most one per tensor-parallel rank */
#define RP_BS_MAX_MSG_BYTES (64u << 20)

/* How a launch is laid out, as each node was told on its command line. */
typedef struct rp_bs_world {
    int nnodes;        /* --nnodes */
    int gpus_per_node; /* tensor-parallel ranks on each node */
    int node_rank;     /* --node-rank: 0 serves the unique id */
    uint64_t fingerprint;
} rp_bs_world;

typedef struct rp_bs_transport rp_bs_transport;
struct rp_bs_transport {
    /* Node 0: starts listening; *bound_port is the port bound (an ephemeral
     * one for port 0). */
    int (*listen)(rp_bs_transport *t, const char *host, int port, int *bound_port, rp_err *err);
    /* 0 and a connected socket in *fd, RP_BS_TIMEOUT (none this time:
     * the caller checks its own deadline), or RP_ERR. */
    int (*accept)(rp_bs_transport *t, int timeout_ms, int *fd, rp_err *err);
    /* One attempt: 0 and *fd, RP_BS_RETRY (refused, unreachable, timed
     * out, a name that does not resolve yet: try again later), or RP_ERR
     * (no socket can be made: give up). */
    int (*connect)(rp_bs_transport *t, const char *host, int port, int timeout_ms, int *fd, rp_err *err);
    void (*destroy)(rp_bs_transport *t);
};

/* TCP (IPv4 or IPv6, whatever the host resolves to). */
rp_bs_transport *rp_bs_tcp_new(rp_err *err);

/* "HOST:PORT" or "[V6ADDR]:PORT" into host and port (1..65535). */
int rp_bs_parse_addr(const char *addr, char *host, size_t host_size, int *port, rp_err *err);

/* A world that can be launched: nnodes >= 1, node_rank in [0, nnodes),
 * nnodes * gpus_per_node a tensor-parallel size (1, 2, 4, 8). */
int rp_bs_world_check(const rp_bs_world *w, rp_err *err);

/* Node 0, its transport already listening: waits up to timeout_ms for
 * nodes 1 .. nnodes - 1, checks them against w, sends each the unique id.
 * addr (for messages) is what the other nodes were told to connect to.
 * links: NULL closes the connections; else links[k] is node k's open
 * socket (k in 1 .. nnodes - 1, the others -1), the caller's to close. */
int rp_bootstrap_serve(rp_bs_transport *t, const char *addr, const rp_bs_world *w,
                       const uint8_t unique_id[RP_BS_UNIQUE_ID_BYTES], int timeout_ms, int links[RP_BS_MAX_NODES],
                       rp_err *err);

/* Node w->node_rank > 0: connects to host:port (retrying until timeout_ms),
 * says hello, and waits for the unique id, all within timeout_ms. link:
 * NULL closes the connection; else *link is the open socket to node 0. */
int rp_bootstrap_join(rp_bs_transport *t, const char *host, int port, const rp_bs_world *w, int timeout_ms,
                      uint8_t unique_id[RP_BS_UNIQUE_ID_BYTES], int *link, rp_err *err);

/* One message on a link: its byte count (u32, little-endian), then its
 * bytes, at most RP_BS_MAX_MSG_BYTES. timeout_ms < 0 waits as long as it
 * takes (a node waiting for node 0's next step). */
int rp_bs_send_msg(int fd, const void *buf, size_t n, int timeout_ms, rp_err *err);
/* Receives one message into buf (cap bytes), its size in *n: 0;
 * RP_BS_TIMEOUT when none began within timeout_ms; RP_ERR when the link
 * closed (the peer is gone), the message is larger than cap, or it stopped
 * halfway (the link is then unusable). */
int rp_bs_recv_msg(int fd, void *buf, size_t cap, size_t *n, int timeout_ms, rp_err *err);

#endif
