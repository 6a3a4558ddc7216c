// CUDA Gated DeltaNet ops (cuda_gdn.cu) against the CPU reference (tu_cpu()):
// gates forward / backward, the decode recurrence, the decode step's inputs
// and the whole fused decode step, the chunked rule forward and backward, and
// the packed-sequence form of the chunked rule (gdn_chunk_seqs), and the whole
// GDN layer (model/gdn.c) on both backends.
// Inputs are drawn fresh per case and rounded to bf16 (tu_round_bf16) so both
// backends see the same numbers; q and k are L2-normalised per head (as the
// layer feeds them), g = -exp(A_log) softplus(a + dt_bias) with A_log in
// [0, 2.8], dt_bias in [-5, -2], a ~ N(0, 1) (per-token log decays from about
// -0.001 to -3, most in [-0.5, 0]), beta = sigmoid(N(0, 1)). Every GPU output
// is poisoned with NaN before the call (an element the kernels forget fails);
// an input the op must not read (the state when init = 0) holds NaN too. Every
// chunked call and the gate backward run twice and must agree bit for bit
// (no atomics anywhere: a difference is a race).
// Each check prints: op, shape, relative L2 error ||gpu - cpu|| / ||cpu||,
// its tolerance, max |diff|, and on failure the first element off by more
// than 8 * tol * rms(cpu) with its coordinates.
//
// Tolerances (relative L2) and why. "Measured" = these cases run through a
// host emulation of the kernels (the same bf16 roundings and fragment layouts,
// another fp32 summation order), before any GPU run:
//  CHUNK_O    1e-2  chunked output. The GPU's tensor-core operands are bf16:
//                   T_A, W, U, P, the chunk-start states h and Delta are rounded
//                   (2^-9 relative each, uncorrelated), fp32 accumulation; the
//                   output is bf16. Measured 2.6e-3 .. 3.9e-3.
//  CHUNK_S    1e-2  final state (fp32): every chunk's update K^T (gamma Delta)
//                   uses bf16 K and Delta, and Delta = U - W S uses bf16 W, U
//                   and a bf16 copy of S; the state is non-expansive, so the
//                   errors do not grow with T. Measured 1e-3 .. 3.1e-3.
//  CHUNK_G    1.5e-2 dq, dk, dv, dstate0: more bf16 stages (dh, dDelta, dW, ds,
//                   dM) on top of the forward's. Measured 1.3e-4 .. 4e-3.
//  CHUNK_GB   2e-2  dbeta, dg: sums of products over K and Dv with
//                   cancellation (dG = q.dq - k.dk plus WY terms), then a
//                   cumulative sum over up to 64 tokens. Measured up to 4.8e-3.
//  REC_O      4e-3  decode output: fp32 math on the same inputs, one bf16
//                   rounding of the output (2^-9, ~1.1e-3 in L2).
//  REC_S      1e-5  decode state: fp32, only the summation order differs.
//                   Both also for gdn_recurrent_step (per-row states: the
//                   same kernel and math, the state found through a pointer).
//  GATE_F32   1e-5  g, beta, dA_log, ddt_bias: the same fp32 formulas (device
//                   expf/log1pf within 2 ulp of the host's); sums in double.
//  GATE_BF16  4e-3  da, db: one bf16 rounding.
//  STEP_QKV   6e-3  gdn_step_inputs q, k, v: the GPU rounds the conv output to
//                   bf16 (as conv1d_step's act output) and q, k again after the
//                   L2 norm, two roundings of 2^-9 (~1.6e-3 in L2) where the
//                   CPU keeps fp32; a wrong channel, head or window tap is off
//                   by O(1).
//  STEP_Y     1.5e-2 gdn_step y (the output norm's, o_proj's input): q, k, v
//                   rounded as STEP_QKV, o rounded (REC_O), y rounded once
//                   more, against fp32 throughout, over three steps whose
//                   errors the state carries. Measured by a host emulation of
//                   k_gdn_step (its decomposition and roundings; the fused
//                   cases below, 10 draws each): 2.7e-3 .. 7.7e-3, the largest
//                   where a step has fewest elements (K = Dv = 32 one row;
//                   Dv = 99). A wrong head, slice, row or window is off by O(1)
//                   (a wrong slice of the norm's parts measured 0.44 there).
//  STEP_S     8e-3  gdn_step states after three steps: updates from bf16 q, k,
//                   v against fp32 ones. Measured the same way: 1.0e-3 .. 3.2e-3.
//  FUSED_Y    1e-3  gdn_step y against the three GPU ops on the same inputs:
//                   the same roundings and formulas but for the order of the
//                   norm's sum of squares, which moves rstd by an ulp or so and
//                   may flip a rare element by one bf16 ulp (~4e-3 / sqrt(n)
//                   each). The states against the three ops': REC_S (the same
//                   formulas and order as k_recurrent: expected bit-identical).
//  LAYER      3e-2  whole layer: bf16 activations between all ops (projections,
//                   convs, norms, the rule) against fp32 everywhere on the CPU,
//                   ~10 roundings of 2^-9 in a chain (~5e-3 expected); weight
//                   gradients are sums over 400 tokens of such products.
//  LAYER_TERMS 1e-2 the per-head gradients (dA_log, ddt_bias): each is a sum
//                   over the B T = 400 tokens of dg_t (the rule's gradient to
//                   its gate) times a factor of one sign, and the terms cancel
//                   by an amount that depends on the draw (run 26: the same
//                   code, other random weights, moved the H = HV = 1 case's
//                   error relative to the result from 6e-4 to 1.0e-2 while the
//                   absolute error only doubled). So the error of head h is
//                   held to LAYER_TERMS times the sum of its terms' magnitudes
//                   (gate_grad_terms, from the CPU's dg): dg carries the bf16
//                   chain's few e-3 per token, so even errors of one sign in
//                   every term stay below half the bound. The formula itself
//                   is held to GATE_F32 in test_gates; what this catches is
//                   wiring (a wrong dg, tokens or heads dropped or doubled),
//                   which is off by a sizeable part of the terms.
// An indexing, masking, chunk-boundary or GVA mistake gives errors of 0.1-1.
//
// Built twice (Makefile): build/tests/cuda/test_cuda_gdn runs the production
// kernels; the bench-variants build (build/bench-variants/tests/cuda/test_cuda_gdn,
// -DHYLO_BENCH_VARIANTS, against the library whose cuda_gdn.cu keeps the
// bench-only variants) runs every chunked case again under each variant, chosen
// through the environment variable only that library reads: HYLO_GDN_STATE = 2,
// the sequential state passes on mma.sync (k_state; production runs them on
// wgmma, k_state_wg). Same tolerances: both round to bf16 at the same points
// and differ only in the fp32 summation order inside the tensor cores.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/gdn.h"
#include "model/linear.h"
#include "testutil.h"

static be_t *cpu, *gpu;
static uint64_t g_seed = 0x6d17;

static const double CHUNK_O = 1e-2, CHUNK_S = 1e-2, CHUNK_G = 1.5e-2, CHUNK_GB = 2e-2;
static const double REC_O = 4e-3, REC_S = 1e-5, GATE_F32 = 1e-5, GATE_BF16 = 4e-3, STEP_QKV = 6e-3, STEP_Y = 1.5e-2,
                    STEP_S = 8e-3, FUSED_Y = 1e-3, LAYER = 3e-2, LAYER_TERMS = 1e-2;

// tu_gpu(): the GPU, or the fake one under HYLO_TEST_CPU_AS_GPU=1 (testutil.h;
// every check then passes with error 0).
static void setup(void) {
    gpu = tu_gpu();
    cpu = tu_cpu();
}

// ---- host buffers --------------------------------------------------------------

// N(0, std^2) rounded to bf16
static float *rnd(int64_t n, float std) { return tu_rnd(n, g_seed++, std); }
static float *rnd_f32(int64_t n, float std) {
    float *p = tu_hbuf(n);
    tu_randn(p, n, g_seed++, std);
    return p;
}
static float *unif(int64_t n, float lo, float hi) {
    float *p = tu_hbuf(n);
    tu_randu(p, n, g_seed++, lo, hi);
    return p;
}
// rows of `dim` scaled to unit L2 norm (eps 1e-6 as the layer), then rounded to bf16
static float *rnd_unit_rows(int64_t rows, int dim) {
    float *p = rnd_f32(rows * dim, 1.0f);
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)p[r * dim + i] * p[r * dim + i];
        float inv = (float)(1.0 / sqrt(ss + 1e-6));
        for (int i = 0; i < dim; i++)
            p[r * dim + i] *= inv;
    }
    tu_round_bf16(p, rows * dim);
    return p;
}
static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softp(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Realistic gates for N rows x HV heads: per-head A_log, dt_bias, per-token a.
static void make_gates(float *g, float *beta, int64_t N, int HV) {
    float *A_log = unif(HV, 0.0f, 2.8f), *dtb = unif(HV, -5.0f, -2.0f), *a = rnd_f32(N * HV, 1.0f),
          *b = rnd_f32(N * HV, 1.0f);
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < HV; h++) {
            g[n * HV + h] = -expf(A_log[h]) * softp(a[n * HV + h] + dtb[h]);
            beta[n * HV + h] = sigm(b[n * HV + h]);
        }
    free(A_log), free(dtb), free(a), free(b);
}

