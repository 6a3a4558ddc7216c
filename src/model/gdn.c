// Gated DeltaNet token mixer: weight views, saved activations, forward,
// backward, decode step (contract in model/layer.h, math in spec
// linear_blocks.md section 1; the rule itself is the backend's gdn_* ops).
//
// Forward, per token (N = B*T rows):
//   q~ = x Wq^T, k~ = x Wk^T, v~ = x Wv^T, a = x Wa^T, b = x Wb^T, z = x Wg^T
//   q = l2norm(silu(conv_q(q~))), k = l2norm(silu(conv_k(k~))) per head of K (eps 1e-6)
//   v = silu(conv_v(v~))
//   g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) (x2 with allow_neg_eigval)
//   o = gated delta rule(q, k, v, g, beta), scale K^-1/2
//   y = rmsnorm(o) * o_norm * silu(z) per value head over Dv (norm, then gate)
//   out = y Wo^T
// Without use_gate (no g_proj): y = rmsnorm(o) * o_norm, the plain RMSNorm
// over Dv per value head that FLA uses in that case.
#include "model/gdn.h"

#include <math.h>
#include <string.h>

#include "base/err.h"
#include "model/bind.h"
#include "model/linear.h"

// ---- weight views ------------------------------------------------------------

int gdn_w_bind(gdn_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer) {
    TRY(bind_param(&w->q_proj, pt, flat, elt_size, layer, "gdn.q_proj.weight", 0));
    TRY(bind_param(&w->k_proj, pt, flat, elt_size, layer, "gdn.k_proj.weight", 0));
    TRY(bind_param(&w->v_proj, pt, flat, elt_size, layer, "gdn.v_proj.weight", 0));
    TRY(bind_param(&w->a_proj, pt, flat, elt_size, layer, "gdn.a_proj.weight", 0));
    TRY(bind_param(&w->b_proj, pt, flat, elt_size, layer, "gdn.b_proj.weight", 0));
    TRY(bind_param(&w->A_log, pt, flat, elt_size, layer, "gdn.A_log", 0));
    TRY(bind_param(&w->dt_bias, pt, flat, elt_size, layer, "gdn.dt_bias", 0));
    TRY(bind_param(&w->q_conv, pt, flat, elt_size, layer, "gdn.q_conv1d.weight", 0));
    TRY(bind_param(&w->k_conv, pt, flat, elt_size, layer, "gdn.k_conv1d.weight", 0));
    TRY(bind_param(&w->v_conv, pt, flat, elt_size, layer, "gdn.v_conv1d.weight", 0));
    TRY(bind_param(&w->g_proj, pt, flat, elt_size, layer, "gdn.g_proj.weight", 1));
    TRY(bind_param(&w->o_norm, pt, flat, elt_size, layer, "gdn.o_norm.weight", 0));
    TRY(bind_param(&w->o_proj, pt, flat, elt_size, layer, "gdn.o_proj.weight", 0));
    return 0;
}

// ---- helpers -----------------------------------------------------------------

typedef struct {
    int d, H, HV, K, Dv, W, use_gate, allow_neg;
    int64_t kd, vd;
    float eps, scale;
} dims_t;

static dims_t dims(const layer_ctx_t *c) {
    const gdn_dims_t *g = &c->a->gdn;
    dims_t m = {.d = c->a->d,
                .H = g->n_heads,
                .HV = g->n_v_heads,
                .K = g->head_k,
                .Dv = g->head_v,
                .W = g->conv,
                .use_gate = g->use_gate,
                .allow_neg = g->allow_neg_eigval,
                .eps = g->norm_eps};
    m.kd = (int64_t)m.H * m.K;
    m.vd = (int64_t)m.HV * m.Dv;
    m.scale = 1.0f / sqrtf((float)m.K);
    return m;
}

// A copy of a cache tensor in the arena (the backward needs the initial
// states, the forward overwrites them).
static void *copy_act(const layer_ctx_t *c, const void *src, int64_t n) {
    void *p = ctx_act(c, n);
    if (p) c->be->copy_d2d(c->be, p, src, (size_t)n * c->be->act_size);
    return p;
}

#define NEED(p)                                                                                                        \
    do {                                                                                                               \
        if (!(p)) return err_wrap(ERR_NOMEM, "gdn layer %d: ", c->layer);                                              \
    } while (0)

// ---- forward -----------------------------------------------------------------

