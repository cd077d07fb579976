/* config.json / generation_config.json parsing and the named dummy shapes.
 *
 * Only fields shared by every causal LM are read here; rp_arch.parse_config
 * handles what one architecture adds. Unknown fields are ignored, as
 * transformers ignores them; fields replay cannot honour (attention bias,
 * unsupported rope scaling) are errors rather than silently wrong output. */
#include "model/config.h"
#include "model/quant.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"

static int get_int(json_t *root, const char *key, int *out, int required, rp_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return rp_errf(err, "config.json: missing \"%s\"", key);
        return 0;
    }
    if (!json_is_integer(v)) return rp_errf(err, "config.json: \"%s\" must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647) return rp_errf(err, "config.json: \"%s\" out of range", key);
    *out = (int)x;
    return 0;
}

static int get_num(json_t *root, const char *key, double *out, int required, rp_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return rp_errf(err, "config.json: missing \"%s\"", key);
        return 0;
    }
    if (!json_is_number(v)) return rp_errf(err, "config.json: \"%s\" must be a number", key);
    *out = json_number_value(v);
    return 0;
}

/* eos_token_id may be an int or a list of ints (Llama 3.1, generation_config). */
static int get_eos(rp_model_config *cfg, json_t *root, const char *file, rp_err *err) {
    json_t *v = json_object_get(root, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    cfg->num_eos_token_ids = 0;
    if (json_is_integer(v)) {
        cfg->eos_token_ids[cfg->num_eos_token_ids++] = (int)json_integer_value(v);
        return 0;
    }
    if (!json_is_array(v)) return rp_errf(err, "%s: \"eos_token_id\" must be an integer or a list", file);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e)) return rp_errf(err, "%s: \"eos_token_id\" entries must be integers", file);
        if (cfg->num_eos_token_ids == RP_MAX_EOS_IDS)
            return rp_errf(err, "%s: more than %d eos ids", file, RP_MAX_EOS_IDS);
        cfg->eos_token_ids[cfg->num_eos_token_ids++] = (int)json_integer_value(e);
    }
    return 0;
}

/* The scaling types' own fields (transformers' modeling_rope_utils reads
 * the same names; what they mean is rope.c's). */
static int parse_llama3(rp_rope_config *r, json_t *rs, rp_err *err) {
    r->type = RP_ROPE_LLAMA3;
    if (get_num(rs, "factor", &r->factor, 1, err) || get_num(rs, "low_freq_factor", &r->low_freq_factor, 1, err) ||
        get_num(rs, "high_freq_factor", &r->high_freq_factor, 1, err) ||
        get_int(rs, "original_max_position_embeddings", &r->original_max_position_embeddings, 1, err))
        return rp_err_wrap(err, "llama3 RoPE scaling");
    if (r->factor <= 0 || r->low_freq_factor <= 0 || r->high_freq_factor <= r->low_freq_factor ||
        r->original_max_position_embeddings <= 0)
        return rp_errf(err, "config.json: invalid llama3 RoPE scaling values");
    return 0;
}

static int parse_linear(rp_rope_config *r, json_t *rs, rp_err *err) {
    r->type = RP_ROPE_LINEAR;
    if (get_num(rs, "factor", &r->factor, 1, err)) return rp_err_wrap(err, "linear RoPE scaling");
    if (!(r->factor > 0)) return rp_errf(err, "config.json: linear RoPE scaling \"factor\" must be positive (is %g)", r->factor);
    return 0;
}

/* original_max_position_embeddings defaults to max_position_embeddings, as
 * transformers' rope standardisation fills it in. */
