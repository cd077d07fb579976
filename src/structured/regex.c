/* Regular expressions -> a GBNF expression (sgrammar.h's sg_regex_to_gbnf).
 *
 * Supported: literals, escapes (\n \t \r \f \v \0 \xHH \uHHHH, escaped
 * punctuation), classes [...] [^...] with ranges and \d \w \s inside,
 * \d \D \w \W \s \S, `.` (any character but newline), groups ( ),
 * (?: ), (?P<name> ), (?<name> ), alternation |, quantifiers * + ? {m}
 * {m,} {m,n} (lazy forms accepted: the language is the same), ^ at the start
 * and $ at the end. Refused, by name: backreferences, lookahead and
 * lookbehind, word boundaries, inline flags, possessive quantifiers, \p
 * classes, anchors elsewhere.
 *
 * json_string mode (a schema's "pattern"): the expression matches the JSON
 * text of the string's content, so `"` and `\` and control characters are
 * matched in their escaped forms, and a pattern is a search (an unanchored
 * side may hold any characters), as JSON Schema defines it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "structured/sgrammar.h"

typedef struct rx {
    const char *s;
    size_t n, i;
    int json;
    int depth;
    sg_str *out;
    rp_err *err;
} rx;

#define RX_ERR(r, ...)                                                               \
    do {                                                                             \
        char m_[300];                                                                \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                        \
        return rp_errf((r)->err, "regex at offset %zu: %s", (r)->i, m_);             \
    } while (0)

static int rx_char(rx *r, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)r->s + r->i;
    size_t left = r->n - r->i;
    int len = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) RX_ERR(r, "invalid UTF-8");
    uint32_t c = len == 1 ? u[0] : len == 2 ? u[0] & 31u : len == 3 ? u[0] & 15u : u[0] & 7u;
    for (int k = 1; k < len; k++) {
        if ((u[k] & 0xC0) != 0x80) RX_ERR(r, "invalid UTF-8");
        c = c << 6 | (u[k] & 63u);
    }
    r->i += (size_t)len;
    *cp = c;
    return 0;
}

static void add_digit(sg_ranges *s) { sg_ranges_add(s, '0', '9'); }
static void add_word(sg_ranges *s) {
    sg_ranges_add(s, '0', '9'), sg_ranges_add(s, 'A', 'Z'), sg_ranges_add(s, 'a', 'z'), sg_ranges_add(s, '_', '_');
}
static void add_space(sg_ranges *s) { sg_ranges_add(s, '\t', '\r'), sg_ranges_add(s, ' ', ' '); }

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* After a backslash: a class shorthand adds to *set (returns 1), a single
 * character goes to *cp (returns 0); -1 on error. */
static int rx_escape(rx *r, sg_ranges *set, uint32_t *cp) {
    if (r->i >= r->n) RX_ERR(r, "trailing backslash");
    char c = r->s[r->i++];
    sg_ranges tmp = {0};
    switch (c) {
    case 'd': add_digit(set); return 1;
    case 'w': add_word(set); return 1;
    case 's': add_space(set); return 1;
    case 'D': case 'W': case 'S':
        if (c == 'D') add_digit(&tmp);
        else if (c == 'W') add_word(&tmp);
        else add_space(&tmp);
        if (sg_ranges_negate(&tmp)) return rp_errf(r->err, "out of memory");
        for (int k = 0; k < tmp.n; k++) sg_ranges_add(set, tmp.r[k][0], tmp.r[k][1]);
        sg_ranges_free(&tmp);
        return 1;
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': case 'u': {
        int nd = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = r->i < r->n ? hexv(r->s[r->i]) : -1;
            if (h < 0) RX_ERR(r, "\\%c needs %d hex digits", c, nd);
            v = v * 16 + (uint32_t)h;
            r->i++;
        }
        *cp = v;
        return 0;
    }
    case 'b': case 'B': RX_ERR(r, "word boundaries (\\%c) are not supported", c);
    case 'A': case 'Z': case 'z': case 'G': RX_ERR(r, "anchor \\%c is not supported", c);
    case 'p': case 'P': RX_ERR(r, "Unicode property classes (\\%c) are not supported", c);
    case 'k': RX_ERR(r, "backreferences are not supported");
    default:
        if (c >= '1' && c <= '9') RX_ERR(r, "backreferences (\\%c) are not supported", c);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) RX_ERR(r, "unknown escape \\%c", c);
        *cp = (unsigned char)c;
        return 0;
    }
}

