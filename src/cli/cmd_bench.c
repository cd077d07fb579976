/* `replay bench`: throughput and bandwidth measured inside replay.
 *
 * bench decode: B sequences are prefilled to --ctx tokens, then timed over
 * decode steps (graph replay and eager). Per batch size it prints the time
 * per output token, tokens/s, the bytes one step must read (weights + KV),
 * the achieved GB/s against the read bandwidth measured in the same run, and
 * the CPU gap (wall time per step minus device time). Steps overlap as in
 * the engine (step N + 1 launched before step N's tokens are read) where the
 * backend can; --no-overlap waits for each step's tokens first.
 *
 * bench offline: a workload (bench_workload.h: random prompts, prompts
 * sharing a prefix by group, multi-turn chats) through the engine, every
 * first turn submitted at once, a later turn when the one before finished;
 * it prints throughput, latency, the prefix cache's hit rate and KV use,
 * against the workload's lower bound on time. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/bench_common.h"
#include "cli/bench_workload.h"
#include "cli/cli.h"
#include "cli/structured_opts.h"
#include "engine/runner.h"
#include "engine/spec_policy.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/rng.h"
#include "replay/engine.h"
#include "model/config.h"
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
            "--ctx plus --warmup plus twice --steps must fit the model's context.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Benchmark:\n"
            "  --batch LIST           batch sizes (default 1,8,32,128)\n"
            "  --ctx N                tokens in each sequence's KV cache (default 512)\n"
            "  --steps N              timed decode steps per batch size and mode (default 64)\n"
            "  --warmup N             untimed steps first (default 8)\n"
            "  --page-size N          KV page size (default 16)\n"
            "  --no-eager             time graph replay only\n"
            "  --no-overlap           wait for each step's tokens before launching the next (by default\n"
            "                         steps overlap as in the engine, where the backend can)\n"
            "  --temperature T        sample at temperature T (default 0: greedy)\n"
            "  --top-p P              and keep the smallest set of tokens with probability >= P (default 1)\n"
            "  --speculative-tokens K also time speculative rounds of K drafts (1 to 8) after each batch's\n"
            "                         plain steps: an oracle drafter proposes the sequence's own greedy\n"
            "                         continuation, each draft replaced by another token at the rate\n"
            "                         1 - A; random weights accept nothing by themselves (default: none)\n"
            "  --acceptance LIST      the rates A to time, in [0, 1] (default 0,0.5,0.7,0.9,1)\n"
            "  --speculative-dummy-weights NAME, --speculative-model DIR\n"
            "                         with --speculative-tokens: a draft model runs its steps in every\n"
            "                         round as the engine runs them (a catch-up of 1-2 tokens, then K - 1\n"
            "                         decode steps), timed into the round; the oracle still chooses the\n"
            "                         drafts, so acceptance is the rate asked for (default: none)\n"
            "  --speculative-always   every sequence drafts every round; by default the engine's rule\n"
            "                         applies (a sequence whose rounds keep too few drafts decodes plainly,\n"
            "                         probing now and then: docs/speculative.md) (default: off)\n"
            "  --fp8-blocks           quantize the bf16 (or dummy) layer matrices to e4m3 with a scale per\n"
            "                         128x128 block as they load: the official FP8 checkpoints' layout, to\n"
            "                         time its kernels without one (docs/models.md) (default: off)\n"
            "\n");
    rp_bench_output_help(f, RP_BENCH_PROGRESS_HELP);
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"batch", required_argument, 0, 'b'},
    {"ctx", required_argument, 0, 'c'},
    {"steps", required_argument, 0, 's'},
    {"warmup", required_argument, 0, 'w'},
    {"page-size", required_argument, 0, 'g'},
    {"no-eager", no_argument, 0, 'E'},
    {"no-overlap", no_argument, 0, 'O'},
    {"temperature", required_argument, 0, 'T'},
    {"top-p", required_argument, 0, 'P'},
    {"progress-interval", required_argument, 0, 'i'},
    {"speculative-tokens", required_argument, 0, 'K'},
    {"acceptance", required_argument, 0, 'A'},
    {"speculative-dummy-weights", required_argument, 0, 'D'},
    {"speculative-model", required_argument, 0, 'M'},
    {"speculative-always", no_argument, 0, 'Y'},
    {"fp8-blocks", no_argument, 0, 'B'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

#define MAX_RATES 16

/* --acceptance: comma-separated rates in [0, 1]; how many, or -1. */
static int parse_rates(const char *s, double *out) {
    int n = 0;
    while (*s) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v >= 0 && v <= 1) || n == MAX_RATES || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n ? n : -1;
}

/* A draft model's side of bench_speculative: its runner, its copy of the
 * sequences (prefilled to the same ctx) and each round's time. */
typedef struct bench_draft {
    rp_runner *run;
    rp_runner_seq *seqs;
    int32_t *tok;
    int32_t *fed; /* a catch-up's tokens, up to max_fed */
    int max_fed;
    int *last_row; /* each sequence's catch-up logit row */
} bench_draft;

/* The draft model's steps of one round as the engine runs them
 * (engine/draft_model.c): what it has not seen of each sequence (its last
 * token, and the last kept draft after a round that kept every one), then
 * K - 1 decode steps; their wall time into *ms. */
static int draft_round(bench_draft *d, const rp_runner_seq *seqs, int B, int K, const int *ks, double *ms,
                       rp_err *err) {
    rp_runner *r = d->run;
    const double t0 = rp_now_s();
    int rows = 0;
    *ms = 0;
    rp_batch_begin(r->bb);
    for (int s = 0; s < B; s++) {
        if (ks && !ks[s]) continue; /* not drafting this round: it catches up when it does */
        const int n = seqs[s].len + 1 - d->seqs[s].len;
        RP_ASSERT(n >= 1 && n <= d->max_fed);
        for (int i = 0; i < n; i++) d->fed[i] = seqs[s].last; /* the values do not change the time */
        if (rp_page_table_reserve(r->table, d->seqs[s].row, d->seqs[s].len + n + K - 1, err)) return RP_ERR;
        /* as the engine feeds it: a few tokens as one-token positions (a decode batch), more as a chunk */
        int lr = n <= 4 ? rp_batch_add_positions(r->bb, d->seqs[s].row, d->fed, n, d->seqs[s].len) : -1;
        if (lr >= 0) lr += n - 1;
        else lr = rp_batch_add(r->bb, d->seqs[s].row, d->fed, n, d->seqs[s].len, 1);
        if (lr < 0) return rp_errf(err, "the draft's catch-up step of %d sequences does not fit", B);
        d->last_row[s] = lr;
        d->seqs[s].len += n;
        rows = lr + 1;
    }
    if (!rows) return RP_OK;
    if (rp_runner_forward_greedy(r, rp_batch_finish(r->bb), rows, d->tok, err)) return RP_ERR;
    int drafting = 0;
    for (int s = 0; s < B; s++)
        if (!ks || ks[s]) d->tok[drafting++] = d->tok[d->last_row[s]]; /* each one's d_1, in order */
    for (int j = 1; j < K; j++) {
        rp_batch_begin(r->bb);
        for (int s = 0, i = 0; s < B; s++) {
            if (ks && !ks[s]) continue;
            if (rp_batch_add(r->bb, d->seqs[s].row, &d->tok[i++], 1, d->seqs[s].len, 1) < 0)
                return rp_errf(err, "the draft's step of %d sequences does not fit", B);
            d->seqs[s].len++;
        }
        if (rp_runner_forward_greedy(r, rp_batch_finish(r->bb), drafting, d->tok, err)) return RP_ERR;
    }
    *ms = (rp_now_s() - t0) * 1e3;
    return RP_OK;
}

