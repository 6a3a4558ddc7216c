// Mamba-2 SSD ops on the CPU (src/backend/cpu/cpu_ssd.c):
//  - softplus(dt + dt_bias) and the naive recurrent backward against finite
//    differences (the recurrence is the definition; its backward is the oracle);
//  - the chunked forward against the recurrence and the chunked backward against
//    the naive one, for every output and gradient, across chunk boundaries,
//    short last chunks, GQA head -> group maps, P != N, with and without an
//    initial state, with an incoming final-state gradient;
//  - the chunked backward also directly against finite differences.
// Finite differences: fp32 forward, loss summed in double. eps 1e-2 on O(1)
// inputs keeps the truncation error of the central difference (O(eps^2)) and
// its rounding error (~1e-7 / eps, the `noise` term of tu_gradcheck) both
// near 1e-4 relative, so tol 1e-2 separates real bugs (O(1) errors) from noise.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ssd.h"
#include "testutil.h"

static float *buf(int64_t n, uint64_t seed, float std) {
    float *p = calloc((size_t)(n ? n : 1), sizeof(float));
    if (std > 0) tu_randn(p, n, seed, std);
    return p;
}

// ---- softplus(dt + dt_bias) -------------------------------------------------------

typedef struct {
    be_t *be;
    float *dt, *bias, *out, *R;
    int64_t N, ld;
    int H;
} sp_case;

static double sp_loss(void *ctx, double *l1) {
    sp_case *c = ctx;
    c->be->softplus_bias_fwd(c->be, c->out, c->dt, c->ld, c->bias, c->N, c->H);
    return tu_dot_l1(c->out, c->R, c->N * c->H, l1);
}

static void test_softplus_bias(void **st) {
    sp_case c = {.be = tu_cpu(), .N = 7, .ld = 9, .H = 5};
    c.dt = buf(c.N * c.ld, 1, 3.0f), c.bias = buf(c.H, 2, 1.0f), c.R = buf(c.N * c.H, 3, 1.0f);
    c.out = buf(c.N * c.H, 0, 0);
    // A few arguments in the identity branch (> 20), far enough from 20 that
    // eps never crosses the switch.
    c.dt[0 * c.ld + 1] = 25.0f, c.dt[3 * c.ld + 4] = 30.0f;
    float *ddt = buf(c.N * c.ld, 0, 0), *dbias = buf(c.H, 0, 0);
    sp_loss(&c, NULL);
    c.be->softplus_bias_bwd(c.be, ddt, c.ld, dbias, c.R, c.dt, c.ld, c.bias, c.N, c.H);
    assert_float_equal(ddt[3 * c.ld + 4], c.R[3 * c.H + 4], 0); // identity branch: gradient passes as is
    assert_int_equal(tu_gradcheck("softplus ddt", sp_loss, &c, c.dt, ddt, c.N * c.ld, 1e-2f, 1e-2f, 63), 0);
    assert_int_equal(tu_gradcheck("softplus ddt_bias", sp_loss, &c, c.bias, dbias, c.H, 1e-2f, 1e-2f, 5), 0);
    free(c.dt), free(c.bias), free(c.R), free(c.out), free(ddt), free(dbias);
}

// ---- SSD cases ----------------------------------------------------------------

// x, B, C live in separate buffers with row strides wider than their data
// (like the column slices of the conv output in the layer); the padding must
// stay untouched and receive zero gradient.
typedef struct {
    be_t *be;
    int B, T, H, Hx, GB, GC, P, N, chunk;
    int64_t ldx, ldb, ldc, nx, nb, nc, ny, ns, ndt;
    float *x, *Bm, *Cm, *dt, *A_log, *D;
    float *state0;    // NULL: no initial state
    float *y, *state; // outputs: y [B,T,H,P], final state [B,H,P,N]
    float *Ry, *Rs;   // loss = sum(y Ry) + sum(final state Rs); Rs NULL: no final-state term
    int chunked;      // which forward the loss runs
} ssd_case;

typedef struct {
    float *dx, *dB, *dC, *ddt, *dA_log, *dD, *dstate0;
} ssd_grads;

