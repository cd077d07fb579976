/* The engine API on the CPU backend: continuous batching gives every request
 * the tokens it gets alone, whatever runs beside it, with chunked prefill on
 * and off, requests arriving mid-run, and preemption under a tiny KV pool
 * (the newest request is the one preempted, its output unchanged; with room
 * kept for outputs, the default, none at all); the running set's default
 * size from the pool; bad
 * requests are rejected at submit; aborts at any stage free their pages;
 * stop strings cut the text; token events carry top logprobs on both
 * sampling paths; a long prompt's chunked prefill lets a newcomer in, shows
 * in the stats and stops at the next chunk on abort and destroy; the pool is
 * full again after every test.
 *
 * Nothing here depends on timing: where requests must arrive together the
 * engine thread is held in a callback (hold_engine), where they must arrive
 * mid-run or be aborted mid-run a callback of a running request does it, and
 * steps are counted by the tokens of a request decoding beside them. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "engine/runner.h"
#include "replay/engine.h"
#include "test_util.h"
#include "engine_hold.h"

#define NREQ 64
#define MAXOUT 24

typedef struct result {
    int32_t tokens[256];
    int n;
    rp_finish finish;
    char text[4096];
    size_t text_len;
    int events, finals; /* finals: events with a finish reason (exactly one) */
    int preemptions;    /* as the final event says */
    /* run on the engine thread (outside mu) when the request's act_at-th
     * token arrives and it goes on: aborts, submits */
    int act_at;
    void (*act)(struct result *r, const rp_token_event *ev);
    void *act_ctx;
    int act_rc; /* what the action's engine call returned */
    /* a request decoding beside this one, one token a step: its token
     * count when this one's first and final events arrived */
    const struct result *clock;
    int clock_at_first, clock_at_final;
} result;


static void collect(void *user, const rp_token_event *ev) {
    result *r = user;
    pthread_mutex_lock(&mu);
    if (ev->token >= 0 && r->n < 256) r->tokens[r->n++] = ev->token;
    if (ev->text_len && r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    r->events++;
    if (r->clock && r->events == 1) r->clock_at_first = r->clock->n;
    if (ev->finish != RP_FINISH_REASON_NONE) {
        r->finish = ev->finish;
        r->finals++;
        r->preemptions = ev->preemptions;
        if (r->clock) r->clock_at_final = r->clock->n;
    }
    int act = r->act && ev->finish == RP_FINISH_REASON_NONE && r->n == r->act_at;
    pthread_mutex_unlock(&mu);
    if (act) r->act(r, ev);
}

/* Holding the engine thread without timing: a one-token request whose final
 * callback blocks until release_engine(). Requests submitted (or aborted)
 * meanwhile reach the scheduler together when it is released. */

/* The action that aborts a request: *target, or the request itself. */
typedef struct abort_ctx {
    rp_engine *e;
    const rp_request_id *target;
} abort_ctx;

static void act_abort(result *r, const rp_token_event *ev) {
    const abort_ctx *a = r->act_ctx;
    r->act_rc = rp_engine_abort(a->e, a->target ? *a->target : ev->id);
}

static void expect_final_once(const result *r, rp_finish finish, int tokens, const char *what, int i) {
    if (r->finals != 1 || r->finish != finish || r->n != tokens)
        fail_msg("%s %d: %d final events, finish %d, %d tokens; expected 1, %d, %d", what, i, r->finals, r->finish,
                 r->n, finish, tokens);
}

static int g_no_overlap; /* set by a test to compare with the synchronous loop */
/* set by a test that needs preemption under a small pool: admission on the
 * first chunk alone, as before the engine kept room for decode growth */
static int g_no_reserve;
static int g_step_tokens; /* set by a test: every step feeds at most this many tokens, not sized by time */
static int g_spec_k;      /* set by a test: n-gram speculative decoding, this many drafts a round */
/* with g_spec_k: drafts from a draft model instead, the target itself (1)
 * or its config with random weights (2) */
static int g_spec_draft;

static rp_engine *make_engine(const char *model, int num_pages, int chunk, int max_running) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", test_source_dir(), model);
    c.model_dir = dir;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = num_pages;
    c.page_size = 16;
    c.chunked_prefill_size = chunk;
    c.max_batched_tokens = g_step_tokens ? g_step_tokens : 512;
    if (g_step_tokens) c.step_ms_target = -1;
    c.max_running_requests = max_running;
    c.disable_overlap = g_no_overlap;
    c.disable_decode_reservation = g_no_reserve;
    if (g_spec_k) {
        c.speculative_method = RP_SPEC_NGRAM;
        c.num_speculative_tokens = g_spec_k;
        c.prompt_lookup_min = 1; /* short matches: drafts in most rounds, most of them wrong */
        c.prompt_lookup_max = 3;
        if (g_spec_draft) {
            c.speculative_method = RP_SPEC_DRAFT_MODEL;
            c.prompt_lookup_min = c.prompt_lookup_max = 0;
            c.speculative_model = dir;
            c.speculative_load_dummy = g_spec_draft == 2;
        }
    }
    c.debug_check_every_step = 1; /* the page accounting, prefix cache included, after every step */
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

static void expect_pool_full(rp_engine *e) {
    rp_engine_stats st;
    rp_engine_wait_idle(e);
    rp_engine_get_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.kv_pages_free, st.kv_pages_total);
    /* every launched step completed and was counted under one kind */
    uint64_t steps = 0;
    for (int k = 0; k < RP_STEP_KINDS; k++) steps += st.kinds[k].steps;
    assert_int_equal(steps, st.steps);
    assert_int_equal(st.kinds[RP_STEP_DECODE].prompt_tokens, 0);
    assert_true(st.kinds[RP_STEP_DECODE].tokens >= st.kinds[RP_STEP_DECODE].steps);
    assert_int_equal(st.kinds[RP_STEP_PREFILL].prompt_tokens, st.kinds[RP_STEP_PREFILL].tokens);
    const rp_step_kind_stats *mixed = &st.kinds[RP_STEP_MIXED];
    assert_true(mixed->prompt_tokens + mixed->steps <= mixed->tokens); /* at least a decode each */
    assert_true(mixed->prompt_tokens >= mixed->steps);
}

/* Request i: a prompt of 3 + (i * 7) % 60 tokens, greedy unless seeded. */
static void params_for(int i, rp_request_params *p, int32_t *prompt, int sampled) {
    rp_request_params_default(p);
    int len = 3 + (i * 7) % 60;
    for (int k = 0; k < len; k++) prompt[k] = (int32_t)((i * 131 + k * 29 + 7) % 500);
    p->prompt_ids = prompt;
    p->num_prompt_ids = len;
    p->max_tokens = MAXOUT - (i % 5);
    p->ignore_eos = 1;
    p->temperature = sampled ? 0.9f : 0.0f;
    p->top_p = sampled ? 0.9f : 1.0f;
    p->seed = 1000 + (uint64_t)i;
    p->has_seed = 1;
}

/* A rejected submit says what went wrong as data: the code, the parameter
 * at fault and a message that names the problem. */
static void expect_error(const rp_error *err, rp_error_code code, const char *param, const char *words) {
    if (err->code != code || strcmp(err->param, param) != 0 || !strstr(err->message, words))
        fail_msg("expected %s on '%s' saying '%s'; got %s on '%s': %s", rp_error_code_name(code), param, words,
                 rp_error_code_name(err->code), err->param, err->message);
}

static void submit_or_fail(rp_engine *e, const rp_request_params *p, result *r) {
    rp_error err;
    if (rp_engine_submit(e, p, collect, r, NULL, &err)) fail_msg("submit: %s", err.message);
}

static void plp_collect(void *user, const rp_token_event *ev);
typedef struct plp_result plp_result;
static void submit_or_fail_cb(rp_engine *e, const rp_request_params *p, plp_result *r) {
    rp_error err;
    if (rp_engine_submit(e, p, plp_collect, r, NULL, &err)) fail_msg("submit: %s", err.message);
}

