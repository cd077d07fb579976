/* The HTTP transport (libmicrohttpd): the daemon, routing, request bodies,
 * the API key, and sending answers. What a generation request does between
 * its body and its answer is session.c's; what the answers look like is
 * openai_json.c's; parsing is openai.c's.
 *
 * libmicrohttpd runs a thread per connection, so a handler may block until
 * its session is done (non-streaming), and a streaming response's reader
 * may block until the session has bytes.
 *
 * Shutdown (rp_server_stop): stop accepting, refuse new requests with 503,
 * let running sessions abort themselves (streams end with an error event
 * and [DONE]), wait until no HTTP thread uses the engine, then stop the
 * daemon. The caller destroys the engine afterwards. */
#include "server/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/openai_json.h"
#include "server/sbuf.h"
#include "server/session.h"
#include "tokenizer/tokenizer.h"

struct rp_server {
    rp_server_config cfg;
    char served_model[256];
    char api_key[256];
    int port;
    struct MHD_Daemon *daemon;
    rp_oai_context oai;
    rp_metrics *metrics;
    rp_sessions sessions; /* the engine, and the gate shutdown waits on */
};

/* What a client gets when even its error cannot be allocated. */
static const char oom_body[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";

/* ---- responses ------------------------------------------------------------------ */

/* Queues resp (released here) with its headers; MHD_NO closes the
 * connection when even that fails. */
static enum MHD_Result queue(rp_server *s, struct MHD_Connection *conn, int status, struct MHD_Response *resp,
                             const char *type, const char *allow) {
    if (!resp) return MHD_NO;
    enum MHD_Result rc = MHD_NO;
    if (MHD_add_response_header(resp, "Content-Type", type) == MHD_YES &&
        (!allow || MHD_add_response_header(resp, "Allow", allow) == MHD_YES)) {
        rp_metrics_count_http(s->metrics, status);
        rc = MHD_queue_response(conn, (unsigned)status, resp);
    }
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_static(rp_server *s, struct MHD_Connection *conn, int status, const char *type,
                                   const char *body) {
    return queue(s, conn, status,
                 MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT), type, NULL);
}

/* body: malloc'd, taken; NULL (out of memory) answers 500. */
static enum MHD_Result send_text(rp_server *s, struct MHD_Connection *conn, int status, const char *type,
                                 char *body, const char *allow) {
    if (!body) return send_static(s, conn, 500, "application/json", oom_body);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(body);
    return queue(s, conn, status, resp, type, allow);
}

/* obj: taken; NULL (out of memory) answers 500. */
static enum MHD_Result send_json(rp_server *s, struct MHD_Connection *conn, int status, json_t *obj) {
    return send_text(s, conn, status, "application/json", rp_oai_json_dumps(obj), NULL);
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
    long n = rp_session_read(cls, buf, max);
    if (n > 0) return (ssize_t)n;
    /* an error closes the connection: the client left */
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

/* MHD is done with the stream: it ended, or the connection failed. */
static void stream_free(void *cls) { rp_session_release(cls); }

static enum MHD_Result send_stream(rp_server *s, struct MHD_Connection *conn, rp_session *sess) {
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sess, stream_free);
    if (!resp) {
        rp_session_release(sess);
        return MHD_NO;
    }
    if (MHD_add_response_header(resp, "Cache-Control", "no-cache") != MHD_YES) {
        MHD_destroy_response(resp); /* stream_free releases the session */
        return MHD_NO;
    }
    return queue(s, conn, 200, resp, "text/event-stream", NULL);
}

/* ---- endpoints ------------------------------------------------------------------- */

static int connection_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

static enum MHD_Result handle_generate(rp_server *s, struct MHD_Connection *conn, rp_oai_kind kind, const char *body,
                                       size_t len) {
    rp_oai_request q;
    rp_oai_error e;
    if (rp_oai_parse(&s->oai, kind, body, len, &q, &e)) return send_error(s, conn, &e);
    rp_session *sess = rp_session_new(&s->sessions, &q, connection_fd(conn), &e);
    int rc = sess ? rp_session_submit(sess, &q, &e) : -1;
    rp_oai_request_free(&q);
    if (rc) {
        if (sess) rp_session_release(sess);
        return send_error(s, conn, &e);
    }
    if (rp_session_streaming(sess)) return send_stream(s, conn, sess);
    json_t *out;
    rc = rp_session_wait(sess, &out, &e);
    rp_session_release(sess);
    if (rc > 0) return MHD_NO; /* the client left: nobody to answer */
    return rc ? send_error(s, conn, &e) : send_json(s, conn, 200, out);
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
    if (!t.add_bos || (n > 0 && ids[0] == bos)) bos = -1;
    json_t *out = rp_oai_tokenize_json(tok, bos, ids, n, t.return_token_strs, s->oai.max_context);
    free(ids);
    rp_oai_tokenize_free(&t);
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
    rp_engine_get_stats(s->sessions.eng, &st);
    return send_text(s, conn, 200, "text/plain; version=0.0.4", rp_metrics_render(s->metrics, &st), NULL);
}

static enum MHD_Result handle_models(rp_server *s, struct MHD_Connection *conn) {
    return send_json(s, conn, 200,
                     rp_oai_models_json(s->served_model, (long)time(NULL), s->oai.max_context, s->oai.vocab_size));
}

/* ---- the MHD handler -------------------------------------------------------------- */

typedef struct conn_state {
    rp_sbuf body;
    int too_big;
    int out_of_memory; /* the body could not be held */
} conn_state;

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)conn, (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    rp_sbuf_free(&cs->body);
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
    default: return send_static(s, conn, 200, "application/json", "{}");
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
        if (!cs->too_big && !cs->out_of_memory && rp_sbuf_add(&cs->body, upload_data, *upload_size))
            cs->out_of_memory = 1; /* answered with a 500 once the body is in */
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
    if (cs->out_of_memory) {
        rp_oai_set_out_of_memory(&e);
        return send_error(s, conn, &e);
    }
    if (rt == R_HEALTH) return route(s, conn, rt, NULL, 0);
    if (rp_sessions_enter(&s->sessions)) return send_unavailable(s, conn);
    enum MHD_Result rc = route(s, conn, rt, cs->body.p ? cs->body.p : "", cs->body.len);
    rp_sessions_leave(&s->sessions);
    return rc;
}