// ---- comparison ------------------------------------------------------------------

// Compares got (n values of a tensor with dims d[0..3], names in `axes`, a
// 4-letter string; unused leading dims 1) with ref; prints one line. 1 = pass.
static int check(const char *op, const char *shape, const float *got, const float *ref, int64_t n, const int64_t d[4],
                 const char *axes, double tol) {
    // located on failure: the first element off by more than 8 tol max(rms(ref), 1e-6)
    tu_cmp_t c = tu_compare(got, ref, n, 0.0, 8 * tol, 8 * tol * 1e-6);
    // the denominator is floored at rms 1e-6: some references are exactly 0
    // (dg at T = 1: a lone token's output does not depend on its decay)
    double floor = 1e-6 * sqrt((double)(n > 0 ? n : 1));
    double rel = sqrt(c.se) / (sqrt(c.ss) > floor ? sqrt(c.ss) : floor);
    int ok = !c.nonfinite && rel <= tol;
    printf("%s %-22s %-58s rel_err %.3e (tol %.0e) max_abs %.3e%s\n", ok ? "ok  " : "FAIL", op, shape, rel, tol,
           c.max_abs, c.nonfinite ? " NaN/unwritten" : "");
    if (!ok && c.first >= 0) tu_print_elem("    first off", got, ref, c.first, d, axes, c.rms);
    fflush(stdout);
    return ok;
}
static int check_act(const char *op, const char *shape, const void *dev, const float *ref, int64_t n,
                     const int64_t d[4], const char *axes, double tol) {
    float *h = tu_host_act(gpu, dev, n);
    int ok = check(op, shape, h, ref, n, d, axes, tol);
    free(h);
    return ok;
}
static int check_f32(const char *op, const char *shape, const float *dev, const float *ref, int64_t n,
                     const int64_t d[4], const char *axes, double tol) {
    float *h = tu_host_f32(gpu, dev, n);
    int ok = check(op, shape, h, ref, n, d, axes, tol);
    free(h);
    return ok;
}

// Runs are deterministic (no atomics; fixed-order reductions): a second run
// must reproduce the first bit for bit. A difference is a race (METHOD.md).
static int same_bits(const char *op, const char *shape, const void *d1, const void *d2, int64_t n, int act) {
    float *a = act ? tu_host_act(gpu, d1, n) : tu_host_f32(gpu, d1, n);
    float *b = act ? tu_host_act(gpu, d2, n) : tu_host_f32(gpu, d2, n);
    int64_t first = -1;
    for (int64_t i = 0; i < n && first < 0; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) first = i;
    printf("%s %-22s %-58s second run %s", first < 0 ? "ok  " : "FAIL", op, shape,
           first < 0 ? "bit-identical\n" : "differs");
    if (first >= 0) printf(" at %lld: %.8g vs %.8g (a race)\n", (long long)first, a[first], b[first]);
    fflush(stdout);
    free(a), free(b);
    return first < 0;
}

// ==== gates =========================================================================

static void test_gates(void **st) {
    setup();
    int fails = 0;
    const int64_t Ns[3] = {1, 7, 3001};
    for (int ci = 0; ci < 3; ci++)
        for (int neg = 0; neg < 2; neg++) {
            const int64_t N = Ns[ci];
            const int HV = 6, ld = HV + 3; // a, b are strided slices, as of a projection output
            char shape[96];
            snprintf(shape, sizeof shape, "N=%lld HV=%d ld=%d allow_neg=%d", (long long)N, HV, ld, neg);
            const int64_t dgt[4] = {1, 1, N, HV}, dab[4] = {1, 1, N, ld}, dh[4] = {1, 1, 1, HV};
            // a ~ N(0, 8^2): some a + dt_bias above 20 (softplus identity branch)
            float *a = rnd(N * ld, 8.0f), *b = rnd(N * ld, 2.0f), *A_log = unif(HV, 0.0f, 2.8f),
                  *dtb = unif(HV, -5.0f, -2.0f);
            tu_round_bf16(A_log, HV), tu_round_bf16(dtb, HV);
            float *g_ref = tu_hbuf(N * HV), *b_ref = tu_hbuf(N * HV), *nan = tu_nans(N * HV);
            cpu->gdn_gate_fwd(cpu, g_ref, b_ref, a, ld, b, ld, A_log, dtb, N, HV, neg);
            void *da_ = tu_dev_act(gpu, a, N * ld), *db_ = tu_dev_act(gpu, b, N * ld), *dA = tu_dev_act(gpu, A_log, HV),
                 *ddt = tu_dev_act(gpu, dtb, HV);
            float *dg_ = tu_dev_f32(gpu, nan, N * HV), *dbeta_ = tu_dev_f32(gpu, nan, N * HV);
            gpu->gdn_gate_fwd(gpu, dg_, dbeta_, da_, ld, db_, ld, dA, ddt, N, HV, neg);
            fails += !tu_sync(gpu, "gate_fwd", shape) ||
                     !check_f32("gate_fwd g", shape, dg_, g_ref, N * HV, dgt, "-tnh", GATE_F32);
            fails += !check_f32("gate_fwd beta", shape, dbeta_, b_ref, N * HV, dgt, "-tnh", GATE_F32);

            // backward: da, db written at [n*ld + h] (the rest of the buffer must survive);
            // dA_log, ddt_bias accumulate onto nonzero values
            float *gg = rnd_f32(N * HV, 1.0f), *gb = rnd_f32(N * HV, 1.0f), *around = rnd(N * ld, 1.0f);
            float *da_ref = tu_hdup(around, N * ld), *db_ref = tu_hdup(around, N * ld), *pa = tu_hdup(around, N * ld);
            for (int64_t n = 0; n < N; n++)
                for (int h = 0; h < HV; h++)
                    pa[n * ld + h] = NAN;
            float *dA0 = rnd_f32(HV, 1.0f), *ddt0 = rnd_f32(HV, 1.0f);
            float *dA_ref = tu_hdup(dA0, HV), *ddt_ref = tu_hdup(ddt0, HV);
            cpu->gdn_gate_bwd(cpu, da_ref, ld, db_ref, ld, dA_ref, ddt_ref, gg, gb, a, ld, b, ld, A_log, dtb, N, HV,
                              neg);
            tu_round_bf16(da_ref, N * ld), tu_round_bf16(db_ref, N * ld); // the GPU stores da, db in bf16
            float *d_gg = tu_dev_f32(gpu, gg, N * HV), *d_gb = tu_dev_f32(gpu, gb, N * HV),
                  *d_dA = tu_dev_f32(gpu, dA0, HV), *d_ddt = tu_dev_f32(gpu, ddt0, HV);
            void *d_da = tu_dev_act(gpu, pa, N * ld), *d_db = tu_dev_act(gpu, pa, N * ld);
            gpu->gdn_gate_bwd(gpu, d_da, ld, d_db, ld, d_dA, d_ddt, d_gg, d_gb, da_, ld, db_, ld, dA, ddt, N, HV, neg);
            fails += !tu_sync(gpu, "gate_bwd", shape) ||
                     !check_act("gate_bwd da", shape, d_da, da_ref, N * ld, dab, "-tnc", GATE_BF16);
            fails += !check_act("gate_bwd db", shape, d_db, db_ref, N * ld, dab, "-tnc", GATE_BF16);
            fails += !check_f32("gate_bwd dA_log +=", shape, d_dA, dA_ref, HV, dh, "---h", GATE_F32);
            fails += !check_f32("gate_bwd ddt_bias +=", shape, d_ddt, ddt_ref, HV, dh, "---h", GATE_F32);
            float *d_dA2 = tu_dev_f32(gpu, dA0, HV), *d_ddt2 = tu_dev_f32(gpu, ddt0, HV);
            gpu->gdn_gate_bwd(gpu, d_da, ld, d_db, ld, d_dA2, d_ddt2, d_gg, d_gb, da_, ld, db_, ld, dA, ddt, N, HV,
                              neg);
            fails +=
                !tu_sync(gpu, "gate_bwd repeat", shape) || !same_bits("gate_bwd dA_log +=", shape, d_dA, d_dA2, HV, 0);
            fails += !same_bits("gate_bwd ddt_bias +=", shape, d_ddt, d_ddt2, HV, 0);
            tu_dev_free(gpu, d_dA2), tu_dev_free(gpu, d_ddt2);
            free(a), free(b), free(A_log), free(dtb), free(g_ref), free(b_ref), free(nan), free(gg), free(gb);
            free(around), free(da_ref), free(db_ref), free(pa), free(dA0), free(ddt0), free(dA_ref), free(ddt_ref);
            tu_dev_free(gpu, da_), tu_dev_free(gpu, db_), tu_dev_free(gpu, dA), tu_dev_free(gpu, ddt),
                tu_dev_free(gpu, dg_), tu_dev_free(gpu, dbeta_), tu_dev_free(gpu, d_gg), tu_dev_free(gpu, d_gb);
            tu_dev_free(gpu, d_dA), tu_dev_free(gpu, d_ddt), tu_dev_free(gpu, d_da), tu_dev_free(gpu, d_db);
        }
    assert_int_equal(fails, 0);
}

// ==== decode recurrence ===============================================================

