/* The filters (x | name(args)): jinja2's builtins that chat templates use,
 * and transformers' tojson in place of jinja2's. jinja2's other builtins are
 * known by name and refused at compile time ("filter 'wordwrap' is not
 * supported by replay"), as an unknown name is ("no filter named"). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

enum {
    FL_ABS, FL_CAPITALIZE, FL_LENGTH, FL_DEFAULT, FL_DICTSORT, FL_ESCAPE, FL_FIRST, FL_FLOAT, FL_INDENT, FL_INT,
    FL_ITEMS, FL_JOIN, FL_LAST, FL_LIST, FL_LOWER, FL_MAP, FL_REJECT, FL_REJECTATTR, FL_REPLACE, FL_REVERSE,
    FL_ROUND, FL_SAFE, FL_SELECT, FL_SELECTATTR, FL_SORT, FL_STRING, FL_SUM, FL_TITLE, FL_TOJSON, FL_TRIM,
    FL_UNIQUE, FL_UPPER, FL_MIN, FL_MAX,
};

static const struct {
    const char *name;
    int id;
} FILTERS[] = {
    {"abs", FL_ABS},         {"capitalize", FL_CAPITALIZE}, {"count", FL_LENGTH},     {"length", FL_LENGTH},
    {"d", FL_DEFAULT},       {"default", FL_DEFAULT},       {"dictsort", FL_DICTSORT}, {"e", FL_ESCAPE},
    {"escape", FL_ESCAPE},   {"first", FL_FIRST},           {"float", FL_FLOAT},       {"indent", FL_INDENT},
    {"int", FL_INT},         {"items", FL_ITEMS},           {"join", FL_JOIN},         {"last", FL_LAST},
    {"list", FL_LIST},       {"lower", FL_LOWER},           {"map", FL_MAP},           {"reject", FL_REJECT},
    {"rejectattr", FL_REJECTATTR}, {"replace", FL_REPLACE}, {"reverse", FL_REVERSE},   {"round", FL_ROUND},
    {"safe", FL_SAFE},       {"select", FL_SELECT},         {"selectattr", FL_SELECTATTR}, {"sort", FL_SORT},
    {"string", FL_STRING},   {"sum", FL_SUM},               {"title", FL_TITLE},       {"tojson", FL_TOJSON},
    {"trim", FL_TRIM},       {"unique", FL_UNIQUE},         {"upper", FL_UPPER},       {"min", FL_MIN},
    {"max", FL_MAX},
};

/* jinja2 builtins replay does not implement */
static const char *const REFUSED[] = {"attr", "batch", "center", "filesizeformat", "forceescape", "format", "groupby",
                                      "pprint", "random", "slice", "striptags", "truncate", "urlencode", "urlize",
                                      "wordcount", "wordwrap", "xmlattr", NULL};

int tpl_filter_find(const char *name, const char **why_not) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (!strcmp(FILTERS[i].name, name)) return FILTERS[i].id;
    for (int i = 0; REFUSED[i]; i++)
        if (!strcmp(REFUSED[i], name)) {
            *why_not = "replay does not support the";
            return -1;
        }
    *why_not = "no";
    return -1;
}

/* jinja2's make_attrgetter: "a.b.0" walks getitem by parts, digits as indexes. */
static tv get_path(tpl_state *st, tv item, tv attr) {
    if (attr.kind == TV_INT) return tpl_getitem(st, item, attr);
    if (attr.kind != TV_STR) tpl_fail(st, "attribute must be a string");
    const char *p = tv_cs(attr);
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        tv key = tv_str_new(st, p, n);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (digits) key = tv_int(strtoll(key.u.s->data, NULL, 10));
        item = tpl_getitem(st, item, key);
        p += n + (dot != NULL);
    }
    return item;
}

/* The key sort/unique/dictsort compare by: lowercased unless case-sensitive. */
static tv sort_key(tpl_state *st, tv v, int case_sensitive) {
    if (!case_sensitive && v.kind == TV_STR) return tpl_str_case(st, v, 0);
    return v;
}

