/* The KV page pool and page table: all-or-nothing allocation, slots,
 * truncation, rows, the pool's self-check, and every page back in the pool
 * at the end. */
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "test_util.h"

static void test_pool(void **state) {
    (void)state;
    rp_page_pool *p = rp_page_pool_new(10, 16);
    assert_non_null(p);
    assert_null(rp_page_pool_new(0, 16));
    int32_t a[10], b[10];
    assert_int_equal(rp_page_pool_alloc(p, 4, a), 0);
    assert_int_equal(rp_page_pool_num_free(p), 6);
    assert_int_equal(rp_page_pool_alloc(p, 7, b), -1); /* takes nothing */
    assert_int_equal(rp_page_pool_num_free(p), 6);
    assert_int_equal(rp_page_pool_alloc(p, 6, b), 0);
    /* all ten distinct and in range */
    int seen[10] = {0};
    for (int i = 0; i < 4; i++) seen[a[i]]++;
    for (int i = 0; i < 6; i++) seen[b[i]]++;
    for (int i = 0; i < 10; i++) assert_int_equal(seen[i], 1);
    assert_int_equal(rp_page_pool_dummy_page(p), 10);
    rp_page_pool_release(p, 4, a);
    rp_page_pool_release(p, 6, b);
    assert_int_equal(rp_page_pool_num_free(p), 10);
    rp_page_pool_free(p);
}

static void test_table(void **state) {
    (void)state;
    rp_page_pool *p = rp_page_pool_new(8, 4);
    rp_page_table *t = rp_page_table_new(p, 2, 20); /* 5 pages per row at most */
    assert_non_null(t);
    assert_int_equal(t->max_pages_per_row, 5);
    int r0 = rp_page_table_acquire_row(t), r1 = rp_page_table_acquire_row(t);
    assert_true(r0 >= 0 && r1 >= 0 && r0 != r1);
    assert_int_equal(rp_page_table_acquire_row(t), -1);
    rp_err err;
    assert_int_equal(rp_page_table_reserve(t, r0, 9, &err), 0); /* 3 pages */
    assert_int_equal(rp_page_pool_num_free(p), 5);
    assert_int_equal(rp_page_table_pages_needed(t, r0, 13), 1);
    assert_int_equal(rp_page_table_pages_needed(t, r0, 12), 0);
    /* token 5 is in the row's second page at offset 1 */
    assert_int_equal(rp_page_table_slot(t, r0, 5), rp_page_table_row(t, r0)[1] * 4 + 1);
    assert_int_not_equal(rp_page_table_reserve(t, r1, 21, &err), 0); /* over the row limit */
    assert_non_null(strstr(err.msg, "limit"));
    assert_int_equal(rp_page_table_reserve(t, r1, 20, &err), 0); /* 5 pages: pool now 0 free */
    assert_int_equal(rp_page_pool_num_free(p), 0);
    assert_int_not_equal(rp_page_table_reserve(t, r0, 13, &err), 0);
    assert_non_null(strstr(err.msg, "KV cache full"));
    assert_int_equal(t->row_num_pages[r0], 3); /* unchanged by the failure */
    rp_page_table_truncate(t, r1, 5); /* keep 2 pages */
    assert_int_equal(rp_page_pool_num_free(p), 3);
    assert_int_equal(rp_page_table_row(t, r1)[2], rp_page_pool_dummy_page(p));
    rp_page_table_release_row(t, r0);
    rp_page_table_release_row(t, r1);
    assert_int_equal(rp_page_pool_num_free(p), 8);
    assert_int_equal(rp_page_table_acquire_row(t) >= 0, 1);
    rp_page_table_free(t);
    rp_page_pool_free(p);
}

/* A row's pages as an array of max_pages_per_row ids, for exact checks. */
static void expect_row(const rp_page_table *t, int row, int num_pages, const int32_t *want) {
    assert_int_equal(t->row_num_pages[row], num_pages);
    assert_memory_equal(rp_page_table_row(t, row), want, (size_t)t->max_pages_per_row * sizeof *want);
}

/* Growing two rows in turns (pages not contiguous), reserving less than is
 * held, failures that leave everything as it was, truncation to a page
 * boundary and past the end, and released rows coming back empty. */
