// CUDA products and embedding lookups on weights in their GGUF block formats
// (cuda_quant.cu: qmatmul, qembed_fwd) against a host reference built from
// ggml_dequant (io/quant.c), for Q4_0, Q4_1, Q8_0 (matrices quantised by
// ggml_quantize), Q4_K, Q6_K (random valid blocks: finite fp16 scales) and
// BF16. The weights' bytes are uploaded as they are; x is drawn rounded to
// bf16, so both sides see the same inputs.
//
// Tolerances:
//  qmatmul, N <= BE_FEW_ROWS (k_qgemv), the block formats: the CPU's
//    arithmetic for few rows (cpu_quant.c: x rounded to 8-bit blocks, exact
//    integer dot products per block, each block's fp32 term by the same
//    expression), so the reference is the CPU backend's qmatmul of the same x
//    and bytes; the two differ in the order of the fp32 additions only.
//    Elementwise |gpu - ref| <= 2^-8 |ref| (the bf16 rounding of the output,
//    half an ulp = 2^-9 relative, doubled for a flip across a rounding
//    boundary when the fp32 sums differ in their last bits) + 1e-3 rms(ref
//    over the row of y) (fp32 accumulation in another order over up to 8192
//    terms: ~K 2^-24 of the terms' magnitudes, far below; the term covers
//    elements near zero after cancellation); relative L2 < 1e-2. The exact
//    product (ggml_dequant, summed in double) is checked too, within the
//    rounding of x to 8 bits: 2^-8 |ref| + 5e-2 rms, relative L2 < 3e-2 (a
//    term's error up to 1/254 relative, ~7e-3 rms(ref) on a sum).
//  qmatmul, BF16 at any N, and N > BE_FEW_ROWS (dequantised to bf16,
//    cuBLASLt): against the exact product in double, the weights rounded to
//    bf16 where the GEMM reads them so; the first tolerance.
//  qembed_fwd: exact, ggml_dequant's values rounded to bf16.
// The bench-variants build's binary runs k_qgemv's bulk-copy variant with
// HYLO_QGEMV_BULK=1 (cuda_quant.cu), under the same tolerances.
// HYLO_TEST_CPU_AS_GPU=1 (the fake GPU is a CPU backend, testutil.h): its
// qmatmul rounds x to 8-bit blocks for N < 16 and uses the exact weights at
// N >= 16, so the checks against the exact product there take the second
// tolerance: the point of that mode is the test's own logic. Its act is fp32,
// so qembed_fwd is compared with the unrounded values.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/half.h"
#include "io/gguf.h"
#include "testutil.h"

static be_t *gpu;
static uint64_t g_seed = 0x9a47;

static void setup(void) { gpu = tu_gpu(); }

// A weight matrix of `type` on the host: its bytes and row stride.
typedef struct {
    uint32_t type;
    int64_t rows, cols;
    size_t rb;
    uint8_t *bytes;
} hmat_t;

static uint32_t rnd_u32(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}
// A finite fp16 in [lo, hi), stored little-endian at p.
static void put_f16(uint8_t *p, uint64_t *s, float lo, float hi) {
    const float u = (float)(rnd_u32(s) & 0xffffff) / 16777216.0f;
    const uint16_t h = f32_to_f16(lo + (hi - lo) * u);
    memcpy(p, &h, 2);
}

