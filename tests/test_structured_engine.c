/* Structured output through the engine (CPU backend, random weights): a
 * tiny model over a tiny byte-level vocabulary (printable ASCII, a few
 * multi-character tokens, one special end token), so that a random walk
 * through a grammar ends within a few dozen tokens. Every constrained
 * output, greedy and sampled over many seeds, in batches mixed with
 * unconstrained requests, is checked by a fresh matcher over a byte
 * vocabulary (and by jansson and the schema's own bounds for JSON); a
 * request that stops is complete. Unconstrained requests in the mix give the
 * tokens they give alone. A grammar that needs a byte no token has ends
 * with the grammar finish reason; a bad constraint is a submit error naming
 * its field; logprobs are those of the masked distribution; a reasoning
 * model's thinking is left free; speculative
 * decoding changes no constrained output; aborts free everything; the
 * pool is full after each test. The masks go to the backend (sampled with
 * them after the forward is launched) or are applied to logits read back
 * on the host: both give the same tokens, logprobs and top logprobs, with
 * overlap and without. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "replay/engine.h"
#include "structured/structured.h"
#include "test_util.h"
#include "masked_sampling.h" /* after cmocka: its checks use fail_msg */
#include "tiny_ascii_model.h"
#include "tokenizer/tokenizer.h"

#define MAXOUT 96

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct result {
    int32_t tokens[MAXOUT + 1];
    float logprobs[MAXOUT + 1];
    int32_t top_ids[MAXOUT + 1][RP_MAX_TOP_LOGPROBS];
    float top_lps[MAXOUT + 1][RP_MAX_TOP_LOGPROBS];
    int num_top[MAXOUT + 1];
    int n;
    char text[4096];
    size_t text_len;
    rp_finish finish;
    int finals;
} result;

static void collect(void *user, const rp_token_event *ev) {
    result *r = user;
    pthread_mutex_lock(&mu);
    if (ev->token >= 0 && r->n <= MAXOUT) {
        r->tokens[r->n] = ev->token;
        r->logprobs[r->n] = ev->logprob;
        r->num_top[r->n] = ev->num_top_logprobs;
        memcpy(r->top_ids[r->n], ev->top_ids, sizeof ev->top_ids);
        memcpy(r->top_lps[r->n], ev->top_logprobs, sizeof ev->top_logprobs);
        r->n++;
    }
    if (ev->text_len && r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    if (ev->finish != RP_FINISH_REASON_NONE) {
        r->finish = ev->finish;
        r->finals++;
    }
    pthread_mutex_unlock(&mu);
}

/* ---- the tiny model and vocabulary -------------------------------------- */

enum { VOCAB = 128 };
static int g_end_id;   /* the special end token, the model's EOS */
static int g_think_id; /* "</think>", a plain token: the end of a reasoning model's thinking */

/* GPT-2's byte-level printable alphabet, some multi-character tokens,
 * "</think>" (a plain token) and <|end|> (tiny_ascii_model.h). */
static void write_model(const char *dir) {
    static const char *extra[] = {"true", "false", "null", "\":", "{\"", "\",\"", "12", "ab", "}]", "red", "re",
                                  "</think>"};
    g_think_id = 95 + (int)(sizeof extra / sizeof *extra) - 1; /* the last: after 94 characters and "Ġ" */
    g_end_id = tiny_ascii_model_write(dir, VOCAB, extra, sizeof extra / sizeof *extra);
}

static char g_dir[] = "/tmp/rp_sengine_XXXXXX";

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(g_dir)) return -1;
    write_model(g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tiny_ascii_model_remove(g_dir);
    return 0;
}

/* The engines the next make_engine calls create: masks on the host (the
 * logits read back) rather than sent to the backend, and without overlap. */
static int g_host_masks, g_no_overlap;
static int g_tp; /* > 1: the model over this many CPU ranks (tensor parallelism) */

/* spec_k > 0: n-gram speculative decoding with k drafts a round, or with
 * draft_model, drafts from the model itself (its greedy tokens, unmasked) */
