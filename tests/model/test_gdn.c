// Gated DeltaNet layer (model/gdn.c): finite-difference gradient check of the
// whole forward for the input and every parameter, and inference consistency:
// prefill + decode steps, and prefill in pieces, against one forward.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gdn.h"
#include "model/linear.h"
#include "testutil.h"

typedef struct {
    arch_t a;
    ptable_t pt;
    layer_ctx_t c;
    float *wflat, *gflat;
    gdn_w_t w, g;
    int B, T;
} layer_fix;

static void fix_init(layer_fix *f, int H, int HV, int use_gate, int allow_neg, int B, int T) {
    memset(f, 0, sizeof *f);
    arch_init(&f->a);
    f->a.d = 32, f->a.n_layers = 1, f->a.V = 16, f->a.ffn = 8, f->a.H = 2, f->a.Hkv = 2;
    f->a.kind[0] = LAYER_GDN;
    f->a.gdn = (gdn_dims_t){.n_heads = H,
                            .n_v_heads = HV,
                            .head_k = 16,
                            .head_v = 24, // non-square state (Dv != K)
                            .conv = 4,
                            .use_gate = use_gate,
                            .allow_neg_eigval = allow_neg,
                            .norm_eps = 1e-6f};
    assert_int_equal(ptable_build(&f->pt, &f->a), 0);
    // weights N(0, 0.2^2): with d = 32 the projections are O(1)
    f->wflat = tu_params(&f->pt, 7, 0.2f);
    f->gflat = calloc((size_t)f->pt.total, sizeof(float));
    assert_int_equal(gdn_w_bind(&f->w, &f->pt, f->wflat, sizeof(float), 0), 0);
    assert_int_equal(gdn_w_bind(&f->g, &f->pt, f->gflat, sizeof(float), 0), 0);
    assert_true(use_gate ? f->w.g_proj != NULL : f->w.g_proj == NULL);
    // decays as after FLA's init (slow to fast): A = e^{A_log} in [0.37, 2.7],
    // softplus(dt_bias) in [0.05, 0.3] -> per-token log decays -0.02 .. -0.8
    tu_randu(f->w.A_log, HV, 8, -1.0f, 1.0f);
    tu_randu(f->w.dt_bias, HV, 9, -3.0f, -1.0f);
    tu_ctx(&f->c, &f->a, 0);
    f->B = B, f->T = T;
}

static void fix_free(layer_fix *f) {
    tu_ctx_free(&f->c);
    ptable_free(&f->pt);
    free(f->wflat), free(f->gflat);
}

// A zeroed cache for B sequences (what the model allocates for a new batch).
static void cache_init(layer_cache_t *cache, const arch_t *a, int B) {
    const gdn_dims_t *g = &a->gdn;
    int64_t kd = (int64_t)g->n_heads * g->head_k, vd = (int64_t)g->n_v_heads * g->head_v;
    memset(cache, 0, sizeof *cache);
    cache->B = B, cache->cap = 1 << 20;
    cache->u.gdn.state = calloc((size_t)B * g->n_v_heads * g->head_v * g->head_k, sizeof(float));
    cache->u.gdn.conv_q = calloc((size_t)B * kd * g->conv, sizeof(float));
    cache->u.gdn.conv_k = calloc((size_t)B * kd * g->conv, sizeof(float));
    cache->u.gdn.conv_v = calloc((size_t)B * vd * g->conv, sizeof(float));
}

static int64_t cache_sizes(const arch_t *a, int B, int64_t n[4]) {
    const gdn_dims_t *g = &a->gdn;
    n[0] = (int64_t)B * g->n_v_heads * g->head_v * g->head_k;
    n[1] = n[2] = (int64_t)B * g->n_heads * g->head_k * g->conv;
    n[3] = (int64_t)B * g->n_v_heads * g->head_v * g->conv;
    return n[0] + n[1] + n[2] + n[3];
}

