/* The HTTP transport (libmicrohttpd): the daemon, routing, request bodies,
 * the API key, and sending answers. What a generation request does between
 * its body and its answer is session.c's; what the answers look like is
 * openai_json.c's; parsing is openai.c's.
 *
 * libmicrohttpd polls with epoll on a small thread pool, so nothing here may
 * block: a non-streaming request's connection is suspended until its
 * session is done, a stream's until the session has bytes (session.c wakes
 * them from the engine thread). Method, route, API key and an announced
 * body size are checked when the headers arrive, so a refused request is
 * answered and closed without its body being read.
 *
 * The guard thread does what no connection asks for: every WATCH_MS it lets
 * the sessions notice hung-up clients and shutdown (rp_sessions_watch), and
 * it closes connections that take longer than the header or body timeout
 * (libmicrohttpd's own timeout restarts with every byte, so it cannot stop
 * a client sending one byte a second).
 *
 * The guard thread also writes the periodic engine line (serve_log.h):
 * it already wakes every WATCH_MS, and so every embedding of the server
 * (serve, the tests) gets it without a thread of its own. A request's
 * access line is written when libmicrohttpd reports it finished
 * (request_completed), after its last byte or its failure.
 *
 * Shutdown (rp_server_stop): stop accepting, refuse new requests with 503,
 * abort running sessions (streams end with an error event and [DONE]),
 * wait until no HTTP thread uses the engine, then stop the daemon. The
 * caller destroys the engine afterwards. */
#include "server/http.h"

#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "replay/version.h"
#include "server/listener.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/openai_json.h"
#include "server/sbuf.h"
#include "server/serve_log.h"
#include "server/session.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/rng.h"

#define WATCH_MS 20           /* how soon a hang-up or shutdown aborts a session */
#define SWEEP_EVERY 10        /* the timeouts are checked every SWEEP_EVERY watches */
#define RETRY_AFTER_S "1"     /* what a 503 asks a client to wait */

void rp_server_config_default(rp_server_config *c) {
    *c = (rp_server_config){
        .host = "127.0.0.1",
        .max_body_bytes = 8u << 20,          /* a full-context prompt as text, with room to spare */
        .max_connections = 8192,             /* epoll: idle connections cost a socket and 32 KiB each */
        .max_connections_per_address = 256,  /* one client cannot take them all; raise behind a proxy */
        .header_timeout_s = 10,              /* uvicorn keeps idle connections 5 s, nginx 60 s for headers */
        .body_timeout_s = 30,                /* 8 MiB at 300 KB/s */
        .send_timeout_s = 60,                /* a client that reads nothing for a minute is gone */
        .max_queued_requests = 1024,         /* a few batches' worth: past that a 503 beats waiting minutes */
        .http_threads = 4,                   /* parsing and tokenizing only; the engine has its own thread */
        .access_log = 1,                     /* as vLLM (uvicorn) logs every request */
        .log_stats_interval_s = 5,           /* vLLM's periodic line */
    };
    rp_request_params_default(&c->sampling_defaults);
}

/* Where a connection is in its request, for the header and body timeouts. */
enum conn_phase { PH_HEADERS, PH_BODY, PH_BUSY };

typedef struct conn_track {
    int fd;
    enum conn_phase phase;
    double since;
    int closed; /* shut down by the guard */
    struct conn_track *prev, *next;
} conn_track;

struct rp_server {
    rp_server_config cfg;
    char *served_model; /* copies: as long as the user's, never cut */
    char *api_key;      /* NULL: no authentication */
    int port;
    char url[128];
    struct MHD_Daemon *daemon;
    rp_oai_context oai;
    rp_metrics *metrics;
    rp_sessions sessions; /* the engine, and the gate shutdown waits on */
    pthread_mutex_t conn_mu;
    conn_track *conns; /* open connections, under conn_mu */
    pthread_t guard;
    int guard_stop; /* atomic */
    rp_stats_log stats; /* the guard thread's */
    char *allowed_origins, *allowed_methods, *allowed_headers; /* copies; origins NULL: no CORS */
    uint64_t next_request_id; /* atomic: the ids made for requests without X-Request-Id */
};

/* What a client gets when even its error cannot be allocated. */
static const char oom_body[] =
    "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";

/* One request on a connection: its route, its body, and what its access
 * line will say. */
typedef struct conn_state {
    rp_server *s;
    struct MHD_Connection *conn;
    int rt; /* the route, known from the headers; -1: none */
    rp_sbuf body;
    int out_of_memory; /* the body could not be held */
    rp_session *sess;  /* a non-streaming request whose connection waits for it */
    /* the access line */
    double t_start;          /* the headers arrived */
    int status;              /* the answer's; 0 until one is queued */
    char method[16];
    char path[160];          /* the URL as sent, cut */
    rp_session *logged;      /* a stream's session, held until the request is over */
    rp_session_summary sum;  /* a non-streaming request's, taken when it is answered */
    int have_sum;
    char request_id[72];     /* X-Request-Id, the client's or made here: sent back and logged */
    char cors_origin[256];   /* the allowed Origin to send back in Access-Control-Allow-Origin, or "" */
    int model_match;         /* GET /v1/models/{id}: the id is the served model's name */
} conn_state;

