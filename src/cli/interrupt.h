/* SIGINT and SIGTERM for the commands that stream to a person (generate,
 * chat): the handlers only record the signal and write a byte to a pipe; the
 * main thread polls that pipe, aborts the request in flight, restores the
 * terminal and decides what the signal means there.
 *
 * Installed once the model has loaded: until then the default action ends
 * the process at once (exit status 130 / 143 as the shell reports it), so
 * Ctrl-C and SIGTERM work during minutes of loading without any code of
 * ours running. */
#ifndef RP_CLI_INTERRUPT_H
#define RP_CLI_INTERRUPT_H

#include <stdatomic.h>
#include <stddef.h>

/* Installs the handlers (no SA_RESTART: a blocking read returns EINTR).
 * 0, or -1 with errno when the pipe could not be made. */
int rp_interrupt_install(void);
/* Restores the default actions and closes the pipe. */
void rp_interrupt_uninstall(void);
/* The pipe's read end, for poll(); readable after a signal or a wake. */
int rp_interrupt_fd(void);
/* The signal caught since the last call (SIGTERM when both came), or 0;
 * empties the pipe. */
int rp_interrupt_take(void);
/* From any thread: makes the pipe readable without a signal, so a poller
 * notices that something it waits for (a finished request) happened. */
void rp_interrupt_wake(void);
/* Waits until *done is set (by a thread that then calls rp_interrupt_wake)
 * or a signal comes: the signal, or 0 once *done is set. */
int rp_interrupt_wait(atomic_int *done);
/* The exit status of a command ended by sig: 130 for SIGINT, 143 for SIGTERM. */
int rp_interrupt_exit_code(int sig);
/* Writes all of buf to fd with write(2), retried on EINTR. Streamed output
 * goes through this, not stdio: without SA_RESTART a signal landing inside
 * stdio's write (on the engine thread, say) loses the buffered bytes. A
 * closed pipe ends the write quietly: nobody is left to tell. */
void rp_write_all(int fd, const char *buf, size_t n);

#endif
