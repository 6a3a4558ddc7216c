// CPU products on weights kept in their GGUF block formats (Q4_0, Q4_1, Q8_0,
// Q4_K, Q6_K) or bf16: the activation blocks, the per-format dot kernels and
// the kernel sets among which the backend chooses at run time (cpu_quant.c:
// plain C, the reference; cpu_quant_avx2.c: AVX2 + FMA). An AVX-512 VNNI set
// (two blocks per register, vpdpbusd) measured 5-13% slower than the AVX2 one
// on the development VM, its per-block fp32 scale work the limit, so there is
// none (docs/PERFORMANCE.md). Block layouts: docs/FORMATS.md and io/quant.c.
#pragma once
#include <stdint.h>

#include "backend/backend.h"

// 32 activations rounded to int8: x[i] ~ d * q[i], |x[i] - d q[i]| <= d / 2,
// d = max |x| / 127; s = d * sum(q) (the offset terms of Q4_0 / Q4_1 / Q4_K
// need the block's sum). fp32 scales, not fp16: one rounding fewer than
// llama.cpp's Q8_0 / Q8_1 activations, at the same integer work.
typedef struct {
    float d, s;
    int8_t q[32];
} cpu_q8_t;

// out[j] = (weight row w) . (activation row j) for j < nx (1 <= nx <= CPU_QNX),
// activation rows ldx blocks of 32 apart; nb32 = row length / 32.
typedef void (*cpu_qdot_fn)(int64_t nb32, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out);
// bf16 weights take the fp32 activations as they are (ldx floats apart).
typedef void (*cpu_bdot_fn)(int64_t n, const uint16_t *w, const float *x, int64_t ldx, int nx, float *out);
// Activations n (a multiple of 32) floats -> n / 32 blocks.
typedef void (*cpu_quantize_fn)(const float *x, cpu_q8_t *q, int64_t n);

// Activation rows one weight row is dotted with at a time: the weight block
// is unpacked once for all of them (prefill).
#define CPU_QNX 4

typedef struct {
    const char *name;
    int (*probe)(void); // executes the set's instructions, returns 1; NULL: plain C
    cpu_qdot_fn q4_0, q4_1, q8_0, q4_k, q6_k;
    cpu_bdot_fn bf16;
    cpu_quantize_fn quantize;
} cpu_qkernels_t;

extern const cpu_qkernels_t cpu_qk_ref;  // plain C
extern const cpu_qkernels_t cpu_qk_avx2; // AVX2 + FMA

// 1 when this CPU runs the instructions of the kernel set: decided by
// executing them once under a SIGILL handler, because a virtual machine's
// cpuid can list extensions it then faults on. Cached after the first call.
int cpu_qk_runnable(const cpu_qkernels_t *k);
// The same without the cache (tests give it a set whose probe traps).
int cpu_qk_probe(const cpu_qkernels_t *k);
// The fastest runnable set (what the backend's qmatmul uses).
const cpu_qkernels_t *cpu_qk_best(void);
// The dot kernel of a ggml type in a set, NULL when the set has none.
cpu_qdot_fn cpu_qk_dot(const cpu_qkernels_t *k, uint32_t type);
// y[N, W->rows] = x[N, W->cols] W^T with the kernel set k; threads over
// output rows. q: scratch for the activation blocks (N * cols / 32 of them;
// unused for bf16).
void cpu_qmatmul_with(const cpu_qkernels_t *k, float *y, const float *x, const be_qmat_t *W, int64_t N, cpu_q8_t *q);
// 6-bit scale and min of sub-block j (< 8) of a Q4_K super-block's 12 packed bytes.
void cpu_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m);
