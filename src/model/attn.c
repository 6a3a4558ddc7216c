#include "model/attn.h"

#include <math.h>

#include "base/err.h"
#include "model/bind.h"
#include "model/linear.h"

int attn_w_bind(attn_w_t *w, const ptable_t *pt, void *flat, size_t elt, int layer) {
    TRY(bind_param(&w->q, pt, flat, elt, layer, "self_attn.q_proj.weight", 0));
    TRY(bind_param(&w->k, pt, flat, elt, layer, "self_attn.k_proj.weight", 0));
    TRY(bind_param(&w->v, pt, flat, elt, layer, "self_attn.v_proj.weight", 0));
    TRY(bind_param(&w->o, pt, flat, elt, layer, "self_attn.o_proj.weight", 0));
    TRY(bind_param(&w->q_norm, pt, flat, elt, layer, "self_attn.q_norm.weight", 1));
    TRY(bind_param(&w->k_norm, pt, flat, elt, layer, "self_attn.k_norm.weight", 1));
    return 0;
}

// q, k, v [N, H|Hkv, dh] of x at positions pos: projections, Qwen3's q/k
// norms, RoPE. sv (training) keeps what the backward needs of the norms.
static int project(const layer_ctx_t *c, const attn_w_t *w, const void *x, int64_t N, const int32_t *pos,
                   attn_saved_t *sv, void **q_, void **k_, void **v_) {
    be_t *be = c->be;
    const arch_t *a = c->a;
    int64_t qw = (int64_t)a->H * a->dh, kw = (int64_t)a->Hkv * a->dh;
    void *q = ctx_act(c, N * qw), *k = ctx_act(c, N * kw), *v = ctx_act(c, N * kw);
    if (!q || !k || !v || !pos) return ERR_NOMEM;
    lin_fwd(c, q, x, w->q, N, a->d, qw);
    lin_fwd(c, k, x, w->k, N, a->d, kw);
    lin_fwd(c, v, x, w->v, N, a->d, kw);
    if (w->q_norm) { // Qwen3: RMSNorm over each head's dh before RoPE
        void *qn = ctx_act(c, N * qw), *kn = ctx_act(c, N * kw);
        float *qr = ctx_f32(c, N * a->H), *kr = ctx_f32(c, N * a->Hkv);
        if (!qn || !kn || !qr || !kr) return ERR_NOMEM;
        be->rmsnorm_fwd(be, qn, qr, q, w->q_norm, N * a->H, a->dh, a->eps);
        be->rmsnorm_fwd(be, kn, kr, k, w->k_norm, N * a->Hkv, a->dh, a->eps);
        if (sv) {
            sv->q_raw = q, sv->k_raw = k, sv->q_rstd = qr, sv->k_rstd = kr;
        }
        q = qn, k = kn;
    }
    be->rope_fwd(be, q, qw, a->dh, pos, c->rope_cos, c->rope_sin, N, a->H, a->dh, ROPE_NEOX);
    be->rope_fwd(be, k, kw, a->dh, pos, c->rope_cos, c->rope_sin, N, a->Hkv, a->dh, ROPE_NEOX);
    *q_ = q, *k_ = k, *v_ = v;
    return 0;
}

// The cached prefill gathers at most this part of the arena at a time (one
// tile's keys and values), when a sequence's keys are not one run in memory.
#define ATTN_TILE_ARENA_PART 16

// Keys per tile of the cached prefill: c->cache_tile_keys when set, else as
// many as 1 / ATTN_TILE_ARENA_PART of the arena holds, a multiple of 64 (the
// CUDA attention's key tiles stay whole).
static int64_t tile_keys(const layer_ctx_t *c) {
    if (c->cache_tile_keys > 0) return c->cache_tile_keys;
    int64_t per_key = 2 * (int64_t)c->a->Hkv * c->a->dh * (int64_t)c->be->act_size;
    int64_t R = (int64_t)(c->arena->cap / ATTN_TILE_ARENA_PART) / per_key / 64 * 64;
    return R > 64 ? R : 64;
}

