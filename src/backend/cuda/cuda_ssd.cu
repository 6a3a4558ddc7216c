// Mamba-2 SSD on the GPU (spec linear_blocks.md §3.5-3.9): softplus(dt +
// dt_bias), the chunked scan forward and backward, and the decode recurrence.
// Same semantics as the CPU reference (cpu_ssd.c): head h reads x head
// h/(H/Hx), B group h/(H/GB), C group h/(H/GC); x, B, C rows have strides
// ldx, ldb, ldc; the chunk length is the caller's (L = min(chunk, T), the last
// chunk possibly short). Per (sequence b, head h), A = -exp(A_log[h]), cs the
// chunk-local inclusive cumsum of dA = dt A (fp32, <= 0 and non-increasing):
//   states[c] = sum_s exp(cs_last - cs_s) dt_s x_s B_s^T              (S2)
//   prev[c+1] = exp(cs_last) prev[c] + states[c]                       (S3)
//   y_l = exp(cs_l) prev[c] C_l + sum_{s<=l} (C_l.B_s) exp(cs_l - cs_s) dt_s x_s + D x_l   (S4, S5)
//
// Forward kernels, in order:
//   k_ssd_cumsum       cs [B,T,H] fp32: one thread per (b, chunk, h), sequential in t
//                      (the CPU's order and rounding).
//   k_ssd_chunk_state  S2: states[c] = X^T diag(w) B, one block per (chunk, b, h), mma.sync
//                      m16n8k16 (bf16 operands, fp32 accumulators); w folded into B on its
//                      way to shared memory.
//   k_ssd_pass_fwd     S3 in place over the states (states[c] -> prev[c]): sequential over
//                      chunks, parallel over (b, h) and the P*N elements (float4 per thread);
//                      the final state goes to `state`.
//   k_ssd_scan_fwd     S4 + S5, shaped like a flash-attention forward without softmax: one
//                      block per (64-row tile l of a chunk, b, h), 4 warps of 16 rows; the
//                      inter-chunk term C_l prev^T first (prev rounded to bf16 as upstream),
//                      then over source tiles s <= l: CB = C_l B_s^T on tensor cores, weights
//                      CB exp(cs_l - cs_s) dt_s masked to s <= l, rounded to bf16 in registers
//                      and multiplied with x_s (.trans ldmatrix), + D x_l.
//
// Backward (spec §3.6 R1-R11), with G[c] the gradient of prev[c]:
//   R1   k_ssd_cumsum, k_ssd_chunk_state, k_ssd_pass_fwd again -> prev[c] (fp32).
//   R3   k_ssd_chunk_state (mode 1): dprev[c] = sum_l exp(cs_l) dy_l C_l^T.
//   R4   k_ssd_pass_bwd: reverse over chunks, in place (dprev[c] -> dstates[c] = G[c+1]),
//        per-warp partial dots of prev[c] . G[c+1] (ddA_chunk / exp(cs_last)), dstate0 = G[0].
//   R5   k_ssd_bwd_dx (source side, a block per (64-row tile s, chunk, b, x head)): for each
//        head reading that x head, in a fixed order, acc_s = exp(cs_last - cs_s) dstates B_s +
//        sum_{l>=s} CB[l,s] exp(cs_l - cs_s) dy_l (CB^T = B_s C_l^T and dy_l x_s^T on tensor
//        cores); dx_s += dt_s acc_s + D dy_s summed in registers over the heads (the GQA sum,
//        deterministic); per (s, h): ddt (direct) = acc_s.x_s, dD = dy_s.x_s and two decay terms.
//   R6   k_ssd_bwd_dB (source side, a block per (tile, chunk, b, B group)): dB_s += dt_s
//        exp(cs_last - cs_s) x_s dstates + sum_l dCB[l,s] C_l, summed over the group's heads.
//   R7-9 k_ssd_bwd_dC (target side, a block per (tile l, chunk, b, C group)): dC_l += exp(cs_l)
//        dy_l prev + sum_{s<=l} dCB[l,s] B_s, with dCB[l,s] = dt_s exp(cs_l - cs_s) dy_l.x_s.
//   R10  k_ssd_bwd_final: the decay gradients (below), ddt = ddA A + ddt(direct), per-chunk
//        partials of dA and dD; R11 k_ssd_param_grads: dA_log += A sum dA, dD += sum dD, one
//        block per head summing the partials in a fixed order (no atomics anywhere).
//
// Decay gradients. Every exponent is a sum of per-step dA_r; the gradient of dA_r collects
// the terms whose exponent contains it (spec R10, "stable"), never a difference of large
// totals over the sequence. With M[l,s] = dCB[l,s] CB[l,s] (l > s) the intra-chunk part is
// sum_{s < r <= l} M[l,s] = sum_{j<r} (colsum_j M - rowsum_j M) exactly (the pairs with
// l < r cancel between the two sums), so the source side keeps R_j = sum_{l>j} M[l,j] and
// the target side C_j = sum_{s<j} M[j,s], each a plain row sum of tiles it already holds;
// the cancellation is of fp32 sums inside one chunk (relative error <= L * 2^-24 of the
// chunk's |M| mass, far below the bf16 operand error). Then per chunk
//   ddA_r = sum_{j<r} (R_j - C_j + u_j) + sum_{j>=r} ddAcs_prev_j + ddA_chunk
// with u_s = dt_s exp(cs_last - cs_s) x_s.(dstates B_s) (the chunk-state decay) and
// ddAcs_prev_l = exp(cs_l) C_l.(dy_l prev) (the inter-chunk decay), as in cpu_ssd.c.
//
// Head and state sizes: P and N are multiples of 16 up to 128; the kernels are
// instantiated for (P, N) padded to 64 or 128 (the padding is zero-filled in
// shared memory and never stored). Chunks of any length 1..1024.
//
// Scratch (be->scratch; an ERR_INPUT naming the size when it is too small), with
// BTH = B*T*H floats, S = B*H*nc*P*N floats (nc = ceil(T / min(chunk, T))):
//   forward   4 * (BTH + S) bytes                 (cs, chunk states -> prev)
//   backward  4 * (6 BTH + 2 S + B*H*nc*(8*ceil(P*N/1024) + 2)) bytes
// i.e. per token 4*H*(1 + P*N/chunk) bytes forward: 2.1 KiB for H = 32, P = N = 64
// and 6.1 KiB for H = 24, P = N = 128 at chunk 256, about twice that backward
// (cuda_ssd_scratch_bytes() below computes it). The decode state is
// B*H*P*N*4 bytes (the caller's), read and written once per step.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_ssd.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_vec.cuh"

#define SSD_LOG2E 1.4426950408889634f
#define SSD_BR 64      // rows per block of the row-tiled kernels: 4 warps x 16
#define SSD_KT 64      // rows of one K tile in k_ssd_chunk_state
#define SSD_MAX_L 1024 // longest chunk: its decays live in shared memory (8 bytes a row)
#define PASS_T 256     // threads of the state-passing kernels, 4 floats each
#define STEP_RW 4      // state rows per warp in the decode kernel
#define FULL_MASK 0xffffffffu
// k-steps unrolled in the products with both operands in shared memory: bounds
// the fragments the compiler hoists (registers), the accumulators do not depend on k.
static constexpr int ssd_kunroll = 4;

// ---- device helpers (the PTX wrappers are in cuda_mma.cuh) -------------------

static __device__ __forceinline__ float bf(bf16 v) { return __bfloat162float(v); }

// Two consecutive bf16 (4-byte aligned) as floats.
static __device__ __forceinline__ float2 ld_pair(const bf16 *p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
// Two consecutive bf16 stores; one 4-byte store when aligned (row strides may be odd).
static __device__ __forceinline__ void st_pair(bf16 *p, float a, float b) {
    if (((uintptr_t)p & 3) == 0) {
        *reinterpret_cast<uint32_t *>(p) = pack_bf16(a, b);
    } else {
        p[0] = __float2bfloat16_rn(a);
        p[1] = __float2bfloat16_rn(b);
    }
}

// ldmatrix lane byte offsets in a tile with row stride S elements:
//  lane_a: A operand stored [m][k] (non-trans), or B operand stored [k][n] (.trans):
//          row lane & 15, column half lane >> 4.
//  lane_b: B operand stored [n][k] (non-trans), or A operand stored [k][m] (.trans):
//          row (lane & 7) + 8 (lane >> 4), column half (lane >> 3) & 1.
static __device__ __forceinline__ uint32_t lane_a(int lane, int S) {
    return (uint32_t)(((lane & 15) * S + (lane >> 4) * 8) * 2);
}
static __device__ __forceinline__ uint32_t lane_b(int lane, int S) {
    return (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * S + ((lane >> 3) & 1) * 8) * 2);
}

template <int NT> static __device__ __forceinline__ void zero_acc(float (&a)[NT][4]) {
#pragma unroll
    for (int i = 0; i < NT; i++)
        a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.f;
}

// acc[16, 8 NT] += A[16, 16 KS] Bn^T: A row-major [m][k] (aA: this lane's address
// of k = 0, lane_a), Bn stored [n][k] with row stride SB (bB: lane_b).
template <int KS, int NT>
static __device__ __forceinline__ void mma_a_bn(float (&acc)[NT][4], uint32_t aA, uint32_t bB, int SB) {
#pragma unroll ssd_kunroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4];
        ldsm_x4(a, aA + kk * 32);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t b[4];
            ldsm_x4(b, bB + (uint32_t)((n2 * 16 * SB + kk * 16) * 2));
            mma_bf16(acc[2 * n2], a, b[0], b[1]);
            mma_bf16(acc[2 * n2 + 1], a, b[2], b[3]);
        }
    }
}
// acc += A Bk: A as above, Bk stored [k][n] with row stride SB (bB: lane_a, .trans).
template <int KS, int NT>
static __device__ __forceinline__ void mma_a_bk(float (&acc)[NT][4], uint32_t aA, uint32_t bB, int SB) {
#pragma unroll ssd_kunroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4];
        ldsm_x4(a, aA + kk * 32);
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t b[4];
            ldsm_x4_t(b, bB + (uint32_t)((kk * 16 * SB + n2 * 16) * 2));
            mma_bf16(acc[2 * n2], a, b[0], b[1]);
            mma_bf16(acc[2 * n2 + 1], a, b[2], b[3]);
        }
    }
}
// acc += A Bk with A in registers (KS fragments).
template <int KS, int NT>
static __device__ __forceinline__ void mma_r_bk(float (&acc)[NT][4], const uint32_t (&a)[KS][4], uint32_t bB, int SB) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t b[4];
            ldsm_x4_t(b, bB + (uint32_t)((kk * 16 * SB + n2 * 16) * 2));
            mma_bf16(acc[2 * n2], a[kk], b[0], b[1]);
            mma_bf16(acc[2 * n2 + 1], a[kk], b[2], b[3]);
        }
    }
}

