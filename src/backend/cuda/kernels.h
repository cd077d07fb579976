/* Launchers for replay's CUDA kernels (src/backend/cuda/kernels/ (the .cu files)), the
 * only CUDA entry points the C backend calls.
 *
 * Rules every launcher follows (STYLE.md, pegainfer's decode meta):
 *  - Anything that changes from step to step (token ids, positions, KV
 *    lengths, page-table rows, slot mapping, sampling parameters, seeds,
 *    step counters) is read from device memory at a fixed address. The int
 *    arguments are shapes and capacities, fixed for a captured graph.
 *  - Weights and activations are bf16 (uint16_t here; __nv_bfloat16 in the
 *    kernels), accumulation is fp32. The residual stream is fp32.
 *  - KV cache layout: cache[slot][kv_head][head_dim] per layer, slot =
 *    page * page_size + offset, the same as the CPU backend; its elements
 *    bf16 or e4m3 bytes with a scale per layer for K and for V (rp_kv_cache).
 *  - Launchers only enqueue on `stream`; they never allocate, synchronise
 *    or copy to the host. They return cudaSuccess or the launch error
 *    (cudaGetLastError) as an int.
 *  - Every kernel has a CPU reference in tests/test_cuda_kernels.c. */
#ifndef RP_BACKEND_CUDA_KERNELS_H
#define RP_BACKEND_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/sample_params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t rp_bf16;

/* residual[t][:] = float(embed[tokens[t]][:]), t < T; tokens[t] < 0 is a
 * token reference into prev_sampled (the previous step's sampled tokens;
 * may be NULL when no id is negative). If ss_parts is not
 * NULL (T <= RP_GEMV_MAX_T), also writes the partial sums of squares that a
 * RMSNORM-input GEMV reads (see rp_k_gemv_fused): part 0 holds each row's
 * sum, parts 1..num_parts-1 hold 0. */
int rp_k_embed(const rp_bf16 *embed, const int32_t *tokens, const int32_t *prev_sampled, float *residual,
               float *ss_parts, int num_parts, int T, int H, cudaStream_t stream);

/* Tensor parallelism (kernels/tp.cu). The embedding of a vocabulary shard:
 * residual[t][:] = float(embed[tok - vocab_start][:]) where the token tok
 * (tokens[t], or a reference as in rp_k_embed) is one of the shard's
 * vocab_count rows, else 0 (another rank adds it: the all-reduce that
 * follows makes the whole embedding). */
int rp_k_embed_shard(const rp_bf16 *embed, const int32_t *tokens, const int32_t *prev_sampled, float *residual,
                     int64_t vocab_start, int64_t vocab_count, int T, int H, cudaStream_t stream);
/* The all-gathered logit shards, gathered[k][i][j] ([ranks][rows][vocab_per_rank],
 * rank k's row i, token k * vocab_per_rank + j), into logits[i][v] for v <
 * vocab (the padding tokens past it dropped). */
int rp_k_tp_unshard_logits(const float *gathered, float *logits, int rows, int ranks, int vocab_per_rank, int vocab,
                           cudaStream_t stream);

/* The one-shot all-reduce through peer memory (kernels/p2p.cu,
 * comm_p2p.c): each rank's slot region (two slots of slot_bytes) and flag
 * array ([RP_P2P_BLOCKS][RP_P2P_MAX_RANKS] words, its peers write it) as
 * this rank's device addresses them (peer memory for the others), this
 * rank's per-block call counters (its device only) and the host-mapped
 * abort word the spin gives up on. */
#define RP_P2P_MAX_RANKS 8
#define RP_P2P_BLOCKS 32 /* every call's grid: block b's call numbers must agree on every rank */
typedef struct rp_p2p_args {
    uint8_t *slot[RP_P2P_MAX_RANKS];
    uint32_t *flags[RP_P2P_MAX_RANKS];
    uint32_t *calls; /* [RP_P2P_BLOCKS] */
    const int *abort;
    size_t slot_bytes;
    int rank, size;
} rp_p2p_args;
/* buf (n16 16-byte vectors of f32, or of bf16 if bf16; 16-byte aligned,
 * n16 * 16 <= slot_bytes) = the sum over the ranks, in rank order in f32
 * (bf16: rounded once), the same bits on every rank. Every rank of the
 * group must make the same calls. */
int rp_k_p2p_all_reduce(const rp_p2p_args *a, void *buf, int n16, int bf16, cudaStream_t stream);

/* If delta != NULL: residual += delta (a projection's fp32 output) first.
 * Then out = bf16(rmsnorm(residual) * w) with transformers' RMSNorm in fp32. */
int rp_k_add_rmsnorm(float *residual, const float *delta, const rp_bf16 *w, rp_bf16 *out, int T, int H,
                     float eps, cudaStream_t stream);
