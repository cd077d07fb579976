/* `replay profile`: where a decode step's time goes, or with --prefill a
 * step of prompt chunks, measured inside replay (CUDA events around every
 * kernel of an eager step; nsys is not needed).
 *
 * Prints the per-kernel table of an eager step (name, launches per
 * step, mean microseconds per launch, share of the step), then eager and
 * graph steps side by side: wall time, device time, the gap between them,
 * and the host overheads that make the gap (packing the metadata block,
 * launching, waiting for the sampled tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/bench_common.h"
#include "cli/cli.h"
#include "engine/runner.h"
#include "util/log.h"

#define CMD "profile"
#define MAX_KINDS 64
#define PROFILE_WARMUP 4 /* untimed steps per mode */

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay profile (--model DIR | --dummy-weights NAME) [--batch B] [OPTIONS]\n"
            "\n"
            "Per-kernel times of a decode step (or, with --prefill, a step of prompt chunks) and the\n"
            "step's host overheads, eager and graph. It needs a GPU (CUDA); --ctx plus the steps must\n"
            "fit the model's context.\n"
            "\n" RP_GPU_MODEL_OPTIONS_HELP
            "\n"
            "Benchmark:\n"
            "  --batch B              sequences decoded together, 1 to 1024 (default 1)\n"
            "  --ctx N                tokens in each sequence's cache (default 512)\n"
            "  --steps N              steps measured per mode (default 32)\n"
            "  --prefill N            profile a step of N new prompt tokens per sequence after its --ctx\n"
            "                         cached ones instead of a decode step (default 0: decode)\n"
            "\n");
    rp_bench_output_help(f, "  --timeline F           a trace build (cmake -DREPLAY_DECODE_STEP_TRACE=ON): every weight\n"
                            "                         piece's timing of the one-kernel step into F, for\n"
                            "                         tools/step_timeline.py (default: none)\n");
}

typedef struct kind_acc {
    const char *name;
    double total_ms;
    int count;
} kind_acc;