// Accumulators of n-tiles 2k, 2k+1 (rows 16, columns 16k..16k+15) as the A
// fragment of k-chunk k, rounded to bf16.
template <int KS> static __device__ __forceinline__ void to_afrag(uint32_t (&a)[KS][4], const float (&s)[2 * KS][4]) {
#pragma unroll
    for (int k = 0; k < KS; k++) {
        a[k][0] = pack_bf16(s[2 * k][0], s[2 * k][1]);
        a[k][1] = pack_bf16(s[2 * k][2], s[2 * k][3]);
        a[k][2] = pack_bf16(s[2 * k + 1][0], s[2 * k + 1][1]);
        a[k][3] = pack_bf16(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
}

// Rows [0, ROWS) of a tile whose row 0 is at g (row stride gs elements) into
// shared memory (row stride ss), columns [0, D); rows >= nv and columns >= d are
// zero. vec: 16-byte cp.async (g 16-byte aligned and gs % 8 == 0), else plain
// loads and stores (complete before the caller's barrier).
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void tile_load(bf16 *s, int ss, const bf16 *g, int64_t gs, int nv, int d, int tid,
                                                 int vec) {
    if (vec) {
        constexpr int CH = D / 8, TOTAL = ROWS * CH;
#pragma unroll 4
        for (int i = tid; i < TOTAL; i += NT) {
            const int r = i / CH, c = (i - r * CH) * 8;
            const bool ok = r < nv && c < d;
            cp_async16(smem_u32(s + r * ss + c), ok ? (const void *)(g + (int64_t)r * gs + c) : (const void *)g, ok);
        }
    } else {
        const bf16 z = __float2bfloat16_rn(0.f);
        for (int i = tid; i < ROWS * D; i += NT) {
            const int r = i / D, c = i - r * D;
            s[r * ss + c] = (r < nv && c < d) ? g[(int64_t)r * gs + c] : z;
        }
    }
}

// A fp32 [P, N] state (16-byte aligned rows) as bf16 [DR, DC] in shared memory, zero-padded.
template <int DR, int DC, int NT>
static __device__ __forceinline__ void state_load(bf16 *s, int ss, const float *g, int P, int N, int tid) {
    constexpr int Q = DC / 4;
#pragma unroll 4
    for (int i = tid; i < DR * Q; i += NT) {
        const int r = i / Q, c = (i - r * Q) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < P && c < N) v = *reinterpret_cast<const float4 *>(g + (int64_t)r * N + c);
        uint2 u;
        u.x = pack_bf16(v.x, v.y);
        u.y = pack_bf16(v.z, v.w);
        *reinterpret_cast<uint2 *>(s + r * ss + c) = u;
    }
}

// Deterministic block reductions (fixed shuffle tree, then the warps' totals in order).
static __device__ float block_sum(float v, float *sh) { return block_reduce(v, false, sh); }
// Exclusive prefix sum over the block in thread order; *tot = the block's total.
static __device__ float block_excl_scan(float v, float *sh, float *tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float n = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += n;
    }
    float ex = __shfl_up_sync(FULL_MASK, inc, 1);
    if (lane == 0) ex = 0.f;
    __syncthreads(); // sh free
    if (lane == 31) sh[warp] = inc;
    __syncthreads();
    float off = 0.f, t = 0.f;
    for (int w = 0; w < nw; w++) {
        const float s = sh[w];
        if (w < warp) off += s;
        t += s;
    }
    *tot = t;
    return off + ex;
}

// ---- shapes -----------------------------------------------------------------

// Everything a kernel needs to find a row: row r of the [B*T] rows (r = b*T + t).
typedef struct {
    const bf16 *x, *Bm, *Cm, *dy; // dy [B,T,H,P] (backward only)
    int64_t ldx, ldb, ldc, ldy;
    const float *dt, *cs; // [B,T,H]: dt after softplus, chunk-local cumsum of dt A
    const bf16 *A_log, *D;
    int B, T, H, rx, rb, rc; // heads per x head, per B group, per C group
    int P, N, L, nc, ntile;  // chunk length, chunks, 64-row tiles per chunk
    int vx, vb, vc, vy;      // 16-byte copies allowed for x, B, C, dy
} ssd_dims_t;

static __device__ __forceinline__ const bf16 *x_row(const ssd_dims_t &a, int64_t r, int h) {
    return a.x + r * a.ldx + (int64_t)(h / a.rx) * a.P;
}
static __device__ __forceinline__ const bf16 *b_row(const ssd_dims_t &a, int64_t r, int h) {
    return a.Bm + r * a.ldb + (int64_t)(h / a.rb) * a.N;
}
static __device__ __forceinline__ const bf16 *c_row(const ssd_dims_t &a, int64_t r, int h) {
    return a.Cm + r * a.ldc + (int64_t)(h / a.rc) * a.N;
}
static __device__ __forceinline__ const bf16 *dy_row(const ssd_dims_t &a, int64_t r, int h) {
    return a.dy + r * a.ldy + (int64_t)h * a.P;
}

// Chunk-local positions [lo, hi) of head h: cs in log2 units (for ex2) and dt.
static __device__ __forceinline__ void chunk_load(float *cs2, float *dts, const ssd_dims_t &a, int64_t row0, int h,
                                                  int lo, int hi, int tid, int nt) {
    for (int i = lo + tid; i < hi; i += nt) {
        const int64_t k = (row0 + i) * a.H + h;
        cs2[i] = a.cs[k] * SSD_LOG2E;
        dts[i] = a.dt[k];
    }
}

// ---- softplus(dt + dt_bias) ---------------------------------------------------

__global__ void k_softplus_bias_fwd(float *__restrict__ out, const bf16 *__restrict__ dt, int64_t ld,
                                    const bf16 *__restrict__ bias, int64_t N, int H) {
    GRID_STRIDE(i, N * H) {
        const int64_t n = i / H;
        const int h = (int)(i - n * H);
        const float v = bf(dt[n * ld + h]) + bf(bias[h]);
        out[i] = dev_softplus(v);
    }
}

// ddt = dout * sigmoid(v) (dout in the identity branch); each block sums its rows'
// fp32 ddt per head into part[blockIdx.x, h] (or straight into ddt_bias when part is NULL).
__global__ void __launch_bounds__(256)
    k_softplus_bias_bwd(bf16 *__restrict__ ddt, int64_t ldd, float *__restrict__ part, float *__restrict__ ddt_bias,
                        const float *__restrict__ dout, const bf16 *__restrict__ dt, int64_t ld,
                        const bf16 *__restrict__ bias, int64_t N, int H, int64_t rows_per_blk) {
    __shared__ float sh[8][33];
    const int h = blockIdx.y * 32 + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_blk, r1 = min(N, r0 + rows_per_blk);
    float sum = 0.f;
    if (h < H) {
        const float bh = bf(bias[h]);
        for (int64_t n = r0 + threadIdx.y; n < r1; n += 8) {
            const float v = bf(dt[n * ld + h]) + bh, g = dout[n * H + h];
            const float d = v > 20.f ? g : g * dev_sigmoid(v);
            ddt[n * ldd + h] = __float2bfloat16_rn(d);
            sum += d;
        }
    }
    sh[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && h < H) {
        float s = 0.f;
        for (int y = 0; y < 8; y++)
            s += sh[y][threadIdx.x];
        if (part)
            part[(int64_t)blockIdx.x * H + h] = s;
        else
            ddt_bias[h] += s;
    }
}

__global__ void k_softplus_bias_sum(float *__restrict__ ddt_bias, const float *__restrict__ part, int nblk, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float s = 0.f;
    for (int k = 0; k < nblk; k++) // fixed order: deterministic
        s += part[(int64_t)k * H + h];
    ddt_bias[h] += s;
}

// ---- S1: chunk-local cumsum ------------------------------------------------------

// One thread per (b, chunk, h), h fastest (coalesced across the warp at each t).
__global__ void k_ssd_cumsum(float *__restrict__ cs, const float *__restrict__ dt, const bf16 *__restrict__ A_log,
                             int B, int T, int H, int L, int nc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)B * nc * H) return;
    const int h = (int)(i % H);
    const int64_t r = i / H;
    const int c = (int)(r % nc), b = (int)(r / nc);
    const float A = -expf(bf(A_log[h])); // fp32, as upstream
    const int t0 = c * L, t1 = min(t0 + L, T);
    float acc = 0.f;
    for (int t = t0; t < t1; t++) {
        const int64_t k = ((int64_t)b * T + t) * H + h;
        acc = __fadd_rn(acc, __fmul_rn(dt[k], A)); // no contraction: the CPU's rounding
        cs[k] = acc;
    }
}

// ---- S2 / R3: chunk states ----------------------------------------------------------

// out[b,h,c] (fp32 [P,N]) = U^T diag(w) V over the rows of chunk c:
//   mode 0 (S2): U = x, V = B, w_s = exp(cs_last - cs_s) dt_s: the state the chunk leaves from zero
//   mode 1 (R3): U = dy, V = C, w_l = exp(cs_l): the gradient of the state entering the chunk
// DP/16 warps, each owning 16 rows p and all N columns.
template <int DP, int DN>
__global__ void __launch_bounds__(DP * 2) k_ssd_chunk_state(float *__restrict__ out, int mode, ssd_dims_t a) {
    constexpr int NT = DP * 2, SP = DP + 8, SN = DN + 8;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sU = (bf16 *)smem_raw;             // [KT][SP]
    bf16 *sV = sU + SSD_KT * SP;             // [KT][SN], rows scaled by w
    float *sw = (float *)(sV + SSD_KT * SN); // [L]
    const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh - b * a.H;
    const int t0 = c * a.L, len = min(a.L, a.T - t0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const bf16 *U = mode ? dy_row(a, row0, h) : x_row(a, row0, h);
    const bf16 *V = mode ? c_row(a, row0, h) : b_row(a, row0, h);
    const int64_t ldu = mode ? a.ldy : a.ldx, ldv = mode ? a.ldc : a.ldb;
    const int vu = mode ? a.vy : a.vx, vv = mode ? a.vc : a.vb;
    const float last = a.cs[(row0 + len - 1) * a.H + h];
    for (int i = tid; i < len; i += NT) {
        const int64_t k = (row0 + i) * a.H + h;
        sw[i] = mode ? expf(a.cs[k]) : expf(last - a.cs[k]) * a.dt[k]; // as cpu_ssd.c
    }
    float acc[DN / 8][4];
    zero_acc(acc);
    const uint32_t aU = smem_u32(sU) + lane_b(lane, SP) + warp * 32; // A^T stored [k][m], m offset 16 warp
    const uint32_t bV = smem_u32(sV) + lane_a(lane, SN);
    for (int k0 = 0; k0 < len; k0 += SSD_KT) {
        __syncthreads(); // sw written; the previous tile consumed
        const int nv = len - k0;
        tile_load<SSD_KT, DP, NT>(sU, SP, U + (int64_t)k0 * ldu, ldu, nv, a.P, tid, vu);
        cp_async_commit();
        for (int i = tid; i < SSD_KT * (DN / 8); i += NT) {
            const int r = i / (DN / 8), cc = (i - r * (DN / 8)) * 8;
            float f[8];
            if (r < nv && cc < a.N) {
                const bf16 *src = V + (int64_t)(k0 + r) * ldv + cc;
                if (vv) {
                    ld_bf16<8>(src, f);
                } else {
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        f[q] = bf(src[q]);
                }
                const float w = sw[k0 + r];
#pragma unroll
                for (int q = 0; q < 8; q++)
                    f[q] *= w;
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++)
                    f[q] = 0.f;
            }
            st_bf16<8>(sV + r * SN + cc, f);
        }
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SSD_KT / 16; kk++) {
            if (k0 + kk * 16 < len) { // warp-uniform
                uint32_t af[4];
                ldsm_x4_t(af, aU + (uint32_t)(kk * 16 * SP * 2));
#pragma unroll
                for (int n2 = 0; n2 < DN / 16; n2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bV + (uint32_t)((kk * 16 * SN + n2 * 16) * 2));
                    mma_bf16(acc[2 * n2], af, bb[0], bb[1]);
                    mma_bf16(acc[2 * n2 + 1], af, bb[2], bb[3]);
                }
            }
        }
    }
    float *o = out + ((int64_t)bh * a.nc + c) * a.P * a.N;
    const int p0 = warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < DN / 8; nt++) {
        const int n = nt * 8 + 2 * t4;
        if (n >= a.N) continue;
        if (p0 < a.P) *reinterpret_cast<float2 *>(o + (int64_t)p0 * a.N + n) = make_float2(acc[nt][0], acc[nt][1]);
        if (p0 + 8 < a.P)
            *reinterpret_cast<float2 *>(o + (int64_t)(p0 + 8) * a.N + n) = make_float2(acc[nt][2], acc[nt][3]);
    }
}

