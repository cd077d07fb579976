/* The runner (runner.h): model + backend + KV pool + page table + batch
 * builder from one config, and the fixed-batch drivers built on them. */
#include "engine/runner.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/tp_step_msg.h"
#include "dist/tp_model.h"
#include "model/config.h"
#include "util/log.h"
#include "util/rng.h"

const char *rp_runner_resolve_device(const char *device) {
    if (!device || !strcmp(device, "auto")) return rp_cuda_device_count() > 0 ? "cuda" : "cpu";
    return device;
}

/* The CPU backend's pool when none is asked for: a full batch of full
 * contexts (fp32 K and V, or e4m3 bytes), capped at a quarter of the free
 * memory, and never less than one whole context. */
static int cpu_auto_pages(const rp_model_config *c, int max_seqs, int max_context, int page_size,
                          double memory_ratio, rp_kv_dtype kv_dtype) {
    /* the CPU holds a bf16 cache as fp32: twice the GPU's bytes */
    double per_token = (double)rp_kv_page_bytes(c, 1, kv_dtype) * (kv_dtype == RP_KV_FP8 ? 1 : 2);
    long pages_avail = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    double avail = pages_avail > 0 && page_bytes > 0 ? (double)pages_avail * page_bytes : 4e9;
    double want = (double)max_seqs * max_context * per_token;
    double cap = avail * 0.25 * memory_ratio;
    double bytes = want < cap ? want : cap;
    int pages = (int)(bytes / per_token / page_size);
    int min_pages = (max_context + page_size - 1) / page_size;
    return pages < min_pages ? min_pages : pages;
}

static int load_model(rp_runner *r, const rp_runner_config *cfg, rp_err *err) {
    if (cfg->model) {
        r->model = (rp_model *)cfg->model;
        return RP_OK;
    }
    if ((!cfg->model_dir) == (!cfg->dummy_name))
        return rp_errf(err, "give exactly one of a model directory or a dummy model name");
    rp_load_options lo = {.format = cfg->load_dummy ? RP_LOAD_DUMMY : RP_LOAD_AUTO, .seed = cfg->weight_seed,
                          .progress = cfg->load_progress, .lazy_dummy = !strcmp(r->device, "cuda"), .quantize_fp8 = cfg->quantize_fp8};
    double t0 = rp_now_s();
    r->model = cfg->model_dir ? rp_model_load(cfg->model_dir, &lo, err) : rp_model_dummy(cfg->dummy_name, &lo, err);
    if (!r->model) return RP_ERR;
    r->owns_model = 1;
    const rp_model_config *c = &r->model->cfg;
    rp_log_info("model: %s, %d layers, hidden %d, %d heads (%d kv) x %d, vocab %d, %.2fB params, loaded in %.2fs",
                c->arch_name, c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim,
                c->vocab_size, (double)rp_config_num_params(c) / 1e9, rp_now_s() - t0);
    return RP_OK;
}

/* ---- tensor parallelism ------------------------------------------------- */

static int tp_size(const rp_runner_config *cfg) {
    return cfg->tensor_parallel_size > 1 ? cfg->tensor_parallel_size : 1;
}

/* Only the config of a checkpoint, as the engine's model under tensor
 * parallelism: the weights are read by each rank, its slices only. */
static rp_model *config_only_model(const char *dir, rp_err *err) {
    rp_model *m = calloc(1, sizeof *m);
    if (!m) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    if (rp_config_load_dir(&m->cfg, dir, err) || !(m->dir = strdup(dir))) {
        if (!m->dir && err && !err->msg[0]) rp_errf(err, "out of memory");
        rp_model_free(m);
        return NULL;
    }
    return m;
}

/* The plan, the node layout, the bootstrap (several nodes) and this node's
 * shards: the whole model's config in r->model, each local rank's shard in
 * r->shards. Dummy weights are made whole on the host and sliced (the GPU's
 * lazy generation makes whole tensors); a checkpoint is read slice by
 * slice (dist/tp_model.h). */
