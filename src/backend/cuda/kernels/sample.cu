/* Token selection on the device, so that only token ids leave the GPU.
 *
 * Semantics (both paths): greedy rows take the argmax (lowest id on ties).
 * Other rows follow the host sampler (src/engine/sampler.c) step for step:
 * temperature (clamped to 0.01) -> top-k -> top-p -> min-p -> inverse-CDF
 * draw with u = rp_rand_uniform(seed, 0, step), all defined over the total
 * order (logit descending, id ascending). Every stage keeps a prefix of that
 * order. Weights are exp((logit - max) / T) in fixed point (2^44 = the top
 * token, rounded to nearest so that the tail's rounding errors cancel),
 * summed in 64-bit integers: sums are exact and independent of the order of
 * atomics, so a (seed, step) always gives the same token whatever the block
 * scheduling. Tokens whose mass is below 2^-45 of the top token's get weight
 * 0 and cannot be drawn (the host sampler draws them with p < 1e-13).
 *
 * Fast path: one thread-block cluster
 * of 8 or 16 blocks per row. Each block loads its slice of the row into
 * shared memory once; everything after that runs on shared memory, and the
 * blocks combine results through distributed shared memory between cluster
 * barriers (docs/memory-model.md lists each one). Steps:
 *   1. load + max / argmax / min finite; cluster reduce (every block);
 *      greedy rows: log-sum-exp for the logprob, done;
 *   2. one histogram pass: 2048 value bins of (max - logit) over
 *      min(max - min, 32 T) (bin order is sampling order; beyond 32 T the
 *      weight is 0 and everything goes to a last bin), count and exact
 *      weight per bin, and the min-p survivor count (min-p in double, like
 *      the host); the bins are summed across the cluster into block 0;
 *   3. block 0 walks the prefix sums of the bins to the bin where each
 *      stage's boundary falls; only where a weight inside a bin is needed
 *      are that bin's tokens gathered from the cluster (typically tens to
 *      hundreds), sorted by (logit, id) and scanned.
 * A bin of more than FS_CAP tokens that must be opened (thousands of exactly
 * or nearly tied logits with non-negligible mass) sends the row to the
 * exact slow path below, run by block 0 over the row in global memory.
 *
 * Slow path (also used when the vocabulary does not fit the cluster's shared
 * memory): one block per row, radix select over an order-preserving 32-bit
 * key of the logit, four 8-bit levels per select, histograms in shared
 * memory; after top-k (k <= SMP_CAP) the k kept tokens move to shared
 * memory for the later stages. */
#include <cooperative_groups.h>
#include <float.h>
#include <math.h>

#include "backend/cuda/sample_top.h"
#include "common.cuh"

namespace cg = cooperative_groups;

/* ======================= exact slow path (one block per row) ============== */

#define SMP_THREADS 512 /* two blocks per SM on the fast path (64 registers each) */
#define SMP_CAP 4096
#define SMP_ONE 17592186044416.0f /* 2^44: fixed-point weight of the top token */
#define SMP_MAX_VOCAB (1 << 19)     /* so that 2^44 * vocab < 2^64 */


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
                x = rp_sanitize_logit(row[i]);
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
            const float x = st.use_list ? sh.list_x[i] : rp_sanitize_logit(row[i]);
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
                    const float x = rp_sanitize_logit(row[i]);
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
    __syncthreads(); /* every thread has read found_id and prefix above */
    if (threadIdx.x == 0) {
        sh.st.bkey = key_star;
        sh.st.bid = sh.found_id;
    }
    __syncthreads();
    return 1;
}

/* kept (may be NULL): how many tokens of the sampling order the draw was
 * made from (the kept set is a prefix of the order; vocab for greedy rows),
 * for rp_k_top_logprobs. Counted only for rows that ask for top logprobs. */
__device__ __forceinline__ void sample_row_exact(const float *row, const rp_sampling_params p, int32_t *tok,
                                                 float *lp, int32_t *kept, int vocab, smp_shared &sh) {
    __shared__ float red_v[32];
    __shared__ int red_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    /* argmax (lowest id on ties) */
    float best = -INFINITY;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) {
        const float x = rp_sanitize_logit(row[i]);
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
        if (lp) {
            /* log-softmax at temperature 1 of the argmax */
            float s = 0.0f;
            if (best != -INFINITY)
                for (int i = threadIdx.x; i < vocab; i += SMP_THREADS) s += expf(rp_sanitize_logit(row[i]) - best);
            __shared__ float scratch[33];
            s = rp_block_sum(s, scratch);
            if (threadIdx.x == 0) *lp = best == -INFINITY ? -INFINITY : -logf(s);
        }
        if (threadIdx.x == 0) *tok = best_i;
        if (threadIdx.x == 0 && kept) *kept = vocab;
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
    if (kept && p.top_logprobs > 0) { /* the kept set is final here; the draw narrows sh.st next */
        uint64_t cnt = 0;
        for_each(row, vocab, sh, [&](bool ok, uint32_t, int, float) { cnt += ok ? 1 : 0; });
        cnt = block_sum_u64(cnt, sh);
        if (threadIdx.x == 0) *kept = (int32_t)cnt;
    }
    const uint64_t total = kept_mass(row, vocab, sh);
    const float u = rp_d_rand_uniform(p.seed, 0, p.step);
    uint64_t target = (uint64_t)((double)u * (double)total);
    if (total > 0 && target >= total) target = total - 1;
    const int found = total > 0 && select_prefix(row, vocab, sh, true, false, target);
    if (threadIdx.x == 0) {
        const int pick = found ? sh.st.bid : best_i;
        *tok = pick;
        if (lp) {
            const double x = (double)rp_sanitize_logit(row[pick]);
            *lp = (float)((x - (double)best) / (double)temp - log((double)total / (double)SMP_ONE));
        }
    }
}