/* Requests which[k] (k when which is NULL), each alone, one at a time: the
 * reference, in ref[k]. */
static void run_alone(result *ref, const int *which, int n, int sampled) {
    g_no_overlap = 1; /* the reference: one request at a time, synchronous */
    rp_engine *e = make_engine("qwen3-tied", 0, 0, 4);
    g_no_overlap = 0;
    int32_t prompt[64];
    for (int k = 0; k < n; k++) {
        rp_request_params p;
        params_for(which ? which[k] : k, &p, prompt, sampled);
        submit_or_fail(e, &p, &ref[k]);
        rp_engine_wait_idle(e);
    }
    expect_pool_full(e);
    rp_engine_destroy(e);
}

static void compare(const result *ref, const result *got, const int *which, int n, const char *what) {
    for (int k = 0; k < n; k++) {
        int i = which ? which[k] : k;
        if (got[k].n != ref[k].n) fail_msg("%s: request %d made %d tokens, alone %d", what, i, got[k].n, ref[k].n);
        for (int t = 0; t < ref[k].n; t++)
            if (got[k].tokens[t] != ref[k].tokens[t])
                fail_msg("%s: request %d token %d is %d, alone %d", what, i, t, got[k].tokens[t], ref[k].tokens[t]);
        expect_final_once(&got[k], RP_FINISH_REASON_LENGTH, ref[k].n, what, i);
    }
}

/* The requests of one run_together setup. Staggered, the last of each group
 * of 8 submits the next group from its callback when its first token
 * arrives: those arrive while it (and others) run, whatever the timing. */
typedef struct run_ctx {
    rp_engine *e;
    result *got;
    int32_t (*prompt)[64];
    int sampled, staggered, failed;
} run_ctx;

static void act_submit_next_group(result *r, const rp_token_event *ev);

static void submit_group(run_ctx *c, int first) {
    int end = c->staggered && first + 8 < NREQ ? first + 8 : NREQ;
    for (int i = first; i < end; i++) {
        rp_request_params p;
        params_for(i, &p, c->prompt[i], c->sampled);
        if (i == end - 1 && end < NREQ) {
            c->got[i].act_at = 1;
            c->got[i].act = act_submit_next_group;
            c->got[i].act_ctx = c;
        }
        rp_error err;
        if (rp_engine_submit(c->e, &p, collect, &c->got[i], NULL, &err)) c->failed = 1; /* maybe on the engine thread */
    }
}

static void act_submit_next_group(result *r, const rp_token_event *ev) {
    (void)ev;
    run_ctx *c = r->act_ctx;
    submit_group(c, (int)(r - c->got) + 1);
}

static void run_together(int sampled) {
    static result ref[NREQ], got[NREQ];
    memset(ref, 0, sizeof ref);
    run_alone(ref, NULL, NREQ, sampled);
    static int32_t prompt[NREQ][64];
    struct {
        const char *name;
        int pages, chunk, running, staggered, no_overlap, no_reserve, spec_k, draft;
    } setups[] = {
        {"64 at once, chunked prefill 7", 0, 7, 64, 0, 0, 0, 0, 0},
        {"64 at once, no chunking", 0, 0, 64, 0, 0, 0, 0, 0},
        {"arriving while others run", 0, 16, 64, 1, 0, 0, 0, 0},
        {"tiny pool: preemption", 12, 16, 64, 0, 0, 1, 0, 0},
        {"tiny pool: preemption, no overlap", 12, 16, 64, 0, 1, 1, 0, 0},
        {"tiny pool: room reserved, no preemption", 12, 16, 64, 0, 0, 0, 0, 0},
        {"8 running at most", 0, 32, 8, 0, 0, 0, 0, 0},
        {"no overlap", 0, 16, 64, 0, 1, 0, 0, 0},
        /* speculative decoding: the same tokens, drafts kept or not */
        {"speculative k 4, 8 running", 0, 16, 8, 0, 0, 0, 4, 0},
        {"speculative k 1, arriving while others run", 0, 7, 64, 1, 0, 0, 1, 0},
        {"speculative k 8, tiny pool: preemption", 12, 16, 64, 0, 0, 1, 8, 0},
        /* a draft model: the target itself (greedy: every draft kept), and random weights (few kept) */
        {"draft model (itself) k 4, 8 running", 0, 16, 8, 0, 0, 0, 4, 1},
        {"draft model (itself) k 3, arriving while others run", 0, 7, 64, 1, 0, 0, 3, 1},
        {"draft model (random) k 2, tiny pool: preemption", 12, 16, 64, 0, 0, 1, 2, 2},
    };
    for (size_t s = 0; s < sizeof setups / sizeof setups[0]; s++) {
        memset(got, 0, sizeof got);
        g_no_overlap = setups[s].no_overlap;
        g_no_reserve = setups[s].no_reserve;
        g_spec_k = setups[s].spec_k;
        g_spec_draft = setups[s].draft;
        rp_engine *e = make_engine("qwen3-tied", setups[s].pages, setups[s].chunk, setups[s].running);
        g_no_reserve = 0;
        g_spec_k = 0;
        g_spec_draft = 0;
        run_ctx c = {.e = e, .got = got, .prompt = prompt, .sampled = sampled, .staggered = setups[s].staggered};
        hold h;
        if (!c.staggered) hold_engine(e, &h); /* all 64 reach the scheduler at once */
        submit_group(&c, 0);
        if (!c.staggered) release_engine(&h);
        rp_engine_wait_idle(e);
        assert_int_equal(c.failed, 0);
        compare(ref, got, NULL, NREQ, setups[s].name);
        rp_engine_stats st;
        rp_engine_get_stats(e, &st);
        uint64_t preempted = 0;
        for (int i = 0; i < NREQ; i++) preempted += (uint64_t)got[i].preemptions;
        assert_int_equal(preempted, st.preemptions); /* each preemption is some request's */
        if (setups[s].no_reserve) {
            assert_true(st.preemptions > 0); /* the pool really was too small */
            assert_int_equal(got[0].preemptions, 0); /* the oldest is never the newest */
        } else {
            assert_int_equal(st.preemptions, 0);
        }
        /* 64 at once run together, unless the tiny pool keeps room for outputs */
        if (setups[s].running == 64 && !setups[s].staggered && (!setups[s].pages || setups[s].no_reserve))
            assert_true(st.peak_running > 8);
        if (setups[s].spec_k) { /* rounds ran, and kept drafts: both paths of a round were taken */
            printf("  %s, %s: %llu rounds, %llu of %llu drafts kept\n", setups[s].name, sampled ? "seeded" : "greedy",
                   (unsigned long long)st.spec_rounds, (unsigned long long)st.spec_accepted_tokens,
                   (unsigned long long)st.spec_draft_tokens);
            assert_true(st.spec_rounds > 0);
            if (setups[s].draft == 1 && !sampled) /* the target drafting for itself: its own argmax */
                assert_int_equal(st.spec_accepted_tokens, st.spec_draft_tokens);
            else if (setups[s].draft != 2)
                assert_true(st.spec_accepted_tokens > 0 && st.spec_accepted_tokens < st.spec_draft_tokens);
            assert_true(!setups[s].draft || st.spec_draft_forwards > 0);
        } else {
            assert_int_equal(st.spec_rounds, 0);
        }
        expect_pool_full(e);
        rp_engine_destroy(e);
    }
    g_no_overlap = 0;
}

static void test_batched_equals_alone_greedy(void **state) {
    (void)state;
    run_together(0);
}

static void test_batched_equals_alone_seeded(void **state) {
    (void)state;
    run_together(1);
}

/* Preemption pinned down: requests 11 and 2 (prompts of 20 and 17 tokens,
 * 23 and 22 output tokens: 3 pages of 16 at the end) arrive together at a
 * 4-page pool. Admitted on their first chunk alone they take 2 pages each;
 * when the older needs its third page the newer is preempted: once, since
 * it comes back only after the older has finished, to a pool that holds it
 * whole. With room kept for their outputs (the default; they ignore EOS, so
 * count all 3 pages) the newer waits for the older instead, and nothing is
 * preempted. Both make exactly the tokens they make alone, greedy and
 * seeded, either way. */
