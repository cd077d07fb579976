/* Structured output (src/structured): GBNF parsing and its errors; regex,
 * choice and JSON Schema grammars accepting and rejecting strings (against
 * PCRE2 for regexes and an independent little validator for schemas, on
 * strings the grammars generate and on random ones); token masks against a
 * brute force (every token tried byte by byte) on walks with a synthetic
 * vocabulary and the real Qwen3 one; UTF-8 characters split across tokens,
 * recursion, rollback, and the refusals that name their keyword. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <math.h>
#include <pcre2.h>

#include "structured/structured.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* ---- vocabularies ---- */

static int synth_extra_base;
static rp_svocab *synth_vocab(int *n_out) {
    /* every 1- and 2-byte string over a small alphabet, some 3-byte ones, the
     * UTF-8 pieces of é (C3 A9) and 😀 (F0 9F 98 80), and two specials (eos last) */
    static const char alpha[] = "ab01{}[]\":,. -\\etrunlfsx";
    int na = (int)strlen(alpha);
    int cap = 4096, n = 0;
    char **toks = malloc((size_t)cap * sizeof *toks);
    size_t *lens = malloc((size_t)cap * sizeof *lens);
    for (int i = 0; i < na; i++) toks[n] = strndup(alpha + i, 1), lens[n++] = 1;
    for (int i = 0; i < na; i++)
        for (int k = 0; k < na; k++) {
            char b[2] = {alpha[i], alpha[k]};
            toks[n] = strndup(b, 2), lens[n++] = 2;
        }
    synth_extra_base = n;
    static const char *const extra[] = {"true", "false", "null", "\":\"", "\",\"", "abc", "123", "\xC3", "\xA9",
                                        "\xC3\xA9", "a\xC3", "\xA9\"", "\xF0\x9F", "\x98\x80", "\xF0\x9F\x98\x80", "\xF0",
                                        "\x9F\x98", "\x80\"", "{\"", "\"}", "\"]", "[\"", "1.5", "e+", "-1"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) toks[n] = strdup(extra[i]), lens[n++] = strlen(extra[i]);
    toks[n] = strdup("<special>"), lens[n++] = 9;
    toks[n] = strdup("<eos>"), lens[n++] = 5;
    uint8_t *special = calloc((size_t)n, 1);
    special[n - 2] = special[n - 1] = 1;
    int32_t eos = n - 1;
    rp_err err = {0};
    rp_svocab *v = rp_svocab_new(n, (const char *const *)toks, lens, special, &eos, 1, &err);
    if (!v) fail_msg("%s", err.msg);
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks), free(lens), free(special);
    *n_out = n;
    return v;
}

static rp_tokenizer *qwen_tok;
static rp_svocab *qwen_vocab;
static int32_t qwen_eos;

static rp_svocab *qwen(void) {
    if (qwen_vocab) return qwen_vocab;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/qwen3", test_source_dir());
    rp_err err = {0};
    qwen_tok = rp_tokenizer_load(dir, &err);
    if (!qwen_tok) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    int n = rp_tokenizer_vocab_size(qwen_tok);
    const char **b = calloc((size_t)n, sizeof *b);
    size_t *l = calloc((size_t)n, sizeof *l);
    uint8_t *sp = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        if (rp_tokenizer_token_bytes(qwen_tok, i, &b[i], &l[i])) b[i] = NULL, l[i] = 0;
        sp[i] = (uint8_t)rp_tokenizer_is_special(qwen_tok, i);
    }
    qwen_eos = rp_tokenizer_token_id(qwen_tok, "<|im_end|>");
    assert_true(qwen_eos >= 0);
    qwen_vocab = rp_svocab_new(n, b, l, sp, &qwen_eos, 1, &err);
    if (!qwen_vocab) fail_msg("%s", err.msg);
    free(b), free(l), free(sp);
    return qwen_vocab;
}

static rp_sgrammar *compile_ok(rp_svocab *v, rp_skind kind, const char *text, int ws) {
    rp_err err = {0};
    rp_sopts o = {.allow_whitespace = ws};
    rp_sgrammar *g = rp_sgrammar_compile(v, kind, text, strlen(text), &o, &err);
    if (!g) fail_msg("compile failed for %s: %s", text, err.msg);
    return g;
}

static void compile_err(rp_svocab *v, rp_skind kind, const char *text, const char *want) {
    rp_err err = {0};
    rp_sgrammar *g = rp_sgrammar_compile(v, kind, text, strlen(text), NULL, &err);
    if (g) fail_msg("expected an error containing '%s' for %s; got grammar\n%s", want, text, rp_sgrammar_gbnf(g));
    if (!strstr(err.msg, want)) fail_msg("error for %s: '%s' does not contain '%s'", text, err.msg, want);
}

/* Whether the grammar accepts s exactly. */
static int accepts(rp_sgrammar *g, const char *s, size_t n) {
    rp_err err = {0};
    rp_smatcher *m = rp_smatcher_new(g, &err);
    assert_non_null(m);
    int ok = rp_smatcher_accept_bytes(m, s, n) == 0 && rp_smatcher_is_accepting(m);
    rp_smatcher_free(m);
    return ok;
}

/* A random string of the grammar's language, made byte by byte; NULL when
 * the walk did not finish within max bytes. */
static char *generate(rp_sgrammar *g, int max, double stop_p) {
    rp_err err = {0};
    rp_smatcher *m = rp_smatcher_new(g, &err);
    char *out = malloc((size_t)max + 1);
    int n = 0;
    while (n < max) {
        if (rp_smatcher_is_accepting(m) && (rnd() % 1000) < stop_p * 1000) break;
        int ok[256], nok = 0;
        for (int b = 1; b < 256; b++) { /* not NUL: the strings are C strings */
            char c = (char)b;
            if (!rp_smatcher_accept_bytes(m, &c, 1)) {
                ok[nok++] = b;
                rp_smatcher_rollback(m, 1);
            }
        }
        if (!nok) break;
        /* prefer ASCII so that strings stay readable, but take any */
        int pick = ok[rnd() % (uint32_t)nok];
        if (pick >= 0x80 && rnd() % 4) {
            for (int t = 0; t < 4; t++) {
                int c2 = ok[rnd() % (uint32_t)nok];
                if (c2 < 0x80) pick = c2;
            }
        }
        char c = (char)pick;
        assert_int_equal(rp_smatcher_accept_bytes(m, &c, 1), 0);
        out[n++] = c;
    }
    int acc = rp_smatcher_is_accepting(m);
    rp_smatcher_free(m);
    if (!acc) {
        free(out);
        return NULL;
    }
    out[n] = 0;
    return out;
}

