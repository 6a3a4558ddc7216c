// CUDA fused losses, the ILD distance and optimizer ops against the CPU ones (run on the GPU
// machine; skipped without a GPU; HYLO_TEST_CPU_AS_GPU=1 runs it on the fake
// GPU of testutil.h, whose act is fp32: the emulation then rounds nothing).
//
// Inputs are rounded to bf16 first (tu_round_bf16), so the CPU op and the GPU
// see the same values. The GPU then rounds the logits to bf16 before the
// softmax (as the reference recipe does: hybrid_model.md §10, "fp32 logits
// (bf16-rounded values)"), rounds the logits' gradient G to bf16 for the two
// backward GEMMs and dh to bf16 on output. Each case is checked twice:
//  * against the CPU op (fp32 logits): the difference is the bf16 rounding of
//    the logits, an absolute error of up to 2^-8 |z| on each logit (bf16 keeps
//    8 significant bits), i.e. a relative error of about that on each
//    probability. Emulating the GPU's roundings (numpy, and this file's
//    emulation run against the CPU op) on these very cases, 3 seeds each, gave
//    at most: CE loss 3.8e-3 (the one-row case; 1e-4 for many rows), CE
//    dh/dW 5.3e-3; KL loss 2.6e-3, KL dhs/dWs 1.9e-2 (G = p_s - p_t carries
//    the probability errors in full, where CE's G is dominated by the exact -1
//    of the one-hot). Bounds: loss 1e-2, CE gradients 2e-2, KL gradients 4e-2.
//  * against an emulation of the GPU numerics on the host (bf16 logits, bf16 G,
//    bf16 dh, fp32 dW). The hidden states are multiples of 1/8 (|h| <= 2) and
//    the weights multiples of 1/256 (|w| <= 1/4): every product is a multiple
//    of 2^-11 and every logit sum stays below 2^10, so the fp32 logits are
//    exact in any summation order, on the GPU and on the CPU, and both round
//    them to the same bf16 values. What remains: fp32 + __expf vs double in
//    the softmax (~1e-6 relative), which moves a G or dh value across a bf16
//    rounding boundary now and then (one ulp, 2^-8, on that element). The loss
//    agrees to ~1e-6, gradients to ~1e-4 typically; a single flipped G entry
//    that dominates a one-row case can reach ~5e-3. Bounds: loss 1e-4,
//    gradients 1e-2 — sharp enough for any indexing, masking, scaling or
//    chunking mistake, 2-4x tighter than the CPU comparison.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "testutil.h"

enum { EMU_ROWS = 64 };

static const double TOL_LOSS_CPU = 1e-2, TOL_CE_GRAD_CPU = 2e-2, TOL_KL_GRAD_CPU = 4e-2;
static const double TOL_LOSS_EMU = 1e-4, TOL_GRAD_EMU = 1e-2;

// What the backend under test stores for an act value: bf16 on the GPU
// (bf16 = 1), the fp32 value itself on the fake GPU (tu_gpu(), bf16 = 0).
static float act_round(double x, int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16((float)x)) : (float)x; }
static void act_round_all(float *x, int64_t n, int bf16) {
    if (bf16) tu_round_bf16(x, n);
}

// N(0, std^2) quantised to multiples of 1/q, clamped to |x| <= lim/q: exact in
// bf16 (<= 7 significant bits) and exact-sum friendly (see the header).
static float *qrnd(int64_t n, uint64_t seed, float std, float q, float lim) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    tu_randn(p, n, seed, std);
    for (int64_t i = 0; i < n; i++)
        p[i] = fminf(fmaxf(rintf(p[i] * q), -lim), lim) / q;
    return p;
}
static float *rnd_h(int64_t n, uint64_t seed) { return qrnd(n, seed, 1.0f, 8.0f, 16.0f); }
static float *rnd_w(int64_t n, uint64_t seed, float std) { return qrnd(n, seed, std, 256.0f, 64.0f); }

static double rel(double a, double b) { return isnan(a) ? INFINITY : fabs(a - b) / fmax(fabs(b), 1e-30); }

// ---- host emulation of the GPU numerics --------------------------------------
// One routine for both losses: kind 0 = CE (targets), 1 = KL (teacher, mask).
// Logits: fp32 GEMM of the bf16-valued inputs, rounded to bf16; softmax and
// losses in double; G rounded to bf16; dh = bf16(scale G W); dW += scale G^T h.
// (Each "rounded to bf16" is act_round: none of them on the fake GPU.)
typedef struct {
    int kind;
    int64_t N, V;
    int ds, dt;
    const float *hs, *Ws, *ht, *Wt;
    const int32_t *tgt; // CE targets or KL mask (may be NULL for KL)
    float scale;
} lcase_t;

