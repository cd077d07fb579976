/* A rank's shard as an rp_model (src/dist/tp_model.c): loaded from the
 * committed fixture checkpoints (one file and sharded files, tied and
 * untied, biases, q/k norms) at N = 1, 2, 4, 8, every weight has the shape
 * the shard's config implies and holds the rank's rows or columns of the
 * whole model, the vocabulary shard zero-padded; bf16 row slices are views
 * of the mapping; the same from a model in memory; the N = 1 shard runs
 * through the CPU backend to the whole model's logits; FP8 checkpoints'
 * shards keep the whole model's e4m3 bytes and scales for their slices,
 * and --quantization fp8's shards the bytes of the whole model quantized; a
 * plan for another model and lazy dummy weights are refused. */
#include "dist/tp_model.h"
#include "engine/runner.h"
#include "fp8_checkpoint.h"
#include "test_util.h"

static void fixture_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/tests/fixtures/models/%s", test_source_dir(), name);
}

static int in_mapping(const rp_model *m, const void *p) {
    for (int i = 0; i < m->num_files; i++)
        if ((const char *)p >= (const char *)m->files[i]->map &&
            (const char *)p < (const char *)m->files[i]->map + m->files[i]->map_bytes)
            return 1;
    return 0;
}

/* The shard of rank r against the whole model, weight by weight. */
static void check_shard(const rp_model *full, const rp_model *shard, const rp_tp_plan *p, int r, const char *what) {
    const rp_model_config *c = &full->cfg, *sc = &shard->cfg;
    assert_int_equal(sc->num_heads, c->num_heads / p->size);
    assert_int_equal(sc->num_kv_heads, p->kv_heads_per_rank);
    assert_int_equal(sc->intermediate_size, c->intermediate_size / p->size);
    assert_int_equal(sc->vocab_size, p->vocab_per_rank);
    assert_int_equal(sc->hidden_size, c->hidden_size);
    assert_int_equal(sc->head_dim, c->head_dim);
    for (int k = 0; k < RP_W_COUNT; k++) {
        if (!rp_arch_has_weight(c->arch, (rp_weight_kind)k)) continue;
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : c->num_layers); l++) {
            const rp_weight *fw = rp_model_weight(full, (rp_weight_kind)k, l),
                            *sw = rp_model_weight(shard, (rp_weight_kind)k, l);
            int64_t shape[2];
            rp_weight_shape(sc, (rp_weight_kind)k, shape);
            if (sw->rows != shape[0] || sw->cols != shape[1] || !sw->data)
                fail_msg("%s rank %d %s: [%lld, %lld], the shard's config implies [%lld, %lld]", what, r,
                         rp_weight_kind_name((rp_weight_kind)k), (long long)sw->rows, (long long)sw->cols,
                         (long long)shape[0], (long long)shape[1]);
            rp_tp_slice s;
            rp_tp_weight_slice(p, (rp_weight_kind)k, r, &s);
            for (int64_t i = 0; i < sw->rows; i++)
                for (int64_t j = 0; j < sw->cols; j++) {
                    uint16_t want = 0; /* vocabulary padding */
                    if (s.split == RP_TP_SPLIT_COLS) want = fw->data[i * fw->cols + s.start + j];
                    else if (i < s.count) want = fw->data[(s.start + i) * fw->cols + j];
                    if (sw->data[i * sw->cols + j] != want)
                        fail_msg("%s rank %d %s layer %d (%lld, %lld): %04x, want %04x", what, r,
                                 rp_weight_kind_name((rp_weight_kind)k), l, (long long)i, (long long)j,
                                 sw->data[i * sw->cols + j], want);
                }
        }
    }
    if (c->tie_word_embeddings)
        assert_ptr_equal(rp_model_weight(shard, RP_W_LM_HEAD, 0)->data, rp_model_weight(shard, RP_W_EMBED, 0)->data);
}

