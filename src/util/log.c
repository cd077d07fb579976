/* Logging (log.h) and the monotonic clock.
 *
 * A record is built in a stack buffer and written with one write(2): no
 * lock, no allocation, and lines from threads logging at once stay whole
 * (a write of a few KiB to a pipe or a terminal is not split). The buffer
 * fills all or nothing per escaped character and per field, so a record
 * that does not fit is cut at a field boundary and JSON stays valid. */
#include "util/log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int g_level = -1; /* atomic; -1 until set or read from REPLAY_LOG */
static int g_format = RP_LOG_TEXT; /* atomic */

/* ---- levels and formats -------------------------------------------------------- */

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_labels[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

int rp_log_parse_level(const char *s, enum rp_log_level *out) {
    if (!s) return -1;
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, level_names[i])) {
            *out = (enum rp_log_level)i;
            return 0;
        }
    if (!strcasecmp(s, "warning")) {
        *out = RP_LOG_WARN;
        return 0;
    }
    return -1;
}

int rp_log_parse_format(const char *s, enum rp_log_format *out) {
    if (s && !strcasecmp(s, "text")) *out = RP_LOG_TEXT;
    else if (s && !strcasecmp(s, "json")) *out = RP_LOG_JSON;
    else return -1;
    return 0;
}

void rp_log_set_format(enum rp_log_format format) { __atomic_store_n(&g_format, (int)format, __ATOMIC_RELAXED); }
enum rp_log_format rp_log_get_format(void) { return (enum rp_log_format)__atomic_load_n(&g_format, __ATOMIC_RELAXED); }

void rp_log_set_level(enum rp_log_level level) { __atomic_store_n(&g_level, (int)level, __ATOMIC_RELAXED); }

/* REPLAY_LOG, read once. A bad value is kept to be warned about after the
 * level is settled (warning from inside pthread_once would recurse). */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int env_level = RP_LOG_INFO;
static char env_bad[64];
static int env_warned; /* atomic */

static void read_env(void) {
    const char *s = getenv("REPLAY_LOG");
    enum rp_log_level l;
    if (!s || !*s) return;
    if (rp_log_parse_level(s, &l) == 0) env_level = (int)l;
    else snprintf(env_bad, sizeof env_bad, "%s", s);
}

