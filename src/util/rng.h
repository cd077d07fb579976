/* Counter-based random numbers: value = f(seed, stream, counter).
 *
 * Counter-based rather than stateful so that any thread, and the GPU, can
 * produce element i of a random tensor (or the draw for step n of a request)
 * without generating everything before it. Same seed, same output, whatever
 * the thread count. The device twins live in backend/cuda/kernels/
 * (common.cuh: uniform; misc.cu: normal) and tools/gpu_compare.py mirrors
 * the normal in torch; the fill_dummy CUDA test checks bit-identity. */
#ifndef RP_UTIL_RNG_H
#define RP_UTIL_RNG_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t rp_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rp_rand_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return rp_mix64(rp_mix64(seed ^ rp_mix64(stream)) + counter);
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in fp32). */
static inline float rp_rand_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(rp_rand_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

/* ---- standard normals, bit-identical on every platform -------------------
 *
 * Dummy weights are made on the host (model/weights.c), on the GPU
 * (kernels/misc.cu) and by torch (tools/gpu_compare.py), and all three must
 * give the same bf16 values. libm's log, sin and cos differ by an ulp between
 * glibc, CUDA and torch (and are ~2x slower here), so they are not used:
 * everything is IEEE-754 double +, -, *, / and sqrt (correctly rounded
 * everywhere) and bit operations (exact), in one fixed order. The series are
 * truncated Taylor series, accurate to ~1e-12 relative, far below what bf16
 * (4e-3) can see; what makes the result reproducible is the fixed sequence of
 * roundings, not the accuracy. No a*b+c may be fused: GCC does not contract
 * under -std=c11 (and x86-64 has no FMA without -mfma); the CUDA twin uses
 * __dmul_rn/__dadd_rn; torch runs one op per kernel. */

/* Coefficients as Python's repr prints them: each is the same double in C,
 * CUDA and Python. Lists, so that the CUDA twin's __constant__ copies are
 * these very literals. */
#define RP_NORMAL_LOG_TERMS 7 /* 1/(2k+1) */
#define RP_NORMAL_LOG_C \
    1.0, 0.3333333333333333, 0.2, 0.14285714285714285, 0.1111111111111111, 0.09090909090909091, 0.07692307692307693
#define RP_NORMAL_COS_TERMS 8 /* (-1)^k/(2k)! */
#define RP_NORMAL_COS_C                                                                                           \
    1.0, -0.5, 0.041666666666666664, -0.001388888888888889, 2.48015873015873e-05, -2.755731922398589e-07, \
        2.08767569878681e-09, -1.1470745597729725e-11
#define RP_NORMAL_SIN_TERMS 7 /* (-1)^k/(2k+1)! */
#define RP_NORMAL_SIN_C                                                                                  \
    1.0, -0.16666666666666666, 0.008333333333333333, -0.0001984126984126984, 2.7557319223985893e-06, \
        -2.505210838544172e-08, 1.6059043836821613e-10
static const double rp_normal_log_c[RP_NORMAL_LOG_TERMS] = {RP_NORMAL_LOG_C};
static const double rp_normal_cos_c[RP_NORMAL_COS_TERMS] = {RP_NORMAL_COS_C};
static const double rp_normal_sin_c[RP_NORMAL_SIN_TERMS] = {RP_NORMAL_SIN_C};
#define RP_NORMAL_LN2 0.6931471805599453
#define RP_NORMAL_SQRT2 1.4142135623730951
#define RP_NORMAL_PI_4 0.7853981633974483

static inline double rp_bits_f64(uint64_t b) {
    double d;
    memcpy(&d, &b, 8);
    return d;
}

static inline uint64_t rp_f64_bits(double d) {
    uint64_t b;
    memcpy(&b, &d, 8);
    return b;
}

/* p = c[n-1]; p = p * x + c[k] for k = n-2 .. 0 (two roundings each step). */
static inline double rp_normal_horner(const double *c, int n, double x) {
    double p = c[n - 1];
    for (int k = n - 2; k >= 0; k--) {
        p = p * x;
        p = p + c[k];
    }
    return p;
}

/* ln(u) for u in [2^-53, 1]: u = m 2^e with e the exponent of u sqrt(2), so
 * m in about [sqrt(1/2), sqrt(2)) (which side of a boundary a value falls on
 * does not matter, only that every platform decides alike: one IEEE
 * multiply); then ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172. */
static inline double rp_normal_log(double u) {
    int e = (int)(rp_f64_bits(u * RP_NORMAL_SQRT2) >> 52) - 1023;
    double m = u * rp_bits_f64((uint64_t)(1023 - e) << 52); /* exact: times 2^-e */
    double s = (m - 1.0) / (m + 1.0), w = s * s;
    double lnm = 2.0 * (s * rp_normal_horner(rp_normal_log_c, RP_NORMAL_LOG_TERMS, w));
    return (double)e * RP_NORMAL_LN2 + lnm;
}

/* Elements 2 pair and 2 pair + 1 of a standard normal stream: Box-Muller on
 * the 64-bit draws a, b of counters 2 pair and 2 pair + 1.
 *   radius r = sqrt(-2 ln u1), u1 = ((a >> 11) + 1) / 2^53 in (0, 1], so ln
 *   is finite and |z| <= sqrt(106 ln 2) = 8.57;
 *   angle: (cos t, sin t) for t uniform on [0, 2 pi) is drawn as (cos phi,
 *   sin phi), phi = pi/4 (b bits 8..60) / 2^53 uniform on [0, pi/4), mapped
 *   onto one of the 8 octants by the symmetries of the square: bit 61 swaps
 *   the two, bits 63 and 62 negate them. Same distribution as the textbook
 *   form, with series that converge fast on [0, pi/4].
 * The pair shares one log and one sqrt, which halves their cost. */
static inline void rp_rand_normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, double z[2]) {
    uint64_t a = rp_rand_u64(seed, stream, 2 * pair), b = rp_rand_u64(seed, stream, 2 * pair + 1);
    /* via int64: one conversion instruction instead of the unsigned dance */
    double u1 = (double)(int64_t)((a >> 11) + 1) * 0x1p-53;
    double r = sqrt(-2.0 * rp_normal_log(u1));
    double t = (double)(int64_t)((b >> 8) & ((1ull << 53) - 1)) * 0x1p-53;
    double phi = t * RP_NORMAL_PI_4, x = phi * phi;
    uint64_t sinb = rp_f64_bits(phi * rp_normal_horner(rp_normal_sin_c, RP_NORMAL_SIN_TERMS, x));
    uint64_t cosb = rp_f64_bits(rp_normal_horner(rp_normal_cos_c, RP_NORMAL_COS_TERMS, x));
    /* selects and signs as bit operations: random branches would mispredict */
    uint64_t swap = 0 - ((b >> 61) & 1);
    uint64_t c = ((cosb & ~swap) | (sinb & swap)) ^ (b >> 63 << 63);
    uint64_t s = ((sinb & ~swap) | (cosb & swap)) ^ ((b >> 62) & 1) << 63;
    z[0] = r * rp_bits_f64(c);
    z[1] = r * rp_bits_f64(s);
}

/* Element i of the stream above, on its own. */
static inline double rp_rand_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    double z[2];
    rp_rand_normal_pair(seed, stream, i >> 1, z);
    return z[i & 1];
}

#endif
