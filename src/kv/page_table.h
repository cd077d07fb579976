/* The page table: one row per running sequence, listing the KV pages that
 * hold its tokens in order (token at position p lives in page
 * row[p / page_size], offset p % page_size).
 *
 * A fixed 2D array [max_rows][max_pages_per_row] so that the GPU can mirror
 * it at a fixed address and kernels index it directly; rows are handed out
 * at admission and returned (with their pages) when a sequence finishes.
 *
 * A row may start with pages it does not own: the prefix cache's
 * (kv/prefix_cache.h), which the sequence reads but never writes. The row
 * counts them (row_shared: always its leading pages, since a cached prefix
 * is a prefix) and truncate and release leave them to the cache; every
 * page after them is the row's own. */
#ifndef RP_KV_PAGE_TABLE_H
#define RP_KV_PAGE_TABLE_H

#include <stdint.h>

#include "kv/page_pool.h"
#include "util/err.h"

typedef struct rp_page_table {
    int max_rows;
    int max_pages_per_row;
    int32_t *pages;         /* [max_rows][max_pages_per_row] */
    int32_t *row_num_pages; /* pages held by each row */
    int32_t *row_shared;    /* of those, the leading ones the prefix cache owns */
    uint8_t *row_used;
    int32_t *free_rows;
    int num_free_rows;
    rp_page_pool *pool; /* not owned */
} rp_page_table;

rp_page_table *rp_page_table_new(rp_page_pool *pool, int max_rows, int max_tokens_per_row);
void rp_page_table_free(rp_page_table *t);

/* Returns a free row index, or -1 when every row is taken. */
int rp_page_table_acquire_row(rp_page_table *t);
/* Returns the row's own pages to the pool (its shared ones stay the
 * cache's) and the row to the table. */
void rp_page_table_release_row(rp_page_table *t, int row);
/* Makes the row hold enough pages for num_tokens tokens. All-or-nothing:
 * fails (taking nothing) when the pool is short or the row would overflow. */
int rp_page_table_reserve(rp_page_table *t, int row, int num_tokens, rp_err *err);
/* Pages the row would need to add to hold num_tokens tokens. */
int rp_page_table_pages_needed(const rp_page_table *t, int row, int num_tokens);
/* Gives back the pages beyond those needed for num_tokens (preemption,
 * rollback); never below the row's shared pages. */
void rp_page_table_truncate(rp_page_table *t, int row, int num_tokens);
/* Makes the row's first n pages the prefix cache's pages[0..n): those it
 * already shares must be the same; an own page equal to pages[i] has just
 * become the cache's (inserted), an own page that differs is a duplicate of
 * the cache's and goes back to the pool; beyond the row's pages the row
 * grows (a matched prefix at admission). n within the row's limit. */
void rp_page_table_share(rp_page_table *t, int row, int n, const int32_t *pages);
/* Pages the row owns itself (held minus shared). */
static inline int rp_page_table_own_pages(const rp_page_table *t, int row) {
    return t->row_num_pages[row] - t->row_shared[row];
}

static inline const int32_t *rp_page_table_row(const rp_page_table *t, int row) {
    return t->pages + (int64_t)row * t->max_pages_per_row;
}

static inline int32_t rp_page_table_slot(const rp_page_table *t, int row, int pos) {
    int ps = t->pool->page_size;
    return rp_page_table_row(t, row)[pos / ps] * ps + pos % ps;
}

#endif
