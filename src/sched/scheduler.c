/* Continuous-batching policy: decode first, then prefill chunks, then
 * admissions that leave room for the running set's decode growth; eviction
 * of cached pages, then preemption by recomputation, when the KV pool runs
 * out. */
#include "sched/scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rp_sched_default_max_running(long pool_tokens, int max_context) {
    long per_request = max_context > 0 && max_context < RP_SCHED_TOKENS_PER_REQUEST ? max_context
                                                                                   : RP_SCHED_TOKENS_PER_REQUEST;
    long n = pool_tokens / per_request;
    if (n < RP_SCHED_MIN_RUNNING) n = RP_SCHED_MIN_RUNNING;
    if (n > RP_SCHED_MAX_RUNNING) n = RP_SCHED_MAX_RUNNING;
    return (int)n;
}

rp_scheduler *rp_scheduler_new(const rp_sched_config *cfg, rp_page_table *table, rp_prefix_cache *cache) {
    rp_scheduler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    if (s->cfg.chunk <= 0 || s->cfg.chunk > s->cfg.max_batched_tokens) s->cfg.chunk = s->cfg.max_batched_tokens;
    s->table = table;
    s->cache = cache;
    s->new_token_ratio = s->cfg.policy.init_ratio;
    s->running = calloc((size_t)cfg->max_running, sizeof *s->running);
    s->plan = calloc((size_t)cfg->max_running, sizeof *s->plan);
    s->cache_pages = calloc((size_t)table->max_pages_per_row, sizeof *s->cache_pages);
    if (!s->running || !s->plan || !s->cache_pages) {
        rp_scheduler_free(s);
        return NULL;
    }
    return s;
}

void rp_scheduler_free(rp_scheduler *s) {
    if (!s) return;
    free(s->running);
    free(s->plan);
    free(s->cache_pages);
    free(s);
}

int rp_scheduler_pages_for(const rp_scheduler *s, int len) {
    return (len + s->table->pool->page_size - 1) / s->table->pool->page_size;
}