/* Speculative rounds with an oracle drafter at each acceptance rate, for
 * the B sequences prefilled to ctx (their token after the prefill in
 * last0). The oracle drafts the target's own greedy continuation, each
 * draft replaced with another token at the rate 1 - A (a counter-based
 * draw, the same every run). Which continuation: the one this very step
 * computes, found by untimed passes of the same step before the timed one
 * (on the GPU the products' kernels depend on the step's rows and the one
 * kernel of a plain step differs from a round's chain by bf16 noise, and
 * random weights make near-ties common); a reference built first by rounds
 * that draft what the previous one predicted makes one pass the usual
 * case. Each sequence drafts as the engine's rule says (spec_policy.h;
 * `always`: every round), until every sequence has made R tokens (one that
 * has stays in the batch, rewriting its positions). Prints a round's ms
 * (the draft model's share apart), a step's time over a plain step's,
 * tokens a round, tok/s against plain decoding's, kept drafts unlike the
 * target's own tokens (0 unless a row depends on the rest of its step) and
 * the share of sequence-steps that were rounds. */
static int bench_speculative(rp_runner *run, rp_runner_seq *seqs, const int32_t *last0, int B, int ctx, int K, int R,
                             const double *rates, int nr, double plain_ms, bench_draft *draft, int always,
                             rp_err *err) {
    const int vocab = run->model->cfg.vocab_size, L = R + K;
    int32_t *ref = malloc((size_t)B * L * sizeof *ref), *drafts = malloc((size_t)B * K * sizeof *drafts),
            *guess = malloc((size_t)B * K * sizeof *guess), *out = malloc((size_t)B * (K + 1) * sizeof *out);
    int *made = malloc((size_t)B * sizeof *made), *ks = malloc((size_t)B * sizeof *ks);
    rp_spec_track *tr = malloc((size_t)B * sizeof *tr);
    int rc = RP_ERR;
    double w, g;
    if (!ref || !drafts || !guess || !out || !made || !ks || !tr) {
        rp_errf(err, "out of memory");
        goto done;
    }
    for (int s = 0; s < B; s++) seqs[s].len = ctx, seqs[s].last = last0[s], made[s] = 0;
    memset(ref, 0, (size_t)B * L * sizeof *ref);
    for (int least = 0; least < L;) { /* made[s]: reference tokens known */
        for (int s = 0; s < B; s++)
            for (int j = 0; j < K; j++) drafts[(size_t)s * K + j] = made[s] + j < L ? ref[(size_t)s * L + made[s] + j] : 0;
        if (rp_runner_verify_step(run, seqs, B, K, NULL, drafts, out, &w, &g, err)) goto done;
        least = L;
        for (int s = 0; s < B; s++) {
            const int32_t *o = out + (size_t)s * (K + 1);
            if (made[s] >= L) continue;
            int kept = 0;
            while (kept < K && o[kept] == drafts[(size_t)s * K + kept]) kept++;
            /* o[0..kept] are the continuation; what follows a mismatch, the next round's guess */
            for (int j = 0; j <= K && made[s] + j < L; j++) ref[(size_t)s * L + made[s] + j] = o[j];
            made[s] += kept + 1;
            if (made[s] > L) made[s] = L;
            seqs[s].len += kept + 1;
            seqs[s].last = o[kept];
            if (made[s] < least) least = made[s];
        }
    }
    for (int a = 0; a < nr; a++) {
        for (int s = 0; s < B; s++) seqs[s].len = ctx, seqs[s].last = last0[s], made[s] = 0;
        if (draft)
            for (int s = 0; s < B; s++) draft->seqs[s].len = ctx;
        for (int s = 0; s < B; s++) rp_spec_track_init(&tr[s]);
        long rounds = 0, drafted = 0, kept_total = 0, unlike = 0, emitted = 0, seq_rounds = 0, seq_steps = 0;
        double wall = 0, gpu = 0, dwall = 0, dms = 0;
        for (int least = 0; least < R;) {
            /* the engine's rule (spec_policy.h): a sequence whose rounds do not pay off decodes plainly */
            for (int s = 0; s < B; s++) ks[s] = always || rp_spec_track_wants(&tr[s]) ? K : 0;
            /* The oracle's drafts must be the target's own continuation as this very step computes it
             * (the products' kernels depend on the step's rows, and a plain step's one kernel differs
             * from a round's chain by bf16 noise): untimed passes of the same step, drafting the
             * reference, until the target agrees with every drafted token; each pass fixes at least
             * one, and the fixes go back into the reference. */
            for (int pass = 0, agree = 0; !agree; pass++) {
                RP_ASSERT(pass <= K);
                for (int s = 0; s < B; s++)
                    for (int j = 0; j < K; j++) guess[(size_t)s * K + j] = made[s] + j < L ? ref[(size_t)s * L + made[s] + j] : 0;
                if (rp_runner_verify_step(run, seqs, B, K, ks, guess, out, &w, &g, err)) goto done;
                agree = 1;
                for (int s = 0; s < B; s++)
                    for (int j = 0; j < ks[s] && made[s] + j < L; j++) {
                        const int32_t o = out[(size_t)s * (K + 1) + j];
                        if (o == guess[(size_t)s * K + j]) continue;
                        ref[(size_t)s * L + made[s] + j] = o;
                        agree = 0;
                        break;
                    }
            }
            /* the drafts: the agreed continuation, each replaced at the rate 1 - A */
            for (int s = 0; s < B; s++)
                for (int j = 0; j < K; j++) {
                    const int32_t t = made[s] + j < L ? ref[(size_t)s * L + made[s] + j] : 0;
                    const uint64_t c = (uint64_t)rounds * K + (uint64_t)j;
                    drafts[(size_t)s * K + j] = rp_rand_uniform(17, (uint64_t)s, c) < rates[a]
                                                    ? t
                                                    : (int32_t)((t + 1 + rp_rand_u64(18, (uint64_t)s, c) % (uint64_t)(vocab - 1)) % (uint64_t)vocab);
                }
            if (draft && draft_round(draft, seqs, B, K, ks, &dms, err)) goto done;
            if (rp_runner_verify_step(run, seqs, B, K, ks, drafts, out, &w, &g, err)) goto done;
            wall += w + dms, gpu += g, dwall += dms, rounds++;
            least = R;
            for (int s = 0; s < B; s++) {
                const int32_t *o = out + (size_t)s * (K + 1);
                if (made[s] < R) { /* else done: it rewrites the same positions */
                    int kept = 0;
                    while (kept < ks[s] && o[kept] == drafts[(size_t)s * K + kept]) kept++;
                    if (ks[s]) rp_spec_track_round(&tr[s], kept), seq_rounds++;
                    seq_steps++;
                    /* kept drafts unlike the target's own tokens: 0 unless a row depends on the
                     * rest of its step; the token after them is the target's, and the path goes on
                     * from it (the reference follows) */
                    for (int j = 0; j <= kept && made[s] + j < L; j++) {
                        unlike += j < kept && o[j] != ref[(size_t)s * L + made[s] + j];
                        ref[(size_t)s * L + made[s] + j] = o[j];
                    }
                    seqs[s].len += kept + 1;
                    seqs[s].last = o[kept];
                    made[s] += kept + 1;
                    drafted += ks[s], kept_total += kept, emitted += kept + 1;
                }
                /* the draft's K/V past the kept tokens were rejected drafts' */
                if (draft && draft->seqs[s].len > seqs[s].len) draft->seqs[s].len = seqs[s].len;
                if (made[s] < least) least = made[s];
            }
        }
        const double ms = wall / rounds, tps = emitted / (wall * 1e-3), plain = B / (plain_ms * 1e-3);
        /* host ms: a step's wall time past its device time (the round trip: reading the tokens,
         * accepting, building and launching the next), where the backend times the device */
        printf("%5d  %6.2f %6.1f%% %9.3f %9.3f %9.3f %11.2f %10.1f %8.2fx %7ld %8.1f%% %8.3f\n", B, rates[a],
               drafted ? 100.0 * kept_total / drafted : 0.0, ms, dwall / rounds, (ms - dwall / rounds) / plain_ms,
               (double)emitted / rounds / B, tps, tps / plain, unlike,
               seq_steps ? 100.0 * seq_rounds / seq_steps : 0.0, gpu > 0 ? (wall - dwall - gpu) / rounds : 0.0);
        fflush(stdout);
    }
    rc = RP_OK;
done:
    free(ref);
    free(drafts);
    free(guess);
    free(out);
    free(made);
    free(ks);
    free(tr);
    return rc;
}

