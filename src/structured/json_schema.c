/* JSON Schema -> GBNF (sg_json_schema_to_gbnf). docs/structured.md lists
 * what is enforced; in short: type (all seven, unions), properties /
 * required / additionalProperties (false, true or a schema; absent means
 * false where properties are declared, as OpenAI's strict mode), enum / const, items / prefixItems /
 * minItems / maxItems, string minLength / maxLength / pattern / format,
 * integer bounds (exact, by digit ranges), number bounds (non-negative
 * integer bounds), anyOf, oneOf (when its branches are disjoint), allOf
 * (merged), $ref / $defs (recursion included). Every other keyword is an
 * error that names it: nothing is silently ignored, except annotations
 * (title, description, examples, default, ...).
 *
 * Properties are generated in the order the schema lists them; additional
 * properties (when allowed) come after the declared ones and may not use
 * escapes in their names (so no key can spell a declared name). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "structured/sgrammar.h"

typedef struct ref_memo {
    char *ref;
    char name[24];
} ref_memo;

typedef struct js {
    json_t *root;
    sg_str *out;
    rp_err *err;
    int max_depth;
    int counter;
    ref_memo *refs;
    int n_refs, cap_refs;
} js;

#define JS_ERR(j, ...) rp_errf((j)->err, __VA_ARGS__)

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "examples",
                                          "default", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", NULL};
static const char *const supported[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                        "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength",
                                        "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "uniqueItems", NULL};

static int in_list(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static void new_name(js *j, char *name) { snprintf(name, 24, "s%d", ++j->counter); }

static void emit_rule(js *j, const char *name, const sg_str *body) {
    sg_str_printf(j->out, "%s ::= %s\n", name, body->s ? body->s : "\"\"");
}

static int gen(js *j, json_t *s, int depth, char *name);
static int gen_named(js *j, json_t *s, int depth, const char *name);

/* ---- $ref ---- */

static json_t *resolve(js *j, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *cur = j->root;
    const char *p = ref + 1;
    if (*p == 0) return cur;
    if (*p != '/') return NULL;
    while (*p == '/' && cur) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k < sizeof key - 1; i++) { /* JSON pointer escapes */
            if (p[i] == '~' && i + 1 < n && p[i + 1] == '1') key[k++] = '/', i++;
            else if (p[i] == '~' && i + 1 < n && p[i + 1] == '0') key[k++] = '~', i++;
            else key[k++] = p[i];
        }
        key[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, key);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(key, NULL, 10));
        else cur = NULL;
        p += n;
    }
    return cur;
}

static int gen_ref(js *j, const char *ref, int depth, char *name) {
    for (int i = 0; i < j->n_refs; i++)
        if (!strcmp(j->refs[i].ref, ref)) {
            strcpy(name, j->refs[i].name);
            return 0;
        }
    json_t *t = resolve(j, ref);
    if (!t) return JS_ERR(j, "$ref '%s' does not resolve (only local refs such as #/$defs/name)", ref);
    if (j->n_refs == j->cap_refs) {
        int cap = j->cap_refs ? j->cap_refs * 2 : 16;
        ref_memo *nr = realloc(j->refs, (size_t)cap * sizeof *nr);
        if (!nr) return JS_ERR(j, "out of memory");
        j->refs = nr;
        j->cap_refs = cap;
    }
    ref_memo *m = &j->refs[j->n_refs];
    m->ref = strdup(ref);
    if (!m->ref) return JS_ERR(j, "out of memory");
    new_name(j, m->name);
    j->n_refs++;
    strcpy(name, m->name);
    char nm[24];
    strcpy(nm, m->name);
    return gen_named(j, t, depth, nm);
}

/* ---- allOf: merging ---- */

static int merge_into(js *j, json_t *dst, json_t *src, int depth);

static json_t *deref(js *j, json_t *s) {
    for (int hops = 0; hops < 32 && json_is_object(s) && json_object_get(s, "$ref"); hops++) {
        if (json_object_size(s) != 1) return s;
        json_t *t = resolve(j, json_string_value(json_object_get(s, "$ref")) ? json_string_value(json_object_get(s, "$ref")) : "");
        if (!t) return s;
        s = t;
    }
    return s;
}

