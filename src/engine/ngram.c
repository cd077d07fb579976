/* The n-gram drafter's index (ngram.h says what it proposes and why): per
 * match length, a chained hash table of the distinct n-grams seen, each with
 * its most recent end position, and per end position the previous
 * occurrence of the same n-gram. Every array is sized once by max_tokens.
 *
 * Positions are learned in increasing order and forgotten in decreasing
 * order, so each table changes like a stack: a key is made when its first
 * occurrence is learned and dies when that occurrence is forgotten, by
 * which time every key made after it has died. Keys therefore live in an
 * array used as a stack, and a dying key is always the head of its bucket's
 * chain: forgetting is O(1) a table with no search and no tombstones. */
#include "engine/ngram.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1)

/* One distinct n-gram of a table's length n. Its tokens are not stored: they
 * are t[last - n .. last) of the sequence, still there while it lives. */
typedef struct ng_key {
    uint32_t hash; /* of its n tokens; its bucket is hash & bucket_mask */
    int32_t last;  /* end position of its most recent occurrence */
    int32_t next;  /* the key made before it in the same bucket, or NONE */
} ng_key;

/* The n-grams of one length n. Indexed by end position e: the occurrence
 * t[e - n .. e), learned once t[e] follows it. */
typedef struct ng_table {
    int32_t *buckets; /* [bucket_mask + 1]: the newest key of each chain, or NONE */
    ng_key *keys;     /* [max_tokens], a stack of num_keys */
    int32_t num_keys;
    int32_t *prev;   /* [max_tokens]: the same n-gram's occurrence before e, or NONE */
    int32_t *key_of; /* [max_tokens]: the key of the n-gram ending at e */
} ng_table;

struct rp_ngram {
    int min_n, max_n, max_tokens;
    int len;              /* tokens learned: every e in [n, len) is in table n */
    uint32_t bucket_mask; /* buckets per table - 1, a power of two >= max_tokens */
    ng_table tables[RP_NGRAM_MAX_N]; /* [n - min_n] for n = min_n..max_n */
};

static int min_int(int a, int b) { return a < b ? a : b; }

/* The hash of n tokens is built from the last one backwards, one round a
 * token, so that the hashes of all the suffix lengths of a position cost
 * max_n rounds together; each depends only on its n tokens, never on where
 * they are. Multiply-xorshift rounds (splitmix64's constants): the hash only
 * spreads keys over buckets and skips most token compares, every hit is
 * compared in full, so it needs spread, not strength. */
#define HASH_SEED 0x9e3779b97f4a7c15ull

