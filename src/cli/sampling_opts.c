/* Range checks of RP_SAMPLING_LONG_OPTIONS (sampling_opts.h). Whether a value
 * is valid is the sampler's decision (rp_sampling_params_validate, the one
 * the engine applies to every request); this file only words its answer for
 * a command line: the flag instead of the API's field name. */
#include "cli/sampling_opts.h"

#include <string.h>

#include "cli/cli.h"
#include "engine/sampler.h"

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
