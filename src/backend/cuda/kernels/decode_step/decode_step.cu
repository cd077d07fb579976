/* The whole decode step of one to four sequences (one token each) in one
 * persistent kernel; what follows describes one, and gemv_phase how the
 * others share its weight stream.
 *
 * Why: at batch 1 a step is ~6 launches per layer, and every launch boundary
 * costs a ramp-up and a drain (~3-5 us each even under PDL), which on the
 * small models is more than the weight streaming itself (qwen3-0.6b:
 * 0.41 ms of bytes, 1.19 ms per step as a chain of kernels). Here one block
 * per SM lives for the whole step, and the weight stream never stops at a
 * layer or phase boundary:
 *  - the step is a fixed sequence of matrix phases (per layer: qkv, o,
 *    gate_up, down; then lm_head). Each matrix is cut into units of 8 rows
 *    (gate_up: 8 gate rows and the 8 matching up rows) and block b owns the
 *    contiguous range [b S / G, (b+1) S / G) of a phase's first S units.
 *    So every block knows, before anything runs, most of the weight bytes
 *    it will read in the whole step;
 *  - one producer thread per block walks that list from the first
 *    instruction, copying each unit in pieces of 8 rows x 1536 k (1024
 *    on the smallest shapes, ds_kc; one bulk copy per row,
 *    cp.async.bulk, completion counted in bytes on the stage's mbarrier)
 *    into a ring of 8 shared-memory stages. It waits only
 *    for a free stage, never for an activation: while the consumers sit in
 *    a grid barrier or in attention, the next phase's weights keep
 *    arriving (and when its ring is full it prefetches the next pieces
 *    into L2). On the large shapes the last seven eighths of each large
 *    phase's units are not cut in advance: producers take them one at a
 *    time from a counter, so blocks that stream faster take more
 *    (static_units; the 1B-class shapes cut everything in advance);
 *  - eight consumer warps stage the phase's input vector in shared memory
 *    (the RMSNorm, SwiGLU and attention output are made there); ring piece
 *    i belongs to warp i % 8, which multiplies it against x on the tensor
 *    cores and leaves 8 partial sums; the warp that finishes a unit's last
 *    piece adds them in piece order and writes the phase's output with its
 *    epilogue fused (qkv bf16, residual += y, bf16(silu(gate) * up), fp32
 *    logits);
 *  - phases meet at a grid barrier (a counter with release/acquire at gpu
 *    scope; docs/memory-model.md), five per layer;
 *  - attention: (kv head, split) items spread over the blocks; each item
 *    does q/k norm and RoPE for its heads (the item that holds the new
 *    position also stores the new k and v in the paged cache), an online
 *    softmax over its keys (K/V prefetched into L2 a layer ahead), and
 *    publishes its partial result as tagged words; the block of split g
 *    merges query head g by polling the splits' words (merge_head), in
 *    split order.
 * Every sum is taken in a fixed order (per lane, then per warp in warp
 * order), so a replay is bit-identical to an eager run. The rounding points
 * are those of the chain of kernels (bf16 qkv, fp32 projections added to
 * the fp32 residual, fp32 SwiGLU input and bf16 output, fp32 logits; with
 * e4m3 weights every layer product's x is f16 instead of bf16 in both, the
 * f16 mma's operand: fp8.cuh); only the order of some fp32 sums differs.
 *
 * The code, by concern: layout.cuh (constants, arguments, shared memory,
 * workspace), sync.cuh (tagged words, mbarriers, bulk copies), pick.cuh
 * (the greedy pick), trace.cuh (the trace build), ring.cuh (the schedule
 * and the producer), phases.cuh (staging x, the matrix phases), barrier.cuh
 * (grid barriers), attention.cuh, kernel.cuh (the kernel itself); this file
 * instantiates and launches it, plan.cu plans a launch on the host.
 *
 * Requirements (rp_decode_step_check): head_dim 64 or 128, GQA group 1/2/4/8 (5/6 at 128),
 * hidden, q and intermediate sizes multiples of 256, hidden <= 8192, row
 * counts multiples of 8. Anything else runs the chain of kernels. */
/* in the order the kernel's pieces build on each other */
#include "layout.cuh"
#include "sync.cuh"
#include "pick.cuh"
#include "trace.cuh"
#include "ring.cuh"
#include "phases.cuh"
#include "barrier.cuh"
#include "attention.cuh"
#include "kernel.cuh"
#include "plan.h"

/* ---- host side: instantiation and launch ---------------------------------- */

extern "C" const char *const rp_decode_step_trace_names[RP_DECODE_STEP_TRACE_SLOTS] = {
    "wait for weights", "producer waits for a stage", "grid barriers", "attention", " .. loads, q/k norm, RoPE",
    " .. scores and values", " .. partials out", " .. merge (merging blocks)", "staging x",
    "matrix phases (incl. waits)", "total", "ring pieces"};

