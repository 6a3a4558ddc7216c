// Linear layers in PyTorch convention (W [out, in], y = x W^T) on the op table.
#pragma once
#include "backend/backend.h"
#include "model/layer.h"

// y[N, out] = x[N, in] W^T; W an act matrix, or one of c->qw (its stored
// format; out larger than its rows: the joint matrix lin_joint allowed).
void lin_fwd(const layer_ctx_t *c, void *y, const void *x, const void *W, int64_t N, int64_t in, int64_t out);
// The same of x's rows RMS-normalised with gain xw (c->a->eps) in the product
// (a decode step's first product fed the residual stream: be->proj_rmsnorm
// on an act matrix, be->qproj on block formats), or lin_fwd when xw is NULL.
// x's rows are `in` apart.
void lin_fwd_normed(const layer_ctx_t *c, void *y, const void *x, const void *xw, const void *W, int64_t N, int64_t in,
                    int64_t out);
// a[N, in] W^T into o (layer.h lin_out_t): y =, or x += then xn = the norm
// of x (be->proj_add_rmsnorm; a quantised W: be->qproj's add, or its
// product, then add_rmsnorm_fwd). 0, or ERR_NOMEM.
int lin_fwd_out(const layer_ctx_t *c, const lin_out_t *o, const void *a, const void *W, int64_t N, int64_t in);
// SwiGLU(gate, up) W^T into o as lin_fwd_out, gate and up [N, in] rows ld
// apart: the MLP's down product of a decode step. On a block-format W the
// SwiGLU is inside the product (be->qproj's xu) where o needs no norm;
// otherwise swiglu_fwd, then lin_fwd_out. 0, or ERR_NOMEM.
int lin_fwd_out_swiglu(const layer_ctx_t *c, const lin_out_t *o, const void *gate, const void *up, int64_t ld,
                       const void *W, int64_t N, int64_t in);
// y[N, d], already projected, into o's residual stream: x += y, then xn = the
// norm of x (norm NULL: the add alone). o->x must be set.
void lin_out_add(const layer_ctx_t *c, const lin_out_t *o, const void *y, int64_t N);
// 1 when the act matrices ws[0..n) ([outs[i], in] each) lie one after another
// in memory, so that they are one matrix [sum outs, in] whose product gives
// their outputs side by side in one call (the parameter table places a
// layer's projections in order; params.c), else 0 (a gap, or a quantised one).
int lin_adjacent(const layer_ctx_t *c, const void *const *ws, const int64_t *outs, int n, int64_t in);
// The same, or the block-format matrices ws[0..n) of one format and row
// length stored one after another (model.c places them in parameter order),
// so that lin_fwd of ws[0] with out = sum outs gives their outputs side by
// side in one product: 1, else 0. Plain and normed products take such a
// joint block-format matrix (lin_fwd, lin_fwd_normed); the fused decode ops
// with RoPE or SwiGLU take act matrices.
int lin_joint(const layer_ctx_t *c, const void *const *ws, const int64_t *outs, int n, int64_t in);
// The matrix W is when it is one of c->qw, else NULL.
const be_qmat_t *lin_qmat(const layer_ctx_t *c, const void *W);
// dx[N, in] = dy W (overwritten, or added when acc); dW[out, in] += dy^T x (float).
void lin_bwd(be_t *be, void *dx, int acc, void *dW, const void *dy, const void *x, const void *W, int64_t N, int64_t in,
             int64_t out);
