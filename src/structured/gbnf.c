/* GBNF (llama.cpp's grammar syntax) -> grammar builder -> flat grammar.
 *
 *   root ::= "{" ws pair ("," ws pair)* "}"   # a comment
 *   pair ::= [a-z]+ ":" [0-9]{1,3} | "x"?
 *
 * Literals "..." (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH; other bytes
 * as written), classes [...] and [^...] over code points (ranges a-z),
 * `.` (any character), rule names [A-Za-z0-9_-]+, groups ( ), postfix
 * * + ? {m} {m,} {m,n}. A rule runs until the next `name ::=` or the end, so
 * alternatives may continue on following lines. Errors give line:col. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "structured/sgrammar.h"

typedef struct gp {
    const char *s;
    size_t n, i;
    size_t w_at; /* where() resumes from here ... */
    int w_line, w_col; /* ... at this line and column */
    sg_builder *b;
    rp_err *err;
    int cur_rule;
    int depth;
} gp;

/* line:col of offset at (1-based), scanning on from the last answer when
 * at is past it, so that a long grammar is not rescanned per rule. */
static void where(const gp *cp, size_t at, int *line, int *col) {
    gp *p = (gp *)cp;
    if (!p->w_line || at < p->w_at) p->w_at = 0, p->w_line = 1, p->w_col = 1;
    for (size_t k = p->w_at; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') p->w_line++, p->w_col = 1;
        else p->w_col++;
    }
    p->w_at = at;
    *line = p->w_line, *col = p->w_col;
}

#define GP_ERR(p, at, ...)                                                      \
    do {                                                                        \
        int l_, c_;                                                             \
        char m_[400];                                                           \
        where(p, at, &l_, &c_);                                                 \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                   \
        return rp_errf((p)->err, "grammar %d:%d: %s", l_, c_, m_);              \
    } while (0)

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void skip_space(gp *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else break;
    }
}

/* At a rule definition: name followed by ::= */
static int at_definition(gp *p) {
    size_t k = p->i;
    while (k < p->n && is_name_char(p->s[k])) k++;
    if (k == p->i) return 0;
    gp q = *p;
    q.i = k;
    skip_space(&q);
    return q.i + 3 <= q.n && !memcmp(q.s + q.i, "::=", 3);
}

static int hexdig(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 character of the text at p->i into *cp. */
static int decode_char(gp *p, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)p->s + p->i;
    size_t left = p->n - p->i;
    int len = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) GP_ERR(p, p->i, "invalid UTF-8 in the grammar text");
    uint32_t c = len == 1 ? u[0] : len == 2 ? u[0] & 31u : len == 3 ? u[0] & 15u : u[0] & 7u;
    for (int k = 1; k < len; k++) {
        if ((u[k] & 0xC0) != 0x80) GP_ERR(p, p->i, "invalid UTF-8 in the grammar text");
        c = c << 6 | (u[k] & 63u);
    }
    p->i += (size_t)len;
    *cp = c;
    return 0;
}

/* An escape after a backslash (p->i at the char after '\'). */
static int parse_escape(gp *p, uint32_t *cp) {
    if (p->i >= p->n) GP_ERR(p, p->i, "unfinished escape");
    char c = p->s[p->i++];
    int digits = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
            GP_ERR(p, p->i - 2, "unknown escape '\\%c'", c);
        *cp = (unsigned char)c;
        return 0;
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = p->i < p->n ? hexdig(p->s[p->i]) : -1;
        if (h < 0) GP_ERR(p, p->i, "'\\%c' needs %d hex digits", c, digits);
        v = v * 16 + (uint32_t)h;
        p->i++;
    }
    if (v > 0x10FFFF) GP_ERR(p, p->i, "code point U+%X is past U+10FFFF", v);
    *cp = v;
    return 0;
}

static int push_byte(gp *p, sg_ivec *out, unsigned byte) {
    sg_byteset s = {{0}};
    sg_set_add(&s, byte);
    int32_t e = sg_elem_set(p->b, &s, p->err);
    if (e < 0) return -1;
    if (sg_ivec_push(out, e)) return rp_errf(p->err, "out of memory");
    return 0;
}

