/* Tool-call parsers: find the calls in a model's output text and turn them
 * into OpenAI tool_calls, whole or as the text streams (docs/tools.md).
 *
 * Parsers are named as vLLM names them: "hermes" (Qwen2.5 / Qwen3:
 * <tool_call>{json}</tool_call>), "llama3_json" (Llama 3.1 / 3.2: the whole
 * output is {"name", "parameters"} objects, after an optional
 * <|python_tag|>, separated by ';') and "mistral" ([TOOL_CALLS] followed by
 * a JSON array of calls, or by name[ARGS]{json} per call in the newer
 * tokenizers' form). Text that looks like a call but does not parse stays
 * content, byte for byte: nothing the model wrote is lost.
 *
 * A call's arguments are the model's own JSON text of the arguments object
 * with the whitespace outside strings removed (numbers, escapes and key
 * order as written). A stream announces a call only once it is complete
 * and valid: one event with its index, id and name, then its arguments in
 * one fragment. Text only: nothing here knows tokens, requests or the
 * engine. The stream and the whole-output parse give the same content and
 * calls for any cut of the text into deltas. */
#ifndef RP_SERVER_TOOL_PARSE_H
#define RP_SERVER_TOOL_PARSE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { RP_TOOL_PARSER_HERMES, RP_TOOL_PARSER_LLAMA3_JSON, RP_TOOL_PARSER_MISTRAL } rp_tool_parser;

/* 0 and *out set for "hermes" / "llama3_json" / "mistral"; -1 otherwise. */
int rp_tool_parser_from_name(const char *name, rp_tool_parser *out);

typedef struct rp_tool_call {
    char *id;        /* "call_" + 24 alphanumerics; mistral: 9 alphanumerics (its templates demand it) */
    char *name;
    char *arguments; /* a JSON object, compact */
} rp_tool_call;

/* Whole output. content: the text outside the calls (NULL when empty);
 * finish_reason is "tool_calls" when num_calls > 0. Ids are drawn from
 * id_seed: the same seed gives the same ids. */
typedef struct rp_tool_parsed {
    char *content;
    rp_tool_call *calls;
    int num_calls;
} rp_tool_parsed;
/* tool_choice that forces calls, written as JSON (docs/tools.md): a named
 * function's arguments object, or ("required") an array of {"name",
 * "parameters"} objects. */
typedef enum { RP_FORCED_NONE = 0, RP_FORCED_NAMED, RP_FORCED_REQUIRED } rp_forced_tools;

/* Call index's id, drawn from id_seed: "call_" and 24 letters and digits,
 * or 9 of them for Mistral (whose templates refuse any other id). */
void rp_tool_call_id(rp_tool_parser parser, uint64_t id_seed, int index, char out[32]);
/* 0, or -1 when memory runs out (nothing to free then). */
int rp_tool_parse(rp_tool_parser parser, const char *text, size_t len, uint64_t id_seed, rp_tool_parsed *out);
void rp_tool_parsed_free(rp_tool_parsed *p);

/* Streaming: the OpenAI stream's pieces, in order. */
typedef enum {
    RP_TOOL_EVENT_CONTENT,   /* text: a content delta */
    RP_TOOL_EVENT_CALL,      /* index, id, name: a call starts (type "function") */
    RP_TOOL_EVENT_ARGUMENTS, /* index, text: a fragment of that call's arguments */
} rp_tool_event_kind;
typedef struct rp_tool_event {
    rp_tool_event_kind kind;
    int index;
    const char *id, *name;
    const char *text; /* not NUL-terminated; never empty */
    size_t len;
} rp_tool_event;
/* Pointers are valid only during the call; a nonzero return stops the
 * parser and is returned by feed / finish. */
typedef int (*rp_tool_emit)(void *ctx, const rp_tool_event *ev);

typedef struct rp_tool_stream rp_tool_stream;
rp_tool_stream *rp_tool_stream_new(rp_tool_parser parser, uint64_t id_seed);
/* 0, emit's nonzero return, or -1 when memory runs out. */
int rp_tool_stream_feed(rp_tool_stream *s, const char *delta, size_t len, rp_tool_emit emit, void *ctx);
int rp_tool_stream_finish(rp_tool_stream *s, rp_tool_emit emit, void *ctx);
/* Calls announced so far: after finish, > 0 means finish_reason "tool_calls". */
int rp_tool_stream_num_calls(const rp_tool_stream *s);
void rp_tool_stream_free(rp_tool_stream *s);

#endif
