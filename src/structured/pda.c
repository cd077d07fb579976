/* The byte-level pushdown automaton (pda.h): hash-consed stack nodes,
 * interned item sets, closure over pushes and pops, memoised transitions. */
#include <stdlib.h>
#include <string.h>

#include "structured/pda.h"

static inline uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ull ^ ((uint64_t)b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(h ^ (h >> 32));
}

static int grow(void **ptr, size_t elem, int need, int *cap) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *n = realloc(*ptr, (size_t)c * elem);
    if (!n) return -1;
    *ptr = n;
    *cap = c;
    return 0;
}

static int rehash_nodes(pda *p, uint32_t size) {
    int32_t *t = calloc(size, sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < p->n_nodes; i++) {
        uint32_t h = hash2((uint32_t)p->npos[i], (uint32_t)p->npar[i]) & (size - 1);
        while (t[h]) h = (h + 1) & (size - 1);
        t[h] = i + 1;
    }
    free(p->ntab);
    p->ntab = t;
    p->ntab_mask = size - 1;
    return 0;
}

/* The node (pos, par): pos >= 0 a grammar position; pos == -1 the root
 * (par -1); pos <= -2 the marker of rule -pos-2 at level -1-par. */
static int32_t node(pda *p, int32_t pos, int32_t par) {
    uint32_t h = hash2((uint32_t)pos, (uint32_t)par) & p->ntab_mask;
    for (int32_t id; (id = p->ntab[h]); h = (h + 1) & p->ntab_mask)
        if (p->npos[id - 1] == pos && p->npar[id - 1] == par) return id - 1;
    if (p->n_nodes + 1 > p->cap_nodes) {
        int cap = p->cap_nodes, c2 = cap, c3 = cap, c4 = cap;
        if (grow((void **)&p->npos, sizeof(int32_t), p->n_nodes + 1, &cap) ||
            grow((void **)&p->npar, sizeof(int32_t), p->n_nodes + 1, &c2) ||
            grow((void **)&p->nlev, 1, p->n_nodes + 1, &c3) ||
            grow((void **)&p->nvisit, sizeof(uint32_t), p->n_nodes + 1, &c4)) {
            p->oom = 1;
            return 0;
        }
        int c = p->cap_nodes ? p->cap_nodes : 1024;
        while (c < p->n_nodes + 1) c *= 2;
        p->cap_nodes = c;
    }
    int32_t id = p->n_nodes++;
    p->npos[id] = pos;
    p->npar[id] = par;
    p->nlev[id] = (uint8_t)(pos < -1 ? -1 - par : par >= 0 ? p->nlev[par] : 0);
    p->nvisit[id] = 0;
    p->ntab[h] = id + 1;
    if ((uint32_t)p->n_nodes * 2 > p->ntab_mask && rehash_nodes(p, (p->ntab_mask + 1) * 2)) p->oom = 1;
    return id;
}

static int rehash_v(pda *p, uint32_t size) {
    int32_t *t = calloc(size, sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < p->n_v; i++) {
        uint32_t h = hash2((uint32_t)p->vq[i], hash2((uint32_t)p->vneed[i], (uint32_t)p->vroom[i])) & (size - 1);
        while (t[h]) h = (h + 1) & (size - 1);
        t[h] = i + 1;
    }
    free(p->vtab);
    p->vtab = t;
    p->vtab_mask = size - 1;
    return 0;
}

/* The position that stands for (q, need, room). */
static int32_t vpos(pda *p, int32_t q, int32_t need, int32_t room) {
    uint32_t h = hash2((uint32_t)q, hash2((uint32_t)need, (uint32_t)room)) & p->vtab_mask;
    for (int32_t id; (id = p->vtab[h]); h = (h + 1) & p->vtab_mask)
        if (p->vq[id - 1] == q && p->vneed[id - 1] == need && p->vroom[id - 1] == room) return p->g->n_elems + id - 1;
    if (p->n_v == p->cap_v) {
        int c = p->cap_v ? p->cap_v * 2 : 256;
        int32_t *a = realloc(p->vq, (size_t)c * sizeof *a);
        if (a) p->vq = a;
        int32_t *b2 = realloc(p->vneed, (size_t)c * sizeof *b2);
        if (b2) p->vneed = b2;
        int32_t *c2 = realloc(p->vroom, (size_t)c * sizeof *c2);
        if (c2) p->vroom = c2;
        if (!a || !b2 || !c2) {
            p->oom = 1;
            return p->g->n_elems;
        }
        p->cap_v = c;
    }
    int v = p->n_v++;
    p->vq[v] = q, p->vneed[v] = need, p->vroom[v] = room;
    p->vtab[h] = v + 1;
    if ((uint32_t)p->n_v * 2 > p->vtab_mask && rehash_v(p, (p->vtab_mask + 1) * 2)) p->oom = 1;
    return p->g->n_elems + v;
}