static int merge_into(js *j, json_t *dst, json_t *src, int depth) {
    if (depth > j->max_depth) return JS_ERR(j, "schema nested too deeply (max_depth %d)", j->max_depth);
    src = deref(j, src);
    if (json_is_true(src)) return 0;
    if (!json_is_object(src)) return JS_ERR(j, "allOf: each element must be a schema object");
    if (json_object_get(src, "$ref")) return JS_ERR(j, "allOf: $ref with sibling keywords cannot be merged");
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        json_t *d = json_object_get(dst, k);
        if (!strcmp(k, "allOf")) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) if (merge_into(j, dst, x, depth + 1)) return -1;
            continue;
        }
        if (!d) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(d, v) || in_list(k, annotations)) continue;
        if (!strcmp(k, "properties")) {
            json_t *np = json_deep_copy(d);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *e = json_object_get(np, pk);
                if (e) json_object_set_new(np, pk, json_pack("{s:[O,O]}", "allOf", e, pv));
                else json_object_set(np, pk, pv);
            }
            json_object_set_new(dst, k, np);
        } else if (!strcmp(k, "required")) {
            json_t *nr = json_deep_copy(d);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                int have = 0;
                size_t q;
                json_t *y;
                json_array_foreach(nr, q, y) have |= json_equal(x, y);
                if (!have) json_array_append(nr, x);
            }
            json_object_set_new(dst, k, nr);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "exclusiveMinimum")) {
            if (json_number_value(v) > json_number_value(d)) json_object_set(dst, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "exclusiveMaximum")) {
            if (json_number_value(v) < json_number_value(d)) json_object_set(dst, k, v);
        } else if (!strcmp(k, "type")) {
            json_t *a = json_is_string(d) ? json_pack("[O]", d) : json_deep_copy(d);
            json_t *b = json_is_string(v) ? json_pack("[O]", v) : json_incref(v);
            json_t *c = json_array();
            size_t i, q;
            json_t *x, *y;
            json_array_foreach(a, i, x) json_array_foreach(b, q, y) {
                const char *xs = json_string_value(x), *ys = json_string_value(y);
                if (!xs || !ys) continue;
                if (!strcmp(xs, ys)) json_array_append(c, x);
                else if (!strcmp(xs, "number") && !strcmp(ys, "integer")) json_array_append(c, y);
                else if (!strcmp(xs, "integer") && !strcmp(ys, "number")) json_array_append(c, x);
            }
            json_decref(a), json_decref(b);
            if (!json_array_size(c)) {
                json_decref(c);
                return JS_ERR(j, "allOf: the types have no common member (the schema matches nothing)");
            }
            json_object_set_new(dst, k, c);
        } else {
            return JS_ERR(j, "allOf: cannot merge two different values of '%s'", k);
        }
    }
    return 0;
}

/* ---- integers by digit ranges ---- */

