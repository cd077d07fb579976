/* A request's memory (request.h): everything it owns is freed here. */
#include "sched/request.h"

#include <stdlib.h>

#include "engine/ngram.h"
#include "structured/structured.h"

void rp_request_free(rp_request *r) {
    if (!r) return;
    if (r->has_detok) rp_detok_free(&r->detok);
    rp_ngram_free(r->ngram);
    rp_smatcher_free(r->matcher);
    for (int i = 0; i < r->num_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->tokens);
    free(r->held);
    free(r->bias_ids);
    free(r->bias);
    free(r->prompt_lp);
    free(r);
}