/* A stable merge sort, as Python's sorted() is stable. */
static void merge_sort(tpl_state *st, tv *items, tv *keys, size_t n, int reverse, tv *tmp_i, tv *tmp_k) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(st, items, keys, h, reverse, tmp_i, tmp_k);
    merge_sort(st, items + h, keys + h, n - h, reverse, tmp_i, tmp_k);
    size_t a = 0, b = h, o = 0;
    while (a < h && b < n) {
        int c = tv_compare(st, keys[b], keys[a]);
        /* take from the right only when strictly before the left item */
        int right = reverse ? c > 0 : c < 0;
        tmp_i[o] = right ? items[b] : items[a];
        tmp_k[o++] = right ? keys[b++] : keys[a++];
    }
    while (a < h) tmp_i[o] = items[a], tmp_k[o++] = keys[a++];
    while (b < n) tmp_i[o] = items[b], tmp_k[o++] = keys[b++];
    memcpy(items, tmp_i, n * sizeof *items);
    memcpy(keys, tmp_k, n * sizeof *keys);
}

static tv sorted(tpl_state *st, tv_list *src, tv *keys, int reverse) {
    tv out = tv_list_new(st, src->n + 1);
    memcpy(out.u.l->items, src->items, src->n * sizeof(tv));
    out.u.l->n = src->n;
    tv *tmp_i = tpl_alloc(st, (src->n + 1) * sizeof(tv)), *tmp_k = tpl_alloc(st, (src->n + 1) * sizeof(tv));
    merge_sort(st, out.u.l->items, keys, src->n, reverse, tmp_i, tmp_k);
    return out;
}

static tv html_escape(tpl_state *st, tv v) {
    tv s = tv_to_str(st, v);
    tpl_buf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->data[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (e) tpl_buf_puts(st, &b, e);
        else tpl_buf_putc(st, &b, c);
    }
    return tpl_buf_value(st, &b);
}

/* jinja2's do_title: each run after - whitespace ( { [ < is capitalized. */
static tv title(tpl_state *st, tv s) {
    tv low = tpl_str_case(st, s, 0);
    tpl_buf b = {0};
    int at_start = 1;
    const char *p = low.u.s->data;
    size_t n = low.u.s->len;
    for (size_t i = 0; i < n;) {
        size_t a = i;
        uint32_t c = tpl_utf8_next(p, n, &i);
        int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tpl_py_isspace(c);
        if (at_start && !sep) {
            tv one = tpl_str_case(st, tv_str_new(st, p + a, i - a), 1);
            tpl_buf_put(st, &b, one.u.s->data, one.u.s->len);
        } else {
            tpl_buf_put(st, &b, p + a, i - a);
        }
        at_start = sep;
    }
    return tpl_buf_value(st, &b);
}

/* jinja2's do_indent (3.x): lines after the first get the indent; blank
 * lines only with blank=True; the first line too with first=True. */
static tv indent(tpl_state *st, tv s, tv width, tv first, tv blank) {
    tpl_buf ind = {0};
    if (width.kind == TV_STR) tpl_buf_put(st, &ind, width.u.s->data, width.u.s->len);
    else {
        int64_t w = tv_given(width) ? (width.kind == TV_INT ? width.u.i : 0) : 4;
        for (int64_t i = 0; i < w; i++) tpl_buf_putc(st, &ind, ' ');
    }
    tpl_buf withnl = {0};
    tpl_buf_put(st, &withnl, s.u.s->data, s.u.s->len);
    tpl_buf_putc(st, &withnl, '\n');
    tv lines = tpl_method_call(st, tpl_buf_value(st, &withnl), "splitlines", NULL, 0, NULL, NULL, 0);
    tpl_buf b = {0};
    if (tv_truthy(first)) tpl_buf_put(st, &b, ind.data ? ind.data : "", ind.len);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        tv line = lines.u.l->items[i];
        if (i) {
            tpl_buf_putc(st, &b, '\n');
            if (tv_truthy(blank) || line.u.s->len) tpl_buf_put(st, &b, ind.data ? ind.data : "", ind.len);
        }
        tpl_buf_put(st, &b, line.u.s->data, line.u.s->len);
    }
    return tpl_buf_value(st, &b);
}