static double lse_d(const float *z, int64_t V) {
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; v++)
        m = z[v] > m ? z[v] : m;
    for (int64_t v = 0; v < V; v++)
        s += exp(z[v] - m);
    return m + log(s);
}

static double emulate(const lcase_t *c, float *dh, float *dW) {
    be_t *cpu = tu_cpu();
    const int64_t V = c->V;
    const int bf16 = tu_gpu()->act_dtype == DT_BF16;
    float *S = malloc((size_t)(EMU_ROWS * V) * sizeof(float)), *T = malloc((size_t)(EMU_ROWS * V) * sizeof(float));
    double loss = 0;
    for (int64_t r0 = 0; r0 < c->N; r0 += EMU_ROWS) {
        int64_t rows = c->N - r0 < EMU_ROWS ? c->N - r0 : EMU_ROWS;
        cpu->gemm(cpu, 0, 1, rows, V, c->ds, 1.0f, c->hs + r0 * c->ds, c->ds, c->Ws, c->ds, 0.0f, S, V);
        act_round_all(S, rows * V, bf16);
        if (c->kind == 1) {
            cpu->gemm(cpu, 0, 1, rows, V, c->dt, 1.0f, c->ht + r0 * c->dt, c->dt, c->Wt, c->dt, 0.0f, T, V);
            act_round_all(T, rows * V, bf16);
        }
        for (int64_t r = 0; r < rows; r++) {
            float *s = S + r * V;
            const int32_t y = c->tgt ? c->tgt[r0 + r] : 0;
            if (y < 0) {
                memset(s, 0, (size_t)V * sizeof(float));
                continue;
            }
            const double ls = lse_d(s, V);
            if (c->kind == 0) {
                loss += ls - s[y];
                for (int64_t v = 0; v < V; v++)
                    s[v] = act_round(exp(s[v] - ls) - (v == y ? 1.0 : 0.0), bf16);
            } else {
                const float *t = T + r * V;
                const double lt = lse_d(t, V);
                for (int64_t v = 0; v < V; v++) {
                    double a = s[v] - ls, b = t[v] - lt;
                    loss += exp(b) * (b - a);
                    s[v] = act_round(exp(a) - exp(b), bf16);
                }
            }
        }
        cpu->gemm(cpu, 0, 0, rows, c->ds, V, c->scale, S, V, c->Ws, c->ds, 0.0f, dh + r0 * c->ds, c->ds);
        cpu->gemm(cpu, 1, 0, V, c->ds, rows, c->scale, S, V, c->hs + r0 * c->ds, c->ds, 1.0f, dW, c->ds);
    }
    act_round_all(dh, c->N * c->ds, bf16);
    free(S);
    free(T);
    return loss * c->scale;
}

// ---- one case: CPU op, emulation, GPU -----------------------------------------

