/* The tensor-parallel backend on the CPU (src/backend/tp_backend.c with the
 * local communicator, src/dist/comm_local.c): a model run as N = 2, 4, 8
 * shards, one thread each, summing and gathering between them, gives the
 * logits of the unsharded model within float rounding (the partial sums
 * are added in another order) and the same greedy tokens; a checkpoint
 * read slice by slice (the config-only engine model) gives those of the
 * checkpoint loaded whole; fp8 models (per row, per 128 x 128 block, an
 * FP8 checkpoint, --quantization fp8 through the runner) as N shards give
 * N = 1's logits and tokens; the step message that carries a call to other
 * nodes survives a round trip and refuses corrupt input; another node's
 * worker loop follows node 0's calls over a link; refusals. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend/tp_step_msg.h"
#include "dist/tp_model.h"
#include "engine/runner.h"
#include "fp8_checkpoint.h"
#include "test_util.h"

/* 2 layers, 8 query heads over 2 KV heads (replicated at N = 4 and 8), a
 * vocabulary that pads on every rank, and larger weights than the default
 * initialisation so that the greedy tokens are far from ties. */
static rp_model *test_model(const char *preset, int heads, int kv, int inter) {
    rp_err err = {0};
    rp_model_config c;
    assert_int_equal(rp_config_preset(&c, preset, &err), 0);
    c.num_layers = 2;
    if (heads) c.num_heads = heads, c.num_kv_heads = kv, c.intermediate_size = inter;
    c.initializer_range = 0.15;
    rp_load_options lo = {.seed = 7};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

#define STEPS 12

/* logits at every prompt position of two prompts (1 and 7 tokens) and
 * STEPS greedy tokens after each, through a runner of tensor-parallel
 * size N (model borrowed, or loaded from dir) */
static void run(const rp_model *m, const char *dir, int N, float **logits, int32_t *tokens, int *vocab) {
    rp_err err = {0};
    rp_runner_config rc = {.model = m, .model_dir = m ? NULL : dir, .device = "cpu", .threads = 1, .page_size = 16,
                           .num_pages = 8, .max_seqs = 2, .max_context = 64, .max_batched_tokens = 64,
                           .max_logit_rows = 16, .tensor_parallel_size = N};
    rp_runner *r = rp_runner_new(&rc, &err);
    if (!r) fail_msg("runner N=%d: %s", N, err.msg);
    *vocab = r->model->cfg.vocab_size;
    static const int32_t p0[1] = {5}, p1[7] = {1, 17, 3, 99, 250, 42, 8};
    const int32_t *ids[2] = {p0, p1};
    const int n[2] = {1, 7};
    if (rp_runner_run_prompts(r, 2, ids, n, logits, STEPS, tokens, &err)) fail_msg("N=%d: %s", N, err.msg);
    rp_runner_free(r);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

/* N shards against N = 1, the model in memory or from dir */
static void compare(const rp_model *m, const char *dir, const int *sizes, int num_sizes) {
    int V = 0;
    float *ref[2], *got[2];
    int32_t ref_tok[2 * STEPS], tok[2 * STEPS];
    const int n[2] = {1, 7};
    /* the vocabulary is known after the first run: allocate for the largest */
    for (int i = 0; i < 2; i++) {
        ref[i] = malloc((size_t)n[i] * 160000 * 4);
        got[i] = malloc((size_t)n[i] * 160000 * 4);
    }
    run(m, dir, 1, ref, ref_tok, &V);
    for (int k = 0; k < num_sizes; k++) {
        int V2 = 0;
        run(m, dir, sizes[k], got, tok, &V2);
        assert_int_equal(V2, V);
        for (int i = 0; i < 2; i++) {
            double e = rel_l2(got[i], ref[i], (size_t)n[i] * V);
            if (e > 1e-5) fail_msg("N=%d prompt %d: logits relative L2 %.3g", sizes[k], i, e);
        }
        for (int i = 0; i < 2 * STEPS; i++)
            if (tok[i] != ref_tok[i]) fail_msg("N=%d: greedy token %d is %d, N=1 %d", sizes[k], i, tok[i], ref_tok[i]);
    }
    for (int i = 0; i < 2; i++) free(ref[i]), free(got[i]);
}

static void test_qwen3_sizes(void **state) {
    (void)state;
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    const int sizes[] = {2, 4, 8};
    compare(m, NULL, sizes, 3);
    rp_model_free(m);
}

static void test_llama3_and_qwen2(void **state) {
    (void)state;
    rp_model *m = test_model("tiny-llama3", 0, 0, 0); /* 10 heads, 2 KV heads, untied */
    const int two[] = {2};
    compare(m, NULL, two, 1);
    rp_model_free(m);
    m = test_model("tiny-qwen2", 8, 4, 232); /* biases */
    const int sizes[] = {2, 4};
    compare(m, NULL, sizes, 2);
    rp_model_free(m);
}

/* A checkpoint: each rank reads its slices (rp_tp_model_load), the engine's
 * model is the config alone. */
static void test_checkpoint(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/qwen3-tied", test_source_dir());
    const int two[] = {2};
    compare(NULL, dir, two, 1);
}

/* An fp8 model on the CPU (the dequantized values, as one device computes
 * with them): quantized per row (--quantization fp8) and per 128 x 128
 * block in memory, sliced with their bytes and scales, at N = 2, 4 against
 * N = 1; and an FP8 checkpoint (per channel) read slice by slice. 128-wide
 * heads and an MLP of 512 keep every rank's share whole blocks. */
static void test_fp8(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model_config c;
    assert_int_equal(rp_config_preset(&c, "tiny-qwen3", &err), 0);
    c.num_layers = 2, c.head_dim = 128, c.hidden_size = 256, c.num_heads = 4, c.num_kv_heads = 2;
    c.intermediate_size = 512, c.initializer_range = 0.15;
    const int sizes[] = {2, 4};
    char dir[] = "/tmp/rp_test_tp_backend_fp8_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int lay = RP_FP8_ROWS; lay <= RP_FP8_BLOCKS; lay++) {
        rp_load_options lo = {.seed = 7, .quantize_fp8 = (rp_fp8_layout)lay};
        rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
        if (!m) fail_msg("%s", err.msg);
        compare(m, NULL, sizes, 2);
        if (lay == RP_FP8_ROWS) {
            write_fp8_checkpoint(dir, m);
            compare(NULL, dir, sizes, 2);
        }
        rp_model_free(m);
    }
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* --quantization fp8 with tensor parallelism, as the runner is asked
 * (dummy weights made whole on the host, quantized, sliced): N = 2 against
 * N = 1, logits and greedy tokens. */
static void test_quantize_fp8(void **state) {
    (void)state;
    int V = 0;
    float *ref[2], *got[2];
    int32_t ref_tok[2 * STEPS], tok[2 * STEPS];
    const int n[2] = {1, 7};
    for (int i = 0; i < 2; i++) ref[i] = malloc((size_t)n[i] * 160000 * 4), got[i] = malloc((size_t)n[i] * 160000 * 4);
    for (int k = 0; k < 2; k++) {
        rp_err err = {0};
        rp_runner_config rc = {.dummy_name = "tiny-llama3", .device = "cpu", .threads = 1, .page_size = 16,
                               .num_pages = 8, .max_seqs = 2, .max_context = 64, .max_batched_tokens = 64,
                               .max_logit_rows = 16, .tensor_parallel_size = k ? 2 : 1, .quantize_fp8 = RP_FP8_ROWS};
        rp_runner *r = rp_runner_new(&rc, &err);
        if (!r) fail_msg("runner: %s", err.msg);
        assert_int_equal(r->model->fp8, RP_FP8_ROWS);
        if (k) assert_int_equal(r->shards[0]->fp8, RP_FP8_ROWS);
        V = r->model->cfg.vocab_size;
        static const int32_t p0[1] = {5}, p1[7] = {1, 17, 3, 99, 250, 42, 8};
        const int32_t *ids[2] = {p0, p1};
        if (rp_runner_run_prompts(r, 2, ids, n, k ? got : ref, STEPS, k ? tok : ref_tok, &err)) fail_msg("%s", err.msg);
        rp_runner_free(r);
    }
    for (int i = 0; i < 2; i++) {
        const double e = rel_l2(got[i], ref[i], (size_t)n[i] * V);
        if (e > 1e-5) fail_msg("prompt %d: logits relative L2 %.3g", i, e);
    }
    for (int i = 0; i < 2 * STEPS; i++) assert_int_equal(tok[i], ref_tok[i]);
    for (int i = 0; i < 2; i++) free(ref[i]), free(got[i]);
}

/* Sampling (temperature, top-p) on every rank draws the same tokens as one
 * device does: the logits are gathered whole and the RNG is counter-based. */
static void test_sampled_decode(void **state) {
    (void)state;
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    int32_t last[2][2];
    for (int k = 0; k < 2; k++) {
        rp_err err = {0};
        rp_runner_config rc = {.model = m, .device = "cpu", .threads = 1, .page_size = 16, .num_pages = 8,
                               .max_seqs = 2, .max_context = 64, .max_batched_tokens = 64,
                               .tensor_parallel_size = k ? 4 : 1};
        rp_runner *r = rp_runner_new(&rc, &err);
        if (!r) fail_msg("%s", err.msg);
        rp_runner_seq seqs[2];
        assert_int_equal(rp_runner_seqs_begin(r, seqs, 2, &err), 0);
        double secs = 0;
        if (rp_runner_prefill_random(r, seqs, 2, 5, &secs, &err)) fail_msg("%s", err.msg);
        rp_sampling_params sp = {.temperature = 0.9f, .top_p = 0.95f, .top_k = -1, .repetition_penalty = 1.0f};
        double wall[10], gpu[10];
        if (rp_runner_decode_steps(r, seqs, 2, 10, &sp, wall, gpu, &err)) fail_msg("%s", err.msg);
        last[k][0] = seqs[0].last, last[k][1] = seqs[1].last;
        rp_runner_seqs_end(r, seqs, 2);
        rp_runner_free(r);
    }
    assert_int_equal(last[0][0], last[1][0]);
    assert_int_equal(last[0][1], last[1][1]);
    rp_model_free(m);
}

/* The GPU's dummy shards (generated there, rp_k_fill_dummy_slice): no host
 * data, every weight shaped as the host-sliced shard's. */
static void test_lazy_dummy_shards(void **state) {
    (void)state;
    rp_err err = {0};
    const char *names[] = {"tiny-qwen2", "tiny-llama3"};
    for (int i = 0; i < 2; i++) {
        rp_model *m = test_model(names[i], i == 0 ? 8 : 0, i == 0 ? 4 : 0, i == 0 ? 232 : 0);
        rp_tp_plan plan;
        assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, 2, &err), 0);
        for (int rank = 0; rank < 2; rank++) {
            rp_model *s = rp_tp_model_slice(m, &plan, rank, &err), *z = rp_tp_model_lazy_dummy(&plan, rank, 7, RP_FP8_NONE, &err);
            assert_non_null(s);
            assert_non_null(z);
            assert_true(z->dummy);
            assert_int_equal(z->weight_bytes, s->weight_bytes);
            for (int k = 0; k < RP_W_COUNT; k++)
                for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : m->cfg.num_layers); l++) {
                    const rp_weight *a = rp_model_weight(s, (rp_weight_kind)k, l), *b = rp_model_weight(z, (rp_weight_kind)k, l);
                    assert_int_equal(a->rows, b->rows);
                    assert_int_equal(a->cols, b->cols);
                    assert_null(b->data);
                }
            rp_model_free(s);
            rp_model_free(z);
        }
        rp_model_free(m);
    }
}

