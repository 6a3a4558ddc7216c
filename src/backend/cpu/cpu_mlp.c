// SwiGLU: out = silu(gate) * up.
#include "backend/cpu/cpu.h"

static void cpu_swiglu_fwd(be_t *be, void *out_, const void *gate_, const void *up_, int64_t ld, int64_t N, int64_t f) {
    float *out = out_;
    const float *gate = gate_, *up = up_;
#pragma omp parallel for schedule(static) if (N * f > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *g = gate + n * ld, *u = up + n * ld;
        float *o = out + n * f;
#pragma omp simd
        for (int64_t i = 0; i < f; i++)
            o[i] = cpu_silu(g[i]) * u[i];
    }
}

static void cpu_swiglu_bwd(be_t *be, void *dgate_, void *dup_, const void *dout_, const void *gate_, const void *up_,
                           int64_t n) {
    float *dgate = dgate_, *dup = dup_;
    const float *dout = dout_, *gate = gate_, *up = up_;
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        dup[i] = dout[i] * cpu_silu(gate[i]);
        dgate[i] = dout[i] * up[i] * cpu_dsilu(gate[i]);
    }
}

// The reference of the fused decode op: x's rows normed into a temporary
// (with a gain xw), gate into h, up into a temporary, then swiglu_fwd in place.
static void cpu_proj_swiglu(be_t *be, void *h, const void *x, int64_t ldx, const void *xw, float eps, const void *Wg,
                            const void *Wu, int64_t N, int64_t K, int64_t f) {
    if (N <= 0 || f <= 0) return;
    cpu_tmp_t tmp;
    float *up = cpu_tmp_take(be, &tmp, N * f + (xw ? N * K : 0), "proj_swiglu");
    if (!up) {
        cpu_fill_nan(h, N * f);
        return;
    }
    if (xw) {
        float *xn = up + N * f;
        cpu_rows_rmsnorm(be, xn, x, ldx, xw, N, K, eps);
        x = xn, ldx = K;
    }
    be->gemm(be, 0, 1, N, f, K, 1.0f, x, ldx, Wg, K, 0.0f, h, f);
    be->gemm(be, 0, 1, N, f, K, 1.0f, x, ldx, Wu, K, 0.0f, up, f);
    cpu_swiglu_fwd(be, h, h, up, f, N, f);
    cpu_tmp_give(be, &tmp);
}

void cpu_register_mlp(be_t *be) {
    be->proj_swiglu = cpu_proj_swiglu;
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
}
