// Upcycling: SVD accuracy, MLA factors against the teacher projections (full
// rank: exact up to fp32 rounding; rank r: Frobenius error = norm of the
// dropped singular values), and the GDN / Mamba-2 weight transfers.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"
#include "upcycle/upcycle.h"

static arch_t tiny_teacher(void) {
    arch_t a;
    arch_init(&a);
    a.d = 48, a.n_layers = 3, a.H = 4, a.Hkv = 2, a.dh = 12, a.ffn = 64, a.V = 50, a.tie_embeddings = 1;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = LAYER_ATTN;
    return a;
}

// C[m, n] = A[m, k] B[k, n]
static void matmul(const float *A, const float *B, float *C, int m, int k, int n) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int t = 0; t < k; t++)
                s += (double)A[(int64_t)i * k + t] * B[(int64_t)t * n + j];
            C[(int64_t)i * n + j] = (float)s;
        }
}

static double frob_diff(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

static void test_svd_truncation(void **st) {
    int m = 40, n = 30, k = 30;
    float *A = malloc(sizeof(float) * m * n), *U = malloc(sizeof(float) * m * k), *S = malloc(sizeof(float) * k);
    float *Vt = malloc(sizeof(float) * k * n), *all = malloc(sizeof(float) * k), *US = malloc(sizeof(float) * m * k);
    float *R = malloc(sizeof(float) * m * n);
    tu_randn(A, m * n, 7, 1.0f);
    for (int r = 1; r <= k; r += 7) {
        assert_int_equal(upc_svd(A, m, n, r, U, S, Vt, all), 0);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < r; j++)
                US[i * r + j] = U[i * r + j] * S[j];
        matmul(US, Vt, R, m, r, n);
        double dropped = 0;
        for (int j = r; j < k; j++)
            dropped += (double)all[j] * all[j];
        double err = frob_diff(A, R, (int64_t)m * n);
        // Eckart-Young: the error of the best rank-r approximation is the norm of
        // the dropped singular values; the factors are fp32-rounded, so allow
        // 1e-5 relative to ||A|| (~sqrt(1200) here) beyond it.
        printf("  rank %2d: ||A - A_r||_F = %.6f, sqrt(sum dropped s^2) = %.6f\n", r, err, sqrt(dropped));
        assert_true(fabs(err - sqrt(dropped)) < 1e-5 * sqrt((double)m * n) + 1e-6);
    }
    assert_int_not_equal(upc_svd(A, m, n, 31, U, S, Vt, NULL), 0); // rank above min(m, n)
    free(A), free(U), free(S), free(Vt), free(all), free(US), free(R);
}

typedef struct {
    arch_t t, s;
    ptable_t tpt, spt;
    float *tw, *sw;
} pair_t;

static void make_pair(pair_t *p, const int *mla, int n_mla, layer_kind_t lin, const upc_dims_t *dims) {
    p->t = tiny_teacher();
    assert_int_equal(upc_student_arch(&p->t, mla, n_mla, lin, dims, &p->s), 0);
    assert_int_equal(ptable_build(&p->tpt, &p->t), 0);
    assert_int_equal(ptable_build(&p->spt, &p->s), 0);
    p->tw = tu_params(&p->tpt, 11, 0.5f);
    p->sw = calloc((size_t)p->spt.total, sizeof(float));
    assert_int_equal(upc_convert(&p->t, &p->tpt, p->tw, &p->s, &p->spt, p->sw, 5), 0);
}

static void free_pair(pair_t *p) {
    free(p->tw), free(p->sw);
    ptable_free(&p->tpt), ptable_free(&p->spt);
}

static float *tp(const ptable_t *pt, float *w, const char *name) {
    const param_t *q = ptable_find(pt, name);
    assert_non_null(q);
    return w + q->off;
}

