/* The tensor-parallel rank layout (tp_plan.h): the checks that refuse a
 * model and N that do not fit, each rank's heads, MLP columns and
 * vocabulary rows, and every weight's slice. */
#include "dist/tp_plan.h"

#include <string.h>

int rp_tp_size_check(int size, rp_err *err) {
    if (size == 1 || size == 2 || size == 4 || size == 8) return 0;
    return rp_errp(err, "tensor_parallel_size", "--tensor-parallel-size %d is not supported (1, 2, 4 or 8 GPUs)",
                   size);
}

static int64_t round_up(int64_t x, int64_t m) {
    return (x + m - 1) / m * m;
}

int rp_tp_plan_make(rp_tp_plan *plan, const rp_model_config *cfg, int size, rp_err *err) {
    memset(plan, 0, sizeof *plan);
    if (rp_tp_size_check(size, err)) return RP_ERR;
    const int nh = cfg->num_heads, nkv = cfg->num_kv_heads, inter = cfg->intermediate_size;
    if (nh <= 0 || nkv <= 0 || inter <= 0 || cfg->vocab_size <= 0 || nh % nkv)
        return rp_errf(err, "tensor parallelism: invalid config (heads %d, kv heads %d, intermediate %d, vocab %d)", nh,
                       nkv, inter, cfg->vocab_size);
    if (nh % size)
        return rp_errp(err, "tensor_parallel_size",
                       "--tensor-parallel-size %d does not divide num_attention_heads=%d: each GPU must hold whole "
                       "query heads", size, nh);
    if (nkv % size && size % nkv)
        return rp_errp(err, "tensor_parallel_size",
                       "--tensor-parallel-size %d and num_key_value_heads=%d: neither divides the other, so the KV "
                       "heads can be neither split evenly over the GPUs nor replicated evenly on them", size, nkv);
    if (inter % size)
        return rp_errp(err, "tensor_parallel_size",
                       "--tensor-parallel-size %d does not divide intermediate_size=%d: each GPU must hold an equal "
                       "share of the MLP", size, inter);
    plan->size = size;
    plan->cfg = *cfg;
    plan->q_heads_per_rank = nh / size;
    plan->kv_replicas = size > nkv ? size / nkv : 1;
    plan->kv_heads_per_rank = size > nkv ? 1 : nkv / size;
    plan->inter_per_rank = inter / size;
    plan->vocab_per_rank = round_up((cfg->vocab_size + size - 1) / size, RP_TP_VOCAB_ALIGN);
    plan->vocab_padded = plan->vocab_per_rank * size;
    for (int r = 0; r < size; r++) {
        rp_tp_rank *k = &plan->ranks[r];
        k->q_head_start = r * plan->q_heads_per_rank;
        k->num_q_heads = plan->q_heads_per_rank;
        /* replicated: ranks r .. r + kv_replicas - 1 share one KV head, the
         * one their query heads attend with (query head h uses KV head
         * h / (nh / nkv), and a rank's heads all fall in one group) */
        k->kv_head_start = r / plan->kv_replicas * plan->kv_heads_per_rank;
        k->num_kv_heads = plan->kv_heads_per_rank;
        k->inter_start = r * plan->inter_per_rank;
        k->inter_size = plan->inter_per_rank;
        k->vocab_start = r * plan->vocab_per_rank;
        int64_t end = k->vocab_start + plan->vocab_per_rank;
        if (end > cfg->vocab_size) end = cfg->vocab_size;
        k->vocab_count = end > k->vocab_start ? end - k->vocab_start : 0;
    }
    return 0;
}

rp_tp_split rp_tp_kind_split(rp_weight_kind kind) {
    switch (kind) {
    case RP_W_EMBED:
    case RP_W_LM_HEAD:
    case RP_W_Q:
    case RP_W_K:
    case RP_W_V:
    case RP_W_Q_BIAS:
    case RP_W_K_BIAS:
    case RP_W_V_BIAS:
    case RP_W_GATE:
    case RP_W_UP: return RP_TP_SPLIT_ROWS;
    case RP_W_O:
    case RP_W_DOWN: return RP_TP_SPLIT_COLS;
    case RP_W_FINAL_NORM:
    case RP_W_ATTN_NORM:
    case RP_W_Q_NORM:
    case RP_W_K_NORM:
    case RP_W_MLP_NORM:
    case RP_W_COUNT: break;
    }
    return RP_TP_REPLICATED;
}

