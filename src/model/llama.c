/* LlamaForCausalLM (Llama 3, 3.1, 3.2): the base layout, with "llama3" RoPE
 * frequency scaling on 3.1+ (parsed in config.c, applied by the backend's
 * RoPE table). No q/k norm. */
#include "model/arch.h"

static int llama_parse_config(rp_model_config *cfg, json_t *root, rp_err *err) {
    (void)cfg;
    json_t *pt = json_object_get(root, "pretraining_tp");
    if (pt && json_is_integer(pt) && json_integer_value(pt) > 1)
        return rp_errf(err, "config.json: pretraining_tp > 1 is not supported");
    return 0;
}

const rp_arch rp_arch_llama = {
    .hf_class = "LlamaForCausalLM",
    .model_type = "llama",
    .has_qk_norm = 0,
    .parse_config = llama_parse_config,
    .tensor_name = rp_arch_llama_style_name,
};
