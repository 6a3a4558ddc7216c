#include "model/train_fwd.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int block_forward(model_run_t *r, int l, const void *x_in, int B, int T, block_saved_t *sv) {
    const model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    const layer_w_t *w = &m->lw[l];
    int64_t N = (int64_t)B * T, nd = N * a->d;
    memset(sv, 0, sizeof *sv);
    sv->x_in = x_in, sv->B = B, sv->T = T;
    // The step's (B, T, 0) positions, uploaded by the first block only; the
    // backward reads the same array through the layers' saved pointers.
    TRY(model_prepare_positions(r, B, T, 0));
    layer_ctx_t c = model_layer_ctx(r, l);
    sv->xn1 = ctx_act(&c, nd), sv->a = ctx_act(&c, nd), sv->x_mid = ctx_act(&c, nd);
    sv->xn2 = ctx_act(&c, nd), sv->x_out = ctx_act(&c, nd);
    sv->rstd1 = ctx_f32(&c, N), sv->rstd2 = ctx_f32(&c, N);
    if (!sv->xn1 || !sv->a || !sv->x_mid || !sv->xn2 || !sv->x_out || !sv->rstd1 || !sv->rstd2) return ERR_NOMEM;
    be->rmsnorm_fwd(be, sv->xn1, sv->rstd1, x_in, w->norm1, N, a->d, a->eps);
    TRY(model_mixer_forward(&c, w, sv->a, sv->xn1, B, T, 0, NULL, &sv->mix));
    be->copy_d2d(be, sv->x_mid, x_in, (size_t)nd * be->act_size);
    be->add_rmsnorm_fwd(be, sv->xn2, sv->rstd2, sv->x_mid, sv->a, w->norm2, N, a->d, a->eps);
    TRY(mlp_forward(&c, &w->mlp, sv->x_out, sv->xn2, N, &sv->mlp));
    be->add(be, sv->x_out, sv->x_mid, nd);
    return 0;
}

int block_backward(model_run_t *r, int l, layer_w_t *g, const block_saved_t *sv, const void *dx_out, const void *da,
                   void *dx_in) {
    const model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    const layer_w_t *w = &m->lw[l];
    layer_ctx_t c = model_layer_ctx(r, l);
    int64_t N = (int64_t)sv->B * sv->T, nd = N * a->d;
    size_t mark = arena_mark(&r->arena);
    void *dxn = ctx_act(&c, nd), *dmid = ctx_act(&c, nd), *tmp = ctx_act(&c, nd);
    if (!dxn || !dmid || !tmp) return ERR_NOMEM;
    // x_out = x_mid + mlp(norm2(x_mid))
    size_t mark_mlp = arena_mark(&r->arena);
    TRY(mlp_backward(&c, &w->mlp, &g->mlp, dxn, dx_out, &sv->mlp));
    be->rmsnorm_bwd(be, dmid, g->norm2, dxn, sv->x_mid, w->norm2, sv->rstd2, N, a->d);
    be->add(be, dmid, dx_out, nd);
    // The MLP backward's three [N, ffn] temporaries are dead: the mixer's
    // backward reuses their room (stream order keeps it safe on a device).
    arena_reset(&r->arena, mark_mlp);
    // x_mid = x_in + mixer(norm1(x_in)); the mixer output also gets the ILD term
    // da, the residual path does not.
    const void *dmix = dmid;
    if (da) {
        be->copy_d2d(be, tmp, dmid, (size_t)nd * be->act_size);
        be->add(be, tmp, da, nd);
        dmix = tmp;
    }
    int rc;
    switch (w->kind) {
    case LAYER_ATTN: rc = attn_backward(&c, &w->attn, &g->attn, dxn, dmix, &sv->mix.attn); break;
    case LAYER_MLA: rc = mla_backward(&c, &w->mla, &g->mla, dxn, dmix, &sv->mix.mla); break;
    case LAYER_GDN: rc = gdn_backward(&c, &w->gdn, &g->gdn, dxn, dmix, &sv->mix.gdn); break;
    case LAYER_M2: rc = m2_backward(&c, &w->m2, &g->m2, dxn, dmix, &sv->mix.m2); break;
    default: rc = err_set(ERR_UNSUP, "training %s layers", layer_kind_name(w->kind));
    }
    if (rc < 0) return err_wrap(rc, "layer %d (%s) backward: ", l, layer_kind_name(w->kind));
    if (dx_in) {
        be->rmsnorm_bwd(be, dx_in, g->norm1, dxn, sv->x_in, w->norm1, sv->rstd1, N, a->d);
        be->add(be, dx_in, dmid, nd);
    } else {
        be->rmsnorm_bwd(be, tmp, g->norm1, dxn, sv->x_in, w->norm1, sv->rstd1, N, a->d);
    }
    arena_reset(&r->arena, mark);
    return 0;
}

