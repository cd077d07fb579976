/* OpenAI request parsing (jansson): every field is checked for its type and
 * range, with vLLM's meaning. Nothing a client sends is ignored unsaid: a
 * field replay does not implement is a 400 naming it, and so is a field
 * neither OpenAI nor vLLM knows (as OpenAI's API answers "Unrecognized
 * request argument"); the few OpenAI fields with no effect on the answer
 * are taken (check_fields lists them all, docs/server.md too). A body that
 * cannot be held in memory is a 500, never a request parsed with a part
 * missing. */
#include "server/openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_ids.h"
#include "server/openai_structured.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

void rp_oai_set_error(rp_oai_error *err, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) {
    err->status = status;
    snprintf(err->type, sizeof err->type, "%s", type);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    snprintf(err->code, sizeof err->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

int rp_oai_set_out_of_memory(rp_oai_error *err) {
    rp_oai_set_error(err, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

void rp_oai_request_free(rp_oai_request *r) {
    for (int i = 0; i < r->num_prompts; i++) {
        if (r->prompt_texts) free(r->prompt_texts[i]);
        if (r->prompt_ids) free(r->prompt_ids[i]);
    }
    free(r->prompt_texts);
    free(r->prompt_ids);
    free(r->num_prompt_ids);
    for (int i = 0; i < RP_OAI_MAX_STOP; i++) free(r->stop_buf[i]);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->constraint_text);
    memset(r, 0, sizeof *r);
}

int rp_oai_bad(rp_oai_error *err, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rp_oai_set_error(err, 400, "invalid_request_error", param, NULL, "%s", msg);
    return -1;
}
#define BAD(param, ...) rp_oai_bad(err, param, __VA_ARGS__)

/* Which top-level fields a generation request may have (check_fields).
 * /tokenize and /detokenize read theirs and take a chat request's body as
 * it is (to show what a request's model sees), so they are not checked. */
enum { F_ALL = 0, F_COMPLETION, F_CHAT };
static const struct {
    const char *name;
    int only; /* F_ALL: both generation endpoints */
} known_fields[] = {
    {"model", F_ALL}, {"stream", F_ALL}, {"stream_options", F_ALL}, {"n", F_ALL}, {"best_of", F_ALL},
    {"max_tokens", F_ALL}, {"temperature", F_ALL}, {"top_p", F_ALL}, {"top_k", F_ALL}, {"min_p", F_ALL},
    {"seed", F_ALL}, {"max_completion_tokens", F_ALL}, {"stop", F_ALL}, {"stop_token_ids", F_ALL}, {"presence_penalty", F_ALL},
    {"frequency_penalty", F_ALL}, {"repetition_penalty", F_ALL}, {"ignore_eos", F_ALL}, {"logprobs", F_ALL},
    {"echo", F_ALL}, {"include_stop_str_in_output", F_ALL}, {"skip_special_tokens", F_ALL},
    {"spaces_between_special_tokens", F_ALL}, {"truncate_prompt_tokens", F_ALL}, {"min_tokens", F_ALL},
    {"logit_bias", F_ALL}, {"prompt_logprobs", F_ALL},
    /* structured output (openai_structured.c) */
    {"response_format", F_ALL}, {"structured_outputs", F_ALL}, {"guided_json", F_ALL}, {"guided_regex", F_ALL},
    {"guided_choice", F_ALL}, {"guided_grammar", F_ALL}, {"guided_whitespace_pattern", F_ALL},
    /* OpenAI's fields that do not change the answer: taken, no effect */
    {"user", F_ALL}, {"safety_identifier", F_ALL}, {"prompt_cache_key", F_ALL}, {"metadata", F_ALL},
    {"service_tier", F_ALL},
    {"prompt", F_COMPLETION},
    {"messages", F_CHAT}, {"top_logprobs", F_CHAT}, {"tools", F_CHAT},
    {"tool_choice", F_CHAT}, {"parallel_tool_calls", F_CHAT}, {"chat_template_kwargs", F_CHAT},
    {"add_generation_prompt", F_CHAT},
};

/* OpenAI's and vLLM's fields that replay does not implement (yet): a 400
 * naming them, never a request answered as if they were not there. */
static const char *const unsupported_fields[] = {
    "suffix", "functions", "function_call", "modalities", "audio", "prediction",
    "reasoning_effort", "web_search_options", "verbosity", "store", "use_beam_search",
    "length_penalty", "allowed_token_ids", "bad_words", "chat_template", "continue_final_message", "documents",
    "priority", "add_special_tokens", "return_tokens_as_token_ids",
};

/* Every top-level field of a request for endpoint `only` (F_COMPLETION or
 * F_CHAT) is one it takes. */
static int check_fields(json_t *root, int only, rp_oai_error *err) {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int known = 0;
        for (size_t i = 0; !known && i < sizeof known_fields / sizeof known_fields[0]; i++)
            known = !strcmp(key, known_fields[i].name) &&
                    (known_fields[i].only == only || known_fields[i].only == F_ALL);
        if (known) continue;
        for (size_t i = 0; i < sizeof unsupported_fields / sizeof unsupported_fields[0]; i++)
            if (!strcmp(key, unsupported_fields[i]))
                return BAD(key, "'%s' is not supported by replay yet", key);
        return BAD(key, "Unrecognized request argument supplied: %s", key);
    }
    return 0;
}

/* A copy of a JSON string's text into *out; -1 (a 500) when memory runs out. */
static int copy_string(json_t *str, char **out, rp_oai_error *err) {
    *out = strdup(json_string_value(str));
    return *out ? 0 : rp_oai_set_out_of_memory(err);
}

/* A body jansson could not load: malformed (400), or too big for memory
 * (500: jansson says so, or says nothing when its first allocation fails;
 * one that fails inside its lexer reads as a syntax error, a 400). */
static int bad_json(const json_error_t *jerr, rp_oai_error *err) {
    if (json_error_code(jerr) == json_error_out_of_memory || !jerr->text[0]) return rp_oai_set_out_of_memory(err);
    return BAD(NULL, "the request body is not valid JSON: %s (line %d)", jerr->text, jerr->line);
}

/* Optional number field in [lo, hi]; NaN-free. */
static int get_number(json_t *root, const char *key, double lo, double hi, float *out, rp_oai_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return BAD(key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi) return BAD(key, "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = (float)d;
    return 0;
}

/* Whether v is an integer: 4 or 4.0 (an integral number, as OpenAI's and
 * vLLM's servers take; 4.5 is not), exact up to 2^53. */
static int as_integer(const json_t *v, json_int_t *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (!json_is_real(v)) return 0;
    double d = json_real_value(v);
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) return 0;
    *out = (json_int_t)d;
    return 1;
}

/* Whether v is an integer in [lo, hi]. */
static int integer_in(const json_t *v, json_int_t lo, json_int_t hi, json_int_t *out) {
    return as_integer(v, out) && *out >= lo && *out <= hi;
}

static int get_int(json_t *root, const char *key, long lo, long hi, int *out, int *set, rp_oai_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    json_int_t x;
    if (!as_integer(v, &x)) return BAD(key, "'%s' must be an integer", key);
    if (x < lo || x > hi) return BAD(key, "'%s' must be in [%ld, %ld], got %lld", key, lo, hi, (long long)x);
    *out = (int)x;
    if (set) *set = 1;
    return 0;
}

static int get_bool(json_t *root, const char *key, int *out, rp_oai_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD(key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Text of a message's content: a string, or a list of {"type":"text"} parts
 * (joined without a separator). A JSON string, or NULL with err set. */
static json_t *content_text(json_t *content, const char *param, rp_oai_error *err) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        BAD(param, "'%s' must be a string or a list of text parts", param);
        return NULL;
    }
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            BAD(param, "only content parts of type \"text\" with a \"text\" string are supported");
            return NULL;
        }
        total += json_string_length(text);
    }
    char *s = malloc(total), *p = s;
    if (!s) {
        rp_oai_set_out_of_memory(err);
        return NULL;
    }
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    json_t *out = json_stringn_nocheck(s, (size_t)(p - s));
    free(s);
    if (!out) rp_oai_set_out_of_memory(err);
    return out;
}

