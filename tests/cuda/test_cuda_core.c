// CUDA-vs-CPU tests of the shared ops (cuda_core.cu, cuda_norm.cu, cuda_rope.cu,
// cuda_mlp.cu, cuda_conv.cu), and a decode step's fused ops (proj_swiglu,
// proj_add_rmsnorm, proj_rope_kv_append, rope_kv_append, mla_rope_append).
// Every input is drawn fresh per shape and rounded to bf16 (tu_round_bf16) so
// both backends see identical values; the CPU backend (fp32) is the
// reference. Outputs on the GPU are poisoned with NaN before the op so an
// unwritten element fails; memory around strided outputs holds the same
// random values on both sides, so a write outside the region fails too
// (buffers are always compared whole). Each check prints op, shape, relative
// L2 error, max abs difference and the first mismatching index.
//
// Tolerances (every check states which one it uses):
//  EXACT     copies, embedding, state rolls (conv1d_update_state, conv1d_step
//            and conv1d_seqs windows): bit-identical. add / scale /
//            accumulating copy: one fp32 op on bf16 inputs, then one
//            round-to-nearest-even to bf16 on both sides, so the GPU result
//            equals the CPU result rounded to bf16 exactly.
//  BF16      bf16 outputs of fp32 math: each element carries one rounding,
//            relative error <= 2^-9 (~2e-3). Elementwise |got - ref| <=
//            2^-8 |ref| (one rounding plus a possible flip across a rounding
//            boundary when the fp32 values differ in their last bits) + 1e-3
//            rms(ref) (elements near zero after a cancellation: GEMM sums, norm
//            backward), and relative L2 error < 1e-2 (expected ~1e-3). Indexing
//            bugs give errors of O(1).
//  F32       fp32 outputs (rstd, rnorm, weight gradients, dstate): the same fp32
//            math in another summation order over at most a few thousand
//            terms: relative L2 < 1e-5; elementwise 1e-4 (|ref| + rms).
//  F32_GEMM  gemm_f32out: tensor-core fp32 accumulation of exact bf16 products
//            is not IEEE round-to-nearest at every add, and the order differs
//            from OpenBLAS: relative L2 < 1e-4 for K <= 2048; elementwise 1e-3.
//  BF16_ACC  gemm with a bf16 C and beta != 0: cuBLASLt rounds alpha*AB to bf16
//            before adding beta*C (seen on the H200: elements 1.5 ulp off, e.g.
//            68.5 for 68.90 where an ulp is 0.5), and the tests accumulate twice
//            (seen: 1.25 ulp after the second call, 17.5 for 17.34): up to 4
//            roundings, elementwise 2^-6 |ref|; L2 as BF16.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/sampler.h"
#include "testutil.h"

// ---- tolerances: see the header comment ----------------------------------------
typedef struct {
    const char *name;
    double l2, rtol, atol; // pass: rel L2 <= l2 and |got - ref| <= rtol |ref| + atol rms(ref) everywhere
} tol_t;
static const tol_t EXACT = {"exact", 0.0, 0.0, 0.0};
static const tol_t BF16 = {"bf16", 1e-2, 1.0 / 256, 1e-3};
static const tol_t F32 = {"f32", 1e-5, 1e-4, 1e-4};
static const tol_t F32_GEMM = {"f32-gemm", 1e-4, 1e-3, 1e-3};
static const tol_t BF16_ACC = {"bf16-acc", 1e-2, 1.0 / 64, 1e-3};

static be_t *cpu, *gpu;
static uint64_t g_seed = 0x5eed;

// tu_gpu(): the GPU, or the fake one under HYLO_TEST_CPU_AS_GPU=1 (testutil.h).
static void setup_backends(void) {
    gpu = tu_gpu();
    cpu = tu_cpu();
}
// The GPU stores act in bf16: what it holds is the fp32 result rounded.
static void round_like_gpu(float *p, int64_t n) {
    if (gpu->act_dtype == DT_BF16) tu_round_bf16(p, n);
}

// ---- host buffers ------------------------------------------------------------------
// N(0, std^2) rounded to bf16, from a seed never used before.
static float *rnd(int64_t n, float std) { return tu_rnd(n, g_seed++, std); }
// 1 + N(0, 0.1^2), rounded: norm weights
static float *rnd_w(int64_t n) {
    float *p = rnd(n, 0.1f);
    for (int64_t i = 0; i < n; i++)
        p[i] += 1.0f;
    tu_round_bf16(p, n);
    return p;
}
// fp32 values that are not bf16-exact (float accumulators start from these)
static float *rnd_f32(int64_t n, float std) {
    float *p = tu_hbuf(n);
    if (n > 0) tu_randn(p, n, g_seed++, std);
    return p;
}
static int32_t *rnd_ids(int64_t n, int range) {
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    float *u = tu_hbuf(n);
    tu_randu(u, n, g_seed++, 0.0f, (float)range);
    for (int64_t i = 0; i < n; i++) {
        ids[i] = (int32_t)u[i];
        if (ids[i] >= range) ids[i] = range - 1;
    }
    free(u);
    return ids;
}

// Compares got with ref (n values) under tolerance t; prints one line. Returns 1 on pass.
static int check(const char *op, const char *shape, const float *got, const float *ref, int64_t n, tol_t t) {
    tu_cmp_t c = tu_compare(got, ref, n, t.rtol, t.atol, 0.0);
    int ok = c.rel <= t.l2 && c.n_off == 0;
    printf("%s %-24s %-56s rel_err %.3e (tol %.0e %s) max_abs %.3e", ok ? "ok  " : "FAIL", op, shape, c.rel, t.l2,
           t.name, c.max_abs);
    if (c.n_off)
        printf("  %lld/%lld elements off, first at %lld: got %.8g ref %.8g", (long long)c.n_off, (long long)n,
               (long long)c.first, got[c.first], ref[c.first]);
    printf("\n");
    fflush(stdout);
    return ok;
}

// Downloads a device act buffer of n elements and checks it; frees the copy.
static int check_act(const char *op, const char *shape, const void *d, const float *ref, int64_t n, tol_t t) {
    float *h = tu_host_act(gpu, d, n);
    int ok = check(op, shape, h, ref, n, t);
    free(h);
    return ok;
}
static int check_f32(const char *op, const char *shape, const float *d, const float *ref, int64_t n, tol_t t) {
    float *h = tu_host_f32(gpu, d, n);
    int ok = check(op, shape, h, ref, n, t);
    free(h);
    return ok;
}

// What the GPU should hold after an op whose fp32 result the CPU computed:
// that result rounded to bf16 (for EXACT comparisons of add / scale).
static float *rounded(const float *ref, int64_t n) {
    float *p = tu_hdup(ref, n);
    round_like_gpu(p, n);
    return p;
}

// Copy of h with rows x cols at `off` (row stride ld) set to NaN: the GPU's
// version of an output buffer whose surroundings must survive.
static float *poisoned(const float *h, int64_t len, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
    float *p = tu_hdup(h, len);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            p[off + r * ld + c] = NAN;
    return p;
}

// Consumes the whole scratch arena so ops take their no-scratch path.
static size_t scratch_fill(be_t *be) {
    size_t mark = arena_mark(&be->scratch);
    be->scratch.used = be->scratch.cap;
    return mark;
}

// ==== elementwise and copies ========================================================

static void test_add_scale(void **st) {
    setup_backends();
    int fails = 0;
    const int64_t sizes[] = {1, 7, 333, 998, 4096, 100003}; // V = 1, 1, 1, 2, 8, 1
    for (int si = 0; si < 6; si++)
        for (int off = 0; off < 2; off++) { // off = 1: pointers not 4-byte aligned (scalar path)
            int64_t n = sizes[si], len = n + off;
            char shape[96];
            snprintf(shape, sizeof shape, "n=%lld offset=%d", (long long)n, off);
            float *y0 = rnd(len, 1.0f), *x = rnd(len, 1.0f);

            float *yc = tu_hdup(y0, len);
            cpu->add(cpu, yc + off, x + off, n);
            float *want = rounded(yc, len);
            void *dy = tu_dev_act(gpu, y0, len), *dx = tu_dev_act(gpu, x, len);
            gpu->add(gpu, tu_gat(gpu, dy, off), tu_gat(gpu, dx, off), n);
            fails += !tu_sync(gpu, "add", shape) || !check_act("add", shape, dy, want, len, EXACT);
            free(want);

            // scale into another buffer, then in place (y aliases x)
            const float a = 0.37f;
            float *sc = tu_hdup(y0, len);
            cpu->scale(cpu, sc + off, x + off, a, n);
            want = rounded(sc, len);
            float *sinit = poisoned(y0, len, off, 1, n, n);
            void *ds = tu_dev_act(gpu, sinit, len);
            gpu->scale(gpu, tu_gat(gpu, ds, off), tu_gat(gpu, dx, off), a, n);
            fails += !tu_sync(gpu, "scale", shape) || !check_act("scale", shape, ds, want, len, EXACT);
            free(want);
            float *xi = tu_hdup(x, len);
            cpu->scale(cpu, xi + off, xi + off, -1.75f, n);
            gpu->scale(gpu, tu_gat(gpu, dx, off), tu_gat(gpu, dx, off), -1.75f, n);
            want = rounded(xi, len);
            fails +=
                !tu_sync(gpu, "scale in place", shape) || !check_act("scale in place", shape, dx, want, len, EXACT);
            free(want);

            free(y0), free(x), free(yc), free(sc), free(xi), free(sinit);
            tu_dev_free(gpu, dy), tu_dev_free(gpu, dx), tu_dev_free(gpu, ds);
        }
    assert_int_equal(fails, 0);
}

static void test_copy2d(void **st) {
    setup_backends();
    int fails = 0;
    // rows, cols, lds, ldd, source offset, destination offset
    const int64_t cases[][6] = {
        {1, 1, 1, 1, 0, 0},         {7, 5, 9, 6, 1, 3},    {333, 64, 576, 64, 512, 0}, // MLA: k_pe out of [c|k_pe]
        {100, 576, 576, 640, 0, 0}, {64, 8, 16, 24, 0, 8}, {50, 130, 131, 130, 1, 0},  {1, 1000, 1000, 1000, 0, 0},
        {40, 96, 192, 96, 96, 0},   {3, 2, 2, 4, 2, 2},    {20, 10, 12, 14, 2, 4},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int acc = 0; acc < 2; acc++) {
            const int64_t *c = cases[ci];
            int64_t rows = c[0], cols = c[1], lds = c[2], ldd = c[3], so = c[4], dof = c[5];
            int64_t slen = so + rows * lds, dlen = dof + rows * ldd;
            char shape[96];
            snprintf(shape, sizeof shape, "rows=%lld cols=%lld lds=%lld ldd=%lld off=%lld/%lld", (long long)rows,
                     (long long)cols, (long long)lds, (long long)ldd, (long long)so, (long long)dof);
            float *src = rnd(slen, 1.0f), *dst0 = rnd(dlen, 1.0f);
            float *ref = tu_hdup(dst0, dlen);
            cpu->copy2d(cpu, ref + dof, ldd, src + so, lds, rows, cols, acc);
            float *init = acc ? tu_hdup(dst0, dlen) : poisoned(dst0, dlen, dof, rows, cols, ldd);
            void *ds = tu_dev_act(gpu, src, slen), *dd = tu_dev_act(gpu, init, dlen);
            gpu->copy2d(gpu, tu_gat(gpu, dd, dof), ldd, tu_gat(gpu, ds, so), lds, rows, cols, acc);
            float *want = rounded(ref, dlen);
            const char *op = acc ? "copy2d +=" : "copy2d =";
            fails += !tu_sync(gpu, op, shape) || !check_act(op, shape, dd, want, dlen, EXACT);
            free(src), free(dst0), free(ref), free(init), free(want);
            tu_dev_free(gpu, ds), tu_dev_free(gpu, dd);
        }
    assert_int_equal(fails, 0);
}

// copy_pages: a sequence's rows through its page table (pages shuffled over a
// pool, the first row mid-page) gathered into x and scattered back into the
// pool, against the CPU op; EXACT. Cases: a few rows in one page (16-byte
// vectors), rows over more pages than one launch takes (CUDA: 512), and odd
// columns at an offset in wider rows (the scalar path); the scatter's pool
// rows outside the sequence's must come back unchanged.
static void test_copy_pages(void **st) {
    setup_backends();
    int fails = 0;
    // pool pages, u0, rows, cols, ld (pool), ldx, column offset in a pool row
    const int64_t cases[][7] = {
        {4, 5, 3, 64, 64, 64, 0}, {600, 300, 520 * 256, 8, 8, 8, 0}, {20, 700, 2000, 7, 13, 9, 5}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t *c = cases[ci];
        const int64_t np = c[0], u0 = c[1], rows = c[2], cols = c[3], ld = c[4], ldx = c[5], col = c[6];
        const int64_t plen = np * BE_PAGE_ROWS * ld, xlen = rows * ldx,
                      nblk = (u0 + rows + BE_PAGE_ROWS - 1) / BE_PAGE_ROWS;
        char shape[128];
        snprintf(shape, sizeof shape, "pages=%lld u0=%lld rows=%lld cols=%lld ld=%lld ldx=%lld col=%lld", (long long)np,
                 (long long)u0, (long long)rows, (long long)cols, (long long)ld, (long long)ldx, (long long)col);
        int32_t *pages = malloc((size_t)nblk * sizeof(int32_t));
        for (int64_t k = 0; k < nblk; k++) // a permutation of the pool's pages: the sequence's blocks scattered
            pages[k] = (int32_t)((k * 7 + 3) % np);
        float *pool = rnd(plen, 1.0f), *x0 = rnd(xlen, 1.0f);
        // gather
        float *xg = tu_hdup(x0, xlen);
        cpu->copy_pages(cpu, xg, ldx, pool + col, ld, pages, u0, rows, cols, 0);
        void *dpool = tu_dev_act(gpu, pool, plen), *dx = tu_dev_act(gpu, x0, xlen);
        gpu->copy_pages(gpu, dx, ldx, tu_gat(gpu, dpool, col), ld, pages, u0, rows, cols, 0);
        fails +=
            !tu_sync(gpu, "copy_pages gather", shape) || !check_act("copy_pages gather", shape, dx, xg, xlen, EXACT);
        // scatter x0 back into the pool
        float *pref = tu_hdup(pool, plen);
        cpu->copy_pages(cpu, x0, ldx, pref + col, ld, pages, u0, rows, cols, 1);
        tu_upload_act(gpu, dx, x0, xlen);
        gpu->copy_pages(gpu, dx, ldx, tu_gat(gpu, dpool, col), ld, pages, u0, rows, cols, 1);
        fails += !tu_sync(gpu, "copy_pages scatter", shape) ||
                 !check_act("copy_pages scatter", shape, dpool, pref, plen, EXACT);
        free(pages), free(pool), free(x0), free(xg), free(pref);
        tu_dev_free(gpu, dpool), tu_dev_free(gpu, dx);
    }
    assert_int_equal(fails, 0);
}

// ==== embedding =======================================================================

static void test_embed(void **st) {
    setup_backends();
    int fails = 0;
    const int V = 50;
    const int64_t cases[][2] = {{1, 1}, {13, 7}, {333, 576}, {64, 77}, {200, 2048}, {9, 8}, {17, 6}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t N = cases[ci][0];
        int d = (int)cases[ci][1];
        char shape[96];
        snprintf(shape, sizeof shape, "N=%lld d=%d V=%d", (long long)N, d, V);
        // ids from a narrow range so rows repeat (the backward must sum them all)
        int32_t *ids = rnd_ids(N, N < 8 ? V : 8);
        float *table = rnd((int64_t)V * d, 1.0f), *ref = tu_hbuf(N * d), *nan = tu_nans(N * d);
        cpu->embed_fwd(cpu, ref, table, ids, N, d);
        int32_t *did = tu_dev_i32(gpu, ids, N);
        void *dt = tu_dev_act(gpu, table, (int64_t)V * d), *dout = tu_dev_act(gpu, nan, N * d);
        gpu->embed_fwd(gpu, dout, dt, did, N, d);
        fails += !tu_sync(gpu, "embed_fwd", shape) || !check_act("embed_fwd", shape, dout, ref, N * d, EXACT);

        float *g = rnd(N * d, 1.0f), *dtab0 = rnd_f32((int64_t)V * d, 1.0f), *dtab = tu_hdup(dtab0, (int64_t)V * d);
        void *dg = tu_dev_act(gpu, g, N * d);
        float *ddt = tu_dev_f32(gpu, dtab0, (int64_t)V * d);
        for (int call = 1; call <= 2; call++) { // dtable += : twice is twice the gradient
            char s2[128];
            snprintf(s2, sizeof s2, "%s call %d", shape, call);
            cpu->embed_bwd(cpu, dtab, g, ids, N, d);
            gpu->embed_bwd(gpu, ddt, dg, did, N, d);
            // F32: the GPU sums each id's rows in position order from 0 (in pieces
            // of 256 sorted rows), then adds to the row; the CPU adds row by row
            fails += !tu_sync(gpu, "embed_bwd", s2) || !check_f32("embed_bwd", s2, ddt, dtab, (int64_t)V * d, F32);
        }
        free(ids), free(table), free(ref), free(nan), free(g), free(dtab0), free(dtab);
        tu_dev_free(gpu, did), tu_dev_free(gpu, dt), tu_dev_free(gpu, dout), tu_dev_free(gpu, dg),
            tu_dev_free(gpu, ddt);
    }
    assert_int_equal(fails, 0);
}

