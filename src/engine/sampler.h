/* Host-side sampler: turns one row of logits into one token id.
 *
 * Owns the meaning of every sampling parameter (vLLM's meaning, see
 * docs/sampling.md for the order and the corner cases) and the scratch
 * buffers needed to apply them, sized once per vocabulary so that a decode
 * step allocates nothing. The engine calls rp_sampler_sample once per
 * sequence per step; the CUDA sampling kernel reproduces the same scheme
 * (same order, same RNG draw, same tie-breaking) and is tested against it.
 *
 * Randomness is counter-based: the uniform for step n of a request is
 * rp_rand_uniform(seed, 0, n), so a seeded request gives the same tokens
 * whatever the batch composition, thread count or history.
 *
 * Speculative decoding (engine/speculative.c) needs the distribution itself,
 * not one draw from it: rp_sampler_probs returns it as a vector, and the
 * draws after it sample from it (or from weights over its support) with the
 * same order, tie rule and arithmetic as rp_sampler_sample, which runs the
 * very same code. */
#ifndef RP_ENGINE_SAMPLER_H
#define RP_ENGINE_SAMPLER_H

#include <stdint.h>

#include "backend/sample_params.h"
#include "util/err.h"

/* vLLM raises temperatures in (0, 0.01) to 0.01 ("may cause numerical errors
 * nan or inf"); we do the same so a request means the same thing here. */
#define RP_SAMPLING_MIN_TEMPERATURE 0.01f

/* rp_sampling_params (backend/sample_params.h): what each field means and
 * its range are documented there and checked here. */

/* vLLM's defaults: temperature 1, everything else off, seed 0 / unset. */
void rp_sampling_params_default(rp_sampling_params *p);

/* Checks every parameter against its allowed range (and vocab_size >= 1).
 * Messages use vLLM's wording: "temperature must be non-negative, got -1".
 * NaN is rejected everywhere. Returns 0 or RP_ERR. */
int rp_sampling_params_validate(const rp_sampling_params *p, int vocab_size, rp_err *err);

/* Greedy (argmax) decoding: temperature == 0. */
int rp_sampling_is_greedy(const rp_sampling_params *p);

/* Structured output's mask, applied before a row is sampled: the logit of
 * every token whose bit in mask is 0 (bit id % 32 of word id / 32) becomes
 * -inf, so the draw, the logprobs and the top logprobs are those of the
 * masked distribution (docs/structured.md). */
void rp_sampler_apply_mask(float *logits, int vocab_size, const uint32_t *mask);

typedef struct rp_sampler rp_sampler;

/* Scratch for one vocabulary size; O(vocab) memory, allocated here once.
 * Returns NULL if vocab_size < 1 or memory is short. Not thread-safe: use one
 * sampler per thread. */
rp_sampler *rp_sampler_new(int vocab_size);
void rp_sampler_free(rp_sampler *s);

/* Samples one token from logits[vocab] (fp32; overwritten in place with the
 * penalised logits, NaN replaced by -inf and +inf by FLT_MAX).
 *
 * prompt/output: the request's token ids so far (for the penalties), each in
 * [0, vocab). step: index of the token being generated within the request
 * (0 for the first); it is the RNG counter. p must have passed
 * rp_sampling_params_validate.
 *
 * Returns the token id (>= 0). If logprob_out is non-NULL it receives the
 * chosen token's log-probability under the distribution actually sampled
 * from (after temperature, top-k, top-p, min-p and renormalisation); for
 * greedy, the log-softmax of the penalised logits at temperature 1. If every
 * logit is -inf or NaN, returns token 0 with logprob -inf. */
int rp_sampler_sample(rp_sampler *s, const rp_sampling_params *p, float *logits,
                      const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                      uint64_t step, float *logprob_out);

/* rp_sampler_sample, and when top_out is non-NULL also the min(p->top_logprobs,
 * vocab) most likely tokens: the first ones of the sampling order (penalised
 * logit descending, then lower id), with their log-probabilities under the
 * same distribution as *logprob_out: the log-softmax of the penalised logits
 * at temperature 1 for greedy; else the distribution sampled from, in which a
 * token cut by top-k, top-p or min-p has -inf. The chosen token's logprob is
 * bit-identical to its entry when it is in the list. top_out->n = 0 when
 * p->top_logprobs is 0. Costs one more pass over the vocabulary when asked. */
int rp_sampler_sample_top(rp_sampler *s, const rp_sampling_params *p, float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          uint64_t step, float *logprob_out, rp_top_logprobs *top_out);

/* ---- the distribution itself (speculative decoding) ----
 *
 * rp_sampler_probs prepares one row exactly as rp_sampler_sample does (same
 * code: penalties, sanitising, temperature, top-k, top-p, min-p) and, instead
 * of drawing, writes the distribution rp_sampler_sample draws from. The
 * sampler keeps that distribution until its next call, and the three
 * functions below read it; each asserts that the last call was
 * rp_sampler_probs.
 *
 * Cost: that of rp_sampler_sample plus one O(vocab) pass to write the
 * vector; for greedy, also one exp per token (the log-softmax that
 * rp_sampler_logprob reports). Allocates nothing. */

/* Writes probs_out[vocab]: the probability of each token under the
 * distribution rp_sampler_sample(s, p, logits, prompt, .., output, ..) draws
 * from: mass / sum over the kept tokens, 0 for tokens cut by top-k, top-p,
 * min-p, -inf or underflow. Greedy (and an all -inf row, where
 * rp_sampler_sample returns token 0): 1 on the argmax, 0 elsewhere.
 * logits is rewritten as by rp_sampler_sample (penalised, sanitised); keep it
 * for rp_sampler_logprob. Returns the number of tokens with probability > 0
 * (>= 1). */
int rp_sampler_probs(rp_sampler *s, const rp_sampling_params *p, float *logits,
                     const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                     double *probs_out);

/* Draws from the last rp_sampler_probs distribution with the uniform u in
 * [0, 1): the token and logprob rp_sampler_sample returns for the same row
 * when rp_rand_uniform(seed, 0, step) == u, bit for bit (it is the same
 * walk over the same masses and the same normaliser, not a walk over the
 * rounded probabilities). Once per rp_sampler_probs: the walk consumes the
 * kept set (rp_sampler_logprob still works after it). */
int rp_sampler_draw(rp_sampler *s, double u, float *logprob_out);

/* Draws from weights[vocab] (finite, >= 0; need not sum to 1) restricted to
 * the support of the last rp_sampler_probs distribution: weights of tokens
 * outside it are not read. Inverse CDF in the sampling order (penalised logit
 * descending, then lower id), the first token whose running weight exceeds
 * u * (sum of weights), as rp_sampler_draw walks masses. This is the
 * residual draw of speculative decoding, norm(max(p - q, 0)), whose support
 * is inside p's. Returns -1 if no token of the support has a positive
 * weight. Same one-draw-per-rp_sampler_probs rule as rp_sampler_draw;
 * O(support) plus the sort of one bucket. */
int rp_sampler_draw_weights(rp_sampler *s, const double *weights, double u);

/* The logprob rp_sampler_sample reports for token when it draws it from the
 * last rp_sampler_probs distribution, bit for bit: sampled, the
 * log-probability under the distribution (-inf for a cut token); greedy, the
 * log-softmax of the penalised logits at temperature 1; -inf for an all -inf
 * row. logits: the row rp_sampler_probs rewrote. O(1). */
float rp_sampler_logprob(const rp_sampler *s, const float *logits, int32_t token);

#endif
