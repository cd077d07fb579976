/* config.json parsing: both RoPE spellings, eos lists, defaults, presets,
 * every architecture, RoPE scaling (the frequencies and yarn's attention
 * factor computed by hand here from the published formulas), and clear
 * errors for configs replay cannot run. */
#include <math.h>

#include "model/arch.h"
#include "model/config.h"
#include "model/rope.h"
#include "test_util.h"

/* Llama 3.1 8B's published config.json (transformers < 5 spelling). */
static const char *llama31 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"vocab_size\": 128256}";

static const char *qwen3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    " \"head_dim\": 128, \"hidden_size\": 1024, \"intermediate_size\": 3072, \"max_position_embeddings\": 40960,"
    " \"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000,"
    " \"tie_word_embeddings\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

static void test_llama31(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_parse(&c, llama31, NULL, &err), 0);
    assert_ptr_equal(c.arch, &rp_arch_llama);
    assert_int_equal(c.head_dim, 128); /* default hidden / heads */
    assert_int_equal(c.rope.type, RP_ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0 && c.rope.factor == 8.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(c.num_eos_token_ids, 3);
    assert_true(rp_config_is_eos(&c, 128009) && !rp_config_is_eos(&c, 128000));
    assert_false(c.tie_word_embeddings);
    /* The preset of the same name has the same shape. */
    rp_model_config p;
    assert_int_equal(rp_config_preset(&p, "llama3-8b", &err), 0);
    assert_int_equal(p.hidden_size, c.hidden_size);
    assert_int_equal(p.intermediate_size, c.intermediate_size);
    assert_int_equal(p.num_kv_heads, c.num_kv_heads);
    assert_true(rp_config_num_params(&c) > 8000000000ull && rp_config_num_params(&c) < 8100000000ull);
}

static void test_qwen3_and_generation_config(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_parse(&c, qwen3, "{\"eos_token_id\": [151645, 151643]}", &err), 0);
    assert_ptr_equal(c.arch, &rp_arch_qwen3);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.rope.type, RP_ROPE_DEFAULT);
    assert_int_equal(c.num_eos_token_ids, 2); /* generation_config wins */
    assert_true(c.tie_word_embeddings);
    /* qwen3-0.6b has 0.6B parameters (0.44B without the tied embedding) */
    uint64_t n = rp_config_num_params(&c);
    assert_true(n > 590000000ull && n < 610000000ull);
}

static void test_rope_parameters_spelling(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err;
    const char *v5 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 100,"
        " \"rope_parameters\": {\"rope_theta\": 1234.0, \"rope_type\": \"llama3\", \"factor\": 2.0,"
        " \"low_freq_factor\": 1.0, \"high_freq_factor\": 2.0, \"original_max_position_embeddings\": 32}}";
    assert_int_equal(rp_config_parse(&c, v5, NULL, &err), 0);
    assert_true(c.rope.theta == 1234.0);
    assert_int_equal(c.rope.type, RP_ROPE_LLAMA3);
    assert_int_equal(c.num_kv_heads, 4); /* default: MHA */
    assert_int_equal(c.head_dim, 16);
}

static void expect_error(const char *json, const char *needle) {
    rp_model_config c;
    rp_err err = {0};
    assert_int_not_equal(rp_config_parse(&c, json, NULL, &err), 0);
    if (!strstr(err.msg, needle)) fail_msg("error \"%s\" does not mention \"%s\"", err.msg, needle);
}

#define BASE "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1, " \
             "\"num_attention_heads\": 4, \"vocab_size\": 100"

