// Matrix products on weights kept in their GGUF block formats: the plain-C
// reference kernels, the run-time choice among the kernel sets, and the
// product itself: with few activation rows (decode) the rows are quantised
// once per call and the kernels stream the blocks, threads over output rows
// (~100 MB of Q4_1 / Q8_0 per token for the default model instead of 538 MB
// of fp32); with many (prefill) the matrix is dequantised for sgemm.
//
// The arithmetic, the same in every kernel set: a weight block of 32 values
// w_i = dw * u_i + mw (Q4_0: u_i in [0,16), mw = -8 dw; Q4_1: u_i in [0,16);
// Q8_0: u_i in [-128,128), mw = 0) against activations x_i ~ dx * q_i gives
//   sum_i w_i x_i ~ dw dx sum_i u_i q_i + mw (dx sum_i q_i) = dw dx isum + mw s,
// with isum an exact integer sum. The K formats do the same per 32-value
// sub-block with their own sub-scales. So kernels differ from each other only
// in the order of the fp32 additions, and from the dequantised product only
// by the rounding of x to 8 bits: |error| <= sum over blocks of
// (dx / 2) sum_i |w_i| (tests/backend/test_quant_ops.c checks that bound).
#include <omp.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_quant.h"
#include "base/err.h"
#include "base/half.h"
#include "io/gguf.h"

static float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

// ---- reference kernels ------------------------------------------------------

// A block holding a NaN or infinity gets codes 0 and scale NaN, so the
// products it enters are NaN as in fp32 (8-bit codes cannot carry it, and a
// broken activation must not turn into finite numbers).
static void ref_quantize(const float *x, cpu_q8_t *q, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, q++) {
        float amax = 0.0f, z = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i])), z += x[i] * 0.0f; // z: NaN unless every x is finite
        if (z != 0.0f) {
            memset(q->q, 0, sizeof q->q);
            q->d = q->s = NAN;
            continue;
        }
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            int v = (int)nearbyintf(x[i] * id);
            q->q[i] = (int8_t)v;
            sum += v;
        }
        q->d = d;
        q->s = d * (float)sum;
    }
}

// Q4_0 / Q4_1: 16 bytes of nibbles, values j and j + 16 in byte j.
static float ref_q4_block(const uint8_t *qs, float dw, float mw, const cpu_q8_t *x) {
    int isum = 0;
    for (int j = 0; j < 16; j++)
        isum += (qs[j] & 0xf) * x->q[j] + (qs[j] >> 4) * x->q[j + 16];
    return dw * x->d * (float)isum + mw * x->s;
}

static void ref_q4_0(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i++, b += 18) {
            float d = rd_f16(b);
            acc += ref_q4_block(b + 2, d, -8.0f * d, &x[j * ldx + i]);
        }
        out[j] = acc;
    }
}

static void ref_q4_1(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i++, b += 20)
            acc += ref_q4_block(b + 4, rd_f16(b), rd_f16(b + 2), &x[j * ldx + i]);
        out[j] = acc;
    }
}

static void ref_q8_0(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i++, b += 34) {
            const int8_t *qw = (const int8_t *)(b + 2);
            const cpu_q8_t *xb = &x[j * ldx + i];
            int isum = 0;
            for (int k = 0; k < 32; k++)
                isum += qw[k] * xb->q[k];
            acc += rd_f16(b) * xb->d * (float)isum;
        }
        out[j] = acc;
    }
}

// 6-bit scale and min of sub-block j of a Q4_K super-block (12 packed bytes).
void cpu_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q4_K super-block of 256: d, dmin (f16), 12 bytes of scales / mins, 128 of
// nibbles; 64-value chunk c holds sub-block 2c in the low nibbles of its 32
// bytes and 2c + 1 in the high ones. w = d sc u - dmin m.
static void ref_q4_k(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const cpu_q8_t *xb = x + j * ldx;
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i += 8, b += 144, xb += 8) {
            float d = rd_f16(b), dmin = rd_f16(b + 2);
            const uint8_t *qs = b + 16;
            for (int s = 0; s < 8; s++) {
                uint8_t sc, m;
                cpu_q4k_scale_min(s, b + 4, &sc, &m);
                const uint8_t *q = qs + 32 * (s / 2);
                int shift = 4 * (s & 1), isum = 0;
                for (int k = 0; k < 32; k++)
                    isum += ((q[k] >> shift) & 0xf) * xb[s].q[k];
                acc += d * (float)sc * xb[s].d * (float)isum - dmin * (float)m * xb[s].s;
            }
        }
        out[j] = acc;
    }
}

