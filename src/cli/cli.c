/* Model options, loading and error printing shared by CLI commands. */
#include "cli/cli.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/draft.h"
#include "engine/ngram.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "replay/engine.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

void rp_model_opts_init(rp_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->load_format = "auto";
    o->device = "auto";
}

int rp_parse_int(const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int rp_parse_float(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int rp_parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static void vprint(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "replay%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int rp_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint(cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try 'replay %s%s--help' for more information.\n", cmd ? cmd : "", cmd ? " " : "");
    return RP_EXIT_USAGE;
}

int rp_cli_runtime_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint(cmd, fmt, ap);
    va_end(ap);
    return RP_EXIT_RUNTIME;
}

/* Options of other engines that mean something in replay: an unknown one
 * gets a hint instead of a bare "unknown option". equiv is replay's option
 * when there is one (shown only if the command takes it), else note says
 * what replay does instead. */
static const struct {
    const char *name, *from, *equiv, *note;
} foreign_options[] = {
    {"--enforce-eager", "vLLM", "disable-cuda-graph", NULL},
    {"--block-size", "vLLM", "page-size", NULL},
    {"--num-gpu-blocks-override", "vLLM", "num-pages", NULL},
    {"--max-num-batched-tokens", "vLLM", "max-num-batched-tokens", NULL},
    {"--max-batch-tokens", "an older replay", "max-num-batched-tokens", NULL},
    {"--max-context", "an older replay", "max-model-len", NULL},
    {"--chunk", "an older replay", "max-num-batched-tokens", NULL},
    {"--random-range", "an older replay", "random-range-ratio", NULL},
    {"--trust-remote-code", "vLLM", NULL, "replay runs no model code, so it needs no --trust-remote-code"},
    {"-tp", "vLLM", "tensor-parallel-size", NULL},
    {"--download-dir", "vLLM", NULL, "replay loads a local directory: download it first (README, 'Models')"},
    {"--revision", "vLLM", NULL, "replay loads a local directory: download the revision first (README, 'Models')"},
    {"--disable-log-requests", "vLLM", "disable-access-log", NULL},
    {"--uvicorn-log-level", "vLLM", "log-level", NULL},
    {"--n-predict", "llama.cpp", "max-tokens", NULL},
    {"-n", "llama.cpp", "max-tokens", NULL},
    {"--ctx-size", "llama.cpp", "max-model-len", NULL},
    {"-c", "llama.cpp", "max-model-len", NULL},
    {"--temp", "llama.cpp", "temperature", NULL},
    {"--repeat-penalty", "llama.cpp", "repetition-penalty", NULL},
    {"--batch-size", "llama.cpp", "max-num-batched-tokens", NULL},
    {"-b", "llama.cpp", "max-num-batched-tokens", NULL},
    {"--parallel", "llama.cpp", "max-num-seqs", NULL},
    {"-np", "llama.cpp", "max-num-seqs", NULL},
    {"--file", "llama.cpp", "prompt-file", NULL},
    {"-f", "llama.cpp", "prompt-file", NULL},
    {"-p", "llama.cpp", "prompt", NULL},
    {"-m", "llama.cpp", "model", NULL},
    {"-s", "llama.cpp", "seed", NULL},
    {"-t", "llama.cpp", "threads", NULL},
    {"--reverse-prompt", "llama.cpp", "stop", NULL},
    {"-r", "llama.cpp", "stop", NULL},
    {"--system-prompt", "llama.cpp", "system", NULL},
    {"-sys", "llama.cpp", "system", NULL},
    {"--n-gpu-layers", "llama.cpp", NULL, "replay keeps the whole model on the GPU (--device cuda)"},
    {"-ngl", "llama.cpp", NULL, "replay keeps the whole model on the GPU (--device cuda)"},
    {"--flash-attn", "llama.cpp", NULL, "replay's attention kernels are always fused"},
    {"-fa", "llama.cpp", NULL, "replay's attention kernels are always fused"},
    {"--conversation", "llama.cpp", NULL, "use 'replay chat'"},
    {"-cnv", "llama.cpp", NULL, "use 'replay chat'"},
    {"--mlock", "llama.cpp", NULL, "replay reads its weights into memory; there is nothing to lock"},
    {"--jinja", "llama.cpp", NULL, "replay always renders tokenizer_config.json's chat template"},
};