static rp_engine *make_engine_spec(int spec_k, int draft_model) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.model_dir = g_dir;
    c.load_dummy = 1;
    c.weight_seed = 7;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = 256;
    c.max_running_requests = 32;
    c.max_batched_tokens = 512;
    c.quiet_model_warning = 1;
    c.debug_check_every_step = 1;
    c.disable_device_masks = g_host_masks;
    c.disable_overlap = g_no_overlap;
    c.tensor_parallel_size = g_tp;
    if (spec_k) {
        c.speculative_method = RP_SPEC_NGRAM;
        c.num_speculative_tokens = spec_k;
        c.prompt_lookup_min = 1;
        c.prompt_lookup_max = 2;
        if (draft_model) {
            c.speculative_method = RP_SPEC_DRAFT_MODEL;
            c.prompt_lookup_min = c.prompt_lookup_max = 0;
            c.speculative_model = g_dir;
            c.speculative_load_dummy = 1;
        }
    }
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

static rp_engine *make_engine(int spec_k) { return make_engine_spec(spec_k, 0); }

static void expect_pool_full(rp_engine *e) {
    rp_engine_stats st;
    rp_engine_wait_idle(e);
    rp_engine_get_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.kv_pages_free, st.kv_pages_total);
}

static const int32_t PROMPT[] = {40, 41, 42, 43, 44}; /* "IJKLM" */

static void params(rp_request_params *p, const rp_constraint *c, uint64_t seed, float temperature) {
    rp_request_params_default(p);
    p->prompt_ids = PROMPT;
    p->num_prompt_ids = 5;
    p->max_tokens = MAXOUT;
    p->temperature = temperature;
    p->seed = seed;
    p->has_seed = 1;
    if (c) p->constraint = *c;
}

/* ---- the independent check ----------------------------------------------- */

/* Whether the text is in the constraint's language (complete: a whole
 * output; else a prefix of one), by a fresh matcher over single bytes. */
static int text_matches(const rp_constraint *c, const char *text, size_t len, int complete) {
    static const rp_skind kinds[] = {[RP_CONSTRAINT_JSON_SCHEMA] = RP_SKIND_JSON_SCHEMA,
                                     [RP_CONSTRAINT_JSON_OBJECT] = RP_SKIND_JSON_OBJECT,
                                     [RP_CONSTRAINT_REGEX] = RP_SKIND_REGEX,
                                     [RP_CONSTRAINT_CHOICE] = RP_SKIND_CHOICE,
                                     [RP_CONSTRAINT_GRAMMAR] = RP_SKIND_GBNF};
    return ms_text_matches(kinds[c->kind], c->text ? c->text : "", c->allow_whitespace, text, len, complete);
}

static const char *FLAT_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"ok\":{\"type\":\"boolean\"},"
    "\"color\":{\"enum\":[\"red\",\"green\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"maxLength\":2},\"maxItems\":3}},\"required\":[\"name\",\"age\",\"ok\",\"color\",\"tags\"]}";

/* A tree: recursive through $ref, each node a digit and at most one child. */
static const char *TREE_SCHEMA =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":9},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":1}},"
    "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}";

/* The JSON schemas' meaning, beyond the grammar: what jansson reads. */
static void check_flat(json_t *j) {
    assert_true(json_is_object(j));
    json_t *name = json_object_get(j, "name"), *age = json_object_get(j, "age"), *ok = json_object_get(j, "ok");
    json_t *color = json_object_get(j, "color"), *tags = json_object_get(j, "tags");
    assert_true(json_is_string(name) && json_string_length(name) <= 4);
    assert_true(json_is_integer(age) && json_integer_value(age) >= 0 && json_integer_value(age) <= 120);
    assert_true(json_is_boolean(ok));
    assert_true(json_is_string(color));
    assert_true(!strcmp(json_string_value(color), "red") || !strcmp(json_string_value(color), "green"));
    assert_true(json_is_array(tags) && json_array_size(tags) <= 3);
    assert_int_equal(json_object_size(j), 5);
}

static int check_tree(json_t *j) {
    assert_true(json_is_object(j));
    json_t *v = json_object_get(j, "v"), *kids = json_object_get(j, "kids");
    assert_true(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 9);
    if (!kids) return 1;
    assert_true(json_is_array(kids) && json_array_size(kids) <= 1);
    return 1 + (json_array_size(kids) ? check_tree(json_array_get(kids, 0)) : 0);
}

