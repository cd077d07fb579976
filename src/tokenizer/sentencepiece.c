/* SentencePiece-style BPE, as Hugging Face `tokenizers` runs the
 * tokenizer.json that Llama 2 and Mistral 7B ship (converted from a
 * SentencePiece model): the vocabulary spells a space as "▁" (U+2581) and
 * holds <0x00>..<0xFF> for bytes that have no token of their own.
 *
 * Encode, on each piece of text between added tokens:
 *   normalizer    Prepend "▁" (legacy Llama 2 / Mistral v0.1) and Replace
 *                 " " -> "▁", or NFC; run in order
 *   pre-tokenizer Metaspace (non-legacy, Mistral v0.3): " " -> "▁", a "▁" put
 *                 in front of the text (prepend_scheme "always", or "first":
 *                 only the piece at offset 0 of the original text), and with
 *                 split true a cut before every "▁"; or none at all, and the
 *                 whole piece is one BPE word
 *   model         BPE whose first symbols are characters; a character outside
 *                 the vocab becomes its bytes' <0xNN> tokens (byte_fallback),
 *                 else unk, consecutive unks fused into one (fuse_unk)
 * Decode: per token Replace "▁" -> " " (or the Metaspace decoder, which also
 * drops the first token's "▁"), ByteFallback (a run of <0xNN> tokens is
 * decoded as UTF-8, or becomes one U+FFFD per byte when the run is not valid
 * UTF-8), Fuse, Strip (leading spaces of the whole output). Decoding itself
 * lives in detok_stream.c; this file reads the configuration and encodes.
 *
 * Each rule here follows the Rust source of tokenizers (normalizers/prepend.rs,
 * pre_tokenizers/metaspace.rs, models/bpe/model.rs merge_word, decoders/
 * byte_fallback.rs, strip.rs); docs/tokenizer.md lists where transformers.js,
 * the reference that made the test fixtures, reads some of them differently. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/tjson.h"

/* ---- configuration ---------------------------------------------------------- */

/* A string member with its length (tokenizer.json strings may hold NUL). */
static const char *str_member(const tj_doc *d, const tj_node *obj, const char *key, size_t *len) {
    const tj_node *v = tj_get(d, obj, key);
    if (!v || v->type != TJ_STRING) return NULL;
    *len = v->len;
    return tj_str(d, v);
}

static char *dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Exactly one UTF-8 character: the Metaspace replacement and Strip content are a Rust char. */
static int one_char(const char *s, size_t n) {
    return n > 0 && tok_utf8_seq_len((const unsigned char *)s, n) == (int)n;
}

static int load_normalizer(rp_tokenizer *t, const tj_doc *d, const tj_node *n, int depth, rp_err *err) {
    tok_sp *sp = &t->sp;
    if (!n || n->type == TJ_NULL) return 0;
    const char *type = tj_get_str(d, n, "type");
    if (n->type != TJ_OBJECT || !type) return rp_errf(err, "tokenizer.json: normalizer has no type");
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const tj_node *arr = tj_get(d, n, "normalizers");
        if (!arr || arr->type != TJ_ARRAY) return rp_errf(err, "tokenizer.json: normalizer Sequence without normalizers");
        for (uint32_t i = 0; i < arr->len; i++)
            if (load_normalizer(t, d, tj_item(d, arr, i), depth + 1, err)) return RP_ERR;
        return 0;
    }
    if (sp->n_norm == TOK_MAX_NORM_STEPS) return rp_errf(err, "tokenizer.json: too many normalizers");
    tok_norm_step *st = &sp->norm[sp->n_norm];
    if (strcmp(type, "NFC") == 0) {
        st->kind = TOK_NORM_NFC;
    } else if (strcmp(type, "Prepend") == 0) {
        size_t l = 0;
        const char *p = str_member(d, n, "prepend", &l);
        if (!p) return rp_errf(err, "tokenizer.json: Prepend normalizer without a prepend string");
        st->kind = TOK_NORM_PREPEND;
        if (!(st->to = dup_bytes(p, l))) return rp_errf(err, "out of memory loading tokenizer");
        st->to_len = l;
    } else if (strcmp(type, "Replace") == 0) {
        size_t fl = 0, tl = 0;
        const char *from = str_member(d, tj_get(d, n, "pattern"), "String", &fl);
        const char *to = str_member(d, n, "content", &tl);
        if (!from || !to)
            return rp_errf(err, "tokenizer.json: unsupported Replace normalizer (replay supports a String pattern)");
        if (fl == 0) return rp_errf(err, "tokenizer.json: Replace normalizer with an empty pattern");
        st->kind = TOK_NORM_REPLACE;
        st->from = dup_bytes(from, fl);
        st->to = dup_bytes(to, tl);
        if (!st->from || !st->to) {
            free(st->from);
            free(st->to);
            st->from = st->to = NULL;
            return rp_errf(err, "out of memory loading tokenizer");
        }
        st->from_len = fl;
        st->to_len = tl;
    } else {
        return rp_errf(err, "tokenizer.json: unsupported normalizer '%s' (replay supports NFC, Prepend, Replace)", type);
    }
    sp->n_norm++;
    return 0;
}