static void test_recurrent(void **st) {
    setup();
    int fails = 0;
    // B, T, H, HV, K, Dv
    static const int cases[][6] = {{1, 1, 2, 2, 64, 64},   {2, 1, 2, 4, 256, 512}, {2, 5, 2, 4, 256, 512},
                                   {1, 5, 2, 2, 128, 256}, {3, 5, 1, 1, 80, 48},   {64, 1, 2, 2, 64, 128}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int B = cases[ci][0], T = cases[ci][1], H = cases[ci][2], HV = cases[ci][3], K = cases[ci][4],
                  Dv = cases[ci][5];
        char shape[96];
        snprintf(shape, sizeof shape, "B=%d T=%d H=%d HV=%d K=%d Dv=%d", B, T, H, HV, K, Dv);
        const int64_t N = (int64_t)B * T, nq = N * H * K, nv = N * HV * Dv, ns = (int64_t)B * HV * Dv * K;
        const int64_t dov[4] = {B, T, HV, Dv}, dst[4] = {B, HV, Dv, K};
        float *q = rnd_unit_rows(N * H, K), *k = rnd_unit_rows(N * H, K), *v = rnd(nv, 1.0f);
        float *g = tu_hbuf(N * HV), *beta = tu_hbuf(N * HV), *s0 = rnd_f32(ns, 0.1f);
        make_gates(g, beta, N, HV);
        const float scale = 1.0f / sqrtf((float)K);
        float *o_ref = tu_hbuf(nv), *s_ref = tu_hdup(s0, ns), *nan = tu_nans(nv);
        cpu->gdn_recurrent_fwd(cpu, o_ref, s_ref, q, k, v, g, beta, scale, B, T, H, HV, K, Dv);
        void *dq = tu_dev_act(gpu, q, nq), *dk = tu_dev_act(gpu, k, nq), *dv = tu_dev_act(gpu, v, nv),
             *d_o = tu_dev_act(gpu, nan, nv);
        float *dg = tu_dev_f32(gpu, g, N * HV), *dbeta = tu_dev_f32(gpu, beta, N * HV), *ds = tu_dev_f32(gpu, s0, ns);
        gpu->gdn_recurrent_fwd(gpu, d_o, ds, dq, dk, dv, dg, dbeta, scale, B, T, H, HV, K, Dv);
        fails +=
            !tu_sync(gpu, "recurrent", shape) || !check_act("recurrent o", shape, d_o, o_ref, nv, dov, "btnv", REC_O);
        fails += !check_f32("recurrent state", shape, ds, s_ref, ns, dst, "bhvk", REC_S);
        free(q), free(k), free(v), free(g), free(beta), free(s0), free(o_ref), free(s_ref), free(nan);
        tu_dev_free(gpu, dq), tu_dev_free(gpu, dk), tu_dev_free(gpu, dv), tu_dev_free(gpu, d_o), tu_dev_free(gpu, dg),
            tu_dev_free(gpu, dbeta), tu_dev_free(gpu, ds);
    }
    assert_int_equal(fails, 0);
}

// gdn_recurrent_step: N rows, each row's state [HV, Dv, K] in an allocation
// of its own, against the CPU op. REC_O / REC_S as the recurrence (the same
// kernel, reading the state through the row's pointer).
static void test_recurrent_step(void **st) {
    setup();
    int fails = 0;
    // N, H, HV, K, Dv
    static const int cases[][5] = {{1, 2, 2, 64, 64}, {5, 2, 4, 256, 512}, {64, 2, 2, 64, 128}, {3, 1, 1, 80, 48}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], H = cases[ci][1], HV = cases[ci][2], K = cases[ci][3], Dv = cases[ci][4];
        char shape[96];
        snprintf(shape, sizeof shape, "N=%d H=%d HV=%d K=%d Dv=%d (per-row states)", N, H, HV, K, Dv);
        const int64_t nq = (int64_t)N * H * K, nv = (int64_t)N * HV * Dv, ns = (int64_t)HV * Dv * K;
        const int64_t dov[4] = {N, 1, HV, Dv}, dst[4] = {N, HV, Dv, K};
        float *q = rnd_unit_rows((int64_t)N * H, K), *k = rnd_unit_rows((int64_t)N * H, K), *v = rnd(nv, 1.0f);
        float *g = tu_hbuf((int64_t)N * HV), *beta = tu_hbuf((int64_t)N * HV), *nan = tu_nans(nv);
        make_gates(g, beta, N, HV);
        const float scale = 1.0f / sqrtf((float)K);
        float *o_ref = tu_hbuf(nv), **s_ref = malloc(sizeof(float *) * N);
        void **rows_h = malloc(sizeof(void *) * N), **rows_d = malloc(sizeof(void *) * N);
        for (int r = 0; r < N; r++) {
            float *s0 = rnd_f32(ns, 0.1f);
            rows_d[r] = tu_dev_f32(gpu, s0, ns);
            rows_h[r] = s_ref[r] = s0;
        }
        void **ptr_d = gpu->alloc(gpu, sizeof(void *) * N);
        assert_non_null(ptr_d);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d, rows_d, sizeof(void *) * N), 0);
        cpu->gdn_recurrent_step(cpu, o_ref, rows_h, q, k, v, g, beta, scale, N, H, HV, K, Dv);
        void *dq = tu_dev_act(gpu, q, nq), *dk = tu_dev_act(gpu, k, nq), *dv = tu_dev_act(gpu, v, nv),
             *d_o = tu_dev_act(gpu, nan, nv);
        float *dg = tu_dev_f32(gpu, g, (int64_t)N * HV), *dbeta = tu_dev_f32(gpu, beta, (int64_t)N * HV);
        gpu->gdn_recurrent_step(gpu, d_o, ptr_d, dq, dk, dv, dg, dbeta, scale, N, H, HV, K, Dv);
        fails += !tu_sync(gpu, "recurrent_step", shape) ||
                 !check_act("recurrent_step o", shape, d_o, o_ref, nv, dov, "btnv", REC_O);
        float *got = tu_hbuf(N * ns), *want = tu_hbuf(N * ns); // every row's state, compared at once
        for (int r = 0; r < N; r++) {
            float *h = tu_host_f32(gpu, rows_d[r], ns);
            memcpy(got + r * ns, h, sizeof(float) * ns), memcpy(want + r * ns, s_ref[r], sizeof(float) * ns);
            free(h);
        }
        fails += !check("recurrent_step state", shape, got, want, N * ns, dst, "bhvk", REC_S);
        free(got), free(want);
        for (int r = 0; r < N; r++)
            free(s_ref[r]), tu_dev_free(gpu, rows_d[r]);
        gpu->free(gpu, ptr_d);
        free(q), free(k), free(v), free(g), free(beta), free(nan), free(o_ref), free(s_ref), free(rows_h), free(rows_d);
        tu_dev_free(gpu, dq), tu_dev_free(gpu, dk), tu_dev_free(gpu, dv), tu_dev_free(gpu, d_o), tu_dev_free(gpu, dg),
            tu_dev_free(gpu, dbeta);
    }
    assert_int_equal(fails, 0);
}

