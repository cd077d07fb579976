/* The tensor-parallel rank layout (src/dist/tp_plan.c): the published
 * shapes at N = 1, 2, 4, 8, KV-head replication, the refusals (each message
 * names the numbers), and every weight's slices covering the tensor exactly
 * once per replica. */
#include "dist/tp_plan.h"
#include "test_util.h"

static rp_model_config preset(const char *name) {
    rp_model_config c;
    rp_err err;
    if (rp_config_preset(&c, name, &err)) fail_msg("%s: %s", name, err.msg);
    return c;
}

static void expect_refused(const rp_model_config *c, int n, const char *want1, const char *want2) {
    rp_tp_plan p;
    rp_err err;
    assert_int_equal(rp_tp_plan_make(&p, c, n, &err), RP_ERR);
    if (!strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
        fail_msg("N=%d: message \"%s\" lacks \"%s\" / \"%s\"", n, err.msg, want1, want2 ? want2 : "");
    assert_string_equal(err.param, "tensor_parallel_size");
}

static void test_sizes(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    const int bad[] = {0, -1, 3, 5, 6, 16};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "--tensor-parallel-size %d is not supported", bad[i]);
        expect_refused(&c, bad[i], want, "1, 2, 4 or 8");
    }
    for (int n = 1; n <= 8; n *= 2) assert_int_equal(rp_tp_size_check(n, NULL), 0);
}

/* Llama 3 8B: 32 heads, 8 KV heads, MLP 14336, vocabulary 128256. */
static void test_llama3_8b(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    rp_err err;
    for (int n = 1; n <= 8; n *= 2) {
        rp_tp_plan p;
        if (rp_tp_plan_make(&p, &c, n, &err)) fail_msg("N=%d: %s", n, err.msg);
        assert_int_equal(p.q_heads_per_rank, 32 / n);
        assert_int_equal(p.kv_heads_per_rank, 8 / n);
        assert_int_equal(p.kv_replicas, 1);
        assert_int_equal(p.inter_per_rank, 14336 / n);
        assert_int_equal(p.vocab_per_rank % RP_TP_VOCAB_ALIGN, 0);
        assert_true(p.vocab_padded >= 128256 && p.vocab_padded - 128256 < (int64_t)n * RP_TP_VOCAB_ALIGN);
        for (int r = 0; r < n; r++) {
            assert_int_equal(p.ranks[r].q_head_start, r * 32 / n);
            assert_int_equal(p.ranks[r].kv_head_start, r * 8 / n);
            assert_int_equal(p.ranks[r].inter_start, r * 14336 / n);
        }
    }
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 8, &err), 0);
    assert_int_equal(p.vocab_per_rank, 16064); /* 128256 / 8 = 16032, up to a multiple of 64 */
    assert_int_equal(p.ranks[7].vocab_count, 128256 - 7 * 16064);
}

/* Qwen2.5-7B: 28 heads (N = 8 cannot divide them), 4 KV heads (N = 4: one
 * each; N = 8 would replicate). Llama 3 70B at 8. */
static void test_other_shapes(void **state) {
    (void)state;
    rp_model_config q = preset("qwen2.5-7b");
    rp_tp_plan p;
    rp_err err;
    assert_int_equal(rp_tp_plan_make(&p, &q, 4, &err), 0);
    assert_int_equal(p.q_heads_per_rank, 7);
    assert_int_equal(p.kv_heads_per_rank, 1);
    assert_int_equal(p.inter_per_rank, 18944 / 4);
    expect_refused(&q, 8, "does not divide num_attention_heads=28", "--tensor-parallel-size 8");
    rp_model_config l = preset("llama3-70b");
    assert_int_equal(rp_tp_plan_make(&p, &l, 8, &err), 0);
    assert_int_equal(p.q_heads_per_rank, 8);
    assert_int_equal(p.kv_heads_per_rank, 1);
    assert_int_equal(p.inter_per_rank, 3584);
    rp_model_config t = preset("tiny-qwen3"); /* 6 heads */
    expect_refused(&t, 4, "num_attention_heads=6", NULL);
}

/* Fewer KV heads than ranks: each KV head on N / num_kv_heads ranks, the
 * ranks whose query heads use it. */
