/* The one-kernel decode step's constants, its argument block (ds_args), the
 * shared-memory layout (ds_plan) and the device workspace (ds_ws): what the
 * host planning (plan.cu) and the kernel (decode_step.cu) both use. */
#ifndef RP_DECODE_STEP_LAYOUT_CUH
#define RP_DECODE_STEP_LAYOUT_CUH

#include "../common.cuh"

#define DS_CONSUMERS 8
/* Two consumer warpgroups and a producer warpgroup, of which one thread
 * works. With nine warps ptxas caps a thread at 168 registers (a quarter
 * of the register file holds three of them) and the consumers spill; with
 * whole warpgroups the producer warpgroup hands its registers to the
 * consumers (setmaxnreg). The block keeps the registers it was launched
 * with (168 x 384), so the two counts must fit in those: a consumer's
 * setmaxnreg.inc waits for registers nobody gives back (80 producer
 * registers hung). 72 measured the same as 64. */
#define DS_THREADS ((DS_CONSUMERS + 4) * 32)
#define DS_CONSUMER_REGS 216
#define DS_PRODUCER_REGS 64
#define DS_LAUNCH_REGS (65536 / DS_THREADS / 8 * 8)
static_assert(DS_CONSUMER_REGS * DS_CONSUMERS * 32 + DS_PRODUCER_REGS * 128 <= DS_LAUNCH_REGS * DS_THREADS,
              "setmaxnreg counts exceed the block's registers");
#define DS_KC 1536            /* the widest ring piece: 8 rows x 1536 k (ds_args.kc) */
/* A piece's rows are 64 bytes apart in bank terms (3072 + 64), so the mma
 * B-fragment loads (4 threads x 16 bytes of rows g and g + 1 per phase) hit
 * disjoint banks. */
#define DS_ROW_STRIDE (DS_KC * 2 + 64)
#define DS_STAGE (8 * DS_ROW_STRIDE) /* bytes per ring stage */
#define DS_SEG 256            /* widths must be multiples of this */
#define DS_ROWS 8             /* rows per unit (per run) */
#define DS_HD 128
#define DS_MAX_SPLITS 32
/* Ring stages: a multiple of the consumer warps, so that a stage is always
 * used by the same warp (piece i: stage i % 8, warp i % 8). A warp then
 * waits on a stage's mbarrier at most one phase ahead, which the parity
 * wait requires. */
#define DS_STAGES 8
#define DS_MAX_STAGES 16
#define DS_MAX_H 8192               /* stage_norm keeps the row in registers */
#define DS_MAX_PHASES (4 * 128 + 1) /* 128 layers */
#define DS_PICK_MAX_GRID 256 /* blocks whose pick partials the workspace holds (pick_finish: 8 a lane) */

struct ds_args {
    rp_decode_step s;
    int grid, splits, stages, kmax;
    int kc;          /* k per ring piece: a multiple of 256, at most DS_KC (make_args) */
    int prefetch;    /* static pieces the producer may prefetch into L2 while it waits */
    int prefetch_now; /* of those, issued at once when it starts to wait (produce) */
    int keep_res;     /* the residual row stays in shared memory for the o and down epilogues */
    int dyn_eighths; /* eighths of a large phase's units taken dynamically */
    /* The kernel for one sequence on shapes with dynamic units (DYNK): past
     * its static pieces a consumer polls for a phase's end every poll_ns
     * (gemv_phase), and while the consumers are at a grid barrier or in
     * attention the producer waits apace_ns between pieces (produce; with
     * apace_all 0 only from the qkv phase's end to the release after
     * attention). */
    int poll_ns, apace_ns, apace_all;
    int norm_pf; /* prefetch the next norms' weights into L2 (prefetch_norms) */
    int tail_hold; /* a block that took one of a phase's last tail_hold units issues no more until it arrives */
    /* Several sequences (NB > 1): how many (nb <= NB; the rest of the
     * kernel's rows are left alone, so that 3 sequences get the same
     * arithmetic alone as padded to 4), the ring's geometry for kc, and x's
     * row stride in elements. One sequence uses the constants. */
    int nb, row_stride, stage_bytes, xstride;
};

/* A stage's rows 2 kc + 64 bytes apart (see DS_ROW_STRIDE); x rows kmax +
 * 32 elements apart, so that the matrix loop's x loads for two sequences
 * (64 bytes each) fall on the two halves of the banks. */