// Between the projections and the output norm of a forward: the convs, the
// L2 norms, the gates and the chunked rule into s (N rows). rs->sq.n > 0:
// inference over caches, every sequence of every run in one call per op
// (rs from run_seqs); else one run (training; gc its cache, whose entering
// windows and state s keeps for the backward).
static int gdn_run_rule(const layer_ctx_t *c, const gdn_w_t *w, gdn_saved_t *s, const run_seqs_t *rs,
                        const step_run_t *run, const gdn_cache_t *gc, int64_t N, dims_t m) {
    be_t *be = c->be;
    const int B = run->n, T = run->T, kd = (int)m.kd, vd = (int)m.vd, n = rs->sq.n;
    if (gc) {
        NEED(s->conv0_q = copy_act(c, gc->conv_q, (int64_t)B * m.kd * m.W));
        NEED(s->conv0_k = copy_act(c, gc->conv_k, (int64_t)B * m.kd * m.W));
        NEED(s->conv0_v = copy_act(c, gc->conv_v, (int64_t)B * m.vd * m.W));
    }
    NEED(s->v = ctx_act(c, N * m.vd));
    NEED(s->q = ctx_act(c, N * m.kd));
    NEED(s->k = ctx_act(c, N * m.kd));
    NEED(s->g = ctx_f32(c, N * m.HV));
    NEED(s->beta = ctx_f32(c, N * m.HV));
    void *qc, *kc;
    NEED(qc = ctx_act(c, N * m.kd));
    NEED(kc = ctx_act(c, N * m.kd));
    if (n) { // windows: rs->base[n + i], [2n + i], [3n + i] (step_cache_bases)
        be->conv1d_seqs(be, qc, s->qpre, kd, w->q_conv, NULL, rs->base + n, rs->sq, kd, m.W, 1);
        be->conv1d_seqs(be, kc, s->kpre, kd, w->k_conv, NULL, rs->base + 2 * n, rs->sq, kd, m.W, 1);
        be->conv1d_seqs(be, s->v, s->vpre, vd, w->v_conv, NULL, rs->base + 3 * n, rs->sq, vd, m.W, 1);
    } else {
        be->conv1d_fwd(be, qc, s->qpre, kd, w->q_conv, NULL, gc ? gc->conv_q : NULL, B, T, kd, m.W, 1);
        be->conv1d_fwd(be, kc, s->kpre, kd, w->k_conv, NULL, gc ? gc->conv_k : NULL, B, T, kd, m.W, 1);
        be->conv1d_fwd(be, s->v, s->vpre, vd, w->v_conv, NULL, gc ? gc->conv_v : NULL, B, T, vd, m.W, 1);
        if (gc) { // roll each sequence's window forward
            be->conv1d_update_state(be, gc->conv_q, s->qpre, kd, B, T, kd, m.W);
            be->conv1d_update_state(be, gc->conv_k, s->kpre, kd, B, T, kd, m.W);
            be->conv1d_update_state(be, gc->conv_v, s->vpre, vd, B, T, vd, m.W);
        }
    }

    // L2 norm of q and k per head (rows of K), gates
    NEED(s->rq = ctx_f32(c, N * m.H));
    NEED(s->rk = ctx_f32(c, N * m.H));
    be->l2norm_fwd(be, s->q, s->rq, qc, m.K, N * m.H, m.K, 1e-6f);
    be->l2norm_fwd(be, s->k, s->rk, kc, m.K, N * m.H, m.K, 1e-6f);
    be->gdn_gate_fwd(be, s->g, s->beta, s->a, m.HV, s->b, m.HV, w->A_log, w->dt_bias, N, m.HV, m.allow_neg);

    // the rule; a cache's state is the initial state and receives the final one
    NEED(s->o = ctx_act(c, N * m.vd));
    if (n) {
        be->gdn_chunk_seqs(be, s->o, rs->base, s->q, s->k, s->v, s->g, s->beta, m.scale, rs->sq, m.H, m.HV, m.K, m.Dv);
        return 0;
    }
    if (gc) {
        int64_t ns = (int64_t)B * m.HV * m.Dv * m.K;
        NEED(s->state0 = ctx_f32(c, ns));
        be->copy_d2d(be, s->state0, gc->state, (size_t)ns * sizeof(float));
    }
    be->gdn_chunk_fwd(be, s->o, gc ? gc->state : NULL, gc != NULL, s->q, s->k, s->v, s->g, s->beta, m.scale, B, T, m.H,
                      m.HV, m.K, m.Dv);
    return 0;
}

