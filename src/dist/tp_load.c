/* Sliced weight loading for tensor parallelism (tp_load.h): a rank reads
 * only the bytes of its slice from the mapping, converts or dequantizes
 * only those, and keeps bf16 row slices as views. */
#include "dist/tp_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "util/dtype.h"

/* The slice's own [rows, cols]. */
static void slice_shape(const rp_tp_slice *s, int64_t *rows, int64_t *cols) {
    *rows = s->split == RP_TP_SPLIT_COLS ? s->rows : s->count;
    *cols = s->split == RP_TP_SPLIT_COLS ? s->count : s->cols;
}

static int check_tensor(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, rp_err *err) {
    if ((int)t->dtype < 0)
        return rp_errf(err, "weight \"%s\": dtype not supported (bf16, f16, f32, and f8_e4m3 with its scales are)", name);
    const int64_t rows = t->ndim >= 1 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : 1;
    if (t->ndim < 1 || t->ndim > 2 || rows != s->rows || cols != s->cols)
        return rp_errf(err, "weight \"%s\" has %d dimensions [%lld, %lld], the tensor-parallel plan expects [%lld, %lld]",
                       name, t->ndim, (long long)rows, (long long)cols, (long long)s->rows, (long long)s->cols);
    const int64_t dim = s->split == RP_TP_SPLIT_COLS ? s->cols : s->rows;
    if (s->start < 0 || s->count < 0 || s->start + s->count > dim)
        return rp_errf(err, "weight \"%s\": slice [%lld, +%lld) outside its %lld %s", name, (long long)s->start,
                       (long long)s->count, (long long)dim, s->split == RP_TP_SPLIT_COLS ? "columns" : "rows");
    return 0;
}

int rp_tp_slice_copy(const rp_tp_slice *s, const rp_st_tensor *t, void *dst, rp_err *err) {
    if (check_tensor(s, "(slice copy)", t, err)) return RP_ERR;
    rp_tp_byte_ranges br;
    rp_tp_slice_byte_ranges(s, rp_dtype_size(t->dtype), &br);
    const char *src = (const char *)t->data + br.offset_bytes;
    for (int64_t i = 0; i < br.num_runs; i++)
        memcpy((char *)dst + (uint64_t)i * br.run_bytes, src + (uint64_t)i * br.stride_bytes, br.run_bytes);
    return 0;
}

/* Element (r, c) of the slice is element src_index(r, c) of the tensor. */
static int64_t src_index(const rp_tp_slice *s, int64_t r, int64_t c) {
    return s->split == RP_TP_SPLIT_COLS ? r * s->cols + s->start + c : (s->start + r) * s->cols + c;
}

static void convert(const rp_tp_slice *s, const rp_st_tensor *t, uint16_t *dst) {
    int64_t rows, cols;
    slice_shape(s, &rows, &cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            dst[r * cols + c] = rp_f32_to_bf16(rp_dtype_elem_f32(t->data, t->dtype, (size_t)src_index(s, r, c)));
        }
}

