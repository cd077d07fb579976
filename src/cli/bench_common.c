/* Helpers the benchmark and profiler commands share (bench_common.h). */
#include "cli/bench_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "util/log.h"
#include "util/rng.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double rp_bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* (the names forward_chain.c and forward_decode_step.c mark) */
int rp_bench_is_collective(const char *profile_name) {
    return !strncmp(profile_name, "all_reduce", 10) || !strncmp(profile_name, "all_gather", 10);
}

int rp_bench_is_one_kernel_step(const char *profile_name) {
    if (strncmp(profile_name, "decode step (one kernel", 23)) return 0;
    return strstr(profile_name, "greedy pick") ? 2 : 1;
}

int rp_bench_parse_list(const char *s, int *out, int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1024 || n == max) return -1;
        out[n++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

int rp_bench_parse_range_ratio(const char *arg, double *ratio, const char *cmd) {
    if (rp_parse_float(arg, ratio) || *ratio < 0 || *ratio >= 1)
        return rp_cli_usage_error(cmd, "--random-range-ratio must be in [0, 1), got '%s'", arg);
    return 0;
}

long rp_bench_len_min(long len, double ratio) {
    const long lo = (long)floor((double)len * (1 - ratio));
    return lo < 1 ? 1 : lo;
}

long rp_bench_len_max(long len, double ratio) {
    const long hi = (long)ceil((double)len * (1 + ratio));
    return hi < 1 ? 1 : hi;
}

int rp_bench_random_len(long len, double ratio, uint64_t seed, uint64_t stream, uint64_t index) {
    const long lo = rp_bench_len_min(len, ratio), hi = rp_bench_len_max(len, ratio);
    return (int)(lo + (long)(rp_rand_u64(seed, stream, index) % (uint64_t)(hi - lo + 1)));
}

int rp_bench_parse_interval(const char *arg, double *interval_s, const char *cmd) {
    if (rp_parse_float(arg, interval_s) || *interval_s < 0 || *interval_s > 86400)
        return rp_cli_usage_error(cmd, "--progress-interval must be seconds from 0 to 86400, got '%s'", arg);
    return 0;
}

void rp_bench_output_help(FILE *f, const char *own) {
    static const char head[] = "Output:\n";
    const char *common = RP_COMMON_OPTIONS_HELP;
    if (!strncmp(common, head, sizeof head - 1)) common += sizeof head - 1;
    fprintf(f, "%s%s%s", head, own, common);
}

/* The CPU backend's rates per thread, measured on this project's 2-core
 * development machine with qwen3-0.6b (bench decode, batch 1, ctx 64): a
 * decode step reads its weights at about 3 GB/s a thread, a prefill
 * computes about 9 GFLOP/s a thread. Taken a little lower, and only
 * roughly: the warning says "about". */
#define CPU_READ_GBS_PER_THREAD 2.0
#define CPU_GFLOPS_PER_THREAD 8.0
#define CPU_WARN_WEIGHT_BYTES 2e9

void rp_bench_warn_cpu(const rp_model_config *c, int threads, double decode_steps, double prefill_tokens,
                       const char *cmd) {
    const double params = (double)rp_config_num_params(c), weight_bytes = 2 * params;
    if (weight_bytes <= CPU_WARN_WEIGHT_BYTES) return;
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = 1;
    const double s = decode_steps * weight_bytes / (CPU_READ_GBS_PER_THREAD * 1e9 * threads) +
                     prefill_tokens * 2 * params / (CPU_GFLOPS_PER_THREAD * 1e9 * threads);
    char when[64];
    if (s < 120) snprintf(when, sizeof when, "about %.0f seconds", s);
    else if (s < 2 * 3600) snprintf(when, sizeof when, "about %.0f minutes", s / 60);
    else snprintf(when, sizeof when, "about %.0f hours", s / 3600);
    rp_log_warn("%s on the CPU: the CPU backend reads %.1f GB of weights per step and runs %.0f prompt tokens "
                "through them; this will take %s on %d threads. Use --device cuda, or a tiny shape "
                "(--dummy-weights tiny-qwen3)",
                cmd, weight_bytes / 1e9, prefill_tokens, when, threads);
}

int rp_bench_need_gpu(const rp_model_opts *mo, const char *cmd) {
#ifndef REPLAY_HAVE_CUDA
    (void)mo;
    return rp_cli_runtime_error(cmd, "needs a GPU, and this replay was built without CUDA (cmake -DREPLAY_CUDA=ON)");
#else
    if (!strcmp(mo->device, "cpu")) return rp_cli_usage_error(cmd, "--device cpu: %s runs on the GPU only", cmd);
    if (strcmp(rp_cli_device(mo), "cuda"))
        return rp_cli_runtime_error(cmd, "needs a GPU, and CUDA finds none on this machine");
    return 0;
#endif
}
