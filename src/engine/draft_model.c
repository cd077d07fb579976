/* The draft model: its runner and each round's draft steps (draft_model.h). */
#include "engine/draft_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"
#include "util/log.h"

/* Room kept for the draft backend's activations, workspaces and graphs
 * beyond its weights (qwen3-0.6b with 2,048-token catch-up steps uses less;
 * a draft that needs more fails to start with a clear error, not later). */
#define DRAFT_RESERVE_MARGIN ((size_t)1 << 30)
/* A catch-up of at most this many tokens is fed as one-token positions
 * (a decode batch), longer ones as a chunk. */
#define DRAFT_POSITIONS_MAX 4

struct rp_draft_model {
    rp_runner *run;
    rp_request **holder; /* [max_rows]: the request holding each row */
    int max_rows, max_seqs;
    /* one round: [max_seqs] each; drafts [max_seqs][RP_DRAFT_MAX_K] */
    rp_request **act;
    int *want, *row, *prow, *len, *fed;
    int32_t *drafts, *tok;
    uint64_t forwards;
    double ms;
};

#define RP_DRAFT_MAX_K 16

static int file_exists(const char *dir, const char *name) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, R_OK) == 0;
}

/* Same ids for the same byte strings and the same special tokens: a draft
 * trained with another tokenizer would draft tokens that mean something else
 * to the target, and verification would accept almost none of them. */
static int check_tokenizers(const char *draft_dir, const char *target_dir, rp_err *err) {
    if (!target_dir || !file_exists(draft_dir, "tokenizer.json") || !file_exists(target_dir, "tokenizer.json"))
        return RP_OK;
    rp_tokenizer *a = rp_tokenizer_load(draft_dir, err);
    if (!a) return rp_err_wrap(err, "the draft model's tokenizer");
    rp_tokenizer *b = rp_tokenizer_load(target_dir, err);
    if (!b) {
        rp_tokenizer_free(a);
        return rp_err_wrap(err, "the target's tokenizer");
    }
    int rc = RP_OK;
    const int na = rp_tokenizer_vocab_size(a), nb = rp_tokenizer_vocab_size(b);
    if (na != nb) {
        rc = rp_errf(err, "the draft model's tokenizer has %d tokens, the target's %d: a draft model must share the "
                          "target's tokenizer",
                     na, nb);
    }
    for (int id = 0; id < na && !rc; id++) {
        const char *ba = NULL, *bb = NULL;
        size_t la = 0, lb = 0;
        const int ha = rp_tokenizer_token_bytes(a, id, &ba, &la) == 0,
                  hb = rp_tokenizer_token_bytes(b, id, &bb, &lb) == 0;
        if (ha != hb || (ha && (la != lb || memcmp(ba, bb, la))) ||
            rp_tokenizer_is_special(a, id) != rp_tokenizer_is_special(b, id))
            rc = rp_errf(err, "the draft model's tokenizer differs from the target's at token %d: a draft model must "
                              "share the target's tokenizer",
                         id);
    }
    rp_tokenizer_free(a);
    rp_tokenizer_free(b);
    return rc;
}

rp_model *rp_draft_model_load(const rp_draft_model_config *cfg, const char *target_tokenizer_dir, rp_err *err) {
    if ((!cfg->model_dir) == (!cfg->dummy_name)) {
        rp_errf(err, "give exactly one of a draft model directory or a dummy draft model name");
        return NULL;
    }
    if (cfg->model_dir && check_tokenizers(cfg->model_dir, target_tokenizer_dir, err)) return NULL;
    const char *dev = rp_runner_resolve_device(cfg->device);
    rp_load_options lo = {.format = cfg->load_dummy ? RP_LOAD_DUMMY : RP_LOAD_AUTO, .seed = cfg->weight_seed,
                          .lazy_dummy = !strcmp(dev, "cuda")};
    rp_model *m = cfg->model_dir ? rp_model_load(cfg->model_dir, &lo, err) : rp_model_dummy(cfg->dummy_name, &lo, err);
    if (!m) {
        rp_err_wrap(err, "the draft model");
        return NULL;
    }
    return m;
}

void rp_draft_model_memory(const rp_model *draft, const rp_draft_model_config *cfg, size_t *reserve_bytes,
                           size_t *shadow_page_bytes) {
    const rp_model_config *c = &draft->cfg;
    *reserve_bytes = (size_t)draft->weight_bytes + DRAFT_RESERVE_MARGIN;
    /* bf16 K and V for every layer (the CUDA backend's layout): the draft's
     * cache stays bf16 whatever the target's (rp_draft_model_new) */
    *shadow_page_bytes = rp_kv_page_bytes(c, cfg->page_size, RP_KV_BF16);
}

