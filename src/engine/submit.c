/* rp_engine_submit: validates a request on the caller's thread, tokenizes
 * its prompt and builds the rp_request the scheduler runs. Everything a
 * request could get wrong is caught here, with the parameter at fault, so
 * the engine thread only ever sees requests that fit. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/constraint.h"
#include "engine/engine_internal.h"
#include "engine/logit_proc.h"
#include "engine/ngram.h"
#include "engine/prompt_logprobs.h"
#include "util/log.h"
#include "util/rng.h"

static int fail(rp_error *err, rp_error_code code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(rp_error *err, rp_error_code code, const char *param, const char *fmt, ...) {
    if (err) {
        err->code = code;
        snprintf(err->param, sizeof err->param, "%s", param);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The request's sampling, validated; an unseeded one gets a fresh seed. */
static int sampling_from_params(rp_engine *e, const rp_request_params *p, rp_sampling_params *sp, rp_error *err) {
    rp_err verr;
    rp_sampling_params_default(sp);
    sp->temperature = p->temperature;
    sp->top_p = p->top_p;
    sp->top_k = p->top_k;
    sp->min_p = p->min_p;
    sp->repetition_penalty = p->repetition_penalty;
    sp->presence_penalty = p->presence_penalty;
    sp->frequency_penalty = p->frequency_penalty;
    sp->seed = p->seed;
    sp->top_logprobs = p->top_logprobs;
    sp->has_seed = p->has_seed;
    if (rp_sampling_params_validate(sp, e->run->model->cfg.vocab_size, &verr))
        return fail(err, RP_ERROR_INVALID_REQUEST, verr.param, "%s", verr.msg);
    if (!sp->has_seed) {
        pthread_mutex_lock(&e->mu);
        sp->seed = rp_mix64((uint64_t)(rp_now_s() * 1e9) ^ (e->next_id << 20));
        pthread_mutex_unlock(&e->mu);
        sp->has_seed = 1;
    }
    return 0;
}

/* The prompt's token ids: the text tokenized (with BOS, as HF's
 * tokenizer(text) adds it), or a copy of the ids, checked against the
 * vocabulary. *ids is owned by the caller. */
static int prompt_ids(rp_engine *e, const rp_request_params *p, int32_t **ids_out, size_t *n_out, rp_error *err) {
    const int vocab = e->run->model->cfg.vocab_size;
    int32_t *ids = NULL;
    size_t n = 0;
    if (p->prompt) {
        rp_err terr;
        if (rp_tokenizer_encode(e->tok, p->prompt, strlen(p->prompt), &ids, &n, &terr))
            return fail(err, RP_ERROR_INVALID_REQUEST, "prompt", "%s", terr.msg);
        int bos = rp_tokenizer_bos_id(e->tok);
        if (bos >= 0 && (n == 0 || ids[0] != bos)) {
            int32_t *with = malloc((n + 1) * sizeof *with);
            if (!with) {
                free(ids);
                return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
            }
            with[0] = bos;
            memcpy(with + 1, ids, n * sizeof *ids);
            free(ids);
            ids = with;
            n++;
        }
    } else {
        for (int i = 0; i < p->num_prompt_ids; i++)
            if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= vocab)
                return fail(err, RP_ERROR_INVALID_REQUEST, "prompt",
                            "prompt token id %d is outside the vocabulary (0..%d)", p->prompt_ids[i], vocab - 1);
        n = p->num_prompt_ids > 0 ? (size_t)p->num_prompt_ids : 0;
        if (n > 0 && !(ids = malloc(n * sizeof *ids))) return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
        if (n > 0) memcpy(ids, p->prompt_ids, n * sizeof *ids);
    }
    if (n == 0) {
        free(ids);
        return fail(err, RP_ERROR_INVALID_REQUEST, "prompt", "the prompt is empty");
    }
    *ids_out = ids;
    *n_out = n;
    return 0;
}

/* Whether n prompt tokens and max_tokens more fit the context and the pool. */
static int check_fits(rp_engine *e, const rp_request_params *p, size_t n, rp_error *err) {
    const rp_model_config *c = &e->run->model->cfg;
    if ((long)n >= e->max_context)
        return fail(err, RP_ERROR_CONTEXT_LENGTH, "prompt",
                    "this engine's maximum context length is %d tokens%s; the prompt has %zu tokens, leaving no "
                    "room for output",
                    e->max_context, e->max_context < c->max_position_embeddings ? " (limited by the KV cache)" : "",
                    n);
    int pages_needed = rp_scheduler_pages_for(e->sched, (int)n + 1);
    if (pages_needed > e->run->pool->num_pages)
        return fail(err, RP_ERROR_CONTEXT_LENGTH, "prompt",
                    "the prompt needs %d KV pages, more than the whole cache holds (%d)", pages_needed,
                    e->run->pool->num_pages);
    if ((long)n + p->max_tokens > e->max_context) /* as vLLM's server: an explicit max_tokens past the context */
        return fail(err, RP_ERROR_CONTEXT_LENGTH, "max_tokens",
                    "this engine's maximum context length is %d tokens; the request asks for %zu prompt tokens "
                    "plus %d output tokens",
                    e->max_context, n, p->max_tokens);
    return 0;
}

