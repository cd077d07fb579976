/* The batch builder (src/engine/batch.c) and the batch check every backend
 * runs (rp_batch_validate, src/backend/backend.c), on a real page table
 * whose rows hold pages that are not contiguous: positions, seq_start,
 * seq_kv_len, slot_mapping across page boundaries, logit rows for
 * logits = 0/1/2, the -1 returns of a full batch (tokens, sequences, logit
 * rows) leaving the batch as it was, rp_batch_begin, and every rejection of
 * a bad batch. */
#include "backend/backend.h"
#include "engine/batch.h"
#include "model/model.h"
#include "test_util.h"

#define PS 4

/* Rows 0, 1, 2 holding pages {0, 2, 4}, {1, 3} and {5, 6}: grown in turns,
 * so no row's pages are contiguous (the pool hands out ascending ids). */
typedef struct tables {
    rp_page_pool *pool;
    rp_page_table *table;
} tables;

static void make_tables(tables *t) {
    t->pool = rp_page_pool_new(8, PS);
    t->table = rp_page_table_new(t->pool, 3, 16);
    assert_non_null(t->table);
    for (int r = 0; r < 3; r++) assert_int_equal(rp_page_table_acquire_row(t->table), r);
    const int grow[][2] = {{0, 4}, {1, 4}, {0, 8}, {1, 8}, {0, 12}, {2, 8}};
    for (size_t i = 0; i < sizeof grow / sizeof grow[0]; i++)
        assert_int_equal(rp_page_table_reserve(t->table, grow[i][0], grow[i][1], NULL), 0);
    const int32_t want[3][3] = {{0, 2, 4}, {1, 3, 8}, {5, 6, 8}}; /* 8: the dummy page */
    for (int r = 0; r < 3; r++) assert_memory_equal(rp_page_table_row(t->table, r), want[r], sizeof want[r]);
}

static void free_tables(tables *t) {
    for (int r = 0; r < 3; r++) rp_page_table_release_row(t->table, r);
    assert_int_equal(rp_page_pool_num_free(t->pool), 8);
    rp_page_table_free(t->table);
    rp_page_pool_free(t->pool);
}

static const int32_t toks[12] = {11, 12, 13, 14, 15, 16, 17, 21, 22, 23, 31, 32};

/* Row 0: 7 new tokens after 2 cached (positions 2..8, crossing two page
 * boundaries), last logit; row 1: 3 from the start, every logit; row 2: 1
 * token at position 5, no logit. */
static void add_three(rp_batch_builder *bb) {
    assert_int_equal(rp_batch_add(bb, 0, toks, 7, 2, 1), 0);
    assert_int_equal(rp_batch_add(bb, 1, toks + 7, 3, 0, 2), 1);
    assert_int_equal(rp_batch_add(bb, 2, toks + 10, 1, 5, 0), 4);
}

static void test_batch_layout(void **state) {
    (void)state;
    tables t;
    make_tables(&t);
    rp_batch_builder *bb = rp_batch_builder_new(t.table, 16, 4, 8);
    assert_non_null(bb);
    rp_batch_begin(bb);
    add_three(bb);
    assert_int_equal(rp_batch_tokens_left(bb), 5);
    rp_batch *b = rp_batch_finish(bb);
    assert_int_equal(b->num_seqs, 3);
    assert_int_equal(b->num_tokens, 11);
    assert_memory_equal(b->tokens, toks, 11 * sizeof *toks);
    static const int32_t positions[11] = {2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 5};
    assert_memory_equal(b->positions, positions, sizeof positions);
    static const int32_t seq_start[4] = {0, 7, 10, 11}, kv_len[3] = {9, 3, 6}, rows[3] = {0, 1, 2};
    assert_memory_equal(b->seq_start, seq_start, sizeof seq_start);
    assert_memory_equal(b->seq_kv_len, kv_len, sizeof kv_len);
    assert_memory_equal(b->seq_page_row, rows, sizeof rows);
    /* page * 4 + offset: row 0's positions 2, 3 in page 0, 4..7 in page 2,
     * 8 in page 4; row 1's in page 1; row 2's position 5 in page 6 */
    static const int32_t slots[11] = {2, 3, 8, 9, 10, 11, 16, 4, 5, 6, 25};
    assert_memory_equal(b->slot_mapping, slots, sizeof slots);
    assert_int_equal(b->num_logits, 4);
    static const int32_t logit_token[4] = {6, 7, 8, 9};
    assert_memory_equal(b->logit_token, logit_token, sizeof logit_token);
    assert_ptr_equal(b->page_table, t.table->pages);
    assert_int_equal(b->page_table_stride, 4);
    assert_null(b->sample);

    /* begin starts over: the next batch's first token is index 0 again */
    b->sample = (const rp_sampling_params *)b; /* anything: begin must clear it */
    rp_batch_begin(bb);
    assert_int_equal(bb->batch.num_seqs, 0);
    assert_int_equal(bb->batch.num_tokens, 0);
    assert_int_equal(bb->batch.num_logits, 0);
    assert_null(bb->batch.sample);
    assert_int_equal(rp_batch_tokens_left(bb), 16);
    assert_int_equal(rp_batch_add(bb, 1, toks + 7, 2, 1, 1), 0);
    b = rp_batch_finish(bb);
    static const int32_t seq_start2[2] = {0, 2}, positions2[2] = {1, 2}, slots2[2] = {5, 6}, logit2[1] = {1};
    assert_int_equal(b->num_seqs, 1);
    assert_int_equal(b->num_tokens, 2);
    assert_int_equal(b->seq_kv_len[0], 3);
    assert_memory_equal(b->seq_start, seq_start2, sizeof seq_start2);
    assert_memory_equal(b->positions, positions2, sizeof positions2);
    assert_memory_equal(b->slot_mapping, slots2, sizeof slots2);
    assert_int_equal(b->num_logits, 1);
    assert_memory_equal(b->logit_token, logit2, sizeof logit2);
    rp_batch_builder_free(bb);
    free_tables(&t);
}