static int parse_yarn(rp_rope_config *r, json_t *rs, int max_position_embeddings, rp_err *err) {
    r->type = RP_ROPE_YARN;
    r->original_max_position_embeddings = max_position_embeddings;
    if (get_num(rs, "factor", &r->factor, 1, err) ||
        get_int(rs, "original_max_position_embeddings", &r->original_max_position_embeddings, 0, err) ||
        get_num(rs, "beta_fast", &r->beta_fast, 0, err) || get_num(rs, "beta_slow", &r->beta_slow, 0, err) ||
        get_num(rs, "attention_factor", &r->attention_factor, 0, err) || get_num(rs, "mscale", &r->mscale, 0, err) ||
        get_num(rs, "mscale_all_dim", &r->mscale_all_dim, 0, err))
        return rp_err_wrap(err, "yarn RoPE scaling");
    json_t *tr = json_object_get(rs, "truncate");
    if (tr && !json_is_null(tr) && !json_is_boolean(tr))
        return rp_errf(err, "config.json: yarn RoPE scaling \"truncate\" must be true or false");
    r->no_truncate = tr && json_is_false(tr);
    if (!(r->factor > 0)) return rp_errf(err, "config.json: yarn RoPE scaling \"factor\" must be positive (is %g)", r->factor);
    if (r->original_max_position_embeddings <= 0)
        return rp_errf(err, "config.json: yarn RoPE scaling \"original_max_position_embeddings\" must be positive");
    if (r->beta_fast < 0 || r->beta_slow < 0 || r->attention_factor < 0)
        return rp_errf(err, "config.json: yarn RoPE scaling values must not be negative");
    return 0;
}

/* RoPE settings come in two spellings: transformers < 5 writes rope_theta at
 * the top level and scaling under "rope_scaling"; transformers >= 5 writes
 * both under "rope_parameters". Real checkpoints use either. Called after
 * max_position_embeddings is known (yarn's default original context). */
static int parse_rope(rp_model_config *cfg, json_t *root, rp_err *err) {
    cfg->rope.type = RP_ROPE_DEFAULT;
    cfg->rope.theta = 10000.0;
    /* RoPE on part of each head (partial_rotary_factor < 1) would rotate
     * dimensions that must stay as they are */
    double partial = 1.0;
    if (get_num(root, "rope_theta", &cfg->rope.theta, 0, err) ||
        get_num(root, "partial_rotary_factor", &partial, 0, err))
        return RP_ERR;
    json_t *rs = json_object_get(root, "rope_parameters");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return rp_errf(err, "config.json: \"rope_parameters\" must be an object");
        if (get_num(rs, "rope_theta", &cfg->rope.theta, 0, err) ||
            get_num(rs, "partial_rotary_factor", &partial, 0, err))
            return rp_err_wrap(err, "rope_parameters");
    } else {
        rs = json_object_get(root, "rope_scaling");
        if (rs && json_is_null(rs)) rs = NULL;
        if (rs && !json_is_object(rs)) return rp_errf(err, "config.json: \"rope_scaling\" must be an object");
    }
    if (partial != 1.0)
        return rp_errf(err, "config.json: partial_rotary_factor=%g is not supported (replay rotates whole heads)", partial);
    if (!rs) return 0;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "default";
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "llama3")) return parse_llama3(&cfg->rope, rs, err);
    if (!strcmp(type, "linear")) return parse_linear(&cfg->rope, rs, err);
    if (!strcmp(type, "yarn")) return parse_yarn(&cfg->rope, rs, cfg->max_position_embeddings, err);
    return rp_errf(err, "config.json: RoPE scaling type \"%s\" is not supported (supported: default, linear, llama3, yarn)",
                   type);
}