// gdn_step_inputs (a decode step's convs, L2 norms and gates in one call)
// against the CPU's, which runs conv1d_step x 3, l2norm_fwd x 2 and
// gdn_gate_fwd: the projections of N rows in one strided buffer, as a fused
// projection would give them ([q | k | v | a | b | pad] per row), each row's
// q, k, v windows at their own addresses. q, k, v within STEP_QKV, g and beta
// within GATE_F32, the rolled windows exact (bf16 copies of bf16 inputs).
static void test_step_inputs(void **st) {
    setup();
    int fails = 0;
    // N, H, HV, K, Dv, W, allow_neg; the first: SmolLM2's 10MLA20GDN (one head of K 256, Dv 512)
    static const int cases[][7] = {
        {1, 1, 1, 256, 512, 4, 0}, {5, 2, 4, 64, 128, 4, 1}, {3, 1, 1, 80, 48, 3, 0}, {64, 2, 2, 64, 128, 4, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], H = cases[ci][1], HV = cases[ci][2], K = cases[ci][3], Dv = cases[ci][4],
                  W = cases[ci][5], neg = cases[ci][6];
        const int64_t kd = (int64_t)H * K, vd = (int64_t)HV * Dv, ld = 2 * kd + vd + 2 * HV + 3;
        char shape[96];
        snprintf(shape, sizeof shape, "N=%d H=%d HV=%d K=%d Dv=%d W=%d%s", N, H, HV, K, Dv, W, neg ? " neg" : "");
        float *x = rnd((int64_t)N * ld, 1.0f), *qw = rnd(kd * W, 0.5f), *kw = rnd(kd * W, 0.5f),
              *vw = rnd(vd * W, 0.5f), *A_log = unif(HV, 0.0f, 2.8f), *dtb = unif(HV, -5.0f, -2.0f);
        tu_round_bf16(A_log, HV), tu_round_bf16(dtb, HV);
        const int64_t wn[3] = {kd * W, kd * W, vd * W}; // the q, k, v windows of one row
        void **rows_h = calloc((size_t)4 * N, sizeof(void *)), **rows_d = calloc((size_t)4 * N, sizeof(void *));
        for (int j = 0; j < 3; j++)
            for (int r = 0; r < N; r++) {
                float *w0 = rnd(wn[j], 1.0f);
                rows_d[(j + 1) * N + r] = tu_dev_act(gpu, w0, wn[j]);
                rows_h[(j + 1) * N + r] = w0;
            }
        float *q_ref = tu_hbuf(N * kd), *k_ref = tu_hbuf(N * kd), *v_ref = tu_hbuf(N * vd), *g_ref = tu_hbuf(N * HV),
              *b_ref = tu_hbuf(N * HV);
        const float *xa = x + 2 * kd + vd, *xb = xa + HV;
        cpu->gdn_step_inputs(cpu, q_ref, k_ref, v_ref, g_ref, b_ref, rows_h, x, ld, x + kd, ld, x + 2 * kd, ld, xa, ld,
                             xb, ld, qw, kw, vw, A_log, dtb, N, H, HV, K, Dv, W, 1e-6f, neg);
        void **ptr_d = gpu->alloc(gpu, sizeof(void *) * 4 * N);
        assert_non_null(ptr_d);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d, rows_d, sizeof(void *) * 4 * N), 0);
        float *nan = tu_nans(N * (vd > kd ? vd : kd));
        void *dx = tu_dev_act(gpu, x, (int64_t)N * ld), *dqw = tu_dev_act(gpu, qw, kd * W),
             *dkw = tu_dev_act(gpu, kw, kd * W), *dvw = tu_dev_act(gpu, vw, vd * W), *dA = tu_dev_act(gpu, A_log, HV),
             *ddt = tu_dev_act(gpu, dtb, HV);
        void *dq = tu_dev_act(gpu, nan, N * kd), *dk = tu_dev_act(gpu, nan, N * kd), *dv = tu_dev_act(gpu, nan, N * vd);
        float *dg = tu_dev_f32(gpu, nan, N * HV), *dbeta = tu_dev_f32(gpu, nan, N * HV);
        gpu->gdn_step_inputs(gpu, dq, dk, dv, dg, dbeta, ptr_d, dx, ld, tu_gat(gpu, dx, kd), ld,
                             tu_gat(gpu, dx, 2 * kd), ld, tu_gat(gpu, dx, 2 * kd + vd), ld,
                             tu_gat(gpu, dx, 2 * kd + vd + HV), ld, dqw, dkw, dvw, dA, ddt, N, H, HV, K, Dv, W, 1e-6f,
                             neg);
        const int64_t dqk[4] = {1, N, H, K}, dvv[4] = {1, N, HV, Dv}, dgt[4] = {1, 1, N, HV};
        fails += !tu_sync(gpu, "step_inputs", shape) ||
                 !check_act("step_inputs q", shape, dq, q_ref, N * kd, dqk, "-rhk", STEP_QKV) ||
                 !check_act("step_inputs k", shape, dk, k_ref, N * kd, dqk, "-rhk", STEP_QKV) ||
                 !check_act("step_inputs v", shape, dv, v_ref, N * vd, dvv, "-rhv", STEP_QKV) ||
                 !check_f32("step_inputs g", shape, dg, g_ref, N * HV, dgt, "--rh", GATE_F32) ||
                 !check_f32("step_inputs beta", shape, dbeta, b_ref, N * HV, dgt, "--rh", GATE_F32);
        static const char *wname[3] = {"step_inputs q window", "step_inputs k window", "step_inputs v window"};
        for (int j = 0; j < 3; j++) { // every row's window after the roll, compared at once
            float *got = tu_hbuf(N * wn[j]), *want = tu_hbuf(N * wn[j]);
            for (int r = 0; r < N; r++) {
                float *h = tu_host_act(gpu, rows_d[(j + 1) * N + r], wn[j]);
                memcpy(got + r * wn[j], h, sizeof(float) * wn[j]);
                memcpy(want + r * wn[j], rows_h[(j + 1) * N + r], sizeof(float) * wn[j]);
                free(h);
            }
            const int64_t dw[4] = {1, 1, N, wn[j]};
            fails += !check(wname[j], shape, got, want, N * wn[j], dw, "--rc", 0.0);
            free(got), free(want);
        }
        for (int i = N; i < 4 * N; i++)
            free(rows_h[i]), tu_dev_free(gpu, rows_d[i]);
        gpu->free(gpu, ptr_d);
        free(rows_h), free(rows_d), free(x), free(qw), free(kw), free(vw), free(A_log), free(dtb), free(nan);
        free(q_ref), free(k_ref), free(v_ref), free(g_ref), free(b_ref);
        tu_dev_free(gpu, dx), tu_dev_free(gpu, dqw), tu_dev_free(gpu, dkw), tu_dev_free(gpu, dvw), tu_dev_free(gpu, dA),
            tu_dev_free(gpu, ddt), tu_dev_free(gpu, dq), tu_dev_free(gpu, dk), tu_dev_free(gpu, dv),
            tu_dev_free(gpu, dg), tu_dev_free(gpu, dbeta);
    }
    assert_int_equal(fails, 0);
}

// Every row's buffer j of a decode step (rows[j N + r]: j = 0 the states,
// fp32; 1, 2, 3 the q, k, v windows, act) in one host array, row after row.
static float *rows_host(void *const *rows_d, int N, int j, int64_t n) {
    float *out = tu_hbuf(N * n);
    for (int r = 0; r < N; r++) {
        float *h = j ? tu_host_act(gpu, rows_d[j * N + r], n) : tu_host_f32(gpu, rows_d[j * N + r], n);
        memcpy(out + r * n, h, sizeof(float) * n);
        free(h);
    }
    return out;
}
static float *rows_cat(void *const *rows_h, int N, int j, int64_t n) {
    float *out = tu_hbuf(N * n);
    for (int r = 0; r < N; r++)
        memcpy(out + r * n, rows_h[j * N + r], sizeof(float) * n);
    return out;
}

