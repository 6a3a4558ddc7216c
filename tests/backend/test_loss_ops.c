// The CPU fused losses (linear cross entropy, KL from hidden states) against a
// naive double-precision computation over the full [N, V] logits, their
// gradients by finite differences, the layer-wise distillation distance
// (ild_dist) against its definition and by finite differences, and the
// optimizer ops (sumsq, AdamW).
//
// Sizes: V = 1000 is a multiple of neither the op's vocabulary tile (256) nor
// its row chunk (64); N = 13 fits one chunk, N = 150 takes three (64, 64, 22).
// Logits have a standard deviation near 2 (W ~ N(0, (2/sqrt(d))^2), h ~ N(0, 1)),
// the range of a trained LM head, so softmax probabilities span several decades.
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

static float *buf(int64_t n, uint64_t seed, float std) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    tu_randn(p, n, seed, std);
    return p;
}

static float *fill(int64_t n, float v) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = v;
    return p;
}

// z[N, V] = X W^T in double.
static double *naive_logits(const float *X, const float *W, int64_t N, int d, int64_t V) {
    double *z = malloc((size_t)(N * V) * sizeof(double));
    for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < V; v++) {
            double s = 0;
            for (int i = 0; i < d; i++)
                s += (double)X[n * d + i] * W[v * d + i];
            z[n * V + v] = s;
        }
    return z;
}

static double row_lse(const double *z, int64_t V) {
    double m = -DBL_MAX, s = 0;
    for (int64_t v = 0; v < V; v++)
        m = z[v] > m ? z[v] : m;
    for (int64_t v = 0; v < V; v++)
        s += exp(z[v] - m);
    return m + log(s);
}

// From G [N, V] (gradient of the loss w.r.t. the logits, scale included):
// dX = G W (=), dW += G^T X, both in double, returned as float.
static void naive_backward(const double *G, const float *X, const float *W, int64_t N, int d, int64_t V, float *dX,
                           float *dW) {
    for (int64_t n = 0; n < N; n++)
        for (int i = 0; i < d; i++) {
            double s = 0;
            for (int64_t v = 0; v < V; v++)
                s += G[n * V + v] * W[v * d + i];
            dX[n * d + i] = (float)s;
        }
    for (int64_t v = 0; v < V; v++)
        for (int i = 0; i < d; i++) {
            double s = dW[v * d + i];
            for (int64_t n = 0; n < N; n++)
                s += G[n * V + v] * X[n * d + i];
            dW[v * d + i] = (float)s;
        }
}

// Naive CE: returns the loss; dh =, dW += (dW holds its initial value on entry).
static double naive_ce(const float *h, const float *W, const int32_t *tgt, int64_t N, int d, int64_t V, float scale,
                       float *dh, float *dW) {
    double *z = naive_logits(h, W, N, d, V), loss = 0;
    for (int64_t n = 0; n < N; n++) {
        double *zr = z + n * V, lse = row_lse(zr, V);
        int32_t y = tgt[n];
        if (y >= 0) loss += lse - zr[y];
        for (int64_t v = 0; v < V; v++)
            zr[v] = y < 0 ? 0.0 : scale * (exp(zr[v] - lse) - (v == y));
    }
    naive_backward(z, h, W, N, d, V, dh, dW);
    free(z);
    return loss * scale;
}

// Naive KL(p_t || p_s): returns the loss; dhs =, dWs +=.
static double naive_kl(const float *hs, const float *Ws, const float *ht, const float *Wt, const int32_t *mask,
                       int64_t N, int ds, int dt, int64_t V, float scale, float *dhs, float *dWs) {
    double *s = naive_logits(hs, Ws, N, ds, V), *t = naive_logits(ht, Wt, N, dt, V), loss = 0;
    for (int64_t n = 0; n < N; n++) {
        double *sr = s + n * V, *tr = t + n * V, ls = row_lse(sr, V), lt = row_lse(tr, V);
        int skip = mask && mask[n] < 0;
        for (int64_t v = 0; v < V; v++) {
            double lps = sr[v] - ls, lpt = tr[v] - lt;
            if (!skip) loss += exp(lpt) * (lpt - lps);
            sr[v] = skip ? 0.0 : scale * (exp(lps) - exp(lpt));
        }
    }
    naive_backward(s, hs, Ws, N, ds, V, dhs, dWs);
    free(s);
    free(t);
    return loss * scale;
}

