/* The streaming detokenizer: ids in, UTF-8 out, never half a character.
 *
 * A token's bytes may end inside a multi-byte character (byte-level BPE
 * splits them freely), so the bytes of an incomplete-but-valid prefix are held
 * back until the next token completes it. Ill-formed bytes become U+FFFD by
 * the same maximal-subpart rule as the full decode; that rule only ever looks
 * ahead within one character, so streaming output concatenates to exactly
 * rp_tokenizer_decode's. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

void rp_detok_init(rp_detok *d, const rp_tokenizer *t, int skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = skip_special;
}

void rp_detok_free(rp_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}

static int emit(rp_detok *d, const char *bytes, size_t n, int final, size_t *out_len) {
    /* pending bytes + the new ones, decoded in one go */
    unsigned char local[64];
    size_t total = (size_t)d->n_pending + n;
    unsigned char *in = total <= sizeof local ? local : malloc(total);
    if (!in) return -1;
    memcpy(in, d->pending, (size_t)d->n_pending);
    if (n) memcpy(in + d->n_pending, bytes, n);
    size_t len = 0, consumed = 0;
    int rc = tok_utf8_lossy_append(in, total, final, &d->buf, &len, &d->buf_cap, &consumed);
    if (rc == 0) {
        /* what is left is an incomplete prefix: at most 3 bytes */
        d->n_pending = (int)(total - consumed);
        memcpy(d->pending, in + consumed, (size_t)d->n_pending);
        *out_len = len;
    }
    if (in != local) free(in);
    return rc;
}

int rp_detok_push(rp_detok *d, int32_t id, const char **text, size_t *len, rp_err *err) {
    const char *b;
    size_t n;
    *text = "";
    *len = 0;
    if (tok_token_bytes(d->tok, id, &b, &n))
        return rp_errf(err, "token id %d out of range (vocab size %d)", id, d->tok->vocab_size);
    if (d->skip_special && d->tok->is_special[id]) return 0;
    if (emit(d, b, n, 0, len)) return rp_errf(err, "out of memory decoding");
    *text = d->buf;
    return 0;
}

void rp_detok_flush(rp_detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (d->n_pending && emit(d, NULL, 0, 1, len) == 0) *text = d->buf;
    d->n_pending = 0;
}