static int takes_option(const struct option *longopts, const char *name) {
    for (const struct option *o = longopts; o->name; o++)
        if (!strcmp(o->name, name)) return 1;
    return 0;
}

/* "unknown option '--temp'", with a hint when another engine knows it. */
static void unknown_option(const char *arg, const struct option *longopts, const char *cmd) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
    for (size_t i = 0; i < sizeof foreign_options / sizeof foreign_options[0]; i++) {
        if (strcmp(foreign_options[i].name, name)) continue;
        if (foreign_options[i].note) {
            rp_cli_usage_error(cmd, "unknown option '%s' (%s's): %s", name, foreign_options[i].from,
                               foreign_options[i].note);
            return;
        }
        if (takes_option(longopts, foreign_options[i].equiv)) {
            rp_cli_usage_error(cmd, "unknown option '%s': %s's %s is replay's --%s", name, foreign_options[i].from,
                               name, foreign_options[i].equiv);
            return;
        }
    }
    rp_cli_usage_error(cmd, "unknown option '%s'", name);
}

void rp_cli_opts_begin(void) {
    optind = 1;
    opterr = 0; /* the messages are ours (rp_cli_next_opt) */
}

/* The options every command takes (RP_COMMON_LONG_OPTIONS); 1 if opt was one. */
static int common_opt(int opt, const char *arg, const char *cmd, int *bad) {
    *bad = 0;
    if (opt == 'q') {
        rp_log_set_level(RP_LOG_ERROR);
        return 1;
    }
    if (opt == 0x1a0) {
        enum rp_log_level level;
        if (rp_log_parse_level(arg, &level)) {
            rp_cli_usage_error(cmd, "--log-level must be error, warn, info or debug, got '%s'", arg);
            *bad = 1;
        } else {
            rp_log_set_level(level);
        }
        return 1;
    }
    if (opt == 0x1a1) {
        enum rp_log_format format;
        if (rp_log_parse_format(arg, &format)) {
            rp_cli_usage_error(cmd, "--log-format must be text or json, got '%s'", arg);
            *bad = 1;
        } else {
            rp_log_set_format(format);
        }
        return 1;
    }
    return 0;
}

int rp_cli_next_opt(int argc, char **argv, const char *shortopts, const struct option *longopts, rp_model_opts *mo,
                    struct rp_sampling_params *sp, const char *cmd) {
    for (;;) {
        const int before = optind;
        const int opt = getopt_long(argc, argv, shortopts, longopts, NULL);
        if (opt == -1) return RP_OPT_END;
        /* getopt stays on an element while it reads a cluster of short options
         * ("-ngl"): the element it is on is the one to name */
        const char *elem = argv[optind > before ? optind - 1 : optind];
        if (opt == ':') {
            rp_cli_usage_error(cmd, "option '%s' needs a value", elem);
            return RP_OPT_ERROR;
        }
        if (opt == '?') {
            unknown_option(elem, longopts, cmd);
            return RP_OPT_ERROR;
        }
        int bad;
        if (common_opt(opt, optarg, cmd, &bad)) {
            if (bad) return RP_OPT_ERROR;
            continue;
        }
        int r = mo ? rp_model_opts_parse(mo, opt, optarg, cmd) : 0;
        if (r == 0 && sp) r = rp_sampling_opts_parse(sp, opt, optarg, cmd);
        if (r < 0) return RP_OPT_ERROR;
        if (r == 0) return opt;
    }
}