/* An add that does not fit returns -1 and changes nothing. */
static void expect_full(rp_batch_builder *bb, int row, int n, int logits) {
    rp_batch before = bb->batch;
    int32_t start = bb->seq_start[before.num_seqs];
    assert_int_equal(rp_batch_add(bb, row, toks, n, 0, logits), -1);
    assert_int_equal(bb->batch.num_seqs, before.num_seqs);
    assert_int_equal(bb->batch.num_tokens, before.num_tokens);
    assert_int_equal(bb->batch.num_logits, before.num_logits);
    assert_int_equal(bb->seq_start[before.num_seqs], start);
}

static void test_batch_full(void **state) {
    (void)state;
    tables t;
    make_tables(&t);
    /* tokens: 6 at most */
    rp_batch_builder *bb = rp_batch_builder_new(t.table, 6, 4, 8);
    rp_batch_begin(bb);
    assert_int_equal(rp_batch_add(bb, 0, toks, 4, 0, 1), 0);
    expect_full(bb, 1, 3, 1);
    expect_full(bb, 1, 0, 1); /* no tokens at all */
    assert_int_equal(rp_batch_add(bb, 1, toks, 2, 0, 1), 1); /* exactly full */
    assert_int_equal(rp_batch_tokens_left(bb), 0);
    expect_full(bb, 2, 1, 0);
    rp_batch_builder_free(bb);
    /* sequences: 2 at most */
    bb = rp_batch_builder_new(t.table, 16, 2, 8);
    rp_batch_begin(bb);
    assert_int_equal(rp_batch_add(bb, 0, toks, 1, 0, 1), 0);
    assert_int_equal(rp_batch_add(bb, 1, toks, 1, 0, 1), 1);
    expect_full(bb, 2, 1, 0);
    rp_batch_builder_free(bb);
    /* logit rows: 3 at most; one that wants none still fits */
    bb = rp_batch_builder_new(t.table, 16, 4, 3);
    rp_batch_begin(bb);
    assert_int_equal(rp_batch_add(bb, 0, toks, 2, 0, 2), 0);
    expect_full(bb, 1, 2, 2);
    assert_int_equal(rp_batch_add(bb, 1, toks, 2, 0, 1), 2);
    expect_full(bb, 2, 1, 1);
    assert_int_equal(rp_batch_add(bb, 2, toks, 3, 0, 0), 3);
    assert_int_equal(bb->batch.num_logits, 3);
    assert_int_equal(bb->batch.num_tokens, 7);
    rp_batch_builder_free(bb);
    free_tables(&t);
}

/* A backend as rp_batch_validate sees it: limits and the model's shape. */
typedef struct fake_backend {
    rp_model model;
    rp_backend be;
} fake_backend;

static void make_backend(fake_backend *f) {
    memset(f, 0, sizeof *f);
    f->model.cfg.vocab_size = 100;
    f->model.cfg.max_position_embeddings = 12;
    f->be.model = &f->model;
    f->be.cfg = (rp_backend_config){.num_pages = 8, .page_size = PS, .max_batched_tokens = 16, .max_batch_seqs = 4,
                                    .max_logit_rows = 8};
}

/* A batch whose arrays the test may break, copied from the builder's. */
typedef struct bad_batch {
    rp_batch b;
    int32_t tokens[16], positions[16], seq_start[5], kv_len[4], rows[4], slots[16], logit_token[8];
    int32_t pages[3 * 4];
} bad_batch;

