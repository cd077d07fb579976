/* The prefix cache: matches of every length around page boundaries,
 * sequences diverging inside a cached one, duplicates, locks, LRU eviction
 * and its cascade up the trie, the counters, and a fuzz run of simulated
 * requests (arrive, prefill, share with n choices, finish, abort, preempt)
 * against a tiny pool, with every invariant checked after each operation and
 * every page back in the pool at the end. */
#include "kv/prefix_cache.h"
#include "test_util.h"

#define PS 4 /* tokens per page in every test */

static void expect_ok(const rp_prefix_cache *pc) {
    rp_err err;
    if (rp_prefix_cache_check(pc, &err)) fail_msg("%s", err.msg);
}

static rp_prefix_cache_stats stats_of(const rp_prefix_cache *pc) {
    rp_prefix_cache_stats s;
    rp_prefix_cache_get_stats(pc, &s);
    return s;
}

/* tokens base, base + 1, ... */
static void iota(int32_t *t, int n, int32_t base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

/* Allocates pages for n tokens and hands their full pages to the cache, as
 * a finished request does; frees the duplicates and the partial page.
 * Returns the duplicates; pages[] gets the cache's pages. */
static int finish_sequence(rp_prefix_cache *pc, rp_page_pool *pool, const int32_t *t, int n, int32_t *pages) {
    int num_pages = (n + PS - 1) / PS, full = n / PS;
    int32_t own[64], tree[64];
    assert_int_equal(rp_page_pool_alloc(pool, num_pages, own), 0);
    int dups = rp_prefix_cache_insert(pc, t, n, own, tree, NULL);
    for (int i = 0; i < full; i++)
        if (tree[i] != own[i]) rp_page_pool_release(pool, 1, &own[i]);
    rp_page_pool_release(pool, num_pages - full, own + full);
    if (pages) memcpy(pages, tree, (size_t)full * sizeof *tree);
    expect_ok(pc);
    return dups;
}

static void test_empty(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(8, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    assert_non_null(pc);
    expect_ok(pc);
    int32_t t[16], pages[4];
    iota(t, 16, 1);
    rp_prefix_handle h = {123, 7};
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, &h), 0);
    assert_int_equal(h.node, -1);
    rp_prefix_cache_unlock(pc, &h); /* unlocking nothing is fine */
    assert_int_equal(rp_prefix_cache_evict(pc, 5), 0);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 0);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 8), 0);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 9), -1);
    rp_prefix_cache_stats s = stats_of(pc);
    assert_int_equal(s.cached_pages, 0);
    assert_int_equal(s.queried_tokens, 16);
    assert_int_equal(s.hit_tokens, 0);
    /* inserting less than a page caches nothing */
    assert_int_equal(finish_sequence(pc, pool, t, PS - 1, NULL), 0);
    assert_int_equal(stats_of(pc).cached_pages, 0);
    assert_int_equal(rp_page_pool_num_free(pool), 8);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* Exact, partial, longer and unrelated prompts against one cached sequence. */