typedef void (*ds_kernel_fn)(const ds_args);

/* GQA groups 1, 2, 4, 8 at both head sizes; 5 and 6 (Qwen2.5-14B/32B,
 * 1.5B) at 128. Groups of 7 (Qwen2.5-0.5B, 7B) are not built: their
 * attention scratch (8 warps x 7 heads x 128 floats) does not fit beside the
 * ring. */
#define DS_KERNELS_128T(NB, D, P, W, T)                                                                                \
    {decode_step_kernel<1, 128, NB, D, P, W, T>, decode_step_kernel<2, 128, NB, D, P, W, T>,                           \
     decode_step_kernel<4, 128, NB, D, P, W, T>, decode_step_kernel<8, 128, NB, D, P, W, T>,                           \
     decode_step_kernel<5, 128, NB, D, P, W, T>, decode_step_kernel<6, 128, NB, D, P, W, T>}
#define DS_KERNELS_128(NB, D, P, W) DS_KERNELS_128T(NB, D, P, W, false)
#define DS_KERNELS(NB, D, P)                                                                                           \
    {{decode_step_kernel<1, 64, NB, D, P, false, false>, decode_step_kernel<2, 64, NB, D, P, false, false>,            \
      decode_step_kernel<4, 64, NB, D, P, false, false>, decode_step_kernel<8, 64, NB, D, P, false, false>, nullptr,   \
      nullptr},                                                                                                        \
     DS_KERNELS_128(NB, D, P, false)}

/* The kernel for a GQA group, head size and sequence count, its dynamic
 * shared memory limit raised to smem (once per kernel and size). dyn: one
 * sequence on a shape with dynamic units (ds_args.poll_ns, apace_ns); pick:
 * one sequence with the greedy pick (PK); w8: e4m3 layer matrices
 * (--quantization fp8), built at head size 128 only (every shape fp8 is
 * used with here; 64 would add 36 kernels to the build). Each is a kernel
 * of its own so that the others carry none of its code: switched off but
 * compiled in, it costs the others 0.3-2% through code layout alone (the
 * tensor-parallel sums too: 1-3% as run-time branches, bench/RESULTS.md).
 * tp: one sequence, the sums over the ranks inside (rp_decode_step_tp),
 * built at head size 128, with and without the pick. */
static ds_kernel_fn kernel_for(int G, int HD, int nb, bool dyn, bool pick, bool w8, bool tp, size_t smem,
                               cudaError_t *e) {
    static const ds_kernel_fn fns[6][2][6] = {DS_KERNELS(1, false, false), DS_KERNELS(2, false, false),
                                              DS_KERNELS(4, false, false), DS_KERNELS(1, true, false),
                                              DS_KERNELS(1, false, true),  DS_KERNELS(1, true, true)};
    static const ds_kernel_fn fns8[6][6] = {
        DS_KERNELS_128(1, false, false, true), DS_KERNELS_128(2, false, false, true),
        DS_KERNELS_128(4, false, false, true), DS_KERNELS_128(1, true, false, true),
        DS_KERNELS_128(1, false, true, true),  DS_KERNELS_128(1, true, true, true)};
    static const ds_kernel_fn fnstp[2][2][2][6] = {
        {{DS_KERNELS_128T(1, false, false, false, true), DS_KERNELS_128T(1, false, false, true, true)},
         {DS_KERNELS_128T(1, true, false, false, true), DS_KERNELS_128T(1, true, false, true, true)}},
        {{DS_KERNELS_128T(1, false, true, false, true), DS_KERNELS_128T(1, false, true, true, true)},
         {DS_KERNELS_128T(1, true, true, false, true), DS_KERNELS_128T(1, true, true, true, true)}}};
    /* the shared-memory opt-in each kernel was given, per device: an
     * attribute holds for the current device only, and tensor-parallel ranks
     * launch the same kernels on theirs (common.cuh, rp_first_on_device).
     * Recorded per process, a rank would skip its own device's opt-in and
     * find the kernel unfit there while the others run it (a rank of the
     * chain against ranks in the kernel: they never meet). */
    static size_t set_for[32][2][6][2][6], set_for_tp[32][2][2][2][6];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    dev &= 31;
    const int v = nb == 1 ? (pick ? (dyn ? 5 : 4) : dyn ? 3 : 0) : nb == 2 ? 1 : 2, h = HD == 128;
    const int g = G == 1 ? 0 : G == 2 ? 1 : G == 4 ? 2 : G == 8 ? 3 : G - 1; /* 5, 6 -> 4, 5 */
    *e = cudaSuccess;
    const ds_kernel_fn fn = tp ? (h && nb == 1 ? fnstp[pick][dyn][w8][g] : nullptr)
                            : w8 ? (h ? fns8[v][g] : nullptr)
                                 : fns[v][h][g];
    if (!fn) {
        *e = cudaErrorInvalidValue;
        return nullptr;
    }
    size_t *set = tp ? &set_for_tp[dev][pick][dyn][w8][g] : &set_for[dev][w8][v][h][g];
    if (__atomic_load_n(set, __ATOMIC_RELAXED) != smem) {
        *e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (*e != cudaSuccess) return nullptr;
        __atomic_store_n(set, smem, __ATOMIC_RELAXED);
    }
    return fn;
}
#undef DS_KERNELS
#undef DS_KERNELS_128
#undef DS_KERNELS_128T

