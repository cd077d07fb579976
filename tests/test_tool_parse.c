/* The tool-call parsers (src/server/tool_parse.c): recorded-style hermes
 * (Qwen2.5 / Qwen3), llama3_json and mistral outputs parsed whole: single
 * and parallel calls, text before and after, arguments of every JSON type
 * (nested, unicode, escapes, big numbers), and malformed calls, which must
 * come back as content byte for byte. Then every output streamed, cut at
 * every byte boundary, at every pair of them, one byte at a time and at
 * seeded random cuts: the same content, the same calls with the same ids,
 * argument fragments that add up to the arguments, content deltas never
 * empty nor cut inside a UTF-8 character, and little held back. */
#include "server/reasoning.h"
#include "server/sbuf.h"
#include "server/tool_parse.h"
#include "test_util.h"
#include "util/rng.h"

#define MAX_CALLS 8

typedef struct {
    const char *name, *arguments;
} xcall;

typedef struct {
    rp_tool_parser parser;
    const char *text;
    const char *content; /* NULL: none */
    int num_calls;
    xcall calls[MAX_CALLS];
} tcase;

#define H RP_TOOL_PARSER_HERMES
#define L RP_TOOL_PARSER_LLAMA3_JSON
#define M RP_TOOL_PARSER_MISTRAL

