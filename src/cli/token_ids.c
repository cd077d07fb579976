/* Token ids from the command line (token_ids.h). */
#include "cli/token_ids.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* The whole file as a string; NULL with errno set. */
static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            errno = ENOMEM;
            return NULL;
        }
        len += fread(buf + len, 1, cap - 1 - len, f);
        if (len < cap - 1) break;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    const int bad = ferror(f), saved = errno;
    fclose(f);
    if (bad) {
        free(buf);
        errno = saved ? saved : EIO;
        return NULL;
    }
    buf[len] = 0;
    return buf;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* "1st", "2nd", "3rd", "4th" ... */
static const char *ordinal(int i) {
    if (i % 100 >= 11 && i % 100 <= 13) return "th";
    return i % 10 == 1 ? "st" : i % 10 == 2 ? "nd" : i % 10 == 3 ? "rd" : "th";
}

int rp_cli_read_ids(const char *flag, const char *arg, int vocab, int32_t **ids_out, int *n_out, const char *cmd) {
    char *owned = NULL;
    const char *text = arg;
    if (arg[0] == '@') {
        if (!(owned = read_file(arg + 1)))
            return rp_cli_usage_error(cmd, "%s %s: cannot read '%s': %s", flag, arg, arg + 1, strerror(errno));
        text = owned;
    }
    int cap = 64, n = 0, rc = RP_EXIT_USAGE;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) {
        free(owned);
        return rp_cli_runtime_error(cmd, "out of memory reading %s", flag);
    }
    const char *p = text;
    while (is_space(*p)) p++;
    while (*p) {
        /* an id: digits only (no sign, no hex) */
        const char *start = p;
        long v = 0;
        while (*p >= '0' && *p <= '9' && v <= 0x7fffffff) v = v * 10 + (*p++ - '0');
        while (*p >= '0' && *p <= '9') p++, v = 0x80000000L; /* too large for any vocabulary */
        if (p == start) {
            if (*p == ',' && n)
                rp_cli_usage_error(cmd, "%s: an empty id after the %d%s (two commas in a row)", flag, n, ordinal(n));
            else if (*p == ',')
                rp_cli_usage_error(cmd, "%s: an empty id before the first comma", flag);
            else
                rp_cli_usage_error(cmd, "%s: '%.*s' is not a token id (the %d%s)", flag, (int)strcspn(p, ", \t\r\n"),
                                   p, n + 1, ordinal(n + 1));
            goto out;
        }
        if (*p && *p != ',' && !is_space(*p)) {
            rp_cli_usage_error(cmd, "%s: '%.*s' is not a token id (the %d%s)", flag,
                               (int)(strcspn(start, ", \t\r\n")), start, n + 1, ordinal(n + 1));
            goto out;
        }
        if (v >= vocab) {
            rp_cli_usage_error(cmd, "%s: token id %.*s (the %d%s) is outside the model's vocabulary: ids go from 0 "
                                    "to %d",
                               flag, (int)strcspn(start, ", \t\r\n"), start, n + 1, ordinal(n + 1), vocab - 1);
            goto out;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!grown) {
                rc = rp_cli_runtime_error(cmd, "out of memory reading %s", flag);
                goto out;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        /* a separator: whitespace with at most one comma in it */
        while (is_space(*p)) p++;
        if (*p == ',') {
            p++;
            while (is_space(*p)) p++;
            if (!*p) {
                rp_cli_usage_error(cmd, "%s ends with a comma: an id is missing after it", flag);
                goto out;
            }
        }
    }
    if (n == 0) {
        rp_cli_usage_error(cmd, "%s %s holds no token ids", flag, arg[0] == '@' ? arg : "''");
        goto out;
    }
    *ids_out = ids;
    *n_out = n;
    ids = NULL;
    rc = 0;
out:
    free(ids);
    free(owned);
    return rc;
}
