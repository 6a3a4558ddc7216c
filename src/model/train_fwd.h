// Training forward and backward of a model, one decoder block at a time.
//
// A block is  x_mid = x_in + mixer(rmsnorm1(x_in));  x_out = x_mid + mlp(rmsnorm2(x_mid)).
// block_forward/block_backward serve both training flows: end-to-end (the
// blocks chained, model_forward_train / model_backward) and layer-wise
// distillation (each block fed the teacher's input, its mixer output `a` and
// output x_out both in the loss: block_backward takes an extra gradient on a).
// Everything saved lives in the run's activation arena until it is reset.
#pragma once
#include "model/model.h"

typedef struct {
    const void *x_in;                    // [N, d] block input (owned by the caller)
    void *xn1, *a, *x_mid, *xn2, *x_out; // [N, d] each
    float *rstd1, *rstd2;                // [N]
    mixer_saved_t mix;
    mlp_saved_t mlp;
    int B, T;
} block_saved_t;

// Forward of block l over x_in [B*T, d] (positions 0..T-1 in every row).
int block_forward(model_run_t *r, int l, const void *x_in, int B, int T, block_saved_t *sv);
// dx_out: gradient of x_out; da (NULL = 0): extra gradient on the mixer output;
// dx_in (NULL: not needed): gradient of x_in, overwritten. Weight gradients are
// accumulated (+=) into g (views into a float gradient buffer laid out by m->pt).
int block_backward(model_run_t *r, int l, layer_w_t *g, const block_saved_t *sv, const void *dx_out, const void *da,
                   void *dx_in);

typedef struct {
    int B, T;
    int recompute;                // activation checkpointing: only each block's input is kept
    int32_t *ids;                 // device [N]
    void *x[ARCH_MAX_LAYERS + 1]; // block inputs, x[n_layers] the last block's output ([N, d] each)
    block_saved_t *blocks;        // [n_layers] what each backward needs (unused when recompute)
    void *h;                      // final normed hidden [N, d]
    float *rstd_f;                // [N]
} model_acts_t;

// Whole-model training forward: acts->h = final_norm(blocks(embed(ids))).
// ids host [B*T]. acts->blocks must have room for n_layers entries. recompute: keep only the block inputs (activation
// checkpointing); model_backward runs each block's forward again.
int model_forward_train(model_run_t *r, const int32_t *ids, int B, int T, int recompute, model_acts_t *acts);
// dh: gradient of acts->h; accumulates every parameter's gradient into grad
// (float flat buffer laid out by m->pt, on the device).
int model_backward(model_run_t *r, const model_acts_t *acts, const void *dh, float *grad);

// Told by a backward as soon as a part of the gradient is final, in queue
// order (what is queued on the backend so far writes it; nothing queued later
// does): fn(ctx, l) for layer l's parameters, fn(ctx, -1) once at the end for
// the rest (embedding, final norm, head). The trainer starts reducing that
// part over the ranks while the backward goes on (train/dist.h). An error
// from fn ends the backward with it.
typedef struct {
    int (*fn)(void *ctx, int layer);
    void *ctx;
} grad_done_t;
// model_backward, telling done (NULL: no one) of each layer as it finishes.
int model_backward_told(model_run_t *r, const model_acts_t *acts, const void *dh, float *grad, const grad_done_t *done);
