/* The OpenAI request parsers on valid requests, and fuzzed: random byte
 * flips, truncations and splices of valid bodies, and valid bodies whose
 * fields hold values of random types, must give either a parsed request or
 * an error with a 4xx status and a message, never a crash (this runs under
 * ASan/UBSan in `make test`, a few seconds). Then the engine's errors as a
 * client sees them, and the response builders with jansson's allocations
 * failing one after another: whole events or a failure, never an answer
 * with a part missing. */
#include "server/openai.h"
#include "server/json_ids.h"
#include "server/chat_choice.h"
#include "server/openai_json.h"
#include "tokenizer/tokenizer.h"
#include "util/rng.h"
#include "test_util.h"

#include <math.h>

static const char *bodies[] = {
    "{\"model\":\"m\",\"prompt\":\"Hello\",\"max_tokens\":5,\"temperature\":0.7,\"top_p\":0.9,\"stop\":[\"\\n\",\"END\"]}",
    "{\"prompt\":[1,2,3],\"n\":2,\"seed\":7,\"echo\":true,\"stream\":true,"
    "\"stream_options\":{\"include_usage\":true}}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
    "\"text\":\"hi\"}]},{\"role\":\"assistant\",\"content\":\"yo\"},{\"role\":\"user\",\"content\":\"more\"}],"
    "\"max_completion_tokens\":9,\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
    "\"repetition_penalty\":1.1,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
    "{\"prompt\":[\"a\",[7,8,9],\"\\u00e9t\\u00e9\"],\"logprobs\":0,\"stop_token_ids\":[2],\"stop\":\"x\","
    "\"max_tokens\":null,\"seed\":-5,\"user\":\"u\",\"stream\":false}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":null,"
    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":"
    "\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"-3\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\",\"parameters\":"
    "{\"type\":\"object\"}}}],\"tool_choice\":\"auto\",\"parallel_tool_calls\":false}",
};
#define NBODIES (sizeof bodies / sizeof bodies[0])

static rp_tokenizer *load_tok(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/.cache/tokenizers/qwen3", test_source_dir());
    rp_err err;
    rp_tokenizer *t = rp_tokenizer_load(dir, &err);
    if (!t) fail_msg("%s (run scripts/fetch-tokenizers.sh)", err.msg);
    if (rp_tokenizer_load_chat_template(t, dir, NULL, NULL, &err)) fail_msg("%s", err.msg);
    return t;
}

