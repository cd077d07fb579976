/* A sampled token's way out of the engine: record it in its request, turn
 * it into text (never half a character), hold back what could still become
 * a stop string, and finish the request on EOS, a stop id, a stop string,
 * max_tokens or the context limit. With overlap a finished request keeps its
 * pages until the step in flight that still writes them has completed. */
#include <stdlib.h>
#include <string.h>

#include "engine/draft_model.h"
#include "engine/engine_internal.h"
#include "model/config.h"

/* Appends to the text held back from the stream; -1 when memory ran out. */
static int held_append(rp_request *r, const char *s, size_t n) {
    if (r->held_len + n + 1 > r->held_cap) {
        size_t cap = (r->held_len + n + 1) * 2;
        char *held = realloc(r->held, cap);
        if (!held) return -1;
        r->held = held;
        r->held_cap = cap;
    }
    memcpy(r->held + r->held_len, s, n);
    r->held_len += n;
    r->held[r->held_len] = 0;
    return 0;
}

/* Length of the longest suffix of the held text that is a proper prefix of
 * a stop string: that much must wait for the next token. */
static size_t stop_prefix_tail(const rp_request *r) {
    size_t best = 0;
    for (int i = 0; i < r->num_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1; k > best; k--)
            if (k <= r->held_len && !memcmp(r->held + r->held_len - k, r->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* top: the token's most likely alternatives, or NULL. */
static void deliver(rp_request *r, int32_t tok, float lp, const rp_top_logprobs *top, const char *text, size_t len,
                    rp_finish fin, const char *error) {
    if (!r->cb) return;
    rp_token_event ev = {.id = r->id, .token = tok, .logprob = lp, .text = text ? text : "", .text_len = len,
                         .finish = fin, .error = error, .prompt_tokens = r->num_prompt,
                         .cached_tokens = r->cached_prompt_tokens, .completion_tokens = r->num_output, .preemptions = r->preemptions};
    if (r->prompt_lp && !r->prompt_lp_sent && !rp_request_wants_prompt_logits(r)) {
        ev.prompt_logprobs = r->prompt_lp; /* once, with the first event after they are complete */
        r->prompt_lp_sent = 1;
    }
    if (top && tok >= 0 && top->n > 0) {
        ev.num_top_logprobs = top->n < RP_MAX_TOP_LOGPROBS ? top->n : RP_MAX_TOP_LOGPROBS;
        memcpy(ev.top_ids, top->ids, (size_t)ev.num_top_logprobs * sizeof *ev.top_ids);
        memcpy(ev.top_logprobs, top->logprobs, (size_t)ev.num_top_logprobs * sizeof *ev.top_logprobs);
    }
    r->cb(r->user, &ev);
}

/* Frees a finished request's pages and memory. */
static void release(rp_engine *e, rp_request *r) {
    rp_scheduler_remove(e->sched, r);
    rp_draft_model_release(e->draft, r);
    rp_request_free(r);
}

void rp_engine_release_retired(rp_engine *e) {
    int k = 0;
    for (int i = 0; i < e->num_retiring; i++) {
        rp_request *r = e->retiring[i];
        if (r->last_step <= e->completed) release(e, r);
        else e->retiring[k++] = r;
    }
    e->num_retiring = k;
}

void rp_engine_finish(rp_engine *e, rp_request *r, int32_t tok, float lp, const rp_top_logprobs *top, rp_finish fin,
                      const char *error) {
    if (r->retiring) return;
    /* whatever text is held is output: the request ended without a stop string */
    if (r->has_detok) {
        const char *tail;
        size_t tail_len;
        rp_detok_flush(&r->detok, &tail, &tail_len);
        if (held_append(r, tail, tail_len) && fin != RP_FINISH_REASON_ERROR) {
            fin = RP_FINISH_REASON_ERROR;
            error = "out of memory holding the output text";
        }
    }
    deliver(r, tok, lp, top, r->held, r->held_len, fin, error);
    pthread_mutex_lock(&e->mu);
    rp_engine_live_remove(e, r->id);
    pthread_mutex_unlock(&e->mu);
    r->retiring = 1;
    if (r->last_step <= e->completed || r->state == RP_REQ_WAITING) {
        release(e, r);
        return;
    }
    /* sized for every running request at create: a retiring one is still running */
    RP_ASSERT(e->num_retiring < e->cfg.max_running_requests);
    e->retiring[e->num_retiring++] = r;
}

/* A token that ends the request by id: EOS (unless ignored) or a stop id. */
static int is_stop_token(const rp_engine *e, const rp_request *r, int32_t tok) {
    if (!r->ignore_eos && rp_config_is_eos(&e->run->model->cfg, tok)) return 1;
    for (int i = 0; i < r->num_stop_ids; i++)
        if (r->stop_ids[i] == tok) return 1;
    return 0;
}

/* Without overlap k is the next index; with overlap the slot was reserved (a
 * token reference) when the step was launched, and a later provisional token
 * may already follow. */
void rp_engine_on_sampled(rp_engine *e, rp_request *r, int k, int32_t tok, float lp, const rp_top_logprobs *top) {
    if (r->retiring) return; /* finished in an earlier step: this token was speculative */
    r->tokens[r->num_prompt + k] = tok;
    if (k >= r->num_output) r->num_output = k + 1;
    e->stats.generated_tokens++;
    if (k >= r->min_tokens && is_stop_token(e, r, tok)) { /* min_tokens: masked before (logit_proc.h) */
        r->num_output = k + 1; /* a provisional token after this one is dropped */
        const char *piece;
        size_t n;
        rp_err err; /* its text (empty for a special token, unless kept) joins the output when asked */
        if (r->has_detok && r->include_stop_str && rp_detok_push(&r->detok, tok, &piece, &n, &err) == 0 &&
            held_append(r, piece, n)) {
            rp_engine_finish(e, r, tok, lp, top, RP_FINISH_REASON_ERROR, "out of memory holding the output text");
            return;
        }
        rp_engine_finish(e, r, tok, lp, top, RP_FINISH_REASON_STOP, NULL);
        return;
    }
    if (r->has_detok) {
        const char *piece;
        size_t n;
        rp_err err;
        if (rp_detok_push(&r->detok, tok, &piece, &n, &err) == 0 && held_append(r, piece, n)) {
            r->num_output = k + 1;
            rp_engine_finish(e, r, tok, lp, top, RP_FINISH_REASON_ERROR, "out of memory holding the output text");
            return;
        }
        /* min_tokens: no stop string ends the output inside its first
         * min_tokens tokens (vLLM checks stop strings from the token after) */
        for (int i = 0; k >= r->min_tokens && i < r->num_stop; i++) {
            char *hit = r->held_len ? memmem(r->held, r->held_len, r->stop[i], strlen(r->stop[i])) : NULL;
            if (hit) {
                /* the stop string is not part of the output, unless asked */
                r->held_len = (size_t)(hit - r->held) + (r->include_stop_str ? strlen(r->stop[i]) : 0);
                r->held[r->held_len] = 0;
                rp_detok_free(&r->detok);
                r->has_detok = 0;
                r->num_output = k + 1;
                rp_engine_finish(e, r, tok, lp, top, RP_FINISH_REASON_STOP, NULL);
                return;
            }
        }
    }
    if (k + 1 >= r->max_tokens || r->num_prompt + k + 1 >= e->max_context) {
        r->num_output = k + 1;
        rp_engine_finish(e, r, tok, lp, top, RP_FINISH_REASON_LENGTH, NULL);
        return;
    }
    size_t keep = r->num_stop ? stop_prefix_tail(r) : 0;
    size_t out = r->held_len - keep;
    deliver(r, tok, lp, top, r->held, out, RP_FINISH_REASON_NONE, NULL);
    if (r->held) {
        memmove(r->held, r->held + out, keep);
        r->held[keep] = 0;
    }
    r->held_len = keep;
}
