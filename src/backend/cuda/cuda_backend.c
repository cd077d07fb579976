/* The CUDA backend for Hopper: creation (the device memory plan), the
 * backend ops (forward, reading results, stats, profile) and destruction.
 * The pieces live beside it: cuda_weights.c (weight upload), cuda_meta.c
 * (the step's metadata block), forward_chain.c and forward_decode_step.c
 * (the forward pass, run eagerly or captured), graph_runner.c (decode
 * graphs), tuning.c (the tuning table).
 *
 * Everything is allocated in rp_backend_cuda_new: weights, the paged KV
 * cache plus one dummy page for padded graph slots, every activation sized
 * for the largest batch, the logits, and the metadata block; nothing after
 * the graphs are captured. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/token_mask.h"
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

/* The slot's results back to its pinned buffers after the sampling kernels
 * (where those do not write them there themselves). */
static int queue_result_copies(rp_cuda_backend *cb, rp_cuda_slot *sl, int num_logits, rp_err *err) {
    /* tokens and logprobs in one copy: two rows of the 2-D layout */
    const size_t pitch = (size_t)cb->max_logits * 4;
    if (!sl->d_tokens_host)
        RP_CUDA_TRY(cudaMemcpy2DAsync(sl->h_tokens, pitch, cb->d_tokens, pitch, (size_t)num_logits * 4, 2,
                                      cudaMemcpyDeviceToHost, cb->stream),
                    err);
    if (sl->top) /* only when asked: ~164 bytes a row */
        RP_CUDA_TRY(cudaMemcpyAsync(sl->h_top, cb->d_top, (size_t)num_logits * sizeof(rp_top_logprobs),
                                    cudaMemcpyDeviceToHost, cb->stream),
                    err);
    return 0;
}

