// Multi-head Latent Attention: decompressed forward (training / prefill), its
// backward, and the absorbed decode step. See mla.h for the shapes and spec
// hybrid_model.md §2-§3 for the reference behaviour.
#include "model/mla.h"

#include <math.h>

#include "base/err.h"
#include "model/bind.h"
#include "model/linear.h"
#include "model/rope.h"

// ---- helpers -----------------------------------------------------------------

// Every size this layer needs, read once from the arch for this layer.
typedef struct {
    int d, H, G, hpg;   // width, query heads, KV heads, query heads per KV head
    int rq, rkv;        // latent ranks (rq 0 = plain q_proj)
    int dn, dr, dv, qd; // d_nope, d_rope, d_v, d_nope + d_rope
    int kvh;            // rows of kv_b per KV head: d_nope + d_v
    int L;              // one cache row: r_kv + d_rope
    int latent_norm, qk_norm;
    float eps;   // Qwen3 q/k norm eps (rms_norm_eps)
    float scale; // softmax scale
} dims_t;

static const float LATENT_EPS = 1e-6f; // q_a_layernorm / kv_a_layernorm (spec §2.3)

static dims_t dims(const layer_ctx_t *c) {
    const arch_t *a = c->a;
    const mla_dims_t *m = &a->mla;
    dims_t D;
    D.d = a->d, D.H = a->H, D.G = m->n_kv, D.hpg = a->H / m->n_kv;
    D.rq = arch_mla_rq(a, c->layer), D.rkv = arch_mla_rkv(a, c->layer);
    D.dn = m->d_nope, D.dr = m->d_rope, D.dv = m->d_v, D.qd = m->d_nope + m->d_rope;
    D.kvh = m->d_nope + m->d_v, D.L = D.rkv + m->d_rope;
    D.latent_norm = m->latent_norm, D.qk_norm = a->qk_norm;
    D.eps = a->eps;
    // qd^-1/2, times mscale(F, mscale_all_dim)^2 when a DeepSeek-style config asks
    // for it (1 in every shipped model: the YaRN mscale lives in the cos/sin tables).
    D.scale = (float)(1.0 / sqrt((double)D.qd) * rope_softmax_mult(&m->rope));
    return D;
}

#define ACT(p, n)                                                                                                      \
    do {                                                                                                               \
        if (!((p) = ctx_act(c, (n)))) return err_wrap(ERR_NOMEM, "MLA layer %d: ", c->layer);                          \
    } while (0)
#define F32(p, n)                                                                                                      \
    do {                                                                                                               \
        if (!((p) = ctx_f32(c, (n)))) return err_wrap(ERR_NOMEM, "MLA layer %d: ", c->layer);                          \
    } while (0)

int mla_w_bind(mla_w_t *w, const ptable_t *pt, void *flat, size_t elt_size, int layer) {
    // Optional ones are checked against the configuration by check_weights.
    TRY(bind_param(&w->q_a, pt, flat, elt_size, layer, "mla.q_a_proj.weight", 1));
    TRY(bind_param(&w->q_a_norm, pt, flat, elt_size, layer, "mla.q_a_layernorm.weight", 1));
    TRY(bind_param(&w->q_b, pt, flat, elt_size, layer, "mla.q_b_proj.weight", 1));
    TRY(bind_param(&w->q_proj, pt, flat, elt_size, layer, "mla.q_proj.weight", 1));
    TRY(bind_param(&w->kv_a, pt, flat, elt_size, layer, "mla.kv_a_proj_with_mqa.weight", 0));
    TRY(bind_param(&w->kv_a_norm, pt, flat, elt_size, layer, "mla.kv_a_layernorm.weight", 1));
    TRY(bind_param(&w->kv_b, pt, flat, elt_size, layer, "mla.kv_b_proj.weight", 0));
    TRY(bind_param(&w->o, pt, flat, elt_size, layer, "mla.out_proj.weight", 0));
    TRY(bind_param(&w->q_norm, pt, flat, elt_size, layer, "mla.q_norm.weight", 1));
    TRY(bind_param(&w->k_norm, pt, flat, elt_size, layer, "mla.k_norm.weight", 1));
    return 0;
}

