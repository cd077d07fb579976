/* The tensor-parallel backend (backend.h: rp_backend_tp_new): one model over
 * N ranks, each a CPU or CUDA backend running its shard on its own host
 * thread (docs/tensor-parallel.md: one process per node, one thread per
 * GPU).
 *
 * The engine sees one backend. Each call (forward, reading the results) is
 * handed to every rank thread at once and returns when all have done it:
 * the ranks must make the same collectives in the same order, so they all
 * run every call, and a CUDA rank's collectives block nothing on the host
 * (they are enqueued on its stream). The results are rank 0's: every rank
 * holds the same logits (gathered) and draws the same tokens (the
 * counter-based RNG, seeded per sequence and step), and the other ranks'
 * copies are read into scratch so that their slots stay in step.
 *
 * A rank that fails aborts the group's communicator, so that the others,
 * waiting for it inside a collective, fail too rather than hang; the
 * backend is unusable afterwards. A rank that never fails but never
 * finishes either (a peer on another node gone, a collective that never
 * meets) is the watchdog's: the caller's thread, waiting for the ranks,
 * wakes every WATCH_POLL_MS to check the deadline, the communicators'
 * errors and the links (backend.h says what it then does).
 *
 * Node 0 of several also runs a heartbeat thread that pings the other
 * nodes whenever it has sent them nothing for a quarter of the step
 * timeout; sends on a link are serialised by send_mu. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/tp_step_msg.h"
#include "dist/bootstrap.h"
#include "util/log.h"

/* How often the watchdog looks at a call in progress. */
#define WATCH_POLL_MS 100
/* After an abort, how long the ranks have to return: a rank thread still
 * inside its call then is stuck outside any collective (a device that no
 * longer answers), and the call fails without it. */
#define ABORT_GRACE_MS 10000
/* Another node whose link to node 0 closed during a call: the call may
 * still finish (node 0 shut down after its last collective met, and this
 * node is reading its last results), or never (node 0 died with this
 * node's collectives waiting for it). A step's work after its last
 * collective takes milliseconds: past this, it is the second case. */
#define LINK_CLOSED_GRACE_MS 5000

typedef enum tp_op {
    OP_NONE = 0,
    OP_INIT,
    OP_FORWARD,
    OP_READ_TOKENS,
    OP_READ_LOGITS,
    OP_SET_GRAPHS,
    OP_PROFILE,
    OP_STATS,
    OP_SAMPLE_MASKED,
    OP_QUIT
} tp_op;

