/* Limits shared by the public API and the layers below it, defined once. */
#ifndef REPLAY_LIMITS_H
#define REPLAY_LIMITS_H

/* Most alternatives one token can report with its logprob (vLLM's limit):
 * rp_request_params.top_logprobs and the device sampler's rows. */
#define RP_MAX_TOP_LOGPROBS 20

#endif
