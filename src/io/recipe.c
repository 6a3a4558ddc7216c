#include "io/recipe.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/fs.h"
#include "base/parse.h"

// Keys of the published configs (hylo_recipe.md §7 and hybrid_model.md §11).
static const char *known_keys[] = {
    "model_name_or_path",
    "teacher_model_name_or_path",
    "linear_type",
    "linear_ILD_path",
    "mla_ILD_path",
    "mamba_ILD_path",
    "mla_layers",
    "attn_layers",
    "ssm_layers",
    "max_seq_length",
    "factor",
    "original_max_position_embeddings",
    "kl_weight",
    "ce_weight",
    "fused_kl_hidden",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_ratio",
    "num_train_epochs",
    "max_steps",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "use_lora_layer_norm",
    "use_full_kv_head",
    "ILD",
    "data_ratio",
    "dataset_mixer",
    "dataset_splits",
    "chat_template",
    "output_dir",
    "overwrite_output_dir",
    "seed",
    "bf16",
    "torch_dtype",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "save_steps",
    "save_strategy",
    "save_total_limit",
    "logging_steps",
    "logging_strategy",
    "log_level",
    "report_to",
    "with_distill",
    "init_with_svd",
    "init_with_kqvo",
    "decontaminate",
    "use_flash_attention_2",
    "preprocessing_num_workers",
    "do_eval",
    "evaluation_strategy",
    "eval_steps",
    "max_grad_norm",
    "push_to_hub",
    "hub_model_id",
    "remove_unused_columns",
    "freeze_non_mla",
    // hylo's own keys (docs/TRAINING.md)
    "ild_loss",
    "device",
    "deterministic",
    "beta",
    "max_length",
    "max_prompt_length",
    "optim",
    "teacher_load_in_8bit",
    "prev_checkpoint_path",
    "layer_rank_list",
    "q_energy_ratio",
    "kv_energy_ratio",
    "mla_num_key_value_heads",
    "use_fixed_rank_for_first_and_last_block",
    "repeat_kv_before_conv",
    "dataset_name",
    "gdn_num_heads",
    "gdn_head_dim",
    "warmup_steps",
    "weight_decay",
};

static int is_known(const char *k) {
    for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0]; i++)
        if (!strcmp(known_keys[i], k)) return 1;
    return 0;
}

static char *dup_str(const unsigned char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void recipe_free(recipe_t *r) {
    for (int i = 0; i < r->n; i++) {
        free(r->e[i].key);
        free(r->e[i].value);
        for (int j = 0; j < r->e[i].n_items; j++)
            free(r->e[i].items[j]);
        free(r->e[i].items);
    }
    free(r->e);
    r->e = NULL;
    r->n = 0;
}

static int push_item(const recipe_t *r, recipe_entry_t *e, const yaml_event_t *ev) {
    if (e->n_items >= LIM_ENTRIES)
        return err_set(ERR_INPUT, "%s:%d: key %s: more than %lld items", r->path, e->line, e->key,
                       (long long)LIM_ENTRIES);
    // The array doubles when n_items reaches a power of two: linear in the items.
    if ((e->n_items & (e->n_items - 1)) == 0) {
        size_t cap = e->n_items ? 2 * (size_t)e->n_items : 1;
        char **it = realloc(e->items, cap * sizeof *it);
        if (!it) return err_set(ERR_NOMEM, "%s: out of memory for %zu list items", r->path, cap);
        e->items = it;
    }
    char **it = e->items;
    if (!(it[e->n_items] = dup_str(ev->data.scalar.value, ev->data.scalar.length)))
        return err_set(ERR_NOMEM, "out of memory");
    e->n_items++;
    return 0;
}

// Reads the value events of one key into e (scalar, flat sequence or flat map).
static int read_value(recipe_t *r, yaml_parser_t *p, yaml_event_t *ev, recipe_entry_t *e) {
    if (ev->type == YAML_SCALAR_EVENT) {
        e->kind = RECIPE_SCALAR;
        e->value = dup_str(ev->data.scalar.value, ev->data.scalar.length);
        return e->value ? 0 : err_set(ERR_NOMEM, "out of memory");
    }
    int seq = ev->type == YAML_SEQUENCE_START_EVENT;
    if (!seq && ev->type != YAML_MAPPING_START_EVENT)
        return err_set(ERR_INPUT, "%s:%d: key %s: unsupported YAML value", r->path, e->line, e->key);
    e->kind = seq ? RECIPE_LIST : RECIPE_MAP;
    for (;;) {
        yaml_event_t it;
        if (!yaml_parser_parse(p, &it))
            return err_set(ERR_INPUT, "%s:%zu: YAML error: %s", r->path, p->problem_mark.line + 1,
                           p->problem ? p->problem : "?");
        int end = it.type == (seq ? YAML_SEQUENCE_END_EVENT : YAML_MAPPING_END_EVENT);
        int rc = 0;
        if (!end) {
            if (it.type != YAML_SCALAR_EVENT)
                rc = err_set(ERR_INPUT, "%s:%d: key %s: nested values are not supported", r->path, e->line, e->key);
            else
                rc = push_item(r, e, &it);
        }
        yaml_event_delete(&it);
        if (rc < 0) return rc;
        if (end) return 0;
    }
}

int recipe_load(recipe_t *r, const char *path) {
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path);
    char *text;
    size_t len;
    TRY(fs_read_all(path, &text, &len)); // a regular file only: a FIFO would block
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int rc = 0, depth = 0, done = 0;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = err_set(ERR_INPUT, "%s:%zu: YAML error: %s", path, p.problem_mark.line + 1,
                         p.problem ? p.problem : "?");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
            if (depth++ > 0) rc = err_set(ERR_INPUT, "%s: unexpected nested mapping", path);
            break;
        case YAML_MAPPING_END_EVENT: depth--; break;
        case YAML_SCALAR_EVENT: {
            if (depth != 1) {
                rc = err_set(ERR_INPUT, "%s: the recipe must be a mapping of keys", path);
                break;
            }
            recipe_entry_t e = {0};
            e.key = dup_str(ev.data.scalar.value, ev.data.scalar.length);
            e.line = (int)ev.start_mark.line + 1;
            if (!e.key) {
                rc = err_set(ERR_NOMEM, "out of memory");
                break;
            }
            if (!is_known(e.key)) rc = err_set(ERR_INPUT, "%s:%d: unknown key '%s'", path, e.line, e.key);
            if (rc == 0 && recipe_find(r, e.key))
                rc = err_set(ERR_INPUT, "%s:%d: duplicate key '%s'", path, e.line, e.key);
            yaml_event_t val;
            if (rc == 0 && !yaml_parser_parse(&p, &val))
                rc = err_set(ERR_INPUT, "%s:%zu: YAML error: %s", path, p.problem_mark.line + 1,
                             p.problem ? p.problem : "?");
            else if (rc == 0) {
                rc = read_value(r, &p, &val, &e);
                yaml_event_delete(&val);
            }
            recipe_entry_t *ne = rc == 0 ? realloc(r->e, (size_t)(r->n + 1) * sizeof *ne) : NULL;
            if (rc == 0 && !ne) rc = err_set(ERR_NOMEM, "out of memory");
            if (rc == 0) {
                r->e = ne;
                r->e[r->n++] = e;
            } else {
                free(e.key);
                free(e.value);
                for (int j = 0; j < e.n_items; j++)
                    free(e.items[j]);
                free(e.items);
            }
            break;
        }
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    free(text);
    if (rc < 0) recipe_free(r);
    return rc;
}

