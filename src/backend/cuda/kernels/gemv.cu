/* Decode-time matrix product y[t][n] = sum_k x[t][k] W[n][k] for T <= 8
 * tokens: the kernel that decides decode speed, since it streams every
 * weight once per step. It must run at HBM bandwidth, so:
 *  - W is read with 16-byte streaming loads (no L1 allocation), an
 *    unrolled batch of chunks per warp in flight;
 *  - the first batch is issued before rp_pdl_wait(): weights are constant,
 *    so under programmatic dependent launch a GEMV starts streaming while
 *    the kernel before it (norm, attention, another GEMV) is still running;
 *  - the arithmetic runs on the tensor cores (mma m16n8k16, fp32
 *    accumulate): 16 weight rows are the M side, the (up to) 8 tokens the N
 *    side. A sum over k does not care how k is numbered, so each thread
 *    feeds the mma the 8 consecutive k it loaded with one uint4, as long as
 *    the x fragment uses the same numbering. No shuffles, no shared-memory
 *    staging of W, and T = 1..8 cost the same;
 *  - a block owns 16 rows and its warps split K; one shared-memory
 *    reduction at the end. The warp count per block is chosen from N so
 *    that small matrices still fill the GPU;
 *  - the warp count also keeps the launch to one wave, or a nearly full
 *    last one (gemv_launch_io; qwen3-4b's N = 2560 fell off this);
 *  - before the PDL wait each block asks the bulk copy engine to prefetch
 *    the start of its rows into L2 (a budget per launch), so DRAM keeps
 *    streaming this GEMV's weights while the kernel before it (attention,
 *    RoPE, the previous GEMV's tail) still runs.
 *
 * Decode fusions, so that a layer is 4 GEMVs plus attention instead of 10
 * launches (each x element is produced once per block, in the fragment
 * layout the mma reads):
 *  - RMSNORM input: x = bf16(w * (residual * inv)) straight from the fp32
 *    residual. inv comes from per-block partial sums of squares written by
 *    the GEMV (or embedding) that last updated the residual, summed here in
 *    a fixed order, so no extra pass over the row and no atomics: the
 *    result is the same on every run (graph replay == eager, bit for bit).
 *    An optional row list picks the residual rows (lm_head: logit rows).
 *  - SILU input: x = bf16(silu(gate) * up) from the fp32 gate_up product.
 *  - RESIDUAL output: residual[t][n] += y in fp32 (as the chain adds a
 *    projection's fp32 output), and the block's partial sums of squares of
 *    the new residual for the next norm.
 * FP8 weights (--quantization fp8; rp_k_gemv_fused_fp8): W is e4m3 bytes
 * with one fp32 scale per row. A lane's 16-byte load is then 16 k instead
 * of 8 (a chunk is 64 k), widened in registers to f16 by one cvt per pair
 * (exact: every e4m3 value is a normal f16) and fed to the f16 mma, two per
 * 8 k; the row's scale multiplies the finished fp32 sum. x is f16 there:
 * the RMSNORM and SILU inputs make it as f16 (from fp32, so more precise
 * than bf16's 8 bits) when they stage it, a BF16 input is converted after a
 * lane has loaded it (once per 16 rows); either way saturated to +-65504
 * (fp8.cuh). The step reads half the bytes, and widening costs one
 * instruction per weight pair (through bf16 it cost four, which the 9-16
 * token kernel below still pays: its x is loaded per lane and group, and
 * converting that to f16 would cost what the cheaper widening saves).
 * Block-scaled FP8 (the official FP8 checkpoints; rp_k_gemv_fused_fp8_blocks):
 * one scale per 128 x 128 block instead of per row. A block's 16 rows lie
 * inside one 128-row scale block and a chunk's 64 k inside one 128-k block,
 * so each chunk's mmas go into a zeroed accumulator that is then added to
 * the sum times its block's scale (4 FMAs a chunk); the row scale at the end
 * is then 1. The BLK template flag, on the W8 kernel only.
 *
 * Requires K % 8 == 0 (fp8: K % 16 == 0) and 16-byte aligned W and inputs
 * (true for every model shape replay loads); N is arbitrary. */

#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"

#define GEMV_ROWS 16
#define GEMV_UNROLL 4 /* chunks of 32 k per warp per batch */
#define GEMV_PF_BUDGET_BYTES (4096 << 10) /* L2 prefetch budget per launch */