// Appends T new rows (k, v [T, Hkv, dh] of sequence b, at its position pos0)
// to the cache and attends q [T, H, dh] over the sequence's cached prefix,
// Tk = pos0 + T keys. Keys that lie in one run of memory (a contiguous
// cache, or consecutive pages) are attended in place in one causal call.
// Others (a paged cache's scattered pages) go in tiles of R keys gathered
// into the arena, as MLA's cached prefill does (mla.c attend_cache): the
// last tile, the last max(R, T) keys, keeps the bottom-right causal mask,
// the tiles before it see every key, and their results merge by
// log-sum-exp in fp32 (attn_merge); a context within one tile is one causal
// call over the gathered keys, the bits of the in-place call.
static int cached_attn(const layer_ctx_t *c, layer_cache_t *cache, int b, int pos0, int T, void *att, const void *q,
                       const void *k, const void *v) {
    be_t *be = c->be;
    const arch_t *a = c->a;
    int64_t kw = (int64_t)a->Hkv * a->dh, Tk = (int64_t)pos0 + T;
    float scale = 1.0f / sqrtf((float)a->dh);
    attn_cache_t *kc = &cache->u.attn;
    cache_copy_rows(be, cache, kc->k, kw, b, pos0, T, 0, kw, (void *)k, kw, 1);
    cache_copy_rows(be, cache, kc->v, kw, b, pos0, T, 0, kw, (void *)v, kw, 1);
    if (cache_run(cache, b, 0, Tk) == Tk) {
        int64_t row0 = cache_row(cache, b, 0);
        be->attn_fwd(be, att, NULL, q, act_at(be, kc->k, row0 * kw), act_at(be, kc->v, row0 * kw), 1, T, (int)Tk, a->H,
                     a->Hkv, a->dh, a->dh, scale, 1);
        return 0;
    }
    int64_t R = tile_keys(c), n_last = R > T ? R : T;
    if (n_last > Tk) n_last = Tk;
    int64_t last0 = Tk - n_last, n_tiles = (last0 + R - 1) / R + 1, n_out = (int64_t)T * a->H * a->dh;
    void *kt = ctx_act(c, n_last * kw), *vt = ctx_act(c, n_last * kw), *att_i = att;
    float *lse_i = NULL, *acc = NULL, *lse = NULL;
    if (n_tiles > 1) { // each tile's result, and the running one in fp32
        att_i = ctx_act(c, n_out);
        lse_i = ctx_f32(c, (int64_t)a->H * T);
        lse = ctx_f32(c, (int64_t)a->H * T);
        acc = ctx_f32(c, n_out);
        if (!att_i || !lse_i || !lse || !acc) return err_wrap(ERR_NOMEM, "attention layer %d: ", c->layer);
    }
    if (!kt || !vt) return err_wrap(ERR_NOMEM, "attention layer %d: ", c->layer);
    for (int64_t i = 0; i < n_tiles; i++) {
        int last = i == n_tiles - 1;
        int64_t u0 = last ? last0 : i * R, n = last ? n_last : (last0 - u0 < R ? last0 - u0 : R);
        const void *tk = kt, *tv = vt;
        if (cache_run(cache, b, u0, n) == n) { // one run: read in place
            int64_t row = cache_row(cache, b, u0);
            tk = act_at(be, kc->k, row * kw), tv = act_at(be, kc->v, row * kw);
        } else {
            cache_copy_rows(be, cache, kc->k, kw, b, u0, n, 0, kw, kt, kw, 0);
            cache_copy_rows(be, cache, kc->v, kw, b, u0, n, 0, kw, vt, kw, 0);
        }
        be->attn_fwd(be, att_i, lse_i, q, tk, tv, 1, T, (int)n, a->H, a->Hkv, a->dh, a->dh, scale, last);
        if (n_tiles > 1) be->attn_merge(be, acc, lse, att_i, lse_i, last ? att : NULL, i == 0, 1, T, a->H, a->dh);
    }
    return 0;
}

