/* The shape and hyperparameters of a model: what config.json and
 * generation_config.json say, normalised so that the rest of replay never
 * looks at JSON or architecture names.
 *
 * Parsing of the fields every causal LM shares lives in config.c; anything
 * specific to one architecture (defaults, extra fields, tensor names) lives in
 * that architecture's file (qwen3.c, llama.c) behind rp_arch. */
#ifndef RP_MODEL_CONFIG_H
#define RP_MODEL_CONFIG_H

#include <stdint.h>

#include "util/err.h"

#define RP_MAX_EOS_IDS 8

typedef enum rp_rope_type { RP_ROPE_DEFAULT = 0, RP_ROPE_LLAMA3 } rp_rope_type;

typedef struct rp_rope_config {
    rp_rope_type type;
    double theta;
    /* llama3 scaling (transformers' _compute_llama3_parameters) */
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
} rp_rope_config;

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

/* Named real shapes for --dummy-weights (qwen3-0.6b, llama3-8b, tiny-*). */
int rp_config_preset(rp_model_config *cfg, const char *name, rp_err *err);
/* Comma-separated list of preset names, for help and error messages. */
const char *rp_config_preset_names(void);

/* Parameter count and bytes of the bf16 weights. */
uint64_t rp_config_num_params(const rp_model_config *cfg);

int rp_config_is_eos(const rp_model_config *cfg, int token);

#endif