// At full rank the MLA factors reproduce the teacher's projections: q_b q_a = W_q
// (n + p = dh, so the per-head row selection is the identity) and kv_b kv_a = the
// K (nope rows) and V blocks.
static void test_mla_full_rank(void **st) {
    int mla[] = {0, 1, 2};
    // q: rank min(H*dh, d) = 48; kv: W_kv is [2*G*dh = 48, 48], rank 48.
    upc_dims_t dims = {.r_q = 48, .r_kv = 48, .d_rope = 4, .d_nope = 8, .d_v = 12};
    pair_t p;
    make_pair(&p, mla, 3, LAYER_GDN, &dims);
    const arch_t *t = &p.t;
    int d = t->d, H = t->H, dh = t->dh, G = p.s.mla.n_kv, n = 8, v = 12, r = 48;
    float *Wq = tp(&p.tpt, p.tw, "model.layers.1.self_attn.q_proj.weight");
    float *qa = tp(&p.spt, p.sw, "model.layers.1.mla.q_a_proj.weight");
    float *qb = tp(&p.spt, p.sw, "model.layers.1.mla.q_b_proj.weight");
    float *R = malloc(sizeof(float) * H * dh * d);
    matmul(qb, qa, R, H * dh, r, d);
    double rel = tu_rel_err(R, Wq, (int64_t)H * dh * d);
    printf("  full-rank q_b q_a vs W_q: rel err %.2e\n", rel);
    assert_true(rel < 1e-5); // fp32 factors of a double-precision SVD: ~1e-7 expected
    float *Wk = tp(&p.tpt, p.tw, "model.layers.1.self_attn.k_proj.weight");
    float *Wv = tp(&p.tpt, p.tw, "model.layers.1.self_attn.v_proj.weight");
    float *kva = tp(&p.spt, p.sw, "model.layers.1.mla.kv_a_proj_with_mqa.weight");
    float *kvb = tp(&p.spt, p.sw, "model.layers.1.mla.kv_b_proj.weight");
    float *KV = malloc(sizeof(float) * G * (n + v) * d);
    matmul(kvb, kva, KV, G * (n + v), r, d); // kva's first r rows are the latent part
    double worst = 0;
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < n; j++)
            worst = fmax(worst, tu_rel_err(KV + ((int64_t)g * (n + v) + j) * d, Wk + ((int64_t)g * dh + j) * d, d));
        for (int j = 0; j < v; j++)
            worst = fmax(worst, tu_rel_err(KV + ((int64_t)g * (n + v) + n + j) * d, Wv + ((int64_t)g * dh + j) * d, d));
    }
    printf("  full-rank kv_b kv_a vs [K_nope; V] rows: worst row rel err %.2e\n", worst);
    assert_true(worst < 1e-4); // per row (rows are shorter, so noisier than the whole-matrix figure)
    // Shared rope key = head-mean of the last p rows of K.
    for (int j = 0; j < 4; j++)
        for (int c = 0; c < d; c++) {
            float mean = 0.5f * (Wk[(int64_t)(dh - 4 + j) * d + c] + Wk[(int64_t)(dh + dh - 4 + j) * d + c]);
            assert_float_equal(kva[(int64_t)(r + j) * d + c], mean, 1e-6);
        }
    // out_proj == o_proj (d_v == dh), MLP and norms verbatim
    assert_memory_equal(tp(&p.spt, p.sw, "model.layers.1.mla.out_proj.weight"),
                        tp(&p.tpt, p.tw, "model.layers.1.self_attn.o_proj.weight"), sizeof(float) * d * H * dh);
    assert_memory_equal(tp(&p.spt, p.sw, "model.layers.2.mlp.down_proj.weight"),
                        tp(&p.tpt, p.tw, "model.layers.2.mlp.down_proj.weight"), sizeof(float) * d * t->ffn);
    free(R), free(KV);
    free_pair(&p);
}

// At rank r < full, ||W_q - q_b q_a||_F equals the norm of the dropped singular values.
static void test_mla_truncated(void **st) {
    int mla[] = {0};
    upc_dims_t dims = {.r_q = 20, .r_kv = 16, .d_rope = 4, .d_nope = 8, .d_v = 12};
    pair_t p;
    make_pair(&p, mla, 1, LAYER_M2, &dims);
    int d = p.t.d, rows = p.t.H * p.t.dh;
    float *Wq = tp(&p.tpt, p.tw, "model.layers.0.self_attn.q_proj.weight");
    float *qa = tp(&p.spt, p.sw, "model.layers.0.mla.q_a_proj.weight");
    float *qb = tp(&p.spt, p.sw, "model.layers.0.mla.q_b_proj.weight");
    float *R = malloc(sizeof(float) * rows * d), *U = malloc(sizeof(float) * rows * 48),
          *S = malloc(sizeof(float) * 48);
    float *Vt = malloc(sizeof(float) * 48 * d), *all = malloc(sizeof(float) * 48);
    matmul(qb, qa, R, rows, 20, d);
    assert_int_equal(upc_svd(Wq, rows, d, 48, U, S, Vt, all), 0);
    double dropped = 0;
    for (int j = 20; j < 48; j++)
        dropped += (double)all[j] * all[j];
    double err = frob_diff(Wq, R, (int64_t)rows * d);
    printf("  rank-20 query: ||W_q - q_b q_a||_F = %.6f, dropped singular values %.6f\n", err, sqrt(dropped));
    assert_true(fabs(err - sqrt(dropped)) < 1e-4 * sqrt(dropped) + 1e-5);
    free(R), free(U), free(S), free(Vt), free(all);
    free_pair(&p);
}

