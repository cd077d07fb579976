/* The scheduler alone (src/sched/scheduler.c), on a real page pool and page
 * table with hand-made requests: no model, no backend. The test plays the
 * engine: it schedules, checks the exact plan (which request, how many
 * tokens, whether it samples) and the free pages, commits, and appends a
 * token to every request that sampled.
 *
 * Pinned down: admission in arrival order while rows, pages, budget and
 * max_running allow (and a blocked head blocks the queue); chunked prefill
 * with the sample flag only on the chunk that completes the prompt; one
 * token budget shared by decode (first, oldest first) and prefill chunks;
 * a running prefill leaves the first waiting request its chunk (what that
 * leaves unused goes back to it), prefill_cap holds prompt tokens only;
 * preemption of the NEWEST running request (pages freed, cached = 0, front
 * of the waiting queue, counted), retiring requests never preempted, the
 * stall path; resumption re-feeding prompt + output with its seniority
 * kept; remove() from anywhere; pages_for(); requests that may not run
 * (max_tokens, context, retiring) never get tokens. With a prefix cache:
 * admission from the longest cached prefix (whole pages, the last token
 * always computed), prompts cached at the commit that completes them and
 * duplicates freed, a request passed over while a running prefill computes
 * its prefix, eviction before preemption, a preempted request coming back
 * from its cached pages. Admission with room for decode growth
 * (rp_sched_policy), over whole runs: ignore_eos requests stop at what the
 * pool holds whole and are never preempted, requests that stop early let
 * the ratio fall and more in, and a ratio that is wrong still completes
 * everything through preemption, which raises it; the default running set
 * from the pool's size. The page accounting (rp_scheduler_check) holds
 * after every step; every pool is full (or cached, unlocked) and every row
 * free at the end. */
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sched/scheduler.h"
#include "test_util.h"

#define PS 4 /* tokens per page: small, so page counts stay readable */
#define MAX_REQS 8

typedef struct fixture {
    rp_page_pool *pool;
    rp_page_table *table;
    rp_scheduler *s;
    rp_prefix_cache *cache; /* NULL unless setup_cached */
    rp_request *reqs[MAX_REQS];
    int num_reqs;
} fixture;

static rp_sched_config sched_config(int max_running, int max_batched_tokens, int chunk) {
    return (rp_sched_config){.max_running = max_running, .max_batched_tokens = max_batched_tokens, .chunk = chunk,
                             .max_context = 64};
}

static void setup(fixture *f, int num_pages, int rows, rp_sched_config cfg) {
    memset(f, 0, sizeof *f);
    f->pool = rp_page_pool_new(num_pages, PS);
    f->table = rp_page_table_new(f->pool, rows, cfg.max_context);
    assert_non_null(f->table);
    f->s = rp_scheduler_new(&cfg, f->table, NULL);
    assert_non_null(f->s);
}

/* The same with a prefix cache over the pool. */
static void setup_cached(fixture *f, int num_pages, int rows, rp_sched_config cfg) {
    setup(f, num_pages, rows, cfg);
    rp_scheduler_free(f->s);
    f->cache = rp_prefix_cache_new(f->pool);
    f->s = rp_scheduler_new(&cfg, f->table, f->cache);
    assert_non_null(f->s);
}

static void expect_consistent(const rp_scheduler *s) {
    rp_err err;
    if (rp_scheduler_check(s, &err)) fail_msg("%s", err.msg);
}

/* A request as submit.c builds it (tokens sized prompt + max_tokens + 1),
 * prompt token k of request number i being 100 * i + k. Not queued. */
static rp_request *make_req(fixture *f, int prompt, int max_tokens) {
    assert_true(f->num_reqs < MAX_REQS);
    rp_request *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->tokens = calloc((size_t)(prompt + max_tokens + 1), sizeof *r->tokens);
    assert_non_null(r->tokens);
    r->id = (rp_request_id)f->num_reqs + 1;
    for (int k = 0; k < prompt; k++) r->tokens[k] = 100 * f->num_reqs + k;
    r->num_prompt = prompt;
    r->max_tokens = max_tokens;
    r->row = -1;
    f->reqs[f->num_reqs++] = r;
    return r;
}

static rp_request *add_req(fixture *f, int prompt, int max_tokens) {
    rp_request *r = make_req(f, prompt, max_tokens);
    rp_scheduler_enqueue(f->s, r);
    return r;
}

/* Removes what is left; every page and every row must be back. */
static void teardown(fixture *f) {
    for (int i = 0; i < f->num_reqs; i++) rp_scheduler_remove(f->s, f->reqs[i]);
    expect_consistent(f->s);
    if (f->cache) { /* at rest: nothing locked, every page free or cached */
        rp_prefix_cache_stats st;
        rp_prefix_cache_get_stats(f->cache, &st);
        assert_int_equal(st.handles, 0);
        assert_int_equal(rp_page_pool_num_free(f->pool) + st.cached_pages, f->pool->num_pages);
        rp_prefix_cache_free(f->cache);
    }
    assert_int_equal(f->s->num_running, 0);
    assert_int_equal(f->s->num_waiting, 0);
    assert_null(f->s->wait_head);
    assert_int_equal(rp_page_pool_num_free(f->pool), f->pool->num_pages);
    assert_int_equal(f->table->num_free_rows, f->table->max_rows);
    for (int i = 0; i < f->num_reqs; i++) {
        free(f->reqs[i]->tokens);
        free(f->reqs[i]);
    }
    rp_scheduler_free(f->s);
    rp_page_table_free(f->table);
    rp_page_pool_free(f->pool);
}

typedef struct want {
    const rp_request *req;
    int num_tokens, samples;
} want;

static void expect_plan(const rp_scheduler *s, const want *w, int n, int free_pages, int line) {
    if (s->plan_len != n) fail_msg("line %d: plan of %d items, expected %d", line, s->plan_len, n);
    for (int i = 0; i < n; i++) {
        const rp_sched_item *it = &s->plan[i];
        if (it->req != w[i].req || it->num_tokens != w[i].num_tokens || it->samples != w[i].samples)
            fail_msg("line %d: plan item %d is (request %d, %d tokens, samples %d), expected (request %d, %d, %d)", line,
                     i, (int)it->req->id, it->num_tokens, it->samples, (int)w[i].req->id, w[i].num_tokens,
                     w[i].samples);
    }
    if (rp_page_pool_num_free(s->table->pool) != free_pages)
        fail_msg("line %d: %d pages free, expected %d", line, rp_page_pool_num_free(s->table->pool), free_pages);
}

/* What the engine does after a step: the cache catches up, and every item
 * that sampled gets its token (900 + its position, to tell it from prompts). */
static void finish_step(rp_scheduler *s) {
    rp_sched_item items[MAX_REQS];
    int n = s->plan_len;
    memcpy(items, s->plan, (size_t)n * sizeof *items);
    rp_scheduler_commit(s);
    assert_int_equal(s->plan_len, 0);
    expect_consistent(s);
    for (int i = 0; i < n; i++) {
        rp_request *r = items[i].req;
        if (!items[i].samples) continue;
        assert_int_equal(r->cached, rp_request_len(r));
        r->tokens[rp_request_len(r)] = 900 + rp_request_len(r);
        r->num_output++;
    }
}

/* STEP(s, free pages after scheduling, {req, tokens, samples}...): schedule,
 * check the plan and the pool, finish the step. */