struct gemv_params {
    rp_gemv_in in;
    rp_gemv_out out;
    int T, N, K;
    int pf_bytes;       /* L2 prefetch per weight row before the PDL wait (multiple of 16) */
    const float *scale; /* fp8 weights: [N], each row's scale */
    const float *blk;   /* block-scaled fp8 weights instead: the grid [ceil(N / 128)][blk_ld] (kernels.h) */
    int blk_ld;
};

/* k per chunk: a lane group's 4 lanes load 16 bytes each, 8 bf16 or 16 e4m3. */
template <bool W8>
__host__ __device__ constexpr int chunk_k() { return W8 ? 64 : 32; }
/* A weight element: bf16 bits or an e4m3 byte. */
template <bool W8>
struct wtype {
    typedef uint16_t t;
};
template <>
struct wtype<true> {
    typedef uint8_t t;
};

/* The weight batch starting at chunk ch0 (this warp's chunks ch0 + u *
 * WARPS): rows g and g + 8 of the block's 16. wa/wb point at the rows'
 * first byte of this lane's k. */
template <int WARPS, bool W8>
__device__ __forceinline__ void load_w(uint4 (&va)[GEMV_UNROLL], uint4 (&vb)[GEMV_UNROLL],
                                       const typename wtype<W8>::t *wa, const typename wtype<W8>::t *wb, int ch0,
                                       int ch_end, int K, int c, bool ra, bool rb) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    constexpr int CK = chunk_k<W8>();
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int ch = ch0 + u * WARPS;
        const int k = ch * CK + c * (CK / 4);
        const bool kin = ch < ch_end && k < K;
        va[u] = kin && ra ? rp_ld_stream(wa + ch * CK) : zero;
        vb[u] = kin && rb ? rp_ld_stream(wb + ch * CK) : zero;
    }
}

/* A pair of x values as the mma takes them: bf16, or f16 (saturated) for
 * the f16 mma of e4m3 weights. */
template <bool F16>
__device__ __forceinline__ uint32_t pack_x(float lo, float hi) {
    return F16 ? rp_pack_f16x2_sat(lo, hi) : rp_pack_bf16x2(lo, hi);
}

/* 8 consecutive x values of token row xrow at k, as 4 bf16 pairs (F16:
 * f16 pairs), made from the input. */
template <int IN, bool F16>
__device__ __forceinline__ uint4 make_x(const rp_gemv_in &in, int xrow, int k, int K, float inv) {
    /* BF16 x through L2 (.cg). Measured under PDL on llama3-8b, batch 1:
     * .cg 6.43 ms per step, the read-only path 6.91, plain loads 6.94. */
    if (IN == RP_GEMV_IN_BF16) {
        const uint4 v = rp_ld_act(in.x + (int64_t)xrow * K + k);
        return F16 ? rp_bf16x8_f16x8_sat(v) : v;
    }
    if (IN == RP_GEMV_IN_RMSNORM) {
        const float *r = in.residual + (int64_t)xrow * K + k;
        const float4 r0 = rp_ld_act_f4(r), r1 = rp_ld_act_f4(r + 4);
        const uint4 w = rp_ld_nc(in.norm_w + k);
        /* the same expression as add_rmsnorm_kernel: w * (x * inv) */
        return make_uint4(pack_x<F16>(rp_bf16_lo(w.x) * (r0.x * inv), rp_bf16_hi(w.x) * (r0.y * inv)),
                          pack_x<F16>(rp_bf16_lo(w.y) * (r0.z * inv), rp_bf16_hi(w.y) * (r0.w * inv)),
                          pack_x<F16>(rp_bf16_lo(w.z) * (r1.x * inv), rp_bf16_hi(w.z) * (r1.y * inv)),
                          pack_x<F16>(rp_bf16_lo(w.w) * (r1.z * inv), rp_bf16_hi(w.w) * (r1.w * inv)));
    }
    /* SILU: the fp32 gate_up row is [gate (K) | up (K)] */
    const float *gp = in.gate_up + (int64_t)xrow * 2 * K + k;
    if (!F16) return rp_silu_mul8(gp, gp + K);
    float o[8];
    rp_silu_mul8_f32(gp, gp + K, o);
    return make_uint4(pack_x<true>(o[0], o[1]), pack_x<true>(o[2], o[3]), pack_x<true>(o[4], o[5]),
                      pack_x<true>(o[6], o[7]));
}