/* Row r's token and logprob, as the thread that wrote them sees them, into
 * the host's result buffer (rp_sample_host). */
__device__ __forceinline__ void smp_mirror(const rp_sample_host &h, int r, const int32_t *tokens,
                                           const float *logprobs) {
    if (!h.rows[0]) return;
    int32_t *t = h.rows[*h.slot & 1];
    t[r] = tokens[r];
    if (logprobs) reinterpret_cast<float *>(t + h.stride)[r] = logprobs[r];
}

__global__ void __launch_bounds__(SMP_THREADS)
    sample_kernel_slow(const float *logits, const rp_sampling_params *__restrict__ params,
                       int32_t *__restrict__ tokens, float *__restrict__ logprobs, int32_t *__restrict__ kept,
                       rp_sample_host host, const int32_t *skip, int vocab) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    smp_shared &sh = *reinterpret_cast<smp_shared *>(smem_raw);
    rp_pdl_trigger();
    rp_pdl_wait();
    if (skip && *skip) return; /* sampled later, with token masks (sample_top.h) */
    const int r = blockIdx.x;
    sample_row_exact(logits + (int64_t)r * vocab, params[r], tokens + r, logprobs ? logprobs + r : NULL,
                     kept ? kept + r : NULL, vocab, sh);
    if (threadIdx.x == 0) smp_mirror(host, r, tokens, logprobs); /* thread 0 wrote them */
}

/* ======================= fast path (one cluster per row) ================== */

#define FS_THREADS SMP_THREADS /* the slow path runs in the same blocks */
#define FS_NB 2048             /* value bins; the last one holds the zero-weight tail */
#define FS_CAP (2 * FS_THREADS) /* most tokens of one bin that block 0 sorts (two per thread) */
#define FS_MAX_CLUSTER 16
#define FS_SPAN 32.0f          /* bins cover max - 32 T .. max: exp(-32) * 2^44 rounds to 0 */

typedef unsigned long long u64;

/* What each block publishes to the others (read through DSMEM). Fields of
 * different phases never share a word, so a block may write a later field
 * while others still read an earlier one. */
struct fs_slot {
    float max_x, min_x;
    int argmax;
    float sum_exp;
    unsigned n_minp;
};

struct fs_shared {
    /* this block's bins: the weight in three 15-bit parts (w < 2^45), each
     * summed in 32 bits without overflow (a slice has < 2^15 tokens), because
     * shared-memory atomics are native for 32 bits and a CAS loop for 64 */
    unsigned hist_p[3][FS_NB];
    unsigned hist_c[FS_NB];
    u64 cum_w[FS_NB + 2];    /* block 0: bin totals of the row, then their exclusive prefix sums */
    unsigned cum_c[FS_NB + 4]; /* (+2 / +4 keep the arrays after them 16-byte aligned) */
    u64 list_key[FS_CAP];    /* block 0: the gathered bin, (key << 32 | ~id), sorted descending */
    u64 list_psum[FS_CAP];   /* block 0: inclusive prefix sums of their weights */
    fs_slot slot;
    int cmd;                 /* block 0 -> others: bin to gather, or -1 = done */
    unsigned list_n;         /* gather slot counter (one DSMEM atomic per block and gather) */
    unsigned stage_n, stage_base;
    int cached_bin, res;
    float row_max, row_min;
    int row_argmax;
    float red_f[33], red_g[32]; /* red_f: rp_block_sum's scratch too */
    int red_i[32];
    u64 red64[32];
};
#define FS_SHARED_BYTES ((sizeof(fs_shared) + 15) & ~(size_t)15)
static_assert(sizeof(smp_shared) <= sizeof(fs_shared), "the slow path reuses the fast path's shared memory");
static_assert(offsetof(fs_shared, hist_c) % 16 == 0 && offsetof(fs_shared, cum_w) % 16 == 0 &&
                  offsetof(fs_shared, cum_c) % 16 == 0 && sizeof(fs_shared::hist_p) >= FS_CAP * 8,
              "vector access to the bins; hist_p doubles as the gather staging area");

/* Bin of a finite logit: monotone in the logit (so bin order is sampling
 * order), equal logits share a bin. Every block computes it with the same
 * operations on the same (max, scale), so all agree bit for bit. */
__device__ __forceinline__ int fs_bin(float x, float mx, float scale) {
    const float t = (mx - x) * scale;
    return t < (float)(FS_NB - 1) ? (int)t : FS_NB - 1;
}

__device__ __forceinline__ u64 fs_weight(float x, float mx, float inv_t) {
    return (u64)__float2ull_rn(expf((x - mx) * inv_t) * SMP_ONE);
}

/* min-p in double, exactly the host's test (mass >= min_p); a float
 * pre-test settles everything not within 1e-3 of the threshold. */
__device__ __forceinline__ bool fs_minp_keep(float x, float mx, float inv_t, float log_minp, double temp_d,
                                             double minp_d) {
    const float y = (x - mx) * inv_t;
    const float margin = 1e-3f * (1.0f + fabsf(log_minp));
    if (y > log_minp + margin) return true;
    if (y < log_minp - margin) return false;
    return exp(((double)x - (double)mx) / temp_d) >= minp_d;
}

/* Block-wide sums and scans (every thread of the block calls them). */
__device__ __forceinline__ u64 fs_block_sum(u64 v, fs_shared &sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RP_FULL_MASK, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red64[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 r = 0;
    for (int w = 0; w < FS_THREADS / 32; w++) r += sh.red64[w];
    return r;
}

/* Exclusive prefix over threads in thread order; *total gets the sum. */
__device__ __forceinline__ u64 fs_block_excl_scan(u64 v, u64 *total, fs_shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(RP_FULL_MASK, inc, o);
        if (lane >= o) inc += n;
    }
    __syncthreads();
    if (lane == 31) sh.red64[warp] = inc;
    __syncthreads();
    u64 before = 0, all = 0;
    for (int w = 0; w < FS_THREADS / 32; w++) {
        const u64 s = sh.red64[w];
        if (w < warp) before += s;
        all += s;
    }
    *total = all;
    return before + inc - v;
}