static void test_kv_replication(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    c.num_kv_heads = 2;
    rp_tp_plan p;
    rp_err err;
    assert_int_equal(rp_tp_plan_make(&p, &c, 8, &err), 0);
    assert_int_equal(p.kv_replicas, 4);
    assert_int_equal(p.kv_heads_per_rank, 1);
    const int group = c.num_heads / c.num_kv_heads;
    for (int r = 0; r < 8; r++) {
        assert_int_equal(p.ranks[r].kv_head_start, r / 4);
        for (int h = p.ranks[r].q_head_start; h < p.ranks[r].q_head_start + p.ranks[r].num_q_heads; h++)
            assert_int_equal(h / group, p.ranks[r].kv_head_start);
    }
    c.num_kv_heads = 1; /* multi-query: every rank holds the one KV head */
    assert_int_equal(rp_tp_plan_make(&p, &c, 4, &err), 0);
    assert_int_equal(p.kv_replicas, 4);
    for (int r = 0; r < 4; r++) assert_int_equal(p.ranks[r].kv_head_start, 0);
    /* split without replication: each rank's query heads use its own KV heads */
    c.num_kv_heads = 8;
    assert_int_equal(rp_tp_plan_make(&p, &c, 2, &err), 0);
    for (int r = 0; r < 2; r++) {
        const rp_tp_rank *k = &p.ranks[r];
        for (int h = k->q_head_start; h < k->q_head_start + k->num_q_heads; h++) {
            int kvh = h / (c.num_heads / c.num_kv_heads);
            assert_true(kvh >= k->kv_head_start && kvh < k->kv_head_start + k->num_kv_heads);
        }
    }
}

static void test_refusals(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    c.num_heads = 24;
    c.num_kv_heads = 6; /* 6 and 4: neither divides the other */
    expect_refused(&c, 4, "num_key_value_heads=6", "--tensor-parallel-size 4");
    c.num_kv_heads = 12; /* 12 and 8 */
    expect_refused(&c, 8, "num_key_value_heads=12", "neither divides the other");
    c = preset("llama3-8b");
    c.intermediate_size = 14340; /* divisible by 4, not 8 */
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 4, NULL), 0);
    expect_refused(&c, 8, "does not divide intermediate_size=14340", NULL);
}

/* Small vocabularies leave the last ranks without real rows; together the
 * ranks still hold every row once. */
static void test_vocab(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    const int vocabs[] = {100, 1031, 64 * 8, 64 * 8 + 1, 151936};
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        c.vocab_size = vocabs[v];
        for (int n = 1; n <= 8; n *= 2) {
            rp_tp_plan p;
            assert_int_equal(rp_tp_plan_make(&p, &c, n, NULL), 0);
            int64_t total = 0;
            for (int r = 0; r < n; r++) {
                total += p.ranks[r].vocab_count;
                assert_int_equal(p.ranks[r].vocab_start, r * p.vocab_per_rank);
                assert_true(p.ranks[r].vocab_count <= p.vocab_per_rank);
                if (p.ranks[r].vocab_count)
                    assert_int_equal(rp_tp_vocab_owner(&p, p.ranks[r].vocab_start + p.ranks[r].vocab_count - 1), r);
            }
            assert_int_equal(total, vocabs[v]);
        }
    }
    c.vocab_size = 100;
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 8, NULL), 0);
    assert_int_equal(p.ranks[1].vocab_count, 36);
    assert_int_equal(p.ranks[2].vocab_count, 0);
}

/* Every weight of every rank: the slices, taken over the ranks, hold each
 * element of the tensor exactly `replicas` times (N for replicated norms,
 * kv_replicas for K and V, once for the rest). */
static void check_cover(const rp_model_config *c, int n) {
    rp_tp_plan p;
    rp_err err;
    if (rp_tp_plan_make(&p, c, n, &err)) fail_msg("%s", err.msg);
    for (int kind = 0; kind < RP_W_COUNT; kind++) {
        int64_t shape[2];
        rp_weight_shape(c, (rp_weight_kind)kind, shape);
        const int64_t dim = rp_tp_kind_split((rp_weight_kind)kind) == RP_TP_SPLIT_COLS ? shape[1] : shape[0];
        int *hits = calloc((size_t)dim, sizeof *hits);
        for (int r = 0; r < n; r++) {
            rp_tp_slice s;
            rp_tp_weight_slice(&p, (rp_weight_kind)kind, r, &s);
            assert_int_equal(s.rows, shape[0]);
            assert_int_equal(s.cols, shape[1]);
            assert_true(s.start >= 0 && s.count >= 0 && s.start + s.count <= dim);
            assert_true(s.padded_count >= s.count);
            for (int64_t i = s.start; i < s.start + s.count; i++) hits[i]++;
        }
        int want = 1;
        if (rp_tp_kind_split((rp_weight_kind)kind) == RP_TP_REPLICATED) want = n;
        if (kind == RP_W_K || kind == RP_W_V || kind == RP_W_K_BIAS || kind == RP_W_V_BIAS) want = p.kv_replicas;
        for (int64_t i = 0; i < dim; i++)
            if (hits[i] != want)
                fail_msg("%s, N=%d: element %lld held %d times, want %d", rp_weight_kind_name((rp_weight_kind)kind), n,
                         (long long)i, hits[i], want);
        free(hits);
    }
}