/* A non-empty string field, or NULL. */
static const char *nonempty_string(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) && json_string_length(v) > 0 ? json_string_value(v) : NULL;
}

/* "tools": null/absent (*out NULL), or a list of {"type": "function",
 * "function": {"name", "description"?, "parameters"?, "strict"?}}, given to
 * the template as the request wrote it (transformers takes OpenAI's shape). */
static int check_tools(json_t *root, json_t **out, rp_oai_error *err) {
    json_t *tools = json_object_get(root, "tools");
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return BAD("tools", "'tools' must be a list of function tools");
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        char param[96];
        snprintf(param, sizeof param, "tools.[%zu]", i);
        json_t *type = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
        if (!json_is_object(tool) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return BAD(param, "'%s' must be an object with \"type\": \"function\" (the only tool type)", param);
        if (!json_is_object(fn)) return BAD(strcat(param, ".function"), "'%s' must be an object", param);
        if (!nonempty_string(fn, "name"))
            return BAD(strcat(param, ".function.name"), "'%s' must be a non-empty string", param);
        json_t *desc = json_object_get(fn, "description"), *params = json_object_get(fn, "parameters"),
               *strict = json_object_get(fn, "strict");
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return BAD(strcat(param, ".function.description"), "'%s' must be a string", param);
        if (params && !json_is_null(params) && !json_is_object(params))
            return BAD(strcat(param, ".function.parameters"), "'%s' must be a JSON Schema object", param);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return BAD(strcat(param, ".function.strict"), "'%s' must be a boolean", param);
    }
    *out = tools;
    return 0;
}

/* "tool_choice" and "parallel_tool_calls". "auto" (the default when there
 * are tools) only on a server with a tool-call parser and
 * --enable-auto-tool-choice (as vLLM), and it sets out->parse_tools;
 * "none" leaves the text alone; "required" and a named function constrain
 * the answer to calls as JSON (rp_oai_force_tools: any server, as vLLM),
 * "required" to one call when parallel_tool_calls is false. Under "auto"
 * with parallel_tool_calls false the first call the model writes is
 * returned and any later one dropped (out->single_call). */