static int parse_common(rp_model_config *cfg, json_t *root, rp_err *err) {
    if (get_int(root, "vocab_size", &cfg->vocab_size, 1, err) ||
        get_int(root, "hidden_size", &cfg->hidden_size, 1, err) ||
        get_int(root, "intermediate_size", &cfg->intermediate_size, 1, err) ||
        get_int(root, "num_hidden_layers", &cfg->num_layers, 1, err) ||
        get_int(root, "num_attention_heads", &cfg->num_heads, 1, err))
        return RP_ERR;
    cfg->num_kv_heads = cfg->num_heads; /* transformers' default when absent */
    if (get_int(root, "num_key_value_heads", &cfg->num_kv_heads, 0, err)) return RP_ERR;
    cfg->head_dim = 0;
    if (get_int(root, "head_dim", &cfg->head_dim, 0, err)) return RP_ERR;
    if (cfg->head_dim == 0 && cfg->num_heads > 0) cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    cfg->rms_norm_eps = 1e-6;
    if (get_num(root, "rms_norm_eps", &cfg->rms_norm_eps, 0, err)) return RP_ERR;
    cfg->initializer_range = 0.02; /* transformers' default */
    if (get_num(root, "initializer_range", &cfg->initializer_range, 0, err)) return RP_ERR;
    cfg->max_position_embeddings = 2048;
    if (get_int(root, "max_position_embeddings", &cfg->max_position_embeddings, 0, err)) return RP_ERR;
    if (parse_rope(cfg, root, err)) return RP_ERR;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    cfg->tie_word_embeddings = tie ? json_is_true(tie) : 0;
    cfg->bos_token_id = -1;
    if (get_int(root, "bos_token_id", &cfg->bos_token_id, 0, err)) return RP_ERR;
    if (get_eos(cfg, root, "config.json", err)) return RP_ERR;
    json_t *bias = json_object_get(root, "attention_bias");
    if (bias && json_is_true(bias)) return rp_errf(err, "config.json: attention_bias=true is not supported");
    bias = json_object_get(root, "mlp_bias");
    if (bias && json_is_true(bias)) return rp_errf(err, "config.json: mlp_bias=true is not supported");
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return rp_errf(err, "config.json: hidden_act must be \"silu\"");
    return 0;
}

int rp_config_parse(rp_model_config *cfg, const char *config_json, const char *generation_config_json,
                    rp_err *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(config_json, 0, &jerr);
    if (!root) return rp_errf(err, "config.json: %s (line %d)", jerr.text, jerr.line);
    int rc = RP_ERR;
    if (!json_is_object(root)) {
        rp_errf(err, "config.json: top level must be an object");
        goto out;
    }
    const char *cls = NULL, *model_type = NULL;
    json_t *archs = json_object_get(root, "architectures");
    if (json_is_array(archs) && json_array_size(archs) > 0 && json_is_string(json_array_get(archs, 0)))
        cls = json_string_value(json_array_get(archs, 0));
    json_t *mt = json_object_get(root, "model_type");
    if (json_is_string(mt)) model_type = json_string_value(mt);
    cfg->arch = rp_arch_find(cls, model_type);
    if (!cfg->arch) {
        rp_errf(err, "config.json: unsupported architecture \"%s\" (model_type \"%s\"); supported: %s",
                cls ? cls : "?", model_type ? model_type : "?", rp_arch_supported());
        goto out;
    }
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", cfg->arch->hf_class);
    /* a quantized checkpoint's tensors (qweight, scales) are not bf16 matrices:
     * say so now rather than fail on a missing tensor after the download */
    json_t *quant = json_object_get(root, "quantization_config");
    if (quant && rp_quant_parse(quant, &cfg->quant, err)) {
        rp_err_wrap(err, "config.json");
        goto out;
    }
    if (parse_common(cfg, root, err) || cfg->arch->parse_config(cfg, root, err)) goto out;
    if (generation_config_json) {
        json_t *gen = json_loads(generation_config_json, 0, &jerr);
        if (!gen || !json_is_object(gen)) {
            rp_errf(err, "generation_config.json: %s", gen ? "top level must be an object" : jerr.text);
            json_decref(gen);
            goto out;
        }
        int e = get_eos(cfg, gen, "generation_config.json", err);
        json_decref(gen);
        if (e) goto out;
    }
    rc = rp_config_validate(cfg, err);
out:
    json_decref(root);
    return rc;
}

static char *read_text_file(const char *path, int *missing) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *missing = 1;
        return NULL;
    }
    *missing = 0;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n < (1L << 30) && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n + 1);
            if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = 0;
            } else {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    return buf;
}

int rp_config_load_dir(rp_model_config *cfg, const char *dir, rp_err *err) {
    char path[4096];
    int missing;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg_text = read_text_file(path, &missing);
    if (!cfg_text) return rp_errf(err, "%s: %s", path, missing ? "cannot open (is --model a model directory?)" : "cannot read");
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    char *gen_text = read_text_file(path, &missing);
    if (!gen_text && !missing) {
        free(cfg_text);
        return rp_errf(err, "%s: cannot read", path);
    }
    int rc = rp_config_parse(cfg, cfg_text, gen_text, err);
    free(cfg_text);
    free(gen_text);
    if (rc) return rp_err_wrap(err, "%s", dir);
    return 0;
}

