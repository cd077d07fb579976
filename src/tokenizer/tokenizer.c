/* Loading tokenizer.json / tokenizer_config.json into an rp_tokenizer, the
 * encode pipeline that strings the stages together, full decode, and the
 * lookups. Everything unsupported is refused at load time with the JSON path
 * of the offending piece, so encode never meets a configuration it cannot
 * reproduce exactly. */
#include "tokenizer/tok_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tjson.h"

/* ---- the GPT-2 byte-level alphabet ----------------------------------------
 * Printable bytes (33..126, 161..172, 174..255) stand for themselves; the
 * other 68 are numbered from U+0100 in byte order. */

uint32_t tok_byte_to_cp(unsigned char b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33 + (b - 127u);
    return 256u + 67; /* 173 */
}

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

/* The ByteLevel decoder's view of one token: its characters mapped back to
 * bytes, or its raw UTF-8 when some character is outside the alphabet
 * (decoders/byte_level.rs does the same). Writes at most n bytes. */
static size_t bytelevel_decode(const char *text, size_t n, char *out) {
    size_t o = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int l = tok_utf8_decode((const unsigned char *)text + i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) {
            memcpy(out, text, n);
            return n;
        }
        out[o++] = (char)b;
        i += (size_t)l;
    }
    return o;
}

/* ---- file helpers --------------------------------------------------------- */

