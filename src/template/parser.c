/* Tokens -> syntax tree, following jinja2's grammar and precedence:
 *   expr    := or ["if" or ["else" expr]]
 *   or/and/not, then comparisons (== != < <= > >= in, not in; chained),
 *   + -, then ~, then * / // %, then ** (left-associative, as jinja2),
 *   unary - +, then primary with postfix (.name [sub] (call)), then filters
 *   (|name(args)) and tests (is [not] name args) on the unary operand.
 * Statements: if/elif/else, for/else (with `if` filter), set (= and block),
 * macro, call, filter blocks, break/continue (transformers enables
 * loopcontrols), generation (transformers' AssistantTracker: renders its
 * body) and raw (in the lexer). Everything else -- include, import, extends,
 * block, with, do, recursive loops, *args -- is a compile error naming the
 * construct and its line, as is an unknown filter or test (jinja2 checks
 * those at compile time too). */
#include <string.h>

#include "template/tpl_internal.h"

typedef struct parser {
    tpl_state *st;
    const tk *t;
    size_t i, n;
    int nesting, loops, macros;
} parser;

typedef struct nodes {
    tn **v;
    int n, cap;
} nodes;

static const tk *cur(parser *P) { return &P->t[P->i]; }
static const tk *peek(parser *P, int k) { return P->i + (size_t)k < P->n ? &P->t[P->i + (size_t)k] : &P->t[P->n - 1]; }
static void adv(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}

static int is_op(const tk *t, const char *op) { return t->type == TK_OP && !strcmp(t->text, op); }
static int is_name(const tk *t, const char *name) { return t->type == TK_NAME && !strcmp(t->text, name); }

static const char *describe(const tk *t) {
    switch (t->type) {
    case TK_DATA: return "template text";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "end of statement block";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "end of print statement";
    case TK_NAME:
    case TK_OP: return t->text;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_EOF: return "end of template";
    }
    return "token";
}

#define FAIL(P, ...) tpl_fail((P)->st, __VA_ARGS__)

static _Noreturn void unexpected(parser *P, const char *wanted) {
    const tk *t = cur(P);
    if (wanted) FAIL(P, "line %d: expected %s, got '%s'", t->line, wanted, describe(t));
    FAIL(P, "line %d: unexpected '%s'", t->line, describe(t));
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    adv(P);
}

static void expect_type(parser *P, tk_type type, const char *what) {
    if (cur(P)->type != type) unexpected(P, what);
    adv(P);
}

static const char *expect_name(parser *P) {
    if (cur(P)->type != TK_NAME) unexpected(P, "a name");
    const char *s = cur(P)->text;
    adv(P);
    return s;
}

static tn *node(parser *P, tn_kind kind, int line) {
    tn *x = tpl_alloc(P->st, sizeof *x);
    x->kind = kind;
    x->line = line;
    return x;
}

static void push(parser *P, nodes *ns, tn *x) {
    if (ns->n == ns->cap) {
        int cap = ns->cap ? 2 * ns->cap : 8;
        tn **v = tpl_alloc(P->st, (size_t)cap * sizeof *v);
        if (ns->n) memcpy(v, ns->v, (size_t)ns->n * sizeof *v);
        ns->v = v;
        ns->cap = cap;
    }
    ns->v[ns->n++] = x;
}

static void enter(parser *P) {
    if (++P->nesting > RP_TEMPLATE_MAX_NESTING)
        FAIL(P, "line %d: nested more than %d deep", cur(P)->line, RP_TEMPLATE_MAX_NESTING);
}
static void leave(parser *P) { P->nesting--; }

static tn *parse_expr(parser *P, int with_condexpr);
static tn *parse_unary(parser *P, int with_filter);
static tn *parse_tuple(parser *P, int with_condexpr, const char *extra_end);
static tn *parse_postfix(parser *P, tn *x);
static tn *parse_primary(parser *P);

