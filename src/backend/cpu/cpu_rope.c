// Rotary embeddings. Tables cos/sin [n_pos, dr/2] are precomputed by model/rope.c.
#include <string.h>

#include "backend/cpu/cpu.h"

// One head vector of dr values. sign = +1 forward, -1 backward (the transpose
// of a rotation is the rotation by the opposite angle; for the interleaved
// layout the transpose also undoes the de-interleaving permutation).
static void rope_vec(float *x, const float *c, const float *s, int dr, int style, float sign) {
    int half = dr / 2;
    float tmp[512];
    if (style == ROPE_NEOX) {
        for (int i = 0; i < half; i++) {
            float x0 = x[i], x1 = x[i + half], sn = sign * s[i];
            x[i] = x0 * c[i] - x1 * sn;
            x[i + half] = x1 * c[i] + x0 * sn;
        }
    } else if (sign > 0) { // pairs (2j, 2j+1) -> outputs (j, j + half)
        for (int j = 0; j < half; j++) {
            float x0 = x[2 * j], x1 = x[2 * j + 1];
            tmp[j] = x0 * c[j] - x1 * s[j];
            tmp[j + half] = x1 * c[j] + x0 * s[j];
        }
        memcpy(x, tmp, (size_t)dr * sizeof(float));
    } else { // gradient: inputs (j, j + half) -> pairs (2j, 2j+1)
        for (int j = 0; j < half; j++) {
            float g0 = x[j], g1 = x[j + half];
            tmp[2 * j] = g0 * c[j] + g1 * s[j];
            tmp[2 * j + 1] = -g0 * s[j] + g1 * c[j];
        }
        memcpy(x, tmp, (size_t)dr * sizeof(float));
    }
}

static void rope_apply(void *x_, int64_t ld, int64_t hs, const int32_t *pos, const float *cos, const float *sin,
                       int64_t N, int nh, int dr, int style, float sign) {
    float *x = x_;
    int half = dr / 2;
#pragma omp parallel for schedule(static) if (N * nh * dr > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *c = cos + (int64_t)pos[n] * half, *s = sin + (int64_t)pos[n] * half;
        for (int h = 0; h < nh; h++)
            rope_vec(x + n * ld + h * hs, c, s, dr, style, sign);
    }
}

static void cpu_rope_fwd(be_t *be, void *x, int64_t ld, int64_t hs, const int32_t *pos, const float *cos,
                         const float *sin, int64_t N, int nh, int dr, int style) {
    rope_apply(x, ld, hs, pos, cos, sin, N, nh, dr, style, 1.0f);
}

static void cpu_rope_bwd(be_t *be, void *dx, int64_t ld, int64_t hs, const int32_t *pos, const float *cos,
                         const float *sin, int64_t N, int nh, int dr, int style) {
    rope_apply(dx, ld, hs, pos, cos, sin, N, nh, dr, style, -1.0f);
}

// rope_vec over q's heads in place, and over each row's new K cache entry
// after the copy, so that k is not written.
static void cpu_rope_kv_append(be_t *be, void *q_, int64_t ldq, const void *k_, int64_t ldk, const void *v_,
                               int64_t ldv, const int32_t *pos, const float *cos, const float *sin, void *const *k_rows,
                               void *const *v_rows, be_pages_t pg, int N, int H, int Hkv, int dh) {
    float *q = q_;
    const float *k = k_, *v = v_;
    int64_t kw = (int64_t)Hkv * dh;
    int half = dh / 2;
    for (int r = 0; r < N; r++) {
        const float *c = cos + (int64_t)pos[r] * half, *s = sin + (int64_t)pos[r] * half;
        int64_t row = be_page_row(pg, r, pos[r]);
        float *kd = (float *)k_rows[r] + row * kw, *vd = (float *)v_rows[r] + row * kw;
        for (int h = 0; h < H; h++)
            rope_vec(q + r * ldq + (int64_t)h * dh, c, s, dh, ROPE_NEOX, 1.0f);
        memcpy(kd, k + r * ldk, (size_t)kw * sizeof(float));
        for (int h = 0; h < Hkv; h++)
            rope_vec(kd + (int64_t)h * dh, c, s, dh, ROPE_NEOX, 1.0f);
        memcpy(vd, v + r * ldv, (size_t)kw * sizeof(float));
    }
}