// GDN: q/k/v/o overlaps copied from the (GQA-expanded) teacher, the rest random;
// Mamba-2: x <- W_V, B <- W_K, C <- W_Q, out_proj <- W_O.
static void test_linear_transfers(void **st) {
    upc_dims_t dims = {.gdn_heads = 2, .gdn_head_dim = 16}; // key_dim 32 < H*dh 48 < value_dim 64
    pair_t p;
    make_pair(&p, NULL, 0, LAYER_GDN, &dims);
    int d = p.t.d, dh = p.t.dh;
    float *Wk = tp(&p.tpt, p.tw, "model.layers.2.self_attn.k_proj.weight");
    float *Wv = tp(&p.tpt, p.tw, "model.layers.2.self_attn.v_proj.weight");
    float *Wo = tp(&p.tpt, p.tw, "model.layers.2.self_attn.o_proj.weight");
    float *k = tp(&p.spt, p.sw, "model.layers.2.gdn.k_proj.weight");
    float *v = tp(&p.spt, p.sw, "model.layers.2.gdn.v_proj.weight");
    float *o = tp(&p.spt, p.sw, "model.layers.2.gdn.o_proj.weight");
    // expanded head 1 (of 4) is teacher KV head 0 (rep = 2); expanded head 2 is KV head 1
    assert_memory_equal(k + (int64_t)1 * dh * d, Wk, sizeof(float) * dh * d);
    assert_memory_equal(k + (int64_t)2 * dh * d, Wk + (int64_t)dh * d, sizeof(float) * 8 * d); // rows 24..31
    assert_memory_equal(v + (int64_t)3 * dh * d, Wv + (int64_t)dh * d, sizeof(float) * dh * d);
    for (int r = 0; r < d; r++)
        assert_memory_equal(o + (int64_t)r * 64, Wo + (int64_t)r * 48, sizeof(float) * 48);
    // rows of v beyond the teacher's 48 are random, not zero
    double s = 0;
    for (int i = 48 * d; i < 64 * d; i++)
        s += fabs(v[i]);
    assert_true(s > 0);
    free_pair(&p);

    make_pair(&p, NULL, 0, LAYER_M2, &dims);
    const m2_dims_t *m = &p.s.m2;
    float *in = tp(&p.spt, p.sw, "model.layers.0.mamba.in_proj.weight");
    assert_memory_equal(in + (int64_t)m->d_inner * d, tp(&p.tpt, p.tw, "model.layers.0.self_attn.v_proj.weight"),
                        sizeof(float) * m->d_xb * d);
    assert_memory_equal(in + (int64_t)(m->d_inner + m->d_xb) * d,
                        tp(&p.tpt, p.tw, "model.layers.0.self_attn.k_proj.weight"), sizeof(float) * m->d_xb * d);
    assert_memory_equal(in + (int64_t)(m->d_inner + 2 * m->d_xb) * d,
                        tp(&p.tpt, p.tw, "model.layers.0.self_attn.q_proj.weight"), sizeof(float) * m->d_inner * d);
    float *A_log = tp(&p.spt, p.sw, "model.layers.0.mamba.A_log"), *D = tp(&p.spt, p.sw, "model.layers.0.mamba.D");
    for (int h = 0; h < m->n_heads; h++) {
        assert_true(A_log[h] >= 0.0f && A_log[h] <= logf(16.0f)); // A in [1, 16]
        assert_float_equal(D[h], 1.0f, 0);
    }
    free_pair(&p);
}

// The recipe's defaults reproduce the published HyLo dims (hylo_recipe.md §1).
static void test_recipe_defaults(void **st) {
    arch_t t, s;
    arch_init(&t);
    t.d = 3072, t.n_layers = 28, t.H = 24, t.Hkv = 8, t.dh = 128, t.ffn = 8192, t.V = 128256;
    upc_dims_t none = {0};
    assert_int_equal(upc_student_arch(&t, (int[]){0, 5}, 2, LAYER_GDN, &none, &s), 0);
    assert_int_equal(s.mla.r_q, 1536), assert_int_equal(s.mla.r_kv, 128);
    assert_int_equal(s.mla.d_rope, 64), assert_int_equal(s.mla.d_nope, 64), assert_int_equal(s.mla.d_v, 128);
    assert_int_equal(s.gdn.n_heads, 9), assert_int_equal(s.gdn.head_k, 256), assert_int_equal(s.gdn.head_v, 512);
    t.d = 2048, t.n_layers = 16, t.H = 32, t.Hkv = 8, t.dh = 64;
    assert_int_equal(upc_student_arch(&t, (int[]){1}, 1, LAYER_GDN, &none, &s), 0);
    assert_int_equal(s.mla.r_q, 1344), assert_int_equal(s.mla.r_kv, 128);
    assert_int_equal(s.mla.d_rope, 32), assert_int_equal(s.mla.d_v, 64), assert_int_equal(s.gdn.n_heads, 6);
    assert_int_not_equal(upc_student_arch(&t, (int[]){16}, 1, LAYER_GDN, &none, &s), 0);   // out of range
    assert_int_not_equal(upc_student_arch(&t, (int[]){3, 3}, 2, LAYER_GDN, &none, &s), 0); // duplicate
}

