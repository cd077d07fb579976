/* OpenAI's response JSON (openai_json.h): what a completion, a chat
 * completion, a streamed chunk, logprobs, usage and an error look like, with
 * vLLM's choices where OpenAI leaves room. Every jansson call that can fail
 * for lack of memory is checked: a builder gives a whole object or NULL. */
#include "server/openai_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *object_name(const rp_oai_response *r, int chunk) {
    if (r->kind == RP_OAI_CHAT) return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
}

/* "stop" for EOS, a stop id or a stop string (and a structured output
 * complete); "length" for max_tokens or the context; "grammar_dead_end" for
 * a structured output no token could continue (docs/structured.md); NULL
 * while running (an abort or error never reaches a client as a
 * finish_reason). */
const char *rp_oai_finish_reason(rp_finish f) {
    switch (f) {
    case RP_FINISH_REASON_STOP: return "stop";
    case RP_FINISH_REASON_LENGTH: return "length";
    case RP_FINISH_REASON_GRAMMAR: return "grammar_dead_end";
    case RP_FINISH_REASON_NONE:
    case RP_FINISH_REASON_ABORT:
    case RP_FINISH_REASON_ERROR: break;
    }
    return NULL;
}

json_t *rp_oai_usage(int prompt_tokens, int cached_tokens, int completion_tokens) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt_tokens, "completion_tokens",
                     completion_tokens, "total_tokens", prompt_tokens + completion_tokens, "prompt_tokens_details",
                     "cached_tokens", cached_tokens);
}

json_t *rp_oai_choice(const rp_oai_response *r, int index, const char *text, size_t len, json_t *logprobs,
                      rp_finish finish) {
    json_t *t = rp_oai_json_text(text, len), *lp = logprobs ? logprobs : json_null();
    if (r->kind == RP_OAI_CHAT)
        return json_pack("{s:i, s:{s:s, s:o}, s:o, s:s?}", "index", index, "message", "role", "assistant", "content",
                         t, "logprobs", lp, "finish_reason", rp_oai_finish_reason(finish));
    return json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "text", t, "logprobs", lp, "finish_reason",
                     rp_oai_finish_reason(finish));
}

json_t *rp_oai_completion(const rp_oai_response *r, json_t *choices, json_t *usage) {
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object", object_name(r, 0), "created",
                     (json_int_t)r->created, "model", r->model, "choices", choices, "usage", usage);
}

static json_t *chunk(const rp_oai_response *r, json_t *choice) {
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object", object_name(r, 1), "created",
                          (json_int_t)r->created, "model", r->model, "choices", choice);
    if (c && r->continuous_usage &&
        json_object_set_new(c, "usage", rp_oai_usage(r->usage_prompt_tokens, r->usage_cached_tokens,
                                                     r->usage_completion_tokens))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *rp_oai_chunk(const rp_oai_response *r, int index, const char *text, size_t len, rp_finish finish,
                     json_t *logprobs) {
    const char *fin = rp_oai_finish_reason(finish);
    json_t *lp = logprobs ? logprobs : json_null(), *choice;
    if (r->kind == RP_OAI_CHAT) {
        /* the last delta is empty when the finish brings no text */
        json_t *delta = fin && len == 0 ? json_object() : json_pack("{s:o}", "content", rp_oai_json_text(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "delta", delta, "logprobs", lp, "finish_reason",
                           fin);
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "text", rp_oai_json_text(text, len), "logprobs",
                           lp, "finish_reason", fin);
    }
    return chunk(r, choice);
}

json_t *rp_oai_role_chunk(const rp_oai_response *r, int index) {
    return chunk(r, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", index, "delta", "role", "assistant",
                              "content", "", "logprobs", "finish_reason"));
}

json_t *rp_oai_message_choice(int index, json_t *message, json_t *logprobs, const char *finish_reason) {
    return json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "message", message, "logprobs",
                     logprobs ? logprobs : json_null(), "finish_reason", finish_reason);
}

json_t *rp_oai_delta_chunk(const rp_oai_response *r, int index, json_t *delta, json_t *logprobs,
                           const char *finish_reason) {
    return chunk(r, json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "delta", delta, "logprobs",
                              logprobs ? logprobs : json_null(), "finish_reason", finish_reason));
}

json_t *rp_oai_usage_chunk(const rp_oai_response *r, json_t *usage) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object", object_name(r, 1), "created",
                     (json_int_t)r->created, "model", r->model, "choices", "usage", usage);
}