int rp_model_opts_parse(rp_model_opts *o, int opt, const char *arg, const char *cmd) {
    long v;
    switch (opt) {
    case 0x100: o->model_dir = arg; return 1;
    case 0x101: o->dummy_name = arg; return 1;
    case 0x102:
        if (strcmp(arg, "auto") && strcmp(arg, "dummy") && strcmp(arg, "safetensors")) {
            rp_cli_usage_error(cmd, "--load-format must be auto, safetensors or dummy, got '%s'", arg);
            return -1;
        }
        o->load_format = arg;
        return 1;
    case 0x103:
        if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda")) {
            rp_cli_usage_error(cmd, "--device must be auto, cpu or cuda, got '%s'", arg);
            return -1;
        }
        o->device = arg;
        return 1;
    case 0x104:
        if (rp_parse_u64(arg, &o->weight_seed)) {
            rp_cli_usage_error(cmd, "--weight-seed must be a non-negative integer, got '%s'", arg);
            return -1;
        }
        return 1;
    case 0x105:
        if (rp_parse_int(arg, 1, 1024, &v)) {
            rp_cli_usage_error(cmd, "--threads must be an integer from 1 to 1024, got '%s'", arg);
            return -1;
        }
        o->threads = (int)v;
        return 1;
    case 0x106: o->disable_decode_step = 1; return 1;
    case 0x109:
        if (rp_parse_int(arg, 1, 1024, &v)) {
            rp_cli_usage_error(cmd, "--tensor-parallel-size must be 1, 2, 4 or 8, got '%s'", arg);
            return -1;
        }
        o->tp_size = (int)v;
        return 1;
    case 0x10a:
        if (rp_parse_int(arg, 1, RP_BS_MAX_NODES, &v)) {
            rp_cli_usage_error(cmd, "--nnodes must be an integer from 1 to %d, got '%s'", RP_BS_MAX_NODES, arg);
            return -1;
        }
        o->nnodes = (int)v;
        return 1;
    case 0x10b:
        if (rp_parse_int(arg, 0, RP_BS_MAX_NODES - 1, &v)) {
            rp_cli_usage_error(cmd, "--node-rank must be an integer from 0 to %d, got '%s'", RP_BS_MAX_NODES - 1, arg);
            return -1;
        }
        o->node_rank = (int)v;
        return 1;
    case 0x10c: {
        char host[256];
        int port;
        rp_err err;
        if (rp_bs_parse_addr(arg, host, sizeof host, &port, &err)) {
            rp_cli_usage_error(cmd, "--dist-init-addr: %s", err.msg);
            return -1;
        }
        o->dist_init_addr = arg;
        return 1;
    }
    case 0x108:
        if (strcmp(arg, "none") && strcmp(arg, "fp8")) {
            rp_cli_usage_error(cmd, "--quantization must be none or fp8, got '%s'", arg);
            return -1;
        }
        o->quantize_fp8 = !strcmp(arg, "fp8");
        return 1;
    case 0x10e:
        if (rp_parse_int(arg, 1, 86400, &v)) {
            rp_cli_usage_error(cmd, "--dist-timeout must be a number of seconds from 1 to 86400, got '%s'", arg);
            return -1;
        }
        o->dist_timeout_s = (int)v;
        return 1;
    case 0x10f:
        o->disable_custom_all_reduce = 1;
        return 1;
    case 0x10d: {
        rp_kv_dtype d;
        rp_err err;
        if (rp_kv_dtype_parse(arg, &d, &err)) {
            rp_cli_usage_error(cmd, "--kv-cache-dtype: %s", err.msg);
            return -1;
        }
        o->kv_cache_dtype = arg;
        return 1;
    }
    case 0x107:
        /* vLLM's --dtype: replay's weights and activations are bfloat16, and
         * a float16 or float32 checkpoint is converted as it loads */
        if (strcmp(arg, "auto") && strcmp(arg, "bfloat16") && strcmp(arg, "bf16")) {
            rp_cli_usage_error(cmd, "--dtype must be auto or bfloat16 (replay computes in bfloat16), got '%s'", arg);
            return -1;
        }
        return 1;
    }
    return 0;
}

