/* UTF-8 for the tokenizer: validation, the "maximal subpart" replacement that
 * Python's decode(errors="replace") and Rust's String::from_utf8_lossy share
 * (so invalid bytes map to U+FFFD exactly as HF sees them), and Python's
 * notion of whitespace for the chat templates' strip/trim. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* The second byte's allowed range for each lead byte (Unicode Table 3-7);
 * later continuation bytes are always 80..BF. */
static int lead_info(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c == 0xE0) return *lo = 0xA0, 3;
    if (c == 0xED) return *hi = 0x9F, 3;
    if (c >= 0xE1 && c <= 0xEF) return 3;
    if (c == 0xF0) return *lo = 0x90, 4;
    if (c == 0xF4) return *hi = 0x8F, 4;
    if (c >= 0xF1 && c <= 0xF3) return 4;
    return 0;
}

int tok_utf8_seq_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    if (s[0] < 0x80) return 1;
    unsigned lo, hi;
    int len = lead_info(s[0], &lo, &hi);
    if (!len || n < (size_t)len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

int tok_utf8_maximal_subpart(const unsigned char *s, size_t n, int *truncated) {
    *truncated = 0;
    unsigned lo, hi;
    int len = lead_info(s[0], &lo, &hi);
    if (!len) return 1;
    int k = 1;
    for (; k < len; k++) {
        if ((size_t)k >= n) {
            *truncated = 1;
            return k;
        }
        unsigned c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return k;
    }
    return k; /* a complete sequence; callers only ask about ill-formed ones */
}

int tok_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            /* skip ASCII 8 bytes at a time */
            while (i + 8 <= n) {
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ULL) break;
                i += 8;
            }
            while (i < n && s[i] < 0x80) i++;
            continue;
        }
        int l = tok_utf8_seq_len(s + i, n - i);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

static int reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

int tok_utf8_lossy_append(const unsigned char *s, size_t n, int final, char **buf, size_t *len,
                          size_t *cap, size_t *consumed) {
    /* worst case every byte becomes a 3-byte U+FFFD */
    if (reserve(buf, cap, *len + 3 * n + 1)) return -1;
    char *o = *buf + *len;
    size_t i = 0;
    while (i < n) {
        int l = tok_utf8_seq_len(s + i, n - i);
        if (l) {
            memcpy(o, s + i, (size_t)l);
            o += l;
            i += (size_t)l;
            continue;
        }
        int truncated;
        int k = tok_utf8_maximal_subpart(s + i, n - i, &truncated);
        if (truncated && !final) break;
        memcpy(o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += (size_t)k;
    }
    *o = '\0';
    *len = (size_t)(o - *buf);
    if (consumed) *consumed = i;
    return 0;
}

int tok_utf8_decode(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) return *cp = c, 1;
    if (c < 0xE0) return *cp = (c & 0x1F) << 6 | (s[1] & 0x3F), 2;
    if (c < 0xF0) return *cp = (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F), 3;
    *cp = (c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return 4;
}

int tok_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_py_isspace(uint32_t c) {
    /* CPython's _PyUnicode_IsWhitespace: bidirectional WS/B/S or category Zs */
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}
