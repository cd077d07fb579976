/* The tokenizer's hash maps: byte strings -> int64 (vocab by text, vocab by
 * bytes, the per-call BPE cache) and id pairs -> merge (the BPE merge table).
 * Open addressing with linear probing; tables stay at most half full. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

uint32_t tok_hash_bytes(const char *key, size_t len) {
    /* 8 bytes at a time, multiply-xorshift; keys are short tokens and words */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (len * 0xC2B2AE3D27D4EB4FULL);
    const unsigned char *p = (const unsigned char *)key;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < len; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
    return (uint32_t)h;
}

static size_t pow2_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    return cap;
}

int tok_map_init(tok_map *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->e = malloc(m->cap * sizeof *m->e);
    if (!m->e) return -1;
    memset(m->e, 0xFF, m->cap * sizeof *m->e);
    return 0;
}

void tok_map_free(tok_map *m) {
    free(m->e);
    memset(m, 0, sizeof *m);
}

int tok_map_put(tok_map *m, const char *base, uint32_t off, uint32_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap * 2;
        tok_map_entry *ne = malloc(ncap * sizeof *ne);
        if (!ne) return -1;
        memset(ne, 0xFF, ncap * sizeof *ne);
        for (size_t i = 0; i < m->cap; i++) {
            if (m->e[i].off == UINT32_MAX) continue;
            size_t j = m->e[i].hash & (ncap - 1);
            while (ne[j].off != UINT32_MAX) j = (j + 1) & (ncap - 1);
            ne[j] = m->e[i];
        }
        free(m->e);
        m->e = ne;
        m->cap = ncap;
    }
    const char *key = base + off;
    uint32_t h = tok_hash_bytes(key, len);
    size_t mask = m->cap - 1, i = h & mask;
    while (m->e[i].off != UINT32_MAX) {
        tok_map_entry *e = &m->e[i];
        if (e->hash == h && e->len == len && memcmp(base + e->off, key, len) == 0) {
            e->val = val;
            return 0;
        }
        i = (i + 1) & mask;
    }
    m->e[i] = (tok_map_entry){off, len, h, val};
    m->n++;
    return 0;
}

int32_t tok_map_get(const tok_map *m, const char *base, const char *key, size_t len, int32_t missing) {
    if (!m->e) return missing;
    uint32_t h = tok_hash_bytes(key, len);
    size_t mask = m->cap - 1, i = h & mask;
    while (m->e[i].off != UINT32_MAX) {
        const tok_map_entry *e = &m->e[i];
        if (e->hash == h && e->len == len && memcmp(base + e->off, key, len) == 0) return e->val;
        i = (i + 1) & mask;
    }
    return missing;
}

int tok_pairmap_init(tok_pairmap *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->e = malloc(m->cap * sizeof *m->e);
    if (!m->e) return -1;
    memset(m->e, 0xFF, m->cap * sizeof *m->e);
    return 0;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->e);
    memset(m, 0, sizeof *m);
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    if ((m->n + 1) * 2 > m->cap) {
        tok_pairmap old = *m;
        if (tok_pairmap_init(m, old.cap)) {
            *m = old;
            return -1;
        }
        for (size_t i = 0; i < old.cap; i++) {
            if (old.e[i].key == UINT64_MAX) continue;
            size_t mask = m->cap - 1, j = (size_t)tok_pair_hash(old.e[i].key) & mask;
            while (m->e[j].key != UINT64_MAX) j = (j + 1) & mask;
            m->e[j] = old.e[i];
            m->n++;
        }
        free(old.e);
    }
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = m->cap - 1, i = (size_t)tok_pair_hash(key) & mask;
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == key) {
            m->e[i].rank = rank;
            m->e[i].new_id = new_id;
            return 0;
        }
        i = (i + 1) & mask;
    }
    m->e[i] = (tok_pair_entry){key, rank, new_id};
    m->n++;
    return 0;
}