// The projections the forward and the step share, for N rows at positions pos:
// q [N, H, qd] (q_norm, RoPE on q_pe), the latent cn [N, r_kv] (latent norm) and
// the rope key kpe [N, d_rope] (k_norm, RoPE), rows of cn and kpe at strides
// ldc, ldk. With save, the intermediates the backward needs are kept (and the
// norms record rstd). A step leaves q_pe and k_pe unrotated (mla_rope_append
// rotates them on the way into the cache), and without latent or k norms takes
// cn and kpe in place in kv_a's output (strides L, or q_a and kv_a's joint
// rows), two copies fewer. A step of a few rows with the joint product leaves
// q unprojected too: q_b's input cq_joint (rows ld_a apart) for
// proj_mla_rope_append, which writes q with the rotation and the append.
typedef struct {
    void *cq, *cqn, *q_raw, *q, *c, *cn, *kpe_raw, *kpe;
    float *rstd_cq, *rstd_q, *rstd_c, *rstd_kpe;
    int64_t ldc, ldk;
    const void *cq_joint;
    int64_t ld_a;
} proj_t;

// A step without latent or q / k norms takes q_a and kv_a as one product when
// they lie one after the other (params.c): rows [cq | c | k_pe].
static int joint_a(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w) {
    const void *ws[2] = {w->q_a, w->kv_a};
    const int64_t outs[2] = {D->rq, D->L};
    return D->rq > 0 && !D->latent_norm && !D->qk_norm && !lin_qmat(c, w->q_b) && lin_adjacent(c, ws, outs, 2, D->d);
}

int mla_step_norms_input(const layer_ctx_t *c, const mla_w_t *w) {
    dims_t D = dims(c);
    return joint_a(c, &D, w);
}

// xw: a step's input is the residual stream, normed with this gain by the
// joint q_a / kv_a product (mla_step_norms_input); else NULL.
static int project(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w, const void *x, const void *xw, int64_t N,
                   const int32_t *pos, int save, int step, proj_t *p) {
    be_t *be = c->be;
    *p = (proj_t){0};
    p->ldc = D->rkv, p->ldk = D->dr;
    // the joint product: rows [cq | c | k_pe] of ld = rq + L, q_b reading cq
    // and the cache append c and k_pe in place
    void *qkv_a = NULL;
    int64_t ld_a = D->rq + D->L;
    if (step && joint_a(c, D, w)) ACT(qkv_a, N * ld_a);
    if (xw && !qkv_a)
        return err_set(ERR_UNSUP, "MLA step: an input norm needs the joint q_a / kv_a product (mla_step_norms_input)");
    // query: q_a -> latent norm -> q_b, or one q_proj
    ACT(p->q, N * D->H * D->qd);
    if (qkv_a) {
        lin_fwd_normed(c, qkv_a, x, xw, w->q_a, N, D->d, ld_a);
        if (N <= BE_FEW_ROWS) // q_b's product waits for mla_step's fused op (joint_a: q_b is not quantised)
            p->cq_joint = qkv_a, p->ld_a = ld_a;
        else
            be->gemm(be, 0, 1, N, (int64_t)D->H * D->qd, D->rq, 1.0f, qkv_a, ld_a, w->q_b, D->rq, 0.0f, p->q,
                     (int64_t)D->H * D->qd);
    } else if (D->rq > 0) {
        ACT(p->cq, N * D->rq);
        lin_fwd(c, p->cq, x, w->q_a, N, D->d, D->rq);
        p->cqn = p->cq;
        if (D->latent_norm) {
            ACT(p->cqn, N * D->rq);
            if (save) F32(p->rstd_cq, N);
            be->rmsnorm_fwd(be, p->cqn, p->rstd_cq, p->cq, w->q_a_norm, N, D->rq, LATENT_EPS);
        }
        lin_fwd(c, p->q, p->cqn, w->q_b, N, D->rq, (int64_t)D->H * D->qd);
    } else {
        lin_fwd(c, p->q, x, w->q_proj, N, D->d, (int64_t)D->H * D->qd);
    }
    if (D->qk_norm) { // Qwen3: RMSNorm over each head's qd values, before RoPE
        p->q_raw = p->q;
        ACT(p->q, N * D->H * D->qd);
        if (save) F32(p->rstd_q, N * D->H);
        be->rmsnorm_fwd(be, p->q, p->rstd_q, p->q_raw, w->q_norm, N * D->H, D->qd, D->eps);
    }
    // kv: [c | k_pe] = kv_a(x) (the joint product's part, rows ld_kv apart),
    // split into contiguous buffers for the norms
    void *ckv;
    int64_t ld_kv = D->L;
    if (qkv_a) {
        ckv = act_at(be, qkv_a, D->rq), ld_kv = ld_a;
    } else {
        ACT(ckv, N * D->L);
        lin_fwd(c, ckv, x, w->kv_a, N, D->d, D->L);
    }
    if (step && !D->latent_norm && !D->qk_norm) {
        p->c = p->cn = ckv, p->kpe = act_at(be, ckv, D->rkv), p->ldc = p->ldk = ld_kv;
    } else {
        ACT(p->c, N * D->rkv);
        be->copy2d(be, p->c, D->rkv, ckv, D->L, N, D->rkv, 0);
        p->cn = p->c;
        if (D->latent_norm) { // on c only, never on k_pe (spec §2.3)
            ACT(p->cn, N * D->rkv);
            if (save) F32(p->rstd_c, N);
            be->rmsnorm_fwd(be, p->cn, p->rstd_c, p->c, w->kv_a_norm, N, D->rkv, LATENT_EPS);
        }
        ACT(p->kpe, N * D->dr);
        be->copy2d(be, p->kpe, D->dr, act_at(be, ckv, D->rkv), D->L, N, D->dr, 0);
        if (D->qk_norm) { // Qwen3 k_norm on the shared rope key only (absorption stays exact)
            p->kpe_raw = p->kpe;
            ACT(p->kpe, N * D->dr);
            if (save) F32(p->rstd_kpe, N);
            be->rmsnorm_fwd(be, p->kpe, p->rstd_kpe, p->kpe_raw, w->k_norm, N, D->dr, D->eps);
        }
    }
    // RoPE: q_pe of every head (head stride qd, after the d_nope values) and the
    // one shared k_pe. Interleaved pairs, results stored de-interleaved (§2.1).
    // A step rotates them as it appends to the cache (mla_step).
    if (step) return 0;
    be->rope_fwd(be, act_at(be, p->q, D->dn), (int64_t)D->H * D->qd, D->qd, pos, c->rope_cos, c->rope_sin, N, D->H,
                 D->dr, ROPE_INTERLEAVED);
    be->rope_fwd(be, p->kpe, p->ldk, D->dr, pos, c->rope_cos, c->rope_sin, N, 1, D->dr, ROPE_INTERLEAVED);
    return 0;
}

