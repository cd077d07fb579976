/* HTTP glue: routing, bodies, authentication, and the bridge between engine
 * events (engine thread) and responses (HTTP threads).
 *
 * libmicrohttpd runs a thread per connection, so a handler may block until
 * its request is done (non-streaming) and a streaming response's reader may
 * block until the next event. Each generation request's state (srv_req) is
 * shared by the engine callbacks and the HTTP side under its own mutex and
 * freed by whichever lets go last: the HTTP side holds one reference, every
 * submitted engine request one more until its final event.
 *
 * Waiting is done in short slices: between slices the HTTP side checks
 * whether the client hung up (poll for POLLRDHUP on the connection's socket)
 * and whether the server is shutting down, so a client that disconnects
 * while its request waits, prefills or decodes has it aborted within a
 * slice, not when the next write fails; the engine frees its KV pages at
 * the next step.
 *
 * Shutdown (rp_server_stop): stop accepting, refuse new requests with 503,
 * abort what runs (streams end with an error event and [DONE]), wait until
 * no HTTP thread uses the engine, then stop the daemon. The caller destroys
 * the engine afterwards. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/rng.h"

#define WAIT_SLICE_MS 20

struct rp_server {
    rp_engine *eng;
    rp_server_config cfg;
    char served_model[256];
    char api_key[256];
    int port;
    struct MHD_Daemon *daemon;
    rp_oai_context oai;
    rp_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int stopping; /* under mu; also read without it as a hint between wait slices */
    int active;   /* HTTP requests that may still touch the engine, under mu */
    uint64_t next_id;
};

/* ---- small growable buffer ------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) return; /* out of memory: drop the text rather than crash */
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_json_event(sbuf *b, json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!s) return;
    sb_add(b, "data: ", 6);
    sb_add(b, s, strlen(s));
    sb_add(b, "\n\n", 2);
    free(s);
}

/* ---- server-wide bookkeeping -------------------------------------------------- */

/* A request that may use the engine starts here; refused while stopping. */
static int server_enter(rp_server *s) {
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping;
    if (ok) s->active++;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -1;
}

static void server_leave(rp_server *s) {
    pthread_mutex_lock(&s->mu);
    s->active--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

static int server_stopping(rp_server *s) {
    pthread_mutex_lock(&s->mu);
    int v = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return v;
}

/* Whether the peer closed its side (or the socket failed). Data waiting to
 * be read (a pipelined request) is not a hang-up. */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return 1;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int connection_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* ---- one generation request's shared state ----------------------------------------- */

typedef struct srv_req srv_req;
typedef struct srv_choice {
    srv_req *r;
    int index;
    rp_request_id id;
    int submitted;
    sbuf text;          /* non-streaming: the whole text, echo included */
    size_t text_bytes;  /* text so far (offsets of completions' logprobs) */
    json_t *logprobs;   /* non-streaming with logprobs: the response's logprobs object */
    rp_finish finish;
    char error[256];
    int completion_tokens;
    double t_submit, t_last;
    int tokens;
    int done;
} srv_choice;

struct srv_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    rp_server *s;
    const rp_tokenizer *tok;
    rp_oai_kind kind;
    int stream, include_usage, logprobs;
    int top_logprobs; /* alternatives per token (chat: top_logprobs; completions: logprobs = N) */
    char id[48];
    long created;
    char model[256];
    int num_choices, n_done, prompt_tokens;
    srv_choice *ch;
    sbuf out; /* streaming: SSE bytes for the client */
    size_t out_off;
    int all_done;
    int aborted;  /* rp_engine_abort was called for every choice */
    int shutdown; /* ... because the server is stopping */
    int fd;       /* the client's socket, to notice a hang-up */
    double last_check;
};

static void req_unref(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    rp_server *s = r->s;
    for (int i = 0; i < r->num_choices; i++) {
        free(r->ch[i].text.p);
        json_decref(r->ch[i].logprobs);
    }
    free(r->ch);
    free(r->out.p);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
    server_leave(s); /* the engine no longer calls into this request */
}

/* Aborts every choice still running. Called without r->mu: the engine may
 * be delivering an event that takes it. */
static void req_abort(srv_req *r, int shutdown) {
    pthread_mutex_lock(&r->mu);
    int already = r->aborted;
    r->aborted = 1;
    if (shutdown) r->shutdown = 1;
    pthread_mutex_unlock(&r->mu);
    if (already) return;
    for (int i = 0; i < r->num_choices; i++)
        if (r->ch[i].submitted) rp_engine_abort(r->s->eng, r->ch[i].id);
}