static int64_t numel(const rp_st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* The part of an FP8 weight's scale tensor that covers the slice, in the
 * three layouts rp_quant_dequant reads: per block (the slice must start on
 * a block boundary), per tensor (all of it), per output channel (its rows
 * of a row slice). *owned is set where the part had to be copied. */
static int scale_slice(const rp_tp_slice *s, const char *name, const rp_st_tensor *scale, const rp_quant_config *q,
                       rp_st_tensor *out, void **owned, rp_err *err) {
    *out = *scale;
    *owned = NULL;
    const int64_t n = numel(scale);
    const int b0 = q->block[0], b1 = q->block[1];
    if (b0 && scale->ndim == 2 && scale->shape[0] == (s->rows + b0 - 1) / b0 &&
        scale->shape[1] == (s->cols + b1 - 1) / b1) {
        if (s->split == RP_TP_REPLICATED) return 0;
        const int b = s->split == RP_TP_SPLIT_ROWS ? b0 : b1;
        if (s->start % b)
            return rp_errf(err, "weight \"%s\": this GPU's %s start at %lld, inside a %dx%d scale block: tensor "
                                "parallelism needs each GPU's share of an FP8 weight to be whole blocks",
                           name, s->split == RP_TP_SPLIT_ROWS ? "rows" : "columns", (long long)s->start, b0, b1);
        const rp_tp_slice grid = {.split = s->split, .rows = scale->shape[0], .cols = scale->shape[1],
                                  .start = s->start / b, .count = (s->count + b - 1) / b};
        const size_t es = rp_dtype_size(scale->dtype);
        if (s->split == RP_TP_SPLIT_ROWS) {
            out->shape[0] = grid.count;
            out->data = (const char *)scale->data + (size_t)(grid.start * grid.cols) * es;
        } else {
            out->shape[1] = grid.count;
            if (!(*owned = malloc((size_t)(grid.rows * grid.count) * es)))
                return rp_errf(err, "out of memory slicing the scale of \"%s\"", name);
            if (rp_tp_slice_copy(&grid, scale, *owned, err)) return RP_ERR;
            out->data = *owned;
        }
        out->nbytes = (size_t)numel(out) * es;
        return 0;
    }
    if (!b0 && n == 1 && scale->ndim <= 1) return 0; /* per tensor */
    if (q->method == RP_QUANT_FP8_CT && !b0 && n == s->rows &&
        (scale->ndim == 1 || (scale->ndim == 2 && scale->shape[1] == 1))) { /* per output channel */
        if (s->split != RP_TP_SPLIT_ROWS) return 0;
        out->shape[0] = s->count;
        out->data = (const char *)scale->data + (size_t)s->start * rp_dtype_size(scale->dtype);
        out->nbytes = (size_t)s->count * rp_dtype_size(scale->dtype);
        return 0;
    }
    char shape[64] = "";
    for (int d = 0, o = 0; d < scale->ndim && o < (int)sizeof shape - 24; d++)
        o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", d ? ", " : "", (long long)scale->shape[d]);
    return rp_errf(err, "weight \"%s\" [%lld, %lld]: its scale has shape [%s], which %s does not explain", name,
                   (long long)s->rows, (long long)s->cols, shape, q->desc);
}

/* The slice's e4m3 bytes kept with its scales in rp_weight's form, where
 * the scales are per tensor, per row or 128 x 128 blocks (model/quant.h:
 * what model/weights.c keeps of a whole tensor); otherwise only the
 * dequantized values are kept and w_owned is freed. */
static int keep_fp8(const char *name, const rp_st_tensor *w, uint8_t *w_owned, const rp_st_tensor *sc,
                    const rp_quant_config *q, rp_tp_weight *out, rp_err *err) {
    const int64_t rows = out->rows, cols = out->cols, B = RP_FP8_BLOCK;
    const int64_t nb = (rows + B - 1) / B * ((cols + B - 1) / B), n = rows > nb ? rows : nb;
    float *scales = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!scales) {
        free(w_owned);
        return rp_errf(err, "out of memory reading the scales of \"%s\"", name);
    }
    int r = rp_quant_block_scales(q, name, rows, cols, sc, scales, err);
    if (r > 0) out->block_scale = scales;
    else if (!r && (r = rp_quant_row_scales(q, name, rows, cols, sc, scales, err)) > 0) out->scale = scales;
    if (r <= 0) {
        free(scales);
        free(w_owned);
        return r < 0 ? RP_ERR : 0;
    }
    out->fp8 = w->data;
    out->owned_fp8 = w_owned;
    out->owned_scales = scales;
    return 0;
}

static int load_fp8(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, const rp_st_tensor *scale,
                    const rp_quant_config *q, rp_tp_weight *out, rp_err *err) {
    if (!q || q->method == RP_QUANT_NONE)
        return rp_errf(err, "weight \"%s\" is F8_E4M3 but config.json has no quantization_config", name);
    if (!scale) return rp_errf(err, "weight \"%s\" is F8_E4M3 but its scale is not in the checkpoint", name);
    const int64_t rows = out->rows, cols = out->cols;
    rp_st_tensor w = *t;
    w.shape[0] = rows;
    w.shape[1] = cols;
    w.ndim = 2;
    w.nbytes = (size_t)(rows * cols);
    uint8_t *w_owned = NULL;
    void *s_owned = NULL;
    rp_st_tensor sc;
    int rc = scale_slice(s, name, scale, q, &sc, &s_owned, err);
    if (!rc && s->split == RP_TP_SPLIT_COLS) {
        if (!(w_owned = malloc(w.nbytes ? w.nbytes : 1))) rc = rp_errf(err, "out of memory slicing \"%s\"", name);
        else rc = rp_tp_slice_copy(s, t, w_owned, err);
        w.data = w_owned;
    } else if (!rc) {
        w.data = (const char *)t->data + (size_t)(s->start * s->cols);
    }
    if (!rc) rc = rp_quant_dequant(q, name, &w, rows, cols, &sc, out->owned, err);
    if (!rc) rc = keep_fp8(name, &w, w_owned, &sc, q, out, err);
    else free(w_owned);
    free(s_owned);
    return rc;
}