int rp_config_validate(const rp_model_config *c, rp_err *err) {
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_layers <= 0 ||
        c->num_heads <= 0 || c->num_kv_heads <= 0 || c->head_dim <= 0)
        return rp_errf(err, "config: sizes must be positive");
    if (c->num_heads % c->num_kv_heads != 0)
        return rp_errf(err, "config: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                       c->num_heads, c->num_kv_heads);
    if (c->head_dim % 2 != 0) return rp_errf(err, "config: head_dim (%d) must be even for RoPE", c->head_dim);
    if (c->rms_norm_eps <= 0) return rp_errf(err, "config: rms_norm_eps must be positive");
    if (!(c->initializer_range > 0)) return rp_errf(err, "config: initializer_range must be positive");
    if (c->rope.theta <= 0) return rp_errf(err, "config: rope_theta must be positive");
    if (c->max_position_embeddings <= 0) return rp_errf(err, "config: max_position_embeddings must be positive");
    if (c->sliding_window < 0) return rp_errf(err, "config: sliding_window must not be negative");
    for (int i = 0; i < c->num_eos_token_ids; i++)
        if (c->eos_token_ids[i] < 0 || c->eos_token_ids[i] >= c->vocab_size)
            return rp_errf(err, "config: eos_token_id %d outside the vocabulary", c->eos_token_ids[i]);
    return 0;
}

/* Attention over the last sliding_window tokens equals full causal
 * attention while no query has more keys than that (transformers keeps key
 * j for query i where i - j < sliding_window), so a model with a window
 * runs exactly at contexts up to the window and is refused beyond it
 * rather than attending to keys it must not see. */
int rp_config_check_context(const rp_model_config *c, int max_context, rp_err *err) {
    if (c->sliding_window > 0 && c->sliding_window < max_context)
        return rp_errf(err,
                       "config.json: sliding_window=%d is smaller than the context of %d tokens, and replay has no "
                       "sliding-window attention: serve at most %d tokens (--max-model-len %d)",
                       c->sliding_window, max_context, c->sliding_window, c->sliding_window);
    return 0;
}

uint64_t rp_config_num_params(const rp_model_config *c) {
    uint64_t h = (uint64_t)c->hidden_size, q = (uint64_t)c->num_heads * c->head_dim,
             kv = (uint64_t)c->num_kv_heads * c->head_dim, f = (uint64_t)c->intermediate_size;
    uint64_t layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h;
    if (c->arch && c->arch->has_qk_norm) layer += 2 * (uint64_t)c->head_dim;
    if (c->arch && c->arch->has_qkv_bias) layer += q + 2 * kv;
    uint64_t n = (uint64_t)c->num_layers * layer + (uint64_t)c->vocab_size * h + h;
    if (!c->tie_word_embeddings) n += (uint64_t)c->vocab_size * h;
    return n;
}

int rp_config_is_eos(const rp_model_config *c, int token) {
    for (int i = 0; i < c->num_eos_token_ids; i++)
        if (c->eos_token_ids[i] == token) return 1;
    return 0;
}

/* Real shapes from the published config.json files; tiny-* are test shapes
 * with deliberately odd sizes. */
typedef struct preset {
    const char *name;
    const rp_arch *arch;
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim, tie, max_pos;
    double eps, theta;
    int llama3_rope; /* factor 8/32, low 1, high 4, original 8192 */
    double rope_factor;
    int bos, eos[3], n_eos;
} preset;

