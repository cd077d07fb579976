/* Progress bar rendering, rate-limited so it costs nothing in tight loops. */
#include "util/progress.h"

#include <stdio.h>
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
