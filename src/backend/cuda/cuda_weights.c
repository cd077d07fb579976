/* The CUDA backend's weights: every matrix and norm of the model in one
 * device allocation (256-byte aligned pieces), with each layer's q, k and v
 * side by side (one [(nh + 2 nkv) hd][H] matrix, one GEMV), their biases
 * likewise (Qwen2: one vector laid out as a row of the product), and gate
 * and up likewise. Everything is bf16, except that in an fp8 model the
 * layer matrices are e4m3 bytes with a scale per row (--quantization fp8,
 * per-channel checkpoints) or with a grid of 128 x 128 block scales (the
 * official FP8 checkpoints; the parts' grids stack by rows as the parts do,
 * each part's rows being whole blocks: weights.c checks) (rp_cuda_mat).
 * Real weights are copied from the host (quantized there too, by the
 * loader); dummy weights are generated on the GPU with the CPU generator's
 * values, and quantized there with the loader's arithmetic. */
#include <stdio.h>

#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"
#include "util/log.h"

/* Copies weight (kind, layer) into dst as bf16, or generates it there when
 * the model has lazy dummy weights. */
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
    const rp_backend_tp *tp = &cb->base.cfg.tp;
    if (tp->size > 1) {
        /* a tensor-parallel shard (tp_model.h: rp_tp_model_lazy_dummy): the
         * rank's slice of the whole model's tensor, generated as part of it */
        rp_dummy_weight_params(&tp->plan->cfg, gen_kind, layer, &stream_id, &std, &is_norm);
        rp_tp_slice s;
        rp_tp_weight_slice(tp->plan, kind, tp->rank, &s);
        const int rows_split = s.split == RP_TP_SPLIT_ROWS, cols_split = s.split == RP_TP_SPLIT_COLS;
        const int64_t rows = rows_split ? s.padded_count : s.rows, cols = cols_split ? s.count : s.cols;
        if (rows * cols != (int64_t)n)
            return rp_errf(err, "weight %s of layer %d: the shard holds %lld elements, its slice %lld",
                           rp_weight_kind_name(kind), layer, (long long)n, (long long)(rows * cols));
        RP_LAUNCH(rp_k_fill_dummy_slice(dst, rows, cols, s.cols, rows_split ? s.start : 0, cols_split ? s.start : 0,
                                        rows_split ? s.count : s.rows, m->dummy_seed, stream_id, std, is_norm,
                                        cb->stream),
                  err);
        return 0;
    }
    rp_dummy_weight_params(&m->cfg, gen_kind, layer, &stream_id, &std, &is_norm);
    RP_LAUNCH(rp_k_fill_dummy(dst, (int64_t)n, m->dummy_seed, stream_id, std, is_norm, cb->stream), err);
    return 0;
}

/* Block-scaled: rows [row0, row0 + rows) of mat, row0 a whole number of
 * blocks: the loader's bytes and grid (its rows of blocks into the padded
 * ones, kernels.h), or generated into staging and quantized here. */
static int put_matrix_blocks(rp_cuda_backend *cb, const rp_cuda_mat *mat, int64_t row0, const rp_weight *w,
                             rp_weight_kind kind, int layer, rp_bf16 *staging, rp_err *err) {
    const int ld = rp_fp8_grid_ld((int)w->cols);
    const int64_t B = RP_FP8_BLOCK, grid_rows = (w->rows + B - 1) / B, grid_cols = (w->cols + B - 1) / B;
    if (row0 % B)
        return rp_errf(err, "weight %s of layer %d starts at row %lld of its stacked matrix, inside a scale block",
                       rp_weight_kind_name(kind), layer, (long long)row0);
    uint8_t *q = (uint8_t *)mat->w + row0 * w->cols;
    float *grid = mat->grid + row0 / B * ld;
    if (w->fp8) {
        RP_CUDA_TRY(cudaMemcpyAsync(q, w->fp8, (size_t)(w->rows * w->cols), cudaMemcpyHostToDevice, cb->stream),
                    err);
        RP_CUDA_TRY(cudaMemcpy2DAsync(grid, (size_t)ld * sizeof(float), w->block_scale, (size_t)grid_cols * sizeof(float),
                                      (size_t)grid_cols * sizeof(float), (size_t)grid_rows, cudaMemcpyHostToDevice,
                                      cb->stream),
                    err);
        return 0;
    }
    if (put_weight(cb, staging, kind, layer, err)) return RP_ERR;
    RP_LAUNCH(rp_k_quant_fp8_blocks(staging, w->rows, w->cols, q, grid, ld, cb->stream), err);
    return 0;
}

