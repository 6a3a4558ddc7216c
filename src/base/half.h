// IEEE fp16 and bfloat16 <-> fp32 conversions (round to nearest even), one
// value at a time and in rows.
#pragma once
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ffu;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)h;
}

// Rows of n values. The 16-bit side may sit at any byte offset (file data:
// safetensors tensors, GGUF rows), so it is read and written with memcpy. The
// callers parallelise over rows.
static inline void f16_row_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
    }
}

static inline void bf16_row_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *p = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
    }
}

static inline void f32_row_to_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = (uint8_t *)dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = f32_to_f16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

static inline void f32_row_to_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = (uint8_t *)dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = f32_to_bf16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}
