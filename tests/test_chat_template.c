/* Chat templates against transformers: every conversation in
 * tests/fixtures/tokenizer/chat.json (rendered by apply_chat_template with
 * add_generation_prompt and, for Qwen3, enable_thinking unset/true/false)
 * must render byte for byte; plus template detection and its errors. */
#include <jansson.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

static rp_tokenizer *load_real(const char *name) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/%s", test_source_dir(), name);
    rp_err err = {0};
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    return t;
}

static void test_fixtures(void **state) {
    (void)state;
    rp_tokenizer *qwen3 = load_real("qwen3"), *llama3 = load_real("llama3");
    assert_int_equal(rp_tokenizer_chat_template(qwen3), RP_CHAT_TEMPLATE_QWEN3);
    assert_int_equal(rp_tokenizer_chat_template(llama3), RP_CHAT_TEMPLATE_LLAMA3);
    char path[4096];
    test_path(path, sizeof path, "tests/fixtures/tokenizer/chat.json");
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) fail_msg("%s: %s", path, je.text);
    json_t *cases = json_object_get(root, "cases"), *c;
    size_t i, bad = 0, n_qwen = 0, n_llama = 0;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "tokenizer"));
        rp_tokenizer *t = strcmp(name, "qwen3") == 0 ? qwen3 : llama3;
        *(t == qwen3 ? &n_qwen : &n_llama) += 1;
        json_t *msgs = json_object_get(c, "messages");
        int n = (int)json_array_size(msgs);
        rp_chat_message m[32];
        assert_true(n <= 32);
        for (int k = 0; k < n; k++) {
            json_t *jm = json_array_get(msgs, (size_t)k);
            m[k].role = json_string_value(json_object_get(jm, "role"));
            m[k].content = json_string_value(json_object_get(jm, "content"));
        }
        json_t *et = json_object_get(c, "enable_thinking");
        int thinking = json_is_true(et) ? 1 : json_is_false(et) ? 0 : -1;
        int agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        json_t *want = json_object_get(c, "text");
        assert_true(json_is_string(want));
        char *out;
        rp_err err;
        assert_int_equal(rp_chat_render(t, m, n, agp, thinking, &out, &err), 0);
        if (strcmp(out, json_string_value(want)) != 0 && bad++ < 5)
            fprintf(stderr, "case %zu (%s, agp=%d, thinking=%d) differs:\n--- replay\n%s\n--- transformers\n%s\n---\n",
                    i, name, agp, thinking, out, json_string_value(want));
        free(out);
    }
    fprintf(stderr, "%zu qwen3 + %zu llama3 chat cases, %zu mismatches\n", n_qwen, n_llama, bad);
    assert_true(n_qwen > 50 && n_llama > 20);
    assert_int_equal(bad, 0);
    json_decref(root);
    rp_tokenizer_free(qwen3);
    rp_tokenizer_free(llama3);
}

/* A template replay does not know: a clear error naming --chat-template,
 * and forcing one by name works. */
static void test_unknown_template(void **state) {
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/.cache/tokenizers/qwen3/tokenizer.json", test_source_dir());
    size_t len;
    char *json = test_read_file(path, &len);
    const char *cfgs[] = {
        "{\"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}\", \"eos_token\": \"<|im_end|>\"}",
        "{\"eos_token\": \"<|im_end|>\"}",
        "{\"chat_template\": \"{{ bos_token }}<|start_header_id|>\"}",
    };
    const char *hints[] = {"ChatML/Qwen-like", "no chat_template", "Llama-3-like"};
    for (int i = 0; i < 3; i++) {
        rp_err err;
        rp_tokenizer *t = rp_tokenizer_load_json(json, len, cfgs[i], strlen(cfgs[i]), &err);
        if (!t) fail_msg("%s", err.msg);
        assert_int_equal(rp_tokenizer_chat_template(t), RP_CHAT_TEMPLATE_UNKNOWN);
        rp_chat_message m[] = {{"user", "Hi"}};
        char *out = NULL;
        assert_int_not_equal(rp_chat_render(t, m, 1, 1, -1, &out, &err), 0);
        assert_null(out);
        assert_non_null(strstr(err.msg, "--chat-template"));
        assert_non_null(strstr(err.msg, hints[i]));
        rp_chat_template_kind k;
        assert_int_equal(rp_chat_template_from_name("qwen3", &k, &err), 0);
        rp_tokenizer_set_chat_template(t, k);
        assert_int_equal(rp_chat_render(t, m, 1, 1, 0, &out, &err), 0);
        assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        free(out);
        rp_tokenizer_free(t);
    }
    rp_chat_template_kind k;
    rp_err err;
    assert_int_not_equal(rp_chat_template_from_name("jinja", &k, &err), 0);
    assert_non_null(strstr(err.msg, "qwen3"));
    assert_string_equal(rp_chat_template_name(RP_CHAT_TEMPLATE_LLAMA3), "llama3");
    free(json);
}

static void test_render_edge_cases(void **state) {
    (void)state;
    rp_tokenizer *t = load_real("llama3");
    rp_err err;
    char *out;
    /* trim is Python's str.strip(): Unicode spaces too */
    rp_chat_message m[] = {{"user", "\xe3\x80\x80 hi \xc2\x85\n"}};
    assert_int_equal(rp_chat_render(t, m, 1, 1, -1, &out, &err), 0);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    rp_chat_message bad[] = {{"user", NULL}};
    assert_int_not_equal(rp_chat_render(t, bad, 1, 1, -1, &out, &err), 0);
    rp_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_unknown_template),
        cmocka_unit_test(test_render_edge_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