#define STEP(s, free_pages, ...)                                                          \
    do {                                                                                  \
        const want w_[] = {__VA_ARGS__};                                                  \
        const int n_ = (int)(sizeof w_ / sizeof w_[0]);                                   \
        assert_int_equal(rp_scheduler_schedule(s), n_);                                   \
        expect_plan(s, w_, n_, free_pages, __LINE__);                                     \
        finish_step(s);                                                                   \
    } while (0)

/* A schedule with nothing to run. */
static void expect_idle(rp_scheduler *s) {
    assert_int_equal(rp_scheduler_schedule(s), 0);
    assert_int_equal(s->plan_len, 0);
}

static void expect_waiting(const rp_request *r) {
    assert_int_equal(r->state, RP_REQ_WAITING);
    assert_int_equal(r->row, -1);
    assert_int_equal(r->cached, 0);
}

static void test_pages_for(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 1, sched_config(1, 8, 8));
    const int want_pages[] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 3};
    for (int len = 0; len < 10; len++) assert_int_equal(rp_scheduler_pages_for(f.s, len), want_pages[len]);
    assert_int_equal(rp_scheduler_pages_for(f.s, 64), 16);
    assert_int_equal(rp_scheduler_pages_for(f.s, 65), 17);
    teardown(&f);
    /* the chunk defaults to, and never exceeds, the token budget */
    setup(&f, 4, 1, sched_config(1, 8, 0));
    assert_int_equal(f.s->cfg.chunk, 8);
    teardown(&f);
    setup(&f, 4, 1, sched_config(1, 8, 100));
    assert_int_equal(f.s->cfg.chunk, 8);
    teardown(&f);
}

/* Four requests of 5, 9, 3 and 2 tokens (2, 3, 1 and 1 pages) meet one
 * limit at a time. Admission goes in arrival order and stops at the first
 * that does not fit: a later, smaller one does not jump the queue. */
static void test_admission_in_order(void **state) {
    (void)state;
    static const int prompt[4] = {5, 9, 3, 2};
    struct {
        const char *limit;
        int max_running, rows, pages, budget;
        int tokens[4]; /* fed to each in the first step; 0: left waiting */
        int free_pages;
    } cases[] = {
        {"none", 8, 8, 16, 64, {5, 9, 3, 2}, 9},
        {"max_running", 2, 8, 16, 64, {5, 9, 0, 0}, 11},
        {"rows", 8, 3, 16, 64, {5, 9, 3, 0}, 10},
        {"pages (head of line)", 8, 8, 4, 64, {5, 0, 0, 0}, 2},
        {"budget (a partial chunk)", 8, 8, 16, 16, {5, 9, 2, 0}, 10},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture f;
        setup(&f, cases[c].pages, cases[c].rows, sched_config(cases[c].max_running, cases[c].budget, 0));
        for (int i = 0; i < 4; i++) add_req(&f, prompt[i], 4);
        int admitted = 0;
        while (admitted < 4 && cases[c].tokens[admitted]) admitted++;
        assert_int_equal(rp_scheduler_schedule(f.s), admitted);
        for (int i = 0; i < 4; i++) {
            rp_request *r = f.reqs[i];
            assert_int_equal(r->arrival, (uint64_t)i);
            if (i >= admitted) {
                expect_waiting(r);
                continue;
            }
            const rp_sched_item *it = &f.s->plan[i];
            if (it->req != r || it->num_tokens != cases[c].tokens[i] || it->samples != (it->num_tokens == prompt[i]))
                fail_msg("limit %s: item %d is (request %d, %d tokens, samples %d)", cases[c].limit, i,
                         (int)it->req->id, it->num_tokens, it->samples);
            assert_int_equal(r->state, RP_REQ_RUNNING);
            assert_ptr_equal(f.s->running[i], r);
        }
        assert_int_equal(f.s->num_running, admitted);
        assert_int_equal(f.s->num_waiting, 4 - admitted);
        assert_ptr_equal(f.s->wait_head, admitted < 4 ? f.reqs[admitted] : NULL);
        assert_int_equal(f.table->num_free_rows, cases[c].rows - admitted); /* a failed admission gives its row back */
        if (rp_page_pool_num_free(f.pool) != cases[c].free_pages)
            fail_msg("limit %s: %d pages free, expected %d", cases[c].limit, rp_page_pool_num_free(f.pool),
                     cases[c].free_pages);
        teardown(&f);
    }
}

/* A 10-token prompt in chunks of 4: 4, 4, then 2 with the sample flag; a
 * request arriving meanwhile is admitted after the running one's chunk. A
 * request at max_tokens or at the context limit gets nothing more. */
static void test_chunked_prefill(void **state) {
    (void)state;
    fixture f;
    setup(&f, 16, 4, sched_config(4, 64, 4));
    rp_request *a = add_req(&f, 10, 3);
    STEP(f.s, 15, {a, 4, 0});
    assert_int_equal(a->cached, 4);
    assert_int_equal(a->num_output, 0);
    rp_request *b = add_req(&f, 6, 2);
    STEP(f.s, 13, {a, 4, 0}, {b, 4, 0});
    STEP(f.s, 11, {a, 2, 1}, {b, 2, 1}); /* 10 and 6 tokens: 3 + 2 pages */
    assert_int_equal(a->num_output, 1);
    STEP(f.s, 11, {a, 1, 1}, {b, 1, 1}); /* 11 and 7 tokens fit the same pages */
    assert_int_equal(b->num_output, 2); /* b is at max_tokens */
    STEP(f.s, 11, {a, 1, 1});
    assert_int_equal(a->num_output, 3);
    expect_idle(f.s); /* both wait for the engine to finish them: no preemption */
    assert_int_equal(f.s->num_running, 2);
    assert_int_equal(f.s->preemptions, 0);
    assert_int_equal(rp_page_pool_num_free(f.pool), 11);
    teardown(&f);

    /* the context limit: a request whose length reaches max_context stops */
    rp_sched_config cfg = sched_config(4, 64, 4);
    cfg.max_context = 7;
    setup(&f, 16, 4, cfg);
    rp_request *c = add_req(&f, 5, 10);
    STEP(f.s, 15, {c, 4, 0});
    STEP(f.s, 14, {c, 1, 1});
    STEP(f.s, 14, {c, 1, 1}); /* 7 tokens now */
    expect_idle(f.s);
    teardown(&f);
}

/* One budget for decode tokens and prefill chunks: running requests are
 * served oldest first, decodes before chunks, admissions last. */
