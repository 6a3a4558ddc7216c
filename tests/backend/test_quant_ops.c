// The CPU products on quantised weights (backend/cpu/cpu_quant.c) against
// dequantise-then-fp32, for every format and every kernel set this CPU runs.
//
// Tolerances. A kernel computes, per 32-value block, an exact integer sum of
// weight codes times activation bytes; the only approximation is rounding the
// activations to 8 bits, |x_i - dx q_i| <= dx / 2 with dx = max|x| / 127 per
// block. So against the exact dot of the dequantised weights
//   |kernel - exact| <= B = sum over blocks of (dx / 2) sum_i |w_i|
// plus fp32 rounding of the accumulation, bounded by 1e-5 sum_i |w_i x_i|
// (rows of a few thousand terms, each term rounded a few times at 6e-8).
// Two kernel sets see the same activation bytes and integer sums and differ
// only in the order of fp32 additions: 1e-5 sum |w_i x_i| between them.
// Where the activations are exact in 8 bits (hand-made blocks: integers with
// a block maximum of 127) B is 0 and only the rounding term remains.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_quant.h"
#include "base/half.h"
#include "base/rng.h"
#include "io/gguf.h"
#include "io/weights.h"
#include "testutil.h"

static const uint32_t types[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K};

// Every kernel set this CPU runs (the reference always does).
static int sets(const cpu_qkernels_t **out) {
    int n = 0;
    out[n++] = &cpu_qk_ref;
    if (cpu_qk_runnable(&cpu_qk_avx2)) out[n++] = &cpu_qk_avx2;
    return n;
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}

// Random blocks of a type: random code bytes, scales set to sane values
// (random bytes would make some f16 scales NaN or huge).
static uint8_t *rand_rows(uint32_t type, int64_t rows, int64_t cols, rng_t *r, size_t *row_bytes) {
    int blk, bytes;
    assert_true(ggml_type_block(type, &blk, &bytes));
    *row_bytes = (size_t)(cols / blk) * bytes;
    int64_t nblk = rows * (cols / blk);
    uint8_t *w = malloc((size_t)nblk * bytes);
    for (int64_t i = 0; i < nblk * bytes; i++)
        w[i] = (uint8_t)rng_u64(r);
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t *p = w + b * bytes;
        switch (type) {
        case GGML_Q4_0:
        case GGML_Q8_0: put_f16(p, rng_range(r, 0.001f, 0.05f)); break;
        case GGML_Q4_1:
            put_f16(p, rng_range(r, 0.001f, 0.05f));
            put_f16(p + 2, rng_range(r, -0.4f, 0.1f));
            break;
        case GGML_Q4_K:
            put_f16(p, rng_range(r, 0.0001f, 0.002f));
            put_f16(p + 2, rng_range(r, 0.0001f, 0.002f));
            break;
        case GGML_Q6_K: put_f16(p + 208, rng_range(r, 0.0001f, 0.002f)); break;
        }
    }
    return w;
}

// Activation quantisation as the kernels do it: the error bound B of one row.
static double act_bound(const float *w, const float *x, int64_t cols) {
    double b = 0;
    for (int64_t k = 0; k < cols; k += 32) {
        float amax = 0;
        double wsum = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[k + i])), wsum += fabs(w[k + i]);
        b += (amax / 127.0f) / 2 * wsum;
    }
    return b;
}

static double dot_abs(const float *w, const float *x, int64_t n, double *abs_sum) {
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)w[i] * x[i], a += fabs((double)w[i] * x[i]);
    *abs_sum = a;
    return s;
}