static const preset presets[] = {
    {"qwen3-0.6b", &rp_arch_qwen3, 151936, 1024, 3072, 28, 16, 8, 128, 1, 40960, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"qwen3-1.7b", &rp_arch_qwen3, 151936, 2048, 6144, 28, 16, 8, 128, 1, 40960, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"qwen3-4b", &rp_arch_qwen3, 151936, 2560, 9728, 36, 32, 8, 128, 1, 40960, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"qwen3-8b", &rp_arch_qwen3, 151936, 4096, 12288, 36, 32, 8, 128, 0, 40960, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"llama3.2-1b", &rp_arch_llama, 128256, 2048, 8192, 16, 32, 8, 64, 1, 131072, 1e-5, 500000, 1, 32, 128000, {128001, 128008, 128009}, 3},
    {"llama3-8b", &rp_arch_llama, 128256, 4096, 14336, 32, 32, 8, 128, 0, 131072, 1e-5, 500000, 1, 8, 128000, {128001, 128008, 128009}, 3},
    /* Qwen3-32B and Llama-3.1-70B-Instruct: larger than one GPU in bf16 (65.5 and 141 GB; tensor
     * parallelism, issue 42), or a reduced depth of them */
    {"qwen3-32b", &rp_arch_qwen3, 151936, 5120, 25600, 64, 64, 8, 128, 0, 40960, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"llama3-70b", &rp_arch_llama, 128256, 8192, 28672, 80, 64, 8, 128, 0, 131072, 1e-5, 500000, 1, 8, 128000, {128001, 128008, 128009}, 3},
    /* Qwen2.5-7B-Instruct (q/k/v biases; sliding_window is off there:
     * use_sliding_window false) and Mistral-7B-Instruct-v0.3 (sliding_window null) */
    {"qwen2.5-7b", &rp_arch_qwen2, 152064, 3584, 18944, 28, 28, 4, 128, 0, 32768, 1e-6, 1e6, 0, 0, 151643, {151645, 151643}, 2},
    {"mistral-7b", &rp_arch_mistral, 32768, 4096, 14336, 32, 32, 8, 128, 0, 32768, 1e-5, 1e6, 0, 0, 1, {2}, 1},
    {"tiny-qwen3", &rp_arch_qwen3, 1031, 96, 200, 3, 6, 2, 24, 1, 4096, 1e-6, 1e6, 0, 0, 1, {2}, 1},
    {"tiny-llama3", &rp_arch_llama, 997, 80, 216, 2, 10, 2, 8, 0, 8192, 1e-5, 500000, 1, 8, 1, {2, 3}, 2},
    {"tiny-qwen2", &rp_arch_qwen2, 1009, 112, 232, 2, 7, 1, 16, 0, 4096, 1e-6, 1e6, 0, 0, 1, {2}, 1},
};

const char *rp_config_preset_names(void) {
    return "qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-32b, llama3.2-1b, llama3-8b, llama3-70b, qwen2.5-7b, "
           "mistral-7b, tiny-qwen3, tiny-llama3, tiny-qwen2";
}

int rp_config_preset(rp_model_config *cfg, const char *name, rp_err *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->arch = p->arch;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", p->arch->hf_class);
        cfg->vocab_size = p->vocab;
        cfg->hidden_size = p->hidden;
        cfg->intermediate_size = p->inter;
        cfg->num_layers = p->layers;
        cfg->num_heads = p->heads;
        cfg->num_kv_heads = p->kv_heads;
        cfg->head_dim = p->head_dim;
        cfg->tie_word_embeddings = p->tie;
        cfg->max_position_embeddings = p->max_pos;
        cfg->rms_norm_eps = p->eps;
        cfg->initializer_range = 0.02; /* every preset's published config says 0.02 */
        cfg->rope.theta = p->theta;
        if (p->llama3_rope) {
            cfg->rope.type = RP_ROPE_LLAMA3;
            cfg->rope.factor = p->rope_factor;
            cfg->rope.low_freq_factor = 1;
            cfg->rope.high_freq_factor = 4;
            cfg->rope.original_max_position_embeddings = 8192;
        }
        cfg->bos_token_id = p->bos;
        for (int e = 0; e < p->n_eos; e++) cfg->eos_token_ids[e] = p->eos[e];
        cfg->num_eos_token_ids = p->n_eos;
        return rp_config_validate(cfg, err);
    }
    return rp_errf(err, "unknown dummy model \"%s\" (known: %s)", name, rp_config_preset_names());
}
