#include "model/layer.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void *ctx_act(const layer_ctx_t *c, int64_t n) { return arena_alloc(c->arena, (size_t)n * c->be->act_size); }
float *ctx_f32(const layer_ctx_t *c, int64_t n) { return arena_alloc(c->arena, (size_t)n * sizeof(float)); }

int ctx_pos_is(const ctx_pos_t *p, int B, int T, int pos0) {
    return p && p->d && p->B == B && p->T == T && p->pos0 == pos0;
}

int64_t run_rows(const step_run_t *runs, int n_runs) {
    int64_t n = 0;
    for (int i = 0; i < n_runs; i++)
        n += (int64_t)runs[i].n * runs[i].T;
    return n;
}

int forward_runs_check(const step_run_t *runs, int n_runs) {
    for (int i = 0; i < n_runs; i++) {
        const step_run_t *u = &runs[i];
        if (!u->cache || u->n < 1 || u->T < 1 || u->seq0 < 0 || u->seq0 + u->n > u->cache->B)
            return err_set(ERR_INPUT, "forward run %d: %d x %d tokens of sequences from %d of a cache of %d", i, u->n,
                           u->T, u->seq0, u->cache ? u->cache->B : 0);
    }
    return 0;
}

int32_t *ctx_run_positions(const layer_ctx_t *c, const step_run_t *runs, int n_runs) {
    if (c->run_pos) return (int32_t *)c->run_pos;
    if (n_runs == 1 && ctx_pos_is(c->pos, runs[0].n, runs[0].T, runs[0].pos0)) return c->pos->d;
    int64_t N = run_rows(runs, n_runs);
    int32_t *d = arena_alloc(c->arena, (size_t)(N > 0 ? N : 1) * sizeof(int32_t));
    int32_t *h = malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t));
    if (!d || !h) {
        free(h);
        err_set(ERR_NOMEM, "out of memory");
        return NULL;
    }
    int64_t row = 0;
    for (int i = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++)
            for (int t = 0; t < runs[i].T; t++)
                h[row++] = runs[i].pos0 + t;
    int rc = c->be->copy_h2d(c->be, d, h, (size_t)N * sizeof(int32_t));
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
                // the sequence's row 0; a paged one's pages are rows of the whole pool
                int64_t first = k->pages ? 0 : ((int64_t)runs[i].seq0 + j) * k->cap * row;
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

int run_seqs(const layer_ctx_t *c, const step_run_t *runs, int n_runs, run_seqs_t *out) {
    int n = step_rows(runs, n_runs), nb = step_cache_bases(c->a, c->layer, c->be->act_size, runs, n_runs, NULL);
    memset(out, 0, sizeof *out);
    void **base = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(void *) + (size_t)(n + 1) * sizeof(int32_t));
    if (!base) return err_set(ERR_NOMEM, "out of memory");
    int32_t *cu = (int32_t *)(base + (nb > 0 ? nb : 1));
    step_cache_bases(c->a, c->layer, c->be->act_size, runs, n_runs, base);
    cu[0] = 0;
    for (int i = 0, s = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++, s++)
            cu[s + 1] = cu[s] + runs[i].T;
    *out = (run_seqs_t){{n, cu}, base};
    return 0;
}

void run_seqs_free(run_seqs_t *rs) {
    free(rs->base);
    memset(rs, 0, sizeof *rs);
}

int64_t cache_run(const layer_cache_t *c, int b, int64_t u, int64_t n) {
    if (!c->pages) return n;
    const int32_t *pg = c->pages + (int64_t)b * c->page_stride;
    int64_t i = u / BE_PAGE_ROWS, got = BE_PAGE_ROWS - u % BE_PAGE_ROWS;
    while (got < n && pg[i + 1] == pg[i] + 1)
        got += BE_PAGE_ROWS, i++;
    return got < n ? got : n;
}

void cache_copy_rows(be_t *be, const layer_cache_t *c, void *buf, int64_t w, int b, int64_t u0, int64_t n, int64_t col,
                     int64_t cols, void *x, int64_t ldx, int to_cache) {
    if (n <= 0) return;
    if (c->pages) {
        be->copy_pages(be, x, ldx, act_at(be, buf, col), w, c->pages + (int64_t)b * c->page_stride, u0, n, cols,
                       to_cache);
        return;
    }
    void *rows = act_at(be, buf, cache_row(c, b, u0) * w + col);
    if (to_cache)
        be->copy2d(be, rows, w, x, ldx, n, cols, 0);
    else
        be->copy2d(be, x, ldx, rows, w, n, cols, 0);
}

static int pages_of(int64_t rows) { return (int)((rows + BE_PAGE_ROWS - 1) / BE_PAGE_ROWS); }

int step_page_stride(const step_run_t *runs, int n_runs) {
    int paged = 0, m = 0;
    for (int i = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        int n = pages_of(k->pages ? (k->ctx > k->cap ? k->ctx : k->cap) : k->cap);
        paged |= k->pages != NULL;
        if (n > m) m = n;
    }
    return paged ? m : 0;
}

void step_page_tables(const step_run_t *runs, int n_runs, int stride, int32_t *out) {
    for (int i = 0, r = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        int held = pages_of(k->cap); // a paged cache's cap is its pages' rows
        for (int j = 0; j < runs[i].n; j++, r++) {
            int32_t *t = out + (int64_t)r * stride;
            for (int p = 0; p < stride; p++)
                t[p] = p >= held ? 0 : k->pages ? k->pages[(int64_t)(runs[i].seq0 + j) * k->page_stride + p] : p;
        }
    }
}

int ctx_step_pages(const layer_ctx_t *c, const step_run_t *runs, int n_runs, be_pages_t *pg) {
    if (c->step_cache) {
        *pg = c->step_pages;
        return 0;
    }
    *pg = (be_pages_t){NULL, 0};
    int stride = step_page_stride(runs, n_runs), N = step_rows(runs, n_runs);
    if (!stride) return 0;
    size_t bytes = (size_t)N * stride * sizeof(int32_t);
    int32_t *d = arena_alloc(c->arena, bytes), *h = malloc(bytes);
    if (!d || !h) {
        free(h);
        return err_set(ERR_NOMEM, "page tables of a decode step of %d rows", N);
    }
    step_page_tables(runs, n_runs, stride, h);
    int rc = c->be->copy_h2d(c->be, d, h, bytes);
    free(h);
    if (rc < 0) return rc;
    *pg = (be_pages_t){d, stride};
    return 0;
}

int step_ctx_bucket(int len, int ctx, int cap) {
    const int lim = ctx > cap ? ctx : cap;
    int64_t b = STEP_CTX_MIN;
    while (b < (int64_t)len + 1 && b < lim)
        b *= 2;
    return b < lim ? (int)b : lim;
}

int step_max_ctx(const step_run_t *runs, int n_runs) {
    int m = 0;
    for (int i = 0; i < n_runs; i++) {
        const layer_cache_t *k = runs[i].cache;
        const int b = step_ctx_bucket(k->len, k->ctx, k->cap);
        if (b > m) m = b;
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