static void test_token_budget(void **state) {
    (void)state;
    fixture f;
    setup(&f, 32, 8, sched_config(8, 6, 4));
    rp_request *a = add_req(&f, 10, 8), *b = add_req(&f, 10, 8);
    STEP(f.s, 30, {a, 4, 0}, {b, 2, 0});
    STEP(f.s, 29, {a, 4, 0}, {b, 2, 0}); /* the older one gets the full chunk */
    STEP(f.s, 27, {a, 2, 1}, {b, 4, 0});
    STEP(f.s, 26, {a, 1, 1}, {b, 2, 1}); /* a decodes first, b's chunk takes what is left */
    rp_request *c = add_req(&f, 5, 8);
    STEP(f.s, 25, {a, 1, 1}, {b, 1, 1}, {c, 4, 0}); /* decodes, then the newcomer's chunk */
    rp_request *d = add_req(&f, 1, 8);
    STEP(f.s, 22, {a, 1, 1}, {b, 1, 1}, {c, 1, 1}, {d, 1, 1});
    teardown(&f);

    /* decodes take the whole budget: a waiting request is not admitted, and
     * a running prefill gets only what the decodes leave */
    setup(&f, 32, 8, sched_config(8, 3, 3));
    a = add_req(&f, 1, 8);
    b = add_req(&f, 1, 8);
    c = add_req(&f, 1, 8);
    STEP(f.s, 29, {a, 1, 1}, {b, 1, 1}, {c, 1, 1});
    d = add_req(&f, 5, 8);
    STEP(f.s, 29, {a, 1, 1}, {b, 1, 1}, {c, 1, 1});
    assert_int_equal(d->state, RP_REQ_WAITING);
    rp_scheduler_remove(f.s, c);
    STEP(f.s, 29, {a, 1, 1}, {b, 1, 1}, {d, 1, 0});
    STEP(f.s, 29, {a, 1, 1}, {b, 1, 1}, {d, 1, 0});
    rp_scheduler_remove(f.s, a);
    STEP(f.s, 29, {b, 1, 1}, {d, 2, 0});
    STEP(f.s, 28, {b, 1, 1}, {d, 1, 1});
    teardown(&f);
}

/* A long prompt whose chunk could take the whole step: a newcomer gets its
 * chunk in the next step all the same, the long one what is left; budget
 * kept for a newcomer that cannot be admitted (no row) goes back to it. The
 * engine's prefill_cap holds a step's prompt tokens, never its decodes. */
static void test_long_prefill_lets_newcomer_in(void **state) {
    (void)state;
    fixture f;
    setup(&f, 32, 8, sched_config(8, 4, 4));
    rp_request *a = add_req(&f, 20, 4), *b, *c;
    STEP(f.s, 31, {a, 4, 0});
    b = add_req(&f, 2, 8);
    STEP(f.s, 29, {a, 2, 0}, {b, 2, 1}); /* a: 6 tokens, b: 2 (+1 sampled) */
    STEP(f.s, 28, {b, 1, 1}, {a, 3, 0}); /* decode first, then a's chunk */
    c = add_req(&f, 9, 4);
    STEP(f.s, 27, {b, 1, 1}, {c, 3, 0}); /* c's share (its chunk) is the rest of the budget */
    STEP(f.s, 26, {b, 1, 1}, {a, 3, 0}); /* then the oldest prefill goes on */
    f.s->prefill_cap = 2;
    STEP(f.s, 25, {b, 1, 1}, {a, 2, 0}); /* b: 6 tokens, a: 14 */
    rp_scheduler_remove(f.s, b);
    STEP(f.s, 27, {a, 2, 0});
    teardown(&f);

    /* one row: the newcomer cannot be admitted, the long prompt takes it all */
    setup(&f, 32, 1, sched_config(8, 4, 4));
    a = add_req(&f, 20, 4);
    STEP(f.s, 31, {a, 4, 0});
    b = add_req(&f, 2, 4);
    STEP(f.s, 30, {a, 4, 0});
    expect_waiting(b);
    teardown(&f);
}

/* With max_long_prefills = 1 (the engine's), prompts of several chunks are
 * prefilled one at a time, first come first served: b waits while a has
 * chunks left after the step, c (one chunk) passes it at once; b starts in
 * the step of a's last chunk, with the budget that step leaves. */
static void test_long_prefills_one_at_a_time(void **state) {
    (void)state;
    fixture f;
    rp_sched_config cfg = sched_config(8, 8, 4);
    cfg.max_long_prefills = 1;
    setup(&f, 32, 8, cfg);
    rp_request *a = add_req(&f, 12, 8), *b = add_req(&f, 8, 8), *c = add_req(&f, 3, 8);
    STEP(f.s, 30, {a, 4, 0}, {c, 3, 1}); /* b passed over; the budget's last token stays unused */
    expect_waiting(b);
    STEP(f.s, 29, {c, 1, 1}, {a, 4, 0}); /* nothing kept back for b: a takes its chunk */
    expect_waiting(b);
    STEP(f.s, 26, {c, 1, 1}, {a, 4, 1}, {b, 3, 0}); /* a's last chunk: b comes in beside it */
    rp_request *d = add_req(&f, 9, 8);
    STEP(f.s, 24, {a, 1, 1}, {c, 1, 1}, {b, 4, 0}); /* d waits for b */
    expect_waiting(d);
    STEP(f.s, 23, {a, 1, 1}, {b, 1, 1}, {c, 1, 1}, {d, 4, 0}); /* b's last prompt token runs as a decode */
    teardown(&f);

    /* no limit: b starts beside a, c waits for the budget */
    setup(&f, 32, 8, sched_config(8, 8, 4));
    a = add_req(&f, 12, 8), b = add_req(&f, 8, 8), c = add_req(&f, 3, 8);
    STEP(f.s, 30, {a, 4, 0}, {b, 4, 0});
    expect_waiting(c);
    teardown(&f);
}

/* Speculative decoding: a decoding request with drafts is fed its last
 * token and the drafts (samples set, draft counted), after every decode has
 * its token, where the budget, its context and the pages left allow: drafts
 * are cut to fit and never preempt. The engine sets cached and the output
 * to what it keeps after verifying (simulated here). */
static void test_drafts(void **state) {
    (void)state;
    fixture f;
    rp_sched_config cfg = sched_config(4, 8, 8);
    cfg.max_context = 20;
    setup(&f, 5, 4, cfg);
    rp_request *a = add_req(&f, 4, 16), *b = add_req(&f, 4, 16);
    STEP(f.s, 3, {a, 4, 1}, {b, 4, 1}); /* 5 tokens each, 4 cached */
    a->tokens[5] = 11, a->tokens[6] = 12, a->tokens[7] = 13, a->num_draft = 3;
    assert_int_equal(rp_scheduler_schedule(f.s), 2);
    expect_plan(f.s, (const want[]){{a, 4, 1}, {b, 1, 1}}, 2, 1, __LINE__); /* a: 8 tokens in 2 pages */
    assert_int_equal(f.s->plan[0].draft, 3);
    assert_int_equal(f.s->plan[1].draft, 0);
    rp_scheduler_commit(f.s);
    assert_int_equal(a->cached, 8);
    /* the engine keeps draft 11 and emits 21 after it; b samples 30 */
    a->cached = 6, a->tokens[6] = 21, a->num_output = 3;
    b->tokens[5] = 30, b->num_output = 2;
    expect_consistent(f.s);
    /* 7 drafts: a's 2 pages and the free one hold 12 tokens, so 5 fit (6 cached + its token) */
    a->num_draft = 7;
    assert_int_equal(rp_scheduler_schedule(f.s), 2);
    expect_plan(f.s, (const want[]){{a, 6, 1}, {b, 1, 1}}, 2, 0, __LINE__);
    assert_int_equal(f.s->plan[0].draft, 5);
    rp_scheduler_commit(f.s);
    a->cached = 7, a->tokens[7] = 22, a->num_output = 4; /* none kept: the correction */
    b->tokens[6] = 31, b->num_output = 3;
    /* the pool is full: a's drafts fit its own pages (12 - 7 - 1 = 4 of 8), c waits */
    a->num_draft = 8;
    rp_request *c = add_req(&f, 4, 4);
    assert_int_equal(rp_scheduler_schedule(f.s), 2);
    expect_plan(f.s, (const want[]){{a, 5, 1}, {b, 1, 1}}, 2, 0, __LINE__);
    expect_waiting(c);
    rp_scheduler_commit(f.s);
    a->cached = 8, a->num_output = 5, a->num_draft = 0;
    b->tokens[7] = 32, b->num_output = 4;
    teardown(&f);

    /* the last free page goes to b's token, not to a's drafts, whatever the order */
    setup(&f, 4, 4, sched_config(4, 16, 16));
    a = add_req(&f, 3, 16), b = add_req(&f, 8, 16);
    STEP(f.s, 1, {a, 3, 1}, {b, 8, 1});
    a->num_draft = 6;
    STEP(f.s, 0, {a, 1, 1}, {b, 1, 1}); /* a: no room for drafts in its page */
    assert_int_equal(f.s->preemptions, 0);
    teardown(&f);

    /* drafts cut at the context (10 tokens) and the budget */
    cfg = sched_config(4, 16, 16);
    cfg.max_context = 10;
    setup(&f, 16, 4, cfg);
    a = add_req(&f, 4, 16);
    STEP(f.s, 15, {a, 4, 1});
    a->num_draft = 8;
    assert_int_equal(rp_scheduler_schedule(f.s), 1);
    expect_plan(f.s, (const want[]){{a, 6, 1}}, 1, 13, __LINE__); /* 4 cached + 1 + 5 = 10: 3 pages */
    rp_scheduler_commit(f.s);
    a->cached = 5, a->num_output = 2, a->num_draft = 0;
    teardown(&f);
    cfg.max_batched_tokens = 3;
    setup(&f, 16, 4, cfg);
    a = add_req(&f, 3, 16);
    STEP(f.s, 15, {a, 3, 1});
    a->num_draft = 8;
    assert_int_equal(rp_scheduler_schedule(f.s), 1);
    expect_plan(f.s, (const want[]){{a, 3, 1}}, 1, 14, __LINE__); /* the budget: 1 + 2 drafts, 6 tokens */
    rp_scheduler_commit(f.s);
    a->cached = 4, a->num_output = 2, a->num_draft = 0;
    teardown(&f);
}

