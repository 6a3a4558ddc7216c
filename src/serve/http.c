#include "serve/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "base/timer.h"
#include "serve/openai.h"
#include "serve/stop.h"

enum { BODY_MAX = 16 << 20 }; // request bodies beyond this are refused (413)

struct srv_http {
    struct MHD_Daemon *d;
    srv_engine_t *e;
    const tok_t *tok;
    srv_metrics_t *m;
    char *api_key, *model;
    int ctx, port;
    atomic_ullong seq; // request ids and default seeds
};

// ---- a generation request: what the engine thread and the HTTP thread share ----

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; // the connection, the engine until on_done, a streaming response
    srv_kind_t kind;
    int stream, include_usage;
    char id[48];
    long long created;
    uint64_t eid;
    // The engine thread's alone: the text decoder and the stop strings.
    tok_stream_t ts;
    srv_stop_t stop;
    strbuf_t scratch;
    int stop_hit;
    // Under mu: text ready to send (streaming takes it as it comes), tokens
    // generated so far, the end.
    strbuf_t out;
    int n_tokens;
    // with logprobs: the tokens not yet sent and their log-probabilities
    // (a stream takes them as they come); lp_off, the bytes of the tokens
    // sent before them (a completion's text offsets)
    int logprobs;
    int32_t *lp_ids;
    sampler_logprob_t *lps;
    int lp_n, lp_cap;
    size_t lp_off;
    int done;
    srv_done_t res;
    // The HTTP thread's: the event stream being written.
    strbuf_t sse;
    size_t sse_off;
    int sent_role, sent_end;
    int fd; // the client's socket, watched for a hang-up while waiting
    srv_http_t *h;
} job_t;

static void job_release(job_t *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    tok_stream_free(&j->ts);
    srv_stop_free(&j->stop);
    free(j->scratch.s);
    free(j->out.s);
    free(j->lp_ids), free(j->lps);
    free(j->sse.s);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

// Engine thread: a token -> text through the stop strings -> the queue.
// Under j->mu: keeps token id and its log-probabilities for the response; 0,
// or -1 out of memory.
static int keep_logprob(job_t *j, int32_t id, const sampler_logprob_t *lp) {
    if (j->lp_n == j->lp_cap) {
        int cap = j->lp_cap ? 2 * j->lp_cap : 64;
        int32_t *ids = realloc(j->lp_ids, (size_t)cap * sizeof *ids);
        if (ids) j->lp_ids = ids;
        sampler_logprob_t *lps = ids ? realloc(j->lps, (size_t)cap * sizeof *lps) : NULL;
        if (!lps) return -1;
        j->lps = lps, j->lp_cap = cap;
    }
    j->lp_ids[j->lp_n] = id, j->lps[j->lp_n] = *lp;
    j->lp_n++;
    return 0;
}

static int on_token(void *user, int32_t id, const sampler_logprob_t *lp) {
    job_t *j = user;
    const char *s;
    size_t n;
    if (tok_stream_feed(&j->ts, id, &s, &n) < 0) n = 0;
    j->scratch.n = 0;
    if (n) j->stop_hit = srv_stop_feed(&j->stop, s, n, &j->scratch);
    int oom = j->scratch.oom || srv_stop_oom(&j->stop);
    pthread_mutex_lock(&j->mu);
    j->n_tokens++;
    if (j->scratch.n) strbuf_putn(&j->out, j->scratch.s, j->scratch.n);
    oom |= j->out.oom;
    if (lp && keep_logprob(j, id, lp) < 0) oom = 1, j->out.oom = 1; // (on_done reports it)
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return j->stop_hit || oom;
}

static void on_done(void *user, const srv_done_t *d) {
    job_t *j = user;
    j->scratch.n = 0;
    if (!j->stop_hit && (d->finish == SRV_FINISH_STOP || d->finish == SRV_FINISH_LENGTH)) {
        // What the decoder and the stop strings still hold is text too.
        const char *s;
        size_t n;
        if (tok_stream_flush(&j->ts, &s, &n) == 0 && n) j->stop_hit = srv_stop_feed(&j->stop, s, n, &j->scratch);
        if (!j->stop_hit) srv_stop_flush(&j->stop, &j->scratch);
    }
    pthread_mutex_lock(&j->mu);
    if (j->scratch.n) strbuf_putn(&j->out, j->scratch.s, j->scratch.n);
    j->res = *d;
    if (j->stop_hit) j->res.finish = SRV_FINISH_STOP;
    if ((j->out.oom || j->scratch.oom || srv_stop_oom(&j->stop)) && j->res.finish != SRV_FINISH_CANCELLED) {
        j->res.finish = SRV_FINISH_ERROR;
        j->res.status = 503;
        snprintf(j->res.msg, sizeof j->res.msg, "out of memory keeping the generated text");
    }
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_release(j);
}

// The client has closed its end (a half-closed socket counts: an HTTP client
// waiting for its answer does not do that).
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

enum { WAIT_DONE, WAIT_TEXT, WAIT_TOKEN };
// Waits (j->mu held) until the request is done or, by `what`, text is ready
// or a first token came; 1 when the client went away meanwhile.
static int job_wait(job_t *j, int what) {
    while (!j->done && !(what == WAIT_TEXT && j->out.n) && !(what == WAIT_TOKEN && j->n_tokens)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && client_gone(j->fd)) return 1;
    }
    return 0;
}