static int cuda_forward(rp_backend *b, const rp_batch *bt, rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (rp_batch_validate(bt, b, err)) return RP_ERR;
    if (cb->slots[cb->cur_slot].deferred)
        return rp_errf(err, "the last forward deferred its sampling: call sample_masked first");
    const int S = bt->num_seqs, T = bt->num_tokens;
    int decode = T == S;
    int sample = bt->sample != NULL;
    /* Deferred sampling (structured output): the forward runs the same
     * launches, captured or not, but its sampling kernels see the skip flag
     * of the metadata block (cuda_meta.c) and do nothing; sample_masked
     * samples once the masks are here. sample_now: this forward samples. */
    const int deferred = bt->sample_deferred != 0, sample_now = sample && !deferred;
    /* A pure decode batch whose every row wants logits runs padded to its
     * bucket, replayed from the bucket's graph where captured, else eagerly
     * with the same launches (so graphs on and off compute the same). */
    const rp_cuda_graph *g = decode && bt->num_logits == S ? rp_cuda_graph_find(cb, S) : NULL;
    const int P = g ? g->batch_size : S; /* sequences, tokens and logit rows the decode step runs */
    int replay = g && g->exec && cb->graphs_enabled;
    /* Take the other slot: its previous forward's results were read (at most
     * one forward may be pending when another is launched), so its pinned
     * buffers are free and its copies long done. */
    if (cb->num_pending >= 2) return rp_errf(err, "two forwards in flight: read the older one's results first");
    cb->cur_slot ^= 1;
    rp_cuda_slot *sl = &cb->slots[cb->cur_slot];
    sl->top = 0;
    /* the one-kernel step's in-kernel pick takes no mask: a deferred step
     * runs the separate sampling kernels, never an unmasked pick */
    int greedy = sample_now;
    for (int i = 0; sample && i < bt->num_logits; i++) {
        if (bt->sample[i].top_logprobs > 0) sl->top = 1;
        if (bt->sample[i].top_logprobs > 0 || bt->sample[i].temperature != 0.0f) greedy = 0;
    }
    sl->sampled = sample_now;
    sl->deferred = 0; /* set once the forward is queued: a failed one leaves nothing to sample */
    sl->num_logits = bt->num_logits;
    if (cudaSetDevice(cb->device) != cudaSuccess) return rp_errf(err, "cudaSetDevice(%d) failed", cb->device);
    /* a step with prompt chunks: padded to its token bucket */
    const rp_cuda_step_bucket *bk = decode ? NULL : rp_cuda_step_bucket_find(cb, T, bt->num_logits);
    if (!decode && !bk)
        return rp_errf(err, "no step bucket holds %d tokens with %d logits rows", T, bt->num_logits);
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventRecord(sl->ev_start, cb->stream), err);
    if (bk ? rp_cuda_pack_step(cb, bt, bk, err) : rp_cuda_pack_and_upload(cb, bt, P, err))
        return RP_ERR;
    double t1 = rp_now_s();
    /* A decode whose K/V outgrows the one-kernel step runs the chain (its
     * bucket's chain graph), whose attention spreads over the whole GPU. */
    cb->decode_chain = 0;
    const int step_nb = g ? rp_cuda_decode_step_nb(cb, P, P, P, 1) : rp_cuda_decode_step_nb(cb, T, S, bt->num_logits, decode);
    long kv = 0; /* 1-4 sequences: only where the one kernel could run */
    for (int i = 0; step_nb && i < S; i++) kv += bt->seq_kv_len[i];
    /* and so does a speculative round (rows shared): the one kernel keeps a
     * token's new K/V to itself, where the next position reads them */
    cb->decode_chain =
        step_nb && (bt->spec_round || kv > (step_nb == 1 ? cb->ds_tuning.max_kv : cb->ds_tuning.max_kv / 2));
    cb->last_decode_step = cb->decode_chain ? 0 : step_nb;
    if (replay && cb->decode_chain && !g->exec_chain) replay = 0;
    greedy = greedy && cb->last_decode_step && rp_cuda_decode_step_can_pick(cb, P) && (!replay || g->exec_pick);
    if (cb->last_decode_step) cb->decode_step_forwards++;
    if (greedy) cb->decode_step_picks++;
    cb->logits_ungathered = greedy && cb->comm;
    if (replay) {
        cudaGraphExec_t ex = cb->decode_chain ? g->exec_chain : greedy && g->exec_pick ? g->exec_pick : g->exec;
        RP_CUDA_TRY(cudaGraphLaunch(ex, cb->stream), err);
        cb->stats.graph_replays++;
    } else if (bk && bk->exec && cb->graphs_enabled) {
        /* captured with the sampling kernels; a step sampled on the host
         * ignores what they drew */
        RP_CUDA_TRY(cudaGraphLaunch(bk->exec, cb->stream), err);
        cb->stats.graph_replays++;
    } else if (bk) {
        /* eagerly a deferred step launches no sampling kernels at all */
        if (rp_cuda_launch_forward(cb, bk->tokens, bk->attn.dec_seqs, bk->logits, 0, &bk->attn,
                                   sample_now ? RP_SAMPLE_KERNELS : RP_SAMPLE_NONE, err))
            return RP_ERR;
    } else if (g) {
        if (rp_cuda_launch_forward(cb, P, P, P, 1, NULL,
                                   greedy ? RP_SAMPLE_PICK : sample_now ? RP_SAMPLE_KERNELS : RP_SAMPLE_NONE, err))
            return RP_ERR;
    } else {
        if (rp_cuda_launch_forward(cb, T, S, bt->num_logits, decode, NULL,
                                   greedy ? RP_SAMPLE_PICK : sample_now ? RP_SAMPLE_KERNELS : RP_SAMPLE_NONE, err))
            return RP_ERR;
    }
    /* The greedy pick and (mapped buffers) the sampling kernels wrote them
     * into the slot's pinned buffers themselves. */
    if (sample_now && !greedy && queue_result_copies(cb, sl, bt->num_logits, err)) return RP_ERR;
    RP_CUDA_TRY(cudaEventRecord(sl->ev_end, cb->stream), err);
    cb->stats.last_pack_ms = (t1 - t0) * 1e3;
    cb->stats.last_launch_ms = (rp_now_s() - t1) * 1e3;
    cb->stats.forwards++;
    cb->timing_pending = 1;
    cb->num_pending++;
    sl->deferred = deferred;
    return 0;
}