/* Metaspace's settings as metaspace.rs deserializes them: prepend_scheme
 * (default "always"); the older add_prefix_space, when false, must come with
 * "never" or it is an error; split defaults to true. */
static int metaspace_settings(const tj_doc *d, const tj_node *n, char *rep, size_t *rep_len, int *prepend,
                              int *split, const char *what, rp_err *err) {
    size_t l = 0;
    const char *r = str_member(d, n, "replacement", &l);
    if (!r || !one_char(r, l) || l >= 8)
        return rp_errf(err, "tokenizer.json: %s Metaspace replacement is not one character", what);
    memcpy(rep, r, l);
    rep[l] = '\0';
    *rep_len = l;
    const char *scheme = tj_get_str(d, n, "prepend_scheme");
    *prepend = TOK_PREPEND_ALWAYS;
    if (scheme) {
        if (strcmp(scheme, "always") == 0) *prepend = TOK_PREPEND_ALWAYS;
        else if (strcmp(scheme, "first") == 0) *prepend = TOK_PREPEND_FIRST;
        else if (strcmp(scheme, "never") == 0) *prepend = TOK_PREPEND_NEVER;
        else return rp_errf(err, "tokenizer.json: %s Metaspace prepend_scheme '%s' is unknown", what, scheme);
    }
    int aps = tj_get_bool(d, n, "add_prefix_space", 1);
    if (aps < 0) return rp_errf(err, "tokenizer.json: %s Metaspace add_prefix_space is not a boolean", what);
    if (!aps && *prepend != TOK_PREPEND_NEVER)
        return rp_errf(err, "tokenizer.json: %s Metaspace add_prefix_space does not match declared prepend_scheme", what);
    *split = tj_get_bool(d, n, "split", 1);
    if (*split < 0) return rp_errf(err, "tokenizer.json: %s Metaspace split is not a boolean", what);
    return 0;
}

static int load_pretok(rp_tokenizer *t, const tj_doc *d, const tj_node *n, int depth, rp_err *err) {
    tok_sp *sp = &t->sp;
    if (!n || n->type == TJ_NULL) return 0;
    const char *type = tj_get_str(d, n, "type");
    if (n->type != TJ_OBJECT || !type) return rp_errf(err, "tokenizer.json: pre_tokenizer has no type");
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const tj_node *arr = tj_get(d, n, "pretokenizers");
        if (!arr || arr->type != TJ_ARRAY) return rp_errf(err, "tokenizer.json: pre_tokenizer Sequence without pretokenizers");
        for (uint32_t i = 0; i < arr->len; i++)
            if (load_pretok(t, d, tj_item(d, arr, i), depth + 1, err)) return RP_ERR;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0 && !sp->metaspace) {
        sp->metaspace = 1;
        return metaspace_settings(d, n, sp->ms_rep, &sp->ms_rep_len, &sp->ms_prepend, &sp->ms_split, "pre_tokenizer", err);
    }
    return rp_errf(err, "tokenizer.json: unsupported pre_tokenizer '%s' with a SentencePiece-style decoder (replay supports Metaspace)",
                   type);
}

