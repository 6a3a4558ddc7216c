// The MLA decode op (attention over the latent cache) against a naive
// double-precision computation.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// Two sequences with different visible lengths; the cache has more rows than
// either (CAP is the per-sequence capacity, so the row stride between sequences
// differs from len). Rows at or beyond len[b] hold NaN: if the op read any of
// them the output would be NaN and the comparison fails. The op takes a
// pointer per row: sequence 1 is read from a copy in a separate allocation
// (another state's cache) whose sequence-0 slot is NaN, and the op is called
// with the rows in reverse order as well.
static void test_mla_decode_attn(void **st) {
    be_t *be = tu_cpu();
    enum { B = 2, H = 4, R = 16, DR = 8, CAP = 19 };
    const int L = R + DR;
    int32_t len[B] = {7, 13};
    float scale = 0.3f;
    float *cache = malloc(sizeof(float) * B * CAP * L), *ql = malloc(sizeof(float) * B * H * R);
    float *qp = malloc(sizeof(float) * B * H * DR), *out = malloc(sizeof(float) * B * H * R);
    tu_randn(cache, (int64_t)B * CAP * L, 101, 1.0f);
    tu_randn(ql, B * H * R, 102, 1.0f);
    tu_randn(qp, B * H * DR, 103, 1.0f);
    for (int b = 0; b < B; b++)
        for (int u = len[b]; u < CAP; u++)
            for (int i = 0; i < L; i++)
                cache[((int64_t)b * CAP + u) * L + i] = NAN;
    float *other = malloc(sizeof(float) * B * CAP * L); // sequence 1 again, elsewhere
    for (int64_t i = 0; i < (int64_t)B * CAP * L; i++)
        other[i] = i < (int64_t)CAP * L ? NAN : cache[i];
    void *rows[B] = {cache, other + (int64_t)CAP * L};
    be->mla_decode_attn(be, out, ql, qp, H * DR, DR, rows, (be_pages_t){0}, len, 13, NULL, 0, B, H, R, DR, scale);
    // reversed: row 0 is sequence 1, row 1 sequence 0 (queries and lengths swapped too)
    float *ql2 = malloc(sizeof(float) * B * H * R), *qp2 = malloc(sizeof(float) * B * H * DR);
    float *out2 = malloc(sizeof(float) * B * H * R);
    memcpy(ql2, ql + H * R, sizeof(float) * H * R), memcpy(ql2 + H * R, ql, sizeof(float) * H * R);
    memcpy(qp2, qp + H * DR, sizeof(float) * H * DR), memcpy(qp2 + H * DR, qp, sizeof(float) * H * DR);
    void *rows2[B] = {rows[1], rows[0]};
    int32_t len2[B] = {len[1], len[0]};
    be->mla_decode_attn(be, out2, ql2, qp2, H * DR, DR, rows2, (be_pages_t){0}, len2, 13, NULL, 0, B, H, R, DR, scale);
    // the same arithmetic per (row, head) whatever the order: bitwise
    assert_memory_equal(out2, out + H * R, sizeof(float) * H * R);
    assert_memory_equal(out2 + H * R, out, sizeof(float) * H * R);
    free(other), free(ql2), free(qp2), free(out2);

    double max_err = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q1 = ql + (b * H + h) * R, *q2 = qp + (b * H + h) * DR;
            double s[CAP], m = -1e300, sum = 0;
            for (int u = 0; u < len[b]; u++) {
                const float *row = cache + ((int64_t)b * CAP + u) * L;
                double dot = 0;
                for (int i = 0; i < R; i++)
                    dot += (double)q1[i] * row[i];
                for (int i = 0; i < DR; i++)
                    dot += (double)q2[i] * row[R + i];
                s[u] = dot * scale;
                if (s[u] > m) m = s[u];
            }
            for (int u = 0; u < len[b]; u++)
                sum += exp(s[u] - m);
            for (int i = 0; i < R; i++) {
                double o = 0;
                for (int u = 0; u < len[b]; u++)
                    o += exp(s[u] - m) / sum * cache[((int64_t)b * CAP + u) * L + i];
                double e = fabs(o - out[(b * H + h) * R + i]);
                if (!(e <= max_err)) max_err = isnan(e) ? INFINITY : e;
            }
        }
    print_message("mla_decode_attn: max |op - naive| = %.3e\n", max_err);
    // fp32 against double: scores are sums of 24 products of O(1) values
    // (rounding ~ 24 * 2^-24 * 5 ~ 1e-5 absolute at most, scaled by 0.3 before
    // the softmax), outputs are convex combinations of O(1) values. 1e-5 absolute
    // is a few times that bound; a wrong row, head or length gives O(0.1) or NaN.
    assert_true(max_err < 1e-5);
    free(cache), free(ql), free(qp), free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mla_decode_attn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