static void test_valid(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096, .vocab_size = 151936};
    rp_oai_request q;
    rp_oai_error e;
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, bodies[0], strlen(bodies[0]), &q, &e), 0);
    assert_int_equal(q.num_prompts, 1);
    assert_string_equal(q.prompt_texts[0], "Hello");
    assert_int_equal(q.params.max_tokens, 5);
    assert_int_equal(q.params.num_stop, 2);
    assert_true(q.params.temperature > 0.69f && q.params.temperature < 0.71f);
    rp_oai_request_free(&q);
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, bodies[1], strlen(bodies[1]), &q, &e), 0);
    assert_int_equal(q.num_prompts, 1);
    assert_null(q.prompt_texts[0]);
    assert_int_equal(q.num_prompt_ids[0], 3);
    assert_int_equal(q.n, 2);
    assert_true(q.stream && q.include_usage && q.echo);
    assert_int_equal(q.params.max_tokens, 16); /* OpenAI's default for completions */
    rp_oai_request_free(&q);
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, bodies[2], strlen(bodies[2]), &q, &e), 0);
    assert_non_null(strstr(q.prompt_texts[0], "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"));
    assert_non_null(strstr(q.prompt_texts[0], "<think>\n\n</think>")); /* enable_thinking=false */
    assert_int_equal(q.params.max_tokens, 9);
    assert_int_equal(q.params.top_k, 40);
    assert_true(q.params.num_stop_ids >= 1);
    rp_oai_request_free(&q);
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, bodies[3], strlen(bodies[3]), &q, &e), 0);
    assert_int_equal(q.num_prompts, 3);
    assert_int_equal(q.logprobs, 1);
    assert_int_equal(q.params.num_stop_ids, 1);
    rp_oai_request_free(&q);
    /* OpenAI's four prompt forms; n over prompts is bounded */
    const char *multi = "{\"prompt\":[\"a\",[5,6],\"b\"],\"n\":2}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, multi, strlen(multi), &q, &e), 0);
    assert_int_equal(q.num_prompts, 3);
    assert_string_equal(q.prompt_texts[2], "b");
    assert_int_equal(q.num_prompt_ids[1], 2);
    assert_int_equal(q.prompt_ids[1][1], 6);
    rp_oai_request_free(&q);
    const char *too_many = "{\"prompt\":[[1],[2],[3]],\"n\":100}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, too_many, strlen(too_many), &q, &e), -1);
    assert_string_equal(e.param, "n");
    /* logprobs = N (completions) and top_logprobs (chat, with logprobs: true), 0..20 */
    const char *lp5 = "{\"prompt\":\"x\",\"logprobs\":5}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, lp5, strlen(lp5), &q, &e), 0);
    assert_int_equal(q.logprobs, 1);
    assert_int_equal(q.params.top_logprobs, 5);
    rp_oai_request_free(&q);
    const char *tlp = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, tlp, strlen(tlp), &q, &e), 0);
    assert_int_equal(q.logprobs, 1);
    assert_int_equal(q.params.top_logprobs, 20);
    rp_oai_request_free(&q);
    const char *tlp0 = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":0}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, tlp0, strlen(tlp0), &q, &e), 0);
    assert_int_equal(q.logprobs, 0);
    assert_int_equal(q.params.top_logprobs, 0);
    rp_oai_request_free(&q);
    const struct {
        rp_oai_kind kind;
        const char *body, *param;
    } bad_lps[] = {
        {RP_OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs"},
        {RP_OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":-1}", "logprobs"},
        {RP_OAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs"},
        {RP_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs"},
        {RP_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
         "top_logprobs"},
        {RP_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":-1}",
         "top_logprobs"},
        {RP_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":\"3\"}",
         "top_logprobs"},
        {RP_OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs"},
    };
    for (size_t i = 0; i < sizeof bad_lps / sizeof bad_lps[0]; i++) {
        assert_int_equal(rp_oai_parse(&ctx, bad_lps[i].kind, bad_lps[i].body, strlen(bad_lps[i].body), &q, &e), -1);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, bad_lps[i].param);
    }
    const char *model = "{\"model\":\"other\",\"prompt\":\"x\"}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, model, strlen(model), &q, &e), -1);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "model_not_found");
    /* /tokenize and /detokenize bodies */
    rp_oai_tokenize t;
    const char *tk = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"return_token_strs\":true}";
    assert_int_equal(rp_oai_parse_tokenize(&ctx, tk, strlen(tk), &t, &e), 0);
    assert_non_null(strstr(t.text, "<|im_start|>user\nhi<|im_end|>"));
    assert_int_equal(t.add_bos, 0);
    assert_int_equal(t.return_token_strs, 1);
    rp_oai_tokenize_free(&t);
    assert_int_equal(rp_oai_parse_tokenize(&ctx, "{\"prompt\":3}", 12, &t, &e), -1);
    int32_t *ids;
    int nids;
    assert_int_equal(rp_oai_parse_detokenize(&ctx, "{\"tokens\":[1,2]}", 16, &ids, &nids, &e), 0);
    assert_int_equal(nids, 2);
    free(ids);
    assert_int_equal(rp_oai_parse_detokenize(&ctx, "{\"tokens\":[-1]}", 15, &ids, &nids, &e), -1);
    /* bytes that are not UTF-8 become U+FFFD, valid characters stay */
    json_t *j = rp_oai_json_text("a\xc3\xa9\xff\xe2\x82", 6);
    assert_non_null(j);
    assert_string_equal(json_string_value(j), "a\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(j);
    /* the error body is OpenAI's shape */
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, "{\"prompt\":1}", 12, &q, &e), -1);
    assert_int_equal(e.status, 400);
    char *ej = rp_oai_error_json(&e);
    assert_non_null(strstr(ej, "\"error\":{\"message\":"));
    assert_non_null(strstr(ej, "\"param\":\"prompt\""));
    free(ej);
    rp_tokenizer_free(tok);
}

static void test_fuzz(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096, .vocab_size = 151936};
    char buf[2048];
    int ok = 0, rejected = 0;
    for (uint64_t it = 0; it < 30000; it++) {
        const char *src = bodies[it % NBODIES];
        size_t n = strlen(src);
        memcpy(buf, src, n);
        int flips = (int)(rp_rand_u64(9, it, 0) % 4);
        for (int f = 0; f < flips; f++)
            buf[rp_rand_u64(9, it, 1 + (uint64_t)f) % n] = (char)(rp_rand_u64(9, it, 10 + (uint64_t)f) & 0xff);
        if (rp_rand_u64(9, it, 20) % 3 == 0) n = rp_rand_u64(9, it, 21) % n; /* truncate */
        if (rp_rand_u64(9, it, 22) % 5 == 0) { /* splice another body's tail */
            const char *o = bodies[(it + 1) % NBODIES];
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
        if (it % 7 == 0) { /* the /tokenize and /detokenize parsers on the same bodies */
            rp_oai_tokenize t;
            if (rp_oai_parse_tokenize(&ctx, heap, n, &t, &e) == 0) rp_oai_tokenize_free(&t);
            int32_t *ids;
            int nids;
            if (rp_oai_parse_detokenize(&ctx, heap, n, &ids, &nids, &e) == 0) free(ids);
            json_decref(rp_oai_json_text(heap, n));
        }
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

/* A random JSON value of any type, nested a little. */
static json_t *random_value(uint64_t it, uint64_t k, int depth) {
    uint64_t r = rp_rand_u64(17, it, k);
    switch (r % (depth > 2 ? 8 : 10)) {
    case 0: return json_null();
    case 1: return json_boolean(r & 16);
    case 2: return json_integer((json_int_t)(r >> 8) % 2000 - 1000);
    case 3: return json_integer((json_int_t)(r >> 1)); /* huge */
    case 4: return json_real((double)(int64_t)(r >> 20) / 1e3 - 1e6);
    case 5: return json_string("");
    case 6: return json_string((r & 32) ? "user" : "text");
    case 7: return json_integer(-1);
    case 8: {
        json_t *a = json_array();
        for (uint64_t i = 0; i < r % 4; i++) json_array_append_new(a, random_value(it, k * 31 + i + 1, depth + 1));
        return a;
    }
    default: {
        static const char *keys[] = {"role",     "content", "type",         "text",       "include_usage",
                                     "enable_thinking", "function", "name", "tool_calls", "id",
                                     "arguments", "tool_call_id", "parameters"};
        json_t *o = json_object();
        for (uint64_t i = 0; i < r % 4; i++)
            json_object_set_new(o, keys[(r >> (8 + i * 4)) % (sizeof keys / sizeof *keys)],
                                random_value(it, k * 37 + i + 1, depth + 1));
        return o;
    }
    }
}

/* Every known field set to values of random types: the type and range
 * checks, not only the JSON syntax, see bad input. */
static void test_fuzz_fields(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096, .vocab_size = 151936};
    static const char *fields[] = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                                   "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
                                   "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
                                   "top_logprobs", "stream", "stream_options", "ignore_eos", "echo",
                                   "chat_template_kwargs", "add_generation_prompt", "tokens", "add_special_tokens",
                                   "return_token_strs", "tools", "tool_choice", "parallel_tool_calls"};
    int ok = 0;
    for (uint64_t it = 0; it < 20000; it++) {
        json_t *root = json_loads(bodies[it % NBODIES], 0, NULL);
        assert_non_null(root);
        int nf = 1 + (int)(rp_rand_u64(18, it, 0) % 3);
        for (int f = 0; f < nf; f++)
            json_object_set_new(root, fields[rp_rand_u64(18, it, 1 + (uint64_t)f) % (sizeof fields / sizeof *fields)],
                                random_value(it, 100 + (uint64_t)f, 0));
        char *body = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        rp_oai_request q;
        rp_oai_error e;
        if (rp_oai_parse(&ctx, it % 2 ? RP_OAI_CHAT : RP_OAI_COMPLETION, body, strlen(body), &q, &e) == 0) {
            ok++;
            assert_true(q.num_prompts >= 1 && q.n >= 1 && q.num_prompts * q.n <= RP_OAI_MAX_CHOICES);
            rp_oai_request_free(&q);
        } else {
            assert_true(e.status == 400 || e.status == 404);
            assert_true(e.message[0] != 0);
        }
        rp_oai_tokenize t;
        if (rp_oai_parse_tokenize(&ctx, body, strlen(body), &t, &e) == 0) rp_oai_tokenize_free(&t);
        int32_t *ids;
        int nids;
        if (rp_oai_parse_detokenize(&ctx, body, strlen(body), &ids, &nids, &e) == 0) free(ids);
        free(body);
    }
    assert_true(ok > 100);
    rp_tokenizer_free(tok);
}

/* ---- engine errors as the client sees them -------------------------------------- */

/* rp_oai_engine_error on one engine error; the message passes through. */
static rp_oai_error engine_error(rp_error_code code, const char *param, rp_oai_kind kind, int max_completion_tokens) {
    rp_error err = {.code = code};
    snprintf(err.param, sizeof err.param, "%s", param);
    snprintf(err.message, sizeof err.message, "engine says %s", rp_error_code_name(code));
    rp_oai_request q = {.kind = kind, .max_completion_tokens = max_completion_tokens};
    rp_oai_error e;
    rp_oai_engine_error(&e, &err, &q);
    assert_string_equal(e.message, err.message);
    return e;
}

static void expect_mapped(rp_oai_error e, int status, const char *type, const char *param, const char *code) {
    assert_int_equal(e.status, status);
    assert_string_equal(e.type, type);
    assert_string_equal(e.param, param);
    assert_string_equal(e.code, code);
}

static void test_engine_errors(void **state) {
    (void)state;
    static const char *sampling[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                     "presence_penalty", "frequency_penalty", "top_logprobs", "seed", "stop",
                                     "stop_token_ids"};
    for (size_t i = 0; i < sizeof sampling / sizeof sampling[0]; i++)
        for (int kind = RP_OAI_COMPLETION; kind <= RP_OAI_CHAT; kind++)
            expect_mapped(engine_error(RP_ERROR_INVALID_REQUEST, sampling[i], (rp_oai_kind)kind, 1), 400,
                          "invalid_request_error", sampling[i], "");
    enum { CMPL = RP_OAI_COMPLETION, CHAT = RP_OAI_CHAT };
    static const char *inv = "invalid_request_error", *ctx_code = "context_length_exceeded";
    const struct {
        rp_error_code code;
        const char *param;
        int kind, max_completion_tokens;
        int status;
        const char *type, *want_param, *want_code;
    } cases[] = {
        {RP_ERROR_INVALID_REQUEST, "prompt", CMPL, 0, 400, inv, "prompt", ""},
        {RP_ERROR_INVALID_REQUEST, "prompt", CHAT, 0, 400, inv, "messages", ""}, /* what a chat client sent */
        {RP_ERROR_INVALID_REQUEST, "", CMPL, 0, 400, inv, "", ""},
        {RP_ERROR_INVALID_REQUEST, "max_tokens", CHAT, 1, 400, inv, "max_completion_tokens", ""},
        {RP_ERROR_UNSUPPORTED, "stop", CMPL, 0, 400, inv, "stop", ""},
        {RP_ERROR_UNSUPPORTED, "prompt", CHAT, 0, 400, inv, "messages", ""},
        /* the context: OpenAI's code, the field the client sent */
        {RP_ERROR_CONTEXT_LENGTH, "prompt", CMPL, 0, 400, inv, "prompt", ctx_code},
        {RP_ERROR_CONTEXT_LENGTH, "prompt", CHAT, 0, 400, inv, "messages", ctx_code},
        {RP_ERROR_CONTEXT_LENGTH, "max_tokens", CMPL, 0, 400, inv, "max_tokens", ctx_code},
        {RP_ERROR_CONTEXT_LENGTH, "max_tokens", CHAT, 0, 400, inv, "max_tokens", ctx_code},
        {RP_ERROR_CONTEXT_LENGTH, "max_tokens", CHAT, 1, 400, inv, "max_completion_tokens", ctx_code},
        /* the server's side: no parameter to blame */
        {RP_ERROR_OUT_OF_MEMORY, "", CHAT, 0, 503, "service_unavailable", "", ""},
        {RP_ERROR_INTERNAL, "", CMPL, 0, 500, "server_error", "", ""},
        {RP_ERROR_INTERNAL, "prompt", CMPL, 0, 500, "server_error", "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_mapped(engine_error(cases[i].code, cases[i].param, (rp_oai_kind)cases[i].kind,
                                   cases[i].max_completion_tokens),
                      cases[i].status, cases[i].type, cases[i].want_param, cases[i].want_code);
    /* the parser records which name the limit came under */
    rp_oai_context ctx = {.served_model = "m", .max_context = 4096, .vocab_size = 151936};
    rp_oai_request q;
    rp_oai_error e;
    const char *body = "{\"prompt\":[1],\"max_completion_tokens\":7}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_true(q.max_completion_tokens && q.max_tokens_set);
    assert_int_equal(q.params.max_tokens, 7);
    rp_oai_request_free(&q);
    body = "{\"prompt\":[1],\"max_tokens\":7}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_true(!q.max_completion_tokens && q.max_tokens_set);
    rp_oai_request_free(&q);
}

/* ---- jansson's allocations failing ------------------------------------------------ */

static long alloc_budget = -1; /* allocations that succeed before one fails; < 0: none fails */
static int alloc_failed;

/* Fails one allocation only, so that a caller that ignored the failure
 * would go on and produce an answer with a hole in it. */
static void *limited_malloc(size_t n) {
    if (alloc_budget == 0) {
        alloc_budget = -1;
        alloc_failed = 1;
        return NULL;
    }
    if (alloc_budget > 0) alloc_budget--;
    return malloc(n);
}

static void limit_allocations(long budget) {
    alloc_budget = budget;
    alloc_failed = 0;
}

/* A chat choice through the reasoning and tool-call parsers
 * (chat_choice.c), whole and streamed: each added to out as SSE events;
 * stops at the first failure. */
static int build_parsed(const rp_oai_response *r, const rp_token_event *ev, rp_sbuf *out) {
    static const char text[] = "<think>hm</think>Both.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1]}}\n"
                               "</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    const rp_chat_parsing p = {.tools = 1, .tool_parser = RP_TOOL_PARSER_HERMES, .reasoning = 1,
                               .reasoning_kind = RP_REASONING_QWEN3, .id_seed = 5};
    json_t *lp = rp_oai_logprobs_new(r);
    if (!lp || rp_oai_logprobs_add(r, lp, ev, 0)) {
        json_decref(lp);
        return -1;
    }
    if (rp_oai_sse_add(out, rp_chat_choice_json(&p, 0, text, sizeof text - 1, lp, RP_FINISH_REASON_STOP))) return -1;
    rp_chat_stream *st = rp_chat_stream_new(r, &p, 0);
    int rc = st ? 0 : -1;
    for (size_t at = 0; !rc && at < sizeof text - 1; at += 9) {
        size_t n = sizeof text - 1 - at < 9 ? sizeof text - 1 - at : 9;
        json_t *tlp = rp_oai_logprobs_new(r);
        rc = tlp ? rp_chat_stream_feed(st, text + at, n, tlp, out) : -1;
    }
    if (!rc) rc = rp_chat_stream_finish(st, RP_FINISH_REASON_STOP, out);
    rp_chat_stream_free(st);
    return rc;
}

