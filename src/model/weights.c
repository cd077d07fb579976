/* Weight loading: safetensors files or dummy random weights into rp_model.
 *
 * bf16 tensors stay as mmap'd views; f16/f32 tensors are converted to bf16
 * once at load (the model's compute dtype is bf16 on every backend). Shapes
 * are checked against the config so a mismatched checkpoint fails here, not
 * as garbage output later. */
#include "model/model.h"
#include "model/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/dtype.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/rng.h"

static void *own(rp_model *m, size_t bytes) {
    if (m->num_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? m->cap_owned * 2 : 16;
        m->owned = realloc(m->owned, (size_t)m->cap_owned * sizeof *m->owned);
        if (!m->owned) return NULL;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) m->owned[m->num_owned++] = p;
    return p;
}

void rp_model_free(rp_model *m) {
    if (!m) return;
    for (int i = 0; i < m->num_files; i++) rp_safetensors_close(m->files[i]);
    free(m->files);
    for (int i = 0; i < m->num_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->dir);
    free(m);
}

static rp_model *model_new(const rp_model_config *cfg) {
    rp_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->layers = calloc((size_t)cfg->num_layers * RP_W_COUNT, sizeof *m->layers);
    m->k_scale = own(m, (size_t)cfg->num_layers * sizeof(float));
    m->v_scale = own(m, (size_t)cfg->num_layers * sizeof(float));
    if (!m->layers || !m->k_scale || !m->v_scale) {
        rp_model_free(m);
        return NULL;
    }
    for (int l = 0; l < cfg->num_layers; l++) m->k_scale[l] = m->v_scale[l] = 1.0f;
    return m;
}

static int kind_present(const rp_model_config *cfg, rp_weight_kind k) {
    if (!rp_arch_has_weight(cfg->arch, k)) return 0;
    if (k == RP_W_LM_HEAD && cfg->tie_word_embeddings) return 0; /* aliases embed */
    return 1;
}

static rp_weight *slot(rp_model *m, rp_weight_kind kind, int layer) {
    return (rp_weight *)rp_model_weight(m, kind, layer);
}

/* Iterates over every (kind, layer) the model has. */
#define FOR_EACH_WEIGHT(cfg, kind, layer)                                                            \
    for (int kind = 0; kind < RP_W_COUNT; kind++)                                                  \
        for (int layer = 0; layer < (kind < RP_W_FIRST_LAYER_KIND ? 1 : (cfg)->num_layers); layer++) \
            if (kind_present((cfg), (rp_weight_kind)kind))

const char *rp_fp8_blocks_unstackable(const rp_model_config *cfg) {
    static const rp_weight_kind stacked[] = {RP_W_Q, RP_W_K, RP_W_V, RP_W_GATE, RP_W_UP};
    for (size_t i = 0; i < sizeof stacked / sizeof stacked[0]; i++) {
        int64_t shape[2];
        rp_weight_shape(cfg, stacked[i], shape);
        if (shape[0] % RP_FP8_BLOCK) return rp_weight_kind_name(stacked[i]);
    }
    return NULL;
}

void rp_model_fp8_weight_bytes(rp_model *m) {
    FOR_EACH_WEIGHT(&m->cfg, kind, layer) {
        if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)kind)) continue;
        int64_t shape[2];
        rp_weight_shape(&m->cfg, (rp_weight_kind)kind, shape);
        const int64_t B = RP_FP8_BLOCK,
                      scales = m->fp8 == RP_FP8_BLOCKS ? (shape[0] + B - 1) / B * ((shape[1] + B - 1) / B) : shape[0];
        m->weight_bytes -= (uint64_t)(shape[0] * shape[1]) - (uint64_t)scales * sizeof(float);
    }
}

/* --quantization fp8 (per row), or per 128 x 128 block for tests and
 * benchmarks: each layer matrix's e4m3 bytes and scales, and its
 * dequantized values in place of the bf16 ones (model/quant.h). With lazy
 * dummy weights there are no host values: the backend quantizes what it
 * generates, the same way. */
