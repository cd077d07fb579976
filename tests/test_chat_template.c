/* The chat template as chat and serve use it (src/tokenizer/chat_template.c):
 * every conversation in tests/fixtures/tokenizer/chat.json (rendered by
 * transformers' apply_chat_template with add_generation_prompt and, for
 * Qwen3, enable_thinking unset/true/false) renders byte for byte through
 * rp_chat_render with the real templates; the ids that end a turn come from
 * the model's files; --chat-template FILE; a template that does not compile
 * fails the load naming its line; raise_exception is told apart; the
 * "tool_use" template serves requests with tools; a model without a
 * template loads, and its renders fail naming --chat-template. */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "template/template.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

static void real_dir(char *dir, size_t size, const char *name) {
    snprintf(dir, size, "%s/.cache/tokenizers/%s", test_source_dir(), name);
}

/* A real tokenizer with its own chat template; model_dir (may be NULL) for
 * generation_config.json / config.json. */
static rp_tokenizer *load_real(const char *name, const char *model_dir) {
    char dir[4096];
    real_dir(dir, sizeof dir, name);
    rp_err err = {0};
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    if (rp_tokenizer_load_chat_template(t, dir, model_dir, NULL, &err)) fail_msg("%s", err.msg);
    return t;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *render(const rp_tokenizer *t, const char *messages_json, const char *tools_json, int agp,
                    const char *kwargs_json, int *rc, rp_err *err) {
    json_t *msgs = json_loads(messages_json, 0, NULL);
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    json_t *kw = kwargs_json ? json_loads(kwargs_json, 0, NULL) : NULL;
    assert_non_null(msgs);
    char *out = NULL;
    *rc = rp_chat_render(t, msgs, tools, agp, kw, &out, NULL, err);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kw);
    return out;
}

static void test_fixtures(void **state) {
    (void)state;
    rp_tokenizer *qwen3 = load_real("qwen3", NULL), *llama3 = load_real("llama3", NULL);
    assert_true(rp_chat_has_template(qwen3) && rp_chat_has_template(llama3));
    assert_non_null(strstr(rp_chat_template_origin(qwen3), "tokenizer_config.json"));
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
        json_t *et = json_object_get(c, "enable_thinking");
        json_t *kw = et && !json_is_null(et) ? json_pack("{s:O}", "enable_thinking", et) : NULL;
        int agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        json_t *want = json_object_get(c, "text");
        assert_true(json_is_string(want));
        char *out;
        size_t len;
        rp_err err;
        assert_int_equal(rp_chat_render(t, json_object_get(c, "messages"), NULL, agp, kw, &out, &len, &err), 0);
        assert_int_equal(len, strlen(out));
        if (strcmp(out, json_string_value(want)) != 0 && bad++ < 5)
            fprintf(stderr, "case %zu (%s, agp=%d) differs:\n--- replay\n%s\n--- transformers\n%s\n---\n", i, name,
                    agp, out, json_string_value(want));
        free(out);
        json_decref(kw);
    }
    fprintf(stderr, "%zu qwen3 + %zu llama3 chat cases, %zu mismatches\n", n_qwen, n_llama, bad);
    assert_true(n_qwen > 50 && n_llama > 20);
    assert_int_equal(bad, 0);
    json_decref(root);
    rp_tokenizer_free(qwen3);
    rp_tokenizer_free(llama3);
}

