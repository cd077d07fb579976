/* A generation request's life (session.h).
 *
 * A session's state is shared by the engine callbacks (engine thread) and
 * the HTTP side (a libmicrohttpd pool thread) under the session's own mutex,
 * and freed by whichever lets go last: the HTTP side holds one reference,
 * every submitted engine request one more until its final event. The
 * callback only appends to buffers and wakes the HTTP side; it never blocks
 * on the network.
 *
 * The HTTP side never blocks either: when it finds nothing to send it parks
 * (the waker's sleep, under the session's mutex: libmicrohttpd suspends the
 * connection) and the engine callback wakes it (resumes the connection) as
 * soon as there is something. A watcher (rp_sessions_watch, called every
 * few tens of milliseconds by the server) checks every session: a client
 * that hung up (POLLRDHUP on its socket), a stopping server or an answer
 * that ran out of memory aborts every choice at once, whether they wait,
 * prefill or decode, and the engine frees their KV pages at its next step.
 *
 * Out of memory: every append is checked. A choice whose text or chunk
 * cannot be added marks the session failed; the HTTP side aborts it and the
 * client gets a 500 or, streaming, the whole events so far, an error event
 * and [DONE] (a fixed text, when even that cannot be allocated). */
#include "server/session.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/chat_choice.h"
#include "server/openai_json.h"
#include "server/sbuf.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/rng.h"

/* What a stream ends with when there is no memory left to say it otherwise
 * (the JSON rp_oai_error_json writes for a 500 "out of memory"). */
static const char oom_stream_tail[] =
    "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n"
    "data: [DONE]\n\n";

/* ---- the server's gate --------------------------------------------------------- */

void rp_sessions_init(rp_sessions *h, rp_engine *eng, rp_metrics *metrics) {
    *h = (rp_sessions){.eng = eng, .metrics = metrics, .tok = rp_engine_tokenizer(eng),
                       .max_context = rp_engine_max_context(eng)};
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
}

void rp_sessions_destroy(rp_sessions *h) {
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
}

int rp_sessions_enter(rp_sessions *h) {
    pthread_mutex_lock(&h->mu);
    int ok = !h->stopping;
    if (ok) h->active++;
    pthread_mutex_unlock(&h->mu);
    return ok ? 0 : -1;
}

void rp_sessions_leave(rp_sessions *h) {
    pthread_mutex_lock(&h->mu);
    h->active--;
    pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
}

void rp_sessions_stop(rp_sessions *h) {
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_mutex_unlock(&h->mu);
}

int rp_sessions_wait_idle(rp_sessions *h, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_s >= 0) {
        long ns = ts.tv_nsec + (long)((timeout_s - (long)timeout_s) * 1e9);
        ts.tv_sec += (time_t)timeout_s + ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&h->mu);
    while (h->active > 0 && !rc) {
        if (timeout_s < 0) pthread_cond_wait(&h->idle, &h->mu);
        else if (pthread_cond_timedwait(&h->idle, &h->mu, &ts) != 0) rc = -1;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* What the client's socket says: still there; done sending (a FIN: it
 * shut down its write side, or closed); or gone (reset, error). Data
 * waiting to be read (a pipelined request) is still there. */
enum client_state { CLIENT_HERE, CLIENT_DONE_SENDING, CLIENT_GONE };

static enum client_state client_state(int fd) {
    if (fd < 0) return CLIENT_HERE;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return CLIENT_HERE;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return CLIENT_GONE;
    if (p.revents & POLLRDHUP) return CLIENT_DONE_SENDING;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return CLIENT_DONE_SENDING;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR ? CLIENT_GONE : CLIENT_HERE;
}

/* ---- one request's shared state ---------------------------------------------------- */

