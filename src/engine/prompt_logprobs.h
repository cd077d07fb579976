/* Prompt logprobs (vLLM's prompt_logprobs, and OpenAI's echo with logprobs):
 * how likely the model found each prompt token, from the logits of the
 * position before it.
 *
 * A request that asks has its prompt chunks fed with logits for every
 * position (engine/step.c; the scheduler caps such chunks by the spare
 * logit rows of a step and never starts them from the prefix cache, whose
 * positions would have no logits), read back to the host, and turned into
 * rp_prompt_logprob entries here as each chunk completes. They reach the
 * caller with the request's first event (engine/output.c). Each position
 * costs one pass over the vocabulary on the engine thread (an exp per
 * token). */
#ifndef RP_ENGINE_PROMPT_LOGPROBS_H
#define RP_ENGINE_PROMPT_LOGPROBS_H

#include <stdint.h>

#include "replay/engine.h"
#include "sched/request.h"
#include "util/err.h"

/* Checks p's prompt_logprobs fields (the alternatives in
 * 0..RP_MAX_TOP_LOGPROBS); the error names prompt_logprobs. */
int rp_prompt_logprobs_validate(const rp_request_params *p, rp_err *err);

/* With p->prompt_logprobs: r->prompt_lp for r's num_prompt tokens (entry 0
 * filled: the first token has no logprob). r's prompt must be set. -1 when
 * memory ran out. */
int rp_prompt_logprobs_init(rp_request *r, const rp_request_params *p);

/* The entry of `token` under logits[vocab] (the row of the position before
 * it): log-softmax at temperature 1 (NaN counts as -inf), vLLM's rank (1 +
 * the tokens with a larger logit) and the num_top most likely tokens
 * (logit descending, ties to the lower id). */
void rp_prompt_logprob_compute(const float *logits, int vocab, int32_t token, int num_top, rp_prompt_logprob *out);

/* Records what the logits of r's positions start .. start + n - 1 (rows,
 * [n][vocab], in order) say of the prompt tokens after them, where not
 * recorded yet; start must not be past what is recorded. */
void rp_prompt_logprobs_record(rp_request *r, const float *rows, int start, int n, int vocab);

#endif
