/* The one-kernel decode step on the backend's side (the kernel is
 * kernels/decode_step/): its argument block over the backend's buffers and
 * the metadata block, which sequence counts it takes on this model and GPU,
 * its launch inside a forward, its counters, its timing alone for `replay
 * bench kernels`, and in the trace build its trace and timeline. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/cuda_util.h"
#include "dist/comm.h"
#include "util/log.h"

/* The step's argument block (fixed device addresses, like every launch),
 * the per-layer pointer table and the plan values; which sequence counts
 * the kernel takes on this model and GPU (decode_step_ok). */
int rp_cuda_decode_step_setup(rp_cuda_backend *cb, rp_err *err) {
    const rp_model_config *c = &cb->base.model->cfg;
    uint8_t *d = cb->meta.dev;
    if (rp_cuda_tuning_resolve(&cb->base.cfg.tuning, c, cb->num_sms, cb->hbm_peak_gbs, &cb->ds_tuning, err)) return RP_ERR;
    if (cb->base.cfg.tuning.disable_decode_step) {
        rp_log_info("cuda: the one-kernel decode step is off (tuning.disable_decode_step): decode runs a chain of "
                    "kernels");
        return 0;
    }
    /* Tensor parallelism: the step's sums over the ranks go through peer
     * memory inside the kernel (rp_decode_step_tp), so it needs the
     * peer-memory communicator; one sequence (its stagings hold one row). */
    rp_decode_step_tp tp = {0};
    if (cb->comm && cb->base.cfg.tp.shared_gpu) {
        /* ranks sharing one GPU (the test harness): each rank's kernel spins
         * on the others' blocks, and nothing makes two grids resident at
         * once (a cooperative launch promises it for one) */
        if (cb->base.cfg.tp.rank == 0)
            rp_log_info("cuda: tensor-parallel ranks sharing one GPU: decode runs a chain of kernels");
        return 0;
    }
    if (cb->comm) {
        if (rp_comm_p2p_decode_step(cb->comm, c->hidden_size, &tp)) {
            if (cb->base.cfg.tp.rank == 0)
                rp_log_info("cuda: tensor parallelism without the peer-memory all-reduce (--disable-custom-all-reduce, "
                            "or GPUs that cannot reach each other's memory): decode runs a chain of kernels");
            return 0;
        }
        tp.vocab_start = cb->vocab_start;
        tp.vocab_count = cb->vocab_count;
    }
    if (cb->kv_format != RP_KV_FORMAT_BF16) {
        /* its attention phase reads bf16 K/V rows: with an e4m3 cache every
         * decode takes the chain, whose attention reads e4m3 (half the
         * bytes), never the one kernel on bytes it would misread */
        rp_log_info("cuda: the one-kernel decode step reads a bf16 KV cache; with the fp8 KV cache decode runs a "
                    "chain of kernels");
        return 0;
    }
    if (cb->w.fp8 == RP_FP8_BLOCKS) {
        /* its W8 ring takes a scale per row: 128 x 128 block scales run the
         * chain's block-scaled GEMVs at every batch */
        rp_log_info("cuda: the one-kernel decode step takes fp8 weights with a scale per row; with 128x128 "
                    "block-scaled fp8 weights decode runs a chain of kernels");
        return 0;
    }
    /* under tensor parallelism the ranks' picks meet inside the kernel
     * (rp_decode_step_tp.pick), and the logits stay ungathered */
    cb->decode_step_pick = 1;
    rp_decode_layer *h = calloc((size_t)c->num_layers, sizeof *h);
    if (!h) return rp_errf(err, "out of memory");
    for (int l = 0; l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->w.layers[l];
        h[l] = (rp_decode_layer){ly->qkv.w,     ly->o.w,     ly->gu.w,     ly->down.w,    ly->bqkv,
                                 ly->qkv.scale, ly->o.scale, ly->gu.scale, ly->down.scale};
    }
    /* the table, then the norm weights side by side (rp_decode_step.norms;
     * copied on the stream the uploads were queued on) */
    const size_t bytes = ((size_t)c->num_layers * sizeof *h + 127) / 128 * 128,
                 nstride = 2 * (size_t)c->hidden_size + 2 * (size_t)c->head_dim;
    const int qk = cb->w.layers[0].q_norm != NULL;
    int rc = rp_cuda_malloc((void **)&cb->d_layers, bytes + (size_t)c->num_layers * nstride * 2, "layer table", err);
    rp_bf16 *norms = rc ? NULL : (rp_bf16 *)((uint8_t *)cb->d_layers + bytes);
    if (!rc && cudaMemcpy(cb->d_layers, h, (size_t)c->num_layers * sizeof *h, cudaMemcpyHostToDevice) != cudaSuccess)
        rc = rp_errf(err, "cudaMemcpy of the layer table failed");
    for (int l = 0; !rc && l < c->num_layers; l++) {
        const rp_cuda_layer *ly = &cb->w.layers[l];
        rp_bf16 *n = norms + (size_t)l * nstride;
        const size_t hb = (size_t)c->hidden_size * 2, db = (size_t)c->head_dim * 2;
        const enum cudaMemcpyKind d2d = cudaMemcpyDeviceToDevice;
        if (cudaMemcpyAsync(n, ly->attn_norm, hb, d2d, cb->stream) != cudaSuccess ||
            cudaMemcpyAsync(n + c->hidden_size, ly->mlp_norm, hb, d2d, cb->stream) != cudaSuccess ||
            (qk && (cudaMemcpyAsync(n + 2 * c->hidden_size, ly->q_norm, db, d2d, cb->stream) != cudaSuccess ||
                    cudaMemcpyAsync(n + 2 * c->hidden_size + c->head_dim, ly->k_norm, db, d2d, cb->stream) !=
                        cudaSuccess)))
            rc = rp_errf(err, "cudaMemcpy of the norm weights failed");
    }
    free(h);
    if (rc) return RP_ERR;
    cb->ds = (rp_decode_step){
        .layers = cb->d_layers,
        .norms = norms,
        .qk_norm = qk,
        .fp8 = cb->w.fp8 == RP_FP8_ROWS,
        .embed = cb->w.embed,
        .final_norm = cb->w.final_norm,
        .lm_head = cb->w.lm_head,
        .inv_freq = cb->inv_freq,
        .tokens = RP_META(cb, d, off_tokens, int32_t),
        .positions = RP_META(cb, d, off_positions, int32_t),
        .slots = RP_META(cb, d, off_slots, int32_t),
        .prev_sampled = cb->d_tokens,
        .pick_tokens = cb->d_tokens,
        .pick_logprobs = cb->d_logprobs,
        .pick_slot = RP_META(cb, d, off_out_slot, int32_t),
        .pick_host_stride = cb->max_logits,
        .meta = rp_cuda_device_attn_meta(cb),
        .k_cache = cb->k_cache,
        .v_cache = cb->v_cache,
        .kv_layer_elems = cb->kv_layer_elems,
        .residual = cb->residual,
        .logits = cb->comm ? cb->logits_shard : cb->logits, /* tensor parallelism: gathered after the kernel */
        .qkv = cb->qkv,
        .attn = cb->attn,
        .act = cb->act,
        .workspace = cb->ds_ws,
        .num_layers = c->num_layers,
        .H = c->hidden_size,
        .F = c->intermediate_size,
        .nh = c->num_heads,
        .nkv = c->num_kv_heads,
        .hd = c->head_dim,
        .V = c->vocab_size,
        .eps = (float)c->rms_norm_eps,
        .rope_scale = cb->rope_scale,
        .tp = tp,
    };
    /* the greedy pick writes into the slot's result buffer; without a
     * mapped one, decode steps sample with the sampling kernels */
    for (int k = 0; k < 2; k++) cb->ds.pick_host[k] = cb->slots[k].d_tokens_host;
    if (!cb->slots[0].d_tokens_host) cb->decode_step_pick = 0;
#ifdef REPLAY_DECODE_STEP_TRACE
    /* the trace build: every one-sequence step records where its time went */
    const size_t trace_bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE * 8;
    if (rp_cuda_malloc((void **)&cb->ds.trace, trace_bytes, "decode step trace", err)) return RP_ERR;
    RP_CUDA_TRY(cudaMemset(cb->ds.trace, 0, trace_bytes), err); /* blocks with no attention item leave 0 */
    const size_t tl_bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TL_PIECES * 4 * 8;
    if (cb->base.cfg.trace_timeline_path) {
        if (rp_cuda_malloc((void **)&cb->ds.timeline, tl_bytes, "decode step timeline", err)) return RP_ERR;
        RP_CUDA_TRY(cudaMemset(cb->ds.timeline, 0, tl_bytes), err);
    }
#endif
    for (int nb = 1; nb <= 4; nb *= 2) { /* 3 sequences run the kernel for 4 */
        const char *why = nb > cb->ds_tuning.max_seqs
                              ? "faster that way on this GPU and shape: decode_step_max_seqs, docs/tuning.md"
                              : rp_decode_step_check_device(&cb->ds, &cb->ds_tuning, nb, cb->num_sms);
        if (!why) cb->decode_step_ok |= 1 << nb;
        else rp_log_info("cuda: decode of %d sequence%s runs as a chain of kernels (%s)", nb, nb > 1 ? "s" : "", why);
    }
    if (cb->comm) {
        /* Every rank must decode the same way: a rank in the chain never
         * meets a rank in the kernel, whose sums wait on it. The same shard
         * shapes on the same GPUs decide the same; GPUs of different kinds
         * might not, so the ranks keep what all of them can run. */
        rp_comm *host = cb->base.cfg.tp.host;
        int32_t all[RP_DECODE_STEP_TP_MAX], mine = cb->decode_step_ok;
        if (!host || host->size > RP_DECODE_STEP_TP_MAX)
            return rp_errf(err, "tensor parallelism: the one-kernel decode step needs the host comm of at most %d "
                                "ranks", RP_DECODE_STEP_TP_MAX);
        if (rp_comm_all_gather(host, &mine, all, 1, RP_COMM_F32, NULL, err)) return RP_ERR;
        for (int k = 0; k < host->size; k++) cb->decode_step_ok &= all[k];
        if (cb->decode_step_ok != mine)
            rp_log_warn("cuda: rank %d: another rank's GPU cannot run the one-kernel decode step: decode runs a "
                        "chain of kernels", cb->base.cfg.tp.rank);
    }
    return 0;
}