/* rp_k_add_rmsnorm for W8A8 products (--quantization fp8, forward_chain.c):
 * with dsx / dsw, delta is an FP8 matmul's raw sums, added as delta[t][i] *
 * (dsx[t] * dsw[i]) (rp_k_scale_outer's arithmetic, so the same bits as
 * scaling first); with xq / sx, out's rows are also quantized per token
 * into xq / sx (rp_k_quant_fp8_act_rows' bytes and scales). sx may be
 * dsx: a row's old scale is read before its new one is written. */
int rp_k_add_rmsnorm_fp8(float *residual, const float *delta, const float *dsx, const float *dsw, const rp_bf16 *w,
                         rp_bf16 *out, uint8_t *xq, float *sx, int T, int H, float eps, cudaStream_t stream);

/* y[t][n] = sum_k x[t][k] * W[n][k] for small T (decode): streams W once at
 * close to HBM bandwidth. T <= RP_GEMV_MAX_T. Output bf16 or fp32. */
#define RP_GEMV_MAX_T 8
int rp_k_gemv(const rp_bf16 *W, const rp_bf16 *x, rp_bf16 *y, int T, int N, int K, cudaStream_t stream);
int rp_k_gemv_f32out(const rp_bf16 *W, const rp_bf16 *x, float *y, int T, int N, int K, cudaStream_t stream);

/* The decode GEMV with its neighbours fused in (gemv.cu says why), so a
 * layer needs no separate norm, SwiGLU or residual-add launch.
 *
 * Input x[t][k], t < T:
 *  - BF16:    x = in.x[t][k] ([T][K]).
 *  - RMSNORM: x = bf16(norm_w[k] * (residual[r][k] * inv_r)), r = in.rows ?
 *             in.rows[t] : t, inv_r = 1 / sqrt(sum_p ss_parts[p][r] / K + eps)
 *             over p < num_parts (the parts a RESIDUAL-output GEMV or
 *             rp_k_embed wrote; rows r < RP_GEMV_MAX_T). residual: [.][K].
 *  - SILU:    x = bf16(silu(g) * u) with g = in.gate_up[t][k], u =
 *             in.gate_up[t][K + k] (the [T][2K] gate_up product, fp32).
 * Output y[t][n]:
 *  - BF16 / F32: out.y[t][n] = y ([T][N]).
 *  - RESIDUAL: out.residual[t][n] += y (fp32); then ss_parts[p][t]
 *             (p < rp_gemv_ss_parts(N), t < RP_GEMV_MAX_T, 0 for t >= T)
 *             = sum of the new residual's squares over the rows of part p. */
enum { RP_GEMV_IN_BF16 = 0, RP_GEMV_IN_RMSNORM = 1, RP_GEMV_IN_SILU = 2 };
enum { RP_GEMV_OUT_BF16 = 0, RP_GEMV_OUT_F32 = 1, RP_GEMV_OUT_RESIDUAL = 2 };
typedef struct rp_gemv_in {
    int mode;
    const rp_bf16 *x;
    const float *residual;
    const float *ss_parts; /* [num_parts][RP_GEMV_MAX_T] */
    int num_parts;
    const rp_bf16 *norm_w;
    const int32_t *rows;
    float eps;
    const float *gate_up; /* SILU */
} rp_gemv_in;
typedef struct rp_gemv_out {
    int mode;
    void *y;
    float *residual;
    float *ss_parts;
} rp_gemv_out;
int rp_k_gemv_fused(const rp_bf16 *W, rp_gemv_in in, rp_gemv_out out, int T, int N, int K, cudaStream_t stream);
/* The same with e4m3 weights W [N][K] (bytes) and scale[n] per row:
 * y[t][n] = scale[n] * sum_k x[t][k] * W[n][k]. K % 16 == 0. */
int rp_k_gemv_fused_fp8(const uint8_t *W, const float *scale, rp_gemv_in in, rp_gemv_out out, int T, int N, int K,
                        cudaStream_t stream);
/* Block-scaled fp8 weights (model.h's RP_FP8_BLOCKS: the official FP8
 * checkpoints): one fp32 scale per 128 x 128 block. On the GPU an [N][K]
 * matrix's grid is row-major [ceil(N / 128)][rp_fp8_grid_ld(K)], each row
 * of blocks padded to a multiple of 4 (16 bytes): the layout cuBLASLt's
 * CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F reads, which the GEMV reads
 * too. RP_FP8_BLOCK is model.h's, defined alike. */
