/* `replay chat`: an interactive conversation in the terminal, as llama-cli's
 * conversation mode and `ollama run` behave. Each turn renders the whole
 * conversation with the model's chat template, generates the reply with
 * streaming output, and stops at the model's end-of-turn tokens.
 *
 * Input comes a line at a time (lineedit.h: line editing and history on a
 * terminal, plain lines from a pipe). A line starting with '/' is a command
 * (/help lists them); an unknown one is an error, never sent to the model.
 *
 * Signals (interrupt.h), once the model has loaded; while it loads, SIGINT
 * and SIGTERM end the process by their default action:
 *   Ctrl-C during a reply   stops it; the part shown stays in the
 *                           conversation (the model "said" it) and the
 *                           prompt returns, as in llama-cli and ollama
 *   Ctrl-C at the prompt    with text typed, drops the line (as a shell
 *                           does); on an empty line, quits with 130 (as
 *                           llama-cli; ollama prints a hint instead), so
 *                           Ctrl-C twice always quits
 *   SIGTERM                 stops any reply and quits with 143
 *   Ctrl-D, /exit           quit with 0
 *
 * When the conversation outgrows the context (--max-model-len, less what a
 * reply may take: --max-tokens), the oldest turns are dropped, the system
 * message kept, and the first time it says so; a message that does not fit
 * even alone is not sent. Later turns always work. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/chat_opts.h"
#include "cli/interrupt.h"
#include "cli/lineedit.h"
#include "cli/sampling_opts.h"
#include "cli/structured_opts.h"
#include "engine/sampler.h"
#include "replay/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define CMD "chat"
#define DEFAULT_MAX_TOKENS 1024
/* the KV cache a chat holds on the CPU is sized by its context: 8192 keeps it
 * to a few GB on an 8B model, where the model's own (40960) would not */
#define DEFAULT_CONTEXT 8192

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay chat (--model DIR | --dummy-weights NAME --tokenizer DIR) [OPTIONS]\n"
            "\n"
            "An interactive chat with the model's chat template, replies streamed as they are generated.\n"
            "Type a message and Enter; on a terminal, lines can be edited and recalled (Up, Ctrl-R).\n"
            "Lines starting with '/' are commands: /help lists them, /reset forgets the conversation,\n"
            "/exit quits (so does Ctrl-D); start a message with '//' to send it with one '/'.\n"
            "Ctrl-C stops a reply; at the prompt it clears the line, or quits on an empty one (status 130).\n"
            "When the conversation outgrows --max-model-len, the oldest turns are dropped (the system\n"
            "message is kept), and the first time it says so.\n"
            "\n" RP_MODEL_OPTIONS_HELP
            "\n"
            "Conversation:\n"
            "  --tokenizer DIR        tokenizer.json and tokenizer_config.json from DIR (default: the model's)\n"
            "  --system TEXT          a system message at the start (default: none)\n"
            "  --chat-template FILE   a Jinja chat template file (default: the model's own,\n"
            "                         chat_template.jinja or tokenizer_config.json's)\n"
            "  --no-thinking          enable_thinking=false for the template (Qwen3's switch)\n"
            "  --max-tokens N         tokens per reply at most, 1 or more (default %d)\n"
            "  --max-model-len N      tokens of conversation, replies included, kept in the KV cache\n"
            "                         (default %d, or the model's max_position_embeddings if less)\n"
            "\n" RP_SAMPLING_OPTIONS_HELP RP_GENERATION_CONFIG_HELP
            "\n" RP_STRUCTURED_OPTIONS_HELP
            "\n",
            DEFAULT_MAX_TOKENS, DEFAULT_CONTEXT);
    rp_spec_opts_help(f);
    fputs("\n" RP_COMMON_OPTIONS_HELP, f);
}

static const char commands_help[] =
    "Commands:\n"
    "  /help, /?              this list\n"
    "  /reset, /clear         forget the conversation (the --system message stays)\n"
    "  /exit, /quit, /bye     quit (so does Ctrl-D)\n"
    "A message that starts with '/' is sent by writing '//' for its first '/'.\n"
    "Ctrl-C stops a reply; at the prompt it clears the line, or quits on an empty one.\n";

/* The messages so far, each content owned here: an optional system message,
 * then user and assistant turns. */
typedef struct conversation {
    const char **role;
    char **text;
    int n, cap;
    int first; /* index of the first user message: 1 with a system message */
} conversation;

