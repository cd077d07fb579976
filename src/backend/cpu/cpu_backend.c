/* The CPU reference backend: the whole forward pass, clear rather than
 * clever, in fp32 arithmetic over bf16 weights.
 *
 * It is the oracle the CUDA kernels are tested against and the backend CI
 * and the demo run on, so each step follows transformers' modeling code
 * (RMSNorm in fp32, RoPE by rotate_half, softmax in fp32) and the KV cache
 * has the same paged layout as on the GPU: k_cache[layer][slot][kv_head *
 * head_dim] with slot = page * page_size + offset. The cache is fp32 here
 * (bf16 on the GPU) so this backend matches fp32 transformers to ~1e-6.
 * With an fp8 KV cache (--kv-cache-dtype fp8) it holds what the GPU holds,
 * e4m3 bytes of k / k_scale and v / v_scale (rp_f32_to_f8e4m3: the GPU's
 * rounding), and attends as the GPU's kernels do: k_scale folded into the
 * softmax scale, the output times v_scale (docs/kv-cache.md), so it stays
 * the reference for them.
 *
 * Under tensor parallelism (cfg.tp, docs/tensor-parallel.md) the model is
 * one rank's shard and the ranks meet at four points a layer's math needs
 * them: the embedding, o_proj and down_proj products are partial sums
 * (all-reduced), and the logits are one vocabulary shard (all-gathered, then
 * laid out as the whole vocabulary, so every rank samples the same token). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "model/rope.h" /* a leaf module (util only): the same sampler the engine uses */
#include "util/dtype.h"

#define ROWS_PER_BLOCK 4
/* Below this many multiply-adds a parallel region costs more than it saves
 * (and oversubscribed cores make OpenMP's spinning threads very slow). */
#define PARALLEL_MIN_WORK (1 << 18)

typedef struct cpu_backend {
    rp_backend base;
    int num_threads;
    int64_t slots;        /* (num_pages + 1) * page_size, the +1 is the dummy page */
    float *k_cache, *v_cache; /* [layers][slots][kv_dim]; bf16 KV */
    uint8_t *k_cache8, *v_cache8; /* the same, fp8 KV: e4m3 bytes */
    int fp8_kv;
    float e4m3[256];      /* every e4m3 byte's value: a table read is cheaper than decoding each */
    float *inv_freq;      /* [head_dim / 2] */
    float rope_scale;     /* rp_rope_attention_scale: cos and sin are multiplied by it */
    /* activations, [max_batched_tokens][...] */
    float *x, *xn, *q, *k, *v, *attn, *gate, *up;
    float *logit_in;      /* [max_logit_rows][hidden] */
    float *logits;        /* [max_logit_rows][vocab] */
    int last_num_logits;
    /* per thread scratch */
    float *wrows;         /* [threads][ROWS_PER_BLOCK][max_k] */
    float *scores;        /* [threads][max_kv_len] */
    int max_k, max_kv_len;
    /* sampling inside forward (batch->sample), with the GPU's contract: two
     * result slots, so one more forward may run before the previous one's
     * tokens are read, and token references resolved from the last one */
    rp_sampler *sampler;
    float *sample_row;
    int32_t *tok_slot[2];
    float *lp_slot[2];
    rp_top_logprobs *top_slot[2];
    int slot_n[2], slot_sampled[2], cur_slot, num_pending;
    /* a forward with sample_deferred: its rows' sampling parameters, kept
     * for sample_masked (the batch's arrays are the caller's) */
    int deferred;
    rp_sampling_params *deferred_params; /* [max_logit_rows] */
    /* tensor parallelism (NULL comm: none): the vocabulary of the logits
     * (the whole model's), the rank's rows of it, and the lm_head's shard
     * of the logits, then every rank's shard ([size][max_logit_rows][vocab
     * per rank]) */
    rp_comm *comm;
    int vocab;
    int64_t vocab_start, vocab_count, vocab_per_rank;
    float *logits_shard, *logits_gather;
    float *argmax_send;   /* [max_logit_rows][ARGMAX_FLOATS]: this rank's best of each greedy row */
    int logits_gathered;  /* the last forward's logits are whole (read_logits may read them) */
} cpu_backend;