/* ---- responses ------------------------------------------------------------------ */

/* Queues resp (released here) with its headers (Content-Type when type is
 * set, an Allow header when allow is, Retry-After on a 503, X-Request-Id,
 * and Access-Control-Allow-Origin for an allowed Origin); MHD_NO closes
 * the connection when even that fails. */
static enum MHD_Result queue(conn_state *cs, int status, struct MHD_Response *resp, const char *type,
                             const char *allow) {
    if (!resp) return MHD_NO;
    rp_server *s = cs->s;
    enum MHD_Result rc = MHD_NO;
    if ((!type || MHD_add_response_header(resp, "Content-Type", type) == MHD_YES) &&
        (!allow || MHD_add_response_header(resp, "Allow", allow) == MHD_YES) &&
        (!cs->request_id[0] || MHD_add_response_header(resp, "X-Request-Id", cs->request_id) == MHD_YES) &&
        (!cs->cors_origin[0] || MHD_add_response_header(resp, "Access-Control-Allow-Origin", cs->cors_origin) == MHD_YES) &&
        (!cs->cors_origin[0] || !strcmp(cs->cors_origin, "*") ||
         MHD_add_response_header(resp, "Vary", "Origin") == MHD_YES) &&
        (status != 503 || MHD_add_response_header(resp, "Retry-After", RETRY_AFTER_S) == MHD_YES)) {
        rp_metrics_count_http(s->metrics, status);
        rc = MHD_queue_response(cs->conn, (unsigned)status, resp);
        if (rc == MHD_YES) cs->status = status;
    }
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_static(conn_state *cs, int status, const char *type, const char *body) {
    return queue(cs, status, MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT), type,
                 NULL);
}

/* body: malloc'd, taken; NULL (out of memory) answers 500. */
static enum MHD_Result send_text(conn_state *cs, int status, const char *type, char *body, const char *allow) {
    if (!body) return send_static(cs, 500, "application/json", oom_body);
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(body);
    return queue(cs, status, resp, type, allow);
}

/* obj: taken; NULL (out of memory) answers 500. */
static enum MHD_Result send_json(conn_state *cs, int status, json_t *obj) {
    return send_text(cs, status, "application/json", rp_oai_json_dumps(obj), NULL);
}

static enum MHD_Result send_error(conn_state *cs, const rp_oai_error *e) {
    return send_text(cs, e->status, "application/json", rp_oai_error_json(e), NULL);
}

