/* The CPU backend against transformers: logits at every prompt position
 * (relative L2 < 1e-3) and 32 greedy tokens, for each committed fixture
 * model (tools/make_fixtures.py), each prompt alone and all batched together
 * with different lengths, across page sizes and prefill chunk sizes: the
 * logits through the runner, the greedy tokens through the engine. */
#include <jansson.h>
#include <math.h>

#include "backend/backend.h"
#include "engine/runner.h"
#include "replay/engine.h"
#include "model/model.h"
#include "model/rope.h"
#include "test_util.h"

#define MAX_PROMPTS 8
#define GREEDY 32

static const char *models[] = {"qwen3-tied",  "qwen3-gqa6",   "llama3-scaled", "llama3-tied",
                               "qwen3-hd128", "llama3-hd64",  "qwen2-bias",    "qwen2-hd128",
                               "mistral-hd24", "qwen3-yarn", "llama3-linear"};

typedef struct fixture {
    rp_model *model;
    int num_prompts;
    int32_t *prompts[MAX_PROMPTS];
    int prompt_len[MAX_PROMPTS];
    int32_t greedy[MAX_PROMPTS][GREEDY];
    float *logits[MAX_PROMPTS]; /* [len][vocab] */
    float *blob;
} fixture;

/* replay's RoPE table against the one transformers built for the fixture,
 * where reference.json records it (fixtures made since issue 39). */
static void check_rope_table(const rp_model *m, json_t *ref, const char *name) {
    json_t *tf = json_object_get(ref, "rope_inv_freq");
    if (!tf) return;
    const int half = m->cfg.head_dim / 2;
    assert_int_equal(json_array_size(tf), half);
    float inv_freq[256];
    rp_rope_inv_freq(&m->cfg, inv_freq);
    for (int i = 0; i < half; i++) {
        double want = json_number_value(json_array_get(tf, (size_t)i));
        if (fabs(inv_freq[i] - want) > 1e-6 * fabs(want))
            fail_msg("%s: inv_freq[%d] %.9g, transformers %.9g", name, i, inv_freq[i], want);
    }
    double scale = json_number_value(json_object_get(ref, "rope_attention_scaling"));
    if (fabs(rp_rope_attention_scale(&m->cfg) - scale) > 1e-6)
        fail_msg("%s: attention scale %.9g, transformers %.9g", name, rp_rope_attention_scale(&m->cfg), scale);
}

static void load_fixture(fixture *fx, const char *name) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", test_source_dir(), name);
    memset(fx, 0, sizeof *fx);
    rp_err err;
    rp_load_options lo = {0};
    fx->model = rp_model_load(dir, &lo, &err);
    if (!fx->model) fail_msg("load %s: %s", name, err.msg);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    assert_non_null(ref);
    json_t *prompts = json_object_get(ref, "prompts"), *greedy = json_object_get(ref, "greedy");
    int vocab = (int)json_integer_value(json_object_get(ref, "vocab_size"));
    assert_int_equal(vocab, fx->model->cfg.vocab_size);
    fx->num_prompts = (int)json_array_size(prompts);
    assert_true(fx->num_prompts > 0 && fx->num_prompts <= MAX_PROMPTS);
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    size_t blob_len;
    fx->blob = test_read_file(path, &blob_len);
    size_t off = 0;
    for (int p = 0; p < fx->num_prompts; p++) {
        json_t *pa = json_array_get(prompts, (size_t)p), *ga = json_array_get(greedy, (size_t)p);
        fx->prompt_len[p] = (int)json_array_size(pa);
        fx->prompts[p] = malloc((size_t)fx->prompt_len[p] * sizeof(int32_t));
        for (int i = 0; i < fx->prompt_len[p]; i++)
            fx->prompts[p][i] = (int32_t)json_integer_value(json_array_get(pa, (size_t)i));
        assert_int_equal(json_array_size(ga), GREEDY);
        for (int i = 0; i < GREEDY; i++) fx->greedy[p][i] = (int32_t)json_integer_value(json_array_get(ga, (size_t)i));
        fx->logits[p] = fx->blob + off;
        off += (size_t)fx->prompt_len[p] * vocab;
    }
    assert_int_equal(off * sizeof(float), blob_len);
    check_rope_table(fx->model, ref, name);
    json_decref(ref);
}