/* How many sequences the forward decodes as one persistent kernel: S when
 * it is S sequences of one token each, every one with logits, and
 * rp_k_decode_step takes that many on this model and device, unless this
 * forward runs the chain (cb->decode_chain: long contexts); else 0. */
int rp_cuda_decode_step_nb(const rp_cuda_backend *cb, int T, int S, int num_logits, int decode) {
    return decode && !cb->decode_chain && T == S && num_logits == S && S <= 4 &&
                   (cb->decode_step_ok >> (S == 3 ? 4 : S) & 1)
               ? S
               : 0;
}

/* Whether that kernel may pick the greedy token itself for nb sequences. */
int rp_cuda_decode_step_can_pick(const rp_cuda_backend *cb, int nb) {
    return cb->decode_step_pick && rp_decode_step_pick_ok(&cb->ds, nb, cb->num_sms);
}

/* The step of S sequences as one kernel, then the sampling kernels unless
 * the kernel picked greedily (sample == RP_SAMPLE_PICK where it can): a
 * kernel boundary after the step costs ~15 us (qwen3-0.6b 0.762 -> 0.746 ms
 * a step without the sampling kernels; bench/RESULTS.md). */
int rp_cuda_launch_decode_step(rp_cuda_backend *cb, int S, int num_logits, int sample, rp_err *err) {
    const int pick = sample == RP_SAMPLE_PICK && rp_cuda_decode_step_can_pick(cb, S);
    rp_cuda_prof_mark(cb, pick ? "decode step (one kernel, greedy pick)" : "decode step (one kernel)");
    RP_LAUNCH(rp_k_decode_step(&cb->ds, &cb->ds_tuning, S, cb->num_sms, pick, cb->stream), err);
    /* tensor parallelism: the kernel wrote the rank's logit shard, which
     * the sampling kernels need whole (a picked step's are gathered only if
     * they are read: cuda_read_logits) */
    if (cb->comm && !pick && rp_cuda_tp_gather_logits(cb, num_logits, err)) return RP_ERR;
    if (sample && !pick &&
        rp_cuda_launch_sample(cb, num_logits, RP_META(cb, cb->meta.dev, off_skip_sample, int32_t), err))
        return RP_ERR;
    rp_cuda_prof_mark(cb, NULL);
    return 0;
}

