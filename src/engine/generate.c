/* The foundation's generation loop: batch, forward, sample, repeat. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "engine/batch.h"
#include "util/log.h"

typedef struct seq_state {
    int row;      /* page-table row, -1 before admission */
    int cached;   /* tokens already in the KV cache */
    int32_t last; /* the last sampled token, fed in the next decode step */
    int done;
    int logit_row; /* this step's first logit row, -1 if none */
    int logit_mode;
    int step_tokens;
} seq_state;

const char *rp_finish_reason_name(rp_finish_reason r) {
    switch (r) {
    case RP_FINISH_STOP: return "stop";
    case RP_FINISH_LENGTH: return "length";
    default: return "none";
    }
}

int rp_generate(rp_backend *be, rp_page_table *table, rp_gen_request *reqs, int n, rp_gen_token_fn on_token,
                void *ctx, rp_gen_stats *stats, rp_err *err) {
    const rp_model_config *c = &be->model->cfg;
    const int vocab = c->vocab_size;
    const rp_backend_config *bc = &be->cfg;
    rp_gen_stats st = {0};
    int rc = RP_ERR;
    seq_state *ss = calloc((size_t)(n > 0 ? n : 1), sizeof *ss);
    rp_batch_builder *bb = rp_batch_builder_new(table, bc->max_batch_tokens, bc->max_batch_seqs, bc->max_logit_rows);
    float *logits = malloc((size_t)bc->max_logit_rows * vocab * sizeof(float));
    rp_sampler *sampler = rp_sampler_new(vocab);
    rp_sample_params *dev_params = calloc((size_t)bc->max_logit_rows, sizeof *dev_params);
    int32_t *dev_tokens = malloc((size_t)bc->max_logit_rows * sizeof *dev_tokens);
    if (!ss || !bb || !logits || !sampler || !dev_params || !dev_tokens) {
        rp_errf(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) ss[i].row = -1;
    for (int i = 0; i < n; i++) {
        rp_gen_request *r = &reqs[i];
        r->num_output = 0;
        r->finish = RP_FINISH_NONE;
        st.prompt_tokens += r->num_prompt;
        if (r->num_prompt <= 0) {
            rp_errf(err, "request %d: empty prompt", i);
            goto out;
        }
        if (r->num_prompt + (r->max_tokens > 0 ? r->max_tokens - 1 : 0) > c->max_position_embeddings) {
            rp_errf(err, "request %d: %d prompt tokens + %d new tokens exceed the context of %d", i,
                     r->num_prompt, r->max_tokens, c->max_position_embeddings);
            goto out;
        }
        if (rp_sampling_params_validate(&r->sampling, vocab, err)) goto out;
        if (r->max_tokens <= 0) ss[i].done = 1;
    }
    /* Sample on the device (only token ids come back) unless a request
     * needs what only the host sampler has: penalties over its history, or
     * the prompt's logits. */
    int device_sampling = be->ops->read_tokens != NULL;
    for (int i = 0; i < n; i++) {
        const rp_sampling_params *p = &reqs[i].sampling;
        if (reqs[i].prompt_logits || p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
            p->frequency_penalty != 0.0f)
            device_sampling = 0;
    }
    double t0 = rp_now_s(), t_prefilled = 0;
    for (;;) {
        rp_batch_begin(bb);
        int any = 0, prefilling = 0;
        for (int i = 0; i < n; i++) {
            seq_state *s = &ss[i];
            rp_gen_request *r = &reqs[i];
            s->logit_row = -1;
            s->step_tokens = 0;
            if (s->done) continue;
            if (s->row < 0) {
                s->row = rp_page_table_acquire_row(table);
                if (s->row < 0) continue; /* no row free: waits for a finished request */
            }
            int budget = rp_batch_tokens_left(bb);
            if (budget <= 0) break;
            const int32_t *toks;
            int ntok, mode;
            if (s->cached < r->num_prompt) { /* prefill, chunked to the budget */
                ntok = r->num_prompt - s->cached;
                if (ntok > budget) ntok = budget;
                if (r->prompt_logits) {
                    int rows_left = bb->max_logits - bb->batch.num_logits;
                    if (ntok > rows_left) ntok = rows_left;
                    if (ntok <= 0) continue;
                }
                toks = r->prompt + s->cached;
                mode = r->prompt_logits ? 2 : (s->cached + ntok == r->num_prompt ? 1 : 0);
                prefilling = 1;
            } else {
                ntok = 1;
                toks = &s->last;
                mode = 1;
            }
            if (rp_page_table_reserve(table, s->row, s->cached + ntok, err)) {
                rp_err_wrap(err, "request %d", i);
                goto out;
            }
            int first = rp_batch_add(bb, s->row, toks, ntok, s->cached, mode);
            if (first < 0) {
                if (bb->batch.num_seqs == bb->max_seqs) break;
                continue;
            }
            s->logit_row = mode ? first : -1;
            if (mode == 1) {
                const rp_sampling_params *p = &r->sampling;
                dev_params[first] = (rp_sample_params){.temperature = p->temperature, .top_p = p->top_p,
                                                       .top_k = p->top_k, .min_p = p->min_p, .seed = p->seed,
                                                       .step = (uint64_t)r->num_output};
            }
            s->logit_mode = mode;
            s->step_tokens = ntok;
            any = 1;
        }
        if (!any) break;
        rp_batch *batch = rp_batch_finish(bb);
        batch->sample = device_sampling ? dev_params : NULL;
        if (rp_backend_forward(be, batch, err)) goto out;
        if (device_sampling ? be->ops->read_tokens(be, dev_tokens, NULL, NULL, err) : rp_backend_read_logits(be, logits, err))
            goto out;
        st.steps++;
        for (int i = 0; i < n; i++) {
            seq_state *s = &ss[i];
            rp_gen_request *r = &reqs[i];
            if (s->done || s->step_tokens == 0) continue;
            int was_prefill = s->cached < r->num_prompt;
            if (was_prefill && r->prompt_logits)
                memcpy(r->prompt_logits + (size_t)s->cached * vocab, logits + (size_t)s->logit_row * vocab,
                       (size_t)s->step_tokens * vocab * sizeof(float));
            s->cached += s->step_tokens;
            if (s->cached < r->num_prompt) continue; /* mid-prefill: nothing to sample */
            int row = s->logit_row + (s->logit_mode == 2 ? s->step_tokens - 1 : 0);
            int32_t tok = device_sampling ? dev_tokens[row]
                                          : rp_sampler_sample(sampler, &r->sampling, logits + (size_t)row * vocab,
                                                              r->prompt, r->num_prompt, r->output, r->num_output,
                                                              (uint64_t)r->num_output, NULL);
            r->output[r->num_output++] = tok;
            s->last = tok;
            if (on_token) on_token(ctx, i, tok);
            int is_stop = rp_config_is_eos(c, tok);
            for (int k = 0; k < r->num_stop_ids && !is_stop; k++) is_stop = r->stop_ids[k] == tok;
            if (!r->ignore_eos && is_stop) {
                r->finish = RP_FINISH_STOP;
            } else if (r->num_output >= r->max_tokens || s->cached + 1 > c->max_position_embeddings) {
                r->finish = RP_FINISH_LENGTH;
            }
            if (r->finish != RP_FINISH_NONE) {
                s->done = 1;
                rp_page_table_release_row(table, s->row);
                s->row = -1;
            }
        }
        if (prefilling) t_prefilled = rp_now_s();
    }
    double t1 = rp_now_s();
    if (t_prefilled == 0) t_prefilled = t0;
    st.prefill_s = t_prefilled - t0;
    st.decode_s = t1 - t_prefilled;
    for (int i = 0; i < n; i++) st.generated_tokens += reqs[i].num_output;
    rc = 0;
out:
    if (ss)
        for (int i = 0; i < n; i++)
            if (ss[i].row >= 0) rp_page_table_release_row(table, ss[i].row);
    if (stats) *stats = st;
    free(ss);
    free(logits);
    rp_batch_builder_free(bb);
    rp_sampler_free(sampler);
    free(dev_params);
    free(dev_tokens);
    return rc;
}
