/* The prefix cache inside the engine (issue 36), on the CPU backend with the
 * tiny-qwen3 dummy shape: whatever the cache reuses, every request gets the
 * tokens, log-probabilities and top alternatives it gets with the cache off.
 * Shared prefixes of every length around page boundaries (page_size - 1,
 * page_size, page_size + 1, 2 * page_size - 1, 2 * page_size, 2 * page_size
 * + 1, 3 * page_size + 1), the requests one after another and all
 * together, chunked and not; eviction under a small pool;
 * preemption under a tiny one; an abort in the middle of a chunked prefill
 * (what it leaves in the cache is complete and correct); n choices of one
 * prompt (one prefill); a random run of hundreds of arrivals and aborts.
 * Every engine here checks the page accounting after every step
 * (debug_check_every_step: pool, page table, the cache's invariants, no page
 * leaked or counted twice), and every test ends with the pool whole again:
 * no lock left, every page free or cached. The hit counters and each
 * request's cached_tokens are pinned where the arithmetic is known. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "replay/engine.h"
#include "test_util.h"
#include "engine_hold.h"

#define PS 16 /* tokens per page */
#define MAX_TOKENS 160
#define MAX_OUT 12
#define TOP 3

typedef struct result {
    int32_t tokens[MAX_OUT];
    float logprobs[MAX_OUT];
    int32_t top_ids[MAX_OUT][TOP];
    float top_lp[MAX_OUT][TOP];
    int n, finals, preemptions, cached_tokens;
    rp_finish finish;
    /* run on the engine thread when the request's act_at-th token arrives */
    int act_at;
    void (*act)(struct result *r);
    void *act_ctx;
} result;


static void collect(void *user, const rp_token_event *ev) {
    result *r = user;
    pthread_mutex_lock(&mu);
    if (ev->token >= 0 && r->n < MAX_OUT) {
        r->tokens[r->n] = ev->token;
        r->logprobs[r->n] = ev->logprob;
        for (int k = 0; k < TOP && k < ev->num_top_logprobs; k++) {
            r->top_ids[r->n][k] = ev->top_ids[k];
            r->top_lp[r->n][k] = ev->top_logprobs[k];
        }
        r->n++;
    }
    r->cached_tokens = ev->cached_tokens;
    if (ev->finish != RP_FINISH_REASON_NONE) {
        r->finish = ev->finish;
        r->finals++;
        r->preemptions = ev->preemptions;
    }
    int act = r->act && ev->finish == RP_FINISH_REASON_NONE && r->n == r->act_at;
    pthread_mutex_unlock(&mu);
    if (act) r->act(r);
}

/* Holds the engine thread in the final callback of a one-token request, so
 * that requests submitted meanwhile reach the scheduler together. */

typedef struct engine_setup {
    int cache, num_pages, chunk, step_tokens, max_running, no_overlap;
    int no_reserve; /* admit on the first chunk alone: preemption under a small pool */
} engine_setup;

static rp_engine *make_engine(engine_setup s) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.dummy_name = "tiny-qwen3";
    c.weight_seed = 7;
    c.quiet_model_warning = 1;
    c.device = "cpu";
    c.threads = 2;
    c.page_size = PS;
    c.num_pages = s.num_pages;
    c.max_context = 256;
    c.chunked_prefill_size = s.chunk;
    c.max_batched_tokens = s.step_tokens ? s.step_tokens : 256;
    c.step_ms_target = -1; /* steps sized by tokens, not time: the same plans on every host */
    c.max_running_requests = s.max_running ? s.max_running : 16;
    c.disable_overlap = s.no_overlap;
    c.enable_prefix_caching = s.cache;
    c.debug_check_every_step = 1;
    c.disable_decode_reservation = s.no_reserve;
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

/* At rest every page is free or cached and none is locked: the pool free
 * plus the cache's pages make the whole pool, and all of them can be taken.
 * (The engine's per-step check has verified the same from the inside.) */
static rp_engine_stats expect_at_rest(rp_engine *e, int cache) {
    rp_engine_stats st;
    rp_engine_wait_idle(e);
    rp_engine_get_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.kv_pages_free, st.kv_pages_total);
    if (!cache) assert_int_equal(st.kv_pages_cached, 0);
    assert_true(st.kv_pages_cached >= 0 && st.kv_pages_cached <= st.kv_pages_total);
    return st;
}