typedef struct session_choice {
    rp_session *r;
    int index;
    rp_request_id id;
    int submitted;
    rp_sbuf text;       /* non-streaming: the whole text, echo included */
    size_t text_bytes;  /* text so far (offsets of completions' logprobs) */
    json_t *logprobs;   /* non-streaming with logprobs: the response's logprobs object */
    json_t *prompt_lp;  /* vLLM's prompt_logprobs list, once its first event brought them */
    char *echo_pending; /* streaming echo with logprobs: the echo, sent with the prompt's logprobs */
    rp_chat_parsing parsing;     /* with r->parse: how its text is split */
    rp_chat_stream *chat_stream; /* streaming with r->parse: its parsers' state */
    rp_finish finish;
    char error[256];
    int completion_tokens;
    int cached_tokens; /* of its prompt's tokens, those its admission found in the prefix cache */
    double t_submit, t_last;
    int tokens;
} session_choice;

struct rp_session {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    rp_sessions *h;
    rp_oai_response resp;
    int stream, include_usage, logprobs;
    int echo_logprobs;   /* a completion's echo with logprobs: the prompt's tokens lead its logprobs */
    int prompt_logprobs; /* vLLM's prompt_logprobs = N, or -1 */
    int num_choices, n_done, prompt_tokens;
    int n; /* choices per prompt: choice k*n+i is prompt k's i-th */
    int parse; /* chat with a tool-call or reasoning parser: choices go through chat_choice.c */
    session_choice *ch;
    rp_sbuf out; /* streaming: SSE bytes not yet read */
    size_t out_off;
    const char *tail; /* streaming: sent after out when its end could not be added to it */
    size_t tail_off;
    int all_done;
    int failed;   /* memory ran out for the answer: abort, answer 500 */
    int aborted;  /* rp_engine_abort was called for every choice */
    int shutdown; /* ... because the server is stopping */
    int gone;     /* the client hung up: nobody to answer */
    int half_closed; /* the client's FIN came with its request: it waits for the answer */
    int fd;       /* the client's socket, to notice a hang-up; -1 once the HTTP side let go */
    double first_token_s; /* the first token of any choice (the access line's TTFT); 0: none */
    rp_session_waker waker;
    int parked;   /* the HTTP side sleeps until waker.wake */
    rp_session *prev, *next; /* rp_sessions' list, under its mu */
};

static void session_unref(rp_session *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    rp_sessions *h = r->h;
    pthread_mutex_lock(&h->mu);
    if (r->prev) r->prev->next = r->next;
    else h->head = r->next;
    if (r->next) r->next->prev = r->prev;
    h->pending_choices -= r->num_choices - r->n_done; /* those never submitted */
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < r->num_choices; i++) {
        rp_sbuf_free(&r->ch[i].text);
        json_decref(r->ch[i].logprobs);
        json_decref(r->ch[i].prompt_lp);
        free(r->ch[i].echo_pending);
        rp_chat_stream_free(r->ch[i].chat_stream);
    }
    free(r->ch);
    rp_sbuf_free(&r->out);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    rp_sessions_leave(h); /* the engine no longer calls into this session */
}

/* Aborts every choice still running. Called without r->mu: the engine may
 * be delivering an event that takes it. */
static void session_abort(rp_session *r, int shutdown) {
    pthread_mutex_lock(&r->mu);
    int already = r->aborted;
    r->aborted = 1;
    if (shutdown) r->shutdown = 1;
    pthread_mutex_unlock(&r->mu);
    if (already) return;
    for (int i = 0; i < r->num_choices; i++)
        if (r->ch[i].submitted) rp_engine_abort(r->h->eng, r->ch[i].id);
}

/* A prompt's tokens count once in usage, whatever n, so its cached tokens
 * do too: its first choice's. The n choices of a prompt share one prefill
 * (the others wait for it and find the prompt cached), so the first one's
 * count says what computing the prompt was spared; summing the others'
 * would report more cached tokens than the prompt has. */
static int cached_tokens(const rp_session *r) {
    int cached = 0;
    for (int i = 0; i < r->num_choices; i += r->n) cached += r->ch[i].cached_tokens;
    return cached;
}

static json_t *usage_json(const rp_session *r) {
    int completion = 0;
    for (int i = 0; i < r->num_choices; i++) completion += r->ch[i].completion_tokens;
    return rp_oai_usage(r->prompt_tokens, cached_tokens(r), completion);
}

