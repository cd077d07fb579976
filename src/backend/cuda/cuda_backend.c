/* The CUDA backend for Hopper: the device memory plan, weight upload, the
 * per-step metadata block, and the forward pass as a sequence of kernel
 * launches that is either run eagerly or replayed from a captured graph
 * (graph_runner.c).
 *
 * Everything is allocated in rp_backend_cuda_new: weights (bf16, q/k/v and
 * gate/up fused so each is one GEMV), the paged KV cache plus one dummy page
 * for padded graph slots, every activation sized for the largest batch, the
 * logits, and the metadata block. A step packs its metadata (tokens,
 * positions, slot mapping, per-sequence offsets and KV lengths, the pages of
 * each sequence, sampling parameters) into pinned host memory and copies it
 * with one cudaMemcpyAsync to fixed device addresses that every kernel, and
 * so every captured graph, reads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/sample_top.h"
#include "model/rope.h"
#include "util/log.h"

#define LT_WORKSPACE_BYTES (64u << 20)

int rp_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int rp_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

/* ---- weights ------------------------------------------------------------ */

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
    float scale;
    int is_norm;
    rp_weight_kind gen_kind = kind;
    if (kind == RP_W_LM_HEAD && m->cfg.tie_word_embeddings) gen_kind = RP_W_EMBED;
    rp_dummy_weight_params(&m->cfg, gen_kind, layer, &stream_id, &scale, &is_norm);
    RP_LAUNCH(rp_k_fill_dummy(dst, (int64_t)n, m->dummy_seed, stream_id, scale, is_norm, cb->stream), err);
    return 0;
}

static size_t weight_elems(const rp_model *m, rp_weight_kind kind) {
    const rp_weight *w = rp_model_weight(m, kind, 0);
    return (size_t)(w->rows * w->cols);
}

