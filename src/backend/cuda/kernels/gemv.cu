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
 * Requires K % 8 == 0 and 16-byte aligned W and inputs (true for every
 * model shape replay loads); N is arbitrary. */
#include "common.cuh"
#include "mma.cuh"

#define GEMV_ROWS 16
#define GEMV_UNROLL 4 /* chunks of 32 k per warp per batch */
#define GEMV_PF_BUDGET_BYTES (4096 << 10) /* L2 prefetch budget per launch */

struct gemv_params {
    rp_gemv_in in;
    rp_gemv_out out;
    int T, N, K;
    int pf_bytes; /* L2 prefetch per weight row before the PDL wait (multiple of 16) */
};

/* The weight batch starting at chunk ch0 (this warp's chunks ch0 + u *
 * WARPS): rows g and g + 8 of the block's 16. */
template <int WARPS>
__device__ __forceinline__ void load_w(uint4 (&va)[GEMV_UNROLL], uint4 (&vb)[GEMV_UNROLL], const uint16_t *wa,
                                       const uint16_t *wb, int ch0, int ch_end, int K, int c, bool ra, bool rb) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
        const int ch = ch0 + u * WARPS;
        const int k = ch * 32 + c * 8;
        const bool kin = ch < ch_end && k < K;
        va[u] = kin && ra ? rp_ld_stream(wa + ch * 32) : zero;
        vb[u] = kin && rb ? rp_ld_stream(wb + ch * 32) : zero;
    }
}

/* 8 consecutive x values of token row xrow at k, as 4 bf16 pairs, made
 * from the input. */
template <int IN>
__device__ __forceinline__ uint4 make_x(const rp_gemv_in &in, int xrow, int k, int K, float inv) {
    /* BF16 x through L2 (.cg). Measured under PDL on llama3-8b, batch 1:
     * .cg 6.43 ms per step, the read-only path 6.91, plain loads 6.94. */
    if (IN == RP_GEMV_IN_BF16) return rp_ld_act(in.x + (int64_t)xrow * K + k);
    if (IN == RP_GEMV_IN_RMSNORM) {
        const float *r = in.residual + (int64_t)xrow * K + k;
        const float4 r0 = rp_ld_act_f4(r), r1 = rp_ld_act_f4(r + 4);
        const uint4 w = rp_ld_nc(in.norm_w + k);
        /* the same expression as add_rmsnorm_kernel: w * (x * inv) */
        return make_uint4(rp_pack_bf16x2(rp_bf16_lo(w.x) * (r0.x * inv), rp_bf16_hi(w.x) * (r0.y * inv)),
                          rp_pack_bf16x2(rp_bf16_lo(w.y) * (r0.z * inv), rp_bf16_hi(w.y) * (r0.w * inv)),
                          rp_pack_bf16x2(rp_bf16_lo(w.z) * (r1.x * inv), rp_bf16_hi(w.z) * (r1.y * inv)),
                          rp_pack_bf16x2(rp_bf16_lo(w.w) * (r1.z * inv), rp_bf16_hi(w.w) * (r1.w * inv)));
    }
    /* SILU: the fp32 gate_up row is [gate (K) | up (K)] */
    const float *gp = in.gate_up + (int64_t)xrow * 2 * K + k;
    return rp_silu_mul8(gp, gp + K);
}

/* Row stride of the staged x in shared memory (bf16): 16 bytes of padding
 * put the tokens' rows in different banks. */
__host__ __device__ __forceinline__ int stage_ld(int K) { return K + 8; }

/* RMSNORM / SILU inputs: the whole block makes x[T][K] once, into shared
 * memory, before the weight loop. Done per iteration by the few lanes that
 * hold x fragments instead, it would put an L2 round trip and the SwiGLU
 * arithmetic in every iteration's critical path (measured: gate_up 88 ->
 * 110 us, down 46 -> 76 us on llama3-8b). Loads go out in groups of
 * STAGE_BATCH before any is used. */
#define STAGE_BATCH 4
template <int IN>
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
                v[j] = make_x<IN>(in, row, kb + k, K, IN == RP_GEMV_IN_RMSNORM ? s_inv[t] : 1.0f);
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