static int check_tool_choice(const rp_oai_context *ctx, json_t *root, json_t *tools, rp_oai_request *out,
                             rp_oai_error *err) {
    int parallel = 1;
    if (get_bool(root, "parallel_tool_calls", &parallel, err)) return -1;
    json_t *tc = json_object_get(root, "tool_choice");
    int none = json_is_string(tc) && !strcmp(json_string_value(tc), "none");
    int is_auto = !tc || json_is_null(tc) || (json_is_string(tc) && !strcmp(json_string_value(tc), "auto"));
    if (is_auto && json_array_size(tools) > 0) { /* vLLM's rule: "auto" needs both flags */
        if (!ctx->has_tool_parser || !ctx->auto_tool_choice)
            return BAD("tool_choice", "\"auto\" tool choice (the default with 'tools') requires the server to run "
                                      "with --enable-auto-tool-choice and --tool-call-parser (hermes, llama3_json "
                                      "or mistral); or send \"tool_choice\": \"none\"");
        out->parse_tools = 1;
        out->tool_parser = ctx->tool_parser;
        out->single_call = !parallel;
    }
    if (!tc || json_is_null(tc) || none || is_auto) return 0;
    if (json_is_string(tc)) {
        const char *c = json_string_value(tc);
        if (!strcmp(c, "required")) {
            if (json_array_size(tools) == 0) return BAD("tool_choice", "\"tool_choice\": \"required\" needs 'tools'");
            return rp_oai_force_tools(ctx, tools, NULL, parallel, out, err);
        }
        return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"%s\"", c);
    }
    json_t *type = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
    const char *name = json_is_object(fn) ? nonempty_string(fn, "name") : NULL;
    if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0 || !name)
        return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    size_t i;
    json_t *tool;
    int found = 0;
    json_array_foreach(tools, i, tool) {
        const char *n = nonempty_string(json_object_get(tool, "function"), "name");
        found |= n && !strcmp(n, name);
    }
    if (!found) return BAD("tool_choice", "'tool_choice' names the function '%s', which is not in 'tools'", name);
    return rp_oai_force_tools(ctx, tools, name, parallel, out, err);
}

/* An assistant message's "tool_calls", checked, into m; their ids are added
 * to seen (for the tool messages after them). Each call's arguments, a JSON
 * string in OpenAI's API, reach the template parsed (a mapping), as vLLM
 * passes them and as tool-calling templates expect (Llama 3.1's writes
 * `arguments | tojson`; Qwen's and Hermes' take a string or a mapping). */
static int copy_tool_calls(json_t *calls, size_t mi, json_t *m, json_t *seen, rp_oai_error *err) {
    char param[96];
    snprintf(param, sizeof param, "messages.[%zu].tool_calls", mi);
    if (!json_is_array(calls)) return BAD(param, "'%s' must be a list", param);
    json_t *out = json_array();
    if (!out || json_object_set_new(m, "tool_calls", out)) return rp_oai_set_out_of_memory(err);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        snprintf(param, sizeof param, "messages.[%zu].tool_calls.[%zu]", mi, i);
        json_t *type = json_object_get(call, "type"), *fn = json_object_get(call, "function");
        const char *id = json_is_object(call) ? nonempty_string(call, "id") : NULL;
        if (!id) return BAD(strcat(param, ".id"), "'%s' must be a non-empty string", param);
        if (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "function")))
            return BAD(strcat(param, ".type"), "'%s' must be \"function\"", param);
        if (!json_is_object(fn) || !nonempty_string(fn, "name"))
            return BAD(strcat(param, ".function"), "'%s' must be an object with a non-empty string 'name'", param);
        json_t *args = json_object_get(fn, "arguments"), *parsed;
        if (json_is_string(args)) {
            json_error_t je;
            parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je);
            if (!parsed)
                return BAD(strcat(param, ".function.arguments"), "'%s' is not valid JSON: %s", param, je.text);
        } else if (json_is_object(args)) {
            parsed = json_incref(args);
        } else {
            return BAD(strcat(param, ".function.arguments"), "'%s' must be a JSON string", param);
        }
        json_t *copy = json_pack("{s:s,s:s,s:{s:O,s:o}}", "id", id, "type", "function", "function", "name",
                                 json_object_get(fn, "name"), "arguments", parsed);
        if (!copy || json_array_append_new(out, copy) || json_object_set_new(seen, id, json_true()))
            return rp_oai_set_out_of_memory(err);
    }
    return 0;
}

/* The conversation as the template sees it: every message checked; roles
 * system, user, assistant, tool, and developer (as system, OpenAI's newer
 * name for it); content as a string (null: ""); an assistant's tool_calls;
 * a tool message's tool_call_id, which must answer an earlier call; name
 * and an assistant's reasoning_content kept. */