/* Each block appends its tokens of bin b to block 0's list: first into a
 * staging area of its own shared memory (local atomics), then one remote
 * atomic reserves the block's range in block 0's list and plain remote
 * stores fill it. (Remote atomics per warp on one word of block 0 would
 * serialize there.) The staging area is hist_p, no longer read by anyone
 * once the bins are summed [hist B]. */
__device__ void fs_gather(const float *xs, int n, int id0, int b, float mx, float scale, fs_shared &sh,
                          fs_shared *lead) {
    const int lane = threadIdx.x & 31;
    u64 *stage = reinterpret_cast<u64 *>(&sh.hist_p[0][0]);
    if (threadIdx.x == 0) sh.stage_n = 0;
    __syncthreads();
    for (int base = 0; base < n; base += FS_THREADS) { /* same trip count in a warp: ballots are safe */
        const int i = base + threadIdx.x;
        const float x = i < n ? xs[i] : -INFINITY;
        const bool m = x != -INFINITY && fs_bin(x, mx, scale) == b;
        const unsigned ball = __ballot_sync(RP_FULL_MASK, m);
        if (!ball) continue;
        unsigned slot0 = 0;
        if (lane == 0) slot0 = atomicAdd(&sh.stage_n, (unsigned)__popc(ball));
        slot0 = __shfl_sync(RP_FULL_MASK, slot0, 0);
        if (m) {
            const unsigned slot = slot0 + __popc(ball & ((1u << lane) - 1u));
            if (slot < FS_CAP) stage[slot] = ((u64)order_key(x) << 32) | (u64)(~(uint32_t)(id0 + i));
        }
    }
    __syncthreads();
    const unsigned cnt = sh.stage_n;
    if (cnt == 0) return;
    if (threadIdx.x == 0) sh.stage_base = atomicAdd(&lead->list_n, cnt);
    __syncthreads();
    const unsigned base = sh.stage_base;
    for (unsigned i = threadIdx.x; i < cnt && i < FS_CAP; i += FS_THREADS)
        if (base + i < FS_CAP) lead->list_key[base + i] = stage[i];
}

/* Block 0 only, between gathers. */
struct fs_row {
    const float *xs;
    int n, id0;
    float mx, scale, inv_t;
};

/* Opens bin b: gathers its tokens from the cluster, sorts them in sampling
 * order and prefix-sums their weights. 0 if it holds more than FS_CAP
 * tokens (or the gather disagrees with the histogram). */