static ssd_case make_case(int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk, int init,
                          int final_grad, uint64_t seed) {
    ssd_case c = {.be = tu_cpu(), .B = B, .T = T, .H = H, .Hx = Hx, .GB = GB, .GC = GC, .P = P, .N = N, .chunk = chunk};
    int64_t rows = (int64_t)B * T;
    c.ldx = (int64_t)Hx * P + 3, c.ldb = (int64_t)GB * N + 1, c.ldc = (int64_t)GC * N + 2;
    c.nx = rows * c.ldx, c.nb = rows * c.ldb, c.nc = rows * c.ldc;
    c.ny = rows * H * P, c.ns = (int64_t)B * H * P * N, c.ndt = rows * H;
    c.x = buf(c.nx, seed + 1, 1.0f), c.Bm = buf(c.nb, seed + 2, 0.5f), c.Cm = buf(c.nc, seed + 3, 0.5f);
    // dt' > 0 as after softplus; A = -exp(A_log) in [-2.7, -0.22]: per-step decays
    // from 0.26 to 0.996, so some heads forget within a chunk and some carry
    // state across many chunks.
    c.dt = buf(c.ndt, 0, 0), c.A_log = buf(H, 0, 0);
    tu_randu(c.dt, c.ndt, seed + 4, 0.02f, 0.5f);
    tu_randu(c.A_log, H, seed + 5, -1.5f, 1.0f);
    c.D = buf(H, seed + 6, 0.1f);
    for (int h = 0; h < H; h++)
        c.D[h] += 1.0f;
    c.state0 = init ? buf(c.ns, seed + 7, 0.5f) : NULL;
    c.y = buf(c.ny, 0, 0), c.state = buf(c.ns, 0, 0);
    c.Ry = buf(c.ny, seed + 8, 1.0f);
    c.Rs = final_grad ? buf(c.ns, seed + 9, 1.0f) : NULL;
    // The padding of the strided inputs must never be read: poison it.
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = (int64_t)Hx * P; i < c.ldx; i++)
            c.x[r * c.ldx + i] = NAN;
        for (int64_t i = (int64_t)GB * N; i < c.ldb; i++)
            c.Bm[r * c.ldb + i] = NAN;
        for (int64_t i = (int64_t)GC * N; i < c.ldc; i++)
            c.Cm[r * c.ldc + i] = NAN;
    }
    return c;
}

// Replaces the NaN padding by zeros (finite differences perturb whole buffers).
static void unpoison(ssd_case *c) {
    for (int64_t i = 0; i < c->nx; i++)
        c->x[i] = isnan(c->x[i]) ? 0.0f : c->x[i];
    for (int64_t i = 0; i < c->nb; i++)
        c->Bm[i] = isnan(c->Bm[i]) ? 0.0f : c->Bm[i];
    for (int64_t i = 0; i < c->nc; i++)
        c->Cm[i] = isnan(c->Cm[i]) ? 0.0f : c->Cm[i];
}

static void free_case(ssd_case *c) {
    free(c->x), free(c->Bm), free(c->Cm), free(c->dt), free(c->A_log), free(c->D), free(c->state0);
    free(c->y), free(c->state), free(c->Ry), free(c->Rs);
}

static void ssd_run(ssd_case *c) {
    be_t *be = c->be;
    if (c->state0)
        memcpy(c->state, c->state0, (size_t)c->ns * sizeof(float));
    else
        memset(c->state, 0, (size_t)c->ns * sizeof(float));
    if (c->chunked)
        be->ssd_chunk_fwd(be, c->y, c->state, c->state0 != NULL, c->x, c->ldx, c->Bm, c->ldb, c->Cm, c->ldc, c->dt,
                          c->A_log, c->D, c->B, c->T, c->H, c->Hx, c->GB, c->GC, c->P, c->N, c->chunk);
    else
        be->ssd_recurrent_fwd(be, c->y, c->state, c->x, c->ldx, c->Bm, c->ldb, c->Cm, c->ldc, c->dt, c->A_log, c->D,
                              c->B, c->T, c->H, c->Hx, c->GB, c->GC, c->P, c->N);
}

static double ssd_loss(void *ctx, double *l1) {
    ssd_case *c = ctx;
    ssd_run(c);
    double a = 0, b = 0, L = tu_dot_l1(c->y, c->Ry, c->ny, &a);
    if (c->Rs) L += tu_dot_l1(c->state, c->Rs, c->ns, &b);
    if (l1) *l1 = a + b;
    return L;
}