static json_t *template_messages(json_t *msgs, rp_oai_error *err) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        BAD("messages", "'messages' must be a non-empty list");
        return NULL;
    }
    json_t *out = json_array(), *seen = json_object(), *msg;
    size_t i;
    if (!out || !seen) goto oom;
    json_array_foreach(msgs, i, msg) {
        char param[96];
        snprintf(param, sizeof param, "messages.[%zu].role", i);
        json_t *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role)) {
            BAD(param, "each message needs a string 'role'");
            goto fail;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") &&
            strcmp(r, "tool")) {
            BAD(param, "unsupported role '%s' (system, developer, user, assistant, tool)", r);
            goto fail;
        }
        json_t *m = json_object();
        if (!m || json_array_append_new(out, m) ||
            json_object_set_new(m, "role", json_string(!strcmp(r, "developer") ? "system" : r)))
            goto oom;
        json_t *content = json_object_get(msg, "content"), *text;
        snprintf(param, sizeof param, "messages.[%zu].content", i);
        if (!content || json_is_null(content)) text = json_string("");
        else if (!(text = content_text(content, param, err))) goto fail;
        if (!text || json_object_set_new(m, "content", text)) goto oom;
        json_t *name = json_object_get(msg, "name");
        if (name && !json_is_null(name)) {
            snprintf(param, sizeof param, "messages.[%zu].name", i);
            if (!json_is_string(name)) {
                BAD(param, "'%s' must be a string", param);
                goto fail;
            }
            if (json_object_set(m, "name", name)) goto oom;
        }
        json_t *calls = json_object_get(msg, "tool_calls");
        if (calls && !json_is_null(calls)) {
            if (strcmp(r, "assistant")) {
                snprintf(param, sizeof param, "messages.[%zu].tool_calls", i);
                BAD(param, "only assistant messages carry 'tool_calls'");
                goto fail;
            }
            if (copy_tool_calls(calls, i, m, seen, err)) goto fail;
        }
        json_t *reasoning = json_object_get(msg, "reasoning_content");
        if (!strcmp(r, "assistant") && json_is_string(reasoning) && json_object_set(m, "reasoning_content", reasoning))
            goto oom;
        if (!strcmp(r, "tool")) {
            snprintf(param, sizeof param, "messages.[%zu].tool_call_id", i);
            const char *id = nonempty_string(msg, "tool_call_id");
            if (!id) {
                BAD(param, "a tool message needs 'tool_call_id', the id of the call it answers");
                goto fail;
            }
            if (!json_object_get(seen, id)) {
                BAD(param, "'%s' is '%s', which no earlier assistant tool call has as its id", param, id);
                goto fail;
            }
            if (json_object_set(m, "tool_call_id", json_object_get(msg, "tool_call_id"))) goto oom;
        }
    }
    json_decref(seen);
    return out;
oom:
    rp_oai_set_out_of_memory(err);
fail:
    json_decref(out);
    json_decref(seen);
    return NULL;
}

/* Renders "messages" (with "tools" and "chat_template_kwargs") with the
 * model's chat template into *text. A template's raise_exception is the
 * client's 400 with the template's own message; any other render error is a
 * 400 too (the conversation is what the template could not take). */
static int render_messages(const rp_oai_context *ctx, json_t *root, int add_generation_prompt, char **text,
                           rp_oai_error *err) {
    json_t *tools, *msgs = template_messages(json_object_get(root, "messages"), err);
    if (!msgs) return -1;
    int rc = -1;
    if (!ctx->tok) {
        BAD("messages", "this model has no tokenizer, so it cannot take chat messages");
        goto out;
    }
    if (check_tools(root, &tools, err)) goto out;
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (kw && json_is_null(kw)) kw = NULL;
    if (kw && !json_is_object(kw)) {
        BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        goto out;
    }
    rp_err e;
    const int r = rp_chat_render(ctx->tok, msgs, tools, add_generation_prompt, kw, text, NULL, &e);
    if (r == RP_TEMPLATE_RAISED) {
        rp_oai_set_error(err, 400, "invalid_request_error", "messages", NULL, "%s", e.msg);
        goto out;
    }
    if (r) {
        BAD("messages", "%s", e.msg);
        goto out;
    }
    rc = 0;
out:
    json_decref(msgs);
    return rc;
}

static int alloc_prompts(rp_oai_request *out, int n, rp_oai_error *err) {
    out->prompt_texts = calloc((size_t)n, sizeof *out->prompt_texts);
    out->prompt_ids = calloc((size_t)n, sizeof *out->prompt_ids);
    out->num_prompt_ids = calloc((size_t)n, sizeof *out->num_prompt_ids);
    out->num_prompts = n;
    if (!out->prompt_texts || !out->prompt_ids || !out->num_prompt_ids) return rp_oai_set_out_of_memory(err);
    return 0;
}