static void test_cover(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    for (int n = 1; n <= 8; n *= 2) check_cover(&c, n);
    c.num_kv_heads = 2;
    for (int n = 1; n <= 8; n *= 2) check_cover(&c, n);
    rp_model_config q = preset("qwen2.5-7b");
    for (int n = 1; n <= 4; n *= 2) check_cover(&q, n);
}

static void test_byte_ranges(void **state) {
    (void)state;
    rp_model_config c = preset("llama3-8b");
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 4, NULL), 0);
    rp_tp_slice s;
    rp_tp_byte_ranges br;
    /* q_proj [4096, 4096], rank 1: rows 1024..2047, one run */
    rp_tp_weight_slice(&p, RP_W_Q, 1, &s);
    assert_int_equal(s.split, RP_TP_SPLIT_ROWS);
    rp_tp_slice_byte_ranges(&s, 2, &br);
    assert_int_equal(br.num_runs, 1);
    assert_int_equal(br.offset_bytes, 1024ull * 4096 * 2);
    assert_int_equal(br.run_bytes, 1024ull * 4096 * 2);
    /* down_proj [4096, 14336], rank 3: columns 10752..14335 of every row */
    rp_tp_weight_slice(&p, RP_W_DOWN, 3, &s);
    assert_int_equal(s.split, RP_TP_SPLIT_COLS);
    rp_tp_slice_byte_ranges(&s, 4, &br);
    assert_int_equal(br.num_runs, 4096);
    assert_int_equal(br.offset_bytes, 10752ull * 4);
    assert_int_equal(br.run_bytes, 3584ull * 4);
    assert_int_equal(br.stride_bytes, 14336ull * 4);
    /* a norm: the whole tensor */
    rp_tp_weight_slice(&p, RP_W_ATTN_NORM, 2, &s);
    rp_tp_slice_byte_ranges(&s, 2, &br);
    assert_int_equal(br.num_runs, 1);
    assert_int_equal(br.offset_bytes, 0);
    assert_int_equal(br.run_bytes, 4096ull * 2);
}

static void test_collectives(void **state) {
    (void)state;
    assert_int_equal(rp_tp_kind_collective(RP_W_O), RP_TP_COLL_ALL_REDUCE);
    assert_int_equal(rp_tp_kind_collective(RP_W_DOWN), RP_TP_COLL_ALL_REDUCE);
    assert_int_equal(rp_tp_kind_collective(RP_W_EMBED), RP_TP_COLL_ALL_REDUCE);
    assert_int_equal(rp_tp_kind_collective(RP_W_LM_HEAD), RP_TP_COLL_GATHER);
    assert_int_equal(rp_tp_kind_collective(RP_W_Q), RP_TP_COLL_NONE);
    assert_int_equal(rp_tp_kind_collective(RP_W_GATE), RP_TP_COLL_NONE);
}

static void test_fingerprint(void **state) {
    (void)state;
    rp_model_config a = preset("llama3-8b"), b = preset("llama3-8b");
    assert_true(rp_tp_fingerprint(&a, 2) == rp_tp_fingerprint(&b, 2));
    assert_true(rp_tp_fingerprint(&a, 2) != rp_tp_fingerprint(&a, 4));
    b.num_layers = 31;
    assert_true(rp_tp_fingerprint(&a, 2) != rp_tp_fingerprint(&b, 2));
    b = a;
    b.rope.theta = 10000;
    assert_true(rp_tp_fingerprint(&a, 2) != rp_tp_fingerprint(&b, 2));
    rp_model_config q = preset("qwen3-8b");
    assert_true(rp_tp_fingerprint(&a, 2) != rp_tp_fingerprint(&q, 2));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),          cmocka_unit_test(test_llama3_8b),  cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_kv_replication), cmocka_unit_test(test_refusals),   cmocka_unit_test(test_vocab),
        cmocka_unit_test(test_cover),          cmocka_unit_test(test_byte_ranges), cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_fingerprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