static void check_output(const rp_constraint *c, const result *r, int *complete) {
    assert_int_equal(r->finals, 1);
    if (r->finish != RP_FINISH_REASON_STOP && r->finish != RP_FINISH_REASON_LENGTH)
        fail_msg("finish %d for '%.*s'", r->finish, (int)r->text_len, r->text);
    const int done = r->finish == RP_FINISH_REASON_STOP;
    if (!text_matches(c, r->text, r->text_len, done))
        fail_msg("output '%.*s' (%s) is not in the language of %s", (int)r->text_len, r->text,
                 done ? "complete" : "a prefix", c->text ? c->text : "json_object");
    /* a stop is the end token, taken only where the output is complete */
    if (done) assert_int_equal(r->tokens[r->n - 1], g_end_id);
    for (int i = 0; i + 1 < r->n; i++) assert_int_not_equal(r->tokens[i], g_end_id);
    *complete += done;
    if (!done || (c->kind != RP_CONSTRAINT_JSON_SCHEMA && c->kind != RP_CONSTRAINT_JSON_OBJECT)) return;
    json_error_t jerr;
    json_t *j = json_loadb(r->text, r->text_len, JSON_DECODE_ANY, &jerr);
    if (!j && strstr(jerr.text, "overflow")) return; /* valid JSON past what jansson's doubles and integers hold */
    if (!j) fail_msg("'%.*s' is not JSON: %s", (int)r->text_len, r->text, jerr.text);
    if (c->kind == RP_CONSTRAINT_JSON_OBJECT) assert_true(json_is_object(j));
    else if (c->text == FLAT_SCHEMA) check_flat(j);
    else check_tree(j);
    json_decref(j);
}

/* ---- tests ------------------------------------------------------------------ */

enum { SEEDS = 12, KINDS = 6 };

static const rp_constraint CONSTRAINTS[KINDS] = {
    {.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = NULL /* FLAT_SCHEMA */},
    {.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = NULL /* TREE_SCHEMA */},
    {.kind = RP_CONSTRAINT_REGEX, .text = "[a-z]{2,5}@[a-z]{2,4}\\.(com|org)"},
    {.kind = RP_CONSTRAINT_CHOICE, .text = "[\"red\", \"green\", \"blue sky\"]"},
    {.kind = RP_CONSTRAINT_GRAMMAR, .text = "root ::= \"(\" item (\",\" item)* \")\"\nitem ::= [0-9] | \"ab\""},
    {.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = NULL /* FLAT_SCHEMA with whitespace */, .allow_whitespace = 1},
};

static rp_constraint constraint(int k) {
    rp_constraint c = CONSTRAINTS[k];
    if (!c.text) c.text = k == 1 ? TREE_SCHEMA : FLAT_SCHEMA;
    return c;
}

/* Every kind, greedy and sampled over SEEDS seeds, all in one batch with
 * unconstrained requests; the unconstrained ones give what they give alone,
 * and the constrained ones what they give alone too (a seeded request's
 * output does not depend on its batch). */
static void test_constrained_batches(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    static result res[KINDS][SEEDS], free_alone[4], free_mixed[4], alone[KINDS];
    memset(res, 0, sizeof res);
    memset(free_alone, 0, sizeof free_alone);
    memset(free_mixed, 0, sizeof free_mixed);
    memset(alone, 0, sizeof alone);
    rp_request_params p;
    rp_error err;
    for (int i = 0; i < 4; i++) {
        params(&p, NULL, 100 + (uint64_t)i, i ? 1.0f : 0.0f);
        p.max_tokens = 24;
        p.ignore_eos = 1;
        if (rp_engine_submit(e, &p, collect, &free_alone[i], NULL, &err)) fail_msg("%s", err.message);
        rp_engine_wait_idle(e);
    }
    for (int k = 0; k < KINDS; k++) {
        rp_constraint c = constraint(k);
        params(&p, &c, 3, 1.0f);
        if (rp_engine_submit(e, &p, collect, &alone[k], NULL, &err)) fail_msg("%s", err.message);
        rp_engine_wait_idle(e);
    }
    rp_engine_hold(e, 1);
    for (int s = 0; s < SEEDS; s++)
        for (int k = 0; k < KINDS; k++) {
            rp_constraint c = constraint(k);
            params(&p, &c, (uint64_t)s, s == 0 ? 0.0f : s < SEEDS / 2 ? 1.0f : 0.7f);
            if (s == SEEDS - 1) p.top_k = 5;
            if (rp_engine_submit(e, &p, collect, &res[k][s], NULL, &err)) fail_msg("%s", err.message);
            if (s == 2 && k < 4) {
                params(&p, NULL, 100 + (uint64_t)k, k ? 1.0f : 0.0f);
                p.max_tokens = 24;
                p.ignore_eos = 1;
                if (rp_engine_submit(e, &p, collect, &free_mixed[k], NULL, &err)) fail_msg("%s", err.message);
            }
        }
    rp_engine_hold(e, 0);
    expect_pool_full(e);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(free_mixed[i].n, free_alone[i].n);
        assert_memory_equal(free_mixed[i].tokens, free_alone[i].tokens, sizeof(int32_t) * (size_t)free_alone[i].n);
    }
    for (int k = 0; k < KINDS; k++) {
        rp_constraint c = constraint(k);
        int complete = 0;
        for (int s = 0; s < SEEDS; s++) check_output(&c, &res[k][s], &complete);
        if (complete < 2) fail_msg("constraint %d: only %d of %d outputs complete", k, complete, SEEDS);
        assert_int_equal(res[k][3].n, alone[k].n);
        assert_memory_equal(res[k][3].tokens, alone[k].tokens, sizeof(int32_t) * (size_t)alone[k].n);
    }
    /* the choices always end: one of the three, whole */
    for (int s = 0; s < SEEDS; s++) {
        const result *r = &res[3][s];
        assert_int_equal(r->finish, RP_FINISH_REASON_STOP);
        assert_true((r->text_len == 3 && !memcmp(r->text, "red", 3)) ||
                    (r->text_len == 5 && !memcmp(r->text, "green", 5)) ||
                    (r->text_len == 8 && !memcmp(r->text, "blue sky", 8)));
    }
    rp_engine_destroy(e);
}

