/* Limits shared by the public API and the layers below it, defined once. */
#ifndef REPLAY_LIMITS_H
#define REPLAY_LIMITS_H

/* Most alternatives one token can report with its logprob (vLLM's limit):
 * rp_request_params.top_logprobs and the device sampler's rows. */
#define RP_MAX_TOP_LOGPROBS 20

/* Most entries of one request's logit bias (rp_request_params.logit_bias_*):
 * OpenAI documents no limit; 1024 keeps a request's bias small next to its
 * tokens and is far more than the ban lists clients send. */
#define RP_MAX_LOGIT_BIAS 1024

#endif
