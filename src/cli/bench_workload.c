/* The benchmark workloads (bench_workload.h). */
#include "cli/bench_workload.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/bench_common.h"
#include "cli/cli.h"
#include "util/rng.h"

/* The stream of group g's prefix tokens: far above any request's
 * token_stream + i (requests are fewer than 2^40). */
#define PREFIX_STREAM (1ull << 40)
#define ANSWER_STREAM (1ull << 41)

int rp_bench_workload_parse(rp_bench_workload *w, int opt, const char *arg, const char *cmd) {
    if (opt == 0x163) {
        if (!strcmp(arg, "uniform")) w->length_dist = RP_BENCH_LEN_UNIFORM;
        else if (!strcmp(arg, "lognormal")) w->length_dist = RP_BENCH_LEN_LOGNORMAL;
        else {
            rp_cli_usage_error(cmd, "--length-distribution must be uniform or lognormal, got '%s'", arg);
            return -1;
        }
        return 1;
    }
    if (opt == 0x164) {
        if (rp_parse_float(arg, &w->sigma) || w->sigma <= 0 || w->sigma > RP_BENCH_LOGNORMAL_SIGMA_MAX) {
            rp_cli_usage_error(cmd, "--length-sigma must be a number in (0, %g], got '%s'",
                               RP_BENCH_LOGNORMAL_SIGMA_MAX, arg);
            return -1;
        }
        return 1;
    }
    static const struct {
        int opt;
        const char *name;
        long lo, hi;
    } opts[] = {{0x160, "--shared-prefix-len", 0, 1 << 20}, {0x161, "--num-groups", 1, 1 << 20},
                {0x162, "--multi-turn", 1, 1024}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        if (opts[i].opt != opt) continue;
        long v;
        if (rp_parse_int(arg, opts[i].lo, opts[i].hi, &v)) {
            rp_cli_usage_error(cmd, "%s must be an integer from %ld to %ld, got '%s'", opts[i].name, opts[i].lo,
                               opts[i].hi, arg);
            return -1;
        }
        long *dst[] = {&w->shared_prefix_len, &w->num_groups, &w->turns};
        *dst[i] = v;
        return 1;
    }
    return 0;
}

int rp_bench_workload_check(const rp_bench_workload *w, const char *cmd) {
    if (w->num_groups > 1 && w->shared_prefix_len == 0)
        return rp_cli_usage_error(cmd, "--num-groups %ld needs --shared-prefix-len: the groups share a prefix",
                                  w->num_groups);
    if (w->num_groups > w->num_prompts)
        return rp_cli_usage_error(cmd, "--num-groups %ld is more than --num-prompts %ld: some groups would be empty",
                                  w->num_groups, w->num_prompts);
    if (w->length_dist == RP_BENCH_LEN_LOGNORMAL && w->range > 0)
        return rp_cli_usage_error(cmd, "--random-range-ratio %g spreads lengths uniformly; with --length-distribution "
                                       "lognormal, --length-sigma sets the spread",
                                  w->range);
    if (w->length_dist == RP_BENCH_LEN_UNIFORM && w->sigma > 0)
        return rp_cli_usage_error(cmd, "--length-sigma is the lognormal's spread: give --length-distribution lognormal "
                                       "(uniform lengths take --random-range-ratio)");
    return 0;
}

static double lognormal_sigma(const rp_bench_workload *w) { return w->sigma > 0 ? w->sigma : RP_BENCH_LOGNORMAL_SIGMA; }

/* The longest length a request can draw around len. */
static long len_max(const rp_bench_workload *w, long len) {
    return w->length_dist == RP_BENCH_LEN_LOGNORMAL ? RP_BENCH_LOGNORMAL_CAP * len : rp_bench_len_max(len, w->range);
}

/* Request i's length around len from stream: uniform as it always was
 * (bench_common.c), or lognormal (bench_workload.h) from the normal deviate
 * of the same (seed, stream, i). exp and log are libm's: a length could
 * differ by one between two C libraries when it falls on a .5, which does
 * not matter here (the dummy weights' normal must be bit-identical, these
 * need only be the same from run to run). */
