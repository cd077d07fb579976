/* A loaded model: its config and every weight as a bf16 [rows, cols] view.
 *
 * Weights come from a Hugging Face directory (model.safetensors or sharded
 * model-*.safetensors with model.safetensors.index.json, mmap'd) or are made
 * up (dummy weights: a named preset shape, or a directory's config.json with
 * --load-format dummy). Backends read weights only through rp_model_weight,
 * so they never see file formats, tensor names or architectures. */
#ifndef RP_MODEL_MODEL_H
#define RP_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/arch.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "util/dtype.h"

/* How a model's layer matrices (q, k, v, o, gate, up, down) are held for
 * the GPU besides their bf16 values (model/quant.h). */
typedef enum rp_fp8_layout {
    RP_FP8_NONE = 0, /* bf16 only */
    RP_FP8_ROWS,     /* e4m3 bytes and one fp32 scale per row: --quantization fp8, per-tensor and
                      * per-channel FP8 checkpoints */
    RP_FP8_BLOCKS,   /* e4m3 bytes and one fp32 scale per 128 x 128 block: the official Qwen3 FP8
                      * checkpoints (DeepSeek's layout) */
} rp_fp8_layout;

/* The block of RP_FP8_BLOCKS: rows and columns one scale covers. */
#define RP_FP8_BLOCK 128

typedef struct rp_weight {
    const uint16_t *data; /* bf16, row-major [rows, cols]; NULL when absent */
    int64_t rows, cols;
    /* An fp8 model's layer matrices (rp_model.fp8): the e4m3 bytes [rows,
     * cols] and either one fp32 scale per row (scale, RP_FP8_ROWS) or one
     * per 128 x 128 block (block_scale, RP_FP8_BLOCKS: [ceil(rows / 128)]
     * [ceil(cols / 128)], row-major); data then holds their dequantized
     * values. NULL otherwise, and with lazy dummy weights (the backend
     * quantizes what it generates). */
    const uint8_t *fp8;
    const float *scale;
    const float *block_scale;
} rp_weight;

typedef enum rp_load_format { RP_LOAD_AUTO = 0, RP_LOAD_DUMMY } rp_load_format;

typedef struct rp_model {
    rp_model_config cfg;
    rp_weight global[RP_W_FIRST_LAYER_KIND]; /* embed, final_norm, lm_head */
    rp_weight *layers;                       /* [num_layers][RP_W_COUNT] */
    char *dir;                               /* model directory, NULL for presets */
    int dummy;                               /* weights are random */
    uint64_t dummy_seed;
    uint64_t weight_bytes;                   /* bytes of distinct weights as held (fp8: its matrices at a
                                              * byte an element and a float a row or a block) */
    rp_fp8_layout fp8;                       /* the layer matrices' e4m3 form, if any (rp_weight) */
    /* The fp8 KV cache's scales per layer ([num_layers] each): K is stored
     * as e4m3(k / k_scale), V as e4m3(v / v_scale). Read from the
     * checkpoint where it has them (vLLM's and llm-compressor's names:
     * weights.c), else 1; NULL (a model not built by weights.c) is 1 too.
     * Unused with a bf16 KV cache. */
    float *k_scale, *v_scale;
    int kv_scales_loaded;                    /* how many layers' scales came from the checkpoint */
    /* ownership */
    rp_safetensors **files;
    int num_files;
    void **owned;
    int num_owned, cap_owned;
} rp_model;

typedef struct rp_load_options {
    rp_load_format format;
    uint64_t seed; /* dummy weights */
    int progress;  /* draw a progress bar (only when stderr is a terminal) */
    /* Dummy weights only: leave every weight's data NULL and let the backend
     * generate the same values where they live (the GPU fills 16 GB in
     * milliseconds; the host would take seconds and the memory). */
    int lazy_dummy;
    /* --quantization fp8 (RP_FP8_ROWS): each layer's q/k/v/o/gate/up/down
     * matrices quantized to e4m3 with per-row scales at load (vLLM's
     * option); embeddings, lm_head, norms and biases stay bf16.
     * RP_FP8_BLOCKS (tests and `replay bench`, not a product option): the
     * same matrices quantized per 128 x 128 block, the official FP8
     * checkpoints' layout, so their path runs on dummy weights. */
    rp_fp8_layout quantize_fp8;
} rp_load_options;