// Q6_K super-block of 256: ql[128] (low 4 bits), qh[64] (high 2 bits),
// int8 scales[16] (one per 16 values), d (f16); w = d sc (q - 32). Within
// each half of 128, value 32k + l (k < 4, l < 32) is nibble k / 2 of
// ql[l + 32 (k & 1)] with bits 2k..2k+1 of qh[l], scale sc[2k + l / 16].
static void ref_q6_k(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const cpu_q8_t *xb = x + j * ldx;
        float acc = 0.0f;
        for (int64_t i = 0; i < nb; i += 8, b += 210, xb += 8) {
            float d = rd_f16(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
                    const cpu_q8_t *xs = &xb[4 * h + k];
                    int part[2] = {0, 0};
                    for (int l = 0; l < 32; l++) {
                        int q = ((ql[l] >> (4 * (k / 2))) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
                        part[l / 16] += (q - 32) * xs->q[l];
                    }
                    int isum = sc[8 * h + 2 * k] * part[0] + sc[8 * h + 2 * k + 1] * part[1];
                    acc += d * xs->d * (float)isum;
                }
        }
        out[j] = acc;
    }
}

static void ref_bf16(int64_t n, const uint16_t *w, const float *x, int64_t ldx, int nx, float *out) {
    for (int j = 0; j < nx; j++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++)
            acc += bf16_to_f32(w[i]) * x[j * ldx + i];
        out[j] = acc;
    }
}

const cpu_qkernels_t cpu_qk_ref = {"c", NULL, ref_q4_0, ref_q4_1, ref_q8_0, ref_q4_k, ref_q6_k, ref_bf16, ref_quantize};

// ---- choosing a kernel set ----------------------------------------------------

static sigjmp_buf probe_jmp;
static void probe_sigill(int sig) {
    (void)sig;
    siglongjmp(probe_jmp, 1);
}

// Runs k->probe (instructions of the set) with SIGILL caught: the answer of
// the hardware itself, where cpuid (what the compiler's __builtin_cpu_supports
// reads) can claim extensions a virtual machine then traps on.
int cpu_qk_probe(const cpu_qkernels_t *k) {
    if (!k->probe) return 1;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = probe_sigill;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGILL, &sa, &old) != 0) return 0;
    volatile int ok = 0; // set between sigsetjmp and a possible longjmp
    if (sigsetjmp(probe_jmp, 1) == 0) ok = k->probe() == 1;
    sigaction(SIGILL, &old, NULL);
    return ok;
}

// Called from the thread that creates a backend (or a test), never from
// inside a parallel region: the cache needs no lock.
int cpu_qk_runnable(const cpu_qkernels_t *k) {
    static const cpu_qkernels_t *const sets[] = {&cpu_qk_ref, &cpu_qk_avx2};
    static int known[2]; // per set: 0 unknown, 1 runnable, 2 not
    for (int i = 0; i < 2; i++)
        if (sets[i] == k) {
            if (!known[i]) known[i] = cpu_qk_probe(k) ? 1 : 2;
            return known[i] == 1;
        }
    return cpu_qk_probe(k);
}

const cpu_qkernels_t *cpu_qk_best(void) {
    if (cpu_qk_runnable(&cpu_qk_avx2)) return &cpu_qk_avx2;
    return &cpu_qk_ref;
}

