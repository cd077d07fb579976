/* The grammar builder and its finishing passes (sgrammar.h): byte sets,
 * code point classes to UTF-8 byte sequences, the checks every grammar goes
 * through (undefined rules, empty language, left recursion), inlining of
 * small rules (so that the matcher's per-position token classes see whole
 * lexical loops such as a JSON string's characters, not one-byte rules) and
 * the flat element array the matcher walks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "structured/sgrammar.h"

int sg_ivec_push(sg_ivec *v, int32_t x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        int32_t *nv = realloc(v->v, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

void sg_builder_init(sg_builder *b, long max_elems) {
    memset(b, 0, sizeof *b);
    b->max_elems = max_elems > 0 ? max_elems : 1000000;
}

static void brule_free(sg_brule *r) {
    for (int a = 0; a < r->n_alts; a++) free(r->alts[a].v);
    free(r->alts);
    free(r->name);
}

void sg_builder_free(sg_builder *b) {
    for (int i = 0; i < b->n_rules; i++) brule_free(&b->rules[i]);
    free(b->rules);
    free(b->reps);
    free(b->names);
    free(b->sets);
    memset(b, 0, sizeof *b);
}

static int rule_add(sg_builder *b, char *name, rp_err *err) {
    if (!name) return rp_errf(err, "out of memory");
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 64;
        sg_brule *nr = realloc(b->rules, (size_t)cap * sizeof *nr);
        if (!nr) {
            free(name);
            return rp_errf(err, "out of memory");
        }
        b->rules = nr;
        b->cap_rules = cap;
    }
    memset(&b->rules[b->n_rules], 0, sizeof b->rules[0]);
    b->rules[b->n_rules].name = name;
    return b->n_rules++;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int names_insert(sg_builder *b, int r) {
    if ((uint32_t)(b->n_rules + 1) * 2 > b->names_mask) { /* grow and rehash */
        uint32_t size = b->names_mask ? (b->names_mask + 1) * 2 : 256;
        int32_t *t = calloc(size, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < b->n_rules; i++) {
            if (i == r || b->rules[i].aux) continue;
            uint32_t h = name_hash(b->rules[i].name, strlen(b->rules[i].name)) & (size - 1);
            while (t[h]) h = (h + 1) & (size - 1);
            t[h] = i + 1;
        }
        free(b->names);
        b->names = t;
        b->names_mask = size - 1;
    }
    uint32_t h = name_hash(b->rules[r].name, strlen(b->rules[r].name)) & b->names_mask;
    while (b->names[h]) h = (h + 1) & b->names_mask;
    b->names[h] = r + 1;
    return 0;
}

int sg_rule_named(sg_builder *b, const char *name, size_t len, rp_err *err) {
    if (b->names)
        for (uint32_t h = name_hash(name, len) & b->names_mask; b->names[h]; h = (h + 1) & b->names_mask) {
            const char *nm = b->rules[b->names[h] - 1].name;
            if (strlen(nm) == len && !memcmp(nm, name, len)) return b->names[h] - 1;
        }
    int r = rule_add(b, strndup(name, len), err);
    if (r >= 0 && names_insert(b, r)) return rp_errf(err, "out of memory");
    return r;
}

int sg_rule_aux(sg_builder *b, const char *base, rp_err *err) {
    char buf[96];
    snprintf(buf, sizeof buf, "%.60s-%d", base, ++b->aux_counter);
    int r = rule_add(b, strdup(buf), err);
    if (r >= 0) b->rules[r].defined = 1, b->rules[r].aux = 1; /* not in names: "a-1" may be a user's rule too */
    return r;
}

int sg_add_alt(sg_builder *b, int rule, const int32_t *elems, int n, rp_err *err) {
    sg_brule *r = &b->rules[rule];
    b->total_elems += n + 1;
    if (b->total_elems > b->max_elems)
        return rp_errf(err, "grammar too large: more than %ld elements (max_elements)", b->max_elems);
    if (r->n_alts == r->cap_alts) {
        int cap = r->cap_alts ? r->cap_alts * 2 : 4;
        sg_ivec *na = realloc(r->alts, (size_t)cap * sizeof *na);
        if (!na) return rp_errf(err, "out of memory");
        r->alts = na;
        r->cap_alts = cap;
    }
    sg_ivec *a = &r->alts[r->n_alts];
    memset(a, 0, sizeof *a);
    for (int i = 0; i < n; i++)
        if (sg_ivec_push(a, elems[i])) {
            free(a->v);
            return rp_errf(err, "out of memory");
        }
    r->n_alts++;
    return 0;
}

