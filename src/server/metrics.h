/* The server's Prometheus metrics: latency histograms the HTTP side
 * observes (time to first token, inter-token latency, end-to-end latency,
 * measured when the engine thread hands over each token), counters of
 * finished requests by reason and of HTTP requests by class, and the
 * rendering of all of it plus the engine's own stats (running and waiting
 * requests, token counters, KV pages, the prefix cache's queried and hit
 * tokens, CUDA graph replays) as text. Thread safe: observations come
 * from the engine thread and HTTP threads. */
#ifndef RP_SERVER_METRICS_H
#define RP_SERVER_METRICS_H

#include "replay/engine.h"

typedef struct rp_metrics rp_metrics;

rp_metrics *rp_metrics_new(void);
void rp_metrics_free(rp_metrics *m);

void rp_metrics_observe_ttft(rp_metrics *m, double seconds);
void rp_metrics_observe_itl(rp_metrics *m, double seconds);
void rp_metrics_observe_e2e(rp_metrics *m, double seconds);
void rp_metrics_count_finish(rp_metrics *m, rp_finish reason);
/* One HTTP request answered with this status. */
void rp_metrics_count_http(rp_metrics *m, int status);

/* One request refused with 503 because the queue was full. */
void rp_metrics_count_rejected(rp_metrics *m);

/* The exposition text (malloc'd), engine stats included; NULL when memory
 * runs out (never a text cut short). */
char *rp_metrics_render(rp_metrics *m, const rp_engine_stats *st);

#endif