/* ---- GBNF ---- */

static void test_gbnf_errors(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    compile_err(v, RP_SKIND_GBNF, "", "empty");
    compile_err(v, RP_SKIND_GBNF, "rot ::= \"a\"", "no rule named 'root'");
    compile_err(v, RP_SKIND_GBNF, "root ::= x", "1:10: rule 'x' is used but never defined");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\" x\n", "rule 'x' is used but never defined");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\n", "1:10: unterminated string literal");
    compile_err(v, RP_SKIND_GBNF, "root ::= [ab\n", "unterminated character class");
    compile_err(v, RP_SKIND_GBNF, "root ::= [z-a]", "out of order");
    compile_err(v, RP_SKIND_GBNF, "root ::= (\"a\"", "unclosed '('");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\")", "unmatched ')'");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\"{3,1}", "max < min");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"\\q\"", "unknown escape");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\"\nroot ::= \"b\"", "2:1: rule 'root' is defined twice");
    compile_err(v, RP_SKIND_GBNF, "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "left recursion (expr -> expr)");
    compile_err(v, RP_SKIND_GBNF, "root ::= a\na ::= b? \"x\" | \"y\"\nb ::= a", "left recursion");
    compile_err(v, RP_SKIND_GBNF, "root ::= a\na ::= \"x\" a", "matches no string");
    compile_err(v, RP_SKIND_GBNF, "root ::= (\"a\"*)* \"b\"", "repetition whose body can match the empty string");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\" @", "1:14: unexpected '@'");
    { /* a chain of 20,000 rules: parsed and checked in linear time, no deep recursion */
        char *chain = malloc(1 << 20);
        size_t off = (size_t)sprintf(chain, "root ::= r0\n");
        for (int i = 0; i < 20000; i++) off += (size_t)sprintf(chain + off, "r%d ::= \"a\" r%d | \"b\"\n", i, i + 1);
        sprintf(chain + off, "r20000 ::= \"c\"\n");
        rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF, chain, 0);
        assert_true(accepts(g, "aab", 3));
        assert_false(accepts(g, "aa", 2));
        rp_sgrammar_release(g);
        free(chain);
    }
    { /* an ambiguous grammar doubling its hypotheses every byte: dead past the cap, not a hang */
        rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF, "root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | \"\"", 0);
        assert_true(accepts(g, "aaabcb", 6));
        assert_false(accepts(g, "aaabc", 5));
        char many[64];
        memset(many, 'a', 40);
        rp_err err = {0};
        rp_smatcher *m = rp_smatcher_new(g, &err);
        assert_int_equal(rp_smatcher_accept_bytes(m, many, 40), -1);
        rp_smatcher_free(m);
        rp_sgrammar_release(g);
    }
    { /* a user rule named like an auxiliary one stays the user's */
        rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF, "root ::= (\"a\" | \"b\")+ root-1\nroot-1 ::= \"c\"", 0);
        assert_true(accepts(g, "abac", 4));
        assert_false(accepts(g, "aba", 3));
        rp_sgrammar_release(g);
    }
    compile_err(v, RP_SKIND_GBNF, "root ::= [^\\u0000-\\U0010FFFF]", "matches no character");
    compile_err(v, RP_SKIND_GBNF, "root ::= \"a\"{999999999}", "too large");
    rp_svocab_free(v);
}

static void test_gbnf_language(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF,
                                "# arithmetic, recursive\n"
                                "root ::= expr\n"
                                "expr ::= term (\"+\" term)*\n"
                                "term ::= num | \"(\" expr \")\"\n"
                                "num  ::= [0-9]+ (\".\" [0-9]{1,2})?\n",
                                0);
    const char *yes[] = {"1", "1+2", "(1+2)+3", "((((1))))", "12.5+(3.25+4)", "(1+(2+(3+(4+(5)))))"};
    const char *no[] = {"", "+", "1+", "(1", "1)", "1.", "1.234", "()", "1++2", "a"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (!accepts(g, yes[i], strlen(yes[i]))) fail_msg("rejects %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (accepts(g, no[i], strlen(no[i]))) fail_msg("accepts %s", no[i]);
    /* deep recursion */
    char deep[4100];
    int d = 2000;
    for (int i = 0; i < d; i++) deep[i] = '(';
    deep[d] = '7';
    for (int i = 0; i < d; i++) deep[d + 1 + i] = ')';
    assert_true(accepts(g, deep, (size_t)(2 * d + 1)));
    assert_false(accepts(g, deep, (size_t)(2 * d)));
    rp_sgrammar_release(g);
    /* classes over code points, negation, dot, repetition counts, alternatives over lines */
    g = compile_ok(v, RP_SKIND_GBNF,
                   "root ::= [a-zé]{2,3} \"-\" [^a-z\\n] . x\n"
                   "x ::= \"!\"\n"
                   "   | \"?\" # comment\n"
                   "   | \"\\u00e9\\x41\"\n",
                   0);
    const char *yes2[] = {"ab-Z.!", "éé-😀x?", "abé-1\néA", "zz-\xE4\xB8\xAD" "a!"};
    const char *no2[] = {"a-Z.!", "abcd-Z.!", "ab-a.!", "ab-\n.!", "ab-Z.", "ab-Z\xC3!", "ab-Z.\xFF!"};
    for (size_t i = 0; i < sizeof yes2 / sizeof *yes2; i++)
        if (!accepts(g, yes2[i], strlen(yes2[i]))) fail_msg("rejects %s", yes2[i]);
    for (size_t i = 0; i < sizeof no2 / sizeof *no2; i++)
        if (accepts(g, no2[i], strlen(no2[i]))) fail_msg("accepts %s", no2[i]);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
}

/* ---- regex against PCRE2 ---- */

static int pcre_full(const char *re, const char *s, size_t n) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                                  &ec, &eo, NULL);
    if (!c) fail_msg("pcre2 cannot compile %s", re);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