void rp_scheduler_enqueue(rp_scheduler *s, rp_request *r) {
    /* the first request after idling: what was learnt of the last requests'
     * lengths may not hold for these (SGLang starts over too) */
    if (s->num_running == 0 && s->num_waiting == 0) s->new_token_ratio = s->cfg.policy.init_ratio;
    r->arrival = s->next_arrival++;
    r->state = RP_REQ_WAITING;
    r->row = -1;
    r->prefix = RP_PREFIX_HANDLE_NONE;
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

int rp_scheduler_pages_available(const rp_scheduler *s) {
    return rp_page_pool_num_free(s->table->pool) + (s->cache ? rp_prefix_cache_evictable_pages(s->cache) : 0);
}

/* Makes r's row hold pages for num_tokens, evicting unlocked cached pages
 * where the pool is short; 0, or -1 with nothing taken and nothing evicted
 * (so a failed try costs the cache nothing). */
static int reserve(rp_scheduler *s, int row, int num_tokens) {
    int need = rp_page_table_pages_needed(s->table, row, num_tokens);
    if (need > rp_scheduler_pages_available(s)) return -1;
    if (s->cache && rp_prefix_cache_ensure_free(s->cache, need)) return -1;
    return rp_page_table_reserve(s->table, row, num_tokens, NULL);
}

/* The first n tokens of r trimmed to those known on the host: with overlap
 * the newest output token may still be a reference to a logit row (step.c)
 * and is never a cache key. */
static int known_tokens(const rp_request *r, int n) {
    while (n > 0 && r->tokens[n - 1] < 0) n--;
    return n;
}

/* Hands the full pages of r's first n tokens (K/V computed) to the cache;
 * the row then shares them, its duplicates of pages the cache already held
 * going back to the pool. handle: a lock on them, or NULL. */
static void cache_pages(rp_scheduler *s, rp_request *r, int n, rp_prefix_handle *handle) {
    int full = known_tokens(r, n) / s->table->pool->page_size;
    if (full < s->table->row_shared[r->row]) full = s->table->row_shared[r->row];
    rp_prefix_cache_insert(s->cache, r->tokens, full * s->table->pool->page_size, rp_page_table_row(s->table, r->row),
                           s->cache_pages, handle);
    rp_page_table_share(s->table, r->row, full, s->cache_pages);
}

/* Gives r's row up: its computed full pages to the cache, the rest to the
 * pool, and its lock back. */
static void release_kv(rp_scheduler *s, rp_request *r) {
    if (r->row < 0) {
        RP_ASSERT(r->prefix.node < 0);
        return;
    }
    if (s->cache) {
        cache_pages(s, r, r->cached, NULL);
        rp_prefix_cache_unlock(s->cache, &r->prefix);
    }
    rp_page_table_release_row(s->table, r->row);
    r->row = -1;
}

static void drop_running(rp_scheduler *s, rp_request *r) {
    for (int i = 0; i < s->num_running; i++) {
        if (s->running[i] != r) continue;
        memmove(s->running + i, s->running + i + 1, (size_t)(s->num_running - i - 1) * sizeof *s->running);
        s->num_running--;
        break;
    }
    release_kv(s, r);
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

/* ---- the new-token ratio (scheduler.h's rp_sched_policy) ---------------- */

/* Output tokens r is counted for: ignore_eos requests all they have left,
 * the others ratio x that, at most clip_tokens. */
static int expected_output(const rp_scheduler *s, const rp_request *r) {
    int left = r->max_tokens - r->num_output;
    if (left <= 0) return 0;
    if (r->ignore_eos) return left;
    if (left > s->cfg.policy.clip_tokens) left = s->cfg.policy.clip_tokens;
    return (int)ceil(s->new_token_ratio * left);
}

/* Pages r is expected to take beyond those its row holds: the rest of its
 * prompt (chunks not fed yet, or all of it before admission) and its
 * expected output. A retiring request takes none: its pages come back. */
static int expected_pages(const rp_scheduler *s, const rp_request *r) {
    if (r->retiring) return 0;
    long len = (long)rp_request_len(r) + expected_output(s, r);
    if (len > s->cfg.max_context) len = s->cfg.max_context;
    int held = r->row >= 0 ? s->table->row_num_pages[r->row] : 0;
    int need = rp_scheduler_pages_for(s, (int)len) - held;
    return need > 0 ? need : 0;
}

/* After a preemption the ratio was too low for the running set: back to at
 * least init_ratio, and to the share of max_tokens the running requests
 * have already generated (they may go on to all of it; SGLang's retract). */
static void raise_ratio(rp_scheduler *s) {
    const rp_sched_policy *p = &s->cfg.policy;
    double out = 0, max = 0;
    for (int i = 0; i < s->num_running; i++) {
        const rp_request *r = s->running[i];
        if (r->ignore_eos) continue; /* counted at 1 anyway */
        out += r->num_output;
        max += r->max_tokens < p->clip_tokens ? r->max_tokens : p->clip_tokens;
    }
    double ratio = max > 0 ? out / max : 0;
    if (ratio < p->init_ratio) ratio = p->init_ratio;
    if (ratio > 1) ratio = 1;
    if (ratio > s->new_token_ratio) s->new_token_ratio = ratio;
}

/* A step without preemption: requests stop before their max_tokens often
 * enough, so the next admissions may count on a little less of it. */
static void decay_ratio(rp_scheduler *s) {
    const rp_sched_policy *p = &s->cfg.policy;
    double step = p->decay_steps > 0 ? (p->init_ratio - p->min_ratio) / p->decay_steps : 1;
    s->new_token_ratio -= step;
    if (s->new_token_ratio < p->min_ratio) s->new_token_ratio = p->min_ratio;
}

/* Frees the newest running request's pages (its computed full pages going
 * to the cache) and requeues it at the front: it will be recomputed from
 * its tokens, or from what the cache still holds of them, losing nothing. */
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
    raise_ratio(s);
    return v;
}

/* n tokens more of r's chunk (have already planned), held to the step's
 * spare logit rows where r wants every position's logits: its first token
 * has the row every request may take, the others take spare ones. */
static int logit_rows_cap(const rp_scheduler *s, const rp_request *r, int have, int n) {
    if (!rp_request_wants_prompt_logits(r)) return n;
    const int rows = s->logit_rows_left + (have == 0);
    return n < rows ? n : rows;
}

static void take_logit_rows(rp_scheduler *s, const rp_request *r, int have, int n) {
    if (rp_request_wants_prompt_logits(r)) s->logit_rows_left -= n - (have == 0);
}

static void plan_add(rp_scheduler *s, rp_request *r, int n) {
    s->plan[s->plan_len++] = (rp_sched_item){r, n, r->cached + n == rp_request_len(r), 0};
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
        n = logit_rows_cap(s, r, have, n);
        if (n <= 0 || reserve(s, r->row, r->cached + have + n)) continue;
        take_logit_rows(s, r, have, n);
        if (at < 0) plan_add(s, r, n);
        else s->plan[at] = (rp_sched_item){r, have + n, r->cached + have + n == rp_request_len(r), 0};
        *budget -= n;
    }
}

