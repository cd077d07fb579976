/* Logging and the monotonic clock. */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("REPLAY_LOG");
    if (!s) return RP_LOG_INFO;
    if (!strcmp(s, "error")) return RP_LOG_ERROR;
    if (!strcmp(s, "warn")) return RP_LOG_WARN;
    if (!strcmp(s, "debug")) return RP_LOG_DEBUG;
    return RP_LOG_INFO;
}

void rp_log_set_level(enum rp_log_level level) { g_level = (int)level; }

int rp_log_parse_level(const char *s, enum rp_log_level *out) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (enum rp_log_level)i;
            return 0;
        }
    return -1;
}

static enum rp_log_format g_format = RP_LOG_TEXT;

int rp_log_parse_format(const char *s, enum rp_log_format *out) {
    if (!strcmp(s, "text")) *out = RP_LOG_TEXT;
    else if (!strcmp(s, "json")) *out = RP_LOG_JSON;
    else return -1;
    return 0;
}

void rp_log_set_format(enum rp_log_format format) { g_format = format; }

enum rp_log_level rp_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (enum rp_log_level)g_level;
}

void rp_log(enum rp_log_level level, const char *fmt, ...) {
    if ((int)level > (int)rp_log_get_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[replay %s] %s\n", names[level], line);
}

double rp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
