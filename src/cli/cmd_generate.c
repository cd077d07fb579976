/* `replay generate`: one prompt in, tokens streamed out, then a stats line. */
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
            "  --prompt TEXT          the prompt text (needs a tokenizer: the model directory's, or --tokenizer)\n"
            "  --prompt-ids IDS       the prompt as comma-separated token ids\n"
            "  --tokenizer DIR        tokenizer.json (+ tokenizer_config.json) from DIR instead of the model's\n"
            "  --chat                 wrap the prompt as a user turn in the model's chat template\n"
            "  --system TEXT          with --chat: a system message first\n"
            "  --chat-template NAME   with --chat: qwen3 or llama3, when tokenizer_config.json's is not recognised\n"
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
            "  -q, --quiet            no log lines, only the generated text and stats\n"
            "  -h, --help             show this help\n");
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
    int printed;
    rp_detok *detok; /* NULL: print ids */
} stream_ctx;

static void on_token(void *ctx, int request, int32_t token) {
    (void)request;
    stream_ctx *sc = ctx;
    if (sc->detok) {
        const char *text;
        size_t len;
        rp_err err;
        /* an id the tokenizer does not know (a padded vocabulary) prints nothing */
        if (rp_detok_push(sc->detok, token, &text, &len, &err) == 0 && len) fwrite(text, 1, len, stdout);
        sc->printed++;
    } else {
        printf("%s%d", sc->printed++ ? " " : "", token);
    }
    fflush(stdout);
}