static void test_regex(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    static const char *const res[] = {
        "abc",
        "a|b|cd",
        "a*b+c?",
        "(ab|cd){2,3}e",
        "[a-c]{1,4}x?",
        "[^abc]+",
        "\\d{3}-\\d{4}",
        "\\w+@\\w+\\.(com|org)",
        "(?:a|b)*c",
        "(?P<year>\\d{4})-(?<m>\\d\\d)",
        "\\s*x\\s*",
        ".{2}",
        "[\\d\\s.-]+",
        "^a(b|c)*$",
        "(a|ab)(c|bcd)(d*)",
        "é+[α-ω]?",
        "\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\",
        "x{3}y{0,2}z{2,}",
        "[^\\d\\s]{1,3}",
        "-?(0|[1-9]\\d*)(\\.\\d+)?",
        "a{5,8}b{6}",
        "(ab|c){3,6}d{7,}",
        "[0-9a]{0,9}x?",
    };
    static const char alphabet[] = "abcdexyz0123456789 -.@\t\n*+?()[]{}|\\aaaabbbbbbbcdddddd";
    for (size_t r = 0; r < sizeof res / sizeof *res; r++) {
        rp_sgrammar *g = compile_ok(v, RP_SKIND_REGEX, res[r], 0);
        /* strings the grammar generates: PCRE2 must match them */
        for (int k = 0; k < 40; k++) {
            char *s = generate(g, 40, 0.3);
            if (!s) continue;
            if (!pcre_full(res[r], s, strlen(s))) fail_msg("regex %s: generated '%s' which PCRE2 rejects", res[r], s);
            free(s);
        }
        /* random strings: the two must agree */
        for (int k = 0; k < 400; k++) {
            char s[32];
            int len = (int)(rnd() % (k % 2 ? 10 : 24));
            for (int i = 0; i < len; i++) s[i] = alphabet[rnd() % (sizeof alphabet - 1)];
            if (k % 4 == 0 && len >= 2) s[0] = res[r][0] == '^' ? res[r][1] : res[r][0];
            s[len] = 0;
            int want = pcre_full(res[r], s, (size_t)len), got = accepts(g, s, (size_t)len);
            if (want != got) fail_msg("regex %s on '%s': PCRE2 %d, grammar %d", res[r], s, want, got);
        }
        rp_sgrammar_release(g);
    }
    compile_err(v, RP_SKIND_REGEX, "(a)\\1", "backreferences");
    compile_err(v, RP_SKIND_REGEX, "a(?=b)", "lookahead and lookbehind");
    compile_err(v, RP_SKIND_REGEX, "(?<!a)b", "lookahead and lookbehind");
    compile_err(v, RP_SKIND_REGEX, "\\bword", "word boundaries");
    compile_err(v, RP_SKIND_REGEX, "(?i)abc", "inline flags");
    compile_err(v, RP_SKIND_REGEX, "a*+", "possessive");
    compile_err(v, RP_SKIND_REGEX, "*a", "nothing to repeat");
    compile_err(v, RP_SKIND_REGEX, "(ab", "missing ')'");
    compile_err(v, RP_SKIND_REGEX, "ab)", "unmatched ')'");
    compile_err(v, RP_SKIND_REGEX, "a^b", "anchor ^");
    compile_err(v, RP_SKIND_REGEX, "\\p{L}", "Unicode property");
    rp_svocab_free(v);
}

static void test_choice(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    rp_sgrammar *g = compile_ok(v, RP_SKIND_CHOICE, "[\"yes\", \"no\", \"not sure\", \"n\\\"q\"]", 0);
    assert_true(accepts(g, "yes", 3));
    assert_true(accepts(g, "no", 2));
    assert_true(accepts(g, "not sure", 8));
    assert_true(accepts(g, "n\"q", 3));
    assert_false(accepts(g, "n", 1));
    assert_false(accepts(g, "yess", 4));
    rp_sgrammar_release(g);
    compile_err(v, RP_SKIND_CHOICE, "[]", "non-empty array");
    compile_err(v, RP_SKIND_CHOICE, "[1]", "not a string");
    compile_err(v, RP_SKIND_CHOICE, "nope", "not JSON");
    rp_svocab_free(v);
}

/* ---- JSON Schema: an independent validator for what the tests use ---- */

static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int validate(json_t *root, json_t *s, json_t *x);
/* 0 while checking allOf branches: their extra keys are checked against the
 * union of the branches' properties instead (the merged schema, strict). */
static int strict_props = 1;

static json_t *vresolve(json_t *root, const char *ref) {
    if (!strcmp(ref, "#")) return root;
    const char *name = strrchr(ref, '/') + 1;
    json_t *defs = json_object_get(root, strstr(ref, "definitions") ? "definitions" : "$defs");
    return json_object_get(defs, name);
}

static int type_ok(const char *t, json_t *x) {
    if (!strcmp(t, "object")) return json_is_object(x);
    if (!strcmp(t, "array")) return json_is_array(x);
    if (!strcmp(t, "string")) return json_is_string(x);
    if (!strcmp(t, "integer")) return json_is_integer(x);
    if (!strcmp(t, "number")) return json_is_number(x);
    if (!strcmp(t, "boolean")) return json_is_boolean(x);
    return json_is_null(x);
}

