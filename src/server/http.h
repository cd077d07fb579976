/* The HTTP server (libmicrohttpd): OpenAI-compatible endpoints over the
 * engine API. HTTP threads only parse, submit to the engine and wait for
 * its events; the engine runs on its own thread. */
#ifndef RP_SERVER_HTTP_H
#define RP_SERVER_HTTP_H

#include <stdint.h>

#include "replay/engine.h"

typedef struct rp_server rp_server;

typedef struct rp_server_config {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0: any free port (rp_server_port says which) */
    const char *served_model;  /* the name clients use */
    const char *api_key;       /* NULL: no authentication */
    size_t max_body_bytes;     /* default 8 MiB */
} rp_server_config;

rp_server *rp_server_start(rp_engine *engine, const rp_server_config *cfg, char *err, size_t err_len);
/* The port it listens on. */
int rp_server_port(const rp_server *s);
/* Stops accepting, answers new requests on open connections with 503,
 * aborts running requests (streams end with an error event and [DONE]),
 * joins the HTTP threads and frees s. Destroy the engine after this. */
void rp_server_stop(rp_server *s);

#endif