int32_t sg_elem_set(sg_builder *b, const sg_byteset *s, rp_err *err) {
    for (int i = 0; i < b->n_sets; i++)
        if (!memcmp(&b->sets[i], s, sizeof *s)) return i;
    if (b->n_sets == b->cap_sets) {
        int cap = b->cap_sets ? b->cap_sets * 2 : 64;
        sg_byteset *ns = realloc(b->sets, (size_t)cap * sizeof *ns);
        if (!ns) return rp_errf(err, "out of memory");
        b->sets = ns;
        b->cap_sets = cap;
    }
    b->sets[b->n_sets] = *s;
    return b->n_sets++;
}

int32_t sg_elem_rep(sg_builder *b, int rule, int32_t min, int32_t max, rp_err *err) {
    if (b->n_reps == b->cap_reps) {
        int cap = b->cap_reps ? b->cap_reps * 2 : 16;
        sg_rep *nr = realloc(b->reps, (size_t)cap * sizeof *nr);
        if (!nr) return rp_errf(err, "out of memory");
        b->reps = nr;
        b->cap_reps = cap;
    }
    b->reps[b->n_reps] = (sg_rep){rule, min, max};
    return SG_REP_BASE + b->n_reps++;
}

/* The rule an element references (a reference or a repetition's body), or -1. */
static int elem_rule(const sg_builder *b, int32_t e) {
    if (SG_IS_REF(e)) return SG_REF_RULE(e);
    if (SG_IS_REP(e)) return b->reps[e - SG_REP_BASE].rule;
    return -1;
}

/* ---- code point ranges ---- */

int sg_ranges_add(sg_ranges *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        void *nr = realloc(s->r, (size_t)cap * sizeof s->r[0]);
        if (!nr) return -1;
        s->r = nr;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return 0;
}

static int range_cmp(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void sg_ranges_norm(sg_ranges *s) {
    if (!s->n) return;
    qsort(s->r, (size_t)s->n, sizeof s->r[0], range_cmp);
    int m = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[m][1] + 1) {
            if (s->r[i][1] > s->r[m][1]) s->r[m][1] = s->r[i][1];
        } else {
            s->r[++m][0] = s->r[i][0];
            s->r[m][1] = s->r[i][1];
        }
    }
    s->n = m + 1;
}

int sg_ranges_negate(sg_ranges *s) {
    sg_ranges_norm(s);
    sg_ranges out = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i][0] > next && sg_ranges_add(&out, next, s->r[i][0] - 1)) goto oom;
        next = s->r[i][1] + 1;
    }
    if (next <= 0x10FFFF && sg_ranges_add(&out, next, 0x10FFFF)) goto oom;
    sg_ranges_free(s);
    *s = out;
    return 0;
oom:
    sg_ranges_free(&out);
    return -1;
}

void sg_ranges_free(sg_ranges *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

static int utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)), o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

typedef struct utf8_ctx {
    sg_builder *b;
    int rule;      /* alternatives go here (multi-byte classes) */
    sg_byteset ascii; /* one-byte members collected into one set */
    int has_ascii;
    rp_err *err;
} utf8_ctx;

/* Adds [lo, hi] (same encoded length, each byte position a range) as one
 * alternative, splitting where the ranges are not a product of byte ranges. */
static int utf8_split(utf8_ctx *c, uint32_t lo, uint32_t hi) {
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i])
            return utf8_split(c, lo, bounds[i]) ? -1 : utf8_split(c, bounds[i] + 1, hi);
    if (hi < 0x80) {
        for (uint32_t x = lo; x <= hi; x++) sg_set_add(&c->ascii, x);
        c->has_ascii = 1;
        return 0;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return utf8_split(c, lo, lo | m) ? -1 : utf8_split(c, (lo | m) + 1, hi);
            if ((hi & m) != m) return utf8_split(c, lo, (hi & ~m) - 1) ? -1 : utf8_split(c, hi & ~m, hi);
        }
    }
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, z);
    int32_t el[4];
    for (int j = 0; j < n; j++) {
        sg_byteset s = {{0}};
        for (unsigned x = a[j]; x <= z[j]; x++) sg_set_add(&s, x);
        el[j] = sg_elem_set(c->b, &s, c->err);
        if (el[j] < 0) return -1;
    }
    return sg_add_alt(c->b, c->rule, el, n, c->err);
}