/* Every response shape, each added to out as one SSE event (as the server
 * does); stops at the first failure. */
static int build_responses(const rp_tokenizer *tok, rp_sbuf *out) {
    rp_token_event ev = {.token = 9707, .logprob = -0.5f, .num_top_logprobs = 3, .text = "Hello", .text_len = 5,
                         .top_ids = {9707, 151643, 11}, .top_logprobs = {-0.5f, -1.0f, -INFINITY}};
    for (int kind = RP_OAI_COMPLETION; kind <= RP_OAI_CHAT; kind++) {
        rp_oai_response r = {.kind = (rp_oai_kind)kind, .id = "cmpl-1", .created = 7, .model = "m", .tok = tok,
                             .top_logprobs = 2};
        /* the non-streaming answer with logprobs of two tokens */
        json_t *lp = rp_oai_logprobs_new(&r);
        if (!lp || rp_oai_logprobs_add(&r, lp, &ev, 0) || rp_oai_logprobs_add(&r, lp, &ev, 5)) {
            json_decref(lp);
            return -1;
        }
        json_t *choices = json_array();
        if (json_array_append_new(choices, rp_oai_choice(&r, 0, "Hello\xff", 6, lp, RP_FINISH_REASON_STOP))) {
            json_decref(choices);
            return -1;
        }
        if (rp_oai_sse_add(out, rp_oai_completion(&r, choices, rp_oai_usage(3, 0, 2)))) return -1;
        /* the stream: role, a token with logprobs, the end, usage */
        if (kind == RP_OAI_CHAT && rp_oai_sse_add(out, rp_oai_role_chunk(&r, 0))) return -1;
        lp = rp_oai_logprobs_new(&r);
        if (!lp || rp_oai_logprobs_add(&r, lp, &ev, 0)) {
            json_decref(lp);
            return -1;
        }
        if (rp_oai_sse_add(out, rp_oai_chunk(&r, 0, "Hello", 5, RP_FINISH_REASON_NONE, lp)) ||
            rp_oai_sse_add(out, rp_oai_chunk(&r, 0, "", 0, RP_FINISH_REASON_LENGTH, NULL)) ||
            rp_oai_sse_add(out, rp_oai_usage_chunk(&r, rp_oai_usage(3, 0, 2))))
            return -1;
        /* prompt logprobs: an echo's (the prompt's tokens first) and vLLM's list */
        const rp_prompt_logprob plp[3] = {
            {.token = 9707, .logprob = NAN},
            {.token = 11, .logprob = -2.5f, .rank = 4, .num_top = 2, .top_ids = {9707, 151643}, .top_logprobs = {-0.5f, -1.0f}},
            {.token = 9707, .logprob = -0.25f, .rank = 1, .num_top = 2, .top_ids = {9707, 11}, .top_logprobs = {-0.25f, -3.0f}}};
        size_t offset = 0;
        lp = rp_oai_logprobs_new(&r);
        if (!lp || (kind == RP_OAI_COMPLETION && rp_oai_logprobs_add_prompt(&r, lp, plp, 3, &offset))) {
            json_decref(lp);
            return -1;
        }
        if (rp_oai_sse_add(out, rp_oai_chunk(&r, 0, "Hello,Hello", 11, RP_FINISH_REASON_NONE, lp)) ||
            rp_oai_sse_add(out, rp_oai_prompt_logprobs_json(&r, plp, 3, 2)))
            return -1;
    }
    int32_t ids[] = {9707, 11};
    rp_oai_error e;
    rp_oai_set_error(&e, 400, "invalid_request_error", "messages", "context_length_exceeded", "too long");
    return rp_oai_sse_add(out, rp_oai_tokenize_json(tok, 151643, ids, 2, 1, 4096)) ||
                   rp_oai_sse_add(out, rp_oai_models_json("m", 7, 4096, 151936)) ||
                   rp_oai_sse_add(out, rp_oai_error_object(&e))
               ? -1
               : 0;
}

static void test_out_of_memory(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    json_set_alloc_funcs(limited_malloc, free);
    static const char prefix[] = "data: {}\n\n";
    rp_sbuf want = {0};
    assert_int_equal(build_responses(tok, &want), 0);
    assert_non_null(strstr(want.p, "\"top_logprobs\":[{\"token\":\"Hello\""));
    assert_non_null(strstr(want.p, "\"token_logprobs\":[null,-2.5,-0.25]"));
    assert_non_null(strstr(want.p, "[null,{\"9707\":{\"logprob\":-0.5,\"rank\":1,\"decoded_token\":\"Hello\"}"));
    int whole = 0;
    for (long budget = 0; !whole; budget++) {
        rp_sbuf out = {0};
        assert_int_equal(rp_sbuf_add_str(&out, prefix), 0);
        size_t mark = out.len;
        limit_allocations(budget);
        int rc = build_responses(tok, &out);
        whole = !alloc_failed;
        limit_allocations(-1);
        if (whole) assert_int_equal(rc, 0);
        /* what was added is whole: the events before the failure, never part of one */
        assert_true(out.len >= mark && !memcmp(out.p, prefix, mark));
        if (out.len - mark > want.len || memcmp(out.p + mark, want.p, out.len - mark))
        {
            size_t d = 0;
            while (d < out.len - mark && d < want.len && out.p[mark + d] == want.p[d]) d++;
            fail_msg("allocation %ld failed and the answer differs at byte %zu:\n%.300s\nexpected:\n%.300s", budget, d,
                     out.p + mark + (d > 100 ? d - 100 : 0), want.p + (d > 100 ? d - 100 : 0));
        }
        assert_true(rc ? out.len == mark || !strcmp(out.p + out.len - 2, "\n\n") : out.len - mark == want.len);
        rp_sbuf_free(&out);
    }
    rp_sbuf_free(&want);
    /* The parsed chat choice: a failure or whole events. Not compared with
     * the answer as above: the tool parser reads calls with jansson, which
     * reports some allocation failures in its lexer as a syntax error, so
     * there a call comes back as content (its text, nothing lost). */
    rp_oai_response r = {.kind = RP_OAI_CHAT, .id = "c", .model = "m", .tok = tok, .top_logprobs = 1};
    rp_token_event ev = {.token = 9707, .logprob = -0.5f, .text = "Hello", .text_len = 5};
    rp_sbuf full = {0};
    assert_int_equal(build_parsed(&r, &ev, &full), 0);
    assert_non_null(strstr(full.p, "\"finish_reason\":\"tool_calls\""));
    whole = 0;
    for (long budget = 0; !whole; budget++) {
        rp_sbuf out = {0};
        limit_allocations(budget);
        int rc = build_parsed(&r, &ev, &out);
        whole = !alloc_failed;
        limit_allocations(-1);
        if (whole) assert_int_equal(rc, 0);
        for (const char *p = out.p; p && p < out.p + out.len;) { /* every event whole JSON */
            const char *nl = strstr(p, "\n\n");
            assert_non_null(nl);
            json_t *ev_json = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
            if (!ev_json) fail_msg("allocation %ld: a broken event %.*s", budget, (int)(nl - p), p);
            json_decref(ev_json);
            p = nl + 2;
        }
        rp_sbuf_free(&out);
    }
    rp_sbuf_free(&full);
    json_set_alloc_funcs(malloc, free);
    rp_tokenizer_free(tok);
}

/* Integral numbers are integers wherever one is expected (4.0 as OpenAI's
 * and vLLM's servers take it); 4.5 is refused, naming the field. */
