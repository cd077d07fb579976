/* The engine API (include/replay/engine.h): creation on a runner, the
 * engine thread and its inbox, abort, stats.
 *
 * submit() (submit.c) validates and tokenizes on the caller's thread, then
 * hands the request over through the inbox; abort() posts an id. The engine
 * thread loops: take new requests and aborts, run one step (step.c), publish
 * a stats snapshot; it sleeps when nothing is waiting or running. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/constraint.h"
#include "engine/draft.h"
#include "engine/draft_model.h"
#include "engine/engine_internal.h"
#include "engine/ngram.h"
#include "model/config.h"
#include "util/log.h"

/* The engine's defaults, the one place they are written: SGLang's on large
 * GPUs for the token budget and chunk (measured in bench/RESULTS.md); the
 * running set's size, when none is given, comes from the KV pool
 * (rp_sched_default_max_running in sched/scheduler.h, with the admission
 * policy it works with). On the
 * CPU a step is also held to about DEFAULT_CPU_STEP_MS, since newcomers,
 * aborts and destroy wait for the step in flight: prompt speed there differs
 * a hundredfold between hosts (~4 to ~400 tokens a second for a 0.6B model,
 * bench/RESULTS.md), so no token count keeps a step short everywhere, and
 * 500 ms stays well inside docs/server.md's 10 s for shutdown. A step feeds
 * at least STEP_MIN_PROMPT_TOKENS prompt tokens, and exactly that many
 * before any speed is measured. */
enum {
    DEFAULT_PAGE_SIZE = 16,
    DEFAULT_MAX_BATCHED_TOKENS = 16384,
    DEFAULT_CPU_STEP_MS = 500,
    STEP_MIN_PROMPT_TOKENS = 16,
};
#define DEFAULT_MEMORY_RATIO 0.9

void rp_engine_config_default(rp_engine_config *c) {
    memset(c, 0, sizeof *c);
    c->device = "auto";
    c->page_size = DEFAULT_PAGE_SIZE;
    c->memory_ratio = DEFAULT_MEMORY_RATIO;
    c->max_running_requests = 0; /* derived from the pool */
    c->max_batched_tokens = DEFAULT_MAX_BATCHED_TOKENS;
    /* 0: a prompt takes what the step leaves. With one long prompt
     * prefilled at a time (scheduler.h), a smaller chunk would only leave
     * the step short, padded to a graph bucket: 8 prompts of 30,000 tokens
     * on an H100 sampled first 16% sooner than in chunks of 8192, two
     * prompts a step (bench/RESULTS.md, "Issue 37") */
    c->chunked_prefill_size = 0;
    c->enable_prefix_caching = 1;
}

void rp_request_params_default(rp_request_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 16;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->repetition_penalty = 1.0f;
}

const char *rp_error_code_name(rp_error_code code) {
    switch (code) {
    case RP_ERROR_NONE: return "none";
    case RP_ERROR_INVALID_REQUEST: return "invalid_request";
    case RP_ERROR_CONTEXT_LENGTH: return "context_length";
    case RP_ERROR_UNSUPPORTED: return "unsupported";
    case RP_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    case RP_ERROR_INTERNAL: return "internal";
    }
    return "unknown";
}

/* ---- live ids ---------------------------------------------------------- */

static int live_add(rp_engine *e, rp_request_id id) {
    if (e->num_live == e->cap_live) {
        int cap = e->cap_live ? e->cap_live * 2 : 64;
        rp_request_id *live = realloc(e->live, (size_t)cap * sizeof *live);
        if (!live) return -1;
        e->live = live;
        e->cap_live = cap;
    }
    e->live[e->num_live++] = id;
    return 0;
}

void rp_engine_live_remove(rp_engine *e, rp_request_id id) {
    for (int i = 0; i < e->num_live; i++)
        if (e->live[i] == id) {
            e->live[i] = e->live[--e->num_live];
            return;
        }
}

