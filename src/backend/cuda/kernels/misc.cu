/* Small elementwise kernels: SwiGLU (silu(gate) * up), the row gather that
 * feeds the lm_head only the rows that need logits, and the on-device dummy
 * weight generator (bit-identical to src/model/weights.c so CPU and GPU
 * benchmarks and tests see the same model). */
#include "common.cuh"
#include "util/rng.h"

/* gate_up[t] = [gate (F) | up (F)], fp32 (the products' own sums: bf16
 * there would be the largest rounding error of the chain after the GEMMs'
 * inputs); 8 elements per thread when aligned. */
template <bool VEC>
__global__ void silu_mul_kernel(const float *__restrict__ gate_up, uint16_t *__restrict__ out, int T, int F) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const int64_t per_row = VEC ? F / 8 : F;
    const int64_t total = (int64_t)T * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / per_row, c = i % per_row;
        const float *g = gate_up + t * 2 * F;
        if (VEC) {
            *reinterpret_cast<uint4 *>(out + t * F + c * 8) = rp_silu_mul8(g + c * 8, g + F + c * 8);
        } else {
            const float gf = g[c];
            out[t * F + c] = rp_f32_bf16(gf / (1.0f + expf(-gf)) * g[F + c]);
        }
    }
}

static int grid_for(int64_t work, int threads) {
    int64_t b = (work + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" int rp_k_silu_mul(const float *gate_up, rp_bf16 *out, int T, int F, cudaStream_t stream) {
    if (T <= 0 || F <= 0) return cudaSuccess;
    if (F % 8 == 0)
        return rp_launch(silu_mul_kernel<true>, dim3(grid_for((int64_t)T * F / 8, 256)), dim3(256), 0, stream,
                         gate_up, out, T, F);
    return rp_launch(silu_mul_kernel<false>, dim3(grid_for((int64_t)T * F, 256)), dim3(256), 0, stream, gate_up, out,
                     T, F);
}

template <bool VEC>
__global__ void gather_rows_kernel(const uint16_t *__restrict__ in, const int32_t *__restrict__ rows,
                                   uint16_t *__restrict__ out, int H) {
    rp_pdl_trigger();
    rp_pdl_wait();
    const uint16_t *src = in + (int64_t)rows[blockIdx.x] * H;
    uint16_t *dst = out + (int64_t)blockIdx.x * H;
    if (VEC) {
        for (int i = threadIdx.x * 8; i < H; i += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(dst + i) = *reinterpret_cast<const uint4 *>(src + i);
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = src[i];
    }
}

extern "C" int rp_k_gather_rows(const rp_bf16 *in, const int32_t *rows, rp_bf16 *out, int n, int H,
                                cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (H % 8 == 0) return rp_launch(gather_rows_kernel<true>, dim3(n), dim3(256), 0, stream, in, rows, out, H);
    return rp_launch(gather_rows_kernel<false>, dim3(n), dim3(256), 0, stream, in, rows, out, H);
}

/* ---- dummy weights: the device twin of rp_rand_normal_pair (util/rng.h) ----
 * Same operations in the same order, each an IEEE-754 double op with an
 * explicit rounding (_rn): nvcc would otherwise fuse a*b+c into one FMA,
 * which rounds once where the host rounds twice and breaks bit-identity. The
 * coefficients are rng.h's literal lists, copied to constant memory (device
 * code cannot read the host's static const tables). The fill_dummy test
 * checks the kernel against the host generator bit for bit. */

__constant__ double d_normal_log_c[RP_NORMAL_LOG_TERMS] = {RP_NORMAL_LOG_C};
__constant__ double d_normal_cos_c[RP_NORMAL_COS_TERMS] = {RP_NORMAL_COS_C};
__constant__ double d_normal_sin_c[RP_NORMAL_SIN_TERMS] = {RP_NORMAL_SIN_C};

__device__ __forceinline__ double d_normal_horner(const double *c, int n, double x) {
    double p = c[n - 1];
    for (int k = n - 2; k >= 0; k--) p = __dadd_rn(__dmul_rn(p, x), c[k]);
    return p;
}

__device__ __forceinline__ double d_normal_log(double u) {
    const int e = (int)((uint64_t)__double_as_longlong(__dmul_rn(u, RP_NORMAL_SQRT2)) >> 52) - 1023;
    const double m = __dmul_rn(u, __longlong_as_double((long long)((uint64_t)(1023 - e) << 52)));
    const double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0)), w = __dmul_rn(s, s);
    const double lnm = __dmul_rn(2.0, __dmul_rn(s, d_normal_horner(d_normal_log_c, RP_NORMAL_LOG_TERMS, w)));
    return __dadd_rn(__dmul_rn((double)e, RP_NORMAL_LN2), lnm);
}

