/* The CUDA backend's weights: every matrix and norm of the model in one
 * device allocation (256-byte aligned pieces), bf16, with each layer's q, k
 * and v side by side (one [(nh + 2 nkv) hd][H] matrix, one GEMV), their
 * biases likewise (Qwen2: one vector laid out as a row of the product), and
 * gate and up likewise. Real weights are copied from the host; dummy weights are
 * generated on the GPU with the CPU generator's values. */
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"

/* Copies weight (kind, layer) into dst, or generates it there when the model
 * has lazy dummy weights. */
static int put_weight(rp_cuda_backend *cb, rp_bf16 *dst, rp_weight_kind kind, int layer, rp_err *err) {
    const rp_model *m = cb->base.model;
    const rp_weight *w = rp_model_weight(m, kind, layer);
    size_t n = (size_t)(w->rows * w->cols);
    if (w->data) {
        RP_CUDA_TRY(cudaMemcpyAsync(dst, w->data, n * 2, cudaMemcpyHostToDevice, cb->stream), err);
        return 0;
    }
    if (!m->dummy) return rp_errf(err, "weight %s of layer %d has no data", rp_weight_kind_name(kind), layer);
    uint64_t stream_id;
    double std;
    int is_norm;
    rp_weight_kind gen_kind = kind;
    if (kind == RP_W_LM_HEAD && m->cfg.tie_word_embeddings) gen_kind = RP_W_EMBED;
    rp_dummy_weight_params(&m->cfg, gen_kind, layer, &stream_id, &std, &is_norm);
    RP_LAUNCH(rp_k_fill_dummy(dst, (int64_t)n, m->dummy_seed, stream_id, std, is_norm, cb->stream), err);
    return 0;
}

static size_t weight_elems(const rp_model *m, rp_weight_kind kind) {
    const rp_weight *w = rp_model_weight(m, kind, 0);
    return (size_t)(w->rows * w->cols);
}

/* Lays out all weights in one allocation (256-byte aligned pieces). */
int rp_cuda_upload_weights(rp_cuda_backend *cb, rp_err *err) {
    const rp_model *m = cb->base.model;
    const rp_model_config *c = &m->cfg;
    const int has_qk = c->arch->has_qk_norm, has_bias = c->arch->has_qkv_bias, tied = c->tie_word_embeddings;
    size_t per_layer[RP_W_COUNT] = {0}, total = 0;
#define ALIGN_UP(x) (((x) + 127) & ~(size_t)127) /* elements: 256 bytes */
    for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
        if (!rp_arch_has_weight(c->arch, (rp_weight_kind)k)) continue;
        if (k == RP_W_Q_BIAS || k == RP_W_K_BIAS || k == RP_W_V_BIAS) continue; /* one piece, below */
        per_layer[k] = ALIGN_UP(weight_elems(m, (rp_weight_kind)k));
        total += per_layer[k] * (size_t)c->num_layers;
    }
    const size_t bqkv_n = has_bias ? ALIGN_UP(weight_elems(m, RP_W_Q_BIAS) + 2 * weight_elems(m, RP_W_K_BIAS)) : 0;
    total += bqkv_n * (size_t)c->num_layers;
    size_t embed_n = ALIGN_UP(weight_elems(m, RP_W_EMBED)), norm_n = ALIGN_UP((size_t)c->hidden_size);
    total += embed_n + norm_n + (tied ? 0 : embed_n);
    cb->w.bytes = total * 2;
    if (rp_cuda_malloc((void **)&cb->w.mem, cb->w.bytes, "weights", err)) return RP_ERR;
    rp_bf16 *p = cb->w.mem;
    cb->w.embed = p;
    p += embed_n;
    cb->w.final_norm = p;
    p += norm_n;
    cb->w.lm_head = tied ? cb->w.embed : p;
    if (!tied) p += embed_n;
    if (put_weight(cb, cb->w.embed, RP_W_EMBED, 0, err) || put_weight(cb, cb->w.final_norm, RP_W_FINAL_NORM, 0, err) ||
        (!tied && put_weight(cb, cb->w.lm_head, RP_W_LM_HEAD, 0, err)))
        return RP_ERR;
    for (int l = 0; l < c->num_layers; l++) {
        rp_cuda_layer *ly = &cb->w.layers[l];
        /* q, k, v are contiguous (in that order) so that they form one
         * [(nh + 2 nkv) hd][H] matrix: they were given adjacent slots. */
        ly->attn_norm = p;
        p += per_layer[RP_W_ATTN_NORM];
        ly->wqkv = p;
        if (put_weight(cb, p, RP_W_Q, l, err)) return RP_ERR;
        p += weight_elems(m, RP_W_Q);
        if (put_weight(cb, p, RP_W_K, l, err)) return RP_ERR;
        p += weight_elems(m, RP_W_K);
        if (put_weight(cb, p, RP_W_V, l, err)) return RP_ERR;
        p += weight_elems(m, RP_W_V);
        p = ly->wqkv + ALIGN_UP(weight_elems(m, RP_W_Q) + weight_elems(m, RP_W_K) + weight_elems(m, RP_W_V));
        ly->wo = p;
        p += per_layer[RP_W_O];
        ly->q_norm = has_qk ? p : NULL;
        p += per_layer[RP_W_Q_NORM];
        ly->k_norm = has_qk ? p : NULL;
        p += per_layer[RP_W_K_NORM];
        ly->mlp_norm = p;
        p += per_layer[RP_W_MLP_NORM];
        ly->wgu = p;
        if (put_weight(cb, p, RP_W_GATE, l, err)) return RP_ERR;
        if (put_weight(cb, p + weight_elems(m, RP_W_GATE), RP_W_UP, l, err)) return RP_ERR;
        p += per_layer[RP_W_GATE] + per_layer[RP_W_UP];
        ly->wdown = p;
        p += per_layer[RP_W_DOWN];
        ly->bqkv = has_bias ? p : NULL; /* q, k, v in that order, as in a row of the qkv product */
        if (has_bias && (put_weight(cb, p, RP_W_Q_BIAS, l, err) ||
                         put_weight(cb, p + weight_elems(m, RP_W_Q_BIAS), RP_W_K_BIAS, l, err) ||
                         put_weight(cb, p + weight_elems(m, RP_W_Q_BIAS) + weight_elems(m, RP_W_K_BIAS), RP_W_V_BIAS,
                                    l, err)))
            return RP_ERR;
        p += bqkv_n;
        if (put_weight(cb, ly->attn_norm, RP_W_ATTN_NORM, l, err) || put_weight(cb, ly->wo, RP_W_O, l, err) ||
            put_weight(cb, ly->mlp_norm, RP_W_MLP_NORM, l, err) || put_weight(cb, ly->wdown, RP_W_DOWN, l, err) ||
            (has_qk && (put_weight(cb, ly->q_norm, RP_W_Q_NORM, l, err) ||
                        put_weight(cb, ly->k_norm, RP_W_K_NORM, l, err))))
            return RP_ERR;
    }
#undef ALIGN_UP
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    return 0;
}
