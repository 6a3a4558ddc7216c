// The optimizer state of a training run, in flat buffers laid out by the
// model's parameter table: fp32 master weights, AdamW moments, the gradient,
// and which parameters train. AdamW, gradient-norm clipping and the learning
// rate schedule.
//
// Sharded as ZeRO stage 1 over the ranks of a data-parallel run (dist.h):
// every rank holds the whole gradient (its backward writes all of it) but the
// master weights and moments of its slice [lo, hi) of the flat buffer only.
// A step: the gradient summed over ranks into each owner's slice, a layer at
// a time while the backward still runs (optim_reduce_layer, then
// optim_reduce_wait), the global norm from every slice's sum of squares,
// AdamW on the slice, then every slice's new weights sent to every rank.
#pragma once
#include <stdint.h>

#include "model/model.h"
#include "train/dist.h"

typedef struct {
    int64_t n;          // elements of the flat parameter buffer (m->pt.total)
    int64_t S;          // slice length (dist_slice): the gradient has S x world elements
    int64_t lo, hi;     // this rank's slice [lo, hi) of the flat buffer (may be empty)
    float *master;      // [S] fp32 master weights of the slice (device); on the CPU, where act is fp32, the
                        // model's own weights (m->w + lo)
    float *m1, *m2;     // [S] AdamW first and second moments of the slice (device)
    float *grad;        // [S world] gradient (device), accumulated over micro-batches; past n it stays 0
    dist_t *dist;       // the ranks (a run of one when optim_create got NULL)
    dist_t single;      // that run of one
    uint8_t *trainable; // host [pt.n]: 1 when parameter i trains
    float *d_sumsq;     // device [pt.n]: per-parameter sums of squares
    float *h_sumsq;     // host copy
    int64_t step;       // optimizer steps taken
    float beta1, beta2, eps, weight_decay;
    // The gradient's parts a backward finishes one by one: layer l is
    // [layer_start[l], layer_start[l + 1]) (its parameters and the padding
    // after them), layer_start[L] the final norm's offset; the rest is
    // [0, layer_start[0]) and [layer_start[L], S world).
    int64_t layer_start[ARCH_MAX_LAYERS + 1];
    int n_layers;
} optim_t;

// Allocates the state for m (every parameter trainable, moments zero, master
// = the model's weights) on rank d->rank of d->world (d NULL: one process;
// d must outlive o).
int optim_create(optim_t *o, model_t *m, dist_t *d);
void optim_free(optim_t *o, model_t *m);
// Freezes the parameters whose name does not satisfy keep (e.g. ILD: the
// embedding and the head take no gradient; freeze_non_mla).
void optim_train_only(optim_t *o, const model_t *m, int (*keep)(const char *name));
int optim_zero_grad(optim_t *o, model_t *m);
// The gradient summed over the ranks into this rank's slice (nothing with one
// rank), in parts as a backward finishes them (its grad_done_t's fn, on the
// last micro-batch of a step): layer l's parameters, or with layer -1 the rest
// (embedding, final norm, head; the padding to S world). Each starts a
// reduction and returns (dist_reduce_range); optim_reduce_wait waits for all
// of them, and fails unless every part of the step was started once. Each
// rank's loss is normalised by the global batch, so the sum is the gradient
// of the global batch's loss.
int optim_reduce_layer(optim_t *o, int layer);
int optim_reduce_wait(optim_t *o);
// The global L2 norm of the trainable parameters' gradient (after
// optim_reduce_wait): each rank's slice, summed over ranks.
int optim_grad_norm(optim_t *o, model_t *m, double *norm);
// One AdamW step on the trainable parameters of the slice with the gradient
// times grad_scale (clipping), then the model's weights = master, every
// slice gathered into every rank's weights.
int optim_step(optim_t *o, model_t *m, float lr, float grad_scale);
// Rank 0's host buffers master, m1, m2 [n] = every rank's slice (checkpoints;
// NULL on the other ranks).
int optim_gather(optim_t *o, model_t *m, float *master, float *m1, float *m2);
// This rank's slice of buffer k (0 master, 1 m1, 2 m2) from a whole host
// buffer all [n] (a checkpoint of any number of ranks).
int optim_load(optim_t *o, model_t *m, int k, const float *all);

// Learning-rate schedules as transformers' get_*_schedule_with_warmup: step
// is 0-based (the first optimizer step runs at lr_at(0), which is 0 with a
// warm-up), total the number of optimizer steps.
typedef enum { LR_COSINE = 0, LR_LINEAR = 1, LR_CONSTANT = 2 } lr_sched_t;
double lr_at(lr_sched_t s, double lr, int64_t step, int64_t warmup, int64_t total);