static void test_integral_floats(void **state) {
    (void)state;
    rp_oai_context ctx = {.served_model = "m", .tok = NULL, .max_context = 4096, .vocab_size = 1000};
    rp_oai_request q;
    rp_oai_error e;
    static const char ok[] = "{\"prompt\":[1.0,2,3e0],\"max_tokens\":4.0,\"n\":2.0,\"seed\":7.0,\"top_k\":5.0,"
                             "\"logprobs\":1.0,\"stop_token_ids\":[9.0]}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, ok, strlen(ok), &q, &e), 0);
    assert_int_equal(q.params.max_tokens, 4);
    assert_int_equal(q.n, 2);
    assert_int_equal((int)q.params.seed, 7);
    assert_int_equal(q.params.top_k, 5);
    assert_int_equal(q.num_prompt_ids[0], 3);
    assert_int_equal(q.prompt_ids[0][2], 3);
    assert_int_equal(q.params.stop_ids[0], 9);
    rp_oai_request_free(&q);
    static const char *bad[][2] = {{"{\"prompt\":[1],\"max_tokens\":4.5}", "max_tokens"},
                                   {"{\"prompt\":[1],\"n\":1.5}", "n"},
                                   {"{\"prompt\":[1],\"seed\":0.5}", "seed"},
                                   {"{\"prompt\":[1, 2.5]}", "prompt"},
                                   {"{\"prompt\":[1],\"stop_token_ids\":[1.25]}", "stop_token_ids"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (!rp_oai_parse(&ctx, RP_OAI_COMPLETION, bad[i][0], strlen(bad[i][0]), &q, &e)) fail_msg("accepted %s", bad[i][0]);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, bad[i][1]);
    }
}

/* A completion's prompt of ids is read by json_ids.c, not jansson: every
 * body must give what jansson's reading of it gives. Bodies that lift, that
 * must not (other shapes, duplicate keys, escaped keys, a "prompt" inside a
 * string or a nested object), and random bodies with byte flips, against a
 * reference read with jansson alone. */
static int reference_ids(const char *body, size_t len, int32_t **ids, int *n) {
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *p = root ? json_object_get(root, "prompt") : NULL;
    int ok = json_is_array(p) && json_array_size(p) > 0;
    size_t i;
    json_t *v;
    *ids = ok ? malloc(json_array_size(p) * sizeof **ids) : NULL;
    json_array_foreach(p, i, v) {
        /* the server's rule: an integer, or a number with an integral value (1.0) */
        const double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
        if (!ok || d < 0 || d > 0x7fffffff || d != floor(d)) {
            ok = 0;
            break;
        }
        (*ids)[i] = (int32_t)d;
    }
    *n = ok ? (int)json_array_size(p) : 0;
    json_decref(root);
    return ok;
}

static void check_same(const rp_oai_context *ctx, const char *body, size_t len) {
    rp_oai_request q;
    rp_oai_error e;
    int32_t *ref;
    int n;
    const int ok = reference_ids(body, len, &ref, &n);
    const int rc = rp_oai_parse(ctx, RP_OAI_COMPLETION, body, len, &q, &e);
    if (ok && rc == 0) {
        if (q.num_prompts != 1 || q.num_prompt_ids[0] != n || memcmp(q.prompt_ids[0], ref, (size_t)n * 4))
            fail_msg("ids differ from jansson's for %.200s", body);
        rp_oai_request_free(&q);
    } else if (ok) {
        /* jansson reads the ids; the request may still be refused for another field, never for the prompt */
        if (e.param[0] && !strcmp(e.param, "prompt")) fail_msg("prompt refused (%s) in %.200s", e.message, body);
    } else if (rc == 0) {
        if (q.num_prompts == 1 && q.prompt_ids && q.prompt_ids[0]) fail_msg("ids accepted that jansson refuses: %.200s", body);
        rp_oai_request_free(&q);
    }
    free(ref);
}

static void test_prompt_ids_fast_path(void **state) {
    (void)state;
    rp_oai_context ctx = {.served_model = "m", .tok = NULL, .max_context = 1 << 20, .vocab_size = 1 << 30};
    static const char *lifts[] = {
        "{\"prompt\":[1,2,3]}",
        " {\n\"max_tokens\" : 3 ,\t\"prompt\" :\r\n[ 0 , 7 ,\n2147483647 ] , \"n\":1 } ",
        "{\"a\":{\"prompt\":\"x\"},\"b\":\"\\\"prompt\\\":[9]\",\"prompt\":[5,6],\"c\":[[1],{\"d\":[]}]}",
    };
    static const char *stays[] = {
        "{\"prompt\":[1.0,2]}",       "{\"prompt\":[[1,2],[3]]}",      "{\"prompt\":\"text\"}",
        "{\"prompt\":[1],\"prompt\":[2,3]}", "{\"pr\\u006fmpt\":[4,5]}", "{\"prompt\":[2147483648]}",
        "{\"prompt\":[-1]}",          "{\"prompt\":[01]}",             "{\"prompt\":[1,]}",
        "{\"prompt\":[]}",            "{\"prompt\":[1 2]}",            "{\"prompt\":[1]",
        "{\"prompt\":[1]}x",          "[1,2]",                         "{\"prompt\":[1],}",
    };
    rp_json_ids j;
    for (size_t i = 0; i < sizeof lifts / sizeof lifts[0]; i++) {
        if (rp_json_lift_prompt_ids(lifts[i], strlen(lifts[i]), &j) != 1) fail_msg("not lifted: %s", lifts[i]);
        rp_json_ids_free(&j);
        check_same(&ctx, lifts[i], strlen(lifts[i]));
    }
    for (size_t i = 0; i < sizeof stays / sizeof stays[0]; i++) {
        if (rp_json_lift_prompt_ids(stays[i], strlen(stays[i]), &j) != 0) fail_msg("lifted: %s", stays[i]);
        check_same(&ctx, stays[i], strlen(stays[i]));
    }
    /* the duplicate key: jansson's answer, whichever it is */
    rp_oai_request q;
    rp_oai_error e;
    const char *dup = "{\"prompt\":[1],\"prompt\":[2,3]}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, dup, strlen(dup), &q, &e), 0);
    assert_int_equal(q.num_prompt_ids[0], 2);
    rp_oai_request_free(&q);
    /* random bodies of ids (up to 20,000), random spacing and field order, then byte flips */
    const uint64_t seed = 36;
    printf("prompt ids fast path: seed %llu\n", (unsigned long long)seed);
    char *body = malloc(1 << 20);
    for (uint64_t it = 0; it < 400; it++) {
        size_t o = 0;
        const int n = 1 + (int)(rp_rand_uniform(seed, it, 0) * (it % 10 == 0 ? 20000 : 40));
        const char *ws[] = {"", " ", "\n", "\t ", "\r\n"};
#define WS ws[(int)(rp_rand_uniform(seed, it, o + 1) * 5)]
        o += (size_t)sprintf(body + o, "{%s\"max_tokens\"%s:%s2,%s\"prompt\"%s:%s[", WS, WS, WS, WS, WS, WS);
        for (int k = 0; k < n; k++)
            o += (size_t)sprintf(body + o, "%s%s%u%s", k ? "," : "", WS,
                                 (unsigned)(rp_rand_uniform(seed, it, 1000 + (uint64_t)k) * 2147483647.0), WS);
        o += (size_t)sprintf(body + o, "]%s,\"stop\":\"],\\\"prompt\\\":[1\"%s}", WS, WS);
#undef WS
        check_same(&ctx, body, o);
        for (int f = 0; f < 8; f++) { /* one byte changed to a JSON-significant one */
            static const char sig[] = "[]{},:\"\\ 0-.e9";
            const size_t at = (size_t)(rp_rand_uniform(seed, it, 50000 + (uint64_t)f) * (double)o);
            const char was = body[at];
            body[at] = sig[(int)(rp_rand_uniform(seed, it, 60000 + (uint64_t)f) * (sizeof sig - 1))];
            check_same(&ctx, body, o);
            body[at] = was;
        }
    }
    free(body);
}

/* ---- chat templates, tools and tool messages -------------------------------------- */

/* A tokenizer whose chat template is the file tests/fixtures/templates/NAME.jinja. */
static rp_tokenizer *load_tok_template(const char *name) {
    rp_tokenizer *t = load_tok();
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/templates/%s.jinja", test_source_dir(), name);
    rp_err err;
    if (rp_tokenizer_load_chat_template(t, NULL, NULL, path, &err)) fail_msg("%s", err.msg);
    return t;
}

/* A fixture conversation a client could send: string contents, tool results
 * that answer earlier calls, arguments as mappings (turned into the JSON
 * strings OpenAI's API carries, which the server parses back). */