/* A layer matrix's rows [row0, row0 + rows) of mat: bf16 as put_weight, or
 * e4m3 and scales (the loader's bytes, or generated into staging and
 * quantized here). */
static int put_matrix(rp_cuda_backend *cb, const rp_cuda_mat *mat, int64_t row0, rp_weight_kind kind, int layer,
                      rp_bf16 *staging, rp_err *err) {
    const rp_weight *w = rp_model_weight(cb->base.model, kind, layer);
    if (mat->grid) return put_matrix_blocks(cb, mat, row0, w, kind, layer, staging, err);
    if (!mat->scale) return put_weight(cb, (rp_bf16 *)mat->w + row0 * w->cols, kind, layer, err);
    uint8_t *q = (uint8_t *)mat->w + row0 * w->cols;
    float *scale = mat->scale + row0;
    if (w->fp8) {
        RP_CUDA_TRY(cudaMemcpyAsync(q, w->fp8, (size_t)(w->rows * w->cols), cudaMemcpyHostToDevice, cb->stream),
                    err);
        RP_CUDA_TRY(cudaMemcpyAsync(scale, w->scale, (size_t)w->rows * sizeof(float), cudaMemcpyHostToDevice,
                                    cb->stream),
                    err);
        return 0;
    }
    if (put_weight(cb, staging, kind, layer, err)) return RP_ERR;
    RP_LAUNCH(rp_k_quant_fp8_rows(staging, w->rows, w->cols, q, scale, cb->stream), err);
    return 0;
}

static int64_t weight_rows(const rp_model *m, rp_weight_kind kind) { return rp_model_weight(m, kind, 0)->rows; }
static size_t weight_elems(const rp_model *m, rp_weight_kind kind) {
    const rp_weight *w = rp_model_weight(m, kind, 0);
    return (size_t)(w->rows * w->cols);
}

/* Bump allocation in 256-byte aligned pieces: a first pass with base NULL
 * only measures, the second places. */
typedef struct {
    uint8_t *base;
    size_t off;
} layout;
static void *take(layout *l, size_t bytes) {
    void *p = l->base ? l->base + l->off : NULL;
    l->off += (bytes + 255) & ~(size_t)255;
    return p;
}

/* A matrix of rows x cols: bf16, or e4m3 and a scale per row or a grid of
 * block scales. */
