/* `replay bench serve`: a load generator for an OpenAI-compatible server
 * (replay's or any other), in the manner of sglang.bench_serving with its
 * random dataset: requests of random token ids arrive as a Poisson process,
 * each streams its completion, and the client times the first token, every
 * token after it, and the whole request; then it prints sglang's table.
 *
 * A thread per request speaks plain HTTP/1.1 over a socket: it decodes the
 * chunked body, splits it into SSE events and parses each with jansson. A
 * chunk with a choice is a token (servers stream one per token, as replay's
 * and vLLM's do); the usage chunk (stream_options.include_usage) gives the
 * exact output token count.
 *
 * The workloads are bench_workload.h's, as bench offline runs them: random
 * prompts, prompts sharing a prefix by group, and multi-turn chats (a
 * thread per conversation sends turn k+1 when turn k has finished). The
 * server's usage.prompt_tokens_details.cached_tokens, summed, gives the
 * prefix cache's hit rate.
 *
 * --abort-fraction F makes a share of the requests hang up mid-stream (after
 * a random number of tokens), as careless clients do; they, and requests
 * the server turns away under load (503, 429), are counted apart from
 * failures, so a soak run (scripts/soak-serve.sh) can demand "no error but
 * those". */
#include <arpa/inet.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench_common.h"
#include "cli/bench_workload.h"
#include "cli/cli.h"
#include "util/log.h"
#include "util/progress.h"
#include "util/rng.h"

#define CMD "bench serve"

typedef struct bs_target {
    char host[256], port[16]; /* host without the brackets of an IPv6 address */
    const char *model, *api_key;
    sem_t *slots; /* --max-concurrency, or NULL */
    rp_progress_status *prog;
} bs_target;

/* The Host header's form of the host: an IPv6 address in brackets. */
static const char *host_open(const bs_target *t) { return strchr(t->host, ':') ? "[" : ""; }
static const char *host_close(const bs_target *t) { return strchr(t->host, ':') ? "]" : ""; }

typedef struct bs_req {
    const bs_target *t;
    const int32_t *ids; /* the prompt (its conversation's history) */
    int input_len, output_len, turn;
    int hang_up_after; /* > 0: close the connection after this many token chunks */
    double arrival_s, t0;
    /* results */
    int sent, ok, chunks, usage_tokens;
    int cached_tokens; /* usage.prompt_tokens_details.cached_tokens; -1: the server did not say */
    int status;    /* the response's HTTP status, -1 when none came */
    int hung_up;   /* closed by this client on purpose (hang_up_after) */
    double ttft, latency;
    double *itl; /* gaps between successive token chunks */
    int n_itl, cap_itl;
    double last;
    char error[200];
} bs_req;

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {0}, *res;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- an HTTP response read incrementally ------------------------------------------------ */

/* Takes the next piece of body; nonzero stops the reading (the client hangs up). */
typedef int (*body_fn)(void *user, const char *data, size_t n, double t);

typedef struct reader {
    int fd;
    char buf[65536];
    size_t len;
} reader;

/* Fills more bytes; 0 at end of stream. */
static ssize_t fill(reader *r) {
    if (r->len == sizeof r->buf) return -1;
    ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - r->len);
    if (got > 0) r->len += (size_t)got;
    return got;
}

