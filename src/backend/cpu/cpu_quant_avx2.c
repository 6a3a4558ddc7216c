// AVX2 + FMA kernels of cpu_quant.h (compiled with -mavx2 -mfma -mf16c
// whatever the build's -march; used only after cpu_qk_runnable said yes).
// Same arithmetic as the reference in cpu_quant.c: exact integer sums per
// 32-value block (maddubs: unsigned weight bytes x signed activation bytes
// -> int16 pairs; madd with ones -> int32), one fp32 FMA per block.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_quant.h"

#define AVX2 __attribute__((always_inline)) static inline
// The loops over the NX activation rows carry `#pragma GCC unroll 4`: -O2
// leaves them rolled, and then each row's accumulator lives in memory (a
// store-to-load chain per block, half the prefill speed).

// Weight bytes ahead to prefetch: decode streams each thread's rows once, and
// on this VM the hardware prefetcher alone left the kernels waiting on the
// first touch of each cache line (bench_qmatmul, N = 1).
#ifndef PREFETCH
#define PREFETCH 2048
#endif

AVX2 float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AVX2 float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles -> 32 bytes: the low nibbles, then the high ones.
AVX2 __m256i nibbles16(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// 8 int32 partial sums of u (unsigned, < 128 per pair sum range) times q (signed), as floats.
AVX2 __m256 dot_us(__m256i u, __m256i q) {
    __m256i p = _mm256_maddubs_epi16(u, q);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

AVX2 __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// One 32-value block i of Q4_0 (q40) / Q4_1 against NX activation rows,
// into accumulator slot `a` (0 or 1, a constant after inlining).
AVX2 void q4_step(const uint8_t *w, int64_t i, const cpu_q8_t *x, int64_t ldx, const int NX, const int q40,
                  __m256 acc[][2], const int a, float *macc) {
    float dw = f16(w), mw = q40 ? -8.0f * dw : f16(w + 2);
    __m256i u = nibbles16(w + (q40 ? 2 : 4));
    __m256 dwv = _mm256_set1_ps(dw); // once per block; each row's dx comes as a broadcast load (no shuffle uop)
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++) {
        const cpu_q8_t *xb = &x[j * ldx + i];
        __m256 s = _mm256_mul_ps(dot_us(u, ld(xb->q)), _mm256_broadcast_ss(&xb->d));
        acc[j][a] = _mm256_fmadd_ps(dwv, s, acc[j][a]);
        macc[j] += mw * xb->s;
    }
}

// Q4_0 and Q4_1 with NX activation rows. Each row takes two accumulators,
// over even and odd blocks, so that one row's FMA chain (decode) does not
// serialise the loop; with several rows they are not needed for speed, but
// they keep every row's sum in the same order whatever NX is: a sequence's
// logits in a batched decode step (several requests at once) are then
// bitwise those it gets alone.
AVX2 void q4(int64_t nb, const uint8_t *w, const cpu_q8_t *x, int64_t ldx, const int NX, const int q40, float *out) {
    __m256 acc[CPU_QNX][2];
    float macc[CPU_QNX];
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps(), macc[j] = 0.0f;
    const int bs = q40 ? 18 : 20;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, w += 2 * bs) {
        _mm_prefetch((const char *)w + PREFETCH, _MM_HINT_T0);
        q4_step(w, i, x, ldx, NX, q40, acc, 0, macc);
        q4_step(w + bs, i + 1, x, ldx, NX, q40, acc, 1, macc);
    }
    if (i < nb) q4_step(w, i, x, ldx, NX, q40, acc, 0, macc);
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        out[j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1])) + macc[j];
}

AVX2 void q8_step(const uint8_t *w, int64_t i, const cpu_q8_t *x, int64_t ldx, const int NX, __m256 acc[][2],
                  const int a) {
    float dw = f16(w);
    __m256i v = ld(w + 2), av = _mm256_sign_epi8(v, v); // |w| unsigned, its sign moved onto x
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++) {
        const cpu_q8_t *xb = &x[j * ldx + i];
        __m256 s = dot_us(av, _mm256_sign_epi8(ld(xb->q), v));
        acc[j][a] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), s, acc[j][a]);
    }
}

// Q8_0: two accumulators per row as q4.
AVX2 void q8(int64_t nb, const uint8_t *w, const cpu_q8_t *x, int64_t ldx, const int NX, float *out) {
    __m256 acc[CPU_QNX][2];
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, w += 68) {
        _mm_prefetch((const char *)w + PREFETCH, _MM_HINT_T0);
        q8_step(w, i, x, ldx, NX, acc, 0);
        q8_step(w + 34, i + 1, x, ldx, NX, acc, 1);
    }
    if (i < nb) q8_step(w, i, x, ldx, NX, acc, 0);
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        out[j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
}

AVX2 void q4k(int64_t nb, const uint8_t *w, const cpu_q8_t *x, int64_t ldx, const int NX, float *out) {
    __m256 acc[CPU_QNX][2];
    float macc[CPU_QNX];
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps(), macc[j] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i += 8, w += 144) {
        float d = f16(w), dmin = f16(w + 2);
        float dsc[8], dm[8];
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            cpu_q4k_scale_min(s, w + 4, &sc, &m);
            dsc[s] = d * (float)sc, dm[s] = dmin * (float)m;
        }
        for (int c = 0; c < 4; c++) {
            __m256i v = ld(w + 16 + 32 * c);
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
            for (int j = 0; j < NX; j++) {
                const cpu_q8_t *xb = &x[j * ldx + i + 2 * c];
                __m256 s0 = dot_us(lo, ld(xb[0].q)), s1 = dot_us(hi, ld(xb[1].q));
                acc[j][0] = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c] * xb[0].d), s0, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * c + 1] * xb[1].d), s1, acc[j][1]);
                macc[j] -= dm[2 * c] * xb[0].s + dm[2 * c + 1] * xb[1].s;
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        out[j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1])) + macc[j];
}

