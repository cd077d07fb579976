/* The tensor-parallel split computes the model (src/dist/tp_plan.c,
 * tp_load.c): on small random Qwen3 (q/k norms, tied embeddings) and Qwen2
 * (q/k/v biases) models, a forward pass written out here in plain loops,
 * run as N shards (each with only its slices, loaded by rp_tp_slice_load)
 * whose partial products are summed where NCCL would all-reduce and whose
 * logit shards are put together where it would gather, equals the same
 * loops run unsharded, at N = 1, 2, 4, 8 (4 and 8 replicate the KV heads);
 * and the unsharded loops equal the CPU backend, so what the shards
 * reproduce is the model. A distributed argmax (each rank's best, then the
 * best of those) picks the full vocabulary's argmax. This checks the plan
 * and the collectives' placement, not NCCL. */
#include <math.h>

#include "dist/tp_load.h"
#include "engine/runner.h"
#include "model/model.h"
#include "model/rope.h"
#include "test_util.h"

#define T 7 /* prompt tokens */

/* The weights one rank's matmuls use (the whole model as one "rank"). */
typedef struct rank_w {
    rp_tp_weight q, k, v, o, gate, up, down, qb, kb, vb;
    int nq, nkv; /* heads held */
} rank_w;

/* y[n] = sum_k x[k] W[n][k], accumulated in double. */
static void matvec(float *y, const float *x, const rp_tp_weight *w) {
    for (int64_t n = 0; n < w->rows; n++) {
        double acc = 0;
        for (int64_t k = 0; k < w->cols; k++) acc += (double)x[k] * rp_bf16_to_f32(w->data[n * w->cols + k]);
        y[n] = (float)acc;
    }
}

static void add_bias(float *y, const rp_tp_weight *b) {
    if (!b->data) return;
    for (int64_t i = 0; i < b->rows; i++) y[i] += rp_bf16_to_f32(b->data[i]);
}

static void rmsnorm(float *out, const float *x, const uint16_t *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = rp_bf16_to_f32(w[i]) * (x[i] * r);
}

static void rope(float *v, int hd, int pos, const float *inv_freq, float scale) {
    for (int i = 0; i < hd / 2; i++) {
        const float ang = (float)pos * inv_freq[i], c = cosf(ang) * scale, s = sinf(ang) * scale;
        const float a = v[i], b = v[i + hd / 2];
        v[i] = a * c - b * s;
        v[i + hd / 2] = b * c + a * s;
    }
}

static const rp_tp_weight *view(const rp_model *m, rp_weight_kind kind, int layer, rp_tp_weight *out) {
    const rp_weight *w = rp_model_weight(m, kind, layer);
    *out = (rp_tp_weight){.data = w->data, .rows = w->rows, .cols = w->cols};
    return out;
}

/* Rank r's slice of a model weight, through the loader: the model's bf16
 * weight seen as a checkpoint tensor. */
static void slice(const rp_model *m, const rp_tp_plan *p, rp_weight_kind kind, int layer, int r, rp_tp_weight *out) {
    const rp_weight *w = rp_model_weight(m, kind, layer);
    memset(out, 0, sizeof *out);
    if (!w->data) return;
    rp_st_tensor t = {.dtype = RP_DTYPE_BF16, .ndim = w->cols == 1 ? 1 : 2, .shape = {w->rows, w->cols},
                      .data = w->data, .nbytes = (size_t)(w->rows * w->cols) * 2};
    rp_tp_slice s;
    rp_tp_weight_slice(p, kind, r, &s);
    rp_err err;
    if (rp_tp_slice_load(&s, rp_weight_kind_name(kind), &t, NULL, NULL, out, &err)) fail_msg("%s", err.msg);
}

