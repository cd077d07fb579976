/* `replay bench kernels`: each CUDA kernel alone at the model's shapes (the
 * GEMVs of every projection and lm_head, the cuBLASLt products prefill
 * runs, decode and prefill attention, sampling, and the one-kernel batch-1
 * decode step), with achieved GB/s or TFLOP/s next to the ceilings measured
 * in the same run: the device-to-device copy and streaming read bandwidths,
 * and a large cuBLASLt bf16 GEMM's rate.
 *
 * Method (METHOD.md): random inputs (never zeros), a warm-up, then the
 * median of 15 timings of 20 back-to-back launches each (CUDA events).
 * Weights rotate through a pool larger than L2 so no launch reads cache. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cli/bench_common.h"
#include "engine/runner.h"
#include "cli/cli.h"
#include "engine/batch.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/config.h"
#include "model/model.h"

#define CMD "bench kernels"

static int g_attn_sweep; /* --attn-sweep: every split count and block shape of attention */
static int g_gemm_algos; /* --gemm-algos: every cuBLASLt candidate at the batch sizes of decode and mixed steps */

#ifdef REPLAY_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

/* A failing CUDA call ends the benchmark with its message (longjmp back to
 * the command, which returns exit status 1). */
static jmp_buf g_fail;
static char g_fail_msg[640];
#define CHECK(call)                                                                                   \
    do {                                                                                              \
        cudaError_t e_ = (cudaError_t)(call);                                                         \
        if (e_ != cudaSuccess) {                                                                      \
            snprintf(g_fail_msg, sizeof g_fail_msg, "%s failed: %s", #call, cudaGetErrorString(e_));  \
            longjmp(g_fail, 1);                                                                       \
        }                                                                                             \
    } while (0)

#define REPS 15
#define INNER 20

static cudaEvent_t ev0, ev1;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median time in microseconds of one call of fn(i, ctx). */
static double time_us(void (*fn)(int, void *), void *ctx) {
    for (int i = 0; i < 3; i++) fn(i, ctx);
    CHECK(cudaDeviceSynchronize());
    float ms[REPS];
    int it = 0;
    for (int r = 0; r < REPS; r++) {
        CHECK(cudaEventRecord(ev0, 0));
        for (int i = 0; i < INNER; i++) fn(it++, ctx);
        CHECK(cudaEventRecord(ev1, 0));
        CHECK(cudaEventSynchronize(ev1));
        CHECK(cudaEventElapsedTime(&ms[r], ev0, ev1));
    }
    qsort(ms, REPS, sizeof ms[0], cmp_f);
    return ms[REPS / 2] * 1000.0 / INNER;
}

/* ---- copy ceiling ---- */
typedef struct { void *a, *b; size_t bytes; } copy_ctx;
static void copy_fn(int i, void *c) {
    copy_ctx *x = c;
    (void)i;
    CHECK(cudaMemcpyAsync(x->b, x->a, x->bytes, cudaMemcpyDeviceToDevice, 0));
}

/* ---- GEMV ---- */
typedef struct {
    const rp_bf16 *pool;
    size_t pool_elems;
    int copies, T, N, K, f32;
    rp_bf16 *x, *y;
    float *yf;
} gemv_ctx;
static void gemv_fn(int i, void *c) {
    gemv_ctx *g = c;
    const rp_bf16 *W = g->pool + (size_t)(i % g->copies) * (size_t)g->N * g->K;
    if (g->f32)
        CHECK(rp_k_gemv_f32out(W, g->x, g->yf, g->T, g->N, g->K, 0));
    else
        CHECK(rp_k_gemv(W, g->x, g->y, g->T, g->N, g->K, 0));
}

/* ---- decode attention ---- */
typedef struct {
    const rp_bf16 *qkv, *kc, *vc;
    rp_attn_meta meta;
    rp_bf16 *out;
    void *ws;
    int B, nh, nkv, hd, splits;
} dec_ctx;
static void dec_fn(int i, void *c) {
    dec_ctx *d = c;
    (void)i;
    CHECK(rp_k_attn_decode(d->qkv, rp_kv_cache_bf16((rp_bf16 *)d->kc, (rp_bf16 *)d->vc), d->meta, d->out, d->ws, d->B,
                           d->nh, d->nkv, d->hd, d->splits, 0));
}

/* ---- cuBLASLt products (prefill's projections) ---- */
typedef struct {
    rp_gemm *g;
    const rp_bf16 *W, *x;
    void *y;
    int T, N, K, f32;
} lt_ctx;
static void lt_fn(int i, void *c) {
    lt_ctx *l = c;
    rp_err err;
    (void)i;
    if (rp_gemm_run(l->g, l->W, l->x, l->y, l->T, l->N, l->K, l->f32, 0, &err)) {
        snprintf(g_fail_msg, sizeof g_fail_msg, "%s", err.msg);
        longjmp(g_fail, 1);
    }
}

typedef struct {
    const rp_bf16 *qkv, *kc, *vc;
    rp_attn_meta meta;
    rp_bf16 *out;
    void *ws;
    size_t ws_bytes;
    int T, S, max_q, max_kv, nh, nkv, hd;
} pf_ctx;
static void pf_fn(int i, void *c) {
    pf_ctx *p = c;
    (void)i;
    CHECK(rp_k_attn_prefill(p->qkv, rp_kv_cache_bf16((rp_bf16 *)p->kc, (rp_bf16 *)p->vc), p->meta, p->out, p->ws,
                            p->ws_bytes, p->T, p->S, p->max_q, p->max_kv, p->nh, p->nkv, p->hd, 0));
}

static void pf90_fn(int i, void *c) {
    pf_ctx *p = c;
    (void)i;
    CHECK(rp_k_attn_prefill_sm90(p->qkv, p->kc, p->vc, p->meta, p->out, p->T, p->S, p->max_q, p->max_kv, p->nh,
                                 p->nkv, p->hd, 0));
}

typedef struct {
    const float *logits;
    const rp_sampling_params *params;
    int32_t *tok;
    float *lp;
    void *ws;
    int rows, vocab;
} smp_ctx;
static void smp_fn(int i, void *c) {
    smp_ctx *s = c;
    (void)i;
    CHECK(rp_k_sample(s->logits, s->params, s->tok, s->lp, s->ws, s->rows, s->vocab, 0));
}

static void *dmalloc(size_t b) {
    void *p;
    CHECK(cudaMalloc(&p, b));
    return p;
}

static void fill_bf16(rp_bf16 *d, size_t n, uint64_t seed) {
    CHECK(rp_k_fill_dummy(d, (int64_t)n, seed, 1, 1.0f / 64.0f, 0, 0));
}


/* The sm_90a prefill kernel (attn_prefill_sm90.cu, not yet the forward's)
 * beside the mma.sync one, causal, one sequence without a cached prefix,
 * on the same inputs (contiguous pages of ps slots of kc / vc, which hold
 * at least 16384). */
static void bench_prefill_sm90(int nh, int nkv, int hd, int ps, const rp_bf16 *kc, const rp_bf16 *vc, void *ws,
                               size_t ws_bytes, double mma_tflops) {
    printf("\n%-24s %5s %9s %9s %7s %9s %9s %8s\n", "attn_prefill sm90 (causal)", "new", "sm90 us", "TFLOP/s",
           "%mma", "mma us", "TFLOP/s", "speedup");
    if (!rp_attn_prefill_sm90_supported(hd, ps)) {
        printf("  skipped: head dim %d, page size %d not supported\n", hd, ps);
        return;
    }
    const int lens[] = {2048, 4096, 8192, 16384};
    for (int li = 0; li < 4; li++) {
        const int L = lens[li], pages = (L + ps - 1) / ps;
        rp_bf16 *qkv = dmalloc((size_t)L * (nh + 2 * nkv) * hd * 2), *out = dmalloc((size_t)L * nh * hd * 2);
        fill_bf16(qkv, (size_t)L * (nh + 2 * nkv) * hd, 15);
        int32_t *table = malloc((size_t)pages * 4), kvl = L, rowi = 0, start[2] = {0, L};
        for (int p = 0; p < pages; p++) table[p] = p;
        int32_t *d_table = dmalloc((size_t)pages * 4), *d_kvl = dmalloc(4), *d_row = dmalloc(4), *d_start = dmalloc(8);
        CHECK(cudaMemcpy(d_table, table, (size_t)pages * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d_kvl, &kvl, 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d_row, &rowi, 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d_start, start, 8, cudaMemcpyHostToDevice));
        pf_ctx p = {qkv, kc, vc, {d_start, d_kvl, d_row, d_table, pages, ps, NULL, NULL}, out, ws, ws_bytes, L, 1, L, L, nh, nkv, hd};
        const double flops = 4.0 * nh * hd * ((double)L * (L + 1) / 2);
        const double us90 = time_us(pf90_fn, &p), us = time_us(pf_fn, &p);
        printf("%-24s %5d %9.1f %9.1f %6.1f%% %9.1f %9.1f %7.2fx\n", "", L, us90, flops / (us90 * 1e6),
               mma_tflops > 0 ? 100.0 * flops / (us90 * 1e6) / mma_tflops : 0.0, us, flops / (us * 1e6), us / us90);
        CHECK(cudaFree(qkv));
        CHECK(cudaFree(out));
        CHECK(cudaFree(d_table));
        CHECK(cudaFree(d_kvl));
        CHECK(cudaFree(d_row));
        CHECK(cudaFree(d_start));
        free(table);
    }
}

/* The one-kernel batch-1 decode step (rp_k_decode_step) at ctx 512, on
 * random weights of the config's shapes: the whole model's weights and one
 * sequence's KV cache per launch, against both ceilings. */
static void bench_decode_step(const rp_model_config *cfg, double copy_gbs) {
    const int ctx = 512, page = 16, pages = (ctx + 2 + page - 1) / page + 1;
    printf("\n%-28s %5s %9s %9s %8s %7s %7s\n", "decode step (one kernel)", "ctx", "MB", "us", "GB/s", "%copy",
           "%read");
    rp_err err;
    rp_load_options lo = {.seed = 1, .lazy_dummy = 1};
    rp_model *m = rp_model_dummy_from_config(cfg, &lo, &err);
    if (!m) {
        printf("  skipped: %s\n", err.msg);
        return;
    }
    rp_runner_config rc = {.model = m, .device = "cuda", .page_size = page, .num_pages = pages, .max_seqs = 1,
                           .max_context = ctx + 2, .max_batched_tokens = ctx, .disable_cuda_graph = 1};
    rp_runner *run = rp_runner_new(&rc, &err);
    rp_runner_seq seq;
    double prefill_s, wall, gpu, us = 0, read_gbs = 0, copy2 = 0;
    if (!run || rp_runner_seqs_begin(run, &seq, 1, &err) ||
        rp_runner_prefill_random(run, &seq, 1, ctx, &prefill_s, &err) ||
        rp_runner_decode_steps(run, &seq, 1, 1, NULL, &wall, &gpu, &err) ||
        rp_cuda_time_decode_step(run->backend, REPS, INNER, &us, &err)) {
        printf("  skipped: %s\n", err.msg);
    } else {
        const uint64_t embed = (uint64_t)cfg->vocab_size * cfg->hidden_size * 2;
        const double bytes = (double)(m->weight_bytes - (cfg->tie_word_embeddings ? 0 : embed)) +
                             (double)ctx * cfg->num_layers * 2 * cfg->num_kv_heads * cfg->head_dim * 2;
        const double gbs = bytes / (us * 1e3);
        if (rp_cuda_read_bandwidth(0, &read_gbs, &copy2) != 0) read_gbs = 0;
        printf("%-28s %5d %9.1f %9.1f %8.0f %6.1f%% %6.1f%%\n", "batch 1", ctx, bytes / 1e6, us, gbs,
               100.0 * gbs / copy_gbs, read_gbs > 0 ? 100.0 * gbs / read_gbs : 0.0);
        printf("(read bandwidth, streaming kernel: %.0f GB/s)\n", read_gbs);
    }
    rp_runner_free(run);
    rp_model_free(m);
}

static void run_all(const rp_model_config cfg, const char *name) {
    CHECK(cudaSetDevice(0));
    const rp_model_config *c = &cfg;
    const int H = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const int qd = c->num_heads * c->head_dim, kvd = c->num_kv_heads * c->head_dim;
    char nq[64], no[64], ngu[64], nd[64], nl[64];
    snprintf(nq, sizeof nq, "%s qkv", name);
    snprintf(no, sizeof no, "%s o", name);
    snprintf(ngu, sizeof ngu, "%s gate_up", name);
    snprintf(nd, sizeof nd, "%s down", name);
    snprintf(nl, sizeof nl, "%s lm_head f32", name);
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(cudaEventCreate(&ev0));
    CHECK(cudaEventCreate(&ev1));
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

    /* copy ceiling: 1 GiB, counting read + write */
    copy_ctx cc = {dmalloc(1u << 30), dmalloc(1u << 30), 1u << 30};
    CHECK(cudaMemset(cc.a, 1, cc.bytes));
    double copy_us = time_us(copy_fn, &cc);
    double copy_gbs = 2.0 * cc.bytes / (copy_us * 1e3);
    printf("d2d copy 1 GiB: %.1f us, %.0f GB/s (read + write)\n\n", copy_us, copy_gbs);
    CHECK(cudaFree(cc.a));
    CHECK(cudaFree(cc.b));

    /* GEMV: weights rotate through >= 512 MiB */
    const size_t pool_bytes = (size_t)1536 << 20;
    rp_bf16 *pool = dmalloc(pool_bytes);
    fill_bf16(pool, pool_bytes / 2, 7);
    int maxk = H > F ? H : F, maxn = V > 2 * F ? V : 2 * F;
    if (qd > maxk) maxk = qd;
    double mma_tflops = 0;
    rp_bf16 *x = dmalloc((size_t)8 * maxk * 2), *y = dmalloc((size_t)8 * maxn * 2);
    float *yf = dmalloc((size_t)8 * maxn * 4);
    fill_bf16(x, (size_t)8 * maxk, 9);
    struct { const char *name; int N, K, f32; } shapes[] = {
        {nq, qd + 2 * kvd, H, 0}, {no, H, qd, 0}, {ngu, 2 * F, H, 0}, {nd, H, F, 0}, {nl, V, H, 1},
    };
    printf("%-24s %2s %7s %6s %9s %9s %8s %7s\n", "gemv", "T", "N", "K", "MB", "us", "GB/s", "%copy");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int T = 1; T <= 8; T *= 8) {
            gemv_ctx g = {pool, pool_bytes / 2, 0, T, shapes[si].N, shapes[si].K, shapes[si].f32, x, y, yf};
            size_t mat = (size_t)g.N * g.K;
            g.copies = (int)(g.pool_elems / mat);
            if (g.copies > 64) g.copies = 64;
            double us = time_us(gemv_fn, &g);
            double bytes = mat * 2.0 + (double)T * g.K * 2 + (double)T * g.N * (g.f32 ? 4 : 2);
            double gbs = bytes / (us * 1e3);
            printf("%-24s %2d %7d %6d %9.1f %9.2f %8.0f %6.1f%%\n", shapes[si].name, T, g.N, g.K, bytes / 1e6, us, gbs,
                   100.0 * gbs / copy_gbs);
        }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(yf));

    /* The same projections as prefill runs them (cuBLASLt) at 512 to 8192
     * token rows, against the rate of a large GEMM measured now. The
     * weights come from the pool (the activations, up to 8192 x 2F, make
     * each product's bytes far smaller than its FLOPs at these T). */
    {
        const int Ts[] = {512, 2048, 8192}, maxT = 8192;
        rp_err gerr;
        rp_gemm gm;
        if (rp_gemm_init(&gm, 64u << 20, &gerr)) {
            snprintf(g_fail_msg, sizeof g_fail_msg, "%s", gerr.msg);
            longjmp(g_fail, 1);
        }
        if (rp_cuda_matmul_tflops(0, &mma_tflops)) mma_tflops = 0;
        int ltn = 2 * F > qd + 2 * kvd ? 2 * F : qd + 2 * kvd;
        if (H > ltn) ltn = H;
        rp_bf16 *xa = dmalloc((size_t)maxT * maxk * 2), *ya = dmalloc((size_t)maxT * ltn * 2);
        fill_bf16(xa, (size_t)maxT * maxk, 10);
        printf("\n%-24s %5s %7s %6s %9s %9s %7s   (bf16 GEMM 8192^3, cuBLASLt: %.0f TFLOP/s)\n",
               "gemm (cuBLASLt)", "T", "N", "K", "us", "TFLOP/s", "%mma", mma_tflops);
        for (size_t si = 0; si < 4; si++) /* lm_head runs on the sampled rows only */
            for (int ti = 0; ti < 3; ti++) {
                lt_ctx l = {&gm, pool, xa, ya, Ts[ti], shapes[si].N, shapes[si].K, 0};
                const double us = time_us(lt_fn, &l), tf = 2.0 * l.T * l.N * (double)l.K / (us * 1e6);
                printf("%-24s %5d %7d %6d %9.1f %9.1f %6.1f%%\n", shapes[si].name, l.T, l.N, l.K, us, tf,
                       mma_tflops > 0 ? 100.0 * tf / mma_tflops : 0.0);
            }
        if (g_gemm_algos) {
            /* the products as decode and mixed steps run them (fp32 out
             * where forward_chain.c adds into the residual or feeds
             * silu_mul): cuBLASLt's first choice against the fastest of
             * its candidates, and the fastest whose sums are the same */
            const int As[] = {128, 256, 320, 384, 512, 768, 1024, 2048};
            const int f32s[] = {0, 1, 1, 1};
            printf("\n%-24s %5s %5s %11s %17s %23s\n", "gemm candidates", "T", "algos", "first us", "fastest us (i)",
                   "fastest same sums (i)");
            for (size_t si = 0; si < 4; si++)
                for (int ti = 0; ti < 8; ti++) {
                    float us[16];
                    int same[16];
                    const int T = As[ti], N = shapes[si].N, K = shapes[si].K;
                    const int n = rp_gemm_algo_sweep(&gm, pool, xa, ya, T, N, K, f32s[si], RP_GEMM_BF16, 16, us, same,
                                                     NULL, &gerr);
                    if (n < 0) {
                        snprintf(g_fail_msg, sizeof g_fail_msg, "%s", gerr.msg);
                        longjmp(g_fail, 1);
                    }
                    int best = 0, best_same = 0;
                    for (int i = 1; i < n; i++) {
                        if (us[i] < us[best]) best = i;
                        if (same[i] && us[i] < us[best_same]) best_same = i;
                    }
                    const double fl = 2.0 * T * N * (double)K / 1e6; /* MFLOP: / us = TFLOP/s */
                    printf("%-24s %5d %5d %6.1f %4.0fT %8.1f %4.0fT (%2d) %8.1f %4.0fT (%2d)\n", shapes[si].name, T, n,
                           us[0], fl / us[0], us[best], fl / us[best], best, us[best_same], fl / us[best_same],
                           best_same);
                }
            /* the FP8 products of --quantization fp8 past the GEMV's 16
             * tokens (raw sums below RP_FP8_OUTER_MIN_T, outer-vector scales
             * from it): their rate in weight bytes read, GB/s */
            const int Fs[] = {16, 32, 64, 128, 256};
            printf("\n%-24s %5s %5s %11s %17s   (FP8: GB/s of weights)\n", "fp8 gemm candidates", "T", "algos",
                   "first us", "fastest us (i)");
            for (size_t si = 0; si < 4; si++)
                for (int ti = 0; ti < 5; ti++) {
                    float us[32];
                    int same[32], sk[32];
                    const int T = Fs[ti], N = shapes[si].N, K = shapes[si].K;
                    const int mode = T >= RP_FP8_OUTER_MIN_T ? RP_GEMM_FP8_OUTER : RP_GEMM_FP8_RAW;
                    const int n = rp_gemm_algo_sweep(&gm, pool, xa, ya, T, N, K, 1, mode, 32, us, same, sk, &gerr);
                    if (n < 0) {
                        printf("%-24s %5d  none: %s\n", shapes[si].name, T, gerr.msg);
                        continue;
                    }
                    int best = 0;
                    for (int i = 1; i < n; i++)
                        if (us[i] < us[best]) best = i;
                    const double mb = (double)N * K / 1e3; /* weight bytes / 1e3: / us = GB/s */
                    printf("%-24s %5d %5d %6.1f %5.0f %8.1f %5.0f (%2d, split-K %d)\n", shapes[si].name, T, n, us[0],
                           mb / us[0], us[best], mb / us[best], best, sk[best]);
                }
        }
        CHECK(cudaFree(xa));
        CHECK(cudaFree(ya));
        rp_gemm_destroy(&gm);
    }
    CHECK(cudaFree(pool));

    /* decode attention at the model's heads, page 16 */
    {
        const int nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim, ps = 16;
        /* 32k only where B x ctx fits the cache below: the long-context rows */
        const int Bs[] = {1, 8, 32, 128}, ctxs[] = {512, 4096, 32768};
        const int max_tokens = 128 * 4096;
        const size_t slots = (size_t)max_tokens + ps;
        rp_bf16 *kc = dmalloc(slots * nkv * hd * 2), *vc = dmalloc(slots * nkv * hd * 2);
        fill_bf16(kc, slots * nkv * hd, 11);
        fill_bf16(vc, slots * nkv * hd, 12);
        rp_bf16 *qkv = dmalloc((size_t)128 * (nh + 2 * nkv) * hd * 2), *out = dmalloc((size_t)128 * nh * hd * 2);
        fill_bf16(qkv, (size_t)128 * (nh + 2 * nkv) * hd, 13);
        printf("\n%-24s %4s %5s %6s %9s %9s %8s %7s\n", "attn_decode", "B", "ctx", "splits", "MB", "us",
               "GB/s", "%copy");
        for (int bi = 0; bi < 4; bi++)
            for (int ci = 0; ci < 3; ci++) {
                const int B = Bs[bi], L = ctxs[ci], pages = L / ps;
                if ((long)B * L > max_tokens) continue;
                int32_t *table = malloc((size_t)B * pages * 4), *kvl = malloc((size_t)B * 4),
                        *rowi = malloc((size_t)B * 4), *start = malloc((size_t)(B + 1) * 4);
                for (int s = 0; s < B; s++) {
                    kvl[s] = L, rowi[s] = s, start[s] = s;
                    for (int p = 0; p < pages; p++) table[s * pages + p] = (p * 7919 + s * pages) % (max_tokens / ps);
                }
                start[B] = B;
                int32_t *d_table = dmalloc((size_t)B * pages * 4), *d_kvl = dmalloc((size_t)B * 4),
                        *d_row = dmalloc((size_t)B * 4), *d_start = dmalloc((size_t)(B + 1) * 4);
                CHECK(cudaMemcpy(d_table, table, (size_t)B * pages * 4, cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(d_kvl, kvl, (size_t)B * 4, cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(d_row, rowi, (size_t)B * 4, cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(d_start, start, (size_t)(B + 1) * 4, cudaMemcpyHostToDevice));
                /* about 4 blocks per SM, splits of >= 64 keys */
                int splits = (4 * prop.multiProcessorCount + B * nkv - 1) / (B * nkv);
                if (splits > L / 64) splits = L / 64;
                if (splits < 1) splits = 1;
                void *ws = dmalloc(rp_attn_decode_workspace_bytes(B, nh, hd, splits > 32 ? splits : 32));
                dec_ctx d = {qkv, kc, vc, {d_start, d_kvl, d_row, d_table, pages, ps, NULL, NULL}, out, ws, B, nh, nkv, hd, splits};
                double us = time_us(dec_fn, &d);
                double bytes = (double)B * L * nkv * hd * 2 * 2;
                double gbs = bytes / (us * 1e3);
                printf("%-24s %4d %5d %6d %9.1f %9.2f %8.0f %6.1f%%\n", "", B, L, splits, bytes / 1e6, us, gbs,
                       100.0 * gbs / copy_gbs);
                if (g_attn_sweep) { /* the split count and the kernel, for tuning */
                    const int sw[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
                    for (int mode = 0; mode < 2; mode++) {
                        rp_k_attn_decode_set_trans(mode == 1);
                        printf("  %s, us at splits", mode ? "keys as M" : "heads as M");
                        for (int k = 0; k < 10 && sw[k] <= L / 16; k++) {
                            d.splits = sw[k];
                            printf(" %d: %.1f", sw[k], time_us(dec_fn, &d));
                        }
                        printf("\n");
                    }
                    rp_k_attn_decode_set_trans(-1);
                }
                CHECK(cudaFree(ws));
                CHECK(cudaFree(d_table));
                CHECK(cudaFree(d_kvl));
                CHECK(cudaFree(d_row));
                CHECK(cudaFree(d_start));
                free(table), free(kvl), free(rowi), free(start);
            }

        /* prefill: causal, without a cached prefix and (the last rows) few
         * new tokens after a long one, where the keys are split
         * (attn_prefill.cu): those also unsplit. GB/s: the K/V read once. */
        printf("\n%-24s %4s %5s %6s %6s %9s %9s %7s %8s\n", "attn_prefill (causal)", "seqs", "new", "kv", "splits",
               "us", "TFLOP/s", "%mma", "KV GB/s");
        const int pf[][3] = {{1, 512, 0},    {1, 2048, 0},    {4, 1024, 0},     {1, 8192, 0},
                             {1, 16384, 0},  {1, 64, 8000},   {1, 17, 2032},    {1, 300, 7764},
                             {4, 64, 8000}};
        const int n_pf = (int)(sizeof pf / sizeof pf[0]);
        size_t pws_bytes = rp_attn_prefill_workspace_bytes(16384, nh, hd, prop.multiProcessorCount);
        for (int pi = 0; pi < n_pf; pi++) /* the sweep's forced splits */
            if (pf[pi][2] > 0 && rp_attn_prefill_split_bytes(pf[pi][0] * pf[pi][1], nh, hd, 32) > pws_bytes)
                pws_bytes = rp_attn_prefill_split_bytes(pf[pi][0] * pf[pi][1], nh, hd, 32);
        void *pws = dmalloc(pws_bytes);
        for (int pi = 0; pi < n_pf; pi++) {
            const int S = pf[pi][0], L = pf[pi][1], prefix = pf[pi][2], kv = prefix + L, T = S * L;
            const int pages = (kv + ps - 1) / ps;
            rp_bf16 *pqkv = dmalloc((size_t)T * (nh + 2 * nkv) * hd * 2), *pout = dmalloc((size_t)T * nh * hd * 2);
            fill_bf16(pqkv, (size_t)T * (nh + 2 * nkv) * hd, 14);
            int32_t *table = malloc((size_t)S * pages * 4), kvl[4], rowi[4], start[5];
            for (int s = 0; s < S; s++) {
                kvl[s] = kv, rowi[s] = s, start[s] = s * L;
                for (int p = 0; p < pages; p++) table[s * pages + p] = s * pages + p;
            }
            start[S] = T;
            int32_t *d_table = dmalloc((size_t)S * pages * 4), *d_kvl = dmalloc(16), *d_row = dmalloc(16),
                    *d_start = dmalloc(20);
            CHECK(cudaMemcpy(d_table, table, (size_t)S * pages * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_kvl, kvl, (size_t)S * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_row, rowi, (size_t)S * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(d_start, start, (size_t)(S + 1) * 4, cudaMemcpyHostToDevice));
            pf_ctx p = {pqkv, kc, vc, {d_start, d_kvl, d_row, d_table, pages, ps, NULL, NULL}, pout, pws, pws_bytes,
                        T, S, L, kv, nh, nkv, hd};
            const double flops = 4.0 * nh * hd * S * ((double)L * prefix + (double)L * (L + 1) / 2);
            const double kv_bytes = (double)S * kv * nkv * hd * 2 * 2;
            const int rule = rp_attn_prefill_splits(prop.multiProcessorCount, T, S, L, kv, nh, nkv, hd, pws_bytes);
            /* the rule's choice, then (where it splits, or for a prefix
             * shape) the same launch with the split off */
            for (int off = 0; off < (rule > 1 || prefix > 0 ? 2 : 1); off++) {
                rp_k_attn_prefill_set_splits(off ? 1 : -1);
                const double us = time_us(pf_fn, &p);
                printf("%-24s %4d %5d %6d %6d %9.1f %9.1f %6.1f%% %8.0f\n", off ? "  split off" : "", S, L, kv,
                       off ? 1 : rule, us, flops / (us * 1e6),
                       mma_tflops > 0 ? 100.0 * flops / (us * 1e6) / mma_tflops : 0.0, kv_bytes / (us * 1e3));
            }
            rp_k_attn_prefill_set_splits(-1);
            if (g_attn_sweep) { /* every block shape, and for a prefix shape every split count, for tuning */
                static const char *const names[] = {"", "16 rows per warp", "32 rows per warp", "two heads per warp"};
                const int sw[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
                for (int mode = RP_PREFILL_ROWS16; mode <= RP_PREFILL_HEADS2; mode++) {
                    rp_k_attn_prefill_set_mode(mode);
                    if (prefix == 0) {
                        const double m_us = time_us(pf_fn, &p);
                        printf("  %s: %.1f us, %.1f TFLOP/s\n", names[mode], m_us, flops / (m_us * 1e6));
                        continue;
                    }
                    printf("  %s, us at splits", names[mode]);
                    for (int k = 0; k < 10; k++) {
                        rp_k_attn_prefill_set_splits(sw[k]);
                        printf(" %d: %.1f", sw[k], time_us(pf_fn, &p));
                    }
                    printf("\n");
                    rp_k_attn_prefill_set_splits(-1);
                }
                rp_k_attn_prefill_set_mode(-1);
            }
            CHECK(cudaFree(pqkv));
            CHECK(cudaFree(pout));
            CHECK(cudaFree(d_table));
            CHECK(cudaFree(d_kvl));
            CHECK(cudaFree(d_row));
            CHECK(cudaFree(d_start));
            free(table);
        }
        bench_prefill_sm90(nh, nkv, hd, ps, kc, vc, pws, pws_bytes, mma_tflops);
        CHECK(cudaFree(pws));
        CHECK(cudaFree(kc));
        CHECK(cudaFree(vc));
        CHECK(cudaFree(qkv));
        CHECK(cudaFree(out));
    }

    /* sampling at the model's vocabulary */
    {
        const int vocab = V, max_rows = 32;
        float *logits = dmalloc((size_t)max_rows * vocab * 4);
        float *h = malloc((size_t)max_rows * vocab * 4);
        uint64_t z = 88172645463325252ull;
        for (size_t i = 0; i < (size_t)max_rows * vocab; i++) {
            z ^= z << 13, z ^= z >> 7, z ^= z << 17;
            h[i] = (float)((double)(z >> 11) / 9007199254740992.0 * 12.0 - 6.0);
        }
        CHECK(cudaMemcpy(logits, h, (size_t)max_rows * vocab * 4, cudaMemcpyHostToDevice));
        free(h);
        rp_sampling_params *params = dmalloc(max_rows * sizeof(rp_sampling_params));
        int32_t *tok = dmalloc(max_rows * 4);
        float *lp = dmalloc(max_rows * 4);
        void *sws = dmalloc(rp_sample_workspace_bytes(max_rows, vocab));
        struct { const char *name; float t, p, minp; int k; } cases[] = {
            {"greedy", 0.0f, 1.0f, 0.0f, 0},       {"T=1", 1.0f, 1.0f, 0.0f, 0},
            {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0.0f, 0}, {"T=0.7 top_k=50", 0.7f, 1.0f, 0.0f, 50},
            {"top_k=50 top_p=0.9 min_p", 0.8f, 0.9f, 0.05f, 50}};
        printf("\n%-28s %4s %9s\n", "sample", "rows", "us");
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int rows = 1; rows <= max_rows; rows *= 32) {
                rp_sampling_params hp[32];
                for (int r = 0; r < rows; r++)
                    hp[r] = (rp_sampling_params){.temperature = cases[ci].t, .top_p = cases[ci].p, .top_k = cases[ci].k, .min_p = cases[ci].minp, .seed = 1234, .step = (uint64_t)r};
                CHECK(cudaMemcpy(params, hp, rows * sizeof hp[0], cudaMemcpyHostToDevice));
                smp_ctx s = {logits, params, tok, lp, sws, rows, vocab};
                double us = time_us(smp_fn, &s);
                printf("%-28s %4d %9.1f\n", cases[ci].name, rows, us);
            }
        CHECK(cudaFree(logits));
        CHECK(cudaFree(params));
        CHECK(cudaFree(tok));
        CHECK(cudaFree(lp));
        CHECK(cudaFree(sws));
    }
    bench_decode_step(c, copy_gbs);
}
#endif

static void help(FILE *f) {
    fprintf(f, "Usage: replay bench kernels (--model DIR | --dummy-weights NAME) [OPTIONS]\n"
               "\n"
               "Times each CUDA kernel alone at the model's shapes against the copy bandwidth\n"
               "measured in the same run (only the model's config is read; the one-kernel\n"
               "decode step, timed last, runs on random weights of those shapes). It needs a GPU.\n"
               "\n"
               "Model (only its shapes: no weights are read):\n"
               "  --model DIR            a Hugging Face model directory (its config.json); required\n"
               "                         unless --dummy-weights\n"
               "  --dummy-weights NAME   instead of --model: a named shape (required unless --model;\n"
               "                         an unknown NAME lists the known ones)\n"
               "  --device DEV           auto or cuda: the kernels run on the GPU (default auto)\n"
               "\n"
               "Benchmark:\n"
               "  --attn-sweep           also time decode attention at every split count with both\n"
               "                         kernels, and prefill attention with every block shape (and\n"
               "                         after a cached prefix, every split count)\n"
               "  --gemm-algos           also time every cuBLASLt candidate for the projections at\n"
               "                         128-2048 rows (decode and mixed steps) against its first choice,\n"
               "                         and the FP8 products (--quantization fp8) at 16-256 rows, split-K too\n"
               "\n" RP_COMMON_OPTIONS_HELP);
}

/* The model options that mean something here (their codes are
 * rp_model_opts_parse's, cli.h): no weights load, so none of the loading
 * options, and no CPU threads. */
static const struct option options[] = {{"model", required_argument, 0, 0x100},
                                         {"dummy-weights", required_argument, 0, 0x101},
                                         {"device", required_argument, 0, 0x103},
                                         {"attn-sweep", no_argument, 0, 'a'},
                                         {"gemm-algos", no_argument, 0, 'G'},
                                         RP_COMMON_LONG_OPTIONS,
                                         {0, 0, 0, 0}};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        if (opt == 'a' || opt == 'G') {
            *(opt == 'a' ? &g_attn_sweep : &g_gemm_algos) = 1;
            continue;
        }
        if (opt != 'h') return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        help(stdout);
        return RP_EXIT_OK;
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (mo.quantize_fp8)
        return rp_cli_usage_error(CMD, "--quantization fp8: bench kernels times the bf16 kernels; 'replay bench "
                                       "decode --quantization fp8' times fp8 steps");
    if (mo.kv_cache_dtype && strcmp(mo.kv_cache_dtype, "auto") && strcmp(mo.kv_cache_dtype, "bf16") &&
        strcmp(mo.kv_cache_dtype, "bfloat16"))
        return rp_cli_usage_error(CMD, "--kv-cache-dtype %s: bench kernels times the bf16 KV kernels; 'replay bench "
                                       "decode --kv-cache-dtype fp8' times fp8 KV steps",
                                  mo.kv_cache_dtype);
    if (mo.tp_size > 1 || mo.nnodes > 1)
        return rp_cli_usage_error(CMD, "--tensor-parallel-size: bench kernels times one GPU's kernels; 'replay bench "
                                       "decode --tp N' times tensor-parallel steps");
    int no_gpu = rp_bench_need_gpu(&mo, CMD);
    if (no_gpu) return no_gpu;
    mo.load_format = "dummy"; /* the config alone: a directory without weights will do */
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
#ifdef REPLAY_HAVE_CUDA
    if (setjmp(g_fail)) return rp_cli_runtime_error(CMD, "%s", g_fail_msg);
    run_all(mo.cfg, mo.dummy_name ? mo.dummy_name : mo.model_dir);
    return RP_EXIT_OK;
#else
    return RP_EXIT_RUNTIME; /* rp_bench_need_gpu said why */
#endif
}

const rp_cli_command rp_cli_bench_kernels = {"bench kernels", "each CUDA kernel alone at the model's shapes, against the copy bandwidth", options, help, run};