static int validate(json_t *root, json_t *s, json_t *x) {
    if (json_is_true(s)) return 1;
    json_t *v;
    if ((v = json_object_get(s, "$ref"))) return validate(root, vresolve(root, json_string_value(v)), x);
    if ((v = json_object_get(s, "type"))) {
        int ok = 0;
        if (json_is_string(v)) ok = type_ok(json_string_value(v), x);
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) ok |= type_ok(json_string_value(t), x);
        if (!ok) return 0;
    }
    if ((v = json_object_get(s, "const")) && !json_equal(v, x)) return 0;
    if ((v = json_object_get(s, "enum"))) {
        int ok = 0;
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) ok |= json_equal(t, x);
        if (!ok) return 0;
    }
    if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf"))) {
        int ok = 0;
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) ok += validate(root, t, x);
        if (!ok || (json_object_get(s, "oneOf") && ok != 1)) return 0;
    }
    if ((v = json_object_get(s, "allOf"))) {
        size_t i;
        json_t *t;
        int saved = strict_props;
        strict_props = 0;
        int ok = 1;
        json_array_foreach(v, i, t) ok &= validate(root, t, x);
        strict_props = saved;
        if (!ok) return 0;
        if (json_is_object(x)) {
            const char *k;
            json_t *val;
            json_object_foreach(x, k, val) {
                int known = 0;
                json_array_foreach(v, i, t) known |= json_object_get(json_object_get(t, "properties"), k) != NULL;
                if (!known) return 0;
            }
        }
    }
    if (json_is_number(x)) {
        double d = json_number_value(x);
        if ((v = json_object_get(s, "minimum")) && d < json_number_value(v)) return 0;
        if ((v = json_object_get(s, "maximum")) && d > json_number_value(v)) return 0;
        if ((v = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(v)) return 0;
        if ((v = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(v)) return 0;
    }
    if (json_is_string(x)) {
        size_t len = utf8_len(json_string_value(x));
        if ((v = json_object_get(s, "minLength")) && len < (size_t)json_integer_value(v)) return 0;
        if ((v = json_object_get(s, "maxLength")) && len > (size_t)json_integer_value(v)) return 0;
        if ((v = json_object_get(s, "pattern"))) {
            char re[512];
            snprintf(re, sizeof re, "(?s:.*(?:%s).*)", json_string_value(v));
            if (!pcre_full(re, json_string_value(x), json_string_length(x))) return 0;
        }
    }
    if (json_is_array(x)) {
        size_t n = json_array_size(x), k = 0;
        if ((v = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(v)) return 0;
        if ((v = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(v)) return 0;
        json_t *pre = json_object_get(s, "prefixItems");
        for (; pre && k < json_array_size(pre) && k < n; k++)
            if (!validate(root, json_array_get(pre, k), json_array_get(x, k))) return 0;
        json_t *items = json_object_get(s, "items");
        for (; items && k < n; k++)
            if (json_is_false(items) || !validate(root, items, json_array_get(x, k))) return 0;
    }
    if (json_is_object(x)) {
        json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *val;
        json_object_foreach(x, k, val) {
            json_t *ps = json_object_get(props, k);
            if (ps) {
                if (!validate(root, ps, val)) return 0;
            } else if (!addl && (!props || !strict_props)) {
                continue; /* no properties declared: any keys */
            } else if (!addl || json_is_false(addl)) return 0; /* absent = false (strict) */
            else if (!validate(root, addl, val)) return 0;
        }
        size_t i;
        json_t *r;
        json_array_foreach(json_object_get(s, "required"), i, r) if (!json_object_get(x, json_string_value(r))) return 0;
    }
    return 1;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,"
    "\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}",
    "{\"type\":\"integer\",\"exclusiveMinimum\":99,\"exclusiveMaximum\":1001}",
    "{\"type\":\"integer\",\"minimum\":-5}",
    "{\"type\":\"integer\",\"maximum\":-20}",
    "{\"type\":\"number\",\"minimum\":0,\"maximum\":10}",
    "{\"type\":\"number\",\"exclusiveMinimum\":2,\"exclusiveMaximum\":4}",
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]+-\\\\d{2}$\"}",
    "{\"type\":\"string\",\"pattern\":\"ab\\\"c\"}",
    "{\"type\":\"string\",\"format\":\"date\"}",
    "{\"type\":\"string\",\"format\":\"date-time\"}",
    "{\"type\":\"string\",\"format\":\"time\"}",
    "{\"type\":\"string\",\"format\":\"uuid\"}",
    "{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1,2]}]}",
    "{\"const\":\"fixed\"}",
    "{\"type\":[\"string\",\"null\",\"boolean\"]}",
    "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3}]}",
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},"
    "\"required\":[\"kind\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"boolean\"}},"
    "\"required\":[\"kind\",\"y\"]}]}",
    "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
    "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":["
    "{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}",
    "{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},"
    "{\"type\":\"integer\"}],\"items\":false,\"minItems\":1}},\"required\":[\"t\"]}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"object\","
    "\"properties\":{\"c\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"d\":{\"enum\":[1,2]}},"
    "\"required\":[\"d\"]}}},\"required\":[\"c\"]}},\"required\":[\"b\"]}},\"required\":[\"a\"]}",
    "{\"type\":\"object\",\"properties\":{\"opt1\":{\"type\":\"null\"},\"opt2\":{\"type\":\"boolean\"},\"opt3\":{\"type\":\"string\",\"maxLength\":2}}}",
    "{\"type\":\"array\"}",
    "{}",
    "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"}},\"required\":[\"s\"],\"additionalProperties\":true}",
    "{\"type\":\"string\",\"minLength\":12,\"maxLength\":30}",
    "{\"type\":\"array\",\"items\":{\"enum\":[1,22,\"ab\"]},\"minItems\":12,\"maxItems\":30}",
};