static int bench_decode(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    int batches[MAX_BATCHES] = {1, 8, 32, 128}, nb = 4, no_eager = 0, no_overlap = 0;
    long ctx = 512, steps = 64, warmup = 8, page_size = 16;
    double temperature = 0, top_p = 1, interval = RP_BENCH_PROGRESS_INTERVAL;
    long spec_k = 0;
    const char *draft_dummy = NULL, *draft_dir = NULL;
    int spec_always = 0, fp8_blocks = 0;
    double rates[MAX_RATES] = {0, 0.5, 0.7, 0.9, 1};
    int nr = 5;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'b':
            if ((nb = rp_bench_parse_list(optarg, batches, MAX_BATCHES)) <= 0)
                return rp_cli_usage_error(CMD, "--batch takes comma-separated sizes from 1 to 1024, got '%s'", optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &ctx))
                return rp_cli_usage_error(CMD, "--ctx must be an integer from 1 to %d, got '%s'", 1 << 20, optarg);
            break;
        case 's':
            if (rp_parse_int(optarg, 1, 100000, &steps))
                return rp_cli_usage_error(CMD, "--steps must be an integer from 1 to 100000, got '%s'", optarg);
            break;
        case 'w':
            if (rp_parse_int(optarg, 0, 100000, &warmup))
                return rp_cli_usage_error(CMD, "--warmup must be an integer from 0 to 100000, got '%s'", optarg);
            break;
        case 'g':
            if (rp_parse_int(optarg, 1, 4096, &page_size))
                return rp_cli_usage_error(CMD, "--page-size must be an integer from 1 to 4096, got '%s'", optarg);
            break;
        case 'E': no_eager = 1; break;
        case 'O': no_overlap = 1; break;
        case 'T':
            if (rp_parse_float(optarg, &temperature) || temperature < 0 || temperature > 100)
                return rp_cli_usage_error(CMD, "--temperature must be a number from 0 to 100, got '%s'", optarg);
            break;
        case 'P':
            if (rp_parse_float(optarg, &top_p) || top_p <= 0 || top_p > 1)
                return rp_cli_usage_error(CMD, "--top-p must be in (0, 1], got '%s'", optarg);
            break;
        case 'i':
            if (rp_bench_parse_interval(optarg, &interval, CMD)) return RP_EXIT_USAGE;
            break;
        case 'K':
            if (rp_parse_int(optarg, 1, 8, &spec_k))
                return rp_cli_usage_error(CMD, "--speculative-tokens must be an integer from 1 to 8, got '%s'", optarg);
            break;
        case 'D': draft_dummy = optarg; break;
        case 'Y': spec_always = 1; break;
        case 'B': fp8_blocks = 1; break;
        case 'M': draft_dir = optarg; break;
        case 'A':
            if ((nr = parse_rates(optarg, rates)) < 0)
                return rp_cli_usage_error(CMD, "--acceptance takes up to %d comma-separated rates in [0, 1], got '%s'",
                                          MAX_RATES, optarg);
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    if (spec_always && !spec_k) return rp_cli_usage_error(CMD, "--speculative-always needs --speculative-tokens K");
    if ((draft_dummy || draft_dir) && !spec_k)
        return rp_cli_usage_error(CMD, "a draft model times speculative rounds: give --speculative-tokens K");
    if (draft_dummy && draft_dir)
        return rp_cli_usage_error(CMD, "give one of --speculative-model and --speculative-dummy-weights");
    if (spec_k && temperature > 0)
        return rp_cli_usage_error(CMD, "--speculative-tokens times greedy rounds: leave --temperature at 0");
    if (spec_k > warmup + steps)
        return rp_cli_usage_error(CMD, "--speculative-tokens %ld needs --warmup plus --steps of at least as many",
                                  spec_k);
    /* every sequence grows by the warm-up steps and twice the timed ones
     * (graph, then eager from the same start) past --ctx */
    const int total_len = (int)(ctx + warmup + 2 * steps + 1);
    if (total_len > mo.cfg.max_position_embeddings)
        return rp_cli_usage_error(CMD, "--ctx %ld plus %ld steps (--warmup %ld, twice --steps %ld) is %d tokens, more "
                                       "than the model's context of %d",
                                  ctx, warmup + 2 * steps, warmup, steps, total_len,
                                  mo.cfg.max_position_embeddings);

    const char *dev = rp_cli_device(&mo);
    int maxB = 0;
    long prefill_tokens = 0;
    for (int i = 0; i < nb; i++) {
        maxB = batches[i] > maxB ? batches[i] : maxB;
        prefill_tokens += batches[i] * ctx;
    }
    /* the CPU backend has no graphs: one mode per batch size */
    if (!strcmp(dev, "cpu")) rp_bench_warn_cpu(&mo.cfg, mo.threads, (double)nb * (warmup + steps), (double)prefill_tokens, CMD);
    double read_gbs = 0, copy_gbs = 0;
#ifdef REPLAY_HAVE_CUDA
    if (!strcmp(dev, "cuda") && rp_cuda_read_bandwidth(0, &read_gbs, &copy_gbs) != 0)
        rp_log_warn("could not measure the read bandwidth");
