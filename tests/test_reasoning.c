/* The <think> reasoning parsers (src/server/reasoning.c): recorded-style
 * Qwen3 and DeepSeek-R1 outputs split whole, and the same outputs streamed
 * cut at every byte boundary, one byte at a time and at seeded random cuts,
 * must give the same reasoning and content; pieces never end inside a
 * UTF-8 sequence, reasoning never follows content, and a stream whose
 * prompt state is known holds back no more than a tag's worth. */
#include "server/reasoning.h"
#include "server/sbuf.h"
#include "test_util.h"
#include "util/rng.h"

typedef struct {
    rp_reasoning_kind kind;
    rp_think_prompt prompt;
    const char *text;
    const char *reasoning; /* NULL: none */
    const char *content;
} rcase;

#define Q RP_REASONING_QWEN3
#define R1 RP_REASONING_DEEPSEEK_R1
#define UNK RP_THINK_UNKNOWN
#define OPEN RP_THINK_OPEN
#define CLOSED RP_THINK_CLOSED

static const rcase cases[] = {
    /* Qwen3 thinking on, the model opens the block itself */
    {Q, UNK, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "\nThe user greets me.\n",
     "\n\nHello! How can I help?"},
    /* Qwen3 thinking off: no tags at all */
    {Q, UNK, "Hello! How can I help?", NULL, "Hello! How can I help?"},
    {Q, CLOSED, "Hello! How can I help?", NULL, "Hello! How can I help?"},
    /* thinking off in the prompt: even tags the model writes are content */
    {Q, CLOSED, "<think>x</think>y", NULL, "<think>x</think>y"},
    /* the template opened <think> in the prompt: only </think> comes out */
    {Q, UNK, "Let me think: 2+2=4.\n</think>\n\nIt is 4.", "Let me think: 2+2=4.\n", "\n\nIt is 4."},
    {Q, OPEN, "Let me think: 2+2=4.\n</think>\n\nIt is 4.", "Let me think: 2+2=4.\n", "\n\nIt is 4."},
    /* open prompt, cut short while thinking: all reasoning */
    {Q, OPEN, "Still thinking about ∑ and 日本", "Still thinking about ∑ and 日本", NULL},
    /* <think> opened by the model, cut short */
    {Q, UNK, "<think>Hmm, 🤔 maybe", "Hmm, 🤔 maybe", NULL},
    /* open prompt and the model repeats <think> anyway (older templates): dropped */
    {Q, OPEN, "<think>a</think>b", "a", "b"},
    /* empty thinking: reasoning NULL, content kept */
    {Q, UNK, "<think>\n\n</think>\n\nDone.", "\n\n", "\n\nDone."},
    {Q, UNK, "<think></think>Done.", NULL, "Done."},
    {Q, UNK, "<think>only</think>", "only", NULL},
    /* only the first </think> ends the block; later tags are content */
    {Q, UNK, "<think>a</think>b</think>c<think>d", "a", "b</think>c<think>d"},
    /* tag-like text that is not a tag */
    {Q, UNK, "<thin>k</thinking> <think", NULL, "<thin>k</thinking> <think"},
    {Q, UNK, "<think>a </thin k> b</think>c", "a </thin k> b", "c"},
    {Q, UNK, " <think>x</think>y", " <think>x", "y"}, /* not at the start: the unknown-prompt rule */
    {Q, UNK, "", NULL, NULL},
    {Q, UNK, "<", NULL, "<"},
    {Q, UNK, "<think", NULL, "<think"},
    {Q, UNK, "<think>", NULL, NULL},
    {Q, OPEN, "", NULL, NULL},
    {Q, UNK, "</think>", NULL, NULL},
    {Q, UNK, "a</think", NULL, "a</think"},
    /* DeepSeek-R1 */
    {R1, UNK, "<think>\nOkay, 9.11 < 9.8.\n</think>\n\n9.8 is greater.", "\nOkay, 9.11 < 9.8.\n", "\n\n9.8 is greater."},
    {R1, UNK, "Okay, 9.11 < 9.8.\n</think>\n\n9.8 is greater.", "Okay, 9.11 < 9.8.\n", "\n\n9.8 is greater."},
    {R1, UNK, "No end tag: all of it is reasoning.", "No end tag: all of it is reasoning.", NULL},
    {R1, OPEN, "x</think>y", "x", "y"},
    {R1, CLOSED, "x</think>y", NULL, "x</think>y"},
    {R1, UNK, "a</thin", "a</thin", NULL},
    {R1, UNK, "", NULL, NULL},
    {R1, UNK, "<think>", NULL, NULL},
    {R1, UNK, "<think>é</think>ü", "é", "ü"},
};