/* Three requests fill a 4-page pool; when the second cannot get a page for
 * its decode token, the newest (the third) is preempted: its page freed,
 * cached = 0, at the FRONT of the waiting queue (before a request that
 * arrived later), counted. It comes back once pages are free, fed its whole
 * prompt and output again, and keeps its place among the running. */
static void test_preemption_takes_newest(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 4, 10), *b = add_req(&f, 4, 10), *c = add_req(&f, 4, 10);
    STEP(f.s, 1, {a, 4, 1}, {b, 4, 1}, {c, 4, 1});
    rp_request *d = add_req(&f, 2, 10);
    int32_t c_tokens[5];
    memcpy(c_tokens, c->tokens, sizeof c_tokens);
    /* a takes the last page; b needs one: c goes, and c does not fit again */
    STEP(f.s, 0, {a, 1, 1}, {b, 1, 1});
    expect_waiting(c);
    assert_int_equal(c->preemptions, 1);
    assert_int_equal(f.s->preemptions, 1);
    assert_int_equal(a->preemptions + b->preemptions + d->preemptions, 0);
    assert_ptr_equal(f.s->wait_head, c);
    assert_ptr_equal(c->next, d);
    assert_ptr_equal(f.s->wait_tail, d);
    assert_int_equal(f.s->num_waiting, 2);
    assert_int_equal(f.s->num_running, 2);
    assert_int_equal(f.table->num_free_rows, 2);
    assert_int_equal(rp_request_len(c), 5); /* its output is kept: only the cache is lost */
    assert_memory_equal(c->tokens, c_tokens, sizeof c_tokens);
    STEP(f.s, 0, {a, 1, 1}, {b, 1, 1}); /* 6 tokens fit the same 2 pages */
    rp_scheduler_remove(f.s, a);
    assert_int_equal(rp_page_pool_num_free(f.pool), 2);
    /* resumption: c before d, re-fed all 5 of its tokens, sampling its second */
    STEP(f.s, 0, {b, 1, 1}, {c, 5, 1});
    assert_ptr_equal(f.s->running[0], b);
    assert_ptr_equal(f.s->running[1], c);
    assert_int_equal(c->arrival, 2); /* seniority kept: still older than d */
    assert_int_equal(c->num_output, 2);
    assert_int_equal(d->state, RP_REQ_WAITING);
    STEP(f.s, 0, {b, 1, 1}, {c, 1, 1});
    /* b needs its third page: c again, and b takes one of its two */
    STEP(f.s, 1, {b, 1, 1});
    expect_waiting(c);
    assert_int_equal(c->preemptions, 2);
    assert_int_equal(b->preemptions, 0);
    assert_int_equal(f.s->preemptions, 2);
    rp_scheduler_remove(f.s, b);
    STEP(f.s, 1, {c, 7, 1}, {d, 2, 1});
    teardown(&f);
}

/* The request that needs the page is itself the newest: it is the one
 * preempted, and the older one runs on. */
static void test_preemption_of_self(void **state) {
    (void)state;
    fixture f;
    setup(&f, 2, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 3, 10), *b = add_req(&f, 4, 10);
    STEP(f.s, 0, {a, 3, 1}, {b, 4, 1});
    STEP(f.s, 1, {a, 1, 1}); /* a's 4 tokens fit its page; b's 5th does not */
    expect_waiting(b);
    assert_int_equal(b->preemptions, 1);
    assert_int_equal(a->preemptions, 0);
    assert_int_equal(f.s->preemptions, 1);
    assert_ptr_equal(f.s->wait_head, b); /* the queue was empty: b is head and tail */
    assert_ptr_equal(f.s->wait_tail, b);
    rp_request *c = add_req(&f, 1, 10);
    assert_ptr_equal(b->next, c);
    STEP(f.s, 0, {a, 1, 1}); /* b needs 2 pages, 1 is free: it waits, and c behind it */
    assert_int_equal(b->state, RP_REQ_WAITING);
    assert_int_equal(f.s->num_waiting, 2);
    rp_scheduler_remove(f.s, a);
    STEP(f.s, 0, {b, 5, 1});
    assert_int_equal(c->state, RP_REQ_WAITING);
    teardown(&f);
}

/* Every running request is mid-prefill and none can get its next chunk:
 * the newest is preempted so the oldest can go on. */
static void test_stall_preempts_newest(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 4, sched_config(4, 8, 4));
    rp_request *a = add_req(&f, 12, 2), *b = add_req(&f, 12, 2);
    STEP(f.s, 2, {a, 4, 0}, {b, 4, 0});
    STEP(f.s, 0, {a, 4, 0}, {b, 4, 0});
    /* stuck: b goes; a takes a page for its last chunk; b comes straight
     * back with the page left, starting over */
    assert_int_equal(rp_scheduler_schedule(f.s), 2);
    assert_int_equal(b->preemptions, 1);
    assert_int_equal(b->cached, 0);
    expect_plan(f.s, (const want[]){{a, 4, 1}, {b, 4, 0}}, 2, 0, __LINE__);
    finish_step(f.s);
    STEP(f.s, 0, {a, 1, 1}); /* a's 13th token needs b's page */
    expect_waiting(b);
    assert_int_equal(b->preemptions, 2);
    assert_int_equal(f.s->preemptions, 2);
    /* a is at max_tokens (the engine will finish it): nothing can run, and
     * nothing is preempted for a request that may not run anyway */
    expect_idle(f.s);
    assert_int_equal(f.s->preemptions, 2);
    assert_int_equal(a->state, RP_REQ_RUNNING);
    rp_scheduler_remove(f.s, a);
    STEP(f.s, 3, {b, 4, 0});
    STEP(f.s, 2, {b, 4, 0});
    STEP(f.s, 1, {b, 4, 1});
    teardown(&f);
}