#endif
    int pages_per_seq = (total_len + (int)page_size - 1) / (int)page_size;
    if (fp8_blocks && mo.quantize_fp8)
        return rp_cli_usage_error(CMD, "give one of --fp8-blocks and --quantization fp8");
    rp_runner_config rcfg;
    rp_cli_runner_config(&mo, &rcfg);
    if (fp8_blocks) rcfg.quantize_fp8 = RP_FP8_BLOCKS;
    rcfg.page_size = (int)page_size;
    rcfg.num_pages = pages_per_seq * maxB;
    rcfg.max_seqs = maxB;
    rcfg.max_context = total_len;
    rcfg.max_batched_tokens = 8192;
    rcfg.num_cuda_graph_bs = nb;
    memcpy(rcfg.cuda_graph_bs, batches, (size_t)nb * sizeof(int));
    if (spec_k) { /* a verify step: B (k + 1) one-token sequences, each with logits, in a graph of its own */
        rcfg.max_logit_rows = rcfg.max_seqs = maxB * (int)(spec_k + 1);
        for (int i = 0; i < nb && rcfg.num_cuda_graph_bs < 64; i++) {
            int have = 0, v = batches[i] * (int)(spec_k + 1);
            for (int j = 0; j < rcfg.num_cuda_graph_bs; j++) have |= rcfg.cuda_graph_bs[j] == v;
            if (!have) rcfg.cuda_graph_bs[rcfg.num_cuda_graph_bs++] = v;
        }
    }
    /* tensor parallelism: events around the collectives of eager steps (rank 0's), their time
     * printed under the eager row; graph steps carry no events */
    const int tp = mo.tp_size > 1 ? mo.tp_size : 1;
    rcfg.profile = tp > 1 && !strcmp(dev, "cuda");
    if (rp_cli_is_worker(&mo)) return rp_cli_runner_worker(&mo, &rcfg, CMD);
    rp_runner *run = rp_cli_runner_new(&mo, &rcfg, CMD);
    if (!run) return RP_EXIT_RUNTIME;
    const rp_model *model = run->model;
    const rp_model_config *c = &model->cfg;
    rp_backend *be = run->backend;
    int rc = RP_EXIT_RUNTIME;
    rp_err err;
    rp_progress_status prog = {0};
    if (total_len > run->max_context) { /* checked above against the config; a safety net */
        rp_runner_free(run);
        return rp_cli_runtime_error(CMD, "--ctx %ld plus %ld steps exceeds the model's context of %d", ctx,
                                    warmup + 2 * steps, run->max_context);
    }
    rp_runner_seq *seqs = calloc((size_t)maxB, sizeof *seqs);
    /* per-step times of the warm-up steps, then of the timed ones */
    const size_t n_times = (size_t)(steps > warmup ? steps : warmup);
    double *wall = malloc(n_times * sizeof *wall), *gpu = malloc(n_times * sizeof *gpu);
    if (!seqs || !wall || !gpu) {
        rp_errf(&err, "out of memory");
        goto fail;
    }

    /* Bytes a decode step must read: every weight once (the embedding table
     * only when it doubles as lm_head), plus the KV cache of each sequence. */
    uint64_t embed_bytes = (uint64_t)c->vocab_size * c->hidden_size * 2;
    uint64_t weight_read = model->weight_bytes - (c->tie_word_embeddings ? 0 : embed_bytes);
    uint64_t kv_per_token = rp_kv_page_bytes(c, 1, run->kv_dtype); /* e4m3 K/V: half */

    printf("replay bench decode: %s (%s), %.2f GB of weights, ctx %ld, page %ld, device %s\n",
           mo.dummy_name ? mo.dummy_name : mo.model_dir, c->arch_name, (double)weight_read / 1e9, ctx, page_size,
           dev);
    if (read_gbs > 0)
        printf("measured bandwidth: read %.0f GB/s, device copy %.0f GB/s (read+write)\n", read_gbs, copy_gbs);
    if (tp > 1) printf("tensor parallel over %d: GB/s and %%read are per GPU (MB/step / %d)\n", tp, tp);
    const int overlap = !no_overlap && rp_runner_can_overlap(run);
    rp_sampling_params sp = {.temperature = (float)temperature, .top_p = (float)top_p};
    if (temperature > 0)
        printf("sampling: temperature %g, top-p %g (seeded per sequence)\n", temperature, top_p);
    else
        printf("sampling: greedy\n");
    printf("steps: %s\n", overlap ? "overlapped as in the engine (step N + 1 launched before step N's tokens are read)"
                                  : "one at a time (each step's tokens read before the next is launched)");
    printf("\n%5s  %-6s %9s %10s %11s %9s %7s %9s %9s %11s\n", "batch", "mode", "ms/step", "tok/s", "MB/step",
           "GB/s", "%read", "gpu ms", "gap ms", "prefill t/s");
    fflush(stdout);
    /* the progress line counts decode steps, warm-up included, over every batch size and mode */
    const int modes = be->ops->set_graphs && !no_eager ? 2 : 1;
    double plain_ms[MAX_BATCHES] = {0}; /* each batch's step, graph replay where the backend has graphs */
    rp_progress_status_start(&prog, CMD, "steps", (uint64_t)(nb * modes * (warmup + steps)), interval);
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        if (rp_runner_seqs_begin(run, seqs, B, &err)) goto fail;
        double prefill_s = 0;
        rp_progress_status_phase(&prog, "batch %d: prefill of %d x %ld tokens", B, B, ctx);
        if (rp_runner_prefill_random(run, seqs, B, (int)ctx, &prefill_s, &err)) goto fail;
        for (int mode = 0; mode < 2; mode++) {
            int graphs = mode == 0;
            if (!graphs && no_eager) break;
            if (be->ops->set_graphs) be->ops->set_graphs(be, graphs);
            else if (graphs) continue; /* no graphs on this backend: eager only */
            rp_progress_status_phase(&prog, "batch %d, %s", B, graphs ? "graph" : "eager");
            for (int s = 0; s < B; s++) seqs[s].len = (int)ctx; /* rewind: KV past ctx is rewritten */
            if (warmup && rp_runner_decode_steps(run, seqs, B, (int)warmup, &sp, wall, gpu, &err)) goto fail;
            rp_progress_status_add(&prog, (uint64_t)warmup, (uint64_t)(B * warmup));
            if (overlap ? rp_runner_decode_overlapped(run, seqs, B, (int)steps, &sp, wall, gpu, &err)
                        : rp_runner_decode_steps(run, seqs, B, (int)steps, &sp, wall, gpu, &err))
                goto fail;
            rp_progress_status_add(&prog, (uint64_t)steps, (uint64_t)(B * steps));
            double w = rp_bench_median(wall, (int)steps), g = rp_bench_median(gpu, (int)steps);
            if (!plain_ms[bi]) plain_ms[bi] = w;
            double avg_ctx = (double)ctx + warmup + steps / 2.0;
            double bytes = (double)weight_read + (double)B * avg_ctx * (double)kv_per_token;
            double gbs = bytes / tp / (w * 1e-3) / 1e9;
            rp_progress_status_lock(&prog);
            printf("%5d  %-6s %9.3f %10.1f %11.1f %9.0f %6.1f%% %9.3f %9.3f %11.0f\n", B, graphs ? "graph" : "eager",
                   w, B / (w * 1e-3), bytes / 1e6, gbs, read_gbs > 0 ? 100.0 * gbs / read_gbs : 0.0, g,
                   g > 0 ? w - g : 0.0, (double)B * ctx / prefill_s);
            if (!graphs && rcfg.profile && be->ops->profile) { /* the last eager step's collectives */
                rp_profile_entry ent[4096];
                int n = be->ops->profile(be, ent, 4096);
                double coll = 0, all = 0;
                int one_kernel = 0;
                for (int i = 0; i < n; i++) {
                    all += ent[i].ms;
                    if (rp_bench_is_collective(ent[i].name)) coll += ent[i].ms;
                    if (!one_kernel) one_kernel = rp_bench_is_one_kernel_step(ent[i].name);
                }
                printf("%5s  %-6s %s %.3f ms of the step's %.3f ms (rank 0's events)\n", "", "",
                       one_kernel == 2 ? "sums and greedy pick inside the one-kernel step; logit gather"
                       : one_kernel    ? "sums inside the one-kernel step; logit gather"
                                       : "all-reduces + logit gather",
                       coll, all);
            }
            fflush(stdout);
            rp_progress_status_unlock(&prog);
        }
        rp_runner_seqs_end(run, seqs, B);
    }
    rp_progress_status_stop(&prog);
    if (spec_k) {
        printf("\nspeculative rounds, oracle drafts (k %ld), greedy, one at a time, graphs where the backend has them:\n",
               spec_k);
        if (be->ops->set_graphs) be->ops->set_graphs(be, 1);
        int32_t *last0 = malloc((size_t)maxB * sizeof *last0);
        if (!last0) {
            rp_errf(&err, "out of memory");
            goto fail;
        }
        /* a draft model beside the target: as many pages, its own graphs for the same batch sizes */
        bench_draft bd = {0}, *draft = NULL;
        if (draft_dummy || draft_dir) {
            rp_runner_config dc = rcfg;
            dc.model = NULL;
            dc.model_dir = draft_dir;
            dc.dummy_name = draft_dummy;
            dc.load_dummy = rcfg.load_dummy;
            dc.weight_seed = rcfg.weight_seed; /* the same shape is the target itself: a self-draft */
            /* the engine's draft runner: catch-ups of up to 4 positions a sequence, default buckets */
            dc.max_logit_rows = dc.max_seqs = 4 * maxB;
            dc.num_cuda_graph_bs = 0;
            dc.cuda_graph_max_bs = 4 * maxB;
            dc.tuning = (rp_tuning){0};
            bd.run = rp_runner_new(&dc, &err);
            bd.seqs = calloc((size_t)maxB, sizeof *bd.seqs);
            bd.tok = calloc((size_t)(4 * maxB), sizeof *bd.tok); /* a catch-up step's rows */
            bd.max_fed = (int)(steps + spec_k + 2); /* a sequence that stopped drafting catches up in one go */
            bd.fed = calloc((size_t)bd.max_fed, sizeof *bd.fed);
            bd.last_row = calloc((size_t)maxB, sizeof *bd.last_row);
            if (bd.run && bd.run->model->cfg.vocab_size != c->vocab_size)
                rp_errf(&err, "the draft model's vocabulary has %d tokens, the target's %d",
                        bd.run->model->cfg.vocab_size, c->vocab_size);
            else if (bd.run && bd.seqs && bd.tok && bd.fed && bd.last_row)
                draft = &bd;
            else if (bd.run)
                rp_errf(&err, "out of memory");
            if (!draft) {
                rp_runner_free(bd.run);
                free(bd.seqs);
                free(bd.tok);
                free(bd.fed);
                free(bd.last_row);
                free(last0);
                goto fail;
            }
            const rp_model_config *dcfg = &bd.run->model->cfg;
            printf("draft model: %s (%s), %.2f GB of weights; its steps are timed into each round\n",
                   draft_dummy ? draft_dummy : draft_dir, dcfg->arch_name, (double)bd.run->model->weight_bytes / 1e9);
            if (bd.run->backend->ops->set_graphs) bd.run->backend->ops->set_graphs(bd.run->backend, 1);
        }
        printf("%5s  %6s %7s %9s %9s %9s %11s %10s %9s %7s %9s %8s\n", "batch", "rate", "kept", "ms/round", "draft ms",
               "x step", "tokens/seq", "tok/s", "x plain", "unlike", "drafting", "host ms");
        int bi = 0;
        for (; bi < nb; bi++) {
            const int B = batches[bi];
            double prefill_s;
            int r = rp_runner_seqs_begin(run, seqs, B, &err) || rp_runner_prefill_random(run, seqs, B, (int)ctx, &prefill_s, &err);
            for (int s = 0; s < B && !r; s++) last0[s] = seqs[s].last;
            if (!r && draft)
                r = rp_runner_seqs_begin(draft->run, draft->seqs, B, &err) ||
                    rp_runner_prefill_random(draft->run, draft->seqs, B, (int)ctx, &prefill_s, &err);
            if (!r) r = bench_speculative(run, seqs, last0, B, (int)ctx, (int)spec_k, (int)steps, rates, nr,
                                          plain_ms[bi], draft, spec_always, &err);
            rp_runner_seqs_end(run, seqs, B);
            if (draft) rp_runner_seqs_end(draft->run, draft->seqs, B);
            if (r) break;
        }
        free(last0);
        if (draft) {
            rp_runner_free(bd.run);
            free(bd.seqs);
            free(bd.tok);
            free(bd.fed);
            free(bd.last_row);
        }
        if (bi < nb) goto fail;
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
    rp_progress_status_stop(&prog);
    rc = rp_cli_runtime_error(CMD, "%s", err.msg);
out:
    free(seqs);
    free(wall);
    free(gpu);
    rp_runner_free(run);
    return rc;
}


