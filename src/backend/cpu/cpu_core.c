// Elementwise ops, strided copies, GEMM through OpenBLAS, embedding; the
// temporaries every CPU op takes (cpu_tmp_take).
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

float *cpu_tmp_take(be_t *be, cpu_tmp_t *t, int64_t n, const char *what) {
    arena_t *a = &be->scratch;
    size_t bytes = (size_t)n * sizeof(float), off = (a->used + 255) & ~(size_t)255;
    t->mark = a->used;
    t->heap = !(a->base && off + bytes <= a->cap); // checked first: arena_alloc would set the error slot
    t->p = t->heap ? malloc(bytes ? bytes : 4) : arena_alloc(a, bytes);
    if (!t->p) err_set(ERR_NOMEM, "cpu %s: cannot allocate %zu bytes of temporaries", what, bytes);
    return t->p;
}

void cpu_tmp_give(be_t *be, cpu_tmp_t *t) {
    if (t->heap)
        free(t->p);
    else
        arena_reset(&be->scratch, t->mark);
    t->p = NULL;
}

void cpu_fill_nan(float *p, int64_t n) {
    if (p)
        for (int64_t i = 0; i < n; i++)
            p[i] = NAN;
}

void cpu_fill_nan_rows(float *p, int64_t ld, int64_t rows, int64_t cols) {
    if (p)
        for (int64_t r = 0; r < rows; r++)
            cpu_fill_nan(p + r * ld, cols);
}

static void cpu_add(be_t *be, void *y_, const void *x_, int64_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

static void cpu_scale(be_t *be, void *y_, const void *x_, float a, int64_t n) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] = a * x[i];
}

static void cpu_copy2d(be_t *be, void *dst_, int64_t ldd, const void *src_, int64_t lds, int64_t rows, int64_t cols,
                       int accumulate) {
    float *dst = dst_;
    const float *src = src_;
#pragma omp parallel for schedule(static) if (rows * cols > CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * ldd;
        const float *s = src + r * lds;
        if (accumulate)
            for (int64_t c = 0; c < cols; c++)
                d[c] += s[c];
        else
            memmove(d, s, (size_t)cols * sizeof(float));
    }
}

static void cpu_copy_pages(be_t *be, void *x_, int64_t ldx, void *pool_, int64_t ld, const int32_t *pages, int64_t u0,
                           int64_t rows, int64_t cols, int to_pool) {
    float *x = x_, *pool = pool_;
#pragma omp parallel for schedule(static) if (rows * cols > CPU_PAR_MIN)
    for (int64_t i = 0; i < rows; i++) {
        int64_t u = u0 + i;
        float *p = pool + ((int64_t)pages[u / BE_PAGE_ROWS] * BE_PAGE_ROWS + u % BE_PAGE_ROWS) * ld, *xr = x + i * ldx;
        memcpy(to_pool ? p : xr, to_pool ? xr : p, (size_t)cols * sizeof(float));
    }
}

// Tiles of C a product is split into (rows x columns; one row: columns).
enum { GEMM_TILE_M = 512, GEMM_TILE_N = 48, GEMV_TILE_N = 64 };

void cpu_sgemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
               const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) { // BLAS leaves C untouched for K = 0 only when beta == 1
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    if (M == 1) { // one row (decode): a matrix-vector product streams B once, sgemm would pack it first
        const int64_t inc = transA ? lda : 1, nt = (N + GEMV_TILE_N - 1) / GEMV_TILE_N;
#pragma omp parallel for schedule(static) if (N * K > 4 * CPU_PAR_MIN && nt > 1)
        for (int64_t j = 0; j < nt; j++) {
            const int64_t n0 = j * GEMV_TILE_N, n = N - n0 < GEMV_TILE_N ? N - n0 : GEMV_TILE_N;
            if (transB)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)K, alpha, B + n0 * ldb, (int)ldb, A, (int)inc,
                            beta, C + n0, 1);
            else
                cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)n, alpha, B + n0, (int)ldb, A, (int)inc, beta,
                            C + n0, 1);
        }
        return;
    }
    const int64_t mt = (M + GEMM_TILE_M - 1) / GEMM_TILE_M, nt = (N + GEMM_TILE_N - 1) / GEMM_TILE_N;
#pragma omp parallel for schedule(static) if (M * N * K > 64 * CPU_PAR_MIN && mt * nt > 1)
    for (int64_t t = 0; t < mt * nt; t++) {
        const int64_t i = t / nt, j = t - i * nt, m0 = i * GEMM_TILE_M, n0 = j * GEMM_TILE_N;
        const int64_t m = M - m0 < GEMM_TILE_M ? M - m0 : GEMM_TILE_M, n = N - n0 < GEMM_TILE_N ? N - n0 : GEMM_TILE_N;
        const float *a = transA ? A + m0 : A + m0 * lda, *b = transB ? B + n0 * ldb : B + n0;
        cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, (int)m,
                    (int)n, (int)K, alpha, a, (int)lda, b, (int)ldb, beta, C + m0 * ldc + n0, (int)ldc);
    }
}

static void cpu_gemm(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                     int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc) {
    cpu_sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_gemm_f32out(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cpu_gemm(be, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_gemm_batched(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                             const void *A, int64_t lda, int64_t strideA, const void *B, int64_t ldb, int64_t strideB,
                             float beta, void *C, int64_t ldc, int64_t strideC, int64_t batch) {
    for (int64_t i = 0; i < batch; i++)
        cpu_gemm(be, transA, transB, M, N, K, alpha, (const float *)A + i * strideA, lda,
                 (const float *)B + i * strideB, ldb, beta, (float *)C + i * strideC, ldc);
}

static void cpu_embed_fwd(be_t *be, void *out_, const void *table_, const int32_t *ids, int64_t N, int d) {
    float *out = out_;
    const float *table = table_;
#pragma omp parallel for schedule(static) if (N * d > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        memcpy(out + n * d, table + (int64_t)ids[n] * d, (size_t)d * sizeof(float));
}

static void cpu_embed_bwd(be_t *be, float *dtable, const void *dout_, const int32_t *ids, int64_t N, int d) {
    const float *dout = dout_;
    // Sequential over tokens: repeated ids accumulate into the same row.
    for (int64_t n = 0; n < N; n++) {
        float *row = dtable + (int64_t)ids[n] * d;
        const float *g = dout + n * d;
        for (int i = 0; i < d; i++)
            row[i] += g[i];
    }
}

void cpu_register_core(be_t *be) {
    be->add = cpu_add;
    be->scale = cpu_scale;
    be->copy2d = cpu_copy2d;
    be->copy_pages = cpu_copy_pages;
    be->gemm = cpu_gemm;
    be->gemm_f32out = cpu_gemm_f32out;
    be->gemm_batched = cpu_gemm_batched;
    be->embed_fwd = cpu_embed_fwd;
    be->embed_bwd = cpu_embed_bwd;
}