/* The decoder: [Replace | Metaspace]* ByteFallback? Fuse? Strip?, in that
 * order (what the converted SentencePiece tokenizers ship). Strip runs on the
 * fused output, so it needs Fuse before it, and only leading characters can
 * be stripped while streaming. */
static int load_decoder_step(rp_tokenizer *t, const tj_doc *d, const tj_node *n, int *phase, rp_err *err) {
    tok_sp *sp = &t->sp;
    const char *type = n && n->type == TJ_OBJECT ? tj_get_str(d, n, "type") : NULL;
    if (!type) return rp_errf(err, "tokenizer.json: decoder has no type");
    if (strcmp(type, "Replace") == 0 && *phase == 0) {
        size_t fl = 0, tl = 0;
        const char *from = str_member(d, tj_get(d, n, "pattern"), "String", &fl);
        const char *to = str_member(d, n, "content", &tl);
        /* a token's decoded bytes are never longer than its text: they share one blob size */
        if (!from || !to || fl == 0 || tl > fl || fl >= 8)
            return rp_errf(err, "tokenizer.json: unsupported Replace decoder (replay supports a short String pattern "
                                "replaced by no more bytes)");
        if (sp->n_dec_rep == TOK_MAX_DEC_REPLACES) return rp_errf(err, "tokenizer.json: too many Replace decoders");
        memcpy(sp->dec_rep[sp->n_dec_rep].from, from, fl);
        memcpy(sp->dec_rep[sp->n_dec_rep].to, to, tl);
        sp->dec_rep[sp->n_dec_rep].from_len = fl;
        sp->dec_rep[sp->n_dec_rep].to_len = tl;
        sp->n_dec_rep++;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0 && *phase == 0 && sp->n_dec_rep == 0) {
        /* decoders/metaspace.rs: every replacement character becomes " ",
         * except in the first token, where (prepend_scheme not "never") they are dropped */
        int prepend, split;
        if (metaspace_settings(d, n, sp->dec_ms_rep, &sp->dec_ms_rep_len, &prepend, &split, "decoder", err))
            return RP_ERR;
        sp->dec_metaspace_first = prepend != TOK_PREPEND_NEVER;
        memcpy(sp->dec_rep[0].from, sp->dec_ms_rep, sp->dec_ms_rep_len);
        sp->dec_rep[0].from_len = sp->dec_ms_rep_len;
        sp->dec_rep[0].to[0] = ' ';
        sp->dec_rep[0].to_len = 1;
        sp->n_dec_rep = 1;
        return 0;
    }
    if (strcmp(type, "ByteFallback") == 0 && *phase == 0) {
        sp->dec_byte_fallback = 1;
        *phase = 1;
        return 0;
    }
    if (strcmp(type, "Fuse") == 0 && *phase <= 1) {
        *phase = 2;
        return 0;
    }
    if (strcmp(type, "Strip") == 0 && *phase == 2) {
        size_t l = 0;
        const char *c = str_member(d, n, "content", &l);
        const tj_node *start = tj_get(d, n, "start"), *stop = tj_get(d, n, "stop");
        if (!c || !one_char(c, l) || !start || start->type != TJ_NUMBER || start->num < 0 || start->num > 1e6 ||
            !stop || stop->type != TJ_NUMBER || stop->num != 0)
            return rp_errf(err, "tokenizer.json: unsupported Strip decoder (replay supports stripping leading "
                                "characters only)");
        tok_utf8_decode((const unsigned char *)c, &sp->dec_strip_char);
        sp->dec_strip = (int)start->num;
        *phase = 3;
        return 0;
    }
    return rp_errf(err, "tokenizer.json: unsupported decoder '%s' in this position (replay supports ByteLevel, or "
                        "Replace/Metaspace, ByteFallback, Fuse, Strip in that order)",
                   type);
}

