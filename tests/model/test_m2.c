// Mamba-2 layer (model/m2.c), Zebra-Llama layout at small dims: d = 32, teacher
// H = 4, Hkv = 2, head dim 8 -> d_inner 32, d_xb 16, P = N = 8, GQA of x and B
// (2 heads per x head / B group), chunk 16 so that T = 40 runs 16 + 16 + 8.
//  - finite-difference gradient check of m2_forward for x and every parameter,
//    without a cache and through a carried cache (states treated as constants);
//  - the forward against a naive double-precision reference written from the spec;
//  - decode: a forward with a cache over 25 tokens then 20 m2_step calls equals
//    one forward over 45 tokens; a prefill in pieces equals one forward.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/m2.h"
#include "testutil.h"

typedef struct {
    arch_t a;
    ptable_t pt;
    layer_ctx_t c;
    float *wflat, *gflat;
    m2_w_t w, g;
} fix_t;

static void fix_init(fix_t *f) {
    memset(f, 0, sizeof *f);
    arch_init(&f->a);
    f->a.d = 32, f->a.n_layers = 1, f->a.H = 4, f->a.Hkv = 2, f->a.dh = 8, f->a.ffn = 8, f->a.V = 16;
    f->a.kind[0] = LAYER_M2;
    // MambaInLlama from the teacher: d_inner = H dh, d_xb = Hkv dh, nheads = H, headdim = d_state = dh
    f->a.m2 = (m2_dims_t){
        .d_inner = 32, .d_xb = 16, .n_heads = 4, .headdim = 8, .d_state = 8, .conv = 4, .chunk = 16, .norm_eps = 1e-5f};
    assert_int_equal(arch_validate(&f->a, "test"), 0);
    assert_int_equal(ptable_build(&f->pt, &f->a), 0);
    // weights N(0, 0.3^2): with d = 32 the projections are O(1), the conv outputs O(0.5)
    f->wflat = tu_params(&f->pt, 11, 0.3f);
    f->gflat = calloc((size_t)f->pt.total, sizeof(float));
    assert_int_equal(m2_w_bind(&f->w, &f->pt, f->wflat, sizeof(float), 0), 0);
    assert_int_equal(m2_w_bind(&f->g, &f->pt, f->gflat, sizeof(float), 0), 0);
    // Decays as after the Mamba-2 init, from slow to fast: A = -exp(A_log) in
    // [-2.7, -0.37], dt' = softplus(dt + dt_bias) mostly 0.02 .. 0.5, so per-token
    // log decays range from ~-0.01 (state crosses chunk boundaries) to ~-1.
    float *A_log = f->w.A_log, *dt_bias = f->w.dt_bias;
    for (int h = 0; h < 4; h++)
        A_log[h] = -1.0f + 0.66f * h, dt_bias[h] = -2.5f + 0.3f * h;
    tu_ctx(&f->c, &f->a, 0);
}

static void fix_free(fix_t *f) {
    tu_ctx_free(&f->c);
    ptable_free(&f->pt);
    free(f->wflat), free(f->gflat);
}

// Cache of B sequences, as the model allocates it: zeroed, len 0.
typedef struct {
    layer_cache_t lc;
    int64_t n_state, n_conv;
} cache_t;

static void cache_init(cache_t *k, const arch_t *a, int B) {
    const m2_dims_t *m = &a->m2;
    memset(k, 0, sizeof *k);
    k->n_state = (int64_t)B * m->n_heads * m->headdim * m->d_state;
    k->n_conv = (int64_t)B * (m->d_inner + 2 * m->d_xb) * m->conv;
    k->lc.B = B, k->lc.cap = 1 << 20;
    k->lc.u.m2.state = calloc((size_t)k->n_state, sizeof(float));
    k->lc.u.m2.conv = calloc((size_t)k->n_conv, sizeof(float));
}

static void cache_copy(cache_t *dst, const cache_t *src) {
    memcpy(dst->lc.u.m2.state, src->lc.u.m2.state, (size_t)src->n_state * sizeof(float));
    memcpy(dst->lc.u.m2.conv, src->lc.u.m2.conv, (size_t)src->n_conv * sizeof(float));
    dst->lc.len = src->lc.len;
}