extern "C" const char *rp_decode_step_check_device(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb,
                                                   int num_sms) {
    const char *why = rp_decode_step_check(s);
    if (why) return why;
    if (nb < 1 || nb > 4) return "more than 4 sequences";
    if (s->tp.n && nb > 1) return "tensor parallelism (the kernel's sums over the ranks take one sequence)";
    if (s->tp.n > RP_DECODE_STEP_TP_MAX || (s->tp.n && (!s->tp.abort || s->tp.rank < 0 || s->tp.rank >= s->tp.n)))
        return "a tensor-parallel group the kernel cannot take";
    if (s->tp.n && s->hd != 128) return "tensor parallelism at head size 64 (its kernels are built for 128)";
    if (s->fp8 && s->hd != 128) return "e4m3 weights at head size 64 (the fp8 kernels are built for 128)";
    if (nb > 1 && s->H > ds_max_h_nb(ds_nb_kernel(nb)))
        return nb > 2 ? "hidden size above 2048 (3-4 sequences)" : "hidden size above 4096 (2 sequences)";
    ds_args a;
    size_t smem;
    int dev = 0, coop = 0, per_sm = 0;
    if (ds_make_args(s, t, nb, num_sms, &a, &smem)) return "not enough shared memory per block";
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess || !coop)
        return "the device cannot launch cooperative kernels";
    cudaError_t e;
    ds_kernel_fn fn =
        kernel_for(s->nh / s->nkv, s->hd, ds_nb_kernel(nb), a.poll_ns > 0 || a.apace_ns > 0, false, s->fp8 != 0,
                   s->tp.n > 0, smem, &e);
    if (!fn || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, DS_THREADS, smem) != cudaSuccess ||
        per_sm < 1) {
        cudaGetLastError();
        return "a block per SM does not fit";
    }
    return NULL;
}

/* One sequence (the kernel with the pick is built for one only), no trace
 * (the trace build's steps leave the pick to the sampling kernels: the
 * trace counts five grid barriers a layer and none after lm_head), the
 * workspace holds every block's pick, and a block's slice of the vocabulary
 * fits pick_slice's registers. */
extern "C" int rp_decode_step_pick_ok(const rp_decode_step *s, int nb, int num_sms) {
    return nb == 1 && !s->trace && (!s->tp.n || s->tp.pick[s->tp.rank]) && num_sms >= 1 &&
           num_sms <= DS_PICK_MAX_GRID && !rp_decode_step_check(s) &&
           (s->V + num_sms - 1) / num_sms <= DS_PICK_PER_THREAD * DS_CONSUMERS * 32;
}

extern "C" int rp_k_decode_step(const rp_decode_step *s, const rp_decode_step_tuning *t, int nb, int num_sms,
                                int greedy, cudaStream_t stream) {
    ds_args a;
    size_t smem;
    if (rp_decode_step_check(s) || num_sms <= 0 || nb < 1 || nb > 4 || (s->tp.n && nb > 1) ||
        ds_make_args(s, t, nb, num_sms, &a, &smem) ||
        (greedy && (!s->pick_tokens || !s->pick_logprobs || !s->pick_slot || !s->pick_host[0] || !s->pick_host[1] ||
                    !rp_decode_step_pick_ok(s, nb, num_sms))))
        return (int)cudaErrorInvalidValue;
    cudaError_t e;
    ds_kernel_fn fn =
        kernel_for(s->nh / s->nkv, s->hd, ds_nb_kernel(nb), a.poll_ns > 0 || a.apace_ns > 0, greedy != 0,
                   s->fp8 != 0, s->tp.n > 0, smem, &e);
    if (!fn) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(a.grid);
    cfg.blockDim = dim3(DS_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    /* every block must be resident at once (grid barriers): one block an
     * SM, which check_device's occupancy makes sure of and the cooperative
     * launch also promises. Not under tensor parallelism: there an eager
     * cooperative launch hung roughly every other test run, both ranks'
     * host threads inside the launch while one GPU's kernel waited for the
     * other's (the driver holding one rank's thread until its GPU could
     * take the grid, by the debugger's stacks); without the attribute, every
     * run passed (bench/RESULTS.md, issue 42). */
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = s->tp.n ? 0 : 1;
    e = cudaLaunchKernelEx(&cfg, fn, a);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return (int)e;
    }
    return rp_launch_result();
}