int rp_engine_enqueue(rp_engine *e, rp_request *r, int prompt_tokens, rp_request_id *id_out) {
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id;
    if (live_add(e, r->id)) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    e->next_id++;
    if (id_out) *id_out = r->id;
    e->stats_prompt_tokens += (uint64_t)prompt_tokens;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->busy = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- the engine thread -------------------------------------------------- */

static rp_request *find_request(rp_scheduler *s, rp_request_id id) {
    for (int i = 0; i < s->num_running; i++)
        if (s->running[i]->id == id) return s->running[i];
    for (rp_request *w = s->wait_head; w; w = w->next)
        if (w->id == id) return w;
    return NULL;
}

/* Ends everything: the step in flight is read, every request gets ABORT. */
static void shut_down(rp_engine *e) {
    if (e->steps[e->cur_step].active) rp_engine_collect_step(e, e->cur_step);
    e->completed = e->launched;
    rp_engine_release_retired(e);
    while (e->sched->num_running)
        rp_engine_finish(e, e->sched->running[0], -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
    while (e->sched->wait_head) rp_engine_finish(e, e->sched->wait_head, -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
}

/* The scheduler's counts where get_stats reads them (under mu). */
static void publish_counts(rp_engine *e) {
    rp_engine_stats *ss = &e->snapshot;
    ss->running = e->sched->num_running;
    ss->waiting = e->sched->num_waiting;
    ss->kv_pages_free = rp_scheduler_pages_available(e->sched);
    ss->preemptions = e->sched->preemptions;
    if (e->cache) {
        rp_prefix_cache_stats cs;
        rp_prefix_cache_get_stats(e->cache, &cs);
        ss->kv_pages_cached = cs.cached_pages;
        ss->prefix_cache_queried_tokens = cs.queried_tokens;
        ss->prefix_cache_hit_tokens = cs.hit_tokens;
    }
}

void rp_engine_debug_check(rp_engine *e) {
    if (!e->cfg.debug_check_every_step) return;
    rp_err err;
    if (rp_scheduler_check(e->sched, &err)) {
        rp_log_error("%s", err.msg);
        RP_ASSERT(!"the KV page accounting is broken");
    }
}

void rp_engine_publish_plan(rp_engine *e) {
    pthread_mutex_lock(&e->mu);
    publish_counts(e);
    pthread_mutex_unlock(&e->mu);
}

/* Copies the engine thread's counters where get_stats reads them (under mu). */
static void publish_stats(rp_engine *e) {
    rp_engine_stats *ss = &e->snapshot;
    *ss = e->stats;
    publish_counts(e);
    ss->cpu_ms_per_step = e->stats.steps ? e->cpu_ms_total / (double)e->stats.steps : 0;
    rp_backend *be = e->run->backend;
    if (be->ops->stats) {
        rp_backend_stats bs;
        be->ops->stats(be, &bs);
        ss->graph_replays = bs.graph_replays;
        ss->forwards = bs.forwards;
    }
}

static void *engine_main(void *arg) {
    rp_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            while (e->inbox_head) { /* new requests */
                rp_request *r = e->inbox_head;
                e->inbox_head = r->next;
                if (!e->inbox_head) e->inbox_tail = NULL;
                rp_scheduler_enqueue(e->sched, r);
            }
            if (e->num_aborts || e->stopping) break;
            if (e->sched->num_running + e->sched->num_waiting > 0 && !e->held) break;
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
            rp_request *found = find_request(e->sched, ids[k]);
            if (found) rp_engine_finish(e, found, -1, 0, NULL, RP_FINISH_REASON_ABORT, NULL);
        }
        if (stopping) {
            shut_down(e);
            break;
        }
        rp_engine_step(e);
        rp_engine_debug_check(e);
        pthread_mutex_lock(&e->mu);
        publish_stats(e);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&e->mu);
    e->busy = 0;
    pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- creation ------------------------------------------------------------- */

static void set_error(rp_error *err, rp_error_code code, const char *msg) {
    if (!err) return;
    err->code = code;
    err->param[0] = 0;
    snprintf(err->message, sizeof err->message, "%s", msg);
}

/* The tokenizer of tokenizer_dir, else of model_dir when it has one, with
 * its chat template (the file cfg->chat_template, else the model's). */
static int load_tokenizer(rp_engine *e, rp_err *err) {
    const rp_engine_config *cfg = &e->cfg;
    const char *tdir = cfg->tokenizer_dir ? cfg->tokenizer_dir : cfg->model_dir;
    if (tdir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", tdir);
        if ((cfg->tokenizer_dir || access(path, R_OK) == 0) && !(e->tok = rp_tokenizer_load(tdir, err))) return RP_ERR;
    }
    if (cfg->chat_template && !e->tok) return rp_errf(err, "a chat template was given but the model has no tokenizer");
    /* compiled now: a template replay cannot interpret fails the start, not a request */
    if (e->tok && rp_tokenizer_load_chat_template(e->tok, tdir, cfg->model_dir, cfg->chat_template, err)) return RP_ERR;
    return RP_OK;
}

/* A tokenizer with ids beyond the model's vocabulary belongs to another
 * model: its prompts would index past the embedding table. The config is
 * read again by the runner; it is small. */
static int check_tokenizer_vocab(rp_engine *e, rp_err *err) {
    if (!e->tok) return RP_OK;
    rp_model_config mc;
    const rp_engine_config *cfg = &e->cfg;
    if (cfg->model_dir ? rp_config_load_dir(&mc, cfg->model_dir, err) : rp_config_preset(&mc, cfg->dummy_name, err))
        return RP_ERR;
    const int n = rp_tokenizer_vocab_size(e->tok);
    if (n > mc.vocab_size)
        return rp_errf(err, "the tokenizer of %s has %d ids, more than the model's vocabulary of %d: it belongs to "
                            "another model",
                       cfg->tokenizer_dir ? cfg->tokenizer_dir : cfg->model_dir, n, mc.vocab_size);
    return RP_OK;
}

/* Fills in what a caller left at 0 with the defaults. */
/* The runner an engine of cfg (completed) runs on, backend_seqs sequences
 * at most; a worker node builds the same (rp_engine_run_worker). */
static int engine_runner_config(const rp_engine_config *cfg, int backend_seqs, rp_runner_config *rc, rp_err *err) {
    rp_kv_dtype kv_dtype;
    if (rp_kv_dtype_parse(cfg->kv_cache_dtype, &kv_dtype, err)) return RP_ERR;
    /* a round's drafts want logits rows of their own, and each is a
     * one-token sequence of the step (batch.h's rp_batch_add_positions) */
    const int spec_rows = cfg->speculative_method ? RP_SPEC_MAX_ROWS : 0;
    *rc = (rp_runner_config){.model_dir = cfg->model_dir, .dummy_name = cfg->dummy_name, .load_dummy = cfg->load_dummy,
                             .weight_seed = cfg->weight_seed, .quantize_fp8 = cfg->quantize_fp8, .load_progress = 1,
                             .device = cfg->device, .threads = cfg->threads, .page_size = cfg->page_size,
                             .num_pages = cfg->num_pages, .kv_dtype = kv_dtype, .memory_ratio = cfg->memory_ratio,
                             .max_seqs = backend_seqs + spec_rows, .max_context = cfg->max_context,
                             .max_batched_tokens = cfg->max_batched_tokens,
                             .max_logit_rows = backend_seqs + spec_rows + RP_SCHED_PROMPT_LOGIT_ROWS,
                             .disable_cuda_graph = cfg->disable_cuda_graph,
                             .cuda_graph_max_bs = cfg->cuda_graph_max_bs,
                             .tuning = {.disable_decode_step = cfg->disable_decode_step},
                             .tensor_parallel_size = cfg->tensor_parallel_size,
                             .nnodes = cfg->nnodes,
                             .node_rank = cfg->node_rank,
                             .dist_init_addr = cfg->dist_init_addr,
                             .dist_timeout_ms = cfg->dist_timeout_s * 1000,
                             .disable_custom_all_reduce = cfg->disable_custom_all_reduce};
    return 0;
}

static void config_complete(rp_engine_config *cfg) {
    if (!cfg->device) cfg->device = "auto";
    if (cfg->page_size <= 0) cfg->page_size = DEFAULT_PAGE_SIZE;
    if (cfg->memory_ratio <= 0 || cfg->memory_ratio > 1) cfg->memory_ratio = DEFAULT_MEMORY_RATIO;
    if (cfg->max_running_requests < 0) cfg->max_running_requests = 0; /* derived once the pool is sized */
    if (cfg->max_batched_tokens <= 0) cfg->max_batched_tokens = DEFAULT_MAX_BATCHED_TOKENS;
    /* a decode step of every running request must fit one step (a derived
     * running set is held to the step instead) */
    if (cfg->max_batched_tokens < cfg->max_running_requests) cfg->max_batched_tokens = cfg->max_running_requests;
    if (cfg->speculative_method != RP_SPEC_NONE) {
        if (!cfg->num_speculative_tokens) cfg->num_speculative_tokens = RP_SPEC_DEFAULT_K;
        if (!cfg->prompt_lookup_min && !cfg->prompt_lookup_max) {
            cfg->prompt_lookup_min = RP_NGRAM_DEFAULT_MIN;
            cfg->prompt_lookup_max = RP_NGRAM_DEFAULT_MAX;
        } else if (!cfg->prompt_lookup_min) {
            cfg->prompt_lookup_min = 1;
        } else if (!cfg->prompt_lookup_max) {
            cfg->prompt_lookup_max = cfg->prompt_lookup_min;
        }
    }
}

/* The speculative decoding options, in vLLM's words where it has them. */
static int check_speculative(const rp_engine_config *cfg, rp_err *err) {
    const int has_model = cfg->speculative_model || cfg->speculative_dummy_weights;
    if (cfg->speculative_method == RP_SPEC_NONE) {
        if (has_model) return rp_errf(err, "a speculative model is given but speculative decoding is off");
        return 0;
    }
    if (cfg->speculative_method != RP_SPEC_NGRAM && cfg->speculative_method != RP_SPEC_DRAFT_MODEL)
        return rp_errf(err, "unknown speculative method %d", cfg->speculative_method);
    if (cfg->num_speculative_tokens < 1 || cfg->num_speculative_tokens > RP_SPEC_MAX_K)
        return rp_errf(err, "num_speculative_tokens must be from 1 to %d, got %d", RP_SPEC_MAX_K,
                       cfg->num_speculative_tokens);
    if (cfg->speculative_method == RP_SPEC_DRAFT_MODEL && cfg->tensor_parallel_size > 1)
        return rp_errp(err, "tensor_parallel_size",
                       "a draft model with --tensor-parallel-size %d is not supported yet (the n-gram method is)",
                       cfg->tensor_parallel_size);
    if (cfg->speculative_method == RP_SPEC_DRAFT_MODEL) {
        if ((!cfg->speculative_model) == (!cfg->speculative_dummy_weights))
            return rp_errf(err, "the draft model method needs exactly one of speculative_model (a directory) or "
                                "speculative_dummy_weights (a dummy shape)");
        return 0;
    }
    if (has_model) return rp_errf(err, "n-gram drafting takes no speculative model");
    return rp_ngram_validate(cfg->prompt_lookup_min, cfg->prompt_lookup_max, err);
}

/* The draft model's side of the engine config: the target's device, page
 * size and graphs; a round drafts for at most rp_spec_max_seqs(k) requests, and
 * a catch-up step (a new request's prompt) takes up to 2,048 tokens. */
static rp_draft_model_config draft_config(const rp_engine_config *cfg, int max_rows, int max_context) {
    const int tokens = cfg->max_batched_tokens < 2048 ? cfg->max_batched_tokens : 2048;
    return (rp_draft_model_config){.model_dir = cfg->speculative_model,
                                   .dummy_name = cfg->speculative_dummy_weights,
                                   .load_dummy = cfg->speculative_load_dummy,
                                   .weight_seed = cfg->weight_seed,
                                   .device = cfg->device,
                                   .threads = cfg->threads,
                                   .page_size = cfg->page_size,
                                   .max_context = max_context,
                                   .max_seqs = rp_spec_max_seqs(cfg->num_speculative_tokens),
                                   .max_batched_tokens = tokens > RP_SPEC_MAX_ROWS ? tokens : RP_SPEC_MAX_ROWS,
                                   .max_rows = max_rows,
                                   .disable_cuda_graph = cfg->disable_cuda_graph};
}

rp_engine *rp_engine_create(const rp_engine_config *cfg_in, rp_error *errout) {
    rp_engine *e = calloc(1, sizeof *e);
    if (!e) {
        set_error(errout, RP_ERROR_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    e->cfg = *cfg_in;
    rp_engine_config *cfg = &e->cfg;
    config_complete(cfg);
    /* The pool is sized by the backend after its batch buffers (what is left
     * of the GPU memory), so a running set derived from the pool is known
     * only afterwards: the backend and the page table are then sized for
     * the largest one it can be. */
    const int derive_running = cfg->max_running_requests == 0;
    int backend_seqs = derive_running ? RP_SCHED_MAX_RUNNING : cfg->max_running_requests;
    if (backend_seqs > cfg->max_batched_tokens) backend_seqs = cfg->max_batched_tokens;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->constraint_mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->idle, NULL);
    e->next_id = 1;
    rp_err err;
    if (check_speculative(cfg, &err)) {
        set_error(errout, RP_ERROR_INVALID_REQUEST, err.msg);
        rp_engine_destroy(e);
        return NULL;
    }
    rp_runner_config rc;
    if (engine_runner_config(cfg, backend_seqs, &rc, &err)) {
        set_error(errout, RP_ERROR_INVALID_REQUEST, err.msg);
        rp_engine_destroy(e);
        return NULL;
    }
    /* the tokenizer first: a wrong one is reported before the weights load */
    if (load_tokenizer(e, &err) || check_tokenizer_vocab(e, &err)) goto fail;
    /* a draft model's weights are mapped first, so that the target's KV
     * pool leaves it room beside the target */
    rp_model *draft_model = NULL;
    if (cfg->speculative_method == RP_SPEC_DRAFT_MODEL) {
        const rp_draft_model_config dc = draft_config(cfg, backend_seqs, 0);
        if (!(draft_model = rp_draft_model_load(&dc, cfg->tokenizer_dir ? cfg->tokenizer_dir : cfg->model_dir, &err)))
            goto fail;
        rp_draft_model_memory(draft_model, &dc, &rc.reserve_bytes, &rc.shadow_page_bytes);
    }
    if (!(e->run = rp_runner_new(&rc, &err))) {
        rp_model_free(draft_model);
        goto fail;
    }
    if (draft_model) {
        const rp_draft_model_config dc = draft_config(cfg, backend_seqs, e->run->max_context);
        if (!(e->draft = rp_draft_model_new(draft_model, &dc, &e->run->model->cfg, e->run->pool->num_pages, &err)))
            goto fail;
    }
    if (e->run->model->dummy && !cfg->quiet_model_warning)
        rp_log_warn("the weights are RANDOM (dummy): output is meaningless text, useful only for testing and timing");
    e->max_context = e->run->max_context;
    e->max_logits = e->run->max_logit_rows;
    const int num_pages = e->run->pool->num_pages;
    if (derive_running) {
        cfg->max_running_requests = rp_sched_default_max_running((long)num_pages * cfg->page_size, e->max_context);
        if (cfg->max_running_requests > backend_seqs) cfg->max_running_requests = backend_seqs;
    }
    rp_sched_config sc = {.max_running = cfg->max_running_requests, .max_batched_tokens = cfg->max_batched_tokens,
                          .max_context = e->max_context, .max_long_prefills = RP_SCHED_LONG_PREFILLS,
                          .prompt_logit_rows = RP_SCHED_PROMPT_LOGIT_ROWS,
                          .chunk = cfg->chunked_prefill_size > 0 ? cfg->chunked_prefill_size : cfg->max_batched_tokens,
                          .policy = RP_SCHED_POLICY_DEFAULT};
    if (cfg->disable_decode_reservation) sc.policy.reserve_decode = 0;
    if (cfg->enable_prefix_caching && !(e->cache = rp_prefix_cache_new(e->run->pool))) goto oom;
    e->sched = rp_scheduler_new(&sc, e->run->table, e->cache);
    for (int k = 0; k < 2; k++) {
        e->steps[k].items = calloc((size_t)cfg->max_running_requests, sizeof *e->steps[k].items);
        e->steps[k].logit_row = calloc((size_t)cfg->max_running_requests, sizeof(int));
        e->steps[k].out_index = calloc((size_t)cfg->max_running_requests, sizeof(int));
        e->steps[k].chunk_start = calloc((size_t)cfg->max_running_requests, sizeof(int));
        e->steps[k].prompt_row = calloc((size_t)cfg->max_running_requests, sizeof(int));
        if (!e->steps[k].items || !e->steps[k].logit_row || !e->steps[k].out_index || !e->steps[k].chunk_start ||
            !e->steps[k].prompt_row)
            goto oom;
    }
    /* a speculative round's drafts come from its tokens: each step is read
     * before the next one is launched */
    e->overlap = e->run->backend->supports_token_refs && !cfg->disable_overlap && !cfg->speculative_method;
    e->spec_k = cfg->speculative_method ? cfg->num_speculative_tokens : 0;
    e->device_masks = e->run->backend->ops->sample_masked != NULL && e->run->backend->ops->read_tokens != NULL &&
                      !cfg->disable_device_masks;
    if (e->run->backend->forward_is_synchronous && cfg->step_ms_target >= 0) {
        e->step_ms = cfg->step_ms_target ? cfg->step_ms_target : DEFAULT_CPU_STEP_MS;
        e->step_min_tokens = STEP_MIN_PROMPT_TOKENS;
        e->sched->prefill_cap = STEP_MIN_PROMPT_TOKENS;
    }
    e->sampler = rp_sampler_new(e->run->model->cfg.vocab_size);
    e->retiring = calloc((size_t)cfg->max_running_requests, sizeof *e->retiring);
    e->dev_params = calloc((size_t)e->max_logits, sizeof *e->dev_params);
    e->dev_tokens = calloc((size_t)e->max_logits, sizeof *e->dev_tokens);
    e->dev_logprobs = calloc((size_t)e->max_logits, sizeof *e->dev_logprobs);
    e->dev_top = calloc((size_t)e->max_logits, sizeof *e->dev_top);
    e->mask_of_row = malloc((size_t)e->max_logits * sizeof *e->mask_of_row);
    e->mask_end = calloc((size_t)e->max_logits, sizeof *e->mask_end);
    e->spec_top = calloc(RP_SPEC_MAX_K + 1, sizeof *e->spec_top);
    e->draft_reqs = calloc(RP_SPEC_MAX_ROWS, sizeof *e->draft_reqs);
    e->draft_want = calloc(RP_SPEC_MAX_ROWS, sizeof *e->draft_want);
    if (!e->sched || !e->sampler || !e->retiring || !e->dev_params || !e->dev_tokens || !e->dev_logprobs ||
        !e->dev_top || !e->spec_top || !e->draft_reqs || !e->draft_want || !e->mask_of_row || !e->mask_end)
        goto oom;
    e->stats.kv_pages_total = num_pages;
    e->stats.max_total_tokens = num_pages * cfg->page_size;
    e->stats.max_running_requests = cfg->max_running_requests;
    e->snapshot = e->stats;
    e->snapshot.kv_pages_free = num_pages;
    rp_log_info("engine: %d KV pages of %d tokens (%d tokens in all), up to %d running request%s%s, %d tokens per "
                "step",
                num_pages, cfg->page_size, num_pages * cfg->page_size, cfg->max_running_requests,
                cfg->max_running_requests == 1 ? "" : "s",
                derive_running ? " (derived from the KV pool; --max-running-requests overrides)" : "",
                cfg->max_batched_tokens);
    rp_log_info("engine: prefix caching %s", e->cache ? "on" : "off");
    if (e->spec_k && e->draft)
        rp_log_info("engine: speculative decoding: drafts from %s, %d a round, while at most %d requests decode",
                    cfg->speculative_model ? cfg->speculative_model : cfg->speculative_dummy_weights, e->spec_k,
                    rp_spec_max_seqs(e->spec_k));
    else if (e->spec_k)
        rp_log_info("engine: speculative decoding: n-gram drafts (match lengths %d..%d), %d a round, while at most %d "
                    "requests decode",
                    cfg->prompt_lookup_min, cfg->prompt_lookup_max, e->spec_k, rp_spec_max_seqs(e->spec_k));
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        set_error(errout, RP_ERROR_INTERNAL, "cannot start the engine thread");
        rp_engine_destroy(e);
        return NULL;
    }
    e->thread_started = 1;
    return e;
oom:
    set_error(errout, RP_ERROR_OUT_OF_MEMORY, "out of memory setting up the engine");
    rp_engine_destroy(e);
    return NULL;
fail:
    set_error(errout, RP_ERROR_INTERNAL, err.msg);
    rp_engine_destroy(e);
    return NULL;
}

int rp_engine_run_worker(const rp_engine_config *cfg_in, rp_error *errout) {
    rp_engine_config cfg = *cfg_in;
    config_complete(&cfg);
    rp_err err = {0};
    if (cfg.node_rank <= 0 || cfg.nnodes <= 1) {
        set_error(errout, RP_ERROR_INVALID_REQUEST, "a worker is a node other than 0 of several (--nnodes, --node-rank)");
        return RP_ERR;
    }
    if (check_speculative(&cfg, &err)) {
        set_error(errout, RP_ERROR_INVALID_REQUEST, err.msg);
        return RP_ERR;
    }
    /* the same backend shape as node 0's engine (rp_engine_create) */
    int backend_seqs = cfg.max_running_requests == 0 ? RP_SCHED_MAX_RUNNING : cfg.max_running_requests;
    if (backend_seqs > cfg.max_batched_tokens) backend_seqs = cfg.max_batched_tokens;
    rp_runner_config rc;
    if (engine_runner_config(&cfg, backend_seqs, &rc, &err)) {
        set_error(errout, RP_ERROR_INVALID_REQUEST, err.msg);
        return RP_ERR;
    }
    rp_runner *run = rp_runner_new(&rc, &err);
    int rc_run = run ? rp_engine_worker_run(run, &err) : RP_ERR;
    rp_runner_free(run);
    if (rc_run) set_error(errout, RP_ERROR_INTERNAL, err.msg);
    return rc_run;
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
        free(e->steps[k].chunk_start);
        free(e->steps[k].prompt_row);
    }
    free(e->dev_params);
    free(e->dev_tokens);
    free(e->dev_logprobs);
    free(e->dev_top);
    free(e->mask_of_row);
    free(e->mask_end);
    free(e->spec_top);
    free(e->draft_reqs);
    free(e->draft_want);
    rp_sampler_free(e->sampler);
    rp_scheduler_free(e->sched);
    rp_prefix_cache_free(e->cache); /* its pages go back to the runner's pool */
    rp_draft_model_free(e->draft);
    rp_runner_free(e->run);
    rp_engine_constraint_free(e); /* after every request and its matcher */
    rp_tokenizer_free(e->tok);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->constraint_mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->idle);
    free(e);
}