/* How the session ended once every choice is done: 0 (the answer), or -1
 * with the error the client gets. */
static int session_outcome(const rp_session *r, rp_oai_error *e) {
    if (r->failed) return rp_oai_set_out_of_memory(e);
    for (int i = 0; i < r->num_choices; i++)
        if (r->ch[i].finish == RP_FINISH_REASON_ERROR) {
            rp_oai_set_error(e, 500, "server_error", NULL, NULL, "%s", r->ch[i].error[0] ? r->ch[i].error : "engine error");
            return -1;
        }
    for (int i = 0; i < r->num_choices; i++)
        if (r->ch[i].finish == RP_FINISH_REASON_ABORT) {
            rp_oai_set_error(e, 503, "service_unavailable", NULL, NULL, "%s",
                             r->shutdown ? "the server is shutting down" : "the request was aborted");
            return -1;
        }
    return 0;
}

/* Streaming: what follows the last choice's end (vLLM's way: an error
 * event, or the usage chunk when asked; then [DONE]). */
static void stream_end(rp_session *r) {
    rp_oai_error e;
    size_t mark = r->out.len;
    int rc = 0;
    if (session_outcome(r, &e)) rc = rp_oai_sse_add(&r->out, rp_oai_error_object(&e));
    else if (r->include_usage) rc = rp_oai_sse_add(&r->out, rp_oai_usage_chunk(&r->resp, usage_json(r)));
    if (rc || rp_sbuf_add_str(&r->out, "data: [DONE]\n\n")) {
        rp_sbuf_truncate(&r->out, mark);
        r->tail = oom_stream_tail;
    }
}

/* The prompt's logprobs, which come with a choice's first event: vLLM's
 * prompt_logprobs list, and an echo's logprobs (streaming: the echo's
 * chunk, held back until now). -1 when memory ran out. */
static int add_prompt_logprobs(rp_session *r, session_choice *c, const rp_token_event *ev) {
    const rp_oai_response *resp = &r->resp;
    if (r->prompt_logprobs >= 0 &&
        !(c->prompt_lp = rp_oai_prompt_logprobs_json(resp, ev->prompt_logprobs, ev->prompt_tokens, r->prompt_logprobs)))
        return -1;
    if (!r->echo_logprobs) return 0;
    size_t offset = 0;
    if (!r->stream) return rp_oai_logprobs_add_prompt(resp, c->logprobs, ev->prompt_logprobs, ev->prompt_tokens, &offset);
    json_t *lp = rp_oai_logprobs_new(resp);
    if (!lp || rp_oai_logprobs_add_prompt(resp, lp, ev->prompt_logprobs, ev->prompt_tokens, &offset)) {
        json_decref(lp);
        return -1;
    }
    const char *echo = c->echo_pending ? c->echo_pending : "";
    return rp_oai_sse_add(&r->out, rp_oai_chunk(resp, c->index, echo, strlen(echo), RP_FINISH_REASON_NONE, lp));
}

/* Adds one event's text and logprobs to the answer; -1 when memory ran out
 * (a chunk is added whole or not at all). */
static int add_event(rp_session *r, session_choice *c, const rp_token_event *ev) {
    const rp_oai_response *resp = &r->resp;
    int with_logprobs = r->logprobs && ev->token >= 0;
    if (ev->prompt_logprobs && add_prompt_logprobs(r, c, ev)) return -1;
    if (r->stream) {
        /* a chunk per token, as OpenAI streams (empty text while it is held
         * back for a stop string or an unfinished character) */
        if (ev->token < 0 && !ev->text_len && ev->finish == RP_FINISH_REASON_NONE) return 0;
        json_t *lp = NULL;
        if (with_logprobs &&
            (!(lp = rp_oai_logprobs_new(resp)) || rp_oai_logprobs_add(resp, lp, ev, c->text_bytes))) {
            json_decref(lp);
            return -1;
        }
        if (c->chat_stream) { /* the parsers decide the chunks; the finish comes after their rest */
            size_t mark = r->out.len;
            int rc = rp_chat_stream_feed(c->chat_stream, ev->text, ev->text_len, lp, &r->out);
            if (!rc && ev->finish != RP_FINISH_REASON_NONE)
                rc = rp_chat_stream_finish(c->chat_stream, ev->finish, &r->out);
            if (rc) rp_sbuf_truncate(&r->out, mark);
            return rc;
        }
        return rp_oai_sse_add(&r->out, rp_oai_chunk(resp, c->index, ev->text, ev->text_len, ev->finish, lp));
    }
    if (with_logprobs && rp_oai_logprobs_add(resp, c->logprobs, ev, c->text_bytes)) return -1;
    return rp_sbuf_add(&c->text, ev->text, ev->text_len);
}

