// The distillation losses of one micro-batch, forward and backward: stage 1's
// layer-wise distillation (Enhanced-ILD) and stage 2's end-to-end KD through the
// fused hidden-state KL / CE (never a T x V tensor). Gradients accumulate into
// a flat float buffer laid out by the student's parameter table.
#pragma once
#include <stdint.h>

#include "model/model.h"
#include "model/train_fwd.h"

typedef struct {
    model_run_t *student;
    model_run_t *teacher;  // KD: NULL when the loss is CE alone; created with no arena, it runs in student's
    float *grad;           // the student's flat gradient (device)
    int recompute;         // KD: activation checkpointing of the student's blocks
    int ild_mode;          // DIST_L2 (the published loss) or DIST_MSE
    block_saved_t *blocks; // [n_layers] (KD without recompute)
    // Told of each part of the gradient as it is final (NULL: no one), as
    // model_backward_told tells it; ILD tells the layers in forward order.
    const grad_done_t *done;
} distill_t;

// What a micro-batch measured, unscaled: KL and CE summed over its rows; ILD:
// the per-token distances summed over tokens and layers, hidden-state and
// mixer-output terms apart. n_tok rows, n_ce of them with a CE target.
// scratch_loss: the op scratch's peak inside the fused losses (KD), which take
// chunks of rows up to be->loss_rows_max; scratch_rest: its peak everywhere
// else in the micro-batch (be->scratch.peak still covers both).
typedef struct {
    double kl, ce, ild_h, ild_a;
    int64_t n_tok, n_ce;
    size_t scratch_loss, scratch_rest;
} distill_loss_t;

// KD: loss = kl_scale * KL(teacher || student) + ce_scale * CE(targets) over B
// rows of T tokens (ids, targets host [B*T]; a target < 0 has no CE term).
int distill_kd(distill_t *d, const int32_t *ids, const int32_t *targets, int B, int T, float kl_scale, float ce_scale,
               distill_loss_t *out);
// ILD: every student layer runs from the teacher's input to that layer; loss =
// scale * sum over layers and tokens of dist(student output, teacher output) +
// dist(student mixer output, teacher mixer output), the last layer's outputs
// compared after the final norm (hybrid_model.md §9).
int distill_ild(distill_t *d, const int32_t *ids, int B, int T, float scale, distill_loss_t *out);
