/* The CUDA backend's tuning table: every rp_tuning field left at 0 gets its
 * value here, once, at backend creation, from the model's shape and the
 * GPU (its SM count and its memory's peak bandwidth). One rule a field,
 * each with the measurement that chose it (bench/RESULTS.md has the runs;
 * docs/tuning.md the same table for readers). Explicit values are checked against their ranges. */
#include <stdint.h>

#include "backend/cuda/cuda_state.h"

/* Weight bytes each block of the one-kernel step streams per layer: the
 * shape measure most of the step's plan is chosen by (one block per SM). */
static int64_t layer_bytes_per_sm(const rp_model_config *c, int num_sms) {
    const int64_t H = c->hidden_size, F = c->intermediate_size, q_dim = (int64_t)c->num_heads * c->head_dim,
                  kv_dim = (int64_t)c->num_kv_heads * c->head_dim;
    return 2 * H * (q_dim + 2 * kv_dim + q_dim + 3 * F) / num_sms;
}

/* An explicit value (checked against [lo, hi]; RP_TUNING_NONE is 0), or
 * the default when the field is 0. */
static int pick(int set, int lo, int hi, int dflt, const char *name, int *bad, rp_err *err) {
    if (set == 0) return dflt;
    if (set == RP_TUNING_NONE && lo == 0) return 0;
    if (set < (lo ? lo : 1) || set > hi) {
        if (!*bad) rp_errf(err, "tuning: %s = %d is outside %d..%d%s", name, set, lo ? lo : 1, hi,
                           lo == 0 ? " (or -1 for none)" : "");
        *bad = 1;
        return dflt;
    }
    return set;
}

