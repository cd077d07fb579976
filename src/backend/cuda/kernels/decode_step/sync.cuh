/* The step's synchronisation primitives: tagged 64-bit words that carry a
 * value from one block to another without a fence, the mbarriers and bulk
 * copies of the weight ring, and the consumer warps' named barrier. */
#ifndef RP_DECODE_STEP_SYNC_CUH
#define RP_DECODE_STEP_SYNC_CUH

#include "layout.cuh"

/* A value another block will read travels as one 64-bit word, the float in
 * the low half and a tag in the high half. A 64-bit access is single-copy
 * atomic, so a reader that sees the tag it expects sees the value written
 * with it, and no fence or counter is needed to publish it (the idea of
 * NCCL's LL protocol). Tags, (launch << 8) | (layer + 1), never repeat
 * what a word held before: an earlier layer or the previous launch. */
__device__ __forceinline__ unsigned ll_tag(unsigned launch, int layer) {
    return (launch << 8) | (unsigned)(layer + 1);
}
__device__ __forceinline__ void ll_store(unsigned long long *w, float v, unsigned tag) {
    const unsigned long long x = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(w), "l"(x) : "memory");
}
__device__ __forceinline__ unsigned long long ll_load(const unsigned long long *w) {
    unsigned long long x;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(x) : "l"(w) : "memory");
    return x;
}
/* x, reloaded from w until it carries tag; its float. */
__device__ __forceinline__ float ll_value(unsigned long long x, const unsigned long long *w, unsigned tag) {
    while ((unsigned)(x >> 32) != tag) x = ll_load(w);
    return __uint_as_float((unsigned)x);
}

/* The same across GPUs (tensor parallelism: rp_decode_step_tp's picks), at
 * system scope: a rank stores into another GPU's memory through NVLink,
 * and a reader polls its own (one warp a rank: every block's threads
 * polling the sums' rows this way cost 4.8 us a sum, bench/RESULTS.md). A
 * reader of a rank that is gone gives up when the host sets the abort word
 * (its results are then garbage; the step fails). */
__device__ __forceinline__ void ll_store_sys(unsigned long long *w, unsigned lo, unsigned tag) {
    const unsigned long long x = ((unsigned long long)tag << 32) | lo;
    asm volatile("st.relaxed.sys.global.b64 [%0], %1;" ::"l"(w), "l"(x) : "memory");
}
__device__ __forceinline__ unsigned long long ll_load_sys(const unsigned long long *w) {
    unsigned long long x;
    asm volatile("ld.relaxed.sys.global.b64 %0, [%1];" : "=l"(x) : "l"(w) : "memory");
    return x;
}
/* x's low half once w carries tag (x: w's first load) */
__device__ __forceinline__ unsigned ll_wait_sys(unsigned long long x, const unsigned long long *w, unsigned tag,
                                                const int *abort) {
    for (unsigned spins = 1; (unsigned)(x >> 32) != tag; spins++) {
        if ((spins & 255) == 0 && *(const volatile int *)abort) break;
        x = ll_load_sys(w);
    }
    return (unsigned)x;
}

/* ---- mbarriers and the bulk copy (PTX ISA 8.0, sm_90) -------------------- */

__device__ __forceinline__ uint32_t ds_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(ds_saddr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ds_saddr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(ds_saddr(bar)) : "memory");
}
/* [src, src + bytes) into shared memory; bytes a multiple of 16. Weights
 * are read once per step: evict-first keeps L2 for the KV cache and the
 * activations. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(ds_saddr(dst)),
                 "l"(src), "r"(bytes), "r"(ds_saddr(bar)), "l"(policy)
                 : "memory");
}

/* The eight consumer warps' barrier (the producer never joins). */
__device__ __forceinline__ void cbar(void) { asm volatile("bar.sync 1, %0;" ::"n"(DS_CONSUMERS * 32) : "memory"); }

#endif