static enum MHD_Result send_unavailable(conn_state *cs) {
    rp_oai_error e;
    rp_oai_set_error(&e, 503, "service_unavailable", NULL, NULL, "the server is shutting down");
    return send_error(cs, &e);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    long n = rp_session_read(cls, buf, max);
    if (n > 0) return (ssize_t)n;
    if (n == RP_SESSION_PARKED) return 0; /* suspended until the engine has more */
    /* an error closes the connection: the client left */
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

/* MHD is done with the stream: it ended, or the connection failed. */
static void stream_free(void *cls) { rp_session_release(cls); }

static enum MHD_Result send_stream(conn_state *cs, rp_session *sess) {
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
    return queue(cs, 200, resp, "text/event-stream", NULL);
}

/* ---- endpoints ------------------------------------------------------------------- */

static int connection_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

/* The session's connection sleeps while the engine works (session.c). */
static void conn_sleep(void *conn) { MHD_suspend_connection(conn); }
static void conn_wake(void *conn) { MHD_resume_connection(conn); }

/* Non-streaming: the answer once the session is done; until then the
 * connection stays suspended and the handler is called again on wake. */
/* The session's numbers for the access line; the session is let go. */
static void release_noted(conn_state *cs, rp_session *sess) {
    rp_session_summary_get(sess, &cs->sum);
    cs->have_sum = 1;
    rp_session_release(sess);
}

static enum MHD_Result answer_generate(conn_state *cs) {
    json_t *out;
    rp_oai_error e;
    int rc = rp_session_wait(cs->sess, &out, &e);
    if (rc == RP_SESSION_PARKED) return MHD_YES;
    release_noted(cs, cs->sess);
    cs->sess = NULL;
    if (rc > 0) return MHD_NO; /* the client left: nobody to answer */
    return rc ? send_error(cs, &e) : send_json(cs, 200, out);
}

static enum MHD_Result handle_generate(conn_state *cs, rp_oai_kind kind, const char *body, size_t len) {
    rp_server *s = cs->s;
    rp_oai_request q;
    rp_oai_error e;
    const double t_body = rp_now_s();
    if (rp_oai_parse(&s->oai, kind, body, len, &q, &e)) return send_error(cs, &e);
    snprintf(q.request_id, sizeof q.request_id, "%s", cs->request_id);
    const double t_parsed = rp_now_s();
    rp_session_waker waker = {conn_sleep, conn_wake, cs->conn};
    rp_session *sess = rp_session_new(&s->sessions, &q, connection_fd(cs->conn), &waker, &e);
    int rc = sess ? rp_session_submit(sess, &q, &e) : -1;
    rp_oai_request_free(&q);
    /* where a request's time goes before the engine has it (a long prompt of
     * ids costs its parse) */
    if (rp_log_get_level() >= RP_LOG_DEBUG)
        rp_log_debug("request body %zu bytes: received %.3f ms after its headers, parsed in %.3f ms, submitted in %.3f ms",
                     len, (t_body - cs->t_start) * 1e3, (t_parsed - t_body) * 1e3, (rp_now_s() - t_parsed) * 1e3);
    if (rc) {
        if (sess) release_noted(cs, sess);
        return send_error(cs, &e);
    }
    if (rp_session_streaming(sess)) {
        /* the stream ends after the handler: its numbers are read when the request is over */
        rp_session_hold(sess);
        cs->logged = sess;
        return send_stream(cs, sess);
    }
    cs->sess = sess;
    return answer_generate(cs);
}

static enum MHD_Result handle_tokenize(conn_state *cs, const char *body, size_t len) {
    rp_server *s = cs->s;
    rp_oai_tokenize t;
    rp_oai_error e;
    if (rp_oai_parse_tokenize(&s->oai, body, len, &t, &e)) return send_error(cs, &e);
    const rp_tokenizer *tok = s->oai.tok;
    int32_t *ids;
    size_t n;
    rp_err te;
    if (rp_tokenizer_encode(tok, t.text, strlen(t.text), &ids, &n, &te)) {
        rp_oai_tokenize_free(&t);
        rp_oai_set_error(&e, 400, "invalid_request_error", "prompt", NULL, "%s", te.msg);
        return send_error(cs, &e);
    }
    int bos = rp_tokenizer_bos_id(tok);
    if (!t.add_bos || (n > 0 && ids[0] == bos)) bos = -1;
    json_t *out = rp_oai_tokenize_json(tok, bos, ids, n, t.return_token_strs, s->oai.max_context);
    free(ids);
    rp_oai_tokenize_free(&t);
    return send_json(cs, 200, out);
}

static enum MHD_Result handle_detokenize(conn_state *cs, const char *body, size_t len) {
    rp_server *s = cs->s;
    int32_t *ids;
    int n;
    rp_oai_error e;
    if (rp_oai_parse_detokenize(&s->oai, body, len, &ids, &n, &e)) return send_error(cs, &e);
    char *text;
    size_t tl;
    rp_err te;
    int rc = rp_tokenizer_decode(s->oai.tok, ids, (size_t)n, 0, &text, &tl, &te);
    free(ids);
    if (rc) {
        rp_oai_set_error(&e, 400, "invalid_request_error", "tokens", NULL, "%s", te.msg);
        return send_error(cs, &e);
    }
    json_t *out = json_pack("{s:o}", "prompt", rp_oai_json_text(text, tl));
    free(text);
    return send_json(cs, 200, out);
}

static enum MHD_Result handle_metrics(conn_state *cs) {
    rp_engine_stats st;
    rp_engine_get_stats(cs->s->sessions.eng, &st);
    return send_text(cs, 200, "text/plain; version=0.0.4", rp_metrics_render(cs->s->metrics, &st), NULL);
}

static enum MHD_Result handle_models(conn_state *cs) {
    rp_server *s = cs->s;
    return send_json(cs, 200,
                     rp_oai_models_json(s->served_model, (long)time(NULL), s->oai.max_context, s->oai.vocab_size));
}

/* GET /v1/models/{id} (the openai client's models.retrieve): the served
 * model's object, or 404 model_not_found. A name may hold '/'. */
static enum MHD_Result handle_model(conn_state *cs, const char *id) {
    rp_server *s = cs->s;
    if (!cs->model_match) { /* compared whole when the headers came; id may be cut */
        rp_oai_error e;
        rp_oai_set_error(&e, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%s' does not exist (this server serves '%s')", id, s->served_model);
        return send_error(cs, &e);
    }
    return send_json(cs, 200, rp_oai_model_json(s->served_model, (long)time(NULL), s->oai.max_context,
                                                s->oai.vocab_size));
}

/* ---- connections: tracked for the header and body timeouts ---------------------------- */

static void set_phase(rp_server *s, struct MHD_Connection *conn, enum conn_phase ph) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_track *t = ci ? ci->socket_context : NULL;
    if (!t) return;
    pthread_mutex_lock(&s->conn_mu);
    t->phase = ph;
    t->since = rp_now_s();
    pthread_mutex_unlock(&s->conn_mu);
}

static void connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
    rp_server *s = cls;
    conn_track *t = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(t = calloc(1, sizeof *t))) return; /* untracked: only libmicrohttpd's timeout applies */
        t->fd = connection_fd(conn);
        t->phase = PH_HEADERS;
        t->since = rp_now_s();
        pthread_mutex_lock(&s->conn_mu);
        t->next = s->conns;
        if (s->conns) s->conns->prev = t;
        s->conns = t;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = t;
        return;
    }
    if (!t) return;
    /* closed: unlinked before libmicrohttpd closes the socket, so the guard
     * never shuts down a number reused by another connection */
    pthread_mutex_lock(&s->conn_mu);
    if (t->prev) t->prev->next = t->next;
    else s->conns = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&s->conn_mu);
    free(t);
    *socket_context = NULL;
}