/* A retiring request (finished, pages held until its last step completes)
 * is never scheduled nor preempted: the next newest goes instead. Running
 * stays in arrival order when a preempted request comes back. */
static void test_retiring_not_preempted(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 4, 10), *c = add_req(&f, 4, 10), *d = add_req(&f, 8, 10);
    STEP(f.s, 0, {a, 4, 1}, {c, 4, 1}, {d, 8, 1});
    d->retiring = 1; /* what the engine does when d ends while a step still writes its pages */
    STEP(f.s, 0, {a, 1, 1}); /* a needs a page: c goes, not d */
    expect_waiting(c);
    assert_int_equal(d->preemptions, 0);
    assert_int_equal(d->state, RP_REQ_RUNNING);
    assert_int_equal(f.table->row_num_pages[d->row], 2);
    rp_scheduler_remove(f.s, a);
    STEP(f.s, 0, {c, 5, 1}); /* c is back, before d in the running order */
    assert_int_equal(f.s->num_running, 2);
    assert_ptr_equal(f.s->running[0], c);
    assert_ptr_equal(f.s->running[1], d);
    teardown(&f);
}

/* With overlap the engine counts a token in flight: a request whose last
 * output token is still being sampled can be at max_tokens while its cache
 * lags by one. Preempted in that state it must not be admitted again and
 * fed (it cannot run: the engine finishes it when the token arrives). */
static void test_cannot_run_not_readmitted(void **state) {
    (void)state;
    fixture f;
    setup(&f, 5, 4, sched_config(4, 32, 8));
    rp_request *o = add_req(&f, 8, 1), *a = add_req(&f, 16, 4), *x = add_req(&f, 3, 1);
    assert_int_equal(rp_scheduler_schedule(f.s), 3);
    expect_plan(f.s, (const want[]){{o, 8, 1}, {a, 8, 0}, {x, 3, 1}}, 3, 0, __LINE__);
    rp_scheduler_commit(f.s);
    /* the engine launched the step: o's and x's output tokens are in flight
     * (token references), and o ended in the step before (retiring) */
    o->tokens[8] = -1, o->num_output = 1, o->retiring = 1;
    x->tokens[3] = -3, x->num_output = 1;
    /* a's next chunk needs 2 pages, none is free; x may not run: a stall.
     * x, the newest that is not retiring, is preempted; its page is not
     * enough for a. x must not come back; a goes next, and starts over */
    int n = rp_scheduler_schedule(f.s);
    for (int i = 0; i < n; i++)
        if (f.s->plan[i].req == x) fail_msg("a request at max_tokens was scheduled (%d tokens)", f.s->plan[i].num_tokens);
    assert_int_equal(n, 1);
    expect_plan(f.s, (const want[]){{a, 8, 0}}, 1, 1, __LINE__);
    expect_waiting(x);
    assert_int_equal(x->preemptions, 1);
    assert_int_equal(a->preemptions, 1);
    assert_int_equal(o->preemptions, 0);
    finish_step(f.s);
    /* the engine reads the tokens in flight: o and x finish */
    rp_scheduler_remove(f.s, o);
    rp_scheduler_remove(f.s, x);
    assert_int_equal(x->state, RP_REQ_FINISHED);
    STEP(f.s, 1, {a, 8, 1});
    teardown(&f);
}

/* remove() from the head, middle and tail of the waiting queue, from the
 * running set (pages and row back), of a preempted request (no pages) and
 * of a finished one (nothing). */
static void test_remove(void **state) {
    (void)state;
    fixture f;
    setup(&f, 8, 1, sched_config(4, 64, 0)); /* one row: one request runs */
    rp_request *a = add_req(&f, 9, 4), *b = add_req(&f, 2, 4), *c = add_req(&f, 2, 4), *d = add_req(&f, 2, 4);
    STEP(f.s, 5, {a, 9, 1});
    assert_int_equal(f.s->num_waiting, 3);
    rp_scheduler_remove(f.s, c); /* middle */
    assert_int_equal(c->state, RP_REQ_FINISHED);
    assert_ptr_equal(b->next, d);
    rp_scheduler_remove(f.s, d); /* tail */
    assert_ptr_equal(f.s->wait_tail, b);
    assert_null(b->next);
    rp_request *e = add_req(&f, 3, 4); /* the tail link is right */
    assert_ptr_equal(b->next, e);
    rp_scheduler_remove(f.s, b); /* head */
    assert_ptr_equal(f.s->wait_head, e);
    assert_ptr_equal(f.s->wait_tail, e);
    assert_int_equal(f.s->num_waiting, 1);
    rp_scheduler_remove(f.s, a); /* running: 3 pages and the row back */
    assert_int_equal(a->state, RP_REQ_FINISHED);
    assert_int_equal(a->row, -1);
    assert_int_equal(f.s->num_running, 0);
    assert_int_equal(rp_page_pool_num_free(f.pool), 8);
    assert_int_equal(f.table->num_free_rows, 1);
    rp_scheduler_remove(f.s, a); /* finished already: nothing happens */
    assert_int_equal(rp_page_pool_num_free(f.pool), 8);
    STEP(f.s, 7, {e, 3, 1});
    teardown(&f);

    /* a preempted request holds no pages: removing it frees nothing twice */
    setup(&f, 2, 4, sched_config(4, 64, 0));
    a = add_req(&f, 3, 10);
    b = add_req(&f, 4, 10);
    STEP(f.s, 0, {a, 3, 1}, {b, 4, 1});
    STEP(f.s, 1, {a, 1, 1});
    expect_waiting(b);
    rp_scheduler_remove(f.s, b);
    assert_int_equal(f.s->num_waiting, 0);
    assert_null(f.s->wait_head);
    assert_null(f.s->wait_tail);
    assert_int_equal(rp_page_pool_num_free(f.pool), 1);
    teardown(&f);
}


/* ---- with a prefix cache (PS = 4 tokens a page) ---- */

/* r's first n prompt tokens made the same as src's. */
static void share_prompt(rp_request *r, const rp_request *src, int n) {
    memcpy(r->tokens, src->tokens, (size_t)n * sizeof *r->tokens);
}

static rp_prefix_cache_stats cache_stats(const fixture *f) {
    rp_prefix_cache_stats st;
    rp_prefix_cache_get_stats(f->cache, &st);
    return st;
}

/* A request starts at its longest cached prefix in whole pages, always
 * leaving its last prompt token to compute: its row begins with the
 * cache's pages (locked) and only the rest is fed and allocated. A prompt
 * goes to the cache at the commit of the step that completes it; a request
 * that ends gives its computed full pages (and only those) to the cache. */
