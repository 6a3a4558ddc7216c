// The adapter between src/eval and the model / generation API of today:
// model_logits_all for log-likelihoods and windows, gen_run (model_prefill /
// model_step with a hybrid cache) for generation. Nothing else in src/eval
// calls src/model or src/infer.
#include "eval/ev_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "base/strbuf.h"
#include "base/timer.h"
#include "infer/gen.h"
#include "model/layer.h"

typedef struct {
    model_t *m;
    model_run_t run; // the evaluation's execution context over m's weights
    int prefill_chunk;
    int32_t stop_ids[16];
    int n_stop;
} impl_t;

// The budget for one model_logits_all call's host logits [B*T, V] (floats).
static const int64_t logits_budget = (int64_t)64 << 20;

// log p(tok) under the logits row x [V], in double; *is_max: tok is the first
// argmax (torch.argmax takes the first of equal maxima).
static double row_logprob(const float *x, int V, int32_t tok, int *is_max) {
    float mx = x[0];
    int am = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > mx) mx = x[v], am = v;
    double z = 0;
    for (int v = 0; v < V; v++)
        z += exp((double)x[v] - mx);
    *is_max = am == tok;
    return (double)x[tok] - mx - log(z);
}

static int impl_loglik(ev_lm_t *lm, const int32_t *ctx, int n_ctx, const ev_span_t *conts, int n_conts, ev_ll_t *out) {
    impl_t *im = lm->impl;
    model_t *m = im->m;
    int V = m->a.V, L = lm->max_len;
    if (n_ctx < 1) return err_set(ERR_INPUT, "log-likelihood request without context tokens");
    int all_single = 1;
    for (int i = 0; i < n_conts; i++) {
        if (conts[i].n > L)
            return err_set(ERR_INPUT, "continuation of %d tokens exceeds the model length %d", conts[i].n, L);
        all_single &= conts[i].n == 1;
    }
    // Every continuation one token: one pass over the (left-truncated) context
    // serves all of them, its last row predicting each continuation.
    if (all_single) {
        int T = n_ctx < L ? n_ctx : L;
        float *lg = malloc((size_t)T * V * sizeof(float));
        if (!lg) return err_set(ERR_NOMEM, "logits for %d tokens", T);
        int rc = model_logits_all(&im->run, ctx + n_ctx - T, 1, T, lg);
        for (int i = 0; rc == 0 && i < n_conts; i++)
            out[i].ll = row_logprob(lg + (int64_t)(T - 1) * V, V, conts[i].ids[0], &out[i].greedy);
        free(lg);
        return rc;
    }
    // Otherwise the choices go through together as one batch of sequences
    // (ctx + cont)[-(L + 1):][:-1], right-padded to the longest: a causal model's
    // rows before the padding do not see it.
    int rc = 0;
    for (int i0 = 0; i0 < n_conts && rc == 0;) {
        int B = 0, T = 0;
        while (i0 + B < n_conts) {
            int len = n_ctx + conts[i0 + B].n, start = len - (L + 1) > 0 ? len - (L + 1) : 0;
            int Ti = len - 1 - start, Tn = Ti > T ? Ti : T;
            if (B > 0 && (int64_t)(B + 1) * Tn * V > logits_budget) break;
            T = Tn, B++;
        }
        int32_t *ids = calloc((size_t)B * T, sizeof(int32_t));
        float *lg = malloc((size_t)B * T * V * sizeof(float));
        if (!ids || !lg) rc = err_set(ERR_NOMEM, "logits for %d x %d tokens", B, T);
        for (int b = 0; rc == 0 && b < B; b++) {
            const ev_span_t *c = &conts[i0 + b];
            int len = n_ctx + c->n;
            int s = len - (L + 1) > 0 ? len - (L + 1) : 0;
            for (int t = 0; t < len - 1 - s; t++) {
                int p = s + t;
                ids[(size_t)b * T + t] = p < n_ctx ? ctx[p] : c->ids[p - n_ctx];
            }
        }
        if (rc == 0) rc = model_logits_all(&im->run, ids, B, T, lg);
        for (int b = 0; rc == 0 && b < B; b++) {
            const ev_span_t *c = &conts[i0 + b];
            int len = n_ctx + c->n, s = len - (L + 1) > 0 ? len - (L + 1) : 0;
            ev_ll_t *o = &out[i0 + b];
            o->ll = 0, o->greedy = 1;
            for (int k = 0; k < c->n; k++) {
                int row = n_ctx + k - 1 - s; // the input position that predicts continuation token k
                int is_max;
                o->ll += row_logprob(lg + ((int64_t)b * T + row) * V, V, c->ids[k], &is_max);
                o->greedy &= is_max;
            }
        }
        free(ids);
        free(lg);
        i0 += B;
    }
    return rc;
}