/* ---- logprobs ---------------------------------------------------------------- */

/* A logprob as JSON; -inf (a token the sampler could not have drawn) is
 * written as -9999.0, as vLLM does, since JSON has no infinity. */
static json_t *lp_real(float lp) { return json_real(isfinite(lp) ? (double)lp : -9999.0); }

/* A token's text as logprobs and /tokenize show it: its bytes (a piece of
 * a character shows as U+FFFD), or "token_id:N" without a tokenizer. */
static json_t *token_text(const rp_tokenizer *tok, int32_t id) {
    const char *bytes;
    size_t len;
    if (tok && rp_tokenizer_token_bytes(tok, id, &bytes, &len) == 0) return rp_oai_json_text(bytes, len);
    char name[32];
    snprintf(name, sizeof name, "token_id:%d", id); /* no tokenizer: vLLM's form for ids */
    return json_string(name);
}

/* Chat: {token, logprob, bytes} of one token. */
static json_t *chat_lp_item(const rp_oai_response *r, int32_t tok_id, float lp) {
    const char *b = NULL;
    size_t n = 0;
    if (r->tok && rp_tokenizer_token_bytes(r->tok, tok_id, &b, &n) != 0) n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(bytes, json_integer((unsigned char)b[i]))) {
            json_decref(bytes);
            return NULL;
        }
    return json_pack("{s:o, s:o, s:o}", "token", token_text(r->tok, tok_id), "logprob", lp_real(lp), "bytes",
                     bytes);
}

/* Chat: one entry of logprobs.content: the sampled token and, in
 * top_logprobs, the most likely ones (most likely first). */
