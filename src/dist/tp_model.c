/* A rank's shard as an rp_model (tp_model.h): the local config, and every
 * weight the architecture has bound to the rank's slice, from the
 * checkpoint's files or from a model already in memory. */
#include "dist/tp_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dist/tp_load.h"
#include "model/quant.h"
#include "util/log.h"

void rp_tp_shard_config(const rp_tp_plan *plan, rp_model_config *out) {
    *out = plan->cfg;
    out->num_heads = plan->q_heads_per_rank;
    out->num_kv_heads = plan->kv_heads_per_rank;
    out->intermediate_size = plan->inter_per_rank;
    out->vocab_size = (int)plan->vocab_per_rank;
}

static int keep(rp_model *m, void *p, rp_err *err) {
    if (m->num_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 16;
        void **o = realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o) {
            free(p);
            return rp_errf(err, "out of memory");
        }
        m->owned = o, m->cap_owned = cap;
    }
    m->owned[m->num_owned++] = p;
    return 0;
}

static int kind_present(const rp_model_config *cfg, rp_weight_kind k) {
    return rp_arch_has_weight(cfg->arch, k) && !(k == RP_W_LM_HEAD && cfg->tie_word_embeddings);
}

static rp_model *shard_new(const rp_tp_plan *plan, rp_err *err) {
    rp_model *m = calloc(1, sizeof *m);
    if (m) {
        rp_tp_shard_config(plan, &m->cfg);
        m->layers = calloc((size_t)m->cfg.num_layers * RP_W_COUNT, sizeof *m->layers);
    }
    if (!m || !m->layers) {
        free(m);
        rp_errf(err, "out of memory");
        return NULL;
    }
    return m;
}

/* Slices tensor t (scale: its FP8 scale or NULL, q its layout) into the
 * shard's weight (kind, layer), padding the vocabulary shards with zero
 * rows; a layer matrix keeps its slice's e4m3 bytes and scales where it
 * has them (rp_tp_weight), or is quantized to them (quantize: RP_FP8_ROWS
 * or RP_FP8_BLOCKS, --quantization fp8). */
static int bind(rp_model *m, const rp_tp_plan *plan, int rank, rp_weight_kind kind, int layer, const char *name,
                const rp_st_tensor *t, const rp_st_tensor *scale, const rp_quant_config *q, rp_fp8_layout quantize,
                rp_err *err) {
    rp_tp_slice s;
    rp_tp_weight_slice(plan, kind, rank, &s);
    rp_tp_weight w;
    if (rp_tp_slice_load(&s, name, t, scale, q, &w, err)) return RP_ERR;
    const int matrix = rp_weight_kind_is_layer_matrix(kind);
    if (matrix && rp_tp_slice_quantize(&s, name, t, quantize, &w, err)) {
        rp_tp_weight_release(&w);
        return RP_ERR;
    }
    if (!matrix) { /* only the layer matrices run as e4m3 (model.h) */
        free(w.owned_fp8), free(w.owned_scales);
        w.fp8 = NULL, w.scale = w.block_scale = NULL, w.owned_fp8 = NULL, w.owned_scales = NULL;
    }
    void *owned[3] = {w.owned, w.owned_fp8, w.owned_scales};
    for (int i = 0; i < 3; i++)
        if (owned[i] && keep(m, owned[i], err)) {
            for (int j = i + 1; j < 3; j++) free(owned[j]);
            return RP_ERR;
        }
    if (s.padded_count > s.count) {
        uint16_t *pad = calloc((size_t)(s.padded_count * s.cols), 2);
        if (!pad) return rp_errf(err, "out of memory padding \"%s\"", name);
        if (s.count) memcpy(pad, w.data, (size_t)(s.count * s.cols) * 2);
        if (keep(m, pad, err)) return RP_ERR;
        w.data = pad;
        w.rows = s.padded_count;
    }
    rp_weight *dst = (rp_weight *)rp_model_weight(m, kind, layer);
    dst->data = w.data;
    dst->rows = w.rows;
    dst->cols = w.cols;
    dst->fp8 = w.fp8;
    dst->scale = w.scale;
    dst->block_scale = w.block_scale;
    m->weight_bytes += (uint64_t)(w.rows * w.cols) * 2;
    return 0;
}

