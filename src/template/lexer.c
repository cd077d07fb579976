/* Template source -> tokens, with jinja2's whitespace rules as transformers
 * configures them:
 *  - trim_blocks: the first newline after a block tag (%}) or a comment (#})
 *    is dropped;
 *  - lstrip_blocks: spaces and tabs from the start of a line up to a block
 *    tag or comment are dropped ({%+ keeps them); {{ is not affected;
 *  - a '-' inside a delimiter ({%-, -%}, {{-, -}}, {#-, -#}) strips all
 *    whitespace (newlines included) on that side.
 * The source reaching here has its newlines normalized and one trailing
 * newline removed (keep_trailing_newline=False), as jinja2 does first.
 * Inside tags: names, strings (Python escapes decoded), numbers, operators;
 * an end delimiter counts only outside brackets ("{{ {'a': 1}}}"). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

typedef struct lexer {
    tpl_state *st;
    const char *s;
    size_t n, pos;
    int line;
    tk *toks;
    size_t nt, cap;
} lexer;

static void emit(lexer *L, tk t) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        tk *nt = tpl_alloc(L->st, cap * sizeof *nt);
        if (L->nt) memcpy(nt, L->toks, L->nt * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->nt++] = t;
}

static int count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Where the next tag starts ("{{", "{%", "{#"), or n. */
static size_t next_tag(const char *s, size_t n, size_t from) {
    for (size_t i = from; i + 1 < n; i++)
        if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) return i;
    return n;
}

static void emit_data(lexer *L, const char *p, size_t len, int line) {
    if (len) emit(L, (tk){.type = TK_DATA, .line = line, .text = p, .len = len});
}

/* After an end delimiter: '-' strips all following whitespace; a block or
 * comment end drops one newline (trim_blocks). Returns whether what it
 * consumed ended with a newline (jinja2's line_starting). */
static int after_end(lexer *L, int minus, int trim_newline) {
    int ended_nl = 0;
    if (minus) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            ended_nl = L->s[L->pos] == '\n';
            L->line += L->s[L->pos] == '\n';
            L->pos++;
        }
    } else if (trim_newline && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
        L->line++;
        ended_nl = 1;
    }
    return ended_nl;
}

static uint32_t hexval(lexer *L, const char *p, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        char c = p[i];
        if (!isxdigit((unsigned char)c)) tpl_fail(L->st, "line %d: bad \\x, \\u or \\U escape in a string", L->line);
        v = v * 16 + (uint32_t)(isdigit((unsigned char)c) ? c - '0' : (tolower((unsigned char)c) - 'a' + 10));
    }
    return v;
}

/* A string literal at L->pos (quote included); decodes Python's escapes. */
static void lex_string(lexer *L) {
    char q = L->s[L->pos];
    int line = L->line;
    size_t i = L->pos + 1;
    tpl_buf b = {0};
    for (;;) {
        if (i >= L->n) tpl_fail(L->st, "line %d: unterminated string", line);
        char c = L->s[i];
        if (c == q) break;
        if (c == '\n') L->line++;
        if (c != '\\') {
            tpl_buf_putc(L->st, &b, c);
            i++;
            continue;
        }
        if (i + 1 >= L->n) tpl_fail(L->st, "line %d: unterminated string", line);
        char e = L->s[i + 1];
        i += 2;
        uint32_t cp;
        char u[4];
        switch (e) {
        case '\n': L->line++; continue; /* a line continuation */
        case '\\': tpl_buf_putc(L->st, &b, '\\'); continue;
        case '\'': tpl_buf_putc(L->st, &b, '\''); continue;
        case '"': tpl_buf_putc(L->st, &b, '"'); continue;
        case 'a': tpl_buf_putc(L->st, &b, '\a'); continue;
        case 'b': tpl_buf_putc(L->st, &b, '\b'); continue;
        case 'f': tpl_buf_putc(L->st, &b, '\f'); continue;
        case 'n': tpl_buf_putc(L->st, &b, '\n'); continue;
        case 'r': tpl_buf_putc(L->st, &b, '\r'); continue;
        case 't': tpl_buf_putc(L->st, &b, '\t'); continue;
        case 'v': tpl_buf_putc(L->st, &b, '\v'); continue;
        case 'x':
            if (i + 2 > L->n) tpl_fail(L->st, "line %d: bad \\x escape", line);
            cp = hexval(L, L->s + i, 2);
            i += 2;
            break;
        case 'u':
        case 'U': {
            int d = e == 'u' ? 4 : 8;
            if (i + (size_t)d > L->n) tpl_fail(L->st, "line %d: bad \\%c escape", line, e);
            cp = hexval(L, L->s + i, d);
            i += (size_t)d;
            break;
        }
        case 'N': tpl_fail(L->st, "line %d: \\N{...} escapes are not supported", line);
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < L->n && L->s[i] >= '0' && L->s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(L->s[i++] - '0');
                break;
            }
            /* Python keeps an unknown escape as written */
            tpl_buf_putc(L->st, &b, '\\');
            i--;
            continue;
        }
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            tpl_fail(L->st, "line %d: escape \\%c for an invalid code point", line, e);
        tpl_buf_put(L->st, &b, u, (size_t)tpl_utf8_put(cp, u));
    }
    emit(L, (tk){.type = TK_STRING, .line = line, .text = b.data ? b.data : "", .len = b.len});
    L->pos = i + 1;
}