static json_t *chat_lp_entry(const rp_oai_response *r, const rp_token_event *ev) {
    json_t *top = json_array();
    for (int i = 0; i < ev->num_top_logprobs && i < r->top_logprobs; i++)
        if (json_array_append_new(top, chat_lp_item(r, ev->top_ids[i], ev->top_logprobs[i]))) {
            json_decref(top);
            return NULL;
        }
    json_t *e = chat_lp_item(r, ev->token, ev->logprob);
    if (json_object_set_new(e, "top_logprobs", top)) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* Completions: {text: logprob} keeps the first entry of a text (two ids may
 * share one). */
static int cmpl_top_add(const rp_oai_response *r, json_t *obj, int32_t tok_id, float lp) {
    json_t *t = token_text(r->tok, tok_id);
    if (!t) return -1;
    const char *key = json_string_value(t);
    size_t key_len = json_string_length(t);
    int rc = json_object_getn(obj, key, key_len) ? 0 : json_object_setn_new(obj, key, key_len, lp_real(lp));
    json_decref(t);
    return rc;
}

/* Completions: the N most likely, then the sampled token (OpenAI: up to
 * N + 1 entries). */
static json_t *cmpl_top(const rp_oai_response *r, const rp_token_event *ev) {
    json_t *top = json_object();
    int rc = top ? 0 : -1;
    for (int i = 0; !rc && i < ev->num_top_logprobs && i < r->top_logprobs; i++)
        rc = cmpl_top_add(r, top, ev->top_ids[i], ev->top_logprobs[i]);
    if (!rc) rc = cmpl_top_add(r, top, ev->token, ev->logprob);
    if (rc) {
        json_decref(top);
        return NULL;
    }
    return top;
}

/* Completions: top_logprobs is a list (one {text: logprob} object per
 * token) when logprobs = N > 0, else null, as vLLM. */
json_t *rp_oai_logprobs_new(const rp_oai_response *r) {
    if (r->kind == RP_OAI_CHAT) return json_pack("{s:[]}", "content");
    return json_pack("{s:[], s:[], s:[], s:o}", "tokens", "token_logprobs", "text_offset", "top_logprobs",
                     r->top_logprobs > 0 ? json_array() : json_null());
}

int rp_oai_logprobs_add(const rp_oai_response *r, json_t *logprobs, const rp_token_event *ev, size_t text_offset) {
    if (r->kind == RP_OAI_CHAT) return json_array_append_new(json_object_get(logprobs, "content"), chat_lp_entry(r, ev));
    json_t *tops = json_object_get(logprobs, "top_logprobs");
    if (json_array_append_new(json_object_get(logprobs, "tokens"), token_text(r->tok, ev->token)) ||
        json_array_append_new(json_object_get(logprobs, "token_logprobs"), lp_real(ev->logprob)) ||
        json_array_append_new(json_object_get(logprobs, "text_offset"), json_integer((json_int_t)text_offset)))
        return -1;
    return json_is_array(tops) ? json_array_append_new(tops, cmpl_top(r, ev)) : 0;
}

/* Completions: a prompt token's {text: logprob}: its top alternatives, then the token. */
static json_t *cmpl_prompt_top(const rp_oai_response *r, const rp_prompt_logprob *e) {
    json_t *top = json_object();
    int rc = top ? 0 : -1;
    for (int i = 0; !rc && i < e->num_top && i < r->top_logprobs; i++)
        rc = cmpl_top_add(r, top, e->top_ids[i], e->top_logprobs[i]);
    if (!rc) rc = cmpl_top_add(r, top, e->token, e->logprob);
    if (rc) {
        json_decref(top);
        return NULL;
    }
    return top;
}

int rp_oai_logprobs_add_prompt(const rp_oai_response *r, json_t *logprobs, const rp_prompt_logprob *plp, int n,
                               size_t *offset) {
    json_t *tops = json_object_get(logprobs, "top_logprobs");
    for (int i = 0; i < n; i++) {
        const rp_prompt_logprob *e = &plp[i];
        json_t *text = token_text(r->tok, e->token);
        size_t len = text ? json_string_length(text) : 0;
        if (json_array_append_new(json_object_get(logprobs, "tokens"), text) ||
            json_array_append_new(json_object_get(logprobs, "token_logprobs"), i ? lp_real(e->logprob) : json_null()) ||
            json_array_append_new(json_object_get(logprobs, "text_offset"), json_integer((json_int_t)*offset)) ||
            (json_is_array(tops) && json_array_append_new(tops, i ? cmpl_prompt_top(r, e) : json_null())))
            return -1;
        *offset += len;
    }
    return 0;
}

/* {"id": {"logprob", "rank", "decoded_token"}} gains one token, unless it has it. */
static int prompt_lp_add(const rp_oai_response *r, json_t *obj, int32_t id, float lp, int rank) {
    char key[16];
    snprintf(key, sizeof key, "%d", id);
    if (json_object_get(obj, key)) return 0;
    return json_object_set_new(obj, key, json_pack("{s:o, s:i, s:o}", "logprob", lp_real(lp), "rank", rank,
                                                   "decoded_token", token_text(r->tok, id)));
}

json_t *rp_oai_prompt_logprobs_json(const rp_oai_response *r, const rp_prompt_logprob *plp, int n, int top) {
    json_t *list = json_array();
    if (!list || (n > 0 && json_array_append_new(list, json_null()))) goto fail;
    for (int i = 1; i < n; i++) {
        const rp_prompt_logprob *e = &plp[i];
        json_t *obj = json_object();
        if (json_array_append_new(list, obj)) goto fail;
        for (int j = 0; j < e->num_top && j < top; j++)
            if (prompt_lp_add(r, obj, e->top_ids[j], e->top_logprobs[j], j + 1)) goto fail;
        if (prompt_lp_add(r, obj, e->token, e->logprob, e->rank)) goto fail;
    }
    return list;
fail:
    json_decref(list);
    return NULL;
}

/* ---- framing, other endpoints ------------------------------------------------------ */

/* Where json_dump_callback writes. The failure is remembered here because
 * jansson (2.14) goes on after a failed write of an object's key: its own
 * json_dumps can return text with a key missing when memory runs out. */
typedef struct dump_sink {
    rp_sbuf *out;
    int failed;
} dump_sink;

static int dump_write(const char *buf, size_t n, void *data) {
    dump_sink *d = data;
    if (!d->failed && rp_sbuf_add(d->out, buf, n)) d->failed = 1;
    return d->failed ? -1 : 0;
}

/* Appends obj's compact JSON to out (takes obj); -1, out unchanged, when
 * obj is NULL or memory runs out. */
static int json_add(rp_sbuf *out, json_t *obj) {
    size_t mark = out->len;
    dump_sink d = {.out = out, .failed = !obj};
    if (!d.failed && json_dump_callback(obj, dump_write, &d, JSON_COMPACT)) d.failed = 1;
    json_decref(obj);
    if (d.failed) rp_sbuf_truncate(out, mark);
    return d.failed ? -1 : 0;
}

char *rp_oai_json_dumps(json_t *obj) {
    rp_sbuf b = {0};
    if (json_add(&b, obj)) rp_sbuf_free(&b);
    return b.p;
}

int rp_oai_sse_add(rp_sbuf *out, json_t *event) {
    size_t mark = out->len;
    if (rp_sbuf_add_str(out, "data: ") || json_add(out, event) || rp_sbuf_add_str(out, "\n\n")) {
        rp_sbuf_truncate(out, mark);
        return -1;
    }
    return 0;
}

json_t *rp_oai_tokenize_json(const rp_tokenizer *tok, int bos, const int32_t *ids, size_t n, int return_token_strs,
                             int max_model_len) {
    json_t *tokens = json_array(), *strs = return_token_strs ? json_array() : NULL;
    int failed = !tokens || (return_token_strs && !strs);
    for (size_t i = bos >= 0 ? 0 : 1; !failed && i <= n; i++) {
        int32_t id = i == 0 ? bos : ids[i - 1];
        failed = json_array_append_new(tokens, json_integer(id)) ||
                 (strs && json_array_append_new(strs, token_text(tok, id)));
    }
    json_t *out = failed ? NULL
                         : json_pack("{s:I, s:I, s:O}", "count", (json_int_t)json_array_size(tokens), "max_model_len",
                                     (json_int_t)max_model_len, "tokens", tokens);
    if (out && strs && json_object_set(out, "token_strs", strs)) {
        json_decref(out);
        out = NULL;
    }
    json_decref(tokens);
    json_decref(strs);
    return out;
}

json_t *rp_oai_model_json(const char *served_model, long created, int max_model_len, int vocab_size) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:I}", "id", served_model, "object", "model", "created",
                     (json_int_t)created, "owned_by", "replay", "root", served_model, "max_model_len",
                     (json_int_t)max_model_len, "vocab_size", (json_int_t)vocab_size);
}

