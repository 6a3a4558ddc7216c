// The optimizer state of a training run, in flat buffers laid out by the
// model's parameter table: fp32 master weights, AdamW moments, the gradient,
// and which parameters train. AdamW, gradient-norm clipping and the learning
// rate schedule.
#pragma once
#include <stdint.h>

#include "model/model.h"

typedef struct {
    int64_t n;          // elements of every flat buffer (m->pt.total)
    float *master;      // fp32 master weights (device); the model's own weights on the CPU, where act is fp32
    float *m1, *m2;     // AdamW first and second moments (device)
    float *grad;        // gradient (device), accumulated over micro-batches
    uint8_t *trainable; // host [pt.n]: 1 when parameter i trains
    float *d_sumsq;     // device [pt.n]: per-parameter sums of squares
    float *h_sumsq;     // host copy
    int64_t step;       // optimizer steps taken
    float beta1, beta2, eps, weight_decay;
} optim_t;

// Allocates the state for m (every parameter trainable, moments zero, master
// = the model's weights).
int optim_create(optim_t *o, model_t *m);
void optim_free(optim_t *o, model_t *m);
// Freezes the parameters whose name does not satisfy keep (e.g. ILD: the
// embedding and the head take no gradient; freeze_non_mla).
void optim_train_only(optim_t *o, const model_t *m, int (*keep)(const char *name));
int optim_zero_grad(optim_t *o, model_t *m);
// The global L2 norm of the trainable parameters' gradient.
int optim_grad_norm(optim_t *o, model_t *m, double *norm);
// One AdamW step on the trainable parameters with the gradient times
// grad_scale (clipping), then the model's weights = master.
int optim_step(optim_t *o, model_t *m, float lr, float grad_scale);

// Learning-rate schedules as transformers' get_*_schedule_with_warmup: step
// is 0-based (the first optimizer step runs at lr_at(0), which is 0 with a
// warm-up), total the number of optimizer steps.
typedef enum { LR_COSINE = 0, LR_LINEAR = 1, LR_CONSTANT = 2 } lr_sched_t;
double lr_at(lr_sched_t s, double lr, int64_t step, int64_t warmup, int64_t total);