static int tp_load(rp_runner *r, const rp_runner_config *cfg, rp_err *err) {
    const int N = tp_size(cfg), nnodes = cfg->nnodes > 1 ? cfg->nnodes : 1;
    rp_model_config full;
    if (cfg->model) full = cfg->model->cfg;
    else if (cfg->model_dir) {
        if (rp_config_load_dir(&full, cfg->model_dir, err)) return RP_ERR;
    } else if (!cfg->dummy_name || rp_config_preset(&full, cfg->dummy_name, err))
        return cfg->dummy_name ? RP_ERR : rp_errf(err, "give exactly one of a model directory or a dummy model name");
    r->tp_plan = calloc(1, sizeof *r->tp_plan);
    if (!r->tp_plan) return rp_errf(err, "out of memory");
    if (rp_tp_plan_make(r->tp_plan, &full, N, err)) return RP_ERR;
    if (N % nnodes) return rp_errp(err, "nnodes", "--nnodes %d does not divide --tensor-parallel-size %d", nnodes, N);
    const int gpn = N / nnodes;
    r->node_rank = nnodes > 1 ? cfg->node_rank : 0;
    if (r->node_rank < 0 || r->node_rank >= nnodes)
        return rp_errp(err, "node_rank", "--node-rank %d with --nnodes %d (0..%d)", r->node_rank, nnodes, nnodes - 1);
    if (nnodes > 1 && strcmp(r->device, "cuda"))
        return rp_errp(err, "nnodes", "tensor parallelism over several nodes runs on GPUs (--device cuda)");
    /* the model: borrowed, dummy (made whole on the host for the CPU; on
     * GPUs each rank generates its slice, nothing whole), or its config only */
    const int dummy = !cfg->model && (cfg->dummy_name || cfg->load_dummy);
    const int lazy = dummy && !strcmp(r->device, "cuda");
    if (cfg->model) r->model = (rp_model *)cfg->model;
    else if (dummy) {
        rp_load_options lo = {.format = cfg->load_dummy ? RP_LOAD_DUMMY : RP_LOAD_AUTO, .seed = cfg->weight_seed,
                              .progress = cfg->load_progress, .lazy_dummy = lazy, .quantize_fp8 = cfg->quantize_fp8};
        r->model = cfg->model_dir ? rp_model_load(cfg->model_dir, &lo, err) : rp_model_dummy(cfg->dummy_name, &lo, err);
        r->owns_model = 1;
    } else {
        r->model = config_only_model(cfg->model_dir, err);
        r->owns_model = 1;
    }
    if (!r->model) return RP_ERR;
    double t0 = rp_now_s();
    for (int i = 0; i < gpn; i++) {
        int rank = r->node_rank * gpn + i;
        r->shards[i] = lazy ? rp_tp_model_lazy_dummy(r->tp_plan, rank, r->model->dummy_seed, r->model->fp8, err)
                       : cfg->model || dummy
                           ? rp_tp_model_slice(r->model, r->tp_plan, rank, err)
                           : rp_tp_model_load(cfg->model_dir, r->tp_plan, rank, (rp_fp8_layout)cfg->quantize_fp8, err);
        if (!r->shards[i]) return rp_err_wrap(err, "tensor-parallel rank %d's shard", rank);
        r->num_shards = i + 1;
    }
    /* the config-only model's bytes: what the ranks hold (bandwidth figures) */
    if (!cfg->model && !dummy) {
        r->model->weight_bytes = 0;
        for (int i = 0; i < gpn; i++) r->model->weight_bytes += r->shards[i]->weight_bytes * (uint64_t)nnodes;
    }
    const rp_model_config *c = &r->model->cfg;
    rp_log_info("model: %s, %d layers, hidden %d, %d heads (%d kv) x %d, vocab %d; tensor parallel over %d ranks "
                "(%d query heads, %d kv heads, %d MLP columns and %lld vocabulary rows each), this node's %d "
                "shards made in %.2fs",
                c->arch_name, c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads, c->head_dim,
                c->vocab_size, N, r->tp_plan->q_heads_per_rank, r->tp_plan->kv_heads_per_rank,
                r->tp_plan->inter_per_rank, (long long)r->tp_plan->vocab_per_rank, gpn, rp_now_s() - t0);
    return RP_OK;
}

/* Several nodes: node 0 serves NCCL's unique id and keeps a link to every
 * other node; the others fetch it and keep their link to node 0. */
static int tp_bootstrap(rp_runner *r, const rp_runner_config *cfg, uint8_t id[RP_COMM_UNIQUE_ID_BYTES], rp_err *err) {
    const int nnodes = cfg->nnodes > 1 ? cfg->nnodes : 1;
    if (nnodes == 1) return strcmp(r->device, "cuda") || cfg->tp_one_gpu ? 0 : rp_comm_nccl_unique_id(id, err);
    if (!cfg->dist_init_addr) return rp_errp(err, "dist_init_addr", "--nnodes %d needs --dist-init-addr HOST:PORT", nnodes);
    char host[256];
    int port = 0;
    if (rp_bs_parse_addr(cfg->dist_init_addr, host, sizeof host, &port, err)) return RP_ERR;
    rp_bs_world w = {.nnodes = nnodes, .gpus_per_node = r->tp_plan->size / nnodes, .node_rank = r->node_rank,
                     .fingerprint = rp_tp_fingerprint(&r->model->cfg, r->tp_plan->size)};
    if (rp_bs_world_check(&w, err)) return RP_ERR;
    const int timeout_ms = r->dist_timeout_ms > RP_TP_SETUP_TIMEOUT_MS ? r->dist_timeout_ms : RP_TP_SETUP_TIMEOUT_MS;
    rp_bs_transport *t = rp_bs_tcp_new(err);
    if (!t) return RP_ERR;
    int rc;
    if (r->node_rank == 0) {
        int bound = 0;
        rc = rp_comm_nccl_unique_id(id, err);
        if (!rc) rc = t->listen(t, host, port, &bound, err);
        if (!rc) {
            rp_log_info("tensor parallel: node 0 waiting for %d node(s) at %s", nnodes - 1, cfg->dist_init_addr);
            rc = rp_bootstrap_serve(t, cfg->dist_init_addr, &w, id, timeout_ms, r->links, err);
        }
    } else {
        rc = rp_bootstrap_join(t, host, port, &w, timeout_ms, id, &r->link, err);
    }
    t->destroy(t);
    return rc;
}

