/* The engine API (include/replay/engine.h): the request lifecycle around the
 * scheduler, on the engine's own thread.
 *
 * submit() validates and tokenizes on the caller's thread, then hands the
 * request over through an inbox; abort() posts an id. The engine thread
 * loops: take new requests and aborts, ask the scheduler for a plan, turn it
 * into a backend batch, run forward (sampling on the device when no request
 * in the batch needs the host sampler's penalties), then append each sampled
 * token, stream its text (holding back what could start a stop string) and
 * finish requests on EOS, stop ids, stop strings, max_tokens or the context
 * limit, freeing their pages at once. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/batch.h"
#include "engine/sampler.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/model.h"
#include "replay/engine.h"
#include "sched/request.h"
#include "sched/scheduler.h"
#include "util/log.h"
#include "util/rng.h"

/* A launched step whose results have not been read yet. */
typedef struct rp_step {
    int active;
    uint64_t id;
    int n;
    rp_sched_item *items;  /* [max_running] */
    int *logit_row;        /* [max_running] */
    int *out_index;        /* [max_running]: output index of the token each sampling item makes */
    int device_sampling;
} rp_step;

struct rp_engine {
    rp_engine_config cfg;
    rp_model *model;
    rp_tokenizer *tok;
    rp_backend *backend;
    rp_page_pool *pool;
    rp_page_table *table;
    rp_scheduler *sched;
    rp_batch_builder *bb;
    rp_sampler *sampler;
    float *logits;
    rp_sample_params *dev_params;
    int32_t *dev_tokens;
    float *dev_logprobs;
    rp_top_logprobs *dev_top; /* [max_logits] */
    int max_context, max_logits;
    /* shared with callers, under mu */
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    pthread_t thread;
    int thread_started, stopping, busy;
    rp_request *inbox_head, *inbox_tail;
    rp_request_id *aborts;
    int num_aborts, cap_aborts;
    rp_request_id *live; /* ids submitted and not finished */
    int num_live, cap_live;
    rp_request_id next_id;
    /* overlap: step N+1 is launched before step N's tokens are read */
    int overlap;
    rp_step steps[2];
    int cur_step;                 /* index in steps[] of the newest launched step */
    uint64_t launched, completed; /* step counters */
    rp_request **retiring;        /* finished, freed once their last step completed */
    int num_retiring, cap_retiring;
    rp_engine_stats stats;   /* engine thread only */
    rp_engine_stats snapshot; /* what get_stats reports, under mu */
    double cpu_ms_total;
    uint64_t stats_prompt_tokens; /* under mu: counted at submit */
};

void rp_engine_config_default(rp_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->device = "auto";
    c->page_size = 16;
    c->memory_ratio = 0.9;
    c->max_running_requests = 256;
    c->max_prefill_tokens = 16384; /* SGLang's defaults on large GPUs; measured in bench/RESULTS.md */
    c->chunked_prefill_size = 8192;
}

void rp_request_params_default(rp_request_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 16;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->repetition_penalty = 1.0f;
}

void rp_request_free(rp_request *r) {
    if (!r) return;
    if (r->has_detok) rp_detok_free(&r->detok);
    for (int i = 0; i < r->num_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->tokens);
    free(r->held);
    free(r);
}

