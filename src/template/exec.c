/* Statements: text and {{ }} output, if, for (loop variable, `if` filter,
 * else, break/continue), set (names, tuples, namespace attributes, blocks),
 * macro definitions, call and filter blocks. Scopes follow jinja2: a for
 * loop's body gets a fresh scope each iteration (a set inside it does not
 * leak out, which is why templates use namespace()); if blocks share the
 * enclosing scope; a macro runs in a scope of its own over the one it was
 * defined in. */
#include <string.h>

#include "template/tpl_internal.h"

void tpl_step(tpl_state *st) {
    if (++st->steps > RP_TEMPLATE_MAX_STEPS)
        tpl_fail(st, "the template ran more than %ld statements and loop iterations", RP_TEMPLATE_MAX_STEPS);
}

static void assign(tpl_state *st, tpl_frame *f, const tn *target, tv v) {
    if (target->kind == N_NAME) {
        tpl_frame_set(st, f, target->name, v);
    } else if (target->kind == N_GETATTR) {
        tv ns = tpl_lookup(f, target->a->name);
        if (ns.kind != TV_NS) tpl_fail(st, "cannot assign attribute on non-namespace object");
        tv_dict_set(st, ns.u.d, tv_cstr(st, target->name), v);
    } else {
        /* a, b = v: v must hold exactly as many items */
        tv_list *items = tpl_iterate(st, v);
        if (items->n < (size_t)target->n)
            tpl_fail(st, "not enough values to unpack (expected %d, got %zu)", target->n, items->n);
        if (items->n > (size_t)target->n) tpl_fail(st, "too many values to unpack (expected %d)", target->n);
        for (int i = 0; i < target->n; i++) assign(st, f, target->items[i], items->items[i]);
    }
}

/* Runs body into a fresh buffer and returns the text. */
static tv capture(tpl_state *st, tpl_frame *f, const tn *body) {
    tpl_buf *saved = st->out, b = {0};
    st->out = &b;
    tpl_exec_body(st, f, body);
    st->out = saved;
    return tpl_buf_value(st, &b);
}

static void exec_for(tpl_state *st, tpl_frame *f, const tn *x) {
    tv_list *all = tpl_iterate(st, tpl_eval(st, f, x->b));
    tv_list *items = all;
    if (x->c) {
        /* the loop's `if` sees the target, not `loop` */
        tv kept = tv_list_new(st, all->n);
        for (size_t i = 0; i < all->n; i++) {
            tpl_step(st);
            tpl_frame *g = tpl_frame_new(st, f);
            assign(st, g, x->a, all->items[i]);
            if (tv_truthy(tpl_eval(st, g, x->c))) tv_list_push(st, kept.u.l, all->items[i]);
        }
        items = kept.u.l;
    }
    tv_loop *L = tpl_alloc(st, sizeof *L);
    L->items = items;
    tv loop = {.kind = TV_LOOP, .u.loop = L};
    for (size_t i = 0; i < items->n; i++) {
        tpl_step(st);
        L->index0 = i;
        tpl_frame *g = tpl_frame_new(st, f);
        tpl_frame_set(st, g, "loop", loop);
        assign(st, g, x->a, items->items[i]);
        tpl_exec_body(st, g, x->d);
        if (st->loop_ctl == S_BREAK) {
            st->loop_ctl = 0;
            break;
        }
        st->loop_ctl = 0;
    }
    if (!items->n && x->e) tpl_exec_body(st, tpl_frame_new(st, f), x->e);
}

static void exec_stmt(tpl_state *st, tpl_frame *f, const tn *x) {
    tpl_step(st);
    st->line = x->line;
    switch (x->kind) {
    case S_TEXT: tpl_buf_put(st, st->out, x->value.u.s->data, x->value.u.s->len); return;
    case S_PRINT: tv_write_str(st, st->out, tpl_eval(st, f, x->a)); return;
    case S_IF:
        if (tv_truthy(tpl_eval(st, f, x->a))) tpl_exec_body(st, f, x->b);
        else if (x->c) {
            if (x->c->kind == S_IF) exec_stmt(st, f, x->c);
            else tpl_exec_body(st, f, x->c);
        }
        return;
    case S_FOR: exec_for(st, f, x); return;
    case S_SET: assign(st, f, x->a, tpl_eval(st, f, x->b)); return;
    case S_SETBLOCK: {
        tv v = capture(st, f, x->d);
        if (x->b) v = tpl_eval_filters(st, f, x->b, v);
        assign(st, f, x->a, v);
        return;
    }
    case S_MACRO: {
        tv_macro *m = tpl_alloc(st, sizeof *m);
        m->node = x;
        m->closure = f;
        tpl_frame_set(st, f, x->name, (tv){.kind = TV_MACRO, .u.m = m});
        return;
    }
    case S_CALLBLOCK: {
        /* caller() renders this block's body, in the scope of the call site */
        tv_macro *caller = tpl_alloc(st, sizeof *caller);
        caller->node = x;
        caller->closure = f;
        const tn *call = x->a;
        tv fn = tpl_eval(st, f, call->a);
        if (fn.kind != TV_MACRO) tpl_fail(st, "{%% call %%} needs a macro");
        tv *args = tpl_alloc(st, (size_t)(call->n + 1) * sizeof(tv)), *kw = tpl_alloc(st, (size_t)(call->n2 + 1) * sizeof(tv));
        for (int i = 0; i < call->n; i++) args[i] = tpl_eval(st, f, call->items[i]);
        for (int i = 0; i < call->n2; i++) kw[i] = tpl_eval(st, f, call->items2[i]);
        tv_macro with = *fn.u.m;
        with.caller = caller;
        tv r = tpl_call(st, (tv){.kind = TV_MACRO, .u.m = &with}, args, call->n, call->names, kw, call->n2);
        tv_write_str(st, st->out, r);
        return;
    }
    case S_FILTERBLOCK: tv_write_str(st, st->out, tpl_eval_filters(st, f, x->b, capture(st, f, x->d))); return;
    case S_BREAK:
    case S_CONTINUE: st->loop_ctl = x->kind; return;
    case S_BODY: tpl_exec_body(st, f, x); return;
    default: tpl_fail(st, "internal error: not a statement");
    }
}

void tpl_exec_body(tpl_state *st, tpl_frame *f, const tn *body) {
    for (int i = 0; i < body->n && !st->loop_ctl; i++) exec_stmt(st, f, body->items[i]);
}