/* Closes connections past their header or body deadline: shutdown() makes
 * libmicrohttpd see the end of the stream and close them itself. */
static void sweep_connections(rp_server *s) {
    double now = rp_now_s();
    pthread_mutex_lock(&s->conn_mu);
    for (conn_track *t = s->conns; t; t = t->next) {
        int limit = t->phase == PH_HEADERS ? s->cfg.header_timeout_s : t->phase == PH_BODY ? s->cfg.body_timeout_s : 0;
        if (limit && !t->closed && now - t->since > limit) {
            shutdown(t->fd, SHUT_RDWR);
            t->closed = 1;
        }
    }
    pthread_mutex_unlock(&s->conn_mu);
}

static void *guard_main(void *arg) {
    rp_server *s = arg;
    for (unsigned n = 0; !__atomic_load_n(&s->guard_stop, __ATOMIC_ACQUIRE); n++) {
        struct timespec ts = {0, WATCH_MS * 1000000L};
        nanosleep(&ts, NULL);
        rp_sessions_watch(&s->sessions);
        if (n % SWEEP_EVERY == 0) sweep_connections(s);
        rp_stats_log_tick(&s->stats, s->sessions.eng, rp_now_s());
    }
    return NULL;
}

enum route {
    R_COMPLETIONS, R_CHAT, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_HEALTH_GENERATE, R_HEALTH, R_METRICS, R_VERSION,
    R_MODEL /* /v1/models/{id}: matched by its prefix */
};
#define MODEL_PREFIX "/v1/models/"
static const struct {
    const char *path;
    int post, auth;
} routes[] = {
    [R_COMPLETIONS] = {"/v1/completions", 1, 1}, [R_CHAT] = {"/v1/chat/completions", 1, 1},
    [R_MODELS] = {"/v1/models", 0, 1},           [R_TOKENIZE] = {"/tokenize", 1, 1},
    [R_DETOKENIZE] = {"/detokenize", 1, 1},      [R_HEALTH_GENERATE] = {"/health_generate", 0, 1},
    [R_HEALTH] = {"/health", 0, 0},              [R_METRICS] = {"/metrics", 0, 0},
    [R_VERSION] = {"/version", 0, 0},            [R_MODEL] = {"/v1/models/{id}", 0, 1},
};

/* How a request ended, when not with its whole answer sent. */
static const char *ending(enum MHD_RequestTerminationCode toe) {
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK: return NULL;
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return "timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return "shutdown";
    case MHD_REQUEST_TERMINATED_READ_ERROR: return "read_error";
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT: return "client_abort";
    default: return "connection_error"; /* refused mid-body, a client gone mid-answer, ... */
    }
}

static void access_line(struct MHD_Connection *conn, conn_state *cs, enum MHD_RequestTerminationCode toe) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char client[96];
    rp_sockaddr_text(ci ? ci->client_addr : NULL, client, sizeof client);
    double now = rp_now_s();
    const rp_session_summary *sum = cs->have_sum ? &cs->sum : NULL;
    rp_access a = {
        .id = sum ? sum->id : NULL,
        .client = client,
        .method = cs->method,
        .route = cs->rt >= 0 ? routes[cs->rt].path : cs->path,
        .status = cs->status,
        .prompt_tokens = sum ? sum->prompt_tokens : 0,
        .output_tokens = sum ? sum->completion_tokens : 0,
        .cached_tokens = sum ? sum->cached_tokens : 0,
        .ttft_ms = sum && sum->first_token_s > 0 ? (sum->first_token_s - cs->t_start) * 1e3 : NAN,
        .total_ms = (now - cs->t_start) * 1e3,
        .end = ending(toe),
        .request_id = cs->request_id[0] ? cs->request_id : NULL,
    };
    /* probes and scrapes come every few seconds: only their failures are news */
    int routine = (cs->rt == R_HEALTH || cs->rt == R_METRICS) && cs->status == 200 && !a.end;
    rp_access_log(routine ? RP_LOG_DEBUG : RP_LOG_INFO, &a);
}

