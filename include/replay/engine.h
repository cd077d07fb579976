/* replay's engine API: the one interface the CLI and the HTTP server use.
 *
 * An engine owns a model, its tokenizer, a backend (CPU or CUDA), the paged
 * KV pool and a scheduler that runs many requests at once (continuous
 * batching, chunked prefill, preemption when the pool runs out). It runs on
 * its own thread; submit() and abort() may be called from any thread, and
 * each request's tokens arrive through its callback, on the engine thread,
 * as soon as they are sampled.
 *
 * Functions return 0 on success and -1 with an rp_error: a code the caller
 * maps (to an HTTP status, an exit code), the request parameter at fault and
 * a one-line message for people. */
#ifndef REPLAY_ENGINE_H
#define REPLAY_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_engine rp_engine;
typedef uint64_t rp_request_id;

#include "replay/limits.h"

/* What went wrong, as data: callers map the code, never the message text. */
typedef enum rp_error_code {
    RP_ERROR_NONE = 0,
    RP_ERROR_INVALID_REQUEST, /* a parameter is out of range, malformed or contradicts another */
    RP_ERROR_CONTEXT_LENGTH,  /* the prompt, or prompt plus max_tokens, does not fit the context or the KV cache */
    RP_ERROR_UNSUPPORTED,     /* valid, but this engine cannot do it (text or stop strings without a tokenizer) */
    RP_ERROR_OUT_OF_MEMORY,   /* host memory ran out: nothing was queued */
    RP_ERROR_INTERNAL,        /* replay itself failed (a backend or model error at create) */
} rp_error_code;

typedef struct rp_error {
    rp_error_code code;
    /* the rp_request_params field at fault, by its OpenAI name ("prompt",
     * "max_tokens", "stop", "temperature", "top_p", "top_k", "min_p",
     * "repetition_penalty", "presence_penalty", "frequency_penalty",
     * "top_logprobs", "seed", "min_tokens", "logit_bias", "prompt_logprobs"),
     * or "" when no single one is */
    char param[48];
    char message[512];
} rp_error;

/* "invalid_request", "context_length", ...: for logs and tests. */
const char *rp_error_code_name(rp_error_code code);

