// Fused linear cross entropy and fused KL from hidden states (the reference).
// Rows are processed in chunks of LOSS_ROWS: only the chunk's [rows, V] fp32
// logits exist at a time (never [N, V]). Within a chunk the logits are computed
// one vocabulary tile at a time and folded into a running (max, sum) per row
// (online log-sum-exp, in double); the chunk's logits buffer is then
// overwritten in place by the gradient of the loss w.r.t. the logits, and two
// GEMMs give dh = scale * G W and dW += scale * G^T h.
// Also the layer-wise distillation distance (ild_dist): per-row distances in
// double, summed in row order.
#include <float.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

enum {
    LOSS_ROWS = 64,   // token rows per chunk
    LOSS_VTILE = 256, // vocabulary tile of the online log-sum-exp
    ILD_ROWS = 256    // rows per chunk of ild_dist (their distances held on the stack)
};

// Folds x[0..n) into the running max m and sum s of exp(x - m).
static void lse_fold(double *m, double *s, const float *x, int64_t n) {
    double mx = *m;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = *s * exp(*m - mx); // m starts at -DBL_MAX: exp(-huge) = 0, never NaN
    for (int64_t i = 0; i < n; i++)
        sum += exp((double)x[i] - mx); // a NaN logit makes the sum NaN
    *m = mx;
    *s = sum;
}

// L[r, v0:v0+vt] = X[r] . Wt[v]: one vocabulary tile of the chunk's logits.
static void logits_tile(be_t *be, float *L, int64_t V, const float *X, const float *Wm, int64_t rows, int d, int64_t v0,
                        int64_t vt) {
    be->gemm(be, 0, 1, rows, vt, d, 1.0f, X, d, Wm + v0 * d, d, 0.0f, L + v0, V);
}

static void cpu_fused_ce(be_t *be, float *loss, void *dh_, float *dW, const void *h_, const void *W_,
                         const int32_t *targets, int64_t N, int d, int64_t V, float scale) {
    const float *h = h_, *W = W_;
    float *dh = dh_;
    const int grad = dh || dW;
    const int64_t R = N < LOSS_ROWS ? N : LOSS_ROWS;
    *loss = 0.0f;
    if (N <= 0) return;
    cpu_tmp_t tl;
    float *L = cpu_tmp_take(be, &tl, R * V, "fused CE logits");
    if (!L) {
        *loss = NAN;
        cpu_fill_nan(dh, N * d);
        return;
    }
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t c = N - r0 < R ? N - r0 : R;
        double m[LOSS_ROWS], s[LOSS_ROWS], lse[LOSS_ROWS];
        for (int64_t r = 0; r < c; r++)
            m[r] = -DBL_MAX, s[r] = 0.0;
        for (int64_t v0 = 0; v0 < V; v0 += LOSS_VTILE) {
            const int64_t vt = V - v0 < LOSS_VTILE ? V - v0 : LOSS_VTILE;
            logits_tile(be, L, V, h + r0 * d, W, c, d, v0, vt);
#pragma omp parallel for schedule(static) if (c * vt > CPU_PAR_MIN)
            for (int64_t r = 0; r < c; r++)
                lse_fold(&m[r], &s[r], L + r * V + v0, vt);
        }
        // Loss in row order (deterministic).
        for (int64_t r = 0; r < c; r++) {
            const int32_t y = targets[r0 + r];
            lse[r] = m[r] + log(s[r]);
            if (y < 0) continue;
            total += y < V ? lse[r] - (double)L[r * V + y] : NAN;
        }
        if (!grad) continue;
#pragma omp parallel for schedule(static) if (c * V > CPU_PAR_MIN)
        for (int64_t r = 0; r < c; r++) { // G = softmax - onehot(target), in place; ignored rows 0
            const int32_t y = targets[r0 + r];
            float *g = L + r * V;
            if (y < 0 || y >= V) {
                memset(g, 0, (size_t)V * sizeof(float));
                continue;
            }
            for (int64_t i = 0; i < V; i++)
                g[i] = (float)(exp((double)g[i] - lse[r]) - (i == y ? 1.0 : 0.0));
        }
        if (dh) be->gemm(be, 0, 0, c, d, V, scale, L, V, W, d, 0.0f, dh + r0 * d, d);
        if (dW) be->gemm_f32out(be, 1, 0, V, d, c, scale, L, V, h + r0 * d, d, 1.0f, dW, d);
    }
    *loss = (float)(total * scale);
    cpu_tmp_give(be, &tl);
}

