/* The CUDA backend's state and its internal functions, shared by the files
 * of src/backend/cuda: cuda_backend.c (create, destroy, the ops),
 * cuda_weights.c (weight upload), cuda_meta.c (the step's metadata block),
 * forward_chain.c (the forward as a chain of kernels), forward_decode_step.c
 * (the one-kernel decode step), graph_runner.c (decode graphs) and tuning.c.
 * Nothing outside src/backend/cuda includes this. */
#ifndef RP_BACKEND_CUDA_STATE_H
#define RP_BACKEND_CUDA_STATE_H

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

/* A layer's projection matrix [N][K]: bf16, or e4m3 bytes with one fp32
 * scale per row (--quantization fp8, per-channel checkpoints:
 * rp_k_gemv_fused_fp8) or with one per 128 x 128 block (the official FP8
 * checkpoints: rp_k_gemv_fused_fp8_blocks). */
typedef struct rp_cuda_mat {
    void *w;
    float *scale; /* row scales [N]; NULL: bf16 or block-scaled */
    float *grid;  /* block scales [ceil(N / 128)][rp_fp8_grid_ld(K)] (kernels.h); NULL: bf16 or row-scaled */
} rp_cuda_mat;

typedef struct rp_cuda_layer {
    rp_bf16 *attn_norm, *q_norm, *k_norm, *mlp_norm;
    rp_cuda_mat qkv, o, gu, down; /* q|k|v and gate|up side by side (one product each) */
    rp_bf16 *bqkv; /* the q, k and v biases side by side, [(nh + 2 nkv) hd]; NULL without (all but Qwen2) */
} rp_cuda_layer;

/* Every weight, in one device allocation (cuda_weights.c). */
typedef struct rp_cuda_weights {
    void *mem;
    size_t bytes;
    rp_bf16 *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    rp_cuda_layer *layers;                 /* [num_layers], host array of device pointers */
    rp_fp8_layout fp8;                     /* the layer matrices' e4m3 form, if any (rp_cuda_mat) */
    /* fp8, more tokens than the GEMV takes (rp_cuda_fp8_setup): with
     * cuBLASLt's FP8 matmul (fp8_lt), the activations quantized per token
     * (xq [max tokens][widest K], x_scale [max tokens]; block-scaled: per
     * token and 128 k, [ceil(widest K / 128)][max tokens rounded up to 4]);
     * without it, one matrix dequantized to bf16 (deq, the largest's size:
     * gate_up; also the upload's staging for generated weights). Rows:
     * fp8_outer where cuBLASLt applies both scales itself (its outer-vector
     * mode) from RP_FP8_OUTER_MIN_T tokens, else its raw sums and
     * rp_k_scale_outer. */
    int fp8_lt, fp8_outer;
    uint8_t *xq;
    float *x_scale;
    rp_bf16 *deq;
} rp_cuda_weights;

/* The step's metadata block on the device, at fixed addresses that every
 * kernel and every captured graph reads (cuda_meta.c; each step slot has a
 * pinned copy): byte offsets of its arrays. */
typedef struct rp_cuda_meta {
    uint8_t *dev;
    size_t bytes, page_capacity; /* page_capacity: the page ids the block holds */
    size_t off_tokens, off_positions, off_slots, off_seq_start, off_kv_len, off_page_row, off_logit_token,
        off_out_slot, off_skip_sample, off_params, off_attn_hdr, off_pf_items, off_pages;
    int pf_items_cap; /* work items the block holds (rp_attn_step_max_items) */
} rp_cuda_meta;

/* One captured decode step for a batch-size bucket. */
typedef struct rp_cuda_graph {
    int batch_size;
    cudaGraphExec_t exec;
    /* where the bucket runs the one-kernel step: the same step with the
     * greedy pick inside the kernel and no sampling kernels, for batches
     * that sample greedily and ask for no top logprobs (RP_SAMPLE_PICK) */
    cudaGraphExec_t exec_pick;
    /* where the bucket runs the one-kernel step: the chain of kernels, for
     * batches whose K/V outgrows the step (rp_decode_step_tuning.max_kv) */
    cudaGraphExec_t exec_chain;
} rp_cuda_graph;

/* A step with prompt chunks runs padded to a token bucket: tokens rows
 * through every product, logits rows through lm_head and sampling, and the
 * attention launches of the bucket's shape, eagerly or as the bucket's
 * graph once captured (graph_runner.c). */
