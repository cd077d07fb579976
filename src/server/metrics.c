/* Prometheus text exposition (format 0.0.4) of the server's histograms and
 * counters and the engine's stats. Bucket bounds follow vLLM's, with finer
 * ones under 10 ms because a decode step on the GPU takes a few ms. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/sbuf.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075,
                                    0.1,   0.15,   0.2,   0.3,    0.4,  0.5,   0.75, 1.0,   2.5};
static const double e2e_bounds[] = {0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0};
#define NB(a) (int)(sizeof a / sizeof a[0])
#define MAX_BUCKETS 24

typedef struct hist {
    const double *bounds;
    int n;
    unsigned long long counts[MAX_BUCKETS + 1]; /* per bucket, the last one +Inf; not cumulative */
    unsigned long long total;
    double sum;
} hist;

struct rp_metrics {
    pthread_mutex_t mu;
    hist ttft, itl, e2e;
    unsigned long long finished[RP_FINISH_REASON_GRAMMAR + 1]; /* by rp_finish */
    unsigned long long http[6];     /* 1xx..5xx by status / 100 */
    unsigned long long rejected_queue_full; /* 503s: --max-queued-requests reached */
};

rp_metrics *rp_metrics_new(void) {
    rp_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (hist){.bounds = ttft_bounds, .n = NB(ttft_bounds)};
    m->itl = (hist){.bounds = itl_bounds, .n = NB(itl_bounds)};
    m->e2e = (hist){.bounds = e2e_bounds, .n = NB(e2e_bounds)};
    return m;
}

