/* OpenAI-compatible request parsing, independent of the HTTP library and
 * the engine thread: JSON in, validated engine requests out, or an error
 * with OpenAI's fields and the HTTP status it maps to (openai_json.c writes
 * it out, with the responses). */
#ifndef RP_SERVER_OPENAI_H
#define RP_SERVER_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "replay/engine.h"
#include "server/reasoning.h"
#include "server/tool_parse.h"

#define RP_OAI_MAX_N 128       /* choices per prompt */
#define RP_OAI_MAX_CHOICES 256 /* prompts x n in one request */
#define RP_OAI_MAX_STOP 16

typedef struct rp_oai_error {
    int status;         /* HTTP status */
    char message[512];
    char type[48];      /* invalid_request_error, authentication_error, ... */
    char param[48];     /* the offending field, or "" */
    char code[48];      /* model_not_found, ... or "" */
} rp_oai_error;

typedef enum rp_oai_kind { RP_OAI_COMPLETION = 0, RP_OAI_CHAT } rp_oai_kind;

typedef struct rp_oai_request {
    rp_oai_kind kind;
    char model[256];
    /* Completions take one prompt or a list of them (each a text or token
     * ids); chat has one, the rendered conversation. Owned. */
    int num_prompts;
    char **prompt_texts;   /* [num_prompts]: text, or NULL where the prompt is ids */
    int32_t **prompt_ids;  /* [num_prompts]: ids, or NULL */
    int *num_prompt_ids;   /* [num_prompts] */
    int n;
    int stream, include_usage, echo, logprobs;
    int continuous_usage;       /* stream_options.continuous_usage_stats: usage in every chunk */
    int truncate_prompt_tokens; /* > 0: only the prompt's last this many tokens are fed */
    char request_id[72];        /* the client's X-Request-Id (http.c sets it), or "" */
    int max_tokens_set;
    int max_completion_tokens; /* the limit came as "max_completion_tokens" (errors name it so) */
    rp_request_params params; /* sampling, max_tokens, ignore_eos; stop points into stop_buf */
    char *stop_buf[RP_OAI_MAX_STOP];
    char *constraint_text; /* params.constraint's text (openai_structured.h) */
    int32_t stop_ids[16];
    /* logit_bias, owned (params.logit_bias_* point here) */
    int32_t *bias_ids;
    float *bias_values;
    /* prompt logprobs: vLLM's prompt_logprobs = N (-1: not asked), and a
     * completion's echo with logprobs (the prompt's tokens lead its
     * logprobs); either sets params.prompt_logprobs */
    int prompt_logprobs;
    int echo_logprobs;
    /* Chat: how each choice's text is parsed (docs/tools.md). parse_tools:
     * the request has tools, tool_choice is "auto" (or absent) and the
     * server has a tool-call parser with --enable-auto-tool-choice;
     * parse_reasoning: the server has a reasoning parser. */
    int parse_tools, parse_reasoning;
    rp_tool_parser tool_parser;
    rp_reasoning_kind reasoning_parser;
    /* tool_choice "required" or a named function: the answer is constrained
     * to tool calls written as JSON (rp_oai_force_tools), and read back
     * into tool_calls (chat_choice.h) */
    rp_forced_tools forced_tools;
    int single_call; /* "auto" with parallel_tool_calls false: the first parsed call only */
    char forced_name[65]; /* RP_FORCED_NAMED's function (OpenAI's names: at most 64 characters) */
} rp_oai_request;

typedef struct rp_oai_context {
    const char *served_model; /* the model name clients must use */
    const struct rp_tokenizer *tok; /* for chat templates; may be NULL */
    /* temperature, top_p, top_k, min_p and repetition_penalty for a request
     * that leaves them unset (generation_config.json's); NULL: the engine's
     * defaults (rp_request_params_default) */
    const rp_request_params *sampling_defaults;
    int max_context;
    int vocab_size;
    /* --tool-call-parser, --enable-auto-tool-choice, --reasoning-parser */
    int has_tool_parser, auto_tool_choice, has_reasoning_parser;
    rp_tool_parser tool_parser;
    rp_reasoning_kind reasoning_parser;
} rp_oai_context;

/* Parses and validates a request body for the given endpoint. On failure
 * returns -1 with err filled (status 400 or 404). */
int rp_oai_parse(const rp_oai_context *ctx, rp_oai_kind kind, const char *body, size_t len, rp_oai_request *out,
                 rp_oai_error *err);
void rp_oai_request_free(rp_oai_request *r);

/* POST /tokenize: {"prompt": text, "add_special_tokens"} or {"messages",
 * "add_generation_prompt"} (vLLM's shape); text is the prompt or the
 * rendered conversation, add_bos whether BOS goes first. POST /detokenize:
 * {"tokens": [ids]}. Both check "model" like the generation endpoints. */
typedef struct rp_oai_tokenize {
    char *text;
    int add_bos;
    int return_token_strs;
} rp_oai_tokenize;
int rp_oai_parse_tokenize(const rp_oai_context *ctx, const char *body, size_t len, rp_oai_tokenize *out,
                          rp_oai_error *err);
void rp_oai_tokenize_free(rp_oai_tokenize *t);
int rp_oai_parse_detokenize(const rp_oai_context *ctx, const char *body, size_t len, int32_t **ids_out, int *n_out,
                            rp_oai_error *err);

/* A 400 invalid_request_error naming param; returns -1. */
int rp_oai_bad(rp_oai_error *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void rp_oai_set_error(rp_oai_error *err, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The server could not allocate: 500 server_error, "out of memory". Returns -1. */
int rp_oai_set_out_of_memory(rp_oai_error *err);

#endif