/* A rank's best of a row (the distributed argmax): its largest logit, that
 * token's id, the sum of exp(logit - largest) over its rows, and padding,
 * as floats for the all-gather (ids below 2^24 are exact). */
#define ARGMAX_FLOATS 4

/* ---- building blocks -------------------------------------------------- */

static inline float dot_f32(const float *a, const float *b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* y[T][N] = x[T][K] . W[N][K]^T. Parallel over blocks of weight rows, each
 * converted from bf16 once and reused for every token. */
static void matmul(cpu_backend *cb, float *y, const float *x, const rp_weight *w, int T) {
    const int K = (int)w->cols, N = (int)w->rows;
    const uint16_t *wd = w->data;
#pragma omp parallel num_threads(cb->num_threads) if ((int64_t)N * K * T >= PARALLEL_MIN_WORK)
    {
        float *wr = cb->wrows + (size_t)omp_get_thread_num() * ROWS_PER_BLOCK * cb->max_k;
#pragma omp for schedule(static)
        for (int n0 = 0; n0 < N; n0 += ROWS_PER_BLOCK) {
            int nr = N - n0 < ROWS_PER_BLOCK ? N - n0 : ROWS_PER_BLOCK;
            for (int r = 0; r < nr; r++) {
                const uint16_t *src = wd + (int64_t)(n0 + r) * K;
                float *dst = wr + (size_t)r * K;
                for (int i = 0; i < K; i++) dst[i] = rp_bf16_to_f32(src[i]);
            }
            for (int t = 0; t < T; t++) {
                const float *xt = x + (int64_t)t * K;
                float *yt = y + (int64_t)t * N + n0;
                for (int r = 0; r < nr; r++) yt[r] = dot_f32(xt, wr + (size_t)r * K, K);
            }
        }
    }
}

/* y[T][N] += bias[N] (Qwen2's q/k/v); nothing when the model has none. */
static void add_bias(float *y, const rp_weight *bias, int T) {
    if (!bias->data) return;
    const int N = (int)bias->rows;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) y[(int64_t)t * N + n] += rp_bf16_to_f32(bias->data[n]);
}

/* transformers' RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, in fp32. */
static void rmsnorm_row(float *out, const float *x, const uint16_t *w, int n, float eps) {
    float ss = dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) out[i] = rp_bf16_to_f32(w[i]) * (x[i] * r);
}

static void rmsnorm(cpu_backend *cb, float *out, const float *x, const rp_weight *w, int T, int n, float eps) {
#pragma omp parallel for num_threads(cb->num_threads) schedule(static) if ((int64_t)T * n >= PARALLEL_MIN_WORK)
    for (int t = 0; t < T; t++) rmsnorm_row(out + (int64_t)t * n, x + (int64_t)t * n, w->data, n, eps);
}

/* rotate_half RoPE: pairs (i, i + d/2) rotate by pos * inv_freq[i]. The
 * angle and its cos/sin are fp32, as transformers computes them, cos and
 * sin times the rope's attention scale (yarn's; else 1) as it does too. */
static void rope_head(float *v, int head_dim, int pos, const float *inv_freq, float scale) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang) * scale, s = sinf(ang) * scale;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* ---- the forward pass ------------------------------------------------- */

/* One fp8 cache row (hd bytes) as floats, through the table. */
static inline void e4m3_row(const cpu_backend *cb, float *dst, const uint8_t *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = cb->e4m3[src[i]];
}

/* Token t's K and V (kv_dim each) into the layer's cache at its slot: fp32
 * as they are, or e4m3 of k / k_scale and v / v_scale. */
static void store_kv(cpu_backend *cb, int layer, int64_t slot, const float *k, const float *v) {
    const rp_model_config *c = &cb->base.model->cfg;
    const int kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t off = ((int64_t)layer * cb->slots + slot) * kv_dim;
    if (!cb->fp8_kv) {
        memcpy(cb->k_cache + off, k, (size_t)kv_dim * sizeof(float));
        memcpy(cb->v_cache + off, v, (size_t)kv_dim * sizeof(float));
        return;
    }
    /* a division, not a multiplication by the inverse: the GPU's kernel
     * divides too, so both make the same bytes */
    const float ks = rp_model_k_scale(cb->base.model, layer), vs = rp_model_v_scale(cb->base.model, layer);
    for (int i = 0; i < kv_dim; i++) {
        cb->k_cache8[off + i] = rp_f32_to_f8e4m3(k[i] / ks);
        cb->v_cache8[off + i] = rp_f32_to_f8e4m3(v[i] / vs);
    }
}

