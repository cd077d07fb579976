/* Decode CUDA graphs, one per batch-size bucket (mini-sglang's GraphRunner).
 *
 * At startup each bucket's whole decode step (embedding, every layer,
 * lm_head, sampling) is captured once over the fixed metadata block (twice
 * where the step is one kernel: with the sampling kernels, and with the
 * kernel's own greedy pick for batches that need nothing else), so a
 * decode step later costs one metadata copy and one cudaGraphLaunch. A batch
 * of S sequences replays the smallest bucket >= S, padded with one-token
 * dummy sequences whose KV reads and writes go to the dummy page. All graphs
 * use the backend's own buffers, so they need no memory of their own beyond
 * their nodes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"
#include "util/log.h"
#include "util/progress.h"

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* mini-sglang's default, 1, 2, 4, then every 8 up to 256, then every 32
 * up to 512 and every 64 up to 1024 (a running set bounded by KV memory
 * reaches those; a step there is 20+ ms, so padding by up to 63 sequences
 * costs a few per cent of it), and the maximum itself. */
static int default_buckets(int max_bs, int *out) {
    int n = 0;
    for (int b = 1; b <= max_bs && b <= 4; b *= 2) out[n++] = b;
    for (int b = 8; b <= max_bs && n < RP_MAX_GRAPHS; b += b < 256 ? 8 : b < 512 ? 32 : 64) out[n++] = b;
    if (n > 0 && out[n - 1] != max_bs && max_bs > 4 && n < RP_MAX_GRAPHS) out[n++] = max_bs;
    return n;
}

static int dummy_step(rp_cuda_backend *cb, int bs, rp_err *err) {
    /* An empty batch padded to bs: every sequence is a dummy. */
    static const int32_t zero = 0;
    rp_batch empty = {.num_seqs = 0, .num_tokens = 0, .seq_start = &zero};
    return rp_cuda_pack_and_upload(cb, &empty, bs, err);
}

/* A step bucket's padding only: no sequence, no work for attention. */
static int dummy_bucket_step(rp_cuda_backend *cb, const rp_cuda_step_bucket *bk, rp_err *err) {
    static const int32_t zero = 0;
    rp_batch empty = {.num_seqs = 0, .num_tokens = 0, .seq_start = &zero};
    return rp_cuda_pack_step(cb, &empty, bk, err);
}

/* Warm-up (eager), capture, instantiate and a dry run of one step: a
 * decode bucket's (bk NULL; bs sequences, the given sampling as
 * rp_cuda_launch_forward's sample) or a step bucket's. */
static int capture_step(rp_cuda_backend *cb, int bs, const rp_cuda_step_bucket *bk, int sample,
                        cudaGraphExec_t *exec, rp_err *err) {
    const int T = bk ? bk->tokens : bs, S = bk ? bk->attn.dec_seqs : bs, L = bk ? bk->logits : bs;
    const rp_attn_step_shape *shape = bk ? &bk->attn : NULL;
    if (bk ? dummy_bucket_step(cb, bk, err) : dummy_step(cb, bs, err)) return RP_ERR;
    if (rp_cuda_launch_forward(cb, T, S, L, !bk, shape, sample, err)) return RP_ERR;
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    cudaGraph_t graph = NULL;
    RP_CUDA_TRY(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), err);
    cb->capturing = 1;
    int rc = rp_cuda_launch_forward(cb, T, S, L, !bk, shape, sample, err);
    cb->capturing = 0;
    /* The capture ends whatever happened inside it; a failed one leaves no
     * graph behind (a launch error invalidates the capture: no graph, or a
     * partial one to destroy). */
    cudaError_t ce = cudaStreamEndCapture(cb->stream, &graph);
    if (rc || ce != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (rc) return rp_err_wrap(err, "capturing the %s graph for %d %s", bk ? "step" : "decode", bk ? T : bs,
                                   bk ? "tokens" : "sequences");
        return rp_errf(err, "capturing the %s graph for %d %s: %s", bk ? "step" : "decode", bk ? T : bs,
                       bk ? "tokens" : "sequences", cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) {
        *exec = NULL;
        return rp_errf(err, "instantiating the %s graph for %d %s: %s", bk ? "step" : "decode", bk ? T : bs,
                       bk ? "tokens" : "sequences", cudaGetErrorString(ce));
    }
    RP_CUDA_TRY(cudaGraphLaunch(*exec, cb->stream), err);
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    return 0;
}