rp_runner *rp_runner_new(const rp_runner_config *cfg, rp_err *err) {
    rp_runner *r = calloc(1, sizeof *r);
    if (!r) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    r->device = rp_runner_resolve_device(cfg->device);
    if (strcmp(r->device, "cpu") && strcmp(r->device, "cuda")) {
        rp_errf(err, "unknown device '%s' (auto, cpu or cuda)", r->device);
        goto fail;
    }
    r->link = -1;
    for (int k = 0; k < RP_BS_MAX_NODES; k++) r->links[k] = -1;
    r->dist_timeout_ms = cfg->dist_timeout_ms > 0 ? cfg->dist_timeout_ms : RP_TP_STEP_TIMEOUT_MS;
    if (tp_size(cfg) > 1 ? tp_load(r, cfg, err) : load_model(r, cfg, err)) goto fail;
    const rp_model_config *c = &r->model->cfg;
    const int page_size = cfg->page_size > 0 ? cfg->page_size : 16;
    const double memory_ratio = cfg->memory_ratio > 0 && cfg->memory_ratio <= 1 ? cfg->memory_ratio : 0.9;
    r->max_seqs = cfg->max_seqs > 0 ? cfg->max_seqs : 1;
    r->max_logit_rows = cfg->max_logit_rows > 0 ? cfg->max_logit_rows : r->max_seqs;
    int max_batched = cfg->max_batched_tokens > 0 ? cfg->max_batched_tokens : 8192;
    if (max_batched < r->max_seqs) max_batched = r->max_seqs; /* a decode step of every sequence fits */
    r->max_context = cfg->max_context > 0 && cfg->max_context < c->max_position_embeddings
                         ? cfg->max_context
                         : c->max_position_embeddings;
    if (rp_config_check_context(c, r->max_context, err)) goto fail;
    const int use_cuda = !strcmp(r->device, "cuda");
    r->kv_dtype = rp_kv_dtype_resolve(cfg->kv_dtype, c);
    int num_pages = cfg->num_pages > 0 ? cfg->num_pages
                    : use_cuda         ? 0
                                       : cpu_auto_pages(c, r->max_seqs, r->max_context, page_size, memory_ratio,
                                                        r->kv_dtype);
    rp_backend_config bc = {.num_pages = num_pages, .memory_ratio = memory_ratio, .reserve_bytes = cfg->reserve_bytes,
                            .shadow_page_bytes = cfg->shadow_page_bytes, .page_size = page_size,
                            .kv_dtype = r->kv_dtype,
                            .max_batched_tokens = max_batched, .max_batch_seqs = r->max_seqs,
                            .max_logit_rows = r->max_logit_rows, .num_threads = cfg->threads,
                            .disable_cuda_graph = cfg->disable_cuda_graph, .cuda_graph_max_bs = cfg->cuda_graph_max_bs,
                            .num_cuda_graph_bs = cfg->num_cuda_graph_bs, .profile = cfg->profile,
                            .tuning = cfg->tuning, .trace_timeline_path = cfg->trace_timeline_path};
    if (cfg->num_cuda_graph_bs > 0) memcpy(bc.cuda_graph_bs, cfg->cuda_graph_bs, sizeof bc.cuda_graph_bs);
    bc.device_id = cfg->device_id;
    if (r->tp_plan) {
        uint8_t id[RP_COMM_UNIQUE_ID_BYTES] = {0};
        if (tp_bootstrap(r, cfg, id, err)) goto fail;
        int links[RP_BS_MAX_NODES], num_links = 0;
        for (int k = 1; k < RP_BS_MAX_NODES; k++)
            if (r->links[k] >= 0) links[num_links++] = r->links[k];
        rp_tp_backend_config tc = {.device = r->device, .plan = r->tp_plan, .shards = r->shards,
                                   .ranks = r->num_shards, .rank_offset = r->node_rank * r->num_shards,
                                   .nccl_id = id, .links = links, .num_links = num_links,
                                   .node0_link = r->link >= 0 ? &r->link : NULL,
                                   .step_timeout_ms = r->dist_timeout_ms,
                                   .one_gpu = cfg->tp_one_gpu,
                                   .disable_custom_all_reduce = cfg->disable_custom_all_reduce};
        r->backend = rp_backend_tp_new(r->model, &tc, &bc, err);
    } else
        r->backend = use_cuda ? rp_backend_cuda_new(r->model, &bc, err) : rp_backend_cpu_new(r->model, &bc, err);
    if (!r->backend) {
        rp_err_wrap(err, "%s backend", r->device);
        goto fail;
    }
    num_pages = r->backend->cfg.num_pages; /* the backend sized it when asked to */
    if (r->kv_dtype == RP_KV_FP8) {
        if (r->model->kv_scales_loaded)
            rp_log_info("KV cache: fp8_e4m3 with the checkpoint's k/v scales, %ld tokens (%d pages x %d)",
                        (long)num_pages * page_size, num_pages, page_size);
        else
            rp_log_info("KV cache: fp8_e4m3 with k/v scales of 1 (the checkpoint has none), %ld tokens (%d pages x "
                        "%d)",
                        (long)num_pages * page_size, num_pages, page_size);
    } else {
        rp_log_info("KV cache: bf16%s, %ld tokens (%d pages x %d)", use_cuda ? "" : " (fp32 on the CPU)",
                    (long)num_pages * page_size, num_pages, page_size);
    }
    /* One sequence must always fit the pool, or preemption could not
     * guarantee progress (vLLM refuses to start in that case; replay
     * shortens the context and says so). */
    if ((long)num_pages * page_size < r->max_context) {
        rp_log_warn("the KV cache holds %d tokens, less than the context of %d: sequences are limited to %d",
                    num_pages * page_size, r->max_context, num_pages * page_size);
        r->max_context = num_pages * page_size;
    }
    r->pool = rp_page_pool_new(num_pages, page_size);
    r->table = r->pool ? rp_page_table_new(r->pool, r->max_seqs, r->max_context) : NULL;
    r->bb = r->table ? rp_batch_builder_new(r->table, max_batched, r->max_seqs, r->max_logit_rows) : NULL;
    r->sample = calloc((size_t)r->max_logit_rows, sizeof *r->sample);
    r->tokens = calloc((size_t)r->max_logit_rows, sizeof *r->tokens);
    r->logits = malloc((size_t)r->max_logit_rows * c->vocab_size * sizeof *r->logits);
    if (!r->bb || !r->sample || !r->tokens || !r->logits) {
        rp_errf(err, "out of memory setting up the KV cache and batch buffers");
        goto fail;
    }
    return r;
fail:
    rp_runner_free(r);
    return NULL;
}