#define RP_FP8_BLOCK 128
static inline int rp_fp8_grid_ld(int K) { return ((K + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK + 3) / 4 * 4; }
/* rp_k_gemv_fused_fp8 with such a grid instead of row scales:
 * y[t][n] = sum over k blocks b of grid[n / 128][b] * sum_{k in b} x[t][k] W[n][k].
 * T <= RP_GEMV_MAX_T, K % 16 == 0. */
int rp_k_gemv_fused_fp8_blocks(const uint8_t *W, const float *grid, rp_gemv_in in, rp_gemv_out out, int T, int N,
                               int K, cudaStream_t stream);
/* Dummy weights quantized per block on the GPU (model/quant.h's
 * rp_quant_fp8_blocks, the same bytes): rows x cols bf16 into q and the
 * grid (ld floats a row of blocks, as above). */
int rp_k_quant_fp8_blocks(const rp_bf16 *w, int64_t rows, int64_t cols, uint8_t *q, float *grid, int ld,
                          cudaStream_t stream);
/* Activations for cuBLASLt's block-scaled FP8 matmul: x [T][K] bf16 to
 * e4m3 xq [T_pad][K] with one scale per token and 128 k (max |x| / 448
 * over the group, 1 for zeros), sx[g * rp_fp8_act_ld(T_pad) + t] for group
 * g: the groups' scales of a token side by side per group, as
 * CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F reads them (the token dimension
 * padded to a multiple of 4). Rows T to T_pad - 1 (T_pad >= T: the product's
 * token count rounded up, gemm.h's RP_GEMM_FP8_BLOCKS_T_ALIGN) are written as
 * zeros with scale 1. */
static inline int rp_fp8_act_ld(int T) { return (T + 3) / 4 * 4; }
int rp_k_quant_fp8_act_groups(const rp_bf16 *x, int T, int T_pad, int K, uint8_t *xq, float *sx,
                              cudaStream_t stream);
/* out[r][c] = bf16(e4m3(q[r][c]) * grid[r / 128][c / 128]) (grid rows ld
 * apart): the CPU backend's weights, for products cuBLASLt has no
 * block-scaled algorithm for. */
int rp_k_dequant_fp8_blocks(const uint8_t *q, const float *grid, int ld, int64_t rows, int64_t cols, rp_bf16 *out,
                            cudaStream_t stream);
/* The fp8 product of 1 to RP_GEMV_FP8_MAX_T tokens, bf16 x in, y bf16 or
 * (out_f32) fp32 out: weights read once for every token (9 and more in
 * 8-token groups on the same fragments). Past 16 tokens cuBLASLt's FP8
 * matmul is faster (llama3-8b, H200: 32 tokens 9.08 ms a step here, 33
 * tokens 5.43 there; bench/RESULTS.md). */
#define RP_GEMV_FP8_MAX_T 16
int rp_k_gemv_fp8(const uint8_t *W, const float *scale, const rp_bf16 *x, void *y, int out_f32, int T, int N, int K,
                  cudaStream_t stream);
/* --quantization fp8 (model/quant.h's rp_quant_fp8_rows, the same bytes):
 * q[r][:] = e4m3(w[r][:] / scale[r]), scale[r] = max|w[r][:]| / 448 (1 for
 * a zero row), rows x cols. */
int rp_k_quant_fp8_rows(const rp_bf16 *w, int64_t rows, int64_t cols, uint8_t *q, float *scale, cudaStream_t stream);
/* The same bytes and scales for a step's activations (W8A8's x, T rows of
 * K): a row in one block's registers, read once with 16-byte loads, under
 * PDL (rows past 32,768 or unaligned ones take rp_k_quant_fp8_rows). */
int rp_k_quant_fp8_act_rows(const rp_bf16 *x, int T, int K, uint8_t *xq, float *sx, cudaStream_t stream);
/* y[t][n] = raw[t][n] * sx[t] * sw[n] ([T][N]; y bf16, or fp32 with
 * out_f32, and then may be raw itself): an FP8 matmul's raw sums scaled
 * per token and per weight row. */
int rp_k_scale_outer(const float *raw, const float *sx, const float *sw, void *y, int out_f32, int T, int N,
                     cudaStream_t stream);
/* out[r][c] = bf16(e4m3(q[r][c]) * scale[r]): the weights as the CPU backend
 * holds them, for the cuBLASLt path of larger batches. */
int rp_k_dequant_fp8_rows(const uint8_t *q, const float *scale, int64_t rows, int64_t cols, rp_bf16 *out,
                          cudaStream_t stream);
/* Partial sums a RESIDUAL-output GEMV with N rows writes. */
int rp_gemv_ss_parts(int N);
/* RMSNORM and SILU inputs are made once per block into shared memory
 * (T * (K + 8) bf16, at most RP_GEMV_STAGE_BYTES); where that does not fit
 * (long SwiGLU rows at larger T) the caller runs the unfused kernels. */
#define RP_GEMV_STAGE_BYTES (100 * 1024)
int rp_gemv_stage_fits(int T, int K);

/* One layer's KV cache as the kernels that write and read it see it
 * (docs/kv-cache.md): bf16, or e4m3 bytes holding k / k_scale and v /
 * v_scale (--kv-cache-dtype fp8), which attention reads as q . k8 times
 * k_scale (the softmax scale's factor) and sum p v8 times v_scale, so the
 * kernels only widen e4m3 in registers. The scales are 1 for bf16. */
typedef enum rp_kv_format { RP_KV_FORMAT_BF16 = 0, RP_KV_FORMAT_E4M3 = 1 } rp_kv_format;
typedef struct rp_kv_cache {
    void *k, *v; /* [slots][nkv][hd] each: rp_bf16, or uint8_t e4m3 */
    rp_kv_format format;
    float k_scale, v_scale;
} rp_kv_cache;
/* A bf16 layer's view (tests and benchmarks). */
static inline rp_kv_cache rp_kv_cache_bf16(rp_bf16 *k, rp_bf16 *v) {
    rp_kv_cache c = {k, v, RP_KV_FORMAT_BF16, 1.0f, 1.0f};
    return c;
}

/* qkv: [T][(nh + 2 * nkv) * hd], q heads then k heads then v heads (the
 * fused projection's output). In place: the optional bias (Qwen2; one
 * [(nh + 2 * nkv) * hd] vector laid out as a qkv row, NULL to skip) added to
 * q, k and v, optional per-head RMSNorm of q and k (Qwen3; q_norm/k_norm NULL
 * to skip), then rotate_half RoPE of q and k at positions[t] with angle =
 * float(positions[t]) * inv_freq[i] (fp32, like transformers) and cos and
 * sin times rope_scale (yarn's attention factor; 1 otherwise). Then k and v
 * of token t are written to the cache kv at slot_mapping[t]: bf16 as qkv
 * holds them, or e4m3(k / k_scale) and e4m3(v / v_scale) of their fp32
 * values (before qkv's bf16 rounding; an exactly rounded division, then
 * nearest even saturating at 448, as the CPU backend rounds). */
int rp_k_qk_norm_rope_store(rp_bf16 *qkv, const rp_bf16 *bias, const rp_bf16 *q_norm, const rp_bf16 *k_norm,
                            const float *inv_freq, float rope_scale, const int32_t *positions,
                            const int32_t *slot_mapping, rp_kv_cache kv, int T, int nh, int nkv, int hd, float eps,
                            cudaStream_t stream);

/* out[t][:F] = bf16(silu(gate_up[t][:F]) * gate_up[t][F:2F]), gate_up fp32. */
int rp_k_silu_mul(const float *gate_up, rp_bf16 *out, int T, int F, cudaStream_t stream);

/* Paged attention metadata shared by decode and prefill. */
typedef struct rp_attn_meta {
    const int32_t *seq_start;    /* [num_seqs + 1] query token offsets */
    const int32_t *seq_kv_len;   /* [num_seqs] keys per sequence (cached + new) */
    const int32_t *seq_page_row; /* [num_seqs] row of page_table */
    const int32_t *page_table;   /* [rows][page_table_stride] */
    int page_table_stride;
    int page_size;
    /* A step with prompt chunks (rp_k_attn_step): its attention header
     * (int32[RP_ATTN_HDR_LEN]) and prefill's work list; NULL otherwise. */
    const int32_t *hdr;
    const int32_t *pf_items;
} rp_attn_meta;

/* Decode attention: one query token per sequence (token s of qkv belongs to
 * sequence s), over that sequence's kv_len keys, GQA (nh / nkv query heads
 * per kv head), scale 1/sqrt(hd). The KV length is split into num_splits
 * parts processed in parallel (flash-decoding) and merged; num_splits is
 * fixed per graph and a split past a sequence's length contributes nothing.
 * workspace: rp_attn_decode_workspace_bytes(). out: [num_seqs][nh * hd].
 * Either cache format (an e4m3 row is widened to f16 in registers, against
 * q and the probabilities as f16: attn_decode.cu). */
size_t rp_attn_decode_workspace_bytes(int num_seqs, int nh, int hd, int num_splits);
int rp_k_attn_decode(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, void *workspace,
                     int num_seqs, int nh, int nkv, int hd, int num_splits, cudaStream_t stream);
/* Tests: 1 runs the transposed tile products (keys as the mma's M), 0 the
 * heads-as-M ones, -1 the default (attn_decode.cu says when). */
void rp_k_attn_decode_set_trans(int mode);

/* The whole decode step (embedding to logits) of 1 to 4 sequences, one
 * token each, as one persistent kernel, one block per SM
 * (kernels/decode_step/decode_step.cu says how and why). Same inputs as the chain of
 * kernels: tokens, positions, slots and the paged attention view from the
 * metadata block (token b belongs to sequence b, logit row b to token b);
 * the activation buffers hold a row per sequence; sampling runs after
 * it. */
typedef struct rp_decode_layer { /* the matrices; the norms are in rp_decode_step.norms */
    const void *wqkv, *wo, *wgu, *wdown; /* bf16, or e4m3 bytes with rp_decode_step.fp8 */
    const rp_bf16 *bqkv; /* q, k and v biases side by side [qkv_dim] (Qwen2), or NULL */
    const float *sqkv, *so, *sgu, *sdown; /* fp8: each matrix's row scales; else NULL */
} rp_decode_layer;
/* Tensor parallelism inside the one-kernel step (one sequence; the model
 * is the rank's shard, its embedding and lm_head its vocabulary rows):
 * the 2 L + 1 sums of a step (the embedding, every o and down product)
 * through peer memory (comm_p2p.c). Each rank writes its partial rows into
 * every rank's recv[c & 1][its rank][:H] (c: the sum's number in the step),
 * then arrives at every rank's counter (the grid barriers after those
 * phases count all ranks' blocks); each block then reads the N partials
 * from its own GPU's memory, adds them to the residual of the sum before
 * (res[(c - 1) & 1]) in rank order, and writes its share of res[c & 1].
 * With the greedy pick, each rank's best token of its vocabulary rows goes
 * into every rank's pick[its rank] as tagged 64-bit words (the value and
 * the launch: kernels/decode_step/sync.cuh), and every rank takes the best
 * of the N in rank order. n = 0: none. */
#define RP_DECODE_STEP_TP_MAX 8
typedef struct rp_decode_step_tp {
    int n, rank;
    float *recv[RP_DECODE_STEP_TP_MAX];               /* rank k's [2][n][H] (peer memory for k != rank) */
    unsigned *ctr[RP_DECODE_STEP_TP_MAX];             /* rank k's arrival counter */
    unsigned long long *pick[RP_DECODE_STEP_TP_MAX]; /* rank k's [n][4] words: each rank's pick */
    float *res[2];                                    /* this rank's residual after sums of each parity [H] */
    int64_t vocab_start, vocab_count;                 /* the embedding's rows: global token ids */
    /* host-mapped, set by the communicator's abort: a wait for a rank that
     * is gone gives up (the step's results are then garbage; it fails) */
    const int *abort;
} rp_decode_step_tp;

typedef struct rp_decode_step {
    const rp_decode_layer *layers; /* device array [num_layers] */
    /* the RMSNorm weights again, side by side, so that the kernel computes
     * their addresses instead of loading them from layers: per layer
     * attn_norm [H], mlp_norm [H], then (qk_norm) q_norm [hd], k_norm [hd] */
    const rp_bf16 *norms;
    int qk_norm;
    const rp_bf16 *embed, *final_norm, *lm_head;
    const float *inv_freq;
    const int32_t *tokens, *positions, *slots;
    const int32_t *prev_sampled; /* where token references point (rp_k_embed) */
    rp_attn_meta meta;
    rp_bf16 *k_cache, *v_cache;
    size_t kv_layer_elems;
    float *residual; /* [nb][H] */
    float *logits;   /* [nb][V] */
    /* the greedy pick's outputs (rp_k_decode_step's greedy): token and
     * logprob per sequence, where the sampling kernels leave theirs */
    int32_t *pick_tokens;
    float *pick_logprobs;
    /* and into pinned host memory, so that no copy follows the kernel:
     * pick_host[*pick_slot], tokens then logprobs pick_host_stride apart
     * (the backend's per-slot result buffers) */
    const int32_t *pick_slot;
    int32_t *pick_host[2];
    int pick_host_stride;
    /* act: the SwiGLU output, bf16; with fp8 the step writes it as f16
     * (the down product's operand, saturated: fp8.cuh) */
    rp_bf16 *qkv, *attn, *act;
    void *workspace; /* rp_decode_step_workspace_bytes(), zeroed once */
    /* NULL, or [grid][RP_DECODE_STEP_TRACE_STRIDE] u64 per block of the
     * last launch: ns spent per kind of work, rp_decode_step_trace_names
     * (written only by the trace build, -DREPLAY_DECODE_STEP_TRACE=ON) */
    uint64_t *trace;
    /* NULL, or (with trace) [grid][RP_DECODE_STEP_TL_PIECES][4] u64 per
     * block of the last launch: for each ring piece, the %globaltimer at
     * which the producer issued it, its consumer warp found it complete and
     * released its stage, then (phase << 40) | bytes (the trace build, with
     * rp_backend_config.trace_timeline_path set) */
    uint64_t *timeline;
    int num_layers, H, F, nh, nkv, hd, V;
    int fp8; /* the layers' matrices are e4m3 with row scales (--quantization fp8); lm_head stays bf16 */
    float eps;
    float rope_scale; /* cos and sin times this (yarn's attention factor; 1 otherwise) */
    rp_decode_step_tp tp;
} rp_decode_step;
size_t rp_decode_step_workspace_bytes(int nh, int nkv);
/* The step's plan values, concrete: rp_cuda_tuning_resolve (tuning.c) makes
 * them from rp_tuning by model shape and GPU; docs/tuning.md says why each
 * default is what it is. */
typedef struct rp_decode_step_tuning {
    int kc;           /* k per ring piece: a multiple of 256 in [256, 1536] */
    int prefetch;     /* static pieces the producer may prefetch into L2 while it waits for a stage */
    int prefetch_now; /* of those, issued at once when a wait starts */
    int dyn_eighths;  /* eighths of a large phase's units taken dynamically (0-8) */
    int pace_ns;      /* one sequence: the producer's pause between pieces while its consumers are at a grid
                       * barrier or in attention (0: none) */
    int tail_hold;    /* a block that took one of a phase's last tail_hold dynamic units queues no more
                       * copies until it arrives at the phase's barrier */
    int max_kv;       /* the step runs while one sequence's K/V tokens are at most this (2-4
                       * sequences: half of it, together); the backend runs the chain beyond
                       * (cuda_backend.c) */
    int max_seqs;     /* the step for at most this many sequences (1, 2 or 4), the chain beyond
                       * (forward_decode_step.c) */
} rp_decode_step_tuning;
/* NULL when the shapes are supported, else why not; _device also asks the
 * current device for nb sequences (shared memory, cooperative launch, a
 * block per SM). 3 sequences run the kernel for 4 (the same arithmetic
 * per sequence as 3 padded to 4). */
const char *rp_decode_step_check(const rp_decode_step *s);
const char *rp_decode_step_check_device(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb,
                                        int num_sms);
/* greedy: every sequence's token is its logits' argmax (lowest id on
 * ties), picked inside the kernel with its logprob (pick_tokens,
 * pick_logprobs; as rp_k_sample_kept leaves them for greedy rows), so no
 * sampling kernel needs to follow. */
int rp_k_decode_step(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb, int num_sms, int greedy,
                     cudaStream_t stream);
/* Whether rp_k_decode_step can pick greedily for nb sequences. */
int rp_decode_step_pick_ok(const rp_decode_step *s, int nb, int num_sms);
/* Per block: RP_DECODE_STEP_TRACE_SLOTS totals, then from slot 16 the
 * %globaltimer (ns) at which it arrived at and left grid barrier k (slots
 * 16 + 2k and 16 + 2k + 1; five barriers per layer), then from
 * RP_DECODE_STEP_TRACE_ATT, 8 per layer, when its attention item started,
 * had q/k/v, ended its score loop (warp 0), had every warp's scores, had
 * published its partials and had merged (0: no item), then from
 * RP_DECODE_STEP_TRACE_FENCE, one per barrier, when its release fence was
 * done (the arrival slot holds the time before the fence). */
#define RP_DECODE_STEP_TRACE_SLOTS 12
#define RP_DECODE_STEP_TRACE_BARRIERS (5 * 128)
#define RP_DECODE_STEP_TRACE_ATT (16 + 2 * RP_DECODE_STEP_TRACE_BARRIERS)
#define RP_DECODE_STEP_TRACE_FENCE (RP_DECODE_STEP_TRACE_ATT + 8 * 128)
#define RP_DECODE_STEP_TRACE_STRIDE (RP_DECODE_STEP_TRACE_FENCE + RP_DECODE_STEP_TRACE_BARRIERS)
extern const char *const rp_decode_step_trace_names[RP_DECODE_STEP_TRACE_SLOTS];
#define RP_DECODE_STEP_TL_PIECES 8192

/* Prefill attention for variable-length sequences (T tokens in all): query
 * token i of sequence s sits at position kv_len - n_new + i and attends
 * causally to keys 0..position, read from the paged cache (which already
 * holds this step's keys). Tensor cores. out: [T][nh * hd].
 * max_kv_len is the batch's longest seq_kv_len (0 if unknown: no split).
 * Where the grid would be too small for the GPU and the keys mostly a
 * cached prefix, each query tile's keys are split into ranges run in
 * parallel and merged (attn_prefill.cu says when); their partial results
 * go to workspace (workspace_bytes; NULL: never split), which
 * rp_attn_prefill_workspace_bytes(max_tokens, ...) sizes for every split
 * the launcher makes for up to max_tokens tokens on num_sms SMs. */
size_t rp_attn_prefill_workspace_bytes(int max_tokens, int nh, int hd, int num_sms);
/* Either cache format: e4m3 tiles are staged in shared memory as bytes and
 * widened to bf16 there before the mma (attn_prefill.cu). */
int rp_k_attn_prefill(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, void *workspace,
                      size_t workspace_bytes, int T, int num_seqs, int max_q_len, int max_kv_len, int nh, int nkv,
                      int hd, cudaStream_t stream);
/* The attention of a step with prompt chunks, graph-safe: its launches
 * depend only on the step's shape (rp_attn_step_shape, fixed per token
 * bucket), and what they work on comes from the metadata block, so one
 * captured graph runs any mix of prompt chunks and decode tokens that fits
 * its bucket. The batch's leading sequences of one new token (its decodes)
 * take decode attention, grid over shape.dec_seqs sequences, the blocks
 * past the step's count returning at once; the rest take prefill attention
 * over a work list (sequence, first query row, key split) the host plans
 * per step, grid over shape.pf_items items. Splits, where the shape allows
 * them, leave partial results that a grid-stride merge over the header's
 * row range combines. Eager and captured steps make the same launches, so
 * they compute the same values. */
enum {
    RP_ATTN_HDR_DECODE_SEQS,   /* leading sequences of one token: decode attention's */
    RP_ATTN_HDR_PF_ITEMS,      /* prefill work items */
    RP_ATTN_HDR_PF_SPLITS,     /* every prefill sequence's keys in this many ranges */
    RP_ATTN_HDR_PF_MERGE_BEGIN, /* rows (token x nh + head) the prefill merge combines */
    RP_ATTN_HDR_PF_MERGE_END,
    RP_ATTN_HDR_DEC_SPLITS,
    RP_ATTN_HDR_DEC_MERGE_BEGIN,
    RP_ATTN_HDR_DEC_MERGE_END,
    RP_ATTN_HDR_LEN
};
#define RP_ATTN_ITEM_INTS 3 /* a work item: sequence, first query row, split */
typedef struct rp_attn_step_shape {
    int tokens;     /* the step's token count, padded */
    int dec_seqs;   /* decode attention's grid, in sequences */
    int dec_splits; /* its key ranges per sequence (1: no merge) */
    int pf_mode;    /* prefill's block shape (RP_PREFILL_*) */
    int pf_rows;    /* query positions a prefill item covers */
    int pf_items;   /* prefill's grid, in work items */
    int pf_split;   /* prefill keys may be split: a merge launch follows */
    size_t parts;   /* (row, split) partial results the workspace holds */
} rp_attn_step_shape;
/* The shape of a step of up to tokens tokens and max_seqs sequences on
 * num_sms SMs with a workspace of ws_bytes; dec_splits: the decode rule's
 * choice for the bucket (the caller's). Large buckets take the Hopper
 * kernel (RP_PREFILL_SM90: 128 query rows of one head per item, never
 * split) where it runs the shape: bf16 caches only (it copies K/V pages
 * into its ring as they are), so an e4m3 cache (kv_format) always takes
 * the mma.sync blocks. */
rp_attn_step_shape rp_attn_step_shape_for(int tokens, int max_seqs, int dec_splits, int num_sms, int nh, int nkv,
                                          int hd, int page_size, size_t ws_bytes, rp_kv_format kv_format);
/* The most work items any step up to max_tokens tokens and max_seqs
 * sequences lists (the metadata block's room). */
int rp_attn_step_max_items(int max_tokens, int max_seqs, int num_sms, int nh, int nkv);
/* Host: plans a batch (host arrays; num_tokens <= shape.tokens) into the
 * header and the work list: 0, or -1 when the batch does not fit the shape
 * (more items than shape.pf_items). */
int rp_attn_step_plan(const rp_attn_step_shape *sh, const int32_t *seq_start, const int32_t *seq_kv_len,
                      int num_seqs, int num_sms, int nh, int nkv, int hd, int32_t *hdr, int32_t *items);
/* The launches (meta.hdr and meta.pf_items set). An e4m3 cache with an
 * RP_PREFILL_SM90 shape is cudaErrorInvalidValue. */
int rp_k_attn_step(const rp_bf16 *qkv, rp_kv_cache kv, rp_attn_meta meta, rp_bf16 *out, void *workspace,
                   const rp_attn_step_shape *sh, int nh, int nkv, int hd, cudaStream_t stream);

/* The number of key ranges rp_k_attn_prefill's rule makes for this launch
 * on num_sms SMs (1: no split), for benchmarks and tests. */
int rp_attn_prefill_splits(int num_sms, int T, int num_seqs, int max_q_len, int max_kv_len, int nh, int nkv, int hd,
                           size_t workspace_bytes);
/* Bytes of workspace a launch of T tokens split num_splits ways needs. */
size_t rp_attn_prefill_split_bytes(int T, int nh, int hd, int num_splits);
/* Prefill attention's block shape (attn_prefill.cu says why): 16 query
 * rows per warp; 32 (two runs of 16 positions); two heads of one kv group
 * at the same 16 positions (the default where the group is even and that
 * grid covers the SMs; else the first). Tests:
 * rp_k_attn_prefill_set_mode(mode), -1 the default. */
enum { RP_PREFILL_ROWS16 = 1, RP_PREFILL_ROWS32 = 2, RP_PREFILL_HEADS2 = 3 };
/* a step's prefill on the Hopper kernel (rp_k_attn_prefill_sm90_list) */
#define RP_PREFILL_SM90 4
void rp_k_attn_prefill_set_mode(int mode);
/* Tests and benchmarks: rp_k_attn_prefill_set_splits(n), n >= 2 splits
 * every launch n ways (the two-head block where the group is even, else
 * 16 rows per warp, unless set_mode says otherwise; a workspace too small
 * for it fails the launch with cudaErrorInvalidValue), 1 never splits, -1
 * the default rule. */
void rp_k_attn_prefill_set_splits(int num_splits);

/* Prefill attention on Hopper's wgmma and bulk tensor copies
 * (attn_prefill_sm90.cu, FlashAttention-3 style): the same function and
 * arguments as rp_k_attn_prefill, without the split workspace (it never
 * splits; max_kv_len is unused). Not yet used by the forward.
 * rp_attn_prefill_sm90_supported says whether a shape is handled (hd 128,
 * page_size a power of two >= 16); the launcher returns
 * cudaErrorInvalidValue for one that is not. */
int rp_attn_prefill_sm90_supported(int hd, int page_size);
/* The same over a step's work list (rp_k_attn_step's RP_PREFILL_SM90
 * shape): grid max_items x nh, T the bucket's tokens. */
int rp_k_attn_prefill_sm90_list(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache,
                                rp_attn_meta meta, rp_bf16 *out, int T, int max_items, int nh, int nkv, int hd,
                                cudaStream_t stream);
int rp_k_attn_prefill_sm90(const rp_bf16 *qkv, const rp_bf16 *k_cache, const rp_bf16 *v_cache, rp_attn_meta meta,
                           rp_bf16 *out, int T, int num_seqs, int max_q_len, int max_kv_len, int nh, int nkv, int hd,
                           cudaStream_t stream);
/* Layout checks of that kernel's pieces (attn_prefill_sm90_debug.cu), one
 * 64 x 128 tile each, so a wrong swizzle, descriptor or fragment layout
 * shows alone: s[64][128] = q[64][128] k[128][128]^T (both loaded by TMA,
 * K-major wgmma from shared memory); o[64][128] = bf16(p[64][128])
 * v[128][128] (p through registers as the A fragment, v by TMA as the
 * transposed B). Row-major, fp32 results. */
int rp_k_sm90_debug_qk(const rp_bf16 *q, const rp_bf16 *k, float *s, cudaStream_t stream);
int rp_k_sm90_debug_pv(const float *p, const rp_bf16 *v, float *o, cudaStream_t stream);

/* Gathers rows: out[i][:] = in[rows[i]][:], for the lm_head's input. */
int rp_k_gather_rows(const rp_bf16 *in, const int32_t *rows, rp_bf16 *out, int n, int H, cudaStream_t stream);

/* rp_sampling_params (backend/sample_params.h): per-row, in device memory,
 * written by the engine each step. */

/* tokens[r] = sample(logits[r][:vocab]) for r < rows; greedy rows take the
 * argmax (lowest id on ties). The draw is u = rp_rand_uniform(seed, 0, step)
 * (src/util/rng.h) and the kernel picks by inverse CDF over the kept tokens
 * in descending-probability order, like the CPU sampler, so both make the
 * same choice up to fp rounding. logprobs (nullable): the chosen token's
 * log-probability. workspace: rp_sample_workspace_bytes(). */
size_t rp_sample_workspace_bytes(int rows, int vocab);
int rp_k_sample(const float *logits, const rp_sampling_params *params, int32_t *tokens, float *logprobs,
                void *workspace, int rows, int vocab, cudaStream_t stream);

/* Fills bf16 weights with the same bits as the CPU dummy-weight generator
 * (src/model/weights.c): 1.0 when is_norm, else element i is
 * rp_dummy_bf16(rp_rand_normal(seed, stream_id, i), std) (model/model.h,
 * util/rng.h), a normal with mean 0 and standard deviation std. */
int rp_k_fill_dummy(rp_bf16 *dst, int64_t n, uint64_t seed, uint64_t stream_id, double std, int is_norm,
                    cudaStream_t stream);
/* Tensor parallelism: a rank's slice of that tensor (whole rows of src_cols
 * columns), dst [rows][cols] row-major: dst[r][c] = element (row0 + r) *
 * src_cols + col0 + c of the whole tensor's values, for r < valid_rows;
 * 0 below (the vocabulary's padding rows). The same values as the whole
 * tensor generated by rp_k_fill_dummy, so a shard equals its part of it. */
int rp_k_fill_dummy_slice(rp_bf16 *dst, int64_t rows, int64_t cols, int64_t src_cols, int64_t row0, int64_t col0,
                          int64_t valid_rows, uint64_t seed, uint64_t stream_id, double std, int is_norm,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