typedef struct req {
    int32_t prompt[MAX_TOKENS];
    int len, max_tokens;
    uint64_t seed;
    int sampled;
} req;

static void submit(rp_engine *e, const req *q, result *r, rp_request_id *id) {
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt_ids = q->prompt;
    p.num_prompt_ids = q->len;
    p.max_tokens = q->max_tokens;
    p.ignore_eos = 1;
    p.temperature = q->sampled ? 0.9f : 0.0f;
    p.seed = q->seed;
    p.has_seed = 1;
    p.logprobs = 1;
    p.top_logprobs = TOP;
    rp_error err;
    if (rp_engine_submit(e, &p, collect, r, id, &err)) fail_msg("submit: %s", err.message);
}

/* Runs the requests on e: one after another, or all reaching the scheduler
 * together; returns the stats at rest. */
static rp_engine_stats run_on(rp_engine *e, int cache, const req *q, int n, int together, result *out) {
    memset(out, 0, (size_t)n * sizeof *out);
    hold h;
    if (together) hold_engine(e, &h);
    for (int i = 0; i < n; i++) {
        submit(e, &q[i], &out[i], NULL);
        if (!together) rp_engine_wait_idle(e);
    }
    if (together) release_engine(&h);
    return expect_at_rest(e, cache);
}

/* The same on an engine of its own. */
static rp_engine_stats run(engine_setup s, const req *q, int n, int together, result *out) {
    rp_engine *e = make_engine(s);
    rp_engine_stats st = run_on(e, s.cache, q, n, together, out);
    rp_engine_destroy(e);
    return st;
}

/* The same tokens, log-probabilities and top alternatives (bit for bit: a
 * cached page holds exactly the K/V the request would have computed, and
 * the CPU backend's results do not depend on the batch around a token). */
static void expect_same(const result *ref, const result *got, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (got[i].finals != 1) fail_msg("%s: request %d had %d final events", what, i, got[i].finals);
        if (got[i].n != ref[i].n) fail_msg("%s: request %d made %d tokens, %d without the cache", what, i, got[i].n,
                                           ref[i].n);
        for (int t = 0; t < ref[i].n; t++) {
            if (got[i].tokens[t] != ref[i].tokens[t] || got[i].logprobs[t] != ref[i].logprobs[t])
                fail_msg("%s: request %d token %d is %d (logprob %.9g), %d (%.9g) without the cache", what, i, t,
                         got[i].tokens[t], got[i].logprobs[t], ref[i].tokens[t], ref[i].logprobs[t]);
            for (int k = 0; k < TOP; k++)
                if (got[i].top_ids[t][k] != ref[i].top_ids[t][k] || got[i].top_lp[t][k] != ref[i].top_lp[t][k])
                    fail_msg("%s: request %d token %d: top alternative %d differs", what, i, t, k);
        }
    }
}

static void fill(int32_t *t, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = 2 + (int32_t)((seed >> 33) % 1000);
    }
}

/* For a shared prefix of L tokens, five requests: A = prefix + 5 tokens;
 * B = prefix + 7 other tokens; C = the prefix alone; D = A again; E = A's
 * prompt with A's output appended (a chat's next turn). */
enum { NUM_SHARED = 5 };

static void shared_requests(req *q, int L, uint64_t seed) {
    int32_t prefix[MAX_TOKENS];
    fill(prefix, L, seed);
    int suffix[4] = {5, 7, 0, 5};
    for (int i = 0; i < 4; i++) {
        q[i] = (req){.len = L + suffix[i], .max_tokens = 4, .seed = 1};
        memcpy(q[i].prompt, prefix, (size_t)L * sizeof *prefix);
    }
    fill(q[0].prompt + L, 5, seed + 1);
    fill(q[1].prompt + L, 7, seed + 2);
    memcpy(q[3].prompt, q[0].prompt, (size_t)q[0].len * sizeof *q[0].prompt);
    q[4] = q[0]; /* E: its prompt is completed with A's output by the test */
}