static int check_weights(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w) {
    int ok = w->kv_a && w->kv_b && w->o && (D->rq > 0 ? w->q_a && w->q_b : w->q_proj != NULL);
    if (D->latent_norm) ok = ok && w->kv_a_norm && (D->rq == 0 || w->q_a_norm);
    if (D->qk_norm) ok = ok && w->q_norm && w->k_norm;
    if (!ok) return err_set(ERR_INPUT, "MLA layer %d: weights missing for this configuration", c->layer);
    return 0;
}

// ---- forward (decompressed) ----------------------------------------------------

// k [B, n, G, qd] = [k_nope | k_pe broadcast to every KV head] and v [B, n, G,
// d_v] of n keys per sequence, decompressed from their latents: kvd [B, n, G,
// d_nope + d_v] = lat kv_b^T. lat and kr point at the first key's latent and
// rope key in sequence 0; keys are ld_lat / ld_kr apart, sequences seq keys.
static void expand_keys(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w, const void *lat, int64_t ld_lat,
                        const void *kr, int64_t ld_kr, int64_t seq, int B, int64_t n, void *kvd, void *k, void *v) {
    be_t *be = c->be;
    int64_t NK = (int64_t)B * n, kvw = (int64_t)D->G * D->kvh;
    int packed = seq == n; // the sequences' keys follow each other: one product, one copy per KV head
    if (packed && ld_lat == D->rkv)
        lin_fwd(c, kvd, lat, w->kv_b, NK, D->rkv, kvw);
    else
        for (int b = 0; b < B; b++)
            be->gemm(be, 0, 1, n, kvw, D->rkv, 1.0f, act_at(be, lat, (int64_t)b * seq * ld_lat), ld_lat, w->kv_b,
                     D->rkv, 0.0f, act_at(be, kvd, (int64_t)b * n * kvw), kvw);
    if (D->dn > 0) be->copy2d(be, k, D->qd, kvd, D->kvh, NK * D->G, D->dn, 0);
    be->copy2d(be, v, D->dv, act_at(be, kvd, D->dn), D->kvh, NK * D->G, D->dv, 0);
    int nb = packed ? 1 : B;
    int64_t rows = packed ? NK : n;
    for (int b = 0; b < nb; b++)
        for (int g = 0; g < D->G; g++)
            be->copy2d(be, act_at(be, k, ((int64_t)b * n * D->G + g) * D->qd + D->dn), (int64_t)D->G * D->qd,
                       act_at(be, kr, (int64_t)b * seq * ld_kr), ld_kr, rows, D->dr, 0);
}

// The cached prefill decompresses at most this part of the arena at a time
// (one tile's kvd, k and v), so its memory does not grow with the context.
#define MLA_TILE_ARENA_PART 16

