/* A one-line progress bar on stderr, drawn only when stderr is a terminal
 * (so logs and CI output stay clean). */
#ifndef RP_UTIL_PROGRESS_H
#define RP_UTIL_PROGRESS_H

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

#endif
