// Gated DeltaNet token mixer (flash-linear-attention GatedDeltaNet, spec
// linear_blocks.md section 1): projections, short convs + SiLU on q, k, v,
// L2-normalised q and k, gates, the chunked gated delta rule (decode: the
// token-by-token recurrence), per-head gated RMSNorm, o_proj. Follows the
// layer contract of model/layer.h.
//
// Dimensions (arch_t.gdn): H q/k heads of K, HV value heads of Dv (HV a
// multiple of H; value head h uses q/k head h / (HV/H)), conv width W.
// kd = H*K, vd = HV*Dv.
#pragma once
#include <stddef.h>

#include "model/layer.h"
#include "model/params.h"

// Parameter views (model.layers.{i}.gdn.*): act pointers into the flat weight
// buffer, or float pointers into the flat gradient buffer (same binding).
typedef struct {
    void *q_proj, *k_proj, *v_proj; // [kd, d], [kd, d], [vd, d]
    void *a_proj, *b_proj;          // [HV, d] raw decay input a, raw beta logit b
    void *A_log, *dt_bias;          // [HV]
    void *q_conv, *k_conv, *v_conv; // [kd | kd | vd, 1, W] depthwise, no bias
    void *g_proj;                   // [vd, d] output gate; NULL when !use_gate
    void *o_norm;                   // [Dv] shared by every value head
    void *o_proj;                   // [d, vd]
} gdn_w_t;

// Points every field at flat + off * elt_size for the parameters of layer
// `layer` in table pt (elt_size = act size for weights, 4 for fp32 gradients).
// g_proj is NULL when the table has none. ERR_INPUT naming the missing
// parameter otherwise.
int gdn_w_bind(gdn_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer);

// Activations kept for the backward, all in ctx->arena (N = B*T rows).
typedef struct {
    int B, T;
    const void *x;                     // [N, d] the layer input; NOT copied: the caller keeps it alive until backward
    void *qpre, *kpre, *vpre;          // [N, kd | kd | vd] projections before the convs
    void *a, *b;                       // [N, HV] raw gate inputs
    void *z;                           // [N, vd] gate projection (NULL without use_gate)
    void *q, *k;                       // [N, kd] conv + SiLU + L2 norm (the rule's inputs)
    float *rq, *rk;                    // [N*H] reciprocal L2 norms
    void *v;                           // [N, vd] conv + SiLU
    float *g, *beta;                   // [N, HV] log decay, beta
    void *o;                           // [N, vd] rule output
    float *rstd;                       // [N*HV] output norm
    void *y;                           // [N, vd] normed (and gated) output, input of o_proj
    float *state0;                     // [B, HV, Dv, K] initial state (cache given), or NULL = zeros
    void *conv0_q, *conv0_k, *conv0_v; // [B, C, W] initial conv states (cache given), or NULL = zeros
} gdn_saved_t;

// x [B,T,d] -> out [B,T,d]. pos0 unused (no positions in GDN). cache NULL in
// training; else its state and conv states are the sequences' past (zeros
// for a new sequence) and are replaced by the state after these T tokens
// (cache->len is not advanced: the model does that after all layers).
// sv NULL in inference, else filled for gdn_backward (the cache may be given
// too: the initial states are then copied into sv). Returns 0 or ERR_* (arena
// full, cache batch mismatch).
int gdn_forward(const layer_ctx_t *c, const gdn_w_t *w, void *out, const void *x, int B, int T, int pos0,
                layer_cache_t *cache, gdn_saved_t *sv);
// Inference over the rows of runs (layer.h step_run_t), each with a cache:
// a batched prefill's requests, each with its own T and position.
int gdn_forward_runs(const layer_ctx_t *c, const gdn_w_t *w, void *out, const void *x, int n_runs,
                     const step_run_t *runs);

// dout [B,T,d] -> dx [B,T,d] (overwritten); g: float gradients, += .
// Gradients with respect to the cache's initial states are not produced.
int gdn_backward(const layer_ctx_t *c, const gdn_w_t *w, gdn_w_t *g, void *dx, const void *dout, const gdn_saved_t *sv);

// One token per sequence of the runs (layer.h step_run_t): x [N,d] -> out
// [N,d], through the conv states and the token-by-token recurrence; updates the
// caches (not their len). x normed already (xw NULL), or the residual stream
// with its norm's gain xw, applied by the input product (only where
// gdn_step_norms_input says so).
int gdn_step(const layer_ctx_t *c, const gdn_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
             const step_run_t *runs);
// Whether gdn_step can take its input unnormed with the gain (its input
// projections one matrix in memory: one product, be->proj_rmsnorm).
int gdn_step_norms_input(const layer_ctx_t *c, const gdn_w_t *w);
