/* The table of commands: replay --help lists it, main dispatches on it, and
 * the help-text test walks it. */
#include <string.h>

#include "cli/cli.h"

const rp_cli_command *const rp_cli_commands[] = {
    &rp_cli_generate,    &rp_cli_chat,        &rp_cli_serve,    &rp_cli_bench_decode, &rp_cli_bench_offline,
    &rp_cli_bench_serve, &rp_cli_bench_kernels, &rp_cli_bench_structured, &rp_cli_profile, &rp_cli_tokenize, &rp_cli_logits,
    &rp_cli_chat_template, &rp_cli_check_output_cmd,
    NULL,
};

const rp_cli_command *rp_cli_find_command(int argc, char **argv, int *words) {
    for (const rp_cli_command *const *c = rp_cli_commands; *c; c++) {
        const char *name = (*c)->name, *space = strchr(name, ' ');
        if (!space && argc >= 1 && !strcmp(argv[0], name)) {
            *words = 1;
            return *c;
        }
        if (space && argc >= 2 && !strncmp(argv[0], name, (size_t)(space - name)) &&
            argv[0][space - name] == 0 && !strcmp(argv[1], space + 1)) {
            *words = 2;
            return *c;
        }
    }
    return NULL;
}
