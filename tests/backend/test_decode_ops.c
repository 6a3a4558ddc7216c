// The decode ops over per-sequence caches (attn_decode, kv_append,
// conv1d_step, gdn_recurrent_step, ssd_recurrent_step) on the CPU against the
// per-row calls a decode step made before them: a cache copy per row and
// attn_fwd with Tq = 1 over that sequence's cache; the per-state conv,
// update and recurrences on each row alone. And gdn_step against the three
// ops it puts in one call, proj_rope_kv_append and proj_mla_rope_append
// against their two.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// N rows, each a sequence with a cache of its own (separate allocations, so
// nothing can be found through a common base and stride), of lengths 1 to 70
// plus one empty row; H / Hkv = 3 (GQA) and 1. attn_decode must equal attn_fwd
// of each row alone bit for bit: it computes the same scores, softmax and
// weighted sum in the same order (cpu_attn.c). An empty row gives zeros.
static void check_attn_decode(int H, int Hkv, int dh) {
    be_t *be = tu_cpu();
    enum { N = 6, CAP = 80 };
    const int32_t len[N] = {1, 17, 70, 0, 33, 64};
    const int64_t kw = (int64_t)Hkv * dh;
    const float scale = 1.0f / sqrtf((float)dh);
    float *kc[N], *vc[N];
    void *kb[N], *vb[N];
    for (int r = 0; r < N; r++) {
        kc[r] = malloc(sizeof(float) * CAP * kw), vc[r] = malloc(sizeof(float) * CAP * kw);
        tu_randn(kc[r], CAP * kw, 200 + r, 1.0f);
        tu_randn(vc[r], CAP * kw, 300 + r, 1.0f);
        for (int64_t i = len[r] * kw; i < CAP * kw; i++) // rows past len: NaN poisons any read of them
            kc[r][i] = vc[r][i] = NAN;
        kb[r] = kc[r], vb[r] = vc[r];
    }
    float *q = malloc(sizeof(float) * N * H * dh), *out = malloc(sizeof(float) * N * H * dh);
    float *ref = malloc(sizeof(float) * H * dh);
    tu_randn(q, (int64_t)N * H * dh, 400, 2.0f);
    be->attn_decode(be, out, q, (int64_t)H * dh, kb, vb, (be_pages_t){0}, len, 70, N, H, Hkv, dh, dh, scale);
    for (int r = 0; r < N; r++) {
        const float *o = out + (int64_t)r * H * dh;
        if (len[r] == 0) {
            for (int i = 0; i < H * dh; i++)
                assert_true(o[i] == 0.0f);
            continue;
        }
        be->attn_fwd(be, ref, NULL, q + (int64_t)r * H * dh, kc[r], vc[r], 1, 1, len[r], H, Hkv, dh, dh, scale, 1);
        assert_memory_equal(o, ref, sizeof(float) * H * dh);
    }
    for (int r = 0; r < N; r++)
        free(kc[r]), free(vc[r]);
    free(q), free(out), free(ref);
}

static void test_attn_decode_gqa(void **st) { check_attn_decode(6, 2, 64); }
static void test_attn_decode_mha(void **st) { check_attn_decode(2, 2, 128); }