/* Numbers of n digits from lo to hi (both n-digit strings), as a GBNF expression. */
static void same_len(sg_str *o, const char *lo, const char *hi, int n) {
    if (n == 0) {
        sg_str_cat(o, "\"\"");
        return;
    }
    if (!memcmp(lo, hi, (size_t)n)) {
        sg_str_printf(o, "\"%.*s\"", n, lo);
        return;
    }
    char a = lo[0], b = hi[0];
    if (a == b) {
        sg_str_printf(o, "\"%c\" (", a);
        same_len(o, lo + 1, hi + 1, n - 1);
        sg_str_cat(o, ")");
        return;
    }
    int lo_zero = 1, hi_nine = 1;
    for (int i = 1; i < n; i++) lo_zero &= lo[i] == '0', hi_nine &= hi[i] == '9';
    if (lo_zero && hi_nine) {
        sg_str_printf(o, "[%c-%c]", a, b);
        if (n > 1) sg_str_printf(o, " [0-9]{%d}", n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    sg_str_printf(o, "(\"%c\" (", a);
    same_len(o, lo + 1, nines, n - 1);
    sg_str_cat(o, ")");
    if (a + 1 <= b - 1) {
        sg_str_printf(o, " | [%c-%c]", a + 1, b - 1);
        if (n > 1) sg_str_printf(o, " [0-9]{%d}", n - 1);
    }
    sg_str_printf(o, " | \"%c\" (", b);
    same_len(o, zeros, hi + 1, n - 1);
    sg_str_cat(o, "))");
}

static int ndigits(long long x) {
    int d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

/* Non-negative integers in [a, b] (b < 0: unbounded), no leading zeros. */
static void urange(sg_str *o, long long a, long long b) {
    sg_str_cat(o, "(");
    int first = 1;
    int da = ndigits(a);
    long long top = b < 0 ? -1 : b;
    int db = b < 0 ? da : ndigits(b);
    for (int d = da; d <= db; d++) {
        long long p = 1;
        for (int i = 1; i < d; i++) p *= 10;
        long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        if (lo < a) lo = a;
        if (top >= 0 && hi > top) hi = top;
        if (lo > hi) continue;
        char ls[64], hs[64];
        snprintf(ls, sizeof ls, "%0*lld", d & 31, lo);
        snprintf(hs, sizeof hs, "%0*lld", d & 31, hi);
        if (!first) sg_str_cat(o, " | ");
        first = 0;
        same_len(o, ls, hs, d);
    }
    if (b < 0) {
        if (!first) sg_str_cat(o, " | ");
        sg_str_printf(o, "[1-9] [0-9]{%d,}", da);
    }
    sg_str_cat(o, ")");
}

static int int_range(js *j, sg_str *o, int has_lo, long long lo, int has_hi, long long hi) {
    if (has_lo && has_hi && lo > hi) return JS_ERR(j, "minimum/maximum: the integer range is empty");
    int first = 1;
    sg_str_cat(o, "(");
    if (!has_lo || lo < 0) { /* negative part: "-" abs in [max(1, -hi), -lo] */
        long long alo = has_hi && hi < 0 ? -hi : 1, ahi = has_lo ? -lo : -1;
        sg_str_cat(o, "\"-\" ");
        urange(o, alo, ahi);
        first = 0;
    }
    if (!has_hi || hi >= 0) {
        if (!first) sg_str_cat(o, " | ");
        urange(o, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    sg_str_cat(o, ")");
    return 0;
}

/* Bounds from minimum/maximum/exclusive*: the integer bounds (integers). */
static int int_bounds(js *j, json_t *s, int *has_lo, long long *lo, int *has_hi, long long *hi) {
    json_t *v;
    *has_lo = *has_hi = 0;
    *lo = *hi = 0;
    const double lim = 1e15;
    if ((v = json_object_get(s, "minimum"))) {
        if (!json_is_number(v)) return JS_ERR(j, "minimum must be a number");
        double x = json_number_value(v);
        if (fabs(x) > lim) return JS_ERR(j, "minimum %g is too large to enforce", x);
        *has_lo = 1, *lo = (long long)ceil(x);
    }
    if ((v = json_object_get(s, "exclusiveMinimum"))) {
        if (json_is_boolean(v)) return JS_ERR(j, "exclusiveMinimum as a boolean (draft 4) is not supported");
        if (!json_is_number(v)) return JS_ERR(j, "exclusiveMinimum must be a number");
        double x = json_number_value(v);
        if (fabs(x) > lim) return JS_ERR(j, "exclusiveMinimum %g is too large to enforce", x);
        long long l = (long long)floor(x) + 1;
        if (!*has_lo || l > *lo) *has_lo = 1, *lo = l;
    }
    if ((v = json_object_get(s, "maximum"))) {
        if (!json_is_number(v)) return JS_ERR(j, "maximum must be a number");
        double x = json_number_value(v);
        if (fabs(x) > lim) return JS_ERR(j, "maximum %g is too large to enforce", x);
        *has_hi = 1, *hi = (long long)floor(x);
    }
    if ((v = json_object_get(s, "exclusiveMaximum"))) {
        if (json_is_boolean(v)) return JS_ERR(j, "exclusiveMaximum as a boolean (draft 4) is not supported");
        if (!json_is_number(v)) return JS_ERR(j, "exclusiveMaximum must be a number");
        double x = json_number_value(v);
        if (fabs(x) > lim) return JS_ERR(j, "exclusiveMaximum %g is too large to enforce", x);
        long long h = (long long)ceil(x) - 1;
        if (!*has_hi || h < *hi) *has_hi = 1, *hi = h;
    }
    return 0;
}

static int has_any(json_t *s, const char *const *keys) {
    for (int i = 0; keys[i]; i++)
        if (json_object_get(s, keys[i])) return 1;
    return 0;
}

static const char *const num_keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
static const char *const str_keys[] = {"minLength", "maxLength", "pattern", "format", NULL};
static const char *const obj_keys[] = {"properties", "required", "additionalProperties", NULL};
static const char *const arr_keys[] = {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", NULL};

/* Numbers with bounds: enforced when every bound is a non-negative integer. */
static int number_bounded(js *j, json_t *s, sg_str *o) {
    static const char *const names[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    double val[4];
    int has[4];
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(s, names[i]);
        has[i] = v != NULL;
        if (!v) continue;
        if (!json_is_number(v)) return JS_ERR(j, "%s must be a number", names[i]);
        val[i] = json_number_value(v);
        if (val[i] < 0 || val[i] != floor(val[i]) || val[i] > 1e15)
            return JS_ERR(j, "%s on a number: only non-negative integer bounds are enforced (%g is not)", names[i], val[i]);
    }
    if (has[0] && has[1]) return JS_ERR(j, "minimum with exclusiveMinimum on a number is not supported");
    if (has[2] && has[3]) return JS_ERR(j, "maximum with exclusiveMaximum on a number is not supported");
    int has_lo = has[0] || has[1], exl = has[1], has_hi = has[2] || has[3], exh = has[3];
    long long L = has_lo ? (long long)(has[0] ? val[0] : val[1]) : 0, H = has_hi ? (long long)(has[2] ? val[2] : val[3]) : -1;
    const char *frac = "(\".\" [0-9]+)?", *nzfrac = "\".\" [0-9]* [1-9]", *zfrac = "(\".\" \"0\"+)?";
    int first = 1;
    sg_str_cat(o, "(");
    if (!has_lo) { /* any negative number */
        sg_str_printf(o, "\"-\" (\"0\" \".\" [0-9]* [1-9] | [1-9] [0-9]* %s)", frac);
        first = 0;
    }
    if (has_hi && (H < L || (H == L && (exl || exh)))) {
        if (first) return JS_ERR(j, "minimum/maximum: the number range is empty");
        sg_str_cat(o, ")");
        return 0;
    }
    if (!first) sg_str_cat(o, " | ");
    if (has_hi && H == L) sg_str_printf(o, "\"%lld\" %s", L, zfrac);
    else {
        sg_str_printf(o, "\"%lld\" %s", L, exl ? nzfrac : frac); /* integer part L */
        if (!has_hi || L + 1 <= H - 1) {
            sg_str_cat(o, " | ");
            urange(o, L + 1, has_hi ? H - 1 : -1);
            sg_str_printf(o, " %s", frac);
        }
        if (has_hi && !exh) sg_str_printf(o, " | \"%lld\" %s", H, zfrac);
    }
    sg_str_cat(o, ")");
    return 0;
}

/* ---- strings ---- */

static const struct {
    const char *name, *regex;
} formats[] = {
    {"date", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
    {"time", "^([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"date-time", "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
                  "(\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"email", "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\\.[a-zA-Z0-9-]+)+$"},
    {"ipv4", "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"},
    {NULL, NULL},
};

static int get_count(js *j, json_t *s, const char *key, long *out, long dflt) {
    json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000)
        return JS_ERR(j, "%s must be an integer from 0 to 100000", key);
    *out = (long)json_integer_value(v);
    return 0;
}

static int gen_string(js *j, json_t *s, sg_str *o) {
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    long mn, mx;
    if (get_count(j, s, "minLength", &mn, 0) || get_count(j, s, "maxLength", &mx, -1)) return -1;
    int lens = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    if ((pat || fmt) && lens) return JS_ERR(j, "%s with minLength/maxLength cannot be enforced together", pat ? "pattern" : "format");
    if (pat && fmt) return JS_ERR(j, "pattern with format cannot be enforced together");
    if (mx >= 0 && mx < mn) return JS_ERR(j, "maxLength is less than minLength");
    if (fmt) {
        const char *f = json_string_value(fmt);
        if (!f) return JS_ERR(j, "format must be a string");
        for (int i = 0; formats[i].name; i++)
            if (!strcmp(f, formats[i].name)) {
                sg_str_cat(o, "\"\\\"\" ");
                if (sg_regex_to_gbnf(formats[i].regex, strlen(formats[i].regex), 1, o, j->err)) return -1;
                sg_str_cat(o, " \"\\\"\"");
                return 0;
            }
        return JS_ERR(j, "format '%s' is not supported (date, time, date-time, uuid, email, ipv4)", f);
    }
    if (pat) {
        if (!json_is_string(pat)) return JS_ERR(j, "pattern must be a string");
        sg_str_cat(o, "\"\\\"\" ");
        if (sg_regex_to_gbnf(json_string_value(pat), json_string_length(pat), 1, o, j->err))
            return rp_err_wrap(j->err, "pattern");
        sg_str_cat(o, " \"\\\"\"");
        return 0;
    }
    if (!lens) {
        sg_str_cat(o, "string");
        return 0;
    }
    if (mx >= 0) sg_str_printf(o, "\"\\\"\" char{%ld,%ld} \"\\\"\"", mn, mx);
    else sg_str_printf(o, "\"\\\"\" char{%ld,} \"\\\"\"", mn);
    return 0;
}

/* ---- objects ---- */

/* key rules for additional properties: any escape-free string not equal to
 * one of names (ASCII), as a trie of rules. Returns the key rule's name. */
static int gen_key_excluding(js *j, const char **names, int n, int depth_prefix, char *out_name) {
    /* names sharing the prefix are passed in; depth_prefix = prefix length */
    char name[24];
    new_name(j, name);
    strcpy(out_name, name);
    sg_str body = {0};
    int terminal = 0;
    char children[128];
    int n_children = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if ((int)len == depth_prefix) terminal = 1;
        else {
            char c = names[i][depth_prefix];
            if (!memchr(children, c, (size_t)n_children)) children[n_children++] = c;
        }
    }
    if (!terminal) sg_str_cat(&body, "\"\\\"\" | ");
    sg_str_cat(&body, "[^\"\\\\\\u0000-\\u001F");
    for (int k = 0; k < n_children; k++) sg_str_printf(&body, "\\u%04X", (unsigned char)children[k]);
    sg_str_cat(&body, "] kchar* \"\\\"\"");
    for (int k = 0; k < n_children; k++) {
        const char *sub[256];
        int m = 0;
        for (int i = 0; i < n && m < 256; i++)
            if ((int)strlen(names[i]) > depth_prefix && names[i][depth_prefix] == children[k]) sub[m++] = names[i];
        char child[24];
        if (gen_key_excluding(j, sub, m, depth_prefix + 1, child)) {
            free(body.s);
            return -1;
        }
        sg_str_printf(&body, " | \"\\u%04X\" %s", (unsigned char)children[k], child);
    }
    emit_rule(j, name, &body);
    free(body.s);
    return 0;
}

typedef struct prop {
    const char *name;
    char rule[24];
    int required;
} prop;

static int gen_object(js *j, json_t *s, int depth, sg_str *o) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return JS_ERR(j, "properties must be an object");
    if (req && !json_is_array(req)) return JS_ERR(j, "required must be an array");
    size_t np = (props ? json_object_size(props) : 0) + (req ? json_array_size(req) : 0);
    prop *p = calloc(np + 1, sizeof *p);
    if (!p) return JS_ERR(j, "out of memory");
    int n = 0, rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        p[n].name = k;
        if ((rc = gen(j, v, depth + 1, p[n].rule))) goto out;
        n++;
    }
    size_t i;
    json_array_foreach(req, i, v) {
        const char *rn = json_string_value(v);
        if (!rn) {
            rc = JS_ERR(j, "required: every element must be a string");
            goto out;
        }
        int found = 0;
        for (int q = 0; q < n; q++)
            if (!strcmp(p[q].name, rn)) p[q].required = 1, found = 1;
        if (!found) { /* required but not described: any value */
            p[n].name = rn;
            p[n].required = 1;
            strcpy(p[n].rule, "value");
            n++;
        }
    }
    /* absent additionalProperties: none when properties are declared (strict,
     * as OpenAI), any when none are (a bare {"type": "object"}) */
    int extras = addl ? !json_is_false(addl) : !props;
    char extra_val[24] = "value", key_rule[24] = "string";
    if (extras) {
        if (addl && !json_is_true(addl) && (rc = gen(j, addl, depth + 1, extra_val))) goto out;
        const char **names = malloc(((size_t)n + 1) * sizeof *names);
        if (!names) {
            rc = JS_ERR(j, "out of memory");
            goto out;
        }
        for (int q = 0; q < n; q++) {
            names[q] = p[q].name;
            if (strlen(p[q].name) > 256) {
                free(names);
                rc = JS_ERR(j, "additionalProperties beside a property name longer than 256 bytes is not supported");
                goto out;
            }
            for (const char *c = p[q].name; *c; c++)
                if ((unsigned char)*c >= 0x80 || (unsigned char)*c < 0x20 || *c == '"' || *c == '\\') {
                    free(names);
                    rc = JS_ERR(j, "additionalProperties with a property name that is not plain ASCII ('%s') is not supported", p[q].name);
                    goto out;
                }
        }
        if (n) {
            char trie[24];
            rc = gen_key_excluding(j, names, n, 0, trie);
            snprintf(key_rule, sizeof key_rule, "k%d", ++j->counter);
            sg_str_printf(j->out, "%s ::= \"\\\"\" %s\n", key_rule, trie);
        }
        free(names);
        if (rc) goto out;
    }
    /* R_i: after something was emitted, properties i.. ; F_i: nothing emitted yet (non-empty) */
    int base = ++j->counter;
    for (int q = n; q >= 0; q--) {
        sg_str body = {0};
        if (q == n) {
            if (extras) sg_str_printf(&body, "(ws \",\" ws %s ws \":\" ws %s)*", key_rule, extra_val);
            else sg_str_cat(&body, "\"\"");
        } else {
            json_t *js_name = json_string(p[q].name);
            char *enc = json_dumps(js_name, JSON_ENCODE_ANY);
            json_decref(js_name);
            sg_str_cat(&body, "ws \",\" ws ");
            sg_str_literal(&body, enc, strlen(enc));
            free(enc);
            sg_str_printf(&body, " ws \":\" ws %s r%d-%d", p[q].rule, base, q + 1);
            if (!p[q].required) sg_str_printf(&body, " | r%d-%d", base, q + 1);
        }
        char nm[32];
        snprintf(nm, sizeof nm, "r%d-%d", base, q);
        emit_rule(j, nm, &body);
        free(body.s);
    }
    int f_exists_next = extras; /* F_n exists when extras are allowed */
    if (extras) sg_str_printf(j->out, "f%d-%d ::= %s ws \":\" ws %s r%d-%d\n", base, n, key_rule, extra_val, base, n);
    int all_optional = 1;
    for (int q = n - 1; q >= 0; q--) {
        sg_str body = {0};
        json_t *js_name = json_string(p[q].name);
        char *enc = json_dumps(js_name, JSON_ENCODE_ANY);
        json_decref(js_name);
        sg_str_literal(&body, enc, strlen(enc));
        free(enc);
        sg_str_printf(&body, " ws \":\" ws %s r%d-%d", p[q].rule, base, q + 1);
        if (!p[q].required && f_exists_next) sg_str_printf(&body, " | f%d-%d", base, q + 1);
        if (p[q].required) all_optional = 0;
        char nm[32];
        snprintf(nm, sizeof nm, "f%d-%d", base, q);
        emit_rule(j, nm, &body);
        free(body.s);
        f_exists_next = 1;
    }
    if (f_exists_next) {
        sg_str_printf(o, "\"{\" ws f%d-0 ws \"}\"", base);
        if (all_optional) sg_str_cat(o, " | \"{\" ws \"}\"");
    } else sg_str_cat(o, "\"{\" ws \"}\"");
out:
    free(p);
    return rc;
}

/* ---- arrays ---- */

static int gen_array(js *j, json_t *s, int depth, sg_str *o) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems"),
           *uniq = json_object_get(s, "uniqueItems");
    if (uniq && !json_is_false(uniq)) return JS_ERR(j, "uniqueItems cannot be enforced by a grammar");
    if (json_is_array(items)) {
        if (prefix) return JS_ERR(j, "items as an array together with prefixItems");
        prefix = items;
        items = NULL;
    }
    if (prefix && !json_is_array(prefix)) return JS_ERR(j, "prefixItems must be an array");
    long mn, mx;
    if (get_count(j, s, "minItems", &mn, 0) || get_count(j, s, "maxItems", &mx, -1)) return -1;
    int k = prefix ? (int)json_array_size(prefix) : 0;
    if (json_is_false(items) && (mx < 0 || mx > k)) mx = k;
    if (mx >= 0 && mx < mn) return JS_ERR(j, "minItems/maxItems: the array length range is empty");
    char item[24] = "value";
    if (items && !json_is_true(items) && !json_is_false(items) && gen(j, items, depth + 1, item)) return -1;
    char *pre = calloc((size_t)k + 1, 24);
    if (!pre) return JS_ERR(j, "out of memory");
    for (int i = 0; i < k; i++)
        if (gen(j, json_array_get(prefix, (size_t)i), depth + 1, pre + 24 * i)) {
            free(pre);
            return -1;
        }
    if (mx == 0) {
        sg_str_cat(o, "\"[\" ws \"]\"");
        free(pre);
        return 0;
    }
    int base = ++j->counter;
    /* L_i: i elements emitted so far */
    for (int i = k; i >= 1; i--) {
        sg_str body = {0};
        if (i == k) {
            long lo = mn > k ? mn - k : 0, hi = mx < 0 ? -1 : mx - k;
            if (hi == 0 || json_is_false(items)) sg_str_cat(&body, "\"\"");
            else if (hi < 0) sg_str_printf(&body, "(ws \",\" ws %s){%ld,}", item, lo);
            else sg_str_printf(&body, "(ws \",\" ws %s){%ld,%ld}", item, lo, hi);
        } else if (mx >= 0 && i >= mx) {
            sg_str_cat(&body, "\"\"");
        } else {
            sg_str_printf(&body, "ws \",\" ws %s l%d-%d", pre + 24 * i, base, i + 1);
            if (i >= mn) sg_str_cat(&body, " | \"\"");
        }
        char nm[32];
        snprintf(nm, sizeof nm, "l%d-%d", base, i);
        emit_rule(j, nm, &body);
        free(body.s);
    }
    if (k > 0) sg_str_printf(o, "\"[\" ws %s l%d-1 ws \"]\"", pre, base);
    else {
        long lo = mn > 1 ? mn - 1 : 0, hi = mx < 0 ? -1 : mx - 1;
        if (hi < 0) sg_str_printf(o, "\"[\" ws %s (ws \",\" ws %s){%ld,} ws \"]\"", item, item, lo);
        else sg_str_printf(o, "\"[\" ws %s (ws \",\" ws %s){%ld,%ld} ws \"]\"", item, item, lo, hi);
    }
    if (mn == 0) sg_str_cat(o, " | \"[\" ws \"]\"");
    free(pre);
    return 0;
}

/* ---- oneOf disjointness ---- */

static unsigned type_bits_of_value(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return 1;
    case JSON_ARRAY: return 2;
    case JSON_STRING: return 4;
    case JSON_INTEGER: return 8 | 16;
    case JSON_REAL: return 16;
    case JSON_TRUE: case JSON_FALSE: return 32;
    default: return 64;
    }
}

static unsigned type_bits(js *j, json_t *s) {
    s = deref(j, s);
    if (!json_is_object(s)) return 127;
    json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum"), *t = json_object_get(s, "type");
    if (c) return type_bits_of_value(c);
    if (json_is_array(e)) {
        unsigned b = 0;
        size_t i;
        json_t *x;
        json_array_foreach(e, i, x) b |= type_bits_of_value(x);
        return b;
    }
    static const char *const names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};
    static const unsigned bits[] = {1, 2, 4, 8 | 16, 16 | 8, 32, 64};
    unsigned b = 0;
    for (int i = 0; i < 7; i++) {
        if (json_is_string(t) && !strcmp(json_string_value(t), names[i])) b |= bits[i];
        size_t q;
        json_t *x;
        if (json_is_array(t))
            json_array_foreach(t, q, x) if (json_is_string(x) && !strcmp(json_string_value(x), names[i])) b |= bits[i];
    }
    return b ? b : 127;
}

