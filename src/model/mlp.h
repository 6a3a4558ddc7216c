// SwiGLU MLP: down(silu(gate(x)) * up(x)).
#pragma once
#include "model/layer.h"
#include "model/params.h"

typedef struct {
    void *gate, *up, *down; // [ffn, d], [ffn, d], [d, ffn]
} mlp_w_t;

typedef struct {
    const void *x;       // input [N, d] (kept alive by the caller)
    void *gate, *up, *h; // [N, ffn]
    int64_t N;
} mlp_saved_t;

int mlp_w_bind(mlp_w_t *w, const ptable_t *pt, void *flat, size_t elt, int layer);
int mlp_forward(const layer_ctx_t *c, const mlp_w_t *w, void *out, const void *x, int64_t N, mlp_saved_t *sv);
// A decode step of N <= BE_FEW_ROWS rows: h = silu(x Wg^T) * (x Wu^T) in one
// op (be->proj_swiglu), then h W_down^T into out (layer.h lin_out_t: the add
// into the residual stream and the next norm fused with the product). x
// normed already (xw NULL), or the residual stream with its norm's gain xw,
// applied by that op (only where mlp_step_norms_input says so).
// Quantised gate or up (CPU inference): mlp_forward, then the add and norm.
int mlp_step(const layer_ctx_t *c, const mlp_w_t *w, const lin_out_t *out, const void *x, const void *xw, int64_t N);
// Whether mlp_step can take its input unnormed with the gain (gate and up
// not quantised: be->proj_swiglu).
int mlp_step_norms_input(const layer_ctx_t *c, const mlp_w_t *w);
int mlp_backward(const layer_ctx_t *c, const mlp_w_t *w, mlp_w_t *g, void *dx, const void *dout, const mlp_saved_t *sv);
