/* Fuzz-style tests of the tokenizer, time-boxed so CI stays quick
 * (REPLAY_FUZZ_SECONDS per part, default 1.5; REPLAY_FUZZ_SEED to replay a run):
 *  - mutated tokenizer.json files load or fail cleanly, and whatever loads
 *    encodes and decodes without crashing;
 *  - random text (bytes, code points, special-token fragments) round-trips
 *    through the real tokenizers: decode(encode(x)) is x after the same
 *    U+FFFD replacement (Llama 3) and NFC (Qwen3) that HF applies (NFC
 *    between the added tokens, which HF splits off first), and streaming
 *    decode equals full decode;
 *  - random id sequences decode the same streamed and whole.
 * Under the ASan+UBSan build this is the memory-safety check of the parser. */
#include "test_util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

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

static int setup(void **state) {
    (void)state;
    const char *s = getenv("REPLAY_FUZZ_SEED");
    rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)(rp_now_s() * 1e6);
    if (!rng_state) rng_state = 1;
    fprintf(stderr, "fuzz seed %llu (set REPLAY_FUZZ_SEED to replay)\n", (unsigned long long)rng_state);
    return 0;
}

static const char *MINI =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":7,\"content\":\"<|end|>\",\"single_word\":false,"
    "\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":true},{\"id\":8,\"content\":\"xy\","
    "\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"(?i:'s)|\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
    "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":true}]},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"ignore_merges\":true,"
    "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,\"c\":4,\"abc\":5,\"\\u00e9\":6},\"merges\":[\"a b\",[\"ab\",\"c\"]]}}";

static void exercise(const rp_tokenizer *t) {
    char text[64];
    size_t n = rnd() % sizeof text;
    for (size_t i = 0; i < n; i++) text[i] = "ab c<|end|>xy\xc3\xa9\xff 1'S"[rnd() % 20];
    int32_t *ids;
    size_t k;
    rp_err err;
    if (rp_tokenizer_encode(t, text, n, &ids, &k, &err) == 0) {
        char *out;
        if (rp_tokenizer_decode(t, ids, k, (int)(rnd() & 1), &out, NULL, &err) == 0) free(out);
        free(ids);
    }
    int32_t rid[4] = {(int32_t)(rnd() % 12) - 2, (int32_t)(rnd() % 12), (int32_t)(rnd() % 12), 7};
    char *out;
    if (rp_tokenizer_decode(t, rid, 4, 0, &out, NULL, &err) == 0) free(out);
}

static void test_mutated_files(void **state) {
    (void)state;
    size_t base_len = strlen(MINI);
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load_json(MINI, base_len, NULL, 0, &err);
    if (!t) fail_msg("base file does not load: %s", err.msg);
    exercise(t);
    rp_tokenizer_free(t);
    char *buf = malloc(base_len * 2 + 64);
    double end = rp_now_s() + budget_s();
    long iters = 0, loaded = 0;
    while (rp_now_s() < end) {
        size_t len = base_len;
        memcpy(buf, MINI, base_len);
        int muts = 1 + (int)(rnd() % 4);
        for (int m = 0; m < muts; m++) {
            size_t at = len ? rnd() % len : 0;
            switch (rnd() % 5) {
            case 0: if (len) buf[at] = (char)rnd(); break;                      /* random byte */
            case 1: if (len) buf[at] ^= (char)(1 << (rnd() % 8)); break;        /* bit flip */
            case 2: len = at; break;                                            /* truncate */
            case 3: /* insert a JSON-ish token */
                if (len + 8 < base_len * 2) {
                    const char *ins[] = {"{", "}", "[", "]", ",", ":", "\"", "\\u", "null", "1e999", "-1", "\\"};
                    const char *s = ins[rnd() % 12];
                    size_t l = strlen(s);
                    memmove(buf + at + l, buf + at, len - at);
                    memcpy(buf + at, s, l);
                    len += l;
                }
                break;
            default: /* delete a span */
                if (len) {
                    size_t l = rnd() % 16;
                    if (at + l > len) l = len - at;
                    memmove(buf + at, buf + at + l, len - at - l);
                    len -= l;
                }
            }
        }
        t = rp_tokenizer_load_json(buf, len, NULL, 0, &err);
        if (t) {
            loaded++;
            exercise(t);
            rp_tokenizer_free(t);
        } else {
            assert_true(err.msg[0] != '\0');
        }
        iters++;
    }
    fprintf(stderr, "mutated tokenizer.json: %ld tries, %ld loaded\n", iters, loaded);
    free(buf);
}

/* Random input: raw bytes, any Unicode scalar, pieces that matter to the
 * pre-tokenizer and the added-token matcher. */
static size_t random_text(char *out, size_t cap) {
    static const char *pieces[] = {" ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "<|im_end|>", "<|eot_id|>",
                                   "<think>", "<|", "e\xcc\x81", "\xe1\x84\x80\xe1\x85\xa1", "123", "\xe3\x80\x80",
                                   "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb", "the", "The", "\xc2\xa0", "a"};
    size_t n = 0, parts = rnd() % 24;
    for (size_t p = 0; p < parts && n + 8 < cap; p++) {
        switch (rnd() % 4) {
        case 0: out[n++] = (char)rnd(); break;
        case 1: {
            uint32_t cp = (uint32_t)(rnd() % 0x110000);
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
            if (rnd() % 2) cp &= 0x7FF; /* favour the dense low planes */
            n += (size_t)tok_utf8_encode(cp, out + n);
            break;
        }
        default: {
            const char *s = pieces[rnd() % 20];
            size_t l = strlen(s);
            if (n + l < cap) memcpy(out + n, s, l), n += l;
        }
        }
    }
    return n;
}