static void test_preemption_takes_newest(void **state) {
    (void)state;
    static const int which[2] = {11, 2};
    for (int reserve = 0; reserve < 2; reserve++)
        for (int sampled = 0; sampled < 2; sampled++) {
            result ref[2] = {0}, got[2] = {0};
            run_alone(ref, which, 2, sampled);
            g_no_reserve = !reserve;
            rp_engine *e = make_engine("qwen3-tied", 4, 0, 4);
            g_no_reserve = 0;
            hold h;
            hold_engine(e, &h);
            int32_t prompt[2][64];
            for (int k = 0; k < 2; k++) {
                rp_request_params p;
                params_for(which[k], &p, prompt[k], sampled);
                submit_or_fail(e, &p, &got[k]);
            }
            release_engine(&h);
            rp_engine_wait_idle(e);
            compare(ref, got, which, 2, sampled ? "preemption, seeded" : "preemption, greedy");
            rp_engine_stats st;
            rp_engine_get_stats(e, &st);
            assert_int_equal(got[0].preemptions, 0);
            assert_int_equal(got[1].preemptions, !reserve);
            assert_int_equal(st.preemptions, !reserve);
            assert_int_equal(st.peak_running, reserve ? 1 : 2);
            assert_int_equal(st.kv_pages_peak_used, reserve ? 3 : 4);
            expect_pool_full(e);
            rp_engine_destroy(e);
        }
}

/* Without --max-running-requests the running set comes from the pool: its
 * tokens / 512 (the context, 2048 here, is longer), at least 16, and no
 * more than one step's tokens (a decode of every running request must fit
 * a step). As given, it stays. */
static void test_default_max_running(void **state) {
    (void)state;
    static const struct {
        int pages, step_tokens, max_running, want;
    } cases[] = {
        {1024, 0, 0, 32},  /* 16384 tokens */
        {64, 0, 0, 16},    /* 1024 tokens: the least */
        {2048, 48, 0, 48}, /* 64 by the pool, held to the step's 48 tokens */
        {1024, 0, 4, 4},   /* given */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        g_step_tokens = cases[c].step_tokens;
        rp_engine *e = make_engine("qwen3-tied", cases[c].pages, 0, cases[c].max_running);
        g_step_tokens = 0;
        rp_engine_stats st;
        rp_engine_get_stats(e, &st);
        assert_int_equal(st.max_running_requests, cases[c].want);
        rp_engine_destroy(e);
    }
}

static void test_rejections(void **state) {
    (void)state;
    rp_engine *e = make_engine("qwen3-tied", 4, 0, 4); /* 64 tokens of KV */
    rp_request_params p;
    rp_request_params_default(&p);
    int32_t big[3000];
    for (int i = 0; i < 3000; i++) big[i] = i % 400;
    rp_error err;
    result r = {0};
    p.prompt_ids = big;
    p.num_prompt_ids = 2500; /* over the model's context of 2048 */
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_CONTEXT_LENGTH, "prompt", "context");
    p.num_prompt_ids = 100; /* fits the model's context, not the 64-token pool */
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_CONTEXT_LENGTH, "prompt", "limited by the KV cache");
    p.num_prompt_ids = 10;
    big[3] = 100000;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "prompt", "vocabulary");
    big[3] = 3;
    p.temperature = -1;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "temperature", "temperature");
    p.temperature = 1;
    p.max_tokens = 0;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "max_tokens", "max_tokens");
    p.max_tokens = 4;
    p.prompt = "text";
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1); /* both forms */
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "prompt", "exactly one");
    p.prompt_ids = NULL;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1); /* no tokenizer */
    expect_error(&err, RP_ERROR_UNSUPPORTED, "prompt", "tokenizer");
    assert_int_equal(rp_engine_abort(e, 424242), -1);
    /* max_tokens past the context is rejected, as vLLM's server does */
    p.prompt = NULL;
    p.prompt_ids = big;
    p.num_prompt_ids = 50;
    p.max_tokens = 100;
    p.ignore_eos = 1;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1); /* 150 > 64 */
    expect_error(&err, RP_ERROR_CONTEXT_LENGTH, "max_tokens", "context");
    static const int32_t bad_stop[1] = {-5};
    p.stop_ids = bad_stop;
    p.num_stop_ids = 1;
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "stop_token_ids", "vocabulary");
    p.stop_ids = NULL;
    p.num_stop_ids = 0;
    p.max_tokens = 14; /* exactly fills the context */
    submit_or_fail(e, &p, &r);
    rp_engine_wait_idle(e);
    assert_int_equal(r.finish, RP_FINISH_REASON_LENGTH);
    assert_int_equal(r.n, 14);
    expect_pool_full(e);
    rp_engine_destroy(e);
}

/* Top logprobs on every token event, on the backend's sampling path and on
 * the engine's host sampler path (penalties): n alternatives, descending,
 * the sampled token's entry equal to its logprob (greedy: the first one);
 * with top_k = 2 only two can be drawn, the rest are -inf. */
typedef struct top_result {
    int tokens, bad, n_min, n_max;
    char why[256];
} top_result;
static int g_top_k; /* the request's top_k, for top_check */

static void top_check(void *user, const rp_token_event *ev) {
    top_result *t = user;
    if (ev->token < 0) return;
    pthread_mutex_lock(&mu);
    t->tokens++;
    int n = ev->num_top_logprobs, found = 0;
    if (t->tokens == 1 || n < t->n_min) t->n_min = n;
    if (t->tokens == 1 || n > t->n_max) t->n_max = n;
    for (int j = 0; j < n; j++) {
        if (j && !(ev->top_logprobs[j] <= ev->top_logprobs[j - 1])) snprintf(t->why, sizeof t->why, "not sorted");
        if (g_top_k && j >= g_top_k && ev->top_logprobs[j] != -INFINITY)
            snprintf(t->why, sizeof t->why, "entry %d past top_k is %g", j, ev->top_logprobs[j]);
        if (ev->top_ids[j] == ev->token) found = ev->top_logprobs[j] == ev->logprob;
    }
    if (n && !found) snprintf(t->why, sizeof t->why, "token %d (logprob %g) not in its list", ev->token, ev->logprob);
    if (t->why[0]) t->bad++;
    pthread_mutex_unlock(&mu);
}

static void test_top_logprobs(void **state) {
    (void)state;
    rp_engine *e = make_engine("qwen3-tied", 0, 0, 4);
    int32_t prompt[8] = {5, 17, 99, 3, 250, 7, 42, 11};
    struct {
        float temperature, repetition_penalty;
        int top_k, top_logprobs;
    } cfg[] = {{0.0f, 1.0f, 0, 5}, {0.0f, 1.3f, 0, 20}, {0.9f, 1.0f, 2, 4}, {0.9f, 1.2f, 2, 4}, {0.0f, 1.0f, 0, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        rp_request_params p;
        rp_request_params_default(&p);
        p.prompt_ids = prompt;
        p.num_prompt_ids = 8;
        p.max_tokens = 6;
        p.ignore_eos = 1;
        p.logprobs = 1;
        p.temperature = cfg[c].temperature;
        p.repetition_penalty = cfg[c].repetition_penalty;
        p.top_k = cfg[c].top_k;
        p.top_logprobs = cfg[c].top_logprobs;
        p.seed = 7;
        p.has_seed = 1;
        g_top_k = cfg[c].top_k;
        top_result t = {0};
        rp_error err;
        if (rp_engine_submit(e, &p, top_check, &t, NULL, &err)) fail_msg("submit: %s", err.message);
        rp_engine_wait_idle(e);
        if (t.bad) fail_msg("config %zu: %s", c, t.why);
        assert_int_equal(t.tokens, 6);
        assert_int_equal(t.n_min, cfg[c].top_logprobs);
        assert_int_equal(t.n_max, cfg[c].top_logprobs);
    }
    g_top_k = 0;
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt_ids = prompt;
    p.num_prompt_ids = 8;
    p.top_logprobs = RP_MAX_TOP_LOGPROBS + 1;
    rp_error err;
    result r = {0};
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "top_logprobs", "top_logprobs");
    expect_pool_full(e);
    rp_engine_destroy(e);
}