// ==== matrix products ===================================================================

typedef struct {
    int ta, tb;
    int64_t M, N, K;
    int64_t lda, ldb, ldc;     // 0 = tight
    int64_t aoff, boff, coff;  // element offsets of A, B, C in their buffers
    int64_t sa, sb, sc, batch; // batched only (0 = tight)
    float alpha, beta;
    const char *what;
} gcase_t;

// Rows of the stored matrix and the minimum row stride of each operand.
static void gemm_dims(gcase_t *g) {
    if (!g->lda) g->lda = g->ta ? g->M : g->K;
    if (!g->ldb) g->ldb = g->tb ? g->K : g->N;
    if (!g->ldc) g->ldc = g->N;
    if (!g->batch) g->batch = 1;
    int64_t ra = g->ta ? g->K : g->M, rb = g->tb ? g->N : g->K;
    if (!g->sa) g->sa = ra * g->lda;
    if (!g->sb) g->sb = rb * g->ldb;
    if (!g->sc) g->sc = g->M * g->ldc;
}
static int64_t span(int64_t off, int64_t rows, int64_t ld, int64_t stride, int64_t batch) {
    return off + (batch - 1) * stride + rows * ld + 1;
}

// mode 0: gemm (bf16 C), 1: gemm_f32out, 2: gemm_batched. `calls` > 1 repeats
// the same call (beta = 1 accumulates) and checks after each.
static int gemm_case(gcase_t g, int mode, int calls) {
    gemm_dims(&g);
    int64_t ra = g.ta ? g.K : g.M, rb = g.tb ? g.N : g.K;
    int64_t la = span(g.aoff, ra, g.lda, g.sa, g.batch), lb = span(g.boff, rb, g.ldb, g.sb, g.batch);
    int64_t lc = span(g.coff, g.M, g.ldc, g.sc, g.batch);
    char shape[160];
    snprintf(shape, sizeof shape, "%s tA=%d tB=%d M=%lld N=%lld K=%lld ld=%lld/%lld/%lld b=%lld a=%g b=%g", g.what,
             g.ta, g.tb, (long long)g.M, (long long)g.N, (long long)g.K, (long long)g.lda, (long long)g.ldb,
             (long long)g.ldc, (long long)g.batch, g.alpha, g.beta);
    const char *op = mode == 0 ? "gemm" : mode == 1 ? "gemm_f32out" : "gemm_batched";
    float *A = rnd(la, 1.0f), *B = rnd(lb, 1.0f);
    float *C0 = mode == 1 ? rnd_f32(lc, 1.0f) : rnd(lc, 1.0f), *ref = tu_hdup(C0, lc);
    // beta = 0 must not read C: poison the written region on the GPU
    float *init = tu_hdup(C0, lc);
    if (g.beta == 0.0f)
        for (int64_t b = 0; b < g.batch; b++)
            for (int64_t m = 0; m < g.M; m++)
                for (int64_t n = 0; n < g.N; n++)
                    init[g.coff + b * g.sc + m * g.ldc + n] = NAN;
    void *dA = tu_dev_act(gpu, A, la), *dB = tu_dev_act(gpu, B, lb);
    void *dC = mode == 1 ? (void *)tu_dev_f32(gpu, init, lc) : tu_dev_act(gpu, init, lc);
    int fails = 0;
    for (int call = 1; call <= calls; call++) {
        if (mode == 2)
            cpu->gemm_batched(cpu, g.ta, g.tb, g.M, g.N, g.K, g.alpha, A + g.aoff, g.lda, g.sa, B + g.boff, g.ldb, g.sb,
                              g.beta, ref + g.coff, g.ldc, g.sc, g.batch);
        else
            cpu->gemm(cpu, g.ta, g.tb, g.M, g.N, g.K, g.alpha, A + g.aoff, g.lda, B + g.boff, g.ldb, g.beta,
                      ref + g.coff, g.ldc);
        if (mode == 0)
            gpu->gemm(gpu, g.ta, g.tb, g.M, g.N, g.K, g.alpha, tu_gat(gpu, dA, g.aoff), g.lda, tu_gat(gpu, dB, g.boff),
                      g.ldb, g.beta, tu_gat(gpu, dC, g.coff), g.ldc);
        else if (mode == 1)
            gpu->gemm_f32out(gpu, g.ta, g.tb, g.M, g.N, g.K, g.alpha, tu_gat(gpu, dA, g.aoff), g.lda,
                             tu_gat(gpu, dB, g.boff), g.ldb, g.beta, (float *)dC + g.coff, g.ldc);
        else
            gpu->gemm_batched(gpu, g.ta, g.tb, g.M, g.N, g.K, g.alpha, tu_gat(gpu, dA, g.aoff), g.lda, g.sa,
                              tu_gat(gpu, dB, g.boff), g.ldb, g.sb, g.beta, tu_gat(gpu, dC, g.coff), g.ldc, g.sc,
                              g.batch);
        char s2[200];
        snprintf(s2, sizeof s2, "%s%s", shape, calls > 1 ? (call == 1 ? " call 1" : " call 2") : "");
        int ok = tu_sync(gpu, op, s2);
        if (ok && mode == 1)
            ok = check_f32(op, s2, dC, ref, lc, F32_GEMM);
        else if (ok)
            ok = check_act(op, s2, dC, ref, lc, g.beta != 0.0f ? BF16_ACC : BF16);
        fails += !ok;
        // the next call accumulates onto what each side holds now: keep the CPU
        // reference in step with the GPU's bf16 rounding of C
        if (mode != 1) round_like_gpu(ref, lc);
    }
    free(A), free(B), free(C0), free(ref), free(init);
    tu_dev_free(gpu, dA), tu_dev_free(gpu, dB), tu_dev_free(gpu, dC);
    return fails;
}