/* A partial sum over the ranks (tensor parallelism), in place; nothing on
 * one rank. */
static int tp_sum(cpu_backend *cb, float *buf, int64_t n, rp_err *err) {
    if (!cb->comm) return 0;
    return rp_comm_all_reduce_sum(cb->comm, buf, (size_t)n, RP_COMM_F32, NULL, err);
}

/* The ranks' logit shards, gathered, into [rows][vocab]: rank k's row i
 * holds tokens k * vocab_per_rank + j; its padding columns (past the
 * vocabulary) are dropped. */
static int tp_gather_logits(cpu_backend *cb, int rows, rp_err *err) {
    const rp_tp_plan *plan = cb->base.cfg.tp.plan;
    const int64_t vpr = cb->vocab_per_rank;
    if (rp_comm_all_gather(cb->comm, cb->logits_shard, cb->logits_gather, (size_t)(rows * vpr), RP_COMM_F32, NULL,
                           err))
        return RP_ERR;
    for (int k = 0; k < plan->size; k++)
        for (int i = 0; i < rows; i++)
            memcpy(cb->logits + (int64_t)i * cb->vocab + plan->ranks[k].vocab_start,
                   cb->logits_gather + ((int64_t)k * rows + i) * vpr, (size_t)plan->ranks[k].vocab_count * sizeof(float));
    return 0;
}

/* A step whose every row is greedy, with no top logprobs and no masks to
 * come, needs no rank's whole logits: each rank's best of each row is
 * enough (docs/tensor-parallel.md, "Greedy steps"). The sampled token is
 * the largest logit (the lowest id on ties, as the sampler's argmax), its
 * logprob -log(sum over ranks of their sums, each shifted to the best). */
static int greedy_only(const rp_batch *bt) {
    if (!bt->sample || bt->sample_deferred) return 0;
    for (int i = 0; i < bt->num_logits; i++)
        if (bt->sample[i].temperature != 0.0f || bt->sample[i].top_logprobs > 0) return 0;
    return 1;
}

/* The distributed argmax: every rank gathers ARGMAX_FLOATS floats a row
 * from each rank instead of its vocab_per_rank logits, and picks the same
 * token (every rank combines the same gathered bytes in rank order). */
static int tp_argmax(cpu_backend *cb, int rows, rp_err *err) {
    const rp_tp_plan *plan = cb->base.cfg.tp.plan;
    const int64_t vpr = cb->vocab_per_rank;
    for (int i = 0; i < rows; i++) {
        const float *row = cb->logits_shard + (int64_t)i * vpr;
        float best = -INFINITY;
        int64_t arg = 0;
        for (int64_t j = 0; j < cb->vocab_count; j++) /* the real rows, not the padding */
            if (row[j] > best) best = row[j], arg = j;
        double sum = 0;
        if (best != -INFINITY)
            for (int64_t j = 0; j < cb->vocab_count; j++) sum += exp((double)row[j] - best);
        float *out = cb->argmax_send + (int64_t)i * ARGMAX_FLOATS;
        out[0] = best, out[1] = (float)(cb->vocab_start + arg), out[2] = (float)sum, out[3] = 0;
    }
    if (rp_comm_all_gather(cb->comm, cb->argmax_send, cb->logits_gather, (size_t)rows * ARGMAX_FLOATS, RP_COMM_F32,
                           NULL, err))
        return RP_ERR;
    const int slot = cb->cur_slot;
    for (int i = 0; i < rows; i++) {
        float best = -INFINITY;
        int32_t tok = 0;
        for (int k = 0; k < plan->size; k++) {
            const float *g = cb->logits_gather + ((int64_t)k * rows + i) * ARGMAX_FLOATS;
            if (g[0] > best) best = g[0], tok = (int32_t)g[1];
        }
        double norm = 0;
        for (int k = 0; best != -INFINITY && k < plan->size; k++) {
            const float *g = cb->logits_gather + ((int64_t)k * rows + i) * ARGMAX_FLOATS;
            if (g[0] != -INFINITY) norm += (double)g[2] * exp((double)g[0] - best);
        }
        cb->tok_slot[slot][i] = tok;
        cb->lp_slot[slot][i] = best == -INFINITY ? -INFINITY : (float)-log(norm);
        cb->top_slot[slot][i].n = 0;
    }
    return 0;
}