static uint64_t hash_round(uint64_t h, int32_t token) {
    h = (h ^ (uint32_t)token) * 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

static uint32_t hash_final(uint64_t h) { return (uint32_t)((h * 0x94d049bb133111ebull) >> 32); }

uint32_t rp_ngram_hash(const int32_t *tokens, int n) {
    uint64_t h = HASH_SEED;
    for (int i = n - 1; i >= 0; i--) h = hash_round(h, tokens[i]);
    return hash_final(h);
}

/* rp_ngram_hash of t[end - n .. end) for every n = min_n..min(max_n, end),
 * into hash[n]. */
static void suffix_hashes(const rp_ngram *g, const int32_t *t, int end, uint32_t *hash) {
    uint64_t h = HASH_SEED;
    int top = min_int(g->max_n, end);
    for (int n = 1; n <= top; n++) {
        h = hash_round(h, t[end - n]);
        if (n >= g->min_n) hash[n] = hash_final(h);
    }
}

/* The key of table n holding t[end - n .. end), or NONE. */
static int32_t find_key(const rp_ngram *g, const ng_table *tb, int n, const int32_t *t, int end, uint32_t hash) {
    for (int32_t s = tb->buckets[hash & g->bucket_mask]; s != NONE; s = tb->keys[s].next) {
        const ng_key *key = &tb->keys[s];
        if (key->hash == hash && memcmp(t + key->last - n, t + end - n, (size_t)n * sizeof *t) == 0) return s;
    }
    return NONE;
}

/* Learns end position e (t[e] now exists) in every table it fits. */
static void learn(rp_ngram *g, const int32_t *t, int e) {
    uint32_t hash[RP_NGRAM_MAX_N + 1];
    suffix_hashes(g, t, e, hash);
    int top = min_int(g->max_n, e);
    for (int n = g->min_n; n <= top; n++) {
        ng_table *tb = &g->tables[n - g->min_n];
        int32_t s = find_key(g, tb, n, t, e, hash[n]);
        if (s == NONE) {
            s = tb->num_keys++;
            uint32_t b = hash[n] & g->bucket_mask;
            tb->keys[s] = (ng_key){.hash = hash[n], .last = NONE, .next = tb->buckets[b]};
            tb->buckets[b] = s;
        }
        tb->prev[e] = tb->keys[s].last;
        tb->keys[s].last = e;
        tb->key_of[e] = s;
    }
}

/* Undoes learn(e); e must be the last position learned. Reads no tokens:
 * the caller may already have overwritten them. */
static void forget(rp_ngram *g, int e) {
    int top = min_int(g->max_n, e);
    for (int n = g->min_n; n <= top; n++) {
        ng_table *tb = &g->tables[n - g->min_n];
        int32_t s = tb->key_of[e];
        ng_key *key = &tb->keys[s];
        RP_ASSERT(key->last == e);
        key->last = tb->prev[e];
        if (key->last == NONE) {
            /* e was its first occurrence: the newest key, at the head of its chain */
            uint32_t b = key->hash & g->bucket_mask;
            RP_ASSERT(s == tb->num_keys - 1 && tb->buckets[b] == s);
            tb->buckets[b] = key->next;
            tb->num_keys--;
        }
    }
}

int rp_ngram_validate(int min_n, int max_n, rp_err *err) {
    if (min_n < 1) return rp_errp(err, "prompt_lookup_min", "prompt_lookup_min=%d must be > 0", min_n);
    if (max_n < 1) return rp_errp(err, "prompt_lookup_max", "prompt_lookup_max=%d must be > 0", max_n);
    if (min_n > max_n)
        return rp_errp(err, "prompt_lookup_min", "prompt_lookup_min=%d must be <= prompt_lookup_max=%d", min_n,
                       max_n);
    if (max_n > RP_NGRAM_MAX_N)
        return rp_errp(err, "prompt_lookup_max", "prompt_lookup_max=%d must be <= %d", max_n, RP_NGRAM_MAX_N);
    return 0;
}

rp_ngram *rp_ngram_new(int min_n, int max_n, int max_tokens) {
    if (rp_ngram_validate(min_n, max_n, NULL) || max_tokens < 1) return NULL;
    rp_ngram *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->min_n = min_n;
    g->max_n = max_n;
    g->max_tokens = max_tokens;
    /* a table never holds more keys than positions: load factor <= 1 */
    uint64_t num_buckets = 1;
    while (num_buckets < (uint64_t)max_tokens) num_buckets <<= 1;
    g->bucket_mask = (uint32_t)(num_buckets - 1);
    for (int n = min_n; n <= max_n; n++) {
        ng_table *tb = &g->tables[n - min_n];
        tb->buckets = malloc(num_buckets * sizeof *tb->buckets);
        tb->keys = malloc((size_t)max_tokens * sizeof *tb->keys);
        tb->prev = malloc((size_t)max_tokens * sizeof *tb->prev);
        tb->key_of = malloc((size_t)max_tokens * sizeof *tb->key_of);
        if (!tb->buckets || !tb->keys || !tb->prev || !tb->key_of) {
            rp_ngram_free(g);
            return NULL;
        }
        /* all bytes 0xff: every bucket NONE */
        memset(tb->buckets, 0xff, num_buckets * sizeof *tb->buckets);
    }
    return g;
}

void rp_ngram_free(rp_ngram *g) {
    if (!g) return;
    for (int i = 0; i < RP_NGRAM_MAX_N; i++) {
        free(g->tables[i].buckets);
        free(g->tables[i].keys);
        free(g->tables[i].prev);
        free(g->tables[i].key_of);
    }
    free(g);
}

/* Forgetting everything leaves every bucket NONE again: cheaper than
 * clearing the buckets when the sequence was short against max_tokens. */
void rp_ngram_reset(rp_ngram *g) { rp_ngram_truncate(g, 0); }

int rp_ngram_append(rp_ngram *g, const int32_t *tokens, int n, rp_err *err) {
    RP_ASSERT(n >= g->len);
    if (n > g->max_tokens)
        return rp_errf(err, "n-gram index: sequence of %d tokens, more than the %d it holds", n, g->max_tokens);
    for (int e = g->len; e < n; e++) learn(g, tokens, e);
    g->len = n;
    return 0;
}

void rp_ngram_truncate(rp_ngram *g, int n) {
    RP_ASSERT(n >= 0);
    for (; g->len > n; g->len--) forget(g, g->len - 1);
}

int rp_ngram_len(const rp_ngram *g) { return g->len; }

int rp_ngram_propose(const rp_ngram *g, const int32_t *tokens, int n, int k, int32_t *out) {
    RP_ASSERT(n == g->len && k >= 0);
    if (k == 0) return 0;
    uint32_t hash[RP_NGRAM_MAX_N + 1];
    suffix_hashes(g, tokens, n, hash);
    /* an occurrence of length m ends at some e in [m, n): none unless m < n */
    for (int m = min_int(g->max_n, n - 1); m >= g->min_n; m--) {
        const ng_table *tb = &g->tables[m - g->min_n];
        int32_t s = find_key(g, tb, m, tokens, n, hash[m]);
        if (s == NONE) continue;
        /* what followed, then (text repeating with period n - e) the
         * proposal itself, as an overlapping copy */
        const int e = tb->keys[s].last;
        for (int i = 0; i < k; i++) out[i] = e + i < n ? tokens[e + i] : out[e + i - n];
        return k;
    }
    return 0;
}

int rp_ngram_check(const rp_ngram *g, const int32_t *tokens, rp_err *err) {
    if (g->len < 0 || g->len > g->max_tokens) return rp_errf(err, "len %d outside [0, %d]", g->len, g->max_tokens);
    for (int n = g->min_n; n <= g->max_n; n++) {
        const ng_table *tb = &g->tables[n - g->min_n];
        int64_t positions = 0;
        for (int32_t s = 0; s < tb->num_keys; s++) {
            const ng_key *key = &tb->keys[s];
            if (key->last < n || key->last >= g->len)
                return rp_errf(err, "n %d key %d: last %d outside [%d, %d)", n, s, key->last, n, g->len);
            if (rp_ngram_hash(tokens + key->last - n, n) != key->hash)
                return rp_errf(err, "n %d key %d: stale hash", n, s);
            /* found by its own tokens: no two keys hold the same n-gram */
            if (find_key(g, tb, n, tokens, key->last, key->hash) != s)
                return rp_errf(err, "n %d key %d: not found by its tokens", n, s);
            /* its occurrences: strictly decreasing, all equal, all pointing back at it */
            for (int32_t e = key->last, later = g->len; e != NONE; later = e, e = tb->prev[e]) {
                if (e < n || e >= later) return rp_errf(err, "n %d key %d: occurrence %d out of order", n, s, e);
                if (tb->key_of[e] != s)
                    return rp_errf(err, "n %d position %d: key_of %d, not %d", n, e, tb->key_of[e], s);
                if (memcmp(tokens + e - n, tokens + key->last - n, (size_t)n * sizeof *tokens) != 0)
                    return rp_errf(err, "n %d key %d: occurrence %d has other tokens", n, s, e);
                positions++;
            }
        }
        /* each position in exactly one chain: key_of is a function, and the count matches */
        int64_t expected = g->len > n ? g->len - n : 0;
        if (positions != expected)
            return rp_errf(err, "n %d: %lld positions learned, expected %lld", n, (long long)positions,
                           (long long)expected);
        /* every key in its own bucket, newest first (the stack order forget relies on) */
        int64_t chained = 0;
        for (uint64_t b = 0; b <= g->bucket_mask; b++) {
            for (int32_t s = tb->buckets[b], newer = tb->num_keys; s != NONE; newer = s, s = tb->keys[s].next) {
                if (s < 0 || s >= newer)
                    return rp_errf(err, "n %d bucket %llu: key %d out of order", n, (unsigned long long)b, s);
                if ((tb->keys[s].hash & g->bucket_mask) != b)
                    return rp_errf(err, "n %d key %d: in bucket %llu, not its own", n, s, (unsigned long long)b);
                chained++;
            }
        }
        if (chained != tb->num_keys)
            return rp_errf(err, "n %d: %lld keys in buckets, %d made", n, (long long)chained, tb->num_keys);
    }
    return 0;
}
