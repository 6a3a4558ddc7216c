// Fused CE and fused KL (from hidden states) on the GPU at training sizes:
// N = 8192 and 65536 tokens, d = 2048, V = 128256 (the HyLo-Llama-1B head; the
// KL teacher has d = 4096, Llama-3.1-8B). For each op:
//   * time: CUDA events on the backend's stream, 2 warm-ups, median of R runs;
//   * TFLOP/s of the matmul FLOPs: CE 6 N d V; KL 2 N (ds + dt) V forward +
//     4 N ds V backward;
//   * the roofline: one plain cuBLASLt bf16 GEMM [N, K] x [K, V] with the same
//     FLOPs (K = 3d for CE, 3 ds + dt for KL), timed the same way, and the
//     op's own GEMM sequence alone (its chunk size C, no row kernels), so the
//     table separates "GEMM shape" from "row kernel" overheads;
//   * memory: the scratch arena's peak (the op's only device temporaries),
//     the change in free device memory across the op (must be 0: the op
//     allocates nothing), against one [N, V] bf16 logits tensor.
// Usage: bench_loss (no arguments); the table comes last.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HYLO_CUDA
int main(void) {
    printf("bench_loss: built without CUDA (make CUDA=1)\n");
    return 0;
}
#else
#include <cuda_bf16.h>
// cuda.h is written for nvcc; in C the bf16 type is only its raw struct, which
// has the same size (the bench never does arithmetic on it).
typedef __nv_bfloat16_raw __nv_bfloat16;
#include "backend/cuda/cuda.h"
#include "base/err.h"
#include "base/rng.h"

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                        \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CHECK_LT(x)                                                                                                    \
    do {                                                                                                               \
        cublasStatus_t s_ = (x);                                                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusString(s_));                   \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static const int64_t V = 128256;
static const int DS = 2048, DT = 4096;
static const size_t SCRATCH = (size_t)1 << 30;

