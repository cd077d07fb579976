/* The methods templates call on values: str (startswith, split, strip,
 * replace, ...), dict (get, items, keys, values) and list. The sandbox
 * transformers uses is immutable: list.append, dict.update and the other
 * methods that modify a list or dict fail, as there ("access to attribute
 * 'append' of 'list' object is unsafe."). A method replay does not have
 * is undefined, as an unknown attribute is; calling it fails. */
#include <string.h>
#include <utf8proc.h>

#include "template/tpl_internal.h"

static const char *const STR_METHODS[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper", "lower", "title", "capitalize",
    "replace", "find", "count", "join", "removeprefix", "removesuffix", "isdigit", "isalpha", "isalnum",
    "isspace", "isupper", "islower", "splitlines", "format", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"update", "pop", "popitem", "setdefault", "clear", "fromkeys", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", NULL};

static int in(const char *const *names, const char *name) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

tv tpl_method_get(tpl_state *st, tv obj, const char *name, int *found) {
    *found = 0;
    const char *const *a = NULL, *const *b = NULL;
    if (obj.kind == TV_STR) a = STR_METHODS;
    else if (obj.kind == TV_DICT) a = DICT_METHODS, b = DICT_UNSAFE;
    else if (obj.kind == TV_LIST) a = LIST_METHODS, b = LIST_UNSAFE;
    else return tv_undef();
    if (!in(a, name) && !(b && in(b, name))) return tv_undef();
    *found = 1;
    tv_func *fn = tpl_alloc(st, sizeof *fn);
    fn->id = F_METHOD;
    fn->self = obj;
    fn->name = name;
    return (tv){.kind = TV_FUNC, .u.fn = fn};
}

/* ---- str helpers, shared with the filters -------------------------------- */

static int in_chars(uint32_t c, tv chars) {
    const char *s = chars.u.s->data;
    size_t n = chars.u.s->len;
    for (size_t i = 0; i < n;)
        if (tpl_utf8_next(s, n, &i) == c) return 1;
    return 0;
}

static void need_str(tpl_state *st, tv v, const char *what) {
    if (v.kind == TV_UNDEF) tv_undef_fail(st, v);
    if (v.kind != TV_STR) tpl_fail(st, "%s must be str, not %s", what, tv_type_name(v));
}

tv tpl_str_strip(tpl_state *st, tv s, tv chars, int left, int right) {
    int ws = chars.kind == TV_UNDEF || chars.kind == TV_NONE;
    if (!ws) need_str(st, chars, "strip arg");
    const char *p = s.u.s->data;
    size_t n = s.u.s->len, a = 0, b = n;
    if (left)
        while (a < n) {
            size_t i = a;
            uint32_t c = tpl_utf8_next(p, n, &i);
            if (ws ? !tpl_py_isspace(c) : !in_chars(c, chars)) break;
            a = i;
        }
    if (right)
        while (b > a) {
            size_t i = b - 1;
            while (i > a && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
            size_t j = i;
            uint32_t c = tpl_utf8_next(p, n, &j);
            if (ws ? !tpl_py_isspace(c) : !in_chars(c, chars)) break;
            b = i;
        }
    return tv_str_new(st, p + a, b - a);
}

tv tpl_str_replace(tpl_state *st, tv s, tv old, tv new_, int64_t count) {
    need_str(st, old, "replace() argument 1");
    need_str(st, new_, "replace() argument 2");
    const char *p = s.u.s->data;
    size_t n = s.u.s->len, on = old.u.s->len;
    tpl_buf b = {0};
    if (count < 0) count = INT64_MAX;
    if (on == 0) {
        /* Python inserts new before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (i < n) {
            if (done < count) {
                tpl_buf_put(st, &b, new_.u.s->data, new_.u.s->len);
                done++;
            }
            size_t a = i;
            tpl_utf8_next(p, n, &i);
            tpl_buf_put(st, &b, p + a, i - a);
        }
        if (done < count) tpl_buf_put(st, &b, new_.u.s->data, new_.u.s->len);
        return tpl_buf_value(st, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < n) {
        const char *hit = done < count ? memmem(p + i, n - i, old.u.s->data, on) : NULL;
        if (!hit) {
            tpl_buf_put(st, &b, p + i, n - i);
            break;
        }
        tpl_buf_put(st, &b, p + i, (size_t)(hit - (p + i)));
        tpl_buf_put(st, &b, new_.u.s->data, new_.u.s->len);
        i = (size_t)(hit - p) + on;
        done++;
    }
    return tpl_buf_value(st, &b);
}

static int is_cased_letter(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static void put_cp(tpl_state *st, tpl_buf *b, uint32_t c) {
    char u[4];
    tpl_buf_put(st, b, u, (size_t)tpl_utf8_put(c, u));
}

tv tpl_str_case(tpl_state *st, tv s, int mode) {
    const char *p = s.u.s->data;
    size_t n = s.u.s->len;
    tpl_buf b = {0};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < n;) {
        uint32_t c = tpl_utf8_next(p, n, &i), o;
        if (mode == 0) o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
        else if (mode == 1) o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
        else if (mode == 2) o = (uint32_t)(first ? utf8proc_totitle((utf8proc_int32_t)c) : utf8proc_tolower((utf8proc_int32_t)c));
        else o = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)c) : utf8proc_totitle((utf8proc_int32_t)c));
        /* Python's str.title: a letter after a cased letter is lowered */
        prev_cased = is_cased_letter(c) || (prev_cased && utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_MN);
        first = 0;
        put_cp(st, &b, o);
    }
    return tpl_buf_value(st, &b);
}

tv tpl_str_split(tpl_state *st, tv s, tv sep, int64_t maxsplit) {
    const char *p = s.u.s->data;
    size_t n = s.u.s->len;
    tv out = tv_list_new(st, 8);
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep.kind == TV_UNDEF || sep.kind == TV_NONE) {
        /* runs of whitespace; no empty strings */
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            while (i < n) {
                size_t j = i;
                if (!tpl_py_isspace(tpl_utf8_next(p, n, &j))) break;
                i = j;
            }
            if (i >= n) break;
            if (splits == maxsplit) {
                /* the rest, trailing whitespace included, as Python keeps it */
                tv_list_push(st, out.u.l, tv_str_new(st, p + i, n - i));
                break;
            }
            size_t a = i;
            while (i < n) {
                size_t j = i;
                if (tpl_py_isspace(tpl_utf8_next(p, n, &j))) break;
                i = j;
            }
            tv_list_push(st, out.u.l, tv_str_new(st, p + a, i - a));
            splits++;
        }
        return out;
    }
    need_str(st, sep, "separator");
    size_t sn = sep.u.s->len;
    if (!sn) tpl_fail(st, "empty separator");
    size_t i = 0;
    int64_t splits = 0;
    for (;;) {
        const char *hit = splits < maxsplit ? memmem(p + i, n - i, sep.u.s->data, sn) : NULL;
        if (!hit) {
            tv_list_push(st, out.u.l, tv_str_new(st, p + i, n - i));
            return out;
        }
        tv_list_push(st, out.u.l, tv_str_new(st, p + i, (size_t)(hit - (p + i))));
        i = (size_t)(hit - p) + sn;
        splits++;
    }
}

