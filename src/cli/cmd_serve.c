/* `replay serve`: the engine behind an OpenAI-compatible HTTP server.
 *
 * Order: options checked (all that can be without the model), the
 * listening socket made (a port in use or a host that does not resolve is
 * reported at once, not after minutes of loading), the signal thread
 * started, the model loaded, the server started on the socket. The main
 * thread then waits for the signal thread to say stop.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread (the mask is set
 * before any thread exists, and threads inherit it) and taken by one
 * thread with sigwait. While the model loads there is nothing to lose: it
 * exits at once with 128 + the signal's number (130, 143), as a shell
 * reports a process that a signal ended. Once serving it tells the main
 * thread, which stops the server (aborting what runs) and destroys the
 * engine, exiting 0; a second signal during that shutdown exits at once. */
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/chat_opts.h"
#include "cli/sampling_opts.h"
#include "replay/engine.h"
#include "server/http.h"
#include "server/reasoning.h"
#include "server/tool_parse.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define CMD "serve"
#define DEFAULT_PORT 8000

static void help(FILE *f) {
    rp_server_config d;
    rp_server_config_default(&d);
    fprintf(f,
            "Usage: replay serve [MODEL_DIR] [--model DIR | --dummy-weights NAME] [OPTIONS]\n"
            "\n"
            "Serves the model over HTTP with OpenAI's API: POST /v1/completions, /v1/chat/completions\n"
            "(\"stream\": true for Server-Sent Events), GET /v1/models, /health, /health_generate,\n"
            "/metrics (Prometheus), /version, POST /tokenize, /detokenize. MODEL_DIR is the same as\n"
            "--model. SIGINT/SIGTERM stop it cleanly (exit 0); during loading they exit at once with\n"
            "130/143. Usage errors exit 2, failures (a port in use, a model that does not load) 1.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Server:\n"
            "  --host HOST                address or name to listen on (default %s); :: = every address,\n"
            "                             IPv6 and IPv4; 0.0.0.0 = every IPv4 address\n"
            "  --port N                   1 to 65535 (default %d)\n"
            "  --served-model-name NAME   the model name clients send (default: the directory or preset name)\n"
            "  --api-key KEY              require 'Authorization: Bearer KEY' (default: the environment's\n"
            "                             REPLAY_API_KEY, which keeps the key out of `ps`; else none)\n"
            "  --tokenizer DIR            tokenizer.json from DIR instead of the model's (default: the model's)\n"
            "  --chat-template FILE       a Jinja chat template file (default: the model's own,\n"
            "                             chat_template.jinja or tokenizer_config.json's chat_template)\n"
            "  --generation-config G      where a request's unset sampling fields come from: auto = the\n"
            "                             model's generation_config.json (temperature, top_p, top_k, min_p,\n"
            "                             repetition_penalty), vllm = replay's defaults, or a directory with\n"
            "                             generation_config.json (default auto; as vLLM)\n"
            "  --allowed-origins LIST     CORS: origins browsers may call from, comma-separated, or '*'\n"
            "                             (default: none, no CORS headers; OPTIONS preflights answered)\n"
            "  --allowed-methods LIST     CORS: methods a preflight allows (default '*': GET, POST, HEAD)\n"
            "  --allowed-headers LIST     CORS: headers a preflight allows (default '*': those asked for)\n"
            "\n"
            "Tool calls and reasoning (docs/tools.md; vLLM's flags):\n"
            "  --tool-call-parser NAME    how the model writes tool calls: hermes (Qwen2.5, Qwen3),\n"
            "                             llama3_json (Llama 3.1/3.2), mistral (default: none)\n"
            "  --enable-auto-tool-choice  parse calls into tool_calls for requests with tools and tool_choice\n"
            "                             \"auto\" (its default); without it they get 400 (needs the parser)\n"
            "  --reasoning-parser NAME    split <think>...</think> into reasoning_content: qwen3 or\n"
            "                             deepseek_r1 (default: none, thinking stays in content)\n"
            "\n"
            "Logs (docs/server.md#logs; lines go to stderr; --log-level and --log-format under Output):\n"
            "  --disable-access-log       no line per request (default: one at info; vLLM's\n"
            "                             --disable-uvicorn-access-log is the same)\n"
            "  --log-stats-interval S     the engine line (throughput, requests, KV cache) every S seconds\n"
            "                             while something runs; 0 = off (default %g)\n"
            "  --disable-log-stats        the same as --log-stats-interval 0 (vLLM's name)\n"
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
            d.host, DEFAULT_PORT, d.log_stats_interval_s, d.max_connections, d.max_connections_per_address,
            d.header_timeout_s, d.body_timeout_s, d.send_timeout_s, d.max_body_bytes, d.max_queued_requests,
            d.http_threads);
    rp_engine_opts_help(f);
    fprintf(f, "\n");
    rp_spec_opts_help(f);
    fprintf(f, "\n" RP_COMMON_OPTIONS_HELP);
}