static const char *finish_name(srv_finish_t f) { return f == SRV_FINISH_LENGTH ? "length" : "stop"; }

// ---- responses ------------------------------------------------------------------

typedef struct {
    strbuf_t body;
    int too_big;
    double t_arrival;
    job_t *job;
} conn_t;

static enum MHD_Result reply(srv_http_t *h, struct MHD_Connection *c, int status, const char *ctype, char *body) {
    static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", \"param\": "
                              "null, \"code\": null}}";
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    } else {
        status = 503, ctype = "application/json";
        r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_request(h->m, status);
    return ok;
}

static enum MHD_Result reply_json(srv_http_t *h, struct MHD_Connection *c, int status, char *json) {
    return reply(h, c, status, "application/json", json);
}

static enum MHD_Result reply_err(srv_http_t *h, struct MHD_Connection *c, const srv_oai_err_t *e) {
    return reply_json(h, c, e->status, srv_oai_error_json(e));
}

static enum MHD_Result fail(srv_http_t *h, struct MHD_Connection *c, int status, const char *param, const char *code,
                            const char *msg) {
    srv_oai_err_t e;
    srv_oai_err(&e, status, param, code, "%s", msg);
    return reply_err(h, c, &e);
}

// ---- streaming ------------------------------------------------------------------

static void sse_event(job_t *j, char *json) {
    if (!json) {
        j->sse.oom = 1;
        return;
    }
    strbuf_puts(&j->sse, "data: ");
    strbuf_puts(&j->sse, json);
    strbuf_puts(&j->sse, "\n\n");
    free(json);
}

