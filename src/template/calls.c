/* Calling things: macros (and a call block's caller()), the globals
 * transformers' environment has (range, namespace, dict, raise_exception,
 * strftime_now), loop.cycle, and methods; plus the argument binding the
 * filters and methods share. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "template/tpl_internal.h"

void tpl_bind_args(tpl_state *st, const char *what, const char *const *params, int np, tv *out, tv *args, int n,
                   const char **kwnames, tv *kwargs, int nkw) {
    if (n > np) tpl_fail(st, "%s takes at most %d argument%s (%d given)", what, np, np == 1 ? "" : "s", n);
    for (int i = 0; i < np; i++) out[i] = tv_undef();
    for (int i = 0; i < n; i++) out[i] = args[i];
    for (int k = 0; k < nkw; k++) {
        int i;
        for (i = 0; i < np; i++)
            if (!strcmp(params[i], kwnames[k])) break;
        if (i == np) tpl_fail(st, "%s got an unexpected keyword argument '%s'", what, kwnames[k]);
        if (i < n) tpl_fail(st, "%s got multiple values for argument '%s'", what, kwnames[k]);
        out[i] = kwargs[k];
    }
}

static tv call_macro(tpl_state *st, tv_macro *m, tv *args, int n, const char **kwnames, tv *kwargs, int nkw) {
    const tn *x = m->node;
    if (st->depth >= RP_TEMPLATE_MAX_CALL_DEPTH)
        tpl_fail(st, "macro calls nested more than %d deep", RP_TEMPLATE_MAX_CALL_DEPTH);
    tpl_frame *f = tpl_frame_new(st, m->closure);
    const char *name = x->kind == S_MACRO ? x->name : "caller";
    if (n > x->nn) tpl_fail(st, "macro '%s' takes not more than %d argument(s)", name, x->nn);
    for (int i = 0; i < x->nn; i++) {
        tv v = tv_undef();
        v.undef_name = x->names[i];
        if (i < n) v = args[i];
        tpl_frame_set(st, f, x->names[i], v);
    }
    for (int k = 0; k < nkw; k++) {
        int i;
        for (i = 0; i < x->nn; i++)
            if (!strcmp(x->names[i], kwnames[k])) break;
        if (i == x->nn) tpl_fail(st, "macro '%s' takes no keyword argument '%s'", name, kwnames[k]);
        if (i < n) tpl_fail(st, "macro '%s' got multiple values for argument '%s'", name, kwnames[k]);
        tpl_frame_set(st, f, x->names[i], kwargs[k]);
    }
    /* defaults for what was not passed, evaluated in the macro's scope */
    for (int i = 0; i < x->nn; i++) {
        int passed = i < n;
        for (int k = 0; k < nkw && !passed; k++) passed = !strcmp(x->names[i], kwnames[k]);
        if (!passed && x->items2 && x->items2[i]) tpl_frame_set(st, f, x->names[i], tpl_eval(st, f, x->items2[i]));
    }
    if (m->caller) tpl_frame_set(st, f, "caller", (tv){.kind = TV_MACRO, .u.m = m->caller});
    tpl_buf *saved = st->out, b = {0};
    int line = st->line, loop_ctl = st->loop_ctl;
    st->out = &b;
    st->depth++;
    st->loop_ctl = 0;
    tpl_exec_body(st, f, x->d);
    st->depth--;
    st->out = saved;
    st->line = line;
    st->loop_ctl = loop_ctl;
    return tpl_buf_value(st, &b);
}

static tv g_range(tpl_state *st, tv *args, int n) {
    int64_t v[3] = {0, 0, 1};
    if (n < 1 || n > 3) tpl_fail(st, "range expected 1 to 3 arguments, got %d", n);
    for (int i = 0; i < n; i++) {
        if (args[i].kind != TV_INT && args[i].kind != TV_BOOL)
            tpl_fail(st, "'%s' object cannot be interpreted as an integer", tv_type_name(args[i]));
    }
    if (n == 1) v[1] = args[0].u.i;
    else {
        v[0] = args[0].u.i;
        v[1] = args[1].u.i;
        if (n == 3) v[2] = args[2].u.i;
    }
    if (v[2] == 0) tpl_fail(st, "range() arg 3 must not be zero");
    int64_t count = 0;
    if (v[2] > 0 && v[1] > v[0]) count = (v[1] - v[0] + v[2] - 1) / v[2];
    if (v[2] < 0 && v[1] < v[0]) count = (v[0] - v[1] - v[2] - 1) / -v[2];
    /* jinja2's sandbox refuses the same */
    if (count > 100000) tpl_fail(st, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    tv l = tv_list_new(st, (size_t)count + 1);
    for (int64_t i = 0; i < count; i++) tv_list_push(st, l.u.l, tv_int(v[0] + i * v[2]));
    return l;
}

static tv g_strftime(tpl_state *st, tv *args, int n) {
    if (n != 1 || args[0].kind != TV_STR) tpl_fail(st, "strftime_now takes one format string");
    time_t t = st->now_s >= 0 ? (time_t)st->now_s : time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char out[512];
    size_t len = strftime(out, sizeof out, tv_cs(args[0]), &tm);
    if (!len && args[0].u.s->len) tpl_fail(st, "strftime_now: the formatted date is empty or too long");
    return tv_str_new(st, out, len);
}

tv tpl_call(tpl_state *st, tv fn, tv *args, int n, const char **kwnames, tv *kwargs, int nkw) {
    if (fn.kind == TV_UNDEF) tv_undef_fail(st, fn);
    if (fn.kind == TV_MACRO) return call_macro(st, fn.u.m, args, n, kwnames, kwargs, nkw);
    if (fn.kind != TV_FUNC) tpl_fail(st, "'%s' object is not callable", tv_type_name(fn));
    const tv_func *f = fn.u.fn;
    if (f->id == F_METHOD) return tpl_method_call(st, f->self, f->name, args, n, kwnames, kwargs, nkw);
    if (nkw && f->id != F_NAMESPACE && f->id != F_DICT) tpl_fail(st, "%s() takes no keyword arguments", f->name);
    switch (f->id) {
    case F_RANGE: return g_range(st, args, n);
    case F_NAMESPACE:
    case F_DICT: {
        /* namespace(mapping, **kw) / dict(mapping, **kw) */
        tv d = tv_dict_new(st, (size_t)(nkw + 4));
        if (n > 1) tpl_fail(st, "%s() takes at most 1 positional argument", f->name);
        if (n == 1) {
            if (args[0].kind != TV_DICT && args[0].kind != TV_NS)
                tpl_fail(st, "%s() argument must be a mapping", f->name);
            for (size_t i = 0; i < args[0].u.d->n; i++) tv_dict_set(st, d.u.d, args[0].u.d->keys[i], args[0].u.d->vals[i]);
        }
        for (int k = 0; k < nkw; k++) tv_dict_set(st, d.u.d, tv_cstr(st, kwnames[k]), kwargs[k]);
        if (f->id == F_NAMESPACE) d.kind = TV_NS;
        return d;
    }
    case F_RAISE: {
        if (n != 1) tpl_fail(st, "raise_exception takes one message");
        tv msg = tv_to_str(st, args[0]);
        tpl_raise(st, tv_cs(msg));
    }
    case F_STRFTIME: return g_strftime(st, args, n);
    case F_LOOP_CYCLE:
        if (n == 0) tpl_fail(st, "no items for cycling given");
        return args[f->self.u.loop->index0 % (size_t)n];
    default: break;
    }
    tpl_fail(st, "'%s' is not callable", f->name);
}