enum rp_log_level rp_log_get_level(void) {
    int l = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
    if (l >= 0) return (enum rp_log_level)l;
    pthread_once(&env_once, read_env);
    int unset = -1;
    __atomic_compare_exchange_n(&g_level, &unset, env_level, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    if (env_bad[0] && !__atomic_exchange_n(&env_warned, 1, __ATOMIC_RELAXED))
        rp_log_warn("REPLAY_LOG=%s is not a level (error, warn, info, debug); using info", env_bad);
    return (enum rp_log_level)__atomic_load_n(&g_level, __ATOMIC_RELAXED);
}

/* ---- the line buffer ------------------------------------------------------------- */

#define LINE_BYTES 8192
#define LINE_RESERVE 32 /* for what closes a line: `,"truncated":true}` and the newline */

typedef struct line {
    char p[LINE_BYTES];
    size_t len, cap; /* cap leaves LINE_RESERVE for the end */
    int full;        /* something did not fit: nothing more is added */
} line;

static void put(line *b, const char *s, size_t n) {
    if (b->full || n > b->cap - b->len) {
        b->full = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void puts_(line *b, const char *s) { put(b, s, strlen(s)); }

/* The closing bytes, into the reserve. */
static void put_end(line *b, const char *s) {
    size_t n = strlen(s);
    if (n > sizeof b->p - b->len) n = sizeof b->p - b->len;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* The length of a valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* a surrogate */
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return len;
}

/* A JSON string's contents: quotes, backslashes and control characters
 * escaped, invalid UTF-8 as U+FFFD (a log shipper rejects a line that is
 * not UTF-8). */
static void put_json_chars(line *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n && !b->full;) {
        unsigned c = u[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c == '\n') put(b, "\\n", 2);
        else if (c == '\t') put(b, "\\t", 2);
        else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(b, esc, 6);
        } else {
            size_t len = utf8_len(u + i, n - i);
            if (!len) {
                put(b, "\\ufffd", 6);
                i++;
                continue;
            }
            put(b, s + i, len);
            i += len;
            continue;
        }
        i++;
    }
}

/* Text: control characters as escapes, so a record stays one line (and a
 * client's path cannot forge one). Other bytes go to the terminal as they are. */
static void put_text_chars(line *b, const char *s) {
    for (const unsigned char *u = (const unsigned char *)s; *u && !b->full; u++) {
        char esc[8];
        if (*u == '\n') put(b, "\\n", 2);
        else if (*u == '\t') put(b, "\\t", 2);
        else if (*u < 0x20 || *u == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", *u);
            put(b, esc, 4);
        } else put(b, (const char *)u, 1);
    }
}

/* A text value needs quotes when it is empty or holds what separates fields. */
static int needs_quotes(const char *s) {
    if (!*s) return 1;
    for (const unsigned char *u = (const unsigned char *)s; *u; u++)
        if (*u <= ' ' || *u == '"' || *u == '=' || *u == '\\' || *u == 0x7F) return 1;
    return 0;
}

static void put_field(line *b, const rp_log_field *f, int json) {
    char num[64];
    const char *value = NULL;
    if (f->type == RP_LOG_FIELD_INT) snprintf(num, sizeof num, "%lld", f->i), value = num;
    else if (f->type == RP_LOG_FIELD_DOUBLE && isfinite(f->d)) snprintf(num, sizeof num, "%.1f", f->d), value = num;
    if (json) {
        put(b, ",\"", 2);
        puts_(b, f->key);
        put(b, "\":", 2);
        if (value) puts_(b, value);
        else if (f->type != RP_LOG_FIELD_STR || !f->s) put(b, "null", 4);
        else {
            put(b, "\"", 1);
            put_json_chars(b, f->s);
            put(b, "\"", 1);
        }
        return;
    }
    put(b, " ", 1);
    puts_(b, f->key);
    put(b, "=", 1);
    if (value) puts_(b, value);
    else if (f->type != RP_LOG_FIELD_STR || !f->s) put(b, "-", 1);
    else if (!needs_quotes(f->s)) put_text_chars(b, f->s);
    else {
        put(b, "\"", 1);
        put_json_chars(b, f->s); /* the same escapes, in quotes */
        put(b, "\"", 1);
    }
}

/* Writes all of it, as one write unless the kernel takes less. */
static void write_all(const char *p, size_t n) {
    while (n) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void emit(enum rp_log_level level, const char *msg, const rp_log_field *fields, int n) {
    line b;
    b.len = 0;
    b.cap = sizeof b.p - LINE_RESERVE;
    b.full = 0;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int json = rp_log_get_format() == RP_LOG_JSON;
    char stamp[64];
    strftime(stamp, sizeof stamp, json ? "%Y-%m-%dT%H:%M:%S" : "%Y-%m-%d %H:%M:%S", &tm);
    char head[128];
    if (json)
        snprintf(head, sizeof head, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"msg\":\"", stamp, ts.tv_nsec / 1000000L,
                 level_names[level]);
    else snprintf(head, sizeof head, "%s.%03ld %s ", stamp, ts.tv_nsec / 1000000L, level_labels[level]);
    puts_(&b, head);
    if (json) put_json_chars(&b, msg);
    else put_text_chars(&b, msg);
    int truncated = b.full; /* a message too long is cut; its string is closed all the same */
    if (json) put_end(&b, "\"");
    for (int i = 0; i < n && !truncated; i++) {
        size_t mark = b.len;
        put_field(&b, &fields[i], json);
        if (b.full) { /* not whole: left out with those after it */
            b.len = mark;
            truncated = 1;
        }
    }
    if (json) put_end(&b, truncated ? ",\"truncated\":true}\n" : "}\n");
    else put_end(&b, truncated ? " truncated\n" : "\n");
    write_all(b.p, b.len);
}

void rp_log_fields(enum rp_log_level level, const char *msg, const rp_log_field *fields, int n) {
    if ((int)level < RP_LOG_ERROR || (int)level > (int)rp_log_get_level()) return;
    emit(level, msg ? msg : "", fields, n);
}

void rp_log(enum rp_log_level level, const char *fmt, ...) {
    if ((int)level < RP_LOG_ERROR || (int)level > (int)rp_log_get_level()) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(level, msg, NULL, 0);
}

double rp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
