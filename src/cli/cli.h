/* Shared by the CLI commands: exit codes, the model options every command
 * takes (--model / --dummy-weights / --load-format / --device), and model
 * loading with the user-facing messages. */
#ifndef RP_CLI_CLI_H
#define RP_CLI_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

/* Every command's exit codes (docs/cli.md#exit-codes): 0 done, 1 it could not
 * be done (a model that fails to load, a port in use, a runtime failure), 2
 * the command line is wrong (checked before anything loads), 130 / 143
 * stopped by SIGINT / SIGTERM before it finished. */
enum { RP_EXIT_OK = 0, RP_EXIT_RUNTIME = 1, RP_EXIT_USAGE = 2, RP_EXIT_SIGINT = 130, RP_EXIT_SIGTERM = 143 };

/* A command as `replay --help` lists it and as the help-text test checks it:
 * its option table is the one its parser uses, so the test can compare what
 * --help prints with what is accepted. */
typedef struct rp_cli_command {
    const char *name;    /* as typed after "replay": "generate", "bench decode" */
    const char *summary; /* one line for replay --help */
    const struct option *options;
    void (*help)(FILE *f);
    int (*run)(int argc, char **argv); /* argv[0] is the command's last word */
} rp_cli_command;

/* Every command, NULL-terminated, in the order replay --help lists them (commands.c). */
extern const rp_cli_command *const rp_cli_commands[];
/* The command whose name is argv[0] (and argv[1] for a two-word one such as
 * "bench decode"); *words says how many words it took. NULL if none. */
const rp_cli_command *rp_cli_find_command(int argc, char **argv, int *words);