json_t *rp_oai_models_json(const char *served_model, long created, int max_model_len, int vocab_size) {
    return json_pack("{s:s, s:[o]}", "object", "list", "data",
                     rp_oai_model_json(served_model, created, max_model_len, vocab_size));
}

/* Length of the valid UTF-8 character at s (at most n bytes), 0 if invalid. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    unsigned cp = c & (0xff >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

json_t *rp_oai_json_text(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    char *buf = malloc(n * 3 + 1); /* each invalid byte may become 3 bytes */
    if (!buf) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char_len(u + i, n - i);
        if (l && !(l == 1 && u[i] == 0)) {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        } else if (l == 1) { /* NUL: jansson takes it with a length */
            buf[o++] = 0;
            i++;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

/* ---- errors ------------------------------------------------------------------------ */

json_t *rp_oai_error_object(const rp_oai_error *err) {
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", err->message, "type", err->type, "param",
                     err->param[0] ? err->param : NULL, "code", err->code[0] ? err->code : NULL);
}

char *rp_oai_error_json(const rp_oai_error *err) {
    return rp_oai_json_dumps(rp_oai_error_object(err));
}

void rp_oai_engine_error(rp_oai_error *out, const rp_error *err, const rp_oai_request *q) {
    const char *param = err->param[0] ? err->param : NULL;
    if (param && q->kind == RP_OAI_CHAT && !strcmp(param, "prompt")) param = "messages";
    if (param && q->max_completion_tokens && !strcmp(param, "max_tokens")) param = "max_completion_tokens";
    switch (err->code) {
    case RP_ERROR_INVALID_REQUEST:
    case RP_ERROR_UNSUPPORTED:
        rp_oai_set_error(out, 400, "invalid_request_error", param, NULL, "%s", err->message);
        break;
    case RP_ERROR_CONTEXT_LENGTH: /* OpenAI's code for it (and vLLM's, lately) */
        rp_oai_set_error(out, 400, "invalid_request_error", param, "context_length_exceeded", "%s", err->message);
        break;
    case RP_ERROR_OUT_OF_MEMORY: /* the engine's host memory: try again later */
        rp_oai_set_error(out, 503, "service_unavailable", NULL, NULL, "%s", err->message);
        break;
    default:
        rp_oai_set_error(out, 500, "server_error", NULL, NULL, "%s", err->message[0] ? err->message : "engine error");
        break;
    }
}
