// Gated DeltaNet ops of the CPU backend: gate forward/backward, the naive
// recurrent backward (finite differences), and the chunked algorithm against
// the token-by-token recurrence, forward and backward.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_gdn.h"
#include "testutil.h"

static float *buf(int64_t n, uint64_t seed, float std) {
    float *p = malloc((size_t)n * sizeof(float));
    tu_randn(p, n, seed, std);
    return p;
}
static float *zeros(int64_t n) { return calloc((size_t)n, sizeof(float)); }
static float *copy(const float *x, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

// rows of length dim scaled to unit norm, as the layer's l2norm produces them
static void unit_rows(float *x, int64_t rows, int dim) {
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int i = 0; i < dim; i++)
            s += (double)x[r * dim + i] * x[r * dim + i];
        for (int i = 0; i < dim; i++)
            x[r * dim + i] = (float)(x[r * dim + i] / sqrt(s));
    }
}

// ---------------------------------------------------------------------------
// Gates
// ---------------------------------------------------------------------------

typedef struct {
    be_t *be;
    float *a, *b, *A_log, *dt_bias, *g, *beta, *Rg, *Rb;
    int64_t N, lda, ldb;
    int HV, allow_neg;
} gate_ctx;

static double gate_loss(void *ctx, double *l1) {
    gate_ctx *c = ctx;
    c->be->gdn_gate_fwd(c->be, c->g, c->beta, c->a, c->lda, c->b, c->ldb, c->A_log, c->dt_bias, c->N, c->HV,
                        c->allow_neg);
    double l1g, l1b;
    double s = tu_dot_l1(c->g, c->Rg, c->N * c->HV, &l1g) + tu_dot_l1(c->beta, c->Rb, c->N * c->HV, &l1b);
    if (l1) *l1 = l1g + l1b;
    return s;
}

