// Fused linear cross entropy and fused KL from hidden states on the GPU
// (linear_blocks.md §5, "recommended design for our port").
//
// Rows are processed in chunks of C tokens; per chunk:
//   1. S = h_c W^T (and T = ht_c Wt^T for KL): cuBLASLt, bf16 in, fp32
//      accumulate, bf16 out, into [C, ld] buffers from the scratch arena;
//   2. one block per row: pass 1 folds the row into a running (max, sum of
//      exp) in fp32 (online softmax; both rows for KL), pass 2 computes the row
//      loss and overwrites S in place with the gradient w.r.t. the logits
//      (softmax - onehot, or p_s - p_t), rounded once to bf16;
//   3. the C row losses are summed by one block in a fixed order into a double
//      accumulator (deterministic: no atomics anywhere);
//   4. dh_c = scale * G W (bf16 out) and dW += scale * G^T h_c (fp32 out,
//      beta = 1: the weight gradient accumulates in fp32 inside the GEMM).
// Memory: the chunk buffers only, C * ld * 2 bytes each, C chosen so that one
// buffer stays within LOSS_BUF_BYTES and everything fits in the free part of
// the scratch arena; nothing grows with N. The GEMMs are the table's gemm /
// gemm_f32out (cuda_core.cu): cuBLASLt through the backend's one plan cache, so
// the descriptors and the algorithm of each chunk shape are built once, not on
// every call.
//
// The layer-wise distillation distance (ild_dist) is a row kernel of its own:
// one warp per row computes the row's sum of squared differences in fp32, its
// distance and dx; the row distances then go through the same fixed-order
// double sum as the row losses above.
#include <float.h>
#include <stdio.h>

#include "backend/cuda/cuda_vec.cuh"

enum {
    LOSS_THREADS = 512, // one block per row
    SUM_THREADS = 256,
    ILD_WARPS = 4 // ild_dist: one warp per row, 4 rows per 128-thread block
};
static const size_t LOSS_BUF_BYTES = (size_t)256 << 20; // one [C, V] bf16 logits buffer

// ---- GEMMs -------------------------------------------------------------------

