/* The tokenizer against Hugging Face: every corpus string of
 * tests/fixtures/tokenizer/parity.json (made by tools/make_tokenizer_fixtures.py
 * with the `tokenizers` package) must encode to the same ids and decode to the
 * same text, streaming decode must equal full decode, plus the API's lookups
 * and its errors on bad tokenizer files. Needs the real tokenizer files
 * (scripts/fetch-tokenizers.sh, which `make test` runs). */
#include <jansson.h>

#include "stream_decode.h"
#include "test_util.h"
#include "tokenizer/tjson.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static rp_tokenizer *tok_qwen3, *tok_llama3;
static json_t *parity;

static rp_tokenizer *load_real(const char *name) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/%s", test_source_dir(), name);
    rp_err err = {0};
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    return t;
}

static int setup(void **state) {
    (void)state;
    tok_qwen3 = load_real("qwen3");
    tok_llama3 = load_real("llama3");
    char path[4096];
    test_path(path, sizeof path, "tests/fixtures/tokenizer/parity.json");
    json_error_t je;
    parity = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!parity) fail_msg("%s: %s", path, je.text);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rp_tokenizer_free(tok_qwen3);
    rp_tokenizer_free(tok_llama3);
    json_decref(parity);
    return 0;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* The case's input bytes: bytes_hex (not UTF-8) or the text itself. */
static char *case_input(json_t *c, size_t *len) {
    json_t *hex = json_object_get(c, "bytes_hex");
    if (hex) {
        const char *h = json_string_value(hex);
        size_t n = strlen(h) / 2;
        char *b = malloc(n + 1);
        for (size_t i = 0; i < n; i++) b[i] = (char)(hexval(h[2 * i]) << 4 | hexval(h[2 * i + 1]));
        *len = n;
        return b;
    }
    json_t *t = json_object_get(c, "text");
    *len = json_string_length(t);
    char *b = malloc(*len + 1);
    memcpy(b, json_string_value(t), *len);
    return b;
}

static json_t *expected_text(json_t *c, const char *name, const char *suffix) {
    char key[64];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    json_t *v = json_object_get(c, key);
    return v ? v : NULL;
}

static int same_bytes(json_t *s, const char *b, size_t n) {
    return json_string_length(s) == n && memcmp(json_string_value(s), b, n) == 0;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static void run_parity(const rp_tokenizer *t, const char *name) {
    json_t *cases = json_object_get(parity, "cases");
    size_t i, n_cases = json_array_size(cases), bad_ids = 0, bad_dec = 0, bad_stream = 0;
    json_t *c;
    assert_true(n_cases >= 2000);
    json_array_foreach(cases, i, c) {
        size_t len;
        char *in = case_input(c, &len);
        json_t *want = json_object_get(c, name);
        int32_t *ids;
        size_t n;
        rp_err err;
        assert_int_equal(rp_tokenizer_encode(t, in, len, &ids, &n, &err), 0);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same) {
            if (bad_ids++ < 5) {
                fprintf(stderr, "%s: case %zu ids differ: %s\n", name, i,
                        json_string_value(json_object_get(c, "text")));
                print_ids("replay", ids, n);
                int32_t w[64];
                size_t wn = json_array_size(want);
                for (size_t k = 0; k < wn && k < 64; k++) w[k] = (int32_t)json_integer_value(json_array_get(want, k));
                print_ids("hf    ", w, wn < 64 ? wn : 64);
            }
        } else {
            /* decode of HF's ids (= ours) must give HF's decode */
            json_t *dec = expected_text(c, name, "_decoded");
            if (!dec) dec = json_object_get(c, "text");
            json_t *dec_skip = expected_text(c, name, "_decoded_skip");
            if (!dec_skip) dec_skip = dec;
            char *out;
            size_t out_len;
            assert_int_equal(rp_tokenizer_decode(t, ids, n, 0, &out, &out_len, &err), 0);
            int ok = same_bytes(dec, out, out_len);
            free(out);
            assert_int_equal(rp_tokenizer_decode(t, ids, n, 1, &out, &out_len, &err), 0);
            ok &= same_bytes(dec_skip, out, out_len);
            free(out);
            if (!ok && bad_dec++ < 5) fprintf(stderr, "%s: case %zu decode differs\n", name, i);
            for (int skip = 0; skip < 2; skip++) {
                out = stream_decode(t, ids, n, skip, &out_len);
                if (!same_bytes(skip ? dec_skip : dec, out, out_len) && bad_stream++ < 5)
                    fprintf(stderr, "%s: case %zu streaming decode differs (skip=%d)\n", name, i, skip);
                free(out);
            }
        }
        /* invalid UTF-8 is refused in strict mode */
        if (!tok_utf8_valid(in, len)) {
            int32_t *x;
            size_t xn;
            assert_int_not_equal(rp_tokenizer_encode_ex(t, in, len, RP_ENCODE_STRICT_UTF8, &x, &xn, &err), 0);
            assert_non_null(strstr(err.msg, "UTF-8"));
        }
        free(ids);
        free(in);
    }
    fprintf(stderr, "%s: %zu cases, %zu id mismatches, %zu decode mismatches, %zu streaming mismatches\n", name,
            n_cases, bad_ids, bad_dec, bad_stream);
    assert_int_equal(bad_ids, 0);
    assert_int_equal(bad_dec, 0);
    assert_int_equal(bad_stream, 0);
}

