/* Constrained generation over the schema corpus (tests/fixtures/structured/
 * schemas.json): GENS_PER_SCHEMA sampled generations for every schema (over
 * 1,000 in all), with the engine on the CPU backend and a tiny random model
 * over a printable-ASCII vocabulary (and a few UTF-8 bytes), compact
 * whitespace, and a logit bias towards the tokens that close things (`"`,
 * `}`, `]`, the end token; two strengths) so that random walks end well
 * within MAX_TOKENS (the longest output is about 500 bytes). Every output
 * must be complete (it stopped on the end token), parse as JSON (jansson),
 * and be accepted whole by a fresh matcher over single bytes; then regular
 * expressions checked with PCRE2 (a full match) and choice lists by exact
 * membership.
 *
 * The outputs are also written to structured_generations.json in the
 * working directory (the build directory under ctest), which
 * tests/cli_structured_ajv.sh validates against the schemas with ajv, a
 * validator independent of replay's grammar compiler. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <unistd.h>

#include "replay/engine.h"
#include "structured/structured.h"
#include "test_util.h"
#include "tiny_ascii_model.h"

enum { GENS_PER_SCHEMA = 10, MAX_TOKENS = 1024, WAVE = 128, TEXT_CAP = 8192 };

/* Schemas of the corpus a random walk cannot finish: the string must hold a
 * literal somewhere (an unanchored pattern), which random characters hit
 * about once in a million tokens. */
static const char *const NOT_GENERATED[][2] = {
    {"pattern-search", "an unanchored pattern ('ab+c') needs the literal somewhere"},
    {"pattern-suffix", "an unanchored pattern ('\\.json$') needs the literal at the end"},
};