static void finish(rp_model *m) {
    if (m->cfg.tie_word_embeddings) m->global[RP_W_LM_HEAD] = m->global[RP_W_EMBED];
}

/* A shard whose layer matrices were bound with e4m3 bytes: fp8 of their
 * layout where every one has them and the GPU can stack them, else every
 * weight as dequantized (rp_model_fp8_settle), said once (rank 0). */
static void settle_fp8(rp_model *m, int rank, const char *what) {
    char why[160];
    const rp_fp8_layout layout = rp_model_fp8_settle(m, why, sizeof why);
    if (rank) return;
    if (layout == RP_FP8_NONE)
        rp_log_info("%s: tensor parallelism: the shards run dequantized to bf16: %s", what, why);
    else
        rp_log_info("%s: tensor parallelism: each shard holds its slices as e4m3 with a scale per %s", what,
                    layout == RP_FP8_ROWS ? "row" : "128x128 block");
}

/* Whether every rank's share of every layer matrix is whole 128 x 128
 * blocks (rp_tp_slice_whole_blocks): NULL if so, else the first matrix
 * whose share is not. */
static const char *blocks_cut(const rp_tp_plan *plan) {
    for (int r = 0; r < plan->size; r++)
        for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
            if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)k)) continue;
            rp_tp_slice s;
            rp_tp_weight_slice(plan, (rp_weight_kind)k, r, &s);
            if (!rp_tp_slice_whole_blocks(&s, RP_FP8_BLOCK)) return rp_weight_kind_name((rp_weight_kind)k);
        }
    return NULL;
}

rp_model *rp_tp_model_slice(const rp_model *full, const rp_tp_plan *plan, int rank, rp_err *err) {
    if (rp_tp_fingerprint(&full->cfg, plan->size) != rp_tp_fingerprint(&plan->cfg, plan->size)) {
        rp_errf(err, "tensor parallelism: the plan was made for another model");
        return NULL;
    }
    rp_model *m = shard_new(plan, err);
    if (!m) return NULL;
    m->dummy = full->dummy;
    m->dummy_seed = full->dummy_seed;
    const rp_model_config *c = &full->cfg;
    /* an fp8 model's layer matrices are sliced as e4m3 bytes with their row
     * scales (per output channel, as a compressed-tensors checkpoint) or
     * their block grid (128 x 128, as an official FP8 checkpoint), so the
     * shard's bytes are the whole model's; blocks that the slices would cut
     * leave the shard bf16 */
    rp_quant_config q = {.method = full->fp8 == RP_FP8_BLOCKS ? RP_QUANT_FP8 : RP_QUANT_FP8_CT};
    if (full->fp8 == RP_FP8_BLOCKS) q.block[0] = q.block[1] = RP_FP8_BLOCK;
    snprintf(q.desc, sizeof q.desc, "the model's fp8 weights");
    const char *cut = full->fp8 == RP_FP8_BLOCKS ? blocks_cut(plan) : NULL;
    if (cut && !rank)
        rp_log_info("tensor parallelism: the shards run dequantized to bf16: %s's slices are not whole 128x128 fp8 blocks",
                    cut);
    const int fp8 = full->fp8 != RP_FP8_NONE && !cut;
    for (int k = 0; k < RP_W_COUNT; k++) {
        if (!kind_present(c, (rp_weight_kind)k)) continue;
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : c->num_layers); l++) {
            const rp_weight *fw = rp_model_weight(full, (rp_weight_kind)k, l);
            const char *name = rp_weight_kind_name((rp_weight_kind)k);
            if (!fw->data) {
                rp_errf(err, "tensor parallelism: weight %s of layer %d has no host data (lazy dummy weights are "
                             "generated on the GPU whole, not sliced)", name, l);
                rp_model_free(m);
                return NULL;
            }
            rp_st_tensor t = {.dtype = RP_DTYPE_BF16, .ndim = fw->cols == 1 ? 1 : 2, .shape = {fw->rows, fw->cols},
                              .data = fw->data, .nbytes = (size_t)(fw->rows * fw->cols) * 2};
            rp_st_tensor sc = {.dtype = RP_DTYPE_F32, .ndim = 2, .shape = {fw->rows, 1}, .data = fw->scale,
                               .nbytes = (size_t)fw->rows * sizeof(float)};
            if (fp8 && fw->fp8) {
                t.dtype = RP_DTYPE_F8_E4M3, t.data = fw->fp8, t.nbytes = (size_t)(fw->rows * fw->cols);
                if (fw->block_scale) {
                    sc.shape[0] = (fw->rows + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK;
                    sc.shape[1] = (fw->cols + RP_FP8_BLOCK - 1) / RP_FP8_BLOCK;
                    sc.data = fw->block_scale;
                    sc.nbytes = (size_t)(sc.shape[0] * sc.shape[1]) * sizeof(float);
                }
            }
            if (bind(m, plan, rank, (rp_weight_kind)k, l, name, &t, &sc, &q, RP_FP8_NONE, err)) {
                rp_err_wrap(err, "layer %d", l);
                rp_model_free(m);
                return NULL;
            }
        }
    }
    if (fp8) settle_fp8(m, rank, "the model");
    finish(m);
    return m;
}