const recipe_entry_t *recipe_find(const recipe_t *r, const char *key) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->e[i].key, key)) return &r->e[i];
    return NULL;
}

// YAML's null spellings: a key written as "seed: ~" or "seed:" is absent.
static int is_null(const char *v) {
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

// The scalar value of key, or NULL when the key is absent or null.
static int scalar(const recipe_t *r, const char *key, const recipe_entry_t **e) {
    *e = recipe_find(r, key);
    if (*e && (*e)->kind != RECIPE_SCALAR)
        return err_set(ERR_INPUT, "%s:%d: key %s must be a single value", r->path, (*e)->line, key);
    if (*e && is_null((*e)->value)) *e = NULL;
    return 0;
}

int recipe_str(const recipe_t *r, const char *key, const char **out) {
    const recipe_entry_t *e;
    TRY(scalar(r, key, &e));
    if (e) *out = e->value;
    return 0;
}

// "FILE:LINE" for the range messages of base/checked.h.
static const char *where(const recipe_t *r, const recipe_entry_t *e, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%d", r->path, e->line);
    return buf;
}

int recipe_int(const recipe_t *r, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const recipe_entry_t *e;
    TRY(scalar(r, key, &e));
    if (!e) return 0;
    int64_t v;
    if (!parse_int(e->value, INT64_MIN, INT64_MAX, &v))
        return err_set(ERR_INPUT, "%s:%d: key %s: expected an integer in [%lld, %lld], found '%s'", r->path, e->line,
                       key, (long long)lo, (long long)hi, e->value);
    char f[96], w[1100];
    snprintf(f, sizeof f, "key %s", key);
    TRY(ck_int(where(r, e, w, sizeof w), f, v, lo, hi));
    *out = v;
    return 0;
}

int recipe_float(const recipe_t *r, const char *key, double lo, double hi, double *out) {
    const recipe_entry_t *e;
    TRY(scalar(r, key, &e));
    if (!e) return 0;
    double v;
    if (!parse_double(e->value, -HUGE_VAL, HUGE_VAL, &v))
        return err_set(ERR_INPUT, "%s:%d: key %s: expected a finite number in [%g, %g], found '%s'", r->path, e->line,
                       key, lo, hi, e->value);
    char f[96], w[1100];
    snprintf(f, sizeof f, "key %s", key);
    TRY(ck_real(where(r, e, w, sizeof w), f, v, lo, hi));
    *out = v;
    return 0;
}

int recipe_int_list(const recipe_t *r, const char *key, int **out, int *n) {
    *out = NULL;
    *n = 0;
    const recipe_entry_t *e = recipe_find(r, key);
    if (!e || (e->kind == RECIPE_SCALAR && is_null(e->value))) return 0;
    if (e->kind == RECIPE_MAP) return err_set(ERR_INPUT, "%s:%d: key %s must be a list", r->path, e->line, key);
    // A YAML sequence holds one integer per item; a scalar "0,2,4" or "[0, 2, 4]" is accepted too.
    int cap = e->kind == RECIPE_LIST ? e->n_items : (int)(strlen(e->value) / 2 + 1);
    int *v = malloc((size_t)(cap ? cap : 1) * sizeof(int)), count = 0;
    if (!v) return err_set(ERR_NOMEM, "out of memory");
    const char *bad = NULL;
    if (e->kind == RECIPE_SCALAR && (count = parse_int_list(e->value, 0, INT_MAX, v, cap)) < 0) bad = e->value;
    for (int i = 0; e->kind == RECIPE_LIST && i < e->n_items && !bad; i++) {
        int64_t x;
        if (parse_int(e->items[i], 0, INT_MAX, &x))
            v[count++] = (int)x;
        else
            bad = e->items[i];
    }
    if (bad) {
        free(v);
        return err_set(ERR_INPUT, "%s:%d: key %s: '%s' is not a list of non-negative integers", r->path, e->line, key,
                       bad);
    }
    *out = v;
    *n = count;
    return 0;
}