static hmat_t make_mat(uint32_t type, int64_t rows, int64_t cols) {
    int blk = 0, bytes = 0;
    assert_true(ggml_type_block(type, &blk, &bytes));
    assert_true(cols % blk == 0);
    hmat_t m = {type, rows, cols, (size_t)(cols / blk) * (size_t)bytes, NULL};
    const size_t total = (size_t)rows * m.rb;
    m.bytes = malloc(total + 16);
    assert_non_null(m.bytes);
    uint64_t s = g_seed++;
    if (type == GGML_Q4_0 || type == GGML_Q4_1 || type == GGML_Q8_0 || type == GGML_BF16) {
        float *w = tu_hbuf(rows * cols);
        tu_randn(w, rows * cols, g_seed++, 1.0f);
        if (type == GGML_BF16)
            f32_row_to_bf16(w, m.bytes, rows * cols);
        else
            assert_true(ggml_quantize(type, w, m.bytes, rows * cols));
        free(w);
        return m;
    }
    // K formats: random codes, scales and mins; the fp16 super-block scales
    // finite and small enough that the values stay O(1).
    for (size_t i = 0; i < total; i++)
        m.bytes[i] = (uint8_t)rnd_u32(&s);
    const int64_t nblocks = (int64_t)(total / (size_t)bytes);
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *p = m.bytes + b * bytes;
        if (type == GGML_Q4_K) {
            put_f16(p, &s, 1e-3f, 4e-3f);     // d: up to 63 * 15 * d ~ 4
            put_f16(p + 2, &s, 1e-3f, 4e-3f); // dmin
        } else {
            put_f16(p + 208, &s, -2e-3f, 2e-3f); // d (either sign): up to 128 * 32 * d ~ 8
        }
    }
    return m;
}

// The dequantised matrix [rows, cols] as ggml_dequant gives it.
static float *dequant(const hmat_t *m) {
    float *w = tu_hbuf(m->rows * m->cols);
    for (int64_t r = 0; r < m->rows; r++)
        ggml_dequant(m->type, m->bytes + r * m->rb, w + r * m->cols, m->cols);
    return w;
}

// The bytes in an allocation rounded up to 64, as model.c places each
// block-format matrix (a product may read the 16-byte pieces its bytes touch
// whole: the bench-variants build's HYLO_QGEMV_BULK=1).
static be_qmat_t upload(const hmat_t *m) {
    const size_t total = (size_t)m->rows * m->rb;
    void *d = gpu->alloc(gpu, (total + 63) & ~(size_t)63);
    assert_non_null(d);
    assert_int_equal(gpu->copy_h2d(gpu, d, m->bytes, total), 0);
    return (be_qmat_t){m->type, m->rows, m->cols, m->rb, d};
}

// ref [N, rows] = x [N, cols] w^T in double.
static float *matmul_ref(const float *x, const float *w, int64_t N, int64_t rows, int64_t cols) {
    float *y = tu_hbuf(N * rows);
    for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            const float *a = x + n * cols, *b = w + r * cols;
            for (int64_t k = 0; k < cols; k++)
                s += (double)a[k] * b[k];
            y[n * rows + r] = (float)s;
        }
    return y;
}

// got against ref row by row of y (the rms term over each row), with the
// tolerance of a product in the same arithmetic (loose 0) or of one that
// rounds x to 8-bit blocks against the exact product (loose 1); prints one line.
static int check_rows(const char *what, const float *got, const float *ref, int64_t N, int64_t rows, int loose) {
    const double rtol = 1.0 / 256, atol = loose ? 5e-2 : 1e-3, l2 = loose ? 3e-2 : 1e-2;
    int64_t off = 0, first = -1;
    double worst_rel = 0, max_abs = 0;
    for (int64_t n = 0; n < N; n++) {
        tu_cmp_t c = tu_compare(got + n * rows, ref + n * rows, rows, rtol, atol, 0.0);
        if (c.n_off && first < 0) first = n * rows + c.first;
        off += c.n_off;
        if (c.rel > worst_rel || isnan(c.rel)) worst_rel = c.rel;
        if (c.max_abs > max_abs || isnan(c.max_abs)) max_abs = c.max_abs;
    }
    const int ok = off == 0 && worst_rel <= l2;
    printf("%s %-56s rel_err %.3e max_abs %.3e", ok ? "ok  " : "FAIL", what, worst_rel, max_abs);
    if (off)
        printf("  %lld/%lld off, first [n=%lld r=%lld]: got %.8g ref %.8g", (long long)off, (long long)(N * rows),
               (long long)(first / rows), (long long)(first % rows), got[first], ref[first]);
    printf("\n");
    fflush(stdout);
    return ok;
}