static const char *op_name(tp_op op) {
    switch (op) {
    case OP_INIT: return "setup (communicators, weights, graphs)";
    case OP_FORWARD: return "forward";
    case OP_READ_TOKENS: return "read of the sampled tokens";
    case OP_READ_LOGITS: return "read of the logits";
    case OP_SET_GRAPHS: return "graph switch";
    case OP_PROFILE: return "profile read";
    case OP_STATS: return "stats read";
    case OP_SAMPLE_MASKED: return "sampling with token masks";
    case OP_QUIT: return "shutdown";
    default: return "call";
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct tp_backend tp_backend;

typedef struct tp_rank {
    tp_backend *tb;
    int index; /* among this process's ranks; its global rank is rank_offset + index */
    pthread_t thread;
    int started;
    rp_backend *be;
    rp_comm *comm;
    int owns_comm;
    rp_comm *host; /* GPU ranks: this process's ranks' host barrier (rp_backend_tp.host) */
    int rc;
    rp_err err;
    /* the results of ranks other than 0, read and dropped */
    int32_t *tokens;
    float *logprobs, *logits;
    rp_top_logprobs *top;
} tp_rank;

struct tp_backend {
    rp_backend base;
    rp_tp_backend_config tcfg;
    rp_backend_config rank_cfg; /* every rank's, but for its tp, device and comm */
    int n;
    tp_rank ranks[RP_TP_MAX_SIZE];
    rp_comm_local_group *group, *host_group; /* CPU ranks' communicator; GPU ranks' host barrier */
    int owns_group;
    int failed; /* a rank failed or the watchdog fired: the group's communicator is gone */
    int wedged; /* a rank thread did not return after the abort: it cannot be joined */
    rp_err fail_err; /* why (what node 0 tells the other nodes) */
    int step_timeout_ms, setup_timeout_ms;
    /* the first step's results were read: later calls get step_timeout_ms
     * (a GPU's forward only enqueues; the read waits for it) */
    int stepped;
    atomic_int cancel; /* set by an abort: a rank still making its NCCL communicator gives up */
    /* the call in progress, handed to every rank */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation;
    int pending; /* ranks still working on the call */
    tp_op op;
    const rp_batch *batch;
    int32_t *tokens;
    float *logprobs, *logits;
    rp_top_logprobs *top;
    const uint32_t *masks;
    int num_masks, last_num_logits;
    const int32_t *mask_of_row;
    int graphs_enabled;
    rp_profile_entry *prof;
    int prof_max, prof_n;
    rp_backend_stats stats;
    /* node 0 of several: the other nodes' links, the step message buffer */
    int links[RP_BS_MAX_NODES];
    int num_links;
    int node0_link; /* another node: its link to node 0, else -1 */
    uint8_t *msg;
    size_t msg_cap;
    pthread_mutex_t send_mu; /* a message on the links, whole: the engine's thread or the heartbeat */
    int64_t last_send_ms;    /* under send_mu */
    int links_closed;        /* under send_mu: a shutdown or an abort was sent, nothing follows */
    pthread_t heartbeat;
    int heartbeat_started, heartbeat_stop; /* stop: under hb_mu */
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv;
    rp_backend_ops ops; /* tp_ops, without sample_masked where the ranks lack it */
};

/* Rank i's part of the call in progress. */
static int rank_run(tp_backend *tb, tp_rank *r, tp_op op) {
    rp_backend *be = r->be;
    const int lead = r->index == 0;
    switch (op) {
    case OP_INIT: {
        rp_backend_config cfg = tb->rank_cfg;
        const int global = tb->tcfg.rank_offset + r->index;
        const int cuda = !strcmp(tb->tcfg.device, "cuda");
        rp_comm *host = NULL, *comm;
        if (cuda) {
            cfg.device_id = tb->rank_cfg.device_id + (tb->tcfg.one_gpu ? 0 : r->index);
            if (!(host = rp_comm_local_new(tb->host_group, r->index, &r->err))) return RP_ERR;
            comm = tb->tcfg.one_gpu ? rp_comm_one_gpu_new(tb->group, global, cfg.device_id, &r->err)
                                    : rp_comm_nccl_new(tb->tcfg.nccl_id, tb->tcfg.plan->size, global, cfg.device_id,
                                                       tb->setup_timeout_ms, &tb->cancel, &r->err);
        } else {
            comm = rp_comm_local_new(tb->group, global, &r->err);
        }
        /* published under mu: the watchdog aborts them from its thread */
        pthread_mutex_lock(&tb->mu);
        r->host = host;
        r->comm = comm;
        r->owns_comm = comm != NULL;
        pthread_mutex_unlock(&tb->mu);
        if (!comm) return RP_ERR;
        /* one node: small sums through peer memory (every rank makes it at
         * once, over the host communicator; comm then belongs to it) */
        if (cuda && tb->tcfg.ranks == tb->tcfg.plan->size && !tb->tcfg.disable_custom_all_reduce) {
            rp_comm *p2p = rp_comm_p2p_new(comm, host, cfg.device_id, RP_P2P_SLOT_BYTES,
                                           (size_t)tb->tcfg.shards[r->index]->cfg.hidden_size, &r->err);
            if (!p2p) return RP_ERR;
            pthread_mutex_lock(&tb->mu);
            r->comm = p2p;
            pthread_mutex_unlock(&tb->mu);
        }
        cfg.tp = (rp_backend_tp){.size = tb->tcfg.plan->size,
                                 .rank = global,
                                 .comm = r->comm,
                                 .plan = tb->tcfg.plan,
                                 .host = r->host,
                                 .shared_gpu = cuda && tb->tcfg.one_gpu};
        r->be = cuda ? rp_backend_cuda_new(tb->tcfg.shards[r->index], &cfg, &r->err)
                     : rp_backend_cpu_new(tb->tcfg.shards[r->index], &cfg, &r->err);
        if (!r->be) return RP_ERR;
        const int L = r->be->cfg.max_logit_rows, V = rp_backend_vocab(r->be);
        r->tokens = calloc((size_t)L, sizeof *r->tokens);
        r->logprobs = calloc((size_t)L, sizeof *r->logprobs);
        r->top = calloc((size_t)L, sizeof *r->top);
        r->logits = lead ? NULL : malloc((size_t)L * V * sizeof *r->logits);
        if (!r->tokens || !r->logprobs || !r->top || (!lead && !r->logits)) return rp_errf(&r->err, "out of memory");
        return 0;
    }
    case OP_FORWARD:
        return rp_backend_forward(be, tb->batch, &r->err);
    case OP_READ_TOKENS:
        return be->ops->read_tokens(be, lead ? tb->tokens : r->tokens, lead ? tb->logprobs : r->logprobs,
                                    lead ? tb->top : r->top, &r->err);
    case OP_READ_LOGITS:
        return rp_backend_read_logits(be, lead ? tb->logits : r->logits, &r->err);
    case OP_SAMPLE_MASKED:
        return be->ops->sample_masked(be, tb->masks, tb->num_masks, tb->mask_of_row, &r->err);
    case OP_SET_GRAPHS:
        if (be->ops->set_graphs) be->ops->set_graphs(be, tb->graphs_enabled);
        return 0;
    case OP_PROFILE:
        if (lead) tb->prof_n = be->ops->profile ? be->ops->profile(be, tb->prof, tb->prof_max) : 0;
        return 0;
    case OP_STATS:
        if (lead && be->ops->stats) be->ops->stats(be, &tb->stats);
        return 0;
    default:
        return 0;
    }
}

static void *rank_main(void *arg) {
    tp_rank *r = arg;
    tp_backend *tb = r->tb;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&tb->mu);
        while (tb->generation == seen) pthread_cond_wait(&tb->cv_work, &tb->mu);
        seen = tb->generation;
        tp_op op = tb->op;
        pthread_mutex_unlock(&tb->mu);
        if (op == OP_QUIT) {
            /* every rank at once: finalizing an NCCL communicator waits for
             * the other ranks' */
            rp_backend_destroy(r->be);
            r->be = NULL;
            pthread_mutex_lock(&tb->mu);
            rp_comm *comm = r->owns_comm ? r->comm : NULL;
            r->comm = NULL;
            r->owns_comm = 0;
            pthread_mutex_unlock(&tb->mu);
            rp_comm_free(comm);
        }
        int rc = op == OP_QUIT ? 0 : rank_run(tb, r, op);
        /* the others may be waiting for this rank inside a collective, at
         * the host barrier, or in making their communicators */
        if (rc) atomic_store(&tb->cancel, 1);
        if (rc && r->comm) rp_comm_abort(r->comm);
        if (rc && r->host) rp_comm_abort(r->host);
        pthread_mutex_lock(&tb->mu);
        r->rc = rc;
        if (--tb->pending == 0) pthread_cond_broadcast(&tb->cv_done);
        pthread_mutex_unlock(&tb->mu);
        if (op == OP_QUIT) return NULL;
    }
}