static void test_insert_match(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(16, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[32], tree[8], pages[8];
    iota(t, 32, 100);
    assert_int_equal(finish_sequence(pc, pool, t, 18, tree), 0); /* 4 full pages, 2 tokens dropped */
    assert_int_equal(stats_of(pc).cached_pages, 4);
    assert_int_equal(rp_page_pool_num_free(pool), 12);
    rp_prefix_handle h;
    /* exact */
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, &h), 16);
    assert_memory_equal(pages, tree, 4 * sizeof *pages);
    assert_int_equal(h.num_pages, 4);
    assert_int_equal(h.node, tree[3]);
    rp_prefix_cache_unlock(pc, &h);
    assert_int_equal(h.node, -1);
    /* the caller keeps one token to compute: the last page is left out */
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 15, pages, &h), 12);
    rp_prefix_cache_unlock(pc, &h);
    /* a longer prompt finds all four */
    assert_int_equal(rp_prefix_cache_match(pc, t, 30, 29, pages, &h), 16);
    assert_memory_equal(pages, tree, 4 * sizeof *pages);
    rp_prefix_cache_unlock(pc, &h);
    /* partial: differs at token 9 (page 2): two pages */
    int32_t u[32];
    memcpy(u, t, sizeof u);
    u[9] = -5;
    assert_int_equal(rp_prefix_cache_match(pc, u, 20, 19, pages, &h), 8);
    assert_memory_equal(pages, tree, 2 * sizeof *pages);
    rp_prefix_cache_unlock(pc, &h);
    /* differs at the first token: nothing */
    u[0] = -1;
    assert_int_equal(rp_prefix_cache_match(pc, u, 20, 19, pages, &h), 0);
    /* the same tokens one position later are another prefix */
    assert_int_equal(rp_prefix_cache_match(pc, t + 1, 20, 19, pages, NULL), 0);
    expect_ok(pc);
    assert_int_equal(rp_prefix_cache_evict(pc, 100), 4);
    assert_int_equal(rp_page_pool_num_free(pool), 16);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* Prompts of page_size - 1, page_size, page_size + 1, 2 page_size +- 1
 * against a cached 3-page prefix, with and without the last token kept back;
 * and sequences of those lengths inserted. */