static void test_table_rows(void **state) {
    (void)state;
    rp_page_pool *p = rp_page_pool_new(5, 4);
    rp_page_table *t = rp_page_table_new(p, 2, 16); /* 4 pages per row */
    const int32_t D = rp_page_pool_dummy_page(p);
    int a = rp_page_table_acquire_row(t), b = rp_page_table_acquire_row(t);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    expect_row(t, a, 0, (const int32_t[]){D, D, D, D});
    assert_int_equal(rp_page_table_pages_needed(t, a, 0), 0);
    assert_int_equal(rp_page_table_pages_needed(t, a, 1), 1);
    assert_int_equal(rp_page_table_pages_needed(t, a, 16), 4);
    assert_int_equal(rp_page_table_reserve(t, a, 0, NULL), 0); /* nothing to hold */
    assert_int_equal(rp_page_pool_num_free(p), 5);
    assert_int_equal(rp_page_table_reserve(t, a, 4, NULL), 0);
    assert_int_equal(rp_page_table_reserve(t, b, 5, NULL), 0);
    assert_int_equal(rp_page_table_reserve(t, a, 6, NULL), 0);
    expect_row(t, a, 2, (const int32_t[]){0, 3, D, D});
    expect_row(t, b, 2, (const int32_t[]){1, 2, D, D});
    assert_int_equal(rp_page_table_reserve(t, a, 3, NULL), 0); /* less than held: no change */
    expect_row(t, a, 2, (const int32_t[]){0, 3, D, D});
    assert_int_equal(rp_page_pool_num_free(p), 1);
    /* positions 3 and 4 sit in pages 0 and 3; position 5 in page 3 too */
    assert_int_equal(rp_page_table_slot(t, a, 3), 3);
    assert_int_equal(rp_page_table_slot(t, a, 4), 12);
    assert_int_equal(rp_page_table_slot(t, a, 5), 13);
    assert_int_equal(rp_page_table_slot(t, b, 4), 8);
    /* failures take nothing: 2 pages wanted with 1 free, and 17 tokens in a
     * row of 16 */
    rp_err err;
    assert_int_not_equal(rp_page_table_reserve(t, a, 13, &err), 0);
    assert_non_null(strstr(err.msg, "KV cache full"));
    assert_int_not_equal(rp_page_table_reserve(t, b, 17, &err), 0);
    assert_non_null(strstr(err.msg, "limit"));
    assert_int_equal(rp_page_pool_num_free(p), 1);
    expect_row(t, a, 2, (const int32_t[]){0, 3, D, D});
    expect_row(t, b, 2, (const int32_t[]){1, 2, D, D});
    /* truncation: past the end changes nothing; to 4 tokens keeps one page;
     * the freed page is the next one handed out */
    rp_page_table_truncate(t, b, 9);
    expect_row(t, b, 2, (const int32_t[]){1, 2, D, D});
    rp_page_table_truncate(t, b, 4);
    expect_row(t, b, 1, (const int32_t[]){1, D, D, D});
    assert_int_equal(rp_page_pool_num_free(p), 2);
    assert_int_equal(rp_page_table_reserve(t, a, 16, NULL), 0);
    expect_row(t, a, 4, (const int32_t[]){0, 3, 2, 4});
    assert_int_equal(rp_page_pool_num_free(p), 0);
    rp_page_table_truncate(t, a, 0); /* the row stays taken, holding nothing */
    expect_row(t, a, 0, (const int32_t[]){D, D, D, D});
    assert_int_equal(rp_page_pool_num_free(p), 4);
    assert_int_equal(rp_page_table_acquire_row(t), -1);
    /* released: pages back, and the row comes back empty */
    rp_page_table_release_row(t, b);
    assert_int_equal(rp_page_pool_num_free(p), 5);
    assert_int_equal(rp_page_table_acquire_row(t), b);
    expect_row(t, b, 0, (const int32_t[]){D, D, D, D});
    rp_page_table_release_row(t, a);
    rp_page_table_release_row(t, b);
    assert_int_equal(t->num_free_rows, 2);
    assert_int_equal(rp_page_pool_num_free(p), 5);
    rp_page_table_free(t);
    rp_page_pool_free(p);
}

/* The pool's self-check: clean after any sequence of allocs and releases;
 * a page on the free list twice, or free and flagged in use, is reported. */
static void test_pool_check(void **state) {
    (void)state;
    rp_page_pool *p = rp_page_pool_new(6, 4);
    rp_err err;
    assert_int_equal(rp_page_pool_check(p, &err), 0);
    int32_t a[6];
    assert_int_equal(rp_page_pool_alloc(p, 4, a), 0);
    rp_page_pool_release(p, 2, a + 1);
    assert_int_equal(rp_page_pool_check(p, &err), 0);
    assert_true(rp_page_pool_in_use(p, a[0]) && !rp_page_pool_in_use(p, a[1]));
    /* a double free slipped past release's assertion */
    p->free_list[p->num_free++] = a[1];
    assert_int_not_equal(rp_page_pool_check(p, &err), 0);
    assert_non_null(strstr(err.msg, "listed twice"));
    p->num_free--;
    /* a page on the free list that is also flagged in use */
    p->in_use[a[2]] = 1;
    assert_int_not_equal(rp_page_pool_check(p, &err), 0);
    assert_non_null(strstr(err.msg, "in use"));
    p->in_use[a[2]] = 0;
    assert_int_equal(rp_page_pool_check(p, &err), 0); /* and the check left the flags as they were */
    /* a page neither free nor in use */
    p->in_use[a[0]] = 0;
    assert_int_not_equal(rp_page_pool_check(p, &err), 0);
    p->in_use[a[0]] = 1;
    rp_page_pool_release(p, 1, a);
    rp_page_pool_release(p, 1, a + 3);
    assert_int_equal(rp_page_pool_num_free(p), 6);
    assert_int_equal(rp_page_pool_check(p, &err), 0);
    rp_page_pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_table_rows),
        cmocka_unit_test(test_pool_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