// kv_append writes each row's K and V at its own position of its own cache
// and nothing else: every other element keeps its value. The MLA form (one
// cache, the second part at column v_off) as well.
static void test_kv_append(void **st) {
    be_t *be = tu_cpu();
    enum { N = 3, CAP = 10, KW = 12, VW = 5 };
    const int32_t pos[N] = {0, 9, 4};
    float *kc[N], *vc[N], *kc0[N], *vc0[N];
    void *kb[N], *vb[N];
    for (int r = 0; r < N; r++) {
        kc[r] = malloc(sizeof(float) * CAP * KW), vc[r] = malloc(sizeof(float) * CAP * KW);
        tu_randn(kc[r], CAP * KW, 10 + r, 1.0f), tu_randn(vc[r], CAP * KW, 20 + r, 1.0f);
        kc0[r] = malloc(sizeof(float) * CAP * KW), vc0[r] = malloc(sizeof(float) * CAP * KW);
        memcpy(kc0[r], kc[r], sizeof(float) * CAP * KW), memcpy(vc0[r], vc[r], sizeof(float) * CAP * KW);
        kb[r] = kc[r], vb[r] = vc[r];
    }
    float k[N * KW], v[N * KW];
    tu_randn(k, N * KW, 30, 1.0f), tu_randn(v, N * KW, 31, 1.0f);
    // attention form: K and V caches, rows of KW
    be->kv_append(be, kb, vb, (be_pages_t){0}, KW, 0, pos, k, KW, KW, v, KW, KW, N);
    for (int r = 0; r < N; r++) {
        memcpy(kc0[r] + pos[r] * KW, k + r * KW, sizeof(float) * KW);
        memcpy(vc0[r] + pos[r] * KW, v + r * KW, sizeof(float) * KW);
        assert_memory_equal(kc[r], kc0[r], sizeof(float) * CAP * KW);
        assert_memory_equal(vc[r], vc0[r], sizeof(float) * CAP * KW);
    }
    // MLA form: one cache of rows KW = 7 + VW, [k (7) | v (VW)]
    be->kv_append(be, kb, kb, (be_pages_t){0}, KW, 7, pos, k, 7, 7, v, VW, VW, N);
    for (int r = 0; r < N; r++) {
        memcpy(kc0[r] + pos[r] * KW, k + r * 7, sizeof(float) * 7);
        memcpy(kc0[r] + pos[r] * KW + 7, v + r * VW, sizeof(float) * VW);
        assert_memory_equal(kc[r], kc0[r], sizeof(float) * CAP * KW);
    }
    for (int r = 0; r < N; r++)
        free(kc[r]), free(vc[r]), free(kc0[r]), free(vc0[r]);
}

// ---- the recurrent layers' step ops over per-row states ---------------------
// Each must equal, bit for bit, its per-state form called on every row alone
// (B = 1, T = 1: what a decode step did per run before), with each row's
// state in an allocation of its own. Sizes put every op past its OpenMP
// threshold, so rows run on several threads.

// A row's state: n floats at a fresh address, and a copy for the reference.
static float *row_state(int64_t n, uint64_t seed, float std, float **copy) {
    float *p = malloc(sizeof(float) * n);
    tu_randn(p, n, seed, std);
    *copy = malloc(sizeof(float) * n);
    memcpy(*copy, p, sizeof(float) * n);
    return p;
}

// conv1d_step against conv1d_fwd (T = 1, the window as state) then
// conv1d_update_state, per row; x rows with a stride (as the layers' column
// slices), with and without bias and SiLU, W = 4 and 2.
static void check_conv1d_step(int W, int with_bias, int silu) {
    be_t *be = tu_cpu();
    enum { N = 6, C = 2000, LDX = 2100 };
    float *x = malloc(sizeof(float) * N * LDX), *w = malloc(sizeof(float) * C * W), *bias = malloc(sizeof(float) * C);
    float *y = malloc(sizeof(float) * N * C), *ref = malloc(sizeof(float) * C);
    tu_randn(x, (int64_t)N * LDX, 50, 1.0f), tu_randn(w, (int64_t)C * W, 51, 0.5f), tu_randn(bias, C, 52, 0.1f);
    float *win[N], *win0[N];
    void *rows[N];
    for (int r = 0; r < N; r++)
        rows[r] = win[r] = row_state((int64_t)C * W, 60 + r, 1.0f, &win0[r]);
    be->conv1d_step(be, y, x, LDX, w, with_bias ? bias : NULL, rows, N, C, W, silu);
    for (int r = 0; r < N; r++) {
        be->conv1d_fwd(be, ref, x + (int64_t)r * LDX, LDX, w, with_bias ? bias : NULL, win0[r], 1, 1, C, W, silu);
        be->conv1d_update_state(be, win0[r], x + (int64_t)r * LDX, LDX, 1, 1, C, W);
        assert_memory_equal(y + (int64_t)r * C, ref, sizeof(float) * C);
        assert_memory_equal(win[r], win0[r], sizeof(float) * C * W);
    }
    for (int r = 0; r < N; r++)
        free(win[r]), free(win0[r]);
    free(x), free(w), free(bias), free(y), free(ref);
}
static void test_conv1d_step(void **st) {
    check_conv1d_step(4, 0, 1);
    check_conv1d_step(4, 1, 1);
    check_conv1d_step(2, 1, 0);
}

