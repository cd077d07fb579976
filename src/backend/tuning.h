/* The tuning values of a backend: every choice that measurement made and
 * that a test or a benchmark may want to move, in one plain struct that
 * travels in rp_backend_config.tuning. 0 in every field means "chosen by
 * model shape and GPU" (the CUDA backend's table is
 * src/backend/cuda/tuning.c, documented in docs/tuning.md), so a
 * zero-initialised config runs the production choices. Where "none" is a
 * setting of its own (no prefetch, no pause) it is spelled RP_TUNING_NONE.
 * The CPU backend ignores all of them. */
#ifndef RP_BACKEND_TUNING_H
#define RP_BACKEND_TUNING_H

#define RP_TUNING_NONE (-1)

typedef struct rp_tuning {
    /* 1: decode always runs the chain of kernels, never the one-kernel
     * decode step (what `--disable-decode-step` sets; like vLLM's
     * --enforce-eager, for comparisons and as a way around a problem in
     * that kernel). 0: the one-kernel step for 1-4 sequences wherever the
     * model's shapes and the GPU allow it. */
    int disable_decode_step;
    /* The one-kernel decode step's plan (kernels/decode_step/plan.cu). */
    int decode_step_kc;           /* k per weight-ring piece: a multiple of 256 in [256, 1536] */
    int decode_step_prefetch;     /* static pieces the producer may prefetch into L2 while it
                                   * waits for a stage: 1-64, or RP_TUNING_NONE */
    int decode_step_prefetch_now; /* of those, issued at once when a wait starts: 1-64, or
                                   * RP_TUNING_NONE */
    int decode_step_dyn_eighths;  /* eighths of a large phase's units taken from a counter at run
                                   * time: 1-8, or RP_TUNING_NONE (every unit cut in advance) */
    int decode_step_pace_ns;      /* one sequence: the producer's pause between pieces while its
                                   * consumers are at a grid barrier or in attention: 1-100000 ns,
                                   * or RP_TUNING_NONE */
    int decode_step_tail_hold;    /* a block that took one of a phase's last N dynamic units queues
                                   * no more copies until it reaches the phase's barrier: N in
                                   * 1-1048576, or RP_TUNING_NONE */
    int decode_step_max_kv;       /* the one-kernel step while one sequence holds at most this many
                                   * K/V tokens (2-4 sequences: half of it, together); longer
                                   * batches run the chain of kernels: 1-16777216 */
    int decode_step_max_seqs;     /* the one-kernel step for at most this many sequences (1, 2 or
                                   * 4; 3 run the kernel for 4), more run the chain of kernels:
                                   * 1-4 */
} rp_tuning;

#endif
