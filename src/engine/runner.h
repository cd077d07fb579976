/* The runner: everything that drives a model builds it here, one way.
 *
 * A runner owns (or borrows) a model, the backend --device names, the KV page
 * pool, the page table and the batch builder, sized together from one
 * config: the engine runs on one, and so do `bench decode`, `profile`,
 * `logits` and the tests. It also holds the fixed-batch drivers those
 * callers share (prefill sequences to a length, timed decode steps one at a
 * time or overlapped as the engine runs them, prompts' logits at every
 * position and greedy continuations), so there is one decode loop outside the engine, not one per
 * command. The engine's own loop (src/engine/step.c) adds requests,
 * scheduling and streaming on top of the same backend calls. */
#ifndef RP_ENGINE_RUNNER_H
#define RP_ENGINE_RUNNER_H

#include <stdint.h>

#include "backend/backend.h"
#include "dist/bootstrap.h"
#include "dist/tp_plan.h"
#include "engine/batch.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/model.h"

typedef struct rp_runner_config {
    /* The model: borrow `model`, or load exactly one of model_dir (with
     * load_dummy: its config with random weights) or dummy_name. */
    const rp_model *model;
    const char *model_dir;
    const char *dummy_name;
    int load_dummy;
    uint64_t weight_seed;
    int quantize_fp8; /* rp_load_options.quantize_fp8: --quantization fp8 (RP_FP8_ROWS), or bench decode
                       * --fp8-blocks (RP_FP8_BLOCKS) */
    int load_progress; /* a progress bar while the weights load */
    const char *device; /* "auto" (NULL too): the GPU when there is one; "cpu"; "cuda" */
    int threads;        /* CPU backend; 0 = all cores */
    /* KV cache and batch shape */
    int page_size;          /* tokens per page; 0 = 16 */
    rp_kv_dtype kv_dtype;   /* --kv-cache-dtype: auto (0) is the checkpoint's, else bf16 (backend.h) */
    int num_pages;          /* 0: CUDA sizes it from memory_ratio, the CPU from what a full batch needs */
    double memory_ratio;    /* 0 = 0.9 */
    size_t reserve_bytes, shadow_page_bytes; /* what the CUDA pool leaves to a draft model (backend.h) */
    int max_seqs;           /* page-table rows: the most sequences one step takes */
    int max_context;        /* tokens per sequence; 0 or more than the model's = the model's */
    int max_batched_tokens; /* tokens one forward takes; 0 = 8192 */
    int max_logit_rows;     /* 0 = max_seqs */
    /* CUDA graphs */
    int disable_cuda_graph;
    int cuda_graph_max_bs;
    int num_cuda_graph_bs; /* > 0: capture exactly these batch sizes */
    int cuda_graph_bs[64];
    int profile; /* time every kernel of eager forwards (replay profile) */
    rp_tuning tuning;                /* zero: every value chosen by model shape and GPU (docs/tuning.md) */
    const char *trace_timeline_path; /* a trace build's decode-step timeline, or NULL */
    /* Tensor parallelism (docs/tensor-parallel.md): the model over this
     * many ranks (GPUs; on the CPU, threads); 0 or 1: none. Over several
     * nodes: nnodes > 1, this node's node_rank, and dist_init_addr
     * (HOST:PORT of node 0, which hands out NCCL's id and then sends every
     * step to the other nodes); each node runs tensor_parallel_size /
     * nnodes ranks on its GPUs device_id, device_id + 1, ... */
    int tensor_parallel_size;
    int nnodes, node_rank;
    const char *dist_init_addr;
    /* --dist-timeout (docs/tensor-parallel.md, "Faults"): how long a step
     * may take, and node 0's link stay silent, before the run fails; 0 =
     * RP_TP_STEP_TIMEOUT_MS. The bootstrap, the setup and the first step
     * get at least RP_TP_SETUP_TIMEOUT_MS. */
    int dist_timeout_ms;
    /* --disable-custom-all-reduce (rp_tp_backend_config) */
    int disable_custom_all_reduce;
    int device_id;       /* the first GPU (CUDA) */
    /* CUDA: every rank on GPU device_id, collectives through the host, with
     * disable_cuda_graph set (rp_tp_backend_config.one_gpu): the split
     * checked where only one GPU is at hand (tests/test_cuda_tp.c) */
    int tp_one_gpu;
} rp_runner_config;

typedef struct rp_runner {
    rp_model *model; /* owned unless borrowed; under tensor parallelism the whole model's config (and, with
                      * dummy weights, its weights, which the shards view) */
    int owns_model;
    /* tensor parallelism: the plan, this node's ranks' shards, and the
     * control links: node 0's to every other node (links[k], -1 where
     * none), another node's to node 0 (link) */
    rp_tp_plan *tp_plan;
    rp_model *shards[RP_TP_MAX_SIZE];
    int num_shards;
    int links[RP_BS_MAX_NODES];
    int link;
    int node_rank;
    int dist_timeout_ms; /* resolved: a step's limit, and the longest node 0's link may stay silent */
    rp_backend *backend;
    rp_page_pool *pool;
    rp_page_table *table;
    rp_batch_builder *bb;
    const char *device; /* "cpu" or "cuda", as resolved */
    rp_kv_dtype kv_dtype; /* the KV cache's format, as resolved (bf16 or fp8) */
    int max_context;    /* tokens per sequence, after fitting the pool */
    int max_seqs, max_logit_rows;
    /* scratch for the fixed-batch drivers: [max_logit_rows] and [max_logit_rows][vocab] */
    rp_sampling_params *sample;
    int32_t *tokens;
    float *logits;
} rp_runner;