static int conv_add(conversation *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        const int cap = c->cap ? c->cap * 2 : 16;
        const char **r = realloc(c->role, (size_t)cap * sizeof *r);
        if (!r) return -1;
        c->role = r;
        char **t = realloc(c->text, (size_t)cap * sizeof *t);
        if (!t) return -1;
        c->text = t;
        c->cap = cap;
    }
    if (!(c->text[c->n] = strdup(content))) return -1;
    c->role[c->n] = role;
    c->n++;
    return 0;
}

/* Forgets messages [from, from + count). */
static void conv_remove(conversation *c, int from, int count) {
    for (int i = from; i < from + count; i++) free(c->text[i]);
    memmove(c->role + from, c->role + from + count, (size_t)(c->n - from - count) * sizeof *c->role);
    memmove(c->text + from, c->text + from + count, (size_t)(c->n - from - count) * sizeof *c->text);
    c->n -= count;
}

static void conv_free(conversation *c) {
    conv_remove(c, 0, c->n);
    free(c->role);
    free(c->text);
}

typedef struct chat_stream {
    char *text; /* the reply so far, kept for the history */
    size_t len, cap;
    int oom; /* the reply outgrew the memory: the history keeps what fit */
    int generated;
    double t_first, t_last;
    rp_finish finish;
    char error[256];
    atomic_int done; /* set last, after the fields above */
} chat_stream;

static void append(chat_stream *cs, const char *s, size_t n) {
    if (cs->oom) return;
    if (cs->len + n + 1 > cs->cap) {
        const size_t cap = (cs->len + n + 1) * 2;
        char *t = realloc(cs->text, cap);
        if (!t) {
            cs->oom = 1;
            return;
        }
        cs->text = t;
        cs->cap = cap;
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
        rp_write_all(STDOUT_FILENO, ev->text, ev->text_len);
        append(cs, ev->text, ev->text_len);
    }
    if (ev->finish != RP_FINISH_REASON_NONE) {
        cs->finish = ev->finish;
        if (ev->error) snprintf(cs->error, sizeof cs->error, "%s", ev->error);
        atomic_store(&cs->done, 1);
        rp_interrupt_wake();
    }
}

typedef struct chat {
    rp_engine *eng;
    const rp_tokenizer *tok;
    conversation conv;
    int no_thinking;
    long max_tokens, context;
    int told_dropping; /* the first drop is announced; later ones only logged */
    rp_constraint constraint; /* every reply's structured output (kind NONE: none) */
} chat;

enum { FIT_OK, FIT_TOO_LONG, FIT_ERROR };

/* The conversation rendered for a reply, as token ids that leave room for
 * --max-tokens in the context: without the fewest oldest turns (a user
 * message and its reply) that make it fit; *dropped says how many turns
 * went. FIT_TOO_LONG: the newest message does not fit even alone, and
 * nothing was dropped (*n_ids says how long it was); FIT_ERROR: err says why. */
static int fit_prompt(chat *ch, int32_t **ids, size_t *n_ids, int *dropped, rp_err *err) {
    conversation *c = &ch->conv;
    const char **view_role = malloc((size_t)c->n * sizeof *view_role);
    const char **view_text = malloc((size_t)c->n * sizeof *view_text);
    if (!view_role || !view_text) {
        free(view_role);
        free(view_text);
        rp_errf(err, "out of memory");
        return FIT_ERROR;
    }
    *dropped = 0;
    int skip = 0, fit;
    for (;;) {
        /* the system message, then the turns after the skipped ones */
        int n = 0;
        if (c->first) view_role[n] = c->role[0], view_text[n++] = c->text[0];
        for (int i = c->first + skip; i < c->n; i++) view_role[n] = c->role[i], view_text[n++] = c->text[i];
        char *rendered = NULL;
        *ids = NULL;
        if (rp_cli_chat_render(ch->tok, view_role, (const char *const *)view_text, n, ch->no_thinking, &rendered,
                               err) ||
            rp_tokenizer_encode(ch->tok, rendered, strlen(rendered), ids, n_ids, err)) {
            free(rendered);
            fit = FIT_ERROR;
            break;
        }
        free(rendered);
        if ((long)*n_ids + ch->max_tokens <= ch->context) {
            conv_remove(c, c->first, skip);
            fit = FIT_OK;
            break;
        }
        const int oldest = c->first + skip;
        if (oldest == c->n - 1) { /* only the newest message is left */
            *dropped = 0;
            fit = FIT_TOO_LONG;
            break;
        }
        free(*ids);
        *ids = NULL;
        skip += oldest + 1 < c->n - 1 && !strcmp(c->role[oldest + 1], "assistant") ? 2 : 1;
        ++*dropped;
    }
    free(view_role);
    free(view_text);
    return fit;
}

