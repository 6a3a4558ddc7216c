// Mamba-2 mixer, Zebra-Llama / MambaInLlama layout (see m2.h). Forward:
//   zxbcdt = x W_in^T                       [N, 2 di + 2 dxb + H]: z | xBC | dt
//   xBC'   = silu(conv1d(xBC) + bias)       channels x (dxb) | B (dxb) | C (di)
//   dt'    = softplus(dt + dt_bias)
//   y      = SSD(x, B, C, dt', A_log, D)    P = headdim, N = d_state
//   yn     = rmsnorm_groups(y * silu(z)) w  groups of headdim
//   out    = yn W_out^T
// The backward follows the memory-efficient path of the spec (§3.7): only the
// in_proj output, dt', the SSD output and the norm's rstd are saved; the conv
// output and the normed output are recomputed.
#include "model/m2.h"

#include "base/err.h"
#include "model/bind.h"
#include "model/linear.h"

int m2_w_bind(m2_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer) {
    TRY(bind_param(&w->in_proj, pt, flat, elt_size, layer, "mamba.in_proj.weight", 0));
    TRY(bind_param(&w->conv_w, pt, flat, elt_size, layer, "mamba.conv1d.weight", 0));
    TRY(bind_param(&w->conv_b, pt, flat, elt_size, layer, "mamba.conv1d.bias", 0));
    TRY(bind_param(&w->dt_bias, pt, flat, elt_size, layer, "mamba.dt_bias", 0));
    TRY(bind_param(&w->A_log, pt, flat, elt_size, layer, "mamba.A_log", 0));
    TRY(bind_param(&w->D, pt, flat, elt_size, layer, "mamba.D", 0));
    TRY(bind_param(&w->norm, pt, flat, elt_size, layer, "mamba.norm.weight", 0));
    TRY(bind_param(&w->out_proj, pt, flat, elt_size, layer, "mamba.out_proj.weight", 0));
    return 0;
}

// Sizes of the layer, from arch.m2.
typedef struct {
    int d, di, dxb, H, P, Ns, W, chunk;
    int Hx, GB, GC;      // x heads, B groups, C groups of the SSD
    int64_t cd, din;     // conv channels (di + 2 dxb), in_proj rows (2 di + 2 dxb + H)
    int64_t o_xbc, o_dt; // column offsets of xBC and dt in zxbcdt (z is at 0)
    float eps;
} m2_shape_t;

static m2_shape_t m2_shape(const arch_t *a) {
    const m2_dims_t *m = &a->m2;
    m2_shape_t s = {.d = a->d,
                    .di = m->d_inner,
                    .dxb = m->d_xb,
                    .H = m->n_heads,
                    .P = m->headdim,
                    .Ns = m->d_state,
                    .W = m->conv,
                    .chunk = m->chunk,
                    .eps = m->norm_eps};
    // Whole x heads and B, C groups that each serve an equal share of the heads
    // (arch_validate checks it).
    s.Hx = s.dxb / s.P;  // MambaInLlama: x at KV width, one x head per KV head
    s.GB = s.dxb / s.Ns; // B likewise (P = N = teacher head dim)
    s.GC = s.di / s.Ns;  // C per head
    s.cd = (int64_t)s.di + 2 * (int64_t)s.dxb;
    s.din = s.cd + s.di + s.H;
    s.o_xbc = s.di;
    s.o_dt = s.di + s.cd;
    return s;
}

