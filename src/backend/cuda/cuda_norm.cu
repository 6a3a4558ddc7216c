// RMSNorm, gated RMSNorm (GDN and Mamba-2 variants), L2 norm: forward and
// backward. One warp per normalised row (or group): fp32 sums, warp shuffles,
// 16-byte bf16 accesses when the row length and pointers allow. Rows are read
// twice (sum of squares, then output); the second read hits L1/L2. Each
// element is read and written by the same lane, so outputs may alias inputs.
// Weight gradients: per-(column tile, row slice) partial sums in the scratch
// arena, then a fixed-order reduce into dw; when the arena has no room, one
// block per column tile walks the same slices in the same order itself. No
// atomics: the same inputs give the same bits, with or without scratch.
#include "backend/cuda/cuda_vec.cuh"

enum { NORM_WARPS = 4 }; // rows per 128-thread block

#define WARP_ROW(q, nrows)                                                                                             \
    const int lane = threadIdx.x & 31;                                                                                 \
    const int64_t q = (int64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);                                           \
    if (q >= (nrows)) return; /* uniform per warp */

static inline unsigned norm_blocks(int64_t rows) { return (unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS); }

// ---- RMSNorm -------------------------------------------------------------------

// A row's lanes take a batch of vectors of V at a time: all their loads, then
// the math (in the same order as one at a time: the same bits) and the
// stores. Written as one loop of both, a store before the next load (which
// may alias it: outputs may be inputs) kept one load in flight, and a decode
// step's row of 3,072 (one warp) took some 10 us.
enum { NORM_BATCH = 8, NORM_BATCH_RW = 4 }; // a pass that reads x alone; one that reads more rows or writes

template <int V>
__global__ void k_rmsnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *w, int64_t N, int d, float eps) {
    WARP_ROW(n, N)
    const bf16 *xr = x + n * d;
    bf16 *o = out + n * d;
    float ss = 0.0f;
    for (int i0 = lane * V; i0 < d; i0 += 32 * V * NORM_BATCH) {
        float f[NORM_BATCH][V];
#pragma unroll
        for (int u = 0; u < NORM_BATCH; u++)
            if (i0 + u * 32 * V < d) ld_bf16<V>(xr + i0 + u * 32 * V, f[u]);
#pragma unroll
        for (int u = 0; u < NORM_BATCH; u++) {
            if (i0 + u * 32 * V >= d) break;
#pragma unroll
            for (int k = 0; k < V; k++)
                ss += f[u][k] * f[u][k];
        }
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i0 = lane * V; i0 < d; i0 += 32 * V * NORM_BATCH_RW) {
        float f[NORM_BATCH_RW][V], g[NORM_BATCH_RW][V];
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++) {
            const int i = i0 + u * 32 * V;
            if (i < d) ld_bf16<V>(xr + i, f[u]), ld_bf16<V>(w + i, g[u]);
        }
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++) {
            const int i = i0 + u * 32 * V;
            if (i >= d) break;
#pragma unroll
            for (int k = 0; k < V; k++)
                f[u][k] = f[u][k] * r * g[u][k];
            st_bf16<V>(o + i, f[u]);
        }
    }
    if (rstd && lane == 0) rstd[n] = r;
}

// x += y (rounded to bf16, as the separate add), then out = rmsnorm(x): x and
// y read twice (the sum of squares, then the stores; the second read hits
// L1), x written once.
template <int V>
__global__ void k_add_rmsnorm_fwd(bf16 *out, float *rstd, bf16 *x, const bf16 *y, const bf16 *w, int64_t N, int d,
                                  float eps) {
    WARP_ROW(n, N)
    bf16 *xr = x + n * d;
    const bf16 *yr = y + n * d;
    bf16 *o = out + n * d;
    float ss = 0.0f;
    for (int i0 = lane * V; i0 < d; i0 += 32 * V * NORM_BATCH_RW) {
        float f[NORM_BATCH_RW][V], g[NORM_BATCH_RW][V];
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++)
            if (i0 + u * 32 * V < d) ld_bf16<V>(xr + i0 + u * 32 * V, f[u]), ld_bf16<V>(yr + i0 + u * 32 * V, g[u]);
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++) {
            if (i0 + u * 32 * V >= d) break;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float v = __bfloat162float(__float2bfloat16_rn(f[u][k] + g[u][k]));
                ss += v * v;
            }
        }
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i0 = lane * V; i0 < d; i0 += 32 * V * NORM_BATCH_RW) {
        float f[NORM_BATCH_RW][V], g[NORM_BATCH_RW][V], ww[NORM_BATCH_RW][V];
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++) {
            const int i = i0 + u * 32 * V;
            if (i < d) ld_bf16<V>(xr + i, f[u]), ld_bf16<V>(yr + i, g[u]), ld_bf16<V>(w + i, ww[u]);
        }
