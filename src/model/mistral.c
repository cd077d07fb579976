/* MistralForCausalLM (Mistral 7B v0.1-v0.3 and its fine-tunes): Llama's
 * layout and tensor names, no biases, no q/k norm. What differs is
 * sliding_window: v0.1 attends 4,096 tokens back, v0.2 and v0.3 write null.
 * head_dim may be set or null (hidden_size / heads; config.c's default). */
#include "model/arch.h"

static int mistral_parse_config(rp_model_config *cfg, json_t *root, rp_err *err) {
    json_t *sw = json_object_get(root, "sliding_window");
    if (!sw || json_is_null(sw)) return 0;
    if (!json_is_integer(sw) || json_integer_value(sw) <= 0 || json_integer_value(sw) > 2147483647)
        return rp_errf(err, "config.json: \"sliding_window\" must be a positive integer or null");
    /* checked against the context served when the model is set up
     * (rp_config_check_context) */
    cfg->sliding_window = (int)json_integer_value(sw);
    return 0;
}

static int mistral_tensor_name(rp_weight_kind kind, int layer, char *buf, size_t n) {
    if (kind == RP_W_Q_NORM || kind == RP_W_K_NORM) return 0;
    return rp_arch_llama_style_name(kind, layer, buf, n);
}

const rp_arch rp_arch_mistral = {
    .hf_class = "MistralForCausalLM",
    .model_type = "mistral",
    .has_qk_norm = 0,
    .has_qkv_bias = 0,
    .parse_config = mistral_parse_config,
    .tensor_name = mistral_tensor_name,
};
