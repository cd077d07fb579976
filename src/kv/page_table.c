/* Page table rows and page reservation for sequences. */
#include "kv/page_table.h"

#include <stdlib.h>

rp_page_table *rp_page_table_new(rp_page_pool *pool, int max_rows, int max_tokens_per_row) {
    if (!pool || max_rows <= 0 || max_tokens_per_row <= 0) return NULL;
    rp_page_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->pool = pool;
    t->max_rows = max_rows;
    t->max_pages_per_row = (max_tokens_per_row + pool->page_size - 1) / pool->page_size;
    t->pages = malloc((size_t)max_rows * (size_t)t->max_pages_per_row * sizeof *t->pages);
    t->row_num_pages = calloc((size_t)max_rows, sizeof *t->row_num_pages);
    t->row_shared = calloc((size_t)max_rows, sizeof *t->row_shared);
    t->row_used = calloc((size_t)max_rows, 1);
    t->free_rows = malloc((size_t)max_rows * sizeof *t->free_rows);
    if (!t->pages || !t->row_num_pages || !t->row_shared || !t->row_used || !t->free_rows) {
        rp_page_table_free(t);
        return NULL;
    }
    /* Unused entries point at the dummy page so a stray read stays in bounds. */
    int32_t dummy = rp_page_pool_dummy_page(pool);
    for (int64_t i = 0; i < (int64_t)max_rows * t->max_pages_per_row; i++) t->pages[i] = dummy;
    for (int i = 0; i < max_rows; i++) t->free_rows[i] = max_rows - 1 - i;
    t->num_free_rows = max_rows;
    return t;
}

void rp_page_table_free(rp_page_table *t) {
    if (!t) return;
    free(t->pages);
    free(t->row_num_pages);
    free(t->row_shared);
    free(t->row_used);
    free(t->free_rows);
    free(t);
}

int rp_page_table_acquire_row(rp_page_table *t) {
    if (t->num_free_rows == 0) return -1;
    int row = t->free_rows[--t->num_free_rows];
    RP_ASSERT(!t->row_used[row] && t->row_num_pages[row] == 0 && t->row_shared[row] == 0);
    t->row_used[row] = 1;
    return row;
}

void rp_page_table_truncate(rp_page_table *t, int row, int num_tokens) {
    RP_ASSERT(row >= 0 && row < t->max_rows && t->row_used[row]);
    int keep = (num_tokens + t->pool->page_size - 1) / t->pool->page_size;
    if (keep < t->row_shared[row]) keep = t->row_shared[row];
    int have = t->row_num_pages[row];
    if (keep >= have) return;
    int32_t *pages = t->pages + (int64_t)row * t->max_pages_per_row;
    rp_page_pool_release(t->pool, have - keep, pages + keep);
    for (int i = keep; i < have; i++) pages[i] = rp_page_pool_dummy_page(t->pool);
    t->row_num_pages[row] = keep;
}

void rp_page_table_release_row(rp_page_table *t, int row) {
    rp_page_table_truncate(t, row, 0);
    int32_t *pages = t->pages + (int64_t)row * t->max_pages_per_row;
    for (int i = 0; i < t->row_shared[row]; i++) pages[i] = rp_page_pool_dummy_page(t->pool);
    t->row_num_pages[row] = 0;
    t->row_shared[row] = 0;
    t->row_used[row] = 0;
    t->free_rows[t->num_free_rows++] = row;
}

int rp_page_table_pages_needed(const rp_page_table *t, int row, int num_tokens) {
    int need = (num_tokens + t->pool->page_size - 1) / t->pool->page_size;
    int have = t->row_num_pages[row];
    return need > have ? need - have : 0;
}

int rp_page_table_reserve(rp_page_table *t, int row, int num_tokens, rp_err *err) {
    RP_ASSERT(row >= 0 && row < t->max_rows && t->row_used[row]);
    int need = (num_tokens + t->pool->page_size - 1) / t->pool->page_size;
    if (need > t->max_pages_per_row)
        return rp_errf(err, "%d tokens exceed the per-sequence limit of %d", num_tokens,
                       t->max_pages_per_row * t->pool->page_size);
    int add = need - t->row_num_pages[row];
    if (add <= 0) return 0;
    int32_t *pages = t->pages + (int64_t)row * t->max_pages_per_row;
    if (rp_page_pool_alloc(t->pool, add, pages + t->row_num_pages[row]))
        return rp_errf(err, "KV cache full: %d pages needed, %d free", add, rp_page_pool_num_free(t->pool));
    t->row_num_pages[row] = need;
    return 0;
}

void rp_page_table_share(rp_page_table *t, int row, int n, const int32_t *shared) {
    RP_ASSERT(row >= 0 && row < t->max_rows && t->row_used[row]);
    RP_ASSERT(n >= t->row_shared[row] && n <= t->max_pages_per_row);
    int32_t *pages = t->pages + (int64_t)row * t->max_pages_per_row;
    for (int i = 0; i < t->row_shared[row]; i++) RP_ASSERT(pages[i] == shared[i]);
    for (int i = t->row_shared[row]; i < n; i++) {
        if (i < t->row_num_pages[row] && pages[i] != shared[i]) rp_page_pool_release(t->pool, 1, &pages[i]);
        pages[i] = shared[i];
    }
    t->row_shared[row] = n;
    if (t->row_num_pages[row] < n) t->row_num_pages[row] = n;
}
