/* Drafting and verifying speculative rounds in the engine (draft.h). */
#include "engine/draft.h"

#include "engine/constraint.h"
#include "engine/draft_model.h"
#include "engine/engine_internal.h"
#include "engine/logit_proc.h"
#include "engine/ngram.h"
#include "util/log.h"

void rp_engine_propose_drafts(rp_engine *e) {
    if (!e->spec_k) return; /* num_draft stays 0: nothing sets it */
    rp_scheduler *s = e->sched;
    int decoding = 0;
    for (int i = 0; i < s->num_running; i++) {
        rp_request *r = s->running[i];
        r->num_draft = 0;
        decoding += rp_request_pending(r) == 1 && rp_request_can_run(r, e->max_context);
    }
    if (decoding > rp_spec_max_seqs(e->spec_k)) return;
    int n = 0;
    for (int i = 0; i < s->num_running; i++) {
        rp_request *r = s->running[i];
        const int len = rp_request_len(r);
        if (rp_request_pending(r) != 1 || !rp_request_can_run(r, e->max_context)) continue;
        if (r->tokens[len - 1] < 0) continue; /* still a reference to a row on the device */
        int want = r->max_tokens - r->num_output - 1; /* the round's last token is the target's own */
        if (want > e->spec_k) want = e->spec_k;
        if (want <= 0 || !rp_spec_track_wants(&r->spec)) continue;
        if (e->draft) {
            e->draft_reqs[n] = r;
            e->draft_want[n++] = want;
            continue;
        }
        rp_err err;
        if (!r->ngram || rp_ngram_append(r->ngram, r->tokens, len, &err)) continue;
        r->num_draft = rp_ngram_propose(r->ngram, r->tokens, len, want, r->tokens + len);
        if (r->matcher) r->num_draft = rp_engine_constraint_drafts(r);
    }
    if (!n) return;
    rp_err err;
    const int rc = rp_draft_model_propose(e->draft, e->draft_reqs, e->draft_want, n, &err);
    rp_draft_model_counts(e->draft, &e->stats.spec_draft_forwards, &e->stats.spec_draft_ms);
    if (rc) {
        /* the target goes on alone: no request loses anything but speed */
        rp_log_error("the draft model failed (%s): speculative decoding is off from now on", err.msg);
        for (int i = 0; i < n; i++) e->draft_reqs[i]->num_draft = 0;
        e->spec_k = 0;
    }
    /* structured output: no position is spent on a draft the grammar refuses */
    for (int i = 0; i < n; i++)
        if (e->draft_reqs[i]->matcher) e->draft_reqs[i]->num_draft = rp_engine_constraint_drafts(e->draft_reqs[i]);
}

/* Structured output: each position is drawn from its row masked by the
 * matcher after the tokens before it (the kept drafts), so the round
 * emits what decoding one token a step would have. A position where the
 * grammar allows nothing ends the request after the tokens before it. */
void rp_engine_verify_round(rp_engine *e, const rp_step *st, int i) {
    rp_request *r = st->items[i].req;
    const int d = st->items[i].draft, k = st->out_index[i], row0 = st->logit_row[i];
    const int vocab = e->run->model->cfg.vocab_size;
    int32_t tok[RP_SPEC_MAX_K + 1];
    float lp[RP_SPEC_MAX_K + 1];
    int n = 0;
    rp_finish end = RP_FINISH_REASON_NONE; /* the grammar ends r after the n tokens */
    RP_ASSERT(d <= RP_SPEC_MAX_K);
    const rp_top_logprobs *top[RP_SPEC_MAX_K + 1];
    for (int j = 0; j <= d; j++) {
        if (st->device_sampling) { /* sampled on the device, row by row as draft.h says */
            /* structured output: masked after the kept drafts before it
             * (rp_engine_constraint_fill_rows), or nothing was allowed there */
            if (r->matcher && (end = e->mask_end[row0 + j])) break;
            tok[j] = e->dev_tokens[row0 + j];
            lp[j] = e->dev_logprobs[row0 + j];
            top[j] = &e->dev_top[row0 + j];
            if (r->matcher && rp_engine_constraint_take(r, tok[j])) {
                end = RP_FINISH_REASON_ERROR;
                break;
            }
        } else {
            float *logits = e->run->logits + (size_t)(row0 + j) * vocab;
            if (r->matcher && (end = rp_engine_constraint_apply(e, r, logits))) break;
            /* the output before position k + j is the kept drafts: the penalties see them */
            rp_logit_proc_apply(r, &e->run->model->cfg, k + j, logits);
            tok[j] = rp_sampler_sample_top(e->sampler, &r->sampling, logits, r->tokens, r->num_prompt,
                                           r->tokens + r->num_prompt, k + j, (uint64_t)(k + j), &lp[j],
                                           &e->spec_top[j]);
            top[j] = &e->spec_top[j];
            if (r->matcher && rp_engine_constraint_take(r, tok[j])) {
                end = RP_FINISH_REASON_ERROR;
                break;
            }
        }
        n = j + 1;
        if (j == d || tok[j] != r->tokens[r->num_prompt + k + j]) break;
    }
    /* the emitted tokens but the last are kept drafts; when the grammar ends
     * r, every emitted token is one (their K/V are in the cache) */
    const int kept = end ? n : n - 1;
    r->cached -= d - kept;
    rp_draft_model_rollback(r);
    rp_spec_track_round(&r->spec, kept);
    e->stats.spec_rounds++;
    e->stats.spec_draft_tokens += (uint64_t)d;
    e->stats.spec_accepted_tokens += (uint64_t)kept;
    for (int j = 0; j < n && !r->retiring; j++) rp_engine_on_sampled(e, r, k + j, tok[j], lp[j], top[j]);
    if (end && !r->retiring)
        rp_engine_constraint_end(e, r, k + n, end, end == RP_FINISH_REASON_ERROR ? rp_constraint_refused_msg : NULL);
}