static void rank_weights(const rp_model *m, const rp_tp_plan *p, int layer, int r, rank_w *rw) {
    memset(rw, 0, sizeof *rw);
    if (!p) {
        view(m, RP_W_Q, layer, &rw->q), view(m, RP_W_K, layer, &rw->k), view(m, RP_W_V, layer, &rw->v);
        view(m, RP_W_O, layer, &rw->o), view(m, RP_W_GATE, layer, &rw->gate), view(m, RP_W_UP, layer, &rw->up);
        view(m, RP_W_DOWN, layer, &rw->down), view(m, RP_W_Q_BIAS, layer, &rw->qb);
        view(m, RP_W_K_BIAS, layer, &rw->kb), view(m, RP_W_V_BIAS, layer, &rw->vb);
        rw->nq = m->cfg.num_heads, rw->nkv = m->cfg.num_kv_heads;
        return;
    }
    slice(m, p, RP_W_Q, layer, r, &rw->q), slice(m, p, RP_W_K, layer, r, &rw->k), slice(m, p, RP_W_V, layer, r, &rw->v);
    slice(m, p, RP_W_O, layer, r, &rw->o), slice(m, p, RP_W_GATE, layer, r, &rw->gate);
    slice(m, p, RP_W_UP, layer, r, &rw->up), slice(m, p, RP_W_DOWN, layer, r, &rw->down);
    slice(m, p, RP_W_Q_BIAS, layer, r, &rw->qb), slice(m, p, RP_W_K_BIAS, layer, r, &rw->kb);
    slice(m, p, RP_W_V_BIAS, layer, r, &rw->vb);
    rw->nq = p->ranks[r].num_q_heads, rw->nkv = p->ranks[r].num_kv_heads;
}

static void release(rank_w *rw) {
    rp_tp_weight *all[] = {&rw->q, &rw->k, &rw->v, &rw->o, &rw->gate, &rw->up, &rw->down, &rw->qb, &rw->kb, &rw->vb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) rp_tp_weight_release(all[i]);
}

/* One rank's attention block over the T tokens: its heads' q, k, v, RoPE,
 * causal attention, and its partial o_proj product, added into out[T][H]
 * (the all-reduce). */
static void attn_block(const rp_model *m, int layer, const rank_w *rw, const float *xn, float *out) {
    const rp_model_config *c = &m->cfg;
    const int hd = c->head_dim, H = c->hidden_size, qd = rw->nq * hd, kd = rw->nkv * hd, group = rw->nq / rw->nkv;
    float inv_freq[128];
    rp_rope_inv_freq(c, inv_freq);
    const float rs = rp_rope_attention_scale(c);
    const rp_weight *qn = rp_model_weight(m, RP_W_Q_NORM, layer), *kn = rp_model_weight(m, RP_W_K_NORM, layer);
    float *q = calloc((size_t)T * qd, 4), *k = calloc((size_t)T * kd, 4), *v = calloc((size_t)T * kd, 4);
    float *att = calloc((size_t)T * qd, 4), *part = calloc((size_t)H, 4);
    for (int t = 0; t < T; t++) {
        matvec(q + t * qd, xn + t * H, &rw->q), add_bias(q + t * qd, &rw->qb);
        matvec(k + t * kd, xn + t * H, &rw->k), add_bias(k + t * kd, &rw->kb);
        matvec(v + t * kd, xn + t * H, &rw->v), add_bias(v + t * kd, &rw->vb);
        for (int h = 0; h < rw->nq; h++) {
            if (qn->data) rmsnorm(q + t * qd + h * hd, q + t * qd + h * hd, qn->data, hd, c->rms_norm_eps);
            rope(q + t * qd + h * hd, hd, t, inv_freq, rs);
        }
        for (int h = 0; h < rw->nkv; h++) {
            if (kn->data) rmsnorm(k + t * kd + h * hd, k + t * kd + h * hd, kn->data, hd, c->rms_norm_eps);
            rope(k + t * kd + h * hd, hd, t, inv_freq, rs);
        }
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < rw->nq; h++) {
            const float *qv = q + t * qd + h * hd;
            double sc[T], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qv[e] * k[j * kd + h / group * hd + e];
                sc[j] = d / sqrt(hd);
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int e = 0; e < hd; e++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += sc[j] / sum * v[j * kd + h / group * hd + e];
                att[t * qd + h * hd + e] = (float)o;
            }
        }
    for (int t = 0; t < T; t++) {
        matvec(part, att + t * qd, &rw->o);
        for (int i = 0; i < H; i++) out[t * H + i] += part[i];
    }
    free(q), free(k), free(v), free(att), free(part);
}