// Keys per sequence in one tile of the cached prefill: c->cache_tile_keys when
// set, else as many as 1 / MLA_TILE_ARENA_PART of the arena holds for B
// sequences, a multiple of 64 (the CUDA attention's key tiles stay whole).
static int64_t tile_keys(const layer_ctx_t *c, const dims_t *D, int B) {
    if (c->cache_tile_keys > 0) return c->cache_tile_keys;
    int64_t per_key = (int64_t)B * D->G * (D->kvh + D->qd + D->dv) * (int64_t)c->be->act_size;
    int64_t R = (int64_t)(c->arena->cap / MLA_TILE_ARENA_PART) / per_key / 64 * 64;
    return R > 64 ? R : 64;
}

// The T new queries of each sequence (q [B, T, H, qd], their keys already in
// the cache) over the cache's keys [0, Tk = pos0 + T), in tiles of keys:
// each tile's latents are decompressed into k and v, attended, and the tiles'
// results merged by their log-sum-exp (be->attn_merge, into an fp32 running
// result rounded to act once, at the last tile), so memory depends on the
// tile and the chunk, not the context. The last tile, the last max(R, T)
// keys, holds the chunk's own keys and keeps the bottom-right causal mask;
// tiles [0, R), [R, 2R), ... cover the keys before it, all of which precede
// every query (no mask). A context that fits one tile is one causal call, as
// an untiled forward. A contiguous cache's latents are read in place; a paged
// one's tile is gathered first unless its rows are one run of pages. (Attending
// in latent space, as the decode step does, would cost more FLOPs here:
// docs/ARCHITECTURE.md, MLA prefill.) The B sequences are seq0.. of the cache.
static int attend_cache(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w, const layer_cache_t *cache, int seq0,
                        int B, int T, int pos0, const void *q, void *att, float *lse) {
    be_t *be = c->be;
    int64_t Tk = (int64_t)pos0 + T, R = tile_keys(c, D, B);
    int64_t n_last = R > T ? R : T;
    if (n_last > Tk) n_last = Tk;
    int64_t last0 = Tk - n_last; // the last tile's first key
    int64_t n_tiles = (last0 + R - 1) / R + 1, NK = (int64_t)B * n_last;
    int64_t n_out = (int64_t)B * T * D->H * D->dv;
    void *kvd, *k, *v, *att_i = att, *gat = NULL;
    float *lse_i = lse, *acc = NULL;
    if (cache->pages) ACT(gat, NK * D->L); // a tile's latents, gathered from their pages
    ACT(kvd, NK * D->G * D->kvh);
    ACT(k, NK * D->G * D->qd);
    ACT(v, NK * D->G * D->dv);
    if (n_tiles > 1) { // each tile's result, and the running one in fp32; one tile writes att, lse
        ACT(att_i, n_out);
        F32(lse_i, (int64_t)B * D->H * T);
        F32(acc, n_out);
    }
    const void *kv = cache->u.mla.kv;
    for (int64_t i = 0; i < n_tiles; i++) {
        int last = i == n_tiles - 1;
        int64_t u0 = last ? last0 : i * R, n = last ? n_last : (last0 - u0 < R ? last0 - u0 : R);
        // sequence seq0 + b's keys b * seq keys further
        const void *lat = act_at(be, kv, ((int64_t)seq0 * cache->cap + u0) * D->L);
        int64_t seq = cache->cap;
        if (cache->pages && B == 1 && cache_run(cache, seq0, u0, n) == n) {
            lat = act_at(be, kv, cache_row(cache, seq0, u0) * D->L), seq = n;
        } else if (cache->pages) {
            for (int b = 0; b < B; b++)
                cache_copy_rows(be, cache, (void *)kv, D->L, seq0 + b, u0, n, 0, D->L,
                                act_at(be, gat, (int64_t)b * n * D->L), D->L, 0);
            lat = gat, seq = n;
        }
        expand_keys(c, D, w, lat, D->L, act_at(be, lat, D->rkv), D->L, seq, B, n, kvd, k, v);
        be->attn_fwd(be, att_i, lse_i, q, k, v, B, T, (int)n, D->H, D->G, D->qd, D->dv, D->scale, last);
        if (n_tiles > 1) be->attn_merge(be, acc, lse, att_i, lse_i, last ? att : NULL, i == 0, B, T, D->H, D->dv);
    }
    return 0;
}