// ---- cross entropy -----------------------------------------------------------

typedef struct {
    be_t *be;
    float *h, *W, *hs, *Ws, *ht, *Wt;
    int32_t *tgt, *mask;
    int64_t N, V;
    int d, ds, dt;
    float scale;
} loss_ctx;

// Loss-only evaluations for the finite differences. The loss is one fp32 value
// made of N rows of magnitude ~|loss|: l1 = 4 |loss| bounds the rounding of the
// fp32 logits and of the final cast (both ~1e-7 relative).
static double ce_loss(void *ctx, double *l1) {
    loss_ctx *c = ctx;
    float loss;
    c->be->fused_ce(c->be, &loss, NULL, NULL, c->h, c->W, c->tgt, c->N, c->d, c->V, c->scale);
    if (l1) *l1 = 4.0 * fabs((double)loss);
    return loss;
}

static double kl_loss(void *ctx, double *l1) {
    loss_ctx *c = ctx;
    float loss;
    c->be->fused_kl(c->be, &loss, NULL, NULL, c->hs, c->Ws, c->ht, c->Wt, c->mask, c->N, c->ds, c->dt, c->V, c->scale);
    // KL is a small difference of terms of size ~|log p|: bound the rounding by
    // the CE-sized sum of |p_t log p_s| (~log V per row).
    if (l1) *l1 = 4.0 * fabs((double)c->scale) * (double)c->N * log((double)c->V) + 4.0 * fabs((double)loss);
    return loss;
}

static int32_t *ce_targets(int64_t N, int64_t V, uint64_t seed, int *valid) {
    int32_t *t = malloc((size_t)N * sizeof(int32_t));
    float *u = buf(N, seed, 1.0f);
    *valid = 0;
    for (int64_t n = 0; n < N; n++) {
        t[n] = (int32_t)(((uint32_t)(fabsf(u[n]) * 1e6f) + 7919u * (uint32_t)n) % (uint32_t)V);
        if (n % 5 == 2) t[n] = -100;         // ignored rows (HF's ignore_index)
        if (n == 0) t[n] = (int32_t)(V - 1); // the last vocabulary entry, in the last partial tile
        *valid += t[n] >= 0;
    }
    free(u);
    return t;
}

// The op against the naive computation. fp32 logits vs double: loss and
// gradients agree to ~1e-6 relative (sums of <= 1000 fp32 products); 1e-5 is
// the bound, far below the O(1) error of any real mistake.
static void ce_case(int64_t N, int d, int64_t V) {
    be_t *be = tu_cpu();
    int valid;
    int32_t *tgt = ce_targets(N, V, 7 + (uint64_t)N, &valid);
    float scale = 1.0f / (float)valid;
    float *h = buf(N * d, 1 + (uint64_t)N, 1.0f), *W = buf(V * d, 2, 2.0f / sqrtf((float)d));
    float *dW0 = buf(V * d, 3, 0.01f);
    float *dh = fill(N * d, NAN), *dW = malloc((size_t)(V * d) * sizeof(float));
    float *dh_ref = malloc((size_t)(N * d) * sizeof(float)), *dW_ref = malloc((size_t)(V * d) * sizeof(float));
    memcpy(dW, dW0, (size_t)(V * d) * sizeof(float));
    memcpy(dW_ref, dW0, (size_t)(V * d) * sizeof(float));
    float loss = NAN, loss2 = NAN;
    be->fused_ce(be, &loss, dh, dW, h, W, tgt, N, d, V, scale);
    double ref = naive_ce(h, W, tgt, N, d, V, scale, dh_ref, dW_ref);
    double el = fabs(loss - ref) / fabs(ref), eh = tu_rel_err(dh, dh_ref, N * d),
           ew = tu_inc_rel_err(dW, dW_ref, dW0, V * d);
    printf("  ce N=%lld d=%d V=%lld: loss %.6f (ref %.6f) rel err %.2e, dh %.2e, dW %.2e\n", (long long)N, d,
           (long long)V, loss, ref, el, eh, ew);
    assert_true(el < 1e-5);
    assert_true(eh < 1e-5);
    assert_true(ew < 1e-5);
    for (int64_t n = 0; n < N; n++) // ignored rows: exactly zero gradient (dh was NaN before)
        if (tgt[n] < 0)
            for (int i = 0; i < d; i++)
                assert_true(dh[n * d + i] == 0.0f);
    // Loss only (evaluation): the same value.
    be->fused_ce(be, &loss2, NULL, NULL, h, W, tgt, N, d, V, scale);
    assert_true(loss2 == loss);
    free(tgt), free(h), free(W), free(dW0), free(dh), free(dW), free(dh_ref), free(dW_ref);
}
static void test_ce_naive(void **st) { ce_case(13, 24, 1000); }
static void test_ce_naive_chunks(void **st) { ce_case(150, 24, 1000); }