static int floor_pages(int n) { return n / PS * PS; }

static void test_page_boundaries(void **state) {
    (void)state;
    static const int lengths[] = {PS - 1, PS, PS + 1, 2 * PS - 1, 2 * PS, 2 * PS + 1, 3 * PS + 1};
    /* one engine for the references and one for each chunking: each case
     * has prompts of its own, so the cases do not share pages */
    rp_engine *ref_engine = make_engine((engine_setup){.cache = 0});
    rp_engine *cached[2] = {make_engine((engine_setup){.cache = 1}), make_engine((engine_setup){.cache = 1, .chunk = 5})};
    for (size_t k = 0; k < sizeof lengths / sizeof *lengths; k++)
        for (int together = 0; together < 2; together++)
            for (int chunk = 0; chunk < 2; chunk++) {
                int L = lengths[k];
                req q[NUM_SHARED];
                result ref[NUM_SHARED], got[NUM_SHARED];
                shared_requests(q, L, 100 + (uint64_t)L + 1000 * (uint64_t)(together * 2 + chunk));
                /* E continues A's conversation: A's prompt, its output, 3 more tokens */
                run_on(ref_engine, 0, q, 1, 0, ref);
                memcpy(q[4].prompt + q[0].len, ref[0].tokens, (size_t)ref[0].n * sizeof *ref[0].tokens);
                fill(q[4].prompt + q[0].len + ref[0].n, 3, 7);
                q[4].len = q[0].len + ref[0].n + 3;
                run_on(ref_engine, 0, q, NUM_SHARED, 0, ref);
                char what[96];
                snprintf(what, sizeof what, "prefix of %d tokens, %s, %s", L, together ? "together" : "one by one",
                         chunk ? "chunks of 5" : "no chunking");
                rp_engine_stats before;
                rp_engine_get_stats(cached[chunk], &before);
                rp_engine_stats st = run_on(cached[chunk], 1, q, NUM_SHARED, together, got);
                expect_same(ref, got, NUM_SHARED, what);
                /* what each request finds: A nothing; B and C the prefix's
                 * full pages (C must compute its last token); D all of A but
                 * its last token; E all of A's prompt and output but the
                 * last output token (whose K/V A never computed). Together,
                 * B to E wait for A's prefill rather than repeat it, but E's
                 * pages beyond A's prompt come only when A ends. */
                int want[NUM_SHARED] = {0, floor_pages(L), floor_pages(L - 1), floor_pages(q[0].len - 1),
                                        floor_pages(q[0].len + ref[0].n - 1)};
                if (together) want[4] = floor_pages(q[0].len);
                uint64_t hits = 0, queried = 0;
                for (int i = 0; i < NUM_SHARED; i++) {
                    if (got[i].cached_tokens != want[i])
                        fail_msg("%s: request %c found %d tokens cached, expected %d", what, 'A' + i,
                                 got[i].cached_tokens, want[i]);
                    hits += (uint64_t)want[i];
                    queried += (uint64_t)q[i].len;
                }
                assert_int_equal(st.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens, hits);
                assert_int_equal(st.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens,
                                 queried + (uint64_t)together); /* + the hold request's one token */
            }
    rp_engine_destroy(ref_engine);
    rp_engine_destroy(cached[0]);
    rp_engine_destroy(cached[1]);
}

/* The cache off: nothing is cached, nothing counted. */
static void test_cache_off(void **state) {
    (void)state;
    req q[NUM_SHARED];
    result got[NUM_SHARED];
    shared_requests(q, 2 * PS + 1, 5);
    q[4].len = 3;
    rp_engine_stats st = run((engine_setup){.cache = 0}, q, NUM_SHARED, 0, got);
    for (int i = 0; i < NUM_SHARED; i++) assert_int_equal(got[i].cached_tokens, 0);
    assert_int_equal(st.prefix_cache_hit_tokens, 0);
    assert_int_equal(st.prefix_cache_queried_tokens, 0);
    assert_int_equal(st.kv_pages_cached, 0);
}

