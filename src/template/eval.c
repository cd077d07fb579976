/* Expressions: names and scopes, attribute and item access as jinja2's
 * sandboxed environment does them, Python's arithmetic and comparisons,
 * slicing, calls (macros, globals, methods), filters and tests. */
#include <math.h>
#include <string.h>

#include "template/tpl_internal.h"

tpl_frame *tpl_frame_new(tpl_state *st, tpl_frame *parent) {
    tpl_frame *f = tpl_alloc(st, sizeof *f);
    f->parent = parent;
    return f;
}

tv tpl_lookup(tpl_frame *f, const char *name) {
    for (; f; f = f->parent) {
        tv *v = tv_dict_find_str(&f->vars, name);
        if (v) return *v;
    }
    tv u = tv_undef();
    u.undef_name = name;
    return u;
}

void tpl_frame_set(tpl_state *st, tpl_frame *f, const char *name, tv v) {
    tv *slot = tv_dict_find_str(&f->vars, name);
    if (slot) *slot = v;
    else {
        if (!f->vars.cap) {
            f->vars.cap = 8;
            f->vars.keys = tpl_alloc(st, 8 * sizeof(tv));
            f->vars.vals = tpl_alloc(st, 8 * sizeof(tv));
        }
        tv_dict_set(st, &f->vars, tv_cstr(st, name), v);
    }
}

static tv undefined_on(tv owner, const char *name) {
    tv u = tv_undef();
    u.undef_name = name;
    u.undef_owner = tv_owner_name(owner);
    return u;
}

static tv loop_attr(tpl_state *st, tv v, const char *name) {
    const tv_loop *L = v.u.loop;
    int64_t n = (int64_t)L->items->n, i = (int64_t)L->index0;
    if (!strcmp(name, "index")) return tv_int(i + 1);
    if (!strcmp(name, "index0")) return tv_int(i);
    if (!strcmp(name, "revindex")) return tv_int(n - i);
    if (!strcmp(name, "revindex0")) return tv_int(n - i - 1);
    if (!strcmp(name, "first")) return tv_bool(i == 0);
    if (!strcmp(name, "last")) return tv_bool(i == n - 1);
    if (!strcmp(name, "length")) return tv_int(n);
    if (!strcmp(name, "depth")) return tv_int(1);
    if (!strcmp(name, "depth0")) return tv_int(0);
    if (!strcmp(name, "previtem") || !strcmp(name, "nextitem")) {
        int64_t j = name[0] == 'p' ? i - 1 : i + 1;
        if (j >= 0 && j < n) return L->items->items[j];
        tv u = tv_undef();
        u.undef_name = name[0] == 'p' ? "there is no previous item" : "there is no next item";
        return u;
    }
    if (!strcmp(name, "cycle")) {
        tv_func *fn = tpl_alloc(st, sizeof *fn);
        fn->id = F_LOOP_CYCLE;
        fn->self = v;
        fn->name = "cycle";
        return (tv){.kind = TV_FUNC, .u.fn = fn};
    }
    return undefined_on(v, name);
}

tv tpl_getattr(tpl_state *st, tv obj, const char *name) {
    if (obj.kind == TV_UNDEF) tv_undef_fail(st, obj);
    /* the sandbox hides private attributes */
    if (name[0] == '_') return undefined_on(obj, name);
    switch (obj.kind) {
    case TV_NS: {
        tv *v = tv_dict_find_str(obj.u.d, name);
        return v ? *v : undefined_on(obj, name);
    }
    case TV_LOOP: return loop_attr(st, obj, name);
    case TV_DICT: {
        /* Python's getattr first: d.items is the method even with a key "items" */
        int found;
        tv m = tpl_method_get(st, obj, name, &found);
        if (found) return m;
        tv *v = tv_dict_find_str(obj.u.d, name);
        return v ? *v : undefined_on(obj, name);
    }
    default: {
        int found;
        tv m = tpl_method_get(st, obj, name, &found);
        return found ? m : undefined_on(obj, name);
    }
    }
}

/* Python's index normalisation; -1 when out of range. */
static int64_t norm_index(int64_t i, int64_t n) {
    if (i < 0) i += n;
    return i >= 0 && i < n ? i : -1;
}

/* The byte offset of code point k in s (k <= length). */
static size_t cp_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    for (size_t c = 0; c < k && i < n; c++) tpl_utf8_next(s, n, &i);
    return i;
}