static void emit_cp(sg_str *o, uint32_t c) {
    if (c >= 0x20 && c < 0x7F && c != ']' && c != '\\' && c != '^' && c != '-' && c != '[' && c != '"') {
        char ch = (char)c;
        sg_str_catn(o, &ch, 1);
    } else if (c < 0x10000) sg_str_printf(o, "\\u%04X", c);
    else sg_str_printf(o, "\\U%08X", c);
}

/* A set of characters as one GBNF element. */
static int emit_set(rx *r, sg_ranges *set) {
    sg_ranges_norm(set);
    sg_ranges safe = {0};
    const char *esc[40];
    int n_esc = 0;
    char uesc[32][8];
    for (int k = 0; k < set->n; k++) {
        uint32_t lo = set->r[k][0], hi = set->r[k][1];
        if (!r->json) {
            sg_ranges_add(&safe, lo, hi);
            continue;
        }
        for (uint32_t c = lo; c <= hi && c < 0x20; c++) {
            switch (c) {
            case '\n': esc[n_esc++] = "\"\\\\n\""; break;
            case '\t': esc[n_esc++] = "\"\\\\t\""; break;
            case '\r': esc[n_esc++] = "\"\\\\r\""; break;
            case '\b': esc[n_esc++] = "\"\\\\b\""; break;
            case '\f': esc[n_esc++] = "\"\\\\f\""; break;
            default:
                snprintf(uesc[c], sizeof uesc[c], "%04x", c);
                esc[n_esc++] = uesc[c];
            }
        }
        if (lo <= '"' && hi >= '"') esc[n_esc++] = "\"\\\\\\\"\"";
        if (lo <= '\\' && hi >= '\\') esc[n_esc++] = "\"\\\\\\\\\"";
        uint32_t a = lo < 0x20 ? 0x20 : lo;
        /* cut '"' and '\\' out of [a, hi] */
        uint32_t cuts[2] = {'"', '\\'};
        for (int q = 0; q < 2 && a <= hi; q++) {
            if (a <= cuts[q] && hi >= cuts[q]) {
                if (a < cuts[q]) sg_ranges_add(&safe, a, cuts[q] - 1);
                a = cuts[q] + 1;
            }
        }
        if (a <= hi) sg_ranges_add(&safe, a, hi);
    }
    if (!safe.n && !n_esc) {
        sg_ranges_free(&safe);
        RX_ERR(r, "a character class matches no character");
    }
    sg_str *o = r->out;
    int group = n_esc + (safe.n ? 1 : 0) > 1;
    if (group) sg_str_cat(o, "(");
    if (safe.n) {
        sg_str_cat(o, "[");
        for (int k = 0; k < safe.n; k++) {
            emit_cp(o, safe.r[k][0]);
            if (safe.r[k][1] != safe.r[k][0]) {
                sg_str_cat(o, "-");
                emit_cp(o, safe.r[k][1]);
            }
        }
        sg_str_cat(o, "]");
    }
    for (int k = 0; k < n_esc; k++) {
        if (safe.n || k) sg_str_cat(o, " | ");
        if (esc[k][0] == '"') sg_str_cat(o, esc[k]);
        else sg_str_printf(o, "\"\\\\u%s\"", esc[k]);
    }
    if (group) sg_str_cat(o, ")");
    sg_ranges_free(&safe);
    return 0;
}