static void copy_batch(bad_batch *x, const rp_batch *b, const rp_page_table *t) {
    x->b = *b;
    memcpy(x->tokens, b->tokens, (size_t)b->num_tokens * sizeof *x->tokens);
    memcpy(x->positions, b->positions, (size_t)b->num_tokens * sizeof *x->positions);
    memcpy(x->slots, b->slot_mapping, (size_t)b->num_tokens * sizeof *x->slots);
    memcpy(x->seq_start, b->seq_start, (size_t)(b->num_seqs + 1) * sizeof *x->seq_start);
    memcpy(x->kv_len, b->seq_kv_len, (size_t)b->num_seqs * sizeof *x->kv_len);
    memcpy(x->rows, b->seq_page_row, (size_t)b->num_seqs * sizeof *x->rows);
    memcpy(x->logit_token, b->logit_token, (size_t)b->num_logits * sizeof *x->logit_token);
    memcpy(x->pages, t->pages, sizeof x->pages);
    x->b.tokens = x->tokens;
    x->b.positions = x->positions;
    x->b.slot_mapping = x->slots;
    x->b.seq_start = x->seq_start;
    x->b.seq_kv_len = x->kv_len;
    x->b.seq_page_row = x->rows;
    x->b.logit_token = x->logit_token;
    x->b.page_table = x->pages;
}

static void test_batch_validate(void **state) {
    (void)state;
    tables t;
    make_tables(&t);
    fake_backend fb;
    make_backend(&fb);
    rp_batch_builder *bb = rp_batch_builder_new(t.table, 16, 4, 8);
    rp_batch_begin(bb);
    add_three(bb);
    const rp_batch *good = rp_batch_finish(bb);
    rp_err err = {0};
    if (rp_batch_validate(good, &fb.be, &err)) fail_msg("the builder's batch is rejected: %s", err.msg);
    /* a token reference (the previous forward's logit row 2) is a token only
     * where the backend takes them, and only within its logit rows */
    bad_batch x;
    copy_batch(&x, good, t.table);
    x.tokens[3] = -3;
    assert_int_equal(rp_batch_validate(&x.b, &fb.be, &err), RP_ERR);
    fb.be.supports_token_refs = 1;
    assert_int_equal(rp_batch_validate(&x.b, &fb.be, &err), RP_OK);
    x.tokens[3] = -9;
    assert_int_equal(rp_batch_validate(&x.b, &fb.be, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "vocabulary"));

    /* one break at a time, each named in the message */
    enum { NUM_SEQS_0, NUM_SEQS_BIG, NUM_TOKENS_BIG, START_0, START_END, EMPTY_SEQ, KV_SHORT, KV_ROW, KV_MODEL,
           POSITION, TOKEN_BIG, TOKEN_NEG, SLOT_NEG, SLOT_BIG, PAGE_BIG, PAGE_NEG, LOGITS_BIG, LOGIT_TOKEN, NUM_CASES };
    static const char *const says[NUM_CASES] = {
        "sequences", "sequences", "tokens", "seq_start", "seq_start", "no new tokens", "KV length", "KV length",
        "KV length", "position", "vocabulary", "vocabulary", "slot", "slot", "page id", "page id", "logit rows",
        "logit row 1"};
    fb.be.supports_token_refs = 0;
    for (int c = 0; c < NUM_CASES; c++) {
        copy_batch(&x, good, t.table);
        switch (c) {
        case NUM_SEQS_0: x.b.num_seqs = 0; break;
        case NUM_SEQS_BIG: fb.be.cfg.max_batch_seqs = 2; break;
        case NUM_TOKENS_BIG: fb.be.cfg.max_batched_tokens = 10; break;
        case START_0: x.seq_start[0] = 1; break;
        case START_END: x.b.num_tokens = 10; break;
        case EMPTY_SEQ: x.seq_start[1] = 0; break;
        case KV_SHORT: x.kv_len[0] = 6; break;                /* fewer than its 7 new tokens */
        case KV_ROW: x.b.page_table_stride = 2; break;         /* 9 tokens in a row of 8 */
        case KV_MODEL: fb.model.cfg.max_position_embeddings = 8; break;
        case POSITION: x.positions[8] = 2; break;              /* row 1's second token */
        case TOKEN_BIG: x.tokens[10] = 100; break;
        case TOKEN_NEG: x.tokens[0] = -1; break;
        case SLOT_NEG: x.slots[4] = -1; break;
        case SLOT_BIG: x.slots[4] = 36; break;                 /* 9 pages (the dummy too) of 4 */
        case PAGE_BIG: x.pages[2 * 4 + 1] = 9; break;          /* row 2's second page */
        case PAGE_NEG: x.pages[0] = -1; break;
        case LOGITS_BIG: fb.be.cfg.max_logit_rows = 3; break;
        case LOGIT_TOKEN: x.logit_token[1] = 11; break;
        }
        err.msg[0] = 0;
        if (rp_batch_validate(&x.b, &fb.be, &err) != RP_ERR) fail_msg("case %d (%s) passes", c, says[c]);
        if (!strstr(err.msg, says[c])) fail_msg("case %d: '%s' does not say '%s'", c, err.msg, says[c]);
        make_backend(&fb);
    }
    /* the dummy page and the last slot of the dummy page are in range */
    copy_batch(&x, good, t.table);
    x.slots[4] = 35;
    x.pages[2 * 4 + 1] = 8;
    assert_int_equal(rp_batch_validate(&x.b, &fb.be, &err), RP_OK);
    rp_batch_builder_free(bb);
    free_tables(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_layout),
        cmocka_unit_test(test_batch_full),
        cmocka_unit_test(test_batch_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