static int quantize_fp8(rp_model *m, const rp_load_options *opts, rp_err *err) {
    if (!opts || !opts->quantize_fp8) return 0;
    const int blocks = opts->quantize_fp8 == RP_FP8_BLOCKS;
    if (m->cfg.quant.method != RP_QUANT_NONE)
        return rp_errf(err, "--quantization fp8: the checkpoint is already quantized (%s): replay runs it as it is "
                            "and does not re-quantize it",
                       m->cfg.quant.desc);
    const char *part = blocks ? rp_fp8_blocks_unstackable(&m->cfg) : NULL;
    if (part)
        return rp_errf(err, "fp8 128x128 blocks: %s's rows are not whole 128-row blocks, which the GPU's stacked "
                            "q|k|v and gate|up grids need", part);
    m->fp8 = blocks ? RP_FP8_BLOCKS : RP_FP8_ROWS;
    rp_model_fp8_weight_bytes(m);
    if (opts->lazy_dummy) return 0;
    FOR_EACH_WEIGHT(&m->cfg, kind, layer) {
        if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)kind)) continue;
        rp_weight *w = slot(m, (rp_weight_kind)kind, layer);
        const size_t n = (size_t)(w->rows * w->cols), B = RP_FP8_BLOCK;
        const size_t scales = blocks ? ((size_t)w->rows + B - 1) / B * (((size_t)w->cols + B - 1) / B) : (size_t)w->rows;
        uint8_t *q = own(m, n);
        float *scale = own(m, scales * sizeof(float));
        uint16_t *deq = own(m, n * 2);
        if (!q || !scale || !deq) return rp_errf(err, "out of memory quantizing the weights to fp8");
        if (blocks) rp_quant_fp8_blocks(w->data, w->rows, w->cols, q, scale, deq);
        else rp_quant_fp8_rows(w->data, w->rows, w->cols, q, scale, deq);
        w->data = deq;
        w->fp8 = q;
        if (blocks) w->block_scale = scale;
        else w->scale = scale;
    }
    return 0;
}

rp_fp8_layout rp_model_fp8_settle(rp_model *m, char *why, size_t why_size) {
    why[0] = 0;
    int rows = 0, blocks = 0, total = 0;
    FOR_EACH_WEIGHT(&m->cfg, kind, layer) {
        if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)kind)) continue;
        const rp_weight *w = slot(m, (rp_weight_kind)kind, layer);
        total++;
        rows += w->scale != NULL;
        blocks += w->block_scale != NULL;
    }
    rp_fp8_layout layout = rows == total ? RP_FP8_ROWS : blocks == total ? RP_FP8_BLOCKS : RP_FP8_NONE;
    const char *part = layout == RP_FP8_BLOCKS ? rp_fp8_blocks_unstackable(&m->cfg) : NULL;
    if (part) {
        snprintf(why, why_size, "%s's rows are not whole 128-row blocks, which the GPU's stacked grids need", part);
        layout = RP_FP8_NONE;
    } else if (layout == RP_FP8_NONE) {
        snprintf(why, why_size, "%s",
                 m->cfg.quant.block[0] && (m->cfg.quant.block[0] != RP_FP8_BLOCK || m->cfg.quant.block[1] != RP_FP8_BLOCK)
                     ? "the GPU's block-scaled kernels take 128x128 blocks"
                     : "not every layer matrix is e4m3");
    }
    if (layout == RP_FP8_NONE) { /* the dequantized values alone */
        FOR_EACH_WEIGHT(&m->cfg, kind, layer) {
            rp_weight *w = slot(m, (rp_weight_kind)kind, layer);
            w->fp8 = NULL, w->scale = NULL, w->block_scale = NULL;
        }
        return RP_FP8_NONE;
    }
    m->fp8 = layout;
    rp_model_fp8_weight_bytes(m);
    return layout;
}

