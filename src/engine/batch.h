/* Builds an rp_batch (the per-step metadata a backend consumes) from the
 * sequences the engine picked for this step. Arrays are sized once for the
 * largest batch; building a step allocates nothing. */
#ifndef RP_ENGINE_BATCH_H
#define RP_ENGINE_BATCH_H

#include "backend/backend.h"
#include "kv/page_table.h"

typedef struct rp_batch_builder {
    int max_tokens, max_seqs, max_logits;
    const rp_page_table *table;
    rp_batch batch;
    int32_t *tokens, *positions, *seq_start, *seq_kv_len, *seq_page_row, *slot_mapping, *logit_token;
} rp_batch_builder;

rp_batch_builder *rp_batch_builder_new(const rp_page_table *table, int max_tokens, int max_seqs, int max_logits);
void rp_batch_builder_free(rp_batch_builder *bb);
void rp_batch_begin(rp_batch_builder *bb);
/* Adds n new tokens of the sequence in page-table row `row`, whose cache
 * already holds `cached` tokens (so they take positions cached..cached+n-1;
 * the row must already own pages for them). logits: 0 none, 1 the last
 * token's, 2 every token's. Returns the index of the sequence's first
 * logit row, or -1 if the batch is full. */
int rp_batch_add(rp_batch_builder *bb, int row, const int32_t *tokens, int n, int cached, int logits);
/* The same n tokens of one sequence as a speculative round feeds them: each
 * its own one-token sequence on the same row, with logits, at positions
 * cached..cached+n-1 (rp_batch.spec_round): a round of one-token
 * sequences is a decode batch, which runs as its bucket's decode graph, and
 * each position's attention ends at itself. Returns the first of its n
 * consecutive logit rows, or -1 (nothing added) if the batch is full. */
int rp_batch_add_positions(rp_batch_builder *bb, int row, const int32_t *tokens, int n, int cached);
static inline int rp_batch_tokens_left(const rp_batch_builder *bb) {
    return bb->max_tokens - bb->batch.num_tokens;
}
rp_batch *rp_batch_finish(rp_batch_builder *bb);

#endif
