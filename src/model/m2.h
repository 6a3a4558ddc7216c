// Mamba-2 mixer in the Zebra-Llama / MambaInLlama layout (spec hybrid_model.md
// §6, linear_blocks.md §3-4): in_proj -> z | x | B | C | dt; depthwise causal
// conv + SiLU over [x | B | C]; dt' = softplus(dt + dt_bias); SSD with
// nheads = ngroups = H, x and B at KV width (head h reads x head / B group
// h / (H / Hkv)), C per head; gated RMSNorm (gate then norm, groups of headdim);
// out_proj. Parameters model.layers.{i}.mamba.* (model/params.c).
#pragma once
#include "model/layer.h"
#include "model/params.h"

// Views into a flat buffer: weights (act) or, bound to a gradient buffer, their
// gradients (float).
typedef struct {
    void *in_proj;  // in_proj.weight [2 d_inner + 2 d_xb + H, d], rows z | x | B | C | dt
    void *conv_w;   // conv1d.weight [d_inner + 2 d_xb, 1, W], channels x | B | C
    void *conv_b;   // conv1d.bias [d_inner + 2 d_xb]
    void *dt_bias;  // [H]
    void *A_log;    // [H], A = -exp(A_log)
    void *D;        // [H]
    void *norm;     // norm.weight [d_inner]
    void *out_proj; // out_proj.weight [d, d_inner]
} m2_w_t;

// What m2_backward needs (N = B*T rows); everything but x lives in ctx->arena.
typedef struct {
    const void *x; // layer input [N, d] (owned by the caller, kept alive)
    void *zxbcdt;  // in_proj output [N, 2 d_inner + 2 d_xb + H], pre-conv (the conv output is recomputed)
    float *dt;     // softplus(dt + dt_bias) [N, H]
    void *y;       // SSD output before the gated norm [N, d_inner]
    float *rstd;   // gated norm [N, H]
    void *conv0;   // cache conv state before x [B, d_inner + 2 d_xb, W], NULL = zeros (no cache or len 0)
    float *state0; // cache SSM state before x [B, H, P, N], NULL = zeros
    int B, T;
} m2_saved_t;

// Binds w to flat (element size elt_size) for layer `layer`: weights (act) or gradients (float).
int m2_w_bind(m2_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer);

// x [B,T,d] -> out [B,T,d]. pos0 is not used (the state carries the position).
// cache (NULL in training): its conv and SSM states are read when cache->len > 0
// (zeroed when len == 0) and replaced by the states after x; len is not advanced.
// sv (NULL in inference) is filled for m2_backward; with a cache too, the
// entering states are saved and the backward treats them as constants.
int m2_forward(const layer_ctx_t *c, const m2_w_t *w, void *out, const void *x, int B, int T, int pos0,
               layer_cache_t *cache, m2_saved_t *sv);
// Inference over the rows of runs (layer.h step_run_t), each with a cache:
// a batched prefill's requests, each with its own T and position.
int m2_forward_runs(const layer_ctx_t *c, const m2_w_t *w, void *out, const void *x, int n_runs,
                    const step_run_t *runs);
// dx [B,T,d] (overwritten) and the weight gradients g (float, +=) from dout [B,T,d].
int m2_backward(const layer_ctx_t *c, const m2_w_t *w, m2_w_t *g, void *dx, const void *dout, const m2_saved_t *sv);
// One token per sequence of the runs (layer.h step_run_t), x [N,d] -> out
// [N,d]: conv state + recurrent SSD; a run whose cache has len 0 starts from
// zeroed states.
int m2_step(const layer_ctx_t *c, const m2_w_t *w, const lin_out_t *out, const void *x, int n_runs,
            const step_run_t *runs);