static void cache_bufs(layer_cache_t *cache, float *p[4]) {
    p[0] = cache->u.gdn.state, p[1] = cache->u.gdn.conv_q, p[2] = cache->u.gdn.conv_k, p[3] = cache->u.gdn.conv_v;
}

static void cache_copy(layer_cache_t *dst, layer_cache_t *src, const arch_t *a) {
    int64_t n[4];
    cache_sizes(a, src->B, n);
    float *s[4], *d[4];
    cache_bufs(src, s);
    cache_bufs(dst, d);
    for (int i = 0; i < 4; i++)
        memcpy(d[i], s[i], (size_t)n[i] * sizeof(float));
}

static void cache_free(layer_cache_t *cache) {
    free(cache->u.gdn.state), free(cache->u.gdn.conv_q), free(cache->u.gdn.conv_k), free(cache->u.gdn.conv_v);
}

// ---------------------------------------------------------------------------
// Gradient check of the whole layer
// ---------------------------------------------------------------------------

typedef struct {
    layer_fix *f;
    float *x, *out, *R;
    layer_cache_t *cache, *cache0; // optional: forward from a nonzero past (restored before every call)
} loss_ctx;

static double layer_loss(void *ctx, double *l1) {
    loss_ctx *l = ctx;
    layer_fix *f = l->f;
    size_t mark = arena_mark(f->c.arena);
    if (l->cache) cache_copy(l->cache, l->cache0, &f->a);
    assert_int_equal(gdn_forward(&f->c, &f->w, l->out, l->x, f->B, f->T, 0, l->cache, NULL), 0);
    arena_reset(f->c.arena, mark);
    return tu_dot_l1(l->out, l->R, (int64_t)f->B * f->T * f->a.d, l1);
}

static void gradcheck_case(int H, int HV, int use_gate, int allow_neg, int with_cache) {
    layer_fix f;
    fix_init(&f, H, HV, use_gate, allow_neg, 2, 70); // T = 70: two chunks, the second short
    int64_t nx = (int64_t)f.B * f.T * f.a.d;
    loss_ctx l = {.f = &f,
                  .x = malloc((size_t)nx * sizeof(float)),
                  .out = malloc((size_t)nx * sizeof(float)),
                  .R = malloc((size_t)nx * sizeof(float))};
    tu_randn(l.x, nx, 11, 1.0f);
    tu_randn(l.R, nx, 12, 1.0f);
    layer_cache_t cache, cache0;
    if (with_cache) { // a nonzero past: random recurrent and conv states
        cache_init(&cache, &f.a, f.B);
        cache_init(&cache0, &f.a, f.B);
        int64_t n[4];
        cache_sizes(&f.a, f.B, n);
        float *p[4];
        cache_bufs(&cache0, p);
        for (int i = 0; i < 4; i++)
            tu_randn(p[i], n[i], 20 + i, i == 0 ? 0.3f : 1.0f);
        l.cache = &cache, l.cache0 = &cache0;
        cache_copy(&cache, &cache0, &f.a);
    }
    gdn_saved_t sv;
    float *dx = malloc((size_t)nx * sizeof(float));
    assert_int_equal(gdn_forward(&f.c, &f.w, l.out, l.x, f.B, f.T, 0, l.cache, &sv), 0);
    assert_int_equal(gdn_backward(&f.c, &f.w, &f.g, dx, l.R, &sv), 0);
    tu_ctx_reset(&f.c);
    // fp32 everywhere. Step eps = 3e-3 (smaller than the op tests' 1e-2): the
    // output RMSNorm over Dv amplifies small rule outputs (early tokens, where
    // o ~ (q . k) v can be near 0) by up to 1/sqrt(norm_eps), which gives the
    // loss a large curvature in a few directions; at eps 1e-2 the central
    // difference of a q_conv weight was measured 4% off the converged value,
    // at 3e-3 0.5%, with the FD sequence converging to the analytic gradient.
    // Rounding is covered by tu_gradcheck's noise term (~0.4 here, against
    // gradient elements of 10..200); tol 1e-2. A wrong or missing term gives
    // O(1) relative errors.
    const float eps = 3e-3f, tol = 1e-2f;
    int fails = tu_gradcheck("gdn dx", layer_loss, &l, l.x, dx, nx, eps, tol, 24);
    int nparams = 0;
    for (int i = 0; i < f.pt.n; i++) { // every parameter of the layer, by name
        const param_t *p = &f.pt.p[i];
        if (p->layer != 0 || !strstr(p->name, ".gdn.")) continue;
        nparams++;
        fails += tu_gradcheck(p->name, layer_loss, &l, f.wflat + p->off, f.gflat + p->off, p->numel, eps, tol, 16);
    }
    assert_int_equal(nparams, use_gate ? 13 : 12);
    assert_int_equal(fails, 0);
    if (with_cache) cache_free(&cache), cache_free(&cache0);
    free(l.x), free(l.out), free(l.R), free(dx);
    fix_free(&f);
}

