/* The structured-output API (structured.h): the vocabulary and its byte trie,
 * compiling a constraint (to GBNF, to a grammar, then the per-position token
 * classes), the compiled-grammar cache, and the matcher with its masks.
 *
 * Token classes (after xgrammar's "context-independent tokens"): for every
 * grammar position that can be the top of a stack, the vocabulary trie is
 * walked from that position alone, with the caller unknown (pda.h's
 * markers). A token consumed entirely inside the position's rule (or ending
 * exactly where the rule may end) is accepted whatever the stack below; one
 * that dies inside the rule, or in every place the rule is referenced (three
 * levels of callers are tried), is rejected whatever the stack; the rest are
 * uncertain and checked at mask time against the real stack, a trie walk
 * over just those tokens whose result is memoised per stack node. The
 * classes are stored as whichever is smallest: accepted ids, rejected ids or
 * a bitmask. Positions inside a counted repetition's body are classified per
 * (clipped) count; classes not made within compile's budget are made when a
 * mask first needs them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "structured/pda.h"
#include "structured/sgrammar.h"
#include "structured/structured.h"

#define FOLLOW_LEVELS 3 /* marker levels tried before a walk escapes */
#define LIST_MAX 2048   /* past this many ids a class is stored as a bitmask */
#define CACHE_MAX 32    /* compiled grammars kept per vocabulary */
/* Counts of a repetition are told apart up to this many iterations when
 * classifying its body (further is "at least"): tokens of more iterations
 * than that are uncertain there, checked against the real count. */
#define REP_CLIP 32
#define KEYED_BUCKETS 4096

typedef struct trie_node {
    int32_t first_child, n_children; /* children are contiguous */
    int32_t lo, hi;                  /* sorted token indices in the subtree */
    int32_t end_hi;                  /* [lo, end_hi): tokens ending exactly here */
    uint8_t byte;
} trie_node;

typedef struct cache_entry {
    rp_skind kind;
    rp_sopts opts;
    char *text;
    size_t len;
    rp_sgrammar *g;
} cache_entry;

struct rp_svocab {
    int n_tokens, mask_words;
    const uint8_t **tok;
    uint32_t *tok_len;
    char *blob;
    uint8_t *special;
    int32_t *eos;
    int n_eos;
    int n_sorted;
    uint32_t max_len; /* the longest token, in bytes */
    int32_t *sorted; /* token ids of the trie, in byte order */
    trie_node *trie;
    int n_trie;
    uint32_t *normal; /* mask of every trie token */
    pthread_mutex_t lock;
    cache_entry cache[CACHE_MAX];
    int n_cache;
};

enum { CLS_ACCEPT_LIST = 0, CLS_REJECT_LIST = 1, CLS_BITS = 2 };

typedef struct pos_class {
    uint8_t mode;
    int32_t n; /* list length */
    int32_t *ids;
    uint32_t *bits;
    int32_t n_unc;
    int32_t *unc; /* sorted indices */
} pos_class;

typedef struct walk_frame {
    int32_t t, state;
    int32_t child; /* next child to visit */
    uint8_t esc;
} walk_frame;

typedef struct cls_scratch {
    int32_t *acc, *unc;
    int n_acc, n_unc;
    uint8_t *mark;
    walk_frame *stack;
    int cap_stack;
} cls_scratch;

/* The classes of a position in a repetition's body, for one (clipped) count. */
typedef struct keyed_class {
    int32_t pos, q, need, room;
    pos_class cls;
    struct keyed_class *next;
} keyed_class;

struct rp_sgrammar {
    int refs;
    rp_svocab *v;
    sg_grammar *g;
    char *gbnf;
    pos_class *cls; /* per element; only byte-set positions are filled */
    uint8_t *ready; /* per element: cls is computed (atomic; see ensure_class) */
    /* for classes computed after compile: under lock */
    pthread_mutex_t lock;
    int lock_ok;
    pda cpda;
    cls_scratch cs;
    keyed_class **keyed; /* KEYED_BUCKETS chains, under lock */
};

/* ---- vocabulary ---- */

