/* Where a model's chat template comes from, as transformers looks for it:
 * chat_template.jinja beside the tokenizer files (newer repositories), else
 * tokenizer_config.json's "chat_template", which is a string or a list of
 * {"name", "template"} (then "tool_use" when the request has tools and the
 * list has one, else "default"). bos_token and eos_token come from
 * tokenizer_config.json, as a string or an added-token object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = 0;
    *len = n;
    return buf;
}

static char *token_text(const json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

int rp_template_source_load(const char *model_dir, int want_tools, rp_template_source *out, rp_err *err) {
    memset(out, 0, sizeof *out);
    char path[4096];
    json_t *cfg = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        json_error_t je;
        /* model_max_length is often 1e30 written as an integer, beyond jansson's
         * int64: read numbers as reals, only strings are wanted here */
        cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg) return rp_errf(err, "%s: line %d: %s", path, je.line, je.text);
        out->bos_token = token_text(json_object_get(cfg, "bos_token"));
        out->eos_token = token_text(json_object_get(cfg, "eos_token"));
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    out->source = read_file(path, &out->source_len);
    if (out->source) {
        snprintf(out->origin, sizeof out->origin, "chat_template.jinja");
        json_decref(cfg);
        return RP_OK;
    }
    const json_t *t = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (json_is_array(t)) {
        const json_t *pick = NULL, *item;
        size_t i;
        json_array_foreach(t, i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            if (!name) continue;
            if (want_tools && !strcmp(name, "tool_use")) pick = item;
            else if (!strcmp(name, "default") && !(pick && want_tools)) pick = pick ? pick : item;
        }
        t = pick ? json_object_get(pick, "template") : NULL;
        if (!t) {
            json_decref(cfg);
            rp_template_source_free(out);
            return rp_errf(err, "%s/tokenizer_config.json: chat_template lists templates but none named 'default'",
                           model_dir);
        }
    }
    if (!json_is_string(t)) {
        json_decref(cfg);
        rp_template_source_free(out);
        return rp_errf(err, "%s has no chat template (neither chat_template.jinja nor a chat_template in "
                            "tokenizer_config.json)", model_dir);
    }
    out->source_len = json_string_length(t);
    out->source = malloc(out->source_len + 1);
    if (!out->source) {
        json_decref(cfg);
        rp_template_source_free(out);
        return rp_errf(err, "out of memory");
    }
    memcpy(out->source, json_string_value(t), out->source_len + 1);
    snprintf(out->origin, sizeof out->origin, "tokenizer_config.json");
    json_decref(cfg);
    return RP_OK;
}

void rp_template_source_free(rp_template_source *s) {
    free(s->source);
    free(s->bos_token);
    free(s->eos_token);
    memset(s, 0, sizeof *s);
}
