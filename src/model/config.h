/* The shape and hyperparameters of a model: what config.json and
 * generation_config.json say, normalised so that the rest of replay never
 * looks at JSON or architecture names.
 *
 * Parsing of the fields every causal LM shares lives in config.c; anything
 * specific to one architecture (defaults, extra fields, tensor names) lives in
 * that architecture's file (qwen3.c, qwen2.c, llama.c, mistral.c) behind
 * rp_arch. */
#ifndef RP_MODEL_CONFIG_H
#define RP_MODEL_CONFIG_H

#include <stdint.h>

#include "util/err.h"

#define RP_MAX_EOS_IDS 8

typedef enum rp_rope_type { RP_ROPE_DEFAULT = 0, RP_ROPE_LLAMA3, RP_ROPE_LINEAR, RP_ROPE_YARN } rp_rope_type;

/* RoPE as config.json's rope_scaling (or rope_parameters) writes it; what
 * the values mean is rope.c's business (transformers' modeling_rope_utils). */
typedef struct rp_rope_config {
    rp_rope_type type;
    double theta;
    double factor; /* llama3, linear, yarn */
    /* llama3 (transformers' _compute_llama3_parameters) */
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings; /* llama3, yarn (yarn: max_position_embeddings when absent) */
    /* yarn (transformers' _compute_yarn_parameters); 0 where config.json
     * leaves a value out, as transformers reads a missing or zero value */
    double beta_fast, beta_slow;      /* 0: 32 and 1 */
    double attention_factor;          /* 0: derived from factor (and mscale) */
    double mscale, mscale_all_dim;    /* DeepSeek's spelling of the attention factor */
    int no_truncate;                  /* "truncate": false (the correction range is not rounded) */
} rp_rope_config;

/* How the checkpoint's weights are stored (model/quant.h). */
typedef enum rp_quant_method { RP_QUANT_NONE = 0, RP_QUANT_FP8, RP_QUANT_FP8_CT } rp_quant_method;
typedef struct rp_quant_config {
    rp_quant_method method;
    int block[2];     /* per-block scales' block (rows, cols), or 0 */
    int static_input; /* activations with a static input_scale (read, not used: see quant.h) */
    /* compressed-tensors' kv_cache_scheme declares an 8-bit float KV cache
     * (llm-compressor writes it with per-layer k_scale / v_scale tensors):
     * --kv-cache-dtype auto then means fp8 (backend.h, rp_kv_dtype) */
    int kv_fp8;
    char desc[96];    /* for the startup log */
} rp_quant_config;

struct rp_arch;

typedef struct rp_model_config {
    const struct rp_arch *arch;
    char arch_name[64]; /* the HF class name, e.g. "Qwen3ForCausalLM" */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    double rms_norm_eps;
    double initializer_range; /* std of random weights (dummy weights use it, as transformers' init does) */
    rp_rope_config rope;
    int tie_word_embeddings;
    int max_position_embeddings;
    /* Mistral's sliding_window (Qwen2's when use_sliding_window): a query
     * attends to this many tokens back at most; 0 when unlimited. replay has
     * no windowed attention: rp_config_check_context refuses a context
     * longer than the window. */
    int sliding_window;
    rp_quant_config quant; /* RP_QUANT_NONE: bf16, f16 or f32 weights */
    int bos_token_id; /* -1 when absent */
    int eos_token_ids[RP_MAX_EOS_IDS];
    int num_eos_token_ids;
} rp_model_config;

/* Reads DIR/config.json and, when present, DIR/generation_config.json (whose
 * eos_token_id list takes precedence, as in transformers' generate). */
int rp_config_load_dir(rp_model_config *cfg, const char *dir, rp_err *err);

/* Parses config.json text; generation_config_json may be NULL. */
int rp_config_parse(rp_model_config *cfg, const char *config_json,
                    const char *generation_config_json, rp_err *err);

/* Checks the invariants the forward pass relies on (divisibility, ranges). */
int rp_config_validate(const rp_model_config *cfg, rp_err *err);

/* Whether replay computes this model exactly at contexts of up to
 * max_context tokens: not where a sliding window is shorter (the error
 * names the field, its value and the longest context that works). */
int rp_config_check_context(const rp_model_config *cfg, int max_context, rp_err *err);

/* Named real shapes for --dummy-weights (qwen3-0.6b, llama3-8b, tiny-*). */
int rp_config_preset(rp_model_config *cfg, const char *name, rp_err *err);
/* Comma-separated list of preset names, for help and error messages. */
const char *rp_config_preset_names(void);

/* Parameter count and bytes of the bf16 weights. */
uint64_t rp_config_num_params(const rp_model_config *cfg);

int rp_config_is_eos(const rp_model_config *cfg, int token);

#endif
