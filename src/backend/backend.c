/* What every backend checks before it runs a batch. */
#include "backend/backend.h"

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
    if (bt->num_logits < 0 || bt->num_logits > b->cfg.max_logit_rows)
        return rp_errf(err, "batch asks for %d logit rows", bt->num_logits);
    for (int i = 0; i < bt->num_logits; i++)
        if (bt->logit_token[i] < 0 || bt->logit_token[i] >= bt->num_tokens)
            return rp_errf(err, "logit row %d points at token %d of %d", i, bt->logit_token[i], bt->num_tokens);
    return 0;
}
