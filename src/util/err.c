/* rp_err formatting and the few allocation helpers that treat OOM as fatal. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rp_errf(rp_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return RP_ERR;
}

int rp_err_wrap(rp_err *err, const char *fmt, ...) {
    if (!err) return RP_ERR;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
    return RP_ERR;
}

void rp_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "replay: internal error: assertion `%s' failed at %s:%d\n", expr, file, line);
    abort();
}

void *rp_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "replay: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

void *rp_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "replay: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

char *rp_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = rp_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
