/* A quantized model in memory (rp_model.fp8: --quantization fp8's row
 * scales, or 128 x 128 blocks) written as the FP8 checkpoint its layout
 * comes from, for the loaders' tests: config.json (the qwen3-tied
 * fixture's, with the model's shapes) and one model.safetensors where every
 * layer matrix is F8_E4M3 with its scale tensor (f32) and the rest bf16:
 *  - RP_FP8_ROWS: compressed-tensors, strategy "channel": weight_scale
 *    [rows, 1];
 *  - RP_FP8_BLOCKS (or weights holding bytes and grids in a model that
 *    could not take that layout): quant_method "fp8", weight_block_size
 *    [128, 128]: weight_scale_inv [ceil(rows / 128), ceil(cols / 128)].
 * Loaded whole, the checkpoint is the model again: the same bytes, scales
 * and dequantized values. write_fp8_checkpoint_bad spoils the first block
 * grid for the loader's refusals: bad 1 one row of blocks too many, 2 a NaN
 * in it, 3 a negative scale in it (0: none). */
#ifndef RP_TESTS_FP8_CHECKPOINT_H
#define RP_TESTS_FP8_CHECKPOINT_H

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model.h"
#include "test_util.h"

static inline void write_fp8_checkpoint_bad(const char *dir, const rp_model *q, int bad) {
    char src[1024], path[1300];
    test_path(src, sizeof src, "tests/fixtures/models/qwen3-tied");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    assert_non_null(cfg);
    const rp_model_config *c = &q->cfg;
    /* blocks also where the model could not take the layout (RP_FP8_NONE: a
     * shape whose stacked parts are not whole blocks) but its weights hold
     * bytes and grids */
    const int blocks = q->fp8 != RP_FP8_ROWS;
    assert_true(!bad || blocks);
    json_object_del(cfg, "layer_types");
    json_object_set_new(cfg, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(cfg, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(cfg, "num_attention_heads", json_integer(c->num_heads));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(c->num_kv_heads));
    json_object_set_new(cfg, "head_dim", json_integer(c->head_dim));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(cfg, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(cfg, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(cfg, "quantization_config",
                        json_loads(blocks ? "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": "
                                            "\"dynamic\", \"weight_block_size\": [128, 128]}"
                                          : "{\"quant_method\": \"compressed-tensors\", \"format\": "
                                            "\"float-quantized\", \"config_groups\": {\"group_0\": {\"weights\": "
                                            "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}, "
                                            "\"targets\": [\"Linear\"]}}}",
                                   0, &je));
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
    char *hdr = malloc(1 << 17);
    size_t hl = (size_t)snprintf(hdr, 1 << 17, "{"), off = 0;
    FILE *f = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int first = 1;
        for (int k = 0; k < RP_W_COUNT; k++)
            for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : c->num_layers); l++) {
                const rp_weight *w = rp_model_weight(q, (rp_weight_kind)k, l);
                char name[256];
                if (!w->data || (k == RP_W_LM_HEAD && c->tie_word_embeddings) ||
                    !c->arch->tensor_name((rp_weight_kind)k, l, name, sizeof name))
                    continue;
                const long long rows = w->rows, cols = w->cols, n = rows * cols;
                if (!w->fp8) {
                    char shape[64];
                    if (cols > 1) snprintf(shape, sizeof shape, "[%lld, %lld]", rows, cols);
                    else snprintf(shape, sizeof shape, "[%lld]", rows);
                    if (!pass)
                        hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "%s\"%s\": {\"dtype\": \"BF16\", \"shape\": "
                                               "%s, \"data_offsets\": [%zu, %zu]}", hl > 1 ? ", " : "", name, shape,
                                               off, off + (size_t)n * 2);
                    else fwrite(w->data, 2, (size_t)n, f);
                    off += pass ? 0 : (size_t)n * 2;
                    continue;
                }
                assert_non_null(blocks ? w->block_scale : w->scale);
                const long long s0 = blocks ? (rows + 127) / 128 : rows, s1 = blocks ? (cols + 127) / 128 : 1;
                const long long extra = bad == 1 && first ? s1 : 0, ns = s0 * s1 + extra; /* scales written */
                if (!pass) {
                    hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "%s\"%s\": {\"dtype\": \"F8_E4M3\", \"shape\": "
                                           "[%lld, %lld], \"data_offsets\": [%zu, %zu]}, \"%s_scale%s\": {\"dtype\": "
                                           "\"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%zu, %zu]}",
                                           hl > 1 ? ", " : "", name, rows, cols, off, off + (size_t)n, name,
                                           blocks ? "_inv" : "", s0 + (extra ? 1 : 0), s1, off + (size_t)n,
                                           off + (size_t)n + (size_t)ns * 4);
                    off += (size_t)n + (size_t)ns * 4;
                } else {
                    fwrite(w->fp8, 1, (size_t)n, f);
                    float *sc = malloc((size_t)ns * 4);
                    memcpy(sc, blocks ? w->block_scale : w->scale, (size_t)(s0 * s1) * 4);
                    for (long long e = 0; e < extra; e++) sc[s0 * s1 + e] = 1.0f;
                    if (first && bad == 2) sc[s0 * s1 - 1] = NAN;
                    if (first && bad == 3) sc[0] = -sc[0];
                    fwrite(sc, 4, (size_t)ns, f);
                    free(sc);
                }
                first = 0;
            }
        if (!pass) {
            hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "}");
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            f = fopen(path, "wb");
            assert_non_null(f);
            const uint64_t len = hl;
            fwrite(&len, 8, 1, f);
            fwrite(hdr, 1, hl, f);
        }
    }
    fclose(f);
    free(hdr);
}

static inline void write_fp8_checkpoint(const char *dir, const rp_model *q) {
    write_fp8_checkpoint_bad(dir, q, 0);
}

#endif
