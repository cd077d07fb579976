/* Shared by the template interpreter's files: the arena, the value type
 * (Python's values as Jinja sees them), the syntax tree, and the render
 * state.
 *
 * Memory: everything a compile builds lives in the template's arena and
 * everything a render builds lives in the render's arena, freed at once when
 * it ends. Values are therefore plain structs passed by value, never
 * reference counted, and an error can unwind with longjmp from any depth
 * (tpl_fail): nothing in between owns memory that would leak. Lists and
 * dicts are shared by pointer, as Python shares them (a namespace's
 * attribute assignment is seen by every holder). */
#ifndef RP_TEMPLATE_TPL_INTERNAL_H
#define RP_TEMPLATE_TPL_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "template/template.h"

/* ---- arena (arena.c) ---------------------------------------------------- */
typedef struct tpl_arena_block tpl_arena_block;
typedef struct tpl_arena {
    tpl_arena_block *head;
    size_t used_bytes, limit_bytes;
} tpl_arena;
/* NULL when the limit is reached or malloc fails. Memory is 16-byte aligned
 * and zeroed. */
void *tpl_arena_alloc(tpl_arena *a, size_t n);
void tpl_arena_free(tpl_arena *a);

/* ---- values (value.c, pystr.c) ------------------------------------------ */
typedef enum tv_kind {
    TV_UNDEF, /* jinja2's default Undefined: prints as "", is falsy, fails on use */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* also tuples: flags & TV_TUPLE (repr differs, same behaviour here) */
    TV_DICT,
    TV_NS,    /* namespace(): a dict whose entries are attributes */
    TV_MACRO, /* a macro, or the caller() of a call block */
    TV_FUNC,  /* a global function or a bound method */
    TV_LOOP,  /* the `loop` variable of a for loop */
} tv_kind;

enum { TV_TUPLE = 1 };

typedef struct tv_str tv_str;
typedef struct tv_list tv_list;
typedef struct tv_dict tv_dict;
typedef struct tv_macro tv_macro;
typedef struct tv_func tv_func;
typedef struct tv_loop tv_loop;

typedef struct tv {
    uint8_t kind, flags;
    union {
        int64_t i; /* TV_BOOL (0/1), TV_INT */
        double f;
        tv_str *s;
        tv_list *l;
        tv_dict *d; /* TV_DICT, TV_NS */
        tv_macro *m;
        tv_func *fn;
        tv_loop *loop;
    } u;
    /* Undefined only: what was looked up (name) and on what (owner, the
     * Python type of the object, "dict object"; NULL for a bare name), for
     * the error a later use raises. */
    const char *undef_name;
    const char *undef_owner;
} tv;

struct tv_str {
    size_t len; /* bytes; data is NUL-terminated, may hold NULs */
    char data[];
};
struct tv_list {
    size_t n, cap;
    tv *items;
};
struct tv_dict {
    size_t n, cap;
    tv *keys, *vals; /* insertion order, as Python's dict */
};

typedef struct tn tn;
struct tv_macro {
    const tn *node;     /* S_MACRO, or the S_CALLBLOCK for caller() */
    struct tv_macro *caller; /* the caller() passed to this macro, or NULL */
    struct tpl_frame *closure; /* for caller(): the frame of the call block */
};

/* Built-in functions: globals and the methods of str, dict and list. */
typedef enum tpl_func_id {
    F_RANGE, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME, F_JOINER_UNUSED,
    F_LOOP_CYCLE,
    F_METHOD, /* a method of self, by name */
} tpl_func_id;
struct tv_func {
    tpl_func_id id;
    tv self;
    const char *name;
};

struct tv_loop {
    tv_list *items; /* the iterated items, after the loop's `if` filter */
    size_t index0;
};

static inline tv tv_undef(void) { return (tv){.kind = TV_UNDEF}; }
static inline tv tv_none(void) { return (tv){.kind = TV_NONE}; }
static inline tv tv_bool(int b) { return (tv){.kind = TV_BOOL, .u.i = b ? 1 : 0}; }
static inline tv tv_int(int64_t i) { return (tv){.kind = TV_INT, .u.i = i}; }
static inline tv tv_float(double f) { return (tv){.kind = TV_FLOAT, .u.f = f}; }

/* ---- the render state ---------------------------------------------------- */
typedef struct tpl_frame tpl_frame;
struct tpl_frame {
    tpl_frame *parent;
    tv_dict vars;
};

/* Text being built: the output, or a capture (set block, macro body). */
typedef struct tpl_buf {
    char *data;
    size_t len, cap;
} tpl_buf;

