/* The consumers' side of a matrix phase: staging the input vector x in
 * shared memory (RMSNorm, bf16 rows, several sequences at once; as f16
 * where the phase's weights are e4m3, the f16 mma's operand) and
 * gemv_phase, which multiplies the ring's pieces against x and writes each
 * unit's output with its epilogue. */
#ifndef RP_DECODE_STEP_PHASES_CUH
#define RP_DECODE_STEP_PHASES_CUH

#include "../mma.cuh"
#include "ring.cuh"

/* ---- consumer pieces ---------------------------------------------------- */

/* Sum over the 256 consumer threads, the same value in all (fixed order). */
__device__ __forceinline__ float csum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = rp_warp_sum(v);
    if (lane == 0) red[warp] = v;
    cbar();
    float r = 0.0f;
#pragma unroll
    for (int w = 0; w < DS_CONSUMERS; w++) r += red[w];
    cbar(); /* red is reused by the next call */
    return r;
}

/* Layer l's RMSNorm weights (which: 0 attn_norm, 1 mlp_norm, 2 q_norm, 3
 * k_norm; l = num_layers: the final norm): addresses computed, not loaded
 * (rp_decode_step.norms), so a norm's first load does not wait for a
 * pointer; nullptr where the model has no q/k norm. */
__device__ __forceinline__ const uint16_t *ds_norm(const rp_decode_step &s, int l, int which) {
    if (l == s.num_layers) return s.final_norm;
    if (which >= 2 && !s.qk_norm) return nullptr;
    const uint16_t *n = s.norms + (size_t)l * (2 * s.H + 2 * s.hd);
    return which < 2 ? n + which * s.H : n + 2 * s.H + (which - 2) * s.hd;
}

/* A thread's share of a norm's weights, in registers: loaded between the
 * halves of the grid barrier before the staging (the weights feed nothing
 * a block writes), so that after the release the staging waits only for
 * the residual row. */
struct ds_nw {
    uint4 g[DS_MAX_H / (DS_CONSUMERS * 32 * 8)];
};
__device__ __forceinline__ void load_nw(ds_nw &n, const uint16_t *w, int H) {
#pragma unroll
    for (int j = 0; j < DS_MAX_H / (DS_CONSUMERS * 32 * 8); j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) n.g[j] = rp_ld_nc(w + i);
    }
}

/* A pair of staged x values: bf16, or (F16: the phase's weights are e4m3)
 * f16 saturated to +-65504 (fp8.cuh), rounded once from fp32. */
template <bool F16>
__device__ __forceinline__ uint32_t pack_xs(float lo, float hi) {
    if constexpr (F16) return rp_pack_f16x2_sat(lo, hi);
    else return rp_pack_bf16x2(lo, hi);
}

/* The end of a staging: this thread's values of the row (v: its chunks of
 * 8, ss: the sum of their squares) normalised by the whole row's RMS and
 * the norm's weights, into x. */
template <bool F16, int J>
__device__ __forceinline__ void store_normed(uint16_t *xs, const float (&v)[J][8], float ss, const ds_nw &nw, int H,
                                             float eps, float *red) {
    const float inv = 1.0f / sqrtf(csum(ss, red) / (float)H + eps);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) {
            const uint4 g = nw.g[j];
            *reinterpret_cast<uint4 *>(xs + i) =
                make_uint4(pack_xs<F16>(rp_bf16_lo(g.x) * (v[j][0] * inv), rp_bf16_hi(g.x) * (v[j][1] * inv)),
                           pack_xs<F16>(rp_bf16_lo(g.y) * (v[j][2] * inv), rp_bf16_hi(g.y) * (v[j][3] * inv)),
                           pack_xs<F16>(rp_bf16_lo(g.z) * (v[j][4] * inv), rp_bf16_hi(g.z) * (v[j][5] * inv)),
                           pack_xs<F16>(rp_bf16_lo(g.w) * (v[j][6] * inv), rp_bf16_hi(g.w) * (v[j][7] * inv)));
        }
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

/* x = bf16(w * (row * inv)) (F16: f16), row from the fp32 residual or
 * (layer 0) the embedding row; the same expression as the RMSNORM GEMV
 * input. rs, if given, keeps the row: the residual does not change between
 * this staging and the next o or down epilogue, which then add to it
 * without an L2 round trip. */