// y[N, rows] from every kernel set against the dequantised product; also the
// sets against each other. act_exact: x exact in 8 bits (the bound B is 0).
static void check_product(const be_qmat_t *W, const float *x, int64_t N, int act_exact, const char *what) {
    int64_t rows = W->rows, cols = W->cols;
    float *wf = malloc((size_t)rows * cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        ggml_dequant(W->type, (const uint8_t *)W->data + r * W->row_bytes, wf + r * cols, cols);
    const cpu_qkernels_t *ks[4];
    int nk = sets(ks);
    float *y[4];
    cpu_q8_t *q = malloc((size_t)N * (cols / 32) * sizeof(cpu_q8_t));
    for (int s = 0; s < nk; s++) {
        y[s] = malloc((size_t)N * rows * sizeof(float));
        cpu_qmatmul_with(ks[s], y[s], x, W, N, q);
    }
    double worst = 0; // largest |error| / allowed seen, printed for the record
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < rows; r++) {
            double abs_sum, exact = dot_abs(wf + r * cols, x + n * cols, cols, &abs_sum);
            double B = W->type == GGML_BF16 || act_exact ? 0 : act_bound(wf + r * cols, x + n * cols, cols);
            double tol = B + 1e-5 * abs_sum + 1e-30;
            for (int s = 0; s < nk; s++) {
                double e = fabs(y[s][n * rows + r] - exact);
                if (e / tol > worst) worst = e / tol;
                if (!(e <= tol))
                    fail_msg("%s %s (%s): row %lld token %lld: %.9g vs exact %.9g (bound %.3g)", what,
                             ggml_type_name(W->type), ks[s]->name, (long long)r, (long long)n, y[s][n * rows + r],
                             exact, tol);
                double e0 = fabs(y[s][n * rows + r] - y[0][n * rows + r]);
                if (!(e0 <= 1e-5 * abs_sum + 1e-30))
                    fail_msg("%s %s: set %s differs from the reference by %.3g (sum |w x| %.3g)", what,
                             ggml_type_name(W->type), ks[s]->name, e0, abs_sum);
            }
        }
    print_message("  %-10s %-5s %lld x %lld, N %lld: worst error %.3f of its bound\n", what, ggml_type_name(W->type),
                  (long long)rows, (long long)cols, (long long)N, worst);
    for (int s = 0; s < nk; s++)
        free(y[s]);
    free(q);
    free(wf);
}

// Random blocks, shapes that exercise every tail: rows not a multiple of the
// 16-row tile, token counts 1..7 (groups of 4 plus remainders), blocks per
// row odd and even (the kernels' paired accumulators).
static void test_random_blocks(void **st) {
    rng_t r;
    rng_seed(&r, 7);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int blk, bytes;
        ggml_type_block(types[t], &blk, &bytes);
        int64_t colss[2] = {blk == 256 ? 256 : 96, blk == 256 ? 768 : 576};
        for (int c = 0; c < 2; c++)
            for (int64_t N = 1; N <= 7; N += 3) {
                int64_t rows = 37, cols = colss[c];
                size_t rb;
                uint8_t *w = rand_rows(types[t], rows, cols, &r, &rb);
                float *x = malloc((size_t)N * cols * sizeof(float));
                rng_fill_normal(&r, x, (long)(N * cols), 0.0f, 1.0f);
                be_qmat_t W = {types[t], rows, cols, rb, w};
                check_product(&W, x, N, 0, "random");
                free(x);
                free(w);
            }
    }
}