/* A line starting with '/': 1 to go on, 0 to quit. */
static int command(chat *ch, const char *line) {
    const size_t len = strcspn(line, " \t");
    const char *args = line + len + strspn(line + len, " \t");
#define IS(name) (len == strlen(name) && !strncmp(line, name, len))
    if (!(IS("/help") || IS("/?") || IS("/reset") || IS("/clear") || IS("/exit") || IS("/quit") || IS("/bye"))) {
        fprintf(stderr, "replay chat: unknown command '%.*s' (/help lists the commands; '//' starts a message "
                        "with '/')\n",
                (int)len, line);
        return 1;
    }
    if (*args) {
        fprintf(stderr, "replay chat: %.*s takes no arguments\n", (int)len, line);
        return 1;
    }
    if (IS("/exit") || IS("/quit") || IS("/bye")) return 0;
    if (IS("/help") || IS("/?")) {
        fputs(commands_help, stdout);
        fflush(stdout);
        return 1;
    }
#undef IS
    conv_remove(&ch->conv, ch->conv.first, ch->conv.n - ch->conv.first);
    ch->told_dropping = 0;
    if (rp_log_get_level() >= RP_LOG_INFO) fprintf(stderr, "(conversation cleared)\n");
    return 1;
}

/* One user message in, one reply out. Returns 0 to go on, or an exit status:
 * 143 on SIGTERM, 1 when the engine failed. A message that cannot be sent is
 * reported and forgotten; the session goes on. */
static int turn(chat *ch, const char *line, uint64_t seed, const rp_sampling_params *sp, const int32_t *stop_ids,
                int num_stop_ids) {
    conversation *c = &ch->conv;
    if (conv_add(c, "user", line)) return rp_cli_runtime_error(CMD, "out of memory");
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int dropped = 0;
    rp_err err;
    const int fit = fit_prompt(ch, &ids, &n_ids, &dropped, &err);
    if (fit == FIT_ERROR) {
        conv_remove(c, c->n - 1, 1);
        fprintf(stderr, "replay chat: %s; the message was not sent\n", err.msg);
        return 0;
    }
    if (dropped && !ch->told_dropping) {
        rp_log_warn("chat: context full (%ld tokens, %ld of them kept for the reply): dropped the oldest %d turn%s; "
                    "older turns are dropped from now on as needed (/reset starts afresh)",
                    ch->context, ch->max_tokens, dropped, dropped == 1 ? "" : "s");
        ch->told_dropping = 1;
    } else if (dropped) {
        rp_log_debug("chat: dropped the oldest %d turn%s to fit the context", dropped, dropped == 1 ? "" : "s");
    }
    if (fit == FIT_TOO_LONG) {
        free(ids);
        conv_remove(c, c->n - 1, 1);
        fprintf(stderr, "replay chat: this message needs %zu tokens%s, and with --max-tokens %ld that does not fit "
                        "the context of %ld tokens: not sent\n",
                n_ids, c->first ? " with the system message" : "", ch->max_tokens, ch->context);
        return 0;
    }
    rp_request_params rq;
    rp_request_params_default(&rq);
    rq.prompt_ids = ids;
    rq.num_prompt_ids = (int)n_ids;
    rq.max_tokens = (int)ch->max_tokens;
    rp_cli_request_sampling(&rq, sp);
    rq.seed = seed;
    rq.has_seed = 1;
    rq.stop_ids = stop_ids;
    rq.num_stop_ids = num_stop_ids;
    rq.constraint = ch->constraint;
    chat_stream cs = {0};
    append(&cs, "", 0);
    rp_request_id id = 0;
    rp_error eerr;
    fflush(stdout); /* the reply is written past stdio, so whatever stdio holds goes first */
    const int submitted = rp_engine_submit(ch->eng, &rq, on_event, &cs, &id, &eerr);
    free(ids);
    if (submitted) {
        free(cs.text);
        conv_remove(c, c->n - 1, 1);
        if (eerr.code == RP_ERROR_CONTEXT_LENGTH || eerr.code == RP_ERROR_INVALID_REQUEST) {
            fprintf(stderr, "replay chat: %s; the message was not sent\n", eerr.message);
            return 0;
        }
        return rp_cli_runtime_error(CMD, "%s", eerr.message);
    }
    int sig = rp_interrupt_wait(&cs.done);
    if (sig) {
        rp_engine_abort(ch->eng, id);
        for (int s; (s = rp_interrupt_wait(&cs.done));)
            if (s == SIGTERM) sig = s;
    }
    rp_engine_wait_idle(ch->eng);
    rp_write_all(STDOUT_FILENO, "\n", 1);
    if (cs.finish == RP_FINISH_REASON_ERROR) {
        free(cs.text);
        return rp_cli_runtime_error(CMD, "%s", cs.error);
    }
    if (rp_log_get_level() >= RP_LOG_INFO) /* -q leaves stderr to errors */
        fprintf(stderr, "[%d tokens, %.1f tok/s%s]\n", cs.generated,
                cs.t_last > cs.t_first ? (cs.generated - 1) / (cs.t_last - cs.t_first) : 0.0,
                cs.finish == RP_FINISH_REASON_ABORT    ? ", stopped"
                : cs.finish == RP_FINISH_REASON_LENGTH  ? ", cut at --max-tokens"
                : cs.finish == RP_FINISH_REASON_GRAMMAR ? ", grammar dead end"
                                                        : "");
    const int oom = cs.oom || conv_add(c, "assistant", cs.text ? cs.text : "");
    free(cs.text);
    if (oom) return rp_cli_runtime_error(CMD, "out of memory");
    return sig == SIGTERM ? RP_EXIT_SIGTERM : 0;
}

