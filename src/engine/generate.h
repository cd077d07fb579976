/* Runs a fixed set of requests to completion on one backend: the
 * foundation's generation loop, used by `replay generate` and the tests
 * until the continuous-batching scheduler (src/sched) takes over.
 *
 * Every step packs prefill chunks and decode tokens of all unfinished
 * requests into one batch (up to the backend's token budget), so prompts of
 * different lengths are prefilled together and decode is batched. */
#ifndef RP_ENGINE_GENERATE_H
#define RP_ENGINE_GENERATE_H

#include <stdint.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "kv/page_table.h"

typedef enum rp_finish_reason { RP_FINISH_NONE = 0, RP_FINISH_STOP, RP_FINISH_LENGTH } rp_finish_reason;

typedef struct rp_gen_request {
    const int32_t *prompt;
    int num_prompt;
    int max_tokens;
    int ignore_eos;
    const int32_t *stop_ids; /* extra ids that end the request (chat turn ends), with the model's EOS */
    int num_stop_ids;
    rp_sampling_params sampling;
    float *prompt_logits; /* optional [num_prompt][vocab]: logits at every prompt position */
    /* results */
    int32_t *output; /* [max_tokens], caller-owned */
    int num_output;
    rp_finish_reason finish;
} rp_gen_request;

typedef struct rp_gen_stats {
    int prompt_tokens, generated_tokens;
    double prefill_s; /* until every prompt is consumed (the first token of each is sampled) */
    double decode_s;  /* the rest */
    int steps;
} rp_gen_stats;

/* Called for each sampled token as soon as it exists (streaming). */
typedef void (*rp_gen_token_fn)(void *ctx, int request, int32_t token);

int rp_generate(rp_backend *backend, rp_page_table *table, rp_gen_request *reqs, int num_reqs,
                rp_gen_token_fn on_token, void *ctx, rp_gen_stats *stats, rp_err *err);

const char *rp_finish_reason_name(rp_finish_reason r);

#endif