static void gate_case(int allow_neg) {
    // a, b are column slices of wider rows (strides 5 and 4 > HV = 3), as in
    // the layer where they would be slices of a projection output.
    gate_ctx c = {.be = tu_cpu(), .N = 9, .HV = 3, .lda = 5, .ldb = 4, .allow_neg = allow_neg};
    int64_t n = c.N * c.HV;
    c.a = buf(c.N * c.lda, 1, 2.0f), c.b = buf(c.N * c.ldb, 2, 2.0f);
    c.A_log = buf(c.HV, 3, 0.5f), c.dt_bias = buf(c.HV, 4, 1.0f);
    c.a[2 * c.lda + 1] = 25.0f; // softplus identity branch (a + dt_bias > 20, far from the switch)
    c.g = zeros(n), c.beta = zeros(n), c.Rg = buf(n, 5, 1.0f), c.Rb = buf(n, 6, 1.0f);
    gate_loss(&c, NULL);
    // forward against the formula in double
    for (int64_t r = 0; r < c.N; r++)
        for (int h = 0; h < c.HV; h++) {
            double x = (double)c.a[r * c.lda + h] + c.dt_bias[h];
            double sp = x > 20 ? x : log1p(exp(x));
            double g = -exp((double)c.A_log[h]) * sp;
            double be = (allow_neg ? 2.0 : 1.0) / (1.0 + exp(-(double)c.b[r * c.ldb + h]));
            // fp32 evaluation of exp / log1p: a few ulps
            assert_true(fabs(c.g[r * c.HV + h] - g) <= 1e-5 * fabs(g) + 1e-7);
            assert_true(fabs(c.beta[r * c.HV + h] - be) <= 1e-6);
        }
    float *da = zeros(c.N * c.lda), *db = zeros(c.N * c.ldb);
    float *dA = zeros(c.HV), *ddt = zeros(c.HV);
    c.be->gdn_gate_bwd(c.be, da, c.lda, db, c.ldb, dA, ddt, c.Rg, c.Rb, c.a, c.lda, c.b, c.ldb, c.A_log, c.dt_bias, c.N,
                       c.HV, c.allow_neg);
    // eps 1e-2 on O(1) inputs: central-difference truncation ~1e-4 relative,
    // fp32 rounding handled by tu_gradcheck's noise term; tol 1e-2. The padding
    // columns of a and b must get exactly 0 (they do not enter the loss).
    assert_int_equal(tu_gradcheck("gate da", gate_loss, &c, c.a, da, c.N * c.lda, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("gate db", gate_loss, &c, c.b, db, c.N * c.ldb, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("gate dA_log", gate_loss, &c, c.A_log, dA, c.HV, 1e-2f, 1e-2f, 10), 0);
    assert_int_equal(tu_gradcheck("gate ddt_bias", gate_loss, &c, c.dt_bias, ddt, c.HV, 1e-2f, 1e-2f, 10), 0);
    // dA_log and ddt_bias accumulate (+=): a second call doubles them
    float *dA1 = copy(dA, c.HV);
    c.be->gdn_gate_bwd(c.be, da, c.lda, db, c.ldb, dA, ddt, c.Rg, c.Rb, c.a, c.lda, c.b, c.ldb, c.A_log, c.dt_bias, c.N,
                       c.HV, c.allow_neg);
    for (int h = 0; h < c.HV; h++)
        assert_float_equal(dA[h], 2 * dA1[h], 1e-5 * fabs(dA1[h]) + 1e-7);
    free(c.a), free(c.b), free(c.A_log), free(c.dt_bias), free(c.g), free(c.beta), free(c.Rg), free(c.Rb);
    free(da), free(db), free(dA), free(ddt), free(dA1);
}
static void test_gate(void **st) { gate_case(0); }
static void test_gate_neg_eigval(void **st) { gate_case(1); }

// ---------------------------------------------------------------------------
// Random inputs of the rule
// ---------------------------------------------------------------------------

typedef struct {
    int B, T, H, HV, K, Dv;
    float scale;
    float *q, *k, *v, *g, *beta, *state0, *dout, *dstate_final;
} rule_in;

static void rule_make(rule_in *r, int B, int T, int H, int HV, int K, int Dv, uint64_t seed, float beta_max) {
    r->B = B, r->T = T, r->H = H, r->HV = HV, r->K = K, r->Dv = Dv;
    r->scale = 1.0f / sqrtf((float)K);
    int64_t nq = (int64_t)B * T * H * K, nv = (int64_t)B * T * HV * Dv, ng = (int64_t)B * T * HV;
    int64_t ns = (int64_t)B * HV * Dv * K;
    r->q = buf(nq, seed + 1, 1.0f), r->k = buf(nq, seed + 2, 1.0f), r->v = buf(nv, seed + 3, 1.0f);
    unit_rows(r->q, (int64_t)B * T * H, K);
    unit_rows(r->k, (int64_t)B * T * H, K);
    // log decays from -0.0025 (slow) to -2.7 (fast): chunk-local cumsums reach
    // far below -20, so the e^{G} factors span many orders of magnitude
    r->g = malloc((size_t)ng * sizeof(float));
    tu_randu(r->g, ng, seed + 4, -6.0f, 1.0f);
    for (int64_t i = 0; i < ng; i++)
        r->g[i] = -expf(r->g[i]);
    r->beta = malloc((size_t)ng * sizeof(float));
    tu_randu(r->beta, ng, seed + 5, 0.02f, beta_max);
    r->state0 = buf(ns, seed + 6, 0.5f);
    r->dout = buf(nv, seed + 7, 1.0f);
    r->dstate_final = buf(ns, seed + 8, 0.5f);
}

static void rule_free(rule_in *r) {
    free(r->q), free(r->k), free(r->v), free(r->g), free(r->beta), free(r->state0), free(r->dout);
    free(r->dstate_final);
}

// ---------------------------------------------------------------------------
// Naive recurrent backward against finite differences
// ---------------------------------------------------------------------------

typedef struct {
    be_t *be;
    rule_in *r;
    float *o, *S, *R, *Rs;
} rec_ctx;

// loss = sum(o * R) + sum(S_final * Rs): exercises dstate_final
static double rec_loss(void *ctx, double *l1) {
    rec_ctx *c = ctx;
    rule_in *r = c->r;
    int64_t nv = (int64_t)r->B * r->T * r->HV * r->Dv, ns = (int64_t)r->B * r->HV * r->Dv * r->K;
    memcpy(c->S, r->state0, (size_t)ns * sizeof(float));
    c->be->gdn_recurrent_fwd(c->be, c->o, c->S, r->q, r->k, r->v, r->g, r->beta, r->scale, r->B, r->T, r->H, r->HV,
                             r->K, r->Dv);
    double a1, a2;
    double s = tu_dot_l1(c->o, c->R, nv, &a1) + tu_dot_l1(c->S, c->Rs, ns, &a2);
    if (l1) *l1 = a1 + a2;
    return s;
}

static void test_recurrent_bwd_fd(void **st) {
    rule_in r;
    rule_make(&r, 2, 9, 2, 4, 8, 6, 100, 1.9f); // GVA (2 value heads per q/k head), beta up to 1.9 (allow_neg)
    int64_t nq = (int64_t)r.B * r.T * r.H * r.K, nv = (int64_t)r.B * r.T * r.HV * r.Dv, ng = (int64_t)r.B * r.T * r.HV;
    int64_t ns = (int64_t)r.B * r.HV * r.Dv * r.K;
    rec_ctx c = {.be = tu_cpu(), .r = &r, .o = zeros(nv), .S = zeros(ns), .R = r.dout, .Rs = r.dstate_final};
    float *dq = zeros(nq), *dk = zeros(nq), *dv = zeros(nv), *dg = zeros(ng), *db = zeros(ng), *ds0 = zeros(ns);
    assert_int_equal(cpu_gdn_recurrent_bwd(dq, dk, dv, dg, db, ds0, r.dout, r.dstate_final, r.q, r.k, r.v, r.g, r.beta,
                                           r.state0, r.scale, r.B, r.T, r.H, r.HV, r.K, r.Dv),
                     0);
    // eps 1e-2 on inputs of size O(0.3..1): truncation O(eps^2) ~1e-4
    // relative, rounding covered by the noise term; tol 1e-2 (a wrong term
    // gives O(1) relative errors).
    assert_int_equal(tu_gradcheck("rec dq", rec_loss, &c, r.q, dq, nq, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("rec dk", rec_loss, &c, r.k, dk, nq, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("rec dv", rec_loss, &c, r.v, dv, nv, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("rec dg", rec_loss, &c, r.g, dg, ng, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("rec dbeta", rec_loss, &c, r.beta, db, ng, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("rec dstate0", rec_loss, &c, r.state0, ds0, ns, 1e-2f, 1e-2f, 60), 0);
    free(c.o), free(c.S), free(dq), free(dk), free(dv), free(dg), free(db), free(ds0);
    rule_free(&r);
}

// ---------------------------------------------------------------------------
// Chunked == recurrent, forward and backward
// ---------------------------------------------------------------------------

// Both sides are fp32 with different summation orders (the chunked form
// solves a 64x64 triangular system and applies the state once per chunk, the
// recurrence applies T rank-1 updates). Measured relative L2 errors are ~1e-6
// (see the printout); 1e-4 leaves a wide margin for other compilers / BLAS-free
// vectorisation while any algebra mistake (a missing term, a wrong decay
// factor) shows up as 1e-3 .. 1.
#define RULE_TOL 1e-4

static double worst;

static void check(const char *what, const float *a, const float *ref, int64_t n, int T, int HV, int init) {
    double e;
    if (tu_dot(ref, ref, n) == 0) {
        // An exactly zero reference (dg at T = 1 without an initial state:
        // nothing is decayed) is judged in absolute terms: the chunked dG is a
        // difference of O(1) dot products (q . dq - k . dk) that cancel to fp32
        // rounding (measured 4e-7).
        e = tu_max_abs_diff(a, ref, n);
        assert_true(e < 1e-5);
    } else {
        e = tu_rel_err(a, ref, n);
        if (e > worst) worst = e;
    }
    if (getenv("GDN_VERBOSE") || e >= RULE_TOL) printf("  %s: T %d HV %d init %d: err %.3e\n", what, T, HV, init, e);
    assert_true(e < RULE_TOL);
}

static void chunk_case(int T, int HV, int init, float beta_max) {
    be_t *be = tu_cpu();
    rule_in r;
    rule_make(&r, 2, T, 2, HV, 32, 48, 1000 + 10 * T + HV + init, beta_max);
    int64_t nq = (int64_t)r.B * T * r.H * r.K, nv = (int64_t)r.B * T * HV * r.Dv, ng = (int64_t)r.B * T * HV;
    int64_t ns = (int64_t)r.B * HV * r.Dv * r.K;
    // forward: outputs and final states
    float *o_ref = zeros(nv), *S_ref = init ? copy(r.state0, ns) : zeros(ns);
    float *o = zeros(nv), *S = init ? copy(r.state0, ns) : zeros(ns);
    be->gdn_recurrent_fwd(be, o_ref, S_ref, r.q, r.k, r.v, r.g, r.beta, r.scale, r.B, T, r.H, HV, r.K, r.Dv);
    be->gdn_chunk_fwd(be, o, S, init, r.q, r.k, r.v, r.g, r.beta, r.scale, r.B, T, r.H, HV, r.K, r.Dv);
    check("o", o, o_ref, nv, T, HV, init);
    check("final state", S, S_ref, ns, T, HV, init);
    // backward, with a nonzero gradient on the final state
    const float *s0 = init ? r.state0 : NULL;
    float *dq_ref = zeros(nq), *dk_ref = zeros(nq), *dv_ref = zeros(nv), *dg_ref = zeros(ng), *db_ref = zeros(ng);
    float *ds_ref = init ? zeros(ns) : NULL;
    assert_int_equal(cpu_gdn_recurrent_bwd(dq_ref, dk_ref, dv_ref, dg_ref, db_ref, ds_ref, r.dout, r.dstate_final, r.q,
                                           r.k, r.v, r.g, r.beta, s0, r.scale, r.B, T, r.H, HV, r.K, r.Dv),
                     0);
    float *dq = buf(nq, 1, 1), *dk = buf(nq, 2, 1), *dv = buf(nv, 3, 1), *dg = buf(ng, 4, 1), *db = buf(ng, 5, 1);
    float *ds = init ? buf(ns, 6, 1) : NULL; // garbage in: the op must overwrite
    be->gdn_chunk_bwd(be, dq, dk, dv, dg, db, ds, r.dout, r.dstate_final, r.q, r.k, r.v, r.g, r.beta, s0, r.scale, r.B,
                      T, r.H, HV, r.K, r.Dv);
    check("dq", dq, dq_ref, nq, T, HV, init);
    check("dk", dk, dk_ref, nq, T, HV, init);
    check("dv", dv, dv_ref, nv, T, HV, init);
    check("dg", dg, dg_ref, ng, T, HV, init);
    check("dbeta", db, db_ref, ng, T, HV, init);
    if (init) check("dstate0", ds, ds_ref, ns, T, HV, init);
    free(o_ref), free(S_ref), free(o), free(S);
    free(dq_ref), free(dk_ref), free(dv_ref), free(dg_ref), free(db_ref), free(ds_ref);
    free(dq), free(dk), free(dv), free(dg), free(db), free(ds);
    rule_free(&r);
}

static void test_chunk_vs_recurrent(void **st) {
    static const int Ts[] = {1, 63, 64, 65, 130, 200};
    worst = 0;
    for (int it = 0; it < 6; it++)
        for (int hv = 2; hv <= 4; hv += 2) // HV = H = 2, and GVA HV = 4
            for (int init = 0; init <= 1; init++)
                chunk_case(Ts[it], hv, init, 1.0f);
    printf("  chunked vs recurrent (beta < 1): worst relative error %.3e\n", worst);
    // allow_neg_eigval: beta in (0, 2), eigenvalues of I - beta k k^T down to -1
    worst = 0;
    chunk_case(130, 4, 1, 2.0f);
    printf("  chunked vs recurrent (beta < 2): worst relative error %.3e\n", worst);
}

// The state carried between calls: two chunked calls (T1 then T2 tokens,
// final state of the first as initial state of the second) equal one call.
static void test_chunk_split(void **st) {
    be_t *be = tu_cpu();
    rule_in r;
    int T = 150, T1 = 70, B = 2, H = 2, HV = 4, K = 32, Dv = 48;
    rule_make(&r, B, T, H, HV, K, Dv, 77, 1.0f);
    int64_t nv = (int64_t)B * T * HV * Dv, ns = (int64_t)B * HV * Dv * K;
    float *o = zeros(nv), *S = copy(r.state0, ns);
    be->gdn_chunk_fwd(be, o, S, 1, r.q, r.k, r.v, r.g, r.beta, r.scale, B, T, H, HV, K, Dv);
    // split copies: per part, [B, Tp, ...] contiguous
    float *S2 = copy(r.state0, ns), *o2 = zeros(nv);
    for (int part = 0; part < 2; part++) {
        int ta = part ? T1 : 0, Tp = part ? T - T1 : T1;
        float *q = zeros((int64_t)B * Tp * H * K), *k = zeros((int64_t)B * Tp * H * K);
        float *v = zeros((int64_t)B * Tp * HV * Dv), *op = zeros((int64_t)B * Tp * HV * Dv);
        float *g = zeros((int64_t)B * Tp * HV), *bt = zeros((int64_t)B * Tp * HV);
        for (int b = 0; b < B; b++) {
            int64_t src = (int64_t)b * T + ta, dst = (int64_t)b * Tp;
            memcpy(q + dst * H * K, r.q + src * H * K, (size_t)Tp * H * K * sizeof(float));
            memcpy(k + dst * H * K, r.k + src * H * K, (size_t)Tp * H * K * sizeof(float));
            memcpy(v + dst * HV * Dv, r.v + src * HV * Dv, (size_t)Tp * HV * Dv * sizeof(float));
            memcpy(g + dst * HV, r.g + src * HV, (size_t)Tp * HV * sizeof(float));
            memcpy(bt + dst * HV, r.beta + src * HV, (size_t)Tp * HV * sizeof(float));
        }
        be->gdn_chunk_fwd(be, op, S2, 1, q, k, v, g, bt, r.scale, B, Tp, H, HV, K, Dv);
        for (int b = 0; b < B; b++)
            memcpy(o2 + ((int64_t)b * T + ta) * HV * Dv, op + (int64_t)b * Tp * HV * Dv,
                   (size_t)Tp * HV * Dv * sizeof(float));
        free(q), free(k), free(v), free(op), free(g), free(bt);
    }
    // the chunk boundaries differ (70 + 80 vs 64 + 64 + 22): same fp32 margin as above
    assert_true(tu_rel_err(o2, o, nv) < RULE_TOL);
    assert_true(tu_rel_err(S2, S, ns) < RULE_TOL);
    // no state pointer at all: zero initial state, nothing written
    float *o3 = zeros(nv), *S0 = zeros(ns), *o4 = zeros(nv);
    be->gdn_chunk_fwd(be, o3, NULL, 0, r.q, r.k, r.v, r.g, r.beta, r.scale, B, T, H, HV, K, Dv);
    be->gdn_chunk_fwd(be, o4, S0, 1, r.q, r.k, r.v, r.g, r.beta, r.scale, B, T, H, HV, K, Dv);
    assert_true(tu_max_abs_diff(o3, o4, nv) == 0);
    free(o), free(S), free(S2), free(o2), free(o3), free(o4), free(S0);
    rule_free(&r);
}

// Temporaries come from the scratch arena, or the heap when it is too small
// (as cpu_ssd and cpu_loss do): same results bit for bit (each (b, head) is
// computed by one thread in a fixed order either way), and the arena is left
// as it was found. A scratch arena too small for the per-thread tiles used to
// give NaN outputs.
static void test_chunk_scratch(void **st) {
    be_t *be = tu_cpu(), *small = NULL;
    assert_int_equal(be_create(&small, "cpu", 4096), 0);
    rule_in r;
    int B = 2, T = 70, H = 2, HV = 4, K = 16, Dv = 24;
    rule_make(&r, B, T, H, HV, K, Dv, 555, 1.0f);
    int64_t nq = (int64_t)B * T * H * K, nv = (int64_t)B * T * HV * Dv, ng = (int64_t)B * T * HV;
    int64_t ns = (int64_t)B * HV * Dv * K;
    float *o[2], *S[2], *orec[2], *dq[2], *dk[2], *dv[2], *dg[2], *db[2], *ds[2];
    be_t *bes[2] = {be, small};
    size_t used = be->scratch.used;
    for (int i = 0; i < 2; i++) {
        be_t *e = bes[i];
        o[i] = zeros(nv), S[i] = copy(r.state0, ns), orec[i] = zeros(nv);
        dq[i] = zeros(nq), dk[i] = zeros(nq), dv[i] = zeros(nv), dg[i] = zeros(ng), db[i] = zeros(ng);
        ds[i] = zeros(ns);
        e->gdn_chunk_fwd(e, o[i], S[i], 1, r.q, r.k, r.v, r.g, r.beta, r.scale, B, T, H, HV, K, Dv);
        e->gdn_recurrent_fwd(e, orec[i], NULL, r.q, r.k, r.v, r.g, r.beta, r.scale, B, T, H, HV, K, Dv);
        e->gdn_chunk_bwd(e, dq[i], dk[i], dv[i], dg[i], db[i], ds[i], r.dout, r.dstate_final, r.q, r.k, r.v, r.g,
                         r.beta, r.state0, r.scale, B, T, H, HV, K, Dv);
    }
    assert_int_equal(be->scratch.used, used);
    assert_int_equal(small->scratch.used, 0);
    assert_memory_equal(o[0], o[1], (size_t)nv * sizeof(float));
    assert_memory_equal(S[0], S[1], (size_t)ns * sizeof(float));
    assert_memory_equal(orec[0], orec[1], (size_t)nv * sizeof(float));
    assert_memory_equal(dq[0], dq[1], (size_t)nq * sizeof(float));
    assert_memory_equal(dk[0], dk[1], (size_t)nq * sizeof(float));
    assert_memory_equal(dv[0], dv[1], (size_t)nv * sizeof(float));
    assert_memory_equal(dg[0], dg[1], (size_t)ng * sizeof(float));
    assert_memory_equal(db[0], db[1], (size_t)ng * sizeof(float));
    assert_memory_equal(ds[0], ds[1], (size_t)ns * sizeof(float));
    assert_false(isnan(o[1][0]) || isnan(dq[1][0]));
    for (int i = 0; i < 2; i++)
        free(o[i]), free(S[i]), free(orec[i]), free(dq[i]), free(dk[i]), free(dv[i]), free(dg[i]), free(db[i]),
            free(ds[i]);
    be_destroy(small);
    rule_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate),
        cmocka_unit_test(test_gate_neg_eigval),
        cmocka_unit_test(test_recurrent_bwd_fd),
        cmocka_unit_test(test_chunk_vs_recurrent),
        cmocka_unit_test(test_chunk_split),
        cmocka_unit_test(test_chunk_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
