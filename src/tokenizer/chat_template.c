/* Chat templates: the conversation -> prompt text step, rendered from the
 * model's own Jinja source by src/template/ (no template is written into
 * replay), and the token ids that end an assistant turn.
 *
 * The template is loaded and compiled once, when the engine starts
 * (rp_tokenizer_load_chat_template), and kept with the tokenizer it was made
 * for: a template replay cannot interpret fails there, naming its line. A
 * model without any template still loads (completions need none); its chat
 * renders fail, naming --chat-template.
 *
 * The ids that end a chat turn come from the model's files, never from
 * knowing a model family: the tokenizer's eos_token, generation_config.json's
 * eos_token_id (config.json's when there is no generation_config.json, as
 * transformers falls back), and the special token the template itself writes
 * right after an assistant message (Qwen's <|im_end|>, Llama 3's <|eot_id|>,
 * Gemma's <end_of_turn>), found by rendering a probe conversation. The last
 * one matters for repositories whose generation_config.json lists only the
 * end of text (early Llama 3 uploads did). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "template/template.h"
#include "tokenizer/tok_internal.h"

#define CHAT_MAX_STOP_IDS 8

struct tok_chat {
    rp_template *tmpl;       /* the default template */
    rp_template *tmpl_tools; /* tokenizer_config.json's "tool_use" template; NULL: tmpl serves */
    char origin[4200];       /* where it came from, for logs */
    int32_t stop_ids[CHAT_MAX_STOP_IDS];
    int num_stop_ids;
};

static void chat_free(tok_chat *c) {
    if (!c) return;
    rp_template_free(c->tmpl);
    rp_template_free(c->tmpl_tools);
    free(c);
}

void tok_chat_free(tok_chat *c) { chat_free(c); }

static void add_stop_id(tok_chat *c, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < c->num_stop_ids; i++)
        if (c->stop_ids[i] == id) return;
    if (c->num_stop_ids < CHAT_MAX_STOP_IDS) c->stop_ids[c->num_stop_ids++] = id;
}

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb, cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int compile(const char *source, size_t len, const char *origin, rp_template **out, rp_err *err) {
    if (!(*out = rp_template_compile(source, len, err))) return rp_err_wrap(err, "%s", origin);
    return RP_OK;
}

/* eos_token_id of a generation_config.json or config.json: an id or a list
 * of them. 1 when the file exists, 0 when not, RP_ERR on a bad file. */
static int eos_ids_of(tok_chat *c, const rp_tokenizer *t, const char *path, rp_err *err) {
    if (access(path, F_OK) != 0) return 0;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!root) return rp_errf(err, "%s: line %d: %s", path, je.line, je.text);
    json_t *v = json_object_get(root, "eos_token_id");
    json_t *one = json_is_array(v) ? NULL : v;
    size_t n = json_is_array(v) ? json_array_size(v) : (v && !json_is_null(v) ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        json_t *x = one ? one : json_array_get(v, i);
        double d = json_number_value(x);
        if (!json_is_number(x) || d != (double)(int32_t)d || d < 0 || d >= t->vocab_size) {
            json_decref(root);
            return rp_errf(err, "%s: eos_token_id must be a token id of the tokenizer (or a list of them)", path);
        }
        add_stop_id(c, (int32_t)d);
    }
    json_decref(root);
    return 1;
}

/* The special token the template writes right after an assistant's words:
 * the text that ends a turn, so the id that ends generation. Templates that
 * refuse the probe conversation simply add nothing. */
static void probe_turn_end(tok_chat *c, const rp_tokenizer *t) {
    static const char probe[] = "replay probe: where does a turn end?";
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Hi", "role", "assistant",
                             "content", probe, "role", "user", "content", "Bye");
    char *out = NULL;
    size_t len = 0;
    rp_err err;
    if (msgs && rp_chat_render(t, msgs, NULL, 0, NULL, &out, &len, &err) == RP_OK) {
        const char *at = strstr(out, probe);
        if (at) {
            at += sizeof probe - 1;
            while (*at == ' ' || *at == '\n') at++;
            /* longest first, so <|eot_id|> is not taken for a shorter prefix */
            for (int i = 0; i < t->n_added; i++)
                if (t->added[i].special && !strncmp(at, t->added[i].content, t->added[i].len)) {
                    add_stop_id(c, t->added[i].id);
                    break;
                }
        }
    }
    free(out);
    json_decref(msgs);
}

