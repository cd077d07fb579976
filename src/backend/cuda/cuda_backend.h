/* The CUDA backend's state, shared by cuda_backend.c (memory plan, forward)
 * and graph_runner.c (capture and replay of decode graphs). Nothing outside
 * src/backend/cuda includes this. */
#ifndef RP_BACKEND_CUDA_BACKEND_H
#define RP_BACKEND_CUDA_BACKEND_H

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

typedef struct rp_cuda_layer {
    rp_bf16 *attn_norm, *wqkv, *wo, *q_norm, *k_norm, *mlp_norm, *wgu, *wdown;
} rp_cuda_layer;

/* One captured decode step for a batch-size bucket. */
typedef struct rp_cuda_graph {
    int batch_size;
    int splits;
    cudaGraphExec_t exec;
    /* where the bucket runs the one-kernel step: the same step with the
     * greedy pick inside the kernel and no sampling kernels, for batches
     * that sample greedily and ask for no top logprobs (RP_SAMPLE_PICK) */
    cudaGraphExec_t exec_pick;
} rp_cuda_graph;

#define RP_MAX_GRAPHS 64
#define RP_PROF_MAX 2048

typedef struct rp_cuda_backend {
    rp_backend base;
    int device, num_sms;
    cudaStream_t stream;
    cudaEvent_t ev_start, ev_end;
    rp_gemm gemm;
    int nkv, q_dim, kv_dim, qkv_dim;
    int max_seqs, max_logits, max_splits, max_pages_per_seq;
    /* weights */
    rp_bf16 *weights_mem;
    size_t weights_bytes;
    rp_bf16 *embed, *final_norm, *lm_head;
    rp_cuda_layer *layers;
    /* KV cache: [layer][slot][kv_dim] for k, then the same for v */
    rp_bf16 *kv_mem, *k_cache, *v_cache;
    int64_t slots;
    size_t kv_layer_elems;
    /* activations and workspaces (one allocation) */
    uint8_t *act_mem;
    size_t act_bytes;
    float *residual, *logits, *inv_freq, *d_logprobs;
    /* partial sums of squares of the residual rows, [ss_num_parts][8]: the
     * fused decode path's RMSNorm input (rp_k_gemv_fused) */
    float *ss_parts;
    int ss_num_parts;
    /* T <= fused_max_t (<= RP_GEMV_MAX_T) runs the fused decode path
     * (REPLAY_FUSED_MAX_T; 0 turns it off) */
    int fused_max_t;
    /* decode of nb = 1 to 4 sequences as one persistent kernel
     * (rp_k_decode_step) where bit nb (4 for 3) of decode_step_ok is set;
     * REPLAY_DECODE_STEP=0 turns it off */
    int decode_step_ok;
    int decode_step_pick; /* the one-kernel step may pick greedily (REPLAY_DECODE_STEP_PICK=0: never) */
    rp_decode_step ds;
    rp_decode_layer *d_layers;
    void *ds_ws;
    rp_bf16 *xn, *qkv, *attn, *act, *logit_in;
    /* the o and down products (added to the residual by the next norm) and
     * the gate_up product stay fp32: rounded to bf16 they were the largest
     * errors against transformers after the products' bf16 inputs
     * (bench/RESULTS.md, twelfth session) */
    float *tmp, *gate_up;
    /* sampled tokens [max_logits], then their logprobs (d_logprobs) right
     * after: one 2-D copy brings both back; the pinned slots alike */
    int32_t *d_tokens;
    /* top logprobs: how many tokens each row's draw was made from, and each
     * row's most likely tokens ([max_logits] each; sample_top.h) */
    int32_t *d_kept;
    rp_top_logprobs *d_top;
    void *attn_ws, *sample_ws;
    int32_t *h_tokens;
    float *h_logprobs;
    /* the step's metadata block: device and pinned host copies */
    uint8_t *d_meta, *h_meta;
    size_t meta_bytes, page_capacity;
    size_t off_tokens, off_positions, off_slots, off_seq_start, off_kv_len, off_page_row, off_logit_token,
        off_out_slot, off_params, off_pages;
    /* graphs */
    rp_cuda_graph graphs[RP_MAX_GRAPHS];
    int num_graphs, graphs_enabled;
    /* last step */
    int last_num_logits, last_sampled, timing_pending;
    rp_backend_stats stats;
    uint64_t allocs_at_ready;
    /* profile mode: an event before every launch of an eager forward */
    int capturing;
    int prof_n;
    cudaEvent_t prof_events[RP_PROF_MAX];
    const char *prof_names[RP_PROF_MAX];
    /* Two step slots (pinned metadata, sampled tokens, timing events), so the
     * engine can pack and launch step N+1 while step N runs: h_meta,
     * h_tokens and h_logprobs point into the slot of the last forward. */
    uint8_t *h_meta_slot[2];
    int32_t *h_tokens_slot[2];
    /* their device addresses (pinned memory is mapped under unified
     * addressing), where the sampling kernels and the greedy pick write the
     * results themselves; NULL: they are copied after the kernels */
    int32_t *d_tokens_host[2];
    float *h_logprobs_slot[2];
    rp_top_logprobs *h_top_slot[2];
    cudaEvent_t ev_start_slot[2], ev_end_slot[2];
    int slot_num_logits[2], slot_sampled[2];
    int slot_top[2]; /* some row of that forward asked for top logprobs: h_top_slot was copied */
    int cur_slot, num_pending;
    int last_decode_step; /* the last forward ran rp_k_decode_step for this many sequences, or 0 */
} rp_cuda_backend;

/* rp_cuda_launch_forward's sample: none, the sampling kernels, or (every
 * row greedy, no top logprobs) the one-kernel step's own pick where it
 * runs, else the sampling kernels */
enum { RP_SAMPLE_NONE, RP_SAMPLE_KERNELS, RP_SAMPLE_PICK };
int rp_cuda_launch_forward(rp_cuda_backend *cb, int T, int S, int num_logits, int decode, int max_q_len, int sample,
                           rp_err *err);
int rp_cuda_decode_step_nb(const rp_cuda_backend *cb, int T, int S, int num_logits, int decode);
int rp_cuda_decode_step_can_pick(const rp_cuda_backend *cb, int nb);
int rp_cuda_pack_and_upload(rp_cuda_backend *cb, const rp_batch *bt, int padded_seqs, rp_err *err);
int rp_cuda_decode_splits(const rp_cuda_backend *cb, int num_seqs);

/* graph_runner.c */
int rp_cuda_graphs_capture(rp_cuda_backend *cb, rp_err *err);
const rp_cuda_graph *rp_cuda_graph_find(const rp_cuda_backend *cb, int num_seqs);
void rp_cuda_graphs_destroy(rp_cuda_backend *cb);

#endif
