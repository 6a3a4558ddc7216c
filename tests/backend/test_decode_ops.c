// The decode ops over per-sequence caches (attn_decode, kv_append) on the CPU
// against the per-row calls a decode step made before them: a cache copy per
// row and attn_fwd with Tq = 1 over that sequence's cache.
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
    be->attn_decode(be, out, q, kb, vb, len, 70, N, H, Hkv, dh, dh, scale);
    for (int r = 0; r < N; r++) {
        const float *o = out + (int64_t)r * H * dh;
        if (len[r] == 0) {
            for (int i = 0; i < H * dh; i++)
                assert_true(o[i] == 0.0f);
            continue;
        }
        be->attn_fwd(be, ref, NULL, q + (int64_t)r * H * dh, kc[r], vc[r], 1, 1, len[r], H, Hkv, dh, dh, scale);
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
    be->kv_append(be, kb, vb, KW, 0, pos, k, KW, v, KW, N);
    for (int r = 0; r < N; r++) {
        memcpy(kc0[r] + pos[r] * KW, k + r * KW, sizeof(float) * KW);
        memcpy(vc0[r] + pos[r] * KW, v + r * KW, sizeof(float) * KW);
        assert_memory_equal(kc[r], kc0[r], sizeof(float) * CAP * KW);
        assert_memory_equal(vc[r], vc0[r], sizeof(float) * CAP * KW);
    }
    // MLA form: one cache of rows KW = 7 + VW, [k (7) | v (VW)]
    be->kv_append(be, kb, kb, KW, 7, pos, k, 7, v, VW, N);
    for (int r = 0; r < N; r++) {
        memcpy(kc0[r] + pos[r] * KW, k + r * 7, sizeof(float) * 7);
        memcpy(kc0[r] + pos[r] * KW + 7, v + r * VW, sizeof(float) * VW);
        assert_memory_equal(kc[r], kc0[r], sizeof(float) * CAP * KW);
    }
    for (int r = 0; r < N; r++)
        free(kc[r]), free(vc[r]), free(kc0[r]), free(vc0[r]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_decode_gqa),
        cmocka_unit_test(test_attn_decode_mha),
        cmocka_unit_test(test_kv_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