int rp_tp_slice_load(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, const rp_st_tensor *scale,
                     const rp_quant_config *q, rp_tp_weight *out, rp_err *err) {
    memset(out, 0, sizeof *out);
    if (check_tensor(s, name, t, err)) return RP_ERR;
    slice_shape(s, &out->rows, &out->cols);
    const size_t n = (size_t)(out->rows * out->cols);
    if (t->dtype == RP_DTYPE_BF16 && s->split != RP_TP_SPLIT_COLS) {
        out->data = (const uint16_t *)((const char *)t->data + (size_t)(s->start * s->cols) * 2);
        return 0;
    }
    if (!(out->owned = malloc(n ? n * 2 : 1))) return rp_errf(err, "out of memory for a slice of \"%s\"", name);
    out->data = out->owned;
    int rc = 0;
    switch (t->dtype) {
    case RP_DTYPE_BF16: rc = rp_tp_slice_copy(s, t, out->owned, err); break;
    case RP_DTYPE_F16:
    case RP_DTYPE_F32: convert(s, t, out->owned); break;
    case RP_DTYPE_F8_E4M3: rc = load_fp8(s, name, t, scale, q, out, err); break;
    }
    if (rc) rp_tp_weight_release(out);
    return rc;
}

int rp_tp_slice_whole_blocks(const rp_tp_slice *s, int64_t block) {
    if (s->split == RP_TP_REPLICATED) return 1;
    const int64_t dim = s->split == RP_TP_SPLIT_COLS ? s->cols : s->rows;
    return s->start % block == 0 && (s->count % block == 0 || s->start + s->count == dim);
}

/* Row r of tensor t (its whole row, every column) as bf16: a view of a
 * bf16 tensor, else converted into buf [t's columns]. */
static const uint16_t *whole_row(const rp_tp_slice *s, const rp_st_tensor *t, int64_t r, uint16_t *buf) {
    if (t->dtype == RP_DTYPE_BF16) return (const uint16_t *)t->data + r * s->cols;
    for (int64_t c = 0; c < s->cols; c++)
        buf[c] = rp_f32_to_bf16(rp_dtype_elem_f32(t->data, t->dtype, (size_t)(r * s->cols + c)));
    return buf;
}

int rp_tp_slice_quantize(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, rp_fp8_layout layout,
                         rp_tp_weight *w, rp_err *err) {
    if (layout == RP_FP8_NONE) return 0;
    if (t->dtype == RP_DTYPE_F8_E4M3 || w->fp8)
        return rp_errf(err, "weight \"%s\" is already fp8: --quantization fp8 does not re-quantize it", name);
    const int64_t rows = w->rows, cols = w->cols, B = RP_FP8_BLOCK, n = rows * cols;
    const int blocks = layout == RP_FP8_BLOCKS;
    if (blocks && !rp_tp_slice_whole_blocks(s, B))
        return rp_errf(err, "weight \"%s\": this GPU's %s [%lld, %lld) are not whole %lldx%lld fp8 blocks: tensor "
                            "parallelism needs each GPU's share of a block-quantized weight to be whole blocks",
                       name, s->split == RP_TP_SPLIT_ROWS ? "rows" : "columns", (long long)s->start,
                       (long long)(s->start + s->count), (long long)B, (long long)B);
    const int64_t scales = blocks ? (rows + B - 1) / B * ((cols + B - 1) / B) : rows;
    uint8_t *q = malloc((size_t)(n ? n : 1));
    float *scale = malloc((size_t)(scales ? scales : 1) * sizeof(float));
    uint16_t *deq = malloc((size_t)(n ? n : 1) * 2);
    uint16_t *row = s->split == RP_TP_SPLIT_COLS && t->dtype != RP_DTYPE_BF16 ? malloc((size_t)s->cols * 2) : NULL;
    if (!q || !scale || !deq || (s->split == RP_TP_SPLIT_COLS && t->dtype != RP_DTYPE_BF16 && !row)) {
        free(q), free(scale), free(deq), free(row);
        return rp_errf(err, "out of memory quantizing \"%s\" to fp8", name);
    }
    if (blocks) rp_quant_fp8_blocks(w->data, rows, cols, q, scale, deq);
    else if (s->split != RP_TP_SPLIT_COLS) rp_quant_fp8_rows(w->data, rows, cols, q, scale, deq);
    else { /* the whole rows' scales: the bytes are those of the whole matrix's columns */
        for (int64_t r = 0; r < rows; r++) scale[r] = rp_quant_fp8_row_scale(whole_row(s, t, r, row), s->cols);
        rp_quant_fp8_rows_scaled(w->data, rows, cols, scale, q, deq);
    }
    free(row);
    free(w->owned);
    w->owned = deq, w->data = deq;
    w->owned_fp8 = q, w->fp8 = q;
    w->owned_scales = scale;
    if (blocks) w->block_scale = scale;
    else w->scale = scale;
    return 0;
}

void rp_tp_weight_release(rp_tp_weight *w) {
    free(w->owned);
    free(w->owned_fp8);
    free(w->owned_scales);
    memset(w, 0, sizeof *w);
}