// gdn_recurrent_step against gdn_recurrent_fwd (B = 1, T = 1) per row; GVA
// (HV = 2 H).
static void test_gdn_recurrent_step(void **st) {
    be_t *be = tu_cpu();
    enum { N = 16, H = 2, HV = 4, K = 128, Dv = 128 };
    const int64_t SS = (int64_t)HV * Dv * K;
    const float scale = 1.0f / sqrtf((float)K);
    float *q = malloc(sizeof(float) * N * H * K), *k = malloc(sizeof(float) * N * H * K);
    float *v = malloc(sizeof(float) * N * HV * Dv), *g = malloc(sizeof(float) * N * HV),
          *beta = malloc(sizeof(float) * N * HV);
    float *o = malloc(sizeof(float) * N * HV * Dv), *ref = malloc(sizeof(float) * HV * Dv);
    tu_randn(q, (int64_t)N * H * K, 70, 0.1f), tu_randn(k, (int64_t)N * H * K, 71, 0.1f);
    tu_randn(v, (int64_t)N * HV * Dv, 72, 1.0f);
    tu_randu(g, N * HV, 73, -2.0f, -0.01f), tu_randu(beta, N * HV, 74, 0.0f, 1.0f);
    float *S[N], *S0[N];
    void *rows[N];
    for (int r = 0; r < N; r++)
        rows[r] = S[r] = row_state(SS, 80 + r, 0.1f, &S0[r]);
    be->gdn_recurrent_step(be, o, rows, q, k, v, g, beta, scale, N, H, HV, K, Dv);
    for (int r = 0; r < N; r++) {
        be->gdn_recurrent_fwd(be, ref, S0[r], q + (int64_t)r * H * K, k + (int64_t)r * H * K, v + (int64_t)r * HV * Dv,
                              g + r * HV, beta + r * HV, scale, 1, 1, H, HV, K, Dv);
        assert_memory_equal(o + (int64_t)r * HV * Dv, ref, sizeof(float) * HV * Dv);
        assert_memory_equal(S[r], S0[r], sizeof(float) * SS);
    }
    for (int r = 0; r < N; r++)
        free(S[r]), free(S0[r]);
    free(q), free(k), free(v), free(g), free(beta), free(o), free(ref);
}