__device__ int fs_open_bin(int b, const fs_row &rw, fs_shared &sh, cg::cluster_group &cluster) {
    if (sh.cached_bin == b) return 1;
    const unsigned cnt = sh.cum_c[b + 1] - sh.cum_c[b];
    if (cnt > FS_CAP) return 0;
    if (threadIdx.x == 0) {
        sh.list_n = 0;
        sh.cmd = b;
    }
    cluster.sync(); /* [gather A] publishes cmd and list_n = 0 */
    fs_gather(rw.xs, rw.n, rw.id0, b, rw.mx, rw.scale, sh, &sh);
    cluster.sync(); /* [gather B] every block's appends are in */
    if (sh.list_n != cnt) return 0;
    if (cnt <= FS_THREADS) {
        /* rank by counting: keys are distinct (the id is in them), two
         * barriers instead of a sorting network's log^2 n */
        const int t = threadIdx.x;
        const u64 key = t < (int)cnt ? sh.list_key[t] : 0;
        int rank = 0;
        if (t < (int)cnt)
            for (int j = 0; j < (int)cnt; j++) rank += sh.list_key[j] > key;
        if (t < (int)cnt) sh.list_psum[rank] = key;
        __syncthreads();
        if (t < (int)cnt) sh.list_key[t] = sh.list_psum[t];
        __syncthreads();
    }
    int P = 1;
    while (cnt > FS_THREADS && P < (int)cnt) P <<= 1;
    for (int i = cnt + threadIdx.x; i < P; i += FS_THREADS) sh.list_key[i] = 0; /* sorts last */
    __syncthreads();
    /* larger bins: bitonic sort, descending (larger key = earlier in sampling order) */
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += FS_THREADS) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const u64 a = sh.list_key[i], c = sh.list_key[ixj];
                    if (((i & k) == 0) ? a < c : a > c) {
                        sh.list_key[i] = c;
                        sh.list_key[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
    /* inclusive prefix sums of the weights, two entries per thread */
    const int i0 = 2 * threadIdx.x;
    const u64 w0 = i0 < (int)cnt ? fs_weight(key_value((uint32_t)(sh.list_key[i0] >> 32)), rw.mx, rw.inv_t) : 0;
    const u64 w1 =
        i0 + 1 < (int)cnt ? fs_weight(key_value((uint32_t)(sh.list_key[i0 + 1] >> 32)), rw.mx, rw.inv_t) : 0;
    u64 tot;
    const u64 before = fs_block_excl_scan(w0 + w1, &tot, sh);
    if (i0 < FS_CAP) sh.list_psum[i0] = before + w0;
    if (i0 + 1 < FS_CAP) sh.list_psum[i0 + 1] = before + w0 + w1;
    if (threadIdx.x == 0) sh.cached_bin = b;
    __syncthreads();
    return 1;
}

/* The bin b with cum[b] < target <= cum[b + 1] (by count or by weight), or
 * for exclusive: cum[b] <= target < cum[b + 1]. Unique for a valid target. */
__device__ int fs_find_bin(bool by_mass, bool inclusive, u64 target, fs_shared &sh) {
    if (threadIdx.x == 0) sh.res = -1;
    __syncthreads();
    for (int b = threadIdx.x; b < FS_NB; b += FS_THREADS) {
        const u64 lo = by_mass ? sh.cum_w[b] : sh.cum_c[b], hi = by_mass ? sh.cum_w[b + 1] : sh.cum_c[b + 1];
        if (inclusive ? (lo < target && target <= hi) : (lo <= target && target < hi)) sh.res = b;
    }
    __syncthreads();
    const int r = sh.res;
    __syncthreads();
    return r;
}

/* In the open bin: the 0-based index of the first token at which
 * base + running weight reaches target (>=) or passes it (>); -1 if none. */
__device__ int fs_find_in_bin(u64 base, u64 target, bool inclusive, unsigned cnt, fs_shared &sh) {
    if (threadIdx.x == 0) sh.res = -1;
    __syncthreads();
    for (int i = threadIdx.x; i < (int)cnt; i += FS_THREADS) {
        const u64 s = base + sh.list_psum[i], sp = i ? base + sh.list_psum[i - 1] : base;
        const bool c = inclusive ? s >= target : s > target;
        const bool cp = i ? (inclusive ? sp >= target : sp > target) : false;
        if (c && !cp) sh.res = i;
    }
    __syncthreads();
    const int r = sh.res;
    __syncthreads();
    return r;
}

/* Weight of the first j tokens of bin b (j <= count). *ok = 0 if the bin
 * had to be opened and could not be. */
__device__ u64 fs_prefix_weight(int b, unsigned j, const fs_row &rw, fs_shared &sh, cg::cluster_group &cluster,
                                int *ok) {
    const unsigned cnt = sh.cum_c[b + 1] - sh.cum_c[b];
    const u64 wb = sh.cum_w[b + 1] - sh.cum_w[b];
    if (j >= cnt) return wb;
    if (wb == 0 || j == 0) return 0;
    if (!fs_open_bin(b, rw, sh, cluster)) {
        *ok = 0;
        return 0;
    }
    return sh.list_psum[j - 1];
}

__global__ void __launch_bounds__(FS_THREADS, 2)
    sample_kernel_cluster(const float *logits, const rp_sampling_params *__restrict__ params,
                          int32_t *__restrict__ tokens, float *__restrict__ logprobs, int32_t *__restrict__ kept,
                          rp_sample_host host, const int32_t *skip, int vocab, int chunk) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    fs_shared &sh = *reinterpret_cast<fs_shared *>(smem_raw);
    float *xs = reinterpret_cast<float *>(smem_raw + FS_SHARED_BYTES);
    /* launched while the logits' kernel still runs (PDL): the launch and
     * block placement overlap its tail, the reads wait for its results */
    rp_pdl_trigger();
    rp_pdl_wait();
    /* sampled later, with token masks (sample_top.h): every block of the
     * cluster reads the same flag and leaves before any cluster barrier */
    if (skip && *skip) return;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank(), nblk = (int)cluster.num_blocks();
    const int r = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *row = logits + (int64_t)r * vocab;
    const int id0 = rank * chunk, n = max(0, min(vocab - id0, chunk));
    const rp_sampling_params p = params[r];
    fs_shared *lead = cluster.map_shared_rank(&sh, 0);

    /* 1. load the slice (sanitized), max / argmax / min finite */
    float bmax = -INFINITY, bmin = INFINITY;
    int barg = 0x7fffffff;
    const float *src = row + id0;
    int nv = 0;
    if ((((uintptr_t)src) & 15) == 0) {
        nv = n & ~3;
        const int nq = nv / 4;
        /* batches of 8 loads per thread, all issued before any is used:
         * one memory latency per batch instead of one per load */
        for (int q0 = threadIdx.x; q0 < nq; q0 += 8 * FS_THREADS) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int q = q0 + u * FS_THREADS;
                if (q < nq) v[u] = __ldcg(reinterpret_cast<const float4 *>(src) + q);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int q = q0 + u * FS_THREADS;
                if (q >= nq) break;
                const float a[4] = {rp_sanitize_logit(v[u].x), rp_sanitize_logit(v[u].y), rp_sanitize_logit(v[u].z),
                                    rp_sanitize_logit(v[u].w)};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (a[e] > bmax) bmax = a[e], barg = id0 + 4 * q + e; /* ids ascend within a thread */
                    if (a[e] != -INFINITY) bmin = fminf(bmin, a[e]);
                }
                *reinterpret_cast<float4 *>(xs + 4 * q) = make_float4(a[0], a[1], a[2], a[3]);
            }
        }
    }
    for (int i = nv + threadIdx.x; i < n; i += FS_THREADS) {
        const float x = rp_sanitize_logit(src[i]);
        xs[i] = x;
        if (x > bmax || (x == bmax && id0 + i < barg)) bmax = x, barg = id0 + i;
        if (x != -INFINITY) bmin = fminf(bmin, x);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(RP_FULL_MASK, bmax, o), om = __shfl_xor_sync(RP_FULL_MASK, bmin, o);
        const int oi = __shfl_xor_sync(RP_FULL_MASK, barg, o);
        if (ov > bmax || (ov == bmax && oi < barg)) bmax = ov, barg = oi;
        bmin = fminf(bmin, om);
    }
    if (lane == 0) sh.red_f[warp] = bmax, sh.red_g[warp] = bmin, sh.red_i[warp] = barg;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < FS_THREADS / 32; w++) {
            if (sh.red_f[w] > bmax || (sh.red_f[w] == bmax && sh.red_i[w] < barg)) bmax = sh.red_f[w], barg = sh.red_i[w];
            bmin = fminf(bmin, sh.red_g[w]);
        }
        sh.slot.max_x = bmax, sh.slot.min_x = bmin, sh.slot.argmax = barg;
    }
    cluster.sync(); /* [stats] every block's slot.max_x/min_x/argmax is in */
    if (warp == 0) {
        /* (max, lowest id) is a total order, so any combination order gives
         * the same answer in every block */
        float m = -INFINITY, mn = INFINITY;
        int a = 0x7fffffff;
        if (lane < nblk) {
            const fs_slot *s = &cluster.map_shared_rank(&sh, lane)->slot;
            m = s->max_x, mn = s->min_x, a = s->argmax;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(RP_FULL_MASK, m, o), om = __shfl_xor_sync(RP_FULL_MASK, mn, o);
            const int oi = __shfl_xor_sync(RP_FULL_MASK, a, o);
            if (ov > m || (ov == m && oi < a)) m = ov, a = oi;
            mn = fminf(mn, om);
        }
        if (lane == 0) sh.row_max = m, sh.row_min = mn, sh.row_argmax = m == -INFINITY ? 0 : a;
    }
    __syncthreads();
    const float mx = sh.row_max;
    const int argmax = sh.row_argmax;

    if (p.temperature == 0.0f || mx == -INFINITY) {
        if (logprobs) {
            /* log-softmax at temperature 1 of the argmax; float partial sums
             * in a fixed order (block tree, then blocks by rank) */
            float s = 0.0f;
            if (mx != -INFINITY)
                for (int i = threadIdx.x; i < n; i += FS_THREADS) s += expf(xs[i] - mx);
            s = rp_block_sum(s, sh.red_f);
            if (threadIdx.x == 0) sh.slot.sum_exp = s;
            cluster.sync(); /* [greedy sum] every block's slot.sum_exp is in */
            if (rank == 0 && warp == 0) {
                /* one remote load per lane, then a fixed shuffle tree */
                float tot = lane < nblk ? cluster.map_shared_rank(&sh, lane)->slot.sum_exp : 0.0f;
                tot = rp_warp_sum(tot);
                if (lane == 0) logprobs[r] = mx == -INFINITY ? -INFINITY : -logf(tot);
            }
        }
        if (rank == 0 && threadIdx.x == 0) { /* also the logprob's writer */
            tokens[r] = argmax;
            if (kept) kept[r] = vocab;
            smp_mirror(host, r, tokens, logprobs);
        }
        cluster.sync(); /* [exit] no block leaves while its slot may still be read */
        return;
    }

    /* 2. histogram of (count, weight) over value bins, min-p survivors */
    const float temp = p.temperature < 0.01f ? 0.01f : p.temperature;
    const float inv_t = 1.0f / temp;
    const float span = fminf(mx - sh.row_min, FS_SPAN * temp);
    /* 1.001: the row minimum stays out of the last (zero-weight) bin */
    const float scale = span > 0.0f ? (float)(FS_NB - 1) / (span * 1.001f) : 0.0f;
    const bool use_minp = p.min_p > 0.0f;
    const float log_minp = use_minp ? logf(p.min_p) : 0.0f;
    const double temp_d = (double)temp, minp_d = (double)p.min_p;
    for (int b = threadIdx.x; b < FS_NB; b += FS_THREADS)
        sh.hist_p[0][b] = 0, sh.hist_p[1][b] = 0, sh.hist_p[2][b] = 0, sh.hist_c[b] = 0;
    __syncthreads();
    unsigned tail = 0, n_minp = 0;
    for (int i = threadIdx.x; i < n; i += FS_THREADS) {
        const float x = xs[i];
        if (x == -INFINITY) continue;
        if (use_minp && fs_minp_keep(x, mx, inv_t, log_minp, temp_d, minp_d)) n_minp++;
        const int b = fs_bin(x, mx, scale);
        if (b == FS_NB - 1) { /* the tail is counted in a register: one hot bin would serialize */
            tail++;
            continue;
        }
        atomicAdd(&sh.hist_c[b], 1u);
        const u64 w = fs_weight(x, mx, inv_t);
        if (w) {
            atomicAdd(&sh.hist_p[0][b], (unsigned)(w & 0x7fff));
            atomicAdd(&sh.hist_p[1][b], (unsigned)((w >> 15) & 0x7fff));
            atomicAdd(&sh.hist_p[2][b], (unsigned)(w >> 30));
        }
    }
    const u64 both = fs_block_sum(((u64)n_minp << 32) | tail, sh);
    if (threadIdx.x == 0) {
        sh.hist_c[FS_NB - 1] += (unsigned)both; /* its weight is 0 by construction */
        sh.slot.n_minp = (unsigned)(both >> 32);
    }
    cluster.sync(); /* [hist A] every block's bins and slot.n_minp are in */
    {
        /* block `rank` sums bins [rank * per, (rank + 1) * per) over the
         * cluster into block 0. Thread t reads 4 bins of block q = t % nblk
         * with 16-byte remote loads (all in flight at once); the nblk
         * lanes of one bin group (8 or 16 adjacent lanes) then add up with
         * shuffles. per / 4 * nblk = FS_NB / 4 = FS_THREADS pairs exactly. */
        static_assert(FS_NB / 4 == FS_THREADS, "one (bin group, block) pair per thread");
        const int per = FS_NB / nblk, q = threadIdx.x % nblk, b = rank * per + (threadIdx.x / nblk) * 4;
        const fs_shared *o = cluster.map_shared_rank(&sh, q);
        const uint4 p0 = *reinterpret_cast<const uint4 *>(&o->hist_p[0][b]);
        const uint4 p1 = *reinterpret_cast<const uint4 *>(&o->hist_p[1][b]);
        const uint4 p2 = *reinterpret_cast<const uint4 *>(&o->hist_p[2][b]);
        uint4 c = *reinterpret_cast<const uint4 *>(&o->hist_c[b]);
        u64 w[4] = {p0.x + ((u64)p1.x << 15) + ((u64)p2.x << 30), p0.y + ((u64)p1.y << 15) + ((u64)p2.y << 30),
                    p0.z + ((u64)p1.z << 15) + ((u64)p2.z << 30), p0.w + ((u64)p1.w << 15) + ((u64)p2.w << 30)};
        for (int off = 1; off < nblk; off <<= 1) {
#pragma unroll
            for (int e = 0; e < 4; e++) w[e] += __shfl_xor_sync(RP_FULL_MASK, w[e], off);
            c.x += __shfl_xor_sync(RP_FULL_MASK, c.x, off);
            c.y += __shfl_xor_sync(RP_FULL_MASK, c.y, off);
            c.z += __shfl_xor_sync(RP_FULL_MASK, c.z, off);
            c.w += __shfl_xor_sync(RP_FULL_MASK, c.w, off);
        }
        if (q == 0) {
            *reinterpret_cast<ulonglong2 *>(&lead->cum_w[b]) = make_ulonglong2(w[0], w[1]);
            *reinterpret_cast<ulonglong2 *>(&lead->cum_w[b + 2]) = make_ulonglong2(w[2], w[3]);
            *reinterpret_cast<uint4 *>(&lead->cum_c[b]) = c;
        }
    }
    cluster.sync(); /* [hist B] block 0 holds the row's bins */

    if (rank != 0) {
        /* serve block 0's gathers until it is done */
        for (;;) {
            cluster.sync(); /* [gather A] */
            const int b = lead->cmd;
            if (b < 0) break;
            fs_gather(xs, n, id0, b, mx, scale, sh, lead);
            cluster.sync(); /* [gather B] */
        }
        cluster.sync(); /* [exit] block 0 may now reuse its shared memory */
        return;
    }

    /* 3. block 0: prefix sums of the bins, then each stage's boundary.
     * A boundary is (bin, j): the first j tokens of the bin are kept;
     * (FS_NB, 0) = everything. */
    {
        const int b0 = threadIdx.x * (FS_NB / FS_THREADS);
        u64 wsum = 0, csum = 0;
        for (int e = 0; e < FS_NB / FS_THREADS; e++) wsum += sh.cum_w[b0 + e], csum += sh.cum_c[b0 + e];
        u64 wtot, ctot;
        u64 wrun = fs_block_excl_scan(wsum, &wtot, sh);
        u64 crun = fs_block_excl_scan(csum, &ctot, sh);
        for (int e = 0; e < FS_NB / FS_THREADS; e++) {
            const u64 w = sh.cum_w[b0 + e], c = sh.cum_c[b0 + e];
            sh.cum_w[b0 + e] = wrun, sh.cum_c[b0 + e] = (unsigned)crun;
            wrun += w, crun += c;
        }
        if (threadIdx.x == 0) sh.cum_w[FS_NB] = wtot, sh.cum_c[FS_NB] = (unsigned)ctot, sh.cached_bin = -1;
        __syncthreads();
    }
    const fs_row rw = {xs, n, id0, mx, scale, inv_t};
    const u64 n_fin = sh.cum_c[FS_NB], total = sh.cum_w[FS_NB];
    int ok = 1, pick = argmax;
    u64 s2 = 0;
    float pick_x = mx;

    /* top-k: a count boundary */
    int bf = FS_NB;
    unsigned jf = 0;
    u64 s1 = total;
    if (p.top_k > 0 && (u64)p.top_k < n_fin) {
        bf = fs_find_bin(false, true, (u64)p.top_k, sh);
        jf = (unsigned)p.top_k - sh.cum_c[bf];
        s1 = sh.cum_w[bf] + fs_prefix_weight(bf, jf, rw, sh, cluster, &ok);
    }
    /* top-p: the smallest prefix of the top-k set with weight >= p * s1 */
    if (ok && p.top_p < 1.0f) {
        u64 target = (u64)ceil((double)p.top_p * (double)s1);
        target = target < 1 ? 1 : target > s1 ? s1 : target;
        const int bp = fs_find_bin(true, true, target, sh);
        ok = bp >= 0 && fs_open_bin(bp, rw, sh, cluster);
        if (ok) {
            const int i = fs_find_in_bin(sh.cum_w[bp], target, true, sh.cum_c[bp + 1] - sh.cum_c[bp], sh);
            ok = i >= 0;
            bf = bp, jf = (unsigned)i + 1;
        }
    }
    /* min-p: its survivors are the first n_minp tokens of the order */
    if (ok && use_minp) {
        u64 n_m = threadIdx.x < (unsigned)nblk ? cluster.map_shared_rank(&sh, threadIdx.x)->slot.n_minp : 0;
        n_m = fs_block_sum(n_m, sh);
        const int bm = fs_find_bin(false, true, n_m, sh);
        ok = bm >= 0; /* n_m >= 1: the top token always passes */
        const unsigned jm = ok ? (unsigned)(n_m - sh.cum_c[bm]) : 0;
        if (ok && (bm < bf || (bm == bf && jm < jf))) bf = bm, jf = jm;
    }
    /* the kept set is the first kept_n tokens of the sampling order */
    const unsigned kept_n = !ok ? 0u : bf == FS_NB ? (unsigned)n_fin : sh.cum_c[bf] + jf;
    /* the draw: inverse CDF over the kept prefix */
    if (ok) {
        s2 = bf == FS_NB ? total : sh.cum_w[bf] + fs_prefix_weight(bf, jf, rw, sh, cluster, &ok);
    }
    if (ok) {
        const float u = rp_d_rand_uniform(p.seed, 0, p.step);
        u64 target = (u64)((double)u * (double)s2);
        if (target >= s2) target = s2 - 1;
        const int bd = fs_find_bin(true, false, target, sh);
        ok = bd >= 0 && fs_open_bin(bd, rw, sh, cluster);
        if (ok) {
            const int i = fs_find_in_bin(sh.cum_w[bd], target, false, sh.cum_c[bd + 1] - sh.cum_c[bd], sh);
            ok = i >= 0;
            if (ok) {
                const u64 key = sh.list_key[i];
                pick = (int)~(uint32_t)key;
                pick_x = key_value((uint32_t)(key >> 32));
            }
        }
    }
    if (threadIdx.x == 0) sh.cmd = -1;
    cluster.sync(); /* [gather A] releases the other blocks */
    cluster.sync(); /* [exit] they no longer read our shared memory */
    if (!ok) {
        /* a bin too large to open: the exact slow path over the global row */
        sample_row_exact(row, p, tokens + r, logprobs ? logprobs + r : NULL, kept ? kept + r : NULL, vocab,
                         *reinterpret_cast<smp_shared *>(smem_raw));
        if (rank == 0 && threadIdx.x == 0) smp_mirror(host, r, tokens, logprobs);
        return;
    }
    if (threadIdx.x == 0) {
        tokens[r] = pick;
        if (kept) kept[r] = (int32_t)kept_n;
        if (logprobs)
            logprobs[r] = (float)(((double)pick_x - (double)mx) / (double)temp - log((double)s2 / (double)SMP_ONE));
        smp_mirror(host, r, tokens, logprobs);
    }
}

