// Dequantisation of the ggml block formats (layouts in docs/FORMATS.md and
// ../shared/spec/formats.md section 2.5). Each function turns n elements (a
// multiple of the block size) of one format into fp32.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "base/half.h"
#include "io/gguf.h"

static float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

static void deq_q4_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 18, y += 32) {
        float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0xf) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 20, y += 32) {
        float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(qs[j] & 0xf) * d + m;
            y[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q8_0(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, b += 34, y += 32) {
        float d = rd_f16(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++)
            y[j] = (float)qs[j] * d;
    }
}

// 6-bit scale and min of sub-block j packed into 12 bytes (Q4_K / Q5_K).
static void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q4_k(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 144) {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int c = 0; c < 4; c++) { // 4 chunks of 64: low nibbles then high nibbles
            uint8_t sc, m;
            k_scale_min(2 * c, scales, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            k_scale_min(2 * c + 1, scales, &sc, &m);
            float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(qs[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(qs[l] >> 4) - m2;
            qs += 32;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = rd_f16(b + 208);
        for (int h = 0; h < 2; h++) { // two halves of 128
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = (int)((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = (int)((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void ggml_dequant(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    switch (type) {
    case GGML_F32: memcpy(dst, b, (size_t)n * 4); break;
    case GGML_F16: f16_row_to_f32(b, dst, n); break;
    case GGML_BF16: bf16_row_to_f32(b, dst, n); break;
    case GGML_Q4_0: deq_q4_0(b, dst, n); break;
    case GGML_Q4_1: deq_q4_1(b, dst, n); break;
    case GGML_Q8_0: deq_q8_0(b, dst, n); break;
    case GGML_Q4_K: deq_q4_k(b, dst, n); break;
    case GGML_Q6_K: deq_q6_k(b, dst, n); break;
    default: memset(dst, 0, (size_t)n * 4); break; // callers check ggml_type_supported first
    }
}

// ---- quantisation (checkpoints stored in block formats) ----------------------
// Each block's scale is rounded to f16 first and the codes computed against
// the rounded scale, so the stored block reproduces x within half a step.

static void put_f16(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}

static void q_q8_0(const float *x, uint8_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, x += 32, b += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        put_f16(b, amax / 127.0f);
        float d = rd_f16(b), id = d > 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            float q = nearbyintf(x[j] * id);
            b[2 + j] = (uint8_t)(int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
        }
    }
}

// Q4_0: w = d (u - 8), u in [0, 16): the value of largest magnitude maps to
// code 0 (d takes its sign), so the other end reaches +7 d.
static void q_q4_0(const float *x, uint8_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, x += 32, b += 18) {
        float vmax = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > fabsf(vmax)) vmax = x[j];
        put_f16(b, vmax / -8.0f);
        float d = rd_f16(b), id = d != 0 ? 1.0f / d : 0.0f;
        uint8_t u[32];
        for (int j = 0; j < 32; j++) {
            float q = nearbyintf(x[j] * id) + 8.0f;
            u[j] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
        }
        for (int j = 0; j < 16; j++)
            b[2 + j] = (uint8_t)(u[j] | (u[j + 16] << 4));
    }
}

// Q4_1: w = d u + m, m the block's minimum, d = (max - min) / 15.
static void q_q4_1(const float *x, uint8_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i += 32, x += 32, b += 20) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; j++)
            lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
        put_f16(b, (hi - lo) / 15.0f);
        put_f16(b + 2, lo);
        float d = rd_f16(b), m = rd_f16(b + 2), id = d > 0 ? 1.0f / d : 0.0f;
        uint8_t u[32];
        for (int j = 0; j < 32; j++) {
            float q = nearbyintf((x[j] - m) * id);
            u[j] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
        }
        for (int j = 0; j < 16; j++)
            b[4 + j] = (uint8_t)(u[j] | (u[j + 16] << 4));
    }
}

int ggml_quantize(uint32_t type, const float *src, void *dst, int64_t n) {
    if (n % 32) return 0;
    switch (type) {
    case GGML_Q8_0: q_q8_0(src, dst, n); return 1;
    case GGML_Q4_0: q_q4_0(src, dst, n); return 1;
    case GGML_Q4_1: q_q4_1(src, dst, n); return 1;
    default: return 0;
    }
}

int ggml_type_from_name(const char *name) {
    static const uint32_t t[] = {GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16, GGML_F16, GGML_F32};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcasecmp(name, ggml_type_name(t[i]))) return (int)t[i];
    return -1;
}

int ggml_type_supported(uint32_t type) {
    switch (type) {
    case GGML_F32:
    case GGML_F16:
    case GGML_BF16:
    case GGML_Q4_0:
    case GGML_Q4_1:
    case GGML_Q8_0:
    case GGML_Q4_K:
    case GGML_Q6_K: return 1;
    default: return 0;
    }
}

int ggml_type_block(uint32_t type, int *blk, int *bytes) {
    int b = 0, s = 0;
    switch (type) {
    case GGML_F32: b = 1, s = 4; break;
    case GGML_F16: b = 1, s = 2; break;
    case GGML_BF16: b = 1, s = 2; break;
    case GGML_F64: b = 1, s = 8; break;
    case GGML_I8: b = 1, s = 1; break;
    case GGML_I16: b = 1, s = 2; break;
    case GGML_I32: b = 1, s = 4; break;
    case GGML_I64: b = 1, s = 8; break;
    case GGML_Q4_0: b = 32, s = 18; break;
    case GGML_Q4_1: b = 32, s = 20; break;
    case GGML_Q5_0: b = 32, s = 22; break;
    case GGML_Q5_1: b = 32, s = 24; break;
    case GGML_Q8_0: b = 32, s = 34; break;
    case GGML_Q8_1: b = 32, s = 36; break;
    case GGML_Q2_K: b = 256, s = 84; break;
    case GGML_Q3_K: b = 256, s = 110; break;
    case GGML_Q4_K: b = 256, s = 144; break;
    case GGML_Q5_K: b = 256, s = 176; break;
    case GGML_Q6_K: b = 256, s = 210; break;
    case GGML_Q8_K: b = 256, s = 292; break;
    default: return 0;
    }
    *blk = b;
    *bytes = s;
    return 1;
}

const char *ggml_type_name(uint32_t type) {
    switch (type) {
    case GGML_F32: return "F32";
    case GGML_F16: return "F16";
    case GGML_BF16: return "BF16";
    case GGML_F64: return "F64";
    case GGML_I8: return "I8";
    case GGML_I16: return "I16";
    case GGML_I32: return "I32";
    case GGML_I64: return "I64";
    case GGML_Q4_0: return "Q4_0";
    case GGML_Q4_1: return "Q4_1";
    case GGML_Q5_0: return "Q5_0";
    case GGML_Q5_1: return "Q5_1";
    case GGML_Q8_0: return "Q8_0";
    case GGML_Q8_1: return "Q8_1";
    case GGML_Q2_K: return "Q2_K";
    case GGML_Q3_K: return "Q3_K";
    case GGML_Q4_K: return "Q4_K";
    case GGML_Q5_K: return "Q5_K";
    case GGML_Q6_K: return "Q6_K";
    case GGML_Q8_K: return "Q8_K";
    default: return "unknown";
    }
}
