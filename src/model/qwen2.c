/* Qwen2ForCausalLM (Qwen2, Qwen2.5): Llama's layout with a bias on the q,
 * k and v projections (not on o_proj, not in the MLP); no q/k norm. Its
 * config always writes a sliding_window, which only counts when
 * use_sliding_window is true (transformers' Qwen2Config drops it
 * otherwise). */
#include "model/arch.h"

static int qwen2_parse_config(rp_model_config *cfg, json_t *root, rp_err *err) {
    json_t *use = json_object_get(root, "use_sliding_window");
    if (!use || !json_is_true(use)) return 0;
    /* The window applies to the layers from max_window_layers on; replay
     * treats it as applying to all, which is exact wherever it is allowed at
     * all (rp_config_check_context: contexts no longer than the window). */
    json_t *sw = json_object_get(root, "sliding_window");
    if (!sw || json_is_null(sw)) return 0;
    if (!json_is_integer(sw) || json_integer_value(sw) <= 0 || json_integer_value(sw) > 2147483647)
        return rp_errf(err, "config.json: \"sliding_window\" must be a positive integer or null");
    cfg->sliding_window = (int)json_integer_value(sw);
    return 0;
}

static int qwen2_tensor_name(rp_weight_kind kind, int layer, char *buf, size_t n) {
    if (kind == RP_W_Q_NORM || kind == RP_W_K_NORM) return 0;
    return rp_arch_llama_style_name(kind, layer, buf, n);
}

const rp_arch rp_arch_qwen2 = {
    .hf_class = "Qwen2ForCausalLM",
    .model_type = "qwen2",
    .has_qk_norm = 0,
    .has_qkv_bias = 1,
    .parse_config = qwen2_parse_config,
    .tensor_name = qwen2_tensor_name,
};
