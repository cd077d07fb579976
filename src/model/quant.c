/* FP8 checkpoints' quantization_config and load-time dequantization
 * (quant.h says which layouts and why bf16 for now). */
#include "model/quant.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "util/dtype.h"

static const char *str(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* [b0, b1], both positive integers */
static int parse_block(const json_t *v, int *block, const char *what, rp_err *err) {
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return rp_errf(err, "quantization_config.%s must be two integers", what);
    for (int i = 0; i < 2; i++) {
        json_int_t b = json_integer_value(json_array_get(v, (size_t)i));
        if (b < 1 || b > 1 << 16) return rp_errf(err, "quantization_config.%s: %lld is not a block size", what, (long long)b);
        block[i] = (int)b;
    }
    return 0;
}

static int parse_fp8(const json_t *quant, rp_quant_config *q, rp_err *err) {
    const char *fmt = str(quant, "fmt"), *act = str(quant, "activation_scheme");
    if (fmt && strcmp(fmt, "e4m3"))
        return rp_errf(err, "quantization_config.fmt \"%s\" is not supported (e4m3 is)", fmt);
    if (act && strcmp(act, "dynamic") && strcmp(act, "static"))
        return rp_errf(err, "quantization_config.activation_scheme \"%s\" is not dynamic or static", act);
    q->method = RP_QUANT_FP8;
    q->static_input = act && !strcmp(act, "static");
    const json_t *bs = json_object_get(quant, "weight_block_size");
    if (bs && !json_is_null(bs) && parse_block(bs, q->block, "weight_block_size", err)) return RP_ERR;
    if (q->block[0])
        snprintf(q->desc, sizeof q->desc, "fp8 e4m3, %dx%d blocks", q->block[0], q->block[1]);
    else snprintf(q->desc, sizeof q->desc, "fp8 e4m3, per tensor");
    return 0;
}

/* compressed-tensors: every config group's weights must be 8-bit floats
 * (the FP8 schemes); the strategy decides the scale's shape, which
 * rp_quant_dequant checks per tensor. */
static int parse_ct(const json_t *quant, rp_quant_config *q, rp_err *err) {
    const char *format = str(quant, "format");
    if (format && strcmp(format, "float-quantized") && strcmp(format, "naive-quantized"))
        return rp_errf(err, "quantization_config.format \"%s\" is not supported (float-quantized and "
                            "naive-quantized FP8 are)", format);
    const json_t *groups = json_object_get(quant, "config_groups");
    /* a recipe that quantizes the KV cache alone leaves the weights bf16
     * (rp_quant_parse has read its kv_cache_scheme) */
    if (q->kv_fp8 && (!groups || json_is_null(groups) || (json_is_object(groups) && !json_object_size(groups)))) {
        q->method = RP_QUANT_NONE;
        return 0;
    }
    if (!json_is_object(groups) || !json_object_size(groups))
        return rp_errf(err, "quantization_config.config_groups: missing or empty");
    const char *key;
    const json_t *g;
    const char *strategy = NULL;
    json_object_foreach((json_t *)groups, key, g) {
        const json_t *w = json_object_get(g, "weights"), *in = json_object_get(g, "input_activations");
        if (!json_is_object(w)) return rp_errf(err, "quantization_config.config_groups.%s.weights: missing", key);
        const json_t *bits = json_object_get(w, "num_bits");
        const char *type = str(w, "type"), *st = str(w, "strategy");
        if (!json_is_integer(bits) || json_integer_value(bits) != 8 || !type || strcmp(type, "float"))
            return rp_errf(err, "quantization_config.config_groups.%s.weights: %lld-bit %s weights are not supported "
                                "(8-bit float is)", key, json_is_integer(bits) ? (long long)json_integer_value(bits) : 0LL,
                           type ? type : "?");
        if (!st || (strcmp(st, "tensor") && strcmp(st, "channel") && strcmp(st, "block")))
            return rp_errf(err, "quantization_config.config_groups.%s.weights.strategy \"%s\" is not supported "
                                "(tensor, channel, block are)", key, st ? st : "?");
        if (!strcmp(st, "block") &&
            parse_block(json_object_get(w, "block_structure"), q->block, "config_groups weights.block_structure", err))
            return RP_ERR;
        if (strategy && strcmp(strategy, st))
            return rp_errf(err, "quantization_config: config groups with different strategies (%s, %s)", strategy, st);
        strategy = st;
        if (json_is_object(in)) {
            const json_t *dyn = json_object_get(in, "dynamic");
            const json_t *ib = json_object_get(in, "num_bits");
            const char *it = str(in, "type");
            if ((json_is_integer(ib) && json_integer_value(ib) != 8) || (it && strcmp(it, "float")))
                return rp_errf(err, "quantization_config.config_groups.%s.input_activations: only 8-bit float", key);
            q->static_input |= json_is_false(dyn);
        }
    }
    q->method = RP_QUANT_FP8_CT;
    snprintf(q->desc, sizeof q->desc, "compressed-tensors fp8 e4m3, per %s%s", strategy,
             q->static_input ? ", static input scales" : "");
    return 0;
}

/* compressed-tensors' kv_cache_scheme (llm-compressor's kv_cache_scheme
 * recipe: {num_bits: 8, type: "float", strategy: "tensor", dynamic: false,
 * symmetric: true}, scales saved as k_scale / v_scale per layer): an 8-bit
 * float cache, which replay runs as e4m3. Null or absent: none. */
static int parse_kv_scheme(const json_t *quant, rp_quant_config *q, rp_err *err) {
    const json_t *kv = json_object_get(quant, "kv_cache_scheme");
    if (!kv || json_is_null(kv)) return 0;
    if (!json_is_object(kv)) return rp_errf(err, "quantization_config.kv_cache_scheme must be an object");
    const json_t *bits = json_object_get(kv, "num_bits");
    const char *type = str(kv, "type"), *st = str(kv, "strategy");
    if (!json_is_integer(bits) || json_integer_value(bits) != 8 || (type && strcmp(type, "float")))
        return rp_errf(err, "quantization_config.kv_cache_scheme: a %lld-bit %s KV cache is not supported (8-bit "
                            "float is)",
                       json_is_integer(bits) ? (long long)json_integer_value(bits) : 0LL, type ? type : "?");
    /* per-head scales (strategy attn_head) would need a scale per kv head
     * in the kernels; replay takes one per layer for K and one for V */
    if (st && strcmp(st, "tensor"))
        return rp_errf(err, "quantization_config.kv_cache_scheme.strategy \"%s\" is not supported (tensor is: one "
                            "k_scale and one v_scale per layer)", st);
    q->kv_fp8 = 1;
    return 0;
}

int rp_quant_parse(const json_t *quant, rp_quant_config *q, rp_err *err) {
    memset(q, 0, sizeof *q);
    if (!json_is_object(quant)) return rp_errf(err, "quantization_config must be an object");
    if (parse_kv_scheme(quant, q, err)) return RP_ERR;
    const char *method = str(quant, "quant_method");
    if (method && !strcmp(method, "fp8")) return parse_fp8(quant, q, err);
    if (method && !strcmp(method, "compressed-tensors")) return parse_ct(quant, q, err);
    return rp_errf(err, "a quantized checkpoint (quant_method \"%s\") is not supported: replay loads bf16, f16 and f32 "
                        "weights and FP8 (quant_method fp8 or compressed-tensors)", method ? method : "?");
}

void rp_quant_scale_name(const rp_quant_config *q, const char *name, char *out, size_t out_size) {
    snprintf(out, out_size, "%s%s", name, q->method == RP_QUANT_FP8 && q->block[0] ? "_scale_inv" : "_scale");
}

static int scale_at(const rp_st_tensor *s, int64_t i, float *out) {
    switch (s->dtype) {
    case RP_DTYPE_F32: memcpy(out, (const char *)s->data + 4 * i, 4); return 0;
    case RP_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)s->data + 2 * i, 2);
        *out = rp_bf16_to_f32(h);
        return 0;
    }
    case RP_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, (const char *)s->data + 2 * i, 2);
        *out = rp_f16_to_f32(h);
        return 0;
    }
    case RP_DTYPE_F8_E4M3: break;
    }
    return -1;
}

