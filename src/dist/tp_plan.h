/* Tensor parallelism's rank layout: which part of every weight and which
 * heads, MLP columns and vocabulary rows each of N GPUs holds (issue 42,
 * docs/tensor-parallel.md).
 *
 * The Megatron split over weights stored as Hugging Face writes them,
 * [out_features, in_features] row-major:
 *  - column-parallel (q, k, v and their biases, gate, up): a rank holds a
 *    range of output features, i.e. a range of ROWS of the tensor, which is
 *    one contiguous byte range of the file;
 *  - row-parallel (o, down): a rank holds a range of input features, i.e.
 *    a range of COLUMNS, a strided range of the file; each rank's product is
 *    a partial sum of the whole one, added across ranks by an all-reduce;
 *  - vocabulary-parallel (embed, lm_head): a range of rows of the padded
 *    vocabulary; the embedding's partial rows are all-reduced, the logits
 *    gathered (or reduced to the sampled token) for sampling;
 *  - norms (RMSNorm weights, Qwen3's per-head q/k norms): replicated.
 * KV heads split like query heads while there are at least N of them; with
 * fewer, each is replicated on N / num_kv_heads ranks. */
#ifndef RP_DIST_TP_PLAN_H
#define RP_DIST_TP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model/arch.h"
#include "model/config.h"
#include "util/err.h"

#define RP_TP_MAX_SIZE 8
/* Each rank's vocabulary rows are a multiple of this (vLLM pads to 64 too):
 * the lm_head GEMM's N dimension stays tile-aligned on every rank. */
#define RP_TP_VOCAB_ALIGN 64

typedef enum rp_tp_split {
    RP_TP_REPLICATED = 0, /* every rank holds the whole tensor */
    RP_TP_SPLIT_ROWS,     /* a range of rows: output features (or vocabulary entries) */
    RP_TP_SPLIT_COLS      /* a range of columns: input features */
} rp_tp_split;

/* What follows a rank's product with a weight before the next layer can use it. */
typedef enum rp_tp_collective {
    RP_TP_COLL_NONE = 0,   /* the rank's own heads / columns feed the next op as they are */
    RP_TP_COLL_ALL_REDUCE, /* partial sums: o_proj, down_proj, the embedding */
    RP_TP_COLL_GATHER      /* vocabulary shards of the logits: lm_head */
} rp_tp_collective;

/* One rank's part of one weight of shape [rows, cols]. */
typedef struct rp_tp_slice {
    rp_tp_split split;
    int64_t rows, cols;   /* the whole tensor */
    int64_t start, count; /* rows (SPLIT_ROWS) or columns (SPLIT_COLS) held; [0, rows) when replicated */
    /* Rows of the rank's buffer: count, plus the zero rows that pad the
     * vocabulary to RP_TP_VOCAB_ALIGN per rank (embed, lm_head). */
    int64_t padded_count;
} rp_tp_slice;

/* Where a slice's elements are in the tensor's bytes: num_runs runs of
 * run_bytes each, the first at offset_bytes, stride_bytes apart. Rows and
 * replicated tensors are one run. */
typedef struct rp_tp_byte_ranges {
    uint64_t offset_bytes, run_bytes, stride_bytes;
    int64_t num_runs;
} rp_tp_byte_ranges;

typedef struct rp_tp_rank {
    int q_head_start, num_q_heads;
    int kv_head_start, num_kv_heads;
    int inter_start, inter_size;
    int64_t vocab_start;  /* first padded-vocabulary row this rank holds */
    int64_t vocab_count;  /* of its vocab_per_rank rows, those below vocab_size (may be 0) */
} rp_tp_rank;

typedef struct rp_tp_plan {
    int size;                   /* N: the ranks (GPUs) of the group */
    int kv_replicas;            /* ranks holding each KV head: N / num_kv_heads when N > num_kv_heads, else 1 */
    int q_heads_per_rank, kv_heads_per_rank;
    int inter_per_rank;
    int64_t vocab_per_rank;     /* a multiple of RP_TP_VOCAB_ALIGN */
    int64_t vocab_padded;       /* vocab_per_rank * N >= vocab_size */
    rp_tp_rank ranks[RP_TP_MAX_SIZE];
    rp_model_config cfg;
} rp_tp_plan;

/* 0 when N is a tensor-parallel size replay takes (1, 2, 4, 8), else an
 * error naming it (param "tensor_parallel_size"). */
int rp_tp_size_check(int size, rp_err *err);

/* The layout of cfg over N ranks, or an error naming the config value and
 * N that do not fit: N not 1, 2, 4 or 8; num_attention_heads or
 * intermediate_size not divisible by N; num_key_value_heads neither a
 * multiple nor a divisor of N. */
int rp_tp_plan_make(rp_tp_plan *plan, const rp_model_config *cfg, int size, rp_err *err);

/* How weight `kind` is split (the same in every layer). */
rp_tp_split rp_tp_kind_split(rp_weight_kind kind);
rp_tp_collective rp_tp_kind_collective(rp_weight_kind kind);

/* Rank `rank`'s part of weight `kind` (shape from rp_weight_shape). */
void rp_tp_weight_slice(const rp_tp_plan *plan, rp_weight_kind kind, int rank, rp_tp_slice *out);

/* The slice's bytes in a row-major tensor of elem_bytes-sized elements. */
void rp_tp_slice_byte_ranges(const rp_tp_slice *s, size_t elem_bytes, rp_tp_byte_ranges *out);

/* The rank holding padded-vocabulary row `token`. */
static inline int rp_tp_vocab_owner(const rp_tp_plan *plan, int64_t token) {
    return (int)(token / plan->vocab_per_rank);
}

/* A hash of what makes two launches compute the same model the same way
 * (architecture, every shape, RoPE, quantization, N): nodes whose values
 * differ refuse to start (dist/bootstrap.h). It cannot tell two fine-tunes
 * of one shape apart. */
uint64_t rp_tp_fingerprint(const rp_model_config *cfg, int tp_size);

#endif
