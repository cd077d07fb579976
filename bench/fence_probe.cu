/* What a grid barrier's round trips cost while bulk copies stream, and
 * where the cost comes from: this SM's own copies in flight, or the load on
 * L2 and HBM as a whole. The decode step's barriers take about twice as
 * long while the rings refill as while HBM idles (bench/RESULTS.md,
 * nineteenth session).
 *
 *   bench_fence_probe [iterations per block, default 400]
 *
 * One block per SM. A producer thread keeps a
 * ring of 24 KiB stages (8 copies of 3 KiB, the decode step's piece) in
 * flight, re-arming each stage as soon as it lands; in the same block
 * thread 0 times with clock64, ~1 us apart, each kind of operation in the
 * table's columns: a release fence with and without a store of its own
 * before it, fences at other scopes, st.release (with a load of the same
 * word after it, so that its time shows), a lone ld.acquire (a poll), a
 * red to the block's own word then polls until it shows (an arrival seen
 * back), and a ping-pong between blocks 2k and 2k + 1 (a relaxed store or
 * red.add, answered the same way: one exchange each way; blocks 2k's times).
 * The rows say which blocks stream and which measure; with clusters of two,
 * one rank's producer fills the other's ring (remote copies and
 * mbarriers), or each rank the other's. Prints the median over measuring
 * blocks of each block's median, in ns at the SM clock measured in the same
 * run, and the stream's total rate. Speed is printed, not asserted
 * (bench/RESULTS.md, twenty-first session).
 */
#include "bench_device.cuh"

#define ROWS 8
#define ROW_BYTES 3072

enum { STREAM_NONE, STREAM_ALL, STREAM_ODD, STREAM_EVEN, STREAM_FIRST };
enum { MEASURE_ALL, MEASURE_EVEN, MEASURE_ODD, MEASURE_FIRST };

__device__ __host__ inline bool pick_stream(int who, int blk) {
    switch (who) {
    case STREAM_ALL: return true;
    case STREAM_ODD: return blk & 1;
    case STREAM_EVEN: return !(blk & 1);
    case STREAM_FIRST: return blk == 0;
    default: return false;
    }
}
__device__ __host__ inline bool pick_measure(int who, int blk) {
    switch (who) {
    case MEASURE_ALL: return true;
    case MEASURE_EVEN: return !(blk & 1);
    case MEASURE_ODD: return blk & 1;
    default: return blk == 0;
    }
}

#define KINDS 11
static const char *kind_names[KINDS] = {"store + fence.acq_rel.gpu", "fence.acq_rel.gpu", "fence.sc.gpu",
                                        "fence.acq_rel.cluster", "fence.acq_rel.cta", "st.release.gpu",
                                        "ld.acquire.gpu", "red.release.gpu + poll", "red.relaxed.gpu + poll",
                                        "ping-pong with the next block (relaxed st, ld)",
                                        "ping-pong with the next block (relaxed red.add, ld)"};

/* Thread 0's timings, kind k, iteration it. */
__device__ __forceinline__ void measure_once(unsigned *out, int blk, int iters, int it, unsigned *mine,
                                             const unsigned *quiet, unsigned &target, bool pong) {
    long long t0, t1;
    unsigned v;
#define TIMED(k, body)                                                                                                 \
    t0 = clock64();                                                                                                    \
    body;                                                                                                              \
    t1 = clock64();                                                                                                    \
    out[((size_t)blk * KINDS + (k)) * iters + it] = (unsigned)(t1 - t0)
    TIMED(0, asm volatile("st.global.u32 [%0], %1;\n\tfence.acq_rel.gpu;" ::"l"(mine + 1), "r"(it) : "memory"));
    TIMED(1, asm volatile("fence.acq_rel.gpu;" ::: "memory"));
    TIMED(2, asm volatile("fence.sc.gpu;" ::: "memory"));
    TIMED(3, asm volatile("fence.acq_rel.cluster;" ::: "memory"));
    TIMED(4, asm volatile("fence.acq_rel.cta;" ::: "memory"));
    /* st.release returns at once whatever it waits for internally: time it
     * with the load of the same word after it (same address: ordered) */
    TIMED(5, asm volatile("st.release.gpu.global.u32 [%1], %2;\n\tld.relaxed.gpu.global.u32 %0, [%1];"
                          : "=r"(v)
                          : "l"(mine + 2), "r"(it)
                          : "memory");
          if (v == 0xdeadbeefu) asm volatile("trap;"));
    TIMED(6, asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(quiet) : "memory");
          if (v == 0xdeadbeefu) asm volatile("trap;")); /* the clock waits for v (0: no one writes it) */
    target++;
    TIMED(7, asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(mine) : "memory"); do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(mine) : "memory");
    } while (v < target));
    target++;
    TIMED(8, asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(mine) : "memory"); do {
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(mine) : "memory");
    } while (v < target));
    /* blocks 2k and 2k + 1 (both measuring): the even one stores the
     * iteration, the odd one answers with the same, the even one's time is
     * the round trip (the odd one's, its wait, is not reported) */
    if (pong) {
        const unsigned *other = mine + ((blk & 1) ? -32 : 32) + 3;
        if (blk & 1) {
            do {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other) : "memory");
            } while (v < (unsigned)it + 1);
            asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(mine + 3), "r"(it + 1) : "memory");
        } else {
            TIMED(9, asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(mine + 3), "r"(it + 1) : "memory"); do {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other) : "memory");
            } while (v < (unsigned)it + 1));
        }
        /* the same with each side's word counted up by red.add */
        const unsigned *other4 = other + 1;
        if (blk & 1) {
            do {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other4) : "memory");
            } while (v < (unsigned)it + 1);
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(mine + 4) : "memory");
        } else {
            TIMED(10, asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(mine + 4) : "memory"); do {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(other4) : "memory");
            } while (v < (unsigned)it + 1));
        }
    }
