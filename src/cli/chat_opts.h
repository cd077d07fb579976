/* What serve, chat and generate share about chat templates: --chat-template
 * FILE checked before the model loads, and the startup line that says which
 * template is in use and which ids end a turn. */
#ifndef RP_CLI_CHAT_OPTS_H
#define RP_CLI_CHAT_OPTS_H

#include "util/err.h"

struct rp_tokenizer;

/* --chat-template takes a Jinja file; a name (replay once took "qwen3" or
 * "llama3") or a missing file is a usage error. 0 or RP_EXIT_USAGE (printed). */
int rp_cli_check_template_file(const char *path, const char *cmd);
/* Logs (info) where the chat template came from and the turn-ending ids, or
 * that the model has none. */
void rp_cli_log_chat_template(const struct rp_tokenizer *tok);

/* Renders n messages (roles[i], contents[i]) with the model's chat template
 * and add_generation_prompt, passing enable_thinking=false when no_thinking
 * (Qwen3's switch; other templates ignore it). *out is malloc'd. 0, or -1
 * with err saying why (a template's raise_exception named as such). */
int rp_cli_chat_render(const struct rp_tokenizer *tok, const char *const *roles, const char *const *contents, int n,
                       int no_thinking, char **out, rp_err *err);

#endif