static int digit_run(const char *s, size_t n, size_t i, size_t *end, int (*ok)(int)) {
    /* digits with single underscores between them, as Python allows */
    size_t j = i;
    *end = i; /* no digits: the run is empty */
    if (j >= n || !ok((unsigned char)s[j])) return 0;
    while (j < n && (ok((unsigned char)s[j]) || (s[j] == '_' && j + 1 < n && ok((unsigned char)s[j + 1])))) j++;
    *end = j;
    return 1;
}

static void lex_number(lexer *L, int after_dot) {
    const char *s = L->s;
    size_t i = L->pos, end;
    char buf[128];
    size_t bl = 0;
    if (s[i] == '0' && i + 1 < L->n && strchr("bBoOxX", s[i + 1]) && !after_dot) {
        int base = strchr("bB", s[i + 1]) ? 2 : strchr("oO", s[i + 1]) ? 8 : 16;
        size_t j = i + 2;
        if (j < L->n && s[j] == '_') j++;
        if (!digit_run(s, L->n, j, &end, isxdigit)) tpl_fail(L->st, "line %d: bad number literal", L->line);
        for (size_t k = j; k < end && bl < sizeof buf - 1; k++)
            if (s[k] != '_') buf[bl++] = s[k];
        buf[bl] = 0;
        char *e;
        long long v = strtoll(buf, &e, base);
        if (*e) tpl_fail(L->st, "line %d: bad number literal", L->line);
        emit(L, (tk){.type = TK_INT, .line = L->line, .i = v});
        L->pos = end;
        return;
    }
    digit_run(s, L->n, i, &end, isdigit);
    int is_float = 0;
    size_t j = end;
    if (!after_dot && j + 1 < L->n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
        digit_run(s, L->n, j + 1, &j, isdigit);
        is_float = 1;
    }
    if (!after_dot && j < L->n && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < L->n && (s[k] == '+' || s[k] == '-')) k++;
        size_t e2;
        if (digit_run(s, L->n, k, &e2, isdigit)) {
            j = e2;
            is_float = 1;
        }
    }
    for (size_t k = i; k < j; k++) {
        if (bl >= sizeof buf - 1) tpl_fail(L->st, "line %d: number literal too long", L->line);
        if (s[k] != '_') buf[bl++] = s[k];
    }
    buf[bl] = 0;
    if (is_float) {
        emit(L, (tk){.type = TK_FLOAT, .line = L->line, .f = strtod(buf, NULL)});
    } else {
        char *e;
        errno = 0;
        long long v = strtoll(buf, &e, 10);
        if (errno) tpl_fail(L->st, "line %d: integer literal %s is too large", L->line, buf);
        emit(L, (tk){.type = TK_INT, .line = L->line, .i = v});
    }
    L->pos = j;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                  "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}", ";"};

/* Lexes inside a tag until its end delimiter; returns whether the end
 * consumed a newline. */
static int lex_tag(lexer *L, tk_type begin, int tag_line) {
    const char close = begin == TK_BLOCK_BEGIN ? '%' : '}';
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
        if (L->pos >= L->n)
            tpl_fail(L->st, "line %d: unexpected end of template, the tag opened here is not closed", tag_line);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            int minus = p[0] == '-' && left >= 3 && p[1] == close && p[2] == '}';
            if (minus || (left >= 2 && p[0] == close && p[1] == '}')) {
                emit(L, (tk){.type = begin == TK_BLOCK_BEGIN ? TK_BLOCK_END : TK_VAR_END, .line = L->line});
                L->pos += minus ? 3 : 2;
                return after_end(L, minus, begin == TK_BLOCK_BEGIN);
            }
        }
        unsigned char c = (unsigned char)p[0];
        if (isalpha(c) || c == '_') {
            size_t j = 1;
            while (j < left && (isalnum((unsigned char)p[j]) || p[j] == '_')) j++;
            char *name = tpl_alloc(L->st, j + 1);
            memcpy(name, p, j);
            emit(L, (tk){.type = TK_NAME, .line = L->line, .text = name, .len = j});
            L->pos += j;
            continue;
        }
        if (c == '\'' || c == '"') {
            lex_string(L);
            continue;
        }
        if (isdigit(c)) {
            int after_dot = L->nt && L->toks[L->nt - 1].type == TK_OP && !strcmp(L->toks[L->nt - 1].text, ".");
            lex_number(L, after_dot);
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
            size_t ol = strlen(OPS[k]);
            if (left >= ol && !memcmp(p, OPS[k], ol)) break;
        }
        if (k == sizeof OPS / sizeof OPS[0]) tpl_fail(L->st, "line %d: unexpected character '%c'", L->line, c);
        const char *op = OPS[k];
        if (strchr("([{", op[0])) depth++;
        if (strchr(")]}", op[0]) && depth > 0) depth--;
        emit(L, (tk){.type = TK_OP, .line = L->line, .text = op, .len = strlen(op)});
        L->pos += strlen(op);
    }
}

