/* Byte-level BPE on one pre-token, as HF's BPE model does it: start from one
 * symbol per byte, then repeatedly merge the adjacent pair with the lowest
 * merge rank, leftmost first on ties, until no pair has a merge.
 *
 * Two implementations of that one rule: a quadratic scan for short words
 * (nearly all of them; no allocation, cache friendly) and a binary heap over
 * a linked list for long ones (a 1 MB run of letters is one pre-token). Tests
 * check that they agree. Results for short words are cached per encode call:
 * text repeats its words, and the cache is what makes 10 MB encodes fast. */
#include "tokenizer/tok_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_MAX_WORD 64   /* bytes; longer words are not cached */
#define SHORT_WORD 128      /* symbols; longer words use the heap */

struct tok_scratch {
    tok_map cache; /* word bytes -> offset in cache_ids << 7 | count */
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
    char *keys; /* the cached words' bytes, end to end */
    size_t n_keys, cap_keys;
    /* the heap algorithm's working arrays, grown on demand */
    void *heap_mem;
    size_t heap_cap;
};

tok_scratch *tok_scratch_new(void) {
    tok_scratch *s = calloc(1, sizeof *s);
    return s;
}

void tok_scratch_free(tok_scratch *s) {
    if (!s) return;
    tok_map_free(&s->cache);
    free(s->cache_ids);
    free(s->keys);
    free(s->heap_mem);
    free(s);
}

int tok_ids_push(tok_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t c = ids->cap ? ids->cap * 2 : 256;
        int32_t *nv = realloc(ids->v, c * sizeof *nv);
        if (!nv) return -1;
        ids->v = nv;
        ids->cap = c;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* Initial symbols: one per byte. A byte without a token (no byte-level
 * vocab would lack one) becomes unk, or is dropped like HF does without unk. */
static size_t init_symbols(const rp_tokenizer *t, const unsigned char *s, size_t n, int32_t *sym) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) id = t->unk_id;
        if (id >= 0) sym[m++] = id;
    }
    return m;
}

static inline int32_t pair_rank(const rp_tokenizer *t, int32_t a, int32_t b, int32_t *new_id) {
    const tok_pair_entry *e = tok_pairmap_get(&t->merges, a, b);
    if (!e) return INT32_MAX;
    *new_id = e->new_id;
    return e->rank;
}

/* The quadratic scan: sym[0..m) in place; returns the new length. */
static size_t bpe_short(const rp_tokenizer *t, int32_t *sym, size_t m) {
    int32_t rank[SHORT_WORD], nid[SHORT_WORD];
    if (m < 2) return m;
    for (size_t i = 0; i + 1 < m; i++) rank[i] = pair_rank(t, sym[i], sym[i + 1], &nid[i]);
    for (;;) {
        int32_t best = INT32_MAX;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) best = rank[i], bi = i;
        if (best == INT32_MAX) break;
        sym[bi] = nid[bi];
        /* drop symbol bi+1 and the pair (bi, bi+1) */
        size_t tail = m - bi - 2; /* symbols after bi+1; tail-1 pairs among them */
        memmove(sym + bi + 1, sym + bi + 2, tail * sizeof *sym);
        if (tail > 1) {
            memmove(rank + bi + 1, rank + bi + 2, (tail - 1) * sizeof *rank);
            memmove(nid + bi + 1, nid + bi + 2, (tail - 1) * sizeof *nid);
        }
        m--;
        if (bi > 0) rank[bi - 1] = pair_rank(t, sym[bi - 1], sym[bi], &nid[bi - 1]);
        if (bi + 1 < m) rank[bi] = pair_rank(t, sym[bi], sym[bi + 1], &nid[bi]);
        if (m < 2) break;
    }
    return m;
}

typedef struct hnode {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
} hnode;