// squeeze_rows > 0: before the GPU call, take all of the scratch arena but
// room for about that many rows, so the op runs many small chunks (odd sizes,
// chunk offsets that are not 256-byte aligned).
static void run_case(const char *name, lcase_t *c, int squeeze_rows) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int64_t N = c->N, V = c->V, ds = c->ds;
    float *dW0 = tu_rnd(V * ds, 99, 0.01f);
    float *dh_c = tu_nans(N * ds), *dW_c = tu_hdup(dW0, V * ds), *dh_e = tu_nans(N * ds), *dW_e = tu_hdup(dW0, V * ds);
    float loss_c = NAN;
    if (c->kind == 0)
        cpu->fused_ce(cpu, &loss_c, dh_c, dW_c, c->hs, c->Ws, c->tgt, N, (int)ds, V, c->scale);
    else
        cpu->fused_kl(cpu, &loss_c, dh_c, dW_c, c->hs, c->Ws, c->ht, c->Wt, c->tgt, N, (int)ds, c->dt, V, c->scale);
    double loss_e = emulate(c, dh_e, dW_e);

    // GPU: the loss and dh poisoned with NaN (every element must be written,
    // also before each rerun below), dW = dW0.
    void *hs = tu_dev_act(gpu, c->hs, N * ds), *Ws = tu_dev_act(gpu, c->Ws, V * ds);
    void *ht = c->kind ? tu_dev_act(gpu, c->ht, N * c->dt) : NULL,
         *Wt = c->kind ? tu_dev_act(gpu, c->Wt, V * c->dt) : NULL;
    float *nanbuf = tu_nans(N * ds);
    void *dh = tu_dev_act(gpu, nanbuf, N * ds);
    float *dW = tu_dev_f32(gpu, dW0, V * ds), *dloss = tu_dev_f32(gpu, nanbuf, 1);
    int32_t *tgt = c->tgt ? tu_dev_i32(gpu, c->tgt, N) : NULL;
    size_t mark = arena_mark(&gpu->scratch);
    if (squeeze_rows > 0) {
        int64_t ld = (V + 7) & ~7LL;
        size_t need = (size_t)squeeze_rows * ((size_t)(c->kind + 1) * ld * 2 + 4) + 8 * 256;
        size_t used = (gpu->scratch.used + 255) & ~(size_t)255;
        assert_true(gpu->scratch.cap > used + need);
        assert_non_null(arena_alloc(&gpu->scratch, gpu->scratch.cap - used - need));
    }
    if (c->kind == 0)
        gpu->fused_ce(gpu, dloss, dh, dW, hs, Ws, tgt, N, (int)ds, V, c->scale);
    else
        gpu->fused_kl(gpu, dloss, dh, dW, hs, Ws, ht, Wt, tgt, N, (int)ds, c->dt, V, c->scale);
    assert_int_equal(gpu->sync(gpu), 0);
    arena_reset(&gpu->scratch, mark);
    float *dh_g = tu_host_act(gpu, dh, N * ds), *dW_g = tu_host_f32(gpu, dW, V * ds), *lg = tu_host_f32(gpu, dloss, 1);
    const double tol_grad_cpu = c->kind ? TOL_KL_GRAD_CPU : TOL_CE_GRAD_CPU;
    double e_lc = rel(lg[0], loss_c), e_hc = tu_rel_err(dh_g, dh_c, N * ds),
           e_wc = tu_inc_rel_err(dW_g, dW_c, dW0, V * ds);
    double e_le = rel(lg[0], loss_e), e_he = tu_rel_err(dh_g, dh_e, N * ds),
           e_we = tu_inc_rel_err(dW_g, dW_e, dW0, V * ds);
    printf("  %-34s loss gpu %.6f cpu %.6f | vs cpu: loss %.1e dh %.1e dW %.1e | vs emulation: loss %.1e dh %.1e dW "
           "%.1e\n",
           name, lg[0], loss_c, e_lc, e_hc, e_wc, e_le, e_he, e_we);
    assert_true(e_lc < TOL_LOSS_CPU);
    assert_true(e_hc < tol_grad_cpu);
    assert_true(e_wc < tol_grad_cpu);
    assert_true(e_le < TOL_LOSS_EMU);
    assert_true(e_he < TOL_GRAD_EMU);
    assert_true(e_we < TOL_GRAD_EMU);
    if (c->tgt) // skipped rows: exactly zero
        for (int64_t n = 0; n < N; n++)
            if (c->tgt[n] < 0)
                for (int64_t i = 0; i < ds; i++)
                    assert_true(dh_g[n * ds + i] == 0.0f);

    // Loss only: the same loss, bit for bit. Again with gradients: the same
    // loss, dh, and dW increment, bit for bit (deterministic: no atomics).
    // The loss and dh hold NaN again before each call, dW its start value.
    if (squeeze_rows == 0) {
        float *l2;
        tu_upload_f32(gpu, dloss, nanbuf, 1);
        if (c->kind == 0)
            gpu->fused_ce(gpu, dloss, NULL, NULL, hs, Ws, tgt, N, (int)ds, V, c->scale);
        else
            gpu->fused_kl(gpu, dloss, NULL, NULL, hs, Ws, ht, Wt, tgt, N, (int)ds, c->dt, V, c->scale);
        l2 = tu_host_f32(gpu, dloss, 1);
        assert_true(l2[0] == lg[0]);
        free(l2);
        tu_upload_f32(gpu, dW, dW0, V * ds);
        tu_upload_f32(gpu, dloss, nanbuf, 1);
        tu_upload_act(gpu, dh, nanbuf, N * ds);
        if (c->kind == 0)
            gpu->fused_ce(gpu, dloss, dh, dW, hs, Ws, tgt, N, (int)ds, V, c->scale);
        else
            gpu->fused_kl(gpu, dloss, dh, dW, hs, Ws, ht, Wt, tgt, N, (int)ds, c->dt, V, c->scale);
        float *dh2 = tu_host_act(gpu, dh, N * ds), *dW2 = tu_host_f32(gpu, dW, V * ds);
        l2 = tu_host_f32(gpu, dloss, 1);
        assert_true(l2[0] == lg[0]);
        assert_memory_equal(dh2, dh_g, (size_t)(N * ds) * sizeof(float));
        assert_memory_equal(dW2, dW_g, (size_t)(V * ds) * sizeof(float));
        free(l2), free(dh2), free(dW2);
    }
    gpu->free(gpu, hs), gpu->free(gpu, Ws), gpu->free(gpu, ht), gpu->free(gpu, Wt), gpu->free(gpu, dh);
    gpu->free(gpu, dW), gpu->free(gpu, dloss), gpu->free(gpu, tgt);
    free(dW0), free(dh_c), free(dW_c), free(dh_e), free(dW_e), free(nanbuf), free(dh_g), free(dW_g), free(lg);
}