template <int WARPS, int IN, int OUT>
__global__ void __launch_bounds__(WARPS * 32) gemv_kernel(const uint16_t *__restrict__ W, gemv_params p) {
    __shared__ float red[WARPS][GEMV_ROWS][8];
    __shared__ float s_inv[RP_GEMV_MAX_T];
    extern __shared__ __align__(16) uint16_t xs[]; /* staged x: [T][stage_ld(K rounded up to 32)] */
    constexpr bool STAGED = IN != RP_GEMV_IN_BF16;
    rp_pdl_trigger();
    const int T = p.T, N = p.N, K = p.K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3; /* mma groupID / thread-in-group */
    const int tile = blockIdx.x, row0 = tile * GEMV_ROWS; /* the block's 16 rows */
    const int c0 = 0, c1 = (K + 31) / 32; /* the block's 32-wide k chunks: all of them */
    const int kb = 0, kr = K;
    const bool ra = row0 + g < N, rb = row0 + g + 8 < N, xt = g < T;
    const uint16_t *wa = W + (int64_t)(ra ? row0 + g : 0) * K + c * 8;
    const uint16_t *wb = W + (int64_t)(rb ? row0 + g + 8 : 0) * K + c * 8;
    constexpr int STEP = WARPS * GEMV_UNROLL;

    /* Constant data only until the wait (see common.cuh). */
    if (warp == 0 && lane < GEMV_ROWS && row0 + lane < N && kr > 0) {
        const int bytes = min(kr * 2, p.pf_bytes); /* kr * 2: a multiple of 16 */
        if (bytes > 0) rp_prefetch_l2(W + (int64_t)(row0 + lane) * K + kb, bytes);
    }
    uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
    load_w<WARPS>(va, vb, wa, wb, c0 + warp, c1, K, c, ra, rb);
    rp_pdl_wait();
    const int ld = stage_ld(c1 * 32);
    if (STAGED) stage_x<IN>(p.in, xs, s_inv, T, K, kb, kr, ld);
    const uint16_t *xrow = xs + (xt ? g : 0) * ld;

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ch0 = c0 + warp; ch0 < c1; ch0 += STEP) {
        if (ch0 != c0 + warp) load_w<WARPS>(va, vb, wa, wb, ch0, c1, K, c, ra, rb);
        uint4 vx[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int ch = ch0 + u * WARPS;
            const int k = ch * 32 + c * 8;
            const bool ok = ch < c1 && k < K && xt;
            if (STAGED) vx[u] = ok ? *reinterpret_cast<const uint4 *>(xrow + (k - kb)) : make_uint4(0, 0, 0, 0);
            else vx[u] = ok ? make_x<IN>(p.in, g, k, K, 1.0f) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            rp_mma_16816(acc, va[u].x, vb[u].x, va[u].y, vb[u].y, vx[u].x, vx[u].y);
            rp_mma_16816(acc, va[u].z, vb[u].z, va[u].w, vb[u].w, vx[u].z, vx[u].w);
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

extern "C" int rp_gemv_stage_fits(int T, int K) {
    return (size_t)T * stage_ld(K) * 2 <= RP_GEMV_STAGE_BYTES;
}

template <int WARPS, int IN, int OUT>
static int gemv_launch_w(const rp_bf16 *W, const gemv_params &p, int blocks, cudaStream_t stream) {
    const size_t smem = IN == RP_GEMV_IN_BF16 ? 0 : (size_t)p.T * stage_ld((p.K + 31) / 32 * 32) * 2;
    /* Above 48 KiB a kernel needs the opt-in; once per instantiation, at the
     * first (eager, warm-up) launch, never first inside a capture. */
    static bool opted_in = false;
    if (smem > 48 * 1024 && !opted_in) {
        cudaError_t e = cudaFuncSetAttribute(gemv_kernel<WARPS, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             RP_GEMV_STAGE_BYTES);
        if (e != cudaSuccess) return (int)e;
        opted_in = true;
    }
    return rp_launch(gemv_kernel<WARPS, IN, OUT>, dim3(blocks), dim3(WARPS * 32), smem, stream, W,
                             p);
}

/* Resident blocks per SM of the WARPS-wide kernel, from the CUDA occupancy
 * calculator (registers and threads: cached per instantiation) and the
 * staged x's shared memory. */
template <int WARPS, int IN, int OUT>
static int gemv_occupancy(size_t smem) {
    static int regs_threads = 0;
    if (!regs_threads) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_kernel<WARPS, IN, OUT>, WARPS * 32, 0) !=
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
template <int IN, int OUT>
static int gemv_blocks_per_sm(int warps, size_t smem) {
    if (warps <= 4) return gemv_occupancy<4, IN, OUT>(smem);
    if (warps <= 8) return gemv_occupancy<8, IN, OUT>(smem);
    return gemv_occupancy<16, IN, OUT>(smem);
}

template <int IN, int OUT>
static int gemv_launch_io(const rp_bf16 *W, gemv_params p, cudaStream_t stream) {
    const int tiles = (p.N + GEMV_ROWS - 1) / GEMV_ROWS;
    const int nch = (p.K + 31) / 32;
    const int blocks = tiles;
    /* Enough warps in flight to cover HBM latency (~16 per SM), but each
     * warp keeps at least one full unrolled batch of chunks. */
    const int want = 16 * sm_count();
    const size_t smem = IN == RP_GEMV_IN_BF16 ? 0 : (size_t)p.T * stage_ld(nch * 32) * 2;
    int warps = 4;
    while (warps < 16 && blocks * warps < want && nch >= 2 * warps * GEMV_UNROLL) {
        /* Wider blocks fit fewer per SM (at ~80 registers: 6 of 4 warps, 3 of
         * 8, 1 of 16). Take them only if the launch stays one wave or its
         * last wave is nearly full: qwen3-4b's N = 2560 (160 tiles) in
         * 16-warp blocks ran 132 + 28, the 28 alone at the end (its down
         * GEMV at 1.5 TB/s). */
        const int per_sm = gemv_blocks_per_sm<IN, OUT>(2 * warps, smem);
        const int wave = per_sm * sm_count(), waves = (blocks + wave - 1) / wave;
        if (waves > 1 && 4 * blocks < 3 * waves * wave) break;
        warps *= 2;
    }
    /* The prefetch budget, spread over the launch's weight rows. */
    p.pf_bytes = (int)((int64_t)GEMV_PF_BUDGET_BYTES / ((int64_t)blocks * GEMV_ROWS) / 16 * 16);
    if (warps == 4) return gemv_launch_w<4, IN, OUT>(W, p, blocks, stream);
    if (warps == 8) return gemv_launch_w<8, IN, OUT>(W, p, blocks, stream);
    return gemv_launch_w<16, IN, OUT>(W, p, blocks, stream);
}

template <int IN>
static int gemv_launch_in(const rp_bf16 *W, const gemv_params &p, cudaStream_t stream) {
    switch (p.out.mode) {
    case RP_GEMV_OUT_BF16: return gemv_launch_io<IN, RP_GEMV_OUT_BF16>(W, p, stream);
    case RP_GEMV_OUT_F32: return gemv_launch_io<IN, RP_GEMV_OUT_F32>(W, p, stream);
    case RP_GEMV_OUT_RESIDUAL: return gemv_launch_io<IN, RP_GEMV_OUT_RESIDUAL>(W, p, stream);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int rp_k_gemv_fused(const rp_bf16 *W, rp_gemv_in in, rp_gemv_out out, int T, int N, int K,
                               cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    const uintptr_t align =
        (uintptr_t)W | (uintptr_t)in.x | (uintptr_t)in.residual | (uintptr_t)in.norm_w | (uintptr_t)in.gate_up;
    if (T > RP_GEMV_MAX_T || K <= 0 || K % 8 != 0 || align % 16 != 0) return (int)cudaErrorInvalidValue;
    if (in.mode == RP_GEMV_IN_RMSNORM && (!in.residual || !in.ss_parts || !in.norm_w || in.num_parts <= 0))
        return (int)cudaErrorInvalidValue;
    if (out.mode == RP_GEMV_OUT_RESIDUAL && (!out.residual || !out.ss_parts)) return (int)cudaErrorInvalidValue;
    if (in.mode == RP_GEMV_IN_SILU && !in.gate_up) return (int)cudaErrorInvalidValue;
    if (in.mode != RP_GEMV_IN_BF16 && !rp_gemv_stage_fits(T, K)) return (int)cudaErrorInvalidValue;
    gemv_params p = {in, out, T, N, K, 0};
    switch (in.mode) {
    case RP_GEMV_IN_BF16: return gemv_launch_in<RP_GEMV_IN_BF16>(W, p, stream);
    case RP_GEMV_IN_RMSNORM: return gemv_launch_in<RP_GEMV_IN_RMSNORM>(W, p, stream);
    case RP_GEMV_IN_SILU: return gemv_launch_in<RP_GEMV_IN_SILU>(W, p, stream);
    default: return (int)cudaErrorInvalidValue;
    }
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