cpu_qdot_fn cpu_qk_dot(const cpu_qkernels_t *k, uint32_t type) {
    switch (type) {
    case GGML_Q4_0: return k->q4_0;
    case GGML_Q4_1: return k->q4_1;
    case GGML_Q8_0: return k->q8_0;
    case GGML_Q4_K: return k->q4_k;
    case GGML_Q6_K: return k->q6_k;
    default: return NULL;
    }
}

// ---- the product --------------------------------------------------------------

// Output rows per task: enough tasks for every thread on the smallest
// matrices (192 rows), few enough weight bytes per task (16 rows of 576 Q4_1
// values: 5.8 KB) to stay in L1 while every activation row passes over them.
#define ROW_TILE 16

void cpu_qmatmul_with(const cpu_qkernels_t *k, float *y, const float *x, const be_qmat_t *W, int64_t N, cpu_q8_t *q) {
    int64_t rows = W->rows, cols = W->cols, nb = cols / 32;
    const uint8_t *wd = W->data;
    int par = rows * cols * (N < 4 ? N : 4) >= CPU_PAR_MIN;
    if (W->type == GGML_BF16) {
#pragma omp parallel for schedule(static) if (par)
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_TILE)
            for (int64_t t0 = 0; t0 < N; t0 += CPU_QNX) {
                int nx = N - t0 < CPU_QNX ? (int)(N - t0) : CPU_QNX;
                for (int64_t r = r0; r < r0 + ROW_TILE && r < rows; r++) {
                    float o[CPU_QNX];
                    k->bf16(cols, (const uint16_t *)(wd + r * W->row_bytes), x + t0 * cols, cols, nx, o);
                    for (int j = 0; j < nx; j++)
                        y[(t0 + j) * rows + r] = o[j];
                }
            }
        return;
    }
    cpu_qdot_fn dot = cpu_qk_dot(k, W->type);
#pragma omp parallel for schedule(static) if (N * cols > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        k->quantize(x + n * cols, q + n * nb, cols);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_TILE)
        for (int64_t t0 = 0; t0 < N; t0 += CPU_QNX) {
            int nx = N - t0 < CPU_QNX ? (int)(N - t0) : CPU_QNX;
            for (int64_t r = r0; r < r0 + ROW_TILE && r < rows; r++) {
                float o[CPU_QNX];
                dot(nb, wd + r * W->row_bytes, q + t0 * nb, nb, nx, o);
                for (int j = 0; j < nx; j++)
                    y[(t0 + j) * rows + r] = o[j];
            }
        }
}

// From this many activation rows on (prefill), a product dequantises the
// matrix, up to SGEMM_PANEL_FLOATS of it at a time, and runs OpenBLAS's sgemm:
// measured on the default model's matrices (2 threads, 256 rows), sgemm's
// AVX-512 FMA kernels plus the dequantisation beat the 8-bit kernels
// (cpu_qmatmul_with) by ~1.4x, and the products are then exact (no rounding
// of the activations). Decode (one row per sequence) streams the blocks.
#define QMM_SGEMM_MIN 16
#define SGEMM_PANEL_FLOATS ((int64_t)1 << 23) // 32 MB: every matrix of a 1B model in one panel

static void qmatmul_sgemm(be_t *be, float *y, const float *x, const be_qmat_t *W, int64_t N) {
    int64_t rows = W->rows, cols = W->cols;
    int64_t prow = SGEMM_PANEL_FLOATS / cols < rows ? SGEMM_PANEL_FLOATS / cols : rows;
    if (prow < 1) prow = 1;
    cpu_tmp_t t;
    float *panel = cpu_tmp_take(be, &t, prow * cols, "qmatmul (dequantised panel)");
    if (!panel) {
        cpu_fill_nan(y, N * rows);
        return;
    }
    const uint8_t *wd = W->data;
    for (int64_t r0 = 0; r0 < rows; r0 += prow) {
        int64_t n = rows - r0 < prow ? rows - r0 : prow;
#pragma omp parallel for schedule(static) if (n * cols > CPU_PAR_MIN)
        for (int64_t r = 0; r < n; r++)
            ggml_dequant(W->type, wd + (r0 + r) * W->row_bytes, panel + r * cols, cols);
        cpu_sgemm(0, 1, N, n, cols, 1.0f, x, cols, panel, cols, 0.0f, y + r0, rows);
    }
    cpu_tmp_give(be, &t);
}