/* ---- signals ------------------------------------------------------------------- */

static sigset_t g_sigs;     /* SIGINT, SIGTERM */
static sem_t g_stop;        /* posted at the first signal once serving */
static int g_serving;       /* atomic: 0 while loading */
static int g_signal;        /* atomic: the first signal once serving */

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

static void *signal_main(void *arg) {
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&g_sigs, &sig) != 0) continue;
        if (!__atomic_load_n(&g_serving, __ATOMIC_ACQUIRE)) {
            /* nothing is served yet: nothing to finish or lose */
            rp_log_warn("%s: interrupted while loading; exiting", signal_name(sig));
            _exit(128 + sig);
        }
        if (__atomic_exchange_n(&g_signal, sig, __ATOMIC_ACQ_REL)) {
            rp_log_warn("%s again: exiting now, without waiting for running requests", signal_name(sig));
            _exit(128 + sig);
        }
        sem_post(&g_stop);
    }
    return NULL;
}

/* ---- options ------------------------------------------------------------------- */

/* The name clients use: the last part of the model directory or the preset. */
static const char *default_served_name(const rp_model_opts *mo) {
    const char *name = mo->dummy_name ? mo->dummy_name : mo->model_dir;
    const char *slash = strrchr(name, '/');
    while (slash && slash[1] == 0 && slash > name) { /* trailing slash: take the part before it */
        const char *q = slash - 1;
        while (q > name && *q != '/') q--;
        slash = *q == '/' ? q : NULL;
        break;
    }
    return slash && slash[1] ? slash + 1 : name;
}

/* What can be checked before the model loads; a usage error (printed) or 0. */
static int check_options(const rp_server_config *sc, const char *tokenizer_dir, const char *template_file,
                         const char *generation_config) {
    if (!sc->served_model[0]) return rp_cli_usage_error(CMD, "--served-model-name must not be empty");
    if (sc->api_key && !sc->api_key[0])
        return rp_cli_usage_error(CMD, "--api-key must not be empty (leave it out to serve without a key)");
    if (!sc->host[0]) return rp_cli_usage_error(CMD, "--host must not be empty");
    if (sc->allowed_origins && !sc->allowed_origins[0])
        return rp_cli_usage_error(CMD, "--allowed-origins must not be empty (a comma list of origins, or '*')");
    if ((sc->allowed_methods || sc->allowed_headers) && !sc->allowed_origins)
        return rp_cli_usage_error(CMD, "--%s needs --allowed-origins (CORS is off without it)",
                                  sc->allowed_methods ? "allowed-methods" : "allowed-headers");
    if (sc->enable_auto_tool_choice && !sc->tool_call_parser)
        return rp_cli_usage_error(CMD, "--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or "
                                       "mistral): the parser that finds the calls in the model's output");
    if (tokenizer_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", tokenizer_dir);
        if (access(path, R_OK) != 0)
            return rp_cli_usage_error(CMD, "--tokenizer must be a directory with tokenizer.json, got '%s'",
                                      tokenizer_dir);
    }
    if (template_file && rp_cli_check_template_file(template_file, CMD)) return RP_EXIT_USAGE;
    return rp_generation_config_check(generation_config, CMD);
}

/* An option's long name (the first of its aliases). */
static const char *flag_name(const struct option *longopts, int opt) {
    for (; longopts->name; longopts++)
        if (longopts->val == opt) return longopts->name;
    return "?";
}

