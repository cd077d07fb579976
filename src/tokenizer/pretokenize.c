/* The pre-tokenizer: cuts normalised text into the pieces BPE runs on, with
 * the Split regexes of tokenizer.json (and ByteLevel's own GPT-2 regex when
 * use_regex is set), "Isolated" behaviour: every match and every gap between
 * matches is a piece.
 *
 * HF compiles these patterns with Oniguruma; replay uses PCRE2 (JIT). The two
 * agree on this regex dialect except for \s: Oniguruma's is Unicode
 * White_Space, PCRE2's (with UCP) also takes U+180E. So \s and \S are
 * rewritten to the explicit White_Space set before compiling. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

#define WS_SET "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"


/* Rewrites \s / \S outside and inside character classes. \S inside a class
 * has no class-member form; no tokenizer we know uses it, so it is refused. */
static int translate(const char *pat, char **out, rp_err *err) {
    tok_buf b = {0};
    int in_class = 0;
    size_t n = strlen(pat);
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[i + 1];
            int rc;
            if (e == 's')
                rc = in_class ? tok_buf_put(&b, WS_SET, strlen(WS_SET)) : tok_buf_put(&b, "[" WS_SET "]", strlen(WS_SET) + 2);
            else if (e == 'S' && !in_class)
                rc = tok_buf_put(&b, "[^" WS_SET "]", strlen(WS_SET) + 3);
            else if (e == 'S') {
                free(b.p);
                return rp_errf(err, "unsupported regex: \\S inside a character class");
            } else
                rc = tok_buf_put(&b, pat + i, 2);
            if (rc) goto oom;
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            if (tok_buf_put(&b, "[", 1)) goto oom;
            /* a ']' right after '[' or '[^' is a literal member */
            if (i + 1 < n && pat[i + 1] == '^') {
                if (tok_buf_put(&b, "^", 1)) goto oom;
                i++;
            }
            if (i + 1 < n && pat[i + 1] == ']') {
                if (tok_buf_put(&b, "]", 1)) goto oom;
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') {
            /* POSIX class [:name:] inside a class: copy through its ":]" */
            const char *end = strstr(pat + i + 2, ":]");
            if (end) {
                size_t l = (size_t)(end + 2 - (pat + i));
                if (tok_buf_put(&b, pat + i, l)) goto oom;
                i += l - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        if (tok_buf_put(&b, &c, 1)) goto oom;
    }
    if (!b.p && tok_buf_put(&b, "", 0)) goto oom;
    *out = b.p;
    return 0;
oom:
    free(b.p);
    return rp_errf(err, "out of memory compiling regex");
}

int tok_split_compile(tok_split *sp, const char *pattern, int literal, rp_err *err) {
    char *pat = NULL;
    uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK;
    if (literal) {
        opts |= PCRE2_LITERAL;
        pat = strdup(pattern);
        if (!pat) return rp_errf(err, "out of memory compiling regex");
    } else {
        opts |= PCRE2_UCP;
        if (translate(pattern, &pat, err)) return RP_ERR;
    }
    int ecode;
    PCRE2_SIZE eoff;
    sp->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ecode, &eoff, NULL);
    free(pat);
    if (!sp->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return rp_errf(err, "pre-tokenizer regex does not compile at offset %zu: %s", (size_t)eoff,
                       (const char *)msg);
    }
    sp->jit = pcre2_jit_compile(sp->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

void tok_split_free(tok_split *sp) {
    if (sp->re) pcre2_code_free(sp->re);
    sp->re = NULL;
}

static int piece(const rp_tokenizer *t, int level, const char *s, size_t n, tok_scratch *sc,
                 pcre2_match_data **md, tok_ids *out, rp_err *err) {
    if (n == 0) return 0;
    if (level + 1 < t->n_splits) return tok_pretokenize_and_bpe(t, level + 1, s, n, sc, md, out, err);
    if (tok_bpe_word(t, (const unsigned char *)s, n, sc, 0, out))
        return rp_errf(err, "out of memory in BPE");
    return 0;
}

int tok_pretokenize_and_bpe(const rp_tokenizer *t, int level, const char *s, size_t n,
                            tok_scratch *sc, pcre2_match_data **md, tok_ids *out, rp_err *err) {
    if (n == 0) return 0;
    if (t->n_splits == 0) return piece(t, -1, s, n, sc, md, out, err);
    const tok_split *sp = &t->splits[level];
    pcre2_match_data *m = md[level];
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m);
    size_t pos = 0, last = 0;
    while (pos < n) {
        int rc = sp->jit ? pcre2_jit_match(sp->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, m, NULL)
                         : pcre2_match(sp->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, m, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return rp_errf(err, "pre-tokenizer regex failed at byte %zu: %s", pos, (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (ms > last && piece(t, level, s + last, ms - last, sc, md, out, err)) return RP_ERR;
        if (me > ms) {
            if (piece(t, level, s + ms, me - ms, sc, md, out, err)) return RP_ERR;
            pos = last = me;
        } else {
            /* empty match: step over one character, as find_iter does */
            int l = tok_utf8_seq_len((const unsigned char *)s + me, n - me);
            pos = me + (size_t)(l ? l : 1);
            last = ms;
        }
    }
    if (last < n && piece(t, level, s + last, n - last, sc, md, out, err)) return RP_ERR;
    return 0;
}
