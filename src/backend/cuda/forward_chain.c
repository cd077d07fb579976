/* The forward pass as a chain of kernels: embedding, per layer the norm, the
 * qkv product, q/k norm with RoPE and the KV store, decode or prefill
 * attention, the o, gate_up and down products, then the final norm, the
 * lm_head over the rows that want logits, and sampling. Few tokens take the
 * GEMV (fused with the norms, SwiGLU and the residual add at one token),
 * more take cuBLASLt. rp_cuda_launch_forward is also the door to the
 * one-kernel decode step (forward_decode_step.c), which replaces the whole
 * chain for 1-4 sequences of one token where it runs.
 *
 * Under tensor parallelism (cb->comm) the chain runs the rank's shard and
 * meets the other ranks where the math needs the whole: the embedding and
 * the o_proj and down_proj products are sums over the ranks (all-reduced in
 * fp32 in cb->residual and cb->tmp, the precision one GPU keeps them in),
 * and the lm_head's logits are one vocabulary shard (all-gathered, then laid
 * out as the whole vocabulary). The collectives go on the stream like the
 * kernels, so a captured step holds them. */
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/sample_top.h"

int rp_cuda_decode_splits(const rp_cuda_backend *cb, int num_seqs) {
    /* At most two (sequence, kv head, split) blocks per SM. Rounding up
     * (at least two per SM) cost batches 8 and 16 3-8% per step at ctx 512
     * and up to 16% at ctx 2048 (qwen3-0.6b; llama3-8b 1-6%): a third
     * block per SM only adds a merge input and a short split's ramp-up
     * (bench/RESULTS.md; `replay bench kernels --attn-sweep` times every
     * split count). */
    int want = 2 * cb->num_sms / (num_seqs * cb->nkv);
    if (want < 1) want = 1;
    if (want > cb->max_splits) want = cb->max_splits;
    return want;
}

/* Layer l's attention, shared by both paths: the q/k/v biases, q/k norm,
 * RoPE and the KV store on the fused qkv, then decode or prefill attention
 * into cb->attn. */
static int launch_attention(rp_cuda_backend *cb, int l, int T, int S, const rp_attn_step_shape *step,
                            rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    const rp_cuda_layer *ly = &cb->w.layers[l];
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->meta.dev;
    const int32_t *pos = RP_META(cb, d, off_positions, int32_t), *slots = RP_META(cb, d, off_slots, int32_t);
    rp_attn_meta am = rp_cuda_device_attn_meta(cb);
    const float eps = (float)c->rms_norm_eps;
    const rp_kv_cache kv = rp_cuda_kv_layer(cb, l);
    rp_cuda_prof_mark(cb, "qk_norm_rope_store");
    RP_LAUNCH(rp_k_qk_norm_rope_store(cb->qkv, ly->bqkv, ly->q_norm, ly->k_norm, cb->inv_freq, cb->rope_scale, pos,
                                      slots, kv, T, c->num_heads, c->num_kv_heads, c->head_dim, eps, st),
              err);
    rp_cuda_prof_mark(cb, step ? "attn (step)" : "attn_decode");
    if (!step)
        RP_LAUNCH(rp_k_attn_decode(cb->qkv, kv, am, cb->attn, cb->attn_ws, S, c->num_heads, c->num_kv_heads,
                                   c->head_dim, rp_cuda_decode_splits(cb, S), st),
                  err);
    else {
        am.hdr = RP_META(cb, d, off_attn_hdr, int32_t);
        am.pf_items = RP_META(cb, d, off_pf_items, int32_t);
        RP_LAUNCH(rp_k_attn_step(cb->qkv, kv, am, cb->attn, cb->attn_ws, step, c->num_heads, c->num_kv_heads,
                                 c->head_dim, st),
                  err);
    }
    return 0;
}

/* Tensor parallelism: buf (n floats) summed over the ranks, in place, with
 * a profile mark of its own (the all-reduce time per step). */
static int tp_all_reduce(rp_cuda_backend *cb, float *buf, size_t n, const char *what, rp_err *err) {
    rp_cuda_prof_mark(cb, what);
    return rp_comm_all_reduce_sum(cb->comm, buf, n, RP_COMM_F32, cb->stream, err);
}

