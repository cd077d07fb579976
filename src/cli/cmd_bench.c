/* `replay bench`: throughput and bandwidth measured inside replay.
 *
 * bench decode: B sequences are prefilled to --ctx tokens, then timed over
 * decode steps (graph replay and eager). Per batch size it prints the time
 * per output token, tokens/s, the bytes one step must read (weights + KV),
 * the achieved GB/s against the read bandwidth measured in the same run, and
 * the CPU gap (wall time per step minus device time). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/bench_common.h"
#include "cli/cli.h"
#include "engine/batch.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "util/log.h"
#include "util/rng.h"
#ifdef REPLAY_HAVE_CUDA
#include "backend/cuda/bandwidth.h"
#endif

#define CMD "bench decode"
#define MAX_BATCHES 32

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay bench decode (--model DIR | --dummy-weights NAME) [OPTIONS]\n"
            "\n"
            "Times decode steps at several batch sizes with every sequence at --ctx tokens.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Benchmark:\n"
            "  --batch LIST       batch sizes (default 1,8,32,128)\n"
            "  --ctx N            tokens in each sequence's KV cache (default 512)\n"
            "  --steps N          timed decode steps per batch size and mode (default 64)\n"
            "  --warmup N         untimed steps first (default 8)\n"
            "  --page-size N      KV page size (default 16)\n"
            "  --no-eager         time graph replay only\n"
            "  -h, --help         show this help\n");
}

static int bench_decode(int argc, char **argv) {
    static const struct option longopts[] = {
        RP_MODEL_LONG_OPTIONS,
        {"batch", required_argument, 0, 'b'},
        {"ctx", required_argument, 0, 'c'},
        {"steps", required_argument, 0, 's'},
        {"warmup", required_argument, 0, 'w'},
        {"page-size", required_argument, 0, 'g'},
        {"no-eager", no_argument, 0, 'E'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    int batches[MAX_BATCHES] = {1, 8, 32, 128}, nb = 4, no_eager = 0;
    long ctx = 512, steps = 64, warmup = 8, page_size = 16;
    optind = 1;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        int r = rp_model_opts_parse(&mo, opt, optarg, CMD);
        if (r < 0) return RP_EXIT_USAGE;
        if (r > 0) continue;
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'b':
            if ((nb = rp_bench_parse_list(optarg, batches, MAX_BATCHES)) <= 0)
                return rp_cli_usage_error(CMD, "--batch takes comma-separated sizes from 1 to 1024, got '%s'", optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &ctx)) return rp_cli_usage_error(CMD, "--ctx must be >= 1");
            break;
        case 's':
            if (rp_parse_int(optarg, 1, 100000, &steps)) return rp_cli_usage_error(CMD, "--steps must be >= 1");
            break;
        case 'w':
            if (rp_parse_int(optarg, 0, 100000, &warmup)) return rp_cli_usage_error(CMD, "--warmup must be >= 0");
            break;
        case 'g':
            if (rp_parse_int(optarg, 1, 4096, &page_size)) return rp_cli_usage_error(CMD, "bad --page-size");
            break;
        case 'E': no_eager = 1; break;
        case ':': return rp_cli_usage_error(CMD, "option '%s' needs a value", argv[optind - 1]);
        default: return rp_cli_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (rp_model_opts_check(&mo, CMD)) return RP_EXIT_USAGE;

    const char *dev = rp_cli_device(&mo);
    double read_gbs = 0, copy_gbs = 0;
#ifdef REPLAY_HAVE_CUDA
    if (!strcmp(dev, "cuda") && rp_cuda_read_bandwidth(0, &read_gbs, &copy_gbs) != 0)
        rp_log_warn("could not measure the read bandwidth");
#endif
    rp_model *model = rp_cli_load_model(&mo);
    if (!model) return RP_EXIT_RUNTIME;
    const rp_model_config *c = &model->cfg;
    int maxB = 0;
    for (int i = 0; i < nb; i++) maxB = batches[i] > maxB ? batches[i] : maxB;
    int total_len = (int)(ctx + warmup + 2 * steps + 1);
    if (total_len > c->max_position_embeddings) {
        rp_model_free(model);
        return rp_cli_runtime_error(CMD, "--ctx %ld plus %ld steps exceeds the model's context of %d", ctx,
                                    warmup + 2 * steps, c->max_position_embeddings);
    }
    int pages_per_seq = (total_len + (int)page_size - 1) / (int)page_size;
    int num_pages = pages_per_seq * maxB;
    rp_backend_config bc = {.num_pages = num_pages, .page_size = (int)page_size, .max_batch_seqs = maxB,
                            .max_logit_rows = maxB, .max_batch_tokens = 8192};
    if (bc.max_batch_tokens < maxB) bc.max_batch_tokens = maxB;
    bc.num_cuda_graph_bs = nb;
    memcpy(bc.cuda_graph_bs, batches, (size_t)nb * sizeof(int));
    int rc = RP_EXIT_RUNTIME;
    rp_err err;
    rp_page_pool *pool = rp_page_pool_new(num_pages, (int)page_size);
    rp_page_table *table = rp_page_table_new(pool, maxB, total_len);
    rp_backend *be = rp_cli_make_backend(model, &mo, &bc);
    rp_batch_builder *bb = be ? rp_batch_builder_new(table, bc.max_batch_tokens, maxB, maxB) : NULL;
    rp_bench_seq *seqs = calloc((size_t)maxB, sizeof *seqs);
    double *wall = malloc((size_t)steps * sizeof *wall), *gpu = malloc((size_t)steps * sizeof *gpu);
    float *logits = malloc((size_t)maxB * c->vocab_size * sizeof *logits);
    if (!be || !bb || !seqs || !wall || !gpu || !logits) goto out;

    /* Bytes a decode step must read: every weight once (the embedding table
     * only when it doubles as lm_head), plus the KV cache of each sequence. */
    uint64_t embed_bytes = (uint64_t)c->vocab_size * c->hidden_size * 2;
    uint64_t weight_read = model->weight_bytes - (c->tie_word_embeddings ? 0 : embed_bytes);
    uint64_t kv_per_token = (uint64_t)c->num_layers * 2 * c->num_kv_heads * c->head_dim * 2;

    printf("replay bench decode: %s (%s), %.2f GB of weights, ctx %ld, page %ld, device %s\n",
           mo.dummy_name ? mo.dummy_name : mo.model_dir, c->arch_name, (double)weight_read / 1e9, ctx, page_size,
           dev);
    if (read_gbs > 0)
        printf("measured bandwidth: read %.0f GB/s, device copy %.0f GB/s (read+write)\n", read_gbs, copy_gbs);
    printf("\n%5s  %-6s %9s %10s %11s %9s %7s %9s %9s %11s\n", "batch", "mode", "ms/step", "tok/s", "MB/step",
           "GB/s", "%read", "gpu ms", "gap ms", "prefill t/s");
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        for (int s = 0; s < B; s++) {
            seqs[s].row = rp_page_table_acquire_row(table);
            if (seqs[s].row < 0) {
                rp_errf(&err, "no page-table row");
                goto fail;
            }
        }
        double prefill_s = 0;
        if (rp_bench_prefill(be, table, bb, seqs, B, (int)ctx, c->vocab_size, &prefill_s, &err)) goto fail;
        for (int mode = 0; mode < 2; mode++) {
            int graphs = mode == 0;
            if (!graphs && no_eager) break;
            if (be->ops->set_graphs) be->ops->set_graphs(be, graphs);
            else if (graphs) continue; /* no graphs on this backend: eager only */
            for (int s = 0; s < B; s++) seqs[s].len = (int)ctx; /* rewind: KV past ctx is rewritten */
            if (warmup && rp_bench_decode_steps(be, table, bb, seqs, B, (int)warmup, wall, gpu, logits, &err)) goto fail;
            if (rp_bench_decode_steps(be, table, bb, seqs, B, (int)steps, wall, gpu, logits, &err)) goto fail;
            double w = rp_bench_median(wall, (int)steps), g = rp_bench_median(gpu, (int)steps);
            double avg_ctx = (double)ctx + warmup + steps / 2.0;
            double bytes = (double)weight_read + (double)B * avg_ctx * (double)kv_per_token;
            double gbs = bytes / (w * 1e-3) / 1e9;
            printf("%5d  %-6s %9.3f %10.1f %11.1f %9.0f %6.1f%% %9.3f %9.3f %11.0f\n", B, graphs ? "graph" : "eager",
                   w, B / (w * 1e-3), bytes / 1e6, gbs, read_gbs > 0 ? 100.0 * gbs / read_gbs : 0.0, g,
                   g > 0 ? w - g : 0.0, (double)B * ctx / prefill_s);
            fflush(stdout);
        }
        for (int s = 0; s < B; s++) rp_page_table_release_row(table, seqs[s].row);
    }
    if (be->ops->stats) {
        rp_backend_stats st;
        be->ops->stats(be, &st);
        printf("\ngraphs: %d captured in %.2fs (%.1f MiB); device allocations after startup: %llu\n", st.num_graphs,
               st.graph_capture_s, st.graph_memory_mib, (unsigned long long)st.device_allocs);
    }
    rc = RP_EXIT_OK;
    goto out;
fail:
    rc = rp_cli_runtime_error(CMD, "%s", err.msg);
out:
    free(seqs);
    free(wall);
    free(gpu);
    free(logits);
    rp_batch_builder_free(bb);
    rp_backend_destroy(be);
    rp_page_table_free(table);
    rp_page_pool_free(pool);
    rp_model_free(model);
    return rc;
}

int rp_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "Usage: replay bench SUBCOMMAND [OPTIONS]\n\nSubcommands:\n"
                   "  decode     decode step time, tokens/s and bandwidth per batch size\n");
        return argc < 2 ? RP_EXIT_USAGE : RP_EXIT_OK;
    }
    if (!strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
    return rp_cli_usage_error("bench", "unknown subcommand '%s'", argv[1]);
}