/* Python's int(str): optional sign, digits with single underscores, spaces around. */
static int parse_py_int(const char *s, int64_t base, int64_t *out) {
    while (tpl_py_isspace((unsigned char)*s)) s++;
    char clean[128];
    size_t n = 0;
    const char *p = s;
    if (*p == '+' || *p == '-') clean[n++] = *p++;
    if (!*p) return -1;
    int prev_digit = 0;
    for (; *p && !tpl_py_isspace((unsigned char)*p); p++) {
        if (*p == '_') {
            if (!prev_digit) return -1;
            prev_digit = 0;
            continue;
        }
        if (n >= sizeof clean - 1) return -1;
        clean[n++] = *p;
        prev_digit = 1;
    }
    if (!prev_digit) return -1;
    while (tpl_py_isspace((unsigned char)*p)) p++;
    if (*p) return -1;
    clean[n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(clean, &end, (int)base);
    if (*end || errno) return -1;
    *out = v;
    return 0;
}

static int parse_py_float(const char *s, double *out) {
    while (tpl_py_isspace((unsigned char)*s)) s++;
    if (!*s) return -1;
    char *end;
    double v = strtod(s, &end);
    if (end == s) return -1;
    while (tpl_py_isspace((unsigned char)*end)) end++;
    if (*end) return -1;
    /* strtod takes hex floats and "infinity"; Python's float() takes the latter only */
    for (const char *q = s; q < end; q++)
        if (*q == 'x' || *q == 'X') return -1;
    *out = v;
    return 0;
}

static tv py_round(tpl_state *st, tv v, int64_t precision, const char *method) {
    if (v.kind == TV_UNDEF) tv_undef_fail(st, v);
    if (!tv_is_num(v)) tpl_fail(st, "round needs a number, not %s", tv_type_name(v));
    if (strcmp(method, "common")) {
        double scale = pow(10, (double)precision), x = v.kind == TV_FLOAT ? v.u.f : (double)v.u.i;
        if (!strcmp(method, "ceil")) return tv_float(ceil(x * scale) / scale);
        if (!strcmp(method, "floor")) return tv_float(floor(x * scale) / scale);
        tpl_fail(st, "method must be 'common', 'ceil' or 'floor'");
    }
    if (v.kind != TV_FLOAT) return tv_int(v.u.i); /* round(int, n) stays an int */
    if (precision == 0) return tv_float(nearbyint(v.u.f)); /* half to even, as Python */
    if (precision < 0 || precision > 300 || !isfinite(v.u.f)) tpl_fail(st, "round: unsupported precision");
    /* Python rounds the exact binary value to that many decimals, half to
     * even; glibc's printf does the same, and strtod reads it back */
    char buf[512];
    snprintf(buf, sizeof buf, "%.*f", (int)precision, v.u.f);
    return tv_float(strtod(buf, NULL));
}

static tv select_items(tpl_state *st, tv v, tv *a, int n, int attr, int keep_if) {
    tv_list *items = tpl_iterate(st, v);
    tv out = tv_list_new(st, items->n + 1);
    int tid = -1, arg0 = 0;
    if (attr) {
        if (n < 1) tpl_fail(st, "selectattr/rejectattr need an attribute name");
        arg0 = 1;
    }
    if (n > arg0) {
        if (a[arg0].kind != TV_STR) tpl_fail(st, "the test name must be a string");
        tid = tpl_test_find(tv_cs(a[arg0]));
        if (tid < 0) tpl_fail(st, "no test named '%s'", tv_cs(a[arg0]));
    }
    for (size_t i = 0; i < items->n; i++) {
        tv x = attr ? get_path(st, items->items[i], a[0]) : items->items[i];
        int ok = tid < 0 ? tv_truthy(x) : tpl_test_apply(st, tid, x, a + arg0 + 1, n > arg0 ? n - arg0 - 1 : 0);
        if (ok == keep_if) tv_list_push(st, out.u.l, items->items[i]);
    }
    return out;
}

static tv to_list(tpl_state *st, tv v) {
    tv_list *items = tpl_iterate(st, v);
    tv out = tv_list_new(st, items->n + 1);
    memcpy(out.u.l->items, items->items, items->n * sizeof(tv));
    out.u.l->n = items->n;
    return out;
}

#define BIND(what, ...)                                                                                 \
    do {                                                                                                \
        static const char *const params[] = {__VA_ARGS__};                                              \
        tpl_bind_args(st, what, params, (int)(sizeof params / sizeof *params), p, a, n, kwn, kw, nkw); \
    } while (0)

tv tpl_filter_apply(tpl_state *st, int fid, tv v, tv *a, int n, const char **kwn, tv *kw, int nkw) {
    tv p[8];
    switch (fid) {
    case FL_ABS:
        BIND("abs", "");
        if (v.kind == TV_FLOAT) return tv_float(fabs(v.u.f));
        if (v.kind == TV_INT || v.kind == TV_BOOL) {
            if (v.u.i == INT64_MIN) tpl_fail(st, "integer overflow");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.kind == TV_UNDEF) tv_undef_fail(st, v);
        tpl_fail(st, "bad operand type for abs(): '%s'", tv_type_name(v));
    case FL_CAPITALIZE: BIND("capitalize", ""); return tpl_str_case(st, tv_to_str(st, v), 2);
    case FL_LOWER: BIND("lower", ""); return tpl_str_case(st, tv_to_str(st, v), 0);
    case FL_UPPER: BIND("upper", ""); return tpl_str_case(st, tv_to_str(st, v), 1);
    case FL_TITLE: BIND("title", ""); return title(st, tv_to_str(st, v));
    case FL_LENGTH:
        BIND("length", "");
        switch (v.kind) {
        case TV_UNDEF: return tv_int(0);
        case TV_STR: return tv_int((int64_t)tpl_utf8_len(v.u.s->data, v.u.s->len));
        case TV_LIST: return tv_int((int64_t)v.u.l->n);
        case TV_DICT: return tv_int((int64_t)v.u.d->n);
        default: tpl_fail(st, "object of type '%s' has no len()", tv_type_name(v));
        }
    case FL_DEFAULT:
        BIND("default", "default_value", "boolean");
        if (v.kind == TV_UNDEF || (tv_truthy(p[1]) && !tv_truthy(v))) return tv_given(p[0]) ? p[0] : tv_str_new(st, "", 0);
        return v;
    case FL_DICTSORT: {
        BIND("dictsort", "case_sensitive", "by", "reverse");
        if (v.kind != TV_DICT) tpl_fail(st, "dictsort needs a dict, not %s", tv_type_name(v));
        int by_value = p[1].kind == TV_STR && !strcmp(tv_cs(p[1]), "value");
        if (p[1].kind == TV_STR && !by_value && strcmp(tv_cs(p[1]), "key"))
            tpl_fail(st, "You can only sort by either \"key\" or \"value\"");
        tv items = tpl_method_call(st, v, "items", NULL, 0, NULL, NULL, 0);
        tv *keys = tpl_alloc(st, (items.u.l->n + 1) * sizeof(tv));
        for (size_t i = 0; i < items.u.l->n; i++)
            keys[i] = sort_key(st, items.u.l->items[i].u.l->items[by_value], tv_truthy(p[0]));
        return sorted(st, items.u.l, keys, tv_truthy(p[2]));
    }
    case FL_ESCAPE: BIND("escape", ""); return html_escape(st, v);
    case FL_FIRST:
    case FL_LAST: {
        BIND("first", "");
        tv_list *items = tpl_iterate(st, v);
        if (!items->n) {
            tv u = tv_undef();
            u.undef_name = fid == FL_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.";
            return u;
        }
        return items->items[fid == FL_FIRST ? 0 : items->n - 1];
    }
    case FL_FLOAT: {
        BIND("float", "default");
        tv dflt = tv_given(p[0]) ? p[0] : tv_float(0.0);
        double x;
        if (v.kind == TV_FLOAT) return v;
        if (v.kind == TV_INT || v.kind == TV_BOOL) return tv_float((double)v.u.i);
        if (v.kind == TV_STR && !parse_py_float(tv_cs(v), &x)) return tv_float(x);
        return dflt;
    }
    case FL_INT: {
        BIND("int", "default", "base");
        tv dflt = tv_given(p[0]) ? p[0] : tv_int(0);
        int64_t base = p[1].kind == TV_INT ? p[1].u.i : 10, i;
        double x;
        if (v.kind == TV_INT || v.kind == TV_BOOL) return tv_int(v.u.i);
        if (v.kind == TV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? tv_int((int64_t)v.u.f) : dflt;
        if (v.kind == TV_STR) {
            if (!parse_py_int(tv_cs(v), base, &i)) return tv_int(i);
            if (!parse_py_float(tv_cs(v), &x) && isfinite(x) && fabs(x) < 9.2e18) return tv_int((int64_t)x);
        }
        return dflt;
    }
    case FL_INDENT:
        BIND("indent", "width", "first", "blank");
        return indent(st, tv_to_str(st, v), p[0], p[1], p[2]);
    case FL_ITEMS:
        BIND("items", "");
        if (v.kind == TV_UNDEF) return tv_list_new(st, 1);
        if (v.kind != TV_DICT) tpl_fail(st, "Can only get item pairs from a mapping.");
        return tpl_method_call(st, v, "items", NULL, 0, NULL, NULL, 0);
    case FL_JOIN: {
        BIND("join", "d", "attribute");
        tv_list *items = tpl_iterate(st, v);
        tpl_buf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i && tv_given(p[0])) tv_write_str(st, &b, p[0]);
            tv_write_str(st, &b, tv_given(p[1]) && p[1].kind != TV_NONE ? get_path(st, items->items[i], p[1]) : items->items[i]);
        }
        return tpl_buf_value(st, &b);
    }
    case FL_LIST: BIND("list", ""); return to_list(st, v);
    case FL_MAP: {
        tv_list *items = tpl_iterate(st, v);
        tv out = tv_list_new(st, items->n + 1);
        int by_attr = 0;
        tv attr = tv_undef(), dflt = tv_undef();
        for (int k = 0; k < nkw; k++) {
            if (!strcmp(kwn[k], "attribute")) attr = kw[k], by_attr = 1;
            else if (!strcmp(kwn[k], "default")) dflt = kw[k];
            else if (!by_attr && n == 0) tpl_fail(st, "map got an unexpected keyword argument '%s'", kwn[k]);
        }
        if (by_attr) {
            if (n) tpl_fail(st, "map with attribute= takes no positional arguments");
            for (size_t i = 0; i < items->n; i++) {
                tv x = get_path(st, items->items[i], attr);
                if (x.kind == TV_UNDEF && tv_given(dflt)) x = dflt;
                tv_list_push(st, out.u.l, x);
            }
            return out;
        }
        if (n < 1 || a[0].kind != TV_STR) tpl_fail(st, "map needs a filter name or attribute=");
        const char *why = NULL;
        int f2 = tpl_filter_find(tv_cs(a[0]), &why);
        if (f2 < 0) tpl_fail(st, "%s filter '%s'", why, tv_cs(a[0]));
        for (size_t i = 0; i < items->n; i++)
            tv_list_push(st, out.u.l, tpl_filter_apply(st, f2, items->items[i], a + 1, n - 1, kwn, kw, nkw));
        return out;
    }
    case FL_SELECT: return select_items(st, v, a, n, 0, 1);
    case FL_REJECT: return select_items(st, v, a, n, 0, 0);
    case FL_SELECTATTR: return select_items(st, v, a, n, 1, 1);
    case FL_REJECTATTR: return select_items(st, v, a, n, 1, 0);
    case FL_REPLACE:
        BIND("replace", "old", "new", "count");
        if (!tv_given(p[1])) tpl_fail(st, "replace needs old and new");
        return tpl_str_replace(st, tv_to_str(st, v), p[0], p[1],
                               p[2].kind == TV_INT ? p[2].u.i : -1);
    case FL_REVERSE: {
        BIND("reverse", "");
        tv l = to_list(st, v);
        for (size_t i = 0, j = l.u.l->n; i + 1 < j; i++, j--) {
            tv t = l.u.l->items[i];
            l.u.l->items[i] = l.u.l->items[j - 1];
            l.u.l->items[j - 1] = t;
        }
        if (v.kind == TV_STR) { /* a string reversed is a string */
            tpl_buf b = {0};
            for (size_t i = 0; i < l.u.l->n; i++) tv_write_str(st, &b, l.u.l->items[i]);
            return tpl_buf_value(st, &b);
        }
        return l;
    }
    case FL_ROUND:
        BIND("round", "precision", "method");
        return py_round(st, v, p[0].kind == TV_INT ? p[0].u.i : 0, p[1].kind == TV_STR ? tv_cs(p[1]) : "common");
    case FL_SAFE:
    case FL_STRING: BIND("string", ""); return tv_to_str(st, v);
    case FL_SORT: {
        BIND("sort", "reverse", "case_sensitive", "attribute");
        tv_list *items = tpl_iterate(st, v);
        tv *keys = tpl_alloc(st, (items->n + 1) * sizeof(tv));
        for (size_t i = 0; i < items->n; i++) {
            tv x = tv_given(p[2]) && p[2].kind != TV_NONE ? get_path(st, items->items[i], p[2]) : items->items[i];
            keys[i] = sort_key(st, x, tv_truthy(p[1]));
        }
        return sorted(st, items, keys, tv_truthy(p[0]));
    }
    case FL_SUM: {
        BIND("sum", "attribute", "start");
        tv_list *items = tpl_iterate(st, v);
        tv acc = tv_given(p[1]) ? p[1] : tv_int(0);
        for (size_t i = 0; i < items->n; i++)
            acc = tpl_binop(st, OP_ADD, acc, tv_given(p[0]) ? get_path(st, items->items[i], p[0]) : items->items[i]);
        return acc;
    }
    case FL_MIN:
    case FL_MAX: {
        BIND("min", "case_sensitive", "attribute");
        tv_list *items = tpl_iterate(st, v);
        if (!items->n) {
            tv u = tv_undef();
            u.undef_name = "No aggregated item, sequence was empty.";
            return u;
        }
        size_t best = 0;
        tv best_key = tv_undef();
        for (size_t i = 0; i < items->n; i++) {
            tv x = tv_given(p[1]) ? get_path(st, items->items[i], p[1]) : items->items[i];
            tv k = sort_key(st, x, tv_truthy(p[0]));
            int c = i ? tv_compare(st, k, best_key) : 0;
            if (!i || (fid == FL_MIN ? c < 0 : c > 0)) best = i, best_key = k;
        }
        return items->items[best];
    }
    case FL_TOJSON: {
        /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
        tpl_json_opts o = {.ensure_ascii = tv_truthy(p[0]), .sort_keys = tv_truthy(p[3])};
        tv ind = p[1];
        if (tv_given(ind) && ind.kind != TV_NONE) {
            if (ind.kind == TV_STR) o.indent = tv_cs(ind);
            else if (ind.kind == TV_INT || ind.kind == TV_BOOL) {
                int64_t w = ind.u.i < 0 ? 0 : ind.u.i > 1000 ? 1000 : ind.u.i;
                char *sp = tpl_alloc(st, (size_t)w + 1);
                memset(sp, ' ', (size_t)w);
                o.indent = sp;
            } else tpl_fail(st, "tojson: indent must be an integer or a string");
        }
        o.item_sep = o.indent ? "," : ", ";
        o.key_sep = ": ";
        if (tv_given(p[2]) && p[2].kind != TV_NONE) {
            tv s = p[2];
            if (s.kind != TV_LIST || s.u.l->n != 2 || s.u.l->items[0].kind != TV_STR || s.u.l->items[1].kind != TV_STR)
                tpl_fail(st, "tojson: separators must be a pair of strings");
            o.item_sep = tv_cs(s.u.l->items[0]);
            o.key_sep = tv_cs(s.u.l->items[1]);
        }
        tpl_buf b = {0};
        tpl_tojson(st, &b, v, &o);
        return tpl_buf_value(st, &b);
    }
    case FL_TRIM:
        BIND("trim", "chars");
        return tpl_str_strip(st, tv_to_str(st, v), p[0], 1, 1);
    case FL_UNIQUE: {
        BIND("unique", "case_sensitive", "attribute");
        tv_list *items = tpl_iterate(st, v);
        tv out = tv_list_new(st, items->n + 1), seen = tv_list_new(st, items->n + 1);
        for (size_t i = 0; i < items->n; i++) {
            tv x = tv_given(p[1]) ? get_path(st, items->items[i], p[1]) : items->items[i];
            tv k = sort_key(st, x, tv_truthy(p[0]));
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = tv_equal(seen.u.l->items[j], k);
            if (dup) continue;
            tv_list_push(st, seen.u.l, k);
            tv_list_push(st, out.u.l, items->items[i]);
        }
        return out;
    }
    }
    tpl_fail(st, "internal error: unknown filter");
}
