/* Progress bar and status line rendering, rate-limited so they cost nothing
 * in tight loops. */
#include "util/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

static void draw(rp_progress *p) {
    const int width = 30;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1.0) frac = 1.0;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r%s [%s] %3d%% %.1fs", p->label, bar, (int)(frac * 100),
            rp_now_s() - p->start_s);
    fflush(stderr);
}

void rp_progress_begin(rp_progress *p, const char *label, uint64_t total) {
    p->label = label;
    p->total = total;
    p->done = 0;
    p->start_s = rp_now_s();
    p->last_draw_s = 0;
    p->enabled = isatty(STDERR_FILENO) && rp_log_get_level() >= RP_LOG_INFO;
    if (p->enabled) draw(p);
}

void rp_progress_add(rp_progress *p, uint64_t n) {
    p->done += n;
    if (!p->enabled) return;
    double now = rp_now_s();
    if (now - p->last_draw_s < 0.1 && p->done < p->total) return;
    p->last_draw_s = now;
    draw(p);
}

void rp_progress_end(rp_progress *p) {
    if (!p->enabled) return;
    p->done = p->total;
    draw(p);
    fputc('\n', stderr);
}

/* ---- the status line ------------------------------------------------------------------- */

/* A terminal line is redrawn this often; often enough to look live, rarely
 * enough to cost nothing. */
#define TTY_REDRAW_S 0.25

/* "42s", "3m05s", "2h01m". */
static void format_elapsed(double s, char *buf, size_t n) {
    long t = (long)s;
    if (t < 60) snprintf(buf, n, "%lds", t);
    else if (t < 3600) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
}

/* "bench offline: 40/200 requests, 1234.5 tok/s, 35s elapsed (batch 8)"; under mu. */
static void status_text(rp_progress_status *s, char *buf, size_t n) {
    const double elapsed = rp_now_s() - s->start_s;
    const uint64_t done = atomic_load(&s->done), tokens = atomic_load(&s->tokens);
    char el[32];
    format_elapsed(elapsed, el, sizeof el);
    snprintf(buf, n, "%s: %llu/%llu %s, %.1f tok/s, %s elapsed%s%s%s", s->label, (unsigned long long)done,
             (unsigned long long)s->total, s->unit, elapsed > 0 ? (double)tokens / elapsed : 0.0, el,
             s->phase[0] ? " (" : "", s->phase, s->phase[0] ? ")" : "");
}

/* Under mu. */
static void status_draw(rp_progress_status *s) {
    char line[256];
    status_text(s, line, sizeof line);
    if (s->tty) {
        fprintf(stderr, "\r\033[K%s", line);
        fflush(stderr);
        s->drawn = 1;
    } else {
        rp_log_info("%s", line);
    }
}

static void *status_thread(void *arg) {
    rp_progress_status *s = arg;
    const double period = s->tty ? TTY_REDRAW_S : s->interval_s;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const long long ns = (long long)ts.tv_nsec + (long long)(period * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        /* 0 is a signal or a spurious wake-up: wait on; a timeout (or any
         * error, which must not spin here) draws */
        int rc = 0;
        while (!s->stop && rc == 0) rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (!s->stop) status_draw(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void rp_progress_status_start(rp_progress_status *s, const char *label, const char *unit, uint64_t total,
                              double interval_s) {
    s->label = label;
    s->unit = unit;
    s->total = total;
    atomic_store(&s->done, 0);
    atomic_store(&s->tokens, 0);
    s->start_s = rp_now_s();
    s->interval_s = interval_s;
    s->tty = isatty(STDERR_FILENO);
    s->stop = 0;
    s->drawn = 0;
    s->phase[0] = 0;
    s->running = 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (rp_log_get_level() < RP_LOG_INFO || (!s->tty && !(interval_s > 0))) return;
    /* a line that cannot be drawn is no reason to stop the work it reports on */
    s->running = pthread_create(&s->thread, NULL, status_thread, s) == 0;
}

void rp_progress_status_add(rp_progress_status *s, uint64_t done, uint64_t tokens) {
    if (done) atomic_fetch_add(&s->done, done);
    if (tokens) atomic_fetch_add(&s->tokens, tokens);
}

void rp_progress_status_phase(rp_progress_status *s, const char *fmt, ...) {
    pthread_mutex_lock(&s->mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->phase, sizeof s->phase, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&s->mu);
}

void rp_progress_status_lock(rp_progress_status *s) {
    pthread_mutex_lock(&s->mu);
    if (s->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        s->drawn = 0;
    }
}

void rp_progress_status_unlock(rp_progress_status *s) { pthread_mutex_unlock(&s->mu); }

void rp_progress_status_stop(rp_progress_status *s) {
    if (!s->label) return; /* never started */
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->running) pthread_join(s->thread, NULL);
    if (s->running && s->tty) { /* the final counts stay on screen */
        status_draw(s);
        fputc('\n', stderr);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    s->label = NULL;
    s->running = 0;
}
