// CPU backend internals: fp32 everywhere, OpenMP over rows, OpenBLAS for GEMM.
// Each cpu_*.c file fills its part of the op table through a cpu_register_*
// function; cpu_backend.c calls them all.
#pragma once
#include <math.h>

#include "backend/backend.h"

void cpu_register_core(be_t *be);  // cpu_core.c: elementwise, copies, gemm, embedding
void cpu_register_norm(be_t *be);  // cpu_norm.c: rmsnorm, gated rmsnorm, l2norm
void cpu_register_rope(be_t *be);  // cpu_rope.c
void cpu_register_attn(be_t *be);  // cpu_attn.c: causal attention forward/backward, decode over caches
void cpu_register_mlp(be_t *be);   // cpu_mlp.c: swiglu
void cpu_register_conv(be_t *be);  // cpu_conv.c: depthwise causal conv
void cpu_register_gdn(be_t *be);   // cpu_gdn.c: gates, chunked + recurrent gated delta rule
void cpu_register_ssd(be_t *be);   // cpu_ssd.c: Mamba-2 SSD
void cpu_register_mla(be_t *be);   // cpu_mla.c: MLA decode over the latent cache
void cpu_register_loss(be_t *be);  // cpu_loss.c: fused CE / KL over vocabulary tiles, ILD distance
void cpu_register_optim(be_t *be); // cpu_optim.c: sumsq, AdamW
void cpu_register_quant(be_t *be); // cpu_quant.c: products on quantised / bf16 weights

// Parallel regions cost microseconds to wake; below this much work (elements
// touched) a loop runs on the calling thread. Decode steps are made of many
// such small ops.
#define CPU_PAR_MIN (1 << 15)

// C = alpha op(A) op(B) + beta C (row-major, fp32) on OpenBLAS, which runs
// single-threaded (cpu_backend.c): C is cut into tiles of a fixed grid
// (GEMM_TILE_M x GEMM_TILE_N; one row: GEMV_TILE_N columns), one OpenBLAS
// call each, spread over the OpenMP threads. Every element so comes out of
// the same call whatever the thread count, and the results do not depend on
// --threads (OpenBLAS's own threads split a product by their count, and its
// kernels for the split's edges round differently: a 22-token prefill of the
// default model continued differently with 1 and 2 threads, 2026-12-08).
void cpu_sgemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
               const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

// p[u] = exp(p[u] - m) for u < n (m: their maximum), returning their sum in
// double: the softmax's numerator and denominator, shared by the attention
// ops so that every path rounds the same way. Four partial sums (element u
// into sum u % 4): one chain of dependent double additions bounded the
// attention's speed.
static inline double cpu_exp_shift(float *p, int64_t n, float m) {
    double s[4] = {0, 0, 0, 0};
    int64_t u = 0;
    for (; u + 4 <= n; u += 4)
        for (int j = 0; j < 4; j++) {
            p[u + j] = expf(p[u + j] - m);
            s[j] += p[u + j];
        }
    for (; u < n; u++) {
        p[u] = expf(p[u] - m);
        s[u % 4] += p[u];
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}
static inline float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// d silu(x)/dx = sigmoid(x) (1 + x (1 - sigmoid(x)))
static inline float cpu_dsilu(float x) {
    float s = cpu_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
// d softplus(x)/dx = sigmoid(x), and 1 in cpu_softplus's identity branch above 20
static inline float cpu_dsoftplus(float x) { return x > 20.0f ? 1.0f : cpu_sigmoid(x); }

// Temporaries of one op call (all of them in one block): from the scratch
// arena when it has room (the caller resets it), else from the heap, so an op
// never fails for want of scratch, whatever the sequence length. Taken and
// given back by the calling thread, outside parallel regions (the arena is not
// thread-safe); per-thread slices are carved from the block by thread number.
typedef struct {
    float *p;
    size_t mark;
    int heap;
} cpu_tmp_t;

// n floats, or NULL with the error slot set (naming `what`) when even the heap
// has none. Ops return void: on NULL they fill their outputs with NaN
// (cpu_fill_nan), so the failure cannot pass unnoticed.
float *cpu_tmp_take(be_t *be, cpu_tmp_t *t, int64_t n, const char *what);
void cpu_tmp_give(be_t *be, cpu_tmp_t *t);
// out [N, K] contiguous = x's rows (ldx apart) RMS-normalised with gain w: the
// input norm of the fused decode products (proj_swiglu, proj_rope_kv_append),
// by rmsnorm_fwd's own code, so that they match rmsnorm_fwd then the product.
void cpu_rows_rmsnorm(be_t *be, float *out, const float *x, int64_t ldx, const float *w, int64_t N, int64_t K,
                      float eps);
// p[0..n) = NaN; nothing when p is NULL (an optional output).
void cpu_fill_nan(float *p, int64_t n);
// The same on `cols` columns of `rows` rows ld apart (a strided output).
void cpu_fill_nan_rows(float *p, int64_t ld, int64_t rows, int64_t cols);