rp_server *rp_server_start(rp_engine *engine, const rp_server_config *cfg, char *err, size_t err_len) {
    rp_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body_bytes) s->cfg.max_body_bytes = 8u << 20;
    snprintf(s->served_model, sizeof s->served_model, "%s", cfg->served_model ? cfg->served_model : "replay");
    if (cfg->api_key) snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key);
    s->metrics = rp_metrics_new();
    rp_sessions_init(&s->sessions, engine, s->metrics);
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
    rp_sessions_destroy(&s->sessions);
    rp_metrics_free(s->metrics);
    free(s);
    return NULL;
}

int rp_server_port(const rp_server *s) { return s->port; }

void rp_server_stop(rp_server *s) {
    if (!s) return;
    MHD_socket lfd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    rp_sessions_stop(&s->sessions); /* running sessions abort themselves within a wait slice */
    /* a client that stops reading cannot hold the exit up for longer */
    rp_sessions_wait_idle(&s->sessions, 10.0);
    MHD_stop_daemon(s->daemon); /* closes what is left; their streams are released */
    /* Sessions whose clients are gone hold on until the engine's final
     * events arrive (their aborts are in): then nothing refers to s. */
    rp_sessions_wait_idle(&s->sessions, -1);
    rp_sessions_destroy(&s->sessions);
    rp_metrics_free(s->metrics);
    free(s);
}