// A batched prefill's runs (each sequence over its own cache) whose keys fit
// one tile all together: every sequence's cached latents [0, pos0 + T)
// gathered one after another and expanded by one product (expand_keys over
// them as one sequence: each key's expansion is its own), then each
// sequence's T queries attend causally over its own keys. Where attend_cache
// per run takes a product and its copies per sequence. 1 when done, 0 when
// the keys do not fit one tile (the caller attends run by run), < 0 on error.
static int attend_caches_packed(const layer_ctx_t *c, const dims_t *D, const mla_w_t *w, int n_runs,
                                const step_run_t *runs, const void *q, void *att, float *lse) {
    be_t *be = c->be;
    int64_t NK = 0;
    for (int i = 0; i < n_runs; i++)
        NK += (int64_t)runs[i].n * (runs[i].pos0 + runs[i].T);
    if (NK > tile_keys(c, D, 1)) return 0;
    void *lat, *kvd, *k, *v;
    ACT(lat, NK * D->L);
    ACT(kvd, NK * D->G * D->kvh);
    ACT(k, NK * D->G * D->qd);
    ACT(v, NK * D->G * D->dv);
    for (int64_t i = 0, off = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++) {
            const step_run_t *u = &runs[i];
            int64_t Tk = (int64_t)u->pos0 + u->T;
            cache_copy_rows(be, u->cache, u->cache->u.mla.kv, D->L, u->seq0 + j, 0, Tk, 0, D->L,
                            act_at(be, lat, off * D->L), D->L, 0);
            off += Tk;
        }
    expand_keys(c, D, w, lat, D->L, act_at(be, lat, D->rkv), D->L, NK, 1, NK, kvd, k, v);
    for (int64_t i = 0, off = 0, row = 0; i < n_runs; i++)
        for (int j = 0; j < runs[i].n; j++) {
            const step_run_t *u = &runs[i];
            int Tk = u->pos0 + u->T;
            be->attn_fwd(be, act_at(be, att, row * D->H * D->dv), lse + row * D->H, act_at(be, q, row * D->H * D->qd),
                         act_at(be, k, off * D->G * D->qd), act_at(be, v, off * D->G * D->dv), 1, u->T, Tk, D->H, D->G,
                         D->qd, D->dv, D->scale, 1);
            off += Tk, row += u->T;
        }
    return 1;
}

// The forward over the rows of runs (layer.h step_run_t): the products and
// RoPE once over every row, then with caches every run's rows appended to
// its sequences' caches and attended over them (attend_caches_packed, or
// attend_cache per run); a run without a cache (training: one run) attends
// causally within its T rows, its expanded keys kept for the backward.
static int mla_run(const layer_ctx_t *c, const mla_w_t *w, void *out, const void *x, int n_runs, const step_run_t *runs,
                   mla_saved_t *sv) {
    be_t *be = c->be;
    dims_t D = dims(c);
    int64_t N = run_rows(runs, n_runs);
    TRY(check_weights(c, &D, w));
    for (int i = 0; i < n_runs; i++) {
        const step_run_t *u = &runs[i];
        if (sv && u->cache)
            return err_set(ERR_UNSUP, "MLA layer %d: training forward (saved state) with a cache", c->layer);
        if (u->pos0 < 0 || u->pos0 + u->T > c->rope_npos)
            return err_set(ERR_INPUT, "MLA layer %d: positions %d..%d beyond the RoPE tables (%d positions)", c->layer,
                           u->pos0, u->pos0 + u->T - 1, c->rope_npos);
        if (u->cache && (u->pos0 + u->T > u->cache->cap || u->seq0 + u->n > u->cache->B))
            return err_set(ERR_INPUT, "MLA layer %d: cache holds %d sequences x %d tokens, asked for %d x %d", c->layer,
                           u->cache->B, u->cache->cap, u->seq0 + u->n, u->pos0 + u->T);
    }

    int32_t *pos = ctx_run_positions(c, runs, n_runs);
    if (!pos) return err_wrap(ERR_NOMEM, "MLA layer %d: ", c->layer);
    proj_t p;
    TRY(project(c, &D, w, x, NULL, N, pos, sv != NULL, 0, &p));

    void *att, *k = NULL, *v = NULL;
    float *lse;
    ACT(att, N * D.H * D.dv);
    F32(lse, N * D.H);
    // with caches: every run's rows appended first (each run reads only its
    // own sequences), then attended: all runs at once where their keys fit
    // one tile (attend_caches_packed), else run by run
    for (int64_t i = 0, r = 0; i < n_runs && runs[0].cache; r += (int64_t)runs[i].n * runs[i].T, i++) {
        const step_run_t *u = &runs[i];
        for (int b = 0; b < u->n; b++) { // rows [pos0, pos0 + T): [c after the latent norm | rotated k_pe]
            int64_t rb = r + (int64_t)b * u->T;
            cache_copy_rows(be, u->cache, u->cache->u.mla.kv, D.L, u->seq0 + b, u->pos0, u->T, 0, D.rkv,
                            act_at(be, p.cn, rb * D.rkv), D.rkv, 1);
            cache_copy_rows(be, u->cache, u->cache->u.mla.kv, D.L, u->seq0 + b, u->pos0, u->T, D.rkv, D.dr,
                            act_at(be, p.kpe, rb * D.dr), D.dr, 1);
        }
    }
    int packed = 0;
    if (runs[0].cache && n_runs > 1) {
        size_t mark = arena_mark(c->arena);
        packed = attend_caches_packed(c, &D, w, n_runs, runs, p.q, att, lse);
        arena_reset(c->arena, mark); // the keys' temporaries
        TRY(packed);
    }
    for (int64_t i = 0, r = 0; i < n_runs && !packed; r += (int64_t)runs[i].n * runs[i].T, i++) {
        const step_run_t *u = &runs[i];
        const int B = u->n, T = u->T;
        void *att_r = act_at(be, att, r * D.H * D.dv);
        const void *q_r = act_at(be, p.q, r * D.H * D.qd);
        if (u->cache) {
            size_t mark = arena_mark(c->arena);
            TRY(attend_cache(c, &D, w, u->cache, u->seq0, B, T, u->pos0, q_r, att_r, lse + r * D.H));
            arena_reset(c->arena, mark); // its tiles' temporaries
        } else {
            // every key at once: k and v are the saved activations of the backward
            void *kvd;
            int64_t Nr = (int64_t)B * T;
            ACT(kvd, Nr * D.G * D.kvh);
            ACT(k, Nr * D.G * D.qd);
            ACT(v, Nr * D.G * D.dv);
            expand_keys(c, &D, w, act_at(be, p.cn, r * D.rkv), D.rkv, act_at(be, p.kpe, r * D.dr), D.dr, T, B, T, kvd,
                        k, v);
            // Attention (causal: query t sees keys 0..t), GQA H / G.
            be->attn_fwd(be, att_r, lse + r * D.H, q_r, k, v, B, T, T, D.H, D.G, D.qd, D.dv, D.scale, 1);
        }
    }
    lin_fwd(c, out, att, w->o, N, (int64_t)D.H * D.dv, D.d);

    if (sv) {
        *sv = (mla_saved_t){.B = runs[0].n,
                            .T = runs[0].T,
                            .x = x,
                            .cq = p.cq,
                            .cqn = p.cqn,
                            .rstd_cq = p.rstd_cq,
                            .q_raw = p.q_raw,
                            .rstd_q = p.rstd_q,
                            .q = p.q,
                            .c = p.c,
                            .cn = p.cn,
                            .rstd_c = p.rstd_c,
                            .kpe_raw = p.kpe_raw,
                            .rstd_kpe = p.rstd_kpe,
                            .k = k,
                            .v = v,
                            .att = att,
                            .lse = lse,
                            .pos = pos};
    }
    return 0;
}