static json_t *as_request(json_t *vars) {
    json_t *msgs = json_deep_copy(json_object_get(vars, "messages")), *m, *ids = json_object();
    size_t i, k;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_string(json_object_get(m, "content")) || !role || !strcmp(role, "developer")) goto no;
        json_t *call;
        json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
            json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
            if (!json_is_object(args) || !json_is_string(json_object_get(call, "id"))) goto no;
            json_object_set_new(ids, json_string_value(json_object_get(call, "id")), json_true());
            char *text = json_dumps(args, JSON_COMPACT | JSON_ENSURE_ASCII);
            json_object_set_new(fn, "arguments", json_string(text));
            free(text);
        }
        if (!strcmp(role, "tool") && !json_object_get(ids, json_string_value(json_object_get(m, "tool_call_id"))))
            goto no;
    }
    json_decref(ids);
    json_t *kw = json_pack("{s:O,s:O,s:s}", "bos_token", json_object_get(vars, "bos_token"), "eos_token",
                           json_object_get(vars, "eos_token"), "date_string", "26 Jul 2024");
    json_t *et = json_object_get(vars, "enable_thinking");
    if (et) json_object_set(kw, "enable_thinking", et);
    return json_pack("{s:o,s:O,s:O,s:o}", "messages", msgs, "tools", json_object_get(vars, "tools"),
                     "add_generation_prompt", json_object_get(vars, "add_generation_prompt"), "chat_template_kwargs",
                     kw);
no:
    json_decref(ids);
    json_decref(msgs);
    return NULL;
}

/* Chat requests with tools, tool calls and tool results render exactly as
 * transformers rendered the same conversations with the tool-calling
 * fixture templates (tests/fixtures/templates/rendered/). */
static void test_tools_render_as_fixtures(void **state) {
    (void)state;
    static const char *names[] = {"hermes_tools", "llama31_json_tools", "mistral_v03_tools"};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
        rp_tokenizer *tok = load_tok_template(names[n]);
        rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 1 << 20, .vocab_size = 151936,
                              .has_tool_parser = 1, .auto_tool_choice = 1};
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/fixtures/templates/rendered/%s.json", test_source_dir(), names[n]);
        json_error_t je;
        json_t *root = json_load_file(path, 0, &je), *c;
        if (!root) fail_msg("%s: %s", path, je.text);
        size_t i, checked = 0, with_tools = 0;
        json_array_foreach(json_object_get(root, "cases"), i, c) {
            json_t *want = json_object_get(c, "text"), *vars = json_object_get(c, "vars");
            if (!json_is_string(want)) continue;
            json_t *req = as_request(vars);
            if (!req) continue;
            char *body = json_dumps(req, JSON_COMPACT);
            rp_oai_request q;
            rp_oai_error e;
            if (rp_oai_parse(&ctx, RP_OAI_CHAT, body, strlen(body), &q, &e))
                fail_msg("%s case %zu: %s (%s)", names[n], i, e.message, e.param);
            if (strcmp(q.prompt_texts[0], json_string_value(want)))
                fail_msg("%s case %zu differs:\n--- replay\n%s\n--- transformers\n%s", names[n], i, q.prompt_texts[0],
                         json_string_value(want));
            checked++;
            with_tools += json_array_size(json_object_get(vars, "tools")) > 0;
            rp_oai_request_free(&q);
            free(body);
            json_decref(req);
        }
        fprintf(stderr, "%s: %zu conversations as chat requests (%zu with tools), as transformers rendered them\n",
                names[n], checked, with_tools);
        assert_true(checked >= 20 && with_tools >= 5);
        json_decref(root);
        rp_tokenizer_free(tok);
    }
}

/* Bad tools, tool messages and tool_choice: 400s naming the parameter. */
static void test_tool_errors(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok();
    /* a server with --tool-call-parser hermes --enable-auto-tool-choice */
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096, .vocab_size = 151936,
                          .has_tool_parser = 1, .tool_parser = RP_TOOL_PARSER_LLAMA3_JSON, .auto_tool_choice = 1};
#define USER "{\"role\":\"user\",\"content\":\"x\"}"
#define CALL(id, args)                                                                                               \
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"" id "\",\"type\":\"function\",\"function\":" \
    "{\"name\":\"f\",\"arguments\":" args "}}]}"
#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]"
    const struct {
        const char *body, *param, *says;
    } cases[] = {
        {"{\"messages\":[" USER "],\"tools\":{}}", "tools", "list"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"retrieval\"}]}", "tools.[0]", "function"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"function\",\"function\":{}}]}", "tools.[0].function.name",
         "non-empty"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}",
         "tools.[0].function.name", "non-empty"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"function\"}]}", "tools.[0].function", "object"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
         "\"string\"}}]}",
         "tools.[0].function.parameters", "JSON Schema"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"required\",\"response_format\":{\"type\":"
         "\"json_object\"}}",
         "tool_choice", "both constrain"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
         "\"guided_regex\":\"a\"}",
         "tool_choice", "both constrain"},
        {"{\"messages\":[" USER "],\"tools\":[],\"tool_choice\":\"required\"}", "tool_choice", "needs 'tools'"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}",
         "tool_choice", "not in 'tools'"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"sometimes\"}", "tool_choice", "sometimes"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":7}", "tool_choice", "must be"},
        {"{\"messages\":[" USER "]," TOOLS ",\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls", "boolean"},
        {"{\"messages\":[" USER ",{\"role\":\"tool\",\"content\":\"r\"}]}", "messages.[1].tool_call_id",
         "tool_call_id"},
        {"{\"messages\":[" USER "," CALL("a", "\"{}\"") ",{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"r\"}]}",
         "messages.[2].tool_call_id", "'b'"},
        {"{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"r\"}," CALL("a", "\"{}\"") "]}",
         "messages.[0].tool_call_id", "no earlier"},
        {"{\"messages\":[" USER "," CALL("a", "\"{not json\"") "]}", "messages.[1].tool_calls.[0].function.arguments",
         "not valid JSON"},
        {"{\"messages\":[" USER "," CALL("a", "7") "]}", "messages.[1].tool_calls.[0].function.arguments", "string"},
        {"{\"messages\":[" USER "," CALL("", "\"{}\"") "]}", "messages.[1].tool_calls.[0].id", "non-empty"},
        {"{\"messages\":[" USER ",{\"role\":\"assistant\",\"tool_calls\":{}}]}", "messages.[1].tool_calls", "list"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "messages.[0].tool_calls",
         "assistant"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages.[0].role", "wizard"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages.[0].content", "string"},
        {"{\"messages\":[" USER "],\"chat_template_kwargs\":[1]}", "chat_template_kwargs", "object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rp_oai_request q;
        rp_oai_error e;
        if (rp_oai_parse(&ctx, RP_OAI_CHAT, cases[i].body, strlen(cases[i].body), &q, &e) == 0)
            fail_msg("case %zu was accepted: %s", i, cases[i].body);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.type, "invalid_request_error");
        if (strcmp(e.param, cases[i].param) || !strstr(e.message, cases[i].says))
            fail_msg("case %zu: param '%s', message '%s'", i, e.param, e.message);
    }
    /* accepted: tool_choice none/auto, parallel_tool_calls, null content beside tool_calls,
     * arguments already an object (some clients), kwargs of any JSON */
    const char *ok[] = {
        "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"none\",\"parallel_tool_calls\":true}",
        "{\"messages\":[" USER "," CALL("a", "{\"x\":[1,{}]}") ",{\"role\":\"tool\",\"tool_call_id\":\"a\","
        "\"content\":[{\"type\":\"text\",\"text\":\"r\"}]}]," TOOLS ",\"tool_choice\":\"auto\"}",
        "{\"messages\":[" USER "],\"tools\":null,\"tool_choice\":null,\"chat_template_kwargs\":{\"a\":[null,{\"b\":1.5}]}}",
        "{\"messages\":[" USER "],\"tools\":[]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        rp_oai_request q;
        rp_oai_error e;
        if (rp_oai_parse(&ctx, RP_OAI_CHAT, ok[i], strlen(ok[i]), &q, &e))
            fail_msg("ok case %zu: %s (%s)", i, e.message, e.param);
        rp_oai_request_free(&q);
    }
    /* forced calls (any server): the constraint is the named function's
     * parameters, or an array of {name, parameters} (one at most without
     * parallel_tool_calls), compact */
    const struct {
        const char *body;
        rp_forced_tools forced;
        const char *schema;
    } forced[] = {
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
         RP_FORCED_NAMED, "{\"type\":\"object\"}"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"required\"}", RP_FORCED_REQUIRED,
         "{\"type\":\"array\",\"minItems\":1,\"items\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":"
         "{\"const\":\"f\"},\"parameters\":{\"type\":\"object\"}},\"required\":[\"name\",\"parameters\"],"
         "\"additionalProperties\":false}]}}"},
        {"{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
         RP_FORCED_REQUIRED, "\"maxItems\":1"},
    };
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
        rp_oai_request fq;
        rp_oai_error fe;
        if (rp_oai_parse(&ctx, RP_OAI_CHAT, forced[i].body, strlen(forced[i].body), &fq, &fe))
            fail_msg("forced case %zu: %s (%s)", i, fe.message, fe.param);
        assert_int_equal(fq.forced_tools, forced[i].forced);
        assert_int_equal(fq.params.constraint.kind, RP_CONSTRAINT_JSON_SCHEMA);
        assert_int_equal(fq.params.constraint.allow_whitespace, 0);
        assert_int_equal(fq.parse_tools, 0);
        if (!strstr(fq.params.constraint.text, forced[i].schema))
            fail_msg("forced case %zu: %s", i, fq.params.constraint.text);
        if (forced[i].forced == RP_FORCED_NAMED) assert_string_equal(fq.forced_name, "f");
        rp_oai_request_free(&fq);
    }
    /* Qwen3's own template: the tools in the system turn, the call and its result */
    rp_oai_request q;
    rp_oai_error e;
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, bodies[4], strlen(bodies[4]), &q, &e), 0);
    assert_non_null(strstr(q.prompt_texts[0], "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get\", "
                                              "\"description\": \"d\", \"parameters\": {\"type\": \"object\"}}}\n</tools>"));
    assert_non_null(strstr(q.prompt_texts[0], "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get\", \"arguments\": "
                                              "{\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"));
    assert_non_null(strstr(q.prompt_texts[0], "<|im_start|>user\n<tool_response>\n-3\n</tool_response><|im_end|>\n"));
    rp_oai_request_free(&q);
    /* /tokenize renders tools too */
    rp_oai_tokenize t;
    assert_int_equal(rp_oai_parse_tokenize(&ctx, bodies[4], strlen(bodies[4]), &t, &e), 0);
    assert_non_null(strstr(t.text, "<tools>"));
    rp_oai_tokenize_free(&t);
    /* vLLM's rule: tools with tool_choice "auto" (or none given) need both
     * flags; "none" is always taken and parses nothing; reasoning is per server */
    const struct {
        int parser, auto_choice, reasoning;
        const char *body;
        int status, parse_tools;
    } rule[] = {
        {0, 0, 0, "{\"messages\":[" USER "]," TOOLS "}", 400, 0},
        {0, 0, 0, "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"auto\"}", 400, 0},
        {1, 0, 0, "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"auto\"}", 400, 0},
        {0, 0, 0, "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"none\"}", 200, 0},
        {1, 1, 0, "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"none\"}", 200, 0},
        {0, 0, 0, "{\"messages\":[" USER "],\"tools\":[]}", 200, 0},
        {1, 1, 0, "{\"messages\":[" USER "],\"tools\":[],\"tool_choice\":\"auto\"}", 200, 0},
        {1, 1, 0, "{\"messages\":[" USER "]," TOOLS "}", 200, 1},
        {1, 1, 1, "{\"messages\":[" USER "]," TOOLS ",\"tool_choice\":\"auto\"}", 200, 1},
        {0, 0, 1, "{\"messages\":[" USER "]}", 200, 0},
    };
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++) {
        rp_oai_context c2 = ctx;
        c2.has_tool_parser = rule[i].parser, c2.auto_tool_choice = rule[i].auto_choice;
        c2.has_reasoning_parser = rule[i].reasoning, c2.reasoning_parser = RP_REASONING_DEEPSEEK_R1;
        int rc = rp_oai_parse(&c2, RP_OAI_CHAT, rule[i].body, strlen(rule[i].body), &q, &e);
        if (rule[i].status == 400) {
            if (rc == 0) fail_msg("rule %zu accepted", i);
            assert_int_equal(e.status, 400);
            assert_string_equal(e.param, "tool_choice");
            assert_non_null(strstr(e.message, "--enable-auto-tool-choice and --tool-call-parser"));
            continue;
        }
        if (rc) fail_msg("rule %zu: %s", i, e.message);
        assert_int_equal(q.parse_tools, rule[i].parse_tools);
        if (q.parse_tools) assert_int_equal(q.tool_parser, RP_TOOL_PARSER_LLAMA3_JSON);
        assert_int_equal(q.parse_reasoning, rule[i].reasoning);
        if (q.parse_reasoning) assert_int_equal(q.reasoning_parser, RP_REASONING_DEEPSEEK_R1);
        rp_oai_request_free(&q);
    }
    /* completions never parse */
    rp_oai_context c3 = ctx;
    c3.has_reasoning_parser = 1;
    assert_int_equal(rp_oai_parse(&c3, RP_OAI_COMPLETION, "{\"prompt\":\"x\"}", 14, &q, &e), 0);
    assert_int_equal(q.parse_tools + q.parse_reasoning, 0);
    rp_oai_request_free(&q);