// gdn_step against its three ops in sequence (gdn_step_inputs,
// gdn_recurrent_step, then gated_rmsnorm_fwd, or rmsnorm_fwd without the
// gate) on copies of the same states and windows: the reference the fused
// CUDA kernel is tested against must be exactly those ops. Projections of
// one strided buffer ([q | k | v | a | b | z | pad] per row), GVA (HV = 2 H),
// two steps in a row.
static void check_gdn_step(int gate) {
    be_t *be = tu_cpu();
    enum { N = 16, H = 2, HV = 4, K = 128, Dv = 128, W = 4 };
    const int64_t kd = H * K, vd = HV * Dv, ld = 2 * kd + vd + 2 * HV + vd + 3, oa = 2 * kd + vd, ob = oa + HV,
                  oz = ob + HV, n[4] = {vd * K, kd * W, kd * W, vd * W};
    const float scale = 1.0f / sqrtf((float)K);
    float *x = malloc(sizeof(float) * N * ld), *cw = malloc(sizeof(float) * (2 * kd + vd) * W);
    float A_log[HV], dtb[HV], onorm[Dv];
    tu_randu(A_log, HV, 110, 0.0f, 2.8f), tu_randu(dtb, HV, 111, -5.0f, -2.0f), tu_randu(onorm, Dv, 112, 0.5f, 1.5f);
    tu_randn(cw, (2 * kd + vd) * W, 113, 0.5f);
    const float *qw = cw, *kw = cw + kd * W, *vw = cw + 2 * kd * W;
    void *rows[4 * N], *rows0[4 * N];
    for (int j = 0; j < 4; j++)
        for (int r = 0; r < N; r++) {
            float *c;
            rows[j * N + r] = row_state(n[j], 120 + j * N + r, j ? 1.0f : 0.1f, &c);
            rows0[j * N + r] = c;
        }
    float *y = malloc(sizeof(float) * N * vd), *ref = malloc(sizeof(float) * N * vd);
    float *q = malloc(sizeof(float) * N * kd), *k = malloc(sizeof(float) * N * kd), *v = malloc(sizeof(float) * N * vd),
          *o = malloc(sizeof(float) * N * vd), *g = malloc(sizeof(float) * N * HV),
          *beta = malloc(sizeof(float) * N * HV);
    for (int t = 0; t < 2; t++) {
        tu_randn(x, N * ld, 130 + t, 1.0f);
        be->gdn_step(be, y, rows, x, ld, x + kd, ld, x + 2 * kd, ld, x + oa, ld, x + ob, ld, gate ? x + oz : NULL, ld,
                     qw, kw, vw, A_log, dtb, onorm, scale, N, H, HV, K, Dv, W, 1e-6f, 1e-5f, 0);
        be->gdn_step_inputs(be, q, k, v, g, beta, rows0, x, ld, x + kd, ld, x + 2 * kd, ld, x + oa, ld, x + ob, ld, qw,
                            kw, vw, A_log, dtb, N, H, HV, K, Dv, W, 1e-6f, 0);
        be->gdn_recurrent_step(be, o, rows0, q, k, v, g, beta, scale, N, H, HV, K, Dv);
        if (gate)
            be->gated_rmsnorm_fwd(be, ref, NULL, o, x + oz, ld, onorm, Dv, N, HV, Dv, 1e-5f, GNORM_NORM_THEN_GATE);
        else
            be->rmsnorm_fwd(be, ref, NULL, o, onorm, (int64_t)N * HV, Dv, 1e-5f);
        assert_memory_equal(y, ref, sizeof(float) * N * vd);
    }
    for (int i = 0; i < 4 * N; i++) {
        assert_memory_equal(rows[i], rows0[i], sizeof(float) * n[i / N]);
        free(rows[i]), free(rows0[i]);
    }
    free(x), free(cw), free(y), free(ref), free(q), free(k), free(v), free(o), free(g), free(beta);
}
static void test_gdn_step(void **st) {
    check_gdn_step(1);
    check_gdn_step(0);
}