// Finite differences: eps 5e-2 moves each logit by ~0.1; the truncation error
// (O(eps^2) of a softmax, third derivatives O(1)) stays near 1e-4 relative and
// the fp32 noise (tu_gradcheck's bound with l1 above) near 1e-4 of the
// gradient; tol 1e-2 separates real bugs (errors of O(1)) from both.
static void test_ce_gradcheck(void **st) {
    loss_ctx c = {.be = tu_cpu(), .N = 13, .d = 24, .V = 1000};
    int valid;
    c.tgt = ce_targets(c.N, c.V, 21, &valid);
    c.scale = 1.0f / (float)valid;
    c.h = buf(c.N * c.d, 22, 1.0f), c.W = buf(c.V * c.d, 23, 2.0f / sqrtf((float)c.d));
    float *dh = fill(c.N * c.d, NAN), *dW = calloc((size_t)(c.V * c.d), sizeof(float)), loss;
    c.be->fused_ce(c.be, &loss, dh, dW, c.h, c.W, c.tgt, c.N, c.d, c.V, c.scale);
    assert_int_equal(tu_gradcheck("ce dh", ce_loss, &c, c.h, dh, c.N * c.d, 5e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("ce dW", ce_loss, &c, c.W, dW, c.V * c.d, 5e-2f, 1e-2f, 60), 0);
    // The target rows of dW carry the -1 of the one-hot (the largest entries):
    // check one element of each of three such rows on its own.
    const int64_t rows[3] = {0, 1, 3};
    for (int k = 0; k < 3; k++) {
        int64_t i = (int64_t)c.tgt[rows[k]] * c.d + (k * 5) % c.d;
        assert_int_equal(tu_gradcheck("ce dW target entry", ce_loss, &c, c.W + i, dW + i, 1, 5e-2f, 1e-2f, 1), 0);
    }
    free(c.tgt), free(c.h), free(c.W), free(dh), free(dW);
}

// No valid row: loss 0, gradient 0. A target >= V: the loss is NaN (a data bug
// must not pass silently).
static void test_ce_edge(void **st) {
    be_t *be = tu_cpu();
    enum { N = 3, d = 8, V = 50 };
    float *h = buf(N * d, 31, 1.0f), *W = buf(V * d, 32, 0.5f), *dh = fill(N * d, NAN);
    float *dW = calloc(V * d, sizeof(float)), loss = NAN;
    int32_t none[N] = {-100, -1, -100}, bad[N] = {3, V, 4};
    be->fused_ce(be, &loss, dh, dW, h, W, none, N, d, V, 1.0f);
    assert_true(loss == 0.0f);
    for (int i = 0; i < N * d; i++)
        assert_true(dh[i] == 0.0f);
    for (int i = 0; i < V * d; i++)
        assert_true(dW[i] == 0.0f);
    be->fused_ce(be, &loss, NULL, NULL, h, W, bad, N, d, V, 1.0f);
    assert_true(isnan(loss));
    be->fused_ce(be, &loss, dh, dW, h, W, none, 0, d, V, 1.0f); // N = 0
    assert_true(loss == 0.0f);
    free(h), free(W), free(dh), free(dW);
}

// ---- KL -------------------------------------------------------------------------

// Teacher hidden size dt != ds; the teacher's logits are a little sharper
// (std ~3) than the student's (~2), as for a larger teacher.
static void kl_case(int64_t N, int ds, int dt, int64_t V, int masked) {
    be_t *be = tu_cpu();
    int32_t *mask = NULL;
    if (masked) {
        mask = malloc((size_t)N * sizeof(int32_t));
        for (int64_t n = 0; n < N; n++)
            mask[n] = (n % 4 == 1) ? -100 : (int32_t)n;
    }
    float scale = 1.0f / 3.0f; // "batchmean" over 3 sequences
    float *hs = buf(N * ds, 41 + (uint64_t)N, 1.0f), *Ws = buf(V * ds, 42, 2.0f / sqrtf((float)ds));
    float *ht = buf(N * dt, 43 + (uint64_t)N, 1.0f), *Wt = buf(V * dt, 44, 3.0f / sqrtf((float)dt));
    float *dW0 = buf(V * ds, 45, 0.01f);
    float *dh = fill(N * ds, NAN), *dW = malloc((size_t)(V * ds) * sizeof(float));
    float *dh_ref = malloc((size_t)(N * ds) * sizeof(float)), *dW_ref = malloc((size_t)(V * ds) * sizeof(float));
    memcpy(dW, dW0, (size_t)(V * ds) * sizeof(float));
    memcpy(dW_ref, dW0, (size_t)(V * ds) * sizeof(float));
    float loss = NAN, loss2 = NAN;
    be->fused_kl(be, &loss, dh, dW, hs, Ws, ht, Wt, mask, N, ds, dt, V, scale);
    double ref = naive_kl(hs, Ws, ht, Wt, mask, N, ds, dt, V, scale, dh_ref, dW_ref);
    double el = fabs(loss - ref) / fabs(ref), eh = tu_rel_err(dh, dh_ref, N * ds),
           ew = tu_inc_rel_err(dW, dW_ref, dW0, V * ds);
    printf("  kl N=%lld ds=%d dt=%d V=%lld%s: loss %.6f (ref %.6f) rel err %.2e, dhs %.2e, dWs %.2e\n", (long long)N,
           ds, dt, (long long)V, masked ? " masked" : "", loss, ref, el, eh, ew);
    // KL is a difference of CE-sized terms (~log V per row): its fp32 rounding
    // relative to KL itself (~1 per row here) is a few 1e-7; 1e-5 as for CE.
    assert_true(ref > 0);
    assert_true(el < 1e-5);
    assert_true(eh < 1e-5);
    assert_true(ew < 1e-5);
    if (mask)
        for (int64_t n = 0; n < N; n++)
            if (mask[n] < 0)
                for (int i = 0; i < ds; i++)
                    assert_true(dh[n * ds + i] == 0.0f);
    be->fused_kl(be, &loss2, NULL, NULL, hs, Ws, ht, Wt, mask, N, ds, dt, V, scale);
    assert_true(loss2 == loss);
    free(mask), free(hs), free(Ws), free(ht), free(Wt), free(dW0), free(dh), free(dW), free(dh_ref), free(dW_ref);
}
static void test_kl_naive(void **st) { kl_case(13, 24, 40, 1000, 0); }
static void test_kl_naive_masked_chunks(void **st) { kl_case(150, 24, 40, 1000, 1); }

// Same finite-difference settings as CE.
static void test_kl_gradcheck(void **st) {
    loss_ctx c = {.be = tu_cpu(), .N = 13, .ds = 24, .dt = 40, .V = 1000, .scale = 0.5f};
    c.hs = buf(c.N * c.ds, 51, 1.0f), c.Ws = buf(c.V * c.ds, 52, 2.0f / sqrtf((float)c.ds));
    c.ht = buf(c.N * c.dt, 53, 1.0f), c.Wt = buf(c.V * c.dt, 54, 3.0f / sqrtf((float)c.dt));
    int32_t mask[13];
    for (int n = 0; n < 13; n++)
        mask[n] = n == 4 ? -1 : 0;
    c.mask = mask;
    float *dh = fill(c.N * c.ds, NAN), *dW = calloc((size_t)(c.V * c.ds), sizeof(float)), loss;
    c.be->fused_kl(c.be, &loss, dh, dW, c.hs, c.Ws, c.ht, c.Wt, c.mask, c.N, c.ds, c.dt, c.V, c.scale);
    assert_int_equal(tu_gradcheck("kl dhs", kl_loss, &c, c.hs, dh, c.N * c.ds, 5e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("kl dWs", kl_loss, &c, c.Ws, dW, c.V * c.ds, 5e-2f, 1e-2f, 60), 0);
    free(c.hs), free(c.Ws), free(c.ht), free(c.Wt), free(dh), free(dW);
}

// Student == teacher: the same logits through the same arithmetic, so every
// term p_t (log p_t - log p_s) and p_s - p_t is exactly 0; the bounds leave
// room only for a reordering of identical sums.
static void test_kl_self_zero(void **st) {
    be_t *be = tu_cpu();
    enum { N = 37, d = 24, V = 1000 };
    float *h = buf(N * d, 61, 1.0f), *W = buf(V * d, 62, 3.0f / sqrtf((float)d));
    float *dh = fill(N * d, NAN), *dW = calloc(V * d, sizeof(float)), loss = NAN;
    be->fused_kl(be, &loss, dh, dW, h, W, h, W, NULL, N, d, d, V, 1.0f);
    float *zero = calloc(V * d, sizeof(float));
    printf("  kl(p || p) = %.3e, max |dhs| %.3e, max |dWs| %.3e\n", loss, tu_max_abs_diff(dh, zero, N * d),
           tu_max_abs_diff(dW, zero, V * d));
    free(zero);
    assert_true(fabsf(loss) <= 1e-6f);
    for (int i = 0; i < N * d; i++)
        assert_true(fabsf(dh[i]) <= 1e-7f);
    for (int i = 0; i < V * d; i++)
        assert_true(fabsf(dW[i]) <= 1e-7f);
    free(h), free(W), free(dh), free(dW);
}

// ---- layer-wise distillation distance -----------------------------------------

// The ILD distance in double, written out from its definition: dist_n =
// ||x_n - y_n||_2 (L2) or sum_i (x_ni - y_ni)^2 / d (MSE); loss = scale sum_n
// dist_n; dx = scale (x - y) / dist (L2, 0 where x_n == y_n) or scale 2 (x - y)
// / d (MSE).
static double naive_ild(const float *x, const float *y, int64_t N, int d, float scale, int mode, float *dx) {
    double loss = 0;
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < d; i++)
            ss += ((double)x[n * d + i] - y[n * d + i]) * ((double)x[n * d + i] - y[n * d + i]);
        double dist = mode == DIST_L2 ? sqrt(ss) : ss / d;
        loss += dist;
        for (int i = 0; i < d; i++) {
            double diff = (double)x[n * d + i] - y[n * d + i];
            dx[n * d + i] = (float)(mode == DIST_L2 ? (ss > 0 ? scale * diff / dist : 0.0) : scale * 2.0 * diff / d);
        }
    }
    return loss * scale;
}

