/* RoPE frequencies as transformers computes them, shared by every backend
 * so the CPU reference and the GPU rotate by the same angles. */
#ifndef RP_MODEL_ROPE_H
#define RP_MODEL_ROPE_H

#include "model/config.h"

/* inv_freq[i], i < head_dim / 2: 1 / theta^(2i / head_dim) in fp32, then
 * llama3 frequency scaling when the config has it (transformers'
 * _compute_llama3_parameters). The angle of position p is then
 * float(p) * inv_freq[i], also in fp32. */
void rp_rope_inv_freq(const rp_model_config *c, float *inv_freq);

#endif
