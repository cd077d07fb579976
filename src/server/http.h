/* The HTTP server (libmicrohttpd): OpenAI-compatible endpoints over the
 * engine API. A few HTTP threads (epoll, a thread pool) parse, submit to the
 * engine and park the connection until its events arrive; the engine runs
 * on its own thread. The limits that keep one client from locking the
 * others out are in rp_server_config, their defaults in
 * rp_server_config_default (docs/server.md#limits). */
#ifndef RP_SERVER_HTTP_H
#define RP_SERVER_HTTP_H

#include <stdint.h>

#include "replay/engine.h"
#include "server/listener.h"

typedef struct rp_server rp_server;

/* 0 in a limit means its default. host: an IPv4 or IPv6 address or a
 * name; "::" listens on every address, IPv4 ones too (listener.h). */
typedef struct rp_server_config {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0: any free port (rp_server_port says which) */
    const char *served_model;  /* the name clients use */
    const char *api_key;       /* NULL: no authentication */
    size_t max_body_bytes;     /* a request body larger is refused with 413 */
    int max_connections;       /* open connections in all */
    int max_connections_per_address; /* open connections from one client address */
    int header_timeout_s;      /* to send a request's headers, from the connection's start or the last answer */
    int body_timeout_s;        /* to send a request's body, from its headers */
    int send_timeout_s;        /* a client that reads nothing of its answer for this long is closed */
    int max_queued_requests;   /* choices waiting for the engine beyond which requests get 503 */
    int http_threads;          /* libmicrohttpd's thread pool */
    /* Logs (docs/server.md#logs); here 0 is off, not the default. */
    int access_log;               /* one info line per finished request */
    double log_stats_interval_s;  /* the engine line every S seconds while something runs */
    /* The sampling a request gets for the fields it leaves unset
     * (temperature, top_p, top_k, min_p, repetition_penalty): the model's
     * generation_config.json where the command read one; by default
     * rp_request_params_default's. */
    rp_request_params sampling_defaults;
    /* Tool calls and reasoning (docs/tools.md), vLLM's flags: a parser's
     * name or NULL for none. tool_call_parser: hermes, llama3_json or
     * mistral; enable_auto_tool_choice: requests with tools and tool_choice
     * "auto" (or none given) get their calls parsed (off: such a request is
     * a 400, as vLLM); reasoning_parser: qwen3 or deepseek_r1.
     * rp_server_start fails on an unknown name. */
    const char *tool_call_parser;
    int enable_auto_tool_choice;
    const char *reasoning_parser;
    /* CORS (docs/server.md#cors), vLLM's flags: comma lists, "*" for any.
     * allowed_origins NULL: no CORS headers at all (and OPTIONS is a 405);
     * methods and headers NULL: "*". */
    const char *allowed_origins, *allowed_methods, *allowed_headers;
} rp_server_config;

/* The defaults (what a public deployment can keep), in one place. */
void rp_server_config_default(rp_server_config *c);

/* The listening socket for cfg's host and port, made before the engine
 * exists so that a port in use or a host that does not resolve is
 * reported before a model loads: NULL with err ("cannot listen on
 * 127.0.0.1:8000: Address already in use"). Connections that arrive before
 * rp_server_start wait in the socket's backlog. */
rp_listener *rp_server_listen(const rp_server_config *cfg, char *err, size_t err_len);
/* Serves engine on listener, which it takes (and frees when it fails);
 * NULL listens on cfg's host and port now. */
rp_server *rp_server_start(rp_engine *engine, const rp_server_config *cfg, rp_listener *listener, char *err,
                           size_t err_len);
/* The port it listens on, and its URL (http://127.0.0.1:8000, http://[::1]:8000). */
int rp_server_port(const rp_server *s);
const char *rp_server_url(const rp_server *s);
/* Stops accepting, answers new requests on open connections with 503,
 * aborts running requests (streams end with an error event and [DONE]),
 * joins the HTTP threads and frees s. Destroy the engine after this. */
void rp_server_stop(rp_server *s);

#endif