/* (args, name=value, ...) into x->items / x->names + x->items2 */
static void parse_call_args(parser *P, tn *x) {
    expect_op(P, "(");
    nodes pos = {0}, kw = {0};
    const char **names = NULL;
    int nn = 0, cap = 0;
    while (!is_op(cur(P), ")")) {
        if (pos.n + kw.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break; /* a trailing comma */
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            FAIL(P, "line %d: *args and **kwargs in calls are not supported", cur(P)->line);
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), "=")) {
            if (nn == cap) {
                cap = cap ? 2 * cap : 4;
                const char **v = tpl_alloc(P->st, (size_t)cap * sizeof *v);
                if (nn) memcpy(v, names, (size_t)nn * sizeof *v);
                names = v;
            }
            names[nn++] = cur(P)->text;
            adv(P);
            adv(P);
            push(P, &kw, parse_expr(P, 1));
        } else {
            if (kw.n) FAIL(P, "line %d: a positional argument follows a keyword argument", cur(P)->line);
            push(P, &pos, parse_expr(P, 1));
        }
    }
    adv(P);
    x->items = pos.v;
    x->n = pos.n;
    x->items2 = kw.v;
    x->n2 = kw.n;
    x->names = names;
    x->nn = nn;
}

static tn *parse_filter(parser *P, tn *operand, int start_inline) {
    while (is_op(cur(P), "|") || start_inline) {
        if (!start_inline) adv(P);
        start_inline = 0;
        int line = cur(P)->line;
        const char *name = expect_name(P);
        while (is_op(cur(P), ".")) FAIL(P, "line %d: dotted filter names are not supported", line);
        const char *why = NULL;
        int fid = tpl_filter_find(name, &why);
        if (fid < 0) FAIL(P, "line %d: %s filter '%s'", line, why ? why : "no", name);
        tn *f = node(P, N_FILTER, line);
        f->a = operand;
        f->name = name;
        f->fid = fid;
        if (is_op(cur(P), "(")) parse_call_args(P, f);
        operand = f;
    }
    return operand;
}

static tn *parse_test(parser *P, tn *operand) {
    int line = cur(P)->line;
    adv(P); /* is */
    tn *x = node(P, N_TEST, line);
    x->a = operand;
    if (is_name(cur(P), "not")) {
        x->op = 1;
        adv(P);
    }
    const char *name = expect_name(P);
    int tid = tpl_test_find(name);
    if (tid < 0) FAIL(P, "line %d: no test named '%s'", line, name);
    x->name = name;
    x->fid = tid;
    const tk *t = cur(P);
    if (is_op(t, "(")) {
        parse_call_args(P, x);
        if (x->n2) FAIL(P, "line %d: keyword arguments to the test '%s' are not supported", line, name);
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
                is_op(t, "(") || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        /* a test with one argument and no parentheses: x is divisibleby 3 */
        if (is_name(t, "is")) FAIL(P, "line %d: you cannot chain multiple tests with is", line);
        tn *arg = parse_postfix(P, parse_primary(P));
        x->items = tpl_alloc(P->st, sizeof(tn *));
        x->items[0] = arg;
        x->n = 1;
    }
    return x;
}

static tn *parse_filter_expr(parser *P, tn *x) {
    for (;;) {
        if (is_op(cur(P), "|")) x = parse_filter(P, x, 0);
        else if (is_name(cur(P), "is")) x = parse_test(P, x);
        else if (is_op(cur(P), "(")) {
            tn *c = node(P, N_CALL, cur(P)->line);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else break;
    }
    return x;
}

static tn *parse_subscribed(parser *P) {
    int line = cur(P)->line;
    tn *args[3] = {0};
    if (is_op(cur(P), ":")) {
        adv(P);
    } else {
        tn *e = parse_expr(P, 1);
        if (!is_op(cur(P), ":")) return e;
        adv(P);
        args[0] = e;
    }
    tn *s = node(P, N_SLICE, line);
    s->b = args[0];
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) s->c = parse_expr(P, 1);
    if (is_op(cur(P), ":")) {
        adv(P);
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) s->d = parse_expr(P, 1);
    }
    return s;
}

