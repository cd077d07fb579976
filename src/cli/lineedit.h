/* The chat's input, a line at a time from standard input: with libedit's
 * line editing and history when stdin and stdout are terminals, read plainly
 * otherwise (pipes, files, the tests). Either way a SIGINT or SIGTERM caught
 * by interrupt.h ends the wait, and the caller learns whether it dropped a
 * half-typed line, so that Ctrl-C can mean "clear the line" or "quit". */
#ifndef RP_CLI_LINEEDIT_H
#define RP_CLI_LINEEDIT_H

typedef struct rp_lineedit rp_lineedit;

typedef enum rp_line_status {
    RP_LINE_OK,          /* a line, without its end of line */
    RP_LINE_EOF,         /* end of input (Ctrl-D on an empty line) */
    RP_LINE_INTERRUPTED, /* a signal came first */
    RP_LINE_ERROR,       /* reading failed or memory ran out: errno says which */
} rp_line_status;

/* prompt is shown before each line when editing (it must outlive le).
 * NULL when memory runs out. */
rp_lineedit *rp_lineedit_new(const char *prog, const char *prompt);
void rp_lineedit_free(rp_lineedit *le);
/* Whether lines are edited on a terminal (and prompts shown). */
int rp_lineedit_is_tty(const rp_lineedit *le);
/* The next line; *line stays valid until the next call. On
 * RP_LINE_INTERRUPTED, *sig is the signal and *discarded is 1 when text typed
 * on the line was thrown away. */
rp_line_status rp_lineedit_read(rp_lineedit *le, char **line, int *sig, int *discarded);

#endif
