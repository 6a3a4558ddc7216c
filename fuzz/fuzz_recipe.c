// libFuzzer target for the recipe reader: the input is a YAML file, read from
// an in-memory file by path (recipe_load, as from disk); every key it holds
// is then read through every getter, with the ranges convert uses.
// Build: make fuzz; run: see docs/FUZZING.md.
#include "base/checked.h"
#include "fuzz_util.h"
#include "io/recipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    recipe_t r;
    if (recipe_load(&r, fuzz_memfile(0, data, size)) != 0) return 0;
    volatile int64_t sink = 0;
    for (int i = 0; i < r.n; i++) {
        const char *key = r.e[i].key, *s = NULL;
        int64_t v = 0;
        double f = 0;
        int *list = NULL, nl = 0;
        if (recipe_str(&r, key, &s) == 0 && s) sink += (int64_t)strlen(s);
        if (recipe_int(&r, key, 1, LIM_DIM, &v) == 0) {
            if (v < 0 || v > LIM_DIM) abort(); // the range is the getter's promise
            sink += v;
        }
        if (recipe_float(&r, key, 1, 1024, &f) == 0 && (f < 0 || f > 1024)) abort();
        if (recipe_int_list(&r, key, &list, &nl) == 0) {
            for (int k = 0; k < nl; k++)
                if (list[k] < 0) abort();
            free(list);
        }
        if (recipe_find(&r, key) != &r.e[i]) abort(); // keys are unique
    }
    (void)sink;
    recipe_free(&r);
    return 0;
}