static int has_id(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* The ids that end a turn, from data: the tokenizer's eos, the token the
 * template writes after an assistant message, generation_config.json's
 * eos_token_id (an id or a list), else config.json's. */
static void test_stop_ids(void **state) {
    (void)state;
    int32_t ids[8];
    /* the tokenizer alone: Qwen3's eos is <|im_end|>, which its template also ends a turn with */
    rp_tokenizer *t = load_real("qwen3", NULL);
    const int32_t im_end = rp_tokenizer_token_id(t, "<|im_end|>"), endoftext = rp_tokenizer_token_id(t, "<|endoftext|>");
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 1);
    assert_int_equal(ids[0], im_end);
    rp_tokenizer_free(t);
    /* Llama 3's tokenizer_config says <|end_of_text|>; its template ends a turn with <|eot_id|> */
    t = load_real("llama3", NULL);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 2);
    assert_true(has_id(ids, 2, rp_tokenizer_token_id(t, "<|end_of_text|>")));
    assert_true(has_id(ids, 2, rp_tokenizer_token_id(t, "<|eot_id|>")));
    rp_tokenizer_free(t);
    /* Llama 3.1's and DeepSeek-V3's eos is what their templates end a turn with */
    t = load_real("llama3_1", NULL);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 1);
    assert_int_equal(ids[0], rp_tokenizer_token_id(t, "<|eot_id|>"));
    rp_tokenizer_free(t);
    t = load_real("deepseek_v3", NULL);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 1);
    assert_int_equal(ids[0], rp_tokenizer_eos_id(t));
    rp_tokenizer_free(t);
    /* a model directory: generation_config.json's list (Qwen3's own), an int, config.json's as the fallback */
    char dir[] = "/tmp/rp_chat_stop_XXXXXX", path[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_file(path, "{\"eos_token_id\": [151645, 151643], \"temperature\": 0.6}");
    t = load_real("qwen3", dir);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 2);
    assert_true(has_id(ids, 2, im_end) && has_id(ids, 2, endoftext));
    rp_tokenizer_free(t);
    write_file(path, "{\"eos_token_id\": 151643}");
    t = load_real("qwen3", dir);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 2);
    rp_tokenizer_free(t);
    unlink(path);
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_file(cfg, "{\"eos_token_id\": 151643}");
    t = load_real("qwen3", dir);
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 2);
    rp_tokenizer_free(t);
    /* an id the tokenizer does not have is an error at load, naming the file */
    write_file(path, "{\"eos_token_id\": [1, 99999999]}");
    char tdir[4096];
    real_dir(tdir, sizeof tdir, "qwen3");
    rp_err err;
    t = rp_tokenizer_load(tdir, &err);
    assert_non_null(t);
    assert_int_not_equal(rp_tokenizer_load_chat_template(t, tdir, dir, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "generation_config.json"));
    rp_tokenizer_free(t);
    unlink(path);
    unlink(cfg);
    rmdir(dir);
}

/* --chat-template FILE; a template outside the subset fails the load with
 * its line; raise_exception comes back as RP_TEMPLATE_RAISED. */
