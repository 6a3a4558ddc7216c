#include "serve/engine.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "base/timer.h"

typedef struct req {
    uint64_t id;
    srv_submit_t s;
    // owned copy of s.prompt, room for n_prompt + max_new: the generated
    // tokens follow the prompt, so that a preempted request prefills its
    // prompt and its answer so far again (n_feed tokens)
    int32_t *prompt;
    int32_t *bias_id; // copies of the submit's logit biases (s.sampler points at them, smp uses them)
    float *bias;
    int n_feed;   // tokens to prefill: n_prompt, or more after a preemption
    int resumed;  // prefilling again after a preemption that came after its first token
    int fed;      // of them fed so far
    int decoding; // the prompt is in; next is the token to feed
    int32_t next;
    int n_new;
    int cancel; // set under the engine's mutex
    int has_state, has_smp;
    model_state_t st; // paged (the engine's pool)
    sampler_t smp;
    srv_prefix_rec_t rec; // the prefix cache's boundaries of this prompt
    int promised;         // pages counted in e->promised between admission and start
    double t_last;        // when the last token was handed on
    struct req *link;
} req_t;

struct srv_engine {
    model_t *m;
    model_run_t run;
    srv_engine_cfg_t cfg;
    int32_t *stop_ids;
    srv_metrics_t *metrics;
    srv_prefix_t *prefix; // NULL: no prefix cache
    float *logits;        // [max_seqs, V]: a prefill's last row, or a decode step's rows
    int ran;              // srv_engine_run has returned
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req_t *q_head, *q_tail; // waiting, oldest first
    int n_queued;
    req_t **active; // [max_seqs], running
    int n_active;
    // The paged cache: the running requests' attention / MLA rows and the
    // prefix cache's entries, in pages of one pool (model.h model_pool_t).
    model_pool_t pool;
    int has_pool;
    int promised; // pages admitted requests will take when they start (e->mu)
    req_t **turn; // [max_seqs] the engine thread's copy of active for one turn
    int n_turn;
    int *turn_cancel; // [max_seqs] and their cancel flags
    // a turn's forward: the decoding and the prefilling requests (indices
    // into turn), and the forward's rows: their turn indices, states, tokens
    // (a decode row's), chunks (a decode row's: its token), chunk lengths,
    // and which ones want logits (a prompt's last chunk, every decode row)
    int *dec_idx, *step_idx, *pre_idx;
    model_state_t **step_st;
    int32_t *step_ids;
    const int32_t **pre_ids;
    int *pre_n;
    uint8_t *pre_last;
    int32_t *sampled;      // [max_seqs] the token drawn for each of the forward's rows with logits
    sampler_logprob_t *lp; // [max_seqs] and its log-probabilities, for the requests that ask
    int *lg_row;           // [max_seqs] those rows, in the order of their logits
    uint64_t next_id;
    srv_engine_stats_t stats; // (e->mu)
    int stopping;             // no more submits; everything is cancelled
    int has_run, sync_init;
};

int64_t srv_request_bytes(const model_t *m, int n) {
    return (int64_t)n * model_cache_bytes_per_token(m) + model_snapshot_fixed_bytes(m);
}

int64_t srv_pool_pages(const model_t *m, const srv_engine_cfg_t *cfg) {
    int64_t page = model_page_bytes(m), fixed = model_snapshot_fixed_bytes(m);
    int64_t most = (int64_t)cfg->max_seqs * model_pages_for(cfg->ctx);
    if (cfg->prefix_bytes > 0 && page > 0) most += cfg->prefix_bytes / page + 1;
    if (!cfg->cache_budget || page == 0) return most;
    int64_t n = (cfg->cache_budget - (int64_t)cfg->max_seqs * fixed) / page;
    return n < most ? n : most;
}

static void req_free(srv_engine_t *e, req_t *r) {
    if (r->promised) { // admitted, never started
        pthread_mutex_lock(&e->mu);
        e->promised -= r->promised;
        pthread_mutex_unlock(&e->mu);
    }
    if (e->prefix) srv_prefix_rec_free(e->prefix, &r->rec);
    if (r->has_state) model_state_free(e->m, &r->st);
    if (r->has_smp) sampler_free(&r->smp);
    free(r->prompt);
    free(r->bias_id), free(r->bias);
    free(r);
}

