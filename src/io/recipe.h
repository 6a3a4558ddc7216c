// Recipe files: the YAML configs of the published HyLo / Zebra-Llama runs
// (hylo_recipe.md §7, hybrid_model.md §11). A recipe is a flat mapping whose
// values are scalars, lists of scalars (mla_layers) or one level of mapping
// (dataset_mixer). Every key must be one the published configs use; an
// unknown key is an error naming it (a typo must not be silently ignored).
// Commands read the keys they need through the typed getters.
#pragma once
#include <stdint.h>

typedef struct {
    char *key;
    int kind;     // RECIPE_SCALAR, RECIPE_LIST, RECIPE_MAP
    char *value;  // scalar text
    char **items; // list items, or map keys and values interleaved
    int n_items;
    int line;
} recipe_entry_t;

enum { RECIPE_SCALAR = 0, RECIPE_LIST = 1, RECIPE_MAP = 2 };

typedef struct {
    char path[1024];
    recipe_entry_t *e;
    int n;
} recipe_t;

int recipe_load(recipe_t *r, const char *path);
void recipe_free(recipe_t *r);
const recipe_entry_t *recipe_find(const recipe_t *r, const char *key);
// Getters: 0 and *out unchanged when the key is absent or null (~, null or
// nothing after the colon, as in YAML); ERR_INPUT naming the file, line and
// key when the value has the wrong form, and for numbers outside [lo, hi]
// (the field's limit: nothing is truncated to fit a narrower type later;
// floats must be finite).
int recipe_str(const recipe_t *r, const char *key, const char **out);
int recipe_int(const recipe_t *r, const char *key, int64_t lo, int64_t hi, int64_t *out);
int recipe_float(const recipe_t *r, const char *key, double lo, double hi, double *out);
// A list of non-negative integers (YAML sequence, or a scalar "0,2,4" or
// "[0, 2, 4]"); *out malloc'ed, also for an empty list, and NULL (with *n 0)
// when the key is absent or null.
int recipe_int_list(const recipe_t *r, const char *key, int **out, int *n);