// The reference of the fused decode op: x's rows normed into a temporary
// (with a gain xw), the product into a temporary [N, q | k | v],
// rope_kv_append from it, then the rotated q copied out.
static void cpu_proj_rope_kv_append(be_t *be, void *q_, int64_t ldq, const void *x, int64_t ldx, const void *xw,
                                    float eps, const void *W, const int32_t *pos, const float *cos, const float *sin,
                                    void *const *k_rows, void *const *v_rows, be_pages_t pg, int N, int64_t K, int H,
                                    int Hkv, int dh) {
    if (N <= 0) return;
    float *q = q_;
    const int64_t qw = (int64_t)H * dh, kw = (int64_t)Hkv * dh, P = qw + 2 * kw;
    cpu_tmp_t tmp;
    float *qkv = cpu_tmp_take(be, &tmp, N * P + (xw ? N * K : 0), "proj_rope_kv_append");
    if (!qkv) {
        cpu_fill_nan_rows(q, ldq, N, qw);
        return;
    }
    if (xw) {
        float *xn = qkv + N * P;
        cpu_rows_rmsnorm(be, xn, x, ldx, xw, N, K, eps);
        x = xn, ldx = K;
    }
    be->gemm(be, 0, 1, N, P, K, 1.0f, x, ldx, W, K, 0.0f, qkv, P);
    cpu_rope_kv_append(be, qkv, P, qkv + qw, P, qkv + qw + kw, P, pos, cos, sin, k_rows, v_rows, pg, N, H, Hkv, dh);
    for (int r = 0; r < N; r++)
        memcpy(q + r * ldq, qkv + r * P, (size_t)qw * sizeof(float));
    cpu_tmp_give(be, &tmp);
}

static void cpu_mla_rope_append(be_t *be, void *q_, int64_t ldq, int64_t hs, const void *c_, int64_t ldc,
                                const void *kpe_, int64_t ldk, const int32_t *pos, const float *cos, const float *sin,
                                void *const *rows, be_pages_t pg, int N, int H, int r_kv, int dr) {
    float *q = q_;
    const float *c = c_, *kpe = kpe_;
    int half = dr / 2;
    for (int r = 0; r < N; r++) {
        const float *cr = cos + (int64_t)pos[r] * half, *sr = sin + (int64_t)pos[r] * half;
        float *row = (float *)rows[r] + be_page_row(pg, r, pos[r]) * (r_kv + dr);
        for (int h = 0; h < H; h++)
            rope_vec(q + r * ldq + (int64_t)h * hs, cr, sr, dr, ROPE_INTERLEAVED, 1.0f);
        memcpy(row, c + r * ldc, (size_t)r_kv * sizeof(float));
        memcpy(row + r_kv, kpe + r * ldk, (size_t)dr * sizeof(float));
        rope_vec(row + r_kv, cr, sr, dr, ROPE_INTERLEAVED, 1.0f);
    }
}

// The reference of the fused MLA op: the product straight into q (q is its
// own buffer, so no temporary is needed), then mla_rope_append from it.
static void cpu_proj_mla_rope_append(be_t *be, void *q_, int64_t ldq, const void *x, int64_t ldx, const void *W,
                                     const void *c, int64_t ldc, const void *kpe, int64_t ldk, const int32_t *pos,
                                     const float *cos, const float *sin, void *const *rows, be_pages_t pg, int N,
                                     int64_t K, int H, int qd, int r_kv, int dr) {
    if (N <= 0) return;
    float *q = q_;
    be->gemm(be, 0, 1, N, (int64_t)H * qd, K, 1.0f, x, ldx, W, K, 0.0f, q, ldq);
    cpu_mla_rope_append(be, q + (qd - dr), ldq, qd, c, ldc, kpe, ldk, pos, cos, sin, rows, pg, N, H, r_kv, dr);
}

void cpu_register_rope(be_t *be) {
    be->rope_kv_append = cpu_rope_kv_append;
    be->proj_rope_kv_append = cpu_proj_rope_kv_append;
    be->mla_rope_append = cpu_mla_rope_append;
    be->proj_mla_rope_append = cpu_proj_mla_rope_append;
    be->rope_fwd = cpu_rope_fwd;
    be->rope_bwd = cpu_rope_bwd;
}