// Hands the request's end to its owner and frees it (engine thread, no lock
// held). The cache is freed before the owner hears, so a finished request
// never holds memory.
static void finish(srv_engine_t *e, req_t *r, srv_finish_t how, int status, const char *msg) {
    srv_done_t d = {.finish = how, .n_prompt = r->s.n_prompt, .n_new = r->n_new, .status = status};
    if (msg) snprintf(d.msg, sizeof d.msg, "%s", msg);
    if (how == SRV_FINISH_CANCELLED && e->metrics) srv_metrics_cancelled(e->metrics);
    void (*on_done)(void *, const srv_done_t *) = r->s.on_done;
    void *user = r->s.user;
    req_free(e, r);
    on_done(user, &d);
}

// An error of the model: out of memory is the server's lack (503), anything
// else an internal failure (500).
static void finish_error(srv_engine_t *e, req_t *r, int rc) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s", err_msg());
    log_warn("request %llu failed: %s", (unsigned long long)r->id, msg);
    finish(e, r, SRV_FINISH_ERROR, rc == ERR_NOMEM ? 503 : rc == ERR_INPUT ? 400 : 500, msg);
}

static int is_stop_id(const srv_engine_t *e, int32_t id) {
    for (int i = 0; i < e->cfg.n_stop_ids; i++)
        if (e->stop_ids[i] == id) return 1;
    return 0;
}

// Pages r takes when it starts: its prompt (and answer so far) and the row
// of its next token.
static int start_pages(const req_t *r) { return model_pages_for((int64_t)r->n_feed + 1); }

// Whether r may start now: pages free for it beyond those promised to the
// requests admitted before it (e->mu held; the pool and the prefix cache
// are the engine thread's, which holds the mutex here). The prefix cache's
// least recently used entries give theirs back first when it is short.
static int fits(srv_engine_t *e, const req_t *r) {
    while (e->pool.n_free - e->promised < start_pages(r))
        if (!e->prefix || !srv_prefix_evict(e->prefix)) return 0;
    return 1;
}

// The prefix cache's counters, as they are now, to /metrics.
static void publish_prefix(srv_engine_t *e) {
    if (!e->metrics || !e->prefix) return;
    srv_prefix_stats_t s = srv_prefix_stats(e->prefix);
    srv_metrics_prefix(e->metrics, &s);
}

static void publish_pages(srv_engine_t *e) {
    if (e->metrics) srv_metrics_pages(e->metrics, e->pool.n_free, e->pool.n_pages);
}

// Puts running request v back at the head of the queue, its pages given back
// (engine thread, no lock held): it is prefilled again when it starts next,
// with its answer so far after its prompt (n_feed), and goes on from there;
// its client sees one stream. Its sampler keeps its state.
static void preempt(srv_engine_t *e, req_t *v) {
    log_info("request %llu preempted at %d cached tokens (%d generated): no cache page free (%d pages); it resumes "
             "later",
             (unsigned long long)v->id, v->st.len, v->n_new, e->pool.n_pages);
    if (e->prefix) srv_prefix_rec_free(e->prefix, &v->rec);
    model_state_free(e->m, &v->st);
    v->has_state = 0;
    v->n_feed = v->s.n_prompt + v->n_new;
    v->resumed = v->n_new > 0;
    v->fed = 0, v->decoding = 0;
    if (e->metrics) srv_metrics_preempted(e->metrics);
    pthread_mutex_lock(&e->mu);
    v->link = e->q_head;
    e->q_head = v;
    if (!e->q_tail) e->q_tail = v;
    e->n_queued++;
    pthread_mutex_unlock(&e->mu);
}

// Room for n tokens in r's cache, made when the pool has no page free: the
// prefix cache's least recently used entries give theirs back first, then
// the newest running request (the highest id among this turn's, r
// included) is preempted, until the room is there. 0: room; 1: r itself was
// preempted (its turn entry is cleared); < 0: an error (r still runs).
static int make_room(srv_engine_t *e, req_t *r, int n) {
    for (;;) {
        int rc = model_state_reserve(e->m, &r->st, n);
        if (rc != ERR_NOMEM) return rc;
        if (e->prefix && srv_prefix_evict(e->prefix)) {
            publish_prefix(e);
            continue;
        }
        int v = -1;
        for (int i = 0; i < e->n_turn; i++)
            if (e->turn[i] && e->turn[i]->has_state && (v < 0 || e->turn[i]->id > e->turn[v]->id)) v = i;
        if (v < 0) return rc;
        req_t *victim = e->turn[v];
        e->turn[v] = NULL;
        err_clear();
        preempt(e, victim);
        if (victim == r) return 1;
    }
}