// A teacher whose layer 1 has no attention weights (its table holds a GDN
// layer there): converting that layer to MLA, GDN or Mamba-2 fails naming the
// tensor. Only the MLA conversion checked; GDN and Mamba-2 read through NULL.
// Sizes near the limits: the student's dimensions are formed without int
// overflow (UBSan in MODE=asan) and any past a limit is an error naming it.
// A teacher of 2^16 heads of 2^16 used to overflow `2 * Hkv * dh` here.
static void test_size_limits(void **st) {
    arch_t t = tiny_teacher(), s;
    int mla[1] = {0};
    upc_dims_t dims = {0};
    t.H = t.Hkv = 1 << 16, t.dh = 1 << 16;
    err_clear();
    assert_int_equal(upc_student_arch(&t, mla, 1, LAYER_GDN, &dims, &s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "teacher: num_attention_heads x head_dim = 65536 x 65536 exceeds the limit"));
    // At the limits: 2^8 heads of 2^16 (H dh = 2^24), width 2^20: the recipe's
    // r_q = H dh / 2 = 2^23 is past the rank limit, and named.
    t = tiny_teacher();
    t.d = 1 << 20, t.H = t.Hkv = 1 << 8, t.dh = 1 << 16;
    dims.d_rope = dims.d_nope = dims.d_v = 64;
    err_clear();
    assert_int_equal(upc_student_arch(&t, mla, 1, LAYER_GDN, &dims, &s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "student: layer 0: q_lora_rank = 8388608 is out of range [0, 1048576]"));
    // ... and with the ranks given, the student validates (GDN: 0.75 d / 256 heads).
    dims.r_q = dims.r_kv = 1 << 20;
    if (upc_student_arch(&t, mla, 1, LAYER_GDN, &dims, &s) < 0) fail_msg("%s", err_msg());
    assert_int_equal(s.mla.r_q, 1 << 20);
    assert_int_equal(s.gdn.n_heads, 3072);
    // Mamba-2 from this teacher: d_inner = H dh = 2^24 is past the dimension limit.
    assert_int_equal(upc_student_arch(&t, mla, 1, LAYER_M2, &dims, &s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "d_inner = 16777216 is out of range [1, 1048576]"));
    // Block dimensions near INT_MAX (a recipe's, before it had limits) are named.
    t = tiny_teacher();
    dims = (upc_dims_t){.r_kv = 2147483647};
    assert_int_equal(upc_student_arch(&t, mla, 1, LAYER_GDN, &dims, &s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "kv_lora_rank = 2147483647"));
    dims = (upc_dims_t){.gdn_heads = 1 << 20};
    assert_int_equal(upc_student_arch(&t, mla, 1, LAYER_GDN, &dims, &s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "GDN num_heads x head_dim = 1048576 x 256 exceeds the limit"));
}

static void test_missing_teacher_tensor(void **st) {
    static const layer_kind_t kinds[3] = {LAYER_MLA, LAYER_GDN, LAYER_M2};
    upc_dims_t dims = {.r_q = 20, .r_kv = 16, .d_rope = 4, .d_nope = 8, .d_v = 12};
    for (int i = 0; i < 3; i++) {
        arch_t t = tiny_teacher(), s;
        int is_mla = kinds[i] == LAYER_MLA;
        assert_int_equal(upc_student_arch(&t, (int[]){1}, is_mla, is_mla ? LAYER_GDN : kinds[i], &dims, &s), 0);
        arch_t broken = t;
        broken.kind[1] = LAYER_GDN, broken.gdn = s.gdn;
        ptable_t tpt, spt;
        assert_int_equal(ptable_build(&tpt, &broken), 0);
        assert_int_equal(ptable_build(&spt, &s), 0);
        float *tw = tu_params(&tpt, 3, 0.5f), *sw = calloc((size_t)spt.total, sizeof(float));
        assert_int_equal(upc_convert(&t, &tpt, tw, &s, &spt, sw, 5), ERR_INPUT);
        printf("  %s: %s\n", layer_kind_name(kinds[i]), err_msg());
        assert_non_null(strstr(err_msg(), "model.layers.1.self_attn.q_proj.weight"));
        free(tw), free(sw);
        ptable_free(&tpt), ptable_free(&spt);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svd_truncation),  cmocka_unit_test(test_mla_full_rank),
        cmocka_unit_test(test_mla_truncated),   cmocka_unit_test(test_linear_transfers),
        cmocka_unit_test(test_recipe_defaults), cmocka_unit_test(test_missing_teacher_tensor),
        cmocka_unit_test(test_size_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