#pragma unroll
        for (int u = 0; u < NORM_BATCH_RW; u++) {
            const int i = i0 + u * 32 * V;
            if (i >= d) break;
#pragma unroll
            for (int k = 0; k < V; k++)
                f[u][k] = __bfloat162float(__float2bfloat16_rn(f[u][k] + g[u][k]));
            st_bf16<V>(xr + i, f[u]);
#pragma unroll
            for (int k = 0; k < V; k++)
                f[u][k] = f[u][k] * r * ww[u][k];
            st_bf16<V>(o + i, f[u]);
        }
    }
    if (rstd && lane == 0) rstd[n] = r;
}

// dx = r (dy w - x r mean(dy w x r))
template <int V>
__global__ void k_rmsnorm_bwd(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *w, const float *rstd, int64_t N,
                              int d) {
    WARP_ROW(n, N)
    const bf16 *xr = x + n * d, *gr = dy + n * d;
    float r = rstd[n], dot = 0.0f;
    for (int i = lane * V; i < d; i += 32 * V) {
        float f[V], g[V], ww[V];
        ld_bf16<V>(xr + i, f);
        ld_bf16<V>(gr + i, g);
        ld_bf16<V>(w + i, ww);
#pragma unroll
        for (int k = 0; k < V; k++)
            dot += g[k] * ww[k] * f[k] * r;
    }
    float m = warp_sum(dot) / (float)d;
    for (int i = lane * V; i < d; i += 32 * V) {
        float f[V], g[V], ww[V];
        ld_bf16<V>(xr + i, f);
        ld_bf16<V>(gr + i, g);
        ld_bf16<V>(w + i, ww);
#pragma unroll
        for (int k = 0; k < V; k++)
            f[k] = r * (g[k] * ww[k] - f[k] * r * m);
        st_bf16<V>(dx + n * d + i, f);
    }
}

// ---- weight gradient of the (gated) RMSNorm ------------------------------------
// Row q < Q, column c < cols contributes dy[q*cols + c] x[q*cols + c] r(q, c)
// (times silu(z(q, c)) when gated). Plain RMSNorm: Q = N, cols = d, G = 1.
// Gated, w shared by the groups (w_len = gs): q = n*G + g runs over groups, cols
// = gs, r = rstd[q]. Gated, w per channel (w_len = G*gs): q = n, cols = G*gs,
// r = rstd[n*G + c/gs].
typedef struct {
    const bf16 *dy, *x, *z; // z NULL: plain RMSNorm
    int64_t ldz;
    const float *rstd;
    int64_t Q;
    int cols, G, gs, shared, mode;
} dw_args_t;

__device__ __forceinline__ float dw_term(const dw_args_t &a, int64_t q, int64_t c) {
    int64_t o = q * a.cols + c;
    float v = __bfloat162float(a.dy[o]) * __bfloat162float(a.x[o]);
    if (!a.z) return v * a.rstd[q]; // plain RMSNorm (G = 1): no 64-bit divisions
    float r;
    int64_t zo;
    if (a.shared) {
        r = a.rstd[q];
        zo = (q / a.G) * a.ldz + (q % a.G) * a.gs + c;
    } else {
        r = a.rstd[q * a.G + c / a.gs];
        zo = q * a.ldz + c;
    }
    float s = dev_silu(__bfloat162float(a.z[zo]));
    // the CPU's association order: NORM_THEN_GATE dy x r s, GATE_THEN_NORM dy x s r
    return a.mode == GNORM_NORM_THEN_GATE ? v * r * s : v * s * r;
}

