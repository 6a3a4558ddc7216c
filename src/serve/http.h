// The HTTP front-end of hylo serve (libmicrohttpd, a thread per
// connection): routes the OpenAI endpoints and hylo's own (/health,
// /metrics, /tokenize, /detokenize), checks the API key, turns a request
// into an engine submission and streams what comes back (server-sent events
// from a content-reader callback that waits on the request's queue). A
// client that goes away cancels its request.
#pragma once
#include "serve/engine.h"
#include "serve/metrics.h"
#include "tok/tok.h"

typedef struct {
    const char *host;       // address to listen on ("127.0.0.1", "::", "0.0.0.0", a name)
    int port;               // 0: a free one (srv_http_port says which)
    const char *api_key;    // NULL or "": no key needed
    const char *model_name; // what /v1/models and the responses call the model
    int ctx;                // the engine's context (prompt + answer)
    int max_conns;          // connections open at once
} srv_http_cfg_t;

typedef struct srv_http srv_http_t;

// Listens and serves until srv_http_stop. tok, e and m must outlive it.
int srv_http_start(srv_http_t **h, const srv_http_cfg_t *cfg, srv_engine_t *e, const tok_t *tok, srv_metrics_t *m);
int srv_http_port(const srv_http_t *h);
// Stops accepting new connections (the open ones go on).
void srv_http_quiesce(srv_http_t *h);
// Closes every connection, joins their threads and frees h (cancel the
// engine's work first, so that no handler waits for tokens).
void srv_http_stop(srv_http_t *h);
