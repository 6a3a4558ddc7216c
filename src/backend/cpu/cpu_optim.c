// Sum of squares (gradient clipping) and AdamW (the reference).
#include <assert.h>
#include <math.h>

#include "backend/cpu/cpu.h"

// Sums of SUMSQ_CHUNK elements, added in order: the same bits whatever the
// thread count (an OpenMP reduction would split the sum by it).
enum { SUMSQ_CHUNK = 1 << 16 };

static void cpu_sumsq(be_t *be, float *out, const float *x, int64_t n) {
    // double accumulation: a 1e9-element buffer in fp32 would lose digits.
    const int64_t nc = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    cpu_tmp_t t;
    double *part = (double *)cpu_tmp_take(be, &t, 2 * (nc > 0 ? nc : 1), "sumsq"); // 2 floats a double
    if (!part) {
        *out = NAN;
        return;
    }
#pragma omp parallel for schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        const int64_t i1 = n - c * SUMSQ_CHUNK < SUMSQ_CHUNK ? n : (c + 1) * SUMSQ_CHUNK;
        double s = 0.0;
        for (int64_t i = c * SUMSQ_CHUNK; i < i1; i++)
            s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0.0;
    for (int64_t c = 0; c < nc; c++)
        s += part[c];
    cpu_tmp_give(be, &t);
    *out = (float)s;
}

// torch.optim.AdamW (single tensor, amsgrad off), in fp32:
//   g = grad * grad_scale; m += (1 - b1) (g - m); v = b2 v + (1 - b2) g^2;
//   p *= 1 - lr wd; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),
// bc_k = 1 - b_k^step. The constants are formed in double once, then used in
// fp32 exactly as the CUDA kernel does, so both agree to rounding.
static void cpu_adamw(be_t *be, float *master, void *work_, const float *grad, float *m, float *v, int64_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step) {
    assert(step >= 1);
    float *work = work_;
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    const float decay = (float)(1.0 - (double)lr * weight_decay);
    const float step_size = (float)((double)lr / (1.0 - pow(beta1, step)));
    const float sqrt_bc2 = (float)sqrt(1.0 - pow(beta2, step));
#pragma omp parallel for schedule(static) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        const float mi = m[i] + omb1 * (g - m[i]);
        const float vi = beta2 * v[i] + omb2 * (g * g);
        const float denom = sqrtf(vi) / sqrt_bc2 + eps;
        const float p = master[i] * decay - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        work[i] = p;
    }
}

void cpu_register_optim(be_t *be) {
    be->sumsq = cpu_sumsq;
    be->adamw = cpu_adamw;
}