// A request's first turn (again after a preemption): its paged cache, with
// the pages of its prompt (and answer so far) and its next token taken now,
// restored from the prefix cache where it can be, and its sampler. 0; 1 when
// it went back to the queue (make_room) or finished.
static int start(srv_engine_t *e, req_t *r) {
    pthread_mutex_lock(&e->mu);
    e->promised -= r->promised;
    r->promised = 0;
    pthread_mutex_unlock(&e->mu);
    int rc = model_state_alloc_paged(e->m, &r->st, &e->pool, r->s.n_prompt + r->s.max_new);
    if (rc == 0) r->has_state = 1;
    if (rc == 0 && !r->has_smp) {
        rc = sampler_init(&r->smp, &r->s.sampler, e->m->a.V);
        r->has_smp = rc == 0;
    }
    if (rc == 0 && e->prefix) {
        r->fed = srv_prefix_restore(e->prefix, &r->st, r->prompt, r->n_feed, &r->rec);
        publish_prefix(e);
    }
    if (rc == 0) {
        rc = make_room(e, r, r->n_feed + 1);
        if (rc == 1) return 1;
    }
    if (rc < 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "cannot allocate the request's cache: %s", err_msg());
        finish(e, r, SRV_FINISH_ERROR, rc == ERR_INPUT ? 400 : 503, msg);
        return 1;
    }
    return 0;
}

// Hands on the token id sampled from the request's logits row: 1 when the
// request finished (it is freed), else 0.
static int emit(srv_engine_t *e, req_t *r, int32_t id, const sampler_logprob_t *lp) {
    if (is_stop_id(e, id)) return finish(e, r, SRV_FINISH_STOP, 200, NULL), 1;
    double now = time_now();
    if (e->metrics) {
        if (r->n_new == 0)
            srv_metrics_ttft(e->metrics, now - r->s.t_arrival);
        else
            srv_metrics_tpot(e->metrics, now - r->t_last);
        srv_metrics_tokens(e->metrics, 0, 1);
    }
    r->t_last = now;
    r->prompt[r->s.n_prompt + r->n_new] = id; // part of its prompt if it is ever preempted
    r->n_new++;
    if (r->s.on_token(r->s.user, id, r->s.logprobs ? lp : NULL)) return finish(e, r, SRV_FINISH_STOP, 200, NULL), 1;
    if (r->n_new >= r->s.max_new) return finish(e, r, SRV_FINISH_LENGTH, 200, NULL), 1;
    r->next = id;
    return 0;
}

// The next prefill chunk of a request: its length, whether it is the last.
static int next_chunk(const srv_engine_t *e, const req_t *r, int *last) {
    // Chunks end on multiples of --chunk (and of the prefix cache's block,
    // where its boundaries are taken), also after a restored prefix: its
    // rest then goes through the products in the chunks a prefill from
    // token 0 would use, but for the first (docs/SERVING.md, prefix caching).
    // The token budget (forward) may only end a chunk earlier: the next one
    // then runs to the same boundary, so every block boundary is still the
    // end of a chunk (srv_prefix_mark takes it there).
    int n = r->n_feed - r->fed, to = e->cfg.chunk - r->fed % e->cfg.chunk;
    if (e->prefix) {
        int block = srv_prefix_block(e->prefix), tb = block - r->fed % block;
        if (tb < to) to = tb;
    }
    if (n > to) n = to;
    *last = r->fed + n == r->n_feed;
    return n;
}

// After a prefill chunk of n tokens: the prefix cache's records and, after
// the last chunk (id: sampled from its last token's logits), the first token
// (the next one of a resumed request). 1 when the request finished (it is
// freed), else 0.
// A resumed request's prompt and answer so far are no prompt of a client:
// no entry of the prefix cache, and its prompt tokens were counted before.
static int chunk_done(srv_engine_t *e, req_t *r, int n, int last, int32_t id, const sampler_logprob_t *lp) {
    r->fed += n;
    if (e->prefix && !r->resumed) {
        if (last)
            srv_prefix_insert(e->prefix, &r->rec, &r->st, r->prompt, r->s.n_prompt);
        else
            srv_prefix_mark(e->prefix, &r->rec, &r->st);
        publish_prefix(e);
    }
    if (!last) return 0;
    if (e->metrics && !r->resumed) srv_metrics_tokens(e->metrics, r->s.n_prompt, 0);
    r->decoding = 1;
    return emit(e, r, id, lp);
}

