/* OpenAI request parsing (jansson) and error JSON. Every field is checked
 * for its type and range, with vLLM's meaning; unknown fields are ignored,
 * as vLLM and OpenAI's own server do. */
#include "server/openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

char *rp_oai_error_json(const rp_oai_error *err) {
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", err->message, "type", err->type, "param",
                          err->param[0] ? json_string(err->param) : json_null(), "code",
                          err->code[0] ? json_string(err->code) : json_null());
    json_t *root = json_pack("{s:o}", "error", e);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

const char *rp_oai_finish_name(rp_finish f) {
    switch (f) {
    case RP_FINISH_REASON_STOP: return "stop";
    case RP_FINISH_REASON_LENGTH: return "length";
    case RP_FINISH_REASON_ABORT: return "abort";
    case RP_FINISH_REASON_ERROR: return "error";
    default: return NULL;
    }
}

void rp_oai_request_free(rp_oai_request *r) {
    free(r->prompt_text);
    free(r->prompt_ids);
    for (int i = 0; i < RP_OAI_MAX_STOP; i++) free(r->stop_buf[i]);
    memset(r, 0, sizeof *r);
}

static int bad(rp_oai_error *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(rp_oai_error *err, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rp_oai_set_error(err, 400, "invalid_request_error", param, NULL, "%s", msg);
    return -1;
}
#define BAD(param, ...) bad(err, param, __VA_ARGS__)

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

static int get_int(json_t *root, const char *key, long lo, long hi, int *out, int *set, rp_oai_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return BAD(key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
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

/* Text of a message's content: a string, or a list of {"type":"text"} parts. */
static char *content_text(json_t *content, rp_oai_error *err) {
    if (json_is_string(content)) return strdup(json_string_value(content));
    if (!json_is_array(content)) {
        BAD("messages", "message content must be a string or a list of text parts");
        return NULL;
    }
    size_t total = 1, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            BAD("messages", "only content parts of type \"text\" with a \"text\" string are supported");
            return NULL;
        }
        total += json_string_length(text);
    }
    char *s = malloc(total), *p = s;
    if (!s) return NULL;
    json_array_foreach(content, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    *p = 0;
    return s;
}

static int parse_messages(const rp_oai_context *ctx, json_t *root, rp_oai_request *out, rp_oai_error *err) {
    json_t *msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return BAD("messages", "'messages' must be a non-empty list");
    if (!ctx->tok) return BAD("messages", "this model has no tokenizer, so it cannot take chat messages");
    size_t n = json_array_size(msgs), i;
    rp_chat_message *m = calloc(n, sizeof *m);
    char **texts = calloc(n, sizeof *texts);
    int rc = -1;
    json_t *msg;
    json_array_foreach(msgs, i, msg) {
        json_t *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role)) {
            BAD("messages", "each message needs a string 'role'");
            goto out;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer")) {
            BAD("messages", "unsupported role '%s' (system, user, assistant)", r);
            goto out;
        }
        json_t *content = json_object_get(msg, "content");
        if (!content || json_is_null(content)) {
            texts[i] = strdup("");
        } else if (!(texts[i] = content_text(content, err))) {
            goto out;
        }
        m[i].role = !strcmp(r, "developer") ? "system" : r;
        m[i].content = texts[i];
    }
    int thinking = -1;
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (json_is_object(kw) && json_is_boolean(json_object_get(kw, "enable_thinking")))
        thinking = json_is_true(json_object_get(kw, "enable_thinking"));
    rp_err e;
    if (rp_chat_render(ctx->tok, m, (int)n, 1, thinking, &out->prompt_text, &e)) {
        BAD("messages", "%s", e.msg);
        goto out;
    }
    out->num_prompt_ids = 0;
    int32_t ids[8];
    int ns = rp_chat_stop_ids(ctx->tok, ids, 8);
    for (int k = 0; k < ns && k < 16; k++) out->stop_ids[k] = ids[k];
    out->params.stop_ids = out->stop_ids;
    out->params.num_stop_ids = ns;
    rc = 0;
out:
    for (size_t k = 0; k < n; k++) free(texts[k]);
    free(texts);
    free(m);
    return rc;
}