/* The deferred forward's sampling, queued behind it: the masks the engine
 * computed while the forward ran go to the device on the mask stream (the
 * copy overlaps the forward's end), the mask kernel waits for them and sets
 * the disallowed logits to -inf, then the sampling kernels run as they do
 * in a forward, over the batch's rows only. */
static int cuda_sample_masked(rp_backend *b, const uint32_t *masks, int num_masks, const int32_t *mask_of_row,
                              rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    rp_cuda_slot *sl = &cb->slots[cb->cur_slot];
    if (!sl->deferred) return rp_errf(err, "the last forward did not defer its sampling");
    const int n = sl->num_logits, V = cb->vocab;
    if (num_masks < 0 || num_masks > cb->max_logits)
        return rp_errf(err, "%d token masks (at most %d)", num_masks, cb->max_logits);
    int masked = 0;
    for (int i = 0; mask_of_row && i < n; i++) {
        if (mask_of_row[i] < -1 || mask_of_row[i] >= num_masks)
            return rp_errf(err, "logit row %d names mask %d of %d", i, mask_of_row[i], num_masks);
        masked |= mask_of_row[i] >= 0;
    }
    RP_CUDA_TRY(cudaSetDevice(cb->device), err);
    if (masked) {
        /* The slot's pinned block: free, since the slot's previous forward
         * was read before this one was launched. One copy brings the rows'
         * indices and the masks named (the block's gap between them is at
         * most max_logits ints). */
        const size_t mask_bytes = (size_t)num_masks * (size_t)cb->mask_words * 4;
        memcpy(sl->h_mask, mask_of_row, (size_t)n * 4);
        memcpy(sl->h_mask + cb->mask_masks_off, masks, mask_bytes);
        RP_CUDA_TRY(cudaStreamWaitEvent(cb->mask_stream, cb->ev_mask_free, 0), err);
        RP_CUDA_TRY(cudaMemcpyAsync(cb->d_mask_of_row, sl->h_mask, cb->mask_masks_off + mask_bytes,
                                    cudaMemcpyHostToDevice, cb->mask_stream),
                    err);
        RP_CUDA_TRY(cudaEventRecord(cb->ev_mask_ready, cb->mask_stream), err);
        RP_CUDA_TRY(cudaStreamWaitEvent(cb->stream, cb->ev_mask_ready, 0), err);
        RP_LAUNCH(rp_k_apply_token_mask(cb->logits, cb->d_mask_of_row, cb->d_masks, n, V, cb->mask_words,
                                        cb->stream),
                  err);
        RP_CUDA_TRY(cudaEventRecord(cb->ev_mask_free, cb->stream), err);
    }
    /* the profile times the forward alone: these launches leave no marks */
    const int prof_n = cb->prof_n;
    const int rc = rp_cuda_launch_sample(cb, n, NULL, err);
    cb->prof_n = prof_n;
    if (rc || queue_result_copies(cb, sl, n, err)) return RP_ERR;
    RP_CUDA_TRY(cudaEventRecord(sl->ev_end, cb->stream), err);
    sl->deferred = 0;
    sl->sampled = 1;
    return 0;
}

static int finish_step(rp_cuda_backend *cb, rp_err *err) {
    const rp_cuda_slot *sl = &cb->slots[cb->cur_slot];
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventSynchronize(sl->ev_end), err);
    if (cb->timing_pending) cb->stats.last_sync_ms = (rp_now_s() - t0) * 1e3;
    if (cb->timing_pending) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, sl->ev_start, sl->ev_end) == cudaSuccess) cb->stats.last_gpu_ms = ms;
        cb->timing_pending = 0;
    }
    return 0;
}

/* Returns the tokens of the oldest forward not yet read (with overlap, the
 * one before the last). */