typedef struct rp_cuda_step_bucket {
    int tokens, logits;
    rp_attn_step_shape attn;
    cudaGraphExec_t exec;
} rp_cuda_step_bucket;

#define RP_MAX_GRAPHS 64
#define RP_MAX_STEP_BUCKETS 40
#define RP_PROF_MAX 2048

/* A step slot: what one forward in flight owns on the host, so that the
 * engine can pack and launch step N+1 while step N runs (two slots, used
 * in turn). */
typedef struct rp_cuda_slot {
    uint8_t *h_meta; /* the pinned metadata block, copied to d_meta by the forward */
    /* sampled tokens [max_logits], then their logprobs (h_logprobs) right
     * after, pinned: one 2-D copy brings both back, as on the device */
    int32_t *h_tokens;
    float *h_logprobs;
    /* h_tokens' device address (pinned memory is mapped under unified
     * addressing), where the sampling kernels and the greedy pick write the
     * results themselves; NULL in both slots: they are copied after the
     * kernels */
    int32_t *d_tokens_host;
    rp_top_logprobs *h_top;
    cudaEvent_t ev_start, ev_end; /* around the forward (and its deferred sampling): its device time */
    int num_logits, sampled;
    int top; /* some row of the forward asked for top logprobs: h_top was copied */
    /* the forward deferred its sampling (rp_batch.sample_deferred) and
     * sample_masked has not run yet */
    int deferred;
    /* the token masks sample_masked uploads, pinned: [max_logits] mask
     * index of each row, then the masks (the device block's layout); one
     * per slot, so a slot's upload is done before its next forward may
     * start, whatever the host does meanwhile */
    uint8_t *h_mask;
} rp_cuda_slot;

