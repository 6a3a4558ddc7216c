// RMSNorm, gated RMSNorm (GDN and Mamba-2 variants), L2 norm: forward and backward.
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

static void cpu_rmsnorm_fwd(be_t *be, void *out_, float *rstd, const void *x_, const void *w_, int64_t N, int d,
                            float eps) {
    float *out = out_;
    const float *x = x_, *w = w_;
#pragma omp parallel for schedule(static) if (N * d > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * d;
        float *o = out + n * d;
        double ss = 0;
        for (int i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        float r = 1.0f / sqrtf((float)(ss / d) + eps);
        for (int i = 0; i < d; i++)
            o[i] = xr[i] * r * w[i];
        if (rstd) rstd[n] = r;
    }
}

void cpu_rows_rmsnorm(be_t *be, float *out, const float *x, int64_t ldx, const float *w, int64_t N, int64_t K,
                      float eps) {
    if (ldx == K) {
        cpu_rmsnorm_fwd(be, out, NULL, x, w, N, (int)K, eps);
        return;
    }
    for (int64_t n = 0; n < N; n++)
        cpu_rmsnorm_fwd(be, out + n * K, NULL, x + n * ldx, w, 1, (int)K, eps);
}

static void cpu_add_rmsnorm_fwd(be_t *be, void *out, float *rstd, void *x_, const void *y_, const void *w, int64_t N,
                                int d, float eps) {
    float *x = x_;
    const float *y = y_;
#pragma omp parallel for simd schedule(static) if (N * d > CPU_PAR_MIN)
    for (int64_t i = 0; i < N * d; i++)
        x[i] += y[i];
    cpu_rmsnorm_fwd(be, out, rstd, x, w, N, d, eps);
}

// The reference of the fused decode op: the product into a temporary, then
// add_rmsnorm_fwd (or the add alone).
static void cpu_proj_add_rmsnorm(be_t *be, void *xn, void *x, const void *a, int64_t lda, const void *W, const void *w,
                                 int64_t N, int64_t K, int d, float eps) {
    if (N <= 0 || d <= 0) return;
    cpu_tmp_t tmp;
    float *y = cpu_tmp_take(be, &tmp, N * d, "proj_add_rmsnorm");
    if (!y) {
        cpu_fill_nan(x, N * d);
        if (w) cpu_fill_nan(xn, N * d);
        return;
    }
    be->gemm(be, 0, 1, N, d, K, 1.0f, a, lda, W, K, 0.0f, y, d);
    if (w)
        cpu_add_rmsnorm_fwd(be, xn, NULL, x, y, w, N, d, eps);
    else
        be->add(be, x, y, N * d);
    cpu_tmp_give(be, &tmp);
}

// The reference of the fused decode op: x's rows normed into a temporary,
// then the product.
static void cpu_proj_rmsnorm(be_t *be, void *y, const void *x, int64_t ldx, const void *xw, float eps, const void *W,
                             int64_t N, int64_t K, int64_t out) {
    if (N <= 0 || out <= 0) return;
    cpu_tmp_t tmp;
    float *xn = cpu_tmp_take(be, &tmp, N * K, "proj_rmsnorm");
    if (!xn) {
        cpu_fill_nan(y, N * out);
        return;
    }
    cpu_rows_rmsnorm(be, xn, x, ldx, xw, N, K, eps);
    be->gemm(be, 0, 1, N, out, K, 1.0f, xn, K, W, K, 0.0f, y, out);
    cpu_tmp_give(be, &tmp);
}

// y = x r w with r = (mean x^2 + eps)^-1/2:
// dx = r (dy w - x_hat mean(dy w x_hat)), dw += sum_n dy x_hat.
static void cpu_rmsnorm_bwd(be_t *be, void *dx_, float *dw, const void *dout_, const void *x_, const void *w_,
                            const float *rstd, int64_t N, int d) {
    float *dx = dx_;
    const float *dout = dout_, *x = x_, *w = w_;
#pragma omp parallel for schedule(static) if (N * d > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * d, *g = dout + n * d;
        float r = rstd[n];
        double dot = 0;
        for (int i = 0; i < d; i++)
            dot += (double)g[i] * w[i] * xr[i] * r;
        float m = (float)(dot / d);
        for (int i = 0; i < d; i++)
            dx[n * d + i] = r * (g[i] * w[i] - xr[i] * r * m);
    }
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * d, *g = dout + n * d;
        for (int i = 0; i < d; i++)
            dw[i] += g[i] * xr[i] * rstd[n];
    }
}

// Gated RMSNorm on G groups of gs channels per row.
//   NORM_THEN_GATE: y = x r w silu(z),   r from x
//   GATE_THEN_NORM: u = x silu(z), y = u r w, r from u
static void cpu_gated_rmsnorm_fwd(be_t *be, void *out_, float *rstd, const void *x_, const void *z_, int64_t ldz,
                                  const void *w_, int64_t w_len, int64_t N, int G, int gs, float eps, int mode) {
    float *out = out_;
    const float *x = x_, *z = z_, *w = w_;
    int64_t width = (int64_t)G * gs;
#pragma omp parallel for schedule(static) if (N * width > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        for (int g = 0; g < G; g++) {
            const float *xr = x + n * width + (int64_t)g * gs, *zr = z + n * ldz + (int64_t)g * gs;
            const float *wr = w + (w_len == gs ? 0 : (int64_t)g * gs);
            float *o = out + n * width + (int64_t)g * gs;
            double ss = 0;
            for (int i = 0; i < gs; i++) {
                float u = mode == GNORM_GATE_THEN_NORM ? xr[i] * cpu_silu(zr[i]) : xr[i];
                ss += (double)u * u;
            }
            float r = 1.0f / sqrtf((float)(ss / gs) + eps);
            for (int i = 0; i < gs; i++) {
                float s = cpu_silu(zr[i]);
                o[i] = mode == GNORM_GATE_THEN_NORM ? xr[i] * s * r * wr[i] : xr[i] * r * wr[i] * s;
            }
            if (rstd) rstd[n * G + g] = r;
        }
    }
}