static char *read_file(const char *path, size_t *len, rp_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        rp_errf(err, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            size_t c = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, c + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                rp_errf(err, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
            cap = c;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        rp_errf(err, "cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- load ------------------------------------------------------------------ */

typedef struct loader {
    rp_tokenizer *t;
    tj_doc doc;
    rp_err *err;
    /* blobs under construction */
    char *text;
    size_t n_text, cap_text;
    uint32_t *added_off; /* blob offset of each added token's content */
} loader;

static int blob_add(loader *L, const char *s, size_t n, uint32_t *off) {
    if (L->n_text + n + 1 > L->cap_text) {
        size_t c = L->cap_text ? L->cap_text * 2 : 1 << 20;
        while (c < L->n_text + n + 1) c *= 2;
        char *nb = realloc(L->text, c);
        if (!nb) return rp_errf(L->err, "out of memory loading tokenizer");
        L->text = nb;
        L->cap_text = c;
    }
    if (L->n_text + n + 1 > UINT32_MAX) return rp_errf(L->err, "tokenizer vocabulary too large");
    memcpy(L->text + L->n_text, s, n);
    L->text[L->n_text + n] = '\0';
    *off = (uint32_t)L->n_text;
    L->n_text += n + 1;
    return 0;
}

static int get_id(loader *L, const tj_node *v, const char *what, int32_t *out) {
    if (v->type != TJ_NUMBER || v->num < 0 || v->num > 0x7ffffffe || v->num != (double)(int64_t)v->num)
        return rp_errf(L->err, "tokenizer.json: %s: id is not a non-negative integer", what);
    *out = (int32_t)v->num;
    return 0;
}

static int check_normalizer(loader *L, const tj_node *n, int depth) {
    const tj_doc *d = &L->doc;
    if (!n || n->type == TJ_NULL) return 0;
    const char *type = tj_get_str(d, n, "type");
    if (n->type != TJ_OBJECT || !type) return rp_errf(L->err, "tokenizer.json: normalizer has no type");
    if (strcmp(type, "NFC") == 0) {
        L->t->nfc = 1;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const tj_node *arr = tj_get(d, n, "normalizers");
        if (!arr || arr->type != TJ_ARRAY) return rp_errf(L->err, "tokenizer.json: normalizer Sequence without normalizers");
        for (uint32_t i = 0; i < arr->len; i++)
            if (check_normalizer(L, tj_item(d, arr, i), depth + 1)) return RP_ERR;
        return 0;
    }
    return rp_errf(L->err, "tokenizer.json: unsupported normalizer '%s' (replay supports NFC)", type);
}

/* GPT-2's pattern, which ByteLevel applies when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_split(loader *L, const char *pattern, int literal) {
    rp_tokenizer *t = L->t;
    if (t->n_splits == TOK_MAX_SPLITS) return rp_errf(L->err, "tokenizer.json: too many pre-tokenizer splits");
    if (tok_split_compile(&t->splits[t->n_splits], pattern, literal, L->err)) return RP_ERR;
    t->n_splits++;
    return 0;
}

static int check_pretok(loader *L, const tj_node *n, int depth, int *byte_level) {
    const tj_doc *d = &L->doc;
    if (!n || n->type == TJ_NULL) return 0;
    const char *type = tj_get_str(d, n, "type");
    if (n->type != TJ_OBJECT || !type) return rp_errf(L->err, "tokenizer.json: pre_tokenizer has no type");
    if (*byte_level)
        return rp_errf(L->err, "tokenizer.json: unsupported pre_tokenizer: '%s' after ByteLevel", type);
    if (strcmp(type, "Sequence") == 0 && depth == 0) {
        const tj_node *arr = tj_get(d, n, "pretokenizers");
        if (!arr || arr->type != TJ_ARRAY)
            return rp_errf(L->err, "tokenizer.json: pre_tokenizer Sequence without pretokenizers");
        for (uint32_t i = 0; i < arr->len; i++)
            if (check_pretok(L, tj_item(d, arr, i), depth + 1, byte_level)) return RP_ERR;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        const char *behavior = tj_get_str(d, n, "behavior");
        /* "invert" only swaps which pieces are matches; Isolated keeps both */
        if (!behavior || strcmp(behavior, "Isolated") != 0)
            return rp_errf(L->err, "tokenizer.json: unsupported Split behavior '%s' (replay supports Isolated)",
                           behavior ? behavior : "(none)");
        const tj_node *pat = tj_get(d, n, "pattern");
        const char *re = tj_get_str(d, pat, "Regex"), *lit = tj_get_str(d, pat, "String");
        if (!re && !lit) return rp_errf(L->err, "tokenizer.json: Split pattern is neither Regex nor String");
        return add_split(L, re ? re : lit, re == NULL);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (tj_get_bool(d, n, "add_prefix_space", 1) != 0)
            return rp_errf(L->err, "tokenizer.json: unsupported ByteLevel pre_tokenizer with add_prefix_space");
        int use_regex = tj_get_bool(d, n, "use_regex", 1);
        if (use_regex < 0) return rp_errf(L->err, "tokenizer.json: ByteLevel use_regex is not a boolean");
        if (use_regex && add_split(L, GPT2_PATTERN, 0)) return RP_ERR;
        *byte_level = 1;
        return 0;
    }
    return rp_errf(L->err, "tokenizer.json: unsupported pre_tokenizer '%s' (replay supports Split, ByteLevel)", type);
}

/* One merge's two halves: "a b" (exactly one space, as HF splits it) or
 * ["a", "b"]. 0 when it is neither. */
static int merge_parts(const tj_doc *d, const tj_node *m, const char **a, size_t *la, const char **b,
                       size_t *lb) {
    if (m->type == TJ_STRING) {
        const char *s = tj_str(d, m);
        const char *sp = memchr(s, ' ', m->len);
        if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - s))) return 0;
        *a = s;
        *la = (size_t)(sp - s);
        *b = sp + 1;
        *lb = m->len - *la - 1;
        return 1;
    }
    if (m->type == TJ_ARRAY && m->len == 2 && tj_item(d, m, 0)->type == TJ_STRING &&
        tj_item(d, m, 1)->type == TJ_STRING) {
        *a = tj_str(d, tj_item(d, m, 0));
        *la = tj_item(d, m, 0)->len;
        *b = tj_str(d, tj_item(d, m, 1));
        *lb = tj_item(d, m, 1)->len;
        return 1;
    }
    return 0;
}