/* Tensor parallelism: the embedding of the rank's vocabulary rows (zeros
 * for the others' tokens), summed over the ranks. */
static int tp_embed(rp_cuda_backend *cb, const int32_t *tokens, int T, int H, rp_err *err) {
    rp_cuda_prof_mark(cb, "embed (shard)");
    RP_LAUNCH(rp_k_embed_shard(cb->w.embed, tokens, cb->d_tokens, cb->residual, cb->vocab_start, cb->vocab_count, T, H,
                               cb->stream),
              err);
    return tp_all_reduce(cb, cb->residual, (size_t)T * H, "all_reduce embed", err);
}

/* Tensor parallelism: every rank's logit shard of the rows, gathered and
 * laid out whole in cb->logits. */
int rp_cuda_tp_gather_logits(rp_cuda_backend *cb, int rows, rp_err *err) {
    rp_cuda_prof_mark(cb, "all_gather logits");
    if (rp_comm_all_gather(cb->comm, cb->logits_shard, cb->logits_gather, (size_t)rows * cb->vocab_per_rank,
                           RP_COMM_F32, cb->stream, err))
        return RP_ERR;
    rp_cuda_prof_mark(cb, "unshard logits");
    RP_LAUNCH(rp_k_tp_unshard_logits(cb->logits_gather, cb->logits, rows, cb->base.cfg.tp.size,
                                     (int)cb->vocab_per_rank, cb->vocab, cb->stream),
              err);
    return 0;
}

/* Samples every logit row, then finds the most likely tokens of the rows
 * that ask for top logprobs (a block per row that returns at once for the
 * others), all on fixed buffers. */
int rp_cuda_launch_sample(rp_cuda_backend *cb, int num_logits, const int32_t *skip, rp_err *err) {
    const int V = cb->vocab; /* the whole vocabulary, also under tensor parallelism */
    const rp_sampling_params *params = RP_META(cb, cb->meta.dev, off_params, rp_sampling_params);
    rp_cuda_prof_mark(cb, "sample");
    /* the results also straight into the slot's pinned buffer (no copy) */
    const rp_sample_host host = {.rows = {cb->slots[0].d_tokens_host, cb->slots[1].d_tokens_host},
                                 .slot = RP_META(cb, cb->meta.dev, off_out_slot, int32_t),
                                 .stride = cb->max_logits};
    RP_LAUNCH(rp_k_sample_kept(cb->logits, params, cb->d_tokens, cb->d_logprobs, cb->d_kept,
                               cb->slots[0].d_tokens_host ? &host : NULL, skip, cb->sample_ws, num_logits, V,
                               cb->stream),
              err);
    rp_cuda_prof_mark(cb, "top logprobs");
    RP_LAUNCH(rp_k_top_logprobs(cb->logits, params, cb->d_tokens, cb->d_logprobs, cb->d_kept, cb->d_top, skip,
                                num_logits, V, cb->stream),
              err);
    return 0;
}

/* y = x W^T for T tokens through layer matrix mat [N][K] (gemm.h's rules
 * for bf16). fp8 weights: the fp8 GEMV up to RP_GEMV_FP8_MAX_T tokens (it
 * reads half the bytes of bf16, once for all the tokens, activations
 * unquantized); more tokens take cuBLASLt's FP8 matmul with the
 * activations quantized per token, or, where cuBLASLt has none, the
 * matrix dequantized to bf16 (correct, but slower than bf16 weights). Only
 * the qkv product has a bf16 y, and gate_up's buffer is wider (checked in
 * rp_cuda_fp8_setup). */
/* Block-scaled fp8 (mat->grid): the block-scaled GEMV up to RP_GEMV_MAX_T
 * tokens; more take cuBLASLt's block-scaled FP8 matmul with the
 * activations quantized per token and 128 k (it applies both scales and
 * writes y itself), or, where it has none, the matrix dequantized to bf16. */