/* ---- abort, wait, stats ---------------------------------------------------- */

int rp_engine_abort(rp_engine *e, rp_request_id id) {
    pthread_mutex_lock(&e->mu);
    int known = 0;
    for (int i = 0; i < e->num_live && !known; i++) known = e->live[i] == id;
    if (known && e->num_aborts == e->cap_aborts) {
        int cap = e->cap_aborts ? e->cap_aborts * 2 : 16;
        rp_request_id *aborts = realloc(e->aborts, (size_t)cap * sizeof *aborts);
        if (aborts) {
            e->aborts = aborts;
            e->cap_aborts = cap;
        } else {
            rp_log_error("out of memory queueing the abort of request %llu", (unsigned long long)id);
            known = 0;
        }
    }
    if (known) {
        e->aborts[e->num_aborts++] = id;
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
    return known ? 0 : -1;
}

void rp_engine_hold(rp_engine *e, int hold) {
    pthread_mutex_lock(&e->mu);
    e->held = hold != 0;
    /* Released with requests queued: busy from now, not from when the
     * engine thread wakes, or a rp_engine_wait_idle in between would see an
     * idle engine with work in it. (While busy is 0 the engine thread is
     * waiting for work and leaves the scheduler alone.) */
    if (!e->held && !e->busy && e->sched->num_running + e->sched->num_waiting > 0) e->busy = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
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

int rp_engine_vocab_size(const rp_engine *e) { return e->run->model->cfg.vocab_size; }
int rp_engine_max_context(const rp_engine *e) { return e->max_context; }
const struct rp_tokenizer *rp_engine_tokenizer(const rp_engine *e) { return e->tok; }
