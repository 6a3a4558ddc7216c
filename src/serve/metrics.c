#include "serve/metrics.h"

#include <string.h>

// Upper bounds of the histogram buckets in seconds, as vLLM's (a CPU decode
// step of a small model is tens of milliseconds, a GPU one a few).
static const double bounds[SRV_HIST_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                                0.1,   0.25,  0.5,  1.0,  2.5,  5.0,  10.0};

void srv_metrics_init(srv_metrics_t *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_free(srv_metrics_t *m) { pthread_mutex_destroy(&m->mu); }

void srv_metrics_request(srv_metrics_t *m, int status) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SRV_STATUS_SLOTS; i++) {
        if (m->status[i] == status || m->status[i] == 0) {
            m->status[i] = status;
            m->status_n[i]++;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tokens(srv_metrics_t *m, int64_t prompt, int64_t gen) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->gen_tokens += (uint64_t)gen;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_cancelled(srv_metrics_t *m) {
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_preempted(srv_metrics_t *m) {
    pthread_mutex_lock(&m->mu);
    m->preempted++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_pages(srv_metrics_t *m, int64_t free_pages, int64_t total) {
    pthread_mutex_lock(&m->mu);
    m->pages_free = free_pages, m->pages_total = total;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_gauges(srv_metrics_t *m, int64_t queued, int64_t running, int64_t cache_bytes) {
    pthread_mutex_lock(&m->mu);
    m->queued = queued, m->running = running, m->cache_bytes = cache_bytes;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_prefix(srv_metrics_t *m, const srv_prefix_stats_t *s) {
    pthread_mutex_lock(&m->mu);
    m->prefix = *s;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_engine(srv_metrics_t *m, const srv_engine_counts_t *c, int64_t max_batched_tokens) {
    pthread_mutex_lock(&m->mu);
    m->engine = *c;
    m->max_batched_tokens = max_batched_tokens;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(srv_metrics_t *m, srv_hist_t *h, double s) {
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < SRV_HIST_BUCKETS && s > bounds[b])
        b++;
    h->count[b]++;
    h->n++;
    h->sum += s;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_ttft(srv_metrics_t *m, double s) { hist_add(m, &m->ttft, s); }
void srv_metrics_tpot(srv_metrics_t *m, double s) { hist_add(m, &m->tpot, s); }

static void hist_render(strbuf_t *o, const char *name, const char *help, const srv_hist_t *h) {
    strbuf_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t acc = 0;
    for (int b = 0; b < SRV_HIST_BUCKETS; b++) {
        acc += h->count[b];
        strbuf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], (unsigned long long)acc);
    }
    acc += h->count[SRV_HIST_BUCKETS];
    strbuf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)acc, name,
                  h->sum, name, (unsigned long long)h->n);
}

void srv_metrics_render(srv_metrics_t *m, strbuf_t *o) {
    pthread_mutex_lock(&m->mu);
    strbuf_puts(o, "# HELP hylo_requests_total HTTP responses sent, by status code.\n"
                   "# TYPE hylo_requests_total counter\n");
    for (int i = 0; i < SRV_STATUS_SLOTS && m->status[i]; i++)
        strbuf_printf(o, "hylo_requests_total{status=\"%d\"} %llu\n", m->status[i], (unsigned long long)m->status_n[i]);
    strbuf_printf(o,
                  "# HELP hylo_requests_cancelled_total Requests cancelled (client gone, shutdown).\n"
                  "# TYPE hylo_requests_cancelled_total counter\nhylo_requests_cancelled_total %llu\n"
                  "# HELP hylo_prompt_tokens_total Prompt tokens prefilled.\n"
                  "# TYPE hylo_prompt_tokens_total counter\nhylo_prompt_tokens_total %llu\n"
                  "# HELP hylo_generation_tokens_total Tokens generated.\n"
                  "# TYPE hylo_generation_tokens_total counter\nhylo_generation_tokens_total %llu\n"
                  "# HELP hylo_queue_length Requests waiting for a sequence slot or for room in the cache budget.\n"
                  "# TYPE hylo_queue_length gauge\nhylo_queue_length %lld\n"
                  "# HELP hylo_running_sequences Sequences being prefilled or decoded.\n"
                  "# TYPE hylo_running_sequences gauge\nhylo_running_sequences %lld\n"
                  "# HELP hylo_cache_bytes Device bytes held by the running sequences' caches.\n"
                  "# TYPE hylo_cache_bytes gauge\nhylo_cache_bytes %lld\n"
                  "# HELP hylo_cache_pages_free Pages of the paged cache's pool that nothing holds.\n"
                  "# TYPE hylo_cache_pages_free gauge\nhylo_cache_pages_free %lld\n"
                  "# HELP hylo_cache_pages_total Pages of the paged cache's pool.\n"
                  "# TYPE hylo_cache_pages_total gauge\nhylo_cache_pages_total %lld\n"
                  "# HELP hylo_preemptions_total Running requests preempted for want of cache pages (resumed "
                  "later).\n"
                  "# TYPE hylo_preemptions_total counter\nhylo_preemptions_total %llu\n",
                  (unsigned long long)m->cancelled, (unsigned long long)m->prompt_tokens,
                  (unsigned long long)m->gen_tokens, (long long)m->queued, (long long)m->running,
                  (long long)m->cache_bytes, (long long)m->pages_free, (long long)m->pages_total,
                  (unsigned long long)m->preempted);
    strbuf_printf(o,
                  "# HELP hylo_prefix_cache_hits_total Requests that restored a cached prefix.\n"
                  "# TYPE hylo_prefix_cache_hits_total counter\nhylo_prefix_cache_hits_total %llu\n"
                  "# HELP hylo_prefix_cache_misses_total Requests that found no cached prefix.\n"
                  "# TYPE hylo_prefix_cache_misses_total counter\nhylo_prefix_cache_misses_total %llu\n"
                  "# HELP hylo_prefix_cache_reused_tokens_total Prompt tokens restored instead of prefilled.\n"
                  "# TYPE hylo_prefix_cache_reused_tokens_total counter\nhylo_prefix_cache_reused_tokens_total %llu\n"
                  "# HELP hylo_prefix_cache_evictions_total Entries evicted to stay within the budget.\n"
                  "# TYPE hylo_prefix_cache_evictions_total counter\nhylo_prefix_cache_evictions_total %llu\n"
                  "# HELP hylo_prefix_cache_bytes Bytes held by the prefix cache's entries.\n"
                  "# TYPE hylo_prefix_cache_bytes gauge\nhylo_prefix_cache_bytes %lld\n"
                  "# HELP hylo_prefix_cache_entries Entries in the prefix cache.\n"
                  "# TYPE hylo_prefix_cache_entries gauge\nhylo_prefix_cache_entries %lld\n"
                  "# HELP hylo_prefix_cache_snapshots Recurrent-state snapshots the entries hold.\n"
                  "# TYPE hylo_prefix_cache_snapshots gauge\nhylo_prefix_cache_snapshots %lld\n"
                  "# HELP hylo_prefix_cache_snapshot_bytes Bytes of those snapshots, allocated on the model's device "
                  "(the entries' cache rows are pages of the pool).\n"
                  "# TYPE hylo_prefix_cache_snapshot_bytes gauge\nhylo_prefix_cache_snapshot_bytes %lld\n",
                  (unsigned long long)m->prefix.hits, (unsigned long long)m->prefix.misses,
                  (unsigned long long)m->prefix.reused_tokens, (unsigned long long)m->prefix.evictions,
                  (long long)m->prefix.bytes, (long long)m->prefix.entries, (long long)m->prefix.snapshots,
                  (long long)m->prefix.snapshot_bytes);
    const srv_engine_counts_t *en = &m->engine;
    strbuf_printf(o,
                  "# HELP hylo_engine_turns_total Engine turns with a request to feed the model.\n"
                  "# TYPE hylo_engine_turns_total counter\nhylo_engine_turns_total %llu\n"
                  "# HELP hylo_engine_forwards_total Forwards of the model (one a turn: a batched prefill, or a "
                  "decode step when no request is in its prompt).\n"
                  "# TYPE hylo_engine_forwards_total counter\nhylo_engine_forwards_total %llu\n"
                  "# HELP hylo_engine_mixed_forwards_total Forwards that carried decode tokens beside prefill "
                  "chunks.\n"
                  "# TYPE hylo_engine_mixed_forwards_total counter\nhylo_engine_mixed_forwards_total %llu\n"
                  "# HELP hylo_engine_riding_tokens_total Decode tokens that rode in a forward with prefill chunks.\n"
                  "# TYPE hylo_engine_riding_tokens_total counter\nhylo_engine_riding_tokens_total %llu\n"
                  "# HELP hylo_engine_forward_tokens_total Tokens of the forwards (prefill chunks and decode "
                  "tokens).\n"
                  "# TYPE hylo_engine_forward_tokens_total counter\nhylo_engine_forward_tokens_total %llu\n"
                  "# HELP hylo_engine_forward_tokens_max The most tokens one forward carried.\n"
                  "# TYPE hylo_engine_forward_tokens_max gauge\nhylo_engine_forward_tokens_max %llu\n"
                  "# HELP hylo_engine_max_batched_tokens Token budget of one turn's forward (--max-batched-tokens; "
                  "0: none).\n"
                  "# TYPE hylo_engine_max_batched_tokens gauge\nhylo_engine_max_batched_tokens %lld\n"
                  "# HELP hylo_engine_budget_cut_chunks_total Prefill chunks shortened by the token budget.\n"
                  "# TYPE hylo_engine_budget_cut_chunks_total counter\nhylo_engine_budget_cut_chunks_total %llu\n"
                  "# HELP hylo_engine_budget_deferred_total Turns in which a prefilling request got no chunk, the "
                  "token budget spent.\n"
                  "# TYPE hylo_engine_budget_deferred_total counter\nhylo_engine_budget_deferred_total %llu\n"
                  "# HELP hylo_engine_decode_steps_total Decode steps (forwards of decode tokens alone) by how they "
                  "ran: replayed (a recorded CUDA graph), recorded (a new recording, then replayed), op_by_op.\n"
                  "# TYPE hylo_engine_decode_steps_total counter\n"
                  "hylo_engine_decode_steps_total{how=\"replayed\"} %llu\n"
                  "hylo_engine_decode_steps_total{how=\"recorded\"} %llu\n"
                  "hylo_engine_decode_steps_total{how=\"op_by_op\"} %llu\n"
                  "# HELP hylo_engine_greedy_steps_total Decode steps whose tokens were chosen on the device (every "
                  "request in them greedy, without penalties, biases or log-probabilities).\n"
                  "# TYPE hylo_engine_greedy_steps_total counter\nhylo_engine_greedy_steps_total %llu\n",
                  (unsigned long long)en->turns, (unsigned long long)en->forwards, (unsigned long long)en->mixed,
                  (unsigned long long)en->rode, (unsigned long long)en->tokens, (unsigned long long)en->max_tokens,
                  (long long)m->max_batched_tokens, (unsigned long long)en->cut, (unsigned long long)en->deferred,
                  (unsigned long long)en->steps_replayed, (unsigned long long)en->steps_recorded,
                  (unsigned long long)en->steps_op_by_op, (unsigned long long)en->greedy);
    hist_render(o, "hylo_time_to_first_token_seconds", "Time from arrival to the first generated token.", &m->ttft);
    hist_render(o, "hylo_time_per_output_token_seconds", "Time between consecutive generated tokens of a request.",
                &m->tpot);
    pthread_mutex_unlock(&m->mu);
}