static void check_fixture(const char *name, int max_n) {
    char dir[1024];
    fixture_dir(dir, sizeof dir, name);
    rp_err err;
    rp_load_options lo = {0};
    rp_model *full = rp_model_load(dir, &lo, &err);
    if (!full) fail_msg("%s: %s", name, err.msg);
    for (int n = 1; n <= max_n; n *= 2) {
        rp_tp_plan p;
        if (rp_tp_plan_make(&p, &full->cfg, n, &err)) fail_msg("%s N=%d: %s", name, n, err.msg);
        for (int r = 0; r < n; r++) {
            rp_model *shard = rp_tp_model_load(dir, &p, r, RP_FP8_NONE, &err);
            if (!shard) fail_msg("%s N=%d rank %d: %s", name, n, r, err.msg);
            char what[128];
            snprintf(what, sizeof what, "%s N=%d (files)", name, n);
            check_shard(full, shard, &p, r, what);
            /* no copy of a bf16 row slice: q_proj is a view of the mapping */
            assert_true(in_mapping(shard, rp_model_weight(shard, RP_W_Q, 0)->data));
            if (n > 1) assert_false(in_mapping(shard, rp_model_weight(shard, RP_W_DOWN, 0)->data));
            rp_model_free(shard);
            shard = rp_tp_model_slice(full, &p, r, &err);
            if (!shard) fail_msg("%s N=%d rank %d: %s", name, n, r, err.msg);
            snprintf(what, sizeof what, "%s N=%d (in memory)", name, n);
            check_shard(full, shard, &p, r, what);
            rp_model_free(shard);
        }
    }
    rp_model_free(full);
}

static void test_fixtures(void **state) {
    (void)state;
    check_fixture("qwen3-tied", 4);    /* 2 KV heads: replicated at 4 */
    check_fixture("qwen3-gqa6", 2);    /* six files and an index; 1 KV head */
    check_fixture("qwen2-bias", 2);    /* q/k/v biases */
    check_fixture("llama3-scaled", 8); /* untied lm_head, 8 KV heads */
}

/* The N = 1 shard is the whole model with the vocabulary padded: through
 * the CPU backend its logits are the model's, then zeros. */
static void test_cpu_backend_runs_shard(void **state) {
    (void)state;
    char dir[1024];
    fixture_dir(dir, sizeof dir, "qwen3-tied");
    rp_err err;
    rp_load_options lo = {0};
    rp_model *full = rp_model_load(dir, &lo, &err);
    assert_non_null(full);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &full->cfg, 1, &err), 0);
    rp_model *shard = rp_tp_model_load(dir, &p, 0, RP_FP8_NONE, &err);
    if (!shard) fail_msg("%s", err.msg);
    const int32_t prompt[5] = {1, 77, 300, 502, 9};
    const int V = full->cfg.vocab_size, VP = shard->cfg.vocab_size, n = 5;
    assert_true(VP > V);
    float *lf = malloc((size_t)n * V * 4), *ls = malloc((size_t)n * VP * 4);
    const rp_model *models[2] = {full, shard};
    float *outs[2] = {lf, ls};
    for (int i = 0; i < 2; i++) {
        rp_runner_config rc = {.model = models[i], .device = "cpu", .threads = 2, .page_size = 16, .num_pages = 2,
                               .max_seqs = 1, .max_context = 32, .max_batched_tokens = 32, .max_logit_rows = 32};
        rp_runner *run = rp_runner_new(&rc, &err);
        if (!run) fail_msg("runner: %s", err.msg);
        const int32_t *ids[1] = {prompt};
        float *o[1] = {outs[i]};
        if (rp_runner_run_prompts(run, 1, ids, &n, o, 0, NULL, &err)) fail_msg("%s", err.msg);
        rp_runner_free(run);
    }
    for (int t = 0; t < n; t++) {
        assert_memory_equal(ls + (size_t)t * VP, lf + (size_t)t * V, (size_t)V * 4);
        for (int v = V; v < VP; v++) assert_true(ls[(size_t)t * VP + v] == 0.0f);
    }
    free(lf), free(ls);
    rp_model_free(shard);
    rp_model_free(full);
}

/* The shard's e4m3 bytes and scales against the whole fp8 model's: each
 * layer matrix's rows or columns of bytes, its rows' scales (a column
 * slice: every row's), or its rows or columns of the block grid. */