/* The budget a waiting request's prompt needs where it fits in one chunk,
 * kept back from the running prefills so a short newcomer gets in at the
 * next step even when one long prompt's chunk could take the whole step. A
 * newcomer of several chunks gets nothing kept back: it waits for the
 * running long prompt (long_prefill_busy). */
static int admission_share(const rp_scheduler *s) {
    const rp_request *w = s->wait_head;
    if (!w || s->num_running >= s->cfg.max_running || !rp_request_can_run(w, s->cfg.max_context)) return 0;
    int n = rp_request_pending(w);
    if (n > s->cfg.chunk) {
        if (s->cfg.max_long_prefills > 0) return 0;
        n = s->cfg.chunk;
    }
    return rp_scheduler_pages_available(s) >= rp_scheduler_pages_for(s, w->cached + n) ? n : 0;
}

/* Running prompts still being prefilled after this step's planned chunks:
 * while there are max_long_prefills of them, a newcomer whose prompt takes
 * more than its first chunk waits (admit), so long prompts are prefilled
 * that many at a time, first come first served. Two long prompts sharing
 * every step would both finish late; one after the other, the first
 * finishes in half the time and the second no later. */
static int long_prefills(const rp_scheduler *s) {
    int n = 0;
    for (int i = 0; i < s->num_running; i++) {
        const rp_request *r = s->running[i];
        int at;
        if (rp_request_can_run(r, s->cfg.max_context) && rp_request_pending(r) > 1 &&
            rp_request_pending(r) - planned_tokens(s, r, &at) > 0)
            n++;
    }
    return n;
}

/* Whether a running prefill is about to put more of r's prefix in the cache
 * than the `matched` tokens it holds now: at least the next page, which r
 * would otherwise compute a second time in the same steps. r then waits
 * until that prompt completes (a step or a few chunks: a prefill in the
 * running set is always fed or preempted) and matches it all. */
static int waits_for_prefill(const rp_scheduler *s, const rp_request *r, int matched) {
    const int ps = s->table->pool->page_size;
    const int next = matched / ps + 1; /* pages r shares with p must reach this one */
    if (next * ps > rp_request_len(r) - 1) return 0; /* r could not match it anyway */
    for (int i = 0; i < s->num_running; i++) {
        const rp_request *p = s->running[i];
        if (p->prompt_inserted || !rp_request_can_run(p, s->cfg.max_context) || rp_request_len(p) < next * ps)
            continue;
        if (!memcmp(p->tokens, r->tokens, (size_t)next * ps * sizeof *r->tokens)) return 1;
    }
    return 0;
}

/* Admits r into a free row, from its longest cached prefix, with its first
 * chunk (at most budget tokens); returns the tokens planned, or 0 with
 * nothing taken (no row, no pages even with the cache evicted, or no room
 * for r beside the *expected pages the running set may still take, which
 * r's join when it is admitted). A peek decides before the match that
 * locks and counts, so a request that waits for a prefill, or for pages,
 * costs the cache nothing. */