/* Another node of a multi-node tensor-parallel run (node_rank > 0): runs
 * the steps node 0 sends on this node's ranks until node 0 shuts down (0),
 * or fails: node 0 sends an abort, its link closes without a shutdown, it
 * sends nothing (not even a ping) for r->dist_timeout_ms, or a step fails
 * here (an error saying which). No scheduler, no requests: node 0's
 * engine decides everything. */
int rp_engine_worker_run(rp_runner *r, rp_err *err);

/* "cpu" or "cuda" for a --device value ("auto" and NULL: cuda when a GPU is present). */
const char *rp_runner_resolve_device(const char *device);

rp_runner *rp_runner_new(const rp_runner_config *cfg, rp_err *err);
void rp_runner_free(rp_runner *r);

/* ---- fixed-batch drivers (benchmarks, profiler, logits, tests) ---------- */

/* One sequence of a fixed batch: its page-table row, tokens in the cache,
 * and the next input token. */
typedef struct rp_runner_seq {
    int row;
    int len;
    int32_t last;
} rp_runner_seq;

/* Takes a page-table row for each of B sequences (len 0). */
int rp_runner_seqs_begin(rp_runner *r, rp_runner_seq *seqs, int B, rp_err *err);
/* Gives their rows and pages back. */
void rp_runner_seqs_end(rp_runner *r, rp_runner_seq *seqs, int B);
/* Prefills each sequence with ctx seeded random tokens through the batched
 * path; *seconds is the wall time. */
int rp_runner_prefill_random(rp_runner *r, rp_runner_seq *seqs, int B, int ctx, double *seconds, rp_err *err);
/* One step of a prompt chunk of n random tokens for each of the B
 * sequences at its current length (which it leaves unchanged: a repeat
 * writes the same positions again), every sequence sampling greedily after
 * it; its wall and device milliseconds. */
int rp_runner_chunk_step(rp_runner *r, rp_runner_seq *seqs, int B, int n, double *wall_ms, double *gpu_ms,
                         rp_err *err);
/* Runs `steps` decode steps over the B sequences, each reading its tokens
 * before the next is launched, sampling with *sp (NULL: greedy; sequence s
 * seeded s + 1, its RNG counter its length, as the engine does); per-step
 * wall and device milliseconds (device: 0 when the backend does not time). */
int rp_runner_decode_steps(rp_runner *r, rp_runner_seq *seqs, int B, int steps, const rp_sampling_params *sp,
                           double *wall_ms, double *gpu_ms, rp_err *err);
/* The same as the engine overlaps them: step N + 1 (its tokens references
 * to step N's) is launched before step N's tokens are read. wall_ms[k]: the
 * time between the reads of steps k - 1 and k, the time per output token a
 * user sees. Needs token references and device sampling (rp_runner_can_overlap). */
int rp_runner_decode_overlapped(rp_runner *r, rp_runner_seq *seqs, int B, int steps, const rp_sampling_params *sp,
                                double *wall_ms, double *gpu_ms, rp_err *err);
int rp_runner_can_overlap(const rp_runner *r);
/* Runs the batch and puts the greedy token of each of its `rows` logit rows
 * into tok: sampled on the device where the backend can, else the argmax
 * (lower id on a tie) of the logits read back into r->logits. */
int rp_runner_forward_greedy(rp_runner *r, rp_batch *bt, int rows, int32_t *tok, rp_err *err);
/* A speculative round's verify step for the B sequences: each fed its last
 * token and its k drafts (drafts[s * k ..]) at its length, with logits for
 * every one, and the greedy token after each into out[s * (k + 1) + j],
 * laid out as the engine lays a round out (rp_batch_add_positions: a decode
 * batch of B (k + 1) one-token sequences, so the runner needs that many
 * sequences and logit rows). The sequences' lengths stay: the caller keeps
 * what it accepts. ks (NULL: k each): sequence s feeds only its first
 * ks[s] drafts (0: a plain decode token; a step where no sequence drafts
 * is a plain decode step). Wall and device milliseconds of the step. */
int rp_runner_verify_step(rp_runner *r, const rp_runner_seq *seqs, int B, int k, const int *ks, const int32_t *drafts,
                          int32_t *out, double *wall_ms, double *gpu_ms, rp_err *err);
/* One prompt (n tokens of ids) prefilled, then `steps` decode steps fed
 * forced[k] instead of a sampled token (every run sees the same inputs,
 * whatever its logits), each step's logits into logits + k * vocab. The
 * pages are given back afterwards. For the tests that compare decode paths
 * (tests/test_cuda_tp.c). */
int rp_runner_forced_decode(rp_runner *r, const int32_t *ids, int n, const int32_t *forced, int steps, float *logits,
                            rp_err *err);
/* Runs each prompt (n[p] tokens of ids[p]): prefilled together in chunks
 * as the batch's tokens and logit rows allow, then `steps` greedy tokens
 * each (tokens[p * steps + k]) decoded together, one step per token. With
 * logits != NULL, logits[p] receives the logits at every prompt position
 * ([n[p]][vocab]). The pages are given back afterwards. For `replay logits`
 * and the tests; the engine is what serves requests. */
int rp_runner_run_prompts(rp_runner *r, int num_prompts, const int32_t *const *ids, const int *n, float *const *logits,
                          int steps, int32_t *tokens, rp_err *err);

#endif