// ssd_recurrent_step against ssd_recurrent_fwd (B = 1, T = 1) per row; x, B
// and C column slices of one xBC row (the layer's strides), grouped as
// MambaInLlama (Hx = GB = 2 heads of x and B for H = 4, GC = H).
// proj_rope_kv_append equals its two ops, gemm into [q | k | v] then
// rope_kv_append, bit for bit: q (rows of a wider buffer, the rest of it
// untouched) and every cache, each row at its own position (page boundaries
// among them), with contiguous caches of their own or through page tables
// over one pool (pages out of order). GQA; x rows of a wider buffer. With a
// gain (norm), against rmsnorm_fwd of x's rows, then the two ops.
static void check_proj_rope_kv_append(int paged, int norm) {
    be_t *be = tu_cpu();
    enum { N = 5, H = 6, HKV = 2, DH = 8, K = 40, LDX = 43, NPOS = 600, STRIDE = 3, NPAGES = N * STRIDE };
    enum { QW = H * DH, KW = HKV * DH, P = QW + 2 * KW, LDQ = QW + 5 };
    const int32_t pos[N] = {0, 255, 256, 599, 77};
    const int64_t per = paged ? (int64_t)NPAGES * BE_PAGE_ROWS * KW : (int64_t)NPOS * KW; // one buffer
    const int nbuf = paged ? 1 : N;
    float *x = malloc(sizeof(float) * N * LDX), *W = malloc(sizeof(float) * P * K);
    float *cs = malloc(sizeof(float) * NPOS * DH / 2), *sn = malloc(sizeof(float) * NPOS * DH / 2);
    float *q = malloc(sizeof(float) * N * LDQ), *q0 = malloc(sizeof(float) * N * LDQ),
          *qkv = malloc(sizeof(float) * N * P);
    tu_randn(x, N * LDX, 70, 1.0f), tu_randn(W, P * K, 71, 0.2f), tu_randn(q, N * LDQ, 72, 1.0f);
    tu_randn(cs, NPOS * DH / 2, 73, 1.0f), tu_randn(sn, NPOS * DH / 2, 74, 1.0f);
    memcpy(q0, q, sizeof(float) * N * LDQ);
    int32_t pages[NPAGES];
    for (int i = 0; i < NPAGES; i++) // row r's pages, descending
        pages[i] = NPAGES - 1 - i;
    be_pages_t pg = {paged ? pages : NULL, STRIDE};
    float *kc[N], *vc[N], *kc0[N], *vc0[N];
    void *kb[2 * N], *kb0[2 * N];
    for (int b = 0; b < nbuf; b++) {
        kc[b] = row_state(per, 80 + b, 1.0f, &kc0[b]);
        vc[b] = row_state(per, 90 + b, 1.0f, &vc0[b]);
    }
    for (int r = 0; r < N; r++) {
        int b = paged ? 0 : r;
        kb[r] = kc[b], kb[N + r] = vc[b], kb0[r] = kc0[b], kb0[N + r] = vc0[b];
    }
    float *g = malloc(sizeof(float) * K), *xn = malloc(sizeof(float) * N * K);
    tu_randn(g, K, 75, 1.0f);
    be->proj_rope_kv_append(be, q, LDQ, x, LDX, norm ? g : NULL, 1e-5f, W, pos, cs, sn, kb, kb + N, pg, N, K, H, HKV,
                            DH);
    for (int r = 0; r < N; r++)
        memcpy(xn + r * K, x + r * LDX, sizeof(float) * K);
    if (norm) be->rmsnorm_fwd(be, xn, NULL, xn, g, N, K, 1e-5f);
    be->gemm(be, 0, 1, N, P, K, 1.0f, xn, K, W, K, 0.0f, qkv, P);
    be->rope_kv_append(be, qkv, P, qkv + QW, P, qkv + QW + KW, P, pos, cs, sn, kb0, kb0 + N, pg, N, H, HKV, DH);
    for (int r = 0; r < N; r++)
        memcpy(q0 + r * LDQ, qkv + r * P, sizeof(float) * QW);
    assert_memory_equal(q, q0, sizeof(float) * N * LDQ);
    for (int b = 0; b < nbuf; b++) {
        assert_memory_equal(kc[b], kc0[b], sizeof(float) * per);
        assert_memory_equal(vc[b], vc0[b], sizeof(float) * per);
    }
    for (int b = 0; b < nbuf; b++)
        free(kc[b]), free(vc[b]), free(kc0[b]), free(vc0[b]);
    free(x), free(W), free(cs), free(sn), free(q), free(q0), free(qkv), free(g), free(xn);
}
static void test_proj_rope_kv_append(void **st) {
    for (int norm = 0; norm < 2; norm++) {
        check_proj_rope_kv_append(0, norm);
        check_proj_rope_kv_append(1, norm);
    }
}