/* One rank's MLP: its gate and up rows, SwiGLU, its partial down product
 * added into out[T][H] (the all-reduce). */
static void mlp_block(const rp_model *m, const rank_w *rw, const float *xn, float *out) {
    const int H = m->cfg.hidden_size, F = (int)rw->gate.rows;
    float *g = calloc((size_t)F, 4), *u = calloc((size_t)F, 4), *part = calloc((size_t)H, 4);
    for (int t = 0; t < T; t++) {
        matvec(g, xn + t * H, &rw->gate);
        matvec(u, xn + t * H, &rw->up);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        matvec(part, g, &rw->down);
        for (int i = 0; i < H; i++) out[t * H + i] += part[i];
    }
    free(g), free(u), free(part);
}

/* The forward over tokens[T]: unsharded when p is NULL, else as p's ranks.
 * logits[T][vocab]; argmax[T] the distributed argmax (sharded) or the
 * plain one. */
static void forward(const rp_model *m, const rp_tp_plan *p, const int32_t *tokens, float *logits, int32_t *argmax) {
    const rp_model_config *c = &m->cfg;
    const int H = c->hidden_size, V = c->vocab_size, ranks = p ? p->size : 1;
    float *x = calloc((size_t)T * H, 4), *xn = calloc((size_t)T * H, 4), *sum = calloc((size_t)T * H, 4);
    /* embedding: each rank contributes the rows its vocabulary shard holds */
    for (int r = 0; r < ranks; r++) {
        rp_tp_weight e;
        if (p) slice(m, p, RP_W_EMBED, 0, r, &e);
        else view(m, RP_W_EMBED, 0, &e);
        const int64_t first = p ? p->ranks[r].vocab_start : 0;
        for (int t = 0; t < T; t++)
            if (tokens[t] >= first && tokens[t] < first + e.rows)
                for (int i = 0; i < H; i++) x[t * H + i] += rp_bf16_to_f32(e.data[(tokens[t] - first) * H + i]);
        rp_tp_weight_release(&e);
    }
    for (int l = 0; l < c->num_layers; l++) {
        for (int t = 0; t < T; t++)
            rmsnorm(xn + t * H, x + t * H, rp_model_weight(m, RP_W_ATTN_NORM, l)->data, H, c->rms_norm_eps);
        memset(sum, 0, (size_t)T * H * 4);
        for (int r = 0; r < ranks; r++) {
            rank_w rw;
            rank_weights(m, p, l, r, &rw);
            attn_block(m, l, &rw, xn, sum);
            release(&rw);
        }
        for (int i = 0; i < T * H; i++) x[i] += sum[i];
        for (int t = 0; t < T; t++)
            rmsnorm(xn + t * H, x + t * H, rp_model_weight(m, RP_W_MLP_NORM, l)->data, H, c->rms_norm_eps);
        memset(sum, 0, (size_t)T * H * 4);
        for (int r = 0; r < ranks; r++) {
            rank_w rw;
            rank_weights(m, p, l, r, &rw);
            mlp_block(m, &rw, xn, sum);
            release(&rw);
        }
        for (int i = 0; i < T * H; i++) x[i] += sum[i];
    }
    for (int t = 0; t < T; t++)
        rmsnorm(xn + t * H, x + t * H, rp_model_weight(m, RP_W_FINAL_NORM, 0)->data, H, c->rms_norm_eps);
    /* lm_head: each rank's logits land at its vocabulary rows (the gather);
     * the argmax: each rank's best (lowest id on ties), then the best of those */
    float best[T];
    for (int t = 0; t < T; t++) best[t] = -INFINITY, argmax[t] = -1;
    for (int r = 0; r < ranks; r++) {
        rp_tp_weight h;
        if (p) slice(m, p, RP_W_LM_HEAD, 0, r, &h);
        else view(m, RP_W_LM_HEAD, 0, &h);
        const int64_t first = p ? p->ranks[r].vocab_start : 0;
        assert_true(h.rows == 0 || first + h.rows <= V);
        float *row = calloc((size_t)(h.rows ? h.rows : 1), 4);
        for (int t = 0; t < T; t++) {
            matvec(row, xn + t * H, &h);
            int64_t local = -1;
            for (int64_t i = 0; i < h.rows; i++) {
                logits[(int64_t)t * V + first + i] = row[i];
                if (local < 0 || row[i] > row[local]) local = i;
            }
            if (local >= 0 && row[local] > best[t]) best[t] = row[local], argmax[t] = (int32_t)(first + local);
        }
        free(row);
        rp_tp_weight_release(&h);
    }
    free(x), free(xn), free(sum);
}