rp_model *rp_tp_model_lazy_dummy(const rp_tp_plan *plan, int rank, uint64_t seed, rp_fp8_layout fp8, rp_err *err) {
    if (rank < 0 || rank >= plan->size) {
        rp_errf(err, "tensor parallelism: rank %d of %d", rank, plan->size);
        return NULL;
    }
    rp_model *m = shard_new(plan, err);
    if (!m) return NULL;
    m->dummy = 1;
    m->dummy_seed = seed;
    const rp_model_config *c = &plan->cfg;
    for (int k = 0; k < RP_W_COUNT; k++) {
        if (!kind_present(c, (rp_weight_kind)k)) continue;
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : c->num_layers); l++) {
            int64_t shape[2];
            rp_weight_shape(&m->cfg, (rp_weight_kind)k, shape); /* the shard's own shape */
            rp_weight *w = (rp_weight *)rp_model_weight(m, (rp_weight_kind)k, l);
            w->rows = shape[0];
            w->cols = shape[1];
            m->weight_bytes += (uint64_t)(shape[0] * shape[1]) * 2;
        }
    }
    /* quantized where they are generated, each row or block of the slice
     * (cuda_weights.c); blocks need every slice to be whole blocks and the
     * parts to stack, else the shards run bf16 */
    const char *no = fp8 == RP_FP8_BLOCKS ? blocks_cut(plan) : NULL;
    if (!no && fp8 == RP_FP8_BLOCKS) no = rp_fp8_blocks_unstackable(&m->cfg);
    if (no && !rank)
        rp_log_info("tensor parallelism: the shards run bf16: %s's slices are not whole 128x128 fp8 blocks", no);
    if (fp8 && !no) {
        m->fp8 = fp8;
        rp_model_fp8_weight_bytes(m);
    }
    finish(m);
    return m;
}

/* ---- from the checkpoint's files ---------------------------------------- */

static int open_file(rp_model *m, const char *path, rp_err *err) {
    for (int i = 0; i < m->num_files; i++)
        if (!strcmp(m->files[i]->path, path)) return 0;
    rp_safetensors **files = realloc(m->files, (size_t)(m->num_files + 1) * sizeof *files);
    if (!files) return rp_errf(err, "out of memory");
    m->files = files;
    if (!(m->files[m->num_files] = rp_safetensors_open(path, err))) return RP_ERR;
    m->num_files++;
    return 0;
}