int rp_tokenizer_load_chat_template(rp_tokenizer *t, const char *template_dir, const char *model_dir,
                                    const char *template_file, rp_err *err) {
    tok_chat *c = calloc(1, sizeof *c);
    if (!c) return rp_errf(err, "out of memory");
    rp_template_source src = {0}, tools_src = {0};
    if (template_file) {
        src.source = read_text_file(template_file, &src.source_len);
        if (!src.source) {
            chat_free(c);
            return rp_errf(err, "cannot read the chat template file '%s'", template_file);
        }
        snprintf(c->origin, sizeof c->origin, "%s", template_file);
        if (compile(src.source, src.source_len, c->origin, &c->tmpl, err)) goto fail;
    } else if (template_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/chat_template.jinja", template_dir);
        if (t->config_has_chat_template || access(path, F_OK) == 0) {
            if (rp_template_source_load(template_dir, 0, &src, err) ||
                rp_template_source_load(template_dir, 1, &tools_src, err))
                goto fail;
            snprintf(c->origin, sizeof c->origin, "%s/%s", template_dir, src.origin);
            if (compile(src.source, src.source_len, c->origin, &c->tmpl, err)) goto fail;
            /* a "tool_use" template of the named-templates form, for requests with tools */
            if (tools_src.source_len != src.source_len || memcmp(tools_src.source, src.source, src.source_len)) {
                char what[4300];
                snprintf(what, sizeof what, "%s (tool_use)", c->origin);
                if (compile(tools_src.source, tools_src.source_len, what, &c->tmpl_tools, err)) goto fail;
            }
        }
    }
    /* the end of a turn, from the model's files (the comment at the top) */
    add_stop_id(c, t->eos_id);
    if (model_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
        int found = eos_ids_of(c, t, path, err);
        if (found < 0) goto fail;
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        if (!found && eos_ids_of(c, t, path, err) < 0) goto fail;
    }
    tok_chat_free(t->chat);
    t->chat = c;
    if (c->tmpl) probe_turn_end(c, t);
    rp_template_source_free(&src);
    rp_template_source_free(&tools_src);
    return RP_OK;
fail:
    rp_template_source_free(&src);
    rp_template_source_free(&tools_src);
    chat_free(c);
    return RP_ERR;
}

int rp_chat_has_template(const rp_tokenizer *t) { return t->chat && t->chat->tmpl; }

const char *rp_chat_template_origin(const rp_tokenizer *t) {
    return rp_chat_has_template(t) ? t->chat->origin : NULL;
}

int rp_chat_render(const rp_tokenizer *t, const json_t *messages, const json_t *tools, int add_generation_prompt,
                   const json_t *kwargs, char **out, size_t *out_len, rp_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!rp_chat_has_template(t))
        return rp_errf(err, "the model has no chat template (neither chat_template.jinja nor a chat_template in "
                            "tokenizer_config.json); give one with --chat-template FILE");
    const int with_tools = tools && !json_is_null(tools);
    const rp_template *tmpl = with_tools && t->chat->tmpl_tools ? t->chat->tmpl_tools : t->chat->tmpl;
    /* what transformers' apply_chat_template passes: messages, tools,
     * documents, add_generation_prompt, the special tokens, then the extra
     * keywords (which win, as there) */
    json_t *vars = json_object();
    if (!vars) return rp_errf(err, "out of memory");
    int bad = json_object_set(vars, "messages", (json_t *)messages) ||
              json_object_set_new(vars, "tools", with_tools ? json_incref((json_t *)tools) : json_null()) ||
              json_object_set_new(vars, "documents", json_null()) ||
              json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
              (t->bos_token && json_object_set_new(vars, "bos_token", json_string(t->bos_token))) ||
              (t->eos_token && json_object_set_new(vars, "eos_token", json_string(t->eos_token))) ||
              (kwargs && json_object_update(vars, (json_t *)kwargs));
    if (bad) {
        json_decref(vars);
        return rp_errf(err, "out of memory");
    }
    size_t len;
    int rc = rp_template_render(tmpl, vars, -1, out, &len, err);
    json_decref(vars);
    if (rc == RP_OK && out_len) *out_len = len;
    return rc;
}

int rp_chat_stop_ids(const rp_tokenizer *t, int32_t *out, int max) {
    if (!t->chat) return t->eos_id >= 0 && max > 0 ? (out[0] = t->eos_id, 1) : 0;
    int k = 0;
    for (int i = 0; i < t->chat->num_stop_ids && k < max; i++) out[k++] = t->chat->stop_ids[i];
    return k;
}