static int cuda_read_tokens(rp_backend *b, int32_t *tokens, float *logprobs, rp_top_logprobs *top, rp_err *err) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (cb->num_pending == 0) return rp_errf(err, "no forward to read");
    const int slot = cb->num_pending == 2 ? cb->cur_slot ^ 1 : cb->cur_slot;
    const rp_cuda_slot *sl = &cb->slots[slot];
    if (!sl->sampled) return rp_errf(err, "that forward did not sample");
    double t0 = rp_now_s();
    RP_CUDA_TRY(cudaEventSynchronize(sl->ev_end), err);
    cb->stats.last_sync_ms = (rp_now_s() - t0) * 1e3;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, sl->ev_start, sl->ev_end) == cudaSuccess) cb->stats.last_gpu_ms = ms;
    if (slot == cb->cur_slot) cb->timing_pending = 0;
    memcpy(tokens, sl->h_tokens, (size_t)sl->num_logits * 4);
    if (logprobs) memcpy(logprobs, sl->h_logprobs, (size_t)sl->num_logits * 4);
    if (top) {
        if (sl->top) memcpy(top, sl->h_top, (size_t)sl->num_logits * sizeof *top);
        else
            for (int i = 0; i < sl->num_logits; i++) top[i].n = 0;
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
    if (cb->logits_ungathered) { /* every rank reads them (tp_backend.c): a collective */
        if (rp_cuda_tp_gather_logits(cb, cb->slots[cb->cur_slot].num_logits, err)) return RP_ERR;
        RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
        cb->logits_ungathered = 0;
    }
    RP_CUDA_TRY(cudaMemcpy(dst, cb->logits, (size_t)cb->slots[cb->cur_slot].num_logits * cb->vocab * 4,
                           cudaMemcpyDeviceToHost),
                err);
    return 0;
}

static void cuda_stats(rp_backend *b, rp_backend_stats *out) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    *out = cb->stats;
    out->device_allocs = rp_cuda_alloc_count() - cb->allocs_at_ready;
    out->decode_step_forwards = cb->decode_step_forwards;
    out->decode_step_picks = cb->decode_step_picks;
}

static int cuda_profile(rp_backend *b, rp_profile_entry *out, int max) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (cudaEventSynchronize(cb->slots[cb->cur_slot].ev_end) != cudaSuccess) return 0;
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
    cb->graphs_enabled = enabled && cb->num_decode_graphs + cb->num_step_graphs > 0;
}

static void cuda_destroy(rp_backend *b) {
    rp_cuda_backend *cb = (rp_cuda_backend *)b;
    if (!cb) return;
    cudaSetDevice(cb->device);
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    rp_cuda_decode_step_trace_finish(cb);
    rp_cuda_graphs_destroy(cb);
    rp_gemm_destroy(&cb->gemm);
    void *dev[] = {cb->w.mem, cb->w.deq, cb->w.xq, cb->w.x_scale, cb->kv_mem, cb->act_mem, cb->meta.dev, cb->d_layers};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) rp_cuda_free(dev[i]);
    for (int k = 0; k < 2; k++) {
        rp_cuda_slot *sl = &cb->slots[k];
        if (sl->h_meta) cudaFreeHost(sl->h_meta);
        if (sl->h_tokens) cudaFreeHost(sl->h_tokens);
        if (sl->h_top) cudaFreeHost(sl->h_top);
        if (sl->h_mask) cudaFreeHost(sl->h_mask);
        if (sl->ev_start) cudaEventDestroy(sl->ev_start);
        if (sl->ev_end) cudaEventDestroy(sl->ev_end);
    }
    for (int i = 0; i < RP_PROF_MAX; i++)
        if (cb->prof_events[i]) cudaEventDestroy(cb->prof_events[i]);
    if (cb->ev_mask_ready) cudaEventDestroy(cb->ev_mask_ready);
    if (cb->ev_mask_free) cudaEventDestroy(cb->ev_mask_free);
    if (cb->mask_stream) cudaStreamDestroy(cb->mask_stream);

    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb->w.layers);
    free(cb);
}

static const rp_backend_ops cuda_ops = {
    .forward = cuda_forward,
    .read_logits = cuda_read_logits,
    .read_tokens = cuda_read_tokens,
    .sample_masked = cuda_sample_masked,
    .destroy = cuda_destroy,
    .stats = cuda_stats,
    .set_graphs = cuda_set_graphs,
    .profile = cuda_profile,
};