/* Groups sharing prefixes, more than the pool holds. 24 requests, 4 groups
 * of 6 with prefixes of 20 to 50 tokens: one after another through a pool
 * of 10 pages (the cache evicts, least recently used first), and together
 * through pools of 10 and 6 pages (eviction, then preemption, with
 * admission on the first chunk alone; with room kept for their outputs,
 * the default, no preemption). Where preemption is the point the chunk is
 * 32 tokens, so that most prompts fit in one and prefill side by side
 * (prompts of several chunks go one at a time: scheduler.h). */
enum { NUM_GROUPED = 24 };

static void grouped_requests(req *q) {
    int32_t prefix[4][64];
    for (int g = 0; g < 4; g++) fill(prefix[g], 50, 900 + (uint64_t)g);
    for (int i = 0; i < NUM_GROUPED; i++) {
        int g = i % 4, L = 20 + 10 * g;
        q[i] = (req){.len = L + 1 + i % 5, .max_tokens = 2 + i % 4, .seed = 50 + (uint64_t)i, .sampled = i % 3 == 0};
        memcpy(q[i].prompt, prefix[g], (size_t)L * sizeof *q[i].prompt);
        fill(q[i].prompt + L, 1 + i % 5, 70 + (uint64_t)i % 7); /* some suffixes repeat: whole prompts hit */
    }
}