#undef USER
#undef CALL
#undef TOOLS
    rp_tokenizer_free(tok);
}

/* A template's raise_exception: a 400 with its message as it wrote it. */
static void test_template_raises(void **state) {
    (void)state;
    rp_tokenizer *tok = load_tok_template("mistral_v03_tools");
    rp_oai_context ctx = {.served_model = "m", .tok = tok, .max_context = 4096, .vocab_size = 151936};
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]}";
    rp_oai_request q;
    rp_oai_error e;
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_CHAT, body, strlen(body), &q, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.message, "After the optional system message, conversation roles must alternate "
                                   "user/assistant/user/assistant/...");
    rp_tokenizer_free(tok);
}

/* Issue 40 item 6: the output options reach the request; what replay does
 * not implement is refused by name. */
static void test_output_options(void **state) {
    (void)state;
    rp_oai_context ctx = {.served_model = "m", .max_context = 4096, .vocab_size = 151936};
    rp_oai_request q;
    rp_oai_error e;
    const char *body = "{\"prompt\":[1,2,3],\"include_stop_str_in_output\":true,\"skip_special_tokens\":false,"
                       "\"truncate_prompt_tokens\":2,\"best_of\":3,\"n\":3,\"stream\":true,"
                       "\"stream_options\":{\"continuous_usage_stats\":true},\"user\":\"u\"}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_true(q.params.include_stop_str_in_output && q.params.keep_special_tokens);
    assert_int_equal(q.truncate_prompt_tokens, 2);
    assert_true(q.continuous_usage && !q.include_usage);
    rp_oai_request_free(&q);
    body = "{\"prompt\":[1]}"; /* the defaults: specials skipped, the stop string cut */
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_true(!q.params.include_stop_str_in_output && !q.params.keep_special_tokens && !q.truncate_prompt_tokens);
    rp_oai_request_free(&q);
    /* min_tokens, logit_bias and prompt logprobs reach the engine's params */
    body = "{\"prompt\":[1,2],\"min_tokens\":3,\"logit_bias\":{\"7\":-100,\"9\":2.5},\"prompt_logprobs\":2,"
           "\"echo\":true,\"logprobs\":4}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_int_equal(q.params.min_tokens, 3);
    assert_int_equal(q.params.num_logit_bias, 2);
    assert_true(q.params.logit_bias_ids[0] == 7 && q.params.logit_bias[0] == -100.0f);
    assert_true(q.params.logit_bias_ids[1] == 9 && q.params.logit_bias[1] == 2.5f);
    assert_true(q.params.prompt_logprobs && q.echo_logprobs && q.prompt_logprobs == 2);
    assert_int_equal(q.params.prompt_top_logprobs, 4); /* the larger of echo's 4 and prompt_logprobs' 2 */
    rp_oai_request_free(&q);
    body = "{\"prompt\":[1],\"echo\":true}"; /* echo alone: no prompt logprobs */
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e), 0);
    assert_true(!q.params.prompt_logprobs && !q.echo_logprobs && q.prompt_logprobs == -1);
    rp_oai_request_free(&q);
    {
        /* RP_MAX_LOGIT_BIAS entries are taken, one more is not */
        char big[32 * (RP_MAX_LOGIT_BIAS + 2)];
        for (int extra = 0; extra < 2; extra++) {
            size_t o = (size_t)snprintf(big, sizeof big, "{\"prompt\":[1],\"logit_bias\":{");
            for (int i = 0; i < RP_MAX_LOGIT_BIAS + extra; i++)
                o += (size_t)snprintf(big + o, sizeof big - o, "%s\"%d\":1", i ? "," : "", i);
            snprintf(big + o, sizeof big - o, "}}");
            int rc = rp_oai_parse(&ctx, RP_OAI_COMPLETION, big, strlen(big), &q, &e);
            assert_int_equal(rc, extra ? -1 : 0);
            if (rc == 0) {
                assert_int_equal(q.params.num_logit_bias, RP_MAX_LOGIT_BIAS);
                rp_oai_request_free(&q);
            } else {
                assert_string_equal(e.param, "logit_bias");
            }
        }
    }
    static const struct {
        const char *body, *param, *msg;
    } refused[] = {
        {"{\"prompt\":[1],\"min_tokens\":-1}", "min_tokens", "must be in"},
        {"{\"prompt\":[1],\"min_tokens\":1.5}", "min_tokens", "must be an integer"},
        {"{\"prompt\":[1],\"logit_bias\":{\"5\":\"1\"}}", "logit_bias", "must be numbers"},
        {"{\"prompt\":[1],\"logit_bias\":{\"5\":100.5}}", "logit_bias", "[-100, 100]"},
        {"{\"prompt\":[1],\"logit_bias\":{\"151936\":1}}", "logit_bias", "token ids in [0, 151936)"},
        {"{\"prompt\":[1],\"logit_bias\":{\"-1\":1}}", "logit_bias", "token ids"},
        {"{\"prompt\":[1],\"logit_bias\":{\"5x\":1}}", "logit_bias", "token ids"},
        {"{\"prompt\":[1],\"logit_bias\":{\"\":1}}", "logit_bias", "token ids"},
        {"{\"prompt\":[1],\"logit_bias\":[1]}", "logit_bias", "must be an object"},
        {"{\"prompt\":[1],\"prompt_logprobs\":21}", "prompt_logprobs", "must be in"},
        {"{\"prompt\":[1],\"prompt_logprobs\":-1}", "prompt_logprobs", "must be in"},
        {"{\"prompt\":[1],\"prompt_logprobs\":1,\"stream\":true}", "prompt_logprobs", "stream"},
        {"{\"prompt\":[1],\"best_of\":2}", "best_of", "must equal 'n'"},
        {"{\"prompt\":[1],\"truncate_prompt_tokens\":-1}", "truncate_prompt_tokens", "must be in"},
        {"{\"prompt\":[1],\"spaces_between_special_tokens\":false}", "spaces_between_special_tokens", "not supported"},
        {"{\"prompt\":[1],\"suffix\":\"x\"}", "suffix", "not supported by replay yet"},
        {"{\"prompt\":[1],\"bogus\":null}", "bogus", "Unrecognized request argument supplied: bogus"},
        {"{\"prompt\":[1],\"messages\":[]}", "messages", "Unrecognized request argument supplied: messages"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        if (rp_oai_parse(&ctx, RP_OAI_COMPLETION, refused[i].body, strlen(refused[i].body), &q, &e) == 0)
            fail_msg("%s: taken", refused[i].body);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, refused[i].param);
        if (!strstr(e.message, refused[i].msg)) fail_msg("%s: '%s'", refused[i].body, e.message);
    }
}