static int load_model(loader *L, const tj_node *model) {
    rp_tokenizer *t = L->t;
    const tj_doc *d = &L->doc;
    if (!model || model->type != TJ_OBJECT) return rp_errf(L->err, "tokenizer.json: no \"model\" object");
    const char *type = tj_get_str(d, model, "type");
    if (!type || strcmp(type, "BPE") != 0)
        return rp_errf(L->err, "tokenizer.json: unsupported model type '%s' (replay supports BPE)", type ? type : "(none)");
    const tj_node *dropout = tj_get(d, model, "dropout");
    if (dropout && !(dropout->type == TJ_NULL || (dropout->type == TJ_NUMBER && dropout->num == 0)))
        return rp_errf(L->err, "tokenizer.json: BPE dropout is not supported (it is random)");
    if (!t->is_sp && tj_get_bool(d, model, "byte_fallback", 0) != 0)
        return rp_errf(L->err, "tokenizer.json: BPE byte_fallback is not supported with a ByteLevel decoder");
    const char *csp = tj_get_str(d, model, "continuing_subword_prefix");
    const char *ews = tj_get_str(d, model, "end_of_word_suffix");
    if ((csp && *csp) || (ews && *ews))
        return rp_errf(L->err, "tokenizer.json: BPE continuing_subword_prefix / end_of_word_suffix are not supported");
    int im = tj_get_bool(d, model, "ignore_merges", 0);
    if (im < 0) return rp_errf(L->err, "tokenizer.json: ignore_merges is not a boolean");
    t->ignore_merges = im;

    const tj_node *vocab = tj_get(d, model, "vocab");
    if (!vocab || vocab->type != TJ_OBJECT) return rp_errf(L->err, "tokenizer.json: model.vocab is not an object");
    const tj_node *added = tj_get(d, tj_root(d), "added_tokens");
    if (added && added->type != TJ_ARRAY && added->type != TJ_NULL)
        return rp_errf(L->err, "tokenizer.json: added_tokens is not an array");
    uint32_t n_added = added && added->type == TJ_ARRAY ? added->len : 0;

    /* the id range: every vocab and added id */
    int32_t max_id = -1, id = 0;
    for (uint32_t i = 0; i < vocab->len; i++) {
        if (get_id(L, tj_val_at(d, vocab, i), "model.vocab", &id)) return RP_ERR;
        if (id > max_id) max_id = id;
    }
    for (uint32_t i = 0; i < n_added; i++) {
        const tj_node *a = tj_item(d, added, i);
        const tj_node *idn = tj_get(d, a, "id");
        if (!idn || !tj_get_str(d, a, "content"))
            return rp_errf(L->err, "tokenizer.json: added_tokens[%u] lacks id or content", i);
        if (get_id(L, idn, "added_tokens", &id)) return RP_ERR;
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return rp_errf(L->err, "tokenizer.json: empty vocabulary");
    if (max_id > 16 * 1024 * 1024) return rp_errf(L->err, "tokenizer.json: token id %d is implausibly large", max_id);
    size_t nv = (size_t)max_id + 1;
    t->vocab_size = (int32_t)nv;
    t->text_off = malloc(nv * sizeof *t->text_off);
    t->bytes_off = malloc(nv * sizeof *t->bytes_off);
    t->bytes_len = calloc(nv, sizeof *t->bytes_len);
    t->is_special = calloc(nv, 1);
    t->is_added = calloc(nv, 1);
    if (t->is_sp) {
        if (!(t->sp.dec_byte = malloc(nv * sizeof *t->sp.dec_byte)))
            return rp_errf(L->err, "out of memory loading tokenizer");
        memset(t->sp.dec_byte, 0xFF, nv * sizeof *t->sp.dec_byte); /* -1: no byte token */
    }
    if (!t->text_off || !t->bytes_off || !t->bytes_len || !t->is_special || !t->is_added)
        return rp_errf(L->err, "out of memory loading tokenizer");
    memset(t->text_off, 0xFF, nv * sizeof *t->text_off);
    /* bytes_to_id serves ignore_merges alone */
    if (tok_map_init(&t->text_to_id, vocab->len + n_added) ||
        tok_map_init(&t->bytes_to_id, t->ignore_merges ? vocab->len : 1))
        return rp_errf(L->err, "out of memory loading tokenizer");

    /* Copy every token's text into one blob first (it moves while growing),
     * then point the maps into it. An added token overrides a vocab entry
     * with the same id, as HF's added vocabulary does for id -> token. */
    uint32_t *vocab_off = malloc((vocab->len ? vocab->len : 1) * sizeof *vocab_off);
    uint32_t *text_len = calloc(nv, sizeof *text_len);
    uint32_t *added_off = L->added_off = malloc((n_added ? n_added : 1) * sizeof *added_off);
    if (!vocab_off || !text_len || !added_off) {
        free(vocab_off);
        free(text_len);
        return rp_errf(L->err, "out of memory loading tokenizer");
    }
    int rc = 0;
    for (uint32_t i = 0; i < vocab->len && !rc; i++) {
        const tj_node *k = tj_key_at(d, vocab, i);
        get_id(L, tj_val_at(d, vocab, i), "model.vocab", &id);
        rc = blob_add(L, tj_str(d, k), k->len, &vocab_off[i]);
        t->text_off[id] = vocab_off[i];
        text_len[id] = k->len;
    }
    for (uint32_t i = 0; i < n_added && !rc; i++) {
        const tj_node *a = tj_item(d, added, i);
        const tj_node *c = tj_get(d, a, "content");
        get_id(L, tj_get(d, a, "id"), "added_tokens", &id);
        rc = blob_add(L, tj_str(d, c), c->len, &added_off[i]);
        t->text_off[id] = added_off[i];
        text_len[id] = c->len;
    }
    t->text_blob = L->text;
    L->text = NULL;
    /* decoded bytes never outnumber the text bytes */
    t->bytes_blob = rc ? NULL : malloc(L->n_text ? L->n_text : 1);
    if (!rc && !t->bytes_blob) rc = rp_errf(L->err, "out of memory loading tokenizer");
    size_t nb = 0;
    for (size_t i = 0; i < nv && !rc; i++) {
        if (t->text_off[i] == UINT32_MAX) continue;
        size_t bl = t->is_sp ? tok_sp_token_bytes(t, (int32_t)i, t->text_blob + t->text_off[i], text_len[i],
                                                  t->bytes_blob + nb)
                             : bytelevel_decode(t->text_blob + t->text_off[i], text_len[i], t->bytes_blob + nb);
        t->bytes_off[i] = (uint32_t)nb;
        t->bytes_len[i] = (uint32_t)bl;
        nb += bl;
    }
    for (uint32_t i = 0; i < vocab->len && !rc; i++) {
        get_id(L, tj_val_at(d, vocab, i), "model.vocab", &id);
        const tj_node *k = tj_key_at(d, vocab, i);
        if (tok_map_put(&t->text_to_id, t->text_blob, vocab_off[i], k->len, id))
            rc = rp_errf(L->err, "out of memory loading tokenizer");
        else if (t->ignore_merges && t->text_off[id] == vocab_off[i] &&
                 tok_map_put(&t->bytes_to_id, t->bytes_blob, t->bytes_off[id], t->bytes_len[id], id))
            rc = rp_errf(L->err, "out of memory loading tokenizer");
    }
    if (!rc && t->is_sp) rc = tok_sp_load_model(t, d, model, vocab_off, L->err);
    free(vocab_off);
    free(text_len);
    if (rc) return RP_ERR;

    /* single-byte tokens: the vocab entry spelled by the byte's character
     * (SentencePiece-style: the <0xNN> token) */
    for (int b = 0; b < 256 && t->is_sp; b++) t->byte_id[b] = t->sp.fallback_id[b];
    for (int b = 0; b < 256 && !t->is_sp; b++) {
        char u[4];
        int l = tok_utf8_encode(tok_byte_to_cp((unsigned char)b), u);
        t->byte_id[b] = (int32_t)tok_map_get(&t->text_to_id, t->text_blob, u, (size_t)l, -1);
    }
    t->unk_id = -1;
    const char *unk = tj_get_str(d, model, "unk_token");
    if (unk)
        t->unk_id = (int32_t)tok_map_get(t->is_sp ? &t->sp.vocab : &t->text_to_id, t->text_blob, unk, strlen(unk), -1);

    /* merges: "a b" strings or ["a", "b"] pairs; rank = position */
    const tj_node *merges = tj_get(d, model, "merges");
    if (merges && merges->type != TJ_ARRAY) return rp_errf(L->err, "tokenizer.json: model.merges is not an array");
    uint32_t n_merges = merges ? merges->len : 0;
    if (tok_pairmap_init(&t->merges, n_merges)) return rp_errf(L->err, "out of memory loading tokenizer");
    /* Resolving 3 strings per merge to ids is most of the load time (each
     * probe a cache miss), and the lookups are independent: do them on all
     * cores, then insert in rank order. */
    int32_t *trip = malloc((n_merges ? n_merges : 1) * 3 * sizeof *trip);
    if (!trip) return rp_errf(L->err, "out of memory loading tokenizer");
    uint32_t first_bad = UINT32_MAX;
#pragma omp parallel if (n_merges > 20000)
    {
        char local[256];
        char *cat = local;
        size_t cat_cap = sizeof local;
#pragma omp for schedule(static) reduction(min : first_bad)
        for (uint32_t r = 0; r < n_merges; r++) {
            int32_t *o = trip + 3 * (size_t)r;
            o[0] = o[1] = o[2] = -1;
            const char *a, *b;
            size_t la, lb;
            if (!merge_parts(d, tj_item(d, merges, r), &a, &la, &b, &lb)) {
                first_bad = r < first_bad ? r : first_bad;
                continue;
            }
            if (la + lb > cat_cap) {
                char *nc = cat == local ? malloc((la + lb) * 2) : realloc(cat, (la + lb) * 2);
                if (!nc) {
                    first_bad = r < first_bad ? r : first_bad;
                    continue;
                }
                cat = nc;
                cat_cap = (la + lb) * 2;
            }
            memcpy(cat, a, la);
            memcpy(cat + la, b, lb);
            o[0] = tok_map_get(&t->text_to_id, t->text_blob, a, la, -1);
            o[1] = tok_map_get(&t->text_to_id, t->text_blob, b, lb, -1);
            o[2] = tok_map_get(&t->text_to_id, t->text_blob, cat, la + lb, -1);
            if (o[0] < 0 || o[1] < 0 || o[2] < 0) first_bad = r < first_bad ? r : first_bad;
        }
        if (cat != local) free(cat);
    }
    if (first_bad != UINT32_MAX) {
        free(trip);
        const char *a, *b;
        size_t la, lb;
        if (!merge_parts(d, tj_item(d, merges, first_bad), &a, &la, &b, &lb))
            return rp_errf(L->err, "tokenizer.json: merge %u is neither \"a b\" nor [\"a\", \"b\"]", first_bad);
        return rp_errf(L->err, "tokenizer.json: merge %u (\"%.*s\" + \"%.*s\") uses a token missing from the vocab",
                       first_bad, (int)(la < 40 ? la : 40), a, (int)(lb < 40 ? lb : 40), b);
    }
    for (uint32_t r = 0; r < n_merges; r++) {
        const int32_t *o = trip + 3 * (size_t)r;
        if (tok_pairmap_put(&t->merges, o[0], o[1], (int32_t)r, o[2])) {
            free(trip);
            return rp_errf(L->err, "out of memory loading tokenizer");
        }
    }
    free(trip);

    /* added tokens: flags, and the match table */
    t->added = calloc(n_added ? n_added : 1, sizeof *t->added);
    if (!t->added) return rp_errf(L->err, "out of memory loading tokenizer");
    for (uint32_t i = 0; i < n_added; i++) {
        const tj_node *a = tj_item(d, added, i);
        tok_added *x = &t->added[t->n_added];
        get_id(L, tj_get(d, a, "id"), "added_tokens", &id);
        const tj_node *c = tj_get(d, a, "content");
        x->content = t->text_blob + added_off[i];
        x->len = c->len;
        x->match = x->content;
        x->match_len = x->len;
        x->id = id;
        int sw = tj_get_bool(d, a, "single_word", 0), ls = tj_get_bool(d, a, "lstrip", 0);
        int rs = tj_get_bool(d, a, "rstrip", 0), no = tj_get_bool(d, a, "normalized", 0);
        int sp = tj_get_bool(d, a, "special", 0);
        if (sw < 0 || ls < 0 || rs < 0 || no < 0 || sp < 0) {
            return rp_errf(L->err, "tokenizer.json: added_tokens[%u] has a non-boolean flag", i);
        }
        x->single_word = (unsigned char)sw;
        x->lstrip = (unsigned char)ls;
        x->rstrip = (unsigned char)rs;
        x->normalized = (unsigned char)no;
        x->special = (unsigned char)sp;
        t->n_added++;
        t->is_added[id] = 1;
        t->is_special[id] = (unsigned char)sp;
        if (no) t->any_normalized_added = 1;
        if (no && t->is_sp) {
            char *nc = NULL;
            size_t nn = x->len;
            if (tok_sp_normalize(t, x->content, x->len, &nc, &nn, L->err)) return RP_ERR;
            if (nc) {
                if (nn > UINT32_MAX) {
                    free(nc);
                    return rp_errf(L->err, "tokenizer.json: added token too long");
                }
                x->match = x->match_owned = nc;
                x->match_len = (uint32_t)nn;
            }
        }
        if (x->match_len) t->added_first_byte[(unsigned char)x->match[0]] = 1;
        if (tok_map_put(&t->text_to_id, t->text_blob, added_off[i], x->len, id))
            return rp_errf(L->err, "out of memory loading tokenizer");
    }
    /* longest first, so the first hit at a position is the longest match */
    for (int i = 1; i < t->n_added; i++) {
        tok_added x = t->added[i];
        int j = i - 1;
        while (j >= 0 && t->added[j].match_len < x.match_len) {
            t->added[j + 1] = t->added[j];
            j--;
        }
        t->added[j + 1] = x;
    }
    return 0;
}

/* bos_token / eos_token: a string, an AddedToken object, or null. */
static char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

static int load_config(rp_tokenizer *t, const char *text, size_t len, rp_err *err) {
    json_error_t je;
    json_t *cfg = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) return rp_errf(err, "tokenizer_config.json: line %d: %s", je.line, je.text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return rp_errf(err, "tokenizer_config.json: not a JSON object");
    }
    t->bos_token = config_token(cfg, "bos_token");
    t->eos_token = config_token(cfg, "eos_token");
    if (t->bos_token) t->bos_id = (int32_t)tok_map_get(&t->text_to_id, t->text_blob, t->bos_token, strlen(t->bos_token), -1);
    if (t->eos_token) t->eos_id = (int32_t)tok_map_get(&t->text_to_id, t->text_blob, t->eos_token, strlen(t->eos_token), -1);
    /* the template itself is loaded and compiled by rp_tokenizer_load_chat_template (chat_template.c) */
    t->config_has_chat_template = json_object_get(cfg, "chat_template") != NULL;
    json_decref(cfg);
    return 0;
}