#undef TIMED
}

__device__ __forceinline__ unsigned cluster_rank(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ unsigned remote(const void *p, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(saddr(p)), "r"(rank));
    return r;
}

/* out[blk][kind][it]: cycles; bytes[blk]: bytes this block's producer
 * issued; span[blk]: cycles it streamed for.
 * xcta 1: clusters of two, rank 1's producer fills rank 0's ring (copies
 * and mbarriers in rank 0, the other way round for the empty barriers),
 * so that the fence of the block the bytes land in, and of the block that
 * issued them, can be told apart; xcta 2: each rank fills the other's. */
__global__ void __launch_bounds__(96, 1)
    probe_kernel(const uint8_t *src, size_t bytes_per_block, int stages, int stream, int measure, int xcta,
                 int iters, unsigned *out, unsigned *words, unsigned long long *bytes, unsigned long long *span) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + 8;
    volatile int *stop = reinterpret_cast<volatile int *>(smem + 192);
    uint8_t *ring = smem + 256;
    const int blk = (int)blockIdx.x;
    const unsigned rank = xcta ? cluster_rank() : 0;
    const bool streams = xcta ? (xcta == 2 || rank == 1) : pick_stream(stream, blk);
    const unsigned partner = rank ^ 1u;
    const bool measures = pick_measure(measure, blk);
    const unsigned stage_bytes = ROWS * ROW_BYTES;
    if (threadIdx.x == 0) {
        for (int k = 0; k < 8; k++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[k])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[k])));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        *stop = 0;
    }
    if (xcta)
        asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
    else
        __syncthreads();
    if (threadIdx.x == 32 && streams) {
        uint64_t policy;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        const uint8_t *base = src + (size_t)blk * bytes_per_block;
        const size_t pieces = bytes_per_block / stage_bytes;
        const long long t0 = clock64();
        long long i = 0;
        for (; !*stop; i++) {
            const int slot = (int)(i % stages);
            unsigned fb = saddr(&full[slot]), rb = saddr(ring + (size_t)slot * stage_bytes);
            if (xcta) {
                fb = remote(&full[slot], partner);
                rb = remote(ring + (size_t)slot * stage_bytes, partner);
                if (i >= stages)
                    while (!mbar_try(&empty[slot], (unsigned)(i / stages - 1) & 1u)) {
                    }
                asm volatile("mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [%0], %1;" ::"r"(fb),
                             "r"(stage_bytes)
                             : "memory");
            } else {
                if (i >= stages)
                    while (!mbar_try(&full[slot], (unsigned)(i / stages - 1) & 1u)) {
                    }
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(fb), "r"(stage_bytes)
                             : "memory");
            }
            const uint8_t *p = base + (size_t)(i % pieces) * stage_bytes;
            for (int j = 0; j < ROWS; j++)
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                             " [%0], [%1], %2, [%3], %4;" ::"r"(rb + j * ROW_BYTES),
                             "l"(p + (size_t)j * ROW_BYTES), "r"(ROW_BYTES), "r"(fb), "l"(policy)
                             : "memory");
        }
        /* drain: every issued stage lands before the block exits (with
         * xcta, rank 0 waits for them: it is told how many there were) */
        if (xcta)
            asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(remote(smem + 200, partner)), "l"(i) : "memory");
        else
            for (long long k = i > stages ? i - stages : 0; k < i; k++)
                while (!mbar_try(&full[k % stages], (unsigned)(k / stages) & 1u)) {
                }
        bytes[blk] = (unsigned long long)i * stage_bytes;
        span[blk] = (unsigned long long)(clock64() - t0);
    } else if (threadIdx.x == 64 && xcta && (xcta == 2 || rank == 0)) {
        /* hands each landed stage back to the partner's producer */
        for (long long k = 0;; k++) {
            const int slot = (int)(k % stages);
            while (!mbar_try(&full[slot], (unsigned)(k / stages) & 1u))
                if (*stop) break;
            if (*stop) break;
            asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote(&empty[slot], partner))
                         : "memory");
        }
    } else if (threadIdx.x == 0) {
        /* let every stream reach its steady state first */
        const long long w0 = clock64();
        while (clock64() - w0 < 40000) {
        }
        unsigned *mine = words + blk * 32, *quiet = words + gridDim.x * 32 + blk * 32;
        unsigned target = 0;
        for (int it = 0; it < iters; it++) {
            if (measures) measure_once(out, blk, iters, it, mine, quiet, target, measure == MEASURE_ALL);
            const long long g0 = clock64(); /* ~1 µs apart, as a step's barriers are further */
            while (clock64() - g0 < 2000) {
            }
        }
        *stop = 1;
    }
    if (xcta) {
        /* rank 0's stop also ends rank 1's producer, which then tells rank
         * 0 how many stages it issued; they land before rank 0 exits */
        if (threadIdx.x == 0 && (xcta == 2 || rank == 0))
            asm volatile("st.shared::cluster.u32 [%0], 1;" ::"r"(remote((const void *)stop, partner)) : "memory");
        asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
        if (threadIdx.x == 0 && (xcta == 2 || rank == 0)) {
            const long long n = *reinterpret_cast<volatile long long *>(smem + 200);
            for (long long k = n > stages ? n - stages : 0; k < n; k++)
                while (!mbar_try(&full[k % stages], (unsigned)(k / stages) & 1u)) {
                }
        }
        asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
    }
}

