/* OpenAI's response shapes as JSON: completion and chat objects, streamed
 * chunks and their Server-Sent Events framing, usage, logprobs, the
 * /tokenize and /v1/models answers, and errors (an engine rp_error mapped
 * to the status, type, param and code a client gets). No engine thread, no
 * network: session.c and http.c call these and send what they return.
 *
 * Builders return a new reference, or NULL when memory runs out (never a
 * partial object); json_t arguments documented as taken are released even
 * on failure. */
#ifndef RP_SERVER_OPENAI_JSON_H
#define RP_SERVER_OPENAI_JSON_H

#include <jansson.h>

#include "replay/engine.h"
#include "server/openai.h"
#include "server/sbuf.h"

struct rp_tokenizer;

/* What the objects of one response share. */
typedef struct rp_oai_response {
    rp_oai_kind kind;
    char id[96]; /* cmpl-... or chatcmpl-..., with the client's X-Request-Id when it sent one */
    long created;
    char model[256];
    const struct rp_tokenizer *tok; /* token texts in logprobs; NULL: "token_id:N" */
    int top_logprobs;               /* alternatives per token */
    /* stream_options.continuous_usage_stats: every chunk carries usage, these
     * numbers (of the choice the chunk belongs to, as vLLM counts them) */
    int continuous_usage;
    int usage_prompt_tokens, usage_cached_tokens, usage_completion_tokens;
} rp_oai_response;

/* usage: prompt_tokens (cached_tokens among them, OpenAI's
 * prompt_tokens_details.cached_tokens: always there, 0 when nothing was
 * cached), completion_tokens and their total. */
json_t *rp_oai_usage(int prompt_tokens, int cached_tokens, int completion_tokens);

/* One choice of the non-streaming answer, and the answer (takes logprobs,
 * NULL for null; takes choices and usage). */
json_t *rp_oai_choice(const rp_oai_response *r, int index, const char *text, size_t len, json_t *logprobs,
                      rp_finish finish);
json_t *rp_oai_completion(const rp_oai_response *r, json_t *choices, json_t *usage);

/* Streamed chunks: one token's text (may be empty) with its finish and
 * logprobs (taken; NULL for null); chat's first chunk of a choice (the
 * role); the last chunk with usage (taken) and no choices. */
json_t *rp_oai_chunk(const rp_oai_response *r, int index, const char *text, size_t len, rp_finish finish,
                     json_t *logprobs);
json_t *rp_oai_role_chunk(const rp_oai_response *r, int index);
/* Chat's parts, for choices whose text the tool-call and reasoning parsers
 * split (chat_choice.c): a choice with its message (taken; logprobs taken,
 * NULL for null), and a chunk with its delta (taken). finish_reason: NULL
 * for null, or rp_oai_finish_reason's, or "tool_calls". */
json_t *rp_oai_message_choice(int index, json_t *message, json_t *logprobs, const char *finish_reason);
json_t *rp_oai_delta_chunk(const rp_oai_response *r, int index, json_t *delta, json_t *logprobs,
                           const char *finish_reason);
/* "stop", "length", or NULL (running, or ended by an abort or error). */
const char *rp_oai_finish_reason(rp_finish f);
json_t *rp_oai_usage_chunk(const rp_oai_response *r, json_t *usage);

/* A logprobs object with no tokens (chat: {"content": []}; completions:
 * tokens, token_logprobs, text_offset, top_logprobs), and one token added to
 * it (text_offset: the choice's text bytes before this token). -1 when
 * memory runs out; the object is then incomplete and must be dropped. */
json_t *rp_oai_logprobs_new(const rp_oai_response *r);
int rp_oai_logprobs_add(const rp_oai_response *r, json_t *logprobs, const rp_token_event *ev, size_t text_offset);

/* Prompt logprobs (entries [n], entry i for prompt token i, the first
 * without a logprob; rp_prompt_logprob). A completion's echo: the prompt's
 * tokens appended to a completions logprobs object as its first tokens
 * (token_logprobs and top_logprobs null for the first; top_logprobs the
 * response's top_logprobs alternatives and the token; text_offset from
 * *offset, which advances by each token's bytes). -1 when memory runs out. */
int rp_oai_logprobs_add_prompt(const rp_oai_response *r, json_t *logprobs, const rp_prompt_logprob *plp, int n,
                               size_t *offset);
/* vLLM's prompt_logprobs list: null, then for each later token {"id":
 * {"logprob", "rank", "decoded_token"}} of its top alternatives (ranks 1..
 * top) and the token itself (its own rank). NULL when memory runs out. */
json_t *rp_oai_prompt_logprobs_json(const rp_oai_response *r, const rp_prompt_logprob *plp, int n, int top);

/* Compact JSON text of obj (takes obj) as a malloc'd string; NULL when obj
 * is NULL or memory runs out. Use it, not json_dumps, which can drop a key
 * when memory runs out. */
char *rp_oai_json_dumps(json_t *obj);
/* Appends "data: {event}\n\n" (takes event). -1, out unchanged, when event
 * is NULL or memory runs out. */
int rp_oai_sse_add(rp_sbuf *out, json_t *event);

/* A JSON string from bytes that may not be valid UTF-8 (one token's bytes
 * can be part of a character): each invalid byte becomes U+FFFD. */
json_t *rp_oai_json_text(const char *s, size_t n);

/* POST /tokenize's answer (vLLM's shape): bos (>= 0) first, then ids;
 * token_strs when asked. */
json_t *rp_oai_tokenize_json(const struct rp_tokenizer *tok, int bos, const int32_t *ids, size_t n,
                             int return_token_strs, int max_model_len);
/* GET /v1/models: the served model. */
/* One model object (GET /v1/models/{id}), and the list of the one served. */
json_t *rp_oai_model_json(const char *served_model, long created, int max_model_len, int vocab_size);
json_t *rp_oai_models_json(const char *served_model, long created, int max_model_len, int vocab_size);

/* {"error": {...}} as an object, or as a malloc'd string. */
json_t *rp_oai_error_object(const rp_oai_error *err);
char *rp_oai_error_json(const rp_oai_error *err);
/* An engine error (rp_engine_submit's) as the client sees it, named with
 * the request's own field names (a chat's "prompt" is its "messages"):
 *   INVALID_REQUEST, UNSUPPORTED  400 invalid_request_error, the engine's param
 *   CONTEXT_LENGTH                400 invalid_request_error, the param, code context_length_exceeded
 *   OUT_OF_MEMORY                 503 service_unavailable
 *   INTERNAL (or anything else)   500 server_error */
void rp_oai_engine_error(rp_oai_error *out, const rp_error *err, const rp_oai_request *q);

#endif
