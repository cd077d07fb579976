/* HTTP glue: routing, bodies, authentication, and the bridge between engine
 * events (engine thread) and responses (HTTP threads).
 *
 * libmicrohttpd runs a thread per connection, so a handler may block until
 * its request is done (non-streaming) and a streaming response's reader may
 * wait for the next event. Each request's state (srv_req) is shared by the
 * engine callbacks and the HTTP side under its own mutex and freed by
 * whichever lets go last. When a streaming client goes away, MHD frees the
 * response; if the request is still running we abort it in the engine, so
 * its KV pages come back at the next step. */
#include "server/http.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/openai.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/rng.h"

struct rp_server {
    rp_engine *eng;
    rp_server_config cfg;
    char served_model[256];
    char api_key[256];
    struct MHD_Daemon *daemon;
    rp_oai_context oai;
    pthread_mutex_t mu;
    uint64_t requests_total, requests_failed, next_id;
};

/* ---- small growable buffer ------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        char *q = realloc(b->p, b->cap);
        if (!q) return; /* out of memory: drop the text rather than crash */
        b->p = q;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_json_event(sbuf *b, json_t *obj) {
    char *s = json_dumps(obj, JSON_COMPACT);
    if (!s) return;
    sb_add(b, "data: ", 6);
    sb_add(b, s, strlen(s));
    sb_add(b, "\n\n", 2);
    free(s);
}

/* ---- one request's shared state --------------------------------------------- */

typedef struct srv_req srv_req;
typedef struct srv_choice {
    srv_req *r;
    int index;
    sbuf text;
    rp_finish finish;
    int completion_tokens;
    int done;
} srv_choice;

struct srv_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    rp_engine *eng;
    rp_oai_kind kind;
    int stream, include_usage;
    char id[48];
    long created;
    char model[256];
    int n, n_done, prompt_tokens;
    rp_request_id ids[RP_OAI_MAX_N];
    int submitted;
    srv_choice ch[RP_OAI_MAX_N];
    char *echo;
    sbuf out; /* bytes for the client: SSE chunks, or the final JSON */
    size_t out_off;
    int all_done;
};

static void req_unref(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_cond_broadcast(&r->cv); /* a failed submit waits for the refs to drop */
    pthread_mutex_unlock(&r->mu);
    if (left) return;
    for (int i = 0; i < RP_OAI_MAX_N; i++) free(r->ch[i].text.p);
    free(r->out.p);
    free(r->echo);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static json_t *usage_json(const srv_req *r) {
    int completion = 0;
    for (int i = 0; i < r->n; i++) completion += r->ch[i].completion_tokens;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", r->prompt_tokens, "completion_tokens", completion,
                     "total_tokens", r->prompt_tokens + completion);
}

static json_t *chunk_json(const srv_req *r, int index, const char *text, size_t len, const char *finish) {
    json_t *choice;
    if (r->kind == RP_OAI_CHAT) {
        json_t *delta = text ? json_pack("{s:s%}", "content", text, len) : json_object();
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", index, "delta", delta, "logprobs", "finish_reason",
                           finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:s%, s:n, s:o}", "index", index, "text", text ? text : "", text ? len : 0,
                           "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
    }
    return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", r->id, "object",
                     r->kind == RP_OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)r->created,
                     "model", r->model, "choices", choice);
}

/* The whole non-streaming response, once every choice is done. */
static void build_final(srv_req *r) {
    json_t *choices = json_array();
    for (int i = 0; i < r->n; i++) {
        srv_choice *c = &r->ch[i];
        const char *fin = rp_oai_finish_name(c->finish);
        const char *text = c->text.p ? c->text.p : "";
        json_t *choice;
        if (r->kind == RP_OAI_CHAT)
            choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:s?}", "index", i, "message", "role", "assistant",
                               "content", text, "logprobs", "finish_reason", fin);
        else
            choice = json_pack("{s:i, s:s, s:n, s:s?}", "index", i, "text", text, "logprobs", "finish_reason", fin);
        json_array_append_new(choices, choice);
    }
    json_t *root = json_pack("{s:s, s:s, s:i, s:s, s:o, s:o}", "id", r->id, "object",
                             r->kind == RP_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                             (json_int_t)r->created, "model", r->model, "choices", choices, "usage", usage_json(r));
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (s) {
        sb_add(&r->out, s, strlen(s));
        free(s);
    }
}

