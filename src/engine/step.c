/* One step of the engine: ask the scheduler for a plan, turn it into a
 * backend batch, launch the forward (sampling on the device unless a
 * request needs the host sampler's penalties), and hand the sampled tokens
 * to their requests (output.c).
 *
 * Overlap: where the backend takes token references, step N + 1 is launched
 * before step N's tokens are read, its inputs naming the logit rows step N
 * samples into, so the host's scheduling and streaming hide behind the
 * device's work. A request that finishes in step N has already been fed into
 * step N + 1: that provisional token is dropped, and the request's pages stay
 * until step N + 1 has completed (output.c's retiring list).
 *
 * Structured output: a step with constrained requests is launched with its
 * sampling deferred (the forward does not need the masks, only the
 * sampler does); step N is collected, which advances the matchers, then
 * step N + 1's masks are computed and the backend samples it with them, all
 * while its forward runs. */
#include <string.h>

#include "engine/constraint.h"
#include "engine/draft.h"
#include "engine/engine_internal.h"
#include "engine/logit_proc.h"
#include "engine/prompt_logprobs.h"
#include "util/log.h"

/* Whether r's next step needs its logits on the host for more than the
 * sampler: a logit processor, or prompt logprobs still to record. */
static int needs_host_logits(const rp_request *r) {
    return rp_logit_proc_active(r, r->num_output) || rp_request_wants_prompt_logits(r);
}

/* Penalties over the request's history and the logit processors are
 * applied on the host, and so is structured output's mask where the
 * backend does not sample with masks (constraint.h). */
static int needs_host_sampler(const rp_engine *e, const rp_request *r) {
    const rp_sampling_params *p = &r->sampling;
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           (r->matcher != NULL && !e->device_masks) || needs_host_logits(r);
}

/* Whether any request's sampling needs the host sampler (penalties over its
 * history): such a step cannot overlap. */
static int any_needs_host_sampler(const rp_engine *e) {
    const rp_scheduler *s = e->sched;
    for (int i = 0; i < s->num_running; i++)
        if (needs_host_sampler(e, s->running[i])) return 1;
    for (const rp_request *w = s->wait_head; w; w = w->next)
        if (needs_host_sampler(e, w)) return 1;
    return 0;
}

/* A failed step leaves the K/V of the steps in flight unknown: the running
 * requests end without handing their pages to the prefix cache (cached =
 * 0), and the cache drops everything, since pages inserted at the launch of
 * a step that never ran hold nothing. */
static void fail_running(rp_engine *e, const char *msg) {
    e->completed = e->launched; /* nothing is in flight after a failure */
    e->steps[0].active = e->steps[1].active = 0;
    for (int i = 0; i < e->sched->num_running; i++) e->sched->running[i]->cached = 0;
    rp_engine_release_retired(e);
    while (e->sched->num_running > 0)
        rp_engine_finish(e, e->sched->running[0], -1, 0, NULL, RP_FINISH_REASON_ERROR, msg);
    if (e->cache) rp_prefix_cache_evict(e->cache, e->run->pool->num_pages);
}

/* A synchronous backend's steps take about e->step_ms: the next step's
 * prompt tokens are sized from this one's speed, fixed costs included (a
 * step faster than the target grows the next one, a slower one shrinks it,
 * so the size settles on the target as attention over a growing prompt gets
 * dearer). */
static void size_next_step(rp_engine *e, const rp_batch *bt, int prompt_tokens, double forward_ms) {
    if (!e->step_ms || prompt_tokens <= 0) return;
    int decodes = bt->num_tokens - prompt_tokens;
    double fit = bt->num_tokens * (double)e->step_ms / (forward_ms > 1e-3 ? forward_ms : 1e-3) - decodes;
    int cap = fit < e->cfg.max_batched_tokens ? (int)fit : e->cfg.max_batched_tokens;
    e->sched->prefill_cap = cap > e->step_min_tokens ? cap : e->step_min_tokens;
}

static uint64_t backend_replays(rp_backend *be) {
    rp_backend_stats bs = {0};
    if (be->ops->stats) be->ops->stats(be, &bs);
    return bs.graph_replays;
}

/* A completed step in the stats by kind, with the device time the backend
 * measured for its forward (the one just read). */
static void count_step(rp_engine *e, const rp_step *st) {
    rp_backend *be = e->run->backend;
    rp_backend_stats bs = {0};
    if (be->ops->stats) be->ops->stats(be, &bs);
    rp_step_kind_stats *k = &e->stats.kinds[st->kind];
    k->steps++;
    k->graph_replays += (uint64_t)st->graph;
    k->tokens += (uint64_t)st->tokens;
    k->prompt_tokens += (uint64_t)st->prompt_tokens;
    k->gpu_ms += bs.last_gpu_ms;
}