/* ---- dummy weights ---------------------------------------------------- */

/* transformers' initialisation (PreTrainedModel._init_weights): every
 * matrix, embeddings and lm_head included, normal with mean 0 and std
 * initializer_range; every norm weight exactly 1. Activations then look like
 * a freshly initialised model's: logits spread over the vocabulary, so
 * sampling and benchmarks see realistic distributions rather than one token
 * (the uniform init this replaced gave "3 3 3 ..."). Biases are where replay
 * departs: normal like the matrices, not transformers' zeros, so that a
 * dummy model exercises every path that adds them (tools/gpu_compare.py
 * copies the same values into transformers). */
void rp_dummy_weight_params(const rp_model_config *cfg, rp_weight_kind kind, int layer, uint64_t *stream,
                            double *std, int *is_norm) {
    *stream = (uint64_t)kind * 100003u + (uint64_t)layer;
    *is_norm = rp_weight_kind_is_norm(kind);
    *std = *is_norm ? 0.0 : cfg->initializer_range;
}

rp_model *rp_model_dummy_from_config(const rp_model_config *cfg, const rp_load_options *opts, rp_err *err) {
    rp_model *m = model_new(cfg);
    if (!m) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    m->dummy = 1;
    m->dummy_seed = opts ? opts->seed : 0;
    uint64_t total = 0;
    FOR_EACH_WEIGHT(cfg, kind, layer) {
        int64_t shape[2];
        rp_weight_shape(cfg, (rp_weight_kind)kind, shape);
        total += (uint64_t)(shape[0] * shape[1]);
    }
    m->weight_bytes = total * 2;
    if (opts && opts->lazy_dummy) {
        FOR_EACH_WEIGHT(cfg, kind, layer) {
            rp_weight *w = slot(m, (rp_weight_kind)kind, layer);
            int64_t shape[2];
            rp_weight_shape(cfg, (rp_weight_kind)kind, shape);
            w->rows = shape[0];
            w->cols = shape[1];
        }
        if (cfg->tie_word_embeddings) m->global[RP_W_LM_HEAD] = m->global[RP_W_EMBED];
        if (quantize_fp8(m, opts, err)) {
            rp_model_free(m);
            return NULL;
        }
        return m;
    }
    uint16_t *buf = own(m, total * sizeof(uint16_t));
    if (!buf) {
        rp_model_free(m);
        rp_errf(err, "out of memory for %.2f GB of dummy weights", (double)total * 2 / 1e9);
        return NULL;
    }
    rp_progress prog;
    rp_progress_begin(&prog, "dummy weights", total);
    if (!opts || !opts->progress) prog.enabled = 0;
    uint64_t seed = opts ? opts->seed : 0, off = 0;
    FOR_EACH_WEIGHT(cfg, kind, layer) {
        int64_t shape[2];
        rp_weight_shape(cfg, (rp_weight_kind)kind, shape);
        int64_t n = shape[0] * shape[1];
        uint16_t *dst = buf + off;
        double std;
        int is_norm;
        uint64_t stream;
        rp_dummy_weight_params(cfg, (rp_weight_kind)kind, layer, &stream, &std, &is_norm);
        if (is_norm) {
            const uint16_t one = rp_f32_to_bf16(1.0f);
            for (int64_t i = 0; i < n; i++) dst[i] = one;
        } else {
            /* by pairs: Box-Muller makes elements 2p and 2p + 1 together */
            const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
            for (int64_t p = 0; p < pairs; p++) {
                double z[2];
                rp_rand_normal_pair(seed, stream, (uint64_t)p, z);
                dst[2 * p] = rp_dummy_bf16(z[0], std);
                if (2 * p + 1 < n) dst[2 * p + 1] = rp_dummy_bf16(z[1], std);
            }
        }
        rp_weight *w = slot(m, (rp_weight_kind)kind, layer);
        w->data = dst;
        w->rows = shape[0];
        w->cols = shape[1];
        off += (uint64_t)n;
        rp_progress_add(&prog, (uint64_t)n);
    }
    rp_progress_end(&prog);
    if (cfg->tie_word_embeddings) m->global[RP_W_LM_HEAD] = m->global[RP_W_EMBED];
    if (quantize_fp8(m, opts, err)) {
        rp_model_free(m);
        return NULL;
    }
    return m;
}

