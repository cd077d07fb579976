/* The one door between the engine and the hardware: a backend runs the model
 * forward over a batch of sequences, each with its own new tokens, positions
 * and pages, prefill and decode mixed in one call.
 *
 * The batch is plain arrays (what pegainfer calls decode meta): token ids,
 * positions, per-sequence offsets, page-table rows and the KV slot of every
 * new token. The engine builds it on the host; a CUDA backend copies it into
 * a fixed device block once per step so captured graphs stay valid. Kernels
 * and backends never see requests, sampling state or text. */
#ifndef RP_BACKEND_BACKEND_H
#define RP_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/sample_params.h"
#include "backend/tuning.h"
#include "dist/comm.h"
#include "dist/tp_plan.h"
#include "model/model.h"
#include "util/err.h"

typedef struct rp_batch {
    /* tokens[t] < 0 (only where the backend sets supports_token_refs) means
     * "the token sampled in logit row -tokens[t]-1 of the previous forward":
     * the engine can launch step N+1 before it has read step N's tokens. */
    int num_seqs;
    int num_tokens;              /* new tokens in this step, all sequences */
    const int32_t *tokens;       /* [num_tokens], grouped by sequence */
    const int32_t *positions;    /* [num_tokens], position of each token in its sequence */
    const int32_t *seq_start;    /* [num_seqs + 1], offsets into tokens (cu_seqlens_q) */
    const int32_t *seq_kv_len;   /* [num_seqs], tokens in the cache after this step */
    const int32_t *seq_page_row; /* [num_seqs], the sequence's row in page_table */
    const int32_t *page_table;   /* [rows][page_table_stride] page ids */
    int page_table_stride;
    const int32_t *slot_mapping; /* [num_tokens], KV slot (page * page_size + offset) */
    int num_logits;              /* rows of logits wanted */
    const int32_t *logit_token;  /* [num_logits], index into tokens of each wanted row */
    /* [num_logits] or NULL. When set and the backend samples on the device
     * (ops->read_tokens != NULL), forward also samples each logit row. */
    const rp_sampling_params *sample;
    /* 1: a speculative round: some consecutive sequences share a
     * page-table row (a round's positions, each a one-token sequence whose
     * K/V length ends at its position, so that the round is a decode batch
     * that replays its bucket's graph, and attention is causal within it).
     * A backend must then store every token's K/V before any attention of
     * the layer reads them: the CUDA backend runs the chain of kernels, not
     * the one-kernel step, which keeps a token's new K/V to itself. */
    int spec_round;
    /* 1 (sample set, on a backend with ops->sample_masked): the forward
     * computes the logits and does not sample them; sample_masked, called
     * before the next forward, samples them with structured output's token
     * masks. The engine launches the forward first and computes the masks
     * while it runs (docs/structured.md, "Sampling"). */
    int sample_deferred;
} rp_batch;

/* Token masks (structured output): bit id % 32 of word id / 32 is 1 where
 * token id is allowed. Rows are rp_token_mask_words(vocab) words apart, a
 * multiple of 4 so that each row starts 16-byte aligned in device memory;
 * bits at vocab and past it are never read. */
static inline int rp_token_mask_words(int vocab_size) { return (vocab_size + 127) / 128 * 4; }

/* The KV cache's element format, vLLM's --kv-cache-dtype (docs/kv-cache.md).
 * bf16: K and V as the model computes them. fp8: e4m3 bytes of k / k_scale
 * and v / v_scale, the scales per layer from the checkpoint (rp_model's
 * k_scale, v_scale; 1 where it has none): half the bytes a token, so the
 * pool holds twice the tokens and decode attention reads half. auto: what
 * the checkpoint declares (compressed-tensors' kv_cache_scheme), else bf16. */
typedef enum rp_kv_dtype { RP_KV_AUTO = 0, RP_KV_BF16, RP_KV_FP8 } rp_kv_dtype;

/* vLLM's names: auto; bf16 or bfloat16; fp8 or fp8_e4m3. fp8_e5m2 (and
 * anything else) is an error that says what is supported. */
int rp_kv_dtype_parse(const char *name, rp_kv_dtype *out, rp_err *err);
const char *rp_kv_dtype_name(rp_kv_dtype d); /* "auto", "bf16", "fp8_e4m3" */
/* auto made concrete for a model: fp8 where its config declares an fp8 KV
 * cache, else bf16; bf16 and fp8 stay as they are. */
