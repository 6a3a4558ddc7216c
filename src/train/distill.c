#include "train/distill.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

// The gradient's view of the student's head (the embedding when tied).
static float *head_grad(const model_t *m, float *grad) {
    int64_t off = ptable_off(&m->pt, "lm_head.weight");
    if (off < 0) off = ptable_off(&m->pt, "model.embed_tokens.weight");
    return grad + off;
}

// The teacher's forward (model_hidden): a teacher run with no arena of its
// own runs in the free part of the student's, above what the micro-batch
// keeps there (the KD target, ILD's records), which the student's own
// forward reuses after it. The numbers are the same either way.
static int teacher_hidden(model_run_t *rs, model_run_t *rt, const int32_t *ids, int B, int T, void *h,
                          const model_record_t *rec) {
    int lend = rt->arena.cap == 0;
    if (lend) model_run_lend(rs, rt);
    int rc = model_hidden(rt, ids, B, T, h, rec);
    if (lend) model_run_settle(rs, rt);
    return rc;
}

int distill_kd(distill_t *d, const int32_t *ids, const int32_t *targets, int B, int T, float kl_scale, float ce_scale,
               distill_loss_t *out) {
    model_run_t *rs = d->student;
    model_t *s = rs->m;
    be_t *be = s->be;
    const arch_t *a = &s->a;
    int64_t N = (int64_t)B * T;
    size_t nd = (size_t)N * a->d * be->act_size;
    memset(out, 0, sizeof *out);
    out->n_tok = N;
    for (int64_t i = 0; i < N; i++)
        out->n_ce += targets[i] >= 0;
    int use_kl = d->teacher && kl_scale != 0, use_ce = ce_scale != 0 && out->n_ce > 0;
    if (!use_kl && !use_ce) return err_set(ERR_INPUT, "KD with neither a KL nor a CE term");
    arena_reset(&rs->arena, 0);
    float *d_loss = arena_alloc(&rs->arena, 2 * sizeof(float));
    int32_t *d_tgt = arena_alloc(&rs->arena, (size_t)N * sizeof(int32_t));
    void *dh = arena_alloc(&rs->arena, nd), *dh_ce = use_kl && use_ce ? arena_alloc(&rs->arena, nd) : dh;
    if (!d_loss || !d_tgt || !dh || !dh_ce) return ERR_NOMEM;
    void *ht = NULL;
    const model_t *t = use_kl ? d->teacher->m : NULL;
    if (use_kl) {
        if (t->a.V != a->V)
            return err_set(ERR_INPUT, "teacher vocabulary %d differs from the student's %d", t->a.V, a->V);
        if (!(ht = arena_alloc(&rs->arena, (size_t)N * t->a.d * be->act_size))) return ERR_NOMEM;
        TRY(teacher_hidden(rs, d->teacher, ids, B, T, ht, NULL));
    }
    model_acts_t acts;
    acts.blocks = d->blocks;
    TRY(model_forward_train(rs, ids, B, T, d->recompute, &acts));
    float *dW = head_grad(s, d->grad);
    // the losses' scratch peak apart from the rest (the trainer's plan)
    size_t peak_before = be->scratch.peak;
    be->scratch.peak = be->scratch.used;
    if (use_kl)
        be->fused_kl(be, d_loss, dh, dW, acts.h, s->lm_head, ht, t->lm_head, NULL, N, a->d, t->a.d, a->V, kl_scale);
    if (use_ce) {
        TRY(be->copy_h2d(be, d_tgt, targets, (size_t)N * sizeof(int32_t)));
        be->fused_ce(be, d_loss + 1, dh_ce, dW, acts.h, s->lm_head, d_tgt, N, a->d, a->V, ce_scale);
        if (dh_ce != dh) be->add(be, dh, dh_ce, N * a->d);
    }
    out->scratch_loss = be->scratch.peak;
    be->scratch.peak = peak_before;
    int rc = model_backward_told(rs, &acts, dh, d->grad, d->done);
    out->scratch_rest = be->scratch.peak;
    if (out->scratch_loss > be->scratch.peak) be->scratch.peak = out->scratch_loss;
    TRY(rc);
    float l[2] = {0, 0};
    TRY(be->copy_d2h(be, l, d_loss, sizeof l));
    if (use_kl) out->kl = l[0] / kl_scale;
    if (use_ce) out->ce = l[1] / ce_scale;
    return 0;
}

