/* The prefix cache's trie of pages, its hash table and its LRU list
 * (prefix_cache.h says what they are for). Every array is indexed by page
 * id and sized once for the whole pool. */
#include "kv/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1) /* no node: the root as a parent, the end of a list */

typedef struct pc_node {
    uint64_t hash;      /* of (parent, tokens): its key in the hash table */
    int32_t parent;     /* the page before it; NONE for a first page */
    int32_t hash_next;  /* next node in its bucket */
    int32_t lru_prev, lru_next;
    int32_t num_children;
    int32_t lock;       /* handles whose path passes through it */
    int32_t own_locks;  /* handles whose path ends at it (for the check) */
    uint8_t cached;
    uint8_t in_lru;     /* on the LRU list; the same as cached && lock == 0 */
} pc_node;

struct rp_prefix_cache {
    rp_page_pool *pool; /* not owned */
    int page_size, num_pages;
    pc_node *nodes;     /* [num_pages] */
    int32_t *tokens;    /* [num_pages][page_size]: each cached page's tokens */
    int32_t *buckets;   /* [bucket_mask + 1]: first node of each chain */
    uint64_t bucket_mask;
    int32_t lru_head, lru_tail; /* head: released longest ago (a leaf) */
    int num_cached, num_evictable, num_handles;
    uint64_t queried_tokens, hit_tokens, inserted_pages, duplicate_pages, evicted_pages;
    int32_t *scratch;   /* [num_pages], for rp_prefix_cache_check */
};

/* Two tokens a multiply, each round mixed down (splitmix64's constants):
 * the hash only sorts nodes into buckets, every hit is compared token by
 * token, so it needs spread, not strength. */