// q, k, v, a, b (and g) one matrix in memory: row r [q | k | v | a | b | z]
// (act, or one block format: lin_joint).
static int proj_adjacent(const layer_ctx_t *c, const gdn_w_t *w, const dims_t *m, int64_t *P) {
    const void *ws[6] = {w->q_proj, w->k_proj, w->v_proj, w->a_proj, w->b_proj, w->g_proj};
    const int64_t outs[6] = {m->kd, m->kd, m->vd, m->HV, m->HV, m->vd};
    const int nw = m->use_gate ? 6 : 5;
    *P = 0;
    for (int i = 0; i < nw; i++)
        *P += outs[i];
    return lin_joint(c, ws, outs, nw, m->d);
}

int gdn_step_norms_input(const layer_ctx_t *c, const gdn_w_t *w) {
    dims_t m = dims(c);
    int64_t P;
    return proj_adjacent(c, w, &m, &P);
}

// Shared by gdn_forward (chunked rule over T tokens) and gdn_step (T = 1, the
// token-by-token recurrence): the projections and o_proj are the same code;
// between them a forward runs the convs, norms, gates, the chunked rule and
// the output norm op by op, a step all of it in one be->gdn_step call. The
// sequences come in runs (layer.h step_run_t; a forward without a cache: one
// run without states): in a forward the products, norms and gates run once
// over the rows of all runs, the convolutions and the rule in one call per
// op over every run's sequences, each on its own states (gdn_run_rule); in a
// step all of it once over all rows, through per-row state pointers. sv
// (training): one run.
static int gdn_run(const layer_ctx_t *c, const gdn_w_t *w, const lin_out_t *out, const void *x, const void *xw,
                   const step_run_t *runs, int n_runs, gdn_saved_t *sv, int recurrent) {
    be_t *be = c->be;
    dims_t m = dims(c);
    int64_t N = recurrent ? step_rows(runs, n_runs) : run_rows(runs, n_runs);
    // training through a cache keeps the entering states (gdn_forward: one run, the whole cache)
    const gdn_cache_t *gc = sv && runs[0].cache ? &runs[0].cache->u.gdn : NULL;
    const int B = runs[0].n;                  // the saved state's sequences (sv has one run)
    gdn_saved_t local, *s = sv ? sv : &local; // inference: the same buffers, dropped with the arena
    memset(s, 0, sizeof *s);
    s->B = B, s->T = runs[0].T, s->x = x;

    // projections; a decode step multiplies by q, k, v, a, b and g at once
    // when they are one matrix in memory (row r: [q | k | v | a | b | z],
    // row stride ldp; act, or one block format), one product instead of six;
    // that product norms the residual stream itself when given its gain xw
    // (gdn_step_norms_input)
    int64_t ldp[6] = {m.kd, m.kd, m.vd, m.HV, m.HV, m.vd}, P;
    const int adjacent = proj_adjacent(c, w, &m, &P);
    if (xw && !(recurrent && adjacent))
        return err_set(ERR_UNSUP, "GDN step: an input norm needs the joint input product (gdn_step_norms_input)");
    if (recurrent && adjacent) {
        void *pr;
        NEED(pr = ctx_act(c, N * P));
        lin_fwd_normed(c, pr, x, xw, w->q_proj, N, m.d, P);
        s->qpre = pr, s->kpre = act_at(be, pr, m.kd), s->vpre = act_at(be, pr, 2 * m.kd);
        s->a = act_at(be, pr, 2 * m.kd + m.vd), s->b = act_at(be, pr, 2 * m.kd + m.vd + m.HV);
        if (m.use_gate) s->z = act_at(be, pr, 2 * m.kd + m.vd + 2 * m.HV);
        for (int i = 0; i < 6; i++)
            ldp[i] = P;
    } else {
        NEED(s->qpre = ctx_act(c, N * m.kd));
        NEED(s->kpre = ctx_act(c, N * m.kd));
        NEED(s->vpre = ctx_act(c, N * m.vd));
        NEED(s->a = ctx_act(c, N * m.HV));
        NEED(s->b = ctx_act(c, N * m.HV));
        lin_fwd(c, s->qpre, x, w->q_proj, N, m.d, m.kd);
        lin_fwd(c, s->kpre, x, w->k_proj, N, m.d, m.kd);
        lin_fwd(c, s->vpre, x, w->v_proj, N, m.d, m.vd);
        lin_fwd(c, s->a, x, w->a_proj, N, m.d, m.HV);
        lin_fwd(c, s->b, x, w->b_proj, N, m.d, m.HV);
        if (m.use_gate) {
            NEED(s->z = ctx_act(c, N * m.vd));
            lin_fwd(c, s->z, x, w->g_proj, N, m.d, m.vd);
        }
    }

    // a decode step: every row's state and windows by pointer (layer.h
    // step_cache_bases: states, then the q, k, v windows); convs, norms,
    // gates, the rule and the output norm in one call (on the GPU one launch
    // instead of three)
    if (recurrent) {
        void *const *rows;
        NEED(rows = ctx_step_caches(c, runs, n_runs));
        NEED(s->y = ctx_act(c, N * m.vd));
        be->gdn_step(be, s->y, rows, s->qpre, ldp[0], s->kpre, ldp[1], s->vpre, ldp[2], s->a, ldp[3], s->b, ldp[4],
                     s->z, ldp[5], w->q_conv, w->k_conv, w->v_conv, w->A_log, w->dt_bias, w->o_norm, m.scale, (int)N,
                     m.H, m.HV, m.K, m.Dv, m.W, 1e-6f, m.eps, m.allow_neg);
        return lin_fwd_out(c, out, s->y, w->o_proj, N, m.vd);
    }

    // short convs + SiLU, three separate depthwise convs; with a cache they
    // continue from its last W inputs, which are then rolled forward.
    // Inference over caches takes every sequence of every run in one call
    // per op (backend.h be_seqs_t); training, one run, the uniform ops.
    run_seqs_t rs = {0};
    if (!sv && runs[0].cache) TRY(run_seqs(c, runs, n_runs, &rs));
    int rc = gdn_run_rule(c, w, s, &rs, &runs[0], gc, N, m);
    run_seqs_free(&rs);
    TRY(rc);

    // output norm (per value head over Dv, one shared weight of Dv), gate, o_proj
    NEED(s->y = ctx_act(c, N * m.vd));
    NEED(s->rstd = ctx_f32(c, N * m.HV));
    if (m.use_gate)
        be->gated_rmsnorm_fwd(be, s->y, s->rstd, s->o, s->z, m.vd, w->o_norm, m.Dv, N, m.HV, m.Dv, m.eps,
                              GNORM_NORM_THEN_GATE);
    else
        be->rmsnorm_fwd(be, s->y, s->rstd, s->o, w->o_norm, N * m.HV, m.Dv, m.eps);
    return lin_fwd_out(c, out, s->y, w->o_proj, N, m.vd);
}

