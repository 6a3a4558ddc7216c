// Fused CE and fused KL (from hidden states) on the GPU at training sizes:
// N = 8192 and 65536 tokens, d = 2048, V = 128256 (the HyLo-Llama-1B head; the
// KL teacher has d = 4096, Llama-3.1-8B). For each op:
//   * time: CUDA events on the backend's stream, 2 warm-ups, median of R runs;
//   * TFLOP/s of the matmul FLOPs: CE 6 N d V; KL 2 N (ds + dt) V forward +
//     4 N ds V backward;
//   * the roofline: one plain bf16 GEMM [N, K] x [K, V] (the backend's gemm,
//     cuBLASLt) with the same FLOPs (K = 3d for CE, 3 ds + dt for KL), timed
//     the same way, and the op's own GEMM sequence alone through the same
//     gemm / gemm_f32out (its chunk size C, no row kernels), so the table
//     separates "GEMM shape" from "row kernel" overheads;
//   * memory: the scratch arena's peak (the op's only device temporaries),
//     the change in free device memory across the op (must be 0: the op
//     allocates nothing), against one [N, V] bf16 logits tensor.
// Usage: bench_loss (no arguments); the table comes last.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"

#define BENCH_NAME "bench_loss"
#include "bench_util.h"

static const int64_t V = 128256;
static const int DS = 2048, DT = 4096;
static const size_t SCRATCH = (size_t)1 << 30;

typedef struct {
    int kl;
    int64_t N, C;
    void *hs, *Ws, *ht, *Wt, *dh, *S, *T;
    float *dW, *loss;
    int32_t *tgt;
    void *A, *B, *Cb; // plain GEMM
    int64_t K;
} bctx;

static void run_op(void *p, int rep) {
    bctx *c = p;
    if (c->kl)
        be->fused_kl(be, c->loss, c->dh, c->dW, c->hs, c->Ws, c->ht, c->Wt, NULL, c->N, DS, DT, V, 1.0f / (float)c->N);
    else
        be->fused_ce(be, c->loss, c->dh, c->dW, c->hs, c->Ws, c->tgt, c->N, DS, V, 1.0f / (float)c->N);
}

// The op's GEMMs alone, chunk by chunk, on the logits buffers it would use:
// the backend's gemm / gemm_f32out, the same cuBLASLt products (bf16 in, fp32
// accumulate) with the same shapes, strides and alignments as the op's own
// calls in cuda_loss.cu.
static void run_op_gemms(void *p, int rep) {
    bctx *c = p;
    const int64_t ld = (V + 7) & ~7LL;
    for (int64_t r0 = 0; r0 < c->N; r0 += c->C) {
        int64_t m = c->N - r0 < c->C ? c->N - r0 : c->C;
        const char *hs = (const char *)c->hs + r0 * DS * 2;
        be->gemm(be, 0, 1, m, V, DS, 1.0f, hs, DS, c->Ws, DS, 0.0f, c->S, ld);
        if (c->kl) be->gemm(be, 0, 1, m, V, DT, 1.0f, (const char *)c->ht + r0 * DT * 2, DT, c->Wt, DT, 0.0f, c->T, ld);
        be->gemm(be, 0, 0, m, DS, V, 1.0f, c->S, ld, c->Ws, DS, 0.0f, (char *)c->dh + r0 * DS * 2, DS);
        be->gemm_f32out(be, 1, 0, V, DS, m, 1.0f, c->S, ld, hs, DS, 1.0f, c->dW, DS);
    }
}

// One plain bf16 GEMM [N, K] x [K, V] (the roofline).
static void run_plain(void *p, int rep) {
    bctx *c = p;
    be->gemm(be, 0, 1, c->N, V, c->K, 1.0f, c->A, c->K, c->B, c->K, 0.0f, c->Cb, V);
}

