/* Line input for the chat (lineedit.h). On a terminal, libedit edits the
 * line (emacs keys, ~/.editrc) and keeps an in-memory history; its reads go
 * through getc_fn, which polls stdin and the signal pipe together, so Ctrl-C
 * reaches us while libedit waits for a key. libedit's own signal handling is
 * off: ours must see the signal, and its handler re-sends it to the whole
 * process group. Off a terminal, lines are read from fd 0 with the same
 * poll. */
#include "cli/lineedit.h"

#include <errno.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#include "cli/interrupt.h"

#define HISTORY_LINES 1000

struct rp_lineedit {
    const char *prompt;
    EditLine *el; /* NULL: plain reading */
    History *hist;
    mbstate_t mbs; /* UTF-8 bytes to wide characters for libedit */
    int sig, discarded;
    /* plain reading: bytes read, [start, len) not yet returned */
    char *buf;
    size_t start, len, cap;
    int eof;
    char *edited; /* the last line from libedit, without its newline */
};

/* Waits until stdin can be read or a signal came. 1: readable, 0: a signal
 * (le->sig set), -1: poll failed. */
static int wait_input(rp_lineedit *le) {
    for (;;) {
        struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = rp_interrupt_fd(), .events = POLLIN}};
        const int n = poll(p, p[1].fd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno == EINTR) continue; /* the pipe says which signal */
        if (n < 0) return -1;
        if (p[1].fd >= 0 && (p[1].revents & POLLIN)) {
            le->sig = rp_interrupt_take();
            if (le->sig) return 0;
        }
        if (p[0].revents) return 1; /* data, end of file or an error: read() tells */
    }
}

static const char *prompt_fn(EditLine *el) {
    rp_lineedit *le = NULL;
    el_get(el, EL_CLIENTDATA, &le);
    return le->prompt;
}

/* libedit's character source: 1 and *wc, 0 at end of file, -1 on an error
 * or a signal (the line typed so far is noted as discarded). */
static int getc_fn(EditLine *el, wchar_t *wc) {
    rp_lineedit *le = NULL;
    el_get(el, EL_CLIENTDATA, &le);
    for (;;) {
        const int w = wait_input(le);
        if (w == 0) {
            const LineInfoW *li = el_wline(el);
            le->discarded = li && li->lastchar > li->buffer;
            errno = EINTR;
            return -1;
        }
        if (w < 0) return -1;
        char c;
        const ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return (int)n;
        const size_t k = mbrtowc(wc, &c, 1, &le->mbs);
        if (k == (size_t)-2) continue; /* the middle of a character */
        if (k == (size_t)-1) {         /* not UTF-8: skip the byte */
            memset(&le->mbs, 0, sizeof le->mbs);
            continue;
        }
        return 1;
    }
}

rp_lineedit *rp_lineedit_new(const char *prog, const char *prompt) {
    rp_lineedit *le = calloc(1, sizeof *le);
    if (!le) return NULL;
    le->prompt = prompt;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return le;
    /* libedit edits wide characters: typed UTF-8 needs a UTF-8 LC_CTYPE,
     * and a bare "C" environment (containers) gets C.UTF-8 */
    if (!setlocale(LC_CTYPE, "") || strcmp(nl_langinfo(CODESET), "UTF-8")) setlocale(LC_CTYPE, "C.UTF-8");
    le->el = el_init(prog, stdin, stdout, stderr);
    le->hist = history_init();
    if (!le->el || !le->hist) {
        rp_lineedit_free(le);
        return NULL;
    }
    HistEvent ev;
    history(le->hist, &ev, H_SETSIZE, HISTORY_LINES);
    history(le->hist, &ev, H_SETUNIQUE, 1);
    el_set(le->el, EL_CLIENTDATA, le);
    el_set(le->el, EL_EDITOR, "emacs");
    el_set(le->el, EL_SIGNAL, 0);
    el_set(le->el, EL_PROMPT, prompt_fn);
    el_set(le->el, EL_HIST, history, le->hist);
    el_set(le->el, EL_GETCFN, getc_fn);
    el_source(le->el, NULL); /* the user's ~/.editrc, as other libedit programs */
    return le;
}

void rp_lineedit_free(rp_lineedit *le) {
    if (!le) return;
    if (le->el) el_end(le->el); /* restores the terminal */
    if (le->hist) history_end(le->hist);
    free(le->edited);
    free(le->buf);
    free(le);
}

int rp_lineedit_is_tty(const rp_lineedit *le) { return le->el != NULL; }

static rp_line_status read_edited(rp_lineedit *le, char **line) {
    int count = 0;
    memset(&le->mbs, 0, sizeof le->mbs);
    fflush(stdout);
    const char *s = el_gets(le->el, &count);
    if (le->sig) return RP_LINE_INTERRUPTED; /* whatever el_gets kept of the line is dropped */
    if (!s || count <= 0) return count < 0 ? RP_LINE_ERROR : RP_LINE_EOF;
    free(le->edited);
    if (!(le->edited = strdup(s))) return RP_LINE_ERROR;
    size_t n = strlen(le->edited);
    while (n > 0 && (le->edited[n - 1] == '\n' || le->edited[n - 1] == '\r')) le->edited[--n] = 0;
    if (n > 0) {
        HistEvent ev;
        history(le->hist, &ev, H_ENTER, le->edited);
    }
    *line = le->edited;
    return RP_LINE_OK;
}

static rp_line_status read_plain(rp_lineedit *le, char **line) {
    for (;;) {
        char *nl = le->len > le->start ? memchr(le->buf + le->start, '\n', le->len - le->start) : NULL;
        if (nl || (le->eof && le->len > le->start)) {
            char *s = le->buf + le->start;
            size_t n;
            if (nl) {
                *nl = 0;
                n = (size_t)(nl - s);
                le->start = (size_t)(nl - le->buf) + 1;
            } else { /* the last line has no newline: buf has room for the 0 (see below) */
                n = le->len - le->start;
                s[n] = 0;
                le->start = le->len;
            }
            if (n > 0 && s[n - 1] == '\r') s[n - 1] = 0;
            *line = s;
            return RP_LINE_OK;
        }
        if (le->eof) return RP_LINE_EOF;
        if (le->start > 0) { /* what was returned is no longer needed */
            memmove(le->buf, le->buf + le->start, le->len - le->start);
            le->len -= le->start;
            le->start = 0;
        }
        if (le->cap - le->len < 4096 + 1) { /* +1: a last line's terminating 0 */
            const size_t cap = le->cap ? le->cap * 2 : 65536;
            char *b = realloc(le->buf, cap);
            if (!b) return RP_LINE_ERROR;
            le->buf = b;
            le->cap = cap;
        }
        const int w = wait_input(le);
        if (w == 0) return RP_LINE_INTERRUPTED;
        if (w < 0) return RP_LINE_ERROR;
        const ssize_t n = read(STDIN_FILENO, le->buf + le->len, le->cap - le->len - 1);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return RP_LINE_ERROR;
        if (n == 0) le->eof = 1;
        le->len += (size_t)n;
    }
}

rp_line_status rp_lineedit_read(rp_lineedit *le, char **line, int *sig, int *discarded) {
    le->sig = le->discarded = 0;
    const rp_line_status st = le->el ? read_edited(le, line) : read_plain(le, line);
    *sig = le->sig;
    *discarded = le->discarded;
    return st;
}