static int mat_product_blocks(rp_cuda_backend *cb, const rp_cuda_mat *mat, const rp_bf16 *x, void *y, int T, int N,
                              int K, int out_f32, rp_err *err) {
    if (T <= RP_GEMV_MAX_T) {
        rp_gemv_in in = {.mode = RP_GEMV_IN_BF16, .x = x};
        rp_gemv_out out = {.mode = out_f32 ? RP_GEMV_OUT_F32 : RP_GEMV_OUT_BF16, .y = y};
        RP_LAUNCH(rp_k_gemv_fused_fp8_blocks(mat->w, mat->grid, in, out, T, N, K, cb->stream), err);
        return 0;
    }
    if (cb->w.fp8_lt) { /* y's buffers have room for the pad rows (alloc_activations) */
        const int Tp = rp_gemm_fp8_blocks_pad(T);
        RP_LAUNCH(rp_k_quant_fp8_act_groups(x, T, Tp, K, cb->w.xq, cb->w.x_scale, cb->stream), err);
        return rp_gemm_run_fp8_blocks(&cb->gemm, mat->w, mat->grid, cb->w.xq, cb->w.x_scale, y, Tp, N, K, out_f32,
                                      cb->stream, err);
    }
    RP_LAUNCH(rp_k_dequant_fp8_blocks(mat->w, mat->grid, rp_fp8_grid_ld(K), N, K, cb->w.deq, cb->stream), err);
    return rp_gemm_run(&cb->gemm, cb->w.deq, x, y, T, N, K, out_f32, cb->stream, err);
}

/* Row-scaled W8A8 (--quantization fp8 past the GEMV): whether the product
 * runs through cuBLASLt with x quantized per token (mat_w8a8), and whether
 * it leaves raw sums for a scaling pass (mat_w8a8_raw; else cuBLASLt's
 * outer-vector mode scales). The chain folds that quantization into the
 * norm before qkv and gate_up and that scaling into the norm after o and
 * down (rp_k_add_rmsnorm_fp8): each was a kernel of its own, 4 of a
 * layer's 17 at 32 tokens (bench/RESULTS.md, issue 39). */
static int mat_w8a8(const rp_cuda_backend *cb, const rp_cuda_mat *mat, int T) {
    return mat->scale && !mat->grid && T > RP_GEMV_FP8_MAX_T &&
           ((cb->w.fp8_outer && T >= RP_FP8_OUTER_MIN_T) || cb->w.fp8_lt);
}
static int mat_w8a8_raw(const rp_cuda_backend *cb, const rp_cuda_mat *mat, int T) {
    return mat_w8a8(cb, mat, T) && !(cb->w.fp8_outer && T >= RP_FP8_OUTER_MIN_T);
}
/* mat_product's flags for such products: FP8_XQ, x is already quantized in
 * cb->w.xq / x_scale; FP8_RAW, y (fp32) keeps the raw sums, which the next
 * norm scales by x_scale and mat->scale. */
enum { FP8_XQ = 1, FP8_RAW = 2 };

static int mat_product(rp_cuda_backend *cb, const rp_cuda_mat *mat, const rp_bf16 *x, void *y, int T, int N, int K,
                       int out_f32, int flags, rp_err *err) {
    if (mat->grid) return mat_product_blocks(cb, mat, x, y, T, N, K, out_f32, err);
    if (!mat->scale) return rp_gemm_run(&cb->gemm, mat->w, x, y, T, N, K, out_f32, cb->stream, err);
    if (T <= RP_GEMV_FP8_MAX_T) {
        RP_LAUNCH(rp_k_gemv_fp8(mat->w, mat->scale, x, y, out_f32, T, N, K, cb->stream), err);
        return 0;
    }
    if (mat_w8a8(cb, mat, T) && !(flags & FP8_XQ)) /* vLLM's dynamic FP8: x per token */
        RP_LAUNCH(rp_k_quant_fp8_act_rows(x, T, K, cb->w.xq, cb->w.x_scale, cb->stream), err);
    if (cb->w.fp8_outer && T >= RP_FP8_OUTER_MIN_T) /* W8A8, both scales applied by cuBLASLt */
        return rp_gemm_run_fp8_outer(&cb->gemm, mat->w, mat->scale, cb->w.xq, cb->w.x_scale, y, T, N, K, out_f32,
                                     cb->stream, err);
    if (cb->w.fp8_lt) {
        /* W8A8: the raw sums in fp32 (in y itself, or in gate_up's buffer,
         * free until the gate_up product, for qkv's bf16 y), then both scales
         * (or, with FP8_RAW, the next norm applies them) */
        float *raw = out_f32 ? y : cb->gate_up;
        if (rp_gemm_run_fp8(&cb->gemm, mat->w, cb->w.xq, raw, T, N, K, cb->stream, err)) return RP_ERR;
        if (!(flags & FP8_RAW) || !out_f32)
            RP_LAUNCH(rp_k_scale_outer(raw, cb->w.x_scale, mat->scale, y, out_f32, T, N, cb->stream), err);
        return 0;
    }
    RP_LAUNCH(rp_k_dequant_fp8_rows(mat->w, mat->scale, N, K, cb->w.deq, cb->stream), err);
    return rp_gemm_run(&cb->gemm, cb->w.deq, x, y, T, N, K, out_f32, cb->stream, err);
}

