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
 * backend is unusable afterwards. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/tp_step_msg.h"
#include "dist/bootstrap.h"
#include "util/log.h"

/* How long node 0 waits for another node to take a step message: its
 * socket buffer full this long means the node is stuck or gone. */
#define LINK_SEND_TIMEOUT_MS 60000

typedef enum tp_op {
    OP_NONE = 0,
    OP_INIT,
    OP_FORWARD,
    OP_READ_TOKENS,
    OP_READ_LOGITS,
    OP_SET_GRAPHS,
    OP_PROFILE,
    OP_STATS,
    OP_QUIT
} tp_op;

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
    int failed; /* a rank failed: the group's communicator is gone */
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
    int graphs_enabled;
    rp_profile_entry *prof;
    int prof_max, prof_n;
    rp_backend_stats stats;
    /* node 0 of several: the other nodes' links, the step message buffer */
    int links[RP_BS_MAX_NODES];
    int num_links;
    uint8_t *msg;
    size_t msg_cap;
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
        if (cuda) {
            cfg.device_id = tb->rank_cfg.device_id + (tb->tcfg.one_gpu ? 0 : r->index);
            if (!(r->host = rp_comm_local_new(tb->host_group, r->index, &r->err))) return RP_ERR;
            r->comm = tb->tcfg.one_gpu
                          ? rp_comm_one_gpu_new(tb->group, global, cfg.device_id, &r->err)
                          : rp_comm_nccl_new(tb->tcfg.nccl_id, tb->tcfg.plan->size, global, cfg.device_id, &r->err);
        } else {
            r->comm = rp_comm_local_new(tb->group, global, &r->err);
        }
        if (!r->comm) return RP_ERR;
        r->owns_comm = 1;
        cfg.tp = (rp_backend_tp){
            .size = tb->tcfg.plan->size, .rank = global, .comm = r->comm, .plan = tb->tcfg.plan, .host = r->host};
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
            if (r->owns_comm) rp_comm_free(r->comm);
            r->comm = NULL;
            r->owns_comm = 0;
        }
        int rc = op == OP_QUIT ? 0 : rank_run(tb, r, op);
        /* the others may be waiting for this rank inside a collective or
         * at the host barrier */
        if (rc && r->comm) rp_comm_abort(r->comm);
        if (rc && r->host) rp_comm_abort(r->host);
        pthread_mutex_lock(&tb->mu);
        r->rc = rc;
        if (--tb->pending == 0) pthread_cond_broadcast(&tb->cv_done);
        pthread_mutex_unlock(&tb->mu);
        if (op == OP_QUIT) return NULL;
    }
}

/* Node 0 of several: the other nodes make the call too (their ranks'
 * collectives meet this node's). */
static int send_step(tp_backend *tb, tp_op op, rp_err *err) {
    rp_step_op sop;
    switch (op) {
    case OP_FORWARD: sop = RP_STEP_FORWARD; break;
    case OP_READ_TOKENS: sop = RP_STEP_READ_TOKENS; break;
    case OP_READ_LOGITS: sop = RP_STEP_READ_LOGITS; break;
    case OP_SET_GRAPHS: sop = RP_STEP_SET_GRAPHS; break;
    case OP_QUIT: sop = RP_STEP_QUIT; break;
    default: return 0; /* this node's own business (stats, profile) */
    }
    size_t len = 0;
    if (rp_step_msg_encode(sop, tb->graphs_enabled, tb->batch, tb->rank_cfg.page_size, &tb->msg, &tb->msg_cap, &len,
                           err))
        return RP_ERR;
    for (int k = 0; k < tb->num_links; k++)
        if (rp_bs_send_msg(tb->links[k], tb->msg, len, LINK_SEND_TIMEOUT_MS, err))
            return rp_err_wrap(err, "sending a step to node %d", k + 1);
    return 0;
}