rp_tokenizer *rp_tokenizer_load_json(const char *json, size_t len, const char *config_json,
                                     size_t config_len, rp_err *err) {
    rp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        rp_errf(err, "out of memory loading tokenizer");
        return NULL;
    }
    t->bos_id = t->eos_id = -1;
    loader L = {.t = t, .err = err};
    if (tj_parse(&L.doc, json, len, err)) {
        rp_err_wrap(err, "tokenizer.json");
        goto fail;
    }
    const tj_node *root = tj_root(&L.doc);
    if (root->type != TJ_OBJECT) {
        rp_errf(err, "tokenizer.json: not a JSON object");
        goto fail;
    }
    /* The decoder tells the two families apart: ByteLevel for GPT-2-style
     * byte-level BPE, Replace/Metaspace/ByteFallback/... for SentencePiece-style
     * BPE (sentencepiece.c), whose decoder must be known before the vocab is
     * read (it says what bytes each token stands for). */
    const tj_node *dec = tj_get(&L.doc, root, "decoder");
    const char *dtype = tj_get_str(&L.doc, dec, "type");
    static const char *const sp_decoders[] = {"Sequence", "Replace", "Metaspace", "ByteFallback", "Fuse", "Strip"};
    for (size_t i = 0; dtype && i < sizeof sp_decoders / sizeof *sp_decoders; i++)
        if (strcmp(dtype, sp_decoders[i]) == 0) t->is_sp = 1;
    if (!t->is_sp && (!dtype || strcmp(dtype, "ByteLevel") != 0)) {
        rp_errf(err, "tokenizer.json: unsupported decoder '%s' (replay supports ByteLevel, and SentencePiece-style "
                     "Replace/Metaspace, ByteFallback, Fuse, Strip)",
                dtype ? dtype : "(none)");
        goto fail;
    }
    if (t->is_sp && tok_sp_load_pipeline(t, &L.doc, root, err)) goto fail;
    if (load_model(&L, tj_get(&L.doc, root, "model"))) goto fail;
    if (!t->is_sp) {
        if (check_normalizer(&L, tj_get(&L.doc, root, "normalizer"), 0)) goto fail;
        int byte_level = 0;
        if (check_pretok(&L, tj_get(&L.doc, root, "pre_tokenizer"), 0, &byte_level)) goto fail;
        if (!byte_level) {
            rp_errf(err, "tokenizer.json: unsupported pre_tokenizer: BPE without ByteLevel (replay supports byte-level BPE)");
            goto fail;
        }
    }
    tj_free(&L.doc);
    free(L.added_off);
    L.added_off = NULL;
    if (config_json && load_config(t, config_json, config_len, err)) goto fail;
    return t;
