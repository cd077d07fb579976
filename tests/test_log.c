/* util/log.c: the text and JSON lines (timestamp, level, escaping, typed
 * fields, a record too long cut at a field with valid JSON), the level and
 * format parsers, and REPLAY_LOG's warning. stderr is captured in a file. */
#include <fcntl.h>
#include <math.h>
#include <regex.h>
#include <unistd.h>

#include <jansson.h>

#include "util/log.h"
#include "test_util.h"

static char path[64];
static int saved_stderr = -1;

/* What the logger writes from now on goes to a fresh file. */
static void capture(void) {
    snprintf(path, sizeof path, "/tmp/rp_log_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    if (saved_stderr < 0) saved_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Everything written since capture(); stderr back to what it was. */
static char *captured(void) {
    dup2(saved_stderr, 2);
    char *s = test_read_file(path, NULL);
    unlink(path);
    return s;
}

static void expect_match(const char *s, const char *re) {
    regex_t r;
    assert_int_equal(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&r, s, 0, NULL, 0);
    regfree(&r);
    if (rc) fail_msg("'%s' does not match %s", s, re);
}

static void test_parse(void **state) {
    (void)state;
    enum rp_log_level l;
    enum rp_log_format f;
    assert_int_equal(rp_log_parse_level("error", &l), 0), assert_int_equal(l, RP_LOG_ERROR);
    assert_int_equal(rp_log_parse_level("warn", &l), 0), assert_int_equal(l, RP_LOG_WARN);
    assert_int_equal(rp_log_parse_level("WARNING", &l), 0), assert_int_equal(l, RP_LOG_WARN);
    assert_int_equal(rp_log_parse_level("Info", &l), 0), assert_int_equal(l, RP_LOG_INFO);
    assert_int_equal(rp_log_parse_level("debug", &l), 0), assert_int_equal(l, RP_LOG_DEBUG);
    assert_int_equal(rp_log_parse_level("trace", &l), -1);
    assert_int_equal(rp_log_parse_level("", &l), -1);
    assert_int_equal(rp_log_parse_level(NULL, &l), -1);
    assert_int_equal(rp_log_parse_format("json", &f), 0), assert_int_equal(f, RP_LOG_JSON);
    assert_int_equal(rp_log_parse_format("text", &f), 0), assert_int_equal(f, RP_LOG_TEXT);
    assert_int_equal(rp_log_parse_format("xml", &f), -1);
}

/* REPLAY_LOG is read at the first use of the level: a bad value is one warning. */
static void test_env(void **state) {
    (void)state;
    setenv("REPLAY_LOG", "xyz", 1);
    capture();
    rp_log_info("first");
    rp_log_info("second");
    char *s = captured();
    expect_match(s, "^[0-9-]+ [0-9:.]+ WARN  REPLAY_LOG=xyz is not a level \\(error, warn, info, debug\\); using info\n"
                    "[0-9-]+ [0-9:.]+ INFO  first\n[0-9-]+ [0-9:.]+ INFO  second\n$");
    free(s);
    unsetenv("REPLAY_LOG");
}

static void test_text(void **state) {
    (void)state;
    rp_log_set_level(RP_LOG_INFO);
    rp_log_set_format(RP_LOG_TEXT);
    capture();
    rp_log_debug("not shown");
    rp_log_warn("two\nlines\x01");
    rp_log_field f[] = {rp_log_str("id", "cmpl-1"), rp_log_str("route", "/a b\"c\n"), rp_log_int("status", 200),
                        rp_log_double("ttft_ms", 12.345), rp_log_double("none", NAN), rp_log_str("nil", NULL),
                        rp_log_str("empty", "")};
    rp_log_fields(RP_LOG_INFO, "request", f, 7);
    char *s = captured();
    expect_match(s, "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} WARN  two\\\\nlines\\\\x01\n"
                    "[0-9-]+ [0-9:.]+ INFO  request id=cmpl-1 route=\"/a b\\\\\"c\\\\n\" status=200 ttft_ms=12\\.3 "
                    "none=- nil=- empty=\"\"\n$");
    free(s);
}

static void test_json(void **state) {
    (void)state;
    rp_log_set_level(RP_LOG_DEBUG);
    rp_log_set_format(RP_LOG_JSON);
    capture();
    rp_log_debug("quote \" backslash \\ newline \n bad utf-8 \xff\xfe é");
    rp_log_field f[] = {rp_log_str("client", "[::1]:5000"), rp_log_int("status", 404), rp_log_double("ms", 1.25),
                        rp_log_double("none", INFINITY), rp_log_str("id", NULL)};
    rp_log_fields(RP_LOG_INFO, "request", f, 5);
    /* a record longer than a line: cut at a field, still JSON */
    static char big[6000];
    memset(big, 'x', sizeof big - 1);
    rp_log_field g[] = {rp_log_str("a", big), rp_log_str("b", big), rp_log_int("c", 1)};
    rp_log_fields(RP_LOG_WARN, "long", g, 3);
    char *s = captured();
    rp_log_set_format(RP_LOG_TEXT);
    rp_log_set_level(RP_LOG_INFO);
    char *line = s, *next;
    int n = 0;
    for (; (next = strchr(line, '\n')); line = next + 1, n++) {
        *next = 0;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) fail_msg("line %d is not JSON (%s): %.200s", n, je.text, line);
        const char *ts = json_string_value(json_object_get(j, "ts"));
        expect_match(ts, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$");
        const char *msg = json_string_value(json_object_get(j, "msg"));
        if (n == 0) {
            assert_string_equal(json_string_value(json_object_get(j, "level")), "debug");
            assert_string_equal(msg, "quote \" backslash \\ newline \n bad utf-8 \xef\xbf\xbd\xef\xbf\xbd é");
        } else if (n == 1) {
            assert_string_equal(json_string_value(json_object_get(j, "level")), "info");
            assert_string_equal(msg, "request");
            assert_string_equal(json_string_value(json_object_get(j, "client")), "[::1]:5000");
            assert_true(json_is_integer(json_object_get(j, "status")));
            assert_int_equal(json_integer_value(json_object_get(j, "status")), 404);
            assert_true(json_is_real(json_object_get(j, "ms")));
            assert_true(json_is_null(json_object_get(j, "none")));
            assert_true(json_is_null(json_object_get(j, "id")));
        } else {
            assert_string_equal(msg, "long");
            assert_int_equal(strlen(json_string_value(json_object_get(j, "a"))), sizeof big - 1);
            assert_null(json_object_get(j, "b"));
            assert_null(json_object_get(j, "c"));
            assert_true(json_is_true(json_object_get(j, "truncated")));
        }
        json_decref(j);
    }
    assert_int_equal(n, 3);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse), cmocka_unit_test(test_env), cmocka_unit_test(test_text),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