static tn *parse_postfix(parser *P, tn *x) {
    for (;;) {
        const tk *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            const tk *a = cur(P);
            if (a->type == TK_NAME) {
                tn *g = node(P, N_GETATTR, t->line);
                g->a = x;
                g->name = a->text;
                adv(P);
                x = g;
            } else if (a->type == TK_INT) {
                tn *g = node(P, N_GETITEM, t->line);
                g->a = x;
                g->b = node(P, N_CONST, t->line);
                g->b->value = tv_int(a->i);
                adv(P);
                x = g;
            } else {
                unexpected(P, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            adv(P);
            nodes subs = {0};
            for (;;) {
                push(P, &subs, parse_subscribed(P));
                if (!is_op(cur(P), ",")) break;
                adv(P);
                if (is_op(cur(P), "]")) break;
            }
            expect_op(P, "]");
            tn *key = subs.v[0];
            if (subs.n > 1) {
                key = node(P, N_TUPLE, t->line);
                key->items = subs.v;
                key->n = subs.n;
            }
            if (key->kind == N_SLICE) {
                key->a = x;
                x = key;
            } else {
                tn *g = node(P, N_GETITEM, t->line);
                g->a = x;
                g->b = key;
                x = g;
            }
        } else if (is_op(t, "(")) {
            tn *c = node(P, N_CALL, t->line);
            c->a = x;
            parse_call_args(P, c);
            x = c;
        } else {
            return x;
        }
    }
}

static tn *parse_primary(parser *P) {
    const tk *t = cur(P);
    tn *x;
    enter(P);
    if (t->type == TK_NAME) {
        x = node(P, N_CONST, t->line);
        const char *s = t->text;
        if (!strcmp(s, "true") || !strcmp(s, "True")) x->value = tv_bool(1);
        else if (!strcmp(s, "false") || !strcmp(s, "False")) x->value = tv_bool(0);
        else if (!strcmp(s, "none") || !strcmp(s, "None")) x->value = tv_none();
        else {
            x->kind = N_NAME;
            x->name = s;
        }
        adv(P);
    } else if (t->type == TK_STRING) {
        /* adjacent literals concatenate: "a" "b" */
        tpl_buf b = {0};
        while (cur(P)->type == TK_STRING) {
            tpl_buf_put(P->st, &b, cur(P)->text, cur(P)->len);
            adv(P);
        }
        x = node(P, N_CONST, t->line);
        x->value = tpl_buf_value(P->st, &b);
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        x = node(P, N_CONST, t->line);
        x->value = t->type == TK_INT ? tv_int(t->i) : tv_float(t->f);
        adv(P);
    } else if (is_op(t, "(")) {
        adv(P);
        x = parse_tuple(P, 1, NULL);
        /* "()" is the empty tuple; "(x)" is x */
        expect_op(P, ")");
    } else if (is_op(t, "[")) {
        adv(P);
        nodes items = {0};
        while (!is_op(cur(P), "]")) {
            if (items.n) expect_op(P, ",");
            if (is_op(cur(P), "]")) break;
            push(P, &items, parse_expr(P, 1));
        }
        adv(P);
        x = node(P, N_LIST, t->line);
        x->items = items.v;
        x->n = items.n;
    } else if (is_op(t, "{")) {
        adv(P);
        nodes keys = {0}, vals = {0};
        while (!is_op(cur(P), "}")) {
            if (keys.n) expect_op(P, ",");
            if (is_op(cur(P), "}")) break;
            push(P, &keys, parse_expr(P, 1));
            expect_op(P, ":");
            push(P, &vals, parse_expr(P, 1));
        }
        adv(P);
        x = node(P, N_DICT, t->line);
        x->items = keys.v;
        x->items2 = vals.v;
        x->n = keys.n;
    } else {
        unexpected(P, "an expression");
    }
    leave(P);
    return x;
}

static tn *parse_unary(parser *P, int with_filter) {
    const tk *t = cur(P);
    tn *x;
    enter(P);
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        x = node(P, is_op(t, "-") ? N_NEG : N_POS, t->line);
        x->a = parse_unary(P, 0);
    } else {
        x = parse_primary(P);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    leave(P);
    return x;
}

static tn *binop(parser *P, int line, tn_kind kind, tn_op op, tn *a, tn *b) {
    tn *x = node(P, kind, line);
    x->op = (int)op;
    x->a = a;
    x->b = b;
    return x;
}

static tn *parse_pow(parser *P) {
    tn *x = parse_unary(P, 1);
    while (is_op(cur(P), "**")) {
        int line = cur(P)->line;
        adv(P);
        x = binop(P, line, N_BINOP, OP_POW, x, parse_unary(P, 1));
    }
    return x;
}

static tn *parse_math2(parser *P) {
    tn *x = parse_pow(P);
    for (;;) {
        const tk *t = cur(P);
        tn_op op;
        if (is_op(t, "*")) op = OP_MUL;
        else if (is_op(t, "/")) op = OP_DIV;
        else if (is_op(t, "//")) op = OP_FLOORDIV;
        else if (is_op(t, "%")) op = OP_MOD;
        else return x;
        adv(P);
        x = binop(P, t->line, N_BINOP, op, x, parse_pow(P));
    }
}

static tn *parse_concat(parser *P) {
    tn *x = parse_math2(P);
    while (is_op(cur(P), "~")) {
        int line = cur(P)->line;
        adv(P);
        x = binop(P, line, N_CONCAT, OP_ADD, x, parse_math2(P));
    }
    return x;
}

static tn *parse_math1(parser *P) {
    tn *x = parse_concat(P);
    for (;;) {
        const tk *t = cur(P);
        if (!is_op(t, "+") && !is_op(t, "-")) return x;
        adv(P);
        x = binop(P, t->line, N_BINOP, is_op(t, "+") ? OP_ADD : OP_SUB, x, parse_concat(P));
    }
}

static tn *parse_compare(parser *P) {
    int line = cur(P)->line;
    tn *first = parse_math1(P);
    nodes rest = {0};
    tn_op ops[64];
    for (;;) {
        const tk *t = cur(P);
        tn_op op;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            adv(P);
        } else break;
        adv(P);
        if (rest.n == 64) FAIL(P, "line %d: too many chained comparisons", t->line);
        ops[rest.n] = op;
        push(P, &rest, parse_math1(P));
    }
    if (!rest.n) return first;
    tn *x = node(P, N_COMPARE, line);
    x->a = first;
    x->items = rest.v;
    x->n = rest.n;
    x->ops = tpl_alloc(P->st, (size_t)rest.n * sizeof *x->ops);
    memcpy(x->ops, ops, (size_t)rest.n * sizeof *x->ops);
    return x;
}