static int impl_window(ev_lm_t *lm, const int32_t *ids, int n, int first, double *lp) {
    impl_t *im = lm->impl;
    int V = im->m->a.V, T = n - 1;
    if (first < 1 || first >= n || T > lm->max_len)
        return err_set(ERR_INPUT, "window of %d tokens scoring from %d (model length %d)", n, first, lm->max_len);
    float *lg = malloc((size_t)T * V * sizeof(float));
    if (!lg) return err_set(ERR_NOMEM, "logits for a window of %d tokens", T);
    int rc = model_logits_all(&im->run, ids, 1, T, lg);
    for (int i = first; rc == 0 && i < n; i++) {
        int is_max;
        lp[i] = row_logprob(lg + (int64_t)(i - 1) * V, V, ids[i], &is_max);
    }
    free(lg);
    return rc;
}

typedef struct {
    const tok_t *tok;
    tok_stream_t ts;
    strbuf_t text;
    const char *const *stops;
    int n_stops, hit;
    size_t max_stop;
} gen_cb_t;

// Index of the earliest occurrence of any stop string in s, or -1.
static long first_stop(const char *s, const char *const *stops, int n) {
    long best = -1;
    for (int i = 0; i < n; i++) {
        if (!stops[i][0]) continue;
        const char *p = strstr(s, stops[i]);
        if (p && (best < 0 || p - s < best)) best = p - s;
    }
    return best;
}

static int on_token(void *user, int32_t id) {
    gen_cb_t *g = user;
    const char *piece;
    size_t len;
    if (tok_stream_feed(&g->ts, id, &piece, &len) < 0) return 1;
    size_t before = g->text.n;
    strbuf_putn(&g->text, piece, len);
    if (g->text.oom || !g->n_stops || !g->text.s) return g->text.oom;
    // only the tail can hold a stop string that was not there before
    size_t from = before > g->max_stop ? before - g->max_stop : 0;
    if (first_stop(g->text.s + from, g->stops, g->n_stops) >= 0) g->hit = 1;
    return g->hit;
}

static int impl_generate(ev_lm_t *lm, const int32_t *prompt, int n_prompt, int max_new, const char *const *stops,
                         int n_stops, ev_gen_t *out) {
    impl_t *im = lm->impl;
    memset(out, 0, sizeof *out);
    model_state_t st;
    TRY(model_state_alloc(im->m, &st, 1, n_prompt + max_new + 1));
    gen_cfg_t cfg = {.max_new = max_new,
                     .sampler = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1},
                     .stop = im->stop_ids,
                     .n_stop = im->n_stop,
                     .prefill_chunk = im->prefill_chunk};
    gen_cb_t g = {.tok = lm->tok, .stops = stops, .n_stops = n_stops};
    for (int i = 0; i < n_stops; i++)
        if (strlen(stops[i]) > g.max_stop) g.max_stop = strlen(stops[i]);
    tok_stream_init(&g.ts, lm->tok, TOK_SKIP_SPECIAL);
    gen_stats_t stats;
    int rc = gen_run(&im->run, &st, prompt, n_prompt, &cfg, on_token, &g, &stats);
    const char *piece;
    size_t len;
    if (rc == 0 && tok_stream_flush(&g.ts, &piece, &len) == 0) strbuf_putn(&g.text, piece, len);
    tok_stream_free(&g.ts);
    model_state_free(im->m, &st);
    if (rc == 0 && g.text.oom) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc < 0) {
        free(g.text.s);
        return rc;
    }
    if (!g.text.s) strbuf_puts(&g.text, "");
    long cut = first_stop(g.text.s ? g.text.s : "", stops, n_stops);
    if (cut >= 0) g.text.s[cut] = 0;
    out->text = g.text.s;
    if (!out->text) return err_set(ERR_NOMEM, "out of memory");
    out->n_new = stats.n_new;
    out->stopped = stats.stopped || cut >= 0;
    out->prefill_s = stats.prefill_s, out->decode_s = stats.decode_s;
    return 0;
}