static int admit(rp_scheduler *s, rp_request *r, int budget, int *expected, int *num_long, int *waits) {
    const int ps = s->table->pool->page_size, len = rp_request_len(r);
    /* every position's logits are wanted: none may come from the cache */
    const int use_cache = s->cache && !rp_request_wants_prompt_logits(r);
    int matched = 0;
    *waits = 0;
    if (use_cache) {
        matched = rp_prefix_cache_match(s->cache, r->tokens, len, len - 1, s->cache_pages, NULL);
        if ((*waits = waits_for_prefill(s, r, matched))) return 0;
    }
    int n = len - matched < s->cfg.chunk ? len - matched : s->cfg.chunk;
    if (n > budget) n = budget;
    n = logit_rows_cap(s, r, 0, n);
    /* a prompt of several chunks waits for the running long ones */
    if (matched + n < len && s->cfg.max_long_prefills > 0 && *num_long >= s->cfg.max_long_prefills)
        return *waits = 1, 0;
    if (rp_scheduler_pages_for(s, matched + n) - matched / ps > rp_scheduler_pages_available(s)) return 0;
    /* room for the running set's growth and r's own: all its pages but the
     * matched ones, which are the cache's, yet counted as available while
     * unlocked. The first request always gets in, so a request the estimate
     * says cannot fit beside others still runs alone. */
    if (s->cfg.policy.reserve_decode && s->num_running > 0) {
        int need = expected_pages(s, r) - matched / ps;
        if (s->cache) need += rp_prefix_cache_unlocked_of(s->cache, s->cache_pages, matched / ps);
        if (*expected + need > rp_scheduler_pages_available(s)) return 0;
    }
    int row = rp_page_table_acquire_row(s->table);
    if (row < 0) return 0;
    if (use_cache) {
        /* the same match: nothing was evicted since the peek */
        int locked = rp_prefix_cache_match(s->cache, r->tokens, len, len - 1, s->cache_pages, &r->prefix);
        RP_ASSERT(locked == matched);
        rp_page_table_share(s->table, row, matched / ps, s->cache_pages);
    }
    /* locking the matched pages may have taken the evictable ones counted above */
    if (reserve(s, row, matched + n)) {
        if (use_cache) rp_prefix_cache_unlock(s->cache, &r->prefix);
        rp_page_table_release_row(s->table, row);
        return 0;
    }
    if (r->preemptions == 0) r->cached_prompt_tokens = matched;
    r->cached = matched;
    r->prompt_inserted = 0;
    r->row = row;
    unlink_waiting(s, r);
    add_running(s, r);
    take_logit_rows(s, r, 0, n);
    plan_add(s, r, n);
    *expected += expected_pages(s, r);
    if (matched + n < len) ++*num_long;
    return n;
}

static int schedule_once(rp_scheduler *s) {
    s->plan_len = 0;
    s->logit_rows_left = s->cfg.prompt_logit_rows;
    int budget = s->cfg.max_batched_tokens;
    /* 1. decodes, oldest first; preempt the newest when pages run out */
    for (int i = 0; i < s->num_running && budget > 0; i++) {
        rp_request *r = s->running[i];
        if (rp_request_pending(r) != 1 || !rp_request_can_run(r, s->cfg.max_context)) continue;
        int ok = 0;
        while (!ok) {
            ok = reserve(s, r->row, r->cached + 1) == 0;
            if (ok) break;
            rp_request *v = preempt_newest(s);
            if (v == r || !v) break;
        }
        if (!ok) break; /* r itself was the newest and is preempted: nothing newer remains */
        plan_add(s, r, 1);
        budget--;
    }
    /* 1b. drafts (speculative decoding), oldest first, once every decode
     * has its token: what the budget, the context and the pages left
     * allow, so drafts never preempt nor keep a decode out */
    const int ps = s->table->pool->page_size;
    for (int i = 0; i < s->plan_len && budget > 0; i++) {
        rp_sched_item *it = &s->plan[i];
        rp_request *r = it->req;
        if (r->num_draft <= 0) continue;
        const int room = (s->table->row_num_pages[r->row] + rp_scheduler_pages_available(s)) * ps - r->cached - 1;
        int d = r->num_draft < budget ? r->num_draft : budget;
        if (d > s->cfg.max_context - r->cached - 1) d = s->cfg.max_context - r->cached - 1;
        if (d > room) d = room;
        if (d <= 0 || reserve(s, r->row, r->cached + 1 + d)) continue;
        it->num_tokens = 1 + d;
        it->draft = d;
        budget -= d;
    }
    /* prompt tokens: the step's budget, within the cap set for a short step */
    int prompt_budget = s->prefill_cap > 0 && s->prefill_cap < budget ? s->prefill_cap : budget;
    /* 2. chunks of prompts already being prefilled, leaving the first waiting
     * request its chunk */
    feed_prefills(s, &prompt_budget, admission_share(s));
    /* 3. admissions, in order, while a row, pages and budget remain (a
     * request waiting for a running prefill of its prefix is passed over).
     * A request preempted with its last output token still in flight may
     * be at max_tokens: it cannot run, and ends when that token is read. */
    int expected = 0; /* pages the running set is expected to take yet */
    if (s->cfg.policy.reserve_decode && s->wait_head)
        for (int i = 0; i < s->num_running; i++) expected += expected_pages(s, s->running[i]);
    int num_long = long_prefills(s);
    rp_request *next;
    for (rp_request *r = s->wait_head; r && s->num_running < s->cfg.max_running && prompt_budget > 0; r = next) {
        next = r->next;
        if (!rp_request_can_run(r, s->cfg.max_context)) break;
        int waits, n = admit(s, r, prompt_budget, &expected, &num_long, &waits);
        if (waits) continue;
        if (n == 0) break;
        prompt_budget -= n;
    }
    /* 4. what admissions left goes back to the running prefills */
    feed_prefills(s, &prompt_budget, 0);
    return s->plan_len;
}

