/* RoPE frequencies and amplitude as transformers computes them, shared by
 * every backend so the CPU reference and the GPU rotate by the same angles. */
#ifndef RP_MODEL_ROPE_H
#define RP_MODEL_ROPE_H

#include "model/config.h"

/* inv_freq[i], i < head_dim / 2: 1 / theta^(2i / head_dim) in fp32, then the
 * config's scaling (transformers' _compute_*_parameters): llama3's banded
 * division, linear's division by factor, yarn's blend of the interpolated
 * and the original frequencies. The angle of position p is then
 * float(p) * inv_freq[i], also in fp32. */
void rp_rope_inv_freq(const rp_model_config *c, float *inv_freq);

/* What transformers multiplies cos and sin by (its attention_scaling):
 * yarn's attention factor, 1 for every other type. Multiplying both q and
 * k scales the attention logits by its square, sharpening the softmax at
 * the longer contexts yarn is for. */
float rp_rope_attention_scale(const rp_model_config *c);

#endif
