/* `replay chat-template`: prints what the model will see. Renders a JSON
 * conversation with the chat template of a model directory (it needs only
 * tokenizer_config.json or chat_template.jinja there, no tokenizer or
 * weights) through the template interpreter (src/template), exactly as
 * transformers' apply_chat_template(messages, tools=..., add_generation_prompt=...,
 * **kwargs, tokenize=False) would, or prints the template's own error. For
 * people debugging a template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "template/template.h"

#define CMD "chat-template"

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay chat-template --model DIR --messages FILE [OPTIONS]\n"
            "\n"
            "Prints the prompt the chat template of DIR makes of a conversation, byte for\n"
            "byte as transformers' apply_chat_template(..., tokenize=False), with no newline\n"
            "added. A template error, or the template's raise_exception, is printed with\n"
            "exit status 1.\n"
            "\n"
            "Template:\n"
            "  --model DIR            directory with chat_template.jinja or tokenizer_config.json (its\n"
            "                         chat_template, bos_token and eos_token); required unless\n"
            "                         --chat-template\n"
            "  --chat-template FILE   a Jinja template file to use instead of DIR's (default: DIR's)\n"
            "\n"
            "Conversation:\n"
            "  --messages FILE        JSON: a list of messages, or an object with \"messages\" (and\n"
            "                         \"tools\"), as in a chat completion request; - reads standard\n"
            "                         input; required\n"
            "  --tools FILE           JSON list of tools, the template's `tools` (default: the\n"
            "                         object's \"tools\", else none)\n"
            "  --kwargs JSON          an object of extra template variables, e.g.\n"
            "                         '{\"enable_thinking\": false}' (default: none)\n"
            "  --add-generation-prompt  end with the assistant's turn header (default off)\n"
            "\n"
            "Output:\n"
            "  -h, --help             show this help and exit\n");
}

static const struct option options[] = {
    {"model", required_argument, 0, 'm'},
    {"chat-template", required_argument, 0, 'c'},
    {"messages", required_argument, 0, 'M'},
    {"tools", required_argument, 0, 't'},
    {"kwargs", required_argument, 0, 'k'},
    {"add-generation-prompt", no_argument, 0, 'g'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (buf) {
        buf[n] = 0;
        *len = n;
    }
    return buf;
}

static json_t *load_json(const char *flag, const char *path) {
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, 0, &je) : json_load_file(path, 0, &je);
    if (!j) rp_cli_runtime_error(CMD, "%s %s: line %d: %s", flag, path, je.line, je.text);
    return j;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int run(int argc, char **argv) {
    const char *model_dir = NULL, *template_file = NULL, *messages_file = NULL, *tools_file = NULL, *kwargs_text = NULL;
    int agp = 0, opt;
    rp_cli_opts_begin();
    while ((opt = rp_cli_next_opt(argc, argv, "+:h", options, NULL, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'm': model_dir = optarg; break;
        case 'c': template_file = optarg; break;
        case 'M': messages_file = optarg; break;
        case 't': tools_file = optarg; break;
        case 'k': kwargs_text = optarg; break;
        case 'g': agp = 1; break;
        case 'h': help(stdout); return RP_EXIT_OK;
        default: return RP_EXIT_USAGE;
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!model_dir && !template_file) return rp_cli_usage_error(CMD, "--model DIR (or --chat-template FILE) is required");
    if (!messages_file) return rp_cli_usage_error(CMD, "--messages FILE is required");
    if (model_dir) {
        struct stat sb;
        if (stat(model_dir, &sb) || !S_ISDIR(sb.st_mode))
            return rp_cli_usage_error(CMD, "--model %s: not a directory", model_dir);
    }
    if (template_file && !file_exists(template_file))
        return rp_cli_usage_error(CMD, "--chat-template %s: no such file", template_file);
    if (strcmp(messages_file, "-") && !file_exists(messages_file))
        return rp_cli_usage_error(CMD, "--messages %s: no such file", messages_file);
    if (tools_file && !file_exists(tools_file)) return rp_cli_usage_error(CMD, "--tools %s: no such file", tools_file);
    json_t *kwargs = NULL;
    if (kwargs_text) {
        json_error_t je;
        kwargs = json_loads(kwargs_text, 0, &je);
        if (!json_is_object(kwargs)) {
            json_decref(kwargs);
            return rp_cli_usage_error(CMD, "--kwargs must be a JSON object: %s", kwargs ? "not an object" : je.text);
        }
    }

    int rc = RP_EXIT_RUNTIME;
    json_t *vars = json_object(), *conv = NULL, *tools = NULL;
    rp_template_source src = {0};
    rp_template *t = NULL;
    char *out = NULL;
    rp_err err = {0};
    if (!(conv = load_json("--messages", messages_file))) goto done;
    json_t *messages = json_is_array(conv) ? conv : json_object_get(conv, "messages");
    if (!json_is_array(messages)) {
        rp_cli_runtime_error(CMD, "--messages %s: expected a list of messages or an object with \"messages\"",
                             messages_file);
        goto done;
    }
    if (tools_file) {
        if (!(tools = load_json("--tools", tools_file))) goto done;
    } else if (json_is_object(conv) && json_object_get(conv, "tools")) {
        tools = json_incref(json_object_get(conv, "tools"));
    }
    /* with --chat-template, DIR (when given) still supplies bos/eos */
    if (model_dir && rp_template_source_load(model_dir, tools && !json_is_null(tools), &src, &err) && !template_file) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto done;
    }
    if (template_file) {
        FILE *f = fopen(template_file, "rb");
        free(src.source);
        src.source = f ? read_all(f, &src.source_len) : NULL;
        if (f) fclose(f);
        if (!src.source) {
            rp_cli_runtime_error(CMD, "cannot read --chat-template %s", template_file);
            goto done;
        }
    }
    if (!(t = rp_template_compile(src.source, src.source_len, &err))) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto done;
    }
    /* what apply_chat_template passes: messages, tools, documents,
     * add_generation_prompt, the special tokens that are set, then kwargs */
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(agp));
    if (src.bos_token) json_object_set_new(vars, "bos_token", json_string(src.bos_token));
    if (src.eos_token) json_object_set_new(vars, "eos_token", json_string(src.eos_token));
    if (kwargs) json_object_update(vars, kwargs);
    size_t len;
    int r = rp_template_render(t, vars, -1, &out, &len, &err);
    if (r == RP_TEMPLATE_RAISED) {
        rp_cli_runtime_error(CMD, "the template raised an exception: %s", err.msg);
        goto done;
    }
    if (r) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto done;
    }
    fwrite(out, 1, len, stdout);
    fflush(stdout);
    rc = RP_EXIT_OK;
done:
    free(out);
    rp_template_free(t);
    rp_template_source_free(&src);
    json_decref(conv);
    json_decref(tools);
    json_decref(kwargs);
    json_decref(vars);
    return rc;
}

const rp_cli_command rp_cli_chat_template = {"chat-template", "print the prompt a chat template makes of a conversation",
                                             options, help, run};