rp_model *rp_model_dummy(const char *preset, const rp_load_options *opts, rp_err *err) {
    rp_model_config cfg;
    if (rp_config_preset(&cfg, preset, err)) return NULL;
    return rp_model_dummy_from_config(&cfg, opts, err);
}

/* ---- safetensors ------------------------------------------------------ */

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int open_file(rp_model *m, const char *path, rp_err *err) {
    rp_safetensors *st = rp_safetensors_open(path, err);
    if (!st) return RP_ERR;
    rp_safetensors **files = realloc(m->files, (size_t)(m->num_files + 1) * sizeof *files);
    if (!files) {
        rp_safetensors_close(st);
        return rp_errf(err, "out of memory");
    }
    m->files = files;
    m->files[m->num_files++] = st;
    return 0;
}

/* Opens every shard named by model.safetensors.index.json's weight_map. */
static int open_sharded(rp_model *m, const char *dir, const char *index_path, rp_err *err) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, 0, &jerr);
    if (!root) return rp_errf(err, "%s: %s", index_path, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(map)) {
        rc = rp_errf(err, "%s: no \"weight_map\" object", index_path);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!json_is_string(v)) {
            rc = rp_errf(err, "%s: weight_map[\"%s\"] must be a file name", index_path, key);
            goto out;
        }
        const char *fname = json_string_value(v);
        if (strchr(fname, '/') || !strcmp(fname, "..")) {
            rc = rp_errf(err, "%s: shard name \"%s\" must be a plain file name", index_path, fname);
            goto out;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        int seen = 0;
        for (int i = 0; i < m->num_files && !seen; i++) seen = !strcmp(m->files[i]->path, path);
        if (!seen && (rc = open_file(m, path, err))) goto out;
    }
out:
    json_decref(root);
    return rc;
}

static const rp_st_tensor *find_tensor(const rp_model *m, const char *name) {
    for (int i = 0; i < m->num_files; i++) {
        const rp_st_tensor *t = rp_safetensors_find(m->files[i], name);
        if (t) return t;
    }
    return NULL;
}