// ---- S3 / R4: state passing ------------------------------------------------------------

static __device__ __forceinline__ float cs_last(const float *csb, int c, int L, int T, int H) {
    return csb[(int64_t)(min((c + 1) * L, T) - 1) * H];
}

// st [B*H, nc, P*N]: in states[c], out prev[c] (the state entering chunk c).
// s_in [B*H, P*N] (NULL: zeros) enters chunk 0; s_out (NULL or anything, may
// alias s_in: each thread reads its elements before it writes them) gets the final state.
__global__ void __launch_bounds__(PASS_T)
    k_ssd_pass_fwd(float *__restrict__ st, const float *s_in, float *s_out, const float *__restrict__ cs, int T, int H,
                   int L, int nc, int64_t PN) {
    const int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t e = ((int64_t)blockIdx.x * PASS_T + threadIdx.x) * 4;
    if (e >= PN) return;
    float4 s = s_in ? *reinterpret_cast<const float4 *>(s_in + (int64_t)bh * PN + e) : make_float4(0.f, 0.f, 0.f, 0.f);
    float *p = st + (int64_t)bh * nc * PN + e;
    const float *csb = cs + (int64_t)b * T * H + h;
    int c = 0;
    for (; c + 4 <= nc; c += 4) { // four chunks' loads in flight
        float4 v[4];
        float d[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = *reinterpret_cast<const float4 *>(p + (int64_t)(c + k) * PN);
            d[k] = expf(cs_last(csb, c + k, L, T, H));
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            *reinterpret_cast<float4 *>(p + (int64_t)(c + k) * PN) = s;
            s.x = d[k] * s.x + v[k].x, s.y = d[k] * s.y + v[k].y, s.z = d[k] * s.z + v[k].z, s.w = d[k] * s.w + v[k].w;
        }
    }
    for (; c < nc; c++) {
        const float4 v = *reinterpret_cast<const float4 *>(p + (int64_t)c * PN);
        const float d = expf(cs_last(csb, c, L, T, H));
        *reinterpret_cast<float4 *>(p + (int64_t)c * PN) = s;
        s.x = d * s.x + v.x, s.y = d * s.y + v.y, s.z = d * s.z + v.z, s.w = d * s.w + v.w;
    }
    if (s_out) *reinterpret_cast<float4 *>(s_out + (int64_t)bh * PN + e) = s;
}

// Reverse pass. g [B*H, nc, P*N]: in dprev[c] = sum_l exp(cs_l) dy_l C_l^T, out
// dstates[c] = G[c+1], the gradient of the state chunk c leaves (running G: the
// final state's gradient, then G = exp(cs_last) G + dprev[c]). pdot[(bh, c), part]
// = this warp's share of sum prev[c] * G[c+1] (times exp(cs_last): ddA_chunk).
// dfinal NULL = zeros; d0 (NULL: not wanted) = G[0].
__global__ void __launch_bounds__(PASS_T)
    k_ssd_pass_bwd(float *__restrict__ g, const float *__restrict__ prev, float *__restrict__ pdot,
                   const float *__restrict__ dfinal, float *__restrict__ d0, const float *__restrict__ cs, int T, int H,
                   int L, int nc, int64_t PN, int nparts) {
    const int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t e = ((int64_t)blockIdx.x * PASS_T + threadIdx.x) * 4;
    const bool ok = e < PN; // no early return: the warp sums need every lane
    float4 G = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok && dfinal) G = *reinterpret_cast<const float4 *>(dfinal + (int64_t)bh * PN + e);
    float *gp = g + (int64_t)bh * nc * PN + (ok ? e : 0);
    const float *pp = prev + (int64_t)bh * nc * PN + (ok ? e : 0);
    float *dp = pdot + (int64_t)bh * nc * nparts + blockIdx.x * (PASS_T / 32) + warp;
    const float *csb = cs + (int64_t)b * T * H + h;
    for (int c = nc - 1; c >= 0; c -= 4) {
        const int nb = c >= 3 ? 4 : c + 1; // chunks c, c-1, ... of this batch
        float4 gv[4], pv[4];
        float d[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            gv[k] = pv[k] = make_float4(0.f, 0.f, 0.f, 0.f);
            d[k] = 0.f;
            if (k < nb) {
                if (ok) {
                    gv[k] = *reinterpret_cast<const float4 *>(gp + (int64_t)(c - k) * PN);
                    pv[k] = *reinterpret_cast<const float4 *>(pp + (int64_t)(c - k) * PN);
                }
                d[k] = expf(cs_last(csb, c - k, L, T, H));
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (k < nb) {
                if (ok) *reinterpret_cast<float4 *>(gp + (int64_t)(c - k) * PN) = G;
                float dot = G.x * pv[k].x + G.y * pv[k].y + G.z * pv[k].z + G.w * pv[k].w;
                dot = warp_sum(dot);
                if (lane == 0) dp[(int64_t)(c - k) * nparts] = dot;
                G.x = d[k] * G.x + gv[k].x, G.y = d[k] * G.y + gv[k].y, G.z = d[k] * G.z + gv[k].z,
                G.w = d[k] * G.w + gv[k].w;
            }
        }
    }
    if (ok && d0) *reinterpret_cast<float4 *>(d0 + (int64_t)bh * PN + e) = G;
}

// ---- S4 + S5: chunk scan (forward) ----------------------------------------------------

template <int DP, int DN, int BC> static size_t smem_scan(int L) {
    return sizeof(bf16) * ((size_t)SSD_BR * (DN + 8) + (size_t)DP * (DN + 8) + 2 * (size_t)BC * (DN + 8) +
                           2 * (size_t)BC * (DP + 8)) +
           2 * sizeof(float) * (size_t)L;
}

// One block per (64-row tile of chunk c, b, h), the heaviest tiles of a chunk first.
template <int DP, int DN, int BC>
__global__ void __launch_bounds__(128)
    k_ssd_scan_fwd(bf16 *__restrict__ y, const float *__restrict__ prev, ssd_dims_t a) {
    constexpr int SP = DP + 8, SN = DN + 8, NT = 128;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sC = (bf16 *)smem_raw; // [BR][SN]   C, rows l of the tile
    bf16 *sS = sC + SSD_BR * SN; // [DP][SN]   entering state, bf16
    bf16 *sB = sS + DP * SN;     // [2][BC][SN] B, rows s
    bf16 *sX = sB + 2 * BC * SN; // [2][BC][SP] x, rows s
    float *cs2 = (float *)(sX + 2 * BC * SP), *dts = cs2 + a.L;
    const int c = blockIdx.x / a.ntile, tile = a.ntile - 1 - (int)(blockIdx.x % a.ntile);
    const int bh = blockIdx.y, b = bh / a.H, h = bh - b * a.H;
    const int t0 = c * a.L, len = min(a.L, a.T - t0), r0 = tile * SSD_BR;
    if (r0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const bf16 *xr = x_row(a, row0, h), *br = b_row(a, row0, h), *cr = c_row(a, row0, h);
    const int s_end = min(len, r0 + SSD_BR), ns = (s_end + BC - 1) / BC;

    tile_load<SSD_BR, DN, NT>(sC, SN, cr + (int64_t)r0 * a.ldc, a.ldc, len - r0, a.N, tid, a.vc);
    tile_load<BC, DN, NT>(sB, SN, br, a.ldb, len, a.N, tid, a.vb);
    tile_load<BC, DP, NT>(sX, SP, xr, a.ldx, len, a.P, tid, a.vx);
    cp_async_commit();
    state_load<DP, DN, NT>(sS, SN, prev + ((int64_t)bh * a.nc + c) * a.P * a.N, a.P, a.N, tid);
    chunk_load(cs2, dts, a, row0, h, 0, s_end, tid, NT);
    cp_async_wait<0>();
    __syncthreads();

    const int l0 = r0 + warp * 16 + g, l1 = l0 + 8; // this thread's rows (chunk-local)
    const bool wact = r0 + warp * 16 < len;
    const float c0 = l0 < len ? cs2[l0] : 0.f, c1 = l1 < len ? cs2[l1] : 0.f;
    const uint32_t aC = smem_u32(sC) + lane_a(lane, SN) + (uint32_t)(warp * 16 * SN * 2);

    // inter-chunk: exp(cs_l) C_l prev^T
    float o[DP / 8][4];
    zero_acc(o);
    mma_a_bn<DN / 16, DP / 8>(o, aC, smem_u32(sS) + lane_b(lane, SN), SN);
    {
        const float e0 = exp2_approx(c0), e1 = exp2_approx(c1);
#pragma unroll
        for (int nt = 0; nt < DP / 8; nt++)
            o[nt][0] *= e0, o[nt][1] *= e0, o[nt][2] *= e1, o[nt][3] *= e1;
    }

    // intra-chunk over source tiles s <= l
    for (int j = 0; j < ns; j++) {
        if (j > 0) {
            cp_async_wait<0>();
            __syncthreads(); // tile j visible; everyone done with tile j-1
        }
        if (j + 1 < ns) {
            const int s1 = (j + 1) * BC, nb = (j + 1) & 1;
            tile_load<BC, DN, NT>(sB + nb * BC * SN, SN, br + (int64_t)s1 * a.ldb, a.ldb, len - s1, a.N, tid, a.vb);
            tile_load<BC, DP, NT>(sX + nb * BC * SP, SP, xr + (int64_t)s1 * a.ldx, a.ldx, len - s1, a.P, tid, a.vx);
            cp_async_commit();
        }
        const int s0 = j * BC;
        if (!wact || s0 > r0 + warp * 16 + 15) continue;
        float sc[BC / 8][4];
        zero_acc(sc);
        mma_a_bn<DN / 16, BC / 8>(sc, aC, smem_u32(sB + (j & 1) * BC * SN) + lane_b(lane, SN), SN);
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int s = s0 + nt * 8 + 2 * t4 + (e & 1), l = e < 2 ? l0 : l1;
                float w = 0.f;
                if (s <= l && l < len) w = sc[nt][e] * exp2_approx(fminf((e < 2 ? c0 : c1) - cs2[s], 0.f)) * dts[s];
                sc[nt][e] = w;
            }
        uint32_t wa[BC / 16][4];
        to_afrag(wa, sc);
        mma_r_bk<BC / 16, DP / 8>(o, wa, smem_u32(sX + (j & 1) * BC * SP) + lane_a(lane, SP), SP);
    }

    // + D x_l, store
    const float Dh = bf(a.D[h]);
    const int64_t ys = (int64_t)a.H * a.P;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int l = i ? l1 : l0;
        if (l >= len) continue;
        const bf16 *xl = xr + (int64_t)l * a.ldx;
        bf16 *yl = y + (row0 + l) * ys + (int64_t)h * a.P;
#pragma unroll
        for (int nt = 0; nt < DP / 8; nt++) {
            const int p = nt * 8 + 2 * t4;
            if (p < a.P) st_pair(yl + p, o[nt][2 * i] + Dh * bf(xl[p]), o[nt][2 * i + 1] + Dh * bf(xl[p + 1]));
        }
    }
}