rp_draft_model *rp_draft_model_new(rp_model *model, const rp_draft_model_config *cfg, const rp_model_config *target,
                                   int num_pages, rp_err *err) {
    if (model->cfg.vocab_size != target->vocab_size) {
        rp_errf(err, "the draft model's vocabulary has %d tokens, the target's %d: a draft model must share the "
                     "target's tokenizer and vocabulary",
                model->cfg.vocab_size, target->vocab_size);
        rp_model_free(model);
        return NULL;
    }
    rp_draft_model *dm = calloc(1, sizeof *dm);
    if (!dm) {
        rp_model_free(model);
        rp_errf(err, "out of memory");
        return NULL;
    }
    const int positions = cfg->max_seqs * DRAFT_POSITIONS_MAX; /* a catch-up's rows (propose) */
    rp_runner_config rc = {.model = model, .device = cfg->device, .threads = cfg->threads,
                           .page_size = cfg->page_size, .num_pages = num_pages,
                           /* bf16 always: the pool beside the target's was
                            * sized for it (rp_draft_model_memory), and a
                            * draft's K/V precision only moves acceptance */
                           .kv_dtype = RP_KV_BF16,
                           .max_seqs = cfg->max_rows > positions ? cfg->max_rows : positions,
                           .max_context = cfg->max_context, .max_batched_tokens = cfg->max_batched_tokens,
                           .max_logit_rows = positions, .disable_cuda_graph = cfg->disable_cuda_graph,
                           .cuda_graph_max_bs = positions};
    dm->run = rp_runner_new(&rc, err);
    if (!dm->run) {
        rp_model_free(model);
        free(dm);
        rp_err_wrap(err, "the draft model could not start beside the target (where it ran out of memory: lower "
                         "--gpu-memory-utilization or choose a smaller draft model)");
        return NULL;
    }
    dm->run->owns_model = 1;
    dm->max_rows = cfg->max_rows;
    dm->max_seqs = cfg->max_seqs;
    dm->holder = calloc((size_t)dm->max_rows, sizeof *dm->holder);
    dm->act = calloc((size_t)dm->max_seqs, sizeof *dm->act);
    dm->want = calloc((size_t)dm->max_seqs, sizeof *dm->want);
    dm->row = calloc((size_t)dm->max_seqs, sizeof *dm->row);
    dm->prow = calloc((size_t)dm->max_seqs, sizeof *dm->prow);
    dm->len = calloc((size_t)dm->max_seqs, sizeof *dm->len);
    dm->fed = calloc((size_t)dm->max_seqs, sizeof *dm->fed);
    dm->drafts = calloc((size_t)dm->max_seqs * RP_DRAFT_MAX_K, sizeof *dm->drafts);
    dm->tok = calloc((size_t)dm->max_seqs * DRAFT_POSITIONS_MAX, sizeof *dm->tok); /* a catch-up step's rows */
    if (!dm->holder || !dm->act || !dm->want || !dm->row || !dm->prow || !dm->len || !dm->fed || !dm->drafts || !dm->tok) {
        rp_draft_model_free(dm);
        rp_errf(err, "out of memory");
        return NULL;
    }
    const rp_model_config *c = &model->cfg;
    rp_log_info("draft model: %s, %d layers, hidden %d, %.2fB params; %d KV pages beside the target's",
                c->arch_name, c->num_layers, c->hidden_size, (double)rp_config_num_params(c) / 1e9,
                dm->run->pool->num_pages);
    return dm;
}

void rp_draft_model_free(rp_draft_model *dm) {
    if (!dm) return;
    rp_runner_free(dm->run);
    free(dm->holder);
    free(dm->act);
    free(dm->want);
    free(dm->row);
    free(dm->prow);
    free(dm->len);
    free(dm->fed);
    free(dm->drafts);
    free(dm->tok);
    free(dm);
}

const rp_model *rp_draft_model_model(const rp_draft_model *dm) { return dm->run->model; }

void rp_draft_model_counts(const rp_draft_model *dm, uint64_t *forwards, double *ms) {
    *forwards = dm->forwards;
    *ms = dm->ms;
}