static json_t *usage_json(const srv_req *r) {
    int completion = 0;
    for (int i = 0; i < r->num_choices; i++) completion += r->ch[i].completion_tokens;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", r->prompt_tokens, "completion_tokens", completion,
                     "total_tokens", r->prompt_tokens + completion);
}

static const char *finish_name(rp_finish f) {
    return f == RP_FINISH_REASON_STOP ? "stop" : f == RP_FINISH_REASON_LENGTH ? "length" : NULL;
}

/* A logprob as JSON; -inf (a token the sampler could not have drawn) is
 * written as -9999.0, as vLLM does, since JSON has no infinity. */
static json_t *lp_real(float lp) { return json_real(isfinite(lp) ? (double)lp : -9999.0); }

/* The token's text for logprobs: its bytes (maybe part of a character). */
static json_t *token_text(const rp_tokenizer *tok, int32_t id, const char **bytes, size_t *len) {
    *bytes = NULL;
    *len = 0;
    if (tok && rp_tokenizer_token_bytes(tok, id, bytes, len) == 0) return rp_oai_json_text(*bytes, *len);
    char name[32];
    snprintf(name, sizeof name, "token_id:%d", id); /* no tokenizer: vLLM's form for ids */
    return json_string(name);
}

/* Chat: {token, logprob, bytes} of one token. */
static json_t *chat_lp_item(const srv_req *r, int32_t tok_id, float lp) {
    const char *b;
    size_t n;
    json_t *t = token_text(r->tok, tok_id, &b, &n), *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)b[i]));
    return json_pack("{s:o, s:o, s:o}", "token", t, "logprob", lp_real(lp), "bytes", bytes);
}

/* Chat: one entry of logprobs.content: the sampled token and, in
 * top_logprobs, the most likely ones (most likely first). */
static json_t *chat_lp_entry(const srv_req *r, const rp_token_event *ev) {
    json_t *e = chat_lp_item(r, ev->token, ev->logprob), *top = json_array();
    for (int i = 0; i < ev->num_top_logprobs && i < r->top_logprobs; i++)
        json_array_append_new(top, chat_lp_item(r, ev->top_ids[i], ev->top_logprobs[i]));
    json_object_set_new(e, "top_logprobs", top);
    return e;
}

/* Completions: the logprobs object, empty, to which tokens are appended.
 * top_logprobs is a list (one {text: logprob} object per token) when
 * logprobs = N > 0, else null, as vLLM. */
static json_t *cmpl_lp_new(const srv_req *r) {
    return json_pack("{s:[], s:[], s:[], s:o}", "tokens", "token_logprobs", "text_offset", "top_logprobs",
                     r->top_logprobs > 0 ? json_array() : json_null());
}

/* {text: logprob} keeps the first entry of a text (two ids may share one). */
static void cmpl_top_add(const srv_req *r, json_t *obj, int32_t tok_id, float lp) {
    const char *b;
    size_t n;
    json_t *t = token_text(r->tok, tok_id, &b, &n);
    const char *key = json_string_value(t);
    size_t key_len = json_string_length(t);
    if (!json_object_getn(obj, key, key_len)) json_object_setn_new(obj, key, key_len, lp_real(lp));
    json_decref(t);
}

static void cmpl_lp_append(const srv_req *r, json_t *obj, const rp_token_event *ev, size_t offset) {
    const char *b;
    size_t n;
    json_array_append_new(json_object_get(obj, "tokens"), token_text(r->tok, ev->token, &b, &n));
    json_array_append_new(json_object_get(obj, "token_logprobs"), lp_real(ev->logprob));
    json_array_append_new(json_object_get(obj, "text_offset"), json_integer((json_int_t)offset));
    json_t *tops = json_object_get(obj, "top_logprobs");
    if (json_is_array(tops)) {
        /* the N most likely, then the sampled token (OpenAI: up to N + 1 entries) */
        json_t *top = json_object();
        for (int i = 0; i < ev->num_top_logprobs && i < r->top_logprobs; i++)
            cmpl_top_add(r, top, ev->top_ids[i], ev->top_logprobs[i]);
        cmpl_top_add(r, top, ev->token, ev->logprob);
        json_array_append_new(tops, top);
    }
}