static void test_gemm(void **st) {
    setup_backends();
    int fails = 0;
    gcase_t cases[] = {
        {.ta = 0, .tb = 1, .M = 1, .N = 1, .K = 1, .alpha = 1, .beta = 0, .what = "1x1x1"},
        {.ta = 0, .tb = 1, .M = 7, .N = 13, .K = 333, .alpha = 1, .beta = 0, .what = "odd"},
        {.ta = 0, .tb = 1, .M = 128, .N = 576, .K = 576, .alpha = 1, .beta = 0, .what = "linear fwd"},
        {.ta = 0, .tb = 0, .M = 333, .N = 576, .K = 1536, .alpha = 1, .beta = 1, .what = "linear dx +="},
        {.ta = 1, .tb = 0, .M = 77, .N = 65, .K = 129, .alpha = -0.75f, .beta = 0.5f, .what = "tA"},
        {.ta = 1, .tb = 1, .M = 33, .N = 17, .K = 65, .alpha = 1, .beta = 0, .what = "tA tB"},
        {.ta = 0, .tb = 0, .M = 5, .N = 2048, .K = 64, .alpha = 1, .beta = 0, .what = "wide"},
        // MLA decompression from the cache: A = latent rows [c | k_pe] (ld = r_kv + d_rope), second sequence
        {.ta = 0,
         .tb = 1,
         .M = 40,
         .N = 96,
         .K = 64,
         .lda = 96,
         .aoff = 48 * 96,
         .alpha = 1,
         .beta = 0,
         .what = "latent slice"},
        // column slices at odd element offsets, odd leading dimensions: 2-byte alignment only
        {.ta = 0,
         .tb = 1,
         .M = 37,
         .N = 45,
         .K = 100,
         .lda = 203,
         .ldb = 101,
         .ldc = 50,
         .aoff = 3,
         .boff = 1,
         .coff = 1,
         .alpha = 1,
         .beta = 0,
         .what = "misaligned"},
        {.ta = 1,
         .tb = 0,
         .M = 64,
         .N = 48,
         .K = 80,
         .lda = 72,
         .ldb = 56,
         .ldc = 64,
         .aoff = 8,
         .boff = 8,
         .coff = 16,
         .alpha = 1.5f,
         .beta = -1,
         .what = "strided"},
        {.ta = 0, .tb = 1, .M = 512, .N = 1024, .K = 2048, .alpha = 1, .beta = 0, .what = "large"},
        // a decode step's few rows (cuda_core.cu k_gemv up to 4 rows, k_gemv_cols
        // with 4 columns a warp from 5; the bench-variants build's HYLO_GEMV_COLS
        // = 1 / 2 / 4 forces one form; a warp's last columns past N at N = 7
        // and 130): one row by a fused
        // projection, 3 rows, 8 rows by a 49,152-word head, alpha, rows at strides
        // (parts of wider buffers), N not a multiple of the block's 4 columns
        {.ta = 0, .tb = 1, .M = 1, .N = 960, .K = 576, .alpha = 1, .beta = 0, .what = "rows 1"},
        {.ta = 0, .tb = 1, .M = 3, .N = 1536, .K = 576, .alpha = 1, .beta = 0, .what = "rows 3"},
        {.ta = 0, .tb = 1, .M = 8, .N = 49152, .K = 576, .alpha = 1, .beta = 0, .what = "rows 8, head"},
        {.ta = 0, .tb = 1, .M = 5, .N = 7, .K = 1536, .alpha = -0.5f, .beta = 0, .what = "rows 5 alpha"},
        {.ta = 0,
         .tb = 1,
         .M = 2,
         .N = 130,
         .K = 256,
         .lda = 1032,
         .ldb = 264,
         .ldc = 136,
         .aoff = 512,
         .boff = 8,
         .coff = 4,
         .alpha = 1,
         .beta = 0,
         .what = "rows 2 strided"},
        // few rows that k_gemv cannot load in 16 bytes (K = 100): cuBLASLt's path
        {.ta = 0, .tb = 1, .M = 2, .N = 64, .K = 100, .alpha = 1, .beta = 0, .what = "rows 2, K 100"},
        // few rows by a weight as stored ("wide" above too): k_gemv_xw, 8
        // columns a thread, K split over the block's threads (odd K: A is read
        // a value at a time); N = 100 cannot take its 16-byte loads: cuBLASLt
        {.ta = 0, .tb = 0, .M = 1, .N = 576, .K = 1536, .alpha = 1, .beta = 0, .what = "rows 1, x W"},
        {.ta = 0, .tb = 0, .M = 8, .N = 3072, .K = 333, .alpha = -0.5f, .beta = 0, .what = "rows 8, x W"},
        {.ta = 0, .tb = 0, .M = 4, .N = 100, .K = 64, .alpha = 1, .beta = 0, .what = "rows 4, x W, N 100"},
        {.ta = 0, .tb = 1, .M = 0, .N = 16, .K = 16, .alpha = 1, .beta = 0, .what = "M=0 no-op"},
        {.ta = 0, .tb = 1, .M = 16, .N = 0, .K = 16, .alpha = 1, .beta = 0, .what = "N=0 no-op"},
        {.ta = 0, .tb = 1, .M = 9, .N = 11, .K = 0, .ldc = 12, .alpha = 1, .beta = 0, .what = "K=0 zeroes C"},
        {.ta = 0, .tb = 1, .M = 9, .N = 11, .K = 0, .ldc = 12, .alpha = 1, .beta = 0.5f, .what = "K=0 scales C"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += gemm_case(cases[i], 0, 1);
    // accumulation (beta = 1) twice through the cached plan
    gcase_t accu = {.ta = 0, .tb = 0, .M = 64, .N = 96, .K = 80, .alpha = 1, .beta = 1, .what = "dx += twice"};
    fails += gemm_case(accu, 0, 2);
    assert_int_equal(fails, 0);
}

static void test_gemm_f32out(void **st) {
    setup_backends();
    int fails = 0;
    // weight gradients dW[out, in] += dy^T x (gdn.c, linear.c): beta = 1, called twice
    gcase_t acc[] = {
        {.ta = 1, .tb = 0, .M = 96, .N = 77, .K = 333, .alpha = 1, .beta = 1, .what = "dW += dy^T x"},
        {.ta = 1, .tb = 0, .M = 576, .N = 576, .K = 128, .alpha = 1, .beta = 1, .what = "dW += dy^T x"},
        {.ta = 1, .tb = 0, .M = 64, .N = 40, .K = 2048, .alpha = 1, .beta = 1, .what = "dW long K"},
        // a block of a larger gradient: rows of the slice are ldc apart
        {.ta = 1,
         .tb = 0,
         .M = 32,
         .N = 24,
         .K = 50,
         .lda = 40,
         .ldb = 30,
         .ldc = 100,
         .aoff = 5,
         .boff = 3,
         .coff = 7,
         .alpha = 1,
         .beta = 1,
         .what = "dW slice"},
    };
    for (size_t i = 0; i < sizeof acc / sizeof acc[0]; i++)
        fails += gemm_case(acc[i], 1, 2);
    gcase_t one[] = {
        {.ta = 0, .tb = 1, .M = 7, .N = 13, .K = 333, .alpha = 1, .beta = 0, .what = "beta 0"},
        {.ta = 0, .tb = 0, .M = 33, .N = 65, .K = 17, .alpha = 2, .beta = 0.25f, .what = "alpha beta"},
        {.ta = 1, .tb = 1, .M = 31, .N = 9, .K = 19, .alpha = 1, .beta = 0, .what = "tA tB"},
        {.ta = 1, .tb = 0, .M = 12, .N = 10, .K = 0, .alpha = 1, .beta = 1, .what = "K=0 keeps C"},
        {.ta = 1, .tb = 0, .M = 12, .N = 10, .K = 0, .alpha = 1, .beta = 0, .what = "K=0 zeroes C"},
    };
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        fails += gemm_case(one[i], 1, 1);
    assert_int_equal(fails, 0);
}

// The products of an MLA decode step's absorption (mla.c per_head_products),
// with the strides mla_step passes, for B sequences: H query heads in G KV
// groups (hpg = H / G), q rows [H, qd] (qd = dn + dr), latents [H, rkv], kv_b
// [G, dn + dv, rkv]. With B >= hpg one call per head j of a group (B rows, A
// and C at head j of every row), else one per sequence b (the hpg heads of
// each group as rows). q_lat = q_nope wk_g: B as stored, a block of kv_b
// (tb = 0); att = olat wv_g^T: the value rows after dn (tb = 1). Every case
// writes into C at its head stride (the other heads' values must survive).
static int mla_absorb_cases(const char *what, int64_t Bq, int64_t H, int64_t G, int64_t dn, int64_t dr, int64_t rkv,
                            int64_t dv) {
    const int64_t hpg = H / G, qd = dn + dr, kvh = dn + dv;
    const int64_t calls = Bq >= hpg ? hpg : Bq;
    int fails = 0;
    for (int64_t i = 0; i < calls; i++) {
        // per head j = i: rows b at ld H * (head stride); per sequence b = i: rows h at the head stride
        const int64_t M = Bq >= hpg ? Bq : hpg;
        const int64_t row = Bq >= hpg ? H : 1, at = Bq >= hpg ? i : i * H; // A / C: row stride, first head
        char name[64];
        snprintf(name, sizeof name, "%s B=%lld %s %lld q_lat", what, (long long)Bq, Bq >= hpg ? "head" : "seq",
                 (long long)i);
        gcase_t qlat = {.ta = 0,
                        .tb = 0,
                        .M = M,
                        .N = rkv,
                        .K = dn,
                        .lda = row * qd,
                        .ldb = rkv,
                        .ldc = row * rkv,
                        .aoff = at * qd,
                        .coff = at * rkv,
                        .sa = hpg * qd,
                        .sb = kvh * rkv,
                        .sc = hpg * rkv,
                        .batch = G,
                        .alpha = 1,
                        .beta = 0,
                        .what = name};
        fails += gemm_case(qlat, 2, 1);
        snprintf(name, sizeof name, "%s B=%lld %s %lld att", what, (long long)Bq, Bq >= hpg ? "head" : "seq",
                 (long long)i);
        gcase_t att = {.ta = 0,
                       .tb = 1,
                       .M = M,
                       .N = dv,
                       .K = rkv,
                       .lda = row * rkv,
                       .ldb = rkv,
                       .ldc = row * dv,
                       .aoff = at * rkv,
                       .boff = dn * rkv,
                       .coff = at * dv,
                       .sa = hpg * rkv,
                       .sb = kvh * rkv,
                       .sc = hpg * dv,
                       .batch = G,
                       .alpha = 1,
                       .beta = 0,
                       .what = name};
        fails += gemm_case(att, 2, 1);
    }
    return fails;
}

static void test_gemm_batched(void **st) {
    setup_backends();
    int fails = 0;
    // Products of at most 8 rows, A as stored and beta = 0 run on the few-row
    // kernels (cuda_core.cu gemv_fits): B transposed on k_gemv / k_gemv_cols
    // (K, lda, ldb, the batch strides of A and B multiples of 8, A and B
    // 16-byte aligned), B as stored on k_gemv_xw (N, ldb, B's batch stride
    // multiples of 8, B aligned; A read a value at a time); every other one on
    // cuBLASLt. Tolerance BF16, as the other gemm cases: each output is one
    // fp32 sum of bf16 products (the order differs from the CPU's), rounded
    // once to bf16. A wrong stride or batch offset reads other heads' or
    // groups' values (errors of O(1)); a column or batch entry left unwritten
    // stays NaN; a write past a head's columns changes the random values
    // around it: each fails. The bench-variants build's HYLO_BATCHED_LT = 1
    // sends all of them to cuBLASLt (the same checks, the old path).
    //
    // MLA decode absorption: a small made-up shape (B = 5 sequences, H = 4
    // heads in G = 2 groups, d_nope 32, d_rope 16, r_kv 64, d_v 32); the
    // SmolLM2-135M 10MLA20GDN hybrid (H 9, G 3, d_nope = d_rope 32, r_kv 48,
    // d_v 64: q_lat M 3 N 48 K 32, att M 3 N 64 K 48, batch 3) and
    // HyLo-Llama-3B's MLA (H 24, G 8, d_nope = d_rope 64, r_kv 128, d_v 128:
    // batch 8) at one sequence (M = hpg = 3), two (per sequence), and the
    // per-head form at hpg, 8 rows and 9 (M = 9: cuBLASLt).
    fails += mla_absorb_cases("MLA toy", 5, 4, 2, 32, 16, 64, 32);
    const int64_t smol_B[] = {1, 2, 3, 8}, llama_B[] = {1, 2, 3, 8, 9};
    for (size_t i = 0; i < sizeof smol_B / sizeof smol_B[0]; i++)
        fails += mla_absorb_cases("SmolLM2 MLA", smol_B[i], 9, 3, 32, 32, 48, 64);
    for (size_t i = 0; i < sizeof llama_B / sizeof llama_B[0]; i++)
        fails += mla_absorb_cases("Llama-3B MLA", llama_B[i], 24, 8, 64, 64, 128, 128);
    // Every row count of the few-row kernels in both forms, batch 1, 3 and 8,
    // alpha != 1, padded row strides and offsets (multiples of 8), N past a
    // multiple of k_gemv_xw's 32 columns a block and K not a multiple of its
    // 32 row slices.
    const int64_t batches[] = {1, 3, 8};
    for (int64_t M = 1; M <= 8; M++)
        for (int tb = 0; tb <= 1; tb++) {
            const int64_t N = 40 + 8 * M, K = 8 * M + 16, batch = batches[(M + tb) % 3];
            gcase_t g = {.ta = 0,
                         .tb = tb,
                         .M = M,
                         .N = N,
                         .K = K,
                         .lda = K + 8,
                         .ldb = (tb ? K : N) + 16,
                         .ldc = N + 8,
                         .aoff = 8,
                         .boff = 16,
                         .coff = 8,
                         .batch = batch,
                         .alpha = M % 2 ? -0.75f : 1.5f,
                         .beta = 0,
                         .what = "few rows"};
            fails += gemm_case(g, 2, 1);
        }
    gcase_t more[] = {
        {.ta = 1, .tb = 0, .M = 16, .N = 24, .K = 40, .batch = 7, .alpha = 1, .beta = 0, .what = "tight"},
        {.ta = 1, .tb = 1, .M = 13, .N = 7, .K = 29, .batch = 3, .alpha = 0.5f, .beta = 0.5f, .what = "beta"},
        {.ta = 0, .tb = 1, .M = 33, .N = 65, .K = 77, .batch = 1, .alpha = 1, .beta = 0, .what = "batch 1"},
        {.ta = 0,
         .tb = 0,
         .M = 9,
         .N = 5,
         .K = 3,
         .sa = 31,
         .sb = 17,
         .sc = 50,
         .batch = 4,
         .alpha = 1,
         .beta = 0,
         .what = "odd strides"},
        {.ta = 0, .tb = 1, .M = 6, .N = 7, .K = 0, .batch = 3, .alpha = 1, .beta = 0.5f, .what = "K=0"},
        // k_gemv_xw reads A a value at a time: odd K, lda, A offset and batch
        // stride stay on it, as does a single column chunk (N = 8)
        {.ta = 0,
         .tb = 0,
         .M = 3,
         .N = 64,
         .K = 37,
         .lda = 41,
         .aoff = 3,
         .sa = 125,
         .batch = 3,
         .alpha = 0.5f,
         .beta = 0,
         .what = "xw odd A"},
        {.ta = 0, .tb = 0, .M = 2, .N = 8, .K = 200, .batch = 3, .alpha = 1, .beta = 0, .what = "xw N 8"},
        // few rows the kernels cannot take (cuBLASLt's path): N (tb = 0) or K
        // (tb = 1) not a multiple of 8, B 8-byte aligned only, A so (tb = 1),
        // a batch stride of B not a multiple of 8, beta != 0, 9 rows
        {.ta = 0, .tb = 0, .M = 3, .N = 44, .K = 32, .batch = 3, .alpha = 1, .beta = 0, .what = "lt: N 44"},
        {.ta = 0, .tb = 1, .M = 3, .N = 64, .K = 44, .batch = 3, .alpha = 1, .beta = 0, .what = "lt: K 44"},
        {.ta = 0,
         .tb = 0,
         .M = 3,
         .N = 48,
         .K = 32,
         .boff = 4,
         .batch = 3,
         .alpha = 1,
         .beta = 0,
         .what = "lt: B +8 bytes"},
        {.ta = 0,
         .tb = 1,
         .M = 3,
         .N = 64,
         .K = 48,
         .aoff = 4,
         .batch = 3,
         .alpha = 1,
         .beta = 0,
         .what = "lt: A +8 bytes"},
        {.ta = 0,
         .tb = 1,
         .M = 3,
         .N = 64,
         .K = 48,
         .sb = 64 * 48 + 4,
         .batch = 3,
         .alpha = 1,
         .beta = 0,
         .what = "lt: B stride"},
        {.ta = 0,
         .tb = 0,
         .M = 3,
         .N = 48,
         .K = 32,
         .sb = 32 * 48 + 4,
         .batch = 3,
         .alpha = 1,
         .beta = 0,
         .what = "lt: B stride"},
        {.ta = 0, .tb = 0, .M = 3, .N = 48, .K = 32, .batch = 3, .alpha = 1, .beta = 0.5f, .what = "lt: beta"},
        {.ta = 0, .tb = 1, .M = 3, .N = 64, .K = 48, .batch = 3, .alpha = 1, .beta = -1, .what = "lt: beta"},
        {.ta = 0, .tb = 0, .M = 9, .N = 48, .K = 32, .batch = 3, .alpha = 1, .beta = 0, .what = "lt: 9 rows"},
        {.ta = 0, .tb = 1, .M = 9, .N = 64, .K = 48, .batch = 3, .alpha = 1, .beta = 0, .what = "lt: 9 rows"},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        fails += gemm_case(more[i], 2, 1);
    assert_int_equal(fails, 0);
}

// ==== norms ================================================================================

static int rmsnorm_case(int64_t N, int d, int no_scratch) {
    int fails = 0;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%lld d=%d%s", (long long)N, d, no_scratch ? " (no scratch)" : "");
    const float eps = 1e-5f;
    int64_t n = N * (int64_t)d;
    float *x = rnd(n, 1.0f), *w = rnd_w(d), *out = tu_hbuf(n), *rstd = tu_hbuf(N), *nan = tu_nans(n);
    cpu->rmsnorm_fwd(cpu, out, rstd, x, w, N, d, eps);
    void *dxx = tu_dev_act(gpu, x, n), *dw_ = tu_dev_act(gpu, w, d), *dout = tu_dev_act(gpu, nan, n);
    float *drs = tu_dev_f32(gpu, nan, N);
    gpu->rmsnorm_fwd(gpu, dout, drs, dxx, dw_, N, d, eps);
    fails += !tu_sync(gpu, "rmsnorm_fwd", shape) || !check_act("rmsnorm_fwd out", shape, dout, out, n, BF16) ||
             !check_f32("rmsnorm_fwd rstd", shape, drs, rstd, N, F32);

    // backward from the CPU's rstd (the same on both sides)
    float *g = rnd(n, 1.0f), *dx = tu_hbuf(n), *dw0 = rnd_f32(d, 1.0f), *dw = tu_hdup(dw0, d);
    void *dg = tu_dev_act(gpu, g, n), *ddx = tu_dev_act(gpu, nan, n);
    float *drstd = tu_dev_f32(gpu, rstd, N), *ddw = tu_dev_f32(gpu, dw0, d);
    size_t mark = no_scratch ? scratch_fill(gpu) : 0;
    for (int call = 1; call <= 2; call++) { // dw += : twice is twice the gradient; dx = : NaN before each call
        char s2[128];
        snprintf(s2, sizeof s2, "%s call %d", shape, call);
        tu_upload_act(gpu, ddx, nan, n);
        cpu->rmsnorm_bwd(cpu, dx, dw, g, x, w, rstd, N, d);
        gpu->rmsnorm_bwd(gpu, ddx, ddw, dg, dxx, dw_, drstd, N, d);
        fails += !tu_sync(gpu, "rmsnorm_bwd", s2) || !check_act("rmsnorm_bwd dx", s2, ddx, dx, n, BF16) ||
                 !check_f32("rmsnorm_bwd dw", s2, ddw, dw, d, F32);
    }
    if (no_scratch) arena_reset(&gpu->scratch, mark);
    free(x), free(w), free(out), free(rstd), free(nan), free(g), free(dx), free(dw0), free(dw);
    tu_dev_free(gpu, dxx), tu_dev_free(gpu, dw_), tu_dev_free(gpu, dout), tu_dev_free(gpu, drs), tu_dev_free(gpu, dg),
        tu_dev_free(gpu, ddx), tu_dev_free(gpu, drstd), tu_dev_free(gpu, ddw);
    return fails;
}

static void test_rmsnorm(void **st) {
    setup_backends();
    int fails = 0;
    // no d = 1: its dx = r g w (1 - xh^2) is all cancellation, so fp32 rounding
    // differences are O(1) of the result; likewise gs = 1 and dim = 1 below
    const int64_t cases[][2] = {{1, 576}, {7, 2048}, {333, 77}, {64, 5120}, {5, 2}, {1000, 64}, {3, 4104}, {11, 666}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += rmsnorm_case(cases[i][0], (int)cases[i][1], 0);
    fails += rmsnorm_case(333, 77, 1);
    fails += rmsnorm_case(64, 5120, 1);
    assert_int_equal(fails, 0);
}

// add_rmsnorm_fwd: x += y rounded to bf16 (EXACT against the CPU sum rounded
// the same way), then the norm of the rounded x (BF16; rstd F32).
static void test_add_rmsnorm(void **st) {
    setup_backends();
    int fails = 0;
    const int64_t cases[][2] = {{1, 576}, {333, 77}, {64, 2048}, {7, 4104}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t N = cases[i][0], n = N * cases[i][1];
        int d = (int)cases[i][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld d=%d", (long long)N, d);
        float *x = rnd(n, 1.0f), *y = rnd(n, 1.0f), *w = rnd_w(d), *out = tu_hbuf(n), *rstd = tu_hbuf(N),
              *nan = tu_nans(n);
        void *dx = tu_dev_act(gpu, x, n), *dy = tu_dev_act(gpu, y, n), *dw = tu_dev_act(gpu, w, d),
             *dout = tu_dev_act(gpu, nan, n);
        float *drs = tu_dev_f32(gpu, nan, N);
        // CPU: the sum rounded like the GPU's, then the norm of that
        for (int64_t k = 0; k < n; k++)
            x[k] += y[k];
        round_like_gpu(x, n);
        cpu->rmsnorm_fwd(cpu, out, rstd, x, w, N, d, 1e-5f);
        gpu->add_rmsnorm_fwd(gpu, dout, drs, dx, dy, dw, N, d, 1e-5f);
        fails += !tu_sync(gpu, "add_rmsnorm_fwd", shape) || !check_act("add_rmsnorm_fwd x", shape, dx, x, n, EXACT) ||
                 !check_act("add_rmsnorm_fwd out", shape, dout, out, n, BF16) ||
                 !check_f32("add_rmsnorm_fwd rstd", shape, drs, rstd, N, F32);
        gpu->free(gpu, dx), gpu->free(gpu, dy), gpu->free(gpu, dw), gpu->free(gpu, dout), gpu->free(gpu, drs);
        free(x), free(y), free(w), free(out), free(rstd), free(nan);
    }
    assert_int_equal(fails, 0);
}

typedef struct {
    int64_t N;
    int G, gs;
    int64_t ldz, zoff, lddz, dzoff; // 0 = tight (G*gs)
    int shared;                     // w_len = gs (GDN) or G*gs (Mamba-2)
} gncase_t;

static int gnorm_case(gncase_t c, int mode, int no_scratch) {
    int fails = 0;
    const float eps = 1e-5f;
    int64_t width = (int64_t)c.G * c.gs, n = c.N * width;
    int64_t ldz = c.ldz ? c.ldz : width, lddz = c.lddz ? c.lddz : width;
    int64_t zlen = c.zoff + c.N * ldz, dzlen = c.dzoff + c.N * lddz, wlen = c.shared ? c.gs : width;
    char shape[128];
    snprintf(shape, sizeof shape, "%s N=%lld G=%d gs=%d ldz=%lld lddz=%lld w_len=%lld%s",
             mode == GNORM_NORM_THEN_GATE ? "norm-gate" : "gate-norm", (long long)c.N, c.G, c.gs, (long long)ldz,
             (long long)lddz, (long long)wlen, no_scratch ? " no scratch" : "");
    float *x = rnd(n, 1.0f), *z = rnd(zlen, 1.5f), *w = rnd_w(wlen), *out = tu_hbuf(n), *rstd = tu_hbuf(c.N * c.G);
    float *nan = tu_nans(n);
    cpu->gated_rmsnorm_fwd(cpu, out, rstd, x, z + c.zoff, ldz, w, wlen, c.N, c.G, c.gs, eps, mode);
    void *dxx = tu_dev_act(gpu, x, n), *dz_ = tu_dev_act(gpu, z, zlen), *dw_ = tu_dev_act(gpu, w, wlen),
         *dout = tu_dev_act(gpu, nan, n);
    float *drs = tu_dev_f32(gpu, nan, c.N * c.G);
    gpu->gated_rmsnorm_fwd(gpu, dout, drs, dxx, tu_gat(gpu, dz_, c.zoff), ldz, dw_, wlen, c.N, c.G, c.gs, eps, mode);
    fails += !tu_sync(gpu, "gated_rmsnorm_fwd", shape) ||
             !check_act("gated_rmsnorm_fwd out", shape, dout, out, n, BF16) ||
             !check_f32("gated_rmsnorm_fwd rstd", shape, drs, rstd, c.N * c.G, F32);

    float *g = rnd(n, 1.0f), *dx = tu_hbuf(n), *dz0 = rnd(dzlen, 1.0f), *dz = tu_hdup(dz0, dzlen);
    float *dw0 = rnd_f32(wlen, 1.0f), *dw = tu_hdup(dw0, wlen);
    float *dzinit = poisoned(dz0, dzlen, c.dzoff, c.N, width, lddz);
    void *dg = tu_dev_act(gpu, g, n), *ddx = tu_dev_act(gpu, nan, n), *ddz = tu_dev_act(gpu, dzinit, dzlen);
    float *drstd = tu_dev_f32(gpu, rstd, c.N * c.G), *ddw = tu_dev_f32(gpu, dw0, wlen);
    size_t mark = no_scratch ? scratch_fill(gpu) : 0;
    for (int call = 1; call <= 2; call++) { // dw += ; dx, dz = : poisoned again before each call
        char s2[160];
        snprintf(s2, sizeof s2, "%s call %d", shape, call);
        tu_upload_act(gpu, ddx, nan, n);
        tu_upload_act(gpu, ddz, dzinit, dzlen);
        cpu->gated_rmsnorm_bwd(cpu, dx, dz + c.dzoff, lddz, dw, g, x, z + c.zoff, ldz, w, wlen, rstd, c.N, c.G, c.gs,
                               mode);
        gpu->gated_rmsnorm_bwd(gpu, ddx, tu_gat(gpu, ddz, c.dzoff), lddz, ddw, dg, dxx, tu_gat(gpu, dz_, c.zoff), ldz,
                               dw_, wlen, drstd, c.N, c.G, c.gs, mode);
        fails += !tu_sync(gpu, "gated_rmsnorm_bwd", s2) || !check_act("gated_rmsnorm_bwd dx", s2, ddx, dx, n, BF16) ||
                 !check_act("gated_rmsnorm_bwd dz", s2, ddz, dz, dzlen, BF16) ||
                 !check_f32("gated_rmsnorm_bwd dw", s2, ddw, dw, wlen, F32);
    }
    if (no_scratch) arena_reset(&gpu->scratch, mark);
    free(x), free(z), free(w), free(out), free(rstd), free(nan), free(g), free(dx), free(dz0), free(dz), free(dw0);
    free(dw), free(dzinit);
    tu_dev_free(gpu, dxx), tu_dev_free(gpu, dz_), tu_dev_free(gpu, dw_), tu_dev_free(gpu, dout), tu_dev_free(gpu, drs),
        tu_dev_free(gpu, dg), tu_dev_free(gpu, ddx), tu_dev_free(gpu, ddz), tu_dev_free(gpu, drstd);
    tu_dev_free(gpu, ddw);
    return fails;
}

static void test_gated_rmsnorm(void **st) {
    setup_backends();
    int fails = 0;
    gncase_t cases[] = {
        {.N = 1, .G = 1, .gs = 64, .shared = 1},
        {.N = 7, .G = 4, .gs = 128, .ldz = 4 * 128 + 37, .zoff = 5, .lddz = 4 * 128 + 3, .dzoff = 2, .shared = 1},
        {.N = 33, .G = 3, .gs = 77, .lddz = 3 * 77 + 3, .shared = 0},
        // Mamba-2: z is the first d_inner columns of the in-projection row
        {.N = 100, .G = 8, .gs = 64, .ldz = 2 * 8 * 64 + 2 * 128 + 8, .lddz = 2 * 8 * 64 + 2 * 128 + 8, .shared = 0},
        // GDN: z is a slice of the projection (offset), groups share w
        {.N = 64, .G = 16, .gs = 128, .ldz = 16 * 128 * 2, .zoff = 16 * 128, .shared = 1},
        {.N = 5, .G = 2, .gs = 2, .shared = 0},
        {.N = 300, .G = 1, .gs = 2048, .shared = 1},
        {.N = 13, .G = 5, .gs = 6, .shared = 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int mode = 0; mode < 2; mode++)
            fails += gnorm_case(cases[i], mode, 0);
    fails += gnorm_case(cases[1], GNORM_NORM_THEN_GATE, 1);
    fails += gnorm_case(cases[3], GNORM_GATE_THEN_NORM, 1);
    assert_int_equal(fails, 0);
}

static void test_l2norm(void **st) {
    setup_backends();
    int fails = 0;
    const int64_t cases[][3] = {{1, 128, 128},    {333, 128, 128}, {50, 77, 100}, {7, 64, 192},
                                {2048, 128, 512}, {9, 2, 3},       {20, 50, 66}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t N = cases[ci][0], ld = cases[ci][2];
        int dim = (int)cases[ci][1];
        int64_t len = N * ld;
        char shape[96];
        snprintf(shape, sizeof shape, "N=%lld dim=%d ld=%lld", (long long)N, dim, (long long)ld);
        const float eps = 1e-6f;
        float *x = rnd(len, 1.0f), *y0 = rnd(len, 1.0f), *y = tu_hdup(y0, len), *rn = tu_hbuf(N), *nan = tu_nans(N);
        cpu->l2norm_fwd(cpu, y, rn, x, ld, N, dim, eps);
        float *yinit = poisoned(y0, len, 0, N, dim, ld);
        void *dxx = tu_dev_act(gpu, x, len), *dy = tu_dev_act(gpu, yinit, len);
        float *drn = tu_dev_f32(gpu, nan, N);
        gpu->l2norm_fwd(gpu, dy, drn, dxx, ld, N, dim, eps);
        fails += !tu_sync(gpu, "l2norm_fwd", shape) || !check_act("l2norm_fwd y", shape, dy, y, len, BF16) ||
                 !check_f32("l2norm_fwd rnorm", shape, drn, rn, N, F32);

        // backward from the CPU's y (rounded: the GPU stores it in bf16) and rnorm
        round_like_gpu(y, len);
        float *g = rnd(len, 1.0f), *dx0 = rnd(len, 1.0f), *dx = tu_hdup(dx0, len);
        cpu->l2norm_bwd(cpu, dx, ld, g, y, rn, N, dim);
        float *dxinit = poisoned(dx0, len, 0, N, dim, ld);
        void *dg = tu_dev_act(gpu, g, len), *dyy = tu_dev_act(gpu, y, len), *ddx = tu_dev_act(gpu, dxinit, len);
        float *drn2 = tu_dev_f32(gpu, rn, N);
        gpu->l2norm_bwd(gpu, ddx, ld, dg, dyy, drn2, N, dim);
        fails += !tu_sync(gpu, "l2norm_bwd", shape) || !check_act("l2norm_bwd dx", shape, ddx, dx, len, BF16);
        free(x), free(y0), free(y), free(rn), free(nan), free(yinit), free(g), free(dx0), free(dx), free(dxinit);
        tu_dev_free(gpu, dxx), tu_dev_free(gpu, dy), tu_dev_free(gpu, drn), tu_dev_free(gpu, dg), tu_dev_free(gpu, dyy),
            tu_dev_free(gpu, ddx), tu_dev_free(gpu, drn2);
    }
    assert_int_equal(fails, 0);
}

// ==== RoPE ==================================================================================

static void test_rope(void **st) {
    setup_backends();
    int fails = 0;
    // N, nh, dr, hs, ld, offset of the rotated part, n_pos
    const int64_t cases[][7] = {
        {1, 1, 2, 2, 2, 0, 1},           {7, 4, 64, 64, 256, 0, 16},
        {33, 3, 64, 192, 584, 128, 40}, // MLA q: rope part after d_nope = 128 in heads of 192
        {100, 1, 128, 128, 128, 0, 100}, {5, 2, 512, 512, 1024, 0, 7},
        {9, 5, 6, 10, 50, 2, 9},         {300, 8, 64, 64, 8 * 64 + 2 * 128, 0, 4096},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int style = 0; style < 2; style++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int64_t *c = cases[ci];
                int64_t N = c[0], hs = c[3], ld = c[4], off = c[5], npos = c[6];
                int nh = (int)c[1], dr = (int)c[2], half = dr / 2;
                int64_t len = off + N * ld + dr;
                char shape[128];
                snprintf(shape, sizeof shape, "%s N=%lld nh=%d dr=%d hs=%lld ld=%lld off=%lld",
                         style == ROPE_NEOX ? "neox" : "interleaved", (long long)N, nh, dr, (long long)hs,
                         (long long)ld, (long long)off);
                float *cs = tu_hbuf(npos * half), *sn = tu_hbuf(npos * half);
                for (int64_t p = 0; p < npos; p++)
                    for (int i = 0; i < half; i++) {
                        float ang = (float)p * powf(10000.0f, -(float)i / (float)half);
                        cs[p * half + i] = 1.1f * cosf(ang), sn[p * half + i] = 1.1f * sinf(ang); // mscale 1.1
                    }
                int32_t *pos = rnd_ids(N, (int)npos);
                float *x = rnd(len, 1.0f), *ref = tu_hdup(x, len);
                if (bwd)
                    cpu->rope_bwd(cpu, ref + off, ld, hs, pos, cs, sn, N, nh, dr, style);
                else
                    cpu->rope_fwd(cpu, ref + off, ld, hs, pos, cs, sn, N, nh, dr, style);
                void *dx = tu_dev_act(gpu, x, len);
                float *dc = tu_dev_f32(gpu, cs, npos * half), *ds = tu_dev_f32(gpu, sn, npos * half);
                int32_t *dp = tu_dev_i32(gpu, pos, N);
                const char *op = bwd ? "rope_bwd" : "rope_fwd";
                if (bwd)
                    gpu->rope_bwd(gpu, tu_gat(gpu, dx, off), ld, hs, dp, dc, ds, N, nh, dr, style);
                else
                    gpu->rope_fwd(gpu, tu_gat(gpu, dx, off), ld, hs, dp, dc, ds, N, nh, dr, style);
                fails += !tu_sync(gpu, op, shape) || !check_act(op, shape, dx, ref, len, BF16);
                free(cs), free(sn), free(pos), free(x), free(ref);
                tu_dev_free(gpu, dx), tu_dev_free(gpu, dc), tu_dev_free(gpu, ds), tu_dev_free(gpu, dp);
            }
    assert_int_equal(fails, 0);
}

// rope_kv_append: rows [q | k | v] of one product (a decode step's
// attention), each row its own sequence in one of two cache buffers, at a
// random position. q: rope_fwd's result, one rounding: BF16 (the k and v
// columns must stay as they were, which BF16 of equal values also checks).
// K caches: the rotated k, BF16; the rest of each cache must survive. V
// caches: copies of bf16 values, EXACT.
static void test_rope_kv_append(void **st) {
    setup_backends();
    int fails = 0;
    // N, H, Hkv, dh (SmolLM2-135M: 9, 3, 64)
    const int cases[][4] = {{1, 9, 3, 64}, {3, 9, 3, 64}, {8, 4, 4, 128}, {11, 5, 1, 6}, {2, 3, 3, 2}};
    enum { R = 2, CAP = 37 };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], H = cases[ci][1], Hkv = cases[ci][2], dh = cases[ci][3], half = dh / 2;
        const int64_t qw = (int64_t)H * dh, kw = (int64_t)Hkv * dh, P = qw + 2 * kw, n = N * P;
        const int64_t per = (int64_t)((N + R - 1) / R) * CAP * kw; // one buffer's sequences
        char shape[96];
        snprintf(shape, sizeof shape, "N=%d H=%d Hkv=%d dh=%d", N, H, Hkv, dh);
        float *cs = tu_hbuf((int64_t)CAP * half), *sn = tu_hbuf((int64_t)CAP * half);
        for (int p = 0; p < CAP; p++)
            for (int i = 0; i < half; i++) {
                float ang = (float)p * powf(10000.0f, -(float)i / (float)half);
                cs[p * half + i] = cosf(ang), sn[p * half + i] = sinf(ang);
            }
        int32_t *pos = rnd_ids(N, CAP);
        float *qkv = rnd(n, 1.0f), *ref = tu_hdup(qkv, n), *kc[R], *vc[R], *kref[R], *vref[R];
        void *kc_d[R], *vc_d[R], *rows_h[2 * N], *rows_d[2 * N];
        for (int b = 0; b < R; b++) {
            kc[b] = rnd(per, 1.0f), vc[b] = rnd(per, 1.0f), kref[b] = tu_hdup(kc[b], per),
            vref[b] = tu_hdup(vc[b], per);
            kc_d[b] = tu_dev_act(gpu, kc[b], per), vc_d[b] = tu_dev_act(gpu, vc[b], per);
        }
        for (int r = 0; r < N; r++) {
            int64_t first = (int64_t)(r / R) * CAP * kw; // the sequence's row 0
            rows_h[r] = kref[r % R] + first, rows_h[N + r] = vref[r % R] + first;
            rows_d[r] = tu_gat(gpu, kc_d[r % R], first), rows_d[N + r] = tu_gat(gpu, vc_d[r % R], first);
        }
        // the reference: q rotated in place; k rotated in a copy, then both appended
        float *k_rot = tu_hdup(qkv, n);
        cpu->rope_fwd(cpu, ref, P, dh, pos, cs, sn, N, H, dh, ROPE_NEOX);
        cpu->rope_fwd(cpu, k_rot + qw, P, dh, pos, cs, sn, N, Hkv, dh, ROPE_NEOX);
        cpu->kv_append(cpu, rows_h, rows_h + N, (be_pages_t){0}, kw, 0, pos, k_rot + qw, P, (int)kw, qkv + qw + kw, P,
                       (int)kw, N);
        void *dqkv = tu_dev_act(gpu, qkv, n);
        float *dc = tu_dev_f32(gpu, cs, (int64_t)CAP * half), *ds = tu_dev_f32(gpu, sn, (int64_t)CAP * half);
        int32_t *dp = tu_dev_i32(gpu, pos, N);
        void **drows = gpu->alloc(gpu, sizeof rows_d);
        assert_non_null(drows);
        assert_int_equal(gpu->copy_h2d(gpu, drows, rows_d, sizeof rows_d), 0);
        gpu->rope_kv_append(gpu, dqkv, P, tu_gat(gpu, dqkv, qw), P, tu_gat(gpu, dqkv, qw + kw), P, dp, dc, ds, drows,
                            drows + N, (be_pages_t){0}, N, H, Hkv, dh);
        int ok = tu_sync(gpu, "rope_kv_append", shape) && check_act("rope_kv_append q", shape, dqkv, ref, n, BF16);
        for (int b = 0; b < R && ok; b++)
            ok = check_act("rope_kv_append K cache", shape, kc_d[b], kref[b], per, BF16) &&
                 check_act("rope_kv_append V cache", shape, vc_d[b], vref[b], per, EXACT);
        fails += !ok;
        for (int b = 0; b < R; b++) {
            free(kc[b]), free(vc[b]), free(kref[b]), free(vref[b]);
            tu_dev_free(gpu, kc_d[b]), tu_dev_free(gpu, vc_d[b]);
        }
        free(cs), free(sn), free(pos), free(qkv), free(ref), free(k_rot);
        tu_dev_free(gpu, dqkv), tu_dev_free(gpu, dc), tu_dev_free(gpu, ds), tu_dev_free(gpu, dp);
        gpu->free(gpu, drows);
    }
    assert_int_equal(fails, 0);
}

// mla_rope_append: an MLA step's projected q (H heads of qd values, q_pe the
// last dr of each) and its [c | k_pe] rows of one product at stride ldk, each
// row its own sequence in one of two latent caches, at a random position. q:
// rope_fwd's result on q_pe, one rounding, the rest untouched: BF16. Caches:
// the latent copied (EXACT would hold; BF16 covers the rotated k_pe beside it)
// and the rest of each cache surviving.
static void test_mla_rope_append(void **st) {
    setup_backends();
    int fails = 0;
    // N, H, d_nope, dr, r_kv (the SmolLM2 hybrid: 9 heads, 32 + 32, 48; HyLo-3B: 24, 64 + 64, 128)
    const int cases[][5] = {{1, 9, 32, 32, 48}, {3, 9, 32, 32, 48}, {8, 24, 64, 64, 128}, {5, 2, 0, 6, 10}};
    enum { R = 2, CAP = 37 };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int N = cases[ci][0], H = cases[ci][1], dn = cases[ci][2], dr = cases[ci][3], rkv = cases[ci][4];
        const int qd = dn + dr, half = dr / 2, L = rkv + dr;
        const int64_t ldq = (int64_t)H * qd, nq = N * ldq, ld = L + 3, nkv = N * ld; // kv rows at a stride
        const int64_t per = (int64_t)((N + R - 1) / R) * CAP * L;                    // one buffer's sequences
        char shape[96];
        snprintf(shape, sizeof shape, "N=%d H=%d d_nope=%d dr=%d r_kv=%d", N, H, dn, dr, rkv);
        float *cs = tu_hbuf((int64_t)CAP * half), *sn = tu_hbuf((int64_t)CAP * half);
        for (int p = 0; p < CAP; p++)
            for (int i = 0; i < half; i++) {
                float ang = (float)p * powf(10000.0f, -(float)i / (float)half);
                cs[p * half + i] = cosf(ang), sn[p * half + i] = sinf(ang);
            }
        int32_t *pos = rnd_ids(N, CAP);
        float *q = rnd(nq, 1.0f), *qref = tu_hdup(q, nq), *kv = rnd(nkv, 1.0f), *kv_rot = tu_hdup(kv, nkv);
        float *cache[R], *cref[R];
        void *cache_d[R], *rows_h[N], *rows_d[N];
        for (int b = 0; b < R; b++) {
            cache[b] = rnd(per, 1.0f), cref[b] = tu_hdup(cache[b], per);
            cache_d[b] = tu_dev_act(gpu, cache[b], per);
        }
        for (int r = 0; r < N; r++) {
            int64_t first = (int64_t)(r / R) * CAP * L; // the sequence's row 0
            rows_h[r] = cref[r % R] + first, rows_d[r] = tu_gat(gpu, cache_d[r % R], first);
        }
        // the reference: rope_fwd of q_pe and of k_pe (in a copy), then kv_append
        cpu->rope_fwd(cpu, qref + dn, ldq, qd, pos, cs, sn, N, H, dr, ROPE_INTERLEAVED);
        cpu->rope_fwd(cpu, kv_rot + rkv, ld, dr, pos, cs, sn, N, 1, dr, ROPE_INTERLEAVED);
        cpu->kv_append(cpu, rows_h, rows_h, (be_pages_t){0}, L, rkv, pos, kv_rot, ld, rkv, kv_rot + rkv, ld, dr, N);
        void *dq = tu_dev_act(gpu, q, nq), *dkv = tu_dev_act(gpu, kv, nkv);
        float *dc = tu_dev_f32(gpu, cs, (int64_t)CAP * half), *ds = tu_dev_f32(gpu, sn, (int64_t)CAP * half);
        int32_t *dp = tu_dev_i32(gpu, pos, N);
        void **drows = gpu->alloc(gpu, sizeof rows_d);
        assert_non_null(drows);
        assert_int_equal(gpu->copy_h2d(gpu, drows, rows_d, sizeof rows_d), 0);
        gpu->mla_rope_append(gpu, tu_gat(gpu, dq, dn), ldq, qd, dkv, ld, tu_gat(gpu, dkv, rkv), ld, dp, dc, ds, drows,
                             (be_pages_t){0}, N, H, rkv, dr);
        int ok = tu_sync(gpu, "mla_rope_append", shape) && check_act("mla_rope_append q", shape, dq, qref, nq, BF16) &&
                 check_act("mla_rope_append kv (untouched)", shape, dkv, kv, nkv, EXACT);
        for (int b = 0; b < R && ok; b++)
            ok = check_act("mla_rope_append cache", shape, cache_d[b], cref[b], per, BF16);
        fails += !ok;
        for (int b = 0; b < R; b++) {
            free(cache[b]), free(cref[b]);
            tu_dev_free(gpu, cache_d[b]);
        }
        free(cs), free(sn), free(pos), free(q), free(qref), free(kv), free(kv_rot);
        tu_dev_free(gpu, dq), tu_dev_free(gpu, dkv), tu_dev_free(gpu, dc), tu_dev_free(gpu, ds), tu_dev_free(gpu, dp);
        gpu->free(gpu, drows);
    }
    assert_int_equal(fails, 0);
}

// ==== SwiGLU =================================================================================

static void test_swiglu(void **st) {
    setup_backends();
    int fails = 0;
    const int64_t sizes[] = {1, 7, 130, 333, 8192, 100003};
    for (int si = 0; si < 6; si++)
        for (int off = 0; off < 2; off++) {
            int64_t n = sizes[si], len = n + off;
            char shape[64];
            snprintf(shape, sizeof shape, "n=%lld offset=%d", (long long)n, off);
            float *gt = rnd(len, 2.0f), *up = rnd(len, 1.0f), *out = tu_hbuf(len), *nan = tu_nans(len);
            // outputs compared from `off` on (element 0 of an offset buffer is outside the op)
            cpu->swiglu_fwd(cpu, out + off, gt + off, up + off, n, 1, n);
            void *dgt = tu_dev_act(gpu, gt, len), *dup_ = tu_dev_act(gpu, up, len), *dout = tu_dev_act(gpu, nan, len);
            gpu->swiglu_fwd(gpu, tu_gat(gpu, dout, off), tu_gat(gpu, dgt, off), tu_gat(gpu, dup_, off), n, 1, n);
            int okf = tu_sync(gpu, "swiglu_fwd", shape);
            float *h = tu_host_act(gpu, dout, len);
            fails += !okf || !check("swiglu_fwd", shape, h + off, out + off, n, BF16);
            free(h);

            float *g = rnd(len, 1.0f), *dg = tu_hbuf(len), *du = tu_hbuf(len);
            cpu->swiglu_bwd(cpu, dg + off, du + off, g + off, gt + off, up + off, n);
            void *dd = tu_dev_act(gpu, g, len), *ddg = tu_dev_act(gpu, nan, len), *ddu = tu_dev_act(gpu, nan, len);
            gpu->swiglu_bwd(gpu, tu_gat(gpu, ddg, off), tu_gat(gpu, ddu, off), tu_gat(gpu, dd, off),
                            tu_gat(gpu, dgt, off), tu_gat(gpu, dup_, off), n);
            int ok = tu_sync(gpu, "swiglu_bwd", shape);
            float *hg = tu_host_act(gpu, ddg, len), *hu = tu_host_act(gpu, ddu, len);
            ok = ok && check("swiglu_bwd dgate", shape, hg + off, dg + off, n, BF16);
            ok = ok && check("swiglu_bwd dup", shape, hu + off, du + off, n, BF16);
            fails += !ok;
            free(gt), free(up), free(out), free(nan), free(g), free(dg), free(du), free(hg), free(hu);
            tu_dev_free(gpu, dgt), tu_dev_free(gpu, dup_), tu_dev_free(gpu, dout), tu_dev_free(gpu, dd),
                tu_dev_free(gpu, ddg), tu_dev_free(gpu, ddu);
        }
    // rows of one product's output [gate | up] (a decode step's MLP): N rows of
    // f, row stride 2 f, up = gate + f; odd f takes the scalar path
    const int64_t rows_f[][2] = {{1, 1536}, {3, 7}, {64, 1536}, {5, 8192}};
    for (int ci = 0; ci < 4; ci++) {
        const int64_t N = rows_f[ci][0], f = rows_f[ci][1];
        char shape[64];
        snprintf(shape, sizeof shape, "N=%lld f=%lld rows [gate | up]", (long long)N, (long long)f);
        float *gu = rnd(N * 2 * f, 2.0f), *out = tu_hbuf(N * f), *nan = tu_nans(N * f);
        cpu->swiglu_fwd(cpu, out, gu, gu + f, 2 * f, N, f);
        void *dgu = tu_dev_act(gpu, gu, N * 2 * f), *dout = tu_dev_act(gpu, nan, N * f);
        gpu->swiglu_fwd(gpu, dout, dgu, tu_gat(gpu, dgu, f), 2 * f, N, f);
        fails += !tu_sync(gpu, "swiglu_fwd", shape) || !check_act("swiglu_fwd", shape, dout, out, N * f, BF16);
        free(gu), free(out), free(nan);
        tu_dev_free(gpu, dgu), tu_dev_free(gpu, dout);
    }
    assert_int_equal(fails, 0);
}

// ==== a decode step's fused products (cuda_core.cu k_gemv_swiglu, k_gemv_add_rmsnorm,
// k_gemv_rope_kv_append) ====
// N <= 8 rows in one launch, more in launches of 8; K a multiple of 8 takes
// 16-byte loads, an odd K (or an odd row stride) the scalar path.

typedef struct {
    int64_t N, K, f, ldx; // ldx 0: K
    int adjacent;         // Wg, Wu the two halves of one matrix [gate | up] (the MLP's layout)
    int norm;             // x's rows RMS-normalised with a gain first (a decode step's residual stream)
} sgcase_t;

// h = silu(x Wg^T) * (x Wu^T), with a gain: of rmsnorm(x) first. Reference:
// the CPU op (the norm, the two products and swiglu_fwd in fp32, bit for bit:
// test_decode_ops). The GPU sums each product (and the rows' sums of
// squares) in fp32 in another order and rounds h once: BF16. Normed rows are
// drawn with standard deviation 4, so that a missing norm is far off.
static int proj_swiglu_case(sgcase_t c) {
    int64_t ldx = c.ldx ? c.ldx : c.K, xlen = c.N * ldx, wlen = c.f * c.K, hlen = c.N * c.f;
    char shape[128];
    snprintf(shape, sizeof shape, "N=%lld K=%lld f=%lld ldx=%lld%s%s", (long long)c.N, (long long)c.K, (long long)c.f,
             (long long)ldx, c.adjacent ? " [gate | up]" : "", c.norm ? " normed" : "");
    float *x = rnd(xlen, c.norm ? 4.0f : 1.0f), *W = rnd(2 * wlen, 0.05f), *gain = rnd_w(c.K);
    float *ref = tu_hbuf(hlen), *nan = tu_nans(hlen);
    float *Wg = W, *Wu = W + wlen;
    cpu->proj_swiglu(cpu, ref, x, ldx, c.norm ? gain : NULL, 1e-5f, Wg, Wu, c.N, c.K, c.f);
    void *dx = tu_dev_act(gpu, x, xlen), *dh = tu_dev_act(gpu, nan, hlen), *dgain = tu_dev_act(gpu, gain, c.K);
    void *dW = c.adjacent ? tu_dev_act(gpu, W, 2 * wlen) : NULL;
    void *dWg = c.adjacent ? dW : tu_dev_act(gpu, Wg, wlen),
         *dWu = c.adjacent ? tu_gat(gpu, dW, wlen) : tu_dev_act(gpu, Wu, wlen);
    gpu->proj_swiglu(gpu, dh, dx, ldx, c.norm ? dgain : NULL, 1e-5f, dWg, dWu, c.N, c.K, c.f);
    int fails = !tu_sync(gpu, "proj_swiglu", shape) || !check_act("proj_swiglu h", shape, dh, ref, hlen, BF16);
    free(x), free(W), free(gain), free(ref), free(nan);
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dh), tu_dev_free(gpu, dgain);
    if (c.adjacent) {
        tu_dev_free(gpu, dW);
    } else {
        tu_dev_free(gpu, dWg), tu_dev_free(gpu, dWu);
    }
    return fails;
}

static void test_proj_swiglu(void **st) {
    setup_backends();
    int fails = 0;
    sgcase_t cases[] = {
        {.N = 1, .K = 576, .f = 1536, .adjacent = 1}, // SmolLM2-135M's MLP, one row
        {.N = 3, .K = 576, .f = 1536},
        {.N = 8, .K = 576, .f = 1536, .adjacent = 1},
        {.N = 5, .K = 333, .f = 7},                  // odd K and f: the scalar loads
        {.N = 2, .K = 256, .f = 130, .ldx = 1032},   // rows of a wider buffer
        {.N = 8, .K = 64, .f = 9, .ldx = 67},        // odd row stride: the scalar loads
        {.N = 11, .K = 576, .f = 40, .adjacent = 1}, // more than 8 rows: two launches
        // the input norm in the product (a decode step's MLP fed the residual stream)
        {.N = 1, .K = 576, .f = 1536, .adjacent = 1, .norm = 1},
        {.N = 8, .K = 576, .f = 1536, .adjacent = 1, .norm = 1},
        {.N = 5, .K = 333, .f = 7, .norm = 1}, // the scalar loads
        {.N = 2, .K = 256, .f = 130, .ldx = 1032, .norm = 1},
        {.N = 11, .K = 576, .f = 40, .adjacent = 1, .norm = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += proj_swiglu_case(cases[i]);
    assert_int_equal(fails, 0);
}

typedef struct {
    int64_t N, K, out, ldx; // ldx 0: K
} pncase_t;

// y = rmsnorm(x) W^T (proj_rmsnorm: a decode step's GDN or MLA input product
// fed the residual stream). Reference: the CPU op (rmsnorm_fwd then the
// product in fp32, bit for bit: test_decode_ops). The GPU norms in fp32 in the
// product (k_gemv one column a warp up to 4 rows, k_gemv_cols from 5; rows
// or a gain the 16-byte loads cannot take: k_gemv one value a lane) and
// rounds y once: BF16. Rows are drawn with standard deviation
// 4, so that a missing norm is far off.
static int proj_rmsnorm_case(pncase_t c) {
    const int64_t ldx = c.ldx ? c.ldx : c.K, xlen = c.N * ldx, ylen = c.N * c.out;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%lld K=%lld out=%lld ldx=%lld", (long long)c.N, (long long)c.K, (long long)c.out,
             (long long)ldx);
    float *x = rnd(xlen, 4.0f), *W = rnd(c.out * c.K, 0.05f), *gain = rnd_w(c.K), *ref = tu_hbuf(ylen);
    float *nan = tu_nans(ylen);
    cpu->proj_rmsnorm(cpu, ref, x, ldx, gain, 1e-5f, W, c.N, c.K, c.out);
    void *dx = tu_dev_act(gpu, x, xlen), *dW = tu_dev_act(gpu, W, c.out * c.K), *dg = tu_dev_act(gpu, gain, c.K);
    void *dy = tu_dev_act(gpu, nan, ylen);
    gpu->proj_rmsnorm(gpu, dy, dx, ldx, dg, 1e-5f, dW, c.N, c.K, c.out);
    int fails = !tu_sync(gpu, "proj_rmsnorm", shape) || !check_act("proj_rmsnorm y", shape, dy, ref, ylen, BF16);
    free(x), free(W), free(gain), free(ref), free(nan);
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dW), tu_dev_free(gpu, dg), tu_dev_free(gpu, dy);
    return fails;
}

static void test_proj_rmsnorm(void **st) {
    setup_backends();
    int fails = 0;
    pncase_t cases[] = {
        {.N = 1, .K = 576, .out = 1538}, // SmolLM2's 10MLA20GDN: a GDN layer's joint input product
        {.N = 1, .K = 576, .out = 368},  // and an MLA layer's joint q_a / kv_a
        {.N = 4, .K = 576, .out = 1538}, // one column a warp
        {.N = 5, .K = 576, .out = 368},  // four columns a warp
        {.N = 8, .K = 3072, .out = 130}, {.N = 3, .K = 256, .out = 64, .ldx = 1032}, // rows of a wider buffer
        {.N = 2, .K = 333, .out = 17},                                               // odd K: one value a lane
        {.N = 11, .K = 576, .out = 40},                                              // more than 8 rows: two launches
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += proj_rmsnorm_case(cases[i]);
    assert_int_equal(fails, 0);
}

typedef struct {
    int64_t N, K, lda; // lda 0: K
    int d, norm;       // norm 0: the last layer (the add alone)
} ancase_t;

// x += a W^T, then xn = rmsnorm(x) w, twice over the same buffers (the
// second launch finds the blocks' count reset by the first). x: the
// reference is the CPU's product added in fp32, unrounded; the GPU adds its
// fp32 sum (another order) and rounds once: BF16. xn: the reference is
// rmsnorm_fwd of the x the GPU holds (so that an element rounded the other
// way across a boundary does not count twice), one rounding: BF16. Without
// a norm xn is not touched: EXACT.
static int proj_add_rmsnorm_case(ancase_t c) {
    const float eps = 1e-5f;
    int64_t lda = c.lda ? c.lda : c.K, alen = c.N * lda, n = c.N * c.d;
    char shape[128];
    snprintf(shape, sizeof shape, "N=%lld K=%lld d=%d lda=%lld%s", (long long)c.N, (long long)c.K, c.d, (long long)lda,
             c.norm ? "" : " no norm (last layer)");
    float *a = rnd(alen, 1.0f), *W = rnd((int64_t)c.d * c.K, 0.05f), *w = rnd_w(c.d), *x = rnd(n, 1.0f);
    float *y = tu_hbuf(n), *xn0 = rnd(n, 1.0f), *xn = tu_hdup(xn0, n), *nan = tu_nans(n);
    void *da = tu_dev_act(gpu, a, alen), *dW = tu_dev_act(gpu, W, (int64_t)c.d * c.K), *dw = tu_dev_act(gpu, w, c.d);
    void *dx = tu_dev_act(gpu, x, n), *dxn = tu_dev_act(gpu, c.norm ? nan : xn0, n);
    int fails = 0;
    for (int call = 1; call <= 2; call++) {
        char s2[160];
        snprintf(s2, sizeof s2, "%s call %d", shape, call);
        cpu->gemm(cpu, 0, 1, c.N, c.d, c.K, 1.0f, a, lda, W, c.K, 0.0f, y, c.d);
        for (int64_t i = 0; i < n; i++)
            x[i] += y[i];
        if (c.norm && call == 2) tu_upload_act(gpu, dxn, nan, n);
        gpu->proj_add_rmsnorm(gpu, dxn, dx, da, lda, dW, c.norm ? dw : NULL, c.N, c.K, c.d, eps);
        int ok = tu_sync(gpu, "proj_add_rmsnorm", s2) && check_act("proj_add_rmsnorm x", s2, dx, x, n, BF16);
        // from here the reference's x is the GPU's: the norm's input, and the next call's
        float *hx = tu_host_act(gpu, dx, n);
        memcpy(x, hx, (size_t)n * sizeof(float));
        free(hx);
        if (c.norm) cpu->rmsnorm_fwd(cpu, xn, NULL, x, w, c.N, c.d, eps);
        ok = ok && check_act("proj_add_rmsnorm xn", s2, dxn, xn, n, c.norm ? BF16 : EXACT);
        fails += !ok;
    }
    free(a), free(W), free(w), free(x), free(y), free(xn0), free(xn), free(nan);
    tu_dev_free(gpu, da), tu_dev_free(gpu, dW), tu_dev_free(gpu, dw), tu_dev_free(gpu, dx), tu_dev_free(gpu, dxn);
    return fails;
}

static void test_proj_add_rmsnorm(void **st) {
    setup_backends();
    int fails = 0;
    ancase_t cases[] = {
        {.N = 1, .K = 576, .d = 576, .norm = 1},  // SmolLM2-135M's o_proj, one row
        {.N = 3, .K = 1536, .d = 576, .norm = 1}, // its down_proj
        {.N = 8, .K = 576, .d = 576, .norm = 1},
        {.N = 8, .K = 1536, .d = 576, .norm = 0}, // the last layer
        {.N = 1, .K = 64, .d = 576, .norm = 0},
        {.N = 3, .K = 333, .d = 77, .norm = 1},             // odd K and d: the scalar loads
        {.N = 5, .K = 96, .d = 131, .lda = 200, .norm = 1}, // rows of a wider buffer, odd d
        {.N = 2, .K = 64, .d = 4104, .norm = 1},            // more columns than blocks: they go round the grid
        {.N = 11, .K = 256, .d = 64, .norm = 1},            // more than 8 rows: two launches
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += proj_add_rmsnorm_case(cases[i]);
    assert_int_equal(fails, 0);
}

typedef struct {
    int N, H, Hkv, dh;
    int64_t K, ldx, ldq; // 0: K, H dh
    int paged;           // 1: one pool of pages through tables; 0: caches of their own
    int norm;            // x's rows RMS-normalised with a gain first (a decode step's residual stream)
} prcase_t;

// proj_rope_kv_append (k_gemv_rope_kv_append): x W^T for one matrix [q | k |
// v], q and k rotated, k and v appended, each row its own sequence at its own
// position (page boundaries among them when N >= 4): caches of their own in
// two buffers, or one K and one V pool whose pages each row's table lists
// out of order. Reference: the CPU op (its product then rope_kv_append, bit
// for bit: test_decode_ops). q and the K entries: rotations of the GPU's
// fp32 sums (another order) rounded once; V entries: the sums rounded once:
// BF16, as proj_swiglu (a pair rotated from the wrong columns, or an entry in
// another row's place, is O(1) off; normed rows are drawn with standard
// deviation 4, so that a missing norm is far off). The rest of q's buffer and of
// every cache must survive (buffers compared whole; q's region poisoned).
static int proj_rope_case(prcase_t c) {
    enum { NPOS = 520, R = 2, MAXN = 16 };
    static const int32_t edges[4] = {255, 256, 511, 0};
    const int half = c.dh / 2, stride = (NPOS + BE_PAGE_ROWS - 1) / BE_PAGE_ROWS, n_pages = c.N * stride;
    const int64_t qw = (int64_t)c.H * c.dh, kw = (int64_t)c.Hkv * c.dh, P = qw + 2 * kw;
    const int64_t ldx = c.ldx ? c.ldx : c.K, ldq = c.ldq ? c.ldq : qw, xlen = c.N * ldx, qlen = c.N * ldq;
    const int nbuf = c.paged ? 1 : R;
    const int64_t per = c.paged ? (int64_t)n_pages * BE_PAGE_ROWS * kw : (int64_t)((c.N + R - 1) / R) * NPOS * kw;
    char shape[128];
    snprintf(shape, sizeof shape, "N=%d H=%d Hkv=%d dh=%d K=%lld ldx=%lld ldq=%lld %s%s", c.N, c.H, c.Hkv, c.dh,
             (long long)c.K, (long long)ldx, (long long)ldq, c.paged ? "paged" : "contiguous", c.norm ? " normed" : "");
    float *cs = tu_hbuf((int64_t)NPOS * half), *sn = tu_hbuf((int64_t)NPOS * half);
    for (int p = 0; p < NPOS; p++)
        for (int i = 0; i < half; i++) {
            float ang = (float)p * powf(10000.0f, -(float)i / (float)half);
            cs[p * half + i] = cosf(ang), sn[p * half + i] = sinf(ang);
        }
    int32_t *pos = rnd_ids(c.N, NPOS), *pages = malloc(sizeof(int32_t) * n_pages);
    for (int r = 0; c.N >= 4 && r < 4; r++)
        pos[r] = edges[r];
    for (int i = 0; i < n_pages; i++) // each row's pages descending: never consecutive
        pages[i] = n_pages - 1 - i;
    float *x = rnd(xlen, c.norm ? 4.0f : 1.0f), *W = rnd(P * c.K, 0.05f), *q0 = rnd(qlen, 1.0f),
          *qref = tu_hdup(q0, qlen), *gain = rnd_w(c.K);
    float *qpois = poisoned(q0, qlen, 0, c.N, qw, ldq), *kc[R], *vc[R], *kref[R], *vref[R];
    void *kc_d[R], *vc_d[R], *rows_h[2 * MAXN], *rows_d[2 * MAXN];
    assert_true(c.N <= MAXN);
    for (int b = 0; b < nbuf; b++) {
        kc[b] = rnd(per, 1.0f), vc[b] = rnd(per, 1.0f), kref[b] = tu_hdup(kc[b], per), vref[b] = tu_hdup(vc[b], per);
        kc_d[b] = tu_dev_act(gpu, kc[b], per), vc_d[b] = tu_dev_act(gpu, vc[b], per);
    }
    for (int r = 0; r < c.N; r++) {
        const int b = c.paged ? 0 : r % R;
        const int64_t first = c.paged ? 0 : (int64_t)(r / R) * NPOS * kw; // the sequence's row 0
        rows_h[r] = kref[b] + first, rows_h[c.N + r] = vref[b] + first;
        rows_d[r] = tu_gat(gpu, kc_d[b], first), rows_d[c.N + r] = tu_gat(gpu, vc_d[b], first);
    }
    const be_pages_t pg_h = {c.paged ? pages : NULL, stride};
    cpu->proj_rope_kv_append(cpu, qref, ldq, x, ldx, c.norm ? gain : NULL, 1e-5f, W, pos, cs, sn, rows_h, rows_h + c.N,
                             pg_h, c.N, c.K, c.H, c.Hkv, c.dh);
    void *dx = tu_dev_act(gpu, x, xlen), *dW = tu_dev_act(gpu, W, P * c.K), *dq = tu_dev_act(gpu, qpois, qlen);
    void *dgain = tu_dev_act(gpu, gain, c.K);
    float *dc = tu_dev_f32(gpu, cs, (int64_t)NPOS * half), *ds = tu_dev_f32(gpu, sn, (int64_t)NPOS * half);
    int32_t *dp = tu_dev_i32(gpu, pos, c.N), *dpages = tu_dev_i32(gpu, pages, n_pages);
    void **drows = gpu->alloc(gpu, sizeof(void *) * 2 * c.N);
    assert_non_null(drows);
    assert_int_equal(gpu->copy_h2d(gpu, drows, rows_d, sizeof(void *) * 2 * c.N), 0);
    const be_pages_t pg_d = {c.paged ? dpages : NULL, stride};
    gpu->proj_rope_kv_append(gpu, dq, ldq, dx, ldx, c.norm ? dgain : NULL, 1e-5f, dW, dp, dc, ds, drows, drows + c.N,
                             pg_d, c.N, c.K, c.H, c.Hkv, c.dh);
    int ok =
        tu_sync(gpu, "proj_rope_kv_append", shape) && check_act("proj_rope_kv_append q", shape, dq, qref, qlen, BF16);
    for (int b = 0; b < nbuf && ok; b++)
        ok = check_act("proj_rope_kv_append K cache", shape, kc_d[b], kref[b], per, BF16) &&
             check_act("proj_rope_kv_append V cache", shape, vc_d[b], vref[b], per, BF16);
    for (int b = 0; b < nbuf; b++) {
        free(kc[b]), free(vc[b]), free(kref[b]), free(vref[b]);
        tu_dev_free(gpu, kc_d[b]), tu_dev_free(gpu, vc_d[b]);
    }
    free(cs), free(sn), free(pos), free(pages), free(x), free(W), free(q0), free(qref), free(qpois), free(gain);
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dW), tu_dev_free(gpu, dq), tu_dev_free(gpu, dc), tu_dev_free(gpu, ds);
    tu_dev_free(gpu, dgain);
    tu_dev_free(gpu, dp), tu_dev_free(gpu, dpages);
    gpu->free(gpu, drows);
    return !ok;
}

static void test_proj_rope_kv_append(void **st) {
    setup_backends();
    int fails = 0;
    prcase_t cases[] = {
        {.N = 1, .H = 9, .Hkv = 3, .dh = 64, .K = 576},                        // SmolLM2-135M, one row
        {.N = 8, .H = 9, .Hkv = 3, .dh = 64, .K = 576},                        // eight rows
        {.N = 8, .H = 9, .Hkv = 3, .dh = 64, .K = 576, .paged = 1},            // the server's paged caches
        {.N = 3, .H = 9, .Hkv = 3, .dh = 64, .K = 576, .paged = 1},            // three rows, paged
        {.N = 4, .H = 4, .Hkv = 4, .dh = 128, .K = 256},                       // head dim 128, MHA
        {.N = 2, .H = 8, .Hkv = 2, .dh = 128, .K = 512, .paged = 1},           // head dim 128, GQA 4:1
        {.N = 5, .H = 3, .Hkv = 1, .dh = 6, .K = 333},                         // odd K: the scalar loads
        {.N = 6, .H = 4, .Hkv = 2, .dh = 32, .K = 96, .ldx = 100, .ldq = 140}, // rows of wider buffers
        {.N = 11, .H = 6, .Hkv = 2, .dh = 16, .K = 64, .paged = 1},            // more than 8 rows: two launches
        // the input norm in the product (a decode step's attention fed the residual stream)
        {.N = 1, .H = 9, .Hkv = 3, .dh = 64, .K = 576, .norm = 1},
        {.N = 8, .H = 9, .Hkv = 3, .dh = 64, .K = 576, .paged = 1, .norm = 1},
        {.N = 5, .H = 3, .Hkv = 1, .dh = 6, .K = 333, .norm = 1}, // the scalar loads
        {.N = 6, .H = 4, .Hkv = 2, .dh = 32, .K = 96, .ldx = 100, .ldq = 140, .norm = 1},
        {.N = 11, .H = 6, .Hkv = 2, .dh = 16, .K = 64, .paged = 1, .norm = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += proj_rope_case(cases[i]);
    assert_int_equal(fails, 0);
}

// ==== depthwise causal conv ======================================================================

typedef struct {
    int B, T, C, W;
    int64_t ldx, lddx; // 0 = C
    int bias, state, dstate, silu;
} ccase_t;

static int conv_case(ccase_t c, int no_scratch) {
    int fails = 0;
    int64_t ldx = c.ldx ? c.ldx : c.C, lddx = c.lddx ? c.lddx : c.C;
    int64_t BT = (int64_t)c.B * c.T, xlen = BT * ldx, dxlen = BT * lddx, ylen = BT * c.C;
    int64_t slen = (int64_t)c.B * c.C * c.W, wlen = (int64_t)c.C * c.W;
    char shape[160];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d W=%d ldx=%lld lddx=%lld%s%s%s%s", c.B, c.T, c.C, c.W, (long long)ldx,
             (long long)lddx, c.bias ? " bias" : "", c.state ? " state" : "", c.silu ? " silu" : " linear",
             no_scratch ? " no scratch" : "");
    float *x = rnd(xlen, 1.0f), *w = rnd(wlen, 0.5f), *bias = c.bias ? rnd(c.C, 0.5f) : NULL;
    float *state = c.state ? rnd(slen, 1.0f) : NULL;
    float *y = tu_hbuf(ylen), *nan = tu_nans(ylen > slen ? ylen : slen);
    cpu->conv1d_fwd(cpu, y, x, ldx, w, bias, state, c.B, c.T, c.C, c.W, c.silu);
    void *dxx = tu_dev_act(gpu, x, xlen), *dw_ = tu_dev_act(gpu, w, wlen),
         *db = c.bias ? tu_dev_act(gpu, bias, c.C) : NULL;
    void *dst = c.state ? tu_dev_act(gpu, state, slen) : NULL, *dy = tu_dev_act(gpu, nan, ylen);
    gpu->conv1d_fwd(gpu, dy, dxx, ldx, dw_, db, dst, c.B, c.T, c.C, c.W, c.silu);
    fails += !tu_sync(gpu, "conv1d_fwd", shape) || !check_act("conv1d_fwd y", shape, dy, y, ylen, BF16);

    float *g = rnd(ylen, 1.0f), *dx0 = rnd(dxlen, 1.0f), *dx = tu_hdup(dx0, dxlen);
    float *dw0 = rnd_f32(wlen, 1.0f), *dwr = tu_hdup(dw0, wlen), *dbias0 = rnd_f32(c.C, 1.0f),
          *dbias = tu_hdup(dbias0, c.C);
    float *dstate = tu_hbuf(slen);
    float *dxinit = poisoned(dx0, dxlen, 0, BT, c.C, lddx);
    void *dg = tu_dev_act(gpu, g, ylen), *ddx = tu_dev_act(gpu, dxinit, dxlen);
    float *ddw = tu_dev_f32(gpu, dw0, wlen), *ddb = c.bias ? tu_dev_f32(gpu, dbias0, c.C) : NULL,
          *dds = c.dstate ? tu_dev_f32(gpu, nan, slen) : NULL;
    size_t mark = no_scratch ? scratch_fill(gpu) : 0;
    for (int call = 1; call <= 2; call++) { // dw, dbias += ; dx, dstate = (poisoned again before each call)
        char s2[200];
        snprintf(s2, sizeof s2, "%s call %d", shape, call);
        tu_upload_act(gpu, ddx, dxinit, dxlen);
        if (dds) tu_upload_f32(gpu, dds, nan, slen);
        cpu->conv1d_bwd(cpu, dx, lddx, dwr, c.bias ? dbias : NULL, c.dstate ? dstate : NULL, g, x, ldx, w, bias, state,
                        c.B, c.T, c.C, c.W, c.silu);
        gpu->conv1d_bwd(gpu, ddx, lddx, ddw, ddb, dds, dg, dxx, ldx, dw_, db, dst, c.B, c.T, c.C, c.W, c.silu);
        int ok = tu_sync(gpu, "conv1d_bwd", s2);
        ok = ok && check_act("conv1d_bwd dx", s2, ddx, dx, dxlen, BF16);
        ok = ok && check_f32("conv1d_bwd dw", s2, ddw, dwr, wlen, F32);
        if (ok && c.bias) ok = check_f32("conv1d_bwd dbias", s2, ddb, dbias, c.C, F32);
        if (ok && c.dstate) ok = check_f32("conv1d_bwd dstate", s2, dds, dstate, slen, F32);
        fails += !ok;
    }
    if (no_scratch) arena_reset(&gpu->scratch, mark);

    // state roll after the forward (state on entry: the case's state, or random values when it has none)
    float *s0 = c.state ? tu_hdup(state, slen) : rnd(slen, 1.0f), *sref = tu_hdup(s0, slen);
    cpu->conv1d_update_state(cpu, sref, x, ldx, c.B, c.T, c.C, c.W);
    void *ds0 = tu_dev_act(gpu, s0, slen);
    gpu->conv1d_update_state(gpu, ds0, dxx, ldx, c.B, c.T, c.C, c.W);
    fails +=
        !tu_sync(gpu, "conv1d_update_state", shape) || !check_act("conv1d_update_state", shape, ds0, sref, slen, EXACT);

    free(x), free(w), free(bias), free(state), free(y), free(nan), free(g), free(dx0), free(dx), free(dw0), free(dwr);
    free(dbias0), free(dbias), free(dstate), free(dxinit), free(s0), free(sref);
    tu_dev_free(gpu, dxx), tu_dev_free(gpu, dw_), tu_dev_free(gpu, dy), tu_dev_free(gpu, dg), tu_dev_free(gpu, ddx),
        tu_dev_free(gpu, ddw), tu_dev_free(gpu, ds0);
    if (db) tu_dev_free(gpu, db);
    if (dst) tu_dev_free(gpu, dst);
    if (ddb) tu_dev_free(gpu, ddb);
    if (dds) tu_dev_free(gpu, dds);
    return fails;
}

static void test_conv1d(void **st) {
    setup_backends();
    int fails = 0;
    ccase_t cases[] = {
        {.B = 1, .T = 1, .C = 1, .W = 4, .bias = 1, .state = 1, .dstate = 1, .silu = 1}, // one decode step
        {.B = 2, .T = 7, .C = 33, .W = 4, .ldx = 40, .lddx = 35, .bias = 1, .state = 1, .dstate = 1, .silu = 1},
        {.B = 1, .T = 333, .C = 96, .W = 4, .silu = 1},
        {.B = 3, .T = 100, .C = 77, .W = 8, .ldx = 80, .bias = 1, .state = 1, .dstate = 1, .silu = 0},
        {.B = 2, .T = 64, .C = 128, .W = 2, .ldx = 384, .lddx = 384, .state = 1, .dstate = 1, .silu = 1},
        {.B = 1, .T = 1000, .C = 64, .W = 4, .bias = 1, .silu = 1}, // many chunks per sequence
        {.B = 2, .T = 5, .C = 16, .W = 1, .bias = 1, .state = 1, .dstate = 1, .silu = 1},
        {.B = 4, .T = 3, .C = 50, .W = 4, .state = 1, .dstate = 1, .silu = 0}, // T < W - 1: state reaches past x
        {.B = 2, .T = 9, .C = 20, .W = 4, .dstate = 1, .silu = 1},             // dstate without a state
        {.B = 2,
         .T = 257,
         .C = 2048 + 256,
         .W = 4,
         .ldx = 2 * 2048 + 256,
         .bias = 1,
         .state = 1,
         .dstate = 1,
         .silu = 1}, // Mamba-2-like xBC slice of the in-projection
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += conv_case(cases[i], 0);
    fails += conv_case(cases[3], 1);
    fails += conv_case(cases[5], 1);
    assert_int_equal(fails, 0);
}

// conv1d_seqs: packed sequences of different lengths, each from its own
// window (slot perm(s) of one buffer), against the CPU op (conv1d_fwd and
// conv1d_update_state per sequence): y BF16, the rolled windows EXACT. One
// case has a sequence of no rows (its window unchanged), one shorter than the
// window, one of many conv chunks; one has more sequences than one launch
// takes (CUDA passes up to 64 per launch).
static int conv_seqs_case(int n, const int *len, int C, int W, int64_t ldx, int bias_on) {
    int32_t *cu = calloc((size_t)n + 1, sizeof(int32_t));
    for (int s = 0; s < n; s++)
        cu[s + 1] = cu[s] + len[s];
    const int64_t rows = cu[n], xlen = rows * ldx, ylen = rows * C, per = (int64_t)C * W, slen = n * per;
    char shape[160];
    snprintf(shape, sizeof shape, "%d seqs, %lld rows, C=%d W=%d ldx=%lld%s", n, (long long)rows, C, W, (long long)ldx,
             bias_on ? " bias" : "");
    float *x = rnd(xlen > 0 ? xlen : 1, 1.0f), *w = rnd(C * W, 0.5f), *bias = bias_on ? rnd(C, 0.5f) : NULL;
    float *win = rnd(slen, 1.0f), *y = tu_hbuf(ylen), *nan = tu_nans(ylen);
    void *dxx = tu_dev_act(gpu, x, xlen > 0 ? xlen : 1), *dw_ = tu_dev_act(gpu, w, C * W),
         *db = bias_on ? tu_dev_act(gpu, bias, C) : NULL, *dwin = tu_dev_act(gpu, win, slen),
         *dy = tu_dev_act(gpu, nan, ylen);
    void **hp = calloc((size_t)n, sizeof(void *)), **dp = calloc((size_t)n, sizeof(void *));
    for (int s = 0; s < n; s++) { // slots in reverse order: no two neighbours adjacent in memory order
        int slot = n - 1 - s;
        hp[s] = win + slot * per, dp[s] = tu_gat(gpu, dwin, slot * per);
    }
    be_seqs_t sq = {n, cu};
    cpu->conv1d_seqs(cpu, y, x, ldx, w, bias, hp, sq, C, W, 1);
    gpu->conv1d_seqs(gpu, dy, dxx, ldx, dw_, db, dp, sq, C, W, 1);
    int ok = tu_sync(gpu, "conv1d_seqs", shape);
    ok = ok && check_act("conv1d_seqs y", shape, dy, y, ylen, BF16);
    ok = ok && check_act("conv1d_seqs windows", shape, dwin, win, slen, EXACT);
    free(cu), free(x), free(w), free(bias), free(win), free(y), free(nan), free(hp), free(dp);
    tu_dev_free(gpu, dxx), tu_dev_free(gpu, dw_), tu_dev_free(gpu, dwin), tu_dev_free(gpu, dy);
    if (db) tu_dev_free(gpu, db);
    return !ok;
}

static void test_conv1d_seqs(void **st) {
    setup_backends();
    int fails = 0;
    const int a[] = {7, 0, 1, 300, 2};
    fails += conv_seqs_case(5, a, 33, 4, 40, 1);
    int many[70];
    for (int s = 0; s < 70; s++)
        many[s] = (s * 7) % 10; // 0 .. 9 rows
    fails += conv_seqs_case(70, many, 16, 4, 16, 0);
    assert_int_equal(fails, 0);
}

// ==== determinism of the backward reductions ====================================
// Weight gradients are sums over rows; on the GPU they are reduced without
// atomics (cuda_norm.cu, cuda_conv.cu, cuda_core.cu), so the same inputs must
// give the same bits: each op runs twice from the same starting buffers and
// the results are compared with memcmp (no tolerance: one flipped bit fails).
// The norms and the conv also run a third time with the scratch arena full
// (their fallback walks the same slices in the same order, so the bits must
// not change either). The shapes give many row slices / chunks / tiles, so
// an order that varied between runs would show. Every run is also compared
// with the CPU reference (tolerances as in the header).

// Downloads n floats of each device buffer and compares their bytes; prints
// the first differing element. 1 when identical.
static int same_bits(const char *op, const char *shape, const char *what, const float *da, const float *db, int64_t n) {
    float *a = tu_host_f32(gpu, da, n), *b = tu_host_f32(gpu, db, n);
    int64_t first = -1;
    if (memcmp(a, b, (size_t)n * sizeof(float)) != 0)
        for (int64_t i = 0; i < n && first < 0; i++)
            if (memcmp(a + i, b + i, sizeof(float)) != 0) first = i;
    printf("%s %-24s %-56s %s\n", first < 0 ? "ok  " : "FAIL", op, shape, what);
    if (first >= 0) printf("     first difference at %lld: %.9g vs %.9g\n", (long long)first, a[first], b[first]);
    fflush(stdout);
    free(a), free(b);
    return first < 0;
}
// "SHAPE run 1", "SHAPE run 2", "SHAPE no scratch" for run r = 0, 1, 2.
static const char *run_label(char *buf, size_t size, const char *shape, int r) {
    snprintf(buf, size, "%s %s", shape, r == 0 ? "run 1" : r == 1 ? "run 2" : "no scratch");
    return buf;
}
// The same for act buffers (compared as downloaded fp32: bf16 -> fp32 is exact).
static int same_bits_act(const char *op, const char *shape, const char *what, const void *da, const void *db,
                         int64_t n) {
    float *a = tu_host_act(gpu, da, n), *b = tu_host_act(gpu, db, n);
    float *ga = tu_dev_f32(gpu, a, n), *gb = tu_dev_f32(gpu, b, n);
    int ok = same_bits(op, shape, what, ga, gb, n);
    free(a), free(b);
    tu_dev_free(gpu, ga), tu_dev_free(gpu, gb);
    return ok;
}

static void test_rmsnorm_deterministic(void **st) {
    setup_backends();
    int fails = 0;
    const int64_t cases[][2] = {{4096, 2048}, {8192, 64}, {3001, 77}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t N = cases[ci][0];
        const int d = (int)cases[ci][1];
        const int64_t n = N * d;
        char shape[96];
        snprintf(shape, sizeof shape, "N=%lld d=%d", (long long)N, d);
        float *x = rnd(n, 1.0f), *w = rnd_w(d), *out = tu_hbuf(n), *rstd = tu_hbuf(N), *g = rnd(n, 1.0f);
        float *dx = tu_hbuf(n), *dw0 = rnd_f32(d, 1.0f), *dw = tu_hdup(dw0, d);
        cpu->rmsnorm_fwd(cpu, out, rstd, x, w, N, d, 1e-5f);
        cpu->rmsnorm_bwd(cpu, dx, dw, g, x, w, rstd, N, d);
        void *dxx = tu_dev_act(gpu, x, n), *dww = tu_dev_act(gpu, w, d), *dg = tu_dev_act(gpu, g, n);
        float *drs = tu_dev_f32(gpu, rstd, N);
        void *ddx[3];
        float *ddw[3];
        for (int r = 0; r < 3; r++) { // r = 2: scratch arena full
            ddx[r] = tu_dev_act(gpu, out, n);
            ddw[r] = tu_dev_f32(gpu, dw0, d);
            size_t mark = r == 2 ? scratch_fill(gpu) : 0;
            gpu->rmsnorm_bwd(gpu, ddx[r], ddw[r], dg, dxx, dww, drs, N, d);
            char rl[160];
            run_label(rl, sizeof rl, shape, r);
            int ok = tu_sync(gpu, "rmsnorm_bwd", rl);
            if (r == 2) arena_reset(&gpu->scratch, mark);
            fails += !ok || !check_f32("rmsnorm_bwd dw", rl, ddw[r], dw, d, F32);
        }
        fails += !same_bits("rmsnorm_bwd dw", shape, "run 2 == run 1", ddw[0], ddw[1], d);
        fails += !same_bits("rmsnorm_bwd dw", shape, "no scratch == run 1", ddw[0], ddw[2], d);
        fails += !same_bits_act("rmsnorm_bwd dx", shape, "run 2 == run 1", ddx[0], ddx[1], n);
        free(x), free(w), free(out), free(rstd), free(g), free(dx), free(dw0), free(dw);
        tu_dev_free(gpu, dxx), tu_dev_free(gpu, dww), tu_dev_free(gpu, dg), tu_dev_free(gpu, drs);
        for (int r = 0; r < 3; r++)
            tu_dev_free(gpu, ddx[r]), tu_dev_free(gpu, ddw[r]);
    }
    assert_int_equal(fails, 0);
}

static void test_gated_rmsnorm_deterministic(void **st) {
    setup_backends();
    int fails = 0;
    // GDN (groups share w) and Mamba-2 (w per channel), both association orders
    const gncase_t cases[] = {{.N = 2048, .G = 16, .gs = 128, .shared = 1}, {.N = 3000, .G = 8, .gs = 64, .shared = 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int mode = 0; mode < 2; mode++) {
            const gncase_t c = cases[ci];
            const int64_t width = (int64_t)c.G * c.gs, n = c.N * width, wlen = c.shared ? c.gs : width;
            char shape[128];
            snprintf(shape, sizeof shape, "%s N=%lld G=%d gs=%d w_len=%lld",
                     mode == GNORM_NORM_THEN_GATE ? "norm-gate" : "gate-norm", (long long)c.N, c.G, c.gs,
                     (long long)wlen);
            float *x = rnd(n, 1.0f), *z = rnd(n, 1.5f), *w = rnd_w(wlen), *out = tu_hbuf(n), *rstd = tu_hbuf(c.N * c.G),
                  *g = rnd(n, 1.0f), *dx = tu_hbuf(n), *dz = tu_hbuf(n);
            float *dw0 = rnd_f32(wlen, 1.0f), *dw = tu_hdup(dw0, wlen);
            cpu->gated_rmsnorm_fwd(cpu, out, rstd, x, z, width, w, wlen, c.N, c.G, c.gs, 1e-5f, mode);
            cpu->gated_rmsnorm_bwd(cpu, dx, dz, width, dw, g, x, z, width, w, wlen, rstd, c.N, c.G, c.gs, mode);
            void *dxx = tu_dev_act(gpu, x, n), *dzz = tu_dev_act(gpu, z, n), *dww = tu_dev_act(gpu, w, wlen),
                 *dg = tu_dev_act(gpu, g, n), *ddx = tu_dev_act(gpu, out, n), *ddz = tu_dev_act(gpu, out, n);
            float *drs = tu_dev_f32(gpu, rstd, c.N * c.G), *ddw[3];
            for (int r = 0; r < 3; r++) { // r = 2: scratch arena full
                ddw[r] = tu_dev_f32(gpu, dw0, wlen);
                size_t mark = r == 2 ? scratch_fill(gpu) : 0;
                gpu->gated_rmsnorm_bwd(gpu, ddx, ddz, width, ddw[r], dg, dxx, dzz, width, dww, wlen, drs, c.N, c.G,
                                       c.gs, mode);
                char rl[160];
                run_label(rl, sizeof rl, shape, r);
                int ok = tu_sync(gpu, "gated_rmsnorm_bwd", rl);
                if (r == 2) arena_reset(&gpu->scratch, mark);
                fails += !ok || !check_f32("gated_rmsnorm_bwd dw", rl, ddw[r], dw, wlen, F32);
            }
            fails += !same_bits("gated_rmsnorm_bwd dw", shape, "run 2 == run 1", ddw[0], ddw[1], wlen);
            fails += !same_bits("gated_rmsnorm_bwd dw", shape, "no scratch == run 1", ddw[0], ddw[2], wlen);
            free(x), free(z), free(w), free(out), free(rstd), free(g), free(dx), free(dz), free(dw0), free(dw);
            tu_dev_free(gpu, dxx), tu_dev_free(gpu, dzz), tu_dev_free(gpu, dww), tu_dev_free(gpu, dg),
                tu_dev_free(gpu, ddx), tu_dev_free(gpu, ddz), tu_dev_free(gpu, drs);
            for (int r = 0; r < 3; r++)
                tu_dev_free(gpu, ddw[r]);
        }
    assert_int_equal(fails, 0);
}

// conv1d_step: N rows, each row's window [C, W] in an allocation of its own,
// against the CPU op on the same bf16 inputs. y: BF16 (fp32 sums of the same
// bf16 products, one rounding); the rolled windows: EXACT (bf16 copies).
static int conv_step_case(int N, int C, int W, int64_t ldx, int bias, int silu) {
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d C=%d W=%d ldx=%lld%s%s", N, C, W, (long long)ldx, bias ? " bias" : "",
             silu ? " silu" : " linear");
    int64_t wl = (int64_t)C * W;
    float *x = rnd(N * ldx, 1.0f), *w = rnd(wl, 0.5f), *b = bias ? rnd(C, 0.5f) : NULL, *y = tu_hbuf((int64_t)N * C);
    float *nan = tu_nans((int64_t)N * C), **win = malloc(sizeof(float *) * N);
    void **rows_h = malloc(sizeof(void *) * N), **rows_d = malloc(sizeof(void *) * N);
    for (int r = 0; r < N; r++) {
        win[r] = rnd(wl, 1.0f);
        rows_d[r] = tu_dev_act(gpu, win[r], wl);
        rows_h[r] = win[r];
    }
    void **ptr_d = gpu->alloc(gpu, sizeof(void *) * N);
    assert_non_null(ptr_d);
    assert_int_equal(gpu->copy_h2d(gpu, ptr_d, rows_d, sizeof(void *) * N), 0);
    void *dx = tu_dev_act(gpu, x, N * ldx), *dw = tu_dev_act(gpu, w, wl), *db = bias ? tu_dev_act(gpu, b, C) : NULL;
    void *dy = tu_dev_act(gpu, nan, (int64_t)N * C);
    cpu->conv1d_step(cpu, y, x, ldx, w, b, rows_h, N, C, W, silu);
    gpu->conv1d_step(gpu, dy, dx, ldx, dw, db, ptr_d, N, C, W, silu);
    int fails = !tu_sync(gpu, "conv1d_step", shape) || !check_act("conv1d_step y", shape, dy, y, (int64_t)N * C, BF16);
    float *got = tu_hbuf(N * wl), *want = tu_hbuf(N * wl); // every row's window, compared at once
    for (int r = 0; r < N; r++) {
        float *h = tu_host_act(gpu, rows_d[r], wl);
        memcpy(got + r * wl, h, sizeof(float) * wl), memcpy(want + r * wl, win[r], sizeof(float) * wl);
        free(h);
    }
    fails += !check("conv1d_step windows", shape, got, want, N * wl, EXACT);
    free(got), free(want);
    for (int r = 0; r < N; r++)
        free(win[r]), tu_dev_free(gpu, rows_d[r]);
    gpu->free(gpu, ptr_d);
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dw), tu_dev_free(gpu, dy);
    if (db) tu_dev_free(gpu, db);
    free(x), free(w), free(b), free(y), free(nan), free(win), free(rows_h), free(rows_d);
    return fails;
}

static void test_conv1d_step(void **st) {
    setup_backends();
    int fails = 0;
    fails += conv_step_case(1, 1, 4, 1, 1, 1);
    fails += conv_step_case(5, 33, 4, 40, 1, 1);
    fails += conv_step_case(64, 2048 + 256, 4, 2 * 2048 + 256, 1, 1); // Mamba-2-like xBC slice, 64 streams
    fails += conv_step_case(3, 77, 8, 80, 0, 0);
    fails += conv_step_case(7, 130, 2, 384, 0, 1);
    fails += conv_step_case(2, 16, 1, 16, 1, 1);
    assert_int_equal(fails, 0);
}

static void test_conv1d_deterministic(void **st) {
    setup_backends();
    int fails = 0;
    // many chunks per sequence (T = 2000) and several sequences (B = 6)
    const ccase_t cases[] = {{.B = 2, .T = 2000, .C = 256, .W = 4, .bias = 1, .state = 1, .dstate = 1, .silu = 1},
                             {.B = 6, .T = 300, .C = 77, .W = 8, .bias = 1, .silu = 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const ccase_t c = cases[ci];
        const int64_t BT = (int64_t)c.B * c.T, n = BT * c.C, wlen = (int64_t)c.C * c.W, slen = (int64_t)c.B * c.C * c.W;
        char shape[128];
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d W=%d%s", c.B, c.T, c.C, c.W, c.silu ? " silu" : " linear");
        float *x = rnd(n, 1.0f), *w = rnd(wlen, 0.5f), *bias = rnd(c.C, 0.5f), *state = rnd(slen, 1.0f);
        float *g = rnd(n, 1.0f), *dx = tu_hbuf(n), *dw0 = rnd_f32(wlen, 1.0f), *dw = tu_hdup(dw0, wlen);
        float *db0 = rnd_f32(c.C, 1.0f), *db = tu_hdup(db0, c.C), *dst = tu_hbuf(slen), *nan = tu_nans(n);
        const float *sp = c.state ? state : NULL;
        cpu->conv1d_bwd(cpu, dx, c.C, dw, c.bias ? db : NULL, c.dstate ? dst : NULL, g, x, c.C, w, c.bias ? bias : NULL,
                        sp, c.B, c.T, c.C, c.W, c.silu);
        void *dxx = tu_dev_act(gpu, x, n), *dww = tu_dev_act(gpu, w, wlen), *dbb = tu_dev_act(gpu, bias, c.C),
             *dss = tu_dev_act(gpu, state, slen), *dg = tu_dev_act(gpu, g, n);
        void *ddx[3];
        float *ddw[3], *ddb[3], *dds[3];
        for (int r = 0; r < 3; r++) { // r = 2: scratch arena full
            ddx[r] = tu_dev_act(gpu, nan, n);
            ddw[r] = tu_dev_f32(gpu, dw0, wlen);
            ddb[r] = tu_dev_f32(gpu, db0, c.C);
            dds[r] = tu_dev_f32(gpu, nan, slen);
            size_t mark = r == 2 ? scratch_fill(gpu) : 0;
            gpu->conv1d_bwd(gpu, ddx[r], c.C, ddw[r], c.bias ? ddb[r] : NULL, c.dstate ? dds[r] : NULL, dg, dxx, c.C,
                            dww, c.bias ? dbb : NULL, c.state ? dss : NULL, c.B, c.T, c.C, c.W, c.silu);
            char rl[160];
            run_label(rl, sizeof rl, shape, r);
            int ok = tu_sync(gpu, "conv1d_bwd", rl);
            if (r == 2) arena_reset(&gpu->scratch, mark);
            ok = ok && check_f32("conv1d_bwd dw", rl, ddw[r], dw, wlen, F32);
            if (ok && c.bias) ok = check_f32("conv1d_bwd dbias", rl, ddb[r], db, c.C, F32);
            fails += !ok;
        }
        for (int r = 1; r < 3; r++) {
            const char *what = r == 1 ? "run 2 == run 1" : "no scratch == run 1";
            fails += !same_bits("conv1d_bwd dw", shape, what, ddw[0], ddw[r], wlen);
            if (c.bias) fails += !same_bits("conv1d_bwd dbias", shape, what, ddb[0], ddb[r], c.C);
            if (c.dstate) fails += !same_bits("conv1d_bwd dstate", shape, what, dds[0], dds[r], slen);
            fails += !same_bits_act("conv1d_bwd dx", shape, what, ddx[0], ddx[r], n);
        }
        free(x), free(w), free(bias), free(state), free(g), free(dx), free(dw0), free(dw), free(db0), free(db);
        free(dst), free(nan);
        tu_dev_free(gpu, dxx), tu_dev_free(gpu, dww), tu_dev_free(gpu, dbb), tu_dev_free(gpu, dss),
            tu_dev_free(gpu, dg);
        for (int r = 0; r < 3; r++)
            tu_dev_free(gpu, ddx[r]), tu_dev_free(gpu, ddw[r]), tu_dev_free(gpu, ddb[r]), tu_dev_free(gpu, dds[r]);
    }
    assert_int_equal(fails, 0);
}

// The ring's differences after call `call` (0 or 1) of argmax_rows or
// proj_rmsnorm_argmax with a two-array ring of N ids filled with -1 before:
// array `call` holds ids, the other is untouched, the turn (th) is flipped.
static int ring_differences(const int32_t *ring, int64_t N, int call, const int32_t *ids, int32_t th) {
    int off = th != 1 - call;
    for (int64_t n = 0; n < N; n++)
        off += ring[call * N + n] != ids[n] || ring[(1 - call) * N + n] != -1;
    return off;
}

// argmax_rows: the same ids as the CPU (EXACT: a choice, no arithmetic),
// which are sampler_argmax's. Rows with ties of the maximum (bf16 has 8
// significant bits: the second copy must lose; placed in different slices
// of the CUDA kernel), NaNs before the maximum, all NaN (0), all -inf (0),
// +inf twice; 16-byte loads and the scalar tail (V % 8, rows ld apart),
// unaligned rows, more rows than one launch takes. With a host ring (N <=
// BE_ARGMAX_RING_ROWS): the ids in ring array *turn, the turn flipped, twice.
static void test_argmax_rows(void **st) {
    setup_backends();
    int fails = 0;
    typedef struct {
        int64_t N, V, ld;
        int special; // 1: the rows above
    } acase_t;
    const acase_t cases[] = {{1, 49152, 49152, 0}, {5, 49155, 49160, 1}, {3, 1000, 1003, 1},    {64, 128256, 128256, 0},
                             {7, 5, 5, 1},         {70, 3000, 3000, 0},  {2, 700000, 700000, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const acase_t c = cases[ci];
        float *x = rnd(c.N * c.ld, 1.0f);
        for (int64_t n = 0; n < c.N; n++) { // a tie of the maximum in every row
            float *row = x + n * c.ld;
            const int64_t i = (n * 7919 + 3) % c.V, j = (i + c.V / 2) % c.V;
            row[i] = row[j] = 9.0f;
        }
        if (c.special) {
            for (int64_t v = 0; v < c.V; v++) {
                x[0 * c.ld + v] = v < c.V / 3 ? NAN : x[0 * c.ld + v];
                x[1 * c.ld + v] = NAN;
            }
            if (c.N > 2)
                for (int64_t v = 0; v < c.V; v++)
                    x[2 * c.ld + v] = -INFINITY;
            if (c.N > 3) x[3 * c.ld + c.V - 1] = x[3 * c.ld + 1] = INFINITY;
        }
        int32_t *ref = malloc((size_t)c.N * sizeof(int32_t)), *got = malloc((size_t)c.N * sizeof(int32_t));
        cpu->argmax_rows(cpu, ref, NULL, 0, NULL, x, c.ld, c.N, c.V);
        void *dx = tu_dev_act(gpu, x, c.N * c.ld);
        int32_t *did = tu_dev_i32(gpu, ref, c.N); // overwritten
        const int ring_ok = c.N <= BE_ARGMAX_RING_ROWS;
        int32_t *ring = ring_ok ? gpu->host_alloc(gpu, 2 * (size_t)c.N * sizeof(int32_t)) : NULL;
        int32_t zero = 0, *turn = tu_dev_i32(gpu, &zero, 1), th = -1;
        int off = 0;
        for (int call = 0; call < (ring_ok ? 2 : 1); call++) {
            gpu->memset0(gpu, did, (size_t)c.N * sizeof(int32_t));
            if (ring) memset(ring, 0xff, 2 * (size_t)c.N * sizeof(int32_t));
            gpu->argmax_rows(gpu, did, ring, c.N, turn, dx, c.ld, c.N, c.V);
            assert_int_equal(gpu->sync(gpu), 0);
            assert_int_equal(gpu->copy_d2h(gpu, got, did, (size_t)c.N * sizeof(int32_t)), 0);
            assert_int_equal(gpu->copy_d2h(gpu, &th, turn, sizeof th), 0);
            for (int64_t n = 0; n < c.N; n++) {
                off += got[n] != ref[n];
                if (call == 0 && ref[n] != sampler_argmax(x + n * c.ld, (int)c.V))
                    fail_msg("CPU argmax_rows row %lld", (long long)n);
            }
            if (ring) off += ring_differences(ring, c.N, call, ref, th);
        }
        printf("%s argmax_rows N=%lld V=%lld ld=%lld%s%s: %d differences (first ids %d %d)\n", off ? "FAIL" : "ok  ",
               (long long)c.N, (long long)c.V, (long long)c.ld, c.special ? " nan/inf rows" : "",
               ring ? ", host ring twice" : "", off, got[0], ref[0]);
        fails += off != 0;
        gpu->free(gpu, dx);
        gpu->free(gpu, did);
        gpu->free(gpu, turn);
        gpu->host_free(gpu, ring);
        free(x), free(ref), free(got);
    }
    assert_int_equal(fails, 0);
}

// proj_rmsnorm_argmax: on the GPU the same ids as proj_rmsnorm then
// argmax_rows on the GPU (EXACT: the same fp32 sums rounded to bf16, then the
// same choice), in the host ring and with the turn flipped, twice; against
// the CPU (fp32 logits), the chosen id's CPU logit within bf16 rounding of
// the CPU's maximum (2^-7 |max| + 1e-3 rms: the GPU compares rounded sums,
// so a near-tie may go to another id). Production runs the two ops; the
// bench-variants build with HYLO_HEAD_ARGMAX=1 the fused kernel k_gemv_argmax
// (up to 8 rows, 16-byte loads; 9 rows and K = 333 still the two ops).
static void test_proj_rmsnorm_argmax(void **st) {
    setup_backends();
    int fails = 0;
    typedef struct {
        int64_t N, K, V;
    } hcase_t;
    const hcase_t cases[] = {{1, 576, 49152}, {3, 576, 49152}, {8, 3072, 128256},
                             {1, 64, 300},    {2, 333, 1000},  {9, 64, 500}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const hcase_t c = cases[ci];
        float *x = rnd(c.N * c.K, 1.0f), *g = rnd_w(c.K), *W = rnd(c.V * c.K, 0.05f);
        float *lc = tu_hbuf(c.N * c.V);
        int32_t *ref = malloc((size_t)c.N * sizeof(int32_t)), *got = malloc((size_t)c.N * sizeof(int32_t));
        int32_t *two = malloc((size_t)c.N * sizeof(int32_t));
        cpu->proj_rmsnorm(cpu, lc, x, c.K, g, 1e-5f, W, c.N, c.K, c.V);
        cpu->proj_rmsnorm_argmax(cpu, ref, NULL, 0, NULL, x, c.K, g, 1e-5f, W, c.N, c.K, c.V);
        void *dx = tu_dev_act(gpu, x, c.N * c.K), *dg = tu_dev_act(gpu, g, c.K), *dW = tu_dev_act(gpu, W, c.V * c.K);
        void *dl = tu_dev_act(gpu, lc, c.N * c.V); // overwritten
        int32_t *did = tu_dev_i32(gpu, ref, c.N), *did2 = tu_dev_i32(gpu, ref, c.N);
        int32_t zero = 0, *turn = tu_dev_i32(gpu, &zero, 1), th = -1;
        int32_t *ring = gpu->host_alloc(gpu, 2 * (size_t)c.N * sizeof(int32_t));
        const int use_ring = c.N <= BE_ARGMAX_RING_ROWS;
        int off = 0, far = 0;
        gpu->proj_rmsnorm(gpu, dl, dx, c.K, dg, 1e-5f, dW, c.N, c.K, c.V);
        gpu->argmax_rows(gpu, did2, NULL, 0, NULL, dl, c.V, c.N, c.V);
        assert_int_equal(gpu->sync(gpu), 0);
        assert_int_equal(gpu->copy_d2h(gpu, two, did2, (size_t)c.N * sizeof(int32_t)), 0);
        for (int call = 0; call < 2; call++) {
            memset(ring, 0xff, 2 * (size_t)c.N * sizeof(int32_t));
            gpu->memset0(gpu, did, (size_t)c.N * sizeof(int32_t));
            gpu->proj_rmsnorm_argmax(gpu, did, use_ring ? ring : NULL, c.N, turn, dx, c.K, dg, 1e-5f, dW, c.N, c.K,
                                     c.V);
            assert_int_equal(gpu->sync(gpu), 0);
            assert_int_equal(gpu->copy_d2h(gpu, got, did, (size_t)c.N * sizeof(int32_t)), 0);
            assert_int_equal(gpu->copy_d2h(gpu, &th, turn, sizeof th), 0);
            for (int64_t n = 0; n < c.N; n++) {
                off += got[n] != two[n];
                const float *row = lc + n * c.V;
                double mx = row[ref[n]], rms = 0;
                for (int64_t v = 0; v < c.V; v++)
                    rms += (double)row[v] * row[v];
                rms = sqrt(rms / c.V);
                if (got[n] < 0 || got[n] >= c.V || row[got[n]] < mx - (fabs(mx) / 128 + 1e-3 * rms)) far++;
            }
            if (use_ring) off += ring_differences(ring, c.N, call, got, th);
        }
        printf("%s proj_rmsnorm_argmax N=%lld K=%lld V=%lld: %d differences from proj_rmsnorm + argmax_rows (ring, "
               "turn), %d ids off the CPU's maximum (first ids %d, CPU %d)\n",
               off || far ? "FAIL" : "ok  ", (long long)c.N, (long long)c.K, (long long)c.V, off, far, got[0], ref[0]);
        fails += off || far;
        gpu->free(gpu, dx), gpu->free(gpu, dg), gpu->free(gpu, dW), gpu->free(gpu, dl);
        gpu->free(gpu, did), gpu->free(gpu, did2), gpu->free(gpu, turn);
        gpu->host_free(gpu, ring);
        free(x), free(g), free(W), free(lc), free(ref), free(got), free(two);
    }
    assert_int_equal(fails, 0);
}

// embed_bwd with many repeated ids: N = 4096 rows drawn from 50 ids (runs of
// ~80 rows that cross the 256-row tiles of the sorted list), a skewed draw
// (one id takes ~70% of the rows: one run over ~11 tiles), a single id, and
// an unaligned table (scalar stores). Two runs from the same table must agree
// bit for bit. The run with the scratch arena full takes the serial path,
// which adds the rows in position order as the CPU does: EXACT.
static void test_embed_deterministic(void **st) {
    setup_backends();
    int fails = 0;
    typedef struct {
        int64_t N;
        int d, V, skew, toff; // skew: 1 = ~70% one id, 2 = a single id; toff: table offset in floats
    } ecase_t;
    const ecase_t cases[] = {{4096, 576, 50, 0, 0}, {4096, 2048, 50, 1, 0}, {4096, 77, 50, 0, 0},
                             {1000, 64, 3, 2, 0},   {4096, 96, 50, 0, 1},   {300, 128, 1000, 0, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const ecase_t c = cases[ci];
        const int64_t N = c.N, n = N * c.d, tl = (int64_t)c.V * c.d + c.toff;
        char shape[96];
        snprintf(shape, sizeof shape, "N=%lld d=%d V=%d%s%s", (long long)N, c.d, c.V,
                 c.skew == 1   ? " skewed"
                 : c.skew == 2 ? " one id"
                               : "",
                 c.toff ? " unaligned table" : "");
        int32_t *ids = rnd_ids(N, c.V);
        if (c.skew) {
            float *u = tu_hbuf(N);
            tu_randu(u, N, g_seed++, 0.0f, 1.0f);
            for (int64_t i = 0; i < N; i++)
                if (c.skew == 2 || u[i] < 0.7f) ids[i] = 7 % c.V;
            free(u);
        }
        float *g = rnd(n, 1.0f), *t0 = rnd_f32(tl, 1.0f), *ref = tu_hdup(t0, tl);
        cpu->embed_bwd(cpu, ref + c.toff, g, ids, N, c.d);
        int32_t *did = tu_dev_i32(gpu, ids, N);
        void *dg = tu_dev_act(gpu, g, n);
        float *dt[3];
        for (int r = 0; r < 3; r++) { // r = 2: scratch arena full
            dt[r] = tu_dev_f32(gpu, t0, tl);
            size_t mark = r == 2 ? scratch_fill(gpu) : 0;
            gpu->embed_bwd(gpu, dt[r] + c.toff, dg, did, N, c.d);
            char rl[160];
            run_label(rl, sizeof rl, shape, r);
            int ok = tu_sync(gpu, "embed_bwd", rl);
            if (r == 2) arena_reset(&gpu->scratch, mark);
            fails += !ok || !check_f32("embed_bwd", rl, dt[r], ref, tl, r == 2 ? EXACT : F32);
        }
        fails += !same_bits("embed_bwd", shape, "run 2 == run 1", dt[0], dt[1], tl);
        free(ids), free(g), free(t0), free(ref);
        tu_dev_free(gpu, did), tu_dev_free(gpu, dg);
        for (int r = 0; r < 3; r++)
            tu_dev_free(gpu, dt[r]);
    }
    assert_int_equal(fails, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_scale),
        cmocka_unit_test(test_copy2d),
        cmocka_unit_test(test_copy_pages),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_f32out),
        cmocka_unit_test(test_gemm_batched),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_gated_rmsnorm),
        cmocka_unit_test(test_l2norm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_kv_append),
        cmocka_unit_test(test_mla_rope_append),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_proj_swiglu),
        cmocka_unit_test(test_proj_rmsnorm),
        cmocka_unit_test(test_proj_add_rmsnorm),
        cmocka_unit_test(test_proj_rope_kv_append),
        cmocka_unit_test(test_conv1d),
        cmocka_unit_test(test_conv1d_seqs),
        cmocka_unit_test(test_conv1d_step),
        cmocka_unit_test(test_rmsnorm_deterministic),
        cmocka_unit_test(test_gated_rmsnorm_deterministic),
        cmocka_unit_test(test_conv1d_deterministic),
        cmocka_unit_test(test_embed_deterministic),
        cmocka_unit_test(test_argmax_rows),
        cmocka_unit_test(test_proj_rmsnorm_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