static ssd_grads grads_alloc(const ssd_case *c) {
    ssd_grads g = {buf(c->nx, 0, 0),
                   buf(c->nb, 0, 0),
                   buf(c->nc, 0, 0),
                   buf(c->ndt, 0, 0),
                   buf(c->H, 0, 0),
                   buf(c->H, 0, 0),
                   c->state0 ? buf(c->ns, 0, 0) : NULL};
    return g;
}

static void grads_free(ssd_grads *g) {
    free(g->dx), free(g->dB), free(g->dC), free(g->ddt), free(g->dA_log), free(g->dD), free(g->dstate0);
}

static void naive_bwd(const ssd_case *c, ssd_grads *g) {
    cpu_ssd_recurrent_bwd(g->dx, g->dB, g->dC, g->ddt, g->dA_log, g->dD, g->dstate0, c->Ry, c->Rs, c->x, c->ldx, c->Bm,
                          c->ldb, c->Cm, c->ldc, c->dt, c->A_log, c->D, c->state0, c->B, c->T, c->H, c->Hx, c->GB,
                          c->GC, c->P, c->N);
}

static void chunk_bwd(const ssd_case *c, ssd_grads *g) {
    c->be->ssd_chunk_bwd(c->be, g->dx, g->dB, g->dC, g->ddt, g->dA_log, g->dD, g->dstate0, c->Ry, c->Rs, c->x, c->ldx,
                         c->Bm, c->ldb, c->Cm, c->ldc, c->dt, c->A_log, c->D, c->state0, c->B, c->T, c->H, c->Hx, c->GB,
                         c->GC, c->P, c->N, c->chunk);
}

// The gradient dx of the loss of c with respect to the n inputs at x
// against finite differences; the number of failures.
static int fd_one(const char *tag, const char *what, ssd_case *c, float *x, const float *dx, int64_t n) {
    char name[96];
    snprintf(name, sizeof name, "%s %s", tag, what);
    return tu_gradcheck(name, ssd_loss, c, x, dx, n, 1e-2f, 1e-2f, 40);
}

// Every gradient of g against finite differences of the loss of c.
static int fd_all(const char *tag, ssd_case *c, const ssd_grads *g) {
    int fails = fd_one(tag, "dx", c, c->x, g->dx, c->nx);
    fails += fd_one(tag, "dB", c, c->Bm, g->dB, c->nb);
    fails += fd_one(tag, "dC", c, c->Cm, g->dC, c->nc);
    fails += fd_one(tag, "ddt", c, c->dt, g->ddt, c->ndt);
    fails += fd_one(tag, "dA_log", c, c->A_log, g->dA_log, c->H);
    fails += fd_one(tag, "dD", c, c->D, g->dD, c->H);
    if (c->state0) fails += fd_one(tag, "dstate0", c, c->state0, g->dstate0, c->ns);
    return fails;
}

// The naive backward through time is the oracle: check it against finite
// differences of the recurrence itself (GQA, P != N, initial state, final-state loss term).
static void test_recurrent_bwd_fd(void **st) {
    ssd_case c = make_case(2, 13, 4, 2, 2, 4, 4, 6, 16, 1, 1, 100);
    unpoison(&c);
    ssd_grads g = grads_alloc(&c);
    naive_bwd(&c, &g);
    assert_int_equal(fd_all("recurrent", &c, &g), 0);
    grads_free(&g);
    free_case(&c);
}

// The chunked backward directly against finite differences of the chunked
// forward: 3 chunks, the last one short.
static void test_chunk_bwd_fd(void **st) {
    ssd_case c = make_case(2, 40, 4, 2, 2, 4, 8, 12, 16, 1, 1, 200);
    c.chunked = 1;
    unpoison(&c);
    ssd_grads g = grads_alloc(&c);
    chunk_bwd(&c, &g);
    assert_int_equal(fd_all("chunked", &c, &g), 0);
    grads_free(&g);
    free_case(&c);
}

// Chunked vs recurrence / naive backward. Both sides are fp32 sums of the same
// terms in different orders (the naive backward even accumulates in double), so
// the difference is rounding only: a few ulp per term, growing with the number
// of summed terms (up to ~T * P * N for dA_log, a sum over every token of both
// signs). Measured (norm-wise relative): y, state, dx, dD, dstate0 <= 5e-7;
// dB, dC, ddt <= 1.3e-6; dA_log <= 3.3e-6. TOL_CHUNK = 2e-5 leaves a 6x margin
// while a missing or wrong term (a dropped decay factor, a chunk boundary off
// by one) gives errors of 4e-2 .. 1 (seen when such bugs were injected).
#define TOL_CHUNK 2e-5