/* ======================= launchers ======================================== */

/* Everything lives in shared memory: no workspace. */
extern "C" size_t rp_sample_workspace_bytes(int rows, int vocab) {
    (void)rows;
    (void)vocab;
    return 256;
}

/* Cluster size for a vocabulary: 16 blocks where the GPU can co-schedule
 * them (non-portable size), else 8; 0 = the row does not fit, use the slow
 * path. Depends only on vocab and the device, so the grid shape of a
 * captured launch never changes. */
/* Cached per device: the attributes below are set per device, and under
 * tensor parallelism each GPU's thread asks for its own. */
#define FS_MAX_DEVICES 32
static int fs_cluster_size(int vocab, int *chunk_out, size_t *smem_out) {
    static int cached_vocab1[FS_MAX_DEVICES], cached_cl[FS_MAX_DEVICES], cached_chunk[FS_MAX_DEVICES]; /* vocab + 1: 0 unset */
    static size_t cached_smem[FS_MAX_DEVICES];
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    const int di = dev & (FS_MAX_DEVICES - 1);
    if (vocab + 1 == cached_vocab1[di]) {
        *chunk_out = cached_chunk[di], *smem_out = cached_smem[di];
        return cached_cl[di];
    }
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) optin = 0;
    int cl = 0, chunk = 0;
    size_t smem = 0;
    /* the largest slice any vocabulary may use, set once: a smaller value set
     * later would break launches cached for a larger vocabulary */
    if (optin > 0 && (cudaFuncSetAttribute(sample_kernel_cluster, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           optin - 1024) != cudaSuccess ||
                      cudaFuncSetAttribute(sample_kernel_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                           1) != cudaSuccess ||
                      cudaFuncSetAttribute(sample_kernel_cluster, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           100) != cudaSuccess))
        optin = 0;
    const int sizes[2] = {FS_MAX_CLUSTER, 8};
    for (int t = 0; t < 2 && !cl; t++) {
        const int c = ((vocab + sizes[t] - 1) / sizes[t] + 3) & ~3; /* 16-byte aligned slices */
        const size_t bytes = FS_SHARED_BYTES + (size_t)c * 4;
        if (bytes + 1024 > (size_t)optin) continue; /* 1 KiB: the slow path's static shared memory */
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(sizes[t], 1);
        cfg.blockDim = dim3(FS_THREADS);
        cfg.dynamicSmemBytes = bytes;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = sizes[t], attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, sample_kernel_cluster, &cfg) == cudaSuccess && clusters > 0)
            cl = sizes[t], chunk = c, smem = bytes;
    }
    cudaGetLastError(); /* a refused size is not an error of the next launch */
    cached_vocab1[di] = vocab + 1, cached_cl[di] = cl, cached_chunk[di] = chunk, cached_smem[di] = smem;
    *chunk_out = chunk, *smem_out = smem;
    return cl;
}

