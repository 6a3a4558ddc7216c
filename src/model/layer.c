#include "model/layer.h"

#include <stdlib.h>

#include "base/err.h"

void *ctx_act(const layer_ctx_t *c, int64_t n) { return arena_alloc(c->arena, (size_t)n * c->be->act_size); }
float *ctx_f32(const layer_ctx_t *c, int64_t n) { return arena_alloc(c->arena, (size_t)n * sizeof(float)); }

const ctx_pos_t *ctx_pos_find(const ctx_pos_t *pos, int n_pos, int B, int T, int pos0) {
    for (int i = 0; i < n_pos; i++)
        if (pos[i].B == B && pos[i].T == T && pos[i].pos0 == pos0) return &pos[i];
    return NULL;
}

int32_t *ctx_positions(const layer_ctx_t *c, int B, int T, int pos0) {
    const ctx_pos_t *p = ctx_pos_find(c->pos, c->n_pos, B, T, pos0);
    if (p) return p->d;
    int32_t *d = arena_alloc(c->arena, (size_t)B * T * sizeof(int32_t));
    if (!d) return NULL;
    int32_t *h = malloc((size_t)B * T * sizeof(int32_t));
    if (!h) {
        err_set(ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            h[b * T + t] = pos0 + t;
    int rc = c->be->copy_h2d(c->be, d, h, (size_t)B * T * sizeof(int32_t));
    free(h);
    return rc < 0 ? NULL : d;
}