// Targets: every 7th row ignored (-100), row 0 -> V - 1 (the last, partial
// vector of a row when V % 8 != 0), the rest pseudo-random.
static int32_t *targets(int64_t N, int64_t V, int *valid) {
    int32_t *t = malloc((size_t)(N ? N : 1) * sizeof(int32_t));
    *valid = 0;
    for (int64_t n = 0; n < N; n++) {
        t[n] = (int32_t)((n * 2654435761u + 12345u) % (uint64_t)V);
        if (n % 7 == 3) t[n] = -100;
        if (n == 0) t[n] = (int32_t)(V - 1);
        *valid += t[n] >= 0;
    }
    return t;
}

// CE with logit std 2.5 (W ~ N(0, (2.5/sqrt(d))^2), h ~ N(0, 1)).
static void ce_case(int64_t N, int d, int64_t V, int squeeze) {
    tu_gpu(); // skip before building inputs when there is no GPU
    int valid;
    lcase_t c = {.kind = 0, .N = N, .V = V, .ds = d};
    c.tgt = targets(N, V, &valid);
    c.scale = 1.0f / (float)(valid ? valid : 1);
    float *h = rnd_h(N * d, 1000 + (uint64_t)N), *W = rnd_w(V * d, 2000 + (uint64_t)V, 2.5f / sqrtf((float)d));
    c.hs = h, c.Ws = W;
    char name[96];
    snprintf(name, sizeof name, "ce N=%lld d=%d V=%lld%s", (long long)N, d, (long long)V, squeeze ? " squeezed" : "");
    run_case(name, &c, squeeze);
    free(h), free(W), free((void *)c.tgt);
}

// KL: student logit std 2, teacher 2.5 (a sharper teacher), teacher hidden
// size dt != ds; every 5th row masked when `masked`.
static void kl_case(int64_t N, int ds, int dt, int64_t V, int masked, int squeeze) {
    tu_gpu();
    lcase_t c = {.kind = 1, .N = N, .V = V, .ds = ds, .dt = dt, .scale = 1.0f / 4.0f};
    int32_t *mask = NULL;
    if (masked) {
        mask = malloc((size_t)N * sizeof(int32_t));
        for (int64_t n = 0; n < N; n++)
            mask[n] = n % 5 == 2 ? -1 : 0;
    }
    c.tgt = mask;
    float *hs = rnd_h(N * ds, 3000 + (uint64_t)N), *Ws = rnd_w(V * ds, 4000 + (uint64_t)V, 2.0f / sqrtf((float)ds));
    float *ht = rnd_h(N * dt, 5000 + (uint64_t)N), *Wt = rnd_w(V * dt, 6000 + (uint64_t)V, 2.5f / sqrtf((float)dt));
    c.hs = hs, c.Ws = Ws, c.ht = ht, c.Wt = Wt;
    char name[96];
    snprintf(name, sizeof name, "kl N=%lld ds=%d dt=%d V=%lld%s%s", (long long)N, ds, dt, (long long)V,
             masked ? " masked" : "", squeeze ? " squeezed" : "");
    run_case(name, &c, squeeze);
    free(hs), free(Ws), free(ht), free(Wt), free(mask);
}

static void test_ce_smollm_vocab(void **st) { ce_case(37, 576, 49152, 0); }
static void test_ce_small_vocab(void **st) { ce_case(300, 576, 1000, 0); }
static void test_ce_one_row(void **st) { ce_case(1, 2048, 1000, 0); }
static void test_ce_llama_vocab(void **st) { ce_case(5, 2048, 128256, 0); }
static void test_ce_odd_vocab(void **st) { ce_case(37, 576, 1003, 0); } // V % 8 != 0: scalar tails
static void test_ce_chunks(void **st) { ce_case(300, 576, 1000, 7); }
static void test_kl_smollm_vocab(void **st) { kl_case(37, 576, 960, 49152, 1, 0); }
static void test_kl_small_vocab(void **st) { kl_case(300, 576, 2048, 1000, 0, 0); }
static void test_kl_one_row(void **st) { kl_case(1, 2048, 576, 1000, 0, 0); }
static void test_kl_llama_vocab(void **st) { kl_case(3, 576, 2048, 128256, 0, 0); }
static void test_kl_odd_vocab(void **st) { kl_case(37, 576, 960, 1003, 1, 0); }
static void test_kl_chunks(void **st) { kl_case(300, 576, 960, 1000, 1, 5); }