// A request whose tokens are each the argmax of the model's logits, with
// nothing else read from them: no penalties, biases or log-probabilities.
static int plain_greedy(const req_t *r) {
    const sampler_cfg_t *c = &r->s.sampler;
    return c->temperature == 0.0f && c->presence_penalty == 0.0f && c->frequency_penalty == 0.0f && c->n_bias == 0 &&
           !r->s.logprobs;
}

// The turn's one forward: the next prefill chunk of every prefilling request
// turn[pre[0..n_pre)] and the next token of every decoding one
// turn[dec[0..n_dec)]. With prefill work it is one batched prefill
// (model_prefill_batch: the chunks packed, each over its own cache; the
// decode tokens ride in it as one-token chunks, which step together, each
// over its own cache at its own length), so the weights are read once for
// the turn; without, one decode step (model_step_batch: recorded as a CUDA
// graph where it can, fused kernels for a few rows; model_greedy_queue, its
// argmax on the device, when every row is plain_greedy). After a request's last
// chunk comes its first token (chunk_done), after a decode its next one
// (emit). Finished requests are freed and their turn[] entries set to NULL.
// Under a token budget (cfg.max_batched_tokens) the decode tokens count
// first, then the chunks in pre[]'s order (the order the requests entered
// the batch: oldest first), each cut to what is left; a request that gets
// nothing waits for the next turn, except the first (oldest) one, which
// gets a token at least. Adds what ran to *ran.
static void forward(srv_engine_t *e, req_t **turn, const int *pre, int n_pre, const int *dec, int n_dec,
                    srv_engine_stats_t *ran) {
    // room for each decode token first (a page every BE_PAGE_ROWS tokens;
    // preempting the newest requests when the pool is out), so that a cache
    // that cannot grow fails alone
    for (int i = 0; i < n_dec; i++) {
        req_t *r = turn[dec[i]];
        if (!r) continue; // preempted for an older one
        int rc = make_room(e, r, r->st.len + 1);
        if (rc < 0) {
            finish_error(e, r, rc);
            turn[dec[i]] = NULL;
        }
    }
    int k = 0, left = INT_MAX; // the budget's tokens left for chunks
    if (e->cfg.max_batched_tokens > 0) {
        left = e->cfg.max_batched_tokens;
        for (int i = 0; i < n_dec; i++)
            left -= turn[dec[i]] != NULL;
    }
    for (int i = 0; i < n_pre; i++) {
        req_t *r = turn[pre[i]];
        if (!r) continue;                         // preempted for an older one
        int room = k == 0 && left < 1 ? 1 : left; // the oldest prefilling request always moves on
        if (room < 1) {
            ran->deferred++;
            continue;
        }
        int last, c = next_chunk(e, r, &last);
        if (c > room) c = room, last = 0, ran->cut++;              // ends before the prompt does
        int rc = model_state_reserve(e->m, &r->st, r->st.len + c); // a cache that cannot grow fails alone
        if (rc < 0) {
            finish_error(e, r, rc);
            turn[pre[i]] = NULL;
            continue;
        }
        e->step_idx[k] = pre[i], e->step_st[k] = &r->st, e->pre_ids[k] = r->prompt + r->fed;
        e->pre_n[k] = c, e->pre_last[k] = (uint8_t)last;
        k++;
        left -= c;
    }
    const int k_pre = k;
    for (int i = 0; i < n_dec; i++) {
        req_t *r = turn[dec[i]];
        if (!r) continue;
        e->step_idx[k] = dec[i], e->step_st[k] = &r->st, e->step_ids[k] = r->next;
        e->pre_ids[k] = &e->step_ids[k], e->pre_n[k] = 1, e->pre_last[k] = 1;
        k++;
    }
    if (!k) return;
    // A decode step whose rows all take the argmax and nothing else has it
    // taken on the device: k ids come back instead of k x V logits.
    int greedy = !k_pre && k <= MODEL_STEP_GRAPH_ROWS;
    for (int i = 0; greedy && i < k; i++)
        greedy = plain_greedy(turn[e->step_idx[i]]);
    int rc;
    if (greedy) {
        rc = model_greedy_queue(&e->run, e->step_st, k, e->step_ids);
        if (rc == 0) rc = model_greedy_take(&e->run, e->sampled);
        if (rc < 0) model_greedy_drain(&e->run); // nothing left in flight (the error is rc's)
        ran->greedy++;
    } else {
        rc = k_pre ? model_prefill_batch(&e->run, e->step_st, k, e->pre_ids, e->pre_n, e->pre_last, e->logits)
                   : model_step_batch(&e->run, e->step_st, k, e->step_ids, e->logits);
    }
    ran->forwards++;
    if (k_pre && k > k_pre) ran->mixed++, ran->rode += (uint64_t)(k - k_pre);
    uint64_t tokens = (uint64_t)(k - k_pre);
    for (int i = 0; i < k_pre; i++)
        tokens += (uint64_t)e->pre_n[i];
    ran->tokens += tokens;
    if (tokens > ran->max_tokens) ran->max_tokens = tokens;
    // Every row with logits draws its token first, the rows side by side
    // (each request's sampler is its own: the same draws whatever the
    // threads): a row takes 10-450 us by vocabulary and settings
    // (bench/bench_sampler.c), 64 of them in turn a good part of a turn.
    if (rc >= 0 && !greedy) {
        const int64_t V = e->m->a.V;
        int n_lg = 0; // the rows with logits, whose logits are packed in their order
        for (int i = 0; i < k; i++)
            if (e->pre_last[i]) e->lg_row[n_lg++] = i;
#pragma omp parallel for schedule(dynamic, 1) if (n_lg > 1)
        for (int j = 0; j < n_lg; j++) {
            const int i = e->lg_row[j];
            req_t *r = turn[e->step_idx[i]];
            const float *row = e->logits + (size_t)j * V;
            e->sampled[i] = sampler_sample_after(&r->smp, row, r->prompt + r->s.n_prompt, r->n_new);
            if (r->s.logprobs) {
                sampler_logprobs(row, (int)V, e->sampled[i], r->s.top_logprobs, &e->lp[i]);
            }
        }
    }
    for (int i = 0; i < k; i++) {
        req_t *r = turn[e->step_idx[i]];
        int gone = rc < 0      ? (finish_error(e, r, rc), 1)
                   : i < k_pre ? chunk_done(e, r, e->pre_n[i], e->pre_last[i], e->sampled[i], &e->lp[i])
                               : emit(e, r, e->sampled[i], &e->lp[i]);
        if (gone) turn[e->step_idx[i]] = NULL;
    }
}