static int bind_weight(rp_model *m, rp_weight_kind kind, int layer, rp_err *err) {
    const rp_model_config *cfg = &m->cfg;
    char name[256];
    if (!cfg->arch->tensor_name(kind, layer, name, sizeof name)) return 0;
    const rp_st_tensor *t = find_tensor(m, name);
    if (!t) return rp_errf(err, "weight \"%s\" not found in the checkpoint", name);
    int64_t shape[2];
    rp_weight_shape(cfg, kind, shape);
    int64_t rows = t->ndim >= 1 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : 1;
    if (t->ndim < 1 || t->ndim > 2 || rows != shape[0] || cols != shape[1])
        return rp_errf(err, "weight \"%s\" has shape [%lld, %lld], config.json implies [%lld, %lld]", name,
                       (long long)rows, (long long)(t->ndim == 2 ? cols : 0), (long long)shape[0],
                       (long long)(shape[1] == 1 && t->ndim == 1 ? 0 : shape[1]));
    if ((int)t->dtype < 0)
        return rp_errf(err, "weight \"%s\": dtype not supported (bf16, f16, f32, and f8_e4m3 with its scales are)",
                       name);
    rp_weight *w = slot(m, kind, layer);
    w->rows = rows;
    w->cols = cols;
    size_t n = (size_t)(rows * cols);
    if (t->dtype == RP_DTYPE_BF16) {
        w->data = t->data;
    } else if (t->dtype == RP_DTYPE_F8_E4M3) {
        /* an FP8 checkpoint's weight: dequantized with its scale (quant.h) */
        if (cfg->quant.method == RP_QUANT_NONE)
            return rp_errf(err, "weight \"%s\" is F8_E4M3 but config.json has no quantization_config", name);
        char sname[300];
        rp_quant_scale_name(&cfg->quant, name, sname, sizeof sname);
        const rp_st_tensor *sc = find_tensor(m, sname);
        if (!sc) return rp_errf(err, "weight \"%s\" is F8_E4M3 but its scale \"%s\" is not in the checkpoint", name, sname);
        uint16_t *dst = own(m, n * 2);
        if (!dst) return rp_errf(err, "out of memory dequantizing \"%s\"", name);
        if (rp_quant_dequant(&cfg->quant, name, t, rows, cols, sc, dst, err)) return RP_ERR;
        w->data = dst;
        /* per-tensor and per-channel scales, or 128 x 128 blocks: the bytes
         * themselves too, with row scales or the block grid, for the GPU's
         * fp8 kernels (the model's layout is set once every layer matrix has
         * them: fp8_checkpoint) */
        if (rp_weight_kind_is_layer_matrix(kind)) {
            const size_t B = RP_FP8_BLOCK, nb = ((size_t)rows + B - 1) / B * (((size_t)cols + B - 1) / B);
            float *scales = own(m, ((size_t)rows > nb ? (size_t)rows : nb) * sizeof(float));
            if (!scales) return rp_errf(err, "out of memory reading \"%s\"'s scales", name);
            int r = rp_quant_block_scales(&cfg->quant, name, rows, cols, sc, scales, err);
            if (r > 0) w->fp8 = t->data, w->block_scale = scales;
            else if (!r && (r = rp_quant_row_scales(&cfg->quant, name, rows, cols, sc, scales, err)) > 0)
                w->fp8 = t->data, w->scale = scales;
            if (r < 0) return RP_ERR;
        }
    } else {
        uint16_t *dst = own(m, n * 2);
        if (!dst) return rp_errf(err, "out of memory converting \"%s\" to bf16", name);
        for (size_t i = 0; i < n; i++) dst[i] = rp_f32_to_bf16(rp_dtype_elem_f32(t->data, t->dtype, i));
        w->data = dst;
    }
    m->weight_bytes += n * 2;
    return 0;
}

/* The fp8 KV cache's scales of every layer, where the checkpoint has them,
 * under the names the tools write (vLLM's maybe_remap_kv_scale_name reads
 * the same): llm-compressor's self_attn.k_scale / v_scale, ModelOpt's and
 * older llm-compressor's k_proj.k_scale / v_proj.v_scale, the
 * k_proj.output_scale / v_proj.output_scale of AutoFP8-era checkpoints, and
 * the older single self_attn.kv_scale for both. The prefix comes from the
 * architecture's name for k_proj ("model.layers.L.self_attn."). A layer
 * with a K scale and no V scale (or the reverse) is an error: the cache
 * would be read with a scale it was not written with. */