// The mixer over the rows of runs (layer.h step_run_t; a forward without a
// cache: one run without states). recurrent: SSD token by token (decode
// steps), else chunked. In a forward the products and norms run once over
// the rows of all runs, the convolution and the SSD in one call each over
// every run's sequences, each on its own states; in a step all of it once
// over all rows, through per-row state pointers. sv (training): one run.
static int m2_run(const layer_ctx_t *c, const m2_w_t *w, const lin_out_t *out, const void *x, const step_run_t *runs,
                  int n_runs, m2_saved_t *sv, int recurrent) {
    be_t *be = c->be;
    m2_shape_t s = m2_shape(c->a);
    const int B = runs[0].n, T = runs[0].T; // (the saved state's sequences: sv has one run)
    int64_t N = recurrent ? step_rows(runs, n_runs) : run_rows(runs, n_runs);
    int64_t per_conv = (int64_t)s.cd * s.W, per_state = (int64_t)s.H * s.P * s.Ns;
    int64_t n_conv = (int64_t)B * per_conv, n_state = (int64_t)B * per_state;
    if (recurrent && !runs[0].cache)
        return err_set(ERR_INPUT, "Mamba-2 layer %d: a decode step needs a cache", c->layer);
    size_t mark = arena_mark(c->arena);

    // Entering states. len == 0 starts a sequence: zero them so a reused slot never leaks.
    for (int i = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        if (!k || k->len > 0) continue;
        TRY(be->memset0(be, act_at(be, k->u.m2.conv, runs[i].seq0 * per_conv),
                        (size_t)(runs[i].n * per_conv) * be->act_size));
        TRY(be->memset0(be, k->u.m2.state + runs[i].seq0 * per_state, (size_t)(runs[i].n * per_state) * sizeof(float)));
    }
    // training through a cache keeps the entering states (m2_forward: one run, the whole cache)
    int carried = runs[0].cache && runs[0].cache->len > 0;
    void *conv_state = runs[0].cache ? runs[0].cache->u.m2.conv : NULL;
    float *ssm_state = runs[0].cache ? runs[0].cache->u.m2.state : NULL;

    // What the backward keeps first, then temporaries (released at the end).
    void *zxbcdt = ctx_act(c, N * s.din), *y = ctx_act(c, N * s.di);
    float *dt = ctx_f32(c, N * s.H), *rstd = ctx_f32(c, N * s.H);
    if (!zxbcdt || !y || !dt || !rstd) return ERR_NOMEM;
    void *conv0 = NULL;
    float *state0 = NULL;
    if (sv && carried) { // training through a cache: the backward needs the entering states
        conv0 = ctx_act(c, n_conv), state0 = ctx_f32(c, n_state);
        if (!conv0 || !state0) return ERR_NOMEM;
        TRY(be->copy_d2d(be, conv0, conv_state, (size_t)n_conv * be->act_size));
        TRY(be->copy_d2d(be, state0, ssm_state, (size_t)n_state * sizeof(float)));
    }
    size_t mark_tmp = arena_mark(c->arena);
    void *xbc = ctx_act(c, N * s.cd), *yn = ctx_act(c, N * s.di);
    if (!xbc || !yn) return ERR_NOMEM;

    // in_proj, conv + SiLU over x | B | C (the conv state rolls forward), dt'
    lin_fwd(c, zxbcdt, x, w->in_proj, N, s.d, s.din);
    be->softplus_bias_fwd(be, dt, act_at(be, zxbcdt, s.o_dt), s.din, w->dt_bias, N, s.H);
    if (recurrent) { // a decode step: every row's state and window by pointer (layer.h step_cache_bases), one call each
        void *const *rows = ctx_step_caches(c, runs, n_runs);
        if (!rows) return err_wrap(ERR_NOMEM, "Mamba-2 layer %d: ", c->layer);
        int n = (int)N;
        be->conv1d_step(be, xbc, act_at(be, zxbcdt, s.o_xbc), s.din, w->conv_w, w->conv_b, rows + n, n, (int)s.cd, s.W,
                        1);
        be->ssd_recurrent_step(be, y, rows, xbc, s.cd, act_at(be, xbc, s.dxb), s.cd,
                               act_at(be, xbc, 2 * (int64_t)s.dxb), s.cd, dt, w->A_log, w->D, n, s.H, s.Hx, s.GB, s.GC,
                               s.P, s.Ns);
    }
    // conv + SiLU over x | B | C, the conv windows rolled forward, then the
    // SSD over the column slices of the conv output, the cache states read
    // and replaced. Inference over caches: every sequence of every run in
    // one call per op (backend.h be_seqs_t; bases: states, then windows);
    // training, one run, the uniform ops.
    const void *xbc_in = act_at(be, zxbcdt, s.o_xbc);
    const void *Bs = act_at(be, xbc, s.dxb), *Cs = act_at(be, xbc, 2 * (int64_t)s.dxb);
    if (!recurrent && !sv && runs[0].cache) {
        run_seqs_t rs;
        TRY(run_seqs(c, runs, n_runs, &rs));
        int n = rs.sq.n;
        be->conv1d_seqs(be, xbc, xbc_in, s.din, w->conv_w, w->conv_b, rs.base + n, rs.sq, (int)s.cd, s.W, 1);
        be->ssd_chunk_seqs(be, y, rs.base, xbc, s.cd, Bs, s.cd, Cs, s.cd, dt, w->A_log, w->D, rs.sq, s.H, s.Hx, s.GB,
                           s.GC, s.P, s.Ns, s.chunk);
        run_seqs_free(&rs);
    } else if (!recurrent) {
        be->conv1d_fwd(be, xbc, xbc_in, s.din, w->conv_w, w->conv_b, conv_state, B, T, (int)s.cd, s.W, 1);
        if (conv_state) be->conv1d_update_state(be, conv_state, xbc_in, s.din, B, T, (int)s.cd, s.W);
        be->ssd_chunk_fwd(be, y, ssm_state, carried, xbc, s.cd, Bs, s.cd, Cs, s.cd, dt, w->A_log, w->D, B, T, s.H, s.Hx,
                          s.GB, s.GC, s.P, s.Ns, s.chunk);
    }

    // gated norm (z = the first di columns of zxbcdt), out_proj
    be->gated_rmsnorm_fwd(be, yn, rstd, y, zxbcdt, s.din, w->norm, s.di, N, s.H, s.P, s.eps, GNORM_GATE_THEN_NORM);
    TRY(lin_fwd_out(c, out, yn, w->out_proj, N, s.di));

    if (sv) {
        sv->x = x, sv->zxbcdt = zxbcdt, sv->dt = dt, sv->y = y, sv->rstd = rstd;
        sv->conv0 = conv0, sv->state0 = state0, sv->B = B, sv->T = T;
        arena_reset(c->arena, mark_tmp);
    } else {
        arena_reset(c->arena, mark);
    }
    return 0;
}

