// The server's counters, gauges and latency histograms, shared by the HTTP
// threads and the engine thread (one mutex), rendered in the Prometheus text
// exposition format for GET /metrics.
#pragma once
#include <pthread.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "serve/prefix.h"

enum { SRV_HIST_BUCKETS = 14, SRV_STATUS_SLOTS = 16 };

typedef struct {
    uint64_t count[SRV_HIST_BUCKETS + 1]; // per bucket (not cumulative); the last is +Inf
    uint64_t n;
    double sum;
} srv_hist_t;

// The engine's counts (serve/engine.h srv_engine_stats_t says what each is).
typedef struct {
    uint64_t turns, forwards, mixed, rode;
    uint64_t tokens, max_tokens, cut, deferred;
    // the model run's decode steps (model.h model_run_t): replayed, recorded, op by op
    uint64_t steps_replayed, steps_recorded, steps_op_by_op;
    uint64_t greedy; // decode steps whose tokens were chosen on the device (every row greedy)
} srv_engine_counts_t;

typedef struct {
    pthread_mutex_t mu;
    int status[SRV_STATUS_SLOTS]; // HTTP status codes seen, with their counts
    uint64_t status_n[SRV_STATUS_SLOTS];
    uint64_t prompt_tokens, gen_tokens, cancelled, preempted;
    int64_t queued, running, cache_bytes, pages_free, pages_total;
    srv_prefix_stats_t prefix;
    srv_engine_counts_t engine;
    int64_t max_batched_tokens; // the engine's token budget per turn (0: none)
    srv_hist_t ttft, tpot;      // seconds: submit -> first token; between output tokens
} srv_metrics_t;

void srv_metrics_init(srv_metrics_t *m);
void srv_metrics_free(srv_metrics_t *m);
// A response sent with this HTTP status.
void srv_metrics_request(srv_metrics_t *m, int status);
void srv_metrics_tokens(srv_metrics_t *m, int64_t prompt, int64_t gen);
void srv_metrics_cancelled(srv_metrics_t *m);
// A running request preempted (its pages freed, queued to be prefilled again).
void srv_metrics_preempted(srv_metrics_t *m);
// The page pool (model.h model_pool_t): pages free and in all.
void srv_metrics_pages(srv_metrics_t *m, int64_t free_pages, int64_t total);
void srv_metrics_gauges(srv_metrics_t *m, int64_t queued, int64_t running, int64_t cache_bytes);
// The prefix cache's counters and gauges, as they are now.
void srv_metrics_prefix(srv_metrics_t *m, const srv_prefix_stats_t *s);
// The engine's counts as they are now, and its token budget per turn.
void srv_metrics_engine(srv_metrics_t *m, const srv_engine_counts_t *c, int64_t max_batched_tokens);
void srv_metrics_ttft(srv_metrics_t *m, double s);
void srv_metrics_tpot(srv_metrics_t *m, double s);
// Appends the exposition text (out->oom on a failed allocation).
void srv_metrics_render(srv_metrics_t *m, strbuf_t *out);