/* Schedules and launches one step; returns its slot or -1 when there was
 * nothing to run (or the launch failed). */
static int launch_step(rp_engine *e) {
    double t0 = rp_now_s();
    rp_scheduler *s = e->sched;
    rp_runner *run = e->run;
    rp_engine_propose_drafts(e);
    int n = rp_scheduler_schedule(s);
    if (n == 0) return -1;
    rp_engine_publish_plan(e);
    /* peaks as scheduled, before this step's finished requests leave */
    if (s->num_running > e->stats.peak_running) e->stats.peak_running = s->num_running;
    int used = run->pool->num_pages - rp_scheduler_pages_available(s);
    if (used > e->stats.kv_pages_peak_used) e->stats.kv_pages_peak_used = used;
    int slot = e->overlap ? e->cur_step ^ 1 : 0;
    rp_step *st = &e->steps[slot];
    rp_batch_begin(run->bb);
    st->device_sampling = run->backend->ops->read_tokens != NULL;
    int prompt_tokens = 0, constrained = 0;
    for (int i = 0; i < n; i++) {
        rp_sched_item *it = &s->plan[i];
        rp_request *r = it->req;
        if (rp_request_pending(r) > 1) prompt_tokens += it->num_tokens;
        /* prompt logprobs: every position's logits, read on the host (the
         * scheduler left the step logit rows for them) */
        const int all = rp_request_wants_prompt_logits(r);
        st->chunk_start[i] = r->cached;
        st->prompt_row[i] = -1;
        /* a round with drafts: its positions as one-token sequences, each with logits */
        st->logit_row[i] = it->draft ? rp_batch_add_positions(run->bb, r->row, r->tokens + r->cached, it->num_tokens,
                                                              r->cached)
                                     : rp_batch_add(run->bb, r->row, r->tokens + r->cached, it->num_tokens, r->cached,
                                                    all ? 2 : it->samples);
        RP_ASSERT(st->logit_row[i] >= 0 || (!it->samples && !all));
        if (all) {
            st->prompt_row[i] = st->logit_row[i];
            st->logit_row[i] += it->num_tokens - 1; /* the sampling row is the chunk's last */
            st->device_sampling = 0;
        }
        st->out_index[i] = r->num_output;
        if (it->samples) {
            if (needs_host_sampler(e, r)) st->device_sampling = 0;
            /* a round's positions too: each masked after the drafts before it (rp_engine_constraint_fill_rows) */
            constrained |= r->matcher != NULL;
            /* a round's rows: position j is output number num_output + j (its RNG counter); without
             * penalties no row depends on the drafts kept before it (a mask depends on the drafts
             * before it, which are known now), so the device samples them all */
            for (int j = 0; j <= it->draft; j++) {
                e->dev_params[st->logit_row[i] + j] = r->sampling;
                e->dev_params[st->logit_row[i] + j].step = (uint64_t)(r->num_output + j);
            }
        }
    }
    rp_batch *bt = rp_batch_finish(run->bb);
    bt->sample = st->device_sampling ? e->dev_params : NULL;
    /* Constrained rows sampled on the device: their masks come after the
     * launch (sample_deferred_step); a step without them samples as it
     * always has. */
    st->deferred = st->device_sampling && constrained;
    bt->sample_deferred = st->deferred;
    st->num_logits = bt->num_logits;
    e->cpu_ms_total += (rp_now_s() - t0) * 1e3;
    rp_err err;
    double t_forward = rp_now_s();
    const uint64_t replays = backend_replays(run->backend);
    if (rp_backend_forward(run->backend, bt, &err)) {
        rp_log_error("forward failed: %s", err.msg);
        rp_scheduler_commit(s);
        fail_running(e, err.msg);
        return -1;
    }
    size_next_step(e, bt, prompt_tokens, (rp_now_s() - t_forward) * 1e3);
    e->launched++;
    st->active = 1;
    st->id = e->launched;
    st->n = n;
    st->tokens = bt->num_tokens;
    st->prompt_tokens = prompt_tokens;
    st->kind = prompt_tokens == 0 ? RP_STEP_DECODE : prompt_tokens == bt->num_tokens ? RP_STEP_PREFILL : RP_STEP_MIXED;
    st->graph = backend_replays(run->backend) != replays;
    memcpy(st->items, s->plan, (size_t)n * sizeof *st->items);
    rp_scheduler_commit(s);
    for (int i = 0; i < n; i++) {
        rp_request *r = st->items[i].req;
        r->last_step = st->id;
        r->num_draft = 0;
        /* overlap: reserve the output slot with a reference to the row the
         * device samples it into; the next step can feed it before the
         * host has seen it */
        if (e->overlap && st->items[i].samples && !st->items[i].draft)
            r->tokens[rp_request_len(r)] = -(st->logit_row[i] + 1), r->num_output++;
    }
    e->cur_step = slot;
    e->stats.steps++;
    return slot;
}