int distill_ild(distill_t *d, const int32_t *ids, int B, int T, float scale, distill_loss_t *out) {
    model_run_t *rs = d->student;
    model_t *s = rs->m;
    be_t *be = s->be;
    const arch_t *a = &s->a;
    int L = a->n_layers;
    int64_t N = (int64_t)B * T;
    size_t nd = (size_t)N * a->d * be->act_size;
    memset(out, 0, sizeof *out);
    out->n_tok = N;
    if (!d->teacher) return err_set(ERR_INPUT, "layer-wise distillation needs a teacher");
    const model_t *t = d->teacher->m;
    if (t->a.n_layers != L || t->a.d != a->d)
        return err_set(ERR_INPUT,
                       "layer-wise distillation needs a teacher of the student's depth and width: %d x %d vs %d x %d",
                       t->a.n_layers, t->a.d, L, a->d);
    TRY(model_ensure_positions(s, T));
    arena_reset(&rs->arena, 0);
    // The teacher's per-layer inputs (x[L] its last output) and mixer outputs,
    // and its final normed hidden states.
    void *xs[ARCH_MAX_LAYERS + 1], *as[ARCH_MAX_LAYERS];
    for (int l = 0; l <= L; l++)
        if (!(xs[l] = arena_alloc(&rs->arena, nd))) return ERR_NOMEM;
    for (int l = 0; l < L; l++)
        if (!(as[l] = arena_alloc(&rs->arena, nd))) return ERR_NOMEM;
    void *ht = arena_alloc(&rs->arena, nd), *hn = arena_alloc(&rs->arena, nd), *dhn = arena_alloc(&rs->arena, nd);
    void *dx = arena_alloc(&rs->arena, nd), *da = arena_alloc(&rs->arena, nd);
    float *rstd = arena_alloc(&rs->arena, (size_t)N * sizeof(float));
    float *d_loss = arena_alloc(&rs->arena, (size_t)2 * L * sizeof(float));
    layer_w_t *g = calloc((size_t)L, sizeof *g);
    void *gemb, *gnorm, *ghead;
    int rc = (!ht || !hn || !dhn || !dx || !da || !rstd || !d_loss || !g) ? ERR_NOMEM : 0;
    if (rc == 0) rc = model_bind(s, d->grad, sizeof(float), g, &gemb, &gnorm, &ghead);
    model_record_t rec = {xs, as};
    if (rc == 0) rc = teacher_hidden(rs, d->teacher, ids, B, T, ht, &rec);
    for (int l = 0; l < L && rc == 0; l++) {
        size_t mark = arena_mark(&rs->arena);
        block_saved_t sv;
        rc = block_forward(rs, l, xs[l], B, T, &sv);
        if (rc < 0) break;
        if (l + 1 < L) {
            be->ild_dist(be, d_loss + 2 * l, dx, sv.x_out, xs[l + 1], N, a->d, scale, d->ild_mode);
        } else { // the last layer is compared after the final norm
            be->rmsnorm_fwd(be, hn, rstd, sv.x_out, s->final_norm, N, a->d, a->eps);
            be->ild_dist(be, d_loss + 2 * l, dhn, hn, ht, N, a->d, scale, d->ild_mode);
            be->rmsnorm_bwd(be, dx, gnorm, dhn, sv.x_out, s->final_norm, rstd, N, a->d);
        }
        be->ild_dist(be, d_loss + 2 * l + 1, da, sv.a, as[l], N, a->d, scale, d->ild_mode);
        rc = block_backward(rs, l, &g[l], &sv, dx, da, NULL);
        if (rc == 0 && d->done) rc = d->done->fn(d->done->ctx, l);
        arena_reset(&rs->arena, mark);
    }
    // the final norm's gradient came with the last layer; the embedding has none
    if (rc == 0 && d->done) rc = d->done->fn(d->done->ctx, -1);
    float *l = rc == 0 ? malloc((size_t)2 * L * sizeof(float)) : NULL;
    if (rc == 0 && !l) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) rc = be->copy_d2h(be, l, d_loss, (size_t)2 * L * sizeof(float));
    for (int i = 0; rc == 0 && i < L; i++)
        out->ild_h += l[2 * i] / scale, out->ild_a += l[2 * i + 1] / scale;
    out->scratch_rest = be->scratch.peak;
    free(l);
    free(g);
    return rc;
}
