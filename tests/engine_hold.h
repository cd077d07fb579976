/* Holding an engine mid-run, for the engine tests: a one-token request
 * whose finishing callback blocks the engine thread until released, so a
 * test can submit, abort or look at the engine while no step runs and a
 * step's results are being delivered (rp_engine_hold, by contrast, only
 * stops between steps). mu and cv also serve the tests' own signals. */
#ifndef RP_TESTS_ENGINE_HOLD_H
#define RP_TESTS_ENGINE_HOLD_H

#include <pthread.h>

#include "replay/engine.h"
#include "test_util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER; /* with mu: hold and start signals */

typedef struct hold {
    int held, released;
} hold;

static void hold_cb(void *user, const rp_token_event *ev) {
    hold *h = user;
    if (ev->finish == RP_FINISH_REASON_NONE) return;
    pthread_mutex_lock(&mu);
    h->held = 1;
    pthread_cond_broadcast(&cv);
    while (!h->released) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void hold_engine(rp_engine *e, hold *h) {
    static const int32_t one_token[1] = {1};
    rp_request_params p;
    rp_request_params_default(&p);
    p.prompt_ids = one_token;
    p.num_prompt_ids = 1;
    p.max_tokens = 1;
    *h = (hold){0, 0};
    rp_error err;
    if (rp_engine_submit(e, &p, hold_cb, h, NULL, &err)) fail_msg("submit: %s", err.message);
    pthread_mutex_lock(&mu);
    while (!h->held) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* h must live until the engine is idle again (hold_cb still touches it). */
static void release_engine(hold *h) {
    pthread_mutex_lock(&mu);
    h->released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

#endif