// Block (32 columns) x (8 row lanes). Slice k holds rows [k per, (k+1) per);
// its column sum s_k: each lane sums its rows in order, then the 8 lanes are
// added in lane order. part != NULL: one slice per block (grid.y = nslices),
// s_k to part[k][c], k_dw_reduce adds them into dw. part == NULL (one slice,
// or no scratch): grid.y = 1 and the block walks the slices in order itself,
// dw[c] += ((0 + s_0) + s_1) + ...: the additions of k_dw_reduce, so both
// paths give the same bits. acc uses __fadd_rn so that no copy of this loop
// the compiler makes can fuse it into an FMA differently.
__global__ void k_norm_dw(float *part, float *dw, dw_args_t a, int64_t rows_per_slice, int64_t nslices) {
    __shared__ float sh[8][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx;
    float tot = 0.0f;
    for (int64_t k = blockIdx.y; k < nslices; k += gridDim.y) { // uniform over the block
        const int64_t q0 = k * rows_per_slice;
        const int64_t q1 = q0 + rows_per_slice < a.Q ? q0 + rows_per_slice : a.Q;
        float acc = 0.0f;
        if (c < a.cols)
            for (int64_t q = q0 + ty; q < q1; q += 8)
                acc = __fadd_rn(acc, dw_term(a, q, c));
        sh[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && c < a.cols) {
            float s = 0.0f;
#pragma unroll
            for (int l = 0; l < 8; l++)
                s += sh[l][tx];
            if (part)
                part[k * a.cols + c] = s;
            else
                tot += s;
        }
        __syncthreads(); // sh is written again for the next slice
    }
    if (!part && ty == 0 && c < a.cols) dw[c] += tot;
}

__global__ void k_dw_reduce(float *dw, const float *part, int64_t nslices, int64_t cols) {
    GRID_STRIDE(c, cols) {
        float s = 0.0f;
        for (int64_t k = 0; k < nslices; k++)
            s += part[k * cols + c];
        dw[c] += s;
    }
}

// The slices depend on the row count, the width and the number of
// multiprocessors only (not on the free scratch), so a run on one GPU model
// always sums in the same order.
static void norm_dw(be_t *be, float *dw, dw_args_t a, const char *what) {
    if (!dw || a.Q <= 0 || a.cols <= 0) return;
    int64_t colblocks = (a.cols + 31) / 32;
    // about 4 blocks per multiprocessor, at least 8 rows per slice
    int64_t slices = (4 * (int64_t)cuda_impl(be)->sm_count + colblocks - 1) / colblocks;
    if (slices > 1024) slices = 1024;
    if (slices > (a.Q + 7) / 8) slices = (a.Q + 7) / 8;
    if (slices < 1) slices = 1;
    int64_t per = (a.Q + slices - 1) / slices;
    slices = (a.Q + per - 1) / per;
    size_t mark = arena_mark(&be->scratch);
    float *part = slices > 1 ? (float *)cu_scratch_try(be, (size_t)slices * a.cols * sizeof(float)) : NULL;
    dim3 grid((unsigned)colblocks, part ? (unsigned)slices : 1u);
    k_norm_dw<<<grid, 256, 0, cuda_stream(be)>>>(part, dw, a, per, slices);
    cuda_check_launch(be, what);
    if (part) {
        k_dw_reduce<<<cu_grid(be, a.cols, 256), 256, 0, cuda_stream(be)>>>(dw, part, slices, a.cols);
        cuda_check_launch(be, what);
    }
    arena_reset(&be->scratch, mark);
}

static void cu_rmsnorm_fwd(be_t *be, void *out, float *rstd, const void *x, const void *w, int64_t N, int d,
                           float eps) {
    if (N <= 0 || d <= 0) return;
    int V = cu_vec_width((uintptr_t)out | (uintptr_t)x | (uintptr_t)w, (uint64_t)d);
    LAUNCH_V(V, k_rmsnorm_fwd, norm_blocks(N), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)out, rstd, (const bf16 *)x,
             (const bf16 *)w, N, d, eps);
    cuda_check_launch(be, "rmsnorm_fwd");
}