/* Options every command takes, handled by rp_cli_next_opt (help is the command's). */
#define RP_COMMON_LONG_OPTIONS                                                                    \
    {"log-level", required_argument, 0, 0x1a0}, {"log-format", required_argument, 0, 0x1a1},      \
        {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'}

#define RP_COMMON_OPTIONS_HELP                                                                       \
    "Output:\n"                                                                                      \
    "  --log-level LEVEL      error, warn, info or debug (default info, or $REPLAY_LOG)\n"           \
    "  --log-format FMT       text or json: one JSON object per log line (default text)\n"          \
    "  -q, --quiet            log errors only (--log-level error)\n"                                \
    "  -h, --help             show this help and exit\n"

typedef struct rp_model_opts {
    const char *model_dir;
    const char *dummy_name;
    const char *load_format; /* "auto" or "dummy" */
    const char *device;      /* "auto", "cpu", "cuda" */
    uint64_t weight_seed;
    int threads;
    int quantize_fp8;        /* --quantization fp8 */
    const char *kv_cache_dtype; /* --kv-cache-dtype, checked when parsed (rp_kv_dtype_parse); NULL: auto */
    int disable_decode_step; /* the chain of kernels for every decode step (docs/tuning.md) */
    /* tensor parallelism (docs/tensor-parallel.md): --tensor-parallel-size
     * / --tp, and over several nodes --nnodes, --node-rank, --dist-init-addr */
    int tp_size;
    int nnodes, node_rank;
    const char *dist_init_addr;
    int dist_timeout_s; /* --dist-timeout; 0: the default */
    int disable_custom_all_reduce; /* --disable-custom-all-reduce */
    rp_model_config cfg;     /* read by rp_model_opts_check, before anything loads */
    int have_cfg;
} rp_model_opts;

/* Long options for rp_model_opts; commands append their own. The GPU-only
 * commands (profile, bench kernels) take them without --threads, which sets
 * CPU threads, and with --device auto or cuda. */
#define RP_MODEL_SOURCE_LONG_OPTIONS                                                              \
    {"model", required_argument, 0, 0x100}, {"dummy-weights", required_argument, 0, 0x101},     \
        {"load-format", required_argument, 0, 0x102}, {"device", required_argument, 0, 0x103},   \
        {"weight-seed", required_argument, 0, 0x104}, {"disable-decode-step", no_argument, 0, 0x106}, \
        {"dtype", required_argument, 0, 0x107}, {"quantization", required_argument, 0, 0x108},       \
        {"tensor-parallel-size", required_argument, 0, 0x109}, {"tp", required_argument, 0, 0x109}, \
        {"nnodes", required_argument, 0, 0x10a}, {"node-rank", required_argument, 0, 0x10b},       \
        {"dist-init-addr", required_argument, 0, 0x10c}, {"kv-cache-dtype", required_argument, 0, 0x10d}, \
        {"dist-timeout", required_argument, 0, 0x10e}, {"disable-custom-all-reduce", no_argument, 0, 0x10f}
#define RP_MODEL_LONG_OPTIONS RP_MODEL_SOURCE_LONG_OPTIONS, {"threads", required_argument, 0, 0x105}
#define RP_GPU_MODEL_LONG_OPTIONS RP_MODEL_SOURCE_LONG_OPTIONS

#define RP_MODEL_SOURCE_HELP                                                                           \
    "Model:\n"                                                                                        \
    "  --model DIR            a Hugging Face model directory (config.json, *.safetensors);\n"          \
    "                         required unless --dummy-weights\n"                                      \
    "  --dummy-weights NAME   instead of --model: random weights of a named shape, no files needed\n"   \
    "                         (required unless --model; an unknown NAME lists the known ones)\n"      \
    "  --load-format FMT      auto, safetensors, or dummy: DIR's config with random weights\n"          \
    "                         (default auto)\n"                                                        \
    "  --dtype TYPE           auto or bfloat16: replay computes in bfloat16 (default auto)\n"          \
    "  --weight-seed N        seed for random weights (default 0)\n"                                 \
    "  --quantization Q       none or fp8: fp8 quantizes each layer's matrices to e4m3 at load, one\n" \
    "                         scale per output channel (vLLM's option; default none)\n"            \
    "  --kv-cache-dtype T     auto, bf16 (bfloat16) or fp8 (fp8_e4m3): fp8 keeps K and V as e4m3 with\n"  \
    "                         the checkpoint's k/v scales (else 1), twice the tokens in the same memory\n" \
    "                         (default auto: fp8 where the checkpoint declares it, else bf16)\n"      \
    "  --tensor-parallel-size N, --tp N  split the model over N GPUs (1, 2, 4 or 8; default 1;\n" \
    "                         on the CPU, N threads); N must divide the query heads and MLP width\n" \
    "  --nnodes K             tensor parallelism over K machines, N / K GPUs each (default 1)\n"   \
    "  --node-rank k          this machine's place among them, 0 to K - 1 (default 0); node 0\n"  \
    "                         runs the command, the others its steps\n"                           \
    "  --dist-init-addr HOST:PORT  where node 0 listens for the others (an address of node 0;\n"     \
    "                         required with --nnodes, no default)\n"                             \
    "  --dist-timeout S       with --tp: a step that takes longer than S seconds, or a node silent\n" \
    "                         that long, fails the run on every rank (default 60; the setup and\n" \
    "                         the first step get at least 300)\n"                             \
    "  --disable-custom-all-reduce  with --tp on one machine: every all-reduce through NCCL (default:\n" \
    "                         sums up to 1 MiB read the other GPUs' memory directly, one kernel)\n"

#define RP_MODEL_OPTIONS_HELP                                                                          \
    RP_MODEL_SOURCE_HELP                                                                               \
    "  --device DEV           auto, cpu or cuda (default auto: cuda when a GPU is present)\n"           \
    "  --threads N            CPU threads (default: all cores)\n"                                     \
    "  --disable-decode-step  CUDA: decode 1-4 sequences with the chain of kernels, not one kernel\n"

#define RP_GPU_MODEL_OPTIONS_HELP                                                                      \
    RP_MODEL_SOURCE_HELP                                                                               \
    "  --device DEV           auto or cuda: this command needs a GPU (default auto)\n"                \
    "  --disable-decode-step  decode 1-4 sequences with the chain of kernels, not one kernel\n"

/* Sampling options shared by generate and chat (vLLM's meanings). */
#define RP_SAMPLING_LONG_OPTIONS                                                                         \
    {"temperature", required_argument, 0, 0x120}, {"top-p", required_argument, 0, 0x121},               \
        {"top-k", required_argument, 0, 0x122}, {"min-p", required_argument, 0, 0x123},                 \
        {"repetition-penalty", required_argument, 0, 0x124}, {"presence-penalty", required_argument, 0, 0x125}, \
        {"frequency-penalty", required_argument, 0, 0x126}, {"seed", required_argument, 0, 0x127}

#define RP_SAMPLING_OPTIONS_HELP                                                                    \
    "Sampling (vLLM's meanings; defaults leave each off):\n"                                       \
    "  --temperature T        0 = greedy (default 1.0)\n"                                          \
    "  --top-p P              nucleus sampling, (0, 1] (default 1)\n"                              \
    "  --top-k K              keep the K most likely tokens; -1 or 0 = off (default)\n"            \
    "  --min-p P              drop tokens below P x the top probability, [0, 1] (default 0)\n"     \
    "  --repetition-penalty R  >1 discourages tokens seen in prompt or output (default 1)\n"        \
    "  --presence-penalty P   [-2, 2], per generated token present (default 0)\n"                  \
    "  --frequency-penalty F  [-2, 2], per occurrence in the output (default 0)\n"                 \
    "  --seed N               sampling seed: same seed, same output (default: random)\n"

/* Engine options of the commands that run the engine on many requests
 * (serve, bench offline), with vLLM's names as aliases: --max-num-seqs for
 * --max-running-requests; --max-prefill-tokens is SGLang's name for vLLM's
 * --max-num-batched-tokens. --enable-prefix-caching and
 * --disable-prefix-caching are vLLM's pair (on by default, as there): the
 * later one wins. */
#define RP_ENGINE_LONG_OPTIONS                                                                                   \
    {"max-running-requests", required_argument, 0, 0x140}, {"max-num-batched-tokens", required_argument, 0, 0x141}, \
        {"max-prefill-tokens", required_argument, 0, 0x141}, {"chunked-prefill-size", required_argument, 0, 0x142},  \
        {"num-pages", required_argument, 0, 0x143}, {"page-size", required_argument, 0, 0x144},                    \
        {"max-model-len", required_argument, 0, 0x145}, {"disable-cuda-graph", no_argument, 0, 0x146},      \
        {"max-num-seqs", required_argument, 0, 0x140}, {"gpu-memory-utilization", required_argument, 0, 0x147}, \
        {"disable-prefix-caching", no_argument, 0, 0x148}, {"enable-prefix-caching", no_argument, 0, 0x149}

/* Speculative decoding (docs/speculative.md), in every command that runs
 * the engine (serve, bench offline, generate, chat); vLLM's names. */
#define RP_SPEC_LONG_OPTIONS                                                                                      \
    {"speculative-method", required_argument, 0, 0x14a}, {"num-speculative-tokens", required_argument, 0, 0x14b}, \
        {"prompt-lookup-min", required_argument, 0, 0x14c}, {"prompt-lookup-max", required_argument, 0, 0x14d}, \
        {"speculative-model", required_argument, 0, 0x14e},                                                    \
        {"speculative-dummy-weights", required_argument, 0, 0x14f}

struct rp_engine_config;
/* The speculative decoding options' help. */
void rp_spec_opts_help(FILE *f);
/* After parsing: a speculative option without --speculative-method, or
 * match lengths the wrong way round, is a usage error (printed; returns
 * RP_EXIT_USAGE, else 0). */
int rp_spec_opts_check(const struct rp_engine_config *ec, const char *cmd);
/* Prints the engine options' help, with the defaults rp_engine_config_default sets. */
void rp_engine_opts_help(FILE *f);
/* Handles one of RP_ENGINE_LONG_OPTIONS into ec: 1 if it was one, 0 if not,
 * -1 on a bad value (message printed). */
int rp_engine_opts_parse(struct rp_engine_config *ec, int opt, const char *arg, const char *cmd);

/* The engine options against the model (rp_model_opts_check read its
 * config): --max-model-len beyond the model's context is refused, as vLLM
 * does. 0 or RP_EXIT_USAGE (printed). */
int rp_engine_opts_check(const struct rp_engine_config *ec, const rp_model_opts *mo, const char *cmd);

struct rp_sampling_params;
/* Handles one of RP_SAMPLING_LONG_OPTIONS: 1 if it was one, 0 if not, -1 on
 * a bad value (message printed). Ranges are checked later, by the sampler. */
int rp_sampling_opts_parse(struct rp_sampling_params *sp, int opt, const char *arg, const char *cmd);
struct rp_request_params;
/* Copies sampling options into an engine request (seed included). */
void rp_cli_request_sampling(struct rp_request_params *rq, const struct rp_sampling_params *sp);
/* Gives an unseeded request a seed (time and pid). */
void rp_sampling_seed_if_unset(struct rp_sampling_params *sp);

void rp_model_opts_init(rp_model_opts *o);
/* Handles one of the RP_MODEL_LONG_OPTIONS; returns 1 if it was one, 0 if
 * not, -1 on a bad value (message printed). */
int rp_model_opts_parse(rp_model_opts *o, int opt, const char *arg, const char *cmd);
/* A command's option loop: rp_cli_opts_begin(), then rp_cli_next_opt()
 * until RP_OPT_END. getopt_long over longopts, with the model options (mo)
 * and the sampling options (sp) handled here when given, and a missing
 * value or an unknown option reported as a usage error (RP_OPT_ERROR, the
 * message printed); anything else is the command's own option. */
enum { RP_OPT_END = -1, RP_OPT_ERROR = -2 };
void rp_cli_opts_begin(void);
int rp_cli_next_opt(int argc, char **argv, const char *shortopts, const struct option *longopts, rp_model_opts *mo,
                    struct rp_sampling_params *sp, const char *cmd);
/* Before anything loads: exactly one model source; a --dummy-weights name
 * that exists; a --model that is a directory with a config.json replay can
 * run (its config is read into o->cfg) and weights, unless --load-format
 * dummy; a Hub id that is not a directory gets the download hint. Prints the
 * error; returns 0, RP_EXIT_USAGE or RP_EXIT_RUNTIME (a config replay cannot run). */
int rp_model_opts_check(rp_model_opts *o, const char *cmd);
/* A directory option (flag) that must exist and hold file; 0 or RP_EXIT_USAGE. */
int rp_cli_check_dir_file(const char *flag, const char *dir, const char *file, const char *cmd);
/* The directory a command's tokenizer comes from: --tokenizer, else the
 * model directory when it has tokenizer.json, else NULL. */
const char *rp_cli_tokenizer_dir(const rp_model_opts *o, const char *tokenizer_dir);
/* An output file option: its directory exists and is writable, and it is not
 * a directory; 0 or RP_EXIT_USAGE. */
int rp_cli_check_output(const char *flag, const char *path, const char *cmd);
/* "cpu" or "cuda": --device auto picks cuda when a GPU is present. */
const char *rp_cli_device(const rp_model_opts *o);
struct rp_runner;
struct rp_runner_config;
/* A runner config from the model options (model source, device, threads);
 * the command sets the batch shape. */
void rp_cli_runner_config(const rp_model_opts *o, struct rp_runner_config *rc);
/* The runner (src/engine/runner.h); prints a one-line error and returns NULL
 * on failure, and warns when the weights are random. */
struct rp_runner *rp_cli_runner_new(const rp_model_opts *o, const struct rp_runner_config *rc, const char *cmd);

/* Sets an engine configuration's model, device and threads from the model options. */
void rp_cli_engine_model(const rp_model_opts *o, struct rp_engine_config *ec);

/* A node other than 0 of a multi-node tensor-parallel run (--node-rank >
 * 0) runs node 0's steps instead of the command: through the engine's
 * backend (commands that run the engine) or the command's runner (the
 * others). Each returns the command's exit status. */
static inline int rp_cli_is_worker(const rp_model_opts *o) {
    return o->nnodes > 1 && o->node_rank > 0;
}
int rp_cli_engine_worker(const struct rp_engine_config *ec, const char *cmd);
int rp_cli_runner_worker(const rp_model_opts *o, const struct rp_runner_config *rc, const char *cmd);


/* Prints "replay CMD: message" and a hint to stderr; returns RP_EXIT_USAGE. */
int rp_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int rp_cli_runtime_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Strict number parsing for option values. */
int rp_parse_int(const char *s, long min, long max, long *out);
int rp_parse_float(const char *s, double *out);
int rp_parse_u64(const char *s, uint64_t *out);

extern const rp_cli_command rp_cli_generate, rp_cli_chat, rp_cli_serve, rp_cli_bench_decode, rp_cli_bench_offline,
    rp_cli_bench_kernels, rp_cli_bench_serve, rp_cli_bench_structured, rp_cli_profile, rp_cli_tokenize, rp_cli_logits,
    rp_cli_chat_template, rp_cli_check_output_cmd;

#endif
