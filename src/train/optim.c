#include "train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int optim_create(optim_t *o, model_t *m, dist_t *d) {
    be_t *be = m->be;
    memset(o, 0, sizeof *o);
    if (!d) dist_single(&o->single);
    o->dist = d ? d : &o->single;
    d = o->dist;
    o->n = m->pt.total;
    o->S = dist_slice(d, o->n);
    o->lo = (int64_t)d->rank * o->S < o->n ? (int64_t)d->rank * o->S : o->n;
    o->hi = o->lo + o->S < o->n ? o->lo + o->S : o->n;
    o->beta1 = 0.9f, o->beta2 = 0.999f, o->eps = 1e-8f;
    // where each layer's parameters start (the table lays them out layer by
    // layer, between the embedding and the final norm)
    o->n_layers = m->a.n_layers;
    for (int l = 0; l <= o->n_layers; l++)
        o->layer_start[l] = -1;
    for (int i = 0; i < m->pt.n; i++) {
        const param_t *p = &m->pt.p[i];
        if (p->layer >= 0 && o->layer_start[p->layer] < 0) o->layer_start[p->layer] = p->off;
        if (p->layer < 0 && i > 0 && m->pt.p[i - 1].layer == o->n_layers - 1) o->layer_start[o->n_layers] = p->off;
    }
    for (int l = 0; l <= o->n_layers; l++)
        if (o->layer_start[l] < 0 || (l > 0 && o->layer_start[l] < o->layer_start[l - 1]))
            return err_set(ERR_RUNTIME, "internal: the parameter table does not hold layer %d after layer %d", l,
                           l - 1);
    size_t bytes = (size_t)o->S * sizeof(float), gbytes = bytes * (size_t)d->world;
    int own_master = be->act_dtype != DT_F32;
    o->master = own_master ? be->alloc(be, bytes) : (float *)m->w + o->lo;
    o->m1 = be->alloc(be, bytes), o->m2 = be->alloc(be, bytes), o->grad = be->alloc(be, gbytes);
    o->d_sumsq = be->alloc(be, (size_t)m->pt.n * sizeof(float));
    o->trainable = malloc((size_t)m->pt.n);
    o->h_sumsq = malloc((size_t)m->pt.n * sizeof(float));
    if (!o->master || !o->m1 || !o->m2 || !o->grad || !o->d_sumsq || !o->trainable || !o->h_sumsq) {
        optim_free(o, m);
        return err_set(ERR_NOMEM, "optimizer state for %lld parameters (%.1f MiB: a slice of %lld of them, %d ranks)",
                       (long long)m->pt.total, ((own_master ? 3.0 : 2.0) * bytes + gbytes) / 1048576.0, (long long)o->S,
                       d->world);
    }
    memset(o->trainable, 1, (size_t)m->pt.n);
    TRY(be->memset0(be, o->m1, bytes));
    TRY(be->memset0(be, o->m2, bytes));
    TRY(be->memset0(be, o->grad, gbytes));
    if (own_master) { // master = the slice's weights, through the host in pieces
        int64_t piece = (int64_t)1 << 22;
        float *h = malloc((size_t)piece * sizeof(float));
        if (!h) return err_set(ERR_NOMEM, "out of memory");
        int rc = 0;
        for (int64_t i = o->lo; i < o->hi && rc == 0; i += piece) {
            int64_t k = o->hi - i < piece ? o->hi - i : piece;
            rc = be->download_act(be, h, act_at(be, m->w, i), k);
            if (rc == 0) rc = be->copy_h2d(be, o->master + (i - o->lo), h, (size_t)k * sizeof(float));
        }
        free(h);
        TRY(rc);
    }
    return 0;
}

void optim_free(optim_t *o, model_t *m) {
    be_t *be = m->be;
    if (o->master != (float *)m->w + o->lo) be->free(be, o->master);
    be->free(be, o->m1), be->free(be, o->m2), be->free(be, o->grad), be->free(be, o->d_sumsq);
    free(o->trainable), free(o->h_sumsq);
    memset(o, 0, sizeof *o);
}