typedef struct rp_engine_config {
    /* the model: a Hugging Face directory, or a named dummy shape */
    const char *model_dir;
    const char *dummy_name;
    int load_dummy;        /* model_dir's config with random weights */
    uint64_t weight_seed;
    int quantize_fp8; /* --quantization fp8: the target's layer matrices in e4m3, per-row scales */
    const char *tokenizer_dir; /* default: model_dir */
    const char *chat_template; /* a Jinja file: overrides the model's chat template */
    const char *device;    /* "auto" (default), "cpu", "cuda" */
    int threads;           /* CPU backend */
    /* KV cache */
    int page_size;         /* tokens per page (default 16) */
    /* the KV cache's format, vLLM's --kv-cache-dtype names: NULL or "auto"
     * (the checkpoint's kv_cache_scheme, else bf16), "bf16"/"bfloat16",
     * "fp8"/"fp8_e4m3" (half the bytes a token: docs/kv-cache.md) */
    const char *kv_cache_dtype;
    int num_pages;         /* 0: sized from memory_ratio of what is free */
    double memory_ratio;   /* default 0.9 */
    int max_context;       /* per request; default: the model's max_position_embeddings */
    /* scheduling */
    /* requests in the running set; 0 (default): the KV pool's tokens / 512,
     * within [16, 1024] (sched/scheduler.h, docs/memory-model.md) */
    int max_running_requests;
    int max_batched_tokens;   /* tokens one step feeds, prompt chunks and decode tokens together */
    int chunked_prefill_size; /* a prompt is prefilled in chunks of at most this (0 = max_batched_tokens) */
    /* Where the backend's forward runs on the calling thread (CPU), the
     * prompt tokens of a step are also sized from the measured speed so that
     * a step takes about this long: a newcomer, an abort or destroy waits at
     * most about one such step. 0: the default, 500 ms; -1: off (chunks of
     * chunked_prefill_size). The CUDA backend ignores it. */
    int step_ms_target;
    /* CUDA graphs */
    int disable_cuda_graph;
    int cuda_graph_max_bs;
    int disable_decode_step; /* decode 1-4 sequences with the chain of kernels, not the one-kernel step */
    /* Tensor parallelism (docs/tensor-parallel.md): the model over this
     * many GPUs (0 or 1: one); over several nodes, nnodes > 1, this
     * node's node_rank and node 0's dist_init_addr (HOST:PORT). A node
     * other than 0 runs rp_engine_run_worker, not an engine. */
    int tensor_parallel_size;
    int nnodes, node_rank;
    const char *dist_init_addr;
    /* A step that takes longer than this, or node 0 silent this long, fails
     * the run on every rank (0: 60 s; the setup and the first step get at
     * least 300 s). */
    int dist_timeout_s;
    /* --disable-custom-all-reduce: every all-reduce of tensor parallelism
     * through NCCL (default: small ones through peer memory, one node) */
    int disable_custom_all_reduce;
    int quiet_model_warning; /* 1: do not log that dummy weights are random */
    int disable_overlap;     /* 1: wait for each step's tokens before preparing the next */
    /* 1: structured output's token masks are applied on the host, each
     * constrained step's logits read back (the path before device masks;
     * for tests and benchmarks that compare the two). 0 (default): where
     * the backend samples with masks, the masks go to it and the host
     * computes them while the forward runs (docs/structured.md). */
    int disable_device_masks;
    /* Keep the KV pages of prompts (and outputs) after their requests end,
     * and start a request whose prompt begins with cached pages from there
     * (vLLM's automatic prefix caching; on by default, 0 turns it off). */
    int enable_prefix_caching;
    /* 1: after every step, check the page accounting (pool, page table,
     * prefix cache: O(pages)) and stop the process on a broken invariant.
     * For tests. */
    int debug_check_every_step;
    /* 1: admit a request when its first chunk fits, without keeping room
     * for what the running requests will decode (docs/memory-model.md). For
     * tests that need preemption under a small pool. */
    int disable_decode_reservation;
    /* Speculative decoding (docs/speculative.md): a drafter proposes
     * num_speculative_tokens tokens for each decoding request and one
     * target pass verifies them all. Outputs are those of decoding without
     * it, token for token for a given seed (docs/sampling.md). */
    int speculative_method;     /* rp_spec_method; RP_SPEC_NONE (0): off */
    int num_speculative_tokens; /* k, 1..8 (0: 4 where a method is set) */
    int prompt_lookup_min;      /* n-gram match lengths (vLLM's names), 1..16; 0: 2 and 4 */
    int prompt_lookup_max;
    /* RP_SPEC_DRAFT_MODEL: the draft model, a directory or a dummy shape's
     * name (random weights, for benchmarks), with the target's vocabulary;
     * speculative_load_dummy: the directory's config with random weights */
    const char *speculative_model;
    const char *speculative_dummy_weights;
    int speculative_load_dummy;
} rp_engine_config;

typedef enum rp_spec_method {
    RP_SPEC_NONE = 0,
    RP_SPEC_NGRAM, /* the continuation of the latest earlier occurrence of the last n tokens (prompt lookup) */
    RP_SPEC_DRAFT_MODEL, /* a smaller model with the same vocabulary decodes k tokens ahead, greedily */
} rp_spec_method;

typedef enum rp_finish {
    RP_FINISH_REASON_NONE = 0,
    RP_FINISH_REASON_STOP,   /* EOS, a stop id or a stop string */
    RP_FINISH_REASON_LENGTH, /* max_tokens or the context limit */
    RP_FINISH_REASON_ABORT,  /* aborted by the caller */
    RP_FINISH_REASON_ERROR,  /* the engine failed; message in the event */
    /* structured output: the grammar reached a state that no token of the
     * vocabulary continues, before the output was complete (the output so
     * far is a prefix of a valid one, never a complete one) */
    RP_FINISH_REASON_GRAMMAR,
} rp_finish;