/* Row stride of the staged x in shared memory (bf16, or f16 for e4m3
 * weights: 2 bytes an element either way): 16 bytes of padding put the
 * tokens' rows in different banks. */
__host__ __device__ __forceinline__ int stage_ld(int K) { return K + 8; }

/* RMSNORM / SILU inputs: the whole block makes x[T][K] once, into shared
 * memory, before the weight loop. Done per iteration by the few lanes that
 * hold x fragments instead, it would put an L2 round trip and the SwiGLU
 * arithmetic in every iteration's critical path (measured: gate_up 88 ->
 * 110 us, down 46 -> 76 us on llama3-8b). Loads go out in groups of
 * STAGE_BATCH before any is used. */
#define STAGE_BATCH 4
template <int IN, bool F16>
__device__ __forceinline__ void stage_x(const rp_gemv_in &in, uint16_t *xs, float *s_inv, int T, int K, int kb,
                                        int kr, int ld) {
    /* x[t][kb .. kb + kr) -> xs[t * ld + 0 .. kr) */
    const int per_row = kr > 0 ? kr / 8 : 0, items = T * per_row;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    if (IN == RP_GEMV_IN_RMSNORM) {
        for (int t = warp; t < T; t += nwarps) { /* warp-uniform loop */
            const int rr = in.rows ? in.rows[t] : t;
            float s = 0.0f;
            for (int q = lane; q < in.num_parts; q += 32) s += __ldcg(in.ss_parts + q * RP_GEMV_MAX_T + rr);
            s = rp_warp_sum(s);
            /* transformers: x * rsqrt(mean(x^2) + eps) * weight, all fp32 */
            if (lane == 0) s_inv[t] = 1.0f / sqrtf(s / (float)K + in.eps);
        }
        __syncthreads();
    }
    for (int i0 = threadIdx.x; i0 < items; i0 += STAGE_BATCH * blockDim.x) {
        uint4 v[STAGE_BATCH];
#pragma unroll
        for (int j = 0; j < STAGE_BATCH; j++) {
            const int i = i0 + j * blockDim.x;
            if (i < items) {
                const int t = i / per_row, k = (i % per_row) * 8;
                const int row = IN == RP_GEMV_IN_RMSNORM && in.rows ? in.rows[t] : t;
                v[j] = make_x<IN, F16>(in, row, kb + k, K, IN == RP_GEMV_IN_RMSNORM ? s_inv[t] : 1.0f);
            }
        }
#pragma unroll
        for (int j = 0; j < STAGE_BATCH; j++) {
            const int i = i0 + j * blockDim.x;
            if (i < items)
                *reinterpret_cast<uint4 *>(xs + (i / per_row) * ld + (i % per_row) * 8) = v[j];
        }
    }
    __syncthreads();
}

