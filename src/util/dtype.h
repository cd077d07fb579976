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

typedef enum rp_dtype { RP_DTYPE_BF16 = 0, RP_DTYPE_F16, RP_DTYPE_F32 } rp_dtype;

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

#endif