int mla_forward(const layer_ctx_t *c, const mla_w_t *w, void *out, const void *x, int B, int T, int pos0,
                layer_cache_t *cache, mla_saved_t *sv) {
    step_run_t all = {cache, 0, B, T, pos0};
    return mla_run(c, w, out, x, 1, &all, sv);
}

int mla_forward_runs(const layer_ctx_t *c, const mla_w_t *w, void *out, const void *x, int n_runs,
                     const step_run_t *runs) {
    TRY(forward_runs_check(runs, n_runs));
    return mla_run(c, w, out, x, n_runs, runs, NULL);
}

// ---- backward (training path, no cache: Tk = T) ----------------------------------

int mla_backward(const layer_ctx_t *c, const mla_w_t *w, mla_w_t *g, void *dx, const void *dout,
                 const mla_saved_t *sv) {
    be_t *be = c->be;
    dims_t D = dims(c);
    int B = sv->B, T = sv->T;
    int64_t N = (int64_t)B * T, kvw = (int64_t)D.G * D.kvh, Hqd = (int64_t)D.H * D.qd, Hdv = (int64_t)D.H * D.dv;
    TRY(check_weights(c, &D, w));

    // out_proj
    void *datt;
    ACT(datt, N * Hdv);
    lin_bwd(be, datt, 0, g->o, dout, sv->att, w->o, N, Hdv, D.d);

    // attention
    void *dq, *dk, *dv;
    ACT(dq, N * Hqd);
    ACT(dk, N * D.G * D.qd);
    ACT(dv, N * D.G * D.dv);
    be->attn_bwd(be, dq, dk, dv, datt, sv->q, sv->k, sv->v, sv->att, sv->lse, B, T, T, D.H, D.G, D.qd, D.dv, D.scale);

    // Undo the assembly of k and v: k_nope and value go back into the layout of
    // kv_b's output; the rope key was broadcast to the G KV heads, so its
    // gradient is the sum of the G copies.
    void *dkvd, *dkpe;
    ACT(dkvd, N * kvw);
    if (D.dn > 0) be->copy2d(be, dkvd, D.kvh, dk, D.qd, N * D.G, D.dn, 0);
    be->copy2d(be, act_at(be, dkvd, D.dn), D.kvh, dv, D.dv, N * D.G, D.dv, 0);
    ACT(dkpe, N * D.dr);
    for (int gg = 0; gg < D.G; gg++)
        be->copy2d(be, dkpe, D.dr, act_at(be, dk, (int64_t)gg * D.qd + D.dn), (int64_t)D.G * D.qd, N, D.dr, gg > 0);

    // RoPE is a rotation: its backward rotates the gradients back (in place).
    be->rope_bwd(be, dkpe, D.dr, D.dr, sv->pos, c->rope_cos, c->rope_sin, N, 1, D.dr, ROPE_INTERLEAVED);
    be->rope_bwd(be, act_at(be, dq, D.dn), Hqd, D.qd, sv->pos, c->rope_cos, c->rope_sin, N, D.H, D.dr,
                 ROPE_INTERLEAVED);

    // Qwen3 norms (before RoPE in the forward, so after it here)
    if (D.qk_norm) {
        void *t;
        ACT(t, N * D.dr);
        be->rmsnorm_bwd(be, t, g->k_norm, dkpe, sv->kpe_raw, w->k_norm, sv->rstd_kpe, N, D.dr);
        dkpe = t;
        ACT(t, N * Hqd);
        be->rmsnorm_bwd(be, t, g->q_norm, dq, sv->q_raw, w->q_norm, sv->rstd_q, N * D.H, D.qd);
        dq = t;
    }

    // kv_b and the kv latent norm
    void *dcn, *dc, *dckv;
    ACT(dcn, N * D.rkv);
    lin_bwd(be, dcn, 0, g->kv_b, dkvd, sv->cn, w->kv_b, N, D.rkv, kvw);
    dc = dcn;
    if (D.latent_norm) {
        ACT(dc, N * D.rkv);
        be->rmsnorm_bwd(be, dc, g->kv_a_norm, dcn, sv->c, w->kv_a_norm, sv->rstd_c, N, D.rkv);
    }

    // kv_a: its output gradient is [dc | dk_pe]; this product sets dx
    ACT(dckv, N * D.L);
    be->copy2d(be, dckv, D.L, dc, D.rkv, N, D.rkv, 0);
    be->copy2d(be, act_at(be, dckv, D.rkv), D.L, dkpe, D.dr, N, D.dr, 0);
    lin_bwd(be, dx, 0, g->kv_a, dckv, sv->x, w->kv_a, N, D.d, D.L);

    // query path; adds to dx
    if (D.rq > 0) {
        void *dcqn, *dcq;
        ACT(dcqn, N * D.rq);
        lin_bwd(be, dcqn, 0, g->q_b, dq, sv->cqn, w->q_b, N, D.rq, Hqd);
        dcq = dcqn;
        if (D.latent_norm) {
            ACT(dcq, N * D.rq);
            be->rmsnorm_bwd(be, dcq, g->q_a_norm, dcqn, sv->cq, w->q_a_norm, sv->rstd_cq, N, D.rq);
        }
        lin_bwd(be, dx, 1, g->q_a, dcq, sv->x, w->q_a, N, D.d, D.rq);
    } else {
        lin_bwd(be, dx, 1, g->q_proj, dq, sv->x, w->q_proj, N, D.d, Hqd);
    }
    return 0;
}

