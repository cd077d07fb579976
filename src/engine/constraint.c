/* Structured output in the engine (constraint.h): the structured vocabulary
 * built from the tokenizer once, constraints compiled at submit, the mask
 * and advance around each host-side draw of a constrained request, and a
 * deferred step's masks for the backend. */
#include "engine/constraint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/sampler.h"
#include "structured/structured.h"
#include "util/log.h"

enum { MAX_EOS_IDS = 32 };

static int fail(rp_error *err, rp_error_code code, const char *param, const char *msg) {
    if (err) {
        err->code = code;
        snprintf(err->param, sizeof err->param, "%s", param);
        snprintf(err->message, sizeof err->message, "%s", msg);
    }
    return -1;
}

static const char *param_of(const rp_constraint *c) {
    return c->param && c->param[0] ? c->param : "structured_outputs";
}

static rp_skind skind_of(rp_constraint_kind k) {
    switch (k) {
    case RP_CONSTRAINT_JSON_OBJECT: return RP_SKIND_JSON_OBJECT;
    case RP_CONSTRAINT_REGEX: return RP_SKIND_REGEX;
    case RP_CONSTRAINT_CHOICE: return RP_SKIND_CHOICE;
    case RP_CONSTRAINT_GRAMMAR: return RP_SKIND_GBNF;
    case RP_CONSTRAINT_JSON_SCHEMA:
    case RP_CONSTRAINT_NONE: break;
    }
    return RP_SKIND_JSON_SCHEMA;
}

/* The constraint's kind and text checked; its text (json_object: empty). */
static int constraint_text(const rp_constraint *c, const char **text, size_t *len, rp_error *err) {
    if (c->kind < RP_CONSTRAINT_JSON_SCHEMA || c->kind > RP_CONSTRAINT_GRAMMAR)
        return fail(err, RP_ERROR_INVALID_REQUEST, param_of(c), "unknown structured output kind");
    if (c->kind == RP_CONSTRAINT_JSON_OBJECT) {
        *text = "";
        *len = 0;
        return 0;
    }
    if (!c->text) return fail(err, RP_ERROR_INVALID_REQUEST, param_of(c), "the structured output constraint is empty");
    *text = c->text;
    *len = c->text_len ? c->text_len : strlen(c->text);
    return 0;
}

/* rp_sgrammar_compile with the request's field in the error. */
static rp_sgrammar *compile(rp_svocab *v, const rp_constraint *c, int precompute_ms, rp_error *err) {
    const char *text;
    size_t len;
    if (constraint_text(c, &text, &len, err)) return NULL;
    rp_sopts so = {.allow_whitespace = c->allow_whitespace != 0, .precompute_ms = precompute_ms};
    rp_err cerr = {0};
    rp_sgrammar *g = rp_sgrammar_compile(v, skind_of(c->kind), text, len, &so, &cerr);
    if (!g && err) {
        fail(err, RP_ERROR_INVALID_REQUEST, param_of(c), "");
        /* the message ends where it would overflow: one line for people */
        int n = snprintf(err->message, sizeof err->message, "invalid %s: ", param_of(c));
        if (n > 0 && (size_t)n < sizeof err->message) {
            size_t msg_len = strnlen(cerr.msg, sizeof err->message - (size_t)n - 1);
            memcpy(err->message + n, cerr.msg, msg_len);
            err->message[(size_t)n + msg_len] = 0;
        }
    }
    return g;
}

int rp_constraint_validate(const rp_constraint *c, rp_error *err) {
    if (c->kind == RP_CONSTRAINT_NONE) return 0;
    /* every byte a token: the grammar's own errors, whatever the model's vocabulary */
    char bytes[256];
    const char *ptrs[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptrs[i] = &bytes[i];
        lens[i] = 1;
    }
    rp_err verr;
    rp_svocab *v = rp_svocab_new(256, ptrs, lens, NULL, NULL, 0, &verr);
    if (!v) return fail(err, RP_ERROR_OUT_OF_MEMORY, "", verr.msg);
    rp_sgrammar *g = compile(v, c, -1, err);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
    return g ? 0 : -1;
}

/* The model's vocabulary as the matcher sees it: each id's bytes (ids past
 * the tokenizer's are never allowed), its special tokens, and as ends of
 * generation the model's EOS ids and the chat template's end-of-turn ids. */
