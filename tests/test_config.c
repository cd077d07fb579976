/* config.json parsing: both RoPE spellings, eos lists, defaults, presets,
 * and clear errors for configs replay cannot run. */
#include "model/arch.h"
#include "model/config.h"
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
                 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "yarn");
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
    const char *names[] = {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "llama3.2-1b", "llama3-8b",
                           "tiny-qwen3", "tiny-llama3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        rp_model_config c;
        rp_err err;
        if (rp_config_preset(&c, names[i], &err)) fail_msg("%s: %s", names[i], err.msg);
        assert_int_equal(rp_config_validate(&c, &err), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_qwen3_and_generation_config),
        cmocka_unit_test(test_rope_parameters_spelling),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_presets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
