/* Leveled logging to stderr, one line per record, written with one write(2)
 * so that threads logging at once never interleave inside a line.
 *
 *   text: 2026-11-27 13:50:24.123 INFO  message key=value key="a value"
 *   json: {"ts":"2026-11-27T13:50:24.123Z","level":"info","msg":"message","key":"value"}
 *
 * Timestamps are UTC with millisecond precision in both formats (one clock
 * for every machine of a deployment; JSON says so with its Z). The level
 * comes from rp_log_set_level (the CLI's --log-level, -q) or else REPLAY_LOG
 * (error, warn, info, debug; default info; an unknown value is warned about
 * once and info used); the format from rp_log_set_format (--log-format).
 * Structured fields (rp_log_fields) are key=value pairs after the message
 * in text and typed members in JSON. Control characters never reach the
 * terminal raw: a record is always one line. */
#ifndef RP_UTIL_LOG_H
#define RP_UTIL_LOG_H

enum rp_log_level { RP_LOG_ERROR = 0, RP_LOG_WARN, RP_LOG_INFO, RP_LOG_DEBUG };
enum rp_log_format { RP_LOG_TEXT = 0, RP_LOG_JSON };

void rp_log_set_level(enum rp_log_level level);
enum rp_log_level rp_log_get_level(void);
/* error, warn (or warning), info, debug, in any case: 0, else -1. */
int rp_log_parse_level(const char *s, enum rp_log_level *out);
/* text or json: 0, else -1. */
int rp_log_parse_format(const char *s, enum rp_log_format *out);
void rp_log_set_format(enum rp_log_format format);
enum rp_log_format rp_log_get_format(void);

void rp_log(enum rp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define rp_log_error(...) rp_log(RP_LOG_ERROR, __VA_ARGS__)
#define rp_log_warn(...) rp_log(RP_LOG_WARN, __VA_ARGS__)
#define rp_log_info(...) rp_log(RP_LOG_INFO, __VA_ARGS__)
#define rp_log_debug(...) rp_log(RP_LOG_DEBUG, __VA_ARGS__)

/* A structured field. Keys are plain identifiers ([a-z0-9_]), written as
 * they are. A NULL string or a non-finite double is JSON null and "-" in
 * text; doubles are written with one decimal. */
enum rp_log_field_type { RP_LOG_FIELD_STR, RP_LOG_FIELD_INT, RP_LOG_FIELD_DOUBLE };
typedef struct rp_log_field {
    const char *key;
    enum rp_log_field_type type;
    const char *s;
    long long i;
    double d;
} rp_log_field;

static inline rp_log_field rp_log_str(const char *key, const char *v) {
    return (rp_log_field){.key = key, .type = RP_LOG_FIELD_STR, .s = v};
}
static inline rp_log_field rp_log_int(const char *key, long long v) {
    return (rp_log_field){.key = key, .type = RP_LOG_FIELD_INT, .i = v};
}
static inline rp_log_field rp_log_double(const char *key, double v) {
    return (rp_log_field){.key = key, .type = RP_LOG_FIELD_DOUBLE, .d = v};
}

/* One record: msg, then the n fields in order. A record too long for a
 * line (8 KiB) loses its last fields whole and says "truncated". */
void rp_log_fields(enum rp_log_level level, const char *msg, const rp_log_field *fields, int n);

/* Monotonic wall clock in seconds, for stats and benchmarks. */
double rp_now_s(void);

#endif