static void consume(reader *r, size_t n) {
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

/* Reads status and headers, then hands the (de-chunked) body to fn as it
 * arrives. Returns the status, or -1 with a message. */
static int read_http(int fd, body_fn fn, void *user, char *err, size_t errlen) {
    reader r = {.fd = fd};
    char *end;
    for (;;) {
        if (r.len && (end = memmem(r.buf, r.len, "\r\n\r\n", 4))) break;
        if (fill(&r) <= 0) {
            snprintf(err, errlen, "the connection closed before the response headers");
            return -1;
        }
    }
    int status = 0;
    *end = 0;
    sscanf(r.buf, "HTTP/1.%*d %d", &status);
    int chunked = strcasestr(r.buf, "\r\ntransfer-encoding: chunked") != NULL;
    consume(&r, (size_t)(end + 4 - r.buf));
    if (!chunked) { /* Content-Length or close-delimited: all of it is body */
        for (;;) {
            if (r.len && fn(user, r.buf, r.len, rp_now_s())) return status;
            r.len = 0;
            if (fill(&r) <= 0) return status;
        }
    }
    for (;;) {
        char *nl;
        while (!(nl = memmem(r.buf, r.len, "\r\n", 2)))
            if (fill(&r) <= 0) return status;
        unsigned long size = strtoul(r.buf, NULL, 16);
        size_t head = (size_t)(nl + 2 - r.buf);
        if (size == 0) return status;
        if (size + head + 2 > sizeof r.buf) {
            snprintf(err, errlen, "a chunk of %lu bytes is more than this client takes", size);
            return -1;
        }
        while (r.len < head + size + 2)
            if (fill(&r) <= 0) return status;
        if (fn(user, r.buf + head, size, rp_now_s())) return status;
        consume(&r, head + size + 2);
    }
}

/* ---- one streaming request ------------------------------------------------------------------ */

typedef struct sse {
    bs_req *req;
    char *pending; /* an event not complete yet */
    size_t len, cap;
    int done;
    char *body; /* a non-SSE body (an error), the first bytes */
} sse;

static void on_event_text(bs_req *q, char *data, double t) {
    if (q->hung_up) return;
    if (!strcmp(data, "[DONE]")) {
        q->ok = 1;
        return;
    }
    json_t *j = json_loads(data, 0, NULL);
    if (!j) return;
    json_t *err = json_object_get(j, "error");
    if (err) {
        snprintf(q->error, sizeof q->error, "stream error: %s", json_string_value(json_object_get(err, "message")));
        json_decref(j);
        return;
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        q->usage_tokens = (int)json_integer_value(json_object_get(usage, "completion_tokens"));
        json_t *cached = json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens");
        if (json_is_integer(cached)) q->cached_tokens = (int)json_integer_value(cached);
    }
    if (json_array_size(json_object_get(j, "choices")) > 0) {
        if (q->chunks == 0) {
            q->ttft = t - (q->t0 + q->arrival_s);
        } else {
            if (q->n_itl == q->cap_itl) {
                q->cap_itl = q->cap_itl ? q->cap_itl * 2 : 256;
                q->itl = realloc(q->itl, (size_t)q->cap_itl * sizeof *q->itl);
            }
            if (q->itl) q->itl[q->n_itl++] = t - q->last;
        }
        q->chunks++;
        q->last = t;
        if (q->t->prog) rp_progress_status_add(q->t->prog, 0, 1);
        if (q->hang_up_after > 0 && q->chunks >= q->hang_up_after) q->hung_up = 1;
    }
    json_decref(j);
}

static int on_body(void *user, const char *data, size_t n, double t) {
    sse *s = user;
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        char *grown = realloc(s->pending, s->cap);
        if (!grown) {
            snprintf(s->req->error, sizeof s->req->error, "out of memory reading the stream");
            return 1;
        }
        s->pending = grown;
    }
    memcpy(s->pending + s->len, data, n);
    s->len += n;
    s->pending[s->len] = 0;
    char *p = s->pending, *end;
    while ((end = strstr(p, "\n\n"))) {
        *end = 0;
        if (!strncmp(p, "data: ", 6)) on_event_text(s->req, p + 6, t);
        p = end + 2;
    }
    s->len -= (size_t)(p - s->pending);
    memmove(s->pending, p, s->len);
    return s->req->hung_up;
}

