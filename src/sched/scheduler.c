/* Continuous-batching policy: decode first, then prefill chunks, then
 * admissions; preemption by recomputation when the KV pool runs out. */
#include "sched/scheduler.h"

#include <stdlib.h>
#include <string.h>

rp_scheduler *rp_scheduler_new(const rp_sched_config *cfg, rp_page_table *table) {
    rp_scheduler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (s->cfg.chunk <= 0 || s->cfg.chunk > s->cfg.max_batched_tokens) s->cfg.chunk = s->cfg.max_batched_tokens;
    s->table = table;
    s->running = calloc((size_t)cfg->max_running, sizeof *s->running);
    s->plan = calloc((size_t)cfg->max_running, sizeof *s->plan);
    if (!s->running || !s->plan) {
        rp_scheduler_free(s);
        return NULL;
    }
    return s;
}

void rp_scheduler_free(rp_scheduler *s) {
    if (!s) return;
    free(s->running);
    free(s->plan);
    free(s);
}

int rp_scheduler_pages_for(const rp_scheduler *s, int len) {
    return (len + s->table->pool->page_size - 1) / s->table->pool->page_size;
}

void rp_scheduler_enqueue(rp_scheduler *s, rp_request *r) {
    r->arrival = s->next_arrival++;
    r->state = RP_REQ_WAITING;
    r->row = -1;
    r->next = NULL;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->num_waiting++;
}

static void push_front(rp_scheduler *s, rp_request *r) {
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->num_waiting++;
}

static void unlink_waiting(rp_scheduler *s, rp_request *r) {
    rp_request **pp = &s->wait_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = r->next;
    if (s->wait_tail == r) s->wait_tail = prev;
    r->next = NULL;
    s->num_waiting--;
}

static void drop_running(rp_scheduler *s, rp_request *r) {
    for (int i = 0; i < s->num_running; i++) {
        if (s->running[i] != r) continue;
        memmove(s->running + i, s->running + i + 1, (size_t)(s->num_running - i - 1) * sizeof *s->running);
        s->num_running--;
        break;
    }
    if (r->row >= 0) rp_page_table_release_row(s->table, r->row);
    r->row = -1;
}

/* Running stays sorted by arrival, so a preempted request readmitted later
 * keeps its seniority. */
static void add_running(rp_scheduler *s, rp_request *r) {
    int i = s->num_running;
    while (i > 0 && s->running[i - 1]->arrival > r->arrival) {
        s->running[i] = s->running[i - 1];
        i--;
    }
    s->running[i] = r;
    s->num_running++;
    r->state = RP_REQ_RUNNING;
}

/* Frees the newest running request's pages and requeues it at the front:
 * it will be recomputed from its tokens, losing nothing. */
static rp_request *preempt_newest(rp_scheduler *s) {
    int i = s->num_running - 1;
    while (i >= 0 && s->running[i]->retiring) i--; /* leaving anyway: its pages come back soon */
    if (i < 0) return NULL;
    rp_request *v = s->running[i];
    drop_running(s, v);
    v->cached = 0;
    v->state = RP_REQ_WAITING;
    v->preemptions++;
    s->preemptions++;
    push_front(s, v);
    return v;
}

static void plan_add(rp_scheduler *s, rp_request *r, int n) {
    s->plan[s->plan_len++] = (rp_sched_item){r, n, r->cached + n == rp_request_len(r)};
}

/* Tokens of r already in the plan (0 when it is not). */
static int planned_tokens(const rp_scheduler *s, const rp_request *r, int *index) {
    for (int i = 0; i < s->plan_len; i++)
        if (s->plan[i].req == r) {
            *index = i;
            return s->plan[i].num_tokens;
        }
    *index = -1;
    return 0;
}

/* Gives running prefills their next chunk, oldest first, from *budget minus
 * what is kept back for admissions; a request already planned is topped up
 * to its chunk. */
static void feed_prefills(rp_scheduler *s, int *budget, int keep) {
    for (int i = 0; i < s->num_running && *budget > keep; i++) {
        rp_request *r = s->running[i];
        int pending = rp_request_pending(r), at;
        if (pending <= 1 || !rp_request_can_run(r, s->cfg.max_context)) continue;
        int have = planned_tokens(s, r, &at);
        int n = (pending < s->cfg.chunk ? pending : s->cfg.chunk) - have;
        if (n > *budget - keep) n = *budget - keep;
        if (n <= 0 || rp_page_table_reserve(s->table, r->row, r->cached + have + n, NULL)) continue;
        if (at < 0) plan_add(s, r, n);
        else s->plan[at] = (rp_sched_item){r, have + n, r->cached + have + n == rp_request_len(r)};
        *budget -= n;
    }
}

