/* What every backend shares: the KV cache's format and page sizing, and
 * the checks of a batch before it runs. */
#include "backend/backend.h"

#include <string.h>

int rp_kv_dtype_parse(const char *name, rp_kv_dtype *out, rp_err *err) {
    if (!name || !strcmp(name, "auto")) *out = RP_KV_AUTO;
    else if (!strcmp(name, "bf16") || !strcmp(name, "bfloat16")) *out = RP_KV_BF16;
    else if (!strcmp(name, "fp8") || !strcmp(name, "fp8_e4m3")) *out = RP_KV_FP8;
    else if (!strcmp(name, "fp8_e5m2"))
        /* e5m2 keeps two mantissa bits: vLLM offers it without scales, but
         * replay's kernels convert e4m3 only, whose extra bit the scales
         * make up for in range */
        return rp_errf(err, "kv cache dtype fp8_e5m2 is not supported: use fp8 (fp8_e4m3, with the checkpoint's "
                            "k/v scales) or bf16");
    else
        return rp_errf(err, "kv cache dtype '%s' is not one of auto, bf16, bfloat16, fp8, fp8_e4m3", name);
    return 0;
}

const char *rp_kv_dtype_name(rp_kv_dtype d) {
    return d == RP_KV_FP8 ? "fp8_e4m3" : d == RP_KV_BF16 ? "bf16" : "auto";
}

rp_kv_dtype rp_kv_dtype_resolve(rp_kv_dtype d, const rp_model_config *c) {
    if (d != RP_KV_AUTO) return d;
    return c->quant.kv_fp8 ? RP_KV_FP8 : RP_KV_BF16;
}

size_t rp_kv_page_bytes(const rp_model_config *c, int page_size, rp_kv_dtype d) {
    const size_t elem = d == RP_KV_FP8 ? 1 : 2;
    return 2 * (size_t)c->num_layers * (size_t)page_size * (size_t)c->num_kv_heads * (size_t)c->head_dim * elem;
}

int rp_kv_pool_pages(double usable_bytes, size_t page_bytes, size_t shadow_page_bytes) {
    if (usable_bytes <= 0 || page_bytes + shadow_page_bytes == 0) return 0;
    const double pages = usable_bytes / (double)(page_bytes + shadow_page_bytes) - 1; /* the dummy page */
    return pages < 1 ? 0 : pages > 2e9 ? 2000000000 : (int)pages;
}

int rp_batch_validate(const rp_batch *bt, const rp_backend *b, rp_err *err) {
    const rp_model_config *c = &b->model->cfg;
    if (bt->num_seqs <= 0 || bt->num_seqs > b->cfg.max_batch_seqs)
        return rp_errf(err, "batch has %d sequences (limit %d)", bt->num_seqs, b->cfg.max_batch_seqs);
    if (bt->num_tokens <= 0 || bt->num_tokens > b->cfg.max_batched_tokens)
        return rp_errf(err, "batch has %d tokens (limit %d)", bt->num_tokens, b->cfg.max_batched_tokens);
    if (bt->seq_start[0] != 0 || bt->seq_start[bt->num_seqs] != bt->num_tokens)
        return rp_errf(err, "batch seq_start does not cover its tokens");
    const int vocab = rp_backend_vocab(b);
    int64_t slots = (int64_t)(b->cfg.num_pages + 1) * b->cfg.page_size;
    for (int s = 0; s < bt->num_seqs; s++) {
        int n = bt->seq_start[s + 1] - bt->seq_start[s];
        if (n <= 0) return rp_errf(err, "sequence %d has no new tokens", s);
        int kv = bt->seq_kv_len[s];
        if (kv < n || kv > bt->page_table_stride * b->cfg.page_size || kv > c->max_position_embeddings)
            return rp_errf(err, "sequence %d: KV length %d out of range", s, kv);
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++) {
            /* new tokens are the last n positions of the sequence, in order */
            if (bt->positions[t] != kv - n + (t - bt->seq_start[s]))
                return rp_errf(err, "sequence %d: token %d has position %d, expected %d", s, t,
                               bt->positions[t], kv - n + (t - bt->seq_start[s]));
            int tok = bt->tokens[t];
            int is_ref = tok < 0 && b->supports_token_refs && -(int64_t)tok - 1 < b->cfg.max_logit_rows;
            if (!is_ref && (tok < 0 || tok >= vocab))
                return rp_errf(err, "token id %d outside the vocabulary (%d)", tok, vocab);
            if (bt->slot_mapping[t] < 0 || bt->slot_mapping[t] >= slots)
                return rp_errf(err, "KV slot %d out of range", bt->slot_mapping[t]);
        }
        const int32_t *row = bt->page_table + (int64_t)bt->seq_page_row[s] * bt->page_table_stride;
        for (int p = 0; p < (kv + b->cfg.page_size - 1) / b->cfg.page_size; p++)
            if (row[p] < 0 || row[p] > b->cfg.num_pages)
                return rp_errf(err, "sequence %d: page id %d out of range", s, row[p]);
    }
    if (bt->sample_deferred && (!bt->sample || !b->ops->sample_masked))
        return rp_errf(err, "a batch with deferred sampling needs sampling parameters and a backend that samples "
                            "with masks");
    if (bt->num_logits < 0 || bt->num_logits > b->cfg.max_logit_rows)
        return rp_errf(err, "batch asks for %d logit rows", bt->num_logits);
    for (int i = 0; i < bt->num_logits; i++)
        if (bt->logit_token[i] < 0 || bt->logit_token[i] >= bt->num_tokens)
            return rp_errf(err, "logit row %d points at token %d of %d", i, bt->logit_token[i], bt->num_tokens);
    return 0;
}

int rp_backend_tp_vocab(const rp_backend_config *cfg, const rp_model_config *c, const char *who, rp_tp_vocab *out,
                        rp_err *err) {
    *out = (rp_tp_vocab){0, c->vocab_size, c->vocab_size};
    if (cfg->tp.size <= 1) return 0;
    const rp_tp_plan *plan = cfg->tp.plan;
    if (!plan || !cfg->tp.comm || cfg->tp.rank < 0 || cfg->tp.rank >= plan->size || plan->size != cfg->tp.size ||
        c->vocab_size != plan->vocab_per_rank)
        return rp_errf(err, "%s: tensor-parallel rank %d of %d without its plan, communicator or shard", who,
                       cfg->tp.rank, cfg->tp.size);
    *out = (rp_tp_vocab){plan->ranks[cfg->tp.rank].vocab_start, plan->ranks[cfg->tp.rank].vocab_count,
                         plan->vocab_per_rank};
    return 0;
}
