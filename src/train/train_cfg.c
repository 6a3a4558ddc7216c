// Training settings: defaults, the recipe's keys, and the printout at start.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"
#include "train/trainer.h"

void train_cfg_defaults(train_cfg_t *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->device, sizeof c->device, "cpu");
    c->ild_mode = DIST_L2;
    c->T = 2048, c->B = 8, c->GA = 1;
    c->lr = 2e-4, c->warmup_ratio = 0.01, c->sched = LR_COSINE;
    c->epochs = 1.0, c->max_steps = -1;
    c->max_grad_norm = 1.0, c->weight_decay = 0.0, c->beta1 = 0.9, c->beta2 = 0.999, c->adam_eps = 1e-8;
    c->kl_weight = 1.0, c->ce_weight = 0.0;
    c->yarn_factor = 1.0, c->yarn_orig = 2048;
    c->save_steps = 500, c->save_total_limit = 2, c->logging_steps = 10;
    c->seed = 42;
}

static int str_key(const recipe_t *r, const char *key, char *out, size_t cap) {
    const char *s = NULL;
    TRY(recipe_str(r, key, &s));
    if (!s) return 0;
    if (strlen(s) >= cap) return err_set(ERR_INPUT, "%s: %s: path longer than %zu bytes", r->path, key, cap - 1);
    snprintf(out, cap, "%s", s);
    return 1;
}

// The recipe getters check the range and name the file, line and key.
static int int_key32(const recipe_t *r, const char *key, int lo, int hi, int *out) {
    int64_t v = *out;
    TRY(recipe_int(r, key, lo, hi, &v));
    *out = (int)v;
    return 0;
}

static int bool_key(const recipe_t *r, const char *key, int *out) {
    const char *s = NULL;
    TRY(recipe_str(r, key, &s));
    if (!s) return 0;
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "1"))
        *out = 1;
    else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "0"))
        *out = 0;
    else
        return err_set(ERR_INPUT, "%s: %s: expected true or false, found '%s'", r->path, key, s);
    return 0;
}

int train_cfg_from_recipe(train_cfg_t *c, const recipe_t *r) {
    TRY(str_key(r, "model_name_or_path", c->student, sizeof c->student));
    TRY(str_key(r, "teacher_model_name_or_path", c->teacher, sizeof c->teacher));
    TRY(str_key(r, "output_dir", c->out_dir, sizeof c->out_dir));
    // dataset_mixer: {path: fraction, ...}, local token shard files or folders
    // (hylo data); a fraction f takes round(f x rows) of that corpus per
    // epoch (train/data.h).
    const recipe_entry_t *e = recipe_find(r, "dataset_mixer");
    if (e) {
        if (e->kind != RECIPE_MAP || e->n_items < 2)
            return err_set(ERR_INPUT,
                           "%s:%d: dataset_mixer: expected '{PATH: FRACTION, ...}' entries naming token shard files "
                           "or folders made by 'hylo data'",
                           r->path, e->line);
        if (e->n_items / 2 > TRAIN_MAX_SOURCES)
            return err_set(ERR_INPUT, "%s:%d: dataset_mixer: %d entries, at most %d", r->path, e->line, e->n_items / 2,
                           TRAIN_MAX_SOURCES);
        for (int i = 0; i + 1 < e->n_items; i += 2) {
            char *end;
            double f = strtod(e->items[i + 1], &end);
            if (end == e->items[i + 1] || *end || !(f > 0) || f > 1e6)
                return err_set(ERR_INPUT, "%s:%d: dataset_mixer: fraction '%s' of %s: expected a number > 0", r->path,
                               e->line, e->items[i + 1], e->items[i]);
            if (strlen(e->items[i]) >= sizeof c->data[0])
                return err_set(ERR_INPUT, "%s:%d: dataset_mixer: path of %zu bytes, at most %zu", r->path, e->line,
                               strlen(e->items[i]), sizeof c->data[0] - 1);
            snprintf(c->data[c->n_data], sizeof c->data[0], "%s", e->items[i]);
            c->data_weight[c->n_data++] = f;
        }
    }
    TRY(bool_key(r, "ILD", &c->ild));
    const char *s = NULL;
    TRY(recipe_str(r, "ild_loss", &s));
    if (s) {
        if (!strcmp(s, "l2"))
            c->ild_mode = DIST_L2;
        else if (!strcmp(s, "mse"))
            c->ild_mode = DIST_MSE;
        else
            return err_set(ERR_INPUT, "%s: ild_loss: expected l2 or mse, found '%s'", r->path, s);
    }
    if (!c->ild) c->lr = 6e-5; // the recipe's stage-2 rate, unless the file says otherwise
    TRY(int_key32(r, "max_seq_length", 2, 1 << 24, &c->T));
    TRY(int_key32(r, "per_device_train_batch_size", 1, 1 << 16, &c->B));
    TRY(int_key32(r, "gradient_accumulation_steps", 1, 1 << 16, &c->GA));
    TRY(recipe_float(r, "learning_rate", 0, 1, &c->lr));
    TRY(recipe_float(r, "warmup_ratio", 0, 1, &c->warmup_ratio));
    TRY(recipe_int(r, "warmup_steps", 0, INT64_MAX / 2, &c->warmup_steps));
    s = NULL;
    TRY(recipe_str(r, "lr_scheduler_type", &s));
    if (s) {
        if (!strcmp(s, "cosine"))
            c->sched = LR_COSINE;
        else if (!strcmp(s, "linear"))
            c->sched = LR_LINEAR;
        else if (!strcmp(s, "constant") || !strcmp(s, "constant_with_warmup"))
            c->sched = LR_CONSTANT;
        else
            return err_set(ERR_INPUT, "%s: lr_scheduler_type: expected cosine, linear or constant, found '%s'", r->path,
                           s);
    }
    TRY(recipe_float(r, "num_train_epochs", 0, 1e6, &c->epochs));
    TRY(recipe_int(r, "max_steps", -1, INT64_MAX / 2, &c->max_steps));
    TRY(recipe_float(r, "max_grad_norm", 0, 1e30, &c->max_grad_norm));
    TRY(recipe_float(r, "weight_decay", 0, 1, &c->weight_decay));
    TRY(recipe_float(r, "kl_weight", 0, 1e6, &c->kl_weight));
    TRY(recipe_float(r, "ce_weight", 0, 1e6, &c->ce_weight));
    TRY(recipe_float(r, "factor", 1, 1024, &c->yarn_factor));
    TRY(int_key32(r, "original_max_position_embeddings", 1, 1 << 24, &c->yarn_orig));
    TRY(bool_key(r, "gradient_checkpointing", &c->recompute));
    TRY(bool_key(r, "deterministic", &c->deterministic));
    TRY(bool_key(r, "freeze_non_mla", &c->freeze_non_mla));
    TRY(recipe_int(r, "save_steps", -1, INT64_MAX / 2, &c->save_steps));
    TRY(int_key32(r, "save_total_limit", -1, 1 << 20, &c->save_total_limit));
    TRY(recipe_int(r, "logging_steps", 1, INT64_MAX / 2, &c->logging_steps));
    int64_t seed = (int64_t)c->seed;
    TRY(recipe_int(r, "seed", 0, INT64_MAX, &seed));
    c->seed = (uint64_t)seed;
    s = NULL;
    TRY(recipe_str(r, "device", &s));
    if (s) {
        if (strcmp(s, "cpu") && strcmp(s, "cuda"))
            return err_set(ERR_INPUT, "%s: device: expected cpu or cuda, found '%s'", r->path, s);
        snprintf(c->device, sizeof c->device, "%s", s);
    }
    return 0;
}