// Student == teacher: both logit GEMMs are the same call on the same data, so
// KL and its gradient are exactly 0 (bounds leave room for nothing but that).
// The loss and dhs start as NaN and dWs (+=) at random values, so an op that
// writes nothing or overwrites dWs fails; the maxima are +inf on a NaN.
static void test_kl_self_zero(void **st) {
    be_t *gpu = tu_gpu();
    enum { N = 37, d = 576, V = 49152 };
    float *h = tu_rnd(N * d, 71, 1.0f), *W = tu_rnd((int64_t)V * d, 72, 3.0f / sqrtf((float)d));
    float *dW0 = tu_rnd((int64_t)V * d, 73, 0.01f), *nanb = tu_nans(N * d),
          *zero = calloc((size_t)N * d, sizeof(float));
    void *dh_d = tu_dev_act(gpu, nanb, N * d), *h_d = tu_dev_act(gpu, h, N * d),
         *W_d = tu_dev_act(gpu, W, (int64_t)V * d);
    float *dW_d = tu_dev_f32(gpu, dW0, (int64_t)V * d), *l_d = tu_dev_f32(gpu, nanb, 1);
    gpu->fused_kl(gpu, l_d, dh_d, dW_d, h_d, W_d, h_d, W_d, NULL, N, d, d, V, 1.0f);
    float *l = tu_host_f32(gpu, l_d, 1), *dh = tu_host_act(gpu, dh_d, N * d),
          *dW = tu_host_f32(gpu, dW_d, (int64_t)V * d);
    double mh = tu_max_abs_diff(dh, zero, N * d), mw = tu_max_abs_diff(dW, dW0, (int64_t)V * d);
    printf("  kl(p || p) = %.3e, max |dhs| %.3e, max |dWs increment| %.3e\n", l[0], mh, mw);
    assert_true(fabsf(l[0]) <= 1e-6f);
    assert_true(mh <= 1e-7 && mw <= 1e-7);
    gpu->free(gpu, dh_d), gpu->free(gpu, h_d), gpu->free(gpu, W_d), gpu->free(gpu, dW_d), gpu->free(gpu, l_d);
    free(h), free(W), free(dW0), free(nanb), free(zero), free(l), free(dh), free(dW);
}

// N = 0 gives loss 0; every target ignored gives loss 0, dh 0 and dW
// unchanged (+= 0: it starts at random values, never at the expected 0); a
// target >= V gives a NaN loss. The loss buffer holds NaN before the calls
// that must give 0, and 1 before the one that must give NaN.
static void test_ce_edge(void **st) {
    be_t *gpu = tu_gpu();
    enum { N = 3, d = 64, V = 1000 };
    float *h = tu_rnd(N * d, 81, 1.0f), *W = tu_rnd(V * d, 82, 0.3f), *nanb = tu_nans(N * d), one = 1.0f;
    float *dW0 = tu_rnd(V * d, 83, 0.01f);
    int32_t none[N] = {-100, -1, -100}, bad[N] = {3, V, 4};
    void *h_d = tu_dev_act(gpu, h, N * d), *W_d = tu_dev_act(gpu, W, V * d), *dh_d = tu_dev_act(gpu, nanb, N * d);
    float *dW_d = tu_dev_f32(gpu, dW0, V * d), *l_d = tu_dev_f32(gpu, nanb, 1);
    int32_t *none_d = tu_dev_i32(gpu, none, N), *bad_d = tu_dev_i32(gpu, bad, N);
    gpu->fused_ce(gpu, l_d, dh_d, dW_d, h_d, W_d, none_d, N, d, V, 1.0f);
    float *l = tu_host_f32(gpu, l_d, 1), *dh = tu_host_act(gpu, dh_d, N * d), *dW = tu_host_f32(gpu, dW_d, V * d);
    assert_true(l[0] == 0.0f);
    for (int i = 0; i < N * d; i++)
        assert_true(dh[i] == 0.0f);
    assert_memory_equal(dW, dW0, (size_t)V * d * sizeof(float));
    free(l);
    tu_upload_f32(gpu, l_d, &one, 1);
    gpu->fused_ce(gpu, l_d, NULL, NULL, h_d, W_d, bad_d, N, d, V, 1.0f);
    l = tu_host_f32(gpu, l_d, 1);
    assert_true(isnan(l[0]));
    free(l);
    tu_upload_f32(gpu, l_d, nanb, 1);
    gpu->fused_ce(gpu, l_d, dh_d, dW_d, h_d, W_d, none_d, 0, d, V, 1.0f);
    l = tu_host_f32(gpu, l_d, 1);
    assert_true(l[0] == 0.0f);
    gpu->free(gpu, h_d), gpu->free(gpu, W_d), gpu->free(gpu, dh_d), gpu->free(gpu, dW_d), gpu->free(gpu, l_d);
    gpu->free(gpu, none_d), gpu->free(gpu, bad_d);
    free(h), free(W), free(dW0), free(nanb), free(l), free(dh), free(dW);
}