/* ---- a stream's pieces, checked as they come ----------------------------- */

typedef struct {
    rp_sbuf part[2];
    int seen_content;
    int bad_order;
    int cut_utf8;
    int empty;
    size_t emitted;
} sink;

static int ends_inside_utf8(const char *s, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back;
    }
    return 0;
}

static int on_piece(void *ctx, int is_reasoning, const char *text, size_t len) {
    sink *k = ctx;
    if (!len) k->empty = 1;
    if (is_reasoning && k->seen_content) k->bad_order = 1;
    if (!is_reasoning) k->seen_content = 1;
    if (ends_inside_utf8(text, len)) k->cut_utf8 = 1;
    k->emitted += len;
    return rp_sbuf_add(&k->part[is_reasoning ? 1 : 0], text, len);
}

static void check_sink(const rcase *c, sink *k, const char *how) {
    const char *r = k->part[1].p, *t = k->part[0].p;
    if ((c->reasoning == NULL) != (r == NULL) || (r && strcmp(r, c->reasoning)))
        fail_msg("%s: %s: reasoning [%s], want [%s]", how, c->text, r ? r : "(null)",
                 c->reasoning ? c->reasoning : "(null)");
    if ((c->content == NULL) != (t == NULL) || (t && strcmp(t, c->content)))
        fail_msg("%s: %s: content [%s], want [%s]", how, c->text, t ? t : "(null)", c->content ? c->content : "(null)");
    assert_false(k->bad_order);
    assert_false(k->cut_utf8);
    assert_false(k->empty);
    rp_sbuf_free(&k->part[0]);
    rp_sbuf_free(&k->part[1]);
}

/* Streams text cut at the given points (sorted, inside (0, len)). */
static void stream_cuts(const rcase *c, const size_t *cuts, int num_cuts, const char *how) {
    size_t len = strlen(c->text);
    rp_reasoning_stream *s = rp_reasoning_stream_new(c->kind, c->prompt);
    assert_non_null(s);
    sink k = {0};
    size_t at = 0;
    for (int i = 0; i <= num_cuts; i++) {
        size_t end = i < num_cuts ? cuts[i] : len;
        assert_int_equal(rp_reasoning_stream_feed(s, c->text + at, end - at, on_piece, &k), 0);
        at = end;
    }
    assert_int_equal(rp_reasoning_stream_finish(s, on_piece, &k), 0);
    rp_reasoning_stream_free(s);
    check_sink(c, &k, how);
}

static void test_whole(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rcase *c = &cases[i];
        rp_reasoning_split out;
        assert_int_equal(rp_reasoning_parse(c->kind, c->prompt, c->text, strlen(c->text), &out), 0);
        sink k = {0};
        if (out.reasoning) rp_sbuf_add_str(&k.part[1], out.reasoning);
        if (out.content) rp_sbuf_add_str(&k.part[0], out.content);
        check_sink(c, &k, "whole");
        rp_reasoning_split_free(&out);
    }
}

static void test_every_cut(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rcase *c = &cases[i];
        size_t len = strlen(c->text);
        for (size_t cut = 1; cut < len; cut++) stream_cuts(c, &cut, 1, "one cut");
        for (size_t a = 1; a < len; a++)
            for (size_t b = a + 1; b < len; b++) {
                size_t cuts[2] = {a, b};
                stream_cuts(c, cuts, 2, "two cuts");
            }
    }
}

/* One byte at a time, and how much the stream holds back meanwhile. */
static void test_byte_by_byte(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rcase *c = &cases[i];
        size_t len = strlen(c->text);
        rp_reasoning_stream *s = rp_reasoning_stream_new(c->kind, c->prompt);
        sink k = {0};
        int undecided = c->kind == RP_REASONING_QWEN3 && c->prompt == RP_THINK_UNKNOWN && strncmp(c->text, "<think>", 7);
        for (size_t at = 0; at < len; at++) {
            assert_int_equal(rp_reasoning_stream_feed(s, c->text + at, 1, on_piece, &k), 0);
            /* at most two tags (15 bytes) consumed, 7 held, 3 of a UTF-8 character */
            if (!undecided && k.emitted + 25 < at + 1) fail_msg("%s: held back %zu bytes", c->text, at + 1 - k.emitted);
        }
        assert_int_equal(rp_reasoning_stream_finish(s, on_piece, &k), 0);
        rp_reasoning_stream_free(s);
        check_sink(c, &k, "byte by byte");
    }
}