static void test_small_pool(void **state) {
    (void)state;
    static req q[NUM_GROUPED];
    static result ref[NUM_GROUPED], got[NUM_GROUPED];
    grouped_requests(q);
    run((engine_setup){.cache = 0}, q, NUM_GROUPED, 0, ref);
    struct {
        const char *what;
        engine_setup s;
        int together, preempts;
    } cases[] = {
        {"one by one, 10 pages", {.cache = 1, .num_pages = 10, .chunk = 8}, 0, 0},
        {"together, 10 pages", {.cache = 1, .num_pages = 10, .chunk = 32, .no_reserve = 1}, 1, 1},
        {"together, 6 pages", {.cache = 1, .num_pages = 6, .chunk = 32, .no_reserve = 1}, 1, 1},
        {"together, 6 pages, no overlap", {.cache = 1, .num_pages = 6, .chunk = 32, .no_overlap = 1, .no_reserve = 1},
         1, 1},
        {"together, 6 pages, cache off", {.cache = 0, .num_pages = 6, .chunk = 32, .no_reserve = 1}, 1, 1},
        {"together, 6 pages, room reserved", {.cache = 1, .num_pages = 6, .chunk = 8}, 1, 0},
        {"together, 6 pages, room reserved, cache off", {.cache = 0, .num_pages = 6, .chunk = 8}, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        rp_engine_stats st = run(cases[c].s, q, NUM_GROUPED, cases[c].together, got);
        expect_same(ref, got, NUM_GROUPED, cases[c].what);
        if (cases[c].preempts) assert_true(st.preemptions > 0);
        else assert_int_equal(st.preemptions, 0);
        if (cases[c].s.cache) {
            assert_true(st.prefix_cache_hit_tokens > 0);
            assert_true(st.kv_pages_cached > 0 && st.kv_pages_cached <= cases[c].s.num_pages);
        }
        print_message("  %s: %llu of %llu tokens cached, %llu preemptions, %d pages cached at the end\n",
                      cases[c].what, (unsigned long long)st.prefix_cache_hit_tokens,
                      (unsigned long long)st.prefix_cache_queried_tokens, (unsigned long long)st.preemptions,
                      st.kv_pages_cached);
    }
}

/* n choices of one prompt (the server submits n requests with seeds seed,
 * seed + 1, ...): one prefill, the others find its prompt cached, greedy
 * and sampled. */
static void test_n_choices(void **state) {
    (void)state;
    enum { N = 4 };
    for (int sampled = 0; sampled < 2; sampled++) {
        req q[N];
        result ref[N], got[N];
        for (int i = 0; i < N; i++) {
            q[i] = (req){.len = 3 * PS + 5, .max_tokens = 8, .seed = 11 + (uint64_t)i, .sampled = sampled};
            fill(q[i].prompt, q[i].len, 3);
        }
        run((engine_setup){.cache = 0}, q, N, 1, ref);
        rp_engine_stats st = run((engine_setup){.cache = 1, .chunk = 16}, q, N, 1, got);
        expect_same(ref, got, N, sampled ? "n choices, sampled" : "n choices, greedy");
        assert_int_equal(got[0].cached_tokens, 0);
        for (int i = 1; i < N; i++) assert_int_equal(got[i].cached_tokens, 3 * PS);
        assert_int_equal(st.prefix_cache_hit_tokens, (N - 1) * 3 * PS);
    }
}

/* ---- an abort in the middle of a chunked prefill ---- */

typedef struct abort_ctx {
    rp_engine *e;
    rp_request_id target;
    int rc;
} abort_ctx;

static void act_abort(result *r) {
    abort_ctx *a = r->act_ctx;
    a->rc = rp_engine_abort(a->e, a->target);
}

/* A 150-token prompt fed 16 tokens a step beside a decoding request, which
 * aborts it at its own 4th token: some full pages are computed, the last
 * chunk maybe not. The same prompt afterwards finds only complete pages
 * cached (a whole number of them, fewer than the prompt's) and makes the
 * tokens it makes with the cache off. */
static void test_abort_mid_prefill(void **state) {
    (void)state;
    req q[2];
    q[0] = (req){.len = 150, .max_tokens = 6, .seed = 1};
    fill(q[0].prompt, q[0].len, 77);
    q[1] = (req){.len = 5, .max_tokens = 10, .seed = 1};
    fill(q[1].prompt, q[1].len, 78);
    result ref[2];
    run((engine_setup){.cache = 0}, q, 2, 0, ref);
    for (int no_overlap = 0; no_overlap < 2; no_overlap++) {
        rp_engine *e = make_engine((engine_setup){.cache = 1, .chunk = 16, .step_tokens = 17, .no_overlap = no_overlap});
        result got[3];
        memset(got, 0, sizeof got);
        abort_ctx a = {.e = e};
        got[1].act_at = 4;
        got[1].act = act_abort;
        got[1].act_ctx = &a;
        hold h;
        hold_engine(e, &h);
        submit(e, &q[1], &got[1], NULL);
        submit(e, &q[0], &got[0], &a.target);
        release_engine(&h);
        rp_engine_wait_idle(e);
        assert_int_equal(a.rc, 0);
        assert_int_equal(got[0].finish, RP_FINISH_REASON_ABORT);
        assert_int_equal(got[0].n, 0);
        rp_engine_stats st = expect_at_rest(e, 1);
        assert_true(st.kv_pages_cached > 0);
        submit(e, &q[0], &got[2], NULL);
        rp_engine_wait_idle(e);
        expect_same(&ref[0], &got[2], 1, "the prompt after its abort");
        assert_true(got[2].cached_tokens > 0 && got[2].cached_tokens < 144 && got[2].cached_tokens % PS == 0);
        expect_at_rest(e, 1);
        rp_engine_destroy(e);
    }
}

/* ---- random arrivals and aborts ---- */

enum { FUZZ_REQS = 200 };

typedef struct fuzz {
    req q[FUZZ_REQS];
    result ref[FUZZ_REQS], got[FUZZ_REQS];
    rp_request_id ids[FUZZ_REQS];
    int aborted[FUZZ_REQS];
} fuzz;

static uint32_t rnd(uint64_t *s, uint32_t n) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)((*s * 0x2545f4914f6cdd1dull) >> 33) % n;
}

/* 200 requests from 5 prefixes (cut at random lengths, 0 to 70 tokens) with
 * random suffixes and outputs, submitted in random bursts while the engine
 * runs, a tenth of them aborted wherever they are, through a pool of 12
 * pages: admitted on their first chunk alone (eviction and preemption all
 * along), then with room kept for their outputs (eviction, and never a
 * preemption: they ignore EOS, so the reservation is exact, shared cached
 * pages included). Every request that is not aborted makes the tokens it
 * makes alone with the cache off; an aborted one, a prefix of them. */