static int cmp_tok(const void *a, const void *b, void *ctx) {
    const rp_svocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->tok_len[x], ly = v->tok_len[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->tok[x], v->tok[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_trie(rp_svocab *v) {
    int cap = 1024;
    v->trie = malloc((size_t)cap * sizeof *v->trie);
    if (!v->trie) return -1;
    v->trie[0] = (trie_node){.lo = 0, .hi = v->n_sorted};
    v->n_trie = 1;
    int32_t *depth = malloc((size_t)cap * sizeof *depth);
    if (!depth) return -1;
    depth[0] = 0;
    for (int i = 0; i < v->n_trie; i++) { /* breadth first: children land contiguous */
        trie_node *t = &v->trie[i];
        int d = depth[i], k = t->lo;
        while (k < t->hi && (int)v->tok_len[v->sorted[k]] == d) k++;
        t->end_hi = k;
        t->first_child = v->n_trie;
        t->n_children = 0;
        while (k < t->hi) {
            uint8_t b = v->tok[v->sorted[k]][d];
            int e = k;
            while (e < t->hi && v->tok[v->sorted[e]][d] == b) e++;
            if (v->n_trie == cap) {
                cap *= 2;
                trie_node *nt = realloc(v->trie, (size_t)cap * sizeof *nt);
                int32_t *nd = realloc(depth, (size_t)cap * sizeof *nd);
                if (nt) v->trie = nt;
                if (nd) depth = nd;
                if (!nt || !nd) {
                    free(depth);
                    return -1;
                }
                t = &v->trie[i];
            }
            v->trie[v->n_trie] = (trie_node){.lo = k, .hi = e, .byte = b};
            depth[v->n_trie++] = d + 1;
            t->n_children++;
            k = e;
        }
    }
    free(depth);
    return 0;
}

rp_svocab *rp_svocab_new(int n_tokens, const char *const *bytes, const size_t *lens, const uint8_t *is_special,
                         const int32_t *eos_ids, int n_eos, rp_err *err) {
    if (n_tokens <= 0) return rp_errf(err, "vocabulary is empty"), NULL;
    rp_svocab *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    v->n_tokens = n_tokens;
    v->mask_words = (n_tokens + 31) / 32;
    size_t total = 0;
    for (int i = 0; i < n_tokens; i++) total += bytes[i] ? lens[i] : 0;
    v->blob = malloc(total + 1);
    v->tok = calloc((size_t)n_tokens, sizeof *v->tok);
    v->tok_len = calloc((size_t)n_tokens, sizeof *v->tok_len);
    v->special = calloc((size_t)n_tokens, 1);
    v->eos = malloc(((size_t)n_eos + 1) * sizeof *v->eos);
    v->sorted = malloc((size_t)n_tokens * sizeof *v->sorted);
    v->normal = calloc((size_t)v->mask_words, sizeof *v->normal);
    if (!v->blob || !v->tok || !v->tok_len || !v->special || !v->eos || !v->sorted || !v->normal) goto oom;
    size_t off = 0;
    for (int i = 0; i < n_tokens; i++) {
        v->tok[i] = (const uint8_t *)v->blob + off;
        if (bytes[i]) {
            memcpy(v->blob + off, bytes[i], lens[i]);
            v->tok_len[i] = (uint32_t)lens[i];
            off += lens[i];
            if (v->tok_len[i] > v->max_len) v->max_len = v->tok_len[i];
        }
        v->special[i] = is_special ? is_special[i] : 0;
        if (!v->special[i] && v->tok_len[i]) v->sorted[v->n_sorted++] = i;
    }
    for (int i = 0; i < n_eos; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= n_tokens) {
            rp_errf(err, "eos id %d is outside the vocabulary", eos_ids[i]);
            rp_svocab_free(v);
            return NULL;
        }
        v->eos[v->n_eos++] = eos_ids[i];
        v->special[eos_ids[i]] = 1; /* eos is never a text token */
    }
    int m = 0; /* drop eos ids from the trie */
    for (int i = 0; i < v->n_sorted; i++)
        if (!v->special[v->sorted[i]]) v->sorted[m++] = v->sorted[i];
    v->n_sorted = m;
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof(int32_t), cmp_tok, v);
    for (int i = 0; i < v->n_sorted; i++) v->normal[v->sorted[i] >> 5] |= 1u << (v->sorted[i] & 31);
    if (build_trie(v)) goto oom;
    pthread_mutex_init(&v->lock, NULL);
    return v;
oom:
    rp_svocab_free(v);
    rp_errf(err, "out of memory");
    return NULL;
}

static void grammar_destroy(rp_sgrammar *g);

void rp_svocab_free(rp_svocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_cache; i++) {
        free(v->cache[i].text);
        rp_sgrammar_release(v->cache[i].g);
    }
    if (v->trie) pthread_mutex_destroy(&v->lock);
    free(v->tok), free(v->tok_len), free(v->blob), free(v->special), free(v->eos), free(v->sorted);
    free(v->trie), free(v->normal);
    free(v);
}