/* Lays out all weights in one allocation (256-byte aligned pieces). */
static int upload_weights(rp_cuda_backend *cb, rp_err *err) {
    const rp_model *m = cb->base.model;
    const rp_model_config *c = &m->cfg;
    const int has_qk = c->arch->has_qk_norm, tied = c->tie_word_embeddings;
    size_t per_layer[RP_W_COUNT] = {0}, total = 0;
#define ALIGN_UP(x) (((x) + 127) & ~(size_t)127) /* elements: 256 bytes */
    for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
        if ((k == RP_W_Q_NORM || k == RP_W_K_NORM) && !has_qk) continue;
        per_layer[k] = ALIGN_UP(weight_elems(m, (rp_weight_kind)k));
        total += per_layer[k] * (size_t)c->num_layers;
    }
    size_t embed_n = ALIGN_UP(weight_elems(m, RP_W_EMBED)), norm_n = ALIGN_UP((size_t)c->hidden_size);
    total += embed_n + norm_n + (tied ? 0 : embed_n);
    cb->weights_bytes = total * 2;
    if (rp_cuda_malloc((void **)&cb->weights_mem, cb->weights_bytes, "weights", err)) return RP_ERR;
    rp_bf16 *p = cb->weights_mem;
    cb->embed = p;
    p += embed_n;
    cb->final_norm = p;
    p += norm_n;
    cb->lm_head = tied ? cb->embed : p;
    if (!tied) p += embed_n;
    if (put_weight(cb, cb->embed, RP_W_EMBED, 0, err) || put_weight(cb, cb->final_norm, RP_W_FINAL_NORM, 0, err) ||
        (!tied && put_weight(cb, cb->lm_head, RP_W_LM_HEAD, 0, err)))
        return RP_ERR;
    for (int l = 0; l < c->num_layers; l++) {
        rp_cuda_layer *ly = &cb->layers[l];
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

/* ---- metadata block ------------------------------------------------------- */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static int plan_meta(rp_cuda_backend *cb, rp_err *err) {
    const rp_backend_config *bc = &cb->base.cfg;
    size_t o = 0;
    const size_t T = (size_t)bc->max_batch_tokens, S = (size_t)cb->max_seqs, L = (size_t)cb->max_logits;
    cb->off_tokens = o, o += T * 4;
    cb->off_positions = o, o += T * 4;
    cb->off_slots = o, o += T * 4;
    cb->off_seq_start = o, o += (S + 1) * 4;
    cb->off_kv_len = o, o += S * 4;
    cb->off_page_row = o, o += S * 4;
    cb->off_logit_token = o, o += L * 4;
    cb->off_out_slot = o, o += 4; /* which host slot the step's results go to (rp_decode_step.pick_host) */
    o = align_up(o, 16);
    cb->off_params = o, o += L * sizeof(rp_sample_params);
    o = align_up(o, 16);
    /* The pages of every sequence in the batch, packed one after another;
     * seq_page_row[s] is where sequence s's list starts and the stride is 1,
     * so only the pages in use cross PCIe each step. Sharing pages between
     * sequences (a prefix cache) can list a page twice: room for that. */
    cb->page_capacity = (size_t)bc->num_pages + S * 2 + (size_t)cb->max_pages_per_seq;
    cb->off_pages = o, o += cb->page_capacity * 4;
    cb->meta_bytes = o;
    if (rp_cuda_malloc((void **)&cb->d_meta, o, "step metadata", err)) return RP_ERR;
    for (int k = 0; k < 2; k++) {
        RP_CUDA_TRY(cudaMallocHost((void **)&cb->h_meta_slot[k], o), err);
        memset(cb->h_meta_slot[k], 0, o);
    }
    cb->h_meta = cb->h_meta_slot[0];
    return 0;
}

#define META(cb, base, off, type) ((type *)((base) + (cb)->off))

/* memcpy with a null source is undefined even for 0 bytes, and a capture's
 * batch is empty (all padding) with null arrays. */
static void copy_bytes_n(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}

/* Packs a batch (padded to padded_seqs one-token dummy sequences when >
 * num_seqs) into the pinned block; returns the bytes to copy. */
static int pack_meta(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, size_t *copy_bytes, rp_err *err) {
    uint8_t *h = cb->h_meta;
    int32_t *tokens = META(cb, h, off_tokens, int32_t), *pos = META(cb, h, off_positions, int32_t),
            *slots = META(cb, h, off_slots, int32_t), *seq_start = META(cb, h, off_seq_start, int32_t),
            *kv_len = META(cb, h, off_kv_len, int32_t), *page_row = META(cb, h, off_page_row, int32_t),
            *logit_token = META(cb, h, off_logit_token, int32_t), *pages = META(cb, h, off_pages, int32_t);
    rp_sample_params *params = META(cb, h, off_params, rp_sample_params);
    const int ps = cb->base.cfg.page_size, S = bt->num_seqs, T = bt->num_tokens;
    const int32_t dummy_page = cb->base.cfg.num_pages;
    copy_bytes_n(tokens, bt->tokens, (size_t)T * 4);
    copy_bytes_n(pos, bt->positions, (size_t)T * 4);
    copy_bytes_n(slots, bt->slot_mapping, (size_t)T * 4);
    copy_bytes_n(seq_start, bt->seq_start, (size_t)(S + 1) * 4);
    copy_bytes_n(kv_len, bt->seq_kv_len, (size_t)S * 4);
    copy_bytes_n(logit_token, bt->logit_token, (size_t)bt->num_logits * 4);
    *META(cb, h, off_out_slot, int32_t) = cb->cur_slot;
    if (bt->sample) copy_bytes_n(params, bt->sample, (size_t)bt->num_logits * sizeof *params);
    else memset(params, 0, (size_t)bt->num_logits * sizeof *params); /* greedy */
    size_t np = 0;
    for (int s = 0; s < S; s++) {
        int n = (bt->seq_kv_len[s] + ps - 1) / ps;
        if (np + (size_t)n > cb->page_capacity)
            return rp_errf(err, "batch lists %zu KV pages, more than the %zu the step block holds", np + (size_t)n,
                           cb->page_capacity);
        page_row[s] = (int32_t)np;
        copy_bytes_n(pages + np, bt->page_table + (int64_t)bt->seq_page_row[s] * bt->page_table_stride, (size_t)n * 4);
        np += (size_t)n;
    }
    /* Padding: one-token sequences at position 0 whose KV write and read hit
     * the dummy page, and whose logits row is sampled and ignored. */
    for (int s = S; s < padded_seqs; s++) {
        int t = T + (s - S);
        tokens[t] = 0;
        pos[t] = 0;
        slots[t] = dummy_page * ps;
        seq_start[s + 1] = t + 1;
        kv_len[s] = 1;
        page_row[s] = (int32_t)np;
        pages[np++] = dummy_page;
        logit_token[bt->num_logits + (s - S)] = t;
        memset(&params[bt->num_logits + (s - S)], 0, sizeof *params);
    }
    *copy_bytes = cb->off_pages + np * 4;
    return 0;
}

/* ---- the forward pass ------------------------------------------------------ */

int rp_cuda_decode_splits(const rp_cuda_backend *cb, int num_seqs) {
    /* At most two (sequence, kv head, split) blocks per SM. Rounding up
     * (at least two per SM) cost batches 8 and 16 3-8% per step at ctx 512
     * and up to 16% at ctx 2048 (qwen3-0.6b; llama3-8b 1-6%): a third
     * block per SM only adds a merge input and a short split's ramp-up
     * (bench/RESULTS.md, eleventh session; REPLAY_BENCH_ATTN_SWEEP=1 replay
     * bench kernels times every split count). */
    int want = 2 * cb->num_sms / (num_seqs * cb->nkv);
    if (want < 1) want = 1;
    if (want > cb->max_splits) want = cb->max_splits;
    return want;
}

/* Profile mode: an event before each launch; segment i is the time from
 * mark i to mark i + 1. Never inside a capture (graphs hold no events). */
static void prof_mark(rp_cuda_backend *cb, const char *name) {
    if (!cb->base.cfg.profile || cb->capturing || cb->prof_n >= RP_PROF_MAX) return;
    cudaEventRecord(cb->prof_events[cb->prof_n], cb->stream);
    cb->prof_names[cb->prof_n++] = name;
}

/* The paged-attention view of the device metadata block. */
static rp_attn_meta device_attn_meta(const rp_cuda_backend *cb) {
    uint8_t *d = cb->d_meta;
    return (rp_attn_meta){
        .seq_start = META(cb, d, off_seq_start, int32_t),
        .seq_kv_len = META(cb, d, off_kv_len, int32_t),
        .seq_page_row = META(cb, d, off_page_row, int32_t),
        .page_table = META(cb, d, off_pages, int32_t),
        .page_table_stride = 1,
        .page_size = cb->base.cfg.page_size,
    };
}

/* Layer l's attention, shared by both paths: q/k norm, RoPE and the KV
 * store on the fused qkv, then decode or prefill attention into cb->attn. */
static int launch_attention(rp_cuda_backend *cb, int l, int T, int S, int decode, int max_q_len, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    const rp_cuda_layer *ly = &cb->layers[l];
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->d_meta;
    const int32_t *pos = META(cb, d, off_positions, int32_t), *slots = META(cb, d, off_slots, int32_t);
    const rp_attn_meta am = device_attn_meta(cb);
    const float eps = (float)c->rms_norm_eps;
    rp_bf16 *kc = cb->k_cache + (size_t)l * cb->kv_layer_elems, *vc = cb->v_cache + (size_t)l * cb->kv_layer_elems;
    prof_mark(cb, "qk_norm_rope_store");
    RP_LAUNCH(rp_k_qk_norm_rope_store(cb->qkv, ly->q_norm, ly->k_norm, cb->inv_freq, pos, slots, kc, vc, T,
                      c->num_heads, c->num_kv_heads, c->head_dim, eps, st),
          err);
    prof_mark(cb, decode ? "attn_decode" : "attn_prefill");
    if (decode)
        RP_LAUNCH(rp_k_attn_decode(cb->qkv, kc, vc, am, cb->attn, cb->attn_ws, S, c->num_heads,
                       c->num_kv_heads, c->head_dim, rp_cuda_decode_splits(cb, S), st),
              err);
    else
        RP_LAUNCH(rp_k_attn_prefill(cb->qkv, kc, vc, am, cb->attn, T, S, max_q_len, c->num_heads,
                    c->num_kv_heads, c->head_dim, st),
              err);
    return 0;
}

/* Samples every logit row, then finds the most likely tokens of the rows
 * that ask for top logprobs (a block per row that returns at once for the
 * others), all on fixed buffers. */
static int launch_sample(rp_cuda_backend *cb, int num_logits, rp_err *err) {
    const int V = cb->base.model->cfg.vocab_size;
    const rp_sample_params *params = META(cb, cb->d_meta, off_params, rp_sample_params);
    prof_mark(cb, "sample");
    /* the results also straight into the slot's pinned buffer (no copy) */
    const rp_sample_host host = {.rows = {cb->d_tokens_host[0], cb->d_tokens_host[1]},
                                 .slot = META(cb, cb->d_meta, off_out_slot, int32_t),
                                 .stride = cb->max_logits};
    RP_LAUNCH(rp_k_sample_kept(cb->logits, params, cb->d_tokens, cb->d_logprobs, cb->d_kept,
                               cb->d_tokens_host[0] ? &host : NULL, cb->sample_ws, num_logits, V, cb->stream),
              err);
    prof_mark(cb, "top logprobs");
    RP_LAUNCH(rp_k_top_logprobs(cb->logits, params, cb->d_tokens, cb->d_logprobs, cb->d_kept, cb->d_top, num_logits,
                                V, cb->stream),
              err);
    return 0;
}

/* The fused path (T <= cb->fused_max_t): the residual stream stays fp32 in
 * cb->residual; each GEMV that adds into it also leaves per-block partial
 * sums of squares in cb->ss_parts, from which the next GEMV normalises its
 * input on the fly. Same math as the unfused path (the sum of squares is
 * added in another order). */
static int launch_forward_fused(rp_cuda_backend *cb, int T, int S, int num_logits, int decode, int max_q_len,
                                int sample, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->d_meta;
    const int32_t *tokens = META(cb, d, off_tokens, int32_t), *logit_token = META(cb, d, off_logit_token, int32_t);
    const int H = c->hidden_size, F = c->intermediate_size, P = cb->ss_num_parts;
    const float eps = (float)c->rms_norm_eps;
    const rp_gemv_out to_residual = {.mode = RP_GEMV_OUT_RESIDUAL, .residual = cb->residual, .ss_parts = cb->ss_parts};
    rp_gemv_in normed = {.mode = RP_GEMV_IN_RMSNORM, .residual = cb->residual, .ss_parts = cb->ss_parts,
                         .num_parts = P, .eps = eps};
    prof_mark(cb, "embed");
    RP_LAUNCH(rp_k_embed(cb->embed, tokens, cb->d_tokens, cb->residual, cb->ss_parts, P, T, H, st), err);
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->layers[l];
        prof_mark(cb, "gemv qkv (+rmsnorm)");
        normed.norm_w = ly->attn_norm;
        RP_LAUNCH(rp_k_gemv_fused(ly->wqkv, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_BF16, .y = cb->qkv}, T,
                                  cb->qkv_dim, H, st),
                  err);
        if (launch_attention(cb, l, T, S, decode, max_q_len, err)) return RP_ERR;
        prof_mark(cb, "gemv o (+residual)");
        RP_LAUNCH(rp_k_gemv_fused(ly->wo, (rp_gemv_in){.mode = RP_GEMV_IN_BF16, .x = cb->attn}, to_residual, T, H,
                                  cb->q_dim, st),
                  err);
        prof_mark(cb, "gemv gate_up (+rmsnorm)");
        normed.norm_w = ly->mlp_norm;
        RP_LAUNCH(rp_k_gemv_fused(ly->wgu, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_F32, .y = cb->gate_up}, T,
                                  2 * F, H, st),
                  err);
        if (rp_gemv_stage_fits(T, F)) {
            prof_mark(cb, "gemv down (+silu, residual)");
            RP_LAUNCH(rp_k_gemv_fused(ly->wdown, (rp_gemv_in){.mode = RP_GEMV_IN_SILU, .gate_up = cb->gate_up},
                                      to_residual, T, H, F, st),
                      err);
        } else { /* the SwiGLU rows do not fit in a block's shared memory */
            prof_mark(cb, "silu_mul");
            RP_LAUNCH(rp_k_silu_mul(cb->gate_up, cb->act, T, F, st), err);
            prof_mark(cb, "gemv down (+residual)");
            RP_LAUNCH(rp_k_gemv_fused(ly->wdown, (rp_gemv_in){.mode = RP_GEMV_IN_BF16, .x = cb->act}, to_residual, T,
                                      H, F, st),
                      err);
        }
    }
    prof_mark(cb, "gemv lm_head (+rmsnorm, gather)");
    normed.norm_w = cb->final_norm;
    normed.rows = logit_token;
    RP_LAUNCH(rp_k_gemv_fused(cb->lm_head, normed, (rp_gemv_out){.mode = RP_GEMV_OUT_F32, .y = cb->logits},
                              num_logits, c->vocab_size, H, st),
              err);
    if (sample && launch_sample(cb, num_logits, err)) return RP_ERR;
    prof_mark(cb, NULL);
    return 0;
}