extern "C" int rp_k_sample(const float *logits, const rp_sampling_params *params, int32_t *tokens, float *logprobs,
                           void *workspace, int rows, int vocab, cudaStream_t stream) {
    return rp_k_sample_kept(logits, params, tokens, logprobs, NULL, NULL, NULL, workspace, rows, vocab, stream);
}

extern "C" int rp_k_sample_kept(const float *logits, const rp_sampling_params *params, int32_t *tokens,
                                float *logprobs, int32_t *kept, const rp_sample_host *host_in, const int32_t *skip,
                                void *workspace, int rows, int vocab, cudaStream_t stream) {
    (void)workspace;
    rp_sample_host host = {};
    if (host_in) host = *host_in;
    if (rows <= 0) return cudaSuccess;
    if (vocab <= 0 || vocab > SMP_MAX_VOCAB || rows > 65535) return (int)cudaErrorInvalidValue;
    int chunk = 0;
    size_t smem = 0;
    const int cl = fs_cluster_size(vocab, &chunk, &smem);
    if (cl) {
        return rp_launch_cluster(sample_kernel_cluster, dim3(cl, rows), dim3(FS_THREADS), smem, stream, cl, logits,
                                 params, tokens, logprobs, kept, host, skip, vocab, chunk);
    }
    static unsigned attr_set; /* per device (rp_first_on_device) */
    const size_t bytes = sizeof(smp_shared);
    if (rp_first_on_device(&attr_set)) {
        cudaError_t e = cudaFuncSetAttribute(sample_kernel_slow, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) return (int)e;
    }
    return rp_launch(sample_kernel_slow, dim3(rows), dim3(SMP_THREADS), bytes, stream, logits, params, tokens, logprobs,
                     kept, host, skip, vocab);
}