// C[M,N] (row-major, ldc) = alpha op(A) op(B) + beta C with A, B bf16 row-major
// and C bf16 (c_f32 = 0) or fp32 (c_f32 = 1); fp32 accumulation. Errors are
// recorded by the gemm and reported by sync().
static void loss_gemm(be_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                      int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int c_f32) {
    if (c_f32)
        be->gemm_f32out(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, (float *)C, ldc);
    else
        be->gemm(be, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// ---- row kernels ------------------------------------------------------------

// Running (max m, sum s of exp(x - m)); m starts at -FLT_MAX (not -inf) so that
// exp(m_old - m_new) is 0, never NaN. A NaN logit makes s NaN.
static __device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

static __device__ __forceinline__ void ms_fold8(float &m, float &s, const float *v) {
    float vm = v[0];
#pragma unroll
    for (int k = 1; k < 8; k++)
        vm = fmaxf(vm, v[k]);
    const float mn = fmaxf(m, vm);
    float acc = s * __expf(m - mn);
#pragma unroll
    for (int k = 0; k < 8; k++)
        acc += __expf(v[k] - mn); // fmaxf drops a NaN; the sum keeps it
    s = acc;
    m = mn;
}

static __device__ __forceinline__ void ms_fold1(float &m, float &s, float x) {
    const float mn = fmaxf(m, x);
    s = s * __expf(m - mn) + __expf(x - mn);
    m = mn;
}

// Block-wide merge of (m, s); every thread gets the result. Butterfly shuffles
// give every lane the same value (the merge is symmetric), the fixed tree makes
// the result independent of timing. sh holds >= 66 floats.
static __device__ void block_ms(float &m, float &s, float *sh) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = m, sh[32 + w] = s;
    __syncthreads();
    if (w == 0) {
        m = l < nw ? sh[l] : -FLT_MAX;
        s = l < nw ? sh[32 + l] : 0.0f;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
        if (l == 0) sh[64] = m, sh[65] = s;
    }
    __syncthreads();
    m = sh[64];
    s = sh[65];
    __syncthreads(); // sh may be reused next
}

static __device__ float block_sum(float x, float *sh) {
#pragma unroll
    for (int o = 16; o; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        x = l < nw ? sh[l] : 0.0f;
#pragma unroll
        for (int o = 16; o; o >>= 1)
            x += __shfl_xor_sync(0xffffffffu, x, o);
        if (l == 0) sh[64] = x;
    }
    __syncthreads();
    x = sh[64];
    __syncthreads();
    return x;
}

static __device__ void zero_row(bf16 *x, int64_t V) {
    const int64_t V8 = V & ~(int64_t)7;
    const uint4 z = make_uint4(0, 0, 0, 0);
    for (int64_t i = (int64_t)threadIdx.x * 8; i < V8; i += (int64_t)blockDim.x * 8)
        *(uint4 *)(x + i) = z;
    for (int64_t i = V8 + threadIdx.x; i < V; i += blockDim.x)
        x[i] = __float2bfloat16_rn(0.0f);
}

// Rows are ld apart, ld a multiple of 8 and the buffer 256-byte aligned, so the
// first V & ~7 entries of a row go as 16-byte vectors and the rest one by one.
//
// CE row r: loss = lse - x[y]; G = softmax - onehot(y) over x in place (grad).
// y < 0: ignored (loss 0, G 0); y >= V: loss NaN, G 0.
static __global__ void __launch_bounds__(LOSS_THREADS)
    k_ce_rows(bf16 *L, int64_t ld, int64_t V, const int32_t *tgt, float *rowloss, int grad) {
    __shared__ float sh[66];
    bf16 *x = L + (int64_t)blockIdx.x * ld;
    const int32_t y = tgt[blockIdx.x];
    if (y < 0 || y >= V) { // uniform over the block
        if (grad) zero_row(x, V);
        if (threadIdx.x == 0) rowloss[blockIdx.x] = y < 0 ? 0.0f : __int_as_float(0x7fc00000);
        return;
    }
    // Read before block_ms's barriers, hence before any thread overwrites it.
    const float xy = __bfloat162float(x[y]);
    const int64_t V8 = V & ~(int64_t)7;
    float m = -FLT_MAX, s = 0.0f;
    for (int64_t i = (int64_t)threadIdx.x * 8; i < V8; i += (int64_t)blockDim.x * 8) {
        float v[8];
        ld_bf16<8>(x + i, v);
        ms_fold8(m, s, v);
    }
    for (int64_t i = V8 + threadIdx.x; i < V; i += blockDim.x)
        ms_fold1(m, s, __bfloat162float(x[i]));
    block_ms(m, s, sh);
    const float lse = m + logf(s);
    if (grad) {
        for (int64_t i = (int64_t)threadIdx.x * 8; i < V8; i += (int64_t)blockDim.x * 8) {
            float v[8];
            ld_bf16<8>(x + i, v);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = __expf(v[k] - lse) - (i + k == y ? 1.0f : 0.0f);
            st_bf16<8>(x + i, v);
        }
        for (int64_t i = V8 + threadIdx.x; i < V; i += blockDim.x)
            x[i] = __float2bfloat16_rn(__expf(__bfloat162float(x[i]) - lse) - (i == y ? 1.0f : 0.0f));
    }
    if (threadIdx.x == 0) rowloss[blockIdx.x] = lse - xy;
}

// KL row r: loss = sum_v p_t (log p_t - log p_s); G = p_s - p_t over S in place.
// Masked rows: loss 0, G 0. Identical S and T rows give exactly 0 for both.
static __global__ void __launch_bounds__(LOSS_THREADS)
    k_kl_rows(bf16 *S, const bf16 *T, int64_t ld, int64_t V, const int32_t *mask, float *rowloss, int grad) {
    __shared__ float sh[66];
    bf16 *xs = S + (int64_t)blockIdx.x * ld;
    const bf16 *xt = T + (int64_t)blockIdx.x * ld;
    if (mask && mask[blockIdx.x] < 0) {
        if (grad) zero_row(xs, V);
        if (threadIdx.x == 0) rowloss[blockIdx.x] = 0.0f;
        return;
    }
    const int64_t V8 = V & ~(int64_t)7;
    float ms = -FLT_MAX, ss = 0.0f, mt = -FLT_MAX, st = 0.0f;
    for (int64_t i = (int64_t)threadIdx.x * 8; i < V8; i += (int64_t)blockDim.x * 8) {
        float a[8], b[8];
        ld_bf16<8>(xs + i, a);
        ld_bf16<8>(xt + i, b);
        ms_fold8(ms, ss, a);
        ms_fold8(mt, st, b);
    }
    for (int64_t i = V8 + threadIdx.x; i < V; i += blockDim.x) {
        ms_fold1(ms, ss, __bfloat162float(xs[i]));
        ms_fold1(mt, st, __bfloat162float(xt[i]));
    }
    block_ms(ms, ss, sh);
    block_ms(mt, st, sh);
    const float lse_s = ms + logf(ss), lse_t = mt + logf(st);
    float kl = 0.0f;
    for (int64_t i = (int64_t)threadIdx.x * 8; i < V8; i += (int64_t)blockDim.x * 8) {
        float a[8], b[8];
        ld_bf16<8>(xs + i, a);
        ld_bf16<8>(xt + i, b);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float ls = a[k] - lse_s, lt = b[k] - lse_t, pt = __expf(lt);
            kl += pt * (lt - ls);
            a[k] = __expf(ls) - pt;
        }
        if (grad) st_bf16<8>(xs + i, a);
    }
    for (int64_t i = V8 + threadIdx.x; i < V; i += blockDim.x) {
        const float ls = __bfloat162float(xs[i]) - lse_s, lt = __bfloat162float(xt[i]) - lse_t, pt = __expf(lt);
        kl += pt * (lt - ls);
        if (grad) xs[i] = __float2bfloat16_rn(__expf(ls) - pt);
    }
    kl = block_sum(kl, sh);
    if (threadIdx.x == 0) rowloss[blockIdx.x] = kl;
}