static int32_t clip_count(const pda *p, int32_t x) {
    if (!p->clip || x < 0 || (x & PDA_GE)) return x;
    return x > p->clip ? (p->clip | PDA_GE) : x;
}

int32_t pda_node(pda *p, int32_t pos, int32_t par) { return node(p, pos, par); }

int32_t pda_rep_node(pda *p, int32_t q, int32_t need, int32_t room, int32_t par) {
    return node(p, vpos(p, q, clip_count(p, need), clip_count(p, room)), par);
}

static void work_push(pda *p, int32_t pos, int32_t par) {
    if (p->n_work + 2 > p->cap_work) {
        long c = p->cap_work ? p->cap_work * 2 : 1024;
        int32_t *w = realloc(p->work, (size_t)c * sizeof *w);
        if (!w) {
            p->oom = 1;
            return;
        }
        p->work = w;
        p->cap_work = c;
    }
    p->work[p->n_work++] = pos;
    p->work[p->n_work++] = par;
}

static void item_add(pda *p, int32_t n) {
    if (p->n_items >= PDA_MAX_ITEMS) {
        p->too_many = 1;
        return;
    }
    if (p->n_items + 1 > p->cap_items) {
        int c = p->cap_items;
        if (grow((void **)&p->items, sizeof(int32_t), p->n_items + 1, &c)) {
            p->oom = 1;
            return;
        }
        p->cap_items = c;
    }
    p->items[p->n_items++] = n;
    p->flags |= p->nlev[n] ? PDA_TAINTED : PDA_UNTAINTED;
}