/* Sends the message in tb->msg to every other node, under send_mu; once a
 * shutdown or an abort went out, nothing more does. */
static int send_links(tp_backend *tb, const uint8_t *msg, size_t len, int final, rp_err *err) {
    int rc = 0;
    pthread_mutex_lock(&tb->send_mu);
    for (int k = 0; k < tb->num_links && !tb->links_closed && !rc; k++)
        if (rp_bs_send_msg(tb->links[k], msg, len, tb->step_timeout_ms, err))
            rc = rp_err_wrap(err, "sending a step to node %d", k + 1);
    tb->last_send_ms = now_ms();
    if (final && !tb->links_closed) {
        tb->links_closed = 1;
        /* the other nodes see the link close after the message (a node in
         * a call notices it there, not only at its next read) */
        for (int k = 0; k < tb->num_links; k++) shutdown(tb->links[k], SHUT_WR);
    }
    pthread_mutex_unlock(&tb->send_mu);
    return rc;
}

/* Node 0 of several: the other nodes make the call too (their ranks'
 * collectives meet this node's). */
static int send_step(tp_backend *tb, tp_op op, rp_err *err) {
    rp_step_op sop;
    size_t len = 0;
    int rc;
    switch (op) {
    case OP_FORWARD: sop = RP_STEP_FORWARD; break;
    case OP_READ_TOKENS: sop = RP_STEP_READ_TOKENS; break;
    case OP_READ_LOGITS: sop = RP_STEP_READ_LOGITS; break;
    case OP_SET_GRAPHS: sop = RP_STEP_SET_GRAPHS; break;
    case OP_SAMPLE_MASKED: sop = RP_STEP_SAMPLE_MASKED; break;
    case OP_QUIT: sop = RP_STEP_SHUTDOWN; break;
    default: return 0; /* this node's own business (stats, profile) */
    }
    if (sop == RP_STEP_SAMPLE_MASKED)
        rc = rp_step_msg_encode_masks(tb->masks, tb->num_masks, rp_token_mask_words(tb->base.model->cfg.vocab_size),
                                      tb->mask_of_row, tb->last_num_logits, &tb->msg, &tb->msg_cap, &len, err);
    else
        rc = rp_step_msg_encode(sop, tb->graphs_enabled, tb->batch, tb->rank_cfg.page_size, &tb->msg, &tb->msg_cap,
                                &len, err);
    return rc ? RP_ERR : send_links(tb, tb->msg, len, op == OP_QUIT, err);
}