static rp_model *small_model(const char *preset) {
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_preset(&c, preset, &err), 0);
    c.hidden_size = 64, c.num_heads = 8, c.num_kv_heads = 2, c.head_dim = 16, c.intermediate_size = 96;
    c.vocab_size = 300, c.num_layers = 2;
    c.initializer_range = 0.1; /* activations large enough for attention to matter */
    c.num_eos_token_ids = 1, c.eos_token_ids[0] = 2;
    rp_load_options lo = {.seed = 42};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static void run_model(const char *preset) {
    rp_model *m = small_model(preset);
    const int V = m->cfg.vocab_size;
    const int32_t tokens[T] = {5, 299, 17, 64, 128, 63, 250};
    float *full = malloc((size_t)T * V * 4), *cpu = malloc((size_t)T * V * 4), *tp = malloc((size_t)T * V * 4);
    int32_t arg_full[T], arg_tp[T];
    forward(m, NULL, tokens, full, arg_full);

    /* the loops are the model: the CPU backend agrees */
    rp_err err;
    rp_runner_config rc = {.model = m, .device = "cpu", .threads = 2, .page_size = 16, .num_pages = 2, .max_seqs = 1,
                           .max_context = 32, .max_batched_tokens = 32, .max_logit_rows = 32};
    rp_runner *run = rp_runner_new(&rc, &err);
    if (!run) fail_msg("runner: %s", err.msg);
    const int32_t *ids[1] = {tokens};
    const int n[1] = {T};
    float *outs[1] = {cpu};
    if (rp_runner_run_prompts(run, 1, ids, n, outs, 0, NULL, &err)) fail_msg("%s", err.msg);
    rp_runner_free(run);
    for (int t = 0; t < T; t++) {
        double e = test_rel_l2(full + (size_t)t * V, cpu + (size_t)t * V, (size_t)V);
        if (!(e < 1e-5)) fail_msg("%s: the test's loops differ from the CPU backend at position %d: %.3g", preset, t, e);
    }

    for (int size = 1; size <= 8; size *= 2) {
        rp_tp_plan p;
        if (rp_tp_plan_make(&p, &m->cfg, size, &err)) fail_msg("%s", err.msg);
        for (size_t i = 0; i < (size_t)T * V; i++) tp[i] = NAN; /* every logit must be written by some rank */
        forward(m, &p, tokens, tp, arg_tp);
        for (int t = 0; t < T; t++) {
            double e = test_rel_l2(tp + (size_t)t * V, full + (size_t)t * V, (size_t)V);
            if (!(e < 1e-6)) fail_msg("%s N=%d: position %d: sharded logits off by %.3g", preset, size, t, e);
            assert_int_equal(arg_tp[t], arg_full[t]);
        }
    }
    free(full), free(cpu), free(tp);
    rp_model_free(m);
}

static void test_qwen3(void **state) {
    (void)state;
    run_model("tiny-qwen3");
}

static void test_qwen2(void **state) {
    (void)state;
    run_model("tiny-qwen2");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_qwen3), cmocka_unit_test(test_qwen2)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