/* Whether mat_product runs a GEMV (the profile's labels). */
static int mat_uses_gemv(const rp_cuda_backend *cb, const rp_cuda_mat *mat, int T, int N, int K) {
    if (mat->grid) return T <= RP_GEMV_MAX_T;
    return mat->scale ? T <= RP_GEMV_FP8_MAX_T : rp_gemm_uses_gemv(&cb->gemm, T, N, K);
}

/* The fused GEMV on a layer matrix, bf16 or fp8. */
static int gemv_mat(const rp_cuda_mat *mat, rp_gemv_in in, rp_gemv_out out, int T, int N, int K, cudaStream_t st) {
    if (mat->grid) return rp_k_gemv_fused_fp8_blocks(mat->w, mat->grid, in, out, T, N, K, st);
    return mat->scale ? rp_k_gemv_fused_fp8(mat->w, mat->scale, in, out, T, N, K, st)
                      : rp_k_gemv_fused(mat->w, in, out, T, N, K, st);
}

/* The fused path, for one token (T = 1: a decode step of one sequence
 * where the one-kernel step does not run, because the model's shapes or the
 * GPU do not allow it or rp_tuning.disable_decode_step is set, and prefill
 * chunks of one token). The residual stream stays fp32 in cb->residual;
 * each GEMV that adds into it also leaves per-block partial sums of squares
 * in cb->ss_parts, from which the next GEMV normalises its input on the
 * fly. Same math as the unfused path (the sum of squares is added in
 * another order). At T = 1 it saves ~4% a step on qwen3-0.6b against the
 * unfused chain and is even on llama3-8b; at T = 8 staging 8 normalised
 * rows per block costs more than the launches it saves (llama3-8b 12.2
 * against 7.0 ms; bench/RESULTS.md), so more tokens take the unfused
 * chain. */
#define FUSED_MAX_T 1

static int launch_forward_fused(rp_cuda_backend *cb, int T, int S, int num_logits,
                                const rp_attn_step_shape *step, int sample, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->meta.dev;
    const int32_t *tokens = RP_META(cb, d, off_tokens, int32_t),
                  *logit_token = RP_META(cb, d, off_logit_token, int32_t);
    const int H = c->hidden_size, F = c->intermediate_size, P = cb->ss_num_parts;
    const float eps = (float)c->rms_norm_eps;
    const rp_gemv_out to_residual = {.mode = RP_GEMV_OUT_RESIDUAL, .residual = cb->residual, .ss_parts = cb->ss_parts};
    rp_gemv_in normed = {.mode = RP_GEMV_IN_RMSNORM, .residual = cb->residual, .ss_parts = cb->ss_parts,
                         .num_parts = P, .eps = eps};
    rp_cuda_prof_mark(cb, "embed");
    RP_LAUNCH(rp_k_embed(cb->w.embed, tokens, cb->d_tokens, cb->residual, cb->ss_parts, P, T, H, st), err);
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->w.layers[l];
        rp_cuda_prof_mark(cb, "gemv qkv (+rmsnorm)");
        normed.norm_w = ly->attn_norm;
        RP_LAUNCH(gemv_mat(&ly->qkv, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_BF16, .y = cb->qkv}, T,
                                  cb->qkv_dim, H, st),
                  err);
        if (launch_attention(cb, l, T, S, step, err)) return RP_ERR;
        rp_cuda_prof_mark(cb, "gemv o (+residual)");
        RP_LAUNCH(gemv_mat(&ly->o, (rp_gemv_in){.mode = RP_GEMV_IN_BF16, .x = cb->attn}, to_residual, T, H,
                                  cb->q_dim, st),
                  err);
        rp_cuda_prof_mark(cb, "gemv gate_up (+rmsnorm)");
        normed.norm_w = ly->mlp_norm;
        RP_LAUNCH(gemv_mat(&ly->gu, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_F32, .y = cb->gate_up}, T,
                                  2 * F, H, st),
                  err);
        if (rp_gemv_stage_fits(T, F)) {
            rp_cuda_prof_mark(cb, "gemv down (+silu, residual)");
            RP_LAUNCH(gemv_mat(&ly->down, (rp_gemv_in){.mode = RP_GEMV_IN_SILU, .gate_up = cb->gate_up},
                                      to_residual, T, H, F, st),
                      err);
        } else { /* the SwiGLU rows do not fit in a block's shared memory */
            rp_cuda_prof_mark(cb, "silu_mul");
            RP_LAUNCH(rp_k_silu_mul(cb->gate_up, cb->act, T, F, st), err);
            rp_cuda_prof_mark(cb, "gemv down (+residual)");
            RP_LAUNCH(gemv_mat(&ly->down, (rp_gemv_in){.mode = RP_GEMV_IN_BF16, .x = cb->act}, to_residual, T,
                                      H, F, st),
                      err);
        }
    }
    rp_cuda_prof_mark(cb, "gemv lm_head (+rmsnorm, gather)");
    normed.norm_w = cb->w.final_norm;
    normed.rows = logit_token;
    RP_LAUNCH(rp_k_gemv_fused(cb->w.lm_head, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_F32, .y = cb->logits},
                              num_logits, c->vocab_size, H, st),
              err);
    if (sample && rp_cuda_launch_sample(cb, num_logits, RP_META(cb, d, off_skip_sample, int32_t), err)) return RP_ERR;
    rp_cuda_prof_mark(cb, NULL);
    return 0;
}