// ---- layer-wise distillation distance -------------------------------------------
//
// The CPU op on the same bf16-valued inputs (double throughout) against the
// GPU's fp32 arithmetic. A difference of two bf16 values is exact in fp32 at
// these magnitudes; each lane then sums d/32 squares and the warp adds its 32
// partial sums in 5 steps, so the row's sum of squares carries at most
// (d/32 + 5) 2^-24 relative error (4e-6 at d = 2048; a sum of positive terms),
// its L2 distance half that, and the row sum in double adds nothing. Loss bound
// 1e-5 relative. dx = (x - y) coef is then rounded once to bf16: half an ulp,
// at most 2^-8 relative per element, on top of coef's ~1e-6; the bound per
// element is |gpu - cpu| <= (2^-8 + 1e-5) |cpu| (0 on the fake GPU, whose act
// is fp32: it runs the CPU code itself).
static const double TOL_ILD_LOSS = 1e-5, TOL_ILD_DX = 0x1p-8 + 1e-5;

static void ild_case(int64_t N, int d, int mode) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const float scale = 1.0f / (float)N;
    const int64_t n = N * d, same = N > 1 ? N / 2 : -1; // row `same`: y == x (gradient exactly 0)
    float *x = tu_rnd(n, 7000 + (uint64_t)(N * d), 1.0f), *y = tu_hbuf(n), *e = tu_rnd(n, 7001 + (uint64_t)n, 0.3f);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] + e[i];
    tu_round_bf16(y, n);
    if (same >= 0) memcpy(y + same * d, x + same * d, (size_t)d * sizeof(float));
    float *dx_c = tu_nans(n), loss_c = NAN;
    cpu->ild_dist(cpu, &loss_c, dx_c, x, y, N, d, scale, mode);

    float *nanbuf = tu_nans(n);
    void *x_d = tu_dev_act(gpu, x, n), *y_d = tu_dev_act(gpu, y, n), *dx_d = tu_dev_act(gpu, nanbuf, n);
    float *l_d = tu_dev_f32(gpu, nanbuf, 1);
    gpu->ild_dist(gpu, l_d, dx_d, x_d, y_d, N, d, scale, mode);
    char shape[64];
    snprintf(shape, sizeof shape, "N=%lld d=%d %s", (long long)N, d, mode == DIST_L2 ? "L2" : "MSE");
    assert_true(tu_sync(gpu, "ild_dist", shape));
    float *lg = tu_host_f32(gpu, l_d, 1), *dx_g = tu_host_act(gpu, dx_d, n);
    double el = rel(lg[0], loss_c);
    tu_cmp_t c = tu_compare(dx_g, dx_c, n, TOL_ILD_DX, 0.0, 0.0);
    printf("  ild %-22s loss gpu %.7g cpu %.7g rel %.1e | dx rel %.1e max abs %.1e, %lld off\n", shape, lg[0], loss_c,
           el, c.rel, c.max_abs, (long long)c.n_off);
    if (c.n_off) {
        const int64_t dims[4] = {1, 1, N, d};
        tu_print_elem("  worst", dx_g, dx_c, c.worst, dims, "..nd", c.rms);
    }
    assert_true(el < TOL_ILD_LOSS);
    assert_true(c.n_off == 0 && !c.nonfinite);
    if (same >= 0)
        for (int i = 0; i < d; i++)
            assert_true(dx_g[same * d + i] == 0.0f);

    // Evaluation (dx NULL), then with dx again: the same loss and dx, bit for
    // bit (a fixed-order reduction: what resuming a run relies on). Both
    // outputs hold NaN again before the calls.
    tu_upload_f32(gpu, l_d, nanbuf, 1);
    gpu->ild_dist(gpu, l_d, NULL, x_d, y_d, N, d, scale, mode);
    float *l2 = tu_host_f32(gpu, l_d, 1);
    assert_true(l2[0] == lg[0]);
    free(l2);
    tu_upload_f32(gpu, l_d, nanbuf, 1);
    tu_upload_act(gpu, dx_d, nanbuf, n);
    gpu->ild_dist(gpu, l_d, dx_d, x_d, y_d, N, d, scale, mode);
    float *dx2 = tu_host_act(gpu, dx_d, n);
    l2 = tu_host_f32(gpu, l_d, 1);
    assert_true(l2[0] == lg[0]);
    assert_memory_equal(dx2, dx_g, (size_t)n * sizeof(float));
    gpu->free(gpu, x_d), gpu->free(gpu, y_d), gpu->free(gpu, dx_d), gpu->free(gpu, l_d);
    free(x), free(y), free(e), free(dx_c), free(nanbuf), free(lg), free(dx_g), free(dx2), free(l2);
}

