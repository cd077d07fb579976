/* The scheduling policy: which requests run in the next step and how many
 * of their tokens, within a token budget and the KV pages available.
 *
 * Each step (vLLM V1 / SGLang style continuous batching):
 *  1. every running request that is decoding gets its one token, oldest
 *     first; if the pool cannot hold it, the newest running requests are
 *     preempted (their pages freed; they go back to the front of the
 *     waiting queue and are recomputed later), so no request is lost. A
 *     request with draft tokens (speculative decoding) gets them too where
 *     the budget, its context and the free pages allow, else none: drafts
 *     never preempt;
 *  2. running requests in the middle of a chunked prefill get their next
 *     chunk, leaving the first waiting request its prompt where that fits
 *     in one chunk (a long prompt never holds a short newcomer back for
 *     more than a step);
 *  3. waiting requests are admitted in order while a page-table row, pages
 *     for their next chunk and token budget remain, fewer than max_running
 *     requests run, and the pool keeps room for what the running set is
 *     expected to decode (rp_sched_policy below). A prompt that needs more
 *     than this step's chunk is passed over while max_long_prefills others
 *     are still being prefilled after this step (the engine's: 1): long
 *     prompts go one at a time, first come first served, which finishes
 *     the first sooner and none later;
 *  4. budget the admissions left goes back to the running prefills.
 * A request that wants the logits of every prompt position (prompt
 * logprobs: rp_request_wants_prompt_logits) takes a logit row per token:
 * its chunks are held to the step's spare rows (cfg.prompt_logit_rows, at
 * least one token a step), and it is admitted without the prefix cache.
 * Prompt tokens (2-4) are also held to prefill_cap, which the engine sets
 * each step so that a step on a slow backend stays short.
 *
 * With a prefix cache (kv/prefix_cache.h; NULL: none):
 *  - admission starts a request at its longest cached prefix in whole pages
 *    (leaving at least its last token to compute, for its logits): its row
 *    starts with the cache's pages, locked until it leaves, and it is fed
 *    from there. A preempted request comes back the same way, with what the
 *    cache still holds of its prompt and output;
 *  - a waiting request whose prompt a running prefill is about to put in
 *    the cache (one more page than the cache holds for it now) is passed
 *    over until that prefill completes, so the n choices of one prompt, or
 *    requests sharing a system prompt that arrive together, prefill it once;
 *  - every page a step needs is taken first from the pool, then by evicting
 *    unlocked cached pages, and only then by preempting: the cache never
 *    turns away or preempts a request that would have run without it, and
 *    counts as free wherever pages are counted;
 *  - a request's full pages go to the cache when its prompt is complete
 *    (at the commit of the step that feeds its last prompt token: every
 *    later step runs after that one on the device, so readers always find
 *    the K/V written) and when it leaves (finish, abort, preemption: the
 *    pages of the tokens whose K/V are computed); where the cache already
 *    held the same tokens the request's copy goes back to the pool.
 * The plan is a list of (request, tokens to feed); the runtime turns it into
 * a backend batch. The scheduler never sees a CUDA type. */
#ifndef RP_SCHED_SCHEDULER_H
#define RP_SCHED_SCHEDULER_H

#include "kv/page_table.h"
#include "kv/prefix_cache.h"
#include "sched/request.h"

/* Admission with room for decode growth (SGLang's new-token ratio;
 * docs/memory-model.md has the reasoning and the numbers).
 *
 * Admitting on the prompt alone fills the pool with prompts whose outputs
 * then grow by a page every page_size steps, until the pool runs dry and
 * the newest are preempted and recomputed, over and over. So a waiting
 * request is admitted only if, once its prompt (less its cached prefix) and
 * ratio x its max_tokens are set aside, the pages available still cover
 * what every running request may yet take: the prompt tokens it has still
 * to feed and ratio x the output tokens it may still make (max_tokens -
 * num_output). ratio is the fraction of max_tokens a request is expected to
 * generate (most stop at EOS well before): it starts at init_ratio and
 * falls linearly to min_ratio over decay_steps steps without a preemption,
 * so an engine whose requests stop early admits more; a preemption (the
 * estimate was too low) raises it to at least init_ratio and the share of
 * their max_tokens the running requests have already generated; it starts
 * over at init_ratio when a request arrives at an idle scheduler. A request
 * with ignore_eos makes exactly max_tokens: it counts at ratio 1, unclipped,
 * so a benchmark's requests are never preempted. Other requests count at
 * most clip_tokens of output (a chat request without max_tokens may make
 * the rest of the context). The first request always gets in.
 *
 * Only admission looks at this estimate: running requests get their pages
 * as before, and preemption remains for when the estimate was wrong. */
typedef struct rp_sched_policy {
    int reserve_decode; /* 0: admit on the first chunk alone (tests of preemption) */
    double init_ratio;  /* 0.7 (SGLang's): a cold engine assumes most of max_tokens */
    double min_ratio;   /* 0.1 (SGLang's 0.7 x 0.14): chat requests stop far before their max_tokens, and
                         * preemption catches the ones that do not */
    int decay_steps;    /* 600 (SGLang's): a few lifetimes of requests of hundreds of tokens */
    int clip_tokens;    /* 4096 (SGLang's CLIP_MAX_NEW_TOKENS) */
} rp_sched_policy;