/* r->mu held: the HTTP side, parked, has something to do. */
static void wake(rp_session *r) {
    if (!r->parked) return;
    r->parked = 0;
    r->waker.wake(r->waker.arg);
}

/* Engine thread: one event of one choice. Kept short: it runs between
 * engine steps. */
static void on_event(void *user, const rp_token_event *ev) {
    session_choice *c = user;
    rp_session *r = c->r;
    rp_metrics *m = r->h->metrics;
    double now = rp_now_s();
    pthread_mutex_lock(&r->mu);
    c->completion_tokens = ev->completion_tokens;
    c->cached_tokens = ev->cached_tokens;
    if (ev->token >= 0) {
        if (!r->first_token_s) r->first_token_s = now;
        if (c->tokens++ == 0) rp_metrics_observe_ttft(m, now - c->t_submit);
        else rp_metrics_observe_itl(m, now - c->t_last);
        c->t_last = now;
    }
    int ended_badly = ev->finish == RP_FINISH_REASON_ABORT || ev->finish == RP_FINISH_REASON_ERROR;
    if (!ended_badly && !r->failed) {
        /* continuous usage: this choice's numbers so far, in its chunks */
        r->resp.usage_prompt_tokens = ev->prompt_tokens;
        r->resp.usage_cached_tokens = ev->cached_tokens;
        r->resp.usage_completion_tokens = ev->completion_tokens;
        if (add_event(r, c, ev)) {
            r->failed = 1; /* the HTTP side aborts the session within a wait slice */
            rp_log_error("out of memory answering %s", r->resp.id);
        }
        c->text_bytes += ev->text_len;
    }
    int final = ev->finish != RP_FINISH_REASON_NONE;
    if (final) {
        c->finish = ev->finish;
        if (ev->error) snprintf(c->error, sizeof c->error, "%s", ev->error);
        rp_metrics_count_finish(m, ev->finish);
        if (!ended_badly) rp_metrics_observe_e2e(m, now - c->t_submit);
        if (++r->n_done == r->num_choices) {
            r->all_done = 1;
            if (r->stream) stream_end(r);
        }
    }
    if (r->all_done || (r->stream && r->out.len > r->out_off)) wake(r);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (final) {
        pthread_mutex_lock(&r->h->mu);
        r->h->pending_choices--;
        pthread_mutex_unlock(&r->h->mu);
    }
    if (final) session_unref(r); /* the engine's reference for this choice */
}

/* What the watcher does with one session (r->mu held): 1 when it must be
 * aborted.
 *
 * A FIN is a hang-up only for a non-streaming request whose client was
 * still sending when the request was read. A half-close cannot be told from
 * a close by the socket alone: a stream keeps going (a client that closed
 * altogether answers its next bytes with a reset, CLIENT_GONE), and a
 * client whose FIN came with its request (it shut down its write side
 * after sending) waits for its answer; a later FIN on a non-streaming
 * request, which writes nothing before its end, is a client that left. */
static int needs_abort(rp_session *r, int stopping) {
    if (r->aborted || r->all_done) return 0;
    enum client_state st = client_state(r->fd);
    if (st == CLIENT_GONE || (st == CLIENT_DONE_SENDING && !r->stream && !r->half_closed)) {
        r->gone = 1;
        wake(r); /* a parked HTTP side closes the connection */
        return 1;
    }
    if (stopping) r->shutdown = 1;
    return stopping || r->failed;
}