/* Closes the work list into p->items / p->flags. */
static void closure(pda *p) {
    const sg_grammar *g = p->g;
    while (p->n_work && !p->oom && !p->too_many) {
        int32_t par = p->work[--p->n_work], pos = p->work[--p->n_work];
        int32_t n = node(p, pos, par);
        if (p->nvisit[n] == p->gen) continue;
        p->nvisit[n] = p->gen;
        if (pos == -1) {
            p->flags |= PDA_ACCEPT;
            continue;
        }
        if (pos < -1) { /* a marker: the unknown caller of rule r */
            int r = -pos - 2, lev = -1 - par;
            if (lev == 0) p->flags |= PDA_POP0;
            if (lev >= p->max_level) {
                p->flags |= PDA_ESCAPE;
                continue;
            }
            if (r == g->root) p->flags |= lev == 0 ? 0 : PDA_TEND;
            for (int32_t k = g->follow_off[r]; k < g->follow_off[r + 1]; k++) {
                int32_t q = g->follow_sites[k];
                int32_t m = node(p, -2 - g->erule[q], -1 - (lev + 1));
                if (g->ekind[q] == SG_E_REP) work_push(p, vpos(p, q, 0, -1), m); /* count unknown: loop or leave */
                else work_push(p, q + 1, m);
            }
            continue;
        }
        if (pos >= g->n_elems) { /* a counted repetition: another iteration, or on */
            int v = pos - g->n_elems;
            int32_t q = p->vq[v], need = p->vneed[v], room = p->vroom[v];
            int32_t nv = need & ~PDA_GE, rv = room < 0 ? -1 : room & ~PDA_GE;
            if (rv == 0 && room > 0 && (room & PDA_GE)) p->flags |= PDA_ESCAPE; /* clipped: unknown */
            else if (rv != 0) {
                int32_t need2 = nv > 0 ? ((nv - 1) | (need & PDA_GE)) : need;
                int32_t room2 = room < 0 ? -1 : ((rv - 1) | (room & PDA_GE));
                int32_t ret = node(p, vpos(p, q, need2, room2), par);
                int r = g->earg[q];
                for (int32_t a = g->rule_alt_off[r]; a < g->rule_alt_off[r + 1]; a++) work_push(p, g->alt_start[a], ret);
            }
            if (nv == 0 && (need & PDA_GE)) p->flags |= PDA_ESCAPE; /* clipped: unknown */
            else if (nv == 0) work_push(p, q + 1, par);
            continue;
        }
        switch (g->ekind[pos]) {
        case SG_E_REP:
            work_push(p, vpos(p, pos, clip_count(p, g->erep_min[pos]), clip_count(p, g->erep_max[pos])), par);
            break;
        case SG_E_SET:
            item_add(p, n);
            break;
        case SG_E_REF: {
            int r = g->earg[pos];
            int32_t ret = g->ekind[pos + 1] == SG_E_END ? par : node(p, pos + 1, par);
            for (int32_t a = g->rule_alt_off[r]; a < g->rule_alt_off[r + 1]; a++) work_push(p, g->alt_start[a], ret);
            break;
        }
        default: /* END: return to the caller's continuation (node par) */
            work_push(p, p->npos[par], p->npar[par]);
            break;
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t hash_items(const int32_t *it, int n, int flags) {
    uint32_t h = 0x811C9DC5u ^ (uint32_t)flags;
    for (int i = 0; i < n; i++) h = hash2(h, (uint32_t)it[i]);
    return h;
}

static int rehash_states(pda *p, uint32_t size) {
    int32_t *t = calloc(size, sizeof *t);
    if (!t) return -1;
    for (int s = 0; s < p->n_states; s++) {
        uint32_t h = hash_items(p->sitems + p->soff[s], (int)(p->soff[s + 1] - p->soff[s]), p->sflags[s]) & (size - 1);
        while (t[h]) h = (h + 1) & (size - 1);
        t[h] = s + 1;
    }
    free(p->stab);
    p->stab = t;
    p->stab_mask = size - 1;
    return 0;
}

/* Interns p->items / p->flags as a state. */
static int32_t intern_state(pda *p) {
    if (p->oom || p->too_many) return PDA_DEAD;
    if (!p->n_items && !(p->flags & (PDA_ACCEPT | PDA_POP0 | PDA_ESCAPE | PDA_TEND))) return PDA_DEAD;
    int n = p->n_items;
    if (n > 1) {
        if (n <= 16) {
            for (int i = 1; i < n; i++) {
                int32_t x = p->items[i];
                int j = i;
                while (j > 0 && p->items[j - 1] > x) p->items[j] = p->items[j - 1], j--;
                p->items[j] = x;
            }
        } else qsort(p->items, (size_t)n, sizeof(int32_t), cmp_i32);
        int m = 1;
        for (int i = 1; i < n; i++)
            if (p->items[i] != p->items[m - 1]) p->items[m++] = p->items[i];
        n = p->n_items = m;
    }
    uint8_t flags = (uint8_t)p->flags;
    uint32_t h = hash_items(p->items, n, flags) & p->stab_mask;
    for (int32_t id; (id = p->stab[h]); h = (h + 1) & p->stab_mask) {
        int s = id - 1;
        if (p->sflags[s] == flags && p->soff[s + 1] - p->soff[s] == n &&
            !memcmp(p->sitems + p->soff[s], p->items, (size_t)n * sizeof(int32_t)))
            return s;
    }
    if (p->n_states + 2 > p->cap_states) {
        int c = p->cap_states ? p->cap_states * 2 : 1024;
        int32_t *so = realloc(p->soff, (size_t)(c + 1) * sizeof *so);
        if (so) p->soff = so;
        uint8_t *sf = realloc(p->sflags, (size_t)c);
        if (sf) p->sflags = sf;
        int32_t **tr = realloc(p->trans, (size_t)c * sizeof *tr);
        if (tr) p->trans = tr;
        int16_t *tb = realloc(p->t1_byte, (size_t)c * sizeof *tb);
        if (tb) p->t1_byte = tb;
        int32_t *tt = realloc(p->t1_to, (size_t)c * sizeof *tt);
        if (tt) p->t1_to = tt;
        if (!so || !sf || !tr || !tb || !tt) {
            p->oom = 1;
            return PDA_DEAD;
        }
        p->cap_states = c;
    }
    if (p->n_sitems + n > p->cap_sitems) {
        long c = p->cap_sitems ? p->cap_sitems : 4096;
        while (c < p->n_sitems + n) c *= 2;
        int32_t *si = realloc(p->sitems, (size_t)c * sizeof *si);
        if (!si) {
            p->oom = 1;
            return PDA_DEAD;
        }
        p->sitems = si;
        p->cap_sitems = c;
    }
    int s = p->n_states++;
    memcpy(p->sitems + p->n_sitems, p->items, (size_t)n * sizeof(int32_t));
    p->n_sitems += n;
    p->soff[s + 1] = (int32_t)p->n_sitems;
    p->sflags[s] = flags;
    p->trans[s] = NULL;
    p->t1_byte[s] = -1;
    p->stab[h] = s + 1;
    if ((uint32_t)p->n_states * 2 > p->stab_mask && rehash_states(p, (p->stab_mask + 1) * 2)) p->oom = 1;
    return s;
}

static void begin(pda *p) {
    if (++p->gen == 0) { /* wrapped: clear the marks */
        memset(p->nvisit, 0, (size_t)p->n_nodes * sizeof(uint32_t));
        p->gen = 1;
    }
    p->n_items = 0;
    p->flags = 0;
    p->n_work = 0;
    p->too_many = 0;
}

int pda_init(pda *p, const sg_grammar *g, int max_level, int clip) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->max_level = max_level;
    p->clip = clip;
    if (rehash_nodes(p, 4096) || rehash_states(p, 4096) || rehash_v(p, 256)) return -1;
    p->soff = malloc(1025 * sizeof(int32_t));
    p->sflags = malloc(1024);
    p->trans = malloc(1024 * sizeof(int32_t *));
    p->t1_byte = malloc(1024 * sizeof(int16_t));
    p->t1_to = malloc(1024 * sizeof(int32_t));
    if (!p->soff || !p->sflags || !p->trans || !p->t1_byte || !p->t1_to) return -1;
    p->cap_states = 1024;
    p->soff[0] = 0;
    node(p, -1, -1); /* PDA_ROOT */
    return p->oom ? -1 : 0;
}

void pda_free(pda *p) {
    for (int s = 0; s < p->n_states; s++) free(p->trans[s]);
    free(p->npos), free(p->npar), free(p->nlev), free(p->nvisit), free(p->ntab);
    free(p->soff), free(p->sitems), free(p->sflags), free(p->trans), free(p->stab), free(p->t1_byte), free(p->t1_to);
    free(p->work), free(p->items);
    free(p->vq), free(p->vneed), free(p->vroom), free(p->vtab);
    memset(p, 0, sizeof *p);
}

int32_t pda_start(pda *p) {
    begin(p);
    const sg_grammar *g = p->g;
    for (int32_t a = g->rule_alt_off[g->root]; a < g->rule_alt_off[g->root + 1]; a++)
        work_push(p, g->alt_start[a], PDA_ROOT);
    closure(p);
    return intern_state(p);
}

int32_t pda_start_at(pda *p, int32_t pos) {
    begin(p);
    int32_t m = node(p, -2 - p->g->erule[pos], -1);
    item_add(p, node(p, pos, m));
    return intern_state(p);
}

int32_t pda_start_in_rep(pda *p, int32_t pos, int32_t q, int32_t need, int32_t room) {
    begin(p);
    int32_t m = node(p, -2 - p->g->erule[q], -1);
    int32_t r = pda_rep_node(p, q, need, room, m);
    item_add(p, node(p, pos, r));
    return intern_state(p);
}

int32_t pda_single(pda *p, int32_t n) {
    begin(p);
    item_add(p, n);
    p->flags &= ~(PDA_UNTAINTED | PDA_TAINTED);
    p->flags |= PDA_UNTAINTED;
    return intern_state(p);
}

/* The transition itself, not memoised. */
static int32_t step_new(pda *p, int32_t s, uint8_t byte) {
    begin(p);
    const sg_grammar *g = p->g;
    for (int32_t k = p->soff[s]; k < p->soff[s + 1]; k++) {
        int32_t n = p->sitems[k], pos = p->npos[n];
        if (sg_set_has(&g->sets[g->earg[pos]], byte)) work_push(p, pos + 1, p->npar[n]);
    }
    closure(p);
    return intern_state(p);
}

int32_t pda_step(pda *p, int32_t s, uint8_t byte) {
    int32_t *t = p->trans[s];
    if (t && t[byte] != -2) return t[byte];
    if (!t) {
        /* most states are left by one byte only (a walk through a counted
         * repetition): one remembered transition, a table from the second */
        if (p->t1_byte[s] == byte) return p->t1_to[s];
        if (p->t1_byte[s] < 0) {
            int32_t r = step_new(p, s, byte);
            if (p->oom) return PDA_DEAD;
            p->t1_byte[s] = byte;
            p->t1_to[s] = r;
            return r;
        }
        if (p->n_trans >= PDA_MAX_TRANS) {
            for (int k = 0; k < p->n_states; k++) free(p->trans[k]), p->trans[k] = NULL;
            p->n_trans = 0;
        }
        p->n_trans++;
        t = malloc(256 * sizeof(int32_t));
        if (!t) return PDA_DEAD;
        for (int i = 0; i < 256; i++) t[i] = -2;
        t[p->t1_byte[s]] = p->t1_to[s];
        p->trans[s] = t;
    }
    int32_t r = step_new(p, s, byte);
    p->trans[s][byte] = r; /* step_new may have moved p->trans */
    return r;
}
