/* The NFC normalizer (tokenizer.json "normalizer": {"type": "NFC"}).
 *
 * utf8proc does the normalization, but only where it can change something:
 * most text is already NFC, and calling utf8proc on all of it would dominate
 * encode time. The text is cut before every "safe starter" -- a character
 * with combining class 0 that is never the second half of a canonical
 * composition and is itself NFC-stable -- because NFC(a + b) == NFC(a) +
 * NFC(b) whenever b begins with one. Chunks made only of safe starters are
 * copied; any other chunk goes through utf8proc. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Conservative: every range here is checked against the Unicode data to be
 * starters, never composition seconds, and unchanged by NFC. Anything not
 * listed just takes the slow path. */
static int safe_starter(uint32_t c) {
    if (c < 0x300) return 1;
    if (c >= 0x4E00 && c <= 0x9FFF) return 1; /* CJK unified ideographs */
    if (c >= 0x3400 && c <= 0x4DBF) return 1; /* CJK extension A */
    if (c >= 0xAC00 && c <= 0xD7A3) return 1; /* Hangul syllables */
    if (c >= 0x3041 && c <= 0x3096) return 1; /* Hiragana letters */
    if (c >= 0x30A1 && c <= 0x30FA) return 1; /* Katakana letters */
    if (c >= 0x3000 && c <= 0x3029) return 1; /* CJK punctuation (before 302A marks) */
    if (c >= 0xFF01 && c <= 0xFF5E) return 1; /* fullwidth ASCII (compat-only decomp) */
    if (c >= 0x0400 && c <= 0x0482) return 1; /* Cyrillic letters */
    if (c >= 0x0388 && c <= 0x03CE) return 1; /* Greek letters */
    if (c >= 0x0621 && c <= 0x064A) return 1; /* Arabic letters */
    if (c >= 0x0E01 && c <= 0x0E30) return 1; /* Thai consonants and vowels */
    if (c >= 0x05D0 && c <= 0x05EA) return 1; /* Hebrew letters */
    if (c >= 0x1E00 && c <= 0x1EFF) return 1; /* Latin extended additional */
    if (c >= 0x2010 && c <= 0x2027) return 1; /* general punctuation */
    if (c >= 0x1F300 && c <= 0x1FAFF) return 1; /* emoji and pictographs */
    return 0;
}

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *nb = realloc(*buf, c);
        if (!nb) return -1;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int tok_nfc(const char *str, size_t n, char **out, size_t *out_n, rp_err *err) {
    const unsigned char *s = (const unsigned char *)str;
    *out = NULL;
    *out_n = n;
    /* Fast exit: every code point below U+0300 (lead bytes below 0xCC). */
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++;
    if (i == n) return 0;

    char *buf = NULL;
    size_t len = 0, cap = 0;
    size_t copied = 0; /* s[0..copied) is already in buf or known unchanged */
    size_t chunk = 0;  /* start of the current chunk */
    int dirty = 0;     /* the current chunk holds a non-safe character */
    i = 0;
    while (i <= n) {
        uint32_t cp = 0;
        int l = 0;
        int at_end = i == n;
        if (!at_end) {
            if (s[i] < 0x80) {
                cp = s[i];
                l = 1;
            } else {
                l = tok_utf8_decode(s + i, &cp);
            }
        }
        if (at_end || safe_starter(cp)) {
            if (dirty) {
                /* flush [copied, chunk) verbatim, then normalise [chunk, i) */
                if (append(&buf, &len, &cap, str + copied, chunk - copied)) goto oom;
                utf8proc_uint8_t *norm = NULL;
                utf8proc_ssize_t r = utf8proc_map(s + chunk, (utf8proc_ssize_t)(i - chunk), &norm,
                                                  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                if (r < 0) {
                    free(buf);
                    return rp_errf(err, "NFC normalization failed: %s", utf8proc_errmsg(r));
                }
                int rc = append(&buf, &len, &cap, (const char *)norm, (size_t)r);
                free(norm);
                if (rc) goto oom;
                copied = i;
            }
            chunk = i;
            dirty = 0;
            if (at_end) break;
        } else {
            dirty = 1;
        }
        i += (size_t)l;
    }
    if (!buf) return 0; /* nothing needed utf8proc */
    if (append(&buf, &len, &cap, str + copied, n - copied)) goto oom;
    *out = buf;
    *out_n = len;
    return 0;
oom:
    free(buf);
    return rp_errf(err, "out of memory normalizing text");
}
