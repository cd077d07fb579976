/* Reasoning parsers: split a model's `<think>...</think>` output into
 * reasoning_content and content, whole or as it streams (docs/tools.md).
 *
 * Parsers are named as vLLM names them: "qwen3" and "deepseek_r1". Both
 * see the same tags and differ only where the output has no `<think>` of
 * its own and no `</think>` either: qwen3 calls it content (thinking was
 * off), deepseek_r1 calls it reasoning (cut short while thinking). The
 * prompt's tail, when known, settles what the output starts inside of
 * (rp_reasoning_prompt_state), so that a stream never has to wait.
 *
 * Text only: nothing here knows tokens, requests or the engine. The stream
 * and the whole-output split give the same result for any cut of the text
 * into deltas (even mid-tag, mid-UTF-8); deltas handed out never end inside
 * a UTF-8 sequence except at the very end of an invalid output. */
#ifndef RP_SERVER_REASONING_H
#define RP_SERVER_REASONING_H

#include <stddef.h>

typedef enum { RP_REASONING_QWEN3, RP_REASONING_DEEPSEEK_R1 } rp_reasoning_kind;

/* Where the rendered prompt leaves the model: inside an open `<think>`
 * (its tail is `<think>` and whitespace), after a closed one (`</think>`
 * and whitespace: thinking switched off), or unknown (anything else). */
typedef enum { RP_THINK_UNKNOWN, RP_THINK_OPEN, RP_THINK_CLOSED } rp_think_prompt;

/* 0 and *out set for "qwen3" / "deepseek_r1"; -1 for any other name. */
int rp_reasoning_from_name(const char *name, rp_reasoning_kind *out);
rp_think_prompt rp_reasoning_prompt_state(const char *prompt, size_t len);

/* Whole output: each part malloc'd and NUL-terminated, NULL when empty.
 * 0, or -1 when memory runs out (nothing to free then). */
typedef struct rp_reasoning_split {
    char *reasoning;
    char *content;
} rp_reasoning_split;
int rp_reasoning_parse(rp_reasoning_kind kind, rp_think_prompt prompt, const char *text, size_t len,
                       rp_reasoning_split *out);
void rp_reasoning_split_free(rp_reasoning_split *s);

/* Streaming: feed deltas, then finish once. Each piece decided goes to
 * emit (is_reasoning 1 or 0, never empty, valid only during the call); a
 * nonzero return from emit stops the parser and is returned. Otherwise
 * feed and finish return 0, or -1 when memory runs out. */
typedef int (*rp_reasoning_emit)(void *ctx, int is_reasoning, const char *text, size_t len);
typedef struct rp_reasoning_stream rp_reasoning_stream;
rp_reasoning_stream *rp_reasoning_stream_new(rp_reasoning_kind kind, rp_think_prompt prompt);
int rp_reasoning_stream_feed(rp_reasoning_stream *s, const char *delta, size_t len, rp_reasoning_emit emit, void *ctx);
int rp_reasoning_stream_finish(rp_reasoning_stream *s, rp_reasoning_emit emit, void *ctx);
void rp_reasoning_stream_free(rp_reasoning_stream *s);

#endif