static size_t free_bytes(void) {
    size_t f, tot;
    cudaError_t e = cudaMemGetInfo(&f, &tot);
    if (e != cudaSuccess) {
        fprintf(stderr, BENCH_NAME ": cudaMemGetInfo: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    return f;
}

typedef struct {
    const char *op;
    int64_t N, C;
    double ms, tflops, gemms_ms, plain_tflops, scratch_mib, free_delta_mib, logits_gib;
    float loss;
} row_t;

static void bench_one(int kl, int64_t N, row_t *row) {
    bctx c = {.kl = kl, .N = N};
    const int reps = N > 16384 ? 5 : 11;
    c.hs = dev_rand(N * DS, 1, 0.0f, 1.0f);
    c.Ws = dev_rand(V * DS, 2, 0.0f, 2.0f / 45.25f); // logit std ~2
    if (kl) {
        c.ht = dev_rand(N * DT, 3, 0.0f, 1.0f);
        c.Wt = dev_rand(V * DT, 4, 0.0f, 2.5f / 64.0f);
    } else {
        int32_t *t = malloc((size_t)N * sizeof(int32_t));
        for (int64_t i = 0; i < N; i++)
            t[i] = (int32_t)((i * 2654435761u) % (uint64_t)V);
        c.tgt = dalloc((size_t)N * sizeof(int32_t));
        if (be->copy_h2d(be, c.tgt, t, (size_t)N * sizeof(int32_t)) < 0) die("copy_h2d");
        free(t);
    }
    c.dh = dalloc((size_t)N * DS * 2);
    c.dW = dalloc((size_t)V * DS * sizeof(float));
    c.loss = dalloc(sizeof(float));
    if (be->memset0(be, c.dW, (size_t)V * DS * sizeof(float)) < 0) die("memset0");

    // Memory: free device memory around one call (after a first call has
    // loaded the kernels lazily), and the arena's peak.
    run_op(&c, 0);
    check_sync("first call");
    const size_t f0 = free_bytes();
    be->scratch.peak = be->scratch.used;
    run_op(&c, 0);
    check_sync("second call");
    const size_t f1 = free_bytes();
    const size_t peak = be->scratch.peak - be->scratch.used;
    if (be->copy_d2h(be, &row->loss, c.loss, sizeof(float)) < 0) die("copy_d2h");

    row->op = kl ? "fused_kl" : "fused_ce";
    row->N = N;
    row->ms = time_op(run_op, &c, 2, reps, 0);
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
    c.S = dalloc((size_t)c.C * ld * 2);
    c.T = kl ? dalloc((size_t)c.C * ld * 2) : NULL;
    row->gemms_ms = time_op(run_op_gemms, &c, 2, reps, 0);
    be->free(be, c.S);
    be->free(be, c.T);

    // Plain GEMM with the same FLOPs.
    c.K = kl ? 3 * DS + DT : 3 * DS;
    c.A = dev_rand(N * c.K, 5, 0.0f, 1.0f);
    c.B = dev_rand(V * c.K, 6, 0.0f, 0.02f);
    c.Cb = dalloc((size_t)N * V * 2);
    const float plain_ms = time_op(run_plain, &c, 2, reps, 0);
    row->plain_tflops = 2.0 * N * c.K * V / (plain_ms * 1e-3) / 1e12;
    be->free(be, c.A), be->free(be, c.B), be->free(be, c.Cb);
    be->free(be, c.hs), be->free(be, c.Ws), be->free(be, c.ht), be->free(be, c.Wt), be->free(be, c.tgt);
    be->free(be, c.dh), be->free(be, c.dW), be->free(be, c.loss);
    printf("%s N=%lld: %.2f ms, %.0f TFLOP/s (GEMMs alone %.2f ms, plain GEMM %.0f TFLOP/s), loss %.4f\n", row->op,
           (long long)N, row->ms, row->tflops, row->gemms_ms, row->plain_tflops, row->loss);
    fflush(stdout);
}

int main(void) {
    bench_init(SCRATCH);
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        snprintf(prop.name, sizeof prop.name, "(unknown device)");
    row_t rows[4];
    int n = 0;
    const int64_t Ns[2] = {8192, 65536};
    for (int kl = 0; kl < 2; kl++)
        for (int i = 0; i < 2; i++)
            bench_one(kl, Ns[i], &rows[n++]);
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
    bench_finish();
    return 0;
}