// proj_mla_rope_append equals its two ops, gemm into q then mla_rope_append,
// bit for bit: q (rows of a wider buffer, the rest of it untouched) and every
// cache, each row at its own position (page boundaries among them when N >
// 1), caches of their own or one pool through page tables (pages out of
// order). x's rows are a joint product's [cq | c | k_pe] (plus slack), the
// op reading cq, c and k_pe in place as mla_step does; K odd.
static void check_proj_mla_rope_append(int paged, int N) {
    be_t *be = tu_cpu();
    enum { H = 3, DN = 6, DR = 8, QD = DN + DR, RKV = 10, L = RKV + DR, K = 23, LDX = K + L + 3, LDQ = H * QD + 5 };
    enum { NPOS = 600, STRIDE = 3, MAXN = 3, NPAGES = MAXN * STRIDE };
    static const int32_t positions[MAXN] = {255, 256, 599};
    assert_true(N <= MAXN);
    const int32_t *pos = N == 1 ? positions + 2 : positions;
    const int64_t per = paged ? (int64_t)NPAGES * BE_PAGE_ROWS * L : (int64_t)NPOS * L; // one buffer
    const int nbuf = paged ? 1 : N;
    float *x = malloc(sizeof(float) * N * LDX), *W = malloc(sizeof(float) * H * QD * K);
    float *cs = malloc(sizeof(float) * NPOS * DR / 2), *sn = malloc(sizeof(float) * NPOS * DR / 2);
    float *q = malloc(sizeof(float) * N * LDQ), *q0 = malloc(sizeof(float) * N * LDQ);
    tu_randn(x, N * LDX, 170, 1.0f), tu_randn(W, H * QD * K, 171, 0.2f), tu_randn(q, N * LDQ, 172, 1.0f);
    tu_randn(cs, NPOS * DR / 2, 173, 1.0f), tu_randn(sn, NPOS * DR / 2, 174, 1.0f);
    memcpy(q0, q, sizeof(float) * N * LDQ);
    int32_t pages[NPAGES];
    for (int i = 0; i < NPAGES; i++) // row r's pages, descending
        pages[i] = NPAGES - 1 - i;
    be_pages_t pg = {paged ? pages : NULL, STRIDE};
    float *kc[MAXN], *kc0[MAXN];
    void *rows[MAXN], *rows0[MAXN];
    for (int b = 0; b < nbuf; b++)
        kc[b] = row_state(per, 180 + b, 1.0f, &kc0[b]);
    for (int r = 0; r < N; r++) {
        int b = paged ? 0 : r;
        rows[r] = kc[b], rows0[r] = kc0[b];
    }
    be->proj_mla_rope_append(be, q, LDQ, x, LDX, W, x + K, LDX, x + K + RKV, LDX, pos, cs, sn, rows, pg, N, K, H, QD,
                             RKV, DR);
    be->gemm(be, 0, 1, N, H * QD, K, 1.0f, x, LDX, W, K, 0.0f, q0, LDQ);
    be->mla_rope_append(be, q0 + DN, LDQ, QD, x + K, LDX, x + K + RKV, LDX, pos, cs, sn, rows0, pg, N, H, RKV, DR);
    assert_memory_equal(q, q0, sizeof(float) * N * LDQ);
    for (int b = 0; b < nbuf; b++)
        assert_memory_equal(kc[b], kc0[b], sizeof(float) * per);
    for (int b = 0; b < nbuf; b++)
        free(kc[b]), free(kc0[b]);
    free(x), free(W), free(cs), free(sn), free(q), free(q0);
}
static void test_proj_mla_rope_append(void **st) {
    for (int paged = 0; paged < 2; paged++) {
        check_proj_mla_rope_append(paged, 1);
        check_proj_mla_rope_append(paged, 3);
    }
}

// proj_swiglu equals its ops bit for bit: the two products then swiglu_fwd,
// and with a gain, rmsnorm_fwd of x's rows (a wider buffer's) first.
static void test_proj_swiglu(void **st) {
    be_t *be = tu_cpu();
    enum { N = 3, K = 48, LDX = 53, F = 40 };
    float *x = malloc(sizeof(float) * N * LDX), *Wg = malloc(sizeof(float) * F * K),
          *Wu = malloc(sizeof(float) * F * K);
    float *g = malloc(sizeof(float) * K), *xn = malloc(sizeof(float) * N * K), *h = malloc(sizeof(float) * N * F);
    float *gate = malloc(sizeof(float) * N * F), *up = malloc(sizeof(float) * N * F),
          *h0 = malloc(sizeof(float) * N * F);
    tu_randn(x, N * LDX, 60, 1.0f), tu_randn(Wg, F * K, 61, 0.2f), tu_randn(Wu, F * K, 62, 0.2f);
    tu_randn(g, K, 63, 1.0f);
    for (int norm = 0; norm < 2; norm++) {
        be->proj_swiglu(be, h, x, LDX, norm ? g : NULL, 1e-6f, Wg, Wu, N, K, F);
        for (int r = 0; r < N; r++)
            memcpy(xn + r * K, x + r * LDX, sizeof(float) * K);
        if (norm) be->rmsnorm_fwd(be, xn, NULL, xn, g, N, K, 1e-6f);
        be->gemm(be, 0, 1, N, F, K, 1.0f, xn, K, Wg, K, 0.0f, gate, F);
        be->gemm(be, 0, 1, N, F, K, 1.0f, xn, K, Wu, K, 0.0f, up, F);
        be->swiglu_fwd(be, h0, gate, up, F, N, F);
        assert_memory_equal(h, h0, sizeof(float) * N * F);
    }
    free(x), free(Wg), free(Wu), free(g), free(xn), free(h), free(gate), free(up), free(h0);
}