/* ---- min_tokens, logit_bias, prompt logprobs ---------------------------- */

/* Runs one request alone on e and returns what it made. */
static result run_one(rp_engine *e, const rp_request_params *p) {
    result r;
    memset(&r, 0, sizeof r);
    submit_or_fail(e, p, &r);
    rp_engine_wait_idle(e);
    return r;
}

static void bias_params(rp_request_params *p, int32_t *prompt, int sampled) {
    rp_request_params_default(p);
    for (int k = 0; k < 8; k++) prompt[k] = (int32_t)(11 + k * 37);
    p->prompt_ids = prompt;
    p->num_prompt_ids = 8;
    p->max_tokens = 6;
    p->ignore_eos = 1;
    p->temperature = sampled ? 0.9f : 0.0f;
    p->seed = 3;
    p->has_seed = 1;
}

/* logit_bias: +100 makes a token certain (greedy and sampled), -100 bans
 * the greedy one; the bias is a request's alone (a batch-mate unchanged). */
static void test_logit_bias(void **state) {
    (void)state;
    rp_engine *e = make_engine("qwen3-tied", 0, 0, 4);
    int32_t prompt[8];
    rp_request_params p;
    bias_params(&p, prompt, 0);
    result ref = run_one(e, &p);
    assert_int_equal(ref.n, 6);
    const int32_t forced_id[1] = {77}, banned_id[1] = {ref.tokens[0]};
    const float plus[1] = {100.0f}, minus[1] = {-100.0f};
    for (int sampled = 0; sampled < 2; sampled++) {
        bias_params(&p, prompt, sampled);
        p.logit_bias_ids = forced_id;
        p.logit_bias = plus;
        p.num_logit_bias = 1;
        result r = run_one(e, &p);
        assert_int_equal(r.n, 6);
        for (int i = 0; i < r.n; i++) assert_int_equal(r.tokens[i], 77);
    }
    bias_params(&p, prompt, 0);
    p.logit_bias_ids = banned_id;
    p.logit_bias = minus;
    p.num_logit_bias = 1;
    result r = run_one(e, &p);
    for (int i = 0; i < r.n; i++) assert_int_not_equal(r.tokens[i], banned_id[0]);
    /* beside a biased request, an unbiased one makes its tokens (one step samples both paths) */
    result a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    rp_request_params q;
    int32_t prompt_q[8];
    bias_params(&q, prompt_q, 0);
    bias_params(&p, prompt, 0);
    p.logit_bias_ids = forced_id;
    p.logit_bias = plus;
    p.num_logit_bias = 1;
    hold h;
    hold_engine(e, &h);
    submit_or_fail(e, &p, &a);
    submit_or_fail(e, &q, &b);
    release_engine(&h);
    rp_engine_wait_idle(e);
    for (int i = 0; i < 6; i++) assert_int_equal(a.tokens[i], 77);
    assert_int_equal(b.n, ref.n);
    for (int i = 0; i < ref.n; i++) assert_int_equal(b.tokens[i], ref.tokens[i]);
    /* refusals name logit_bias */
    int32_t ids[RP_MAX_LOGIT_BIAS + 1];
    float vals[RP_MAX_LOGIT_BIAS + 1];
    for (int i = 0; i <= RP_MAX_LOGIT_BIAS; i++) ids[i] = i % 500, vals[i] = 1.0f;
    p.logit_bias_ids = ids;
    p.logit_bias = vals;
    rp_error err;
    struct {
        int n;
        int32_t id;
        float v;
        const char *words;
    } bad[] = {{1, 503, 1.0f, "vocabulary"}, {1, -1, 1.0f, "vocabulary"}, {1, 4, 100.5f, "[-100, 100]"},
               {1, 4, NAN, "[-100, 100]"}, {RP_MAX_LOGIT_BIAS + 1, 4, 1.0f, "at most"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ids[0] = bad[i].id;
        vals[0] = bad[i].v;
        p.num_logit_bias = bad[i].n;
        assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
        expect_error(&err, RP_ERROR_INVALID_REQUEST, "logit_bias", bad[i].words);
    }
    expect_pool_full(e);
    rp_engine_destroy(e);
}

/* min_tokens: with EOS (ids 2 and 5 in generation_config.json) made certain
 * by a bias, a request ends at its first token; with min_tokens = 4 its first
 * four are anything but EOS and the fifth is EOS. Stop ids likewise; with
 * ignore_eos EOS ends nothing, so min_tokens leaves it alone. */
static void test_min_tokens(void **state) {
    (void)state;
    for (int overlap = 0; overlap < 2; overlap++) {
        g_no_overlap = !overlap;
        rp_engine *e = make_engine("qwen3-tied", 0, 0, 4);
        g_no_overlap = 0;
        int32_t prompt[8];
        rp_request_params p;
        const int32_t eos[1] = {2}, stop_tok[1] = {77};
        const float plus[1] = {100.0f};
        for (int sampled = 0; sampled < 2; sampled++) {
            bias_params(&p, prompt, sampled);
            p.ignore_eos = 0;
            p.max_tokens = 10;
            p.logit_bias_ids = eos;
            p.logit_bias = plus;
            p.num_logit_bias = 1;
            result r = run_one(e, &p);
            expect_final_once(&r, RP_FINISH_REASON_STOP, 1, "EOS biased", sampled);
            assert_int_equal(r.tokens[0], 2);
            p.min_tokens = 4;
            r = run_one(e, &p);
            expect_final_once(&r, RP_FINISH_REASON_STOP, 5, "min_tokens 4", sampled);
            for (int i = 0; i < 4; i++) assert_true(r.tokens[i] != 2 && r.tokens[i] != 5);
            assert_int_equal(r.tokens[4], 2);
            /* a stop id, EOS ignored */
            p.ignore_eos = 1;
            p.stop_ids = stop_tok;
            p.num_stop_ids = 1;
            p.logit_bias_ids = stop_tok;
            p.min_tokens = 3;
            r = run_one(e, &p);
            expect_final_once(&r, RP_FINISH_REASON_STOP, 4, "min_tokens 3, stop id", sampled);
            for (int i = 0; i < 3; i++) assert_int_not_equal(r.tokens[i], 77);
            assert_int_equal(r.tokens[3], 77);
            /* ignore_eos: EOS is no stop, so not masked either */
            p.stop_ids = NULL;
            p.num_stop_ids = 0;
            p.logit_bias_ids = eos;
            r = run_one(e, &p);
            expect_final_once(&r, RP_FINISH_REASON_LENGTH, 10, "min_tokens with ignore_eos", sampled);
            for (int i = 0; i < 10; i++) assert_int_equal(r.tokens[i], 2);
            /* min_tokens = max_tokens: no stop at all */
            p.ignore_eos = 0;
            p.min_tokens = 10;
            r = run_one(e, &p);
            expect_final_once(&r, RP_FINISH_REASON_LENGTH, 10, "min_tokens = max_tokens", sampled);
        }
        rp_error err;
        result r = {0};
        bias_params(&p, prompt, 0);
        p.min_tokens = 7; /* past max_tokens 6 */
        assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
        expect_error(&err, RP_ERROR_INVALID_REQUEST, "min_tokens", "max_tokens");
        p.min_tokens = -1;
        assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
        expect_error(&err, RP_ERROR_INVALID_REQUEST, "min_tokens", "min_tokens");
        expect_pool_full(e);
        rp_engine_destroy(e);
    }
}

/* What a request's events said of its prompt. */
typedef struct plp_result {
    rp_prompt_logprob *lp; /* [prompt_tokens], copied from the one event that carried them */
    int num, carried, tokens, cached, preemptions;
    int32_t out[16];
} plp_result;

static void plp_collect(void *user, const rp_token_event *ev) {
    plp_result *r = user;
    pthread_mutex_lock(&mu);
    if (ev->prompt_logprobs) {
        r->carried++;
        r->num = ev->prompt_tokens;
        r->lp = malloc((size_t)ev->prompt_tokens * sizeof *r->lp);
        memcpy(r->lp, ev->prompt_logprobs, (size_t)ev->prompt_tokens * sizeof *r->lp);
        if (r->carried == 1 && r->tokens) r->carried = 100; /* not on the first event */
    }
    if (ev->token >= 0 && r->tokens < 16) r->out[r->tokens++] = ev->token;
    if (ev->finish != RP_FINISH_REASON_NONE) r->cached = ev->cached_tokens, r->preemptions = ev->preemptions;
    pthread_mutex_unlock(&mu);
}

/* Checks r's prompt logprobs against the prompt's logits from the runner
 * (ref, [n][vocab]): log-softmax in double, vLLM's rank, the top ids. */
static void check_prompt_logprobs(const plp_result *r, const int32_t *prompt, int n, const float *ref, int vocab,
                                  int top, const char *what) {
    if (r->carried != 1 || r->num != n) fail_msg("%s: carried %d times, %d entries of %d", what, r->carried, r->num, n);
    assert_int_equal(r->lp[0].token, prompt[0]);
    assert_int_equal(r->lp[0].rank, 0);
    assert_true(isnan(r->lp[0].logprob) && r->lp[0].num_top == 0);
    for (int i = 1; i < n; i++) {
        const float *row = ref + (size_t)(i - 1) * vocab;
        double max = -INFINITY, sum = 0;
        for (int v = 0; v < vocab; v++) max = row[v] > max ? row[v] : max;
        for (int v = 0; v < vocab; v++) sum += exp((double)row[v] - max);
        const double lse = max + log(sum);
        const rp_prompt_logprob *e = &r->lp[i];
        int rank = 0;
        for (int v = 0; v < vocab; v++) rank += row[v] >= row[prompt[i]];
        if (e->token != prompt[i] || fabs(e->logprob - (row[prompt[i]] - lse)) > 1e-5 || e->rank != rank)
            fail_msg("%s: position %d: token %d logprob %g rank %d; expected %d, %g, %d", what, i, e->token,
                     e->logprob, e->rank, prompt[i], row[prompt[i]] - lse, rank);
        assert_int_equal(e->num_top, top);
        for (int j = 0; j < top; j++) {
            int above = 0; /* tokens before top j in the order (logit desc, id asc): exactly j */
            const float lj = row[e->top_ids[j]];
            for (int v = 0; v < vocab; v++) above += row[v] > lj || (row[v] == lj && v < e->top_ids[j]);
            if (above != j || fabs(e->top_logprobs[j] - (lj - lse)) > 1e-5)
                fail_msg("%s: position %d top %d: id %d has %d before it, logprob %g vs %g", what, i, j,
                         e->top_ids[j], above, e->top_logprobs[j], lj - lse);
        }
    }
}

/* Prompt logprobs equal the log-softmax of the prompt's logits as the
 * runner computes them alone: a prompt in chunks of 7, one longer than a
 * step's spare logit rows (chunks held to them), one whose prefix is in the
 * cache (computed again all the same), one beside a request sampled on the
 * device; the tokens after the prompt are those made without prompt
 * logprobs (the sampling row is the chunk's last). */
static void test_prompt_logprobs(void **state) {
    (void)state;
    enum { LONG = 300, TOP = 5 };
    static int32_t prompt[LONG];
    for (int k = 0; k < LONG; k++) prompt[k] = (int32_t)((k * 131 + 17) % 500);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/qwen3-tied", test_source_dir());
    rp_err rerr;
    rp_runner_config rc = {.model_dir = dir, .device = "cpu", .threads = 2, .page_size = 16, .num_pages = 40,
                           .max_seqs = 1, .max_context = 512, .max_batched_tokens = 64, .max_logit_rows = 64};
    rp_runner *run = rp_runner_new(&rc, &rerr);
    if (!run) fail_msg("runner: %s", rerr.msg);
    const int vocab = run->model->cfg.vocab_size;
    float *ref = malloc((size_t)LONG * vocab * sizeof *ref);
    const int32_t *prompts[1] = {prompt};
    float *logits[1] = {ref};
    int len = LONG;
    if (rp_runner_run_prompts(run, 1, prompts, &len, logits, 0, NULL, &rerr)) fail_msg("logits: %s", rerr.msg);
    rp_runner_free(run);
    struct {
        const char *what;
        int n, chunk, top, step_tokens;
    } cases[] = {{"40 tokens in chunks of 7", 40, 7, TOP, 0},
                 /* steps of 512 tokens: the chunks are held to the 4 + 128 logit rows alone */
                 {"300 tokens, rows held", LONG, 0, TOP, 512},
                 {"2 tokens, no alternatives", 2, 0, 0, 0},
                 {"1 token", 1, 0, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        g_step_tokens = cases[c].step_tokens;
        rp_engine *e = make_engine("qwen3-tied", 0, cases[c].chunk, 4);
        g_step_tokens = 0;
        rp_request_params p;
        rp_request_params_default(&p);
        p.prompt_ids = prompt;
        p.num_prompt_ids = cases[c].n;
        p.max_tokens = 4;
        p.ignore_eos = 1;
        p.temperature = 0;
        plp_result plain = {0};
        submit_or_fail_cb(e, &p, &plain); /* its prompt goes to the prefix cache */
        rp_engine_wait_idle(e);
        p.prompt_logprobs = 1;
        p.prompt_top_logprobs = cases[c].top;
        plp_result a = {0}, b = {0};
        rp_request_params q;
        int32_t other[8];
        bias_params(&q, other, 1);
        hold h;
        hold_engine(e, &h);
        submit_or_fail_cb(e, &p, &a);
        submit_or_fail_cb(e, &q, &b); /* sampled on the device beside it */
        release_engine(&h);
        rp_engine_wait_idle(e);
        check_prompt_logprobs(&a, prompt, cases[c].n, ref, vocab, cases[c].top, cases[c].what);
        assert_int_equal(a.cached, 0); /* never from the cache, which has the prompt: */
        p.prompt_logprobs = 0;
        plp_result again = {0};
        submit_or_fail_cb(e, &p, &again);
        rp_engine_wait_idle(e);
        assert_true(again.cached > 0 || cases[c].n <= 16);
        assert_int_equal(a.tokens, 4);
        for (int i = 0; i < 4; i++) assert_int_equal(a.out[i], plain.out[i]);
        assert_int_equal(b.tokens, 6);
        assert_int_equal(b.carried, 0);
        free(a.lp);
        expect_pool_full(e);
        rp_engine_destroy(e);
    }
    /* preempted mid-prompt: a pool of 12 pages, steps of 32 tokens, three
     * older requests decoding beside a 150-token prompt; the prompt's chunks
     * soon find no pages, the decodes then preempt it (the newest), and it is
     * computed again from its start once they are done */
    g_no_reserve = 1;
    g_step_tokens = 32;
    rp_engine *e = make_engine("qwen3-tied", 12, 0, 4);
    g_no_reserve = 0;
    g_step_tokens = 0;
    rp_request_params p, q;
    int32_t others[3][8];
    plp_result dec[3], a = {0};
    memset(dec, 0, sizeof dec);
    hold h;
    hold_engine(e, &h);
    for (int i = 0; i < 3; i++) {
        bias_params(&q, others[i], 0);
        others[i][0] = (int32_t)(40 + i); /* no shared prefix */
        q.max_tokens = 60;
        submit_or_fail_cb(e, &q, &dec[i]);
    }
    rp_request_params_default(&p);
    p.prompt_ids = prompt;
    p.num_prompt_ids = 150;
    p.max_tokens = 4;
    p.ignore_eos = 1;
    p.temperature = 0;
    p.prompt_logprobs = 1;
    p.prompt_top_logprobs = TOP;
    submit_or_fail_cb(e, &p, &a);
    release_engine(&h);
    rp_engine_wait_idle(e);
    if (a.preemptions == 0) fail_msg("the prompt was never preempted");
    check_prompt_logprobs(&a, prompt, 150, ref, vocab, TOP, "preempted mid-prompt");
    assert_int_equal(a.tokens, 4);
    free(a.lp);
    expect_pool_full(e);
    rp_engine_destroy(e);
    free(ref);
    e = make_engine("qwen3-tied", 0, 0, 4);
    rp_request_params_default(&p);
    p.prompt_ids = prompt;
    p.num_prompt_ids = 4;
    p.prompt_logprobs = 1;
    p.prompt_top_logprobs = RP_MAX_TOP_LOGPROBS + 1;
    rp_error err;
    result r = {0};
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    expect_error(&err, RP_ERROR_INVALID_REQUEST, "prompt_logprobs", "prompt_logprobs");
    rp_engine_destroy(e);
}

/* The action that says a request is running: counts it, under mu. */
static int g_started;
static void act_started(result *r, const rp_token_event *ev) {
    (void)r, (void)ev;
    pthread_mutex_lock(&mu);
    g_started++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Aborts at every stage, none racing a request's end (max_tokens 200 with
 * ignore_eos: none can end on its own first). With the engine held, a
 * request with a 60-token prompt (prefilled in chunks of 8) and requests 0
 * to 11 are submitted, and 2, 5, 8, 11 aborted while waiting: no token, one
 * event. Request 0 aborts the long one at its own second token, mid-prefill:
 * no token. Requests 1, 4, 7, 10 abort themselves at their 1st, 2nd, 3rd,
 * 4th token: exactly that many. 0, 3, 6, 9 run to the end. */
static void test_abort_everywhere(void **state) {
    (void)state;
    enum { LONG = 12, LONG_PROMPT_OF = 51 }; /* params_for(51) has a 60-token prompt */
    g_no_reserve = 1; /* four requests of 500 tokens decode together in a pool of 640 */
    rp_engine *e = make_engine("llama3-scaled", 40, 8, 4);
    g_no_reserve = 0;
    static result r[13];
    memset(r, 0, sizeof r);
    rp_request_id ids[13];
    int32_t prompt[13][64];
    abort_ctx self = {e, NULL}, the_long_one = {e, &ids[LONG]};
    hold h;
    hold_engine(e, &h);
    rp_error err;
    for (int k = 0; k < 13; k++) {
        int i = k == 0 ? LONG : k - 1; /* the long one is the oldest */
        rp_request_params p;
        params_for(i == LONG ? LONG_PROMPT_OF : i, &p, prompt[i], 0);
        p.max_tokens = 200;
        if (i == 0) r[i] = (result){.act_at = 2, .act = act_abort, .act_ctx = &the_long_one};
        if (i % 3 == 1) r[i] = (result){.act_at = 1 + i / 3, .act = act_abort, .act_ctx = &self};
        if (rp_engine_submit(e, &p, collect, &r[i], &ids[i], &err)) fail_msg("%s", err.message);
    }
    for (int i = 2; i < 12; i += 3) assert_int_equal(rp_engine_abort(e, ids[i]), 0);
    release_engine(&h);
    rp_engine_wait_idle(e);
    expect_final_once(&r[LONG], RP_FINISH_REASON_ABORT, 0, "the long prompt", LONG);
    assert_int_equal(r[0].act_rc, 0);
    for (int i = 0; i < 12; i++) {
        if (i % 3 == 0) expect_final_once(&r[i], RP_FINISH_REASON_LENGTH, 200, "request", i);
        if (i % 3 == 1) expect_final_once(&r[i], RP_FINISH_REASON_ABORT, 1 + i / 3, "request", i);
        if (i % 3 == 1) assert_int_equal(r[i].act_rc, 0);
        if (i % 3 == 2) expect_final_once(&r[i], RP_FINISH_REASON_ABORT, 0, "request", i);
        if (i % 3 != 0) assert_int_equal(r[i].events, r[i].n + 1); /* tokens, then the final event */
    }
    assert_int_equal(rp_engine_abort(e, ids[0]), -1); /* already finished */
    assert_int_equal(rp_engine_abort(e, ids[2]), -1);
    expect_pool_full(e);
    /* destroying an engine with requests in flight aborts them: destroy once
     * all four are decoding (500 tokens each are far away) */
    g_started = 0;
    for (int i = 0; i < 4; i++) {
        rp_request_params p;
        params_for(i, &p, prompt[i], 0);
        p.max_tokens = 500;
        r[i] = (result){.act_at = 1, .act = act_started};
        submit_or_fail(e, &p, &r[i]);
    }
    pthread_mutex_lock(&mu);
    while (g_started < 4) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    rp_engine_destroy(e);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i].finish, RP_FINISH_REASON_ABORT);
        assert_int_equal(r[i].finals, 1);
        assert_true(r[i].n >= 1 && r[i].n < 500);
    }
}