int rp_svocab_n_tokens(const rp_svocab *v) { return v->n_tokens; }
int rp_svocab_mask_words(const rp_svocab *v) { return v->mask_words; }

/* ---- per-position token classes ---- */

/* Walks the trie from state s0 (one item: the position, its caller unknown)
 * and stores the classes in *pc. */
static int classify(rp_sgrammar *sg, pda *p, int32_t s0, pos_class *pc, cls_scratch *cs, rp_err *err) {
    const rp_svocab *v = sg->v;
    cs->n_acc = cs->n_unc = 0;
    if (s0 == PDA_DEAD) return rp_errf(err, "out of memory");
    int sp = 0;
    cs->stack[sp++] = (walk_frame){.t = 0, .state = s0, .child = 0, .esc = 0};
    while (sp) {
        walk_frame *f = &cs->stack[sp - 1];
        const trie_node *t = &v->trie[f->t];
        if (f->child >= t->n_children) {
            sp--;
            continue;
        }
        const trie_node *c = &v->trie[t->first_child + f->child++];
        int32_t s = pda_step(p, f->state, c->byte);
        uint8_t esc = f->esc;
        if (s == PDA_DEAD) {
            if (p->oom) return rp_errf(err, "out of memory");
            if (esc)
                for (int32_t k = c->lo; k < c->hi; k++) cs->unc[cs->n_unc++] = k;
            continue;
        }
        int fl = p->sflags[s];
        int accept = fl & (PDA_UNTAINTED | PDA_POP0);
        for (int32_t k = c->lo; k < c->end_hi; k++) {
            if (accept) cs->acc[cs->n_acc++] = k;
            else cs->unc[cs->n_unc++] = k;
        }
        if (c->n_children) {
            if (sp == cs->cap_stack) {
                int cap = cs->cap_stack * 2;
                walk_frame *ns = realloc(cs->stack, (size_t)cap * sizeof *ns);
                if (!ns) return rp_errf(err, "out of memory");
                cs->stack = ns;
                cs->cap_stack = cap;
            }
            cs->stack[sp++] = (walk_frame){.t = (int32_t)(c - v->trie), .state = s, .child = 0,
                                           .esc = (uint8_t)(esc || (fl & PDA_ESCAPE))};
        }
    }
    /* the uncertain list is in walk order (trie depth first = sorted order) */
    int n_rej = v->n_sorted - cs->n_acc - cs->n_unc;
    pc->n_unc = cs->n_unc;
    if (cs->n_unc) {
        pc->unc = malloc((size_t)cs->n_unc * sizeof(int32_t));
        if (!pc->unc) return rp_errf(err, "out of memory");
        memcpy(pc->unc, cs->unc, (size_t)cs->n_unc * sizeof(int32_t));
    }
    if (cs->n_acc <= LIST_MAX || cs->n_acc <= n_rej) {
        pc->mode = CLS_ACCEPT_LIST;
        pc->n = cs->n_acc;
        pc->ids = malloc(((size_t)cs->n_acc + 1) * sizeof(int32_t));
        if (!pc->ids) return rp_errf(err, "out of memory");
        for (int i = 0; i < cs->n_acc; i++) pc->ids[i] = v->sorted[cs->acc[i]];
        if (cs->n_acc > LIST_MAX) goto bits;
        return 0;
    }
    if (n_rej <= LIST_MAX) {
        memset(cs->mark, 0, (size_t)v->n_sorted);
        for (int i = 0; i < cs->n_acc; i++) cs->mark[cs->acc[i]] = 1;
        for (int i = 0; i < cs->n_unc; i++) cs->mark[cs->unc[i]] = 1;
        pc->mode = CLS_REJECT_LIST;
        pc->ids = malloc(((size_t)n_rej + 1) * sizeof(int32_t));
        if (!pc->ids) return rp_errf(err, "out of memory");
        pc->n = 0;
        for (int i = 0; i < v->n_sorted; i++)
            if (!cs->mark[i]) pc->ids[pc->n++] = v->sorted[i];
        return 0;
    }
bits:
    free(pc->ids);
    pc->ids = NULL;
    pc->mode = CLS_BITS;
    pc->bits = calloc((size_t)v->mask_words, sizeof(uint32_t));
    if (!pc->bits) return rp_errf(err, "out of memory");
    for (int i = 0; i < cs->n_acc; i++) {
        int32_t id = v->sorted[cs->acc[i]];
        pc->bits[id >> 5] |= 1u << (id & 31);
    }
    return 0;
}