/* Copies the stop conditions into r; -1 when memory ran out. */
static int copy_stops(rp_request *r, const rp_request_params *p) {
    if (p->num_stop_ids > 0) {
        if (!(r->stop_ids = malloc((size_t)p->num_stop_ids * sizeof *r->stop_ids))) return -1;
        memcpy(r->stop_ids, p->stop_ids, (size_t)p->num_stop_ids * sizeof *r->stop_ids);
        r->num_stop_ids = p->num_stop_ids;
    }
    if (p->num_stop > 0) {
        if (!(r->stop = calloc((size_t)p->num_stop, sizeof *r->stop))) return -1;
        r->num_stop = p->num_stop;
        for (int i = 0; i < p->num_stop; i++)
            if (!(r->stop[i] = strdup(p->stop[i]))) return -1;
    }
    return 0;
}

int rp_engine_submit(rp_engine *e, const rp_request_params *p, rp_token_callback cb, void *user,
                     rp_request_id *id_out, rp_error *err) {
    rp_sampling_params sp;
    if (sampling_from_params(e, p, &sp, err)) return -1;
    if (p->max_tokens < 1)
        return fail(err, RP_ERROR_INVALID_REQUEST, "max_tokens", "max_tokens must be at least 1, got %d",
                    p->max_tokens);
    if ((p->prompt != NULL) == (p->prompt_ids != NULL))
        return fail(err, RP_ERROR_INVALID_REQUEST, "prompt", "give exactly one of a prompt text or prompt token ids");
    if (p->prompt && !e->tok)
        return fail(err, RP_ERROR_UNSUPPORTED, "prompt", "this model has no tokenizer: send token ids");
    if (p->num_stop > 0 && !e->tok)
        return fail(err, RP_ERROR_UNSUPPORTED, "stop", "this model has no tokenizer: stop strings cannot be matched");
    for (int i = 0; i < p->num_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return fail(err, RP_ERROR_INVALID_REQUEST, "stop", "stop strings must not be empty");
    for (int i = 0; i < p->num_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= e->run->model->cfg.vocab_size)
            return fail(err, RP_ERROR_INVALID_REQUEST, "stop_token_ids",
                        "stop token id %d is outside the vocabulary (0..%d)", p->stop_ids[i],
                        e->run->model->cfg.vocab_size - 1);
    rp_err perr;
    if (rp_logit_proc_validate(p, e->run->model->cfg.vocab_size, &perr) || rp_prompt_logprobs_validate(p, &perr))
        return fail(err, RP_ERROR_INVALID_REQUEST, perr.param, "%s", perr.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_ids(e, p, &ids, &n, err)) return -1;
    if (check_fits(e, p, n, err)) {
        free(ids);
        return -1;
    }
    rp_request *r = calloc(1, sizeof *r);
    if (!r) {
        free(ids);
        return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
    }
    /* the output slots, and one for a token fed before its request is seen to end */
    r->tokens = realloc(ids, (n + (size_t)p->max_tokens + 1) * sizeof *r->tokens);
    if (!r->tokens) {
        free(ids);
        rp_request_free(r);
        return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
    }
    r->num_prompt = (int)n;
    r->max_tokens = p->max_tokens;
    r->sampling = sp;
    r->ignore_eos = p->ignore_eos;
    r->want_logprobs = p->logprobs;
    r->cb = cb;
    r->user = user;
    r->row = -1;
    r->draft_row = -1;
    rp_spec_track_init(&r->spec);
    /* the n-gram drafter's index, for every token the request can hold */
    if (copy_stops(r, p) || rp_logit_proc_init(r, p) || rp_prompt_logprobs_init(r, p) || (e->spec_k && !e->draft && !(r->ngram = rp_ngram_new(e->cfg.prompt_lookup_min, e->cfg.prompt_lookup_max,
                                                                    (int)n + p->max_tokens + 1)))) {
        rp_request_free(r);
        return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
    }
    if (rp_engine_constraint_start(e, &p->constraint, r, err)) {
        rp_request_free(r);
        return -1;
    }
    if (e->tok) {
        rp_detok_init(&r->detok, e->tok, !p->keep_special_tokens);
        rp_detok_continue(&r->detok); /* the output follows its prompt */
        r->include_stop_str = p->include_stop_str_in_output;
        r->has_detok = 1;
    }
    /* r belongs to the engine thread once queued: the id comes back from the queueing */
    if (rp_engine_enqueue(e, r, (int)n, id_out)) {
        rp_request_free(r);
        return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
    }
    return 0;
}