static const struct option options[] = {
    RP_MODEL_LONG_OPTIONS,
    RP_SAMPLING_LONG_OPTIONS,
    RP_STRUCTURED_LONG_OPTIONS,
    {"tokenizer", required_argument, 0, 'T'},
    {"system", required_argument, 0, 'S'},
    {"chat-template", required_argument, 0, 'M'},
    {"no-thinking", no_argument, 0, 'N'},
    {"generation-config", required_argument, 0, 'G'},
    {"max-tokens", required_argument, 0, 'n'},
    {"max-model-len", required_argument, 0, 'c'},
    RP_SPEC_LONG_OPTIONS,
    RP_COMMON_LONG_OPTIONS,
    {0, 0, 0, 0},
};

static int run(int argc, char **argv) {
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    rp_sampling_opts_unset(&sp); /* generation_config.json fills what no flag sets */
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_file = NULL, *generation_config = "auto";
    int no_thinking = 0;
    long max_tokens = DEFAULT_MAX_TOKENS, max_model_len = 0;
    rp_engine_config ec;
    rp_engine_config_default(&ec);
    rp_structured_opts so;
    rp_structured_opts_init(&so);
    rp_cli_opts_begin();
    int opt;
    while ((opt = rp_cli_next_opt(argc, argv, ":hq", options, &mo, &sp, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'T': tokenizer_dir = optarg; break;
        case 'S': system_prompt = optarg; break;
        case 'M': template_file = optarg; break;
        case 'G': generation_config = optarg; break;
        case 'N': no_thinking = 1; break;
        case 'n':
            if (rp_parse_int(optarg, 1, 1 << 24, &max_tokens))
                return rp_cli_usage_error(CMD, "--max-tokens must be an integer from 1 to %d, got '%s'", 1 << 24,
                                          optarg);
            break;
        case 'c':
            if (rp_parse_int(optarg, 1, 1 << 24, &max_model_len))
                return rp_cli_usage_error(CMD, "--max-model-len must be an integer from 1 to %d, got '%s'", 1 << 24,
                                          optarg);
            break;
        case 0x14a: case 0x14b: case 0x14c: case 0x14d: case 0x14e: case 0x14f:
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
    if (bad || (bad = rp_spec_opts_check(&ec, CMD))) return bad;
    if (template_file && (bad = rp_cli_check_template_file(template_file, CMD))) return bad;
    char sampling_what[512];
    int sampling_taken;
    if ((bad = rp_sampling_opts_resolve(mo.model_dir, generation_config, &sp, sampling_what, sizeof sampling_what,
                                        &sampling_taken, CMD)))
        return bad;
    const long model_context = mo.cfg.max_position_embeddings;
    if (max_model_len > model_context)
        return rp_cli_usage_error(CMD, "--max-model-len %ld is more than the model's context of %ld tokens "
                                       "(max_position_embeddings)",
                                  max_model_len, model_context);
    const long context = max_model_len ? max_model_len : DEFAULT_CONTEXT < model_context ? DEFAULT_CONTEXT
                                                                                          : model_context;
    if (max_tokens >= context)
        return rp_cli_usage_error(CMD, "--max-tokens %ld leaves no room for the conversation in a context of %ld "
                                       "tokens (--max-model-len)",
                                  max_tokens, context);
    if (tokenizer_dir && (bad = rp_cli_check_dir_file("--tokenizer", tokenizer_dir, "tokenizer.json", CMD)))
        return bad;
    if (!rp_cli_tokenizer_dir(&mo, tokenizer_dir))
        return rp_cli_usage_error(CMD, "chat needs a tokenizer, and %s: use --tokenizer DIR",
                                  mo.model_dir ? "the model directory has no tokenizer.json"
                                               : "--dummy-weights come without one");
    if ((bad = rp_structured_opts_check(&so, CMD))) {
        rp_structured_opts_free(&so);
        return bad;
    }
    rp_sampling_seed_if_unset(&sp);

    rp_cli_engine_model(&mo, &ec);
    ec.tokenizer_dir = tokenizer_dir;
    ec.chat_template = template_file;
    ec.max_running_requests = 1;
    ec.max_context = (int)context;
    ec.max_batched_tokens = 2048;
    rp_error eerr;
    /* Loading: SIGINT and SIGTERM still have their default action here. */
    if (rp_cli_is_worker(&mo)) return rp_cli_engine_worker(&ec, CMD);
    rp_engine *eng = rp_engine_create(&ec, &eerr);
    if (!eng) {
        rp_structured_opts_free(&so);
        return rp_cli_runtime_error(CMD, "%s", eerr.message);
    }
    int rc = RP_EXIT_RUNTIME;
    if (sampling_taken) rp_log_info("%s", sampling_what);
    else rp_log_debug("%s", sampling_what);
    chat ch = {.eng = eng, .tok = rp_engine_tokenizer(eng), .no_thinking = no_thinking,
               .max_tokens = max_tokens, .context = rp_engine_max_context(eng), .constraint = so.constraint};
    rp_lineedit *le = NULL;
    if (rp_interrupt_install()) {
        rc = rp_cli_runtime_error(CMD, "cannot watch for Ctrl-C: %s", strerror(errno));
        goto out;
    }
    if (ch.max_tokens >= ch.context) { /* the KV cache made the context shorter than asked */
        rc = rp_cli_usage_error(CMD, "--max-tokens %ld leaves no room for the conversation in the %ld tokens the KV "
                                     "cache holds",
                                max_tokens, ch.context);
        goto out;
    }
    if (system_prompt && conv_add(&ch.conv, "system", system_prompt)) {
        rc = rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    ch.conv.first = ch.conv.n;
    int32_t stop_ids[8];
    const int num_stop = rp_chat_stop_ids(ch.tok, stop_ids, 8);
    if (!(le = rp_lineedit_new("replay", "> "))) {
        rc = rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    const int tty = rp_lineedit_is_tty(le);
    if (tty)
        fprintf(stderr, "replay chat: type a message; /help lists the commands, Ctrl-C stops a reply, Ctrl-D or "
                        "/exit quits\n");
    uint64_t turns = 0;
    for (rc = RP_EXIT_OK;;) {
        if (tty) printf("\n");
        char *line = NULL;
        int sig = 0, discarded = 0;
        const rp_line_status st = rp_lineedit_read(le, &line, &sig, &discarded);
        if (st == RP_LINE_INTERRUPTED) {
            if (tty) printf("\n");
            if (sig == SIGINT && discarded) continue; /* Ctrl-C drops the line typed */
            rc = rp_interrupt_exit_code(sig);
            break;
        }
        if (st == RP_LINE_EOF) { /* Ctrl-D: the shell's prompt on a line of its own */
            if (tty) printf("\n");
            break;
        }
        if (st == RP_LINE_ERROR) {
            rc = rp_cli_runtime_error(CMD, "reading standard input: %s", strerror(errno));
            break;
        }
        if (!line[strspn(line, " \t")]) continue; /* nothing typed */
        if (line[0] == '/' && line[1] != '/') {
            if (!command(&ch, line)) break;
            continue;
        }
        /* each turn draws fresh numbers, reproducibly from --seed */
        if ((rc = turn(&ch, line[0] == '/' ? line + 1 : line, sp.seed + turns++, &sp, stop_ids, num_stop))) break;
    }
out:
    rp_lineedit_free(le); /* the terminal as it was */
    conv_free(&ch.conv);
    rp_engine_destroy(eng);
    rp_interrupt_uninstall();
    rp_structured_opts_free(&so);
    return rc;
}

const rp_cli_command rp_cli_chat = {"chat", "an interactive chat with the model's chat template", options, help, run};