int sg_elem_ranges(sg_builder *b, sg_ranges *s, const char *rule_base, int32_t *elem, rp_err *err) {
    sg_ranges_norm(s);
    /* surrogates are not characters: no valid UTF-8 encodes them */
    sg_ranges clip = {0};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1] > 0x10FFFF ? 0x10FFFF : s->r[i][1];
        if (lo < 0xD800 && hi >= 0xD800) {
            if (sg_ranges_add(&clip, lo, 0xD7FF)) goto oom;
            lo = 0xE000;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
        if (lo <= hi && sg_ranges_add(&clip, lo, hi)) goto oom;
    }
    if (!clip.n) {
        sg_ranges_free(&clip);
        return rp_errf(err, "character class matches no character");
    }
    if (clip.r[clip.n - 1][1] < 0x80) { /* one byte set, no rule */
        sg_byteset set = {{0}};
        for (int i = 0; i < clip.n; i++)
            for (uint32_t x = clip.r[i][0]; x <= clip.r[i][1]; x++) sg_set_add(&set, x);
        sg_ranges_free(&clip);
        *elem = sg_elem_set(b, &set, err);
        return *elem < 0 ? RP_ERR : 0;
    }
    utf8_ctx c = {.b = b, .err = err};
    c.rule = sg_rule_aux(b, rule_base, err);
    if (c.rule < 0) goto fail;
    for (int i = 0; i < clip.n; i++)
        if (utf8_split(&c, clip.r[i][0], clip.r[i][1])) goto fail;
    if (c.has_ascii) {
        int32_t e = sg_elem_set(b, &c.ascii, err);
        if (e < 0 || sg_add_alt(b, c.rule, &e, 1, err)) goto fail;
    }
    sg_ranges_free(&clip);
    *elem = SG_REF(c.rule);
    return 0;
oom:
    rp_errf(err, "out of memory");
fail:
    sg_ranges_free(&clip);
    return RP_ERR;
}

/* ---- finishing ---- */

/* Tarjan's strongly connected components over rule references: recursive[r]
 * when r can reach itself. */
typedef struct scc_ctx {
    sg_builder *b;
    int *index, *low, *stack, *on_stack, *recursive;
    int sp, counter;
} scc_ctx;

static void scc_visit(scc_ctx *c, int v, int depth) {
    /* The result only decides what may be inlined, and inlining keeps the
     * language whatever it decides; past this depth (a chain of thousands
     * of rules) rules are taken as recursive rather than risk the stack. */
    c->index[v] = c->low[v] = c->counter++;
    c->stack[c->sp++] = v;
    c->on_stack[v] = 1;
    sg_brule *r = &c->b->rules[v];
    for (int a = 0; a < r->n_alts; a++)
        for (int i = 0; i < r->alts[a].n; i++) {
            int w = elem_rule(c->b, r->alts[a].v[i]);
            if (w < 0) continue;
            if (w == v) c->recursive[v] = 1;
            if (c->index[w] < 0 && depth > 2000) {
                c->recursive[v] = c->recursive[w] = 1;
            } else if (c->index[w] < 0) {
                scc_visit(c, w, depth + 1);
                if (c->low[w] < c->low[v]) c->low[v] = c->low[w];
            } else if (c->on_stack[w] && c->index[w] < c->low[v]) c->low[v] = c->index[w];
        }
    if (c->low[v] == c->index[v]) {
        int n = 0, w;
        int top = c->sp;
        do {
            w = c->stack[--c->sp];
            c->on_stack[w] = 0;
            n++;
        } while (w != v);
        if (n > 1)
            for (int i = c->sp; i < top; i++) c->recursive[c->stack[i]] = 1;
    }
}