static void publish_gauges(srv_engine_t *e) {
    if (!e->metrics) return;
    int64_t bytes = 0;
    for (int i = 0; i < e->n_active; i++)
        if (e->active[i]->has_state) bytes += (int64_t)e->active[i]->st.bytes;
    srv_metrics_gauges(e->metrics, e->n_queued, e->n_active, bytes);
    publish_pages(e);
}

void srv_engine_run(srv_engine_t *e) {
    if (e->cfg.threads > 0) omp_set_num_threads(e->cfg.threads); // the setting is per thread
    req_t **turn = e->turn;
    int *cancelled = e->turn_cancel;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        // Cancelled waiting requests leave the queue; the rest move up into
        // free slots in arrival order. Only this thread changes `active`.
        req_t *gone = NULL, **pp = &e->q_head;
        e->q_tail = NULL;
        while (*pp) {
            req_t *r = *pp;
            if (r->cancel || e->stopping) {
                *pp = r->link;
                r->link = gone, gone = r;
                e->n_queued--;
            } else {
                e->q_tail = r;
                pp = &r->link;
            }
        }
        // In arrival order (a preempted request first) while pages are free:
        // the oldest waiting request is never passed by a smaller one.
        while (e->q_head && e->n_active < e->cfg.max_seqs && fits(e, e->q_head)) {
            req_t *r = e->q_head;
            r->promised = start_pages(r);
            e->promised += r->promised;
            e->q_head = r->link;
            if (!e->q_head) e->q_tail = NULL;
            e->n_queued--;
            r->link = NULL;
            e->active[e->n_active++] = r;
        }
        int n = e->n_active;
        if (n == 0 && !gone) {
            publish_gauges(e);
            if (e->stopping) break;
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        for (int i = 0; i < n; i++) {
            turn[i] = e->active[i];
            cancelled[i] = e->active[i]->cancel || e->stopping;
        }
        e->n_turn = n;
        const char *why = e->stopping ? "the server is shutting down" : "cancelled";
        publish_gauges(e);
        pthread_mutex_unlock(&e->mu);

        while (gone) {
            req_t *r = gone;
            gone = r->link;
            finish(e, r, SRV_FINISH_CANCELLED, 503, why);
        }
        // One unit of work per running request, all in one forward: a
        // prefill chunk of each request in its prompt (within the token
        // budget: forward), the next token of each decoding one; finished
        // ones leave the slots.
        int n_dec = 0, n_pre = 0;
        for (int i = 0; i < n; i++) {
            req_t *r = turn[i];
            if (!r) continue; // preempted by a request that started before it this turn
            if (cancelled[i]) {
                finish(e, r, SRV_FINISH_CANCELLED, 503, why);
                turn[i] = NULL;
            } else if (!r->has_state && start(e, r)) {
                turn[i] = NULL;
            } else if (r->decoding) {
                e->dec_idx[n_dec++] = i;
            } else {
                e->pre_idx[n_pre++] = i;
            }
        }
        srv_engine_stats_t ran = {0};
        forward(e, turn, e->pre_idx, n_pre, e->dec_idx, n_dec, &ran);
        pthread_mutex_lock(&e->mu);
        e->stats.turns += n_pre + n_dec > 0; // counted apart from the forwards, which should match it
        e->stats.forwards += ran.forwards, e->stats.mixed += ran.mixed, e->stats.rode += ran.rode;
        e->stats.tokens += ran.tokens, e->stats.cut += ran.cut, e->stats.deferred += ran.deferred;
        if (ran.max_tokens > e->stats.max_tokens) e->stats.max_tokens = ran.max_tokens;
        e->stats.steps_replayed = e->run.steps_replayed, e->stats.steps_recorded = e->run.steps_recorded;
        e->stats.steps_op_by_op = e->run.steps_op_by_op;
        e->stats.greedy += ran.greedy;
        if (e->metrics) srv_metrics_engine(e->metrics, &e->stats, e->cfg.max_batched_tokens);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (turn[i]) e->active[k++] = turn[i];
        e->n_active = k;
    }
    e->ran = 1;
    pthread_mutex_unlock(&e->mu);
}

