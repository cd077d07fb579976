/* The streaming detokenizer driven one id at a time, for the tokenizer
 * tests: every chunk must be whole UTF-8 characters; the concatenation,
 * NUL-terminated (malloc'd, *len its bytes). */
#ifndef RP_TEST_STREAM_DECODE_H
#define RP_TEST_STREAM_DECODE_H

#include "test_util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static inline char *stream_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *len) {
    rp_detok d;
    rp_detok_init(&d, t, skip);
    size_t cap = 64, o = 0;
    char *out = malloc(cap);
    rp_err err;
    for (size_t i = 0; i <= n; i++) {
        const char *chunk;
        size_t cl;
        if (i < n) assert_int_equal(rp_detok_push(&d, ids[i], &chunk, &cl, &err), 0);
        else rp_detok_flush(&d, &chunk, &cl);
        assert_true(tok_utf8_valid(chunk, cl));
        if (o + cl + 1 > cap) out = realloc(out, cap = (o + cl + 1) * 2);
        memcpy(out + o, chunk, cl);
        o += cl;
    }
    out[o] = 0;
    rp_detok_free(&d);
    *len = o;
    return out;
}

#endif