template <int WARPS, int IN, int OUT, bool W8, bool BLK = false>
__global__ void __launch_bounds__(WARPS * 32) gemv_kernel(const void *__restrict__ W, gemv_params p) {
    static_assert(!BLK || (W8 && RP_FP8_BLOCK % chunk_k<true>() == 0 && RP_FP8_BLOCK % GEMV_ROWS == 0),
                  "a chunk and a block's rows inside one scale block");
    __shared__ float red[WARPS][GEMV_ROWS][8];
    __shared__ float s_inv[RP_GEMV_MAX_T];
    extern __shared__ __align__(16) uint16_t xs[]; /* staged x: [T][stage_ld(K rounded up to 32)] */
    constexpr bool STAGED = IN != RP_GEMV_IN_BF16;
    rp_pdl_trigger();
    const int T = p.T, N = p.N, K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3; /* mma groupID / thread-in-group */
    const int tile = blockIdx.x, row0 = tile * GEMV_ROWS; /* the block's 16 rows */
    typedef typename wtype<W8>::t WT;
    constexpr int CK = chunk_k<W8>(), EB = sizeof(WT); /* k per chunk, bytes per weight */
    const int c0 = 0, c1 = (K + CK - 1) / CK; /* the block's k chunks: all of them */
    const int kb = 0, kr = K;
    const bool ra = row0 + g < N, rb = row0 + g + 8 < N, xt = g < T;
    const WT *Wt = static_cast<const WT *>(W);
    const WT *wa = Wt + (int64_t)(ra ? row0 + g : 0) * K + c * (CK / 4);
    const WT *wb = Wt + (int64_t)(rb ? row0 + g + 8 : 0) * K + c * (CK / 4);
    constexpr int STEP = WARPS * GEMV_UNROLL;

    /* Constant data only until the wait (see common.cuh). */
    if (warp == 0 && lane < GEMV_ROWS && row0 + lane < N && kr > 0) {
        const int bytes = min(kr * EB, p.pf_bytes); /* kr * EB: a multiple of 16 */
        if (bytes > 0) rp_prefetch_l2(Wt + (int64_t)(row0 + lane) * K + kb, bytes);
    }
    uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
    load_w<WARPS, W8>(va, vb, wa, wb, c0 + warp, c1, K, c, ra, rb);
    rp_pdl_wait();
    const int ld = stage_ld(c1 * CK);
    if (STAGED) stage_x<IN, W8>(p.in, xs, s_inv, T, K, kb, kr, ld);
    const uint16_t *xrow = xs + (xt ? g : 0) * ld;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ch0 = c0 + warp; ch0 < c1; ch0 += STEP) {
        if (ch0 != c0 + warp) load_w<WARPS, W8>(va, vb, wa, wb, ch0, c1, K, c, ra, rb);
        constexpr int XV = W8 ? 2 : 1; /* uint4s of x (8 k each) per lane per chunk */
        uint4 vx[GEMV_UNROLL][XV];
        float sblk[GEMV_UNROLL]; /* BLK: each chunk's block scale (0 past the end: its sums are 0 too) */
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int ch = ch0 + u * WARPS;
            if (BLK) sblk[u] = ch < c1 ? __ldg(p.blk + (row0 / RP_FP8_BLOCK) * p.blk_ld + ch * CK / RP_FP8_BLOCK) : 0.f;
#pragma unroll
            for (int h = 0; h < XV; h++) {
                const int k = ch * CK + c * (CK / 4) + h * 8;
                const bool ok = ch < c1 && k < K && xt;
                if (STAGED) vx[u][h] = ok ? *reinterpret_cast<const uint4 *>(xrow + (k - kb)) : make_uint4(0, 0, 0, 0);
                else vx[u][h] = ok ? make_x<IN, false>(p.in, g, k, K, 1.0f) : make_uint4(0, 0, 0, 0);
            }
        }
        /* A BF16 input against e4m3 weights becomes f16 here, after the
         * batch's loads are all out (zeros stay zeros): converted beside its
         * load, inside the load's branch, each load waited for the one
         * before it (bench/RESULTS.md, issue 39). */
        if constexpr (W8 && !STAGED)
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
#pragma unroll
                for (int h = 0; h < XV; h++) vx[u][h] = rp_bf16x8_f16x8_sat(vx[u][h]);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            if (W8) {
                float part[4] = {0.f, 0.f, 0.f, 0.f}; /* BLK: this chunk's sums alone */
                float(&d)[4] = BLK ? part : acc;
                /* k 0-7 of the lane's 16 from .x/.y, k 8-15 from .z/.w */
#pragma unroll
                for (int h = 0; h < XV; h++) {
                    const uint32_t alo = h ? va[u].z : va[u].x, ahi = h ? va[u].w : va[u].y;
                    const uint32_t blo = h ? vb[u].z : vb[u].x, bhi = h ? vb[u].w : vb[u].y;
                    /* f16 weights (one cvt a pair) against f16 x */
                    const uint4 a = rp_e4m3x8_f16x8(alo, ahi), b = rp_e4m3x8_f16x8(blo, bhi);
                    rp_mma_16816_f16(d, a.x, b.x, a.y, b.y, vx[u][h].x, vx[u][h].y);
                    rp_mma_16816_f16(d, a.z, b.z, a.w, b.w, vx[u][h].z, vx[u][h].w);
                }
                if (BLK)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[i] = fmaf(sblk[u], part[i], acc[i]);
            } else {
                rp_mma_16816(acc, va[u].x, vb[u].x, va[u].y, vb[u].y, vx[u][0].x, vx[u][0].y);
                rp_mma_16816(acc, va[u].z, vb[u].z, va[u].w, vb[u].w, vx[u][0].z, vx[u][0].w);
            }
        }
    }
    /* acc: rows g and g + 8, tokens 2c and 2c + 1 */
    red[warp][g][2 * c] = acc[0];
    red[warp][g][2 * c + 1] = acc[1];
    red[warp][g + 8][2 * c] = acc[2];
    red[warp][g + 8][2 * c + 1] = acc[3];
    __syncthreads();
    /* Thread i < 128 owns (token i / 16, row i % 16): a token's 16 rows are
     * one half-warp, which the RESIDUAL output reduces by shuffles. Every
     * block has >= 4 warps, so warps 0-3 are whole. */
    const bool owner = threadIdx.x < GEMV_ROWS * 8;
    const int t = (threadIdx.x / GEMV_ROWS) & 7, r = threadIdx.x % GEMV_ROWS;
    float s = 0.0f;
    if (owner)
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += red[w][r][t];
    if (!owner) return;
    const bool valid = t < T && row0 + r < N;
    if (W8 && !BLK && valid) s *= __ldg(p.scale + row0 + r);
    const int64_t o = (int64_t)t * N + row0 + r;
    if (OUT == RP_GEMV_OUT_BF16) {
        if (valid) static_cast<uint16_t *>(p.out.y)[o] = rp_f32_bf16(s);
    } else if (OUT == RP_GEMV_OUT_F32) {
        if (valid) static_cast<float *>(p.out.y)[o] = s;
    } else {
        float nv = 0.0f;
        if (valid) {
            nv = __ldcg(p.out.residual + o) + s;
            p.out.residual[o] = nv;
        }
        float sq = nv * nv;
#pragma unroll
        for (int m = 8; m > 0; m >>= 1) sq += __shfl_xor_sync(RP_FULL_MASK, sq, m);
        if (r == 0) p.out.ss_parts[tile * RP_GEMV_MAX_T + t] = sq; /* 0 for t >= T */
    }
}