typedef struct tpl_state {
    tpl_arena arena;
    jmp_buf fail;
    int status; /* RP_ERR or RP_TEMPLATE_RAISED once failed */
    char msg[512];
    int line; /* the line being run, for error messages */
    tpl_buf *out;
    int depth;
    long steps;
    int loop_ctl; /* S_BREAK or S_CONTINUE while unwinding to the loop, else 0 */
    int64_t now_s;
    tpl_frame *root;
} tpl_state;

/* Fails the render (or compile): formats the message, longjmps to st->fail. */
_Noreturn void tpl_fail(tpl_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* raise_exception(msg): the template's own message, kept verbatim. */
_Noreturn void tpl_raise(tpl_state *st, const char *msg);
/* Arena allocation that fails the render when the scratch limit is hit. */
void *tpl_alloc(tpl_state *st, size_t n);

/* value.c */
tv tv_str_new(tpl_state *st, const char *s, size_t len);
tv tv_cstr(tpl_state *st, const char *s);
tv tv_list_new(tpl_state *st, size_t cap);
void tv_list_push(tpl_state *st, tv_list *l, tv v);
tv tv_dict_new(tpl_state *st, size_t cap);
/* The value at key, or NULL. Keys compare as Python's do (1 == 1.0 == True). */
tv *tv_dict_find(const tv_dict *d, tv key);
tv *tv_dict_find_str(const tv_dict *d, const char *key);
void tv_dict_set(tpl_state *st, tv_dict *d, tv key, tv val);
int tv_truthy(tv v);
int tv_equal(tv a, tv b);
/* <0, 0, >0 as Python's < between a and b; fails on types that do not order. */
int tv_compare(tpl_state *st, tv a, tv b);
/* Python's type name as jinja2's messages write it: "dict object". */
const char *tv_owner_name(tv v);
const char *tv_type_name(tv v); /* "str", "int", "list"... */
/* Fails with jinja2's UndefinedError message for v. */
_Noreturn void tv_undef_fail(tpl_state *st, tv v);
tv tv_from_json(tpl_state *st, const json_t *j);

/* pystr.c: Python's str() and repr() of values, UTF-8 helpers. */
void tpl_buf_put(tpl_state *st, tpl_buf *b, const char *s, size_t n);
static inline void tpl_buf_puts(tpl_state *st, tpl_buf *b, const char *s);
void tpl_buf_putc(tpl_state *st, tpl_buf *b, char c);
void tpl_buf_printf(tpl_state *st, tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void tv_write_str(tpl_state *st, tpl_buf *b, tv v);  /* str(v) */
void tv_write_repr(tpl_state *st, tpl_buf *b, tv v); /* repr(v) */
tv tv_to_str(tpl_state *st, tv v);                   /* str(v) as a value */
tv tpl_buf_value(tpl_state *st, const tpl_buf *b);
/* Python's float repr: shortest text that reads back as x ("0.1", "1e+16"). */
void tpl_float_repr(double x, char out[32]);
size_t tpl_utf8_len(const char *s, size_t n); /* code points */
/* Decodes one code point at s[*i] (input is valid UTF-8), advancing *i. */
uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i);
int tpl_utf8_put(uint32_t c, char out[4]);
int tpl_py_isspace(uint32_t c);

static inline void tpl_buf_puts(tpl_state *st, tpl_buf *b, const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    tpl_buf_put(st, b, s, n);
}

/* ---- syntax tree (parser.c) --------------------------------------------- */
typedef enum tn_kind {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_BINOP, N_CONCAT, N_COMPARE, N_COND,
    /* statements */
    S_TEXT, S_PRINT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_BREAK, S_CONTINUE,
    S_BODY, /* a list of statements */
} tn_kind;

typedef enum tn_op {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
} tn_op;

/* One node type for everything, its fields used as each kind says:
 *  N_CONST value | N_NAME name | N_LIST/N_TUPLE items | N_DICT items (keys), items2 (values)
 *  N_GETATTR a.name | N_GETITEM a[b] | N_SLICE a[b:c:d] (NULL parts absent)
 *  N_CALL a(items, names=items2) | N_FILTER a|name(items, names=items2), a NULL in a filter block
 *  N_TEST a is [not: op=1] name(items) | N_NEG/N_POS/N_NOT a | N_AND/N_OR a b
 *  N_BINOP a op b | N_CONCAT a ~ b | N_COMPARE a (ops[i] items[i])... | N_COND b if a else c
 *  S_TEXT value | S_PRINT a | S_IF if a: b else c | S_FOR for target a in b if c: body d else e
 *  S_SET target a = b | S_SETBLOCK target a, filter b (N_FILTER chain on NULL), body d
 *  S_MACRO name(names = items2 defaults, NULL where none; nn params): body d
 *  S_CALLBLOCK call a, caller params names/items2, body d | S_FILTERBLOCK b filters body d
 *  S_BODY items */
struct tn {
    tn_kind kind;
    int line, op, n, n2, nn;
    tn *a, *b, *c, *d, *e;
    tn **items, **items2;
    const char **names;
    tn_op *ops;
    const char *name;
    int fid; /* N_FILTER / N_TEST: index in the filter / test table */
    tv value;
};

/* ---- lexer (lexer.c) ---------------------------------------------------- */
typedef enum tk_type {
    TK_DATA, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_VAR_BEGIN, TK_VAR_END, TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
    TK_EOF,
} tk_type;
typedef struct tk {
    tk_type type;
    int line;
    const char *text; /* TK_DATA, TK_NAME, TK_STRING (decoded), TK_OP: NUL-terminated */
    size_t len;
    int64_t i;
    double f;
} tk;
/* Splits normalized source into tokens (trim_blocks / lstrip_blocks /
 * whitespace control applied to the data tokens); fails via st. */
tk *tpl_lex(tpl_state *st, const char *src, size_t len, size_t *n_out);

/* parser.c */
tn *tpl_parse(tpl_state *st, const tk *toks, size_t n);

/* ---- evaluation (eval.c, exec.c) ---------------------------------------- */
tv tpl_eval(tpl_state *st, tpl_frame *f, const tn *e);
void tpl_exec_body(tpl_state *st, tpl_frame *f, const tn *body);
tv tpl_lookup(tpl_frame *f, const char *name);
void tpl_frame_set(tpl_state *st, tpl_frame *f, const char *name, tv v);
tpl_frame *tpl_frame_new(tpl_state *st, tpl_frame *parent);
/* jinja2's environment.getattr / getitem */
tv tpl_getattr(tpl_state *st, tv obj, const char *name);
tv tpl_getitem(tpl_state *st, tv obj, tv key);
/* Applies a filter chain (N_FILTER nodes whose innermost operand is NULL)
 * to input: a {% filter %} block or a {% set x | f %} block. */
tv tpl_eval_filters(tpl_state *st, tpl_frame *f, const tn *chain, tv input);
/* Calls a callable value with evaluated arguments. */
tv tpl_call(tpl_state *st, tv fn, tv *args, int n, const char **kwnames, tv *kwargs, int nkw);
/* Python's iteration: the items of a list/tuple, the keys of a dict, the
 * characters of a string; undefined is empty; anything else fails. */
tv_list *tpl_iterate(tpl_state *st, tv v);
tv tpl_binop(tpl_state *st, tn_op op, tv a, tv b);
void tpl_step(tpl_state *st);

/* filters.c, is_tests.c: tables searched at compile time (index into fid). */
int tpl_filter_find(const char *name, const char **why_not);
tv tpl_filter_apply(tpl_state *st, int fid, tv v, tv *args, int n, const char **kwnames, tv *kwargs, int nkw);
int tpl_test_find(const char *name);
int tpl_test_apply(tpl_state *st, int tid, tv v, tv *args, int n);
/* Call-site argument binding shared by filters, methods and globals:
 * fills out[i] from positional args then from keyword params[i]; missing
 * ones stay undefined (kind TV_UNDEF with undef_name NULL = "not given"). */
void tpl_bind_args(tpl_state *st, const char *what, const char *const *params, int np, tv *out, tv *args, int n,
                   const char **kwnames, tv *kwargs, int nkw);
static inline int tv_given(tv v) { return !(v.kind == TV_UNDEF && !v.undef_name && !v.undef_owner); }

/* methods.c */
tv tpl_method_get(tpl_state *st, tv obj, const char *name, int *found);
tv tpl_method_call(tpl_state *st, tv self, const char *name, tv *args, int n, const char **kwnames, tv *kwargs,
                   int nkw);

/* tojson.c: json.dumps(v, ensure_ascii, indent, separators, sort_keys) */
typedef struct tpl_json_opts {
    int ensure_ascii, sort_keys;
    const char *indent; /* NULL: no indent */
    const char *item_sep, *key_sep;
} tpl_json_opts;
void tpl_tojson(tpl_state *st, tpl_buf *b, tv v, const tpl_json_opts *o);

/* str helpers shared by filters and methods (methods.c) */
tv tpl_str_strip(tpl_state *st, tv s, tv chars, int left, int right);
tv tpl_str_replace(tpl_state *st, tv s, tv old, tv new_, int64_t count);
tv tpl_str_case(tpl_state *st, tv s, int mode); /* 0 lower, 1 upper, 2 capitalize, 3 title */
tv tpl_str_split(tpl_state *st, tv s, tv sep, int64_t maxsplit);
int tpl_str_startswith(tpl_state *st, tv s, tv prefix, int end);

static inline const char *tv_cs(tv v) { return v.u.s->data; }
static inline int tv_is_num(tv v) { return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL; }

#endif
