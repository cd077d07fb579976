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

/* mini-sglang's default: 1, 2, 4, then every 8 up to the maximum. */
static int default_buckets(int max_bs, int *out) {
    int n = 0;
    for (int b = 1; b <= max_bs && b <= 4; b *= 2) out[n++] = b;
    for (int b = 8; b <= max_bs && n < RP_MAX_GRAPHS; b += 8) out[n++] = b;
    if (n > 0 && out[n - 1] != max_bs && max_bs > 4 && n < RP_MAX_GRAPHS) out[n++] = max_bs;
    return n;
}

static int dummy_step(rp_cuda_backend *cb, int bs, rp_err *err) {
    /* An empty batch padded to bs: every sequence is a dummy. */
    static const int32_t zero = 0;
    rp_batch empty = {.num_seqs = 0, .num_tokens = 0, .seq_start = &zero};
    return rp_cuda_pack_and_upload(cb, &empty, bs, err);
}

/* Warm-up (eager), capture, instantiate and a dry run of one bucket's step
 * with the given sampling (rp_cuda_launch_forward's sample). */
static int capture_step(rp_cuda_backend *cb, int bs, int sample, cudaGraphExec_t *exec, rp_err *err) {
    if (dummy_step(cb, bs, err)) return RP_ERR;
    if (rp_cuda_launch_forward(cb, bs, bs, bs, 1, 1, 1, sample, err)) return RP_ERR;
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    cudaGraph_t graph = NULL;
    RP_CUDA_TRY(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal), err);
    cb->capturing = 1;
    int rc = rp_cuda_launch_forward(cb, bs, bs, bs, 1, 1, 1, sample, err);
    cb->capturing = 0;
    /* The capture ends whatever happened inside it; a failed one leaves no
     * graph behind (a launch error invalidates the capture: no graph, or a
     * partial one to destroy). */
    cudaError_t ce = cudaStreamEndCapture(cb->stream, &graph);
    if (rc || ce != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (rc) return rp_err_wrap(err, "capturing the decode graph for batch size %d", bs);
        return rp_errf(err, "capturing the decode graph for batch size %d: %s", bs, cudaGetErrorString(ce));
    }
    ce = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) {
        *exec = NULL;
        return rp_errf(err, "instantiating the decode graph for batch size %d: %s", bs, cudaGetErrorString(ce));
    }
    RP_CUDA_TRY(cudaGraphLaunch(*exec, cb->stream), err);
    RP_CUDA_TRY(cudaStreamSynchronize(cb->stream), err);
    return 0;
}

int rp_cuda_graphs_capture(rp_cuda_backend *cb, rp_err *err) {
    const rp_backend_config *bc = &cb->base.cfg;
    int sizes[RP_MAX_GRAPHS], n = 0;
    int max_bs = bc->cuda_graph_max_bs > 0 ? bc->cuda_graph_max_bs : 256;
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
    size_t free0 = 0, free1 = 0, total = 0;
    RP_CUDA_TRY(cudaMemGetInfo(&free0, &total), err);
    double t0 = rp_now_s();
    rp_progress prog;
    rp_progress_begin(&prog, "capturing CUDA graphs", (uint64_t)n);
    /* Capture largest first: cuBLASLt plans and any lazily created state are
     * set up during the warm-up run of each size, outside capture. */
    for (int i = n - 1; i >= 0; i--) {
        int bs = sizes[i];
        rp_cuda_graph *g = &cb->graphs[i];
        g->batch_size = bs;
        if (capture_step(cb, bs, RP_SAMPLE_KERNELS, &g->exec, err)) return RP_ERR;
        /* the bucket's greedy variant, where its step is one kernel */
        if (rp_cuda_decode_step_nb(cb, bs, bs, bs, 1) && rp_cuda_decode_step_can_pick(cb, bs) &&
            capture_step(cb, bs, RP_SAMPLE_PICK, &g->exec_pick, err))
            return RP_ERR;
        cb->num_graphs++;
        rp_progress_add(&prog, 1);
        if (prog.enabled) {
            size_t f, t;
            if (cudaMemGetInfo(&f, &t) == cudaSuccess)
                fprintf(stderr, " bs %d, %.1f GiB free ", bs, (double)f / (1 << 30));
        }
    }
    rp_progress_end(&prog);
    RP_CUDA_TRY(cudaMemGetInfo(&free1, &total), err);
    cb->stats.num_graphs = cb->num_graphs;
    cb->stats.graph_capture_s = rp_now_s() - t0;
    cb->stats.graph_memory_mib = ((double)free0 - (double)free1) / (1 << 20);
    rp_log_info("cuda: captured %d decode graphs (batch sizes %d..%d) in %.2fs using %.1f MiB", cb->num_graphs,
                sizes[0], sizes[n - 1], cb->stats.graph_capture_s, cb->stats.graph_memory_mib);
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
    }
    cb->num_graphs = 0;
}