tv tpl_getitem(tpl_state *st, tv obj, tv key) {
    if (obj.kind == TV_UNDEF) tv_undef_fail(st, obj);
    if (obj.kind == TV_DICT) {
        tv *v = tv_dict_find(obj.u.d, key);
        if (v) return *v;
    } else if ((obj.kind == TV_LIST || obj.kind == TV_STR) && (key.kind == TV_INT || key.kind == TV_BOOL)) {
        if (obj.kind == TV_LIST) {
            int64_t i = norm_index(key.u.i, (int64_t)obj.u.l->n);
            if (i >= 0) return obj.u.l->items[i];
        } else {
            size_t n = tpl_utf8_len(obj.u.s->data, obj.u.s->len);
            int64_t i = norm_index(key.u.i, (int64_t)n);
            if (i >= 0) {
                size_t a = cp_offset(obj.u.s->data, obj.u.s->len, (size_t)i), b = a;
                tpl_utf8_next(obj.u.s->data, obj.u.s->len, &b);
                return tv_str_new(st, obj.u.s->data + a, b - a);
            }
        }
    }
    /* jinja2 then tries the attribute of that name */
    if (key.kind == TV_STR) {
        if (obj.kind == TV_DICT) return undefined_on(obj, tv_cs(key));
        return tpl_getattr(st, obj, tv_cs(key));
    }
    tv u = undefined_on(obj, "");
    tpl_buf b = {0};
    tpl_buf_putc(st, &b, '#');
    tv_write_repr(st, &b, key);
    u.undef_name = b.data;
    return u;
}

static int64_t slice_arg(tpl_state *st, tv v, int64_t dflt) {
    if (v.kind == TV_UNDEF || v.kind == TV_NONE) return dflt;
    if (v.kind != TV_INT && v.kind != TV_BOOL) tpl_fail(st, "slice indices must be integers or None");
    return v.u.i;
}

/* Python's slice.indices(n) then the walk. */
static tv do_slice(tpl_state *st, tv obj, tv a, tv b, tv c) {
    if (obj.kind == TV_UNDEF) tv_undef_fail(st, obj);
    int64_t step = slice_arg(st, c, 1);
    if (step == 0) tpl_fail(st, "slice step cannot be zero");
    int is_str = obj.kind == TV_STR;
    if (!is_str && obj.kind != TV_LIST) tpl_fail(st, "'%s' object is not subscriptable", tv_type_name(obj));
    int64_t n = is_str ? (int64_t)tpl_utf8_len(obj.u.s->data, obj.u.s->len) : (int64_t)obj.u.l->n;
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t start = slice_arg(st, a, step < 0 ? hi : lo), stop = slice_arg(st, b, step < 0 ? lo : hi);
    if (a.kind != TV_UNDEF && a.kind != TV_NONE) {
        if (start < 0) start = start + n < lo ? lo : start + n;
        else if (start > hi) start = hi;
    }
    if (b.kind != TV_UNDEF && b.kind != TV_NONE) {
        if (stop < 0) stop = stop + n < lo ? lo : stop + n;
        else if (stop > hi) stop = hi;
    }
    if (is_str) {
        /* code point offsets, then bytes */
        size_t *off = tpl_alloc(st, ((size_t)n + 1) * sizeof *off);
        size_t i = 0;
        for (int64_t k = 0; k < n; k++) {
            off[k] = i;
            tpl_utf8_next(obj.u.s->data, obj.u.s->len, &i);
        }
        off[n] = i;
        tpl_buf out = {0};
        if (step == 1) {
            if (stop > start) return tv_str_new(st, obj.u.s->data + off[start], off[stop] - off[start]);
            return tv_str_new(st, "", 0);
        }
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
            tpl_buf_put(st, &out, obj.u.s->data + off[k], off[k + 1] - off[k]);
        return tpl_buf_value(st, &out);
    }
    tv r = tv_list_new(st, 4);
    r.flags = obj.flags;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) tv_list_push(st, r.u.l, obj.u.l->items[k]);
    return r;
}

static void need_defined(tpl_state *st, tv v) {
    if (v.kind == TV_UNDEF) tv_undef_fail(st, v);
}