// acc[0] += sum of rowloss[0..n) in a fixed order (double).
static __global__ void __launch_bounds__(SUM_THREADS) k_sum_rows(const float *rowloss, int64_t n, double *acc) {
    __shared__ double sh[SUM_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += SUM_THREADS)
        s += rowloss[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUM_THREADS / 2; o; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) acc[0] += sh[0];
}

static __global__ void k_finish(float *loss, const double *acc, float scale) {
    if (threadIdx.x == 0 && blockIdx.x == 0) loss[0] = (float)(acc[0] * (double)scale);
}

// ---- chunking ---------------------------------------------------------------

typedef struct {
    int64_t C, ld;
    size_t mark;
    bf16 *buf[2];
    float *rowloss;
    double *acc;
} loss_plan_t;

// Takes the chunk buffers from the scratch arena: C rows per chunk, with one
// [C, ld] buffer within LOSS_BUF_BYTES and everything within the arena's free
// space. Returns 0, or records an error and returns < 0.
static int loss_plan(be_t *be, const char *what, int64_t N, int64_t V, int nbuf, loss_plan_t *p) {
    arena_t *a = &be->scratch;
    p->mark = arena_mark(a);
    p->ld = (V + 7) & ~(int64_t)7;
    const size_t row_bytes = (size_t)nbuf * (size_t)p->ld * sizeof(bf16) + sizeof(float);
    const size_t used = cu_round256(a->used);
    const size_t fixed = (size_t)(nbuf + 3) * 256; // acc + alignment of every piece
    const size_t avail = a->cap > used + fixed ? a->cap - used - fixed : 0;
    int64_t C = (int64_t)(avail / row_bytes);
    int64_t cap_rows = (int64_t)(LOSS_BUF_BYTES / ((size_t)p->ld * sizeof(bf16)));
    if (cap_rows < 1) cap_rows = 1;
    if (C > cap_rows) C = cap_rows;
    if (C > N) C = N;
    if (C < N && C > 64) C &= ~(int64_t)63; // whole GEMM tiles; keeps chunk offsets aligned
    if (C < 1) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: scratch arena (%s): one row needs %zu bytes, %zu free", what, a->what,
                 row_bytes + fixed, a->cap > used ? a->cap - used : 0);
        cuda_fail(be, msg, cudaErrorMemoryAllocation);
        return ERR_NOMEM;
    }
    p->C = C;
    p->acc = (double *)arena_alloc(a, sizeof(double));
    p->rowloss = (float *)arena_alloc(a, (size_t)C * sizeof(float));
    p->buf[0] = (bf16 *)arena_alloc(a, (size_t)C * p->ld * sizeof(bf16));
    p->buf[1] = nbuf > 1 ? (bf16 *)arena_alloc(a, (size_t)C * p->ld * sizeof(bf16)) : NULL;
    if (!p->acc || !p->rowloss || !p->buf[0] || (nbuf > 1 && !p->buf[1])) { // cannot happen: sized above
        arena_reset(a, p->mark);
        cuda_fail(be, what, cudaErrorMemoryAllocation);
        return ERR_NOMEM;
    }
    return 0;
}