enum {
    OPT_HOST = 0x1c0, /* past the common options (cli.h) */
    OPT_PORT, OPT_NAME, OPT_KEY, OPT_TOKENIZER, OPT_TEMPLATE, OPT_NO_ACCESS_LOG, OPT_STATS_INTERVAL, OPT_NO_STATS,
    OPT_GENERATION_CONFIG, OPT_TOOL_PARSER, OPT_AUTO_TOOL_CHOICE, OPT_REASONING_PARSER, OPT_ORIGINS, OPT_METHODS,
    OPT_HEADERS,
    OPT_LIMIT = 0x180 /* the limits, in the order of limits[] below */
};

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"host", required_argument, 0, OPT_HOST},
    {"port", required_argument, 0, OPT_PORT},
    {"served-model-name", required_argument, 0, OPT_NAME},
    {"api-key", required_argument, 0, OPT_KEY},
    {"tokenizer", required_argument, 0, OPT_TOKENIZER},
    {"chat-template", required_argument, 0, OPT_TEMPLATE},
    {"generation-config", required_argument, 0, OPT_GENERATION_CONFIG},
    {"tool-call-parser", required_argument, 0, OPT_TOOL_PARSER},
    {"enable-auto-tool-choice", no_argument, 0, OPT_AUTO_TOOL_CHOICE},
    {"reasoning-parser", required_argument, 0, OPT_REASONING_PARSER},
    {"allowed-origins", required_argument, 0, OPT_ORIGINS},
    {"allowed-methods", required_argument, 0, OPT_METHODS},
    {"allowed-headers", required_argument, 0, OPT_HEADERS},
    {"disable-access-log", no_argument, 0, OPT_NO_ACCESS_LOG},
    {"disable-uvicorn-access-log", no_argument, 0, OPT_NO_ACCESS_LOG},
    {"log-stats-interval", required_argument, 0, OPT_STATS_INTERVAL},
    {"disable-log-stats", no_argument, 0, OPT_NO_STATS},
    {"max-connections", required_argument, 0, OPT_LIMIT + 0},
    {"max-connections-per-address", required_argument, 0, OPT_LIMIT + 1},
    {"header-timeout", required_argument, 0, OPT_LIMIT + 2},
    {"body-timeout", required_argument, 0, OPT_LIMIT + 3},
    {"send-timeout", required_argument, 0, OPT_LIMIT + 4},
    {"max-body-bytes", required_argument, 0, OPT_LIMIT + 5},
    {"max-queued-requests", required_argument, 0, OPT_LIMIT + 6},
    {"http-threads", required_argument, 0, OPT_LIMIT + 7},
    RP_ENGINE_LONG_OPTIONS,
    RP_SPEC_LONG_OPTIONS,
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_server_config sc;
    rp_server_config_default(&sc);
    long limits[8] = {sc.max_connections, sc.max_connections_per_address, sc.header_timeout_s, sc.body_timeout_s,
                      sc.send_timeout_s, (long)sc.max_body_bytes, sc.max_queued_requests, sc.http_threads};
    static const long limit_max[8] = {1 << 20, 1 << 20, 3600, 3600, 3600, 1L << 30, 1 << 24, 256};
    const char *tokenizer_dir = NULL, *template_file = NULL, *generation_config = "auto";
    long port = DEFAULT_PORT;
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, NULL, CMD)) != RP_OPT_END) {
        long *dst = NULL, lo = 1, hi = 1 << 24;
        switch (opt) {
        case RP_OPT_ERROR: return RP_EXIT_USAGE; /* reported */
        case 'h': help(stdout); return RP_EXIT_OK;
        case OPT_HOST: sc.host = optarg; break;
        case OPT_NAME: sc.served_model = optarg; break;
        case OPT_KEY: sc.api_key = optarg; break;
        case OPT_TOKENIZER: tokenizer_dir = optarg; break;
        case OPT_TEMPLATE: template_file = optarg; break;
        case OPT_GENERATION_CONFIG: generation_config = optarg; break;
        case OPT_TOOL_PARSER: {
            rp_tool_parser tp;
            if (rp_tool_parser_from_name(optarg, &tp))
                return rp_cli_usage_error(CMD, "--tool-call-parser must be hermes, llama3_json or mistral, got '%s'",
                                          optarg);
            sc.tool_call_parser = optarg;
            break;
        }
        case OPT_AUTO_TOOL_CHOICE: sc.enable_auto_tool_choice = 1; break;
        case OPT_ORIGINS: sc.allowed_origins = optarg; break;
        case OPT_METHODS: sc.allowed_methods = optarg; break;
        case OPT_HEADERS: sc.allowed_headers = optarg; break;
        case OPT_REASONING_PARSER: {
            rp_reasoning_kind rk;
            if (rp_reasoning_from_name(optarg, &rk))
                return rp_cli_usage_error(CMD, "--reasoning-parser must be qwen3 or deepseek_r1, got '%s'", optarg);
            sc.reasoning_parser = optarg;
            break;
        }
        case OPT_PORT: dst = &port, lo = 1, hi = 65535; break;
        case OPT_NO_ACCESS_LOG: sc.access_log = 0; break;
        case OPT_NO_STATS: sc.log_stats_interval_s = 0; break;
        case OPT_STATS_INTERVAL:
            if (rp_parse_float(optarg, &sc.log_stats_interval_s) || sc.log_stats_interval_s < 0 ||
                sc.log_stats_interval_s > 86400)
                return rp_cli_usage_error(CMD, "--log-stats-interval must be a number of seconds from 0 to 86400, "
                                               "got '%s'", optarg);
            break;
        case OPT_LIMIT + 0: case OPT_LIMIT + 1: case OPT_LIMIT + 2: case OPT_LIMIT + 3:
        case OPT_LIMIT + 4: case OPT_LIMIT + 5: case OPT_LIMIT + 6: case OPT_LIMIT + 7:
            dst = &limits[opt - OPT_LIMIT], hi = limit_max[opt - OPT_LIMIT];
            break;
        default:
            if (rp_engine_opts_parse(&ec, opt, optarg, CMD) != 1) return RP_EXIT_USAGE; /* reported */
        }
        if (dst && rp_parse_int(optarg, lo, hi, dst))
            return rp_cli_usage_error(CMD, "--%s must be an integer from %ld to %ld, got '%s'", flag_name(options, opt),
                                      lo, hi, optarg);
    }
    /* the model as an argument, as `vllm serve MODEL` */
    if (optind < argc) {
        if (argc - optind > 1) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind + 1]);
        if (mo.model_dir)
            return rp_cli_usage_error(CMD, "the model is given twice: '%s' and --model %s", argv[optind],
                                      mo.model_dir);
        mo.model_dir = argv[optind];
    }
    int bad = rp_model_opts_check(&mo, CMD);
    if (bad || (bad = rp_engine_opts_check(&ec, &mo, CMD)) || (bad = rp_spec_opts_check(&ec, CMD))) return bad;
    sc.port = (int)port;
    sc.max_connections = (int)limits[0];
    sc.max_connections_per_address = (int)limits[1];
    sc.header_timeout_s = (int)limits[2];
    sc.body_timeout_s = (int)limits[3];
    sc.send_timeout_s = (int)limits[4];
    sc.max_body_bytes = (size_t)limits[5];
    sc.max_queued_requests = (int)limits[6];
    sc.http_threads = (int)limits[7];
    if (!sc.served_model) sc.served_model = default_served_name(&mo);
    if (!sc.api_key) {
        const char *k = getenv("REPLAY_API_KEY"); /* empty counts as unset */
        if (k && *k) sc.api_key = k;
    }
    if (check_options(&sc, tokenizer_dir, template_file, generation_config)) return RP_EXIT_USAGE;
    char sampling_what[512];
    int sampling_taken;
    if ((bad = rp_generation_config_defaults(mo.model_dir, generation_config, &sc.sampling_defaults, sampling_what,
                                             sizeof sampling_what, &sampling_taken, CMD)))
        return bad;

    signal(SIGPIPE, SIG_IGN);
    /* Another node of a multi-node run: no HTTP here, node 0's steps. Its
     * signals keep their default action (a SIGTERM ends it at once, and
     * node 0 sees its link close); it stops cleanly when node 0 does. */
    if (rp_cli_is_worker(&mo)) {
        rp_cli_engine_model(&mo, &ec);
        return rp_cli_engine_worker(&ec, CMD);
    }
    /* SIGINT/SIGTERM go to the signal thread only: blocked before any thread starts */
    sigemptyset(&g_sigs);
    sigaddset(&g_sigs, SIGINT);
    sigaddset(&g_sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &g_sigs, NULL);
    char err[512];
    rp_listener *listener = rp_server_listen(&sc, err, sizeof err);
    if (!listener) return rp_cli_runtime_error(CMD, "%s", err);
    pthread_t sig_thread;
    if (sem_init(&g_stop, 0, 0) != 0 || pthread_create(&sig_thread, NULL, signal_main, NULL) != 0) {
        rp_listener_free(listener);
        return rp_cli_runtime_error(CMD, "cannot start the signal thread");
    }
    pthread_detach(sig_thread);
    rp_log_info("listening on %s; loading the model (connections wait until it is loaded)",
                rp_listener_url(listener));

    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_file;
    rp_error eerr;
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) {
        rp_listener_free(listener);
        return rp_cli_runtime_error(CMD, "%s", eerr.message);
    }
    rp_log_info("%s", sampling_what);
    if (rp_engine_tokenizer(eng)) rp_cli_log_chat_template(rp_engine_tokenizer(eng));
    rp_server *srv = rp_server_start(eng, &sc, listener, err, sizeof err);
    if (!srv) {
        rp_engine_destroy(eng);
        return rp_cli_runtime_error(CMD, "%s", err);
    }
    __atomic_store_n(&g_serving, 1, __ATOMIC_RELEASE);
    rp_log_info("serving '%s' on %s (OpenAI API under /v1)", sc.served_model, rp_server_url(srv));
    while (sem_wait(&g_stop) != 0) {
    }
    rp_log_info("%s: shutting down", signal_name(__atomic_load_n(&g_signal, __ATOMIC_ACQUIRE)));
    /* the server first: it stops accepting, aborts what runs (open streams
     * end) and waits until no HTTP thread uses the engine */
    rp_server_stop(srv);
    rp_engine_destroy(eng);
    rp_log_info("stopped");
    return RP_EXIT_OK;
}

const rp_cli_command rp_cli_serve = {"serve", "an OpenAI-compatible HTTP server (completions, chat, streaming)",
                                     options, help, run};