static json_t *chunk_json(const srv_req *r, json_t *choice) {
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
                     r->kind == RP_OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->created, "model", r->model, "choices", choice);
}

/* One streamed chunk of a choice: text (may be empty), finish, logprobs. */
static json_t *stream_chunk(const srv_req *r, int index, const char *text, size_t len, const char *finish,
                            json_t *logprobs) {
    json_t *fin = finish ? json_string(finish) : json_null(), *lp = logprobs ? logprobs : json_null();
    json_t *choice;
    if (r->kind == RP_OAI_CHAT) {
        json_t *delta = finish && len == 0 ? json_object() : json_pack("{s:o}", "content", rp_oai_json_text(text, len));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs", lp, "finish_reason", fin);
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text", rp_oai_json_text(text, len), "logprobs", lp,
                           "finish_reason", fin);
    }
    return chunk_json(r, choice);
}

/* Streaming: what follows the last choice's end. */
static void stream_end(srv_req *r) {
    const char *error = NULL;
    int status = 500;
    for (int i = 0; i < r->num_choices && !error; i++) {
        if (r->ch[i].finish == RP_FINISH_REASON_ERROR) error = r->ch[i].error[0] ? r->ch[i].error : "engine error";
        else if (r->ch[i].finish == RP_FINISH_REASON_ABORT) error = "the request was aborted", status = 503;
    }
    if (error) { /* vLLM's way: an error event in the stream, then [DONE] */
        rp_oai_error e;
        rp_oai_set_error(&e, status, status == 503 ? "service_unavailable" : "server_error", NULL, NULL, "%s",
                         r->shutdown ? "the server is shutting down" : error);
        char *j = rp_oai_error_json(&e);
        if (j) {
            sb_add(&r->out, "data: ", 6);
            sb_add(&r->out, j, strlen(j));
            sb_add(&r->out, "\n\n", 2);
            free(j);
        }
    } else if (r->include_usage) {
        json_t *u = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
                              r->kind == RP_OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)r->created, "model", r->model, "choices", "usage", usage_json(r));
        sb_json_event(&r->out, u);
    }
    sb_add(&r->out, "data: [DONE]\n\n", 14);
}

/* Engine thread: one event of one choice. Kept short: it runs between
 * engine steps. */
static void on_event(void *user, const rp_token_event *ev) {
    srv_choice *c = user;
    srv_req *r = c->r;
    rp_metrics *m = r->s->metrics;
    double now = rp_now_s();
    pthread_mutex_lock(&r->mu);
    c->completion_tokens = ev->completion_tokens;
    if (ev->token >= 0) {
        if (c->tokens++ == 0) rp_metrics_observe_ttft(m, now - c->t_submit);
        else rp_metrics_observe_itl(m, now - c->t_last);
        c->t_last = now;
    }
    int ended_badly = ev->finish == RP_FINISH_REASON_ABORT || ev->finish == RP_FINISH_REASON_ERROR;
    if (!ended_badly) {
        if (r->stream) {
            /* a chunk per token, as OpenAI streams (empty text while it is
             * held back for a stop string or an unfinished character) */
            json_t *lp = NULL;
            if (r->logprobs && ev->token >= 0) {
                if (r->kind == RP_OAI_CHAT) {
                    lp = json_pack("{s:[o]}", "content", chat_lp_entry(r, ev));
                } else {
                    lp = cmpl_lp_new(r);
                    cmpl_lp_append(r, lp, ev, c->text_bytes);
                }
            }
            if (ev->token >= 0 || ev->text_len || ev->finish != RP_FINISH_REASON_NONE)
                sb_json_event(&r->out,
                              stream_chunk(r, c->index, ev->text, ev->text_len, finish_name(ev->finish), lp));
            else json_decref(lp);
        } else {
            sb_add(&c->text, ev->text, ev->text_len);
            if (r->logprobs && ev->token >= 0) {
                if (r->kind == RP_OAI_CHAT)
                    json_array_append_new(json_object_get(c->logprobs, "content"), chat_lp_entry(r, ev));
                else cmpl_lp_append(r, c->logprobs, ev, c->text_bytes);
            }
        }
        c->text_bytes += ev->text_len;
    }
    int final = ev->finish != RP_FINISH_REASON_NONE;
    if (final) {
        c->finish = ev->finish;
        c->done = 1;
        if (ev->error) snprintf(c->error, sizeof c->error, "%s", ev->error);
        rp_metrics_count_finish(m, ev->finish);
        if (!ended_badly) rp_metrics_observe_e2e(m, now - c->t_submit);
        if (++r->n_done == r->num_choices) {
            r->all_done = 1;
            if (r->stream) stream_end(r);
        }
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (final) req_unref(r); /* the engine's reference for this choice */
}

/* Waits one slice for r to change; r->mu held. Returns 1 when the client
 * hung up (the caller gives up on it), else 0. A stopping server aborts
 * the request; its final events still arrive and end it. */
static int wait_slice(srv_req *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    /* by the clock, not on timeouts only: tokens may wake us more often */
    double now = rp_now_s();
    if (now - r->last_check < WAIT_SLICE_MS * 1e-3) return 0;
    r->last_check = now;
    int gone = client_gone(r->fd), aborted = r->aborted;
    if (gone || (!aborted && server_stopping(r->s))) {
        pthread_mutex_unlock(&r->mu);
        req_abort(r, !gone);
        pthread_mutex_lock(&r->mu);
    }
    return gone;
}

/* ---- responses ------------------------------------------------------------------ */

static enum MHD_Result send_text(rp_server *s, struct MHD_Connection *conn, int status, const char *type,
                                 char *body, const char *allow) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    rp_metrics_count_http(s->metrics, status);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_json(rp_server *s, struct MHD_Connection *conn, int status, json_t *obj) {
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!text) {
        rp_oai_error e;
        rp_oai_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_text(s, conn, 500, "application/json", rp_oai_error_json(&e), NULL);
    }
    return send_text(s, conn, status, "application/json", text, NULL);
}

