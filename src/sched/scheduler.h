/* The scheduling policy: which requests run in the next step and how many
 * of their tokens, within a token budget and the KV pages available.
 *
 * Each step (vLLM V1 / SGLang style continuous batching):
 *  1. every running request that is decoding gets its one token, oldest
 *     first; if the pool cannot hold it, the newest running requests are
 *     preempted (their pages freed; they go back to the front of the
 *     waiting queue and are recomputed later), so no request is lost;
 *  2. running requests in the middle of a chunked prefill get their next
 *     chunk, leaving the first waiting request the budget of its first
 *     chunk (a long prompt never holds a newcomer back for more than a step);
 *  3. waiting requests are admitted in order while a page-table row, pages
 *     for their next chunk and token budget remain, and fewer than
 *     max_running requests run;
 *  4. budget the admissions left goes back to the running prefills.
 * Prompt tokens (2-4) are also held to prefill_cap, which the engine sets
 * each step so that a step on a slow backend stays short.
 * The plan is a list of (request, tokens to feed); the runtime turns it into
 * a backend batch. The scheduler never sees a CUDA type. */
#ifndef RP_SCHED_SCHEDULER_H
#define RP_SCHED_SCHEDULER_H

#include "kv/page_table.h"
#include "sched/request.h"

typedef struct rp_sched_config {
    int max_running;          /* requests in the running set */
    int max_batched_tokens;         /* tokens fed per step, decode and prefill together */
    int chunk;                /* prefill chunk per request per step (<= max_batched_tokens) */
    int max_context;          /* tokens per request */
} rp_sched_config;

typedef struct rp_sched_item {
    rp_request *req;
    int num_tokens; /* tokens fed this step, from req->cached */
    int samples;    /* the cache catches up this step: sample a token */
} rp_sched_item;

typedef struct rp_scheduler {
    rp_sched_config cfg;
    rp_page_table *table; /* not owned */
    rp_request **running; /* [max_running], admission order */
    int num_running;
    rp_request *wait_head, *wait_tail;
    int num_waiting;
    rp_sched_item *plan; /* [max_running] */
    int plan_len;
    uint64_t next_arrival, preemptions;
    int prefill_cap; /* prompt tokens one step may feed (0: the budget's); set by the engine */
} rp_scheduler;

rp_scheduler *rp_scheduler_new(const rp_sched_config *cfg, rp_page_table *table);
void rp_scheduler_free(rp_scheduler *s);

void rp_scheduler_enqueue(rp_scheduler *s, rp_request *r);
/* Builds s->plan for the next step; returns its length (0: nothing to do). */
int rp_scheduler_schedule(rp_scheduler *s);
/* After the step ran: advance every planned request's cache by what it fed. */
void rp_scheduler_commit(rp_scheduler *s);
/* Removes a request from wherever it is and frees its pages (finish, abort). */
void rp_scheduler_remove(rp_scheduler *s, rp_request *r);

/* Pages a request needs for len tokens. */
int rp_scheduler_pages_for(const rp_scheduler *s, int len);

#endif