/* How many sequences the forward decodes as one persistent kernel: S when
 * it is S sequences of one token each, every one with logits, and
 * rp_k_decode_step takes that many on this model and device; else 0. */
int rp_cuda_decode_step_nb(const rp_cuda_backend *cb, int T, int S, int num_logits, int decode) {
    return decode && T == S && num_logits == S && S <= 4 && (cb->decode_step_ok >> (S == 3 ? 4 : S) & 1) ? S : 0;
}

/* Whether that kernel may pick the greedy token itself for nb sequences. */
int rp_cuda_decode_step_can_pick(const rp_cuda_backend *cb, int nb) {
    return cb->decode_step_pick && rp_decode_step_pick_ok(&cb->ds, nb, cb->num_sms);
}

/* Enqueues one forward over the metadata block: T tokens of S sequences,
 * logits for num_logits rows, sampled when sample is set (RP_SAMPLE_PICK:
 * every row greedy with no top logprobs, which the one-kernel step picks
 * itself). Only device pointers and shapes: the same call is run eagerly
 * and captured. */
int rp_cuda_launch_forward(rp_cuda_backend *cb, int T, int S, int num_logits, int decode, int max_q_len,
                           int sample, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    cudaStream_t st = cb->stream;
    uint8_t *d = cb->d_meta;
    const int32_t *tokens = META(cb, d, off_tokens, int32_t), *logit_token = META(cb, d, off_logit_token, int32_t);
    const int H = c->hidden_size, F = c->intermediate_size;
    const float eps = (float)c->rms_norm_eps;
    cb->prof_n = 0;
    /* 1 to 4 sequences of one token: the whole step is one persistent
     * kernel (kernels/decode_step.cu), then sampling, unless the kernel
     * picked greedily: a kernel boundary after it costs ~15 us a step
     * (qwen3-0.6b 0.762 -> 0.746 ms without the sampling kernels;
     * bench/RESULTS.md, eighteenth session). */
    if (rp_cuda_decode_step_nb(cb, T, S, num_logits, decode)) {
        const int pick = sample == RP_SAMPLE_PICK && rp_cuda_decode_step_can_pick(cb, S);
        prof_mark(cb, pick ? "decode step (one kernel, greedy pick)" : "decode step (one kernel)");
        RP_LAUNCH(rp_k_decode_step(&cb->ds, S, cb->num_sms, pick, st), err);
        if (sample && !pick && launch_sample(cb, num_logits, err)) return RP_ERR;
        prof_mark(cb, NULL);
        return 0;
    }
    /* Few tokens (decode, tiny prefill chunks): every matrix product is a
     * GEMV with its norm, SwiGLU or residual add fused in, so a layer is 4
     * GEMVs + RoPE + attention. More tokens: cuBLASLt and separate kernels.
     * The choice depends on T only, so a graph and an eager run of the same
     * batch do the same arithmetic. */
    if (T <= cb->fused_max_t && T <= cb->gemm.gemv_max_t && rp_gemv_stage_fits(T, H))
        return launch_forward_fused(cb, T, S, num_logits, decode, max_q_len, sample, err);
    prof_mark(cb, "embed");
    RP_LAUNCH(rp_k_embed(cb->embed, tokens, cb->d_tokens, cb->residual, NULL, 0, T, H, st), err);
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->layers[l];
        prof_mark(cb, "add_rmsnorm");
        RP_LAUNCH(rp_k_add_rmsnorm(cb->residual, l ? cb->tmp : NULL, ly->attn_norm, cb->xn, T, H, eps, st), err);
        prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, T, cb->qkv_dim, H) ? "gemv qkv" : "gemm qkv");
        if (rp_gemm_run(&cb->gemm, ly->wqkv, cb->xn, cb->qkv, T, cb->qkv_dim, H, 0, st, err)) return RP_ERR;
        if (launch_attention(cb, l, T, S, decode, max_q_len, err)) return RP_ERR;
        prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, T, H, cb->q_dim) ? "gemv o" : "gemm o");
        if (rp_gemm_run(&cb->gemm, ly->wo, cb->attn, cb->tmp, T, H, cb->q_dim, 1, st, err)) return RP_ERR;
        prof_mark(cb, "add_rmsnorm");
        RP_LAUNCH(rp_k_add_rmsnorm(cb->residual, cb->tmp, ly->mlp_norm, cb->xn, T, H, eps, st), err);
        prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, T, 2 * F, H) ? "gemv gate_up" : "gemm gate_up");
        if (rp_gemm_run(&cb->gemm, ly->wgu, cb->xn, cb->gate_up, T, 2 * F, H, 1, st, err)) return RP_ERR;
        prof_mark(cb, "silu_mul");
        RP_LAUNCH(rp_k_silu_mul(cb->gate_up, cb->act, T, F, st), err);
        prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, T, H, F) ? "gemv down" : "gemm down");
        if (rp_gemm_run(&cb->gemm, ly->wdown, cb->act, cb->tmp, T, H, F, 1, st, err)) return RP_ERR;
    }
    prof_mark(cb, "add_rmsnorm");
    RP_LAUNCH(rp_k_add_rmsnorm(cb->residual, cb->tmp, cb->final_norm, cb->xn, T, H, eps, st), err);
    prof_mark(cb, "gather_rows");
    RP_LAUNCH(rp_k_gather_rows(cb->xn, logit_token, cb->logit_in, num_logits, H, st), err);
    prof_mark(cb, rp_gemm_uses_gemv(&cb->gemm, num_logits, c->vocab_size, H) ? "gemv lm_head" : "gemm lm_head");
    if (rp_gemm_run(&cb->gemm, cb->lm_head, cb->logit_in, cb->logits, num_logits, c->vocab_size, H, 1, st, err))
        return RP_ERR;
    if (sample && launch_sample(cb, num_logits, err)) return RP_ERR;
    prof_mark(cb, NULL);
    return 0;
}