static void check_schema_strings(rp_sgrammar *g, json_t *schema, const char *text, int ws) {
    for (int k = 0; k < 60; k++) {
        char *s = generate(g, 300, 0.25);
        if (!s) continue;
        json_error_t je;
        json_t *x = json_loads(s, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
        if (!x && (strstr(je.text, "overflow") || strstr(je.text, "too big"))) { /* jansson's doubles: 1e999 is JSON all the same */
            free(s);
            continue;
        }
        if (!x) fail_msg("schema %s: generated '%s' which is not JSON (%s)", text, s, je.text);
        if (!validate(schema, schema, x)) fail_msg("schema %s: generated '%s' which does not validate", text, s);
        /* and the compact re-serialisation must be accepted too */
        char *c = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!accepts(g, c, strlen(c))) fail_msg("schema %s: rejects its own instance re-serialised: %s", text, c);
        if (!ws) { /* compact: no whitespace outside strings */
            int in_str = 0;
            for (const char *q = s; *q; q++) {
                if (in_str && *q == '\\') q++;
                else if (*q == '"') in_str = !in_str;
                else if (!in_str && strchr(" \t\n\r", *q)) fail_msg("schema %s: compact mode produced '%s'", text, s);
            }
        }
        free(c);
        json_decref(x);
        /* mutations: whatever the grammar still accepts must parse and validate */
        size_t len = strlen(s);
        static const char junk[] = "\"{}[],:0123456789.-eEtfnul\\ xaé";
        for (int k2 = 0; k2 < 12 && len; k2++) {
            char mut[400];
            size_t at = rnd() % len, ml;
            int kind = (int)(rnd() % 3);
            if (kind == 0) { /* delete a byte */
                memcpy(mut, s, at), memcpy(mut + at, s + at + 1, len - at - 1), ml = len - 1;
            } else { /* replace or insert one */
                char ch = junk[rnd() % (sizeof junk - 1)];
                memcpy(mut, s, at), mut[at] = ch;
                size_t rest = kind == 1 ? at + 1 : at;
                memcpy(mut + at + 1, s + rest, len - rest), ml = at + 1 + len - rest;
            }
            mut[ml] = 0;
            if (!accepts(g, mut, ml)) continue;
            json_t *y = json_loadb(mut, ml, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
            if (!y && (strstr(je.text, "overflow") || strstr(je.text, "too big"))) continue;
            if (!y) fail_msg("schema %s: accepts the mutation '%s', not JSON (%s)", text, mut, je.text);
            if (!validate(schema, schema, y)) fail_msg("schema %s: accepts the mutation '%s', which does not validate", text, mut);
            json_decref(y);
        }
        free(s);
    }
}

static void test_json_schema(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        json_error_t je;
        json_t *schema = json_loads(schemas[i], 0, &je);
        assert_non_null(schema);
        for (int ws = 0; ws < 2; ws++) {
            rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, schemas[i], ws);
            check_schema_strings(g, schema, schemas[i], ws);
            rp_sgrammar_release(g);
        }
        json_decref(schema);
    }
    /* hand-written instances */
    static const struct {
        int schema;
        const char *inst;
        int ok;
    } cases[] = {
        {0, "{\"name\":\"Al\",\"age\":30}", 1},
        {0, "{\"name\":\"Al\",\"age\":30,\"email\":\"a.b@c.org\"}", 1},
        {0, "{\"name\":\"Al\",\"age\":151}", 0},
        {0, "{\"name\":\"Al\",\"age\":-1}", 0},
        {0, "{\"age\":30}", 0},
        {0, "{\"name\":\"Al\",\"age\":30,\"extra\":1}", 0},
        {0, "{\"name\":\"Al\",\"age\":30,\"email\":\"nope\"}", 0},
        {0, "{\"name\":\"Al\",\"age\":007}", 0},
        {1, "[]", 0},
        {1, "[1,2.5,-3e2,4]", 1},
        {1, "[1,2,3,4,5]", 0},
        {2, "-37", 1}, {2, "-38", 0}, {2, "1234", 1}, {2, "1235", 0}, {2, "0", 1}, {2, "-0", 0}, {2, "999", 1},
        {3, "99", 0}, {3, "100", 1}, {3, "1000", 1}, {3, "1001", 0},
        {4, "-5", 1}, {4, "-6", 0}, {4, "123456789", 1},
        {5, "-20", 1}, {5, "-19", 0}, {5, "-100000", 1}, {5, "0", 0},
        {6, "0", 1}, {6, "10", 1}, {6, "10.0", 1}, {6, "10.5", 0}, {6, "9.99", 1}, {6, "-1", 0}, {6, "11", 0},
        {7, "2", 0}, {7, "2.01", 1}, {7, "3.9", 1}, {7, "4", 0}, {7, "4.0", 0},
        {8, "\"\\ud83d\\ude00\"", 0}, {8, "\"a\\ud83d\\ude00\"", 1}, {8, "\"a\\ud83d\"", 0}, {8, "\"a\\udc00b\"", 0},
        {8, "\"a\"", 0}, {8, "\"ab\"", 1}, {8, "\"abcde\"", 1}, {8, "\"abcdef\"", 0}, {8, "\"éé\"", 1},
        {9, "\"abc-12\"", 1}, {9, "\"abc-1\"", 0}, {9, "\"-12\"", 0},
        {10, "\"xxab\\\"cyy\"", 1}, {10, "\"abc\"", 0},
        {11, "\"2024-02-29\"", 1}, {11, "\"2024-13-01\"", 0},
        {12, "\"2024-02-29T12:30:00Z\"", 1}, {12, "\"2024-02-29T25:30:00Z\"", 0},
        {14, "\"123e4567-e89b-12d3-a456-426614174000\"", 1}, {14, "\"123e4567-e89b-12d3-a456\"", 0},
        {15, "\"red\"", 1}, {15, "{\"a\":[1,2]}", 1}, {15, "null", 1}, {15, "\"blue\"", 0}, {15, "2", 0},
        {16, "\"fixed\"", 1}, {16, "\"fixe\"", 0},
        {18, "12", 1}, {18, "\"abc\"", 1}, {18, "\"abcd\"", 0},
        {19, "{\"kind\":\"a\",\"x\":1}", 1}, {19, "{\"kind\":\"b\",\"y\":true}", 1}, {19, "{\"kind\":\"b\"}", 0},
        {20, "{\"a\":1,\"b\":\"x\"}", 1}, {20, "{\"a\":1}", 0},
        {21, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", 1}, {21, "{\"v\":1,\"next\":{\"v\":2}}", 0},
        {22, "{\"id\":1,\"x\":true,\"y\":false}", 1}, {22, "{\"id\":1,\"id\":true}", 0}, {22, "{\"x\":1}", 0},
        {22, "{\"idx\":true}", 1}, {22, "{\"i\":true}", 1},
        {23, "{\"t\":[\"a\"]}", 1}, {23, "{\"t\":[\"a\",1]}", 1}, {23, "{\"t\":[\"a\",1,2]}", 0}, {23, "{\"t\":[]}", 0},
        {25, "{}", 1}, {25, "{\"opt2\":true}", 1}, {25, "{\"opt1\":null,\"opt3\":\"ab\"}", 1}, {25, "{\"opt3\":\"abc\"}", 0},
        {25, "{,\"opt2\":true}", 0},
        {27, "{\"x\":[{\"y\":null}]}", 1}, {27, "\"s\"", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, schemas[cases[i].schema], 0);
        if (accepts(g, cases[i].inst, strlen(cases[i].inst)) != cases[i].ok)
            fail_msg("schema %d on %s: expected %s", cases[i].schema, cases[i].inst, cases[i].ok ? "accept" : "reject");
        rp_sgrammar_release(g);
    }
    /* whitespace flag */
    rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, schemas[0], 1);
    const char *spaced = "{ \"name\" : \"Al\" ,\n  \"age\" : 3 }";
    assert_true(accepts(g, spaced, strlen(spaced)));
    rp_sgrammar_release(g);
    g = compile_ok(v, RP_SKIND_JSON_SCHEMA, schemas[0], 0);
    assert_false(accepts(g, spaced, strlen(spaced)));
    rp_sgrammar_release(g);
    /* json_object */
    g = compile_ok(v, RP_SKIND_JSON_OBJECT, "", 0);
    const char *obj = "{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\"}";
    assert_true(accepts(g, obj, strlen(obj)));
    assert_false(accepts(g, "[1]", 3));
    assert_false(accepts(g, "{\"a\":1,}", 8));
    rp_sgrammar_release(g);
    /* refusals name the keyword */
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties'");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"not\":{}}", "'not'");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":2}", "'multipleOf'");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"hostname\"}", "format 'hostname'");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":-1.5}", "minimum on a number");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", "pattern with minLength");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"$ref\":\"#\"}", "matches no string");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "range is empty");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"enum\":[1,2],\"type\":\"string\"}", "enum: no value");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "no common member");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "false", "matches nothing");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":", "not JSON");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"strin\"}", "type 'strin'");
    compile_err(v, RP_SKIND_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences");
    /* limits */
    {
        char *deep = malloc(20000);
        size_t off = 0;
        for (int i = 0; i < 100; i++) off += (size_t)sprintf(deep + off, "{\"type\":\"array\",\"items\":");
        off += (size_t)sprintf(deep + off, "{\"type\":\"null\"}");
        for (int i = 0; i < 100; i++) deep[off++] = '}';
        deep[off] = 0;
        compile_err(v, RP_SKIND_JSON_SCHEMA, deep, "nested too deeply");
        free(deep);
    }
    rp_err err = {0};
    rp_sopts small = {.max_elements = 2000};
    char *big = malloc(20000);
    size_t off = (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 400; i++) off += (size_t)sprintf(big + off, "%s\"value-%d\"", i ? "," : "", i);
    sprintf(big + off, "]}");
    assert_null(rp_sgrammar_compile(v, RP_SKIND_JSON_SCHEMA, big, strlen(big), &small, &err));
    assert_non_null(strstr(err.msg, "too large"));
    free(big);
    /* long counts are one counted element, not thousands of rules */
    const char *counted = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":3,\"maxItems\":5000}";
    rp_sgrammar *cg = rp_sgrammar_compile(v, RP_SKIND_JSON_SCHEMA, counted, strlen(counted), &small, &err);
    assert_non_null(cg);
    assert_true(accepts(cg, "[1,2,3]", 7));
    assert_false(accepts(cg, "[1,2]", 5));
    char *many = malloc(20000);
    off = 0;
    many[off++] = '[';
    for (int i = 0; i < 5001; i++) off += (size_t)sprintf(many + off, "%s%d", i ? "," : "", i % 10);
    many[off++] = ']';
    assert_false(accepts(cg, many, off)); /* 5001 items */
    memmove(many + off - 3, "]", 1);      /* 5000 items: drop ",0" at the end */
    assert_true(accepts(cg, many, off - 2));
    free(many);
    rp_sgrammar_release(cg);
    rp_svocab_free(v);
}