// y [N, rows] = x W^T by the CPU backend's qmatmul (its few-rows arithmetic
// below 16 rows).
static float *matmul_cpu(const hmat_t *m, const float *x, int64_t N) {
    be_t *cpu = tu_cpu();
    const be_qmat_t q = {m->type, m->rows, m->cols, m->rb, m->bytes};
    float *y = tu_hbuf(N * m->rows);
    err_clear();
    cpu->qmatmul(cpu, y, x, &q, N);
    assert_int_equal(err_code(), 0);
    return y;
}

// qmatmul of one matrix for each N in ns: 1 on pass.
static int matmul_case(uint32_t type, int64_t rows, int64_t cols, const int *ns, int nn) {
    hmat_t m = make_mat(type, rows, cols);
    float *w = dequant(&m), *wb = tu_hdup(w, rows * cols);
    tu_round_bf16(wb, rows * cols);
    be_qmat_t q = upload(&m);
    int ok = 1;
    for (int i = 0; i < nn; i++) {
        const int64_t N = ns[i];
        char what[96];
        snprintf(what, sizeof what, "qmatmul %s %lldx%lld N=%lld", ggml_type_name(type), (long long)rows,
                 (long long)cols, (long long)N);
        float *x = tu_rnd(N * cols, g_seed++, 1.0f), *nan = tu_nans(N * rows);
        // Above BE_FEW_ROWS the GPU's GEMM reads the weights rounded to bf16;
        // at or below it the block formats take the CPU's few-rows arithmetic.
        const int few = N <= BE_FEW_ROWS && type != GGML_BF16;
        float *ref = matmul_ref(x, N > BE_FEW_ROWS && !tu_fake_gpu() ? wb : w, N, rows, cols);
        float *cref = few ? matmul_cpu(&m, x, N) : NULL;
        void *dx = tu_dev_act(gpu, x, N * cols), *dy = tu_dev_act(gpu, nan, N * rows);
        gpu->qmatmul(gpu, dy, dx, &q, N);
        if (!tu_sync(gpu, "qmatmul", what)) {
            ok = 0;
        } else {
            float *got = tu_host_act(gpu, dy, N * rows);
            char vs[128];
            if (few) {
                snprintf(vs, sizeof vs, "%s vs cpu", what);
                ok &= check_rows(vs, got, cref, N, rows, 0);
            }
            snprintf(vs, sizeof vs, "%s vs exact", what);
            ok &= check_rows(vs, got, ref, N, rows, few || tu_fake_gpu());
            free(got);
        }
        free(cref);
        tu_dev_free(gpu, dx), tu_dev_free(gpu, dy);
        free(x), free(nan), free(ref);
    }
    gpu->free(gpu, (void *)q.data);
    free(m.bytes), free(w), free(wb);
    return ok;
}

static const uint32_t TYPES[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16};

static void test_qmatmul(void **st) {
    (void)st;
    setup();
    static const int ns[] = {1, 2, 3, 5, 8, 9, 40};
    // 32-value formats: SmolLM2's widths (576: rows 324 / 360 / 612 bytes
    // apart for Q4_0 / Q4_1 / Q8_0, not 16-byte multiples) and an odd row
    // count (the last warp's rows clamped); 256-value formats: 768 and 1536
    // (Q6_K rows 630 / 1260 bytes apart).
    static const int64_t small[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {301, 256}};
    static const int64_t small_k[][2] = {{576, 768}, {1536, 768}, {576, 1536}, {301, 256}};
    int fails = 0;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const int kq = TYPES[t] == GGML_Q4_K || TYPES[t] == GGML_Q6_K;
        for (int s = 0; s < 4; s++) {
            const int64_t *sh = kq ? small_k[s] : small[s];
            fails += !matmul_case(TYPES[t], sh[0], sh[1], ns, (int)(sizeof ns / sizeof ns[0]));
        }
    }
    assert_int_equal(fails, 0);
}