int tok_sp_load_pipeline(rp_tokenizer *t, const tj_doc *d, const tj_node *root, rp_err *err) {
    if (load_normalizer(t, d, tj_get(d, root, "normalizer"), 0, err)) return RP_ERR;
    if (load_pretok(t, d, tj_get(d, root, "pre_tokenizer"), 0, err)) return RP_ERR;
    const tj_node *dec = tj_get(d, root, "decoder");
    const char *type = tj_get_str(d, dec, "type");
    int phase = 0;
    if (type && strcmp(type, "Sequence") == 0) {
        const tj_node *arr = tj_get(d, dec, "decoders");
        if (!arr || arr->type != TJ_ARRAY) return rp_errf(err, "tokenizer.json: decoder Sequence without decoders");
        for (uint32_t i = 0; i < arr->len; i++)
            if (load_decoder_step(t, d, tj_item(d, arr, i), &phase, err)) return RP_ERR;
        return 0;
    }
    return load_decoder_step(t, d, dec, &phase, err);
}

int tok_sp_load_model(rp_tokenizer *t, const tj_doc *d, const tj_node *model, const uint32_t *vocab_off,
                      rp_err *err) {
    tok_sp *sp = &t->sp;
    int bf = tj_get_bool(d, model, "byte_fallback", 0), fu = tj_get_bool(d, model, "fuse_unk", 0);
    if (bf < 0 || fu < 0) return rp_errf(err, "tokenizer.json: byte_fallback / fuse_unk is not a boolean");
    sp->byte_fallback = bf;
    sp->fuse_unk = fu;
    /* The model's own vocab, without added tokens: BPE looks characters up in
     * it, as HF's BPE model does (an added token's text is no BPE symbol). */
    const tj_node *vocab = tj_get(d, model, "vocab");
    if (tok_map_init(&sp->vocab, vocab->len)) return rp_errf(err, "out of memory loading tokenizer");
    for (uint32_t i = 0; i < vocab->len; i++) {
        const tj_node *v = tj_val_at(d, vocab, i);
        if (tok_map_put(&sp->vocab, t->text_blob, vocab_off[i], tj_key_at(d, vocab, i)->len, (int32_t)v->num))
            return rp_errf(err, "out of memory loading tokenizer");
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        sp->ascii_id[c] = tok_map_get(&sp->vocab, t->text_blob, &ch, 1, -1);
    }
    /* models/bpe/model.rs spells the fallback token format!("<{b:#04X}>"): "<0x0A>" */
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        sp->fallback_id[b] = bf ? tok_map_get(&sp->vocab, t->text_blob, name, 6, -1) : -1;
    }
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Every `from` in s[0..n) replaced by `to` (no longer than `from`), in place. */
static size_t replace_in_place(char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl) {
    size_t o = 0, i = 0;
    while (i < n) {
        if (i + fl <= n && memcmp(s + i, from, fl) == 0) {
            memmove(s + o, to, tl);
            o += tl;
            i += fl;
        } else {
            s[o++] = s[i++];
        }
    }
    return o;
}

size_t tok_sp_token_bytes(rp_tokenizer *t, int32_t id, const char *text, size_t len, char *out) {
    tok_sp *sp = &t->sp;
    memcpy(out, text, len);
    for (int r = 0; r < sp->n_dec_rep; r++)
        len = replace_in_place(out, len, sp->dec_rep[r].from, sp->dec_rep[r].from_len, sp->dec_rep[r].to,
                               sp->dec_rep[r].to_len);
    sp->dec_byte[id] = -1;
    /* decoders/byte_fallback.rs: a 6-byte "<0x..>" whose two middle bytes
     * parse as a base-16 u8 (Rust's from_str_radix also takes "+F") */
    if (sp->dec_byte_fallback && len == 6 && memcmp(out, "<0x", 3) == 0 && out[5] == '>') {
        int hi = hex_digit(out[3]), lo = hex_digit(out[4]);
        int v = hi >= 0 && lo >= 0 ? hi * 16 + lo : out[3] == '+' && lo >= 0 ? lo : -1;
        if (v >= 0) {
            sp->dec_byte[id] = (int16_t)v;
            out[0] = (char)v;
            return 1;
        }
    }
    return len;
}

