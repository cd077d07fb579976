/* The prefix cache: KV pages of token prefixes already computed, kept after
 * their requests finish so that a later request starting with the same
 * tokens (a shared system prompt, the history of a chat, the n choices of one
 * request, a preempted request coming back) prefills only the rest. vLLM
 * calls it automatic prefix caching, SGLang RadixAttention.
 *
 * Shape: a trie of full pages. Every node is one KV page and its page_size
 * tokens; a node's parent is the page before it, so a path from the root
 * spells a prefix whose length is a whole number of pages. This is vLLM's
 * chain of block hashes (each block keyed by its parent and its tokens), and
 * SGLang's radix tree with page_size > 1 with every edge cut at each page:
 * the node of a page is the page id itself, so nodes live in arrays
 * allocated once, an edge never needs splitting when a sequence diverges in
 * the middle of a cached one, and eviction frees exactly the pages asked
 * for. Children are found in one hash table keyed by (parent, tokens); the
 * tokens are compared on every hit, so a hash collision costs a compare,
 * never a wrong page.
 *
 * Only full pages are cached. A prompt whose cached prefix ends inside a page
 * recomputes that page's tokens into a page of its own (at most page_size - 1
 * tokens): no copy-on-write, and no page ever has two writers.
 *
 * Ownership: each page of the pool is, at any time, in exactly one place:
 *   - free in the pool;
 *   - a request's own (its page-table row allocated it; only it writes or
 *     reads it);
 *   - the cache's (a node). Cached pages are never written again: their
 *     tokens and K/V are final. A request that reads them holds a lock on
 *     their path (rp_prefix_handle), not a reference on each page; a locked
 *     page is never evicted. The pool keeps no reference counts.
 * A request's own full pages become the cache's when it inserts them
 * (rp_prefix_cache_insert); where the cache already holds the same tokens
 * (another request computed them meanwhile), the request's page stays its
 * own, reported back as a duplicate to free or to keep using until it ends.
 * Pages go back to the pool only through eviction (or rp_prefix_cache_free).
 *
 * Eviction is LRU over unlocked pages: a list ordered by the time each page
 * was last released (unlocked, or inserted without a lock), a page's
 * descendants before it, so the list's head is always a leaf and each page
 * evicted costs O(1). A lock is held on a whole path from the root, so an
 * unlocked page's descendants are unlocked too: every unlocked page can be
 * evicted (after its descendants), and evictable_pages is the list's length.
 *
 * Costs: match and insert, O(pages walked x page_size) (one hash lookup and
 * one compare of page_size tokens a page); unlock, O(pages on the path);
 * evict, O(1) a page; the counts, O(1). Nothing is allocated after
 * rp_prefix_cache_new. Not thread-safe: the engine's thread owns it. */
#ifndef RP_KV_PREFIX_CACHE_H
#define RP_KV_PREFIX_CACHE_H

#include <stdint.h>

#include "kv/page_pool.h"
#include "util/err.h"

typedef struct rp_prefix_cache rp_prefix_cache;

/* A lock on the path from the root to `node` (num_pages pages). Each handle
 * a match or insert hands out must be given back once with
 * rp_prefix_cache_unlock. node -1: locks nothing. */
typedef struct rp_prefix_handle {
    int32_t node;
    int32_t num_pages;
} rp_prefix_handle;

#define RP_PREFIX_HANDLE_NONE ((rp_prefix_handle){-1, 0})

typedef struct rp_prefix_cache_stats {
    int cached_pages;    /* pages the cache owns */
    int evictable_pages; /* of those, unlocked */
    int locked_pages;    /* of those, on the path of a handle */
    int handles;         /* handles outstanding */
    /* since creation (vLLM's prefix_cache_queries / prefix_cache_hits) */
    uint64_t queried_tokens; /* num_tokens of every locking match */
    uint64_t hit_tokens;     /* tokens those matches found cached */
    uint64_t inserted_pages; /* pages the cache took over */
    uint64_t duplicate_pages; /* pages offered that it already held */
    uint64_t evicted_pages;
} rp_prefix_cache_stats;