// ---- decode step (absorbed, spec §3.3) -----------------------------------------
//
// With wk_g = the k_nope rows of kv_b for KV head g ([d_nope, r_kv]) and wv_g the
// value rows ([d_v, r_kv]): q_nope . k_nope_u = q_nope . (wk_g c_u) = (q_nope wk_g) . c_u
// and sum_u p_u (wv_g c_u) = wv_g (sum_u p_u c_u). So each head attends directly
// over the cached latents with q_lat = q_nope wk_g, and wv_g is applied once to
// the attended latent: no per-token decompression of the cache.

// C[b, h] (n values, head stride sc) = A[b, h] (k values, head stride sa) times
// W_g(h) (kv_b's block of KV head g = h / hpg, transposed when tb) for every
// row b < B and head h = g hpg + j, as products batched over the G groups:
// one per head of a group (B rows each) or one per row (hpg heads each),
// whichever makes fewer launches (a single sequence: one).
static void per_head_products(be_t *be, const dims_t *D, int tb, int64_t B, int64_t n, int64_t k, const void *A,
                              int64_t sa, const void *W, void *C, int64_t sc) {
    const int64_t H = D->H, hpg = D->hpg, sw = (int64_t)D->kvh * D->rkv;
    if (B >= hpg)
        for (int64_t j = 0; j < hpg; j++)
            be->gemm_batched(be, 0, tb, B, n, k, 1.0f, act_at(be, A, j * sa), H * sa, hpg * sa, W, D->rkv, sw, 0.0f,
                             act_at(be, C, j * sc), H * sc, hpg * sc, D->G);
    else
        for (int64_t b = 0; b < B; b++)
            be->gemm_batched(be, 0, tb, hpg, n, k, 1.0f, act_at(be, A, b * H * sa), sa, hpg * sa, W, D->rkv, sw, 0.0f,
                             act_at(be, C, b * H * sc), sc, hpg * sc, D->G);
}