int m2_forward(const layer_ctx_t *c, const m2_w_t *w, void *out, const void *x, int B, int T, int pos0,
               layer_cache_t *cache, m2_saved_t *sv) {
    step_run_t all = {cache, 0, B, T, pos0};
    return m2_run(c, w, &(lin_out_t){.y = out}, x, &all, 1, sv, 0);
}

int m2_forward_runs(const layer_ctx_t *c, const m2_w_t *w, void *out, const void *x, int n_runs,
                    const step_run_t *runs) {
    TRY(forward_runs_check(runs, n_runs));
    return m2_run(c, w, &(lin_out_t){.y = out}, x, runs, n_runs, NULL, 0);
}

// Backward, each step the transpose of the forward line it names.
int m2_backward(const layer_ctx_t *c, const m2_w_t *w, m2_w_t *g, void *dx, const void *dout, const m2_saved_t *sv) {
    be_t *be = c->be;
    m2_shape_t s = m2_shape(c->a);
    int B = sv->B, T = sv->T;
    int64_t N = (int64_t)B * T;
    size_t mark = arena_mark(c->arena);
    void *yn = ctx_act(c, N * s.di), *dyn = ctx_act(c, N * s.di), *dy = ctx_act(c, N * s.di);
    void *xbc = ctx_act(c, N * s.cd), *dxbc = ctx_act(c, N * s.cd), *dzxbcdt = ctx_act(c, N * s.din);
    float *ddt = ctx_f32(c, N * s.H);
    if (!yn || !dyn || !dy || !xbc || !dxbc || !dzxbcdt || !ddt) return ERR_NOMEM;

    // out = yn W_out^T (yn recomputed for dW_out)
    be->gated_rmsnorm_fwd(be, yn, NULL, sv->y, sv->zxbcdt, s.din, w->norm, s.di, N, s.H, s.P, s.eps,
                          GNORM_GATE_THEN_NORM);
    lin_bwd(be, dyn, 0, g->out_proj, dout, yn, w->out_proj, N, s.di, s.d);
    // gated norm: dy, and dz straight into the z columns of d(zxbcdt)
    be->gated_rmsnorm_bwd(be, dy, dzxbcdt, s.din, g->norm, dyn, sv->y, sv->zxbcdt, s.din, w->norm, s.di, sv->rstd, N,
                          s.H, s.P, GNORM_GATE_THEN_NORM);
    // SSD (its inputs, the conv output, recomputed): dx | dB | dC into d(xBC'), ddt'
    const void *xbc_in = act_at(be, sv->zxbcdt, s.o_xbc);
    be->conv1d_fwd(be, xbc, xbc_in, s.din, w->conv_w, w->conv_b, sv->conv0, B, T, (int)s.cd, s.W, 1);
    int64_t oB = s.dxb, oC = 2 * (int64_t)s.dxb;
    be->ssd_chunk_bwd(be, dxbc, act_at(be, dxbc, oB), act_at(be, dxbc, oC), ddt, g->A_log, g->D, NULL, dy, NULL, xbc,
                      s.cd, act_at(be, xbc, oB), s.cd, act_at(be, xbc, oC), s.cd, sv->dt, w->A_log, w->D, sv->state0, B,
                      T, s.H, s.Hx, s.GB, s.GC, s.P, s.Ns, s.chunk);
    // dt' = softplus(dt + dt_bias): into the dt columns of d(zxbcdt)
    be->softplus_bias_bwd(be, act_at(be, dzxbcdt, s.o_dt), s.din, g->dt_bias, ddt, act_at(be, sv->zxbcdt, s.o_dt),
                          s.din, w->dt_bias, N, s.H);
    // conv + SiLU: into the xBC columns of d(zxbcdt)
    be->conv1d_bwd(be, act_at(be, dzxbcdt, s.o_xbc), s.din, g->conv_w, g->conv_b, NULL, dxbc, xbc_in, s.din, w->conv_w,
                   w->conv_b, sv->conv0, B, T, (int)s.cd, s.W, 1);
    // zxbcdt = x W_in^T
    lin_bwd(be, dx, 0, g->in_proj, dzxbcdt, sv->x, w->in_proj, N, s.d, s.din);
    arena_reset(c->arena, mark);
    return 0;
}

int m2_step(const layer_ctx_t *c, const m2_w_t *w, const lin_out_t *out, const void *x, int n_runs,
            const step_run_t *runs) {
    TRY(step_check(c, runs, n_runs, 0, 0));
    return m2_run(c, w, out, x, runs, n_runs, NULL, 1);
}
