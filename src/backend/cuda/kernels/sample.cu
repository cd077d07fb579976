/* Token selection on the device, so that only token ids leave the GPU.
 *
 * One block per row. Greedy rows take the argmax (lowest id on ties). Other
 * rows follow the host sampler (src/engine/sampler.c) step for step:
 * temperature (clamped to 0.01) -> top-k -> top-p -> min-p -> inverse-CDF
 * draw with u = rp_rand_uniform(seed, 0, step), all defined over the total
 * order (logit descending, id ascending). Every stage keeps a prefix of
 * that order, so the kept set is one boundary (key, id) plus the min-p
 * threshold, and each "walk the sorted list until the running weight
 * reaches X" is a radix select: four 8-bit levels over an order-preserving
 * 32-bit key of the logit, with histograms in shared memory (warp-
 * aggregated atomics), then a tie break by id among equal logits.
 *
 * Weights are exp((logit - max) / T) in fixed point (2^44 = the top token,
 * rounded to nearest so that the tail's rounding errors cancel instead of
 * adding up), summed in 64-bit integers: sums are exact and independent of
 * the order of atomics, so a (seed, step) always gives the same token.
 * Tokens whose mass is below 2^-45 of the top token's get weight 0 and
 * cannot be drawn (the host sampler draws them with probability < 1e-13).
 *
 * After top-k (k <= SMP_CAP) the k kept tokens are copied to shared memory
 * and the later stages run there. */
#include <float.h>
#include <math.h>

#include "common.cuh"

#define SMP_THREADS 1024
#define SMP_CAP 4096
#define SMP_ONE 17592186044416.0f /* 2^44: fixed-point weight of the top token */
#define SMP_MAX_VOCAB (1 << 19)     /* so that 2^44 * vocab < 2^64 */

__device__ __forceinline__ float sanitize(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    return x;
}

/* Order-preserving key: a larger logit gives a larger key. -inf maps to
 * 0x007fffff; finite logits are above it. */
__device__ __forceinline__ uint32_t order_key(float x) {
    uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
#define KEY_NEG_INF 0x007fffffu

typedef struct smp_state {
    float max_logit, inv_temp, min_p;
    uint32_t bkey; /* kept: key > bkey, or key == bkey and id <= bid */
    int bid;
    int use_list, n_list;
} smp_state;

__device__ __forceinline__ uint64_t weight_of(float x, const smp_state &st) {
    const float m = expf((x - st.max_logit) * st.inv_temp);
    return (uint64_t)__float2ull_rn(m * SMP_ONE);
}

__device__ __forceinline__ bool is_kept(uint32_t key, int id, float x, const smp_state &st) {
    if (key <= KEY_NEG_INF) return false;
    if (key < st.bkey || (key == st.bkey && id > st.bid)) return false;
    if (st.min_p > 0.0f && expf((x - st.max_logit) * st.inv_temp) < st.min_p) return false;
    return true;
}

struct smp_shared {
    uint64_t hist_w[256];
    uint32_t hist_c[256];
    int hist_minid[256];
    uint64_t red[32];
    smp_state st;
    uint32_t prefix;
    uint64_t rem;
    int done, found_id;
    int count_scan[SMP_THREADS];
    float list_x[SMP_CAP];
    int list_id[SMP_CAP];
};

/* Visits every kept token; all threads of a warp run the same number of
 * iterations (invalid ones with ok = false) so warp collectives are safe. */
template <class F>
__device__ __forceinline__ void for_each(const float *row, int vocab, smp_shared &sh, F f) {
    const smp_state &st = sh.st;
    const int n = st.use_list ? st.n_list : vocab;
    for (int base = 0; base < n; base += SMP_THREADS) {
        const int i = base + threadIdx.x;
        bool ok = i < n;
        float x = -INFINITY;
        int id = 0;
        if (ok) {
            if (st.use_list) {
                x = sh.list_x[i];
                id = sh.list_id[i];
            } else {
                x = sanitize(row[i]);
                id = i;
            }
        }
        const uint32_t key = order_key(x);
        ok = ok && is_kept(key, id, x, st);
        f(ok, key, id, x);
    }
}

__device__ uint64_t block_sum_u64(uint64_t v, smp_shared &sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RP_FULL_MASK, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x >> 5] = v;
    __syncthreads();
    uint64_t r = 0;
    for (int w = 0; w < SMP_THREADS / 32; w++) r += sh.red[w];
    return r;
}