/* fp8 weights, 9 to 16 tokens (RP_GEMV_FP8_MAX_T; bf16 x in, bf16 or fp32
 * out): the weights are still read once, each 8-token group of x its own
 * mma on the same widened fragments. x is read through L2 once per block
 * and group (T / 8 bytes of x per weight byte at 16 rows a block): at 16
 * tokens the step is even with bf16 weights, at 24 and 32 well behind
 * cuBLASLt's FP8 matmul, which takes those (forward_chain.c). NG, the
 * groups, is a parameter for that measurement; 2 is built. */
template <int WARPS, int OUT, int NG>
__global__ void __launch_bounds__(WARPS * 32) gemv8_groups_kernel(const uint8_t *__restrict__ W, gemv_params p) {
    __shared__ float red[NG][WARPS][GEMV_ROWS][8];
    rp_pdl_trigger();
    const int T = p.T, N = p.N, K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int tile = blockIdx.x, row0 = tile * GEMV_ROWS;
    constexpr int CK = chunk_k<true>();
    const int c1 = (K + CK - 1) / CK;
    const bool ra = row0 + g < N, rb = row0 + g + 8 < N;
    const uint8_t *wa = W + (int64_t)(ra ? row0 + g : 0) * K + c * (CK / 4);
    const uint8_t *wb = W + (int64_t)(rb ? row0 + g + 8 : 0) * K + c * (CK / 4);
    constexpr int STEP = WARPS * GEMV_UNROLL;
    uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
    load_w<WARPS, true>(va, vb, wa, wb, warp, c1, K, c, ra, rb);
    rp_pdl_wait();
    float acc[NG][4] = {};
    for (int ch0 = warp; ch0 < c1; ch0 += STEP) {
        if (ch0 != warp) load_w<WARPS, true>(va, vb, wa, wb, ch0, c1, K, c, ra, rb);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int ch = ch0 + u * WARPS;
            uint4 vx[NG][2];
#pragma unroll
            for (int j = 0; j < NG; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int k = ch * CK + c * (CK / 4) + h * 8, t = g + 8 * j;
                    vx[j][h] = ch < c1 && k < K && t < T ? make_x<RP_GEMV_IN_BF16, false>(p.in, t, k, K, 1.0f)
                                                         : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 a = rp_e4m3x8_bf16x8(h ? va[u].z : va[u].x, h ? va[u].w : va[u].y);
                const uint4 b = rp_e4m3x8_bf16x8(h ? vb[u].z : vb[u].x, h ? vb[u].w : vb[u].y);
#pragma unroll
                for (int j = 0; j < NG; j++) {
                    rp_mma_16816(acc[j], a.x, b.x, a.y, b.y, vx[j][h].x, vx[j][h].y);
                    rp_mma_16816(acc[j], a.z, b.z, a.w, b.w, vx[j][h].z, vx[j][h].w);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NG; j++) {
        red[j][warp][g][2 * c] = acc[j][0];
        red[j][warp][g][2 * c + 1] = acc[j][1];
        red[j][warp][g + 8][2 * c] = acc[j][2];
        red[j][warp][g + 8][2 * c + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NG * GEMV_ROWS * 8; i += blockDim.x) {
        const int j = i / (GEMV_ROWS * 8), t = (i / GEMV_ROWS) & 7, r = i % GEMV_ROWS, tt = 8 * j + t;
        if (tt >= T || row0 + r >= N) continue;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += red[j][w][r][t];
        s *= __ldg(p.scale + row0 + r);
        const int64_t o = (int64_t)tt * N + row0 + r;
        if (OUT == RP_GEMV_OUT_BF16) static_cast<uint16_t *>(p.out.y)[o] = rp_f32_bf16(s);
        else static_cast<float *>(p.out.y)[o] = s;
    }
}

static int sm_count(void) {
    static int sms = 0;
    if (!sms) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            sms = v;
        else
            return 132;
    }
    return sms;
}

extern "C" int rp_gemv_ss_parts(int N) { return (N + GEMV_ROWS - 1) / GEMV_ROWS; }


/* The staged x's shared memory: T rows of K rounded up to whole chunks. */
template <bool W8>
static size_t stage_bytes(int IN, int T, int K) {
    constexpr int CK = chunk_k<W8>();
    return IN == RP_GEMV_IN_BF16 ? 0 : (size_t)T * stage_ld((K + CK - 1) / CK * CK) * 2;
}

template <int WARPS, int IN, int OUT, bool W8, bool BLK>
static int gemv_launch_wb(const void *W, const gemv_params &p, int blocks, cudaStream_t stream) {
    const size_t smem = stage_bytes<W8>(IN, p.T, p.K);
    /* Above 48 KiB a kernel needs the opt-in; once per instantiation, at the
     * first (eager, warm-up) launch, never first inside a capture. */
    static unsigned opted_in; /* per device (rp_first_on_device) */
    if (smem > 48 * 1024 && rp_first_on_device(&opted_in)) {
        cudaError_t e = cudaFuncSetAttribute(gemv_kernel<WARPS, IN, OUT, W8, BLK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, RP_GEMV_STAGE_BYTES);
        if (e != cudaSuccess) return (int)e;
    }
    return rp_launch(gemv_kernel<WARPS, IN, OUT, W8, BLK>, dim3(blocks), dim3(WARPS * 32), smem, stream, W, p);
}

/* Block-scaled fp8 (p.blk) takes the BLK kernel; its warp count is chosen
 * as the row-scaled kernel's (the same loads, 4 more registers). */
template <int WARPS, int IN, int OUT, bool W8>
static int gemv_launch_w(const void *W, const gemv_params &p, int blocks, cudaStream_t stream) {
    if (W8 && p.blk) return gemv_launch_wb<WARPS, IN, OUT, W8, W8>(W, p, blocks, stream);
    return gemv_launch_wb<WARPS, IN, OUT, W8, false>(W, p, blocks, stream);
}

/* Resident blocks per SM of the WARPS-wide kernel, from the CUDA occupancy
 * calculator (registers and threads: cached per instantiation) and the
 * staged x's shared memory. */
template <int WARPS, int IN, int OUT, bool W8>
static int gemv_occupancy(size_t smem) {
    static int regs_threads = 0;
    if (!regs_threads) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_kernel<WARPS, IN, OUT, W8>, WARPS * 32, 0) !=
                cudaSuccess ||
            n < 1) {
            cudaGetLastError();
            n = 1;
        }
        regs_threads = n;
    }
    const int by_smem = smem ? (int)((200 * 1024) / (smem + 4096)) : regs_threads;
    const int n = regs_threads < by_smem ? regs_threads : by_smem;
    return n < 1 ? 1 : n;
}
template <int IN, int OUT, bool W8>
static int gemv_blocks_per_sm(int warps, size_t smem) {
    if (warps <= 4) return gemv_occupancy<4, IN, OUT, W8>(smem);
    if (warps <= 8) return gemv_occupancy<8, IN, OUT, W8>(smem);
    return gemv_occupancy<16, IN, OUT, W8>(smem);
}

