/* The page table: one row per running sequence, listing the KV pages that
 * hold its tokens in order (token at position p lives in page
 * row[p / page_size], offset p % page_size).
 *
 * A fixed 2D array [max_rows][max_pages_per_row] so that the GPU can mirror
 * it at a fixed address and kernels index it directly; rows are handed out
 * at admission and returned (with their pages) when a sequence finishes. */
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
    uint8_t *row_used;
    int32_t *free_rows;
    int num_free_rows;
    rp_page_pool *pool; /* not owned */
} rp_page_table;

rp_page_table *rp_page_table_new(rp_page_pool *pool, int max_rows, int max_tokens_per_row);
void rp_page_table_free(rp_page_table *t);

/* Returns a free row index, or -1 when every row is taken. */
int rp_page_table_acquire_row(rp_page_table *t);
/* Returns the row's pages to the pool and the row to the table. */
void rp_page_table_release_row(rp_page_table *t, int row);
/* Makes the row hold enough pages for num_tokens tokens. All-or-nothing:
 * fails (taking nothing) when the pool is short or the row would overflow. */
int rp_page_table_reserve(rp_page_table *t, int row, int num_tokens, rp_err *err);
/* Pages the row would need to add to hold num_tokens tokens. */
int rp_page_table_pages_needed(const rp_page_table *t, int row, int num_tokens);
/* Gives back the pages beyond those needed for num_tokens (preemption, rollback). */
void rp_page_table_truncate(rp_page_table *t, int row, int num_tokens);

static inline const int32_t *rp_page_table_row(const rp_page_table *t, int row) {
    return t->pages + (int64_t)row * t->max_pages_per_row;
}

static inline int32_t rp_page_table_slot(const rp_page_table *t, int row, int pos) {
    int ps = t->pool->page_size;
    return rp_page_table_row(t, row)[pos / ps] * ps + pos % ps;
}

#endif
