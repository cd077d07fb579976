/* The architecture registry and what all supported architectures share:
 * expected weight shapes, which optional weights an architecture has, and
 * HF's LlamaModel tensor naming. */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

static const rp_arch *const archs[] = {&rp_arch_qwen3, &rp_arch_qwen2, &rp_arch_llama, &rp_arch_mistral};

const rp_arch *rp_arch_find(const char *hf_class, const char *model_type) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        if (hf_class && !strcmp(archs[i]->hf_class, hf_class)) return archs[i];
    }
    if (hf_class) return NULL; /* a named class we do not know: do not guess */
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (model_type && !strcmp(archs[i]->model_type, model_type)) return archs[i];
    return NULL;
}

const char *rp_arch_supported(void) {
    return "Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM";
}

int rp_arch_has_weight(const rp_arch *arch, rp_weight_kind kind) {
    switch (kind) {
    case RP_W_Q_NORM:
    case RP_W_K_NORM: return arch->has_qk_norm;
    case RP_W_Q_BIAS:
    case RP_W_K_BIAS:
    case RP_W_V_BIAS: return arch->has_qkv_bias;
    default: return kind < RP_W_COUNT;
    }
}

int rp_weight_kind_is_norm(rp_weight_kind kind) {
    return kind == RP_W_FINAL_NORM || kind == RP_W_ATTN_NORM || kind == RP_W_MLP_NORM || kind == RP_W_Q_NORM ||
           kind == RP_W_K_NORM;
}

int rp_weight_kind_is_layer_matrix(rp_weight_kind kind) {
    return kind == RP_W_Q || kind == RP_W_K || kind == RP_W_V || kind == RP_W_O || kind == RP_W_GATE ||
           kind == RP_W_UP || kind == RP_W_DOWN;
}

void rp_weight_shape(const rp_model_config *c, rp_weight_kind kind, int64_t shape[2]) {
    int64_t h = c->hidden_size, q = (int64_t)c->num_heads * c->head_dim,
            kv = (int64_t)c->num_kv_heads * c->head_dim, f = c->intermediate_size;
    shape[1] = 1;
    switch (kind) {
    case RP_W_EMBED:
    case RP_W_LM_HEAD: shape[0] = c->vocab_size; shape[1] = h; break;
    case RP_W_FINAL_NORM:
    case RP_W_ATTN_NORM:
    case RP_W_MLP_NORM: shape[0] = h; break;
    case RP_W_Q: shape[0] = q; shape[1] = h; break;
    case RP_W_K:
    case RP_W_V: shape[0] = kv; shape[1] = h; break;
    case RP_W_O: shape[0] = h; shape[1] = q; break;
    case RP_W_Q_NORM:
    case RP_W_K_NORM: shape[0] = c->head_dim; break;
    case RP_W_GATE:
    case RP_W_UP: shape[0] = f; shape[1] = h; break;
    case RP_W_DOWN: shape[0] = h; shape[1] = f; break;
    case RP_W_Q_BIAS: shape[0] = q; break;
    case RP_W_K_BIAS:
    case RP_W_V_BIAS: shape[0] = kv; break;
    case RP_W_COUNT: shape[0] = 0; break;
    }
}

const char *rp_weight_kind_name(rp_weight_kind kind) {
    static const char *names[RP_W_COUNT] = {"embed", "final_norm", "lm_head", "attn_norm", "q_proj",
                                            "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",
                                            "mlp_norm", "gate_proj", "up_proj", "down_proj", "q_bias",
                                            "k_bias", "v_bias"};
    return kind < RP_W_COUNT ? names[kind] : "?";
}

int rp_arch_llama_style_name(rp_weight_kind kind, int layer, char *buf, size_t n) {
    const char *fmt = NULL;
    switch (kind) {
    case RP_W_EMBED: fmt = "model.embed_tokens.weight"; break;
    case RP_W_FINAL_NORM: fmt = "model.norm.weight"; break;
    case RP_W_LM_HEAD: fmt = "lm_head.weight"; break;
    case RP_W_ATTN_NORM: fmt = "model.layers.%d.input_layernorm.weight"; break;
    case RP_W_Q: fmt = "model.layers.%d.self_attn.q_proj.weight"; break;
    case RP_W_K: fmt = "model.layers.%d.self_attn.k_proj.weight"; break;
    case RP_W_V: fmt = "model.layers.%d.self_attn.v_proj.weight"; break;
    case RP_W_O: fmt = "model.layers.%d.self_attn.o_proj.weight"; break;
    case RP_W_Q_NORM: fmt = "model.layers.%d.self_attn.q_norm.weight"; break;
    case RP_W_K_NORM: fmt = "model.layers.%d.self_attn.k_norm.weight"; break;
    case RP_W_MLP_NORM: fmt = "model.layers.%d.post_attention_layernorm.weight"; break;
    case RP_W_GATE: fmt = "model.layers.%d.mlp.gate_proj.weight"; break;
    case RP_W_UP: fmt = "model.layers.%d.mlp.up_proj.weight"; break;
    case RP_W_DOWN: fmt = "model.layers.%d.mlp.down_proj.weight"; break;
    case RP_W_Q_BIAS: fmt = "model.layers.%d.self_attn.q_proj.bias"; break;
    case RP_W_K_BIAS: fmt = "model.layers.%d.self_attn.k_proj.bias"; break;
    case RP_W_V_BIAS: fmt = "model.layers.%d.self_attn.v_proj.bias"; break;
    case RP_W_COUNT: return 0;
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(buf, n, fmt, layer);
#pragma GCC diagnostic pop
    return 1;
}

int rp_arch_parse_sliding_window(rp_model_config *cfg, json_t *root, rp_err *err) {
    json_t *sw = json_object_get(root, "sliding_window");
    if (!sw || json_is_null(sw)) return 0;
    if (!json_is_integer(sw) || json_integer_value(sw) <= 0 || json_integer_value(sw) > 2147483647)
        return rp_errf(err, "config.json: \"sliding_window\" must be a positive integer or null");
    cfg->sliding_window = (int)json_integer_value(sw);
    return 0;
}