fail:
    tj_free(&L.doc);
    free(L.text);
    free(L.added_off);
    rp_tokenizer_free(t);
    return NULL;
}

rp_tokenizer *rp_tokenizer_load_files(const char *tokenizer_json_path, const char *config_path, rp_err *err) {
    size_t len, clen = 0;
    char *json = read_file(tokenizer_json_path, &len, err);
    if (!json) return NULL;
    char *cfg = NULL;
    if (config_path) {
        cfg = read_file(config_path, &clen, err);
        if (!cfg) {
            free(json);
            return NULL;
        }
    }
    rp_tokenizer *t = rp_tokenizer_load_json(json, len, cfg, clen, err);
    free(json);
    free(cfg);
    return t;
}

rp_tokenizer *rp_tokenizer_load(const char *model_dir, rp_err *err) {
    char tok[4096], cfg[4096];
    if (snprintf(tok, sizeof tok, "%s/tokenizer.json", model_dir) >= (int)sizeof tok ||
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", model_dir) >= (int)sizeof cfg) {
        rp_errf(err, "model directory path too long");
        return NULL;
    }
    FILE *f = fopen(cfg, "rb");
    int have_cfg = f != NULL;
    if (f) fclose(f);
    rp_tokenizer *t = rp_tokenizer_load_files(tok, have_cfg ? cfg : NULL, err);
    if (!t) rp_err_wrap(err, "loading tokenizer from %s", model_dir);
    return t;
}