// The worst error seen of each output, in ERR_NAMES order.
enum { N_ERRS = 9 };
static const char *const ERR_NAMES[N_ERRS] = {"y", "state", "dx", "dB", "dC", "ddt", "dA_log", "dD", "dstate0"};
typedef struct {
    double e[N_ERRS];
} errs_t;

static void worst(double *w, double e) {
    if (!(e <= *w)) *w = e; // NaN wins
}

static void compare_case(int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk, int init, int final_grad,
                         errs_t *w) {
    ssd_case c = make_case(B, T, H, Hx, GB, GC, P, N, chunk, init, final_grad, 1000 + (uint64_t)T * 7 + P + N + init);
    float *y_ref = buf(c.ny, 0, 0), *s_ref = buf(c.ns, 0, 0);
    c.chunked = 0;
    ssd_run(&c);
    memcpy(y_ref, c.y, (size_t)c.ny * sizeof(float));
    memcpy(s_ref, c.state, (size_t)c.ns * sizeof(float));
    c.chunked = 1;
    ssd_run(&c);
    double ey = tu_rel_err(c.y, y_ref, c.ny), es = tu_rel_err(c.state, s_ref, c.ns);
    ssd_grads gn = grads_alloc(&c), gc = grads_alloc(&c);
    naive_bwd(&c, &gn);
    chunk_bwd(&c, &gc);
    double e[N_ERRS] = {ey,
                        es,
                        tu_rel_err(gc.dx, gn.dx, c.nx),
                        tu_rel_err(gc.dB, gn.dB, c.nb),
                        tu_rel_err(gc.dC, gn.dC, c.nc),
                        tu_rel_err(gc.ddt, gn.ddt, c.ndt),
                        tu_rel_err(gc.dA_log, gn.dA_log, c.H),
                        tu_rel_err(gc.dD, gn.dD, c.H),
                        init ? tu_rel_err(gc.dstate0, gn.dstate0, c.ns) : 0};
    for (int i = 0; i < N_ERRS; i++) {
        worst(&w->e[i], e[i]);
        if (!(e[i] < TOL_CHUNK))
            printf("  B %d T %d H %d Hx %d GB %d GC %d P %d N %d chunk %d init %d dfinal %d: %s rel err %.3e\n", B, T,
                   H, Hx, GB, GC, P, N, chunk, init, final_grad, ERR_NAMES[i], e[i]);
    }
    free(y_ref), free(s_ref);
    grads_free(&gn), grads_free(&gc);
    free_case(&c);
}

static void print_errs(const char *what, const errs_t *w) {
    printf("  %s worst rel err:", what);
    for (int i = 0; i < N_ERRS; i++)
        printf(" %s %.2e", ERR_NAMES[i], w->e[i]);
    printf("\n");
}

static void check_errs(const errs_t *w) {
    for (int i = 0; i < N_ERRS; i++)
        assert_true(w->e[i] < TOL_CHUNK);
}

// B = 2, H = 4, MambaInLlama GQA (Hx = GB = 2, GC = 4), P = N and P != N,
// with and without initial state, with an incoming final-state gradient.
static void test_chunk_vs_naive(void **st) {
    static const int Ts[] = {1, 15, 16, 17, 50, 100};
    static const int PN[2][2] = {{8, 8}, {8, 12}};
    errs_t w = {0};
    for (int k = 0; k < 2; k++)
        for (int init = 0; init < 2; init++) {
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
                compare_case(2, Ts[i], 4, 2, 2, 4, PN[k][0], PN[k][1], 16, init, 1, &w);
            compare_case(2, 300, 4, 2, 2, 4, PN[k][0], PN[k][1], 256, init, 1, &w); // 2 chunks: 256 + 44
        }
    print_errs("chunk vs naive", &w);
    check_errs(&w);
}

// Other head -> group maps (x, B, C shared by different, non-nested head sets;
// P > N), no final-state gradient (dstate_final NULL), long single chunk.
static void test_chunk_group_maps(void **st) {
    errs_t w = {0};
    compare_case(2, 50, 6, 3, 2, 1, 12, 4, 16, 1, 0, &w);
    compare_case(1, 37, 6, 1, 3, 6, 4, 8, 64, 0, 0, &w);
    compare_case(3, 33, 2, 2, 2, 2, 8, 8, 8, 1, 1, &w);
    print_errs("group maps", &w);
    check_errs(&w);
}