static inline int hless(const hnode *a, const hnode *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(hnode *h, size_t *n, hnode x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static hnode heap_pop(hnode *h, size_t *n) {
    hnode top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const hnode *best = &x;
        if (l < *n && hless(&h[l], best)) m = l, best = &h[l];
        if (r < *n && hless(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

/* HF's word.rs merge_all: a heap of candidate merges keyed (rank, position);
 * stale entries are skipped when popped. Returns the new length, or
 * (size_t)-1 on out of memory. */
static size_t bpe_heap(const rp_tokenizer *t, tok_scratch *sc, int32_t *sym, size_t m) {
    if (m < 2) return m;
    /* per symbol: prev, next, alive; plus the heap (at most one push per
     * initial pair and two per merge: < 3m) */
    size_t need = m * 3 * sizeof(int32_t) + 3 * m * sizeof(hnode);
    if (need > sc->heap_cap) {
        void *nm = realloc(sc->heap_mem, need);
        if (!nm) return (size_t)-1;
        sc->heap_mem = nm;
        sc->heap_cap = need;
    }
    hnode *heap = sc->heap_mem;
    int32_t *prev = (int32_t *)(heap + 3 * m), *next = prev + m, *alive = next + m;
    size_t nh = 0;
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
        alive[i] = 1;
    }
    for (size_t i = 0; i + 1 < m; i++) {
        int32_t nid = -1, r = pair_rank(t, sym[i], sym[i + 1], &nid);
        if (r != INT32_MAX) heap_push(heap, &nh, (hnode){r, (int32_t)i, nid});
    }
    while (nh) {
        hnode top = heap_pop(heap, &nh);
        int32_t p = top.pos;
        if (!alive[p] || next[p] < 0) continue;
        int32_t q = next[p], nid = -1;
        if (pair_rank(t, sym[p], sym[q], &nid) != top.rank || nid != top.new_id) continue;
        sym[p] = nid;
        alive[q] = 0;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            int32_t a = prev[p], r = pair_rank(t, sym[a], sym[p], &nid);
            if (r != INT32_MAX) heap_push(heap, &nh, (hnode){r, a, nid});
        }
        if (next[p] >= 0) {
            int32_t r = pair_rank(t, sym[p], sym[next[p]], &nid);
            if (r != INT32_MAX) heap_push(heap, &nh, (hnode){r, p, nid});
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[k++] = sym[i];
    return k;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : first;
    while (c < need) c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

static int cache_put(tok_scratch *sc, const unsigned char *s, size_t n, const int32_t *ids, size_t k) {
    /* offsets must fit the 32-bit entry; past that the cache just stops growing */
    if (sc->n_cache_ids + k >= (1u << 24) || sc->n_keys + n >= UINT32_MAX) return 0;
    if (!sc->cache.e && tok_map_init(&sc->cache, 4096)) return -1;
    if (grow((void **)&sc->cache_ids, &sc->cap_cache_ids, sc->n_cache_ids + k, sizeof *sc->cache_ids, 16384) ||
        grow((void **)&sc->keys, &sc->cap_keys, sc->n_keys + n, 1, 65536))
        return -1;
    memcpy(sc->keys + sc->n_keys, s, n);
    if (k) memcpy(sc->cache_ids + sc->n_cache_ids, ids, k * sizeof *ids);
    if (tok_map_put(&sc->cache, sc->keys, (uint32_t)sc->n_keys, (uint32_t)n,
                    (int32_t)(sc->n_cache_ids << 7 | k)))
        return -1;
    sc->n_keys += n;
    sc->n_cache_ids += k;
    return 0;
}

int tok_bpe_word(const rp_tokenizer *t, const unsigned char *s, size_t n, tok_scratch *sc,
                 int force, tok_ids *out) {
    if (n == 0) return 0;
    if (n == 1 && !force && !t->is_sp) {
        int32_t id = t->byte_id[s[0]];
        if (id < 0) id = t->unk_id;
        return id >= 0 ? tok_ids_push(out, id) : 0;
    }
    if (t->ignore_merges) {
        /* HF: a word that is itself in the vocab is emitted whole */
        int32_t id = t->is_sp ? tok_map_get(&t->sp.vocab, t->text_blob, (const char *)s, n, -1)
                              : tok_map_get(&t->bytes_to_id, t->bytes_blob, (const char *)s, n, -1);
        if (id >= 0) return tok_ids_push(out, id);
    }
    int cacheable = n <= CACHE_MAX_WORD && !force;
    if (cacheable && sc->cache.e) {
        int32_t v = tok_map_get(&sc->cache, sc->keys, (const char *)s, n, -1);
        if (v >= 0) {
            size_t off = (size_t)v >> 7, k = (size_t)v & 0x7F;
            for (size_t i = 0; i < k; i++)
                if (tok_ids_push(out, sc->cache_ids[off + i])) return -1;
            return 0;
        }
    }
    int32_t small[SHORT_WORD];
    int32_t *sym = n <= SHORT_WORD ? small : malloc(n * sizeof *sym);
    if (!sym) return -1;
    size_t m = t->is_sp ? tok_sp_init_symbols(t, s, n, sym) : init_symbols(t, s, n, sym);
    int use_heap = force == 2 || (force == 0 && m > SHORT_WORD);
    if (force == 1 && m > SHORT_WORD) use_heap = 1; /* the short scan has fixed arrays */
    m = use_heap ? bpe_heap(t, sc, sym, m) : bpe_short(t, sym, m);
    int rc = 0;
    if (m == (size_t)-1) {
        rc = -1;
    } else {
        for (size_t i = 0; i < m && !rc; i++) rc = tok_ids_push(out, sym[i]);
        if (!rc && cacheable) rc = cache_put(sc, s, n, sym, m);
    }
    if (sym != small) free(sym);
    return rc;
}
