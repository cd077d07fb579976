/* Progress on stderr, in two forms.
 *
 * rp_progress: a bar for work the calling thread does in a loop (loading
 * weights), drawn only when stderr is a terminal, so logs and CI output stay
 * clean.
 *
 * rp_progress_status: a status line for long work whose counters other
 * threads advance (the engine thread, request threads), drawn by a thread of
 * its own so it shows even while one step takes a minute: "done / total
 * units, tokens/s so far, elapsed". On a terminal it is one line redrawn in
 * place; otherwise (CI, nohup, a pipe) an info log line every interval_s
 * seconds, so a log shows the run is alive. Off with --quiet. */
#ifndef RP_UTIL_PROGRESS_H
#define RP_UTIL_PROGRESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct rp_progress {
    const char *label;
    uint64_t total;
    uint64_t done;
    double last_draw_s;
    double start_s;
    int enabled;
} rp_progress;

void rp_progress_begin(rp_progress *p, const char *label, uint64_t total);
void rp_progress_add(rp_progress *p, uint64_t n);
void rp_progress_end(rp_progress *p);

typedef struct rp_progress_status {
    const char *label, *unit;
    uint64_t total;
    _Atomic uint64_t done, tokens;
    double start_s, interval_s;
    int tty;     /* redrawn in place, else a log line every interval_s */
    int running; /* the drawing thread was started */
    int stop;    /* under mu: the thread ends */
    int drawn;   /* under mu: a terminal line is on screen */
    char phase[96]; /* under mu: what runs now, shown after the counts */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} rp_progress_status;

/* Starts the line for total units (label "bench offline", unit "requests").
 * interval_s: seconds between log lines when stderr is not a terminal; 0
 * draws nothing there. Nothing is drawn below the info log level. */
void rp_progress_status_start(rp_progress_status *s, const char *label, const char *unit, uint64_t total,
                              double interval_s);
/* Any thread: done more units, tokens more tokens (for tokens/s). */
void rp_progress_status_add(rp_progress_status *s, uint64_t done, uint64_t tokens);
/* What runs now ("batch 8, prefill"), shown after the counts. */
void rp_progress_status_phase(rp_progress_status *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Around output of the caller's own on a terminal (a result row): lock
 * clears the line and holds it off; unlock lets it be drawn again. */
void rp_progress_status_lock(rp_progress_status *s);
void rp_progress_status_unlock(rp_progress_status *s);
/* Stops the thread and leaves the terminal line complete (with a newline). */
void rp_progress_status_stop(rp_progress_status *s);

#endif
