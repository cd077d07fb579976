/* Logit processors: what a request does to its logits before the sampler
 * (engine/sampler.c) sees them, vLLM's min_tokens and OpenAI's logit_bias.
 *
 * The bias is added to the raw logits, then, while the request has made
 * fewer than min_tokens tokens, its stop tokens (EOS unless ignore_eos, and
 * its stop ids) are set to -inf; the sampler's penalties, temperature and
 * truncation follow. The device sampler has neither, so a request that has
 * either (min_tokens only while below it) is sampled on the host
 * (engine/step.c). docs/sampling.md has the order and the logprobs. */
#ifndef RP_ENGINE_LOGIT_PROC_H
#define RP_ENGINE_LOGIT_PROC_H

#include "model/config.h"
#include "replay/engine.h"
#include "sched/request.h"
#include "util/err.h"

/* Checks p's min_tokens (0..max_tokens) and logit bias (at most
 * RP_MAX_LOGIT_BIAS entries, ids in [0, vocab), finite biases in [-100,
 * 100]); the error names the field. */
int rp_logit_proc_validate(const rp_request_params *p, int vocab_size, rp_err *err);

/* Copies p's processors into r (the bias is owned by r); -1 when memory
 * ran out. */
int rp_logit_proc_init(rp_request *r, const rp_request_params *p);

/* Whether r's output token number k (0-based) goes through a processor. */
int rp_logit_proc_active(const rp_request *r, int k);

/* Applies r's processors to logits[vocab], the row its output token number
 * k is sampled from, in place. */
void rp_logit_proc_apply(const rp_request *r, const rp_model_config *cfg, int k, float *logits);

#endif