int tpl_str_startswith(tpl_state *st, tv s, tv prefix, int end) {
    if (prefix.kind == TV_LIST && (prefix.flags & TV_TUPLE)) {
        for (size_t i = 0; i < prefix.u.l->n; i++)
            if (tpl_str_startswith(st, s, prefix.u.l->items[i], end)) return 1;
        return 0;
    }
    if (prefix.kind != TV_STR)
        tpl_fail(st, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
                 tv_type_name(prefix));
    size_t n = s.u.s->len, k = prefix.u.s->len;
    if (k > n) return 0;
    return memcmp(s.u.s->data + (end ? n - k : 0), prefix.u.s->data, k) == 0;
}

static int64_t int_arg(tpl_state *st, tv v, int64_t dflt, const char *what) {
    if (!tv_given(v) || v.kind == TV_NONE) return dflt;
    if (v.kind != TV_INT && v.kind != TV_BOOL) tpl_fail(st, "%s must be an integer", what);
    return v.u.i;
}

static int all_cp(tv s, int (*pred)(uint32_t)) {
    size_t n = s.u.s->len;
    if (!n) return 0;
    for (size_t i = 0; i < n;)
        if (!pred(tpl_utf8_next(s.u.s->data, n, &i))) return 0;
    return 1;
}
static int cp_digit(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND; }
static int cp_alpha(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int cp_alnum(uint32_t c) { return cp_alpha(c) || cp_digit(c); }
static int cp_space(uint32_t c) { return tpl_py_isspace(c); }

static tv str_method(tpl_state *st, tv s, const char *name, tv *a, int n, const char **kwn, tv *kw, int nkw) {
    tv p[3];
    char what[64];
    snprintf(what, sizeof what, "str.%s()", name);
#define BIND(...)                                                                  \
    do {                                                                           \
        static const char *const params[] = {__VA_ARGS__};                         \
        tpl_bind_args(st, what, params, (int)(sizeof params / sizeof *params), p, a, n, kwn, kw, nkw); \
    } while (0)
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        BIND("prefix");
        if (!tv_given(p[0])) tpl_fail(st, "%s takes at least 1 argument", what);
        return tv_bool(tpl_str_startswith(st, s, p[0], name[0] == 'e'));
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        BIND("chars");
        return tpl_str_strip(st, s, p[0], name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "split")) {
        BIND("sep", "maxsplit");
        return tpl_str_split(st, s, p[0], int_arg(st, p[1], -1, "maxsplit"));
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        BIND("");
        int mode = name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 'c' ? 2 : 3;
        return tpl_str_case(st, s, mode);
    }
    if (!strcmp(name, "replace")) {
        BIND("old", "new", "count");
        if (!tv_given(p[1])) tpl_fail(st, "str.replace() takes at least 2 arguments");
        return tpl_str_replace(st, s, p[0], p[1], int_arg(st, p[2], -1, "count"));
    }
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        BIND("sub");
        need_str(st, p[0], "argument");
        const char *h = s.u.s->data;
        size_t hn = s.u.s->len, k = p[0].u.s->len;
        if (name[0] == 'f') {
            const char *hit = memmem(h, hn, p[0].u.s->data, k);
            return tv_int(hit ? (int64_t)tpl_utf8_len(h, (size_t)(hit - h)) : -1);
        }
        if (!k) return tv_int((int64_t)tpl_utf8_len(h, hn) + 1);
        int64_t c = 0;
        for (const char *q = h; (q = memmem(q, hn - (size_t)(q - h), p[0].u.s->data, k)); q += k) c++;
        return tv_int(c);
    }
    if (!strcmp(name, "join")) {
        BIND("iterable");
        tv_list *items = tpl_iterate(st, p[0]);
        tpl_buf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (items->items[i].kind != TV_STR)
                tpl_fail(st, "sequence item %zu: expected str instance, %s found", i, tv_type_name(items->items[i]));
            if (i) tpl_buf_put(st, &b, s.u.s->data, s.u.s->len);
            tpl_buf_put(st, &b, items->items[i].u.s->data, items->items[i].u.s->len);
        }
        return tpl_buf_value(st, &b);
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        BIND("affix");
        need_str(st, p[0], "argument");
        int suffix = name[6] == 's';
        if (!tpl_str_startswith(st, s, p[0], suffix)) return s;
        size_t k = p[0].u.s->len;
        return tv_str_new(st, s.u.s->data + (suffix ? 0 : k), s.u.s->len - k);
    }
    if (!strcmp(name, "splitlines")) {
        BIND("");
        tv out = tv_list_new(st, 8);
        const char *h = s.u.s->data;
        size_t hn = s.u.s->len, from = 0;
        for (size_t i = 0; i < hn;) {
            size_t at = i;
            uint32_t c = tpl_utf8_next(h, hn, &i);
            if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                c == 0x2028 || c == 0x2029) {
                tv_list_push(st, out.u.l, tv_str_new(st, h + from, at - from));
                if (c == '\r' && i < hn && h[i] == '\n') i++;
                from = i;
            }
        }
        if (from < hn) tv_list_push(st, out.u.l, tv_str_new(st, h + from, hn - from));
        return out;
    }
    if (!strcmp(name, "format")) tpl_fail(st, "str.format() is not supported");
    BIND("");
    int (*pred)(uint32_t) = !strcmp(name, "isdigit") ? cp_digit
                            : !strcmp(name, "isalpha") ? cp_alpha
                            : !strcmp(name, "isalnum") ? cp_alnum
                            : !strcmp(name, "isspace") ? cp_space
                                                       : NULL;
    if (pred) return tv_bool(all_cp(s, pred));
    /* isupper / islower: some cased letter, and none of the other case */
    int upper = !strcmp(name, "isupper"), cased = 0;
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t c = tpl_utf8_next(s.u.s->data, s.u.s->len, &i);
        utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
        if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) {
            if (!upper) return tv_bool(0);
            cased = 1;
        } else if (k == UTF8PROC_CATEGORY_LL) {
            if (upper) return tv_bool(0);
            cased = 1;
        }
    }
    return tv_bool(cased);