void rp_tokenizer_free(rp_tokenizer *t) {
    if (!t) return;
    free(t->text_off);
    free(t->bytes_off);
    free(t->bytes_len);
    free(t->text_blob);
    free(t->bytes_blob);
    free(t->is_special);
    free(t->is_added);
    tok_map_free(&t->text_to_id);
    tok_map_free(&t->bytes_to_id);
    tok_pairmap_free(&t->merges);
    for (int i = 0; t->added && i < t->n_added; i++) free(t->added[i].match_owned);
    free(t->added);
    for (int i = 0; i < t->n_splits; i++) tok_split_free(&t->splits[i]);
    tok_sp_free(&t->sp);
    free(t->bos_token);
    free(t->eos_token);
    tok_chat_free(t->chat);
    free(t);
}

/* ---- encode ---------------------------------------------------------------- */

typedef struct enc_ctx {
    const rp_tokenizer *t;
    tok_scratch *sc;
    pcre2_match_data *md[TOK_MAX_SPLITS];
    tok_ids ids;
    int skip_special;
    const char *text; /* the whole (sanitized) text: where offset 0 is */
    rp_err *err;
} enc_ctx;

static int on_normalized(void *ctx, int32_t id, const char *s, size_t n) {
    enc_ctx *c = ctx;
    if (id >= 0) return tok_ids_push(&c->ids, id) ? rp_errf(c->err, "out of memory encoding") : 0;
    return tok_pretokenize_and_bpe(c->t, 0, s, n, c->sc, c->md, &c->ids, c->err);
}

