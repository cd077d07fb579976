/* Decode-time matrix product y[t][n] = sum_k x[t][k] W[n][k] for T <= 8
 * tokens: the kernel that decides decode speed, since it streams every
 * weight once per step. It must run at HBM bandwidth, so:
 *  - W is read with 16-byte streaming loads (no L1 allocation), several per
 *    thread issued before any is used;
 *  - the arithmetic runs on the tensor cores (mma m16n8k16, fp32
 *    accumulate): 16 weight rows are the M side, the (up to) 8 tokens the N
 *    side. A sum over k does not care how k is numbered, so each thread
 *    feeds the mma the 8 consecutive k it loaded with one uint4, as long as
 *    the x fragment uses the same numbering. No shuffles, no shared-memory
 *    staging of W, and T = 1..8 cost the same;
 *  - a block owns 16 rows and its warps split K; one shared-memory
 *    reduction at the end. The warp count per block is chosen from N so
 *    that small matrices still fill the GPU.
 * Requires K % 8 == 0 and 16-byte aligned W and x (true for every model
 * shape replay loads); N is arbitrary. */
#include "common.cuh"
#include "mma.cuh"

#define GEMV_ROWS 16
#define GEMV_UNROLL 4 /* chunks of 32 k per warp in flight */

__device__ __forceinline__ void store_out(uint16_t *p, float v) { *p = rp_f32_bf16(v); }
__device__ __forceinline__ void store_out(float *p, float v) { *p = v; }

template <int WARPS, typename OUT>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_kernel(const uint16_t *__restrict__ W, const uint16_t *__restrict__ x, OUT *__restrict__ y, int T, int N,
                int K) {
    __shared__ float red[WARPS][GEMV_ROWS][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3; /* mma groupID / thread-in-group */
    const int row0 = blockIdx.x * GEMV_ROWS;
    const bool ra = row0 + g < N, rb = row0 + g + 8 < N, xt = g < T;
    const uint16_t *wa = W + (int64_t)(ra ? row0 + g : 0) * K + c * 8;
    const uint16_t *wb = W + (int64_t)(rb ? row0 + g + 8 : 0) * K + c * 8;
    const uint16_t *xp = x + (int64_t)(xt ? g : 0) * K + c * 8;
    const int nch = (K + 31) / 32;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ch0 = warp; ch0 < nch; ch0 += WARPS * GEMV_UNROLL) {
        uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL], vx[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int ch = ch0 + u * WARPS;
            const int k = ch * 32; /* this thread's 8 k start at k + c * 8 */
            const bool kin = ch < nch && k + c * 8 < K;
            va[u] = kin && ra ? rp_ld_stream(wa + k) : zero;
            vb[u] = kin && rb ? rp_ld_stream(wb + k) : zero;
            vx[u] = kin && xt ? rp_ld_nc(xp + k) : zero;
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
    for (int i = threadIdx.x; i < GEMV_ROWS * 8; i += WARPS * 32) {
        const int t = i / GEMV_ROWS, r = i % GEMV_ROWS;
        if (t >= T || row0 + r >= N) continue;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += red[w][r][t];
        store_out(y + (int64_t)t * N + row0 + r, s);
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

template <typename OUT>
static int gemv_launch(const rp_bf16 *W, const rp_bf16 *x, OUT *y, int T, int N, int K, cudaStream_t stream) {
    if (T <= 0 || N <= 0) return cudaSuccess;
    if (T > RP_GEMV_MAX_T || K <= 0 || K % 8 != 0 || ((uintptr_t)W | (uintptr_t)x) % 16 != 0)
        return (int)cudaErrorInvalidValue;
    const int blocks = (N + GEMV_ROWS - 1) / GEMV_ROWS;
    const int nch = (K + 31) / 32;
    /* Enough warps in flight to cover HBM latency (~16 per SM), but each
     * warp keeps at least one full unrolled batch of chunks. */
    const int want = 16 * sm_count();
    int warps = 4;
    while (warps < 16 && blocks * warps < want && nch >= 2 * warps * GEMV_UNROLL) warps *= 2;
    if (warps == 4)
        gemv_kernel<4, OUT><<<blocks, 4 * 32, 0, stream>>>(W, x, y, T, N, K);
    else if (warps == 8)
        gemv_kernel<8, OUT><<<blocks, 8 * 32, 0, stream>>>(W, x, y, T, N, K);
    else
        gemv_kernel<16, OUT><<<blocks, 16 * 32, 0, stream>>>(W, x, y, T, N, K);
    return rp_launch_result();
}

extern "C" int rp_k_gemv(const rp_bf16 *W, const rp_bf16 *x, rp_bf16 *y, int T, int N, int K, cudaStream_t stream) {
    return gemv_launch<uint16_t>(W, x, y, T, N, K, stream);
}

extern "C" int rp_k_gemv_f32out(const rp_bf16 *W, const rp_bf16 *x, float *y, int T, int N, int K,
                                cudaStream_t stream) {
    return gemv_launch<float>(W, x, y, T, N, K, stream);
}
