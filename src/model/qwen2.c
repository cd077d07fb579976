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
    return rp_arch_parse_sliding_window(cfg, root, err);
}

const rp_arch rp_arch_qwen2 = {
    .hf_class = "Qwen2ForCausalLM",
    .model_type = "qwen2",
    .has_qk_norm = 0,
    .has_qkv_bias = 1,
    .parse_config = qwen2_parse_config,
    .tensor_name = rp_arch_llama_style_name,
};