static void free_fixture(fixture *fx) {
    for (int p = 0; p < fx->num_prompts; p++) free(fx->prompts[p]);
    free(fx->blob);
    rp_model_free(fx->model);
}


typedef struct greedy_out {
    int32_t tokens[GREEDY];
    int n;
    rp_finish finish;
} greedy_out;

static void collect(void *user, const rp_token_event *ev) {
    greedy_out *o = user;
    if (ev->token >= 0 && o->n < GREEDY) o->tokens[o->n++] = ev->token;
    if (ev->finish != RP_FINISH_REASON_NONE) o->finish = ev->finish;
}

/* Runs the given prompts of a fixture together and checks each against the
 * reference: the logits at every prompt position through the runner, the
 * greedy continuation through the engine (continuous batching). page_size
 * and max_batched_tokens vary the paging and chunking. */
static void run_and_check(fixture *fx, const char *name, const int *which, int n, int page_size,
                          int max_batched_tokens) {
    const int vocab = fx->model->cfg.vocab_size;
    int total = 0, max_len = 0;
    for (int i = 0; i < n; i++) {
        int len = fx->prompt_len[which[i]] + GREEDY;
        total += (len + page_size - 1) / page_size;
        if (len > max_len) max_len = len;
    }
    rp_err err;
    rp_runner_config rc = {.model = fx->model, .device = "cpu", .threads = 2, .page_size = page_size,
                           .num_pages = total, .max_seqs = n, .max_context = max_len,
                           .max_batched_tokens = max_batched_tokens, .max_logit_rows = max_batched_tokens};
    rp_runner *run = rp_runner_new(&rc, &err);
    if (!run) fail_msg("runner: %s", err.msg);
    const int32_t *prompts[MAX_PROMPTS];
    int lens[MAX_PROMPTS];
    float *logits[MAX_PROMPTS];
    for (int i = 0; i < n; i++) {
        int p = which[i];
        prompts[i] = fx->prompts[p];
        lens[i] = fx->prompt_len[p];
        logits[i] = malloc((size_t)lens[i] * vocab * sizeof(float));
        for (size_t k = 0; k < (size_t)lens[i] * vocab; k++) logits[i][k] = NAN; /* poison */
    }
    if (rp_runner_run_prompts(run, n, prompts, lens, logits, 0, NULL, &err)) fail_msg("prompt logits: %s", err.msg);
    for (int i = 0; i < n; i++) {
        int p = which[i];
        for (int pos = 0; pos < lens[i]; pos++) {
            double e = test_rel_l2(logits[i] + (size_t)pos * vocab, fx->logits[p] + (size_t)pos * vocab, (size_t)vocab);
            if (!(e < 1e-3))
                fail_msg("prompt %d position %d: relative L2 error %.3g (page %d, chunk %d)", p, pos, e, page_size,
                         max_batched_tokens);
        }
        free(logits[i]);
    }
    assert_int_equal(rp_page_pool_num_free(run->pool), total); /* every page came back */
    rp_runner_free(run);

    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", test_source_dir(), name);
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    ec.model_dir = dir;
    ec.device = "cpu";
    ec.threads = 2;
    ec.page_size = page_size;
    ec.num_pages = total;
    ec.max_running_requests = n;
    ec.max_batched_tokens = max_batched_tokens;
    ec.chunked_prefill_size = max_batched_tokens;
    ec.quiet_model_warning = 1;
    rp_error eerr;
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) fail_msg("engine: %s", eerr.message);
    greedy_out outs[MAX_PROMPTS] = {0};
    for (int i = 0; i < n; i++) {
        rp_request_params rq;
        rp_request_params_default(&rq);
        rq.prompt_ids = prompts[i];
        rq.num_prompt_ids = lens[i];
        rq.max_tokens = GREEDY;
        rq.ignore_eos = 1;
        rq.temperature = 0;
        if (rp_engine_submit(eng, &rq, collect, &outs[i], NULL, &eerr)) fail_msg("submit: %s", eerr.message);
    }
    rp_engine_wait_idle(eng);
    rp_engine_stats st;
    rp_engine_get_stats(eng, &st);
    assert_int_equal(st.kv_pages_free, total); /* every page came back */
    rp_engine_destroy(eng);
    for (int i = 0; i < n; i++) {
        int p = which[i];
        assert_int_equal(outs[i].finish, RP_FINISH_REASON_LENGTH);
        assert_int_equal(outs[i].n, GREEDY);
        for (int k = 0; k < GREEDY; k++)
            if (outs[i].tokens[k] != fx->greedy[p][k])
                fail_msg("prompt %d: greedy token %d is %d, transformers says %d (page %d, chunk %d)", p, k,
                         outs[i].tokens[k], fx->greedy[p][k], page_size, max_batched_tokens);
    }
}