static void test_parity_qwen3(void **state) {
    (void)state;
    run_parity(tok_qwen3, "qwen3");
}

static void test_parity_llama3(void **state) {
    (void)state;
    run_parity(tok_llama3, "llama3");
}

static void test_lookups(void **state) {
    (void)state;
    assert_int_equal(rp_tokenizer_vocab_size(tok_qwen3), 151669);
    assert_int_equal(rp_tokenizer_vocab_size(tok_llama3), 128256);
    assert_int_equal(rp_tokenizer_token_id(tok_qwen3, "<|im_end|>"), 151645);
    assert_int_equal(rp_tokenizer_token_id(tok_qwen3, "<think>"), 151667);
    assert_int_equal(rp_tokenizer_token_id(tok_qwen3, "Hello"), 9707);
    assert_int_equal(rp_tokenizer_token_id(tok_qwen3, "no such token"), -1);
    assert_int_equal(rp_tokenizer_token_id(tok_llama3, "<|eot_id|>"), 128009);
    assert_int_equal(rp_tokenizer_eos_id(tok_qwen3), 151645);
    assert_int_equal(rp_tokenizer_bos_id(tok_qwen3), -1);
    assert_null(rp_tokenizer_bos_token(tok_qwen3));
    assert_int_equal(rp_tokenizer_bos_id(tok_llama3), 128000);
    assert_int_equal(rp_tokenizer_eos_id(tok_llama3), 128001);
    assert_string_equal(rp_tokenizer_eos_token(tok_llama3), "<|end_of_text|>");
    assert_true(rp_tokenizer_is_special(tok_qwen3, 151645));
    assert_false(rp_tokenizer_is_special(tok_qwen3, 151667)); /* <think> is added, not special */
    assert_false(rp_tokenizer_is_special(tok_qwen3, 9707));
    assert_string_equal(rp_tokenizer_token_text(tok_qwen3, 1879), "Ġworld");
    assert_null(rp_tokenizer_token_text(tok_qwen3, -1));
    assert_null(rp_tokenizer_token_text(tok_qwen3, 151669));
    const char *b;
    size_t bl;
    assert_int_equal(rp_tokenizer_token_bytes(tok_qwen3, 1879, &b, &bl), 0);
    assert_int_equal(bl, 6);
    assert_memory_equal(b, " world", 6);
    /* without a chat template loaded, a chat turn ends at the eos alone
     * (tests/test_chat_template.c: the ids with the model's template) */
    int32_t stop[4];
    assert_int_equal(rp_chat_stop_ids(tok_qwen3, stop, 4), 1);
    assert_int_equal(stop[0], 151645); /* <|im_end|> */
}

static void test_encode_flags_and_errors(void **state) {
    (void)state;
    rp_err err;
    int32_t *ids;
    size_t n;
    const char *s = "a<|im_end|>b";
    assert_int_equal(rp_tokenizer_encode(tok_qwen3, s, strlen(s), &ids, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 151645);
    free(ids);
    assert_int_equal(rp_tokenizer_encode_ex(tok_qwen3, s, strlen(s), RP_ENCODE_SPLIT_SPECIAL, &ids, &n, &err), 0);
    assert_true(n > 3);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 151645);
    free(ids);
    /* empty text: zero ids, non-NULL array */
    assert_int_equal(rp_tokenizer_encode(tok_qwen3, "", 0, &ids, &n, &err), 0);
    assert_non_null(ids);
    assert_int_equal(n, 0);
    free(ids);
    /* decode: ids out of range are an error, not a crash */
    int32_t bad[] = {9707, 151669};
    char *out;
    assert_int_not_equal(rp_tokenizer_decode(tok_qwen3, bad, 2, 0, &out, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "out of range"));
    int32_t neg[] = {-5};
    assert_int_not_equal(rp_tokenizer_decode(tok_qwen3, neg, 1, 0, &out, NULL, &err), 0);
    rp_detok d;
    rp_detok_init(&d, tok_qwen3, 0);
    const char *chunk;
    size_t cl;
    assert_int_not_equal(rp_detok_push(&d, 1 << 30, &chunk, &cl, &err), 0);
    rp_detok_free(&d);
}

