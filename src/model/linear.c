#include "model/linear.h"

#include <stdint.h>

#include "base/err.h"

const be_qmat_t *lin_qmat(const layer_ctx_t *c, const void *W) {
    uintptr_t p = (uintptr_t)W, lo = (uintptr_t)c->qw, hi = (uintptr_t)(c->qw + c->n_qw);
    return c->n_qw && p >= lo && p < hi ? (const be_qmat_t *)W : NULL;
}

int lin_adjacent(const layer_ctx_t *c, const void *const *ws, const int64_t *outs, int n, int64_t in) {
    for (int i = 0; i < n; i++) {
        if (!ws[i] || lin_qmat(c, ws[i])) return 0;
        if (i > 0 && (const char *)ws[i] != (const char *)ws[i - 1] + (size_t)(outs[i - 1] * in) * c->be->act_size)
            return 0;
    }
    return 1;
}

int lin_joint(const layer_ctx_t *c, const void *const *ws, const int64_t *outs, int n, int64_t in) {
    const be_qmat_t *q0 = ws[0] ? lin_qmat(c, ws[0]) : NULL;
    if (!q0) return lin_adjacent(c, ws, outs, n, in);
    for (int i = 1; i < n; i++) {
        const be_qmat_t *q = ws[i] ? lin_qmat(c, ws[i]) : NULL, *p = lin_qmat(c, ws[i - 1]);
        if (!q || q->type != q0->type || q->cols != q0->cols || q->row_bytes != q0->row_bytes ||
            (const char *)q->data != (const char *)p->data + (size_t)p->rows * p->row_bytes)
            return 0;
    }
    return 1;
}

// W's descriptor when it is one of c->qw, widened to out rows (lin_joint's
// matrices one after another), in *q; NULL for an act matrix.
static const be_qmat_t *lin_qmat_rows(const layer_ctx_t *c, const void *W, int64_t out, be_qmat_t *q) {
    const be_qmat_t *w = lin_qmat(c, W);
    if (!w) return NULL;
    *q = *w;
    q->rows = out;
    return q;
}

void lin_fwd(const layer_ctx_t *c, void *y, const void *x, const void *W, int64_t N, int64_t in, int64_t out) {
    be_t *be = c->be;
    be_qmat_t qd;
    const be_qmat_t *q = lin_qmat_rows(c, W, out, &qd);
    if (q)
        be->qmatmul(be, y, x, q, N);
    else
        be->gemm(be, 0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

void lin_fwd_normed(const layer_ctx_t *c, void *y, const void *x, const void *xw, const void *W, int64_t N, int64_t in,
                    int64_t out) {
    be_qmat_t qd;
    const be_qmat_t *q = xw ? lin_qmat_rows(c, W, out, &qd) : NULL;
    if (q)
        c->be->qproj(c->be, y, NULL, x, NULL, in, xw, c->a->eps, q, N);
    else if (xw)
        c->be->proj_rmsnorm(c->be, y, x, in, xw, c->a->eps, W, N, in, out);
    else
        lin_fwd(c, y, x, W, N, in, out);
}

int lin_fwd_out(const layer_ctx_t *c, const lin_out_t *o, const void *a, const void *W, int64_t N, int64_t in) {
    be_t *be = c->be;
    const arch_t *A = c->a;
    if (!o->x) {
        lin_fwd(c, o->y, a, W, N, in, A->d);
        return 0;
    }
    const be_qmat_t *q = lin_qmat(c, W);
    if (!q) {
        be->proj_add_rmsnorm(be, o->xn, o->x, a, in, W, o->norm, N, in, A->d, A->eps);
        return 0;
    }
    if (!o->norm) { // the add alone, in the product
        be->qproj(be, NULL, o->x, a, NULL, in, NULL, 0.0f, q, N);
        return 0;
    }
    void *y = ctx_act(c, N * A->d);
    if (!y) return ERR_NOMEM;
    lin_fwd(c, y, a, W, N, in, A->d);
    lin_out_add(c, o, y, N);
    return 0;
}

int lin_fwd_out_swiglu(const layer_ctx_t *c, const lin_out_t *o, const void *gate, const void *up, int64_t ld,
                       const void *W, int64_t N, int64_t in) {
    be_t *be = c->be;
    const be_qmat_t *q = lin_qmat(c, W);
    if (q && !o->norm) {
        be->qproj(be, o->x ? NULL : o->y, o->x, gate, up, ld, NULL, 0.0f, q, N);
        return 0;
    }
    void *h = ctx_act(c, N * in);
    if (!h) return ERR_NOMEM;
    be->swiglu_fwd(be, h, gate, up, ld, N, in);
    return lin_fwd_out(c, o, h, W, N, in);
}

void lin_out_add(const layer_ctx_t *c, const lin_out_t *o, const void *y, int64_t N) {
    be_t *be = c->be;
    const arch_t *A = c->a;
    if (o->norm)
        be->add_rmsnorm_fwd(be, o->xn, NULL, o->x, y, o->norm, N, A->d, A->eps);
    else
        be->add(be, o->x, y, N * A->d);
}

void lin_bwd(be_t *be, void *dx, int acc, void *dW, const void *dy, const void *x, const void *W, int64_t N, int64_t in,
             int64_t out) {
    if (dx) be->gemm(be, 0, 0, N, in, out, 1.0f, dy, out, W, in, acc ? 1.0f : 0.0f, dx, in);
    if (dW) be->gemm_f32out(be, 1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}
