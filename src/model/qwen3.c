/* Qwen3ForCausalLM: Llama's layout plus per-head RMSNorm on q and k before
 * RoPE (q_norm/k_norm), an explicit head_dim that need not equal
 * hidden_size / num_heads, and usually tied embeddings on small sizes. */
#include "model/arch.h"

static int qwen3_parse_config(rp_model_config *cfg, json_t *root, rp_err *err) {
    (void)cfg;
    json_t *sw = json_object_get(root, "use_sliding_window");
    if (sw && json_is_true(sw))
        return rp_errf(err, "config.json: use_sliding_window=true is not supported");
    return 0;
}

const rp_arch rp_arch_qwen3 = {
    .hf_class = "Qwen3ForCausalLM",
    .model_type = "qwen3",
    .has_qk_norm = 1,
    .parse_config = qwen3_parse_config,
    .tensor_name = rp_arch_llama_style_name,
};