void rp_sessions_watch(rp_sessions *h) {
    enum { BATCH = 64 }; /* the rest at the next call */
    rp_session *todo[BATCH];
    int n = 0;
    pthread_mutex_lock(&h->mu);
    for (rp_session *r = h->head; r && n < BATCH; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (needs_abort(r, h->stopping)) {
            r->refs++; /* held past h->mu, dropped below */
            todo[n++] = r;
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < n; i++) {
        session_abort(todo[i], 0);
        session_unref(todo[i]);
    }
}

/* ---- the HTTP side ---------------------------------------------------------------- */

/* Whether the engine's queue is full: choices admitted and not finished,
 * less those running. Counted here, not from the engine's waiting count
 * alone, so a burst is refused before the engine thread has seen it. */
static int queue_full(rp_sessions *h) {
    if (h->max_queued_requests <= 0) return 0;
    rp_engine_stats st;
    rp_engine_get_stats(h->eng, &st);
    pthread_mutex_lock(&h->mu);
    int full = h->pending_choices - st.running >= h->max_queued_requests;
    pthread_mutex_unlock(&h->mu);
    return full;
}

rp_session *rp_session_new(rp_sessions *h, const rp_oai_request *q, int client_fd, const rp_session_waker *waker,
                           rp_oai_error *err) {
    if (queue_full(h)) {
        rp_metrics_count_rejected(h->metrics);
        rp_oai_set_error(err, 503, "service_unavailable", NULL, "queue_full",
                         "too many requests are waiting (--max-queued-requests %d): retry later",
                         h->max_queued_requests);
        return NULL;
    }
    if (rp_sessions_enter(h)) {
        rp_oai_set_error(err, 503, "service_unavailable", NULL, NULL, "the server is shutting down");
        return NULL;
    }
    rp_session *r = calloc(1, sizeof *r);
    int nc = q->num_prompts * q->n;
    if (r) r->ch = calloc((size_t)nc, sizeof *r->ch);
    if (!r || !r->ch) {
        free(r);
        rp_sessions_leave(h);
        rp_oai_set_out_of_memory(err);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1; /* the HTTP side's */
    r->h = h;
    r->stream = q->stream;
    r->include_usage = q->include_usage;
    r->logprobs = q->logprobs;
    r->echo_logprobs = q->echo_logprobs;
    r->prompt_logprobs = q->prompt_logprobs;
    r->num_choices = nc;
    r->n = q->n;
    r->fd = client_fd;
    r->half_closed = client_state(client_fd) == CLIENT_DONE_SENDING;
    r->waker = *waker;
    rp_oai_response *resp = &r->resp;
    resp->kind = q->kind;
    resp->created = (long)time(NULL);
    resp->tok = h->tok;
    resp->top_logprobs = q->logprobs ? q->params.top_logprobs : 0;
    snprintf(resp->model, sizeof resp->model, "%s", q->model);
    pthread_mutex_lock(&h->mu);
    uint64_t rid = ++h->next_id;
    h->pending_choices += nc;
    r->next = h->head;
    if (h->head) h->head->prev = r;
    h->head = r;
    pthread_mutex_unlock(&h->mu);
    /* the client's X-Request-Id names the completion (as vLLM's), else one is made */
    if (q->request_id[0])
        snprintf(resp->id, sizeof resp->id, "%s-%s", q->kind == RP_OAI_CHAT ? "chatcmpl" : "cmpl", q->request_id);
    else
        snprintf(resp->id, sizeof resp->id, "%s-%016llx", q->kind == RP_OAI_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)rp_mix64(rid ^ ((uint64_t)resp->created << 20)));
    resp->continuous_usage = q->stream && q->continuous_usage;
    int failed = 0;
    r->parse = q->kind == RP_OAI_CHAT && (q->parse_tools || q->parse_reasoning || q->forced_tools);
    rp_chat_parsing parsing = {.tools = q->parse_tools, .tool_parser = q->tool_parser,
                               .reasoning = q->parse_reasoning, .reasoning_kind = q->reasoning_parser,
                               .forced = q->forced_tools, .id_style = q->tool_parser,
                               .single_call = q->single_call};
    memcpy(parsing.forced_name, q->forced_name, sizeof parsing.forced_name);
    if (r->parse && q->prompt_texts[0]) /* where the rendered prompt leaves the model */
        parsing.prompt_state = rp_reasoning_prompt_state(q->prompt_texts[0], strlen(q->prompt_texts[0]));
    /* tool-call ids: reproducible with the request's seed, else differing per request */
    uint64_t id_seed = q->params.has_seed ? rp_mix64(q->params.seed ^ 0x7001ca11ULL)
                                          : rp_mix64(rid ^ (uint64_t)resp->created);
    for (int i = 0; i < nc; i++) {
        session_choice *c = &r->ch[i];
        c->r = r;
        c->index = i;
        if (q->logprobs && !q->stream && !(c->logprobs = rp_oai_logprobs_new(resp))) failed = 1;
        if (!r->parse) continue;
        c->parsing = parsing;
        c->parsing.id_seed = rp_mix64(id_seed + (uint64_t)i);
        if (q->stream && !(c->chat_stream = rp_chat_stream_new(resp, &c->parsing, i))) failed = 1;
    }
    if (failed) {
        session_unref(r);
        rp_oai_set_out_of_memory(err);
        return NULL;
    }
    return r;
}

int rp_session_streaming(const rp_session *s) { return s->stream; }

static int engine_fail(rp_error *err, rp_error_code code, const char *param, const char *msg) {
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param);
    snprintf(err->message, sizeof err->message, "%s", msg);
    return -1;
}