static int push_cp(gp *p, sg_ivec *out, uint32_t cp) {
    unsigned char o[4];
    int n;
    if (cp < 0x80) o[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | (cp >> 6 & 63)),
        o[2] = (unsigned char)(0x80 | (cp & 63)), n = 3;
    else
        o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | (cp >> 12 & 63)),
        o[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), o[3] = (unsigned char)(0x80 | (cp & 63)), n = 4;
    for (int k = 0; k < n; k++)
        if (push_byte(p, out, o[k])) return -1;
    return 0;
}

static int parse_literal(gp *p, sg_ivec *out) {
    size_t start = p->i++;
    while (1) {
        if (p->i >= p->n) GP_ERR(p, start, "unterminated string literal");
        char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return 0;
        }
        if (c == '\\') {
            p->i++;
            uint32_t cp;
            if (parse_escape(p, &cp) || push_cp(p, out, cp)) return -1;
        } else {
            if (push_byte(p, out, (unsigned char)c)) return -1;
            p->i++;
        }
    }
}

static int class_char(gp *p, uint32_t *cp) {
    if (p->s[p->i] == '\\') {
        p->i++;
        return parse_escape(p, cp);
    }
    return decode_char(p, cp);
}

static int parse_class(gp *p, sg_ivec *out) {
    size_t start = p->i++;
    sg_ranges r = {0};
    int neg = 0;
    if (p->i < p->n && p->s[p->i] == '^') neg = 1, p->i++;
    while (1) {
        if (p->i >= p->n) {
            sg_ranges_free(&r);
            GP_ERR(p, start, "unterminated character class");
        }
        if (p->s[p->i] == ']') break;
        uint32_t lo, hi;
        if (class_char(p, &lo)) goto fail;
        hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (class_char(p, &hi)) goto fail;
            if (hi < lo) {
                sg_ranges_free(&r);
                GP_ERR(p, p->i - 1, "character range is out of order");
            }
        }
        if (sg_ranges_add(&r, lo, hi)) goto oom;
    }
    p->i++;
    if (neg && sg_ranges_negate(&r)) goto oom;
    int32_t e;
    int erc = sg_elem_ranges(p->b, &r, p->b->rules[p->cur_rule].name, &e, p->err);
    sg_ranges_free(&r);
    if (erc) {
        int l, c;
        where(p, start, &l, &c);
        return rp_err_wrap(p->err, "grammar %d:%d", l, c);
    }
    return sg_ivec_push(out, e) ? rp_errf(p->err, "out of memory") : 0;
oom:
    rp_errf(p->err, "out of memory");
fail:
    sg_ranges_free(&r);
    return -1;
}

static int parse_alternates(gp *p, int rule);

/* A new rule holding the sequence `seq` as its only alternative. */
static int32_t wrap(gp *p, const sg_ivec *seq) {
    int r = sg_rule_aux(p->b, p->b->rules[p->cur_rule].name, p->err);
    if (r < 0 || sg_add_alt(p->b, r, seq->v, seq->n, p->err)) return 0;
    return SG_REF(r);
}

/* X repeated min..max times (max < 0: unbounded), appended to out. Short
 * counts are spelled out; long ones are one counted element. */