static _Noreturn void bad_operands(tpl_state *st, const char *op, tv a, tv b) {
    tpl_fail(st, "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_type_name(a), tv_type_name(b));
}

static tv repeat(tpl_state *st, tv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.kind == TV_STR) {
        if (seq.u.s->len && (uint64_t)times > RP_TEMPLATE_MAX_OUTPUT_BYTES / seq.u.s->len)
            tpl_fail(st, "string repetition larger than the output limit");
        tpl_buf b = {0};
        for (int64_t i = 0; i < times; i++) tpl_buf_put(st, &b, seq.u.s->data, seq.u.s->len);
        return tpl_buf_value(st, &b);
    }
    if (seq.u.l->n && (uint64_t)times > 10000000 / seq.u.l->n) tpl_fail(st, "list repetition too large");
    tv r = tv_list_new(st, seq.u.l->n * (size_t)times + 1);
    r.flags = seq.flags;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) tv_list_push(st, r.u.l, seq.u.l->items[k]);
    return r;
}

static double fnum(tv v) { return v.kind == TV_FLOAT ? v.u.f : (double)v.u.i; }

tv tpl_binop(tpl_state *st, tn_op op, tv a, tv b) {
    need_defined(st, a);
    need_defined(st, b);
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "** or pow()"};
    int nums = tv_is_num(a) && tv_is_num(b), ints = nums && a.kind != TV_FLOAT && b.kind != TV_FLOAT;
    int64_t r;
    switch (op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(a.u.i, b.u.i, &r)) tpl_fail(st, "integer overflow");
            return tv_int(r);
        }
        if (nums) return tv_float(fnum(a) + fnum(b));
        if (a.kind == TV_STR && b.kind == TV_STR) {
            if (a.u.s->len + b.u.s->len > RP_TEMPLATE_MAX_OUTPUT_BYTES)
                tpl_fail(st, "string larger than the output limit");
            tv s = tv_str_new(st, NULL, 0);
            tpl_buf buf = {0};
            tpl_buf_put(st, &buf, a.u.s->data, a.u.s->len);
            tpl_buf_put(st, &buf, b.u.s->data, b.u.s->len);
            (void)s;
            return tpl_buf_value(st, &buf);
        }
        if (a.kind == TV_LIST && b.kind == TV_LIST && (a.flags & TV_TUPLE) == (b.flags & TV_TUPLE)) {
            tv l = tv_list_new(st, a.u.l->n + b.u.l->n);
            l.flags = a.flags;
            for (size_t i = 0; i < a.u.l->n; i++) tv_list_push(st, l.u.l, a.u.l->items[i]);
            for (size_t i = 0; i < b.u.l->n; i++) tv_list_push(st, l.u.l, b.u.l->items[i]);
            return l;
        }
        if (a.kind == TV_STR || b.kind == TV_STR) {
            if (a.kind == TV_STR)
                tpl_fail(st, "can only concatenate str (not \"%s\") to str", tv_type_name(b));
        }
        bad_operands(st, names[op], a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(a.u.i, b.u.i, &r)) tpl_fail(st, "integer overflow");
            return tv_int(r);
        }
        if (nums) return tv_float(fnum(a) - fnum(b));
        bad_operands(st, names[op], a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(a.u.i, b.u.i, &r)) tpl_fail(st, "integer overflow");
            return tv_int(r);
        }
        if (nums) return tv_float(fnum(a) * fnum(b));
        if ((a.kind == TV_STR || a.kind == TV_LIST) && (b.kind == TV_INT || b.kind == TV_BOOL)) return repeat(st, a, b.u.i);
        if ((b.kind == TV_STR || b.kind == TV_LIST) && (a.kind == TV_INT || a.kind == TV_BOOL)) return repeat(st, b, a.u.i);
        bad_operands(st, names[op], a, b);
    case OP_DIV:
        if (!nums) bad_operands(st, names[op], a, b);
        if (fnum(b) == 0) tpl_fail(st, "division by zero");
        return tv_float(fnum(a) / fnum(b));
    case OP_FLOORDIV:
    case OP_MOD:
        if (!nums) {
            if (op == OP_MOD && a.kind == TV_STR) tpl_fail(st, "printf-style string formatting (%%) is not supported");
            bad_operands(st, names[op], a, b);
        }
        if (fnum(b) == 0) tpl_fail(st, op == OP_MOD ? "modulo by zero" : "integer division or modulo by zero");
        if (ints) {
            if (a.u.i == INT64_MIN && b.u.i == -1) tpl_fail(st, "integer overflow");
            int64_t q = a.u.i / b.u.i, m = a.u.i % b.u.i;
            if (m != 0 && ((m < 0) != (b.u.i < 0))) {
                q--;
                m += b.u.i;
            }
            return tv_int(op == OP_MOD ? m : q);
        } else {
            double x = fnum(a), y = fnum(b), m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            if (op == OP_MOD) return tv_float(m == 0 ? copysign(0.0, y) : m);
            return tv_float(floor(x / y));
        }
    case OP_POW:
        if (!nums) bad_operands(st, names[op], a, b);
        if (ints && b.u.i >= 0) {
            int64_t acc = 1, base = a.u.i, e = b.u.i;
            while (e) {
                if (e & 1 && __builtin_mul_overflow(acc, base, &acc)) tpl_fail(st, "integer overflow");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) tpl_fail(st, "integer overflow");
            }
            return tv_int(acc);
        }
        if (fnum(a) == 0 && fnum(b) < 0) tpl_fail(st, "0.0 cannot be raised to a negative power");
        return tv_float(pow(fnum(a), fnum(b)));
    default: break;
    }
    tpl_fail(st, "bad operator");
}