int rp_sampling_opts_parse(rp_sampling_params *sp, int opt, const char *arg, const char *cmd) {
    static const char *names[] = {"temperature",      "top-p",            "top-k",             "min-p",
                                  "repetition-penalty", "presence-penalty", "frequency-penalty", "seed"};
    if (opt < 0x120 || opt > 0x127) return 0;
    const char *name = names[opt - 0x120];
    double d;
    long v;
    if (opt == 0x122) {
        if (rp_parse_int(arg, -1, 1 << 30, &v)) {
            rp_cli_usage_error(cmd, "--top-k must be an integer >= -1, got '%s'", arg);
            return -1;
        }
        sp->top_k = (int)v;
        return 1;
    }
    if (opt == 0x127) {
        if (rp_parse_u64(arg, &sp->seed)) {
            rp_cli_usage_error(cmd, "--seed must be a non-negative integer, got '%s'", arg);
            return -1;
        }
        sp->has_seed = 1;
        return 1;
    }
    if (rp_parse_float(arg, &d)) {
        rp_cli_usage_error(cmd, "--%s needs a number, got '%s'", name, arg);
        return -1;
    }
    float *fields[] = {&sp->temperature, &sp->top_p, NULL, &sp->min_p, &sp->repetition_penalty,
                       &sp->presence_penalty, &sp->frequency_penalty};
    *fields[opt - 0x120] = (float)d;
    return 1;
}

void rp_sampling_seed_if_unset(rp_sampling_params *sp) {
    if (sp->has_seed) return;
    sp->seed = (uint64_t)(rp_now_s() * 1e9) ^ ((uint64_t)getpid() << 32);
    sp->has_seed = 1;
}

/* "Qwen/Qwen3-0.6B": an owner and a name, as the Hub spells them. */
static int looks_like_hub_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/') || s[0] == '.' || s[0] == '~') return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/-_.", *p)) return 0;
    return 1;
}

static int has_safetensors(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *de; !found && (de = readdir(d));) {
        const size_t n = strlen(de->d_name);
        found = n > 12 && !strcmp(de->d_name + n - 12, ".safetensors");
    }
    closedir(d);
    return found;
}

/* The tensor-parallel options among themselves, before the model is known. */
static int tp_opts_check(const rp_model_opts *o, const char *cmd) {
    const int n = o->tp_size > 1 ? o->tp_size : 1, nnodes = o->nnodes > 1 ? o->nnodes : 1;
    rp_err err;
    if (rp_tp_size_check(n, &err)) return rp_cli_usage_error(cmd, "%s", err.msg);
    if (o->node_rank && nnodes == 1) return rp_cli_usage_error(cmd, "--node-rank needs --nnodes");
    if (o->dist_init_addr && nnodes == 1) return rp_cli_usage_error(cmd, "--dist-init-addr needs --nnodes");
    if (nnodes > 1) {
        if (n % nnodes)
            return rp_cli_usage_error(cmd, "--nnodes %d does not divide --tensor-parallel-size %d: every node runs "
                                           "the same number of GPUs", nnodes, n);
        if (o->node_rank >= nnodes)
            return rp_cli_usage_error(cmd, "--node-rank %d with --nnodes %d (0 to %d)", o->node_rank, nnodes,
                                      nnodes - 1);
        if (!o->dist_init_addr)
            return rp_cli_usage_error(cmd, "--nnodes %d needs --dist-init-addr HOST:PORT (an address of node 0)",
                                      nnodes);
    }
    return 0;
}

/* The model's shapes against N (rp_tp_plan_make's refusals), before it loads. */
static int tp_plan_check(const rp_model_opts *o, const char *cmd) {
    if (o->tp_size <= 1) return 0;
    rp_tp_plan plan;
    rp_err err;
    if (rp_tp_plan_make(&plan, &o->cfg, o->tp_size, &err)) return rp_cli_usage_error(cmd, "%s", err.msg);
    return 0;
}