static void request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
    rp_server *s = cls;
    set_phase(s, conn, PH_HEADERS); /* the next request's headers, on a kept-alive connection */
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->sess) release_noted(cs, cs->sess);
    if (cs->logged) release_noted(cs, cs->logged);
    if (s->cfg.access_log) access_line(conn, cs, toe);
    rp_sbuf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

/* Keeps "%00" as it is: decoded, the NUL would end the path early and
 * "/health%00" would match "/health". */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *val) {
    (void)cls, (void)conn;
    return strstr(val, "%00") ? strlen(val) : MHD_http_unescape(val);
}

/* Compares the whole key whatever the input, so response time says nothing
 * about how much of a guess was right. */
static int authorized(rp_server *s, struct MHD_Connection *conn) {
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *got = h + 7;
    size_t gl = strlen(got), kl = strlen(s->api_key);
    unsigned diff = gl != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)s->api_key[i] ^ (unsigned char)(i < gl ? got[i] : 0);
    return diff == 0;
}

static void set_too_large(rp_server *s, rp_oai_error *e) {
    rp_oai_set_error(e, 413, "invalid_request_error", NULL, "request_too_large",
                     "the request body is larger than %zu bytes", s->cfg.max_body_bytes);
}

/* A chunked body that grew past the limit. libmicrohttpd cannot queue an
 * answer once the body is being read, so the 413 is written to the socket
 * as it is (best effort) and the connection closed: nothing more is read. */
static enum MHD_Result refuse_growing_body(conn_state *cs) {
    rp_server *s = cs->s;
    rp_oai_error e;
    set_too_large(s, &e);
    char *body = rp_oai_error_json(&e);
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      body ? strlen(body) : 0);
    int fd = connection_fd(cs->conn);
    if (fd >= 0 && send(fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && body)
        (void)!send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (fd >= 0) shutdown(fd, SHUT_WR); /* the answer is whole: a FIN follows it */
    free(body);
    rp_metrics_count_http(s->metrics, 413);
    cs->status = 413;
    return MHD_NO;
}

/* Whether two Content-Length headers disagree (which one a proxy in front
 * believed is unknowable: a request smuggling vector). */
typedef struct cl_scan {
    const char *first;
    int conflict;
} cl_scan;

static enum MHD_Result scan_content_length(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    cl_scan *c = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0 || !value) return MHD_YES;
    if (!c->first) c->first = value;
    else if (strcmp(c->first, value) != 0) c->conflict = 1;
    return MHD_YES;
}

static enum MHD_Result route(conn_state *cs, const char *body, size_t len) {
    switch (cs->rt) {
    case R_COMPLETIONS: return handle_generate(cs, RP_OAI_COMPLETION, body, len);
    case R_CHAT: return handle_generate(cs, RP_OAI_CHAT, body, len);
    case R_MODELS: return handle_models(cs);
    case R_MODEL: return handle_model(cs, cs->path + strlen(MODEL_PREFIX));
    case R_TOKENIZE: return handle_tokenize(cs, body, len);
    case R_DETOKENIZE: return handle_detokenize(cs, body, len);
    case R_HEALTH_GENERATE: { /* one greedy token through the whole engine */
        static const char req[] = "{\"prompt\": [0], \"max_tokens\": 1, \"temperature\": 0, \"ignore_eos\": true}";
        return handle_generate(cs, RP_OAI_COMPLETION, req, sizeof req - 1);
    }
    case R_METRICS: return handle_metrics(cs);
    case R_VERSION: return send_static(cs, 200, "application/json", "{\"version\":\"" REPLAY_VERSION "\"}");
    default: return send_static(cs, 200, "application/json", "{}");
    }
}

/* Whether item is in a comma-separated list (spaces around items ignored;
 * case-sensitive, as origins are compared). */
static int in_list(const char *list, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        if ((size_t)(t - p) == n && !memcmp(p, item, n)) return 1;
        p = e;
    }
    return 0;
}

/* CORS: the Origin a response may name in Access-Control-Allow-Origin
 * ("*" when any is allowed), or 0 when the request has none allowed. */
static int cors_origin(conn_state *cs) {
    rp_server *s = cs->s;
    const char *origin = MHD_lookup_connection_value(cs->conn, MHD_HEADER_KIND, "Origin");
    if (!s->allowed_origins || !origin) return 0;
    if (in_list(s->allowed_origins, "*")) snprintf(cs->cors_origin, sizeof cs->cors_origin, "*");
    else if (in_list(s->allowed_origins, origin) && strlen(origin) < sizeof cs->cors_origin)
        snprintf(cs->cors_origin, sizeof cs->cors_origin, "%s", origin);
    return cs->cors_origin[0] != 0;
}