/* The decode buckets (every backend has them, graphs or not: an eager
 * decode step is padded to its bucket just as a replay is, so both compute
 * the same values). */
int rp_cuda_decode_buckets_plan(rp_cuda_backend *cb, rp_err *err) {
    const rp_backend_config *bc = &cb->base.cfg;
    int sizes[RP_MAX_GRAPHS], n = 0;
    int max_bs = bc->cuda_graph_max_bs > 0 ? bc->cuda_graph_max_bs : 1024;
    if (max_bs > bc->max_batch_seqs) max_bs = bc->max_batch_seqs;
    if (max_bs > bc->max_batched_tokens) max_bs = bc->max_batched_tokens;
    if (max_bs > bc->max_logit_rows) max_bs = bc->max_logit_rows;
    if (bc->num_cuda_graph_bs > 0) {
        for (int i = 0; i < bc->num_cuda_graph_bs && n < RP_MAX_GRAPHS; i++) {
            int b = bc->cuda_graph_bs[i];
            if (b < 1 || b > bc->max_batch_seqs || b > bc->max_logit_rows || b > bc->max_batched_tokens)
                return rp_errf(err, "CUDA graph batch size %d is outside 1..%d", b, max_bs);
            sizes[n++] = b;
        }
        qsort(sizes, (size_t)n, sizeof sizes[0], cmp_int);
    } else {
        n = default_buckets(max_bs, sizes);
    }
    for (int i = 0; i < n; i++) cb->graphs[i] = (rp_cuda_graph){.batch_size = sizes[i]};
    cb->num_graphs = n;
    return 0;
}

int rp_cuda_graphs_capture(rp_cuda_backend *cb, rp_err *err) {
    const int n = cb->num_graphs;
    int sizes[RP_MAX_GRAPHS];
    for (int i = 0; i < n; i++) sizes[i] = cb->graphs[i].batch_size;
    size_t free0 = 0, free1 = 0, total = 0;
    RP_CUDA_TRY(cudaMemGetInfo(&free0, &total), err);
    double t0 = rp_now_s();
    rp_progress prog;
    rp_progress_begin(&prog, "capturing CUDA graphs", (uint64_t)(n + cb->num_buckets));
    /* Capture largest first: cuBLASLt plans and any lazily created state are
     * set up during the warm-up run of each size, outside capture. */
    for (int i = n - 1; i >= 0; i--) {
        int bs = sizes[i];
        rp_cuda_graph *g = &cb->graphs[i];
        if (capture_step(cb, bs, NULL, RP_SAMPLE_KERNELS, &g->exec, err)) return RP_ERR;
        /* the bucket's greedy variant, where its step is one kernel */
        if (rp_cuda_decode_step_nb(cb, bs, bs, bs, 1) && rp_cuda_decode_step_can_pick(cb, bs) &&
            capture_step(cb, bs, NULL, RP_SAMPLE_PICK, &g->exec_pick, err))
            return RP_ERR;
        /* and its chain, for batches whose K/V outgrows the step */
        if (rp_cuda_decode_step_nb(cb, bs, bs, bs, 1)) {
            cb->decode_chain = 1;
            int rc = capture_step(cb, bs, NULL, RP_SAMPLE_KERNELS, &g->exec_chain, err);
            cb->decode_chain = 0;
            if (rc) return RP_ERR;
        }
        cb->num_decode_graphs++;
        rp_progress_add(&prog, 1);
        if (prog.enabled) {
            size_t f, t;
            if (cudaMemGetInfo(&f, &t) == cudaSuccess)
                fprintf(stderr, " bs %d, %.1f GiB free ", bs, (double)f / (1 << 30));
        }
    }
    /* the step buckets, largest first too */
    for (int i = cb->num_buckets - 1; i >= 0; i--) {
        rp_cuda_step_bucket *bk = &cb->buckets[i];
        if (capture_step(cb, 0, bk, RP_SAMPLE_KERNELS, &bk->exec, err)) return RP_ERR;
        cb->num_step_graphs++;
        rp_progress_add(&prog, 1);
    }
    rp_progress_end(&prog);
    RP_CUDA_TRY(cudaMemGetInfo(&free1, &total), err);
    cb->stats.num_graphs = cb->num_decode_graphs + cb->num_step_graphs;
    cb->stats.graph_capture_s = rp_now_s() - t0;
    cb->stats.graph_memory_mib = ((double)free0 - (double)free1) / (1 << 20);
    rp_log_info("cuda: captured %d decode graphs (batch sizes %d..%d) and %d step graphs (%d..%d tokens) in %.2fs "
                "using %.1f MiB",
                cb->num_decode_graphs, sizes[0], sizes[n - 1], cb->num_step_graphs, cb->buckets[0].tokens,
                cb->buckets[cb->num_buckets - 1].tokens, cb->stats.graph_capture_s, cb->stats.graph_memory_mib);
    return 0;
}

