/* Logit processors before sampling (logit_proc.h): logit bias, min_tokens. */
#include "engine/logit_proc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rp_logit_proc_validate(const rp_request_params *p, int vocab_size, rp_err *err) {
    if (p->min_tokens < 0)
        return rp_errp(err, "min_tokens", "min_tokens must be greater than or equal to 0, got %d", p->min_tokens);
    if (p->min_tokens > p->max_tokens) /* vLLM's check and wording */
        return rp_errp(err, "min_tokens", "min_tokens must be less than or equal to max_tokens=%d, got %d",
                       p->max_tokens, p->min_tokens);
    if (p->num_logit_bias < 0 || p->num_logit_bias > RP_MAX_LOGIT_BIAS)
        return rp_errp(err, "logit_bias", "logit_bias may have at most %d entries, got %d", RP_MAX_LOGIT_BIAS,
                       p->num_logit_bias);
    if (p->num_logit_bias > 0 && (!p->logit_bias_ids || !p->logit_bias))
        return rp_errp(err, "logit_bias", "logit_bias has %d entries and no values", p->num_logit_bias);
    for (int i = 0; i < p->num_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= vocab_size)
            return rp_errp(err, "logit_bias", "logit_bias token id %d is outside the vocabulary (0..%d)",
                           p->logit_bias_ids[i], vocab_size - 1);
        float b = p->logit_bias[i];
        if (!isfinite(b) || b < -100.0f || b > 100.0f)
            return rp_errp(err, "logit_bias", "logit_bias values must be in [-100, 100], got %g for token %d",
                           (double)b, p->logit_bias_ids[i]);
    }
    return RP_OK;
}

int rp_logit_proc_init(rp_request *r, const rp_request_params *p) {
    r->min_tokens = p->min_tokens;
    if (p->num_logit_bias <= 0) return 0;
    r->bias_ids = malloc((size_t)p->num_logit_bias * sizeof *r->bias_ids);
    r->bias = malloc((size_t)p->num_logit_bias * sizeof *r->bias);
    if (!r->bias_ids || !r->bias) return -1;
    memcpy(r->bias_ids, p->logit_bias_ids, (size_t)p->num_logit_bias * sizeof *r->bias_ids);
    memcpy(r->bias, p->logit_bias, (size_t)p->num_logit_bias * sizeof *r->bias);
    r->num_bias = p->num_logit_bias;
    return 0;
}

int rp_logit_proc_active(const rp_request *r, int k) { return r->num_bias > 0 || k < r->min_tokens; }

void rp_logit_proc_apply(const rp_request *r, const rp_model_config *cfg, int k, float *logits) {
    for (int i = 0; i < r->num_bias; i++) logits[r->bias_ids[i]] += r->bias[i];
    if (k >= r->min_tokens) return;
    /* the tokens that would end the output: EOS is one unless ignored */
    if (!r->ignore_eos)
        for (int i = 0; i < cfg->num_eos_token_ids; i++) logits[cfg->eos_token_ids[i]] = -INFINITY;
    for (int i = 0; i < r->num_stop_ids; i++) logits[r->stop_ids[i]] = -INFINITY;
}
