/* The interpreter's values: constructors, lists and dicts, and the Python
 * rules every operation leans on (truth, ==, <, type names), plus the
 * conversion from the JSON the caller passes in. */
#include <math.h>
#include <string.h>

#include "template/tpl_internal.h"

tv tv_str_new(tpl_state *st, const char *s, size_t len) {
    tv_str *p = tpl_alloc(st, sizeof *p + len + 1);
    p->len = len;
    if (len) memcpy(p->data, s, len);
    p->data[len] = 0;
    return (tv){.kind = TV_STR, .u.s = p};
}

tv tv_cstr(tpl_state *st, const char *s) { return tv_str_new(st, s, strlen(s)); }

tv tv_list_new(tpl_state *st, size_t cap) {
    tv_list *l = tpl_alloc(st, sizeof *l);
    l->cap = cap ? cap : 4;
    l->items = tpl_alloc(st, l->cap * sizeof(tv));
    return (tv){.kind = TV_LIST, .u.l = l};
}

void tv_list_push(tpl_state *st, tv_list *l, tv v) {
    if (l->n == l->cap) {
        tv *items = tpl_alloc(st, 2 * l->cap * sizeof(tv));
        memcpy(items, l->items, l->n * sizeof(tv));
        l->items = items;
        l->cap *= 2;
    }
    l->items[l->n++] = v;
}

tv tv_dict_new(tpl_state *st, size_t cap) {
    tv_dict *d = tpl_alloc(st, sizeof *d);
    d->cap = cap ? cap : 4;
    d->keys = tpl_alloc(st, d->cap * sizeof(tv));
    d->vals = tpl_alloc(st, d->cap * sizeof(tv));
    return (tv){.kind = TV_DICT, .u.d = d};
}

tv *tv_dict_find(const tv_dict *d, tv key) {
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

/* The common case (string keys from JSON and from attribute names), without
 * building a value for the key. */
tv *tv_dict_find_str(const tv_dict *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++) {
        const tv *k = &d->keys[i];
        if (k->kind == TV_STR && k->u.s->len == n && memcmp(k->u.s->data, key, n) == 0) return &d->vals[i];
    }
    return NULL;
}

void tv_dict_set(tpl_state *st, tv_dict *d, tv key, tv val) {
    tv *slot = tv_dict_find(d, key);
    if (slot) {
        *slot = val;
        return;
    }
    if (d->n == d->cap) {
        tv *keys = tpl_alloc(st, 2 * d->cap * sizeof(tv)), *vals = tpl_alloc(st, 2 * d->cap * sizeof(tv));
        memcpy(keys, d->keys, d->n * sizeof(tv));
        memcpy(vals, d->vals, d->n * sizeof(tv));
        d->keys = keys;
        d->vals = vals;
        d->cap *= 2;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
}

int tv_truthy(tv v) {
    switch (v.kind) {
    case TV_UNDEF:
    case TV_NONE: return 0;
    case TV_BOOL:
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s->len != 0;
    case TV_LIST: return v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static double num(tv v) { return v.kind == TV_FLOAT ? v.u.f : (double)v.u.i; }

int tv_equal(tv a, tv b) {
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) return a.u.i == b.u.i;
        return num(a) == num(b);
    }
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case TV_UNDEF:
    case TV_NONE: return 1;
    case TV_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->data, b.u.s->data, a.u.s->len) == 0;
    case TV_LIST:
        /* a tuple never equals a list in Python */
        if ((a.flags & TV_TUPLE) != (b.flags & TV_TUPLE) || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tv_equal(a.u.l->items[i], b.u.l->items[i])) return 0;
        return 1;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tv *o = tv_dict_find(b.u.d, a.u.d->keys[i]);
            if (!o || !tv_equal(a.u.d->vals[i], *o)) return 0;
        }
        return 1;
    case TV_NS: return a.u.d == b.u.d;
    case TV_MACRO: return a.u.m == b.u.m;
    case TV_FUNC: return a.u.fn == b.u.fn;
    case TV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int tv_compare(tpl_state *st, tv a, tv b) {
    if (a.kind == TV_UNDEF) tv_undef_fail(st, a);
    if (b.kind == TV_UNDEF) tv_undef_fail(st, b);
    if (tv_is_num(a) && tv_is_num(b)) {
        if (a.kind != TV_FLOAT && b.kind != TV_FLOAT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = num(a), y = num(b);
        return (x > y) - (x < y);
    }
    if (a.kind == TV_STR && b.kind == TV_STR) {
        /* UTF-8 byte order is code point order, Python's order for str */
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->data, b.u.s->data, n);
        if (c) return c;
        return (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
    }
    if (a.kind == TV_LIST && b.kind == TV_LIST && (a.flags & TV_TUPLE) == (b.flags & TV_TUPLE)) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return tv_compare(st, a.u.l->items[i], b.u.l->items[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    tpl_fail(st, "'<' not supported between instances of '%s' and '%s'", tv_type_name(a), tv_type_name(b));
}

const char *tv_type_name(tv v) {
    switch (v.kind) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.flags & TV_TUPLE ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_FUNC: return v.u.fn->id == F_METHOD ? "builtin_function_or_method" : "function";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

/* jinja2's object_type_repr: "None", "dict object", "str object". */
const char *tv_owner_name(tv v) {
    switch (v.kind) {
    case TV_NONE: return "None";
    case TV_BOOL: return "bool object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_STR: return "str object";
    case TV_LIST: return v.flags & TV_TUPLE ? "tuple object" : "list object";
    case TV_DICT: return "dict object";
    case TV_NS: return "jinja2.utils.Namespace object";
    case TV_LOOP: return "jinja2.runtime.LoopContext object";
    default: return "object";
    }
}

_Noreturn void tv_undef_fail(tpl_state *st, tv v) {
    if (!v.undef_name) tpl_fail(st, "value is undefined");
    if (!v.undef_owner) tpl_fail(st, "'%s' is undefined", v.undef_name);
    /* jinja2 writes names with repr(): 'x' for a string key, 5 for an index */
    if (v.undef_name[0] == '#') tpl_fail(st, "'%s' has no element %s", v.undef_owner, v.undef_name + 1);
    tpl_fail(st, "'%s' has no attribute '%s'", v.undef_owner, v.undef_name);
}

tv tv_from_json(tpl_state *st, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL: return tv_none();
    case JSON_TRUE: return tv_bool(1);
    case JSON_FALSE: return tv_bool(0);
    case JSON_INTEGER: return tv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return tv_float(json_real_value(j));
    case JSON_STRING: return tv_str_new(st, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        tv l = tv_list_new(st, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) tv_list_push(st, l.u.l, tv_from_json(st, json_array_get(j, i)));
        return l;
    }
    case JSON_OBJECT: {
        tv d = tv_dict_new(st, json_object_size(j));
        const char *k;
        const json_t *val;
        /* jansson keeps insertion order (as Python's json.load does) */
        json_object_foreach((json_t *)j, k, val) tv_dict_set(st, d.u.d, tv_cstr(st, k), tv_from_json(st, val));
        return d;
    }
    }
    return tv_none();
}