static void attention(cpu_backend *cb, const rp_batch *bt, int layer) {
    const rp_model_config *c = &cb->base.model->cfg;
    const int hd = c->head_dim, nh = c->num_heads, group = c->num_heads / c->num_kv_heads;
    const int kv_dim = c->num_kv_heads * hd, q_dim = nh * hd, ps = cb->base.cfg.page_size;
    /* fp8: q . (k8 k_scale) = (q . k8) k_scale, so k_scale joins the softmax
     * scale, and sum p (v8 v_scale) = v_scale sum p v8 */
    const float scale = 1.0f / sqrtf((float)hd) * (cb->fp8_kv ? rp_model_k_scale(cb->base.model, layer) : 1.0f);
    const float out_scale = cb->fp8_kv ? rp_model_v_scale(cb->base.model, layer) : 1.0f;
    const int64_t layer_off = (int64_t)layer * cb->slots * kv_dim;
    const float *kc = cb->fp8_kv ? NULL : cb->k_cache + layer_off;
    const float *vc = cb->fp8_kv ? NULL : cb->v_cache + layer_off;
    const uint8_t *kc8 = cb->fp8_kv ? cb->k_cache8 + layer_off : NULL;
    const uint8_t *vc8 = cb->fp8_kv ? cb->v_cache8 + layer_off : NULL;
    const int pairs = bt->num_tokens * nh;
    int64_t work = 0;
    for (int t = 0; t < bt->num_tokens; t++) work += (int64_t)(bt->positions[t] + 1) * hd * nh * 2;
#pragma omp parallel num_threads(cb->num_threads) if (work >= PARALLEL_MIN_WORK)
    {
        float *sc = cb->scores + (size_t)omp_get_thread_num() * cb->max_kv_len;
        float row[512]; /* one dequantized fp8 row (head_dim <= 512: rp_config_validate) */
#pragma omp for schedule(dynamic, 4)
        for (int th = 0; th < pairs; th++) {
            int t = th / nh, h = th % nh, kvh = h / group;
            int s = 0;
            while (bt->seq_start[s + 1] <= t) s++;
            const int32_t *prow = bt->page_table + (int64_t)bt->seq_page_row[s] * bt->page_table_stride;
            int kv_len = bt->positions[t] + 1; /* causal: keys up to and including this token */
            const float *qv = cb->q + (int64_t)t * q_dim + h * hd;
            float mx = -INFINITY;
            for (int j = 0; j < kv_len; j++) {
                int64_t slot = (int64_t)prow[j / ps] * ps + j % ps;
                const float *kv_row = kc ? kc + slot * kv_dim + kvh * hd : row;
                if (!kc) e4m3_row(cb, row, kc8 + slot * kv_dim + kvh * hd, hd);
                sc[j] = dot_f32(qv, kv_row, hd) * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            float sum = 0.0f;
            for (int j = 0; j < kv_len; j++) {
                sc[j] = expf(sc[j] - mx);
                sum += sc[j];
            }
            float *out = cb->attn + (int64_t)t * q_dim + h * hd;
            for (int d = 0; d < hd; d++) out[d] = 0.0f;
            for (int j = 0; j < kv_len; j++) {
                int64_t slot = (int64_t)prow[j / ps] * ps + j % ps;
                const float *vv = vc ? vc + slot * kv_dim + kvh * hd : row;
                if (!vc) e4m3_row(cb, row, vc8 + slot * kv_dim + kvh * hd, hd);
                float p = sc[j] / sum;
                for (int d = 0; d < hd; d++) out[d] += p * vv[d];
            }
            if (out_scale != 1.0f)
                for (int d = 0; d < hd; d++) out[d] *= out_scale;
        }
    }
}

/* Samples the last forward's rows into its result slot, as the GPU does:
 * row i with params[i], after the mask masks + mask_of_row[i] rows (-1 or
 * mask_of_row NULL: none) is applied by the host sampler's own code. */
static void sample_rows(cpu_backend *cb, const rp_sampling_params *params, int n, const uint32_t *masks,
                        const int32_t *mask_of_row) {
    const int V = cb->vocab, words = rp_token_mask_words(V), slot = cb->cur_slot;
    for (int i = 0; i < n; i++) {
        const rp_sampling_params *sp = &params[i];
        /* the row as the GPU reads it: no history here, so no penalties */
        rp_sampling_params p = *sp;
        p.top_p = sp->top_p > 0 && sp->top_p <= 1 ? sp->top_p : 1.0f; /* 0: an unset row, as on the GPU */
        p.top_logprobs = sp->top_logprobs > 0 && sp->top_logprobs <= RP_MAX_TOP_LOGPROBS ? sp->top_logprobs : 0;
        p.repetition_penalty = 1.0f;
        p.presence_penalty = p.frequency_penalty = 0.0f;
        memcpy(cb->sample_row, cb->logits + (size_t)i * V, (size_t)V * sizeof(float));
        if (mask_of_row && mask_of_row[i] >= 0)
            rp_sampler_apply_mask(cb->sample_row, V, masks + (size_t)mask_of_row[i] * words);
        cb->tok_slot[slot][i] = rp_sampler_sample_top(cb->sampler, &p, cb->sample_row, NULL, 0, NULL, 0, sp->step,
                                                      &cb->lp_slot[slot][i], &cb->top_slot[slot][i]);
    }
}

static int cpu_forward(rp_backend *b, const rp_batch *bt, rp_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    const rp_model *m = b->model;
    const rp_model_config *c = &m->cfg;
    if (rp_batch_validate(bt, b, err)) return RP_ERR;
    const int T = bt->num_tokens, H = c->hidden_size, hd = c->head_dim, F = c->intermediate_size;
    const int q_dim = c->num_heads * hd, kv_dim = c->num_kv_heads * hd;
    const float eps = (float)c->rms_norm_eps;

    if (cb->num_pending >= 2) return rp_errf(err, "two forwards in flight: read the older one's results first");
    if (cb->deferred) return rp_errf(err, "the last forward deferred its sampling: call sample_masked first");
    const int32_t *prev = cb->tok_slot[cb->cur_slot];
    const rp_weight *emb = rp_model_weight(m, RP_W_EMBED, 0);
    for (int t = 0; t < T; t++) {
        int32_t tok = bt->tokens[t] < 0 ? prev[-bt->tokens[t] - 1] : bt->tokens[t];
        int64_t row = (int64_t)tok - cb->vocab_start; /* the shard's row (tensor parallelism) */
        float *xt = cb->x + (int64_t)t * H;
        if (row < 0 || row >= cb->vocab_count) { /* another rank's token: it adds the row */
            memset(xt, 0, (size_t)H * sizeof *xt);
            continue;
        }
        const uint16_t *e = emb->data + row * H;
        for (int i = 0; i < H; i++) xt[i] = rp_bf16_to_f32(e[i]);
    }
    if (tp_sum(cb, cb->x, (int64_t)T * H, err)) return RP_ERR;

    for (int l = 0; l < c->num_layers; l++) {
        rmsnorm(cb, cb->xn, cb->x, rp_model_weight(m, RP_W_ATTN_NORM, l), T, H, eps);
        matmul(cb, cb->q, cb->xn, rp_model_weight(m, RP_W_Q, l), T);
        matmul(cb, cb->k, cb->xn, rp_model_weight(m, RP_W_K, l), T);
        matmul(cb, cb->v, cb->xn, rp_model_weight(m, RP_W_V, l), T);
        add_bias(cb->q, rp_model_weight(m, RP_W_Q_BIAS, l), T);
        add_bias(cb->k, rp_model_weight(m, RP_W_K_BIAS, l), T);
        add_bias(cb->v, rp_model_weight(m, RP_W_V_BIAS, l), T);
        const rp_weight *qn = rp_model_weight(m, RP_W_Q_NORM, l), *kn = rp_model_weight(m, RP_W_K_NORM, l);
#pragma omp parallel for num_threads(cb->num_threads) schedule(static) if ((int64_t)T * q_dim * 4 >= PARALLEL_MIN_WORK)
        for (int t = 0; t < T; t++) {
            float *qt = cb->q + (int64_t)t * q_dim, *kt = cb->k + (int64_t)t * kv_dim;
            for (int h = 0; h < c->num_heads; h++) {
                if (qn->data) rmsnorm_row(qt + h * hd, qt + h * hd, qn->data, hd, eps);
                rope_head(qt + h * hd, hd, bt->positions[t], cb->inv_freq, cb->rope_scale);
            }
            for (int h = 0; h < c->num_kv_heads; h++) {
                if (kn->data) rmsnorm_row(kt + h * hd, kt + h * hd, kn->data, hd, eps);
                rope_head(kt + h * hd, hd, bt->positions[t], cb->inv_freq, cb->rope_scale);
            }
            store_kv(cb, l, bt->slot_mapping[t], kt, cb->v + (int64_t)t * kv_dim);
        }
        attention(cb, bt, l);
        matmul(cb, cb->xn, cb->attn, rp_model_weight(m, RP_W_O, l), T);
        if (tp_sum(cb, cb->xn, (int64_t)T * H, err)) return RP_ERR;
        for (int64_t i = 0; i < (int64_t)T * H; i++) cb->x[i] += cb->xn[i];

        rmsnorm(cb, cb->xn, cb->x, rp_model_weight(m, RP_W_MLP_NORM, l), T, H, eps);
        matmul(cb, cb->gate, cb->xn, rp_model_weight(m, RP_W_GATE, l), T);
        matmul(cb, cb->up, cb->xn, rp_model_weight(m, RP_W_UP, l), T);
#pragma omp parallel for num_threads(cb->num_threads) schedule(static) if ((int64_t)T * F >= PARALLEL_MIN_WORK)
        for (int64_t i = 0; i < (int64_t)T * F; i++) {
            float g = cb->gate[i];
            cb->gate[i] = g / (1.0f + expf(-g)) * cb->up[i];
        }
        matmul(cb, cb->xn, cb->gate, rp_model_weight(m, RP_W_DOWN, l), T);
        if (tp_sum(cb, cb->xn, (int64_t)T * H, err)) return RP_ERR;
        for (int64_t i = 0; i < (int64_t)T * H; i++) cb->x[i] += cb->xn[i];
    }

    const rp_weight *fnorm = rp_model_weight(m, RP_W_FINAL_NORM, 0);
    for (int i = 0; i < bt->num_logits; i++)
        rmsnorm_row(cb->logit_in + (int64_t)i * H, cb->x + (int64_t)bt->logit_token[i] * H, fnorm->data, H, eps);
    matmul(cb, cb->comm ? cb->logits_shard : cb->logits, cb->logit_in, rp_model_weight(m, RP_W_LM_HEAD, 0),
           bt->num_logits);
    const int argmax = cb->comm && greedy_only(bt);
    if (cb->comm && !argmax && tp_gather_logits(cb, bt->num_logits, err)) return RP_ERR;
    cb->logits_gathered = !argmax;
    cb->last_num_logits = bt->num_logits;
    int slot = cb->cur_slot ^ 1;
    cb->cur_slot = slot;
    cb->slot_n[slot] = bt->num_logits;
    cb->slot_sampled[slot] = bt->sample != NULL;
    cb->num_pending++;
    cb->deferred = bt->sample_deferred;
    if (bt->sample_deferred) { /* sampled by sample_masked */
        cb->slot_sampled[slot] = 0;
        memcpy(cb->deferred_params, bt->sample, (size_t)bt->num_logits * sizeof *bt->sample);
    } else if (argmax) {
        if (tp_argmax(cb, bt->num_logits, err)) return RP_ERR;
    } else if (bt->sample) {
        sample_rows(cb, bt->sample, bt->num_logits, NULL, NULL);
    }
    return 0;
}

static int cpu_sample_masked(rp_backend *b, const uint32_t *masks, int num_masks, const int32_t *mask_of_row,
                             rp_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (!cb->deferred) return rp_errf(err, "the last forward did not defer its sampling");
    const int n = cb->slot_n[cb->cur_slot];
    for (int i = 0; mask_of_row && i < n; i++)
        if (mask_of_row[i] < -1 || mask_of_row[i] >= num_masks)
            return rp_errf(err, "logit row %d names mask %d of %d", i, mask_of_row[i], num_masks);
    sample_rows(cb, cb->deferred_params, n, masks, mask_of_row);
    cb->slot_sampled[cb->cur_slot] = 1;
    cb->deferred = 0;
    return 0;
}

static int cpu_read_tokens(rp_backend *b, int32_t *tokens, float *logprobs, rp_top_logprobs *top, rp_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (cb->num_pending == 0) return rp_errf(err, "no forward to read");
    int slot = cb->num_pending == 2 ? cb->cur_slot ^ 1 : cb->cur_slot;
    if (!cb->slot_sampled[slot]) return rp_errf(err, "that forward did not sample");
    memcpy(tokens, cb->tok_slot[slot], (size_t)cb->slot_n[slot] * sizeof *tokens);
    if (logprobs) memcpy(logprobs, cb->lp_slot[slot], (size_t)cb->slot_n[slot] * sizeof *logprobs);
    if (top) memcpy(top, cb->top_slot[slot], (size_t)cb->slot_n[slot] * sizeof *top);
    cb->num_pending--;
    return 0;
}

static int cpu_read_logits(rp_backend *b, float *dst, rp_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (cb->num_pending > 1) return rp_errf(err, "logits of an overlapped forward cannot be read");
    if (!cb->logits_gathered)
        return rp_errf(err, "the last forward's rows were all greedy: each rank kept its best token, the logits "
                            "were not gathered (read its tokens)");
    cb->num_pending = 0;
    memcpy(dst, cb->logits, (size_t)cb->last_num_logits * cb->vocab * sizeof(float));
    return 0;
}

static void cpu_destroy(rp_backend *b) {
    cpu_backend *cb = (cpu_backend *)b;
    if (!cb) return;
    float *bufs[] = {cb->k_cache, cb->v_cache, cb->inv_freq, cb->x,        cb->xn,     cb->q,     cb->k,
                     cb->v,       cb->attn,    cb->gate,     cb->up,       cb->logit_in, cb->logits, cb->wrows,
                     cb->scores,  cb->logits_shard, cb->logits_gather, cb->argmax_send};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(cb->k_cache8);
    free(cb->v_cache8);
    for (int k = 0; k < 2; k++) {
        free(cb->tok_slot[k]);
        free(cb->lp_slot[k]);
        free(cb->top_slot[k]);
    }
    free(cb->sample_row);
    free(cb->deferred_params);
    rp_sampler_free(cb->sampler);
    free(cb);
}

static const rp_backend_ops cpu_ops = {.forward = cpu_forward,
                                       .read_logits = cpu_read_logits,
                                       .read_tokens = cpu_read_tokens,
                                       .sample_masked = cpu_sample_masked,
                                       .destroy = cpu_destroy};

static float *alloc_f32(int64_t n, int *failed) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) *failed = 1;
    return p;
}

