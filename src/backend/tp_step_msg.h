/* A tensor-parallel step as a message from node 0 to the other nodes
 * (docs/tensor-parallel.md, multi-node): what the tensor-parallel backend
 * was asked to do (a forward of an rp_batch, reading its results, turning
 * graphs on or off, sampling with token masks, stopping), so that every
 * node's ranks make the same calls in the same order, which their
 * collectives need. Sent over the bootstrap's control link
 * (dist/bootstrap.h: rp_bs_send_msg).
 *
 * How node 0 ends says what the others do: a shutdown (node 0 stopped
 * cleanly: its command finished, or SIGINT/SIGTERM) ends their worker loop
 * with success; an abort (node 0 failed) carries node 0's reason and ends
 * it with an error; a link that closes without either is an error too
 * (node 0 died). A ping carries nothing: node 0 sends it when it has sent
 * nothing else for a while, so that the others can tell an idle node 0 from
 * a silent one (docs/tensor-parallel.md, "Faults").
 *
 * Layout (little-endian): magic "rpST", u32 version, u32 op, u32 arg, then
 * for a forward: i32 num_seqs, num_tokens, page_table_stride, num_logits,
 * spec_round, has_sample, sample_deferred; tokens, positions, slot_mapping
 * [num_tokens]; seq_start [num_seqs + 1]; seq_kv_len [num_seqs]; per
 * sequence its page count then its pages (the rows the sequences use,
 * nothing else: the decoded batch gives sequence s row s); logit_token
 * [num_logits]; the sampling parameters [num_logits] when has_sample.
 * Sampling with masks (arg: num_masks): u32 num_rows (0: mask_of_row NULL),
 * i32 mask_of_row [num_rows], u32 mask_words, u32 masks [num_masks *
 * mask_words]. An abort: u32 length, then the reason's bytes. Every count
 * is checked against the message's length and the decoder's limits. */
#ifndef RP_BACKEND_TP_STEP_MSG_H
#define RP_BACKEND_TP_STEP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#define RP_STEP_MSG_VERSION 2

/* The longest reason an abort carries (bytes, with the terminating 0). */
#define RP_STEP_REASON_BYTES 512

typedef enum rp_step_op {
    RP_STEP_FORWARD = 1,
    RP_STEP_READ_TOKENS,
    RP_STEP_READ_LOGITS,
    RP_STEP_SET_GRAPHS,    /* arg: enabled */
    RP_STEP_SHUTDOWN,      /* node 0 stops cleanly: the others end with success */
    RP_STEP_SAMPLE_MASKED, /* arg: num_masks; the masks follow */
    RP_STEP_ABORT,         /* node 0 failed: its reason follows; the others end with an error */
    RP_STEP_PING           /* nothing to do: node 0 is alive */
} rp_step_op;

/* The message for op (bt: the forward's batch, else NULL) in buf (grown
 * with realloc as needed; *cap its size), its length in *len. page_size:
 * the backend's, to send only the pages each sequence's K/V covers. */
int rp_step_msg_encode(rp_step_op op, int arg, const rp_batch *bt, int page_size, uint8_t **buf, size_t *cap,
                       size_t *len, rp_err *err);

/* Sampling with token masks (backend.h: sample_masked): mask_of_row has
 * num_rows entries (0: NULL, no row masked); masks num_masks rows of
 * mask_words words. */
int rp_step_msg_encode_masks(const uint32_t *masks, int num_masks, int mask_words, const int32_t *mask_of_row,
                             int num_rows, uint8_t **buf, size_t *cap, size_t *len, rp_err *err);
/* An abort with node 0's reason (cut to RP_STEP_REASON_BYTES - 1 bytes). */
int rp_step_msg_encode_abort(const char *reason, uint8_t **buf, size_t *cap, size_t *len, rp_err *err);

/* A decoded step: the batch's arrays, the masks and an abort's reason live
 * in the decoder. */
typedef struct rp_step_decoder {
    int max_tokens, max_seqs, max_logits, max_stride, mask_words; /* the limits a message must keep */
    int32_t *tokens, *positions, *slot_mapping, *seq_start, *seq_kv_len, *seq_page_row, *page_table, *logit_token;
    rp_sampling_params *sample;
    /* RP_STEP_SAMPLE_MASKED: num_masks is the op's arg */
    uint32_t *masks;      /* [max_logits * mask_words] */
    int32_t *mask_of_row; /* [max_logits], or NULL in a message whose rows were NULL */
    int32_t *mask_rows;   /* the storage mask_of_row points to */
    /* RP_STEP_ABORT */
    char reason[RP_STEP_REASON_BYTES];
} rp_step_decoder;

/* vocab_size: the model's, for the masks' row length. */
int rp_step_decoder_init(rp_step_decoder *d, int max_tokens, int max_seqs, int max_logits, int max_stride,
                         int vocab_size, rp_err *err);
void rp_step_decoder_free(rp_step_decoder *d);
/* The op, its arg, and for a forward the batch (pointing into d; for the
 * other ops bt is zeroed), for masks and an abort their fields of d. A
 * message that is cut short, too long, of another version or out of the
 * limits is an error, never an out-of-bounds read. */
int rp_step_msg_decode(rp_step_decoder *d, const uint8_t *msg, size_t len, rp_step_op *op, int *arg, rp_batch *bt,
                       rp_err *err);

#endif
