/* `replay generate`: one prompt in, tokens streamed out, then a stats line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "replay/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define CMD "generate"

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay generate (--model DIR | --dummy-weights NAME) (--prompt TEXT | --prompt-ids IDS) [OPTIONS]\n"
            "\n"
            "Generates a continuation of the prompt, printing tokens as they are produced,\n"
            "then a stats line (prompt and generated tokens, prefill and decode tok/s) on stderr.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Prompt and length:\n"
            "  --prompt TEXT          the prompt text; one of --prompt and --prompt-ids is required\n"
            "                         (it needs a tokenizer: the model directory's, or --tokenizer)\n"
            "  --prompt-ids IDS       the prompt as comma-separated token ids (required without --prompt)\n"
            "  --tokenizer DIR        tokenizer.json (+ tokenizer_config.json) from DIR (default: the model's)\n"
            "  --chat                 wrap the prompt as a user turn in the model's chat template\n"
            "  --system TEXT          with --chat: a system message first (default: none)\n"
            "  --chat-template NAME   with --chat: qwen3 or llama3 (default: tokenizer_config.json's)\n"
            "  --no-thinking          with --chat on Qwen3: enable_thinking=false\n"
            "  --print-ids            print token ids instead of text\n"
            "  --max-tokens N         tokens to generate at most (default 64)\n"
            "  --ignore-eos           keep going past end-of-sequence tokens\n"
            "\n"
            RP_SAMPLING_OPTIONS_HELP
            "\n"
            "Engine:\n"
            "  --page-size N          KV cache page size in tokens (default 16)\n"
            "  --max-batch-tokens N   tokens per forward step; longer prompts are chunked (default 2048)\n"
            "\n" RP_COMMON_OPTIONS_HELP);
}

static int parse_ids(const char *s, int32_t **out, int *n_out) {
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff) {
            free(ids);
            return -1;
        }
        if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (n == 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

typedef struct stream_ctx {
    int print_ids, printed, generated, prompt_tokens;
    double t_submit, t_first, t_last;
    rp_finish finish;
    char error[256];
} stream_ctx;

/* Engine events arrive on the engine thread, one per token. */
static void on_event(void *user, const rp_token_event *ev) {
    stream_ctx *sc = user;
    double now = rp_now_s();
    if (ev->token >= 0) {
        if (sc->generated++ == 0) sc->t_first = now;
        sc->t_last = now;
        if (sc->print_ids) printf("%s%d", sc->printed++ ? " " : "", ev->token);
    }
    if (!sc->print_ids && ev->text_len) fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    sc->prompt_tokens = ev->prompt_tokens;
    if (ev->finish != RP_FINISH_REASON_NONE) {
        sc->finish = ev->finish;
        if (ev->error) snprintf(sc->error, sizeof sc->error, "%s", ev->error);
    }
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    {"prompt", required_argument, 0, 'p'},
    {"prompt-ids", required_argument, 0, 'I'},
    {"max-tokens", required_argument, 0, 'n'},
    {"ignore-eos", no_argument, 0, 'E'},
    RP_SAMPLING_LONG_OPTIONS,
    {"page-size", required_argument, 0, 'g'},
    {"max-batch-tokens", required_argument, 0, 'b'},
    {"tokenizer", required_argument, 0, 'T'},
    {"chat", no_argument, 0, 'C'},
    {"system", required_argument, 0, 'S'},
    {"chat-template", required_argument, 0, 'M'},
    {"no-thinking", no_argument, 0, 'N'},
    {"print-ids", no_argument, 0, 'D'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    const char *prompt = NULL, *prompt_ids = NULL;
    long max_tokens = 64, page_size = 16, max_batched_tokens = 2048;
    int ignore_eos = 0, chat = 0, no_thinking = 0, print_ids = 0;
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_name = NULL;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, &sp, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'p': prompt = optarg; break;
        case 'I': prompt_ids = optarg; break;
        case 'E': ignore_eos = 1; break;
        case 'T': tokenizer_dir = optarg; break;
        case 'C': chat = 1; break;
        case 'S': system_prompt = optarg; break;
        case 'M': template_name = optarg; break;
        case 'N': no_thinking = 1; break;
        case 'D': print_ids = 1; break;
        case 'n':
            if (rp_parse_int(optarg, 0, 1 << 24, &max_tokens))
                return rp_cli_usage_error(CMD, "--max-tokens must be a non-negative integer, got '%s'", optarg);
            break;
        case 'g':
            if (rp_parse_int(optarg, 1, 4096, &page_size))
                return rp_cli_usage_error(CMD, "--page-size must be an integer from 1 to 4096, got '%s'", optarg);
            break;
        case 'b':
            if (rp_parse_int(optarg, 1, 1 << 20, &max_batched_tokens))
                return rp_cli_usage_error(CMD, "--max-batch-tokens must be a positive integer, got '%s'", optarg);
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    if (!prompt == !prompt_ids) return rp_cli_usage_error(CMD, "give exactly one of --prompt or --prompt-ids");
    if (chat && !prompt) return rp_cli_usage_error(CMD, "--chat needs --prompt TEXT");
    rp_err err;
    rp_chat_template_kind kind;
    if (template_name && rp_chat_template_from_name(template_name, &kind, &err))
        return rp_cli_usage_error(CMD, "%s", err.msg);
    if ((system_prompt || template_name || no_thinking) && !chat)
        return rp_cli_usage_error(CMD, "--system, --chat-template and --no-thinking go with --chat");
    int32_t *ids = NULL;
    int n_ids = 0;
    if (prompt_ids && parse_ids(prompt_ids, &ids, &n_ids))
        return rp_cli_usage_error(CMD, "--prompt-ids must be comma-separated non-negative integers");
    rp_sampling_seed_if_unset(&sp);

    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_name;
    ec.page_size = (int)page_size;
    ec.max_running_requests = 1;
    ec.max_batched_tokens = (int)max_batched_tokens;
    ec.chunked_prefill_size = (int)max_batched_tokens;
    int rc = RP_EXIT_RUNTIME;
    char *rendered = NULL;
    int32_t stop_ids[8];
    int num_stop = 0;
    rp_error eerr;
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) {
        free(ids);
        return rp_cli_runtime_error(CMD, "%s", eerr.message);
    }
    const rp_tokenizer *tok = rp_engine_tokenizer(eng);
    rp_request_params rq;
    rp_request_params_default(&rq);
    if (prompt) {
        if (!tok) {
            rc = rp_cli_usage_error(CMD, "--prompt needs a tokenizer: the model directory has no tokenizer.json "
                                         "(use --tokenizer DIR, or --prompt-ids)");
            goto out;
        }
        if (chat) {
            rp_chat_message msgs[2];
            int nm = 0;
            if (system_prompt) msgs[nm++] = (rp_chat_message){"system", system_prompt};
            msgs[nm++] = (rp_chat_message){"user", prompt};
            if (rp_chat_render(tok, msgs, nm, 1, no_thinking ? 0 : -1, &rendered, &err)) {
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
            num_stop = rp_chat_stop_ids(tok, stop_ids, 8);
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
    rq.num_stop_ids = num_stop;
    stream_ctx sc = {.print_ids = print_ids || !tok, .t_submit = rp_now_s()};
    if (rp_engine_submit(eng, &rq, on_event, &sc, NULL, &eerr)) {
        rc = rp_cli_usage_error(CMD, "%s", eerr.message);
        goto out;
    }
    rp_engine_wait_idle(eng);
    printf("\n");
    fflush(stdout);
    if (sc.finish == RP_FINISH_REASON_ERROR) {
        rc = rp_cli_runtime_error(CMD, "%s", sc.error);
        goto out;
    }
    double prefill_s = sc.t_first - sc.t_submit, decode_s = sc.t_last - sc.t_first;
    int decode_tokens = sc.generated > 0 ? sc.generated - 1 : 0;
    fprintf(stderr,
            "[stats] prompt %d tokens, generated %d tokens (%s); prefill %.1f tok/s (%.3f s), "
            "decode %.1f tok/s (%.3f s)\n",
            sc.prompt_tokens, sc.generated, sc.finish == RP_FINISH_REASON_STOP ? "stop" : "length",
            prefill_s > 0 ? sc.prompt_tokens / prefill_s : 0.0, prefill_s,
            decode_s > 0 ? decode_tokens / decode_s : 0.0, decode_s);
    rc = RP_EXIT_OK;
out:
    rp_engine_destroy(eng);
    free(rendered);
    free(ids);
    return rc;
}

const rp_cli_command rp_cli_generate = {"generate", "generate text from a prompt, streaming tokens", options, help, run};