/* json_object: any object; with few tokens many outputs are cut by
 * max_tokens, each still a prefix of an object. */
static void test_json_object(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    static result res[SEEDS];
    memset(res, 0, sizeof res);
    rp_constraint c = {.kind = RP_CONSTRAINT_JSON_OBJECT};
    rp_request_params p;
    rp_error err;
    for (int s = 0; s < SEEDS; s++) {
        params(&p, &c, (uint64_t)s, 1.0f);
        if (rp_engine_submit(e, &p, collect, &res[s], NULL, &err)) fail_msg("%s", err.message);
    }
    expect_pool_full(e);
    int complete = 0;
    for (int s = 0; s < SEEDS; s++) {
        check_output(&c, &res[s], &complete);
        assert_true(res[s].text_len > 0 && res[s].text[0] == '{');
    }
    rp_engine_destroy(e);
}

/* A grammar whose next byte (a tab) no token has: the output stops before
 * it with the grammar's finish reason, the text so far a prefix. */
static void test_dead_end(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    rp_constraint c = {.kind = RP_CONSTRAINT_GRAMMAR, .text = "root ::= \"ab\" \"\\t\" \"c\""};
    rp_request_params p;
    rp_error err;
    result r[2] = {0};
    for (int i = 0; i < 2; i++) {
        params(&p, &c, (uint64_t)i, i ? 1.0f : 0.0f);
        if (rp_engine_submit(e, &p, collect, &r[i], NULL, &err)) fail_msg("%s", err.message);
    }
    expect_pool_full(e);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].finals, 1);
        assert_int_equal(r[i].finish, RP_FINISH_REASON_GRAMMAR);
        assert_int_equal(r[i].text_len, 2);
        assert_memory_equal(r[i].text, "ab", 2);
    }
    rp_engine_destroy(e);
}

static void expect_submit_error(rp_engine *e, const rp_constraint *c, rp_error_code code, const char *param,
                                const char *needle) {
    rp_request_params p;
    params(&p, c, 1, 1.0f);
    rp_error err = {0};
    result r = {0};
    assert_int_equal(rp_engine_submit(e, &p, collect, &r, NULL, &err), -1);
    assert_int_equal(err.code, code);
    assert_string_equal(err.param, param);
    if (!strstr(err.message, needle)) fail_msg("'%s' does not say '%s'", err.message, needle);
    /* the engine-less check says the same */
    rp_error verr = {0};
    assert_int_equal(rp_constraint_validate(c, &verr), -1);
    assert_string_equal(verr.param, param);
    assert_string_equal(verr.message, err.message);
}

/* A constraint that does not compile is an error at submit, naming the
 * request field it came from and the keyword or construct at fault. */
