// Sum of squares (gradient clipping) and AdamW on the GPU. Both are memory
// bound: 16-byte accesses where the pointers allow, grid-stride loops.
#include <assert.h>
#include <math.h>

#include "backend/cuda/cuda.h"

enum { SUMSQ_THREADS = 256, SUMSQ_MAX_BLOCKS = 1024, ADAMW_THREADS = 256 };

// Stage 1: block b sums x^2 over its grid-stride share (double per thread:
// each thread covers up to n / 262144 elements) into part[b].
static __global__ void __launch_bounds__(SUMSQ_THREADS) k_sumsq_part(const float *x, int64_t n, int vec, double *part) {
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    const int64_t stride = (int64_t)gridDim.x * SUMSQ_THREADS, t = (int64_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x;
    int64_t done = 0;
    if (vec) {
        const int64_t n4 = n / 4;
        const float4 *x4 = (const float4 *)x;
        for (int64_t i = t; i < n4; i += stride) {
            const float4 v = x4[i];
            s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + t; i < n; i += stride)
        s += (double)x[i] * x[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// Stage 2: one block sums the partials in a fixed order; *out = the sum.
static __global__ void __launch_bounds__(SUMSQ_THREADS) k_sumsq_final(const double *part, int nb, float *out) {
    __shared__ double sh[SUMSQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += SUMSQ_THREADS)
        s += part[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (float)sh[0];
}

// The grid depends on n only, so the result is bitwise reproducible.
static void cu_sumsq(be_t *be, float *out, const float *x, int64_t n) {
    cudaStream_t stream = cuda_stream(be);
    if (n <= 0) {
        cudaMemsetAsync(out, 0, sizeof(float), stream);
        return;
    }
    int64_t nb = (n + SUMSQ_THREADS * 16 - 1) / (SUMSQ_THREADS * 16);
    if (nb > SUMSQ_MAX_BLOCKS) nb = SUMSQ_MAX_BLOCKS;
    const size_t mark = arena_mark(&be->scratch);
    double *part = (double *)arena_alloc(&be->scratch, (size_t)nb * sizeof(double));
    if (!part) {
        cuda_fail(be, "sumsq: scratch arena full", cudaErrorMemoryAllocation);
        cudaMemsetAsync(out, 0xff, sizeof(float), stream); // NaN
        return;
    }
    const int vec = ((uintptr_t)x & 15) == 0;
    k_sumsq_part<<<(unsigned)nb, SUMSQ_THREADS, 0, stream>>>(x, n, vec, part);
    cuda_check_launch(be, "sumsq part");
    k_sumsq_final<<<1, SUMSQ_THREADS, 0, stream>>>(part, (int)nb, out);
    cuda_check_launch(be, "sumsq final");
    arena_reset(&be->scratch, mark);
}

// torch.optim.AdamW in fp32, the same operations in the same order as the CPU
// reference (cpu_optim.c), constants formed once on the host. The _rn
// intrinsics keep nvcc from contracting into FMAs (the C17 build does not
// contract), so the two agree bit for bit.
typedef struct {
    float omb1, beta2, omb2, eps, decay, step_size, sqrt_bc2, grad_scale;
} adamw_k_t;

static __device__ __forceinline__ float adamw_one(float &p, float &m, float &v, float g, const adamw_k_t &k) {
    g = __fmul_rn(g, k.grad_scale);
    m = __fadd_rn(m, __fmul_rn(k.omb1, __fsub_rn(g, m)));
    v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(k.omb2, __fmul_rn(g, g)));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.sqrt_bc2), k.eps);
    p = __fsub_rn(__fmul_rn(p, k.decay), __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
    return p;
}

static __global__ void __launch_bounds__(ADAMW_THREADS)
    k_adamw(float *master, bf16 *work, const float *grad, float *m, float *v, int64_t n, int vec, adamw_k_t k) {
    const int64_t stride = (int64_t)gridDim.x * ADAMW_THREADS, t = (int64_t)blockIdx.x * ADAMW_THREADS + threadIdx.x;
    int64_t done = 0;
    if (vec) { // master, grad, m, v 16-byte aligned, work 8-byte aligned
        const int64_t n4 = n / 4;
        for (int64_t i = t; i < n4; i += stride) {
            float4 p = ((float4 *)master)[i], mm = ((float4 *)m)[i], vv = ((float4 *)v)[i];
            const float4 g = ((const float4 *)grad)[i];
            adamw_one(p.x, mm.x, vv.x, g.x, k);
            adamw_one(p.y, mm.y, vv.y, g.y, k);
            adamw_one(p.z, mm.z, vv.z, g.z, k);
            adamw_one(p.w, mm.w, vv.w, g.w, k);
            ((float4 *)master)[i] = p;
            ((float4 *)m)[i] = mm;
            ((float4 *)v)[i] = vv;
            __nv_bfloat162 w2[2] = {__floats2bfloat162_rn(p.x, p.y), __floats2bfloat162_rn(p.z, p.w)};
            ((uint2 *)work)[i] = *(const uint2 *)w2;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + t; i < n; i += stride) {
        float p = master[i], mm = m[i], vv = v[i];
        adamw_one(p, mm, vv, grad[i], k);
        master[i] = p;
        m[i] = mm;
        v[i] = vv;
        work[i] = __float2bfloat16_rn(p);
    }
}

static void cu_adamw(be_t *be, float *master, void *work, const float *grad, float *m, float *v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step) {
    assert(step >= 1);
    if (n <= 0) return;
    adamw_k_t k;
    k.omb1 = 1.0f - beta1;
    k.beta2 = beta2;
    k.omb2 = 1.0f - beta2;
    k.eps = eps;
    k.decay = (float)(1.0 - (double)lr * weight_decay);
    k.step_size = (float)((double)lr / (1.0 - pow(beta1, step)));
    k.sqrt_bc2 = (float)sqrt(1.0 - pow(beta2, step));
    k.grad_scale = grad_scale;
    const int vec =
        (((uintptr_t)master | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) & 15) == 0 && ((uintptr_t)work & 7) == 0;
    int64_t nb = (n / (vec ? 4 : 1) + ADAMW_THREADS - 1) / ADAMW_THREADS;
    const int64_t max_nb = (int64_t)cuda_impl(be)->sm_count * 16;
    if (nb > max_nb) nb = max_nb;
    if (nb < 1) nb = 1;
    k_adamw<<<(unsigned)nb, ADAMW_THREADS, 0, cuda_stream(be)>>>(master, (bf16 *)work, grad, m, v, n, vec, k);
    cuda_check_launch(be, "adamw");
}

extern "C" void cuda_register_optim(be_t *be) {
    be->sumsq = cu_sumsq;
    be->adamw = cu_adamw;
}