void optim_train_only(optim_t *o, const model_t *m, int (*keep)(const char *name)) {
    for (int i = 0; i < m->pt.n; i++)
        o->trainable[i] = (uint8_t)(keep(m->pt.p[i].name) != 0);
}

int optim_zero_grad(optim_t *o, model_t *m) {
    return m->be->memset0(m->be, o->grad, (size_t)o->S * o->dist->world * sizeof(float));
}

int optim_reduce_layer(optim_t *o, int layer) {
    const int64_t *b = o->layer_start;
    if (layer >= 0) return dist_reduce_range(o->dist, o->grad, b[layer], b[layer + 1], o->S);
    TRY(dist_reduce_range(o->dist, o->grad, 0, b[0], o->S));
    return dist_reduce_range(o->dist, o->grad, b[o->n_layers], o->S * o->dist->world, o->S);
}

int optim_reduce_wait(optim_t *o) { return dist_reduce_wait(o->dist, o->S); }

// The part [*a, *b) of parameter p inside this rank's slice; 0 when none.
static int in_slice(const optim_t *o, const param_t *p, int64_t *a, int64_t *b) {
    *a = p->off > o->lo ? p->off : o->lo;
    *b = p->off + p->numel < o->hi ? p->off + p->numel : o->hi;
    return *a < *b;
}

int optim_grad_norm(optim_t *o, model_t *m, double *norm) {
    be_t *be = m->be;
    int64_t a, b;
    for (int i = 0; i < m->pt.n; i++)
        if (o->trainable[i] && in_slice(o, &m->pt.p[i], &a, &b)) be->sumsq(be, o->d_sumsq + i, o->grad + a, b - a);
    TRY(be->copy_d2h(be, o->h_sumsq, o->d_sumsq, (size_t)m->pt.n * sizeof(float)));
    double s = 0; // a fixed order: the same norm on every run
    for (int i = 0; i < m->pt.n; i++)
        if (o->trainable[i] && in_slice(o, &m->pt.p[i], &a, &b)) s += o->h_sumsq[i];
    TRY(dist_sum(o->dist, &s, 1));
    *norm = sqrt(s);
    return 0;
}

int optim_step(optim_t *o, model_t *m, float lr, float grad_scale) {
    be_t *be = m->be;
    o->step++;
    // One call per run of consecutive trainable parameters (the gaps between
    // parameters are zero in every buffer, so a run may span them), cut to
    // this rank's slice.
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
                int64_t x = a > o->lo ? a : o->lo, y = b < o->hi ? b : o->hi;
                if (x < y)
                    be->adamw(be, o->master + (x - o->lo), act_at(be, m->w, x), o->grad + x, o->m1 + (x - o->lo),
                              o->m2 + (x - o->lo), y - x, lr, o->beta1, o->beta2, o->eps, nd ? 0.0f : o->weight_decay,
                              grad_scale, (int)o->step);
                a = b;
            }
        }
        i = j + 1;
    }
    return dist_allgather(o->dist, m->w, o->n, o->S);
}

int optim_gather(optim_t *o, model_t *m, float *master, float *m1, float *m2) {
    be_t *be = m->be;
    int64_t k = o->hi - o->lo;
    float *h = malloc((size_t)(k > 0 ? k : 1) * sizeof(float));
    if (!h) return err_set(ERR_NOMEM, "out of memory");
    const float *src[3] = {o->master, o->m1, o->m2};
    float *dst[3] = {master, m1, m2};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = be->copy_d2h(be, h, src[i], (size_t)k * sizeof(float));
        if (rc == 0) rc = dist_gather(o->dist, h, dst[i], o->n, o->S);
    }
    free(h);
    return rc;
}

int optim_load(optim_t *o, model_t *m, int k, const float *all) {
    float *dst[3] = {o->master, o->m1, o->m2};
    return m->be->copy_h2d(m->be, dst[k], all + o->lo, (size_t)(o->hi - o->lo) * sizeof(float));
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
