/* The strict JSON reader behind tokenizer.json loading (see tjson.h for why it
 * exists). Recursive descent with a depth limit; a container's children are
 * collected on a scratch stack and copied contiguously into doc->kids when it
 * closes, so lookups are index arithmetic. */
#include "tokenizer/tjson.h"

#include <stdlib.h>
#include <string.h>

#define TJ_MAX_DEPTH 64

typedef struct parser {
    const unsigned char *p, *end, *begin;
    tj_doc *doc;
    uint32_t *stack; /* child node ids of the open containers */
    size_t n_stack, cap_stack;
    rp_err *err;
} parser;

static int fail(parser *ps, const char *what) {
    return rp_errf(ps->err, "invalid JSON at byte %zu: %s", (size_t)(ps->p - ps->begin), what);
}

static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *nb = realloc(*buf, c * elem);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

static int new_node(parser *ps, tj_type type, uint32_t *id) {
    tj_doc *d = ps->doc;
    if (grow((void **)&d->nodes, &d->cap_nodes, d->n_nodes + 1, sizeof *d->nodes))
        return rp_errf(ps->err, "out of memory parsing JSON");
    if (d->n_nodes >= UINT32_MAX) return fail(ps, "too many values");
    *id = (uint32_t)d->n_nodes++;
    tj_node *n = &d->nodes[*id];
    memset(n, 0, sizeof *n);
    n->type = type;
    return 0;
}

static int push_kid(parser *ps, uint32_t id) {
    if (grow((void **)&ps->stack, &ps->cap_stack, ps->n_stack + 1, sizeof *ps->stack))
        return rp_errf(ps->err, "out of memory parsing JSON");
    ps->stack[ps->n_stack++] = id;
    return 0;
}

/* Moves the children pushed since `base` into doc->kids. */
static int close_container(parser *ps, uint32_t id, size_t base, uint32_t count) {
    tj_doc *d = ps->doc;
    size_t n = ps->n_stack - base;
    if (grow((void **)&d->kids, &d->cap_kids, d->n_kids + n, sizeof *d->kids))
        return rp_errf(ps->err, "out of memory parsing JSON");
    if (n) memcpy(d->kids + d->n_kids, ps->stack + base, n * sizeof *d->kids);
    d->nodes[id].first = d->n_kids;
    d->nodes[id].len = count;
    d->n_kids += n;
    ps->n_stack = base;
    return 0;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(ps->p[i]);
        if (h < 0) return fail(ps, "bad \\u escape");
        v = v << 4 | (uint32_t)h;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static int utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if (c == 0xED) n = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) n = 3;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c == 0xF4) n = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else return 0;
    if (end - p < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

static char *put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | cp >> 6);
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | cp >> 12);
        *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | cp >> 18);
        *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* At the opening quote. Unescaped output never exceeds the input, and
 * doc->strings was sized to the whole input up front, so no bounds checks
 * are needed on the output side. */
static int parse_string(parser *ps, uint32_t id) {
    tj_doc *d = ps->doc;
    ps->p++;
    char *start = d->strings + d->n_strings, *o = start;
    for (;;) {
        /* fast path: a run of plain ASCII */
        const unsigned char *q = ps->p;
        while (q < ps->end && *q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\') q++;
        memcpy(o, ps->p, (size_t)(q - ps->p));
        o += q - ps->p;
        ps->p = q;
        if (ps->p >= ps->end) return fail(ps, "unterminated string");
        unsigned c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) return fail(ps, "control character in string");
        if (c >= 0x80) {
            int n = utf8_seq(ps->p, ps->end);
            if (!n) return fail(ps, "invalid UTF-8 in string");
            memcpy(o, ps->p, (size_t)n);
            o += n;
            ps->p += n;
            continue;
        }
        /* backslash */
        if (ps->end - ps->p < 2) return fail(ps, "truncated escape");
        c = ps->p[1];
        ps->p += 2;
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (read_hex4(ps, &cp)) return RP_ERR;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(ps, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    return fail(ps, "lone high surrogate in \\u escape");
                ps->p += 2;
                if (read_hex4(ps, &lo)) return RP_ERR;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(ps, "bad surrogate pair in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o = put_utf8(o, cp);
            break;
        }
        default: return fail(ps, "bad escape");
        }
    }
    *o++ = '\0';
    d->nodes[id].first = d->n_strings;
    d->nodes[id].len = (uint32_t)(o - start - 1);
    d->n_strings += (size_t)(o - start);
    return 0;
}

static int parse_number(parser *ps, uint32_t id) {
    const unsigned char *s = ps->p, *q = s;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, "bad number");
    if (*q == '0') q++;
    else
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    if (q < ps->end && *q == '.') {
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, "bad number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, "bad number");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    size_t n = (size_t)(q - s);
    if (n <= 15 && s[0] != '-') {
        /* plain small integers (every token id) without strtod */
        uint64_t v = 0;
        size_t i = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') v = v * 10 + (uint64_t)(s[i++] - '0');
        if (i == n) {
            ps->doc->nodes[id].num = (double)v;
            ps->p = q;
            return 0;
        }
    }
    char tmp[64];
    if (n >= sizeof tmp) {
        ps->doc->nodes[id].num = 0; /* absurdly long literal: no field of ours is one */
    } else {
        memcpy(tmp, s, n);
        tmp[n] = '\0';
        ps->doc->nodes[id].num = strtod(tmp, NULL);
    }
    ps->p = q;
    return 0;
}

