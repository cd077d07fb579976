/* `replay logits`: writes the model's logits at the last positions of a
 * prompt to a float32 file, for comparisons against other implementations
 * (tools/gpu_compare.py runs it against transformers on the GPU machine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "engine/runner.h"

#define CMD "logits"

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay logits (--model DIR | --dummy-weights NAME) --prompt-ids IDS|@FILE --out FILE [OPTIONS]\n"
            "\n"
            "Runs the prompt through the batched prefill path and writes float32 logits\n"
            "[positions][vocab] (little-endian) for the last --last positions to FILE.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "  --prompt-ids IDS   comma-separated token ids, or @FILE with ids separated by commas or\n"
            "                     whitespace; required\n"
            "  --last N           positions to write, counted from the end (default: all)\n"
            "  --chunk N          prefill tokens per step (default 2048)\n"
            "  --out FILE         where to write; required\n"
            "\n" RP_COMMON_OPTIONS_HELP);
}

static int read_ids(const char *arg, int32_t **ids, int *n) {
    char *text = NULL;
    if (arg[0] == '@') {
        FILE *f = fopen(arg + 1, "rb");
        if (!f) return -1;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc((size_t)len + 1);
        if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
            fclose(f);
            free(text);
            return -1;
        }
        text[len] = 0;
        fclose(f);
    } else {
        text = strdup(arg);
    }
    int cap = 64, count = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    char *p = text;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff) {
            free(v);
            free(text);
            return -1;
        }
        if (count == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[count++] = (int32_t)x;
        p = end;
    }
    free(text);
    if (count == 0) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = count;
    return 0;
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"prompt-ids", required_argument, 0, 'I'},
    {"last", required_argument, 0, 'l'},
    {"chunk", required_argument, 0, 'c'},
    {"out", required_argument, 0, 'o'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    const char *ids_arg = NULL, *out_path = NULL;
    long last = 0, chunk = 2048;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'I': ids_arg = optarg; break;
        case 'o': out_path = optarg; break;
        case 'l':
            if (rp_parse_int(optarg, 1, 1 << 24, &last)) return rp_cli_usage_error(CMD, "--last must be >= 1");
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &chunk)) return rp_cli_usage_error(CMD, "--chunk must be >= 1");
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    if (!ids_arg || !out_path) return rp_cli_usage_error(CMD, "--prompt-ids and --out are required");
    int32_t *ids;
    int n;
    if (read_ids(ids_arg, &ids, &n)) return rp_cli_usage_error(CMD, "cannot read token ids from '%s'", ids_arg);
    rp_runner_config rcfg;
    rp_cli_runner_config(&mo, &rcfg);
    int rows = (int)(chunk < n ? chunk : n);
    rcfg.num_pages = (n + 1 + 15) / 16;
    rcfg.max_seqs = 1;
    rcfg.max_context = n + 1;
    rcfg.max_batched_tokens = rows;
    rcfg.max_logit_rows = rows;
    rcfg.disable_cuda_graph = 1;
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
        rc = rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] >= vocab) {
            rc = rp_cli_usage_error(CMD, "token id %d is outside the vocabulary (%d)", ids[i], vocab);
            goto out;
        }
    const int32_t *prompts[1] = {ids};
    float *outs[1] = {logits};
    if (rp_runner_run_prompts(run, 1, prompts, &n, outs, 0, NULL, &err)) {
        rc = rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    int k = last > 0 && last < n ? (int)last : n;
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits + (size_t)(n - k) * vocab, sizeof(float), (size_t)k * vocab, f) != (size_t)k * vocab) {
        if (f) fclose(f);
        rc = rp_cli_runtime_error(CMD, "cannot write %s", out_path);
        goto out;
    }
    fclose(f);
    rc = RP_EXIT_OK;
out:
    free(logits);
    rp_runner_free(run);
    free(ids);
    return rc;
}

const rp_cli_command rp_cli_logits = {"logits", "write a prompt's logits to a file, for comparisons", options, help, run};