static int repeat(gp *p, int32_t x, long min, long max, sg_ivec *out) {
    if (min > 4 || max > 4) {
        int body;
        if (SG_IS_REF(x)) body = SG_REF_RULE(x);
        else {
            body = sg_rule_aux(p->b, p->b->rules[p->cur_rule].name, p->err);
            if (body < 0 || sg_add_alt(p->b, body, &x, 1, p->err)) return -1;
        }
        int32_t e = sg_elem_rep(p->b, body, (int32_t)min, (int32_t)max, p->err);
        if (e < 0) return -1;
        p->b->total_elems += 2;
        return sg_ivec_push(out, e) ? rp_errf(p->err, "out of memory") : 0;
    }
    for (long k = 0; k < min; k++)
        if (sg_ivec_push(out, x)) return rp_errf(p->err, "out of memory");
    p->b->total_elems += min;
    if (p->b->total_elems > p->b->max_elems)
        return rp_errf(p->err, "grammar too large: more than %ld elements (max_elements)", p->b->max_elems);
    const char *base = p->b->rules[p->cur_rule].name;
    if (max < 0) { /* R ::= x R | "" */
        int r = sg_rule_aux(p->b, base, p->err);
        if (r < 0) return -1;
        int32_t alt[2] = {x, SG_REF(r)};
        if (sg_add_alt(p->b, r, alt, 2, p->err) || sg_add_alt(p->b, r, NULL, 0, p->err)) return -1;
        return sg_ivec_push(out, SG_REF(r)) ? rp_errf(p->err, "out of memory") : 0;
    }
    int32_t next = 0;
    int have_next = 0;
    for (long k = max - min; k >= 1; k--) { /* O_k ::= x O_{k+1} | "" */
        int r = sg_rule_aux(p->b, base, p->err);
        if (r < 0) return -1;
        int32_t alt[2] = {x, next};
        if (sg_add_alt(p->b, r, alt, have_next ? 2 : 1, p->err) || sg_add_alt(p->b, r, NULL, 0, p->err)) return -1;
        next = SG_REF(r);
        have_next = 1;
    }
    if (have_next && sg_ivec_push(out, next)) return rp_errf(p->err, "out of memory");
    return 0;
}

static int parse_count(gp *p, long *v) {
    size_t start = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > 1000000) GP_ERR(p, start, "repetition count too large");
    }
    if (p->i == start) GP_ERR(p, start, "expected a number in {m,n}");
    *v = x;
    return 0;
}

static int parse_sequence(gp *p, sg_ivec *seq) {
    while (1) {
        skip_space(p);
        if (p->i >= p->n) return 0;
        char c = p->s[p->i];
        if (c == '|' || c == ')') return 0;
        sg_ivec atom = {0};
        size_t at = p->i;
        int rc = 0;
        if (c == '"') rc = parse_literal(p, &atom);
        else if (c == '[') rc = parse_class(p, &atom);
        else if (c == '.') {
            p->i++;
            sg_ranges r = {0};
            if (sg_ranges_add(&r, 0, 0x10FFFF)) rc = rp_errf(p->err, "out of memory");
            int32_t e = 0;
            if (!rc) rc = sg_elem_ranges(p->b, &r, p->b->rules[p->cur_rule].name, &e, p->err);
            sg_ranges_free(&r);
            if (!rc && sg_ivec_push(&atom, e)) rc = rp_errf(p->err, "out of memory");
        } else if (c == '(') {
            if (++p->depth > 200) GP_ERR(p, at, "groups nested too deeply");
            p->i++;
            int saved = p->cur_rule;
            int r = sg_rule_aux(p->b, p->b->rules[p->cur_rule].name, p->err);
            if (r < 0) return -1;
            rc = parse_alternates(p, r);
            p->cur_rule = saved;
            p->depth--;
            if (!rc) {
                skip_space(p);
                if (p->i >= p->n || p->s[p->i] != ')') GP_ERR(p, at, "unclosed '('");
                p->i++;
                if (sg_ivec_push(&atom, SG_REF(r))) rc = rp_errf(p->err, "out of memory");
            }
        } else if (is_name_char(c)) {
            if (at_definition(p)) return 0; /* the next rule starts */
            size_t k = p->i;
            while (k < p->n && is_name_char(p->s[k])) k++;
            int r = sg_rule_named(p->b, p->s + p->i, k - p->i, p->err);
            if (r < 0) return -1;
            if (!p->b->rules[r].line) where(p, p->i, &p->b->rules[r].line, &p->b->rules[r].col);
            p->i = k;
            if (sg_ivec_push(&atom, SG_REF(r))) rc = rp_errf(p->err, "out of memory");
        } else {
            GP_ERR(p, at, "unexpected '%c'", c);
        }
        if (rc) {
            free(atom.v);
            return -1;
        }
        /* postfix */
        char q = p->i < p->n ? p->s[p->i] : 0;
        long min = -1, max = -1;
        if (q == '*') min = 0, max = -1, p->i++;
        else if (q == '+') min = 1, max = -1, p->i++;
        else if (q == '?') min = 0, max = 1, p->i++;
        else if (q == '{') {
            size_t qa = p->i++;
            skip_space(p);
            if (parse_count(p, &min)) goto fail_atom;
            skip_space(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip_space(p);
                if (p->i < p->n && p->s[p->i] == '}') max = -1;
                else if (parse_count(p, &max)) goto fail_atom;
                skip_space(p);
            } else max = min;
            if (p->i >= p->n || p->s[p->i] != '}') {
                free(atom.v);
                GP_ERR(p, qa, "expected '}' to close the repetition");
            }
            p->i++;
            if (max >= 0 && max < min) {
                free(atom.v);
                GP_ERR(p, qa, "repetition {%ld,%ld} has max < min", min, max);
            }
        }
        if (min < 0) {
            for (int k = 0; k < atom.n; k++)
                if (sg_ivec_push(seq, atom.v[k])) rc = rp_errf(p->err, "out of memory");
        } else {
            int32_t x = atom.n == 1 ? atom.v[0] : wrap(p, &atom);
            if (atom.n != 1 && !x) rc = -1; /* wrap failed (it never returns a set element) */
            else rc = repeat(p, x, min, max, seq);
        }
        free(atom.v);
        if (rc) return -1;
        continue;
    fail_atom:
        free(atom.v);
        return -1;
    }
}

