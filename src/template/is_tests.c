/* jinja2's tests (`x is defined`, `x is not none`, `n is divisibleby 3`),
 * with Python's type rules: bool is a number and not an integer, a string
 * is iterable and a sequence, and so (as jinja2's Undefined allows
 * iteration and len) is undefined. */
#include <string.h>

#include "template/tpl_internal.h"

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_STRING, T_NUMBER, T_INTEGER, T_FLOAT, T_MAPPING, T_ITERABLE, T_SEQUENCE,
    T_BOOLEAN, T_TRUE, T_FALSE, T_ODD, T_EVEN, T_DIVISIBLEBY, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_SAMEAS,
    T_LOWER, T_UPPER, T_CALLABLE, T_ESCAPED,
};

static const struct {
    const char *name;
    int id;
} TESTS[] = {
    {"defined", T_DEFINED},   {"undefined", T_UNDEFINED}, {"none", T_NONE},         {"string", T_STRING},
    {"number", T_NUMBER},     {"integer", T_INTEGER},     {"float", T_FLOAT},       {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE},   {"boolean", T_BOOLEAN},   {"true", T_TRUE},
    {"false", T_FALSE},       {"odd", T_ODD},             {"even", T_EVEN},         {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ},             {"equalto", T_EQ},          {"==", T_EQ},             {"ne", T_NE},
    {"!=", T_NE},             {"lt", T_LT},               {"lessthan", T_LT},       {"<", T_LT},
    {"le", T_LE},             {"<=", T_LE},               {"gt", T_GT},             {"greaterthan", T_GT},
    {">", T_GT},              {"ge", T_GE},               {">=", T_GE},             {"in", T_IN},
    {"sameas", T_SAMEAS},     {"lower", T_LOWER},         {"upper", T_UPPER},       {"callable", T_CALLABLE},
    {"escaped", T_ESCAPED},
};

int tpl_test_find(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (!strcmp(TESTS[i].name, name)) return TESTS[i].id;
    return -1;
}

static void need_args(tpl_state *st, int n, int want, const char *name) {
    if (n != want) tpl_fail(st, "the test '%s' takes %d argument%s, got %d", name, want, want == 1 ? "" : "s", n);
}

int tpl_test_apply(tpl_state *st, int tid, tv v, tv *args, int n) {
    switch (tid) {
    case T_DEFINED: return v.kind != TV_UNDEF;
    case T_UNDEFINED: return v.kind == TV_UNDEF;
    case T_NONE: return v.kind == TV_NONE;
    case T_STRING: return v.kind == TV_STR;
    case T_NUMBER: return tv_is_num(v);
    case T_INTEGER: return v.kind == TV_INT;
    case T_FLOAT: return v.kind == TV_FLOAT;
    case T_MAPPING: return v.kind == TV_DICT;
    case T_ITERABLE: return v.kind == TV_UNDEF || v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT;
    case T_SEQUENCE: return v.kind == TV_UNDEF || v.kind == TV_STR || v.kind == TV_LIST || v.kind == TV_DICT;
    case T_BOOLEAN: return v.kind == TV_BOOL;
    case T_TRUE: return v.kind == TV_BOOL && v.u.i;
    case T_FALSE: return v.kind == TV_BOOL && !v.u.i;
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        if (v.kind == TV_UNDEF) tv_undef_fail(st, v);
        if (v.kind != TV_INT && v.kind != TV_BOOL) tpl_fail(st, "the test needs an integer, not %s", tv_type_name(v));
        if (tid != T_DIVISIBLEBY) return (v.u.i % 2 != 0) == (tid == T_ODD);
        need_args(st, n, 1, "divisibleby");
        tv m = tpl_binop(st, OP_MOD, v, args[0]);
        return !tv_truthy(m);
    }
    case T_EQ: need_args(st, n, 1, "eq"); return tv_equal(v, args[0]);
    case T_NE: need_args(st, n, 1, "ne"); return !tv_equal(v, args[0]);
    case T_LT: need_args(st, n, 1, "lt"); return tv_compare(st, v, args[0]) < 0;
    case T_LE: need_args(st, n, 1, "le"); return tv_compare(st, v, args[0]) <= 0;
    case T_GT: need_args(st, n, 1, "gt"); return tv_compare(st, v, args[0]) > 0;
    case T_GE: need_args(st, n, 1, "ge"); return tv_compare(st, v, args[0]) >= 0;
    case T_IN: {
        need_args(st, n, 1, "in");
        tv r = tv_none();
        /* the `in` operator's rules */
        tv_list *items;
        if (args[0].kind == TV_STR) {
            if (v.kind != TV_STR) tpl_fail(st, "'in <string>' requires string as left operand");
            return memmem(args[0].u.s->data, args[0].u.s->len, v.u.s->data, v.u.s->len) != NULL || !v.u.s->len;
        }
        if (args[0].kind == TV_DICT) return tv_dict_find(args[0].u.d, v) != NULL;
        items = tpl_iterate(st, args[0]);
        for (size_t i = 0; i < items->n; i++)
            if (tv_equal(items->items[i], v)) return 1;
        (void)r;
        return 0;
    }
    case T_SAMEAS:
        need_args(st, n, 1, "sameas");
        /* Python's `is`: the singletons, or the same list/dict */
        if (v.kind != args[0].kind) return 0;
        if (v.kind == TV_NONE) return 1;
        if (v.kind == TV_BOOL || v.kind == TV_INT) return v.u.i == args[0].u.i;
        if (v.kind == TV_STR) return v.u.s == args[0].u.s;
        if (v.kind == TV_LIST) return v.u.l == args[0].u.l;
        if (v.kind == TV_DICT || v.kind == TV_NS) return v.u.d == args[0].u.d;
        return 0;
    case T_LOWER:
    case T_UPPER: {
        tv s = tv_to_str(st, v);
        tv c = tpl_str_case(st, s, tid == T_UPPER);
        return tv_equal(s, c);
    }
    case T_CALLABLE: return v.kind == TV_MACRO || v.kind == TV_FUNC;
    case T_ESCAPED: return 0;
    }
    tpl_fail(st, "internal error: unknown test");
}
