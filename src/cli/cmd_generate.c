/* `replay generate`: one prompt in, tokens streamed out, then a stats line.
 *
 * Everything the command line can get wrong is checked before the model
 * loads (a bad value names its flag and exits 2 at once, not after minutes
 * of loading). SIGINT and SIGTERM end loading by their default action; once
 * the model is loaded they abort the request, and the output still gets its
 * final newline and the stats line before the exit (130 / 143). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/chat_opts.h"
#include "cli/interrupt.h"
#include "cli/sampling_opts.h"
#include "cli/structured_opts.h"
#include "engine/sampler.h"
#include "replay/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define CMD "generate"
#define DEFAULT_MAX_TOKENS 64
#define DEFAULT_BATCHED_TOKENS 2048
#define MAX_STOP_STRINGS 64
/* a prompt file is text for one context: anything larger is a mistake (a
 * wrong file, /dev/zero), refused before it fills the memory */
#define MAX_PROMPT_FILE_BYTES (16u << 20)

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay generate (--model DIR | --dummy-weights NAME) (--prompt TEXT | --prompt-file FILE |\n"
            "                       --prompt-ids IDS) [OPTIONS]\n"
            "\n"
            "Generates a continuation of the prompt, printing tokens as they are produced,\n"
            "then a stats line on stderr: prompt and generated tokens, why it stopped, prefill\n"
            "and decode tok/s, and the seed when sampling (--seed N repeats the run).\n"
            "Ctrl-C or SIGTERM stops it: the output so far, a newline and the stats line are\n"
            "printed, and the exit status is 130 or 143.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Prompt and length:\n"
            "  --prompt TEXT          the prompt text, tokenized by the model directory's tokenizer or\n"
            "                         --tokenizer's (required: this, --prompt-file or --prompt-ids)\n"
            "  --prompt-file FILE     the prompt text from FILE, '-' for standard input; one final newline\n"
            "                         is dropped, as llama.cpp's --file does (required without --prompt)\n"
            "  --prompt-ids IDS       the prompt as comma-separated token ids, e.g. 1,2,3 (required\n"
            "                         without --prompt)\n"
            "  --tokenizer DIR        tokenizer.json (+ tokenizer_config.json) from DIR (default: the model's)\n"
            "  --chat                 wrap the prompt as a user turn in the model's chat template\n"
            "  --system TEXT          with --chat: a system message first (default: none)\n"
            "  --chat-template FILE   with --chat: a Jinja chat template file (default: the model's own,\n"
            "                         chat_template.jinja or tokenizer_config.json's)\n"
            "  --no-thinking          with --chat: enable_thinking=false for the template (Qwen3's switch)\n"
            "  --print-ids            print token ids instead of text\n"
            "  --max-tokens N         tokens to generate at most, 1 or more (default %d)\n"
            "  --stop STR             stop before the text STR; repeat for several, as the OpenAI API's\n"
            "                         \"stop\" (default: none; needs a tokenizer)\n"
            "  --ignore-eos           keep going past end-of-sequence tokens\n"
            "\n" RP_SAMPLING_OPTIONS_HELP RP_GENERATION_CONFIG_HELP
            "\n" RP_STRUCTURED_OPTIONS_HELP
            "\n"
            "Engine:\n"
            "  --max-model-len N      context in tokens, prompt and output together, at most the model's\n"
            "                         max_position_embeddings (default: the model's)\n"
            "  --max-num-batched-tokens N  tokens per forward step; longer prompts are chunked (default %d)\n"
            "  --page-size N          KV cache page size in tokens (default 16)\n"
            "\n",
            DEFAULT_MAX_TOKENS, DEFAULT_BATCHED_TOKENS);
    rp_spec_opts_help(f);
    fputs("\n" RP_COMMON_OPTIONS_HELP, f);
}

/* --prompt-ids: decimal ids separated by commas, blanks around them allowed.
 * An empty element ("1,,2", "1,") is an error, not a skipped one, and every
 * id must be in the model's vocabulary. 0 or RP_EXIT_USAGE (printed). */