void tok_sp_free(tok_sp *sp) {
    for (int i = 0; i < sp->n_norm; i++) {
        free(sp->norm[i].from);
        free(sp->norm[i].to);
    }
    sp->n_norm = 0;
    tok_map_free(&sp->vocab);
    free(sp->dec_byte);
    sp->dec_byte = NULL;
}

/* ---- encode ----------------------------------------------------------------- */

/* models/bpe/model.rs merge_word: one symbol per character that is in the
 * vocab; otherwise, with byte_fallback, one per byte when every byte has its
 * <0xNN> token; otherwise unk (consecutive ones fused into one with fuse_unk).
 * Like HF, a pending unk is written only when the next known character (or
 * the end) comes, so byte-fallback symbols in between land before it. A
 * character that is none of these is dropped when there is no unk token (HF
 * drops it too; when unk_token names a token missing from the vocab, HF's
 * encode fails instead). */
size_t tok_sp_init_symbols(const rp_tokenizer *t, const unsigned char *s, size_t n, int32_t *sym) {
    const tok_sp *sp = &t->sp;
    size_t m = 0, i = 0;
    int unk_pending = 0;
    while (i < n) {
        int l = tok_utf8_seq_len(s + i, n - i);
        if (l <= 0) l = 1; /* encode sanitizes UTF-8 first; never here */
        int32_t id = s[i] < 0x80 ? sp->ascii_id[s[i]]
                                 : tok_map_get(&sp->vocab, t->text_blob, (const char *)s + i, (size_t)l, -1);
        if (id >= 0) {
            if (unk_pending) sym[m++] = t->unk_id;
            unk_pending = 0;
            sym[m++] = id;
        } else {
            int all = sp->byte_fallback;
            for (int k = 0; k < l && all; k++) all = sp->fallback_id[s[i + k]] >= 0;
            if (all) {
                for (int k = 0; k < l; k++) sym[m++] = sp->fallback_id[s[i + k]];
            } else if (t->unk_id >= 0) {
                if (unk_pending && !sp->fuse_unk) sym[m++] = t->unk_id;
                unk_pending = 1;
            }
        }
        i += (size_t)l;
    }
    if (unk_pending) sym[m++] = t->unk_id;
    return m;
}


/* s[0..n) with every `from` replaced by `to`, into a fresh buffer. */
static int replace_all(const char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl, tok_buf *out) {
    size_t last = 0;
    for (size_t i = 0; i + fl <= n;) {
        if (memcmp(s + i, from, fl) == 0) {
            if (tok_buf_put(out, s + last, i - last) || tok_buf_put(out, to, tl)) return -1;
            i += fl;
            last = i;
        } else {
            i++;
        }
    }
    return tok_buf_put(out, s + last, n - last);
}

static int contains(const char *s, size_t n, const char *pat, size_t pl) {
    for (size_t i = 0; i + pl <= n; i++)
        if (memcmp(s + i, pat, pl) == 0) return 1;
    return 0;
}

typedef struct piece_ctx {
    const rp_tokenizer *t;
    const char *norm; /* the normalized text the pieces point into */
    int at_start;     /* norm begins at offset 0 of the original text */
    tok_scratch *sc;
    tok_ids *out;
    rp_err *err;
} piece_ctx;

static int bpe_word(piece_ctx *c, const char *s, size_t n) {
    if (n && tok_bpe_word(c->t, (const unsigned char *)s, n, c->sc, 0, c->out))
        return rp_errf(c->err, "out of memory in BPE");
    return 0;
}