/* Uploads an already packed metadata block. */
int rp_cuda_upload_meta(rp_cuda_backend *cb, size_t bytes, rp_err *err) {
    RP_CUDA_TRY(cudaMemcpyAsync(cb->d_meta, cb->h_meta, bytes, cudaMemcpyHostToDevice, cb->stream), err);
    return 0;
}

int rp_cuda_pack_and_upload(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, rp_err *err) {
    size_t bytes = 0; /* -O3 cannot see that pack_meta sets it on success */
    if (pack_meta(cb, bt, padded_seqs, &bytes, err)) return RP_ERR;
    return rp_cuda_upload_meta(cb, bytes, err);
}

static int cuda_forward(rp_backend *b, const rp_batch *bt, rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (rp_batch_validate(bt, b, err)) return RP_ERR;
    const int S = bt->num_seqs, T = bt->num_tokens;
    int decode = T == S;
    int sample = bt->sample != NULL;
    /* A pure decode batch whose every row wants logits replays a graph. */
    const rp_cuda_graph *g = NULL;
    if (decode && cb->graphs_enabled && bt->num_logits == S) g = rp_cuda_graph_find(cb, S);
    /* Take the other slot: its previous forward's results were read (at most
     * one forward may be pending when another is launched), so its pinned
     * buffers are free and its copies long done. */
    if (cb->num_pending >= 2) return rp_errf(err, "two forwards in flight: read the older one's results first");
    int slot = cb->cur_slot ^ 1;
    cb->cur_slot = slot;
    cb->h_meta = cb->h_meta_slot[slot];
    cb->h_tokens = cb->h_tokens_slot[slot];
    cb->h_logprobs = cb->h_logprobs_slot[slot];
    cb->slot_top[slot] = 0;
    int greedy = sample;
    for (int i = 0; sample && i < bt->num_logits; i++) {
        if (bt->sample[i].top_logprobs > 0) cb->slot_top[slot] = 1;
        if (bt->sample[i].top_logprobs > 0 || bt->sample[i].temperature != 0.0f) greedy = 0;
    }
    cb->ev_start = cb->ev_start_slot[slot];
    cb->ev_end = cb->ev_end_slot[slot];
    cb->slot_sampled[slot] = sample;
    cb->slot_num_logits[slot] = bt->num_logits;
    cb->last_sampled = sample;
    cb->last_num_logits = bt->num_logits;
    if (cudaSetDevice(cb->device) != cudaSuccess) return rp_errf(err, "cudaSetDevice(%d) failed", cb->device);
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventRecord(cb->ev_start, cb->stream), err);
    if (rp_cuda_pack_and_upload(cb, bt, g ? g->batch_size : S, err)) return RP_ERR;
    double t1 = rp_now_s();
    cb->last_decode_step = rp_cuda_decode_step_nb(cb, T, S, bt->num_logits, decode);
    greedy = greedy && cb->last_decode_step && rp_cuda_decode_step_can_pick(cb, S) && (!g || g->exec_pick);
    if (cb->last_decode_step) cb->stats.decode_step_forwards++;
    if (greedy) cb->stats.decode_step_picks++;
    if (g) {
        RP_CUDA_TRY(cudaGraphLaunch(greedy && g->exec_pick ? g->exec_pick : g->exec, cb->stream), err);
        cb->stats.graph_replays++;
    } else {
        int max_q = 0;
        for (int s = 0; s < S; s++)
            if (bt->seq_start[s + 1] - bt->seq_start[s] > max_q) max_q = bt->seq_start[s + 1] - bt->seq_start[s];
        if (rp_cuda_launch_forward(cb, T, S, bt->num_logits, decode, max_q,
                                   greedy ? RP_SAMPLE_PICK : sample ? RP_SAMPLE_KERNELS : RP_SAMPLE_NONE, err))
            return RP_ERR;
    }
    /* The greedy pick and (mapped buffers) the sampling kernels wrote them
     * into the slot's pinned buffers themselves. */
    if (sample && !greedy) {
        /* tokens and logprobs in one copy: two rows of the 2-D layout */
        const size_t pitch = (size_t)cb->max_logits * 4;
        if (!cb->d_tokens_host[0])
            RP_CUDA_TRY(cudaMemcpy2DAsync(cb->h_tokens, pitch, cb->d_tokens, pitch, (size_t)bt->num_logits * 4, 2,
                                          cudaMemcpyDeviceToHost, cb->stream),
                        err);
        if (cb->slot_top[slot]) /* only when asked: ~164 bytes a row */
            RP_CUDA_TRY(cudaMemcpyAsync(cb->h_top_slot[slot], cb->d_top,
                                        (size_t)bt->num_logits * sizeof(rp_top_logprobs), cudaMemcpyDeviceToHost,
                                        cb->stream),
                        err);
    }
    RP_CUDA_TRY(cudaEventRecord(cb->ev_end, cb->stream), err);
    cb->stats.last_pack_ms = (t1 - t0) * 1e3;
    cb->stats.last_launch_ms = (rp_now_s() - t1) * 1e3;
    cb->stats.forwards++;
    cb->timing_pending = 1;
    cb->num_pending++;
    return 0;
}

