/* A growable byte buffer for the server's response text: the SSE bytes a
 * stream has not sent yet, a choice's text, a request body, /metrics.
 *
 * Appends are all or nothing: when memory runs out an append returns -1
 * and leaves the buffer as it was, so a caller can answer with an error
 * instead of sending text with a hole in it. The bytes are always followed
 * by a NUL (not counted in len) once anything was added. */
#ifndef RP_SERVER_SBUF_H
#define RP_SERVER_SBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct rp_sbuf {
    char *p; /* NULL until the first append */
    size_t len, cap;
} rp_sbuf;

/* 0, or -1 (nothing added) when memory runs out or len would overflow. */
int rp_sbuf_add(rp_sbuf *b, const char *s, size_t n);
int rp_sbuf_add_str(rp_sbuf *b, const char *s);
int rp_sbuf_vprintf(rp_sbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Drops what was added after len (a mark taken earlier), to undo a group of
 * appends of which one failed. */
void rp_sbuf_truncate(rp_sbuf *b, size_t len);
void rp_sbuf_free(rp_sbuf *b);

#endif