/* An OPTIONS preflight of a known route (with --allowed-origins): 204 with
 * what may follow, as Starlette's CORSMiddleware (vLLM's) answers; a
 * preflight from an origin not allowed is a 400. "*" for the headers
 * echoes the ones the browser asks for. */
static enum MHD_Result preflight(conn_state *cs) {
    rp_server *s = cs->s;
    if (!cs->cors_origin[0]) {
        rp_oai_error e;
        rp_oai_set_error(&e, 400, "invalid_request_error", NULL, NULL, "Disallowed CORS origin");
        return send_error(cs, &e);
    }
    const char *methods = s->allowed_methods && strcmp(s->allowed_methods, "*") != 0 ? s->allowed_methods
                                                                                      : "GET, POST, HEAD, OPTIONS";
    const char *asked = MHD_lookup_connection_value(cs->conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    const char *headers = s->allowed_headers && strcmp(s->allowed_headers, "*") != 0 ? s->allowed_headers
                          : asked                                                     ? asked
                                                                                      : "*";
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    if (MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods) != MHD_YES ||
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", headers) != MHD_YES ||
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600") != MHD_YES) {
        MHD_destroy_response(resp);
        return MHD_NO;
    }
    return queue(cs, 204, resp, NULL, NULL);
}

/* X-Request-Id: the client's (printable ASCII without spaces, at most 64
 * bytes, since it is sent back and logged), or one made here. -1: the
 * client's is not usable (a 400 names it). */
static int take_request_id(conn_state *cs) {
    const char *h = MHD_lookup_connection_value(cs->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (!h) {
        uint64_t k = __atomic_add_fetch(&cs->s->next_request_id, 1, __ATOMIC_RELAXED);
        snprintf(cs->request_id, sizeof cs->request_id, "%016llx",
                 (unsigned long long)rp_mix64(k ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)(uintptr_t)cs->s));
        return 0;
    }
    size_t n = strlen(h);
    int ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] > 0x20 && h[i] < 0x7f;
    if (!ok) return -1;
    memcpy(cs->request_id, h, n + 1);
    return 0;
}

/* The headers are in: method, route, key and announced size are checked
 * before any of the body is read. A refusal queued now is sent at once and
 * the connection closed (libmicrohttpd reads no body after an early
 * answer). MHD_YES with cs->rt set: read the body. */
static enum MHD_Result check_headers(conn_state *cs, const char *url, const char *method) {
    rp_server *s = cs->s;
    struct MHD_Connection *conn = cs->conn;
    rp_oai_error e;
    cl_scan cl = {0};
    cors_origin(cs); /* refusals carry the CORS header too, so a browser can read them */
    if (take_request_id(cs)) {
        rp_oai_set_error(&e, 400, "invalid_request_error", "X-Request-Id", NULL,
                         "the X-Request-Id header must be 1 to 64 printable ASCII characters without spaces");
        return send_error(cs, &e);
    }
    MHD_get_connection_values(conn, MHD_HEADER_KIND, scan_content_length, &cl);
    if (cl.conflict) {
        rp_oai_set_error(&e, 400, "invalid_request_error", NULL, NULL, "conflicting Content-Length headers");
        return send_error(cs, &e);
    }
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) cs->rt = i;
    if (cs->rt < 0 && !strncmp(url, MODEL_PREFIX, strlen(MODEL_PREFIX)) && url[strlen(MODEL_PREFIX)]) {
        cs->rt = R_MODEL;
        cs->model_match = !strcmp(url + strlen(MODEL_PREFIX), s->served_model);
    }
    if (cs->rt >= 0 && s->allowed_origins && !strcmp(method, "OPTIONS")) return preflight(cs);
    if (cs->rt < 0) {
        rp_oai_set_error(&e, 404, "invalid_request_error", NULL, "not_found", "no route for %s %s", method, url);
        return send_error(cs, &e);
    }
    const char *want = routes[cs->rt].post ? "POST" : "GET";
    if (strcmp(method, want) != 0 && (routes[cs->rt].post || strcmp(method, "HEAD") != 0)) {
        rp_oai_set_error(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s takes %s, not %s", url, want,
                         method);
        return send_text(cs, 405, "application/json", rp_oai_error_json(&e),
                         routes[cs->rt].post ? "POST" : "GET, HEAD");
    }
    if (routes[cs->rt].auth && !authorized(s, conn)) {
        rp_oai_set_error(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                         "missing or incorrect API key: send 'Authorization: Bearer KEY'");
        return send_error(cs, &e);
    }
    if (cl.first && strtoull(cl.first, NULL, 10) > s->cfg.max_body_bytes) {
        set_too_large(s, &e);
        return send_error(cs, &e);
    }
    return MHD_YES;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    rp_server *s = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        set_phase(s, conn, PH_BODY);
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *con_cls = cs;
        cs->s = s;
        cs->conn = conn;
        cs->rt = -1;
        cs->t_start = rp_now_s();
        snprintf(cs->method, sizeof cs->method, "%s", method);
        snprintf(cs->path, sizeof cs->path, "%s", url);
        return check_headers(cs, url, method);
    }
    if (cs->sess) return answer_generate(cs); /* woken: the session is done */
    if (*upload_size) {
        if (cs->body.len + *upload_size > s->cfg.max_body_bytes) return refuse_growing_body(cs);
        if (!cs->out_of_memory && rp_sbuf_add(&cs->body, upload_data, *upload_size))
            cs->out_of_memory = 1; /* answered with a 500 once the body is in */
        *upload_size = 0;
        return MHD_YES;
    }
    set_phase(s, conn, PH_BUSY);
    rp_oai_error e;
    if (cs->out_of_memory) {
        rp_oai_set_out_of_memory(&e);
        return send_error(cs, &e);
    }
    if (cs->rt == R_HEALTH || cs->rt == R_VERSION) return route(cs, NULL, 0);
    if (rp_sessions_enter(&s->sessions)) return send_unavailable(cs);
    enum MHD_Result rc = route(cs, cs->body.p ? cs->body.p : "", cs->body.len);
    rp_sessions_leave(&s->sessions);
    return rc;
}

