/* Shared by `replay bench` and `replay profile`: prefilling sequences to a
 * context length and timing decode steps through the backend interface. */
#include "cli/bench_common.h"

#include <stdlib.h>
#include <string.h>

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


/* Prefills each sequence with ctx random tokens through the batched path. */
int rp_bench_prefill(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B, int ctx,
                   int vocab, double *seconds, rp_err *err) {
    int32_t *prompt = malloc((size_t)ctx * sizeof *prompt);
    int32_t *tok = malloc((size_t)be->cfg.max_logit_rows * sizeof *tok);
    rp_sample_params *sp = calloc((size_t)be->cfg.max_logit_rows, sizeof *sp);
    if (!prompt || !tok || !sp) {
        free(prompt);
        free(tok);
        free(sp);
        return rp_errf(err, "out of memory");
    }
    double t0 = rp_now_s();
    int s = 0, done_in_seq = 0, rc = 0;
    while (s < B && !rc) {
        rp_batch_begin(bb);
        int first_seq = s;
        while (s < B && rp_batch_tokens_left(bb) > 0) {
            int n = ctx - done_in_seq;
            if (n > rp_batch_tokens_left(bb)) n = rp_batch_tokens_left(bb);
            for (int i = 0; i < n; i++)
                prompt[i] = (int32_t)(rp_rand_u64(1, (uint64_t)s, (uint64_t)(done_in_seq + i)) % (uint64_t)vocab);
            if ((rc = rp_page_table_reserve(table, seqs[s].row, done_in_seq + n, err))) break;
            int last = done_in_seq + n == ctx;
            if (rp_batch_add(bb, seqs[s].row, prompt, n, done_in_seq, last) < 0) break;
            done_in_seq += n;
            if (last) {
                s++;
                done_in_seq = 0;
            }
        }
        if (rc) break;
        rp_batch *bt = rp_batch_finish(bb);
        bt->sample = be->ops->read_tokens && bt->num_logits ? sp : NULL;
        if ((rc = rp_backend_forward(be, bt, err))) break;
        if (bt->sample) {
            if ((rc = be->ops->read_tokens(be, tok, NULL, NULL, err))) break;
            int k = 0;
            for (int q = first_seq; q < s; q++) seqs[q].last = tok[k++];
        } else if (be->ops->read_logits) {
            /* CPU: take token 1 as the next input; the values do not matter here */
            for (int q = first_seq; q < s; q++) seqs[q].last = 1;
        }
    }
    for (int q = 0; q < B; q++) seqs[q].len = ctx;
    *seconds = rp_now_s() - t0;
    free(prompt);
    free(tok);
    free(sp);
    return rc;
}

/* One decode batch: a token per sequence at its current length, the input
 * seqs[s].last or, when refs is not NULL, refs[s]. NULL on error. */
static rp_batch *decode_batch(rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B,
                              const int32_t *refs, rp_err *err) {
    rp_batch_begin(bb);
    for (int s = 0; s < B; s++) {
        if (rp_page_table_reserve(table, seqs[s].row, seqs[s].len + 1, err)) return NULL;
        if (rp_batch_add(bb, seqs[s].row, refs ? &refs[s] : &seqs[s].last, 1, seqs[s].len, 1) < 0) {
            rp_errf(err, "decode batch of %d does not fit", B);
            return NULL;
        }
    }
    return rp_batch_finish(bb);
}

/* Each sequence's sampling parameters for its next token: *sp (NULL:
 * greedy), seeded by the sequence and counted by its length, as the engine
 * does. */
static void step_params(rp_sample_params *out, const rp_sample_params *sp, const rp_bench_seq *seqs, int B) {
    for (int s = 0; s < B; s++) {
        if (sp) {
            out[s] = *sp;
        } else {
            memset(&out[s], 0, sizeof out[s]);
            out[s].top_p = 1.0f;
        }
        out[s].seed = (uint64_t)s + 1;
        out[s].step = (uint64_t)seqs[s].len;
    }
}

/* Runs `steps` decode steps over all B sequences; fills per-step wall and
 * device times. */
int rp_bench_decode_steps(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B,
                          int steps, const rp_sample_params *sp_in, double *wall_ms, double *gpu_ms, float *logits,
                          rp_err *err) {
    rp_sample_params sp[1024];
    int32_t tok[1024];
    if (B > 1024) return rp_errf(err, "decode batch of %d does not fit", B);
    for (int it = 0; it < steps; it++) {
        double t0 = rp_now_s();
        rp_batch *bt = decode_batch(table, bb, seqs, B, NULL, err);
        if (!bt) return RP_ERR;
        step_params(sp, sp_in, seqs, B);
        if (be->ops->read_tokens) bt->sample = sp;
        if (rp_backend_forward(be, bt, err)) return RP_ERR;
        if (be->ops->read_tokens) {
            if (be->ops->read_tokens(be, tok, NULL, NULL, err)) return RP_ERR;
        } else {
            if (rp_backend_read_logits(be, logits, err)) return RP_ERR;
            for (int s = 0; s < B; s++) tok[s] = 1;
        }
        for (int s = 0; s < B; s++) {
            seqs[s].last = tok[s];
            seqs[s].len++;
        }
        wall_ms[it] = (rp_now_s() - t0) * 1e3;
        rp_backend_stats st = {0};
        if (be->ops->stats) be->ops->stats(be, &st);
        gpu_ms[it] = st.last_gpu_ms;
    }
    return 0;
}

/* As the engine runs decode (overlap, src/sched/runtime.c): step N + 1 is
 * launched before step N's tokens are read, its input tokens being
 * references to them, so the host's work hides behind the device's. */
int rp_bench_decode_overlapped(rp_backend *be, rp_page_table *table, rp_batch_builder *bb, rp_bench_seq *seqs, int B,
                               int steps, const rp_sample_params *sp_in, double *wall_ms, double *gpu_ms, rp_err *err) {
    rp_sample_params sp[1024];
    int32_t tok[1024], refs[1024];
    if (!be->supports_token_refs || !be->ops->read_tokens) return rp_errf(err, "this backend cannot overlap steps");
    if (B > 1024 || B > be->cfg.max_logit_rows) return rp_errf(err, "decode batch of %d does not fit", B);
    for (int s = 0; s < B; s++) refs[s] = -(s + 1); /* sequence s samples logit row s */
    double prev = rp_now_s();
    for (int it = 0; it <= steps; it++) {
        if (it < steps) {
            rp_batch *bt = decode_batch(table, bb, seqs, B, it ? refs : NULL, err);
            if (!bt) return RP_ERR;
            step_params(sp, sp_in, seqs, B);
            bt->sample = sp;
            if (rp_backend_forward(be, bt, err)) return RP_ERR;
            for (int s = 0; s < B; s++) seqs[s].len++;
        }
        if (it == 0) continue;
        /* the older of the two steps in flight: step it - 1 */
        if (be->ops->read_tokens(be, tok, NULL, NULL, err)) return RP_ERR;
        const double now = rp_now_s();
        wall_ms[it - 1] = (now - prev) * 1e3;
        prev = now;
        rp_backend_stats st = {0};
        if (be->ops->stats) be->ops->stats(be, &st);
        gpu_ms[it - 1] = st.last_gpu_ms;
    }
    for (int s = 0; s < B; s++) seqs[s].last = tok[s];
    return 0;
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