/* model.safetensors, or every shard model.safetensors.index.json names
 * (as model/weights.c opens them). */
static int open_checkpoint(rp_model *m, const char *dir, rp_err *err) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return open_file(m, path, err);
    }
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr), *map = root ? json_object_get(root, "weight_map") : NULL;
    int rc = 0;
    if (!json_is_object(map)) rc = rp_errf(err, "%s: no \"weight_map\" object", path);
    const char *key;
    json_t *v;
    if (!rc) {
        json_object_foreach(map, key, v) {
            const char *fname = json_string_value(v);
            if (!fname || strchr(fname, '/') || !strcmp(fname, "..")) {
                rc = rp_errf(err, "%s: weight_map[\"%s\"] must be a plain file name", path, key);
                break;
            }
            char file[4096];
            snprintf(file, sizeof file, "%s/%s", dir, fname);
            if ((rc = open_file(m, file, err))) break;
        }
    }
    json_decref(root);
    return rc;
}

static const rp_st_tensor *find(const rp_model *m, const char *name) {
    for (int i = 0; i < m->num_files; i++) {
        const rp_st_tensor *t = rp_safetensors_find(m->files[i], name);
        if (t) return t;
    }
    return NULL;
}

static int bind_file(rp_model *m, const rp_tp_plan *plan, int rank, rp_weight_kind kind, int layer,
                     rp_fp8_layout quantize, rp_err *err) {
    char name[256], sname[300];
    if (!plan->cfg.arch->tensor_name(kind, layer, name, sizeof name)) return 0;
    const rp_st_tensor *t = find(m, name), *scale = NULL;
    if (!t) return rp_errf(err, "weight \"%s\" not found in the checkpoint", name);
    if (t->dtype == RP_DTYPE_F8_E4M3 && plan->cfg.quant.method != RP_QUANT_NONE) {
        rp_quant_scale_name(&plan->cfg.quant, name, sname, sizeof sname);
        scale = find(m, sname);
    }
    return bind(m, plan, rank, kind, layer, name, t, scale, &plan->cfg.quant, quantize, err);
}

rp_model *rp_tp_model_load(const char *dir, const rp_tp_plan *plan, int rank, rp_fp8_layout quantize, rp_err *err) {
    rp_model_config cfg;
    if (rp_config_load_dir(&cfg, dir, err)) return NULL;
    if (rp_tp_fingerprint(&cfg, plan->size) != rp_tp_fingerprint(&plan->cfg, plan->size)) {
        rp_errf(err, "%s: tensor parallelism: the plan was made for another model", dir);
        return NULL;
    }
    if (quantize && cfg.quant.method != RP_QUANT_NONE) {
        rp_errf(err, "--quantization fp8: the checkpoint is already quantized (%s): replay runs it as it is and does "
                     "not re-quantize it", cfg.quant.desc);
        return NULL;
    }
    rp_model *m = shard_new(plan, err);
    if (!m) return NULL;
    m->dir = strdup(dir);
    int rc = !m->dir ? rp_errf(err, "out of memory") : open_checkpoint(m, dir, err);
    for (int k = 0; k < RP_W_COUNT && !rc; k++) {
        if (!kind_present(&cfg, (rp_weight_kind)k)) continue;
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : cfg.num_layers) && !rc; l++)
            rc = bind_file(m, plan, rank, (rp_weight_kind)k, l, quantize, err);
    }
    if (rc) {
        rp_err_wrap(err, "%s (tensor-parallel rank %d of %d)", dir, rank, plan->size);
        rp_model_free(m);
        return NULL;
    }
    if (cfg.quant.method != RP_QUANT_NONE || quantize) settle_fp8(m, rank, dir);
    finish(m);
    return m;
}
