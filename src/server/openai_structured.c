/* Structured output fields of a request (openai_structured.h), with vLLM's
 * meanings: any JSON whitespace is allowed unless
 * structured_outputs.disable_any_whitespace is true (xgrammar's default in
 * vLLM); options that would change the language in ways replay does not
 * implement are refused by name rather than ignored. */
#include "server/openai_structured.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static int bad(rp_oai_error *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(rp_oai_error *err, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rp_oai_set_error(err, 400, "invalid_request_error", param, NULL, "%s", msg);
    return -1;
}

/* What one field asks for, before it becomes the request's. */
typedef struct found {
    const char *param; /* the field that set it; NULL: none yet */
    rp_constraint_kind kind;
    json_t *value; /* borrowed: a schema object, a string, a choice list */
    int compact;
} found;

/* Records field's constraint; a second one is an error naming both. */
static int take(found *f, const char *param, rp_constraint_kind kind, json_t *value, rp_oai_error *err) {
    if (f->param)
        return bad(err, param, "'%s' and '%s' both constrain the output: give one structured output option", f->param,
                   param);
    f->param = param;
    f->kind = kind;
    f->value = value;
    return 0;
}

/* A schema given as an object or as its JSON text. */
static int take_schema(found *f, const char *param, json_t *v, rp_oai_error *err) {
    if (!json_is_object(v) && !json_is_boolean(v) && !json_is_string(v))
        return bad(err, param, "'%s' must be a JSON schema (an object, or its JSON text)", param);
    return take(f, param, RP_CONSTRAINT_JSON_SCHEMA, v, err);
}

static int take_string(found *f, const char *param, rp_constraint_kind kind, json_t *v, rp_oai_error *err) {
    if (!json_is_string(v) || json_string_length(v) == 0)
        return bad(err, param, "'%s' must be a non-empty string", param);
    return take(f, param, kind, v, err);
}

static int take_choice(found *f, const char *param, json_t *v, rp_oai_error *err) {
    size_t i;
    json_t *s;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(err, param, "'%s' must be a non-empty list of strings", param);
    json_array_foreach(v, i, s) if (!json_is_string(s)) return bad(err, param, "'%s' must hold strings only", param);
    return take(f, param, RP_CONSTRAINT_CHOICE, v, err);
}

/* OpenAI's response_format: text (nothing), json_object, json_schema. */
static int response_format(json_t *rf, found *f, rp_oai_error *err) {
    const char *P = "response_format";
    if (!json_is_object(rf)) return bad(err, P, "'response_format' must be an object with a \"type\"");
    json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type)) return bad(err, P, "'response_format.type' must be a string");
    const char *t = json_string_value(type);
    const char *key;
    json_t *v;
    json_object_foreach(rf, key, v) if (strcmp(key, "type") != 0 && strcmp(key, "json_schema") != 0) return bad(
        err, P, "Unrecognized field in 'response_format': %s", key);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) return take(f, P, RP_CONSTRAINT_JSON_OBJECT, NULL, err);
    if (strcmp(t, "json_schema") != 0)
        return bad(err, P, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"%s\"",
                   t);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return bad(err, P, "'response_format' of type \"json_schema\" needs a \"json_schema\" object");
    json_object_foreach(js, key, v) {
        if (!strcmp(key, "schema")) continue;
        if (!strcmp(key, "name") || !strcmp(key, "description")) {
            if (!json_is_string(v)) return bad(err, P, "'response_format.json_schema.%s' must be a string", key);
        } else if (!strcmp(key, "strict")) { /* replay always enforces the schema */
            if (!json_is_boolean(v) && !json_is_null(v))
                return bad(err, P, "'response_format.json_schema.strict' must be a boolean");
        } else {
            return bad(err, P, "Unrecognized field in 'response_format.json_schema': %s", key);
        }
    }
    json_t *schema = json_object_get(js, "schema");
    if (!schema) return bad(err, P, "'response_format.json_schema' needs a \"schema\"");
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return bad(err, P, "'response_format.json_schema.schema' must be a JSON schema object");
    return take(f, P, RP_CONSTRAINT_JSON_SCHEMA, schema, err);
}

/* vLLM's structured_outputs: one of json, regex, choice, grammar,
 * json_object, with disable_any_whitespace. */