/* "{% raw %}" at the tag start (after "{%" and its sign)? Sets *body_at. */
static int raw_begin(lexer *L, size_t i, size_t *body_at, int *minus_end) {
    while (i < L->n && is_ws(L->s[i])) i++;
    if (L->n - i < 3 || memcmp(L->s + i, "raw", 3)) return 0;
    i += 3;
    if (i < L->n && (isalnum((unsigned char)L->s[i]) || L->s[i] == '_')) return 0;
    while (i < L->n && is_ws(L->s[i])) i++;
    *minus_end = i < L->n && L->s[i] == '-';
    if (*minus_end) i++;
    if (L->n - i < 2 || memcmp(L->s + i, "%}", 2)) return 0;
    *body_at = i + 2;
    return 1;
}

static void lex_raw(lexer *L, size_t body_at, int minus_end, int line) {
    L->line += count_lines(L->s + L->pos, body_at - L->pos);
    L->pos = body_at;
    if (minus_end) after_end(L, 1, 0);
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        size_t j = i + 2;
        int minus_begin = j < L->n && L->s[j] == '-';
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+')) j++;
        while (j < L->n && is_ws(L->s[j])) j++;
        if (L->n - j < 6 || memcmp(L->s + j, "endraw", 6)) continue;
        j += 6;
        while (j < L->n && is_ws(L->s[j])) j++;
        int minus = j < L->n && L->s[j] == '-';
        if (minus) j++;
        if (L->n - j < 2 || memcmp(L->s + j, "%}", 2)) continue;
        size_t end = i;
        if (minus_begin) {
            while (end > L->pos && is_ws(L->s[end - 1])) end--;
        } else if (L->s[i + 2] != '+') {
            /* lstrip_blocks applies before {% endraw %} too */
            size_t k = end;
            while (k > L->pos && (L->s[k - 1] == ' ' || L->s[k - 1] == '\t')) k--;
            if (k > L->pos && L->s[k - 1] == '\n') end = k;
        }
        emit_data(L, L->s + L->pos, end - L->pos, L->line);
        L->line += count_lines(L->s + L->pos, j + 2 - L->pos);
        L->pos = j + 2;
        after_end(L, minus, 1);
        return;
    }
    tpl_fail(L->st, "line %d: {%% raw %%} without {%% endraw %%}", line);
}

tk *tpl_lex(tpl_state *st, const char *src, size_t len, size_t *n_out) {
    lexer L = {.st = st, .s = src, .n = len, .line = 1};
    int line_starting = 1;
    while (L.pos < L.n) {
        size_t t = next_tag(L.s, L.n, L.pos);
        const char *text = L.s + L.pos;
        size_t tl = t - L.pos;
        int text_line = L.line;
        if (t == L.n) {
            emit_data(&L, text, tl, text_line);
            break;
        }
        char kind = L.s[t + 1], sign = t + 2 < L.n ? L.s[t + 2] : 0;
        size_t keep = tl;
        if (sign == '-') {
            while (keep > 0 && is_ws(text[keep - 1])) keep--;
        } else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: only spaces and tabs between the line start and the tag */
            size_t l_pos = tl;
            while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
            if (l_pos > 0 || line_starting) {
                size_t k = l_pos;
                while (k < tl && (text[k] == ' ' || text[k] == '\t')) k++;
                if (k == tl) keep = l_pos;
            }
        }
        emit_data(&L, text, keep, text_line);
        L.line += count_lines(text, tl);
        int tag_line = L.line;
        L.pos = t + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            size_t i = L.pos;
            for (; i + 1 < L.n; i++)
                if (L.s[i] == '#' && L.s[i + 1] == '}') break;
            if (i + 1 >= L.n) tpl_fail(st, "line %d: comment not closed", tag_line);
            int minus = i > L.pos && L.s[i - 1] == '-';
            L.line += count_lines(L.s + L.pos, i - L.pos);
            L.pos = i + 2;
            line_starting = after_end(&L, minus, 1);
            continue;
        }
        size_t body_at;
        int minus_end;
        if (kind == '%' && raw_begin(&L, L.pos, &body_at, &minus_end)) {
            lex_raw(&L, body_at, minus_end, tag_line);
            line_starting = L.pos > 0 && L.s[L.pos - 1] == '\n';
            continue;
        }
        tk_type begin = kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN;
        emit(&L, (tk){.type = begin, .line = tag_line});
        line_starting = lex_tag(&L, begin, tag_line);
    }
    emit(&L, (tk){.type = TK_EOF, .line = L.line});
    *n_out = L.nt;
    return L.toks;
}
