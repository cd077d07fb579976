/* The tojson filter exactly as transformers defines it:
 *   json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
 *              sort_keys=sort_keys)
 * so Python's json module decides every byte: separators ", " and ": "
 * without indent and "," and ": " with it; with indent, each item on its own
 * line, indented per level, empty containers stay "[]" and "{}"; floats as
 * float.__repr__ ("1.0", "1e-05"), NaN and Infinity as bare words; keys
 * that are not strings converted (True -> "true", 1 -> "1"); strings escape
 * only ", \, and control characters (\n \r \t \b \f, else \u00XX) unless
 * ensure_ascii, which also writes everything beyond ASCII as \uXXXX
 * (surrogate pairs above U+FFFF). Undefined and other Python objects fail
 * ("Object of type Undefined is not JSON serializable"). */
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

static void put_json_str(tpl_state *st, tpl_buf *b, const char *s, size_t n, int ensure_ascii) {
    tpl_buf_putc(st, b, '"');
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n;) {
        size_t at = i;
        unsigned char c0 = (unsigned char)s[i];
        const char *esc = NULL;
        char u[16];
        if (c0 == '"') esc = "\\\"";
        else if (c0 == '\\') esc = "\\\\";
        else if (c0 == '\n') esc = "\\n";
        else if (c0 == '\r') esc = "\\r";
        else if (c0 == '\t') esc = "\\t";
        else if (c0 == '\b') esc = "\\b";
        else if (c0 == '\f') esc = "\\f";
        else if (c0 < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c0);
            esc = u;
        }
        if (esc) {
            tpl_buf_put(st, b, s + at - run, run);
            run = 0;
            tpl_buf_puts(st, b, esc);
            i++;
            continue;
        }
        if (c0 < 0x80 || !ensure_ascii) {
            i++;
            run++;
            continue;
        }
        tpl_buf_put(st, b, s + at - run, run);
        run = 0;
        uint32_t c = tpl_utf8_next(s, n, &i);
        if (c >= 0x10000) {
            c -= 0x10000;
            snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF));
        } else {
            snprintf(u, sizeof u, "\\u%04x", c);
        }
        tpl_buf_puts(st, b, u);
    }
    tpl_buf_put(st, b, s + n - run, run);
    tpl_buf_putc(st, b, '"');
}

static void put_float(tpl_state *st, tpl_buf *b, double x) {
    if (x != x) tpl_buf_puts(st, b, "NaN");
    else if (x > 1e308 * 10) tpl_buf_puts(st, b, "Infinity");
    else if (x < -1e308 * 10) tpl_buf_puts(st, b, "-Infinity");
    else {
        char f[32];
        tpl_float_repr(x, f);
        tpl_buf_puts(st, b, f);
    }
}

static void newline_indent(tpl_state *st, tpl_buf *b, const tpl_json_opts *o, int level) {
    tpl_buf_putc(st, b, '\n');
    for (int i = 0; i < level; i++) tpl_buf_puts(st, b, o->indent);
}

/* A dict key as json.dumps converts it: str as is, scalars to their JSON text. */
static void put_key(tpl_state *st, tpl_buf *b, tv k, const tpl_json_opts *o) {
    if (k.kind == TV_STR) {
        put_json_str(st, b, k.u.s->data, k.u.s->len, o->ensure_ascii);
        return;
    }
    tpl_buf kb = {0};
    if (k.kind == TV_BOOL) tpl_buf_puts(st, &kb, k.u.i ? "true" : "false");
    else if (k.kind == TV_NONE) tpl_buf_puts(st, &kb, "null");
    else if (k.kind == TV_INT) tpl_buf_printf(st, &kb, "%lld", (long long)k.u.i);
    else if (k.kind == TV_FLOAT) put_float(st, &kb, k.u.f);
    else tpl_fail(st, "keys must be str, int, float, bool or None, not %s", tv_type_name(k));
    put_json_str(st, b, kb.data, kb.len, o->ensure_ascii);
}

static int key_cmp_str(const void *a, const void *b) {
    const tv *x = *(const tv *const *)a, *y = *(const tv *const *)b;
    size_t n = x->u.s->len < y->u.s->len ? x->u.s->len : y->u.s->len;
    int c = memcmp(x->u.s->data, y->u.s->data, n);
    if (c) return c;
    return (x->u.s->len > y->u.s->len) - (x->u.s->len < y->u.s->len);
}

static void dump(tpl_state *st, tpl_buf *b, tv v, const tpl_json_opts *o, int level) {
    if (level > 1000) tpl_fail(st, "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.kind) {
    case TV_NONE: tpl_buf_puts(st, b, "null"); return;
    case TV_BOOL: tpl_buf_puts(st, b, v.u.i ? "true" : "false"); return;
    case TV_INT: tpl_buf_printf(st, b, "%lld", (long long)v.u.i); return;
    case TV_FLOAT: put_float(st, b, v.u.f); return;
    case TV_STR: put_json_str(st, b, v.u.s->data, v.u.s->len, o->ensure_ascii); return;
    case TV_LIST: {
        if (!v.u.l->n) {
            tpl_buf_puts(st, b, "[]");
            return;
        }
        tpl_buf_putc(st, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tpl_buf_puts(st, b, o->item_sep);
            if (o->indent) newline_indent(st, b, o, level + 1);
            dump(st, b, v.u.l->items[i], o, level + 1);
        }
        if (o->indent) newline_indent(st, b, o, level);
        tpl_buf_putc(st, b, ']');
        return;
    }
    case TV_DICT: {
        const tv_dict *d = v.u.d;
        if (!d->n) {
            tpl_buf_puts(st, b, "{}");
            return;
        }
        size_t *order = tpl_alloc(st, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {
            /* Python sorts the keys themselves; mixed types fail there too */
            const tv **keys = tpl_alloc(st, d->n * sizeof *keys);
            for (size_t i = 0; i < d->n; i++) {
                if (d->keys[i].kind != TV_STR) tpl_fail(st, "sort_keys with keys that are not all strings is not supported");
                keys[i] = &d->keys[i];
            }
            qsort(keys, d->n, sizeof *keys, key_cmp_str);
            for (size_t i = 0; i < d->n; i++) order[i] = (size_t)(keys[i] - d->keys);
        }
        tpl_buf_putc(st, b, '{');
        for (size_t k = 0; k < d->n; k++) {
            size_t i = order[k];
            if (k) tpl_buf_puts(st, b, o->item_sep);
            if (o->indent) newline_indent(st, b, o, level + 1);
            put_key(st, b, d->keys[i], o);
            tpl_buf_puts(st, b, o->key_sep);
            dump(st, b, d->vals[i], o, level + 1);
        }
        if (o->indent) newline_indent(st, b, o, level);
        tpl_buf_putc(st, b, '}');
        return;
    }
    default: tpl_fail(st, "Object of type %s is not JSON serializable", tv_type_name(v));
    }
}

void tpl_tojson(tpl_state *st, tpl_buf *b, tv v, const tpl_json_opts *o) { dump(st, b, v, o, 0); }