int rp_model_opts_check(rp_model_opts *o, const char *cmd) {
    if (o->model_dir && o->dummy_name)
        return rp_cli_usage_error(cmd, "give either --model or --dummy-weights, not both");
    if (!o->model_dir && !o->dummy_name)
        return rp_cli_usage_error(cmd, "a model is required: --model DIR or --dummy-weights NAME (%s)",
                                  rp_config_preset_names());
    if (o->dummy_name && strcmp(o->load_format, "auto") && strcmp(o->load_format, "dummy"))
        return rp_cli_usage_error(cmd, "--load-format %s needs --model", o->load_format);
    rp_err err;
    int rc = tp_opts_check(o, cmd);
    if (rc) return rc;
    if (o->dummy_name) {
        if (rp_config_preset(&o->cfg, o->dummy_name, &err)) return rp_cli_usage_error(cmd, "--dummy-weights: %s", err.msg);
        o->have_cfg = 1;
        return tp_plan_check(o, cmd);
    }
    const char *dir = o->model_dir;
    struct stat st;
    if (stat(dir, &st)) {
        if (errno == ENOENT && looks_like_hub_id(dir))
            return rp_cli_usage_error(cmd,
                                      "--model %s: no such directory. replay loads a local Hugging Face directory; "
                                      "download it first, e.g. 'huggingface-cli download %s --local-dir ~/models/%s' "
                                      "(README.md, 'Models')",
                                      dir, dir, strchr(dir, '/') + 1);
        return rp_cli_usage_error(cmd, "--model %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        const size_t n = strlen(dir);
        return rp_cli_usage_error(cmd, "--model %s is a file: replay loads a Hugging Face model directory "
                                       "(config.json and *.safetensors)%s",
                                  dir, n > 5 && !strcmp(dir + n - 5, ".gguf") ? ", not GGUF files (llama.cpp's)" : "");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK))
        return rp_cli_usage_error(cmd, "--model %s has no config.json: it is not a Hugging Face model directory", dir);
    /* the config decides whether replay can run the model: read it now, not after minutes of loading */
    if (rp_config_load_dir(&o->cfg, dir, &err)) return rp_cli_runtime_error(cmd, "%s", err.msg);
    o->have_cfg = 1;
    if ((rc = tp_plan_check(o, cmd))) return rc;
    if (strcmp(o->load_format, "dummy") && !has_safetensors(dir))
        return rp_cli_runtime_error(cmd, "%s has no *.safetensors weights (--load-format dummy runs its config with "
                                         "random weights)",
                                    dir);
    return 0;
}