/* What HF's normalizer makes of text: added tokens with "normalized": false
 * (Qwen3's <|im_end|> and <think>, the ones random_text writes) are split
 * off the raw text first and only the pieces between them are normalized,
 * so a combining mark after "<think>" does not compose with its ">"
 * (U+0338: ">" would become U+226F). */
static char *nfc_outside_added(const char *text, size_t n, size_t *out_len) {
    static const char *const added[] = {"<|im_end|>", "<think>"};
    char *out = malloc(4 * n + 1); /* NFC grows UTF-8 text by at most 3x */
    size_t o = 0, i = 0;
    assert_non_null(out);
    while (i <= n) {
        size_t next = n, alen = 0; /* the earliest added token at or after i */
        for (size_t a = 0; a < sizeof added / sizeof added[0]; a++) {
            const size_t l = strlen(added[a]);
            for (size_t j = i; j + l <= n && j < next; j++)
                if (memcmp(text + j, added[a], l) == 0) {
                    next = j, alen = l;
                    break;
                }
        }
        char *norm = NULL;
        size_t nl = 0;
        rp_err err;
        assert_int_equal(tok_nfc(text + i, next - i, &norm, &nl, &err), 0);
        if (!norm) nl = next - i; /* already NFC */
        assert_true(o + nl + alen <= 4 * n + 1);
        memcpy(out + o, norm ? norm : text + i, nl), o += nl;
        free(norm);
        memcpy(out + o, text + next, alen), o += alen;
        if (next == n) break;
        i = next + alen;
    }
    *out_len = o;
    return out;
}

static void round_trip(const rp_tokenizer *t, int nfc, double seconds) {
    double end = rp_now_s() + seconds;
    long iters = 0;
    while (rp_now_s() < end) {
        char text[256];
        size_t n = random_text(text, sizeof text);
        /* what HF would see: U+FFFD for bad bytes, then the normalizer */
        char *lossy = NULL, *norm = NULL;
        size_t ll = 0, cap = 0, nl;
        assert_int_equal(tok_utf8_lossy_append((const unsigned char *)text, n, 1, &lossy, &ll, &cap, NULL), 0);
        rp_err err;
        if (nfc) norm = nfc_outside_added(lossy, ll, &nl);
        const char *want = norm ? norm : lossy;
        size_t want_len = norm ? nl : ll;

        int32_t *ids;
        size_t k;
        assert_int_equal(rp_tokenizer_encode(t, text, n, &ids, &k, &err), 0);
        char *out;
        size_t out_len;
        assert_int_equal(rp_tokenizer_decode(t, ids, k, 0, &out, &out_len, &err), 0);
        if (out_len != want_len || memcmp(out, want, want_len) != 0) {
            fprintf(stderr, "round trip differs for %zu bytes:", n);
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)text[i]);
            fprintf(stderr, "\n");
            fail();
        }
        /* streaming */
        rp_detok d;
        rp_detok_init(&d, t, 0);
        size_t o = 0;
        for (size_t i = 0; i <= k; i++) {
            const char *chunk;
            size_t cl;
            if (i < k) assert_int_equal(rp_detok_push(&d, ids[i], &chunk, &cl, &err), 0);
            else rp_detok_flush(&d, &chunk, &cl);
            assert_true(tok_utf8_valid(chunk, cl));
            assert_true(o + cl <= out_len);
            assert_memory_equal(out + o, chunk, cl);
            o += cl;
        }
        assert_int_equal(o, out_len);
        rp_detok_free(&d);
        free(out);
        free(ids);
        free(lossy);
        free(norm);
        iters++;
    }
    fprintf(stderr, "round trips: %ld\n", iters);
}

static void random_ids(const rp_tokenizer *t, double seconds) {
    double end = rp_now_s() + seconds;
    int vs = rp_tokenizer_vocab_size(t);
    while (rp_now_s() < end) {
        int32_t ids[16];
        size_t k = rnd() % 16;
        for (size_t i = 0; i < k; i++) ids[i] = (int32_t)(rnd() % 2 ? rnd() % (uint64_t)vs : rnd() % 512);
        int skip = (int)(rnd() & 1);
        char *out;
        size_t out_len;
        rp_err err;
        assert_int_equal(rp_tokenizer_decode(t, ids, k, skip, &out, &out_len, &err), 0);
        assert_true(tok_utf8_valid(out, out_len));
        rp_detok d;
        rp_detok_init(&d, t, skip);
        size_t o = 0;
        for (size_t i = 0; i <= k; i++) {
            const char *chunk;
            size_t cl;
            if (i < k) assert_int_equal(rp_detok_push(&d, ids[i], &chunk, &cl, &err), 0);
            else rp_detok_flush(&d, &chunk, &cl);
            assert_true(o + cl <= out_len);
            assert_memory_equal(out + o, chunk, cl);
            o += cl;
        }
        assert_int_equal(o, out_len);
        rp_detok_free(&d);
        free(out);
    }
}

static void test_real_tokenizers(void **state) {
    (void)state;
    const char *names[] = {"qwen3", "llama3"};
    for (int i = 0; i < 2; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/.cache/tokenizers/%s", test_source_dir(), names[i]);
        rp_err err;
        rp_tokenizer *t = rp_tokenizer_load(dir, &err);
        if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
        round_trip(t, i == 0, budget_s() / 2);
        random_ids(t, budget_s() / 4);
        rp_tokenizer_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutated_files),
        cmocka_unit_test(test_real_tokenizers),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