/* Two object branches told apart by a required property with different consts. */
static int const_discriminated(js *j, json_t *a, json_t *b) {
    a = deref(j, a), b = deref(j, b);
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    const char *k;
    json_t *v;
    json_object_foreach(pa, k, v) {
        json_t *w = json_object_get(pb, k);
        json_t *ca = json_object_get(deref(j, v), "const"), *cb = w ? json_object_get(deref(j, w), "const") : NULL;
        if (!ca || !cb || json_equal(ca, cb)) continue;
        int ra = 0, rb = 0;
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(a, "required"), i, x) ra |= json_is_string(x) && !strcmp(json_string_value(x), k);
        json_array_foreach(json_object_get(b, "required"), i, x) rb |= json_is_string(x) && !strcmp(json_string_value(x), k);
        if (ra && rb) return 1;
    }
    return 0;
}

/* ---- the schema ---- */

static int gen_union(js *j, json_t *s, json_t *branches, const char *kw, int depth, sg_str *o) {
    if (!json_is_array(branches) || !json_array_size(branches)) return JS_ERR(j, "%s must be a non-empty array", kw);
    size_t n = json_array_size(branches);
    if (!strcmp(kw, "oneOf"))
        for (size_t a = 0; a < n; a++)
            for (size_t b = a + 1; b < n; b++) {
                json_t *x = json_array_get(branches, a), *y = json_array_get(branches, b);
                if (!(type_bits(j, x) & type_bits(j, y))) continue;
                if (const_discriminated(j, x, y)) continue;
                return JS_ERR(j, "oneOf: branches %zu and %zu may both match; oneOf is enforced (as anyOf) only when its "
                                 "branches are disjoint (different types or a required property with different consts)",
                              a, b);
            }
    /* siblings of anyOf/oneOf apply to every branch */
    json_t *rest = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) if (strcmp(k, kw) && !in_list(k, annotations)) json_object_set(rest, k, v);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char name[24];
        json_t *br = json_array_get(branches, i);
        if (json_object_size(rest)) {
            json_t *m = json_deep_copy(rest);
            rc = merge_into(j, m, br, depth + 1);
            if (!rc) rc = gen(j, m, depth + 1, name);
            json_decref(m);
        } else rc = gen(j, br, depth + 1, name);
        if (!rc) sg_str_printf(o, "%s%s", i ? " | " : "", name);
    }
    json_decref(rest);
    return rc;
}