AVX2 void q6k(int64_t nb, const uint8_t *w, const cpu_q8_t *x, int64_t ldx, const int NX, float *out) {
    __m256 acc[CPU_QNX][2];
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i += 8, w += 210) {
        float d = f16(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            __m256i l0 = ld(w + 64 * h), l1 = ld(w + 64 * h + 32), qh = ld(w + 128 + 32 * h);
            // the four 32-value groups of this half, 6-bit unsigned (q + 32)
            __m256i u[4];
            u[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
            u[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
            u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
            for (int k = 0; k < 4; k++) {
                const int8_t *s = sc + 8 * h + 2 * k;
                // int16 scales: the first 16 values' in the low lane, the next 16's in the high one
                __m256i scv =
                    _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(s[0])), _mm_set1_epi16(s[1]), 1);
#pragma GCC unroll 4
                for (int j = 0; j < NX; j++) {
                    const cpu_q8_t *xb = &x[j * ldx + i + 4 * h + k];
                    __m256i q = ld(xb->q);
                    // (u - 32) q per pair: 63 * 127 * 2 and 32 * 127 * 2 both fit int16
                    __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u[k], q), _mm256_maddubs_epi16(k32, q));
                    __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, scv));
                    acc[j][k & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), f, acc[j][k & 1]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        out[j] = hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
}

AVX2 void bf16(int64_t n, const uint16_t *w, const float *x, int64_t ldx, const int NX, float *out) {
    __m256 acc[CPU_QNX];
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(w + i));
        __m256 wf = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#pragma GCC unroll 4
        for (int j = 0; j < NX; j++)
            acc[j] = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + j * ldx + i), acc[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NX; j++) {
        float s = hsum(acc[j]);
        for (int64_t t = i; t < n; t++) {
            uint32_t u = (uint32_t)w[t] << 16;
            float f;
            memcpy(&f, &u, 4);
            s += f * x[j * ldx + t];
        }
        out[j] = s;
    }
}

// One entry per format: the row count as a compile-time constant, so each
// NX variant is unrolled on its own.
#define DISPATCH(call)                                                                                                 \
    switch (nx) {                                                                                                      \
    case 1: call(1); break;                                                                                            \
    case 2: call(2); break;                                                                                            \
    case 3: call(3); break;                                                                                            \
    default: call(4); break;                                                                                           \
    }

static void k_q4_0(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
#define C(n) q4(nb, w, x, ldx, n, 1, out)
    DISPATCH(C)
#undef C
}
static void k_q4_1(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
#define C(n) q4(nb, w, x, ldx, n, 0, out)
    DISPATCH(C)
#undef C
}
static void k_q8_0(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
#define C(n) q8(nb, w, x, ldx, n, out)
    DISPATCH(C)
#undef C
}
static void k_q4_k(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
#define C(n) q4k(nb, w, x, ldx, n, out)
    DISPATCH(C)
#undef C
}
static void k_q6_k(int64_t nb, const void *w, const cpu_q8_t *x, int64_t ldx, int nx, float *out) {
#define C(n) q6k(nb, w, x, ldx, n, out)
    DISPATCH(C)
#undef C
}
static void k_bf16(int64_t n, const uint16_t *w, const float *x, int64_t ldx, int nx, float *out) {
#define C(m) bf16(n, w, x, ldx, m, out)
    DISPATCH(C)
#undef C
}

// Same rounding as the reference (x * (1 / d), nearest even), so both sets
// see identical activation bytes.
static void k_quantize(const float *x, cpu_q8_t *q, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++, x += 32, q++) {
        __m256 v[4], mx = _mm256_setzero_ps(), z = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
            z = _mm256_add_ps(z, _mm256_mul_ps(v[k], _mm256_setzero_ps())); // NaN unless every x is finite
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float d = hsum(z) == 0.0f ? _mm_cvtss_f32(m) / 127.0f : NAN, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256i i32[4];
        for (int k = 0; k < 4; k++)
            i32[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)),
                                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        // int32 -> int8 keeping the order: packs interleave 128-bit lanes, the permute undoes it
        __m256i s16 = _mm256_packs_epi32(i32[0], i32[1]), t16 = _mm256_packs_epi32(i32[2], i32[3]);
        __m256i s8 = _mm256_packs_epi16(s16, t16);
        s8 = _mm256_permutevar8x32_epi32(s8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q->q, s8);
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_hadd_epi32(s, s);
        s = _mm_hadd_epi32(s, s);
        q->d = d;
        q->s = d * (float)_mm_cvtsi128_si32(s);
    }
}

static int k_probe(void) {
    volatile float f = 1.5f;                                     // not folded at compile time
    __m256 s = dot_us(_mm256_set1_epi8(1), _mm256_set1_epi8(2)); // 8 lanes of 4 * 1 * 2
    __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(f), _mm256_set1_ps(2.0f), s);
    return hsum(b) == 8.0f * 11.0f && _cvtsh_ss(0x3c00) == 1.0f;
}

const cpu_qkernels_t cpu_qk_avx2 = {"avx2", k_probe, k_q4_0, k_q4_1, k_q8_0, k_q4_k, k_q6_k, k_bf16, k_quantize};