__device__ __forceinline__ void d_rand_normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, double z[2]) {
    const uint64_t base = rp_d_mix64(seed ^ rp_d_mix64(stream));
    const uint64_t a = rp_d_mix64(base + 2 * pair), b = rp_d_mix64(base + 2 * pair + 1);
    const double u1 = __dmul_rn((double)(int64_t)((a >> 11) + 1), 0x1p-53);
    const double r = __dsqrt_rn(__dmul_rn(-2.0, d_normal_log(u1)));
    const double t = __dmul_rn((double)(int64_t)((b >> 8) & ((1ull << 53) - 1)), 0x1p-53);
    const double phi = __dmul_rn(t, RP_NORMAL_PI_4), x = __dmul_rn(phi, phi);
    const uint64_t sinb =
        (uint64_t)__double_as_longlong(__dmul_rn(phi, d_normal_horner(d_normal_sin_c, RP_NORMAL_SIN_TERMS, x)));
    const uint64_t cosb = (uint64_t)__double_as_longlong(d_normal_horner(d_normal_cos_c, RP_NORMAL_COS_TERMS, x));
    const uint64_t swap = 0 - ((b >> 61) & 1);
    const uint64_t c = ((cosb & ~swap) | (sinb & swap)) ^ (b >> 63 << 63);
    const uint64_t s = ((sinb & ~swap) | (cosb & swap)) ^ ((b >> 62) & 1) << 63;
    z[0] = __dmul_rn(r, __longlong_as_double((long long)c));
    z[1] = __dmul_rn(r, __longlong_as_double((long long)s));
}

/* z * std, rounded to float then to bf16 (rp_dummy_bf16). */
__device__ __forceinline__ uint16_t d_dummy_bf16(double z, double std) {
    return rp_f32_bf16(__double2float_rn(__dmul_rn(z, std)));
}

/* One thread per pair of elements (Box-Muller makes two at once). */
__global__ void fill_dummy_kernel(uint16_t *__restrict__ dst, int64_t n, uint64_t seed, uint64_t stream_id,
                                  double std, int is_norm) {
    const int64_t pairs = (n + 1) / 2;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs;
         p += (int64_t)gridDim.x * blockDim.x) {
        uint16_t lo = 0x3f80, hi = 0x3f80; /* bf16 1.0 */
        if (!is_norm) {
            double z[2];
            d_rand_normal_pair(seed, stream_id, (uint64_t)p, z);
            lo = d_dummy_bf16(z[0], std);
            hi = d_dummy_bf16(z[1], std);
        }
        dst[2 * p] = lo;
        if (2 * p + 1 < n) dst[2 * p + 1] = hi;
    }
}

/* One thread per element of the slice: it makes its element's pair and
 * keeps its half (twice the generator's work; a slice is made once, at
 * load). */
__global__ void fill_dummy_slice_kernel(uint16_t *__restrict__ dst, int64_t rows, int64_t cols, int64_t src_cols,
                                        int64_t row0, int64_t col0, int64_t valid_rows, uint64_t seed,
                                        uint64_t stream_id, double std, int is_norm) {
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        uint16_t v = 0;
        if (r < valid_rows) {
            v = 0x3f80; /* bf16 1.0 */
            if (!is_norm) {
                const int64_t e = (row0 + r) * src_cols + col0 + c;
                double z[2];
                d_rand_normal_pair(seed, stream_id, (uint64_t)(e / 2), z);
                v = d_dummy_bf16(z[e & 1], std);
            }
        }
        dst[i] = v;
    }
}

extern "C" int rp_k_fill_dummy_slice(rp_bf16 *dst, int64_t rows, int64_t cols, int64_t src_cols, int64_t row0,
                                     int64_t col0, int64_t valid_rows, uint64_t seed, uint64_t stream_id, double std,
                                     int is_norm, cudaStream_t stream) {
    const int64_t n = rows * cols;
    if (n <= 0) return cudaSuccess;
    const int64_t blocks = (n + 255) / 256;
    fill_dummy_slice_kernel<<<(int)(blocks > 16384 ? 16384 : blocks), 256, 0, stream>>>(
        dst, rows, cols, src_cols, row0, col0, valid_rows, seed, stream_id, std, is_norm);
    return rp_launch_result();
}

extern "C" int rp_k_fill_dummy(rp_bf16 *dst, int64_t n, uint64_t seed, uint64_t stream_id, double std,
                               int is_norm, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const int64_t blocks = ((n + 1) / 2 + 255) / 256;
    fill_dummy_kernel<<<(int)(blocks > 16384 ? 16384 : blocks), 256, 0, stream>>>(dst, n, seed, stream_id, std,
                                                                                  is_norm);
    return rp_launch_result();
}