/* Engine thread: one event of one choice. */
static void on_event(void *user, const rp_token_event *ev) {
    srv_choice *c = user;
    srv_req *r = c->r;
    pthread_mutex_lock(&r->mu);
    r->prompt_tokens = ev->prompt_tokens;
    c->completion_tokens = ev->completion_tokens;
    if (r->stream) {
        /* a chunk per token, as OpenAI streams (empty while text is held
         * back for a stop string or an unfinished UTF-8 character) */
        if (ev->token >= 0 || ev->text_len || ev->finish != RP_FINISH_REASON_NONE) {
            json_t *ch = chunk_json(r, c->index, ev->text_len || ev->token >= 0 ? ev->text : NULL, ev->text_len,
                                    rp_oai_finish_name(ev->finish));
            sb_json_event(&r->out, ch);
            json_decref(ch);
        }
    } else {
        sb_add(&c->text, ev->text, ev->text_len);
    }
    int last = 0;
    if (ev->finish != RP_FINISH_REASON_NONE) {
        c->finish = ev->finish;
        c->done = 1;
        if (++r->n_done == r->n) {
            r->all_done = last = 1;
            if (r->stream) {
                if (r->include_usage) {
                    json_t *u = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", r->id, "object",
                                          r->kind == RP_OAI_CHAT ? "chat.completion.chunk" : "text_completion",
                                          "created", (json_int_t)r->created, "model", r->model, "choices", "usage",
                                          usage_json(r));
                    sb_json_event(&r->out, u);
                    json_decref(u);
                }
                sb_add(&r->out, "data: [DONE]\n\n", 14);
            } else {
                build_final(r);
            }
        }
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (ev->finish != RP_FINISH_REASON_NONE) req_unref(r); /* the engine's reference for this choice */
    (void)last;
}

/* ---- responses ------------------------------------------------------------------ */

static enum MHD_Result send_text(struct MHD_Connection *conn, int status, const char *type, char *body) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, int status, json_t *obj) {
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    return send_text(conn, status, "application/json", s ? s : strdup("{}"));
}