static const pos_class *keyed_class_for(rp_sgrammar *sg, int32_t pos, int32_t q, int32_t need, int32_t room);

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Classes of the byte-set positions, in element order, until budget_ms is
 * spent (< 0: none); the rest are classified when a mask first needs them
 * (ensure_class), so that a grammar with many positions (a long counted
 * repetition) compiles quickly and pays only for the positions it visits. */
static int precompute(rp_sgrammar *sg, double budget_ms, rp_err *err) {
    const sg_grammar *g = sg->g;
    sg->cls = calloc((size_t)g->n_elems, sizeof *sg->cls);
    sg->ready = calloc((size_t)g->n_elems, 1);
    sg->keyed = calloc(KEYED_BUCKETS, sizeof *sg->keyed);
    if (!sg->cls || !sg->ready || !sg->keyed) return rp_errf(err, "out of memory");
    if (pda_init(&sg->cpda, g, FOLLOW_LEVELS, REP_CLIP)) return rp_errf(err, "out of memory");
    int n = sg->v->n_sorted + 1;
    cls_scratch *cs = &sg->cs;
    cs->acc = malloc((size_t)n * sizeof(int32_t));
    cs->unc = malloc((size_t)n * sizeof(int32_t));
    cs->mark = malloc((size_t)n);
    cs->cap_stack = 256;
    cs->stack = malloc((size_t)cs->cap_stack * sizeof *cs->stack);
    if (!cs->acc || !cs->unc || !cs->mark || !cs->stack) return rp_errf(err, "out of memory");
    pthread_mutex_init(&sg->lock, NULL);
    sg->lock_ok = 1;
    double t0 = now_ms();
    int32_t pos = 0;
    for (; pos < g->n_elems && budget_ms >= 0; pos++) {
        if (g->ekind[pos] != SG_E_SET) continue;
        if (classify(sg, &sg->cpda, pda_start_at(&sg->cpda, pos), &sg->cls[pos], cs, err)) return -1;
        sg->ready[pos] = 1;
        if (now_ms() - t0 > budget_ms) return 0;
    }
    /* then each repetition's body at its starting count, which a long
     * repetition keeps until it nears its bounds */
    for (int32_t q = 0; q < g->n_elems && budget_ms >= 0; q++) {
        if (g->ekind[q] != SG_E_REP) continue;
        int r = g->earg[q];
        int32_t lo = g->alt_start[g->rule_alt_off[r]];
        int32_t hi = r + 1 < g->n_rules ? g->alt_start[g->rule_alt_off[r + 1]] : g->n_elems;
        for (int32_t p = lo; p < hi; p++) {
            if (g->ekind[p] != SG_E_SET) continue;
            keyed_class_for(sg, p, q, g->erep_min[q], g->erep_max[q]);
            if (now_ms() - t0 > budget_ms) return 0;
        }
    }
    return 0;
}

/* The classes of pos, computed now if compile left them for later. 0, or -1
 * when out of memory (the position's tokens then stay masked: safe). */