/* The rows and columns one scale of weight `name` covers (*b0, *b1), from
 * its scale tensor's shape and the layout: a block, a row, or the whole. */
static int scale_span(const rp_quant_config *q, const char *name, int64_t rows, int64_t cols,
                      const rp_st_tensor *scale, int64_t *b0, int64_t *b1, rp_err *err) {
    int64_t n = 1;
    for (int d = 0; d < scale->ndim; d++) n *= scale->shape[d];
    const int64_t br = q->block[0] ? (rows + q->block[0] - 1) / q->block[0] : 0,
                  bc = q->block[0] ? (cols + q->block[1] - 1) / q->block[1] : 0;
    if (q->block[0] && scale->ndim == 2 && scale->shape[0] == br && scale->shape[1] == bc) {
        *b0 = q->block[0], *b1 = q->block[1];
    } else if (!q->block[0] && n == 1 && scale->ndim <= 1) {
        *b0 = rows, *b1 = cols; /* per tensor */
    } else if (q->method == RP_QUANT_FP8_CT && !q->block[0] && n == rows &&
               (scale->ndim == 1 || (scale->ndim == 2 && scale->shape[1] == 1))) {
        *b0 = 1, *b1 = cols; /* per output channel */
    } else {
        char shape[64] = "";
        for (int d = 0, o = 0; d < scale->ndim && o < (int)sizeof shape - 24; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", d ? ", " : "", (long long)scale->shape[d]);
        return rp_errf(err, "weight \"%s\" [%lld, %lld]: its scale has shape [%s], which %s does not explain", name,
                       (long long)rows, (long long)cols, shape, q->desc);
    }
    return 0;
}

/* Scale i of weight `name`, checked: finite and not negative. */
static int scale_checked(const rp_st_tensor *scale, const char *name, int64_t i, float *s, rp_err *err) {
    if (scale_at(scale, i, s)) return rp_errf(err, "weight \"%s\": its scale must be f32, bf16 or f16", name);
    if (!(*s >= 0.0f) || *s > 3.0e38f) return rp_errf(err, "weight \"%s\": a scale is negative, infinite or NaN", name);
    return 0;
}

int rp_quant_row_scales(const rp_quant_config *q, const char *name, int64_t rows, int64_t cols,
                        const rp_st_tensor *scale, float *row_scale, rp_err *err) {
    int64_t b0, b1;
    if (scale_span(q, name, rows, cols, scale, &b0, &b1, err)) return -1;
    if (b1 != cols || (b0 != 1 && b0 != rows)) return 0; /* blocks along the row */
    for (int64_t r = 0; r < rows; r++)
        if (scale_checked(scale, name, b0 == 1 ? r : 0, &row_scale[r], err)) return -1;
    return 1;
}

int rp_quant_block_scales(const rp_quant_config *q, const char *name, int64_t rows, int64_t cols,
                          const rp_st_tensor *scale, float *grid, rp_err *err) {
    int64_t b0, b1;
    if (scale_span(q, name, rows, cols, scale, &b0, &b1, err)) return -1;
    if (q->block[0] != RP_FP8_BLOCK || q->block[1] != RP_FP8_BLOCK) return 0;
    const int64_t n = (rows + b0 - 1) / b0 * ((cols + b1 - 1) / b1);
    for (int64_t i = 0; i < n; i++)
        if (scale_checked(scale, name, i, &grid[i], err)) return -1;
    return 1;
}

int rp_quant_dequant(const rp_quant_config *q, const char *name, const rp_st_tensor *w, int64_t rows, int64_t cols,
                     const rp_st_tensor *scale, uint16_t *dst, rp_err *err) {
    int64_t b0, b1; /* the rows and columns one scale covers */
    if (scale_span(q, name, rows, cols, scale, &b0, &b1, err)) return RP_ERR;
    /* scale (r / b0, c / b1) of a [ceil(rows / b0), ceil(cols / b1)] grid */
    const int64_t per_row = (cols + b1 - 1) / b1;
    const uint8_t *src = w->data;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c0 = 0; c0 < cols; c0 += b1) {
            float s;
            if (scale_checked(scale, name, r / b0 * per_row + c0 / b1, &s, err)) return RP_ERR;
            const int64_t c1 = c0 + b1 < cols ? c0 + b1 : cols;
            for (int64_t c = c0; c < c1; c++)
                dst[r * cols + c] = rp_f32_to_bf16(rp_f8e4m3_to_f32(src[r * cols + c]) * s);
        }
    }
    return 0;
}

