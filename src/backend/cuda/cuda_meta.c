/* The step's metadata block: everything a step reads that changes from step
 * to step (tokens, positions, slot mapping, per-sequence offsets and KV
 * lengths, the pages of each sequence, sampling parameters), packed into
 * pinned host memory and copied with one cudaMemcpyAsync to fixed device
 * addresses that every kernel, and so every captured graph, reads. Two
 * pinned copies (the step slots), so step N + 1 is packed while step N
 * runs. */
#include <string.h>

#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"

int rp_cuda_plan_meta(rp_cuda_backend *cb, rp_err *err) {
    const rp_backend_config *bc = &cb->base.cfg;
    size_t o = 0;
    const size_t T = (size_t)bc->max_batched_tokens, S = (size_t)cb->max_seqs, L = (size_t)cb->max_logits;
    cb->meta.off_tokens = o, o += T * 4;
    cb->meta.off_positions = o, o += T * 4;
    cb->meta.off_slots = o, o += T * 4;
    cb->meta.off_seq_start = o, o += (S + 1) * 4;
    cb->meta.off_kv_len = o, o += S * 4;
    cb->meta.off_page_row = o, o += S * 4;
    cb->meta.off_logit_token = o, o += L * 4;
    cb->meta.off_out_slot = o, o += 4; /* which host slot the step's results go to (rp_decode_step.pick_host) */
    /* 1: the step's sampling waits for token masks (rp_batch.sample_deferred):
     * the sampling kernels of its forward, captured or not, do nothing */
    cb->meta.off_skip_sample = o, o += 4;
    o = rp_align_up(o, 16);
    cb->meta.off_params = o, o += L * sizeof(rp_sampling_params);
    o = rp_align_up(o, 16);
    /* a step with prompt chunks: its attention header and work list */
    const rp_model_config *c = &cb->base.model->cfg;
    cb->meta.pf_items_cap = rp_attn_step_max_items((int)T, (int)S, cb->num_sms, c->num_heads, c->num_kv_heads);
    cb->meta.off_attn_hdr = o, o += RP_ATTN_HDR_LEN * 4;
    cb->meta.off_pf_items = o, o += (size_t)cb->meta.pf_items_cap * RP_ATTN_ITEM_INTS * 4;
    o = rp_align_up(o, 16);
    /* The pages of every sequence in the batch, packed one after another;
     * seq_page_row[s] is where sequence s's list starts and the stride is 1,
     * so only the pages in use cross PCIe each step. With the prefix cache
     * sequences share pages, so the lists can name far more ids than the
     * pool has pages: room for every sequence at its longest (a few MB at
     * most, of which a step copies only what it uses). */
    cb->meta.page_capacity = S * (size_t)cb->max_pages_per_seq;
    cb->meta.off_pages = o, o += cb->meta.page_capacity * 4;
    cb->meta.bytes = o;
    if (rp_cuda_malloc((void **)&cb->meta.dev, o, "step metadata", err)) return RP_ERR;
    for (int k = 0; k < 2; k++) {
        RP_CUDA_TRY(cudaMallocHost((void **)&cb->slots[k].h_meta, o), err);
        memset(cb->slots[k].h_meta, 0, o);
    }
    return 0;
}

static int upload_meta(rp_cuda_backend *cb, size_t bytes, rp_err *err);

/* memcpy with a null source is undefined even for 0 bytes, and a capture's
 * batch is empty (all padding) with null arrays. */
static void copy_bytes_n(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}

/* Packs a batch (padded to padded_seqs one-token dummy sequences when >
 * num_seqs) into the pinned block; returns the bytes to copy. */