/* ======================= top logprobs ===================================== */

/* One block per row; rows with params.top_logprobs == 0 only write n = 0.
 * 1. Each thread keeps the n best (logit descending, id ascending) of its
 *    strided share of the row in a sorted list; its ids ascend, so an equal
 *    logit never displaces an earlier entry. The row's first n tokens of the
 *    sampling order are all in the union of these lists.
 * 2. n rounds of a block argmax over the lists' heads (a merge); the winning
 *    thread advances its head.
 * The logprobs come from the sampled token's: under the sampling
 * distribution lp(x) = lp(tok) + (x - x_tok) / T (T = 1 for greedy rows),
 * for the first kept[r] tokens of the order, -inf beyond (cut by top-k,
 * top-p or min-p) and, as on the host, for tokens whose mass
 * exp((x - max) / T) underflows in double (more than ~745 T below the max:
 * the host never makes them candidates). So the sampled token's entry is
 * its logprob exactly. */
#define TLP_THREADS 256

__device__ __forceinline__ bool tlp_before(float x, int id, float ox, int oid) {
    return x > ox || (x == ox && id < oid);
}

__global__ void __launch_bounds__(TLP_THREADS)
    top_logprobs_kernel(const float *logits, const rp_sampling_params *__restrict__ params,
                        const int32_t *tokens, const float *logprobs,
                        const int32_t *kept, rp_top_logprobs *__restrict__ top, const int32_t *skip, int vocab) {
    __shared__ float red_x[TLP_THREADS / 32];
    __shared__ int red_i[TLP_THREADS / 32];
    __shared__ int win_id;
    rp_pdl_trigger();
    rp_pdl_wait(); /* then the sampled tokens are visible; most rows return at once */
    if (skip && *skip) return; /* as the sampling kernel */
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const rp_sampling_params p = params[r];
    rp_top_logprobs *out = top + r;
    const int n = min(min(p.top_logprobs, RP_MAX_TOP_LOGPROBS), vocab);
    if (n <= 0) {
        if (threadIdx.x == 0) out->n = 0;
        return;
    }
    const float *row = logits + (int64_t)r * vocab;

    /* 1. this thread's sorted list (local memory; entries beat `worst`
     * rarely once the list is full, so the loop is a load and a compare) */
    float lx[RP_MAX_TOP_LOGPROBS];
    int li[RP_MAX_TOP_LOGPROBS];
    int cnt = 0;
    float worst = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += TLP_THREADS) {
        const float x = rp_sanitize_logit(__ldcg(row + i));
        if (cnt == n && !(x > worst)) continue;
        int j = cnt < n ? cnt++ : n - 1;
        for (; j > 0 && x > lx[j - 1]; j--) lx[j] = lx[j - 1], li[j] = li[j - 1];
        lx[j] = x, li[j] = i;
        worst = lx[cnt - 1];
    }

    /* the distribution's parameters, from the sampled token */
    const int32_t tok = tokens[r];
    const double lp_tok = (double)logprobs[r];
    const double x_tok = (double)rp_sanitize_logit(row[tok]);
    const double temp = p.temperature == 0.0f ? 1.0 : (double)(p.temperature < 0.01f ? 0.01f : p.temperature);
    const int n_kept = p.temperature == 0.0f ? vocab : kept[r];

    /* 2. merge: n rounds of a block argmax over the heads */
    int head = 0;
    double mx = 0; /* thread 0: the row's max, the first winner */
    for (int j = 0; j < n; j++) {
        float x = head < cnt ? lx[head] : -INFINITY;
        int id = head < cnt ? li[head] : 0x7fffffff; /* an empty list loses even to a -inf token */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ox = __shfl_xor_sync(RP_FULL_MASK, x, o);
            const int oid = __shfl_xor_sync(RP_FULL_MASK, id, o);
            if (tlp_before(ox, oid, x, id)) x = ox, id = oid;
        }
        if (lane == 0) red_x[warp] = x, red_i[warp] = id;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < TLP_THREADS / 32; w++)
                if (tlp_before(red_x[w], red_i[w], x, id)) x = red_x[w], id = red_i[w];
            win_id = id;
            if (j == 0) mx = (double)x;
            const bool in = j < n_kept && x != -INFINITY && lp_tok != -INFINITY &&
                            (p.temperature == 0.0f || exp(((double)x - mx) / temp) > 0.0);
            out->ids[j] = id;
            /* the sampled token's own entry is its logprob, bit for bit (-0 included) */
            out->logprobs[j] = !in ? -INFINITY : id == tok ? logprobs[r] : (float)(lp_tok + ((double)x - x_tok) / temp);
        }
        __syncthreads();
        if (head < cnt && li[head] == win_id) head++;
    }
    if (threadIdx.x == 0) out->n = n;
}

extern "C" int rp_k_top_logprobs(const float *logits, const rp_sampling_params *params, const int32_t *tokens,
                                 const float *logprobs, const int32_t *kept, rp_top_logprobs *top,
                                 const int32_t *skip, int rows, int vocab, cudaStream_t stream) {
    if (rows <= 0) return cudaSuccess;
    if (vocab <= 0 || !logits || !params || !tokens || !logprobs || !kept || !top) return (int)cudaErrorInvalidValue;
    return rp_launch(top_logprobs_kernel, dim3(rows), dim3(TLP_THREADS), 0, stream, logits, params, tokens, logprobs,
                     kept, top, skip, vocab);
}