/* ---- one long prompt beside others (issue 34) ----------------------------

 * Steps of STEP_TOKENS tokens (one long prompt's chunk could fill a step),
 * counted by a decoding request, the clock; its act_at-th token runs the
 * action under test while the long prompt is prefilled (~70 steps). */
enum { STEP_TOKENS = 16, LONG_PROMPT = 1024, CLOCK_AT = 3 };

typedef struct long_run {
    rp_engine *e;
    result clock, long_one, newcomer;
    rp_request_id long_id;
    int32_t clock_prompt[64], long_prompt[LONG_PROMPT], newcomer_prompt[4];
    int clock_at_act;          /* the clock's tokens when the action ran */
    rp_engine_stats stats;     /* act_submit_long's: one step later */
    hold hold;                 /* act_hold's */
} long_run;

static void long_params(long_run *run, rp_request_params *p) {
    rp_request_params_default(p);
    for (int k = 0; k < LONG_PROMPT; k++) run->long_prompt[k] = (int32_t)((k * 37 + 11) % 500);
    p->prompt_ids = run->long_prompt;
    p->num_prompt_ids = LONG_PROMPT;
    p->max_tokens = 1;
    p->temperature = 0.0f;
}

/* The clock (200 tokens, far more than the long prefill's steps), then the
 * long prompt unless the action submits it. Both are submitted with the
 * engine held: otherwise, on a loaded machine, the clock could reach its
 * action before this thread had submitted the long prompt (and its id, the
 * abort's target, was set). */