// N in {1, 7, 4096} x d in {64, 576, 2048}, both modes; d = 101 takes the
// scalar path (rows not 4-byte aligned).
static void ild_all(int mode) {
    tu_gpu(); // skip before building inputs when there is no GPU
    const int64_t Ns[3] = {1, 7, 4096};
    const int ds[3] = {64, 576, 2048};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            ild_case(Ns[a], ds[b], mode);
    ild_case(7, 101, mode);
}
static void test_ild_l2(void **st) { ild_all(DIST_L2); }
static void test_ild_mse(void **st) { ild_all(DIST_MSE); }

// x == y everywhere: loss and dx exactly 0 (no 0/0); N = 0: loss 0; an unknown
// mode: a NaN loss, and on the GPU an error from sync().
static void test_ild_edge(void **st) {
    be_t *gpu = tu_gpu();
    enum { N = 5, d = 576 };
    float *x = tu_rnd(N * d, 7101, 1.0f), *nanb = tu_nans(N * d), one = 1.0f;
    void *x_d = tu_dev_act(gpu, x, N * d), *dx_d = tu_dev_act(gpu, nanb, N * d);
    float *l_d = tu_dev_f32(gpu, nanb, 1);
    for (int mode = DIST_L2; mode <= DIST_MSE; mode++) {
        tu_upload_f32(gpu, l_d, nanb, 1);
        tu_upload_act(gpu, dx_d, nanb, N * d);
        gpu->ild_dist(gpu, l_d, dx_d, x_d, x_d, N, d, 0.5f, mode);
        float *l = tu_host_f32(gpu, l_d, 1), *dx = tu_host_act(gpu, dx_d, N * d);
        assert_true(l[0] == 0.0f);
        for (int i = 0; i < N * d; i++)
            assert_true(dx[i] == 0.0f);
        free(l), free(dx);
        tu_upload_f32(gpu, l_d, nanb, 1);
        gpu->ild_dist(gpu, l_d, dx_d, x_d, x_d, 0, d, 0.5f, mode);
        l = tu_host_f32(gpu, l_d, 1);
        assert_true(l[0] == 0.0f);
        free(l);
    }
    assert_int_equal(gpu->sync(gpu), 0);
    tu_upload_f32(gpu, l_d, &one, 1);
    gpu->ild_dist(gpu, l_d, NULL, x_d, x_d, N, d, 1.0f, 2);
    const int rc = gpu->sync(gpu);
    if (!tu_fake_gpu()) assert_true(rc < 0); // the CPU op sets the error slot; its sync has nothing to report
    float *l = tu_host_f32(gpu, l_d, 1);
    assert_true(isnan(l[0]));
    assert_int_equal(gpu->sync(gpu), 0); // reported once
    gpu->free(gpu, x_d), gpu->free(gpu, dx_d), gpu->free(gpu, l_d);
    free(x), free(nanb), free(l);
}

// ---- optimizer ---------------------------------------------------------------