static enum MHD_Result send_error(rp_server *s, struct MHD_Connection *conn, const rp_oai_error *e) {
    return send_text(s, conn, e->status, "application/json", rp_oai_error_json(e), NULL);
}

static enum MHD_Result send_unavailable(rp_server *s, struct MHD_Connection *conn) {
    rp_oai_error e;
    rp_oai_set_error(&e, 503, "service_unavailable", NULL, NULL, "the server is shutting down");
    return send_error(s, conn, &e);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_req *r = cls;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        size_t avail = r->out.len - r->out_off;
        if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->all_done) break;
        if (wait_slice(r)) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR; /* the client left: close the connection */
        }
    }
    pthread_mutex_unlock(&r->mu);
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* MHD is done with the stream: it ended, or the connection failed. */
static void stream_free(void *cls) {
    srv_req *r = cls;
    pthread_mutex_lock(&r->mu);
    int running = !r->all_done;
    pthread_mutex_unlock(&r->mu);
    if (running) req_abort(r, 0);
    req_unref(r);
}

/* The non-streaming response, once every choice is done. */
static json_t *final_json(srv_req *r) {
    json_t *choices = json_array();
    for (int i = 0; i < r->num_choices; i++) {
        srv_choice *c = &r->ch[i];
        json_t *text = rp_oai_json_text(c->text.p ? c->text.p : "", c->text.len);
        json_t *lp = c->logprobs ? json_incref(c->logprobs) : json_null();
        json_t *choice;
        if (r->kind == RP_OAI_CHAT)
            choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s?}", "index", i, "message", "role", "assistant", "content",
                               text, "logprobs", lp, "finish_reason", finish_name(c->finish));
        else
            choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", i, "text", text, "logprobs", lp, "finish_reason",
                               finish_name(c->finish));
        json_array_append_new(choices, choice);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                     r->kind == RP_OAI_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)r->created,
                     "model", r->model, "choices", choices, "usage", usage_json(r));
}

/* ---- endpoints ------------------------------------------------------------------- */

/* A prompt as token ids: given, or the text encoded (completions add BOS as
 * HF's tokenizer(text) does; a chat template writes its own). *own says
 * whether *ids must be freed. */
