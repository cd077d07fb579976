/* Speculative decoding's verification (issue 38, docs/speculative.md): given
 * one sequence's k drafted tokens and the target's k + 1 logits rows for
 * them, decides how many drafts to keep and produces one more token, so a
 * round emits 1..k + 1 tokens.
 *
 * Exact, not approximate: greedy output is token for token the output of
 * rp_sampler_sample without speculation (same penalties, tie rule and
 * logprobs), and sampled output has exactly the distribution the sampler
 * draws from, by rejection sampling (Leviathan et al. 2023, Chen et al.
 * 2023) over rp_sampler_probs's distributions. The random numbers are
 * counter-based per request and output position (streams below,
 * docs/sampling.md "Speculative decoding"), so seeded requests reproduce.
 *
 * Host code, one sequence per call; owns only the scratch a round needs,
 * allocated once per vocabulary so that a round allocates nothing. */
#ifndef RP_ENGINE_SPECULATIVE_H
#define RP_ENGINE_SPECULATIVE_H

#include <stdint.h>

#include "backend/sample_params.h"
#include "util/err.h"

/* RNG streams of rp_rand_uniform(seed, stream, counter), counter = the
 * output step of the position (step0 + i). Stream 0 is the sampler's own
 * (rp_sampler_sample draws the bonus and every greedy token); a drafter that
 * samples must not use 1 or 2. */
#define RP_SPEC_STREAM_ACCEPT 1   /* the uniform of the test u < p(d) / q(d) */
#define RP_SPEC_STREAM_RESIDUAL 2 /* the draw from norm(max(p - q, 0)) after a rejection */

typedef struct rp_spec rp_spec;

/* Scratch for one vocabulary size (a sampler and one dense distribution);
 * O(vocab) memory. NULL if vocab_size < 1 or memory is short. Not
 * thread-safe: one per thread. */
rp_spec *rp_spec_new(int vocab_size);
void rp_spec_free(rp_spec *v);

/* Verifies one round of one sequence and appends the emitted tokens.
 *
 * logits[0..k]: the target's rows; row i is its next-token logits after the
 * sequence plus draft[0..i-1]. Rows are rewritten in place (penalised, as
 * rp_sampler_sample does) up to the last emitted position; later rows are
 * not read.
 * draft[0..k-1]: the drafted tokens, each in [0, vocab). k >= 0 (k = 0 is
 * one plain rp_sampler_sample).
 * draft_probs: NULL for a deterministic drafter (q_i a point mass on
 * draft[i]: n-gram, greedy draft model), or k rows of vocab probabilities,
 * q_i the distribution draft[i] was actually sampled from (it must sum to 1;
 * q_i(draft[i]) must be > 0). Ignored for greedy requests apart from that
 * check.
 * prompt/output: the request's tokens so far (for the penalties); output has
 * room for k + 1 more after n_output. step0: the output step of the first
 * position (the sampler's step argument; usually n_output).
 * logprobs_out: NULL or room for k + 1; entry j is what rp_sampler_sample
 * reports for token output[n_output + j] at its position (greedy: the
 * log-softmax of the penalised logits at temperature 1; sampled: its
 * log-probability under p_j, the distribution the sampler draws from there,
 * whether it came from the draft, the residual or the bonus).
 *
 * Greedy (temperature 0): position i emits rp_sampler_sample's token; the
 * round goes on while that token equals draft[i]. Sampled: draft[i] is kept
 * with probability min(1, p_i(d) / q_i(d)) (uniform from
 * RP_SPEC_STREAM_ACCEPT); the first rejection draws from norm(max(p_i - q_i,
 * 0)) (point mass: p_i without d) with RP_SPEC_STREAM_RESIDUAL; if every draft
 * is kept, row k's token is rp_sampler_sample's at step step0 + k.
 *
 * Stops are the caller's: the run is emitted whole, and the caller checks
 * stop ids, EOS, stop strings and max_tokens token by token and drops what
 * follows a stop, exactly as over single tokens.
 *
 * Returns the number of tokens appended (1..k + 1), or RP_ERR with a message
 * (invalid parameters, a draft token outside the vocabulary, q_i(draft[i])
 * not in (0, 1]) before anything is written. Cost per position: one
 * rp_sampler_probs (O(vocab)); allocates nothing. */
int rp_spec_verify(rp_spec *v, const rp_sampling_params *p, float *const *logits, const int32_t *draft,
                   const double *const *draft_probs, int k, const int32_t *prompt, int n_prompt, int32_t *output,
                   int n_output, uint64_t step0, float *logprobs_out, rp_err *err);

#endif