/* A list of token ids (one prompt) into ids[k]. */
static int ids_prompt(json_t *arr, rp_oai_request *out, int k, rp_oai_error *err) {
    size_t n = json_array_size(arr), i;
    if (n == 0) return BAD("prompt", "a prompt of token ids must not be empty");
    out->prompt_ids[k] = malloc(n * sizeof **out->prompt_ids);
    if (!out->prompt_ids[k]) return rp_oai_set_out_of_memory(err);
    json_t *v;
    json_array_foreach(arr, i, v) {
        json_int_t id;
        if (!integer_in(v, 0, 0x7fffffff, &id)) return BAD("prompt", "token ids in 'prompt' must be non-negative integers");
        out->prompt_ids[k][i] = (int32_t)id;
    }
    out->num_prompt_ids[k] = (int)n;
    return 0;
}

/* "prompt": a string, a list of strings, a list of token ids, or a list of
 * lists of token ids (OpenAI's four forms). */
static int parse_prompt(json_t *root, rp_oai_request *out, rp_oai_error *err) {
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) return BAD("prompt", "'prompt' is required");
    if (json_is_string(p)) {
        if (alloc_prompts(out, 1, err)) return -1;
        return copy_string(p, &out->prompt_texts[0], err);
    }
    if (!json_is_array(p)) return BAD("prompt", "'prompt' must be a string, a list of strings, a list of token ids "
                                                "or a list of lists of token ids");
    size_t n = json_array_size(p), i;
    if (n == 0) return BAD("prompt", "'prompt' must not be empty");
    json_t *first = json_array_get(p, 0), *v;
    json_int_t first_id;
    if (as_integer(first, &first_id)) {
        if (alloc_prompts(out, 1, err)) return -1;
        return ids_prompt(p, out, 0, err);
    }
    if (n > RP_OAI_MAX_CHOICES) return BAD("prompt", "at most %d prompts in one request", RP_OAI_MAX_CHOICES);
    if (alloc_prompts(out, (int)n, err)) return -1;
    json_array_foreach(p, i, v) {
        if (json_is_string(v)) {
            if (copy_string(v, &out->prompt_texts[i], err)) return -1;
        } else if (json_is_array(v)) {
            if (ids_prompt(v, out, (int)i, err)) return -1;
        } else {
            return BAD("prompt", "a list of prompts must hold strings or lists of token ids");
        }
    }
    return 0;
}

/* A logit_bias key: a token id written as a decimal integer ("50256"). */
static int bias_key(const char *key, long *id) {
    char *end;
    if (!*key || (*key != '-' && (*key < '0' || *key > '9'))) return 0;
    *id = strtol(key, &end, 10);
    return *end == 0;
}

/* "logit_bias": null, or {"token id": bias} with at most RP_MAX_LOGIT_BIAS
 * entries, ids in the vocabulary, biases numbers in [-100, 100] (OpenAI's
 * range; vLLM clamps instead). */
static int parse_logit_bias(const rp_oai_context *ctx, json_t *root, rp_oai_request *out, rp_oai_error *err) {
    json_t *bias = json_object_get(root, "logit_bias");
    if (!bias || json_is_null(bias)) return 0;
    if (!json_is_object(bias))
        return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    const size_t n = json_object_size(bias);
    if (n > RP_MAX_LOGIT_BIAS)
        return BAD("logit_bias", "'logit_bias' may have at most %d entries, got %zu", RP_MAX_LOGIT_BIAS, n);
    if (n == 0) return 0;
    out->bias_ids = malloc(n * sizeof *out->bias_ids);
    out->bias_values = malloc(n * sizeof *out->bias_values);
    if (!out->bias_ids || !out->bias_values) return rp_oai_set_out_of_memory(err);
    const char *key;
    json_t *v;
    int i = 0;
    json_object_foreach(bias, key, v) {
        long id;
        if (!bias_key(key, &id) || id < 0 || id >= ctx->vocab_size)
            return BAD("logit_bias", "'logit_bias' keys must be token ids in [0, %d), got '%s'", ctx->vocab_size,
                       key);
        if (!json_is_number(v)) return BAD("logit_bias", "'logit_bias' values must be numbers (token %s)", key);
        double d = json_number_value(v);
        if (!isfinite(d) || d < -100 || d > 100)
            return BAD("logit_bias", "'logit_bias' values must be in [-100, 100], got %g for token %s", d, key);
        out->bias_ids[i] = (int32_t)id;
        out->bias_values[i++] = (float)d;
    }
    out->params.logit_bias_ids = out->bias_ids;
    out->params.logit_bias = out->bias_values;
    out->params.num_logit_bias = i;
    return 0;
}

/* Prompt logprobs: vLLM's "prompt_logprobs" = N (not streamed, as vLLM),
 * and a completion's echo with logprobs; the engine computes the larger
 * number of alternatives the two ask. */
static int parse_prompt_logprobs(json_t *root, rp_oai_request *out, rp_oai_error *err) {
    int set = 0, n = 0;
    out->prompt_logprobs = -1;
    if (get_int(root, "prompt_logprobs", 0, RP_MAX_TOP_LOGPROBS, &n, &set, err)) return -1;
    if (set && out->stream)
        return BAD("prompt_logprobs", "'prompt_logprobs' is not available with \"stream\": true");
    if (set) out->prompt_logprobs = n;
    out->echo_logprobs = out->kind == RP_OAI_COMPLETION && out->echo && out->logprobs;
    rp_request_params *p = &out->params;
    p->prompt_logprobs = set || out->echo_logprobs;
    p->prompt_top_logprobs = set ? n : 0;
    if (out->echo_logprobs && p->top_logprobs > p->prompt_top_logprobs) p->prompt_top_logprobs = p->top_logprobs;
    return 0;
}