static void test_refusals(void **state) {
    (void)state;
    rp_err err = {0};
    rp_runner_config rc = {.dummy_name = "tiny-qwen3", .device = "cpu", .threads = 1, .num_pages = 8, .max_seqs = 1,
                           .max_context = 64, .tensor_parallel_size = 4};
    assert_null(rp_runner_new(&rc, &err)); /* 6 query heads */
    assert_non_null(strstr(err.msg, "num_attention_heads"));
    assert_string_equal(err.param, "tensor_parallel_size");
    rc.tensor_parallel_size = 3;
    assert_null(rp_runner_new(&rc, &err));
    assert_string_equal(err.param, "tensor_parallel_size");
    rc.tensor_parallel_size = 2;
    rc.nnodes = 2;
    rc.dist_init_addr = "127.0.0.1:1";
    assert_null(rp_runner_new(&rc, &err)); /* several nodes run on GPUs only */
    assert_string_equal(err.param, "nnodes");
    /* N = 2 of the same model runs */
    rc.nnodes = 0;
    rp_runner *r = rp_runner_new(&rc, &err);
    if (!r) fail_msg("%s", err.msg);
    rp_runner_free(r);
}

/* ---- the step message ----------------------------------------------------- */

static void test_step_msg(void **state) {
    (void)state;
    rp_err err = {0};
    const int32_t tokens[5] = {10, -1, 7, 8, 9}, positions[5] = {3, 0, 0, 1, 2}, slots[5] = {19, 32, 48, 49, 50};
    const int32_t seq_start[3] = {0, 2, 5}, kv_len[3] = {4, 3};
    const int32_t seq_start2[4] = {0, 1, 2, 5}, kv2[3] = {4, 1, 3};
    (void)seq_start;
    (void)kv_len;
    const int32_t rows[3] = {2, 0, 1};
    int32_t table[3][4] = {{5, 6, 0, 0}, {7, 0, 0, 0}, {1, 2, 3, 4}};
    const int32_t logit_token[3] = {0, 1, 4};
    rp_sampling_params sp[3] = {{.temperature = 0.7f, .top_p = 0.9f, .top_k = 40, .seed = 1234567890123ull, .step = 9},
                                {.temperature = 0, .top_logprobs = 3, .has_seed = 1},
                                {.temperature = 1, .min_p = 0.05f, .repetition_penalty = 1.1f,
                                 .presence_penalty = -0.5f, .frequency_penalty = 0.25f}};
    rp_batch bt = {.num_seqs = 3, .num_tokens = 5, .tokens = tokens, .positions = positions, .seq_start = seq_start2,
                   .seq_kv_len = kv2, .seq_page_row = rows, .page_table = &table[0][0], .page_table_stride = 4,
                   .slot_mapping = slots, .num_logits = 3, .logit_token = logit_token, .sample = sp, .spec_round = 1};
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    assert_int_equal(rp_step_msg_encode(RP_STEP_FORWARD, 0, &bt, 2, &buf, &cap, &len, &err), 0);
    rp_step_decoder d;
    assert_int_equal(rp_step_decoder_init(&d, 8, 4, 4, 8, 1000, &err), 0);
    rp_step_op op;
    int arg = -1;
    rp_batch got;
    if (rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err)) fail_msg("%s", err.msg);
    assert_int_equal(op, RP_STEP_FORWARD);
    assert_int_equal(got.num_seqs, 3);
    assert_int_equal(got.num_tokens, 5);
    assert_int_equal(got.num_logits, 3);
    assert_int_equal(got.spec_round, 1);
    assert_int_equal(got.page_table_stride, 4);
    assert_memory_equal(got.tokens, tokens, sizeof tokens);
    assert_memory_equal(got.positions, positions, sizeof positions);
    assert_memory_equal(got.slot_mapping, slots, sizeof slots);
    assert_memory_equal(got.seq_start, seq_start2, sizeof seq_start2);
    assert_memory_equal(got.seq_kv_len, kv2, sizeof kv2);
    assert_memory_equal(got.logit_token, logit_token, sizeof logit_token);
    assert_memory_equal(got.sample, sp, sizeof sp);
    /* each sequence's pages that its K/V covers (page size 2), in its own row */
    for (int s = 0; s < 3; s++) {
        const int32_t *want = &table[rows[s]][0], *row = got.page_table + (int64_t)got.seq_page_row[s] * 4;
        for (int p = 0; p < (kv2[s] + 1) / 2; p++) assert_int_equal(row[p], want[p]);
    }
    /* cut anywhere, one byte too many, or a byte flipped in the header */
    for (size_t n = 0; n < len; n++) assert_int_not_equal(rp_step_msg_decode(&d, buf, n, &op, &arg, &got, &err), 0);
    uint8_t *longer = malloc(len + 4);
    memcpy(longer, buf, len);
    memset(longer + len, 0, 4);
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len + 4, &op, &arg, &got, &err), 0);
    assert_non_null(strstr(err.msg, "past its end"));
    memcpy(longer, buf, len);
    longer[4] = 9; /* version */
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len, &op, &arg, &got, &err), 0);
    assert_non_null(strstr(err.msg, "version"));
    memcpy(longer, buf, len);
    longer[0] = 'x';
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len, &op, &arg, &got, &err), 0);
    memcpy(longer, buf, len);
    longer[16] = 200; /* 200 sequences: past the decoder's limit */
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len, &op, &arg, &got, &err), 0);
    assert_non_null(strstr(err.msg, "limits"));
    memcpy(longer, buf, len);
    longer[8] = 77; /* op */
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len, &op, &arg, &got, &err), 0);
    /* a page count past the stride */
    memcpy(longer, buf, len);
    size_t pages_at = 16 + 28 + 5 * 12 + 4 * 4 + 3 * 4;
    longer[pages_at] = 9;
    assert_int_not_equal(rp_step_msg_decode(&d, longer, len, &op, &arg, &got, &err), 0);
    /* the other ops: no batch */
    assert_int_equal(rp_step_msg_encode(RP_STEP_SET_GRAPHS, 1, NULL, 2, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(op, RP_STEP_SET_GRAPHS);
    assert_int_equal(arg, 1);
    assert_int_equal(rp_step_msg_encode(RP_STEP_SHUTDOWN, 0, NULL, 2, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(op, RP_STEP_SHUTDOWN);
    assert_int_equal(rp_step_msg_encode(RP_STEP_PING, 0, NULL, 2, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(op, RP_STEP_PING);
    /* a deferred forward says so */
    bt.sample_deferred = 1;
    assert_int_equal(rp_step_msg_encode(RP_STEP_FORWARD, 0, &bt, 2, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(got.sample_deferred, 1);
    /* sampling with masks: 2 masks over a vocabulary of 1000 (32 words a
     * row), rows naming them or none; then without rows; then cut */
    const int words = rp_token_mask_words(1000);
    uint32_t masks[5 * 32] = {0}; /* 5: one test sends more masks than the decoder takes */
    for (int i = 0; i < 2 * words; i++) masks[i] = 0x9e3779b9u * (uint32_t)(i + 1);
    const int32_t mrow[3] = {1, -1, 0};
    assert_int_equal(rp_step_msg_encode_masks(masks, 2, words, mrow, 3, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(op, RP_STEP_SAMPLE_MASKED);
    assert_int_equal(arg, 2);
    assert_non_null(d.mask_of_row);
    assert_memory_equal(d.mask_of_row, mrow, sizeof mrow);
    assert_memory_equal(d.masks, masks, (size_t)2 * words * 4);
    for (size_t n = 0; n < len; n++) assert_int_not_equal(rp_step_msg_decode(&d, buf, n, &op, &arg, &got, &err), 0);
    assert_int_equal(rp_step_msg_encode_masks(masks, 2, words - 4, mrow, 3, &buf, &cap, &len, &err), 0);
    assert_int_not_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0); /* another vocabulary */
    assert_non_null(strstr(err.msg, "words"));
    assert_int_equal(rp_step_msg_encode_masks(masks, 5, words, mrow, 3, &buf, &cap, &len, &err), 0);
    assert_int_not_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0); /* past max_logits */
    assert_int_equal(rp_step_msg_encode_masks(masks, 0, words, NULL, 3, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_null(d.mask_of_row);
    /* an abort carries its reason, cut to fit */
    assert_int_equal(rp_step_msg_encode_abort("rank 3: CUDA out of memory", &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(op, RP_STEP_ABORT);
    assert_string_equal(d.reason, "rank 3: CUDA out of memory");
    for (size_t n = 0; n < len; n++) assert_int_not_equal(rp_step_msg_decode(&d, buf, n, &op, &arg, &got, &err), 0);
    char huge[2000];
    memset(huge, 'x', sizeof huge - 1);
    huge[sizeof huge - 1] = 0;
    assert_int_equal(rp_step_msg_encode_abort(huge, &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_step_msg_decode(&d, buf, len, &op, &arg, &got, &err), 0);
    assert_int_equal(strlen(d.reason), RP_STEP_REASON_BYTES - 1);
    free(longer);
    free(buf);
    rp_step_decoder_free(&d);
}

/* ---- node 0 and another node over a control link -------------------------- */

typedef struct worker_arg {
    rp_runner *r;
    int rc;
    rp_err err;
    atomic_int done;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *w = p;
    w->rc = rp_engine_worker_run(w->r, &w->err);
    atomic_store(&w->done, 1);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The path of several nodes on the CPU: node 0's tensor-parallel backend
 * with a control link (a socketpair) sends every call as a step message;
 * the other node (here a whole group of its own, since local ranks cannot
 * span processes) runs them in rp_engine_worker_run and ends on node 0's
 * stop. It drew the same tokens and read the same logits as node 0. */
static void test_worker_link(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    rp_tp_plan plan;
    assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, 2, &err), 0);
    rp_model *shards[2];
    for (int i = 0; i < 2; i++) assert_non_null(shards[i] = rp_tp_model_slice(m, &plan, i, &err));
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    /* the other node: the runner the same options make */
    rp_runner_config rc = {.model = m, .device = "cpu", .threads = 1, .page_size = 16, .num_pages = 8, .max_seqs = 2,
                           .max_context = 64, .max_batched_tokens = 64, .max_logit_rows = 4, .tensor_parallel_size = 2};
    rp_runner *r1 = rp_runner_new(&rc, &err);
    if (!r1) fail_msg("%s", err.msg);
    r1->link = sv[1];
    worker_arg w = {.r = r1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, worker_main, &w), 0);
    /* node 0 */
    rp_backend_config bc = {.num_pages = 8, .page_size = 16, .max_batched_tokens = 64, .max_batch_seqs = 2,
                            .max_logit_rows = 4, .num_threads = 2};
    const int links[1] = {sv[0]};
    rp_tp_backend_config tc = {.device = "cpu", .plan = &plan, .shards = shards, .ranks = 2, .links = links,
                               .num_links = 1};
    rp_backend *b = rp_backend_tp_new(m, &tc, &bc, &err);
    if (!b) fail_msg("%s", err.msg);
    /* one sequence: a prompt of 5 in pages 3 and 6, then 3 decode steps fed
     * the previous step's token by reference */
    const int32_t prompt[5] = {11, 22, 33, 44, 55}, table[4] = {3, 6, 0, 0};
    int32_t pos[5], slots[5], start[2] = {0, 5}, kv[1] = {5}, row[1] = {0}, lt[1] = {4};
    for (int t = 0; t < 5; t++) pos[t] = t, slots[t] = 3 * 16 + t;
    rp_sampling_params sp = {.temperature = 0.8f, .top_p = 0.9f, .top_k = -1, .seed = 99, .step = 0,
                             .repetition_penalty = 1.0f};
    rp_batch bt = {.num_seqs = 1, .num_tokens = 5, .tokens = prompt, .positions = pos, .seq_start = start,
                   .seq_kv_len = kv, .seq_page_row = row, .page_table = table, .page_table_stride = 4,
                   .slot_mapping = slots, .num_logits = 1, .logit_token = lt, .sample = &sp};
    int32_t toks[4];
    if (rp_backend_forward(b, &bt, &err) || b->ops->read_tokens(b, &toks[0], NULL, NULL, &err)) fail_msg("%s", err.msg);
    for (int k = 1; k < 4; k++) {
        const int32_t ref[1] = {-1}, dpos[1] = {4 + k}, dslot[1] = {3 * 16 + 4 + k}, dstart[2] = {0, 1},
                      dkv[1] = {5 + k}, dlt[1] = {0};
        sp.step = (uint64_t)k;
        rp_batch d = {.num_seqs = 1, .num_tokens = 1, .tokens = k == 1 ? &toks[0] : ref, .positions = dpos,
                      .seq_start = dstart, .seq_kv_len = dkv, .seq_page_row = row, .page_table = table,
                      .page_table_stride = 4, .slot_mapping = dslot, .num_logits = 1, .logit_token = dlt,
                      .sample = &sp};
        if (rp_backend_forward(b, &d, &err) || b->ops->read_tokens(b, &toks[k], NULL, NULL, &err))
            fail_msg("step %d: %s", k, err.msg);
    }
    /* the last step once more without sampling, its logits read */
    const int32_t again[1] = {toks[3]}, dpos[1] = {8}, dslot[1] = {3 * 16 + 8}, dstart[2] = {0, 1}, dkv[1] = {9},
                  dlt[1] = {0};
    rp_batch d = {.num_seqs = 1, .num_tokens = 1, .tokens = again, .positions = dpos, .seq_start = dstart,
                  .seq_kv_len = dkv, .seq_page_row = row, .page_table = table, .page_table_stride = 4,
                  .slot_mapping = dslot, .num_logits = 1, .logit_token = dlt};
    float *logits = malloc((size_t)m->cfg.vocab_size * 4);
    if (rp_backend_forward(b, &d, &err) || rp_backend_read_logits(b, logits, &err)) fail_msg("%s", err.msg);
    rp_backend_destroy(b); /* sends the stop */
    pthread_join(th, NULL);
    if (w.rc) fail_msg("worker: %s", w.err.msg);
    /* the worker's last reads: the same token and logits */
    assert_int_equal(r1->tokens[0], toks[3]);
    assert_memory_equal(r1->logits, logits, (size_t)m->cfg.vocab_size * 4);
    /* node 0 gone without a stop: the worker says so */
    int sv2[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv2), 0);
    close(r1->link);
    r1->link = sv2[1];
    close(sv2[0]);
    assert_int_not_equal(rp_engine_worker_run(r1, &err), 0);
    assert_non_null(strstr(err.msg, "node 0"));
    close(sv[0]);
    rp_runner_free(r1);
    free(logits);
    for (int i = 0; i < 2; i++) rp_model_free(shards[i]);
    rp_model_free(m);
}

/* ---- faults ---------------------------------------------------------------- */

/* A prompt of 5 tokens in page 3, sampled greedily. */
typedef struct one_step {
    int32_t prompt[5], pos[5], slots[5], start[2], kv[1], row[1], lt[1], table[4];
    rp_sampling_params sp;
    rp_batch bt;
} one_step;

static void one_step_init(one_step *o) {
    *o = (one_step){.prompt = {11, 22, 33, 44, 55}, .start = {0, 5}, .kv = {5}, .lt = {4}, .table = {3, 0, 0, 0},
                    .sp = {.top_k = -1, .repetition_penalty = 1.0f}};
    for (int t = 0; t < 5; t++) o->pos[t] = t, o->slots[t] = 3 * 16 + t;
    o->bt = (rp_batch){.num_seqs = 1, .num_tokens = 5, .tokens = o->prompt, .positions = o->pos,
                       .seq_start = o->start, .seq_kv_len = o->kv, .seq_page_row = o->row, .page_table = o->table,
                       .page_table_stride = 4, .slot_mapping = o->slots, .num_logits = 1, .logit_token = o->lt,
                       .sample = &o->sp};
}

/* Rank 1 of the group, played on a thread of the test: its backend on its
 * shard, one forward (the first step), then it stops coming. */
typedef struct rank1 {
    rp_model *shard;
    const rp_tp_plan *plan;
    rp_comm_local_group *group;
    rp_backend_config bc;
    rp_comm *comm;
    rp_backend *be;
    int rc;
    rp_err err;
} rank1;

static void *rank1_main(void *p) {
    rank1 *a = p;
    rp_backend_config c = a->bc;
    a->comm = rp_comm_local_new(a->group, 1, &a->err);
    c.tp = (rp_backend_tp){.size = 2, .rank = 1, .comm = a->comm, .plan = a->plan};
    a->be = a->comm ? rp_backend_cpu_new(a->shard, &c, &a->err) : NULL;
    one_step o;
    one_step_init(&o);
    a->rc = !a->be || rp_backend_forward(a->be, &o.bt, &a->err);
    return NULL;
}

/* A rank that stops coming (a node gone, a collective that never meets):
 * node 0's watchdog fails the step within its timeout with a message that
 * says so, tells the other node why (an abort, then the link shut) and
 * refuses every later call; nothing hangs. */
static void test_watchdog_stalled_rank(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    rp_tp_plan plan;
    assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, 2, &err), 0);
    rp_model *shards[2];
    for (int i = 0; i < 2; i++) assert_non_null(shards[i] = rp_tp_model_slice(m, &plan, i, &err));
    rp_comm_local_group *group = rp_comm_local_group_new(2, &err);
    assert_non_null(group);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    rp_backend_config bc = {.num_pages = 8, .page_size = 16, .max_batched_tokens = 64, .max_batch_seqs = 2,
                            .max_logit_rows = 4, .num_threads = 1};
    rank1 a = {.shard = shards[1], .plan = &plan, .group = group, .bc = bc};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, rank1_main, &a), 0);
    const int links[1] = {sv[0]};
    rp_tp_backend_config tc = {.device = "cpu", .plan = &plan, .shards = shards, .ranks = 1, .links = links,
                               .num_links = 1, .step_timeout_ms = 300, .local_group = group};
    rp_backend *b = rp_backend_tp_new(m, &tc, &bc, &err);
    if (!b) fail_msg("%s", err.msg);
    one_step o;
    one_step_init(&o);
    int32_t tok;
    if (rp_backend_forward(b, &o.bt, &err)) fail_msg("first step: %s", err.msg);
    pthread_join(th, NULL);
    if (a.rc) fail_msg("rank 1: %s", a.err.msg);
    assert_int_equal(b->ops->read_tokens(b, &tok, NULL, NULL, &err), 0);
    /* the second step: rank 1 never comes */
    const double t0 = now_s();
    assert_int_not_equal(rp_backend_forward(b, &o.bt, &err), 0);
    const double waited = now_s() - t0;
    assert_true(waited >= 0.25 && waited < 5.0);
    assert_non_null(strstr(err.msg, "forward did not finish within 0.3 s"));
    assert_int_not_equal(b->ops->read_tokens(b, &tok, NULL, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "failed earlier"));
    /* what node 1 heard: the steps (pings between them), then the abort
     * with the reason, then the link's end */
    rp_step_decoder d;
    assert_int_equal(rp_step_decoder_init(&d, 64, 2, 4, 8, m->cfg.vocab_size, &err), 0);
    uint8_t *msg = malloc(1 << 16);
    int forwards = 0, aborted = 0;
    for (;;) {
        size_t n = 0;
        if (rp_bs_recv_msg(sv[1], msg, 1 << 16, &n, 1000, &err)) break;
        rp_step_op op;
        int arg;
        rp_batch got;
        if (rp_step_msg_decode(&d, msg, n, &op, &arg, &got, &err)) fail_msg("%s", err.msg);
        forwards += op == RP_STEP_FORWARD;
        if (op == RP_STEP_ABORT) {
            aborted = 1;
            assert_non_null(strstr(d.reason, "did not finish"));
        }
    }
    assert_non_null(strstr(err.msg, "closed"));
    assert_int_equal(forwards, 2);
    assert_true(aborted);
    rp_backend_destroy(b); /* no shutdown after the abort, no hang */
    rp_backend_destroy(a.be);
    rp_comm_free(a.comm);
    rp_comm_local_group_free(group);
    rp_step_decoder_free(&d);
    free(msg);
    close(sv[0]);
    close(sv[1]);
    for (int i = 0; i < 2; i++) rp_model_free(shards[i]);
    rp_model_free(m);
}

/* Another node's backend (a link to node 0, watched during a call): node 0
 * gone while this node's step waits for node 0's ranks fails the step
 * within the link-closed grace (5 s), long before the step timeout. */
static void test_node0_gone_during_call(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    rp_tp_plan plan;
    assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, 2, &err), 0);
    rp_model *shards[2];
    for (int i = 0; i < 2; i++) assert_non_null(shards[i] = rp_tp_model_slice(m, &plan, i, &err));
    rp_comm_local_group *group = rp_comm_local_group_new(2, &err);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    rp_backend_config bc = {.num_pages = 8, .page_size = 16, .max_batched_tokens = 64, .max_batch_seqs = 2,
                            .max_logit_rows = 4, .num_threads = 1};
    /* "node 0" is rank 1 here, played by the test; this backend runs rank 0 */
    rank1 a = {.shard = shards[1], .plan = &plan, .group = group, .bc = bc};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, rank1_main, &a), 0);
    const int link = sv[1];
    rp_tp_backend_config tc = {.device = "cpu", .plan = &plan, .shards = shards, .ranks = 1, .node0_link = &link,
                               .step_timeout_ms = 60000, .local_group = group};
    rp_backend *b = rp_backend_tp_new(m, &tc, &bc, &err);
    if (!b) fail_msg("%s", err.msg);
    one_step o;
    one_step_init(&o);
    if (rp_backend_forward(b, &o.bt, &err)) fail_msg("first step: %s", err.msg);
    pthread_join(th, NULL);
    if (a.rc) fail_msg("rank 1: %s", a.err.msg);
    close(sv[0]); /* node 0 is gone, and will not come to the next step */
    const double t0 = now_s();
    assert_int_not_equal(rp_backend_forward(b, &o.bt, &err), 0);
    const double waited = now_s() - t0;
    assert_true(waited >= 4.5 && waited < 15);
    assert_non_null(strstr(err.msg, "node 0 closed its link during the forward"));
    rp_backend_destroy(b);
    rp_backend_destroy(a.be);
    rp_comm_free(a.comm);
    rp_comm_local_group_free(group);
    close(sv[1]);
    for (int i = 0; i < 2; i++) rp_model_free(shards[i]);
    rp_model_free(m);
}

/* The other nodes' worker loop and node 0's ends: an idle node 0 pings,
 * so a worker with a short timeout stays; node 0's shutdown ends it with
 * success; node 0's abort ends it with node 0's reason; a silent link
 * ends it within the timeout; a closed one at once. */
static void test_worker_faults(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    rp_tp_plan plan;
    assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, 2, &err), 0);
    rp_model *shards[2];
    for (int i = 0; i < 2; i++) assert_non_null(shards[i] = rp_tp_model_slice(m, &plan, i, &err));
    rp_runner_config rc = {.model = m, .device = "cpu", .threads = 1, .page_size = 16, .num_pages = 8, .max_seqs = 2,
                           .max_context = 64, .max_batched_tokens = 64, .max_logit_rows = 4, .tensor_parallel_size = 2,
                           .dist_timeout_ms = 400};
    rp_runner *r1 = rp_runner_new(&rc, &err);
    if (!r1) fail_msg("%s", err.msg);
    assert_int_equal(r1->dist_timeout_ms, 400);

    /* idle node 0 (timeout 400 ms: a ping every 100 ms), then its shutdown */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    r1->link = sv[1];
    worker_arg w = {.r = r1};
    atomic_init(&w.done, 0);
    rp_backend_config bc = {.num_pages = 8, .page_size = 16, .max_batched_tokens = 64, .max_batch_seqs = 2,
                            .max_logit_rows = 4, .num_threads = 2};
    const int links[1] = {sv[0]};
    rp_tp_backend_config tc = {.device = "cpu", .plan = &plan, .shards = shards, .ranks = 2, .links = links,
                               .num_links = 1, .step_timeout_ms = 400};
    rp_backend *b = rp_backend_tp_new(m, &tc, &bc, &err);
    if (!b) fail_msg("%s", err.msg);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, worker_main, &w), 0);
    struct timespec idle = {1, 200000000};
    nanosleep(&idle, NULL);
    assert_int_equal(atomic_load(&w.done), 0); /* three timeouts passed: the pings kept it */
    one_step o;
    one_step_init(&o);
    int32_t tok;
    if (rp_backend_forward(b, &o.bt, &err) || b->ops->read_tokens(b, &tok, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    rp_backend_destroy(b);
    pthread_join(th, NULL);
    if (w.rc) fail_msg("worker after a shutdown: %s", w.err.msg);
    assert_int_equal(r1->tokens[0], tok);
    close(sv[0]);
    close(sv[1]);

    /* node 0's abort: its reason */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    r1->link = sv[1];
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    assert_int_equal(rp_step_msg_encode_abort("tensor-parallel rank 0: out of memory", &buf, &cap, &len, &err), 0);
    assert_int_equal(rp_bs_send_msg(sv[0], buf, len, 1000, &err), 0);
    assert_int_not_equal(rp_engine_worker_run(r1, &err), 0);
    assert_non_null(strstr(err.msg, "node 0 failed: tensor-parallel rank 0: out of memory"));
    close(sv[0]);
    close(sv[1]);

    /* silence: an error once the timeout passed, not before */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    r1->link = sv[1];
    double t0 = now_s();
    assert_int_not_equal(rp_engine_worker_run(r1, &err), 0);
    const double waited = now_s() - t0;
    assert_true(waited >= 0.35 && waited < 3.0);
    assert_non_null(strstr(err.msg, "node 0 sent nothing for 0.4 s"));
    /* a link closed without a shutdown: at once */
    close(sv[0]);
    t0 = now_s();
    assert_int_not_equal(rp_engine_worker_run(r1, &err), 0);
    assert_true(now_s() - t0 < 0.3);
    assert_non_null(strstr(err.msg, "without a shutdown"));
    close(sv[1]);
    r1->link = -1;
    free(buf);
    rp_runner_free(r1);
    for (int i = 0; i < 2; i++) rp_model_free(shards[i]);
    rp_model_free(m);
}

/* Greedy rows without top logprobs take the distributed argmax (each
 * rank's best, gathered): the token and logprob of one rank's whole
 * logits, at N = 2, 4 and 8 (ranks without real vocabulary rows too);
 * the logits of such a step were not gathered, and reading them says so. */
static void test_distributed_argmax(void **state) {
    (void)state;
    rp_err err = {0};
    rp_model *m = test_model("tiny-qwen3", 8, 2, 256);
    rp_backend_config bc = {.num_pages = 8, .page_size = 16, .max_batched_tokens = 64, .max_batch_seqs = 2,
                            .max_logit_rows = 4, .num_threads = 2};
    one_step o;
    one_step_init(&o);
    o.sp.top_logprobs = 0;
    rp_backend *one = rp_backend_cpu_new(m, &bc, &err);
    if (!one) fail_msg("%s", err.msg);
    int32_t ref_tok;
    float ref_lp;
    if (rp_backend_forward(one, &o.bt, &err) || one->ops->read_tokens(one, &ref_tok, &ref_lp, NULL, &err))
        fail_msg("%s", err.msg);
    rp_backend_destroy(one);
    const int sizes[3] = {2, 4, 8};
    for (int k = 0; k < 3; k++) {
        const int N = sizes[k];
        rp_tp_plan plan;
        assert_int_equal(rp_tp_plan_make(&plan, &m->cfg, N, &err), 0);
        rp_model *shards[8];
        for (int i = 0; i < N; i++) assert_non_null(shards[i] = rp_tp_model_slice(m, &plan, i, &err));
        rp_tp_backend_config tc = {.device = "cpu", .plan = &plan, .shards = shards, .ranks = N};
        rp_backend *b = rp_backend_tp_new(m, &tc, &bc, &err);
        if (!b) fail_msg("N=%d: %s", N, err.msg);
        int32_t tok;
        float lp;
        if (rp_backend_forward(b, &o.bt, &err) || b->ops->read_tokens(b, &tok, &lp, NULL, &err))
            fail_msg("N=%d: %s", N, err.msg);
        assert_int_equal(tok, ref_tok);
        if (fabsf(lp - ref_lp) > 1e-5f) fail_msg("N=%d: logprob %g, one rank %g", N, lp, ref_lp);
        float *logits = malloc((size_t)m->cfg.vocab_size * 4);
        assert_int_not_equal(rp_backend_read_logits(b, logits, &err), 0);
        assert_non_null(strstr(err.msg, "not gathered"));
        free(logits);
        rp_backend_destroy(b);
        for (int i = 0; i < N; i++) rp_model_free(shards[i]);
    }
    rp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3_sizes),      cmocka_unit_test(test_llama3_and_qwen2),
                                       cmocka_unit_test(test_checkpoint), cmocka_unit_test(test_fp8), cmocka_unit_test(test_quantize_fp8),       cmocka_unit_test(test_sampled_decode),
                                       cmocka_unit_test(test_refusals),         cmocka_unit_test(test_step_msg),
                                       cmocka_unit_test(test_worker_link),      cmocka_unit_test(test_lazy_dummy_shards),
                                       cmocka_unit_test(test_watchdog_stalled_rank),
                                       cmocka_unit_test(test_node0_gone_during_call),
                                       cmocka_unit_test(test_worker_faults),
                                       cmocka_unit_test(test_distributed_argmax)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