static void cache_free(cache_t *k) {
    free(k->lc.u.m2.state);
    free(k->lc.u.m2.conv);
}

static float *buf(int64_t n, uint64_t seed) {
    float *p = calloc((size_t)n, sizeof(float));
    if (seed) tu_randn(p, n, seed, 1.0f);
    return p;
}

// ---- gradient check ------------------------------------------------------------

// loss = sum(out * R) of one forward over x [B,T,d]; with a cache, every forward
// starts from the same snapshot of it.
typedef struct {
    fix_t *f;
    float *x, *out, *R;
    int B, T;
    cache_t *cache, *snap;
} loss_t;

static double layer_loss(void *ctx, double *l1) {
    loss_t *L = ctx;
    tu_ctx_reset(&L->f->c);
    if (L->cache) cache_copy(L->cache, L->snap);
    int rc = m2_forward(&L->f->c, &L->f->w, L->out, L->x, L->B, L->T, L->cache ? L->cache->lc.len : 0,
                        L->cache ? &L->cache->lc : NULL, NULL);
    assert_int_equal(rc, 0);
    return tu_dot_l1(L->out, L->R, (int64_t)L->B * L->T * L->f->a.d, l1);
}

static const char *param_names[] = {"in_proj.weight", "conv1d.weight",  "conv1d.bias", "dt_bias", "A_log", "D",
                                    "norm.weight",    "out_proj.weight"};

// Analytic gradients from m2_backward, then finite differences for x and every parameter.
// eps 1e-2 and tol 1e-2 as in tests/backend: the layer is smooth (silu,
// softplus, exp of non-positive arguments, rsqrt of a mean square of O(1)), so
// the O(eps^2) truncation error stays near 1e-4 relative; the fp32 rounding of
// the forward is covered by tu_gradcheck's noise term.
static int check_grads(fix_t *f, loss_t *L, const char *tag) {
    int64_t nx = (int64_t)L->B * L->T * f->a.d;
    float *dx = buf(nx, 0);
    memset(f->gflat, 0, (size_t)f->pt.total * sizeof(float));
    tu_ctx_reset(&f->c);
    if (L->cache) cache_copy(L->cache, L->snap);
    m2_saved_t sv;
    assert_int_equal(m2_forward(&f->c, &f->w, L->out, L->x, L->B, L->T, 0, L->cache ? &L->cache->lc : NULL, &sv), 0);
    assert_int_equal(m2_backward(&f->c, &f->w, &f->g, dx, L->R, &sv), 0);
    char name[128];
    int fails = 0;
    snprintf(name, sizeof name, "%s dx", tag);
    fails += tu_gradcheck(name, layer_loss, L, L->x, dx, nx, 1e-2f, 1e-2f, 40);
    for (size_t i = 0; i < sizeof param_names / sizeof param_names[0]; i++) {
        char full[128];
        snprintf(full, sizeof full, "model.layers.0.mamba.%s", param_names[i]);
        const param_t *p = ptable_find(&f->pt, full);
        assert_non_null(p);
        snprintf(name, sizeof name, "%s d%s", tag, param_names[i]);
        fails += tu_gradcheck(name, layer_loss, L, f->wflat + p->off, f->gflat + p->off, p->numel, 1e-2f, 1e-2f, 40);
    }
    free(dx);
    return fails;
}

// Training forward (no cache): B = 2, T = 40 over chunks 16 + 16 + 8.
static void test_m2_gradcheck(void **st) {
    fix_t f;
    fix_init(&f);
    loss_t L = {.f = &f, .B = 2, .T = 40};
    int64_t n = (int64_t)L.B * L.T * f.a.d;
    L.x = buf(n, 21), L.out = buf(n, 0), L.R = buf(n, 22);
    assert_int_equal(check_grads(&f, &L, "m2"), 0);
    // A forward without sv releases its temporaries: nothing stays in the arena.
    tu_ctx_reset(&f.c);
    size_t before = arena_mark(f.c.arena);
    assert_int_equal(m2_forward(&f.c, &f.w, L.out, L.x, L.B, L.T, 0, NULL, NULL), 0);
    assert_int_equal(arena_mark(f.c.arena), before);
    free(L.x), free(L.out), free(L.R);
    fix_free(&f);
}

