/* dtype sizes and the IEEE half -> float conversion. */
#include "util/dtype.h"

#include <math.h>

size_t rp_dtype_size(rp_dtype t) {
    switch (t) {
    case RP_DTYPE_BF16:
    case RP_DTYPE_F16: return 2;
    case RP_DTYPE_F32: return 4;
    case RP_DTYPE_F8_E4M3: return 1;
    }
    return 0;
}

float rp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float rp_f8e4m3_to_f32(uint8_t v) {
    const int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
    float f;
    if (exp == 15 && man == 7) return sign ? -NAN : NAN;
    if (exp == 0) f = ldexpf((float)man, -9); /* subnormal: man / 8 * 2^-6 */
    else f = ldexpf((float)(8 + man), exp - 10);
    return sign ? -f : f;
}

uint8_t rp_f32_to_f8e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e; /* satfinite */
    if (a < 0x1p-6f) /* subnormal: m * 2^-9; m = 8 is the smallest normal's code */
        return sign | (uint8_t)nearbyintf(a * 0x1p9f);
    int e2;
    frexpf(a, &e2); /* a = fr * 2^e2, fr in [0.5, 1): the exponent is e2 - 1 */
    int e = e2 - 1, r = (int)nearbyintf(ldexpf(a, 3 - e)); /* in [8, 16] */
    if (r == 16) {
        r = 8;
        e++;
    }
    if (e + 7 > 15 || (e + 7 == 15 && r - 8 == 7)) return sign | 0x7e;
    return sign | (uint8_t)(((e + 7) << 3) | (r - 8));
}