static void test_cache_admission_from_match(void **state) {
    (void)state;
    fixture f;
    setup_cached(&f, 8, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 10, 4);
    STEP(f.s, 5, {a, 10, 1});
    assert_int_equal(a->cached_prompt_tokens, 0);
    assert_int_equal(f.table->row_shared[a->row], 2); /* 2 full pages cached, the third its own */
    assert_int_equal(a->prefix.num_pages, 2);
    rp_request *b = make_req(&f, 10, 4), *c = make_req(&f, 9, 4), *d = make_req(&f, 10, 4);
    share_prompt(b, a, 8); /* differs in its last 2 */
    share_prompt(c, a, 9);
    share_prompt(d, a, 10); /* the same prompt */
    rp_scheduler_enqueue(f.s, b);
    rp_scheduler_enqueue(f.s, c);
    rp_scheduler_enqueue(f.s, d);
    /* b, c and d each find 8 tokens: b and d feed 2, c 1 (a third page needs 12) */
    STEP(f.s, 2, {a, 1, 1}, {b, 2, 1}, {c, 1, 1}, {d, 2, 1});
    assert_int_equal(b->cached_prompt_tokens, 8);
    assert_int_equal(c->cached_prompt_tokens, 8);
    assert_int_equal(d->cached_prompt_tokens, 8);
    assert_int_equal(rp_page_table_row(f.table, b->row)[0], rp_page_table_row(f.table, a->row)[0]);
    assert_int_equal(rp_page_table_row(f.table, d->row)[1], rp_page_table_row(f.table, a->row)[1]);
    rp_prefix_cache_stats st = cache_stats(&f);
    assert_int_equal(st.hit_tokens, 24);
    assert_int_equal(st.queried_tokens, 10 + 10 + 9 + 10);
    assert_int_equal(st.cached_pages, 2);
    assert_int_equal(st.handles, 4);
    /* a has 11 tokens computed: its 2 shared pages stay cached, its third
     * page (3 of 4 tokens) goes back to the pool */
    rp_scheduler_remove(f.s, a);
    assert_int_equal(rp_page_pool_num_free(f.pool), 3);
    assert_int_equal(cache_stats(&f).cached_pages, 2);
    expect_consistent(f.s);
    /* d computes 12 tokens: at its end its third page is full and cached */
    STEP(f.s, 3, {b, 1, 1}, {c, 1, 1}, {d, 1, 1});
    STEP(f.s, 3, {b, 1, 1}, {c, 1, 1}, {d, 1, 1});
    assert_int_equal(d->cached, 12);
    rp_scheduler_remove(f.s, d);
    assert_int_equal(cache_stats(&f).cached_pages, 3);
    assert_int_equal(rp_page_pool_num_free(f.pool), 3);
    teardown(&f);
}

/* A waiting request whose prompt a running prefill is computing waits for
 * it (passed over, not blocking the queue), then finds it cached: the n
 * choices of one prompt prefill it once. */
static void test_cache_waits_for_prefill(void **state) {
    (void)state;
    fixture f;
    setup_cached(&f, 16, 4, sched_config(4, 64, 4));
    rp_request *a = add_req(&f, 12, 4), *b = make_req(&f, 12, 4);
    share_prompt(b, a, 12);
    rp_scheduler_enqueue(f.s, b);
    rp_request *c = add_req(&f, 5, 4);
    STEP(f.s, 14, {a, 4, 0}, {c, 4, 0}); /* b is passed over, c behind it comes in */
    assert_int_equal(b->state, RP_REQ_WAITING);
    STEP(f.s, 12, {c, 1, 1}, {a, 4, 0});
    STEP(f.s, 11, {c, 1, 1}, {a, 4, 1}); /* a completes its prompt in this step */
    assert_int_equal(b->state, RP_REQ_WAITING);
    /* b finds a's first 2 pages (its last token must be computed, and with
     * it the rest of its third page) */
    STEP(f.s, 9, {a, 1, 1}, {c, 1, 1}, {b, 4, 1});
    assert_int_equal(b->cached_prompt_tokens, 8);
    assert_int_equal(cache_stats(&f).hit_tokens, 8);
    /* d differs from a within its first page: it does not wait; e, the same
     * prompt as d, waits for d */
    rp_request *d = make_req(&f, 12, 4);
    share_prompt(d, a, 3);
    rp_scheduler_enqueue(f.s, d);
    rp_request *e = make_req(&f, 12, 4);
    share_prompt(e, d, 12);
    rp_scheduler_enqueue(f.s, e);
    /* b's third page, computed again, went back to the pool at its commit:
     * its row now shares a's 3 pages */
    STEP(f.s, 8, {a, 1, 1}, {b, 1, 1}, {c, 1, 1}, {d, 4, 0});
    assert_int_equal(f.table->row_shared[b->row], 3);
    assert_int_equal(e->state, RP_REQ_WAITING);
    teardown(&f);
}

/* Pages come from the pool, then from evicting unlocked cached pages (the
 * least recently used leaf first), and only then from preempting. */
static void test_cache_evicts_before_preempting(void **state) {
    (void)state;
    fixture f;
    setup_cached(&f, 4, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 8, 4);
    STEP(f.s, 2, {a, 8, 1});
    rp_scheduler_remove(f.s, a); /* its 2 pages stay cached, unlocked */
    assert_int_equal(rp_page_pool_num_free(f.pool), 2);
    assert_int_equal(rp_scheduler_pages_available(f.s), 4);
    /* b (2 pages) and c (1 page) are admitted on the free and evictable pages */
    rp_request *b = add_req(&f, 6, 10), *c = add_req(&f, 2, 1);
    STEP(f.s, 0, {b, 6, 1}, {c, 2, 1});
    assert_int_equal(cache_stats(&f).evicted_pages, 1);
    assert_int_equal(cache_stats(&f).cached_pages, 2); /* a's first page, b's first */
    rp_scheduler_remove(f.s, c); /* no full page: its page goes back to the pool */
    rp_request *d = add_req(&f, 1, 10);
    STEP(f.s, 0, {b, 1, 1}, {d, 1, 1});
    STEP(f.s, 0, {b, 1, 1}, {d, 1, 1});
    /* b's 9th token needs a page: a's last cached page is evicted, d stays */
    STEP(f.s, 0, {b, 1, 1}, {d, 1, 1});
    assert_int_equal(cache_stats(&f).evicted_pages, 2);
    assert_int_equal(f.s->preemptions, 0);
    STEP(f.s, 0, {b, 1, 1}, {d, 1, 1});
    /* d's 5th token: nothing free, nothing evictable (b's page is locked):
     * d, the newest, is preempted, and its full page goes to the cache */
    STEP(f.s, 0, {b, 1, 1});
    assert_int_equal(f.s->preemptions, 1);
    assert_int_equal(d->state, RP_REQ_WAITING);
    assert_int_equal(cache_stats(&f).evictable_pages, 1);
    teardown(&f);
}

/* A preempted request's computed full pages go to the cache; when it comes
 * back it starts from what is still there. */
static void test_cache_preempted_comes_back(void **state) {
    (void)state;
    fixture f;
    setup_cached(&f, 4, 4, sched_config(4, 64, 0));
    rp_request *a = add_req(&f, 8, 10), *b = add_req(&f, 8, 10);
    STEP(f.s, 0, {a, 8, 1}, {b, 8, 1});
    /* a's 9th token needs a page and every cached page is locked: b goes,
     * its pages become evictable, and one of them makes a's page */
    STEP(f.s, 0, {a, 1, 1});
    assert_int_equal(b->state, RP_REQ_WAITING);
    assert_int_equal(cache_stats(&f).evicted_pages, 1);
    assert_int_equal(cache_stats(&f).cached_pages, 3);
    rp_scheduler_remove(f.s, a);
    /* b (9 tokens) finds its first page still cached: 5 tokens to feed */
    STEP(f.s, 0, {b, 5, 1});
    assert_int_equal(b->cached, 9);
    assert_int_equal(b->cached_prompt_tokens, 0); /* what its first admission found */
    assert_int_equal(cache_stats(&f).hit_tokens, 4);
    teardown(&f);
}

