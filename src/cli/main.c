/* replay's command-line entry: dispatches to one command per file. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define REPLAY_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "replay " REPLAY_VERSION ": LLM inference for NVIDIA Hopper, with a CPU reference backend\n"
            "\n"
            "Usage: replay COMMAND [OPTIONS]\n"
            "\n"
            "Commands:\n"
            "  generate   generate text from a prompt, streaming tokens\n"
            "  chat       an interactive chat with the model's chat template\n"
            "  serve      an OpenAI-compatible HTTP server (completions, chat, streaming)\n"
            "  bench      benchmarks measured inside replay (bench decode)\n"
            "  profile    per-kernel times and host overheads of a decode step (CUDA)\n"
            "  tokenize   print the token ids (and pieces) of a text\n"
            "  logits     write a prompt's logits to a file, for comparisons\n"
            "\n"
            "Options:\n"
            "  -h, --help       show this help (COMMAND --help for a command's options)\n"
            "  -V, --version    print the version\n"
            "\n"
            "Examples:\n"
            "  replay generate --dummy-weights tiny-qwen3 --prompt-ids 1,2,3 --max-tokens 16\n"
            "  replay generate --model ~/models/Qwen3-0.6B --prompt 'The capital of France is'\n"
            "  replay generate --model ~/models/Qwen3-0.6B --chat --prompt 'Hello!' --temperature 0.7\n");
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
    if (!strcmp(cmd, "generate")) return rp_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return rp_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return rp_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return rp_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return rp_cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile")) return rp_cmd_profile(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return rp_cmd_tokenize(argc - 1, argv + 1);
    return rp_cli_usage_error(NULL, "unknown command '%s'", cmd);
}