/* Node 0 of several, once the group failed: the other nodes learn why (an
 * abort, then the links shut), rather than waiting for this node's ranks. */
static void send_abort(tp_backend *tb) {
    if (!tb->num_links) return;
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    char reason[RP_STEP_REASON_BYTES];
    snprintf(reason, sizeof reason, "%s", tb->fail_err.msg);
    if (!rp_step_msg_encode_abort(reason, &buf, &cap, &len, NULL)) send_links(tb, buf, len, 1, NULL);
    free(buf);
}

/* The peer shut its side of the link (it exited, was killed, or stopped
 * sending for good); data it sent before may still wait to be read. */
static int link_closed(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Pings the other nodes whenever nothing went to them for a quarter of
 * the step timeout (tp_step_msg.h: RP_STEP_PING). A ping that cannot be
 * sent is left to the next call, which fails on the same link; a node
 * whose link closed while this node is idle is logged at once (the next
 * call fails on it). */
static void *heartbeat_main(void *arg) {
    tp_backend *tb = arg;
    const int interval_ms = tb->step_timeout_ms / 4 > 0 ? tb->step_timeout_ms / 4 : 1;
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    const int encoded = !rp_step_msg_encode(RP_STEP_PING, 0, NULL, 1, &buf, &cap, &len, NULL);
    uint64_t gone = 0; /* the links already logged as closed */
    pthread_mutex_lock(&tb->hb_mu);
    while (!tb->heartbeat_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const int wait_ms = interval_ms < 1000 ? interval_ms : 1000;
        ts.tv_sec += wait_ms / 1000;
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&tb->hb_cv, &tb->hb_mu, &ts);
        if (tb->heartbeat_stop || !encoded) continue;
        pthread_mutex_unlock(&tb->hb_mu);
        pthread_mutex_lock(&tb->send_mu);
        const int closed = tb->links_closed, due = !closed && now_ms() - tb->last_send_ms >= interval_ms;
        pthread_mutex_unlock(&tb->send_mu);
        if (due) send_links(tb, buf, len, 0, NULL);
        for (int k = 0; k < tb->num_links && !closed; k++)
            if (!(gone & (1ull << k)) && link_closed(tb->links[k])) {
                gone |= 1ull << k;
                rp_log_error("tensor parallel: node %d closed its link (it exited or was killed): the next step "
                             "fails",
                             k + 1);
            }
        pthread_mutex_lock(&tb->hb_mu);
    }
    pthread_mutex_unlock(&tb->hb_mu);
    free(buf);
    return NULL;
}

/* Every rank's communicators aborted, and no rank still making one waits
 * on: the calls in flight return. Under tb->mu. */
static void abort_group(tp_backend *tb) {
    atomic_store(&tb->cancel, 1);
    for (int k = 0; k < tb->n; k++) {
        rp_comm_abort(tb->ranks[k].comm);
        rp_comm_abort(tb->ranks[k].host);
    }
}

/* The watchdog's look at a call in progress, under tb->mu: 0, or the
 * reason it cannot finish. */