static void cu_add_rmsnorm_fwd(be_t *be, void *out, float *rstd, void *x, const void *y, const void *w, int64_t N,
                               int d, float eps) {
    if (N <= 0 || d <= 0) return;
    int V = cu_vec_width((uintptr_t)out | (uintptr_t)x | (uintptr_t)y | (uintptr_t)w, (uint64_t)d);
    LAUNCH_V(V, k_add_rmsnorm_fwd, norm_blocks(N), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)out, rstd, (bf16 *)x,
             (const bf16 *)y, (const bf16 *)w, N, d, eps);
    cuda_check_launch(be, "add_rmsnorm_fwd");
}

static void cu_rmsnorm_bwd(be_t *be, void *dx, float *dw, const void *dout, const void *x, const void *w,
                           const float *rstd, int64_t N, int d) {
    if (N <= 0 || d <= 0) return;
    int V = cu_vec_width((uintptr_t)dx | (uintptr_t)dout | (uintptr_t)x | (uintptr_t)w, (uint64_t)d);
    LAUNCH_V(V, k_rmsnorm_bwd, norm_blocks(N), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)dx, (const bf16 *)dout,
             (const bf16 *)x, (const bf16 *)w, rstd, N, d);
    cuda_check_launch(be, "rmsnorm_bwd");
    dw_args_t a = {(const bf16 *)dout, (const bf16 *)x, NULL, 0, rstd, N, d, 1, d, 1, 0};
    norm_dw(be, dw, a, "rmsnorm_bwd (dw)");
}

// ---- gated RMSNorm ---------------------------------------------------------------
// One warp per (row n, group g): x, out [N, G*gs] contiguous, z row stride ldz.

template <int V>
__global__ void k_gnorm_fwd(bf16 *out, float *rstd, const bf16 *x, const bf16 *z, int64_t ldz, const bf16 *w,
                            int shared, int64_t N, int G, int gs, float eps, int mode) {
    WARP_ROW(q, N * G)
    const int64_t n = q / G;
    const int g = (int)(q - n * G);
    const bf16 *xr = x + q * gs, *zr = z + n * ldz + (int64_t)g * gs, *wr = w + (shared ? 0 : (int64_t)g * gs);
    bf16 *o = out + q * gs;
    const bool gate_first = mode == GNORM_GATE_THEN_NORM;
    float ss = 0.0f;
    for (int i = lane * V; i < gs; i += 32 * V) {
        float f[V], zz[V];
        ld_bf16<V>(xr + i, f);
        if (gate_first) ld_bf16<V>(zr + i, zz);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float u = gate_first ? f[k] * dev_silu(zz[k]) : f[k];
            ss += u * u;
        }
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)gs + eps);
    for (int i = lane * V; i < gs; i += 32 * V) {
        float f[V], zz[V], ww[V];
        ld_bf16<V>(xr + i, f);
        ld_bf16<V>(zr + i, zz);
        ld_bf16<V>(wr + i, ww);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float s = dev_silu(zz[k]);
            f[k] = gate_first ? f[k] * s * r * ww[k] : f[k] * r * ww[k] * s;
        }
        st_bf16<V>(o + i, f);
    }
    if (rstd && lane == 0) rstd[q] = r;
}