/* A cache over pool's pages (not owned; it must outlive the cache). */
rp_prefix_cache *rp_prefix_cache_new(rp_page_pool *pool);
/* Gives every cached page back to the pool; handles still out become invalid. */
void rp_prefix_cache_free(rp_prefix_cache *pc);

/* The longest cached prefix of tokens[0..max_tokens) in whole pages: writes
 * its pages in order to pages[] (room for max_tokens / page_size) and returns
 * its length in tokens. max_tokens is the caller's choice: a prompt that must
 * compute at least one token for its logits passes num_tokens - 1.
 * With handle non-NULL the path is locked (*handle, unlocked later with
 * rp_prefix_cache_unlock) and the match counts in the stats (num_tokens
 * queried); with handle NULL it is a peek: nothing is locked or counted, and
 * the pages stay valid only until the next eviction. */
int rp_prefix_cache_match(rp_prefix_cache *pc, const int32_t *tokens, int num_tokens, int max_tokens,
                          int32_t *pages, rp_prefix_handle *handle);

/* Hands the full pages of a sequence to the cache: tokens[0..num_tokens)
 * (only the num_tokens / page_size full pages count; the rest is ignored),
 * whose K/V are in pages[] and complete. pages[] may start with pages the
 * sequence matched (the cache's own: they stay as they are). For each page
 * writes to tree_pages[i] the page the cache holds for it: pages[i] itself
 * (taken over, or already the cache's) or the cache's own copy of the same
 * tokens, in which case pages[i] remains the caller's: a duplicate, to free
 * or to keep using until the sequence ends. Returns the number of
 * duplicates. tree_pages must not alias pages.
 * With handle non-NULL the whole inserted path is locked (a request that
 * goes on running, or n choices sharing their prompt); a caller that already
 * held a handle on a prefix of it unlocks that one afterwards. Cannot fail:
 * the cache allocates nothing. */
int rp_prefix_cache_insert(rp_prefix_cache *pc, const int32_t *tokens, int num_tokens, const int32_t *pages,
                           int32_t *tree_pages, rp_prefix_handle *handle);

/* Gives a handle back and sets it to RP_PREFIX_HANDLE_NONE; the pages of its
 * path that no other handle locks become evictable (most recently used). */
void rp_prefix_cache_unlock(rp_prefix_cache *pc, rp_prefix_handle *handle);
/* A second handle on the same path (one for each of n choices). */
rp_prefix_handle rp_prefix_cache_lock_again(rp_prefix_cache *pc, rp_prefix_handle handle);

/* Frees up to num_pages unlocked pages, least recently used first, into the
 * pool; returns how many it freed (fewer when fewer are evictable). */
int rp_prefix_cache_evict(rp_prefix_cache *pc, int num_pages);
/* Evicts what it takes for the pool to have num_free_pages free; returns 0
 * when it does, -1 (having evicted everything evictable) when it cannot. */
int rp_prefix_cache_ensure_free(rp_prefix_cache *pc, int num_free_pages);
/* Cached pages no handle locks: what eviction could give the pool now. */
int rp_prefix_cache_evictable_pages(const rp_prefix_cache *pc);
/* Of the n pages a match just reported, those no handle locks: counted as
 * evictable until a lock on them takes them out of that count. */
int rp_prefix_cache_unlocked_of(const rp_prefix_cache *pc, const int32_t *pages, int n);

void rp_prefix_cache_get_stats(const rp_prefix_cache *pc, rp_prefix_cache_stats *stats);

/* Checks every invariant of the cache and of its pages in the pool
 * (O(num_pages)); returns 0, or -1 with the first broken one in err. For
 * tests and debug builds, after any operation. */
int rp_prefix_cache_check(const rp_prefix_cache *pc, rp_err *err);

#endif