rp_kv_dtype rp_kv_dtype_resolve(rp_kv_dtype d, const rp_model_config *c);
/* Bytes of one KV page (K and V of every layer, page_size tokens) in the
 * device format of d (bf16: 2 bytes an element, fp8: 1; auto counts as
 * bf16). The CPU backend holds bf16 K/V as fp32 (twice this). */
size_t rp_kv_page_bytes(const rp_model_config *c, int page_size, rp_kv_dtype d);
/* The pages a pool of usable_bytes holds, each page_bytes plus
 * shadow_page_bytes (a draft model's pool beside it), less the dummy page
 * every backend adds; 0 when not even that fits. */
int rp_kv_pool_pages(double usable_bytes, size_t page_bytes, size_t shadow_page_bytes);
/* Tensor parallelism (docs/tensor-parallel.md): this backend runs rank
 * `rank` of `size`, its model the rank's shard (dist/tp_model.h). It adds
 * the embedding's rows from its vocabulary shard (the others' rows 0) and
 * the o_proj and down_proj products of its heads and columns, then sums
 * each over the ranks through comm; it gathers the logit shards so that
 * logits (read_logits) and sampling cover the whole vocabulary
 * (plan->cfg.vocab_size) on every rank. size 0 or 1: none. */
typedef struct rp_backend_tp {
    int size, rank;
    rp_comm *comm;          /* not owned */
    const rp_tp_plan *plan; /* not owned */
    /* This process's ranks on the host (a local communicator's barrier;
     * NULL: none). The CUDA backend meets them before its first collective
     * and before capturing graphs, so that no rank allocates (cudaMalloc,
     * pinned memory: calls that may wait for the whole device) while
     * another rank's collective waits for its kernels. Not owned. */
    rp_comm *host;
    /* CUDA: every rank on one GPU (rp_tp_backend_config.one_gpu), where
     * a persistent kernel that waits on the other ranks' cannot run */
    int shared_gpu;
} rp_backend_tp;

typedef struct rp_backend_config {
    int num_pages;  /* KV pages, excluding the dummy page the backend adds; 0: CUDA sizes it
                     * to memory_ratio of the device memory left after everything else */
    double memory_ratio;
    /* What that sizing leaves to a second model on the device (a draft
     * model: docs/speculative.md): reserve_bytes at once, and
     * shadow_page_bytes for each page of this pool, the second model's own
     * pool holding as many tokens as this one. 0: nothing. */
    size_t reserve_bytes, shadow_page_bytes;
    int page_size;  /* tokens per page */
    rp_kv_dtype kv_dtype; /* the KV cache's format; auto is resolved by the backend (rp_kv_dtype_resolve) */
    int max_batched_tokens; /* largest num_tokens one forward takes */
    int max_batch_seqs;
    int max_logit_rows; /* rows of logits one forward can return; 0 = max_batch_seqs */
    int num_threads; /* CPU backend; 0 = all cores */
    /* CUDA backend */
    int device_id;
    int disable_cuda_graph;
    int cuda_graph_max_bs;   /* 0 = min(max_batch_seqs, 1024) */
    int num_cuda_graph_bs;   /* > 0: capture exactly these batch sizes */
    int cuda_graph_bs[64];
    int profile; /* time every kernel of eager forwards with events (replay profile) */
    /* 0 in every field: each value chosen by model shape and GPU
     * (backend/tuning.h, docs/tuning.md) */
    rp_tuning tuning;
    /* Where the last one-kernel decode step's trace and weight-piece
     * timeline go when the backend is destroyed (tools/step_timeline.py);
     * NULL: none. Only a trace build (-DREPLAY_DECODE_STEP_TRACE=ON) writes
     * one; in any other build setting it makes backend creation fail. */
    const char *trace_timeline_path;
    rp_backend_tp tp;
} rp_backend_config;

/* One timed segment of the last eager forward (profile mode). */
typedef struct rp_profile_entry {
    const char *name;
    float ms;
} rp_profile_entry;

/* Counters a backend keeps for benchmarks, the profiler and tests. */
typedef struct rp_backend_stats {
    uint64_t forwards;
    uint64_t graph_replays;      /* forwards that were one CUDA graph replay */
    uint64_t device_allocs;      /* device allocations since the backend finished starting */
    uint64_t decode_step_forwards; /* CUDA: forwards that ran the one-kernel decode step */
    uint64_t decode_step_picks;    /* of those, sampled by the kernel's own greedy pick */
    double last_gpu_ms;          /* device time of the last forward (CUDA events) */
    /* host time of the last forward: packing the metadata block, enqueueing
     * the work (kernel launches or one graph launch), waiting for results */
    double last_pack_ms, last_launch_ms, last_sync_ms;
    int num_graphs;
    double graph_capture_s;
    double graph_memory_mib;
} rp_backend_stats;