// Training through a carried cache (e.g. a long sequence in pieces): after a
// 13-token prefill, the gradient of a 27-token forward that starts from the
// cached conv and SSM states (held fixed).
static void test_m2_gradcheck_cached(void **st) {
    fix_t f;
    fix_init(&f);
    int B = 2, T0 = 13;
    cache_t cache, snap;
    cache_init(&cache, &f.a, B), cache_init(&snap, &f.a, B);
    float *x0 = buf((int64_t)B * T0 * f.a.d, 31), *out0 = buf((int64_t)B * T0 * f.a.d, 0);
    assert_int_equal(m2_forward(&f.c, &f.w, out0, x0, B, T0, 0, &cache.lc, NULL), 0);
    cache.lc.len = T0;
    cache_copy(&snap, &cache);
    loss_t L = {.f = &f, .B = B, .T = 27, .cache = &cache, .snap = &snap};
    int64_t n = (int64_t)L.B * L.T * f.a.d;
    L.x = buf(n, 32), L.out = buf(n, 0), L.R = buf(n, 33);
    assert_int_equal(check_grads(&f, &L, "m2 cached"), 0);
    free(L.x), free(L.out), free(L.R), free(x0), free(out0);
    cache_free(&cache), cache_free(&snap);
    fix_free(&f);
}

// ---- reference forward ------------------------------------------------------------

// The layer written token by token from hybrid_model.md §6.1, in double: split
// z | x | B | C | dt, causal conv + SiLU over x | B | C, repeat x and B to the H
// heads consecutively, the recurrence, per-head gated RMSNorm, out_proj.
// Gradient checks cannot see a consistently wrong layout; this can.
static void naive_forward(const fix_t *f, double *out, const float *x, int B, int T) {
    const arch_t *a = &f->a;
    const m2_dims_t *m = &a->m2;
    int d = a->d, di = m->d_inner, dxb = m->d_xb, H = m->n_heads, P = m->headdim, Ns = m->d_state, W = m->conv;
    int cd = di + 2 * dxb, din = 2 * di + 2 * dxb + H, rep = H / (dxb / P);
    const float *Win = f->w.in_proj, *cw = f->w.conv_w, *cb = f->w.conv_b, *dtb = f->w.dt_bias;
    const float *Alog = f->w.A_log, *Dp = f->w.D, *nw = f->w.norm, *Wout = f->w.out_proj;
    double *zx = calloc((size_t)T * din, sizeof(double)), *S = calloc((size_t)H * P * Ns, sizeof(double));
    double *xbc = malloc((size_t)cd * sizeof(double)), *y = malloc((size_t)di * sizeof(double));
    for (int b = 0; b < B; b++) {
        memset(S, 0, (size_t)H * P * Ns * sizeof(double));
        for (int t = 0; t < T; t++) // in_proj
            for (int r = 0; r < din; r++) {
                double s = 0;
                for (int i = 0; i < d; i++)
                    s += (double)Win[(int64_t)r * d + i] * x[((int64_t)b * T + t) * d + i];
                zx[(int64_t)t * din + r] = s;
            }
        for (int t = 0; t < T; t++) {
            const double *z = zx + (int64_t)t * din, *dtr = z + di + cd;
            for (int ch = 0; ch < cd; ch++) { // conv over the pre-conv x | B | C columns, zero before t = 0
                double s = cb[ch];
                for (int i = 0; i < W; i++) {
                    int tt = t - W + 1 + i;
                    if (tt >= 0) s += (double)cw[ch * W + i] * zx[(int64_t)tt * din + di + ch];
                }
                xbc[ch] = s / (1 + exp(-s));
            }
            const double *xv = xbc, *Bv = xbc + dxb, *Cv = xbc + 2 * dxb;
            for (int h = 0; h < H; h++) {
                int g = h / rep; // x head and B group of head h
                double v = dtr[h] + dtb[h], dt = v > 20 ? v : log1p(exp(v)), A = -exp((double)Alog[h]);
                double *Sh = S + (int64_t)h * P * Ns;
                for (int p = 0; p < P; p++) {
                    double o = 0;
                    for (int n = 0; n < Ns; n++) {
                        Sh[p * Ns + n] = exp(dt * A) * Sh[p * Ns + n] + dt * xv[g * P + p] * Bv[g * Ns + n];
                        o += Sh[p * Ns + n] * Cv[h * Ns + n];
                    }
                    y[h * P + p] = o + Dp[h] * xv[g * P + p];
                }
            }
            for (int h = 0; h < H; h++) { // gate, then RMSNorm over each head's P channels
                double ss = 0;
                for (int p = 0; p < P; p++) {
                    double zz = z[h * P + p];
                    y[h * P + p] *= zz / (1 + exp(-zz));
                    ss += y[h * P + p] * y[h * P + p];
                }
                double r = 1 / sqrt(ss / P + m->norm_eps);
                for (int p = 0; p < P; p++)
                    y[h * P + p] *= r * nw[h * P + p];
            }
            for (int o = 0; o < d; o++) { // out_proj
                double s = 0;
                for (int i = 0; i < di; i++)
                    s += (double)Wout[(int64_t)o * di + i] * y[i];
                out[((int64_t)b * T + t) * d + o] = s;
            }
        }
    }
    free(zx), free(S), free(xbc), free(y);
}