static void cpu_fused_kl(be_t *be, float *loss, void *dhs_, float *dWs, const void *hs_, const void *Ws_,
                         const void *ht_, const void *Wt_, const int32_t *mask, int64_t N, int ds, int dt, int64_t V,
                         float scale) {
    const float *hs = hs_, *Ws = Ws_, *ht = ht_, *Wt = Wt_;
    float *dhs = dhs_;
    const int grad = dhs || dWs;
    const int64_t R = N < LOSS_ROWS ? N : LOSS_ROWS;
    *loss = 0.0f;
    if (N <= 0) return;
    cpu_tmp_t tl;
    float *S = cpu_tmp_take(be, &tl, 2 * R * V, "fused KL logits"); // student then teacher logits
    if (!S) {
        *loss = NAN;
        cpu_fill_nan(dhs, N * ds);
        return;
    }
    float *T = S + R * V;
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t c = N - r0 < R ? N - r0 : R;
        double ms[LOSS_ROWS], ss[LOSS_ROWS], mt[LOSS_ROWS], st[LOSS_ROWS], rl[LOSS_ROWS];
        for (int64_t r = 0; r < c; r++)
            ms[r] = mt[r] = -DBL_MAX, ss[r] = st[r] = 0.0;
        for (int64_t v0 = 0; v0 < V; v0 += LOSS_VTILE) {
            const int64_t vt = V - v0 < LOSS_VTILE ? V - v0 : LOSS_VTILE;
            logits_tile(be, S, V, hs + r0 * ds, Ws, c, ds, v0, vt);
            logits_tile(be, T, V, ht + r0 * dt, Wt, c, dt, v0, vt);
#pragma omp parallel for schedule(static) if (c * vt > CPU_PAR_MIN)
            for (int64_t r = 0; r < c; r++) {
                lse_fold(&ms[r], &ss[r], S + r * V + v0, vt);
                lse_fold(&mt[r], &st[r], T + r * V + v0, vt);
            }
        }
        // Row r: sum_v p_t (log p_t - log p_s); gradient w.r.t. the student
        // logits p_s - p_t, over the student logits in place.
#pragma omp parallel for schedule(static) if (c * V > CPU_PAR_MIN)
        for (int64_t r = 0; r < c; r++) {
            float *s = S + r * V;
            const float *t = T + r * V;
            rl[r] = 0.0;
            if (mask && mask[r0 + r] < 0) {
                if (grad) memset(s, 0, (size_t)V * sizeof(float));
                continue;
            }
            const double lse_s = ms[r] + log(ss[r]), lse_t = mt[r] + log(st[r]);
            double kl = 0.0;
            for (int64_t i = 0; i < V; i++) {
                const double ls = s[i] - lse_s, lt = t[i] - lse_t, pt = exp(lt);
                kl += pt * (lt - ls);
                if (grad) s[i] = (float)(exp(ls) - pt);
            }
            rl[r] = kl;
        }
        for (int64_t r = 0; r < c; r++)
            total += rl[r];
        if (dhs) be->gemm(be, 0, 0, c, ds, V, scale, S, V, Ws, ds, 0.0f, dhs + r0 * ds, ds);
        if (dWs) be->gemm_f32out(be, 1, 0, V, ds, c, scale, S, V, hs + r0 * ds, ds, 1.0f, dWs, ds);
    }
    *loss = (float)(total * scale);
    cpu_tmp_give(be, &tl);
}

