/* What differs between architectures, behind one small table per
 * architecture (qwen3.c, qwen2.c, llama.c, mistral.c). Adding an
 * architecture means one new file and one line in the archs table (arch.c). */
#ifndef RP_MODEL_ARCH_H
#define RP_MODEL_ARCH_H

#include <jansson.h>
#include <stddef.h>

#include "model/config.h"

/* Every weight a decoder layer stack can have. The forward pass is written
 * against these, never against tensor names. */
typedef enum rp_weight_kind {
    RP_W_EMBED = 0,
    RP_W_FINAL_NORM,
    RP_W_LM_HEAD,
    /* per layer: */
    RP_W_ATTN_NORM,
    RP_W_Q,
    RP_W_K,
    RP_W_V,
    RP_W_O,
    RP_W_Q_NORM,
    RP_W_K_NORM,
    RP_W_MLP_NORM,
    RP_W_GATE,
    RP_W_UP,
    RP_W_DOWN,
    /* Qwen2's q/k/v projection biases. Appended after the kinds every
     * architecture has, so that those keep their numbers: a kind's number
     * seeds its dummy weights (rp_dummy_weight_params). */
    RP_W_Q_BIAS,
    RP_W_K_BIAS,
    RP_W_V_BIAS,
    RP_W_COUNT
} rp_weight_kind;

#define RP_W_FIRST_LAYER_KIND RP_W_ATTN_NORM

typedef struct rp_arch {
    const char *hf_class; /* config.json "architectures"[0] */
    const char *model_type; /* config.json "model_type" */
    int has_qk_norm;
    int has_qkv_bias; /* q_proj, k_proj, v_proj carry a bias (o_proj does not) */
    /* Architecture-specific config fields and defaults, after the common ones. */
    int (*parse_config)(rp_model_config *cfg, json_t *root, rp_err *err);
    /* The checkpoint's tensor name for a weight the architecture has
     * (rp_arch_has_weight); returns 0 when it has no name. */
    int (*tensor_name)(rp_weight_kind kind, int layer, char *buf, size_t n);
} rp_arch;

const rp_arch *rp_arch_find(const char *hf_class, const char *model_type);
const char *rp_arch_supported(void);

/* The expected shape of a weight, [rows, cols] (norms and biases: [n, 1]). */
void rp_weight_shape(const rp_model_config *cfg, rp_weight_kind kind, int64_t shape[2]);
const char *rp_weight_kind_name(rp_weight_kind kind);
/* Whether the architecture has weights of this kind at all (q/k norms,
 * q/k/v biases); a tied lm_head is the config's business, not this. */
int rp_arch_has_weight(const rp_arch *arch, rp_weight_kind kind);
/* RMSNorm weights (initialised to 1), as opposed to matrices and biases. */
int rp_weight_kind_is_norm(rp_weight_kind kind);
/* A layer's projection matrices (q, k, v, o, gate, up, down): what
 * --quantization fp8 quantizes. */
int rp_weight_kind_is_layer_matrix(rp_weight_kind kind);

/* Shared by the architectures: the HF LlamaModel naming scheme (every
 * family replay loads uses it). */
int rp_arch_llama_style_name(rp_weight_kind kind, int layer, char *buf, size_t n);
/* config.json's "sliding_window" (Mistral; Qwen2 where use_sliding_window
 * is true): null or absent leaves cfg->sliding_window 0; else a positive
 * integer, checked against the context served (rp_config_check_context). */
int rp_arch_parse_sliding_window(rp_model_config *cfg, json_t *root, rp_err *err);

extern const rp_arch rp_arch_qwen3;
extern const rp_arch rp_arch_qwen2;
extern const rp_arch rp_arch_llama;
extern const rp_arch rp_arch_mistral;

#endif
