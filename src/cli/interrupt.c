/* Signal handling of the interactive commands (interrupt.h). The handler
 * may run on any thread (the engine's included): it touches only lock-free
 * atomics and write(2), both async-signal-safe, and keeps errno. */
#include "cli/interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* exchanged, not read then cleared: a signal between the two is never lost */
static atomic_int got_sigint, got_sigterm;
static int pipe_fds[2] = {-1, -1};

static void on_signal(int sig) {
    const int saved = errno;
    atomic_store(sig == SIGTERM ? &got_sigterm : &got_sigint, 1);
    const char b = 1;
    if (write(pipe_fds[1], &b, 1) < 0) {
        /* a full pipe already wakes the poller */
    }
    errno = saved;
}

int rp_interrupt_install(void) {
    if (pipe_fds[0] >= 0) return 0;
    /* both ends non-blocking: the handler never blocks on a full pipe, and
     * take() empties it without knowing how many bytes wait */
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK)) return -1;
    atomic_store(&got_sigint, 0);
    atomic_store(&got_sigterm, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return 0;
}

void rp_interrupt_uninstall(void) {
    if (pipe_fds[0] < 0) return;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    pipe_fds[0] = pipe_fds[1] = -1;
}

int rp_interrupt_fd(void) { return pipe_fds[0]; }

int rp_interrupt_take(void) {
    char buf[64];
    while (pipe_fds[0] >= 0 && read(pipe_fds[0], buf, sizeof buf) > 0) {
    }
    const int term = atomic_exchange(&got_sigterm, 0), intr = atomic_exchange(&got_sigint, 0);
    return term ? SIGTERM : intr ? SIGINT : 0;
}

void rp_interrupt_wake(void) {
    const char b = 0;
    if (pipe_fds[1] >= 0 && write(pipe_fds[1], &b, 1) < 0) {
        /* full: the poller wakes anyway */
    }
}

int rp_interrupt_wait(atomic_int *done) {
    while (!atomic_load(done)) {
        struct pollfd p = {.fd = pipe_fds[0], .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) return 0; /* cannot happen with a valid fd */
        const int sig = rp_interrupt_take();
        if (sig) return sig;
    }
    return 0;
}

int rp_interrupt_exit_code(int sig) { return sig == SIGTERM ? RP_EXIT_SIGTERM : RP_EXIT_SIGINT; }

void rp_write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        const ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        buf += w, n -= (size_t)w;
    }
}
