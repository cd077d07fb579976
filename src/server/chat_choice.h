/* A chat choice's text as OpenAI's message when the server runs a
 * tool-call parser and/or a reasoning parser (docs/tools.md): the thinking
 * into reasoning_content, the calls into tool_calls, the rest into content,
 * finish_reason "tool_calls" when a call was found. Whole (the
 * non-streaming answer) or as the text streams (Server-Sent Events, one
 * rp_chat_stream per choice).
 *
 * Forced calls (tool_choice "required" or a named function): the text is
 * JSON the grammar held to, so it is read, not parsed for a model's call
 * syntax. A named call streams its arguments as they come; "required"
 * streams its calls when the array is complete (each call one chunk with
 * its whole arguments). A named call is a call even when max_tokens cut
 * its arguments (they streamed as they came); "required" text that is not
 * the array (cut) is returned as content.
 *
 * Text in, JSON out: it knows neither the engine nor the network.
 * session.c feeds it the text the client would otherwise get as content
 * (after stop strings and detokenisation), so tests can drive it with
 * scripted text. */
#ifndef RP_SERVER_CHAT_CHOICE_H
#define RP_SERVER_CHAT_CHOICE_H

#include <jansson.h>
#include <stdint.h>

#include "server/openai_json.h"
#include "server/reasoning.h"
#include "server/sbuf.h"
#include "server/tool_parse.h"

/* Which parsers a choice's text goes through. */
typedef struct rp_chat_parsing {
    int tools;                    /* the tool-call parser runs (the request's tools, tool_choice "auto") */
    rp_tool_parser tool_parser;
    int reasoning;                /* the reasoning parser runs */
    rp_reasoning_kind reasoning_kind;
    rp_think_prompt prompt_state; /* rp_reasoning_prompt_state of the rendered prompt */
    uint64_t id_seed;             /* this choice's tool-call ids are drawn from it */
    /* tool_choice "required" or named: the text (after any thinking) is the
     * calls as JSON, read back into tool_calls; ids in id_style's form */
    rp_forced_tools forced;
    int single_call; /* parallel_tool_calls false: the parser's first call only, later ones dropped */
    char forced_name[65];
    rp_tool_parser id_style;
} rp_chat_parsing;

/* The choice of the non-streaming answer, from its whole text (logprobs
 * taken; NULL for null). message: role, content (null when it is empty and
 * the parsers took reasoning or calls), reasoning_content (with a
 * reasoning parser: null when there was none), tool_calls (when a call was
 * found). NULL when memory runs out. */
json_t *rp_chat_choice_json(const rp_chat_parsing *p, int index, const char *text, size_t len, json_t *logprobs,
                            rp_finish finish);

/* Streaming: each token's text goes to feed, which appends the chunks it
 * decides (delta.reasoning_content, delta.content, delta.tool_calls: first
 * {index, id, type, function: {name, arguments: ""}}, then {index,
 * function: {arguments}}) to out; the token's logprobs (taken) ride on the
 * first of them, or on an empty delta when there is none. finish ends the
 * parsers and appends the rest and the finish chunk. Both return 0, or -1
 * when memory runs out (out is then as it was before the call, and the
 * stream must be abandoned). */
typedef struct rp_chat_stream rp_chat_stream;
rp_chat_stream *rp_chat_stream_new(const rp_oai_response *r, const rp_chat_parsing *p, int index);
int rp_chat_stream_feed(rp_chat_stream *s, const char *text, size_t len, json_t *logprobs, rp_sbuf *out);
int rp_chat_stream_finish(rp_chat_stream *s, rp_finish finish, rp_sbuf *out);
void rp_chat_stream_free(rp_chat_stream *s);

#endif
