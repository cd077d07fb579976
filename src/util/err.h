/* Error reporting for every fallible function in replay.
 *
 * Convention (STYLE.md): a fallible function returns 0 on success and a
 * negative value on failure, and writes a one-line, user-presentable message
 * into the caller's rp_err. The caller decides whether to print, retry or
 * wrap it. Nothing below main() exits; broken invariants use RP_ASSERT.
 * Host allocations are checked where they happen and fail as an error
 * ("out of memory") like any other: nothing aborts or truncates on OOM. */
#ifndef RP_UTIL_ERR_H
#define RP_UTIL_ERR_H

#include <stddef.h>

#define RP_OK 0
#define RP_ERR (-1)

typedef struct rp_err {
    char msg[512];
    char param[48]; /* the request parameter at fault, "" when none (rp_errp) */
} rp_err;

/* Formats the message into err (which may be NULL) and returns RP_ERR, so a
 * failure site reads `return rp_errf(err, "...", ...);`. */
int rp_errf(rp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* rp_errf that also names the request parameter at fault ("top_p"), so
 * callers can report it without reading the message. */
int rp_errp(rp_err *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with context: "loading x: <old message>". */
int rp_err_wrap(rp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For invariants that cannot fail unless replay itself is wrong. */
void rp_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define RP_ASSERT(e) ((e) ? (void)0 : rp_assert_fail(#e, __FILE__, __LINE__))

#endif
