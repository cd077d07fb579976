/* replay's command-line entry: finds the command in the table (commands.c)
 * and runs it. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "replay/version.h"

static void list_commands(FILE *f, const char *prefix) {
    for (const rp_cli_command *const *c = rp_cli_commands; *c; c++)
        if (!prefix || !strncmp((*c)->name, prefix, strlen(prefix)))
            fprintf(f, "  %-15s %s\n", (*c)->name, (*c)->summary);
}

static void usage(FILE *f) {
    fprintf(f, "replay " REPLAY_VERSION ": LLM inference for NVIDIA Hopper, with a CPU reference backend\n"
               "\n"
               "Usage: replay COMMAND [OPTIONS]\n"
               "\n"
               "Commands:\n");
    list_commands(f, NULL);
    fprintf(f, "\n"
               "Options:\n"
               "  -h, --help       show this help (replay COMMAND --help for a command's options)\n"
               "  -V, --version    print the version\n"
               "\n"
               "Exit codes (every command): 0 done; 1 failed (a model that does not load, a port in use,\n"
               "an error while running); 2 a wrong command line, reported before anything loads;\n"
               "130 and 143 stopped by SIGINT (Ctrl-C) and SIGTERM.\n"
               "\n"
               "Examples:\n"
               "  replay generate --dummy-weights tiny-qwen3 --prompt-ids 1,2,3 --max-tokens 16\n"
               "  replay generate --model ~/models/Qwen3-0.6B --prompt 'The capital of France is'\n"
               "  replay chat --model ~/models/Qwen3-0.6B\n"
               "  replay serve ~/models/Qwen3-0.6B --port 8000\n");
}

static int bench_usage(FILE *f, int rc) {
    fprintf(f, "Usage: replay bench SUBCOMMAND [OPTIONS]\n\nSubcommands:\n");
    list_commands(f, "bench ");
    fprintf(f, "\nreplay bench SUBCOMMAND --help shows a subcommand's options.\n");
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return RP_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return RP_EXIT_OK;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
        printf("replay %s\n", REPLAY_VERSION);
        return RP_EXIT_OK;
    }
    int words = 0;
    const rp_cli_command *c = rp_cli_find_command(argc - 1, argv + 1, &words);
    if (c) return c->run(argc - words, argv + words);
    if (!strcmp(cmd, "bench")) {
        if (argc < 3) return bench_usage(stderr, RP_EXIT_USAGE);
        if (!strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) return bench_usage(stdout, RP_EXIT_OK);
        return rp_cli_usage_error("bench", "unknown subcommand '%s' (decode, offline, serve, kernels, structured)", argv[2]);
    }
    return rp_cli_usage_error(NULL, "unknown command '%s'", cmd);
}