static int rx_class(rx *r) {
    r->i++; /* [ */
    sg_ranges set = {0};
    int neg = 0, first = 1;
    if (r->i < r->n && r->s[r->i] == '^') neg = 1, r->i++;
    while (1) {
        if (r->i >= r->n) {
            sg_ranges_free(&set);
            RX_ERR(r, "unterminated character class");
        }
        if (r->s[r->i] == ']' && !first) break;
        first = 0;
        uint32_t lo, hi;
        int kind = 0;
        if (r->s[r->i] == '\\') {
            r->i++;
            kind = rx_escape(r, &set, &lo);
        } else if (r->s[r->i] == '[' && r->i + 1 < r->n && r->s[r->i + 1] == ':') {
            sg_ranges_free(&set);
            RX_ERR(r, "POSIX classes [:name:] are not supported");
        } else kind = rx_char(r, &lo);
        if (kind < 0) {
            sg_ranges_free(&set);
            return -1;
        }
        if (kind == 1) continue;
        hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            sg_ranges dummy = {0};
            if (r->s[r->i] == '\\') kind = rx_escape(r, &dummy, &hi);
            else kind = rx_char(r, &hi);
            sg_ranges_free(&dummy);
            if (kind != 0) {
                sg_ranges_free(&set);
                if (kind == 1) RX_ERR(r, "a class shorthand cannot end a range");
                return -1;
            }
            if (hi < lo) {
                sg_ranges_free(&set);
                RX_ERR(r, "character range out of order");
            }
        }
        sg_ranges_add(&set, lo, hi);
    }
    r->i++;
    if (neg && sg_ranges_negate(&set)) return rp_errf(r->err, "out of memory");
    int rc = emit_set(r, &set);
    sg_ranges_free(&set);
    return rc;
}

static int rx_alt(rx *r, int top);

/* Any JSON string content character (for unanchored patterns). */
static void emit_any_json_chars(sg_str *o) {
    sg_str_cat(o, "([^\"\\\\\\u0000-\\u001F] | \"\\\\\" [\"\\\\/bfnrt] | \"\\\\u\" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | "
                  "[dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}))*");
}