// Student rows x ~ N(0, 1), teacher rows y = x + N(0, 0.3^2) (a student near
// its teacher: distances ~0.3 sqrt(d)), with y_n == x_n on the rows listed in
// `same` (the L2 norm's kink: gradient 0 there, not NaN).
static void ild_inputs(int64_t N, int d, uint64_t seed, const int64_t *same, int n_same, float **x, float **y) {
    *x = buf(N * d, seed, 1.0f);
    *y = buf(N * d, seed + 1, 0.3f);
    for (int64_t i = 0; i < N * d; i++)
        (*y)[i] += (*x)[i];
    for (int k = 0; k < n_same; k++)
        memcpy(*y + same[k] * d, *x + same[k] * d, (size_t)d * sizeof(float));
}

// N = 300 spans two of the op's 256-row chunks; d = 200 makes a chunk large
// enough (51200 elements > CPU_PAR_MIN) to run its rows in parallel. Rows 5
// and 290 (one per chunk) have x == y. The op accumulates in double and rounds
// the loss and each dx element once to fp32, as the reference does: both agree
// to 2^-24 relative (6e-8); the bound 1e-6 leaves room for reordering, far
// below the factor-of-d or sign errors a mistake makes.
static void ild_case(int mode) {
    be_t *be = tu_cpu();
    enum { N = 300, d = 200 };
    const int64_t same[2] = {5, 290};
    const float scale = 1.0f / N; // the per-token mean of hybrid_model.md §9
    float *x, *y;
    ild_inputs(N, d, 101 + (uint64_t)mode, same, 2, &x, &y);
    float *dx = fill(N * d, NAN), *dx_ref = fill(N * d, NAN), loss = NAN, loss2 = NAN;
    be->ild_dist(be, &loss, dx, x, y, N, d, scale, mode);
    double ref = naive_ild(x, y, N, d, scale, mode, dx_ref);
    double el = fabs(loss - ref) / fabs(ref), eg = tu_rel_err(dx, dx_ref, N * d);
    printf("  ild %s N=%d d=%d: loss %.6f (ref %.6f) rel err %.2e, dx %.2e\n", mode == DIST_L2 ? "L2" : "MSE", N, d,
           loss, ref, el, eg);
    assert_true(el < 1e-6);
    assert_true(eg < 1e-6);
    for (int64_t i = 0; i < N * d; i++) // every element written, none NaN (the x == y rows included)
        assert_true(isfinite(dx[i]));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < d; i++)
            assert_true(dx[same[k] * d + i] == 0.0f);
    // Evaluation (dx NULL): the same loss, bit for bit.
    be->ild_dist(be, &loss2, NULL, x, y, N, d, scale, mode);
    assert_true(loss2 == loss);
    // Scale 1 against scale 1/4: a power of two commutes with every rounding in
    // the op, so the loss and dx scale exactly.
    float *dx1 = fill(N * d, NAN), *dx4 = fill(N * d, NAN), l1 = NAN, l4 = NAN;
    be->ild_dist(be, &l1, dx1, x, y, N, d, 1.0f, mode);
    be->ild_dist(be, &l4, dx4, x, y, N, d, 0.25f, mode);
    assert_true(l1 > 0 && l4 == 0.25f * l1);
    for (int64_t i = 0; i < N * d; i++)
        assert_true(dx4[i] == 0.25f * dx1[i]);
    free(x), free(y), free(dx), free(dx_ref), free(dx1), free(dx4);
}
static void test_ild_l2_naive(void **st) { ild_case(DIST_L2); }
static void test_ild_mse_naive(void **st) { ild_case(DIST_MSE); }