// Hand-made blocks with known values: the activations are integers with 127
// in every block (exact in 8 bits), so the kernels must give the dequantised
// dot up to fp32 rounding. Codes run through their whole range.
static void test_hand_blocks(void **st) {
    int64_t cols = 256, rows = 3;
    float x[2 * 256];
    for (int i = 0; i < 2 * 256; i++)
        x[i] = (i % 32 == 5) ? 127.0f : (float)((i * 37) % 255 - 127);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int blk, bytes;
        ggml_type_block(types[t], &blk, &bytes);
        size_t rb = (size_t)(cols / blk) * bytes;
        uint8_t *w = calloc(rows, rb);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < cols / blk; b++) {
                uint8_t *p = w + r * rb + b * bytes;
                int k = (int)(r * 7 + b);
                switch (types[t]) {
                case GGML_Q4_0: // codes 0..15: values (c - 8) * 0.5
                    put_f16(p, 0.5f);
                    for (int j = 0; j < 16; j++)
                        p[2 + j] = (uint8_t)(((j + k) & 15) | (((15 - j) & 15) << 4));
                    break;
                case GGML_Q4_1: // c * 0.25 - 1
                    put_f16(p, 0.25f), put_f16(p + 2, -1.0f);
                    for (int j = 0; j < 16; j++)
                        p[4 + j] = (uint8_t)(((j * 3 + k) & 15) | ((j & 15) << 4));
                    break;
                case GGML_Q8_0: // the full int8 range, -128 included
                    put_f16(p, 0.125f);
                    for (int j = 0; j < 32; j++)
                        p[2 + j] = (uint8_t)(int8_t)(j * 8 - 128 + k);
                    break;
                case GGML_Q4_K: // 6-bit scales and mins of every sub-block distinct
                    put_f16(p, 0.5f), put_f16(p + 2, 0.25f);
                    for (int j = 0; j < 12; j++)
                        p[4 + j] = (uint8_t)(j * 21 + 5 + k);
                    for (int j = 0; j < 128; j++)
                        p[16 + j] = (uint8_t)(j * 13 + k);
                    break;
                case GGML_Q6_K: // codes 0..63, signed scales
                    for (int j = 0; j < 192; j++)
                        p[j] = (uint8_t)(j * 29 + k);
                    for (int j = 0; j < 16; j++)
                        p[192 + j] = (uint8_t)(int8_t)(j * 17 - 128 + k);
                    put_f16(p + 208, 0.125f);
                    break;
                }
            }
        be_qmat_t W = {types[t], rows, cols, rb, w};
        check_product(&W, x, 2, 1, "hand-made");
        free(w);
    }
}

// bf16 weights take fp32 activations: only the order of additions differs.
static void test_bf16(void **st) {
    rng_t r;
    rng_seed(&r, 11);
    int64_t rows = 21, cols = 203; // a row length that is not a multiple of 8 (the vector tail)
    uint16_t *w = malloc((size_t)rows * cols * 2);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = f32_to_bf16(rng_normal(&r) * 0.05f);
    for (int64_t N = 1; N <= 6; N += 5) {
        float *x = malloc((size_t)N * cols * sizeof(float));
        rng_fill_normal(&r, x, (long)(N * cols), 0.0f, 1.0f);
        be_qmat_t W = {GGML_BF16, rows, cols, (size_t)cols * 2, w};
        check_product(&W, x, N, 0, "bf16");
        free(x);
    }
    free(w);
}

// A row's product does not depend on the rows beside it: for every format and
// kernel set, N rows at once give bitwise what each row gives alone (N = 1).
// A server's batched decode step relies on it (a request's answer must not
// change with the requests it runs with); the AVX2 Q4 / Q8 kernels once took
// a second accumulator for one row only, and then differed in the last bits.
static void test_rows_independent(void **st) {
    rng_t r;
    rng_seed(&r, 13);
    const cpu_qkernels_t *ks[4];
    int nk = sets(ks);
    uint32_t all[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16};
    enum { N = 15 }; // the most rows the 8-bit kernels see (cpu_quant.c QMM_SGEMM_MIN - 1)
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
        int64_t rows = 37, cols = all[t] == GGML_Q4_K || all[t] == GGML_Q6_K ? 768 : 576; // odd / even block counts
        size_t rb;
        uint8_t *w = NULL;
        if (all[t] == GGML_BF16) {
            w = malloc((size_t)rows * cols * 2), rb = (size_t)cols * 2;
            for (int64_t i = 0; i < rows * cols; i++)
                ((uint16_t *)w)[i] = f32_to_bf16(rng_normal(&r) * 0.05f);
        } else {
            w = rand_rows(all[t], rows, cols, &r, &rb);
        }
        be_qmat_t W = {all[t], rows, cols, rb, w};
        float *x = malloc((size_t)N * cols * sizeof(float)), *yN = malloc((size_t)N * rows * sizeof(float));
        float y1[37];
        cpu_q8_t *q = malloc((size_t)N * (cols / 32) * sizeof(cpu_q8_t));
        rng_fill_normal(&r, x, (long)(N * cols), 0.0f, 1.0f);
        for (int s = 0; s < nk; s++)
            for (int n = 1; n <= N; n++) { // n rows at once, against each alone
                cpu_qmatmul_with(ks[s], yN, x, &W, n, q);
                for (int j = 0; j < n; j++) {
                    cpu_qmatmul_with(ks[s], y1, x + (int64_t)j * cols, &W, 1, q);
                    if (memcmp(y1, yN + (int64_t)j * rows, sizeof y1))
                        fail_msg("%s (%s): row %d of %d differs from the row alone", ggml_type_name(all[t]),
                                 ks[s]->name, j, n);
                }
            }
        free(q), free(x), free(yN), free(w);
    }
}