/* truncate_prompt_tokens: only the prompt's last tokens are kept (BOS
 * included in the count, as vLLM cuts the encoded prompt). */
static void truncate_prompt(const rp_oai_request *q, int32_t **ids, size_t *n, int own) {
    size_t keep = (size_t)q->truncate_prompt_tokens;
    if (!keep || *n <= keep) return;
    if (own) memmove(*ids, *ids + (*n - keep), keep * sizeof **ids);
    else *ids += *n - keep; /* the request's own ids: a view of their end */
    *n = keep;
}

/* Prompt k as token ids: given, or the text encoded (completions add BOS as
 * HF's tokenizer(text) does; a chat template writes its own). *own says
 * whether *ids must be freed. */
static int prompt_ids(const rp_session *r, const rp_oai_request *q, int k, int32_t **ids, size_t *n, int *own,
                      rp_error *err) {
    *own = 0;
    if (!q->prompt_texts[k]) {
        *ids = q->prompt_ids[k];
        *n = (size_t)q->num_prompt_ids[k];
        truncate_prompt(q, ids, n, *own);
        return 0;
    }
    const rp_tokenizer *tok = r->h->tok;
    rp_err te;
    if (rp_tokenizer_encode(tok, q->prompt_texts[k], strlen(q->prompt_texts[k]), ids, n, &te))
        return engine_fail(err, RP_ERROR_INVALID_REQUEST, "prompt", te.msg);
    *own = 1;
    int bos = rp_tokenizer_bos_id(tok);
    if (q->kind == RP_OAI_COMPLETION && bos >= 0 && (*n == 0 || (*ids)[0] != bos)) {
        int32_t *w = malloc((*n + 1) * sizeof *w);
        if (!w) {
            free(*ids);
            *own = 0;
            return engine_fail(err, RP_ERROR_OUT_OF_MEMORY, "", "out of memory");
        }
        w[0] = bos;
        memcpy(w + 1, *ids, *n * sizeof **ids);
        free(*ids);
        *ids = w;
        (*n)++;
    }
    truncate_prompt(q, ids, n, *own);
    return 0;
}

/* echo: prompt k's text leads each of its choices (also for token ids,
 * decoded; without a tokenizer there is no text). */