// fp32 layer vs the double reference: rounding only (~1e-7 relative measured);
// a wrong split, channel order or head map gives O(1).
static void test_m2_reference(void **st) {
    fix_t f;
    fix_init(&f);
    int B = 2, T = 40;
    int64_t n = (int64_t)B * T * f.a.d;
    float *x = buf(n, 61), *out = buf(n, 0), *refd = buf(n, 0);
    double *ref = calloc((size_t)n, sizeof(double));
    assert_int_equal(m2_forward(&f.c, &f.w, out, x, B, T, 0, NULL, NULL), 0);
    naive_forward(&f, ref, x, B, T);
    for (int64_t i = 0; i < n; i++)
        refd[i] = (float)ref[i];
    double e = tu_rel_err(out, refd, n);
    printf("  layer vs naive double reference: rel err %.2e\n", e);
    assert_true(e < 1e-5);
    free(x), free(out), free(refd), free(ref);
    fix_free(&f);
}

// ---- inference consistency -----------------------------------------------------

// Chunked and recurrent SSD, one forward and pieces all sum the same terms in
// different fp32 orders: measured differences are ~1e-7 relative; 1e-5 leaves
// a margin while a lost state (conv or SSM) changes outputs by O(1).
#define TOL_DECODE 1e-5

// Prefill 25 tokens with a cache, then 20 decode steps == one forward over 45.
static void test_m2_decode(void **st) {
    fix_t f;
    fix_init(&f);
    int B = 2, T = 45, T0 = 25, d = f.a.d;
    float *x = buf((int64_t)B * T * d, 41), *ref = buf((int64_t)B * T * d, 0), *y = buf((int64_t)B * T * d, 0);
    float *xp = buf((int64_t)B * T * d, 0), *yp = buf((int64_t)B * T * d, 0);
    assert_int_equal(m2_forward(&f.c, &f.w, ref, x, B, T, 0, NULL, NULL), 0);
    cache_t cache;
    cache_init(&cache, &f.a, B);
    // len 0 starts fresh whatever the buffers hold (a reused slot)
    for (int64_t i = 0; i < cache.n_state; i++)
        cache.lc.u.m2.state[i] = 7.0f;
    for (int64_t i = 0; i < cache.n_conv; i++)
        ((float *)cache.lc.u.m2.conv)[i] = -3.0f;
    tu_rows_gather(xp, x, B, T, 0, T0, d);
    assert_int_equal(m2_forward(&f.c, &f.w, yp, xp, B, T0, 0, &cache.lc, NULL), 0);
    tu_rows_scatter(y, yp, B, T, 0, T0, d);
    cache.lc.len = T0;
    for (int t = T0; t < T; t++) {
        tu_rows_gather(xp, x, B, T, t, 1, d);
        step_run_t run = {&cache.lc, 0, B, 1, cache.lc.len};
        assert_int_equal(m2_step(&f.c, &f.w, &(lin_out_t){.y = yp}, xp, 1, &run), 0);
        tu_rows_scatter(y, yp, B, T, t, 1, d);
        cache.lc.len++;
    }
    double e = tu_rel_err(y, ref, (int64_t)B * T * d), e_steps = 0;
    { // the decoded part alone (the prefill part is the same chunked math)
        int64_t n = (int64_t)(T - T0) * d;
        float *a = buf((int64_t)B * n, 0), *r = buf((int64_t)B * n, 0);
        tu_rows_gather(a, y, B, T, T0, T - T0, d), tu_rows_gather(r, ref, B, T, T0, T - T0, d);
        e_steps = tu_rel_err(a, r, (int64_t)B * n);
        free(a), free(r);
    }
    printf("  prefill 25 + 20 steps vs one forward: rel err %.2e (steps only %.2e)\n", e, e_steps);
    assert_true(e < TOL_DECODE && e_steps < TOL_DECODE);
    free(x), free(ref), free(y), free(xp), free(yp);
    cache_free(&cache);
    fix_free(&f);
}