int rp_cli_check_dir_file(const char *flag, const char *dir, const char *file, const char *cmd) {
    char path[4096];
    struct stat st;
    if (stat(dir, &st)) return rp_cli_usage_error(cmd, "%s %s: %s", flag, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return rp_cli_usage_error(cmd, "%s %s is not a directory", flag, dir);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (access(path, R_OK)) return rp_cli_usage_error(cmd, "%s %s has no %s", flag, dir, file);
    return 0;
}

const char *rp_cli_tokenizer_dir(const rp_model_opts *o, const char *tokenizer_dir) {
    if (tokenizer_dir) return tokenizer_dir;
    if (!o->model_dir) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    return access(path, R_OK) == 0 ? o->model_dir : NULL;
}

int rp_cli_check_output(const char *flag, const char *path, const char *cmd) {
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) return rp_cli_usage_error(cmd, "%s %s is a directory", flag, path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return rp_cli_usage_error(cmd, "%s %s: the directory %s does not exist", flag, path, dir);
    if (access(dir, W_OK)) return rp_cli_usage_error(cmd, "%s %s: %s: %s", flag, path, dir, strerror(EACCES));
    return 0;
}

const char *rp_cli_device(const rp_model_opts *o) { return rp_runner_resolve_device(o->device); }

void rp_cli_runner_config(const rp_model_opts *o, rp_runner_config *rc) {
    memset(rc, 0, sizeof *rc);
    rc->model_dir = o->model_dir;
    rc->dummy_name = o->dummy_name;
    rc->load_dummy = !strcmp(o->load_format, "dummy");
    rc->weight_seed = o->weight_seed;
    rc->quantize_fp8 = o->quantize_fp8;
    rp_err err;
    if (rp_kv_dtype_parse(o->kv_cache_dtype, &rc->kv_dtype, &err)) rc->kv_dtype = RP_KV_AUTO; /* checked when parsed */
    rc->load_progress = 1;
    rc->device = rp_cli_device(o);
    rc->threads = o->threads;
    rc->tuning.disable_decode_step = o->disable_decode_step;
    rc->tensor_parallel_size = o->tp_size;
    rc->nnodes = o->nnodes;
    rc->node_rank = o->node_rank;
    rc->dist_init_addr = o->dist_init_addr;
    rc->dist_timeout_ms = o->dist_timeout_s * 1000;
    rc->disable_custom_all_reduce = o->disable_custom_all_reduce;
}

int rp_cli_engine_worker(const rp_engine_config *ec, const char *cmd) {
    rp_error e;
    if (rp_engine_run_worker(ec, &e)) return rp_cli_runtime_error(cmd, "%s", e.message);
    return RP_EXIT_OK;
}

int rp_cli_runner_worker(const rp_model_opts *o, const rp_runner_config *rc, const char *cmd) {
    rp_runner *r = rp_cli_runner_new(o, rc, cmd);
    if (!r) return RP_EXIT_RUNTIME;
    rp_err err;
    int rcode = rp_engine_worker_run(r, &err);
    rp_runner_free(r);
    if (rcode) return rp_cli_runtime_error(cmd, "%s", err.msg);
    return RP_EXIT_OK;
}

rp_runner *rp_cli_runner_new(const rp_model_opts *o, const rp_runner_config *rc, const char *cmd) {
    rp_err err;
    rp_runner *r = rp_runner_new(rc, &err);
    if (!r) {
        rp_cli_runtime_error(cmd, "%s", err.msg);
        return NULL;
    }
    if (r->model->dummy)
        rp_log_warn("the weights are RANDOM (%s): output is meaningless text, useful only for testing and timing",
                    o->dummy_name ? "--dummy-weights" : "--load-format dummy");
    return r;
}

void rp_engine_opts_help(FILE *f) {
    rp_engine_config d;
    rp_engine_config_default(&d);
    fprintf(f,
            "Engine:\n"
            "  --max-running-requests N     requests decoded together (default: the KV cache's tokens / %d, from\n"
            "                               %d to %d; --max-num-seqs is the same)\n"
            "  --max-num-batched-tokens N   tokens one step feeds, prompt chunks and decode tokens together\n"
            "                               (default %d; --max-prefill-tokens is the same)\n"
            "  --chunked-prefill-size N     a prompt is fed in chunks of at most N tokens (default 0: what the\n"
            "                               step leaves; smaller chunks keep the steps beside a long prompt short)\n"
            "  --num-pages N                KV pages (default: --gpu-memory-utilization of the GPU memory left,\n"
            "                               or what the CPU needs)\n"
            "  --gpu-memory-utilization F   share of the GPU memory left after weights and activations that\n"
            "                               the KV cache takes, in (0, 1] (default %.2f)\n"
            "  --page-size N                tokens per KV page (default %d)\n"
            "  --max-model-len N            context per request (default: the model's)\n"
            "  --disable-cuda-graph         run every step eagerly\n"
            "  --disable-prefix-caching     compute every prompt whole: keep no KV pages for later requests\n"
            "                               (default: prefix caching %s)\n"
            "  --enable-prefix-caching      reuse the KV pages of prompt prefixes computed before (the default)\n",
            RP_SCHED_TOKENS_PER_REQUEST, RP_SCHED_MIN_RUNNING, RP_SCHED_MAX_RUNNING, d.max_batched_tokens,
            d.memory_ratio, d.page_size,
            d.enable_prefix_caching ? "on" : "off");
}

void rp_spec_opts_help(FILE *f) {
    fprintf(f, "Speculative decoding (docs/speculative.md):\n"
               "  --speculative-method M       ngram: draft each decoding request's next tokens from the latest\n"
               "                               earlier occurrence of its last tokens (prompt lookup); draft_model:\n"
               "                               from a smaller model with the same tokenizer (--speculative-model).\n"
               "                               One target pass verifies them; outputs are those without it, token\n"
               "                               for token (default: off)\n"
               "  --speculative-model DIR      the draft model's directory (implies draft_model; --load-format\n"
               "                               applies to it too; default: none)\n"
               "  --speculative-dummy-weights NAME\n"
               "                               a draft model of a named shape with random weights, for benchmarks\n"
               "                               (default: none)\n"
               "  --num-speculative-tokens K   drafts a round, 1 to %d (default %d)\n"
               "  --prompt-lookup-min N        ngram: shortest match, 1 to %d (default %d)\n"
               "  --prompt-lookup-max N        ngram: longest match, tried first, 1 to %d (default %d)\n",
            RP_SPEC_MAX_K, RP_SPEC_DEFAULT_K, RP_NGRAM_MAX_N, RP_NGRAM_DEFAULT_MIN, RP_NGRAM_MAX_N,
            RP_NGRAM_DEFAULT_MAX);
}

int rp_spec_opts_check(const rp_engine_config *ec, const char *cmd) {
    const char *model = ec->speculative_model          ? "--speculative-model"
                        : ec->speculative_dummy_weights ? "--speculative-dummy-weights"
                                                        : NULL;
    const char *lookup = ec->prompt_lookup_min ? "--prompt-lookup-min"
                         : ec->prompt_lookup_max ? "--prompt-lookup-max"
                                                 : NULL;
    if (ec->speculative_method == RP_SPEC_NONE) {
        const char *what = ec->num_speculative_tokens ? "--num-speculative-tokens" : lookup;
        if (what) return rp_cli_usage_error(cmd, "%s needs --speculative-method", what);
        return 0;
    }
    if (ec->speculative_method == RP_SPEC_DRAFT_MODEL) {
        if (ec->speculative_model && ec->speculative_dummy_weights)
            return rp_cli_usage_error(cmd, "give one of --speculative-model and --speculative-dummy-weights");
        if (!model)
            return rp_cli_usage_error(cmd, "--speculative-method draft_model needs --speculative-model DIR (or "
                                           "--speculative-dummy-weights NAME)");
        if (lookup) return rp_cli_usage_error(cmd, "%s is for --speculative-method ngram", lookup);
        return 0;
    }
    if (model) return rp_cli_usage_error(cmd, "%s is for --speculative-method draft_model, not ngram", model);
    if (ec->prompt_lookup_min && ec->prompt_lookup_max && ec->prompt_lookup_min > ec->prompt_lookup_max)
        return rp_cli_usage_error(cmd, "--prompt-lookup-min %d is more than --prompt-lookup-max %d",
                                  ec->prompt_lookup_min, ec->prompt_lookup_max);
    return 0;
}

int rp_engine_opts_parse(rp_engine_config *ec, int opt, const char *arg, const char *cmd) {
    static const struct {
        int opt;
        const char *name;
        long lo, hi;
    } ints[] = {{0x140, "--max-running-requests", 1, 4096}, {0x141, "--max-num-batched-tokens", 1, 1 << 24},
                {0x142, "--chunked-prefill-size", 0, 1 << 24}, {0x143, "--num-pages", 0, 1 << 30},
                {0x144, "--page-size", 1, 4096},               {0x145, "--max-model-len", 1, 1 << 24},
                {0x14b, "--num-speculative-tokens", 1, RP_SPEC_MAX_K}, {0x14c, "--prompt-lookup-min", 1, RP_NGRAM_MAX_N},
                {0x14d, "--prompt-lookup-max", 1, RP_NGRAM_MAX_N}};
    if (opt == 0x14a) {
        if (!strcmp(arg, "ngram")) ec->speculative_method = RP_SPEC_NGRAM;
        else if (!strcmp(arg, "draft_model")) ec->speculative_method = RP_SPEC_DRAFT_MODEL;
        else if (!strcmp(arg, "none")) ec->speculative_method = RP_SPEC_NONE;
        else {
            rp_cli_usage_error(cmd, "--speculative-method must be ngram, draft_model or none, got '%s'", arg);
            return -1;
        }
        return 1;
    }
    if (opt == 0x14e || opt == 0x14f) {
        if (!*arg) {
            rp_cli_usage_error(cmd, "%s needs a value", opt == 0x14e ? "--speculative-model" : "--speculative-dummy-weights");
            return -1;
        }
        *(opt == 0x14e ? &ec->speculative_model : &ec->speculative_dummy_weights) = arg;
        /* a draft model alone says which method (vLLM's rule) */
        if (ec->speculative_method == RP_SPEC_NONE) ec->speculative_method = RP_SPEC_DRAFT_MODEL;
        return 1;
    }
    if (opt == 0x146) {
        ec->disable_cuda_graph = 1;
        return 1;
    }
    if (opt == 0x148 || opt == 0x149) {
        ec->enable_prefix_caching = opt == 0x149;
        return 1;
    }
    if (opt == 0x147) {
        double v;
        if (rp_parse_float(arg, &v) || !(v > 0 && v <= 1)) {
            rp_cli_usage_error(cmd, "--gpu-memory-utilization must be in (0, 1], got '%s'", arg);
            return -1;
        }
        ec->memory_ratio = v;
        return 1;
    }
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].opt != opt) continue;
        long v;
        if (rp_parse_int(arg, ints[i].lo, ints[i].hi, &v)) {
            rp_cli_usage_error(cmd, "%s must be an integer from %ld to %ld, got '%s'", ints[i].name, ints[i].lo,
                               ints[i].hi, arg);
            return -1;
        }
        int *dst[] = {&ec->max_running_requests, &ec->max_batched_tokens, &ec->chunked_prefill_size,
                      &ec->num_pages, &ec->page_size, &ec->max_context, NULL, NULL, NULL, NULL, NULL,
                      &ec->num_speculative_tokens, &ec->prompt_lookup_min, &ec->prompt_lookup_max};
        *dst[opt - 0x140] = (int)v;
        return 1;
    }
    return 0;
}

