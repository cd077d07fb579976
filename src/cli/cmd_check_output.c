/* `replay check-output`: whether a text is in a structured-output
 * constraint's language, as the matcher sees it. The constraint flags are
 * generate's (structured_opts.c); the text (a file or standard input) is fed
 * byte by byte to a matcher over a vocabulary of the 256 single bytes, so no
 * model or tokenizer is needed, and the verdict is the one generation would
 * enforce: valid, refused at a byte, or a proper prefix (incomplete). For
 * users checking an instance against a schema, and for the schema-corpus
 * tests (docs/structured.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/structured_opts.h"
#include "structured/structured.h"

#define CMD "check-output"

/* an instance larger than this is a wrong file */
#define MAX_INSTANCE_BYTES (64u << 20)

static void help(FILE *f) {
    fprintf(f, "Usage: replay check-output CONSTRAINT [OPTIONS] [FILE]\n"
               "\n"
               "Says whether the text in FILE (or standard input, also with -) is an output the\n"
               "constraint allows, as generation enforces it: the bytes exactly as read (a\n"
               "trailing newline counts). Prints \"valid\" (exit status 0); \"invalid at byte N:\n"
               "...\" where the constraint refuses the byte at offset N (0-based), or \"invalid at\n"
               "byte N: incomplete ...\" when the text is a proper prefix of an allowed one (exit\n"
               "status 1). A constraint that does not compile is a usage error (exit status 2).\n"
               "No model or tokenizer is needed.\n"
               "\n" RP_STRUCTURED_OPTIONS_HELP "\n"
               "Output:\n"
               "  -h, --help             show this help and exit\n");
}

static const struct option options[] = {
    RP_STRUCTURED_LONG_OPTIONS,
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* The whole input: 0, or an exit status (printed). */
static int read_input(const char *path, char **out, size_t *out_len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return rp_cli_usage_error(CMD, "%s: %s", path, strerror(errno));
    size_t len = 0, cap = 4096;
    char *text = malloc(cap);
    int rc = text ? 0 : rp_cli_runtime_error(CMD, "out of memory");
    while (!rc) {
        if (len == cap) {
            char *t = cap >= MAX_INSTANCE_BYTES ? NULL : realloc(text, cap * 2);
            if (!t) {
                rc = rp_cli_runtime_error(CMD, "%s is larger than %u MiB", path, MAX_INSTANCE_BYTES >> 20);
                break;
            }
            text = t;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = rp_cli_runtime_error(CMD, "%s: %s", path, strerror(errno));
            break;
        }
    }
    if (f != stdin) fclose(f);
    if (rc) {
        free(text);
        return rc;
    }
    *out = text;
    *out_len = len;
    return 0;
}

/* A byte as the message shows it: 'c', or an escape. */
static void show_byte(char *buf, size_t n, unsigned char b) {
    if (b == '\n') snprintf(buf, n, "'\\n'");
    else if (b == '\t') snprintf(buf, n, "'\\t'");
    else if (b == '\r') snprintf(buf, n, "'\\r'");
    else if (b == '\'') snprintf(buf, n, "\"'\"");
    else if (b >= 0x20 && b < 0x7f) snprintf(buf, n, "'%c'", b);
    else snprintf(buf, n, "byte 0x%02x", b);
}

/* Up to 32 bytes of text before offset at, printable ASCII, others as '.'. */
static void show_context(char *buf, size_t n, const char *text, size_t at) {
    size_t from = at > 32 ? at - 32 : 0, k = 0;
    for (size_t i = from; i < at && k + 1 < n; i++) {
        unsigned char c = (unsigned char)text[i];
        buf[k++] = c >= 0x20 && c < 0x7f ? (char)c : '.';
    }
    buf[k] = 0;
}

static rp_skind skind(rp_constraint_kind k) {
    switch (k) {
    case RP_CONSTRAINT_JSON_OBJECT: return RP_SKIND_JSON_OBJECT;
    case RP_CONSTRAINT_REGEX: return RP_SKIND_REGEX;
    case RP_CONSTRAINT_CHOICE: return RP_SKIND_CHOICE;
    case RP_CONSTRAINT_GRAMMAR: return RP_SKIND_GBNF;
    default: return RP_SKIND_JSON_SCHEMA;
    }
}

static int run(int argc, char **argv) {
    rp_structured_opts so;
    rp_structured_opts_init(&so);
    int opt;
    rp_cli_opts_begin();
    while ((opt = rp_cli_next_opt(argc, argv, "+:h", options, NULL, NULL, CMD)) != RP_OPT_END) {
        if (opt >= RP_STRUCTURED_OPT_FIRST && opt <= RP_STRUCTURED_OPT_LAST) {
            if (rp_structured_opts_parse(&so, opt, optarg, CMD)) return RP_EXIT_USAGE;
            continue;
        }
        if (opt == 'h') {
            help(stdout);
            return RP_EXIT_OK;
        }
        return RP_EXIT_USAGE;
    }
    if (!so.flag)
        return rp_cli_usage_error(CMD, "a constraint is required: --json-schema, --json-object, --regex, --choice "
                                       "or --grammar");
    if (optind + 1 < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind + 1]);
    const char *path = optind < argc ? argv[optind] : "-";

    char *text = NULL;
    size_t len = 0;
    rp_svocab *v = NULL;
    rp_sgrammar *g = NULL;
    rp_smatcher *m = NULL;
    int rc = rp_structured_opts_check(&so, CMD);
    if (rc || (rc = read_input(path, &text, &len))) goto done;

    char bytes[256];
    const char *ptrs[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptrs[i] = &bytes[i];
        lens[i] = 1;
    }
    rp_err err = {0};
    rp_sopts sopts = {.allow_whitespace = so.constraint.allow_whitespace};
    const char *ctext = so.text ? so.text : "";
    if (!(v = rp_svocab_new(256, ptrs, lens, NULL, NULL, 0, &err)) ||
        !(g = rp_sgrammar_compile(v, skind(so.kind), ctext, strlen(ctext), &sopts, &err)) ||
        !(m = rp_smatcher_new(g, &err))) {
        rc = rp_cli_runtime_error(CMD, "%s", err.msg);
        goto done;
    }
    char ctx[40], shown[16];
    for (size_t i = 0; i < len; i++) {
        if (rp_smatcher_accept_bytes(m, text + i, 1) == 0) continue;
        show_byte(shown, sizeof shown, (unsigned char)text[i]);
        show_context(ctx, sizeof ctx, text, i);
        const int trailing_newline = i + 1 == len && text[i] == '\n' && rp_smatcher_is_accepting(m);
        printf("invalid at byte %zu: %s cannot follow \"%s\"%s\n", i, shown, ctx,
               trailing_newline ? " (a trailing newline: the text before it is valid)" : "");
        rc = RP_EXIT_RUNTIME;
        goto done;
    }
    if (!rp_smatcher_is_accepting(m)) {
        show_context(ctx, sizeof ctx, text, len);
        printf("invalid at byte %zu: incomplete: the text is a proper prefix of an allowed output (ends \"%s\")\n",
               len, ctx);
        rc = RP_EXIT_RUNTIME;
        goto done;
    }
    printf("valid\n");
    rc = RP_EXIT_OK;
done:
    fflush(stdout);
    rp_smatcher_free(m);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
    free(text);
    rp_structured_opts_free(&so);
    return rc;
}

const rp_cli_command rp_cli_check_output_cmd = {"check-output",
                                            "check a text against a structured-output constraint (schema, regex, ...)",
                                            options, help, run};