static int on_raw(void *ctx, int32_t id, const char *s, size_t n) {
    enc_ctx *c = ctx;
    if (id >= 0) return tok_ids_push(&c->ids, id) ? rp_errf(c->err, "out of memory encoding") : 0;
    if (c->t->is_sp) return tok_sp_encode_piece(c->t, s, n, s == c->text, c->skip_special, c->sc, &c->ids, c->err);
    char *norm = NULL;
    size_t nn = n;
    if (c->t->nfc && tok_nfc(s, n, &norm, &nn, c->err)) return RP_ERR;
    const char *text = norm ? norm : s;
    int rc = c->t->any_normalized_added
                 ? tok_split_added(c->t, text, nn, 1, c->skip_special, on_normalized, c)
                 : on_normalized(c, -1, text, nn);
    free(norm);
    return rc;
}

int rp_tokenizer_encode_ex(const rp_tokenizer *t, const char *text, size_t len, unsigned flags,
                           int32_t **ids_out, size_t *n_out, rp_err *err) {
    *ids_out = NULL;
    *n_out = 0;
    char *clean = NULL;
    if (!tok_utf8_valid(text, len)) {
        if (flags & RP_ENCODE_STRICT_UTF8) {
            size_t i = 0;
            while (i < len) {
                int l = tok_utf8_seq_len((const unsigned char *)text + i, len - i);
                if (!l) break;
                i += (size_t)l;
            }
            return rp_errf(err, "text is not valid UTF-8 (byte %zu)", i);
        }
        size_t cl = 0, cap = 0;
        if (tok_utf8_lossy_append((const unsigned char *)text, len, 1, &clean, &cl, &cap, NULL))
            return rp_errf(err, "out of memory encoding");
        text = clean;
        len = cl;
    }
    enc_ctx c = {.t = t, .skip_special = (flags & RP_ENCODE_SPLIT_SPECIAL) != 0, .text = text, .err = err};
    int rc = 0;
    c.sc = tok_scratch_new();
    if (!c.sc) rc = rp_errf(err, "out of memory encoding");
    for (int i = 0; i < t->n_splits && !rc; i++) {
        c.md[i] = pcre2_match_data_create_from_pattern(t->splits[i].re, NULL);
        if (!c.md[i]) rc = rp_errf(err, "out of memory encoding");
    }
    if (!rc) rc = tok_split_added(t, text, len, 0, c.skip_special, on_raw, &c);
    if (!rc && !c.ids.v && tok_ids_push(&c.ids, 0) == 0) c.ids.n = 0; /* non-NULL when empty */
    for (int i = 0; i < t->n_splits; i++)
        if (c.md[i]) pcre2_match_data_free(c.md[i]);
    tok_scratch_free(c.sc);
    free(clean);
    if (rc || !c.ids.v) {
        free(c.ids.v);
        return rc ? rc : rp_errf(err, "out of memory encoding");
    }
    *ids_out = c.ids.v;
    *n_out = c.ids.n;
    return 0;
}