void train_cfg_print(const train_cfg_t *c, FILE *f) {
    static const char *sched[] = {"cosine", "linear", "constant"};
    fprintf(f, "stage                        %s\n", c->ild ? "1: layer-wise distillation (ILD)" : "2: end-to-end KD");
    fprintf(f, "model_name_or_path           %s\n", c->student);
    fprintf(f, "teacher_model_name_or_path   %s\n", c->teacher[0] ? c->teacher : "(none)");
    fprintf(f, "dataset_mixer                {");
    for (int i = 0; i < c->n_data; i++)
        fprintf(f, "%s%s: %g", i ? ", " : "", c->data[i], c->data_weight[i]);
    fprintf(f, "}\n");
    fprintf(f, "output_dir                   %s\n", c->out_dir);
    fprintf(f, "device                       %s\n", c->device);
    if (c->ild) fprintf(f, "ild_loss                     %s\n", c->ild_mode == DIST_L2 ? "l2" : "mse");
    fprintf(f, "max_seq_length               %d\n", c->T);
    fprintf(f, "per_device_train_batch_size  %d\n", c->B);
    fprintf(f, "gradient_accumulation_steps  %d\n", c->GA);
    fprintf(f, "learning_rate                %g\n", c->lr);
    fprintf(f, "lr_scheduler_type            %s\n", sched[c->sched]);
    if (c->warmup_steps > 0)
        fprintf(f, "warmup_steps                 %lld\n", (long long)c->warmup_steps);
    else
        fprintf(f, "warmup_ratio                 %g\n", c->warmup_ratio);
    if (c->max_steps > 0)
        fprintf(f, "max_steps                    %lld\n", (long long)c->max_steps);
    else
        fprintf(f, "num_train_epochs             %g\n", c->epochs);
    fprintf(f, "max_grad_norm                %g\n", c->max_grad_norm);
    fprintf(f, "optim                        adamw (betas %g, %g; eps %g; weight_decay %g)\n", c->beta1, c->beta2,
            c->adam_eps, c->weight_decay);
    if (!c->ild) fprintf(f, "kl_weight / ce_weight        %g / %g\n", c->kl_weight, c->ce_weight);
    if (c->yarn_factor > 1)
        fprintf(f, "factor / original_max_pos    %g / %d (YaRN on MLA)\n", c->yarn_factor, c->yarn_orig);
    fprintf(f, "gradient_checkpointing       %s\n", c->recompute ? "true" : "false");
    fprintf(f, "deterministic                %s\n", c->deterministic ? "true" : "false");
    if (c->freeze_non_mla) fprintf(f, "freeze_non_mla               true\n");
    fprintf(f, "save_steps / total_limit     %lld / %d\n", (long long)c->save_steps, c->save_total_limit);
    fprintf(f, "logging_steps                %lld\n", (long long)c->logging_steps);
    fprintf(f, "seed                         %llu\n", (unsigned long long)c->seed);
}