rp_backend *rp_backend_cpu_new(const rp_model *model, const rp_backend_config *cfg, rp_err *err) {
    const rp_model_config *c = &model->cfg;
    if (cfg->num_pages <= 0 || cfg->page_size <= 0 || cfg->max_batched_tokens <= 0 || cfg->max_batch_seqs <= 0) {
        rp_errf(err, "cpu backend: num_pages, page_size and batch limits must be positive");
        return NULL;
    }
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->base.model = model;
    cb->base.cfg = *cfg;
    if (cb->base.cfg.max_logit_rows <= 0) cb->base.cfg.max_logit_rows = cfg->max_batch_seqs;
    cb->num_threads = cfg->num_threads > 0 ? cfg->num_threads : omp_get_max_threads();
    cb->vocab = rp_backend_vocab(&cb->base);
    rp_tp_vocab tv;
    if (rp_backend_tp_vocab(cfg, c, "cpu backend", &tv, err)) {
        free(cb);
        return NULL;
    }
    cb->comm = cfg->tp.size > 1 ? cfg->tp.comm : NULL;
    cb->logits_gathered = 1;
    cb->vocab_start = tv.start, cb->vocab_count = tv.count, cb->vocab_per_rank = tv.per_rank;

    const int64_t T = cfg->max_batched_tokens, H = c->hidden_size, F = c->intermediate_size;
    const int64_t q_dim = (int64_t)c->num_heads * c->head_dim, kv_dim = (int64_t)c->num_kv_heads * c->head_dim;
    const int64_t L = cb->base.cfg.max_logit_rows;
    cb->slots = (int64_t)(cfg->num_pages + 1) * cfg->page_size;
    cb->max_k = (int)(H > F ? H : F);
    if (q_dim > cb->max_k) cb->max_k = (int)q_dim;
    cb->max_kv_len = (int)(cb->slots < c->max_position_embeddings ? cb->slots : c->max_position_embeddings);

    int failed = 0;
    cb->base.cfg.kv_dtype = rp_kv_dtype_resolve(cfg->kv_dtype, c);
    cb->fp8_kv = cb->base.cfg.kv_dtype == RP_KV_FP8;
    if (cb->fp8_kv && c->head_dim > 512) {
        cpu_destroy(&cb->base);
        rp_errf(err, "cpu backend: an fp8 KV cache takes head_dim up to 512 (the model's is %d)", c->head_dim);
        return NULL;
    }
    const int64_t kv_elems = (int64_t)c->num_layers * cb->slots * kv_dim;
    if (cb->fp8_kv) {
        cb->k_cache8 = calloc((size_t)kv_elems, 1);
        cb->v_cache8 = calloc((size_t)kv_elems, 1);
        if (!cb->k_cache8 || !cb->v_cache8) failed = 1;
        for (int i = 0; i < 256; i++) cb->e4m3[i] = rp_f8e4m3_to_f32((uint8_t)i);
    } else {
        cb->k_cache = alloc_f32(kv_elems, &failed);
        cb->v_cache = alloc_f32(kv_elems, &failed);
    }
    cb->inv_freq = alloc_f32(c->head_dim / 2, &failed);
    cb->x = alloc_f32(T * H, &failed);
    cb->xn = alloc_f32(T * H, &failed);
    cb->q = alloc_f32(T * q_dim, &failed);
    cb->k = alloc_f32(T * kv_dim, &failed);
    cb->v = alloc_f32(T * kv_dim, &failed);
    cb->attn = alloc_f32(T * q_dim, &failed);
    cb->gate = alloc_f32(T * F, &failed);
    cb->up = alloc_f32(T * F, &failed);
    cb->logit_in = alloc_f32(L * H, &failed);
    cb->logits = alloc_f32(L * cb->vocab, &failed);
    if (cb->comm) {
        cb->logits_shard = alloc_f32(L * cb->vocab_per_rank, &failed);
        /* also the argmax's [size][L][ARGMAX_FLOATS]: vocab_per_rank is a multiple of 64 */
        cb->logits_gather = alloc_f32((int64_t)cfg->tp.size * L * cb->vocab_per_rank, &failed);
        cb->argmax_send = alloc_f32(L * ARGMAX_FLOATS, &failed);
    }
    cb->wrows = alloc_f32((int64_t)cb->num_threads * ROWS_PER_BLOCK * cb->max_k, &failed);
    cb->scores = alloc_f32((int64_t)cb->num_threads * cb->max_kv_len, &failed);
    for (int k = 0; k < 2; k++) {
        cb->tok_slot[k] = calloc((size_t)L, sizeof(int32_t));
        cb->lp_slot[k] = calloc((size_t)L, sizeof(float));
        cb->top_slot[k] = calloc((size_t)L, sizeof(rp_top_logprobs));
        if (!cb->tok_slot[k] || !cb->lp_slot[k] || !cb->top_slot[k]) failed = 1;
    }
    cb->sample_row = alloc_f32(cb->vocab, &failed);
    cb->deferred_params = calloc((size_t)L, sizeof *cb->deferred_params);
    if (!cb->deferred_params) failed = 1;
    cb->sampler = rp_sampler_new(cb->vocab);
    if (!cb->sampler) failed = 1;
    cb->base.supports_token_refs = 1;
    cb->base.forward_is_synchronous = 1;
    if (failed) {
        cpu_destroy(&cb->base);
        rp_errf(err, "cpu backend: out of memory for %d KV pages of %d tokens", cfg->num_pages, cfg->page_size);
        return NULL;
    }
    rp_rope_inv_freq(c, cb->inv_freq);
    cb->rope_scale = rp_rope_attention_scale(c);
    return &cb->base;
}
