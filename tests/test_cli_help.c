/* Every command's --help against the option table its parser uses: every
 * option printed is accepted, every accepted option is printed, each has a
 * description, and each that takes a value says its default (or that it is
 * required). The layout is checked too: "Usage: replay NAME" first, no two
 * blank lines in a row, no trailing blank line. */
#include "test_util.h"

#include "cli/cli.h"

typedef struct help_text {
    char *text;
    size_t len;
} help_text;

static help_text capture(const rp_cli_command *c) {
    help_text h = {0};
    FILE *f = open_memstream(&h.text, &h.len);
    assert_non_null(f);
    c->help(f);
    fclose(f);
    return h;
}

/* Whether "--name" occurs in s as a whole option name. */
static int mentions(const char *s, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = strstr(s, "--"); p; p = strstr(p + 2, "--")) {
        if (strncmp(p + 2, name, n)) continue;
        const char c = p[2 + n];
        if (!(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '-') return 1;
    }
    return 0;
}

static const struct option *find_option(const rp_cli_command *c, const char *name, size_t n) {
    for (const struct option *o = c->options; o->name; o++)
        if (strlen(o->name) == n && !strncmp(o->name, name, n)) return o;
    return NULL;
}

/* An option line: two spaces, then '-'. Its signature runs to the first two
 * spaces after the first option name; the description follows on the same
 * line or on the lines indented below it. */
static int is_option_line(const char *line) { return !strncmp(line, "  -", 3); }

/* 0 if c's help is right, else -1 with the reason in why. */
#define BAD(...)                                \
    do {                                        \
        snprintf(why, why_len, __VA_ARGS__);    \
        rc = -1;                                \
        goto out;                               \
    } while (0)
static int check_command(const rp_cli_command *c, char *why, size_t why_len) {
    int rc = 0;
    char *copy = NULL;
    help_text h = capture(c);
    char *text = h.text;
    char usage[96];
    snprintf(usage, sizeof usage, "Usage: replay %s", c->name);
    if (strncmp(text, usage, strlen(usage))) BAD("%s: help does not start with '%s'", c->name, usage);
    if (strstr(text, "\n\n\n")) BAD("%s: two blank lines in a row", c->name);
    if (h.len < 2 || text[h.len - 1] != '\n' || text[h.len - 2] == '\n')
        BAD("%s: help must end with one newline", c->name);

    /* every accepted option is printed */
    for (const struct option *o = c->options; o->name; o++)
        if (!mentions(text, o->name)) BAD("%s: accepts --%s but --help does not mention it", c->name, o->name);

    /* every printed option is accepted, described, and says its default */
    char *save = NULL;
    copy = strdup(text);
    char *lines[512];
    int nl = 0;
    for (char *l = strtok_r(copy, "\n", &save); l && nl < 512; l = strtok_r(NULL, "\n", &save)) lines[nl++] = l;
    for (int i = 0; i < nl; i++) {
        const char *line = lines[i];
        if (!is_option_line(line)) continue;
        const char *sig_end = strstr(line + 2, "  ");
        const char *desc = sig_end ? sig_end + strspn(sig_end, " ") : "";
        char block[1024];
        snprintf(block, sizeof block, "%s", desc);
        /* continuation lines: deeper indentation, not an option */
        for (int j = i + 1; j < nl && !strncmp(lines[j], "     ", 5) && !is_option_line(lines[j]); j++) {
            size_t used = strlen(block);
            snprintf(block + used, sizeof block - used, " %s", lines[j] + strspn(lines[j], " "));
        }
        const char *end = sig_end ? sig_end : line + strlen(line);
        int took_value = 0;
        for (const char *p = line + 2; p < end; p++) {
            if (strncmp(p, "--", 2)) continue;
            const char *name = p + 2;
            size_t n = strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-");
            const struct option *o = find_option(c, name, n);
            if (!o) BAD("%s: --help prints --%.*s, which the command does not accept", c->name, (int)n, name);
            if (o->has_arg == required_argument) took_value = 1;
            p = name + n - 1;
        }
        if (!block[0]) BAD("%s: '%s' has no description", c->name, line);
        if (took_value && !strstr(block, "default") && !strstr(block, "required"))
            BAD("%s: '%s' does not say its default", c->name, line);
    }
out:
    free(copy);
    free(text);
    return rc;
}

static void test_every_command(void **state) {
    (void)state;
    int n = 0;
    for (const rp_cli_command *const *c = rp_cli_commands; *c; c++, n++) {
        assert_non_null((*c)->summary);
        assert_non_null((*c)->options);
        char why[512];
        if (check_command(*c, why, sizeof why)) fail_msg("%s", why);
    }
    assert_true(n >= 10);
}

/* The checker itself must catch what it is for. */
static const struct option fake_options[] = {{"alpha", required_argument, 0, 'a'}, {0, 0, 0, 0}};
static void fake_help_missing(FILE *f) { fprintf(f, "Usage: replay fake\n\n  -h, --help   show help\n"); }
static void fake_help_no_default(FILE *f) { fprintf(f, "Usage: replay fake\n\n  --alpha N    the alpha\n"); }
static void fake_help_ok(FILE *f) { fprintf(f, "Usage: replay fake\n\n  --alpha N    the alpha (default 3)\n"); }
static int fake_run(int argc, char **argv) {
    (void)argc, (void)argv;
    return 0;
}

static void test_checker_catches(void **state) {
    (void)state;
    const rp_cli_command ok = {"fake", "a fake", fake_options, fake_help_ok, fake_run};
    char why[512];
    assert_int_equal(check_command(&ok, why, sizeof why), 0);
    const rp_cli_command missing = {"fake", "a fake", fake_options, fake_help_missing, fake_run};
    assert_int_equal(check_command(&missing, why, sizeof why), -1);
    assert_non_null(strstr(why, "accepts --alpha"));
    const rp_cli_command no_default = {"fake", "a fake", fake_options, fake_help_no_default, fake_run};
    assert_int_equal(check_command(&no_default, why, sizeof why), -1);
    assert_non_null(strstr(why, "default"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_catches),
        cmocka_unit_test(test_every_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
