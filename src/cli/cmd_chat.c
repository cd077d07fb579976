/* `replay chat`: an interactive conversation in the terminal. Each turn
 * renders the whole conversation with the model's chat template, generates
 * the reply with streaming output, and stops at the template's end-of-turn
 * tokens. Lines read from stdin; /reset clears the history, /exit or EOF
 * (Ctrl-D) quits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "replay/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define CMD "chat"
#define MAX_TURNS 256

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay chat (--model DIR | --dummy-weights NAME --tokenizer DIR) [OPTIONS]\n"
            "\n"
            "An interactive chat with the model's chat template, replies streamed as they are generated.\n"
            "Type a message and Enter; /reset forgets the conversation; /exit or Ctrl-D quits.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Conversation:\n"
            "  --tokenizer DIR        tokenizer.json and tokenizer_config.json from DIR (default: the model's)\n"
            "  --system TEXT          a system message at the start (default: none)\n"
            "  --chat-template NAME   qwen3 or llama3 (default: tokenizer_config.json's)\n"
            "  --no-thinking          Qwen3: enable_thinking=false\n"
            "  --max-tokens N         tokens per reply at most (default 1024)\n"
            "  --max-context N        tokens of conversation kept in the KV cache (default 8192)\n"
            "\n" RP_SAMPLING_OPTIONS_HELP
            "\n" RP_COMMON_OPTIONS_HELP);
}

typedef struct chat_stream {
    char *text; /* the reply so far, kept for the history */
    size_t len, cap;
    int generated;
    double t_first, t_last;
    rp_finish finish;
    char error[256];
} chat_stream;

static void append(chat_stream *cs, const char *s, size_t n) {
    if (cs->len + n + 1 > cs->cap) {
        cs->cap = (cs->len + n + 1) * 2;
        cs->text = realloc(cs->text, cs->cap);
    }
    memcpy(cs->text + cs->len, s, n);
    cs->len += n;
    cs->text[cs->len] = 0;
}

