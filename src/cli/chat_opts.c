/* The chat template options of serve, chat and generate (chat_opts.h). */
#include "cli/chat_opts.h"

#include <jansson.h>
#include <stdio.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

int rp_cli_check_template_file(const char *path, const char *cmd) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return 0;
        }
        return rp_cli_usage_error(cmd, "--chat-template: cannot read '%s'", path);
    }
    if (stat(path, &st) == 0)
        return rp_cli_usage_error(cmd, "--chat-template takes a Jinja template file, and '%s' is not a file", path);
    return rp_cli_usage_error(cmd, "--chat-template takes a Jinja template file, and there is no file '%s' (replay "
                                   "renders the model's own template by default; it no longer picks one by name)",
                              path);
}

void rp_cli_log_chat_template(const struct rp_tokenizer *tok) {
    int32_t ids[8];
    const int n = rp_chat_stop_ids(tok, ids, 8);
    char list[160] = "";
    size_t len = 0;
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? ", " : "", ids[i]);
    const char *origin = rp_chat_template_origin(tok);
    if (origin) rp_log_info("chat template: %s; a turn ends at token ids %s", origin, n ? list : "(none)");
    else rp_log_info("the model has no chat template: chat requests get an error (--chat-template FILE gives one)");
}

int rp_cli_chat_render(const struct rp_tokenizer *tok, const char *const *roles, const char *const *contents, int n,
                       int no_thinking, char **out, rp_err *err) {
    *out = NULL;
    json_t *msgs = json_array(), *kwargs = no_thinking ? json_pack("{s:b}", "enable_thinking", 0) : NULL;
    int bad = !msgs || (no_thinking && !kwargs);
    for (int i = 0; i < n && !bad; i++)
        bad = json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", roles[i], "content", contents[i]));
    int rc = bad ? rp_errf(err, "out of memory") : rp_chat_render(tok, msgs, NULL, 1, kwargs, out, NULL, err);
    if (rc == RP_TEMPLATE_RAISED) rp_err_wrap(err, "the chat template refused the conversation");
    json_decref(msgs);
    json_decref(kwargs);
    return rc ? RP_ERR : RP_OK;
}