int rp_tokenizer_encode(const rp_tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                        size_t *n_out, rp_err *err) {
    return rp_tokenizer_encode_ex(t, text, len, 0, ids_out, n_out, err);
}

/* ---- decode and lookups ---------------------------------------------------- */

int tok_token_bytes(const rp_tokenizer *t, int32_t id, const char **b, size_t *n) {
    if (id < 0 || id >= t->vocab_size || t->text_off[id] == UINT32_MAX) return -1;
    *b = t->bytes_blob + t->bytes_off[id];
    *n = t->bytes_len[id];
    return 0;
}

int rp_tokenizer_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                        char **out, size_t *out_len, rp_err *err) {
    *out = NULL;
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t bl;
        if (tok_token_bytes(t, ids[i], &b, &bl))
            return rp_errf(err, "token id %d out of range (vocab size %d)", ids[i], t->vocab_size);
        if (!(skip_special && t->is_special[ids[i]])) raw_len += bl;
    }
    if (t->is_sp) return tok_sp_decode(t, ids, n, skip_special, out, out_len, err);
    char *raw = malloc(raw_len ? raw_len : 1);
    if (!raw) return rp_errf(err, "out of memory decoding");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->is_special[ids[i]]) continue;
        const char *b = NULL;
        size_t bl = 0;
        tok_token_bytes(t, ids[i], &b, &bl);
        memcpy(raw + o, b, bl);
        o += bl;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = tok_utf8_lossy_append((const unsigned char *)raw, o, 1, &buf, &len, &cap, NULL);
    free(raw);
    if (rc) return rp_errf(err, "out of memory decoding");
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}

int rp_tokenizer_vocab_size(const rp_tokenizer *t) { return t->vocab_size; }

int rp_tokenizer_token_id(const rp_tokenizer *t, const char *token_text) {
    return (int)tok_map_get(&t->text_to_id, t->text_blob, token_text, strlen(token_text), -1);
}

const char *rp_tokenizer_token_text(const rp_tokenizer *t, int id) {
    if (id < 0 || id >= t->vocab_size || t->text_off[id] == UINT32_MAX) return NULL;
    return t->text_blob + t->text_off[id];
}

int rp_tokenizer_token_bytes(const rp_tokenizer *t, int id, const char **bytes, size_t *len) {
    return tok_token_bytes(t, id, bytes, len);
}

int rp_tokenizer_is_special(const rp_tokenizer *t, int id) {
    return id >= 0 && id < t->vocab_size && t->is_special[id];
}

int rp_tokenizer_bos_id(const rp_tokenizer *t) { return t->bos_id; }
int rp_tokenizer_eos_id(const rp_tokenizer *t) { return t->eos_id; }
const char *rp_tokenizer_bos_token(const rp_tokenizer *t) { return t->bos_token; }
const char *rp_tokenizer_eos_token(const rp_tokenizer *t) { return t->eos_token; }