static int parse_value(parser *ps, int depth, uint32_t *out);

static int parse_container(parser *ps, int depth, uint32_t id, int is_obj) {
    size_t base = ps->n_stack;
    uint32_t count = 0;
    char close = is_obj ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return close_container(ps, id, base, 0);
    }
    for (;;) {
        uint32_t kid;
        skip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected object key");
            if (new_node(ps, TJ_STRING, &kid) || parse_string(ps, kid) || push_kid(ps, kid))
                return RP_ERR;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
            ps->p++;
        }
        if (parse_value(ps, depth + 1, &kid) || push_kid(ps, kid)) return RP_ERR;
        count++;
        skip_ws(ps);
        if (ps->p >= ps->end) return fail(ps, "unterminated container");
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            break;
        }
        return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    return close_container(ps, id, base, count);
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, "bad literal");
    ps->p += n;
    return 0;
}

static int parse_value(parser *ps, int depth, uint32_t *out) {
    if (depth > TJ_MAX_DEPTH) return fail(ps, "nested too deeply");
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    uint32_t id;
    switch (*ps->p) {
    case '{':
        if (new_node(ps, TJ_OBJECT, &id)) return RP_ERR;
        *out = id;
        return parse_container(ps, depth, id, 1);
    case '[':
        if (new_node(ps, TJ_ARRAY, &id)) return RP_ERR;
        *out = id;
        return parse_container(ps, depth, id, 0);
    case '"':
        if (new_node(ps, TJ_STRING, &id)) return RP_ERR;
        *out = id;
        return parse_string(ps, id);
    case 't':
        if (new_node(ps, TJ_TRUE, &id)) return RP_ERR;
        *out = id;
        return literal(ps, "true");
    case 'f':
        if (new_node(ps, TJ_FALSE, &id)) return RP_ERR;
        *out = id;
        return literal(ps, "false");
    case 'n':
        if (new_node(ps, TJ_NULL, &id)) return RP_ERR;
        *out = id;
        return literal(ps, "null");
    default:
        if (new_node(ps, TJ_NUMBER, &id)) return RP_ERR;
        *out = id;
        return parse_number(ps, id);
    }
}

int tj_parse(tj_doc *doc, const char *text, size_t len, rp_err *err) {
    memset(doc, 0, sizeof *doc);
    parser ps = {(const unsigned char *)text, (const unsigned char *)text + len,
                 (const unsigned char *)text, doc, NULL, 0, 0, err};
    /* Every string's unescaped bytes plus its NUL fit in the input length + 1. */
    doc->strings = malloc(len + 1);
    if (!doc->strings) return rp_errf(err, "out of memory parsing JSON (%zu bytes)", len);
    /* serde_json (what HF uses) rejects a byte order mark; say so plainly */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        tj_free(doc);
        return rp_errf(err, "invalid JSON: starts with a byte order mark");
    }
    /* sized for tokenizer.json's shape (about one value per 10 bytes) to
     * spare the reallocation copies */
    doc->cap_nodes = len / 10 + 16;
    doc->nodes = malloc(doc->cap_nodes * sizeof *doc->nodes);
    doc->cap_kids = len / 8 + 16;
    doc->kids = malloc(doc->cap_kids * sizeof *doc->kids);
    if (!doc->nodes || !doc->kids) {
        tj_free(doc);
        return rp_errf(err, "out of memory parsing JSON (%zu bytes)", len);
    }
    uint32_t root;
    int rc = parse_value(&ps, 0, &root);
    if (rc == 0) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = fail(&ps, "trailing characters");
    }
    free(ps.stack);
    if (rc) tj_free(doc);
    return rc;
}

void tj_free(tj_doc *doc) {
    free(doc->nodes);
    free(doc->kids);
    free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

const tj_node *tj_get(const tj_doc *d, const tj_node *obj, const char *key) {
    if (!obj || obj->type != TJ_OBJECT) return NULL;
    size_t klen = strlen(key);
    const tj_node *found = NULL;
    for (uint32_t i = 0; i < obj->len; i++) {
        const tj_node *k = tj_key_at(d, obj, i);
        if (k->len == klen && memcmp(tj_str(d, k), key, klen) == 0) found = tj_val_at(d, obj, i);
    }
    return found;
}

const char *tj_get_str(const tj_doc *d, const tj_node *obj, const char *key) {
    const tj_node *v = tj_get(d, obj, key);
    return v && v->type == TJ_STRING ? tj_str(d, v) : NULL;
}

int tj_get_bool(const tj_doc *d, const tj_node *obj, const char *key, int dflt) {
    const tj_node *v = tj_get(d, obj, key);
    if (!v || v->type == TJ_NULL) return dflt;
    if (v->type == TJ_TRUE) return 1;
    if (v->type == TJ_FALSE) return 0;
    return -1;
}