int rp_cuda_tuning_resolve(const rp_tuning *t, const rp_model_config *c, int num_sms, double hbm_peak_gbs,
                           rp_decode_step_tuning *out, rp_err *err) {
    const int64_t lb = layer_bytes_per_sm(c, num_sms);
    const int F = c->intermediate_size;
    int bad = 0;
    /* k per ring piece. Where every unit of a phase is cut in advance
     * (under 1 MiB per block per layer: no dynamic tail), a block's phase
     * ends with its last piece, so an uneven split costs: on the smallest
     * shapes (under 256 KiB: qwen3-0.6b) most blocks hold one unit of the o
     * and down phases, which 1024 splits evenly (qwen3-0.6b 1.044 -> 0.97
     * ms); on the 1B-class ones 1024 pays where it splits the intermediate
     * size evenly and 1536 does not (llama3.2-1b's 8192: 1.204 -> 1.190;
     * qwen3-1.7b's 6144 = 4 x 1536 is slower at 1024). Elsewhere 1024 only
     * adds pieces (qwen3-4b 3.53 -> 3.92, llama3-8b 5.69 -> 5.72). */
    const int narrow = lb < (256 << 10) || (lb < (1 << 20) && F % 1536 && F % 1024 == 0);
    out->kc = pick(t->decode_step_kc, 256, 1536, narrow ? 1024 : 1536, "decode_step_kc", &bad, err);
    if (t->decode_step_kc % 256) {
        if (!bad) rp_errf(err, "tuning: decode_step_kc = %d is not a multiple of 256", t->decode_step_kc);
        bad = 1;
    }
    /* How far ahead of the ring the producer may prefetch into L2: 8 pieces
     * on the smallest shapes (qwen3-0.6b 0.861 -> 0.850 ms against 4; 12
     * and 16 the same as 8), 4 elsewhere (8 or 16 the same there; none is
     * 1.4-2.3% slower on the 4B and 8B shapes). */
    out->prefetch = pick(t->decode_step_prefetch, 0, 64, lb < (256 << 10) ? 8 : 4, "decode_step_prefetch", &bad, err);
    /* Pieces prefetched at once when a wait starts: 4 on the smallest
     * shapes (qwen3-0.6b 0.948 -> 0.931 ms), where a block's ring holds half
     * a layer and HBM has little else to do in a stall; one on the 4B class
     * (1-2 MiB per block per layer: qwen3-4b 3.046 -> 3.023 ms, 2 the same,
     * 3 +0.3%); none elsewhere (llama3.2-1b +2%, the 8B shapes +1-4% at 2:
     * the extra requests compete with the rings' own). */
    out->prefetch_now = pick(t->decode_step_prefetch_now, 0, 64,
                             lb < (256 << 10) ? 4 : lb >= (1 << 20) && lb < (2 << 20) ? 1 : 0,
                             "decode_step_prefetch_now", &bad, err);
    /* How much of a large phase to leave to the counter: blocks drift apart
     * in proportion to the bytes each streams per phase, so the 8B shapes
     * (~3 MiB per block per layer) settle best with 7/8 dynamic (llama3-8b
     * 5.73 -> 5.69 ms against 6/8; all of it is worse again), qwen3-4b (1.5
     * MiB) with 6/8 (3.497 -> 3.480 against 7/8). On the 1B-class shapes a
     * claim's round trip weighs more than the drift it evens out, so
     * nothing is dynamic (qwen3-0.6b 0.99 -> 0.945 ms, llama3.2-1b 1.228
     * -> 1.195 against 1/4; the 4B and 8B shapes lose 3-6% that way). */
    out->dyn_eighths = pick(t->decode_step_dyn_eighths, 0, 8, lb >= (2 << 20) ? 7 : lb >= (1 << 20) ? 6 : 0,
                            "decode_step_dyn_eighths", &bad, err);
    /* The producer's pause between pieces while its consumers are at a
     * barrier or in attention, on shapes with dynamic units, on an H100
     * (HBM3, 3.35 TB/s peak): 500 ns, qwen3-4b 3.29 -> 3.17 ms, llama3-8b
     * 5.51 -> 5.37, qwen3-8b 5.59 -> 5.46 (400 ns about the same, 250 and
     * 700-1000 ns less). On an H200 (HBM3e, 4.9 TB/s) the ring drains
     * faster than a pause lets it refill: none, llama3-8b 4.29 -> 4.19 ms,
     * qwen3-8b 4.35 -> 4.24, qwen3-4b 2.76 -> 2.67 (100-1000 ns all
     * slower). Without dynamic units it lost 3% on qwen3-0.6b, so those
     * shapes run the kernel that has no pacing code. */
    const int paced = out->dyn_eighths > 0 && hbm_peak_gbs < 4000;
    out->pace_ns = pick(t->decode_step_pace_ns, 0, 100000, paced ? 500 : 0, "decode_step_pace_ns", &bad, err);
    /* The blocks that take the last quarter-grid of a phase's dynamic units
     * queue no copies until they reach its barrier: qwen3-4b 3.021-3.025 ->
     * 3.009-3.014 ms, llama3-8b and qwen3-8b -0.7..-0.8% (a 24 or 40 block
     * hold about the same, 48 and 64 less). */
    out->tail_hold = pick(t->decode_step_tail_hold, 0, 1 << 20, out->dyn_eighths > 0 ? num_sms / 4 : 0,
                          "decode_step_tail_hold", &bad, err);
    /* Where the chain of kernels overtakes the one-kernel step: the step's
     * attention has the blocks' share of a layer's time, which long
     * contexts outgrow, while the chain's attention splits keys over the
     * whole GPU. llama3-8b on an H100, graph ms (step / chain): one
     * sequence at 8192 tokens 6.29 / 6.95, 12288 6.86 / 7.07, 16384 7.41 /
     * 7.24, 32768 9.43 / 7.98; two at 2048 each 6.18 / 6.67, 6144 each 7.20
     * / 7.03, 32768 each 13.95 / 9.40; four at 2048 each 6.73 / 6.76, 6144
     * each 7.59 / 7.48. So one sequence up to 16384 tokens, several up to
     * half that together (the value applies to one sequence; 2-4 take half
     * of it: cuda_backend.c). */
    out->max_kv = pick(t->decode_step_max_kv, 1, 1 << 24, 16384, "decode_step_max_kv", &bad, err);
    /* How many sequences the one-kernel step takes, where the shapes allow
     * (two up to hidden 4096, three or four up to 2048: plan.cu). On an
     * H200 the 8B shapes (~3 MiB per block per layer) decode two sequences
     * faster as the chain, cuBLASLt streaming their matrices at two rows
     * (llama3-8b 5.22 -> 4.91 ms, qwen3-8b 5.32 -> 4.98, graph ms a step),
     * while the smaller ones keep the kernel (qwen3-4b 3.15 against the
     * chain's 3.39, qwen3-1.7b 1.49 against 1.74). On an H100 the kernel
     * was ahead at two sequences of llama3-8b (5.75 against the chain's
     * 6.42 at three), so it keeps them. */
    const int chain2 = lb >= (2 << 20) && hbm_peak_gbs >= 4000;
    out->max_seqs = pick(t->decode_step_max_seqs, 1, 4, chain2 ? 1 : 4, "decode_step_max_seqs", &bad, err);
    return bad ? RP_ERR : 0;
}