/* The Metaspace pre-tokenizer on one piece, then BPE on what it splits. */
static int on_piece(void *ctx, int32_t id, const char *s, size_t n) {
    piece_ctx *c = ctx;
    const tok_sp *sp = &c->t->sp;
    if (id >= 0) return tok_ids_push(c->out, id) ? rp_errf(c->err, "out of memory encoding") : 0;
    if (!sp->metaspace) return bpe_word(c, s, n);
    if (n == 0) return 0;
    tok_buf b = {0};
    /* prepend_scheme "first": only the piece whose original offset is 0, as
     * offsets_original().0 == 0 in metaspace.rs */
    int first = c->at_start && s == c->norm;
    int starts_rep = n >= sp->ms_rep_len && memcmp(s, sp->ms_rep, sp->ms_rep_len) == 0;
    int prepend = !starts_rep && (sp->ms_prepend == TOK_PREPEND_ALWAYS || (sp->ms_prepend == TOK_PREPEND_FIRST && first));
    /* a text starting with " " starts with the replacement once replaced */
    if (s[0] == ' ') prepend = 0;
    if ((prepend && tok_buf_put(&b, sp->ms_rep, sp->ms_rep_len)) || replace_all(s, n, " ", 1, sp->ms_rep, sp->ms_rep_len, &b)) {
        free(b.p);
        return rp_errf(c->err, "out of memory encoding");
    }
    int rc = 0;
    if (!sp->ms_split) {
        rc = bpe_word(c, b.p, b.n);
    } else {
        /* split true: MergedWithNext on the replacement, i.e. a cut before each one */
        size_t start = 0;
        for (size_t i = 1; i < b.n && !rc; i++) {
            if (i + sp->ms_rep_len <= b.n && memcmp(b.p + i, sp->ms_rep, sp->ms_rep_len) == 0) {
                rc = bpe_word(c, b.p + start, i - start);
                start = i;
            }
        }
        if (!rc) rc = bpe_word(c, b.p + start, b.n - start);
    }
    free(b.p);
    return rc;
}

int tok_sp_normalize(const rp_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n, rp_err *err) {
    const tok_sp *sp = &t->sp;
    /* the steps in order; `cur` is s or the last buffer made */
    char *owned = NULL;
    const char *cur = s;
    size_t cn = n;
    for (int i = 0; i < sp->n_norm; i++) {
        const tok_norm_step *st = &sp->norm[i];
        tok_buf b = {0};
        int rc = 0;
        if (st->kind == TOK_NORM_NFC) {
            char *nf = NULL;
            size_t nfn = cn;
            if (tok_nfc(cur, cn, &nf, &nfn, err)) {
                free(owned);
                return RP_ERR;
            }
            if (!nf) continue;
            b.p = nf;
            b.n = nfn;
        } else if (st->kind == TOK_NORM_PREPEND) {
            /* prepend.rs: nothing is prepended to an empty string */
            if (cn == 0) continue;
            rc = tok_buf_put(&b, st->to, st->to_len) || tok_buf_put(&b, cur, cn);
        } else {
            if (!contains(cur, cn, st->from, st->from_len)) continue;
            rc = replace_all(cur, cn, st->from, st->from_len, st->to, st->to_len, &b);
        }
        free(owned);
        if (rc) {
            free(b.p);
            return rp_errf(err, "out of memory normalizing text");
        }
        /* an empty result still needs a buffer: NULL means "unchanged" */
        if (!b.p && tok_buf_put(&b, "", 0)) return rp_errf(err, "out of memory normalizing text");
        owned = b.p;
        cur = b.p;
        cn = b.n;
    }
    *out = owned;
    *out_n = cn;
    return 0;
}

int tok_sp_encode_piece(const rp_tokenizer *t, const char *s, size_t n, int at_start, int skip_special,
                        tok_scratch *sc, tok_ids *out, rp_err *err) {
    char *owned = NULL;
    size_t cn = n;
    if (tok_sp_normalize(t, s, n, &owned, &cn, err)) return RP_ERR;
    const char *cur = owned ? owned : s;
    piece_ctx c = {.t = t, .norm = cur, .at_start = at_start, .sc = sc, .out = out, .err = err};
    /* added tokens marked "normalized" are found in the normalized text */
    int rc = t->any_normalized_added ? tok_split_added(t, cur, cn, 1, skip_special, on_piece, &c)
                                     : on_piece(&c, -1, cur, cn);
    free(owned);
    return rc;
}
