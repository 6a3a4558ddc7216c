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

int step_rows(const step_run_t *runs, int n_runs) {
    int n = 0;
    for (int i = 0; i < n_runs; i++)
        n += runs[i].n;
    return n;
}

int32_t *ctx_step_positions(const layer_ctx_t *c, const step_run_t *runs, int n_runs) {
    if (c->step_pos) return (int32_t *)c->step_pos;
    int N = step_rows(runs, n_runs);
    int32_t *d = arena_alloc(c->arena, (size_t)2 * N * sizeof(int32_t));
    int32_t *h = malloc((size_t)2 * N * sizeof(int32_t));
    if (!d || !h) {
        free(h);
        err_set(ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0, row = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++, row++)
            h[row] = runs[i].cache->len, h[N + row] = runs[i].cache->len + 1;
    int rc = c->be->copy_h2d(c->be, d, h, (size_t)2 * N * sizeof(int32_t));
    free(h);
    return rc < 0 ? NULL : d;
}

int step_cache_bases(const arch_t *a, int layer, size_t act, const step_run_t *runs, int n_runs, void **out) {
    int kind = a->kind[layer], N = step_rows(runs, n_runs);
    if (kind == LAYER_GDN || kind == LAYER_M2) {
        // elements per sequence: the recurrent state (float), the conv windows (act)
        const gdn_dims_t *g = &a->gdn;
        const m2_dims_t *m = &a->m2;
        int64_t st = kind == LAYER_GDN ? (int64_t)g->n_v_heads * g->head_v * g->head_k
                                       : (int64_t)m->n_heads * m->headdim * m->d_state;
        int64_t wk = (int64_t)g->n_heads * g->head_k * g->conv, wv = (int64_t)g->n_v_heads * g->head_v * g->conv;
        int64_t wm = ((int64_t)m->d_inner + 2 * (int64_t)m->d_xb) * m->conv;
        if (out)
            for (int i = 0, r = 0; i < n_runs; i++) {
                const layer_cache_t *k = runs[i].cache;
                for (int j = 0; j < runs[i].n; j++, r++) {
                    int64_t seq = (int64_t)runs[i].seq0 + j;
                    if (kind == LAYER_GDN) {
                        out[r] = k->u.gdn.state + seq * st;
                        out[N + r] = (char *)k->u.gdn.conv_q + seq * wk * (int64_t)act;
                        out[2 * N + r] = (char *)k->u.gdn.conv_k + seq * wk * (int64_t)act;
                        out[3 * N + r] = (char *)k->u.gdn.conv_v + seq * wv * (int64_t)act;
                    } else {
                        out[r] = k->u.m2.state + seq * st;
                        out[N + r] = (char *)k->u.m2.conv + seq * wm * (int64_t)act;
                    }
                }
            }
        return kind == LAYER_GDN ? 4 * N : 2 * N;
    }
    if (kind != LAYER_ATTN && kind != LAYER_MLA) return 0;
    // elements of one sequence's cache row
    int64_t row = kind == LAYER_ATTN ? (int64_t)a->Hkv * a->dh : (int64_t)arch_mla_rkv(a, layer) + a->mla.d_rope;
    if (out)
        for (int i = 0, r = 0; i < n_runs; i++) {
            const layer_cache_t *k = runs[i].cache;
            for (int j = 0; j < runs[i].n; j++, r++) {
                int64_t first = ((int64_t)runs[i].seq0 + j) * k->cap * row; // the sequence's row 0
                if (kind == LAYER_ATTN) {
                    out[r] = (char *)k->u.attn.k + first * (int64_t)act;
                    out[N + r] = (char *)k->u.attn.v + first * (int64_t)act;
                } else {
                    out[r] = (char *)k->u.mla.kv + first * (int64_t)act;
                }
            }
        }
    return kind == LAYER_ATTN ? 2 * N : N;
}

void *const *ctx_step_caches(const layer_ctx_t *c, const step_run_t *runs, int n_runs) {
    if (c->step_cache) return c->step_cache;
    int n = step_cache_bases(c->a, c->layer, c->be->act_size, runs, n_runs, NULL);
    void **d = arena_alloc(c->arena, (size_t)(n > 0 ? n : 1) * sizeof(void *));
    void **h = malloc((size_t)(n > 0 ? n : 1) * sizeof(void *));
    if (!d || !h) {
        free(h);
        err_set(ERR_NOMEM, "out of memory");
        return NULL;
    }
    step_cache_bases(c->a, c->layer, c->be->act_size, runs, n_runs, h);
    int rc = c->be->copy_h2d(c->be, d, h, (size_t)n * sizeof(void *));
    free(h);
    return rc < 0 ? NULL : d;
}

int step_max_ctx(const step_run_t *runs, int n_runs) {
    int m = 0;
    for (int i = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        int lim = k->ctx > k->cap ? k->ctx : k->cap;
        if (lim > m) m = lim;
    }
    return m;
}

int step_check(const layer_ctx_t *c, const step_run_t *runs, int n_runs, int room, int rope) {
    for (int i = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        if (!k || runs[i].n < 1 || runs[i].seq0 < 0 || runs[i].seq0 + runs[i].n > k->B)
            return err_set(ERR_INPUT, "layer %d: decode run %d: sequences [%d, %d) of a cache of %d", c->layer, i,
                           runs[i].seq0, runs[i].seq0 + runs[i].n, k ? k->B : 0);
        if (room && k->len >= k->cap)
            return err_set(ERR_INPUT, "layer %d: cache full (%d of %d tokens)", c->layer, k->len, k->cap);
        if (rope && k->len >= c->rope_npos)
            return err_set(ERR_INPUT, "layer %d: position %d beyond the RoPE tables (%d positions)", c->layer, k->len,
                           c->rope_npos);
    }
    return 0;
}