// The products give the same bits whatever the thread count the backend
// was made with (`--threads` sets it first; cpu.h cpu_sgemm): be->gemm at 22
// rows (a prefill that continued differently with 1 and 2 threads while
// OpenBLAS split products by its thread count), at one row (sgemv), with A
// transposed, and qmatmul's path of 16 rows or more (dequantised panels).
static void test_threads_invariant(void **st) {
    rng_t r;
    rng_seed(&r, 29);
    const int saved = omp_get_max_threads();
    enum { M = 22, N = 1536, K = 576 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K);
    rng_fill_normal(&r, a, M * K, 0.0f, 1.0f);
    rng_fill_normal(&r, b, N * K, 0.0f, 0.05f);
    size_t rb;
    uint8_t *w = rand_rows(GGML_Q4_0, N, K, &r, &rb);
    const be_qmat_t W = {GGML_Q4_0, N, K, rb, w};
    enum { OUTS = 4 };
    float *ref[OUTS] = {0}, *got = malloc(sizeof(float) * M * N);
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        be_t *be;
        assert_int_equal(be_create(&be, "cpu", 64u << 20), 0);
        for (int o = 0; o < OUTS; o++) {
            memset(got, 0, sizeof(float) * M * N);
            if (o == 0) be->gemm(be, 0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, got, N);
            if (o == 1) be->gemm(be, 0, 1, 1, N, K, 1.0f, a, K, b, K, 0.0f, got, N);
            if (o == 2) be->gemm(be, 1, 0, M, N, 4, 1.0f, a, M, b, N, 0.0f, got, N); // A^T: 4 x 22 read as K x M
            if (o == 3) be->qmatmul(be, got, a, &W, M);
            if (!ref[o]) {
                ref[o] = malloc(sizeof(float) * M * N);
                memcpy(ref[o], got, sizeof(float) * M * N);
            } else if (memcmp(ref[o], got, sizeof(float) * M * N)) {
                fail_msg("product %d: %d threads give other bits than 1", o, threads);
            }
        }
        be_destroy(be);
    }
    omp_set_num_threads(saved);
    for (int o = 0; o < OUTS; o++)
        free(ref[o]);
    free(a), free(b), free(w), free(got);
}

// The backend's op on tensors of the default GGUF (its Q4_1 projections and
// Q8_0 embedding), 5 tokens, against the bound.
static void test_real_tensors(void **st) {
    gguf_t g;
    assert_int_equal(gguf_open(&g, tu_model_path()), 0);
    const char *names[] = {"blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.29.ffn_gate.weight",
                           "token_embd.weight"};
    rng_t r;
    rng_seed(&r, 3);
    be_t *be = tu_cpu();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const gguf_tensor_t *t = gguf_find_tensor(&g, names[i]);
        assert_non_null(t);
        int blk, bytes;
        assert_true(ggml_type_block(t->type, &blk, &bytes));
        int64_t cols = t->ne[0], rows = t->ne[1] < 512 ? t->ne[1] : 512; // the first 512 rows of the vocabulary
        be_qmat_t W = {t->type, rows, cols, (size_t)(cols / blk) * bytes, g.mf.data + t->offset};
        int64_t N = 5;
        float *x = malloc((size_t)N * cols * sizeof(float));
        rng_fill_normal(&r, x, (long)(N * cols), 0.0f, 1.0f);
        check_product(&W, x, N, 0, names[i]);
        // the op through the backend table: the set it chose, the same bound
        float *y = malloc((size_t)N * rows * sizeof(float)), *wf = malloc((size_t)cols * sizeof(float));
        be->qmatmul(be, y, x, &W, N);
        for (int64_t rr = 0; rr < rows; rr += 17) {
            ggml_dequant(W.type, (const uint8_t *)W.data + rr * W.row_bytes, wf, cols);
            double a, exact = dot_abs(wf, x + 2 * cols, cols, &a);
            assert_true(fabs(y[2 * rows + rr] - exact) <= act_bound(wf, x + 2 * cols, cols) + 1e-5 * a);
        }
        free(wf);
        free(y);
        free(x);
    }
    gguf_close(&g);
}