/* ---- admission with room for decode growth (rp_sched_policy) ------------

 * A whole run played as the engine plays it, many requests at once: every
 * step is scheduled, committed and checked (rp_scheduler_check), every
 * sampled token appended, and a request leaves when it reaches max_tokens
 * or, when it does not ignore EOS and stop_at is set, when it has made
 * stop_at tokens (its "EOS"). */
typedef struct sim {
    rp_page_pool *pool;
    rp_page_table *table;
    rp_prefix_cache *cache;
    rp_scheduler *s;
    rp_request *reqs;
    int num_reqs, stop_at;
    int first_admitted; /* running after the first step */
    int peak_running, steps;
    double peak_ratio_after_preemption;
} sim;

enum { SIM_PROMPT = 8, SIM_MAX_TOKENS = 24, SIM_SHARED = 8 };

static rp_sched_policy policy(int reserve, double init, double min, int decay_steps) {
    return (rp_sched_policy){.reserve_decode = reserve, .init_ratio = init, .min_ratio = min,
                             .decay_steps = decay_steps, .clip_tokens = 4096};
}

/* n requests of SIM_PROMPT prompt tokens (the first shared tokens the same
 * in all of them, the rest their own) and max_tokens each, all waiting. */
static void sim_setup(sim *m, int num_pages, int max_running, rp_sched_policy pol, int n, int max_tokens,
                      int ignore_eos, int shared, int with_cache) {
    memset(m, 0, sizeof *m);
    rp_sched_config cfg = {.max_running = max_running, .max_batched_tokens = 256, .chunk = 256, .max_context = 64,
                           .policy = pol};
    m->pool = rp_page_pool_new(num_pages, PS);
    m->table = rp_page_table_new(m->pool, max_running, cfg.max_context);
    if (with_cache) m->cache = rp_prefix_cache_new(m->pool);
    m->s = rp_scheduler_new(&cfg, m->table, m->cache);
    assert_non_null(m->s);
    m->reqs = calloc((size_t)n, sizeof *m->reqs);
    m->num_reqs = n;
    for (int i = 0; i < n; i++) {
        rp_request *r = &m->reqs[i];
        r->tokens = calloc((size_t)(SIM_PROMPT + max_tokens + 1), sizeof *r->tokens);
        for (int k = 0; k < SIM_PROMPT; k++) r->tokens[k] = k < shared ? 7 + k : 1000 * (i + 1) + k;
        r->id = (rp_request_id)i + 1;
        r->num_prompt = SIM_PROMPT;
        r->max_tokens = max_tokens;
        r->ignore_eos = ignore_eos;
        r->row = -1;
        rp_scheduler_enqueue(m->s, r);
    }
}

/* Runs until every request has left; every pool page back at the end. */
static void sim_run(sim *m) {
    rp_scheduler *s = m->s;
    int left = m->num_reqs;
    rp_sched_item *items = calloc((size_t)s->cfg.max_running, sizeof *items);
    while (left > 0) {
        uint64_t preempted = s->preemptions;
        int n = rp_scheduler_schedule(s);
        if (n <= 0) fail_msg("step %d: nothing scheduled with %d requests left", m->steps, left);
        if (s->preemptions > preempted && s->new_token_ratio > m->peak_ratio_after_preemption)
            m->peak_ratio_after_preemption = s->new_token_ratio;
        if (m->steps == 0) m->first_admitted = s->num_running;
        if (s->num_running > m->peak_running) m->peak_running = s->num_running;
        memcpy(items, s->plan, (size_t)n * sizeof *items);
        rp_scheduler_commit(s);
        expect_consistent(s);
        for (int i = 0; i < n; i++) {
            rp_request *r = items[i].req;
            if (!items[i].samples) continue;
            r->tokens[rp_request_len(r)] = 900 + rp_request_len(r);
            r->num_output++;
            int eos = !r->ignore_eos && m->stop_at && r->num_output == m->stop_at;
            if (r->num_output == r->max_tokens || eos) {
                rp_scheduler_remove(s, r);
                expect_consistent(s);
                left--;
            }
        }
        m->steps++;
        if (m->steps > 100000) fail_msg("no end after %d steps, %d requests left", m->steps, left);
    }
    free(items);
    assert_int_equal(s->num_running, 0);
    assert_int_equal(s->num_waiting, 0);
    int cached = 0;
    if (m->cache) {
        rp_prefix_cache_stats st;
        rp_prefix_cache_get_stats(m->cache, &st);
        assert_int_equal(st.handles, 0);
        cached = st.cached_pages;
    }
    assert_int_equal(rp_page_pool_num_free(m->pool) + cached, m->pool->num_pages);
    assert_int_equal(m->table->num_free_rows, m->table->max_rows);
}

static void sim_free(sim *m) {
    for (int i = 0; i < m->num_reqs; i++) free(m->reqs[i].tokens);
    free(m->reqs);
    rp_scheduler_free(m->s);
    rp_prefix_cache_free(m->cache);
    rp_page_table_free(m->table);
    rp_page_pool_free(m->pool);
}

/* (a) A pool that holds N = 8 requests whole (8 prompt + 24 output tokens:
 * 8 pages each, 64 pages) and 2N of them waiting, ignoring EOS: admission
 * stops at N, and nothing is ever preempted. Admitted on their prompts
 * alone, as before, all 16 get in and thrash. */
static void test_reserve_holds_full_lengths(void **state) {
    (void)state;
    enum { N = 8, PAGES = N * (SIM_PROMPT + SIM_MAX_TOKENS) / PS };
    for (int cache = 0; cache < 2; cache++) {
        sim m;
        sim_setup(&m, PAGES, 2 * N, RP_SCHED_POLICY_DEFAULT, 2 * N, SIM_MAX_TOKENS, 1, 0, cache);
        sim_run(&m);
        print_message("  reserved%s: %d admitted at first, peak %d running, %llu preemptions, %d steps\n",
                      cache ? ", prefix cache" : "", m.first_admitted, m.peak_running,
                      (unsigned long long)m.s->preemptions, m.steps);
        assert_int_equal(m.first_admitted, N);
        assert_int_equal(m.peak_running, N);
        assert_int_equal(m.s->preemptions, 0);
        sim_free(&m);
    }
    sim m;
    sim_setup(&m, PAGES, 2 * N, policy(0, 0, 0, 0), 2 * N, SIM_MAX_TOKENS, 1, 0, 0);
    sim_run(&m);
    print_message("  prompts alone: %d admitted at first, %llu preemptions, %d steps\n", m.first_admitted,
                  (unsigned long long)m.s->preemptions, m.steps);
    assert_int_equal(m.first_admitted, 2 * N);
    assert_true(m.s->preemptions > 0);
    sim_free(&m);
}

/* (b) Requests that stop at 10% of max_tokens (4 of 40), EOS not ignored:
 * the ratio starts at 0.7 (8 + 28 tokens: 9 pages each, 7 of them in 64
 * pages), decays to 0.1 over 20 steps without a preemption (8 + 4 tokens:
 * 3 pages), and the running set grows past the 8 that ignoring EOS allows. */