static void test_bad_constraints(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    rp_constraint c = {.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = "{\"type\":\"object\",\"patternProperties\":{}}",
                       .param = "response_format"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "response_format", "patternProperties");
    c = (rp_constraint){.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = "{not json", .param = "guided_json"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "guided_json", "guided_json");
    c = (rp_constraint){.kind = RP_CONSTRAINT_REGEX, .text = "(a)\\1", .param = "guided_regex"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "guided_regex", "backreference");
    c = (rp_constraint){.kind = RP_CONSTRAINT_GRAMMAR, .text = "root ::= undefined_rule"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "structured_outputs", "undefined");
    c = (rp_constraint){.kind = RP_CONSTRAINT_CHOICE, .text = "[1, 2]", .param = "guided_choice"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "guided_choice", "guided_choice");
    c = (rp_constraint){.kind = RP_CONSTRAINT_REGEX, .text = NULL};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "structured_outputs", "empty");
    /* nesting past the limit */
    char deep[2048] = "";
    for (int i = 0; i < 80; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{\"type\":\"integer\"}");
    for (int i = 0; i < 80; i++) strcat(deep, "}");
    c = (rp_constraint){.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = deep, .param = "response_format"};
    expect_submit_error(e, &c, RP_ERROR_INVALID_REQUEST, "response_format", "depth");
    expect_pool_full(e);
    rp_engine_destroy(e);
}

/* Logprobs are those of the masked distribution: greedy, the token's
 * log-softmax over the allowed tokens (which sum to 1), and no top entry
 * the grammar forbids has a finite logprob. */
static void test_masked_logprobs(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    const rp_tokenizer *tok = rp_engine_tokenizer(e);
    rp_constraint c = {.kind = RP_CONSTRAINT_CHOICE, .text = "[\"red\", \"green\", \"re\"]"};
    rp_request_params p;
    rp_error err;
    result r = {0};
    params(&p, &c, 1, 0.0f);
    p.logprobs = 1;
    p.top_logprobs = 5;
    if (rp_engine_submit(e, &p, collect, &r, NULL, &err)) fail_msg("%s", err.message);
    expect_pool_full(e);
    assert_int_equal(r.finish, RP_FINISH_REASON_STOP);
    assert_true(r.n >= 2);
    /* the first token: "r", "re", "red" or "g" are the allowed ones */
    double mass = 0;
    for (int i = 0; i < r.num_top[0]; i++) {
        const char *b;
        size_t n;
        if (!isfinite(r.top_lps[0][i])) continue;
        assert_int_equal(rp_tokenizer_token_bytes(tok, r.top_ids[0][i], &b, &n), 0);
        if (!((n == 1 && (b[0] == 'r' || b[0] == 'g')) || (n == 2 && !memcmp(b, "re", 2)) ||
              (n == 3 && !memcmp(b, "red", 3))))
            fail_msg("top logprob for '%.*s', which the grammar forbids", (int)n, b);
        mass += exp(r.top_lps[0][i]);
    }
    assert_true(mass > 0.999 && mass < 1.001); /* the four allowed tokens are the whole distribution */
    assert_true(isfinite(r.logprobs[0]) && r.logprobs[0] == r.top_lps[0][0]);
    rp_engine_destroy(e);
}

/* Speculative decoding (n-gram drafts, and a draft model's unmasked greedy
 * drafts) gives constrained requests, greedy and sampled, the tokens they
 * get without it, with drafts taken; unconstrained requests beside them too. */
/* Request s of run_spec: a schema, a choice list with repeats (which
 * n-gram drafts guess), a grammar; request 3 reasons first. */
static rp_constraint spec_constraint(int s) {
    rp_constraint c = constraint(s % 3 == 2 ? 4 : 0);
    if (s % 3 == 1) c = (rp_constraint){.kind = RP_CONSTRAINT_CHOICE, .text = "[\"abababababab\", \"abababababa\"]"};
    if (s == 3) c.has_reasoning_end = 1, c.reasoning_end_id = g_think_id;
    return c;
}

static void run_spec(int spec_k, int draft_model, result *res, int n, rp_engine_stats *st) {
    rp_engine *e = make_engine_spec(spec_k, draft_model);
    rp_request_params p;
    rp_error err;
    rp_engine_hold(e, 1);
    for (int s = 0; s < n; s++) {
        rp_constraint c = spec_constraint(s);
        params(&p, s == n - 1 ? NULL : &c, (uint64_t)s, s % 2 ? 1.0f : 0.0f);
        if (s == n - 1) {
            p.max_tokens = 40;
            p.ignore_eos = 1;
        }
        if (rp_engine_submit(e, &p, collect, &res[s], NULL, &err)) fail_msg("%s", err.message);
    }
    rp_engine_hold(e, 0);
    expect_pool_full(e);
    rp_engine_get_stats(e, st);
    rp_engine_destroy(e);
}