static int rx_seq(rx *r, int top) {
    int any = 0;
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c == '|' || c == ')') break;
        if (c == '^') {
            if (!(top && r->i == 0)) RX_ERR(r, "the anchor ^ is only supported at the start");
            r->i++;
            continue;
        }
        if (c == '$') {
            if (!(top && r->i + 1 == r->n)) RX_ERR(r, "the anchor $ is only supported at the end");
            r->i++;
            continue;
        }
        if (c == '*' || c == '+' || c == '?') RX_ERR(r, "nothing to repeat before '%c'", c);
        sg_str_cat(r->out, any ? " " : "");
        any = 1;
        if (c == '(') {
            r->i++;
            if (r->i < r->n && r->s[r->i] == '?') {
                const char *q = r->s + r->i + 1;
                size_t left = r->n - r->i - 1;
                if (left >= 1 && q[0] == ':') r->i += 2;
                else if (left >= 2 && q[0] == 'P' && q[1] == '<') {
                    const char *e = memchr(q, '>', left);
                    if (!e) RX_ERR(r, "unterminated group name");
                    r->i = (size_t)(e - r->s) + 1;
                } else if (left >= 2 && q[0] == '<' && q[1] != '=' && q[1] != '!') {
                    const char *e = memchr(q, '>', left);
                    if (!e) RX_ERR(r, "unterminated group name");
                    r->i = (size_t)(e - r->s) + 1;
                } else if (left >= 1 && (q[0] == '=' || q[0] == '!' || q[0] == '<'))
                    RX_ERR(r, "lookahead and lookbehind are not supported");
                else if (left >= 2 && q[0] == 'P' && q[1] == '=') RX_ERR(r, "backreferences are not supported");
                else RX_ERR(r, "inline flags and (?...) extensions are not supported");
            }
            if (++r->depth > 100) RX_ERR(r, "groups nested too deeply");
            sg_str_cat(r->out, "(");
            if (rx_alt(r, 0)) return -1;
            r->depth--;
            if (r->i >= r->n || r->s[r->i] != ')') RX_ERR(r, "missing ')'");
            r->i++;
            sg_str_cat(r->out, ")");
        } else if (c == '[') {
            if (rx_class(r)) return -1;
        } else {
            sg_ranges set = {0};
            uint32_t cp;
            int kind;
            if (c == '.') {
                r->i++;
                sg_ranges_add(&set, '\n', '\n');
                kind = sg_ranges_negate(&set) ? -1 : 1;
            } else if (c == '\\') {
                r->i++;
                kind = rx_escape(r, &set, &cp);
            } else kind = rx_char(r, &cp);
            if (kind == 0) sg_ranges_add(&set, cp, cp);
            int rc = kind < 0 ? -1 : emit_set(r, &set);
            sg_ranges_free(&set);
            if (rc) return -1;
        }
        /* quantifier */
        if (r->i < r->n) {
            char q = r->s[r->i];
            int quant = 0;
            if (q == '*' || q == '+' || q == '?') {
                char t[2] = {q, 0};
                sg_str_cat(r->out, t);
                r->i++;
                quant = 1;
            } else if (q == '{') {
                size_t k = r->i + 1;
                long m = 0, x = -1;
                int digits = 0;
                while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && m < 100000) m = m * 10 + (r->s[k++] - '0'), digits++;
                int ok = digits > 0;
                if (ok && k < r->n && r->s[k] == ',') {
                    k++;
                    if (k < r->n && r->s[k] >= '0' && r->s[k] <= '9') {
                        x = 0;
                        while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9' && x < 100000) x = x * 10 + (r->s[k++] - '0');
                    }
                } else x = m;
                if (ok && k < r->n && r->s[k] == '}') {
                    if (x >= 0 && x < m) RX_ERR(r, "repetition {%ld,%ld} has max < min", m, x);
                    if (x >= 0) sg_str_printf(r->out, "{%ld,%ld}", m, x);
                    else sg_str_printf(r->out, "{%ld,}", m);
                    r->i = k + 1;
                    quant = 1;
                }
            }
            if (quant && r->i < r->n) {
                if (r->s[r->i] == '?') r->i++; /* lazy: same language */
                else if (r->s[r->i] == '+') RX_ERR(r, "possessive quantifiers are not supported");
                if (r->i < r->n && (r->s[r->i] == '*' || r->s[r->i] == '+' || r->s[r->i] == '?'))
                    RX_ERR(r, "nested quantifier");
            }
        }
    }
    if (!any) sg_str_cat(r->out, "\"\"");
    return 0;
}

static int rx_alt(rx *r, int top) {
    while (1) {
        if (rx_seq(r, top)) return -1;
        if (r->i < r->n && r->s[r->i] == '|') {
            r->i++;
            sg_str_cat(r->out, " | ");
            continue;
        }
        return 0;
    }
}

int sg_regex_to_gbnf(const char *re, size_t len, int json_string, sg_str *out, rp_err *err) {
    rx r = {.s = re, .n = len, .json = json_string, .out = out, .err = err};
    int anchored_start = len > 0 && re[0] == '^';
    int anchored_end = len > 0 && re[len - 1] == '$' && !(len > 1 && re[len - 2] == '\\');
    if (json_string && !anchored_start) emit_any_json_chars(out), sg_str_cat(out, " ");
    sg_str_cat(out, "(");
    if (rx_alt(&r, 1)) return -1;
    if (r.i < r.n) RX_ERR(&r, "unmatched ')'");
    sg_str_cat(out, ")");
    if (json_string && !anchored_end) sg_str_cat(out, " "), emit_any_json_chars(out);
    return out->oom ? rp_errf(err, "out of memory") : 0;
}