/* ---- bench offline ------------------------------------------------------ */

/* One conversation (a single request when the workload has one turn). Its
 * history, kept for a multi-turn workload only, is the last prompt and the
 * answer the engine thread appends to it; the next turn's prompt is that
 * and its new tokens. */
typedef struct offline_conv {
    long index;
    int turn;   /* the turn in flight */
    int32_t *history;
    int len;    /* tokens in history: the prompt of the turn in flight, then its answer so far */
    int failed; /* a turn ended with an error or an abort: no more turns */
} offline_conv;

/* What the engine thread hands the submitting thread: conversations whose
 * turn has finished, in order. */
typedef struct offline_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long *done; /* a ring of num_prompts */
    long head, count, cap;
} offline_queue;

typedef struct offline_req {
    offline_conv *conv;
    offline_queue *queue;
    int prompt_len, generated, cached_tokens, turn;
    uint64_t digest; /* of the tokens generated (FNV-1a): runs that should agree compare these */
    double t_submit, t_first, t_last;
    rp_finish finish;
    rp_progress_status *prog;
} offline_req;

/* On the engine thread, one per token. It never blocks on the submitting
 * thread: the queue's lock is held only to push. */
static void offline_event(void *user, const rp_token_event *ev) {
    offline_req *r = user;
    offline_conv *c = r->conv;
    if (ev->token >= 0) {
        double now = rp_now_s();
        if (r->generated++ == 0) r->t_first = now, r->digest = 1469598103934665603ULL;
        r->digest = (r->digest ^ (uint64_t)(uint32_t)ev->token) * 1099511628211ULL;
        r->t_last = now;
        if (c->history) c->history[c->len++] = ev->token; /* room: sized for the longest request */
    }
    rp_progress_status_add(r->prog, ev->finish != RP_FINISH_REASON_NONE, ev->token >= 0);
    if (ev->finish == RP_FINISH_REASON_NONE) return;
    r->finish = ev->finish;
    r->cached_tokens = ev->cached_tokens;
    c->failed = ev->finish == RP_FINISH_REASON_ERROR || ev->finish == RP_FINISH_REASON_ABORT;
    offline_queue *q = r->queue;
    pthread_mutex_lock(&q->mu);
    q->done[(q->head + q->count++) % q->cap] = c->index;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static long offline_next_done(offline_queue *q) {
    pthread_mutex_lock(&q->mu);
    while (q->count == 0) pthread_cond_wait(&q->cv, &q->mu);
    long c = q->done[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    pthread_mutex_unlock(&q->mu);
    return c;
}

static void offline_help(FILE *f) {
    fprintf(f,
            "Usage: replay bench offline (--model DIR | --dummy-weights NAME) [OPTIONS]\n"
            "\n"
            "Offline throughput: all prompts submitted at once to the engine (continuous batching),\n"
            "random token prompts, EOS ignored. Prints throughput, latency, KV use and the prefix cache's\n"
            "hit rate, and the workload's lower bound on time from the matrix rate and read bandwidth\n"
            "measured here. The longest request (--input-len and --output-len, stretched by\n"
            "--random-range-ratio or 8x with --length-distribution lognormal, after --shared-prefix-len\n"
            "and earlier turns) must fit the context: --max-model-len, the model's, or the KV cache of\n"
            "--num-pages. --disable-prefix-caching runs the same workload without the cache.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Workload:\n"
            "  --num-prompts N          requests, or conversations with --multi-turn (default 200)\n"
            "  --input-len L            prompt tokens (default 512)\n"
            "  --output-len M           output tokens (default 512)\n"
            RP_BENCH_RANGE_RATIO_HELP
            RP_BENCH_WORKLOAD_HELP
            "  --seed N                 workload seed (default 0)\n"
            "\n"
            "Structured output: with one of these every request is constrained (the cost of the masks;\n"
            "random weights need a bounded language: compact whitespace, bounded strings):\n"
            RP_STRUCTURED_OPTIONS_HELP
            "  --tokenizer DIR        the tokenizer a constraint needs, from DIR (default: the model's)\n"
            "  --host-token-masks     apply the masks on the host, each constrained step's logits read\n"
            "                         back (default: sent to the backend, computed while its step runs)\n"
            "\n");
    rp_engine_opts_help(f);
    fprintf(f, "\n");
    rp_spec_opts_help(f);
    fprintf(f, "\n");
    rp_bench_output_help(f, RP_BENCH_PROGRESS_HELP);
}

/* bench offline's own option without a letter (next to the structured ones) */
enum { OPT_HOST_TOKEN_MASKS = RP_STRUCTURED_OPT_LAST + 8 };

static const struct option offline_options[] = {
    RP_MODEL_LONG_OPTIONS,
    RP_STRUCTURED_LONG_OPTIONS,
    {"tokenizer", required_argument, 0, 'T'},
    {"host-token-masks", no_argument, 0, OPT_HOST_TOKEN_MASKS},
    {"num-prompts", required_argument, 0, 'n'},
    {"input-len", required_argument, 0, 'i'},
    {"output-len", required_argument, 0, 'o'},
    {"random-range-ratio", required_argument, 0, 'r'},
    {"seed", required_argument, 0, 's'},
    {"progress-interval", required_argument, 0, 'p'},
    RP_BENCH_WORKLOAD_LONG_OPTIONS,
    RP_ENGINE_LONG_OPTIONS,
    RP_SPEC_LONG_OPTIONS,
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

/* The longest request must fit the context the engine will have, or the
 * engine turns it away mid-run: --max-model-len (at most the model's), the
 * model's, and no more than the KV cache when --num-pages sizes it. */
static int offline_check_context(const rp_model_opts *mo, const rp_engine_config *ec, const rp_bench_workload *w,
                                 const char *cmd) {
    const int model_ctx = mo->cfg.max_position_embeddings;
    if (ec->max_context > model_ctx)
        return rp_cli_usage_error(cmd, "--max-model-len %d is more than the model's context of %d", ec->max_context,
                                  model_ctx);
    long limit = ec->max_context > 0 ? ec->max_context : model_ctx;
    const char *what = ec->max_context > 0 ? "--max-model-len" : "the model's context";
    const long kv = (long)ec->num_pages * ec->page_size;
    if (ec->num_pages > 0 && kv < limit) {
        limit = kv;
        what = "the KV cache (--num-pages x --page-size)";
    }
    const long L = rp_bench_workload_max_prompt(w), M = rp_bench_workload_max_output(w);
    if (L + M > limit) {
        char stretched[160] = "";
        const int lognormal = w->length_dist == RP_BENCH_LEN_LOGNORMAL;
        const char *spread = w->range > 0 ? " and --random-range-ratio"
                             : lognormal  ? " and --length-distribution lognormal"
                                          : "";
        if (w->shared_prefix_len > 0 || w->turns > 1)
            snprintf(stretched, sizeof stretched, " (a prompt of up to %ld tokens with --shared-prefix-len %ld, "
                                                  "--multi-turn %ld%s)",
                     L, w->shared_prefix_len, w->turns, spread);
        else if (w->range > 0)
            snprintf(stretched, sizeof stretched, " (%ld + %ld with --random-range-ratio %g)", L, M, w->range);
        else if (lognormal)
            snprintf(stretched, sizeof stretched,
                     " (up to %ld + %ld with --length-distribution lognormal, %dx the means)", L, M,
                     RP_BENCH_LOGNORMAL_CAP);
        return rp_cli_usage_error(cmd, "--input-len %ld plus --output-len %ld%s is more than %s: %ld tokens",
                                  w->input_len, w->output_len, stretched, what, limit);
    }
    return 0;
}

/* Submits the next turn of conversation c: its history (the last prompt
 * and its answer) and the turn's new tokens. */
static int offline_submit(rp_engine *eng, const rp_bench_workload *w, const rp_constraint *constraint,
                          offline_conv *c, offline_req *r, int32_t *scratch, int vocab, rp_error *err) {
    int32_t *prompt = c->history ? c->history : scratch;
    if (!c->history) c->len = 0;
    c->len += rp_bench_workload_new_tokens(w, c->index, c->turn, vocab, prompt + c->len);
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt_ids = prompt;
    p.num_prompt_ids = c->len;
    p.max_tokens = rp_bench_workload_output(w, c->index, c->turn);
    p.ignore_eos = 1;
    p.temperature = 0;
    p.constraint = *constraint;
    r->conv = c;
    r->turn = c->turn;
    r->prompt_len = c->len;
    r->t_submit = rp_now_s();
    return rp_engine_submit(eng, &p, offline_event, r, NULL, err);
}

/* Where the steps went: per kind, how many, how many replayed a graph, their
 * mean size and device time, and the device's busy share of the run (the
 * rest is the device waiting for the host). */
static void print_step_kinds(const rp_engine_stats *st, double elapsed) {
    static const char *names[RP_STEP_KINDS] = {"decode", "mixed", "prefill"};
    double gpu_ms = 0;
    printf("  %-12s %8s %8s %12s %12s %12s %10s\n", "steps", "count", "graphs", "tokens/step", "prompt/step",
           "device ms", "device s");
    for (int k = 0; k < RP_STEP_KINDS; k++) {
        const rp_step_kind_stats *ks = &st->kinds[k];
        const double n = ks->steps ? (double)ks->steps : 1;
        gpu_ms += ks->gpu_ms;
        printf("  %-12s %8llu %8llu %12.1f %12.1f %12.2f %10.2f\n", names[k], (unsigned long long)ks->steps,
               (unsigned long long)ks->graph_replays, (double)ks->tokens / n, (double)ks->prompt_tokens / n,
               ks->gpu_ms / n, ks->gpu_ms / 1e3);
    }
    if (gpu_ms > 0) printf("  %-34s %11.1f%%\n", "device busy (forwards' time / time)", 100.0 * gpu_ms / 1e3 / elapsed);
}

static int bench_offline_with(int argc, char **argv, rp_structured_opts *so) {
    const char *cmd = "bench offline";
    const char *tokenizer_dir = NULL;
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    double interval = RP_BENCH_PROGRESS_INTERVAL;
    /* the random workload's streams as they have always been: results stay comparable */
    rp_bench_workload w = {.num_prompts = 200, .input_len = 512, .output_len = 512, .num_groups = 1, .turns = 1,
                           .in_stream = 1, .out_stream = 2, .token_stream = 3};
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", offline_options, &mo, NULL, cmd)) != RP_OPT_END) {
        long *dst = NULL;
        long lo = 1, hi = 1 << 24;
        switch (opt) {
        case 'h': offline_help(stdout); return RP_EXIT_OK;
        case 'n': dst = &w.num_prompts; break;
        case 'i': dst = &w.input_len; break;
        case 'o': dst = &w.output_len; break;
        case 'r':
            if (rp_bench_parse_range_ratio(optarg, &w.range, cmd)) return RP_EXIT_USAGE;
            break;
        case 'p':
            if (rp_bench_parse_interval(optarg, &interval, cmd)) return RP_EXIT_USAGE;
            break;
        case 's':
            if (rp_parse_u64(optarg, &w.seed)) return rp_cli_usage_error(cmd, "--seed must be a non-negative integer");
            break;
        case 'T': tokenizer_dir = optarg; break;
        case OPT_HOST_TOKEN_MASKS: ec.disable_device_masks = 1; break;
        default: {
            if (opt >= RP_STRUCTURED_OPT_FIRST && opt <= RP_STRUCTURED_OPT_LAST) {
                if (rp_structured_opts_parse(so, opt, optarg, cmd)) return RP_EXIT_USAGE; /* reported */
                break;
            }
            int r = rp_bench_workload_parse(&w, opt, optarg, cmd);
            if (r == 0) r = rp_engine_opts_parse(&ec, opt, optarg, cmd);
            if (r != 1) return RP_EXIT_USAGE; /* reported */
        }
        }
        if (dst && rp_parse_int(optarg, lo, hi, dst))
            return rp_cli_usage_error(cmd, "%s must be an integer from %ld to %ld, got '%s'", argv[optind - 1], lo, hi,
                                      optarg);
    }
    if (optind < argc) return rp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (rp_bench_workload_check(&w, cmd) || rp_spec_opts_check(&ec, cmd)) return RP_EXIT_USAGE;
    int bad_model = rp_model_opts_check(&mo, cmd);
    if (bad_model) return bad_model;
    if (offline_check_context(&mo, &ec, &w, cmd)) return RP_EXIT_USAGE;
    if (tokenizer_dir && (bad_model = rp_cli_check_dir_file("--tokenizer", tokenizer_dir, "tokenizer.json", cmd)))
        return bad_model;
    if ((bad_model = rp_structured_opts_check(so, cmd))) return bad_model;
    if (so->flag && !rp_cli_tokenizer_dir(&mo, tokenizer_dir))
        return rp_cli_usage_error(cmd, "%s needs a tokenizer (--tokenizer DIR, or a model directory with one)",
                                  so->flag);
    ec.tokenizer_dir = tokenizer_dir;
    const long num = w.num_prompts, total_reqs = rp_bench_workload_requests(&w);
    const char *dev = rp_cli_device(&mo);
    if (!strcmp(dev, "cpu")) { /* about requests x output / (requests at once) decode steps */
        const long most = ec.max_running_requests; /* 0: derived from the pool, not known yet */
        const long at_once = most > 0 && most < num ? most : num;
        rp_bench_warn_cpu(&mo.cfg, mo.threads, (double)total_reqs * w.output_len / at_once,
                          rp_bench_workload_prompt_tokens(&w), cmd);
    }
    double read_gbs = 0, tflops = 0;
#ifdef REPLAY_HAVE_CUDA
    double copy_gbs = 0;
    if (!strcmp(dev, "cuda")) {
        if (rp_cuda_read_bandwidth(0, &read_gbs, &copy_gbs)) rp_log_warn("could not measure the read bandwidth");
        if (rp_cuda_matmul_tflops(0, &tflops)) rp_log_warn("could not measure the matrix rate");
        /* tensor parallelism: the workload runs on every GPU of the group at
         * once, each with its share of the weights and the FLOPs; their
         * ceilings add up (GPU 0's, times the ranks: GPUs of one kind) */
        const int ranks = mo.tp_size > 1 ? mo.tp_size : 1;
        read_gbs *= ranks;
        tflops *= ranks;
    }
#endif
    rp_cli_engine_model(&mo, &ec);
    rp_error eerr;
    if (rp_cli_is_worker(&mo)) return rp_cli_engine_worker(&ec, cmd);
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) return rp_cli_runtime_error(cmd, "%s", eerr.message);
    int vocab = rp_engine_vocab_size(eng), rc = RP_EXIT_RUNTIME;
    const long room = rp_bench_workload_max_prompt(&w) + rp_bench_workload_max_output(&w);
    offline_req *reqs = calloc((size_t)total_reqs, sizeof *reqs);
    offline_conv *convs = calloc((size_t)num, sizeof *convs);
    int32_t *scratch = malloc((size_t)room * sizeof *scratch);
    offline_queue queue = {.done = malloc((size_t)num * sizeof(long)), .cap = num};
    pthread_mutex_init(&queue.mu, NULL);
    pthread_cond_init(&queue.cv, NULL);
    long total_in = 0, total_out_planned = 0, min_in = LONG_MAX, max_in = 0, min_out = LONG_MAX, max_out = 0;
    long submitted = 0;
    rp_progress_status prog = {0};
    if (!reqs || !convs || !scratch || !queue.done) {
        rc = rp_cli_runtime_error(cmd, "out of memory");
        goto out;
    }
    rp_progress_status_start(&prog, cmd, "requests", (uint64_t)total_reqs, interval);
    double t0 = rp_now_s();
    /* every conversation's first turn at once, the engine held until all are
     * in (the same workload batches alike from run to run: its outputs
     * digest compares runs); a later turn as soon as the one before has
     * finished */
    rp_engine_hold(eng, 1);
    for (long i = 0, left = num; left > 0; i++) {
        offline_conv *c;
        if (i == num) rp_engine_hold(eng, 0);
        if (i < num) {
            c = &convs[i];
            c->index = i;
            /* the history of a multi-turn conversation: up to the longest prompt and its answer */
            if (w.turns > 1 && !(c->history = malloc((size_t)room * sizeof *c->history))) {
                rc = rp_cli_runtime_error(cmd, "out of memory");
                goto out;
            }
        } else {
            c = &convs[offline_next_done(&queue)];
            if (c->failed || c->turn + 1 == w.turns) {
                free(c->history);
                c->history = NULL;
                left--;
                continue;
            }
            c->turn++;
        }
        offline_req *r = &reqs[c->turn * num + c->index];
        r->queue = &queue;
        r->prog = &prog;
        if (offline_submit(eng, &w, &so->constraint, c, r, scratch, vocab, &eerr)) {
            rc = rp_cli_runtime_error(cmd, "request %ld: %s", c->turn * num + c->index, eerr.message);
            goto out;
        }
        submitted++;
        const long L = r->prompt_len, M = rp_bench_workload_output(&w, c->index, c->turn);
        total_in += L;
        total_out_planned += M;
        min_in = L < min_in ? L : min_in;
        max_in = L > max_in ? L : max_in;
        min_out = M < min_out ? M : min_out;
        max_out = M > max_out ? M : max_out;
    }
    rp_engine_wait_idle(eng);
    double elapsed = rp_now_s() - t0;
    rp_progress_status_stop(&prog);
    rp_engine_stats st;
    rp_engine_get_stats(eng, &st);
    long total_out = 0, later_n = 0;
    uint64_t digest = 1469598103934665603ULL;
    double tpot_sum = 0, ttft_sum = 0, ttft_later_sum = 0;
    int tpot_n = 0;
    for (long i = 0; i < total_reqs; i++) {
        const offline_req *r = &reqs[i];
        if (!r->conv) continue; /* a turn never sent: its conversation failed */
        total_out += r->generated;
        digest = (digest ^ r->digest) * 1099511628211ULL; /* in request order: finishing order does not matter */
        ttft_sum += r->t_first - r->t_submit;
        if (r->turn > 0) ttft_later_sum += r->t_first - r->t_submit, later_n++;
        if (r->generated > 1) {
            tpot_sum += (r->t_last - r->t_first) / (r->generated - 1);
            tpot_n++;
        }
    }
    char wl[128];
    rp_bench_workload_describe(&w, wl, sizeof wl);
    char ratio[40] = ""; /* lognormal: wl says how the lengths spread */
    if (w.length_dist == RP_BENCH_LEN_UNIFORM) snprintf(ratio, sizeof ratio, ", range ratio %.2f", w.range);
    printf("replay bench offline: %s on %s, %ld %s, input %ld, output %ld%s, %s, prefix caching %s\n",
           mo.dummy_name ? mo.dummy_name : mo.model_dir, dev, num, w.turns > 1 ? "conversations" : "prompts",
           w.input_len, w.output_len, ratio, wl, ec.enable_prefix_caching ? "on" : "off");
    char lens[64];
    snprintf(lens, sizeof lens, "%ld / %.1f / %ld", min_in, (double)total_in / submitted, max_in);
    printf("  %-30s %16s\n", "input length min / mean / max", lens);
    snprintf(lens, sizeof lens, "%ld / %.1f / %ld", min_out, (double)total_out_planned / submitted, max_out);
    printf("  %-30s %16s\n", "output length min / mean / max", lens);
    if (so->flag) printf("  %-34s %12s (every request)\n", "structured output", so->flag);
    if (so->flag || st.masked_rows_device + st.masked_rows_host)
        printf("  %-34s %12llu on the backend, %llu on the host%s\n", "masked rows sampled",
               (unsigned long long)st.masked_rows_device, (unsigned long long)st.masked_rows_host,
               ec.disable_device_masks ? " (--host-token-masks)" : "");
    printf("  %-34s %12.2f s\n", "time", elapsed);
    printf("  %-34s %12.2f\n", "requests/s", submitted / elapsed);
    printf("  %-34s %12.1f\n", "input tokens/s", total_in / elapsed);
    printf("  %-34s %12.1f\n", "output tokens/s", total_out / elapsed);
    printf("  %-34s %12.1f\n", "total tokens/s", (total_in + total_out) / elapsed);
    printf("  %-34s %12.2f ms\n", "mean time to first token", 1e3 * ttft_sum / submitted);
    if (later_n) printf("  %-34s %12.2f ms\n", "mean TTFT, turns after the first", 1e3 * ttft_later_sum / later_n);
    printf("  %-34s %12.2f ms\n", "mean time per output token", tpot_n ? 1e3 * tpot_sum / tpot_n : 0.0);
    /* the engine's counters: every admission's lookup, a preempted request's again when it resumes */
    if (ec.enable_prefix_caching)
        printf("  %-34s %11.1f%% (%llu of %llu prompt tokens)\n", "prefix cache hit rate",
               st.prefix_cache_queried_tokens ? 100.0 * st.prefix_cache_hit_tokens / st.prefix_cache_queried_tokens
                                              : 0.0,
               (unsigned long long)st.prefix_cache_hit_tokens, (unsigned long long)st.prefix_cache_queried_tokens);
    else
        printf("  %-34s %11.1f%% (--disable-prefix-caching)\n", "prefix cache hit rate", 0.0);
    if (ec.speculative_method)
        printf("  %-34s %11.1f%% (%llu of %llu drafts; %.2f tokens a round)\n", "speculative acceptance",
               st.spec_draft_tokens ? 100.0 * st.spec_accepted_tokens / st.spec_draft_tokens : 0.0,
               (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
               st.spec_rounds ? 1.0 + (double)st.spec_accepted_tokens / st.spec_rounds : 0.0);
    if (st.spec_draft_forwards)
        printf("  %-34s %12llu (%.3f ms each, host clock, reads included)\n", "draft model forwards",
               (unsigned long long)st.spec_draft_forwards, st.spec_draft_ms / (double)st.spec_draft_forwards);
    printf("  %-34s %12d\n", "peak running requests", st.peak_running);
    printf("  %-34s %12d / %d (%.0f%%)\n", "peak KV pages used", st.kv_pages_peak_used, st.kv_pages_total,
           100.0 * st.kv_pages_peak_used / (st.kv_pages_total ? st.kv_pages_total : 1));
    printf("  %-34s %12d\n", "KV pages cached at the end", st.kv_pages_cached);
    printf("  %-34s %12llu\n", "preemptions", (unsigned long long)st.preemptions);
    printf("  %-34s %12llu (%llu graph replays)\n", "steps", (unsigned long long)st.steps,
           (unsigned long long)st.graph_replays);
    printf("  %-34s %12.3f ms\n", "engine CPU time per step", st.cpu_ms_per_step);
    printf("  %-34s %016llx\n", "outputs digest", (unsigned long long)digest);
    print_step_kinds(&st, elapsed);
    if (submitted != total_reqs) printf("  WARNING: %ld requests planned, %ld sent\n", total_reqs, submitted);
    if (total_out != total_out_planned)
        printf("  WARNING: %ld output tokens planned, %ld made\n", total_out_planned, total_out);
    if (read_gbs > 0 && tflops > 0) {
        /* The workload's floor: prefill FLOPs at the matrix rate, plus decode
         * steps that each read every weight once and every running sequence's
         * KV (or, if more, their FLOPs at the matrix rate), with the batch as
         * large as the engine ran it. Prompt tokens found in the prefix cache
         * are not computed: the prefill is the rest's. Everything is from the
         * lengths drawn; attention's quadratic term takes the mean length
         * squared, which is at most the mean of the squares, so the floor
         * holds (looser) when lengths spread, lognormal ones most. */
        const rp_model_config mc = mo.cfg; /* read by rp_model_opts_check */
        double params = (double)rp_config_num_params(&mc) - (double)mc.vocab_size * mc.hidden_size *
                                                                   (mc.tie_word_embeddings ? 0 : 1);
        double q_dim = (double)mc.num_heads * mc.head_dim;
        double avg_in = (double)total_in / submitted, avg_out = (double)total_out / submitted;
        double hits = (double)st.prefix_cache_hit_tokens; /* a resumed preemption's hits count again */
        if (hits > (double)total_in) hits = (double)total_in;
        double computed = (double)total_in - hits, share = total_in ? computed / (double)total_in : 1;
        double prefill_flops = 2.0 * params * computed + 2.0 * mc.num_layers * q_dim * avg_in * avg_in * submitted *
                                                             share;
        double weight_bytes = params * 2;
        rp_kv_dtype kvd = RP_KV_AUTO;
        rp_err kerr;
        if (rp_kv_dtype_parse(ec.kv_cache_dtype, &kvd, &kerr)) kvd = RP_KV_AUTO; /* checked when parsed */
        double kv_token = (double)rp_kv_page_bytes(&mc, 1, rp_kv_dtype_resolve(kvd, &mc));
        double B = st.peak_running > 0 ? st.peak_running : 1;
        double steps = (double)total_out / B;
        double step_bytes = weight_bytes + B * (avg_in + avg_out / 2) * kv_token;
        double step_flops = 2.0 * params * B + 4.0 * mc.num_layers * q_dim * B * (avg_in + avg_out / 2);
        double t_step = step_bytes / (read_gbs * 1e9);
        if (step_flops / (tflops * 1e12) > t_step) t_step = step_flops / (tflops * 1e12);
        double bound = prefill_flops / (tflops * 1e12) + steps * t_step;
        printf("  %-34s %12.0f TFLOP/s, %.0f GB/s read%s\n", "measured ceilings", tflops, read_gbs,
               mo.tp_size > 1 ? " (GPU 0's times the ranks)" : "");
        printf("  %-34s %12.2f s (prefill %.2f s + %.0f decode steps of %.2f ms at batch %.0f)\n", "lower bound",
               bound, prefill_flops / (tflops * 1e12), steps, t_step * 1e3, B);
        printf("  %-34s %12.1f%%\n", "bound / measured", 100.0 * bound / elapsed);
    }
    rc = RP_EXIT_OK;
out:
    rp_engine_destroy(eng); /* first: after a failed submit, earlier requests still report into reqs */
    rp_progress_status_stop(&prog);
    for (long i = 0; convs && i < num; i++) free(convs[i].history);
    pthread_mutex_destroy(&queue.mu);
    pthread_cond_destroy(&queue.cv);
    free(queue.done);
    free(reqs);
    free(convs);
    free(scratch);
    return rc;
}

static int bench_offline(int argc, char **argv) {
    rp_structured_opts so;
    rp_structured_opts_init(&so);
    const int rc = bench_offline_with(argc, argv, &so);
    rp_structured_opts_free(&so);
    return rc;
}

const rp_cli_command rp_cli_bench_decode = {
    "bench decode", "decode step time, tokens/s and bandwidth per batch size", options, help, bench_decode};
const rp_cli_command rp_cli_bench_offline = {"bench offline",
                                             "throughput of many requests through the engine, against its lower bound",
                                             offline_options, offline_help, bench_offline};