/* Sends one request and reads its stream to the end (or hangs up). */
static void run_request(bs_req *q) {
    const bs_target *t = q->t;
    q->sent = 1;
    q->cached_tokens = -1;
    double wait = q->t0 + q->arrival_s - rp_now_s();
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
    if (t->slots) sem_wait(t->slots);
    double start = rp_now_s();
    q->arrival_s = start - q->t0; /* TTFT from when it was sent (a concurrency cap may delay it) */
    size_t cap = (size_t)q->input_len * 12 + 1024;
    char *body = malloc(cap), *head = malloc(1024);
    size_t n = (size_t)snprintf(body, cap, "{\"model\":\"%s\",\"prompt\":[", t->model);
    for (int i = 0; i < q->input_len; i++) n += (size_t)snprintf(body + n, cap - n, "%s%d", i ? "," : "", q->ids[i]);
    n += (size_t)snprintf(body + n, cap - n,
                          "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,\"stream\":true,"
                          "\"stream_options\":{\"include_usage\":true}}",
                          q->output_len);
    char auth[300] = "";
    if (t->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    size_t hn = (size_t)snprintf(head, 1024,
                                 "POST /v1/completions HTTP/1.1\r\nHost: %s%s%s:%s\r\nContent-Type: application/json\r\n"
                                 "%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
                                 host_open(t), t->host, host_close(t), t->port, auth, n);
    int fd = connect_to(t->host, t->port);
    q->status = -1;
    if (fd < 0) {
        snprintf(q->error, sizeof q->error, "cannot connect to %.100s:%s", t->host, t->port);
    } else if (send_all(fd, head, hn) || send_all(fd, body, n)) {
        snprintf(q->error, sizeof q->error, "the server closed the connection while the request was sent");
    } else {
        sse s = {.req = q};
        char err[160] = "";
        int status = read_http(fd, on_body, &s, err, sizeof err);
        q->status = status;
        if (q->hung_up) {
            q->error[0] = 0; /* closed on purpose: neither a success nor a failure */
        } else if (status != 200) {
            q->ok = 0;
            if (status < 0) snprintf(q->error, sizeof q->error, "%s", err);
            else snprintf(q->error, sizeof q->error, "HTTP %d: %.150s", status, s.pending ? s.pending : "");
        } else if (!q->ok && !q->error[0]) {
            snprintf(q->error, sizeof q->error, "the stream ended without [DONE]");
        }
        if (q->error[0]) q->ok = 0;
        free(s.pending);
    }
    if (fd >= 0) close(fd);
    q->latency = rp_now_s() - start;
    if (t->slots) sem_post(t->slots);
    if (t->prog) rp_progress_status_add(t->prog, 1, 0);
    free(body);
    free(head);
}

/* One conversation: its requests in turn, each sent when the one before
 * has ended; a turn that fails or hangs up ends it. */
typedef struct bs_conv {
    const rp_bench_workload *w;
    bs_req *reqs; /* all of them: turn t is reqs[t x N + index] */
    long index;
    int vocab;
} bs_conv;

static void *run_conversation(void *arg) {
    bs_conv *cv = arg;
    const rp_bench_workload *w = cv->w;
    const long room = rp_bench_workload_max_prompt(w) + rp_bench_workload_max_output(w);
    int32_t *history = malloc((size_t)room * sizeof *history);
    int len = 0;
    for (long t = 0; t < w->turns; t++) {
        bs_req *q = &cv->reqs[t * w->num_prompts + cv->index];
        if (!history) {
            snprintf(q->error, sizeof q->error, "out of memory for the prompt");
            q->sent = 1;
            break;
        }
        len += rp_bench_workload_new_tokens(w, cv->index, t, cv->vocab, history + len);
        q->ids = history;
        q->input_len = len;
        if (t > 0) q->arrival_s = rp_now_s() - q->t0; /* now: the turn before has ended */
        run_request(q);
        if (!q->ok) break;
        /* the answer as the next turn resends it: the client sees text, not the ids */
        int answer = q->usage_tokens > 0 ? q->usage_tokens : q->chunks;
        if (answer > q->output_len) answer = q->output_len; /* what max_tokens allows: history has room for it */
        rp_bench_workload_answer_stand_in(w, cv->index, t, answer, cv->vocab, history + len);
        len += answer;
    }
    free(history);
    return NULL;
}

/* ---- the served model, from /v1/models --------------------------------------------------- */

typedef struct grab {
    char *p;
    size_t len;
} grab;

static int grab_body(void *user, const char *data, size_t n, double t) {
    (void)t;
    grab *g = user;
    char *q = realloc(g->p, g->len + n + 1);
    if (!q) return 1;
    g->p = q;
    memcpy(g->p + g->len, data, n);
    g->len += n;
    g->p[g->len] = 0;
    return 0;
}

/* The first model's id (malloc'd) and, when the server says (replay
 * does), its vocabulary size. */
static int query_model(const bs_target *t, char **model, long *vocab, char *err, size_t errlen) {
    int fd = connect_to(t->host, t->port);
    if (fd < 0) return snprintf(err, errlen, "cannot connect to %.100s:%s", t->host, t->port), -1;
    char head[512];
    char auth[300] = "";
    if (t->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    int hn = snprintf(head, sizeof head, "GET /v1/models HTTP/1.1\r\nHost: %s%s%s:%s\r\n%sConnection: close\r\n\r\n",
                      host_open(t), t->host, host_close(t), t->port, auth);
    grab g = {0};
    int status = send_all(fd, head, (size_t)hn) ? -1 : read_http(fd, grab_body, &g, err, errlen);
    close(fd);
    json_t *j = status == 200 && g.p ? json_loads(g.p, 0, NULL) : NULL;
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    int rc = -1;
    if (json_is_string(json_object_get(m, "id"))) {
        if (!*model) *model = strdup(json_string_value(json_object_get(m, "id")));
        if (json_is_integer(json_object_get(m, "vocab_size")) && *vocab <= 0)
            *vocab = (long)json_integer_value(json_object_get(m, "vocab_size"));
        rc = 0;
    } else if (status >= 0) {
        snprintf(err, errlen, "GET /v1/models answered %d without a model", status);
    }
    json_decref(j);
    free(g.p);
    return rc;
}

/* Speculative decoding's counters from the server's /metrics (replay's
 * replay_spec_decode_*: rounds, draft tokens, accepted drafts); -1 where the
 * server has no such metrics (another server, or no /metrics), so that the
 * table shows acceptance over the run only where it can be known. */
static int query_spec(const bs_target *t, double out[3]) {
    int fd = connect_to(t->host, t->port);
    if (fd < 0) return -1;
    char head[512], auth[300] = "", err[128];
    if (t->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    int hn = snprintf(head, sizeof head, "GET /metrics HTTP/1.1\r\nHost: %s%s%s:%s\r\n%sConnection: close\r\n\r\n",
                      host_open(t), t->host, host_close(t), t->port, auth);
    grab g = {0};
    int status = send_all(fd, head, (size_t)hn) ? -1 : read_http(fd, grab_body, &g, err, sizeof err);
    close(fd);
    static const char *names[3] = {"replay_spec_decode_num_drafts_total ", "replay_spec_decode_num_draft_tokens_total ",
                                   "replay_spec_decode_num_accepted_tokens_total "};
    int found = 0;
    for (int k = 0; k < 3 && status == 200 && g.p; k++) {
        const char *line = strstr(g.p, names[k]);
        /* a sample line starts a line (the # HELP and # TYPE lines name it after '#') */
        while (line && line != g.p && line[-1] != '\n') line = strstr(line + 1, names[k]);
        if (line) out[k] = strtod(line + strlen(names[k]), NULL), found++;
    }
    free(g.p);
    return found == 3 ? 0 : -1;
}

/* ---- statistics and the table ------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct summary {
    double mean, median, p95, p99, max;
} summary;

/* numpy.percentile's linear interpolation, as sglang uses. */
static double percentile(const double *sorted, int n, double p) {
    double pos = (n - 1) * p / 100.0;
    int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

static summary summarize(double *v, int n) {
    summary s = {0};
    if (n == 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = sum / n;
    s.median = percentile(v, n, 50);
    s.p95 = percentile(v, n, 95);
    s.p99 = percentile(v, n, 99);
    s.max = v[n - 1];
    return s;
}

static void row_s(const char *k, const char *v) { printf("%-41s%s\n", k, v); }
static void row_d(const char *k, double v) { printf("%-41s%.2f\n", k, v); }
static void row_i(const char *k, long v) { printf("%-41s%ld\n", k, v); }
static void rule(const char *title) {
    int w = 50, tl = (int)strlen(title), left = (w - tl) / 2;
    printf("%.*s%s%.*s\n", left, "--------------------------------------------------", title, w - tl - left,
           "--------------------------------------------------");
}

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay bench serve [--base-url URL] [OPTIONS]\n"
            "\n"
            "A load generator for an OpenAI-compatible server, as sglang.bench_serving with its random dataset:\n"
            "N streaming completions of random token ids arrive as a Poisson process of R requests/s, and\n"
            "sglang's table is printed: request and token throughput, concurrency, the prefix cache's hit rate\n"
            "(from usage.prompt_tokens_details.cached_tokens), end-to-end latency, TTFT, TPOT and ITL (mean,\n"
            "median, p99), and against a replay server that speculates, the drafts it kept over the run (its\n"
            "/metrics before and after; other traffic counts too). With --multi-turn, conversations arrive so, and each sends its next turn when the\n"
            "last has ended; the client sees text, not the answer's ids, so a turn resends its own random\n"
            "tokens in the answer's place: the server finds the earlier prompt cached, not the answer.\n"
            "\n"
            "Server:\n"
            "  --base-url URL           http://HOST[:PORT] of the server; plain HTTP, no path (the client\n"
            "                           sends /v1/models and /v1/completions) (default http://127.0.0.1:8000)\n"
            "  --model NAME             the model name to send (default: the first of GET /v1/models)\n"
            "  --api-key KEY            sent as 'Authorization: Bearer KEY' (default: none)\n"
            "\n"
            "Workload:\n"
            "  --num-prompts N          requests, or conversations with --multi-turn (default 1000)\n"
            "  --request-rate R         mean arrivals per second, Poisson (default inf: all at once)\n"
            "  --max-concurrency C      at most C requests in flight (default: no limit)\n"
            "  --input-len L            prompt tokens (default 1024)\n"
            "  --output-len M           output tokens, ignore_eos on (default 1024)\n"
            RP_BENCH_RANGE_RATIO_HELP
            RP_BENCH_WORKLOAD_HELP
            "  --vocab V                prompt ids below V (default: the server's vocab_size, else 1000)\n"
            "  --seed S                 prompts, lengths and arrivals (default 1)\n"
            "  --abort-fraction F       this share of requests hang up mid-stream after a random number\n"
            "                           of tokens (default 0); with 503/429 answers they are not failures\n"
            "\n");
    rp_bench_output_help(f, RP_BENCH_PROGRESS_HELP);
}

/* --base-url: http://HOST[:PORT][/], HOST a name, an IPv4 address or an
 * [IPv6] one; the port 80 when absent. 0, or RP_EXIT_USAGE with the message
 * naming what is wrong. */
static int parse_base_url(const char *url, bs_target *t) {
    if (!strncmp(url, "https://", 8))
        return rp_cli_usage_error(CMD, "--base-url %s: bench serve speaks plain HTTP, not https", url);
    if (strncmp(url, "http://", 7))
        return rp_cli_usage_error(CMD, "--base-url must be http://HOST[:PORT], got '%s'", url);
    const char *h = url + 7, *p;
    size_t n;
    if (*h == '[') { /* [IPv6] */
        const char *close = strchr(h, ']');
        if (!close) return rp_cli_usage_error(CMD, "--base-url %s: an IPv6 host needs its closing ']'", url);
        h++;
        n = (size_t)(close - h);
        p = close + 1;
    } else {
        n = strcspn(h, ":/");
        p = h + n;
    }
    if (n == 0) return rp_cli_usage_error(CMD, "--base-url %s has no host", url);
    if (n >= sizeof t->host) return rp_cli_usage_error(CMD, "--base-url %s: the host is too long", url);
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)h[i]) && !strchr(".-_:", h[i]))
            return rp_cli_usage_error(CMD, "--base-url %s: '%.*s' is not a host name or address", url, (int)n, h);
    memcpy(t->host, h, n);
    t->host[n] = 0;
    snprintf(t->port, sizeof t->port, "80");
    if (*p == ':') {
        const size_t digits = strcspn(p + 1, "/");
        char port[16];
        long v;
        snprintf(port, sizeof port, "%.*s", (int)(digits < 15 ? digits : 15), p + 1);
        if (digits == 0 || digits > 5 || rp_parse_int(port, 1, 65535, &v))
            return rp_cli_usage_error(CMD, "--base-url %s: the port must be from 1 to 65535, got '%.*s'", url,
                                      (int)digits, p + 1);
        snprintf(t->port, sizeof t->port, "%ld", v);
        p += 1 + digits;
    }
    if (*p == '/' && p[1])
        return rp_cli_usage_error(CMD, "--base-url %s: give no path ('%s'); the client sends /v1/models and "
                                       "/v1/completions itself",
                                  url, p);
    if (*p && strcmp(p, "/")) return rp_cli_usage_error(CMD, "--base-url must be http://HOST[:PORT], got '%s'", url);
    return 0;
}