static const rp_backend_ops cuda_ops; /* defined below */

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int rp_cuda_time_decode_step(rp_backend *b, int reps, int inner, double *us, rp_err *err) {
    if (!b || b->ops != &cuda_ops) return rp_errf(err, "the one-kernel decode step is timed on the CUDA backend only");
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    const int nb = cb->last_decode_step;
    if (!nb)
        return rp_errf(err, "the last forward was not a one-kernel decode step (the model's shapes: %s)",
                       cb->decode_step_ok ? "supported" : "not supported");
    if (cb->num_pending) return rp_errf(err, "read the last forward's results first");
    float ms[64];
    if (reps < 1 || reps > 64 || inner < 1) return rp_errf(err, "bad repetition counts");
    RP_CUDA_TRY(cudaSetDevice(cb->device), err);
    /* the slots' events are free: no forward is in flight */
    cudaEvent_t e0 = cb->ev_start_slot[0], e1 = cb->ev_end_slot[0];
    for (int i = 0; i < 3; i++) RP_LAUNCH(rp_k_decode_step(&cb->ds, nb, cb->num_sms, 0, cb->stream), err);
    for (int r = 0; r < reps; r++) {
        RP_CUDA_TRY(cudaEventRecord(e0, cb->stream), err);
        for (int i = 0; i < inner; i++) RP_LAUNCH(rp_k_decode_step(&cb->ds, nb, cb->num_sms, 0, cb->stream), err);
        RP_CUDA_TRY(cudaEventRecord(e1, cb->stream), err);
        RP_CUDA_TRY(cudaEventSynchronize(e1), err);
        RP_CUDA_TRY(cudaEventElapsedTime(&ms[r], e0, e1), err);
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
    *us = ms[reps / 2] * 1000.0 / inner;
    return 0;
}

static int finish_step(rp_cuda_backend *cb, rp_err *err) {
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventSynchronize(cb->ev_end), err);
    if (cb->timing_pending) cb->stats.last_sync_ms = (rp_now_s() - t0) * 1e3;
    if (cb->timing_pending) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, cb->ev_start, cb->ev_end) == cudaSuccess) cb->stats.last_gpu_ms = ms;
        cb->timing_pending = 0;
    }
    return 0;
}

/* Returns the tokens of the oldest forward not yet read (with overlap, the
 * one before the last). */
static int cuda_read_tokens(rp_backend *b, int32_t *tokens, float *logprobs, rp_top_logprobs *top, rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (cb->num_pending == 0) return rp_errf(err, "no forward to read");
    int slot = cb->num_pending == 2 ? cb->cur_slot ^ 1 : cb->cur_slot;
    if (!cb->slot_sampled[slot]) return rp_errf(err, "that forward did not sample");
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventSynchronize(cb->ev_end_slot[slot]), err);
    cb->stats.last_sync_ms = (rp_now_s() - t0) * 1e3;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, cb->ev_start_slot[slot], cb->ev_end_slot[slot]) == cudaSuccess)
        cb->stats.last_gpu_ms = ms;
    if (slot == cb->cur_slot) cb->timing_pending = 0;
    memcpy(tokens, cb->h_tokens_slot[slot], (size_t)cb->slot_num_logits[slot] * 4);
    if (logprobs) memcpy(logprobs, cb->h_logprobs_slot[slot], (size_t)cb->slot_num_logits[slot] * 4);
    if (top) {
        if (cb->slot_top[slot]) memcpy(top, cb->h_top_slot[slot], (size_t)cb->slot_num_logits[slot] * sizeof *top);
        else
            for (int i = 0; i < cb->slot_num_logits[slot]; i++) top[i].n = 0;
    }
    cb->num_pending--;
    return 0;
}

static int cuda_read_logits(rp_backend *b, float *dst, rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    /* logits live in one device buffer: only the last forward's exist */
    if (cb->num_pending > 1) return rp_errf(err, "logits of an overlapped forward cannot be read");
    cb->num_pending = 0;
    if (finish_step(cb, err)) return RP_ERR;
    RP_CUDA_TRY(cudaMemcpy(dst, cb->logits, (size_t)cb->last_num_logits * b->model->cfg.vocab_size * 4,
                           cudaMemcpyDeviceToHost),
                err);
    return 0;
}

static void cuda_stats(rp_backend *b, rp_backend_stats *out) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    *out = cb->stats;
    out->device_allocs = rp_cuda_alloc_count() - cb->allocs_at_ready;
}

static int cuda_profile(rp_backend *b, rp_profile_entry *out, int max) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (cudaEventSynchronize(cb->ev_end) != cudaSuccess) return 0;
    int n = 0;
    for (int i = 0; i + 1 < cb->prof_n && n < max; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, cb->prof_events[i], cb->prof_events[i + 1]) != cudaSuccess) break;
        out[n++] = (rp_profile_entry){cb->prof_names[i], ms};
    }
    return n;
}

static void cuda_set_graphs(rp_backend *b, int enabled) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    cb->graphs_enabled = enabled && cb->num_graphs > 0;
}

/* REPLAY_DECODE_STEP_TRACE: where the blocks' time went in the last
 * one-kernel step (mean and max over blocks, microseconds). */
