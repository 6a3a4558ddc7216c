#include "model/bind.h"

#include <stdio.h>

#include "base/err.h"

int bind_param(void **dst, const ptable_t *pt, void *flat, size_t elt, int layer, const char *suffix, int optional) {
    char name[128];
    if (layer >= 0)
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, suffix);
    else
        snprintf(name, sizeof name, "%s", suffix);
    int64_t off = ptable_off(pt, name);
    if (off < 0) {
        *dst = NULL;
        return optional ? 0 : err_set(ERR_INPUT, "parameter %s is not in the model's layout", name);
    }
    if (elt == 0) { // per-parameter addresses (model_bind's note)
        const param_t *p = ptable_find(pt, name);
        *dst = ((void *const *)flat)[p - pt->p];
    } else {
        *dst = (char *)flat + (size_t)off * elt;
    }
    return 0;
}