// ---- R5: dx, ddt (direct), decay terms (source side) -------------------------------------

template <int DP, int DN, int BC> static size_t smem_dx(int L) {
    return sizeof(bf16) * ((size_t)SSD_BR * (DP + 8) + (size_t)SSD_BR * (DN + 8) + (size_t)DP * (DN + 8) +
                           2 * (size_t)BC * (DN + 8) + 2 * (size_t)BC * (DP + 8)) +
           2 * sizeof(float) * (size_t)L;
}

// One block per (64-row tile s of chunk c, b, x head xi); loops over the rx heads
// that read x head xi in order, summing their dx in registers. Per head h and
// row s (l over the chunk's rows >= s):
//   acc_s = exp(cs_last - cs_s) dstates B_s + sum_l (C_l.B_s) exp(cs_l - cs_s) dy_l
//   dx_s += dt_s acc_s + D dy_s
//   ddt[s,h] = acc_s . x_s (direct part), dD[s,h] = dy_s . x_s,
//   R[s,h] = sum_{l>s} M[l,s], u[s,h] = dt_s exp(cs_last - cs_s) x_s.(dstates B_s)
// (M[l,s] = dt_s (C_l.B_s) exp(cs_l - cs_s) (dy_l.x_s), see the top of the file).
template <int DP, int DN, int BC>
__global__ void __launch_bounds__(128)
    k_ssd_bwd_dx(bf16 *__restrict__ dx, float *__restrict__ ddt, float *__restrict__ Rr, float *__restrict__ uu,
                 float *__restrict__ dDr, const float *__restrict__ dst, ssd_dims_t a) {
    constexpr int SP = DP + 8, SN = DN + 8, NT = 128;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sX = (bf16 *)smem_raw;  // [BR][SP]    x, rows s
    bf16 *sBs = sX + SSD_BR * SP; // [BR][SN]    B, rows s
    bf16 *sD = sBs + SSD_BR * SN; // [DP][SN]    dstates, bf16
    bf16 *sC = sD + DP * SN;      // [2][BC][SN] C, rows l
    bf16 *sY = sC + 2 * BC * SN;  // [2][BC][SP] dy, rows l
    float *cs2 = (float *)(sY + 2 * BC * SP), *dts = cs2 + a.L;
    const int c = blockIdx.x / a.ntile, tile = a.ntile - 1 - (int)(blockIdx.x % a.ntile);
    const int Hx = a.H / a.rx, b = blockIdx.y / Hx, xi = blockIdx.y - b * Hx;
    const int t0 = c * a.L, len = min(a.L, a.T - t0), r0 = tile * SSD_BR;
    if (r0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const int sr0 = r0 + warp * 16 + g, sr1 = sr0 + 8; // this thread's rows s (chunk-local)
    const bool v0 = sr0 < len, v1 = sr1 < len, wact = r0 + warp * 16 < len;
    const int nl = (len - r0 + BC - 1) / BC; // target tiles from r0 on
    const bf16 *xs = a.x + (row0 + r0) * a.ldx + (int64_t)xi * a.P;
    tile_load<SSD_BR, DP, NT>(sX, SP, xs, a.ldx, len - r0, a.P, tid, a.vx); // committed with the first head
    const uint32_t aX = smem_u32(sX) + lane_a(lane, SP) + (uint32_t)(warp * 16 * SP * 2);
    const uint32_t aB = smem_u32(sBs) + lane_a(lane, SN) + (uint32_t)(warp * 16 * SN * 2);
    const bf16 *xrow0 = sX + (warp * 16 + g) * SP, *xrow1 = xrow0 + 8 * SP; // this thread's x rows in smem

    float dxs[DP / 8][4];
    zero_acc(dxs);
    int gb_last = -1;
    for (int hh = 0; hh < a.rx; hh++) {
        const int h = xi * a.rx + hh, gb = h / a.rb;
        const int64_t bh = (int64_t)b * a.H + h;
        if (hh > 0) __syncthreads(); // the previous head's shared data consumed
        if (gb != gb_last) {
            tile_load<SSD_BR, DN, NT>(sBs, SN, a.Bm + (row0 + r0) * a.ldb + (int64_t)gb * a.N, a.ldb, len - r0, a.N,
                                      tid, a.vb);
            gb_last = gb;
        }
        tile_load<BC, DN, NT>(sC, SN, c_row(a, row0 + r0, h), a.ldc, len - r0, a.N, tid, a.vc);
        tile_load<BC, DP, NT>(sY, SP, dy_row(a, row0 + r0, h), a.ldy, len - r0, a.P, tid, a.vy);
        cp_async_commit();
        state_load<DP, DN, NT>(sD, SN, dst + (bh * a.nc + c) * a.P * a.N, a.P, a.N, tid);
        chunk_load(cs2, dts, a, row0, h, r0, len, tid, NT);
        cp_async_wait<0>();
        __syncthreads();

        const float cl = cs2[len - 1];
        const float cs0 = v0 ? cs2[sr0] : 0.f, cs1 = v1 ? cs2[sr1] : 0.f;
        const float dt0 = v0 ? dts[sr0] : 0.f, dt1 = v1 ? dts[sr1] : 0.f;
        const float el0 = v0 ? exp2_approx(fminf(cl - cs0, 0.f)) : 0.f;
        const float el1 = v1 ? exp2_approx(fminf(cl - cs1, 0.f)) : 0.f;

        // inter: tmp = B_s dstates^T; di = tmp . x_s; dx += dt e_last tmp
        float di0 = 0.f, di1 = 0.f;
        {
            float tmp[DP / 8][4];
            zero_acc(tmp);
            mma_a_bn<DN / 16, DP / 8>(tmp, aB, smem_u32(sD) + lane_b(lane, SN), SN);
            const float f0 = dt0 * el0, f1 = dt1 * el1;
#pragma unroll
            for (int nt = 0; nt < DP / 8; nt++) {
                const int p = nt * 8 + 2 * t4;
                const float2 xa = ld_pair(xrow0 + p), xb = ld_pair(xrow1 + p);
                di0 += tmp[nt][0] * xa.x + tmp[nt][1] * xa.y;
                di1 += tmp[nt][2] * xb.x + tmp[nt][3] * xb.y;
                dxs[nt][0] += f0 * tmp[nt][0], dxs[nt][1] += f0 * tmp[nt][1];
                dxs[nt][2] += f1 * tmp[nt][2], dxs[nt][3] += f1 * tmp[nt][3];
            }
        }

        // intra: over target tiles l >= s
        float dI0 = 0.f, dI1 = 0.f, R0 = 0.f, R1 = 0.f;
        for (int j = 0; j < nl; j++) {
            if (j > 0) {
                cp_async_wait<0>();
                __syncthreads();
            }
            if (j + 1 < nl) {
                const int ln = r0 + (j + 1) * BC, nb = (j + 1) & 1;
                tile_load<BC, DN, NT>(sC + nb * BC * SN, SN, c_row(a, row0 + ln, h), a.ldc, len - ln, a.N, tid, a.vc);
                tile_load<BC, DP, NT>(sY + nb * BC * SP, SP, dy_row(a, row0 + ln, h), a.ldy, len - ln, a.P, tid, a.vy);
                cp_async_commit();
            }
            const int lt = r0 + j * BC;
            if (!wact || lt + BC - 1 < r0 + warp * 16) continue;
            float s1[BC / 8][4], s2[BC / 8][4];
            zero_acc(s1);
            zero_acc(s2);
            mma_a_bn<DN / 16, BC / 8>(s1, aB, smem_u32(sC + (j & 1) * BC * SN) + lane_b(lane, SN), SN); // B_s C_l^T
            mma_a_bn<DP / 16, BC / 8>(s2, aX, smem_u32(sY + (j & 1) * BC * SP) + lane_b(lane, SP), SP); // x_s dy_l^T
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const bool up = e >= 2;
                    const int l = lt + nt * 8 + 2 * t4 + (e & 1), s = up ? sr1 : sr0;
                    float w = 0.f;
                    if (l >= s && l < len) w = s1[nt][e] * exp2_approx(fminf(cs2[l] - (up ? cs1 : cs0), 0.f));
                    const float pr = w * s2[nt][e];
                    const float rp = l > s ? pr : 0.f;
                    if (up)
                        dI1 += pr, R1 += rp;
                    else
                        dI0 += pr, R0 += rp;
                    s1[nt][e] = w * (up ? dt1 : dt0);
                }
            uint32_t wa[BC / 16][4];
            to_afrag(wa, s1);
            mma_r_bk<BC / 16, DP / 8>(dxs, wa, smem_u32(sY + (j & 1) * BC * SP) + lane_a(lane, SP), SP);
        }

        // + D dy_s, dD = dy_s . x_s
        const float Dh = bf(a.D[h]);
        float dd0 = 0.f, dd1 = 0.f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int s = i ? sr1 : sr0;
            if (s >= len) continue;
            const bf16 *yrow = dy_row(a, row0 + s, h), *xrow = i ? xrow1 : xrow0;
            float dd = 0.f;
#pragma unroll
            for (int nt = 0; nt < DP / 8; nt++) {
                const int p = nt * 8 + 2 * t4;
                if (p < a.P) {
                    const float2 dv = ld_pair(yrow + p), xv = ld_pair(xrow + p);
                    dxs[nt][2 * i] += Dh * dv.x, dxs[nt][2 * i + 1] += Dh * dv.y;
                    dd += dv.x * xv.x + dv.y * xv.y;
                }
            }
            if (i)
                dd1 = dd;
            else
                dd0 = dd;
        }
        dI0 = quad_sum(dI0), dI1 = quad_sum(dI1), R0 = quad_sum(R0), R1 = quad_sum(R1);
        di0 = quad_sum(di0), di1 = quad_sum(di1), dd0 = quad_sum(dd0), dd1 = quad_sum(dd1);
        if (t4 == 0) {
            if (v0) {
                const int64_t k = (row0 + sr0) * a.H + h;
                const float di = di0 * el0;
                ddt[k] = dI0 + di, Rr[k] = dt0 * R0, uu[k] = dt0 * di, dDr[k] = dd0;
            }
            if (v1) {
                const int64_t k = (row0 + sr1) * a.H + h;
                const float di = di1 * el1;
                ddt[k] = dI1 + di, Rr[k] = dt1 * R1, uu[k] = dt1 * di, dDr[k] = dd1;
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int s = i ? sr1 : sr0;
        if (s >= len) continue;
        bf16 *o = dx + (row0 + s) * a.ldx + (int64_t)xi * a.P;
#pragma unroll
        for (int nt = 0; nt < DP / 8; nt++) {
            const int p = nt * 8 + 2 * t4;
            if (p < a.P) st_pair(o + p, dxs[nt][2 * i], dxs[nt][2 * i + 1]);
        }
    }
}

// ---- R6: dB (source side) ------------------------------------------------------------------

template <int DP, int DN, int BC> static size_t smem_dB(int L) {
    return sizeof(bf16) * ((size_t)SSD_BR * (DP + 8) + (size_t)DP * (DN + 8) + 2 * (size_t)BC * (DN + 8) +
                           2 * (size_t)BC * (DP + 8)) +
           2 * sizeof(float) * (size_t)L;
}

// One block per (64-row tile s of chunk c, b, B group gi); the rb heads of the
// group in order, their dB summed in registers:
//   dB_s += dt_s exp(cs_last - cs_s) x_s dstates + sum_{l>=s} dCB[l,s] C_l
template <int DP, int DN, int BC>
__global__ void __launch_bounds__(128)
    k_ssd_bwd_dB(bf16 *__restrict__ dB, const float *__restrict__ dst, ssd_dims_t a) {
    constexpr int SP = DP + 8, SN = DN + 8, NT = 128;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sX = (bf16 *)smem_raw; // [BR][SP]    x, rows s
    bf16 *sD = sX + SSD_BR * SP; // [DP][SN]    dstates, bf16
    bf16 *sC = sD + DP * SN;     // [2][BC][SN] C, rows l
    bf16 *sY = sC + 2 * BC * SN; // [2][BC][SP] dy, rows l
    float *cs2 = (float *)(sY + 2 * BC * SP), *dts = cs2 + a.L;
    const int c = blockIdx.x / a.ntile, tile = a.ntile - 1 - (int)(blockIdx.x % a.ntile);
    const int GB = a.H / a.rb, b = blockIdx.y / GB, gi = blockIdx.y - b * GB;
    const int t0 = c * a.L, len = min(a.L, a.T - t0), r0 = tile * SSD_BR;
    if (r0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const int sr0 = r0 + warp * 16 + g, sr1 = sr0 + 8;
    const bool v0 = sr0 < len, v1 = sr1 < len, wact = r0 + warp * 16 < len;
    const int nl = (len - r0 + BC - 1) / BC;
    const uint32_t aX = smem_u32(sX) + lane_a(lane, SP) + (uint32_t)(warp * 16 * SP * 2);

    float dbs[DN / 8][4];
    zero_acc(dbs);
    int xh_last = -1;
    for (int hh = 0; hh < a.rb; hh++) {
        const int h = gi * a.rb + hh, xh = h / a.rx;
        const int64_t bh = (int64_t)b * a.H + h;
        if (hh > 0) __syncthreads();
        if (xh != xh_last) {
            tile_load<SSD_BR, DP, NT>(sX, SP, a.x + (row0 + r0) * a.ldx + (int64_t)xh * a.P, a.ldx, len - r0, a.P, tid,
                                      a.vx);
            xh_last = xh;
        }
        tile_load<BC, DN, NT>(sC, SN, c_row(a, row0 + r0, h), a.ldc, len - r0, a.N, tid, a.vc);
        tile_load<BC, DP, NT>(sY, SP, dy_row(a, row0 + r0, h), a.ldy, len - r0, a.P, tid, a.vy);
        cp_async_commit();
        state_load<DP, DN, NT>(sD, SN, dst + (bh * a.nc + c) * a.P * a.N, a.P, a.N, tid);
        chunk_load(cs2, dts, a, row0, h, r0, len, tid, NT);
        cp_async_wait<0>();
        __syncthreads();

        const float cl = cs2[len - 1];
        const float cs0 = v0 ? cs2[sr0] : 0.f, cs1 = v1 ? cs2[sr1] : 0.f;
        const float dt0 = v0 ? dts[sr0] : 0.f, dt1 = v1 ? dts[sr1] : 0.f;

        // inter: dB += dt e_last x_s dstates
        {
            float tmp[DN / 8][4];
            zero_acc(tmp);
            mma_a_bk<DP / 16, DN / 8>(tmp, aX, smem_u32(sD) + lane_a(lane, SN), SN);
            const float f0 = v0 ? dt0 * exp2_approx(fminf(cl - cs0, 0.f)) : 0.f;
            const float f1 = v1 ? dt1 * exp2_approx(fminf(cl - cs1, 0.f)) : 0.f;
#pragma unroll
            for (int nt = 0; nt < DN / 8; nt++)
                dbs[nt][0] += f0 * tmp[nt][0], dbs[nt][1] += f0 * tmp[nt][1], dbs[nt][2] += f1 * tmp[nt][2],
                    dbs[nt][3] += f1 * tmp[nt][3];
        }

        for (int j = 0; j < nl; j++) {
            if (j > 0) {
                cp_async_wait<0>();
                __syncthreads();
            }
            if (j + 1 < nl) {
                const int ln = r0 + (j + 1) * BC, nb = (j + 1) & 1;
                tile_load<BC, DN, NT>(sC + nb * BC * SN, SN, c_row(a, row0 + ln, h), a.ldc, len - ln, a.N, tid, a.vc);
                tile_load<BC, DP, NT>(sY + nb * BC * SP, SP, dy_row(a, row0 + ln, h), a.ldy, len - ln, a.P, tid, a.vy);
                cp_async_commit();
            }
            const int lt = r0 + j * BC;
            if (!wact || lt + BC - 1 < r0 + warp * 16) continue;
            float s2[BC / 8][4];
            zero_acc(s2);
            mma_a_bn<DP / 16, BC / 8>(s2, aX, smem_u32(sY + (j & 1) * BC * SP) + lane_b(lane, SP), SP); // x_s dy_l^T
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const bool up = e >= 2;
                    const int l = lt + nt * 8 + 2 * t4 + (e & 1), s = up ? sr1 : sr0;
                    float w = 0.f;
                    if (l >= s && l < len)
                        w = s2[nt][e] * exp2_approx(fminf(cs2[l] - (up ? cs1 : cs0), 0.f)) * (up ? dt1 : dt0);
                    s2[nt][e] = w; // dCB^T[s, l]
                }
            uint32_t wa[BC / 16][4];
            to_afrag(wa, s2);
            mma_r_bk<BC / 16, DN / 8>(dbs, wa, smem_u32(sC + (j & 1) * BC * SN) + lane_a(lane, SN), SN);
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int s = i ? sr1 : sr0;
        if (s >= len) continue;
        bf16 *o = dB + (row0 + s) * a.ldb + (int64_t)gi * a.N;
#pragma unroll
        for (int nt = 0; nt < DN / 8; nt++) {
            const int n = nt * 8 + 2 * t4;
            if (n < a.N) st_pair(o + n, dbs[nt][2 * i], dbs[nt][2 * i + 1]);
        }
    }
}

// ---- R7-R9: dC (target side) -----------------------------------------------------------------

template <int DP, int DN, int BC> static size_t smem_dC(int L) {
    return sizeof(bf16) * ((size_t)SSD_BR * (DN + 8) + (size_t)SSD_BR * (DP + 8) + (size_t)DP * (DN + 8) +
                           2 * (size_t)BC * (DN + 8) + 2 * (size_t)BC * (DP + 8)) +
           2 * sizeof(float) * (size_t)L;
}

// One block per (64-row tile l of chunk c, b, C group ci); the rc heads of the
// group in order, their dC summed in registers:
//   dC_l += exp(cs_l) dy_l prev + sum_{s<=l} dCB[l,s] B_s
// and per (l, h): C[l,h] = sum_{s<l} M[l,s], ddAcs_prev[l,h] = exp(cs_l) C_l.(dy_l prev).
template <int DP, int DN, int BC>
__global__ void __launch_bounds__(128)
    k_ssd_bwd_dC(bf16 *__restrict__ dC, float *__restrict__ Cr, float *__restrict__ dap, const float *__restrict__ prev,
                 ssd_dims_t a) {
    constexpr int SP = DP + 8, SN = DN + 8, NT = 128;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sCl = (bf16 *)smem_raw;  // [BR][SN]    C, rows l
    bf16 *sYl = sCl + SSD_BR * SN; // [BR][SP]    dy, rows l
    bf16 *sS = sYl + SSD_BR * SP;  // [DP][SN]    prev, bf16
    bf16 *sB = sS + DP * SN;       // [2][BC][SN] B, rows s
    bf16 *sX = sB + 2 * BC * SN;   // [2][BC][SP] x, rows s
    float *cs2 = (float *)(sX + 2 * BC * SP), *dts = cs2 + a.L;
    const int c = blockIdx.x / a.ntile, tile = a.ntile - 1 - (int)(blockIdx.x % a.ntile);
    const int GC = a.H / a.rc, b = blockIdx.y / GC, ci = blockIdx.y - b * GC;
    const int t0 = c * a.L, len = min(a.L, a.T - t0), r0 = tile * SSD_BR;
    if (r0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const int lr0 = r0 + warp * 16 + g, lr1 = lr0 + 8; // this thread's rows l
    const bool v0 = lr0 < len, v1 = lr1 < len, wact = r0 + warp * 16 < len;
    const int s_end = min(len, r0 + SSD_BR), ns = (s_end + BC - 1) / BC;
    tile_load<SSD_BR, DN, NT>(sCl, SN, a.Cm + (row0 + r0) * a.ldc + (int64_t)ci * a.N, a.ldc, len - r0, a.N, tid,
                              a.vc); // committed with the first head
    const uint32_t aC = smem_u32(sCl) + lane_a(lane, SN) + (uint32_t)(warp * 16 * SN * 2);
    const uint32_t aY = smem_u32(sYl) + lane_a(lane, SP) + (uint32_t)(warp * 16 * SP * 2);
    const bf16 *crow0 = sCl + (warp * 16 + g) * SN, *crow1 = crow0 + 8 * SN;

    float dcs[DN / 8][4];
    zero_acc(dcs);
    for (int hh = 0; hh < a.rc; hh++) {
        const int h = ci * a.rc + hh;
        const int64_t bh = (int64_t)b * a.H + h;
        if (hh > 0) __syncthreads();
        tile_load<SSD_BR, DP, NT>(sYl, SP, dy_row(a, row0 + r0, h), a.ldy, len - r0, a.P, tid, a.vy);
        tile_load<BC, DN, NT>(sB, SN, b_row(a, row0, h), a.ldb, len, a.N, tid, a.vb);
        tile_load<BC, DP, NT>(sX, SP, x_row(a, row0, h), a.ldx, len, a.P, tid, a.vx);
        cp_async_commit();
        state_load<DP, DN, NT>(sS, SN, prev + (bh * a.nc + c) * a.P * a.N, a.P, a.N, tid);
        chunk_load(cs2, dts, a, row0, h, 0, s_end, tid, NT);
        cp_async_wait<0>();
        __syncthreads();

        const float c0 = v0 ? cs2[lr0] : 0.f, c1 = v1 ? cs2[lr1] : 0.f;
        // inter: tmp = dy_l prev; q = tmp . C_l; dC += exp(cs_l) tmp
        float q0 = 0.f, q1 = 0.f;
        const float e0 = v0 ? exp2_approx(c0) : 0.f, e1 = v1 ? exp2_approx(c1) : 0.f;
        {
            float tmp[DN / 8][4];
            zero_acc(tmp);
            mma_a_bk<DP / 16, DN / 8>(tmp, aY, smem_u32(sS) + lane_a(lane, SN), SN);
#pragma unroll
            for (int nt = 0; nt < DN / 8; nt++) {
                const int n = nt * 8 + 2 * t4;
                const float2 ca = ld_pair(crow0 + n), cb = ld_pair(crow1 + n);
                q0 += tmp[nt][0] * ca.x + tmp[nt][1] * ca.y;
                q1 += tmp[nt][2] * cb.x + tmp[nt][3] * cb.y;
                dcs[nt][0] += e0 * tmp[nt][0], dcs[nt][1] += e0 * tmp[nt][1];
                dcs[nt][2] += e1 * tmp[nt][2], dcs[nt][3] += e1 * tmp[nt][3];
            }
        }

        float Cs0 = 0.f, Cs1 = 0.f;
        for (int j = 0; j < ns; j++) {
            if (j > 0) {
                cp_async_wait<0>();
                __syncthreads();
            }
            if (j + 1 < ns) {
                const int sn = (j + 1) * BC, nb = (j + 1) & 1;
                tile_load<BC, DN, NT>(sB + nb * BC * SN, SN, b_row(a, row0 + sn, h), a.ldb, len - sn, a.N, tid, a.vb);
                tile_load<BC, DP, NT>(sX + nb * BC * SP, SP, x_row(a, row0 + sn, h), a.ldx, len - sn, a.P, tid, a.vx);
                cp_async_commit();
            }
            const int s0 = j * BC;
            if (!wact || s0 > r0 + warp * 16 + 15) continue;
            float s1[BC / 8][4], s2[BC / 8][4];
            zero_acc(s1);
            zero_acc(s2);
            mma_a_bn<DN / 16, BC / 8>(s1, aC, smem_u32(sB + (j & 1) * BC * SN) + lane_b(lane, SN), SN); // C_l B_s^T
            mma_a_bn<DP / 16, BC / 8>(s2, aY, smem_u32(sX + (j & 1) * BC * SP) + lane_b(lane, SP), SP); // dy_l x_s^T
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const bool up = e >= 2;
                    const int s = s0 + nt * 8 + 2 * t4 + (e & 1), l = up ? lr1 : lr0;
                    float w = 0.f;
                    if (s <= l && l < len) w = s2[nt][e] * exp2_approx(fminf((up ? c1 : c0) - cs2[s], 0.f)) * dts[s];
                    const float m = s < l ? w * s1[nt][e] : 0.f;
                    if (up)
                        Cs1 += m;
                    else
                        Cs0 += m;
                    s2[nt][e] = w; // dCB[l, s]
                }
            uint32_t wa[BC / 16][4];
            to_afrag(wa, s2);
            mma_r_bk<BC / 16, DN / 8>(dcs, wa, smem_u32(sB + (j & 1) * BC * SN) + lane_a(lane, SN), SN);
        }
        Cs0 = quad_sum(Cs0), Cs1 = quad_sum(Cs1), q0 = quad_sum(q0), q1 = quad_sum(q1);
        if (t4 == 0) {
            if (v0) {
                const int64_t k = (row0 + lr0) * a.H + h;
                Cr[k] = Cs0, dap[k] = e0 * q0;
            }
            if (v1) {
                const int64_t k = (row0 + lr1) * a.H + h;
                Cr[k] = Cs1, dap[k] = e1 * q1;
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int l = i ? lr1 : lr0;
        if (l >= len) continue;
        bf16 *o = dC + (row0 + l) * a.ldc + (int64_t)ci * a.N;
#pragma unroll
        for (int nt = 0; nt < DN / 8; nt++) {
            const int n = nt * 8 + 2 * t4;
            if (n < a.N) st_pair(o + n, dcs[nt][2 * i], dcs[nt][2 * i + 1]);
        }
    }
}

// ---- R10 / R11: decay gradients, ddt, dA_log, dD -------------------------------------------------

// One block per (chunk c, b, h). ddt holds the direct part on entry. Rr is
// overwritten with the exclusive prefix of R - C + u.
__global__ void __launch_bounds__(256)
    k_ssd_bwd_final(float *__restrict__ ddt, float *__restrict__ pdA, float *__restrict__ pdD, float *__restrict__ Rr,
                    const float *__restrict__ uu, const float *__restrict__ Cr, const float *__restrict__ dap,
                    const float *__restrict__ dDr, const float *__restrict__ pdot, int nparts, ssd_dims_t a) {
    __shared__ float sh[32];
    __shared__ float s_chunk;
    const int c = blockIdx.x, bh = blockIdx.y, b = bh / a.H, h = bh - b * a.H;
    const int t0 = c * a.L, len = min(a.L, a.T - t0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t row0 = (int64_t)b * a.T + t0;
    const float A = -expf(bf(a.A_log[h]));
    if (warp == 0) { // ddA_chunk = exp(cs_last) sum prev[c] . dstates[c], partials in a fixed order
        const float *pd = pdot + ((int64_t)bh * a.nc + c) * nparts;
        float s = 0.f;
        for (int i = lane; i < nparts; i += 32)
            s += pd[i];
        s = warp_sum(s);
        if (lane == 0) s_chunk = s * expf(a.cs[(row0 + len - 1) * a.H + h]);
    }
    // pass 1: exclusive prefix of R - C + u (the barrier inside publishes s_chunk)
    float carry = 0.f;
    for (int base = 0; base < len; base += 256) {
        const int i = base + tid;
        const int64_t k = (row0 + (i < len ? i : 0)) * a.H + h;
        const float z = i < len ? Rr[k] - Cr[k] + uu[k] : 0.f;
        float tot;
        const float ex = block_excl_scan(z, sh, &tot);
        if (i < len) Rr[k] = carry + ex;
        carry += tot;
    }
    // pass 2, from the chunk's end: inclusive suffix of ddAcs_prev (+ ddA_chunk at the last row)
    float dA_part = 0.f, dD_part = 0.f;
    carry = 0.f;
    for (int base = 0; base < len; base += 256) {
        const int i = len - 1 - (base + tid);
        const int64_t k = (row0 + (i >= 0 ? i : 0)) * a.H + h;
        float q = i >= 0 ? dap[k] : 0.f;
        if (i == len - 1) q += s_chunk;
        float tot;
        const float ex = block_excl_scan(q, sh, &tot);
        if (i >= 0) {
            const float ddA = Rr[k] + (carry + ex + q);
            ddt[k] = ddA * A + ddt[k];
            dA_part += ddA * a.dt[k];
            dD_part += dDr[k];
        }
        carry += tot;
    }
    dA_part = block_sum(dA_part, sh);
    dD_part = block_sum(dD_part, sh);
    if (tid == 0) {
        pdA[(int64_t)bh * a.nc + c] = dA_part;
        pdD[(int64_t)bh * a.nc + c] = dD_part;
    }
}

// dA_log[h] += A sum_{b,c} pdA, dD[h] += sum pdD: one block per head, fixed order.
__global__ void __launch_bounds__(256)
    k_ssd_param_grads(float *__restrict__ dA_log, float *__restrict__ dD, const float *__restrict__ pdA,
                      const float *__restrict__ pdD, const bf16 *__restrict__ A_log, int B, int H, int nc) {
    __shared__ float sh[32];
    const int h = blockIdx.x;
    float sa = 0.f, sd = 0.f;
    for (int64_t i = threadIdx.x; i < (int64_t)B * nc; i += blockDim.x) {
        const int64_t b = i / nc, k = (b * H + h) * nc + (i - b * nc);
        sa += pdA[k], sd += pdD[k];
    }
    sa = block_sum(sa, sh);
    sd = block_sum(sd, sh);
    if (threadIdx.x == 0) {
        dA_log[h] += sa * -expf(bf(A_log[h])); // dA/dA_log = A
        dD[h] += sd;
    }
}

// ---- decode: the recurrence token by token ---------------------------------------------------------

// state [B,H,P,N] fp32 read once, updated in registers over the T tokens, written
// once. Each warp owns STEP_RW rows p; lane k holds columns lane + 32 k (N <= 128).
// rows non-NULL (ssd_recurrent_step): sequence b's state [H, P, N] is at rows[b] instead.
__global__ void __launch_bounds__(128)
    k_ssd_step(bf16 *__restrict__ y, float *__restrict__ state, float *const *__restrict__ rows, ssd_dims_t a) {
    const int bh = blockIdx.y, b = bh / a.H, h = bh - b * a.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int p0 = (blockIdx.x * 4 + warp) * STEP_RW;
    if (p0 >= a.P) return; // warp-uniform; no block barrier below
    const float A = -expf(bf(a.A_log[h])), Dh = bf(a.D[h]);
    float *S = (rows ? rows[b] + (int64_t)h * a.P * a.N : state + (int64_t)bh * a.P * a.N) + (int64_t)p0 * a.N;
    float s[STEP_RW][4];
#pragma unroll
    for (int r = 0; r < STEP_RW; r++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int n = lane + 32 * k;
            s[r][k] = (p0 + r < a.P && n < a.N) ? S[(int64_t)r * a.N + n] : 0.f;
        }
    for (int t = 0; t < a.T; t++) {
        const int64_t row = (int64_t)b * a.T + t;
        const float dtt = a.dt[row * a.H + h], da = expf(dtt * A);
        const bf16 *xr = x_row(a, row, h), *br = b_row(a, row, h), *cr = c_row(a, row, h);
        float bv[4], cv[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int n = lane + 32 * k;
            bv[k] = n < a.N ? bf(br[n]) : 0.f;
            cv[k] = n < a.N ? bf(cr[n]) : 0.f;
        }
        bf16 *yr = y + row * ((int64_t)a.H * a.P) + (int64_t)h * a.P;
#pragma unroll
        for (int r = 0; r < STEP_RW; r++) {
            const int p = p0 + r;
            if (p >= a.P) break;
            const float xp = bf(xr[p]), wx = dtt * xp;
            float o = 0.f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                s[r][k] = da * s[r][k] + wx * bv[k];
                o += s[r][k] * cv[k];
            }
            o = warp_sum(o);
            if (lane == 0) yr[p] = __float2bfloat16_rn(o + Dh * xp);
        }
    }
#pragma unroll
    for (int r = 0; r < STEP_RW; r++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int n = lane + 32 * k;
            if (p0 + r < a.P && n < a.N) S[(int64_t)r * a.N + n] = s[r][k];
        }
}

// ---- host side ---------------------------------------------------------------------------------------

static int aligned16(const void *p, int64_t ld) { return ((uintptr_t)p % 16) == 0 && ld % 8 == 0; }

static int ssd_args_ok(be_t *be, const char *op, int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk,
                       int chunked) {
    if (B < 0 || T < 0 || H <= 0 || Hx <= 0 || GB <= 0 || GC <= 0 || H % Hx || H % GB || H % GC) {
        cu_op_error(be,
                    "cuda %s: B=%d T=%d H=%d Hx=%d GB=%d GC=%d: the x heads, B groups and C groups must divide "
                    "the heads",
                    op, B, T, H, Hx, GB, GC);
        return 0;
    }
    if (chunked && (P < 16 || P > 128 || P % 16 || N < 16 || N > 128 || N % 16)) {
        cu_op_error(be, "cuda %s: P=%d N=%d: head and state sizes must be multiples of 16 up to 128", op, P, N);
        return 0;
    }
    if (!chunked && (P < 1 || N < 1 || N > 128)) {
        cu_op_error(be, "cuda %s: P=%d N=%d: need P >= 1 and 1 <= N <= 128", op, P, N);
        return 0;
    }
    if (chunked && (chunk < 1 || (chunk < T ? chunk : T) > SSD_MAX_L)) {
        cu_op_error(be, "cuda %s: chunk %d (T=%d): chunks of 1..%d tokens are supported", op, chunk, T, SSD_MAX_L);
        return 0;
    }
    if ((int64_t)B * H > 65535) {
        cu_op_error(be, "cuda %s: B*H = %lld exceeds 65535", op, (long long)B * H);
        return 0;
    }
    return 1;
}

static ssd_dims_t make_dims(int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk, const void *x,
                            int64_t ldx, const void *Bm, int64_t ldb, const void *Cm, int64_t ldc, const float *dt,
                            const void *A_log, const void *D) {
    ssd_dims_t a;
    memset(&a, 0, sizeof a);
    a.x = (const bf16 *)x, a.Bm = (const bf16 *)Bm, a.Cm = (const bf16 *)Cm;
    a.ldx = ldx, a.ldb = ldb, a.ldc = ldc, a.ldy = (int64_t)H * P;
    a.dt = dt, a.A_log = (const bf16 *)A_log, a.D = (const bf16 *)D;
    a.B = B, a.T = T, a.H = H, a.rx = H / Hx, a.rb = H / GB, a.rc = H / GC, a.P = P, a.N = N;
    a.L = chunk < T ? chunk : (T > 0 ? T : 1);
    a.nc = (T + a.L - 1) / a.L;
    a.ntile = (a.L + SSD_BR - 1) / SSD_BR;
    a.vx = aligned16(x, ldx), a.vb = aligned16(Bm, ldb), a.vc = aligned16(Cm, ldc);
    return a;
}

static int64_t pass_parts(int64_t PN) { return 8 * ((PN + 4 * PASS_T - 1) / (4 * PASS_T)); }

// Bytes of scratch ssd_chunk_fwd (backward = 0) or ssd_chunk_bwd (1) takes.
extern "C" size_t cuda_ssd_scratch_bytes(int B, int T, int H, int P, int N, int chunk, int backward) {
    if (T <= 0 || chunk <= 0) return 0;
    int L = chunk < T ? chunk : T;
    int64_t nc = (T + L - 1) / L, BTH = (int64_t)B * T * H, S = (int64_t)B * H * nc * P * N;
    if (!backward) return cu_round256(4 * BTH) + cu_round256(4 * S) + 256;
    return 6 * cu_round256(4 * BTH) + 2 * cu_round256(4 * S) +
           cu_round256(4 * B * H * nc * pass_parts((int64_t)P * N)) + 2 * cu_round256(4 * B * H * nc) + 256;
}

// Temporaries from the scratch arena; the first that does not fit marks the whole call failed.
typedef struct {
    be_t *be;
    size_t mark;
    int fail;
} ssd_scratch_t;

static float *sc_f32(ssd_scratch_t *s, int64_t n) {
    if (s->fail) return NULL;
    float *p = (float *)cu_scratch_try(s->be, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) s->fail = 1;
    return p;
}

static void sc_error(be_t *be, ssd_scratch_t *s, const char *op, int B, int T, int H, int P, int N, int chunk,
                     int backward) {
    arena_t *ar = &be->scratch;
    arena_reset(ar, s->mark);
    cu_op_error(be,
                "cuda %s: the scratch arena (%s) is too small: B=%d T=%d H=%d P=%d N=%d chunk=%d needs %zu bytes of "
                "temporaries, %zu of %zu are free",
                op, ar->what ? ar->what : "cuda scratch", B, T, H, P, N, chunk,
                cuda_ssd_scratch_bytes(B, T, H, P, N, chunk, backward), ar->cap - s->mark, ar->cap);
}

static void launch_cumsum(be_t *be, float *cs, const ssd_dims_t &a) {
    const int64_t n = (int64_t)a.B * a.nc * a.H;
    k_ssd_cumsum<<<cuda_blocks(n, 128), 128, 0, cuda_stream(be)>>>(cs, a.dt, a.A_log, a.B, a.T, a.H, a.L, a.nc);
    cuda_check_launch(be, "k_ssd_cumsum");
}

template <int DP, int DN> static int launch_chunk_state(be_t *be, float *out, int mode, const ssd_dims_t &a) {
    const size_t smem = sizeof(bf16) * SSD_KT * ((DP + 8) + (DN + 8)) + sizeof(float) * (size_t)a.L;
    if (cuda_smem_limit(be, (const void *)k_ssd_chunk_state<DP, DN>, smem, "k_ssd_chunk_state") < 0) return -1;
    k_ssd_chunk_state<DP, DN><<<dim3(a.nc, a.B * a.H), DP * 2, smem, cuda_stream(be)>>>(out, mode, a);
    cuda_check_launch(be, "k_ssd_chunk_state");
    return 0;
}

static void launch_pass_fwd(be_t *be, float *st, const float *s_in, float *s_out, const ssd_dims_t &a) {
    const int64_t PN = (int64_t)a.P * a.N;
    dim3 grid((unsigned)((PN + 4 * PASS_T - 1) / (4 * PASS_T)), a.B * a.H);
    k_ssd_pass_fwd<<<grid, PASS_T, 0, cuda_stream(be)>>>(st, s_in, s_out, a.cs, a.T, a.H, a.L, a.nc, PN);
    cuda_check_launch(be, "k_ssd_pass_fwd");
}

template <int DP, int DN>
static void ssd_fwd_kernels(be_t *be, void *y, float *st, float *state, int init, const ssd_dims_t &a) {
    constexpr int BC = (DP > 64 || DN > 64) ? 32 : 64;
    if (launch_chunk_state<DP, DN>(be, st, 0, a) < 0) return;
    launch_pass_fwd(be, st, init ? state : NULL, state, a);
    const size_t smem = smem_scan<DP, DN, BC>(a.L);
    if (cuda_smem_limit(be, (const void *)k_ssd_scan_fwd<DP, DN, BC>, smem, "k_ssd_scan_fwd") < 0) return;
    k_ssd_scan_fwd<DP, DN, BC><<<dim3(a.ntile * a.nc, a.B * a.H), 128, smem, cuda_stream(be)>>>((bf16 *)y, st, a);
    cuda_check_launch(be, "k_ssd_scan_fwd");
}

static void cu_ssd_chunk_fwd(be_t *be, void *y, float *state, int init, const void *x, int64_t ldx, const void *Bm,
                             int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                             const void *D, int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk) {
    if (!ssd_args_ok(be, "ssd_chunk_fwd", B, T, H, Hx, GB, GC, P, N, chunk, 1) || B == 0) return;
    if (T == 0) { // the final state is the initial one
        if (state && !init) be->memset0(be, state, (size_t)B * H * P * N * sizeof(float));
        return;
    }
    ssd_dims_t a = make_dims(B, T, H, Hx, GB, GC, P, N, chunk, x, ldx, Bm, ldb, Cm, ldc, dt, A_log, D);
    ssd_scratch_t sc = {be, arena_mark(&be->scratch), 0};
    float *cs = sc_f32(&sc, (int64_t)B * T * H);
    float *st = sc_f32(&sc, (int64_t)B * H * a.nc * P * N);
    if (sc.fail) return sc_error(be, &sc, "ssd_chunk_fwd", B, T, H, P, N, chunk, 0);
    a.cs = cs;
    launch_cumsum(be, cs, a);
    if (P <= 64 && N <= 64)
        ssd_fwd_kernels<64, 64>(be, y, st, state, init, a);
    else if (P <= 64)
        ssd_fwd_kernels<64, 128>(be, y, st, state, init, a);
    else if (N <= 64)
        ssd_fwd_kernels<128, 64>(be, y, st, state, init, a);
    else
        ssd_fwd_kernels<128, 128>(be, y, st, state, init, a);
    arena_reset(&be->scratch, sc.mark); // the next user of this memory is queued after these kernels
}

typedef struct {
    float *cs, *prev, *gst, *pdot, *Rr, *uu, *dDr, *Cr, *dap, *pdA, *pdD;
    int nparts;
} ssd_bwd_tmp_t;

template <int DP, int DN>
static void ssd_bwd_kernels(be_t *be, void *dx, void *dB, void *dC, float *ddt, float *dA_log, float *dD,
                            float *dstate0, const float *dstate_final, const float *state0, const ssd_bwd_tmp_t &t,
                            const ssd_dims_t &a) {
    constexpr int BC = (DP > 64 || DN > 64) ? 32 : 64;
    cudaStream_t st = cuda_stream(be);
    const int64_t PN = (int64_t)a.P * a.N;
    // R1: entering states
    if (launch_chunk_state<DP, DN>(be, t.prev, 0, a) < 0) return;
    launch_pass_fwd(be, t.prev, state0, NULL, a);
    // R3, R4: gradients of the chunk states
    if (launch_chunk_state<DP, DN>(be, t.gst, 1, a) < 0) return;
    {
        dim3 grid((unsigned)((PN + 4 * PASS_T - 1) / (4 * PASS_T)), a.B * a.H);
        k_ssd_pass_bwd<<<grid, PASS_T, 0, st>>>(t.gst, t.prev, t.pdot, dstate_final, dstate0, a.cs, a.T, a.H, a.L, a.nc,
                                                PN, t.nparts);
        cuda_check_launch(be, "k_ssd_pass_bwd");
    }
    // R5-R9
    {
        const size_t smem = smem_dx<DP, DN, BC>(a.L);
        if (cuda_smem_limit(be, (const void *)k_ssd_bwd_dx<DP, DN, BC>, smem, "k_ssd_bwd_dx") < 0) return;
        k_ssd_bwd_dx<DP, DN, BC>
            <<<dim3(a.ntile * a.nc, a.B * (a.H / a.rx)), 128, smem, st>>>((bf16 *)dx, ddt, t.Rr, t.uu, t.dDr, t.gst, a);
        cuda_check_launch(be, "k_ssd_bwd_dx");
    }
    {
        const size_t smem = smem_dB<DP, DN, BC>(a.L);
        if (cuda_smem_limit(be, (const void *)k_ssd_bwd_dB<DP, DN, BC>, smem, "k_ssd_bwd_dB") < 0) return;
        k_ssd_bwd_dB<DP, DN, BC><<<dim3(a.ntile * a.nc, a.B * (a.H / a.rb)), 128, smem, st>>>((bf16 *)dB, t.gst, a);
        cuda_check_launch(be, "k_ssd_bwd_dB");
    }
    {
        const size_t smem = smem_dC<DP, DN, BC>(a.L);
        if (cuda_smem_limit(be, (const void *)k_ssd_bwd_dC<DP, DN, BC>, smem, "k_ssd_bwd_dC") < 0) return;
        k_ssd_bwd_dC<DP, DN, BC>
            <<<dim3(a.ntile * a.nc, a.B * (a.H / a.rc)), 128, smem, st>>>((bf16 *)dC, t.Cr, t.dap, t.prev, a);
        cuda_check_launch(be, "k_ssd_bwd_dC");
    }
    // R10, R11
    k_ssd_bwd_final<<<dim3(a.nc, a.B * a.H), 256, 0, st>>>(ddt, t.pdA, t.pdD, t.Rr, t.uu, t.Cr, t.dap, t.dDr, t.pdot,
                                                           t.nparts, a);
    cuda_check_launch(be, "k_ssd_bwd_final");
    k_ssd_param_grads<<<a.H, 256, 0, st>>>(dA_log, dD, t.pdA, t.pdD, a.A_log, a.B, a.H, a.nc);
    cuda_check_launch(be, "k_ssd_param_grads");
}

// Packed sequences (cuda.h cu_seqs_run): a padding row has dt = 0, so it
// neither decays nor writes the state, and each sequence ends with its own
// final state.
typedef struct {
    const void *A_log, *D;
    int H, Hx, GB, GC, P, N, chunk;
} ssd_seqs_t;

static size_t ssd_seqs_scratch(const void *ctx, int n, int T) {
    const ssd_seqs_t *c = (const ssd_seqs_t *)ctx;
    return cuda_ssd_scratch_bytes(n, T, c->H, c->P, c->N, c->chunk, 0);
}

static void ssd_seqs_call(be_t *be, const void *ctx, const cu_seqs_arr_t *in, void *out, int64_t ldo, float *states,
                          int n, int T) {
    const ssd_seqs_t *c = (const ssd_seqs_t *)ctx;
    cu_ssd_chunk_fwd(be, out, states, 1, in[0].p, in[0].ld, in[1].p, in[1].ld, in[2].p, in[2].ld,
                     (const float *)in[3].p, c->A_log, c->D, n, T, c->H, c->Hx, c->GB, c->GC, c->P, c->N, c->chunk);
}

static void cu_ssd_chunk_seqs(be_t *be, void *y, void *const *state, const void *x, int64_t ldx, const void *Bm,
                              int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                              const void *D, be_seqs_t sq, int H, int Hx, int GB, int GC, int P, int N, int chunk) {
    const cu_seqs_arr_t in[4] = {{x, ldx, Hx * P, 2}, {Bm, ldb, GB * N, 2}, {Cm, ldc, GC * N, 2}, {dt, H, H, 4}};
    const ssd_seqs_t c = {A_log, D, H, Hx, GB, GC, P, N, chunk};
    cu_seqs_run(be, "ssd_chunk_seqs", sq, state, (size_t)H * P * N * sizeof(float), in, 4, {y, H * P, H * P, 2},
                ssd_seqs_scratch, ssd_seqs_call, &c);
}

static void cu_ssd_chunk_bwd(be_t *be, void *dx, void *dB, void *dC, float *ddt, float *dA_log, float *dD,
                             float *dstate0, const void *dy, const float *dstate_final, const void *x, int64_t ldx,
                             const void *Bm, int64_t ldb, const void *Cm, int64_t ldc, const float *dt,
                             const void *A_log, const void *D, const float *state0, int B, int T, int H, int Hx, int GB,
                             int GC, int P, int N, int chunk) {
    if (!ssd_args_ok(be, "ssd_chunk_bwd", B, T, H, Hx, GB, GC, P, N, chunk, 1) || B == 0) return;
    const size_t nst = (size_t)B * H * P * N * sizeof(float);
    if (T == 0) { // the initial state is the final one
        if (dstate0) {
            if (dstate_final) {
                cudaError_t e = cudaMemcpyAsync(dstate0, dstate_final, nst, cudaMemcpyDeviceToDevice, cuda_stream(be));
                if (e != cudaSuccess) cuda_fail(be, "ssd_chunk_bwd: copy dstate", e);
            } else {
                be->memset0(be, dstate0, nst);
            }
        }
        return;
    }
    ssd_dims_t a = make_dims(B, T, H, Hx, GB, GC, P, N, chunk, x, ldx, Bm, ldb, Cm, ldc, dt, A_log, D);
    a.dy = (const bf16 *)dy;
    a.vy = aligned16(dy, a.ldy);
    const int64_t BTH = (int64_t)B * T * H, S = (int64_t)B * H * a.nc * P * N, BHC = (int64_t)B * H * a.nc;
    ssd_scratch_t sc = {be, arena_mark(&be->scratch), 0};
    ssd_bwd_tmp_t t;
    t.nparts = (int)pass_parts((int64_t)P * N);
    t.cs = sc_f32(&sc, BTH);
    t.prev = sc_f32(&sc, S);
    t.gst = sc_f32(&sc, S);
    t.pdot = sc_f32(&sc, BHC * t.nparts);
    t.Rr = sc_f32(&sc, BTH);
    t.uu = sc_f32(&sc, BTH);
    t.dDr = sc_f32(&sc, BTH);
    t.Cr = sc_f32(&sc, BTH);
    t.dap = sc_f32(&sc, BTH);
    t.pdA = sc_f32(&sc, BHC);
    t.pdD = sc_f32(&sc, BHC);
    if (sc.fail) return sc_error(be, &sc, "ssd_chunk_bwd", B, T, H, P, N, chunk, 1);
    a.cs = t.cs;
    launch_cumsum(be, t.cs, a);
    if (P <= 64 && N <= 64)
        ssd_bwd_kernels<64, 64>(be, dx, dB, dC, ddt, dA_log, dD, dstate0, dstate_final, state0, t, a);
    else if (P <= 64)
        ssd_bwd_kernels<64, 128>(be, dx, dB, dC, ddt, dA_log, dD, dstate0, dstate_final, state0, t, a);
    else if (N <= 64)
        ssd_bwd_kernels<128, 64>(be, dx, dB, dC, ddt, dA_log, dD, dstate0, dstate_final, state0, t, a);
    else
        ssd_bwd_kernels<128, 128>(be, dx, dB, dC, ddt, dA_log, dD, dstate0, dstate_final, state0, t, a);
    arena_reset(&be->scratch, sc.mark);
}

static void cu_ssd_recurrent_fwd(be_t *be, void *y, float *state, const void *x, int64_t ldx, const void *Bm,
                                 int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                                 const void *D, int B, int T, int H, int Hx, int GB, int GC, int P, int N) {
    if (!ssd_args_ok(be, "ssd_recurrent_fwd", B, T, H, Hx, GB, GC, P, N, 1, 0) || B == 0) return;
    ssd_dims_t a = make_dims(B, T, H, Hx, GB, GC, P, N, 1, x, ldx, Bm, ldb, Cm, ldc, dt, A_log, D);
    dim3 grid((unsigned)((P + 4 * STEP_RW - 1) / (4 * STEP_RW)), B * H);
    k_ssd_step<<<grid, 128, 0, cuda_stream(be)>>>((bf16 *)y, state, NULL, a);
    cuda_check_launch(be, "k_ssd_step");
}

static void cu_ssd_recurrent_step(be_t *be, void *y, void *const *rows, const void *x, int64_t ldx, const void *Bm,
                                  int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                                  const void *D, int N, int H, int Hx, int GB, int GC, int P, int Ns) {
    if (!ssd_args_ok(be, "ssd_recurrent_step", N, 1, H, Hx, GB, GC, P, Ns, 1, 0) || N == 0) return;
    ssd_dims_t a = make_dims(N, 1, H, Hx, GB, GC, P, Ns, 1, x, ldx, Bm, ldb, Cm, ldc, dt, A_log, D);
    dim3 grid((unsigned)((P + 4 * STEP_RW - 1) / (4 * STEP_RW)), N * H);
    k_ssd_step<<<grid, 128, 0, cuda_stream(be)>>>((bf16 *)y, NULL, (float *const *)rows, a);
    cuda_check_launch(be, "k_ssd_step (rows)");
}

static void cu_softplus_bias_fwd(be_t *be, float *out, const void *dt, int64_t ld, const void *dt_bias, int64_t N,
                                 int H) {
    if (N <= 0 || H <= 0) return;
    k_softplus_bias_fwd<<<cu_grid(be, N * H, 256), 256, 0, cuda_stream(be)>>>(out, (const bf16 *)dt, ld,
                                                                              (const bf16 *)dt_bias, N, H);
    cuda_check_launch(be, "k_softplus_bias_fwd");
}

static void cu_softplus_bias_bwd(be_t *be, void *ddt, int64_t ldd, float *ddt_bias, const float *dout, const void *dt,
                                 int64_t ld, const void *dt_bias, int64_t N, int H) {
    if (N <= 0 || H <= 0) return;
    // Row blocks of >= 64 rows, at most ~2 waves of blocks; per-block partial sums of
    // ddt per head, added in block order (deterministic). Without scratch: one block.
    const int hb = (H + 31) / 32;
    int64_t nblk = (N + 63) / 64, cap = (int64_t)cuda_impl(be)->sm_count * 8 / hb;
    if (cap < 1) cap = 1;
    if (nblk > cap) nblk = cap;
    size_t mark = arena_mark(&be->scratch);
    float *part = nblk > 1 ? (float *)cu_scratch_try(be, (size_t)nblk * H * sizeof(float)) : NULL;
    if (!part) nblk = 1;
    const int64_t rows = (N + nblk - 1) / nblk;
    k_softplus_bias_bwd<<<dim3((unsigned)nblk, hb), dim3(32, 8), 0, cuda_stream(be)>>>(
        (bf16 *)ddt, ldd, part, ddt_bias, dout, (const bf16 *)dt, ld, (const bf16 *)dt_bias, N, H, rows);
    cuda_check_launch(be, "k_softplus_bias_bwd");
    if (part) {
        k_softplus_bias_sum<<<(H + 127) / 128, 128, 0, cuda_stream(be)>>>(ddt_bias, part, (int)nblk, H);
        cuda_check_launch(be, "k_softplus_bias_sum");
    }
    arena_reset(&be->scratch, mark);
}

extern "C" void cuda_register_ssd(be_t *be) {
    be->softplus_bias_fwd = cu_softplus_bias_fwd;
    be->softplus_bias_bwd = cu_softplus_bias_bwd;
    be->ssd_chunk_fwd = cu_ssd_chunk_fwd;
    be->ssd_chunk_seqs = cu_ssd_chunk_seqs;
    be->ssd_chunk_bwd = cu_ssd_chunk_bwd;
    be->ssd_recurrent_fwd = cu_ssd_recurrent_fwd;
    be->ssd_recurrent_step = cu_ssd_recurrent_step;
}