// gdn_step: a whole decode step in one call (on the GPU one launch of
// k_gdn_step, or its three kernels for a shape k_gdn_step does not take)
// against the CPU's (gdn_step_inputs, gdn_recurrent_step and the output norm
// in sequence), and against the GPU's own three ops on copies of the same
// states and windows. Three steps in a row on every row's state and windows,
// fresh projections each step, one strided buffer as the joint product gives
// them ([q | k | v | a | b | z | pad] per row). Each step's y within STEP_Y of
// the CPU's and FUSED_Y of the three ops'; after the last step the states
// within STEP_S of the CPU's and REC_S of the three ops', the windows exact.
static void test_step(void **st) {
    setup();
    int fails = 0;
    // N, H, HV, K, Dv, W, allow_neg, use_gate. SmolLM2's 10MLA20GDN (one head
    // of K 256, Dv 512: clusters of 8 blocks of 64 rows); HyLo-Llama-1B's and
    // -3B's (6, 9 heads); grouped values (G = 2: 4 blocks a head) over 64 rows;
    // without the gate; K = 80 (20 lanes) with Dv = 48 (one block, 6 warps);
    // G = 8 (a cluster of 8 value heads); test_cuda_model's shape; Dv = 99 (2
    // slices of 50 and 49 rows); G = 3, which k_gdn_step does not take.
    static const int cases[][8] = {{1, 1, 1, 256, 512, 4, 0, 1}, {2, 6, 6, 256, 512, 4, 0, 1},
                                   {1, 9, 9, 256, 512, 4, 0, 1}, {64, 2, 4, 128, 256, 4, 1, 1},
                                   {3, 2, 2, 64, 128, 4, 0, 0},  {5, 1, 1, 80, 48, 3, 0, 1},
                                   {4, 1, 8, 64, 64, 4, 0, 0},   {1, 2, 2, 32, 32, 4, 0, 1},
                                   {2, 1, 1, 64, 99, 4, 0, 1},   {2, 1, 3, 64, 64, 4, 0, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], H = cases[ci][1], HV = cases[ci][2], K = cases[ci][3], Dv = cases[ci][4],
                  W = cases[ci][5], neg = cases[ci][6], gate = cases[ci][7];
        const int64_t kd = (int64_t)H * K, vd = (int64_t)HV * Dv, ld = 2 * kd + vd + 2 * HV + vd + 3;
        const int64_t oa = 2 * kd + vd, ob = oa + HV, oz = ob + HV; // a, b, z in a row of the projections
        const float scale = 1.0f / sqrtf((float)K), eps = 1e-6f;
        char shape[96];
        snprintf(shape, sizeof shape, "N=%d H=%d HV=%d K=%d Dv=%d W=%d%s%s", N, H, HV, K, Dv, W, neg ? " neg" : "",
                 gate ? "" : " no gate");
        float *qw = rnd(kd * W, 0.5f), *kw = rnd(kd * W, 0.5f), *vw = rnd(vd * W, 0.5f), *A_log = unif(HV, 0.0f, 2.8f),
              *dtb = unif(HV, -5.0f, -2.0f), *onorm = unif(Dv, 0.5f, 1.5f);
        tu_round_bf16(A_log, HV), tu_round_bf16(dtb, HV), tu_round_bf16(onorm, Dv);
        void *dqw = tu_dev_act(gpu, qw, kd * W), *dkw = tu_dev_act(gpu, kw, kd * W), *dvw = tu_dev_act(gpu, vw, vd * W),
             *dA = tu_dev_act(gpu, A_log, HV), *ddt = tu_dev_act(gpu, dtb, HV), *dnorm = tu_dev_act(gpu, onorm, Dv);
        // every row's state and windows: the CPU's, the fused op's and the three ops' (GPU)
        const int64_t n[4] = {vd * K, kd * W, kd * W, vd * W};
        void **rows_h = calloc((size_t)4 * N, sizeof(void *)), **rows_f = calloc((size_t)4 * N, sizeof(void *)),
             **rows_u = calloc((size_t)4 * N, sizeof(void *));
        for (int j = 0; j < 4; j++)
            for (int r = 0; r < N; r++) {
                float *h = j ? rnd(n[j], 1.0f) : rnd_f32(n[j], 0.1f);
                rows_h[j * N + r] = h;
                rows_f[j * N + r] = j ? tu_dev_act(gpu, h, n[j]) : (void *)tu_dev_f32(gpu, h, n[j]);
                rows_u[j * N + r] = j ? tu_dev_act(gpu, h, n[j]) : (void *)tu_dev_f32(gpu, h, n[j]);
            }
        void **ptr_f = gpu->alloc(gpu, sizeof(void *) * 4 * N), **ptr_u = gpu->alloc(gpu, sizeof(void *) * 4 * N);
        assert_true(ptr_f && ptr_u);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_f, rows_f, sizeof(void *) * 4 * N), 0);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_u, rows_u, sizeof(void *) * 4 * N), 0);
        float *nan = tu_nans(N * vd), *y_ref = tu_hbuf(N * vd);
        void *dy = tu_dev_act(gpu, nan, N * vd), *dyu = tu_dev_act(gpu, nan, N * vd),
             *dq = tu_dev_act(gpu, nan, N * kd), *dk = tu_dev_act(gpu, nan, N * kd), *dv = tu_dev_act(gpu, nan, N * vd),
             *d_o = tu_dev_act(gpu, nan, N * vd);
        float *dg = tu_dev_f32(gpu, nan, N * HV), *dbeta = tu_dev_f32(gpu, nan, N * HV);
        const int64_t dyv[4] = {1, N, HV, Dv};
        for (int t = 0; t < 3; t++) {
            char sh[128];
            snprintf(sh, sizeof sh, "%s step %d", shape, t + 1);
            float *x = rnd(N * ld, 1.0f);
            void *dx = tu_dev_act(gpu, x, N * ld);
            cpu->gdn_step(cpu, y_ref, rows_h, x, ld, x + kd, ld, x + 2 * kd, ld, x + oa, ld, x + ob, ld,
                          gate ? x + oz : NULL, ld, qw, kw, vw, A_log, dtb, onorm, scale, N, H, HV, K, Dv, W, 1e-6f,
                          eps, neg);
            tu_upload_act(gpu, dy, nan, N * vd), tu_upload_act(gpu, dyu, nan, N * vd);
            gpu->gdn_step(gpu, dy, ptr_f, dx, ld, tu_gat(gpu, dx, kd), ld, tu_gat(gpu, dx, 2 * kd), ld,
                          tu_gat(gpu, dx, oa), ld, tu_gat(gpu, dx, ob), ld, gate ? tu_gat(gpu, dx, oz) : NULL, ld, dqw,
                          dkw, dvw, dA, ddt, dnorm, scale, N, H, HV, K, Dv, W, 1e-6f, eps, neg);
            gpu->gdn_step_inputs(gpu, dq, dk, dv, dg, dbeta, ptr_u, dx, ld, tu_gat(gpu, dx, kd), ld,
                                 tu_gat(gpu, dx, 2 * kd), ld, tu_gat(gpu, dx, oa), ld, tu_gat(gpu, dx, ob), ld, dqw,
                                 dkw, dvw, dA, ddt, N, H, HV, K, Dv, W, 1e-6f, neg);
            gpu->gdn_recurrent_step(gpu, d_o, ptr_u, dq, dk, dv, dg, dbeta, scale, N, H, HV, K, Dv);
            if (gate)
                gpu->gated_rmsnorm_fwd(gpu, dyu, NULL, d_o, tu_gat(gpu, dx, oz), ld, dnorm, Dv, N, HV, Dv, eps,
                                       GNORM_NORM_THEN_GATE);
            else
                gpu->rmsnorm_fwd(gpu, dyu, NULL, d_o, dnorm, (int64_t)N * HV, Dv, eps);
            float *yu = tu_host_act(gpu, dyu, N * vd);
            fails +=
                !tu_sync(gpu, "gdn_step", sh) || !check_act("gdn_step y", sh, dy, y_ref, N * vd, dyv, "-rhv", STEP_Y);
            fails += !check_act("gdn_step y vs 3 ops", sh, dy, yu, N * vd, dyv, "-rhv", FUSED_Y);
            free(x), free(yu);
            tu_dev_free(gpu, dx);
        }
        static const char *what[4] = {"gdn_step state", "gdn_step q window", "gdn_step k window", "gdn_step v window"};
        for (int j = 0; j < 4; j++) {
            float *got = rows_host(rows_f, N, j, n[j]), *want = rows_cat(rows_h, N, j, n[j]),
                  *other = rows_host(rows_u, N, j, n[j]);
            const int64_t dd[4] = {1, 1, N, n[j]};
            char op[64];
            fails += !check(what[j], shape, got, want, N * n[j], dd, "--rc", j ? 0.0 : STEP_S);
            snprintf(op, sizeof op, "%s vs 3 ops", what[j]);
            fails += !check(op, shape, got, other, N * n[j], dd, "--rc", j ? 0.0 : REC_S);
            free(got), free(want), free(other);
        }
        for (int i = 0; i < 4 * N; i++)
            free(rows_h[i]), tu_dev_free(gpu, rows_f[i]), tu_dev_free(gpu, rows_u[i]);
        gpu->free(gpu, ptr_f), gpu->free(gpu, ptr_u);
        free(rows_h), free(rows_f), free(rows_u), free(qw), free(kw), free(vw), free(A_log), free(dtb), free(onorm);
        free(nan), free(y_ref);
        tu_dev_free(gpu, dqw), tu_dev_free(gpu, dkw), tu_dev_free(gpu, dvw), tu_dev_free(gpu, dA),
            tu_dev_free(gpu, ddt), tu_dev_free(gpu, dnorm), tu_dev_free(gpu, dy), tu_dev_free(gpu, dyu),
            tu_dev_free(gpu, dq);
        tu_dev_free(gpu, dk), tu_dev_free(gpu, dv), tu_dev_free(gpu, d_o), tu_dev_free(gpu, dg),
            tu_dev_free(gpu, dbeta);
    }
    assert_int_equal(fails, 0);
}

// ==== chunked rule ==================================================================

typedef struct {
    int B, T, H, HV, K, Dv;
    int mode; // 0: no state (training); 1: state given, init 0 (final written); 2: initial state, final written
} ccase_t;

