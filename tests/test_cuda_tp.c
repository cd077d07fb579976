/* Tensor parallelism on the GPU (issue 42, docs/tensor-parallel.md): the
 * tensor-parallel backend over N GPUs (one thread and one NCCL
 * communicator each, the all-reduces and the logit gather inside the
 * captured graphs) against one GPU running the whole model, with the same
 * dummy weights made on the host, and the CPU backend (fp32) as the
 * reference: at every position of prompts of 1, 7 and 1000 tokens, N
 * ranks' logits must be as close to fp32 as one GPU's (relative L2 over the
 * prompt within 1.25x, plus 1e-3; the worst position's within 1.5x, plus
 * 1e-3). Also printed: N ranks against one GPU (the issue's
 * 1e-2) and how long 128 greedy tokens after each prompt stay the same
 * (random weights amplify any change of summation order; bench/RESULTS.md).
 *
 * test_small (qwen3-0.6b's shape; test_small_fp8 the same with e4m3 weights
 * quantized per row), test_qwen3_8b and test_llama3_8b (their
 * full shapes; REPLAY_TP_LAYERS=L cuts their depth), test_llama3_70b (its
 * first 2 layers unless REPLAY_TP_LAYERS says otherwise: the fp32
 * reference runs on the CPU; tools/gpu_compare.py --tp N checks 8 layers
 * against transformers on the GPU). N = 2, and 4
 * where 4 GPUs are visible (REPLAY_TP_SIZES="2,4" picks; REPLAY_TEST_ONLY
 * one test). With fewer GPUs than N, the N ranks share GPU 0
 * (rp_runner_config.tp_one_gpu: collectives through the host, no graphs):
 * the same split and the same checks, NCCL and the graphs' collectives
 * aside. test_step_* hold the one-kernel step's logits under tensor
 * parallelism to the same rule, test_pick_* its greedy pick across the
 * ranks to the sampling kernels' tokens. Label "gpu"; skipped with a
 * message without CUDA or NCCL. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(REPLAY_HAVE_CUDA) && defined(REPLAY_HAVE_NCCL)

#include "backend/backend.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "util/log.h"

#define STEPS 128
#define NPROMPTS 3
static const int prompt_len[NPROMPTS] = {1, 7, 1000};

typedef struct result {
    float *logits[NPROMPTS]; /* [len][vocab] */
    int32_t tokens[NPROMPTS * STEPS];
} result;

static int gpus(void) {
    return rp_cuda_device_count();
}