static void cpu_qmatmul(be_t *be, void *y, const void *x, const be_qmat_t *W, int64_t N) {
    const cpu_qkernels_t *k = be->impl ? be->impl : &cpu_qk_ref;
    int blk, bytes;
    if (W->type != GGML_BF16 && (!cpu_qk_dot(k, W->type) || !ggml_type_block(W->type, &blk, &bytes) || blk == 1 ||
                                 W->cols % 32 || W->cols % blk)) {
        err_set(ERR_UNSUP, "cpu qmatmul: weights of type %s (%lld columns) are not supported", ggml_type_name(W->type),
                (long long)W->cols);
        cpu_fill_nan(y, N * W->rows);
        return;
    }
    if (N >= QMM_SGEMM_MIN) {
        qmatmul_sgemm(be, y, x, W, N);
        return;
    }
    cpu_tmp_t t = {0};
    cpu_q8_t *q = NULL;
    if (W->type != GGML_BF16) {
        // cpu_tmp_take counts floats: a block is 10 of them.
        q = (cpu_q8_t *)cpu_tmp_take(be, &t, N * (W->cols / 32) * (int64_t)(sizeof(cpu_q8_t) / sizeof(float)),
                                     "qmatmul");
        if (!q) {
            cpu_fill_nan(y, N * W->rows);
            return;
        }
    }
    cpu_qmatmul_with(k, y, x, W, N, q);
    if (q) cpu_tmp_give(be, &t);
}

// The reference of the fused decode op: x's rows normed (or SwiGLU(x, xu))
// into a temporary, the product, then the add.
static void cpu_qproj(be_t *be, void *y, void *res, const void *x, const void *xu, int64_t ldx, const void *xw,
                      float eps, const be_qmat_t *W, int64_t N) {
    const int64_t K = W->cols, R = W->rows;
    if (N <= 0 || R <= 0) return;
    if (xu && xw) {
        err_set(ERR_INPUT, "cpu qproj: a norm and SwiGLU both on the input");
        cpu_fill_nan(res ? res : y, N * R);
        return;
    }
    cpu_tmp_t tn = {0}, ty = {0};
    const float *in = x;
    const int staged = xw || xu || ldx != K;
    float *out = res ? cpu_tmp_take(be, &ty, N * R, "qproj") : y;
    float *xn = staged ? cpu_tmp_take(be, &tn, N * K, "qproj") : NULL;
    if (!out || (staged && !xn)) {
        cpu_fill_nan(res ? res : y, N * R);
    } else {
        if (xw)
            cpu_rows_rmsnorm(be, xn, x, ldx, xw, N, K, eps);
        else if (xu)
            be->swiglu_fwd(be, xn, x, xu, ldx, N, K);
        else if (xn)
            for (int64_t n = 0; n < N; n++)
                memcpy(xn + n * K, (const float *)x + n * ldx, (size_t)K * sizeof(float));
        if (xn) in = xn;
        be->qmatmul(be, out, in, W, N);
        if (res) be->add(be, res, out, N * R);
    }
    if (xn) cpu_tmp_give(be, &tn);
    if (res && out) cpu_tmp_give(be, &ty);
}

static void cpu_qembed_fwd(be_t *be, void *out_, const be_qmat_t *W, const int32_t *ids, int64_t N) {
    float *out = out_;
#pragma omp parallel for schedule(static) if (N * W->cols > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        ggml_dequant(W->type, (const uint8_t *)W->data + (size_t)ids[n] * W->row_bytes, out + n * W->cols, W->cols);
}

void cpu_register_quant(be_t *be) {
    be->impl = (void *)cpu_qk_best();
    be->qmatmul = cpu_qmatmul;
    be->qproj = cpu_qproj;
    be->qembed_fwd = cpu_qembed_fwd;
}