void rp_runner_free(rp_runner *r) {
    if (!r) return;
    free(r->sample);
    free(r->tokens);
    free(r->logits);
    rp_batch_builder_free(r->bb);
    rp_page_table_free(r->table);
    rp_page_pool_free(r->pool);
    rp_backend_destroy(r->backend);
    for (int i = 0; i < r->num_shards; i++) rp_model_free(r->shards[i]);
    for (int k = 0; k < RP_BS_MAX_NODES; k++)
        if (r->links[k] >= 0) close(r->links[k]);
    if (r->link >= 0) close(r->link);
    free(r->tp_plan);
    if (r->owns_model) rp_model_free(r->model);
    free(r);
}

int rp_engine_worker_run(rp_runner *r, rp_err *err) {
    if (r->link < 0) return rp_errf(err, "this node has no link to node 0");
    rp_backend *be = r->backend;
    const int L = r->max_logit_rows, S = r->max_seqs, T = be->cfg.max_batched_tokens;
    const rp_model_config *c = &r->model->cfg;
    const int max_stride = (c->max_position_embeddings + be->cfg.page_size - 1) / be->cfg.page_size + 1;
    rp_step_decoder d;
    if (rp_step_decoder_init(&d, T, S, L, max_stride, c->vocab_size, err)) return RP_ERR;
    /* the largest message these limits allow (tp_step_msg.h's layout):
     * a forward's, or sampling with L masks */
    size_t cap = 16 + 28 + (size_t)T * 12 + (size_t)(S + 1) * 4 + (size_t)S * 8 + (size_t)S * max_stride * 4 +
                 (size_t)L * (4 + 56);
    const size_t masks_cap = 16 + 8 + (size_t)L * 4 + (size_t)L * d.mask_words * 4;
    if (masks_cap > cap) cap = masks_cap;
    uint8_t *msg = malloc(cap);
    float *logprobs = malloc((size_t)L * sizeof *logprobs);
    rp_top_logprobs *top = malloc((size_t)L * sizeof *top);
    int rc = msg && logprobs && top ? 0 : rp_errf(err, "out of memory");
    rp_log_info("tensor parallel: node %d running node 0's steps", r->node_rank);
    while (!rc) {
        size_t n = 0;
        /* node 0 pings an idle link every quarter of the timeout */
        rc = rp_bs_recv_msg(r->link, msg, cap, &n, r->dist_timeout_ms, err);
        if (rc == RP_BS_TIMEOUT) {
            rc = rp_errf(err, "node 0 sent nothing for %.1f s, not even a ping: node 0 is stuck, or the network "
                              "between the nodes is down (--dist-timeout sets the limit)",
                         r->dist_timeout_ms / 1e3);
            break;
        }
        if (rc) {
            rp_err_wrap(err, "node 0's link ended without a shutdown (node 0 exited abnormally or was killed)");
            break;
        }
        rp_step_op op;
        int arg = 0;
        rp_batch bt;
        if ((rc = rp_step_msg_decode(&d, msg, n, &op, &arg, &bt, err))) break;
        switch (op) {
        case RP_STEP_FORWARD: rc = rp_backend_forward(be, &bt, err); break;
        case RP_STEP_READ_TOKENS: rc = be->ops->read_tokens(be, r->tokens, logprobs, top, err); break;
        case RP_STEP_READ_LOGITS: rc = rp_backend_read_logits(be, r->logits, err); break;
        case RP_STEP_SAMPLE_MASKED:
            rc = be->ops->sample_masked ? be->ops->sample_masked(be, d.masks, arg, d.mask_of_row, err)
                                        : rp_errf(err, "node 0 sampled with token masks, which this node's backend "
                                                       "cannot do");
            break;
        case RP_STEP_SET_GRAPHS:
            if (be->ops->set_graphs) be->ops->set_graphs(be, arg);
            break;
        case RP_STEP_PING: break;
        case RP_STEP_ABORT:
            rc = rp_errf(err, "node 0 failed: %s", d.reason);
            break;
        case RP_STEP_SHUTDOWN:
            rp_log_info("tensor parallel: node 0 shut down; node %d stops", r->node_rank);
            goto done;
        }
    }
done:
    free(msg);
    free(logprobs);
    free(top);
    rp_step_decoder_free(&d);
    return rc;
}