static void test_random_cuts(void **state) {
    (void)state;
    uint64_t counter = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const rcase *c = &cases[i];
        size_t len = strlen(c->text);
        if (len < 2) continue;
        for (int trial = 0; trial < 200; trial++) {
            size_t cuts[16];
            int n = 0;
            for (size_t at = 0;;) {
                at += 1 + rp_rand_u64(7, 1, counter++) % 6;
                if (at >= len || n == 16) break;
                cuts[n++] = at;
            }
            stream_cuts(c, cuts, n, "random cuts");
        }
    }
}

static void test_prompt_state(void **state) {
    (void)state;
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const char *plain = "<|im_start|>assistant\n";
    assert_int_equal(rp_reasoning_prompt_state(open, strlen(open)), RP_THINK_OPEN);
    assert_int_equal(rp_reasoning_prompt_state(closed, strlen(closed)), RP_THINK_CLOSED);
    assert_int_equal(rp_reasoning_prompt_state(plain, strlen(plain)), RP_THINK_UNKNOWN);
    assert_int_equal(rp_reasoning_prompt_state("", 0), RP_THINK_UNKNOWN);
    assert_int_equal(rp_reasoning_prompt_state("\n", 1), RP_THINK_UNKNOWN);
    rp_reasoning_kind k;
    assert_int_equal(rp_reasoning_from_name("qwen3", &k), 0);
    assert_int_equal(k, RP_REASONING_QWEN3);
    assert_int_equal(rp_reasoning_from_name("deepseek_r1", &k), 0);
    assert_int_equal(k, RP_REASONING_DEEPSEEK_R1);
    assert_int_equal(rp_reasoning_from_name("granite", &k), -1);
}

/* Texts made of random pieces of tags and text, under every parser and
 * prompt state: the stream at random cuts and byte by byte agrees with the
 * whole-output split, and only tags go missing. */
static void test_random_texts(void **state) {
    (void)state;
    static const char *const pieces[] = {"<think>", "</think>", "<", "</", "<think", "</think", "think>", "\n", " ",
                                         "a", "é", "日本", "🎉", ">"};
    uint64_t counter = 0;
    for (int t = 0; t < 3000; t++) {
        char text[256];
        size_t len = 0;
        int num = (int)(rp_rand_u64(9, 1, counter++) % 10);
        for (int i = 0; i < num; i++) {
            const char *piece = pieces[rp_rand_u64(9, 1, counter++) % (sizeof pieces / sizeof pieces[0])];
            memcpy(text + len, piece, strlen(piece));
            len += strlen(piece);
        }
        text[len] = 0;
        for (int kind = 0; kind < 2; kind++)
            for (int prompt = 0; prompt < 3; prompt++) {
                rp_reasoning_split whole;
                assert_int_equal(rp_reasoning_parse((rp_reasoning_kind)kind, (rp_think_prompt)prompt, text, len, &whole), 0);
                size_t kept = (whole.reasoning ? strlen(whole.reasoning) : 0) + (whole.content ? strlen(whole.content) : 0);
                assert_true(kept <= len && kept + 15 >= len);
                rcase c = {(rp_reasoning_kind)kind, (rp_think_prompt)prompt, text, whole.reasoning, whole.content};
                size_t cuts[256];
                for (int trial = 0; trial < 3; trial++) {
                    int n = 0;
                    for (size_t at = 0;;) {
                        at += 1 + rp_rand_u64(9, 2, counter++) % (trial == 0 ? 1 : 8);
                        if (at >= len) break;
                        cuts[n++] = at;
                    }
                    stream_cuts(&c, cuts, n, "random text");
                }
                rp_reasoning_split_free(&whole);
            }
    }
}

/* A callback's error stops the stream and comes back as it was, also from
 * later calls. */
static int refuse(void *ctx, int is_reasoning, const char *text, size_t len) {
    (void)ctx, (void)is_reasoning, (void)text, (void)len;
    return 7;
}

static void test_emit_error(void **state) {
    (void)state;
    rp_reasoning_stream *s = rp_reasoning_stream_new(RP_REASONING_QWEN3, RP_THINK_OPEN);
    assert_int_equal(rp_reasoning_stream_feed(s, "abc", 3, refuse, NULL), 7);
    assert_int_equal(rp_reasoning_stream_feed(s, "d", 1, refuse, NULL), 7);
    assert_int_equal(rp_reasoning_stream_finish(s, refuse, NULL), 7);
    rp_reasoning_stream_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),        cmocka_unit_test(test_every_cut),   cmocka_unit_test(test_byte_by_byte),
        cmocka_unit_test(test_random_cuts),  cmocka_unit_test(test_prompt_state), cmocka_unit_test(test_emit_error),
        cmocka_unit_test(test_random_texts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