int srv_engine_create(srv_engine_t **out, model_t *m, const srv_engine_cfg_t *cfg, srv_metrics_t *metrics) {
    *out = NULL;
    if (cfg->max_seqs < 1 || cfg->queue < 0 || cfg->ctx < 2 || cfg->chunk < 1 || cfg->n_stop_ids < 0 ||
        cfg->max_batched_tokens < 0)
        return err_set(ERR_INPUT, "engine: max_seqs %d, queue %d, ctx %d, chunk %d, max_batched_tokens %d out of range",
                       cfg->max_seqs, cfg->queue, cfg->ctx, cfg->chunk, cfg->max_batched_tokens);
    srv_engine_t *e = calloc(1, sizeof *e);
    if (!e) return err_set(ERR_NOMEM, "out of memory");
    e->m = m;
    e->cfg = *cfg;
    e->metrics = metrics;
    e->next_id = 1;
    if (metrics) srv_metrics_engine(metrics, &e->stats, cfg->max_batched_tokens); // the budget, before any turn
    // page-locked on a GPU: a turn of 64 rows of 49,152 logits is 12.6 MB
    e->logits = m->be->host_alloc(m->be, (size_t)cfg->max_seqs * m->a.V * sizeof(float));
    e->dec_idx = calloc((size_t)cfg->max_seqs, sizeof *e->dec_idx);
    e->step_idx = calloc((size_t)cfg->max_seqs, sizeof *e->step_idx);
    e->step_st = calloc((size_t)cfg->max_seqs, sizeof *e->step_st);
    e->step_ids = calloc((size_t)cfg->max_seqs, sizeof *e->step_ids);
    e->pre_idx = calloc((size_t)cfg->max_seqs, sizeof *e->pre_idx);
    e->pre_ids = calloc((size_t)cfg->max_seqs, sizeof *e->pre_ids);
    e->pre_n = calloc((size_t)cfg->max_seqs, sizeof *e->pre_n);
    e->pre_last = calloc((size_t)cfg->max_seqs, sizeof *e->pre_last);
    e->sampled = calloc((size_t)cfg->max_seqs, sizeof *e->sampled);
    e->lp = calloc((size_t)cfg->max_seqs, sizeof *e->lp);
    e->lg_row = calloc((size_t)cfg->max_seqs, sizeof *e->lg_row);
    e->active = calloc((size_t)cfg->max_seqs, sizeof *e->active);
    e->turn = calloc((size_t)cfg->max_seqs, sizeof *e->turn);
    e->turn_cancel = calloc((size_t)cfg->max_seqs, sizeof *e->turn_cancel);
    e->stop_ids = malloc(((size_t)cfg->n_stop_ids + 1) * sizeof(int32_t));
    if (!e->logits || !e->active || !e->turn || !e->turn_cancel || !e->stop_ids || !e->dec_idx || !e->step_idx ||
        !e->step_st || !e->step_ids || !e->pre_idx || !e->pre_ids || !e->pre_n || !e->pre_last || !e->sampled ||
        !e->lp || !e->lg_row) {
        srv_engine_free(e);
        return err_set(ERR_NOMEM, "out of memory");
    }
    if (cfg->n_stop_ids) memcpy(e->stop_ids, cfg->stop_ids, (size_t)cfg->n_stop_ids * sizeof(int32_t));
    e->cfg.stop_ids = e->stop_ids;
    int rc = model_run_create(&e->run, m, (size_t)1 << 30);
    if (rc < 0) {
        srv_engine_free(e);
        return rc;
    }
    e->has_run = 1;
    int64_t pages = srv_pool_pages(m, cfg);
    if (pages < 1 || pages > INT32_MAX) {
        int64_t page = model_page_bytes(m);
        srv_engine_free(e);
        return err_set(pages < 1 ? ERR_INPUT : ERR_UNSUP,
                       "the cache budget of %.1f MiB holds %lld pages of %d tokens (%.1f MiB a page, %d sequences' "
                       "recurrent states of %.1f MiB taken first): at least one is needed (hylo serve --cache-mb)",
                       cfg->cache_budget / 1048576.0, (long long)pages, BE_PAGE_ROWS, page / 1048576.0, cfg->max_seqs,
                       model_snapshot_fixed_bytes(m) / 1048576.0);
    }
    rc = model_pool_create(m, &e->pool, (int)pages);
    if (rc < 0) {
        srv_engine_free(e);
        return rc;
    }
    e->has_pool = 1;
    if (cfg->prefix_bytes > 0) {
        rc = srv_prefix_create(&e->prefix, m, &e->pool, cfg->prefix_bytes, cfg->prefix_block);
        if (rc < 0) {
            srv_engine_free(e);
            return rc;
        }
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->sync_init = 1;
    *out = e;
    return 0;
}

int srv_engine_submit(srv_engine_t *e, const srv_submit_t *s, uint64_t *id) {
    if (s->top_logprobs < 0 || s->top_logprobs > SAMPLER_MAX_TOP)
        return err_set(ERR_INPUT, "%d alternative log-probabilities asked for: 0 to %d", s->top_logprobs,
                       SAMPLER_MAX_TOP);
    if (s->n_prompt < 1 || s->max_new < 1 || (int64_t)s->n_prompt + s->max_new > e->cfg.ctx)
        return err_set(ERR_INPUT, "a prompt of %d tokens and %d new ones do not fit the context of %d", s->n_prompt,
                       s->max_new, e->cfg.ctx);
    // a request that could not run even alone in the pool (it would be
    // preempted for itself for ever)
    int need = model_pages_for((int64_t)s->n_prompt + s->max_new);
    if (need > e->pool.n_pages)
        return err_set(ERR_INPUT,
                       "a prompt of %d tokens and %d new ones need %d cache pages of %d tokens (%.1f MiB), more than "
                       "the server's %d (%.1f MiB of its cache budget, hylo serve --cache-mb)",
                       s->n_prompt, s->max_new, need, BE_PAGE_ROWS, need * (double)e->pool.page_bytes / 1048576.0,
                       e->pool.n_pages, e->pool.n_pages * (double)e->pool.page_bytes / 1048576.0);
    // a token the model does not have would fail the forward of every
    // request beside it
    for (int i = 0; i < s->n_prompt; i++)
        if (s->prompt[i] < 0 || s->prompt[i] >= e->m->a.V)
            return err_set(ERR_INPUT, "prompt token %d (at %d) is not in the model's vocabulary [0, %d)", s->prompt[i],
                           i, e->m->a.V);
    pthread_mutex_lock(&e->mu);
    // Room for max_seqs running and queue waiting (the queue is where every
    // request passes through, so it may briefly hold more than `queue`).
    int64_t cap = (int64_t)e->cfg.max_seqs + e->cfg.queue;
    int refuse = e->stopping ? SRV_SHUTTING_DOWN : e->n_active + e->n_queued >= cap ? SRV_QUEUE_FULL : 0;
    pthread_mutex_unlock(&e->mu);
    if (refuse) return refuse;
    const sampler_cfg_t *sc = &s->sampler;
    int bad = sampler_cfg_check(sc, e->m->a.V);
    if (bad < 0) return bad;
    req_t *r = calloc(1, sizeof *r);
    int32_t *p = malloc(((size_t)s->n_prompt + s->max_new) * sizeof(int32_t));
    int nb = sc->n_bias > 0 ? sc->n_bias : 0;
    int32_t *bid = nb ? malloc((size_t)nb * sizeof(int32_t)) : NULL;
    float *bv = nb ? malloc((size_t)nb * sizeof(float)) : NULL;
    if (!r || !p || (nb && (!bid || !bv))) {
        free(r), free(p), free(bid), free(bv);
        return err_set(ERR_NOMEM, "out of memory");
    }
    memcpy(p, s->prompt, (size_t)s->n_prompt * sizeof(int32_t));
    if (nb) memcpy(bid, sc->bias_id, (size_t)nb * sizeof(int32_t)), memcpy(bv, sc->bias, (size_t)nb * sizeof(float));
    r->s = *s;
    r->s.prompt = r->prompt = p;
    r->bias_id = bid, r->bias = bv;
    r->s.sampler.bias_id = bid, r->s.sampler.bias = bv, r->s.sampler.n_bias = nb;
    r->n_feed = s->n_prompt;
    pthread_mutex_lock(&e->mu);
    // Checked again: another thread may have filled the queue meanwhile.
    refuse = e->stopping ? SRV_SHUTTING_DOWN : e->n_active + e->n_queued >= cap ? SRV_QUEUE_FULL : 0;
    if (!refuse) {
        r->id = e->next_id++;
        *id = r->id;
        if (e->q_tail)
            e->q_tail->link = r;
        else
            e->q_head = r;
        e->q_tail = r;
        e->n_queued++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (refuse) free(p), free(bid), free(bv), free(r);
    return refuse;
}

void srv_engine_cancel(srv_engine_t *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    int found = 0;
    for (req_t *r = e->q_head; r && !found; r = r->link)
        if (r->id == id) r->cancel = found = 1;
    for (int i = 0; i < e->n_active && !found; i++)
        if (e->active[i]->id == id) e->active[i]->cancel = found = 1;
    if (found) pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

srv_engine_stats_t srv_engine_stats(srv_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    srv_engine_stats_t s = e->stats;
    pthread_mutex_unlock(&e->mu);
    return s;
}

int srv_engine_ctx(const srv_engine_t *e) { return e->cfg.ctx; }
int srv_engine_pages(const srv_engine_t *e) { return e->pool.n_pages; }

void srv_engine_shutdown(srv_engine_t *e) {
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_free(srv_engine_t *e) {
    if (!e) return;
    if (e->sync_init && !e->ran) { // never run: what was queued still gets its on_done
        srv_engine_shutdown(e);
        srv_engine_run(e);
    }
    if (e->sync_init) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    srv_prefix_free(e->prefix);                       // after the requests, whose records it frees
    if (e->has_pool) model_pool_free(e->m, &e->pool); // after the states and entries that held its pages
    if (e->has_run) model_run_free(&e->run);
    if (e->logits) e->m->be->host_free(e->m->be, e->logits);
    free(e->active);
    free(e->turn);
    free(e->turn_cancel);
    free(e->dec_idx);
    free(e->step_idx);
    free(e->step_st);
    free(e->step_ids);
    free(e->pre_idx), free(e->pre_ids), free(e->pre_n), free(e->pre_last);
    free(e->sampled), free(e->lp), free(e->lg_row);
    free(e->stop_ids);
    free(e);
}