/* The fields that shape the output's text and the prompt, and those
 * replay refuses unless they ask for nothing (docs/server.md's table). */
static int parse_output_options(json_t *root, rp_oai_kind kind, rp_oai_request *out, rp_oai_error *err) {
    rp_request_params *p = &out->params;
    int skip_special = 1, spaces = 1, min_tokens = 0, best_of = out->n, set = 0;
    if (get_bool(root, "include_stop_str_in_output", &p->include_stop_str_in_output, err) ||
        get_bool(root, "skip_special_tokens", &skip_special, err) ||
        get_bool(root, "spaces_between_special_tokens", &spaces, err) ||
        get_int(root, "truncate_prompt_tokens", 1, 1 << 30, &out->truncate_prompt_tokens, NULL, err) ||
        get_int(root, "min_tokens", 0, 1 << 24, &min_tokens, NULL, err) ||
        get_int(root, "best_of", 1, RP_OAI_MAX_N, &best_of, &set, err))
        return -1;
    p->keep_special_tokens = !skip_special;
    /* the tokenizers replay reads decode as HF's fast tokenizers do, which
     * never put spaces between special tokens (vLLM's option acts only on
     * slow tokenizers) */
    if (!spaces)
        return BAD("spaces_between_special_tokens", "\"spaces_between_special_tokens\": false is not supported: "
                                                    "replay's tokenizers decode as Hugging Face's fast tokenizers, "
                                                    "which do not put spaces between special tokens");
    p->min_tokens = min_tokens; /* at most max_tokens: the engine checks, once chat's default is known */
    if (set && best_of != out->n) /* sampling best_of candidates and returning the n most likely */
        return BAD("best_of", "'best_of' must equal 'n' (%d) or be left out: replay does not rank candidates, "
                              "got %d", out->n, best_of);
    if (kind == RP_OAI_CHAT && out->echo) /* vLLM's chat echo (the last message first) */
        return BAD("echo", "'echo' in chat completions is not supported by replay yet");
    return 0;
}