// AdamW: the kernel performs the CPU reference's fp32 operations in the same
// order without FMA contraction, so master, m and v agree bit for bit; the
// bound allows 2 ulps in case a compiler contracts anyway. The work copy is
// bf16(master): within half a bf16 ulp (2^-8 relative) of the CPU master.
// Run on an aligned buffer (16-byte vector path + scalar tail) and on one
// offset by one float (scalar path), whose first element the op must leave
// alone. The work copy starts as NaN (it is written, never read), and a NaN
// anywhere counts as out of bounds.
static void adamw_case(int64_t n, int offset) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int64_t nn = n + offset;
    float *p = tu_rnd(nn, 91, 1.0f), *g1 = tu_rnd(nn, 92, 0.1f), *g2 = tu_rnd(nn, 93, 0.3f),
          *m = calloc((size_t)nn, sizeof(float));
    float *v = calloc((size_t)nn, sizeof(float)), *w = tu_nans(nn);
    for (int i = 0; i < offset; i++)
        w[i] = 7.0f; // outside the op: must survive
    float *p_d = tu_dev_f32(gpu, p, nn), *m_d = tu_dev_f32(gpu, m, nn), *v_d = tu_dev_f32(gpu, v, nn);
    float *g1_d = tu_dev_f32(gpu, g1, nn), *g2_d = tu_dev_f32(gpu, g2, nn);
    void *w_d = tu_dev_act(gpu, w, nn);
    for (int t = 1; t <= 3; t++) {
        const float *g = t == 2 ? g2 : g1;
        const float *g_d = t == 2 ? g2_d : g1_d;
        cpu->adamw(cpu, p + offset, w + offset, g + offset, m + offset, v + offset, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   0.25f, t);
        gpu->adamw(gpu, p_d + offset, (char *)w_d + offset * gpu->act_size, g_d + offset, m_d + offset, v_d + offset, n,
                   3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.25f, t);
    }
    float *pg = tu_host_f32(gpu, p_d, nn), *mg = tu_host_f32(gpu, m_d, nn), *vg = tu_host_f32(gpu, v_d, nn);
    float *wg = tu_host_act(gpu, w_d, nn);
    int64_t bad = 0;
    for (int64_t i = offset; i < nn; i++) {
        bad += !(fabsf(pg[i] - p[i]) <= 2.4e-7f * fabsf(p[i]));
        bad += !(fabsf(mg[i] - m[i]) <= 2.4e-7f * fabsf(m[i]));
        bad += !(fabsf(vg[i] - v[i]) <= 2.4e-7f * fabsf(v[i]));
        bad += !(fabsf(wg[i] - p[i]) <= 0x1p-8f * fabsf(p[i]));
    }
    for (int i = 0; i < offset; i++) // the CPU left these as they were too
        bad += pg[i] != p[i] || mg[i] != m[i] || vg[i] != v[i] || wg[i] != w[i];
    printf("  adamw n=%lld offset %d: master max diff %.2e, work max diff %.2e, %lld elements out of bounds\n",
           (long long)n, offset, tu_max_abs_diff(pg + offset, p + offset, n),
           tu_max_abs_diff(wg + offset, p + offset, n), (long long)bad);
    assert_true(bad == 0);
    gpu->free(gpu, p_d), gpu->free(gpu, m_d), gpu->free(gpu, v_d), gpu->free(gpu, g1_d), gpu->free(gpu, g2_d);
    gpu->free(gpu, w_d);
    free(p), free(g1), free(g2), free(m), free(v), free(w), free(pg), free(mg), free(vg), free(wg);
}
static void test_adamw(void **st) {
    adamw_case(1000003, 0);
    adamw_case(4099, 1);
}

// sumsq: both sides accumulate in double and round once to fp32, so they
// agree to 1 ulp (6e-8); bound 2e-7. n covers a grid of 1024 blocks and a tail.
static void test_sumsq(void **st) {
    be_t *gpu = tu_gpu();
    const int64_t ns[3] = {1, 4097, 10000019};
    for (int k = 0; k < 3; k++) {
        const int64_t n = ns[k];
        float *x = tu_rnd(n + 1, 95 + (uint64_t)k, 2.0f), ref = 0, nan = NAN;
        tu_cpu()->sumsq(tu_cpu(), &ref, x + 1, n);
        float *x_d = tu_dev_f32(gpu, x, n + 1), *o_d = tu_dev_f32(gpu, &nan, 1); // NaN: must be written
        gpu->sumsq(gpu, o_d, x_d + 1, n);                                        // x + 1: not 16-byte aligned
        float *o = tu_host_f32(gpu, o_d, 1);
        tu_upload_f32(gpu, o_d, &nan, 1);
        gpu->sumsq(gpu, o_d, x_d, n);
        float *o2 = tu_host_f32(gpu, o_d, 1), ref2 = 0;
        tu_cpu()->sumsq(tu_cpu(), &ref2, x, n);
        printf("  sumsq n=%lld: gpu %.9g cpu %.9g (aligned: %.9g %.9g)\n", (long long)n, o[0], ref, o2[0], ref2);
        assert_true(fabs(o[0] - ref) <= 2e-7 * ref);
        assert_true(fabs(o2[0] - ref2) <= 2e-7 * ref2);
        gpu->free(gpu, x_d), gpu->free(gpu, o_d);
        free(x), free(o), free(o2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ce_smollm_vocab), cmocka_unit_test(test_ce_small_vocab),
        cmocka_unit_test(test_ce_one_row),      cmocka_unit_test(test_ce_llama_vocab),
        cmocka_unit_test(test_ce_odd_vocab),    cmocka_unit_test(test_ce_chunks),
        cmocka_unit_test(test_ce_edge),         cmocka_unit_test(test_kl_smollm_vocab),
        cmocka_unit_test(test_kl_small_vocab),  cmocka_unit_test(test_kl_one_row),
        cmocka_unit_test(test_kl_llama_vocab),  cmocka_unit_test(test_kl_odd_vocab),
        cmocka_unit_test(test_kl_chunks),       cmocka_unit_test(test_kl_self_zero),
        cmocka_unit_test(test_ild_l2),          cmocka_unit_test(test_ild_mse),
        cmocka_unit_test(test_ild_edge),        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sumsq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
