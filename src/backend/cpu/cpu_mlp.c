// SwiGLU: out = silu(gate) * up.
#include "backend/cpu/cpu.h"

static void cpu_swiglu_fwd(be_t *be, void *out_, const void *gate_, const void *up_, int64_t n) {
    float *out = out_;
    const float *gate = gate_, *up = up_;
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        out[i] = cpu_silu(gate[i]) * up[i];
}

// d silu(x)/dx = sigmoid(x) (1 + x (1 - sigmoid(x)))
static void cpu_swiglu_bwd(be_t *be, void *dgate_, void *dup_, const void *dout_, const void *gate_, const void *up_,
                           int64_t n) {
    float *dgate = dgate_, *dup = dup_;
    const float *dout = dout_, *gate = gate_, *up = up_;
#pragma omp parallel for simd schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float sg = cpu_sigmoid(gate[i]);
        dup[i] = dout[i] * gate[i] * sg;
        dgate[i] = dout[i] * up[i] * sg * (1.0f + gate[i] * (1.0f - sg));
    }
}

void cpu_register_mlp(be_t *be) {
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
}