int rp_engine_opts_check(const rp_engine_config *ec, const rp_model_opts *mo, const char *cmd) {
    if (mo->have_cfg && ec->max_context > mo->cfg.max_position_embeddings)
        return rp_cli_usage_error(cmd, "--max-model-len %d is more than the model's context (%d tokens)",
                                  ec->max_context, mo->cfg.max_position_embeddings);
    return 0;
}

void rp_cli_engine_model(const rp_model_opts *o, rp_engine_config *ec) {
    ec->model_dir = o->model_dir;
    ec->dummy_name = o->dummy_name;
    ec->load_dummy = !strcmp(o->load_format, "dummy");
    ec->speculative_load_dummy = ec->load_dummy; /* --load-format applies to a draft model too (vLLM's rule) */
    ec->weight_seed = o->weight_seed;
    ec->quantize_fp8 = o->quantize_fp8;
    ec->kv_cache_dtype = o->kv_cache_dtype;
    ec->device = rp_cli_device(o);
    ec->threads = o->threads;
    ec->disable_decode_step = o->disable_decode_step;
    ec->tensor_parallel_size = o->tp_size;
    ec->nnodes = o->nnodes;
    ec->node_rank = o->node_rank;
    ec->dist_init_addr = o->dist_init_addr;
    ec->dist_timeout_s = o->dist_timeout_s;
    ec->disable_custom_all_reduce = o->disable_custom_all_reduce;
}

void rp_cli_request_sampling(rp_request_params *rq, const rp_sampling_params *sp) {
    rq->temperature = sp->temperature;
    rq->top_p = sp->top_p;
    rq->top_k = sp->top_k;
    rq->min_p = sp->min_p;
    rq->repetition_penalty = sp->repetition_penalty;
    rq->presence_penalty = sp->presence_penalty;
    rq->frequency_penalty = sp->frequency_penalty;
    rq->seed = sp->seed;
    rq->has_seed = sp->has_seed;
}
