// The OpenAI API's JSON: requests of /v1/chat/completions and /v1/completions
// (and hylo's /tokenize, /detokenize) read into prompt token ids and
// generation parameters, and the response objects, stream chunks and error
// bodies written back. No I/O here: the HTTP layer (serve/http.c) moves the
// bytes, the engine (serve/engine.c) generates.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "infer/sampler.h"
#include "tok/tok.h"

typedef enum { SRV_CHAT = 0, SRV_COMPLETION = 1 } srv_kind_t;

// An error for the client: HTTP status and the body's fields.
typedef struct {
    int status;     // 400, 500, ...
    char type[32];  // "invalid_request_error", "server_error"
    char param[48]; // the offending parameter ("" = null)
    char code[48];  // a machine-readable code ("" = null)
    char msg[480];
} srv_oai_err_t;

enum { SRV_MAX_STOP = 4 };    // stop strings per request, as OpenAI's limit
enum { SRV_MAX_BIAS = 1024 }; // logit_bias entries per request

typedef struct {
    srv_kind_t kind;
    int stream, include_usage;
    int max_tokens; // new tokens at most (filled in: the context's rest when not given)
    sampler_cfg_t sampler;
    int seeded; // "seed" was given (else the caller picks one)
    char *stop[SRV_MAX_STOP];
    int n_stop;
    int32_t *ids; // the prompt's tokens (chat: rendered with the template)
    int n_ids;
    int logprobs, top_logprobs; // each token's log-probability asked for, with this many alternatives
    int32_t *bias_id;           // logit_bias: n_bias token ids and their biases (sampler.bias_id / bias
    float *bias;                // point at them)
    int n_bias;
} srv_oai_req_t;

// Log-probabilities of n generated tokens for a response or a chunk: ids[i]
// and lp[i]; a completion's text offsets count from text_offset (the bytes of
// the tokens before these).
typedef struct {
    const int32_t *ids;
    const sampler_logprob_t *lp;
    int n;
    size_t text_offset;
} srv_oai_lps_t;

// Reads a request body of kind `kind` and encodes its prompt. ctx: the most
// tokens of prompt + answer. 0, or -1 with *e filled (400 for what the client
// sent, 500 / 503 for the server's failures).
int srv_oai_parse(const tok_t *tok, srv_kind_t kind, const char *body, size_t n, int ctx, srv_oai_req_t *r,
                  srv_oai_err_t *e);
void srv_oai_req_free(srv_oai_req_t *r);

// Sets *e and returns -1 (for the callers' one-line returns).
int srv_oai_err(srv_oai_err_t *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

// The JSON texts (malloc'ed; NULL when out of memory). finish: "stop" |
// "length" | NULL (a chunk before the last). lps: the tokens'
// log-probabilities (their texts through tok), or NULL ("logprobs": null).
char *srv_oai_error_json(const srv_oai_err_t *e);
char *srv_oai_response_json(srv_kind_t kind, const char *id, long long created, const char *model, const char *text,
                            const char *finish, int n_prompt, int n_new, const tok_t *tok, const srv_oai_lps_t *lps);
// A stream chunk: role (chat's first chunk: "assistant"), text, finish each NULL when absent.
char *srv_oai_chunk_json(srv_kind_t kind, const char *id, long long created, const char *model, const char *role,
                         const char *text, const char *finish, const tok_t *tok, const srv_oai_lps_t *lps);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
char *srv_oai_usage_chunk_json(srv_kind_t kind, const char *id, long long created, const char *model, int n_prompt,
                               int n_new);
char *srv_oai_models_json(const char *model, long long created, int ctx);

// POST /tokenize: {"prompt": TEXT} (encoded as a completion's prompt) or
// {"messages": [...], "add_generation_prompt": true} (as a chat's) ->
// {"tokens": [...], "count": N, "max_model_len": ctx}. POST /detokenize:
// {"tokens": [...]} -> {"prompt": TEXT}. The JSON text, or NULL with *e set.
char *srv_oai_tokenize(const tok_t *tok, const char *body, size_t n, int ctx, srv_oai_err_t *e);
char *srv_oai_detokenize(const tok_t *tok, const char *body, size_t n, srv_oai_err_t *e);