// Prefill in pieces (a single token, pieces shorter than the conv width, pieces
// crossing chunk boundaries) == one forward.
static void test_m2_prefill_pieces(void **st) {
    fix_t f;
    fix_init(&f);
    int B = 2, T = 45, d = f.a.d;
    static const int pieces[] = {7, 16, 1, 2, 19};
    float *x = buf((int64_t)B * T * d, 51), *ref = buf((int64_t)B * T * d, 0), *y = buf((int64_t)B * T * d, 0);
    float *xp = buf((int64_t)B * T * d, 0), *yp = buf((int64_t)B * T * d, 0);
    assert_int_equal(m2_forward(&f.c, &f.w, ref, x, B, T, 0, NULL, NULL), 0);
    cache_t cache;
    cache_init(&cache, &f.a, B);
    for (int i = 0, t0 = 0; i < 5; t0 += pieces[i++]) {
        tu_rows_gather(xp, x, B, T, t0, pieces[i], d);
        assert_int_equal(m2_forward(&f.c, &f.w, yp, xp, B, pieces[i], t0, &cache.lc, NULL), 0);
        tu_rows_scatter(y, yp, B, T, t0, pieces[i], d);
        cache.lc.len += pieces[i];
    }
    double e = tu_rel_err(y, ref, (int64_t)B * T * d);
    printf("  prefill in pieces 7+16+1+2+19 vs one forward: rel err %.2e\n", e);
    assert_true(e < TOL_DECODE);
    free(x), free(ref), free(y), free(xp), free(yp);
    cache_free(&cache);
    fix_free(&f);
}

// d_state != headdim: the SSD's B groups (d_xb / d_state) and C groups
// (d_inner / d_state) must each serve a whole share of the heads, which
// arch_validate checks (the layer used to check it on every call).
static void test_m2_arch_groups(void **st) {
    arch_t a;
    arch_init(&a);
    a.d = 32, a.n_layers = 1, a.H = 4, a.Hkv = 2, a.dh = 8, a.ffn = 8, a.V = 16;
    a.kind[0] = LAYER_M2;
    a.m2 = (m2_dims_t){.d_inner = 32,
                       .d_xb = 16,
                       .n_heads = 4,
                       .headdim = 8,
                       .d_state = 16,
                       .conv = 4,
                       .chunk = 16,
                       .norm_eps = 1e-5f};
    assert_int_equal(arch_validate(&a, "test"), 0); // 1 B group, 2 C groups of 4 heads
    a.m2.d_state = 4;                               // 8 C groups for 4 heads
    assert_int_equal(arch_validate(&a, "test"), ERR_INPUT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_m2_gradcheck),      cmocka_unit_test(test_m2_gradcheck_cached),
        cmocka_unit_test(test_m2_reference),      cmocka_unit_test(test_m2_decode),
        cmocka_unit_test(test_m2_prefill_pieces), cmocka_unit_test(test_m2_arch_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