static int parse_prompt(json_t *root, rp_oai_request *out, rp_oai_error *err) {
    json_t *p = json_object_get(root, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && (json_is_string(json_array_get(p, 0)) ||
                                                        json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* a list of one prompt */
    if (json_is_string(p)) {
        out->prompt_text = strdup(json_string_value(p));
        return 0;
    }
    if (json_is_array(p)) {
        size_t n = json_array_size(p), i;
        if (n == 0) return BAD("prompt", "'prompt' is empty");
        json_t *v;
        out->prompt_ids = malloc(n * sizeof *out->prompt_ids);
        json_array_foreach(p, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
                return BAD("prompt", "'prompt' must be a string, a list of token ids, or a list of one of those");
            out->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        out->num_prompt_ids = (int)n;
        return 0;
    }
    return BAD("prompt", "'prompt' must be a string or a list of token ids (one prompt per request)");
}

int rp_oai_parse(const rp_oai_context *ctx, rp_oai_kind kind, const char *body, size_t len, rp_oai_request *out,
                 rp_oai_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->n = 1;
    rp_request_params_default(&out->params);
    out->params.max_tokens = kind == RP_OAI_COMPLETION ? 16 : 0;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!root) return BAD(NULL, "the request body is not valid JSON: %s (line %d)", jerr.text, jerr.line);
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
            rp_oai_set_error(err, 404, "NotFoundError", "model", "model_not_found",
                             "The model '%s' does not exist (this server serves '%s')", json_string_value(model),
                             ctx->served_model);
            goto out;
        }
    }
    snprintf(out->model, sizeof out->model, "%s", ctx->served_model);
    rp_request_params *p = &out->params;
    int seed = 0, seed_set = 0, top_k = 0;
    if (get_number(root, "temperature", 0, 1e6, &p->temperature, err) ||
        get_number(root, "top_p", 1e-9, 1, &p->top_p, err) || get_number(root, "min_p", 0, 1, &p->min_p, err) ||
        get_number(root, "presence_penalty", -2, 2, &p->presence_penalty, err) ||
        get_number(root, "frequency_penalty", -2, 2, &p->frequency_penalty, err) ||
        get_number(root, "repetition_penalty", 1e-6, 1e6, &p->repetition_penalty, err) ||
        get_int(root, "top_k", -1, 1 << 30, &top_k, NULL, err) ||
        get_int(root, "seed", -2147483647L - 1, 2147483647L, &seed, &seed_set, err) ||
        get_int(root, "n", 1, RP_OAI_MAX_N, &out->n, NULL, err) ||
        get_int(root, "max_tokens", 1, 1 << 24, &p->max_tokens, &out->max_tokens_set, err) ||
        get_int(root, "max_completion_tokens", 1, 1 << 24, &p->max_tokens, &out->max_tokens_set, err) ||
        get_bool(root, "stream", &out->stream, err) || get_bool(root, "ignore_eos", &p->ignore_eos, err) ||
        get_bool(root, "echo", &out->echo, err))
        goto out;
    p->top_k = top_k;
    if (seed_set) {
        p->seed = (uint64_t)(int64_t)seed;
        p->has_seed = 1;
    }
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object");
            goto out;
        }
        if (get_bool(so, "include_usage", &out->include_usage, err)) goto out;
    }
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (kind == RP_OAI_CHAT ? !json_is_boolean(lp) : !json_is_integer(lp)) {
            BAD("logprobs", kind == RP_OAI_CHAT ? "'logprobs' must be a boolean" : "'logprobs' must be an integer");
            goto out;
        }
        if (kind == RP_OAI_COMPLETION && json_integer_value(lp) > 0) {
            BAD("logprobs", "only the sampled token's logprob is available: 'logprobs' must be 0 or absent");
            goto out;
        }
        out->logprobs = kind == RP_OAI_CHAT ? json_is_true(lp) : 1;
    }
    json_t *tlp = json_object_get(root, "top_logprobs");
    if (tlp && !json_is_null(tlp) && (!json_is_integer(tlp) || json_integer_value(tlp) != 0)) {
        BAD("top_logprobs", "'top_logprobs' is not supported (only 0)");
        goto out;
    }
    p->logprobs = out->logprobs;
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            out->stop_buf[0] = strdup(json_string_value(stop));
            p->num_stop = 1;
        } else if (json_is_array(stop) && json_array_size(stop) <= RP_OAI_MAX_STOP) {
            size_t i;
            json_t *s;
            json_array_foreach(stop, i, s) {
                if (!json_is_string(s) || json_string_length(s) == 0) {
                    BAD("stop", "'stop' entries must be non-empty strings");
                    goto out;
                }
                out->stop_buf[i] = strdup(json_string_value(s));
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
    if (kind == RP_OAI_CHAT) {
        if (parse_messages(ctx, root, out, err)) goto out;
        if (out->echo) out->echo = 0; /* completions only */
    } else if (parse_prompt(root, out, err)) {
        goto out;
    }
    if (out->prompt_text && !ctx->tok) {
        BAD("prompt", "this model has no tokenizer: send the prompt as token ids");
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    if (rc) rp_oai_request_free(out);
    return rc;
}