static void test_page_boundaries(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(16, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[32], pages[8];
    iota(t, 32, 7);
    finish_sequence(pc, pool, t, 3 * PS, NULL);
    static const struct {
        int len, max, want;
    } cases[] = {
        {PS - 1, PS - 1, 0},          {PS - 1, PS - 2, 0},          {PS, PS, PS},
        {PS, PS - 1, 0},              {PS + 1, PS, PS},             {PS + 1, PS + 1, PS},
        {2 * PS - 1, 2 * PS - 2, PS}, {2 * PS, 2 * PS, 2 * PS},     {2 * PS, 2 * PS - 1, PS},
        {2 * PS + 1, 2 * PS, 2 * PS}, {3 * PS, 3 * PS, 3 * PS},     {3 * PS, 3 * PS - 1, 2 * PS},
        {3 * PS + 1, 3 * PS, 3 * PS}, {5 * PS, 5 * PS - 1, 3 * PS}, {PS, 2 * PS, PS}, /* max past the end */
        {PS, 0, 0},                   {PS, -3, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rp_prefix_handle h;
        int got = rp_prefix_cache_match(pc, t, cases[i].len, cases[i].max, pages, &h);
        if (got != cases[i].want)
            fail_msg("len %d max %d: matched %d, want %d", cases[i].len, cases[i].max, got, cases[i].want);
        assert_int_equal(h.num_pages, got / PS);
        expect_ok(pc);
        rp_prefix_cache_unlock(pc, &h);
    }
    rp_prefix_cache_evict(pc, 100);
    /* inserting each length keeps exactly its full pages */
    static const int lens[] = {PS - 1, PS, PS + 1, 2 * PS - 1, 2 * PS, 2 * PS + 1};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        finish_sequence(pc, pool, t, lens[i], NULL);
        assert_int_equal(stats_of(pc).cached_pages, lens[i] / PS);
        assert_int_equal(rp_prefix_cache_match(pc, t, 32, 32, pages, NULL), lens[i] / PS * PS);
        rp_prefix_cache_evict(pc, 100);
        assert_int_equal(rp_page_pool_num_free(pool), 16);
    }
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* A second sequence leaving the first in the middle of its third page: the
 * shared pages stay one, the rest branches off (an edge "split" at a page
 * boundary), and each prompt finds its own path. */
static void test_divergence(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(16, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t a[16], b[16], c[16], ta[4], pages[4];
    iota(a, 16, 50);
    memcpy(b, a, sizeof b);
    b[10] = 999; /* page 2, offset 2 */
    b[14] = 998;
    finish_sequence(pc, pool, a, 16, ta);
    /* b as a request would run it: match, own pages for the rest, insert */
    rp_prefix_handle h;
    int32_t row[4], tree[4];
    assert_int_equal(rp_prefix_cache_match(pc, b, 16, 15, row, &h), 8);
    assert_memory_equal(row, ta, 2 * sizeof *row);
    assert_int_equal(rp_page_pool_alloc(pool, 2, row + 2), 0);
    assert_int_equal(rp_prefix_cache_insert(pc, b, 16, row, tree, NULL), 0);
    assert_memory_equal(tree, row, sizeof row);
    rp_prefix_cache_unlock(pc, &h);
    expect_ok(pc);
    assert_int_equal(stats_of(pc).cached_pages, 6);
    assert_int_equal(rp_prefix_cache_match(pc, a, 16, 16, pages, NULL), 16);
    assert_memory_equal(pages, ta, sizeof pages);
    assert_int_equal(rp_prefix_cache_match(pc, b, 16, 16, pages, NULL), 16);
    assert_memory_equal(pages, row, sizeof pages);
    /* c leaves both at token 9: two pages */
    memcpy(c, a, sizeof c);
    c[9] = 777;
    assert_int_equal(rp_prefix_cache_match(pc, c, 16, 16, pages, NULL), 8);
    /* a third branch at the same node, entered through its first token only
     * differing from a's at the page's last token */
    memcpy(c, a, sizeof c);
    c[11] = 555;
    finish_sequence(pc, pool, c, 12, NULL);
    assert_int_equal(stats_of(pc).cached_pages, 7);
    assert_int_equal(rp_prefix_cache_match(pc, c, 16, 16, pages, NULL), 12);
    assert_memory_equal(pages, ta, 2 * sizeof *pages);
    assert_int_not_equal(pages[2], ta[2]);
    assert_int_not_equal(pages[2], row[2]);
    /* a second branch from the root */
    b[0] = -1;
    finish_sequence(pc, pool, b, 8, NULL);
    assert_int_equal(rp_prefix_cache_match(pc, b, 16, 16, pages, NULL), 8);
    assert_int_equal(rp_prefix_cache_evict(pc, 100), 9);
    assert_int_equal(rp_page_pool_num_free(pool), 16);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* Two requests computed the same tokens: the second one's pages come back
 * as duplicates, the cache keeps the first one's. */
static void test_duplicates(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(16, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[16], first[4], second[4], tree[4];
    iota(t, 16, 3);
    assert_int_equal(rp_page_pool_alloc(pool, 4, first), 0);
    assert_int_equal(rp_page_pool_alloc(pool, 4, second), 0);
    assert_int_equal(rp_prefix_cache_insert(pc, t, 16, first, tree, NULL), 0);
    assert_memory_equal(tree, first, sizeof tree);
    /* the second sequence shares 3 pages, then differs */
    t[13] = -13;
    assert_int_equal(rp_prefix_cache_insert(pc, t, 16, second, tree, NULL), 3);
    assert_memory_equal(tree, first, 3 * sizeof *tree);
    assert_int_equal(tree[3], second[3]);
    rp_page_pool_release(pool, 3, second);
    rp_prefix_cache_stats s = stats_of(pc);
    assert_int_equal(s.cached_pages, 5);
    assert_int_equal(s.inserted_pages, 5);
    assert_int_equal(s.duplicate_pages, 3);
    /* inserting the cache's own pages again changes nothing */
    assert_int_equal(rp_prefix_cache_insert(pc, t, 16, tree, second, NULL), 0);
    assert_memory_equal(second, tree, sizeof tree);
    assert_int_equal(stats_of(pc).cached_pages, 5);
    expect_ok(pc);
    assert_int_equal(rp_prefix_cache_evict(pc, 100), 5);
    assert_int_equal(rp_page_pool_num_free(pool), 16);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* A locked path is never evicted; unlocked pages below a locked one are. */
static void test_lock(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(8, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[16], tree[4], pages[4];
    iota(t, 16, 1);
    finish_sequence(pc, pool, t, 16, tree);
    rp_prefix_handle all, half;
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, &all), 16);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 0);
    assert_int_equal(stats_of(pc).locked_pages, 4);
    assert_int_equal(rp_prefix_cache_evict(pc, 4), 0);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 5), -1);
    assert_int_equal(rp_prefix_cache_match(pc, t, 9, 9, pages, &half), 8);
    rp_prefix_handle again = rp_prefix_cache_lock_again(pc, half);
    assert_int_equal(again.node, half.node);
    assert_int_equal(stats_of(pc).handles, 3);
    expect_ok(pc);
    rp_prefix_cache_unlock(pc, &all);
    /* the two pages past the half lock are evictable, deepest first */
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 2);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, NULL), 12);
    assert_int_equal(rp_prefix_cache_evict(pc, 10), 1);
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, NULL), 8);
    expect_ok(pc);
    rp_prefix_cache_unlock(pc, &half);
    assert_int_equal(rp_prefix_cache_evict(pc, 10), 0); /* `again` still holds it */
    rp_prefix_cache_unlock(pc, &again);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 2);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 8), 0);
    assert_int_equal(rp_page_pool_num_free(pool), 8);
    rp_prefix_handle none = RP_PREFIX_HANDLE_NONE;
    assert_int_equal(rp_prefix_cache_lock_again(pc, none).node, -1);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* Insert with a lock: a request that goes on running (or is preempted) keeps
 * the pages it handed over. */