/* Room for max connections' sockets: the soft limit raised as far as the
 * hard one allows, the connection limit lowered to what fits. */
static void fit_open_files(rp_server *s) {
    enum { SPARE = 64 }; /* model files, the listening socket, ITC pipes */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)s->cfg.max_connections + SPARE;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        int fit = rl.rlim_cur > 2 * SPARE ? (int)(rl.rlim_cur - SPARE) : SPARE;
        rp_log_warn("max connections lowered from %d to %d: the open files limit is %llu", s->cfg.max_connections, fit,
                    (unsigned long long)rl.rlim_cur);
        s->cfg.max_connections = fit;
    }
}

/* Zero limits take their defaults. */
static void fill_defaults(rp_server_config *c) {
    rp_server_config d;
    rp_server_config_default(&d);
    if (!c->host) c->host = d.host;
    if (!c->max_body_bytes) c->max_body_bytes = d.max_body_bytes;
    if (c->max_connections <= 0) c->max_connections = d.max_connections;
    if (c->max_connections_per_address <= 0) c->max_connections_per_address = d.max_connections_per_address;
    if (c->header_timeout_s <= 0) c->header_timeout_s = d.header_timeout_s;
    if (c->body_timeout_s <= 0) c->body_timeout_s = d.body_timeout_s;
    if (c->send_timeout_s <= 0) c->send_timeout_s = d.send_timeout_s;
    if (c->max_queued_requests <= 0) c->max_queued_requests = d.max_queued_requests;
    if (c->http_threads <= 0) c->http_threads = d.http_threads;
    /* a zeroed config: top_p 0 is no valid value, so nothing was set */
    if (c->sampling_defaults.top_p <= 0) c->sampling_defaults = d.sampling_defaults;
}

rp_listener *rp_server_listen(const rp_server_config *cfg, char *err, size_t err_len) {
    return rp_listener_open(cfg->host, cfg->port, err, err_len);
}

static void server_free(rp_server *s) {
    rp_sessions_destroy(&s->sessions);
    rp_metrics_free(s->metrics);
    pthread_mutex_destroy(&s->conn_mu);
    free(s->served_model);
    free(s->api_key);
    free(s->allowed_origins);
    free(s->allowed_methods);
    free(s->allowed_headers);
    free(s);
}

