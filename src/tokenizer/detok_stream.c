/* The streaming detokenizer: ids in, UTF-8 out, never half a character.
 *
 * A token's bytes may end inside a multi-byte character (byte-level BPE
 * splits them freely), so the bytes of an incomplete-but-valid prefix are held
 * back until the next token completes it. Ill-formed bytes become U+FFFD by
 * the same maximal-subpart rule as the full decode; that rule only ever looks
 * ahead within one character, so streaming output concatenates to exactly
 * rp_tokenizer_decode's.
 *
 * SentencePiece-style tokenizers decode differently (sentencepiece.c says
 * how): their tokens are whole characters except the <0xNN> byte tokens,
 * whose run is decoded as one string when it ends -- valid UTF-8, or one
 * U+FFFD per byte when not, as decoders/byte_fallback.rs does; so a run is
 * held back whole rather than by character. The whole decode is this
 * streamer run over all ids (tok_sp_decode), so the two agree by
 * construction; the fixtures check the whole decode against HF's. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

void rp_detok_init(rp_detok *d, const rp_tokenizer *t, int skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = skip_special;
    d->strip_left = t->is_sp ? t->sp.dec_strip : 0;
}

void rp_detok_continue(rp_detok *d) {
    d->n_tokens = 1;
    d->strip_left = 0;
}

void rp_detok_free(rp_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
    free(d->run);
    d->run = NULL;
    d->n_run = d->run_cap = 0;
}

/* ---- SentencePiece-style ------------------------------------------------- */

/* Appends s[0..n) to the output at *len, dropping what Strip still drops. */
static int sp_append(rp_detok *d, const char *s, size_t n, size_t *len) {
    const tok_sp *sp = &d->tok->sp;
    if (d->strip_left > 0 && n > 0) {
        char c[4];
        size_t cl = (size_t)tok_utf8_encode(sp->dec_strip_char, c);
        while (d->strip_left > 0 && n > 0) {
            if (n >= cl && memcmp(s, c, cl) == 0) {
                s += cl;
                n -= cl;
                d->strip_left--;
            } else {
                d->strip_left = 0;
            }
        }
    }
    if (*len + n + 1 > d->buf_cap) {
        size_t c = d->buf_cap ? d->buf_cap * 2 : 256;
        while (c < *len + n + 1) c *= 2;
        char *nb = realloc(d->buf, c);
        if (!nb) return -1;
        d->buf = nb;
        d->buf_cap = c;
    }
    if (n) memcpy(d->buf + *len, s, n);
    *len += n;
    d->buf[*len] = '\0';
    return 0;
}

static int sp_flush_run(rp_detok *d, size_t *len) {
    int rc = 0;
    if (d->n_run == 0) return 0;
    if (tok_utf8_valid((const char *)d->run, d->n_run))
        rc = sp_append(d, (const char *)d->run, d->n_run, len);
    else
        for (size_t i = 0; i < d->n_run && !rc; i++) rc = sp_append(d, "\xEF\xBF\xBD", 3, len);
    d->n_run = 0;
    return rc;
}

static int sp_push(rp_detok *d, int32_t id, size_t *len) {
    const rp_tokenizer *t = d->tok;
    const tok_sp *sp = &t->sp;
    int first = d->n_tokens++ == 0;
    if (sp->dec_byte[id] >= 0) {
        if (d->n_run == d->run_cap) {
            size_t c = d->run_cap ? d->run_cap * 2 : 16;
            unsigned char *nr = realloc(d->run, c);
            if (!nr) return -1;
            d->run = nr;
            d->run_cap = c;
        }
        d->run[d->n_run++] = (unsigned char)sp->dec_byte[id];
        return 0;
    }
    if (sp_flush_run(d, len)) return -1;
    const char *b;
    size_t n;
    tok_token_bytes(t, id, &b, &n);
    if (!(first && sp->dec_metaspace_first)) return sp_append(d, b, n, len);
    /* decoders/metaspace.rs: the first token's replacement characters are
     * dropped rather than made spaces; the Replace decoders after it as usual */
    const char *text = t->text_blob + t->text_off[id];
    size_t tl = strlen(text);
    char local[64];
    char *tmp = tl <= sizeof local ? local : malloc(tl);
    if (!tmp) return -1;
    size_t o = 0;
    for (size_t i = 0; i < tl;) {
        if (i + sp->dec_ms_rep_len <= tl && memcmp(text + i, sp->dec_ms_rep, sp->dec_ms_rep_len) == 0) {
            i += sp->dec_ms_rep_len;
            continue;
        }
        tmp[o++] = text[i++];
    }
    for (int r = 1; r < sp->n_dec_rep; r++) {
        size_t w = 0;
        for (size_t i = 0; i < o;) {
            if (i + sp->dec_rep[r].from_len <= o && memcmp(tmp + i, sp->dec_rep[r].from, sp->dec_rep[r].from_len) == 0) {
                memmove(tmp + w, sp->dec_rep[r].to, sp->dec_rep[r].to_len);
                w += sp->dec_rep[r].to_len;
                i += sp->dec_rep[r].from_len;
            } else {
                tmp[w++] = tmp[i++];
            }
        }
        o = w;
    }
    int rc = sp_append(d, tmp, o, len);
    if (tmp != local) free(tmp);
    return rc;
}

int tok_sp_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                  size_t *out_len, rp_err *err) {
    rp_detok d;
    rp_detok_init(&d, t, skip_special);
    char *res = NULL;
    size_t rl = 0, cap = 0;
    int rc = 0;
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *s;
        size_t l;
        if (i < n)
            rc = rp_detok_push(&d, ids[i], &s, &l, err);
        else
            rp_detok_flush(&d, &s, &l);
        if (rc) break;
        if (rl + l + 1 > cap) {
            size_t c = cap ? cap * 2 : 256;
            while (c < rl + l + 1) c *= 2;
            char *nr = realloc(res, c);
            if (!nr) {
                rc = rp_errf(err, "out of memory decoding");
                break;
            }
            res = nr;
            cap = c;
        }
        memcpy(res + rl, s, l);
        rl += l;
        res[rl] = '\0';
    }
    rp_detok_free(&d);
    if (rc) {
        free(res);
        return rc;
    }
    if (!res && !(res = calloc(1, 1))) return rp_errf(err, "out of memory decoding");
    *out = res;
    if (out_len) *out_len = rl;
    return 0;
}

/* ---- byte-level ------------------------------------------------------------ */

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
    if (d->tok->is_sp) {
        if (sp_push(d, id, len)) return rp_errf(err, "out of memory decoding");
        if (*len) *text = d->buf;
        return 0;
    }
    if (emit(d, b, n, 0, len)) return rp_errf(err, "out of memory decoding");
    *text = d->buf;
    return 0;
}

void rp_detok_flush(rp_detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (d->tok->is_sp) {
        /* out of memory here loses the held-back run: flush cannot fail */
        if (sp_flush_run(d, len) == 0 && *len) *text = d->buf;
        d->n_run = 0;
        d->n_tokens = 0;
        d->strip_left = d->tok->sp.dec_strip;
        return;
    }
    if (d->n_pending && emit(d, NULL, 0, 1, len) == 0) *text = d->buf;
    d->n_pending = 0;
}