static const tcase cases[] = {
    /* ---- hermes: Qwen2.5 / Qwen3 ---- */
    {H,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n"
     "</tool_call>",
     NULL,
     1,
     {{"get_weather", "{\"location\":\"Paris, France\",\"unit\":\"celsius\"}"}}},
    {H,
     "I'll check both cities.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Tokyo\"}}\n</tool_call>",
     "I'll check both cities.",
     2,
     {{"get_weather", "{\"location\":\"Paris\"}"}, {"get_weather", "{\"location\":\"Tokyo\"}"}}},
    {H, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n\nDone, the call is out.", "Done, the call is out.", 1,
     {{"f", "{}"}}},
    {H, "Before. <tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}}</tool_call> after.", "Before.after.", 1,
     {{"f", "{\"a\":1}"}}},
    /* every JSON type, nested, escapes, unicode as UTF-8 and as escapes */
    {H,
     "<tool_call>\n{\"name\": \"t\", \"arguments\": {\"s\": \"a \\\"q\\\" \\\\ \\n\\t/\", \"i\": -12, \"z\": 0, "
     "\"f\": 3.25e-2, \"F\": -0.5E+3, \"t\": true, \"fa\": false, \"n\": null, \"arr\": [1, [2, {\"x\": []}], \"s p\"], "
     "\"o\": {\"k\": {\"deep\": \"v\"}}, \"u\": \"héllo ✓ 日本 🎉\", \"e\": \"\\u00e9\\ud83c\\udf89\", "
     "\"big\": 123456789012345678901234567890}}\n</tool_call>",
     NULL,
     1,
     {{"t", "{\"s\":\"a \\\"q\\\" \\\\ \\n\\t/\",\"i\":-12,\"z\":0,\"f\":3.25e-2,\"F\":-0.5E+3,\"t\":true,\"fa\":false,"
            "\"n\":null,\"arr\":[1,[2,{\"x\":[]}],\"s p\"],\"o\":{\"k\":{\"deep\":\"v\"}},\"u\":\"héllo ✓ 日本 🎉\","
            "\"e\":\"\\u00e9\\ud83c\\udf89\",\"big\":123456789012345678901234567890}"}}},
    /* a unicode function name, escaped */
    {H, "<tool_call>{\"name\": \"caf\\u00e9\", \"arguments\": {}}</tool_call>", NULL, 1, {{"café", "{}"}}},
    /* arguments quoted as a string, and missing */
    {H, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}</tool_call>", NULL, 1, {{"f", "{\"a\":[1,2]}"}}},
    {H, "<tool_call>{\"name\": \"now\"}</tool_call>", NULL, 1, {{"now", "{}"}}},
    /* the closing tag inside a string is not the end */
    {H, "<tool_call>{\"name\": \"echo\", \"arguments\": {\"text\": \"</tool_call> is a tag\"}}</tool_call>", NULL, 1,
     {{"echo", "{\"text\":\"</tool_call> is a tag\"}"}}},
    /* cut off before </tool_call>: still a call (the output ended) */
    {H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", NULL, 1, {{"f", "{\"a\":1}"}}},
    /* malformed: content, as written */
    {H, "<tool_call>\n{\"name\": \"f\", \"argu", "<tool_call>\n{\"name\": \"f\", \"argu", 0, {{0}}},
    {H, "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>", "<tool_call>\n{\"arguments\": {\"a\": 1}}\n</tool_call>", 0,
     {{0}}},
    {H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}}\n</tool_call>", 0, {{0}}},
    {H, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", 0,
     {{0}}},
    {H, "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", 0,
     {{0}}},
    {H, "<tool_call>{\"name\":\"f\",\"arguments\":{}} extra</tool_call>", "<tool_call>{\"name\":\"f\",\"arguments\":{}} extra</tool_call>",
     0, {{0}}},
    {H, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\ud800\"}}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\ud800\"}}</tool_call>", 0, {{0}}}, /* lone surrogate */
    {H, "Use <tool_call> tags to call a tool.", "Use <tool_call> tags to call a tool.", 0, {{0}}},
    {H, "a < b and <tool_cal is not a tag; <tool_call", "a < b and <tool_cal is not a tag; <tool_call", 0, {{0}}},
    /* a bad call, then a good one: the bad one is content */
    {H, "<tool_call>{\"name\": 1}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {\"b\": [true]}}</tool_call>",
     "<tool_call>{\"name\": 1}</tool_call>", 1, {{"g", "{\"b\":[true]}"}}},
    {H, "<tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>", "<tool_call>", 1, {{"g", "{}"}}},
    {H, "", NULL, 0, {{0}}},
    {H, "\n\n", "\n\n", 0, {{0}}},
    {H, "Plain answer, no tools: 日本語 ✓.\n", "Plain answer, no tools: 日本語 ✓.\n", 0, {{0}}},
    /* ---- llama3_json: Llama 3.1 / 3.2 ---- */
    {L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}", NULL, 1,
     {{"get_weather", "{\"city\":\"Paris\",\"days\":3}"}}},
    {L, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1.5}}", NULL, 1, {{"f", "{\"a\":1.5}"}}},
    {L, "\n\n{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"q\": \"日本\"}}\n", NULL, 1, {{"f", "{\"q\":\"日本\"}"}}},
    {L, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1, 2, {\"y\": null}]}};{\"name\": \"c\", \"arguments\": {\"z\": false}}",
     NULL, 3, {{"a", "{}"}, {"b", "{\"x\":[1,2,{\"y\":null}]}"}, {"c", "{\"z\":false}"}}},
    {L, "The weather in Paris is sunny.", "The weather in Paris is sunny.", 0, {{0}}},
    {L, "Sure: {\"name\": \"f\", \"parameters\": {}}", "Sure: {\"name\": \"f\", \"parameters\": {}}", 0, {{0}}},
    {L, "{\"name\": \"f\", \"parameters\": {oops}}", "{\"name\": \"f\", \"parameters\": {oops}}", 0, {{0}}},
    {L, "{\"name\": \"f\", \"parameters\": {\"a\": 1}", "{\"name\": \"f\", \"parameters\": {\"a\": 1}", 0, {{0}}},
    {L, "{\"name\": \"a\", \"parameters\": {}}; not json", "; not json", 1, {{"a", "{}"}}},
    {L, "{\"name\": \"a\", \"parameters\": {}}\n\nThat is the call.", "That is the call.", 1, {{"a", "{}"}}},
    {L, "<|python_tag|>brave_search.call(query=\"weather\")", "<|python_tag|>brave_search.call(query=\"weather\")", 0, {{0}}},
    {L, "{\"text\": \"no name\"}", "{\"text\": \"no name\"}", 0, {{0}}},
    {L, "<|python", "<|python", 0, {{0}}},
    {L, "", NULL, 0, {{0}}},
    {L, "  ", "  ", 0, {{0}}},
    /* ---- mistral ---- */
    {M, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", NULL, 1,
     {{"get_weather", "{\"city\":\"Paris\"}"}}},
    {M, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {\"y\": [\"é\"]}}]", NULL, 2,
     {{"a", "{\"x\":1}"}, {"b", "{\"y\":[\"é\"]}"}}},
    {M, "Let me look.\n[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", "Let me look.", 1, {{"f", "{}"}}},
    {M, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"c\"}", NULL, 1,
     {{"get_weather", "{\"city\":\"Paris\",\"unit\":\"c\"}"}}},
    {M, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{\"y\": {\"z\": [2]}}", NULL, 2,
     {{"a", "{\"x\":1}"}, {"b", "{\"y\":{\"z\":[2]}}"}}},
    {M, "[TOOL_CALLS]f{\"a\": 1}", NULL, 1, {{"f", "{\"a\":1}"}}},
    {M, "[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{\"a\": true}", NULL, 1, {{"f", "{\"a\":true}"}}},
    {M, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {oops}}]", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {oops}}]", 0, {{0}}},
    {M, "[TOOL_CALLS][{\"name\": \"f\"}, 3]", "[TOOL_CALLS][{\"name\": \"f\"}, 3]", 0, {{0}}},
    {M, "[TOOL_CALLS][{\"arguments\": {}}]", "[TOOL_CALLS][{\"arguments\": {}}]", 0, {{0}}},
    {M, "[TOOL_CALLS]", "[TOOL_CALLS]", 0, {{0}}},
    {M, "[TOOL_CALLS]f[ARGS]{\"a\": ", "[TOOL_CALLS]f[ARGS]{\"a\": ", 0, {{0}}},
    {M, "[TOOL_CALLS] hello there", "[TOOL_CALLS] hello there", 0, {{0}}},
    {M, "No tools [TOOL here.", "No tools [TOOL here.", 0, {{0}}},
};
#define NUM_CASES (sizeof cases / sizeof cases[0])