/* Total weight of the kept set. */
__device__ uint64_t kept_mass(const float *row, int vocab, smp_shared &sh) {
    uint64_t acc = 0;
    for_each(row, vocab, sh, [&](bool ok, uint32_t, int, float x) {
        if (ok) acc += weight_of(x, sh.st);
    });
    return block_sum_u64(acc, sh);
}

/* Finds the token at which the running weight over the kept set, walked in
 * sampling order, reaches target (inclusive: >=, else >), and makes the
 * kept set the prefix ending there. If the target is never reached the kept
 * set stays whole and 0 is returned; else 1. */
__device__ int select_prefix(const float *row, int vocab, smp_shared &sh, bool by_mass, bool inclusive,
                             uint64_t target) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.rem = target;
        sh.done = 0;
    }
    uint32_t mask = 0;
    for (int level = 0; level < 4; level++) {
        const int shift = 24 - 8 * level;
        for (int b = threadIdx.x; b < 256; b += SMP_THREADS) {
            sh.hist_w[b] = 0;
            sh.hist_c[b] = 0;
            sh.hist_minid[b] = 0x7fffffff;
        }
        __syncthreads();
        const uint32_t prefix = sh.prefix;
        for_each(row, vocab, sh, [&](bool ok, uint32_t key, int id, float x) {
            ok = ok && (key & mask) == prefix;
            const int bin = ok ? (int)((key >> shift) & 255u) : -1;
            const uint32_t group = __match_any_sync(RP_FULL_MASK, bin);
            if (bin < 0) return;
            const uint64_t w = by_mass ? weight_of(x, sh.st) : 1;
            /* weights are <= 2^44: a 21-bit and a 24-bit half, each summed
             * over 32 lanes in 32 bits without overflow */
            const uint32_t lo = __reduce_add_sync(group, (uint32_t)(w & 0x1fffff));
            const uint32_t hi = __reduce_add_sync(group, (uint32_t)(w >> 21));
            const int min_id = (int)__reduce_min_sync(group, (uint32_t)id);
            if (lane == __ffs(group) - 1) {
                atomicAdd((unsigned long long *)&sh.hist_w[bin], (unsigned long long)(((uint64_t)hi << 21) + lo));
                atomicAdd(&sh.hist_c[bin], (uint32_t)__popc(group));
                if (level == 3) atomicMin(&sh.hist_minid[bin], min_id);
            }
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t rem = sh.rem;
            int chosen = -1;
            for (int b = 255; b >= 0; b--) {
                const uint64_t w = sh.hist_w[b];
                if (inclusive ? w >= rem : w > rem) {
                    chosen = b;
                    break;
                }
                rem -= w;
            }
            if (chosen < 0) {
                sh.done = -1; /* never reached: keep everything */
            } else {
                sh.prefix |= (uint32_t)chosen << shift;
                sh.rem = rem;
                if (level == 3) {
                    const uint32_t c = sh.hist_c[chosen];
                    const uint64_t wt = sh.hist_w[chosen] / c; /* tied keys share one weight */
                    /* m-th token (1-based) among the ties, in id order */
                    const uint64_t m = inclusive ? (rem + wt - 1) / wt : rem / wt + 1;
                    sh.found_id = (c == 1 || m <= 1) ? sh.hist_minid[chosen] : -(int)m;
                }
            }
        }
        __syncthreads();
        if (sh.done < 0) return 0;
        mask |= 255u << shift;
    }

    const uint32_t key_star = sh.prefix;
    if (sh.found_id < 0) {
        /* Several tied tokens and not the first: the m-th lowest id among
         * them. Each thread takes a contiguous id range (list: a contiguous
         * index range, whose ids are then compared directly). */
        const int m = -sh.found_id;
        const smp_state &st = sh.st;
        const int n = st.use_list ? st.n_list : vocab;
        const int per = (n + SMP_THREADS - 1) / SMP_THREADS;
        const int lo = threadIdx.x * per, hi = min(n, lo + per);
        int cnt = 0;
        for (int i = lo; i < hi; i++) {
            const float x = st.use_list ? sh.list_x[i] : sanitize(row[i]);
            const int id = st.use_list ? sh.list_id[i] : i;
            const uint32_t key = order_key(x);
            cnt += key == key_star && is_kept(key, id, x, st);
        }
        if (st.use_list) {
            /* List order is not id order: rank each tied id directly. */
            __syncthreads();
            for (int i = lo; i < hi; i++) {
                const float x = sh.list_x[i];
                const int id = sh.list_id[i];
                const uint32_t key = order_key(x);
                if (key != key_star || !is_kept(key, id, x, st)) continue;
                int rank = 0;
                for (int j = 0; j < n; j++) {
                    const float xj = sh.list_x[j];
                    const uint32_t kj = order_key(xj);
                    rank += kj == key_star && sh.list_id[j] < id && is_kept(kj, sh.list_id[j], xj, st);
                }
                if (rank == m - 1) sh.found_id = id;
            }
        } else {
            sh.count_scan[threadIdx.x] = cnt;
            __syncthreads();
            if (threadIdx.x == 0) {
                int run = 0;
                for (int t = 0; t < SMP_THREADS; t++) {
                    const int c = sh.count_scan[t];
                    sh.count_scan[t] = run;
                    run += c;
                }
            }
            __syncthreads();
            const int before = sh.count_scan[threadIdx.x];
            if (m > before && m <= before + cnt) {
                int seen = before;
                for (int i = lo; i < hi; i++) {
                    const float x = sanitize(row[i]);
                    const uint32_t key = order_key(x);
                    if (key == key_star && is_kept(key, i, x, st) && ++seen == m) {
                        sh.found_id = i;
                        break;
                    }
                }
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sh.st.bkey = key_star;
        sh.st.bid = sh.found_id;
    }
    __syncthreads();
    return 1;
}

__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel(const float *__restrict__ logits, const rp_sample_params *__restrict__ params,
                  int32_t *__restrict__ tokens, float *__restrict__ logprobs, int vocab) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    smp_shared &sh = *reinterpret_cast<smp_shared *>(smem_raw);
    __shared__ float red_v[32];
    __shared__ int red_i[32];
    const int r = blockIdx.x;
    const float *row = logits + (int64_t)r * vocab;
    const rp_sample_params p = params[r];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    /* argmax (lowest id on ties) */
    float best = -INFINITY;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        const float x = sanitize(row[i]);
        if (x > best || (x == best && i < best_i)) {
            best = x;
            best_i = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(RP_FULL_MASK, best, o);
        const int oi = __shfl_xor_sync(RP_FULL_MASK, best_i, o);
        if (ov > best || (ov == best && oi < best_i)) {
            best = ov;
            best_i = oi;
        }
    }
    if (lane == 0) {
        red_v[warp] = best;
        red_i[warp] = best_i;
    }
    __syncthreads();
    best = red_v[0];
    best_i = red_i[0];
    for (int w = 1; w < SMP_THREADS / 32; w++)
        if (red_v[w] > best || (red_v[w] == best && red_i[w] < best_i)) {
            best = red_v[w];
            best_i = red_i[w];
        }
    if (best == -INFINITY) best_i = 0;

    if (p.temperature == 0.0f || best == -INFINITY) {
        if (logprobs) {
            /* log-softmax at temperature 1 of the argmax */
            float s = 0.0f;
            if (best != -INFINITY)
                for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) s += expf(sanitize(row[i]) - best);
            __shared__ float scratch[33];
            s = rp_block_sum(s, scratch);
            if (threadIdx.x == 0) logprobs[r] = best == -INFINITY ? -INFINITY : -logf(s);
        }
        if (threadIdx.x == 0) tokens[r] = best_i;
        return;
    }

    const float temp = p.temperature < 0.01f ? 0.01f : p.temperature;
    if (threadIdx.x == 0) {
        sh.st.max_logit = best;
        sh.st.inv_temp = 1.0f / temp;
        sh.st.min_p = 0.0f;
        sh.st.bkey = 0;
        sh.st.bid = 0x7fffffff;
        sh.st.use_list = 0;
        sh.st.n_list = 0;
    }
    __syncthreads();

    if (p.top_k > 0 && p.top_k < vocab) {
        if (select_prefix(row, vocab, sh, false, true, (uint64_t)p.top_k) && p.top_k <= SMP_CAP) {
            /* The k survivors move to shared memory for the later stages. */
            if (threadIdx.x == 0) sh.done = 0;
            __syncthreads();
            for_each(row, vocab, sh, [&](bool ok, uint32_t, int id, float x) {
                if (!ok) return;
                const int slot = atomicAdd(&sh.done, 1);
                sh.list_x[slot] = x;
                sh.list_id[slot] = id;
            });
            __syncthreads();
            if (threadIdx.x == 0) {
                sh.st.n_list = sh.done;
                sh.st.use_list = 1;
                sh.st.bkey = 0; /* the list is exactly the kept set */
                sh.st.bid = 0x7fffffff;
            }
            __syncthreads();
        }
    }
    if (p.top_p < 1.0f) {
        const uint64_t total = kept_mass(row, vocab, sh);
        const uint64_t target = (uint64_t)ceil((double)p.top_p * (double)total);
        select_prefix(row, vocab, sh, true, true, target);
    }
    if (p.min_p > 0.0f) {
        if (threadIdx.x == 0) sh.st.min_p = p.min_p;
        __syncthreads();
    }
    const uint64_t total = kept_mass(row, vocab, sh);
    const float u = rp_d_rand_uniform(p.seed, 0, p.step);
    uint64_t target = (uint64_t)((double)u * (double)total);
    if (total > 0 && target >= total) target = total - 1;
    const int found = total > 0 && select_prefix(row, vocab, sh, true, false, target);
    if (threadIdx.x == 0) {
        const int pick = found ? sh.st.bid : best_i;
        tokens[r] = pick;
        if (logprobs) {
            const double x = (double)sanitize(row[pick]);
            logprobs[r] = (float)((x - (double)best) / (double)temp - log((double)total / (double)SMP_ONE));
        }
    }
}

extern "C" size_t rp_sample_workspace_bytes(int rows, int vocab) {
    (void)rows;
    (void)vocab;
    return 256; /* everything lives in shared memory */
}

extern "C" int rp_k_sample(const float *logits, const rp_sample_params *params, int32_t *tokens, float *logprobs,
                           void *workspace, int rows, int vocab, cudaStream_t stream) {
    (void)workspace;
    if (rows <= 0) return cudaSuccess;
    if (vocab <= 0 || vocab > SMP_MAX_VOCAB) return (int)cudaErrorInvalidValue;
    static int attr_set = 0;
    const size_t bytes = sizeof(smp_shared);
    if (!attr_set) {
        cudaError_t e = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) return (int)e;
        attr_set = 1;
    }
    sample_kernel<<<rows, SMP_THREADS, bytes, stream>>>(logits, params, tokens, logprobs, vocab);
    return rp_launch_result();
}