int rp_oai_parse(const rp_oai_context *ctx, rp_oai_kind kind, const char *body, size_t len, rp_oai_request *out,
                 rp_oai_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->n = 1;
    rp_request_params_default(&out->params);
    out->params.max_tokens = kind == RP_OAI_COMPLETION ? 16 : 0;
    json_error_t jerr;
    /* a completion's prompt of ids is read by json_ids.c, the rest by jansson */
    rp_json_ids lifted;
    const int lift = kind == RP_OAI_COMPLETION ? rp_json_lift_prompt_ids(body, len, &lifted) : 0;
    if (lift < 0) return rp_oai_set_out_of_memory(err);
    json_t *root = lift ? json_loadb(lifted.rest, lifted.rest_len, 0, &jerr) : json_loadb(body, len, 0, &jerr);
    if (!root) {
        if (lift) { /* the error's position as the client wrote the body */
            rp_json_ids_free(&lifted);
            root = json_loadb(body, len, 0, &jerr);
            json_decref(root);
        }
        return bad_json(&jerr, err);
    }
    int rc = -1;
    if (!json_is_object(root)) {
        BAD(NULL, "the request body must be a JSON object");
        goto out;
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            BAD("model", "'model' must be a string");
            goto out;
        }
        if (strcmp(json_string_value(model), ctx->served_model) != 0) {
            rp_oai_set_error(err, 404, "invalid_request_error", "model", "model_not_found",
                             "The model '%s' does not exist (this server serves '%s')", json_string_value(model),
                             ctx->served_model);
            goto out;
        }
    }
    snprintf(out->model, sizeof out->model, "%s", ctx->served_model);
    rp_request_params *p = &out->params;
    if (ctx->sampling_defaults) { /* generation_config.json's, for what the request leaves unset (vLLM's default) */
        p->temperature = ctx->sampling_defaults->temperature;
        p->top_p = ctx->sampling_defaults->top_p;
        p->top_k = ctx->sampling_defaults->top_k;
        p->min_p = ctx->sampling_defaults->min_p;
        p->repetition_penalty = ctx->sampling_defaults->repetition_penalty;
    }
    int top_k = p->top_k;
    if (get_number(root, "temperature", 0, 1e6, &p->temperature, err) ||
        get_number(root, "top_p", 1e-9, 1, &p->top_p, err) || get_number(root, "min_p", 0, 1, &p->min_p, err) ||
        get_number(root, "presence_penalty", -2, 2, &p->presence_penalty, err) ||
        get_number(root, "frequency_penalty", -2, 2, &p->frequency_penalty, err) ||
        get_number(root, "repetition_penalty", 1e-6, 1e6, &p->repetition_penalty, err) ||
        get_int(root, "top_k", -1, 1 << 30, &top_k, NULL, err) ||
        get_int(root, "n", 1, RP_OAI_MAX_N, &out->n, NULL, err) ||
        get_int(root, "max_tokens", 1, 1 << 24, &p->max_tokens, &out->max_tokens_set, err) ||
        get_int(root, "max_completion_tokens", 1, 1 << 24, &p->max_tokens, &out->max_completion_tokens, err) ||
        get_bool(root, "stream", &out->stream, err) || get_bool(root, "ignore_eos", &p->ignore_eos, err) ||
        get_bool(root, "echo", &out->echo, err))
        goto out;
    p->top_k = top_k;
    out->max_tokens_set |= out->max_completion_tokens;
    if (parse_output_options(root, kind, out, err)) goto out;
    if (rp_oai_parse_structured(ctx, kind, root, out, err)) goto out;
    json_t *seed = json_object_get(root, "seed"); /* any 64-bit integer, as vLLM takes */
    if (seed && !json_is_null(seed)) {
        json_int_t sv;
        if (!as_integer(seed, &sv)) {
            BAD("seed", "'seed' must be an integer");
            goto out;
        }
        p->seed = (uint64_t)sv;
        p->has_seed = 1;
    }
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object");
            goto out;
        }
        const char *key;
        json_t *v;
        json_object_foreach(so, key, v) {
            if (strcmp(key, "include_usage") != 0 && strcmp(key, "continuous_usage_stats") != 0) {
                BAD("stream_options", "Unrecognized field in 'stream_options': %s", key);
                goto out;
            }
        }
        if (get_bool(so, "include_usage", &out->include_usage, err) ||
            get_bool(so, "continuous_usage_stats", &out->continuous_usage, err))
            goto out;
        if (!out->stream) { /* as vLLM: a likely client mistake, not something to ignore */
            BAD("stream_options", "'stream_options' is only allowed with \"stream\": true");
            goto out;
        }
    }
    /* logprobs: chat takes a boolean and top_logprobs = N alternatives;
     * completions take logprobs = N (OpenAI allows 0..5, vLLM up to its
     * max_logprobs, 20 by default, as here). */
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (kind == RP_OAI_CHAT) {
            if (get_bool(root, "logprobs", &out->logprobs, err)) goto out;
        } else {
            if (get_int(root, "logprobs", 0, RP_MAX_TOP_LOGPROBS, &p->top_logprobs, NULL, err)) goto out;
            out->logprobs = 1;
        }
    }
    if (kind == RP_OAI_CHAT) {
        if (get_int(root, "top_logprobs", 0, RP_MAX_TOP_LOGPROBS, &p->top_logprobs, NULL, err)) goto out;
        if (p->top_logprobs > 0 && !out->logprobs) {
            BAD("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
            goto out;
        }
    }
    p->logprobs = out->logprobs;
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            if (copy_string(stop, &out->stop_buf[0], err)) goto out;
            p->num_stop = 1;
        } else if (json_is_array(stop) && json_array_size(stop) <= RP_OAI_MAX_STOP) {
            size_t i;
            json_t *s;
            json_array_foreach(stop, i, s) {
                if (!json_is_string(s) || json_string_length(s) == 0) {
                    BAD("stop", "'stop' entries must be non-empty strings");
                    goto out;
                }
                if (copy_string(s, &out->stop_buf[i], err)) goto out;
            }
            p->num_stop = (int)json_array_size(stop);
        } else {
            BAD("stop", "'stop' must be a string or a list of at most %d strings", RP_OAI_MAX_STOP);
            goto out;
        }
        if (p->num_stop && !ctx->tok) {
            BAD("stop", "this model has no tokenizer, so stop strings cannot be matched");
            goto out;
        }
        p->stop = (const char *const *)out->stop_buf;
    }
    json_t *sti = json_object_get(root, "stop_token_ids"); /* vLLM's extension */
    if (sti && !json_is_null(sti)) {
        size_t i;
        json_t *v;
        if (!json_is_array(sti) || json_array_size(sti) > 8) {
            BAD("stop_token_ids", "'stop_token_ids' must be a list of at most 8 token ids");
            goto out;
        }
        json_array_foreach(sti, i, v) {
            json_int_t id;
            if (!integer_in(v, 0, ctx->vocab_size - 1, &id)) {
                BAD("stop_token_ids", "'stop_token_ids' must hold token ids in [0, %d)", ctx->vocab_size);
                goto out;
            }
            out->stop_ids[p->num_stop_ids++] = (int32_t)id;
        }
    }
    p->stop_ids = out->stop_ids;
    if (kind == RP_OAI_CHAT) {
        int add_gen = 1;
        json_t *tools;
        if (get_bool(root, "add_generation_prompt", &add_gen, err) || check_tools(root, &tools, err) ||
            check_tool_choice(ctx, root, tools, out, err) || alloc_prompts(out, 1, err) ||
            render_messages(ctx, root, add_gen, &out->prompt_texts[0], err))
            goto out;
        out->parse_reasoning = ctx->has_reasoning_parser;
        out->reasoning_parser = ctx->reasoning_parser;
        if (!p->ignore_eos) /* the model's end-of-turn tokens end the answer (ignore_eos: they do not) */
            p->num_stop_ids += rp_chat_stop_ids(ctx->tok, out->stop_ids + p->num_stop_ids, 8);
    } else if (parse_prompt(root, out, err)) {
        goto out;
    } else if (lift) { /* the placeholder [0] stands for the lifted ids */
        free(out->prompt_ids[0]);
        out->prompt_ids[0] = lifted.ids;
        out->num_prompt_ids[0] = lifted.num_ids;
        lifted.ids = NULL;
    }
    for (int i = 0; i < out->num_prompts; i++)
        if (out->prompt_texts[i] && !ctx->tok) {
            BAD("prompt", "this model has no tokenizer: send the prompt as token ids");
            goto out;
        }
    if ((long)out->num_prompts * out->n > RP_OAI_MAX_CHOICES) {
        BAD("n", "prompts x n must be at most %d, got %d x %d", RP_OAI_MAX_CHOICES, out->num_prompts, out->n);
        goto out;
    }
    if (parse_logit_bias(ctx, root, out, err) || parse_prompt_logprobs(root, out, err)) goto out;
    /* last, so that a known field's own error (a chat request with "prompt"
     * and no "messages") is the one reported */
    if (check_fields(root, kind == RP_OAI_CHAT ? F_CHAT : F_COMPLETION, err)) goto out;
    rc = 0;