void rp_metrics_free(rp_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(rp_metrics *m, hist *h, double v) {
    int b = 0;
    while (b < h->n && v > h->bounds[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->total++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}

void rp_metrics_observe_ttft(rp_metrics *m, double s) { observe(m, &m->ttft, s); }
void rp_metrics_observe_itl(rp_metrics *m, double s) { observe(m, &m->itl, s); }
void rp_metrics_observe_e2e(rp_metrics *m, double s) { observe(m, &m->e2e, s); }

void rp_metrics_count_finish(rp_metrics *m, rp_finish reason) {
    if ((int)reason < 0 || reason > RP_FINISH_REASON_GRAMMAR) return;
    pthread_mutex_lock(&m->mu);
    m->finished[reason]++;
    pthread_mutex_unlock(&m->mu);
}

void rp_metrics_count_rejected(rp_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->rejected_queue_full++;
    pthread_mutex_unlock(&m->mu);
}

void rp_metrics_count_http(rp_metrics *m, int status) {
    int c = status / 100;
    if (c < 1 || c > 5) return;
    pthread_mutex_lock(&m->mu);
    m->http[c]++;
    pthread_mutex_unlock(&m->mu);
}

/* The text so far; failed once an append found no memory (the text is then
 * dropped, never sent cut short). */
typedef struct out {
    rp_sbuf text;
    int failed;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
    if (o->failed) return;
    va_list ap;
    va_start(ap, fmt);
    if (rp_sbuf_vprintf(&o->text, fmt, ap)) o->failed = 1;
    va_end(ap);
}

static void metric(out *o, const char *name, const char *type, const char *help) {
    put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_hist(out *o, const char *name, const char *help, const hist *h) {
    metric(o, name, "histogram", help);
    unsigned long long cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->counts[b];
        put(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], cum);
    }
    put(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->total, name, h->sum, name,
        h->total);
}

char *rp_metrics_render(rp_metrics *m, const rp_engine_stats *st) {
    out o = {0};
    metric(&o, "replay_requests_running", "gauge", "Requests in the running batch.");
    put(&o, "replay_requests_running %d\n", st->running);
    metric(&o, "replay_requests_waiting", "gauge", "Requests waiting for admission.");
    put(&o, "replay_requests_waiting %d\n", st->waiting);
    metric(&o, "replay_prompt_tokens_total", "counter", "Prompt tokens of the requests submitted.");
    put(&o, "replay_prompt_tokens_total %llu\n", (unsigned long long)st->prompt_tokens);
    metric(&o, "replay_generation_tokens_total", "counter", "Tokens generated.");
    put(&o, "replay_generation_tokens_total %llu\n", (unsigned long long)st->generated_tokens);
    metric(&o, "replay_kv_pages_used", "gauge", "KV cache pages holding a request's tokens.");
    put(&o, "replay_kv_pages_used %d\n", st->kv_pages_total - st->kv_pages_free);
    metric(&o, "replay_kv_pages_free", "gauge", "KV cache pages free.");
    put(&o, "replay_kv_pages_free %d\n", st->kv_pages_free);
    metric(&o, "replay_kv_pages_total", "gauge", "KV cache pages in the pool.");
    put(&o, "replay_kv_pages_total %d\n", st->kv_pages_total);
    metric(&o, "replay_kv_pages_cached", "gauge",
           "KV cache pages the prefix cache holds, locked by running requests or not (those not locked count as free).");
    put(&o, "replay_kv_pages_cached %d\n", st->kv_pages_cached);
    metric(&o, "replay_kv_cache_usage_ratio", "gauge", "Share of the KV cache pages in use, 0 to 1.");
    put(&o, "replay_kv_cache_usage_ratio %.6f\n",
        st->kv_pages_total ? (double)(st->kv_pages_total - st->kv_pages_free) / st->kv_pages_total : 0.0);
    /* tokens, as vLLM's vllm:prefix_cache_queries / hits: the hit rate is their ratio over any window */
    metric(&o, "replay_prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache at admission (a preempted request's again when it resumes).");
    put(&o, "replay_prefix_cache_queries_total %llu\n", (unsigned long long)st->prefix_cache_queried_tokens);
    metric(&o, "replay_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache at admission.");
    put(&o, "replay_prefix_cache_hits_total %llu\n", (unsigned long long)st->prefix_cache_hit_tokens);
    /* speculative decoding, as vLLM's vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens:
     * acceptance rate = accepted / draft tokens, mean accepted length = 1 + accepted / drafts */
    metric(&o, "replay_spec_decode_num_drafts_total", "counter", "Speculative rounds verified (decodes with drafts).");
    put(&o, "replay_spec_decode_num_drafts_total %llu\n", (unsigned long long)st->spec_rounds);
    metric(&o, "replay_spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed in verified rounds.");
    put(&o, "replay_spec_decode_num_draft_tokens_total %llu\n", (unsigned long long)st->spec_draft_tokens);
    metric(&o, "replay_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens the target accepted.");
    put(&o, "replay_spec_decode_num_accepted_tokens_total %llu\n", (unsigned long long)st->spec_accepted_tokens);
    /* structured output: logit rows sampled with a token mask, by where it was applied (docs/structured.md) */
    metric(&o, "replay_structured_masked_rows_total", "counter",
           "Logit rows sampled with a structured output token mask: on the backend or on the host.");
    put(&o, "replay_structured_masked_rows_total{path=\"device\"} %llu\n", (unsigned long long)st->masked_rows_device);
    put(&o, "replay_structured_masked_rows_total{path=\"host\"} %llu\n", (unsigned long long)st->masked_rows_host);
    metric(&o, "replay_preemptions_total", "counter", "Requests preempted (recomputed later) for lack of KV pages.");
    put(&o, "replay_preemptions_total %llu\n", (unsigned long long)st->preemptions);
    metric(&o, "replay_steps_total", "counter", "Engine steps run.");
    put(&o, "replay_steps_total %llu\n", (unsigned long long)st->steps);
    metric(&o, "replay_forwards_total", "counter", "Forward passes run by the backend.");
    put(&o, "replay_forwards_total %llu\n", (unsigned long long)st->forwards);
    metric(&o, "replay_cuda_graph_replays_total", "counter", "Forward passes that replayed a captured CUDA graph.");
    put(&o, "replay_cuda_graph_replays_total %llu\n", (unsigned long long)st->graph_replays);
    metric(&o, "replay_cuda_graph_hit_ratio", "gauge", "CUDA graph replays / forward passes (0 on the CPU).");
    put(&o, "replay_cuda_graph_hit_ratio %.6f\n", st->forwards ? (double)st->graph_replays / st->forwards : 0.0);
    pthread_mutex_lock(&m->mu);
    metric(&o, "replay_requests_finished_total", "counter", "Engine requests (choices) finished, by reason.");
    static const char *reasons[] = {NULL, "stop", "length", "abort", "error", "grammar"};
    for (int r = 1; r <= RP_FINISH_REASON_GRAMMAR; r++)
        put(&o, "replay_requests_finished_total{reason=\"%s\"} %llu\n", reasons[r], m->finished[r]);
    metric(&o, "replay_http_requests_total", "counter", "HTTP requests answered, by status class.");
    for (int c = 2; c <= 5; c++) put(&o, "replay_http_requests_total{status=\"%dxx\"} %llu\n", c, m->http[c]);
    metric(&o, "replay_requests_rejected_total", "counter", "Requests refused with 503 before they ran, by reason.");
    put(&o, "replay_requests_rejected_total{reason=\"queue_full\"} %llu\n", m->rejected_queue_full);
    put_hist(&o, "replay_time_to_first_token_seconds", "Time from submission to the first generated token.", &m->ttft);
    put_hist(&o, "replay_inter_token_latency_seconds", "Time between successive tokens of a request.", &m->itl);
    put_hist(&o, "replay_e2e_request_latency_seconds", "Time from submission to the last token.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (o.failed) rp_sbuf_free(&o.text);
    return o.text.p; /* NULL: out of memory */
}
