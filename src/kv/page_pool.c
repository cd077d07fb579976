/* Free-list page allocator. */
#include "kv/page_pool.h"

#include <stdlib.h>

#include "util/err.h"

rp_page_pool *rp_page_pool_new(int num_pages, int page_size) {
    if (num_pages <= 0 || page_size <= 0) return NULL;
    rp_page_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->free_list = malloc((size_t)num_pages * sizeof *p->free_list);
    p->in_use = calloc((size_t)num_pages, 1);
    if (!p->free_list || !p->in_use) {
        rp_page_pool_free(p);
        return NULL;
    }
    p->num_pages = num_pages;
    p->page_size = page_size;
    /* Pop order is ascending ids: low pages first keeps small tests readable. */
    for (int i = 0; i < num_pages; i++) p->free_list[i] = num_pages - 1 - i;
    p->num_free = num_pages;
    return p;
}

void rp_page_pool_free(rp_page_pool *p) {
    if (!p) return;
    free(p->free_list);
    free(p->in_use);
    free(p);
}

int rp_page_pool_alloc(rp_page_pool *p, int n, int32_t *out) {
    if (n < 0 || n > p->num_free) return -1;
    for (int i = 0; i < n; i++) {
        int32_t page = p->free_list[--p->num_free];
        RP_ASSERT(!p->in_use[page]);
        p->in_use[page] = 1;
        out[i] = page;
    }
    return 0;
}

void rp_page_pool_release(rp_page_pool *p, int n, const int32_t *pages) {
    for (int i = 0; i < n; i++) {
        int32_t page = pages[i];
        RP_ASSERT(page >= 0 && page < p->num_pages && p->in_use[page]);
        p->in_use[page] = 0;
        p->free_list[p->num_free++] = page;
    }
}

int rp_page_pool_check(const rp_page_pool *p, rp_err *err) {
    if (p->num_free < 0 || p->num_free > p->num_pages)
        return rp_errf(err, "page pool: %d free of %d", p->num_free, p->num_pages);
    /* Duplicates on the free list are found without a scratch array: in_use
     * (0 for a free page) is marked 2 for each free id seen, then put back. */
    uint8_t *seen = p->in_use;
    int rc = 0;
    int i = 0;
    for (; i < p->num_free; i++) {
        int32_t page = p->free_list[i];
        if (page < 0 || page >= p->num_pages) {
            rc = rp_errf(err, "page pool: free list holds %d, not a page", page);
            break;
        }
        if (seen[page]) {
            rc = rp_errf(err, "page pool: page %d is free but %s", page, seen[page] == 2 ? "listed twice" : "in use");
            break;
        }
        seen[page] = 2;
    }
    for (int j = 0; j < i; j++) seen[p->free_list[j]] = 0;
    if (rc) return rc;
    int in_use = 0;
    for (int32_t page = 0; page < p->num_pages; page++) in_use += p->in_use[page];
    if (in_use != p->num_pages - p->num_free)
        return rp_errf(err, "page pool: %d pages in use, %d free, of %d", in_use, p->num_free, p->num_pages);
    return 0;
}