rp_tp_collective rp_tp_kind_collective(rp_weight_kind kind) {
    switch (kind) {
    case RP_W_EMBED:
    case RP_W_O:
    case RP_W_DOWN: return RP_TP_COLL_ALL_REDUCE;
    case RP_W_LM_HEAD: return RP_TP_COLL_GATHER;
    default: return RP_TP_COLL_NONE;
    }
}

void rp_tp_weight_slice(const rp_tp_plan *plan, rp_weight_kind kind, int rank, rp_tp_slice *out) {
    RP_ASSERT(rank >= 0 && rank < plan->size);
    const rp_tp_rank *k = &plan->ranks[rank];
    const int64_t hd = plan->cfg.head_dim;
    int64_t shape[2];
    rp_weight_shape(&plan->cfg, kind, shape);
    memset(out, 0, sizeof *out);
    out->split = rp_tp_kind_split(kind);
    out->rows = shape[0];
    out->cols = shape[1];
    switch (kind) {
    case RP_W_EMBED:
    case RP_W_LM_HEAD:
        out->start = k->vocab_start < shape[0] ? k->vocab_start : shape[0];
        out->count = k->vocab_count;
        out->padded_count = plan->vocab_per_rank;
        return;
    case RP_W_Q:
    case RP_W_Q_BIAS:
    case RP_W_O:
        out->start = k->q_head_start * hd;
        out->count = k->num_q_heads * hd;
        break;
    case RP_W_K:
    case RP_W_V:
    case RP_W_K_BIAS:
    case RP_W_V_BIAS:
        out->start = k->kv_head_start * hd;
        out->count = k->num_kv_heads * hd;
        break;
    case RP_W_GATE:
    case RP_W_UP:
    case RP_W_DOWN:
        out->start = k->inter_start;
        out->count = k->inter_size;
        break;
    default:
        out->start = 0;
        out->count = shape[0];
        break;
    }
    out->padded_count = out->count;
}

void rp_tp_slice_byte_ranges(const rp_tp_slice *s, size_t elem_bytes, rp_tp_byte_ranges *out) {
    const uint64_t e = elem_bytes, row_bytes = (uint64_t)s->cols * e;
    if (s->split == RP_TP_SPLIT_COLS) {
        out->offset_bytes = (uint64_t)s->start * e;
        out->run_bytes = (uint64_t)s->count * e;
        out->stride_bytes = row_bytes;
        out->num_runs = s->rows;
    } else {
        out->offset_bytes = (uint64_t)s->start * row_bytes;
        out->run_bytes = (uint64_t)s->count * row_bytes;
        out->stride_bytes = out->run_bytes;
        out->num_runs = 1;
    }
}

/* FNV-1a, 64 bits, over each value's bytes (never a struct's padding). */
static void fnv(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 0x100000001b3ull;
    }
}

uint64_t rp_tp_fingerprint(const rp_model_config *c, int tp_size) {
    uint64_t h = 0xcbf29ce484222325ull;
    fnv(&h, c->arch_name, strnlen(c->arch_name, sizeof c->arch_name));
    const int ints[] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
                        c->num_kv_heads, c->head_dim, c->tie_word_embeddings, c->max_position_embeddings,
                        c->sliding_window, (int)c->rope.type, c->rope.original_max_position_embeddings,
                        (int)c->quant.method, c->quant.block[0], c->quant.block[1], tp_size};
    fnv(&h, ints, sizeof ints);
    const double dbls[] = {c->rms_norm_eps, c->rope.theta, c->rope.factor, c->rope.low_freq_factor,
                           c->rope.high_freq_factor, c->rope.beta_fast, c->rope.beta_slow,
                           c->rope.attention_factor};
    fnv(&h, dbls, sizeof dbls);
    return h;
}
