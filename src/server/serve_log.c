/* The access line and the periodic engine line (serve_log.h). */
#include "server/serve_log.h"

#include <math.h>

void rp_access_log(enum rp_log_level level, const rp_access *a) {
    rp_log_field f[14];
    int n = 0;
    f[n++] = rp_log_str("id", a->id);
    f[n++] = rp_log_str("client", a->client);
    f[n++] = rp_log_str("method", a->method);
    f[n++] = rp_log_str("route", a->route);
    f[n++] = a->status ? rp_log_int("status", a->status) : rp_log_str("status", NULL);
    f[n++] = rp_log_int("prompt_tokens", a->prompt_tokens);
    f[n++] = rp_log_int("output_tokens", a->output_tokens);
    f[n++] = rp_log_double("ttft_ms", a->ttft_ms);
    f[n++] = rp_log_double("total_ms", a->total_ms);
    /* after the timings, so the line's older fields keep their places */
    f[n++] = rp_log_int("cached_tokens", a->cached_tokens);
    f[n++] = rp_log_str("request_id", a->request_id);
    if (a->end) f[n++] = rp_log_str("end", a->end);
    rp_log_fields(level, "request", f, n);
}

void rp_stats_log_init(rp_stats_log *l, double interval_s) {
    *l = (rp_stats_log){.interval_s = interval_s};
}

void rp_stats_log_tick(rp_stats_log *l, rp_engine *eng, double now_s) {
    if (l->interval_s <= 0 || (l->primed && now_s - l->last_s < l->interval_s)) return;
    rp_engine_stats st;
    rp_engine_get_stats(eng, &st);
    if (!l->primed) { /* the counters' starting point: rates need two readings */
        l->primed = 1;
        l->last = st;
        l->last_s = now_s;
        return;
    }
    double dt = now_s - l->last_s;
    uint64_t prompt = st.prompt_tokens - l->last.prompt_tokens, gen = st.generated_tokens - l->last.generated_tokens;
    uint64_t preempted = st.preemptions - l->last.preemptions;
    uint64_t queried = st.prefix_cache_queried_tokens - l->last.prefix_cache_queried_tokens;
    uint64_t hits = st.prefix_cache_hit_tokens - l->last.prefix_cache_hit_tokens;
    uint64_t rounds = st.spec_rounds - l->last.spec_rounds, drafted = st.spec_draft_tokens - l->last.spec_draft_tokens,
             accepted = st.spec_accepted_tokens - l->last.spec_accepted_tokens;
    l->last = st;
    l->last_s = now_s;
    if (!prompt && !gen && !preempted && !st.running && !st.waiting) return; /* idle: nothing to say */
    double used = st.kv_pages_total > 0 ? 100.0 * (st.kv_pages_total - st.kv_pages_free) / st.kv_pages_total : NAN;
    const rp_log_field f[] = {
        rp_log_double("prompt_tokens_per_s", (double)prompt / dt),
        rp_log_double("generation_tokens_per_s", (double)gen / dt),
        rp_log_int("running", st.running),
        rp_log_int("waiting", st.waiting),
        rp_log_double("kv_cache_used_pct", used),
        rp_log_double("prefix_cache_hit_pct", queried ? 100.0 * (double)hits / (double)queried : NAN),
        rp_log_int("preemptions", (long long)preempted),
        /* speculative decoding, the last two: only once a round has run (null in a window without one) */
        rp_log_double("spec_acceptance_pct", drafted ? 100.0 * (double)accepted / (double)drafted : NAN),
        rp_log_double("spec_mean_accepted_len", rounds ? 1.0 + (double)accepted / (double)rounds : NAN),
    };
    rp_log_fields(RP_LOG_INFO, "engine", f, (int)(sizeof f / sizeof f[0]) - (st.spec_rounds ? 0 : 2));
}
