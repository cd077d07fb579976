/* A tensor-parallel step as a message from node 0 to the other nodes
 * (docs/tensor-parallel.md, multi-node): what the tensor-parallel backend
 * was asked to do (a forward of an rp_batch, reading its results, turning
 * graphs on or off, stopping), so that every node's ranks make the same
 * calls in the same order, which their collectives need. Sent over the
 * bootstrap's control link (dist/bootstrap.h: rp_bs_send_msg).
 *
 * Layout (little-endian): magic "rpST", u32 version, u32 op, u32 arg, then
 * for a forward: i32 num_seqs, num_tokens, page_table_stride, num_logits,
 * spec_round, has_sample; tokens, positions, slot_mapping [num_tokens];
 * seq_start [num_seqs + 1]; seq_kv_len [num_seqs]; per sequence its page
 * count then its pages (the rows the sequences use, nothing else: the
 * decoded batch gives sequence s row s); logit_token [num_logits]; the
 * sampling parameters [num_logits] when has_sample. Every count is checked
 * against the message's length and the decoder's limits. */
#ifndef RP_BACKEND_TP_STEP_MSG_H
#define RP_BACKEND_TP_STEP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define RP_STEP_MSG_VERSION 1

typedef enum rp_step_op {
    RP_STEP_FORWARD = 1,
    RP_STEP_READ_TOKENS,
    RP_STEP_READ_LOGITS,
    RP_STEP_SET_GRAPHS, /* arg: enabled */
    RP_STEP_QUIT
} rp_step_op;

/* The message for op (bt: the forward's batch, else NULL) in buf (grown
 * with realloc as needed; *cap its size), its length in *len. page_size:
 * the backend's, to send only the pages each sequence's K/V covers. */
int rp_step_msg_encode(rp_step_op op, int arg, const rp_batch *bt, int page_size, uint8_t **buf, size_t *cap,
                       size_t *len, rp_err *err);

/* A decoded step: the batch's arrays live in the decoder. */
typedef struct rp_step_decoder {
    int max_tokens, max_seqs, max_logits, max_stride; /* the limits a message must keep */
    int32_t *tokens, *positions, *slot_mapping, *seq_start, *seq_kv_len, *seq_page_row, *page_table, *logit_token;
    rp_sampling_params *sample;
} rp_step_decoder;

int rp_step_decoder_init(rp_step_decoder *d, int max_tokens, int max_seqs, int max_logits, int max_stride,
                         rp_err *err);
void rp_step_decoder_free(rp_step_decoder *d);
/* The op, its arg, and for a forward the batch (pointing into d). A
 * message that is cut short, too long, of another version or out of the
 * limits is an error, never an out-of-bounds read. */
int rp_step_msg_decode(rp_step_decoder *d, const uint8_t *msg, size_t len, rp_step_op *op, int *arg, rp_batch *bt,
                       rp_err *err);

#endif