// Row r of a chunk: dist = ||x - y||_2 (L2) or ||x - y||^2 / d (MSE), in
// double; dx = scale * (x - y) / dist (L2; 0 when dist == 0, where the norm has
// no gradient and torch's autograd gives 0 too), or scale * 2 (x - y) / d (MSE).
// A NaN distance makes the row's dx NaN (dist == 0 is false for it).
static void cpu_ild_dist(be_t *be, float *loss, void *dx_, const void *x_, const void *y_, int64_t N, int d,
                         float scale, int mode) {
    const float *x = x_, *y = y_;
    float *dx = dx_;
    if (N <= 0) {
        *loss = 0.0f;
        return;
    }
    if ((mode != DIST_L2 && mode != DIST_MSE) || d < 1) {
        err_set(ERR_INPUT, "cpu ild_dist: mode %d, d %d: expected mode DIST_L2 (0) or DIST_MSE (1) and d >= 1", mode,
                d);
        *loss = NAN;
        if (d > 0) cpu_fill_nan(dx, N * d);
        return;
    }
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += ILD_ROWS) {
        const int64_t c = N - r0 < ILD_ROWS ? N - r0 : ILD_ROWS;
        double dist[ILD_ROWS];
#pragma omp parallel for schedule(static) if (c * d > CPU_PAR_MIN)
        for (int64_t r = 0; r < c; r++) {
            const float *xr = x + (r0 + r) * d, *yr = y + (r0 + r) * d;
            double ss = 0.0;
            for (int i = 0; i < d; i++) {
                const double t = (double)xr[i] - yr[i];
                ss += t * t;
            }
            dist[r] = mode == DIST_L2 ? sqrt(ss) : ss / d;
            if (!dx) continue;
            double coef = 2.0 * scale / d;
            if (mode == DIST_L2) coef = dist[r] == 0.0 ? 0.0 : scale / dist[r];
            float *gr = dx + (r0 + r) * d;
            for (int i = 0; i < d; i++)
                gr[i] = (float)(((double)xr[i] - yr[i]) * coef);
        }
        for (int64_t r = 0; r < c; r++) // row order: the same sum whatever the thread count
            total += dist[r];
    }
    *loss = (float)(total * scale);
}

static int64_t cpu_loss_rows_max(be_t *be, int64_t V) { return LOSS_ROWS; }

// The reference of greedy decoding's choice: a running maximum that only a
// larger value replaces (so the first of equal maxima stays; x > NaN and
// NaN > x are both false, so a NaN never replaces it, nor is kept when a
// number follows).
static void cpu_argmax_rows(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x_,
                            int64_t ld, int64_t N, int64_t V) {
    const float *x = x_;
    if (ring && (N > BE_ARGMAX_RING_ROWS || stride < N || !turn)) {
        err_set(ERR_INPUT, "cpu argmax_rows: a ring of stride %lld for %lld rows", (long long)stride, (long long)N);
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        const float *row = x + n * ld;
        int64_t best = -1;
        for (int64_t v = 0; v < V; v++)
            if (row[v] == row[v] && (best < 0 || row[v] > row[best])) best = v;
        ids[n] = best < 0 ? 0 : (int32_t)best;
        if (ring) ring[*turn * stride + n] = ids[n];
    }
    if (ring) *turn ^= 1;
}

// The reference: the logits into a temporary (proj_rmsnorm), then argmax_rows.
static void cpu_proj_rmsnorm_argmax(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x,
                                    int64_t ldx, const void *xw, float eps, const void *W, int64_t N, int64_t K,
                                    int64_t V) {
    if (N <= 0) return;
    cpu_tmp_t tmp;
    float *lg = cpu_tmp_take(be, &tmp, N * V, "proj_rmsnorm_argmax");
    if (!lg) {
        for (int64_t n = 0; n < N; n++)
            ids[n] = 0;
        return;
    }
    be->proj_rmsnorm(be, lg, x, ldx, xw, eps, W, N, K, V);
    cpu_argmax_rows(be, ids, ring, stride, turn, lg, V, N, V);
    cpu_tmp_give(be, &tmp);
}

void cpu_register_loss(be_t *be) {
    be->proj_rmsnorm_argmax = cpu_proj_rmsnorm_argmax;
    be->argmax_rows = cpu_argmax_rows;
    be->fused_ce = cpu_fused_ce;
    be->loss_rows_max = cpu_loss_rows_max;
    be->fused_kl = cpu_fused_kl;
    be->ild_dist = cpu_ild_dist;
}