static int prompt_ids(const rp_server *s, const rp_oai_request *q, int k, int32_t **ids, size_t *n, int *own,
                      rp_oai_error *e) {
    *own = 0;
    if (!q->prompt_texts[k]) {
        *ids = q->prompt_ids[k];
        *n = (size_t)q->num_prompt_ids[k];
        return 0;
    }
    const rp_tokenizer *tok = s->oai.tok;
    rp_err te;
    if (rp_tokenizer_encode(tok, q->prompt_texts[k], strlen(q->prompt_texts[k]), ids, n, &te)) {
        rp_oai_set_error(e, 400, "invalid_request_error", "prompt", NULL, "%s", te.msg);
        return -1;
    }
    *own = 1;
    int bos = rp_tokenizer_bos_id(tok);
    if (q->kind == RP_OAI_COMPLETION && bos >= 0 && (*n == 0 || (*ids)[0] != bos)) {
        int32_t *w = malloc((*n + 1) * sizeof *w);
        if (!w) {
            free(*ids);
            rp_oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        w[0] = bos;
        memcpy(w + 1, *ids, *n * sizeof **ids);
        free(*ids);
        *ids = w;
        (*n)++;
    }
    return 0;
}

static srv_req *req_new(rp_server *s, const rp_oai_request *q, struct MHD_Connection *conn) {
    srv_req *r = calloc(1, sizeof *r);
    int nc = q->num_prompts * q->n;
    if (r) r->ch = calloc((size_t)nc, sizeof *r->ch);
    if (!r || !r->ch) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->s = s;
    r->tok = s->oai.tok;
    r->kind = q->kind;
    r->stream = q->stream;
    r->include_usage = q->include_usage;
    r->logprobs = q->logprobs;
    r->top_logprobs = q->logprobs ? q->params.top_logprobs : 0;
    r->created = (long)time(NULL);
    r->num_choices = nc;
    r->fd = conn ? connection_fd(conn) : -1;
    r->refs = 1; /* the HTTP side's */
    snprintf(r->model, sizeof r->model, "%s", q->model);
    pthread_mutex_lock(&s->mu);
    uint64_t rid = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(r->id, sizeof r->id, "%s-%016llx", q->kind == RP_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)rp_mix64(rid ^ ((uint64_t)r->created << 20)));
    for (int i = 0; i < nc; i++) {
        r->ch[i].r = r;
        r->ch[i].index = i;
        if (q->logprobs && !q->stream)
            r->ch[i].logprobs = q->kind == RP_OAI_CHAT ? json_pack("{s:[]}", "content") : cmpl_lp_new(r);
    }
    return r;
}

/* An engine submit error as the OpenAI error a client gets: the parameter
 * the engine names, a chat request's prompt reported as its messages. */
static void submit_error(rp_oai_error *e, rp_oai_kind kind, const rp_error *err) {
    int status = err->code == RP_ERROR_OUT_OF_MEMORY ? 503 : err->code == RP_ERROR_INTERNAL ? 500 : 400;
    const char *type = status == 400 ? "invalid_request_error" : status == 503 ? "service_unavailable" : "server_error";
    const char *param = err->param[0] ? err->param : NULL;
    if (param && kind == RP_OAI_CHAT && !strcmp(param, "prompt")) param = "messages";
    rp_oai_set_error(e, status, type, param, NULL, "%s", err->message);
}