static int pack_meta(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, size_t *copy_bytes, rp_err *err) {
    uint8_t *h = cb->slots[cb->cur_slot].h_meta;
    int32_t *tokens = RP_META(cb, h, off_tokens, int32_t), *pos = RP_META(cb, h, off_positions, int32_t),
            *slots = RP_META(cb, h, off_slots, int32_t), *seq_start = RP_META(cb, h, off_seq_start, int32_t),
            *kv_len = RP_META(cb, h, off_kv_len, int32_t), *page_row = RP_META(cb, h, off_page_row, int32_t),
            *logit_token = RP_META(cb, h, off_logit_token, int32_t), *pages = RP_META(cb, h, off_pages, int32_t);
    rp_sampling_params *params = RP_META(cb, h, off_params, rp_sampling_params);
    const int ps = cb->base.cfg.page_size, S = bt->num_seqs, T = bt->num_tokens;
    const int32_t dummy_page = cb->base.cfg.num_pages;
    copy_bytes_n(tokens, bt->tokens, (size_t)T * 4);
    copy_bytes_n(pos, bt->positions, (size_t)T * 4);
    copy_bytes_n(slots, bt->slot_mapping, (size_t)T * 4);
    copy_bytes_n(seq_start, bt->seq_start, (size_t)(S + 1) * 4);
    copy_bytes_n(kv_len, bt->seq_kv_len, (size_t)S * 4);
    copy_bytes_n(logit_token, bt->logit_token, (size_t)bt->num_logits * 4);
    *RP_META(cb, h, off_out_slot, int32_t) = cb->cur_slot;
    *RP_META(cb, h, off_skip_sample, int32_t) = bt->sample_deferred != 0;
    if (bt->sample) copy_bytes_n(params, bt->sample, (size_t)bt->num_logits * sizeof *params);
    else memset(params, 0, (size_t)bt->num_logits * sizeof *params); /* greedy */
    size_t np = 0;
    for (int s = 0; s < S; s++) {
        int n = (bt->seq_kv_len[s] + ps - 1) / ps;
        if (np + (size_t)n > cb->meta.page_capacity)
            return rp_errf(err, "batch lists %zu KV pages, more than the %zu the step block holds", np + (size_t)n,
                           cb->meta.page_capacity);
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
    *copy_bytes = cb->meta.off_pages + np * 4;
    return 0;
}

int rp_cuda_pack_step(rp_cuda_backend *cb, const rp_batch *bt, const rp_cuda_step_bucket *bk, rp_err *err) {
    size_t bytes = 0;
    if (pack_meta(cb, bt, bt->num_seqs, &bytes, err)) return RP_ERR;
    uint8_t *h = cb->slots[cb->cur_slot].h_meta;
    int32_t *tokens = RP_META(cb, h, off_tokens, int32_t), *pos = RP_META(cb, h, off_positions, int32_t),
            *slots = RP_META(cb, h, off_slots, int32_t), *logit_token = RP_META(cb, h, off_logit_token, int32_t);
    rp_sampling_params *params = RP_META(cb, h, off_params, rp_sampling_params);
    /* Padding tokens belong to no sequence: position 0, their K/V written
     * to the dummy page; padding logit rows read token 0 and are sampled
     * greedily and ignored. */
    const int ps = cb->base.cfg.page_size;
    for (int t = bt->num_tokens; t < bk->tokens; t++) {
        tokens[t] = 0;
        pos[t] = 0;
        slots[t] = cb->base.cfg.num_pages * ps;
    }
    for (int r = bt->num_logits; r < bk->logits; r++) {
        logit_token[r] = 0;
        memset(&params[r], 0, sizeof *params);
    }
    const rp_model_config *c = &cb->base.model->cfg;
    if (rp_attn_step_plan(&bk->attn, RP_META(cb, h, off_seq_start, int32_t), RP_META(cb, h, off_kv_len, int32_t),
                          bt->num_seqs, cb->num_sms, c->num_heads, c->num_kv_heads, c->head_dim,
                          RP_META(cb, h, off_attn_hdr, int32_t), RP_META(cb, h, off_pf_items, int32_t)))
        return rp_errf(err, "a step of %d tokens in %d sequences does not fit its bucket of %d tokens",
                       bt->num_tokens, bt->num_seqs, bk->tokens);
    return upload_meta(cb, bytes, err);
}

/* Uploads an already packed metadata block. */
static int upload_meta(rp_cuda_backend *cb, size_t bytes, rp_err *err) {
    const uint8_t *h = cb->slots[cb->cur_slot].h_meta;
    RP_CUDA_TRY(cudaMemcpyAsync(cb->meta.dev, h, bytes, cudaMemcpyHostToDevice, cb->stream), err);
    return 0;
}

int rp_cuda_pack_and_upload(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, rp_err *err) {
    size_t bytes = 0; /* -O3 cannot see that pack_meta sets it on success */
    if (pack_meta(cb, bt, padded_seqs, &bytes, err)) return RP_ERR;
    return upload_meta(cb, bytes, err);
}

/* The paged-attention view of the device metadata block. */
rp_attn_meta rp_cuda_device_attn_meta(const rp_cuda_backend *cb) {
    uint8_t *d = cb->meta.dev;
    return (rp_attn_meta){
        .seq_start = RP_META(cb, d, off_seq_start, int32_t),
        .seq_kv_len = RP_META(cb, d, off_kv_len, int32_t),
        .seq_page_row = RP_META(cb, d, off_page_row, int32_t),
        .page_table = RP_META(cb, d, off_pages, int32_t),
        .page_table_stride = 1,
        .page_size = cb->base.cfg.page_size,
    };
}