static uint64_t page_hash(int32_t parent, const int32_t *t, int page_size) {
    uint64_t h = ((uint64_t)(uint32_t)parent + 1) * 0x9e3779b97f4a7c15ull;
    int i = 0;
    for (; i + 1 < page_size; i += 2) {
        uint64_t w = (uint64_t)(uint32_t)t[i] | (uint64_t)(uint32_t)t[i + 1] << 32;
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    if (i < page_size) {
        h = (h ^ (uint32_t)t[i]) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 29);
}

static const int32_t *node_tokens(const rp_prefix_cache *pc, int32_t node) {
    return pc->tokens + (int64_t)node * pc->page_size;
}

static int32_t lookup(const rp_prefix_cache *pc, int32_t parent, const int32_t *t, uint64_t h) {
    for (int32_t n = pc->buckets[h & pc->bucket_mask]; n != NONE; n = pc->nodes[n].hash_next) {
        const pc_node *x = &pc->nodes[n];
        if (x->hash == h && x->parent == parent &&
            !memcmp(node_tokens(pc, n), t, (size_t)pc->page_size * sizeof *t))
            return n;
    }
    return NONE;
}

static void hash_remove(rp_prefix_cache *pc, int32_t node) {
    int32_t *link = &pc->buckets[pc->nodes[node].hash & pc->bucket_mask];
    while (*link != node) {
        RP_ASSERT(*link != NONE);
        link = &pc->nodes[*link].hash_next;
    }
    *link = pc->nodes[node].hash_next;
    pc->nodes[node].hash_next = NONE;
}

static void lru_append(rp_prefix_cache *pc, int32_t node) {
    pc_node *x = &pc->nodes[node];
    RP_ASSERT(!x->in_lru);
    x->in_lru = 1;
    x->lru_prev = pc->lru_tail;
    x->lru_next = NONE;
    if (pc->lru_tail != NONE) pc->nodes[pc->lru_tail].lru_next = node;
    else pc->lru_head = node;
    pc->lru_tail = node;
    pc->num_evictable++;
}

static void lru_remove(rp_prefix_cache *pc, int32_t node) {
    pc_node *x = &pc->nodes[node];
    RP_ASSERT(x->in_lru);
    if (x->lru_prev != NONE) pc->nodes[x->lru_prev].lru_next = x->lru_next;
    else pc->lru_head = x->lru_next;
    if (x->lru_next != NONE) pc->nodes[x->lru_next].lru_prev = x->lru_prev;
    else pc->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NONE;
    x->in_lru = 0;
    pc->num_evictable--;
}

rp_prefix_cache *rp_prefix_cache_new(rp_page_pool *pool) {
    if (!pool) return NULL;
    rp_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->pool = pool;
    pc->page_size = pool->page_size;
    pc->num_pages = pool->num_pages;
    /* at least as many buckets as pages: chains stay about one node long */
    uint64_t num_buckets = 1;
    while (num_buckets < (uint64_t)pool->num_pages) num_buckets <<= 1;
    pc->bucket_mask = num_buckets - 1;
    pc->nodes = calloc((size_t)pool->num_pages, sizeof *pc->nodes);
    pc->tokens = malloc((size_t)pool->num_pages * (size_t)pool->page_size * sizeof *pc->tokens);
    pc->buckets = malloc((size_t)num_buckets * sizeof *pc->buckets);
    pc->scratch = malloc((size_t)pool->num_pages * sizeof *pc->scratch);
    if (!pc->nodes || !pc->tokens || !pc->buckets || !pc->scratch) {
        rp_prefix_cache_free(pc);
        return NULL;
    }
    for (uint64_t b = 0; b < num_buckets; b++) pc->buckets[b] = NONE;
    for (int i = 0; i < pool->num_pages; i++)
        pc->nodes[i] = (pc_node){.parent = NONE, .hash_next = NONE, .lru_prev = NONE, .lru_next = NONE};
    pc->lru_head = pc->lru_tail = NONE;
    return pc;
}

void rp_prefix_cache_free(rp_prefix_cache *pc) {
    if (!pc) return;
    if (pc->nodes)
        for (int32_t p = 0; p < pc->num_pages; p++)
            if (pc->nodes[p].cached) rp_page_pool_release(pc->pool, 1, &p);
    free(pc->nodes);
    free(pc->tokens);
    free(pc->buckets);
    free(pc->scratch);
    free(pc);
}

/* One more handle on the path root..node; pages it locks leave the LRU list. */
static rp_prefix_handle lock_path(rp_prefix_cache *pc, int32_t node, int num_pages) {
    if (node == NONE) return RP_PREFIX_HANDLE_NONE;
    pc->nodes[node].own_locks++;
    pc->num_handles++;
    for (int32_t n = node; n != NONE; n = pc->nodes[n].parent)
        if (pc->nodes[n].lock++ == 0 && pc->nodes[n].in_lru) lru_remove(pc, n);
    return (rp_prefix_handle){node, num_pages};
}

/* Makes the unlocked pages of the path root..node the most recently
 * released, deepest first so that descendants stay ahead of ancestors. The
 * unlocked pages of a path are its deep end (locks cover paths from the
 * root), so the walk stops at the first locked one. */
static void touch_path(rp_prefix_cache *pc, int32_t node) {
    for (int32_t n = node; n != NONE && pc->nodes[n].lock == 0; n = pc->nodes[n].parent) {
        if (pc->nodes[n].in_lru) lru_remove(pc, n);
        lru_append(pc, n);
    }
}

int rp_prefix_cache_match(rp_prefix_cache *pc, const int32_t *tokens, int num_tokens, int max_tokens,
                          int32_t *pages, rp_prefix_handle *handle) {
    if (max_tokens > num_tokens) max_tokens = num_tokens;
    int ps = pc->page_size, max_pages = max_tokens > 0 ? max_tokens / ps : 0, matched = 0;
    int32_t node = NONE;
    while (matched < max_pages) {
        const int32_t *t = tokens + (int64_t)matched * ps;
        int32_t child = lookup(pc, node, t, page_hash(node, t, ps));
        if (child == NONE) break;
        pages[matched++] = child;
        node = child;
    }
    if (handle) {
        *handle = lock_path(pc, node, matched);
        pc->queried_tokens += num_tokens > 0 ? (uint64_t)num_tokens : 0;
        pc->hit_tokens += (uint64_t)matched * ps;
    }
    return matched * ps;
}

int rp_prefix_cache_insert(rp_prefix_cache *pc, const int32_t *tokens, int num_tokens, const int32_t *pages,
                           int32_t *tree_pages, rp_prefix_handle *handle) {
    int ps = pc->page_size, full = num_tokens > 0 ? num_tokens / ps : 0, dups = 0;
    int32_t node = NONE;
    for (int i = 0; i < full; i++) {
        const int32_t *t = tokens + (int64_t)i * ps;
        uint64_t h = page_hash(node, t, ps);
        int32_t page = pages[i], have = lookup(pc, node, t, h);
        /* a page offered must be handed out by the pool, and be the
         * caller's own unless it is the cache's page for these very tokens */
        RP_ASSERT(page >= 0 && page < pc->num_pages && rp_page_pool_in_use(pc->pool, page));
        if (have == NONE) {
            RP_ASSERT(!pc->nodes[page].cached);
            pc_node *x = &pc->nodes[page];
            *x = (pc_node){.hash = h, .parent = node, .hash_next = pc->buckets[h & pc->bucket_mask],
                           .lru_prev = NONE, .lru_next = NONE, .cached = 1};
            pc->buckets[h & pc->bucket_mask] = page;
            memcpy(pc->tokens + (int64_t)page * ps, t, (size_t)ps * sizeof *t);
            if (node != NONE) pc->nodes[node].num_children++;
            pc->num_cached++;
            pc->inserted_pages++;
            have = page;
        } else if (have != page) {
            RP_ASSERT(!pc->nodes[page].cached);
            dups++;
        }
        tree_pages[i] = have;
        node = have;
    }
    pc->duplicate_pages += (uint64_t)dups;
    /* new pages are on no list yet: either path call puts them where they go */
    if (handle) *handle = lock_path(pc, node, full);
    else touch_path(pc, node);
    return dups;
}

void rp_prefix_cache_unlock(rp_prefix_cache *pc, rp_prefix_handle *handle) {
    if (handle->node == NONE) return;
    pc_node *end = &pc->nodes[handle->node];
    RP_ASSERT(end->cached && end->own_locks > 0);
    end->own_locks--;
    pc->num_handles--;
    int depth = 0;
    for (int32_t n = handle->node; n != NONE; n = pc->nodes[n].parent, depth++) {
        RP_ASSERT(pc->nodes[n].lock > 0);
        if (--pc->nodes[n].lock == 0) lru_append(pc, n);
    }
    RP_ASSERT(depth == handle->num_pages);
    *handle = RP_PREFIX_HANDLE_NONE;
}

rp_prefix_handle rp_prefix_cache_lock_again(rp_prefix_cache *pc, rp_prefix_handle handle) {
    if (handle.node == NONE) return RP_PREFIX_HANDLE_NONE;
    RP_ASSERT(pc->nodes[handle.node].own_locks > 0);
    return lock_path(pc, handle.node, handle.num_pages);
}

int rp_prefix_cache_evict(rp_prefix_cache *pc, int num_pages) {
    int freed = 0;
    while (freed < num_pages && pc->lru_head != NONE) {
        int32_t page = pc->lru_head;
        pc_node *x = &pc->nodes[page];
        RP_ASSERT(x->num_children == 0 && x->lock == 0);
        lru_remove(pc, page);
        hash_remove(pc, page);
        if (x->parent != NONE) pc->nodes[x->parent].num_children--;
        *x = (pc_node){.parent = NONE, .hash_next = NONE, .lru_prev = NONE, .lru_next = NONE};
        pc->num_cached--;
        rp_page_pool_release(pc->pool, 1, &page);
        freed++;
    }
    pc->evicted_pages += (uint64_t)freed;
    return freed;
}

int rp_prefix_cache_ensure_free(rp_prefix_cache *pc, int num_free_pages) {
    int missing = num_free_pages - rp_page_pool_num_free(pc->pool);
    if (missing > 0) rp_prefix_cache_evict(pc, missing);
    return rp_page_pool_num_free(pc->pool) >= num_free_pages ? 0 : -1;
}

int rp_prefix_cache_evictable_pages(const rp_prefix_cache *pc) { return pc->num_evictable; }

int rp_prefix_cache_unlocked_of(const rp_prefix_cache *pc, const int32_t *pages, int n) {
    int unlocked = 0;
    for (int i = 0; i < n; i++) unlocked += pc->nodes[pages[i]].lock == 0;
    return unlocked;
}

void rp_prefix_cache_get_stats(const rp_prefix_cache *pc, rp_prefix_cache_stats *s) {
    *s = (rp_prefix_cache_stats){
        .cached_pages = pc->num_cached,
        .evictable_pages = pc->num_evictable,
        .locked_pages = pc->num_cached - pc->num_evictable,
        .handles = pc->num_handles,
        .queried_tokens = pc->queried_tokens,
        .hit_tokens = pc->hit_tokens,
        .inserted_pages = pc->inserted_pages,
        .duplicate_pages = pc->duplicate_pages,
        .evicted_pages = pc->evicted_pages,
    };
}

/* Each node on its own: flags, pool, key, and its place in the hash table
 * (found under its own key: no sibling holds the same tokens). */
static int check_nodes(const rp_prefix_cache *pc, rp_err *err) {
    int cached = 0, unlocked = 0;
    for (int32_t p = 0; p < pc->num_pages; p++) {
        const pc_node *x = &pc->nodes[p];
        if (!x->cached) {
            if (x->lock || x->own_locks || x->in_lru || x->num_children || x->parent != NONE)
                return rp_errf(err, "prefix cache: page %d is not cached but has node state", p);
            continue;
        }
        cached++;
        unlocked += x->lock == 0;
        if (!rp_page_pool_in_use(pc->pool, p)) return rp_errf(err, "prefix cache: cached page %d is free in the pool", p);
        if (x->parent != NONE && (x->parent < 0 || x->parent >= pc->num_pages || !pc->nodes[x->parent].cached))
            return rp_errf(err, "prefix cache: page %d's parent %d is not cached", p, x->parent);
        if (x->lock < 0 || x->own_locks < 0 || x->num_children < 0)
            return rp_errf(err, "prefix cache: page %d has negative counts", p);
        if (x->in_lru != (x->lock == 0))
            return rp_errf(err, "prefix cache: page %d has lock %d but is %son the LRU list", p, x->lock,
                           x->in_lru ? "" : "not ");
        if (x->hash != page_hash(x->parent, node_tokens(pc, p), pc->page_size))
            return rp_errf(err, "prefix cache: page %d's hash is not its key's", p);
        if (lookup(pc, x->parent, node_tokens(pc, p), x->hash) != p)
            return rp_errf(err, "prefix cache: page %d is not found under its key (a sibling has the same tokens, "
                                "or it is missing from the table)", p);
    }
    if (cached != pc->num_cached) return rp_errf(err, "prefix cache: %d pages cached, counted %d", cached, pc->num_cached);
    if (unlocked != pc->num_evictable)
        return rp_errf(err, "prefix cache: %d pages unlocked, evictable count %d", unlocked, pc->num_evictable);
    return 0;
}

/* Children counts, and lock = own handles + the children's locks (so the
 * locks are exactly the handles outstanding, each counted along its path). */
static int check_counts(const rp_prefix_cache *pc, rp_err *err) {
    int32_t *sum = pc->scratch;
    memset(sum, 0, (size_t)pc->num_pages * sizeof *sum);
    for (int32_t p = 0; p < pc->num_pages; p++)
        if (pc->nodes[p].cached && pc->nodes[p].parent != NONE) sum[pc->nodes[p].parent]++;
    for (int32_t p = 0; p < pc->num_pages; p++)
        if (pc->nodes[p].cached && sum[p] != pc->nodes[p].num_children)
            return rp_errf(err, "prefix cache: page %d has %d children, counted %d", p, sum[p],
                           pc->nodes[p].num_children);
    memset(sum, 0, (size_t)pc->num_pages * sizeof *sum);
    int handles = 0;
    for (int32_t p = 0; p < pc->num_pages; p++) {
        if (!pc->nodes[p].cached) continue;
        handles += pc->nodes[p].own_locks;
        if (pc->nodes[p].parent != NONE) sum[pc->nodes[p].parent] += pc->nodes[p].lock;
    }
    for (int32_t p = 0; p < pc->num_pages; p++)
        if (pc->nodes[p].cached && pc->nodes[p].lock != pc->nodes[p].own_locks + sum[p])
            return rp_errf(err, "prefix cache: page %d has lock %d, its handles and children's locks make %d", p,
                           pc->nodes[p].lock, pc->nodes[p].own_locks + sum[p]);
    if (handles != pc->num_handles)
        return rp_errf(err, "prefix cache: %d handles counted, %d on the nodes", pc->num_handles, handles);
    return 0;
}

/* Every parent chain reaches the root: depths are found once each (a walk
 * stops at the first node whose depth is known), so a cycle shows as a walk
 * longer than the cache. */
static int check_acyclic(const rp_prefix_cache *pc, rp_err *err) {
    int32_t *depth = pc->scratch;
    for (int32_t p = 0; p < pc->num_pages; p++) depth[p] = -1;
    for (int32_t p = 0; p < pc->num_pages; p++) {
        if (!pc->nodes[p].cached || depth[p] >= 0) continue;
        int steps = 0;
        int32_t a = p;
        while (a != NONE && depth[a] < 0) {
            a = pc->nodes[a].parent;
            if (++steps > pc->num_cached) return rp_errf(err, "prefix cache: page %d's parents form a cycle", p);
        }
        int d = (a == NONE ? 0 : depth[a]) + steps;
        for (a = p; a != NONE && depth[a] < 0; a = pc->nodes[a].parent) depth[a] = d--;
    }
    return 0;
}

/* The hash table holds exactly the cached pages, each in its own bucket. */
static int check_table(const rp_prefix_cache *pc, rp_err *err) {
    int entries = 0;
    for (uint64_t b = 0; b <= pc->bucket_mask; b++)
        for (int32_t n = pc->buckets[b]; n != NONE; n = pc->nodes[n].hash_next) {
            if (n < 0 || n >= pc->num_pages || !pc->nodes[n].cached)
                return rp_errf(err, "prefix cache: bucket %llu holds %d, not a cached page", (unsigned long long)b, n);
            if ((pc->nodes[n].hash & pc->bucket_mask) != b)
                return rp_errf(err, "prefix cache: page %d is in the wrong bucket", n);
            if (++entries > pc->num_cached)
                return rp_errf(err, "prefix cache: the hash table holds more entries than %d cached pages",
                               pc->num_cached);
        }
    if (entries != pc->num_cached)
        return rp_errf(err, "prefix cache: the hash table holds %d of %d cached pages", entries, pc->num_cached);
    return 0;
}

/* The LRU list: well linked, exactly the unlocked pages, and every page
 * behind its unlocked descendants (so the head is a leaf). */
static int check_lru(const rp_prefix_cache *pc, rp_err *err) {
    int32_t *pos = pc->scratch;
    int len = 0;
    int32_t prev = NONE;
    for (int32_t n = pc->lru_head; n != NONE; prev = n, n = pc->nodes[n].lru_next) {
        if (n < 0 || n >= pc->num_pages || !pc->nodes[n].in_lru)
            return rp_errf(err, "prefix cache: LRU list holds %d, not an unlocked page", n);
        if (pc->nodes[n].lru_prev != prev) return rp_errf(err, "prefix cache: LRU list broken at page %d", n);
        if (len >= pc->num_evictable)
            return rp_errf(err, "prefix cache: LRU list longer than %d evictable pages", pc->num_evictable);
        pos[n] = len++;
    }
    if (prev != pc->lru_tail) return rp_errf(err, "prefix cache: LRU list's tail is %d, not %d", pc->lru_tail, prev);
    if (len != pc->num_evictable)
        return rp_errf(err, "prefix cache: LRU list holds %d pages, evictable count %d", len, pc->num_evictable);
    for (int32_t n = pc->lru_head; n != NONE; n = pc->nodes[n].lru_next) {
        int32_t parent = pc->nodes[n].parent;
        if (parent != NONE && pc->nodes[parent].in_lru && pos[parent] < pos[n])
            return rp_errf(err, "prefix cache: page %d comes before its child %d on the LRU list", parent, n);
        if (n == pc->lru_head && pc->nodes[n].num_children)
            return rp_errf(err, "prefix cache: LRU head %d is not a leaf", n);
    }
    return 0;
}

int rp_prefix_cache_check(const rp_prefix_cache *pc, rp_err *err) {
    int rc;
    if ((rc = rp_page_pool_check(pc->pool, err))) return rc;
    if ((rc = check_nodes(pc, err))) return rc;
    if ((rc = check_counts(pc, err))) return rc;
    if ((rc = check_acyclic(pc, err))) return rc;
    if ((rc = check_table(pc, err))) return rc;
    return check_lru(pc, err);
}