static void start_long_run(long_run *run, void (*act)(result *, const rp_token_event *), int submit_long) {
    memset(run, 0, sizeof *run);
    g_step_tokens = STEP_TOKENS;
    run->e = make_engine("qwen3-tied", 0, STEP_TOKENS, 4);
    g_step_tokens = 0;
    rp_request_params p;
    params_for(0, &p, run->clock_prompt, 0);
    p.max_tokens = 200;
    run->clock = (result){.act_at = CLOCK_AT, .act = act, .act_ctx = run};
    run->long_one.clock = run->newcomer.clock = &run->clock;
    rp_engine_hold(run->e, 1);
    submit_or_fail(run->e, &p, &run->clock);
    if (submit_long) {
        long_params(run, &p);
        rp_error err;
        if (rp_engine_submit(run->e, &p, collect, &run->long_one, &run->long_id, &err)) fail_msg("%s", err.message);
    }
    rp_engine_hold(run->e, 0);
}

/* Starts the run and waits for its end; the action's engine call must have
 * worked. */
static void run_long_run(long_run *run, void (*act)(result *, const rp_token_event *), int submit_long) {
    start_long_run(run, act, submit_long);
    rp_engine_wait_idle(run->e);
    assert_int_equal(run->clock.act_rc, 0);
}

