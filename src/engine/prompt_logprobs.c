/* Prompt logprobs from a chunk's logits (prompt_logprobs.h). */
#include "engine/prompt_logprobs.h"

#include <math.h>
#include <stdlib.h>

int rp_prompt_logprobs_validate(const rp_request_params *p, rp_err *err) {
    if (!p->prompt_logprobs) return RP_OK;
    if (p->prompt_top_logprobs < 0 || p->prompt_top_logprobs > RP_MAX_TOP_LOGPROBS)
        return rp_errp(err, "prompt_logprobs", "prompt_logprobs must be in [0, %d], got %d", RP_MAX_TOP_LOGPROBS,
                       p->prompt_top_logprobs);
    return RP_OK;
}

int rp_prompt_logprobs_init(rp_request *r, const rp_request_params *p) {
    if (!p->prompt_logprobs) return 0;
    if (!(r->prompt_lp = calloc((size_t)r->num_prompt, sizeof *r->prompt_lp))) return -1;
    r->prompt_top = p->prompt_top_logprobs;
    r->prompt_lp[0] = (rp_prompt_logprob){.token = r->tokens[0], .logprob = NAN, .rank = 0, .num_top = 0};
    r->prompt_lp_done = 0;
    r->prompt_lp_sent = 0;
    return 0;
}

/* Whether (a, ia) comes before (b, ib) in the order of likelihood. */
static int before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

void rp_prompt_logprob_compute(const float *logits, int vocab, int32_t token, int num_top, rp_prompt_logprob *out) {
    float max = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > max) max = logits[i]; /* NaN compares false: never the max */
    double sum = 0.0;
    if (max > -INFINITY)
        for (int i = 0; i < vocab; i++)
            if (logits[i] > -INFINITY) sum += (double)expf(logits[i] - max);
    const double lse = max > -INFINITY ? (double)max + log(sum) : INFINITY;
    const float lt = isnan(logits[token]) ? -INFINITY : logits[token];
    /* vLLM counts the tokens at least as likely, the token itself included */
    int rank = 0;
    int n = 0;
    int32_t ids[RP_MAX_TOP_LOGPROBS];
    float vals[RP_MAX_TOP_LOGPROBS];
    if (num_top > vocab) num_top = vocab;
    for (int i = 0; i < vocab; i++) {
        const float l = isnan(logits[i]) ? -INFINITY : logits[i];
        rank += l >= lt;
        if (num_top == 0 || (n == num_top && !before(l, i, vals[n - 1], ids[n - 1]))) continue;
        int j = n < num_top ? n++ : n - 1; /* insert into the sorted list, dropping its last */
        while (j > 0 && before(l, i, vals[j - 1], ids[j - 1])) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = l;
        ids[j] = i;
    }
    out->token = token;
    out->logprob = (float)((double)lt - lse);
    out->rank = rank;
    out->num_top = n;
    for (int j = 0; j < n; j++) {
        out->top_ids[j] = ids[j];
        out->top_logprobs[j] = (float)((double)vals[j] - lse);
    }
}

void rp_prompt_logprobs_record(rp_request *r, const float *rows, int start, int n, int vocab) {
    RP_ASSERT(r->prompt_lp && start <= r->prompt_lp_done);
    for (int p = r->prompt_lp_done; p < start + n && p < r->num_prompt - 1; p++) {
        rp_prompt_logprob_compute(rows + (size_t)(p - start) * vocab, vocab, r->tokens[p + 1], r->prompt_top,
                                  &r->prompt_lp[p + 1]);
        r->prompt_lp_done = p + 1;
    }
}