static void test_errors(void **state) {
    (void)state;
    expect_error("{", "config.json");
    expect_error("[]", "object");
    expect_error("{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "}", "unsupported architecture");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}", "missing");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}", "gptq");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"num_key_value_heads\": 3}", "multiple");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"hidden_size\": \"64\"}", "integer");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"attention_bias\": true}", "attention_bias");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4}}", "\"dynamic\" is not supported");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4}}", "longrope");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\"}}",
                 "factor");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0}}", "factor");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"truncate\": 1}}", "truncate");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"rope_scaling\": {\"type\": \"linear\"}}",
                 "factor");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": -2}}", "factor");
    expect_error("{\"architectures\": [\"MistralForCausalLM\"], " BASE ", \"sliding_window\": \"4096\"}",
                 "sliding_window");
    expect_error("{\"architectures\": [\"MistralForCausalLM\"], " BASE ", \"sliding_window\": 0}", "sliding_window");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"partial_rotary_factor\": 0.5}",
                 "partial_rotary_factor=0.5");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                 ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}}",
                 "partial_rotary_factor");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"eos_token_id\": 100}", "eos");
    expect_error("{\"architectures\": [\"LlamaForCausalLM\"], " BASE ", \"eos_token_id\": \"x\"}", "eos");
    expect_error("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE ", \"use_sliding_window\": true}", "sliding");
    rp_model_config c;
    rp_err err;
    assert_int_not_equal(rp_config_preset(&c, "gpt-5", &err), 0);
    assert_non_null(strstr(err.msg, "qwen3-0.6b"));
    assert_int_not_equal(rp_config_load_dir(&c, "/nonexistent/dir", &err), 0);
    assert_non_null(strstr(err.msg, "config.json"));
}

static void test_presets(void **state) {
    (void)state;
    const char *names[] = {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b",   "qwen3-8b",   "qwen3-32b",   "llama3.2-1b",
                           "llama3-8b",  "llama3-70b", "qwen2.5-7b", "mistral-7b", "tiny-qwen3", "tiny-llama3",
                           "tiny-qwen2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        rp_model_config c;
        rp_err err;
        if (rp_config_preset(&c, names[i], &err)) fail_msg("%s: %s", names[i], err.msg);
        assert_int_equal(rp_config_validate(&c, &err), 0);
        assert_non_null(strstr(rp_config_preset_names(), names[i]));
    }
    /* the two larger than one GPU: their published parameter counts */
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_preset(&c, "llama3-70b", &err), 0);
    assert_true(rp_config_num_params(&c) == 70553706496ull); /* Llama-3.1-70B-Instruct */
    assert_true(c.rope.type == RP_ROPE_LLAMA3 && c.rope.factor == 8 && c.num_kv_heads == 8);
    assert_int_equal(rp_config_preset(&c, "qwen3-32b", &err), 0);
    assert_true(rp_config_num_params(&c) == 32762123264ull); /* Qwen3-32B: 32.8B */
}

/* Qwen2.5-7B-Instruct's published config.json. */
static const char *qwen25_7b =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151645, \"hidden_act\": \"silu\", \"hidden_size\": 3584, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 18944, \"max_position_embeddings\": 32768, \"max_window_layers\": 28,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 28, \"num_hidden_layers\": 28, \"num_key_value_heads\": 4,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 131072, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 152064}";

static void test_qwen2(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_parse(&c, qwen25_7b, "{\"eos_token_id\": [151645, 151643]}", &err), 0);
    assert_ptr_equal(c.arch, &rp_arch_qwen2);
    assert_true(c.arch->has_qkv_bias && !c.arch->has_qk_norm);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.sliding_window, 0); /* use_sliding_window false: the 131072 does not count */
    assert_int_equal(rp_config_check_context(&c, 32768, &err), 0);
    /* 7.62B parameters, the q/k/v biases (28 x 4608) included */
    assert_true(rp_config_num_params(&c) == 7615616512ull);
    rp_model_config p;
    assert_int_equal(rp_config_preset(&p, "qwen2.5-7b", &err), 0);
    assert_ptr_equal(p.arch, c.arch);
    assert_true(rp_config_num_params(&p) == rp_config_num_params(&c));
    assert_int_equal(p.num_eos_token_ids, 2);
    /* the weights it has and the shapes of its biases */
    assert_true(rp_arch_has_weight(c.arch, RP_W_Q_BIAS) && !rp_arch_has_weight(c.arch, RP_W_Q_NORM));
    int64_t shape[2];
    rp_weight_shape(&c, RP_W_Q_BIAS, shape);
    assert_true(shape[0] == 3584 && shape[1] == 1);
    rp_weight_shape(&c, RP_W_V_BIAS, shape);
    assert_true(shape[0] == 512 && shape[1] == 1);
    char name[128];
    assert_true(c.arch->tensor_name(RP_W_K_BIAS, 3, name, sizeof name));
    assert_string_equal(name, "model.layers.3.self_attn.k_proj.bias");
    /* a window that counts is checked against the context served */
    const char *windowed = "{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE
                           ", \"use_sliding_window\": true, \"sliding_window\": 4096, \"max_position_embeddings\": 32768}";
    assert_int_equal(rp_config_parse(&c, windowed, NULL, &err), 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_not_equal(rp_config_check_context(&c, 32768, &err), 0);
}