static enum MHD_Result send_error(struct MHD_Connection *conn, const rp_oai_error *e) {
    return send_text(conn, e->status, "application/json", rp_oai_error_json(e));
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_req *r = cls;
    pthread_mutex_lock(&r->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (r->out_off == r->out.len && !r->all_done)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    size_t avail = r->out.len - r->out_off;
    ssize_t n;
    if (avail == 0) {
        n = r->all_done ? MHD_CONTENT_READER_END_OF_STREAM : 0;
    } else {
        n = (ssize_t)(avail < max ? avail : max);
        memcpy(buf, r->out.p + r->out_off, (size_t)n);
        r->out_off += (size_t)n;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* MHD is done with the stream: finished, or the client went away. */
static void stream_free(void *cls) {
    srv_req *r = cls;
    pthread_mutex_lock(&r->mu);
    int running = !r->all_done;
    pthread_mutex_unlock(&r->mu);
    if (running)
        for (int i = 0; i < r->submitted; i++) rp_engine_abort(r->eng, r->ids[i]);
    req_unref(r);
}

/* ---- endpoints ------------------------------------------------------------------- */

static enum MHD_Result handle_generate(rp_server *s, struct MHD_Connection *conn, rp_oai_kind kind, const char *body,
                                       size_t len) {
    rp_oai_request q;
    rp_oai_error e;
    if (rp_oai_parse(&s->oai, kind, body, len, &q, &e)) return send_error(conn, &e);
    const rp_tokenizer *tok = s->oai.tok;
    /* The prompt as ids: chat needs its length for the default max_tokens
     * (what fits the context, as vLLM does), echo needs its text. */
    int32_t *ids = q.prompt_ids;
    size_t n_ids = (size_t)q.num_prompt_ids;
    int own_ids = 0;
    if (q.prompt_text) {
        rp_err te;
        if (rp_tokenizer_encode(tok, q.prompt_text, strlen(q.prompt_text), &ids, &n_ids, &te)) {
            rp_oai_set_error(&e, 400, "invalid_request_error", "prompt", NULL, "%s", te.msg);
            rp_oai_request_free(&q);
            return send_error(conn, &e);
        }
        own_ids = 1;
        int bos = rp_tokenizer_bos_id(tok);
        if (kind == RP_OAI_COMPLETION && bos >= 0 && (n_ids == 0 || ids[0] != bos)) {
            int32_t *w = malloc((n_ids + 1) * sizeof *w);
            w[0] = bos;
            memcpy(w + 1, ids, n_ids * sizeof *ids);
            free(ids);
            ids = w;
            n_ids++;
        }
    }
    if (!q.max_tokens_set && kind == RP_OAI_CHAT) {
        long room = (long)s->oai.max_context - (long)n_ids;
        q.params.max_tokens = room > 0 ? (int)room : 1;
    }
    srv_req *r = calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->eng = s->eng;
    r->kind = kind;
    r->stream = q.stream;
    r->include_usage = q.include_usage;
    r->created = (long)time(NULL);
    r->n = q.n;
    snprintf(r->model, sizeof r->model, "%s", q.model);
    pthread_mutex_lock(&s->mu);
    uint64_t rid = ++s->next_id;
    s->requests_total++;
    pthread_mutex_unlock(&s->mu);
    snprintf(r->id, sizeof r->id, "%s-%016llx", kind == RP_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)rp_mix64(rid ^ (uint64_t)r->created));
    if (q.echo) { /* the prompt's text, also for token-id prompts */
        rp_err de;
        if (q.prompt_text) r->echo = strdup(q.prompt_text);
        else if (tok && rp_tokenizer_decode(tok, ids, n_ids, 0, &r->echo, NULL, &de)) r->echo = NULL;
    }
    r->refs = 1; /* the HTTP side */
    char err[512] = "";
    rp_request_params p = q.params;
    p.prompt = NULL;
    p.prompt_ids = ids;
    p.num_prompt_ids = (int)n_ids;
    int failed = 0;
    if (r->stream && kind == RP_OAI_CHAT) {
        for (int i = 0; i < r->n; i++) { /* first chunk of each choice: the role */
            json_t *delta = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
            json_t *choice = json_pack("{s:i, s:o, s:n, s:n}", "index", i, "delta", delta, "logprobs", "finish_reason");
            json_t *c = json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", r->id, "object", "chat.completion.chunk",
                                  "created", (json_int_t)r->created, "model", r->model, "choices", choice);
            sb_json_event(&r->out, c);
            json_decref(c);
        }
    }
    if (r->echo) {
        for (int i = 0; i < r->n; i++) {
            if (r->stream) {
                json_t *c = chunk_json(r, i, r->echo, strlen(r->echo), NULL);
                sb_json_event(&r->out, c);
                json_decref(c);
            } else {
                sb_add(&r->ch[i].text, r->echo, strlen(r->echo));
            }
        }
    }
    for (int i = 0; i < r->n; i++) {
        r->ch[i].r = r;
        r->ch[i].index = i;
        if (q.n > 1 && p.has_seed) p.seed = q.params.seed + (uint64_t)i; /* n choices, distinct draws */
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the engine's, dropped at this choice's final event */
        pthread_mutex_unlock(&r->mu);
        if (rp_engine_submit(s->eng, &p, on_event, &r->ch[i], &r->ids[i], err, sizeof err)) {
            pthread_mutex_lock(&r->mu);
            r->refs--;
            pthread_mutex_unlock(&r->mu);
            failed = 1;
            break;
        }
        r->submitted++;
    }
    if (own_ids) free(ids);
    rp_oai_request_free(&q);
    if (failed) {
        for (int i = 0; i < r->submitted; i++) rp_engine_abort(s->eng, r->ids[i]);
        pthread_mutex_lock(&s->mu);
        s->requests_failed++;
        pthread_mutex_unlock(&s->mu);
        /* wait for aborted choices to let go of r */
        pthread_mutex_lock(&r->mu);
        while (r->refs > 1) pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
        req_unref(r);
        rp_oai_set_error(&e, 400, "invalid_request_error", strstr(err, "context") ? "max_tokens" : NULL, NULL, "%s",
                         err);
        return send_error(conn, &e);
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
        enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->all_done) pthread_cond_wait(&r->cv, &r->mu);
    char *body_out = strdup(r->out.p ? r->out.p : "{}");
    pthread_mutex_unlock(&r->mu);
    req_unref(r);
    return send_text(conn, MHD_HTTP_OK, "application/json", body_out);
}

static enum MHD_Result handle_tokenize(rp_server *s, struct MHD_Connection *conn, const char *body, size_t len,
                                       int detok) {
    rp_oai_error e;
    const rp_tokenizer *tok = s->oai.tok;
    if (!tok) {
        rp_oai_set_error(&e, 400, "invalid_request_error", NULL, NULL, "this model has no tokenizer");
        return send_error(conn, &e);
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        rp_oai_set_error(&e, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
        return send_error(conn, &e);
    }
    rp_err te;
    json_t *out = NULL;
    if (!detok) {
        json_t *p = json_object_get(root, "prompt");
        int32_t *ids;
        size_t n;
        if (!json_is_string(p)) {
            rp_oai_set_error(&e, 400, "invalid_request_error", "prompt", NULL, "'prompt' must be a string");
        } else if (rp_tokenizer_encode(tok, json_string_value(p), json_string_length(p), &ids, &n, &te)) {
            rp_oai_set_error(&e, 400, "invalid_request_error", "prompt", NULL, "%s", te.msg);
        } else {
            json_t *arr = json_array();
            for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
            free(ids);
            out = json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", (json_int_t)n, "max_model_len",
                            (json_int_t)s->oai.max_context);
        }
    } else {
        json_t *t = json_object_get(root, "tokens");
        size_t n = json_is_array(t) ? json_array_size(t) : 0, i;
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        int ok = json_is_array(t);
        json_t *v;
        if (ok)
            json_array_foreach(t, i, v) {
                if (!json_is_integer(v)) ok = 0;
                else ids[i] = (int32_t)json_integer_value(v);
            }
        char *text;
        if (!ok) {
            rp_oai_set_error(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be a list of integers");
        } else if (rp_tokenizer_decode(tok, ids, n, 0, &text, NULL, &te)) {
            rp_oai_set_error(&e, 400, "invalid_request_error", "tokens", NULL, "%s", te.msg);
        } else {
            out = json_pack("{s:s}", "prompt", text);
            free(text);
        }
        free(ids);
    }
    json_decref(root);
    return out ? send_json(conn, MHD_HTTP_OK, out) : send_error(conn, &e);
}

static enum MHD_Result handle_metrics(rp_server *s, struct MHD_Connection *conn) {
    rp_engine_stats st;
    rp_engine_get_stats(s->eng, &st);
    char *buf = malloc(4096);
    pthread_mutex_lock(&s->mu);
    snprintf(buf, 4096,
             "# HELP replay_requests_running Requests in the running batch.\n# TYPE replay_requests_running gauge\n"
             "replay_requests_running %d\n"
             "# HELP replay_requests_waiting Requests waiting for admission.\n# TYPE replay_requests_waiting gauge\n"
             "replay_requests_waiting %d\n"
             "# TYPE replay_prompt_tokens_total counter\nreplay_prompt_tokens_total %llu\n"
             "# TYPE replay_generation_tokens_total counter\nreplay_generation_tokens_total %llu\n"
             "# TYPE replay_kv_pages_used gauge\nreplay_kv_pages_used %d\n"
             "# TYPE replay_kv_pages_total gauge\nreplay_kv_pages_total %d\n"
             "# TYPE replay_preemptions_total counter\nreplay_preemptions_total %llu\n"
             "# TYPE replay_forwards_total counter\nreplay_forwards_total %llu\n"
             "# TYPE replay_cuda_graph_replays_total counter\nreplay_cuda_graph_replays_total %llu\n"
             "# TYPE replay_http_requests_total counter\nreplay_http_requests_total %llu\n"
             "# TYPE replay_http_requests_rejected_total counter\nreplay_http_requests_rejected_total %llu\n",
             st.running, st.waiting, (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens,
             st.kv_pages_total - st.kv_pages_free, st.kv_pages_total, (unsigned long long)st.preemptions,
             (unsigned long long)st.forwards, (unsigned long long)st.graph_replays,
             (unsigned long long)s->requests_total, (unsigned long long)s->requests_failed);
    pthread_mutex_unlock(&s->mu);
    return send_text(conn, MHD_HTTP_OK, "text/plain; version=0.0.4", buf);
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

static int authorized(rp_server *s, struct MHD_Connection *conn) {
    if (!s->api_key[0]) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, s->api_key);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    rp_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->body.len + *upload_size > s->cfg.max_body_bytes) cs->too_big = 1;
        else sb_add(&cs->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    rp_oai_error e;
    int post = !strcmp(method, "POST"), get = !strcmp(method, "GET");
    if (!strcmp(url, "/health") && get) return send_text(conn, MHD_HTTP_OK, "application/json", strdup("{}"));
    if (!strcmp(url, "/metrics") && get) return handle_metrics(s, conn);
    if (!authorized(s, conn)) {
        rp_oai_set_error(&e, 401, "authentication_error", NULL, "invalid_api_key", "Incorrect or missing API key");
        return send_error(conn, &e);
    }
    if (cs->too_big) {
        rp_oai_set_error(&e, 413, "invalid_request_error", NULL, NULL, "the request body is larger than %zu bytes",
                         s->cfg.max_body_bytes);
        return send_error(conn, &e);
    }
    const char *body = cs->body.p ? cs->body.p : "";
    size_t len = cs->body.len;
    struct {
        const char *path;
        int post;
    } routes[] = {{"/v1/completions", 1}, {"/v1/chat/completions", 1}, {"/v1/models", 0}, {"/tokenize", 1},
                  {"/detokenize", 1},      {"/health_generate", 0}};
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path) != 0) continue;
        if (routes[i].post ? !post : !get) {
            rp_oai_set_error(&e, 405, "invalid_request_error", NULL, NULL, "%s needs %s", url,
                             routes[i].post ? "POST" : "GET");
            return send_error(conn, &e);
        }
        switch (i) {
        case 0: return handle_generate(s, conn, RP_OAI_COMPLETION, body, len);
        case 1: return handle_generate(s, conn, RP_OAI_CHAT, body, len);
        case 2: {
            json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:i}]}", "object", "list", "data", "id",
                                  s->served_model, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                                  "replay", "max_model_len", (json_int_t)s->oai.max_context);
            return send_json(conn, MHD_HTTP_OK, m);
        }
        case 3: return handle_tokenize(s, conn, body, len, 0);
        case 4: return handle_tokenize(s, conn, body, len, 1);
        case 5: { /* one greedy token through the whole engine */
            char req[64];
            snprintf(req, sizeof req, "{\"prompt\": [1], \"max_tokens\": 1, \"temperature\": 0}");
            return handle_generate(s, conn, RP_OAI_COMPLETION, req, strlen(req));
        }
        }
    }
    rp_oai_set_error(&e, 404, "NotFoundError", NULL, NULL, "no route for %s %s", method, url);
    return send_error(conn, &e);
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
    if (s->cfg.port <= 0) s->cfg.port = 8000;
    if (!s->cfg.max_body_bytes) s->cfg.max_body_bytes = 8u << 20;
    snprintf(s->served_model, sizeof s->served_model, "%s", cfg->served_model ? cfg->served_model : "replay");
    if (cfg->api_key) snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key);
    pthread_mutex_init(&s->mu, NULL);
    s->oai = (rp_oai_context){.served_model = s->served_model, .tok = rp_engine_tokenizer(engine),
                              .max_context = rp_engine_max_context(engine)};
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->cfg.port);
    if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1) {
        snprintf(err, err_len, "--host must be an IPv4 address, got '%s'", s->cfg.host);
        free(s);
        return NULL;
    }
    s->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD,
                                 (uint16_t)s->cfg.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, err_len, "cannot listen on %s:%d (in use, or not allowed)", s->cfg.host, s->cfg.port);
        free(s);
        return NULL;
    }
    return s;
}

void rp_server_stop(rp_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
