/* A request as the scheduler sees it: its tokens (prompt then output), how
 * many of them are in the KV cache, its page-table row, sampling and stop
 * conditions, and the state of its streamed text.
 *
 * Prefill and decode are the same operation here: each step feeds some of
 * the tokens not yet in the cache (all of the prompt, in chunks; then the
 * one token sampled last), and samples when the cache has caught up. A
 * preempted request just loses its cache (cached = 0) and is fed again. */
#ifndef RP_SCHED_REQUEST_H
#define RP_SCHED_REQUEST_H

#include <stdint.h>

#include "engine/sampler.h"
#include "engine/spec_policy.h"
#include "kv/prefix_cache.h"
#include "replay/engine.h"
#include "tokenizer/tokenizer.h"

typedef enum rp_request_state { RP_REQ_WAITING = 0, RP_REQ_RUNNING, RP_REQ_FINISHED } rp_request_state;

typedef struct rp_request {
    rp_request_id id;
    uint64_t arrival; /* admission order; preemption takes the newest first */
    rp_request_state state;
    int32_t *tokens;  /* [num_prompt + max_tokens] */
    int num_prompt, num_output, max_tokens;
    int cached;       /* tokens whose K/V are in the cache */
    /* Speculative decoding (docs/speculative.md): draft tokens the engine
     * proposed for the next step, at tokens[len .. len + num_draft), at
     * most max_tokens - num_output - 1 of them. A decoding request is fed
     * its last token and these, with logits for each, for the engine to
     * verify; 0: a plain decode. */
    int num_draft;
    struct rp_ngram *ngram; /* the n-gram drafter's index of its tokens, or NULL (engine/ngram.h) */
    /* the draft model's page-table row (-1: none) and the tokens whose K/V
     * it holds there (engine/draft_model.h) */
    int draft_row, draft_cached;
    rp_spec_track spec; /* whether its rounds pay off (engine/spec_policy.h) */
    int row;          /* page-table row, -1 when it holds no pages */
    /* The prefix cache (scheduler.h): the lock on the cached pages its row
     * starts with, whether its prompt's pages have been handed to the cache
     * since admission, and the prompt tokens its first admission found
     * cached (OpenAI's usage.prompt_tokens_details.cached_tokens). */
    rp_prefix_handle prefix;
    int prompt_inserted;
    int cached_prompt_tokens;
    rp_sampling_params sampling;
    /* structured output: the grammar's matcher, advanced by each output
     * token (NULL: unconstrained; engine/constraint.h); while reasoning,
     * the output is free until the token reasoning_end */
    struct rp_smatcher *matcher;
    int reasoning;
    int32_t reasoning_end;
    int ignore_eos, want_logprobs;
    /* logit processors before sampling (engine/logit_proc.h): the logit
     * bias (owned) and min_tokens */
    int32_t *bias_ids;
    float *bias;
    int num_bias, min_tokens;
    /* prompt logprobs (engine/prompt_logprobs.h): [num_prompt] (owned) or
     * NULL; the alternatives asked; logit positions recorded so far (from
     * 0; complete at num_prompt - 1); whether an event carried them */
    rp_prompt_logprob *prompt_lp;
    int prompt_top, prompt_lp_done, prompt_lp_sent;
    int32_t *stop_ids;
    int num_stop_ids;
    char **stop;      /* stop strings (owned) */
    int num_stop, max_stop_len;
    rp_token_callback cb;
    void *user;
    int abort_requested;
    int preemptions;
    /* overlap: a finished request stays (pages held, never scheduled) until
     * the last step it was part of has completed on the device */
    int retiring;
    uint64_t last_step;
    /* streamed text: decoded bytes not yet sent because they could still
     * turn out to be the start of a stop string */
    rp_detok detok;
    int has_detok;
    int include_stop_str; /* the stop string or stop token's text stays in the output */
    char *held;
    size_t held_len, held_cap;
    struct rp_request *next; /* queue link */
} rp_request;

static inline int rp_request_len(const rp_request *r) { return r->num_prompt + r->num_output; }
/* Tokens to feed before the request can sample again. */
static inline int rp_request_pending(const rp_request *r) { return rp_request_len(r) - r->cached; }

/* Whether the scheduler may give it tokens: not retiring, and (counting a
 * token still in flight) below its output and context limits. */
static inline int rp_request_can_run(const rp_request *r, int max_context) {
    return !r->retiring && r->num_output < r->max_tokens && rp_request_len(r) < max_context;
}

/* Whether the prompt's chunks still need the logits of every position
 * (prompt logprobs): such a request is computed whole, never from the
 * prefix cache, until they are all recorded. */
static inline int rp_request_wants_prompt_logits(const rp_request *r) {
    return r->prompt_lp && r->prompt_lp_done < r->num_prompt - 1;
}

void rp_request_free(rp_request *r);

#endif