/* Mistral-7B-Instruct-v0.3 (sliding_window null) and v0.1 (4096). */
static const char *mistral_v03 =
    "{\"architectures\": [\"MistralForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 1,"
    " \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 1000000.0, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 32768}";

static void test_mistral(void **state) {
    (void)state;
    rp_model_config c;
    rp_err err = {0};
    assert_int_equal(rp_config_parse(&c, mistral_v03, NULL, &err), 0);
    assert_ptr_equal(c.arch, &rp_arch_mistral);
    assert_false(c.arch->has_qkv_bias || c.arch->has_qk_norm);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(rp_config_check_context(&c, 32768, &err), 0);
    assert_true(rp_config_num_params(&c) == 7248023552ull); /* Mistral 7B's published count */
    rp_model_config p;
    assert_int_equal(rp_config_preset(&p, "mistral-7b", &err), 0);
    assert_true(rp_config_num_params(&p) == rp_config_num_params(&c));
    assert_true(p.rope.theta == c.rope.theta && p.rms_norm_eps == c.rms_norm_eps);
    /* v0.1: a 4,096-token window, head_dim written as null */
    const char *v01 =
        "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 14336,"
        " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": null,"
        " \"vocab_size\": 32000, \"max_position_embeddings\": 32768, \"rope_theta\": 10000.0, \"sliding_window\": 4096}";
    assert_int_equal(rp_config_parse(&c, v01, NULL, &err), 0);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_not_equal(rp_config_check_context(&c, 32768, &err), 0);
    if (!strstr(err.msg, "sliding_window=4096") || !strstr(err.msg, "32768"))
        fail_msg("the refusal names neither the field nor the context: %s", err.msg);
    assert_int_equal(rp_config_check_context(&c, 4096, &err), 0); /* the window covers every key */
    assert_int_not_equal(rp_config_check_context(&c, 4097, &err), 0);
}

/* The default frequencies, 1 / theta^(2i / d), in double. */
static double default_freq(double theta, int i, int d) { return 1.0 / pow(theta, 2.0 * i / d); }

/* Qwen3's long-context setting (its model card's rope_scaling), at
 * Qwen3-8B's head_dim 128 and theta 1e6. By hand: the correction range is
 * d ln(orig / (beta 2 pi)) / (2 ln theta) at beta_fast 32 and beta_slow 1,
 * 128 ln(32768 / 201.06) / 27.631 = 23.60 -> floor 23 and
 * 128 ln(32768 / 6.2832) / 27.631 = 39.65 -> ceil 40; dimensions below 23
 * keep their frequency, from 40 on it is divided by 4, a linear ramp
 * between; cos and sin are scaled by 0.1 ln 4 + 1. */