static void cpu_gated_rmsnorm_bwd(be_t *be, void *dx_, void *dz_, int64_t lddz, float *dw, const void *dout_,
                                  const void *x_, const void *z_, int64_t ldz, const void *w_, int64_t w_len,
                                  const float *rstd, int64_t N, int G, int gs, int mode) {
    float *dx = dx_, *dz = dz_;
    const float *dout = dout_, *x = x_, *z = z_, *w = w_;
    int64_t width = (int64_t)G * gs;
#pragma omp parallel for schedule(static) if (N * width > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        for (int g = 0; g < G; g++) {
            int64_t o = n * width + (int64_t)g * gs;
            const float *xr = x + o, *zr = z + n * ldz + (int64_t)g * gs, *dy = dout + o;
            const float *wr = w + (w_len == gs ? 0 : (int64_t)g * gs);
            float r = rstd[n * G + g];
            double dot = 0;
            if (mode == GNORM_NORM_THEN_GATE) {
                // y = xh w s, xh = x r: e = dy w s; dx = r (e - xh mean(e xh)); dz = dy xh w silu'(z)
                for (int i = 0; i < gs; i++)
                    dot += (double)dy[i] * wr[i] * cpu_silu(zr[i]) * xr[i] * r;
                float m = (float)(dot / gs);
                for (int i = 0; i < gs; i++) {
                    float e = dy[i] * wr[i] * cpu_silu(zr[i]);
                    dx[o + i] = r * (e - xr[i] * r * m);
                    dz[n * lddz + (int64_t)g * gs + i] = dy[i] * xr[i] * r * wr[i] * cpu_dsilu(zr[i]);
                }
            } else {
                // u = x s, y = u r w: du = r (dy w - uh mean(dy w uh)); dx = du s; dz = du x silu'(z)
                for (int i = 0; i < gs; i++) {
                    float u = xr[i] * cpu_silu(zr[i]);
                    dot += (double)dy[i] * wr[i] * u * r;
                }
                float m = (float)(dot / gs);
                for (int i = 0; i < gs; i++) {
                    float s = cpu_silu(zr[i]), u = xr[i] * s;
                    float du = r * (dy[i] * wr[i] - u * r * m);
                    dx[o + i] = du * s;
                    dz[n * lddz + (int64_t)g * gs + i] = du * xr[i] * cpu_dsilu(zr[i]);
                }
            }
        }
    }
    for (int64_t n = 0; n < N; n++) {
        for (int g = 0; g < G; g++) {
            int64_t o = n * width + (int64_t)g * gs;
            const float *xr = x + o, *zr = z + n * ldz + (int64_t)g * gs, *dy = dout + o;
            float *dwr = dw + (w_len == gs ? 0 : (int64_t)g * gs);
            float r = rstd[n * G + g];
            for (int i = 0; i < gs; i++) {
                float s = cpu_silu(zr[i]);
                dwr[i] += mode == GNORM_NORM_THEN_GATE ? dy[i] * xr[i] * r * s : dy[i] * xr[i] * s * r;
            }
        }
    }
}

static void cpu_l2norm_fwd(be_t *be, void *y_, float *rnorm, const void *x_, int64_t ld, int64_t N, int dim,
                           float eps) {
    float *y = y_;
    const float *x = x_;
#pragma omp parallel for schedule(static) if (N * dim > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * ld;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        float r = 1.0f / sqrtf((float)ss + eps);
        for (int i = 0; i < dim; i++)
            y[n * ld + i] = xr[i] * r;
        if (rnorm) rnorm[n] = r;
    }
}

// y = x r: dx = r (dy - (dy . y) y)
static void cpu_l2norm_bwd(be_t *be, void *dx_, int64_t ld, const void *dy_, const void *y_, const float *rnorm,
                           int64_t N, int dim) {
    float *dx = dx_;
    const float *dy = dy_, *y = y_;
#pragma omp parallel for schedule(static) if (N * dim > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = dy + n * ld, *yr = y + n * ld;
        double dot = 0;
        for (int i = 0; i < dim; i++)
            dot += (double)g[i] * yr[i];
        for (int i = 0; i < dim; i++)
            dx[n * ld + i] = rnorm[n] * (g[i] - (float)dot * yr[i]);
    }
}

void cpu_register_norm(be_t *be) {
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->add_rmsnorm_fwd = cpu_add_rmsnorm_fwd;
    be->proj_add_rmsnorm = cpu_proj_add_rmsnorm;
    be->proj_rmsnorm = cpu_proj_rmsnorm;
    be->gated_rmsnorm_fwd = cpu_gated_rmsnorm_fwd;
    be->gated_rmsnorm_bwd = cpu_gated_rmsnorm_bwd;
    be->l2norm_fwd = cpu_l2norm_fwd;
    be->l2norm_bwd = cpu_l2norm_bwd;
}