static const struct option options[] = {
    RP_GPU_MODEL_LONG_OPTIONS,
    {"batch", required_argument, 0, 'b'},
    {"ctx", required_argument, 0, 'c'},
    {"steps", required_argument, 0, 's'},
    {"prefill", required_argument, 0, 'p'},
    {"timeline", required_argument, 0, 't'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    long B = 1, ctx = 512, steps = 32, prefill = 0;
    const char *timeline = NULL;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 't':
#ifndef REPLAY_DECODE_STEP_TRACE
            return rp_cli_usage_error(CMD, "--timeline needs a trace build (cmake -DREPLAY_DECODE_STEP_TRACE=ON)");
#endif
            timeline = optarg;
            break;
        case 'b':
            if (rp_parse_int(optarg, 1, 1024, &B))
                return rp_cli_usage_error(CMD, "--batch must be an integer from 1 to 1024, got '%s'", optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &ctx))
                return rp_cli_usage_error(CMD, "--ctx must be an integer from 1 to %d, got '%s'", 1 << 20, optarg);
            break;
        case 'p':
            if (rp_parse_int(optarg, 1, 1 << 20, &prefill))
                return rp_cli_usage_error(CMD, "--prefill must be an integer from 1 to %d, got '%s'", 1 << 20,
                                          optarg);
            break;
        case 's':
            if (rp_parse_int(optarg, 1, 10000, &steps))
                return rp_cli_usage_error(CMD, "--steps must be an integer from 1 to 10000, got '%s'", optarg);
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int no_gpu = rp_bench_need_gpu(&mo, CMD);
    if (no_gpu) return no_gpu;
    if (timeline && rp_cli_check_output("--timeline", timeline, CMD)) return RP_EXIT_USAGE;
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    /* the warm-up steps and both modes' steps grow every sequence past --ctx */
    int total_len = (int)(prefill ? ctx + prefill : ctx + PROFILE_WARMUP + 2 * steps + 1), ps = 16;
    if (total_len > mo.cfg.max_position_embeddings)
        return rp_cli_usage_error(CMD, "--ctx %ld plus %ld steps (%d warm-up, twice --steps %ld) is %d tokens, more "
                                       "than the model's context of %d",
                                  ctx, PROFILE_WARMUP + 2 * steps, PROFILE_WARMUP, steps, total_len,
                                  mo.cfg.max_position_embeddings);
    rp_runner_config rcfg;
    rp_cli_runner_config(&mo, &rcfg);
    rcfg.page_size = ps;
    rcfg.num_pages = (int)B * ((total_len + ps - 1) / ps);
    rcfg.max_seqs = (int)B;
    rcfg.max_context = total_len;
    rcfg.max_batched_tokens = prefill && B * prefill > 8192 ? (int)(B * prefill) : 8192;
    rcfg.profile = 1;
    rcfg.trace_timeline_path = timeline;
    rcfg.num_cuda_graph_bs = 1;
    rcfg.cuda_graph_bs[0] = (int)B;
    if (rp_cli_is_worker(&mo)) return rp_cli_runner_worker(&mo, &rcfg, CMD);
    rp_runner *run = rp_cli_runner_new(&mo, &rcfg, CMD);
    if (!run) return RP_EXIT_RUNTIME;
    rp_backend *be = run->backend;
    int rc = RP_EXIT_RUNTIME;
    rp_err err;
    rp_runner_seq *seqs = calloc((size_t)B, sizeof *seqs);
    /* the timing arrays also take the PROFILE_WARMUP untimed steps */
    const size_t n_times = (size_t)(steps > PROFILE_WARMUP ? steps : PROFILE_WARMUP);
    double *wall = malloc(n_times * sizeof *wall), *gpu = malloc(n_times * sizeof *gpu);
    double *pack = malloc((size_t)steps * sizeof *pack), *launch = malloc((size_t)steps * sizeof *launch),
           *sync = malloc((size_t)steps * sizeof *sync);
    rp_profile_entry *entries = malloc(4096 * sizeof *entries);
    kind_acc kinds[MAX_KINDS];
    int nkinds = 0;
    double results[2][6];
    if (!seqs || !wall || !gpu || !pack || !launch || !sync || !entries) {
        rc = rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    if (total_len > run->max_context) {
        rc = rp_cli_runtime_error(CMD, "--ctx %ld plus %ld steps exceeds the model's context of %d", ctx,
                                  PROFILE_WARMUP + 2 * steps, run->max_context);
        goto out;
    }
    if (!be->ops->profile || !be->ops->set_graphs) {
        rc = rp_cli_runtime_error(CMD, "this backend cannot profile");
        goto out;
    }
    if (rp_runner_seqs_begin(run, seqs, (int)B, &err)) goto fail;
    double prefill_s;
    if (rp_runner_prefill_random(run, seqs, (int)B, (int)ctx, &prefill_s, &err)) goto fail;
    for (int mode = 0; mode < 2; mode++) { /* 0 eager, 1 graph */
        be->ops->set_graphs(be, mode == 1);
        for (int s = 0; s < B; s++) seqs[s].len = (int)ctx;
        for (int it = 0; prefill && it < PROFILE_WARMUP; it++)
            if (rp_runner_chunk_step(run, seqs, (int)B, (int)prefill, wall, gpu, &err)) goto fail;
        if (!prefill && rp_runner_decode_steps(run, seqs, (int)B, PROFILE_WARMUP, NULL, wall, gpu, &err)) goto fail;
        for (int it = 0; it < steps; it++) {
            if (prefill ? rp_runner_chunk_step(run, seqs, (int)B, (int)prefill, wall + it, gpu + it, &err)
                        : rp_runner_decode_steps(run, seqs, (int)B, 1, NULL, wall + it, gpu + it, &err))
                goto fail;
            rp_backend_stats st;
            be->ops->stats(be, &st);
            pack[it] = st.last_pack_ms;
            launch[it] = st.last_launch_ms;
            sync[it] = st.last_sync_ms;
            if (mode == 0) {
                int n = be->ops->profile(be, entries, 4096);
                for (int i = 0; i < n; i++) {
                    int k = 0;
                    while (k < nkinds && strcmp(kinds[k].name, entries[i].name) != 0) k++;
                    if (k == nkinds) {
                        if (nkinds == MAX_KINDS) continue;
                        kinds[nkinds++] = (kind_acc){entries[i].name, 0, 0};
                    }
                    kinds[k].total_ms += entries[i].ms;
                    kinds[k].count++;
                }
            }
        }
        results[mode][0] = rp_bench_median(wall, (int)steps);
        results[mode][1] = rp_bench_median(gpu, (int)steps);
        results[mode][2] = rp_bench_median(pack, (int)steps);
        results[mode][3] = rp_bench_median(launch, (int)steps);
        results[mode][4] = rp_bench_median(sync, (int)steps);
    }
    double kernel_total = 0;
    for (int k = 0; k < nkinds; k++) kernel_total += kinds[k].total_ms;
    printf("replay profile: %s, batch %ld, ctx %ld, %ld steps per mode", mo.dummy_name ? mo.dummy_name : mo.model_dir,
           B, ctx, steps);
    if (prefill) printf(", %ld new tokens per sequence", prefill);
    printf("\n\nEager %s step, per kernel (CUDA events around each launch):\n", prefill ? "prompt chunk" : "decode");
    printf("%-20s %10s %12s %10s\n", "kernel", "per step", "mean us", "% step");
    for (int k = 0; k < nkinds; k++)
        printf("%-20s %10.1f %12.2f %9.1f%%\n", kinds[k].name, (double)kinds[k].count / steps,
               kinds[k].total_ms * 1e3 / kinds[k].count, 100.0 * kinds[k].total_ms / kernel_total);
    printf("%-20s %10s %12.2f\n\n", "sum of kernels", "", kernel_total * 1e3 / steps);
    /* tensor parallelism: the collectives' share (rank 0's events: its time
     * in them includes waiting for the slowest rank) */
    double coll_ms = 0;
    int one_kernel = 0;
    for (int k = 0; k < nkinds; k++) {
        if (rp_bench_is_collective(kinds[k].name)) coll_ms += kinds[k].total_ms;
        const int o = rp_bench_is_one_kernel_step(kinds[k].name);
        if (o > one_kernel) one_kernel = o;
    }
    if (mo.tp_size > 1)
        printf("Tensor parallel over %d GPUs: %s %.2f us a step (%.1f%% of the eager step), rank 0's events\n\n",
               mo.tp_size,
               one_kernel == 2 ? "the sums and the greedy pick run inside the one-kernel step (not timed apart); "
                                 "the logit gather"
               : one_kernel    ? "the sums run inside the one-kernel step (not timed apart); the logit gather"
                               : "all-reduces and the logit gather",
               coll_ms * 1e3 / steps, kernel_total > 0 ? 100.0 * coll_ms / kernel_total : 0.0);
    printf("Per step (medians, ms)      %10s %10s\n", "eager", "graph");
    printf("  wall                      %10.3f %10.3f\n", results[0][0], results[1][0]);
    printf("  device (events)           %10.3f %10.3f\n", results[0][1], results[1][1]);
    printf("  gap (wall - device)       %10.3f %10.3f\n", results[0][0] - results[0][1], results[1][0] - results[1][1]);
    printf("  host: pack + copy meta    %10.3f %10.3f\n", results[0][2], results[1][2]);
    printf("  host: launch              %10.3f %10.3f\n", results[0][3], results[1][3]);
    printf("  host: wait for tokens     %10.3f %10.3f\n", results[0][4], results[1][4]);
    const double tok = (double)B * (prefill ? prefill : 1);
    printf("  tokens/s                  %10.1f %10.1f\n", tok / (results[0][0] * 1e-3), tok / (results[1][0] * 1e-3));
    printf("\n(the eager device time includes the profiling events; graph steps carry none)\n");
    rc = RP_EXIT_OK;
    goto out;
fail:
    rc = rp_cli_runtime_error(CMD, "%s", err.msg);
out:
    free(entries);
    free(pack);
    free(launch);
    free(sync);
    free(wall);
    free(gpu);
    free(seqs);
    rp_runner_free(run);
    return rc;
}

const rp_cli_command rp_cli_profile = {"profile", "per-kernel times and host overheads of a decode step (CUDA)", options, help, run};
