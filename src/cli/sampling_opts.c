/* Range checks of RP_SAMPLING_LONG_OPTIONS (sampling_opts.h). Whether a value
 * is valid is the sampler's decision (rp_sampling_params_validate, the one
 * the engine applies to every request); this file only words its answer for
 * a command line: the flag instead of the API's field name. Also the
 * defaults of generation_config.json, for serve, chat and generate. */
#include "cli/sampling_opts.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/sampler.h"
#include "replay/engine.h"

int rp_sampling_opts_check(const rp_sampling_params *sp, const char *cmd) {
    rp_err err;
    /* any vocabulary will do: no option depends on it */
    if (!rp_sampling_params_validate(sp, 1 << 30, &err)) return 0;
    static const struct {
        const char *param, *flag, *range;
    } flags[] = {
        {"temperature", "--temperature", "must be 0 (greedy) or more"},
        {"top_p", "--top-p", "must be in (0, 1]"},
        {"top_k", "--top-k", "must be -1 or 0 (off), or at least 1"},
        {"min_p", "--min-p", "must be in [0, 1]"},
        {"repetition_penalty", "--repetition-penalty", "must be greater than 0"},
        {"presence_penalty", "--presence-penalty", "must be in [-2, 2]"},
        {"frequency_penalty", "--frequency-penalty", "must be in [-2, 2]"},
    };
    const double values[] = {sp->temperature,        sp->top_p,           sp->top_k,           sp->min_p,
                             sp->repetition_penalty, sp->presence_penalty, sp->frequency_penalty};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(err.param, flags[i].param))
            return rp_cli_usage_error(cmd, "%s %s, got %g", flags[i].flag, flags[i].range, values[i]);
    return rp_cli_usage_error(cmd, "%s", err.msg); /* a parameter without a flag */
}

/* ---- generation_config.json ----------------------------------------------- */

int rp_generation_config_check(const char *mode, const char *cmd) {
    if (!strcmp(mode, "auto") || !strcmp(mode, "vllm")) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", mode);
    if (access(path, R_OK) == 0) return 0;
    return rp_cli_usage_error(cmd, "--generation-config must be auto, vllm or a directory with "
                                   "generation_config.json, got '%s'",
                              mode);
}

int rp_generation_config_defaults(const char *model_dir, const char *mode, rp_request_params *out, char *what,
                                  size_t what_size, int *taken, const char *cmd) {
    rp_request_params_default(out);
    *taken = 0;
    if (!strcmp(mode, "vllm")) {
        snprintf(what, what_size, "sampling defaults: replay's (--generation-config vllm)");
        return 0;
    }
    const char *dir = strcmp(mode, "auto") ? mode : model_dir;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir ? dir : "");
    if (!dir || access(path, F_OK) != 0) {
        snprintf(what, what_size, "sampling defaults: replay's (the model has no generation_config.json)");
        return 0;
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return rp_cli_runtime_error(cmd, "%s: %s", path, root ? "not a JSON object" : je.text);
    }
    /* the fields vLLM takes from the file, in its order */
    static const char *const keys[] = {"repetition_penalty", "temperature", "top_k", "top_p", "min_p"};
    float *fields[] = {&out->repetition_penalty, &out->temperature, NULL, &out->top_p, &out->min_p};
    size_t n = (size_t)snprintf(what, what_size, "sampling defaults from %s:", path);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_number(v) || (!fields[i] && !json_is_integer(v))) {
            json_decref(root);
            return rp_cli_runtime_error(cmd, "%s: %s must be a%s number", path, keys[i], fields[i] ? "" : "n integer");
        }
        if (fields[i]) *fields[i] = (float)json_number_value(v);
        else out->top_k = (int)json_integer_value(v);
        if (n < what_size) n += (size_t)snprintf(what + n, what_size - n, " %s=%g", keys[i], json_number_value(v));
        ++*taken;
    }
    json_decref(root);
    if (!*taken && n < what_size) snprintf(what + n, what_size - n, " none set (replay's apply)");
    /* the sampler's own check, worded for the file */
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    rp_sampling_opts_unset(&sp);
    rp_sampling_opts_fill(&sp, out);
    rp_err err;
    if (rp_sampling_params_validate(&sp, 1 << 30, &err))
        return rp_cli_runtime_error(cmd, "%s: %s (--generation-config vllm would ignore the file)", path, err.msg);
    return 0;
}

void rp_sampling_opts_unset(rp_sampling_params *sp) {
    sp->temperature = sp->top_p = sp->min_p = sp->repetition_penalty = NAN;
    sp->top_k = INT32_MIN;
}

void rp_sampling_opts_fill(rp_sampling_params *sp, const rp_request_params *d) {
    if (isnan(sp->temperature)) sp->temperature = d->temperature;
    if (isnan(sp->top_p)) sp->top_p = d->top_p;
    if (isnan(sp->min_p)) sp->min_p = d->min_p;
    if (isnan(sp->repetition_penalty)) sp->repetition_penalty = d->repetition_penalty;
    if (sp->top_k == INT32_MIN) sp->top_k = d->top_k;
}

int rp_sampling_opts_resolve(const char *model_dir, const char *mode, rp_sampling_params *sp, char *what,
                             size_t what_size, int *taken, const char *cmd) {
    rp_request_params defaults;
    int bad = rp_generation_config_check(mode, cmd);
    if (bad || (bad = rp_generation_config_defaults(model_dir, mode, &defaults, what, what_size, taken, cmd)))
        return bad;
    rp_sampling_opts_fill(sp, &defaults);
    return rp_sampling_opts_check(sp, cmd);
}