/* Structured output (docs/structured.md): what the output must be. */
typedef enum rp_constraint_kind {
    RP_CONSTRAINT_NONE = 0,
    RP_CONSTRAINT_JSON_SCHEMA, /* text: a JSON Schema document */
    RP_CONSTRAINT_JSON_OBJECT, /* any JSON object; text ignored */
    RP_CONSTRAINT_REGEX,       /* text: a regular expression the whole output matches */
    RP_CONSTRAINT_CHOICE,      /* text: a JSON array of strings; the output is one of them */
    RP_CONSTRAINT_GRAMMAR,     /* text: a GBNF grammar with a rule named root */
} rp_constraint_kind;

typedef struct rp_constraint {
    rp_constraint_kind kind;
    const char *text;
    size_t text_len;      /* 0: strlen(text) */
    /* JSON kinds: 1 allows JSON whitespace between tokens, 0 none (compact).
     * The server and the CLI ask for 1 unless told otherwise, as vLLM does. */
    int allow_whitespace;
    /* the request field it came from ("response_format", "guided_json",
     * ...), named by errors; NULL: "structured_outputs" */
    const char *param;
    /* A reasoning model's thinking is left free (vLLM's rule where a
     * reasoning parser is on): with has_reasoning_end the constraint starts
     * after the token reasoning_end_id (`</think>`), or at once where the
     * prompt holds it (a template that closed the thinking). */
    int has_reasoning_end;
    int32_t reasoning_end_id;
} rp_constraint;

/* What the callback receives: one event per sampled token, and a final one
 * (finish != NONE) that may carry a last token. text is the newly complete
 * UTF-8 text (never half a character; stop strings are cut out).
 *
 * logprob is the token's log-probability (docs/sampling.md says under which
 * distribution); with top_logprobs = N > 0 the event also carries the N most
 * likely tokens of that same distribution, most likely first (ties: lower id
 * first): top_ids[i], top_logprobs[i] for i < num_top_logprobs. A token the
 * sampler could not have drawn (cut by top-k, top-p or min-p) has -inf. */
/* One prompt token's logprob (prompt logprobs, vLLM's prompt_logprobs):
 * the log-softmax of the model's logits at the position before it, at
 * temperature 1, before any bias or penalty (what the model says of the
 * prompt, whatever the request samples with). rank: 1 + the tokens with a
 * larger logit (vLLM's rank). The first prompt token has none: rank 0,
 * logprob NaN, no alternatives. top_*: the num_top most likely tokens at
 * that position, most likely first (ties: lower id first). */
typedef struct rp_prompt_logprob {
    int32_t token;
    float logprob;
    int32_t rank;
    int32_t num_top;
    int32_t top_ids[RP_MAX_TOP_LOGPROBS];
    float top_logprobs[RP_MAX_TOP_LOGPROBS];
} rp_prompt_logprob;

typedef struct rp_token_event {
    rp_request_id id;
    int32_t token;   /* -1 when the event carries no token */
    float logprob;
    int num_top_logprobs;
    int32_t top_ids[RP_MAX_TOP_LOGPROBS];
    float top_logprobs[RP_MAX_TOP_LOGPROBS];
    const char *text;
    size_t text_len;
    rp_finish finish;
    const char *error; /* with RP_FINISH_REASON_ERROR */
    int prompt_tokens, completion_tokens;
    /* of prompt_tokens, those whose K/V the prefix cache held when the
     * request was admitted (OpenAI's usage.prompt_tokens_details.
     * cached_tokens): whole pages, never the last prompt token */
    int cached_tokens;
    /* times the request has been preempted so far: its KV cache dropped when
     * the pool ran out and recomputed later, its tokens unchanged. The final
     * event carries the total. */
    int preemptions;
    /* with rp_request_params.prompt_logprobs: the prompt's logprobs
     * ([prompt_tokens], entry i for prompt token i), on the request's first
     * event only (a final event without a token when it ends before one);
     * valid during the callback. NULL otherwise. */
    const rp_prompt_logprob *prompt_logprobs;
} rp_token_event;