// On failure the loss reads NaN (and sync() reports the error).
static void loss_nan(be_t *be, float *loss) { cudaMemsetAsync(loss, 0xff, sizeof(float), cuda_stream(be)); }

static void cu_fused_ce(be_t *be, float *loss, void *dh, float *dW, const void *h, const void *W,
                        const int32_t *targets, int64_t N, int d, int64_t V, float scale) {
    cudaStream_t stream = cuda_stream(be);
    if (N <= 0) {
        cudaMemsetAsync(loss, 0, sizeof(float), stream);
        return;
    }
    loss_plan_t p;
    if (loss_plan(be, "fused_ce", N, V, 1, &p) < 0) {
        loss_nan(be, loss);
        return;
    }
    const int grad = dh || dW;
    const bf16 *hb = (const bf16 *)h;
    cudaMemsetAsync(p.acc, 0, sizeof(double), stream);
    for (int64_t r0 = 0; r0 < N; r0 += p.C) {
        const int64_t c = N - r0 < p.C ? N - r0 : p.C;
        loss_gemm(be, 0, 1, c, V, d, 1.0f, hb + r0 * d, d, W, d, 0.0f, p.buf[0], p.ld, 0);
        k_ce_rows<<<(unsigned)c, LOSS_THREADS, 0, stream>>>(p.buf[0], p.ld, V, targets + r0, p.rowloss, grad);
        cuda_check_launch(be, "fused_ce rows");
        k_sum_rows<<<1, SUM_THREADS, 0, stream>>>(p.rowloss, c, p.acc);
        cuda_check_launch(be, "fused_ce sum");
        if (dh) loss_gemm(be, 0, 0, c, d, V, scale, p.buf[0], p.ld, W, d, 0.0f, (bf16 *)dh + r0 * d, d, 0);
        if (dW) loss_gemm(be, 1, 0, V, d, c, scale, p.buf[0], p.ld, hb + r0 * d, d, 1.0f, dW, d, 1);
    }
    k_finish<<<1, 32, 0, stream>>>(loss, p.acc, scale);
    cuda_check_launch(be, "fused_ce finish");
    arena_reset(&be->scratch, p.mark); // stream order protects the buffers from the next op
}