// The next events of the stream into j->sse: the role chunk first (chat),
// then text as it comes, then the end. 1 when the client went away.
static int sse_more(job_t *j) {
    srv_http_t *h = j->h;
    if (j->kind == SRV_CHAT && !j->sent_role) {
        j->sent_role = 1;
        sse_event(j, srv_oai_chunk_json(j->kind, j->id, j->created, h->model, "assistant", "", NULL, h->tok, NULL));
        return 0;
    }
    pthread_mutex_lock(&j->mu);
    if (job_wait(j, WAIT_TEXT)) {
        pthread_mutex_unlock(&j->mu);
        return 1;
    }
    char *text = j->out.n ? strndup(j->out.s, j->out.n) : NULL;
    if (j->out.n && !text) j->sse.oom = 1;
    j->out.n = 0;
    // the tokens that came since the last chunk, with their log-probabilities
    // (a chunk of them goes out even while the stop strings hold the text back)
    int32_t *ids = j->lp_ids;
    sampler_logprob_t *lps = j->lps;
    srv_oai_lps_t l = {ids, lps, j->lp_n, j->lp_off};
    if (j->lp_n) j->lp_ids = NULL, j->lps = NULL, j->lp_n = j->lp_cap = 0;
    int done = j->done && !j->out.n;
    srv_done_t res = j->res;
    pthread_mutex_unlock(&j->mu);
    if (text || l.n)
        sse_event(j, srv_oai_chunk_json(j->kind, j->id, j->created, h->model, NULL, text ? text : "", NULL, h->tok,
                                        j->logprobs ? &l : NULL));
    for (int i = 0; i < l.n; i++) {
        size_t n = 0;
        if (tok_bytes(h->tok, ids[i], &n)) j->lp_off += n;
    }
    if (l.n) free(ids), free(lps);
    free(text);
    if (!done) return 0;
    if (res.finish == SRV_FINISH_ERROR || res.finish == SRV_FINISH_CANCELLED) {
        srv_oai_err_t e;
        srv_oai_err(&e, res.status, NULL, NULL, "%s", res.msg);
        sse_event(j, srv_oai_error_json(&e));
    } else {
        sse_event(j, srv_oai_chunk_json(j->kind, j->id, j->created, h->model, NULL, j->kind == SRV_CHAT ? NULL : "",
                                        finish_name(res.finish), h->tok, NULL));
        if (j->include_usage)
            sse_event(j, srv_oai_usage_chunk_json(j->kind, j->id, j->created, h->model, res.n_prompt, res.n_new));
    }
    strbuf_puts(&j->sse, "data: [DONE]\n\n");
    j->sent_end = 1;
    return 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    job_t *j = cls;
    (void)pos;
    while (j->sse_off == j->sse.n) {
        j->sse.n = j->sse_off = 0;
        if (j->sent_end) return MHD_CONTENT_READER_END_OF_STREAM;
        if (sse_more(j)) {
            srv_engine_cancel(j->h->e, j->eid);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (j->sse.oom) { // cannot write the stream on: end it
            srv_engine_cancel(j->h->e, j->eid);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t k = j->sse.n - j->sse_off < max ? j->sse.n - j->sse_off : max;
    memcpy(buf, j->sse.s + j->sse_off, k);
    j->sse_off += k;
    return (ssize_t)k;
}

static void sse_free(void *cls) { job_release(cls); }

// ---- generation endpoints ------------------------------------------------------------

static enum MHD_Result generate(srv_http_t *h, struct MHD_Connection *c, conn_t *cn, srv_kind_t kind) {
    srv_oai_req_t rq;
    srv_oai_err_t e;
    if (srv_oai_parse(h->tok, kind, cn->body.s ? cn->body.s : "", cn->body.n, h->ctx, &rq, &e) < 0)
        return reply_err(h, c, &e);
    unsigned long long seq = atomic_fetch_add(&h->seq, 1);
    if (!rq.seeded) rq.sampler.seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ seq;
    job_t *j = calloc(1, sizeof *j);
    if (!j) {
        srv_oai_req_free(&rq);
        return fail(h, c, 503, NULL, NULL, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->h = h;
    j->kind = kind, j->stream = rq.stream, j->include_usage = rq.include_usage, j->logprobs = rq.logprobs;
    snprintf(j->id, sizeof j->id, "%s-%llx%04llx", kind == SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), seq & 0xffff);
    j->created = (long long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    tok_stream_init(&j->ts, h->tok, TOK_SKIP_SPECIAL);
    cn->job = j;
    if (srv_stop_init(&j->stop, (const char *const *)rq.stop, rq.n_stop) < 0) {
        srv_oai_req_free(&rq);
        return fail(h, c, 503, NULL, NULL, "out of memory");
    }
    srv_submit_t s = {.prompt = rq.ids,
                      .n_prompt = rq.n_ids,
                      .max_new = rq.max_tokens,
                      .sampler = rq.sampler,
                      .logprobs = rq.logprobs,
                      .top_logprobs = rq.top_logprobs,
                      .t_arrival = cn->t_arrival,
                      .on_token = on_token,
                      .on_done = on_done,
                      .user = j};
    j->refs++; // the engine's, until on_done
    int rc = srv_engine_submit(h->e, &s, &j->eid);
    srv_oai_req_free(&rq);
    if (rc != 0) {
        j->refs--;
        if (rc == SRV_QUEUE_FULL)
            return fail(h, c, 429, NULL, "queue_full",
                        "the server is busy: every sequence slot and the whole queue are taken; retry later");
        if (rc == SRV_SHUTTING_DOWN) return fail(h, c, 503, NULL, NULL, "the server is shutting down");
        return fail(h, c, err_code() == ERR_INPUT ? 400 : 503, NULL, NULL, err_msg());
    }
    // A stream starts (status 200) with the first token: a request that fails
    // before, as when its cache cannot be allocated, still gets its status.
    pthread_mutex_lock(&j->mu);
    int gone = job_wait(j, j->stream ? WAIT_TOKEN : WAIT_DONE);
    int failed = j->done && (j->res.finish == SRV_FINISH_ERROR || j->res.finish == SRV_FINISH_CANCELLED);
    pthread_mutex_unlock(&j->mu);
    if (gone) {
        srv_engine_cancel(h->e, j->eid);
        srv_metrics_request(h->m, 499); // nginx's "client closed request": no response was sent
        return MHD_NO;                  // closes the connection
    }
    if (failed) return fail(h, c, j->res.status, NULL, NULL, j->res.msg);
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, j, sse_free);
        if (!r) {
            srv_engine_cancel(h->e, j->eid);
            return MHD_NO;
        }
        pthread_mutex_lock(&j->mu);
        j->refs++; // the response's, released by sse_free
        pthread_mutex_unlock(&j->mu);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        srv_metrics_request(h->m, 200);
        return ok;
    }
    srv_oai_lps_t l = {j->lp_ids, j->lps, j->lp_n, 0};
    return reply_json(h, c, 200,
                      srv_oai_response_json(kind, j->id, j->created, h->model, j->out.s ? j->out.s : "",
                                            finish_name(j->res.finish), j->res.n_prompt, j->res.n_new, h->tok,
                                            j->logprobs ? &l : NULL));
}

// ---- routing ------------------------------------------------------------------------

// The key, compared in time independent of where it differs.
static int key_ok(const srv_http_t *h, struct MHD_Connection *c) {
    if (!h->api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncmp(a, "Bearer ", 7)) return 0;
    a += 7;
    size_t n = strlen(a), k = strlen(h->api_key);
    unsigned diff = n != k;
    for (size_t i = 0; i < k; i++)
        diff |= (unsigned char)h->api_key[i] ^ (unsigned char)(i < n ? a[i] : 0);
    return diff == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_n, void **con_cls) {
    srv_http_t *h = cls;
    conn_t *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        cn->t_arrival = time_now();
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_n) {
        if (cn->body.n + *upload_n > BODY_MAX)
            cn->too_big = 1;
        else
            strbuf_putn(&cn->body, upload, *upload_n);
        *upload_n = 0;
        return MHD_YES;
    }
    int get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
    static const struct {
        const char *path;
        int post; // else GET
        int open; // no key needed
    } routes[] = {{"/health", 0, 1},         {"/metrics", 0, 1},  {"/v1/models", 0, 0}, {"/v1/chat/completions", 1, 0},
                  {"/v1/completions", 1, 0}, {"/tokenize", 1, 0}, {"/detokenize", 1, 0}};
    int r = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) r = i;
    if (r < 0) return fail(h, c, 404, NULL, "not_found", "no such endpoint");
    if (routes[r].post ? !post : !get)
        return fail(h, c, 405, NULL, "method_not_allowed", routes[r].post ? "use POST" : "use GET");
    if (!routes[r].open && !key_ok(h, c))
        return fail(h, c, 401, NULL, "invalid_api_key",
                    "a valid API key is needed: send the header 'Authorization: Bearer KEY'");
    if (cn->too_big) return fail(h, c, 413, NULL, "request_too_large", "the request body exceeds 16 MiB");
    if (cn->body.oom) return fail(h, c, 503, NULL, NULL, "out of memory");
    const char *path = routes[r].path;
    if (!strcmp(path, "/health")) return reply_json(h, c, 200, strdup("{\"status\":\"ok\"}"));
    if (!strcmp(path, "/metrics")) {
        strbuf_t b = {0};
        srv_metrics_render(h->m, &b);
        if (b.oom) free(b.s), b.s = NULL;
        return reply(h, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.s);
    }
    if (!strcmp(path, "/v1/models"))
        return reply_json(h, c, 200, srv_oai_models_json(h->model, (long long)time(NULL), h->ctx));
    if (!strcmp(path, "/v1/chat/completions")) return generate(h, c, cn, SRV_CHAT);
    if (!strcmp(path, "/v1/completions")) return generate(h, c, cn, SRV_COMPLETION);
    srv_oai_err_t e;
    const char *body = cn->body.s ? cn->body.s : "";
    char *out = !strcmp(path, "/tokenize") ? srv_oai_tokenize(h->tok, body, cn->body.n, h->ctx, &e)
                                           : srv_oai_detokenize(h->tok, body, cn->body.n, &e);
    return out ? reply_json(h, c, 200, out) : reply_err(h, c, &e);
}

// The end of a request: a client gone before its answer was complete cancels
// the generation at once.
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_http_t *h = cls;
    conn_t *cn = *con_cls;
    if (!cn) return;
    if (cn->job) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) srv_engine_cancel(h->e, cn->job->eid);
        job_release(cn->job);
    }
    free(cn->body.s);
    free(cn);
    *con_cls = NULL;
}

