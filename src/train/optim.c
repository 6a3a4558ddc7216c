#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int optim_create(optim_t *o, model_t *m) {
    be_t *be = m->be;
    memset(o, 0, sizeof *o);
    o->n = m->pt.total;
    o->beta1 = 0.9f, o->beta2 = 0.999f, o->eps = 1e-8f;
    size_t bytes = (size_t)o->n * sizeof(float);
    int own_master = be->act_dtype != DT_F32;
    o->master = own_master ? be->alloc(be, bytes) : m->w;
    o->m1 = be->alloc(be, bytes), o->m2 = be->alloc(be, bytes), o->grad = be->alloc(be, bytes);
    o->d_sumsq = be->alloc(be, (size_t)m->pt.n * sizeof(float));
    o->trainable = malloc((size_t)m->pt.n);
    o->h_sumsq = malloc((size_t)m->pt.n * sizeof(float));
    if (!o->master || !o->m1 || !o->m2 || !o->grad || !o->d_sumsq || !o->trainable || !o->h_sumsq) {
        optim_free(o, m);
        return err_set(ERR_NOMEM, "optimizer state for %lld parameters (%.1f MiB)", (long long)m->pt.total,
                       (own_master ? 4.0 : 3.0) * bytes / 1048576.0);
    }
    memset(o->trainable, 1, (size_t)m->pt.n);
    TRY(be->memset0(be, o->m1, bytes));
    TRY(be->memset0(be, o->m2, bytes));
    TRY(be->memset0(be, o->grad, bytes));
    if (own_master) { // master = weights, through the host in slices
        int64_t slice = (int64_t)1 << 22;
        float *h = malloc((size_t)slice * sizeof(float));
        if (!h) return err_set(ERR_NOMEM, "out of memory");
        int rc = 0;
        for (int64_t i = 0; i < o->n && rc == 0; i += slice) {
            int64_t k = o->n - i < slice ? o->n - i : slice;
            rc = be->download_act(be, h, act_at(be, m->w, i), k);
            if (rc == 0) rc = be->copy_h2d(be, o->master + i, h, (size_t)k * sizeof(float));
        }
        free(h);
        TRY(rc);
    }
    return 0;
}

void optim_free(optim_t *o, model_t *m) {
    be_t *be = m->be;
    if (o->master != m->w) be->free(be, o->master);
    be->free(be, o->m1), be->free(be, o->m2), be->free(be, o->grad), be->free(be, o->d_sumsq);
    free(o->trainable), free(o->h_sumsq);
    memset(o, 0, sizeof *o);
}

void optim_train_only(optim_t *o, const model_t *m, int (*keep)(const char *name)) {
    for (int i = 0; i < m->pt.n; i++)
        o->trainable[i] = (uint8_t)(keep(m->pt.p[i].name) != 0);
}

int optim_zero_grad(optim_t *o, model_t *m) { return m->be->memset0(m->be, o->grad, (size_t)o->n * sizeof(float)); }

int optim_grad_norm(optim_t *o, model_t *m, double *norm) {
    be_t *be = m->be;
    for (int i = 0; i < m->pt.n; i++)
        if (o->trainable[i]) be->sumsq(be, o->d_sumsq + i, o->grad + m->pt.p[i].off, m->pt.p[i].numel);
    TRY(be->copy_d2h(be, o->h_sumsq, o->d_sumsq, (size_t)m->pt.n * sizeof(float)));
    double s = 0; // a fixed order: the same norm on every run
    for (int i = 0; i < m->pt.n; i++)
        if (o->trainable[i]) s += o->h_sumsq[i];
    *norm = sqrt(s);
    return 0;
}

int optim_step(optim_t *o, model_t *m, float lr, float grad_scale) {
    be_t *be = m->be;
    o->step++;
    // One call per run of consecutive trainable parameters (the gaps between
    // parameters are zero in every buffer, so a run may span them).
    for (int i = 0; i < m->pt.n;) {
        if (!o->trainable[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < m->pt.n && o->trainable[j + 1])
            j++;
        int64_t off = m->pt.p[i].off, end = m->pt.p[j].off + m->pt.p[j].numel;
        // decay applies per parameter: split the run where no_decay changes
        int64_t a = off;
        for (int k = i; k <= j; k++) {
            int64_t b = k == j ? end : m->pt.p[k + 1].off;
            int nd = m->pt.p[k].no_decay;
            if (k == j || m->pt.p[k + 1].no_decay != nd) {
                be->adamw(be, o->master + a, act_at(be, m->w, a), o->grad + a, o->m1 + a, o->m2 + a, b - a, lr,
                          o->beta1, o->beta2, o->eps, nd ? 0.0f : o->weight_decay, grad_scale, (int)o->step);
                a = b;
            }
        }
        i = j + 1;
    }
    return 0;
}

double lr_at(lr_sched_t s, double lr, int64_t step, int64_t warmup, int64_t total) {
    if (step < warmup) return lr * (double)step / (double)(warmup > 1 ? warmup : 1);
    double progress = (double)(step - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    switch (s) {
    case LR_COSINE: return lr * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));
    case LR_LINEAR: return lr * fmax(0.0, 1.0 - progress);
    default: return lr;
    }
}