static int parse_alternates(gp *p, int rule) {
    p->cur_rule = rule;
    while (1) {
        sg_ivec seq = {0};
        if (parse_sequence(p, &seq)) {
            free(seq.v);
            return -1;
        }
        int rc = sg_add_alt(p->b, rule, seq.v, seq.n, p->err);
        free(seq.v);
        if (rc) return -1;
        skip_space(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        return 0;
    }
}

sg_grammar *sg_parse_gbnf(const char *text, size_t len, long max_elems, rp_err *err) {
    sg_builder b;
    sg_builder_init(&b, max_elems);
    gp p = {.s = text, .n = len, .b = &b, .err = err};
    if (err) err->msg[0] = 0;
    skip_space(&p);
    if (p.i >= p.n) {
        rp_errf(err, "the grammar is empty (it needs a rule named root)");
        goto fail;
    }
    while (p.i < p.n) {
        size_t at = p.i;
        size_t k = p.i;
        while (k < p.n && is_name_char(p.s[k])) k++;
        if (k == p.i || !at_definition(&p)) {
            int l, c;
            where(&p, at, &l, &c);
            rp_errf(err, "grammar %d:%d: expected a rule definition 'name ::= ...'", l, c);
            goto fail;
        }
        int r = sg_rule_named(&b, p.s + p.i, k - p.i, err);
        if (r < 0) goto fail;
        if (b.rules[r].defined && b.rules[r].n_alts >= 0 && b.rules[r].defined == 2) {
            int l, c;
            where(&p, at, &l, &c);
            rp_errf(err, "grammar %d:%d: rule '%s' is defined twice", l, c, b.rules[r].name);
            goto fail;
        }
        b.rules[r].defined = 2;
        where(&p, at, &b.rules[r].line, &b.rules[r].col);
        p.i = k;
        skip_space(&p);
        p.i += 3; /* ::= */
        if (parse_alternates(&p, r)) goto fail;
        skip_space(&p);
        if (p.i < p.n && p.s[p.i] == ')') {
            int l, c;
            where(&p, p.i, &l, &c);
            rp_errf(err, "grammar %d:%d: unmatched ')'", l, c);
            goto fail;
        }
    }
    return sg_grammar_finish(&b, "root", err);
fail:
    sg_builder_free(&b);
    return NULL;
}