typedef struct rp_cuda_backend {
    rp_backend base;
    int device, num_sms;
    double hbm_peak_gbs; /* the memory's peak from its clock and bus width (H100 SXM 3,352, H200 4,915): the
                          * tuning table tells the two apart by it */
    cudaStream_t stream;
    rp_gemm gemm;
    int nkv, q_dim, kv_dim, qkv_dim;
    int max_seqs, max_logits, max_splits, max_pages_per_seq;
    rp_cuda_weights w;
    /* KV cache: [layer][slot][kv_dim] for k, then the same for v; bf16, or
     * e4m3 bytes (kv_format, --kv-cache-dtype fp8: docs/kv-cache.md) with
     * the model's per-layer k/v scales */
    uint8_t *kv_mem;
    void *k_cache, *v_cache;
    rp_kv_format kv_format;
    size_t kv_elem_bytes; /* 2 (bf16) or 1 (e4m3) */
    int64_t kv_slots; /* (num_pages + 1) * page_size */
    size_t kv_layer_elems;
    /* activations and workspaces (one allocation) */
    uint8_t *act_mem;
    size_t act_bytes;
    float *residual, *logits, *inv_freq, *d_logprobs;
    float rope_scale; /* rp_rope_attention_scale: cos and sin times this (yarn), else 1 */
    /* partial sums of squares of the residual rows, [ss_num_parts][8]: the
     * fused decode path's RMSNorm input (rp_k_gemv_fused) */
    float *ss_parts;
    int ss_num_parts;
    /* decode of nb = 1 to 4 sequences as one persistent kernel
     * (rp_k_decode_step) where bit nb (4 for 3) of decode_step_ok is set;
     * rp_tuning.disable_decode_step leaves it 0 */
    int decode_step_ok;
    int decode_step_pick; /* the one-kernel step may pick greedily (the results' pinned buffers are mapped) */
    int decode_chain;     /* this forward (or capture) decodes with the chain even where the step could */
    /* tensor parallelism: the last forward picked inside the kernel, so
     * logits holds no gathered rows (cuda_read_logits gathers them) */
    int logits_ungathered;
    rp_decode_step ds;
    rp_decode_step_tuning ds_tuning; /* resolved from base.cfg.tuning (tuning.c) */
    rp_decode_layer *d_layers;
    void *ds_ws;
    rp_bf16 *xn, *qkv, *attn, *act, *logit_in;
    /* the o and down products (added to the residual by the next norm) and
     * the gate_up product stay fp32: rounded to bf16 they would be the
     * largest errors against transformers after the products' bf16 inputs
     * (bench/RESULTS.md) */
    float *tmp, *gate_up;
    /* sampled tokens [max_logits], then their logprobs (d_logprobs) right
     * after: one 2-D copy brings both back into the slot's pinned buffers */
    int32_t *d_tokens;
    /* top logprobs: how many tokens each row's draw was made from, and each
     * row's most likely tokens ([max_logits] each; sample_top.h) */
    int32_t *d_kept;
    rp_top_logprobs *d_top;
    /* attention's split partial results: decode's (every batch size, at
     * most max_splits) and prefill's (the launcher's rule, bounded by
     * rp_attn_prefill_workspace_bytes) never run at once, so they share it */
    void *attn_ws;
    size_t attn_ws_bytes;
    void *sample_ws;
    /* Structured output's token masks (sample_masked): the device block
     * (d_mask_of_row [max_logits], then d_masks [max_logits][mask_words]),
     * uploaded on mask_stream so that the copy runs beside the forward;
     * ev_mask_ready orders the mask kernel after the copy, ev_mask_free the
     * next copy after the mask kernel that read the block. */
    int32_t *d_mask_of_row;
    uint32_t *d_masks;
    int mask_words;
    size_t mask_masks_off; /* byte offset of the masks in the block */
    cudaStream_t mask_stream;
    cudaEvent_t ev_mask_ready, ev_mask_free;
    rp_cuda_meta meta;
    /* graphs */
    rp_cuda_graph graphs[RP_MAX_GRAPHS]; /* the decode buckets, num_graphs of them, captured or not */
    int num_graphs, num_decode_graphs, graphs_enabled;
    rp_cuda_step_bucket buckets[RP_MAX_STEP_BUCKETS];
    int num_buckets, num_step_graphs;
    /* the last forward's device time is still to be read (finish_step) */
    int timing_pending;
    rp_backend_stats stats;
    uint64_t allocs_at_ready;
    /* profile mode: an event before every launch of an eager forward */
    int capturing;
    int prof_n;
    cudaEvent_t prof_events[RP_PROF_MAX];
    const char *prof_names[RP_PROF_MAX];
    /* the step slots; cur_slot is the last forward's, num_pending how many
     * forwards' results are still to be read (at most 2) */
    rp_cuda_slot slots[2];
    int cur_slot, num_pending;
    int last_decode_step; /* the last forward ran rp_k_decode_step for this many sequences, or 0 */
    uint64_t decode_step_forwards, decode_step_picks; /* rp_cuda_stats */
    /* Tensor parallelism (base.cfg.tp; comm NULL: none). The model is the
     * rank's shard; the ranks sum the embedding, o_proj and down_proj
     * products over comm, on the stream (so the graphs hold the
     * collectives), and gather the lm_head's logit shards (logits_shard,
     * [max_logits][vocab_per_rank]) into logits_gather ([ranks][max_logits]
     * [vocab_per_rank]), laid out whole in logits. vocab: the logits' and
     * sampling's vocabulary, the whole model's. The one-token fused path and
     * the one-kernel decode step have no point between layers where a
     * collective could run: off. */
    rp_comm *comm;
    int vocab;
    int64_t vocab_start, vocab_count, vocab_per_rank;
    float *logits_shard, *logits_gather;
} rp_cuda_backend;

/* NULL when b is not a CUDA backend (cuda_backend.c). */
rp_cuda_backend *rp_cuda_backend_of(rp_backend *b);

/* Layer l's KV cache as the kernels take it (cuda_backend.c): its K and V
 * in the backend's format, with the model's scales where e4m3. */
rp_kv_cache rp_cuda_kv_layer(const rp_cuda_backend *cb, int l);

static inline size_t rp_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The step's metadata block at base (device or pinned host copy): the
 * array at offset field off of type. */
#define RP_META(cb, base, off, type) ((type *)((base) + (cb)->meta.off))

/* Profile mode: an event before each launch; segment i is the time from
 * mark i to mark i + 1. Never inside a capture (graphs hold no events). */
static inline void rp_cuda_prof_mark(rp_cuda_backend *cb, const char *name) {
    if (!cb->base.cfg.profile || cb->capturing || cb->prof_n >= RP_PROF_MAX) return;
    cudaEventRecord(cb->prof_events[cb->prof_n], cb->stream);
    cb->prof_names[cb->prof_n++] = name;
}

/* rp_cuda_launch_forward's sample: none, the sampling kernels, or (every
 * row greedy, no top logprobs) the one-kernel step's own pick where it
 * runs, else the sampling kernels */