float rp_quant_fp8_row_scale(const uint16_t *w, int64_t cols) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(rp_bf16_to_f32(w[c])));
    return amax > 0.0f ? amax / 448.0f : 1.0f;
}

void rp_quant_fp8_rows_scaled(const uint16_t *w, int64_t rows, int64_t cols, const float *scale, uint8_t *q,
                              uint16_t *deq) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *wr = w + r * cols;
        const float s = scale[r];
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t v = rp_f32_to_f8e4m3(rp_bf16_to_f32(wr[c]) / s);
            q[r * cols + c] = v;
            deq[r * cols + c] = rp_f32_to_bf16(rp_f8e4m3_to_f32(v) * s);
        }
    }
}

void rp_quant_fp8_rows(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q, float *scale, uint16_t *deq) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) scale[r] = rp_quant_fp8_row_scale(w + r * cols, cols);
    rp_quant_fp8_rows_scaled(w, rows, cols, scale, q, deq);
}

void rp_quant_fp8_blocks(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q, float *grid, uint16_t *deq) {
    const int64_t B = RP_FP8_BLOCK, gr = (rows + B - 1) / B, gc = (cols + B - 1) / B;
#pragma omp parallel for schedule(static)
    for (int64_t bi = 0; bi < gr; bi++) {
        const int64_t r1 = (bi + 1) * B < rows ? (bi + 1) * B : rows;
        for (int64_t bj = 0; bj < gc; bj++) {
            const int64_t c0 = bj * B, c1 = c0 + B < cols ? c0 + B : cols;
            float amax = 0.0f;
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(rp_bf16_to_f32(w[r * cols + c])));
            const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            grid[bi * gc + bj] = s;
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    const uint8_t v = rp_f32_to_f8e4m3(rp_bf16_to_f32(w[r * cols + c]) / s);
                    q[r * cols + c] = v;
                    deq[r * cols + c] = rp_f32_to_bf16(rp_f8e4m3_to_f32(v) * s);
                }
        }
    }
}

int rp_quant_kv_scale(const char *name, const rp_st_tensor *t, float *out, rp_err *err) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    if (n != 1 || t->ndim > 1)
        return rp_errf(err, "KV cache scale \"%s\" has %lld elements: replay takes one scale per layer for K and "
                            "one for V (per-head scales are not supported)",
                       name, (long long)n);
    if (scale_at(t, 0, out)) return rp_errf(err, "KV cache scale \"%s\" must be f32, bf16 or f16", name);
    if (!(*out > 0) || !isfinite(*out))
        return rp_errf(err, "KV cache scale \"%s\" is %g: it must be positive and finite", name, (double)*out);
    return 0;
}
