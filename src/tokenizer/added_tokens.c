/* Added tokens (special or not) are found in the text before anything else,
 * as HF's AddedVocabulary does: leftmost-longest matches, each match its own
 * token, the text between matches goes on to normalisation and BPE. Tokens
 * marked "normalized" are matched in a second pass on normalised text. The
 * lstrip/rstrip/single_word flags follow find_matches in added_vocabulary.rs. */
#include "tokenizer/tok_internal.h"

#include <string.h>
#include <utf8proc.h>

/* Rust's char::is_whitespace (Unicode White_Space). */
static int rust_ws(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int is_word_cp(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO ? 1
           : (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

/* The code point ending at s[end) (s well-formed), its start in *start. */
static uint32_t cp_before(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp;
    tok_utf8_decode((const unsigned char *)s + i, &cp);
    *start = i;
    return cp;
}

static const tok_added *longest_at(const rp_tokenizer *t, const char *s, size_t n, size_t i,
                                   int normalized_pass) {
    for (int k = 0; k < t->n_added; k++) {
        const tok_added *a = &t->added[k];
        if (a->normalized != normalized_pass || a->match_len == 0 || a->match_len > n - i) continue;
        if (memcmp(s + i, a->match, a->match_len) == 0) return a;
    }
    return NULL;
}

int tok_split_added(const rp_tokenizer *t, const char *s, size_t n, int normalized_pass,
                    int skip_special, tok_segment_fn seg, void *ctx) {
    size_t start_offset = 0, i = 0;
    while (i < n) {
        if (!t->added_first_byte[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        const tok_added *a = longest_at(t, s, n, i, normalized_pass);
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + a->match_len;
        i = stop;
        if (skip_special && a->special) continue;
        if (a->single_word) {
            size_t ps;
            int start_space = start == 0 || !is_word_cp(cp_before(s, start, &ps));
            uint32_t next = 0;
            if (stop < n) tok_utf8_decode((const unsigned char *)s + stop, &next);
            int stop_space = stop == n || !is_word_cp(next);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start, ps;
            while (ns > 0 && rust_ws(cp_before(s, ns, &ps))) ns = ps;
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            uint32_t cp;
            while (stop < n) {
                int l = tok_utf8_decode((const unsigned char *)s + stop, &cp);
                if (!rust_ws(cp)) break;
                stop += (size_t)l;
            }
        }
        if (start > start_offset) {
            int rc = seg(ctx, -1, s + start_offset, start - start_offset);
            if (rc) return rc;
        }
        int rc = seg(ctx, a->id, s + start, stop - start);
        if (rc) return rc;
        start_offset = stop;
    }
    if (start_offset < n) return seg(ctx, -1, s + start_offset, n - start_offset);
    return 0;
}