rp_cuda_backend *rp_cuda_backend_of(rp_backend *b) { return b && b->ops == &cuda_ops ? (rp_cuda_backend *)b : NULL; }

rp_kv_cache rp_cuda_kv_layer(const rp_cuda_backend *cb, int l) {
    const size_t off = (size_t)l * cb->kv_layer_elems * cb->kv_elem_bytes;
    const int fp8 = cb->kv_format == RP_KV_FORMAT_E4M3;
    rp_kv_cache kv = {(uint8_t *)cb->k_cache + off, (uint8_t *)cb->v_cache + off, cb->kv_format,
                      fp8 ? rp_model_k_scale(cb->base.model, l) : 1.0f, fp8 ? rp_model_v_scale(cb->base.model, l) : 1.0f};
    return kv;
}

static int alloc_activations(rp_cuda_backend *cb, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    /* rows for the block-scaled FP8 products' padding too (gemm.h) */
    const size_t T = (size_t)rp_gemm_fp8_blocks_pad(cb->base.cfg.max_batched_tokens), H = (size_t)c->hidden_size,
                 F = (size_t)c->intermediate_size, Lg = (size_t)cb->max_logits, V = (size_t)cb->vocab;
    /* tensor parallelism: the lm_head's shard of the logits and every rank's (0 bytes without) */
    const size_t Vs = cb->comm ? (size_t)cb->vocab_per_rank : 0, ranks = cb->comm ? (size_t)cb->base.cfg.tp.size : 0;
    size_t attn_ws = rp_attn_decode_workspace_bytes(cb->max_seqs, c->num_heads, c->head_dim, cb->max_splits);
    const size_t prefill_ws = rp_attn_prefill_workspace_bytes((int)T, c->num_heads, c->head_dim, cb->num_sms);
    if (prefill_ws > attn_ws) attn_ws = prefill_ws;
    size_t sample_ws = rp_sample_workspace_bytes(cb->max_logits, cb->vocab);
    /* token masks: every logit row's mask index, then a mask per row (the
     * whole vocabulary, also under tensor parallelism) */
    cb->mask_words = rp_token_mask_words(cb->vocab);
    cb->mask_masks_off = rp_align_up(Lg * 4, 256);
    const size_t mask_block = cb->mask_masks_off + Lg * (size_t)cb->mask_words * 4;
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
        {(void **)&cb->logits_shard, Lg * Vs * 4},
        {(void **)&cb->logits_gather, ranks * Lg * Vs * 4},
        {(void **)&cb->inv_freq, (size_t)c->head_dim / 2 * 4},
        {(void **)&cb->ss_parts, (size_t)rp_gemv_ss_parts(c->hidden_size) * RP_GEMV_MAX_T * 4},
        {(void **)&cb->d_tokens, 2 * Lg * 4}, /* then the logprobs: one copy brings both back */
        {(void **)&cb->d_kept, Lg * 4},
        {(void **)&cb->d_top, Lg * sizeof(rp_top_logprobs)},
        {&cb->attn_ws, attn_ws},
        {&cb->sample_ws, sample_ws},
        {(void **)&cb->d_mask_of_row, mask_block},
        {&cb->ds_ws, rp_decode_step_workspace_bytes(c->num_heads, c->num_kv_heads)},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) total += rp_align_up(parts[i].bytes, 256);
    if (rp_cuda_malloc((void **)&cb->act_mem, total, "activations", err)) return RP_ERR;
    uint8_t *p = cb->act_mem;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        *parts[i].ptr = p;
        p += rp_align_up(parts[i].bytes, 256);
    }
    cb->d_logprobs = (float *)(cb->d_tokens + Lg);
    cb->d_masks = (uint32_t *)((uint8_t *)cb->d_mask_of_row + cb->mask_masks_off);
    cb->attn_ws_bytes = attn_ws;
    /* a step's padding rows are never written by attention: zeros, not
     * whatever the allocation held, go through the products after it */
    RP_CUDA_TRY(cudaMemset(cb->attn, 0, T * (size_t)cb->q_dim * 2), err);
    cb->act_bytes = total;
    RP_CUDA_TRY(cudaMemset(cb->ds_ws, 0, rp_decode_step_workspace_bytes(c->num_heads, c->num_kv_heads)), err);
    float *h_inv = malloc((size_t)c->head_dim / 2 * 4);
    if (!h_inv) return rp_errf(err, "out of memory");
    rp_rope_inv_freq(c, h_inv);
    cb->rope_scale = rp_rope_attention_scale(c);
    cudaError_t e = cudaMemcpy(cb->inv_freq, h_inv, (size_t)c->head_dim / 2 * 4, cudaMemcpyHostToDevice);
    free(h_inv);
    RP_CUDA_TRY(e, err);
    for (int k = 0; k < 2; k++) {
        /* the device layout: tokens, then logprobs, Lg apart */
        rp_cuda_slot *sl = &cb->slots[k];
        RP_CUDA_TRY(cudaMallocHost((void **)&sl->h_tokens, 2 * Lg * 4), err);
        sl->h_logprobs = (float *)(sl->h_tokens + Lg);
        RP_CUDA_TRY(cudaMallocHost((void **)&sl->h_top, Lg * sizeof(rp_top_logprobs)), err);
        RP_CUDA_TRY(cudaMallocHost((void **)&sl->h_mask, mask_block), err);
    }
    /* The sampling kernels and the greedy pick write each step's results
     * straight into the slot's pinned buffers through their mapped device
     * addresses; where the mapping fails, they are copied after the step. */
    for (int k = 0; k < 2; k++)
        if (cudaHostGetDevicePointer((void **)&cb->slots[k].d_tokens_host, cb->slots[k].h_tokens, 0) != cudaSuccess) {
            cudaGetLastError();
            rp_log_info("cuda: pinned result buffers are not mapped: the results are copied after each step");
            cb->slots[0].d_tokens_host = cb->slots[1].d_tokens_host = NULL;
            break;
        }
    return 0;
}

