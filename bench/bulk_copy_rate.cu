/* How fast one bulk-copy producer per SM streams HBM into a shared-memory
 * ring, by copy size: the decode step's weight stream (decode_step.cu)
 * issues one cp.async.bulk per ring row, 2 KiB on qwen3-0.6b's matrices and
 * 3 KiB on the larger models'. If the copy count rather than the bytes
 * limits an SM, small rows cap the stream whatever the synchronisation.
 *
 *   bench_bulk_copy_rate [MiB per SM, default 64]
 *
 * Each of the grid's blocks (one per SM) streams its own region: a
 * producer thread fills an 8-stage ring of `stage` bytes with copies of
 * `size` bytes (rows `stride` bytes apart in global memory, landing 64
 * bytes apart in shared memory as in the decode step), a consumer warp
 * frees each stage as soon as it lands. Prints GB/s per (size, stride,
 * stage) with the device-to-device copy bandwidth of the same run; the
 * median of 5 runs. Speed is printed, not asserted (bench/RESULTS.md).
 */
#include "bench_device.cuh"

#define STAGES 8

__global__ void __launch_bounds__(64, 1)
    stream_kernel(const uint8_t *src, size_t bytes_per_block, unsigned size, unsigned stride, unsigned rows) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + STAGES;
    uint8_t *ring = smem + 256;
    const unsigned row_slot = size + 64, stage_bytes = rows * size;
    if (threadIdx.x == 0) {
        for (int k = 0; k < STAGES; k++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[k])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[k])));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* pieces of `rows` rows; a piece's rows are `stride` apart, the pieces
     * follow each other (stride * rows bytes each) */
    const int n = (int)(bytes_per_block / ((size_t)stride * rows));
    const uint8_t *base = src + (size_t)blockIdx.x * bytes_per_block;
    if (threadIdx.x == 32) { /* producer */
        uint64_t policy;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        for (int i = 0; i < n; i++) {
            const int slot = i % STAGES;
            if (i >= STAGES)
                while (!mbar_try(&empty[slot], (unsigned)(i / STAGES - 1) & 1u)) {
                }
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[slot])),
                         "r"(stage_bytes)
                         : "memory");
            const uint8_t *p = base + (size_t)i * stride * rows;
            for (unsigned j = 0; j < rows; j++)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                             " [%0], [%1], %2, [%3], %4;" ::"r"(saddr(ring + (size_t)slot * rows * row_slot +
                                                                      j * row_slot)),
                             "l"(p + (size_t)j * stride), "r"(size), "r"(saddr(&full[slot])), "l"(policy)
                             : "memory");
        }
    } else if (threadIdx.x == 0) { /* consumer: frees each stage once it has landed */
        for (int i = 0; i < n; i++) {
            const int slot = i % STAGES;
            while (!mbar_try(&full[slot], (unsigned)(i / STAGES) & 1u)) {
            }
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[slot])) : "memory");
        }
    }
}

static int cmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median5(float *v) {
    qsort(v, 5, sizeof *v, cmp);
    return v[2];
}

int main(int argc, char **argv) {
    const long mib = argc > 1 ? atol(argv[1]) : 64;
    if (mib < 4 || mib > 512) {
        fprintf(stderr, "usage: bench_bulk_copy_rate [MiB per SM, 4..512]\n");
        return 2;
    }
    const cudaDeviceProp prop = bench_device();
    const int sms = prop.multiProcessorCount;
    const size_t per_block = (size_t)mib << 20, total = per_block * sms;
    uint8_t *src, *dst;
    CHECK(cudaMalloc(&src, total));
    CHECK(cudaMalloc(&dst, total / 4));
    CHECK(cudaMemset(src, 0x3c, total));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float t[5];
    for (int r = 0; r < 5; r++) {
        CHECK(cudaEventRecord(e0));
        CHECK(cudaMemcpyAsync(dst, src, total / 4, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    printf("%s, %d SMs, %ld MiB per SM; device copy %.0f GB/s (read + write)\n", prop.name, sms, mib,
           2.0 * (total / 4) / (median5(t) * 1e-3) / 1e9);
    printf("%8s %8s %6s %10s %9s\n", "copy B", "stride B", "rows", "stage KiB", "GB/s");
    /* {size, stride multiple, rows per stage} */
    const unsigned cases[][3] = {{1024, 1, 8},  {2048, 1, 8}, {2048, 3, 8}, {3072, 1, 8}, {3072, 3, 8},
                                 {4096, 1, 8},  {2048, 1, 12}, {2048, 1, 16}, {8192, 1, 2}, {16384, 1, 1},
                                 {16384, 1, 2}, {12288, 1, 2}, {6144, 1, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const unsigned size = cases[c][0], stride = size * cases[c][1], rows = cases[c][2];
        const size_t smem = 256 + (size_t)STAGES * rows * (size + 64);
        if (smem > (size_t)prop.sharedMemPerBlockOptin) continue;
        CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const size_t piece = (size_t)stride * rows, used = per_block / piece * (size_t)rows * size;
        for (int r = 0; r < 5; r++) {
            CHECK(cudaEventRecord(e0));
            stream_kernel<<<sms, 64, smem>>>(src, per_block, size, stride, rows);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            CHECK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        printf("%8u %8u %6u %10.1f %9.0f\n", size, stride, rows, rows * size / 1024.0,
               (double)used * sms / (median5(t) * 1e-3) / 1e9);
    }
    CHECK(cudaFree(src));
    CHECK(cudaFree(dst));
    return 0;
}