void rp_engine_collect_step(rp_engine *e, int slot) {
    rp_step *st = &e->steps[slot];
    rp_backend *be = e->run->backend;
    rp_err err;
    int rc = st->device_sampling ? be->ops->read_tokens(be, e->dev_tokens, e->dev_logprobs, e->dev_top, &err)
                                 : rp_backend_read_logits(be, e->run->logits, &err);
    st->active = 0;
    if (rc) {
        rp_log_error("forward failed: %s", err.msg);
        fail_running(e, err.msg);
        return;
    }
    e->completed = st->id;
    count_step(e, st);
    const int vocab = e->run->model->cfg.vocab_size;
    for (int i = 0; i < st->n; i++) {
        rp_request *r = st->items[i].req;
        if (st->prompt_row[i] >= 0 && !r->retiring) /* before the sampler rewrites the last row */
            rp_prompt_logprobs_record(r, e->run->logits + (size_t)st->prompt_row[i] * vocab, st->chunk_start[i],
                                      st->items[i].num_tokens, vocab);
        if (!st->items[i].samples) continue;
        int row = st->logit_row[i], k = st->out_index[i];
        int32_t tok;
        float lp = 0;
        rp_top_logprobs host_top;
        const rp_top_logprobs *top = &host_top;
        if (r->retiring) continue;
        if (st->items[i].draft) {
            rp_engine_verify_round(e, st, i);
            continue;
        }
        if (st->device_sampling) {
            tok = e->dev_tokens[row];
            lp = e->dev_logprobs[row];
            top = &e->dev_top[row];
            /* drawn from the masked row (a deferred step): the matcher takes it */
            if (r->matcher && rp_engine_constraint_accept(e, r, k, tok)) continue;
        } else {
            float *logits = e->run->logits + (size_t)row * vocab;
            rp_logit_proc_apply(r, &e->run->model->cfg, k, logits);
            if (r->matcher && rp_engine_constraint_mask(e, r, k, logits)) continue; /* finished: nothing allowed */
            tok = rp_sampler_sample_top(e->sampler, &r->sampling, logits, r->tokens, r->num_prompt,
                                        r->tokens + r->num_prompt, k, (uint64_t)k, &lp, &host_top);
            if (r->matcher && rp_engine_constraint_accept(e, r, k, tok)) continue;
        }
        rp_engine_on_sampled(e, r, k, tok, lp, top);
    }
    rp_engine_release_retired(e);
}

/* A step launched with deferred sampling, once the step before it has been
 * collected: its masks from the matchers, which have taken every token
 * before this step's, then the backend samples it, queued behind its
 * forward. The host did this while the device ran the forward; the device
 * waits for it only where the masks take longer than the forward. */
static void sample_deferred_step(rp_engine *e, int slot) {
    rp_step *st = &e->steps[slot];
    if (!st->active) return; /* the collect before failed: every request has ended */
    const int num_masks = rp_engine_constraint_fill_rows(e, st);
    rp_backend *be = e->run->backend;
    rp_err err;
    if (be->ops->sample_masked(be, e->mask_rows, num_masks, e->mask_of_row, &err)) {
        rp_log_error("sampling with token masks failed: %s", err.msg);
        fail_running(e, err.msg);
    }
}

/* Without overlap: launch, wait, collect. With overlap: launch step N + 1
 * first, then collect step N while the device runs N + 1 (and a deferred
 * step N + 1 is sampled after that, its masks made from step N's tokens). */
void rp_engine_step(rp_engine *e) {
    rp_step *prev = &e->steps[e->cur_step];
    int had_prev = e->overlap && prev->active;
    int prev_slot = e->cur_step;
    /* The host needs real tokens (penalties), or the step in flight sampled
     * on the host so the device holds no tokens to refer to: no overlap now. */
    if (had_prev && (!prev->device_sampling || any_needs_host_sampler(e))) {
        rp_engine_collect_step(e, prev_slot);
        had_prev = 0;
    }
    int slot = launch_step(e);
    if (had_prev) rp_engine_collect_step(e, prev_slot);
    if (slot >= 0 && e->steps[slot].deferred) sample_deferred_step(e, slot);
    if (slot >= 0 && !e->overlap && e->steps[slot].active) rp_engine_collect_step(e, slot);
    if (slot < 0 && !had_prev) {
        /* Nothing launched and nothing in flight: a request that cannot be
         * scheduled (submit checks that each fits the pool); fail it rather
         * than spin. */
        rp_scheduler *s = e->sched;
        if (s->wait_head)
            rp_engine_finish(e, s->wait_head, -1, 0, NULL, RP_FINISH_REASON_ERROR, "the request cannot be scheduled");
    }
}