static int add_echo(rp_session *r, const rp_oai_request *q, int k, const int32_t *ids, size_t n, rp_error *err) {
    char *decoded = NULL;
    /* a truncated prompt echoes what was fed */
    const char *echo = q->truncate_prompt_tokens ? NULL : q->prompt_texts[k];
    if (!echo && r->h->tok) {
        rp_err de;
        if (rp_tokenizer_decode(r->h->tok, ids, n, 0, &decoded, NULL, &de))
            return engine_fail(err, RP_ERROR_INVALID_REQUEST, "prompt", de.msg);
        echo = decoded;
    }
    int rc = 0;
    /* the choices of earlier prompts already run: their events add to r->out too */
    pthread_mutex_lock(&r->mu);
    r->resp.usage_prompt_tokens = (int)n;
    r->resp.usage_cached_tokens = r->resp.usage_completion_tokens = 0;
    for (int i = 0; echo && !rc && i < q->n; i++) {
        session_choice *c = &r->ch[k * q->n + i];
        size_t len = strlen(echo);
        if (r->stream && r->echo_logprobs) rc = (c->echo_pending = strdup(echo)) ? 0 : -1; /* sent with its logprobs */
        else if (r->stream) rc = rp_oai_sse_add(&r->out, rp_oai_chunk(&r->resp, c->index, echo, len, RP_FINISH_REASON_NONE, NULL));
        else rc = rp_sbuf_add(&c->text, echo, len);
        c->text_bytes += len;
    }
    pthread_mutex_unlock(&r->mu);
    free(decoded);
    /* the server's own memory: mapped to a 500 like an internal failure */
    return rc ? engine_fail(err, RP_ERROR_INTERNAL, "", "out of memory") : 0;
}