// proj_rmsnorm equals rmsnorm_fwd of x's rows (a wider buffer's) then the
// product, bit for bit.
static void test_proj_rmsnorm(void **st) {
    be_t *be = tu_cpu();
    enum { N = 4, K = 40, LDX = 45, OUT = 33 };
    float *x = malloc(sizeof(float) * N * LDX), *W = malloc(sizeof(float) * OUT * K), *g = malloc(sizeof(float) * K);
    float *xn = malloc(sizeof(float) * N * K), *y = malloc(sizeof(float) * N * OUT),
          *y0 = malloc(sizeof(float) * N * OUT);
    tu_randn(x, N * LDX, 64, 3.0f), tu_randn(W, OUT * K, 65, 0.2f), tu_randn(g, K, 66, 1.0f);
    be->proj_rmsnorm(be, y, x, LDX, g, 1e-6f, W, N, K, OUT);
    for (int r = 0; r < N; r++)
        memcpy(xn + r * K, x + r * LDX, sizeof(float) * K);
    be->rmsnorm_fwd(be, xn, NULL, xn, g, N, K, 1e-6f);
    be->gemm(be, 0, 1, N, OUT, K, 1.0f, xn, K, W, K, 0.0f, y0, OUT);
    assert_memory_equal(y, y0, sizeof(float) * N * OUT);
    free(x), free(W), free(g), free(xn), free(y), free(y0);
}

static void test_ssd_recurrent_step(void **st) {
    be_t *be = tu_cpu();
    enum { N = 6, H = 4, Hx = 2, GB = 2, GC = 4, P = 32, Ns = 64 };
    const int64_t ld = (int64_t)Hx * P + GB * Ns + GC * Ns, oB = (int64_t)Hx * P, oC = oB + GB * Ns;
    const int64_t PN = (int64_t)H * P * Ns;
    float *xbc = malloc(sizeof(float) * N * ld), *dt = malloc(sizeof(float) * N * H);
    float A_log[H], D[H], *y = malloc(sizeof(float) * N * H * P), *ref = malloc(sizeof(float) * H * P);
    tu_randn(xbc, N * ld, 90, 1.0f), tu_randu(dt, N * H, 91, 0.01f, 1.0f);
    tu_randu(A_log, H, 92, -1.0f, 1.0f), tu_randn(D, H, 93, 1.0f);
    float *S[N], *S0[N];
    void *rows[N];
    for (int r = 0; r < N; r++)
        rows[r] = S[r] = row_state(PN, 100 + r, 0.5f, &S0[r]);
    be->ssd_recurrent_step(be, y, rows, xbc, ld, xbc + oB, ld, xbc + oC, ld, dt, A_log, D, N, H, Hx, GB, GC, P, Ns);
    for (int r = 0; r < N; r++) {
        const float *xr = xbc + r * ld;
        be->ssd_recurrent_fwd(be, ref, S0[r], xr, ld, xr + oB, ld, xr + oC, ld, dt + r * H, A_log, D, 1, 1, H, Hx, GB,
                              GC, P, Ns);
        assert_memory_equal(y + (int64_t)r * H * P, ref, sizeof(float) * H * P);
        assert_memory_equal(S[r], S0[r], sizeof(float) * PN);
    }
    for (int r = 0; r < N; r++)
        free(S[r]), free(S0[r]);
    free(xbc), free(dt), free(y), free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_decode_gqa),
        cmocka_unit_test(test_attn_decode_mha),
        cmocka_unit_test(test_kv_append),
        cmocka_unit_test(test_conv1d_step),
        cmocka_unit_test(test_gdn_recurrent_step),
        cmocka_unit_test(test_gdn_step),
        cmocka_unit_test(test_ssd_recurrent_step),
        cmocka_unit_test(test_proj_rope_kv_append),
        cmocka_unit_test(test_proj_swiglu),
        cmocka_unit_test(test_proj_rmsnorm),
        cmocka_unit_test(test_proj_mla_rope_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