out:
    json_decref(root);
    if (lift) rp_json_ids_free(&lifted);
    if (rc) rp_oai_request_free(out);
    return rc;
}

/* "model", when given, must name the served model. */
static int check_model(const rp_oai_context *ctx, json_t *root, rp_oai_error *err) {
    json_t *model = json_object_get(root, "model");
    if (!model || json_is_null(model)) return 0;
    if (!json_is_string(model)) return BAD("model", "'model' must be a string");
    if (strcmp(json_string_value(model), ctx->served_model) != 0) {
        rp_oai_set_error(err, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%s' does not exist (this server serves '%s')", json_string_value(model),
                         ctx->served_model);
        return -1;
    }
    return 0;
}

static json_t *load_object(const char *body, size_t len, rp_oai_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) {
        bad_json(&jerr, err);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        BAD(NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

int rp_oai_parse_tokenize(const rp_oai_context *ctx, const char *body, size_t len, rp_oai_tokenize *out,
                          rp_oai_error *err) {
    memset(out, 0, sizeof *out);
    json_t *root = load_object(body, len, err);
    if (!root) return -1;
    int rc = -1, add_special = 1, add_gen = 1;
    if (check_model(ctx, root, err) || get_bool(root, "add_special_tokens", &add_special, err) ||
        get_bool(root, "add_generation_prompt", &add_gen, err) ||
        get_bool(root, "return_token_strs", &out->return_token_strs, err))
        goto out;
    if (!ctx->tok) {
        BAD(NULL, "this model has no tokenizer");
        goto out;
    }
    json_t *prompt = json_object_get(root, "prompt");
    if (json_object_get(root, "messages")) {
        if (render_messages(ctx, root, add_gen, &out->text, err)) goto out;
        out->add_bos = 0; /* the template writes its own special tokens */
    } else if (json_is_string(prompt)) {
        if (copy_string(prompt, &out->text, err)) goto out;
        out->add_bos = add_special;
    } else {
        BAD("prompt", "'prompt' must be a string (or send 'messages')");
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc) rp_oai_tokenize_free(out);
    return rc;
}

void rp_oai_tokenize_free(rp_oai_tokenize *t) {
    free(t->text);
    t->text = NULL;
}

int rp_oai_parse_detokenize(const rp_oai_context *ctx, const char *body, size_t len, int32_t **ids_out, int *n_out,
                            rp_oai_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    json_t *root = load_object(body, len, err);
    if (!root) return -1;
    int rc = -1;
    json_t *t = json_object_get(root, "tokens"), *v;
    size_t i;
    if (check_model(ctx, root, err)) goto out;
    if (!ctx->tok) {
        BAD(NULL, "this model has no tokenizer");
        goto out;
    }
    if (!json_is_array(t)) {
        BAD("tokens", "'tokens' must be a list of token ids");
        goto out;
    }
    int32_t *ids = malloc((json_array_size(t) + 1) * sizeof *ids);
    if (!ids) {
        rp_oai_set_out_of_memory(err);
        goto out;
    }
    json_array_foreach(t, i, v) {
        json_int_t id;
        if (!integer_in(v, 0, ctx->vocab_size - 1, &id)) {
            free(ids);
            BAD("tokens", "'tokens' must hold token ids in [0, %d)", ctx->vocab_size);
            goto out;
        }
        ids[i] = (int32_t)id;
    }
    *ids_out = ids;
    *n_out = (int)json_array_size(t);
    rc = 0;
out:
    json_decref(root);
    return rc;
}