template <bool F16>
__device__ void stage_norm(uint16_t *xs, const float *res, const uint16_t *emb, const ds_nw &nw, int H, float eps,
                           float *red, float *rs) {
    constexpr int J = DS_MAX_H / (DS_CONSUMERS * 32 * 8);
    float v[J][8];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) {
            if (emb) {
                const uint4 e = rp_ld_nc(emb + i);
                v[j][0] = rp_bf16_lo(e.x), v[j][1] = rp_bf16_hi(e.x), v[j][2] = rp_bf16_lo(e.y);
                v[j][3] = rp_bf16_hi(e.y), v[j][4] = rp_bf16_lo(e.z), v[j][5] = rp_bf16_hi(e.z);
                v[j][6] = rp_bf16_lo(e.w), v[j][7] = rp_bf16_hi(e.w);
            } else {
                const float4 r0 = rp_ld_act_f4(res + i), r1 = rp_ld_act_f4(res + i + 4);
                v[j][0] = r0.x, v[j][1] = r0.y, v[j][2] = r0.z, v[j][3] = r0.w;
                v[j][4] = r1.x, v[j][5] = r1.y, v[j][6] = r1.z, v[j][7] = r1.w;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[j][e] * v[j][e];
            if (rs) {
                *reinterpret_cast<float4 *>(rs + i) = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
                *reinterpret_cast<float4 *>(rs + i + 4) = make_float4(v[j][4], v[j][5], v[j][6], v[j][7]);
            }
        }
    }
    store_normed<F16>(xs, v, ss, nw, H, eps, red);
}

/* stage_norm under tensor parallelism (rp_decode_step_tp), after sum c:
 * the row is the residual before it (none for c = 0, the embedding) plus
 * the ranks' partial rows in rank order (the one-shot all-reduce's sums:
 * kernels/p2p.cu), read from this GPU's recv; every block computes the
 * same row and writes its share (chunks of 8, chunk % grid == block) as the
 * residual after c, which sum c + 1's staging reads. The buffers' parity
 * is the sum's number counted over launches, c + launch (2 L + 1 sums a
 * launch, odd): a rank's next launch writes its embedding into the parity
 * the others' last staging of this launch does not read. */
template <bool F16>
__device__ void stage_norm_tp(uint16_t *xs, const rp_decode_step_tp &tp, int c, unsigned launch, const ds_nw &nw,
                              int H, float eps, float *red, int grid) {
    constexpr int J = DS_MAX_H / (DS_CONSUMERS * 32 * 8);
    const unsigned par = ((unsigned)c + launch) & 1u;
    const float *prev = c > 0 ? tp.res[par ^ 1u] : nullptr;
    float *next = tp.res[par];
    const float *rv = tp.recv[tp.rank] + (size_t)par * tp.n * H;
    float v[J][8];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i < H) {
            float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int k = 0; k < tp.n; k++) {
                const float4 r0 = rp_ld_act_f4(rv + (size_t)k * H + i), r1 = rp_ld_act_f4(rv + (size_t)k * H + i + 4);
                s[0] += r0.x, s[1] += r0.y, s[2] += r0.z, s[3] += r0.w;
                s[4] += r1.x, s[5] += r1.y, s[6] += r1.z, s[7] += r1.w;
            }
            if (prev) {
                const float4 r0 = rp_ld_act_f4(prev + i), r1 = rp_ld_act_f4(prev + i + 4);
                s[0] = r0.x + s[0], s[1] = r0.y + s[1], s[2] = r0.z + s[2], s[3] = r0.w + s[3];
                s[4] = r1.x + s[4], s[5] = r1.y + s[5], s[6] = r1.z + s[6], s[7] = r1.w + s[7];
            }
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[j][e] = s[e];
                ss += s[e] * s[e];
            }
            if ((i >> 3) % grid == (int)blockIdx.x) {
                *reinterpret_cast<float4 *>(next + i) = make_float4(s[0], s[1], s[2], s[3]);
                *reinterpret_cast<float4 *>(next + i + 4) = make_float4(s[4], s[5], s[6], s[7]);
            }
        }
    }
    store_normed<F16>(xs, v, ss, nw, H, eps, red);
}