/* Structured output fields (openai_structured.c): each form read into one
 * constraint with vLLM's whitespace default and the field's name for the
 * engine's errors; two constraints, malformed values and options replay
 * does not have are 400s naming the field; random values never crash. */
static void test_structured_fields(void **state) {
    (void)state;
    rp_oai_context ctx = {.served_model = "m", .max_context = 4096, .vocab_size = 151936};
    static const struct {
        const char *fields, *param, *text;
        rp_constraint_kind kind;
        int whitespace;
    } taken[] = {
        {"\"response_format\":{\"type\":\"text\"}", NULL, NULL, RP_CONSTRAINT_NONE, 0},
        {"\"response_format\":{\"type\":\"json_object\"}", "response_format", NULL, RP_CONSTRAINT_JSON_OBJECT, 1},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,"
         "\"schema\":{\"type\":\"integer\"}}}",
         "response_format", "{\"type\":\"integer\"}", RP_CONSTRAINT_JSON_SCHEMA, 1},
        {"\"structured_outputs\":{\"json\":{\"type\":\"string\"},\"disable_any_whitespace\":true}", "structured_outputs",
         "{\"type\":\"string\"}", RP_CONSTRAINT_JSON_SCHEMA, 0},
        {"\"structured_outputs\":{\"json\":\"{\\\"type\\\":\\\"string\\\"}\"}", "structured_outputs",
         "{\"type\":\"string\"}", RP_CONSTRAINT_JSON_SCHEMA, 1},
        {"\"structured_outputs\":{\"regex\":\"a+\",\"json\":null}", "structured_outputs", "a+", RP_CONSTRAINT_REGEX, 1},
        {"\"structured_outputs\":{\"choice\":[\"a\",\"b c\"]}", "structured_outputs", "[\"a\",\"b c\"]",
         RP_CONSTRAINT_CHOICE, 1},
        {"\"structured_outputs\":{\"grammar\":\"root ::= \\\"x\\\"\"}", "structured_outputs", "root ::= \"x\"",
         RP_CONSTRAINT_GRAMMAR, 1},
        {"\"structured_outputs\":{\"json_object\":true}", "structured_outputs", NULL, RP_CONSTRAINT_JSON_OBJECT, 1},
        {"\"guided_json\":{\"enum\":[1,2]}", "guided_json", "{\"enum\":[1,2]}", RP_CONSTRAINT_JSON_SCHEMA, 1},
        {"\"guided_regex\":\"[0-9]+\",\"guided_whitespace_pattern\":null", "guided_regex", "[0-9]+",
         RP_CONSTRAINT_REGEX, 1},
        {"\"guided_choice\":[\"x\"]", "guided_choice", "[\"x\"]", RP_CONSTRAINT_CHOICE, 1},
        {"\"guided_grammar\":\"root ::= [a-z]\"", "guided_grammar", "root ::= [a-z]", RP_CONSTRAINT_GRAMMAR, 1},
    };
    char body[1024];
    rp_oai_request q;
    rp_oai_error e;
    for (size_t i = 0; i < sizeof taken / sizeof taken[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":[1],%s}", taken[i].fields);
        if (rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e))
            fail_msg("%s: %s", taken[i].fields, e.message);
        const rp_constraint *c = &q.params.constraint;
        assert_int_equal(c->kind, taken[i].kind);
        if (taken[i].param) {
            assert_string_equal(c->param, taken[i].param);
            assert_int_equal(c->allow_whitespace, taken[i].whitespace);
        }
        if (taken[i].text) assert_string_equal(c->text, taken[i].text);
        rp_oai_request_free(&q);
    }
    static const struct {
        const char *fields, *param, *msg;
    } refused[] = {
        {"\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"", "guided_regex", "both constrain"},
        {"\"structured_outputs\":{\"regex\":\"a\",\"choice\":[\"b\"]}", "structured_outputs", "both constrain"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format", "\"text\", \"json_object\" or \"json_schema\""},
        {"\"response_format\":{\"type\":\"json_schema\"}", "response_format", "needs a \"json_schema\" object"},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}", "response_format",
         "needs a \"schema\""},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"extra\":1}}", "response_format",
         "Unrecognized field"},
        {"\"response_format\":\"json\"", "response_format", "must be an object"},
        {"\"structured_outputs\":{\"choice\":[]}", "structured_outputs", "non-empty list"},
        {"\"structured_outputs\":{\"choice\":[1]}", "structured_outputs", "strings only"},
        {"\"structured_outputs\":{\"regex\":\"\"}", "structured_outputs", "non-empty string"},
        {"\"structured_outputs\":{\"structural_tag\":\"x\"}", "structured_outputs", "not supported"},
        {"\"structured_outputs\":{\"whitespace_pattern\":\" \"}", "structured_outputs", "not supported"},
        {"\"structured_outputs\":{\"disable_additional_properties\":true,\"json\":{}}", "structured_outputs",
         "not supported"},
        {"\"structured_outputs\":{\"bogus\":1}", "structured_outputs", "Unrecognized field"},
        {"\"guided_json\":5", "guided_json", "JSON schema"},
        {"\"guided_choice\":\"a\"", "guided_choice", "non-empty list"},
        {"\"guided_regex\":\"a\",\"guided_whitespace_pattern\":\" \"", "guided_whitespace_pattern", "not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":[1],%s}", refused[i].fields);
        if (rp_oai_parse(&ctx, RP_OAI_COMPLETION, body, strlen(body), &q, &e) == 0) fail_msg("%s: taken", body);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, refused[i].param);
        if (!strstr(e.message, refused[i].msg)) fail_msg("%s: '%s'", body, e.message);
    }
    static const char *fields[] = {"response_format", "structured_outputs", "guided_json", "guided_regex",
                                   "guided_choice", "guided_grammar", "guided_whitespace_pattern"};
    int ok = 0;
    for (uint64_t it = 0; it < 5000; it++) {
        json_t *root = json_pack("{s:[i]}", "prompt", 1);
        json_t *v = random_value(it, 7, 0);
        if (it % 3 == 0) { /* the shapes the fields take, with random insides */
            json_t *o = json_object();
            static const char *keys[] = {"type", "json_schema", "schema", "json", "regex", "choice", "grammar",
                                         "json_object", "disable_any_whitespace", "name"};
            json_object_set_new(o, keys[rp_rand_u64(19, it, 1) % 10], v);
            json_object_set_new(o, keys[rp_rand_u64(19, it, 2) % 10], random_value(it, 8, 0));
            v = o;
        }
        json_object_set_new(root, fields[rp_rand_u64(19, it, 0) % 7], v);
        char *text = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        if (rp_oai_parse(&ctx, RP_OAI_COMPLETION, text, strlen(text), &q, &e) == 0) {
            ok++;
            rp_oai_request_free(&q);
        } else {
            assert_true(e.status == 400 && e.message[0] && e.param[0]);
        }
        free(text);
    }
    assert_true(ok > 0);
    /* a dead end is told apart from a complete output */
    assert_string_equal(rp_oai_finish_reason(RP_FINISH_REASON_GRAMMAR), "grammar_dead_end");
    assert_string_equal(rp_oai_finish_reason(RP_FINISH_REASON_STOP), "stop");
}

/* generation_config.json's sampling (the context's defaults) fills only
 * what a request leaves unset. */
/* The SSE events in out, each's "choices"[0] (a new reference), in order;
 * how many into ch. */
static int sse_choices(const rp_sbuf *out, json_t **ch, int max) {
    int n = 0;
    const char *p = out->p ? out->p : "";
    while (n < max && (p = strstr(p, "data: "))) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        json_t *j = json_loadb(p, (size_t)(end - p), 0, NULL);
        assert_non_null(j);
        ch[n++] = json_incref(json_array_get(json_object_get(j, "choices"), 0));
        json_decref(j);
        p = end;
    }
    return n;
}

