/* The engine's state, shared by its four files and nothing else:
 *   engine.c  create/destroy, the engine thread, inbox, abort, stats
 *   submit.c  validating a request and handing it to the engine thread
 *   step.c    one step: schedule, build the batch, launch, collect, overlap
 *   output.c  a sampled token's way out: detokenise, stop strings, finish
 *   constraint.c  structured output: compiling constraints, masking logits
 * Fields marked "under mu" are shared with callers' threads; the rest belong
 * to the engine thread. */
#ifndef RP_ENGINE_ENGINE_INTERNAL_H
#define RP_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>

#include "engine/runner.h"
#include "engine/sampler.h"
#include "replay/engine.h"
#include "sched/request.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

/* A launched step whose results have not been read yet. */
typedef struct rp_step {
    int active;
    uint64_t id;
    int n;
    rp_sched_item *items; /* [max_running] */
    int *logit_row;       /* [max_running] */
    int *out_index;       /* [max_running]: output index of the token each sampling item makes */
    /* [max_running]: the position of each item's first token, and, for a
     * chunk with every position's logits (prompt logprobs), its first logit
     * row (-1: none) */
    int *chunk_start, *prompt_row;
    int device_sampling;
    /* device sampling waits for the constrained rows' masks
     * (rp_batch.sample_deferred): step.c computes them once the step
     * before has been collected, then the backend samples */
    int deferred;
    int num_logits;
    /* for the stats by kind, counted when the step completes */
    int kind, tokens, prompt_tokens, graph;
} rp_step;

struct rp_engine {
    rp_engine_config cfg;
    rp_runner *run; /* model, backend, KV pool, page table, batch builder */
    rp_tokenizer *tok;
    rp_prefix_cache *cache; /* NULL: prefix caching off */
    rp_scheduler *sched;
    rp_sampler *sampler;
    rp_sampling_params *dev_params; /* [max_logits]: each logit row's sampling on the device */
    int32_t *dev_tokens;          /* [max_logits]: what the device sampled */
    float *dev_logprobs;
    rp_top_logprobs *dev_top;
    int max_context, max_logits;
    /* speculative decoding (draft.h): drafts per round (0: off), and each
     * position's top logprobs while a round is verified */
    int spec_k;
    rp_top_logprobs *spec_top; /* [RP_SPEC_MAX_K + 1] */
    /* the draft model (NULL: n-gram drafts or none), and one round's
     * drafting requests and drafts wanted [RP_SPEC_MAX_ROWS] */
    struct rp_draft_model *draft;
    rp_request **draft_reqs;
    int *draft_want;
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
    uint64_t stats_prompt_tokens; /* counted at submit */
    rp_engine_stats snapshot;     /* what get_stats reports */
    int held;                     /* rp_engine_hold: no step runs, submissions queue */
    /* overlap: step N+1 is launched before step N's tokens are read */
    int overlap;
    rp_step steps[2];
    int cur_step;                 /* index in steps[] of the newest launched step */
    uint64_t launched, completed; /* step counters */
    rp_request **retiring;        /* finished, freed once their last step completed */
    int num_retiring, cap_retiring;
    rp_engine_stats stats; /* engine thread only */
    double cpu_ms_total;
    /* structured output (constraint.c): the vocabulary as the matchers see
     * it, built at the first constrained submit (under constraint_mu; the
     * engine thread reads it only through requests queued after that), and
     * the engine thread's mask of one logit row */
    pthread_mutex_t constraint_mu;
    struct rp_svocab *svocab;
    uint32_t *mask;
    /* device masks (the backend has sample_masked, cfg.disable_device_masks
     * unset): a deferred step's masks, [max_logits][rp_token_mask_words]
     * (made with the vocabulary), and each logit row's mask or -1 */
    int device_masks;
    uint32_t *mask_rows;
    int32_t *mask_of_row;
    /* [max_logits]: a speculative round's position where the grammar allows
     * nothing after the drafts before it: how the request ends there if
     * the round reaches it (draft.c); RP_FINISH_REASON_NONE elsewhere */
    rp_finish *mask_end;
    /* a synchronous backend's steps are sized to take about step_ms (0: not
     * sized), feeding at least step_min_tokens prompt tokens */
    int step_ms, step_min_tokens;
};

/* step.c: one turn of the engine loop (launch, and collect with or without
 * overlap); collect_step also serves shutdown. */
void rp_engine_step(rp_engine *e);
void rp_engine_collect_step(rp_engine *e, int slot);

/* output.c */
/* Hands output token number k (0-based) of r to its request: records it,
 * streams its text and finishes the request on a stop condition. */
void rp_engine_on_sampled(rp_engine *e, rp_request *r, int k, int32_t tok, float lp, const rp_top_logprobs *top);
/* Ends a request with its final event now; its pages are freed once no
 * launched step still writes them. */
void rp_engine_finish(rp_engine *e, rp_request *r, int32_t tok, float lp, const rp_top_logprobs *top, rp_finish fin,
                      const char *error);
/* Frees the retiring requests whose last step has completed. */
void rp_engine_release_retired(rp_engine *e);

/* engine.c */
/* Publishes the planned step's counts (running, waiting, pages) before it
 * runs, so a long step's requests show in the stats while it runs. */
void rp_engine_publish_plan(rp_engine *e);
/* Forgets a finished id (under mu): abort() no longer knows it. */
void rp_engine_live_remove(rp_engine *e, rp_request_id id);
/* With cfg.debug_check_every_step: checks the page accounting
 * (rp_scheduler_check) and stops on a broken invariant. */
void rp_engine_debug_check(rp_engine *e);
/* Registers a validated request (its id in *id_out, set before the engine
 * thread can see it) and wakes the engine thread; -1 when memory for the
 * bookkeeping ran out (nothing queued). */
int rp_engine_enqueue(rp_engine *e, rp_request *r, int prompt_tokens, rp_request_id *id_out);

#endif