static void print_decode_step_trace(rp_cuda_backend *cb) {
    const size_t bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE * 8;
    uint64_t *h = malloc(bytes);
    if (!h || cudaMemcpy(h, cb->ds.trace, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return;
    }
    fprintf(stderr, "decode step trace (last launch, %d blocks): mean / max\n", cb->num_sms);
    for (int k = 0; k < RP_DECODE_STEP_TRACE_SLOTS; k++) {
        double sum = 0, mx = 0, div = k == RP_DECODE_STEP_TRACE_SLOTS - 1 ? 1.0 : 1e3; /* the last is a count */
        for (int b = 0; b < cb->num_sms; b++) {
            double v = (double)h[b * RP_DECODE_STEP_TRACE_STRIDE + k] / div;
            sum += v;
            if (v > mx) mx = v;
        }
        fprintf(stderr, "  %-30s %10.1f %10.1f%s\n", rp_decode_step_trace_names[k], sum / cb->num_sms, mx,
                k == RP_DECODE_STEP_TRACE_SLOTS - 1 ? "" : " us");
    }
    /* Each barrier: how far apart the blocks arrived, how long the last
     * arrival took to release the first waiter, and the work before it
     * (mean over blocks of arrival minus the previous release). */
    static const char *const kind[5] = {"after qkv", "after attention", "after o", "after gate_up", "after down"};
    const int L = cb->base.model->cfg.num_layers, nb = 5 * L < RP_DECODE_STEP_TRACE_BARRIERS ? 5 * L : 0;
    /* The fence: each block's (mean), the one of the block whose fence
     * ended last, and the release latency counted from that end. */
    double spread[5] = {0}, latency[5] = {0}, work[5] = {0}, fmean[5] = {0}, flast[5] = {0}, after[5] = {0};
    for (int k = 0; k < nb; k++) {
        uint64_t amin = UINT64_MAX, amax = 0, rmin = UINT64_MAX, fmax = 0, fl = 0;
        double w = 0, f = 0;
        for (int b = 0; b < cb->num_sms; b++) {
            const uint64_t *bt = h + (size_t)b * RP_DECODE_STEP_TRACE_STRIDE + 16,
                           fe = h[(size_t)b * RP_DECODE_STEP_TRACE_STRIDE + RP_DECODE_STEP_TRACE_FENCE + k];
            if (bt[2 * k] < amin) amin = bt[2 * k];
            if (bt[2 * k] > amax) amax = bt[2 * k];
            if (bt[2 * k + 1] < rmin) rmin = bt[2 * k + 1];
            if (k > 0) w += (double)(bt[2 * k] - bt[2 * k - 1]);
            f += (double)(fe - bt[2 * k]);
            if (fe > fmax) fmax = fe, fl = fe - bt[2 * k];
        }
        spread[k % 5] += (double)(amax - amin) / 1e3 / L;
        latency[k % 5] += ((double)rmin - (double)amax) / 1e3 / L;
        work[k % 5] += w / cb->num_sms / 1e3 / L;
        fmean[k % 5] += f / cb->num_sms / 1e3 / L;
        flast[k % 5] += (double)fl / 1e3 / L;
        after[k % 5] += ((double)rmin - (double)fmax) / 1e3 / L;
    }
    if (nb)
        fprintf(stderr, "  per barrier, mean over layers (us): arrival spread / release latency / work before /"
                        " fence mean / fence of the last / release after the last fence\n");
    for (int k = 0; nb && k < 5; k++)
        fprintf(stderr, "    %-16s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", kind[k], spread[k], latency[k], work[k],
                fmean[k], flast[k], after[k]);
    free(h);
}

/* REPLAY_DECODE_STEP_TIMELINE=FILE: the last one-kernel step's trace and
 * piece timeline as raw words, for tools/step_timeline.py: "RPTL", then
 * u32 blocks, pieces per block, layers, trace stride, then the trace and
 * the timeline (kernels.h says what each holds). */
static void write_decode_step_timeline(rp_cuda_backend *cb, const char *path) {
    const size_t tr_words = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE,
                 tl_words = (size_t)cb->num_sms * RP_DECODE_STEP_TL_PIECES * 4;
    uint64_t *h = malloc((tr_words + tl_words) * 8);
    FILE *f = NULL;
    if (!h || cudaMemcpy(h, cb->ds.trace, tr_words * 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(h + tr_words, cb->ds.timeline, tl_words * 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
        !(f = fopen(path, "wb"))) {
        rp_log_warn("cuda: the decode step timeline was not written to %s", path);
        free(h);
        return;
    }
    const uint32_t head[4] = {(uint32_t)cb->num_sms, RP_DECODE_STEP_TL_PIECES,
                              (uint32_t)cb->base.model->cfg.num_layers, RP_DECODE_STEP_TRACE_STRIDE};
    if (fwrite("RPTL", 1, 4, f) != 4 || fwrite(head, 4, 4, f) != 4 ||
        fwrite(h, 8, tr_words + tl_words, f) != tr_words + tl_words)
        rp_log_warn("cuda: writing %s failed", path);
    fclose(f);
    free(h);
}

static void cuda_destroy(rp_backend *b) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (!cb) return;
    cudaSetDevice(cb->device);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    if (cb->ds.trace) {
        print_decode_step_trace(cb);
        const char *tl_path = getenv("REPLAY_DECODE_STEP_TIMELINE");
        if (cb->ds.timeline && tl_path) write_decode_step_timeline(cb, tl_path);
        rp_cuda_free(cb->ds.trace);
        rp_cuda_free(cb->ds.timeline);
    }
    rp_cuda_graphs_destroy(cb);
    rp_gemm_destroy(&cb->gemm);
    void *dev[] = {cb->weights_mem, cb->kv_mem, cb->act_mem, cb->d_meta, cb->d_layers};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) rp_cuda_free(dev[i]);
    for (int k = 0; k < 2; k++) {
        if (cb->h_meta_slot[k]) cudaFreeHost(cb->h_meta_slot[k]);
        if (cb->h_tokens_slot[k]) cudaFreeHost(cb->h_tokens_slot[k]);
        if (cb->h_top_slot[k]) cudaFreeHost(cb->h_top_slot[k]);
        if (cb->ev_start_slot[k]) cudaEventDestroy(cb->ev_start_slot[k]);
        if (cb->ev_end_slot[k]) cudaEventDestroy(cb->ev_end_slot[k]);
    }
    for (int i = 0; i < RP_PROF_MAX; i++)
        if (cb->prof_events[i]) cudaEventDestroy(cb->prof_events[i]);

    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb->layers);
    free(cb);
}

static const rp_backend_ops cuda_ops = {
    .forward = cuda_forward,
    .read_logits = cuda_read_logits,
    .read_tokens = cuda_read_tokens,
    .destroy = cuda_destroy,
    .stats = cuda_stats,
    .set_graphs = cuda_set_graphs,
    .profile = cuda_profile,
};

static int alloc_activations(rp_cuda_backend *cb, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    const size_t T = (size_t)cb->base.cfg.max_batch_tokens, H = (size_t)c->hidden_size,
                 F = (size_t)c->intermediate_size, Lg = (size_t)cb->max_logits, V = (size_t)c->vocab_size;
    size_t attn_ws = rp_attn_decode_workspace_bytes(cb->max_seqs, c->num_heads, c->head_dim, cb->max_splits);
    size_t sample_ws = rp_sample_workspace_bytes(cb->max_logits, c->vocab_size);
    struct {
        void **ptr;
        size_t bytes;
    } parts[] = {
        {(void **)&cb->residual, T * H * 4},
        {(void **)&cb->xn, T * H * 2},
        {(void **)&cb->qkv, T * (size_t)cb->qkv_dim * 2},
        {(void **)&cb->attn, T * (size_t)cb->q_dim * 2},
        {(void **)&cb->tmp, T * H * 4},
        {(void **)&cb->gate_up, T * 2 * F * 4},
        {(void **)&cb->act, T * F * 2},
        {(void **)&cb->logit_in, Lg * H * 2},
        {(void **)&cb->logits, Lg * V * 4},
        {(void **)&cb->inv_freq, (size_t)c->head_dim / 2 * 4},
        {(void **)&cb->ss_parts, (size_t)rp_gemv_ss_parts(c->hidden_size) * RP_GEMV_MAX_T * 4},
        {(void **)&cb->d_tokens, 2 * Lg * 4}, /* then the logprobs: one copy brings both back */
        {(void **)&cb->d_kept, Lg * 4},
        {(void **)&cb->d_top, Lg * sizeof(rp_top_logprobs)},
        {&cb->attn_ws, attn_ws},
        {&cb->sample_ws, sample_ws},
        {&cb->ds_ws, rp_decode_step_workspace_bytes(c->num_heads, c->num_kv_heads)},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) total += align_up(parts[i].bytes, 256);
    if (rp_cuda_malloc((void **)&cb->act_mem, total, "activations", err)) return RP_ERR;
    uint8_t *p = cb->act_mem;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        *parts[i].ptr = p;
        p += align_up(parts[i].bytes, 256);
    }
    cb->d_logprobs = (float *)(cb->d_tokens + Lg);
    cb->act_bytes = total;
    RP_CUDA_TRY(cudaMemset(cb->ds_ws, 0, rp_decode_step_workspace_bytes(c->num_heads, c->num_kv_heads)), err);
    float *h_inv = malloc((size_t)c->head_dim / 2 * 4);
    if (!h_inv) return rp_errf(err, "out of memory");
    rp_rope_inv_freq(c, h_inv);
    cudaError_t e = cudaMemcpy(cb->inv_freq, h_inv, (size_t)c->head_dim / 2 * 4, cudaMemcpyHostToDevice);
    free(h_inv);
    RP_CUDA_TRY(e, err);
    for (int k = 0; k < 2; k++) {
        /* the device layout: tokens, then logprobs, Lg apart */
        RP_CUDA_TRY(cudaMallocHost((void **)&cb->h_tokens_slot[k], 2 * Lg * 4), err);
        cb->h_logprobs_slot[k] = (float *)(cb->h_tokens_slot[k] + Lg);
        RP_CUDA_TRY(cudaMallocHost((void **)&cb->h_top_slot[k], Lg * sizeof(rp_top_logprobs)), err);
    }
    /* REPLAY_SAMPLE_MAPPED=0 (A/Bs): copy the results after the kernels */
    const char *env = getenv("REPLAY_SAMPLE_MAPPED");
    for (int k = 0; k < 2 && !(env && !strcmp(env, "0")); k++)
        if (cudaHostGetDevicePointer((void **)&cb->d_tokens_host[k], cb->h_tokens_slot[k], 0) != cudaSuccess) {
            cudaGetLastError();
            rp_log_info("cuda: pinned result buffers are not mapped: the results are copied after each step");
            cb->d_tokens_host[0] = cb->d_tokens_host[1] = NULL;
            break;
        }
    cb->h_tokens = cb->h_tokens_slot[0];
    cb->h_logprobs = cb->h_logprobs_slot[0];
    return 0;
}