/* Submits every choice of prompt k (ids): choice k*n+i with seed seed+i. */
static int submit_prompt(rp_server *s, srv_req *r, const rp_oai_request *q, int k, const int32_t *ids, size_t n,
                         rp_error *err) {
    rp_request_params p = q->params;
    p.prompt = NULL;
    p.prompt_ids = ids;
    p.num_prompt_ids = (int)n;
    if (q->kind == RP_OAI_CHAT && !q->max_tokens_set) { /* what fits the context, as vLLM */
        long room = (long)s->oai.max_context - (long)n;
        p.max_tokens = room > 0 ? (int)room : 1; /* the engine rejects a prompt that fills the context */
    }
    for (int i = 0; i < q->n; i++) {
        srv_choice *c = &r->ch[k * q->n + i];
        if (q->n > 1 && q->params.has_seed) p.seed = q->params.seed + (uint64_t)i; /* distinct, reproducible */
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the engine's, dropped at this choice's final event */
        pthread_mutex_unlock(&r->mu);
        c->t_submit = rp_now_s();
        if (rp_engine_submit(s->eng, &p, on_event, c, &c->id, err)) {
            pthread_mutex_lock(&r->mu);
            r->refs--;
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        c->submitted = 1;
    }
    return 0;
}

static enum MHD_Result handle_generate(rp_server *s, struct MHD_Connection *conn, rp_oai_kind kind, const char *body,
                                       size_t len) {
    rp_oai_request q;
    rp_oai_error e;
    if (rp_oai_parse(&s->oai, kind, body, len, &q, &e)) return send_error(s, conn, &e);
    if (server_enter(s)) {
        rp_oai_request_free(&q);
        return send_unavailable(s, conn);
    }
    srv_req *r = req_new(s, &q, conn);
    if (!r) {
        rp_oai_request_free(&q);
        server_leave(s);
        rp_oai_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return send_error(s, conn, &e);
    }
    if (r->stream && kind == RP_OAI_CHAT) {
        for (int i = 0; i < r->num_choices; i++) { /* the first chunk of each choice: the role */
            json_t *choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i, "delta", "role", "assistant",
                                       "content", "", "logprobs", "finish_reason");
            sb_json_event(&r->out, chunk_json(r, choice));
        }
    }
    rp_error err = {0};
    int failed = 0;
    for (int k = 0; k < q.num_prompts && !failed; k++) {
        int32_t *ids;
        size_t n;
        int own;
        if (prompt_ids(s, &q, k, &ids, &n, &own, &e)) {
            err.code = RP_ERROR_INVALID_REQUEST;
            snprintf(err.param, sizeof err.param, "%s", e.param);
            snprintf(err.message, sizeof err.message, "%s", e.message);
            failed = 1;
            break;
        }
        r->prompt_tokens += (int)n;
        if (q.echo) { /* the prompt's text, also for token-id prompts */
            char *echo = NULL;
            rp_err de;
            if (q.prompt_texts[k]) echo = strdup(q.prompt_texts[k]);
            else if (r->tok && rp_tokenizer_decode(r->tok, ids, n, 0, &echo, NULL, &de)) echo = NULL;
            for (int i = 0; echo && i < q.n; i++) {
                srv_choice *c = &r->ch[k * q.n + i];
                if (r->stream) sb_json_event(&r->out, stream_chunk(r, c->index, echo, strlen(echo), NULL, NULL));
                else sb_add(&c->text, echo, strlen(echo));
                c->text_bytes += strlen(echo);
            }
            free(echo);
        }
        if (submit_prompt(s, r, &q, k, ids, n, &err)) failed = 1;
        if (own) free(ids);
    }
    rp_oai_request_free(&q);
    if (failed) {
        req_abort(r, 0);
        /* the choices already submitted end with ABORT; then r is ours alone */
        pthread_mutex_lock(&r->mu);
        while (r->refs > 1) pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        req_unref(r);
        submit_error(&e, kind, &err);
        return send_error(s, conn, &e);
    }
    if (r->stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r,
                                                                      stream_free);
        if (!resp) {
            stream_free(r);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        rp_metrics_count_http(s->metrics, 200);
        enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->all_done) {
        if (wait_slice(r)) { /* the client left: nobody to answer */
            pthread_mutex_unlock(&r->mu);
            req_unref(r);
            return MHD_NO;
        }
    }
    int status = 200;
    for (int i = 0; i < r->num_choices; i++) {
        if (r->ch[i].finish == RP_FINISH_REASON_ERROR) {
            status = 500;
            rp_oai_set_error(&e, 500, "server_error", NULL, NULL, "%s", r->ch[i].error[0] ? r->ch[i].error : "engine error");
            break;
        }
        if (r->ch[i].finish == RP_FINISH_REASON_ABORT) {
            status = 503;
            rp_oai_set_error(&e, 503, "service_unavailable", NULL, NULL, "the server is shutting down");
        }
    }
    json_t *out = status == 200 ? final_json(r) : NULL;
    pthread_mutex_unlock(&r->mu);
    req_unref(r);
    return status == 200 ? send_json(s, conn, 200, out) : send_error(s, conn, &e);
}