/* Engine events, on the engine thread. */
static void on_event(void *user, const rp_token_event *ev) {
    chat_stream *cs = user;
    if (ev->token >= 0) {
        double now = rp_now_s();
        if (cs->generated++ == 0) cs->t_first = now;
        cs->t_last = now;
    }
    if (ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        append(cs, ev->text, ev->text_len);
    }
    if (ev->finish != RP_FINISH_REASON_NONE) {
        cs->finish = ev->finish;
        if (ev->error) snprintf(cs->error, sizeof cs->error, "%s", ev->error);
    }
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    RP_SAMPLING_LONG_OPTIONS,
    {"tokenizer", required_argument, 0, 'T'},
    {"system", required_argument, 0, 'S'},
    {"chat-template", required_argument, 0, 'M'},
    {"no-thinking", no_argument, 0, 'N'},
    {"max-tokens", required_argument, 0, 'n'},
    {"max-context", required_argument, 0, 'c'},
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_name = NULL;
    int no_thinking = 0;
    long max_tokens = 1024, max_context = 8192;
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, &sp, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'T': tokenizer_dir = optarg; break;
        case 'S': system_prompt = optarg; break;
        case 'M': template_name = optarg; break;
        case 'N': no_thinking = 1; break;
        case 'n':
            if (rp_parse_int(optarg, 1, 1 << 24, &max_tokens)) return rp_cli_usage_error(CMD, "--max-tokens must be >= 1");
            break;
        case 'c':
            if (rp_parse_int(optarg, 16, 1 << 24, &max_context))
                return rp_cli_usage_error(CMD, "--max-context must be >= 16");
            break;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    int bad_model = rp_model_opts_check(&mo, CMD);
    if (bad_model) return bad_model;
    rp_chat_template_kind forced = RP_CHAT_TEMPLATE_UNKNOWN;
    rp_err err;
    if (template_name && rp_chat_template_from_name(template_name, &forced, &err))
        return rp_cli_usage_error(CMD, "%s", err.msg);
    rp_sampling_seed_if_unset(&sp);
    if (rp_sampling_params_validate(&sp, 1 << 30, &err)) return rp_cli_usage_error(CMD, "%s", err.msg);

    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_name;
    ec.max_running_requests = 1;
    ec.max_context = (int)max_context;
    ec.max_batched_tokens = 2048;
    rp_error eerr;
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) return rp_cli_runtime_error(CMD, "%s", eerr.message);
    int rc = RP_EXIT_RUNTIME;
    rp_chat_message *msgs = calloc(MAX_TURNS * 2 + 1, sizeof *msgs);
    char **owned = calloc(MAX_TURNS * 2 + 1, sizeof *owned);
    int nmsgs = 0, nowned = 0;
    char *line = NULL;
    size_t line_cap = 0;
    chat_stream cs = {0};
    const rp_tokenizer *tok = rp_engine_tokenizer(eng);
    if (!tok) {
        rc = rp_cli_usage_error(CMD, "chat needs a tokenizer: the model directory has none (use --tokenizer DIR)");
        goto out;
    }
    if (rp_sampling_params_validate(&sp, rp_engine_vocab_size(eng), &err)) {
        rc = rp_cli_usage_error(CMD, "%s", err.msg);
        goto out;
    }
    max_context = rp_engine_max_context(eng);
    int32_t stop_ids[8];
    int num_stop = rp_chat_stop_ids(tok, stop_ids, 8);
    if (system_prompt) msgs[nmsgs++] = (rp_chat_message){"system", system_prompt};
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "replay chat: type a message; /reset clears the conversation, /exit quits\n");
    uint64_t turn = 0;
    for (;;) {
        if (tty) {
            printf("\n> ");
            fflush(stdout);
        }
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            for (int i = 0; i < nowned; i++) free(owned[i]);
            nowned = 0;
            nmsgs = system_prompt ? 1 : 0;
            if (tty) fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (nmsgs + 2 > MAX_TURNS * 2) {
            fprintf(stderr, "replay chat: the conversation is too long; /reset to start again\n");
            continue;
        }
        owned[nowned] = strdup(line);
        msgs[nmsgs++] = (rp_chat_message){"user", owned[nowned++]};
        char *rendered = NULL;
        int32_t *ids = NULL;
        size_t nids = 0;
        if (rp_chat_render(tok, msgs, nmsgs, 1, no_thinking ? 0 : -1, &rendered, &err) ||
            rp_tokenizer_encode(tok, rendered, strlen(rendered), &ids, &nids, &err)) {
            free(rendered);
            rc = rp_cli_runtime_error(CMD, "%s", err.msg);
            goto out;
        }
        free(rendered);
        int budget = (int)max_tokens;
        if ((long)nids + budget > max_context) budget = (int)(max_context - (long)nids);
        if (budget <= 0) {
            free(ids);
            free(owned[--nowned]);
            nmsgs--; /* drop the message that did not fit */
            fprintf(stderr, "replay chat: the conversation (%zu tokens) fills the context of %ld; /reset to start "
                            "again\n", nids, max_context);
            continue;
        }
        rp_request_params rq;
        rp_request_params_default(&rq);
        rq.prompt_ids = ids;
        rq.num_prompt_ids = (int)nids;
        rq.max_tokens = budget;
        rp_cli_request_sampling(&rq, &sp);
        rq.seed = sp.seed + turn++; /* each turn draws fresh numbers, reproducibly */
        rq.has_seed = 1;
        rq.stop_ids = stop_ids;
        rq.num_stop_ids = num_stop;
        cs.len = 0;
        cs.generated = 0;
        cs.finish = RP_FINISH_REASON_NONE;
        append(&cs, "", 0);
        int src = rp_engine_submit(eng, &rq, on_event, &cs, NULL, &eerr);
        free(ids);
        if (src) {
            rc = rp_cli_runtime_error(CMD, "%s", eerr.message);
            goto out;
        }
        rp_engine_wait_idle(eng);
        printf("\n");
        fflush(stdout);
        if (cs.finish == RP_FINISH_REASON_ERROR) {
            rc = rp_cli_runtime_error(CMD, "%s", cs.error);
            goto out;
        }
        if (rp_log_get_level() >= RP_LOG_INFO && tty)
            fprintf(stderr, "[%d tokens, %.1f tok/s%s]\n", cs.generated,
                    cs.t_last > cs.t_first ? (cs.generated - 1) / (cs.t_last - cs.t_first) : 0.0,
                    cs.finish == RP_FINISH_REASON_LENGTH ? ", cut at --max-tokens" : "");
        owned[nowned] = strdup(cs.text);
        msgs[nmsgs++] = (rp_chat_message){"assistant", owned[nowned++]};
    }
    rc = RP_EXIT_OK;
out:
    for (int i = 0; i < nowned; i++) free(owned[i]);
    free(owned);
    free(msgs);
    free(line);
    free(cs.text);
    rp_engine_destroy(eng);
    return rc;
}

const rp_cli_command rp_cli_chat = {"chat", "an interactive chat with the model's chat template", options, help, run};
