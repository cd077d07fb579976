/* Structured output in the engine: the glue between a request's constraint
 * (rp_request_params.constraint) and src/structured/'s matcher.
 *
 * The engine builds its structured vocabulary (each id's bytes, the special
 * tokens, the end-of-generation ids) once, when the first constrained
 * request is submitted; submit compiles the constraint (the vocabulary
 * caches grammars by text) and gives the request its own matcher. A
 * constrained request is sampled on the host: before its token is drawn the
 * tokens the grammar does not allow get logit -inf, and the token drawn
 * advances the matcher. Speculative rounds skip constrained requests. */
#ifndef RP_ENGINE_CONSTRAINT_H
#define RP_ENGINE_CONSTRAINT_H

#include <stdint.h>

#include "replay/engine.h"

struct rp_request;
struct rp_smatcher;

/* On the caller's thread, at submit: the constraint compiled and a matcher
 * for one request in *out (NULL for RP_CONSTRAINT_NONE). 0, or -1 with err
 * naming the constraint's param; nothing to free then. */
int rp_engine_constraint_matcher(rp_engine *e, const rp_constraint *c, struct rp_smatcher **out, rp_error *err);

/* On the engine thread, before output token k of r is drawn from logits
 * (one row): sets the logits of the tokens the grammar does not allow to
 * -inf. Returns 0, or 1 when no token is allowed: r is then finished
 * (STOP where the output is complete, GRAMMAR where it is not). */
int rp_engine_constraint_mask(rp_engine *e, struct rp_request *r, int k, float *logits);

/* After output token k of r was drawn from the masked logits: advances the
 * matcher. Returns 0, or 1 when the grammar refused the token (a row whose
 * allowed tokens were all -inf): r is then finished with an error. */
int rp_engine_constraint_accept(rp_engine *e, struct rp_request *r, int k, int32_t tok);

/* At destroy, after every request is freed. */
void rp_engine_constraint_free(rp_engine *e);

#endif