// Row-major C[M,N] = alpha op(A) op(B) + beta C, bf16 A/B, bf16 or fp32 C
// (the same mapping as cuda_loss.cu: cuBLASLt gets (B, A) and (N, M)).
static void gemm(be_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                 const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32) {
    cuda_impl_t *ci = cuda_impl(be);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    size_t ws = ci->lt_workspace_size;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, tb ? K : N, tb ? N : K, ldb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ta ? M : K, ta ? K : M, lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, ct, N, M, ldc));
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(ci->lt, op, la, lb, lc, lc, pref, 1, &res, &nres));
    if (nres == 0) {
        fprintf(stderr, "no cuBLASLt algorithm for %lldx%lldx%lld\n", (long long)M, (long long)N, (long long)K);
        exit(1);
    }
    CHECK_LT(cublasLtMatmul(ci->lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &res.algo, ci->lt_workspace,
                            ci->lt_workspace_size, ci->stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
}

// Device act buffer of n values, N(0, std^2): a 16M-value random block
// uploaded once and repeated (the values only need to be non-degenerate).
static void *rand_act(be_t *be, int64_t n, float std, uint64_t seed) {
    const int64_t blk = (int64_t)1 << 24;
    void *d = be->alloc(be, (size_t)n * be->act_size);
    if (!d) {
        fprintf(stderr, "%s\n", err_msg());
        exit(1);
    }
    int64_t m = n < blk ? n : blk;
    float *h = malloc((size_t)m * sizeof(float));
    rng_t r;
    rng_seed(&r, seed);
    rng_fill_normal(&r, h, m, 0.0f, std);
    if (be->upload_act(be, d, h, m) < 0) exit(1);
    for (int64_t i = m; i < n; i += m) {
        int64_t k = n - i < m ? n - i : m;
        if (be->copy_d2d(be, (char *)d + i * be->act_size, d, (size_t)k * be->act_size) < 0) exit(1);
    }
    free(h);
    return d;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef void (*work_fn)(void *ctx);

// Median milliseconds of `reps` runs after 2 warm-ups.
static float time_ms(be_t *be, work_fn f, void *ctx, int reps) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float t[32];
    for (int i = 0; i < 2; i++)
        f(ctx);
    for (int i = 0; i < reps; i++) {
        CHECK(cudaEventRecord(e0, cuda_stream(be)));
        f(ctx);
        CHECK(cudaEventRecord(e1, cuda_stream(be)));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    if (be->sync(be) < 0) {
        fprintf(stderr, "%s\n", err_msg());
        exit(1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(t, (size_t)reps, sizeof(float), cmp_f);
    return t[reps / 2];
}

typedef struct {
    be_t *be;
    int kl;
    int64_t N, C;
    void *hs, *Ws, *ht, *Wt, *dh, *S, *T;
    float *dW, *loss;
    int32_t *tgt;
    void *A, *B, *Cb; // plain GEMM
    int64_t K;
} bctx;

static void run_op(void *p) {
    bctx *c = p;
    if (c->kl)
        c->be->fused_kl(c->be, c->loss, c->dh, c->dW, c->hs, c->Ws, c->ht, c->Wt, NULL, c->N, DS, DT, V,
                        1.0f / (float)c->N);
    else
        c->be->fused_ce(c->be, c->loss, c->dh, c->dW, c->hs, c->Ws, c->tgt, c->N, DS, V, 1.0f / (float)c->N);
}

// The op's GEMMs alone, chunk by chunk, on the logits buffers it would use.
static void run_op_gemms(void *p) {
    bctx *c = p;
    const int64_t ld = (V + 7) & ~7LL;
    for (int64_t r0 = 0; r0 < c->N; r0 += c->C) {
        int64_t m = c->N - r0 < c->C ? c->N - r0 : c->C;
        const char *hs = (const char *)c->hs + r0 * DS * 2;
        gemm(c->be, 0, 1, m, V, DS, 1.0f, hs, DS, c->Ws, DS, 0.0f, c->S, ld, 0);
        if (c->kl)
            gemm(c->be, 0, 1, m, V, DT, 1.0f, (const char *)c->ht + r0 * DT * 2, DT, c->Wt, DT, 0.0f, c->T, ld, 0);
        gemm(c->be, 0, 0, m, DS, V, 1.0f, c->S, ld, c->Ws, DS, 0.0f, (char *)c->dh + r0 * DS * 2, DS, 0);
        gemm(c->be, 1, 0, V, DS, m, 1.0f, c->S, ld, hs, DS, 1.0f, c->dW, DS, 1);
    }
}

static void run_plain(void *p) {
    bctx *c = p;
    gemm(c->be, 0, 1, c->N, V, c->K, 1.0f, c->A, c->K, c->B, c->K, 0.0f, c->Cb, V, 0);
}

typedef struct {
    const char *op;
    int64_t N, C;
    double ms, tflops, gemms_ms, plain_tflops, scratch_mib, free_delta_mib, logits_gib;
    float loss;
} row_t;

static void bench_one(be_t *be, int kl, int64_t N, row_t *row) {
    bctx c = {.be = be, .kl = kl, .N = N};
    const int reps = N > 16384 ? 5 : 11;
    c.hs = rand_act(be, N * DS, 1.0f, 1);
    c.Ws = rand_act(be, V * DS, 2.0f / 45.25f, 2); // logit std ~2
    if (kl) {
        c.ht = rand_act(be, N * DT, 1.0f, 3);
        c.Wt = rand_act(be, V * DT, 2.5f / 64.0f, 4);
    } else {
        int32_t *t = malloc((size_t)N * sizeof(int32_t));
        for (int64_t i = 0; i < N; i++)
            t[i] = (int32_t)((i * 2654435761u) % (uint64_t)V);
        c.tgt = be->alloc(be, (size_t)N * sizeof(int32_t));
        if (!c.tgt || be->copy_h2d(be, c.tgt, t, (size_t)N * sizeof(int32_t)) < 0) exit(1);
        free(t);
    }
    c.dh = be->alloc(be, (size_t)N * DS * 2);
    c.dW = be->alloc(be, (size_t)V * DS * sizeof(float));
    c.loss = be->alloc(be, sizeof(float));
    if (!c.dh || !c.dW || !c.loss || be->memset0(be, c.dW, (size_t)V * DS * sizeof(float)) < 0) exit(1);

    // Memory: free device memory around one call (after a first call has
    // loaded the kernels lazily), and the arena's peak.
    size_t f0, f1, tot;
    run_op(&c);
    if (be->sync(be) < 0) {
        fprintf(stderr, "%s\n", err_msg());
        exit(1);
    }
    CHECK(cudaMemGetInfo(&f0, &tot));
    be->scratch.peak = be->scratch.used;
    run_op(&c);
    if (be->sync(be) < 0) {
        fprintf(stderr, "%s\n", err_msg());
        exit(1);
    }
    CHECK(cudaMemGetInfo(&f1, &tot));
    const size_t peak = be->scratch.peak - be->scratch.used;
    if (be->copy_d2h(be, &row->loss, c.loss, sizeof(float)) < 0) exit(1);

    row->op = kl ? "fused_kl" : "fused_ce";
    row->N = N;
    row->ms = time_ms(be, run_op, &c, reps);
    const double flops = kl ? 2.0 * N * (DS + DT) * V + 4.0 * N * DS * V : 6.0 * N * DS * V;
    row->tflops = flops / (row->ms * 1e-3) / 1e12;
    row->scratch_mib = peak / 1048576.0;
    row->free_delta_mib = ((double)f0 - (double)f1) / 1048576.0;
    row->logits_gib = (double)N * V * 2 / 1073741824.0;

    // The op's chunk size, recovered from its arena use: nbuf [C, ld] bf16
    // buffers plus C row losses (and < 2 KiB of alignment and accumulator).
    const int64_t ld = (V + 7) & ~7LL, nbuf = kl ? 2 : 1;
    c.C = (int64_t)(peak / (size_t)(nbuf * ld * 2 + 4));
    if (c.C > N) c.C = N;
    row->C = c.C;
    c.S = be->alloc(be, (size_t)c.C * ld * 2);
    c.T = kl ? be->alloc(be, (size_t)c.C * ld * 2) : NULL;
    if (!c.S || (kl && !c.T)) exit(1);
    row->gemms_ms = time_ms(be, run_op_gemms, &c, reps);
    be->free(be, c.S);
    be->free(be, c.T);

    // Plain GEMM with the same FLOPs.
    c.K = kl ? 3 * DS + DT : 3 * DS;
    c.A = rand_act(be, N * c.K, 1.0f, 5);
    c.B = rand_act(be, V * c.K, 0.02f, 6);
    c.Cb = be->alloc(be, (size_t)N * V * 2);
    if (!c.Cb) {
        fprintf(stderr, "%s\n", err_msg());
        exit(1);
    }
    const float plain_ms = time_ms(be, run_plain, &c, reps);
    row->plain_tflops = 2.0 * N * c.K * V / (plain_ms * 1e-3) / 1e12;
    be->free(be, c.A), be->free(be, c.B), be->free(be, c.Cb);
    be->free(be, c.hs), be->free(be, c.Ws), be->free(be, c.ht), be->free(be, c.Wt), be->free(be, c.tgt);
    be->free(be, c.dh), be->free(be, c.dW), be->free(be, c.loss);
    printf("%s N=%lld: %.2f ms, %.0f TFLOP/s (GEMMs alone %.2f ms, plain GEMM %.0f TFLOP/s), loss %.4f\n", row->op,
           (long long)N, row->ms, row->tflops, row->gemms_ms, row->plain_tflops, row->loss);
    fflush(stdout);
}

int main(void) {
    be_t *be;
    if (be_create(&be, "cuda", SCRATCH) < 0) {
        fprintf(stderr, "bench_loss: %s\n", err_msg());
        return 1;
    }
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, cuda_impl(be)->device));
    row_t rows[4];
    int n = 0;
    const int64_t Ns[2] = {8192, 65536};
    for (int kl = 0; kl < 2; kl++)
        for (int i = 0; i < 2; i++)
            bench_one(be, kl, Ns[i], &rows[n++]);
    printf("\n%s; d = %d, V = %lld, KL teacher d = %d; bf16 logits, fp32 dW; scratch arena %zu MiB\n", prop.name, DS,
           (long long)V, DT, SCRATCH >> 20);
    printf("| op       |     N |    C |  median ms | TFLOP/s | op GEMMs alone ms | plain GEMM TFLOP/s | op / plain |"
           " scratch peak MiB | free-mem change MiB | one [N,V] bf16 GiB |\n");
    printf("|----------|-------|------|------------|---------|-------------------|--------------------|------------|"
           "------------------|---------------------|--------------------|\n");
    for (int i = 0; i < n; i++)
        printf("| %-8s | %5lld | %4lld | %10.2f | %7.0f | %17.2f | %18.0f | %10.2f | %16.1f | %19.1f | %18.2f |\n",
               rows[i].op, (long long)rows[i].N, (long long)rows[i].C, rows[i].ms, rows[i].tflops, rows[i].gemms_ms,
               rows[i].plain_tflops, rows[i].tflops / rows[i].plain_tflops, rows[i].scratch_mib, rows[i].free_delta_mib,
               rows[i].logits_gib);
    be_destroy(be);
    return 0;
}
#endif
