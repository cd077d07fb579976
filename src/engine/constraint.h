/* Structured output in the engine: the glue between a request's constraint
 * (rp_request_params.constraint) and src/structured/'s matcher.
 *
 * The engine builds its structured vocabulary (each id's bytes, the special
 * tokens, the end-of-generation ids) once, when the first constrained
 * request is submitted; submit compiles the constraint (the vocabulary
 * caches grammars by text) and gives the request its own matcher. A
 * constrained request is sampled on the host: before its token is drawn the
 * tokens the grammar does not allow get logit -inf, and the token drawn
 * advances the matcher. Where the backend samples with masks
 * (backend.h's sample_masked), the step's forward is launched first and
 * the masks are computed while it runs (rp_engine_constraint_fill_rows),
 * then sent to the backend; otherwise the logits come back and the mask is
 * applied on the host (rp_engine_constraint_apply). A speculative round's
 * drafts are cut at the first one the grammar refuses, and each position of
 * the round is masked with the matcher after the kept drafts before it
 * (draft.c; on the backend, each position's mask made after the drafts
 * before it, or on the host). */
#ifndef RP_ENGINE_CONSTRAINT_H
#define RP_ENGINE_CONSTRAINT_H

#include <stdint.h>

#include "replay/engine.h"

struct rp_request;
struct rp_smatcher;
struct rp_step;

/* On the caller's thread, at submit, once r's prompt is in place: the
 * constraint compiled, r's matcher made (none for RP_CONSTRAINT_NONE) and
 * whether r starts in its reasoning. 0, or -1 with err naming the
 * constraint's param; what it made is freed with r. */
int rp_engine_constraint_start(rp_engine *e, const rp_constraint *c, struct rp_request *r, rp_error *err);

/* On the engine thread, before r's next token is drawn from logits (one
 * row): sets the logits of the tokens the grammar does not allow to -inf
 * (none while r is reasoning).
 * Returns RP_FINISH_REASON_NONE, or, when no token is allowed, how r must
 * end: STOP where the output is complete, GRAMMAR where it is not. */
rp_finish rp_engine_constraint_apply(rp_engine *e, struct rp_request *r, float *logits);

/* On the engine thread, for a step launched with deferred sampling, once
 * the step before it has been collected (every matcher has taken the
 * tokens before this step's): for each of its sampling rows of a
 * constrained request, the matcher's mask into e->mask_rows and its index
 * into e->mask_of_row[row]; -1 for every other row of the step's
 * num_logits (unconstrained, reasoning, or a request already ending). A
 * request whose grammar allows no token ends here, at that row's output
 * index (its row is sampled unmasked and the token dropped). A speculative
 * round's position j is masked with the matcher after the round's drafts
 * 0..j-1 (taken, then given back); where nothing is allowed there,
 * e->mask_end[row] says how the request ends if the round keeps those
 * drafts (draft.c). Returns the number of masks. */
int rp_engine_constraint_fill_rows(rp_engine *e, const struct rp_step *st);

/* Ends r without a token at output index k (a slot an overlapped launch
 * reserved for it is dropped). */
void rp_engine_constraint_end(rp_engine *e, struct rp_request *r, int k, rp_finish fin, const char *error);

/* What rp_engine_constraint_end says when the token drawn from a masked
 * row is refused: every allowed token's logit was -inf. */
extern const char rp_constraint_refused_msg[];

/* The single-token path (step.c): rp_engine_constraint_apply for output
 * token k, ending r when nothing is allowed (returns 1, else 0); and after
 * the draw, the matcher advanced, r ended with an error if the grammar
 * refuses the token (returns 1, else 0). */
int rp_engine_constraint_mask(rp_engine *e, struct rp_request *r, int k, float *logits);
int rp_engine_constraint_accept(rp_engine *e, struct rp_request *r, int k, int32_t tok);

/* Advances r's matcher by tok (while reasoning, watches for its end): 0,
 * or -1 when the grammar refuses it (the matcher unchanged). */
int rp_engine_constraint_take(struct rp_request *r, int32_t tok);

/* The number of r's drafts (r->num_draft of them after its tokens) that the
 * grammar takes in a row from its current state (the reasoning's free);
 * the matcher is left as it was. */
int rp_engine_constraint_drafts(struct rp_request *r);

/* At destroy, after every request is freed. */
void rp_engine_constraint_free(rp_engine *e);

#endif