__host__ __device__ static inline int ds_row_stride(int kc) { return kc * 2 + 64; }
__host__ __device__ static inline int ds_xstride(int kmax, int nb) { return nb == 1 ? kmax : kmax + 32; }

/* Shared memory: mbarriers, the ring, one region used either as x (bf16,
 * kmax) or as attention scratch, the per-piece partial sums and per-unit
 * counters, the pieces' info, the phase ends, a reduction scratch and
 * (res floats, where it fits) the residual row (stage_norm). */
struct ds_layout {
    size_t ring, xs, attn, part, ucnt, info, pend, red, rs, total;
};

/* What the producer tells the consumers about ring piece i (in info[i %
 * stages]): its unit, the unit's first piece and its number in the block's
 * unit sequence. */
struct ds_info {
    int unit, first, useq, pad;
};

/* Per-piece partial sums in flight: a unit's P pieces plus what the other
 * warps can take meanwhile (< 8 + stages) must fit, so P <= 16. */
#define DS_PART_SLOTS 32

__host__ __device__ static inline size_t ds_attn_bytes(int G) {
    /* q [G][128], new k and v [128], per-warp m and l [8][G], per-warp
     * output [8][G][128], a flag */
    return ((size_t)G * DS_HD + 2 * DS_HD + 2 * 8 * (size_t)G + 8 * (size_t)G * DS_HD) * 4 + 16;
}

/* nb sequences: x, the partial sums and the kept residual rows per
 * sequence; stage_bytes: the ring's stage (DS_STAGE for one sequence). */
__host__ __device__ static inline ds_layout ds_plan(int stages, int kmax, int G, int phases, int res, int nb = 1,
                                                    int stage_bytes = DS_STAGE) {
    ds_layout L;
    L.ring = 256; /* 2 * DS_MAX_STAGES mbarriers */
    L.xs = L.ring + (size_t)stages * stage_bytes;
    L.attn = L.xs; /* x and the attention scratch are never live together */
    size_t x_bytes = ((size_t)nb * ds_xstride(kmax, nb) * 2 + 127) / 128 * 128,
           a_bytes = (ds_attn_bytes(G) + 127) / 128 * 128;
    L.part = L.xs + (x_bytes > a_bytes ? x_bytes : a_bytes);
    L.ucnt = L.part + (size_t)DS_PART_SLOTS * DS_ROWS * 4 * nb;
    L.info = L.ucnt + (size_t)DS_PART_SLOTS * 4;
    L.pend = L.info + (size_t)stages * sizeof(ds_info);
    L.red = (L.pend + (size_t)phases * 4 + 15) / 16 * 16;
    L.rs = L.red + 64 * 4;
    L.total = L.rs + (size_t)res * nb * 4;
    return L;
}

/* Workspace (device memory, zeroed once at startup; every counter but the
 * launch count is back at 0 when a launch ends): the attention items'
 * partial results as tagged words (ll_store), the grid barrier's counter,
 * the exit counter that resets it, the launch count that tags the words,
 * and the dynamic-unit counters. */
struct ds_ws {
    unsigned long long *o;  /* [nkv * splits][G][128]: unnormalised outputs */
    unsigned long long *ml; /* [nkv * splits][G][2]: running max, sum */
    unsigned *sync, *exitc, *launch;
    unsigned *claim; /* [DS_MAX_PHASES]: dynamic units taken per phase */
    /* the greedy pick (decode_step_kernel's PK): each block's (max, sum, key) of
     * its slice of each sequence's logits (pick_slice, pick_finish) */
    float4 *pick; /* [DS_PICK_MAX_GRID][4] */
};

__host__ __device__ static inline ds_ws ds_ws_at(void *base, int nh) {
    ds_ws w;
    uint8_t *p = (uint8_t *)base;
    w.o = (unsigned long long *)p;
    p += (size_t)nh * DS_MAX_SPLITS * DS_HD * 8;
    w.ml = (unsigned long long *)p;
    p += (size_t)nh * DS_MAX_SPLITS * 2 * 8;
    w.sync = (unsigned *)p;
    w.exitc = w.sync + 4;
    w.launch = w.sync + 5;
    w.claim = w.sync + 8;
    p = (uint8_t *)(w.claim + DS_MAX_PHASES);
    p = (uint8_t *)(((uintptr_t)p + 15) & ~(uintptr_t)15);
    w.pick = (float4 *)p;
    return w;
}

#endif