static void end_long_run(long_run *run) {
    expect_pool_full(run->e);
    rp_engine_destroy(run->e);
}

static void act_submit_newcomer(result *r, const rp_token_event *ev) {
    (void)ev;
    long_run *run = r->act_ctx;
    run->clock_at_act = r->n;
    rp_request_params p;
    rp_request_params_default(&p);
    for (int k = 0; k < 4; k++) run->newcomer_prompt[k] = 100 + k;
    p.prompt_ids = run->newcomer_prompt;
    p.num_prompt_ids = 4;
    p.max_tokens = 1;
    p.ignore_eos = 1;
    rp_error err;
    r->act_rc = rp_engine_submit(run->e, &p, collect, &run->newcomer, NULL, &err);
}

/* A short request arriving during a long prefill gets its token one or two
 * steps later (with overlap a step's tokens are read once the next step is
 * launched), long before the long prompt's prefill ends: the long prompt's
 * chunk leaves the newcomer its share of the step. */
static void test_newcomer_during_long_prefill(void **state) {
    (void)state;
    static long_run run;
    run_long_run(&run, act_submit_newcomer, 1);
    expect_final_once(&run.newcomer, RP_FINISH_REASON_LENGTH, 1, "the newcomer", 0);
    expect_final_once(&run.long_one, RP_FINISH_REASON_LENGTH, 1, "the long prompt", 0);
    expect_final_once(&run.clock, RP_FINISH_REASON_LENGTH, 200, "the clock", 0);
    assert_in_range(run.newcomer.clock_at_first - run.clock_at_act, 1, 2);
    assert_true(run.long_one.clock_at_first > run.newcomer.clock_at_first + LONG_PROMPT / STEP_TOKENS / 2);
    end_long_run(&run);
}

static void act_abort_long(result *r, const rp_token_event *ev) {
    (void)ev;
    long_run *run = r->act_ctx;
    run->clock_at_act = r->n;
    r->act_rc = rp_engine_abort(run->e, run->long_id);
}

/* Aborting a long prompt mid-prefill ends it at the next chunk boundary: its
 * ABORT event comes within a step or two, and its pages are all back. */
static void test_abort_long_prefill(void **state) {
    (void)state;
    static long_run run;
    run_long_run(&run, act_abort_long, 1);
    assert_in_range(run.long_one.clock_at_final - run.clock_at_act, 0, 2);
    expect_final_once(&run.long_one, RP_FINISH_REASON_ABORT, 0, "the long prompt", 0);
    expect_final_once(&run.clock, RP_FINISH_REASON_LENGTH, 200, "the clock", 0);
    end_long_run(&run);
}

static void act_stats(result *r, const rp_token_event *ev) {
    (void)ev;
    long_run *run = r->act_ctx;
    rp_engine_get_stats(run->e, &run->stats);
}

/* The long prompt submitted at the clock's token CLOCK_AT; at the next one
 * its first chunk has been planned and run. */
static void act_submit_long(result *r, const rp_token_event *ev) {
    (void)ev;
    long_run *run = r->act_ctx;
    rp_request_params p;
    long_params(run, &p);
    rp_error err;
    r->act_rc = rp_engine_submit(run->e, &p, collect, &run->long_one, &run->long_id, &err);
    r->act = act_stats;
    r->act_at = CLOCK_AT + 1;
}

/* A request whose prefill has begun counts as running, its pages as used,
 * from the step that feeds its first chunk on (not only once a step ends). */
static void test_stats_during_long_prefill(void **state) {
    (void)state;
    static long_run run;
    run_long_run(&run, act_submit_long, 0);
    assert_int_equal(run.stats.running, 2);
    assert_int_equal(run.stats.waiting, 0);
    assert_true(run.stats.kv_pages_total - run.stats.kv_pages_free >= 2); /* the clock's page and the chunk's */
    expect_final_once(&run.long_one, RP_FINISH_REASON_LENGTH, 1, "the long prompt", 0);
    end_long_run(&run);
}

static void act_hold(result *r, const rp_token_event *ev) {
    (void)ev;
    long_run *run = r->act_ctx;
    pthread_mutex_lock(&mu);
    run->hold.held = 1;
    pthread_cond_broadcast(&cv);
    while (!run->hold.released) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void *destroy_engine(void *e) {
    rp_engine_destroy(e);
    return NULL;
}

/* Destroy during a long prefill returns after at most one more step: with
 * the engine thread held at the clock's token CLOCK_AT, destroy is called
 * (and given 200 ms to say so) before the thread goes on. */
static void test_destroy_during_long_prefill(void **state) {
    (void)state;
    static long_run run;
    start_long_run(&run, act_hold, 1);
    pthread_mutex_lock(&mu);
    while (!run.hold.held) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, destroy_engine, run.e), 0);
    usleep(200 * 1000);
    release_engine(&run.hold);
    pthread_join(t, NULL);
    expect_final_once(&run.long_one, RP_FINISH_REASON_ABORT, 0, "the long prompt", 0);
    assert_int_equal(run.clock.finish, RP_FINISH_REASON_ABORT);
    assert_in_range(run.clock.n, CLOCK_AT, CLOCK_AT + 1); /* the step in flight, read at shutdown */
}

/* An engine with a draft model: NULL and the message in msg when refused. */
static rp_engine *draft_engine(const char *target_dir, const char *tok_dir, int target_dummy, const char *draft_dir,
                               const char *draft_dummy, int method, char *msg, size_t n) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.model_dir = target_dir;
    c.load_dummy = target_dummy;
    c.tokenizer_dir = tok_dir;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = 64;
    c.max_running_requests = 4;
    c.max_batched_tokens = 256;
    c.speculative_method = method;
    c.num_speculative_tokens = 2;
    c.speculative_model = draft_dir;
    c.speculative_load_dummy = draft_dir != NULL;
    c.speculative_dummy_weights = draft_dummy;
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    snprintf(msg, n, "%s", e ? "" : err.message);
    return e;
}

static void expect_refused(rp_engine *e, const char *msg, const char *words) {
    if (e) {
        rp_engine_destroy(e);
        fail_msg("expected a refusal saying '%s'", words);
    }
    if (!strstr(msg, words)) fail_msg("expected a refusal saying '%s', got: %s", words, msg);
}

/* A config.json of Qwen3's vocabulary (and a tokenizer.json linked from
 * `tokenizer`, when not NULL) in a new temporary directory. */
static void vocab_dir(char *dir, const char *tokenizer) {
    assert_non_null(mkdtemp(dir));
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 151936, \"hidden_size\": 64, "
          "\"intermediate_size\": 128, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
          "\"num_key_value_heads\": 1, \"head_dim\": 32, \"tie_word_embeddings\": false, \"eos_token_id\": 151645}",
          f);
    fclose(f);
    if (tokenizer) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        char *abs = realpath(tokenizer, NULL); /* the link lives in /tmp */
        assert_non_null(abs);
        assert_int_equal(symlink(abs, path), 0);
        free(abs);
    }
}