// The backend's op from 16 activation rows on (prefill) dequantises the matrix
// and runs sgemm: the exact products up to fp32 rounding, 1e-5 sum |w x|
// (no activation-rounding term), for every format.
static void test_op_many_rows(void **st) {
    rng_t r;
    rng_seed(&r, 5);
    be_t *be = tu_cpu();
    uint32_t all[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
        int64_t rows = 45, cols = 512, N = 33;
        size_t rb;
        uint8_t *w;
        if (all[t] == GGML_BF16) {
            rb = (size_t)cols * 2;
            w = malloc((size_t)rows * rb);
            for (int64_t i = 0; i < rows * cols; i++)
                ((uint16_t *)w)[i] = f32_to_bf16(rng_normal(&r) * 0.05f);
        } else {
            w = rand_rows(all[t], rows, cols, &r, &rb);
        }
        be_qmat_t W = {all[t], rows, cols, rb, w};
        float *x = malloc((size_t)N * cols * sizeof(float)), *y = malloc((size_t)N * rows * sizeof(float));
        float *wf = malloc((size_t)cols * sizeof(float));
        rng_fill_normal(&r, x, (long)(N * cols), 0.0f, 1.0f);
        be->qmatmul(be, y, x, &W, N);
        double worst = 0;
        for (int64_t rr = 0; rr < rows; rr++) {
            ggml_dequant(W.type, w + rr * rb, wf, cols);
            for (int64_t n = 0; n < N; n++) {
                double a, exact = dot_abs(wf, x + n * cols, cols, &a);
                double e = fabs(y[n * rows + rr] - exact) / (1e-5 * a);
                if (e > worst) worst = e;
                assert_true(e <= 1.0);
            }
        }
        print_message("  op, N %lld, %-5s: worst error %.3f of 1e-5 sum |w x|\n", (long long)N, ggml_type_name(all[t]),
                      worst);
        free(wf), free(y), free(x), free(w);
    }
}

// ggml_quantize (checkpoints written quantised) then ggml_dequant: every
// value within the format's step of the stored scale d: d / 2 for Q8_0 and
// Q4_1 (codes against the f16-rounded scale; plus the f16 rounding of Q4_1's
// minimum and of an 8-bit code clamped at 127, 1e-3 of the block's range),
// |d| for Q4_0 (its codes reach -8 d on the side of the largest magnitude but
// only 7 d on the other).
static void test_quantize_roundtrip(void **st) {
    rng_t r;
    rng_seed(&r, 9);
    uint32_t ts[] = {GGML_Q8_0, GGML_Q4_0, GGML_Q4_1};
    int64_t n = 32 * 64;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    rng_fill_normal(&r, x, (long)n, 0.0f, 0.3f);
    x[5] = 0, x[40] = 7.0f; // a block with an outlier
    for (int i = 64; i < 96; i++)
        x[i] = 0; // an all-zero block
    uint8_t *b = malloc((size_t)n * 2);
    for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++) {
        int blk, bytes;
        ggml_type_block(ts[t], &blk, &bytes);
        assert_true(ggml_quantize(ts[t], x, b, n));
        ggml_dequant(ts[t], b, y, n);
        for (int64_t k = 0; k < n / 32; k++) {
            const uint8_t *p = b + k * bytes;
            uint16_t h;
            memcpy(&h, p, 2);
            float d = fabsf(f16_to_f32(h)), lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < 32; i++)
                lo = fminf(lo, x[k * 32 + i]), hi = fmaxf(hi, x[k * 32 + i]);
            double tol = (ts[t] == GGML_Q4_0 ? d : d / 2) + 1e-3 * fmax(fabs(lo), fabs(hi)) + 1e-30;
            for (int i = 0; i < 32; i++)
                if (!(fabs(y[k * 32 + i] - x[k * 32 + i]) <= tol))
                    fail_msg("%s block %lld value %d: %g -> %g (step %g)", ggml_type_name(ts[t]), (long long)k, i,
                             x[k * 32 + i], y[k * 32 + i], d);
        }
    }
    assert_false(ggml_quantize(GGML_Q6_K, x, b, n)); // not a checkpoint format
    free(x), free(y), free(b);
}