static void test_model(void **state) {
    const char *name = *state;
    fixture fx;
    load_fixture(&fx, name);
    /* each prompt alone */
    for (int p = 0; p < fx.num_prompts; p++) run_and_check(&fx, name, &p, 1, 16, 256);
    /* all together, different lengths, several paging and chunking setups */
    int all[MAX_PROMPTS];
    for (int p = 0; p < fx.num_prompts; p++) all[p] = fx.num_prompts - 1 - p;
    run_and_check(&fx, name, all, fx.num_prompts, 16, 256);
    run_and_check(&fx, name, all, fx.num_prompts, 1, 256);
    run_and_check(&fx, name, all, fx.num_prompts, 7, 13); /* chunked prefill mixed with decode */
    free_fixture(&fx);
}

/* ---- the forward written out by hand ----------------------------------- */

static double wv(const rp_weight *w, int64_t i) { return rp_bf16_to_f32(w->data[i]); }

/* out[n] = sum_k W[n][k] x[k] (+ bias[n]) */
static void ref_matvec(double *out, const rp_weight *w, const rp_weight *bias, const double *x) {
    for (int64_t n = 0; n < w->rows; n++) {
        double acc = bias && bias->data ? wv(bias, n) : 0;
        for (int64_t k = 0; k < w->cols; k++) acc += wv(w, n * w->cols + k) * x[k];
        out[n] = acc;
    }
}

static void ref_rmsnorm(double *out, const double *x, const rp_weight *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = wv(w, i) * x[i] * r;
}

/* transformers' decoder layer stack for one sequence, in double, straight
 * from the modeling code: q/k/v with their biases, rotate_half RoPE with cos
 * and sin times the attention scale, causal GQA, SwiGLU; logits[T][V]. */
static void ref_forward(const rp_model *m, const int32_t *tok, int T, double *logits) {
    const rp_model_config *c = &m->cfg;
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_heads, nkv = c->num_kv_heads, F = c->intermediate_size;
    const int qd = nh * hd, kvd = nkv * hd, half = hd / 2;
    float inv_freq[256];
    rp_rope_inv_freq(c, inv_freq);
    const double scale = rp_rope_attention_scale(c);
    double *x = calloc((size_t)T * H, sizeof *x), *xn = malloc((size_t)H * sizeof *xn);
    double *q = malloc((size_t)T * qd * sizeof *q), *k = malloc((size_t)T * kvd * sizeof *k);
    double *v = malloc((size_t)T * kvd * sizeof *v), *att = malloc((size_t)qd * sizeof *att);
    double *o = malloc((size_t)H * sizeof *o), *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
    double *sc = malloc((size_t)T * sizeof *sc);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < H; i++) x[(size_t)t * H + i] = wv(rp_model_weight(m, RP_W_EMBED, 0), (int64_t)tok[t] * H + i);
    for (int l = 0; l < c->num_layers; l++) {
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(xn, x + (size_t)t * H, rp_model_weight(m, RP_W_ATTN_NORM, l), H, c->rms_norm_eps);
            ref_matvec(q + (size_t)t * qd, rp_model_weight(m, RP_W_Q, l), rp_model_weight(m, RP_W_Q_BIAS, l), xn);
            ref_matvec(k + (size_t)t * kvd, rp_model_weight(m, RP_W_K, l), rp_model_weight(m, RP_W_K_BIAS, l), xn);
            ref_matvec(v + (size_t)t * kvd, rp_model_weight(m, RP_W_V, l), rp_model_weight(m, RP_W_V_BIAS, l), xn);
            for (int h = 0; h < nh + nkv; h++) {
                double *e = h < nh ? q + (size_t)t * qd + h * hd : k + (size_t)t * kvd + (h - nh) * hd;
                for (int i = 0; i < half; i++) {
                    double ang = (float)t * inv_freq[i], cs = cos(ang) * scale, sn = sin(ang) * scale;
                    double a = e[i], b = e[i + half];
                    e[i] = a * cs - b * sn;
                    e[i + half] = b * cs + a * sn;
                }
            }
        }
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                const int kvh = h / (nh / nkv);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += q[(size_t)t * qd + h * hd + i] * k[(size_t)j * kvd + kvh * hd + i];
                    sc[j] = d / sqrt((double)hd);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += sc[j] / sum * v[(size_t)j * kvd + kvh * hd + i];
                    att[h * hd + i] = acc;
                }
            }
            double *xt = x + (size_t)t * H;
            ref_matvec(o, rp_model_weight(m, RP_W_O, l), NULL, att);
            for (int i = 0; i < H; i++) xt[i] += o[i];
            ref_rmsnorm(xn, xt, rp_model_weight(m, RP_W_MLP_NORM, l), H, c->rms_norm_eps);
            ref_matvec(g, rp_model_weight(m, RP_W_GATE, l), NULL, xn);
            ref_matvec(u, rp_model_weight(m, RP_W_UP, l), NULL, xn);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            ref_matvec(o, rp_model_weight(m, RP_W_DOWN, l), NULL, g);
            for (int i = 0; i < H; i++) xt[i] += o[i];
        }
    }
    for (int t = 0; t < T; t++) {
        ref_rmsnorm(xn, x + (size_t)t * H, rp_model_weight(m, RP_W_FINAL_NORM, 0), H, c->rms_norm_eps);
        ref_matvec(logits + (size_t)t * c->vocab_size, rp_model_weight(m, RP_W_LM_HEAD, 0), NULL, xn);
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}

