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

void cpu_register_mlp(be_t *be) {
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
}