/* The one-kernel batch-1 decode step: its argument block (fixed device
 * addresses, like every launch) and the per-layer pointer table. */
static int setup_decode_step(rp_cuda_backend *cb, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    uint8_t *d = cb->d_meta;
    const char *env = getenv("REPLAY_DECODE_STEP");
    if (env && !strcmp(env, "0")) return 0;
    env = getenv("REPLAY_DECODE_STEP_PICK");
    cb->decode_step_pick = !(env && !strcmp(env, "0"));
    rp_decode_layer *h = calloc((size_t)c->num_layers, sizeof *h);
    if (!h) return rp_errf(err, "out of memory");
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->layers[l];
        h[l] = (rp_decode_layer){ly->wqkv, ly->wo, ly->wgu, ly->wdown};
    }
    /* the table, then the norm weights side by side (rp_decode_step.norms;
     * copied on the stream the uploads were queued on) */
    const size_t bytes = ((size_t)c->num_layers * sizeof *h + 127) / 128 * 128,
                 nstride = 2 * (size_t)c->hidden_size + 2 * (size_t)c->head_dim;
    const int qk = cb->layers[0].q_norm != NULL;
    int rc = rp_cuda_malloc((void **)&cb->d_layers, bytes + (size_t)c->num_layers * nstride * 2, "layer table", err);
    rp_bf16 *norms = rc ? NULL : (rp_bf16 *)((uint8_t *)cb->d_layers + bytes);
    if (!rc && cudaMemcpy(cb->d_layers, h, (size_t)c->num_layers * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = rp_errf(err, "cudaMemcpy of the layer table failed");
    for (int l = 0; !rc && l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->layers[l];
        rp_bf16 *n = norms + (size_t)l * nstride;
        const size_t hb = (size_t)c->hidden_size * 2, db = (size_t)c->head_dim * 2;
        if (cudaMemcpyAsync(n, ly->attn_norm, hb, cudaMemcpyDeviceToDevice, cb->stream) != cudaSuccess ||
            cudaMemcpyAsync(n + c->hidden_size, ly->mlp_norm, hb, cudaMemcpyDeviceToDevice, cb->stream) != cudaSuccess ||
            (qk && (cudaMemcpyAsync(n + 2 * c->hidden_size, ly->q_norm, db, cudaMemcpyDeviceToDevice, cb->stream) != cudaSuccess ||
                    cudaMemcpyAsync(n + 2 * c->hidden_size + c->head_dim, ly->k_norm, db, cudaMemcpyDeviceToDevice,
                                    cb->stream) != cudaSuccess)))
            rc = rp_errf(err, "cudaMemcpy of the norm weights failed");
    }
    free(h);
    if (rc) return RP_ERR;
    cb->ds = (rp_decode_step){
        .layers = cb->d_layers,
        .norms = norms,
        .qk_norm = qk,
        .embed = cb->embed,
        .final_norm = cb->final_norm,
        .lm_head = cb->lm_head,
        .inv_freq = cb->inv_freq,
        .tokens = META(cb, d, off_tokens, int32_t),
        .positions = META(cb, d, off_positions, int32_t),
        .slots = META(cb, d, off_slots, int32_t),
        .prev_sampled = cb->d_tokens,
        .pick_tokens = cb->d_tokens,
        .pick_logprobs = cb->d_logprobs,
        .pick_slot = META(cb, d, off_out_slot, int32_t),
        .pick_host_stride = cb->max_logits,
        .meta = device_attn_meta(cb),
        .k_cache = cb->k_cache,
        .v_cache = cb->v_cache,
        .kv_layer_elems = cb->kv_layer_elems,
        .residual = cb->residual,
        .logits = cb->logits,
        .qkv = cb->qkv,
        .attn = cb->attn,
        .act = cb->act,
        .workspace = cb->ds_ws,
        .num_layers = c->num_layers,
        .H = c->hidden_size,
        .F = c->intermediate_size,
        .nh = c->num_heads,
        .nkv = c->num_kv_heads,
        .hd = c->head_dim,
        .V = c->vocab_size,
        .eps = (float)c->rms_norm_eps,
    };
    /* the greedy pick writes into the slot's result buffer; without a
     * mapped one, decode steps sample with the sampling kernels */
    for (int k = 0; k < 2; k++) cb->ds.pick_host[k] = cb->d_tokens_host[k];
    if (!cb->d_tokens_host[0]) cb->decode_step_pick = 0;
    env = getenv("REPLAY_DECODE_STEP_TRACE");
    const size_t trace_bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE * 8;
    if (env && strcmp(env, "0")) {
        if (rp_cuda_malloc((void **)&cb->ds.trace, trace_bytes, "decode step trace", err)) return RP_ERR;
        RP_CUDA_TRY(cudaMemset(cb->ds.trace, 0, trace_bytes), err); /* blocks with no attention item leave 0 */
    }
    const size_t tl_bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TL_PIECES * 4 * 8;
    if (cb->ds.trace && getenv("REPLAY_DECODE_STEP_TIMELINE")) {
        if (rp_cuda_malloc((void **)&cb->ds.timeline, tl_bytes, "decode step timeline", err)) return RP_ERR;
        RP_CUDA_TRY(cudaMemset(cb->ds.timeline, 0, tl_bytes), err);
    }
    for (int nb = 1; nb <= 4; nb *= 2) { /* 3 sequences run the kernel for 4 */
        const char *why = rp_decode_step_check_device(&cb->ds, nb, cb->num_sms);
        if (!why) cb->decode_step_ok |= 1 << nb;
        else rp_log_info("cuda: decode of %d sequence%s runs as a chain of kernels (%s)", nb, nb > 1 ? "s" : "", why);
    }
    return 0;
}

rp_backend *rp_backend_cuda_new(const rp_model *model, const rp_backend_config *cfg, rp_err *err) {
    const rp_model_config *c = &model->cfg;
    int ndev = rp_cuda_device_count();
    if (ndev == 0) {
        rp_errf(err, "no CUDA device found");
        return NULL;
    }
    if (cfg->device_id < 0 || cfg->device_id >= ndev) {
        rp_errf(err, "CUDA device %d does not exist (%d present)", cfg->device_id, ndev);
        return NULL;
    }
    if (cfg->num_pages < 0 || cfg->page_size <= 0 || cfg->max_batch_tokens <= 0 || cfg->max_batch_seqs <= 0) {
        rp_errf(err, "cuda backend: page_size and batch limits must be positive");
        return NULL;
    }
    if (c->head_dim != 64 && c->head_dim != 128) {
        rp_errf(err, "cuda backend: head_dim %d is not supported (64 and 128 are)", c->head_dim);
        return NULL;
    }
    rp_cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->base.model = model;
    cb->base.cfg = *cfg;
    rp_backend_config *bc = &cb->base.cfg;
    if (bc->max_logit_rows <= 0) bc->max_logit_rows = bc->max_batch_seqs;
    cb->device = cfg->device_id;
    cb->nkv = c->num_kv_heads;
    cb->q_dim = c->num_heads * c->head_dim;
    cb->kv_dim = c->num_kv_heads * c->head_dim;
    cb->qkv_dim = cb->q_dim + 2 * cb->kv_dim;
    cb->max_seqs = bc->max_batch_seqs;
    cb->max_logits = bc->max_logit_rows;
    cb->max_splits = 32;
    cb->ss_num_parts = rp_gemv_ss_parts(c->hidden_size);
    /* A/B switches for measurement and fallback (docs/cuda-graphs.md). */
    /* Fused decode path up to this many tokens: at T = 1 it saves ~4% on
     * qwen3-0.6b and is even on llama3-8b; at T = 8 staging 8 normalised
     * rows per block costs more than the launches it saves (llama3-8b
     * 12.2 vs 7.0 ms), see bench/RESULTS.md. */
    const char *env = getenv("REPLAY_FUSED_MAX_T");
    cb->fused_max_t = env ? atoi(env) : 1;
    env = getenv("REPLAY_PDL");
    rp_k_set_pdl(!(env && !strcmp(env, "0")));
    cb->layers = calloc((size_t)c->num_layers, sizeof *cb->layers);
    rp_err e2;
    if (!cb->layers) {
        rp_errf(err, "out of memory");
        goto fail;
    }
    if (cudaSetDevice(cb->device) != cudaSuccess) {
        rp_errf(err, "cudaSetDevice(%d) failed", cb->device);
        goto fail;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, cb->device) != cudaSuccess) {
        rp_errf(err, "cudaGetDeviceProperties failed");
        goto fail;
    }
    if (prop.major != 9 || prop.minor != 0) {
        /* the kernels are built for sm_90a only (wgmma-era Hopper code) */
        rp_errf(err, "%s is compute capability %d.%d; replay's CUDA kernels are built for Hopper (9.0: H100, H200). "
                     "Use --device cpu", prop.name, prop.major, prop.minor);
        goto fail;
    }
    cb->num_sms = prop.multiProcessorCount;
    cb->base.supports_token_refs = 1;
    if (cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&cb->ev_start_slot[0]) != cudaSuccess || cudaEventCreate(&cb->ev_end_slot[0]) != cudaSuccess ||
        cudaEventCreate(&cb->ev_start_slot[1]) != cudaSuccess || cudaEventCreate(&cb->ev_end_slot[1]) != cudaSuccess) {
        rp_errf(err, "cannot create a CUDA stream or events");
        goto fail;
    }
    cb->ev_start = cb->ev_start_slot[0];
    cb->ev_end = cb->ev_end_slot[0];
    if (bc->profile)
        for (int i = 0; i < RP_PROF_MAX; i++)
            if (cudaEventCreate(&cb->prof_events[i]) != cudaSuccess) {
                rp_errf(err, "cannot create profiling events");
                goto fail;
            }
    double t0 = rp_now_s();
    if (upload_weights(cb, err)) goto fail;
    rp_log_info("cuda: %s, %d SMs; weights %.2f GiB uploaded in %.2fs%s", prop.name, cb->num_sms,
                (double)cb->weights_bytes / (1 << 30), rp_now_s() - t0,
                model->dummy ? " (dummy, made on the GPU)" : "");
    if (alloc_activations(cb, err) || rp_gemm_init(&cb->gemm, LT_WORKSPACE_BYTES, err)) goto fail;
    /* The KV pool takes memory_ratio of what is left after weights,
     * activations and workspaces (mini-sglang's sizing), less a reserve for
     * the metadata block, graphs and the CUDA/cuBLAS runtime. */
    const size_t kv_page_bytes = 2 * (size_t)c->num_layers * (size_t)bc->page_size * (size_t)cb->kv_dim * 2;
    if (bc->num_pages <= 0) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            rp_errf(err, "cudaMemGetInfo failed");
            goto fail;
        }
        double ratio = bc->memory_ratio > 0 && bc->memory_ratio <= 1 ? bc->memory_ratio : 0.9;
        double reserve = 512.0 * (1 << 20);
        double usable = (double)free_b * ratio - reserve;
        bc->num_pages = usable > 0 ? (int)(usable / (double)kv_page_bytes) - 1 : 0;
        if (bc->num_pages < 1) {
            rp_errf(err, "no GPU memory left for the KV cache (%.2f GiB free after the weights)",
                    (double)free_b / (1 << 30));
            goto fail;
        }
    }
    int max_ctx = c->max_position_embeddings;
    if ((int64_t)bc->num_pages * bc->page_size < max_ctx) max_ctx = bc->num_pages * bc->page_size;
    cb->max_pages_per_seq = (max_ctx + bc->page_size - 1) / bc->page_size;
    cb->slots = (int64_t)(bc->num_pages + 1) * bc->page_size;
    cb->kv_layer_elems = (size_t)cb->slots * (size_t)cb->kv_dim;
    size_t kv_bytes = (size_t)(bc->num_pages + 1) * kv_page_bytes;
    if (rp_cuda_malloc((void **)&cb->kv_mem, kv_bytes, "the KV cache", err)) goto fail;
    cb->k_cache = cb->kv_mem;
    cb->v_cache = cb->kv_mem + (size_t)c->num_layers * cb->kv_layer_elems;
    if (cudaMemset(cb->kv_mem, 0, kv_bytes) != cudaSuccess) {
        rp_errf(err, "cudaMemset of the KV cache failed");
        goto fail;
    }
    if (plan_meta(cb, err)) goto fail;
    rp_log_info("cuda: KV cache %d pages x %d tokens (%.2f GiB), activations %.2f GiB for %d tokens / %d sequences",
                bc->num_pages, bc->page_size, (double)kv_bytes / (1 << 30), (double)cb->act_bytes / (1 << 30),
                bc->max_batch_tokens, bc->max_batch_seqs);
    if (setup_decode_step(cb, err)) goto fail;
    if (!bc->disable_cuda_graph && rp_cuda_graphs_capture(cb, err)) goto fail;
    cb->graphs_enabled = cb->num_graphs > 0;
    cb->allocs_at_ready = rp_cuda_alloc_count();
    return &cb->base;
fail:
    e2 = *err;
    cuda_destroy(&cb->base);
    *err = e2;
    return NULL;
}