static void test_insert_locked(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(8, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[16], own[4], tree[4], pages[4];
    iota(t, 16, 1);
    assert_int_equal(rp_page_pool_alloc(pool, 4, own), 0);
    rp_prefix_handle prompt, longer;
    /* the prompt's first two pages after prefill, then all four */
    assert_int_equal(rp_prefix_cache_insert(pc, t, 9, own, tree, &prompt), 0);
    assert_int_equal(prompt.num_pages, 2);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 0);
    assert_int_equal(rp_prefix_cache_insert(pc, t, 16, own, tree, &longer), 0);
    rp_prefix_cache_unlock(pc, &prompt);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 0);
    assert_int_equal(stats_of(pc).locked_pages, 4);
    expect_ok(pc);
    assert_int_equal(rp_prefix_cache_match(pc, t, 16, 16, pages, NULL), 16);
    rp_prefix_cache_unlock(pc, &longer);
    assert_int_equal(rp_prefix_cache_evict(pc, 10), 4);
    assert_int_equal(rp_page_pool_num_free(pool), 8);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* Eviction takes the page released longest ago, and a parent only after
 * its children: X and Y share a first page; Z is alone. */
static void test_evict_lru(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(16, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t x[8], y[8], z[8], px[2], py[2], pz[2], pages[2];
    iota(x, 8, 10);
    memcpy(y, x, sizeof y);
    y[5] = -5;
    iota(z, 8, 500);
    finish_sequence(pc, pool, x, 8, px); /* released order: x1 x0 */
    finish_sequence(pc, pool, z, 8, pz); /* then z1 z0 */
    finish_sequence(pc, pool, y, 8, py); /* then y1 x0 (shared, touched) */
    assert_int_equal(py[0], px[0]);
    /* using z makes it the most recent: order x1 y1 x0 z1 z0 */
    rp_prefix_handle h;
    assert_int_equal(rp_prefix_cache_match(pc, z, 8, 8, pages, &h), 8);
    rp_prefix_cache_unlock(pc, &h);
    assert_int_equal(rp_prefix_cache_evictable_pages(pc), 5);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_match(pc, x, 8, 8, pages, NULL), 4);
    assert_int_equal(rp_prefix_cache_match(pc, y, 8, 8, pages, NULL), 8);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_match(pc, y, 8, 8, pages, NULL), 4);
    assert_int_equal(rp_prefix_cache_match(pc, z, 8, 8, pages, NULL), 8);
    /* x0 is now a leaf, and older than z: it goes next (the cascade) */
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_match(pc, x, 8, 8, pages, NULL), 0);
    assert_int_equal(rp_prefix_cache_match(pc, z, 8, 8, pages, NULL), 8);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_match(pc, z, 8, 8, pages, NULL), 4);
    expect_ok(pc);
    /* freed pages are the pool's again: the last one freed is handed out first */
    int32_t got;
    assert_int_equal(rp_page_pool_alloc(pool, 1, &got), 0);
    assert_int_equal(got, pz[1]);
    rp_page_pool_release(pool, 1, &got);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 1);
    assert_int_equal(rp_prefix_cache_evict(pc, 1), 0);
    assert_int_equal(rp_page_pool_num_free(pool), 16);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* One long sequence evicted in one call: the leaf, then each parent as it
 * becomes one; ensure_free evicts only what is missing. */