static tn *parse_not(parser *P) {
    if (is_name(cur(P), "not")) {
        tn *x = node(P, N_NOT, cur(P)->line);
        adv(P);
        enter(P);
        x->a = parse_not(P);
        leave(P);
        return x;
    }
    return parse_compare(P);
}

static tn *parse_and(parser *P) {
    tn *x = parse_not(P);
    while (is_name(cur(P), "and")) {
        int line = cur(P)->line;
        adv(P);
        x = binop(P, line, N_AND, OP_ADD, x, parse_not(P));
    }
    return x;
}

static tn *parse_or(parser *P) {
    tn *x = parse_and(P);
    while (is_name(cur(P), "or")) {
        int line = cur(P)->line;
        adv(P);
        x = binop(P, line, N_OR, OP_ADD, x, parse_and(P));
    }
    return x;
}

static tn *parse_expr(parser *P, int with_condexpr) {
    enter(P);
    tn *x = parse_or(P);
    /* a if cond else b; without else, the missing branch is undefined */
    while (with_condexpr && is_name(cur(P), "if")) {
        tn *c = node(P, N_COND, cur(P)->line);
        adv(P);
        c->a = parse_or(P);
        c->b = x;
        if (is_name(cur(P), "else")) {
            adv(P);
            c->c = parse_expr(P, 1);
        }
        x = c;
    }
    leave(P);
    return x;
}

static int tuple_end(parser *P, const char *extra_end) {
    const tk *t = cur(P);
    return t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(t, ")") || (extra_end && is_name(t, extra_end));
}

static tn *parse_tuple(parser *P, int with_condexpr, const char *extra_end) {
    int line = cur(P)->line;
    nodes items = {0};
    int comma = 0;
    for (;;) {
        if (items.n) {
            if (!is_op(cur(P), ",")) break;
            adv(P);
            comma = 1;
        }
        if (tuple_end(P, extra_end)) break;
        push(P, &items, parse_expr(P, with_condexpr));
        if (!is_op(cur(P), ",")) break;
    }
    if (!comma && items.n == 1) return items.v[0];
    if (!items.n && !is_op(cur(P), ")")) unexpected(P, "an expression");
    tn *x = node(P, N_TUPLE, line);
    x->items = items.v;
    x->n = items.n;
    return x;
}