// NORM_THEN_GATE: e = dy w s; dx = r (e - xh mean(e xh)), xh = x r; dz = dy xh w silu'(z)
// GATE_THEN_NORM: u = x s; du = r (dy w - uh mean(dy w uh)), uh = u r; dx = du s; dz = du x silu'(z)
template <int V>
__global__ void k_gnorm_bwd(bf16 *dx, bf16 *dz, int64_t lddz, const bf16 *dy, const bf16 *x, const bf16 *z, int64_t ldz,
                            const bf16 *w, int shared, const float *rstd, int64_t N, int G, int gs, int mode) {
    WARP_ROW(q, N * G)
    const int64_t n = q / G;
    const int g = (int)(q - n * G);
    const bf16 *xr = x + q * gs, *gr = dy + q * gs, *zr = z + n * ldz + (int64_t)g * gs;
    const bf16 *wr = w + (shared ? 0 : (int64_t)g * gs);
    bf16 *dxr = dx + q * gs, *dzr = dz + n * lddz + (int64_t)g * gs;
    const bool gate_first = mode == GNORM_GATE_THEN_NORM;
    const float r = rstd[q];
    float dot = 0.0f;
    for (int i = lane * V; i < gs; i += 32 * V) {
        float f[V], zz[V], ww[V], gg[V];
        ld_bf16<V>(xr + i, f);
        ld_bf16<V>(zr + i, zz);
        ld_bf16<V>(wr + i, ww);
        ld_bf16<V>(gr + i, gg);
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (gate_first) {
                float u = f[k] * dev_silu(zz[k]);
                dot += gg[k] * ww[k] * u * r;
            } else {
                dot += gg[k] * ww[k] * dev_silu(zz[k]) * f[k] * r;
            }
        }
    }
    const float m = warp_sum(dot) / (float)gs;
    for (int i = lane * V; i < gs; i += 32 * V) {
        float f[V], zz[V], ww[V], gg[V], ox[V], oz[V];
        ld_bf16<V>(xr + i, f);
        ld_bf16<V>(zr + i, zz);
        ld_bf16<V>(wr + i, ww);
        ld_bf16<V>(gr + i, gg);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float sg = dev_sigmoid(zz[k]), s = zz[k] * sg, dsilu = sg + zz[k] * sg * (1.0f - sg);
            if (gate_first) {
                float u = f[k] * s;
                float du = r * (gg[k] * ww[k] - u * r * m);
                ox[k] = du * s;
                oz[k] = du * f[k] * dsilu;
            } else {
                float e = gg[k] * ww[k] * s;
                ox[k] = r * (e - f[k] * r * m);
                oz[k] = gg[k] * f[k] * r * ww[k] * dsilu;
            }
        }
        st_bf16<V>(dxr + i, ox);
        st_bf16<V>(dzr + i, oz);
    }
}

static void cu_gated_rmsnorm_fwd(be_t *be, void *out, float *rstd, const void *x, const void *z, int64_t ldz,
                                 const void *w, int64_t w_len, int64_t N, int G, int gs, float eps, int mode) {
    if (N <= 0 || G <= 0 || gs <= 0) return;
    int shared = w_len == gs;
    int V = cu_vec_width((uintptr_t)out | (uintptr_t)x | (uintptr_t)z | (uintptr_t)w, (uint64_t)gs | (uint64_t)ldz);
    LAUNCH_V(V, k_gnorm_fwd, norm_blocks(N * G), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)out, rstd, (const bf16 *)x,
             (const bf16 *)z, ldz, (const bf16 *)w, shared, N, G, gs, eps, mode);
    cuda_check_launch(be, "gated_rmsnorm_fwd");
}

static void cu_gated_rmsnorm_bwd(be_t *be, void *dx, void *dz, int64_t lddz, float *dw, const void *dout, const void *x,
                                 const void *z, int64_t ldz, const void *w, int64_t w_len, const float *rstd, int64_t N,
                                 int G, int gs, int mode) {
    if (N <= 0 || G <= 0 || gs <= 0) return;
    int shared = w_len == gs;
    uintptr_t addr = (uintptr_t)dx | (uintptr_t)dz | (uintptr_t)dout | (uintptr_t)x | (uintptr_t)z | (uintptr_t)w;
    int V = cu_vec_width(addr, (uint64_t)gs | (uint64_t)ldz | (uint64_t)lddz);
    LAUNCH_V(V, k_gnorm_bwd, norm_blocks(N * G), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)dx, (bf16 *)dz, lddz,
             (const bf16 *)dout, (const bf16 *)x, (const bf16 *)z, ldz, (const bf16 *)w, shared, rstd, N, G, gs, mode);
    cuda_check_launch(be, "gated_rmsnorm_bwd");
    dw_args_t a = {(const bf16 *)dout,
                   (const bf16 *)x,
                   (const bf16 *)z,
                   ldz,
                   rstd,
                   shared ? N * G : N,
                   shared ? gs : G * gs,
                   G,
                   gs,
                   shared,
                   mode};
    norm_dw(be, dw, a, "gated_rmsnorm_bwd (dw)");
}