static int ensure_class(rp_sgrammar *sg, int32_t pos) {
    if (__atomic_load_n(&sg->ready[pos], __ATOMIC_ACQUIRE)) return 0;
    pthread_mutex_lock(&sg->lock);
    int rc = 0;
    if (!sg->ready[pos]) {
        rp_err err = {0};
        rc = classify(sg, &sg->cpda, pda_start_at(&sg->cpda, pos), &sg->cls[pos], &sg->cs, &err);
        if (!rc) __atomic_store_n(&sg->ready[pos], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&sg->lock);
    return rc;
}

static void grammar_destroy(rp_sgrammar *g) {
    if (!g) return;
    if (g->keyed)
        for (int b = 0; b < KEYED_BUCKETS; b++)
            for (keyed_class *k = g->keyed[b], *nx; k; k = nx) {
                nx = k->next;
                free(k->cls.ids), free(k->cls.bits), free(k->cls.unc), free(k);
            }
    free(g->keyed);
    if (g->cls && g->g)
        for (int i = 0; i < g->g->n_elems; i++) free(g->cls[i].ids), free(g->cls[i].bits), free(g->cls[i].unc);
    free(g->cls), free(g->ready);
    free(g->cs.acc), free(g->cs.unc), free(g->cs.mark), free(g->cs.stack);
    pda_free(&g->cpda);
    if (g->lock_ok) pthread_mutex_destroy(&g->lock);
    sg_grammar_free(g->g);
    free(g->gbnf);
    free(g);
}

void rp_sgrammar_release(rp_sgrammar *g) {
    if (g && __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) == 0) grammar_destroy(g);
}

const char *rp_sgrammar_gbnf(const rp_sgrammar *g) { return g->gbnf; }

static int32_t clip_count(int32_t x) { return x < 0 ? x : x > REP_CLIP ? (REP_CLIP | PDA_GE) : x; }

/* The classes of pos inside the body of repetition q with need/room
 * iterations to go (exact counts, clipped here), made on first use. */
static const pos_class *keyed_class_for(rp_sgrammar *sg, int32_t pos, int32_t q, int32_t need, int32_t room) {
    need = clip_count(need), room = clip_count(room);
    uint32_t h = ((uint32_t)pos * 2654435761u ^ (uint32_t)q * 40503u ^ (uint32_t)need * 97u ^ (uint32_t)room) %
                 KEYED_BUCKETS;
    pthread_mutex_lock(&sg->lock);
    keyed_class *k = sg->keyed[h];
    while (k && !(k->pos == pos && k->q == q && k->need == need && k->room == room)) k = k->next;
    if (!k && (k = calloc(1, sizeof *k))) {
        rp_err err = {0};
        *k = (keyed_class){.pos = pos, .q = q, .need = need, .room = room};
        int32_t s0 = pda_start_in_rep(&sg->cpda, pos, q, need, room);
        if (classify(sg, &sg->cpda, s0, &k->cls, &sg->cs, &err)) {
            free(k->cls.ids), free(k->cls.bits), free(k->cls.unc), free(k);
            k = NULL;
        } else {
            k->next = sg->keyed[h];
            sg->keyed[h] = k;
        }
    }
    pthread_mutex_unlock(&sg->lock);
    return k ? &k->cls : NULL;
}

/* ---- compile ---- */

static int choice_to_gbnf(const char *text, size_t len, sg_str *out, rp_err *err) {
    json_error_t je;
    json_t *a = json_loadb(text, len, 0, &je);
    if (!a) return rp_errf(err, "choice: not JSON (%s)", je.text);
    if (!json_is_array(a) || !json_array_size(a)) {
        json_decref(a);
        return rp_errf(err, "choice: expected a non-empty array of strings");
    }
    sg_str_cat(out, "root ::= ");
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *s = json_array_get(a, i);
        if (!json_is_string(s)) {
            json_decref(a);
            return rp_errf(err, "choice: element %zu is not a string", i);
        }
        if (i) sg_str_cat(out, " | ");
        sg_str_literal(out, json_string_value(s), json_string_length(s));
    }
    sg_str_cat(out, "\n");
    json_decref(a);
    return 0;
}