static int parse_ids(const char *s, int vocab_size, int32_t **out, int *n_out) {
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return rp_cli_runtime_error(CMD, "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *start = p;
        long v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 12) v = v * 10 + (*p++ - '0'), digits++;
        while (*p == ' ' || *p == '\t') p++;
        if (digits == 0 || (*p && *p != ',')) {
            free(ids);
            if (digits == 0 && (*p == ',' || !*p))
                return rp_cli_usage_error(CMD, "--prompt-ids: id %d is empty: give ids separated by single commas, "
                                               "e.g. 1,2,3",
                                          n + 1);
            const size_t len = strcspn(start, ",");
            return rp_cli_usage_error(CMD, "--prompt-ids: '%.*s' is not a token id (a non-negative integer)",
                                      (int)len, start);
        }
        if (v >= vocab_size) {
            free(ids);
            return rp_cli_usage_error(CMD, "--prompt-ids: token id %ld is outside the model's vocabulary (0..%d)", v,
                                      vocab_size - 1);
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!grown) {
                free(ids);
                return rp_cli_runtime_error(CMD, "out of memory");
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        if (!*p) break;
        p++; /* the comma */
    }
    *out = ids;
    *n_out = n;
    return 0;
}

/* --prompt-file: the whole file (or standard input for "-"), read before the
 * model loads. One final newline is dropped: editors end files with one,
 * and it is not part of the prompt. 0 or RP_EXIT_USAGE (printed). */
static int read_prompt_file(const char *path, char **out) {
    const int use_stdin = !strcmp(path, "-");
    FILE *f = use_stdin ? stdin : fopen(path, "rb");
    if (!f) return rp_cli_usage_error(CMD, "--prompt-file %s: %s", path, strerror(errno));
    struct stat st;
    if (!fstat(fileno(f), &st) && S_ISDIR(st.st_mode)) {
        if (!use_stdin) fclose(f);
        return rp_cli_usage_error(CMD, "--prompt-file %s is a directory", path);
    }
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    int rc = 0;
    while (text) {
        if (len + 1 == cap) {
            char *grown = cap >= MAX_PROMPT_FILE_BYTES ? NULL : realloc(text, cap * 2);
            if (!grown) {
                rc = cap >= MAX_PROMPT_FILE_BYTES
                         ? rp_cli_usage_error(CMD, "--prompt-file %s is larger than %u MiB: not a prompt", path,
                                              MAX_PROMPT_FILE_BYTES >> 20)
                         : rp_cli_runtime_error(CMD, "out of memory");
                break;
            }
            text = grown;
            cap *= 2;
        }
        const size_t n = fread(text + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) rc = rp_cli_usage_error(CMD, "--prompt-file %s: %s", path, strerror(errno));
            break;
        }
    }
    if (!use_stdin) fclose(f);
    if (!text) return rp_cli_runtime_error(CMD, "out of memory");
    if (!rc && memchr(text, 0, len)) rc = rp_cli_usage_error(CMD, "--prompt-file %s holds NUL bytes: not text", path);
    if (rc) {
        free(text);
        return rc;
    }
    if (len > 0 && text[len - 1] == '\n') len--;
    if (len > 0 && text[len - 1] == '\r') len--;
    text[len] = 0;
    if (len == 0) {
        free(text);
        return rp_cli_usage_error(CMD, "--prompt-file %s is empty", use_stdin ? "- (standard input)" : path);
    }
    *out = text;
    return 0;
}

typedef struct stream_ctx {
    int print_ids, printed, generated, prompt_tokens;
    double t_submit, t_first, t_last;
    rp_finish finish;
    char error[256];
    atomic_int done; /* set last, after the fields above: the main thread reads them then */
} stream_ctx;

/* Standard output without stdio (interrupt.h's rp_write_all says why). */
static void write_out(const char *buf, size_t n) { rp_write_all(STDOUT_FILENO, buf, n); }

/* Engine events arrive on the engine thread, one per token. */
static void on_event(void *user, const rp_token_event *ev) {
    stream_ctx *sc = user;
    double now = rp_now_s();
    if (ev->token >= 0) {
        if (sc->generated++ == 0) sc->t_first = now;
        sc->t_last = now;
        if (sc->print_ids) {
            char id[16];
            const int n = snprintf(id, sizeof id, "%s%d", sc->printed++ ? " " : "", ev->token);
            write_out(id, (size_t)n);
        }
    }
    if (!sc->print_ids && ev->text_len) write_out(ev->text, ev->text_len);
    sc->prompt_tokens = ev->prompt_tokens;
    if (ev->finish != RP_FINISH_REASON_NONE) {
        sc->finish = ev->finish;
        if (ev->error) snprintf(sc->error, sizeof sc->error, "%s", ev->error);
        atomic_store(&sc->done, 1);
        rp_interrupt_wake();
    }
}

/* Waits for the request to finish; a SIGINT or SIGTERM meanwhile aborts it
 * (it then finishes at the end of the step in flight). Returns the signal
 * that came, SIGTERM over SIGINT, or 0. */
