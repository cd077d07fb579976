/* One rank's slice of a checkpoint tensor, read from the mmap'd safetensors
 * file without touching the rest of it (tensor parallelism, tp_plan.h).
 *
 * A slice of rows (column-parallel weights, vocabulary shards, and every
 * replicated tensor) is one contiguous range of the file: bf16 stays a view
 * of the mapping. A slice of columns (row-parallel o_proj, down_proj) is a
 * strided range: its runs are copied into a buffer of the slice's size. f16
 * and f32 are converted to bf16 element by element from the file, as
 * model/weights.c converts whole tensors; FP8 e4m3 weights are dequantized
 * with the part of their scale tensor that covers the slice, by
 * rp_quant_dequant, where the slice starts on a scale block boundary (the
 * error says which block size and offset do not fit otherwise), and keep
 * their e4m3 bytes with that part of the scales where the GPU runs them
 * (rp_tp_weight). */
#ifndef RP_DIST_TP_LOAD_H
#define RP_DIST_TP_LOAD_H

#include <stdint.h>

#include "dist/tp_plan.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "util/err.h"

/* A rank's weight: bf16 row-major [rows, cols], the slice's own shape
 * (count rows of a row slice, count columns of a column slice; the
 * vocabulary's padding rows are not included: the backend zero-fills
 * them). An F8_E4M3 tensor whose scales are per tensor, per output channel
 * or 128 x 128 blocks keeps its slice's e4m3 bytes too, with the scales
 * that cover them in rp_weight's form (model.h): a row scale for each of
 * the slice's rows (a column slice keeps every row's: the scale is the
 * output row's), or the slice's part of the block grid. data then holds
 * their dequantized values, as a whole model's weight does. */
typedef struct rp_tp_weight {
    const uint16_t *data;
    int64_t rows, cols;
    const uint8_t *fp8;        /* e4m3 [rows, cols], or NULL */
    const float *scale;        /* [rows] with fp8, row scales */
    const float *block_scale;  /* [ceil(rows / 128)][ceil(cols / 128)] with fp8, blocks */
    uint16_t *owned;     /* the buffer data points into when copied or converted; NULL for a view of the mapping */
    uint8_t *owned_fp8;  /* the buffer fp8 points into when copied (a column slice) */
    float *owned_scales; /* scale's or block_scale's buffer */
} rp_tp_weight;

/* The slice's elements in the tensor's own dtype, copied to dst
 * (count * cols or rows * count elements of rp_dtype_size(t->dtype)). */
int rp_tp_slice_copy(const rp_tp_slice *s, const rp_st_tensor *t, void *dst, rp_err *err);

/* The slice of tensor t (named `name` in messages) as bf16. scale is the
 * weight's scale tensor for an F8_E4M3 t (q describes the layout), NULL
 * otherwise. Checks t's shape against the slice's whole-tensor shape. */
int rp_tp_slice_load(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, const rp_st_tensor *scale,
                     const rp_quant_config *q, rp_tp_weight *out, rp_err *err);

/* Whether slice s is whole blocks of `block` rows (a row slice) or
 * columns (a column slice): it starts on a block boundary and ends on one
 * or at the tensor's end. A replicated tensor is. */
int rp_tp_slice_whole_blocks(const rp_tp_slice *s, int64_t block);

/* --quantization fp8 under tensor parallelism: w (the bf16 slice s of
 * tensor t, from rp_tp_slice_load) quantized to e4m3 in `layout`, its data
 * replaced by the dequantized values, bytes and scales owned by w. The
 * bytes are those columns or rows of the whole matrix quantized as
 * model/weights.c quantizes it: per row (RP_FP8_ROWS), a column slice
 * takes each row's scale from the whole row of t (max|w| over every
 * column), not from its own columns; per 128 x 128 block (RP_FP8_BLOCKS)
 * the slice must be whole blocks (rp_tp_slice_whole_blocks), and its
 * blocks are then the whole matrix's. */
int rp_tp_slice_quantize(const rp_tp_slice *s, const char *name, const rp_st_tensor *t, rp_fp8_layout layout,
                         rp_tp_weight *w, rp_err *err);

void rp_tp_weight_release(rp_tp_weight *w);

#endif
