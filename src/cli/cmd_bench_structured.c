/* `replay bench structured`: how long a token mask takes on the host. A JSON
 * schema (built in, or --schema FILE with --instance FILE) is compiled for a
 * tokenizer's vocabulary, then an instance of it is walked token by token,
 * timing rp_smatcher_fill_mask before each token (and before the final eos),
 * over several passes with a fresh matcher each (a request each).
 * bench/RESULTS.md ("Issue 41") has the numbers. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench_common.h"
#include "cli/cli.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

#define CMD "bench structured"

/* A typical extraction schema: nested object, array of objects, enum,
 * bounded integers, a date, booleans, optional fields. */
static const char default_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"order_id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"customer\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"email\":{\"type\":\"string\","
    "\"format\":\"email\"},\"age\":{\"type\":\"integer\",\"minimum\":18,\"maximum\":120}},\"required\":[\"name\",\"email\"]},"
    "\"status\":{\"enum\":[\"pending\",\"shipped\",\"delivered\",\"cancelled\"]},"
    "\"placed\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"items\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},"
    "\"quantity\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":1000},\"price\":{\"type\":\"number\"},"
    "\"gift\":{\"type\":\"boolean\"}},\"required\":[\"sku\",\"quantity\",\"price\"]}},"
    "\"notes\":{\"type\":[\"string\",\"null\"]}},"
    "\"required\":[\"order_id\",\"customer\",\"status\",\"placed\",\"items\"]}";

static const char default_instance[] =
    "{\"order_id\":\"3f2b8c1e-9d4a-4e7b-a2c5-7f1e0d9b6a43\",\"customer\":{\"name\":\"Zoë Müller-Ortega\","
    "\"email\":\"zoe.mueller@example.org\",\"age\":34},\"status\":\"shipped\",\"placed\":\"2024-11-05\","
    "\"items\":[{\"sku\":\"KB-2291-BLK\",\"quantity\":2,\"price\":49.99,\"gift\":false},{\"sku\":\"MS-0042\","
    "\"quantity\":1,\"price\":19.5},{\"sku\":\"USB-C cable, 2 m (braided)\",\"quantity\":3,\"price\":8.25,\"gift\":true}],"
    "\"notes\":\"Leave at the side door; ring twice. \\\"Fragile\\\" items inside.\"}";

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay bench structured --tokenizer DIR [OPTIONS]\n"
            "\n"
            "Times the structured-output token mask on the host: a JSON schema is compiled for\n"
            "the tokenizer's vocabulary, then an instance of it is walked token by token, timing\n"
            "the mask before every token; prints mean, p50, p99 and max per token.\n"
            "\n"
            "Input:\n"
            "  --tokenizer DIR        directory with tokenizer.json (and tokenizer_config.json); required\n"
            "  --schema FILE          JSON schema to constrain with (default: a built-in order record)\n"
            "  --instance FILE        JSON text valid under --schema, walked token by token\n"
            "                         (required with --schema)\n"
            "  --passes N             walks of the instance, each with a fresh matcher (default 50)\n"
            "  --whitespace           allow JSON whitespace between tokens (default: compact)\n"
            "  --json-object          constrain to any JSON object (json_object) instead of the schema\n"
            "\n");
    rp_bench_output_help(f, "");
}

