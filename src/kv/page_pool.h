/* The KV page allocator: which of the cache's fixed-size pages are free.
 *
 * Pure bookkeeping on the host; the pages' memory belongs to the backend
 * (host memory for the CPU backend, HBM for CUDA), which sizes its cache as
 * num_pages pages of page_size tokens plus one extra dummy page (id
 * num_pages) that padded graph slots write into. Allocation is
 * all-or-nothing so a failed admission never leaks a partial set. */
#ifndef RP_KV_PAGE_POOL_H
#define RP_KV_PAGE_POOL_H

#include <stdint.h>

#include "util/err.h"

typedef struct rp_page_pool {
    int num_pages;
    int page_size; /* tokens per page */
    int32_t *free_list; /* stack of free page ids */
    int num_free;
    uint8_t *in_use; /* catches double frees */
} rp_page_pool;

rp_page_pool *rp_page_pool_new(int num_pages, int page_size);
void rp_page_pool_free(rp_page_pool *p);
/* Takes n pages into out[]; returns 0, or -1 (taking nothing) if fewer are free. */
int rp_page_pool_alloc(rp_page_pool *p, int n, int32_t *out);
void rp_page_pool_release(rp_page_pool *p, int n, const int32_t *pages);
static inline int rp_page_pool_num_free(const rp_page_pool *p) { return p->num_free; }
/* Whether a page is handed out (not on the free list). */
static inline int rp_page_pool_in_use(const rp_page_pool *p, int32_t page) { return p->in_use[page]; }
/* The page id padded batch slots point at; never handed out. */
static inline int32_t rp_page_pool_dummy_page(const rp_page_pool *p) { return p->num_pages; }

/* Checks that the free list and the in-use flags agree: every free id once,
 * in range, not in use, and every other page in use. O(num_pages); returns
 * 0, or -1 with what is wrong in err. For tests and debug builds. */
int rp_page_pool_check(const rp_page_pool *p, rp_err *err);

#endif
