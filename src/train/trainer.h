// hylo's trainer: stage 1 (Enhanced-ILD) and stage 2 (end-to-end KD) of the
// HyLo recipe over token shards, with gradient accumulation, clipping, AdamW
// and a warm-up + decay schedule; checkpoints that are valid hybrid folders
// plus the state for an exact resume; a metrics file and a loss plot.
#pragma once
#include <signal.h>
#include <stdint.h>

#include "io/recipe.h"
#include "model/model.h"
#include "train/dist.h"
#include "train/optim.h"

#define TRAIN_MAX_SOURCES 16

typedef struct {
    // what to train on what
    char student[1024];                    // a hybrid checkpoint folder (the initial student)
    char teacher[1024];                    // teacher_model_name_or_path
    char data[TRAIN_MAX_SOURCES][1024];    // dataset_mixer: token shard files or folders (hylo data)
    double data_weight[TRAIN_MAX_SOURCES]; // and their fractions
    int n_data;
    char out_dir[1024]; // output_dir
    char device[16];    // cpu | cuda
    int ild;            // 1: stage 1 (ILD), 0: stage 2 (KD)
    int ild_mode;       // DIST_L2 (published) or DIST_MSE
    // shapes and schedule
    int T, B, GA; // max_seq_length, per_device_train_batch_size, gradient_accumulation_steps
    double lr, warmup_ratio;
    int64_t warmup_steps; // > 0 overrides warmup_ratio
    lr_sched_t sched;
    double epochs; // num_train_epochs (used when max_steps <= 0)
    int64_t max_steps;
    double max_grad_norm; // <= 0: no clipping
    double weight_decay, beta1, beta2, adam_eps;
    double kl_weight, ce_weight;
    double yarn_factor; // factor (> 1: YaRN on the student's MLA RoPE)
    int yarn_orig;      // original_max_position_embeddings
    int recompute;      // gradient_checkpointing
    int deterministic;  // the backend's fixed-order reductions (backend.h be->deterministic)
    int freeze_non_mla; // X-EcoMLA's option: only parameters named *mla* train
    // checkpoints and logs
    int64_t save_steps;   // every N optimizer steps (<= 0: only at the end)
    int save_total_limit; // keep the last K checkpoint-* folders (<= 0: all)
    int64_t logging_steps;
    uint64_t seed;
    int resume;                  // continue from the newest checkpoint in out_dir
    volatile sig_atomic_t *stop; // set by a signal handler: save and return
    dist_t *dist;                // the ranks of a data-parallel run (NULL: one process)
} train_cfg_t;

// The recipe defaults (transformers' TrainingArguments and the published
// configs: lr 2e-4 ILD / 6e-5 KD is the recipe's choice, not a default).
void train_cfg_defaults(train_cfg_t *c);
// Fills c from a recipe's keys (hylo_recipe.md §7, hybrid_model.md §11); keys
// that change nothing here are accepted; values out of range are errors naming
// the key. The student is model_name_or_path (must be a hybrid folder; the
// command builds it by converting first when it is not).
int train_cfg_from_recipe(train_cfg_t *c, const recipe_t *r);
// Prints every setting, defaults included.
void train_cfg_print(const train_cfg_t *c, FILE *f);
// Runs the training. 0 when done (or stopped cleanly by *stop).
int train_run(const train_cfg_t *c);

// The activation plan (docs/TRAINING.md "Memory"): one arena, the student
// run's, that the teacher's forward borrows (its run has none of its own), and
// the op scratch, for a micro-batch of c's stage at B x T.
typedef struct {
    int n_probe;            // 1: measured at T itself (T <= 256); 2: at 128 and 256, extrapolated
    int Ts[2];              // the probe lengths
    size_t peak[2];         // the arena's peak at each (the teacher's forward included)
    size_t teacher_peak[2]; // the teacher's forward's own peak inside it
    size_t scratch_peak[2]; // the op scratch's peak at each: the larger of
    size_t scratch_loss[2]; // its peak inside the fused losses (KD)
    size_t scratch_rest[2]; // and everywhere else
    size_t n_alloc;         // allocations of the longest probe's micro-batch
    size_t arena;           // bytes to reserve at T: the line through the probes + 256 n_alloc
    size_t scratch; // the op scratch to reserve at T: (the larger of the losses' and the rest's) x 1.05 + 64 MiB
} train_plan_t;
// Measures the plan on student s and teacher t (NULL: none), with o's
// gradient (left zeroed) for the probes' backward.
int train_plan(const train_cfg_t *c, be_t *be, model_t *s, model_t *t, optim_t *o, train_plan_t *p);