static rp_sgrammar *compile_new(rp_svocab *v, rp_skind kind, const char *text, size_t len, const rp_sopts *o,
                                rp_err *err) {
    sg_str gb = {0};
    int rc = 0;
    int depth = o && o->max_depth > 0 ? o->max_depth : 64;
    long max_el = o && o->max_elements > 0 ? o->max_elements : 1000000;
    int ws = o ? o->allow_whitespace : 0;
    switch (kind) {
    case RP_SKIND_JSON_SCHEMA: rc = sg_json_schema_to_gbnf(text, len, 0, ws, depth, &gb, err); break;
    case RP_SKIND_JSON_OBJECT: rc = sg_json_schema_to_gbnf(NULL, 0, 1, ws, depth, &gb, err); break;
    case RP_SKIND_REGEX:
        sg_str_cat(&gb, "root ::= ");
        rc = sg_regex_to_gbnf(text, len, 0, &gb, err);
        sg_str_cat(&gb, "\n");
        break;
    case RP_SKIND_CHOICE: rc = choice_to_gbnf(text, len, &gb, err); break;
    case RP_SKIND_GBNF: sg_str_catn(&gb, text, len); break;
    default: rc = rp_errf(err, "unknown constraint kind %d", (int)kind);
    }
    if (!rc && gb.oom) rc = rp_errf(err, "out of memory");
    if (rc) {
        free(gb.s);
        return NULL;
    }
    rp_sgrammar *g = calloc(1, sizeof *g);
    if (!g) {
        free(gb.s);
        rp_errf(err, "out of memory");
        return NULL;
    }
    g->refs = 1;
    g->v = v;
    g->gbnf = gb.s ? gb.s : strdup("");
    g->g = sg_parse_gbnf(g->gbnf, strlen(g->gbnf), max_el, err);
    double budget = !o || !o->precompute_ms ? 100.0 : o->precompute_ms < 0 ? -1.0 : (double)o->precompute_ms;
    if (!g->g || precompute(g, budget, err)) {
        grammar_destroy(g);
        return NULL;
    }
    return g;
}

rp_sgrammar *rp_sgrammar_compile(rp_svocab *v, rp_skind kind, const char *text, size_t len, const rp_sopts *opts,
                                 rp_err *err) {
    rp_sopts key = {0};
    if (opts) key = *opts;
    key.precompute_ms = 0; /* timing only: the classes are the same */
    if (!text) text = "", len = 0;
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < v->n_cache; i++) {
        cache_entry *e = &v->cache[i];
        if (e->kind == kind && !memcmp(&e->opts, &key, sizeof key) && e->len == len && !memcmp(e->text, text, len)) {
            rp_sgrammar *g = e->g;
            __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
            pthread_mutex_unlock(&v->lock);
            return g;
        }
    }
    pthread_mutex_unlock(&v->lock);
    /* compiled outside the lock: another thread may compile the same text at
     * the same time; the cache then keeps the first */
    rp_sgrammar *g = compile_new(v, kind, text, len, opts, err);
    if (!g) return NULL;
    char *copy = malloc(len + 1);
    if (!copy) return g;
    memcpy(copy, text, len);
    pthread_mutex_lock(&v->lock);
    if (v->n_cache == CACHE_MAX) { /* evict the oldest */
        free(v->cache[0].text);
        rp_sgrammar_release(v->cache[0].g);
        memmove(v->cache, v->cache + 1, (CACHE_MAX - 1) * sizeof v->cache[0]);
        v->n_cache--;
    }
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    v->cache[v->n_cache++] = (cache_entry){.kind = kind, .opts = key, .text = copy, .len = len, .g = g};
    pthread_mutex_unlock(&v->lock);
    return g;
}

/* ---- matcher ---- */

#define HIST_FINISHED (-3)

typedef struct unc_memo {
    int32_t *ids; /* accepted uncertain token ids for this stack node */
    int32_t n;    /* -1: not computed */
    const pos_class *cls; /* the node's classes; NULL: not looked up */
} unc_memo;

struct rp_smatcher {
    rp_sgrammar *g;
    pda p;
    int32_t *hist;
    int n_hist, cap_hist;
    uint32_t *tmp;
    unc_memo *memo;
    int cap_memo;
    int32_t *walk; /* states along an uncertain-token walk */
};

rp_smatcher *rp_smatcher_new(rp_sgrammar *g, rp_err *err) {
    rp_smatcher *m = calloc(1, sizeof *m);
    if (!m) return rp_errf(err, "out of memory"), NULL;
    m->g = g;
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    m->cap_hist = 64;
    m->hist = malloc((size_t)m->cap_hist * sizeof *m->hist);
    m->tmp = malloc((size_t)g->v->mask_words * sizeof *m->tmp);
    m->walk = malloc(((size_t)g->v->max_len + 2) * sizeof *m->walk);
    if (!m->hist || !m->tmp || !m->walk || pda_init(&m->p, g->g, 0, 0)) goto oom;
    int32_t s = pda_start(&m->p);
    if (s == PDA_DEAD) goto oom;
    m->hist[m->n_hist++] = s;
    return m;
oom:
    rp_smatcher_free(m);
    rp_errf(err, "out of memory");
    return NULL;
}