typedef void (*rp_token_callback)(void *user, const rp_token_event *ev);

typedef struct rp_request_params {
    const char *prompt;         /* text (tokenized with the model's tokenizer), or */
    const int32_t *prompt_ids;  /* token ids */
    int num_prompt_ids;
    int max_tokens;             /* default 16 when 0 and max_tokens_set is 0 */
    int ignore_eos;
    /* the output's text (vLLM's meanings): include_stop_str_in_output keeps
     * the stop string that ended it (and a stop token's text) in the text;
     * keep_special_tokens writes special tokens' text (vLLM's
     * skip_special_tokens = false) */
    int include_stop_str_in_output, keep_special_tokens;
    /* sampling, vLLM's meanings */
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed;
    int has_seed;
    const char *const *stop;    /* stop strings */
    int num_stop;
    const int32_t *stop_ids;    /* extra stop token ids */
    int num_stop_ids;
    int logprobs;               /* fill rp_token_event.logprob */
    int top_logprobs;           /* 0..RP_MAX_TOP_LOGPROBS: fill rp_token_event.top_* with that many */
    /* vLLM's min_tokens: the first min_tokens output tokens are never EOS
     * (unless ignore_eos, where EOS is no stop) nor a stop id (their logits
     * are -inf), and no stop string ends the output inside them. 0: off;
     * at most max_tokens. */
    int min_tokens;
    /* OpenAI's logit_bias: bias[i] (in [-100, 100]) is added to the logit of
     * token logit_bias_ids[i] before sampling (and before the penalties);
     * at most RP_MAX_LOGIT_BIAS entries, ids in the vocabulary. A repeated
     * id adds up. docs/sampling.md. */
    const int32_t *logit_bias_ids;
    const float *logit_bias;
    int num_logit_bias;
    /* vLLM's prompt_logprobs: 1 to compute the prompt tokens' logprobs
     * (rp_prompt_logprob) with prompt_top_logprobs (0..RP_MAX_TOP_LOGPROBS)
     * alternatives each. The prompt is then computed whole, not taken
     * from the prefix cache. */
    int prompt_logprobs;
    int prompt_top_logprobs;
    /* structured output (kind RP_CONSTRAINT_NONE: none): compiled at submit,
     * where a bad constraint is an RP_ERROR_INVALID_REQUEST naming
     * constraint.param; the text need not outlive the submit */
    rp_constraint constraint;
} rp_request_params;

/* Whether a constraint compiles (schema keywords, regex syntax, grammar
 * rules, limits), without an engine: the same check submit makes, against
 * a byte-level vocabulary, so a command can refuse a bad one before it
 * loads a model. 0, or -1 with err (code, param, message). */
int rp_constraint_validate(const rp_constraint *c, rp_error *err);

/* The defaults, defined once (src/engine/engine.c): 256 running requests,
 * 16,384 batched tokens, chunks of 8,192 (on the CPU, also steps of about
 * 500 ms: step_ms_target), pages of 16 tokens, 90% of free device memory
 * for the KV cache, prefix caching on. Commands print these in their help. */
void rp_engine_config_default(rp_engine_config *cfg);
void rp_request_params_default(rp_request_params *p);

rp_engine *rp_engine_create(const rp_engine_config *cfg, rp_error *err);
/* A node other than 0 of a multi-node tensor-parallel run (cfg->node_rank >
 * 0): builds the backend rp_engine_create builds from the same config (so
 * that its ranks capture the same graphs as node 0's), then runs the steps
 * node 0's engine sends until node 0 stops (0) or its link breaks (an
 * error). No tokenizer, scheduler or requests here. */
int rp_engine_run_worker(const rp_engine_config *cfg, rp_error *err);
/* Stops the engine thread at the end of the step in flight (one prompt chunk
 * at most); requests still running finish with ABORT. */
void rp_engine_destroy(rp_engine *e);