// A NaN or infinity in the activations makes the products it enters NaN in
// every kernel set, as the fp32 product would (not finite numbers from codes).
static void test_nonfinite(void **st) {
    rng_t r;
    rng_seed(&r, 13);
    size_t rb;
    uint8_t *w = rand_rows(GGML_Q4_1, 3, 64, &r, &rb);
    be_qmat_t W = {GGML_Q4_1, 3, 64, rb, w};
    float x[2 * 64], y[2 * 3];
    cpu_q8_t q[4];
    rng_fill_normal(&r, x, 128, 0.0f, 1.0f);
    x[40] = NAN, x[64 + 3] = INFINITY;
    const cpu_qkernels_t *ks[4];
    int nk = sets(ks);
    for (int s = 0; s < nk; s++) {
        cpu_qmatmul_with(ks[s], y, x, &W, 2, q);
        for (int i = 0; i < 6; i++)
            assert_true(isnan(y[i]));
    }
    free(w);
}

// Embedding rows dequantised on lookup equal ggml_dequant's.
static void test_qembed(void **st) {
    gguf_t g;
    assert_int_equal(gguf_open(&g, tu_model_path()), 0);
    const gguf_tensor_t *t = gguf_find_tensor(&g, "token_embd.weight");
    int blk, bytes;
    ggml_type_block(t->type, &blk, &bytes);
    int64_t cols = t->ne[0];
    be_qmat_t W = {t->type, t->ne[1], cols, (size_t)(cols / blk) * bytes, g.mf.data + t->offset};
    int32_t ids[3] = {0, 1234, (int32_t)t->ne[1] - 1};
    float *out = malloc(3 * cols * sizeof(float)), *ref = malloc(cols * sizeof(float));
    be_t *be = tu_cpu();
    be->qembed_fwd(be, out, &W, ids, 3);
    for (int i = 0; i < 3; i++) {
        ggml_dequant(W.type, (const uint8_t *)W.data + (size_t)ids[i] * W.row_bytes, ref, cols);
        assert_memory_equal(out + i * cols, ref, cols * sizeof(float));
    }
    free(out);
    free(ref);
    gguf_close(&g);
}

// The run-time choice: the reference always runs; a set whose instructions
// fault (ud2 raises SIGILL like an unsupported extension) is refused instead
// of killing the process; the chosen set is one that runs.
static int trapping_probe(void) {
    __builtin_trap();
    return 1;
}
static void test_probe(void **st) {
    assert_true(cpu_qk_runnable(&cpu_qk_ref));
    cpu_qkernels_t bad = cpu_qk_ref;
    bad.name = "trap";
    bad.probe = trapping_probe;
    assert_false(cpu_qk_probe(&bad));
    assert_true(cpu_qk_runnable(cpu_qk_best()));
    print_message("  kernel set chosen: %s\n", cpu_qk_best()->name);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_hand_blocks),
        cmocka_unit_test(test_random_blocks),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_real_tensors),
        cmocka_unit_test(test_qembed),
        cmocka_unit_test(test_op_many_rows),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_rows_independent),
        cmocka_unit_test(test_threads_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