typedef struct {
    be_t *be;
    float *x, *y, *g; // g: the analytic gradient, for the rounding bound
    int64_t N;
    int d, mode;
    float scale;
} ild_ctx;

// The loss is summed in double and rounded once (|loss| 2^-24); perturbing x
// in fp32 rounds each x_i (|x_i| 2^-24), moving the loss by up to sum |g_i x_i|
// 2^-24: l1 is the sum of both.
static double ild_loss(void *ctx, double *l1) {
    ild_ctx *c = ctx;
    float loss;
    c->be->ild_dist(c->be, &loss, NULL, c->x, c->y, c->N, c->d, c->scale, c->mode);
    if (l1) {
        double gx;
        tu_dot_l1(c->g, c->x, c->N * c->d, &gx);
        *l1 = fabs((double)loss) + gx;
    }
    return loss;
}

// Finite differences with eps 1e-2 on rows whose distances are ~0.3 sqrt(24)
// ~ 1.5, far from the kink at 0. MSE is quadratic: the central difference is
// exact but for rounding. L2: the truncation error is eps^2/6 times the third
// derivative of ||.||, ~1/dist^2 relative, ~1e-5. What dominates is the fp32
// loss: one ulp of a loss ~1.4 over 2 eps is 6e-6 (measured: |fd - an| <= 5.8e-6
// for L2, 2.2e-7 for MSE); tu_gradcheck's noise term from l1 (~1e-4 here) covers
// it and tol 1e-3 the rest, while a wrong sign, a missing 1/d or 2, a missing
// scale or a wrong norm is off by a factor (planted: each one fails).
static void ild_gradcheck(int mode) {
    ild_ctx c = {.be = tu_cpu(), .N = 13, .d = 24, .mode = mode, .scale = 1.0f / 13.0f};
    ild_inputs(c.N, c.d, 111 + (uint64_t)mode, NULL, 0, &c.x, &c.y);
    c.g = fill(c.N * c.d, NAN);
    float loss = NAN;
    c.be->ild_dist(c.be, &loss, c.g, c.x, c.y, c.N, c.d, c.scale, mode);
    assert_int_equal(tu_gradcheck(mode == DIST_L2 ? "ild L2 dx" : "ild MSE dx", ild_loss, &c, c.x, c.g, c.N * c.d,
                                  1e-2f, 1e-3f, 100),
                     0);
    free(c.x), free(c.y), free(c.g);
}
static void test_ild_l2_gradcheck(void **st) { ild_gradcheck(DIST_L2); }
static void test_ild_mse_gradcheck(void **st) { ild_gradcheck(DIST_MSE); }