// A 3B-8B model's shape, decode only (N = 1 and 8): 14 MB of Q4_0. Then
// more rows than k_qgemv's grid has warps on an H100 or H200 (at most 132
// SMs x 8 blocks x 8 warps = 8,448), as a vocabulary's head has: each warp
// takes several rows, with two steps of 1,024 values a row, the second a
// partial one.
static void test_qmatmul_large(void **st) {
    (void)st;
    setup();
    static const int ns[] = {1, 8};
    int fails = 0;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        fails += !matmul_case(TYPES[t], 3072, 8192, ns, 2);
        fails += !matmul_case(TYPES[t], 12007, 1280, ns, 2);
    }
    assert_int_equal(fails, 0);
}

// Prefill with a scratch arena that holds only part of the dequantised
// matrix: slabs of rows (a multiple of 64) one after another.
static void test_qmatmul_slabs(void **st) {
    (void)st;
    setup();
    if (tu_fake_gpu()) skip(); // the CPU takes its panel from its own pool, not the arena
    const int64_t rows = 1536, cols = 768, N = 40;
    hmat_t m = make_mat(GGML_Q4_K, rows, cols);
    float *w = dequant(&m);
    tu_round_bf16(w, rows * cols);
    be_qmat_t q = upload(&m);
    float *x = tu_rnd(N * cols, g_seed++, 1.0f), *nan = tu_nans(N * rows), *ref = matmul_ref(x, w, N, rows, cols);
    void *dx = tu_dev_act(gpu, x, N * cols), *dy = tu_dev_act(gpu, nan, N * rows);
    const size_t mark = arena_mark(&gpu->scratch);
    gpu->scratch.used = gpu->scratch.cap - (size_t)200 * cols * 2 - 512; // room for 200 rows: slabs of 192
    gpu->qmatmul(gpu, dy, dx, &q, N);
    arena_reset(&gpu->scratch, mark);
    int ok = tu_sync(gpu, "qmatmul", "slabs");
    if (ok) {
        float *got = tu_host_act(gpu, dy, N * rows);
        ok = check_rows("qmatmul Q4_K 1536x768 N=40 (slabs of 192 rows)", got, ref, N, rows, 0);
        free(got);
    }
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dy), gpu->free(gpu, (void *)q.data);
    free(m.bytes), free(w), free(x), free(nan), free(ref);
    assert_true(ok);
}