static void test_speculative_constrained(void **state) {
    (void)state;
    enum { N = 10 };
    static result plain[N], spec[N];
    /* the rounds' masks on the backend (each position's after the drafts
     * before it), then on the host */
    for (int run = 0; run < 4; run++) {
        const int draft_model = run & 1, host_masks = run >> 1;
        memset(plain, 0, sizeof plain);
        memset(spec, 0, sizeof spec);
        rp_engine_stats st;
        run_spec(0, 0, plain, N, &st);
        g_host_masks = host_masks;
        run_spec(3, draft_model, spec, N, &st);
        g_host_masks = 0;
        assert_true(host_masks ? st.masked_rows_host > 0 && !st.masked_rows_device
                               : st.masked_rows_device > 0 && !st.masked_rows_host);
        for (int s = 0; s < N; s++) {
            if (spec[s].n != plain[s].n || memcmp(spec[s].tokens, plain[s].tokens, sizeof(int32_t) * (size_t)plain[s].n))
                fail_msg("%s drafts, request %d: '%.*s' against '%.*s' without", draft_model ? "draft model" : "n-gram",
                         s, (int)spec[s].text_len, spec[s].text, (int)plain[s].text_len, plain[s].text);
            assert_int_equal(spec[s].finish, plain[s].finish);
        }
        int complete = 0;
        for (int s = 0; s < N - 1; s++) {
            rp_constraint c = spec_constraint(s);
            if (!c.has_reasoning_end) check_output(&c, &spec[s], &complete);
        }
        /* rounds ran; n-gram drafts of the repeated choices are taken (a
         * random draft model's unmasked guesses may all be refused) */
        assert_true(st.spec_rounds > 0 && (draft_model || st.spec_accepted_tokens > 0));
    }
}

/* A reasoning model's thinking is free: with a reasoning end token the
 * output is constrained only after it (at once where the prompt holds it). */
static void test_reasoning_first(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    enum { N = 12 };
    static result res[N], closed;
    memset(res, 0, sizeof res);
    memset(&closed, 0, sizeof closed);
    rp_constraint c = {.kind = RP_CONSTRAINT_CHOICE, .text = "[\"red\", \"green\"]", .has_reasoning_end = 1,
                       .reasoning_end_id = g_think_id};
    rp_request_params p;
    rp_error err;
    for (int s = 0; s < N; s++) {
        params(&p, &c, (uint64_t)s, 1.0f);
        p.max_tokens = 300;
        if (rp_engine_submit(e, &p, collect, &res[s], NULL, &err)) fail_msg("%s", err.message);
    }
    const int32_t thought[] = {40, 41, g_think_id};
    params(&p, &c, 1, 1.0f);
    p.prompt_ids = thought;
    p.num_prompt_ids = 3;
    if (rp_engine_submit(e, &p, collect, &closed, NULL, &err)) fail_msg("%s", err.message);
    expect_pool_full(e);
    assert_int_equal(closed.finish, RP_FINISH_REASON_STOP);
    assert_true((closed.text_len == 3 && !memcmp(closed.text, "red", 3)) ||
                (closed.text_len == 5 && !memcmp(closed.text, "green", 5)));
    int answered = 0, free_text = 0;
    for (int s = 0; s < N; s++) {
        const result *r = &res[s];
        int at = -1;
        for (int i = 0; i < r->n && at < 0; i++)
            if (r->tokens[i] == g_think_id) at = i;
        if (at < 0) { /* still thinking at the end: any text */
            assert_true(r->finish == RP_FINISH_REASON_STOP || r->finish == RP_FINISH_REASON_LENGTH);
            free_text += r->n > 3;
            continue;
        }
        const char *after = memmem(r->text, r->text_len, "</think>", 8);
        assert_non_null(after);
        after += 8;
        const size_t len = r->text_len - (size_t)(after - r->text);
        assert_int_equal(r->finish, RP_FINISH_REASON_STOP);
        if (!((len == 3 && !memcmp(after, "red", 3)) || (len == 5 && !memcmp(after, "green", 5))))
            fail_msg("after the thinking: '%.*s'", (int)len, after);
        answered++;
    }
    if (!answered || !free_text) fail_msg("%d answers after thinking, %d free texts of %d", answered, free_text, N);
    rp_engine_destroy(e);
}