static void check_fp8_shard(const rp_model *full, const rp_model *shard, const rp_tp_plan *p, int r, const char *what) {
    if (shard->fp8 != full->fp8) fail_msg("%s rank %d: fp8 layout %d, the whole model's %d", what, r, shard->fp8, full->fp8);
    const int64_t B = RP_FP8_BLOCK;
    for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
        if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)k)) continue;
        for (int l = 0; l < full->cfg.num_layers; l++) {
            const rp_weight *fw = rp_model_weight(full, (rp_weight_kind)k, l),
                            *sw = rp_model_weight(shard, (rp_weight_kind)k, l);
            rp_tp_slice s;
            rp_tp_weight_slice(p, (rp_weight_kind)k, r, &s);
            const int cols = s.split == RP_TP_SPLIT_COLS;
            if (!sw->fp8) fail_msg("%s rank %d %s layer %d: no e4m3 bytes", what, r, rp_weight_kind_name((rp_weight_kind)k), l);
            for (int64_t i = 0; i < sw->rows; i++)
                for (int64_t j = 0; j < sw->cols; j++)
                    if (sw->fp8[i * sw->cols + j] != fw->fp8[(cols ? i : s.start + i) * fw->cols + (cols ? s.start + j : j)])
                        fail_msg("%s rank %d %s layer %d: byte (%lld, %lld)", what, r,
                                 rp_weight_kind_name((rp_weight_kind)k), l, (long long)i, (long long)j);
            if (full->fp8 == RP_FP8_ROWS) {
                assert_null(sw->block_scale);
                for (int64_t i = 0; i < sw->rows; i++)
                    if (sw->scale[i] != fw->scale[cols ? i : s.start + i])
                        fail_msg("%s rank %d %s layer %d: row %lld's scale", what, r,
                                 rp_weight_kind_name((rp_weight_kind)k), l, (long long)i);
            } else {
                assert_null(sw->scale);
                const int64_t sgc = (sw->cols + B - 1) / B, fgc = (fw->cols + B - 1) / B;
                for (int64_t i = 0; i < (sw->rows + B - 1) / B; i++)
                    for (int64_t j = 0; j < sgc; j++)
                        if (sw->block_scale[i * sgc + j] !=
                            fw->block_scale[(cols ? i : s.start / B + i) * fgc + (cols ? s.start / B + j : j)])
                            fail_msg("%s rank %d %s layer %d: block (%lld, %lld)'s scale", what, r,
                                     rp_weight_kind_name((rp_weight_kind)k), l, (long long)i, (long long)j);
            }
        }
    }
}

/* 128-wide heads and an MLP of 512: every rank's share of every layer
 * matrix is whole 128 x 128 blocks at N = 1, 2, 4. */
static rp_model_config fp8_config(void) {
    rp_model_config c;
    rp_err err;
    if (rp_config_preset(&c, "tiny-qwen3", &err)) fail_msg("%s", err.msg);
    c.head_dim = 128, c.hidden_size = 256, c.num_heads = 4, c.num_kv_heads = 2, c.intermediate_size = 512;
    c.num_layers = 2, c.vocab_size = 300;
    return c;
}

/* FP8 checkpoints (per channel, and 128 x 128 blocks: tests/fp8_checkpoint.h)
 * read slice by slice at N = 1, 2, 4: each shard is fp8 of the whole
 * model's layout, with the whole model's bytes and scales for its slices
 * and its dequantized values; the same sliced from the model in memory.
 * --quantization fp8 of a bf16 checkpoint: each shard holds the bytes and
 * scales of the whole model quantized at load, o_proj's and down_proj's
 * column slices with the whole rows' scales; of an FP8 checkpoint:
 * refused. */
