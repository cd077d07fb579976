/* What the benchmark and profiler commands (and logits) share: medians,
 * batch-size lists, the random workload's lengths (--random-range-ratio),
 * the progress option, the warning before a long CPU run, the refusal of a
 * GPU-only command without a GPU, and the Output section of their help. The
 * decode loops they time live in the runner (src/engine/runner.h). */
#ifndef RP_CLI_BENCH_COMMON_H
#define RP_CLI_BENCH_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "cli/cli.h"

/* The median of v[0..n) (sorts v). */
double rp_bench_median(double *v, int n);
/* Tensor parallelism, by a backend profile entry's name: a collective (an
 * all-reduce or the logit gather), or the one-kernel decode step, whose
 * sums run inside it where no event can time them apart (2: with the
 * greedy pick across the ranks inside it too, 1: without, 0: not it). */
int rp_bench_is_collective(const char *profile_name);
int rp_bench_is_one_kernel_step(const char *profile_name);
/* "1,8,32" -> sizes in 1..1024; the count, or -1. */
int rp_bench_parse_list(const char *s, int *out, int max);

/* --random-range-ratio R, as vLLM's `vllm bench serve` means it: each
 * request's input and output lengths are drawn uniformly from the integers
 * in [floor(len x (1 - R)), ceil(len x (1 + R))] (at least 1), R in [0, 1);
 * 0, the default, gives every request exactly len. */
#define RP_BENCH_RANGE_RATIO_HELP                                                                  \
    "  --random-range-ratio R   lengths uniform in [len x (1-R), len x (1+R)], R in [0, 1), as\n" \
    "                           vLLM's bench (default 0: exactly len)\n"
/* Parses R; 0, or RP_EXIT_USAGE with the message printed. */
int rp_bench_parse_range_ratio(const char *arg, double *ratio, const char *cmd);
/* The shortest and longest length R allows around len. */
long rp_bench_len_min(long len, double ratio);
long rp_bench_len_max(long len, double ratio);
/* Request index's length: the same for the same (seed, stream, index). */
int rp_bench_random_len(long len, double ratio, uint64_t seed, uint64_t stream, uint64_t index);

/* --progress-interval S: seconds between the progress lines written to a
 * stderr that is not a terminal (a terminal gets one line redrawn). */
#define RP_BENCH_PROGRESS_INTERVAL 5.0
#define RP_BENCH_PROGRESS_HELP                                                                     \
    "  --progress-interval S  seconds between progress lines when stderr is not a terminal;\n"    \
    "                         0: none (default 5; a terminal gets one line, redrawn)\n"
int rp_bench_parse_interval(const char *arg, double *interval_s, const char *cmd);

/* The Output section: the command's own lines (own, may be ""), then the
 * options every command takes (RP_COMMON_OPTIONS_HELP, which opens the
 * section). */
void rp_bench_output_help(FILE *f, const char *own);

/* Before a CPU run loads: when the weights are large (> 2 GB), warns how
 * long the run will take, from decode_steps steps that each read every
 * weight and prefill_tokens prompt tokens that each cost 2 FLOPs a weight. */
void rp_bench_warn_cpu(const rp_model_config *c, int threads, double decode_steps, double prefill_tokens,
                       const char *cmd);

/* profile and bench kernels run on the GPU only: 0 when there is one to
 * run on, else the message printed and RP_EXIT_RUNTIME (a CPU-only build,
 * no GPU found) or RP_EXIT_USAGE (--device cpu). Right after parsing. */
int rp_bench_need_gpu(const rp_model_opts *mo, const char *cmd);

#endif