// tag: the kernel variant's name in the printed shape ("" for the default)
static int chunk_case(ccase_t c, const char *tag) {
    const int B = c.B, T = c.T, H = c.H, HV = c.HV, K = c.K, Dv = c.Dv;
    char shape[160];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d HV=%d K=%d Dv=%d %s%s", B, T, H, HV, K, Dv,
             c.mode == 0   ? "no state"
             : c.mode == 1 ? "state out"
                           : "state in/out",
             tag);
    const int64_t N = (int64_t)B * T, nq = N * H * K, nv = N * HV * Dv, ng = N * HV, ns = (int64_t)B * HV * Dv * K;
    const int64_t dqk[4] = {B, T, H, K}, dov[4] = {B, T, HV, Dv}, dgt[4] = {1, B, T, HV}, dst[4] = {B, HV, Dv, K};
    const float scale = 1.0f / sqrtf((float)K);
    int fails = 0;
    float *q = rnd_unit_rows(N * H, K), *k = rnd_unit_rows(N * H, K), *v = rnd(nv, 1.0f);
    float *g = tu_hbuf(ng), *beta = tu_hbuf(ng), *s0 = rnd_f32(ns, 0.1f);
    make_gates(g, beta, N, HV);
    float *dout = rnd(nv, 1.0f), *dsf = rnd_f32(ns, 0.1f);

    // forward
    float *o_ref = tu_hbuf(nv), *s_ref = c.mode == 2 ? tu_hdup(s0, ns) : tu_nans(ns);
    cpu->gdn_chunk_fwd(cpu, o_ref, c.mode ? s_ref : NULL, c.mode == 2, q, k, v, g, beta, scale, B, T, H, HV, K, Dv);
    float *nan_v = tu_nans(nv), *nan_s = tu_nans(ns), *nan_q = tu_nans(nq), *nan_g = tu_nans(ng);
    void *dq_ = tu_dev_act(gpu, q, nq), *dk_ = tu_dev_act(gpu, k, nq), *dv_ = tu_dev_act(gpu, v, nv),
         *d_o = tu_dev_act(gpu, nan_v, nv);
    float *dg_ = tu_dev_f32(gpu, g, ng), *dbeta_ = tu_dev_f32(gpu, beta, ng);
    float *d_s = c.mode ? tu_dev_f32(gpu, c.mode == 2 ? s0 : nan_s, ns) : NULL; // mode 1: the state must not be read
    gpu->gdn_chunk_fwd(gpu, d_o, d_s, c.mode == 2, dq_, dk_, dv_, dg_, dbeta_, scale, B, T, H, HV, K, Dv);
    fails +=
        !tu_sync(gpu, "chunk_fwd", shape) || !check_act("chunk_fwd o", shape, d_o, o_ref, nv, dov, "btnv", CHUNK_O);
    if (c.mode) fails += !check_f32("chunk_fwd state", shape, d_s, s_ref, ns, dst, "bhvk", CHUNK_S);
    { // repeat
        void *d_o2 = tu_dev_act(gpu, nan_v, nv);
        float *d_s2 = c.mode ? tu_dev_f32(gpu, c.mode == 2 ? s0 : nan_s, ns) : NULL;
        gpu->gdn_chunk_fwd(gpu, d_o2, d_s2, c.mode == 2, dq_, dk_, dv_, dg_, dbeta_, scale, B, T, H, HV, K, Dv);
        fails += !tu_sync(gpu, "chunk_fwd repeat", shape) || !same_bits("chunk_fwd o", shape, d_o, d_o2, nv, 1);
        if (c.mode) fails += !same_bits("chunk_fwd state", shape, d_s, d_s2, ns, 0);
        tu_dev_free(gpu, d_o2), tu_dev_free(gpu, d_s2);
    }

    // backward (dstate_final nonzero whenever the forward produced a final state)
    float *dq_ref = tu_hbuf(nq), *dk_ref = tu_hbuf(nq), *dv_ref = tu_hbuf(nv), *dg_ref = tu_hbuf(ng),
          *db_ref = tu_hbuf(ng);
    float *ds0_ref = tu_hbuf(ns);
    cpu->gdn_chunk_bwd(cpu, dq_ref, dk_ref, dv_ref, dg_ref, db_ref, c.mode == 2 ? ds0_ref : NULL, dout,
                       c.mode ? dsf : NULL, q, k, v, g, beta, c.mode == 2 ? s0 : NULL, scale, B, T, H, HV, K, Dv);
    void *d_dout = tu_dev_act(gpu, dout, nv), *d_dq = tu_dev_act(gpu, nan_q, nq), *d_dk = tu_dev_act(gpu, nan_q, nq),
         *d_dv = tu_dev_act(gpu, nan_v, nv);
    float *d_dg = tu_dev_f32(gpu, nan_g, ng), *d_db = tu_dev_f32(gpu, nan_g, ng),
          *d_ds0 = c.mode == 2 ? tu_dev_f32(gpu, nan_s, ns) : NULL;
    float *d_dsf = c.mode ? tu_dev_f32(gpu, dsf, ns) : NULL, *d_s0 = c.mode == 2 ? tu_dev_f32(gpu, s0, ns) : NULL;
    gpu->gdn_chunk_bwd(gpu, d_dq, d_dk, d_dv, d_dg, d_db, d_ds0, d_dout, d_dsf, dq_, dk_, dv_, dg_, dbeta_, d_s0, scale,
                       B, T, H, HV, K, Dv);
    if (tu_sync(gpu, "chunk_bwd", shape)) {
        fails += !check_act("chunk_bwd dq", shape, d_dq, dq_ref, nq, dqk, "btnk", CHUNK_G);
        fails += !check_act("chunk_bwd dk", shape, d_dk, dk_ref, nq, dqk, "btnk", CHUNK_G);
        fails += !check_act("chunk_bwd dv", shape, d_dv, dv_ref, nv, dov, "btnv", CHUNK_G);
        fails += !check_f32("chunk_bwd dg", shape, d_dg, dg_ref, ng, dgt, "-btn", CHUNK_GB);
        fails += !check_f32("chunk_bwd dbeta", shape, d_db, db_ref, ng, dgt, "-btn", CHUNK_GB);
        if (c.mode == 2) fails += !check_f32("chunk_bwd dstate0", shape, d_ds0, ds0_ref, ns, dst, "bhvk", CHUNK_G);
        // repeat
        void *r_dq = tu_dev_act(gpu, nan_q, nq), *r_dk = tu_dev_act(gpu, nan_q, nq), *r_dv = tu_dev_act(gpu, nan_v, nv);
        float *r_dg = tu_dev_f32(gpu, nan_g, ng), *r_db = tu_dev_f32(gpu, nan_g, ng),
              *r_ds0 = c.mode == 2 ? tu_dev_f32(gpu, nan_s, ns) : NULL;
        gpu->gdn_chunk_bwd(gpu, r_dq, r_dk, r_dv, r_dg, r_db, r_ds0, d_dout, d_dsf, dq_, dk_, dv_, dg_, dbeta_, d_s0,
                           scale, B, T, H, HV, K, Dv);
        if (tu_sync(gpu, "chunk_bwd repeat", shape)) {
            fails += !same_bits("chunk_bwd dq", shape, d_dq, r_dq, nq, 1) +
                     !same_bits("chunk_bwd dk", shape, d_dk, r_dk, nq, 1);
            fails += !same_bits("chunk_bwd dv", shape, d_dv, r_dv, nv, 1) +
                     !same_bits("chunk_bwd dg", shape, d_dg, r_dg, ng, 0);
            fails += !same_bits("chunk_bwd dbeta", shape, d_db, r_db, ng, 0);
            if (c.mode == 2) fails += !same_bits("chunk_bwd dstate0", shape, d_ds0, r_ds0, ns, 0);
        } else {
            fails++;
        }
        tu_dev_free(gpu, r_dq), tu_dev_free(gpu, r_dk), tu_dev_free(gpu, r_dv), tu_dev_free(gpu, r_dg),
            tu_dev_free(gpu, r_db), tu_dev_free(gpu, r_ds0);
    } else {
        fails++;
    }
    free(q), free(k), free(v), free(g), free(beta), free(s0), free(dout), free(dsf), free(o_ref), free(s_ref);
    free(nan_v), free(nan_s), free(nan_q), free(nan_g), free(dq_ref), free(dk_ref), free(dv_ref), free(dg_ref);
    free(db_ref), free(ds0_ref);
    tu_dev_free(gpu, dq_), tu_dev_free(gpu, dk_), tu_dev_free(gpu, dv_), tu_dev_free(gpu, d_o), tu_dev_free(gpu, dg_),
        tu_dev_free(gpu, dbeta_), tu_dev_free(gpu, d_s), tu_dev_free(gpu, d_dout), tu_dev_free(gpu, d_dq);
    tu_dev_free(gpu, d_dk), tu_dev_free(gpu, d_dv), tu_dev_free(gpu, d_dg), tu_dev_free(gpu, d_db),
        tu_dev_free(gpu, d_ds0), tu_dev_free(gpu, d_dsf), tu_dev_free(gpu, d_s0);
    return fails;
}

// T in {1, 63, 64, 65, 130, 1000} (one token, a short chunk, exact chunks, a
// one-token tail, several chunks, many chunks), B in {1, 2}, H = 2 with HV in
// {2, 4} (GVA), K in {64, 128, 256} with Dv in {64, 128, 256, 512}, each
// state mode; plus K = 80, Dv = 48 (K and Dv not multiples of 64: padded
// columns, partial Dv tiles). HyLo's layer is K = 256, Dv = 512.
static const ccase_t CHUNK_CASES[] = {
    {1, 1, 2, 2, 64, 64, 0},    {2, 1, 2, 4, 256, 512, 2},   {1, 63, 2, 4, 128, 256, 2},   {2, 64, 2, 2, 64, 128, 1},
    {1, 64, 2, 2, 256, 512, 2}, {2, 65, 2, 4, 128, 64, 2},   {1, 65, 2, 2, 256, 256, 0},   {2, 130, 2, 2, 128, 128, 2},
    {1, 130, 2, 4, 64, 512, 1}, {2, 130, 2, 4, 256, 512, 2}, {1, 1000, 2, 2, 256, 512, 2}, {2, 1000, 2, 4, 128, 256, 0},
    {2, 1000, 2, 2, 64, 64, 2}, {1, 100, 2, 2, 80, 48, 2},   {1, 200, 2, 4, 256, 64, 1},
};

#ifdef HYLO_BENCH_VARIANTS
// Sets (val) or clears (NULL) a kernel variant knob of the bench-variants build.
static void set_knob(const char *name, const char *val) {
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
}
#endif

// Every case under the default kernels; in the bench-variants build also under
// HYLO_GDN_STATE = 2 (the mma.sync state passes, k_state), with fresh inputs.
static void test_chunk(void **st) {
    setup();
    int fails = 0;
    const char *only = getenv("HYLO_GDN_TEST_CASES"); // e.g. "0,3,10": a subset, for quick runs
#ifdef HYLO_BENCH_VARIANTS
    static const char *vars[] = {NULL, "2"}, *tags[] = {"", " [state mma.sync]"};
#else
    static const char *vars[] = {NULL}, *tags[] = {""};
#endif
    for (int var = 0; var < (int)(sizeof vars / sizeof vars[0]); var++) {
#ifdef HYLO_BENCH_VARIANTS
        set_knob("HYLO_GDN_STATE", vars[var]);
#endif
        for (size_t i = 0; i < sizeof CHUNK_CASES / sizeof CHUNK_CASES[0]; i++) {
            if (only && !tu_list_has(only, (long)i)) continue;
            fails += chunk_case(CHUNK_CASES[i], tags[var]);
        }
    }
#ifdef HYLO_BENCH_VARIANTS
    set_knob("HYLO_GDN_STATE", NULL);
#endif
    assert_int_equal(fails, 0);
}