static void test_yarn(void **state) {
    (void)state;
    const char *cfg =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 4096, \"intermediate_size\": 12288,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 128,"
        " \"vocab_size\": 1000, \"max_position_embeddings\": 40960, \"rope_theta\": 1000000,"
        " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}}";
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_parse(&c, cfg, NULL, &err), 0);
    assert_int_equal(c.rope.type, RP_ROPE_YARN);
    assert_true(c.rope.factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 32768);
    float f[64];
    rp_rope_inv_freq(&c, f);
    for (int i = 0; i < 64; i++) {
        double ramp = (i - 23) / 17.0;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = default_freq(1e6, i, 128) * (1 - ramp) + default_freq(1e6, i, 128) / 4 * ramp;
        if (fabs(f[i] - want) > 2e-6 * want) fail_msg("yarn inv_freq[%d] = %.9g, by hand %.9g", i, f[i], want);
    }
    /* the ends of the ramp are where the hand computation says */
    assert_true(fabs(f[23] / default_freq(1e6, 23, 128) - 1) < 1e-6);
    assert_true(fabs(f[24] / default_freq(1e6, 24, 128) - 1) > 1e-2);
    assert_true(fabs(f[40] * 4 / default_freq(1e6, 40, 128) - 1) < 1e-6);
    assert_true(fabs(f[39] * 4 / default_freq(1e6, 39, 128) - 1) > 1e-3);
    assert_true(fabs(rp_rope_attention_scale(&c) - (0.1 * log(4.0) + 1)) < 1e-7);

    /* transformers >= 5 spelling, original context left out (it is then
     * max_position_embeddings), truncate off, an explicit attention factor */
    const char *v5 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 64,"
        " \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"yarn\", \"factor\": 8.0, \"truncate\": false,"
        " \"beta_fast\": 16, \"beta_slow\": 2, \"attention_factor\": 1.5}}";
    assert_int_equal(rp_config_parse(&c, v5, NULL, &err), 0);
    assert_int_equal(c.rope.original_max_position_embeddings, 64);
    assert_true(c.rope.no_truncate);
    /* head_dim 16: low = 16 ln(64 / (16 2 pi)) / (2 ln 1e4) = -0.391 -> 0, high = 16 ln(64 / (2 2 pi)) / 18.42 = 1.414 */
    const double lo = 0.0, hi = 16 * log(64 / (2 * 2 * M_PI)) / (2 * log(1e4));
    assert_true(fabs(hi - 1.4145) < 1e-3);
    rp_rope_inv_freq(&c, f);
    for (int i = 0; i < 8; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = default_freq(1e4, i, 16) * (1 - ramp) + default_freq(1e4, i, 16) / 8 * ramp;
        if (fabs(f[i] - want) > 2e-6 * want) fail_msg("yarn (no truncate) inv_freq[%d] = %.9g, by hand %.9g", i, f[i], want);
    }
    assert_true(rp_rope_attention_scale(&c) == 1.5f);

    /* DeepSeek's mscale pair: (0.1 mscale ln f + 1) / (0.1 mscale_all_dim ln f + 1) */
    const char *ds =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 163840,"
        " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"original_max_position_embeddings\": 4096,"
        " \"mscale\": 0.707, \"mscale_all_dim\": 1.0, \"beta_fast\": 32, \"beta_slow\": 1}}";
    assert_int_equal(rp_config_parse(&c, ds, NULL, &err), 0);
    double want = (0.1 * 0.707 * log(40.0) + 1) / (0.1 * log(40.0) + 1);
    assert_true(fabs(rp_rope_attention_scale(&c) - want) < 1e-6);
}

static void test_linear(void **state) {
    (void)state;
    const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], " BASE
                      ", \"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}";
    rp_model_config c;
    rp_err err;
    assert_int_equal(rp_config_parse(&c, cfg, NULL, &err), 0);
    assert_int_equal(c.rope.type, RP_ROPE_LINEAR);
    float f[8];
    rp_rope_inv_freq(&c, f);
    for (int i = 0; i < 8; i++) assert_true(fabs(f[i] - default_freq(1e4, i, 16) / 2) < 1e-6 * f[i]);
    assert_true(rp_rope_attention_scale(&c) == 1.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_yarn),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_qwen3_and_generation_config),
        cmocka_unit_test(test_rope_parameters_spelling),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_presets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
