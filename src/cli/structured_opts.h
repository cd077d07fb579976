/* Structured output on the command line (generate, chat): one constraint
 * from --json-schema FILE, --json-object, --regex RE, --choice STR
 * (repeated) or --grammar FILE, with --structured-whitespace; files read
 * and the constraint compiled (rp_constraint_validate) before the model
 * loads, so a bad one is a usage error (exit status 2). docs/cli.md. */
#ifndef RP_CLI_STRUCTURED_OPTS_H
#define RP_CLI_STRUCTURED_OPTS_H

#include "replay/engine.h"

#define RP_STRUCTURED_LONG_OPTIONS                                                                          \
    {"json-schema", required_argument, 0, 0x1e0}, {"json-object", no_argument, 0, 0x1e1},                   \
        {"regex", required_argument, 0, 0x1e2}, {"choice", required_argument, 0, 0x1e3},                    \
        {"grammar", required_argument, 0, 0x1e4}, {"structured-whitespace", required_argument, 0, 0x1e5}

/* the option codes, for a command's switch */
#define RP_STRUCTURED_OPT_FIRST 0x1e0
#define RP_STRUCTURED_OPT_LAST 0x1e5

#define RP_STRUCTURED_OPTIONS_HELP                                                                    \
    "Structured output (at most one; default: none; docs/structured.md):\n"                          \
    "  --json-schema FILE     the output is JSON valid against the JSON Schema in FILE (default none)\n" \
    "  --json-object          the output is a JSON object\n"                                          \
    "  --regex RE             the whole output matches the regular expression RE (default none)\n"   \
    "  --choice STR           the output is one of the strings given; repeat for each (default none)\n" \
    "  --grammar FILE         the output follows the GBNF grammar in FILE, rule root (default none)\n" \
    "  --structured-whitespace MODE  JSON whitespace between tokens: any (as vLLM) or compact\n"      \
    "                         (none at all) (default any)\n"

#define RP_STRUCTURED_MAX_CHOICES 256

typedef struct rp_structured_opts {
    const char *flag; /* the constraint's option, NULL: none */
    rp_constraint_kind kind;
    const char *arg;  /* its argument: a file, a regex */
    const char *choices[RP_STRUCTURED_MAX_CHOICES];
    int num_choices;
    int compact;
    char *text;       /* the constraint's text (owned) */
    rp_constraint constraint; /* what goes into the request (kind NONE: none) */
} rp_structured_opts;

void rp_structured_opts_init(rp_structured_opts *o);
/* One of RP_STRUCTURED_LONG_OPTIONS: 0, or RP_EXIT_USAGE (printed). */
int rp_structured_opts_parse(rp_structured_opts *o, int opt, const char *arg, const char *cmd);
/* After the options: files read, choices joined, the constraint compiled
 * against bytes. 0, or RP_EXIT_USAGE (printed). Only this allocates: call
 * rp_structured_opts_free after it, whatever it returned. */
int rp_structured_opts_check(rp_structured_opts *o, const char *cmd);
void rp_structured_opts_free(rp_structured_opts *o);

#endif