enum { RP_SAMPLE_NONE, RP_SAMPLE_KERNELS, RP_SAMPLE_PICK };

/* forward_chain.c: one forward over the metadata block, T tokens of S
 * sequences, logits for num_logits rows, sampled as sample says. Only
 * device pointers and shapes: the same call is run eagerly and captured.
 * decode: every sequence one token (decode attention over S); else the
 * step's attention of shape step (a bucket's; T its tokens). */
int rp_cuda_launch_forward(rp_cuda_backend *cb, int T, int S, int num_logits, int decode,
                           const rp_attn_step_shape *step, int sample, rp_err *err);
/* the sampling kernels over the first num_logits rows of logits; skip
 * (nullable, on the device): the kernels do nothing where *skip != 0 when
 * they run (the step's metadata flag, for a captured step whose sampling
 * waits for token masks) */
int rp_cuda_launch_sample(rp_cuda_backend *cb, int num_logits, const int32_t *skip, rp_err *err);
int rp_cuda_decode_splits(const rp_cuda_backend *cb, int num_seqs);

/* forward_decode_step.c */
int rp_cuda_decode_step_setup(rp_cuda_backend *cb, rp_err *err);
int rp_cuda_decode_step_nb(const rp_cuda_backend *cb, int T, int S, int num_logits, int decode);
int rp_cuda_decode_step_can_pick(const rp_cuda_backend *cb, int nb);
/* the step of S sequences as one kernel, then sampling unless it picked */
int rp_cuda_launch_decode_step(rp_cuda_backend *cb, int S, int num_logits, int sample, rp_err *err);
/* the trace build: prints the last step's trace, writes its timeline
 * (base.cfg.trace_timeline_path) and frees both */
void rp_cuda_decode_step_trace_finish(rp_cuda_backend *cb);

/* cuda_weights.c: every weight in one allocation (cb->w.mem) */
int rp_cuda_upload_weights(rp_cuda_backend *cb, rp_err *err);
/* fp8 weights, after the upload and cuBLASLt's init: the larger products'
 * path (cuBLASLt FP8 where it exists) and its buffers. */
int rp_cuda_fp8_setup(rp_cuda_backend *cb, rp_err *err);

/* cuda_meta.c */
int rp_cuda_plan_meta(rp_cuda_backend *cb, rp_err *err);
int rp_cuda_pack_and_upload(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, rp_err *err);
/* A batch with prompt chunks, padded to bucket bk, its attention planned */
int rp_cuda_pack_step(rp_cuda_backend *cb, const rp_batch *bt, const rp_cuda_step_bucket *bk, rp_err *err);
rp_attn_meta rp_cuda_device_attn_meta(const rp_cuda_backend *cb);

/* comm_p2p.c: the one-kernel decode step's buffers and counters of the
 * peer-memory communicator c (made with step_floats >= H): 0, or -1 where c
 * is another kind (every sum then goes through the chain). */
int rp_comm_p2p_decode_step(rp_comm *c, int H, rp_decode_step_tp *out);
/* forward_chain.c: tensor parallelism: every rank's logit shard of the rows
 * (cb->logits_shard), gathered and laid out whole in cb->logits */
int rp_cuda_tp_gather_logits(rp_cuda_backend *cb, int rows, rp_err *err);

/* tuning.c: the decode step's plan values from cfg.tuning (0: by model
 * shape and SM count); RP_ERR for an explicit value out of range */
int rp_cuda_tuning_resolve(const rp_tuning *t, const rp_model_config *c, int num_sms, double hbm_peak_gbs,
                           rp_decode_step_tuning *out,
                           rp_err *err);

/* graph_runner.c */
int rp_cuda_decode_buckets_plan(rp_cuda_backend *cb, rp_err *err);
int rp_cuda_graphs_capture(rp_cuda_backend *cb, rp_err *err);
const rp_cuda_graph *rp_cuda_graph_find(const rp_cuda_backend *cb, int num_seqs);
/* the step buckets (every backend has them, graphs or not) */
void rp_cuda_step_buckets_plan(rp_cuda_backend *cb);
const rp_cuda_step_bucket *rp_cuda_step_bucket_find(const rp_cuda_backend *cb, int num_tokens, int num_logits);
void rp_cuda_graphs_destroy(rp_cuda_backend *cb);

#endif