int mla_step(const layer_ctx_t *c, const mla_w_t *w, const lin_out_t *out, const void *x, const void *xw, int n_runs,
             const step_run_t *runs) {
    be_t *be = c->be;
    dims_t D = dims(c);
    int64_t B = step_rows(runs, n_runs); // rows, one per sequence
    TRY(check_weights(c, &D, w));
    TRY(step_check(c, runs, n_runs, 1, 1));

    // positions of the rows, then the kernel's visible rows (the new row included)
    int32_t *pos = ctx_step_positions(c, runs, n_runs);
    if (!pos) return err_wrap(ERR_NOMEM, "MLA layer %d: ", c->layer);
    const int32_t *vis = pos + B;
    proj_t p;
    TRY(project(c, &D, w, x, xw, B, pos, 0, 1, &p));

    // q_pe and k_pe rotated, and every row's [c | k_pe] appended at its own
    // position of its own cache: one call for all runs (with q_b's product
    // before it, when project left that to this call: one launch on CUDA)
    void *const *rows = ctx_step_caches(c, runs, n_runs);
    be_pages_t pg; // their page tables
    if (!rows) return err_wrap(ERR_NOMEM, "MLA layer %d: ", c->layer);
    TRY(ctx_step_pages(c, runs, n_runs, &pg));
    if (p.cq_joint)
        be->proj_mla_rope_append(be, p.q, (int64_t)D.H * D.qd, p.cq_joint, p.ld_a, w->q_b, p.cn, p.ldc, p.kpe, p.ldk,
                                 pos, c->rope_cos, c->rope_sin, rows, pg, (int)B, D.rq, D.H, D.qd, D.rkv, D.dr);
    else
        be->mla_rope_append(be, act_at(be, p.q, D.dn), (int64_t)D.H * D.qd, D.qd, p.cn, p.ldc, p.kpe, p.ldk, pos,
                            c->rope_cos, c->rope_sin, rows, pg, (int)B, D.H, D.rkv, D.dr);

    // q_lat[b, h] = q_nope[b, h] wk_g(h)
    void *qlat, *olat, *att;
    int64_t Hr = (int64_t)D.H * D.rkv;
    ACT(qlat, B * Hr);
    if (D.dn > 0)
        per_head_products(be, &D, 0, B, D.rkv, D.dn, p.q, D.qd, w->kv_b, qlat, D.rkv);
    else
        be->memset0(be, qlat, (size_t)(B * Hr) * be->act_size);

    // attention of every row over its own cache, its visible length from vis:
    // one call for all runs. One run's sequences lie in one buffer, and paged
    // caches in one pool, which the CUDA kernel can read through one tensor
    // map (pool).
    ACT(olat, B * Hr);
    const layer_cache_t *k0 = runs[0].cache;
    const void *pool = k0->u.mla.kv;
    int64_t pool_rows = k0->pages ? k0->pool_rows : (int64_t)k0->B * k0->cap;
    for (int i = 1; i < n_runs; i++)
        if (!k0->pages || runs[i].cache->u.mla.kv != pool) pool = NULL, pool_rows = 0;
    // q_pe read in place in q: head stride qd, after the d_nope values
    be->mla_decode_attn(be, olat, qlat, act_at(be, p.q, D.dn), (int64_t)D.H * D.qd, D.qd, rows, pg, vis,
                        step_max_ctx(runs, n_runs), pool, pool_rows, (int)B, D.H, D.rkv, D.dr, D.scale);

    // att[b, h] = wv_g(h) olat[b, h]
    int64_t Hdv = (int64_t)D.H * D.dv;
    ACT(att, B * Hdv);
    per_head_products(be, &D, 1, B, D.dv, D.rkv, olat, D.rkv, act_at(be, w->kv_b, (int64_t)D.dn * D.rkv), att, D.dv);
    return lin_fwd_out(c, out, att, w->o, B, Hdv);
}