typedef struct rp_backend rp_backend;

typedef struct rp_backend_ops {
    /* Runs the model over the batch: writes new K/V into the cache at the
     * slot mapping and computes logits for the requested rows. */
    int (*forward)(rp_backend *b, const rp_batch *batch, rp_err *err);
    /* Copies the last forward's logits to host memory, [num_logits][vocab]. */
    int (*read_logits)(rp_backend *b, float *dst, rp_err *err);
    /* Optional: the tokens sampled by the last forward (batch->sample set),
     * [num_logits], their logprobs when logprobs != NULL, and when top !=
     * NULL each row's most likely tokens ([num_logits]; n = the row's
     * sample[i].top_logprobs, 0 where none were asked). Backends without
     * device sampling leave it NULL; the engine samples on the host. */
    int (*read_tokens)(rp_backend *b, int32_t *tokens, float *logprobs, rp_top_logprobs *top, rp_err *err);
    /* Optional, with read_tokens: samples the last forward, launched with
     * batch->sample_deferred, and must be called before the next forward.
     * Row i (of the batch's num_logits) is sampled as the forward would
     * have sampled it, after the logits of the tokens that mask row
     * mask_of_row[i] (of masks, num_masks rows of rp_token_mask_words
     * words) does not allow are set to -inf; mask_of_row[i] = -1: no mask.
     * The same draws as without a mask (the row's seed and step), so a row
     * whose mask allows everything gets the token it gets unmasked;
     * mask_of_row NULL: no row is masked. Queued
     * behind the forward: it returns before the device is done, and
     * read_tokens returns the results as those of the forward. */
    int (*sample_masked)(rp_backend *b, const uint32_t *masks, int num_masks, const int32_t *mask_of_row,
                         rp_err *err);
    void (*destroy)(rp_backend *b);
    /* Optional. */
    void (*stats)(rp_backend *b, rp_backend_stats *out);
    /* Optional: turn graph replay off/on at run time (benchmarks compare). */
    void (*set_graphs)(rp_backend *b, int enabled);
    /* Optional: per-kernel times of the last eager forward when cfg.profile
     * is set; returns the number of entries written. */
    int (*profile)(rp_backend *b, rp_profile_entry *out, int max);
} rp_backend_ops;

struct rp_backend {
    const rp_backend_ops *ops;
    const char *name;
    /* Overlap support: forward returns before the device finishes, tokens
     * may refer to the previous forward's samples, and one more forward may
     * be launched before read_tokens of the previous one (read_tokens then
     * returns the older forward's tokens first). */
    int supports_token_refs;
    /* forward returns when the work is done (CPU), not once it is queued:
     * its duration is the step's, and the engine sizes steps by it */
    int forward_is_synchronous;
    const rp_model *model; /* not owned */
    rp_backend_config cfg;
};

rp_backend *rp_backend_cpu_new(const rp_model *model, const rp_backend_config *cfg, rp_err *err);
/* NULL with a message when replay was built without CUDA or no GPU is present. */
rp_backend *rp_backend_cuda_new(const rp_model *model, const rp_backend_config *cfg, rp_err *err);
/* Number of CUDA devices usable (0 without CUDA support or without a GPU). */
int rp_cuda_device_count(void);
/* Free and total device memory of a device in bytes; -1 without CUDA. */
int rp_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* The vocabulary of the logits, the token ids and sampling: the whole
 * model's, also where the backend's model is a tensor-parallel shard. */
static inline int rp_backend_vocab(const rp_backend *b) {
    return b->cfg.tp.size > 1 ? b->cfg.tp.plan->cfg.vocab_size : b->model->cfg.vocab_size;
}

/* A rank's rows of the vocabulary (tensor parallelism: the embedding's and
 * lm_head's shard), or all of it without. */
typedef struct rp_tp_vocab {
    int64_t start, count, per_rank;
} rp_tp_vocab;
/* Checks cfg->tp against the shard's config c (a plan, a communicator, a
 * rank in range, the shard's padded vocabulary) and gives the rank's rows;
 * who ("cpu backend") names the caller in the error. */
