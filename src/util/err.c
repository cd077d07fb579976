/* rp_err formatting. */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rp_errf(rp_err *err, const char *fmt, ...) {
    if (err) {
        err->param[0] = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return RP_ERR;
}

int rp_errp(rp_err *err, const char *param, const char *fmt, ...) {
    if (err) {
        snprintf(err->param, sizeof err->param, "%s", param);
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