/* Submits every choice of prompt k (ids): choice k*n+i with seed seed+i. */
static int submit_prompt(rp_session *r, const rp_oai_request *q, int k, const int32_t *ids, size_t n, rp_error *err) {
    rp_request_params p = q->params;
    p.prompt = NULL;
    p.prompt_ids = ids;
    p.num_prompt_ids = (int)n;
    if (q->kind == RP_OAI_CHAT && !q->max_tokens_set) { /* what fits the context, as vLLM */
        long room = (long)r->h->max_context - (long)n;
        p.max_tokens = room > 0 ? (int)room : 1; /* the engine rejects a prompt that fills the context */
    }
    for (int i = 0; i < q->n; i++) {
        session_choice *c = &r->ch[k * q->n + i];
        if (q->n > 1 && q->params.has_seed) p.seed = q->params.seed + (uint64_t)i; /* distinct, reproducible */
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the engine's, dropped at this choice's final event */
        pthread_mutex_unlock(&r->mu);
        c->t_submit = rp_now_s();
        if (rp_engine_submit(r->h->eng, &p, on_event, c, &c->id, err)) {
            pthread_mutex_lock(&r->mu);
            r->refs--;
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        c->submitted = 1;
    }
    return 0;
}

int rp_session_submit(rp_session *r, const rp_oai_request *q, rp_oai_error *err) {
    rp_error eerr = {0};
    int rc = 0;
    for (int k = 0; k < q->num_prompts && !rc; k++) {
        int32_t *ids;
        size_t n;
        int own;
        if (prompt_ids(r, q, k, &ids, &n, &own, &eerr)) {
            rc = -1;
            break;
        }
        r->prompt_tokens += (int)n;
        r->resp.usage_prompt_tokens = (int)n; /* chat has one prompt: nothing runs yet */
        for (int i = 0; r->stream && q->kind == RP_OAI_CHAT && i < r->num_choices; i++)
            if (rp_oai_sse_add(&r->out, rp_oai_role_chunk(&r->resp, i))) { /* each choice starts with the role */
                if (own) free(ids);
                return rp_oai_set_out_of_memory(err);
            }
        rc = q->echo ? add_echo(r, q, k, ids, n, &eerr) : 0;
        if (!rc) rc = submit_prompt(r, q, k, ids, n, &eerr);
        if (own) free(ids);
    }
    if (!rc) return 0;
    session_abort(r, 0);
    /* the choices already submitted end with ABORT; then r is the HTTP side's alone */
    pthread_mutex_lock(&r->mu);
    while (r->refs > 1) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    rp_oai_engine_error(err, &eerr, q);
    return -1;
}

/* The non-streaming answer, once every choice is done. */
static json_t *final_json(const rp_session *r) {
    json_t *choices = json_array();
    for (int i = 0; i < r->num_choices; i++) {
        const session_choice *c = &r->ch[i];
        json_t *lp = c->logprobs ? json_incref(c->logprobs) : NULL;
        const char *text = c->text.p ? c->text.p : "";
        json_t *choice = r->parse ? rp_chat_choice_json(&c->parsing, i, text, c->text.len, lp, c->finish)
                                  : rp_oai_choice(&r->resp, i, text, c->text.len, lp, c->finish);
        /* vLLM's prompt_logprobs: a completion's in each choice (its prompt's) */
        if (json_array_append_new(choices, choice) ||
            (r->resp.kind == RP_OAI_COMPLETION && r->prompt_logprobs >= 0 &&
             json_object_set(choice, "prompt_logprobs", c->prompt_lp ? c->prompt_lp : json_null()))) {
            json_decref(choices);
            return NULL;
        }
    }
    json_t *answer = rp_oai_completion(&r->resp, choices, usage_json(r));
    /* ... and a chat's beside its choices (one prompt) */
    if (answer && r->resp.kind == RP_OAI_CHAT && r->prompt_logprobs >= 0 &&
        json_object_set(answer, "prompt_logprobs", r->ch[0].prompt_lp ? r->ch[0].prompt_lp : json_null())) {
        json_decref(answer);
        return NULL;
    }
    return answer;
}

int rp_session_wait(rp_session *r, json_t **out, rp_oai_error *err) {
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    int rc;
    if (r->gone) rc = 1; /* nobody to answer */
    else if (!r->all_done) {
        r->parked = 1;
        r->waker.sleep(r->waker.arg);
        rc = RP_SESSION_PARKED;
    } else if (!(rc = session_outcome(r, err)) && !(*out = final_json(r)))
        rc = rp_oai_set_out_of_memory(err);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

long rp_session_read(rp_session *r, char *buf, size_t max) {
    long n = 0;
    pthread_mutex_lock(&r->mu);
    size_t avail = r->out.len - r->out_off;
    size_t tail = r->all_done && r->tail ? strlen(r->tail + r->tail_off) : 0;
    if (r->gone) n = -1;
    else if (avail) {
        size_t k = avail < max ? avail : max;
        memcpy(buf, r->out.p + r->out_off, k);
        r->out_off += k;
        if (r->out_off == r->out.len) { /* all sent: reuse the buffer */
            rp_sbuf_truncate(&r->out, 0);
            r->out_off = 0;
        }
        n = (long)k;
    } else if (tail) {
        size_t k = tail < max ? tail : max;
        memcpy(buf, r->tail + r->tail_off, k);
        r->tail_off += k;
        n = (long)k;
    } else if (!r->all_done) {
        r->parked = 1;
        r->waker.sleep(r->waker.arg);
        n = RP_SESSION_PARKED;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

void rp_session_release(rp_session *r) {
    pthread_mutex_lock(&r->mu);
    int running = !r->all_done;
    r->fd = -1; /* the socket may close and its number be reused */
    r->parked = 0;
    pthread_mutex_unlock(&r->mu);
    if (running) session_abort(r, 0);
    session_unref(r);
}

void rp_session_hold(rp_session *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

void rp_session_summary_get(rp_session *r, rp_session_summary *out) {
    pthread_mutex_lock(&r->mu);
    snprintf(out->id, sizeof out->id, "%s", r->resp.id);
    out->prompt_tokens = r->prompt_tokens;
    out->cached_tokens = cached_tokens(r);
    out->completion_tokens = 0;
    for (int i = 0; i < r->num_choices; i++) out->completion_tokens += r->ch[i].completion_tokens;
    out->first_token_s = r->first_token_s;
    pthread_mutex_unlock(&r->mu);
}