int rp_scheduler_schedule(rp_scheduler *s) {
    const uint64_t preemptions = s->preemptions;
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
    if (n > 0 && s->preemptions == preemptions) decay_ratio(s);
    return n;
}

void rp_scheduler_commit(rp_scheduler *s) {
    for (int i = 0; i < s->plan_len; i++) {
        rp_request *r = s->plan[i].req;
        r->cached += s->plan[i].num_tokens;
        if (!s->cache || !s->plan[i].samples || r->prompt_inserted) continue;
        /* the prompt is complete: its pages are shared from the next step on */
        rp_prefix_handle h;
        cache_pages(s, r, r->cached, &h);
        rp_prefix_cache_unlock(s->cache, &r->prefix);
        r->prefix = h;
        r->prompt_inserted = 1;
    }
    s->plan_len = 0;
}

void rp_scheduler_remove(rp_scheduler *s, rp_request *r) {
    if (r->state == RP_REQ_RUNNING) drop_running(s, r);
    else if (r->state == RP_REQ_WAITING) unlink_waiting(s, r);
    r->state = RP_REQ_FINISHED;
}

int rp_scheduler_check(const rp_scheduler *s, rp_err *err) {
    const rp_page_table *t = s->table;
    const rp_page_pool *pool = t->pool;
    if (rp_page_pool_check(pool, err)) return RP_ERR;
    if (s->cache && rp_prefix_cache_check(s->cache, err)) return RP_ERR;
    int own = 0;
    for (int row = 0; row < t->max_rows; row++) {
        if (!t->row_used[row]) continue;
        own += rp_page_table_own_pages(t, row);
        const int32_t *pages = rp_page_table_row(t, row);
        for (int i = 0; i < t->row_num_pages[row]; i++)
            if (pages[i] < 0 || pages[i] >= pool->num_pages || !rp_page_pool_in_use(pool, pages[i]))
                return rp_errf(err, "scheduler: row %d's page %d (%d) is not a page in use", row, i, pages[i]);
    }
    int handles = 0;
    for (int i = 0; i < s->num_running; i++) {
        const rp_request *r = s->running[i];
        if (r->row < 0 || !t->row_used[r->row])
            return rp_errf(err, "scheduler: running request %llu holds no row", (unsigned long long)r->id);
        if (r->prefix.num_pages != t->row_shared[r->row])
            return rp_errf(err, "scheduler: request %llu locks %d cached pages, its row shares %d",
                           (unsigned long long)r->id, r->prefix.num_pages, t->row_shared[r->row]);
        if (r->cached > t->row_num_pages[r->row] * pool->page_size)
            return rp_errf(err, "scheduler: request %llu has %d tokens cached in %d pages", (unsigned long long)r->id,
                           r->cached, t->row_num_pages[r->row]);
        handles += r->prefix.node >= 0;
    }
    for (const rp_request *w = s->wait_head; w; w = w->next)
        if (w->row >= 0 || w->prefix.node >= 0)
            return rp_errf(err, "scheduler: waiting request %llu holds a row or a lock", (unsigned long long)w->id);
    int cached = 0;
    if (s->cache) {
        rp_prefix_cache_stats st;
        rp_prefix_cache_get_stats(s->cache, &st);
        cached = st.cached_pages;
        if (st.handles != handles)
            return rp_errf(err, "scheduler: the cache has %d handles out, running requests hold %d", st.handles,
                           handles);
    }
    int in_use = pool->num_pages - rp_page_pool_num_free(pool);
    if (in_use != own + cached)
        return rp_errf(err, "scheduler: %d pages in use, %d rows' own and %d cached (%s)", in_use, own, cached,
                       in_use > own + cached ? "leaked" : "counted twice");
    return RP_OK;
}