static const struct option options[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"schema", required_argument, 0, 's'},
                                         {"instance", required_argument, 0, 'i'},
                                         {"passes", required_argument, 0, 'p'},
                                         {"whitespace", no_argument, 0, 'w'},
                                         {"json-object", no_argument, 0, 'j'},
                                         RP_COMMON_LONG_OPTIONS,
                                         {0, 0, 0, 0}};

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run(int argc, char **argv) {
    const char *tok_dir = NULL, *schema_path = NULL, *inst_path = NULL;
    long passes = 50;
    int ws = 0, json_object = 0, opt;
    rp_cli_opts_begin();
    while ((opt = rp_cli_next_opt(argc, argv, "+:hq", options, NULL, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 't': tok_dir = optarg; break;
        case 's': schema_path = optarg; break;
        case 'i': inst_path = optarg; break;
        case 'p':
            if (rp_parse_int(optarg, 1, 100000, &passes)) return rp_cli_usage_error(CMD, "--passes: expected 1..100000");
            break;
        case 'w': ws = 1; break;
        case 'j': json_object = 1; break;
        case 'h': help(stdout); return RP_EXIT_OK;
        default: return RP_EXIT_USAGE;
        }
    }
    if (!tok_dir) return rp_cli_usage_error(CMD, "--tokenizer DIR is required");
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!!schema_path != !!inst_path) return rp_cli_usage_error(CMD, "--schema and --instance go together");
    if (rp_cli_check_dir_file("--tokenizer", tok_dir, "tokenizer.json", CMD)) return RP_EXIT_USAGE;

    size_t schema_len = sizeof default_schema - 1, inst_len = sizeof default_instance - 1;
    char *schema = NULL, *inst = NULL;
    if (schema_path) {
        schema = read_file(schema_path, &schema_len);
        inst = read_file(inst_path, &inst_len);
        if (!schema || !inst) {
            free(schema), free(inst);
            return rp_cli_runtime_error(CMD, "cannot read %s", schema ? inst_path : schema_path);
        }
        while (inst_len && strchr(" \t\r\n", inst[inst_len - 1])) inst[--inst_len] = 0; /* the file's last newline */
    }
    const char *schema_text = schema ? schema : default_schema, *inst_text = inst ? inst : default_instance;
    int rc = RP_EXIT_RUNTIME;
    rp_err err = {0};
    rp_svocab *v = NULL;
    rp_sgrammar *g = NULL;
    int32_t *ids = NULL;
    double *t_us = NULL;
    uint32_t *mask = NULL;
    rp_tokenizer *tok = rp_tokenizer_load(tok_dir, &err);
    if (!tok) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    int n = rp_tokenizer_vocab_size(tok);
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *special = calloc((size_t)n, 1);
    int32_t stops[8];
    int n_stops = rp_chat_stop_ids(tok, stops, 8);
    if (!bytes || !lens || !special) {
        free(bytes), free(lens), free(special);
        rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (rp_tokenizer_token_bytes(tok, i, &bytes[i], &lens[i])) bytes[i] = NULL, lens[i] = 0;
        special[i] = (uint8_t)rp_tokenizer_is_special(tok, i);
    }
    double t0 = now_us();
    v = rp_svocab_new(n, bytes, lens, special, stops, n_stops, &err);
    free(bytes), free(lens), free(special);
    if (!v) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    double t1 = now_us();
    rp_sopts so = {.allow_whitespace = ws};
    g = rp_sgrammar_compile(v, json_object ? RP_SKIND_JSON_OBJECT : RP_SKIND_JSON_SCHEMA, schema_text, schema_len, &so,
                            &err);
    double t2 = now_us();
    if (!g) {
        rp_cli_runtime_error(CMD, "--schema: %s", err.msg);
        goto out;
    }
    size_t n_ids;
    if (rp_tokenizer_encode(tok, inst_text, inst_len, &ids, &n_ids, &err)) {
        rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    int W = rp_svocab_mask_words(v), steps = (int)n_ids + 1;
    t_us = malloc((size_t)passes * (size_t)steps * sizeof *t_us);
    mask = malloc((size_t)W * sizeof *mask);
    if (!t_us || !mask) {
        rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    long allowed_sum = 0;
    double first_pass_us = 0;
    for (long p = 0; p < passes; p++) {
        rp_smatcher *m = rp_smatcher_new(g, &err);
        if (!m) {
            rp_cli_runtime_error(CMD, "%s", err.msg);
            goto out;
        }
        for (int k = 0; k < steps; k++) {
            double a = now_us();
            rp_smatcher_fill_mask(m, mask);
            double b = now_us();
            t_us[p * steps + k] = b - a;
            if (!p) first_pass_us += b - a;
            int32_t id = k < (int)n_ids ? ids[k] : stops[0];
            if (!(mask[id >> 5] >> (id & 31) & 1) || rp_smatcher_accept_token(m, id)) {
                rp_smatcher_free(m);
                rp_cli_runtime_error(CMD, "the instance's token %d (step %d) is not allowed by the schema", id, k);
                goto out;
            }
            if (!p)
                for (int w = 0; w < W; w++) allowed_sum += __builtin_popcount(mask[w]);
        }
        rp_smatcher_free(m);
    }
    long total = passes * steps;
    double sum = 0;
    for (long i = 0; i < total; i++) sum += t_us[i];
    qsort(t_us, (size_t)total, sizeof *t_us, cmp_double);
    printf("vocabulary: %d tokens, built in %.1f ms\n", n, (t1 - t0) / 1e3);
    printf("%s: %zu bytes, compiled in %.1f ms (%s)\n", json_object ? "json_object" : "schema",
           json_object ? (size_t)0 : schema_len, (t2 - t1) / 1e3, ws ? "whitespace" : "compact");
    printf("instance: %zu tokens (+ eos), mean %.0f tokens allowed per step\n", n_ids, (double)allowed_sum / steps);
    printf("mask per token over %ld passes (%ld masks): mean %.1f us  p50 %.1f us  p99 %.1f us  max %.1f us\n", passes,
           total, sum / (double)total, t_us[total / 2], t_us[(long)((double)total * 0.99)], t_us[total - 1]);
    printf("first pass (fresh per-stack memo): mean %.1f us per token\n", first_pass_us / steps);
    rc = RP_EXIT_OK;
out:
    free(t_us), free(mask), free(ids), free(schema), free(inst);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
    rp_tokenizer_free(tok);
    return rc;
}

const rp_cli_command rp_cli_bench_structured = {"bench structured", "time structured-output token masks on the host",
                                                options, help, run};
