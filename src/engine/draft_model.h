/* The draft model for speculative decoding (`--speculative-model DIR`,
 * docs/speculative.md): a smaller model with the target's vocabulary that
 * proposes each round's drafts by decoding greedily k tokens ahead.
 *
 * It is a runner of its own (model, backend, KV pool, page table: one more
 * model on the device), sized beside the target's: its pool holds as many
 * tokens as the target's, and the target's pool leaves it the room
 * (rp_draft_model_memory). Each request that drafts keeps a row in the
 * draft's page table (request.h's draft_row) and the count of its tokens
 * whose K/V the draft holds (draft_cached). A round feeds the draft what it
 * has not seen yet (the whole prompt the first time, in chunks; afterwards
 * the token the target emitted, and the last kept draft when every draft was
 * kept), samples d_1 greedily from the last position, then feeds d_1 .. d_k-1
 * one step each: k forwards for every drafting request together, the first
 * a catch-up of any length, the others decode steps that replay the draft
 * backend's graphs. After verification the K/V of rejected drafts stay in
 * the draft's pages to be overwritten, as in the target's: draft_cached drops
 * to the target's kept length (rp_draft_model_rollback).
 *
 * Greedy drafts are point masses: the engine's verification (draft.h) keeps
 * a draft with probability p(d), which is exact for every sampling setting;
 * drafting by sampling from the draft's own distribution would need
 * speculative.h's rejection rule instead, and raises acceptance only when
 * the target samples. */
#ifndef RP_ENGINE_DRAFT_MODEL_H
#define RP_ENGINE_DRAFT_MODEL_H

#include "engine/runner.h"
#include "sched/request.h"

typedef struct rp_draft_model rp_draft_model;

typedef struct rp_draft_model_config {
    /* exactly one of a directory (with load_dummy: its config with random
     * weights, seeded weight_seed) or a dummy shape's name */
    const char *model_dir;
    const char *dummy_name;
    int load_dummy;
    uint64_t weight_seed;
    /* the target's: the draft runs where it runs, with its page size */
    const char *device;
    int threads;
    int page_size;
    int max_context;
    /* the most requests one round drafts for, and the tokens a catch-up
     * step takes */
    int max_seqs;
    int max_batched_tokens;
    int max_rows; /* page-table rows: requests holding draft K/V at once */
    int disable_cuda_graph;
} rp_draft_model_config;

/* Loads the draft model's weights (mapped or made lazily, nothing on the
 * device yet), after checking its tokenizer against the target's where both
 * directories have one: a different one is refused with what differs. */
rp_model *rp_draft_model_load(const rp_draft_model_config *cfg, const char *target_tokenizer_dir, rp_err *err);

/* What the target's KV pool must leave for the draft (runner.h's
 * reserve_bytes and shadow_page_bytes): its weights and working buffers at
 * once, and its K/V page for each of the target's pages. */
void rp_draft_model_memory(const rp_model *draft, const rp_draft_model_config *cfg, size_t *reserve_bytes,
                           size_t *shadow_page_bytes);

/* The draft runner on `model` (owned from here on, freed on failure too),
 * with num_pages pages (the target's). A vocabulary other than the target's
 * is refused; a draft that does not fit in memory beside the target is an
 * error saying so. */
rp_draft_model *rp_draft_model_new(rp_model *model, const rp_draft_model_config *cfg, const rp_model_config *target,
                                   int num_pages, rp_err *err);
void rp_draft_model_free(rp_draft_model *dm);

/* Drafts for n decoding requests: up to want[i] tokens after each one's
 * length into its tokens (request.h's num_draft set to how many; 0 where
 * the draft has no row or pages left for it, or the context would pass the
 * draft's). The requests' last tokens must be known (no references to
 * device rows). Non-zero when a forward failed: no drafts were set, and
 * the caller should stop using the draft model. */
int rp_draft_model_propose(rp_draft_model *dm, rp_request *const *reqs, const int *want, int n, rp_err *err);

/* After a round, the draft's K/V are valid up to the target's kept tokens
 * (r->cached): what it had past them were rejected drafts. */
void rp_draft_model_rollback(rp_request *r);

/* Gives back a finished request's row and pages. */
void rp_draft_model_release(rp_draft_model *dm, rp_request *r);

/* Forwards the draft model ran, and their time on the host clock. */
void rp_draft_model_counts(const rp_draft_model *dm, uint64_t *forwards, double *ms);

const rp_model *rp_draft_model_model(const rp_draft_model *dm);

#endif