#undef BIND
}

tv tpl_method_call(tpl_state *st, tv self, const char *name, tv *args, int n, const char **kwnames, tv *kwargs,
                   int nkw) {
    if ((self.kind == TV_DICT && in(DICT_UNSAFE, name)) || (self.kind == TV_LIST && in(LIST_UNSAFE, name)))
        tpl_fail(st, "access to attribute '%s' of '%s' object is unsafe.", name, tv_type_name(self));
    if (self.kind == TV_STR) return str_method(st, self, name, args, n, kwnames, kwargs, nkw);
    if (nkw) tpl_fail(st, "%s.%s() takes no keyword arguments", tv_type_name(self), name);
    if (self.kind == TV_DICT) {
        const tv_dict *d = self.u.d;
        if (!strcmp(name, "get")) {
            if (n < 1 || n > 2) tpl_fail(st, "get expected 1 or 2 arguments, got %d", n);
            tv *v = tv_dict_find(d, args[0]);
            return v ? *v : n == 2 ? args[1] : tv_none();
        }
        if (n) tpl_fail(st, "dict.%s() takes no arguments (%d given)", name, n);
        tv out = tv_list_new(st, d->n + 1);
        if (!strcmp(name, "copy")) {
            tv c = tv_dict_new(st, d->n + 1);
            for (size_t i = 0; i < d->n; i++) tv_dict_set(st, c.u.d, d->keys[i], d->vals[i]);
            return c;
        }
        for (size_t i = 0; i < d->n; i++) {
            if (name[0] == 'k') tv_list_push(st, out.u.l, d->keys[i]);
            else if (name[0] == 'v') tv_list_push(st, out.u.l, d->vals[i]);
            else {
                tv pair = tv_list_new(st, 2);
                pair.flags = TV_TUPLE;
                tv_list_push(st, pair.u.l, d->keys[i]);
                tv_list_push(st, pair.u.l, d->vals[i]);
                tv_list_push(st, out.u.l, pair);
            }
        }
        return out;
    }
    /* list */
    const tv_list *l = self.u.l;
    if (!strcmp(name, "copy")) {
        tv c = tv_list_new(st, l->n + 1);
        for (size_t i = 0; i < l->n; i++) tv_list_push(st, c.u.l, l->items[i]);
        return c;
    }
    if (n != 1) tpl_fail(st, "list.%s() takes exactly one argument (%d given)", name, n);
    int64_t count = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (!tv_equal(l->items[i], args[0])) continue;
        if (name[0] == 'i') return tv_int((int64_t)i);
        count++;
    }
    if (name[0] == 'i') tpl_fail(st, "value is not in list");
    return tv_int(count);
}
