/* `replay chat`: an interactive conversation in the terminal. Each turn
 * renders the whole conversation with the model's chat template, generates
 * the reply with streaming output, and stops at the template's end-of-turn
 * tokens. Lines read from stdin; /reset clears the history, /exit or EOF
 * (Ctrl-D) quits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
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
            "  --tokenizer DIR        tokenizer.json and tokenizer_config.json from DIR\n"
            "  --system TEXT          a system message at the start\n"
            "  --chat-template NAME   qwen3 or llama3, when tokenizer_config.json's is not recognised\n"
            "  --no-thinking          Qwen3: enable_thinking=false\n"
            "  --max-tokens N         tokens per reply at most (default 1024)\n"
            "  --max-context N        tokens of conversation kept in the KV cache (default 8192)\n"
            "\n" RP_SAMPLING_OPTIONS_HELP
            "  -q, --quiet            no log lines\n"
            "  -h, --help             show this help\n");
}

typedef struct chat_stream {
    rp_detok detok;
    char *text; /* the reply so far, kept for the history */
    size_t len, cap;
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

static void on_token(void *ctx, int request, int32_t token) {
    (void)request;
    chat_stream *cs = ctx;
    const char *text;
    size_t len;
    rp_err err;
    if (rp_detok_push(&cs->detok, token, &text, &len, &err) == 0 && len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        append(cs, text, len);
    }
}

int rp_cmd_chat(int argc, char **argv) {
    static const struct option longopts[] = {
        RP_MODEL_LONG_OPTIONS,
        RP_SAMPLING_LONG_OPTIONS,
        {"tokenizer", required_argument, 0, 'T'},
        {"system", required_argument, 0, 'S'},
        {"chat-template", required_argument, 0, 'M'},
        {"no-thinking", no_argument, 0, 'N'},
        {"max-tokens", required_argument, 0, 'n'},
        {"max-context", required_argument, 0, 'c'},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_name = NULL;
    int no_thinking = 0;
    long max_tokens = 1024, max_context = 8192;
    optind = 1;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":hq", longopts, NULL)) != -1) {
        int r = rp_model_opts_parse(&mo, opt, optarg, CMD);
        if (r == 0) r = rp_sampling_opts_parse(&sp, opt, optarg, CMD);
        if (r < 0) return RP_EXIT_USAGE;
        if (r > 0) continue;
        switch (opt) {
        case 'h': help(stdout); return RP_EXIT_OK;
        case 'q': rp_log_set_level(RP_LOG_ERROR); break;
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
        case ':': return rp_cli_usage_error(CMD, "option '%s' needs a value", argv[optind - 1]);
        default: return rp_cli_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (rp_model_opts_check(&mo, CMD)) return RP_EXIT_USAGE;
    rp_chat_template_kind forced = RP_CHAT_TEMPLATE_UNKNOWN;
    rp_err err;
    if (template_name && rp_chat_template_from_name(template_name, &forced, &err))
        return rp_cli_usage_error(CMD, "%s", err.msg);
    rp_sampling_seed_if_unset(&sp);

    rp_model *model = rp_cli_load_model(&mo);
    if (!model) return RP_EXIT_RUNTIME;
    int rc = RP_EXIT_RUNTIME;
    rp_tokenizer *tok = NULL;
    rp_page_pool *pool = NULL;
    rp_page_table *table = NULL;
    rp_backend *be = NULL;
    rp_chat_message *msgs = calloc(MAX_TURNS * 2 + 1, sizeof *msgs);
    char **owned = calloc(MAX_TURNS * 2 + 1, sizeof *owned);
    int nmsgs = 0, nowned = 0;
    int32_t *output = malloc((size_t)max_tokens * sizeof *output);
    char *line = NULL;
    size_t line_cap = 0;
    chat_stream cs = {0};
    if (rp_cli_load_tokenizer(&mo, tokenizer_dir, model, &tok, CMD)) goto out;
    if (!tok) {
        rc = rp_cli_usage_error(CMD, "chat needs a tokenizer: the model directory has none (use --tokenizer DIR)");
        goto out;
    }
    if (forced != RP_CHAT_TEMPLATE_UNKNOWN) rp_tokenizer_set_chat_template(tok, forced);
    if (rp_sampling_params_validate(&sp, model->cfg.vocab_size, &err)) {
        rc = rp_cli_usage_error(CMD, "%s", err.msg);
        goto out;
    }
    if (max_context > model->cfg.max_position_embeddings) max_context = model->cfg.max_position_embeddings;
    int ps = 16, pages = (int)((max_context + ps - 1) / ps);
    pool = rp_page_pool_new(pages, ps);
    table = pool ? rp_page_table_new(pool, 1, (int)max_context) : NULL;
    rp_backend_config bc = {.num_pages = pages, .page_size = ps, .max_batch_tokens = 2048, .max_batch_seqs = 1,
                            .max_logit_rows = 1};
    if (!table || !(be = rp_cli_make_backend(model, &mo, &bc))) goto out;
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
            nmsgs--; /* drop the message that did not fit */
            fprintf(stderr, "replay chat: the conversation (%zu tokens) fills the context of %ld; /reset to start "
                            "again\n", nids, max_context);
            continue;
        }
        rp_sampling_params turn_sp = sp;
        turn_sp.seed = sp.seed + turn++; /* each turn draws fresh numbers, reproducibly */
        rp_gen_request req = {.prompt = ids, .num_prompt = (int)nids, .max_tokens = budget, .sampling = turn_sp,
                              .output = output, .stop_ids = stop_ids, .num_stop_ids = num_stop};
        rp_detok_init(&cs.detok, tok, 1);
        cs.len = 0;
        append(&cs, "", 0);
        rp_gen_stats st;
        int grc = rp_generate(be, table, &req, 1, on_token, &cs, &st, &err);
        const char *tail;
        size_t tail_len;
        rp_detok_flush(&cs.detok, &tail, &tail_len);
        fwrite(tail, 1, tail_len, stdout);
        append(&cs, tail, tail_len);
        rp_detok_free(&cs.detok);
        free(ids);
        printf("\n");
        fflush(stdout);
        if (grc) {
            rc = rp_cli_runtime_error(CMD, "%s", err.msg);
            goto out;
        }
        if (rp_log_get_level() >= RP_LOG_INFO && tty)
            fprintf(stderr, "[%d tokens, %.1f tok/s%s]\n", st.generated_tokens,
                    st.decode_s > 0 ? (st.generated_tokens - 1) / st.decode_s : 0.0,
                    req.finish == RP_FINISH_LENGTH ? ", cut at --max-tokens" : "");
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
    free(output);
    rp_backend_destroy(be);
    rp_page_table_free(table);
    rp_page_pool_free(pool);
    rp_tokenizer_free(tok);
    rp_model_free(model);
    return rc;
}