// Too small an arena must be an error naming the bytes needed, with NaN outputs.
static void test_chunk_small_scratch(void **st) {
    setup();
    if (tu_fake_gpu()) skip(); // the CPU op reports a full arena differently
    const int B = 1, T = 70, H = 1, HV = 1, K = 64, Dv = 64;
    const int64_t nq = (int64_t)B * T * H * K, nv = (int64_t)B * T * HV * Dv;
    float *q = rnd_unit_rows((int64_t)B * T * H, K), *v = rnd(nv, 1.0f), *g = tu_hbuf(B * T), *beta = tu_hbuf(B * T);
    make_gates(g, beta, (int64_t)B * T, HV);
    void *dq = tu_dev_act(gpu, q, nq), *dv = tu_dev_act(gpu, v, nv), *d_o = tu_dev_act(gpu, v, nv);
    float *dg = tu_dev_f32(gpu, g, B * T), *dbeta = tu_dev_f32(gpu, beta, B * T);
    size_t mark = arena_mark(&gpu->scratch);
    gpu->scratch.used = gpu->scratch.cap - 1024;
    gpu->gdn_chunk_fwd(gpu, d_o, NULL, 0, dq, dq, dv, dg, dbeta, 0.125f, B, T, H, HV, K, Dv);
    int rc = gpu->sync(gpu);
    printf("small scratch: rc %d: %s\n", rc, rc ? err_msg() : "(no error)");
    arena_reset(&gpu->scratch, mark);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err_msg(), "scratch"));
    float *o = tu_host_act(gpu, d_o, nv);
    assert_true(isnan(o[0]) && isnan(o[nv - 1]));
    free(o), free(q), free(v), free(g), free(beta);
    tu_dev_free(gpu, dq), tu_dev_free(gpu, dv), tu_dev_free(gpu, d_o), tu_dev_free(gpu, dg), tu_dev_free(gpu, dbeta);
}

// ==== packed sequences (gdn_chunk_seqs) ================================================

// Sequences of the given lengths packed row after row, sequence s's state in
// slot slot[s] of one buffer. The cases reach each way the CUDA op runs a
// group (cuda.h cu_seqs_groups): padded copies with a sequence of no rows
// among them and states scattered; rows and states already a batch (one
// uniform call in place); rows in place but states copied; one sequence;
// two groups (the second started by the padding bound, then alone).
typedef struct {
    int n, len[6], slot[6];
} seqs_case_t;
static const seqs_case_t SEQS_CASES[] = {
    {5, {130, 1, 64, 0, 130}, {4, 0, 2, 1, 3}},
    {3, {64, 64, 64}, {0, 1, 2}},
    {3, {64, 64, 64}, {2, 0, 1}},
    {1, {200}, {0}},
    {3, {300, 10, 10}, {1, 2, 0}},
};

// GPU against the CPU op (itself gdn_chunk_fwd per sequence): outputs
// CHUNK_O, states CHUNK_S (the same kernels and roundings as one batch), a
// state of a sequence of no rows unchanged bit for bit.
static void test_chunk_seqs(void **st) {
    setup();
    const int H = 2, HV = 4, K = 128, Dv = 64;
    const float scale = 1.0f / sqrtf((float)K);
    const int64_t SS = (int64_t)HV * Dv * K;
    int fails = 0;
    for (size_t ci = 0; ci < sizeof SEQS_CASES / sizeof SEQS_CASES[0]; ci++) {
        const seqs_case_t *c = &SEQS_CASES[ci];
        int32_t cu[7] = {0};
        char shape[160];
        int at = snprintf(shape, sizeof shape, "H=%d HV=%d K=%d Dv=%d lens", H, HV, K, Dv);
        for (int s = 0; s < c->n; s++) {
            cu[s + 1] = cu[s] + c->len[s];
            at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%d@%d", s ? "," : " ", c->len[s], c->slot[s]);
        }
        const int64_t N = cu[c->n], nq = N * H * K, nv = N * HV * Dv, ng = N * HV, ns = c->n * SS;
        const int64_t dov[4] = {1, N, HV, Dv}, dst[4] = {1, c->n * HV, Dv, K};
        float *q = rnd_unit_rows(N * H, K), *k = rnd_unit_rows(N * H, K), *v = rnd(nv, 1.0f);
        float *g = tu_hbuf(ng), *beta = tu_hbuf(ng), *s_ref = rnd_f32(ns, 0.1f), *o_ref = tu_hbuf(nv);
        make_gates(g, beta, N, HV);
        float *nan_v = tu_nans(nv);
        void *dq_ = tu_dev_act(gpu, q, nq), *dk_ = tu_dev_act(gpu, k, nq), *dv_ = tu_dev_act(gpu, v, nv),
             *d_o = tu_dev_act(gpu, nan_v, nv);
        float *dg_ = tu_dev_f32(gpu, g, ng), *db_ = tu_dev_f32(gpu, beta, ng), *d_s = tu_dev_f32(gpu, s_ref, ns);
        float *s0 = tu_hdup(s_ref, ns);
        void *hp[6], *dp[6];
        for (int s = 0; s < c->n; s++)
            hp[s] = s_ref + c->slot[s] * SS, dp[s] = d_s + c->slot[s] * SS;
        const be_seqs_t sq = {c->n, cu};
        cpu->gdn_chunk_seqs(cpu, o_ref, hp, q, k, v, g, beta, scale, sq, H, HV, K, Dv);
        gpu->gdn_chunk_seqs(gpu, d_o, dp, dq_, dk_, dv_, dg_, db_, scale, sq, H, HV, K, Dv);
        if (tu_sync(gpu, "chunk_seqs", shape)) {
            fails += !check_act("chunk_seqs o", shape, d_o, o_ref, nv, dov, "btnv", CHUNK_O);
            fails += !check_f32("chunk_seqs states", shape, d_s, s_ref, ns, dst, "-hvk", CHUNK_S);
            float *got = tu_host_f32(gpu, d_s, ns);
            for (int s = 0; s < c->n; s++)
                if (!c->len[s] && memcmp(got + c->slot[s] * SS, s0 + c->slot[s] * SS, (size_t)SS * sizeof(float))) {
                    printf("FAIL chunk_seqs: the state of sequence %d (no rows) changed\n", s);
                    fails++;
                }
            free(got);
        } else {
            fails++;
        }
        free(q), free(k), free(v), free(g), free(beta), free(s_ref), free(o_ref), free(nan_v), free(s0);
        tu_dev_free(gpu, dq_), tu_dev_free(gpu, dk_), tu_dev_free(gpu, dv_), tu_dev_free(gpu, d_o);
        tu_dev_free(gpu, dg_), tu_dev_free(gpu, db_), tu_dev_free(gpu, d_s);
    }
    assert_int_equal(fails, 0);
}

// ==== whole layer =====================================================================

// Per value head h, the sizes of the terms of the CPU layer's dA_log[h] and
// ddt_bias[h] (LAYER_TERMS): each sums dg_t times a factor of one sign (g_t <
// 0, and -A softplus'(c_t) < 0), so gdn_gate_bwd given |dg| sums minus their
// magnitudes. dg is recomputed from the CPU forward's saved values through
// the ops gdn_backward calls before the gates; as a check of that, the same
// sums over the signed dg go to dA, ddt, which must equal the CPU layer's.
static void gate_grad_terms(const gdn_dims_t *g, int d, const gdn_w_t *w, const gdn_saved_t *s, const float *dout,
                            float *tA, float *tdt, float *dA, float *ddt) {
    const int H = g->n_heads, HV = g->n_v_heads, K = g->head_k, Dv = g->head_v;
    const int64_t N = (int64_t)s->B * s->T, kd = (int64_t)H * K, vd = (int64_t)HV * Dv;
    float *dy = tu_hbuf(N * vd), *dO = tu_hbuf(N * vd), *dz = tu_hbuf(N * vd), *dq = tu_hbuf(N * kd),
          *dk = tu_hbuf(N * kd), *dv = tu_hbuf(N * vd), *dg = tu_hbuf(N * HV), *dbeta = tu_hbuf(N * HV),
          *da = tu_hbuf(N * HV), *db = tu_hbuf(N * HV);
    float *dWo = calloc((size_t)(d * vd), sizeof(float)), *dnorm = calloc((size_t)Dv, sizeof(float));
    lin_bwd(cpu, dy, 0, dWo, dout, s->y, w->o_proj, N, vd, d);
    cpu->gated_rmsnorm_bwd(cpu, dO, dz, vd, dnorm, dy, s->o, s->z, vd, w->o_norm, Dv, s->rstd, N, HV, Dv,
                           GNORM_NORM_THEN_GATE);
    cpu->gdn_chunk_bwd(cpu, dq, dk, dv, dg, dbeta, NULL, dO, NULL, s->q, s->k, s->v, s->g, s->beta, NULL,
                       1.0f / sqrtf((float)K), s->B, s->T, H, HV, K, Dv);
    memset(dA, 0, sizeof(float) * HV), memset(ddt, 0, sizeof(float) * HV);
    cpu->gdn_gate_bwd(cpu, da, HV, db, HV, dA, ddt, dg, dbeta, s->a, HV, s->b, HV, w->A_log, w->dt_bias, N, HV,
                      g->allow_neg_eigval);
    for (int64_t i = 0; i < N * HV; i++)
        dg[i] = fabsf(dg[i]);
    memset(tA, 0, sizeof(float) * HV), memset(tdt, 0, sizeof(float) * HV);
    cpu->gdn_gate_bwd(cpu, da, HV, db, HV, tA, tdt, dg, dbeta, s->a, HV, s->b, HV, w->A_log, w->dt_bias, N, HV,
                      g->allow_neg_eigval);
    for (int h = 0; h < HV; h++)
        tA[h] = -tA[h], tdt[h] = -tdt[h];
    free(dy), free(dO), free(dz), free(dq), free(dk), free(dv), free(dg), free(dbeta), free(da), free(db);
    free(dWo), free(dnorm);
}