static enum MHD_Result handle_tokenize(rp_server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    rp_oai_tokenize t;
    rp_oai_error e;
    if (rp_oai_parse_tokenize(&s->oai, body, len, &t, &e)) return send_error(s, conn, &e);
    const rp_tokenizer *tok = s->oai.tok;
    int32_t *ids;
    size_t n;
    rp_err te;
    if (rp_tokenizer_encode(tok, t.text, strlen(t.text), &ids, &n, &te)) {
        rp_oai_tokenize_free(&t);
        rp_oai_set_error(&e, 400, "invalid_request_error", "prompt", NULL, "%s", te.msg);
        return send_error(s, conn, &e);
    }
    int bos = rp_tokenizer_bos_id(tok);
    json_t *arr = json_array(), *strs = t.return_token_strs ? json_array() : NULL;
    if (t.add_bos && bos >= 0 && (n == 0 || ids[0] != bos)) json_array_append_new(arr, json_integer(bos));
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    for (size_t i = 0; strs && i < json_array_size(arr); i++) {
        const char *b;
        size_t bl;
        json_array_append_new(strs, token_text(tok, (int32_t)json_integer_value(json_array_get(arr, i)), &b, &bl));
    }
    free(ids);
    rp_oai_tokenize_free(&t);
    json_t *out = json_pack("{s:I, s:I, s:o}", "count", (json_int_t)json_array_size(arr), "max_model_len",
                            (json_int_t)s->oai.max_context, "tokens", arr);
    if (strs) json_object_set_new(out, "token_strs", strs);
    return send_json(s, conn, 200, out);
}

static enum MHD_Result handle_detokenize(rp_server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    int32_t *ids;
    int n;
    rp_oai_error e;
    if (rp_oai_parse_detokenize(&s->oai, body, len, &ids, &n, &e)) return send_error(s, conn, &e);
    char *text;
    size_t tl;
    rp_err te;
    int rc = rp_tokenizer_decode(s->oai.tok, ids, (size_t)n, 0, &text, &tl, &te);
    free(ids);
    if (rc) {
        rp_oai_set_error(&e, 400, "invalid_request_error", "tokens", NULL, "%s", te.msg);
        return send_error(s, conn, &e);
    }
    json_t *out = json_pack("{s:o}", "prompt", rp_oai_json_text(text, tl));
    free(text);
    return send_json(s, conn, 200, out);
}

static enum MHD_Result handle_metrics(rp_server *s, struct MHD_Connection *conn) {
    rp_engine_stats st;
    rp_engine_get_stats(s->eng, &st);
    return send_text(s, conn, 200, "text/plain; version=0.0.4", rp_metrics_render(s->metrics, &st), NULL);
}

static enum MHD_Result handle_models(rp_server *s, struct MHD_Connection *conn) {
    json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:I, s:I}]}", "object", "list", "data", "id",
                          s->served_model, "object", "model", "created", (json_int_t)time(NULL), "owned_by", "replay",
                          "root", s->served_model, "max_model_len", (json_int_t)s->oai.max_context, "vocab_size",
                          (json_int_t)s->oai.vocab_size);
    return send_json(s, conn, 200, m);
}

/* ---- the MHD handler -------------------------------------------------------------- */

typedef struct conn_state {
    sbuf body;
    int too_big;
} conn_state;

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)conn, (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body.p);
    free(cs);
    *con_cls = NULL;
}

/* Compares the whole key whatever the input, so response time says nothing
 * about how much of a guess was right. */
static int authorized(rp_server *s, struct MHD_Connection *conn) {
    if (!s->api_key[0]) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *got = h + 7;
    size_t gl = strlen(got), kl = strlen(s->api_key);
    unsigned diff = gl != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)s->api_key[i] ^ (unsigned char)(i < gl ? got[i] : 0);
    return diff == 0;
}

static enum MHD_Result too_large(rp_server *s, struct MHD_Connection *conn) {
    rp_oai_error e;
    rp_oai_set_error(&e, 413, "invalid_request_error", NULL, "request_too_large",
                     "the request body is larger than %zu bytes", s->cfg.max_body_bytes);
    return send_error(s, conn, &e);
}

enum route { R_COMPLETIONS, R_CHAT, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_HEALTH_GENERATE, R_HEALTH, R_METRICS };
static const struct {
    const char *path;
    int post, auth;
} routes[] = {
    [R_COMPLETIONS] = {"/v1/completions", 1, 1}, [R_CHAT] = {"/v1/chat/completions", 1, 1},
    [R_MODELS] = {"/v1/models", 0, 1},           [R_TOKENIZE] = {"/tokenize", 1, 1},
    [R_DETOKENIZE] = {"/detokenize", 1, 1},      [R_HEALTH_GENERATE] = {"/health_generate", 0, 1},
    [R_HEALTH] = {"/health", 0, 0},              [R_METRICS] = {"/metrics", 0, 0},
};

