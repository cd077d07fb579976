/* Leveled logging to stderr. The level comes from REPLAY_LOG (error, warn,
 * info, debug; default info) or rp_log_set_level (the CLI's --quiet/-v). */
#ifndef RP_UTIL_LOG_H
#define RP_UTIL_LOG_H

enum rp_log_level { RP_LOG_ERROR = 0, RP_LOG_WARN, RP_LOG_INFO, RP_LOG_DEBUG };

enum rp_log_format { RP_LOG_TEXT, RP_LOG_JSON };

void rp_log_set_level(enum rp_log_level level);
/* error, warn, info, debug: 0, or -1 for anything else. */
int rp_log_parse_level(const char *s, enum rp_log_level *out);
int rp_log_parse_format(const char *s, enum rp_log_format *out);
void rp_log_set_format(enum rp_log_format format);
enum rp_log_level rp_log_get_level(void);
void rp_log(enum rp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define rp_log_error(...) rp_log(RP_LOG_ERROR, __VA_ARGS__)
#define rp_log_warn(...) rp_log(RP_LOG_WARN, __VA_ARGS__)
#define rp_log_info(...) rp_log(RP_LOG_INFO, __VA_ARGS__)
#define rp_log_debug(...) rp_log(RP_LOG_DEBUG, __VA_ARGS__)

/* Monotonic wall clock in seconds, for stats and benchmarks. */
double rp_now_s(void);

#endif