// qproj (a decode step's product with its input norm or its residual add)
// against the CPU backend's qproj, which runs the ops one after another (its
// rmsnorm, then its qmatmul on x rounded to 8-bit blocks, then the add), on
// the same x (rows ldx apart), gain and residual. N <= BE_FEW_ROWS: k_qgemv's
// fused forms, the first tolerance of the header (the GPU keeps the normed
// rows in fp32 as the CPU does; a code may flip where the rstd differs in its
// last bits, far inside it); BF16 weights: the fused bf16 products. N = 12:
// the GPU's ops one after another, normed rows rounded to bf16 and the
// dequantised GEMM against the CPU's 8-bit rounding of x: the second.
// SwiGLU's input (modes 2 and 3: x holds [gate | up] rows ldx apart, the
// product's input SwiGLU(gate, up), the down product of a decode step): the
// reference is the CPU's qproj of SwiGLU computed by the CPU backend and
// rounded to the GPU's activation type, as the GPU rounds it before the
// product, so both round the same values to 8 bits (a code may flip where
// the two expf differ in their last bits: far inside the tolerance).
enum { QP_NORMED, QP_ADD, QP_SWIGLU, QP_SWIGLU_ADD };
static int qproj_case(uint32_t type, int64_t rows, int64_t cols, int64_t N, int mode) {
    static const char *names[] = {"normed", "add", "swiglu", "swiglu add"};
    hmat_t m = make_mat(type, rows, cols);
    be_qmat_t q = upload(&m);
    const be_qmat_t hq = {m.type, m.rows, m.cols, m.rb, m.bytes};
    const int add = mode == QP_ADD || mode == QP_SWIGLU_ADD, glu = mode >= QP_SWIGLU;
    const int64_t ldx = (glu ? 2 : 1) * cols + 64;
    float *x = tu_rnd(N * ldx, g_seed++, 1.0f), *g = tu_rnd(cols, g_seed++, 0.5f),
          *r0 = tu_rnd(N * rows, g_seed++, 4.0f);
    for (int64_t i = 0; i < cols; i++)
        g[i] += 1.0f;
    tu_round_bf16(g, cols); // x and r0 are (tu_rnd): both sides see the same inputs
    be_t *cpu = tu_cpu();
    float *ref = tu_hdup(r0, N * rows), *h = NULL;
    err_clear();
    if (glu) {
        h = tu_hbuf(N * cols);
        cpu->swiglu_fwd(cpu, h, x, x + cols, ldx, N, cols);
        if (gpu->act_dtype == DT_BF16) tu_round_bf16(h, N * cols);
        cpu->qproj(cpu, add ? NULL : ref, add ? ref : NULL, h, NULL, cols, NULL, 0.0f, &hq, N);
    } else {
        cpu->qproj(cpu, add ? NULL : ref, add ? ref : NULL, x, NULL, ldx, add ? NULL : g, 1e-5f, &hq, N);
    }
    assert_int_equal(err_code(), 0);
    void *dx = tu_dev_act(gpu, x, N * ldx), *dg = tu_dev_act(gpu, g, cols), *dr = tu_dev_act(gpu, r0, N * rows);
    float *nan = tu_nans(N * rows);
    void *dy = tu_dev_act(gpu, nan, N * rows);
    const void *du = glu ? (const char *)dx + cols * (int64_t)gpu->act_size : NULL;
    gpu->qproj(gpu, add ? NULL : dy, add ? dr : NULL, dx, du, ldx, mode == QP_NORMED ? dg : NULL,
               mode == QP_NORMED ? 1e-5f : 0.0f, &q, N);
    char what[96];
    snprintf(what, sizeof what, "qproj %s %lldx%lld N=%lld %s", ggml_type_name(type), (long long)rows, (long long)cols,
             (long long)N, names[mode]);
    int ok = tu_sync(gpu, "qproj", what);
    if (ok) {
        float *got = tu_host_act(gpu, add ? dr : dy, N * rows);
        ok = check_rows(what, got, ref, N, rows, N > BE_FEW_ROWS && type != GGML_BF16);
        free(got);
    }
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dg), tu_dev_free(gpu, dr), tu_dev_free(gpu, dy);
    gpu->free(gpu, (void *)q.data);
    free(m.bytes), free(x), free(g), free(r0), free(ref), free(nan), free(h);
    return ok;
}

static void test_qproj(void **st) {
    (void)st;
    setup();
    static const int64_t ns[] = {1, 5, 8, 12};
    int fails = 0;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const int kq = TYPES[t] == GGML_Q4_K || TYPES[t] == GGML_Q6_K;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (int mode = QP_NORMED; mode <= QP_SWIGLU_ADD; mode++)
                fails += !qproj_case(TYPES[t], kq ? 1536 : 1600, kq ? 768 : 576, ns[i], mode);
    }
    assert_int_equal(fails, 0);
}