/* The runner's logits at every position of one prompt. */
static void backend_logits(rp_model *m, const int32_t *tok, int T, float *logits) {
    rp_err err;
    rp_runner_config rc = {.model = m, .device = "cpu", .threads = 2, .page_size = 4, .num_pages = (T + 3) / 4,
                           .max_seqs = 1, .max_context = T, .max_batched_tokens = 8, .max_logit_rows = 8};
    rp_runner *run = rp_runner_new(&rc, &err);
    if (!run) fail_msg("runner: %s", err.msg);
    const int32_t *prompts[1] = {tok};
    float *out[1] = {logits};
    if (rp_runner_run_prompts(run, 1, prompts, &T, out, 0, NULL, &err)) fail_msg("prompt logits: %s", err.msg);
    rp_runner_free(run);
}

/* The CPU backend against that hand-written forward on a Qwen2-shaped model
 * (q/k/v biases) with yarn RoPE (frequencies and a cos/sin scale of 1.139)
 * and on a Mistral-shaped one with linear RoPE, until transformers' fixtures
 * for them are committed. The biases are made large, and the test shows
 * they matter: without them the logits are far off. */
static void test_families_by_hand(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_preset(&c, "tiny-qwen2", &err), 0);
    c.rope.type = RP_ROPE_YARN;
    c.rope.factor = 4;
    c.rope.original_max_position_embeddings = 8; /* the ramp lands inside head_dim 16 */
    c.rope.theta = 100;
    rp_load_options lo = {.seed = 5};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    assert_non_null(m);
    for (int l = 0; l < c.num_layers; l++)
        for (int kind = RP_W_Q_BIAS; kind <= RP_W_V_BIAS; kind++) {
            const rp_weight *b = rp_model_weight(m, (rp_weight_kind)kind, l);
            assert_non_null(b->data);
            uint16_t *d = (uint16_t *)b->data; /* the dummy model's own buffer */
            for (int64_t i = 0; i < b->rows; i++) d[i] = rp_f32_to_bf16(0.8f * sinf((float)(i * 7 + kind * 3 + l)));
        }
    enum { T = 19 };
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (t * 131 + 7) % c.vocab_size;
    const size_t V = (size_t)c.vocab_size;
    float *got = malloc(T * V * sizeof *got), *want = malloc(T * V * sizeof *want);
    double *ref = malloc(T * V * sizeof *ref);
    backend_logits(m, tok, T, got);
    ref_forward(m, tok, T, ref);
    for (size_t i = 0; i < T * V; i++) want[i] = (float)ref[i];
    double e = test_rel_l2(got, want, T * V);
    printf("  qwen2 shape, yarn: CPU backend vs the forward by hand: relative L2 %.2e\n", e);
    assert_true(e < 1e-5);
    /* the same without biases is far from it: the comparison sees them */
    for (int l = 0; l < c.num_layers; l++)
        for (int kind = RP_W_Q_BIAS; kind <= RP_W_V_BIAS; kind++) {
            const rp_weight *b = rp_model_weight(m, (rp_weight_kind)kind, l);
            memset((uint16_t *)b->data, 0, (size_t)b->rows * 2);
        }
    backend_logits(m, tok, T, got);
    e = test_rel_l2(got, want, T * V);
    printf("  the same with the biases zeroed: relative L2 %.2e\n", e);
    assert_true(e > 1e-2);
    /* and yarn's cos/sin scale matters as much: the forward by hand without
     * it (its frequencies kept) is far from the backend's */
    assert_true(rp_rope_attention_scale(&m->cfg) > 1.13f);
    m->cfg.rope.attention_factor = 1.0;
    ref_forward(m, tok, T, ref); /* the biases are zero in both now */
    for (size_t i = 0; i < T * V; i++) want[i] = (float)ref[i];
    e = test_rel_l2(got, want, T * V);
    printf("  the same by hand without the yarn scale: relative L2 %.2e\n", e);
    assert_true(e > 1e-3); /* small weights: near-uniform attention, which the scale barely sharpens */
    rp_model_free(m);

    /* Mistral's layout with linear RoPE: no biases anywhere */
    assert_int_equal(rp_config_preset(&c, "tiny-llama3", &err), 0);
    c.arch = &rp_arch_mistral;
    c.rope.type = RP_ROPE_LINEAR;
    c.rope.factor = 3;
    m = rp_model_dummy_from_config(&c, &lo, &err);
    assert_non_null(m);
    assert_null(rp_model_weight(m, RP_W_Q_BIAS, 0)->data);
    const size_t V2 = (size_t)c.vocab_size;
    backend_logits(m, tok, T, got);
    ref_forward(m, tok, T, ref);
    for (size_t i = 0; i < T * V2; i++) want[i] = (float)ref[i];
    e = test_rel_l2(got, want, T * V2);
    printf("  mistral layout, linear: CPU backend vs the forward by hand: relative L2 %.2e\n", e);
    assert_true(e < 1e-5);
    rp_model_free(m);
    free(got), free(want), free(ref);
}