static int watch_check(tp_backend *tb, tp_op op, int64_t *deadline, int timeout_ms, int *node0_gone, rp_err *err) {
    /* a rank that failed by itself sets cancel before it aborts the
     * communicators: its own error is the one to report, not the others'
     * "aborted" */
    for (int i = 0; i < tb->n && !atomic_load(&tb->cancel); i++) {
        rp_err e;
        if (tb->ranks[i].comm && rp_comm_check(tb->ranks[i].comm, &e))
            return rp_errf(err, "tensor-parallel rank %d: %s", tb->tcfg.rank_offset + i, e.msg);
    }
    for (int k = 0; k < tb->num_links; k++)
        if (link_closed(tb->links[k]))
            return rp_errf(err, "node %d closed its link during the %s (it exited or was killed)", k + 1,
                           op_name(op));
    const int64_t now = now_ms();
    if (tb->node0_link >= 0 && !*node0_gone && link_closed(tb->node0_link)) {
        *node0_gone = 1;
        if (*deadline > now + LINK_CLOSED_GRACE_MS) *deadline = now + LINK_CLOSED_GRACE_MS;
    }
    if (now < *deadline) return 0;
    if (*node0_gone)
        return rp_errf(err, "node 0 closed its link during the %s, which then did not finish (node 0 exited or was "
                            "killed)",
                       op_name(op));
    return rp_errf(err,
                   "the %s did not finish within %.1f s: a rank or node is stuck or gone (--dist-timeout sets the "
                   "limit)",
                   op_name(op), timeout_ms / 1e3);
}

/* Hands op to every rank and waits for all, watching (above); the first
 * failed rank's error, or the watchdog's. */
static int run_all(tp_backend *tb, tp_op op, rp_err *err) {
    if (tb->failed && op != OP_QUIT)
        return rp_errf(err, "a tensor-parallel rank failed earlier (%s): the backend cannot run any more",
                       tb->fail_err.msg);
    if (tb->wedged) return rp_errf(err, "a tensor-parallel rank is stuck: the backend cannot run any more");
    if (tb->num_links && op != OP_INIT && !tb->failed && send_step(tb, op, err)) {
        tb->failed = 1;
        if (err) tb->fail_err = *err;
        send_abort(tb); /* to the nodes still there */
        if (op != OP_QUIT) return RP_ERR;
    }
    const int timeout_ms = tb->stepped ? tb->step_timeout_ms : tb->setup_timeout_ms;
    int64_t deadline = now_ms() + timeout_ms, abort_deadline = -1;
    int fault = 0, node0_gone = 0;
    rp_err fault_err = {0};
    pthread_mutex_lock(&tb->mu);
    tb->op = op;
    tb->pending = tb->n;
    tb->generation++;
    pthread_cond_broadcast(&tb->cv_work);
    while (tb->pending > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&tb->cv_done, &tb->mu, &ts);
        if (tb->pending == 0) break;
        if (fault) {
            if (now_ms() >= abort_deadline) {
                tb->wedged = 1;
                break;
            }
            continue;
        }
        /* shutting down, a rank's communicator may be gone already: only
         * the deadline applies */
        if (op == OP_QUIT ? now_ms() >= deadline &&
                                rp_errf(&fault_err, "the shutdown did not finish within %.1f s", timeout_ms / 1e3)
                          : watch_check(tb, op, &deadline, timeout_ms, &node0_gone, &fault_err)) {
            fault = 1;
            abort_group(tb);
            abort_deadline = now_ms() + ABORT_GRACE_MS;
        }
    }
    pthread_mutex_unlock(&tb->mu);
    if (fault) {
        rp_log_error("tensor parallel: %s; aborting every rank's communicator", fault_err.msg);
        tb->failed = 1;
        tb->fail_err = fault_err;
        if (err) *err = fault_err;
        if (op != OP_QUIT) send_abort(tb);
        if (tb->wedged) return rp_err_wrap(err, "(a rank did not return after the abort)");
        return RP_ERR;
    }
    for (int i = 0; i < tb->n; i++)
        if (tb->ranks[i].rc) {
            /* the other ranks' collectives in flight wait for this one:
             * end them all (the rank threads are idle now) */
            if (!tb->failed) {
                pthread_mutex_lock(&tb->mu);
                abort_group(tb);
                pthread_mutex_unlock(&tb->mu);
            }
            if (err) *err = tb->ranks[i].err;
            rp_err_wrap(err, "tensor-parallel rank %d", tb->tcfg.rank_offset + i);
            if (!tb->failed) {
                tb->failed = 1;
                tb->fail_err = err ? *err : tb->ranks[i].err;
                if (op != OP_QUIT) send_abort(tb);
            }
            return RP_ERR;
        }
    if (op == OP_READ_TOKENS || op == OP_READ_LOGITS) tb->stepped = 1;
    return 0;
}