void rp_draft_model_release(rp_draft_model *dm, rp_request *r) {
    if (!dm || r->draft_row < 0) return;
    rp_page_table_release_row(dm->run->table, r->draft_row);
    dm->holder[r->draft_row] = NULL;
    r->draft_row = -1;
    r->draft_cached = 0;
}

void rp_draft_model_rollback(rp_request *r) {
    if (r->draft_cached > r->cached) r->draft_cached = r->cached;
}

/* Rows and pages held by requests that are not running (preempted, so
 * waiting) go back, for the running ones to draft with. Their K/V would be
 * valid again on readmission; they are recomputed then. */
static int evict_idle(rp_draft_model *dm) {
    int freed = 0;
    for (int row = 0; row < dm->max_rows; row++) {
        rp_request *h = dm->holder[row];
        if (h && h->state != RP_REQ_RUNNING) {
            rp_draft_model_release(dm, h);
            freed++;
        }
    }
    return freed;
}

/* A row and pages for r's catch-up and draft steps: `need` tokens. */
static int make_room(rp_draft_model *dm, rp_request *r, int need) {
    rp_err err;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (r->draft_row < 0) {
            r->draft_row = rp_page_table_acquire_row(dm->run->table);
            if (r->draft_row >= 0) {
                dm->holder[r->draft_row] = r;
                r->draft_cached = 0;
            }
        }
        if (r->draft_row >= 0 && !rp_page_table_reserve(dm->run->table, r->draft_row, need, &err)) return 1;
        if (attempt == 0 && !evict_idle(dm)) break;
    }
    return 0;
}

/* Launches the batch built, every one of its `rows` logit rows sampled
 * greedily on the device where it can; read_drafts reads it. */
static int launch(rp_draft_model *dm, int rows, rp_err *err) {
    rp_runner *r = dm->run;
    rp_batch *bt = rp_batch_finish(r->bb);
    for (int i = 0; i < rows; i++) r->sample[i] = (rp_sampling_params){.top_p = 1.0f};
    bt->sample = r->backend->ops->read_tokens ? r->sample : NULL;
    dm->forwards++;
    return rp_backend_forward(r->backend, bt, err);
}

/* The oldest launched step's tokens: each request's at its row (-1: not in
 * that step) into its drafts at index j. The CPU backend (no device
 * sampling) takes the argmax of the logits, as rp_runner_forward_greedy. */
static int read_drafts(rp_draft_model *dm, int na, const int *row, int j, rp_err *err) {
    rp_runner *r = dm->run;
    rp_backend *be = r->backend;
    if (be->ops->read_tokens) {
        if (be->ops->read_tokens(be, dm->tok, NULL, NULL, err)) return RP_ERR;
    } else {
        if (rp_backend_read_logits(be, r->logits, err)) return RP_ERR;
        const int vocab = r->model->cfg.vocab_size;
        for (int i = 0; i < na; i++) {
            if (row[i] < 0) continue;
            const float *v = r->logits + (size_t)row[i] * vocab;
            int32_t best = 0;
            for (int t = 1; t < vocab; t++)
                if (v[t] > v[best]) best = t;
            dm->tok[row[i]] = best;
        }
    }
    for (int i = 0; i < na; i++)
        if (row[i] >= 0) dm->drafts[i * RP_DRAFT_MAX_K + j] = dm->tok[row[i]];
    return RP_OK;
}

/* One draft forward over the batch built, the greedy token of each of its
 * `rows` logit rows into dm->tok. */
static int forward(rp_draft_model *dm, int rows, rp_err *err) {
    const double t0 = rp_now_s();
    int rc = rp_runner_forward_greedy(dm->run, rp_batch_finish(dm->run->bb), rows, dm->tok, err);
    dm->forwards++;
    dm->ms += (rp_now_s() - t0) * 1e3;
    return rc;
}