/* Validates and queues a request. A prompt longer than the context, one that
 * needs more KV pages than the whole pool, or invalid sampling values are
 * rejected here, never queued. */
int rp_engine_submit(rp_engine *e, const rp_request_params *p, rp_token_callback cb, void *user,
                     rp_request_id *id_out, rp_error *err);
/* Ends a request wherever it is (waiting, prefilling, decoding) when the step
 * in flight ends (a long prompt's prefill stops at its next chunk boundary);
 * its pages are freed then and its callback gets a final ABORT event. Returns
 * -1 if the id is unknown or already finished. */
int rp_engine_abort(rp_engine *e, rp_request_id id);

/* A snapshot, taken when a step is planned and when it ends: a request in
 * the middle of its prefill counts as running, its pages as used. */
/* Steps of one kind (rp_engine_stats.kinds): decode only (every sequence
 * one generated token), mixed (prompt chunks and decodes), prefill only. */
enum { RP_STEP_DECODE, RP_STEP_MIXED, RP_STEP_PREFILL, RP_STEP_KINDS };
typedef struct rp_step_kind_stats {
    uint64_t steps, graph_replays, tokens, prompt_tokens;
    double gpu_ms; /* the forwards' device time, from the backend (0 where it has no clock) */
} rp_step_kind_stats;

typedef struct rp_engine_stats {
    int running, waiting;
    /* free: pages a request could take now, those of the pool and the
     * prefix cache's unlocked ones (evicted when needed); cached: pages the
     * prefix cache holds, locked by running requests or not */
    int kv_pages_total, kv_pages_free, kv_pages_cached;
    int max_total_tokens;
    int max_running_requests; /* as given, or as derived from the pool */
    uint64_t steps, prompt_tokens, generated_tokens, preemptions;
    int peak_running;
    int kv_pages_peak_used; /* most pages held by running requests (not cached and unlocked) */
    /* prefix cache (vLLM's prefix_cache_queries / prefix_cache_hits): the
     * tokens of every admission's prompt (with its output so far, for a
     * preempted request coming back), and those found cached */
    uint64_t prefix_cache_queried_tokens, prefix_cache_hit_tokens;
    uint64_t graph_replays, forwards;
    double cpu_ms_per_step; /* host time spent scheduling and preparing, mean */
    rp_step_kind_stats kinds[RP_STEP_KINDS]; /* completed steps by kind */
    /* speculative decoding: verified rounds (a decode with drafts), the
     * drafts they carried and those accepted; a round emits accepted + 1
     * tokens (the mean accepted length is (accepted + rounds) / rounds) */
    uint64_t spec_rounds, spec_draft_tokens, spec_accepted_tokens;
    /* a draft model's forwards and their time (host clock, reads included) */
    uint64_t spec_draft_forwards;
    double spec_draft_ms;
    /* structured output: logit rows sampled with a token mask, by the
     * backend (the mask sent to it, computed while its forward ran) and on
     * the host (the logits read back: penalties, logit processors, prompt
     * logprobs or speculative rounds beside the mask, or
     * disable_device_masks) */
    uint64_t masked_rows_device, masked_rows_host;
} rp_engine_stats;

void rp_engine_get_stats(rp_engine *e, rp_engine_stats *out);
/* hold != 0: no step runs until rp_engine_hold(e, 0); submissions (and
 * aborts) queue meanwhile. A benchmark submits a whole workload held, so
 * that its batches do not depend on how fast the submitting thread was and
 * two runs of it batch alike. Not for use with rp_engine_wait_idle while
 * held: requests wait. */
void rp_engine_hold(rp_engine *e, int hold);
/* Blocks until no request is waiting or running. */
void rp_engine_wait_idle(rp_engine *e);

/* The model's vocabulary and tokenizer, for servers that tokenize. */
int rp_engine_vocab_size(const rp_engine *e);
int rp_engine_max_context(const rp_engine *e);
const struct rp_tokenizer *rp_engine_tokenizer(const rp_engine *e);

#ifdef __cplusplus
}
#endif

#endif
