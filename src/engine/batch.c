/* rp_batch construction. */
#include "engine/batch.h"

#include <stdlib.h>

rp_batch_builder *rp_batch_builder_new(const rp_page_table *table, int max_tokens, int max_seqs, int max_logits) {
    rp_batch_builder *bb = calloc(1, sizeof *bb);
    if (!bb) return NULL;
    bb->table = table;
    bb->max_tokens = max_tokens;
    bb->max_seqs = max_seqs;
    bb->max_logits = max_logits;
    bb->tokens = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->positions = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->slot_mapping = malloc((size_t)max_tokens * sizeof(int32_t));
    bb->seq_start = malloc((size_t)(max_seqs + 1) * sizeof(int32_t));
    bb->seq_kv_len = malloc((size_t)max_seqs * sizeof(int32_t));
    bb->seq_page_row = malloc((size_t)max_seqs * sizeof(int32_t));
    bb->logit_token = malloc((size_t)max_logits * sizeof(int32_t));
    if (!bb->tokens || !bb->positions || !bb->slot_mapping || !bb->seq_start || !bb->seq_kv_len ||
        !bb->seq_page_row || !bb->logit_token) {
        rp_batch_builder_free(bb);
        return NULL;
    }
    return bb;
}

void rp_batch_builder_free(rp_batch_builder *bb) {
    if (!bb) return;
    free(bb->tokens);
    free(bb->positions);
    free(bb->slot_mapping);
    free(bb->seq_start);
    free(bb->seq_kv_len);
    free(bb->seq_page_row);
    free(bb->logit_token);
    free(bb);
}

void rp_batch_begin(rp_batch_builder *bb) {
    rp_batch *b = &bb->batch;
    b->num_seqs = 0;
    b->num_tokens = 0;
    b->num_logits = 0;
    b->sample = NULL;
    b->spec_round = 0;
    b->sample_deferred = 0;
    bb->seq_start[0] = 0;
}

int rp_batch_add(rp_batch_builder *bb, int row, const int32_t *tokens, int n, int cached, int logits) {
    rp_batch *b = &bb->batch;
    int want = logits == 2 ? n : logits == 1 ? 1 : 0;
    if (n <= 0 || b->num_seqs == bb->max_seqs || b->num_tokens + n > bb->max_tokens ||
        b->num_logits + want > bb->max_logits)
        return -1;
    int first_logit = b->num_logits;
    for (int i = 0; i < n; i++) {
        int t = b->num_tokens + i;
        bb->tokens[t] = tokens[i];
        bb->positions[t] = cached + i;
        bb->slot_mapping[t] = rp_page_table_slot(bb->table, row, cached + i);
        if (logits == 2 || (logits == 1 && i == n - 1)) bb->logit_token[b->num_logits++] = t;
    }
    b->num_tokens += n;
    bb->seq_kv_len[b->num_seqs] = cached + n;
    bb->seq_page_row[b->num_seqs] = row;
    b->num_seqs++;
    bb->seq_start[b->num_seqs] = b->num_tokens;
    return first_logit;
}

int rp_batch_add_positions(rp_batch_builder *bb, int row, const int32_t *tokens, int n, int cached) {
    const rp_batch *b = &bb->batch;
    if (n <= 0 || b->num_seqs + n > bb->max_seqs || b->num_tokens + n > bb->max_tokens ||
        b->num_logits + n > bb->max_logits)
        return -1;
    const int first = b->num_logits;
    for (int j = 0; j < n; j++) rp_batch_add(bb, row, tokens + j, 1, cached + j, 1);
    if (n > 1) bb->batch.spec_round = 1; /* its positions share the row */
    return first;
}

rp_batch *rp_batch_finish(rp_batch_builder *bb) {
    rp_batch *b = &bb->batch;
    b->tokens = bb->tokens;
    b->positions = bb->positions;
    b->seq_start = bb->seq_start;
    b->seq_kv_len = bb->seq_kv_len;
    b->seq_page_row = bb->seq_page_row;
    b->page_table = bb->table->pages;
    b->page_table_stride = bb->table->max_pages_per_row;
    b->slot_mapping = bb->slot_mapping;
    b->logit_token = bb->logit_token;
    return b;
}