static int wait_finish(rp_engine *eng, rp_request_id id, stream_ctx *sc) {
    int sig = rp_interrupt_wait(&sc->done);
    if (sig) {
        rp_engine_abort(eng, id);
        for (int s; (s = rp_interrupt_wait(&sc->done));)
            if (s == SIGTERM) sig = s;
    }
    rp_engine_wait_idle(eng);
    return sig;
}

static const char *finish_name(rp_finish f) {
    switch (f) {
    case RP_FINISH_REASON_STOP: return "stop";
    case RP_FINISH_REASON_LENGTH: return "length";
    case RP_FINISH_REASON_ABORT: return "interrupted";
    case RP_FINISH_REASON_GRAMMAR: return "grammar dead end";
    default: return "error";
    }
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"prompt", required_argument, 0, 'p'},
    {"prompt-file", required_argument, 0, 'F'},
    {"prompt-ids", required_argument, 0, 'I'},
    {"max-tokens", required_argument, 0, 'n'},
    {"stop", required_argument, 0, 's'},
    {"ignore-eos", no_argument, 0, 'E'},
    RP_SAMPLING_LONG_OPTIONS,
    RP_STRUCTURED_LONG_OPTIONS,
    /* the engine options' codes: rp_engine_opts_parse reads them */
    {"max-model-len", required_argument, 0, 0x145},
    {"max-num-batched-tokens", required_argument, 0, 0x141},
    {"page-size", required_argument, 0, 0x144},
    RP_SPEC_LONG_OPTIONS,
    {"tokenizer", required_argument, 0, 'T'},
    {"chat", no_argument, 0, 'C'},
    {"system", required_argument, 0, 'S'},
    {"chat-template", required_argument, 0, 'M'},
    {"no-thinking", no_argument, 0, 'N'},
    {"generation-config", required_argument, 0, 'G'},
    {"print-ids", no_argument, 0, 'D'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    rp_sampling_opts_unset(&sp); /* generation_config.json fills what no flag sets */
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    ec.max_batched_tokens = DEFAULT_BATCHED_TOKENS;
    ec.max_context = 0; /* the model's */
    const char *prompt = NULL, *prompt_ids = NULL, *prompt_file = NULL;
    const char *stops[MAX_STOP_STRINGS];
    int num_stops = 0;
    long max_tokens = DEFAULT_MAX_TOKENS;
    int ignore_eos = 0, chat = 0, no_thinking = 0, print_ids = 0;
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_file = NULL, *generation_config = "auto";
    rp_structured_opts so;
    rp_structured_opts_init(&so);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, &sp, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'p': prompt = optarg; break;
        case 'F': prompt_file = optarg; break;
        case 'I': prompt_ids = optarg; break;
        case 'E': ignore_eos = 1; break;
        case 'T': tokenizer_dir = optarg; break;
        case 'C': chat = 1; break;
        case 'S': system_prompt = optarg; break;
        case 'M': template_file = optarg; break;
        case 'G': generation_config = optarg; break;
        case 'N': no_thinking = 1; break;
        case 'D': print_ids = 1; break;
        case 'n':
            if (rp_parse_int(optarg, 1, 1 << 24, &max_tokens))
                return rp_cli_usage_error(CMD, "--max-tokens must be an integer from 1 to %d, got '%s'", 1 << 24,
                                          optarg);
            break;
        case 's':
            if (!*optarg) return rp_cli_usage_error(CMD, "--stop needs a non-empty string");
            if (num_stops == MAX_STOP_STRINGS)
                return rp_cli_usage_error(CMD, "--stop: at most %d stop strings", MAX_STOP_STRINGS);
            stops[num_stops++] = optarg;
            break;
        case 0x141: case 0x144: case 0x145: case 0x14a: case 0x14b: case 0x14c: case 0x14d: case 0x14e: case 0x14f:
            if (rp_engine_opts_parse(&ec, opt, optarg, CMD) != 1) return RP_EXIT_USAGE; /* reported */
            break;
        case 0x1e0: case 0x1e1: case 0x1e2: case 0x1e3: case 0x1e4: case 0x1e5:
            if (rp_structured_opts_parse(&so, opt, optarg, CMD)) return RP_EXIT_USAGE; /* reported */
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    /* Every check that needs no model runs here, before the weights load. */
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad = rp_model_opts_check(&mo, CMD);
    if (bad) return bad;
    if (!!prompt + !!prompt_ids + !!prompt_file != 1)
        return rp_cli_usage_error(CMD, "give exactly one of --prompt, --prompt-file or --prompt-ids");
    if (chat && prompt_ids) return rp_cli_usage_error(CMD, "--chat needs a text prompt: --prompt or --prompt-file");
    if ((system_prompt || template_file || no_thinking) && !chat)
        return rp_cli_usage_error(CMD, "--system, --chat-template and --no-thinking go with --chat");
    rp_err err;
    if (template_file && (bad = rp_cli_check_template_file(template_file, CMD))) return bad;
    char sampling_what[512];
    int sampling_taken;
    if ((bad = rp_sampling_opts_resolve(mo.model_dir, generation_config, &sp, sampling_what, sizeof sampling_what,
                                        &sampling_taken, CMD)) ||
        (bad = rp_spec_opts_check(&ec, CMD)))
        return bad;
    const int model_context = mo.cfg.max_position_embeddings;
    if (ec.max_context > model_context)
        return rp_cli_usage_error(CMD, "--max-model-len %d is more than the model's context of %d tokens "
                                       "(max_position_embeddings)",
                                  ec.max_context, model_context);
    const int context = ec.max_context > 0 ? ec.max_context : model_context;
    if (tokenizer_dir && (bad = rp_cli_check_dir_file("--tokenizer", tokenizer_dir, "tokenizer.json", CMD)))
        return bad;
    if ((prompt || prompt_file || num_stops) && !rp_cli_tokenizer_dir(&mo, tokenizer_dir))
        return rp_cli_usage_error(CMD, "%s needs a tokenizer, and %s: use --tokenizer DIR%s",
                                  num_stops && !prompt && !prompt_file ? "--stop" : "a text prompt",
                                  mo.model_dir ? "the model directory has no tokenizer.json"
                                               : "--dummy-weights come without one",
                                  num_stops ? "" : ", or --prompt-ids");
    if (so.flag && !rp_cli_tokenizer_dir(&mo, tokenizer_dir))
        return rp_cli_usage_error(CMD, "%s needs a tokenizer (the vocabulary's bytes), and %s: use --tokenizer DIR",
                                  so.flag, mo.model_dir ? "the model directory has no tokenizer.json"
                                                        : "--dummy-weights come without one");
    int32_t *ids = NULL;
    int n_ids = 0;
    if (prompt_ids && (bad = parse_ids(prompt_ids, mo.cfg.vocab_size, &ids, &n_ids))) return bad;
    /* a text prompt has at least one token */
    const long prompt_min = prompt_ids ? n_ids : 1;
    if (prompt_min + max_tokens > context) {
        free(ids);
        return rp_cli_usage_error(CMD, "--max-tokens %ld and a prompt of %s%ld token%s do not fit the context of %d "
                                       "tokens (%s)",
                                  max_tokens, prompt_ids ? "" : "at least ", prompt_min, prompt_min == 1 ? "" : "s",
                                  context, ec.max_context ? "--max-model-len" : "the model's max_position_embeddings");
    }
    char *file_text = NULL;
    if (prompt_file) {
        if ((bad = read_prompt_file(prompt_file, &file_text))) {
            free(ids);
            return bad;
        }
        prompt = file_text;
    }
    if ((bad = rp_structured_opts_check(&so, CMD))) {
        rp_structured_opts_free(&so);
        free(ids);
        free(file_text);
        return bad;
    }
    rp_sampling_seed_if_unset(&sp);

    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_file;
    ec.max_running_requests = 1;
    ec.chunked_prefill_size = ec.max_batched_tokens;
    int rc = RP_EXIT_RUNTIME;
    char *rendered = NULL;
    int32_t stop_ids[8];
    int num_stop_ids = 0;
    rp_error eerr;
    /* Loading: SIGINT and SIGTERM still have their default action here. */
    if (rp_cli_is_worker(&mo)) return rp_cli_engine_worker(&ec, CMD);
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) {
        free(ids);
        free(file_text);
        rp_structured_opts_free(&so);
        return rp_cli_runtime_error(CMD, "%s", eerr.message);
    }
    if (rp_interrupt_install()) {
        rc = rp_cli_runtime_error(CMD, "cannot watch for Ctrl-C: %s", strerror(errno));
        goto out;
    }
    const rp_tokenizer *tok = rp_engine_tokenizer(eng);
    if (sampling_taken) rp_log_info("%s", sampling_what);
    else rp_log_debug("%s", sampling_what);
    rp_request_params rq;
    rp_request_params_default(&rq);
    if (prompt) {
        if (chat) {
            const char *roles[2], *contents[2];
            int nm = 0;
            if (system_prompt) roles[nm] = "system", contents[nm++] = system_prompt;
            roles[nm] = "user", contents[nm++] = prompt;
            if (rp_cli_chat_render(tok, roles, contents, nm, no_thinking, &rendered, &err)) {
                rc = rp_cli_runtime_error(CMD, "%s", err.msg);
                goto out;
            }
            /* the template writes its own special tokens: no BOS added */
            size_t n = 0;
            if (rp_tokenizer_encode(tok, rendered, strlen(rendered), &ids, &n, &err)) {
                rc = rp_cli_runtime_error(CMD, "%s", err.msg);
                goto out;
            }
            n_ids = (int)n;
            num_stop_ids = rp_chat_stop_ids(tok, stop_ids, 8);
        } else {
            rq.prompt = prompt; /* the engine adds BOS as HF's tokenizer(text) does */
        }
    }
    if (!rq.prompt) {
        rq.prompt_ids = ids;
        rq.num_prompt_ids = n_ids;
    }
    rq.max_tokens = (int)max_tokens;
    rq.ignore_eos = ignore_eos;
    rp_cli_request_sampling(&rq, &sp);
    rq.stop_ids = stop_ids;
    rq.num_stop_ids = num_stop_ids;
    rq.stop = stops;
    rq.num_stop = num_stops;
    rq.constraint = so.constraint;
    stream_ctx sc = {.print_ids = print_ids || !tok, .t_submit = rp_now_s()};
    rp_request_id id = 0;
    if (rp_engine_submit(eng, &rq, on_event, &sc, &id, &eerr)) {
        /* what only the loaded model can tell: a prompt too long for it or for the KV cache */
        rc = eerr.code == RP_ERROR_INVALID_REQUEST || eerr.code == RP_ERROR_CONTEXT_LENGTH ||
                     eerr.code == RP_ERROR_UNSUPPORTED
                 ? rp_cli_usage_error(CMD, "%s", eerr.message)
                 : rp_cli_runtime_error(CMD, "%s", eerr.message);
        goto out;
    }
    const int sig = wait_finish(eng, id, &sc);
    write_out("\n", 1);
    if (sc.finish == RP_FINISH_REASON_ERROR) {
        rc = rp_cli_runtime_error(CMD, "%s", sc.error);
        goto out;
    }
    const double prefill_s = sc.generated ? sc.t_first - sc.t_submit : 0.0, decode_s = sc.t_last - sc.t_first;
    const int decode_tokens = sc.generated > 0 ? sc.generated - 1 : 0;
    char seed[48] = "";
    if (!rp_sampling_is_greedy(&sp)) snprintf(seed, sizeof seed, "; seed %llu", (unsigned long long)sp.seed);
    char spec[96] = "";
    if (ec.speculative_method) {
        rp_engine_stats st;
        rp_engine_get_stats(eng, &st);
        snprintf(spec, sizeof spec, "; speculative: %llu of %llu drafts accepted, %.2f tokens a round",
                 (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
                 st.spec_rounds ? 1.0 + (double)st.spec_accepted_tokens / st.spec_rounds : 0.0);
    }
    char masks[96] = ""; /* where the structured output's masks were applied (docs/structured.md) */
    if (so.flag) {
        rp_engine_stats st;
        rp_engine_get_stats(eng, &st);
        snprintf(masks, sizeof masks, "; token masks: %llu on the backend, %llu on the host",
                 (unsigned long long)st.masked_rows_device, (unsigned long long)st.masked_rows_host);
    }
    fprintf(stderr,
            "[stats] prompt %d tokens, generated %d tokens (%s); prefill %.1f tok/s (%.3f s), "
            "decode %.1f tok/s (%.3f s)%s%s%s\n",
            sc.prompt_tokens, sc.generated, finish_name(sc.finish), prefill_s > 0 ? sc.prompt_tokens / prefill_s : 0.0,
            prefill_s, decode_s > 0 ? decode_tokens / decode_s : 0.0, decode_s, seed, spec, masks);
    rc = sig ? rp_interrupt_exit_code(sig) : RP_EXIT_OK;
out:
    rp_engine_destroy(eng);
    rp_interrupt_uninstall();
    free(rendered);
    free(ids);
    free(file_text);
    rp_structured_opts_free(&so);
    return rc;
}

const rp_cli_command rp_cli_generate = {"generate", "generate text from a prompt, streaming tokens", options, help, run};