// ---- L2 norm ---------------------------------------------------------------------

template <int V>
__global__ void k_l2norm_fwd(bf16 *y, float *rnorm, const bf16 *x, int64_t ld, int64_t N, int dim, float eps) {
    WARP_ROW(n, N)
    const bf16 *xr = x + n * ld;
    float ss = 0.0f;
    for (int i = lane * V; i < dim; i += 32 * V) {
        float f[V];
        ld_bf16<V>(xr + i, f);
#pragma unroll
        for (int k = 0; k < V; k++)
            ss += f[k] * f[k];
    }
    float r = 1.0f / sqrtf(warp_sum(ss) + eps);
    for (int i = lane * V; i < dim; i += 32 * V) {
        float f[V];
        ld_bf16<V>(xr + i, f);
#pragma unroll
        for (int k = 0; k < V; k++)
            f[k] *= r;
        st_bf16<V>(y + n * ld + i, f);
    }
    if (rnorm && lane == 0) rnorm[n] = r;
}

// dx = r (dy - (dy . y) y)
template <int V>
__global__ void k_l2norm_bwd(bf16 *dx, int64_t ld, const bf16 *dy, const bf16 *y, const float *rnorm, int64_t N,
                             int dim) {
    WARP_ROW(n, N)
    const bf16 *gr = dy + n * ld, *yr = y + n * ld;
    float dot = 0.0f;
    for (int i = lane * V; i < dim; i += 32 * V) {
        float g[V], f[V];
        ld_bf16<V>(gr + i, g);
        ld_bf16<V>(yr + i, f);
#pragma unroll
        for (int k = 0; k < V; k++)
            dot += g[k] * f[k];
    }
    dot = warp_sum(dot);
    const float r = rnorm[n];
    for (int i = lane * V; i < dim; i += 32 * V) {
        float g[V], f[V];
        ld_bf16<V>(gr + i, g);
        ld_bf16<V>(yr + i, f);
#pragma unroll
        for (int k = 0; k < V; k++)
            g[k] = r * (g[k] - dot * f[k]);
        st_bf16<V>(dx + n * ld + i, g);
    }
}

static void cu_l2norm_fwd(be_t *be, void *y, float *rnorm, const void *x, int64_t ld, int64_t N, int dim, float eps) {
    if (N <= 0 || dim <= 0) return;
    int V = cu_vec_width((uintptr_t)y | (uintptr_t)x, (uint64_t)dim | (uint64_t)ld);
    LAUNCH_V(V, k_l2norm_fwd, norm_blocks(N), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)y, rnorm, (const bf16 *)x, ld,
             N, dim, eps);
    cuda_check_launch(be, "l2norm_fwd");
}

static void cu_l2norm_bwd(be_t *be, void *dx, int64_t ld, const void *dy, const void *y, const float *rnorm, int64_t N,
                          int dim) {
    if (N <= 0 || dim <= 0) return;
    int V = cu_vec_width((uintptr_t)dx | (uintptr_t)dy | (uintptr_t)y, (uint64_t)dim | (uint64_t)ld);
    LAUNCH_V(V, k_l2norm_bwd, norm_blocks(N), 32 * NORM_WARPS, cuda_stream(be), (bf16 *)dx, ld, (const bf16 *)dy,
             (const bf16 *)y, rnorm, N, dim);
    cuda_check_launch(be, "l2norm_bwd");
}

extern "C" void cuda_register_norm(be_t *be) {
    be->rmsnorm_fwd = cu_rmsnorm_fwd;
    be->add_rmsnorm_fwd = cu_add_rmsnorm_fwd;
    be->rmsnorm_bwd = cu_rmsnorm_bwd;
    be->gated_rmsnorm_fwd = cu_gated_rmsnorm_fwd;
    be->gated_rmsnorm_bwd = cu_gated_rmsnorm_bwd;
    be->l2norm_fwd = cu_l2norm_fwd;
    be->l2norm_bwd = cu_l2norm_bwd;
}