static void test_qembed(void **st) {
    (void)st;
    setup();
    int fails = 0;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        const int kq = TYPES[t] == GGML_Q4_K || TYPES[t] == GGML_Q6_K;
        const int64_t rows = 97, cols = kq ? 768 : 576, N = 13;
        hmat_t m = make_mat(TYPES[t], rows, cols);
        float *w = dequant(&m), *ref = tu_hbuf(N * cols), *nan = tu_nans(N * cols);
        int32_t ids[13];
        uint64_t s = g_seed++;
        for (int n = 0; n < N; n++)
            ids[n] = n == 0 ? 0 : n == 1 ? (int32_t)rows - 1 : (int32_t)(rnd_u32(&s) % 8); // repeats
        for (int n = 0; n < N; n++)
            memcpy(ref + n * cols, w + (int64_t)ids[n] * cols, (size_t)cols * sizeof(float));
        if (gpu->act_dtype == DT_BF16) tu_round_bf16(ref, N * cols);
        be_qmat_t q = upload(&m);
        int32_t *did = tu_dev_i32(gpu, ids, N);
        void *dout = tu_dev_act(gpu, nan, N * cols);
        gpu->qembed_fwd(gpu, dout, &q, did, N);
        char what[64];
        snprintf(what, sizeof what, "qembed_fwd %s %lldx%lld N=%lld", ggml_type_name(TYPES[t]), (long long)rows,
                 (long long)cols, (long long)N);
        int ok = tu_sync(gpu, "qembed_fwd", what);
        if (ok) {
            float *got = tu_host_act(gpu, dout, N * cols);
            int64_t bad = -1;
            for (int64_t i = 0; i < N * cols && bad < 0; i++)
                if (memcmp(&got[i], &ref[i], sizeof(float))) bad = i;
            ok = bad < 0;
            printf("%s %s", ok ? "ok  " : "FAIL", what);
            if (!ok) printf("  first off at %lld: got %.8g ref %.8g", (long long)bad, got[bad], ref[bad]);
            printf(" (exact)\n");
            free(got);
        }
        fails += !ok;
        tu_dev_free(gpu, did), tu_dev_free(gpu, dout), gpu->free(gpu, (void *)q.data);
        free(m.bytes), free(w), free(ref), free(nan);
    }
    assert_int_equal(fails, 0);
}

// A type without kernels (Q5_0) is an error naming the op and the type.
static void test_unsupported(void **st) {
    (void)st;
    setup();
    const int64_t rows = 64, cols = 64;
    hmat_t m = {GGML_Q5_0, rows, cols, 2 * 22, NULL};
    m.bytes = calloc((size_t)rows * m.rb, 1);
    be_qmat_t q = upload(&m);
    float *x = tu_rnd(cols, g_seed++, 1.0f), *nan = tu_nans(rows);
    void *dx = tu_dev_act(gpu, x, cols), *dy = tu_dev_act(gpu, nan, rows);
    assert_int_equal(gpu->sync(gpu), 0);
    err_clear();
    gpu->qmatmul(gpu, dy, dx, &q, 1);
    printf("qmatmul Q5_0: %s\n", err_msg());
    assert_non_null(strstr(err_msg(), "qmatmul"));
    assert_non_null(strstr(err_msg(), "Q5_0"));
    const int rc = gpu->sync(gpu);
    if (!tu_fake_gpu()) assert_true(rc < 0); // the CPU op sets the error slot; its sync has nothing to report
    assert_int_equal(gpu->sync(gpu), 0);     // reported once
    if (!tu_fake_gpu()) {                    // the CPU's qembed_fwd takes any type ggml_dequant knows
        int32_t id0 = 0, *did = tu_dev_i32(gpu, &id0, 1);
        err_clear();
        gpu->qembed_fwd(gpu, dy, &q, did, 1);
        printf("qembed_fwd Q5_0: %s\n", err_msg());
        assert_non_null(strstr(err_msg(), "qembed_fwd"));
        assert_non_null(strstr(err_msg(), "Q5_0"));
        assert_true(gpu->sync(gpu) < 0);
        tu_dev_free(gpu, did);
    }
    tu_dev_free(gpu, dx), tu_dev_free(gpu, dy), gpu->free(gpu, (void *)q.data);
    free(m.bytes), free(x), free(nan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qmatmul), cmocka_unit_test(test_qmatmul_large), cmocka_unit_test(test_qmatmul_slabs),
        cmocka_unit_test(test_qproj),   cmocka_unit_test(test_qembed),        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
