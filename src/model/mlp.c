#include "model/mlp.h"

#include "base/err.h"
#include "model/bind.h"
#include "model/linear.h"

int mlp_w_bind(mlp_w_t *w, const ptable_t *pt, void *flat, size_t elt, int layer) {
    TRY(bind_param(&w->gate, pt, flat, elt, layer, "mlp.gate_proj.weight", 0));
    TRY(bind_param(&w->up, pt, flat, elt, layer, "mlp.up_proj.weight", 0));
    TRY(bind_param(&w->down, pt, flat, elt, layer, "mlp.down_proj.weight", 0));
    return 0;
}

int mlp_forward(const layer_ctx_t *c, const mlp_w_t *w, void *out, const void *x, int64_t N, mlp_saved_t *sv) {
    be_t *be = c->be;
    int d = c->a->d, f = c->a->ffn;
    // A decode step (c->step_pos: a few rows, launch-bound on a GPU) takes
    // gate and up from one product when they are one matrix in memory (rows
    // [gate | up]; lin_joint: act, or one block format). Elsewhere, without a
    // backward to save for (inference), h overwrites gate: swiglu is
    // elementwise, and the arena holds two [N, f] buffers instead of three.
    const void *ws[2] = {w->gate, w->up};
    const int64_t outs[2] = {f, f};
    if (!sv && c->step_pos && lin_joint(c, ws, outs, 2, d)) {
        void *gu = ctx_act(c, N * 2 * f), *h = ctx_act(c, N * f);
        if (!gu || !h) return ERR_NOMEM;
        lin_fwd(c, gu, x, w->gate, N, d, 2 * f);
        be->swiglu_fwd(be, h, gu, act_at(be, gu, f), 2 * f, N, f);
        lin_fwd(c, out, h, w->down, N, f, d);
        return 0;
    }
    void *gate = ctx_act(c, N * f), *up = ctx_act(c, N * f), *h = sv ? ctx_act(c, N * f) : gate;
    if (!gate || !up || !h) return ERR_NOMEM;
    lin_fwd(c, gate, x, w->gate, N, d, f);
    lin_fwd(c, up, x, w->up, N, d, f);
    be->swiglu_fwd(be, h, gate, up, f, N, f);
    lin_fwd(c, out, h, w->down, N, f, d);
    if (sv) sv->x = x, sv->gate = gate, sv->up = up, sv->h = h, sv->N = N;
    return 0;
}

int mlp_step_norms_input(const layer_ctx_t *c, const mlp_w_t *w) {
    const void *ws[2] = {w->gate, w->up};
    const int64_t outs[2] = {c->a->ffn, c->a->ffn};
    return (!lin_qmat(c, w->gate) && !lin_qmat(c, w->up)) || lin_joint(c, ws, outs, 2, c->a->d);
}

int mlp_step(const layer_ctx_t *c, const mlp_w_t *w, const lin_out_t *out, const void *x, const void *xw, int64_t N) {
    be_t *be = c->be;
    int d = c->a->d, f = c->a->ffn;
    if (!mlp_step_norms_input(c, w)) { // block formats apart: the plain MLP, then the add
        if (xw) return err_set(ERR_UNSUP, "MLP step: an input norm needs gate and up as one matrix");
        void *y = ctx_act(c, N * d);
        if (!y) return ERR_NOMEM;
        TRY(mlp_forward(c, w, y, x, N, NULL));
        lin_out_add(c, out, y, N);
        return 0;
    }
    if (lin_qmat(c, w->gate)) { // one block-format matrix [gate | up]: its product (normed), then down of SwiGLU
        void *gu = ctx_act(c, N * 2 * f);
        if (!gu) return ERR_NOMEM;
        lin_fwd_normed(c, gu, x, xw, w->gate, N, d, 2 * (int64_t)f);
        return lin_fwd_out_swiglu(c, out, gu, act_at(be, gu, f), 2 * f, w->down, N, f);
    }
    void *h = ctx_act(c, N * f);
    if (!h) return ERR_NOMEM;
    be->proj_swiglu(be, h, x, d, xw, c->a->eps, w->gate, w->up, N, d, f);
    return lin_fwd_out(c, out, h, w->down, N, f);
}

int mlp_backward(const layer_ctx_t *c, const mlp_w_t *w, mlp_w_t *g, void *dx, const void *dout,
                 const mlp_saved_t *sv) {
    be_t *be = c->be;
    int d = c->a->d, f = c->a->ffn;
    int64_t N = sv->N;
    void *dh = ctx_act(c, N * f), *dgate = ctx_act(c, N * f), *dup = ctx_act(c, N * f);
    if (!dh || !dgate || !dup) return ERR_NOMEM;
    lin_bwd(be, dh, 0, g->down, dout, sv->h, w->down, N, f, d);
    be->swiglu_bwd(be, dgate, dup, dh, sv->gate, sv->up, N * f);
    lin_bwd(be, dx, 0, g->gate, dgate, sv->x, w->gate, N, d, f);
    lin_bwd(be, dx, 1, g->up, dup, sv->x, w->up, N, d, f);
    return 0;
}