static int json_type_matches(json_t *v, const char *t) {
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    return json_is_null(v);
}

static int gen_body(js *j, json_t *s, int depth, sg_str *o) {
    if (depth > j->max_depth) return JS_ERR(j, "schema nested too deeply (max_depth %d)", j->max_depth);
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
        sg_str_cat(o, "value");
        return 0;
    }
    if (json_is_false(s)) return JS_ERR(j, "the schema false matches nothing");
    if (!json_is_object(s)) return JS_ERR(j, "a schema must be an object or a boolean");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (in_list(k, annotations)) continue;
        if (!in_list(k, supported)) return JS_ERR(j, "unsupported JSON Schema keyword '%s'", k);
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return JS_ERR(j, "$ref must be a string");
        json_object_foreach(s, k, v) if (strcmp(k, "$ref") && !in_list(k, annotations))
            return JS_ERR(j, "$ref with the sibling keyword '%s' is not supported (use allOf)", k);
        char name[24];
        if (gen_ref(j, json_string_value(ref), depth + 1, name)) return -1;
        sg_str_cat(o, name);
        return 0;
    }
    if (json_object_get(s, "allOf")) {
        json_t *all = json_object_get(s, "allOf");
        if (!json_is_array(all)) return JS_ERR(j, "allOf must be an array");
        json_t *m = json_object();
        json_object_foreach(s, k, v) if (strcmp(k, "allOf")) json_object_set(m, k, v);
        size_t i;
        json_t *x;
        int rc = 0;
        json_array_foreach(all, i, x) if (!rc) rc = merge_into(j, m, x, depth + 1);
        if (!rc) rc = gen_body(j, m, depth + 1, o);
        json_decref(m);
        return rc;
    }
    if (json_object_get(s, "anyOf")) return gen_union(j, s, json_object_get(s, "anyOf"), "anyOf", depth, o);
    if (json_object_get(s, "oneOf")) return gen_union(j, s, json_object_get(s, "oneOf"), "oneOf", depth, o);
    /* the types */
    const char *types[8];
    int nt = 0;
    json_t *t = json_object_get(s, "type");
    static const char *const all_types[] = {"object", "array", "string", "integer", "number", "boolean", "null", NULL};
    if (json_is_string(t)) types[nt++] = json_string_value(t);
    else if (json_is_array(t)) {
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            if (!json_is_string(x) || nt == 7) return JS_ERR(j, "type: expected type names");
            types[nt++] = json_string_value(x);
        }
        if (!nt) return JS_ERR(j, "type: the list is empty");
    } else if (t) return JS_ERR(j, "type must be a string or an array");
    for (int i = 0; i < nt; i++)
        if (!in_list(types[i], all_types)) return JS_ERR(j, "type '%s' is not a JSON Schema type", types[i]);
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && !json_is_array(en)) return JS_ERR(j, "enum must be an array");
        json_t *vals = cn ? json_pack("[O]", cn) : json_incref(en);
        int any = 0;
        size_t i;
        json_t *x;
        json_array_foreach(vals, i, x) {
            if (cn && en) { /* both: const must be in enum */
                int in = 0;
                size_t q;
                json_t *y;
                json_array_foreach(en, q, y) in |= json_equal(x, y);
                if (!in) continue;
            }
            int ok = !nt;
            for (int q = 0; q < nt; q++) ok |= json_type_matches(x, types[q]);
            if (!ok) continue;
            char *lit = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (!lit) continue;
            sg_str_cat(o, any ? " | " : "");
            sg_str_literal(o, lit, strlen(lit));
            free(lit);
            any = 1;
        }
        json_decref(vals);
        if (!any) return JS_ERR(j, "%s: no value satisfies the schema (it matches nothing)", cn ? "const" : "enum");
        return 0;
    }
    if (!nt) { /* infer the type from the keywords */
        if (has_any(s, obj_keys)) types[nt++] = "object";
        if (has_any(s, arr_keys)) types[nt++] = "array";
        if (has_any(s, str_keys)) types[nt++] = "string";
        if (has_any(s, num_keys)) types[nt++] = "number";
        if (!nt) {
            sg_str_cat(o, "value");
            return 0;
        }
    }
    for (int i = 0; i < nt; i++) {
        if (i) sg_str_cat(o, " | ");
        const char *ty = types[i];
        int rc = 0;
        if (!strcmp(ty, "null")) sg_str_cat(o, "\"null\"");
        else if (!strcmp(ty, "boolean")) sg_str_cat(o, "\"true\" | \"false\"");
        else if (!strcmp(ty, "string")) rc = gen_string(j, s, o);
        else if (!strcmp(ty, "integer")) {
            int hl, hh;
            long long lo = 0, hi = 0;
            rc = int_bounds(j, s, &hl, &lo, &hh, &hi);
            if (!rc && (hl || hh)) rc = int_range(j, o, hl, lo, hh, hi);
            else if (!rc) sg_str_cat(o, "integer");
        } else if (!strcmp(ty, "number")) {
            if (has_any(s, num_keys)) rc = number_bounded(j, s, o);
            else sg_str_cat(o, "number");
        } else if (!strcmp(ty, "object")) rc = gen_object(j, s, depth, o);
        else rc = gen_array(j, s, depth, o);
        if (rc) return rc;
    }
    return 0;
}

