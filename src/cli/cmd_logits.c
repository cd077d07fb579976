/* `replay logits`: writes the model's logits at the last positions of a
 * prompt to a float32 file, for comparisons against other implementations
 * (tools/gpu_compare.py runs it against transformers on the GPU machine).
 *
 * Everything the command line says is checked before the model loads (the
 * ids against the vocabulary and the context, the output's directory): a
 * mistake costs no prefill. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/bench_common.h"
#include "cli/cli.h"
#include "cli/token_ids.h"
#include "engine/runner.h"

#define CMD "logits"
#define DEFAULT_BATCHED_TOKENS 2048

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay logits (--model DIR | --dummy-weights NAME) --prompt-ids IDS|@FILE --out FILE [OPTIONS]\n"
            "\n"
            "Runs the prompt through the batched prefill path and writes float32 logits\n"
            "[positions][vocab] (little-endian) for the last --last positions to FILE.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Input:\n"
            "  --prompt-ids IDS|@FILE  comma-separated token ids, or @FILE with ids separated by commas or\n"
            "                          whitespace, each below the vocabulary size; required\n"
            "\n"
            "Engine:\n"
            "  --max-num-batched-tokens N  prompt tokens one prefill step feeds; 1 feeds a token a step\n"
            "                              (default %d)\n"
            "\n",
            DEFAULT_BATCHED_TOKENS);
    rp_bench_output_help(f, "  --out FILE             where to write (its directory must exist); required\n"
                            "  --last N               positions to write, counted from the end (default: all)\n");
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"prompt-ids", required_argument, 0, 'I'},
    {"last", required_argument, 0, 'l'},
    {"max-num-batched-tokens", required_argument, 0, 'c'},
    {"out", required_argument, 0, 'o'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

/* Writes k rows of vocab floats to path; 0, or the message printed with the
 * reason and a partial regular file removed (a short file must not pass for
 * logits; a device such as /dev/full, or a link, is left alone). */
static int write_logits(const char *path, const float *rows, int k, int vocab) {
    FILE *f = fopen(path, "wb");
    if (!f) return rp_cli_runtime_error(CMD, "cannot write %s: %s", path, strerror(errno));
    const size_t count = (size_t)k * vocab;
    int err = fwrite(rows, sizeof(float), count, f) != count ? errno : 0;
    /* buffered bytes reach the file (or fail to: a full disk) only at fclose */
    if (fclose(f) != 0 && !err) err = errno;
    if (err) {
        struct stat st;
        if (!lstat(path, &st) && S_ISREG(st.st_mode)) unlink(path);
        return rp_cli_runtime_error(CMD, "cannot write %s: %s", path, strerror(err));
    }
    return 0;
}

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    const char *ids_arg = NULL, *out_path = NULL;
    long last = 0, chunk = DEFAULT_BATCHED_TOKENS;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'I': ids_arg = optarg; break;
        case 'o': out_path = optarg; break;
        case 'l':
            if (rp_parse_int(optarg, 1, 1 << 24, &last))
                return rp_cli_usage_error(CMD, "--last must be an integer from 1 to %d, got '%s'", 1 << 24, optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &chunk))
                return rp_cli_usage_error(CMD, "--max-num-batched-tokens must be an integer from 1 to %d, got '%s'",
                                          1 << 20, optarg);
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!ids_arg) return rp_cli_usage_error(CMD, "--prompt-ids is required");
    if (!out_path) return rp_cli_usage_error(CMD, "--out is required");
    if (rp_cli_check_output("--out", out_path, CMD)) return RP_EXIT_USAGE;
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    int32_t *ids;
    int n;
    if (rp_cli_read_ids("--prompt-ids", ids_arg, mo.cfg.vocab_size, &ids, &n, CMD)) return RP_EXIT_USAGE;
    /* the runner's context is the prompt and one more position */
    if (n >= mo.cfg.max_position_embeddings) {
        free(ids);
        return rp_cli_usage_error(CMD, "--prompt-ids has %d tokens; the model's context of %d takes at most %d", n,
                                  mo.cfg.max_position_embeddings, mo.cfg.max_position_embeddings - 1);
    }
    rp_runner_config rcfg;
    rp_cli_runner_config(&mo, &rcfg);
    int rows = (int)(chunk < n ? chunk : n);
    rcfg.num_pages = (n + 1 + 15) / 16;
    rcfg.max_seqs = 1;
    rcfg.max_context = n + 1;
    rcfg.max_batched_tokens = rows;
    rcfg.max_logit_rows = rows;
    rcfg.disable_cuda_graph = 1;
    if (rp_cli_is_worker(&mo)) return rp_cli_runner_worker(&mo, &rcfg, CMD);
    rp_runner *run = rp_cli_runner_new(&mo, &rcfg, CMD);
    if (!run) {
        free(ids);
        return RP_EXIT_RUNTIME;
    }
    const int vocab = run->model->cfg.vocab_size;
    int rc = RP_EXIT_RUNTIME;
    rp_err err;
    float *logits = malloc((size_t)n * vocab * sizeof(float));
    if (!logits) {
        rc = rp_cli_runtime_error(CMD, "out of memory for %d x %d logits", n, vocab);
        goto out;
    }
    const int32_t *prompts[1] = {ids};
    float *outs[1] = {logits};
    if (rp_runner_run_prompts(run, 1, prompts, &n, outs, 0, NULL, &err)) {
        rc = rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    /* --last beyond the prompt writes all of it (tools/gpu_compare.py asks for 8 of any prompt) */
    const int k = last > 0 && last < n ? (int)last : n;
    rc = write_logits(out_path, logits + (size_t)(n - k) * vocab, k, vocab) ? RP_EXIT_RUNTIME : RP_EXIT_OK;
out:
    free(logits);
    rp_runner_free(run);
    free(ids);
    return rc;
}

const rp_cli_command rp_cli_logits = {"logits", "write a prompt's logits to a file, for comparisons", options, help, run};