// x == y everywhere: loss exactly 0 and dx exactly 0 (no 0/0) in both modes;
// N = 0: loss 0; an unknown mode: an error and NaN outputs (never a number).
static void test_ild_edge(void **st) {
    be_t *be = tu_cpu();
    enum { N = 4, d = 16 };
    float *x = buf(N * d, 121, 1.0f), *dx = fill(N * d, NAN), loss = NAN;
    for (int mode = DIST_L2; mode <= DIST_MSE; mode++) {
        loss = NAN;
        be->ild_dist(be, &loss, dx, x, x, N, d, 0.5f, mode);
        assert_true(loss == 0.0f);
        for (int i = 0; i < N * d; i++)
            assert_true(dx[i] == 0.0f);
        loss = NAN;
        be->ild_dist(be, &loss, dx, x, x, 0, d, 0.5f, mode);
        assert_true(loss == 0.0f);
    }
    err_clear();
    loss = 1.0f;
    be->ild_dist(be, &loss, dx, x, x, N, d, 1.0f, 7);
    assert_true(isnan(loss));
    assert_true(isnan(dx[0]) && isnan(dx[N * d - 1]));
    assert_int_equal(err_code(), ERR_INPUT);
    err_clear();
    free(x), free(dx);
}

// ---- optimizer ---------------------------------------------------------------