/* tool_choice "required" and named: the JSON the grammar held the model to
 * becomes tool_calls, whole and streamed; text that is not that JSON (cut
 * by max_tokens) stays content. */
static void test_forced_calls(void **state) {
    (void)state;
    rp_oai_response r = {.kind = RP_OAI_CHAT, .id = "chatcmpl-1", .created = 7, .model = "m"};
    static const struct {
        rp_forced_tools forced;
        const char *text;
        int calls;
        const char *names[2], *args[2];
        rp_finish finish;
        const char *fin;
    } cases[] = {
        {RP_FORCED_NAMED, "{\"city\":\"Oslo\"}", 1, {"get"}, {"{\"city\":\"Oslo\"}"}, RP_FINISH_REASON_STOP,
         "tool_calls"},
        {RP_FORCED_REQUIRED, "[{\"name\":\"a\",\"parameters\":{\"x\":[1,2]}},{\"name\":\"b\",\"parameters\":{}}]", 2,
         {"a", "b"}, {"{\"x\":[1,2]}", "{}"}, RP_FINISH_REASON_STOP, "tool_calls"},
        {RP_FORCED_REQUIRED, "[{\"name\":\"a\",\"para", 0, {0}, {0}, RP_FINISH_REASON_LENGTH, "length"},
        {RP_FORCED_NAMED, "{\"city\":\"Os", 1, {"get"}, {"{\"city\":\"Os"}, RP_FINISH_REASON_LENGTH, "tool_calls"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rp_chat_parsing p = {.forced = cases[k].forced, .id_seed = 42, .id_style = RP_TOOL_PARSER_HERMES};
        snprintf(p.forced_name, sizeof p.forced_name, "get");
        const char *text = cases[k].text;
        const size_t len = strlen(text);
        json_t *c = rp_chat_choice_json(&p, 0, text, len, NULL, cases[k].finish);
        assert_non_null(c);
        json_t *msg = json_object_get(c, "message"), *calls = json_object_get(msg, "tool_calls");
        assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), cases[k].fin);
        assert_int_equal(json_array_size(calls), cases[k].calls);
        if (!cases[k].calls) assert_string_equal(json_string_value(json_object_get(msg, "content")), text);
        else assert_true(json_is_null(json_object_get(msg, "content")));
        for (int i = 0; i < cases[k].calls; i++) {
            json_t *fn = json_object_get(json_array_get(calls, (size_t)i), "function");
            assert_string_equal(json_string_value(json_object_get(fn, "name")), cases[k].names[i]);
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")), cases[k].args[i]);
            assert_int_equal(strncmp(json_string_value(json_object_get(json_array_get(calls, (size_t)i), "id")),
                                     "call_", 5),
                             0);
        }
        /* streamed in 3-byte pieces: the same calls, a named call's
         * arguments as they came, the same finish */
        rp_sbuf out = {0};
        rp_chat_stream *st = rp_chat_stream_new(&r, &p, 0);
        assert_non_null(st);
        for (size_t at = 0; at < len; at += 3)
            assert_int_equal(rp_chat_stream_feed(st, text + at, len - at < 3 ? len - at : 3, NULL, &out), 0);
        assert_int_equal(rp_chat_stream_finish(st, cases[k].finish, &out), 0);
        rp_chat_stream_free(st);
        json_t *ch[64];
        const int n = sse_choices(&out, ch, 64);
        int starts = 0;
        char args[2][256] = {"", ""}, content[256] = "", fin[32] = "";
        for (int e = 0; e < n; e++) {
            json_t *delta = json_object_get(ch[e], "delta"), *tc;
            size_t i;
            json_array_foreach(json_object_get(delta, "tool_calls"), i, tc) {
                const int idx = (int)json_integer_value(json_object_get(tc, "index"));
                json_t *fn = json_object_get(tc, "function");
                if (json_object_get(fn, "name")) {
                    assert_string_equal(json_string_value(json_object_get(fn, "name")), cases[k].names[idx]);
                    assert_string_equal(json_string_value(json_object_get(tc, "id")),
                                        json_string_value(json_object_get(json_array_get(calls, (size_t)idx), "id")));
                    starts++;
                }
                strcat(args[idx], json_string_value(json_object_get(fn, "arguments")));
            }
            if (json_is_string(json_object_get(delta, "content")))
                strcat(content, json_string_value(json_object_get(delta, "content")));
            if (json_is_string(json_object_get(ch[e], "finish_reason")))
                snprintf(fin, sizeof fin, "%s", json_string_value(json_object_get(ch[e], "finish_reason")));
            json_decref(ch[e]);
        }
        assert_int_equal(starts, cases[k].calls);
        for (int i = 0; i < cases[k].calls; i++) assert_string_equal(args[i], cases[k].args[i]);
        if (!cases[k].calls) assert_string_equal(content, text);
        assert_string_equal(fin, cases[k].fin);
        rp_sbuf_free(&out);
        json_decref(c);
    }
}

/* parallel_tool_calls false under "auto": two hermes calls written, the
 * first returned, whole and streamed; true: both. */
static void test_single_call(void **state) {
    (void)state;
    rp_oai_response r = {.kind = RP_OAI_CHAT, .id = "chatcmpl-1", .created = 7, .model = "m"};
    const char *text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": "
                       "\"b\", \"arguments\": {}}\n</tool_call>";
    const size_t len = strlen(text);
    for (int single = 0; single < 2; single++) {
        rp_chat_parsing p = {.tools = 1, .tool_parser = RP_TOOL_PARSER_HERMES, .id_seed = 5, .single_call = single};
        json_t *c = rp_chat_choice_json(&p, 0, text, len, NULL, RP_FINISH_REASON_STOP);
        assert_non_null(c);
        json_t *calls = json_object_get(json_object_get(c, "message"), "tool_calls");
        assert_int_equal(json_array_size(calls), single ? 1 : 2);
        assert_string_equal(json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "function"),
                                                               "name")),
                            "a");
        json_decref(c);
        rp_sbuf out = {0};
        rp_chat_stream *st = rp_chat_stream_new(&r, &p, 0);
        assert_non_null(st);
        for (size_t at = 0; at < len; at += 5)
            assert_int_equal(rp_chat_stream_feed(st, text + at, len - at < 5 ? len - at : 5, NULL, &out), 0);
        assert_int_equal(rp_chat_stream_finish(st, RP_FINISH_REASON_STOP, &out), 0);
        rp_chat_stream_free(st);
        json_t *ch[128];
        const int n = sse_choices(&out, ch, 128);
        int starts = 0;
        for (int e = 0; e < n; e++) {
            size_t i;
            json_t *tc;
            json_array_foreach(json_object_get(json_object_get(ch[e], "delta"), "tool_calls"), i, tc) {
                assert_true(!single || json_integer_value(json_object_get(tc, "index")) == 0);
                starts += json_object_get(tc, "id") != NULL;
            }
            json_decref(ch[e]);
        }
        assert_int_equal(starts, single ? 1 : 2);
        rp_sbuf_free(&out);
    }
}

static void test_sampling_defaults(void **state) {
    (void)state;
    rp_request_params d;
    rp_request_params_default(&d);
    d.temperature = 0.6f, d.top_p = 0.95f, d.top_k = 20, d.min_p = 0.01f, d.repetition_penalty = 1.05f;
    rp_oai_context ctx = {.served_model = "m", .max_context = 4096, .vocab_size = 151936, .sampling_defaults = &d};
    rp_oai_request q;
    rp_oai_error e;
    const char *unset = "{\"prompt\":[1,2]}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, unset, strlen(unset), &q, &e), 0);
    assert_true(q.params.temperature == 0.6f && q.params.top_p == 0.95f && q.params.top_k == 20 &&
                q.params.min_p == 0.01f && q.params.repetition_penalty == 1.05f);
    assert_true(q.params.presence_penalty == 0 && q.params.max_tokens == 16);
    rp_oai_request_free(&q);
    const char *some = "{\"prompt\":[1,2],\"temperature\":0,\"top_k\":-1,\"top_p\":null}";
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, some, strlen(some), &q, &e), 0);
    assert_true(q.params.temperature == 0 && q.params.top_k == -1 && q.params.top_p == 0.95f);
    rp_oai_request_free(&q);
    ctx.sampling_defaults = NULL; /* replay's own */
    assert_int_equal(rp_oai_parse(&ctx, RP_OAI_COMPLETION, unset, strlen(unset), &q, &e), 0);
    assert_true(q.params.temperature == 1 && q.params.top_p == 1 && q.params.top_k == 0);
    rp_oai_request_free(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_integral_floats),
        cmocka_unit_test(test_prompt_ids_fast_path),
        cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_fuzz_fields),
        cmocka_unit_test(test_engine_errors),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_tools_render_as_fixtures),
        cmocka_unit_test(test_tool_errors),
        cmocka_unit_test(test_template_raises),
        cmocka_unit_test(test_sampling_defaults),
        cmocka_unit_test(test_output_options),
        cmocka_unit_test(test_structured_fields),
        cmocka_unit_test(test_forced_calls),
        cmocka_unit_test(test_single_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