int rp_draft_model_propose(rp_draft_model *dm, rp_request *const *reqs, const int *want_in, int n, rp_err *err) {
    rp_runner *run = dm->run;
    int na = 0, kmax = 0;
    for (int i = 0; i < n && na < dm->max_seqs; i++) {
        rp_request *r = reqs[i];
        const int len = rp_request_len(r);
        int want = want_in[i] < RP_DRAFT_MAX_K ? want_in[i] : RP_DRAFT_MAX_K;
        r->num_draft = 0;
        /* the draft's context: the request's tokens and its drafts but the last (never fed) */
        if (len + want - 1 > run->max_context) want = run->max_context - len + 1;
        if (want <= 0 || !make_room(dm, r, len + want - 1)) continue;
        if (r->draft_cached > len - 1) r->draft_cached = len - 1; /* the last token is fed for its logits */
        dm->act[na] = r;
        dm->want[na] = want;
        dm->len[na] = len;
        if (want > kmax) kmax = want;
        na++;
    }
    if (!na) return RP_OK;
    /* Catch-up: what each has not seen, in steps of the draft's budget; the
     * step that reaches a request's last token samples its d_1. */
    for (;;) {
        rp_batch_begin(run->bb);
        int rows = 0, fed = 0;
        for (int i = 0; i < na; i++) {
            rp_request *r = dm->act[i];
            const int pend = dm->len[i] - r->draft_cached, left = rp_batch_tokens_left(run->bb);
            dm->row[i] = -1;
            dm->fed[i] = 0;
            if (pend <= 0 || left <= 0) continue;
            const int m = pend < left ? pend : left, last = m == pend;
            /* A few tokens (the round's usual 1-2) go in as a round's positions do: then the
             * step is a decode batch and replays a decode graph (qwen3-0.6b: 2 tokens as a
             * chunk ran a step bucket, 2.0 ms against 0.77 for a decode step). */
            int lr = -1, as_positions = last && m <= DRAFT_POSITIONS_MAX;
            if (as_positions)
                lr = rp_batch_add_positions(run->bb, r->draft_row, r->tokens + r->draft_cached, m, r->draft_cached);
            if (lr < 0) {
                as_positions = 0;
                lr = rp_batch_add(run->bb, r->draft_row, r->tokens + r->draft_cached, m, r->draft_cached, last);
            }
            if (lr < 0 && last) break; /* no logit row left: the rest wait for the next step */
            dm->fed[i] = m;
            if (last) dm->row[i] = as_positions ? lr + m - 1 : lr, rows += as_positions ? m : 1;
            fed++;
        }
        if (!fed) break;
        if (forward(dm, rows, err)) return RP_ERR;
        for (int i = 0; i < na; i++) {
            dm->act[i]->draft_cached += dm->fed[i];
            if (dm->row[i] >= 0) dm->drafts[i * RP_DRAFT_MAX_K] = dm->tok[dm->row[i]];
        }
    }
    /* Decode steps: d_j fed at its position, d_j+1 sampled, while wanted.
     * Where the backend takes token references, step j feeds the rows step
     * j - 1 samples into and is launched before that step's tokens are read
     * (runner.h's overlapped decoding), so the device runs the draft's steps
     * back to back; the host reads each once the next is queued. */
    const int overlap = rp_runner_can_overlap(run);
    const double t0 = rp_now_s();
    int rc = RP_OK, pending = 0;
    for (int j = 1; j < kmax && !rc; j++) {
        rp_batch_begin(run->bb);
        int rows = 0;
        for (int i = 0; i < na; i++) {
            dm->prow[i] = dm->row[i];
            dm->row[i] = -1;
            if (dm->want[i] <= j) continue;
            rp_request *r = dm->act[i];
            /* a request in step j was in step j - 1 (its want only shrinks the steps it takes) */
            const int32_t in = overlap && pending ? -(dm->prow[i] + 1) : dm->drafts[i * RP_DRAFT_MAX_K + j - 1];
            dm->row[i] = rp_batch_add(run->bb, r->draft_row, &in, 1, r->draft_cached, 1);
            RP_ASSERT(dm->row[i] >= 0);
            rows++;
        }
        if ((rc = launch(dm, rows, err))) break;
        for (int i = 0; i < na; i++) dm->act[i]->draft_cached += dm->row[i] >= 0;
        /* the older step's tokens: step j - 1's while j is queued, or step j's at once */
        if (overlap && !pending) {
            pending = 1;
            continue;
        }
        if ((rc = read_drafts(dm, na, overlap ? dm->prow : dm->row, overlap ? j - 1 : j, err))) break;
    }
    if (!rc && overlap && pending) rc = read_drafts(dm, na, dm->row, kmax - 1, err);
    dm->ms += (rp_now_s() - t0) * 1e3;
    if (rc) return RP_ERR;
    for (int i = 0; i < na; i++) {
        rp_request *r = dm->act[i];
        memcpy(r->tokens + dm->len[i], &dm->drafts[i * RP_DRAFT_MAX_K], (size_t)dm->want[i] * sizeof *r->tokens);
        r->num_draft = dm->want[i];
    }
    return RP_OK;
}