/* x copied from a 2-byte buffer; F16: the buffer is bf16 (attention's
 * output) and the phase's weights e4m3, so it is converted to f16 here,
 * once per block (the SwiGLU output needs none: the e4m3 step writes it as
 * f16). */
template <bool F16>
__device__ void stage_bf16(uint16_t *xs, const uint16_t *src, int K) {
    for (int i = threadIdx.x * 8; i < K; i += DS_CONSUMERS * 32 * 8) {
        if constexpr (F16) *reinterpret_cast<uint4 *>(xs + i) = rp_bf16x8_f16x8_sat(rp_ld_act(src + i));
        else *reinterpret_cast<uint4 *>(xs + i) = rp_ld_act(src + i);
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

/* Several sequences' x (NB > 1): stage_norm for all of them at once, every
 * row's loads in flight together and one reduction for all the norms
 * (one row at a time costs an L2 round trip and two barriers per row:
 * qwen3-0.6b's four sequences take 1.13 ms that way against 0.83). The same
 * sums in the same order as stage_norm. emb: the embedding table (layer 0;
 * row token[b]), else the residual rows. */
/* rows held in registers: four sequences' at up to 2048 (more spilled),
 * two sequences' at up to 4096 */
__host__ __device__ constexpr int ds_max_h_nb(int nb) { return nb > 2 ? 2048 : 4096; }
template <int NB, bool F16>
__device__ void stage_norm_nb(uint16_t *xs, int xst, int nb, const float *res, const uint16_t *emb,
                              const int32_t (&token)[NB], const uint16_t *w, int H, float eps, float *red, float *rs) {
    constexpr int J = ds_max_h_nb(NB) / (DS_CONSUMERS * 32 * 8);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v[NB][J][8], ss[NB];
    uint4 gw[J];
#pragma unroll
    for (int b = 0; b < NB; b++) ss[b] = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i >= H) continue;
        gw[j] = rp_ld_nc(w + i);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= nb) continue;
            float *f = v[b][j];
            if (emb) {
                const uint4 e = rp_ld_nc(emb + (int64_t)token[b] * H + i);
                f[0] = rp_bf16_lo(e.x), f[1] = rp_bf16_hi(e.x), f[2] = rp_bf16_lo(e.y), f[3] = rp_bf16_hi(e.y);
                f[4] = rp_bf16_lo(e.z), f[5] = rp_bf16_hi(e.z), f[6] = rp_bf16_lo(e.w), f[7] = rp_bf16_hi(e.w);
            } else {
                const float4 r0 = rp_ld_act_f4(res + (int64_t)b * H + i), r1 = rp_ld_act_f4(res + (int64_t)b * H + i + 4);
                f[0] = r0.x, f[1] = r0.y, f[2] = r0.z, f[3] = r0.w, f[4] = r1.x, f[5] = r1.y, f[6] = r1.z, f[7] = r1.w;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss[b] += f[e] * f[e];
            if (rs) {
                *reinterpret_cast<float4 *>(rs + b * H + i) = make_float4(f[0], f[1], f[2], f[3]);
                *reinterpret_cast<float4 *>(rs + b * H + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        ss[b] = rp_warp_sum(ss[b]);
        if (lane == 0) red[warp * NB + b] = ss[b];
    }
    cbar();
    float inv[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        float r = 0.0f;
#pragma unroll
        for (int k = 0; k < DS_CONSUMERS; k++) r += red[k * NB + b];
        inv[b] = 1.0f / sqrtf(r / (float)H + eps);
    }
    cbar(); /* red is reused by the next call */
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = (threadIdx.x + j * DS_CONSUMERS * 32) * 8;
        if (i >= H) continue;
        const uint4 g = gw[j];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= nb) continue;
            const float *f = v[b][j];
            const float n = inv[b];
            *reinterpret_cast<uint4 *>(xs + b * xst + i) =
                make_uint4(pack_xs<F16>(rp_bf16_lo(g.x) * (f[0] * n), rp_bf16_hi(g.x) * (f[1] * n)),
                           pack_xs<F16>(rp_bf16_lo(g.y) * (f[2] * n), rp_bf16_hi(g.y) * (f[3] * n)),
                           pack_xs<F16>(rp_bf16_lo(g.z) * (f[4] * n), rp_bf16_hi(g.z) * (f[5] * n)),
                           pack_xs<F16>(rp_bf16_lo(g.w) * (f[6] * n), rp_bf16_hi(g.w) * (f[7] * n)));
        }
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

/* stage_bf16 for several sequences: rows K apart, every load of a pass in
 * flight at once. */
template <int NB, bool F16>
__device__ void stage_bf16_nb(uint16_t *xs, int xst, int nb, const uint16_t *src, int K) {
    constexpr int J = 8 / NB, STEP = DS_CONSUMERS * 32 * 8;
    for (int i0 = threadIdx.x * 8; i0 < K; i0 += J * STEP) {
        uint4 t[NB][J];
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb && i0 + j * STEP < K) t[b][j] = rp_ld_act(src + (int64_t)b * K + i0 + j * STEP);
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb && i0 + j * STEP < K) {
                    if constexpr (F16) t[b][j] = rp_bf16x8_f16x8_sat(t[b][j]);
                    *reinterpret_cast<uint4 *>(xs + b * xst + i0 + j * STEP) = t[b][j];
                }
    }
    cbar(); /* x is complete before any warp multiplies with it */
}

