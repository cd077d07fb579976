/* The OpenAI request parser on valid requests, and fuzzed: random byte
 * flips, truncations and splices of valid bodies must give either a parsed
 * request or an error with a 4xx status and a message, never a crash (this
 * runs under ASan/UBSan in `make test`). */
#include "server/openai.h"
#include "tokenizer/tokenizer.h"
#include "util/rng.h"
#include "test_util.h"

static const char *bodies[] = {
    "{\"model\":\"m\",\"prompt\":\"Hello\",\"max_tokens\":5,\"temperature\":0.7,\"top_p\":0.9,\"stop\":[\"\\n\",\"END\"]}",
    "{\"prompt\":[1,2,3],\"n\":2,\"seed\":7,\"echo\":true,\"logprobs\":0,\"stream\":true,"
    "\"stream_options\":{\"include_usage\":true}}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"hi\"}]},{\"role\":\"assistant\",\"content\":\"yo\"},{\"role\":\"user\",\"content\":\"more\"}],"
    "\"max_completion_tokens\":9,\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
    "\"repetition_penalty\":1.1,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
};

static rp_tokenizer *load_tok(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/qwen3", test_source_dir());
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    return t;
}

static void test_valid(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096};
    rp_oai_request q;
    rp_oai_error e;
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, bodies[0], strlen(bodies[0]), &q, &e), 0);
    assert_string_equal(q.prompt_text, "Hello");
    assert_int_equal(q.params.max_tokens, 5);
    assert_int_equal(q.params.num_stop, 2);
    assert_true(q.params.temperature > 0.69f && q.params.temperature < 0.71f);
    rp_oai_request_free(&q);
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, bodies[1], strlen(bodies[1]), &q, &e), 0);
    assert_int_equal(q.num_prompt_ids, 3);
    assert_int_equal(q.n, 2);
    assert_true(q.stream && q.include_usage && q.echo);
    assert_int_equal(q.params.max_tokens, 16); /* OpenAI's default for completions */
    rp_oai_request_free(&q);
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, bodies[2], strlen(bodies[2]), &q, &e), 0);
    assert_non_null(strstr(q.prompt_text, "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"));
    assert_non_null(strstr(q.prompt_text, "<think>\n\n</think>")); /* enable_thinking=false */
    assert_int_equal(q.params.max_tokens, 9);
    assert_int_equal(q.params.top_k, 40);
    assert_true(q.params.num_stop_ids >= 1);
    rp_oai_request_free(&q);
    /* the error body is OpenAI's shape */
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, "{\"prompt\":1}", 12, &q, &e), -1);
    assert_int_equal(e.status, 400);
    char *j = rp_oai_error_json(&e);
    assert_non_null(strstr(j, "\"error\":{\"message\":"));
    assert_non_null(strstr(j, "\"param\":\"prompt\""));
    free(j);
    rp_tokenizer_free(tok);
}

static void test_fuzz(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096};
    char buf[2048];
    int ok = 0, rejected = 0;
    for (uint64_t it = 0; it < 30000; it++) {
        const char *src = bodies[it % 3];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        int flips = (int)(rp_rand_u64(9, it, 0) % 4);
        for (int f = 0; f < flips; f++)
            buf[rp_rand_u64(9, it, 1 + (uint64_t)f) % n] = (char)(rp_rand_u64(9, it, 10 + (uint64_t)f) & 0xff);
        if (rp_rand_u64(9, it, 20) % 3 == 0) n = rp_rand_u64(9, it, 21) % n; /* truncate */
        if (rp_rand_u64(9, it, 22) % 5 == 0) { /* splice another body's tail */
            const char *o = bodies[(it + 1) % 3];
            size_t at = rp_rand_u64(9, it, 23) % (n + 1), ol = strlen(o), from = rp_rand_u64(9, it, 24) % ol;
            if (at + (ol - from) < sizeof buf) {
                memcpy(buf + at, o + from, ol - from);
                n = at + (ol - from);
            }
        }
        char *heap = malloc(n ? n : 1); /* exact size: ASan sees any over-read */
        memcpy(heap, buf, n);
        rp_oai_request q;
        rp_oai_error e;
        rp_oai_kind kind = it % 2 ? RP_OAI_CHAT : RP_OAI_COMPLETION;
        if (rp_oai_parse(&ctx, kind, heap, n, &q, &e) == 0) {
            ok++;
            rp_oai_request_free(&q);
        } else {
            rejected++;
            assert_true(e.status == 400 || e.status == 404);
            assert_true(e.message[0] != 0);
        }
        free(heap);
    }
    assert_true(ok > 100 && rejected > 100);
    rp_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