static void test_sumsq(void **st) {
    be_t *be = tu_cpu();
    const int64_t n = 100003;
    float *x = buf(n, 71, 3.0f), out = NAN;
    double ref = 0;
    for (int64_t i = 0; i < n; i++)
        ref += (double)x[i] * x[i];
    be->sumsq(be, &out, x, n);
    // double accumulation, one final rounding to fp32: 2^-24 relative.
    assert_true(fabs(out - ref) <= 1e-7 * ref);
    be->sumsq(be, &out, x, 0);
    assert_true(out == 0.0f);
    free(x);
}

// AdamW, two steps, against the textbook update written out in double:
// m_t = b1 m + (1-b1) g, v_t = b2 v + (1-b2) g^2, mhat = m_t / (1 - b1^t),
// vhat = v_t / (1 - b2^t), p -= lr (mhat / (sqrt(vhat) + eps) + wd p).
// fp32 vs double: a few ulps of each value; 2e-6 relative (plus 1e-9 absolute
// for the moments) is the bound.
static void test_adamw(void **st) {
    be_t *be = tu_cpu();
    enum { n = 5 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    // w (the work copy) starts as NaN: the op must write it
    float p[n] = {1.0f, -0.5f, 0.25f, 2.0f, -3.0f}, w[n] = {NAN, NAN, NAN, NAN, NAN}, m[n] = {0}, v[n] = {0};
    const float g1[n] = {0.2f, -1.0f, 3.0f, 1e-3f, -0.04f}, g2[n] = {-0.1f, -2.0f, 1.0f, 5e-3f, 0.3f};
    double ep[n], em[n] = {0}, ev[n] = {0};
    for (int i = 0; i < n; i++)
        ep[i] = p[i];
    for (int t = 1; t <= 2; t++) {
        const float *g = t == 1 ? g1 : g2;
        be->adamw(be, p, w, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
        for (int i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            em[i] = (double)b1 * em[i] + (1.0 - (double)b1) * gi;
            ev[i] = (double)b2 * ev[i] + (1.0 - (double)b2) * gi * gi;
            double mh = em[i] / (1.0 - pow(b1, t)), vh = ev[i] / (1.0 - pow(b2, t));
            ep[i] -= (double)lr * (mh / (sqrt(vh) + eps) + (double)wd * ep[i]);
            assert_true(fabs(p[i] - ep[i]) <= 2e-6 * fabs(ep[i]));
            assert_true(fabs(m[i] - em[i]) <= 2e-6 * fabs(em[i]) + 1e-9);
            assert_true(fabs(v[i] - ev[i]) <= 2e-6 * fabs(ev[i]) + 1e-12);
            assert_true(w[i] == p[i]);
        }
        if (t == 1) // by hand: mhat/sqrt(vhat) = sign(g) at step 1: p0 (1 - lr wd) - lr sign(g)
            assert_true(fabsf(p[0] - (1.0f * 0.999f - 0.01f)) <= 1e-6f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ce_naive),
        cmocka_unit_test(test_ce_naive_chunks),
        cmocka_unit_test(test_ce_gradcheck),
        cmocka_unit_test(test_ce_edge),
        cmocka_unit_test(test_kl_naive),
        cmocka_unit_test(test_kl_naive_masked_chunks),
        cmocka_unit_test(test_kl_gradcheck),
        cmocka_unit_test(test_kl_self_zero),
        cmocka_unit_test(test_ild_l2_naive),
        cmocka_unit_test(test_ild_mse_naive),
        cmocka_unit_test(test_ild_l2_gradcheck),
        cmocka_unit_test(test_ild_mse_gradcheck),
        cmocka_unit_test(test_ild_edge),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_adamw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
