/* rp_sbuf: appends that either happen whole or report that memory ran out
 * (sbuf.h). */
#include "server/sbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and the NUL. */
static int reserve(rp_sbuf *b, size_t n) {
    if (n > SIZE_MAX / 2 - 1 - b->len) return -1;
    size_t need = b->len + n + 1;
    if (need <= b->cap) return 0;
    size_t cap = need * 2;
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

int rp_sbuf_add(rp_sbuf *b, const char *s, size_t n) {
    if (reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int rp_sbuf_add_str(rp_sbuf *b, const char *s) { return rp_sbuf_add(b, s, strlen(s)); }

int rp_sbuf_vprintf(rp_sbuf *b, const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    int rc = n < 0 || reserve(b, (size_t)n) ? -1 : 0;
    if (!rc) {
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, again);
        b->len += (size_t)n;
    }
    va_end(again);
    return rc;
}

void rp_sbuf_truncate(rp_sbuf *b, size_t len) {
    if (len >= b->len) return;
    b->len = len;
    b->p[len] = 0;
}

void rp_sbuf_free(rp_sbuf *b) {
    free(b->p);
    *b = (rp_sbuf){0};
}
