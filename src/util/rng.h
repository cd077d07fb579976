/* Counter-based random numbers: value = f(seed, stream, counter).
 *
 * Counter-based rather than stateful so that any thread, and later the GPU,
 * can produce element i of a random tensor (or the draw for step n of a
 * request) without generating everything before it. Same seed, same output,
 * whatever the thread count. */
#ifndef RP_UTIL_RNG_H
#define RP_UTIL_RNG_H

#include <stdint.h>

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

#endif