/* Added tokens with "normalized": false are split off the raw text before
 * the normalizer runs: in Qwen3 (NFC) a combining U+0338 after "<think>"
 * stays a mark of its own instead of composing with its ">" (U+226F). The
 * ids are Hugging Face tokenizers 0.23.2's for the same text (checked on the
 * GPU machine, 2026-11-25; the fuzz test's round trip found the case). */
static void test_added_tokens_before_normalizer(void **state) {
    (void)state;
    rp_err err;
    int32_t *ids;
    size_t n;
    const char *s = "<think>\xcc\xb8W";
    assert_int_equal(rp_tokenizer_encode(tok_qwen3, s, strlen(s), &ids, &n, &err), 0);
    const int32_t want[] = {151667, 136, 116, 54};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    char *out;
    size_t out_len;
    assert_int_equal(rp_tokenizer_decode(tok_qwen3, ids, n, 0, &out, &out_len, &err), 0);
    assert_int_equal(out_len, strlen(s));
    assert_memory_equal(out, s, out_len);
    free(out);
    free(ids);
    /* without the added token the same mark composes */
    const char *plain = ">\xcc\xb8W";
    assert_int_equal(rp_tokenizer_encode(tok_qwen3, plain, strlen(plain), &ids, &n, &err), 0);
    assert_int_equal(rp_tokenizer_decode(tok_qwen3, ids, n, 0, &out, &out_len, &err), 0);
    assert_int_equal(out_len, 4);
    assert_memory_equal(out, "\xe2\x89\xafW", 4);
    free(out);
    free(ids);
}

/* A character split over tokens is held back, not emitted in halves. */
static void test_stream_holds_partial_chars(void **state) {
    (void)state;
    const char *s = "日本🎉"; /* byte-level BPE often splits these */
    int32_t *ids;
    size_t n;
    rp_err err;
    assert_int_equal(rp_tokenizer_encode(tok_llama3, s, strlen(s), &ids, &n, &err), 0);
    size_t len;
    char *out = stream_decode(tok_llama3, ids, n, 0, &len);
    assert_int_equal(len, strlen(s));
    assert_memory_equal(out, s, len);
    free(out);
    free(ids);
    /* a dangling partial character at the end becomes U+FFFD on flush */
    int32_t id_e6 = tok_llama3->byte_id[0xE6];
    rp_detok d;
    rp_detok_init(&d, tok_llama3, 0);
    const char *chunk;
    size_t cl;
    assert_int_equal(rp_detok_push(&d, id_e6, &chunk, &cl, &err), 0);
    assert_int_equal(cl, 0);
    rp_detok_flush(&d, &chunk, &cl);
    assert_int_equal(cl, 3);
    assert_memory_equal(chunk, "\xEF\xBF\xBD", 3);
    rp_detok_free(&d);
}

/* The short-word scan and the heap agree (they must: both are HF's rule). */
static void test_bpe_algorithms_agree(void **state) {
    (void)state;
    const rp_tokenizer *toks[2] = {tok_qwen3, tok_llama3};
    uint64_t x = 88172645463325252ULL;
    tok_scratch *sc = tok_scratch_new();
    const char *alpha[] = {"e", "th", "in", " ", "a", "er", "ing", "\xe4\xb8\xad", "\xc3\xa9", "0", "!", "ll"};
    for (int it = 0; it < 4000; it++) {
        char word[400];
        size_t n = 0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int parts = 1 + (int)(x % (it < 3000 ? 20 : 120));
        for (int p = 0; p < parts; p++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *a = alpha[x % 12];
            size_t l = strlen(a);
            if (n + l >= sizeof word) break;
            memcpy(word + n, a, l);
            n += l;
        }
        for (int k = 0; k < 2; k++) {
            tok_ids a = {0}, b = {0};
            assert_int_equal(tok_bpe_word(toks[k], (const unsigned char *)word, n, sc, 1, &a), 0);
            assert_int_equal(tok_bpe_word(toks[k], (const unsigned char *)word, n, sc, 2, &b), 0);
            assert_int_equal(a.n, b.n);
            assert_memory_equal(a.v, b.v, a.n * sizeof *a.v);
            free(a.v);
            free(b.v);
        }
    }
    tok_scratch_free(sc);
}