/* The budget a waiting request's first chunk needs, kept back from the
 * running prefills so a newcomer gets in at the next step even when one
 * long prompt's chunk could take the whole step. */
static int admission_share(const rp_scheduler *s) {
    const rp_request *w = s->wait_head;
    if (!w || s->num_running >= s->cfg.max_running || !rp_request_can_run(w, s->cfg.max_context)) return 0;
    int pending = rp_request_pending(w);
    int n = pending < s->cfg.chunk ? pending : s->cfg.chunk;
    return rp_page_pool_num_free(s->table->pool) >= rp_scheduler_pages_for(s, w->cached + n) ? n : 0;
}

static int schedule_once(rp_scheduler *s) {
    s->plan_len = 0;
    int budget = s->cfg.max_batched_tokens;
    /* 1. decodes, oldest first; preempt the newest when pages run out */
    for (int i = 0; i < s->num_running && budget > 0; i++) {
        rp_request *r = s->running[i];
        if (rp_request_pending(r) != 1 || !rp_request_can_run(r, s->cfg.max_context)) continue;
        int ok = 0;
        while (!ok) {
            ok = rp_page_table_reserve(s->table, r->row, r->cached + 1, NULL) == 0;
            if (ok) break;
            rp_request *v = preempt_newest(s);
            if (v == r || !v) break;
        }
        if (!ok) break; /* r itself was the newest and is preempted: nothing newer remains */
        plan_add(s, r, 1);
        budget--;
    }
    /* prompt tokens: the step's budget, within the cap set for a short step */
    int prompt_budget = s->prefill_cap > 0 && s->prefill_cap < budget ? s->prefill_cap : budget;
    /* 2. chunks of prompts already being prefilled, leaving the first waiting
     * request its chunk */
    feed_prefills(s, &prompt_budget, admission_share(s));
    /* 3. admissions, in order, while a row, pages and budget remain. A
     * request preempted with its last output token still in flight may be
     * at max_tokens: it cannot run, and ends when that token is read. */
    while (s->wait_head && s->num_running < s->cfg.max_running && prompt_budget > 0) {
        rp_request *r = s->wait_head;
        if (!rp_request_can_run(r, s->cfg.max_context)) break;
        int pending = rp_request_pending(r);
        int n = pending < s->cfg.chunk ? pending : s->cfg.chunk;
        if (n > prompt_budget) n = prompt_budget;
        int row = rp_page_table_acquire_row(s->table);
        if (row < 0) break;
        if (rp_page_table_reserve(s->table, row, r->cached + n, NULL)) {
            rp_page_table_release_row(s->table, row);
            break;
        }
        unlink_waiting(s, r);
        r->row = row;
        add_running(s, r);
        plan_add(s, r, n);
        prompt_budget -= n;
    }
    /* 4. what admissions left goes back to the running prefills */
    feed_prefills(s, &prompt_budget, 0);
    return s->plan_len;
}

int rp_scheduler_schedule(rp_scheduler *s) {
    int n = schedule_once(s);
    /* Nothing fits although requests run (all mid-prefill on a full pool):
     * preempt the newest so the oldest can finish. Submission rejects any
     * request larger than the whole pool, so the oldest alone always fits. */
    while (n == 0 && s->num_running > 0) {
        int runnable = 0;
        for (int i = 0; i < s->num_running; i++) runnable += rp_request_can_run(s->running[i], s->cfg.max_context);
        if (!runnable || !preempt_newest(s)) break; /* only requests finishing in flight: nothing to do */
        n = schedule_once(s);
    }
    return n;
}

void rp_scheduler_commit(rp_scheduler *s) {
    for (int i = 0; i < s->plan_len; i++) s->plan[i].req->cached += s->plan[i].num_tokens;
    s->plan_len = 0;
}

void rp_scheduler_remove(rp_scheduler *s, rp_request *r) {
    if (r->state == RP_REQ_RUNNING) drop_running(s, r);
    else if (r->state == RP_REQ_WAITING) unlink_waiting(s, r);
    r->state = RP_REQ_FINISHED;
}
