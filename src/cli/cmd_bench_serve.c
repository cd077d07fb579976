/* `replay bench serve`: a load generator for an OpenAI-compatible server
 * (replay's or any other), in the manner of sglang.bench_serving: requests
 * of random token ids arrive as a Poisson process, each streams its
 * completion, and the client times the first token, every token after it,
 * and the whole request.
 *
 * A thread per request speaks plain HTTP/1.1 over a socket (the server
 * under test is on this machine or one it can reach) and reads the SSE
 * stream chunk by chunk, timing each `data:` event that carries text. */
#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/log.h"
#include "util/rng.h"

#define CMD "bench serve"

typedef struct bs_req {
    const char *host, *port, *model, *api_key;
    int input_len, output_len, vocab;
    uint64_t seed, index;
    double arrival_s, t0;
    /* results */
    int ok, tokens;
    double ttft, latency;
    double *itl; /* gaps between successive text events */
    int n_itl, cap_itl;
    char error[160];
} bs_req;

static double now_s(void) { return rp_now_s(); }

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

static void *run_request(void *arg) {
    bs_req *r = arg;
    double wait = r->t0 + r->arrival_s - now_s();
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
    size_t cap = (size_t)r->input_len * 8 + 1024;
    char *body = malloc(cap), *req = malloc(cap + 1024);
    size_t n = (size_t)snprintf(body, cap, "{\"model\":\"%s\",\"prompt\":[", r->model);
    for (int i = 0; i < r->input_len; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s%llu", i ? "," : "",
                              (unsigned long long)(rp_rand_u64(r->seed, r->index, (uint64_t)i) % (uint64_t)r->vocab));
    n += (size_t)snprintf(body + n, cap - n,
                          "],\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0,\"stream\":true}", r->output_len);
    char auth[300] = "";
    if (r->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", r->api_key);
    size_t rn = (size_t)snprintf(req, cap + 1024,
                                 "POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                                 "%sContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                                 r->host, r->port, auth, n, body);
    free(body);
    double start = now_s(), last = 0;
    int fd = connect_to(r->host, r->port);
    if (fd < 0) {
        snprintf(r->error, sizeof r->error, "cannot connect to %s:%s", r->host, r->port);
        free(req);
        return NULL;
    }
    for (size_t off = 0; off < rn;) {
        ssize_t w = write(fd, req + off, rn - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(req);
    char buf[65536];
    int header_done = 0, status = 0;
    size_t carry = 0;
    for (;;) {
        ssize_t got = read(fd, buf + carry, sizeof buf - 1 - carry);
        if (got <= 0) break;
        double t = now_s();
        size_t len = carry + (size_t)got;
        buf[len] = 0;
        char *p = buf;
        if (!header_done) {
            char *end = strstr(buf, "\r\n\r\n");
            if (!end) {
                carry = len;
                continue;
            }
            sscanf(buf, "HTTP/1.%*d %d", &status);
            header_done = 1;
            p = end + 4;
        }
        /* count SSE events that carry text (chunked framing lines are skipped) */
        for (char *q = p; (q = strstr(q, "data: ")) != NULL; q += 6) {
            if (!strncmp(q + 6, "[DONE]", 6)) {
                r->ok = status == 200;
                break;
            }
            /* one event per generated token (the usage chunk has no choices) */
            char *nl = strchr(q, '\n');
            char *choices = strstr(q, "\"choices\":[{");
            if (choices && (!nl || choices < nl)) {
                if (r->tokens == 0) r->ttft = t - start;
                else {
                    if (r->n_itl == r->cap_itl) {
                        r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 256;
                        r->itl = realloc(r->itl, (size_t)r->cap_itl * sizeof *r->itl);
                    }
                    r->itl[r->n_itl++] = t - last;
                }
                r->tokens++;
                last = t;
            }
        }
        /* keep an unfinished event for the next read */
        char *tail = strrchr(p, '\n');
        carry = tail ? len - (size_t)(tail + 1 - buf) : 0;
        if (carry > 4096) carry = 0;
        if (carry) memmove(buf, buf + len - carry, carry);
    }
    close(fd);
    r->latency = now_s() - start;
    if (!r->ok && !r->error[0]) snprintf(r->error, sizeof r->error, "HTTP status %d, stream not finished", status);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats(double *v, int n, double *mean, double *median, double *p99) {
    if (n == 0) {
        *mean = *median = *p99 = 0;
        return;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *p99 = v[(int)((n - 1) * 0.99)];
}

int rp_cmd_bench_serve(int argc, char **argv) {
    static const struct option longopts[] = {
        {"base-url", required_argument, 0, 'u'}, {"num-prompts", required_argument, 0, 'n'},
        {"request-rate", required_argument, 0, 'r'}, {"input-len", required_argument, 0, 'i'},
        {"output-len", required_argument, 0, 'o'}, {"model", required_argument, 0, 'm'},
        {"vocab", required_argument, 0, 'v'}, {"seed", required_argument, 0, 's'},
        {"api-key", required_argument, 0, 'k'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *url = "http://127.0.0.1:8000", *model = NULL, *api_key = NULL;
    long num = 100, in_len = 512, out_len = 128, vocab = 1000;
    double rate = 0;
    uint64_t seed = 0;
    optind = 1;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            printf("Usage: replay bench serve [--base-url URL] [--model NAME] [--num-prompts N] [--request-rate R]\n"
                   "                          [--input-len L] [--output-len M] [--vocab V] [--seed S] [--api-key K]\n\n"
                   "Sends N streaming completions of L random token ids (ids below V) to an OpenAI-compatible\n"
                   "server, arriving as a Poisson process of R requests/s (0 = all at once), and prints\n"
                   "throughput, TTFT, TPOT and ITL (mean, median, p99) and concurrency.\n");
            return RP_EXIT_OK;
        case 'u': url = optarg; break;
        case 'm': model = optarg; break;
        case 'k': api_key = optarg; break;
        case 'n':
            if (rp_parse_int(optarg, 1, 100000, &num)) return rp_cli_usage_error(CMD, "--num-prompts must be >= 1");
            break;
        case 'i':
            if (rp_parse_int(optarg, 1, 1 << 20, &in_len)) return rp_cli_usage_error(CMD, "--input-len must be >= 1");
            break;
        case 'o':
            if (rp_parse_int(optarg, 1, 1 << 20, &out_len)) return rp_cli_usage_error(CMD, "--output-len must be >= 1");
            break;
        case 'v':
            if (rp_parse_int(optarg, 1, 1 << 30, &vocab)) return rp_cli_usage_error(CMD, "--vocab must be >= 1");
            break;
        case 's':
            if (rp_parse_u64(optarg, &seed)) return rp_cli_usage_error(CMD, "--seed must be a non-negative integer");
            break;
        case 'r':
            if (rp_parse_float(optarg, &rate) || rate < 0)
                return rp_cli_usage_error(CMD, "--request-rate must be a number >= 0");
            break;
        case ':': return rp_cli_usage_error(CMD, "option '%s' needs a value", argv[optind - 1]);
        default: return rp_cli_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    char host[256] = "", port[16] = "80";
    if (sscanf(url, "http://%255[^:/]:%15[0-9]", host, port) < 1)
        return rp_cli_usage_error(CMD, "--base-url must look like http://HOST:PORT, got '%s'", url);
    if (!model) return rp_cli_usage_error(CMD, "--model NAME is required (the server's /v1/models lists it)");
    bs_req *reqs = calloc((size_t)num, sizeof *reqs);
    pthread_t *th = calloc((size_t)num, sizeof *th);
    double t0 = now_s() + 0.05, arrival = 0;
    for (long i = 0; i < num; i++) {
        bs_req *r = &reqs[i];
        *r = (bs_req){.host = host, .port = port, .model = model, .api_key = api_key, .input_len = (int)in_len,
                      .output_len = (int)out_len, .vocab = (int)vocab, .seed = seed, .index = (uint64_t)i, .t0 = t0};
        if (rate > 0) { /* exponential gaps: a Poisson process */
            double u = rp_rand_uniform(seed, 999, (uint64_t)i);
            arrival += -log1p(-u) / rate;
        }
        r->arrival_s = arrival;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 << 10);
        if (pthread_create(&th[i], &attr, run_request, r) != 0) {
            pthread_attr_destroy(&attr);
            free(reqs);
            free(th);
            return rp_cli_runtime_error(CMD, "cannot start request thread %ld", i);
        }
        pthread_attr_destroy(&attr);
    }
    for (long i = 0; i < num; i++) pthread_join(th[i], NULL);
    double elapsed = now_s() - t0;
    int ok = 0;
    long out_tokens = 0;
    double *ttft = malloc((size_t)num * sizeof *ttft), *tpot = malloc((size_t)num * sizeof *tpot), busy = 0;
    int n_ttft = 0, n_tpot = 0, n_itl = 0;
    for (long i = 0; i < num; i++) n_itl += reqs[i].n_itl;
    double *itl = malloc((size_t)(n_itl ? n_itl : 1) * sizeof *itl);
    n_itl = 0;
    const char *first_error = NULL;
    for (long i = 0; i < num; i++) {
        bs_req *r = &reqs[i];
        if (!r->ok) {
            if (!first_error) first_error = r->error;
            continue;
        }
        ok++;
        out_tokens += r->tokens;
        ttft[n_ttft++] = r->ttft * 1e3;
        if (r->tokens > 1) tpot[n_tpot++] = (r->latency - r->ttft) / (r->tokens - 1) * 1e3;
        for (int k = 0; k < r->n_itl; k++) itl[n_itl++] = r->itl[k] * 1e3;
        busy += r->latency;
    }
    double m, med, p99;
    printf("============ replay bench serve ============\n");
    printf("%-34s %s (%s)\n", "server", url, model);
    printf("%-34s %.2f\n", "request rate (configured, req/s)", rate);
    printf("%-34s %d / %ld\n", "successful requests", ok, num);
    printf("%-34s %.2f\n", "benchmark duration (s)", elapsed);
    printf("%-34s %ld\n", "total input tokens", (long)ok * in_len);
    printf("%-34s %ld\n", "total generated tokens", out_tokens);
    printf("%-34s %.2f\n", "request throughput (req/s)", ok / elapsed);
    printf("%-34s %.2f\n", "input token throughput (tok/s)", (double)ok * in_len / elapsed);
    printf("%-34s %.2f\n", "output token throughput (tok/s)", out_tokens / elapsed);
    printf("%-34s %.2f\n", "concurrency (mean)", busy / elapsed);
    stats(ttft, n_ttft, &m, &med, &p99);
    printf("---------- time to first token (ms) ----------\n%-34s %.2f\n%-34s %.2f\n%-34s %.2f\n", "mean", m, "median",
           med, "p99", p99);
    stats(tpot, n_tpot, &m, &med, &p99);
    printf("---------- time per output token (ms) --------\n%-34s %.2f\n%-34s %.2f\n%-34s %.2f\n", "mean", m, "median",
           med, "p99", p99);
    stats(itl, n_itl, &m, &med, &p99);
    printf("---------- inter-token latency (ms) ----------\n%-34s %.2f\n%-34s %.2f\n%-34s %.2f\n", "mean", m, "median",
           med, "p99", p99);
    if (first_error) printf("first error: %s\n", first_error);
    for (long i = 0; i < num; i++) free(reqs[i].itl);
    free(reqs);
    free(th);
    free(ttft);
    free(tpot);
    free(itl);
    return ok == num ? RP_EXIT_OK : RP_EXIT_RUNTIME;
}