static int *find_recursive(sg_builder *b) {
    int n = b->n_rules;
    scc_ctx c = {.b = b};
    int *buf = malloc((size_t)n * 5 * sizeof(int));
    if (!buf) return NULL;
    c.index = buf, c.low = buf + n, c.stack = buf + 2 * n, c.on_stack = buf + 3 * n, c.recursive = buf + 4 * n;
    for (int i = 0; i < n; i++) c.index[i] = -1, c.on_stack[i] = 0, c.recursive[i] = 0;
    for (int i = 0; i < n; i++)
        if (c.index[i] < 0) scc_visit(&c, i, 0);
    int *rec = malloc((size_t)n * sizeof(int));
    if (rec) memcpy(rec, c.recursive, (size_t)n * sizeof(int));
    free(buf);
    return rec;
}

/* Left recursion: a rule reaching itself through references preceded only by
 * nullable elements. The matcher (top-down) would loop; we refuse. */
static int check_left_recursion(sg_builder *b, const uint8_t *nullable, rp_err *err) {
    int n = b->n_rules;
    uint8_t *color = calloc((size_t)n, 1);
    int *path = malloc((size_t)n * sizeof(int)), *iter_a = malloc((size_t)n * sizeof(int)),
        *iter_i = malloc((size_t)n * sizeof(int));
    int rc = 0;
    if (!color || !path || !iter_a || !iter_i) {
        rc = rp_errf(err, "out of memory");
        goto out;
    }
    for (int s = 0; s < n && !rc; s++) {
        if (color[s]) continue;
        int depth = 0;
        path[0] = s, iter_a[0] = 0, iter_i[0] = 0, color[s] = 1;
        while (depth >= 0 && !rc) {
            int v = path[depth];
            sg_brule *r = &b->rules[v];
            int next = -1;
            while (iter_a[depth] < r->n_alts) {
                sg_ivec *a = &r->alts[iter_a[depth]];
                if (iter_i[depth] >= a->n) {
                    iter_a[depth]++, iter_i[depth] = 0;
                    continue;
                }
                int32_t e = a->v[iter_i[depth]];
                int er = elem_rule(b, e);
                int e_nullable = SG_IS_REF(e) ? nullable[er] : SG_IS_REP(e) ? b->reps[e - SG_REP_BASE].min == 0 : 0;
                if (e_nullable) iter_i[depth]++;
                else iter_a[depth]++, iter_i[depth] = 0; /* stop this alternative after e */
                if (er >= 0) {
                    next = er;
                    break;
                }
            }
            if (next < 0) {
                color[v] = 2;
                depth--;
                continue;
            }
            if (color[next] == 1) {
                char msg[400];
                size_t off = 0;
                int start = 0;
                while (path[start] != next) start++;
                for (int k = start; k <= depth && off < sizeof msg - 80; k++)
                    off += (size_t)snprintf(msg + off, sizeof msg - off, "%s -> ", b->rules[path[k]].name);
                snprintf(msg + off, sizeof msg - off, "%s", b->rules[next].name);
                int all_aux = 1;
                for (int k = start; k <= depth; k++) all_aux &= b->rules[path[k]].aux;
                if (all_aux)
                    rc = rp_errf(err, "left recursion (%s): a repetition whose body can match the empty string", msg);
                else rc = rp_errf(err, "left recursion (%s): rewrite the rule to recurse on the right", msg);
                break;
            }
            if (color[next] == 0) {
                color[next] = 1;
                depth++;
                path[depth] = next, iter_a[depth] = 0, iter_i[depth] = 0;
            }
        }
    }
out:
    free(color), free(path), free(iter_a), free(iter_i);
    return rc;
}

static long rule_size(const sg_brule *r) {
    long s = 0;
    for (int a = 0; a < r->n_alts; a++) s += r->alts[a].n + 1;
    return s;
}

/* Inlines references to small non-recursive rules: R ::= A s B with
 * s ::= x | y becomes R ::= A x B | A y B. */