static void cu_fused_kl(be_t *be, float *loss, void *dhs, float *dWs, const void *hs, const void *Ws, const void *ht,
                        const void *Wt, const int32_t *mask, int64_t N, int ds, int dt, int64_t V, float scale) {
    cudaStream_t stream = cuda_stream(be);
    if (N <= 0) {
        cudaMemsetAsync(loss, 0, sizeof(float), stream);
        return;
    }
    loss_plan_t p;
    if (loss_plan(be, "fused_kl", N, V, 2, &p) < 0) {
        loss_nan(be, loss);
        return;
    }
    const int grad = dhs || dWs;
    const bf16 *hsb = (const bf16 *)hs, *htb = (const bf16 *)ht;
    cudaMemsetAsync(p.acc, 0, sizeof(double), stream);
    for (int64_t r0 = 0; r0 < N; r0 += p.C) {
        const int64_t c = N - r0 < p.C ? N - r0 : p.C;
        loss_gemm(be, 0, 1, c, V, ds, 1.0f, hsb + r0 * ds, ds, Ws, ds, 0.0f, p.buf[0], p.ld, 0);
        loss_gemm(be, 0, 1, c, V, dt, 1.0f, htb + r0 * dt, dt, Wt, dt, 0.0f, p.buf[1], p.ld, 0);
        k_kl_rows<<<(unsigned)c, LOSS_THREADS, 0, stream>>>(p.buf[0], p.buf[1], p.ld, V, mask ? mask + r0 : NULL,
                                                            p.rowloss, grad);
        cuda_check_launch(be, "fused_kl rows");
        k_sum_rows<<<1, SUM_THREADS, 0, stream>>>(p.rowloss, c, p.acc);
        cuda_check_launch(be, "fused_kl sum");
        if (dhs) loss_gemm(be, 0, 0, c, ds, V, scale, p.buf[0], p.ld, Ws, ds, 0.0f, (bf16 *)dhs + r0 * ds, ds, 0);
        if (dWs) loss_gemm(be, 1, 0, V, ds, c, scale, p.buf[0], p.ld, hsb + r0 * ds, ds, 1.0f, dWs, ds, 1);
    }
    k_finish<<<1, 32, 0, stream>>>(loss, p.acc, scale);
    cuda_check_launch(be, "fused_kl finish");
    arena_reset(&be->scratch, p.mark);
}

// ---- layer-wise distillation distance ------------------------------------------

// Row n: dist = ||x - y||_2 (L2) or ||x - y||^2 / d (MSE) from the fp32 sum of
// squares (warp_sum's butterfly: fixed order, the same value in every lane);
// dx = scale (x - y) / dist (L2, 0 when dist == 0; a NaN dist gives NaN) or
// scale 2 (x - y) / d (MSE), rounded once to bf16. Each element is read and
// written by the same lane, so dx may alias x.
template <int V>
static __global__ void __launch_bounds__(32 * ILD_WARPS)
    k_ild_rows(bf16 *dx, const bf16 *x, const bf16 *y, int64_t N, int d, float scale, int mode, float *rowdist) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * ILD_WARPS + (threadIdx.x >> 5);
    if (n >= N) return; // uniform per warp
    const bf16 *xr = x + n * d, *yr = y + n * d;
    float ss = 0.0f;
    for (int i = lane * V; i < d; i += 32 * V) {
        float a[V], b[V];
        ld_bf16<V>(xr + i, a);
        ld_bf16<V>(yr + i, b);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float t = a[k] - b[k];
            ss += t * t;
        }
    }
    ss = warp_sum(ss);
    const float dist = mode == DIST_L2 ? sqrtf(ss) : ss / (float)d;
    if (lane == 0) rowdist[n] = dist;
    if (!dx) return;
    const float coef = mode == DIST_L2 ? (dist == 0.0f ? 0.0f : scale / dist) : 2.0f * scale / (float)d;
    bf16 *gr = dx + n * d;
    for (int i = lane * V; i < d; i += 32 * V) {
        float a[V], b[V];
        ld_bf16<V>(xr + i, a);
        ld_bf16<V>(yr + i, b);
#pragma unroll
        for (int k = 0; k < V; k++)
            a[k] = (a[k] - b[k]) * coef;
        st_bf16<V>(gr + i, a);
    }
}

