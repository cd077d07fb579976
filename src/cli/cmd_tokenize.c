/* `replay tokenize`: text in, token ids out (and, with --verbose, each
 * token's vocabulary entry and the bytes it stands for). The quickest way to
 * check replay's tokenizer against Hugging Face's by eye. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_common.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

#define CMD "tokenize"

static void help(FILE *f) {
    fprintf(f,
            "Usage: replay tokenize --model DIR [OPTIONS] [TEXT]\n"
            "\n"
            "Prints the token ids of TEXT (or of standard input when TEXT is absent)\n"
            "as Hugging Face tokenizers would: tokenizer(TEXT, add_special_tokens=False).\n"
            "Special tokens written in the text (e.g. <|im_end|>) are recognised.\n"
            "\n"
            "Model:\n"
            "  --model DIR            directory with tokenizer.json (and tokenizer_config.json); required\n"
            "\n"
            "Tokenizing:\n"
            "  --split-special        treat special tokens in the text as plain text\n"
            "\n");
    rp_bench_output_help(f, "  -v, --verbose          one token per line: id, vocabulary entry, decoded bytes\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
    }
    *len = n;
    return buf;
}

/* Bytes as a C-style quoted string, so spaces and newlines are visible. */
static void print_escaped(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
}

static const struct option options[] = {{"model", required_argument, 0, 'm'},
                                         {"verbose", no_argument, 0, 'v'},
                                         {"split-special", no_argument, 0, 's'},
                                         RP_COMMON_LONG_OPTIONS,
                                         {0, 0, 0, 0}};

static int run(int argc, char **argv) {
    const char *model_dir = NULL;
    int verbose = 0;
    unsigned flags = 0;
    int opt;
    rp_cli_opts_begin();
    while ((opt = rp_cli_next_opt(argc, argv, "+:vhq", options, NULL, NULL, CMD)) != RP_OPT_END) {
        switch (opt) {
        case 'm': model_dir = optarg; break;
        case 'v': verbose = 1; break;
        case 's': flags |= RP_ENCODE_SPLIT_SPECIAL; break;
        case 'h': help(stdout); return RP_EXIT_OK;
        default: return RP_EXIT_USAGE; /* reported by rp_cli_next_opt */
        }
    }
    if (!model_dir) return rp_cli_usage_error(CMD, "--model DIR is required");
    if (argc - optind > 1) return rp_cli_usage_error(CMD, "expected one TEXT argument (quote it), got %d", argc - optind);
    /* before waiting on standard input: a wrong directory is said at once */
    if (rp_cli_check_dir_file("--model", model_dir, "tokenizer.json", CMD)) return RP_EXIT_USAGE;

    char *owned = NULL;
    const char *text;
    size_t len;
    if (optind < argc) {
        text = argv[optind];
        len = strlen(text);
    } else {
        owned = read_stdin(&len);
        if (!owned) return rp_cli_runtime_error(CMD, "cannot read standard input");
        text = owned;
    }

    rp_err err = {0};
    rp_tokenizer *tok = rp_tokenizer_load(model_dir, &err);
    if (!tok) {
        free(owned);
        return rp_cli_runtime_error(CMD, "%s", err.msg);
    }
    int32_t *ids;
    size_t n;
    int rc = rp_tokenizer_encode_ex(tok, text, len, flags, &ids, &n, &err);
    free(owned);
    if (rc) {
        rp_tokenizer_free(tok);
        return rp_cli_runtime_error(CMD, "%s", err.msg);
    }
    if (verbose) {
        for (size_t i = 0; i < n; i++) {
            const char *bytes;
            size_t bl;
            rp_tokenizer_token_bytes(tok, ids[i], &bytes, &bl);
            printf("%d\t%s\t", ids[i], rp_tokenizer_token_text(tok, ids[i]));
            print_escaped(bytes, bl);
            putchar('\n');
        }
        printf("%zu tokens\n", n);
    } else {
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        putchar('\n');
    }
    free(ids);
    rp_tokenizer_free(tok);
    return RP_EXIT_OK;
}

const rp_cli_command rp_cli_tokenize = {"tokenize", "print the token ids (and pieces) of a text", options, help, run};