/* ---- fixed-batch drivers ------------------------------------------------ */

int rp_runner_seqs_begin(rp_runner *r, rp_runner_seq *seqs, int B, rp_err *err) {
    if (B > r->max_seqs || B > r->max_logit_rows)
        return rp_errf(err, "a batch of %d sequences does not fit this runner (%d)", B, r->max_seqs);
    for (int s = 0; s < B; s++) {
        seqs[s] = (rp_runner_seq){.row = rp_page_table_acquire_row(r->table)};
        if (seqs[s].row < 0) {
            rp_runner_seqs_end(r, seqs, s);
            return rp_errf(err, "no page-table row left");
        }
    }
    return RP_OK;
}

void rp_runner_seqs_end(rp_runner *r, rp_runner_seq *seqs, int B) {
    for (int s = 0; s < B; s++) rp_page_table_release_row(r->table, seqs[s].row);
}

int rp_runner_prefill_random(rp_runner *r, rp_runner_seq *seqs, int B, int ctx, double *seconds, rp_err *err) {
    rp_backend *be = r->backend;
    rp_batch_builder *bb = r->bb;
    const int vocab = r->model->cfg.vocab_size;
    int32_t *prompt = malloc((size_t)ctx * sizeof *prompt);
    if (!prompt) return rp_errf(err, "out of memory");
    memset(r->sample, 0, (size_t)r->max_logit_rows * sizeof *r->sample); /* greedy */
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
            if ((rc = rp_page_table_reserve(r->table, seqs[s].row, done_in_seq + n, err))) break;
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
        /* every forward is read, a chunk with no logits too (zero tokens):
         * the backend holds at most two unread forwards, and a prompt longer
         * than two steps' budget would otherwise leave three */
        bt->sample = be->ops->read_tokens ? r->sample : NULL;
        if ((rc = rp_backend_forward(be, bt, err))) break;
        if (bt->sample) {
            if ((rc = be->ops->read_tokens(be, r->tokens, NULL, NULL, err))) break;
            int k = 0;
            for (int q = first_seq; q < s; q++) seqs[q].last = r->tokens[k++];
        } else {
            /* no device sampling: token 1 is the next input; its value does not matter here */
            for (int q = first_seq; q < s; q++) seqs[q].last = 1;
        }
    }
    for (int q = 0; q < B; q++) seqs[q].len = ctx;
    *seconds = rp_now_s() - t0;
    free(prompt);
    return rc;
}

static double last_gpu_ms(rp_backend *be);