int model_forward_train(model_run_t *r, const int32_t *ids, int B, int T, int recompute, model_acts_t *acts) {
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = (int64_t)B * T;
    size_t nd_bytes = (size_t)N * a->d * be->act_size;
    TRY(model_ensure_positions(m, T));
    acts->B = B, acts->T = T, acts->recompute = recompute;
    acts->ids = arena_alloc(&r->arena, (size_t)N * sizeof(int32_t));
    acts->x[0] = arena_alloc(&r->arena, nd_bytes);
    acts->h = arena_alloc(&r->arena, nd_bytes);
    acts->rstd_f = arena_alloc(&r->arena, (size_t)N * sizeof(float));
    if (!acts->ids || !acts->x[0] || !acts->h || !acts->rstd_f) return ERR_NOMEM;
    // With recomputation every block input is kept apart, below the blocks'
    // saved tensors, which are dropped after each block.
    for (int l = 1; recompute && l <= a->n_layers; l++)
        if (!(acts->x[l] = arena_alloc(&r->arena, nd_bytes))) return ERR_NOMEM;
    TRY(model_embed(m, ids, N, acts->ids, acts->x[0]));
    for (int l = 0; l < a->n_layers; l++) {
        size_t mark = arena_mark(&r->arena);
        TRY(block_forward(r, l, acts->x[l], B, T, &acts->blocks[l]));
        if (recompute) {
            be->copy_d2d(be, acts->x[l + 1], acts->blocks[l].x_out, nd_bytes);
            arena_reset(&r->arena, mark);
        } else {
            acts->x[l + 1] = acts->blocks[l].x_out;
        }
    }
    be->rmsnorm_fwd(be, acts->h, acts->rstd_f, acts->x[a->n_layers], m->final_norm, N, a->d, a->eps);
    return 0;
}

int model_backward(model_run_t *r, const model_acts_t *acts, const void *dh, float *grad) {
    return model_backward_told(r, acts, dh, grad, NULL);
}

int model_backward_told(model_run_t *r, const model_acts_t *acts, const void *dh, float *grad,
                        const grad_done_t *done) {
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = (int64_t)acts->B * acts->T, nd = N * a->d;
    layer_w_t *g = calloc((size_t)a->n_layers, sizeof *g);
    void *gemb, *gnorm, *ghead;
    if (!g) return err_set(ERR_NOMEM, "out of memory");
    int rc = model_bind(m, grad, sizeof(float), g, &gemb, &gnorm, &ghead);
    size_t mark = arena_mark(&r->arena);
    void *dx = arena_alloc(&r->arena, (size_t)nd * be->act_size),
         *dprev = arena_alloc(&r->arena, (size_t)nd * be->act_size);
    if (rc == 0 && (!dx || !dprev)) rc = ERR_NOMEM;
    if (rc == 0) {
        be->rmsnorm_bwd(be, dx, gnorm, dh, acts->x[a->n_layers], m->final_norm, acts->rstd_f, N, a->d);
        for (int l = a->n_layers - 1; l >= 0 && rc == 0; l--) {
            size_t mark_l = arena_mark(&r->arena);
            block_saved_t sv;
            const block_saved_t *s = &acts->blocks[l];
            if (acts->recompute) {
                rc = block_forward(r, l, acts->x[l], acts->B, acts->T, &sv);
                s = &sv;
            }
            if (rc == 0) rc = block_backward(r, l, &g[l], s, dx, NULL, dprev);
            if (rc == 0 && done) rc = done->fn(done->ctx, l);
            arena_reset(&r->arena, mark_l);
            void *t = dx;
            dx = dprev, dprev = t;
        }
    }
    if (rc == 0) be->embed_bwd(be, gemb, dx, acts->ids, N, a->d);
    if (rc == 0 && done) rc = done->fn(done->ctx, -1);
    arena_reset(&r->arena, mark);
    free(g);
    return rc;
}
