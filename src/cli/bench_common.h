/* Helpers shared by the benchmark and profiler commands. */
#ifndef RP_CLI_BENCH_COMMON_H
#define RP_CLI_BENCH_COMMON_H

#include "backend/backend.h"
#include "engine/batch.h"
#include "kv/page_table.h"

typedef struct rp_bench_seq {
    int row;     /* page-table row */
    int len;     /* tokens in the cache */
    int32_t last; /* next input token */
} rp_bench_seq;

double rp_bench_median(double *v, int n);
/* Prefills B sequences with ctx seeded random tokens through the batched path. */
int rp_bench_prefill(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B, int ctx,
                     int vocab, double *seconds, rp_err *err);
/* Runs `steps` decode steps over the B sequences, each sampling with *sp
 * (NULL: greedy; sequence s seeded s + 1, the RNG counter its length);
 * per-step wall and device milliseconds (device: 0 when the backend does
 * not time). */
int rp_bench_decode_steps(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B,
                          int steps, const rp_sample_params *sp, double *wall_ms, double *gpu_ms, float *logits,
                          rp_err *err);
/* The same, as the engine overlaps them: step N + 1 (its tokens references
 * to step N's) is launched before step N's tokens are read. wall_ms[k]: the
 * time between the reads of steps k - 1 and k, i.e. the time per output
 * token a user sees. Needs token references and device sampling. */
int rp_bench_decode_overlapped(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B,
                               int steps, const rp_sample_params *sp, double *wall_ms, double *gpu_ms, rp_err *err);
/* "1,8,32" -> sizes in 1..1024; the count, or -1. */
int rp_bench_parse_list(const char *s, int *out, int max);

#endif