static int inline_small_rules(sg_builder *b, int root, rp_err *err) {
    for (int pass = 0; pass < 6; pass++) {
        int *rec = find_recursive(b);
        if (!rec) return rp_errf(err, "out of memory");
        uint8_t *inl = calloc((size_t)b->n_rules, 1);
        if (!inl) {
            free(rec);
            return rp_errf(err, "out of memory");
        }
        for (int r = 0; r < b->n_rules; r++)
            inl[r] = r != root && !rec[r] && b->rules[r].n_alts <= 32 && rule_size(&b->rules[r]) <= 64;
        free(rec);
        int changed = 0;
        for (int r = 0; r < b->n_rules; r++) {
            sg_brule *R = &b->rules[r];
            for (int a = 0; a < R->n_alts; a++) {
                sg_ivec *alt = &R->alts[a];
                /* a rule of several alternatives only where it starts the
                 * alternative: inlined after a shared prefix it would make
                 * several parse hypotheses (items) out of one */
                int at = -1;
                for (int i = 0; i < alt->n; i++)
                    if (SG_IS_REF(alt->v[i]) && inl[SG_REF_RULE(alt->v[i])] &&
                        (i == 0 || b->rules[SG_REF_RULE(alt->v[i])].n_alts == 1)) {
                        at = i;
                        break;
                    }
                if (at < 0) continue;
                sg_brule *S = &b->rules[SG_REF_RULE(alt->v[at])];
                if (R->n_alts + S->n_alts - 1 > 256) continue;
                /* replace alt a by one alternative per alternative of S */
                sg_ivec old = *alt;
                int ns = S->n_alts;
                for (int k = 0; k < ns; k++) {
                    sg_ivec nv = {0};
                    int bad = 0;
                    for (int i = 0; i < at; i++) bad |= sg_ivec_push(&nv, old.v[i]);
                    for (int i = 0; i < S->alts[k].n; i++) bad |= sg_ivec_push(&nv, S->alts[k].v[i]);
                    for (int i = at + 1; i < old.n; i++) bad |= sg_ivec_push(&nv, old.v[i]);
                    if (bad) {
                        free(nv.v);
                        return rp_errf(err, "out of memory");
                    }
                    if (k == 0) {
                        R->alts[a] = nv;
                    } else {
                        if (sg_add_alt(b, r, nv.v, nv.n, err)) {
                            free(nv.v);
                            free(old.v);
                            return RP_ERR;
                        }
                        free(nv.v);
                        R = &b->rules[r];
                        S = &b->rules[SG_REF_RULE(old.v[at])];
                    }
                }
                free(old.v);
                changed = 1;
                a--; /* look at the new alternative a again */
            }
        }
        free(inl);
        if (!changed) break;
    }
    return 0;
}

