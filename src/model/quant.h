/* FP8 checkpoints: what config.json's quantization_config says about them,
 * and their weights dequantized with their scales.
 *
 * Two layouts, as their tools write them:
 *  - quant_method "fp8" (the official Qwen3 FP8 releases, DeepSeek-V3):
 *    e4m3 weights with `weight_scale_inv` per weight_block_size block
 *    ([ceil(rows / b0), ceil(cols / b1)]), or, without a block size, one
 *    `weight_scale` per tensor; activation_scheme "dynamic" or "static";
 *  - quant_method "compressed-tensors" (llm-compressor's FP8 builds, the
 *    FP8 Llama 3.1 models), format "float-quantized" or "naive-quantized":
 *    e4m3 weights with `weight_scale` per tensor ([] or [1]), per output
 *    channel ([rows, 1]) or per block (strategy "block", block_structure),
 *    and `input_scale` where activations are static.
 * In both, w = fp8 * scale. Layers the config leaves unquantized (ignore,
 * modules_to_not_convert: lm_head, typically) are plain bf16 tensors, so
 * the dtype of each tensor, not the list, says which is which.
 *
 * Every weight is dequantized to bf16 at load (rp_quant_dequant: the CPU
 * backend's values). Where the scales are per tensor or per row
 * (rp_quant_row_scales) the e4m3 bytes and row scales are kept too and the
 * GPU runs them as --quantization fp8's; where they are 128 x 128 blocks
 * (rp_quant_block_scales) the bytes and the block grid are kept and the GPU
 * runs its block-scaled kernels. Other block sizes run dequantized: a
 * weight-only reading of the model with bf16 activations, as vLLM runs FP8
 * checkpoints on GPUs without FP8 (docs/models.md). */
#ifndef RP_MODEL_QUANT_H
#define RP_MODEL_QUANT_H

#include <jansson.h>
#include <stdint.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "util/err.h"

/* Reads quantization_config (a JSON object) into q: the supported FP8
 * layouts, or an error naming what is not supported (int4, other bit
 * widths, e5m2, another method). */
int rp_quant_parse(const json_t *quant, rp_quant_config *q, rp_err *err);

/* The name of weight `name`'s scale tensor in this layout
 * ("...weight_scale_inv" or "...weight_scale"). */
void rp_quant_scale_name(const rp_quant_config *q, const char *name, char *out, size_t out_size);

/* w (F8_E4M3, [rows, cols]) times its scale tensor into bf16 dst: the
 * scale's shape must be one of the layout's (per tensor, per row, per
 * block); its dtype f32, bf16 or f16. */
int rp_quant_dequant(const rp_quant_config *q, const char *name, const rp_st_tensor *w, int64_t rows, int64_t cols,
                     const rp_st_tensor *scale, uint16_t *dst, rp_err *err);

/* Where weight `name`'s scale is one per tensor or one per output channel
 * (row): its scale for each row into row_scale [rows], and 1 (the GPU then
 * runs the e4m3 bytes as they are, as it runs --quantization fp8's). 0
 * where the scales are blocks along the row (128 x 128: they stay
 * dequantized), -1 with err on a bad scale tensor. */
int rp_quant_row_scales(const rp_quant_config *q, const char *name, int64_t rows, int64_t cols,
                        const rp_st_tensor *scale, float *row_scale, rp_err *err);

/* Where weight `name`'s scales are RP_FP8_BLOCK x RP_FP8_BLOCK blocks
 * (model.h): the grid, checked (finite, not negative), into grid
 * [ceil(rows / 128) * ceil(cols / 128)] as f32, and 1. 0 for any other
 * layout (rows, tensor, other block sizes), -1 with err on a bad scale
 * tensor (a grid of the wrong shape, NaN, infinite or negative values). */
int rp_quant_block_scales(const rp_quant_config *q, const char *name, int64_t rows, int64_t cols,
                          const rp_st_tensor *scale, float *grid, rp_err *err);

/* A KV cache scale tensor `name` (k_scale, v_scale, kv_scale,
 * output_scale: one element, shape [] or [1], f32, bf16 or f16) into *out;
 * an error naming the tensor when it has more elements, another dtype, or a
 * value that is not positive and finite (a zero scale would divide by 0). */
int rp_quant_kv_scale(const char *name, const rp_st_tensor *t, float *out, rp_err *err);

/* --quantization fp8 (vLLM's): a bf16 matrix [rows, cols] quantized at
 * load with one scale per output channel (row): scale = max|w| / 448 (1 for
 * a row of zeros), q = e4m3(w / scale) rounded to nearest even, and deq =
 * bf16(q * scale), the values the quantized model computes with (the CPU
 * backend's weights). Every step is exactly rounded fp32, so the CUDA
 * backend's kernel (rp_k_quant_fp8_rows) makes the same bytes. */
void rp_quant_fp8_rows(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q, float *scale, uint16_t *deq);

/* Its two halves: the scale of one row of cols bf16 values (max|w| / 448,
 * 1 for zeros), and rows quantized with scales given (scale[rows]). A
 * column slice of a matrix (tensor parallelism's o_proj and down_proj,
 * dist/tp_model.c) is quantized with its whole rows' scales, so that its
 * bytes are those columns of the whole matrix's. */
float rp_quant_fp8_row_scale(const uint16_t *w, int64_t cols);
void rp_quant_fp8_rows_scaled(const uint16_t *w, int64_t rows, int64_t cols, const float *scale, uint8_t *q,
                              uint16_t *deq);

/* The same per RP_FP8_BLOCK x RP_FP8_BLOCK block (the official FP8
 * checkpoints' layout, for tests and benchmarks on dummy weights): block
 * (i, j)'s scale grid[i * ceil(cols / 128) + j] = max|w| / 448 over the
 * block (1 for a block of zeros), q = e4m3(w / scale), deq = bf16(q *
 * scale). The CUDA kernel rp_k_quant_fp8_blocks makes the same bytes. */
void rp_quant_fp8_blocks(const uint16_t *w, int64_t rows, int64_t cols, uint8_t *q, float *grid, uint16_t *deq);

#endif
