/* Small helpers the benchmark and profiler commands share: medians and
 * batch-size lists. The decode loops they time live in the runner
 * (src/engine/runner.h). */
#ifndef RP_CLI_BENCH_COMMON_H
#define RP_CLI_BENCH_COMMON_H

/* The median of v[0..n) (sorts v). */
double rp_bench_median(double *v, int n);
/* "1,8,32" -> sizes in 1..1024; the count, or -1. */
int rp_bench_parse_list(const char *s, int *out, int max);

#endif
