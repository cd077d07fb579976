/* Element types of weights and activations, and bf16/fp16 <-> fp32.
 *
 * bf16 is the storage type of weights everywhere; arithmetic is fp32. The
 * conversions are exact for bf16 -> fp32 and round-to-nearest-even for
 * fp32 -> bf16, matching torch's .to(torch.bfloat16). */
#ifndef RP_UTIL_DTYPE_H
#define RP_UTIL_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* F8_E4M3: FP8 checkpoints' weights (model/quant.c dequantizes them with
 * their scales at load). */
typedef enum rp_dtype { RP_DTYPE_BF16 = 0, RP_DTYPE_F16, RP_DTYPE_F32, RP_DTYPE_F8_E4M3 } rp_dtype;

size_t rp_dtype_size(rp_dtype t);

static inline float rp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t rp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float rp_f16_to_f32(uint16_t h);
/* OCP FP8 E4M3 (torch.float8_e4m3fn): bias 7, no infinities, S.1111.111 is
 * NaN, 448 the largest finite value; exact in fp32. */
float rp_f8e4m3_to_f32(uint8_t v);
/* fp32 -> E4M3, round to nearest even, saturating to +-448 (NaN -> NaN):
 * what the GPU's cvt.rn.satfinite.e4m3x2.f32 does, so that weights
 * quantized on the host and on the GPU are the same bytes. */
uint8_t rp_f32_to_f8e4m3(float f);

#endif
