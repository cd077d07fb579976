/* A generation request's life, from a parsed request to the last byte of
 * its answer: the choices it submits to the engine, the engine callback
 * that turns their events into text or Server-Sent Events, parking the HTTP
 * side until there is something to send (it never blocks a thread), the
 * watcher that notices a client hang-up or a server shutdown and aborts
 * every choice, and the stream a response reader drains. No HTTP library
 * here: http.c hands in the client's socket and a waker (suspend and resume
 * its connection) and sends what comes out.
 *
 * rp_sessions is what the sessions of one server share: the engine, and
 * the gate that lets shutdown wait until no HTTP thread uses it. */
#ifndef RP_SERVER_SESSION_H
#define RP_SERVER_SESSION_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "replay/engine.h"
#include "server/metrics.h"
#include "server/openai.h"

typedef struct rp_sessions {
    rp_engine *eng;
    rp_metrics *metrics;
    const struct rp_tokenizer *tok;
    int max_context;
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int stopping;     /* under mu; read without it only as a hint */
    int active;       /* HTTP requests and sessions that may still touch the engine, under mu */
    uint64_t next_id; /* under mu */
    int max_queued_requests;  /* <= 0: no limit */
    int pending_choices;      /* submitted or about to be, not finished; under mu */
    struct rp_session *head;  /* live sessions, for the watcher; under mu */
} rp_sessions;

void rp_sessions_init(rp_sessions *h, rp_engine *eng, rp_metrics *metrics);
void rp_sessions_destroy(rp_sessions *h);
/* Work that may touch the engine starts with enter (-1: refused, the server
 * is stopping) and ends with leave. A session holds one of its own. */
int rp_sessions_enter(rp_sessions *h);
void rp_sessions_leave(rp_sessions *h);
/* From now on enter refuses; running sessions abort themselves within a
 * wait slice. */
void rp_sessions_stop(rp_sessions *h);
/* Waits until nothing touches the engine, at most timeout_s (< 0: no
 * limit); 0 when idle, -1 on timeout. */
int rp_sessions_wait_idle(rp_sessions *h, double timeout_s);

/* Aborts the sessions whose client hung up, whose answer ran out of memory,
 * or all of them once the server is stopping. Called every few tens of
 * milliseconds; it never blocks. */
void rp_sessions_watch(rp_sessions *h);

typedef struct rp_session rp_session;

/* How the HTTP side waits without a thread: sleep is called (under the
 * session's lock, from the HTTP side) when it finds nothing to do, wake
 * (from any thread) once there is something; one wake per sleep. */
typedef struct rp_session_waker {
    void (*sleep)(void *arg);
    void (*wake)(void *arg);
    void *arg;
} rp_session_waker;

/* The HTTP side parked (waker.sleep was called): come back after wake. */
#define RP_SESSION_PARKED (-2)

/* The session of a parsed request, for the client on socket client_fd (-1:
 * none to watch). NULL with err: 503 while stopping or when more than
 * max_queued_requests choices wait (code queue_full), 500 out of memory. */
rp_session *rp_session_new(rp_sessions *h, const rp_oai_request *q, int client_fd, const rp_session_waker *waker,
                           rp_oai_error *err);
/* Tokenizes each prompt and submits its choices (choice k*n + i: prompt
 * k, seed + i). -1 with err (the engine's rp_error mapped, or 500 out of
 * memory) when one is refused; then nothing of it runs any more. */
int rp_session_submit(rp_session *s, const rp_oai_request *q, rp_oai_error *err);
int rp_session_streaming(const rp_session *s);
/* Non-streaming, once every choice is done: 0 with *out the answer; -1
 * with err (500, or 503 when the server stopped it); 1 when the client hung
 * up (there is no one to answer); RP_SESSION_PARKED while choices run. */
int rp_session_wait(rp_session *s, json_t **out, rp_oai_error *err);
/* Streaming: copies up to max bytes of the stream. The count; 0 at the end
 * of the stream; -1 when the client hung up; RP_SESSION_PARKED when there
 * are none yet. */
long rp_session_read(rp_session *s, char *buf, size_t max);
/* The HTTP side lets go, aborting choices still running; the session is
 * freed when the engine has let go too. */
void rp_session_release(rp_session *s);
/* One more holder on the HTTP side (the access line reads the summary when
 * the request is over); each holder calls rp_session_release. */
void rp_session_hold(rp_session *s);

/* What the access line says about a generation request. */
typedef struct rp_session_summary {
    char id[96];            /* the completion id */
    int prompt_tokens;      /* over all prompts, counted once each */
    int cached_tokens;      /* of those, found in the prefix cache (usage's cached_tokens) */
    int completion_tokens;  /* over all choices */
    double first_token_s;   /* rp_now_s() at the first token of any choice; 0: none yet */
} rp_session_summary;
void rp_session_summary_get(rp_session *s, rp_session_summary *out);

#endif