static rp_svocab *build_vocab(rp_engine *e, rp_err *err) {
    const int n = e->run->model->cfg.vocab_size, n_tok = rp_tokenizer_vocab_size(e->tok);
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *special = calloc((size_t)n, 1);
    rp_svocab *v = NULL;
    if (!bytes || !lens || !special) {
        rp_errf(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_tok && i < n; i++) {
        if (rp_tokenizer_token_bytes(e->tok, i, &bytes[i], &lens[i])) bytes[i] = NULL, lens[i] = 0;
        special[i] = (uint8_t)rp_tokenizer_is_special(e->tok, i);
    }
    int32_t eos[MAX_EOS_IDS];
    int n_eos = 0;
    const rp_model_config *mc = &e->run->model->cfg;
    for (int i = 0; i < mc->num_eos_token_ids && n_eos < MAX_EOS_IDS; i++)
        if (mc->eos_token_ids[i] >= 0 && mc->eos_token_ids[i] < n) eos[n_eos++] = mc->eos_token_ids[i];
    int32_t chat[8];
    const int n_chat = rp_chat_stop_ids(e->tok, chat, 8);
    for (int i = 0; i < n_chat && n_eos < MAX_EOS_IDS; i++) {
        int seen = chat[i] < 0 || chat[i] >= n;
        for (int j = 0; j < n_eos && !seen; j++) seen = eos[j] == chat[i];
        if (!seen) eos[n_eos++] = chat[i];
    }
    v = rp_svocab_new(n, bytes, lens, special, eos, n_eos, err);
out:
    free(bytes);
    free(lens);
    free(special);
    return v;
}

/* The vocabulary and the mask row, and with device masks the rows of a
 * whole step (each rp_token_mask_words apart), built by the first caller. */
static int ensure_vocab(rp_engine *e, rp_error *err) {
    pthread_mutex_lock(&e->constraint_mu);
    int rc = 0;
    if (!e->svocab) {
        rp_err verr = {0};
        rp_svocab *v = build_vocab(e, &verr);
        uint32_t *mask = v ? malloc((size_t)rp_svocab_mask_words(v) * sizeof *mask) : NULL;
        const size_t row_words = (size_t)rp_token_mask_words(e->run->model->cfg.vocab_size);
        uint32_t *rows = v && e->device_masks ? calloc((size_t)e->max_logits * row_words, sizeof *rows) : NULL;
        if (v && mask && (rows || !e->device_masks)) {
            e->svocab = v;
            e->mask = mask;
            e->mask_rows = rows;
        } else if (v) {
            rp_svocab_free(v);
            free(mask);
            free(rows);
            rc = fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
        } else { /* the tokenizer's vocabulary as the matcher cannot take it: replay's fault, not the request's */
            rp_log_error("structured output: %s", verr.msg);
            rc = fail(err, RP_ERROR_INTERNAL, "", verr.msg);
        }
    }
    pthread_mutex_unlock(&e->constraint_mu);
    return rc;
}

int rp_engine_constraint_start(rp_engine *e, const rp_constraint *c, rp_request *r, rp_error *err) {
    if (c->kind == RP_CONSTRAINT_NONE) return 0;
    if (c->has_reasoning_end) {
        if (c->reasoning_end_id < 0 || c->reasoning_end_id >= e->run->model->cfg.vocab_size)
            return fail(err, RP_ERROR_INVALID_REQUEST, param_of(c),
                        "the reasoning end token is outside the vocabulary");
        r->reasoning_end = c->reasoning_end_id;
        r->reasoning = 1;
        for (int i = 0; i < r->num_prompt && r->reasoning; i++) r->reasoning = r->tokens[i] != r->reasoning_end;
    }
    if (!e->tok)
        return fail(err, RP_ERROR_UNSUPPORTED, param_of(c),
                    "structured output needs the model's tokenizer (this model has none)");
    if (ensure_vocab(e, err)) return -1;
    rp_sgrammar *g = compile(e->svocab, c, 0, err);
    if (!g) return -1;
    rp_err merr;
    rp_smatcher *m = rp_smatcher_new(g, &merr);
    rp_sgrammar_release(g); /* the matcher holds its own reference */
    if (!m) return fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
    r->matcher = m;
    return 0;
}

const char rp_constraint_refused_msg[] =
    "structured output: the model gave no finite logit to any token the grammar allows";

void rp_engine_constraint_end(rp_engine *e, rp_request *r, int k, rp_finish fin, const char *error) {
    r->num_output = k;
    rp_engine_finish(e, r, -1, 0, NULL, fin, error);
}

/* r's mask (not reasoning) into mask: NONE, or how r must end where the
 * grammar allows no token. */
static rp_finish fill_mask(rp_request *r, uint32_t *mask) {
    if (rp_smatcher_fill_mask(r->matcher, mask)) return RP_FINISH_REASON_NONE;
    /* complete (EOS taken, or the vocabulary has no EOS to end it) or dead */
    const int done = rp_smatcher_is_accepting(r->matcher) || rp_smatcher_is_finished(r->matcher);
    return done ? RP_FINISH_REASON_STOP : RP_FINISH_REASON_GRAMMAR;
}

rp_finish rp_engine_constraint_apply(rp_engine *e, rp_request *r, float *logits) {
    if (r->reasoning) return RP_FINISH_REASON_NONE;
    const rp_finish fin = fill_mask(r, e->mask);
    if (fin == RP_FINISH_REASON_NONE) {
        rp_sampler_apply_mask(logits, e->run->model->cfg.vocab_size, e->mask);
        e->stats.masked_rows_host++;
    }
    return fin;
}

/* A speculative round's masks (item i of st, d drafts): position j's mask
 * is the matcher's after drafts 0..j-1, which the round uses only where
 * they are all kept; the matcher takes the drafts here and gives them back
 * at the end. Returns the masks made. */
static int fill_round(rp_engine *e, const rp_step *st, int i, int n, int words) {
    rp_request *r = st->items[i].req;
    const int d = st->items[i].draft, row0 = st->logit_row[i];
    const int32_t *draft = r->tokens + r->num_prompt + st->out_index[i];
    int reasoning = r->reasoning, taken = 0;
    const int n0 = n;
    for (int j = 0; j <= d; j++) {
        if (!reasoning) {
            const rp_finish fin = fill_mask(r, e->mask_rows + (size_t)n * words);
            if (fin != RP_FINISH_REASON_NONE) {
                /* nothing allowed after the drafts before j: the round ends r
                 * there if it keeps them all (at once where j = 0) */
                if (j == 0) rp_engine_constraint_end(e, r, st->out_index[i], fin, NULL);
                else e->mask_end[row0 + j] = fin;
                break;
            }
            e->mask_of_row[row0 + j] = n++;
        }
        if (j == d) break;
        if (reasoning) {
            reasoning = draft[j] != r->reasoning_end;
        } else if (rp_smatcher_accept_token(r->matcher, draft[j])) {
            /* refused (drafts are cut before launch, so this is only a
             * guard): the mask just made leaves draft j out, so no token
             * drawn at j is it and the positions after are never used */
            break;
        } else {
            taken++;
        }
    }
    rp_smatcher_rollback(r->matcher, taken);
    return n - n0;
}

int rp_engine_constraint_fill_rows(rp_engine *e, const rp_step *st) {
    const int words = rp_token_mask_words(e->run->model->cfg.vocab_size);
    int n = 0;
    for (int i = 0; i < st->num_logits; i++) e->mask_of_row[i] = -1, e->mask_end[i] = RP_FINISH_REASON_NONE;
    for (int i = 0; i < st->n; i++) {
        rp_request *r = st->items[i].req;
        if (!st->items[i].samples || !r->matcher || r->retiring) continue;
        if (st->items[i].draft) {
            n += fill_round(e, st, i, n, words);
            continue;
        }
        if (r->reasoning) continue;
        const rp_finish fin = fill_mask(r, e->mask_rows + (size_t)n * words);
        if (fin == RP_FINISH_REASON_NONE) {
            e->mask_of_row[st->logit_row[i]] = n++;
            continue;
        }
        /* its row is sampled unmasked and dropped: r has ended before it */
        rp_engine_constraint_end(e, r, st->out_index[i], fin, NULL);
    }
    e->stats.masked_rows_device += (uint64_t)n;
    return n;
}

int rp_engine_constraint_mask(rp_engine *e, rp_request *r, int k, float *logits) {
    const rp_finish fin = rp_engine_constraint_apply(e, r, logits);
    if (fin == RP_FINISH_REASON_NONE) return 0;
    rp_engine_constraint_end(e, r, k, fin, NULL);
    return 1;
}

int rp_engine_constraint_accept(rp_engine *e, rp_request *r, int k, int32_t tok) {
    if (rp_engine_constraint_take(r, tok) == 0) return 0;
    rp_engine_constraint_end(e, r, k, RP_FINISH_REASON_ERROR, rp_constraint_refused_msg);
    return 1;
}

int rp_engine_constraint_take(rp_request *r, int32_t tok) {
    if (!r->reasoning) return rp_smatcher_accept_token(r->matcher, tok);
    r->reasoning = tok != r->reasoning_end;
    return 0;
}

int rp_engine_constraint_drafts(rp_request *r) {
    const int32_t *draft = r->tokens + rp_request_len(r);
    int n = 0, taken = 0, reasoning = r->reasoning;
    for (; n < r->num_draft; n++) {
        if (reasoning) {
            reasoning = draft[n] != r->reasoning_end;
            continue;
        }
        if (rp_smatcher_accept_token(r->matcher, draft[n])) break;
        taken++;
    }
    rp_smatcher_rollback(r->matcher, taken);
    return n;
}

void rp_engine_constraint_free(rp_engine *e) {
    rp_svocab_free(e->svocab);
    free(e->mask);
    free(e->mask_rows);
    e->svocab = NULL;
    e->mask = NULL;
    e->mask_rows = NULL;
}