// Per head: |got - ref| <= LAYER_TERMS * terms (printed as the ratio); ref
// must also equal recomputed (the CPU's own sum, 1e-5 of the terms: float
// order). Returns 1 when every head holds.
static int check_scalar(const char *op, const char *shape, const float *got, const float *ref, const float *recomputed,
                        const float *terms, int n) {
    double worst = 0, worst_re = 0;
    for (int h = 0; h < n; h++) {
        double t = terms[h] > 0 ? terms[h] : 1e-30;
        double e = fabs((double)got[h] - ref[h]) / t, r = fabs((double)recomputed[h] - ref[h]) / t;
        if (!(e <= worst)) worst = e;
        if (!(r <= worst_re)) worst_re = r;
    }
    int ok = worst <= LAYER_TERMS && worst_re <= 1e-5;
    printf("%s %-22s %-58s err/terms %.3e (tol %.0e) ref vs recomputed %.1e, head 0: ref %.3e terms %.3e\n",
           ok ? "ok  " : "FAIL", op, shape, worst, LAYER_TERMS, worst_re, ref[0], terms[0]);
    return ok;
}

// gdn_forward / gdn_backward (model/gdn.c) on both backends with the same
// (bf16-rounded) weights, d = 576 (SmolLM2-135M's width), gate on, conv 4,
// B = 2, T = 200 (four chunks, the last short), heads g. The per-head
// gradients are held to LAYER_TERMS of their terms. Returns the number of
// failed checks.
static int layer_case(gdn_dims_t g) {
    const int B = 2, T = 200, d = 576;
    arch_t a;
    arch_init(&a);
    a.d = d, a.n_layers = 1, a.V = 16, a.ffn = 8, a.H = 9, a.Hkv = 3;
    a.kind[0] = LAYER_GDN;
    a.gdn = g;
    ptable_t pt;
    assert_int_equal(ptable_build(&pt, &a), 0);
    // weights N(0, 0.02^2) as a fresh FLA model, norms 1 + N(0, 0.1^2); decays as FLA's init
    float *w = tu_params(&pt, 31, 0.02f);
    gdn_w_t hw, hg, dw, dgw;
    float *gflat = calloc((size_t)pt.total, sizeof(float));
    assert_int_equal(gdn_w_bind(&hw, &pt, w, sizeof(float), 0), 0);
    tu_randu(hw.A_log, g.n_v_heads, 32, 0.0f, 2.8f);
    tu_randu(hw.dt_bias, g.n_v_heads, 33, -5.0f, -2.0f);
    tu_round_bf16(w, pt.total);
    assert_int_equal(gdn_w_bind(&hg, &pt, gflat, sizeof(float), 0), 0);
    void *wdev = tu_dev_act(gpu, w, pt.total);
    float *gdev = tu_dev_f32(gpu, gflat, pt.total);
    assert_int_equal(gdn_w_bind(&dw, &pt, wdev, gpu->act_size, 0), 0);
    assert_int_equal(gdn_w_bind(&dgw, &pt, gdev, sizeof(float), 0), 0);

    layer_ctx_t cc, gc;
    tu_ctx(&cc, &a, 0);
    memset(&gc, 0, sizeof gc);
    gc.be = gpu, gc.a = &a, gc.layer = 0;
    arena_t garena;
    size_t gcap = (size_t)512 << 20;
    void *gbase = gpu->alloc(gpu, gcap);
    assert_non_null(gbase);
    arena_init(&garena, gbase, gcap, "test gpu arena");
    gc.arena = &garena;

    const int64_t nx = (int64_t)B * T * d;
    float *x = rnd(nx, 1.0f), *dout = rnd(nx, 1.0f), *out = tu_hbuf(nx), *dx = tu_hbuf(nx), *nan = tu_nans(nx);
    void *d_x = tu_dev_act(gpu, x, nx), *d_dout = tu_dev_act(gpu, dout, nx), *d_out = tu_dev_act(gpu, nan, nx),
         *d_dx = tu_dev_act(gpu, nan, nx);
    gdn_saved_t sv_c, sv_g;
    assert_int_equal(gdn_forward(&cc, &hw, out, x, B, T, 0, NULL, &sv_c), 0);
    assert_int_equal(gdn_backward(&cc, &hw, &hg, dx, dout, &sv_c), 0);
    assert_int_equal(gdn_forward(&gc, &dw, d_out, d_x, B, T, 0, NULL, &sv_g), 0);
    assert_int_equal(gdn_backward(&gc, &dw, &dgw, d_dx, d_dout, &sv_g), 0);
    char shape[96];
    snprintf(shape, sizeof shape, "d=%d H=%d HV=%d K=%d Dv=%d B=%d T=%d", d, g.n_heads, g.n_v_heads, g.head_k, g.head_v,
             B, T);
    int fails = !tu_sync(gpu, "layer", shape);
    const int64_t dxx[4] = {1, B, T, d};
    fails += !check_act("layer out", shape, d_out, out, nx, dxx, "-btc", LAYER);
    fails += !check_act("layer dx", shape, d_dx, dx, nx, dxx, "-btc", LAYER);
    float *gh = tu_host_f32(gpu, gdev, pt.total);
    const int HV = g.n_v_heads;
    float *tA = tu_hbuf(HV), *tdt = tu_hbuf(HV), *rA = tu_hbuf(HV), *rdt = tu_hbuf(HV);
    gate_grad_terms(&g, d, &hw, &sv_c, dout, tA, tdt, rA, rdt);
    for (int i = 0; i < pt.n; i++) {
        const param_t *p = &pt.p[i];
        if (!strstr(p->name, ".gdn.")) continue;
        const int64_t dp[4] = {1, 1, 1, p->numel};
        char op[64];
        snprintf(op, sizeof op, "layer d%s", strstr(p->name, ".gdn.") + 5);
        if (strstr(p->name, ".A_log") || strstr(p->name, ".dt_bias")) {
            int isA = strstr(p->name, ".A_log") != NULL;
            fails += !check_scalar(op, shape, gh + p->off, gflat + p->off, isA ? rA : rdt, isA ? tA : tdt, HV);
        } else {
            fails += !check(op, shape, gh + p->off, gflat + p->off, p->numel, dp, "---i", LAYER);
        }
    }
    free(tA), free(tdt), free(rA), free(rdt);
    free(gh), free(x), free(dout), free(out), free(dx), free(nan), free(w), free(gflat);
    tu_dev_free(gpu, d_x), tu_dev_free(gpu, d_dout), tu_dev_free(gpu, d_out), tu_dev_free(gpu, d_dx),
        tu_dev_free(gpu, wdev), tu_dev_free(gpu, gdev), tu_dev_free(gpu, gbase);
    tu_ctx_free(&cc);
    ptable_free(&pt);
    return fails;
}

// HyLo's rule (H*K = floor(0.75 d) in heads of 256 -> H = HV = 1, K = 256,
// Dv = 2K = 512), and grouped value heads (H = 2 q/k heads, HV = 4 value
// heads, K = 128, Dv = 256: each q/k head serves two value heads, and H*K !=
// HV*Dv, so the q/k and v widths of the projections and convs differ).
static void test_layer(void **st) {
    setup();
    // the ops the layer calls beyond the rule: a backend without them fails
    assert_non_null(gpu->gemm);
    assert_non_null(gpu->conv1d_fwd);
    assert_non_null(gpu->l2norm_fwd);
    assert_non_null(gpu->gated_rmsnorm_fwd);
    const gdn_dims_t hylo = {.n_heads = 1,
                             .n_v_heads = 1,
                             .head_k = 256,
                             .head_v = 512,
                             .conv = 4,
                             .use_gate = 1,
                             .allow_neg_eigval = 0,
                             .norm_eps = 1e-6f};
    gdn_dims_t gva = hylo;
    gva.n_heads = 2, gva.n_v_heads = 4, gva.head_k = 128, gva.head_v = 256;
    g_seed = 28185; // the same draws whichever tests ran before
    int fails = layer_case(hylo);
    fails += layer_case(gva);
    assert_int_equal(fails, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gates),
        cmocka_unit_test(test_recurrent),
        cmocka_unit_test(test_recurrent_step),
        cmocka_unit_test(test_step_inputs),
        cmocka_unit_test(test_step),
        cmocka_unit_test(test_chunk),
        cmocka_unit_test(test_chunk_small_scratch),
        cmocka_unit_test(test_chunk_seqs),
        cmocka_unit_test(test_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