// The forward over the rows of runs (layer.h step_run_t): the products and
// RoPE once over every row, then per sequence of a run with a cache its rows
// appended and attended over its cached prefix (cached_attn); a run without a
// cache (training: one run) attends causally within its T rows.
static int attn_run(const layer_ctx_t *c, const attn_w_t *w, void *out, const void *x, int n_runs,
                    const step_run_t *runs, attn_saved_t *sv) {
    be_t *be = c->be;
    const arch_t *a = c->a;
    int64_t N = run_rows(runs, n_runs), qw = (int64_t)a->H * a->dh, kw = (int64_t)a->Hkv * a->dh;
    for (int i = 0; i < n_runs; i++) {
        const step_run_t *u = &runs[i];
        if (u->pos0 < 0 || u->pos0 + u->T > c->rope_npos)
            return err_set(ERR_INPUT, "position %d is beyond the RoPE table (%d positions)", u->pos0 + u->T,
                           c->rope_npos);
        if (u->cache && u->pos0 + u->T > u->cache->cap)
            return err_set(ERR_INPUT, "context of %d tokens exceeds the cache capacity %d", u->pos0 + u->T,
                           u->cache->cap);
    }
    void *q, *k, *v, *att = ctx_act(c, N * qw);
    float *lse = sv ? ctx_f32(c, N * a->H) : NULL;
    int32_t *pos = ctx_run_positions(c, runs, n_runs);
    if (!att || (sv && !lse)) return ERR_NOMEM;
    TRY(project(c, w, x, N, pos, sv, &q, &k, &v));
    for (int64_t i = 0, r = 0; i < n_runs; r += (int64_t)runs[i].n * runs[i].T, i++) {
        const step_run_t *u = &runs[i];
        if (!u->cache) { // training: causal within the run
            be->attn_fwd(be, att, lse, q, k, v, u->n, u->T, u->T, a->H, a->Hkv, a->dh, a->dh,
                         1.0f / sqrtf((float)a->dh), 1);
            continue;
        }
        // append rows [pos0, pos0 + T) of each sequence, then attend over its whole cached prefix
        for (int j = 0; j < u->n; j++) {
            int64_t rj = r + (int64_t)j * u->T;
            size_t mark = arena_mark(c->arena);
            TRY(cached_attn(c, u->cache, u->seq0 + j, u->pos0, u->T, act_at(be, att, rj * qw), act_at(be, q, rj * qw),
                            act_at(be, k, rj * kw), act_at(be, v, rj * kw)));
            arena_reset(c->arena, mark); // a tile's temporaries
        }
    }
    lin_fwd(c, out, att, w->o, N, qw, a->d);
    if (sv) {
        sv->x = x, sv->q = q, sv->k = k, sv->v = v, sv->att = att, sv->lse = lse, sv->pos = pos;
        sv->B = runs[0].n, sv->T = runs[0].T;
    }
    return 0;
}

int attn_forward(const layer_ctx_t *c, const attn_w_t *w, void *out, const void *x, int B, int T, int pos0,
                 layer_cache_t *cache, attn_saved_t *sv) {
    step_run_t all = {cache, 0, B, T, pos0};
    return attn_run(c, w, out, x, 1, &all, sv);
}

int attn_forward_runs(const layer_ctx_t *c, const attn_w_t *w, void *out, const void *x, int n_runs,
                      const step_run_t *runs) {
    TRY(forward_runs_check(runs, n_runs));
    return attn_run(c, w, out, x, n_runs, runs, NULL);
}

int attn_backward(const layer_ctx_t *c, const attn_w_t *w, attn_w_t *g, void *dx, const void *dout,
                  const attn_saved_t *sv) {
    be_t *be = c->be;
    const arch_t *a = c->a;
    int B = sv->B, T = sv->T;
    int64_t N = (int64_t)B * T, qw = (int64_t)a->H * a->dh, kw = (int64_t)a->Hkv * a->dh;
    void *datt = ctx_act(c, N * qw), *dq = ctx_act(c, N * qw), *dk = ctx_act(c, N * kw), *dv = ctx_act(c, N * kw);
    if (!datt || !dq || !dk || !dv) return ERR_NOMEM;
    lin_bwd(be, datt, 0, g->o, dout, sv->att, w->o, N, qw, a->d);
    be->attn_bwd(be, dq, dk, dv, datt, sv->q, sv->k, sv->v, sv->att, sv->lse, B, T, T, a->H, a->Hkv, a->dh, a->dh,
                 1.0f / sqrtf((float)a->dh));
    be->rope_bwd(be, dq, qw, a->dh, sv->pos, c->rope_cos, c->rope_sin, N, a->H, a->dh, ROPE_NEOX);
    be->rope_bwd(be, dk, kw, a->dh, sv->pos, c->rope_cos, c->rope_sin, N, a->Hkv, a->dh, ROPE_NEOX);
    if (w->q_norm) {
        void *dq_raw = ctx_act(c, N * qw), *dk_raw = ctx_act(c, N * kw);
        if (!dq_raw || !dk_raw) return ERR_NOMEM;
        be->rmsnorm_bwd(be, dq_raw, g->q_norm, dq, sv->q_raw, w->q_norm, sv->q_rstd, N * a->H, a->dh);
        be->rmsnorm_bwd(be, dk_raw, g->k_norm, dk, sv->k_raw, w->k_norm, sv->k_rstd, N * a->Hkv, a->dh);
        dq = dq_raw, dk = dk_raw;
    }
    lin_bwd(be, dx, 0, g->q, dq, sv->x, w->q, N, a->d, qw);
    lin_bwd(be, dx, 1, g->k, dk, sv->x, w->k, N, a->d, kw);
    lin_bwd(be, dx, 1, g->v, dv, sv->x, w->v, N, a->d, kw);
    return 0;
}