const rp_cuda_graph *rp_cuda_graph_find(const rp_cuda_backend *cb, int num_seqs) {
    for (int i = 0; i < cb->num_graphs; i++)
        if (cb->graphs[i].batch_size >= num_seqs) return &cb->graphs[i];
    return NULL;
}

void rp_cuda_graphs_destroy(rp_cuda_backend *cb) {
    for (int i = 0; i < RP_MAX_GRAPHS; i++) {
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
        if (cb->graphs[i].exec_pick) cudaGraphExecDestroy(cb->graphs[i].exec_pick);
        if (cb->graphs[i].exec_chain) cudaGraphExecDestroy(cb->graphs[i].exec_chain);
        cb->graphs[i].exec = cb->graphs[i].exec_pick = cb->graphs[i].exec_chain = NULL;
    }
    cb->num_decode_graphs = 0;
    for (int i = 0; i < RP_MAX_STEP_BUCKETS; i++) {
        if (cb->buckets[i].exec) cudaGraphExecDestroy(cb->buckets[i].exec);
        cb->buckets[i].exec = NULL;
    }
    cb->num_step_graphs = 0;
}

/* Steps with prompt chunks: token buckets of 16 to 128 doubling, then
 * spaced by about 1.5x (256, 384, 512, 768, ...) up to the step's token
 * budget, which is the last bucket itself, so that a step that fills its
 * budget (the common one under load) runs unpadded. A step runs padded to
 * the smallest bucket that holds it: up to a third of its products' rows
 * wasted between two buckets, much less on average. Logits rows: the
 * bucket's tokens, at most the backend's logit rows. */
void rp_cuda_step_buckets_plan(rp_cuda_backend *cb) {
    const rp_backend_config *bc = &cb->base.cfg;
    const rp_model_config *c = &cb->base.model->cfg;
    const int max_t = bc->max_batched_tokens;
    int n = 0;
    for (int t = 16; t < max_t && n < RP_MAX_STEP_BUCKETS - 1;) {
        cb->buckets[n++].tokens = t;
        t = t < 256 ? 2 * t : (t & (t - 1)) == 0 ? t + t / 2 : t / 3 * 4;
    }
    cb->buckets[n++].tokens = max_t;
    for (int i = 0; i < n; i++) {
        rp_cuda_step_bucket *bk = &cb->buckets[i];
        const int dec_seqs = cb->max_seqs < bk->tokens ? cb->max_seqs : bk->tokens;
        bk->logits = cb->max_logits < bk->tokens ? cb->max_logits : bk->tokens;
        bk->attn = rp_attn_step_shape_for(bk->tokens, cb->max_seqs, rp_cuda_decode_splits(cb, dec_seqs), cb->num_sms,
                                          c->num_heads, c->num_kv_heads, c->head_dim, bc->page_size,
                                          cb->attn_ws_bytes, cb->kv_format);
        bk->exec = NULL;
    }
    cb->num_buckets = n;
}

const rp_cuda_step_bucket *rp_cuda_step_bucket_find(const rp_cuda_backend *cb, int num_tokens, int num_logits) {
    for (int i = 0; i < cb->num_buckets; i++)
        if (cb->buckets[i].tokens >= num_tokens && cb->buckets[i].logits >= num_logits) return &cb->buckets[i];
    return NULL;
}
