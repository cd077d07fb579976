/* Chat templates rendered from the model's own Jinja source: a small Jinja2
 * interpreter for the subset that chat templates use, with the semantics of
 * transformers' environment (ImmutableSandboxedEnvironment with
 * trim_blocks, lstrip_blocks, the loopcontrols extension, its tojson,
 * raise_exception and strftime_now). docs/templates.md lists what is
 * supported and what is refused.
 *
 * A template is compiled once: anything outside the subset (an unknown
 * filter or test, {% include %}, a syntax error) fails here with the
 * template's line and the construct named, never later and never silently.
 * A compiled template is immutable; renders from several threads at once are
 * fine (each keeps its own scratch memory). */
#ifndef RP_TEMPLATE_TEMPLATE_H
#define RP_TEMPLATE_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct rp_template rp_template;

/* What a render may use, at most: the output's bytes, the scratch memory
 * (every intermediate value lives in one arena freed when the render ends),
 * the depth of macro calls, and the statements and loop iterations it may
 * run. A template that goes past one fails with an error naming the limit. */
#define RP_TEMPLATE_MAX_OUTPUT_BYTES (64u << 20)
#define RP_TEMPLATE_MAX_SCRATCH_BYTES ((size_t)1 << 30)
#define RP_TEMPLATE_MAX_CALL_DEPTH 64
#define RP_TEMPLATE_MAX_STEPS 50000000L
/* Nesting of expressions and blocks in the source (the parser recurses). */
#define RP_TEMPLATE_MAX_NESTING 128

/* Render's status beside RP_OK and RP_ERR: the template called
 * raise_exception(msg); err->msg is msg exactly, for the client to see. */
#define RP_TEMPLATE_RAISED (-2)

/* Compiles source (UTF-8, len bytes). On error: NULL and err->msg as
 * "chat template line N: what" naming the construct. */
rp_template *rp_template_compile(const char *source, size_t len, rp_err *err);
void rp_template_free(rp_template *t);

/* Renders with vars, a JSON object whose keys become the template's
 * variables (messages, tools, add_generation_prompt, bos_token,
 * enable_thinking, ...). JSON null is Python None; a key that is absent is
 * undefined. The globals raise_exception(msg), strftime_now(fmt),
 * namespace(...), range(...) and dict(...) are always there; strftime_now
 * formats now_s (seconds since the epoch, local time) or the clock's time
 * when now_s < 0. *out is malloc'd and NUL-terminated (the text may itself
 * hold NUL bytes: out_len counts them). Returns RP_OK, RP_ERR ("chat
 * template line N: ...") or RP_TEMPLATE_RAISED. */
int rp_template_render(const rp_template *t, const json_t *vars, int64_t now_s, char **out, size_t *out_len,
                       rp_err *err);

/* A model directory's chat template as transformers finds it:
 * chat_template.jinja when present, else tokenizer_config.json's
 * chat_template (a string, or a list of named templates: "tool_use" when
 * want_tools and present, else "default"). Also reads bos_token and
 * eos_token from tokenizer_config.json (a string or an {"content": ...}
 * object; NULL when absent). Everything is malloc'd; the caller frees. */
typedef struct rp_template_source {
    char *source;
    size_t source_len;
    char *bos_token, *eos_token;
    char origin[64]; /* "chat_template.jinja" or "tokenizer_config.json" */
} rp_template_source;
int rp_template_source_load(const char *model_dir, int want_tools, rp_template_source *out, rp_err *err);
void rp_template_source_free(rp_template_source *s);

#endif