int rp_backend_tp_vocab(const rp_backend_config *cfg, const rp_model_config *c, const char *who, rp_tp_vocab *out,
                        rp_err *err);

/* A tensor-parallel backend over N ranks (tp_backend.c): each rank's
 * backend (`device` "cpu" or "cuda"; rank r on CUDA device
 * cfg->device_id + r) runs its shard shards[r], on its own host thread,
 * summing through comms[r]; forward hands the batch to every rank; the
 * results are rank 0's (all ranks hold the same). Takes ownership of
 * nothing: plan, shards, comms and model (the whole model's config, which
 * the engine reads) outlive it. comms NULL with device "cuda": each rank
 * makes its NCCL communicator from nccl_id on its thread (and frees it);
 * with "cpu", a local group is made and freed here. rank_offset: the
 * first rank of this process (a node's first GPU in a multi-node run).
 * links: node 0 of several nodes, its control links to the others
 * (dist/bootstrap.h), over which every call is sent first as a step
 * message (tp_step_msg.h) for their ranks to make it too; node0_link:
 * another node's link to node 0 (NULL on node 0), watched while a call
 * runs (node 0 gone: the call cannot finish).
 *
 * Faults (docs/tensor-parallel.md): a watchdog waits for each call. When
 * a call does not finish within step_timeout_ms (the setup and the calls
 * until the first step's results were read: at least
 * RP_TP_SETUP_TIMEOUT_MS), a communicator reports an
 * error, or a link closes, it aborts every rank's communicator (their
 * collectives in flight return), the call fails with a message naming the
 * rank or node, and the backend runs nothing more. Node 0 then sends the
 * other nodes an abort with that message; destroying a healthy backend
 * sends them a shutdown; while idle, node 0 pings them every quarter of
 * step_timeout_ms, so that silence for step_timeout_ms means node 0 is
 * stuck or gone. */
#define RP_TP_STEP_TIMEOUT_MS 60000   /* a call once the first step was read (--dist-timeout's default) */
#define RP_TP_SETUP_TIMEOUT_MS 300000 /* at least this for the communicators, weights, graphs, first step */
typedef struct rp_tp_backend_config {
    const char *device;
    const rp_tp_plan *plan;
    rp_model *const *shards; /* [ranks] */
    int ranks;               /* ranks run by this process (= plan->size on one node) */
    int rank_offset;
    const uint8_t *nccl_id;  /* [RP_COMM_UNIQUE_ID_BYTES], CUDA only */
    const int *links;
    int num_links;
    const int *node0_link;
    int step_timeout_ms; /* 0: RP_TP_STEP_TIMEOUT_MS */
    /* "cpu": the local group the ranks meet in (not owned); NULL: one made
     * here for every rank. A caller's group may hold ranks this backend
     * does not run, made by the caller on its own threads (the tests play
     * a rank that stops coming that way). */
    rp_comm_local_group *local_group;
    /* CUDA, one node: every rank on device cfg->device_id, its collectives
     * through host memory (rp_comm_one_gpu_new), CUDA graphs off. A harness
     * that checks the split on a machine with one GPU; NCCL and the speed
     * need one GPU per rank. */
    int one_gpu;
    /* CUDA, one node: 0 (the default) sends the all-reduces of at most
     * RP_P2P_SLOT_BYTES through peer memory (rp_comm_p2p_new: one kernel, no
     * NCCL protocol), where every pair of the GPUs can reach each other's;
     * 1 sends every collective through NCCL (vLLM's
     * --disable-custom-all-reduce). */
    int disable_custom_all_reduce;
} rp_tp_backend_config;
rp_backend *rp_backend_tp_new(const rp_model *model, const rp_tp_backend_config *tcfg, const rp_backend_config *cfg,
                              rp_err *err);

static inline int rp_backend_forward(rp_backend *b, const rp_batch *batch, rp_err *err) {
    return b->ops->forward(b, batch, err);
}
static inline int rp_backend_read_logits(rp_backend *b, float *dst, rp_err *err) {
    return b->ops->read_logits(b, dst, err);
}
static inline void rp_backend_destroy(rp_backend *b) {
    if (b) b->ops->destroy(b);
}

/* Checks a batch against the backend's limits and the model, so a bad batch
 * is an error and never an out-of-bounds access. Shared by all backends. */
int rp_batch_validate(const rp_batch *batch, const rp_backend *b, rp_err *err);

#endif
