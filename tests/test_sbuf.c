/* The server's string buffer (src/server/sbuf.c) when memory runs out: an
 * append that cannot grow the buffer fails and leaves it as it was, and so
 * does a Server-Sent Event or a JSON text built on it (openai_json.c), so
 * the server can answer with an error instead of bytes with a hole in them.
 * realloc is wrapped (-Wl,--wrap=realloc, CMakeLists.txt) to fail on
 * demand, once. */
#include "server/openai_json.h"
#include "server/sbuf.h"
#include "test_util.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

static long realloc_budget = -1; /* reallocs that succeed before one fails; < 0: none fails */
static int realloc_failed;

void *__wrap_realloc(void *p, size_t n) {
    if (realloc_budget == 0) {
        realloc_budget = -1;
        realloc_failed = 1;
        return NULL;
    }
    if (realloc_budget > 0) realloc_budget--;
    return __real_realloc(p, n);
}

static int sbuf_printf(rp_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sbuf_printf(rp_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = rp_sbuf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

static void fail_realloc_after(long n) {
    realloc_budget = n;
    realloc_failed = 0;
}

static void test_append(void **state) {
    (void)state;
    rp_sbuf b = {0};
    assert_int_equal(rp_sbuf_add(&b, "", 0), 0); /* empty, but a string */
    assert_string_equal(b.p, "");
    assert_int_equal(rp_sbuf_add_str(&b, "data: "), 0);
    assert_int_equal(sbuf_printf(&b, "%d tokens", 42), 0);
    assert_string_equal(b.p, "data: 42 tokens");
    assert_int_equal(b.len, strlen("data: 42 tokens"));
    /* a failed append changes nothing */
    char big[4096];
    memset(big, 'x', sizeof big);
    fail_realloc_after(0);
    assert_int_equal(rp_sbuf_add(&b, big, sizeof big), -1);
    assert_true(realloc_failed);
    assert_string_equal(b.p, "data: 42 tokens");
    fail_realloc_after(0);
    assert_int_equal(sbuf_printf(&b, "%.4000s", big), -1);
    assert_string_equal(b.p, "data: 42 tokens");
    assert_int_equal(rp_sbuf_add(&b, big, SIZE_MAX - 8), -1); /* len would overflow: refused, not wrapped */
    assert_int_equal(b.len, strlen("data: 42 tokens"));
    /* and the next one works */
    assert_int_equal(rp_sbuf_add(&b, big, sizeof big), 0);
    assert_int_equal(b.len, strlen("data: 42 tokens") + sizeof big);
    rp_sbuf_truncate(&b, 4);
    assert_string_equal(b.p, "data");
    rp_sbuf_free(&b);
    assert_null(b.p);
}

/* An event (or a JSON text) is added whole or not at all, wherever the
 * allocation fails. */
static void test_event_whole_or_nothing(void **state) {
    (void)state;
    static const char prefix[] = "data: {\"a\":1}\n\n";
    rp_sbuf want = {0};
    rp_oai_response r = {.kind = RP_OAI_CHAT, .id = "chatcmpl-1", .created = 7, .model = "m"};
    assert_int_equal(rp_sbuf_add_str(&want, prefix), 0);
    char text[3000];
    memset(text, 'y', sizeof text); /* large enough to make the buffer grow on the way */
    assert_int_equal(rp_oai_sse_add(&want, rp_oai_chunk(&r, 0, text, sizeof text, RP_FINISH_REASON_NONE, NULL)), 0);
    int failures = 0;
    for (long n = 0;; n++) {
        rp_sbuf b = {0};
        assert_int_equal(rp_sbuf_add_str(&b, prefix), 0);
        fail_realloc_after(n);
        int rc = rp_oai_sse_add(&b, rp_oai_chunk(&r, 0, text, sizeof text, RP_FINISH_REASON_NONE, NULL));
        int failed = realloc_failed;
        fail_realloc_after(-1);
        if (failed) {
            failures++;
            assert_int_equal(rc, -1);
            assert_string_equal(b.p, prefix);
        } else {
            assert_int_equal(rc, 0);
            assert_string_equal(b.p, want.p);
        }
        rp_sbuf_free(&b);
        if (!failed) break;
    }
    assert_true(failures >= 1);
    /* a JSON text: NULL, never a string cut short */
    char *want_json = rp_oai_json_dumps(rp_oai_chunk(&r, 0, text, sizeof text, RP_FINISH_REASON_NONE, NULL));
    assert_non_null(want_json);
    assert_int_equal(strlen(want.p), strlen(prefix) + strlen("data: ") + strlen(want_json) + 2);
    for (long n = 0;; n++) {
        fail_realloc_after(n);
        char *s = rp_oai_json_dumps(rp_oai_chunk(&r, 0, text, sizeof text, RP_FINISH_REASON_NONE, NULL));
        int failed = realloc_failed;
        fail_realloc_after(-1);
        if (failed) assert_null(s);
        else assert_string_equal(s, want_json);
        free(s);
        if (!failed) break;
    }
    free(want_json);
    rp_sbuf_free(&want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_event_whole_or_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