/* Cycles per nanosecond of the SM clock, against the global timer. */
__global__ void clock_kernel(unsigned long long *r) {
    unsigned long long g0, g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    const long long c0 = clock64();
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    } while (g1 - g0 < 2000000);
    r[0] = (unsigned long long)(clock64() - c0);
    r[1] = g1 - g0;
}

static int cmp_u(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 400;
    if (iters < 10 || iters > 100000) {
        fprintf(stderr, "usage: bench_fence_probe [iterations per block, 10..100000]\n");
        return 2;
    }
    const cudaDeviceProp prop = bench_device();
    const int sms = prop.multiProcessorCount;
    const size_t per_block = (size_t)24 << 20;
    uint8_t *src;
    unsigned *out, *words;
    unsigned long long *bytes, *span, *clk;
    CHECK(cudaMalloc(&src, per_block * sms));
    CHECK(cudaMemset(src, 0x3c, per_block * sms));
    CHECK(cudaMalloc(&out, sizeof(unsigned) * 2 * sms * KINDS * iters));
    CHECK(cudaMalloc(&words, sizeof(unsigned) * 2 * sms * 64));
    CHECK(cudaMalloc(&bytes, sizeof(unsigned long long) * 2 * sms));
    CHECK(cudaMalloc(&span, sizeof(unsigned long long) * 2 * sms));
    CHECK(cudaMalloc(&clk, 2 * sizeof(unsigned long long)));
    clock_kernel<<<1, 1>>>(clk);
    CHECK(cudaGetLastError());
    unsigned long long hclk[2];
    CHECK(cudaMemcpy(hclk, clk, sizeof hclk, cudaMemcpyDeviceToHost));
    const double ghz = (double)hclk[0] / (double)hclk[1];
    unsigned *h = (unsigned *)malloc(sizeof(unsigned) * 2 * sms * KINDS * iters);
    unsigned *med = (unsigned *)malloc(sizeof(unsigned) * 2 * sms);
    unsigned long long *hb = (unsigned long long *)malloc(sizeof(unsigned long long) * 4 * sms);
    if (!h || !med || !hb) return 1;
    static const struct {
        int stream, measure, stages, xcta;
        const char *s, *m;
    } modes[] = {
        {STREAM_NONE, MEASURE_ALL, 8, 0, "none", "all"},
        {STREAM_ALL, MEASURE_ALL, 8, 0, "all", "all (beside their own stream)"},
        {STREAM_ODD, MEASURE_EVEN, 8, 0, "odd", "even (no stream of their own)"},
        {STREAM_EVEN, MEASURE_EVEN, 8, 0, "even", "even (beside their own stream)"},
        {STREAM_EVEN, MEASURE_EVEN, 4, 0, "even", "even (beside their own stream)"},
        {STREAM_NONE, MEASURE_EVEN, 8, 1, "rank 1 of a cluster of 2, into rank 0", "rank 0 (the bytes land here)"},
        {STREAM_NONE, MEASURE_ODD, 8, 1, "rank 1 of a cluster of 2, into rank 0", "rank 1 (issued them)"},
        {STREAM_NONE, MEASURE_ALL, 8, 2, "both ranks of a cluster of 2, each into the other", "all"},
        {STREAM_NONE, MEASURE_ALL, 7, 2, "both ranks of a cluster of 2, each into the other", "all"},
        {STREAM_FIRST, MEASURE_FIRST, 8, 0, "block 0", "block 0 (its own stream only)"},
    };
    {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(sms);
        cfg.blockDim = dim3(384);
        cfg.dynamicSmemBytes = 200 << 10;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int nc = 0;
        CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
        CHECK(cudaOccupancyMaxActiveClusters(&nc, probe_kernel, &cfg));
        printf("clusters of 2 (384 threads, 200 KiB each) resident at once: %d\n\n", nc);
    }
    printf("%s, %d SMs, SM clock %.2f GHz (measured); ns, median over measuring blocks of each block's "
           "median\n\n| streaming | measuring | ring |",
           prop.name, sms, ghz);
    for (int k = 0; k < KINDS; k++) printf(" %s |", kind_names[k]);
    printf(" stream GB/s |\n| --- | --- | --- |");
    for (int k = 0; k <= KINDS; k++) printf(" --- |");
    printf("\n");
    for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++) {
        const int grid = sms, st = modes[md].stages;
        const size_t smem = 256 + (size_t)st * ROWS * ROW_BYTES;
        CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CHECK(cudaMemset(words, 0, sizeof(unsigned) * 2 * sms * 64));
        CHECK(cudaMemset(bytes, 0, sizeof(unsigned long long) * 2 * sms));
        CHECK(cudaMemset(span, 0, sizeof(unsigned long long) * 2 * sms));
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(96);
        cfg.dynamicSmemBytes = smem;
        if (modes[md].xcta) {
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = 2;
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
        }
        CHECK(cudaLaunchKernelEx(&cfg, probe_kernel, (const uint8_t *)src, per_block, st, modes[md].stream,
                                 modes[md].measure, modes[md].xcta, iters, out, words, bytes, span));
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(h, out, sizeof(unsigned) * grid * KINDS * iters, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hb, bytes, sizeof(unsigned long long) * grid, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hb + grid, span, sizeof(unsigned long long) * grid, cudaMemcpyDeviceToHost));
        printf("| %s | %s | %d x 24 KiB |", modes[md].s, modes[md].m, st);
        for (int k = 0; k < KINDS; k++) {
            int n = 0;
            for (int b = 0; b < grid; b++) {
                if (!pick_measure(modes[md].measure, b)) continue;
                if (k >= 9 && (modes[md].measure != MEASURE_ALL || (b & 1))) continue;
                unsigned *v = h + ((size_t)b * KINDS + k) * iters;
                qsort(v, iters, sizeof *v, cmp_u);
                med[n++] = v[iters / 2];
            }
            if (!n) {
                printf(" - |");
                continue;
            }
            qsort(med, n, sizeof *med, cmp_u);
            printf(" %.0f |", med[n / 2] / ghz);
        }
        double rate = 0;
        for (int b = 0; b < grid; b++)
            if (hb[grid + b]) rate += (double)hb[b] / ((double)hb[grid + b] / ghz); /* bytes per ns = GB/s */
        printf(" %.0f |", rate);
        printf("\n");
    }
    free(h);
    free(med);
    free(hb);
    CHECK(cudaFree(src));
    CHECK(cudaFree(out));
    CHECK(cudaFree(words));
    CHECK(cudaFree(bytes));
    CHECK(cudaFree(span));
    CHECK(cudaFree(clk));
    return 0;
}
