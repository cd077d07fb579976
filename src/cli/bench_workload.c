/* The benchmark workloads (bench_workload.h). */
#include "cli/bench_workload.h"

#include <getopt.h>
#include <stdio.h>

#include "cli/bench_common.h"
#include "cli/cli.h"
#include "util/rng.h"

/* The stream of group g's prefix tokens: far above any request's
 * token_stream + i (requests are fewer than 2^40). */
#define PREFIX_STREAM (1ull << 40)
#define ANSWER_STREAM (1ull << 41)

int rp_bench_workload_parse(rp_bench_workload *w, int opt, const char *arg, const char *cmd) {
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
    return 0;
}

long rp_bench_workload_requests(const rp_bench_workload *w) { return w->num_prompts * w->turns; }

long rp_bench_workload_max_output(const rp_bench_workload *w) { return rp_bench_len_max(w->output_len, w->range); }

long rp_bench_workload_max_prompt(const rp_bench_workload *w) {
    return w->shared_prefix_len + w->turns * rp_bench_len_max(w->input_len, w->range) +
           (w->turns - 1) * rp_bench_workload_max_output(w);
}

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
    const int len = rp_bench_random_len(w->input_len, w->range, w->seed, w->in_stream, i);
    for (int k = 0; k < len; k++) out[n++] = (int32_t)(rp_rand_u64(w->seed, w->token_stream + i, (uint64_t)k) % v);
    return n;
}

int rp_bench_workload_output(const rp_bench_workload *w, long c, long t) {
    return rp_bench_random_len(w->output_len, w->range, w->seed, w->out_stream, (uint64_t)(t * w->num_prompts + c));
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
    if (w->turns > 1) snprintf(buf + k, n - (size_t)k, "%s%ld-turn chat", k ? ", " : "", w->turns);
    else if (!k) snprintf(buf, n, "random");
}