static int contains(tpl_state *st, tv hay, tv needle) {
    switch (hay.kind) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (needle.kind != TV_STR)
            tpl_fail(st, "'in <string>' requires string as left operand, not %s", tv_type_name(needle));
        if (!needle.u.s->len) return 1;
        return memmem(hay.u.s->data, hay.u.s->len, needle.u.s->data, needle.u.s->len) != NULL;
    case TV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (tv_equal(hay.u.l->items[i], needle)) return 1;
        return 0;
    case TV_DICT: return tv_dict_find(hay.u.d, needle) != NULL;
    default: tpl_fail(st, "argument of type '%s' is not iterable", tv_type_name(hay));
    }
}

static int compare(tpl_state *st, tn_op op, tv a, tv b) {
    switch (op) {
    case OP_EQ: return tv_equal(a, b);
    case OP_NE: return !tv_equal(a, b);
    case OP_IN: return contains(st, b, a);
    case OP_NOTIN: return !contains(st, b, a);
    default: break;
    }
    int c = tv_compare(st, a, b);
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

tv_list *tpl_iterate(tpl_state *st, tv v) {
    switch (v.kind) {
    case TV_UNDEF:
    case TV_NONE:
        if (v.kind == TV_UNDEF) return tv_list_new(st, 1).u.l;
        tpl_fail(st, "'NoneType' object is not iterable");
    case TV_LIST: return v.u.l;
    case TV_DICT: {
        tv l = tv_list_new(st, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) tv_list_push(st, l.u.l, v.u.d->keys[i]);
        return l.u.l;
    }
    case TV_STR: {
        tv l = tv_list_new(st, v.u.s->len);
        for (size_t i = 0; i < v.u.s->len;) {
            size_t a = i;
            tpl_utf8_next(v.u.s->data, v.u.s->len, &i);
            tv_list_push(st, l.u.l, tv_str_new(st, v.u.s->data + a, i - a));
        }
        return l.u.l;
    }
    default: tpl_fail(st, "'%s' object is not iterable", tv_type_name(v));
    }
}

typedef struct call_args {
    tv *pos, *kw;
    const char **names;
    int n, nkw;
} call_args;

static call_args eval_args(tpl_state *st, tpl_frame *f, const tn *x) {
    call_args a = {.n = x->n, .nkw = x->n2, .names = x->names};
    a.pos = tpl_alloc(st, (size_t)(x->n + 1) * sizeof(tv));
    a.kw = tpl_alloc(st, (size_t)(x->n2 + 1) * sizeof(tv));
    for (int i = 0; i < x->n; i++) a.pos[i] = tpl_eval(st, f, x->items[i]);
    for (int i = 0; i < x->n2; i++) a.kw[i] = tpl_eval(st, f, x->items2[i]);
    return a;
}

static tv apply_filter(tpl_state *st, tpl_frame *f, const tn *x, tv input) {
    call_args a = eval_args(st, f, x);
    int line = st->line;
    st->line = x->line;
    tv r = tpl_filter_apply(st, x->fid, input, a.pos, a.n, a.names, a.kw, a.nkw);
    st->line = line;
    return r;
}

tv tpl_eval_filters(tpl_state *st, tpl_frame *f, const tn *chain, tv input) {
    tv v = chain->a ? tpl_eval_filters(st, f, chain->a, input) : input;
    return apply_filter(st, f, chain, v);
}

tv tpl_eval(tpl_state *st, tpl_frame *f, const tn *e) {
    switch (e->kind) {
    case N_CONST: return e->value;
    case N_NAME: return tpl_lookup(f, e->name);
    case N_LIST:
    case N_TUPLE: {
        tv l = tv_list_new(st, (size_t)e->n);
        if (e->kind == N_TUPLE) l.flags = TV_TUPLE;
        for (int i = 0; i < e->n; i++) tv_list_push(st, l.u.l, tpl_eval(st, f, e->items[i]));
        return l;
    }
    case N_DICT: {
        tv d = tv_dict_new(st, (size_t)e->n);
        for (int i = 0; i < e->n; i++) {
            tv k = tpl_eval(st, f, e->items[i]);
            if (k.kind == TV_LIST && !(k.flags & TV_TUPLE)) tpl_fail(st, "unhashable type: 'list'");
            if (k.kind == TV_DICT) tpl_fail(st, "unhashable type: 'dict'");
            tv_dict_set(st, d.u.d, k, tpl_eval(st, f, e->items2[i]));
        }
        return d;
    }
    case N_GETATTR: return tpl_getattr(st, tpl_eval(st, f, e->a), e->name);
    case N_GETITEM: return tpl_getitem(st, tpl_eval(st, f, e->a), tpl_eval(st, f, e->b));
    case N_SLICE: {
        tv obj = tpl_eval(st, f, e->a);
        tv a = e->b ? tpl_eval(st, f, e->b) : tv_none(), b = e->c ? tpl_eval(st, f, e->c) : tv_none(),
           c = e->d ? tpl_eval(st, f, e->d) : tv_none();
        return do_slice(st, obj, a, b, c);
    }
    case N_CALL: {
        tv fn = tpl_eval(st, f, e->a);
        call_args a = eval_args(st, f, e);
        return tpl_call(st, fn, a.pos, a.n, a.names, a.kw, a.nkw);
    }
    case N_FILTER: return apply_filter(st, f, e, tpl_eval(st, f, e->a));
    case N_TEST: {
        tv v = tpl_eval(st, f, e->a);
        call_args a = eval_args(st, f, e);
        int r = tpl_test_apply(st, e->fid, v, a.pos, a.n);
        return tv_bool(e->op ? !r : r);
    }
    case N_NEG:
    case N_POS: {
        tv v = tpl_eval(st, f, e->a);
        need_defined(st, v);
        if (v.kind == TV_FLOAT) return tv_float(e->kind == N_NEG ? -v.u.f : v.u.f);
        if (v.kind == TV_INT || v.kind == TV_BOOL) {
            if (e->kind == N_POS) return tv_int(v.u.i);
            if (v.u.i == INT64_MIN) tpl_fail(st, "integer overflow");
            return tv_int(-v.u.i);
        }
        tpl_fail(st, "bad operand type for unary %c: '%s'", e->kind == N_NEG ? '-' : '+', tv_type_name(v));
    }
    case N_NOT: return tv_bool(!tv_truthy(tpl_eval(st, f, e->a)));
    case N_AND: {
        tv a = tpl_eval(st, f, e->a);
        return tv_truthy(a) ? tpl_eval(st, f, e->b) : a;
    }
    case N_OR: {
        tv a = tpl_eval(st, f, e->a);
        return tv_truthy(a) ? a : tpl_eval(st, f, e->b);
    }
    case N_BINOP: return tpl_binop(st, (tn_op)e->op, tpl_eval(st, f, e->a), tpl_eval(st, f, e->b));
    case N_CONCAT: {
        tpl_buf b = {0};
        tv_write_str(st, &b, tpl_eval(st, f, e->a));
        tv_write_str(st, &b, tpl_eval(st, f, e->b));
        return tpl_buf_value(st, &b);
    }
    case N_COMPARE: {
        tv left = tpl_eval(st, f, e->a);
        for (int i = 0; i < e->n; i++) {
            tv right = tpl_eval(st, f, e->items[i]);
            if (!compare(st, e->ops[i], left, right)) return tv_bool(0);
            left = right;
        }
        return tv_bool(1);
    }
    case N_COND:
        if (tv_truthy(tpl_eval(st, f, e->a))) return tpl_eval(st, f, e->b);
        return e->c ? tpl_eval(st, f, e->c) : tv_undef();
    default: break;
    }
    tpl_fail(st, "internal error: not an expression");
}