enum { EPI_BF16, EPI_RESIDUAL, EPI_SWIGLU, EPI_F32 };

/* One matrix phase: every unit this block owns, against x in xs, on the
 * tensor cores. Piece i of the ring (8 rows x up to 1536 k) belongs to
 * warp i % 8, which does all of it with mma m16n8k16, four independent
 * accumulators (e4m3 weights: 16 k a lane's load, widened to f16 in
 * registers by one cvt per pair against x staged as f16, the f16 mma, the
 * rows' scales on the finished sums). Thread (g, c) loads 8 consecutive k of row g with one
 * 16-byte load (a sum over k does not care how k is numbered; gemv.cu does
 * the same) and puts them in A: the first four k in row g, the last four in
 * row g + 8. B's column 0 holds the matching first halves of x, column 1
 * the second halves (lanes g = 0, 1 load them; the other columns are never
 * read), so row g's sum is D[g][0] + D[g + 8][1] (d0 + d3 of lane (g, 0))
 * and one mma covers 8 rows x 32 k. (With the rows as N and x in A it
 * covers 16 k: the same loads and twice the mma, 1.1-1.4% slower on
 * qwen3-0.6b, llama3.2-1b and qwen3-4b; bench/RESULTS.md.)
 * Lanes (g, 0) leave row g in part[i % 32]; the warp that finishes a
 * unit's last piece (a shared counter per unit) adds the unit's pieces in
 * piece order and applies the epilogue, so the result does not depend on
 * which warp was last. i and useq are the ring and unit
 * positions (the producer walks the same sequence). rs: the residual row
 * kept by stage_norm, or null (the residual epilogue reads L2).
 * NB sequences (up to 4): B's columns 2b and 2b + 1 hold sequence b's x
 * halves, so the same mma covers all of them, and lane (g, b) holds row
 * g of sequence b. */