static void test_gradcheck(void **st) { gradcheck_case(2, 2, 1, 0, 0); }
// GVA (2 value heads per q/k head), no output gate (plain RMSNorm), beta up to 2
static void test_gradcheck_gva_nogate(void **st) { gradcheck_case(2, 4, 0, 1, 0); }
// forward from a nonzero cache (initial recurrent and conv states) with saved activations
static void test_gradcheck_from_cache(void **st) { gradcheck_case(2, 2, 1, 0, 1); }

// ---------------------------------------------------------------------------
// Inference: decode steps and prefill in pieces equal one forward
// ---------------------------------------------------------------------------

// The chunked rule vs the recurrence and chunk boundaries in other places:
// fp32 rounding in different orders only (measured ~1e-7 .. 1e-6 relative
// at the op level); 1e-5 still catches any state or conv-cache mistake, which
// changes outputs at O(1e-2) or more.
#define INFER_TOL 1e-5

static double cache_rel_err(layer_cache_t *a, layer_cache_t *b, const arch_t *ar) {
    int64_t n[4];
    cache_sizes(ar, a->B, n);
    float *pa[4], *pb[4];
    cache_bufs(a, pa);
    cache_bufs(b, pb);
    double e = 0;
    for (int i = 0; i < 4; i++)
        e = fmax(e, tu_rel_err(pa[i], pb[i], n[i]));
    return e;
}

static void test_decode(void **st) {
    layer_fix f;
    int B = 2, Tp = 50, Ts = 30, T = Tp + Ts, d = 32;
    fix_init(&f, 2, 2, 1, 0, B, T);
    float *x = malloc((size_t)B * T * d * sizeof(float)), *ref = malloc((size_t)B * T * d * sizeof(float));
    float *got = malloc((size_t)B * T * d * sizeof(float)), *xp = malloc((size_t)B * Tp * d * sizeof(float));
    float *op = malloc((size_t)B * Tp * d * sizeof(float));
    tu_randn(x, (int64_t)B * T * d, 31, 1.0f);
    // the steps below multiply by q, k, v, a, b and g in one product: they
    // lie one after another in the parameter table's buffer
    const void *ws[6] = {f.w.q_proj, f.w.k_proj, f.w.v_proj, f.w.a_proj, f.w.b_proj, f.w.g_proj};
    const int64_t outs[6] = {32, 32, 48, 2, 2, 48};
    assert_true(lin_adjacent(&f.c, ws, outs, 6, d));
    assert_false(lin_adjacent(&f.c, ws + 1, outs, 5, d)); // sizes shifted by one (v taken as 32 rows): a gap
    layer_cache_t cache, cref;
    cache_init(&cache, &f.a, B);
    cache_init(&cref, &f.a, B);
    // reference: one forward over all 80 tokens (with a cache, to get its final state too)
    assert_int_equal(gdn_forward(&f.c, &f.w, ref, x, B, T, 0, &cref, NULL), 0);
    tu_ctx_reset(&f.c);
    // prefill 50 tokens, then 30 decode steps
    tu_rows_gather(xp, x, B, T, 0, Tp, d);
    assert_int_equal(gdn_forward(&f.c, &f.w, op, xp, B, Tp, 0, &cache, NULL), 0);
    tu_rows_scatter(got, op, B, T, 0, Tp, d);
    tu_ctx_reset(&f.c);
    for (int t = Tp; t < T; t++) {
        float xt[2 * 32], ot[2 * 32];
        tu_rows_gather(xt, x, B, T, t, 1, d);
        step_run_t run = {&cache, 0, B, 1, cache.len}; // one run: the cache's B sequences in lockstep
        assert_int_equal(gdn_step(&f.c, &f.w, &(lin_out_t){.y = ot}, xt, NULL, 1, &run), 0);
        tu_rows_scatter(got, ot, B, T, t, 1, d);
        tu_ctx_reset(&f.c);
    }
    double e = tu_rel_err(got, ref, (int64_t)B * T * d), es = cache_rel_err(&cache, &cref, &f.a);
    printf("  prefill 50 + 30 steps vs one forward: output rel err %.3e, cache rel err %.3e\n", e, es);
    assert_true(e < INFER_TOL);
    assert_true(es < INFER_TOL);
    cache_free(&cache), cache_free(&cref);
    free(x), free(ref), free(got), free(xp), free(op);
    fix_free(&f);
}