void rp_smatcher_free(rp_smatcher *m) {
    if (!m) return;
    for (int i = 0; i < m->cap_memo; i++) free(m->memo[i].ids);
    free(m->memo), free(m->hist), free(m->tmp), free(m->walk);
    pda_free(&m->p);
    rp_sgrammar_release(m->g);
    free(m);
}

static int hist_push(rp_smatcher *m, int32_t s) {
    if (m->n_hist == m->cap_hist) {
        int32_t *h = realloc(m->hist, (size_t)m->cap_hist * 2 * sizeof *h);
        if (!h) return -1;
        m->hist = h;
        m->cap_hist *= 2;
    }
    m->hist[m->n_hist++] = s;
    return 0;
}

static int is_eos(const rp_svocab *v, int32_t id) {
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return 1;
    return 0;
}

int rp_smatcher_is_finished(const rp_smatcher *m) { return m->hist[m->n_hist - 1] == HIST_FINISHED; }

int rp_smatcher_is_accepting(const rp_smatcher *m) {
    int32_t s = m->hist[m->n_hist - 1];
    return s == HIST_FINISHED || (m->p.sflags[s] & PDA_ACCEPT);
}

int rp_smatcher_is_dead(const rp_smatcher *m) {
    int32_t s = m->hist[m->n_hist - 1];
    if (s == HIST_FINISHED) return 0;
    return !(m->p.sflags[s] & PDA_ACCEPT) && m->p.soff[s + 1] == m->p.soff[s];
}

int rp_smatcher_accept_bytes(rp_smatcher *m, const char *bytes, size_t len) {
    int32_t s = m->hist[m->n_hist - 1];
    if (s == HIST_FINISHED) return -1;
    for (size_t i = 0; i < len; i++) {
        s = pda_step(&m->p, s, (uint8_t)bytes[i]);
        if (s == PDA_DEAD) return -1;
    }
    return hist_push(m, s);
}

int rp_smatcher_accept_token(rp_smatcher *m, int32_t id) {
    const rp_svocab *v = m->g->v;
    if (id < 0 || id >= v->n_tokens || rp_smatcher_is_finished(m)) return -1;
    if (v->special[id]) {
        if (is_eos(v, id) && rp_smatcher_is_accepting(m)) return hist_push(m, HIST_FINISHED);
        return -1;
    }
    if (!v->tok_len[id]) return -1;
    return rp_smatcher_accept_bytes(m, (const char *)v->tok[id], v->tok_len[id]);
}

void rp_smatcher_rollback(rp_smatcher *m, int n) {
    if (n < 0) return;
    m->n_hist = n >= m->n_hist ? 1 : m->n_hist - n;
}

/* The uncertain tokens of node's position that the real stack accepts,
 * memoised per node (equal stacks are equal nodes). */
static unc_memo *memo_for(rp_smatcher *m, int32_t node) {
    if (node >= m->cap_memo) {
        int cap = m->cap_memo ? m->cap_memo : 1024;
        while (cap <= node) cap *= 2;
        unc_memo *nm = realloc(m->memo, (size_t)cap * sizeof *nm);
        if (!nm) return NULL;
        for (int i = m->cap_memo; i < cap; i++) nm[i] = (unc_memo){NULL, -1, NULL};
        m->memo = nm;
        m->cap_memo = cap;
    }
    return &m->memo[node];
}

/* The classes of an item: by position, or, for a position in a counted
 * repetition's body right above its count, by position and count. */
static const pos_class *class_for(rp_smatcher *m, int32_t node) {
    unc_memo *u = memo_for(m, node);
    if (!u) return NULL;
    if (u->cls) return u->cls;
    const sg_grammar *g = m->g->g;
    int32_t pos = m->p.npos[node], par = m->p.npar[node];
    if (par >= 0 && m->p.npos[par] >= g->n_elems) {
        int v = m->p.npos[par] - g->n_elems;
        int32_t q = m->p.vq[v];
        if (g->erule[pos] == g->earg[q]) return u->cls = keyed_class_for(m->g, pos, q, m->p.vneed[v], m->p.vroom[v]);
    }
    if (ensure_class(m->g, pos)) return NULL;
    return u->cls = &m->g->cls[pos];
}