static void test_template_file(void **state) {
    (void)state;
    char dir[] = "/tmp/rp_chat_file_XXXXXX", path[4096], tdir[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t.jinja", dir);
    write_file(path, "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                     "{% if messages | length > 2 %}{{ raise_exception('at most two, please') }}{% endif %}"
                     "{% if tools %}<{{ tools | length }} tools>{% endif %}{{ extra }}");
    real_dir(tdir, sizeof tdir, "qwen3");
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load(tdir, &err);
    assert_non_null(t);
    assert_int_equal(rp_tokenizer_load_chat_template(t, tdir, NULL, path, &err), 0);
    assert_string_equal(rp_chat_template_origin(t), path);
    int rc;
    char *out = render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", "[{\"type\":\"function\"}]", 1,
                       "{\"extra\": \"!\"}", &rc, &err);
    assert_int_equal(rc, RP_OK);
    assert_string_equal(out, "[user:hi]<1 tools>!");
    free(out);
    out = render(t, "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"user\","
                    "\"content\":\"c\"}]",
                 NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, RP_TEMPLATE_RAISED);
    assert_null(out);
    assert_string_equal(err.msg, "at most two, please");
    /* an error of the template's own making names its line */
    out = render(t, "[{\"role\":\"user\"}]", NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, RP_OK); /* an undefined attribute prints as nothing, as jinja2 */
    free(out);
    /* unsupported constructs fail the load, with the line */
    write_file(path, "hello\n{% include 'other.jinja' %}");
    assert_int_not_equal(rp_tokenizer_load_chat_template(t, tdir, NULL, path, &err), 0);
    assert_non_null(strstr(err.msg, "line 2"));
    assert_non_null(strstr(err.msg, "include"));
    assert_non_null(strstr(err.msg, path));
    /* the template loaded before stays */
    snprintf(path, sizeof path, "%s/t.jinja", dir);
    assert_string_equal(rp_chat_template_origin(t), path);
    snprintf(path, sizeof path, "%s/missing.jinja", dir);
    assert_int_not_equal(rp_tokenizer_load_chat_template(t, tdir, NULL, path, &err), 0);
    assert_non_null(strstr(err.msg, "missing.jinja"));
    rp_tokenizer_free(t);
    snprintf(path, sizeof path, "%s/t.jinja", dir);
    unlink(path);
    rmdir(dir);
}

/* tokenizer_config.json's named templates: "tool_use" renders requests with
 * tools, "default" the others; chat_template.jinja wins over the config. */
static void test_named_templates(void **state) {
    (void)state;
    char dir[] = "/tmp/rp_chat_named_XXXXXX", path[4096], src[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(src, sizeof src, "%s/.cache/tokenizers/qwen3/tokenizer.json", test_source_dir());
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(symlink(src, path), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"eos_token\": \"<|im_end|>\", \"chat_template\": [{\"name\": \"default\", \"template\": "
                     "\"plain{{ eos_token }}\"}, {\"name\": \"tool_use\", \"template\": \"tools={{ tools | length "
                     "}}\"}]}");
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    assert_non_null(t);
    assert_int_equal(rp_tokenizer_load_chat_template(t, dir, NULL, NULL, &err), 0);
    int rc;
    char *out = render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 1, NULL, &rc, &err);
    assert_string_equal(out, "plain<|im_end|>");
    free(out);
    out = render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", "[{}, {}]", 1, NULL, &rc, &err);
    assert_string_equal(out, "tools=2");
    free(out);
    char jinja[4096];
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
    write_file(jinja, "from the .jinja file");
    assert_int_equal(rp_tokenizer_load_chat_template(t, dir, NULL, NULL, &err), 0);
    out = render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 1, NULL, &rc, &err);
    assert_string_equal(out, "from the .jinja file");
    free(out);
    assert_non_null(strstr(rp_chat_template_origin(t), "chat_template.jinja"));
    rp_tokenizer_free(t);
    /* no template at all: the load is fine (completions need none), rendering is not */
    write_file(path, "{\"eos_token\": \"<|im_end|>\"}");
    unlink(jinja);
    t = rp_tokenizer_load(dir, &err);
    assert_non_null(t);
    assert_int_equal(rp_tokenizer_load_chat_template(t, dir, NULL, NULL, &err), 0);
    assert_false(rp_chat_has_template(t));
    assert_null(rp_chat_template_origin(t));
    out = render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, RP_ERR);
    assert_null(out);
    assert_non_null(strstr(err.msg, "--chat-template"));
    int32_t ids[8];
    assert_int_equal(rp_chat_stop_ids(t, ids, 8), 1); /* the eos alone */
    rp_tokenizer_free(t);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

static void test_render_edge_cases(void **state) {
    (void)state;
    rp_tokenizer *t = load_real("llama3", NULL);
    rp_err err;
    int rc;
    /* trim is Python's str.strip(): Unicode spaces too */
    char *out = render(t, "[{\"role\":\"user\",\"content\":\"\\u3000 hi \\u0085\\n\"}]", NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, 0);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    /* None content: jinja2's trim prints it as Python does */
    out = render(t, "[{\"role\":\"user\",\"content\":null}]", NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, RP_OK);
    assert_non_null(strstr(out, "\n\nNone<|eot_id|>"));
    free(out);
    /* a message that is not an object: a render error naming the line, not a crash */
    out = render(t, "[7]", NULL, 1, NULL, &rc, &err);
    assert_int_equal(rc, RP_ERR);
    assert_non_null(strstr(err.msg, "chat template line"));
    rp_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_stop_ids),
        cmocka_unit_test(test_template_file),
        cmocka_unit_test(test_named_templates),
        cmocka_unit_test(test_render_edge_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