int ev_model_wrap(ev_lm_t *lm, model_t *m, const tok_t *tok, int max_len, int prefill_chunk) {
    memset(lm, 0, sizeof *lm);
    impl_t *im = calloc(1, sizeof *im);
    if (!im) return err_set(ERR_NOMEM, "out of memory");
    im->m = m;
    int rc = model_run_create(&im->run, m, (size_t)1 << 30);
    if (rc < 0) {
        free(im);
        return rc;
    }
    im->prefill_chunk = prefill_chunk;
    im->n_stop = gen_stop_ids(tok, &m->a, im->stop_ids, 16);
    lm->impl = im;
    lm->tok = tok;
    lm->max_len = max_len > 0 ? max_len : m->a.max_pos > 0 ? m->a.max_pos : 2048;
    lm->prefix_id = tok->bos >= 0 ? tok->bos : tok->eos;
    lm->loglik = impl_loglik;
    lm->window = impl_window;
    lm->generate = impl_generate;
    return 0;
}

void ev_model_unwrap(ev_lm_t *lm) {
    impl_t *im = lm->impl;
    if (im) model_run_free(&im->run);
    free(im);
    memset(lm, 0, sizeof *lm);
}

int ev_model_bench(ev_lm_t *lm, int T, int n_decode, uint64_t seed, ev_bench_t *out) {
    impl_t *im = lm->impl;
    model_t *m = im->m;
    memset(out, 0, sizeof *out);
    out->T = T, out->n_decode = n_decode;
    int32_t *ids = malloc((size_t)T * sizeof(int32_t));
    float *logits = malloc((size_t)m->a.V * sizeof(float));
    if (!ids || !logits) {
        free(ids), free(logits);
        return err_set(ERR_NOMEM, "out of memory");
    }
    rng_t r;
    rng_seed(&r, seed);
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)(rng_u64(&r) % (uint64_t)m->a.V);
    model_state_t st;
    // two untimed decode steps before the timed ones: the first runs op by op,
    // the second records the step's graph (model.c step_forward)
    const int warm = n_decode > 0 ? 2 : 0;
    int rc = model_state_alloc(m, &st, 1, T + warm + n_decode + 1);
    // the whole room at once: no growth inside the timed prefill and decode
    if (rc == 0 && (rc = model_state_reserve(m, &st, T + warm + n_decode + 1)) < 0) model_state_free(m, &st);
    if (rc == 0) {
        out->cache_bytes = st.bytes;
        double t0 = time_now();
        rc = model_prefill(&im->run, &st, ids, T, im->prefill_chunk, logits);
        out->prefill_s = time_now() - t0;
        t0 = time_now();
        for (int i = 0; rc == 0 && i < warm + n_decode; i++) {
            if (i == warm) t0 = time_now();
            int32_t id = 0;
            for (int v = 1; v < m->a.V; v++)
                if (logits[v] > logits[id]) id = v;
            rc = model_step(&im->run, &st, &id, logits);
        }
        out->decode_s = time_now() - t0;
        model_state_free(m, &st);
    }
    out->weight_bytes = (size_t)m->pt.total * m->be->act_size;
    free(ids), free(logits);
    return rc;
}

void ev_model_info(const ev_lm_t *lm, ev_model_info_t *info) {
    const impl_t *im = lm->impl;
    const arch_t *a = &im->m->a;
    memset(info, 0, sizeof *info);
    snprintf(info->arch, sizeof info->arch, "%s", a->model_type);
    snprintf(info->backend, sizeof info->backend, "%s", im->m->be->name);
    snprintf(info->mixers, sizeof info->mixers, "attention %d, MLA %d, GDN %d, Mamba-2 %d", arch_count(a, LAYER_ATTN),
             arch_count(a, LAYER_MLA), arch_count(a, LAYER_GDN), arch_count(a, LAYER_M2));
    info->params = ptable_count(&im->m->pt);
    info->n_layers = a->n_layers, info->V = a->V, info->max_pos = a->max_pos;
}