sg_grammar *sg_grammar_finish(sg_builder *b, const char *root_name, rp_err *err) {
    sg_grammar *g = NULL;
    uint8_t *prod = NULL, *nullable = NULL;
    int32_t *newid = NULL, *queue = NULL;
    int n = b->n_rules, root = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(b->rules[i].name, root_name)) root = i;
    if (root < 0 || !b->rules[root].defined) {
        rp_errf(err, "the grammar has no rule named '%s'", root_name);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if (!b->rules[i].defined) {
            rp_errf(err, "%d:%d: rule '%s' is used but never defined", b->rules[i].line, b->rules[i].col,
                    b->rules[i].name);
            goto fail;
        }
    /* productive rules: some alternative made only of sets and productive rules */
    prod = calloc((size_t)n, 1);
    nullable = calloc((size_t)n, 1);
    if (!prod || !nullable) goto oom;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            for (int a = 0; a < b->rules[r].n_alts; a++) {
                sg_ivec *alt = &b->rules[r].alts[a];
                int p = 1, nl = 1;
                for (int i = 0; i < alt->n; i++) {
                    int32_t e = alt->v[i];
                    if (SG_IS_REF(e)) {
                        p &= prod[SG_REF_RULE(e)];
                        nl &= nullable[SG_REF_RULE(e)];
                    } else if (SG_IS_REP(e)) {
                        const sg_rep *rp = &b->reps[e - SG_REP_BASE];
                        p &= rp->min == 0 || prod[rp->rule];
                        nl &= rp->min == 0;
                    } else nl = 0;
                }
                if (p && !prod[r]) prod[r] = 1, changed = 1;
                if (nl && !nullable[r]) nullable[r] = 1, changed = 1;
            }
        }
    }
    if (!prod[root]) {
        rp_errf(err, "the grammar matches no string (rule '%s' never completes)", root_name);
        goto fail;
    }
    for (int i = 0; i < b->n_reps; i++)
        if (nullable[b->reps[i].rule]) {
            rp_errf(err, "a counted repetition {%d,%d} of '%s', which can match the empty string", b->reps[i].min,
                    b->reps[i].max, b->rules[b->reps[i].rule].name);
            goto fail;
        }
    if (check_left_recursion(b, nullable, err)) goto fail;
    for (int r = 0; r < n; r++) { /* drop alternatives that can never complete */
        sg_brule *R = &b->rules[r];
        int m = 0;
        for (int a = 0; a < R->n_alts; a++) {
            int ok = 1;
            for (int i = 0; i < R->alts[a].n; i++) {
                int32_t e = R->alts[a].v[i];
                if (SG_IS_REF(e) && !prod[SG_REF_RULE(e)]) ok = 0;
                if (SG_IS_REP(e) && b->reps[e - SG_REP_BASE].min > 0 && !prod[b->reps[e - SG_REP_BASE].rule]) ok = 0;
            }
            if (ok) R->alts[m++] = R->alts[a];
            else free(R->alts[a].v);
        }
        R->n_alts = m;
    }
    if (inline_small_rules(b, root, err)) goto fail;
    n = b->n_rules;
    /* reachable rules from root, numbered in visiting order */
    newid = malloc((size_t)n * sizeof *newid);
    queue = malloc((size_t)n * sizeof *queue);
    if (!newid || !queue) goto oom;
    for (int i = 0; i < n; i++) newid[i] = -1;
    int qn = 0;
    newid[root] = 0;
    queue[qn++] = root;
    long n_elems = 0, n_alts = 0;
    for (int qi = 0; qi < qn; qi++) {
        sg_brule *R = &b->rules[queue[qi]];
        n_alts += R->n_alts;
        for (int a = 0; a < R->n_alts; a++) {
            n_elems += R->alts[a].n + 1;
            for (int i = 0; i < R->alts[a].n; i++) {
                int er = elem_rule(b, R->alts[a].v[i]);
                if (er >= 0 && newid[er] < 0) {
                    newid[er] = qn;
                    queue[qn++] = er;
                }
            }
        }
    }
    if (n_elems > b->max_elems) {
        rp_errf(err, "grammar too large: %ld elements after inlining (max_elements %ld)", n_elems, b->max_elems);
        goto fail;
    }
    g = calloc(1, sizeof *g);
    if (!g) goto oom;
    g->n_rules = qn;
    g->root = 0;
    g->n_elems = (int)n_elems;
    g->rule_names = calloc((size_t)qn, sizeof(char *));
    g->rule_alt_off = malloc(((size_t)qn + 1) * sizeof(int32_t));
    g->alt_start = malloc(((size_t)n_alts + 1) * sizeof(int32_t));
    g->ekind = malloc((size_t)n_elems + 1);
    g->earg = malloc(((size_t)n_elems + 1) * sizeof(int32_t));
    g->erule = malloc(((size_t)n_elems + 1) * sizeof(int32_t));
    g->erep_min = calloc((size_t)n_elems + 1, sizeof(int32_t));
    g->erep_max = calloc((size_t)n_elems + 1, sizeof(int32_t));
    g->sets = malloc(((size_t)b->n_sets + 1) * sizeof(sg_byteset));
    g->follow_off = calloc((size_t)qn + 2, sizeof(int32_t));
    g->follow_sites = malloc(((size_t)n_elems + 1) * sizeof(int32_t));
    if (!g->rule_names || !g->rule_alt_off || !g->alt_start || !g->ekind || !g->earg || !g->erule || !g->erep_min || !g->erep_max || !g->sets ||
        !g->follow_off || !g->follow_sites)
        goto oom;
    memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof(sg_byteset));
    g->n_sets = b->n_sets;
    int ai = 0, ei = 0;
    for (int r = 0; r < qn; r++) {
        sg_brule *R = &b->rules[queue[r]];
        g->rule_names[r] = R->name;
        R->name = NULL;
        g->rule_alt_off[r] = ai;
        for (int a = 0; a < R->n_alts; a++) {
            g->alt_start[ai++] = ei;
            for (int i = 0; i < R->alts[a].n; i++) {
                int32_t e = R->alts[a].v[i];
                if (SG_IS_REP(e)) {
                    const sg_rep *rp = &b->reps[e - SG_REP_BASE];
                    g->ekind[ei] = SG_E_REP;
                    g->earg[ei] = newid[rp->rule];
                    g->erep_min[ei] = rp->min;
                    g->erep_max[ei] = rp->max;
                } else {
                    g->ekind[ei] = SG_IS_REF(e) ? SG_E_REF : SG_E_SET;
                    g->earg[ei] = SG_IS_REF(e) ? newid[SG_REF_RULE(e)] : e;
                }
                g->erule[ei++] = r;
            }
            g->ekind[ei] = SG_E_END;
            g->earg[ei] = 0;
            g->erule[ei++] = r;
        }
    }
    g->rule_alt_off[qn] = ai;
    /* reference sites; a rule's own tail call adds nothing to what follows it */
