/* When a decoding request drafts (docs/speculative.md, "Scheduling"): a
 * speculative round costs more than a plain decode step (a round of k + 1
 * positions replays the chain of kernels; llama3-8b at batch 1 on an H100
 * 6.45 ms against the one-kernel step's 5.20, bench/RESULTS.md "a round as
 * a decode batch"), so it pays off only while enough drafts are kept. Each
 * request keeps a running mean of the drafts its rounds kept; below
 * RP_SPEC_MIN_KEPT it stops drafting and probes with one round every
 * RP_SPEC_PROBE_EVERY decode steps, so a request whose drafts all fail
 * decodes within a few per cent of plain speed, and one whose text turns
 * predictable again is noticed. The engine (draft.c) and `bench decode
 * --speculative-tokens` (the oracle drafter) follow the same rule. */
#ifndef RP_ENGINE_SPEC_POLICY_H
#define RP_ENGINE_SPEC_POLICY_H

/* Break-even: a round that costs 1.24 steps must keep 0.24 drafts on
 * average; 0.3 leaves a margin for larger batches, where a round costs
 * more (1.39x at batch 32). */
#define RP_SPEC_MIN_KEPT 0.3f
/* Weight of the newest round in the running mean: about the last eight
 * rounds count. A round's kept drafts vary a lot (at A = 0.5 and k = 4 a
 * round keeps none half the time): with 0.25, four rounds that keep
 * nothing stopped a request whose drafts pay 1.5x, and a simulation of
 * 64-token runs at A = 0.5 gave 1.45x against 1.55x with 0.125, which
 * stops at A = 0 after nine rounds instead of five (0.94x against 0.96x). */
#define RP_SPEC_KEPT_WEIGHT 0.125f
/* A request below the break-even drafts again after this many plain steps
 * (its probe round costs ~0.24 steps more than a plain one: ~3% at
 * acceptance 0). */
#define RP_SPEC_PROBE_EVERY 8
/* Where a request starts: trusting its drafter for a few rounds (1.0
 * falls under the break-even after nine rounds that keep nothing). */
#define RP_SPEC_KEPT_START 1.0f

typedef struct rp_spec_track {
    float kept;  /* running mean of the drafts kept a round */
    int idle;    /* plain decode steps since its last round */
} rp_spec_track;

static inline void rp_spec_track_init(rp_spec_track *t) {
    t->kept = RP_SPEC_KEPT_START;
    t->idle = 0;
}

/* Whether the request drafts for its next step; a "no" counts a plain step. */
static inline int rp_spec_track_wants(rp_spec_track *t) {
    if (t->kept >= RP_SPEC_MIN_KEPT || t->idle >= RP_SPEC_PROBE_EVERY - 1) return 1;
    t->idle++;
    return 0;
}

/* A verified round that kept `kept` drafts. */
static inline void rp_spec_track_round(rp_spec_track *t, int kept) {
    t->kept += RP_SPEC_KEPT_WEIGHT * ((float)kept - t->kept);
    t->idle = 0;
}

#endif