static int structured_outputs(json_t *so, found *f, rp_oai_error *err) {
    const char *P = "structured_outputs";
    if (!json_is_object(so)) return bad(err, P, "'structured_outputs' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(so, key, v) {
        if (json_is_null(v)) continue;
        int rc = 0;
        if (!strcmp(key, "json")) rc = take_schema(f, P, v, err);
        else if (!strcmp(key, "regex")) rc = take_string(f, P, RP_CONSTRAINT_REGEX, v, err);
        else if (!strcmp(key, "choice")) rc = take_choice(f, P, v, err);
        else if (!strcmp(key, "grammar")) rc = take_string(f, P, RP_CONSTRAINT_GRAMMAR, v, err);
        else if (!strcmp(key, "json_object")) {
            if (!json_is_boolean(v)) return bad(err, P, "'structured_outputs.json_object' must be a boolean");
            if (json_is_true(v)) rc = take(f, P, RP_CONSTRAINT_JSON_OBJECT, NULL, err);
        } else if (!strcmp(key, "disable_any_whitespace")) {
            if (!json_is_boolean(v))
                return bad(err, P, "'structured_outputs.disable_any_whitespace' must be a boolean");
            f->compact = json_is_true(v);
        } else if (!strcmp(key, "disable_fallback")) { /* replay has one backend: there is nothing to fall back to */
            if (!json_is_boolean(v)) return bad(err, P, "'structured_outputs.disable_fallback' must be a boolean");
        } else if (!strcmp(key, "disable_additional_properties")) {
            if (!json_is_boolean(v))
                return bad(err, P, "'structured_outputs.disable_additional_properties' must be a boolean");
            if (json_is_true(v))
                return bad(err, P, "'structured_outputs.disable_additional_properties' is not supported by replay: "
                                   "set \"additionalProperties\": false in the schema (replay's default where "
                                   "\"properties\" is given)");
        } else if (!strcmp(key, "whitespace_pattern") || !strcmp(key, "structural_tag")) {
            return bad(err, P, "'structured_outputs.%s' is not supported by replay", key);
        } else {
            return bad(err, P, "Unrecognized field in 'structured_outputs': %s", key);
        }
        if (rc) return -1;
    }
    return 0;
}

/* The constraint's text: a string as it is, a schema or a choice list as
 * compact JSON. */
static int constraint_text(const found *f, char **out, rp_oai_error *err) {
    *out = NULL;
    if (!f->value) return 0;
    *out = json_is_string(f->value) ? strdup(json_string_value(f->value))
                                    : json_dumps(f->value, JSON_COMPACT | JSON_ENCODE_ANY);
    return *out ? 0 : rp_oai_set_out_of_memory(err);
}

int rp_oai_parse_structured(const rp_oai_context *ctx, rp_oai_kind kind, json_t *root, rp_oai_request *out,
                            rp_oai_error *err) {
    found f = {0};
    json_t *v;
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v) && response_format(v, &f, err)) return -1;
    if ((v = json_object_get(root, "structured_outputs")) && !json_is_null(v) && structured_outputs(v, &f, err))
        return -1;
    static const struct {
        const char *name;
        rp_constraint_kind kind;
    } guided[] = {{"guided_json", RP_CONSTRAINT_JSON_SCHEMA},
                  {"guided_regex", RP_CONSTRAINT_REGEX},
                  {"guided_choice", RP_CONSTRAINT_CHOICE},
                  {"guided_grammar", RP_CONSTRAINT_GRAMMAR}};
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++) {
        v = json_object_get(root, guided[i].name);
        if (!v || json_is_null(v)) continue;
        int rc = guided[i].kind == RP_CONSTRAINT_JSON_SCHEMA ? take_schema(&f, guided[i].name, v, err)
                 : guided[i].kind == RP_CONSTRAINT_CHOICE    ? take_choice(&f, guided[i].name, v, err)
                                                             : take_string(&f, guided[i].name, guided[i].kind, v, err);
        if (rc) return -1;
    }
    v = json_object_get(root, "guided_whitespace_pattern");
    if (v && !json_is_null(v))
        return bad(err, "guided_whitespace_pattern",
                   "'guided_whitespace_pattern' is not supported by replay: JSON whitespace is any JSON whitespace, "
                   "or none with \"structured_outputs\": {\"disable_any_whitespace\": true}");
    if (!f.param) return 0;
    if (constraint_text(&f, &out->constraint_text, err)) return -1;
    out->params.constraint = (rp_constraint){.kind = f.kind,
                                             .text = out->constraint_text,
                                             .allow_whitespace = !f.compact,
                                             .param = f.param};
    /* both parsers (qwen3, deepseek_r1) end the thinking with this tag */
    const int end = kind == RP_OAI_CHAT && ctx->has_reasoning_parser && ctx->tok
                        ? rp_tokenizer_token_id(ctx->tok, "</think>")
                        : -1;
    if (end >= 0) {
        out->params.constraint.has_reasoning_end = 1;
        out->params.constraint.reasoning_end_id = end;
    }
    return 0;
}