static void remove_dir(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

/* A draft model must share the target's vocabulary and tokenizer, and the
 * options must name exactly one draft (docs/speculative.md). */
static void test_draft_model_refusals(void **state) {
    (void)state;
    char target[1024], other[1024], msg[512];
    snprintf(target, sizeof target, "%s/tests/fixtures/models/qwen3-tied", test_source_dir());
    snprintf(other, sizeof other, "%s/tests/fixtures/models/llama3-scaled", test_source_dir());
    expect_refused(draft_engine(target, NULL, 0, other, NULL, RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "the draft model's vocabulary has 512 tokens, the target's 503");
    expect_refused(draft_engine(target, NULL, 0, NULL, "tiny-qwen3", RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "vocabulary has 1031 tokens");
    expect_refused(draft_engine(target, NULL, 0, other, "tiny-qwen3", RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "exactly one of");
    expect_refused(draft_engine(target, NULL, 0, NULL, NULL, RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "exactly one of");
    expect_refused(draft_engine(target, NULL, 0, other, NULL, RP_SPEC_NONE, msg, sizeof msg), msg,
                   "speculative decoding is off");
    expect_refused(draft_engine(target, NULL, 0, other, NULL, RP_SPEC_NGRAM, msg, sizeof msg), msg,
                   "n-gram drafting takes no speculative model");
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/no-such-model", target);
    expect_refused(draft_engine(target, NULL, 0, missing, NULL, RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "the draft model");
    /* the same vocabulary size with another tokenizer, then the same tokenizer */
    char qwen[1024], llama[1024];
    snprintf(qwen, sizeof qwen, "%s/.cache/tokenizers/qwen3", test_source_dir());
    snprintf(llama, sizeof llama, "%s/.cache/tokenizers/llama3/tokenizer.json", test_source_dir());
    char tdir[] = "/tmp/rp_target_XXXXXX", ddir[] = "/tmp/rp_draft_XXXXXX", sdir[] = "/tmp/rp_draft_XXXXXX";
    char qwen_json[1100];
    snprintf(qwen_json, sizeof qwen_json, "%s/tokenizer.json", qwen);
    vocab_dir(tdir, NULL);
    vocab_dir(ddir, llama);
    vocab_dir(sdir, qwen_json);
    expect_refused(draft_engine(tdir, qwen, 1, ddir, NULL, RP_SPEC_DRAFT_MODEL, msg, sizeof msg), msg,
                   "a draft model must share the target's tokenizer");
    rp_engine *e = draft_engine(tdir, qwen, 1, sdir, NULL, RP_SPEC_DRAFT_MODEL, msg, sizeof msg);
    if (!e) fail_msg("a draft with the target's tokenizer was refused: %s", msg);
    rp_engine_destroy(e);
    remove_dir(tdir);
    remove_dir(ddir);
    remove_dir(sdir);
}

/* Text prompts, streamed text and stop strings, with the real Qwen3 tokenizer. */
static void test_text_and_stop_strings(void **state) {
    (void)state;
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/.cache/tokenizers/qwen3", test_source_dir());
    char dir[] = "/tmp/rp_engine_XXXXXX";
    vocab_dir(dir, NULL);
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.model_dir = dir;
    c.load_dummy = 1;
    c.tokenizer_dir = tok;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = 64;
    c.max_running_requests = 8;
    c.max_batched_tokens = 256;
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.message);
    /* a free run, then the same run with a stop string taken from its middle */
    result a = {0}, b = {0};
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt = "Once upon a time";
    p.max_tokens = 40;
    p.temperature = 1.0f;
    p.seed = 5;
    p.has_seed = 1;
    p.ignore_eos = 1;
    submit_or_fail(e, &p, &a);
    rp_engine_wait_idle(e);
    assert_int_equal(a.finish, RP_FINISH_REASON_LENGTH);
    assert_true(a.text_len > 10);
    /* a stop string that starts partway: the text up to it, then STOP */
    size_t cut = a.text_len / 2;
    while (cut < a.text_len && ((unsigned char)a.text[cut] & 0xc0) == 0x80) cut++; /* UTF-8 boundary */
    char stop[8] = {0};
    size_t sl = a.text_len - cut < 3 ? a.text_len - cut : 3;
    memcpy(stop, a.text + cut, sl);
    const char *stops[] = {stop};
    p.stop = stops;
    p.num_stop = 1;
    submit_or_fail(e, &p, &b);
    rp_engine_wait_idle(e);
    char *first = memmem(a.text, a.text_len, stop, sl);
    assert_non_null(first);
    size_t want = (size_t)(first - a.text);
    assert_int_equal(b.finish, RP_FINISH_REASON_STOP);
    assert_int_equal(b.text_len, want);
    assert_memory_equal(b.text, a.text, want);
    expect_pool_full(e);
    rp_engine_destroy(e);
    remove_dir(dir);
}

/* Dummy weights look like a freshly initialised model (transformers' normal
 * init): at temperature 1 the output depends on the seed and is not one
 * token over and over, as it was with the old uniform weights ("3 3 3 ...",
 * which looked like a broken sampler). Greedy output is checked on
 * tiny-llama3: with tied embeddings (tiny-qwen3), a random model's greedy
 * decode settles on repeating one token, as transformers' would, because the
 * chosen token's own embedding then dominates its next logits. */
static void run_dummy(const char *name, float temperature, uint64_t seed, result *r) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.dummy_name = name;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = 16;
    c.quiet_model_warning = 1;
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("engine: %s", err.message);
    static const int32_t prompt[3] = {1, 2, 3};
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt_ids = prompt;
    p.num_prompt_ids = 3;
    p.max_tokens = 16;
    p.ignore_eos = 1;
    p.temperature = temperature;
    p.seed = seed;
    p.has_seed = 1;
    submit_or_fail(e, &p, r);
    rp_engine_wait_idle(e);
    assert_int_equal(r->n, 16);
    rp_engine_destroy(e);
}

static int distinct_tokens(const result *r) {
    int d = 0;
    for (int i = 0; i < r->n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= r->tokens[j] == r->tokens[i];
        d += !seen;
    }
    return d;
}

static void test_dummy_weights_not_degenerate(void **state) {
    (void)state;
    result r[4] = {0};
    int distinct_runs = 0;
    for (int s = 0; s < 4; s++) {
        run_dummy("tiny-qwen3", 1.0f, (uint64_t)s + 1, &r[s]);
        if (distinct_tokens(&r[s]) < 4) fail_msg("seed %d: only %d distinct tokens in 16", s + 1, distinct_tokens(&r[s]));
        int same = 0;
        for (int t = 0; t < s; t++) same |= !memcmp(r[s].tokens, r[t].tokens, sizeof r[s].tokens[0] * 16);
        distinct_runs += !same;
    }
    assert_true(distinct_runs >= 2);
    result g = {0};
    run_dummy("tiny-llama3", 0.0f, 0, &g);
    if (distinct_tokens(&g) < 2) fail_msg("greedy: one token repeated");
}

/* Released from a hold, the engine is busy at once: a wait for idle right
 * after rp_engine_hold(e, 0) returns only when the held requests have run
 * (it used to see the engine asleep with work queued, and return). */
static void test_release_then_wait_idle(void **state) {
    (void)state;
    rp_engine *e = make_engine("qwen3-tied", 64, 0, 4);
    for (int i = 0; i < 50; i++) {
        result r = {0};
        rp_request_params p;
        rp_request_params_default(&p);
        const int32_t prompt[] = {1, 2, 3};
        p.prompt_ids = prompt;
        p.num_prompt_ids = 3;
        p.max_tokens = 2;
        p.ignore_eos = 1;
        rp_error err;
        rp_engine_hold(e, 1);
        if (rp_engine_submit(e, &p, collect, &r, NULL, &err)) fail_msg("%s", err.message);
        usleep(2000); /* time for the engine thread to take the request in and go back to sleep */
        rp_engine_hold(e, 0);
        rp_engine_wait_idle(e);
        pthread_mutex_lock(&mu);
        const int finals = r.finals;
        pthread_mutex_unlock(&mu);
        if (finals != 1) fail_msg("round %d: wait_idle returned with the request unfinished", i);
    }
    rp_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone_greedy),
        cmocka_unit_test(test_batched_equals_alone_seeded),
        cmocka_unit_test(test_preemption_takes_newest),
        cmocka_unit_test(test_default_max_running),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_top_logprobs),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_min_tokens),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_abort_everywhere),
        cmocka_unit_test(test_newcomer_during_long_prefill),
        cmocka_unit_test(test_abort_long_prefill),
        cmocka_unit_test(test_stats_during_long_prefill),
        cmocka_unit_test(test_destroy_during_long_prefill),
        cmocka_unit_test(test_text_and_stop_strings),
        cmocka_unit_test(test_draft_model_refusals),
        cmocka_unit_test(test_dummy_weights_not_degenerate),
        cmocka_unit_test(test_release_then_wait_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