template <int NB, bool DYNK, bool W8, bool TP>
__device__ void gemv_phase(const ds_args &a, int p, int epi, const float *rs, int &iw, const uint8_t *ring,
                           uint64_t *full, uint64_t *empty, const uint16_t *xs, float *part, unsigned *ucnt,
                           const ds_info *info, volatile int *pend, uint64_t *tr, uint64_t *tl, unsigned launch) {
    const int lane = threadIdx.x & 31, st = a.stages, g = lane >> 2, c = lane & 3;
    const ds_mat m = phase_mat<W8>(a.s, p);
    const int kcm = ds_kc(a, m), nch = (m.K + kcm - 1) / kcm, P = m.runs * nch;
    constexpr bool fixed = NB == 1 && !TP; /* the stage's size a constant (ds_make_args) */
    const int stage_b = fixed ? DS_STAGE : a.stage_bytes, row_b = fixed ? DS_ROW_STRIDE : a.row_stride;
    /* this lane's B column g: sequence g / 2 (past 2 NB, columns that are
     * never read) */
    const int tb = min(g >> 1, NB - 1);
    /* Where the phase has a dynamic tail, this block's static pieces,
     * [first, certain), are sure to come; past them the phase ends where the
     * producer's claims run out (pend[p]). A warp sleeping in try_wait there
     * wakes only when its stage's next piece lands, which then belongs to the
     * next phase and comes a claim and a copy later (qwen3-4b: 1.7-4.2 us
     * from a phase's last piece to its last barrier arrival, against 0.7
     * with static units only; tools/step_timeline.py), so there it polls. */
    const int U = m.N / DS_ROWS, S = static_units(U, a);
    const int certain = DYNK && S < U && a.poll_ns ? (p == 0 ? 0 : pend[p - 1]) +
                                                 ((int)(blockIdx.x + 1) * S / a.grid - (int)blockIdx.x * S / a.grid) * P
                                           : INT_MAX;
    for (;; iw += DS_CONSUMERS) {
        /* piece iw, unless the phase ends before it */
        const int slot = iw % st;
        const unsigned par = (unsigned)(iw / st) & 1u;
        const uint64_t t0 = tr ? ds_now() : 0;
        bool ready = false;
        if (DYNK && iw >= certain) {
            while (iw < pend[p] && !(ready = mbar_test(&full[slot], par))) __nanosleep(a.poll_ns);
        } else {
            while (iw < pend[p] && !(ready = mbar_try(&full[slot], par))) {
            }
        }
        if (tr) tr[TR_WAIT_FULL] += ds_now() - t0;
        if (!ready || iw >= pend[p]) break;
        uint64_t *tp = tl && lane == 0 && iw < RP_DECODE_STEP_TL_PIECES ? tl + (size_t)iw * 4 : nullptr;
        if (tp) tp[1] = ds_now();
        const ds_info in = info[slot];
        const int j = iw - in.first, kc = (j % nch) * kcm, kw = min(kcm, m.K - kc);
        /* The residual epilogue's input, loaded before the multiply in case
         * this warp finishes the unit: the L2 round trip then overlaps the
         * mma loop instead of delaying the phase's end (unless the row is in
         * shared memory). Only the unit's own epilogue writes these rows, and
         * it runs after every piece's load. */
        float rres = 0.0f;
        if (epi == EPI_RESIDUAL && !rs && !TP && lane < DS_ROWS * (NB == 1 ? 1 : a.nb))
            rres = __ldcg(a.s.residual + (NB == 1 ? 0 : (lane >> 3) * m.N) + in.unit * DS_ROWS + (lane & 7));
        const uint8_t *wrow = ring + (size_t)slot * stage_b + g * row_b + c * 16;
        const uint8_t *x0 = reinterpret_cast<const uint8_t *>(xs + (NB == 1 ? 0 : tb * a.xstride) + kc);
        float acc[4][4] = {};
        if (m.eb == 2) {
            /* x: this lane's column (g & 1: which half of each 8 k) */
            const uint8_t *xb = x0 + c * 16 + (g & 1) * 8;
            for (int kk = 0; kk < kw / 32; kk += 8) { /* a multiple of 8 (K % 256 == 0) */
                uint4 w[8];
                uint2 x[8];
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    w[q] = *reinterpret_cast<const uint4 *>(wrow + (kk + q) * 64);
                    x[q] = *reinterpret_cast<const uint2 *>(xb + (kk + q) * 64);
                }
#pragma unroll
                for (int q = 0; q < 8; q++) rp_mma_16816(acc[q & 3], w[q].x, w[q].z, w[q].y, w[q].w, x[q].x, x[q].y);
            }
        } else {
            /* e4m3: a lane's 16 bytes are 16 k (a step of the row is 64 k),
             * widened to f16 as two 8-k halves (four cvts each), each half the
             * bf16 path's fragments in an f16 mma with its own x (f16; lane
             * c's k: c * 16 + h * 8 + the column's 4) */
            const uint8_t *xb = x0 + c * 32 + (g & 1) * 8;
            for (int kk = 0; kk < kw / 64; kk += 4) { /* a multiple of 4 (K % 256 == 0) */
                uint4 w[4];
                uint2 x[4][2];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    w[q] = *reinterpret_cast<const uint4 *>(wrow + (kk + q) * 64);
                    x[q][0] = *reinterpret_cast<const uint2 *>(xb + (kk + q) * 128);
                    x[q][1] = *reinterpret_cast<const uint2 *>(xb + (kk + q) * 128 + 16);
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const uint4 a0 = rp_e4m3x8_f16x8(w[q].x, w[q].y), a1 = rp_e4m3x8_f16x8(w[q].z, w[q].w);
                    rp_mma_16816_f16(acc[(2 * q) & 3], a0.x, a0.z, a0.y, a0.w, x[q][0].x, x[q][0].y);
                    rp_mma_16816_f16(acc[(2 * q + 1) & 3], a1.x, a1.z, a1.y, a1.w, x[q][1].x, x[q][1].y);
                }
            }
        }
        if (c < NB) {
            const float d0 = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
            const float d3 = (acc[0][3] + acc[1][3]) + (acc[2][3] + acc[3][3]);
            part[((iw & (DS_PART_SLOTS - 1)) * NB + (NB == 1 ? 0 : c)) * DS_ROWS + g] = d0 + d3;
        }
        __syncwarp();
        int last = 0;
        if (tp) tp[2] = ds_now();
        if (lane == 0) {
            mbar_arrive(&empty[slot]); /* info and the stage are read */
            __threadfence_block();
            last = atomicAdd(&ucnt[in.useq & (DS_PART_SLOTS - 1)], 1u) == (unsigned)P - 1;
        }
        last = __shfl_sync(RP_FULL_MASK, last, 0);
        if (!last) continue;
        /* lane 0 saw the other warps' counts: its fence, then the warp
         * barrier, order every lane's reads of their partials after them */
        if (lane == 0) __threadfence_block();
        __syncwarp();
        if (lane < DS_ROWS * (NB == 1 ? 1 : a.nb)) {
            /* row r of sequence b; the output rows are m.N apart */
            const int r = NB == 1 ? lane : lane & 7, b = NB == 1 ? 0 : lane >> 3;
            float v0 = 0.0f, v1 = 0.0f;
            for (int q = 0; q < nch; q++) {
                v0 += part[(((in.first + q) & (DS_PART_SLOTS - 1)) * NB + b) * DS_ROWS + r];
                if (m.runs == 2) v1 += part[(((in.first + nch + q) & (DS_PART_SLOTS - 1)) * NB + b) * DS_ROWS + r];
            }
            const int n = (NB == 1 ? 0 : b * m.N) + in.unit * DS_ROWS + r;
            if (m.scale) { /* e4m3: the rows' scales on the finished sums */
                v0 *= __ldg(m.scale + in.unit * DS_ROWS + r);
                if (m.runs == 2) v1 *= __ldg(m.scale + m.run_off + in.unit * DS_ROWS + r);
            }
            switch (epi) {
            case EPI_BF16: { /* qkv: Qwen2's bias added before the one rounding (the chain adds it after) */
                const rp_bf16 *bias = a.s.layers[p >> 2].bqkv;
                a.s.qkv[n] = rp_f32_bf16(bias ? v0 + rp_bf16_f32(bias[in.unit * DS_ROWS + r]) : v0);
                break;
            }
            case EPI_RESIDUAL:
                if constexpr (TP) {
                    /* tensor parallelism: this rank's partial row into every
                     * rank's recv (sum 2l + 1 after o, 2l + 2 after down) */
                    const unsigned sc = 2u * (unsigned)(p >> 2) + ((p & 3) == 1 ? 1u : 2u);
                    const size_t off = ((size_t)((sc + launch) & 1u) * a.s.tp.n + a.s.tp.rank) * m.N + n;
                    for (int k = 0; k < a.s.tp.n; k++) a.s.tp.recv[k][off] = v0;
                } else {
                    a.s.residual[n] = (rs ? rs[n] : rres) + v0;
                }
                break;
            case EPI_SWIGLU: {
                /* e4m3: f16 (saturated), the down product's operand as is */
                if constexpr (W8) a.s.act[n] = rp_f32_f16_sat(v0 / (1.0f + expf(-v0)) * v1);
                else a.s.act[n] = rp_f32_bf16(v0 / (1.0f + expf(-v0)) * v1);
                break;
            }
            default: a.s.logits[n] = v0;
            }
        }
        if (lane == 0) ucnt[in.useq & (DS_PART_SLOTS - 1)] = 0;
    }
}

#endif
