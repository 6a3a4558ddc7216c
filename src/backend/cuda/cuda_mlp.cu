// SwiGLU: out = silu(gate) * up. Elementwise, fp32 math, bf16 in and out,
// 16-byte accesses when the sizes and the pointers allow. Element i is read
// and written by one thread, so outputs may alias inputs.
#include "backend/cuda/cuda_vec.cuh"

// fv = f / V vectors per row; gate and up rows at stride ld, out rows of f.
template <int V>
__global__ void k_swiglu_fwd(bf16 *out, const bf16 *gate, const bf16 *up, int64_t ld, int64_t fv, int64_t nv) {
    GRID_STRIDE(i, nv) {
        const int64_t n = i / fv, j = (i - n * fv) * V;
        float g[V], u[V];
        ld_bf16<V>(gate + n * ld + j, g);
        ld_bf16<V>(up + n * ld + j, u);
#pragma unroll
        for (int k = 0; k < V; k++)
            g[k] = dev_silu(g[k]) * u[k];
        st_bf16<V>(out + n * fv * V + j, g);
    }
}

// d silu(x)/dx = sigmoid(x) (1 + x (1 - sigmoid(x)))
template <int V>
__global__ void k_swiglu_bwd(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, int64_t nv) {
    GRID_STRIDE(i, nv) {
        float d[V], g[V], u[V], dg[V], du[V];
        ld_bf16<V>(dout + i * V, d);
        ld_bf16<V>(gate + i * V, g);
        ld_bf16<V>(up + i * V, u);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float sg = dev_sigmoid(g[k]);
            du[k] = d[k] * g[k] * sg;
            dg[k] = d[k] * u[k] * sg * (1.0f + g[k] * (1.0f - sg));
        }
        st_bf16<V>(dup + i * V, du);
        st_bf16<V>(dgate + i * V, dg);
    }
}

static void cu_swiglu_fwd(be_t *be, void *out, const void *gate, const void *up, int64_t ld, int64_t N, int64_t f) {
    if (N <= 0 || f <= 0) return;
    if (ld == f) f *= N, N = 1; // contiguous: one row (vectors need not stop at row ends)
    int V = cu_vec_width((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up, (uint64_t)f | (uint64_t)ld);
    int64_t nv = N * (f / V);
    LAUNCH_V(V, k_swiglu_fwd, cu_grid(be, nv, 256), 256, cuda_stream(be), (bf16 *)out, (const bf16 *)gate,
             (const bf16 *)up, ld, f / V, nv);
    cuda_check_launch(be, "swiglu_fwd");
}

static void cu_swiglu_bwd(be_t *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                          int64_t n) {
    if (n <= 0) return;
    uintptr_t addr = (uintptr_t)dgate | (uintptr_t)dup | (uintptr_t)dout | (uintptr_t)gate | (uintptr_t)up;
    int V = cu_vec_width(addr, (uint64_t)n);
    int64_t nv = n / V;
    LAUNCH_V(V, k_swiglu_bwd, cu_grid(be, nv, 256), 256, cuda_stream(be), (bf16 *)dgate, (bf16 *)dup,
             (const bf16 *)dout, (const bf16 *)gate, (const bf16 *)up, nv);
    cuda_check_launch(be, "swiglu_bwd");
}

extern "C" void cuda_register_mlp(be_t *be) {
    be->swiglu_fwd = cu_swiglu_fwd;
    be->swiglu_bwd = cu_swiglu_bwd;
}