int gdn_forward(const layer_ctx_t *c, const gdn_w_t *w, void *out, const void *x, int B, int T, int pos0,
                layer_cache_t *cache, gdn_saved_t *sv) {
    if (cache && cache->B != B)
        return err_set(ERR_INPUT, "gdn layer %d: cache holds %d sequences, input has %d", c->layer, cache->B, B);
    step_run_t all = {cache, 0, B, T, pos0};
    return gdn_run(c, w, &(lin_out_t){.y = out}, x, NULL, &all, 1, sv, 0);
}

int gdn_forward_runs(const layer_ctx_t *c, const gdn_w_t *w, void *out, const void *x, int n_runs,
                     const step_run_t *runs) {
    TRY(forward_runs_check(runs, n_runs));
    return gdn_run(c, w, &(lin_out_t){.y = out}, x, NULL, runs, n_runs, NULL, 0);
}

// ---- backward ----------------------------------------------------------------

int gdn_backward(const layer_ctx_t *c, const gdn_w_t *w, gdn_w_t *g, void *dx, const void *dout,
                 const gdn_saved_t *sv) {
    be_t *be = c->be;
    dims_t m = dims(c);
    const gdn_saved_t *s = sv;
    int B = s->B, T = s->T;
    int64_t N = (int64_t)B * T;

    // o_proj
    void *dy;
    NEED(dy = ctx_act(c, N * m.vd));
    lin_bwd(be, dy, 0, g->o_proj, dout, s->y, w->o_proj, N, m.vd, m.d);

    // output norm (+ gate)
    void *dO, *dz = NULL;
    NEED(dO = ctx_act(c, N * m.vd));
    if (m.use_gate) {
        NEED(dz = ctx_act(c, N * m.vd));
        be->gated_rmsnorm_bwd(be, dO, dz, m.vd, g->o_norm, dy, s->o, s->z, m.vd, w->o_norm, m.Dv, s->rstd, N, m.HV,
                              m.Dv, GNORM_NORM_THEN_GATE);
    } else {
        be->rmsnorm_bwd(be, dO, g->o_norm, dy, s->o, w->o_norm, s->rstd, N * m.HV, m.Dv);
    }

    // the rule (the initial state's gradient, when there was one, is dropped:
    // caches are not trained)
    void *dq, *dk, *dv;
    float *dg, *dbeta, *dstate0 = NULL;
    NEED(dq = ctx_act(c, N * m.kd));
    NEED(dk = ctx_act(c, N * m.kd));
    NEED(dv = ctx_act(c, N * m.vd));
    NEED(dg = ctx_f32(c, N * m.HV));
    NEED(dbeta = ctx_f32(c, N * m.HV));
    if (s->state0) NEED(dstate0 = ctx_f32(c, (int64_t)B * m.HV * m.Dv * m.K));
    be->gdn_chunk_bwd(be, dq, dk, dv, dg, dbeta, dstate0, dO, NULL, s->q, s->k, s->v, s->g, s->beta, s->state0, m.scale,
                      B, T, m.H, m.HV, m.K, m.Dv);

    // gates
    void *da, *db;
    NEED(da = ctx_act(c, N * m.HV));
    NEED(db = ctx_act(c, N * m.HV));
    be->gdn_gate_bwd(be, da, m.HV, db, m.HV, g->A_log, g->dt_bias, dg, dbeta, s->a, m.HV, s->b, m.HV, w->A_log,
                     w->dt_bias, N, m.HV, m.allow_neg);

    // L2 norms
    void *dqc, *dkc;
    NEED(dqc = ctx_act(c, N * m.kd));
    NEED(dkc = ctx_act(c, N * m.kd));
    be->l2norm_bwd(be, dqc, m.K, dq, s->q, s->rq, N * m.H, m.K);
    be->l2norm_bwd(be, dkc, m.K, dk, s->k, s->rk, N * m.H, m.K);

    // convs + SiLU (reusing dq, dk, dv as the gradients of the projections)
    be->conv1d_bwd(be, dq, m.kd, g->q_conv, NULL, NULL, dqc, s->qpre, m.kd, w->q_conv, NULL, s->conv0_q, B, T,
                   (int)m.kd, m.W, 1);
    be->conv1d_bwd(be, dk, m.kd, g->k_conv, NULL, NULL, dkc, s->kpre, m.kd, w->k_conv, NULL, s->conv0_k, B, T,
                   (int)m.kd, m.W, 1);
    void *dvpre;
    NEED(dvpre = ctx_act(c, N * m.vd));
    be->conv1d_bwd(be, dvpre, m.vd, g->v_conv, NULL, NULL, dv, s->vpre, m.vd, w->v_conv, NULL, s->conv0_v, B, T,
                   (int)m.vd, m.W, 1);

    // projections: dx = sum of the six input gradients
    lin_bwd(be, dx, 0, g->q_proj, dq, s->x, w->q_proj, N, m.d, m.kd);
    lin_bwd(be, dx, 1, g->k_proj, dk, s->x, w->k_proj, N, m.d, m.kd);
    lin_bwd(be, dx, 1, g->v_proj, dvpre, s->x, w->v_proj, N, m.d, m.vd);
    lin_bwd(be, dx, 1, g->a_proj, da, s->x, w->a_proj, N, m.d, m.HV);
    lin_bwd(be, dx, 1, g->b_proj, db, s->x, w->b_proj, N, m.d, m.HV);
    if (m.use_gate) lin_bwd(be, dx, 1, g->g_proj, dz, s->x, w->g_proj, N, m.d, m.vd);
    return 0;
}

// ---- decode step ---------------------------------------------------------------

int gdn_step(const layer_ctx_t *c, const gdn_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
             const step_run_t *runs) {
    TRY(step_check(c, runs, n_runs, 0, 0));
    return gdn_run(c, w, out, x, xw, runs, n_runs, NULL, 1);
}
