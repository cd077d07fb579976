/* `replay serve`: the engine behind an OpenAI-compatible HTTP server. The
 * main thread only waits for SIGINT/SIGTERM; the engine and the HTTP
 * threads do the work. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "replay/engine.h"
#include "server/http.h"
#include "util/log.h"

#define CMD "serve"

static void help(FILE *f) {
    rp_server_config d;
    rp_server_config_default(&d);
    fprintf(f,
            "Usage: replay serve (--model DIR | --dummy-weights NAME) [OPTIONS]\n"
            "\n"
            "Serves the model over HTTP with OpenAI's API: POST /v1/completions, /v1/chat/completions\n"
            "(\"stream\": true for Server-Sent Events), GET /v1/models, /health, /health_generate,\n"
            "/metrics (Prometheus), POST /tokenize, /detokenize. SIGINT/SIGTERM stop it cleanly.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Server:\n"
            "  --host ADDR                IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N                   (default 8000)\n"
            "  --served-model-name NAME   the model name clients send (default: the directory or preset name)\n"
            "  --api-key KEY              require 'Authorization: Bearer KEY' (default: none)\n"
            "  --tokenizer DIR            tokenizer.json from DIR (default: the model's)\n"
            "  --chat-template NAME       qwen3 or llama3 (default: tokenizer_config.json's)\n"
            "\n"
            "Limits (docs/server.md#limits; the defaults suit a public deployment):\n"
            "  --max-connections N              open connections in all (default %d)\n"
            "  --max-connections-per-address N  from one client address (default %d; behind a proxy, raise it)\n"
            "  --header-timeout S               seconds to send a request's headers (default %d)\n"
            "  --body-timeout S                 seconds to send a request's body (default %d)\n"
            "  --send-timeout S                 seconds a client may read nothing of its answer (default %d)\n"
            "  --max-body-bytes N               larger request bodies get 413 (default %zu)\n"
            "  --max-queued-requests N          waiting requests beyond which new ones get 503 (default %d)\n"
            "  --http-threads N                 HTTP threads (default %d)\n"
            "\n",
            d.max_connections, d.max_connections_per_address, d.header_timeout_s, d.body_timeout_s, d.send_timeout_s,
            d.max_body_bytes, d.max_queued_requests, d.http_threads);
    rp_engine_opts_help(f);
    fprintf(f, "\n" RP_COMMON_OPTIONS_HELP);
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"host", required_argument, 0, 'H'},
    {"port", required_argument, 0, 'p'},
    {"served-model-name", required_argument, 0, 'n'},
    {"api-key", required_argument, 0, 'k'},
    {"tokenizer", required_argument, 0, 'T'},
    {"chat-template", required_argument, 0, 'M'},
    {"max-connections", required_argument, 0, 0x180},
    {"max-connections-per-address", required_argument, 0, 0x181},
    {"header-timeout", required_argument, 0, 0x182},
    {"body-timeout", required_argument, 0, 0x183},
    {"send-timeout", required_argument, 0, 0x184},
    {"max-body-bytes", required_argument, 0, 0x185},
    {"max-queued-requests", required_argument, 0, 0x186},
    {"http-threads", required_argument, 0, 0x187},
    RP_ENGINE_LONG_OPTIONS,
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_server_config sc;
    rp_server_config_default(&sc);
    sc.port = 8000;
    long limits[8] = {sc.max_connections, sc.max_connections_per_address, sc.header_timeout_s, sc.body_timeout_s,
                      sc.send_timeout_s, (long)sc.max_body_bytes, sc.max_queued_requests, sc.http_threads};
    static const long limit_max[8] = {1 << 20, 1 << 20, 3600, 3600, 3600, 1L << 30, 1 << 24, 256};
    const char *tokenizer_dir = NULL, *template_name = NULL;
    long port = 8000;
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        long *dst = NULL, lo = 1, hi = 1 << 24;
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'H': sc.host = optarg; break;
        case 'n': sc.served_model = optarg; break;
        case 'k': sc.api_key = optarg; break;
        case 'T': tokenizer_dir = optarg; break;
        case 'M': template_name = optarg; break;
        case 'p': dst = &port, lo = 1, hi = 65535; break;
        case 0x180: case 0x181: case 0x182: case 0x183: case 0x184: case 0x185: case 0x186: case 0x187:
            dst = &limits[opt - 0x180], hi = limit_max[opt - 0x180];
            break;
        default:
            if (rp_engine_opts_parse(&ec, opt, optarg, CMD) != 1) return RP_EXIT_USAGE; /* reported */
        }
        if (dst && rp_parse_int(optarg, lo, hi, dst))
            return rp_cli_usage_error(CMD, "%s must be an integer from %ld to %ld, got '%s'", argv[optind - 1], lo, hi,
                                      optarg);
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    sc.port = (int)port;
    sc.max_connections = (int)limits[0];
    sc.max_connections_per_address = (int)limits[1];
    sc.header_timeout_s = (int)limits[2];
    sc.body_timeout_s = (int)limits[3];
    sc.send_timeout_s = (int)limits[4];
    sc.max_body_bytes = (size_t)limits[5];
    sc.max_queued_requests = (int)limits[6];
    sc.http_threads = (int)limits[7];
    if (!sc.served_model) {
        const char *name = mo.dummy_name ? mo.dummy_name : mo.model_dir;
        const char *slash = strrchr(name, '/');
        while (slash && slash[1] == 0 && slash > name) { /* trailing slash: take the part before it */
            const char *q = slash - 1;
            while (q > name && *q != '/') q--;
            slash = *q == '/' ? q : NULL;
            break;
        }
        sc.served_model = slash && slash[1] ? slash + 1 : name;
    }
    /* SIGINT/SIGTERM go to this thread only: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_name;
    rp_error eerr;
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) return rp_cli_runtime_error(CMD, "%s", eerr.message);
    char err[512];
    rp_server *srv = rp_server_start(eng, &sc, err, sizeof err);
    if (!srv) {
        rp_engine_destroy(eng);
        return rp_cli_runtime_error(CMD, "%s", err);
    }
    rp_log_info("serving '%s' on http://%s:%d (OpenAI API under /v1)", sc.served_model, sc.host, sc.port);
    int sig = 0;
    sigwait(&sigs, &sig);
    rp_log_info("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* the server first: it stops accepting, aborts what runs (open streams
     * end) and waits until no HTTP thread uses the engine */
    rp_server_stop(srv);
    rp_engine_destroy(eng);
    rp_log_info("stopped");
    return RP_EXIT_OK;
}

const rp_cli_command rp_cli_serve = {"serve", "an OpenAI-compatible HTTP server (completions, chat, streaming)", options, help, run};
