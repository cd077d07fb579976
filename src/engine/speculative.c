/* Speculative decoding's verification: one sequence's round on the host
 * (docs/speculative.md "Exactness", docs/sampling.md "Speculative decoding").
 *
 * Every distribution here is the sampler's own (rp_sampler_probs runs the
 * same code as rp_sampler_sample), and every token the target itself picks
 * (greedy tokens, the bonus) is rp_sampler_sample's, called with the step
 * it would have had without speculation. So exactness rests on the sampler
 * and on the rejection rule below, not on a second copy of the sampling
 * scheme that could drift from the first. */
#include "engine/speculative.h"

#include <math.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "util/rng.h"

struct rp_spec {
    int vocab_size;
    rp_sampler *sampler;
    double *probs; /* [vocab] p_i, then the residual in place */
};

rp_spec *rp_spec_new(int vocab_size) {
    if (vocab_size < 1) return NULL;
    rp_spec *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->vocab_size = vocab_size;
    v->sampler = rp_sampler_new(vocab_size);
    v->probs = malloc((size_t)vocab_size * sizeof *v->probs);
    if (!v->sampler || !v->probs) {
        rp_spec_free(v);
        return NULL;
    }
    return v;
}

void rp_spec_free(rp_spec *v) {
    if (!v) return;
    rp_sampler_free(v->sampler);
    free(v->probs);
    free(v);
}

/* Everything that can be wrong with the round's input, checked before a
 * token is written, so that an error leaves output as it was. */
static int check_round(const rp_spec *v, const rp_sampling_params *p, const int32_t *draft,
                       const double *const *draft_probs, int k, rp_err *err) {
    if (rp_sampling_params_validate(p, v->vocab_size, err) != RP_OK) return RP_ERR;
    if (k < 0) return rp_errf(err, "speculative round: k must be >= 0, got %d", k);
    for (int i = 0; i < k; i++) {
        if (draft[i] < 0 || draft[i] >= v->vocab_size)
            return rp_errf(err, "speculative round: draft token %d (draft %d of %d) is outside the vocabulary [0, %d)",
                           draft[i], i, k, v->vocab_size);
        /* The drafter sampled draft[i] from q_i, so q_i(draft[i]) > 0; a zero
         * (or NaN) would make the acceptance ratio meaningless. */
        if (draft_probs && !(draft_probs[i][draft[i]] > 0.0 && draft_probs[i][draft[i]] <= 1.0))
            return rp_errf(err,
                           "speculative round: the drafter's probability of its draft token %d (draft %d) is %g, "
                           "not in (0, 1]",
                           draft[i], i, draft_probs[i][draft[i]]);
    }
    return RP_OK;
}

/* Greedy: the sampler's token at each position (penalties over the output
 * including the drafts kept so far) until it differs from the draft. */
static int verify_greedy(rp_spec *v, const rp_sampling_params *p, float *const *logits, const int32_t *draft, int k,
                         const int32_t *prompt, int n_prompt, int32_t *output, int n_output, uint64_t step0,
                         float *logprobs_out) {
    for (int i = 0;; i++) {
        float lp;
        int tok = rp_sampler_sample(v->sampler, p, logits[i], prompt, n_prompt, output, n_output + i, step0 + i, &lp);
        output[n_output + i] = tok;
        if (logprobs_out) logprobs_out[i] = lp;
        if (i == k || tok != draft[i]) return i + 1;
    }
}

/* After rejecting d at a position whose distribution is in v->probs and in
 * the sampler: draws from norm(max(p - q, 0)), q = draft_q or a point mass
 * on d. The residual's support is inside p's, so the sampler walks it in its
 * own order. */
static int draw_residual(rp_spec *v, int32_t d, const double *draft_q, double u) {
    double *r = v->probs, mass = 0.0;
    if (draft_q) {
        for (int t = 0; t < v->vocab_size; t++) {
            double x = r[t] - draft_q[t];
            r[t] = x > 0.0 ? x : 0.0;
            mass += r[t];
        }
    } else {
        r[d] = 0.0;
        for (int t = 0; t < v->vocab_size; t++) mass += r[t];
    }
    /* A rejection means p(d) < q(d) (u < 1), so with q summing to 1 the
     * residual has mass >= q(d) - p(d) > 0; rounding of a q that sums to a
     * little more than 1 could still empty it. Then p itself is the
     * closest distribution there is: draw from it rather than fail. */
    if (mass > 0.0) return rp_sampler_draw_weights(v->sampler, r, u);
    return rp_sampler_draw(v->sampler, u, NULL);
}

static int verify_sampled(rp_spec *v, const rp_sampling_params *p, float *const *logits, const int32_t *draft,
                          const double *const *draft_probs, int k, const int32_t *prompt, int n_prompt,
                          int32_t *output, int n_output, uint64_t step0, float *logprobs_out) {
    for (int i = 0; i < k; i++) {
        uint64_t step = step0 + (uint64_t)i;
        int32_t d = draft[i];
        rp_sampler_probs(v->sampler, p, logits[i], prompt, n_prompt, output, n_output + i, v->probs);
        double q = draft_probs ? draft_probs[i][d] : 1.0;
        /* Accept with probability min(1, p / q): u < p / q (u in [0, 1), so
         * p = 0 never passes and p >= q always does). */
        double u = (double)rp_rand_uniform(p->seed, RP_SPEC_STREAM_ACCEPT, step);
        int rejected = !(u < v->probs[d] / q), tok = d;
        if (rejected) {
            double u_res = (double)rp_rand_uniform(p->seed, RP_SPEC_STREAM_RESIDUAL, step);
            tok = draw_residual(v, d, draft_probs ? draft_probs[i] : NULL, u_res);
        }
        output[n_output + i] = tok;
        /* The logprob under p_i whichever way the token came: what the sampler
         * reports for it at this position. */
        if (logprobs_out) logprobs_out[i] = rp_sampler_logprob(v->sampler, logits[i], tok);
        if (rejected) return i + 1;
    }
    /* Every draft kept: the bonus is the sampler's own draw at its step. */
    float lp;
    output[n_output + k] = rp_sampler_sample(v->sampler, p, logits[k], prompt, n_prompt, output, n_output + k,
                                             step0 + (uint64_t)k, &lp);
    if (logprobs_out) logprobs_out[k] = lp;
    return k + 1;
}

int rp_spec_verify(rp_spec *v, const rp_sampling_params *p, float *const *logits, const int32_t *draft,
                   const double *const *draft_probs, int k, const int32_t *prompt, int n_prompt, int32_t *output,
                   int n_output, uint64_t step0, float *logprobs_out, rp_err *err) {
    RP_ASSERT(v && p && logits && output && (draft || k <= 0));
    if (check_round(v, p, draft, draft_probs, k, err) != RP_OK) return RP_ERR;
    if (rp_sampling_is_greedy(p))
        return verify_greedy(v, p, logits, draft, k, prompt, n_prompt, output, n_output, step0, logprobs_out);
    return verify_sampled(v, p, logits, draft, draft_probs, k, prompt, n_prompt, output, n_output, step0,
                          logprobs_out);
}