/* Loads DIR (config, generation config, weights per options->format). */
rp_model *rp_model_load(const char *dir, const rp_load_options *opts, rp_err *err);
/* Builds a model of a named shape with seeded random weights, no files. */
rp_model *rp_model_dummy(const char *preset, const rp_load_options *opts, rp_err *err);
/* Builds a model of the given config with seeded random weights. */
rp_model *rp_model_dummy_from_config(const rp_model_config *cfg, const rp_load_options *opts, rp_err *err);
void rp_model_free(rp_model *m);

/* Whether RP_FP8_BLOCKS can be held for the GPU: the CUDA backend stacks
 * q|k|v and gate|up into one matrix each, and their block grids stack with
 * them only where every part's rows are whole 128-row blocks (true of the
 * Qwen3 and Llama shapes, and of their tensor-parallel shards where each
 * GPU's heads are whole blocks). NULL if so, else the part that is not. */
const char *rp_fp8_blocks_unstackable(const rp_model_config *cfg);

/* A model whose layer matrices were bound with their e4m3 bytes (an FP8
 * checkpoint's: per-tensor or per-channel scales as row scales, or 128 x
 * 128 block grids; or a tensor-parallel shard's slices of them): where
 * every layer matrix has them in one layout, the model is fp8 of that
 * layout and its held bytes are a byte per element plus the scales
 * (weight_bytes counted at bf16's two before). Otherwise (other block
 * sizes, block grids that cannot stack, some layer left bf16) every weight
 * stays as dequantized, and why[why_size] says why. Returns m->fp8. */
rp_fp8_layout rp_model_fp8_settle(rp_model *m, char *why, size_t why_size);

/* m->fp8 set, weight_bytes counted at bf16's two bytes an element: each
 * layer matrix recounted at a byte an element plus its scales (a float a
 * row, or a float a block). */
void rp_model_fp8_weight_bytes(rp_model *m);

/* How dummy weight (kind, layer) is generated, so another backend (and
 * tools/gpu_compare.py) can make the identical values: norms (is_norm) are
 * exactly 1; element i of any other weight (biases too) is
 * rp_dummy_bf16(rp_rand_normal(seed, stream, i), std) (util/rng.h), std being
 * the config's initializer_range, as transformers initialises a model
 * (except biases, which it zeroes), stream kind * 100003 + layer. */
void rp_dummy_weight_params(const rp_model_config *cfg, rp_weight_kind kind, int layer, uint64_t *stream,
                            double *std, int *is_norm);

/* One dummy value: z * std rounded to float, then float to bf16, both to
 * nearest even. Through float on purpose: torch's double -> bf16 goes through
 * float too, so gpu_compare.py, the CUDA kernel and this round alike. */
static inline uint16_t rp_dummy_bf16(double z, double std) {
    return rp_f32_to_bf16((float)(z * std));
}

/* Layer l's fp8 KV cache scales (1 where the model has none). */
static inline float rp_model_k_scale(const rp_model *m, int l) { return m->k_scale ? m->k_scale[l] : 1.0f; }
static inline float rp_model_v_scale(const rp_model *m, int l) { return m->v_scale ? m->v_scale[l] : 1.0f; }

/* layer is ignored for embed/final_norm/lm_head. */
static inline const rp_weight *rp_model_weight(const rp_model *m, rp_weight_kind kind, int layer) {
    if (kind < RP_W_FIRST_LAYER_KIND) return &m->global[kind];
    return &m->layers[(int64_t)layer * RP_W_COUNT + kind];
}

#endif