static void test_prefill_pieces(void **st) {
    layer_fix f;
    int B = 2, T = 110, d = 32, pieces[3] = {37, 64, 9};
    fix_init(&f, 2, 4, 1, 0, B, T);
    float *x = malloc((size_t)B * T * d * sizeof(float)), *ref = malloc((size_t)B * T * d * sizeof(float));
    float *got = malloc((size_t)B * T * d * sizeof(float)), *xs = malloc((size_t)B * T * d * sizeof(float));
    float *os = malloc((size_t)B * T * d * sizeof(float));
    tu_randn(x, (int64_t)B * T * d, 41, 1.0f);
    // reference without a cache (training path), and with one for the final state
    layer_cache_t cache, cref;
    cache_init(&cache, &f.a, B);
    cache_init(&cref, &f.a, B);
    assert_int_equal(gdn_forward(&f.c, &f.w, ref, x, B, T, 0, NULL, NULL), 0);
    tu_ctx_reset(&f.c);
    assert_int_equal(gdn_forward(&f.c, &f.w, got, x, B, T, 0, &cref, NULL), 0);
    tu_ctx_reset(&f.c);
    assert_true(tu_max_abs_diff(got, ref, (int64_t)B * T * d) == 0); // a zeroed cache is no cache
    int t0 = 0;
    for (int p = 0; p < 3; p++) {
        int n = pieces[p];
        tu_rows_gather(xs, x, B, T, t0, n, d);
        assert_int_equal(gdn_forward(&f.c, &f.w, os, xs, B, n, t0, &cache, NULL), 0);
        tu_rows_scatter(got, os, B, T, t0, n, d);
        tu_ctx_reset(&f.c);
        t0 += n;
    }
    double e = tu_rel_err(got, ref, (int64_t)B * T * d), es = cache_rel_err(&cache, &cref, &f.a);
    printf("  prefill 37 + 64 + 9 vs one forward: output rel err %.3e, cache rel err %.3e\n", e, es);
    assert_true(e < INFER_TOL);
    assert_true(es < INFER_TOL);
    cache_free(&cache), cache_free(&cref);
    free(x), free(ref), free(got), free(xs), free(os);
    fix_free(&f);
}

int main(void) {
    // Toy sizes: every op's parallel region costs more than its work, and
    // ~20x more when the cores are shared with other jobs (measured 2.7 s on
    // one thread vs 50 s on two busy cores). One thread (set before the
    // backend, so OpenBLAS gets one too); the threaded paths of the GDN ops
    // are exercised by tests/backend/test_gdn_ops.
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_gradcheck_gva_nogate),
        cmocka_unit_test(test_gradcheck_from_cache),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_prefill_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
