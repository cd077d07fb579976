/* What the server tells an operator in its log (docs/server.md#logs): one
 * access line per finished request, and the periodic engine line while
 * something runs. Both are structured records (util/log.h): key=value in
 * text, typed members in JSON. */
#ifndef RP_SERVER_SERVE_LOG_H
#define RP_SERVER_SERVE_LOG_H

#include "replay/engine.h"
#include "util/log.h"

/* One finished request, as the access line shows it. */
typedef struct rp_access {
    const char *id;       /* the completion id; NULL: none (not a generation, or refused first) */
    const char *client;   /* "127.0.0.1:5000", "[::1]:5000" */
    const char *method;
    const char *route;    /* the path */
    int status;           /* 0: no answer was sent */
    int prompt_tokens, output_tokens;
    int cached_tokens;    /* of prompt_tokens, found in the prefix cache (usage's cached_tokens) */
    double ttft_ms;       /* from the request's headers to its first token; NAN: no token */
    double total_ms;      /* from the request's headers to its last byte sent */
    const char *end;      /* NULL: answered whole; else why it ended (client_abort, timeout, ...) */
    const char *request_id; /* X-Request-Id: the client's, or the one made for it; NULL: none */
} rp_access;

void rp_access_log(enum rp_log_level level, const rp_access *a);

/* The periodic engine line: prompt and generation throughput over the last
 * interval, requests running and waiting, the KV cache in use, the prefix
 * cache's hit rate over the interval (prompt tokens found cached of those
 * looked up, as vLLM's "Prefix cache hit rate"; NAN when none were) and
 * preemptions. Printed only when tokens moved since the last line or a
 * request runs or waits, so an idle server stays quiet. */
typedef struct rp_stats_log {
    double interval_s; /* <= 0: off */
    double last_s;
    rp_engine_stats last;
    int primed;
} rp_stats_log;

void rp_stats_log_init(rp_stats_log *l, double interval_s);
/* Called often (the server's guard thread); logs at most once an interval. */
void rp_stats_log_tick(rp_stats_log *l, rp_engine *eng, double now_s);

#endif