int rp_cmd_generate(int argc, char **argv) {
    static const struct option longopts[] = {
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
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    rp_model_opts mo;
    rp_model_opts_init(&mo);
    rp_sampling_params sp;
    rp_sampling_params_default(&sp);
    const char *prompt = NULL, *prompt_ids = NULL;
    long max_tokens = 64, page_size = 16, max_batch_tokens = 2048;
    int ignore_eos = 0, chat = 0, no_thinking = 0, print_ids = 0;
    const char *tokenizer_dir = NULL, *system_prompt = NULL, *template_name = NULL;
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
            if (rp_parse_int(optarg, 1, 1 << 20, &max_batch_tokens))
                return rp_cli_usage_error(CMD, "--max-batch-tokens must be a positive integer, got '%s'", optarg);
            break;
        case ':': return rp_cli_usage_error(CMD, "option '%s' needs a value", argv[optind - 1]);
        default: return rp_cli_usage_error(CMD, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return rp_cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (rp_model_opts_check(&mo, CMD)) return RP_EXIT_USAGE;
    if (!prompt == !prompt_ids) return rp_cli_usage_error(CMD, "give exactly one of --prompt or --prompt-ids");
    if (chat && !prompt) return rp_cli_usage_error(CMD, "--chat needs --prompt TEXT");
    if ((system_prompt || template_name || no_thinking) && !chat)
        return rp_cli_usage_error(CMD, "--system, --chat-template and --no-thinking go with --chat");
    int32_t *ids = NULL;
    int n_ids = 0;
    if (prompt_ids && parse_ids(prompt_ids, &ids, &n_ids))
        return rp_cli_usage_error(CMD, "--prompt-ids must be comma-separated non-negative integers");
    rp_err err;
    rp_sampling_seed_if_unset(&sp);

    rp_model *model = rp_cli_load_model(&mo);
    if (!model) {
        free(ids);
        return RP_EXIT_RUNTIME;
    }
    const rp_model_config *c = &model->cfg;
    int rc = RP_EXIT_RUNTIME;
    rp_tokenizer *tok = NULL;
    rp_detok detok;
    int have_detok = 0;
    int32_t stop_ids[8];
    int num_stop = 0;
    char *rendered = NULL;
    if (rp_cli_load_tokenizer(&mo, tokenizer_dir, model, &tok, CMD)) goto early_out;
    if (prompt) {
        if (!tok) {
            rc = rp_cli_usage_error(CMD, "--prompt needs a tokenizer: the model directory has no tokenizer.json "
                                         "(use --tokenizer DIR, or --prompt-ids)");
            goto early_out;
        }
        const char *text = prompt;
        if (chat) {
            if (template_name) {
                rp_chat_template_kind kind;
                if (rp_chat_template_from_name(template_name, &kind, &err)) {
                    rc = rp_cli_usage_error(CMD, "%s", err.msg);
                    goto early_out;
                }
                rp_tokenizer_set_chat_template(tok, kind);
            }
            rp_chat_message msgs[2];
            int nm = 0;
            if (system_prompt) msgs[nm++] = (rp_chat_message){"system", system_prompt};
            msgs[nm++] = (rp_chat_message){"user", prompt};
            if (rp_chat_render(tok, msgs, nm, 1, no_thinking ? 0 : -1, &rendered, &err)) {
                rc = rp_cli_runtime_error(CMD, "%s", err.msg);
                goto early_out;
            }
            text = rendered;
            num_stop = rp_chat_stop_ids(tok, stop_ids, 8);
        }
        size_t n = 0;
        if (rp_tokenizer_encode(tok, text, strlen(text), &ids, &n, &err)) {
            rc = rp_cli_runtime_error(CMD, "%s", err.msg);
            goto early_out;
        }
        /* As HF's tokenizer(text) with special tokens: Llama 3 starts with
         * <|begin_of_text|>; Qwen3 has no BOS. A chat template writes its own. */
        int bos = rp_tokenizer_bos_id(tok);
        if (bos >= 0 && !chat && (n == 0 || ids[0] != bos)) {
            int32_t *with = malloc((n + 1) * sizeof *with);
            with[0] = bos;
            memcpy(with + 1, ids, n * sizeof *ids);
            free(ids);
            ids = with;
            n++;
        }
        n_ids = (int)n;
    }
    if (tok && !print_ids) {
        rp_detok_init(&detok, tok, 1);
        have_detok = 1;
    }
    rp_page_pool *pool = NULL;
    rp_page_table *table = NULL;
    rp_backend *be = NULL;
    int32_t *output = NULL;
    if (n_ids == 0) {
        rc = rp_cli_usage_error(CMD, "the prompt is empty");
        goto out;
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= c->vocab_size) {
            rc = rp_cli_usage_error(CMD, "prompt token id %d is outside the vocabulary (%d)", ids[i], c->vocab_size);
            goto out;
        }
    if (rp_sampling_params_validate(&sp, c->vocab_size, &err)) {
        rc = rp_cli_usage_error(CMD, "%s", err.msg);
        goto out;
    }
    if ((long)n_ids + max_tokens > c->max_position_embeddings) {
        rc = rp_cli_runtime_error(CMD, "%d prompt tokens + %ld new tokens exceed the model's context of %d", n_ids,
                                  max_tokens, c->max_position_embeddings);
        goto out;
    }
    int ctx_tokens = n_ids + (int)max_tokens;
    int num_pages = (ctx_tokens + (int)page_size - 1) / (int)page_size;
    pool = rp_page_pool_new(num_pages, (int)page_size);
    table = pool ? rp_page_table_new(pool, 1, ctx_tokens) : NULL;
    rp_backend_config bc = {.num_pages = num_pages, .page_size = (int)page_size,
                            .max_batch_tokens = (int)(max_batch_tokens < ctx_tokens ? max_batch_tokens : ctx_tokens),
                            .max_batch_seqs = 1, .max_logit_rows = 1, .num_threads = mo.threads};
    if (!table) {
        rc = rp_cli_runtime_error(CMD, "out of memory");
        goto out;
    }
    if (!(be = rp_cli_make_backend(model, &mo, &bc))) goto out;
    output = malloc((size_t)(max_tokens ? max_tokens : 1) * sizeof *output);
    rp_gen_request req = {.prompt = ids, .num_prompt = n_ids, .max_tokens = (int)max_tokens,
                          .ignore_eos = ignore_eos, .sampling = sp, .output = output, .stop_ids = stop_ids,
                          .num_stop_ids = num_stop};
    stream_ctx sc = {.detok = have_detok ? &detok : NULL};
    rp_gen_stats st;
    if (rp_generate(be, table, &req, 1, on_token, &sc, &st, &err)) {
        if (sc.printed) printf("\n");
        rc = rp_cli_runtime_error(CMD, "%s", err.msg);
        goto out;
    }
    if (have_detok) {
        const char *tail;
        size_t tail_len;
        rp_detok_flush(&detok, &tail, &tail_len);
        fwrite(tail, 1, tail_len, stdout);
    }
    printf("\n");
    fflush(stdout);
    int decode_tokens = st.generated_tokens > 0 ? st.generated_tokens - 1 : 0;
    fprintf(stderr,
            "[stats] prompt %d tokens, generated %d tokens (%s); prefill %.1f tok/s (%.3f s), "
            "decode %.1f tok/s (%.3f s)\n",
            st.prompt_tokens, st.generated_tokens, rp_finish_reason_name(req.finish),
            st.prefill_s > 0 ? st.prompt_tokens / st.prefill_s : 0.0, st.prefill_s,
            st.decode_s > 0 ? decode_tokens / st.decode_s : 0.0, st.decode_s);
    rc = RP_EXIT_OK;
out:
    free(output);
    rp_backend_destroy(be);
    rp_page_table_free(table);
    rp_page_pool_free(pool);
early_out:
    if (have_detok) rp_detok_free(&detok);
    rp_tokenizer_free(tok);
    free(rendered);
    rp_model_free(model);
    free(ids);
    return rc;
}
