// Finite-difference gradient checks of the CPU backend's shared ops (norms,
// RoPE, attention, SwiGLU) and naive-reference checks of attention forward
// (causal and unmasked) and of the merge of attention over two key sets.
// fp32 throughout: eps 1e-2 on O(1) inputs keeps the truncation error of the
// central difference (O(eps^2)) and the rounding error (~1e-7/eps) both near
// 1e-4 relative, so tol 1e-2 separates real bugs (errors of O(1)) from noise.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// Loss = sum(out * R) for a fixed random R, recomputed by each check.
typedef struct {
    be_t *be;
    int kind;
    float *x, *z, *w, *out, *R, *rstd;
    int64_t N;
    int d, G, gs, mode;
    // attention
    float *q, *k, *v, *lse;
    int B, Tq, Tk, H, Hkv, dqk, dv;
    // rope
    float *cos, *sin;
    int32_t *pos;
    int style;
    // conv: x [B,T,C] with row stride ldx, w [C,W], bias [C], state [B,C,W]
    float *bias, *state;
    int T, C, W;
    int64_t ldx;
} op_ctx;

enum { K_RMS, K_GNORM, K_L2, K_ATTN, K_ROPE, K_SWIGLU, K_CONV };

static int64_t out_len(op_ctx *c) {
    switch (c->kind) {
    case K_ATTN: return (int64_t)c->B * c->Tq * c->H * c->dv;
    case K_GNORM: return c->N * c->G * c->gs;
    case K_CONV: return (int64_t)c->B * c->T * c->C;
    default: return c->N * c->d;
    }
}

static double run(void *ctx, double *l1) {
    op_ctx *c = ctx;
    be_t *be = c->be;
    switch (c->kind) {
    case K_RMS: be->rmsnorm_fwd(be, c->out, c->rstd, c->x, c->w, c->N, c->d, 1e-5f); break;
    case K_GNORM:
        be->gated_rmsnorm_fwd(be, c->out, c->rstd, c->x, c->z, (int64_t)c->G * c->gs, c->w, c->gs, c->N, c->G, c->gs,
                              1e-5f, c->mode);
        break;
    case K_L2: be->l2norm_fwd(be, c->out, c->rstd, c->x, c->d, c->N, c->d, 1e-6f); break;
    case K_ATTN:
        be->attn_fwd(be, c->out, c->lse, c->q, c->k, c->v, c->B, c->Tq, c->Tk, c->H, c->Hkv, c->dqk, c->dv,
                     1.0f / sqrtf((float)c->dqk), 1);
        break;
    case K_ROPE:
        memcpy(c->out, c->x, (size_t)c->N * c->d * sizeof(float));
        be->rope_fwd(be, c->out, c->d, c->d, c->pos, c->cos, c->sin, c->N, 1, c->d, c->style);
        break;
    case K_SWIGLU: be->swiglu_fwd(be, c->out, c->x, c->z, c->d, c->N, c->d); break;
    case K_CONV:
        be->conv1d_fwd(be, c->out, c->x, c->ldx, c->w, c->bias, c->state, c->B, c->T, c->C, c->W, c->style);
        break;
    }
    return tu_dot_l1(c->out, c->R, out_len(c), l1);
}

// Every buffer of a test is tracked and freed after it (release_buffers).
static void *tracked[256];
static int n_tracked;

static float *track(float *p) {
    assert_true(n_tracked < 256);
    tracked[n_tracked++] = p;
    return p;
}

static int release_buffers(void **st) {
    for (int i = 0; i < n_tracked; i++)
        free(tracked[i]);
    n_tracked = 0;
    return 0;
}

static float *buf(int64_t n, uint64_t seed) {
    float *p = track(malloc((size_t)(n > 0 ? n : 1) * sizeof(float)));
    tu_randn(p, n, seed, 1.0f);
    return p;
}

static float *zeros(int64_t n) { return track(calloc((size_t)(n > 0 ? n : 1), sizeof(float))); }