template <int IN, int OUT, bool W8>
static int gemv_launch_io(const void *W, gemv_params p, cudaStream_t stream) {
    const int tiles = (p.N + GEMV_ROWS - 1) / GEMV_ROWS;
    const int nch = (p.K + chunk_k<W8>() - 1) / chunk_k<W8>();
    const int blocks = tiles;
    /* Enough warps in flight to cover HBM latency (~16 per SM), but each
     * warp keeps at least one full unrolled batch of chunks. */
    const int want = 16 * sm_count();
    const size_t smem = stage_bytes<W8>(IN, p.T, p.K);
    int warps = 4;
    while (warps < 16 && blocks * warps < want && nch >= 2 * warps * GEMV_UNROLL) {
        /* Wider blocks fit fewer per SM (at ~80 registers: 6 of 4 warps, 3 of
         * 8, 1 of 16). Take them only if the launch stays one wave or its
         * last wave is nearly full: qwen3-4b's N = 2560 (160 tiles) in
         * 16-warp blocks ran 132 + 28, the 28 alone at the end (its down
         * GEMV at 1.5 TB/s). */
        const int per_sm = gemv_blocks_per_sm<IN, OUT, W8>(2 * warps, smem);
        const int wave = per_sm * sm_count(), waves = (blocks + wave - 1) / wave;
        if (waves > 1 && 4 * blocks < 3 * waves * wave) break;
        warps *= 2;
    }
    /* The prefetch budget, spread over the launch's weight rows. */
    p.pf_bytes = (int)((int64_t)GEMV_PF_BUDGET_BYTES / ((int64_t)blocks * GEMV_ROWS) / 16 * 16);
    if (warps == 4) return gemv_launch_w<4, IN, OUT, W8>(W, p, blocks, stream);
    if (warps == 8) return gemv_launch_w<8, IN, OUT, W8>(W, p, blocks, stream);
    return gemv_launch_w<16, IN, OUT, W8>(W, p, blocks, stream);
}

