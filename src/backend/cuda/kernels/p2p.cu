/* The one-shot all-reduce through peer memory (comm_p2p.c): for the small
 * sums of tensor parallelism at small batch, where NCCL's latency, not the
 * bytes, is the cost. One kernel on each rank's stream:
 *
 *  1. block b copies its chunk of the buffer into this rank's slot (slot
 *     parity = the block's call number e, kept on the device so that a
 *     captured graph replays it unchanged);
 *  2. it release-stores e into every peer's flag for (block b, this rank),
 *     through peer memory (NVLink), and acquire-spins until its own flags
 *     of every peer hold e;
 *  3. it sums the chunk of every rank's slot in rank order into the buffer:
 *     the same bits on every rank.
 *
 * Two slots suffice: a rank writes slot parity e again at call e + 2 only
 * after every peer reached call e + 1, which each does after reading call
 * e's slots. Every call runs the same grid, so block b's call numbers agree
 * on every rank. A spin that never ends (a peer gone) leaves when the host
 * sets the abort word (host-mapped memory), which the watchdog does. */
#include "common.cuh"

#include "../kernels.h"

#define P2P_THREADS 256

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* 16 bytes of f32 or bf16 values, summed in f32 */
__device__ __forceinline__ void acc16(float s[8], uint4 v, bool bf16) {
    if (bf16) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        for (int i = 0; i < 4; i++) {
            s[2 * i] += rp_bf16_lo(w[i]);
            s[2 * i + 1] += rp_bf16_hi(w[i]);
        }
    } else {
        s[0] += __uint_as_float(v.x), s[1] += __uint_as_float(v.y);
        s[2] += __uint_as_float(v.z), s[3] += __uint_as_float(v.w);
    }
}

__device__ __forceinline__ uint4 pack16(const float s[8], bool bf16) {
    if (!bf16) return make_uint4(__float_as_uint(s[0]), __float_as_uint(s[1]), __float_as_uint(s[2]),
                                 __float_as_uint(s[3]));
    return make_uint4(rp_pack_bf16x2(s[0], s[1]), rp_pack_bf16x2(s[2], s[3]), rp_pack_bf16x2(s[4], s[5]),
                      rp_pack_bf16x2(s[6], s[7]));
}

/* buf: n16 16-byte vectors, 16-byte aligned (comm_p2p.c sends the rest to
 * NCCL). Block b takes vectors [b * per, (b + 1) * per). */
__global__ void __launch_bounds__(P2P_THREADS) p2p_all_reduce_kernel(rp_p2p_args a, uint4 *buf, int n16, int bf16) {
    __shared__ uint32_t e_s;
    __shared__ int stop;
    const int b = blockIdx.x, tid = threadIdx.x;
    rp_pdl_wait();
    if (tid == 0) {
        e_s = a.calls[b] + 1;
        a.calls[b] = e_s;
        stop = 0;
    }
    __syncthreads();
    const uint32_t e = e_s;
    const size_t parity_off = (size_t)(e & 1) * a.slot_bytes;
    const int per = (n16 + RP_P2P_BLOCKS - 1) / RP_P2P_BLOCKS, lo = min(n16, b * per), hi = min(n16, lo + per);
    uint4 *mine = reinterpret_cast<uint4 *>(a.slot[a.rank] + parity_off);
    for (int i = lo + tid; i < hi; i += P2P_THREADS) mine[i] = __ldcg(buf + i);
    __syncthreads();
    /* thread j < size speaks with rank j: the barrier above orders the
     * block's copies before its release */
    if (tid < a.size && tid != a.rank) {
        st_release_sys(a.flags[tid] + b * RP_P2P_MAX_RANKS + a.rank, e);
        const uint32_t *f = a.flags[a.rank] + b * RP_P2P_MAX_RANKS + tid;
        for (unsigned spins = 0; (int)(ld_acquire_sys(f) - e) < 0; spins++) {
            if ((spins & 255) == 255 && *(volatile int *)a.abort) {
                stop = 1;
                break;
            }
        }
    }
    __syncthreads();
    /* The next kernel only once every rank has arrived: scheduled earlier
     * (PDL), its blocks would sit on SMs through the wait, and where the
     * ranks share a GPU (the one-GPU harness) they can fill it so that the
     * peer's kernels before its all-reduce never run. */
    rp_pdl_trigger();
    if (stop) return;
    const bool h = bf16 != 0;
    for (int i = lo + tid; i < hi; i += P2P_THREADS) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = 0; k < a.size; k++) acc16(s, __ldcg(reinterpret_cast<const uint4 *>(a.slot[k] + parity_off) + i), h);
        buf[i] = pack16(s, h);
    }
}

extern "C" int rp_k_p2p_all_reduce(const rp_p2p_args *a, void *buf, int n16, int bf16, cudaStream_t stream) {
    if (a->size < 1 || a->size > RP_P2P_MAX_RANKS || (size_t)n16 * 16 > a->slot_bytes ||
        ((uintptr_t)buf & 15))
        return (int)cudaErrorInvalidValue;
    return rp_launch(p2p_all_reduce_kernel, dim3(RP_P2P_BLOCKS), dim3(P2P_THREADS), 0, stream, *a,
                     static_cast<uint4 *>(buf), n16, bf16);
}