/* A constrained request aborted while it decodes (from its own callback, on
 * the engine thread) and one aborted while it waits: each ends once with
 * ABORT, its matcher freed with it and its pages back in the pool. */
typedef struct abort_ctx {
    rp_engine *e;
    result r;
    int at;
} abort_ctx;

static void abort_cb(void *user, const rp_token_event *ev) {
    abort_ctx *a = user;
    collect(&a->r, ev);
    if (ev->finish == RP_FINISH_REASON_NONE && a->r.n == a->at) rp_engine_abort(a->e, ev->id);
}

static void test_abort(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    static abort_ctx a[2];
    memset(a, 0, sizeof a);
    rp_constraint c = {.kind = RP_CONSTRAINT_JSON_OBJECT};
    rp_request_params p;
    rp_error err;
    rp_request_id waiting;
    rp_engine_hold(e, 1);
    for (int i = 0; i < 2; i++) {
        a[i].e = e;
        a[i].at = i ? 0 : 3;
        params(&p, &c, (uint64_t)i, 1.0f);
        if (rp_engine_submit(e, &p, abort_cb, &a[i], i ? &waiting : NULL, &err)) fail_msg("%s", err.message);
    }
    assert_int_equal(rp_engine_abort(e, waiting), 0);
    rp_engine_hold(e, 0);
    expect_pool_full(e);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].r.finals, 1);
        assert_int_equal(a[i].r.finish, RP_FINISH_REASON_ABORT);
    }
    assert_int_equal(a[0].r.n, 3);
    assert_int_equal(a[1].r.n, 0);
    rp_engine_destroy(e);
}

/* The same mixed batch (every kind, greedy and sampled, top-k, logprobs and
 * top logprobs, unconstrained requests beside) with the masks sent to the
 * backend and applied on the host, with overlap and without: the same
 * tokens, logprobs and top logprobs everywhere (the CPU backend samples
 * with the host sampler's own code), and the stats say which path ran. */
enum { CMP_N = KINDS * 4 + 3 };

static void run_mixed(int host_masks, int no_overlap, result *res, rp_engine_stats *st) {
    g_host_masks = host_masks;
    g_no_overlap = no_overlap;
    rp_engine *e = make_engine(0);
    g_host_masks = g_no_overlap = 0;
    rp_request_params p;
    rp_error err;
    rp_engine_hold(e, 1);
    for (int i = 0; i < CMP_N; i++) {
        rp_constraint c = constraint(i % KINDS);
        const int free_req = i >= KINDS * 4;
        params(&p, free_req ? NULL : &c, 40 + (uint64_t)i, i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : 0.8f);
        if (i % 4 == 1) p.top_k = 6;
        if (i % 5 == 2) p.top_logprobs = 3;
        p.logprobs = 1;
        if (free_req) p.max_tokens = 20, p.ignore_eos = 1;
        if (rp_engine_submit(e, &p, collect, &res[i], NULL, &err)) fail_msg("%s", err.message);
    }
    rp_engine_hold(e, 0);
    expect_pool_full(e);
    rp_engine_get_stats(e, st);
    rp_engine_destroy(e);
}