/* ---- a stream's events, checked as they come ----------------------------- */

typedef struct {
    rp_sbuf content;
    int num_calls;
    char ids[MAX_CALLS][32];
    char names[MAX_CALLS][64];
    rp_sbuf args[MAX_CALLS];
    const char *error; /* the first broken rule */
    size_t content_bytes;
} tsink;

static int ends_inside_utf8(const char *s, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back;
    }
    return 0;
}

static int on_event(void *ctx, const rp_tool_event *ev) {
    tsink *k = ctx;
    switch (ev->kind) {
    case RP_TOOL_EVENT_CONTENT:
        if (!ev->len) k->error = "empty content delta";
        if (ends_inside_utf8(ev->text, ev->len)) k->error = "content delta cut inside UTF-8";
        k->content_bytes += ev->len;
        return rp_sbuf_add(&k->content, ev->text, ev->len);
    case RP_TOOL_EVENT_CALL:
        if (ev->index != k->num_calls || k->num_calls == MAX_CALLS) {
            k->error = "call index out of order";
            return 0;
        }
        snprintf(k->ids[ev->index], sizeof k->ids[0], "%s", ev->id);
        snprintf(k->names[ev->index], sizeof k->names[0], "%s", ev->name);
        k->num_calls++;
        return 0;
    case RP_TOOL_EVENT_ARGUMENTS:
        if (ev->index != k->num_calls - 1) {
            k->error = "arguments for a call not the latest";
            return 0;
        }
        if (!ev->len) k->error = "empty arguments fragment";
        return rp_sbuf_add(&k->args[ev->index], ev->text, ev->len);
    }
    return 0;
}

static void sink_free(tsink *k) {
    rp_sbuf_free(&k->content);
    for (int i = 0; i < MAX_CALLS; i++) rp_sbuf_free(&k->args[i]);
}