/* N ranks on the GPU(s), or (N = 0) the CPU backend: the fp32 reference. */
static void run(const rp_model *m, int N, const int32_t *const *ids, result *out) {
    rp_err err = {0};
    const int one_gpu = N > gpus(), cpu = N == 0;
    rp_runner_config rc = {.model = m, .device = cpu ? "cpu" : "cuda", .page_size = 16, .memory_ratio = 0.5, .max_seqs = NPROMPTS,
                           .max_context = 2048, .max_batched_tokens = 1024, .max_logit_rows = 1024,
                           .cuda_graph_max_bs = 4, .tensor_parallel_size = N,
                           /* one GPU decodes with the chain of kernels too (tensor parallelism has no
                            * one-kernel step): the comparison is of the split, not of two decode paths */
                           .tuning = {.disable_decode_step = 1},
                           /* ranks sharing a GPU: eager, and a KV pool of a set size (each rank would
                            * otherwise size its own from the memory the others leave) */
                           .tp_one_gpu = one_gpu, .disable_cuda_graph = one_gpu, .num_pages = one_gpu ? 512 : 0};
    rp_runner *r = rp_runner_new(&rc, &err);
    if (!r) fail_msg("runner N=%d: %s", N, err.msg);
    /* the CPU's greedy tokens are not compared (the GPU runs' are, with each other) */
    if (rp_runner_run_prompts(r, NPROMPTS, ids, prompt_len, out->logits, cpu ? 1 : STEPS, out->tokens, &err))
        fail_msg("N=%d: %s", N, err.msg);
    if (cpu) {
        printf("  CPU (fp32): the reference\n");
        rp_runner_free(r);
        return;
    }
    rp_backend_stats st = {0};
    if (r->backend->ops->stats) r->backend->ops->stats(r->backend, &st);
    printf("  N=%d%s: %llu forwards, %llu graph replays, %d graphs\n", N, one_gpu ? " (ranks sharing GPU 0)" : "",
           (unsigned long long)st.forwards, (unsigned long long)st.graph_replays, st.num_graphs);
    rp_runner_free(r);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

/* The largest relative L2 of any one position's logits. */
static double worst_position(const float *a, const float *f32, int len, int V) {
    double w = 0;
    for (int i = 0; i < len; i++) {
        const double e = rel_l2(a + (size_t)i * V, f32 + (size_t)i * V, (size_t)V);
        if (e > w) w = e;
    }
    return w;
}

/* Where N ranks are further from fp32 than one GPU: the positions with the
 * largest excess, each with both errors (a fault in the split shows as a
 * few positions or every position past some length; bf16 noise as none). */
static void print_worst_positions(const float *got, const float *ref, const float *f32, int len, int V) {
    int worst[3] = {-1, -1, -1};
    double ex[3] = {0, 0, 0}, eg[3] = {0, 0, 0}, er[3] = {0, 0, 0};
    for (int i = 0; i < len; i++) {
        const size_t o = (size_t)i * V;
        const double g = rel_l2(got + o, f32 + o, (size_t)V), r = rel_l2(ref + o, f32 + o, (size_t)V), x = g - r;
        for (int j = 0; j < 3; j++)
            if (worst[j] < 0 || x > ex[j]) {
                for (int q = 2; q > j; q--)
                    worst[q] = worst[q - 1], ex[q] = ex[q - 1], eg[q] = eg[q - 1], er[q] = er[q - 1];
                worst[j] = i, ex[j] = x, eg[j] = g, er[j] = r;
                break;
            }
    }
    printf("    worst positions against fp32:");
    for (int j = 0; j < 3 && worst[j] >= 0; j++) printf(" %d: %.3g (N=1 %.3g)", worst[j], eg[j], er[j]);
    printf("\n");
}

/* fp8: the layer matrices quantized to e4m3 per row on the host (as
 * --quantization fp8 makes them), every rank's shard keeping its slices'
 * bytes and scales; the CPU reference computes with the dequantized
 * weights. The three prompts are prefilled together (one step of 1,008
 * tokens), so every prompt's products quantize their activations on the
 * GPU (W8A8), on each rank over its slice of the reduced dimension for
 * o_proj and down_proj; the fp8 GEMV (W8A16) runs in the decode steps. */
static void compare_shape(const char *preset, int default_layers, rp_fp8_layout fp8) {
    const int n = gpus();
    if (n < 1) {
        printf("  no GPU visible (skipped)\n");
        skip();
    }
    rp_err err = {0};
    rp_model_config c;
    if (rp_config_preset(&c, preset, &err)) fail_msg("%s", err.msg);
    const char *layers = getenv("REPLAY_TP_LAYERS");
    const int want_layers = layers && atoi(layers) > 0 ? atoi(layers) : default_layers;
    if (want_layers > 0 && want_layers < c.num_layers) c.num_layers = want_layers;
    printf("  %s, %d layers%s\n", preset, c.num_layers, fp8 ? ", fp8 e4m3 with a scale per row" : "");
    rp_load_options lo = {.seed = 11, .quantize_fp8 = fp8};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    const int V = c.vocab_size;
    int32_t *ids[NPROMPTS];
    for (int p = 0; p < NPROMPTS; p++) {
        ids[p] = malloc((size_t)prompt_len[p] * 4);
        for (int i = 0; i < prompt_len[p]; i++) ids[p][i] = (int32_t)((i * 7919 + p * 104729 + 17) % V);
    }
    result f32, ref, got;
    for (int p = 0; p < NPROMPTS; p++) {
        f32.logits[p] = malloc((size_t)prompt_len[p] * V * 4);
        ref.logits[p] = malloc((size_t)prompt_len[p] * V * 4);
        got.logits[p] = malloc((size_t)prompt_len[p] * V * 4);
    }
    run(m, 0, (const int32_t *const *)ids, &f32);
    run(m, 1, (const int32_t *const *)ids, &ref);
    double e1[NPROMPTS];
    for (int p = 0; p < NPROMPTS; p++) {
        e1[p] = rel_l2(ref.logits[p], f32.logits[p], (size_t)prompt_len[p] * V);
        printf("  %s N=1 prompt %4d: against fp32 %.3g\n", preset, prompt_len[p], e1[p]);
    }
    int sizes[4] = {2, 4, 8}, num_sizes = n >= 4 ? 2 : 1; /* more ranks than GPUs share GPU 0 */
    const char *env = getenv("REPLAY_TP_SIZES");
    if (env) {
        num_sizes = 0;
        for (const char *s = env; *s && num_sizes < 4;) {
            sizes[num_sizes++] = atoi(s);
            s = strchr(s, ',');
            if (!s) break;
            s++;
        }
    }
    int failed = 0;
    for (int k = 0; k < num_sizes; k++) {
        const int N = sizes[k];
        run(m, N, (const int32_t *const *)ids, &got);
        for (int p = 0; p < NPROMPTS; p++) {
            const size_t n_el = (size_t)prompt_len[p] * V;
            const double e = rel_l2(got.logits[p], ref.logits[p], n_el), e32 = rel_l2(got.logits[p], f32.logits[p], n_el);
            int first_diff = -1;
            for (int i = 0; i < STEPS && first_diff < 0; i++)
                if (got.tokens[p * STEPS + i] != ref.tokens[p * STEPS + i]) first_diff = i;
            /* The split sums each product's rank parts in another order than one GPU's
             * loop, and the bf16 roundings after it differ: on random weights a deep
             * model amplifies that as it amplifies any bf16 noise (TP=1 against fp32
             * above), so two GPU runs may part at a near-tie in greedy decoding. What a
             * wrong split would change is the distance to fp32: N ranks must be as
             * close to it as one GPU (within 25%, plus 1e-3). */
            /* ... and at every position: a few wrong rows (a collective's tail, the
             * longest attention rows) hide in the prompt's total */
            const double w = worst_position(got.logits[p], f32.logits[p], prompt_len[p], V),
                         w1 = worst_position(ref.logits[p], f32.logits[p], prompt_len[p], V);
            const int ok = e32 <= 1.25 * e1[p] + 1e-3 && w <= 1.5 * w1 + 1e-3;
            printf("  %s N=%d prompt %4d: against N=1 %.3g (%s 1e-2), against fp32 %.3g (N=1: %.3g), worst position "
                   "%.3g (N=1: %.3g) %s; greedy ",
                   preset, N, prompt_len[p], e, e < 1e-2 ? "under" : "over", e32, e1[p], w, w1, ok ? "ok" : "FAIL");
            if (first_diff < 0) printf("identical (%d tokens)\n", STEPS);
            else printf("as N=1's for %d tokens (then %d against %d)\n", first_diff, got.tokens[p * STEPS + first_diff],
                        ref.tokens[p * STEPS + first_diff]);
            if (!ok) {
                print_worst_positions(got.logits[p], ref.logits[p], f32.logits[p], prompt_len[p], V);
                failed = 1;
            }
        }
    }
    for (int p = 0; p < NPROMPTS; p++) free(ids[p]), free(f32.logits[p]), free(ref.logits[p]), free(got.logits[p]);
    rp_model_free(m);
    if (failed) fail_msg("%s: tensor-parallel logits further from fp32 than one GPU's (above)", preset);
}

static void test_small(void **state) {
    (void)state;
    compare_shape("qwen3-0.6b", 0, RP_FP8_NONE);
}

static void test_qwen3_8b(void **state) {
    (void)state;
    compare_shape("qwen3-8b", 0, RP_FP8_NONE);
}

static void test_llama3_8b(void **state) {
    (void)state;
    compare_shape("llama3-8b", 0, RP_FP8_NONE);
}

/* qwen3-0.6b's shape with fp8 weights: shards of e4m3 slices */
static void test_small_fp8(void **state) {
    (void)state;
    compare_shape("qwen3-0.6b", 0, RP_FP8_ROWS);
}

/* Llama 3.1 70B's shape (hidden 8192, 64 / 8 heads, intermediate 28672, a
 * 128,256-word vocabulary) at 2 layers: its shards' widths and the
 * vocabulary's split; the depth is gpu_compare.py's (scripts/gpu-check.sh
 * tp-70b), whose reference runs on the GPU, where 8 layers of fp32 on the
 * CPU did not finish inside a device call. */
static void test_llama3_70b(void **state) {
    (void)state;
    compare_shape("llama3-70b", 2, RP_FP8_NONE);
}

/* The one-kernel decode step under tensor parallelism (its sums through
 * peer memory inside the kernel: rp_decode_step_tp): one sequence, a
 * prompt of 40 tokens, then STEP_N decode steps fed fixed tokens (every
 * run sees the same inputs), each step's logits from the CPU (fp32), one
 * GPU's one-kernel step and N ranks' (N = 2, and 4 where asked). N ranks
 * must have run every decode step in the kernel and be as close to fp32 as
 * one GPU (over all steps within 1.25x plus 1e-3, the worst step within
 * 1.5x plus 1e-3). */
#define STEP_N 24
#define STEP_PROMPT 40
static void decode_logits(const rp_model *m, int N, int decode_step, const int32_t *ids, const int32_t *forced,
                          float *out, uint64_t *step_forwards) {
    rp_err err = {0};
    const int one_gpu = N > gpus(), cpu = N == 0;
    rp_runner_config rc = {.model = m, .device = cpu ? "cpu" : "cuda", .page_size = 16, .memory_ratio = 0.5, .max_seqs = 1,
                           .max_context = 256, .max_batched_tokens = 256, .max_logit_rows = 256,
                           .cuda_graph_max_bs = 1, .tensor_parallel_size = N,
                           .tuning = {.disable_decode_step = !decode_step},
                           .tp_one_gpu = one_gpu, .disable_cuda_graph = one_gpu, .num_pages = one_gpu ? 64 : 0};
    rp_runner *r = rp_runner_new(&rc, &err);
    if (!r) fail_msg("runner N=%d: %s", N, err.msg);
    if (rp_runner_forced_decode(r, ids, STEP_PROMPT, forced, STEP_N, out, &err)) fail_msg("N=%d: %s", N, err.msg);
    rp_backend_stats st = {0};
    if (r->backend->ops->stats) r->backend->ops->stats(r->backend, &st);
    *step_forwards = st.decode_step_forwards;
    rp_runner_free(r);
}

static void compare_step(const char *preset, int layers) {
    if (gpus() < 1) skip();
    rp_err err = {0};
    rp_model_config c;
    if (rp_config_preset(&c, preset, &err)) fail_msg("%s", err.msg);
    const char *env_layers = getenv("REPLAY_TP_LAYERS");
    if (env_layers && atoi(env_layers) > 0) layers = atoi(env_layers);
    if (layers > 0 && layers < c.num_layers) c.num_layers = layers;
    rp_load_options lo = {.seed = 13};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    const int V = c.vocab_size;
    int32_t ids[STEP_PROMPT], forced[STEP_N];
    for (int i = 0; i < STEP_PROMPT; i++) ids[i] = (int32_t)((i * 7919 + 31) % V);
    /* tokens of every rank's vocabulary shard */
    for (int k = 0; k < STEP_N; k++) forced[k] = (int32_t)(((int64_t)k * V / STEP_N + k * 13) % V);
    const size_t n_el = (size_t)STEP_N * V;
    float *f32 = malloc(n_el * 4), *ref = malloc(n_el * 4), *got = malloc(n_el * 4);
    uint64_t fw = 0;
    printf("  %s, %d layers: one sequence, %d decode steps after %d prompt tokens\n", preset, c.num_layers, STEP_N,
           STEP_PROMPT);
    decode_logits(m, 0, 0, ids, forced, f32, &fw);
    decode_logits(m, 1, 1, ids, forced, ref, &fw);
    /* one GPU is the yardstick of the distance to fp32, in whichever path
     * it decodes: llama3-70b's whole down product (k 28672) is too wide for
     * the one-kernel step, which only its shards take */
    const double e1 = rel_l2(ref, f32, n_el), w1 = worst_position(ref, f32, STEP_N, V);
    printf("  N=1 (%llu of %d steps in the one-kernel step): against fp32 %.3g, worst step %.3g\n",
           (unsigned long long)fw, STEP_N, e1, w1);
    const char *env = getenv("REPLAY_TP_SIZES");
    int failed = 0;
    for (int N = 2; N <= 4; N *= 2) {
        if (N == 4 && !(env && strstr(env, "4"))) break;
        decode_logits(m, N, 1, ids, forced, got, &fw);
        const double e = rel_l2(got, ref, n_el), e32 = rel_l2(got, f32, n_el), w = worst_position(got, f32, STEP_N, V);
        /* ranks sharing one GPU decode in the chain (forward_decode_step.c):
         * there the chain's sums are what is compared */
        const int want = N > gpus() ? 0 : STEP_N;
        const int ok = fw == (uint64_t)want && e32 <= 1.25 * e1 + 1e-3 && w <= 1.5 * w1 + 1e-3;
        printf("  N=%d%s: %llu of %d steps in the one-kernel step; against N=1 %.3g, against fp32 %.3g, worst step "
               "%.3g %s\n",
               N, N > gpus() ? " (ranks sharing GPU 0: the chain)" : "", (unsigned long long)fw, STEP_N, e, e32, w,
               ok ? "ok" : "FAIL");
        if (!ok) {
            print_worst_positions(got, ref, f32, STEP_N, V);
            failed = 1;
        }
    }
    free(f32), free(ref), free(got);
    rp_model_free(m);
    if (failed) fail_msg("%s: the tensor-parallel one-kernel step (above)", preset);
}

static void test_step_small(void **state) {
    (void)state;
    compare_step("qwen3-0.6b", 0);
}

/* llama3-8b's shape at 4 layers (the CPU reference is fp32) */
static void test_step_llama3_8b(void **state) {
    (void)state;
    compare_step("llama3-8b", 4);
}

/* llama3-70b's shape at 2 layers: a shard's down product (k 14336 at
 * N = 2) leaves no room for full-width ring stages beside x, so the kernel
 * runs with narrower ones (plan.cu) */
static void test_step_llama3_70b(void **state) {
    (void)state;
    compare_step("llama3-70b", 2);
}

/* The greedy pick across the ranks inside the kernel (rp_decode_step_tp
 * .pick): N ranks, one sequence, PICK_STEPS greedy steps with the kernel's
 * own pick must give the tokens the sampling kernels draw from the
 * gathered logits (top_logprobs 1 keeps the pick off) with the same
 * kernel's logits, token for token; and the logits of a picked step, read
 * afterwards, are gathered then (cuda_read_logits) and argmax to the
 * picked token. */
#define PICK_STEPS 32
static void greedy_tokens(const rp_model *m, int N, int pick, int32_t *tok, uint64_t *picks, float *last_logits) {
    rp_err err = {0};
    rp_runner_config rc = {.model = m, .device = "cuda", .page_size = 16, .memory_ratio = 0.5, .max_seqs = 1,
                           .max_context = 256, .max_batched_tokens = 256, .max_logit_rows = 256,
                           .cuda_graph_max_bs = 1, .tensor_parallel_size = N};
    rp_runner *r = rp_runner_new(&rc, &err);
    if (!r) fail_msg("runner N=%d: %s", N, err.msg);
    rp_runner_seq seq;
    double secs, wall, gpu;
    if (rp_runner_seqs_begin(r, &seq, 1, &err) || rp_runner_prefill_random(r, &seq, 1, STEP_PROMPT, &secs, &err))
        fail_msg("N=%d: %s", N, err.msg);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    sp.temperature = 0.0f;
    sp.top_logprobs = pick ? 0 : 1;
    for (int k = 0; k < PICK_STEPS; k++) {
        if (rp_runner_decode_steps(r, &seq, 1, 1, &sp, &wall, &gpu, &err)) fail_msg("N=%d: %s", N, err.msg);
        tok[k] = seq.last;
    }
    if (last_logits && rp_backend_read_logits(r->backend, last_logits, &err)) fail_msg("N=%d: %s", N, err.msg);
    rp_backend_stats st = {0};
    if (r->backend->ops->stats) r->backend->ops->stats(r->backend, &st);
    *picks = st.decode_step_picks;
    rp_runner_seqs_end(r, &seq, 1);
    rp_runner_free(r);
}

static void compare_pick(const char *preset, int layers) {
    if (gpus() < 2) skip(); /* ranks sharing a GPU decode in the chain */
    rp_err err = {0};
    rp_model_config c;
    if (rp_config_preset(&c, preset, &err)) fail_msg("%s", err.msg);
    if (layers > 0 && layers < c.num_layers) c.num_layers = layers;
    rp_load_options lo = {.seed = 17};
    rp_model *m = rp_model_dummy_from_config(&c, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    const char *env = getenv("REPLAY_TP_SIZES");
    float *lg = malloc((size_t)c.vocab_size * 4);
    for (int N = 2; N <= 4 && N <= gpus(); N *= 2) {
        if (N == 4 && !(env && strstr(env, "4"))) break;
        int32_t a[PICK_STEPS], b[PICK_STEPS];
        uint64_t pa = 0, pb = 0;
        greedy_tokens(m, N, 1, a, &pa, lg);
        greedy_tokens(m, N, 0, b, &pb, NULL);
        int best = 0;
        for (int i = 1; i < c.vocab_size; i++)
            if (lg[i] > lg[best]) best = i;
        int same = 0;
        while (same < PICK_STEPS && a[same] == b[same]) same++;
        printf("  %s, %d layers, N=%d: %llu of %d steps picked in the kernel, %llu with the sampling kernels; "
               "%d of %d tokens the same; the last picked step's gathered logits argmax %d, picked %d\n",
               preset, c.num_layers, N, (unsigned long long)pa, PICK_STEPS, (unsigned long long)pb, same, PICK_STEPS,
               best, a[PICK_STEPS - 1]);
        if (pa != PICK_STEPS || pb != 0 || same != PICK_STEPS || best != a[PICK_STEPS - 1])
            fail_msg("%s N=%d: the greedy pick across the ranks (above)", preset, N);
    }
    free(lg);
    rp_model_free(m);
}

static void test_pick_small(void **state) {
    (void)state;
    compare_pick("qwen3-0.6b", 0);
}

/* dynamic units (the 8B shard's plan) */
static void test_pick_llama3_8b(void **state) {
    (void)state;
    compare_pick("llama3-8b", 4);
}

/* More GPUs than there are: a clear error, before anything loads on them. */
static void test_too_many(void **state) {
    (void)state;
    const int n = gpus();
    if (n < 1 || n >= 8) skip();
    rp_err err = {0};
    rp_runner_config rc = {.dummy_name = "qwen3-0.6b", .device = "cuda", .max_seqs = 1, .max_context = 256,
                           .tensor_parallel_size = 8};
    assert_null(rp_runner_new(&rc, &err));
    printf("  --tp 8 on %d GPU(s): %s\n", n, err.msg);
    assert_non_null(strstr(err.msg, "GPUs"));
}

int main(void) {
    rp_log_set_level(RP_LOG_WARN);
    /* REPLAY_TEST_ONLY=test_small (a cmocka pattern) runs a part: each
     * 8B shape takes minutes */
    if (getenv("REPLAY_TEST_ONLY")) cmocka_set_test_filter(getenv("REPLAY_TEST_ONLY"));
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_small), cmocka_unit_test(test_small_fp8),
                                       cmocka_unit_test(test_qwen3_8b),
                                       cmocka_unit_test(test_llama3_8b), cmocka_unit_test(test_llama3_70b),
                                       cmocka_unit_test(test_step_small), cmocka_unit_test(test_step_llama3_8b),
                                       cmocka_unit_test(test_step_llama3_70b), cmocka_unit_test(test_pick_small),
                                       cmocka_unit_test(test_pick_llama3_8b), cmocka_unit_test(test_too_many)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static void test_skipped(void **state) {
    (void)state;
    printf("built without CUDA or NCCL: skipping the tensor-parallel GPU tests\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