// q, k and v one matrix in memory (rows [q | k | v]) and no q / k norms:
// one product for the three.
static int qkv_adjacent(const layer_ctx_t *c, const attn_w_t *w) {
    const arch_t *a = c->a;
    const void *ws[3] = {w->q, w->k, w->v};
    const int64_t outs[3] = {(int64_t)a->H * a->dh, (int64_t)a->Hkv * a->dh, (int64_t)a->Hkv * a->dh};
    return !w->q_norm && lin_adjacent(c, ws, outs, 3, a->d);
}

int attn_step_norms_input(const layer_ctx_t *c, const attn_w_t *w, int N) {
    return N <= BE_FEW_ROWS && qkv_adjacent(c, w);
}

int attn_step(const layer_ctx_t *c, const attn_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
              const step_run_t *runs) {
    be_t *be = c->be;
    const arch_t *a = c->a;
    int N = step_rows(runs, n_runs);
    int64_t qw = (int64_t)a->H * a->dh, kw = (int64_t)a->Hkv * a->dh;
    TRY(step_check(c, runs, n_runs, 1, 1));
    void *q, *k, *v, *att = ctx_act(c, N * qw);
    int32_t *pos = ctx_step_positions(c, runs, n_runs);   // positions [N], then visible lengths [N]
    void *const *base = ctx_step_caches(c, runs, n_runs); // K caches [N], then V caches [N]
    be_pages_t pg;                                        // their page tables
    if (!att || !pos || !base) return ERR_NOMEM;
    TRY(ctx_step_pages(c, runs, n_runs, &pg));
    // q, k, v from one product when they are one matrix in memory (rows [q | k
    // | v], stride ld), then q and k rotated and k and v appended to the
    // caches in one call (k rotated into the cache); a step of a few rows
    // takes the product and the append as one op (launch-bound on a GPU).
    // Qwen3's q / k norms take the separate path. Every row at its own
    // sequence's position, in its own cache: one append and one attention
    // call for all rows of all runs.
    int64_t ldq = qw, ldk = kw;
    int adjacent = qkv_adjacent(c, w);
    if (xw && !(adjacent && N <= BE_FEW_ROWS))
        return err_set(ERR_UNSUP,
                       "attention step: an input norm needs the fused q/k/v product (attn_step_norms_input)");
    if (adjacent && N <= BE_FEW_ROWS) {
        q = ctx_act(c, N * qw);
        if (!q) return ERR_NOMEM;
        be->proj_rope_kv_append(be, q, qw, x, a->d, xw, a->eps, w->q, pos, c->rope_cos, c->rope_sin, base, base + N, pg,
                                N, a->d, a->H, a->Hkv, a->dh);
    } else if (adjacent) {
        ldq = ldk = qw + 2 * kw;
        void *qkv = ctx_act(c, N * ldq);
        if (!qkv) return ERR_NOMEM;
        lin_fwd(c, qkv, x, w->q, N, a->d, ldq);
        q = qkv, k = act_at(be, qkv, qw), v = act_at(be, qkv, qw + kw);
        be->rope_kv_append(be, q, ldq, k, ldk, v, ldk, pos, c->rope_cos, c->rope_sin, base, base + N, pg, N, a->H,
                           a->Hkv, a->dh);
    } else {
        TRY(project(c, w, x, N, pos, NULL, &q, &k, &v));
        be->kv_append(be, base, base + N, pg, kw, 0, pos, k, ldk, (int)kw, v, ldk, (int)kw, N);
    }
    be->attn_decode(be, att, q, ldq, base, base + N, pg, pos + N, step_max_ctx(runs, n_runs), N, a->H, a->Hkv, a->dh,
                    a->dh, 1.0f / sqrtf((float)a->dh));
    return lin_fwd_out(c, out, att, w->o, N, qw);
}