static void test_device_masks_equal_host(void **state) {
    (void)state;
    static result host[CMP_N], dev[CMP_N];
    for (int no_overlap = 0; no_overlap < 2; no_overlap++) {
        memset(host, 0, sizeof host);
        memset(dev, 0, sizeof dev);
        rp_engine_stats sh, sd;
        run_mixed(1, no_overlap, host, &sh);
        run_mixed(0, no_overlap, dev, &sd);
        assert_true(sh.masked_rows_host > 0);
        assert_int_equal(sh.masked_rows_device, 0);
        assert_true(sd.masked_rows_device > 0);
        assert_int_equal(sd.masked_rows_host, 0);
        assert_int_equal(sd.masked_rows_device, sh.masked_rows_host);
        int complete = 0;
        for (int i = 0; i < CMP_N; i++) {
            const result *h = &host[i], *d = &dev[i];
            if (d->n != h->n || memcmp(d->tokens, h->tokens, sizeof(int32_t) * (size_t)h->n))
                fail_msg("request %d (overlap %s): '%.*s' with device masks, '%.*s' with host masks", i,
                         no_overlap ? "off" : "on", (int)d->text_len, d->text, (int)h->text_len, h->text);
            assert_int_equal(d->finish, h->finish);
            assert_memory_equal(d->logprobs, h->logprobs, sizeof(float) * (size_t)h->n);
            assert_memory_equal(d->num_top, h->num_top, sizeof(int) * (size_t)h->n);
            for (int t = 0; t < h->n; t++) {
                assert_memory_equal(d->top_ids[t], h->top_ids[t], sizeof(int32_t) * (size_t)h->num_top[t]);
                assert_memory_equal(d->top_lps[t], h->top_lps[t], sizeof(float) * (size_t)h->num_top[t]);
            }
            if (i < KINDS * 4) {
                rp_constraint c = constraint(i % KINDS);
                check_output(&c, d, &complete);
            }
        }
        assert_true(complete > 0);
    }
}

/* Tensor parallelism (2 CPU ranks): the masks go to the tensor-parallel
 * backend, which has every rank sample its gathered logits with them, so
 * the same mixed batch gives what one rank gives: the same tokens, and
 * logprobs within the float rounding of the sharded sums. */
static void test_tp_device_masks(void **state) {
    (void)state;
    static result one[CMP_N], two[CMP_N];
    memset(one, 0, sizeof one);
    memset(two, 0, sizeof two);
    rp_engine_stats s1, s2;
    run_mixed(0, 0, one, &s1);
    g_tp = 2;
    run_mixed(0, 0, two, &s2);
    g_tp = 0;
    assert_true(s2.masked_rows_device > 0);
    assert_int_equal(s2.masked_rows_host, 0);
    assert_int_equal(s2.masked_rows_device, s1.masked_rows_device);
    int complete = 0;
    for (int i = 0; i < CMP_N; i++) {
        const result *a = &one[i], *b = &two[i];
        if (b->n != a->n || memcmp(b->tokens, a->tokens, sizeof(int32_t) * (size_t)a->n))
            fail_msg("request %d: '%.*s' at --tp 2, '%.*s' at --tp 1", i, (int)b->text_len, b->text,
                     (int)a->text_len, a->text);
        assert_int_equal(b->finish, a->finish);
        for (int t = 0; t < a->n; t++)
            if (fabsf(b->logprobs[t] - a->logprobs[t]) > 1e-4f)
                fail_msg("request %d token %d: logprob %g at --tp 2, %g at --tp 1", i, t, b->logprobs[t],
                         a->logprobs[t]);
        if (i < KINDS * 4) {
            rp_constraint c = constraint(i % KINDS);
            check_output(&c, b, &complete);
        }
    }
    assert_true(complete > 0);
}

/* A constrained request with a repetition penalty is sampled on the host
 * (the penalty needs its history) beside ones whose masks go to the
 * backend; each output is in its language. */
static void test_device_masks_with_penalty(void **state) {
    (void)state;
    rp_engine *e = make_engine(0);
    static result res[4];
    memset(res, 0, sizeof res);
    rp_request_params p;
    rp_error err;
    rp_constraint c = constraint(0);
    for (int i = 0; i < 4; i++) {
        params(&p, &c, (uint64_t)i, 1.0f);
        if (i == 3) p.repetition_penalty = 1.3f;
        if (rp_engine_submit(e, &p, collect, &res[i], NULL, &err)) fail_msg("%s", err.message);
        if (i == 2) rp_engine_wait_idle(e); /* the first three alone: their masks on the device */
    }
    expect_pool_full(e);
    rp_engine_stats st;
    rp_engine_get_stats(e, &st);
    assert_true(st.masked_rows_device > 0 && st.masked_rows_host > 0);
    int complete = 0;
    for (int i = 0; i < 4; i++) check_output(&c, &res[i], &complete);
    rp_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constrained_batches),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_dead_end),
        cmocka_unit_test(test_bad_constraints),
        cmocka_unit_test(test_masked_logprobs),
        cmocka_unit_test(test_speculative_constrained),
        cmocka_unit_test(test_reasoning_first),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_device_masks_equal_host), cmocka_unit_test(test_tp_device_masks),
        cmocka_unit_test(test_device_masks_with_penalty),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