#define RP_SCHED_POLICY_DEFAULT ((rp_sched_policy){1, 0.7, 0.1, 600, 4096})

/* The running set's size when the user sets none: the pool's tokens over
 * what a typical request holds (RP_SCHED_TOKENS_PER_REQUEST: 256 in and 256
 * out, the benchmarks' mean; the context when shorter), within
 * [RP_SCHED_MIN_RUNNING, RP_SCHED_MAX_RUNNING]. Many more than the pool
 * holds would only wait in the running set (admission keeps them out), many
 * fewer leave decode batches short of what the pool allows. 1024: the
 * largest decode graph; a decode step of an 8B model is compute-bound well
 * before. */
enum { RP_SCHED_TOKENS_PER_REQUEST = 512, RP_SCHED_MIN_RUNNING = 16, RP_SCHED_MAX_RUNNING = 1024 };
/* The engine's max_long_prefills: one long prompt at a time (8 prompts of
 * 30,000 tokens on an H100: bench/RESULTS.md, "Issue 37") */
enum { RP_SCHED_LONG_PREFILLS = 1 };
/* Logit rows a step has beyond one per request, for the prompt chunks of
 * requests that want every position's logits (prompt logprobs): such a
 * chunk feeds at most this many tokens + 1. The engine's backend has this
 * many more rows. 128: a prompt of 2,000 tokens in 16 steps, for 128 x
 * vocab more floats of logits memory (78 MB at Qwen's 151,936). */
enum { RP_SCHED_PROMPT_LOGIT_ROWS = 128 };
int rp_sched_default_max_running(long pool_tokens, int max_context);

typedef struct rp_sched_config {
    int max_running;          /* requests in the running set */
    int max_batched_tokens;         /* tokens fed per step, decode and prefill together */
    int chunk;                /* prefill chunk per request per step (<= max_batched_tokens) */
    int max_context;          /* tokens per request */
    int max_long_prefills;    /* prompts of more than one chunk prefilled at a time (vLLM's
                               * max_long_partial_prefills); 0: no limit. The engine's: 1 */
    rp_sched_policy policy;   /* zero: no reservation; the engine's is RP_SCHED_POLICY_DEFAULT */
    /* logit rows a step has beyond one per request (the engine's:
     * RP_SCHED_PROMPT_LOGIT_ROWS); 0: a request that wants every
     * position's logits is fed one token a step */
    int prompt_logit_rows;
} rp_sched_config;

typedef struct rp_sched_item {
    rp_request *req;
    int num_tokens; /* tokens fed this step, from req->cached */
    int samples;    /* the cache catches up this step: sample a token */
    int draft;      /* of num_tokens, the request's draft tokens after its last one (a verify: logits
                     * for every token; the engine sets cached to what it keeps) */
} rp_sched_item;

typedef struct rp_scheduler {
    rp_sched_config cfg;
    int logit_rows_left; /* of cfg.prompt_logit_rows, in the step being planned */
    rp_page_table *table; /* not owned */
    rp_prefix_cache *cache; /* not owned; NULL: no prefix caching */
    int32_t *cache_pages; /* [max_pages_per_row]: pages a match or insert reports */
    rp_request **running; /* [max_running], admission order */
    int num_running;
    rp_request *wait_head, *wait_tail;
    int num_waiting;
    rp_sched_item *plan; /* [max_running] */
    int plan_len;
    uint64_t next_arrival, preemptions;
    double new_token_ratio; /* the policy's ratio now */
    int prefill_cap; /* prompt tokens one step may feed (0: the budget's); set by the engine */
} rp_scheduler;

/* cache: over table's pool, or NULL. */
rp_scheduler *rp_scheduler_new(const rp_sched_config *cfg, rp_page_table *table, rp_prefix_cache *cache);
void rp_scheduler_free(rp_scheduler *s);

void rp_scheduler_enqueue(rp_scheduler *s, rp_request *r);
/* Builds s->plan for the next step; returns its length (0: nothing to do). */
int rp_scheduler_schedule(rp_scheduler *s);
/* After the step was launched: advance every planned request's cache by
 * what it fed; a prompt completed goes to the prefix cache. */
void rp_scheduler_commit(rp_scheduler *s);
/* Removes a request from wherever it is and frees its pages (finish, abort);
 * the full pages of its first r->cached tokens go to the prefix cache, so a
 * caller whose K/V cannot be trusted (a failed step) sets cached to 0 first. */
void rp_scheduler_remove(rp_scheduler *s, rp_request *r);
/* Pages a step could take: free in the pool, or cached and unlocked. */
int rp_scheduler_pages_available(const rp_scheduler *s);
/* Checks the page accounting (O(pages)): the pool's and the cache's
 * invariants, every running request's row starting with exactly the cached
 * pages it locks, and every page in use either cached or one row's own; at
 * rest (nothing running) no lock remains. 0, or -1 with the first broken
 * one in err. For tests (rp_engine_config.debug_check_every_step). */
int rp_scheduler_check(const rp_scheduler *s, rp_err *err);

/* Pages a request needs for len tokens. */
int rp_scheduler_pages_for(const rp_scheduler *s, int len);

#endif