static void test_evict_cascade(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(10, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[32], pages[8];
    iota(t, 32, 1);
    finish_sequence(pc, pool, t, 32, NULL);
    assert_int_equal(rp_page_pool_num_free(pool), 2);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 5), 0);
    assert_int_equal(rp_page_pool_num_free(pool), 5);
    assert_int_equal(rp_prefix_cache_match(pc, t, 32, 32, pages, NULL), 5 * PS);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 3), 0); /* already free: evicts nothing */
    assert_int_equal(stats_of(pc).cached_pages, 5);
    assert_int_equal(rp_prefix_cache_evict(pc, 4), 4);
    assert_int_equal(rp_prefix_cache_match(pc, t, 32, 32, pages, NULL), PS);
    assert_int_equal(rp_prefix_cache_ensure_free(pc, 11), -1); /* more than the pool: all evicted, still short */
    assert_int_equal(rp_page_pool_num_free(pool), 10);
    assert_int_equal(stats_of(pc).evicted_pages, 8);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

static void test_stats(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(8, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[16], pages[4];
    iota(t, 16, 1);
    rp_prefix_handle h;
    rp_prefix_cache_match(pc, t, 10, 9, pages, &h); /* miss: 10 queried */
    finish_sequence(pc, pool, t, 10, NULL);
    rp_prefix_cache_match(pc, t, 10, 9, pages, &h); /* hit 8 of 10 */
    rp_prefix_handle h2;
    rp_prefix_cache_match(pc, t, 6, 5, pages, &h2); /* hit 4 of 6 */
    rp_prefix_cache_match(pc, t, 16, 16, pages, NULL); /* a peek counts nothing */
    rp_prefix_cache_stats s = stats_of(pc);
    assert_int_equal(s.queried_tokens, 26);
    assert_int_equal(s.hit_tokens, 12);
    assert_int_equal(s.cached_pages, 2);
    assert_int_equal(s.locked_pages, 2);
    assert_int_equal(s.evictable_pages, 0);
    assert_int_equal(s.handles, 2);
    assert_int_equal(s.inserted_pages, 2);
    rp_prefix_cache_unlock(pc, &h);
    s = stats_of(pc);
    assert_int_equal(s.locked_pages, 1);
    assert_int_equal(s.evictable_pages, 1);
    rp_prefix_cache_unlock(pc, &h2);
    rp_prefix_cache_evict(pc, 8);
    s = stats_of(pc);
    assert_int_equal(s.cached_pages, 0);
    assert_int_equal(s.evicted_pages, 2);
    assert_int_equal(s.handles, 0);
    expect_ok(pc);
    rp_prefix_cache_free(pc);
    rp_page_pool_free(pool);
}

/* The check sees a cached page handed back to the pool behind the cache's
 * back, and the cache is whole again once the page is taken back. */
static void test_check_catches(void **state) {
    (void)state;
    rp_page_pool *pool = rp_page_pool_new(8, PS);
    rp_prefix_cache *pc = rp_prefix_cache_new(pool);
    int32_t t[8], tree[2];
    iota(t, 8, 1);
    finish_sequence(pc, pool, t, 8, tree);
    rp_page_pool_release(pool, 1, &tree[1]);
    rp_err err;
    assert_int_not_equal(rp_prefix_cache_check(pc, &err), 0);
    assert_non_null(strstr(err.msg, "free in the pool"));
    int32_t back;
    assert_int_equal(rp_page_pool_alloc(pool, 1, &back), 0);
    assert_int_equal(back, tree[1]);
    expect_ok(pc);
    rp_prefix_cache_free(pc); /* gives its pages back */
    assert_int_equal(rp_page_pool_num_free(pool), 8);
    assert_int_equal(rp_page_pool_check(pool, &err), 0);
    rp_page_pool_free(pool);
}

/* ---- fuzz: simulated requests against a tiny pool ---- */

#define FUZZ_PAGES 64
#define MAX_LEN 48
#define MAX_ROW (MAX_LEN / PS)
#define MAX_REQS 12

typedef struct sim_req {
    int live;
    int32_t tokens[MAX_LEN];
    uint64_t kv[MAX_LEN]; /* what the K/V of each position must be: a hash of the prefix up to it */
    int prompt_len, len;  /* prompt, and prompt plus output */
    int computed;         /* positions whose K/V are written */
    int32_t row[MAX_ROW];
    int row_pages;        /* pages held: row[0..shared) the cache's, the rest its own */
    int shared;
    int prompt_inserted;
    rp_prefix_handle h;
} sim_req;

typedef struct sim {
    uint64_t rng;
    rp_page_pool *pool;
    rp_prefix_cache *pc;
    sim_req reqs[MAX_REQS];
    uint64_t content[FUZZ_PAGES * PS]; /* what each page slot holds */
    int32_t prefixes[4][24];
    int prefix_len[4];
    int admitted, rejected, finished, preempted, full_hits;
} sim;

static uint32_t rnd(sim *s, uint32_t n) {
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (uint32_t)((s->rng * 0x2545f4914f6cdd1dull) >> 33) % n;
}

static void fill_kv(sim_req *r) {
    uint64_t h = 0x1234567;
    for (int i = 0; i < r->len; i++) {
        h = (h ^ (uint32_t)r->tokens[i]) * 0x100000001b3ull;
        r->kv[i] = h;
    }
}

/* The pages a match or insert gives a request must hold its prefix's K/V. */
static void expect_content(const sim *s, const sim_req *r, int num_pages) {
    for (int i = 0; i < num_pages * PS; i++)
        if (s->content[r->row[i / PS] * PS + i % PS] != r->kv[i])
            fail_msg("page %d (position %d) does not hold the prefix's K/V", r->row[i / PS], i);
}

/* Every page handed out is the cache's or exactly one request's own. */
static void audit(const sim *s) {
    expect_ok(s->pc);
    int own = 0;
    for (int i = 0; i < MAX_REQS; i++)
        if (s->reqs[i].live) own += s->reqs[i].row_pages - s->reqs[i].shared;
    int in_use = FUZZ_PAGES - rp_page_pool_num_free(s->pool);
    assert_int_equal(in_use, own + stats_of(s->pc).cached_pages);
}

/* Admission: match the prompt (one token left to compute), take own pages
 * for the rest, evicting what it takes; turned away only when the pool is
 * short with the cache evicted to its locked pages. */
static void admit(sim *s, sim_req *r, int num_prompt) {
    r->prompt_len = num_prompt;
    r->prompt_inserted = 0;
    int matched = rp_prefix_cache_match(s->pc, r->tokens, num_prompt, num_prompt - 1, r->row, &r->h);
    assert_int_equal(matched % PS, 0);
    assert_true(matched < num_prompt);
    r->shared = matched / PS;
    expect_content(s, r, r->shared);
    r->computed = matched;
    int need = (r->len + PS - 1) / PS - r->shared;
    if (rp_prefix_cache_ensure_free(s->pc, need)) {
        assert_int_equal(rp_prefix_cache_evictable_pages(s->pc), 0);
        rp_prefix_cache_unlock(s->pc, &r->h);
        r->live = 0;
        s->rejected++;
        return;
    }
    assert_int_equal(rp_page_pool_alloc(s->pool, need, r->row + r->shared), 0);
    r->row_pages = r->shared + need;
    r->live = 1;
    s->admitted++;
    s->full_hits += matched == (num_prompt - 1) / PS * PS && matched > 0;
}

static void arrive(sim *s, sim_req *r) {
    int k = (int)rnd(s, 4), n = 0;
    int take = rnd(s, 4) ? s->prefix_len[k] : (int)rnd(s, (uint32_t)s->prefix_len[k] + 1);
    for (; n < take; n++) r->tokens[n] = s->prefixes[k][n];
    int suffix = (int)rnd(s, 11);
    for (int i = 0; i < suffix; i++) r->tokens[n++] = (int32_t)rnd(s, 3); /* tiny vocabulary: suffixes collide */
    if (n == 0) r->tokens[n++] = 1;
    int out = (int)rnd(s, 9);
    for (int i = 0; i < out && n < MAX_LEN; i++) r->tokens[n++] = 1000 + (int32_t)rnd(s, 5);
    int num_prompt = n - out < 1 ? 1 : n - out;
    r->len = n;
    fill_kv(r);
    admit(s, r, num_prompt);
}

/* A prefill chunk or a decode step: writes K/V into its own pages only. */
static void step(sim *s, sim_req *r) {
    int n = 1 + (int)rnd(s, 8);
    if (r->computed + n > r->len) n = r->len - r->computed;
    for (int p = r->computed; p < r->computed + n; p++) {
        assert_true(p / PS >= r->shared); /* never into a page of the cache */
        s->content[r->row[p / PS] * PS + p % PS] = r->kv[p];
    }
    r->computed += n;
}

/* After prefill the prompt's full pages go to the cache at once (so that
 * requests arriving meanwhile share them); the request locks them and
 * switches to the cache's copy of any page it computed twice. */
static void insert_prompt(sim *s, sim_req *r) {
    int32_t tree[MAX_ROW];
    rp_prefix_handle h;
    int full = r->computed / PS;
    int dups = rp_prefix_cache_insert(s->pc, r->tokens, r->computed, r->row, tree, &h);
    int seen = 0;
    for (int i = 0; i < full; i++)
        if (tree[i] != r->row[i]) {
            assert_true(i >= r->shared);
            rp_page_pool_release(s->pool, 1, &r->row[i]);
            r->row[i] = tree[i];
            seen++;
        }
    assert_int_equal(seen, dups);
    rp_prefix_cache_unlock(s->pc, &r->h);
    r->h = h;
    r->shared = full;
    r->prompt_inserted = 1;
    expect_content(s, r, full);
}

/* Finish, abort or preemption: the computed full pages go to the cache
 * (unless keep is 0: an abort that drops them), duplicates and the rest go
 * back to the pool, and the lock is given back. */
static void finish(sim *s, sim_req *r, int keep) {
    int full = r->computed / PS;
    int32_t tree[MAX_ROW];
    if (keep) rp_prefix_cache_insert(s->pc, r->tokens, r->computed, r->row, tree, NULL);
    for (int i = r->shared; i < r->row_pages; i++)
        if (!keep || i >= full || tree[i] != r->row[i]) rp_page_pool_release(s->pool, 1, &r->row[i]);
    rp_prefix_cache_unlock(s->pc, &r->h);
    r->live = 0;
    if (keep) {
        r->row_pages = r->shared = full;
        memcpy(r->row, tree, (size_t)full * sizeof *tree);
        expect_content(s, r, full);
        r->shared = r->row_pages = 0;
    }
}

static void fuzz_one(uint64_t seed, int ops) {
    print_message("prefix cache fuzz: seed %llu, %d operations\n", (unsigned long long)seed, ops);
    sim *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->rng = seed * 0x9e3779b97f4a7c15ull + 1;
    s->pool = rp_page_pool_new(FUZZ_PAGES, PS);
    s->pc = rp_prefix_cache_new(s->pool);
    static const int lens[] = {3, 4, 5, 8, 11, 16, 17, 23};
    for (int k = 0; k < 4; k++) {
        s->prefix_len[k] = lens[rnd(s, 8)];
        for (int i = 0; i < s->prefix_len[k]; i++) s->prefixes[k][i] = 100 + (int32_t)rnd(s, 50);
    }
    for (int op = 0; op < ops; op++) {
        sim_req *r = &s->reqs[rnd(s, MAX_REQS)];
        int what = (int)rnd(s, 100);
        if (!r->live) {
            if (what < 60) arrive(s, r);
            else if (what < 75) rp_prefix_cache_evict(s->pc, (int)rnd(s, 12));
            else if (what < 85) {
                /* n choices: another request on a running one's cached prompt */
                sim_req *o = &s->reqs[rnd(s, MAX_REQS)];
                if (o->live && o->h.node >= 0 && o->h.num_pages == o->shared) {
                    int need = (o->len + PS - 1) / PS - o->shared;
                    if (rp_prefix_cache_ensure_free(s->pc, need) == 0) {
                        *r = *o;
                        r->h = rp_prefix_cache_lock_again(s->pc, o->h);
                        r->computed = r->shared * PS;
                        r->prompt_inserted = 0;
                        assert_int_equal(rp_page_pool_alloc(s->pool, need, r->row + r->shared), 0);
                        r->row_pages = r->shared + need;
                    }
                }
            } else {
                /* a peek changes nothing */
                sim_req tmp;
                arrive(s, &tmp);
                if (tmp.live) {
                    rp_prefix_cache_stats before = stats_of(s->pc);
                    int32_t pages[MAX_ROW];
                    int got = rp_prefix_cache_match(s->pc, tmp.tokens, tmp.len, tmp.len, pages, NULL);
                    rp_prefix_cache_stats after = stats_of(s->pc);
                    assert_memory_equal(&before, &after, sizeof before);
                    assert_true(got >= tmp.shared * PS);
                    finish(s, &tmp, 0);
                }
            }
        } else if (what < 55) {
            if (r->computed < r->len) step(s, r);
            else finish(s, r, 1), s->finished++;
        } else if (what < 65) {
            if (!r->prompt_inserted && r->computed >= r->prompt_len) insert_prompt(s, r);
        } else if (what < 75) {
            finish(s, r, 1);
            s->finished++;
        } else if (what < 80) {
            finish(s, r, (int)rnd(s, 2)); /* abort: with or without keeping its pages */
        } else if (what < 88) {
            /* preemption: hand over what is computed, come back with it as the prompt */
            int done = r->computed, prompt = r->computed > r->prompt_len ? r->computed : r->prompt_len;
            finish(s, r, 1);
            s->preempted++;
            admit(s, r, prompt);
            int full = done / PS, keep_back = (prompt - 1) / PS;
            if (r->live) assert_true(r->shared >= (full < keep_back ? full : keep_back));
        } else {
            rp_prefix_cache_evict(s->pc, (int)rnd(s, 12));
        }
        audit(s);
    }
    for (int i = 0; i < MAX_REQS; i++)
        if (s->reqs[i].live) finish(s, &s->reqs[i], 1);
    audit(s);
    rp_prefix_cache_stats st = stats_of(s->pc);
    print_message("  admitted %d, turned away %d, finished %d, preempted %d, full hits %d; "
                  "hit %llu of %llu tokens, %llu pages evicted, %llu duplicates\n",
                  s->admitted, s->rejected, s->finished, s->preempted, s->full_hits,
                  (unsigned long long)st.hit_tokens, (unsigned long long)st.queried_tokens,
                  (unsigned long long)st.evicted_pages, (unsigned long long)st.duplicate_pages);
    assert_int_equal(st.handles, 0);
    assert_int_equal(st.locked_pages, 0);
    assert_true(st.hit_tokens > 0 && st.evicted_pages > 0 && st.duplicate_pages > 0);
    assert_int_equal(rp_prefix_cache_evict(s->pc, FUZZ_PAGES), st.cached_pages);
    audit(s);
    assert_int_equal(rp_page_pool_num_free(s->pool), FUZZ_PAGES);
    rp_prefix_cache_free(s->pc);
    rp_page_pool_free(s->pool);
    free(s);
}

static void test_fuzz(void **state) {
    (void)state;
    static const uint64_t seeds[] = {1, 2, 3, 42, 20261201};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) fuzz_one(seeds[i], 20000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),          cmocka_unit_test(test_insert_match),
        cmocka_unit_test(test_page_boundaries), cmocka_unit_test(test_divergence),
        cmocka_unit_test(test_duplicates),     cmocka_unit_test(test_lock),
        cmocka_unit_test(test_insert_locked),  cmocka_unit_test(test_evict_lru),
        cmocka_unit_test(test_evict_cascade),  cmocka_unit_test(test_stats),
        cmocka_unit_test(test_check_catches),  cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