// Chunked prefill in pieces, carrying the state (init = 1), equals one pass.
static void test_chunk_split(void **st) {
    ssd_case c = make_case(2, 100, 4, 2, 2, 4, 8, 12, 16, 1, 0, 300);
    c.chunked = 1;
    ssd_run(&c);
    float *y_ref = buf(c.ny, 0, 0), *s_ref = buf(c.ns, 0, 0), *y = buf(c.ny, 0, 0), *state = buf(c.ns, 0, 0);
    memcpy(y_ref, c.y, (size_t)c.ny * sizeof(float));
    memcpy(s_ref, c.state, (size_t)c.ns * sizeof(float));
    memcpy(state, c.state0, (size_t)c.ns * sizeof(float));
    static const int cuts[] = {0, 17, 33, 34, 100};
    for (int b = 0; b < c.B; b++) // one sequence at a time: rows of a piece are contiguous per sequence
        for (int i = 0; i + 1 < 5; i++) {
            int t0 = cuts[i], n = cuts[i + 1] - cuts[i];
            int64_t r0 = (int64_t)b * c.T + t0;
            c.be->ssd_chunk_fwd(c.be, y + r0 * c.H * c.P, state + (int64_t)b * c.H * c.P * c.N, 1, c.x + r0 * c.ldx,
                                c.ldx, c.Bm + r0 * c.ldb, c.ldb, c.Cm + r0 * c.ldc, c.ldc, c.dt + r0 * c.H, c.A_log,
                                c.D, 1, n, c.H, c.Hx, c.GB, c.GC, c.P, c.N, c.chunk);
        }
    double ey = tu_rel_err(y, y_ref, c.ny), es = tu_rel_err(state, s_ref, c.ns);
    printf("  split prefill: y rel err %.2e, state rel err %.2e\n", ey, es);
    assert_true(ey < TOL_CHUNK && es < TOL_CHUNK); // only the chunk boundaries move: rounding only
    free(y_ref), free(s_ref), free(y), free(state);
    free_case(&c);
}

// Temporaries come from the scratch arena, or the heap when it is too small:
// same results bit for bit (each (b, h) is computed by one thread in a fixed
// order either way), and the arena is left as it was found.
static void test_chunk_scratch(void **st) {
    be_t *small = NULL;
    assert_int_equal(be_create(&small, "cpu", 4096), 0);
    ssd_case c = make_case(2, 50, 4, 2, 2, 4, 8, 12, 16, 1, 1, 400);
    c.chunked = 1;
    ssd_grads g1 = grads_alloc(&c), g2 = grads_alloc(&c);
    float *y1 = buf(c.ny, 0, 0);
    size_t used = c.be->scratch.used;
    ssd_run(&c);
    chunk_bwd(&c, &g1);
    assert_int_equal(c.be->scratch.used, used);
    memcpy(y1, c.y, (size_t)c.ny * sizeof(float));
    c.be = small;
    ssd_run(&c);
    chunk_bwd(&c, &g2);
    assert_int_equal(small->scratch.used, 0);
    assert_memory_equal(y1, c.y, (size_t)c.ny * sizeof(float));
    assert_memory_equal(g1.dx, g2.dx, (size_t)c.nx * sizeof(float));
    assert_memory_equal(g1.dB, g2.dB, (size_t)c.nb * sizeof(float));
    assert_memory_equal(g1.dC, g2.dC, (size_t)c.nc * sizeof(float));
    assert_memory_equal(g1.ddt, g2.ddt, (size_t)c.ndt * sizeof(float));
    assert_memory_equal(g1.dA_log, g2.dA_log, (size_t)c.H * sizeof(float));
    assert_memory_equal(g1.dD, g2.dD, (size_t)c.H * sizeof(float));
    assert_memory_equal(g1.dstate0, g2.dstate0, (size_t)c.ns * sizeof(float));
    be_destroy(small);
    free(y1);
    grads_free(&g1), grads_free(&g2);
    free_case(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softplus_bias),    cmocka_unit_test(test_recurrent_bwd_fd),
        cmocka_unit_test(test_chunk_bwd_fd),     cmocka_unit_test(test_chunk_vs_naive),
        cmocka_unit_test(test_chunk_group_maps), cmocka_unit_test(test_chunk_split),
        cmocka_unit_test(test_chunk_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