static int load_kv_scales(rp_model *m, rp_err *err) {
    const rp_model_config *cfg = &m->cfg;
    m->kv_scales_loaded = 0;
    for (int l = 0; l < cfg->num_layers; l++) {
        char kname[256];
        if (!cfg->arch->tensor_name(RP_W_K, l, kname, sizeof kname)) return 0;
        char *cut = strstr(kname, "k_proj.weight");
        if (!cut) return 0;
        *cut = 0; /* kname is now the attention module's prefix */
        static const char *const k_names[] = {"k_scale", "k_proj.k_scale", "k_proj.output_scale", "kv_scale"};
        static const char *const v_names[] = {"v_scale", "v_proj.v_scale", "v_proj.output_scale", "kv_scale"};
        const char *const *names[2] = {k_names, v_names};
        float *dst[2] = {&m->k_scale[l], &m->v_scale[l]};
        int found[2] = {0, 0};
        char which[2][300];
        for (int kv = 0; kv < 2; kv++)
            for (size_t i = 0; i < 4 && !found[kv]; i++) {
                snprintf(which[kv], sizeof which[kv], "%s%s", kname, names[kv][i]);
                const rp_st_tensor *t = find_tensor(m, which[kv]);
                if (!t) continue;
                if (rp_quant_kv_scale(which[kv], t, dst[kv], err)) return RP_ERR;
                found[kv] = 1;
            }
        if (found[0] != found[1])
            return rp_errf(err, "layer %d has a KV cache scale for %s (\"%s\") but none for %s", l,
                           found[0] ? "K" : "V", which[found[0] ? 0 : 1], found[0] ? "V" : "K");
        m->kv_scales_loaded += found[0];
    }
    if (m->kv_scales_loaded && m->kv_scales_loaded != cfg->num_layers)
        return rp_errf(err, "%d of %d layers have KV cache scales: every layer needs them, or none",
                       m->kv_scales_loaded, cfg->num_layers);
    return 0;
}

rp_model *rp_model_load(const char *dir, const rp_load_options *opts, rp_err *err) {
    rp_model_config cfg;
    if (rp_config_load_dir(&cfg, dir, err)) return NULL;
    rp_model *m;
    if (opts && opts->format == RP_LOAD_DUMMY) {
        m = rp_model_dummy_from_config(&cfg, opts, err);
        if (m) m->dir = strdup(dir);
        return m;
    }
    m = model_new(&cfg);
    if (!m) {
        rp_errf(err, "out of memory");
        return NULL;
    }
    m->dir = strdup(dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc;
    if (file_exists(path)) {
        rc = open_sharded(m, dir, path, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (!file_exists(path)) {
            rp_errf(err, "%s: no model.safetensors or model.safetensors.index.json "
                         "(use --load-format dummy for random weights)", dir);
            rp_model_free(m);
            return NULL;
        }
        rc = open_file(m, path, err);
    }
    if (rc) {
        rp_model_free(m);
        return NULL;
    }
    rp_progress prog;
    uint64_t total = (uint64_t)RP_W_COUNT * (uint64_t)cfg.num_layers;
    rp_progress_begin(&prog, "loading weights", total);
    if (!opts || !opts->progress) prog.enabled = 0;
    FOR_EACH_WEIGHT(&cfg, kind, layer) {
        if (bind_weight(m, (rp_weight_kind)kind, layer, err)) {
            rp_progress_end(&prog);
            rp_err_wrap(err, "%s", dir);
            rp_model_free(m);
            return NULL;
        }
        rp_progress_add(&prog, 1);
    }
    rp_progress_end(&prog);
    if (cfg.tie_word_embeddings) m->global[RP_W_LM_HEAD] = m->global[RP_W_EMBED];
    if (load_kv_scales(m, err)) {
        rp_err_wrap(err, "%s", dir);
        rp_model_free(m);
        return NULL;
    }
    if (cfg.quant.method != RP_QUANT_NONE) {
        char why[160];
        switch (rp_model_fp8_settle(m, why, sizeof why)) {
        case RP_FP8_ROWS:
            rp_log_info("%s: %s weights, run as e4m3 with a scale per row on the GPU (bf16 on the CPU)", dir,
                        cfg.quant.desc);
            break;
        case RP_FP8_BLOCKS:
            rp_log_info("%s: %s weights, run as e4m3 with a scale per 128x128 block on the GPU (bf16 on the CPU)", dir,
                        cfg.quant.desc);
            break;
        case RP_FP8_NONE:
            rp_log_info("%s: %s weights, dequantized to bf16 at load: %s (model/quant.h)", dir, cfg.quant.desc, why);
            break;
        }
    }
    if (quantize_fp8(m, opts, err)) {
        rp_err_wrap(err, "%s", dir);
        rp_model_free(m);
        return NULL;
    }
    return m;
}