static void test_rmsnorm(void **st) {
    op_ctx c = {.be = tu_cpu(), .kind = K_RMS, .N = 5, .d = 24};
    c.x = buf(c.N * c.d, 1), c.w = buf(c.d, 2), c.R = buf(c.N * c.d, 3);
    c.out = buf(c.N * c.d, 0), c.rstd = buf(c.N, 0);
    run(&c, NULL);
    float *dx = buf(c.N * c.d, 0), *dw = zeros(c.d);
    c.be->rmsnorm_bwd(c.be, dx, dw, c.R, c.x, c.w, c.rstd, c.N, c.d);
    assert_int_equal(tu_gradcheck("rmsnorm dx", run, &c, c.x, dx, c.N * c.d, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("rmsnorm dw", run, &c, c.w, dw, c.d, 1e-2f, 1e-2f, 40), 0);
}

// add_rmsnorm_fwd is add followed by rmsnorm_fwd, bit for bit.
static void test_add_rmsnorm(void **st) {
    be_t *be = tu_cpu();
    int64_t N = 5, d = 24, n = N * d;
    float *x = buf(n, 81), *y = buf(n, 82), *w = buf(d, 83), *x2 = zeros(n);
    float *o1 = buf(n, 0), *o2 = buf(n, 0), *r1 = buf(N, 0), *r2 = buf(N, 0);
    memcpy(x2, x, n * sizeof(float));
    be->add_rmsnorm_fwd(be, o1, r1, x, y, w, N, (int)d, 1e-5f);
    be->add(be, x2, y, n);
    be->rmsnorm_fwd(be, o2, r2, x2, w, N, (int)d, 1e-5f);
    assert_memory_equal(x, x2, n * sizeof(float));
    assert_memory_equal(o1, o2, n * sizeof(float));
    assert_memory_equal(r1, r2, N * sizeof(float));
}

static void gnorm_case(int mode) {
    op_ctx c = {.be = tu_cpu(), .kind = K_GNORM, .N = 4, .G = 3, .gs = 16, .mode = mode};
    int64_t n = c.N * c.G * c.gs;
    c.x = buf(n, 11), c.z = buf(n, 12), c.w = buf(c.gs, 13), c.R = buf(n, 14), c.out = buf(n, 0);
    c.rstd = buf(c.N * c.G, 0);
    run(&c, NULL);
    float *dx = buf(n, 0), *dz = buf(n, 0), *dw = zeros(c.gs);
    c.be->gated_rmsnorm_bwd(c.be, dx, dz, (int64_t)c.G * c.gs, dw, c.R, c.x, c.z, (int64_t)c.G * c.gs, c.w, c.gs,
                            c.rstd, c.N, c.G, c.gs, mode);
    assert_int_equal(tu_gradcheck("gnorm dx", run, &c, c.x, dx, n, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("gnorm dz", run, &c, c.z, dz, n, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("gnorm dw", run, &c, c.w, dw, c.gs, 1e-2f, 1e-2f, 40), 0);
}
static void test_gated_rmsnorm_gdn(void **st) { gnorm_case(GNORM_NORM_THEN_GATE); }
static void test_gated_rmsnorm_m2(void **st) { gnorm_case(GNORM_GATE_THEN_NORM); }

static void test_l2norm(void **st) {
    op_ctx c = {.be = tu_cpu(), .kind = K_L2, .N = 6, .d = 32};
    c.x = buf(c.N * c.d, 21), c.R = buf(c.N * c.d, 22), c.out = buf(c.N * c.d, 0), c.rstd = buf(c.N, 0);
    run(&c, NULL);
    float *dx = buf(c.N * c.d, 0);
    c.be->l2norm_bwd(c.be, dx, c.d, c.R, c.out, c.rstd, c.N, c.d);
    assert_int_equal(tu_gradcheck("l2norm dx", run, &c, c.x, dx, c.N * c.d, 1e-2f, 1e-2f, 40), 0);
}

static void rope_case(int style) {
    op_ctx c = {.be = tu_cpu(), .kind = K_ROPE, .N = 7, .d = 16, .style = style};
    c.x = buf(c.N * c.d, 31), c.R = buf(c.N * c.d, 32), c.out = buf(c.N * c.d, 0);
    c.cos = zeros(8 * 10), c.sin = zeros(8 * 10);
    for (int p = 0; p < 10; p++)
        for (int i = 0; i < 8; i++) {
            float ang = p * powf(100.0f, -i / 8.0f);
            c.cos[p * 8 + i] = 1.3f * cosf(ang), c.sin[p * 8 + i] = 1.3f * sinf(ang); // mscale 1.3
        }
    int32_t pos[7] = {0, 3, 1, 9, 4, 4, 2};
    c.pos = pos;
    run(&c, NULL);
    float *dx = zeros(c.N * c.d);
    memcpy(dx, c.R, (size_t)c.N * c.d * sizeof(float));
    c.be->rope_bwd(c.be, dx, c.d, c.d, c.pos, c.cos, c.sin, c.N, 1, c.d, style);
    assert_int_equal(tu_gradcheck("rope dx", run, &c, c.x, dx, c.N * c.d, 1e-2f, 1e-2f, 60), 0);
    if (style == ROPE_INTERLEAVED) { // layout: pair (2j, 2j+1) -> outputs (j, j + d/2)
        float x[16] = {0}, *cs = c.cos + 3 * 8, *sn = c.sin + 3 * 8;
        x[2 * 2] = 1.0f; // pair j = 2, first element
        int32_t p3 = 3;
        c.be->rope_fwd(c.be, x, 16, 16, &p3, c.cos, c.sin, 1, 1, 16, style);
        assert_float_equal(x[2], cs[2], 1e-6);
        assert_float_equal(x[2 + 8], sn[2], 1e-6);
    }
}
static void test_rope_neox(void **st) { rope_case(ROPE_NEOX); }
static void test_rope_interleaved(void **st) { rope_case(ROPE_INTERLEAVED); }

static void test_swiglu(void **st) {
    op_ctx c = {.be = tu_cpu(), .kind = K_SWIGLU, .N = 3, .d = 20};
    int64_t n = c.N * c.d;
    c.x = buf(n, 41), c.z = buf(n, 42), c.R = buf(n, 43), c.out = buf(n, 0);
    float *dg = buf(n, 0), *du = buf(n, 0);
    c.be->swiglu_bwd(c.be, dg, du, c.R, c.x, c.z, n);
    assert_int_equal(tu_gradcheck("swiglu dgate", run, &c, c.x, dg, n, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("swiglu dup", run, &c, c.z, du, n, 1e-2f, 1e-2f, 40), 0);
}

static void attn_case(int Tq, int Tk) {
    op_ctx c = {.be = tu_cpu(), .kind = K_ATTN, .B = 2, .Tq = Tq, .Tk = Tk, .H = 4, .Hkv = 2, .dqk = 12, .dv = 8};
    int64_t nq = (int64_t)c.B * Tq * c.H * c.dqk, nk = (int64_t)c.B * Tk * c.Hkv * c.dqk,
            nv = (int64_t)c.B * Tk * c.Hkv * c.dv, no = (int64_t)c.B * Tq * c.H * c.dv;
    c.q = buf(nq, 51), c.k = buf(nk, 52), c.v = buf(nv, 53), c.R = buf(no, 54), c.out = buf(no, 0);
    c.lse = buf((int64_t)c.B * c.H * Tq, 0);
    run(&c, NULL);
    // naive check of one output row: batch 1, head 3 (kv head 1), last query
    {
        int b = 1, h = 3, t = Tq - 1, hk = 1, last = Tk - Tq + t;
        double s[64], m = -1e30, sum = 0;
        for (int u = 0; u <= last; u++) {
            s[u] = 0;
            for (int i = 0; i < c.dqk; i++)
                s[u] += (double)c.q[(((int64_t)b * Tq + t) * c.H + h) * c.dqk + i] *
                        c.k[(((int64_t)b * Tk + u) * c.Hkv + hk) * c.dqk + i];
            s[u] /= sqrt((double)c.dqk);
            if (s[u] > m) m = s[u];
        }
        for (int u = 0; u <= last; u++)
            sum += exp(s[u] - m);
        for (int i = 0; i < c.dv; i++) {
            double o = 0;
            for (int u = 0; u <= last; u++)
                o += exp(s[u] - m) / sum * c.v[(((int64_t)b * Tk + u) * c.Hkv + hk) * c.dv + i];
            assert_float_equal(c.out[(((int64_t)b * Tq + t) * c.H + h) * c.dv + i], o, 1e-5);
        }
    }
    float *dq = buf(nq, 0), *dk = buf(nk, 0), *dv = buf(nv, 0);
    c.be->attn_bwd(c.be, dq, dk, dv, c.R, c.q, c.k, c.v, c.out, c.lse, c.B, Tq, Tk, c.H, c.Hkv, c.dqk, c.dv,
                   1.0f / sqrtf((float)c.dqk));
    assert_int_equal(tu_gradcheck("attn dq", run, &c, c.q, dq, nq, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("attn dk", run, &c, c.k, dk, nk, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("attn dv", run, &c, c.v, dv, nv, 1e-2f, 1e-2f, 40), 0);
}
static void test_attention(void **st) { attn_case(7, 7); }
static void test_attention_after_cache(void **st) { attn_case(3, 9); }

// From 32 query rows on attn_fwd runs by tiles of query rows (cpu_attn.c)
// with the row loop's arithmetic: each row, output and lse, bit for bit the
// same row computed alone (Tq = 1 over its visible keys: the row loop), over
// three tiles with a ragged last one, after a cache (Tk > Tq), with GQA and a
// head dim that is not a multiple of 8. Then the naive check and the
// gradient check of attn_case on a tiled forward.
static void test_attention_tiles(void **st) {
    be_t *be = tu_cpu();
    enum { B = 2, Tq = 150, Tk = 170, H = 6, Hkv = 2, DQ = 44, DV = 24 };
    int64_t nq = (int64_t)B * Tq * H * DQ, nk = (int64_t)B * Tk * Hkv * DQ, nv = (int64_t)B * Tk * Hkv * DV;
    float *q = buf(nq, 61), *k = buf(nk, 62), *v = buf(nv, 63);
    float *out = buf((int64_t)B * Tq * H * DV, 0), *lse = buf((int64_t)B * H * Tq, 0);
    float *row = buf(H * DV, 0), *row_lse = buf(H, 0);
    float scale = 1.0f / sqrtf((float)DQ);
    be->attn_fwd(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, DQ, DV, scale, 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            int vis = Tk - Tq + t + 1;
            be->attn_fwd(be, row, row_lse, q + ((int64_t)b * Tq + t) * H * DQ, k + (int64_t)b * Tk * Hkv * DQ,
                         v + (int64_t)b * Tk * Hkv * DV, 1, 1, vis, H, Hkv, DQ, DV, scale, 1);
            assert_memory_equal(out + ((int64_t)b * Tq + t) * H * DV, row, sizeof(float) * H * DV);
            for (int h = 0; h < H; h++)
                assert_memory_equal(&lse[((int64_t)b * H + h) * Tq + t], &row_lse[h], sizeof(float));
        }
    attn_case(40, 45);
}

// attn_fwd with causal = 0: every query row sees all Tk keys, including
// Tk < Tq; each output row and lse against a naive double-precision softmax.
// Through the row loop (Tq < 32) and the tiles of query rows, with GQA. fp32
// scores of O(1) inputs over <= 70 keys differ from double by ~1e-7, so 1e-5
// is loose for rounding yet a key dropped or counted twice moves an output by
// ~1/Tk (>= 1e-2) and the lse by log(1 + 1/Tk).
static void no_mask_case(int B, int Tq, int Tk, uint64_t seed) {
    be_t *be = tu_cpu();
    enum { H = 6, Hkv = 2, DQ = 20, DV = 12 };
    float *q = buf((int64_t)B * Tq * H * DQ, seed), *k = buf((int64_t)B * Tk * Hkv * DQ, seed + 1);
    float *v = buf((int64_t)B * Tk * Hkv * DV, seed + 2);
    float *out = buf((int64_t)B * Tq * H * DV, 0), *lse = buf((int64_t)B * H * Tq, 0);
    double *s = malloc(sizeof(double) * (Tk > 0 ? Tk : 1));
    float scale = 1.0f / sqrtf((float)DQ);
    be->attn_fwd(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, DQ, DV, scale, 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++)
            for (int h = 0; h < H; h++) {
                int hk = h / (H / Hkv);
                const float *qr = q + (((int64_t)b * Tq + t) * H + h) * DQ;
                const float *o = out + (((int64_t)b * Tq + t) * H + h) * DV;
                float l = lse[((int64_t)b * H + h) * Tq + t];
                if (Tk == 0) { // nothing attended: out 0, lse -inf
                    for (int i = 0; i < DV; i++)
                        assert_true(o[i] == 0.0f);
                    assert_true(l == -INFINITY);
                    continue;
                }
                double m = -1e300, sum = 0;
                for (int u = 0; u < Tk; u++) {
                    const float *kr = k + (((int64_t)b * Tk + u) * Hkv + hk) * DQ;
                    s[u] = 0;
                    for (int i = 0; i < DQ; i++)
                        s[u] += (double)qr[i] * kr[i];
                    s[u] *= scale;
                    if (s[u] > m) m = s[u];
                }
                for (int u = 0; u < Tk; u++)
                    sum += exp(s[u] - m);
                assert_float_equal(l, m + log(sum), 1e-5);
                for (int i = 0; i < DV; i++) {
                    double ref = 0;
                    for (int u = 0; u < Tk; u++)
                        ref += exp(s[u] - m) / sum * v[(((int64_t)b * Tk + u) * Hkv + hk) * DV + i];
                    assert_float_equal(o[i], ref, 1e-5);
                }
            }
    free(s);
}
static void test_attention_no_mask(void **st) {
    no_mask_case(2, 5, 9, 71);   // row loop
    no_mask_case(1, 3, 1, 72);   // one key
    no_mask_case(2, 40, 17, 73); // tiles of query rows, fewer keys than queries
    no_mask_case(1, 37, 70, 74); // tiles, more keys than queries
    no_mask_case(1, 33, 0, 75);  // no key at all
    no_mask_case(1, 2, 0, 76);
}

// attn_merge: the attention over keys [0, Tk) cut into three parts, each
// attended with causal = 0 and merged into a running result in turn (first
// part: first = 1 over NaN-filled acc and lse, which must not be read; the
// last merge also writes out), in either order, equals the attention over all
// Tk keys, out and lse, up to fp32 rounding (1e-5 as in no_mask_case: a wrong
// weight exp(lse_i - lse) is off by O(0.1)). An empty part (lse -inf) changes
// nothing, bit for bit; only empty parts give 0 and lse -inf.
static void test_attention_merge(void **st) {
    be_t *be = tu_cpu();
    enum { Tq = 34, Tk = 45, H = 4, Hkv = 2, DQ = 16, DV = 24 };
    const int64_t no = (int64_t)Tq * H * DV, nl = (int64_t)H * Tq;
    float *q = buf((int64_t)Tq * H * DQ, 81), *k = buf((int64_t)Tk * Hkv * DQ, 82),
          *v = buf((int64_t)Tk * Hkv * DV, 83);
    float *o_all = buf(no, 0), *l_all = buf(nl, 0), *o_i = buf(no, 0), *l_i = buf(nl, 0);
    float *acc = buf(no, 0), *lse = buf(nl, 0), *out = buf(no, 0);
    float scale = 1.0f / sqrtf((float)DQ);
    be->attn_fwd(be, o_all, l_all, q, k, v, 1, Tq, Tk, H, Hkv, DQ, DV, scale, 0);
    const int cuts[3][2] = {{1, 2}, {20, 33}, {40, 44}}; // parts [0, c0), [c0, c1), [c1, Tk)
    for (int ci = 0; ci < 3; ci++)
        for (int order = 0; order < 2; order++) {
            const int edge[4] = {0, cuts[ci][0], cuts[ci][1], Tk};
            for (int64_t i = 0; i < no; i++)
                acc[i] = out[i] = NAN;
            for (int64_t i = 0; i < nl; i++)
                lse[i] = NAN;
            for (int j = 0; j < 3; j++) {
                int part = order ? 2 - j : j, u0 = edge[part], n = edge[part + 1] - u0;
                // one sequence: the parts' key rows are contiguous
                be->attn_fwd(be, o_i, l_i, q, k + (int64_t)u0 * Hkv * DQ, v + (int64_t)u0 * Hkv * DV, 1, Tq, n, H, Hkv,
                             DQ, DV, scale, 0);
                be->attn_merge(be, acc, lse, o_i, l_i, j == 2 ? out : NULL, j == 0, 1, Tq, H, DV);
            }
            for (int64_t i = 0; i < no; i++) {
                assert_float_equal(out[i], o_all[i], 1e-5);
                assert_true(out[i] == acc[i]); // act is fp32 on the CPU
            }
            for (int64_t i = 0; i < nl; i++)
                assert_float_equal(lse[i], l_all[i], 1e-5);
        }
    // an empty part first, then everything: the result is the whole attention's, bit for bit
    be->attn_fwd(be, o_i, l_i, q, k, v, 1, Tq, 0, H, Hkv, DQ, DV, scale, 0);
    be->attn_merge(be, acc, lse, o_i, l_i, NULL, 1, 1, Tq, H, DV);
    for (int64_t i = 0; i < no; i++)
        assert_true(acc[i] == 0.0f);
    for (int64_t i = 0; i < nl; i++)
        assert_true(lse[i] == -INFINITY);
    be->attn_merge(be, acc, lse, o_all, l_all, out, 0, 1, Tq, H, DV);
    assert_memory_equal(out, o_all, sizeof(float) * no);
    assert_memory_equal(lse, l_all, sizeof(float) * nl);
    // then an empty part again: nothing changes
    be->attn_merge(be, acc, lse, o_i, l_i, out, 0, 1, Tq, H, DV);
    assert_memory_equal(out, o_all, sizeof(float) * no);
    assert_memory_equal(lse, l_all, sizeof(float) * nl);
}

// Conv over x with a row stride wider than C (a slice of a projection output),
// with a preceding state, with and without SiLU.
static void conv_case(int silu) {
    op_ctx c = {.be = tu_cpu(), .kind = K_CONV, .B = 2, .T = 6, .C = 5, .W = 4, .ldx = 7, .style = silu};
    int64_t nx = (int64_t)c.B * c.T * c.ldx, ny = (int64_t)c.B * c.T * c.C, ns = (int64_t)c.B * c.C * c.W;
    c.x = buf(nx, 61), c.w = buf((int64_t)c.C * c.W, 62), c.bias = buf(c.C, 63), c.state = buf(ns, 64);
    c.R = buf(ny, 65), c.out = buf(ny, 0);
    float *dx = zeros(nx), *dw = zeros((int64_t)c.C * c.W);
    float *db = zeros(c.C), *ds = zeros(ns);
    c.be->conv1d_bwd(c.be, dx, c.ldx, dw, db, ds, c.R, c.x, c.ldx, c.w, c.bias, c.state, c.B, c.T, c.C, c.W, silu);
    assert_int_equal(tu_gradcheck("conv dx", run, &c, c.x, dx, nx, 1e-2f, 1e-2f, 60), 0);
    assert_int_equal(tu_gradcheck("conv dw", run, &c, c.w, dw, (int64_t)c.C * c.W, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("conv dbias", run, &c, c.bias, db, c.C, 1e-2f, 1e-2f, 40), 0);
    assert_int_equal(tu_gradcheck("conv dstate", run, &c, c.state, ds, ns, 1e-2f, 1e-2f, 40), 0);
    // Splitting the sequence at every point, carrying the state, gives the same output.
    run(&c, NULL);
    for (int cut = 1; cut < c.T; cut++) {
        float *st2 = zeros(ns), *y = zeros(ny);
        memcpy(st2, c.state, (size_t)ns * sizeof(float));
        // first part: rows [0, cut) of each sequence, processed one sequence at a time
        for (int b = 0; b < c.B; b++) {
            float *xb = c.x + (int64_t)b * c.T * c.ldx, *sb = st2 + (int64_t)b * c.C * c.W;
            float *yb = y + (int64_t)b * c.T * c.C;
            c.be->conv1d_fwd(c.be, yb, xb, c.ldx, c.w, c.bias, sb, 1, cut, c.C, c.W, silu);
            c.be->conv1d_update_state(c.be, sb, xb, c.ldx, 1, cut, c.C, c.W);
            c.be->conv1d_fwd(c.be, yb + (int64_t)cut * c.C, xb + (int64_t)cut * c.ldx, c.ldx, c.w, c.bias, sb, 1,
                             c.T - cut, c.C, c.W, silu);
        }
        assert_true(tu_max_abs_diff(y, c.out, ny) < 1e-6);
    }
}
static void test_conv1d_silu(void **st) { conv_case(1); }
static void test_conv1d_linear(void **st) { conv_case(0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_rmsnorm, release_buffers),
        cmocka_unit_test_teardown(test_add_rmsnorm, release_buffers),
        cmocka_unit_test_teardown(test_gated_rmsnorm_gdn, release_buffers),
        cmocka_unit_test_teardown(test_gated_rmsnorm_m2, release_buffers),
        cmocka_unit_test_teardown(test_l2norm, release_buffers),
        cmocka_unit_test_teardown(test_rope_neox, release_buffers),
        cmocka_unit_test_teardown(test_rope_interleaved, release_buffers),
        cmocka_unit_test_teardown(test_swiglu, release_buffers),
        cmocka_unit_test_teardown(test_attention, release_buffers),
        cmocka_unit_test_teardown(test_attention_after_cache, release_buffers),
        cmocka_unit_test_teardown(test_attention_tiles, release_buffers),
        cmocka_unit_test_teardown(test_attention_no_mask, release_buffers),
        cmocka_unit_test_teardown(test_attention_merge, release_buffers),
        cmocka_unit_test_teardown(test_conv1d_silu, release_buffers),
        cmocka_unit_test_teardown(test_conv1d_linear, release_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