static int tp_forward(rp_backend *b, const rp_batch *bt, rp_err *err) {
    tp_backend *tb = (tp_backend *)b;
    /* checked once here, so that no rank refuses a batch the others run
     * (they would wait for it in their first collective) */
    if (rp_batch_validate(bt, b, err)) return RP_ERR;
    tb->batch = bt;
    tb->last_num_logits = bt->num_logits;
    int rc = run_all(tb, OP_FORWARD, err);
    tb->batch = NULL;
    return rc;
}

/* Every rank samples its copy of the gathered logits with the same masks
 * and draws (the row's seed and step), so every rank holds the same token,
 * as after a forward that samples. */
static int tp_sample_masked(rp_backend *b, const uint32_t *masks, int num_masks, const int32_t *mask_of_row,
                            rp_err *err) {
    tp_backend *tb = (tp_backend *)b;
    if (num_masks < 0 || num_masks > tb->base.cfg.max_logit_rows)
        return rp_errf(err, "%d token masks (at most %d)", num_masks, tb->base.cfg.max_logit_rows);
    for (int i = 0; mask_of_row && i < tb->last_num_logits; i++)
        if (mask_of_row[i] < -1 || mask_of_row[i] >= num_masks)
            return rp_errf(err, "logit row %d names mask %d of %d", i, mask_of_row[i], num_masks);
    tb->masks = masks, tb->num_masks = num_masks, tb->mask_of_row = mask_of_row;
    int rc = run_all(tb, OP_SAMPLE_MASKED, err);
    tb->masks = NULL, tb->mask_of_row = NULL;
    return rc;
}

static int tp_read_tokens(rp_backend *b, int32_t *tokens, float *logprobs, rp_top_logprobs *top, rp_err *err) {
    tp_backend *tb = (tp_backend *)b;
    tb->tokens = tokens, tb->logprobs = logprobs, tb->top = top;
    return run_all(tb, OP_READ_TOKENS, err);
}

static int tp_read_logits(rp_backend *b, float *dst, rp_err *err) {
    tp_backend *tb = (tp_backend *)b;
    tb->logits = dst;
    return run_all(tb, OP_READ_LOGITS, err);
}

static void tp_stats(rp_backend *b, rp_backend_stats *out) {
    tp_backend *tb = (tp_backend *)b;
    memset(&tb->stats, 0, sizeof tb->stats);
    if (!run_all(tb, OP_STATS, NULL)) *out = tb->stats;
    else memset(out, 0, sizeof *out);
}

static void tp_set_graphs(rp_backend *b, int enabled) {
    tp_backend *tb = (tp_backend *)b;
    tb->graphs_enabled = enabled;
    run_all(tb, OP_SET_GRAPHS, NULL);
}

static int tp_profile(rp_backend *b, rp_profile_entry *out, int max) {
    tp_backend *tb = (tp_backend *)b;
    tb->prof = out, tb->prof_max = max, tb->prof_n = 0;
    return run_all(tb, OP_PROFILE, NULL) ? 0 : tb->prof_n;
}

static void stop_heartbeat(tp_backend *tb) {
    if (!tb->heartbeat_started) return;
    pthread_mutex_lock(&tb->hb_mu);
    tb->heartbeat_stop = 1;
    pthread_cond_signal(&tb->hb_cv);
    pthread_mutex_unlock(&tb->hb_mu);
    pthread_join(tb->heartbeat, NULL);
    tb->heartbeat_started = 0;
}

