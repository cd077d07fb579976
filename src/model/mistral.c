/* MistralForCausalLM (Mistral 7B v0.1-v0.3 and its fine-tunes): Llama's
 * layout and tensor names, no biases, no q/k norm. What differs is
 * sliding_window: v0.1 attends 4,096 tokens back, v0.2 and v0.3 write null.
 * head_dim may be set or null (hidden_size / heads; config.c's default). */
#include "model/arch.h"

const rp_arch rp_arch_mistral = {
    .hf_class = "MistralForCausalLM",
    .model_type = "mistral",
    .has_qk_norm = 0,
    .has_qkv_bias = 0,
    .parse_config = rp_arch_parse_sliding_window, /* its only field of its own */
    .tensor_name = rp_arch_llama_style_name,
};