static int not_generated(const char *name) {
    for (size_t i = 0; i < sizeof NOT_GENERATED / sizeof *NOT_GENERATED; i++)
        if (!strcmp(name, NOT_GENERATED[i][0])) return 1;
    return 0;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct gen {
    char text[TEXT_CAP];
    size_t len;
    int n_tokens;
    rp_finish finish;
    int finals;
} gen;

static void collect(void *user, const rp_token_event *ev) {
    gen *g = user;
    pthread_mutex_lock(&mu);
    if (ev->token >= 0) g->n_tokens++;
    if (ev->text_len && g->len + ev->text_len < sizeof g->text) {
        memcpy(g->text + g->len, ev->text, ev->text_len);
        g->len += ev->text_len;
    }
    if (ev->finish != RP_FINISH_REASON_NONE) {
        g->finish = ev->finish;
        g->finals++;
    }
    pthread_mutex_unlock(&mu);
}

/* ---- the tiny model: printable ASCII, a few multi-character tokens, <|end|> ---- */

enum { VOCAB = 128 };
static int g_end_id;
static int32_t g_bias_ids[4];
/* two strengths, alternating by seed: the weaker gives longer outputs */
static const float g_bias[2][4] = {{2.0f, 1.0f, 0.5f, 6.0f}, {0.5f, 0.0f, 0.0f, 3.0f}}; /* " } ] <|end|> */

/* tiny_ascii_model.h's alphabet, some multi-character tokens, and the bytes
 * of \u00fc, \u00ef and \u00e9 (C3, BC, AF, A9), as GPT-2's byte-level
 * alphabet spells them, so that keys and strings may hold them. */
static void write_model(const char *dir) {
    static const char *extra[] = {"true", "false", "null", "\":", "{\"", "\",\"", "12", "ab", "}]", "red", "re",
                                  "\xc3\x83", "\xc2\xbc", "\xc2\xaf", "\xc2\xa9"};
    g_end_id = tiny_ascii_model_write(dir, VOCAB, extra, sizeof extra / sizeof *extra);
    g_bias_ids[0] = '"' - 0x21, g_bias_ids[1] = '}' - 0x21, g_bias_ids[2] = ']' - 0x21, g_bias_ids[3] = g_end_id;
}

static char g_dir[] = "/tmp/rp_sgen_XXXXXX";

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

static rp_engine *make_engine(void) {
    rp_engine_config c;
    rp_engine_config_default(&c);
    c.model_dir = g_dir;
    c.load_dummy = 1;
    c.weight_seed = 11;
    c.device = "cpu";
    c.threads = 2;
    c.num_pages = 4096;
    c.max_running_requests = 64;
    c.max_batched_tokens = 1024;
    c.quiet_model_warning = 1;
    rp_error err;
    rp_engine *e = rp_engine_create(&c, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

static const int32_t PROMPT[] = {40, 41, 42, 43, 44};

/* Runs every constraint GENS_PER_SCHEMA times (seeds seed_base + i), WAVE
 * requests at a time; out[c * GENS_PER_SCHEMA + i]. */
static void generate(rp_engine *e, const rp_constraint *cs, int n, uint64_t seed_base, gen *out) {
    const int total = n * GENS_PER_SCHEMA;
    for (int first = 0; first < total; first += WAVE) {
        for (int k = first; k < total && k < first + WAVE; k++) {
            rp_request_params p;
            rp_request_params_default(&p);
            p.prompt_ids = PROMPT;
            p.num_prompt_ids = 5;
            p.max_tokens = MAX_TOKENS;
            p.temperature = 1.0f;
            p.seed = seed_base + (uint64_t)k;
            p.has_seed = 1;
            p.logit_bias_ids = g_bias_ids;
            p.logit_bias = g_bias[k % 2];
            p.num_logit_bias = 4;
            p.constraint = cs[k / GENS_PER_SCHEMA];
            rp_error err;
            if (rp_engine_submit(e, &p, collect, &out[k], NULL, &err)) fail_msg("submit: %s", err.message);
        }
        rp_engine_wait_idle(e);
    }
}

static rp_svocab *byte_vocab(void) {
    static char bytes[256];
    const char *ptrs[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, ptrs[i] = &bytes[i], lens[i] = 1;
    rp_err err;
    rp_svocab *v = rp_svocab_new(256, ptrs, lens, NULL, NULL, 0, &err);
    if (!v) fail_msg("%s", err.msg);
    return v;
}

/* A fresh matcher accepts the whole text. */
static int matcher_accepts(rp_svocab *v, rp_skind kind, const char *ctext, const char *text, size_t len) {
    rp_err err;
    rp_sopts so = {.allow_whitespace = 0};
    rp_sgrammar *g = rp_sgrammar_compile(v, kind, ctext, strlen(ctext), &so, &err);
    if (!g) fail_msg("%s", err.msg);
    rp_smatcher *m = rp_smatcher_new(g, &err);
    assert_non_null(m);
    int ok = len == 0 || rp_smatcher_accept_bytes(m, text, len) == 0;
    ok = ok && rp_smatcher_is_accepting(m);
    rp_smatcher_free(m);
    rp_sgrammar_release(g);
    return ok;
}

/* Common checks: one final event, stopped on the end token (complete), and
 * a fresh matcher accepts it. Returns the failures (printed). */
static int check_common(rp_svocab *v, rp_skind kind, const char *ctext, const char *name, const gen *g) {
    if (g->finals != 1 || g->finish != RP_FINISH_REASON_STOP) {
        print_error("%s: finish %d after %d tokens: '%.*s'\n", name, g->finish, g->n_tokens, (int)g->len, g->text);
        return 1;
    }
    if (!matcher_accepts(v, kind, ctext, g->text, g->len)) {
        print_error("%s: a fresh matcher refuses '%.*s'\n", name, (int)g->len, g->text);
        return 1;
    }
    return 0;
}

static void test_schema_corpus(void **state) {
    (void)state;
    char path[1024];
    test_path(path, sizeof path, "tests/fixtures/structured/schemas.json");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) fail_msg("%s: %s", path, je.text);
    json_t *schemas = json_object_get(root, "schemas");
    const int n = (int)json_array_size(schemas);
    assert_true(n >= 100);
    char **texts = calloc((size_t)n, sizeof *texts);
    rp_constraint *cs = calloc((size_t)n, sizeof *cs);
    gen *out = calloc((size_t)n * GENS_PER_SCHEMA, sizeof *out);
    assert_true(texts && cs && out);
    const char **names = calloc((size_t)n, sizeof *names);
    assert_non_null(names);
    int used = 0;
    for (int i = 0; i < n; i++) {
        json_t *s = json_array_get(schemas, (size_t)i);
        if (not_generated(json_string_value(json_object_get(s, "name")))) continue;
        names[used] = json_string_value(json_object_get(s, "name"));
        texts[used] = json_dumps(json_object_get(s, "schema"), JSON_COMPACT | JSON_ENCODE_ANY);
        cs[used] = (rp_constraint){.kind = RP_CONSTRAINT_JSON_SCHEMA, .text = texts[used], .param = "response_format"};
        used++;
    }
    assert_true(used >= 100);
    rp_engine *e = make_engine();
    generate(e, cs, used, 1000, out);
    rp_engine_destroy(e);

    rp_svocab *v = byte_vocab();
    json_t *written = json_array();
    int bad = 0, total = 0;
    for (int i = 0; i < used; i++) {
        const char *name = names[i];
        for (int s = 0; s < GENS_PER_SCHEMA; s++) {
            const gen *g = &out[i * GENS_PER_SCHEMA + s];
            total++;
            json_array_append_new(written, json_pack("{s:s, s:s%, s:b}", "schema", name, "text", g->text, g->len,
                                                     "complete", g->finish == RP_FINISH_REASON_STOP));
            if (check_common(v, RP_SKIND_JSON_SCHEMA, texts[i], name, g)) {
                bad++;
                continue;
            }
            /* integers as doubles: a random walk writes integers past int64 */
            json_t *j = json_loadb(g->text, g->len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
            if (!j && !strstr(je.text, "overflow")) { /* overflow: valid JSON past a double */
                print_error("%s: not JSON (%s): '%.*s'\n", name, je.text, (int)g->len, g->text);
                bad++;
            }
            json_decref(j);
        }
    }
    assert_int_equal(json_dump_file(written, "structured_generations.json", JSON_INDENT(1)), 0);
    print_message("%d schemas (%d of the corpus), %d generations, %d failed; written to structured_generations.json\n",
                  used, n, total, bad);
    json_decref(written);
    rp_svocab_free(v);
    for (int i = 0; i < used; i++) free(texts[i]);
    free(texts), free(cs), free(out), free(names);
    json_decref(root);
    if (bad) fail_msg("%d of %d generations failed", bad, total);
}

/* Regular expressions (a full match, by PCRE2) and choice lists (exact
 * membership). */
static const char *const REGEXES[] = {
    "[a-z]{2,5}@[a-z]{2,4}\\.(com|org)",
    "\\d{3}-\\d{4}",
    "(cat|dog|bird)s?",
    "#[0-9a-f]{6}",
    "[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6}){0,2}",
    "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,2})?",
    "(ab|cd)+x?",
    "[^\"]{1,8}",
};
static const char *const CHOICES[] = {
    "[\"red\", \"green\", \"blue sky\"]",
    "[\"yes\", \"no\"]",
    "[\"a\", \"ab\", \"abc\", \"abcd\"]",
    "[\"{\\\"x\\\":1}\", \"[1,2]\", \"null\"]",
};

static void test_regex_choice(void **state) {
    (void)state;
    enum { NR = sizeof REGEXES / sizeof *REGEXES, NC = sizeof CHOICES / sizeof *CHOICES };
    rp_constraint cs[NR + NC];
    for (int i = 0; i < NR; i++) cs[i] = (rp_constraint){.kind = RP_CONSTRAINT_REGEX, .text = REGEXES[i]};
    for (int i = 0; i < NC; i++) cs[NR + i] = (rp_constraint){.kind = RP_CONSTRAINT_CHOICE, .text = CHOICES[i]};
    gen *out = calloc((NR + NC) * GENS_PER_SCHEMA, sizeof *out);
    assert_non_null(out);
    rp_engine *e = make_engine();
    generate(e, cs, NR + NC, 5000, out);
    rp_engine_destroy(e);
    rp_svocab *v = byte_vocab();
    int bad = 0;
    for (int i = 0; i < NR + NC; i++) {
        pcre2_code *re = NULL;
        json_t *list = NULL;
        if (i < NR) {
            int ec;
            PCRE2_SIZE eo;
            const uint32_t flags = PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF; /* UTF: counts are characters */
            re = pcre2_compile((PCRE2_SPTR)REGEXES[i], PCRE2_ZERO_TERMINATED, flags, &ec, &eo, NULL);
            assert_non_null(re);
        } else {
            list = json_loads(CHOICES[i - NR], 0, NULL);
            assert_non_null(list);
        }
        for (int s = 0; s < GENS_PER_SCHEMA; s++) {
            const gen *g = &out[i * GENS_PER_SCHEMA + s];
            if (check_common(v, i < NR ? RP_SKIND_REGEX : RP_SKIND_CHOICE, cs[i].text, cs[i].text, g)) {
                bad++;
                continue;
            }
            int ok = 0;
            if (re) {
                pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
                ok = pcre2_match(re, (PCRE2_SPTR)g->text, g->len, 0, 0, md, NULL) >= 0;
                pcre2_match_data_free(md);
            } else {
                size_t k;
                json_t *c;
                json_array_foreach(list, k, c) ok |= json_string_length(c) == g->len &&
                                                     !memcmp(json_string_value(c), g->text, g->len);
            }
            if (!ok) {
                print_error("%s: '%.*s' is not %s\n", cs[i].text, (int)g->len, g->text,
                            re ? "a full match (PCRE2)" : "one of the choices");
                bad++;
            }
        }
        pcre2_code_free(re);
        json_decref(list);
    }
    rp_svocab_free(v);
    free(out);
    if (bad) fail_msg("%d regex and choice generations failed", bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_corpus),
        cmocka_unit_test(test_regex_choice),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