int rp_runner_chunk_step(rp_runner *r, rp_runner_seq *seqs, int B, int n, double *wall_ms, double *gpu_ms,
                         rp_err *err) {
    rp_backend *be = r->backend;
    int32_t *chunk = malloc((size_t)n * sizeof *chunk);
    if (!chunk) return rp_errf(err, "out of memory");
    const int vocab = r->model->cfg.vocab_size;
    memset(r->sample, 0, (size_t)r->max_logit_rows * sizeof *r->sample); /* greedy */
    int rc = 0;
    rp_batch_begin(r->bb);
    for (int s = 0; s < B && !rc; s++) {
        for (int i = 0; i < n; i++)
            chunk[i] = (int32_t)(rp_rand_u64(2, (uint64_t)s, (uint64_t)(seqs[s].len + i)) % (uint64_t)vocab);
        if ((rc = rp_page_table_reserve(r->table, seqs[s].row, seqs[s].len + n, err))) break;
        if (rp_batch_add(r->bb, seqs[s].row, chunk, n, seqs[s].len, 1) < 0)
            rc = rp_errf(err, "a chunk step of %d x %d tokens does not fit the step's budget", B, n);
    }
    free(chunk);
    if (rc) return rc;
    rp_batch *bt = rp_batch_finish(r->bb);
    bt->sample = be->ops->read_tokens ? r->sample : NULL;
    const double t0 = rp_now_s();
    if ((rc = rp_backend_forward(be, bt, err))) return rc;
    rc = bt->sample ? be->ops->read_tokens(be, r->tokens, NULL, NULL, err) : rp_backend_read_logits(be, r->logits, err);
    *wall_ms = (rp_now_s() - t0) * 1e3;
    *gpu_ms = last_gpu_ms(be);
    return rc;
}

/* One decode batch: a token per sequence at its current length, the input
 * seqs[s].last or, when refs is not NULL, refs[s]. NULL on error. */
static rp_batch *decode_batch(rp_runner *r, rp_runner_seq *seqs, int B, const int32_t *refs, rp_err *err) {
    rp_batch_begin(r->bb);
    for (int s = 0; s < B; s++) {
        if (rp_page_table_reserve(r->table, seqs[s].row, seqs[s].len + 1, err)) return NULL;
        if (rp_batch_add(r->bb, seqs[s].row, refs ? &refs[s] : &seqs[s].last, 1, seqs[s].len, 1) < 0) {
            rp_errf(err, "decode batch of %d does not fit", B);
            return NULL;
        }
    }
    return rp_batch_finish(r->bb);
}

/* Each sequence's sampling parameters for its next token: *sp (NULL:
 * greedy), seeded by the sequence and counted by its length, as the engine
 * does. */