// libmicrohttpd's messages (a client that went away mid-stream, mostly) are
// debug-level news here: the server's own errors are reported where they happen.
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    log_debug("http: %s", msg);
}

int srv_http_start(srv_http_t **out, const srv_http_cfg_t *cfg, srv_engine_t *e, const tok_t *tok, srv_metrics_t *m) {
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    int g = getaddrinfo(cfg->host, NULL, &hints, &ai);
    if (g) return err_set(ERR_INPUT, "--host %s: %s", cfg->host, gai_strerror(g));
    struct sockaddr_storage ss = {0};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)cfg->port);
    else
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)cfg->port);
    srv_http_t *h = calloc(1, sizeof *h);
    if (!h) return err_set(ERR_NOMEM, "out of memory");
    h->e = e, h->tok = tok, h->m = m, h->ctx = cfg->ctx;
    h->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    h->model = strdup(cfg->model_name);
    atomic_init(&h->seq, 1);
    if ((cfg->api_key && cfg->api_key[0] && !h->api_key) || !h->model) {
        srv_http_stop(h);
        return err_set(ERR_NOMEM, "out of memory");
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC |
                     (v6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, &ss,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)cfg->max_conns, MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_log, NULL, MHD_OPTION_END);
    if (!h->d) {
        srv_http_stop(h);
        return err_set(ERR_IO, "cannot listen on %s port %d (in use, or not an address of this machine?)", cfg->host,
                       cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    *out = h;
    return 0;
}

int srv_http_port(const srv_http_t *h) { return h->port; }

void srv_http_quiesce(srv_http_t *h) {
    if (!h || !h->d) return;
    MHD_socket s = MHD_quiesce_daemon(h->d);
    if (s != MHD_INVALID_SOCKET) close(s);
}

void srv_http_stop(srv_http_t *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    free(h->api_key);
    free(h->model);
    free(h);
}