static void test_reserve_learns_early_stops(void **state) {
    (void)state;
    enum { PAGES = 64, MAX_TOKENS = 40 };
    sim m;
    sim_setup(&m, PAGES, 32, policy(1, 0.7, 0.1, 20), 96, MAX_TOKENS, 0, 0, 0);
    m.stop_at = MAX_TOKENS / 10;
    sim_run(&m);
    print_message("  early stops: %d admitted at first, peak %d running, ratio %.2f, %llu preemptions, %d steps\n",
                  m.first_admitted, m.peak_running, m.s->new_token_ratio, (unsigned long long)m.s->preemptions,
                  m.steps);
    assert_int_equal(m.first_admitted, 7);
    assert_true(m.peak_running > 8);
    assert_true(m.peak_running >= 2 * m.first_admitted);
    assert_true(m.s->new_token_ratio < 0.1 + 1e-9);
    assert_int_equal(m.s->preemptions, 0);
    sim_free(&m);
}

/* (c) A wrong estimate: the ratio is held at 0.1 but every request runs to
 * max_tokens. Admission lets in more than the pool holds; preemption makes
 * room, raises the ratio (at least back to init_ratio), and everything
 * completes with the page accounting whole after every step, with and
 * without a prefix cache (a shared first page). */
static void test_reserve_wrong_estimate(void **state) {
    (void)state;
    enum { N = 8, PAGES = N * (SIM_PROMPT + SIM_MAX_TOKENS) / PS };
    for (int cache = 0; cache < 2; cache++) {
        sim m;
        sim_setup(&m, PAGES, 2 * N, policy(1, 0.1, 0.1, 600), 3 * N, SIM_MAX_TOKENS, 0, cache ? PS : 0, cache);
        sim_run(&m);
        print_message("  wrong estimate%s: peak %d running, %llu preemptions, ratio raised to %.2f, %d steps\n",
                      cache ? ", prefix cache" : "", m.peak_running, (unsigned long long)m.s->preemptions,
                      m.peak_ratio_after_preemption, m.steps);
        assert_true(m.peak_running > N);
        assert_true(m.s->preemptions > 0);
        assert_true(m.peak_ratio_after_preemption > 0.1);
        for (int i = 0; i < m.num_reqs; i++) assert_int_equal(m.reqs[i].num_output, SIM_MAX_TOKENS);
        sim_free(&m);
    }
}

/* (d) The default running set: the pool's tokens / 512 (the context when
 * shorter), within [16, 1024]. */
static void test_default_max_running(void **state) {
    (void)state;
    assert_int_equal(rp_sched_default_max_running(440000, 131072), 859); /* llama3-8b on an H100 */
    assert_int_equal(rp_sched_default_max_running(2000000, 131072), 1024);
    assert_int_equal(rp_sched_default_max_running(4096, 40960), 16);
    assert_int_equal(rp_sched_default_max_running(0, 40960), 16);
    assert_int_equal(rp_sched_default_max_running(65536, 512), 128);
    assert_int_equal(rp_sched_default_max_running(8192, 256), 32); /* short contexts: more of them */
    assert_int_equal(rp_sched_default_max_running(8192, 0), 16);
}


/* The plan's items, pages aside. */
static void expect_items(rp_scheduler *s, const want *w, int n, int line) {
    assert_int_equal(rp_scheduler_schedule(s), n);
    for (int i = 0; i < n; i++) {
        const rp_sched_item *it = &s->plan[i];
        if (it->req != w[i].req || it->num_tokens != w[i].num_tokens || it->samples != w[i].samples)
            fail_msg("line %d: plan item %d is (request %d, %d tokens, samples %d), expected (request %d, %d, %d)", line,
                     i, (int)it->req->id, it->num_tokens, it->samples, (int)w[i].req->id, w[i].num_tokens,
                     w[i].samples);
    }
}
#define ITEMS(s, ...)                                                                     \
    do {                                                                                  \
        const want w_[] = {__VA_ARGS__};                                                  \
        expect_items(s, w_, (int)(sizeof w_ / sizeof w_[0]), __LINE__);                   \
    } while (0)

/* What the engine records after a step: the logits of every position fed. */
static void record_prompt_logits(rp_request *r) {
    if (!r->prompt_lp) return;
    r->prompt_lp_done = r->cached < r->num_prompt - 1 ? r->cached : r->num_prompt - 1;
}

/* Requests that want every prompt position's logits (prompt logprobs): a
 * chunk takes a logit row per token, one of them the row any request has,
 * the rest from the step's spare rows (3 here), shared in plan order; such a
 * request is admitted without the prefix cache, even with its whole prompt
 * cached, and is an ordinary one once its prompt's logits are recorded. */
static void test_prompt_logit_rows(void **state) {
    (void)state;
    fixture f;
    rp_sched_config cfg = sched_config(4, 64, 0);
    cfg.prompt_logit_rows = 3;
    setup_cached(&f, 16, 4, cfg);
    rp_request *a = add_req(&f, 10, 8);
    STEP(f.s, 13, {a, 10, 1});
    rp_prompt_logprob lp[10];
    rp_request *b = make_req(&f, 10, 4), *c = make_req(&f, 6, 4);
    share_prompt(b, a, 10); /* a's prompt, 8 tokens of it cached */
    b->prompt_lp = c->prompt_lp = lp;
    rp_scheduler_enqueue(f.s, b);
    rp_scheduler_enqueue(f.s, c);
    /* b: 1 + 3 rows; c: the row it has anyway */
    ITEMS(f.s, {a, 1, 1}, {b, 4, 0}, {c, 1, 0});
    assert_int_equal(b->row >= 0 ? f.table->row_shared[b->row] : -1, 0);
    finish_step(f.s);
    assert_int_equal(b->cached_prompt_tokens, 0);
    record_prompt_logits(b);
    record_prompt_logits(c);
    ITEMS(f.s, {a, 1, 1}, {b, 4, 0}, {c, 1, 0});
    finish_step(f.s);
    record_prompt_logits(b);
    record_prompt_logits(c);
    ITEMS(f.s, {a, 1, 1}, {b, 2, 1}, {c, 3, 0}); /* b's last 2 take 1 spare row, c 1 + the other 2 */
    finish_step(f.s);
    record_prompt_logits(b);
    record_prompt_logits(c);
    assert_false(rp_request_wants_prompt_logits(b));
    ITEMS(f.s, {a, 1, 1}, {b, 1, 1}, {c, 1, 1}); /* b decodes; c's last prompt token */
    finish_step(f.s);
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages_for),
        cmocka_unit_test(test_admission_in_order),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_token_budget),
        cmocka_unit_test(test_long_prefill_lets_newcomer_in),
        cmocka_unit_test(test_long_prefills_one_at_a_time),
        cmocka_unit_test(test_drafts),
        cmocka_unit_test(test_preemption_takes_newest),
        cmocka_unit_test(test_preemption_of_self),
        cmocka_unit_test(test_stall_preempts_newest),
        cmocka_unit_test(test_retiring_not_preempted),
        cmocka_unit_test(test_cannot_run_not_readmitted),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_cache_admission_from_match),
        cmocka_unit_test(test_cache_waits_for_prefill),
        cmocka_unit_test(test_cache_evicts_before_preempting),
        cmocka_unit_test(test_cache_preempted_comes_back),
        cmocka_unit_test(test_reserve_holds_full_lengths),
        cmocka_unit_test(test_reserve_learns_early_stops),
        cmocka_unit_test(test_reserve_wrong_estimate),
        cmocka_unit_test(test_default_max_running),
        cmocka_unit_test(test_prompt_logit_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