static void step_params(rp_sampling_params *out, const rp_sampling_params *sp, const rp_runner_seq *seqs, int B) {
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

static double last_gpu_ms(rp_backend *be) {
    rp_backend_stats st = {0};
    if (be->ops->stats) be->ops->stats(be, &st);
    return st.last_gpu_ms;
}

int rp_runner_decode_steps(rp_runner *r, rp_runner_seq *seqs, int B, int steps, const rp_sampling_params *sp,
                           double *wall_ms, double *gpu_ms, rp_err *err) {
    rp_backend *be = r->backend;
    if (B > r->max_logit_rows) return rp_errf(err, "decode batch of %d does not fit", B);
    for (int it = 0; it < steps; it++) {
        double t0 = rp_now_s();
        rp_batch *bt = decode_batch(r, seqs, B, NULL, err);
        if (!bt) return RP_ERR;
        step_params(r->sample, sp, seqs, B);
        if (be->ops->read_tokens) bt->sample = r->sample;
        if (rp_backend_forward(be, bt, err)) return RP_ERR;
        if (be->ops->read_tokens) {
            if (be->ops->read_tokens(be, r->tokens, NULL, NULL, err)) return RP_ERR;
        } else {
            if (rp_backend_read_logits(be, r->logits, err)) return RP_ERR;
            for (int s = 0; s < B; s++) r->tokens[s] = 1;
        }
        for (int s = 0; s < B; s++) {
            seqs[s].last = r->tokens[s];
            seqs[s].len++;
        }
        wall_ms[it] = (rp_now_s() - t0) * 1e3;
        gpu_ms[it] = last_gpu_ms(be);
    }
    return RP_OK;
}

int rp_runner_can_overlap(const rp_runner *r) {
    return r->backend->supports_token_refs && r->backend->ops->read_tokens;
}

int rp_runner_decode_overlapped(rp_runner *r, rp_runner_seq *seqs, int B, int steps, const rp_sampling_params *sp,
                                double *wall_ms, double *gpu_ms, rp_err *err) {
    rp_backend *be = r->backend;
    if (!rp_runner_can_overlap(r)) return rp_errf(err, "this backend cannot overlap steps");
    if (B > r->max_logit_rows) return rp_errf(err, "decode batch of %d does not fit", B);
    int32_t *refs = malloc((size_t)B * sizeof *refs);
    if (!refs) return rp_errf(err, "out of memory");
    for (int s = 0; s < B; s++) refs[s] = -(s + 1); /* sequence s samples logit row s */
    int rc = RP_OK;
    double prev = rp_now_s();
    for (int it = 0; it <= steps && !rc; it++) {
        if (it < steps) {
            rp_batch *bt = decode_batch(r, seqs, B, it ? refs : NULL, err);
            if (!bt) {
                rc = RP_ERR;
                break;
            }
            step_params(r->sample, sp, seqs, B);
            bt->sample = r->sample;
            if ((rc = rp_backend_forward(be, bt, err))) break;
            for (int s = 0; s < B; s++) seqs[s].len++;
        }
        if (it == 0) continue;
        /* the older of the two steps in flight: step it - 1 */
        if ((rc = be->ops->read_tokens(be, r->tokens, NULL, NULL, err))) break;
        const double now = rp_now_s();
        wall_ms[it - 1] = (now - prev) * 1e3;
        prev = now;
        gpu_ms[it - 1] = last_gpu_ms(be);
    }
    if (!rc)
        for (int s = 0; s < B; s++) seqs[s].last = r->tokens[s];
    free(refs);
    return rc;
}

/* Index of the largest logit (the lower id on a tie), as the greedy sampler picks. */
static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int rp_runner_forward_greedy(rp_runner *r, rp_batch *bt, int rows, int32_t *tok, rp_err *err) {
    rp_backend *be = r->backend;
    const int device = be->ops->read_tokens != NULL && rows > 0;
    if (device) {
        for (int i = 0; i < rows; i++) r->sample[i] = (rp_sampling_params){.top_p = 1.0f};
        bt->sample = r->sample;
    }
    if (rp_backend_forward(be, bt, err)) return RP_ERR;
    if (device) return be->ops->read_tokens(be, tok, NULL, NULL, err);
    if (rp_backend_read_logits(be, r->logits, err)) return RP_ERR;
    const int vocab = r->model->cfg.vocab_size;
    for (int i = 0; i < rows; i++) tok[i] = argmax(r->logits + (size_t)i * vocab, vocab);
    return RP_OK;
}

int rp_runner_verify_step(rp_runner *r, const rp_runner_seq *seqs, int B, int k, const int *ks, const int32_t *drafts,
                          int32_t *out, double *wall_ms, double *gpu_ms, rp_err *err) {
    if (B * (k + 1) > r->max_logit_rows || k > 16) return rp_errf(err, "a verify step of %d x %d does not fit", B, k + 1);
    const double t0 = rp_now_s();
    int32_t fed[17], *got = malloc((size_t)B * (k + 1) * sizeof *got);
    int *row = malloc((size_t)B * sizeof *row);
    int rc = RP_OK, rows = 0;
    if (!got || !row) rc = rp_errf(err, "out of memory");
    rp_batch_begin(r->bb);
    for (int s = 0; s < B && !rc; s++) {
        const int n = (ks ? ks[s] : k) + 1;
        fed[0] = seqs[s].last;
        memcpy(fed + 1, drafts + (size_t)s * k, (size_t)(n - 1) * sizeof *fed);
        if ((rc = rp_page_table_reserve(r->table, seqs[s].row, seqs[s].len + n, err))) break;
        if ((row[s] = rp_batch_add_positions(r->bb, seqs[s].row, fed, n, seqs[s].len)) < 0)
            rc = rp_errf(err, "a verify step of %d x %d does not fit the step's budget", B, k + 1);
        rows += n;
    }
    if (!rc) rc = rp_runner_forward_greedy(r, rp_batch_finish(r->bb), rows, got, err);
    for (int s = 0; s < B && !rc; s++)
        memcpy(out + (size_t)s * (k + 1), got + row[s], (size_t)((ks ? ks[s] : k) + 1) * sizeof *out);
    free(got);
    free(row);
    *wall_ms = (rp_now_s() - t0) * 1e3;
    *gpu_ms = last_gpu_ms(r->backend);
    return rc;
}

int rp_runner_forced_decode(rp_runner *r, const int32_t *ids, int n, const int32_t *forced, int steps, float *logits,
                            rp_err *err) {
    const int vocab = r->model->cfg.vocab_size;
    if (n < 1 || steps < 0 || n + steps > r->max_context)
        return rp_errf(err, "%d prompt tokens and %d steps in a context of %d", n, steps, r->max_context);
    for (int i = 0; i < n + steps; i++) {
        const int32_t t = i < n ? ids[i] : forced[i - n];
        if (t < 0 || t >= vocab) return rp_errf(err, "token id %d is outside the vocabulary (0..%d)", t, vocab - 1);
    }
    rp_runner_seq seq;
    memset(&seq, 0, sizeof seq);
    if (rp_runner_seqs_begin(r, &seq, 1, err)) return RP_ERR;
    int rc = RP_OK;
    /* the prompt in chunks, no logits */
    for (int done = 0; !rc && done < n;) {
        rp_batch_begin(r->bb);
        int k = n - done, room = rp_batch_tokens_left(r->bb);
        if (k > room) k = room;
        if ((rc = rp_page_table_reserve(r->table, seq.row, done + k, err))) break;
        if (rp_batch_add(r->bb, seq.row, ids + done, k, done, 0) < 0) {
            rc = rp_errf(err, "a prompt chunk of %d does not fit", k);
            break;
        }
        if ((rc = rp_backend_forward(r->backend, rp_batch_finish(r->bb), err)) ||
            (rc = rp_backend_read_logits(r->backend, r->logits, err)))
            break;
        done += k;
    }
    seq.len = n;
    for (int k = 0; !rc && k < steps; k++) {
        seq.last = forced[k];
        rp_batch *bt = decode_batch(r, &seq, 1, NULL, err);
        if (!bt || (rc = rp_backend_forward(r->backend, bt, err)) ||
            (rc = rp_backend_read_logits(r->backend, r->logits, err))) {
            rc = RP_ERR;
            break;
        }
        memcpy(logits + (size_t)k * vocab, r->logits, (size_t)vocab * sizeof *logits);
        seq.len++;
    }
    rp_runner_seqs_end(r, &seq, 1);
    return rc;
}

int rp_runner_run_prompts(rp_runner *r, int num_prompts, const int32_t *const *ids, const int *n, float *const *logits,
                          int steps, int32_t *tokens, rp_err *err) {
    const int vocab = r->model->cfg.vocab_size;
    for (int p = 0; p < num_prompts; p++) {
        if (n[p] < 1) return rp_errf(err, "prompt %d is empty", p);
        if (n[p] + steps > r->max_context)
            return rp_errf(err, "prompt %d: %d tokens and %d more exceed the context of %d", p, n[p], steps,
                           r->max_context);
        for (int i = 0; i < n[p]; i++)
            if (ids[p][i] < 0 || ids[p][i] >= vocab)
                return rp_errf(err, "token id %d is outside the vocabulary (0..%d)", ids[p][i], vocab - 1);
    }
    if (steps > 0 && !tokens) return rp_errf(err, "no room for the generated tokens");
    rp_runner_seq *seqs = calloc((size_t)num_prompts, sizeof *seqs);
    int *done = calloc((size_t)num_prompts, sizeof *done), *fed = calloc((size_t)num_prompts, sizeof *fed);
    int32_t *tok = calloc((size_t)r->max_logit_rows, sizeof *tok);
    int rc = !seqs || !done || !fed || !tok ? rp_errf(err, "out of memory") : RP_OK;
    if (rc || (rc = rp_runner_seqs_begin(r, seqs, num_prompts, err))) goto out;
    /* Prefill: each step takes the next chunk of every unfinished prompt, in
     * order, while the batch has tokens and logit rows left. */
    for (int left = num_prompts; !rc && left > 0;) {
        rp_batch_begin(r->bb);
        int rows = 0;
        for (int p = 0; p < num_prompts && !rc; p++) {
            fed[p] = 0;
            int k = n[p] - done[p], room = rp_batch_tokens_left(r->bb);
            if (k > room) k = room;
            if (logits && k > r->max_logit_rows - rows) k = r->max_logit_rows - rows;
            const int ends = done[p] + k == n[p], mode = logits ? 2 : ends && steps > 0 ? 1 : 0;
            if (k <= 0 || (mode == 1 && rows == r->max_logit_rows)) continue;
            if ((rc = rp_page_table_reserve(r->table, seqs[p].row, done[p] + k, err))) break;
            if (rp_batch_add(r->bb, seqs[p].row, ids[p] + done[p], k, done[p], mode) < 0) break;
            fed[p] = k;
            rows += mode == 2 ? k : mode;
        }
        if (rc) break;
        rp_batch *bt = rp_batch_finish(r->bb);
        if (logits) {
            if ((rc = rp_backend_forward(r->backend, bt, err)) || (rc = rp_backend_read_logits(r->backend, r->logits, err)))
                break;
        } else if ((rc = rp_runner_forward_greedy(r, bt, rows, tok, err))) {
            break;
        }
        int row = 0;
        for (int p = 0; p < num_prompts; p++) {
            if (!fed[p]) continue;
            if (logits) memcpy(logits[p] + (size_t)done[p] * vocab, r->logits + (size_t)row * vocab,
                               (size_t)fed[p] * vocab * sizeof *r->logits);
            done[p] += fed[p];
            row += logits ? fed[p] : done[p] == n[p] && steps > 0;
            if (done[p] < n[p]) continue;
            left--;
            seqs[p].len = n[p];
            if (steps > 0) /* the first generated token: the last prompt position's */
                tokens[(size_t)p * steps] = logits ? argmax(logits[p] + (size_t)(n[p] - 1) * vocab, vocab) : tok[row - 1];
        }
    }
    /* Decode: every sequence together, one greedy token per step. */
    for (int it = 1; it < steps && !rc; it++) {
        for (int p = 0; p < num_prompts; p++) seqs[p].last = tokens[(size_t)p * steps + it - 1];
        rp_batch *bt = decode_batch(r, seqs, num_prompts, NULL, err);
        if (!bt || (rc = rp_runner_forward_greedy(r, bt, num_prompts, tok, err))) {
            rc = RP_ERR;
            break;
        }
        for (int p = 0; p < num_prompts; p++) {
            tokens[(size_t)p * steps + it] = tok[p];
            seqs[p].len++;
        }
    }
    rp_runner_seqs_end(r, seqs, num_prompts);
out:
    free(seqs);
    free(done);
    free(fed);
    free(tok);
    return rc;
}