/* ---- masks against brute force ---- */

static void brute_mask(rp_smatcher *m, int n_tokens, uint32_t *mask) {
    memset(mask, 0, (size_t)((n_tokens + 31) / 32) * 4);
    for (int id = 0; id < n_tokens; id++)
        if (!rp_smatcher_accept_token(m, id)) {
            mask[id >> 5] |= 1u << (id & 31);
            rp_smatcher_rollback(m, 1);
        }
}

static int popcount_mask(const uint32_t *m, int w) {
    int c = 0;
    for (int i = 0; i < w; i++) c += __builtin_popcount(m[i]);
    return c;
}

/* A walk of steps tokens: at each, the mask must equal the brute force; the
 * next token is the guide's (a tokenised instance) or a random allowed one. */
static void walk_check(rp_svocab *v, rp_sgrammar *g, const int32_t *guide, int n_guide, int steps, double random_p) {
    int n = rp_svocab_n_tokens(v), W = rp_svocab_mask_words(v);
    uint32_t *mask = malloc((size_t)W * 4), *ref = malloc((size_t)W * 4);
    rp_err err = {0};
    rp_smatcher *m = rp_smatcher_new(g, &err);
    int gi = 0;
    for (int step = 0; step < steps; step++) {
        rp_smatcher_fill_mask(m, mask);
        brute_mask(m, n, ref);
        if (memcmp(mask, ref, (size_t)W * 4)) {
            for (int id = 0; id < n; id++) {
                int a = (int)(mask[id >> 5] >> (id & 31) & 1), b = (int)(ref[id >> 5] >> (id & 31) & 1);
                if (a != b) {
                    const char *tb = NULL;
                    size_t tl = 0;
                    if (qwen_tok && v == qwen_vocab) rp_tokenizer_token_bytes(qwen_tok, id, &tb, &tl);
                    fail_msg("step %d: token %d ('%.*s') mask %d, brute force %d\n%s", step, id, (int)tl, tb ? tb : "", a,
                             b, rp_sgrammar_gbnf(g));
                }
            }
        }
        int32_t next = -1;
        if (gi < n_guide && (rnd() % 1000) >= random_p * 1000) {
            next = guide[gi];
            if (!(mask[next >> 5] >> (next & 31) & 1)) next = -1;
        }
        if (next < 0) {
            int c = popcount_mask(mask, W);
            if (!c) break;
            int pick = (int)(rnd() % (uint32_t)c);
            for (int id = 0; id < n && next < 0; id++)
                if (mask[id >> 5] >> (id & 31) & 1 && pick-- == 0) next = id;
            gi = n_guide; /* off the guide now */
        } else gi++;
        assert_int_equal(rp_smatcher_accept_token(m, next), 0);
        if (rp_smatcher_is_finished(m)) break;
    }
    rp_smatcher_free(m);
    free(mask), free(ref);
}