static int set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int set_err(char *err, size_t n, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- live ids ---------------------------------------------------------- */

static void live_add(rp_engine *e, rp_request_id id) {
    if (e->num_live == e->cap_live) {
        e->cap_live = e->cap_live ? e->cap_live * 2 : 64;
        e->live = realloc(e->live, (size_t)e->cap_live * sizeof *e->live);
        if (!e->live) abort();
    }
    e->live[e->num_live++] = id;
}

static int live_remove(rp_engine *e, rp_request_id id) {
    for (int i = 0; i < e->num_live; i++)
        if (e->live[i] == id) {
            e->live[i] = e->live[--e->num_live];
            return 1;
        }
    return 0;
}

/* ---- streaming text and finishing ---------------------------------------- */

static void held_append(rp_request *r, const char *s, size_t n) {
    if (r->held_len + n + 1 > r->held_cap) {
        r->held_cap = (r->held_len + n + 1) * 2;
        r->held = realloc(r->held, r->held_cap);
        if (!r->held) abort();
    }
    memcpy(r->held + r->held_len, s, n);
    r->held_len += n;
    r->held[r->held_len] = 0;
}

/* Length of the longest suffix of the held text that is a proper prefix of
 * a stop string: that much must wait for the next token. */
static size_t stop_prefix_tail(const rp_request *r) {
    size_t best = 0;
    for (int i = 0; i < r->num_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1; k > best; k--)
            if (k <= r->held_len && !memcmp(r->held + r->held_len - k, r->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* top: the token's most likely alternatives, or NULL. */
static void deliver(rp_engine *e, rp_request *r, int32_t tok, float lp, const rp_top_logprobs *top,
                    const char *text, size_t len, rp_finish fin, const char *error) {
    (void)e;
    if (!r->cb) return;
    rp_token_event ev = {.id = r->id, .token = tok, .logprob = lp, .text = text ? text : "", .text_len = len,
                         .finish = fin, .error = error, .prompt_tokens = r->num_prompt,
                         .completion_tokens = r->num_output};
    if (top && tok >= 0 && top->n > 0) {
        ev.num_top_logprobs = top->n < RP_MAX_TOP_LOGPROBS ? top->n : RP_MAX_TOP_LOGPROBS;
        memcpy(ev.top_ids, top->ids, (size_t)ev.num_top_logprobs * sizeof *ev.top_ids);
        memcpy(ev.top_logprobs, top->logprobs, (size_t)ev.num_top_logprobs * sizeof *ev.top_logprobs);
    }
    r->cb(r->user, &ev);
}

/* Frees a finished request's pages and memory. */
static void release(rp_engine *e, rp_request *r) {
    rp_scheduler_remove(e->sched, r);
    rp_request_free(r);
}

/* Frees the retiring requests whose last step has completed. */
static void release_retired(rp_engine *e) {
    int k = 0;
    for (int i = 0; i < e->num_retiring; i++) {
        rp_request *r = e->retiring[i];
        if (r->last_step <= e->completed) release(e, r);
        else e->retiring[k++] = r;
    }
    e->num_retiring = k;
}

/* Ends a request: its final event now; its pages once no launched step
 * still writes them (with overlap, the step in flight may). */
static void finish(rp_engine *e, rp_request *r, int32_t tok, float lp, const rp_top_logprobs *top, rp_finish fin,
                   const char *error) {
    if (r->retiring) return;
    /* whatever text is held is output: the request ended without a stop string */
    if (r->has_detok) {
        const char *tail;
        size_t tail_len;
        rp_detok_flush(&r->detok, &tail, &tail_len);
        held_append(r, tail, tail_len);
    }
    deliver(e, r, tok, lp, top, r->held, r->held_len, fin, error);
    pthread_mutex_lock(&e->mu);
    live_remove(e, r->id);
    pthread_mutex_unlock(&e->mu);
    r->retiring = 1;
    if (r->last_step <= e->completed || r->state == RP_REQ_WAITING) {
        release(e, r);
        return;
    }
    if (e->num_retiring == e->cap_retiring) {
        e->cap_retiring = e->cap_retiring ? e->cap_retiring * 2 : 64;
        e->retiring = realloc(e->retiring, (size_t)e->cap_retiring * sizeof *e->retiring);
        if (!e->retiring) abort();
    }
    e->retiring[e->num_retiring++] = r;
}

/* Records output token number k (0-based) and streams it; finishes the
 * request when a stop condition is met. Without overlap k is the next
 * index; with overlap the slot was reserved (a token reference) when the
 * step was launched, and a later provisional token may already follow. */
static void on_sampled(rp_engine *e, rp_request *r, int k, int32_t tok, float lp, const rp_top_logprobs *top) {
    const rp_model_config *c = &e->model->cfg;
    if (r->retiring) return; /* finished in an earlier step: this token was speculative */
    r->tokens[r->num_prompt + k] = tok;
    if (k >= r->num_output) r->num_output = k + 1;
    e->stats.generated_tokens++;
    int is_stop = !r->ignore_eos && rp_config_is_eos(c, tok);
    for (int k = 0; k < r->num_stop_ids && !is_stop; k++) is_stop = r->stop_ids[k] == tok;
    if (is_stop) {
        r->num_output = k + 1; /* a provisional token after this one is dropped */
        finish(e, r, tok, lp, top, RP_FINISH_REASON_STOP, NULL);
        return;
    }
    if (r->has_detok) {
        const char *piece;
        size_t n;
        rp_err err;
        if (rp_detok_push(&r->detok, tok, &piece, &n, &err) == 0) held_append(r, piece, n);
        for (int i = 0; i < r->num_stop; i++) {
            char *hit = r->held_len ? memmem(r->held, r->held_len, r->stop[i], strlen(r->stop[i])) : NULL;
            if (hit) {
                r->held_len = (size_t)(hit - r->held); /* the stop string is not part of the output */
                r->held[r->held_len] = 0;
                if (r->has_detok) {
                    rp_detok_free(&r->detok);
                    r->has_detok = 0;
                }
                r->num_output = k + 1;
                finish(e, r, tok, lp, top, RP_FINISH_REASON_STOP, NULL);
                return;
            }
        }
    }
    if (k + 1 >= r->max_tokens || r->num_prompt + k + 1 >= e->max_context) {
        r->num_output = k + 1;
        finish(e, r, tok, lp, top, RP_FINISH_REASON_LENGTH, NULL);
        return;
    }
    size_t keep = r->num_stop ? stop_prefix_tail(r) : 0;
    size_t out = r->held_len - keep;
    deliver(e, r, tok, lp, top, r->held, out, RP_FINISH_REASON_NONE, NULL);
    if (r->held) {
        memmove(r->held, r->held + out, keep);
        r->held[keep] = 0;
    }
    r->held_len = keep;
}

/* ---- the step ---------------------------------------------------------- */

static int needs_host_sampler(const rp_request *r) {
    const rp_sampling_params *p = &r->sampling;
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

static void fail_running(rp_engine *e, const char *msg) {
    e->completed = e->launched; /* nothing is in flight after a failure */
    e->steps[0].active = e->steps[1].active = 0;
    release_retired(e);
    while (e->sched->num_running > 0) finish(e, e->sched->running[0], -1, 0, NULL, RP_FINISH_REASON_ERROR, msg);
}

/* Whether a request's sampling needs the host sampler (penalties over its
 * history): such a step cannot overlap. */
static int any_needs_host_sampler(const rp_scheduler *s) {
    for (int i = 0; i < s->num_running; i++)
        if (needs_host_sampler(s->running[i])) return 1;
    for (const rp_request *w = s->wait_head; w; w = w->next)
        if (needs_host_sampler(w)) return 1;
    return 0;
}

/* Schedules and launches one step; returns its slot or -1 when there was
 * nothing to run (or the launch failed). */
static int launch_step(rp_engine *e) {
    double t0 = rp_now_s();
    rp_scheduler *s = e->sched;
    int n = rp_scheduler_schedule(s);
    if (n == 0) return -1;
    /* peaks as scheduled, before this step's finished requests leave */
    if (s->num_running > e->stats.peak_running) e->stats.peak_running = s->num_running;
    int used = e->pool->num_pages - rp_page_pool_num_free(e->pool);
    if (used > e->stats.kv_pages_peak_used) e->stats.kv_pages_peak_used = used;
    int slot = e->overlap ? e->cur_step ^ 1 : 0;
    rp_step *st = &e->steps[slot];
    rp_batch_begin(e->bb);
    st->device_sampling = e->backend->ops->read_tokens != NULL;
    for (int i = 0; i < n; i++) {
        rp_sched_item *it = &s->plan[i];
        rp_request *r = it->req;
        st->logit_row[i] = rp_batch_add(e->bb, r->row, r->tokens + r->cached, it->num_tokens, r->cached, it->samples);
        RP_ASSERT(st->logit_row[i] >= 0 || !it->samples);
        st->out_index[i] = r->num_output;
        if (it->samples) {
            if (needs_host_sampler(r)) st->device_sampling = 0;
            const rp_sampling_params *p = &r->sampling;
            e->dev_params[st->logit_row[i]] = (rp_sample_params){.temperature = p->temperature, .top_p = p->top_p,
                                                                 .top_k = p->top_k, .min_p = p->min_p,
                                                                 .seed = p->seed, .step = (uint64_t)r->num_output,
                                                                 .top_logprobs = p->top_logprobs};
        }
    }
    rp_batch *bt = rp_batch_finish(e->bb);
    bt->sample = st->device_sampling ? e->dev_params : NULL;
    e->cpu_ms_total += (rp_now_s() - t0) * 1e3;
    rp_err err;
    if (rp_backend_forward(e->backend, bt, &err)) {
        rp_log_error("forward failed: %s", err.msg);
        rp_scheduler_commit(s);
        fail_running(e, err.msg);
        return -1;
    }
    e->launched++;
    st->active = 1;
    st->id = e->launched;
    st->n = n;
    memcpy(st->items, s->plan, (size_t)n * sizeof *st->items);
    rp_scheduler_commit(s);
    for (int i = 0; i < n; i++) {
        rp_request *r = st->items[i].req;
        r->last_step = st->id;
        /* overlap: reserve the output slot with a reference to the row the
         * device samples it into; the next step can feed it before the
         * host has seen it */
        if (e->overlap && st->items[i].samples) r->tokens[rp_request_len(r)] = -(st->logit_row[i] + 1), r->num_output++;
    }
    e->cur_step = slot;
    e->stats.steps++;
    return slot;
}

/* Reads a launched step's tokens and hands them to their requests. */
static void collect_step(rp_engine *e, int slot) {
    rp_step *st = &e->steps[slot];
    rp_err err;
    int rc = st->device_sampling
                 ? e->backend->ops->read_tokens(e->backend, e->dev_tokens, e->dev_logprobs, e->dev_top, &err)
                                 : rp_backend_read_logits(e->backend, e->logits, &err);
    st->active = 0;
    if (rc) {
        rp_log_error("forward failed: %s", err.msg);
        fail_running(e, err.msg);
        return;
    }
    e->completed = st->id;
    for (int i = 0; i < st->n; i++) {
        if (!st->items[i].samples) continue;
        rp_request *r = st->items[i].req;
        int row = st->logit_row[i], k = st->out_index[i];
        int32_t tok;
        float lp = 0;
        rp_top_logprobs host_top;
        const rp_top_logprobs *top = &host_top;
        if (r->retiring) continue;
        if (st->device_sampling) {
            tok = e->dev_tokens[row];
            lp = e->dev_logprobs[row];
            top = &e->dev_top[row];
        } else {
            tok = rp_sampler_sample_top(e->sampler, &r->sampling,
                                        e->logits + (size_t)row * e->model->cfg.vocab_size, r->tokens, r->num_prompt,
                                        r->tokens + r->num_prompt, k, (uint64_t)k, &lp, &host_top);
        }
        on_sampled(e, r, k, tok, lp, top);
    }
    release_retired(e);
}

/* One turn of the engine loop. Without overlap: launch, wait, collect.
 * With overlap: launch step N+1 first, then collect step N while the
 * device runs N+1. */
static void step(rp_engine *e) {
    rp_step *prev = &e->steps[e->cur_step];
    int had_prev = e->overlap && prev->active;
    int prev_slot = e->cur_step;
    /* The host needs real tokens (penalties), or the step in flight sampled
     * on the host so the device holds no tokens to refer to: no overlap now. */
    if (had_prev && (!prev->device_sampling || any_needs_host_sampler(e->sched))) {
        collect_step(e, prev_slot);
        had_prev = 0;
    }
    int slot = launch_step(e);
    if (had_prev) collect_step(e, prev_slot);
    if (slot >= 0 && !e->overlap) collect_step(e, slot);
    if (slot < 0 && !had_prev) {
        /* Nothing launched and nothing in flight: a request that cannot be
         * scheduled (should not happen: submit checks it fits); fail it
         * rather than spin. */
        rp_scheduler *s = e->sched;
        if (s->wait_head) finish(e, s->wait_head, -1, 0, NULL, RP_FINISH_REASON_ERROR, "the request cannot be scheduled");
    }
}

static void *engine_main(void *arg) {
    rp_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            /* new requests */
            while (e->inbox_head) {
                rp_request *r = e->inbox_head;
                e->inbox_head = r->next;
                if (!e->inbox_head) e->inbox_tail = NULL;
                rp_scheduler_enqueue(e->sched, r);
            }
            if (e->num_aborts || e->stopping) break;
            if (e->sched->num_running + e->sched->num_waiting > 0) break;
            e->busy = 0;
            pthread_cond_broadcast(&e->idle);
            pthread_cond_wait(&e->work, &e->mu);
        }
        e->busy = 1;
        int stopping = e->stopping;
        int na = e->num_aborts;
        rp_request_id ids[na > 0 ? na : 1];
        if (na) memcpy(ids, e->aborts, (size_t)na * sizeof *ids);
        e->num_aborts = 0;
        pthread_mutex_unlock(&e->mu);

        for (int k = 0; k < na; k++) {
            rp_request *found = NULL;
            for (int i = 0; i < e->sched->num_running && !found; i++)
                if (e->sched->running[i]->id == ids[k]) found = e->sched->running[i];
            for (rp_request *w = e->sched->wait_head; w && !found; w = w->next)
                if (w->id == ids[k]) found = w;
            if (found) finish(e, found, -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
        }
        if (stopping) {
            if (e->steps[e->cur_step].active) collect_step(e, e->cur_step);
            e->completed = e->launched;
            release_retired(e);
            while (e->sched->num_running) finish(e, e->sched->running[0], -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
            while (e->sched->wait_head) finish(e, e->sched->wait_head, -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
            break;
        }
        step(e);
        pthread_mutex_lock(&e->mu);
        rp_engine_stats *ss = &e->snapshot;
        *ss = e->stats;
        ss->running = e->sched->num_running;
        ss->waiting = e->sched->num_waiting;
        ss->kv_pages_free = rp_page_pool_num_free(e->pool);
        ss->preemptions = e->sched->preemptions;
        ss->cpu_ms_per_step = e->stats.steps ? e->cpu_ms_total / (double)e->stats.steps : 0;
        if (e->backend->ops->stats) {
            rp_backend_stats bs;
            e->backend->ops->stats(e->backend, &bs);
            ss->graph_replays = bs.graph_replays;
            ss->forwards = bs.forwards;
        }
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- creation ------------------------------------------------------------- */

static int cpu_auto_pages(const rp_engine *e, int page_size) {
    const rp_model_config *c = &e->model->cfg;
    double per_token = (double)c->num_layers * 2 * c->num_kv_heads * c->head_dim * 4; /* fp32 KV */
    long pages_avail = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    double avail = pages_avail > 0 && page_bytes > 0 ? (double)pages_avail * page_bytes : 4e9;
    double want = (double)e->cfg.max_running_requests * e->max_context * per_token;
    double cap = avail * 0.25 * e->cfg.memory_ratio;
    double bytes = want < cap ? want : cap;
    int pages = (int)(bytes / per_token / page_size);
    int min_pages = (e->max_context + page_size - 1) / page_size;
    return pages < min_pages ? min_pages : pages;
}

rp_engine *rp_engine_create(const rp_engine_config *cfg_in, char *errbuf, size_t errlen) {
    rp_engine *e = calloc(1, sizeof *e);
    if (!e) {
        set_err(errbuf, errlen, "out of memory");
        return NULL;
    }
    e->cfg = *cfg_in;
    rp_engine_config *cfg = &e->cfg;
    if (!cfg->device) cfg->device = "auto";
    if (cfg->page_size <= 0) cfg->page_size = 16;
    if (cfg->memory_ratio <= 0 || cfg->memory_ratio > 1) cfg->memory_ratio = 0.9;
    if (cfg->max_running_requests <= 0) cfg->max_running_requests = 256;
    if (cfg->max_prefill_tokens <= 0) cfg->max_prefill_tokens = 16384;
    if (cfg->max_prefill_tokens < cfg->max_running_requests) cfg->max_prefill_tokens = cfg->max_running_requests;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->idle, NULL);
    e->next_id = 1;
    rp_err err;
    int use_cuda = !strcmp(cfg->device, "cuda") || (!strcmp(cfg->device, "auto") && rp_cuda_device_count() > 0);
    rp_load_options lo = {.format = cfg->load_dummy ? RP_LOAD_DUMMY : RP_LOAD_AUTO, .seed = cfg->weight_seed,
                          .progress = 1, .lazy_dummy = use_cuda};
    if ((!cfg->model_dir) == (!cfg->dummy_name)) {
        set_err(errbuf, errlen, "give exactly one of a model directory or a dummy model name");
        goto fail;
    }
    e->model = cfg->model_dir ? rp_model_load(cfg->model_dir, &lo, &err) : rp_model_dummy(cfg->dummy_name, &lo, &err);
    if (!e->model) {
        set_err(errbuf, errlen, "%s", err.msg);
        goto fail;
    }
    const rp_model_config *c = &e->model->cfg;
    rp_log_info("model: %s, %d layers, hidden %d, %d heads (%d kv) x %d, vocab %d, %.2fB params", c->arch_name,
                c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim, c->vocab_size,
                (double)rp_config_num_params(c) / 1e9);
    if (e->model->dummy && !cfg->quiet_model_warning)
        rp_log_warn("the weights are RANDOM (dummy): output is meaningless text, useful only for testing and timing");
    const char *tdir = cfg->tokenizer_dir ? cfg->tokenizer_dir : cfg->model_dir;
    if (tdir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", tdir);
        if (cfg->tokenizer_dir || access(path, R_OK) == 0) {
            if (!(e->tok = rp_tokenizer_load(tdir, &err))) {
                set_err(errbuf, errlen, "%s", err.msg);
                goto fail;
            }
        }
    }
    if (cfg->chat_template) {
        rp_chat_template_kind kind;
        if (!e->tok) {
            set_err(errbuf, errlen, "a chat template was given but the model has no tokenizer");
            goto fail;
        }
        if (rp_chat_template_from_name(cfg->chat_template, &kind, &err)) {
            set_err(errbuf, errlen, "%s", err.msg);
            goto fail;
        }
        rp_tokenizer_set_chat_template(e->tok, kind);
    }
    e->max_context = cfg->max_context > 0 && cfg->max_context < c->max_position_embeddings ? cfg->max_context
                                                                                           : c->max_position_embeddings;
    int num_pages = cfg->num_pages > 0 ? cfg->num_pages : use_cuda ? 0 : cpu_auto_pages(e, cfg->page_size);
    e->max_logits = cfg->max_running_requests;
    rp_backend_config bc = {.num_pages = num_pages, .page_size = cfg->page_size,
                            .max_batch_tokens = cfg->max_prefill_tokens,
                            .max_batch_seqs = cfg->max_running_requests, .max_logit_rows = e->max_logits,
                            .num_threads = cfg->threads, .disable_cuda_graph = cfg->disable_cuda_graph,
                            .cuda_graph_max_bs = cfg->cuda_graph_max_bs, .memory_ratio = cfg->memory_ratio};
    e->backend = use_cuda ? rp_backend_cuda_new(e->model, &bc, &err) : rp_backend_cpu_new(e->model, &bc, &err);
    if (!e->backend) {
        set_err(errbuf, errlen, "%s backend: %s", use_cuda ? "cuda" : "cpu", err.msg);
        goto fail;
    }
    num_pages = e->backend->cfg.num_pages; /* the backend sized it when asked to */
    /* One request must always fit the pool, or preemption could not
     * guarantee progress (vLLM refuses to start in that case; replay
     * shortens the context and says so). */
    if ((long)num_pages * cfg->page_size < e->max_context) {
        rp_log_warn("engine: the KV cache holds %d tokens, less than the context of %d: requests are limited to %d",
                    num_pages * cfg->page_size, e->max_context, num_pages * cfg->page_size);
        e->max_context = num_pages * cfg->page_size;
    }
    e->pool = rp_page_pool_new(num_pages, cfg->page_size);
    e->table = e->pool ? rp_page_table_new(e->pool, cfg->max_running_requests, e->max_context) : NULL;
    rp_sched_config sc = {.max_running = cfg->max_running_requests, .token_budget = cfg->max_prefill_tokens,
                          .max_context = e->max_context,
                          .chunk = cfg->chunked_prefill_size > 0 ? cfg->chunked_prefill_size : cfg->max_prefill_tokens};
    e->sched = e->table ? rp_scheduler_new(&sc, e->table) : NULL;
    e->bb = e->table ? rp_batch_builder_new(e->table, cfg->max_prefill_tokens, cfg->max_running_requests, e->max_logits)
                     : NULL;
    for (int k = 0; k < 2; k++) {
        e->steps[k].items = calloc((size_t)cfg->max_running_requests, sizeof *e->steps[k].items);
        e->steps[k].logit_row = calloc((size_t)cfg->max_running_requests, sizeof(int));
        e->steps[k].out_index = calloc((size_t)cfg->max_running_requests, sizeof(int));
        if (!e->steps[k].items || !e->steps[k].logit_row || !e->steps[k].out_index) {
            set_err(errbuf, errlen, "out of memory");
            goto fail;
        }
    }
    e->overlap = e->backend->supports_token_refs && !cfg->disable_overlap;
    e->sampler = rp_sampler_new(c->vocab_size);
    e->logits = malloc((size_t)e->max_logits * c->vocab_size * sizeof *e->logits);
    e->dev_params = calloc((size_t)e->max_logits, sizeof *e->dev_params);
    e->dev_tokens = calloc((size_t)e->max_logits, sizeof *e->dev_tokens);
    e->dev_logprobs = calloc((size_t)e->max_logits, sizeof *e->dev_logprobs);
    e->dev_top = calloc((size_t)e->max_logits, sizeof *e->dev_top);
    if (!e->sched || !e->bb || !e->sampler || !e->logits || !e->dev_params || !e->dev_tokens || !e->dev_logprobs ||
        !e->dev_top) {
        set_err(errbuf, errlen, "out of memory setting up the engine");
        goto fail;
    }
    e->stats.kv_pages_total = num_pages;
    e->stats.max_total_tokens = num_pages * cfg->page_size;
    e->snapshot = e->stats;
    e->snapshot.kv_pages_free = num_pages;
    rp_log_info("engine: %d KV pages of %d tokens (%d tokens in all), up to %d running requests, %d tokens per step",
                num_pages, cfg->page_size, num_pages * cfg->page_size, cfg->max_running_requests,
                cfg->max_prefill_tokens);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        set_err(errbuf, errlen, "cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    return e;
fail:
    rp_engine_destroy(e);
    return NULL;
}

void rp_engine_destroy(rp_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_signal(&e->work);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    while (e->inbox_head) {
        rp_request *r = e->inbox_head;
        e->inbox_head = r->next;
        rp_request_free(r);
    }
    free(e->aborts);
    free(e->live);
    for (int i = 0; i < e->num_retiring; i++) rp_request_free(e->retiring[i]);
    free(e->retiring);
    for (int k = 0; k < 2; k++) {
        free(e->steps[k].items);
        free(e->steps[k].logit_row);
        free(e->steps[k].out_index);
    }
    free(e->logits);
    free(e->dev_params);
    free(e->dev_tokens);
    free(e->dev_logprobs);
    free(e->dev_top);
    rp_sampler_free(e->sampler);
    rp_batch_builder_free(e->bb);
    rp_scheduler_free(e->sched);
    rp_page_table_free(e->table);
    rp_page_pool_free(e->pool);
    rp_backend_destroy(e->backend);
    rp_tokenizer_free(e->tok);
    rp_model_free(e->model);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    free(e);
}

/* ---- submit / abort ----------------------------------------------------------- */

int rp_engine_submit(rp_engine *e, const rp_request_params *p, rp_token_callback cb, void *user,
                     rp_request_id *id_out, char *errbuf, size_t errlen) {
    const rp_model_config *c = &e->model->cfg;
    rp_err err;
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    sp.temperature = p->temperature;
    sp.top_p = p->top_p;
    sp.top_k = p->top_k;
    sp.min_p = p->min_p;
    sp.repetition_penalty = p->repetition_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty;
    sp.seed = p->seed;
    sp.top_logprobs = p->top_logprobs;
    sp.has_seed = p->has_seed;
    if (rp_sampling_params_validate(&sp, c->vocab_size, &err)) return set_err(errbuf, errlen, "%s", err.msg);
    if (!sp.has_seed) {
        pthread_mutex_lock(&e->mu);
        sp.seed = rp_mix64((uint64_t)(rp_now_s() * 1e9) ^ (e->next_id << 20));
        pthread_mutex_unlock(&e->mu);
        sp.has_seed = 1;
    }
    if (p->max_tokens < 1) return set_err(errbuf, errlen, "max_tokens must be at least 1, got %d", p->max_tokens);
    if ((p->prompt != NULL) == (p->prompt_ids != NULL))
        return set_err(errbuf, errlen, "give exactly one of a prompt text or prompt token ids");
    if ((p->prompt || p->num_stop > 0) && !e->tok)
        return set_err(errbuf, errlen, "this model has no tokenizer: send token ids and no stop strings");
    int32_t *ids = NULL;
    size_t n = 0;
    if (p->prompt) {
        if (rp_tokenizer_encode(e->tok, p->prompt, strlen(p->prompt), &ids, &n, &err))
            return set_err(errbuf, errlen, "%s", err.msg);
        int bos = rp_tokenizer_bos_id(e->tok);
        if (bos >= 0 && (n == 0 || ids[0] != bos)) { /* as HF's tokenizer(text) adds it */
            int32_t *with = malloc((n + 1) * sizeof *with);
            if (!with) {
                free(ids);
                return set_err(errbuf, errlen, "out of memory");
            }
            with[0] = bos;
            memcpy(with + 1, ids, n * sizeof *ids);
            free(ids);
            ids = with;
            n++;
        }
    } else {
        if (p->num_prompt_ids <= 0) return set_err(errbuf, errlen, "the prompt is empty");
        for (int i = 0; i < p->num_prompt_ids; i++)
            if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= c->vocab_size)
                return set_err(errbuf, errlen, "prompt token id %d is outside the vocabulary (0..%d)", p->prompt_ids[i],
                               c->vocab_size - 1);
        n = (size_t)p->num_prompt_ids;
    }
    if (n == 0) {
        free(ids);
        return set_err(errbuf, errlen, "the prompt is empty");
    }
    if ((long)n >= e->max_context) {
        free(ids);
        return set_err(errbuf, errlen,
                       "this engine's maximum context length is %d tokens%s; the prompt has %zu tokens, leaving no "
                       "room for output",
                       e->max_context, e->max_context < c->max_position_embeddings ? " (limited by the KV cache)" : "",
                       n);
    }
    int pages_needed = rp_scheduler_pages_for(e->sched, (int)n + 1);
    if (pages_needed > e->pool->num_pages) {
        free(ids);
        return set_err(errbuf, errlen, "the prompt needs %d KV pages, more than the whole cache holds (%d)",
                       pages_needed, e->pool->num_pages);
    }
    for (int i = 0; i < p->num_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) {
            free(ids);
            return set_err(errbuf, errlen, "stop strings must not be empty");
        }
    if ((long)n + p->max_tokens > e->max_context) {
        /* as vLLM's server: an explicit max_tokens past the context is an error */
        free(ids);
        return set_err(errbuf, errlen,
                       "this engine's maximum context length is %d tokens; the request asks for %zu prompt tokens "
                       "plus %d output tokens", e->max_context, n, p->max_tokens);
    }
    rp_request *r = calloc(1, sizeof *r);
    int max_new = p->max_tokens;
    if (r) r->tokens = malloc(((size_t)n + (size_t)max_new + 1) * sizeof *r->tokens);
    if (!r || !r->tokens) {
        free(ids);
        rp_request_free(r);
        return set_err(errbuf, errlen, "out of memory");
    }
    memcpy(r->tokens, ids ? ids : p->prompt_ids, n * sizeof *r->tokens);
    free(ids);
    r->num_prompt = (int)n;
    r->max_tokens = max_new;
    r->sampling = sp;
    r->ignore_eos = p->ignore_eos;
    r->want_logprobs = p->logprobs;
    r->cb = cb;
    r->user = user;
    r->row = -1;
    if (p->num_stop_ids > 0) {
        r->stop_ids = malloc((size_t)p->num_stop_ids * sizeof *r->stop_ids);
        memcpy(r->stop_ids, p->stop_ids, (size_t)p->num_stop_ids * sizeof *r->stop_ids);
        r->num_stop_ids = p->num_stop_ids;
    }
    if (p->num_stop > 0) {
        r->stop = calloc((size_t)p->num_stop, sizeof *r->stop);
        for (int i = 0; i < p->num_stop; i++) r->stop[i] = strdup(p->stop[i]);
        r->num_stop = p->num_stop;
    }
    if (e->tok) {
        rp_detok_init(&r->detok, e->tok, 1);
        r->has_detok = 1;
    }
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    live_add(e, r->id);
    e->stats_prompt_tokens += n;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->busy = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    if (id_out) *id_out = r->id;
    return 0;
}

int rp_engine_abort(rp_engine *e, rp_request_id id) {
    pthread_mutex_lock(&e->mu);
    int known = 0;
    for (int i = 0; i < e->num_live && !known; i++) known = e->live[i] == id;
    if (known) {
        if (e->num_aborts == e->cap_aborts) {
            e->cap_aborts = e->cap_aborts ? e->cap_aborts * 2 : 16;
            e->aborts = realloc(e->aborts, (size_t)e->cap_aborts * sizeof *e->aborts);
            if (!e->aborts) abort();
        }
        e->aborts[e->num_aborts++] = id;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
    return known ? 0 : -1;
}

void rp_engine_wait_idle(rp_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (e->busy || e->inbox_head || e->num_aborts) pthread_cond_wait(&e->idle, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

void rp_engine_get_stats(rp_engine *e, rp_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->snapshot;
    out->prompt_tokens = e->stats_prompt_tokens;
    pthread_mutex_unlock(&e->mu);
}

int rp_engine_vocab_size(const rp_engine *e) { return e->model->cfg.vocab_size; }
int rp_engine_max_context(const rp_engine *e) { return e->max_context; }
const struct rp_tokenizer *rp_engine_tokenizer(const rp_engine *e) { return e->tok; }