/* sample: RP_SAMPLE_PICK is every row greedy with no top logprobs, which
 * the one-kernel step picks itself. */
int rp_cuda_launch_forward(rp_cuda_backend *cb, int T, int S, int num_logits, int decode,
                           const rp_attn_step_shape *step, int sample, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->meta.dev;
    const int32_t *tokens = RP_META(cb, d, off_tokens, int32_t),
                  *logit_token = RP_META(cb, d, off_logit_token, int32_t);
    const int H = c->hidden_size, F = c->intermediate_size;
    const float eps = (float)c->rms_norm_eps;
    cb->prof_n = 0;
    /* 1 to 4 sequences of one token: the whole step is one persistent
     * kernel where the shapes allow (forward_decode_step.c) */
    if (rp_cuda_decode_step_nb(cb, T, S, num_logits, decode))
        return rp_cuda_launch_decode_step(cb, S, num_logits, sample, err);
    /* Few tokens (decode, tiny prefill chunks): every matrix product is a
     * GEMV with its norm, SwiGLU or residual add fused in, so a layer is 4
     * GEMVs + RoPE + attention. More tokens: cuBLASLt and separate kernels.
     * The choice depends on T only, so a graph and an eager run of the same
     * batch do the same arithmetic. */
    if (!decode && !step) return rp_errf(err, "a forward with prompt chunks needs its step's shape");
    if (decode) step = NULL;
    if (T <= FUSED_MAX_T && rp_gemv_stage_fits(T, H) && !cb->comm)
        return launch_forward_fused(cb, T, S, num_logits, step, sample, err);
    if (cb->comm) {
        if (tp_embed(cb, tokens, T, H, err)) return RP_ERR;
    } else {
        rp_cuda_prof_mark(cb, "embed");
        RP_LAUNCH(rp_k_embed(cb->w.embed, tokens, cb->d_tokens, cb->residual, NULL, 0, T, H, st), err);
    }
    /* W8A8 folds (mat_w8a8): not under tensor parallelism, where the o and
     * down sums are all-reduced before the norm and each rank's activation
     * scales are its own */
    const int fold = !cb->comm;
    float *xq_scale = cb->w.x_scale;
    const float *raw_sw = NULL; /* cb->tmp holds raw sums of a matrix with these row scales */
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->w.layers[l];
        const int q_qkv = fold && mat_w8a8(cb, &ly->qkv, T), q_gu = fold && mat_w8a8(cb, &ly->gu, T);
        rp_cuda_prof_mark(cb, "add_rmsnorm");
        RP_LAUNCH(rp_k_add_rmsnorm_fp8(cb->residual, l ? cb->tmp : NULL, raw_sw ? xq_scale : NULL, raw_sw,
                                       ly->attn_norm, cb->xn, q_qkv ? cb->w.xq : NULL, q_qkv ? xq_scale : NULL, T, H,
                                       eps, st),
                  err);
        rp_cuda_prof_mark(cb, mat_uses_gemv(cb, &ly->qkv, T, cb->qkv_dim, H) ? "gemv qkv" : "gemm qkv");
        if (mat_product(cb, &ly->qkv, cb->xn, cb->qkv, T, cb->qkv_dim, H, 0, q_qkv ? FP8_XQ : 0, err)) return RP_ERR;
        if (launch_attention(cb, l, T, S, step, err)) return RP_ERR;
        rp_cuda_prof_mark(cb, mat_uses_gemv(cb, &ly->o, T, H, cb->q_dim) ? "gemv o" : "gemm o");
        const int raw_o = fold && mat_w8a8_raw(cb, &ly->o, T);
        if (mat_product(cb, &ly->o, cb->attn, cb->tmp, T, H, cb->q_dim, 1, raw_o ? FP8_RAW : 0, err)) return RP_ERR;
        raw_sw = raw_o ? ly->o.scale : NULL;
        if (cb->comm && tp_all_reduce(cb, cb->tmp, (size_t)T * H, "all_reduce o", err)) return RP_ERR;
        rp_cuda_prof_mark(cb, "add_rmsnorm");
        RP_LAUNCH(rp_k_add_rmsnorm_fp8(cb->residual, cb->tmp, raw_sw ? xq_scale : NULL, raw_sw, ly->mlp_norm, cb->xn,
                                       q_gu ? cb->w.xq : NULL, q_gu ? xq_scale : NULL, T, H, eps, st),
                  err);
        rp_cuda_prof_mark(cb, mat_uses_gemv(cb, &ly->gu, T, 2 * F, H) ? "gemv gate_up" : "gemm gate_up");
        if (mat_product(cb, &ly->gu, cb->xn, cb->gate_up, T, 2 * F, H, 1, q_gu ? FP8_XQ : 0, err)) return RP_ERR;
        rp_cuda_prof_mark(cb, "silu_mul");
        RP_LAUNCH(rp_k_silu_mul(cb->gate_up, cb->act, T, F, st), err);
        rp_cuda_prof_mark(cb, mat_uses_gemv(cb, &ly->down, T, H, F) ? "gemv down" : "gemm down");
        const int raw_down = fold && mat_w8a8_raw(cb, &ly->down, T);
        if (mat_product(cb, &ly->down, cb->act, cb->tmp, T, H, F, 1, raw_down ? FP8_RAW : 0, err)) return RP_ERR;
        raw_sw = raw_down ? ly->down.scale : NULL;
        if (cb->comm && tp_all_reduce(cb, cb->tmp, (size_t)T * H, "all_reduce down", err)) return RP_ERR;
    }
    rp_cuda_prof_mark(cb, "add_rmsnorm");
    RP_LAUNCH(rp_k_add_rmsnorm_fp8(cb->residual, cb->tmp, raw_sw ? xq_scale : NULL, raw_sw, cb->w.final_norm, cb->xn,
                                   NULL, NULL, T, H, eps, st),
              err);
    rp_cuda_prof_mark(cb, "gather_rows");
    RP_LAUNCH(rp_k_gather_rows(cb->xn, logit_token, cb->logit_in, num_logits, H, st), err);
    rp_cuda_prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, num_logits, c->vocab_size, H) ? "gemv lm_head" : "gemm lm_head");
    if (rp_gemm_run(&cb->gemm, cb->w.lm_head, cb->logit_in, cb->comm ? cb->logits_shard : cb->logits, num_logits,
                    c->vocab_size, H, 1, st, err))
        return RP_ERR;
    if (cb->comm && rp_cuda_tp_gather_logits(cb, num_logits, err)) return RP_ERR;
    if (sample && rp_cuda_launch_sample(cb, num_logits, RP_META(cb, d, off_skip_sample, int32_t), err)) return RP_ERR;
    rp_cuda_prof_mark(cb, NULL);
    return 0;
}