static void test_masks_synthetic(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    static const char *const grammars[] = {
        "root ::= \"{\" (pair (\",\" pair)*)? \"}\"\npair ::= \"\\\"\" [a-z]* \"\\\"\" \":\" (\"true\" | \"null\" | [0-9]+ | root)",
        "root ::= \"é\"+ \"😀\"? \"a\"",
        "root ::= ([ab] | \"é\" | \"\\\\\" [nt])* \"x\"",
        "root ::= (\"ab\" | \"a\" \"b\" \"c\")+",
    };
    for (size_t i = 0; i < sizeof grammars / sizeof *grammars; i++) {
        rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF, grammars[i], 0);
        for (int w = 0; w < 30; w++) walk_check(v, g, NULL, 0, 30, 1.0);
        rp_sgrammar_release(g);
    }
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, schemas[i], (int)(i & 1));
        for (int w = 0; w < 6; w++) walk_check(v, g, NULL, 0, 25, 1.0);
        rp_sgrammar_release(g);
    }
    { /* no classes at compile: every one made when a mask first needs it */
        int n2;
        rp_svocab *lazy = synth_vocab(&n2);
        rp_err err = {0};
        rp_sopts o = {.precompute_ms = -1};
        for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i += 3) {
            rp_sgrammar *g = rp_sgrammar_compile(lazy, RP_SKIND_JSON_SCHEMA, schemas[i], strlen(schemas[i]), &o, &err);
            assert_non_null(g);
            for (int w = 0; w < 4; w++) walk_check(lazy, g, NULL, 0, 25, 1.0);
            rp_sgrammar_release(g);
        }
        rp_svocab_free(lazy);
    }
    /* a UTF-8 character split across tokens: C3 then A9 */
    rp_sgrammar *g = compile_ok(v, RP_SKIND_GBNF, "root ::= \"é\" \"a\"", 0);
    rp_err err = {0};
    rp_smatcher *m = rp_smatcher_new(g, &err);
    int W = rp_svocab_mask_words(v);
    uint32_t *mask = malloc((size_t)W * 4);
    int c3 = synth_extra_base + 7, eos = n - 1;
    assert_true(c3 >= 0);
    assert_int_equal(rp_smatcher_accept_token(m, c3), 0);
    assert_false(rp_smatcher_is_accepting(m));
    rp_smatcher_fill_mask(m, mask);
    assert_int_equal(popcount_mask(mask, W), 1); /* only A9 */
    assert_false(mask[eos >> 5] >> (eos & 31) & 1);
    rp_smatcher_rollback(m, 1);
    /* rollback: the mask is the start mask again */
    uint32_t *start = malloc((size_t)W * 4);
    rp_smatcher_fill_mask(m, start);
    assert_int_equal(rp_smatcher_accept_token(m, c3), 0);
    rp_smatcher_rollback(m, 5);
    rp_smatcher_fill_mask(m, mask);
    assert_memory_equal(mask, start, (size_t)W * 4);
    /* eos only when accepting; specials never; nothing after eos */
    assert_int_equal(rp_smatcher_accept_token(m, eos), -1);
    assert_int_equal(rp_smatcher_accept_bytes(m, "\xC3\xA9" "a", 3), 0);
    assert_true(rp_smatcher_is_accepting(m));
    rp_smatcher_fill_mask(m, mask);
    assert_int_equal(popcount_mask(mask, W), 1);
    assert_true(mask[eos >> 5] >> (eos & 31) & 1);
    assert_int_equal(rp_smatcher_accept_token(m, n - 2), -1);
    assert_int_equal(rp_smatcher_accept_token(m, eos), 0);
    assert_true(rp_smatcher_is_finished(m));
    rp_smatcher_fill_mask(m, mask);
    assert_int_equal(popcount_mask(mask, W), 0);
    rp_smatcher_rollback(m, 1);
    assert_false(rp_smatcher_is_finished(m));
    rp_smatcher_free(m);
    rp_sgrammar_release(g);
    free(mask), free(start);
    rp_svocab_free(v);
}

static const char *const qwen_instances[][2] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,"
     "\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"name\",\"age\",\"tags\"]}",
     "{\"name\":\"Zoë \\\"the\\\" café owner 😀\",\"age\":42,\"tags\":[\"coffee\",\"naïve\",\"東京\"]}"},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
     "\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/node\"}",
     "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":-4,\"kids\":[]}]}]}"},
};