/* ---- bad tokenizer files ---- */

static const char *MINI =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":6,\"content\":\"<|end|>\",\"single_word\":false,"
    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"\\\\s+|\\\\S+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":false,\"use_regex\":false}]},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"Ġ\":3,"
    "\"c\":4,\"abc\":5},\"merges\":[\"a b\",[\"ab\",\"c\"]]}}";

static char *replace(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    assert_non_null(p);
    size_t a = (size_t)(p - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, p + fl, n - a - fl + 1);
    return r;
}

static void expect_load_error(const char *json, size_t len, const char *needle) {
    rp_err err = {0};
    rp_tokenizer *t = rp_tokenizer_load_json(json, len, NULL, 0, &err);
    if (t) fail_msg("loaded, expected an error containing '%s'", needle);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' lacks '%s'", err.msg, needle);
}

static void test_mini_tokenizer(void **state) {
    (void)state;
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load_json(MINI, strlen(MINI), NULL, 0, &err);
    if (!t) fail_msg("%s", err.msg);
    int32_t *ids;
    size_t n;
    const char *s = "abc ab<|end|>";
    assert_int_equal(rp_tokenizer_encode(t, s, strlen(s), &ids, &n, &err), 0);
    int32_t want[] = {5, 3, 2, 6};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    /* no template configured */
    json_t *m = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
    char *out;
    assert_int_equal(rp_tokenizer_load_chat_template(t, NULL, NULL, NULL, &err), 0);
    assert_int_not_equal(rp_chat_render(t, m, NULL, 1, NULL, &out, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "--chat-template"));
    json_decref(m);
    rp_tokenizer_free(t);
}

static void test_bad_files(void **state) {
    (void)state;
    size_t n = strlen(MINI);
    expect_load_error("", 0, "invalid JSON");
    expect_load_error("{", 1, "invalid JSON");
    expect_load_error("[]", 2, "not a JSON object");
    expect_load_error("\xEF\xBB\xBF{}", 5, "byte order mark");
    for (size_t cut = 0; cut < n; cut += 7) expect_load_error(MINI, cut, "invalid JSON");
    struct {
        const char *from, *to, *needle;
    } subs[] = {
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "unsupported model type 'WordPiece'"},
        {"\"type\":\"Split\",\"pattern\"", "\"type\":\"Whitespace\",\"pattern\"", "unsupported pre_tokenizer 'Whitespace'"},
        {"\"type\":\"NFC\"", "\"type\":\"NFKC\"", "unsupported normalizer 'NFKC'"},
        {"\"decoder\":{\"type\":\"ByteLevel\"}", "\"decoder\":null", "unsupported decoder"},
        {"\"a b\"", "\"a x\"", "missing from the vocab"},
        {"\"a b\"", "\"ab\"", "merge 0"},
        {"\"Isolated\"", "\"Removed\"", "Split behavior"},
        {"\"\\\\s+|\\\\S+\"", "\"(unclosed\"", "does not compile"},
        {"\"dropout\":null", "\"dropout\":0.1", "dropout"},
        {"\"b\":1", "\"b\":-1", "non-negative integer"},
        {"\"b\":1", "\"b\":\"x\"", "non-negative integer"},
        {"\"model\":{", "\"modelx\":{", "no \"model\""},
        {"\"ab\":2", "\"ab\":2,\"\\ud800\":9", "surrogate"},
    };
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char *bad = replace(MINI, subs[i].from, subs[i].to);
        expect_load_error(bad, strlen(bad), subs[i].needle);
        free(bad);
    }
    /* truncated real file */
    char path[4096];
    snprintf(path, sizeof path, "%s/.cache/tokenizers/qwen3/tokenizer.json", test_source_dir());
    size_t len;
    char *real = test_read_file(path, &len);
    expect_load_error(real, len / 2, "invalid JSON");
    expect_load_error(real, len - 1, "invalid JSON");
    free(real);
    /* missing directory */
    rp_err err;
    assert_null(rp_tokenizer_load("/nonexistent-dir", &err));
    assert_non_null(strstr(err.msg, "cannot open"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_qwen3),
        cmocka_unit_test(test_parity_llama3),
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_encode_flags_and_errors),
        cmocka_unit_test(test_added_tokens_before_normalizer),
        cmocka_unit_test(test_stream_holds_partial_chars),
        cmocka_unit_test(test_bpe_algorithms_agree),
        cmocka_unit_test(test_mini_tokenizer),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
