/* The sampling options' ranges checked on the command line, before anything
 * loads, with the flag at fault named ("--top-p must be in (0, 1], got 0");
 * and the sampling defaults a model ships in generation_config.json, which
 * fill what neither a flag nor a request sets (vLLM's --generation-config). */
#ifndef RP_CLI_SAMPLING_OPTS_H
#define RP_CLI_SAMPLING_OPTS_H

#include <stddef.h>

struct rp_sampling_params;
struct rp_request_params;

/* 0, or RP_EXIT_USAGE with the message printed. */
int rp_sampling_opts_check(const struct rp_sampling_params *sp, const char *cmd);

/* --generation-config, vLLM's option and values: "auto" (the default) takes
 * the model directory's generation_config.json, "vllm" ignores it, and any
 * other value is a directory whose generation_config.json is taken. */
#define RP_GENERATION_CONFIG_HELP                                                                       \
    "  --generation-config G  where unset sampling fields come from: auto = the model's\n"              \
    "                         generation_config.json (temperature, top_p, top_k, min_p,\n"              \
    "                         repetition_penalty), vllm = replay's defaults, or a directory with\n"     \
    "                         generation_config.json (default auto; as vLLM)\n"
/* 0, or RP_EXIT_USAGE (printed) when mode is neither auto, vllm nor a directory. */
int rp_generation_config_check(const char *mode, const char *cmd);

/* The sampling defaults for a model: rp_request_params_default's, with the
 * generation_config.json fields that mode picks (model_dir may be NULL: a
 * preset has none) over them. what gets a line for the startup log naming
 * the file and the values taken, or why none; *taken how many were taken.
 * 0, or RP_EXIT_RUNTIME with the message printed (a file that does not
 * parse, a value out of range). */
int rp_generation_config_defaults(const char *model_dir, const char *mode, struct rp_request_params *out,
                                  char *what, size_t what_size, int *taken, const char *cmd);

/* Before the options are parsed: the fields generation_config.json may set
 * marked as not given (so that a flag, which always wins, is told apart). */
void rp_sampling_opts_unset(struct rp_sampling_params *sp);
/* After: the fields no flag gave take the defaults. */
void rp_sampling_opts_fill(struct rp_sampling_params *sp, const struct rp_request_params *defaults);

/* chat's and generate's whole sequence: mode checked, its defaults filled
 * into the fields no flag gave, the result's ranges checked; what and
 * *taken as rp_generation_config_defaults says. 0, or the exit status
 * (the message printed). */
int rp_sampling_opts_resolve(const char *model_dir, const char *mode, struct rp_sampling_params *sp, char *what,
                             size_t what_size, int *taken, const char *cmd);

#endif