static enum MHD_Result route(rp_server *s, struct MHD_Connection *conn, int rt, const char *body, size_t len) {
    switch (rt) {
    case R_COMPLETIONS: return handle_generate(s, conn, RP_OAI_COMPLETION, body, len);
    case R_CHAT: return handle_generate(s, conn, RP_OAI_CHAT, body, len);
    case R_MODELS: return handle_models(s, conn);
    case R_TOKENIZE: return handle_tokenize(s, conn, body, len);
    case R_DETOKENIZE: return handle_detokenize(s, conn, body, len);
    case R_HEALTH_GENERATE: { /* one greedy token through the whole engine */
        static const char req[] = "{\"prompt\": [0], \"max_tokens\": 1, \"temperature\": 0, \"ignore_eos\": true}";
        return handle_generate(s, conn, RP_OAI_COMPLETION, req, sizeof req - 1);
    }
    case R_METRICS: return handle_metrics(s, conn);
    default: return send_text(s, conn, 200, "application/json", strdup("{}"), NULL);
    }
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    rp_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) { /* headers only: refuse an announced oversized body before reading it */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) return too_large(s, conn);
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->body.len + *upload_size > s->cfg.max_body_bytes) cs->too_big = 1;
        if (!cs->too_big) sb_add(&cs->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    rp_oai_error e;
    int rt = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) rt = i;
    if (rt < 0) {
        rp_oai_set_error(&e, 404, "invalid_request_error", NULL, "not_found", "no route for %s %s", method, url);
        return send_error(s, conn, &e);
    }
    if (strcmp(method, routes[rt].post ? "POST" : "GET") != 0) {
        rp_oai_set_error(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s takes %s, not %s", url,
                         routes[rt].post ? "POST" : "GET", method);
        return send_text(s, conn, 405, "application/json", rp_oai_error_json(&e), routes[rt].post ? "POST" : "GET");
    }
    if (routes[rt].auth && !authorized(s, conn)) {
        rp_oai_set_error(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                         "missing or incorrect API key: send 'Authorization: Bearer KEY'");
        return send_error(s, conn, &e);
    }
    if (cs->too_big) return too_large(s, conn);
    if (rt == R_HEALTH) return route(s, conn, rt, NULL, 0);
    if (server_enter(s)) return send_unavailable(s, conn);
    enum MHD_Result rc = route(s, conn, rt, cs->body.p ? cs->body.p : "", cs->body.len);
    server_leave(s);
    return rc;
}

rp_server *rp_server_start(rp_engine *engine, const rp_server_config *cfg, char *err, size_t err_len) {
    rp_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->eng = engine;
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body_bytes) s->cfg.max_body_bytes = 8u << 20;
    snprintf(s->served_model, sizeof s->served_model, "%s", cfg->served_model ? cfg->served_model : "replay");
    if (cfg->api_key) snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->metrics = rp_metrics_new();
    s->oai = (rp_oai_context){.served_model = s->served_model, .tok = rp_engine_tokenizer(engine),
                              .max_context = rp_engine_max_context(engine), .vocab_size = rp_engine_vocab_size(engine)};
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->cfg.port);
    if (!s->metrics || inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1) {
        snprintf(err, err_len, s->metrics ? "--host must be an IPv4 address, got '%s'" : "out of memory%s",
                 s->metrics ? s->cfg.host : "");
        goto fail;
    }
    /* A thread per connection: handlers block on their request. ITC lets
     * rp_server_stop quiesce (stop accepting) before closing connections. */
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC,
                                 (uint16_t)s->cfg.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)4096, MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, err_len, "cannot listen on %s:%d (in use, or not allowed)", s->cfg.host, s->cfg.port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? (int)di->port : s->cfg.port;
    return s;
fail:
    rp_metrics_free(s->metrics);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
    return NULL;
}

int rp_server_port(const rp_server *s) { return s->port; }

void rp_server_stop(rp_server *s) {
    if (!s) return;
    MHD_socket lfd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    pthread_mutex_lock(&s->mu);
    s->stopping = 1; /* running requests abort themselves within a wait slice */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10; /* a client that stops reading cannot hold the exit up for longer */
    while (s->active > 0)
        if (pthread_cond_timedwait(&s->idle, &s->mu, &ts) != 0) break;
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->daemon); /* closes what is left; their streams are released */
    /* Requests whose clients are gone hold on until the engine's final
     * events arrive (their aborts are in): then nothing refers to s. */
    pthread_mutex_lock(&s->mu);
    while (s->active > 0) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    rp_metrics_free(s->metrics);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}