// The row distances go to a [N] float buffer from the scratch arena; one block
// sums them in a fixed order into a double (k_sum_rows) and k_finish writes
// scale * sum. The grid depends on N only: the loss is bitwise reproducible.
static void cu_ild_dist(be_t *be, float *loss, void *dx, const void *x, const void *y, int64_t N, int d, float scale,
                        int mode) {
    cudaStream_t stream = cuda_stream(be);
    if (N <= 0) {
        cudaMemsetAsync(loss, 0, sizeof(float), stream);
        return;
    }
    if ((mode != DIST_L2 && mode != DIST_MSE) || d < 1) {
        cu_op_error(be, "cuda ild_dist: mode %d, d %d: expected mode DIST_L2 (0) or DIST_MSE (1) and d >= 1", mode, d);
        loss_nan(be, loss);
        if (dx && d > 0) cudaMemsetAsync(dx, 0xff, (size_t)N * d * sizeof(bf16), stream); // bf16 0xffff is NaN
        return;
    }
    const size_t mark = arena_mark(&be->scratch);
    double *acc = (double *)cu_scratch_try(be, sizeof(double));
    float *rowdist = acc ? (float *)cu_scratch_try(be, (size_t)N * sizeof(float)) : NULL;
    if (!rowdist) {
        arena_reset(&be->scratch, mark);
        char msg[256];
        snprintf(msg, sizeof msg, "ild_dist: scratch arena (%s): %lld rows need %zu bytes, %zu of %zu used",
                 be->scratch.what, (long long)N, cu_round256(sizeof(double)) + (size_t)N * sizeof(float),
                 be->scratch.used, be->scratch.cap);
        cuda_fail(be, msg, cudaErrorMemoryAllocation);
        loss_nan(be, loss);
        if (dx) cudaMemsetAsync(dx, 0xff, (size_t)N * d * sizeof(bf16), stream);
        return;
    }
    const int V = cu_vec_width((uintptr_t)dx | (uintptr_t)x | (uintptr_t)y, (uint64_t)d);
    const unsigned blocks = (unsigned)((N + ILD_WARPS - 1) / ILD_WARPS);
    LAUNCH_V(V, k_ild_rows, blocks, 32 * ILD_WARPS, stream, (bf16 *)dx, (const bf16 *)x, (const bf16 *)y, N, d, scale,
             mode, rowdist);
    cuda_check_launch(be, "ild_dist rows");
    cudaMemsetAsync(acc, 0, sizeof(double), stream);
    k_sum_rows<<<1, SUM_THREADS, 0, stream>>>(rowdist, N, acc);
    cuda_check_launch(be, "ild_dist sum");
    k_finish<<<1, 32, 0, stream>>>(loss, acc, scale);
    cuda_check_launch(be, "ild_dist finish");
    arena_reset(&be->scratch, mark); // stream order protects the buffers from the next op
}

// loss_plan's cap: one [C, ld] bf16 buffer within LOSS_BUF_BYTES.
static int64_t cu_loss_rows_max(be_t *be, int64_t V) {
    const int64_t ld = (V + 7) & ~(int64_t)7, rows = (int64_t)(LOSS_BUF_BYTES / ((size_t)ld * sizeof(bf16)));
    return rows > 1 ? rows : 1;
}

extern "C" void cuda_register_loss(be_t *be) {
    be->fused_ce = cu_fused_ce;
    be->loss_rows_max = cu_loss_rows_max;
    be->fused_kl = cu_fused_kl;
    be->ild_dist = cu_ild_dist;
}