static void test_fp8(void **state) {
    (void)state;
    rp_err err;
    char dir[] = "/tmp/rp_test_tp_fp8_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const rp_model_config cfg = fp8_config();
    for (int lay = RP_FP8_ROWS; lay <= RP_FP8_BLOCKS; lay++) {
        rp_load_options lo = {.seed = 3, .quantize_fp8 = (rp_fp8_layout)lay};
        rp_model *q = rp_model_dummy_from_config(&cfg, &lo, &err);
        if (!q) fail_msg("%s", err.msg);
        char sub[1200];
        snprintf(sub, sizeof sub, "%s/%s", dir, lay == RP_FP8_ROWS ? "channel" : "blocks");
        write_fp8_checkpoint(sub, q);
        rp_model_free(q);
        rp_load_options plain = {0};
        rp_model *full = rp_model_load(sub, &plain, &err);
        if (!full) fail_msg("%s", err.msg);
        assert_int_equal(full->fp8, lay);
        for (int n = 1; n <= 4; n *= 2) {
            rp_tp_plan p;
            assert_int_equal(rp_tp_plan_make(&p, &full->cfg, n, &err), 0);
            uint64_t bytes = 0;
            for (int r = 0; r < n; r++) {
                char what[128];
                snprintf(what, sizeof what, "fp8 %s N=%d (files)", lay == RP_FP8_ROWS ? "channel" : "blocks", n);
                rp_model *shard = rp_tp_model_load(sub, &p, r, RP_FP8_NONE, &err);
                if (!shard) fail_msg("%s rank %d: %s", what, r, err.msg);
                check_shard(full, shard, &p, r, what);
                check_fp8_shard(full, shard, &p, r, what);
                bytes += shard->weight_bytes;
                rp_model_free(shard);
                snprintf(what, sizeof what, "fp8 %s N=%d (in memory)", lay == RP_FP8_ROWS ? "channel" : "blocks", n);
                shard = rp_tp_model_slice(full, &p, r, &err);
                if (!shard) fail_msg("%s rank %d: %s", what, r, err.msg);
                check_shard(full, shard, &p, r, what);
                check_fp8_shard(full, shard, &p, r, what);
                rp_model_free(shard);
            }
            /* the shards hold a byte an element of the layer matrices, as the
             * whole model does (plus the padded and replicated rest) */
            if (n == 1) assert_true(bytes >= full->weight_bytes && bytes < full->weight_bytes + 2 * 256 * 300);
        }
        rp_model_free(full);
    }
    /* --quantization fp8 under tensor parallelism, from a bf16 checkpoint */
    char fx[1024];
    fixture_dir(fx, sizeof fx, "qwen3-tied");
    rp_load_options lo = {.quantize_fp8 = RP_FP8_ROWS};
    rp_model *full = rp_model_load(fx, &lo, &err);
    if (!full) fail_msg("%s", err.msg);
    for (int n = 1; n <= 4; n *= 2) {
        rp_tp_plan p;
        assert_int_equal(rp_tp_plan_make(&p, &full->cfg, n, &err), 0);
        for (int r = 0; r < n; r++) {
            char what[128];
            snprintf(what, sizeof what, "--quantization fp8 N=%d", n);
            rp_model *shard = rp_tp_model_load(fx, &p, r, RP_FP8_ROWS, &err);
            if (!shard) fail_msg("%s rank %d: %s", what, r, err.msg);
            check_shard(full, shard, &p, r, what);
            check_fp8_shard(full, shard, &p, r, what);
            rp_model_free(shard);
        }
    }
    rp_model_free(full);
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/channel", dir);
    rp_model_config c;
    assert_int_equal(rp_config_load_dir(&c, sub, &err), 0);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 2, &err), 0);
    assert_null(rp_tp_model_load(sub, &p, 0, RP_FP8_ROWS, &err));
    assert_non_null(strstr(err.msg, "already quantized"));
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_refusals(void **state) {
    (void)state;
    char dir[1024];
    fixture_dir(dir, sizeof dir, "qwen3-tied");
    rp_model_config other;
    rp_err err;
    assert_int_equal(rp_config_preset(&other, "llama3-8b", &err), 0);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &other, 2, &err), 0);
    assert_null(rp_tp_model_load(dir, &p, 0, RP_FP8_NONE, &err));
    assert_non_null(strstr(err.msg, "the plan was made for another model"));
    rp_load_options lazy = {.lazy_dummy = 1};
    rp_model *m = rp_model_dummy("tiny-llama3", &lazy, &err);
    assert_non_null(m);
    assert_int_equal(rp_tp_plan_make(&p, &m->cfg, 2, &err), 0);
    assert_null(rp_tp_model_slice(m, &p, 1, &err));
    assert_non_null(strstr(err.msg, "has no host data"));
    rp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures), cmocka_unit_test(test_cpu_backend_runs_shard),
                                       cmocka_unit_test(test_fp8), cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