static void tp_destroy(rp_backend *b) {
    tp_backend *tb = (tp_backend *)b;
    if (!tb) return;
    stop_heartbeat(tb);
    if (tb->wedged) {
        /* a rank thread still inside a call cannot be joined, nor what it
         * uses freed: left to the process's end */
        rp_log_warn("tensor parallel: a rank is stuck; its thread and memory are left to the process's exit");
        return;
    }
    run_all(tb, OP_QUIT, NULL);
    if (tb->wedged) {
        rp_log_warn("tensor parallel: a rank did not shut down; its thread and memory are left to the process's exit");
        return;
    }
    for (int i = 0; i < tb->n; i++) {
        tp_rank *r = &tb->ranks[i];
        if (r->started) pthread_join(r->thread, NULL);
        if (r->owns_comm) rp_comm_free(r->comm);
        rp_comm_free(r->host);
        free(r->tokens);
        free(r->logprobs);
        free(r->logits);
        free(r->top);
    }
    if (tb->owns_group) rp_comm_local_group_free(tb->group);
    rp_comm_local_group_free(tb->host_group);
    free(tb->msg);
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->cv_work);
    pthread_cond_destroy(&tb->cv_done);
    pthread_mutex_destroy(&tb->send_mu);
    pthread_mutex_destroy(&tb->hb_mu);
    pthread_cond_destroy(&tb->hb_cv);
    free(tb);
}

static const rp_backend_ops tp_ops = {.forward = tp_forward,
                                      .read_logits = tp_read_logits,
                                      .read_tokens = tp_read_tokens,
                                      .destroy = tp_destroy,
                                      .stats = tp_stats,
                                      .set_graphs = tp_set_graphs,
                                      .profile = tp_profile,
                                      .sample_masked = tp_sample_masked};