static void test_masks_qwen3(void **state) {
    (void)state;
    rp_svocab *v = qwen();
    for (size_t i = 0; i < sizeof qwen_instances / sizeof *qwen_instances; i++) {
        rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, qwen_instances[i][0], 0);
        const char *inst = qwen_instances[i][1];
        assert_true(accepts(g, inst, strlen(inst)));
        int32_t *ids;
        size_t n_ids;
        rp_err err = {0};
        assert_int_equal(rp_tokenizer_encode(qwen_tok, inst, strlen(inst), &ids, &n_ids, &err), 0);
        walk_check(v, g, ids, (int)n_ids, (int)n_ids + 1, 0.0); /* along the instance, then eos */
        walk_check(v, g, ids, (int)n_ids, 12, 0.3);               /* off it at random */
        free(ids);
        rp_sgrammar_release(g);
    }
    /* whitespace mode, off the instance at random */
    rp_sgrammar *g = compile_ok(v, RP_SKIND_JSON_SCHEMA, qwen_instances[0][0], 1);
    for (int w = 0; w < 3; w++) walk_check(v, g, NULL, 0, 10, 1.0);
    rp_sgrammar_release(g);
    g = compile_ok(v, RP_SKIND_REGEX, "(\\d{3}-){2}[a-zé]+", 0);
    walk_check(v, g, NULL, 0, 6, 1.0);
    rp_sgrammar_release(g);
    g = compile_ok(v, RP_SKIND_CHOICE, "[\"positive\", \"negative\", \"neutral 😐\"]", 0);
    for (int w = 0; w < 3; w++) walk_check(v, g, NULL, 0, 8, 1.0);
    rp_sgrammar_release(g);
    g = compile_ok(v, RP_SKIND_GBNF, "root ::= \"<\" [a-z]+ \">\" ([^<] | root)* \"</\" [a-z]+ \">\"", 0);
    for (int w = 0; w < 2; w++) walk_check(v, g, NULL, 0, 10, 1.0);
    rp_sgrammar_release(g);
    /* the cache hands back the same grammar for the same text */
    rp_sgrammar *a = compile_ok(v, RP_SKIND_JSON_OBJECT, "", 0), *b = compile_ok(v, RP_SKIND_JSON_OBJECT, "", 0);
    assert_ptr_equal(a, b);
    rp_sgrammar *c = compile_ok(v, RP_SKIND_JSON_OBJECT, "", 1); /* other options: another grammar */
    assert_ptr_not_equal(a, c);
    rp_sgrammar_release(c);
    { /* a counted string, classified lazily, on the real vocabulary */
        rp_err err = {0};
        rp_sopts o = {.precompute_ms = -1};
        const char *sch = "{\"type\":\"string\",\"minLength\":3,\"maxLength\":12}";
        rp_sgrammar *counted = rp_sgrammar_compile(v, RP_SKIND_JSON_SCHEMA, sch, strlen(sch), &o, &err);
        assert_non_null(counted);
        walk_check(v, counted, NULL, 0, 8, 1.0);
        rp_sgrammar_release(counted);
        const char *sch2 = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":6,\"maxLength\":40},"
                           "\"minItems\":7,\"maxItems\":9}";
        counted = compile_ok(v, RP_SKIND_JSON_SCHEMA, sch2, 0);
        for (int w = 0; w < 3; w++) walk_check(v, counted, NULL, 0, 12, 1.0);
        rp_sgrammar_release(counted);
        counted = compile_ok(v, RP_SKIND_REGEX, "[a-z ]{5,30}(, [0-9]{6,}){2,7}", 0);
        for (int w = 0; w < 2; w++) walk_check(v, counted, NULL, 0, 12, 1.0);
        rp_sgrammar_release(counted);
    }
    walk_check(v, a, NULL, 0, 8, 1.0);
    rp_sgrammar_release(a), rp_sgrammar_release(b);
}

/* Random and mutated constraint texts: never a crash or a hang, an error or a grammar. */
static void test_fuzz_parsers(void **state) {
    (void)state;
    int n;
    rp_svocab *v = synth_vocab(&n);
    static const char *const seeds[] = {
        "root ::= \"a\" (b | [c-e]{2,7})* \"f\"?\nb ::= \"x\" root | \"y\"",
        "(ab|[^x-z]{3,})+\\d{2}(?:e|f)*",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":9}},"
        "\"required\":[\"a\"]}",
        "[\"a\",\"bc\"]",
    };
    static const rp_skind kinds[] = {RP_SKIND_GBNF, RP_SKIND_REGEX, RP_SKIND_JSON_SCHEMA, RP_SKIND_CHOICE};
    static const char junk[] = "()[]{}|*+?^$\\\"':=,.-0123456789abcxyz#\n {}\"type\"";
    rp_sopts o = {.precompute_ms = -1, .max_elements = 20000};
    for (int k = 0; k < 4; k++)
        for (int it = 0; it < 300; it++) {
            char buf[512];
            size_t len = strlen(seeds[k]);
            memcpy(buf, seeds[k], len);
            int edits = 1 + (int)(rnd() % 4);
            for (int e = 0; e < edits && len < sizeof buf - 2; e++) {
                size_t at = len ? rnd() % len : 0;
                int kind = (int)(rnd() % 3);
                if (kind == 0 && len) memmove(buf + at, buf + at + 1, len - at - 1), len--;
                else if (kind == 1) buf[at] = junk[rnd() % (sizeof junk - 1)];
                else memmove(buf + at + 1, buf + at, len - at), buf[at] = junk[rnd() % (sizeof junk - 1)], len++;
            }
            rp_err err = {0};
            rp_sgrammar *g = rp_sgrammar_compile(v, kinds[k], buf, len, &o, &err);
            if (!g) {
                assert_true(err.msg[0] != 0); /* an error always says what */
                continue;
            }
            rp_smatcher *m = rp_smatcher_new(g, &err);
            uint32_t *mask = malloc((size_t)rp_svocab_mask_words(v) * 4);
            for (int step = 0; step < 8; step++) { /* a few masks and tokens */
                if (!rp_smatcher_fill_mask(m, mask)) break;
                int32_t pick = -1;
                for (int id = (int)(rnd() % (uint32_t)n), c = 0; c < n && pick < 0; c++, id = (id + 1) % n)
                    if (mask[id >> 5] >> (id & 31) & 1) pick = id;
                assert_int_equal(rp_smatcher_accept_token(m, pick), 0);
            }
            free(mask);
            rp_smatcher_free(m);
            rp_sgrammar_release(g);
        }
    rp_svocab_free(v);
}

static int teardown(void **state) {
    (void)state;
    rp_svocab_free(qwen_vocab);
    rp_tokenizer_free(qwen_tok);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_errors),  cmocka_unit_test(test_gbnf_language),   cmocka_unit_test(test_regex),
        cmocka_unit_test(test_choice),       cmocka_unit_test(test_json_schema),     cmocka_unit_test(test_masks_synthetic),
        cmocka_unit_test(test_masks_qwen3),  cmocka_unit_test(test_fuzz_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