/* A prefill longer than two steps' token budget: the chunks before the
 * last produce no logits, and each must still be read (bench decode at
 * --ctx 32768 once stopped at "two forwards in flight"). */
static void test_long_prefill_chunks(void **state) {
    (void)state;
    rp_err err;
    rp_runner_config rc = {.dummy_name = "tiny-llama3", .device = "cpu", .threads = 2, .page_size = 16,
                           .num_pages = 16, .max_seqs = 2, .max_context = 128, .max_batched_tokens = 32,
                           .max_logit_rows = 2};
    rp_runner *run = rp_runner_new(&rc, &err);
    if (!run) fail_msg("runner: %s", err.msg);
    rp_runner_seq seqs[2];
    assert_int_equal(rp_runner_seqs_begin(run, seqs, 2, &err), 0);
    double s;
    if (rp_runner_prefill_random(run, seqs, 2, 100, &s, &err)) fail_msg("prefill of 2 x 100 in steps of 32: %s", err.msg);
    assert_int_equal(seqs[0].len, 100);
    assert_int_equal(seqs[1].len, 100);
    rp_runner_seqs_end(run, seqs, 2);
    assert_int_equal(rp_page_pool_num_free(run->pool), 16);
    rp_runner_free(run);
}


int main(void) {
    struct CMUnitTest tests[sizeof models / sizeof models[0] + 2];
    size_t n = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        tests[n++] = (struct CMUnitTest){models[i], test_model, NULL, NULL, (void *)models[i]};
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_long_prefill_chunks);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_families_by_hand);
    return _cmocka_run_group_tests("test_cpu_forward", tests, n, NULL, NULL);
}