static int draw_len(const rp_bench_workload *w, long len, uint64_t stream, uint64_t i) {
    if (w->length_dist == RP_BENCH_LEN_UNIFORM) return rp_bench_random_len(len, w->range, w->seed, stream, i);
    const double sigma = lognormal_sigma(w);
    const double mu = log((double)len) - 0.5 * sigma * sigma;
    const double x = exp(mu + sigma * rp_rand_normal(w->seed, stream, i));
    const long cap = len_max(w, len);
    return x < 1 ? 1 : x > (double)cap ? (int)cap : (int)lround(x);
}

long rp_bench_workload_requests(const rp_bench_workload *w) { return w->num_prompts * w->turns; }

long rp_bench_workload_max_output(const rp_bench_workload *w) { return len_max(w, w->output_len); }

long rp_bench_workload_max_prompt(const rp_bench_workload *w) {
    return w->shared_prefix_len + w->turns * len_max(w, w->input_len) +
           (w->turns - 1) * rp_bench_workload_max_output(w);
}

/* Lognormal lengths count at their means too: the cap's shortfall is small next to an estimate's error. */
double rp_bench_workload_prompt_tokens(const rp_bench_workload *w) {
    double per_conv = 0; /* turn t resends the prefix, t + 1 inputs and t answers */
    for (long t = 0; t < w->turns; t++)
        per_conv += (double)w->shared_prefix_len + (double)(t + 1) * w->input_len + (double)t * w->output_len;
    return per_conv * (double)w->num_prompts;
}

int rp_bench_workload_new_tokens(const rp_bench_workload *w, long c, long t, int vocab, int32_t *out) {
    const uint64_t i = (uint64_t)(t * w->num_prompts + c), v = (uint64_t)vocab;
    int n = 0;
    if (t == 0 && w->shared_prefix_len > 0) {
        const uint64_t g = (uint64_t)(c % w->num_groups);
        for (long k = 0; k < w->shared_prefix_len; k++)
            out[n++] = (int32_t)(rp_rand_u64(w->seed, PREFIX_STREAM + g, (uint64_t)k) % v);
    }
    const int len = draw_len(w, w->input_len, w->in_stream, i);
    for (int k = 0; k < len; k++) out[n++] = (int32_t)(rp_rand_u64(w->seed, w->token_stream + i, (uint64_t)k) % v);
    return n;
}

int rp_bench_workload_output(const rp_bench_workload *w, long c, long t) {
    return draw_len(w, w->output_len, w->out_stream, (uint64_t)(t * w->num_prompts + c));
}

void rp_bench_workload_answer_stand_in(const rp_bench_workload *w, long c, long t, int n, int vocab, int32_t *out) {
    const uint64_t i = (uint64_t)(t * w->num_prompts + c);
    for (int k = 0; k < n; k++) out[k] = (int32_t)(rp_rand_u64(w->seed, ANSWER_STREAM + i, (uint64_t)k) % (uint64_t)vocab);
}

void rp_bench_workload_describe(const rp_bench_workload *w, char *buf, size_t n) {
    int k = 0;
    if (w->shared_prefix_len > 0)
        k = snprintf(buf, n, "shared prefix %ld x %ld group%s", w->shared_prefix_len, w->num_groups,
                     w->num_groups == 1 ? "" : "s");
    if (k < 0 || (size_t)k >= n) return;
    if (w->turns > 1) k += snprintf(buf + k, n - (size_t)k, "%s%ld-turn chat", k ? ", " : "", w->turns);
    else if (!k) k = snprintf(buf, n, "random");
    if (k < 0 || (size_t)k >= n || w->length_dist != RP_BENCH_LEN_LOGNORMAL) return;
    snprintf(buf + k, n - (size_t)k, ", lognormal lengths (sigma %.2f, at most %dx the mean)",
             lognormal_sigma(w), RP_BENCH_LOGNORMAL_CAP);
}