int rp_cuda_stats_get(rp_backend *b, rp_cuda_stats *out, rp_err *err) {
    const rp_cuda_backend *cb = rp_cuda_backend_of(b);
    if (!cb) return rp_errf(err, "not a CUDA backend");
    *out = (rp_cuda_stats){.decode_step_forwards = cb->decode_step_forwards,
                           .decode_step_picks = cb->decode_step_picks};
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int rp_cuda_time_decode_step(rp_backend *b, int reps, int inner, double *us, rp_err *err) {
    rp_cuda_backend *cb = rp_cuda_backend_of(b);
    if (!cb) return rp_errf(err, "the one-kernel decode step is timed on the CUDA backend only");
    const int nb = cb->last_decode_step;
    if (!nb)
        return rp_errf(err, "the last forward was not a one-kernel decode step (the model's shapes: %s)",
                       cb->decode_step_ok ? "supported" : "not supported");
    if (cb->num_pending) return rp_errf(err, "read the last forward's results first");
    float ms[64];
    if (reps < 1 || reps > 64 || inner < 1) return rp_errf(err, "bad repetition counts");
    RP_CUDA_TRY(cudaSetDevice(cb->device), err);
    /* the slots' events are free: no forward is in flight */
    cudaEvent_t e0 = cb->slots[0].ev_start, e1 = cb->slots[0].ev_end;
    const rp_decode_step_tuning *t = &cb->ds_tuning;
    for (int i = 0; i < 3; i++) RP_LAUNCH(rp_k_decode_step(&cb->ds, t, nb, cb->num_sms, 0, cb->stream), err);
    for (int r = 0; r < reps; r++) {
        RP_CUDA_TRY(cudaEventRecord(e0, cb->stream), err);
        for (int i = 0; i < inner; i++) RP_LAUNCH(rp_k_decode_step(&cb->ds, t, nb, cb->num_sms, 0, cb->stream), err);
        RP_CUDA_TRY(cudaEventRecord(e1, cb->stream), err);
        RP_CUDA_TRY(cudaEventSynchronize(e1), err);
        RP_CUDA_TRY(cudaEventElapsedTime(&ms[r], e0, e1), err);
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
    *us = ms[reps / 2] * 1000.0 / inner;
    return 0;
}

#ifdef REPLAY_DECODE_STEP_TRACE
/* Appends to a fixed buffer (the trace is written at once: tensor-parallel
 * ranks print theirs from their own threads). */
static void tr_append(char *buf, size_t cap, size_t *pos, const char *fmt, ...) {
    if (*pos >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *pos, cap - *pos, fmt, ap);
    va_end(ap);
    if (n > 0) *pos += (size_t)n < cap - *pos ? (size_t)n : cap - *pos;
}

/* Where the blocks' time went in the last one-kernel step (mean and max
 * over blocks, microseconds). */
static void print_decode_step_trace(rp_cuda_backend *cb) {
    const size_t bytes = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE * 8;
    uint64_t *h = malloc(bytes);
    if (!h || cudaMemcpy(h, cb->ds.trace, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return;
    }
    char out[4096];
    size_t pos = 0;
    if (cb->comm)
        tr_append(out, sizeof out, &pos, "decode step trace, rank %d of %d (last launch, %d blocks): mean / max\n",
                  cb->base.cfg.tp.rank, cb->base.cfg.tp.size, cb->num_sms);
    else
        tr_append(out, sizeof out, &pos, "decode step trace (last launch, %d blocks): mean / max\n", cb->num_sms);
    for (int k = 0; k < RP_DECODE_STEP_TRACE_SLOTS; k++) {
        double sum = 0, mx = 0, div = k == RP_DECODE_STEP_TRACE_SLOTS - 1 ? 1.0 : 1e3; /* the last is a count */
        for (int b = 0; b < cb->num_sms; b++) {
            double v = (double)h[b * RP_DECODE_STEP_TRACE_STRIDE + k] / div;
            sum += v;
            if (v > mx) mx = v;
        }
        tr_append(out, sizeof out, &pos, "  %-30s %10.1f %10.1f%s\n", rp_decode_step_trace_names[k], sum / cb->num_sms,
                  mx, k == RP_DECODE_STEP_TRACE_SLOTS - 1 ? "" : " us");
    }
    /* Each barrier: how far apart the blocks arrived, how long the last
     * arrival took to release the first waiter, and the work before it
     * (mean over blocks of arrival minus the previous release). */
    static const char *const kind[5] = {"after qkv", "after attention", "after o", "after gate_up", "after down"};
    const int L = cb->base.model->cfg.num_layers, nb = 5 * L < RP_DECODE_STEP_TRACE_BARRIERS ? 5 * L : 0;
    /* The fence: each block's (mean), the one of the block whose fence
     * ended last, and the release latency counted from that end. */
    double spread[5] = {0}, latency[5] = {0}, work[5] = {0}, fmean[5] = {0}, flast[5] = {0}, after[5] = {0};
    for (int k = 0; k < nb; k++) {
        uint64_t amin = UINT64_MAX, amax = 0, rmin = UINT64_MAX, fmax = 0, fl = 0;
        double w = 0, f = 0;
        for (int b = 0; b < cb->num_sms; b++) {
            const uint64_t *bt = h + (size_t)b * RP_DECODE_STEP_TRACE_STRIDE + 16,
                           fe = h[(size_t)b * RP_DECODE_STEP_TRACE_STRIDE + RP_DECODE_STEP_TRACE_FENCE + k];
            if (bt[2 * k] < amin) amin = bt[2 * k];
            if (bt[2 * k] > amax) amax = bt[2 * k];
            if (bt[2 * k + 1] < rmin) rmin = bt[2 * k + 1];
            if (k > 0) w += (double)(bt[2 * k] - bt[2 * k - 1]);
            f += (double)(fe - bt[2 * k]);
            if (fe > fmax) fmax = fe, fl = fe - bt[2 * k];
        }
        spread[k % 5] += (double)(amax - amin) / 1e3 / L;
        latency[k % 5] += ((double)rmin - (double)amax) / 1e3 / L;
        work[k % 5] += w / cb->num_sms / 1e3 / L;
        fmean[k % 5] += f / cb->num_sms / 1e3 / L;
        flast[k % 5] += (double)fl / 1e3 / L;
        after[k % 5] += ((double)rmin - (double)fmax) / 1e3 / L;
    }
    if (nb)
        tr_append(out, sizeof out, &pos,
                  "  per barrier, mean over layers (us): arrival spread / release latency / work before /"
                  " fence mean / fence of the last / release after the last fence%s\n",
                  cb->comm ? " (after o and down: the release waits for every rank's blocks)" : "");
    for (int k = 0; nb && k < 5; k++)
        tr_append(out, sizeof out, &pos, "    %-16s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", kind[k], spread[k],
                  latency[k], work[k], fmean[k], flast[k], after[k]);
    fputs(out, stderr);
    free(h);
}

/* The last one-kernel step's trace and piece timeline as raw words, for tools/step_timeline.py: "RPTL", then
 * u32 blocks, pieces per block, layers, trace stride, then the trace and
 * the timeline (kernels.h says what each holds). */
static void write_decode_step_timeline(rp_cuda_backend *cb, const char *path) {
    const size_t tr_words = (size_t)cb->num_sms * RP_DECODE_STEP_TRACE_STRIDE,
                 tl_words = (size_t)cb->num_sms * RP_DECODE_STEP_TL_PIECES * 4;
    uint64_t *h = malloc((tr_words + tl_words) * 8);
    FILE *f = NULL;
    if (!h || cudaMemcpy(h, cb->ds.trace, tr_words * 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(h + tr_words, cb->ds.timeline, tl_words * 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
        !(f = fopen(path, "wb"))) {
        rp_log_warn("cuda: the decode step timeline was not written to %s", path);
        free(h);
        return;
    }
    const uint32_t head[4] = {(uint32_t)cb->num_sms, RP_DECODE_STEP_TL_PIECES,
                              (uint32_t)cb->base.model->cfg.num_layers, RP_DECODE_STEP_TRACE_STRIDE};
    if (fwrite("RPTL", 1, 4, f) != 4 || fwrite(head, 4, 4, f) != 4 ||
        fwrite(h, 8, tr_words + tl_words, f) != tr_words + tl_words)
        rp_log_warn("cuda: writing %s failed", path);
    fclose(f);
    free(h);
}
#endif

void rp_cuda_decode_step_trace_finish(rp_cuda_backend *cb) {
#ifdef REPLAY_DECODE_STEP_TRACE
    if (!cb->ds.trace) return;
    print_decode_step_trace(cb);
    /* (under tensor parallelism rank 0's: the ranks share the path) */
    if (cb->ds.timeline && (!cb->comm || cb->base.cfg.tp.rank == 0))
        write_decode_step_timeline(cb, cb->base.cfg.trace_timeline_path);
    rp_cuda_free(cb->ds.trace);
    rp_cuda_free(cb->ds.timeline);
    cb->ds.trace = cb->ds.timeline = NULL;
#else
    (void)cb;
#endif
}