/* Tensor parallelism: this process's ranks meet on the host (backend.h:
 * rp_backend_tp.host), so that none allocates while the others' collectives
 * wait for its kernels. */
static int host_barrier(rp_cuda_backend *cb, rp_err *err) {
    rp_comm *h = cb->base.cfg.tp.host;
    return h ? rp_comm_barrier(h, NULL, err) : 0;
}

/* Tensor parallelism: the KV pages of the rank with the fewest, on every
 * rank (an all-gather of each rank's count, before any graph is captured). */
static int agree_num_pages(rp_cuda_backend *cb, rp_err *err) {
    const int n = cb->base.cfg.tp.size;
    float mine = (float)cb->base.cfg.num_pages, all[RP_TP_MAX_SIZE];
    float *d = cb->tmp; /* free until the first forward */
    RP_CUDA_TRY(cudaMemcpyAsync(d, &mine, sizeof mine, cudaMemcpyHostToDevice, cb->stream), err);
    if (rp_comm_all_gather(cb->comm, d, d + 1, 1, RP_COMM_F32, cb->stream, err)) return RP_ERR;
    RP_CUDA_TRY(cudaMemcpyAsync(all, d + 1, (size_t)n * sizeof *all, cudaMemcpyDeviceToHost, cb->stream), err);
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    for (int k = 0; k < n; k++)
        if (all[k] < mine) mine = all[k];
    cb->base.cfg.num_pages = (int)mine;
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
    if (cfg->num_pages < 0 || cfg->page_size <= 0 || cfg->max_batched_tokens <= 0 || cfg->max_batch_seqs <= 0) {
        rp_errf(err, "cuda backend: page_size and batch limits must be positive");
        return NULL;
    }
    if (c->head_dim != 64 && c->head_dim != 128) {
        rp_errf(err, "cuda backend: head_dim %d is not supported (64 and 128 are)", c->head_dim);
        return NULL;
    }
#ifndef REPLAY_DECODE_STEP_TRACE
    if (cfg->trace_timeline_path) {
        rp_errf(err, "a decode step timeline needs a trace build (cmake -DREPLAY_DECODE_STEP_TRACE=ON)");
        return NULL;
    }
#endif
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
    bc->kv_dtype = rp_kv_dtype_resolve(cfg->kv_dtype, c);
    cb->kv_format = bc->kv_dtype == RP_KV_FP8 ? RP_KV_FORMAT_E4M3 : RP_KV_FORMAT_BF16;
    cb->kv_elem_bytes = cb->kv_format == RP_KV_FORMAT_E4M3 ? 1 : 2;
    cb->ss_num_parts = rp_gemv_ss_parts(c->hidden_size);
    cb->vocab = rp_backend_vocab(&cb->base);
    rp_tp_vocab tv;
    if (rp_backend_tp_vocab(cfg, c, "cuda backend", &tv, err)) {
        free(cb);
        return NULL;
    }
    cb->vocab_start = tv.start, cb->vocab_count = tv.count, cb->vocab_per_rank = tv.per_rank;
    if (cfg->tp.size > 1) {
        const rp_tp_plan *plan = cfg->tp.plan;
        cb->comm = cfg->tp.comm;
        if (cfg->tp.rank == 0)
            rp_log_info("cuda: tensor parallel rank 0 of %d: one sequence decodes in the one-kernel step (its sums "
                        "through peer memory, where the GPUs allow), several in the chain of kernels (the one-token "
                        "fused path has no point for the all-reduces)",
                        plan->size);
    }
    cb->w.layers = calloc((size_t)c->num_layers, sizeof *cb->w.layers);
    rp_err e2;
    if (!cb->w.layers) {
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
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, cb->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, cb->device) != cudaSuccess) {
        rp_errf(err, "cannot read the memory clock and bus width of %s", prop.name);
        goto fail;
    }
    cb->hbm_peak_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8) / 1e9; /* double data rate */
    cb->base.supports_token_refs = 1;
    int streams_ok = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking) == cudaSuccess &&
                     cudaStreamCreateWithFlags(&cb->mask_stream, cudaStreamNonBlocking) == cudaSuccess &&
                     cudaEventCreateWithFlags(&cb->ev_mask_ready, cudaEventDisableTiming) == cudaSuccess &&
                     cudaEventCreateWithFlags(&cb->ev_mask_free, cudaEventDisableTiming) == cudaSuccess;
    for (int k = 0; k < 2 && streams_ok; k++)
        streams_ok = cudaEventCreate(&cb->slots[k].ev_start) == cudaSuccess &&
                     cudaEventCreate(&cb->slots[k].ev_end) == cudaSuccess;
    if (!streams_ok) {
        rp_errf(err, "cannot create a CUDA stream or events");
        goto fail;
    }
    if (bc->profile)
        for (int i = 0; i < RP_PROF_MAX; i++)
            if (cudaEventCreate(&cb->prof_events[i]) != cudaSuccess) {
                rp_errf(err, "cannot create profiling events");
                goto fail;
            }
    double t0 = rp_now_s();
    if (rp_cuda_upload_weights(cb, err)) goto fail;
    rp_log_info("cuda: %s, %d SMs; weights %.2f GiB uploaded in %.2fs%s", prop.name, cb->num_sms,
                (double)cb->w.bytes / (1 << 30), rp_now_s() - t0,
                model->dummy ? " (dummy, made on the GPU)" : "");
    if (alloc_activations(cb, err) || rp_gemm_init(&cb->gemm, LT_WORKSPACE_BYTES, err) || rp_cuda_fp8_setup(cb, err))
        goto fail;
    /* The KV pool takes memory_ratio of what is left after weights,
     * activations and workspaces (mini-sglang's sizing), less a reserve for
     * the metadata block, graphs and the CUDA/cuBLAS runtime. A page's bytes
     * are the format's (rp_kv_page_bytes): e4m3 pages are half, twice the
     * tokens. */
    const size_t kv_page_bytes = rp_kv_page_bytes(c, bc->page_size, bc->kv_dtype);
    if (bc->num_pages <= 0) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            rp_errf(err, "cudaMemGetInfo failed");
            goto fail;
        }
        double ratio = bc->memory_ratio > 0 && bc->memory_ratio <= 1 ? bc->memory_ratio : 0.9;
        double reserve = 512.0 * (1 << 20);
        double usable = (double)free_b * ratio - reserve - (double)bc->reserve_bytes;
        bc->num_pages = rp_kv_pool_pages(usable, kv_page_bytes, bc->shadow_page_bytes);
        if (bc->num_pages < 1) {
            if (bc->reserve_bytes)
                rp_errf(err, "no GPU memory left for the KV cache beside the draft model: %.2f GiB free after the "
                             "weights, %.2f of it usable (--gpu-memory-utilization %.2f), of which the draft model "
                             "needs %.2f GiB (raise --gpu-memory-utilization or choose a smaller draft model)",
                        (double)free_b / (1 << 30), (double)free_b * ratio / (1 << 30), ratio,
                        (double)bc->reserve_bytes / (1 << 30));
            else
                rp_errf(err, "no GPU memory left for the KV cache (%.2f GiB free after the weights)",
                        (double)free_b / (1 << 30));
            goto fail;
        }
    }
    /* tensor parallelism: every rank must hold the same pages (the engine
     * places each sequence's K/V at the same slots on all of them), so each
     * takes the smallest rank's pool */
    if (cb->comm && (host_barrier(cb, err) || agree_num_pages(cb, err))) goto fail;
    int max_ctx = c->max_position_embeddings;
    if ((int64_t)bc->num_pages * bc->page_size < max_ctx) max_ctx = bc->num_pages * bc->page_size;
    cb->max_pages_per_seq = (max_ctx + bc->page_size - 1) / bc->page_size;
    cb->kv_slots = (int64_t)(bc->num_pages + 1) * bc->page_size;
    cb->kv_layer_elems = (size_t)cb->kv_slots * (size_t)cb->kv_dim;
    size_t kv_bytes = (size_t)(bc->num_pages + 1) * kv_page_bytes;
    if (rp_cuda_malloc((void **)&cb->kv_mem, kv_bytes, "the KV cache", err)) goto fail;
    cb->k_cache = cb->kv_mem;
    cb->v_cache = cb->kv_mem + (size_t)c->num_layers * cb->kv_layer_elems * cb->kv_elem_bytes;
    if (cudaMemset(cb->kv_mem, 0, kv_bytes) != cudaSuccess) {
        rp_errf(err, "cudaMemset of the KV cache failed");
        goto fail;
    }
    if (rp_cuda_plan_meta(cb, err)) goto fail;
    rp_cuda_step_buckets_plan(cb);
    if (rp_cuda_decode_buckets_plan(cb, err)) goto fail;
    rp_log_info("cuda: KV cache %s, %d pages x %d tokens = %ld tokens (%.2f GiB), activations %.2f GiB for %d "
                "tokens / %d sequences",
                rp_kv_dtype_name(bc->kv_dtype), bc->num_pages, bc->page_size, (long)bc->num_pages * bc->page_size,
                (double)kv_bytes / (1 << 30), (double)cb->act_bytes / (1 << 30), bc->max_batched_tokens,
                bc->max_batch_seqs);
    if (cb->kv_format == RP_KV_FORMAT_E4M3)
        rp_log_info("cuda: fp8 KV cache: prefill attention runs the mma.sync kernel (the Hopper wgmma kernel reads "
                    "bf16 pages only), decode the chain of kernels");
    if (rp_cuda_decode_step_setup(cb, err)) goto fail;
    /* the graphs' warm-up steps run the collectives: every local rank is done allocating */
    if (cb->comm && host_barrier(cb, err)) goto fail;
    if (!bc->disable_cuda_graph && rp_cuda_graphs_capture(cb, err)) goto fail;
    cb->graphs_enabled = cb->num_decode_graphs + cb->num_step_graphs > 0;
    cb->allocs_at_ready = rp_cuda_alloc_count();
    return &cb->base;
fail:
    e2 = *err;
    cuda_destroy(&cb->base);
    *err = e2;
    return NULL;
}