static void test_random_arrivals(void **state) {
    (void)state;
    fuzz *f = calloc(1, sizeof *f);
    assert_non_null(f);
    uint64_t seed = 20261201;
    int32_t prefixes[5][70];
    for (int k = 0; k < 5; k++) fill(prefixes[k], 70, 300 + (uint64_t)k);
    for (int i = 0; i < FUZZ_REQS; i++) {
        req *q = &f->q[i];
        int k = (int)rnd(&seed, 5), L = (int)rnd(&seed, 71), suffix = (int)rnd(&seed, 12);
        if (L + suffix == 0) suffix = 1;
        memcpy(q->prompt, prefixes[k], (size_t)L * sizeof *q->prompt);
        for (int t = 0; t < suffix; t++) q->prompt[L + t] = 2 + (int32_t)rnd(&seed, 4); /* suffixes collide */
        q->len = L + suffix;
        q->max_tokens = 1 + (int)rnd(&seed, 6);
        q->seed = (uint64_t)i;
        q->sampled = rnd(&seed, 4) == 0;
    }
    /* the reference: the cache off, all at once, a pool that holds them */
    rp_engine *e = make_engine((engine_setup){.cache = 0, .max_running = 32});
    for (int i = 0; i < FUZZ_REQS; i++) submit(e, &f->q[i], &f->ref[i], NULL);
    expect_at_rest(e, 0);
    rp_engine_destroy(e);
    const uint64_t bursts_seed = seed;
    for (int reserve = 0; reserve < 2; reserve++) {
        seed = bursts_seed; /* the same bursts and aborts */
        memset(f->got, 0, sizeof f->got);
        memset(f->aborted, 0, sizeof f->aborted);
        e = make_engine((engine_setup){.cache = 1, .num_pages = 12, .chunk = 8, .step_tokens = 24, .max_running = 8,
                                       .no_reserve = !reserve});
        for (int i = 0; i < FUZZ_REQS;) {
            int burst = 1 + (int)rnd(&seed, 12);
            for (int b = 0; b < burst && i < FUZZ_REQS; b++, i++) submit(e, &f->q[i], &f->got[i], &f->ids[i]);
            int aborts = (int)rnd(&seed, 3);
            for (int a = 0; a < aborts; a++) {
                int victim = i - 1 - (int)rnd(&seed, (uint32_t)(i < 16 ? i : 16));
                f->aborted[victim] |= rp_engine_abort(e, f->ids[victim]) == 0;
            }
            if (rnd(&seed, 4) == 0) usleep(rnd(&seed, 3000));
            if (rnd(&seed, 10) == 0) rp_engine_wait_idle(e);
        }
        rp_engine_stats st = expect_at_rest(e, 1);
        rp_engine_destroy(e);
        int num_aborted = 0;
        for (int i = 0; i < FUZZ_REQS; i++) {
            const result *g = &f->got[i], *r = &f->ref[i];
            if (g->finals != 1) fail_msg("request %d had %d final events", i, g->finals);
            int aborted = g->finish == RP_FINISH_REASON_ABORT;
            if (aborted && !f->aborted[i]) fail_msg("request %d ended aborted, never aborted", i);
            num_aborted += aborted;
            if (!aborted && g->n != r->n) fail_msg("request %d made %d tokens, %d without the cache", i, g->n, r->n);
            for (int t = 0; t < g->n; t++)
                if (g->tokens[t] != r->tokens[t] || g->logprobs[t] != r->logprobs[t])
                    fail_msg("request %d token %d is %d, %d without the cache", i, t, g->tokens[t], r->tokens[t]);
        }
        print_message("  %s: %d aborted; %llu of %llu tokens cached, %llu preemptions, %llu steps\n",
                      reserve ? "room reserved" : "first chunk alone", num_aborted,
                      (unsigned long long)st.prefix_cache_hit_tokens,
                      (unsigned long long)st.prefix_cache_queried_tokens, (unsigned long long)st.preemptions,
                      (unsigned long long)st.steps);
        assert_true(st.prefix_cache_hit_tokens > 0);
        if (reserve) assert_int_equal(st.preemptions, 0); /* ignore_eos: the reservation is exact */
    }
    free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_boundaries), cmocka_unit_test(test_cache_off),
        cmocka_unit_test(test_small_pool),      cmocka_unit_test(test_n_choices),
        cmocka_unit_test(test_abort_mid_prefill), cmocka_unit_test(test_random_arrivals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