/* name, ns.attr (when allowed), or a, b, ... */
static tn *parse_target(parser *P, int allow_attr, const char *extra_end) {
    int line = cur(P)->line;
    nodes names = {0};
    for (;;) {
        tn *x = node(P, N_NAME, cur(P)->line);
        x->name = expect_name(P);
        if (allow_attr && is_op(cur(P), ".")) {
            adv(P);
            tn *g = node(P, N_GETATTR, x->line);
            g->a = x;
            g->name = expect_name(P);
            if (names.n || is_op(cur(P), ",")) FAIL(P, "line %d: cannot assign to an attribute in a tuple", line);
            return g;
        }
        push(P, &names, x);
        if (!is_op(cur(P), ",")) break;
        adv(P);
        if (cur(P)->type != TK_NAME || (extra_end && is_name(cur(P), extra_end))) break;
    }
    if (names.n == 1 && !is_op(&P->t[P->i - 1], ",")) return names.v[0];
    tn *t = node(P, N_TUPLE, line);
    t->items = names.v;
    t->n = names.n;
    return t;
}

static tn *parse_body(parser *P, const char *const *ends, const char *opened, int opened_line);

static void end_block(parser *P) { expect_type(P, TK_BLOCK_END, "end of statement block ('%}')"); }

static tn *parse_if(parser *P, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    tn *x = node(P, S_IF, line);
    x->a = parse_tuple(P, 0, NULL);
    end_block(P);
    x->b = parse_body(P, ends, "if", line);
    const char *which = cur(P)->text;
    int eline = cur(P)->line;
    adv(P);
    if (!strcmp(which, "elif")) {
        x->c = parse_if(P, eline);
    } else if (!strcmp(which, "else")) {
        static const char *const endif[] = {"endif", NULL};
        end_block(P);
        x->c = parse_body(P, endif, "if", line);
        adv(P);
        end_block(P);
    } else {
        end_block(P);
    }
    return x;
}

static tn *parse_for(parser *P, int line) {
    static const char *const ends[] = {"endfor", "else", NULL};
    tn *x = node(P, S_FOR, line);
    x->a = parse_target(P, 0, "in");
    if (!is_name(cur(P), "in")) unexpected(P, "'in'");
    adv(P);
    x->b = parse_tuple(P, 0, "recursive");
    if (is_name(cur(P), "if")) {
        adv(P);
        x->c = parse_expr(P, 1);
    }
    if (is_name(cur(P), "recursive")) FAIL(P, "line %d: recursive for loops are not supported", line);
    end_block(P);
    P->loops++;
    x->d = parse_body(P, ends, "for", line);
    P->loops--;
    if (is_name(cur(P), "else")) {
        static const char *const endfor[] = {"endfor", NULL};
        adv(P);
        end_block(P);
        x->e = parse_body(P, endfor, "for", line);
    }
    adv(P);
    end_block(P);
    return x;
}

static tn *parse_set(parser *P, int line) {
    tn *target = parse_target(P, 1, NULL);
    if (is_op(cur(P), "=")) {
        adv(P);
        tn *x = node(P, S_SET, line);
        x->a = target;
        x->b = parse_tuple(P, 1, NULL);
        end_block(P);
        return x;
    }
    static const char *const ends[] = {"endset", NULL};
    tn *x = node(P, S_SETBLOCK, line);
    x->a = target;
    if (is_op(cur(P), "|")) x->b = parse_filter(P, NULL, 0);
    end_block(P);
    x->d = parse_body(P, ends, "set", line);
    adv(P);
    end_block(P);
    return x;
}

/* (a, b=default, ...) of a macro or a call block */
static void parse_signature(parser *P, tn *x) {
    nodes defaults = {0};
    const char **names = tpl_alloc(P->st, 64 * sizeof *names);
    int n = 0;
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        if (n == 64) FAIL(P, "line %d: more than 64 macro parameters", cur(P)->line);
        names[n] = expect_name(P);
        tn *def = NULL;
        if (is_op(cur(P), "=")) {
            adv(P);
            def = parse_expr(P, 1);
        } else if (defaults.n && defaults.v[defaults.n - 1]) {
            FAIL(P, "line %d: a parameter without a default follows one with a default", cur(P)->line);
        }
        push(P, &defaults, def);
        n++;
    }
    adv(P);
    x->names = names;
    x->nn = n;
    x->items2 = defaults.v;
    x->n2 = defaults.n;
}

static tn *parse_macro(parser *P, int line) {
    static const char *const ends[] = {"endmacro", NULL};
    tn *x = node(P, S_MACRO, line);
    x->name = expect_name(P);
    parse_signature(P, x);
    end_block(P);
    int loops = P->loops;
    P->loops = 0; /* break/continue do not cross into a macro body */
    P->macros++;
    x->d = parse_body(P, ends, "macro", line);
    P->macros--;
    P->loops = loops;
    adv(P);
    if (cur(P)->type == TK_NAME) adv(P); /* {% endmacro name %} */
    end_block(P);
    return x;
}