static const struct option options[] = {
    {"base-url", required_argument, 0, 'u'},     {"num-prompts", required_argument, 0, 'n'},
    {"request-rate", required_argument, 0, 'r'}, {"input-len", required_argument, 0, 'i'},
    {"output-len", required_argument, 0, 'o'},   {"model", required_argument, 0, 'm'},
    {"vocab", required_argument, 0, 'v'},        {"seed", required_argument, 0, 's'},
    {"api-key", required_argument, 0, 'k'},      {"max-concurrency", required_argument, 0, 'c'},
    {"random-range-ratio", required_argument, 0, 'R'}, {"abort-fraction", required_argument, 0, 'a'},
    {"progress-interval", required_argument, 0, 'p'},  RP_BENCH_WORKLOAD_LONG_OPTIONS, RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    const char *url = "http://127.0.0.1:8000";
    char *model = NULL;
    long num = 1000, in_len = 1024, out_len = 1024, vocab = 0, max_conc = 0;
    double rate = INFINITY, range = 0, abort_fraction = 0, interval = RP_BENCH_PROGRESS_INTERVAL;
    uint64_t seed = 1;
    bs_target t = {0};
    rp_bench_workload w = {.num_groups = 1, .turns = 1};
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, NULL, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'u': url = optarg; break;
        case 'm': model = optarg; break;
        case 'k': t.api_key = optarg; break;
        case 'n':
            if (rp_parse_int(optarg, 1, 1000000, &num))
                return rp_cli_usage_error(CMD, "--num-prompts must be an integer from 1 to 1000000, got '%s'", optarg);
            break;
        case 'i':
            if (rp_parse_int(optarg, 1, 1 << 20, &in_len))
                return rp_cli_usage_error(CMD, "--input-len must be an integer from 1 to %d, got '%s'", 1 << 20, optarg);
            break;
        case 'o':
            if (rp_parse_int(optarg, 1, 1 << 20, &out_len))
                return rp_cli_usage_error(CMD, "--output-len must be an integer from 1 to %d, got '%s'", 1 << 20, optarg);
            break;
        case 'v':
            if (rp_parse_int(optarg, 1, 1 << 30, &vocab))
                return rp_cli_usage_error(CMD, "--vocab must be an integer from 1 to %d, got '%s'", 1 << 30, optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 20, &max_conc))
                return rp_cli_usage_error(CMD, "--max-concurrency must be an integer from 1 to %d, got '%s'", 1 << 20,
                                          optarg);
            break;
        case 's':
            if (rp_parse_u64(optarg, &seed))
                return rp_cli_usage_error(CMD, "--seed must be a non-negative integer, got '%s'", optarg);
            break;
        case 'p':
            if (rp_bench_parse_interval(optarg, &interval, CMD)) return RP_EXIT_USAGE;
            break;
        case 'a':
            if (rp_parse_float(optarg, &abort_fraction) || abort_fraction < 0 || abort_fraction > 1)
                return rp_cli_usage_error(CMD, "--abort-fraction must be in [0, 1], got '%s'", optarg);
            break;
        case 'R':
            if (rp_bench_parse_range_ratio(optarg, &range, CMD)) return RP_EXIT_USAGE;
            break;
        case 'r':
            if (!strcmp(optarg, "inf")) rate = INFINITY;
            else if (rp_parse_float(optarg, &rate) || rate <= 0)
                return rp_cli_usage_error(CMD, "--request-rate must be a positive number or inf, got '%s'", optarg);
            break;
        default:
            if (rp_bench_workload_parse(&w, opt, optarg, CMD) != 1) return RP_EXIT_USAGE; /* reported */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    /* the random workload's streams as they have always been: lengths 998 and 997, ids the request's index */
    w.num_prompts = num;
    w.input_len = in_len;
    w.output_len = out_len;
    w.range = range;
    w.seed = seed;
    w.in_stream = 998;
    w.out_stream = 997;
    w.token_stream = 0;
    if (rp_bench_workload_check(&w, CMD)) return RP_EXIT_USAGE;
    if (parse_base_url(url, &t)) return RP_EXIT_USAGE;
    if (model && !(model = strdup(model))) return rp_cli_runtime_error(CMD, "out of memory");
    char err[256];
    if ((!model || vocab <= 0) && query_model(&t, &model, &vocab, err, sizeof err) && !model)
        return rp_cli_runtime_error(CMD, "%s (give --model NAME)", err);
    if (vocab <= 0) vocab = 1000; /* ids every real vocabulary has */
    t.model = model;
    double spec0[3], spec1[3];
    const int have_spec = query_spec(&t, spec0) == 0;
    sem_t slots;
    if (max_conc > 0) {
        sem_init(&slots, 0, (unsigned)max_conc);
        t.slots = &slots;
    }
    const long total = rp_bench_workload_requests(&w);
    bs_req *reqs = calloc((size_t)total, sizeof *reqs);
    bs_conv *convs = calloc((size_t)num, sizeof *convs);
    pthread_t *th = calloc((size_t)num, sizeof *th);
    if (!reqs || !convs || !th) {
        free(reqs), free(convs), free(th), free(model);
        return rp_cli_runtime_error(CMD, "out of memory");
    }
    rp_progress_status prog = {0};
    rp_progress_status_start(&prog, CMD, "requests", (uint64_t)total, interval);
    t.prog = &prog;
    double t0 = rp_now_s() + 0.05, arrival = 0;
    for (long i = 0; i < total; i++) { /* request i: turn i / N of conversation i mod N */
        bs_req *r = &reqs[i];
        const int ol = rp_bench_workload_output(&w, i % num, i / num);
        *r = (bs_req){.t = &t, .output_len = ol, .turn = (int)(i / num), .t0 = t0};
        if (rp_rand_uniform(seed, 996, (uint64_t)i) < abort_fraction) /* hang up after 1..ol tokens */
            r->hang_up_after = 1 + (int)(rp_rand_u64(seed, 995, (uint64_t)i) % (uint64_t)ol);
    }
    long started = 0; /* conversations */
    for (long i = 0; i < num; i++, started++) {
        if (isfinite(rate)) { /* exponential gaps: a Poisson process */
            double u = rp_rand_uniform(seed, 999, (uint64_t)i);
            arrival += -log1p(-u) / rate;
        }
        reqs[i].arrival_s = arrival; /* its first turn's */
        convs[i] = (bs_conv){.w = &w, .reqs = reqs, .index = i, .vocab = (int)vocab};
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 << 10);
        int rc = pthread_create(&th[i], &attr, run_conversation, &convs[i]);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            fprintf(stderr, "replay bench serve: cannot start request thread %ld; stopping there\n", i);
            break;
        }
    }
    for (long i = 0; i < started; i++) pthread_join(th[i], NULL);
    rp_progress_status_stop(&prog);
    double end = t0;
    for (long i = 0; i < total; i++)
        if (reqs[i].sent && t0 + reqs[i].arrival_s + reqs[i].latency > end)
            end = t0 + reqs[i].arrival_s + reqs[i].latency;
    double duration = end - t0;
    long ok = 0, in_tokens = 0, out_tokens = 0, n_itl = 0, sent = 0;
    for (long i = 0; i < total; i++) n_itl += reqs[i].n_itl, sent += reqs[i].sent;
    double *ttft = malloc((size_t)(total + 1) * sizeof *ttft), *tpot = malloc((size_t)(total + 1) * sizeof *tpot);
    double *e2e = malloc((size_t)(total + 1) * sizeof *e2e), *itl = malloc((size_t)(n_itl + 1) * sizeof *itl);
    int n_ttft = 0, n_tpot = 0, n_e2e = 0;
    n_itl = 0;
    double busy = 0, ttft_later = 0;
    const char *first_error = NULL;
    long hung_up = 0, rejected = 0, failed = 0, n_later = 0;
    long cached = 0, cached_in = 0, cached_told = 0; /* usage's cached_tokens, the prompts it was told for */
    for (long i = 0; i < total; i++) {
        bs_req *r = &reqs[i];
        if (!r->sent) continue;
        if (r->hung_up) {
            hung_up++;
            continue;
        }
        if (!r->ok && (r->status == 503 || r->status == 429)) {
            rejected++;
            continue;
        }
        if (!r->ok) {
            failed++;
            if (!first_error) first_error = r->error;
            continue;
        }
        int toks = r->usage_tokens > 0 ? r->usage_tokens : r->chunks;
        ok++;
        in_tokens += r->input_len;
        out_tokens += toks;
        ttft[n_ttft++] = r->ttft * 1e3;
        if (r->turn > 0) ttft_later += r->ttft * 1e3, n_later++;
        if (r->cached_tokens >= 0) cached += r->cached_tokens, cached_in += r->input_len, cached_told++;
        e2e[n_e2e++] = r->latency * 1e3;
        if (toks > 1) tpot[n_tpot++] = (r->latency - r->ttft) / (toks - 1) * 1e3;
        for (int k = 0; k < r->n_itl; k++) itl[n_itl++] = r->itl[k] * 1e3;
        busy += r->latency;
    }
    char buf[64];
    printf("\n============ Serving Benchmark Result ============\n");
    row_s("Backend:", "openai-compatible (replay bench serve)");
    row_s("Base URL:", url);
    row_s("Model:", model);
    if (isfinite(rate)) snprintf(buf, sizeof buf, "%.2f", rate);
    else snprintf(buf, sizeof buf, "inf");
    row_s("Traffic request rate:", buf);
    if (max_conc) snprintf(buf, sizeof buf, "%ld", max_conc);
    else snprintf(buf, sizeof buf, "not set");
    row_s("Max request concurrency:", buf);
    char wl[128];
    rp_bench_workload_describe(&w, wl, sizeof wl);
    row_s("Workload:", wl);
    row_i("Successful requests:", ok);
    if (abort_fraction > 0) row_i("Hung up by the client (on purpose):", hung_up);
    row_i("Turned away (503, 429):", rejected);
    row_i("Failed:", failed + (num - started) * w.turns);
    if (w.turns > 1) row_i("Turns not sent (conversation ended):", total - sent - (num - started) * w.turns);
    row_d("Benchmark duration (s):", duration);
    row_i("Total input tokens:", in_tokens);
    row_i("Total generated tokens:", out_tokens);
    row_d("Request throughput (req/s):", ok / duration);
    row_d("Input token throughput (tok/s):", in_tokens / duration);
    row_d("Output token throughput (tok/s):", out_tokens / duration);
    row_d("Total token throughput (tok/s):", (in_tokens + out_tokens) / duration);
    row_d("Concurrency:", busy / duration);
    /* the server's own count, so it says what its cache did (replay, vLLM with prompt tokens details) */
    if (cached_told) {
        row_i("Cached input tokens:", cached);
        row_d("Prefix cache hit rate (%):", cached_in ? 100.0 * (double)cached / (double)cached_in : 0.0);
    } else {
        row_s("Prefix cache hit rate (%):", "n/a (no usage.prompt_tokens_details.cached_tokens)");
    }
    /* the server's counters over the run (other traffic on the server counts too) */
    if (have_spec && query_spec(&t, spec1) == 0 && spec1[1] > spec0[1]) {
        const double rounds = spec1[0] - spec0[0], drafts = spec1[1] - spec0[1], kept = spec1[2] - spec0[2];
        row_d("Speculative acceptance (%):", 100.0 * kept / drafts);
        row_d("Speculative tokens a round:", rounds > 0 ? 1.0 + kept / rounds : 0.0);
    }
    summary s = summarize(e2e, n_e2e);
    rule("End-to-End Latency");
    row_d("Mean E2E Latency (ms):", s.mean);
    row_d("Median E2E Latency (ms):", s.median);
    row_d("P99 E2E Latency (ms):", s.p99);
    s = summarize(ttft, n_ttft);
    rule("Time to First Token");
    row_d("Mean TTFT (ms):", s.mean);
    row_d("Median TTFT (ms):", s.median);
    row_d("P99 TTFT (ms):", s.p99);
    if (w.turns > 1) row_d("Mean TTFT, turns after the first (ms):", n_later ? ttft_later / (double)n_later : 0.0);
    s = summarize(tpot, n_tpot);
    rule("Time per Output Token (excl. 1st token)");
    row_d("Mean TPOT (ms):", s.mean);
    row_d("Median TPOT (ms):", s.median);
    row_d("P99 TPOT (ms):", s.p99);
    s = summarize(itl, n_itl);
    rule("Inter-Token Latency");
    row_d("Mean ITL (ms):", s.mean);
    row_d("Median ITL (ms):", s.median);
    row_d("P95 ITL (ms):", s.p95);
    row_d("P99 ITL (ms):", s.p99);
    row_d("Max ITL (ms):", s.max);
    printf("==================================================\n");
    if (first_error) printf("%ld of %ld requests failed; the first: %s\n", failed, total, first_error);
    for (long i = 0; i < total; i++) free(reqs[i].itl);
    free(reqs);
    free(convs);
    free(th);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    free(model);
    if (t.slots) sem_destroy(&slots);
    /* success: every request answered, hung up on purpose, or turned away under load */
    return failed == 0 && started == num ? RP_EXIT_OK : RP_EXIT_RUNTIME;
}

const rp_cli_command rp_cli_bench_serve = {"bench serve", "a Poisson-arrival streaming client for an OpenAI-compatible server", options, help, run};