static int id_ok(const tcase *c, const char *id) {
    size_t len = strlen(id), from = 0;
    if (c->parser == RP_TOOL_PARSER_MISTRAL) {
        if (len != 9) return 0;
    } else {
        if (len != 29 || strncmp(id, "call_", 5)) return 0;
        from = 5;
    }
    for (size_t i = from; i < len; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z'))) return 0;
    return 1;
}

/* The whole-output parse against the case; its ids go to ids_out. */
static void check_whole(const tcase *c, uint64_t seed, char ids_out[MAX_CALLS][32]) {
    rp_tool_parsed out;
    assert_int_equal(rp_tool_parse(c->parser, c->text, strlen(c->text), seed, &out), 0);
    if ((c->content == NULL) != (out.content == NULL) || (out.content && strcmp(out.content, c->content)))
        fail_msg("%s: content [%s], want [%s]", c->text, out.content ? out.content : "(null)",
                 c->content ? c->content : "(null)");
    if (out.num_calls != c->num_calls) fail_msg("%s: %d calls, want %d", c->text, out.num_calls, c->num_calls);
    for (int i = 0; i < c->num_calls; i++) {
        if (strcmp(out.calls[i].name, c->calls[i].name)) fail_msg("%s: call %d name %s", c->text, i, out.calls[i].name);
        if (strcmp(out.calls[i].arguments, c->calls[i].arguments))
            fail_msg("%s: call %d arguments [%s], want [%s]", c->text, i, out.calls[i].arguments, c->calls[i].arguments);
        if (!id_ok(c, out.calls[i].id)) fail_msg("%s: bad id %s", c->text, out.calls[i].id);
        for (int j = 0; j < i; j++) assert_string_not_equal(out.calls[i].id, out.calls[j].id);
        snprintf(ids_out[i], 32, "%s", out.calls[i].id);
    }
    rp_tool_parsed_free(&out);
}

static void check_sink(const tcase *c, tsink *k, char ids[MAX_CALLS][32], const char *how) {
    if (k->error) fail_msg("%s: %s: %s", how, c->text, k->error);
    const char *content = k->content.p;
    if ((c->content == NULL) != (content == NULL) || (content && strcmp(content, c->content)))
        fail_msg("%s: %s: content [%s], want [%s]", how, c->text, content ? content : "(null)",
                 c->content ? c->content : "(null)");
    if (k->num_calls != c->num_calls) fail_msg("%s: %s: %d calls, want %d", how, c->text, k->num_calls, c->num_calls);
    for (int i = 0; i < c->num_calls; i++) {
        assert_string_equal(k->names[i], c->calls[i].name);
        assert_non_null(k->args[i].p);
        if (strcmp(k->args[i].p, c->calls[i].arguments))
            fail_msg("%s: %s: call %d fragments add up to [%s]", how, c->text, i, k->args[i].p);
        assert_string_equal(k->ids[i], ids[i]);
    }
    sink_free(k);
}

static void stream_cuts(const tcase *c, uint64_t seed, char ids[MAX_CALLS][32], const size_t *cuts, int num_cuts,
                        const char *how) {
    size_t len = strlen(c->text), at = 0;
    rp_tool_stream *s = rp_tool_stream_new(c->parser, seed);
    assert_non_null(s);
    tsink k = {0};
    for (int i = 0; i <= num_cuts; i++) {
        size_t end = i < num_cuts ? cuts[i] : len;
        assert_int_equal(rp_tool_stream_feed(s, c->text + at, end - at, on_event, &k), 0);
        at = end;
    }
    assert_int_equal(rp_tool_stream_finish(s, on_event, &k), 0);
    assert_int_equal(rp_tool_stream_num_calls(s), c->num_calls);
    rp_tool_stream_free(s);
    check_sink(c, &k, ids, how);
}

static void test_whole(void **state) {
    (void)state;
    for (size_t i = 0; i < NUM_CASES; i++) {
        char ids[MAX_CALLS][32];
        check_whole(&cases[i], 42, ids);
    }
}

static void test_every_cut(void **state) {
    (void)state;
    for (size_t i = 0; i < NUM_CASES; i++) {
        const tcase *c = &cases[i];
        char ids[MAX_CALLS][32];
        check_whole(c, 1000 + i, ids);
        size_t len = strlen(c->text);
        stream_cuts(c, 1000 + i, ids, NULL, 0, "no cut");
        for (size_t cut = 1; cut < len; cut++) stream_cuts(c, 1000 + i, ids, &cut, 1, "one cut");
    }
}

static void test_every_two_cuts(void **state) {
    (void)state;
    for (size_t i = 0; i < NUM_CASES; i++) {
        const tcase *c = &cases[i];
        char ids[MAX_CALLS][32];
        check_whole(c, 7, ids);
        size_t len = strlen(c->text);
        if (len > 160) continue; /* the longest take the random cuts below */
        for (size_t a = 1; a < len; a++)
            for (size_t b = a + 1; b < len; b++) {
                size_t cuts[2] = {a, b};
                stream_cuts(c, 7, ids, cuts, 2, "two cuts");
            }
    }
}

static void test_byte_by_byte(void **state) {
    (void)state;
    for (size_t i = 0; i < NUM_CASES; i++) {
        const tcase *c = &cases[i];
        char ids[MAX_CALLS][32];
        check_whole(c, 99, ids);
        size_t len = strlen(c->text), cuts[1024];
        assert_true(len < 1024);
        for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
        stream_cuts(c, 99, ids, cuts, len ? (int)len - 1 : 0, "byte by byte");
    }
}

static void test_random_cuts(void **state) {
    (void)state;
    uint64_t counter = 0;
    for (size_t i = 0; i < NUM_CASES; i++) {
        const tcase *c = &cases[i];
        char ids[MAX_CALLS][32];
        check_whole(c, 5, ids);
        size_t len = strlen(c->text);
        for (int trial = 0; trial < 300; trial++) {
            size_t cuts[1024];
            int n = 0;
            for (size_t at = 0;;) {
                at += 1 + rp_rand_u64(11, 2, counter++) % 9;
                if (at >= len) break;
                cuts[n++] = at;
            }
            stream_cuts(c, 5, ids, cuts, n, "random cuts");
        }
    }
}

/* Content streams as it comes: held back is at most a marker's prefix, the
 * whitespace before it and a UTF-8 character's first bytes. */
static void test_holds_little(void **state) {
    (void)state;
    const char *text = "Sure — here is the plan: first <b>bold</b> [TOOL not a tag, <tool_ nor this; 日本語 🎉 done.";
    for (int parser = 0; parser < 3; parser++) {
        rp_tool_stream *s = rp_tool_stream_new((rp_tool_parser)parser, 1);
        tsink k = {0};
        size_t len = strlen(text);
        for (size_t at = 0; at < len; at++) {
            assert_int_equal(rp_tool_stream_feed(s, text + at, 1, on_event, &k), 0);
            if (k.content_bytes + 14 < at + 1) fail_msg("parser %d held back %zu bytes", parser, at + 1 - k.content_bytes);
        }
        assert_int_equal(rp_tool_stream_finish(s, on_event, &k), 0);
        assert_null(k.error);
        assert_string_equal(k.content.p, text);
        rp_tool_stream_free(s);
        sink_free(&k);
    }
}

static void test_ids(void **state) {
    (void)state;
    const char *two = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
    rp_tool_parsed x, y, z;
    assert_int_equal(rp_tool_parse(RP_TOOL_PARSER_HERMES, two, strlen(two), 1, &x), 0);
    assert_int_equal(rp_tool_parse(RP_TOOL_PARSER_HERMES, two, strlen(two), 1, &y), 0);
    assert_int_equal(rp_tool_parse(RP_TOOL_PARSER_HERMES, two, strlen(two), 2, &z), 0);
    assert_int_equal(x.num_calls, 2);
    assert_string_equal(x.calls[0].id, y.calls[0].id); /* same seed, same ids */
    assert_string_equal(x.calls[1].id, y.calls[1].id);
    assert_string_not_equal(x.calls[0].id, x.calls[1].id);
    assert_string_not_equal(x.calls[0].id, z.calls[0].id);
    rp_tool_parsed_free(&x);
    rp_tool_parsed_free(&y);
    rp_tool_parsed_free(&z);
    rp_tool_parser p;
    assert_int_equal(rp_tool_parser_from_name("hermes", &p), 0);
    assert_int_equal(p, RP_TOOL_PARSER_HERMES);
    assert_int_equal(rp_tool_parser_from_name("llama3_json", &p), 0);
    assert_int_equal(p, RP_TOOL_PARSER_LLAMA3_JSON);
    assert_int_equal(rp_tool_parser_from_name("mistral", &p), 0);
    assert_int_equal(p, RP_TOOL_PARSER_MISTRAL);
    assert_int_equal(rp_tool_parser_from_name("pythonic", &p), -1);
}

/* A call's arguments stream as a whole call: a long one (a file's text, as
 * coding agents send) fed in small pieces, and JSON nested deeper than the
 * scanner follows, which is content. */
static void test_long_and_deep(void **state) {
    (void)state;
    rp_sbuf t = {0}, want = {0};
    rp_sbuf_add_str(&t, "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.c\", \"text\": \"");
    rp_sbuf_add_str(&want, "{\"path\":\"a.c\",\"text\":\"");
    for (int i = 0; i < 2000; i++) {
        rp_sbuf_add_str(&t, "int f(void) { return [1]; }\\n");
        rp_sbuf_add_str(&want, "int f(void) { return [1]; }\\n");
    }
    rp_sbuf_add_str(&t, "\"}}\n</tool_call>");
    rp_sbuf_add_str(&want, "\"}");
    rp_tool_stream *s = rp_tool_stream_new(RP_TOOL_PARSER_HERMES, 3);
    tsink k = {0};
    for (size_t at = 0; at < t.len; at += 3)
        assert_int_equal(rp_tool_stream_feed(s, t.p + at, t.len - at < 3 ? t.len - at : 3, on_event, &k), 0);
    assert_int_equal(rp_tool_stream_finish(s, on_event, &k), 0);
    assert_int_equal(k.num_calls, 1);
    assert_string_equal(k.args[0].p, want.p);
    assert_null(k.content.p);
    rp_tool_stream_free(s);
    sink_free(&k);

    rp_sbuf deep = {0};
    rp_sbuf_add_str(&deep, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ");
    for (int i = 0; i < 200; i++) rp_sbuf_add_str(&deep, "[");
    for (int i = 0; i < 200; i++) rp_sbuf_add_str(&deep, "]");
    rp_sbuf_add_str(&deep, "}}</tool_call>");
    rp_tool_parsed out;
    assert_int_equal(rp_tool_parse(RP_TOOL_PARSER_HERMES, deep.p, deep.len, 1, &out), 0);
    assert_int_equal(out.num_calls, 0);
    assert_string_equal(out.content, deep.p);
    rp_tool_parsed_free(&out);
    rp_sbuf_free(&t);
    rp_sbuf_free(&want);
    rp_sbuf_free(&deep);
}

/* A callback's error stops the stream and comes back as it was, also from
 * later calls. */
static int refuse(void *ctx, const rp_tool_event *ev) {
    (void)ctx, (void)ev;
    return 1;
}

static void test_emit_error(void **state) {
    (void)state;
    rp_tool_stream *s = rp_tool_stream_new(RP_TOOL_PARSER_HERMES, 1);
    assert_int_equal(rp_tool_stream_feed(s, "<tool_call>{\"name\": \"a\"}</tool_call>", 36, refuse, NULL), 1);
    assert_int_equal(rp_tool_stream_feed(s, "x", 1, refuse, NULL), 1);
    assert_int_equal(rp_tool_stream_finish(s, refuse, NULL), 1);
    rp_tool_stream_free(s);
    s = rp_tool_stream_new(RP_TOOL_PARSER_LLAMA3_JSON, 1);
    assert_int_equal(rp_tool_stream_feed(s, "hello", 5, refuse, NULL), 1);
    rp_tool_stream_free(s);
}

/* Texts made of random pieces of calls, markers, JSON and text: the stream
 * at random cuts and byte by byte agrees with the whole-output parse, and
 * an output with no call comes back as content unchanged. */
static const char *const pieces[] = {
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "[ARGS]", "[CALL_ID]", "{", "}", "[", "]",
    "\"name\"", "\"arguments\"", "\"parameters\"", ":", ",", ";", " ", "\n", "\"f\"", "\"日本\"", "1", "-2.5e3",
    "true", "null", "\"a\\\"b\"", "{\"name\": \"g\", \"arguments\": {\"x\": [1, \"é\"]}}",
    "{\"name\": \"h\", \"parameters\": {}}", "[{\"name\": \"m\", \"arguments\": {\"k\": null}}]", "get", "Hi ", "🎉",
    "<", "<tool", "[TOOL", "\\",
};

static void test_random_texts(void **state) {
    (void)state;
    uint64_t counter = 0;
    int with_calls = 0;
    for (int t = 0; t < 3000; t++) {
        char text[512];
        size_t len = 0;
        int num = 1 + (int)(rp_rand_u64(3, 1, counter++) % 14);
        for (int i = 0; i < num; i++) {
            const char *piece = pieces[rp_rand_u64(3, 1, counter++) % (sizeof pieces / sizeof pieces[0])];
            memcpy(text + len, piece, strlen(piece));
            len += strlen(piece);
        }
        text[len] = 0;
        for (int parser = 0; parser < 3; parser++) {
            rp_tool_parsed whole;
            assert_int_equal(rp_tool_parse((rp_tool_parser)parser, text, len, 17, &whole), 0);
            if (whole.num_calls > MAX_CALLS) {
                rp_tool_parsed_free(&whole);
                continue;
            }
            if (!whole.num_calls && (len ? !whole.content || strcmp(whole.content, text) : whole.content != NULL))
                fail_msg("parser %d: no call, but content [%s] of [%s]", parser, whole.content, text);
            with_calls += whole.num_calls > 0;
            tcase c = {(rp_tool_parser)parser, text, whole.content, whole.num_calls, {{0}}};
            char ids[MAX_CALLS][32];
            for (int i = 0; i < whole.num_calls; i++) {
                c.calls[i].name = whole.calls[i].name;
                c.calls[i].arguments = whole.calls[i].arguments;
                snprintf(ids[i], 32, "%s", whole.calls[i].id);
            }
            size_t cuts[512];
            for (int trial = 0; trial < 4; trial++) {
                int n = 0;
                for (size_t at = 0;;) {
                    at += 1 + rp_rand_u64(5, 3, counter++) % (trial == 0 ? 1 : 12);
                    if (at >= len) break;
                    cuts[n++] = at;
                }
                stream_cuts(&c, 17, ids, cuts, n, "random text");
            }
            rp_tool_parsed_free(&whole);
        }
    }
    assert_true(with_calls > 100); /* the pieces do make calls */
}

/* As the server chains them: the reasoning parser first, its content into
 * the tool parser; a <tool_call> the model only thinks about stays in the
 * reasoning. Every cut of the text gives the same result. */
typedef struct {
    rp_tool_stream *tools;
    tsink *sink;
    rp_sbuf reasoning;
} chain;

static int chain_piece(void *ctx, int is_reasoning, const char *text, size_t len) {
    chain *c = ctx;
    if (is_reasoning) return rp_sbuf_add(&c->reasoning, text, len);
    return rp_tool_stream_feed(c->tools, text, len, on_event, c->sink);
}

static void test_after_reasoning(void **state) {
    (void)state;
    const char *text = "<think>\nThe user wants the weather; I should emit <tool_call>{\"name\": \"x\"}</tool_call>.\n</think>\n\n"
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
    const tcase want = {H, "(chained)", NULL, 1, {{"get_weather", "{\"city\":\"Zürich\"}"}}};
    const char *want_reasoning = "\nThe user wants the weather; I should emit <tool_call>{\"name\": \"x\"}</tool_call>.\n";
    char ids[MAX_CALLS][32];
    rp_tool_parsed whole;
    assert_int_equal(rp_tool_parse(RP_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"a\"}</tool_call>", 36, 9, &whole), 0);
    snprintf(ids[0], 32, "%s", whole.calls[0].id);
    rp_tool_parsed_free(&whole);
    size_t len = strlen(text);
    for (size_t cut = 0; cut < len; cut++) {
        tsink k = {0};
        chain c = {.tools = rp_tool_stream_new(RP_TOOL_PARSER_HERMES, 9), .sink = &k};
        rp_reasoning_stream *r = rp_reasoning_stream_new(RP_REASONING_QWEN3, RP_THINK_UNKNOWN);
        assert_int_equal(rp_reasoning_stream_feed(r, text, cut, chain_piece, &c), 0);
        assert_int_equal(rp_reasoning_stream_feed(r, text + cut, len - cut, chain_piece, &c), 0);
        assert_int_equal(rp_reasoning_stream_finish(r, chain_piece, &c), 0);
        assert_int_equal(rp_tool_stream_finish(c.tools, on_event, &k), 0);
        assert_string_equal(c.reasoning.p, want_reasoning);
        check_sink(&want, &k, ids, "after reasoning");
        rp_reasoning_stream_free(r);
        rp_tool_stream_free(c.tools);
        rp_sbuf_free(&c.reasoning);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),         cmocka_unit_test(test_every_cut),   cmocka_unit_test(test_every_two_cuts),
        cmocka_unit_test(test_byte_by_byte),  cmocka_unit_test(test_random_cuts), cmocka_unit_test(test_holds_little),
        cmocka_unit_test(test_ids),           cmocka_unit_test(test_long_and_deep), cmocka_unit_test(test_emit_error),
        cmocka_unit_test(test_after_reasoning), cmocka_unit_test(test_random_texts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