static int gen_named(js *j, json_t *s, int depth, const char *name) {
    sg_str body = {0};
    int rc = gen_body(j, s, depth, &body);
    if (!rc) emit_rule(j, name, &body);
    free(body.s);
    return rc;
}

static int gen(js *j, json_t *s, int depth, char *name) {
    new_name(j, name);
    char nm[24];
    strcpy(nm, name);
    return gen_named(j, s, depth, nm);
}

static const char *const basics =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* ws )? \"}\"\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\u0000-\\u001F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )\n"
    /* \\uXXXX: no lone surrogates (a high one must be followed by a low one) */
    "uesc ::= [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | "
    "[dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2}\n"
    "kchar ::= [^\"\\\\\\u0000-\\u001F]\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]* )\n";

int sg_json_schema_to_gbnf(const char *schema, size_t len, int json_object_only, int allow_ws, int max_depth,
                           sg_str *out, rp_err *err) {
    js j = {.out = out, .err = err, .max_depth = max_depth > 0 ? max_depth : 64};
    int rc = 0;
    if (json_object_only) {
        sg_str_cat(out, "root ::= object\n");
    } else {
        json_error_t je;
        j.root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
        if (!j.root) return rp_errf(err, "the schema is not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        char name[24];
        rc = gen(&j, j.root, 0, name);
        if (!rc) sg_str_printf(out, "root ::= %s\n", name);
    }
    if (!rc) {
        sg_str_cat(out, basics);
        sg_str_cat(out, allow_ws ? "ws ::= [ \\t\\n\\r]*\n" : "ws ::= \"\"\n");
    }
    for (int i = 0; i < j.n_refs; i++) free(j.refs[i].ref);
    free(j.refs);
    json_decref(j.root);
    if (!rc && out->oom) rc = rp_errf(err, "out of memory");
    return rc;
}
