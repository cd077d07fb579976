/* How Python writes values as text: str() for {{ }} output and the string
 * filter, repr() inside lists and dicts ("['a', 1]", "{'k': None}"), and
 * float repr (the shortest digits that read back as the same double). Plus
 * the text buffers and the UTF-8 helpers (Python counts and slices strings
 * in code points). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "template/tpl_internal.h"

void tpl_buf_put(tpl_state *st, tpl_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        if (cap > (size_t)RP_TEMPLATE_MAX_OUTPUT_BYTES + 1) {
            if (b->len + n > RP_TEMPLATE_MAX_OUTPUT_BYTES)
                tpl_fail(st, "the rendered text is larger than %u MiB", RP_TEMPLATE_MAX_OUTPUT_BYTES >> 20);
            cap = (size_t)RP_TEMPLATE_MAX_OUTPUT_BYTES + 1;
        }
        char *d = tpl_alloc(st, cap);
        if (b->len) memcpy(d, b->data, b->len);
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void tpl_buf_putc(tpl_state *st, tpl_buf *b, char c) { tpl_buf_put(st, b, &c, 1); }

void tpl_buf_printf(tpl_state *st, tpl_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) tpl_buf_put(st, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

tv tpl_buf_value(tpl_state *st, const tpl_buf *b) { return tv_str_new(st, b->data ? b->data : "", b->len); }

void tpl_float_repr(double x, char out[32]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x > 0 ? "inf" : "-inf");
        return;
    }
    /* shortest %.{p}e that round-trips: the digits Python's repr picks */
    char e[40];
    int p;
    for (p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e is like "-1.2345e+05": split into sign, digits, decimal exponent */
    const char *s = e;
    int neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(s + 1);
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 < -4 || exp10 >= 16) {
        /* Python: 1e+16, 1.5e-05 */
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (exp10 < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp10 + 1) {
            memcpy(o, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
            o += nd - exp10 - 1;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
}

size_t tpl_utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[*i];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (extra) c &= (uint32_t)(0x3F >> extra);
    (*i)++;
    for (int k = 0; k < extra && *i < n; k++) c = (c << 6) | (u[(*i)++] & 0x3F);
    return c;
}

int tpl_utf8_put(uint32_t c, char out[4]) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Python's str.isspace(), which str.strip() and str.split() use. */
int tpl_py_isspace(uint32_t c) {
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0) return 1;
    if (c < 0x1680) return 0;
    return c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Python's str.isprintable() for one code point: repr() escapes the rest. */
static int py_isprintable(uint32_t c) {
    if (c == ' ') return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

static void write_str_repr(tpl_state *st, tpl_buf *b, const char *s, size_t n) {
    /* Python quotes with ' unless the text has ' and no " */
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tpl_buf_putc(st, b, q);
    for (size_t i = 0; i < n;) {
        size_t start = i;
        uint32_t c = tpl_utf8_next(s, n, &i);
        if (c == (uint32_t)q || c == '\\') {
            tpl_buf_putc(st, b, '\\');
            tpl_buf_putc(st, b, (char)c);
        } else if (c == '\n') tpl_buf_puts(st, b, "\\n");
        else if (c == '\r') tpl_buf_puts(st, b, "\\r");
        else if (c == '\t') tpl_buf_puts(st, b, "\\t");
        else if (c < 0x20 || c == 0x7F) tpl_buf_printf(st, b, "\\x%02x", c);
        else if (c < 0x80 || py_isprintable(c)) tpl_buf_put(st, b, s + start, i - start);
        else if (c <= 0xFF) tpl_buf_printf(st, b, "\\x%02x", c);
        else if (c <= 0xFFFF) tpl_buf_printf(st, b, "\\u%04x", c);
        else tpl_buf_printf(st, b, "\\U%08x", c);
    }
    tpl_buf_putc(st, b, q);
}

static void write_number(tpl_state *st, tpl_buf *b, tv v) {
    if (v.kind == TV_BOOL) tpl_buf_puts(st, b, v.u.i ? "True" : "False");
    else if (v.kind == TV_INT) tpl_buf_printf(st, b, "%lld", (long long)v.u.i);
    else {
        char f[32];
        tpl_float_repr(v.u.f, f);
        tpl_buf_puts(st, b, f);
    }
}

static void write_any(tpl_state *st, tpl_buf *b, tv v, int repr) {
    switch (v.kind) {
    case TV_UNDEF:
        if (repr) tpl_buf_puts(st, b, "Undefined");
        return;
    case TV_NONE: tpl_buf_puts(st, b, "None"); return;
    case TV_BOOL:
    case TV_INT:
    case TV_FLOAT: write_number(st, b, v); return;
    case TV_STR:
        if (repr) write_str_repr(st, b, v.u.s->data, v.u.s->len);
        else tpl_buf_put(st, b, v.u.s->data, v.u.s->len);
        return;
    case TV_LIST: {
        int tuple = v.flags & TV_TUPLE;
        tpl_buf_putc(st, b, tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tpl_buf_puts(st, b, ", ");
            write_any(st, b, v.u.l->items[i], 1);
        }
        if (tuple && v.u.l->n == 1) tpl_buf_putc(st, b, ',');
        tpl_buf_putc(st, b, tuple ? ')' : ']');
        return;
    }
    case TV_DICT:
    case TV_NS:
        if (v.kind == TV_NS) tpl_buf_puts(st, b, "<Namespace ");
        tpl_buf_putc(st, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) tpl_buf_puts(st, b, ", ");
            write_any(st, b, v.u.d->keys[i], 1);
            tpl_buf_puts(st, b, ": ");
            write_any(st, b, v.u.d->vals[i], 1);
        }
        tpl_buf_putc(st, b, '}');
        if (v.kind == TV_NS) tpl_buf_putc(st, b, '>');
        return;
    default:
        /* Python prints an address here, which no template can rely on */
        tpl_fail(st, "cannot print a %s", tv_type_name(v));
    }
}

void tv_write_str(tpl_state *st, tpl_buf *b, tv v) { write_any(st, b, v, 0); }
void tv_write_repr(tpl_state *st, tpl_buf *b, tv v) { write_any(st, b, v, 1); }

tv tv_to_str(tpl_state *st, tv v) {
    if (v.kind == TV_STR) return v;
    tpl_buf b = {0};
    write_any(st, &b, v, 0);
    return tpl_buf_value(st, &b);
}