rp_server *rp_server_start(rp_engine *engine, const rp_server_config *cfg, rp_listener *listener, char *err,
                           size_t err_len) {
    rp_tool_parser tool_parser = RP_TOOL_PARSER_HERMES;
    rp_reasoning_kind reasoning_parser = RP_REASONING_QWEN3;
    int bad = 0;
    if ((bad = cfg->tool_call_parser && rp_tool_parser_from_name(cfg->tool_call_parser, &tool_parser)))
        snprintf(err, err_len, "unknown tool-call parser '%s' (hermes, llama3_json, mistral)", cfg->tool_call_parser);
    else if ((bad = cfg->reasoning_parser && rp_reasoning_from_name(cfg->reasoning_parser, &reasoning_parser)))
        snprintf(err, err_len, "unknown reasoning parser '%s' (qwen3, deepseek_r1)", cfg->reasoning_parser);
    if (bad) {
        if (listener) rp_listener_free(listener);
        return NULL;
    }
    if (!listener && !(listener = rp_server_listen(cfg, err, err_len))) return NULL;
    rp_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        rp_listener_free(listener);
        return NULL;
    }
    s->cfg = *cfg;
    fill_defaults(&s->cfg);
    fit_open_files(s);
    pthread_mutex_init(&s->conn_mu, NULL);
    s->served_model = strdup(cfg->served_model ? cfg->served_model : "replay");
    s->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    int cors_oom = 0;
    if (cfg->allowed_origins) {
        s->allowed_origins = strdup(cfg->allowed_origins);
        s->allowed_methods = cfg->allowed_methods ? strdup(cfg->allowed_methods) : NULL;
        s->allowed_headers = cfg->allowed_headers ? strdup(cfg->allowed_headers) : NULL;
        cors_oom = !s->allowed_origins || (cfg->allowed_methods && !s->allowed_methods) ||
                   (cfg->allowed_headers && !s->allowed_headers);
    }
    s->cfg.allowed_origins = s->cfg.allowed_methods = s->cfg.allowed_headers = NULL; /* copied */
    s->cfg.served_model = s->cfg.api_key = NULL; /* the caller's strings may go */
    s->metrics = rp_metrics_new();
    rp_sessions_init(&s->sessions, engine, s->metrics);
    s->sessions.max_queued_requests = s->cfg.max_queued_requests;
    s->oai = (rp_oai_context){.served_model = s->served_model, .tok = rp_engine_tokenizer(engine),
                              .max_context = rp_engine_max_context(engine), .vocab_size = rp_engine_vocab_size(engine),
                              .sampling_defaults = &s->cfg.sampling_defaults,
                              .auto_tool_choice = cfg->enable_auto_tool_choice};
    s->oai.has_tool_parser = cfg->tool_call_parser != NULL;
    s->oai.tool_parser = tool_parser;
    s->oai.has_reasoning_parser = cfg->reasoning_parser != NULL;
    s->oai.reasoning_parser = reasoning_parser;
    s->cfg.tool_call_parser = s->cfg.reasoning_parser = NULL; /* the caller's strings may go */
    rp_stats_log_init(&s->stats, s->cfg.log_stats_interval_s);
    /* the counters' starting point, read before the daemon takes a request:
     * primed by the guard's first tick instead, a request served before that
     * tick would be counted in the baseline and never reported */
    rp_stats_log_tick(&s->stats, engine, rp_now_s());
    s->port = rp_listener_port(listener);
    snprintf(s->url, sizeof s->url, "%s", rp_listener_url(listener));
    if (!s->metrics || !s->served_model || (cfg->api_key && cfg->api_key[0] && !s->api_key) || cors_oom) {
        snprintf(err, err_len, "out of memory");
        rp_listener_free(listener);
        server_free(s);
        return NULL;
    }
    /* epoll on a thread pool, on the socket made before the engine loaded;
     * connections waiting for the engine are suspended (which needs ITC, as
     * does quiescing in rp_server_stop). From here the daemon owns the
     * socket: it closes it when it stops (and, in libmicrohttpd's failure
     * path, when it cannot start: the socket is not closed here again). */
    int fd = rp_listener_take_fd(listener);
    rp_listener_free(listener);
    s->daemon = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC, 0, NULL, NULL, handler, s,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, connection_notify, s, MHD_OPTION_UNESCAPE_CALLBACK, unescape, s,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.http_threads, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->cfg.send_timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections_per_address, MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, err_len, "cannot start the HTTP server on %s", s->url);
        server_free(s);
        return NULL;
    }
    if (pthread_create(&s->guard, NULL, guard_main, s) != 0) {
        snprintf(err, err_len, "cannot start the server's guard thread");
        MHD_stop_daemon(s->daemon);
        server_free(s);
        return NULL;
    }
    return s;
}

int rp_server_port(const rp_server *s) { return s->port; }
const char *rp_server_url(const rp_server *s) { return s->url; }

void rp_server_stop(rp_server *s) {
    if (!s) return;
    MHD_socket lfd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    rp_sessions_stop(&s->sessions); /* the guard aborts running sessions within a watch */
    /* a client that stops reading cannot hold the exit up for longer */
    rp_sessions_wait_idle(&s->sessions, 10.0);
    MHD_stop_daemon(s->daemon); /* closes what is left; their streams are released */
    /* Sessions whose clients are gone hold on until the engine's final
     * events arrive (their aborts are in): then nothing refers to s. */
    rp_sessions_wait_idle(&s->sessions, -1);
    __atomic_store_n(&s->guard_stop, 1, __ATOMIC_RELEASE);
    pthread_join(s->guard, NULL);
    server_free(s);
}