template <int IN, bool W8>
static int gemv_launch_in(const void *W, const gemv_params &p, cudaStream_t stream) {
    switch (p.out.mode) {
    case RP_GEMV_OUT_BF16: return gemv_launch_io<IN, RP_GEMV_OUT_BF16, W8>(W, p, stream);
    case RP_GEMV_OUT_F32: return gemv_launch_io<IN, RP_GEMV_OUT_F32, W8>(W, p, stream);
    case RP_GEMV_OUT_RESIDUAL: return gemv_launch_io<IN, RP_GEMV_OUT_RESIDUAL, W8>(W, p, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

template <bool W8>
static int gemv_fused(const void *W, const float *scale, const float *blk, rp_gemv_in in, rp_gemv_out out, int T,
                      int N, int K, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    const uintptr_t align =
        (uintptr_t)W | (uintptr_t)in.x | (uintptr_t)in.residual | (uintptr_t)in.norm_w | (uintptr_t)in.gate_up;
    if (T > RP_GEMV_MAX_T || K <= 0 || K % (W8 ? 16 : 8) != 0 || align % 16 != 0 || (W8 && !scale == !blk))
        return (int)cudaErrorInvalidValue;
    if (in.mode == RP_GEMV_IN_RMSNORM && (!in.residual || !in.ss_parts || !in.norm_w || in.num_parts <= 0))
        return (int)cudaErrorInvalidValue;
    if (out.mode == RP_GEMV_OUT_RESIDUAL && (!out.residual || !out.ss_parts)) return (int)cudaErrorInvalidValue;
    if (in.mode == RP_GEMV_IN_SILU && !in.gate_up) return (int)cudaErrorInvalidValue;
    if (in.mode != RP_GEMV_IN_BF16 && stage_bytes<W8>(in.mode, T, K) > RP_GEMV_STAGE_BYTES)
        return (int)cudaErrorInvalidValue;
    gemv_params p = {in, out, T, N, K, 0, scale, blk, rp_fp8_grid_ld(K)};
    switch (in.mode) {
    case RP_GEMV_IN_BF16: return gemv_launch_in<RP_GEMV_IN_BF16, W8>(W, p, stream);
    case RP_GEMV_IN_RMSNORM: return gemv_launch_in<RP_GEMV_IN_RMSNORM, W8>(W, p, stream);
    case RP_GEMV_IN_SILU: return gemv_launch_in<RP_GEMV_IN_SILU, W8>(W, p, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* For both weight types (the fp8 kernel stages K rounded up to 64). */
extern "C" int rp_gemv_stage_fits(int T, int K) {
    return stage_bytes<true>(RP_GEMV_IN_RMSNORM, T, K) <= RP_GEMV_STAGE_BYTES;
}

extern "C" int rp_k_gemv_fused(const rp_bf16 *W, rp_gemv_in in, rp_gemv_out out, int T, int N, int K,
                               cudaStream_t stream) {
    return gemv_fused<false>(W, NULL, NULL, in, out, T, N, K, stream);
}

extern "C" int rp_k_gemv_fused_fp8(const uint8_t *W, const float *scale, rp_gemv_in in, rp_gemv_out out, int T,
                                   int N, int K, cudaStream_t stream) {
    return gemv_fused<true>(W, scale, NULL, in, out, T, N, K, stream);
}

extern "C" int rp_k_gemv_fused_fp8_blocks(const uint8_t *W, const float *grid, rp_gemv_in in, rp_gemv_out out, int T,
                                          int N, int K, cudaStream_t stream) {
    return gemv_fused<true>(W, NULL, grid, in, out, T, N, K, stream);
}

template <int OUT, int NG>
static int gemv8_groups_launch(const uint8_t *W, const gemv_params &p, cudaStream_t stream) {
    const int blocks = (p.N + GEMV_ROWS - 1) / GEMV_ROWS, nch = (p.K + chunk_k<true>() - 1) / chunk_k<true>();
    /* as gemv_launch_io: enough warps to cover HBM latency, each with whole batches */
    const int want = 16 * sm_count();
    int warps = 4;
    while (warps < 8 && blocks * warps < want && nch >= 2 * warps * GEMV_UNROLL) warps *= 2;
    if (warps == 4) return rp_launch(gemv8_groups_kernel<4, OUT, NG>, dim3(blocks), dim3(128), 0, stream, W, p);
    return rp_launch(gemv8_groups_kernel<8, OUT, NG>, dim3(blocks), dim3(256), 0, stream, W, p);
}

template <int OUT>
static int gemv8_groups_out(const uint8_t *W, const gemv_params &p, cudaStream_t stream) {
    static_assert(RP_GEMV_FP8_MAX_T == 16, "one instantiation: two groups of 8 tokens");
    return gemv8_groups_launch<OUT, 2>(W, p, stream);
}

extern "C" int rp_k_gemv_fp8(const uint8_t *W, const float *scale, const rp_bf16 *x, void *y, int out_f32, int T,
                             int N, int K, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    rp_gemv_in in = {};
    in.mode = RP_GEMV_IN_BF16;
    in.x = x;
    rp_gemv_out out = {};
    out.mode = out_f32 ? RP_GEMV_OUT_F32 : RP_GEMV_OUT_BF16;
    out.y = y;
    if (T <= RP_GEMV_MAX_T) return gemv_fused<true>(W, scale, NULL, in, out, T, N, K, stream);
    if (T > RP_GEMV_FP8_MAX_T || K % 16 != 0 || ((uintptr_t)W | (uintptr_t)x) % 16 != 0 || !scale)
        return (int)cudaErrorInvalidValue;
    const gemv_params p = {in, out, T, N, K, 0, scale, NULL, 0};
    return out_f32 ? gemv8_groups_out<RP_GEMV_OUT_F32>(W, p, stream) : gemv8_groups_out<RP_GEMV_OUT_BF16>(W, p, stream);
}

extern "C" int rp_k_gemv(const rp_bf16 *W, const rp_bf16 *x, rp_bf16 *y, int T, int N, int K, cudaStream_t stream) {
    rp_gemv_in in = {};
    in.mode = RP_GEMV_IN_BF16;
    in.x = x;
    rp_gemv_out out = {};
    out.mode = RP_GEMV_OUT_BF16;
    out.y = y;
    return rp_k_gemv_fused(W, in, out, T, N, K, stream);
}

extern "C" int rp_k_gemv_f32out(const rp_bf16 *W, const rp_bf16 *x, float *y, int T, int N, int K,
                                cudaStream_t stream) {
    rp_gemv_in in = {};
    in.mode = RP_GEMV_IN_BF16;
    in.x = x;
    rp_gemv_out out = {};
    out.mode = RP_GEMV_OUT_F32;
    out.y = y;
    return rp_k_gemv_fused(W, in, out, T, N, K, stream);
}
