/* --json-schema, --json-object, --regex, --choice, --grammar and
 * --structured-whitespace (structured_opts.h). */
#include "cli/structured_opts.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

/* a schema or grammar file is small; anything larger is a wrong file */
#define MAX_CONSTRAINT_FILE_BYTES (16u << 20)

void rp_structured_opts_init(rp_structured_opts *o) { memset(o, 0, sizeof *o); }

void rp_structured_opts_free(rp_structured_opts *o) {
    free(o->text);
    memset(o, 0, sizeof *o);
}

/* Records the constraint flag; a second, different one is an error. */
static int take(rp_structured_opts *o, const char *flag, rp_constraint_kind kind, const char *arg, const char *cmd) {
    if (o->flag && strcmp(o->flag, flag) != 0)
        return rp_cli_usage_error(cmd, "%s and %s both constrain the output: give one of --json-schema, "
                                       "--json-object, --regex, --choice or --grammar",
                                  o->flag, flag);
    if (o->flag && kind != RP_CONSTRAINT_CHOICE) return rp_cli_usage_error(cmd, "%s is given twice", flag);
    o->flag = flag;
    o->kind = kind;
    o->arg = arg;
    return 0;
}

int rp_structured_opts_parse(rp_structured_opts *o, int opt, const char *arg, const char *cmd) {
    switch (opt) {
    case 0x1e0: return take(o, "--json-schema", RP_CONSTRAINT_JSON_SCHEMA, arg, cmd);
    case 0x1e1: return take(o, "--json-object", RP_CONSTRAINT_JSON_OBJECT, NULL, cmd);
    case 0x1e2:
        if (!*arg) return rp_cli_usage_error(cmd, "--regex needs a non-empty regular expression");
        return take(o, "--regex", RP_CONSTRAINT_REGEX, arg, cmd);
    case 0x1e3: {
        if (take(o, "--choice", RP_CONSTRAINT_CHOICE, NULL, cmd)) return RP_EXIT_USAGE;
        if (o->num_choices == RP_STRUCTURED_MAX_CHOICES)
            return rp_cli_usage_error(cmd, "--choice: at most %d choices", RP_STRUCTURED_MAX_CHOICES);
        o->choices[o->num_choices++] = arg;
        return 0;
    }
    case 0x1e4: return take(o, "--grammar", RP_CONSTRAINT_GRAMMAR, arg, cmd);
    case 0x1e5:
        if (strcmp(arg, "any") != 0 && strcmp(arg, "compact") != 0)
            return rp_cli_usage_error(cmd, "--structured-whitespace must be any or compact, got '%s'", arg);
        o->compact = !strcmp(arg, "compact");
        return 0;
    }
    return rp_cli_usage_error(cmd, "unknown structured output option");
}

/* A whole text file into *out. 0, or RP_EXIT_USAGE (printed). */
static int read_file(const char *flag, const char *path, char **out, const char *cmd) {
    FILE *f = fopen(path, "rb");
    if (!f) return rp_cli_usage_error(cmd, "%s %s: %s", flag, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return rp_cli_usage_error(cmd, "%s %s is a directory", flag, path);
    }
    size_t len = 0, cap = 4096;
    char *text = malloc(cap);
    int rc = text ? 0 : rp_cli_usage_error(cmd, "out of memory");
    while (!rc) {
        if (len + 1 >= cap) {
            char *t = cap > MAX_CONSTRAINT_FILE_BYTES ? NULL : realloc(text, cap * 2);
            if (!t) {
                rc = rp_cli_usage_error(cmd, "%s %s is larger than %u MiB", flag, path,
                                        MAX_CONSTRAINT_FILE_BYTES >> 20);
                break;
            }
            text = t;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = rp_cli_usage_error(cmd, "%s %s: %s", flag, path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!rc && len == 0) rc = rp_cli_usage_error(cmd, "%s %s is empty", flag, path);
    if (rc) {
        free(text);
        return rc;
    }
    text[len] = 0;
    *out = text;
    return 0;
}

/* The --choice strings as the JSON array the engine takes. */
static int join_choices(rp_structured_opts *o, const char *cmd) {
    json_t *a = json_array();
    for (int i = 0; a && i < o->num_choices; i++)
        if (json_array_append_new(a, json_string(o->choices[i]))) {
            json_decref(a);
            return rp_cli_usage_error(cmd, "--choice '%s' is not valid UTF-8", o->choices[i]);
        }
    o->text = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return o->text ? 0 : rp_cli_usage_error(cmd, "out of memory");
}

int rp_structured_opts_check(rp_structured_opts *o, const char *cmd) {
    if (!o->flag) return 0;
    int bad = 0;
    switch (o->kind) {
    case RP_CONSTRAINT_JSON_SCHEMA:
    case RP_CONSTRAINT_GRAMMAR: bad = read_file(o->flag, o->arg, &o->text, cmd); break;
    case RP_CONSTRAINT_REGEX: bad = (o->text = strdup(o->arg)) ? 0 : rp_cli_usage_error(cmd, "out of memory"); break;
    case RP_CONSTRAINT_CHOICE: bad = join_choices(o, cmd); break;
    case RP_CONSTRAINT_JSON_OBJECT:
    case RP_CONSTRAINT_NONE: break;
    }
    if (bad) return bad;
    o->constraint = (rp_constraint){
        .kind = o->kind, .text = o->text, .allow_whitespace = !o->compact, .param = o->flag};
    rp_error err;
    if (rp_constraint_validate(&o->constraint, &err)) return rp_cli_usage_error(cmd, "%s", err.message);
    return 0;
}