static tn *parse_callblock(parser *P, int line) {
    static const char *const ends[] = {"endcall", NULL};
    tn *x = node(P, S_CALLBLOCK, line);
    if (is_op(cur(P), "(")) parse_signature(P, x);
    x->a = parse_expr(P, 1);
    if (x->a->kind != N_CALL) FAIL(P, "line %d: expected a call after {%% call %%}", line);
    end_block(P);
    int loops = P->loops;
    P->loops = 0;
    x->d = parse_body(P, ends, "call", line);
    P->loops = loops;
    adv(P);
    end_block(P);
    return x;
}

static tn *parse_statement(parser *P) {
    const tk *t = cur(P);
    int line = t->line;
    if (t->type != TK_NAME) unexpected(P, "a statement name");
    const char *s = t->text;
    adv(P);
    enter(P);
    tn *x;
    if (!strcmp(s, "if")) x = parse_if(P, line);
    else if (!strcmp(s, "for")) x = parse_for(P, line);
    else if (!strcmp(s, "set")) x = parse_set(P, line);
    else if (!strcmp(s, "macro")) x = parse_macro(P, line);
    else if (!strcmp(s, "call")) x = parse_callblock(P, line);
    else if (!strcmp(s, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        x = node(P, S_FILTERBLOCK, line);
        x->b = parse_filter(P, NULL, 1);
        end_block(P);
        x->d = parse_body(P, ends, "filter", line);
        adv(P);
        end_block(P);
    } else if (!strcmp(s, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        end_block(P);
        x = parse_body(P, ends, "generation", line);
        adv(P);
        end_block(P);
    } else if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!P->loops) FAIL(P, "line %d: '%s' outside a for loop", line, s);
        x = node(P, s[0] == 'b' ? S_BREAK : S_CONTINUE, line);
        end_block(P);
    } else {
        static const char *const refused[] = {"include", "import", "from", "extends", "block", "with", "do",
                                              "autoescape", "trans", "pluralize", NULL};
        for (int i = 0; refused[i]; i++)
            if (!strcmp(s, refused[i])) FAIL(P, "line %d: '{%% %s %%}' is not supported", line, s);
        FAIL(P, "line %d: unknown tag '%s'", line, s);
    }
    leave(P);
    return x;
}

/* Statements until a block whose name is in ends (left current) or, when
 * ends is NULL, until the end of the template. */
static tn *parse_body(parser *P, const char *const *ends, const char *opened, int opened_line) {
    nodes body = {0};
    tn *b = node(P, S_BODY, cur(P)->line);
    for (;;) {
        const tk *t = cur(P);
        if (t->type == TK_EOF) {
            if (!ends) break;
            FAIL(P, "line %d: unexpected end of template: the '%s' opened on line %d needs '{%% %s %%}'", t->line,
                 opened, opened_line, ends[0]);
        }
        if (t->type == TK_DATA) {
            tn *x = node(P, S_TEXT, t->line);
            x->value = tv_str_new(P->st, t->text, t->len);
            push(P, &body, x);
            adv(P);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(P);
            tn *x = node(P, S_PRINT, t->line);
            x->a = parse_tuple(P, 1, NULL);
            expect_type(P, TK_VAR_END, "end of print statement ('}}')");
            push(P, &body, x);
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(P);
            const tk *name = cur(P);
            if (name->type == TK_NAME && ends)
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(name->text, ends[i])) goto done;
            if (name->type == TK_NAME && (!strncmp(name->text, "end", 3) || !strcmp(name->text, "else") ||
                                          !strcmp(name->text, "elif"))) {
                if (ends)
                    FAIL(P, "line %d: unexpected '%s': the innermost open block is the '%s' of line %d, closed by '%s'",
                         name->line, name->text, opened, opened_line, ends[0]);
                FAIL(P, "line %d: unexpected '%s' outside any block", name->line, name->text);
            }
            push(P, &body, parse_statement(P));
        } else {
            unexpected(P, NULL);
        }
    }
done:
    b->items = body.v;
    b->n = body.n;
    return b;
}

tn *tpl_parse(tpl_state *st, const tk *toks, size_t n) {
    parser P = {.st = st, .t = toks, .n = n};
    return parse_body(&P, NULL, NULL, 0);
}