#define FOLLOW_SITE(q)                                                                                   \
    (g->ekind[q] == SG_E_REP || (g->ekind[q] == SG_E_REF && !(g->earg[q] == g->erule[q] && g->ekind[q + 1] == SG_E_END)))
    for (int q = 0; q < g->n_elems; q++)
        if (FOLLOW_SITE(q)) g->follow_off[g->earg[q] + 1]++;
    for (int r = 0; r < qn; r++) g->follow_off[r + 1] += g->follow_off[r];
    int32_t *fill = calloc((size_t)qn + 1, sizeof(int32_t));
    if (!fill) goto oom;
    for (int q = 0; q < g->n_elems; q++)
        if (FOLLOW_SITE(q)) {
            int r = g->earg[q];
            g->follow_sites[g->follow_off[r] + fill[r]++] = q;
        }
    free(fill);
    free(prod), free(nullable), free(newid), free(queue);
    sg_builder_free(b);
    return g;
oom:
    rp_errf(err, "out of memory");
fail:
    free(prod), free(nullable), free(newid), free(queue);
    sg_grammar_free(g);
    sg_builder_free(b);
    return NULL;
}

void sg_grammar_free(sg_grammar *g) {
    if (!g) return;
    if (g->rule_names)
        for (int i = 0; i < g->n_rules; i++) free(g->rule_names[i]);
    free(g->rule_names), free(g->rule_alt_off), free(g->alt_start), free(g->ekind), free(g->earg);
    free(g->erule), free(g->erep_min), free(g->erep_max), free(g->sets), free(g->follow_off), free(g->follow_sites);
    free(g);
}

/* ---- growing strings ---- */

static void str_reserve(sg_str *s, size_t extra) {
    if (s->oom || s->n + extra + 1 <= s->cap) return;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < s->n + extra + 1) cap *= 2;
    char *ns = realloc(s->s, cap);
    if (!ns) {
        s->oom = 1;
        return;
    }
    s->s = ns;
    s->cap = cap;
}

void sg_str_catn(sg_str *s, const char *t, size_t n) {
    str_reserve(s, n);
    if (s->oom) return;
    memcpy(s->s + s->n, t, n);
    s->n += n;
    s->s[s->n] = 0;
}

void sg_str_cat(sg_str *s, const char *t) { sg_str_catn(s, t, strlen(t)); }

void sg_str_printf(sg_str *s, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n > 0) {
        str_reserve(s, (size_t)n);
        if (!s->oom) {
            vsnprintf(s->s + s->n, (size_t)n + 1, fmt, ap2);
            s->n += (size_t)n;
        }
    }
    va_end(ap2);
}

void sg_str_literal(sg_str *s, const char *t, size_t n) {
    sg_str_cat(s, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '"' || c == '\\') {
            char e[3] = {'\\', (char)c, 0};
            sg_str_cat(s, e);
        } else if (c < 0x20 || c == 0x7F) { /* bytes >= 0x80 stay as they are (UTF-8 text) */
            sg_str_printf(s, "\\x%02X", c);
        } else sg_str_catn(s, (const char *)&t[i], 1);
    }
    sg_str_cat(s, "\"");
}
