/* The module's entry points: compile (normalize the source as jinja2 does,
 * lex, parse, all into the template's arena) and render (the globals, the
 * caller's variables converted from JSON, the body run into a buffer, all
 * in a render arena freed at the end). Errors unwind by longjmp to here;
 * see tpl_internal.h for why that is safe. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

struct rp_template {
    tpl_arena arena;
    tn *body;
};

_Noreturn void tpl_fail(tpl_state *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->status = RP_ERR;
    longjmp(st->fail, 1);
}

_Noreturn void tpl_raise(tpl_state *st, const char *msg) {
    snprintf(st->msg, sizeof st->msg, "%s", msg);
    st->status = RP_TEMPLATE_RAISED;
    longjmp(st->fail, 1);
}

void *tpl_alloc(tpl_state *st, size_t n) {
    void *p = tpl_arena_alloc(&st->arena, n);
    if (!p) {
        if (st->arena.limit_bytes && st->arena.used_bytes + n > st->arena.limit_bytes)
            tpl_fail(st, "the template used more than %zu MiB of scratch memory", st->arena.limit_bytes >> 20);
        tpl_fail(st, "out of memory");
    }
    return p;
}

/* Checks that source is UTF-8 (Python decoded it); returns the bad offset or -1. */
static long bad_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        if (extra < 0 || (extra == 1 && c < 0xC2) || i + (size_t)extra >= n + (extra == 0)) return (long)i;
        uint32_t cp = extra ? c & (0x3Fu >> extra) : c;
        for (int k = 1; k <= extra; k++) {
            if ((u[i + (size_t)k] & 0xC0) != 0x80) return (long)i;
            cp = (cp << 6) | (u[i + (size_t)k] & 0x3F);
        }
        if ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return (long)i;
        i += (size_t)extra + 1;
    }
    return -1;
}

rp_template *rp_template_compile(const char *source, size_t len, rp_err *err) {
    rp_template *volatile t = calloc(1, sizeof *t);
    tpl_state *volatile st = calloc(1, sizeof *st);
    if (!t || !st) {
        free(t);
        free(st);
        rp_errf(err, "out of memory");
        return NULL;
    }
    /* the compile's allocations go to the template's arena */
    st->arena.limit_bytes = RP_TEMPLATE_MAX_SCRATCH_BYTES;
    if (setjmp(st->fail)) {
        rp_errf(err, "chat template %s", st->msg);
        tpl_arena_free(&st->arena);
        free(st);
        free(t);
        return NULL;
    }
    long bad = bad_utf8(source, len);
    if (bad >= 0) {
        int line = 1;
        for (long i = 0; i < bad; i++) line += source[i] == '\n';
        tpl_fail(st, "line %d: not valid UTF-8", line);
    }
    /* jinja2: \r\n and \r become \n, then one trailing newline goes
     * (keep_trailing_newline=False) */
    char *src = tpl_alloc(st, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n') i++;
        } else {
            src[n++] = source[i];
        }
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    size_t ntok;
    tk *toks = tpl_lex(st, src, n, &ntok);
    t->body = tpl_parse(st, toks, ntok);
    t->arena = st->arena;
    free(st);
    return t;
}

void rp_template_free(rp_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t);
}

static void set_global(tpl_state *st, const char *name, tpl_func_id id) {
    tv_func *fn = tpl_alloc(st, sizeof *fn);
    fn->id = id;
    fn->name = name;
    tpl_frame_set(st, st->root, name, (tv){.kind = TV_FUNC, .u.fn = fn});
}

int rp_template_render(const rp_template *t, const json_t *vars, int64_t now_s, char **out, size_t *out_len,
                       rp_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && !json_is_object(vars)) return rp_errf(err, "chat template variables must be a JSON object");
    tpl_state *volatile st = calloc(1, sizeof *st);
    if (!st) return rp_errf(err, "out of memory");
    st->arena.limit_bytes = RP_TEMPLATE_MAX_SCRATCH_BYTES;
    st->now_s = now_s;
    if (setjmp(st->fail)) {
        int status = st->status;
        if (status == RP_TEMPLATE_RAISED) rp_errf(err, "%s", st->msg);
        else rp_errf(err, "chat template line %d: %s", st->line, st->msg);
        tpl_arena_free(&st->arena);
        free(st);
        return status;
    }
    st->root = tpl_frame_new(st, NULL);
    /* the globals first: the caller's variables may shadow them, as
     * render(**kwargs) shadows environment globals */
    set_global(st, "range", F_RANGE);
    set_global(st, "namespace", F_NAMESPACE);
    set_global(st, "dict", F_DICT);
    set_global(st, "raise_exception", F_RAISE);
    set_global(st, "strftime_now", F_STRFTIME);
    if (vars) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)vars, k, v) tpl_frame_set(st, st->root, k, tv_from_json(st, v));
    }
    /* top-level statements run in a scope over the globals */
    tpl_frame *top = tpl_frame_new(st, st->root);
    tpl_buf b = {0};
    st->out = &b;
    st->line = 1;
    tpl_exec_body(st, top, t->body);
    char *text = malloc(b.len + 1);
    if (!text) tpl_fail(st, "out of memory");
    if (b.len) memcpy(text, b.data, b.len);
    text[b.len] = 0;
    *out = text;
    if (out_len) *out_len = b.len;
    tpl_arena_free(&st->arena);
    free(st);
    return RP_OK;
}