/* Hands op to every rank and waits for all; the first failed rank's error. */
static int run_all(tp_backend *tb, tp_op op, rp_err *err) {
    if (tb->failed && op != OP_QUIT)
        return rp_errf(err, "a tensor-parallel rank failed earlier: the backend cannot run any more");
    if (tb->num_links && op != OP_INIT && send_step(tb, op, err)) {
        tb->failed = 1;
        if (op != OP_QUIT) return RP_ERR;
    }
    pthread_mutex_lock(&tb->mu);
    tb->op = op;
    tb->pending = tb->n;
    tb->generation++;
    pthread_cond_broadcast(&tb->cv_work);
    while (tb->pending > 0) pthread_cond_wait(&tb->cv_done, &tb->mu);
    pthread_mutex_unlock(&tb->mu);
    for (int i = 0; i < tb->n; i++)
        if (tb->ranks[i].rc) {
            /* the other ranks' collectives in flight wait for this one:
             * end them all (the rank threads are idle now) */
            if (!tb->failed)
                for (int k = 0; k < tb->n; k++) {
                    rp_comm_abort(tb->ranks[k].comm);
                    rp_comm_abort(tb->ranks[k].host);
                }
            tb->failed = 1;
            if (err) *err = tb->ranks[i].err;
            return rp_err_wrap(err, "tensor-parallel rank %d", tb->tcfg.rank_offset + i);
        }
    return 0;
}

static int tp_forward(rp_backend *b, const rp_batch *bt, rp_err *err) {
    tp_backend *tb = (tp_backend *)b;
    /* checked once here, so that no rank refuses a batch the others run
     * (they would wait for it in their first collective) */
    if (rp_batch_validate(bt, b, err)) return RP_ERR;
    tb->batch = bt;
    int rc = run_all(tb, OP_FORWARD, err);
    tb->batch = NULL;
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

static void tp_destroy(rp_backend *b) {
    tp_backend *tb = (tp_backend *)b;
    if (!tb) return;
    run_all(tb, OP_QUIT, NULL);
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
    rp_comm_local_group_free(tb->group);
    rp_comm_local_group_free(tb->host_group);
    free(tb->msg);
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->cv_work);
    pthread_cond_destroy(&tb->cv_done);
    free(tb);
}

static const rp_backend_ops tp_ops = {.forward = tp_forward,
                                      .read_logits = tp_read_logits,
                                      .read_tokens = tp_read_tokens,
                                      .destroy = tp_destroy,
                                      .stats = tp_stats,
                                      .set_graphs = tp_set_graphs,
                                      .profile = tp_profile};

rp_backend *rp_backend_tp_new(const rp_model *model, const rp_tp_backend_config *tcfg, const rp_backend_config *cfg,
                              rp_err *err) {
    const rp_tp_plan *plan = tcfg->plan;
    const int cuda = tcfg->device && !strcmp(tcfg->device, "cuda");
    if (!plan || tcfg->ranks < 1 || tcfg->rank_offset < 0 || tcfg->rank_offset + tcfg->ranks > plan->size) {
        rp_errp(err, "tensor_parallel_size", "tensor parallelism: ranks %d..%d of a group of %d", tcfg->rank_offset,
                tcfg->rank_offset + tcfg->ranks - 1, plan ? plan->size : 0);
        return NULL;
    }
    if (!cuda && tcfg->ranks != plan->size) {
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
    tb->base.ops = &tp_ops;
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
    /* the CPU ranks share the cores */
    if (!cuda && cfg->num_threads > 0) {
        tb->rank_cfg.num_threads = cfg->num_threads / tb->n;
        if (tb->rank_cfg.num_threads < 1) tb->rank_cfg.num_threads = 1;
    }
    if ((!cuda || tcfg->one_gpu) && !(tb->group = rp_comm_local_group_new(plan->size, err))) goto fail_early;
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
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->cv_work);
    pthread_cond_destroy(&tb->cv_done);
    free(tb);
    return NULL;
}