/* The node the uncertain-token memo is kept under: node itself, or, above a
 * repetition count, the same stack with counts past the longest token
 * clipped (a walk of one token cannot tell them apart), so that a long
 * counted string reuses the walk from one character to the next. */
static int32_t memo_node(rp_smatcher *m, int32_t node) {
    const sg_grammar *g = m->g->g;
    int32_t par = m->p.npar[node];
    if (par < 0 || m->p.npos[par] < g->n_elems) return node;
    int v = m->p.npos[par] - g->n_elems;
    int32_t lim = (int32_t)m->g->v->max_len + 1, need = m->p.vneed[v], room = m->p.vroom[v];
    int32_t need2 = need > lim ? lim : need, room2 = room > lim ? lim : room;
    if (need2 == need && room2 == room) return node;
    int32_t canon = pda_rep_node(&m->p, m->p.vq[v], need2, room2, m->p.npar[par]);
    return m->p.oom ? node : pda_node(&m->p, m->p.npos[node], canon);
}

static const unc_memo *uncertain_for(rp_smatcher *m, int32_t node, const pos_class *pc) {
    unc_memo *u = memo_for(m, memo_node(m, node));
    if (!u) return NULL;
    if (u->n >= 0) return u;
    const rp_svocab *v = m->g->v;
    u->ids = malloc(((size_t)pc->n_unc + 1) * sizeof(int32_t));
    if (!u->ids) return NULL;
    u->n = 0;
    int32_t *st = m->walk;
    st[0] = pda_single(&m->p, node);
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (int i = 0; i < pc->n_unc; i++) {
        int32_t id = v->sorted[pc->unc[i]];
        const uint8_t *b = v->tok[id];
        uint32_t len = v->tok_len[id], l = 0;
        while (l < len && l < prev_len && b[l] == prev[l] && st[l + 1] != PDA_DEAD) l++;
        /* st[l] is the state after b[0..l) (or DEAD) */
        int32_t s = st[l];
        for (; l < len && s != PDA_DEAD; l++) st[l + 1] = s = pda_step(&m->p, s, b[l]);
        for (; l < len; l++) st[l + 1] = PDA_DEAD;
        if (s != PDA_DEAD) u->ids[u->n++] = id;
        prev = b, prev_len = len;
    }
    return u;
}

int rp_smatcher_fill_mask(rp_smatcher *m, uint32_t *mask) {
    const rp_svocab *v = m->g->v;
    int W = v->mask_words;
    memset(mask, 0, (size_t)W * sizeof *mask);
    int32_t s = m->hist[m->n_hist - 1];
    if (s == HIST_FINISHED) return 0;
    int n = (int)(m->p.soff[s + 1] - m->p.soff[s]);
    for (int k = 0; k < n; k++) {
        int32_t node = m->p.sitems[m->p.soff[s] + k]; /* re-read: uncertain_for may grow sitems */
        const pos_class *pc = class_for(m, node);
        if (!pc) continue; /* out of memory: the item's tokens stay masked (safe) */
        if (pc->mode == CLS_ACCEPT_LIST) {
            for (int i = 0; i < pc->n; i++) mask[pc->ids[i] >> 5] |= 1u << (pc->ids[i] & 31);
        } else if (pc->mode == CLS_BITS) {
            for (int w = 0; w < W; w++) mask[w] |= pc->bits[w];
        } else {
            memcpy(m->tmp, v->normal, (size_t)W * sizeof *m->tmp);
            for (int i = 0; i < pc->n; i++) m->tmp[pc->ids[i] >> 5] &= ~(1u << (pc->ids[i] & 31));
            for (int i = 0; i < pc->n_unc; i++) {
                int32_t id = v->sorted[pc->unc[i]];
                m->tmp[id >> 5] &= ~(1u << (id & 31));
            }
            for (int w = 0; w < W; w++) mask[w] |= m->tmp[w];
        }
        if (pc->n_unc) {
            const unc_memo *u = uncertain_for(m, node, pc);
            if (!u) continue; /* out of memory: those tokens stay masked (safe) */
            for (int i = 0; i < u->n; i++) mask[u->ids[i] >> 5] |= 1u << (u->ids[i] & 31);
        }
    }
    if (m->p.sflags[s] & PDA_ACCEPT)
        for (int i = 0; i < v->n_eos; i++) mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    for (int w = 0; w < W; w++)
        if (mask[w]) return 1;
    return 0;
}