rp_backend *rp_backend_tp_new(const rp_model *model, const rp_tp_backend_config *tcfg, const rp_backend_config *cfg,
                              rp_err *err) {
    const rp_tp_plan *plan = tcfg->plan;
    const int cuda = tcfg->device && !strcmp(tcfg->device, "cuda");
    if (!plan || tcfg->ranks < 1 || tcfg->rank_offset < 0 || tcfg->rank_offset + tcfg->ranks > plan->size) {
        rp_errp(err, "tensor_parallel_size", "tensor parallelism: ranks %d..%d of a group of %d", tcfg->rank_offset,
                tcfg->rank_offset + tcfg->ranks - 1, plan ? plan->size : 0);
        return NULL;
    }
    if (!cuda && tcfg->ranks != plan->size && !tcfg->local_group) {
        rp_errp(err, "tensor_parallel_size", "tensor parallelism on the CPU runs every rank in one process");
        return NULL;
    }
    if (cuda && tcfg->one_gpu && (tcfg->ranks != plan->size || !cfg->disable_cuda_graph)) {
        rp_errp(err, "tensor_parallel_size",
                "tensor-parallel ranks on one GPU run on one node with CUDA graphs off (their collectives go "
                "through the host)");
        return NULL;
    }
    if (cuda && tcfg->one_gpu) {
        if (rp_cuda_device_count() <= cfg->device_id) {
            rp_errp(err, "tensor_parallel_size", "tensor-parallel ranks on one GPU: no CUDA device %d",
                    cfg->device_id);
            return NULL;
        }
    } else if (cuda) {
        if (!rp_comm_nccl_available()) {
            rp_errp(err, "tensor_parallel_size",
                    "tensor parallelism on GPUs needs NCCL, and this replay was built without it");
            return NULL;
        }
        int ndev = rp_cuda_device_count();
        if (cfg->device_id + tcfg->ranks > ndev) {
            rp_errp(err, "tensor_parallel_size",
                    "--tensor-parallel-size %d needs %d GPUs on this node, %d %s visible", plan->size, tcfg->ranks,
                    ndev, ndev == 1 ? "is" : "are");
            return NULL;
        }
    }
    tp_backend *tb = calloc(1, sizeof *tb);
    if (!tb) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&tb->mu, NULL);
    pthread_cond_init(&tb->cv_work, NULL);
    pthread_cond_init(&tb->cv_done, NULL);
    pthread_mutex_init(&tb->send_mu, NULL);
    pthread_mutex_init(&tb->hb_mu, NULL);
    pthread_cond_init(&tb->hb_cv, NULL);
    atomic_init(&tb->cancel, 0);
    tb->ops = tp_ops;
    tb->base.ops = &tb->ops;
    tb->step_timeout_ms = tcfg->step_timeout_ms > 0 ? tcfg->step_timeout_ms : RP_TP_STEP_TIMEOUT_MS;
    tb->setup_timeout_ms = tb->step_timeout_ms > RP_TP_SETUP_TIMEOUT_MS ? tb->step_timeout_ms : RP_TP_SETUP_TIMEOUT_MS;
    tb->node0_link = tcfg->node0_link ? *tcfg->node0_link : -1;
    tb->base.name = cuda ? "cuda" : "cpu";
    tb->base.model = model;
    tb->tcfg = *tcfg;
    tb->n = tcfg->ranks;
    tb->rank_cfg = *cfg;
    if (tcfg->num_links > RP_BS_MAX_NODES) {
        rp_errf(err, "tensor parallelism: %d node links", tcfg->num_links);
        goto fail_early;
    }
    for (int k = 0; k < tcfg->num_links; k++) tb->links[k] = tcfg->links[k];
    tb->num_links = tcfg->num_links;
    tb->last_send_ms = now_ms();
    /* the other nodes hear from node 0 from the start: its setup may take
     * longer than theirs */
    if (tb->num_links) {
        if (pthread_create(&tb->heartbeat, NULL, heartbeat_main, tb)) {
            rp_errf(err, "cannot start the tensor-parallel heartbeat thread");
            goto fail_early;
        }
        tb->heartbeat_started = 1;
    }
    /* the CPU ranks share the cores */
    if (!cuda && cfg->num_threads > 0) {
        tb->rank_cfg.num_threads = cfg->num_threads / tb->n;
        if (tb->rank_cfg.num_threads < 1) tb->rank_cfg.num_threads = 1;
    }
    if (!cuda || tcfg->one_gpu) {
        tb->owns_group = !tcfg->local_group;
        tb->group = tcfg->local_group ? tcfg->local_group : rp_comm_local_group_new(plan->size, err);
        if (!tb->group) goto fail_early;
    }
    if (cuda && !(tb->host_group = rp_comm_local_group_new(tb->n, err))) goto fail_early;
    for (int i = 0; i < tb->n; i++) {
        tp_rank *r = &tb->ranks[i];
        r->tb = tb;
        r->index = i;
        if (pthread_create(&r->thread, NULL, rank_main, r)) {
            rp_errf(err, "cannot start the thread of tensor-parallel rank %d", tcfg->rank_offset + i);
            /* the threads started so far are told to stop */
            tb->n = i;
            goto fail;
        }
        r->started = 1;
    }
    /* every rank makes its communicator (NCCL: they meet there) and its
     * backend at once */
    if (run_all(tb, OP_INIT, err)) goto fail;
    tb->base.cfg = tb->ranks[0].be->cfg;
    tb->base.cfg.tp = (rp_backend_tp){.size = plan->size, .rank = tcfg->rank_offset, .comm = NULL, .plan = plan};
    if (!tb->ranks[0].be->ops->sample_masked) tb->ops.sample_masked = NULL;
    tb->base.supports_token_refs = tb->ranks[0].be->supports_token_refs;
    tb->base.forward_is_synchronous = tb->ranks[0].be->forward_is_synchronous;
    for (int i = 1; i < tb->n; i++)
        if (tb->ranks[i].be->cfg.num_pages != tb->base.cfg.num_pages) {
            rp_errf(err, "tensor-parallel ranks sized different KV caches (%d and %d pages)",
                    tb->base.cfg.num_pages, tb->ranks[i].be->cfg.num_pages);
            goto fail;
        }
    rp_log_info("tensor parallel: %d ranks (%d here) on %s, %d KV pages each", plan->size, tb->n,
                cuda ? "GPUs" : "CPU threads", tb->base.cfg.num_pages);
    return &tb->base;
fail:
    {
        rp_err saved = *err;
        tp_destroy(&tb->base);
        *err = saved;
    }
    return NULL;
fail_early:
    stop_heartbeat(tb);
    if (tb->owns_group) rp_comm_local_group_free(tb->group);
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->cv_work);
    pthread_cond_destroy(&tb->cv_done);
    pthread_mutex_destroy(&tb->send_mu);
    pthread_mutex_destroy(&tb->hb_mu);
    pthread_cond_destroy(&tb->hb_cv);
    free(tb);
    return NULL;
}