static rp_cuda_mat take_mat(layout *l, int64_t rows, int64_t cols, rp_fp8_layout fp8) {
    rp_cuda_mat m = {0};
    m.w = take(l, (size_t)(rows * cols) * (fp8 ? 1 : 2));
    if (fp8 == RP_FP8_ROWS) m.scale = take(l, (size_t)rows * sizeof(float));
    if (fp8 == RP_FP8_BLOCKS)
        m.grid = take(l, (size_t)((rows + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK) * (size_t)rp_fp8_grid_ld((int)cols) *
                             sizeof(float));
    return m;
}

/* Where every weight goes (the first pass: only how much room). */
static void place(rp_cuda_backend *cb, layout *l) {
    const rp_model *m = cb->base.model;
    const rp_model_config *c = &m->cfg;
    const int has_qk = c->arch->has_qk_norm, has_bias = c->arch->has_qkv_bias, tied = c->tie_word_embeddings;
    const rp_fp8_layout fp8 = cb->w.fp8;
    const int64_t H = c->hidden_size;
    cb->w.embed = take(l, weight_elems(m, RP_W_EMBED) * 2);
    cb->w.final_norm = take(l, (size_t)H * 2);
    cb->w.lm_head = tied ? cb->w.embed : take(l, weight_elems(m, RP_W_LM_HEAD) * 2);
    for (int li = 0; li < c->num_layers; li++) {
        rp_cuda_layer *ly = &cb->w.layers[li];
        ly->attn_norm = take(l, (size_t)H * 2);
        ly->qkv = take_mat(l, weight_rows(m, RP_W_Q) + 2 * weight_rows(m, RP_W_K), H, fp8);
        ly->o = take_mat(l, H, weight_rows(m, RP_W_Q), fp8);
        ly->q_norm = has_qk ? take(l, weight_elems(m, RP_W_Q_NORM) * 2) : NULL;
        ly->k_norm = has_qk ? take(l, weight_elems(m, RP_W_K_NORM) * 2) : NULL;
        ly->mlp_norm = take(l, (size_t)H * 2);
        ly->gu = take_mat(l, 2 * weight_rows(m, RP_W_GATE), H, fp8);
        ly->down = take_mat(l, H, weight_rows(m, RP_W_GATE), fp8);
        /* q, k, v in that order, as in a row of the qkv product */
        ly->bqkv = has_bias ? take(l, (weight_elems(m, RP_W_Q_BIAS) + 2 * weight_elems(m, RP_W_K_BIAS)) * 2) : NULL;
    }
}

int rp_cuda_upload_weights(rp_cuda_backend *cb, rp_err *err) {
    const rp_model *m = cb->base.model;
    const rp_model_config *c = &m->cfg;
    const int tied = c->tie_word_embeddings;
    cb->w.fp8 = m->fp8;
    layout l = {0};
    place(cb, &l);
    cb->w.bytes = l.off;
    if (rp_cuda_malloc(&cb->w.mem, cb->w.bytes, "weights", err)) return RP_ERR;
    l = (layout){.base = cb->w.mem};
    place(cb, &l);
    /* block grids: the padding of each row of blocks zeroed (kernels.h) */
    if (cb->w.fp8 == RP_FP8_BLOCKS) RP_CUDA_TRY(cudaMemsetAsync(cb->w.mem, 0, cb->w.bytes, cb->stream), err);
    /* fp8 with lazy dummy weights: each matrix is generated in bf16, then
     * quantized; the buffer then serves the cuBLASLt path's dequantized
     * matrix (the largest, gate_up, is two of the largest single weights) */
    const size_t deq_elems = 2 * weight_elems(m, RP_W_GATE) > weight_elems(m, RP_W_Q) + 2 * weight_elems(m, RP_W_K)
                                 ? 2 * weight_elems(m, RP_W_GATE)
                                 : weight_elems(m, RP_W_Q) + 2 * weight_elems(m, RP_W_K);
    if (cb->w.fp8 && rp_cuda_malloc((void **)&cb->w.deq, deq_elems * 2, "fp8 weights' dequantized matrix", err))
        return RP_ERR;
    rp_bf16 *staging = cb->w.deq; /* one matrix at a time: the stream orders its uses */
    if (put_weight(cb, cb->w.embed, RP_W_EMBED, 0, err) || put_weight(cb, cb->w.final_norm, RP_W_FINAL_NORM, 0, err) ||
        (!tied && put_weight(cb, cb->w.lm_head, RP_W_LM_HEAD, 0, err)))
        return RP_ERR;
    const int64_t q_rows = weight_rows(m, RP_W_Q), kv_rows = weight_rows(m, RP_W_K), f = weight_rows(m, RP_W_GATE);
    for (int li = 0; li < c->num_layers; li++) {
        const rp_cuda_layer *ly = &cb->w.layers[li];
        if (put_weight(cb, ly->attn_norm, RP_W_ATTN_NORM, li, err) ||
            put_matrix(cb, &ly->qkv, 0, RP_W_Q, li, staging, err) ||
            put_matrix(cb, &ly->qkv, q_rows, RP_W_K, li, staging, err) ||
            put_matrix(cb, &ly->qkv, q_rows + kv_rows, RP_W_V, li, staging, err) ||
            put_matrix(cb, &ly->o, 0, RP_W_O, li, staging, err) ||
            (ly->q_norm && put_weight(cb, ly->q_norm, RP_W_Q_NORM, li, err)) ||
            (ly->k_norm && put_weight(cb, ly->k_norm, RP_W_K_NORM, li, err)) ||
            put_weight(cb, ly->mlp_norm, RP_W_MLP_NORM, li, err) ||
            put_matrix(cb, &ly->gu, 0, RP_W_GATE, li, staging, err) ||
            put_matrix(cb, &ly->gu, f, RP_W_UP, li, staging, err) ||
            put_matrix(cb, &ly->down, 0, RP_W_DOWN, li, staging, err))
            return RP_ERR;
        if (ly->bqkv && (put_weight(cb, ly->bqkv, RP_W_Q_BIAS, li, err) ||
                         put_weight(cb, ly->bqkv + weight_elems(m, RP_W_Q_BIAS), RP_W_K_BIAS, li, err) ||
                         put_weight(cb, ly->bqkv + weight_elems(m, RP_W_Q_BIAS) + weight_elems(m, RP_W_K_BIAS),
                                    RP_W_V_BIAS, li, err)))
            return RP_ERR;
    }
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    return 0;
}

/* Block-scaled fp8: products of more than RP_GEMV_MAX_T tokens take
 * cuBLASLt's block-scaled FP8 matmul where it has an algorithm for the
 * model's products at the fewest tokens and at the most, each padded to a
 * multiple of RP_GEMM_FP8_BLOCKS_T_ALIGN as every product is (asked now, as
 * for row scales; other counts are asked as they come, and one it refuses
 * then fails the step, naming the shape), with
 * the activations quantized per token and 128 k; otherwise each matrix is
 * dequantized to bf16 first (deq). */
static int fp8_blocks_setup(rp_cuda_backend *cb, int T, int kmax, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    const int H = c->hidden_size, F = c->intermediate_size;
    rp_err why;
    /* the fewest tokens it takes and the most, padded as the products are */
    const int counts[2] = {rp_gemm_fp8_blocks_pad(RP_GEMV_MAX_T + 1), rp_gemm_fp8_blocks_pad(T)};
    cb->w.fp8_lt = T > RP_GEMV_MAX_T;
    for (int i = 0; i < 2 && cb->w.fp8_lt; i++)
        cb->w.fp8_lt = rp_gemm_fp8_blocks_supported(&cb->gemm, counts[i], cb->qkv_dim, H, 0, &why) &&
                       rp_gemm_fp8_blocks_supported(&cb->gemm, counts[i], H, cb->q_dim, 1, &why) &&
                       rp_gemm_fp8_blocks_supported(&cb->gemm, counts[i], 2 * F, H, 1, &why) &&
                       rp_gemm_fp8_blocks_supported(&cb->gemm, counts[i], H, F, 1, &why);
    if (T <= RP_GEMV_MAX_T) return 0; /* every product is a GEMV */
    if (!cb->w.fp8_lt) {
        rp_log_info("cuda: %s: with 128x128 block-scaled fp8 weights, products of more than %d tokens dequantize "
                    "each matrix to bf16 (slower than bf16 weights)",
                    why.msg, RP_GEMV_MAX_T);
        return 0;
    }
    const size_t groups = (size_t)((kmax + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK);
    const int Tp = rp_gemm_fp8_blocks_pad(T);
    if (rp_cuda_malloc((void **)&cb->w.xq, (size_t)Tp * (size_t)kmax, "fp8 activations", err) ||
        rp_cuda_malloc((void **)&cb->w.x_scale, groups * (size_t)rp_fp8_act_ld(Tp) * sizeof(float),
                       "fp8 activation scales", err))
        return RP_ERR;
    rp_cuda_free(cb->w.deq); /* the upload's staging: cuBLASLt reads the fp8 bytes as they are */
    cb->w.deq = NULL;
    rp_log_info("cuda: 128x128 block-scaled fp8 weights: decode GEMVs of up to %d tokens, cuBLASLt's block-scaled "
                "FP8 matmul beyond",
                RP_GEMV_MAX_T);
    return 0;
}

int rp_cuda_fp8_setup(rp_cuda_backend *cb, rp_err *err) {
    if (!cb->w.fp8) return 0;
    const rp_model_config *c = &cb->base.model->cfg;
    const int H = c->hidden_size, T = cb->base.cfg.max_batched_tokens;
    int kmax = H > cb->q_dim ? H : cb->q_dim;
    if (c->intermediate_size > kmax) kmax = c->intermediate_size;
    if (cb->w.fp8 == RP_FP8_BLOCKS) return fp8_blocks_setup(cb, T, kmax, err);
    rp_err why;
    cb->w.fp8_lt = rp_gemm_fp8_supported(&cb->gemm, T, H, H, &why);
    if (cb->w.fp8_lt && 2 * c->intermediate_size < cb->qkv_dim) { /* qkv's raw sums go to gate_up's buffer */
        cb->w.fp8_lt = 0;
        snprintf(why.msg, sizeof why.msg, "the qkv product is wider than gate_up's");
    }
    if (!cb->w.fp8_lt) {
        rp_log_warn("cuda: %s: with fp8 weights, products of more than %d tokens dequantize each matrix to bf16 "
                    "(slower than bf16 weights)",
                    why.msg, RP_GEMV_FP8_MAX_T);
        return 0;
    }
    /* cuBLASLt applying both scales (outer vectors) from RP_FP8_OUTER_MIN_T
     * tokens, asked for the model's products at that count and at the most;
     * fewer tokens, or none such, take its raw sums and a scaling pass */
    const int F = c->intermediate_size, counts[2] = {RP_FP8_OUTER_MIN_T, T};
    cb->w.fp8_outer = T >= RP_FP8_OUTER_MIN_T;
    for (int i = 0; i < 2 && cb->w.fp8_outer; i++)
        cb->w.fp8_outer = rp_gemm_fp8_outer_supported(&cb->gemm, counts[i], cb->qkv_dim, H, 0, &why) &&
                          rp_gemm_fp8_outer_supported(&cb->gemm, counts[i], H, cb->q_dim, 1, &why) &&
                          rp_gemm_fp8_outer_supported(&cb->gemm, counts[i], 2 * F, H, 1, &why) &&
                          rp_gemm_fp8_outer_supported(&cb->gemm, counts[i], H, F, 1, &why);
    if (!cb->w.fp8_outer && T >= RP_FP8_OUTER_MIN_T)
        rp_log_info("cuda: %s: fp8 products of %d tokens and more take cuBLASLt's raw sums and a scaling pass",
                    why.msg, RP_FP8_OUTER_MIN_T);
    if (rp_cuda_malloc((void **)&cb->w.xq, (size_t)T * (size_t)kmax, "fp8 activations", err) ||
        rp_cuda_malloc((void **)&cb->w.x_scale, (size_t)T * sizeof(float), "fp8 activation scales", err))
        return RP_ERR;
    rp_cuda_free(cb->w.deq); /* the upload's staging: cuBLASLt reads the fp8 bytes as they are */
    cb->w.deq = NULL;
    return 0;
}

