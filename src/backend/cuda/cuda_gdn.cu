// Gated DeltaNet on CUDA: gates, the decode recurrence, and the chunked (64)
// WY / UT-transform forward and backward (spec linear_blocks.md sections 1.5,
// 1.8, 2.1-2.4). Same semantics and chunk algebra as the CPU reference
// (cpu_gdn.c); the names below (F1..F4, B1..B7, G, M, T_A, W, U, Delta, P)
// are the spec's and the reference's.
//
// ---- kernels -------------------------------------------------------------------
// Chunk-parallel kernels run one block per (chunk, head); the two sequential
// state passes run one block per (sequence, value head, slice of 16*NW value
// rows) and loop over the chunks. Every chunk product is mma.sync m16n8k16
// (bf16 operands, fp32 accumulate) from ldmatrix'ed shared-memory tiles padded
// by 16 bytes per row; the triangular inverse and the backward's
// T_A^T dT_A T_A^T use mma.sync m16n8k8 tf32 (spec 2.2: "TF32 where
// supported"). G (chunk-local cumulative log decay) is in natural-log units.
//
//  k_prep  (F1, F2a, F2b; grid NT x B*HV, 4 warps)  G = chunk cumsum of g
//          (fp32, the reference's sequential order), KK^T and QK^T, M, P =
//          scale Gamma * QK^T (causal, bf16), T_A = (I + M)^-1 (16x16 diagonal
//          blocks by forward substitution in fp32, off-diagonal blocks by
//          block substitution with tf32 mma), W = T_A diag(beta e^G) K and
//          U = T_A diag(beta) V (the diag(...) folded into T_A's fragments,
//          rounded to bf16). Backward also stores T_A (bf16).
//  k_state (F3 / B2 and B4; grid Dv/(16 NW) x B*HV x {1,2}, NW warps). The
//          state tile lives in registers, transposed ("V-first" as in memory):
//          warp w holds S^T[16 value rows][K] as mma accumulators, so
//          S^T W^T (Delta), S^T K^T (dDelta) and their products with K, Q, W
//          take the state straight from registers (accumulator layout ==
//          A-fragment layout) and the chunk's W / K / Q tiles from shared
//          memory: no shared-memory round trip of the state and one block
//          barrier per chunk (F3). Forward pass per chunk: store h[c] = S
//          (bf16), Delta = U - W S (bf16, "v_new"), S <- e^{G_L} S +
//          K^T (gamma Delta). Reverse pass: dh[c] = dS, dDelta = P^T dO +
//          gamma (K dS), dS <- e^{G_L} dS + (scale e^G Q)^T dO - W^T dDelta.
//          In the backward both passes are independent (the reverse pass needs
//          no h) and run in ONE launch (blockIdx.z): with few heads each pass
//          alone would leave most of the chip idle.
//  k_out   (F4; grid NT x B*HV, 8 warps): o = scale e^G (Q h[c]) + P Delta,
//          looping over 64-wide Dv tiles with Q and P fragments in registers.
//  k_dqkw  (B5; grid K/64 x NT x B*H, 4 warps, loops over the HV/H value
//          heads of the q/k head so GVA sums happen in the block): dq
//          (final, bf16), the B5 part of dk (fp32, summed over the group),
//          dW = -dDelta S^T (bf16), and per-64-column partials of dG.
//  k_wy    (B6 + B7; grid NT x B*H, 4 warps): WY backward (dv, dbeta, dk,
//          dG), reverse cumulative sum of dG within the chunk, dk to bf16.
//  gates: k_gate_fwd elementwise; k_gate_bwd1 per (block of rows, head)
//          partials in double, k_gate_bwd2 sums them in a fixed order
//          (deterministic dA_log / ddt_bias).
//  k_recurrent (decode): one warp per 4 value rows of one (sequence, head),
//          K spread over the lanes, the state rows in registers across the T
//          tokens; memory-bound (reads and writes 4 K Dv bytes per head). The
//          states are one [B, HV, Dv, K] buffer, or (gdn_recurrent_step) each
//          sequence's own at a per-row pointer.
//  k_gdn_step (a model's decode step): k_step_inputs, k_recurrent and the
//          gated norm in one launch, a cluster of blocks per (row, q/k head)
//          (its comment, below).
//
// ---- scratch (be->scratch; bytes per sequence-token per value head) -------------
// With Tc = 64 NT (T rounded up to whole chunks), every buffer rounded up to
// 256 bytes (gdn_chunk_scratch_bytes() below gives the exact figure; an arena
// that is too small is an error naming both numbers, outputs set to NaN):
//   forward:  12 (G, e^G, gamma) + 2K (W) + 2Dv (U) + 128 (P) + 2Dv (Delta)
//             + 2 K Dv Tc / (64 T) (h)
//   backward: the forward's + 128 (T_A) + 2 K Dv Tc / (64 T) (dh) + 2Dv (dDelta)
//             + 4 ceil(K/64) (dG partials), plus 4K per token per q/k head (dk
//             partial, fp32). dW reuses W's space (nothing reads W after B4).
// HyLo (K = 256, Dv = 512): forward 6.8 KB, backward 12.1 KB per token per
// value head + 1 KB per token per q/k head: B = 1, T = 65536 needs 2.7 GB
// (forward) and 5.1 GB (backward) with HV = H = 6, 4.0 / 7.7 GB with 9.
//
// ---- predicted times (H200; B = 1, H = HV = 6, K = 256, Dv = 512) ----------------
// Two numbers first (METHOD.md): forward FLOPs by the spec's 2.5 model, 0.90
// MFLOP per token per head: 44 GFLOP at 8K, 0.36 TFLOP at 64K (0.07 / 0.55 ms
// at ~650 TFLOP/s of mma.sync); fwd + bwd 3.5x that. Fewest bytes (q, k, v in,
// o out): 25 MB at 8K, 0.2 GB at 64K (6 / 47 us at 4.3 TB/s). Neither is the
// limit. The state passes are sequential over the NT chunks with only
// B*HV*Dv/64 = 48 blocks, and every warp reads the whole chunk's W and K
// (and Q, P) tiles through ldmatrix for its 16 value rows: the shared-memory
// operand traffic (~128 B/clk/SM) bounds a chunk step. The chunk-parallel
// kernels are bound by HBM (h, dh: 4 KB per token per head each) or by the
// same ldmatrix traffic. Per kernel (8K / 64K):
//   k_prep        fwd  0.05 / 0.40 ms  (232 KB HBM per chunk-head + serial inverse)
//   k_state fwd        0.15 / 1.2 ms   (512 ldmatrix.x4 per SM per chunk: ~1.1 us/chunk)
//   k_out              0.08 / 0.60 ms  (h read: 424 KB per chunk-head)
//   k_prep        bwd  0.06 / 0.42 ms
//   k_state both       0.25 / 2.0 ms   (reverse pass: 864 ldmatrix.x4 per SM: ~1.9 us/chunk;
//                                       the forward pass runs beside it on other SMs)
//   k_dqkw             0.16 / 1.25 ms  (HBM: h, dh, Delta, dO, dDelta ~870 KB per chunk-head)
//   k_wy               0.08 / 0.65 ms  (HBM, dk partial read-modify-write)
//   forward 0.29 / 2.2 ms, backward 0.55 / 4.3 ms, fwd+bwd 0.84 / 6.5 ms
//   (H = 9: the backward's two passes need 144 blocks > 132 SMs: ~+15%;
//   fwd+bwd ~1.2 / 8.5 ms).
// Measured (run 5, docs/PERFORMANCE.md), about 3x these: forward 0.788 /
// 5.888 ms, fwd+bwd 2.503 / 19.123 ms (H = 6); the per-kernel estimates above
// undercount (bench_gdn --kernels gives the measured split: run 11, 64K, H = 6,
// k_state forward 4.17 ms, ~4.1 us per chunk step against the ~1.1 predicted,
// the same with H = 9).
// The largest lever left is the 16-row warp tile of mma.sync: wgmma's 64-row
// warpgroup tiles read each B operand once per 64 rows (4x less shared-memory
// traffic in the state passes and k_dqkw); next, TMA multicast of the W/K/Q
// tiles over a cluster of one head's Dv slices (L2 -> SM traffic is repeated
// per slice today), and overlapping k_out with the forward state pass. The
// state passes now run on wgmma (k_state_wg below; k_state stays for shapes a
// tensor map cannot describe, and for bench_gdn --compare's comparison).
//
// ---- precision -----------------------------------------------------------------
// bf16 tensor-core operands: q, k, v, dO (inputs), T_A, W, U, P, h, dh, Delta,
// dDelta, dW, ds, dM (rounded where produced); fp32 accumulation, fp32 states
// (the running S and dS never leave fp32 registers), fp32 G, beta, dg, dbeta,
// final state and dstate0. Expected relative L2 error against the fp32 CPU
// reference: ~3e-3 (o, state), ~5e-3 (dq, dk, dv), ~1e-2 (dg).

#include <cooperative_groups.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_gdn.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_vec.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

enum { BT = 64 };      // chunk length
enum { LDT = BT + 8 }; // row stride (elements) of a padded 64-column bf16 tile
enum { LDF = BT + 4 }; // row stride of a 64 x 64 fp32 matrix in shared memory

// ==== device helpers =================================================================

// Pointer-taking forms of cuda_mma.cuh's cp.async and ldmatrix wrappers.
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    cp_async16(smem_u32(dst), src, valid);
}
// 4-byte variant (the per-chunk gate vectors).
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) { ldsm_x4(r, smem_u32(p)); }
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) { ldsm_x4_t(r, smem_u32(p)); }

// c += a b: a 16x16 bf16 (row), b 16x8 bf16 (col), fp32 accumulate. Fragments
// (g = lane/4, t = lane%4): a[0] (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g,
// 2t+8..), a[3] (g+8, 2t+8..); b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g);
// c[0..1] (g, 2t..2t+1), c[2..3] (g+8, 2t..2t+1). The accumulator layout of
// two adjacent n-tiles is the A layout of one k-step (used throughout).
// m16n8k8 tf32: a[0] (g, t), a[1] (g+8, t), a[2] (g, t+4), a[3] (g+8, t+4);
// b0 (k t, n g), b1 (k t+4, n g); c as above.
static __device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// Two floats -> bf16x2 (round to nearest even), lo in the low half.
static __device__ __forceinline__ uint32_t gdn_pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}
static __device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }

// ---- fragment loaders (warp-wide; `s` a shared-memory matrix, ld its row stride) ----
// A (16x16 at rows m0, cols k0) of a row-major A: A[m][k] = s[m*ld + k].
static __device__ __forceinline__ void lda_mk(uint32_t a[4], const bf16 *s, int ld, int m0, int k0, int lane) {
    ldsm_x4(a, s + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}
// A stored transposed: A[m][k] = s[k*ld + m].
static __device__ __forceinline__ void lda_km(uint32_t a[4], const bf16 *s, int ld, int m0, int k0, int lane) {
    ldsm_x4_t(a, s + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + ((lane >> 3) & 1) * 8);
}
// B for two n-tiles (n0.., n0+8..) and k0..k0+15: b[0], b[1] n-tile n0; b[2], b[3] n-tile n0+8.
// B stored [n][k]: B[k][n] = s[n*ld + k].
static __device__ __forceinline__ void ldb_nk(uint32_t b[4], const bf16 *s, int ld, int k0, int n0, int lane) {
    ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
// B stored [k][n]: B[k][n] = s[k*ld + n].
static __device__ __forceinline__ void ldb_kn(uint32_t b[4], const bf16 *s, int ld, int k0, int n0, int lane) {
    ldsm_x4_t(b, s + (k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8);
}
// Accumulators of n-tiles 2kk, 2kk+1 (times f) as the A fragment of k-step kk.
static __device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4], float f) {
    a[0] = gdn_pack_bf16(c0[0] * f, c0[1] * f);
    a[1] = gdn_pack_bf16(c0[2] * f, c0[3] * f);
    a[2] = gdn_pack_bf16(c1[0] * f, c1[1] * f);
    a[3] = gdn_pack_bf16(c1[2] * f, c1[3] * f);
}
// Same with a factor per column: f[0..1] columns 2t, 2t+1 of n-tile 2kk, f[2..3] of n-tile 2kk+1.
static __device__ __forceinline__ void acc_to_a_cols(uint32_t a[4], const float c0[4], const float c1[4],
                                                     const float f[4]) {
    a[0] = gdn_pack_bf16(c0[0] * f[0], c0[1] * f[1]);
    a[1] = gdn_pack_bf16(c0[2] * f[0], c0[3] * f[1]);
    a[2] = gdn_pack_bf16(c1[0] * f[2], c1[1] * f[3]);
    a[3] = gdn_pack_bf16(c1[2] * f[2], c1[3] * f[3]);
}

// Warp tf32 product: acc (16 x 8 NTL) += A (16 x 8 KS) B (8 KS x 8 NTL) with
// A(m, k) = pa[m*sam + k*sak], B(k, n) = pb[k*sbk + n*sbn], fp32 shared memory.
template <int NTL, int KS>
static __device__ __forceinline__ void mma_tf32_tile(float (&acc)[NTL][4], const float *pa, int sam, int sak,
                                                     const float *pb, int sbk, int sbn, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        a[0] = to_tf32(pa[g * sam + (8 * ks + t) * sak]);
        a[1] = to_tf32(pa[(g + 8) * sam + (8 * ks + t) * sak]);
        a[2] = to_tf32(pa[g * sam + (8 * ks + t + 4) * sak]);
        a[3] = to_tf32(pa[(g + 8) * sam + (8 * ks + t + 4) * sak]);
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            uint32_t b0 = to_tf32(pb[(8 * ks + t) * sbk + (8 * nt + g) * sbn]);
            uint32_t b1 = to_tf32(pb[(8 * ks + t + 4) * sbk + (8 * nt + g) * sbn]);
            mma_tf32(acc[nt], a, b0, b1);
        }
    }
}

// ROWS x COLS bf16 tile, global row r at g + r*gs -> shared row r at s + r*ss;
// rows >= nrows and 8-column groups at or past ncols are zero-filled. Each
// thread copies one fixed 8-column group of every (NTH / (COLS/8))-th row, so
// the addresses are a constant stride apart (a few instructions per copy).
template <int ROWS, int COLS, int NTH>
static __device__ __forceinline__ void tile_async(bf16 *s, int ss, const bf16 *g, int64_t gs, int nrows, int ncols,
                                                  int tid) {
    constexpr int CH = COLS / 8;
    static_assert(NTH % CH == 0 && ROWS % (NTH / CH) == 0, "tile shape");
    constexpr int RS = NTH / CH, IT = ROWS / RS;
    const int c = tid % CH;
    int r = tid / CH;
    const bool cok = c * 8 < ncols;
    const bf16 *gp = g + (int64_t)r * gs + c * 8;
    bf16 *sp = s + r * ss + c * 8;
    const int64_t gstep = (int64_t)RS * gs;
    // unrolled by 4 only: all IT addresses at once would cost registers the state passes do not have
#pragma unroll 4
    for (int k = 0; k < IT; k++, r += RS, gp += gstep, sp += RS * ss) {
        const bool ok = cok && r < nrows;
        cp_async16(sp, ok ? (const void *)gp : (const void *)g, ok);
    }
}
// n (<= 64) floats -> s[0..64), zero past n.
static __device__ __forceinline__ void vec_async(float *s, const float *g, int n, int tid) {
    if (tid < BT) cp_async4(s + tid, tid < n ? g + tid : g, tid < n);
}

// ==== gates =======================================================================

__global__ void k_gate_fwd(float *g, float *beta, const bf16 *a, int64_t lda, const bf16 *b, int64_t ldb,
                           const bf16 *A_log, const bf16 *dt_bias, int64_t N, int HV, float s) {
    GRID_STRIDE(i, N * HV) {
        int64_t n = i / HV;
        int h = (int)(i - n * HV);
        g[i] = -expf(bf2f(A_log[h])) * dev_softplus(bf2f(a[n * lda + h]) + bf2f(dt_bias[h]));
        beta[i] = s * dev_sigmoid(bf2f(b[n * ldb + h]));
    }
}

enum { GATE_THREADS = 256 };

// Block (x, head h) handles rows [x R, (x+1) R): da, db elementwise, and the
// block's sums of dc and dg * g (double, fixed tree) into part[(h nblk + x) 2 + {0,1}].
__global__ void __launch_bounds__(GATE_THREADS)
    k_gate_bwd1(bf16 *da, int64_t ldda, bf16 *db, int64_t lddb, double *part, const float *dg, const float *dbeta,
                const bf16 *a, int64_t lda, const bf16 *b, int64_t ldb, const bf16 *A_log, const bf16 *dt_bias,
                int64_t N, int HV, float s, int64_t R) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    double *red = (double *)smem_raw; // [2][GATE_THREADS]
    const int h = blockIdx.y, tid = threadIdx.x;
    const int64_t n0 = (int64_t)blockIdx.x * R, n1 = n0 + R < N ? n0 + R : N;
    const float A = expf(bf2f(A_log[h])), dt = bf2f(dt_bias[h]);
    double sdc = 0, sdA = 0;
    for (int64_t n = n0 + tid; n < n1; n += GATE_THREADS) {
        float c = bf2f(a[n * lda + h]) + dt;
        float gg = -A * dev_softplus(c);
        float dgi = dg[n * HV + h];
        float dc = dgi * -A * (c > 20.0f ? 1.0f : dev_sigmoid(c));
        da[n * ldda + h] = __float2bfloat16_rn(dc);
        sdc += dc;
        sdA += (double)dgi * gg;
        float sb = dev_sigmoid(bf2f(b[n * ldb + h]));
        db[n * lddb + h] = __float2bfloat16_rn(dbeta[n * HV + h] * s * sb * (1.0f - sb));
    }
    red[tid] = sdc;
    red[GATE_THREADS + tid] = sdA;
    __syncthreads();
    for (int w = GATE_THREADS / 2; w > 0; w >>= 1) {
        if (tid < w) {
            red[tid] += red[tid + w];
            red[GATE_THREADS + tid] += red[GATE_THREADS + tid + w];
        }
        __syncthreads();
    }
    if (tid == 0) {
        part[((int64_t)h * gridDim.x + blockIdx.x) * 2] = red[0];
        part[((int64_t)h * gridDim.x + blockIdx.x) * 2 + 1] = red[GATE_THREADS];
    }
}

__global__ void k_gate_bwd2(float *dA_log, float *ddt_bias, const double *part, int nblk, int HV) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= HV) return;
    double sdc = 0, sdA = 0;
    for (int i = 0; i < nblk; i++) {
        sdc += part[((int64_t)h * nblk + i) * 2];
        sdA += part[((int64_t)h * nblk + i) * 2 + 1];
    }
    ddt_bias[h] += (float)sdc;
    dA_log[h] += (float)sdA;
}

// ==== decode recurrence ===============================================================

enum { REC_ROWS = 4, REC_WARPS = 4 };

// E = K/32 state elements per lane (lane l holds columns [l E, l E + E)).
// One token of the delta rule on R state rows a warp holds (each lane E
// consecutive columns of K): s = alpha s, u = beta (v - s k), s += k u, and
// the readout s q, which lane j < R returns for row j (k_recurrent, k_gdn_step).
template <int R, int E>
static __device__ __forceinline__ float delta_rule_rows(float (&s)[R][E], const float (&kk)[E], const float (&qq)[E],
                                                        const float (&vv)[R], float alpha, float bt, int lane) {
    float sk[R], sq[R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            s[j][e] *= alpha;
            acc += s[j][e] * kk[e];
        }
        sk[j] = warp_sum(acc);
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float u = bt * (vv[j] - sk[j]);
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            s[j][e] += kk[e] * u;
            acc += s[j][e] * qq[e];
        }
        sq[j] = warp_sum(acc);
    }
    float mine = sq[0];
#pragma unroll
    for (int j = 1; j < R; j++)
        mine = lane == j ? sq[j] : mine;
    return mine;
}

template <int E>
__global__ void __launch_bounds__(REC_WARPS * 32)
    k_recurrent(bf16 *o, float *state, float *const *rows, const bf16 *q, const bf16 *k, const bf16 *v, const float *g,
                const float *beta, float scale, int T, int H, int HV, int K, int Dv) {
    griddep_enter(); // a programmatic dependent launch (cuda_vec.cuh)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / H);
    const int v0 = (blockIdx.x * REC_WARPS + warp) * REC_ROWS;
    const int x0 = lane * E;
    const bool kval = x0 < K;
    // this (sequence, head)'s state [Dv, K]: in state [B, HV, Dv, K], or in
    // sequence b's own [HV, Dv, K] at rows[b] (a decode step over many caches)
    float *sb = rows ? rows[b] + (int64_t)h * Dv * K : state ? state + (int64_t)bh * Dv * K : nullptr;
    float s[REC_ROWS][E];
#pragma unroll
    for (int r = 0; r < REC_ROWS; r++) {
        const bool ok = sb && kval && v0 + r < Dv;
        const float *sp = sb + (int64_t)(v0 + r) * K + x0;
#pragma unroll
        for (int e = 0; e < E; e++)
            s[r][e] = ok ? sp[e] : 0.0f;
    }
    for (int t = 0; t < T; t++) {
        const int64_t row = (int64_t)b * T + t;
        float kk[E], qq[E];
        if (kval) {
            const bf16 *kp = k + (row * H + hq) * K + x0, *qp = q + (row * H + hq) * K + x0;
#pragma unroll
            for (int e = 0; e < E; e += 2) {
                float f2[2];
                ld_bf16<2>(kp + e, f2);
                kk[e] = f2[0], kk[e + 1] = f2[1];
                ld_bf16<2>(qp + e, f2);
                qq[e] = f2[0], qq[e + 1] = f2[1];
            }
        } else {
#pragma unroll
            for (int e = 0; e < E; e++)
                kk[e] = qq[e] = 0.0f;
        }
        const float alpha = expf(g[row * HV + h]), bt = beta[row * HV + h];
        const bf16 *vp = v + (row * HV + h) * Dv;
        float vv[REC_ROWS];
#pragma unroll
        for (int r = 0; r < REC_ROWS; r++)
            vv[r] = v0 + r < Dv ? bf2f(vp[v0 + r]) : 0.0f;
        const float mine = delta_rule_rows<REC_ROWS, E>(s, kk, qq, vv, alpha, bt, lane);
        if (lane < REC_ROWS && v0 + lane < Dv) o[(row * HV + h) * Dv + v0 + lane] = __float2bfloat16_rn(scale * mine);
    }
#pragma unroll
    for (int r = 0; r < REC_ROWS; r++)
        if (sb && kval && v0 + r < Dv) {
            float *sp = sb + (int64_t)(v0 + r) * K + x0;
#pragma unroll
            for (int e = 0; e < E; e++)
                sp[e] = s[r][e];
        }
}

// ==== F1 + F2: gates' cumsum, M, P, T_A, W, U ==============================================

// Shared memory of k_prep (bytes). Region A: two buffers, each a K slice and
// a Q slice [64][LDT] (phase 1), later the right-hand-side tiles of W and U;
// region B: M and T_A (fp32 [64][LDF]) and the per-warp 16 x 24 scratch of
// the block substitution; vectors G, beta, e^G.
enum {
    PREP_TILE = BT * LDT * 2,
    PREP_A = 4 * PREP_TILE,
    PREP_M = PREP_A,
    PREP_TA = PREP_M + BT * LDF * 4,
    PREP_X = PREP_TA + BT * LDF * 4,
    PREP_VEC = PREP_X + 4 * 16 * 24 * 4,
    PREP_SMEM = PREP_VEC + 3 * BT * 4
};

// Grid (NT, B*HV), 128 threads. Outputs (bh = b*HV + h, rows t of [bh][T][.]):
// Gs, EG = e^G, GM = gamma = e^{G_L - G} (G_L: the chunk's last token) [bh][T]
// fp32 (the state passes then need no exponentials); W [bh][T][K], U
// [bh][T][Dv], P [bh][T][64] and (when TAo) T_A [bh][T][64], bf16; row t holds
// row t mod 64 of its chunk's matrix.
__global__ void __launch_bounds__(128)
    k_prep(const bf16 *q, const bf16 *k, const bf16 *v, const float *gin, const float *betain, float *Gs, float *EGo,
           float *GMo, bf16 *Wo, bf16 *Uo, bf16 *Po, bf16 *TAo, float scale, int T, int H, int HV, int K, int Dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sA = (bf16 *)smem; // 4 tiles [64][LDT]
    float *sM = (float *)(smem + PREP_M), *sTA = (float *)(smem + PREP_TA), *sXw = (float *)(smem + PREP_X);
    float *sG = (float *)(smem + PREP_VEC), *sBeta = sG + BT, *sEG = sBeta + BT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int c = blockIdx.x, bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / H);
    const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
    const int64_t row0 = (int64_t)b * T + t0;   // first token row of the chunk in [B, T, ...]
    const int64_t orow0 = (int64_t)bh * T + t0; // in the head-major scratch [bh][T]
    const bf16 *kb = k + (row0 * H + hq) * K, *qb = q + (row0 * H + hq) * K;
    const int64_t kst = (int64_t)H * K;
    const int nks = (K + 63) / 64; // 64-column slices of K

    // phase 1 loads: slice s -> buffer pair (s & 1): K at tile 2(s&1), Q at 2(s&1)+1
    auto issue_kq = [&](int s) {
        bf16 *dk = sA + (2 * (s & 1)) * BT * LDT, *dq = dk + BT * LDT;
        tile_async<BT, 64, 128>(dk, LDT, kb + 64 * s, kst, L, K - 64 * s, tid);
        tile_async<BT, 64, 128>(dq, LDT, qb + 64 * s, kst, L, K - 64 * s, tid);
        cp_async_commit();
    };
    issue_kq(0);

    // F1: G = chunk-local inclusive cumsum of g, in the reference's order
    if (tid < BT) {
        sG[tid] = tid < L ? gin[(row0 + tid) * HV + h] : 0.0f;
        sBeta[tid] = tid < L ? betain[(row0 + tid) * HV + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int i = 0; i < L; i++) {
            acc += sG[i];
            sG[i] = acc;
        }
    }
    __syncthreads();
    if (tid < BT) {
        sEG[tid] = tid < L ? expf(sG[tid]) : 0.0f;
        if (tid < L) {
            Gs[orow0 + tid] = sG[tid];
            EGo[orow0 + tid] = sEG[tid];
            GMo[orow0 + tid] = expf(sG[L - 1] - sG[tid]);
        }
    }

    // K K^T and Q K^T, warp w: rows 16w..16w+15, all 64 columns
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            kk[nt][r] = qk[nt][r] = 0.0f;
    for (int s = 0; s < nks; s++) {
        cp_async_wait<0>();
        __syncthreads();
        if (s + 1 < nks) issue_kq(s + 1);
        const bf16 *tk = sA + (2 * (s & 1)) * BT * LDT, *tq = tk + BT * LDT;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t ak[4], aq[4];
            lda_mk(ak, tk, LDT, 16 * warp, 16 * ks, lane);
            lda_mk(aq, tq, LDT, 16 * warp, 16 * ks, lane);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_nk(bb, tk, LDT, 16 * ks, 16 * np, lane);
                mma_bf16(kk[2 * np], ak, bb[0], bb[1]);
                mma_bf16(kk[2 * np + 1], ak, bb[2], bb[3]);
                mma_bf16(qk[2 * np], aq, bb[0], bb[1]);
                mma_bf16(qk[2 * np + 1], aq, bb[2], bb[3]);
            }
        }
    }

    // M_ij = beta_i (k_i . k_j) Gamma_ij (j < i), P_ij = scale (q_i . k_j) Gamma_ij (j <= i);
    // exp only where unmasked (G_i - G_j <= 0 there)
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int i = 16 * warp + gq + 8 * hr, j = 8 * nt + 2 * t4;
            float pv[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float gam = (j + e <= i && i < L) ? expf(sG[i] - sG[j + e]) : 0.0f;
                sM[i * LDF + j + e] = j + e < i ? sBeta[i] * kk[nt][2 * hr + e] * gam : 0.0f;
                pv[e] = scale * qk[nt][2 * hr + e] * gam;
            }
            if (i < L) *(uint32_t *)(Po + (orow0 + i) * BT + j) = gdn_pack_bf16(pv[0], pv[1]);
        }
    // zero the strictly upper 16x16 blocks of T_A
    for (int e = tid; e < 6 * 256; e += 128) {
        const int blk = e >> 8, r = (e >> 4) & 15, cc = e & 15;
        const int bi = blk < 3 ? 0 : (blk < 5 ? 1 : 2), bj = blk < 3 ? blk + 1 : (blk < 5 ? blk - 1 : 3);
        sTA[(16 * bi + r) * LDF + 16 * bj + cc] = 0.0f;
    }
    __syncthreads();

    // T_A = (I + M)^-1. Diagonal 16x16 blocks: lane pair-half (block db, column cc)
    // by forward substitution (rows of the inverse above cc come out 0).
    if (warp < 2) {
        const int db = 2 * warp + (lane >> 4), cc = lane & 15;
        const float *Mb = sM + 16 * db * LDF + 16 * db;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float sacc = i == cc ? 1.0f : 0.0f;
#pragma unroll
            for (int m = 0; m < i; m++)
                sacc -= Mb[i * LDF + m] * x[m];
            x[i] = sacc;
        }
#pragma unroll
        for (int i = 0; i < 16; i++)
            sTA[(16 * db + i) * LDF + 16 * db + cc] = x[i];
    }
    __syncthreads();
    // Off-diagonal blocks by diagonal distance d: Inv_ij = -Inv_ii sum_{k=j..i-1} M_ik Inv_kj.
    for (int d = 1; d < 4; d++) {
        if (warp < 4 - d) {
            const int bj = warp, bi = warp + d;
            float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            for (int bk = bj; bk < bi; bk++)
                mma_tf32_tile<2, 2>(acc, sM + 16 * bi * LDF + 16 * bk, LDF, 1, sTA + 16 * bk * LDF + 16 * bj, LDF, 1,
                                    lane);
            float *X = sXw + warp * 16 * 24;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    X[(gq + 8 * (r >> 1)) * 24 + 8 * nt + 2 * t4 + (r & 1)] = acc[nt][r];
            __syncwarp();
            float y[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            mma_tf32_tile<2, 2>(y, sTA + 16 * bi * LDF + 16 * bi, LDF, 1, X, 24, 1, lane);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    sTA[(16 * bi + gq + 8 * (r >> 1)) * LDF + 16 * bj + 8 * nt + 2 * t4 + (r & 1)] = -y[nt][r];
        }
        __syncthreads();
    }
    if (TAo)
        for (int e = tid; e < L * 32; e += 128) {
            const int i = e >> 5, jp = e & 31;
            *(uint32_t *)(TAo + (orow0 + i) * BT + 2 * jp) =
                gdn_pack_bf16(sTA[i * LDF + 2 * jp], sTA[i * LDF + 2 * jp + 1]);
        }

    // F2b: W = T_A diag(beta e^G) K, U = T_A diag(beta) V. The diagonal scaling
    // goes into the A fragments of T_A (warp rows 16w.., k-steps over j).
    uint32_t aW[4][4], aU[4][4];
#pragma unroll
    for (int kk2 = 0; kk2 < 4; kk2++) {
        const int i0 = 16 * warp + gq, j0 = 16 * kk2 + 2 * t4;
        const float *r0 = sTA + i0 * LDF, *r1 = sTA + (i0 + 8) * LDF;
        float fu[4] = {sBeta[j0], sBeta[j0 + 1], sBeta[j0 + 8], sBeta[j0 + 9]};
        float fw[4] = {fu[0] * sEG[j0], fu[1] * sEG[j0 + 1], fu[2] * sEG[j0 + 8], fu[3] * sEG[j0 + 9]};
        aU[kk2][0] = gdn_pack_bf16(r0[j0] * fu[0], r0[j0 + 1] * fu[1]);
        aU[kk2][1] = gdn_pack_bf16(r1[j0] * fu[0], r1[j0 + 1] * fu[1]);
        aU[kk2][2] = gdn_pack_bf16(r0[j0 + 8] * fu[2], r0[j0 + 9] * fu[3]);
        aU[kk2][3] = gdn_pack_bf16(r1[j0 + 8] * fu[2], r1[j0 + 9] * fu[3]);
        aW[kk2][0] = gdn_pack_bf16(r0[j0] * fw[0], r0[j0 + 1] * fw[1]);
        aW[kk2][1] = gdn_pack_bf16(r1[j0] * fw[0], r1[j0 + 1] * fw[1]);
        aW[kk2][2] = gdn_pack_bf16(r0[j0 + 8] * fw[2], r0[j0 + 9] * fw[3]);
        aW[kk2][3] = gdn_pack_bf16(r1[j0 + 8] * fw[2], r1[j0 + 9] * fw[3]);
    }
    // right-hand sides: tiles 0..nks-1 are 64-column slices of K (-> W), then
    // slices of V (-> U); double-buffered in region A tiles 0 and 1
    const int nvs = (Dv + 63) / 64, ntiles = nks + nvs;
    const bf16 *vb = v + (row0 * HV + h) * Dv;
    auto issue_rhs = [&](int it) {
        bf16 *dst = sA + (it & 1) * BT * LDT;
        if (it < nks)
            tile_async<BT, 64, 128>(dst, LDT, kb + 64 * it, kst, L, K - 64 * it, tid);
        else
            tile_async<BT, 64, 128>(dst, LDT, vb + 64 * (it - nks), (int64_t)HV * Dv, L, Dv - 64 * (it - nks), tid);
        cp_async_commit();
    };
    __syncthreads(); // region A (Q/K slices) is free
    issue_rhs(0);
    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < ntiles) issue_rhs(it + 1);
        const bf16 *rhs = sA + (it & 1) * BT * LDT;
        const bool isw = it < nks;
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[nt][r] = 0.0f;
#pragma unroll
        for (int kk2 = 0; kk2 < 4; kk2++)
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_kn(bb, rhs, LDT, 16 * kk2, 16 * np, lane);
                uint32_t a[4]; // select by value: a pointer into the register arrays would put them in local memory
#pragma unroll
                for (int r = 0; r < 4; r++)
                    a[r] = isw ? aW[kk2][r] : aU[kk2][r];
                mma_bf16(acc[2 * np], a, bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
            }
        bf16 *out = isw ? Wo : Uo;
        const int ld = isw ? K : Dv, col0 = 64 * (isw ? it : it - nks);
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * warp + gq + 8 * hr, col = col0 + 8 * nt + 2 * t4;
                if (i < L && col < ld)
                    *(uint32_t *)(out + (orow0 + i) * ld + col) = gdn_pack_bf16(acc[nt][2 * hr], acc[nt][2 * hr + 1]);
            }
    }
}

// ==== F3 / B2 and B4: the sequential state passes ===========================================

// Shared memory of k_state (bytes), forward pass: two stages of {W, K [64][KP+8],
// U [64][16NW+8] bf16, e^G and gamma [64] fp32}; reverse pass: K (single), Q,
// W (single), two stages of {P [64][LDT], dO [64][16NW+8], e^G, gamma}; both:
// per-warp Delta staging [64][24] bf16.
template <int KP, int NW> struct state_cfg {
    static constexpr int LDK = KP + 8, BV = 16 * NW, LDU = BV + 8;
    static constexpr int TK = BT * LDK * 2, TU = BT * LDU * 2, TP = BT * LDT * 2, VG = 2 * BT * 4; // e^G, gamma
    static constexpr int STG = NW * BT * 24 * 2;
    // forward
    static constexpr int F_STAGE = 2 * TK + TU + VG;
    static constexpr int F_SMEM = 2 * F_STAGE + STG;
    // reverse
    static constexpr int R_K = 0, R_Q = TK, R_W = 2 * TK, R_ST = 3 * TK;
    static constexpr int R_STAGE = TP + TU + VG;
    static constexpr int R_SMEM = 3 * TK + 2 * R_STAGE + STG;
    static constexpr int SMEM = F_SMEM > R_SMEM ? F_SMEM : R_SMEM;
};

// One k-step's A fragment of the warp's state tile (rows g, g+8; columns
// x0 + 2t.. and x0 + 8 + 2t..) to a V-first bf16 matrix: p = &M[v0 + g][2t],
// row stride K; columns at or past K (padding) are not stored.
static __device__ __forceinline__ void store_a_rows(bf16 *p, const uint32_t a[4], int x0, int K) {
    if (x0 < K) {
        *(uint32_t *)(p + x0) = a[0];
        *(uint32_t *)(p + 8 * K + x0) = a[1];
    }
    if (x0 + 8 < K) {
        *(uint32_t *)(p + x0 + 8) = a[2];
        *(uint32_t *)(p + 8 * K + x0 + 8) = a[3];
    }
}

// Warp-private staging of a [64 tokens][16 value rows] bf16 tile held as
// accumulators (rows v, columns j) and its store to rows t0 + j < t0 + L of a
// [.., Dv] matrix (row stride ld) at column v0: 32-byte row segments.
static __device__ __forceinline__ void store_vt(bf16 *dst, int64_t ld, bf16 *stg, const float (&acc)[8][4], int L,
                                                int lane) {
    const int gq = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            stg[(8 * nt + 2 * t4 + (r & 1)) * 24 + gq + 8 * (r >> 1)] = __float2bfloat16_rn(acc[nt][r]);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int e = lane + 32 * i, j = e >> 1, half = e & 1;
        if (j < L) *(uint4 *)(dst + j * ld + 8 * half) = *(const uint4 *)(stg + j * 24 + 8 * half);
    }
    __syncwarp();
}

// Forward state pass for (bh, value rows [vb0, vb0 + 16 NW)).
//   h[c] = S; Delta = U - W S; S <- e^{G_L} S + K^T (gamma Delta), gamma_j = e^{G_L - G_j}.
template <int KP, int NW>
static __device__ __forceinline__ void
state_fwd(unsigned char *smem, const bf16 *W, const bf16 *U, const bf16 *k, const float *EG, const float *GM, bf16 *hst,
          bf16 *Dl, float *state, int init, int write_final, int T, int H, int HV, int K, int Dv, int NT) {
    typedef state_cfg<KP, NW> C;
    constexpr int LDK = C::LDK, LDU = C::LDU, NTH = NW * 32;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / H);
    const int vb0 = blockIdx.x * C::BV, v0 = vb0 + 16 * warp;
    const bool wv = v0 < Dv;
    bf16 *stg = (bf16 *)(smem + 2 * C::F_STAGE) + warp * BT * 24;
    const bf16 *kb = k + ((int64_t)b * T * H + hq) * K, *Wb = W + (int64_t)bh * T * K,
               *Ub = U + (int64_t)bh * T * Dv + vb0;
    const float *EGb = EG + (int64_t)bh * T, *GMb = GM + (int64_t)bh * T;

    float s[KP / 8][4];
#pragma unroll
    for (int n = 0; n < KP / 8; n++) {
        const int x = 8 * n + 2 * t4;
        const bool ok = state && init && wv && x < K;
        const float *sp = state + ((int64_t)bh * Dv + v0 + gq) * K + x;
        s[n][0] = ok ? sp[0] : 0.0f;
        s[n][1] = ok ? sp[1] : 0.0f;
        s[n][2] = ok ? sp[8 * K] : 0.0f;
        s[n][3] = ok ? sp[8 * K + 1] : 0.0f;
    }

    auto issue = [&](int c) {
        unsigned char *st = smem + (c & 1) * C::F_STAGE;
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        tile_async<BT, KP, NTH>((bf16 *)st, LDK, Wb + (int64_t)t0 * K, K, L, K, tid);
        tile_async<BT, KP, NTH>((bf16 *)(st + C::TK), LDK, kb + (int64_t)t0 * H * K, (int64_t)H * K, L, K, tid);
        tile_async<BT, C::BV, NTH>((bf16 *)(st + 2 * C::TK), LDU, Ub + (int64_t)t0 * Dv, Dv, L, Dv - vb0, tid);
        vec_async((float *)(st + 2 * C::TK + C::TU), EGb + t0, L, tid);
        vec_async((float *)(st + 2 * C::TK + C::TU) + BT, GMb + t0, L, tid);
        cp_async_commit();
    };
    issue(0);
    for (int c = 0; c < NT; c++) {
        cp_async_wait<0>();
        __syncthreads(); // chunk c landed; every warp is done with chunk c-1's stage
        if (c + 1 < NT) issue(c + 1);
        const unsigned char *st = smem + (c & 1) * C::F_STAGE;
        const bf16 *sW = (const bf16 *)st, *sK = (const bf16 *)(st + C::TK), *sU = (const bf16 *)(st + 2 * C::TK);
        const float *sEG = (const float *)(st + 2 * C::TK + C::TU), *sGM = sEG + BT; // zero past L
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        bf16 *hp = hst + (((int64_t)bh * NT + c) * Dv + v0 + gq) * K + 2 * t4; // h[c] = S, row v0 + gq

        // (W S)^T: rows v, columns j; the bf16 A fragments of S are h[c]'s values
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[nt][r] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KP / 16; ks++) {
            uint32_t a[4];
            acc_to_a(a, s[2 * ks], s[2 * ks + 1], 1.0f);
            if (wv) store_a_rows(hp, a, 16 * ks, K);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_nk(bb, sW, LDK, 16 * ks, 16 * np, lane);
                mma_bf16(acc[2 * np], a, bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        // Delta^T = U^T - (W S)^T
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int j = 8 * nt + 2 * t4 + (r & 1), vl = 16 * warp + gq + 8 * (r >> 1);
                acc[nt][r] = bf2f(sU[j * LDU + vl]) - acc[nt][r];
            }
        if (wv) store_vt(Dl + ((int64_t)bh * T + t0) * Dv + v0, Dv, stg, acc, L, lane);
        // S <- e^{G_L} S + K^T (gamma Delta)
        const float eL = sEG[L - 1];
#pragma unroll
        for (int n = 0; n < KP / 8; n++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                s[n][r] *= eL;
#pragma unroll
        for (int kj = 0; kj < 4; kj++) {
            const int j0 = 16 * kj + 2 * t4;
            float f[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                f[e] = sGM[j0 + (e & 1) + 8 * (e >> 1)];
            uint32_t a[4];
            acc_to_a_cols(a, acc[2 * kj], acc[2 * kj + 1], f);
#pragma unroll
            for (int xp = 0; xp < KP / 16; xp++) {
                uint32_t bb[4];
                ldb_kn(bb, sK, LDK, 16 * kj, 16 * xp, lane);
                mma_bf16(s[2 * xp], a, bb[0], bb[1]);
                mma_bf16(s[2 * xp + 1], a, bb[2], bb[3]);
            }
        }
    }
    if (state && write_final && wv)
#pragma unroll
        for (int n = 0; n < KP / 8; n++) {
            const int x = 8 * n + 2 * t4;
            if (x < K) {
                float *sp = state + ((int64_t)bh * Dv + v0 + gq) * K + x;
                *(float2 *)sp = make_float2(s[n][0], s[n][1]);
                *(float2 *)(sp + 8 * K) = make_float2(s[n][2], s[n][3]);
            }
        }
}

// Reverse state pass for (bh, value rows [vb0, vb0 + 16 NW)), dS = gradient of
// the state at the end of the current chunk:
//   dh[c] = dS; dDelta = P^T dO + gamma (K dS) (as dDelta^T = dO^T P + (dS^T K^T) gamma);
//   dS <- e^{G_L} dS + (scale e^G Q)^T dO - W^T dDelta.
// K, Q and W have one buffer each: K(c-1) is loaded once the K product of
// chunk c is done, Q/W(c-1) once chunk c's state update is done (cp.async
// groups in that order, so "all but the newest group" is always what is needed).
template <int KP, int NW>
static __device__ __forceinline__ void state_bwd(unsigned char *smem, const bf16 *k, const bf16 *q, const bf16 *W,
                                                 const bf16 *P, const bf16 *dO, const float *EG, const float *GM,
                                                 bf16 *dhst, bf16 *dDl, float *dstate0, const float *dstate_final,
                                                 float scale, int T, int H, int HV, int K, int Dv, int NT) {
    typedef state_cfg<KP, NW> C;
    constexpr int LDK = C::LDK, LDU = C::LDU, NTH = NW * 32;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / H);
    const int vb0 = blockIdx.x * C::BV, v0 = vb0 + 16 * warp;
    const bool wv = v0 < Dv;
    bf16 *sK = (bf16 *)(smem + C::R_K), *sQ = (bf16 *)(smem + C::R_Q), *sW = (bf16 *)(smem + C::R_W);
    bf16 *stg = (bf16 *)(smem + C::R_ST + 2 * C::R_STAGE) + warp * BT * 24;
    const bf16 *kb = k + ((int64_t)b * T * H + hq) * K, *qb = q + ((int64_t)b * T * H + hq) * K;
    const bf16 *Wb = W + (int64_t)bh * T * K, *Pb = P + (int64_t)bh * T * BT;
    const bf16 *dOb = dO + ((int64_t)b * T * HV + h) * Dv + vb0;
    const float *EGb = EG + (int64_t)bh * T, *GMb = GM + (int64_t)bh * T;

    float s[KP / 8][4]; // dS^T
#pragma unroll
    for (int n = 0; n < KP / 8; n++) {
        const int x = 8 * n + 2 * t4;
        const bool ok = dstate_final && wv && x < K;
        const float *sp = dstate_final + ((int64_t)bh * Dv + v0 + gq) * K + x;
        s[n][0] = ok ? sp[0] : 0.0f;
        s[n][1] = ok ? sp[1] : 0.0f;
        s[n][2] = ok ? sp[8 * K] : 0.0f;
        s[n][3] = ok ? sp[8 * K + 1] : 0.0f;
    }

    auto issue_k = [&](int c) { // K, and P, dO, G into stage c & 1
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        unsigned char *st = smem + C::R_ST + (c & 1) * C::R_STAGE;
        tile_async<BT, KP, NTH>(sK, LDK, kb + (int64_t)t0 * H * K, (int64_t)H * K, L, K, tid);
        tile_async<BT, BT, NTH>((bf16 *)st, LDT, Pb + (int64_t)t0 * BT, BT, L, BT, tid);
        tile_async<BT, C::BV, NTH>((bf16 *)(st + C::TP), LDU, dOb + (int64_t)t0 * HV * Dv, (int64_t)HV * Dv, L,
                                   Dv - vb0, tid);
        vec_async((float *)(st + C::TP + C::TU), EGb + t0, L, tid);
        vec_async((float *)(st + C::TP + C::TU) + BT, GMb + t0, L, tid);
    };
    auto issue_qw = [&](int c) {
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        tile_async<BT, KP, NTH>(sQ, LDK, qb + (int64_t)t0 * H * K, (int64_t)H * K, L, K, tid);
        tile_async<BT, KP, NTH>(sW, LDK, Wb + (int64_t)t0 * K, K, L, K, tid);
    };
    issue_k(NT - 1);
    cp_async_commit();
    issue_qw(NT - 1);
    cp_async_commit();
    for (int c = NT - 1; c >= 0; c--) {
        cp_async_wait<1>();
        __syncthreads(); // K, P, dO, G of chunk c visible; Q/W(c) may still be in flight
        const unsigned char *st = smem + C::R_ST + (c & 1) * C::R_STAGE;
        const bf16 *sP = (const bf16 *)st, *sdO = (const bf16 *)(st + C::TP);
        const float *sEG = (const float *)(st + C::TP + C::TU), *sGM = sEG + BT; // zero past L
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        bf16 *hp = dhst + (((int64_t)bh * NT + c) * Dv + v0 + gq) * K + 2 * t4; // dh[c] = dS, row v0 + gq

        // (K dS)^T: rows v, columns j; the bf16 A fragments of dS are dh[c]'s values
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[nt][r] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KP / 16; ks++) {
            uint32_t a[4];
            acc_to_a(a, s[2 * ks], s[2 * ks + 1], 1.0f);
            if (wv) store_a_rows(hp, a, 16 * ks, K);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_nk(bb, sK, LDK, 16 * ks, 16 * np, lane);
                mma_bf16(acc[2 * np], a, bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads(); // every warp is done with sK
        if (c > 0) issue_k(c - 1);
        cp_async_commit();

        const float eL = sEG[L - 1];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float gm = sGM[8 * nt + 2 * t4 + e];
                acc[nt][e] *= gm;
                acc[nt][2 + e] *= gm;
            }
            // + dO^T P
#pragma unroll
        for (int ki = 0; ki < 4; ki++) {
            uint32_t a[4];
            lda_km(a, sdO, LDU, 16 * warp, 16 * ki, lane);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_kn(bb, sP, LDT, 16 * ki, 16 * np, lane);
                mma_bf16(acc[2 * np], a, bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        if (wv) store_vt(dDl + ((int64_t)bh * T + t0) * Dv + v0, Dv, stg, acc, L, lane);

        cp_async_wait<1>();
        __syncthreads(); // Q/W(c) visible
#pragma unroll
        for (int n = 0; n < KP / 8; n++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                s[n][r] *= eL;
#pragma unroll
        for (int ki = 0; ki < 4; ki++) {
            // dO^T fragment (rows v, columns i) scaled by scale e^{G_i}
            uint32_t ao[4], ad[4];
            lda_km(ao, sdO, LDU, 16 * warp, 16 * ki, lane);
            const int i0 = 16 * ki + 2 * t4;
            float f[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                f[e] = scale * sEG[i0 + (e & 1) + 8 * (e >> 1)];
            ao[0] = gdn_pack_bf16(bf_lo(ao[0]) * f[0], bf_hi(ao[0]) * f[1]);
            ao[1] = gdn_pack_bf16(bf_lo(ao[1]) * f[0], bf_hi(ao[1]) * f[1]);
            ao[2] = gdn_pack_bf16(bf_lo(ao[2]) * f[2], bf_hi(ao[2]) * f[3]);
            ao[3] = gdn_pack_bf16(bf_lo(ao[3]) * f[2], bf_hi(ao[3]) * f[3]);
            acc_to_a(ad, acc[2 * ki], acc[2 * ki + 1], -1.0f);
#pragma unroll
            for (int xp = 0; xp < KP / 16; xp++) {
                uint32_t bq[4], bw[4];
                ldb_kn(bq, sQ, LDK, 16 * ki, 16 * xp, lane);
                ldb_kn(bw, sW, LDK, 16 * ki, 16 * xp, lane);
                mma_bf16(s[2 * xp], ao, bq[0], bq[1]);
                mma_bf16(s[2 * xp + 1], ao, bq[2], bq[3]);
                mma_bf16(s[2 * xp], ad, bw[0], bw[1]);
                mma_bf16(s[2 * xp + 1], ad, bw[2], bw[3]);
            }
        }
        __syncthreads(); // every warp is done with sQ, sW (and this stage)
        if (c > 0) issue_qw(c - 1);
        cp_async_commit();
    }
    if (dstate0 && wv)
#pragma unroll
        for (int n = 0; n < KP / 8; n++) {
            const int x = 8 * n + 2 * t4;
            if (x < K) {
                float *sp = dstate0 + ((int64_t)bh * Dv + v0 + gq) * K + x;
                *(float2 *)sp = make_float2(s[n][0], s[n][1]);
                *(float2 *)(sp + 8 * K) = make_float2(s[n][2], s[n][3]);
            }
        }
}

// Arguments of k_state (by value).
typedef struct {
    const bf16 *W, *U, *k, *q, *P, *dO;
    const float *EG, *GM; // e^G, gamma = e^{G_L - G} [bh][T]
    bf16 *hst, *Dl;       // forward pass: h, Delta
    float *state;         // initial state when init, final state when write_final (may be NULL)
    int init, write_final;
    bf16 *dhst, *dDl;          // reverse pass: dh, dDelta
    float *dstate0;            // NULL: not wanted
    const float *dstate_final; // NULL: zeros
    float scale;
    int rev_z; // blockIdx.z that runs the reverse pass (-1: none)
    int T, H, HV, K, Dv, NT;
} state_args;

template <int KP, int NW> __global__ void __launch_bounds__(NW * 32, 1) k_state(state_args a) {
    extern __shared__ __align__(128) unsigned char smem[];
    if ((int)blockIdx.z == a.rev_z)
        state_bwd<KP, NW>(smem, a.k, a.q, a.W, a.P, a.dO, a.EG, a.GM, a.dhst, a.dDl, a.dstate0, a.dstate_final, a.scale,
                          a.T, a.H, a.HV, a.K, a.Dv, a.NT);
    else
        state_fwd<KP, NW>(smem, a.W, a.U, a.k, a.EG, a.GM, a.hst, a.Dl, a.state, a.init, a.write_final, a.T, a.H, a.HV,
                          a.K, a.Dv, a.NT);
}

// ==== F3 / B2 and B4 on wgmma (the production state passes) ======================
//
// k_state_wg: k_state's passes with one warpgroup (4 warps) per (sequence, value
// head, 64 value rows), the state tile S^T [64 v][KP] (dS^T in the reverse pass)
// one wgmma accumulator: thread (warp w, g = lane/4, t = lane%4) holds rows
// 16 w + g, +8 and columns 8 n + 2 t, +1, the elements the k_state warp w held.
// wgmma reads each B operand once per 64 rows where each mma.sync warp read it
// for 16: a quarter of k_state's shared-memory operand traffic per chunk step.
// Per chunk:
//  forward: S^T -> bf16 -> sS (stmatrix; 128B-swizzled K-major panels): the A
//    operand of (W S)^T = S^T W^T (m64n64k16, A and B from shared memory) and the
//    source of h[c]'s tensor store. Delta^T = U^T - (W S)^T with U^T's fragments by
//    ldmatrix.trans; Delta -> sD (stmatrix.trans) -> tensor store. S^T <- e^{G_L}
//    S^T + (Delta diag(gamma))^T K: A in registers, B the K tile read N-major, one
//    m64nKPk16 per 16 tokens.
//  reverse: dS^T -> sS -> dh[c]; (K dS)^T = dS^T K^T (both from shared memory);
//    times gamma; + dO^T P (A = the dO tile read M-major, B = P N-major); dDelta ->
//    sD -> store; dS^T <- e^{G_L} dS^T + (dO diag(scale e^G))^T Q - dDelta^T W
//    (A in registers, Q and W N-major), in k_state's order.
// The bf16 rounding points are k_state's (h, Delta, Delta gamma, dh, dDelta, the
// scaled dO, -dDelta), so the two agree up to the fp32 summation order inside
// the tensor cores. Tiles come by the tensor copy engine (thread 0 issues them
// and the h / Delta stores), one chunk ahead; rows past T and columns past K or
// Dv arrive as zeros and are not stored. Forward: {W, K, U} double-buffered;
// reverse: {Q, W, P, dO} double-buffered, K single (chunk c-1's is loaded once
// chunk c's products with K are done: shared memory holds no second K at K 256).
// e^G and gamma by 4-byte cp.async (zero past L).

template <int KP> struct wgs_cfg {
    static constexpr int NPAN = KP / 64;  // 64-column panels of a [64][KP] tile
    static constexpr int PAN = BT * 128;  // one [64 rows][64] bf16 panel (8 KB)
    static constexpr int TK = NPAN * PAN; // a [64][KP] tile
    static constexpr int VEC = 1024;      // e^G, gamma [64] fp32 (the rest keeps 1 KB alignment)
    // forward: two stages {W, K, U, vectors}, then sS, sD, 2 barriers
    static constexpr int F_W = 0, F_K = TK, F_U = 2 * TK, F_V = 2 * TK + PAN, F_STAGE = F_V + VEC;
    static constexpr int F_S = 2 * F_STAGE, F_D = F_S + TK, F_BAR = F_D + PAN;
    // reverse: two stages {Q, W, P (later sD), dO}, then K, sS, the vectors of both stages, 3 barriers
    static constexpr int R_Q = 0, R_W = TK, R_P = 2 * TK, R_O = 2 * TK + PAN, R_STAGE = 2 * TK + 2 * PAN;
    static constexpr int R_K = 2 * R_STAGE, R_S = R_K + TK, R_V = R_S + TK, R_BAR = R_V + 4 * BT * 4;
    // 1 KB of slack aligns the base (the swizzle pattern repeats every 1024 bytes)
    static constexpr int SMEM = 1024 + (F_BAR > R_BAR ? F_BAR : R_BAR) + 64;
};

// Tensor maps (bf16, boxes of 64 x 64 in the 128-byte swizzle): loads of W, U, P,
// k, q, dO; stores of h, dh, Delta, dDelta. Those a pass does not use stay zero.
typedef struct {
    CUtensorMap w, u, p, k, q, dout, h, dh, dl, ddl;
} wgs_maps;

// Per-lane row / chunk of the ldmatrix and stmatrix x4 addresses. Matrix i of
// x4 takes its row addresses from lanes 8 i.., and matrices 1, 3 (lm = 1) are
// the +8 rows along M (value rows v), 2, 3 (lk = 1) the +8 along the k side.
//   S^T [v][x] in sS (not transposed): row v = 16 w + 8 lm + lr, chunk 2 (ks % 4) + lk.
//   [j][v] tiles (U, dO, sD; transposed): row j = 16 kk + 8 lk + lr, chunk 2 w + lm.
struct wgs_lane {
    int lr, lm, lk;
    __device__ wgs_lane(int lane) : lr(lane & 7), lm((lane >> 3) & 1), lk(lane >> 4) {}
};

// h[c] (or dh[c]) = the state: S^T to bf16 into sS, the A fragment of k-step ks
// (n-tiles 2 ks, 2 ks + 1 of the accumulator) by one stmatrix.
template <int KP>
static __device__ __forceinline__ void wgs_put_state(uint32_t sS, const float (&s)[KP / 2], int warp, wgs_lane l) {
#pragma unroll
    for (int ks = 0; ks < KP / 16; ks++) {
        const uint32_t r[4] = {gdn_pack_bf16(s[8 * ks], s[8 * ks + 1]), gdn_pack_bf16(s[8 * ks + 2], s[8 * ks + 3]),
                               gdn_pack_bf16(s[8 * ks + 4], s[8 * ks + 5]),
                               gdn_pack_bf16(s[8 * ks + 6], s[8 * ks + 7])};
        stsm_x4(sS + (ks >> 2) * wgs_cfg<KP>::PAN + wgmma_swz(16 * warp + 8 * l.lm + l.lr, 2 * (ks & 3) + l.lk), r);
    }
}

// acc = S^T B^T over the KP columns: A = sS, B = a [64 j][KP] tile (W or K), both K-major.
template <int KP>
static __device__ __forceinline__ void wgs_state_x_tile(float (&acc)[32], uint32_t sS, uint32_t tile) {
#pragma unroll
    for (int i = 0; i < 32; i++)
        acc[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KP / 16; ks++) {
        const uint32_t off = (ks >> 2) * wgs_cfg<KP>::PAN + (ks & 3) * 32;
        wgmma_ss_n64<0, 0>(acc, wgmma_desc(sS + off, 16, 1024), wgmma_desc(tile + off, 16, 1024), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(acc);
}

// A [64 v][64 j] accumulator (Delta^T or dDelta^T) to bf16 into sD as [j][v]
// (stmatrix.trans: fragment row v -> column), fenced for the tensor store.
static __device__ __forceinline__ void wgs_put_vt(uint32_t sD, const float (&acc)[32], int warp, wgs_lane l) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t r[4] = {
            gdn_pack_bf16(acc[8 * kk], acc[8 * kk + 1]), gdn_pack_bf16(acc[8 * kk + 2], acc[8 * kk + 3]),
            gdn_pack_bf16(acc[8 * kk + 4], acc[8 * kk + 5]), gdn_pack_bf16(acc[8 * kk + 6], acc[8 * kk + 7])};
        stsm_x4_t(sD + wgmma_swz(16 * kk + 8 * l.lk + l.lr, 2 * warp + l.lm), r);
    }
    fence_proxy_async();
}

// Final state rows (fp32) of this thread from its accumulator: the row and
// column indices are recomputed from an opaque copy of the lane, so the
// compiler does not keep the prologue's copies of them alive through the chunk
// loop (32 registers at KP 256).
template <int KP>
static __device__ __forceinline__ void wgs_store_state(float *dst, const float (&s)[KP / 2], int bh, int vb0, int K,
                                                       int Dv) {
    int lane = threadIdx.x;
    asm volatile("and.b32 %0, %0, 31;" : "+r"(lane));
    const int warp = threadIdx.x >> 5, gq = lane >> 2, t4 = lane & 3;
    if (vb0 + 16 * warp >= Dv) return;
#pragma unroll
    for (int n = 0; n < KP / 8; n++) {
        const int x = 8 * n + 2 * t4;
        if (x < K) {
            float *sp = dst + ((int64_t)bh * Dv + vb0 + 16 * warp + gq) * K + x;
            *(float2 *)sp = make_float2(s[4 * n], s[4 * n + 1]);
            *(float2 *)(sp + 8 * K) = make_float2(s[4 * n + 2], s[4 * n + 3]);
        }
    }
}

// Forward pass (see above) for (bh = blockIdx.y, value rows blockIdx.x * 64..).
template <int KP>
static __device__ __forceinline__ void wgs_fwd(uint32_t base, unsigned char *gbase, const wgs_maps &m,
                                               const state_args &a) {
    typedef wgs_cfg<KP> C;
    const int T = a.T, HV = a.HV, K = a.K, Dv = a.Dv, NT = a.NT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / a.H);
    const int vb0 = blockIdx.x * 64;
    const bool wv = vb0 + 16 * warp < Dv; // the warp's 16 rows exist (Dv % 16 == 0)
    const wgs_lane l(lane);
    const uint32_t sS = base + C::F_S, sD = base + C::F_D, bar = base + C::F_BAR; // bar + 8 s: stage s full
    const float *EGb = a.EG + (int64_t)bh * T, *GMb = a.GM + (int64_t)bh * T;

    float s[KP / 2]; // S^T: s[4 n + e] = S^T[16 w + g + 8 (e >> 1)][8 n + 2 t + (e & 1)]
#pragma unroll
    for (int n = 0; n < KP / 8; n++) {
        const int x = 8 * n + 2 * t4;
        const bool ok = a.state && a.init && wv && x < K;
        const float *sp = a.state + ((int64_t)bh * Dv + vb0 + 16 * warp + gq) * K + x;
        s[4 * n + 0] = ok ? sp[0] : 0.0f;
        s[4 * n + 1] = ok ? sp[1] : 0.0f;
        s[4 * n + 2] = ok ? sp[8 * K] : 0.0f;
        s[4 * n + 3] = ok ? sp[8 * K + 1] : 0.0f;
    }

    auto issue = [&](int c) { // thread 0: W, K, U tiles of chunk c into stage c & 1
        const uint32_t st = base + (c & 1) * C::F_STAGE, fb = bar + 8 * (c & 1);
        const int t0 = c * BT;
        mbar_arrive_expect_tx(fb, 2 * C::TK + C::PAN);
#pragma unroll
        for (int p = 0; p < C::NPAN; p++) {
            tensor_g2s_3d(st + C::F_W + p * C::PAN, &m.w, 64 * p, t0, bh, fb);
            tma_load_4d(st + C::F_K + p * C::PAN, &m.k, 64 * p, hq, t0, b, fb);
        }
        tensor_g2s_3d(st + C::F_U, &m.u, vb0, t0, bh, fb);
    };
    auto issue_vec = [&](int c) { // e^G, gamma of chunk c into stage c & 1 (zero past L): one cp.async group
        float *v = (float *)(gbase + (c & 1) * C::F_STAGE + C::F_V);
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        vec_async(v, EGb + t0, L, tid);
        vec_async(v + BT, GMb + t0, L, tid);
        cp_async_commit();
    };
    if (tid == 0) {
        mbar_init(bar, 1);
        mbar_init(bar + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    issue_vec(0);
    __syncthreads();
    if (tid == 0) issue(0);

    for (int c = 0; c < NT; c++) {
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        const uint32_t st = base + (c & 1) * C::F_STAGE;
        const float *sEG = (const float *)(gbase + (c & 1) * C::F_STAGE + C::F_V), *sGM = sEG + BT;
        cp_async_wait<0>();
        if (tid == 0) tma_store_wait_read<0>(); // chunk c-1's h and Delta stores have read sS, sD
        __syncthreads(); // chunk c-1 is done everywhere: its stage, sS, sD are free; chunk c's vectors visible
        if (c + 1 < NT) {
            if (tid == 0) issue(c + 1);
            issue_vec(c + 1);
        }
        // h[c] = S (bf16), also the A operand of W S
        wgs_put_state<KP>(sS, s, warp, l);
        fence_proxy_async();
        __syncthreads(); // sS complete
        if (tid == 0) {
#pragma unroll
            for (int p = 0; p < C::NPAN; p++)
                tma_store_3d(&m.h, 64 * p, vb0, bh * NT + c, sS + p * C::PAN);
            tma_store_commit();
        }
        mbar_wait(bar + 8 * (c & 1), (c >> 1) & 1); // W, K, U of chunk c

        // (W S)^T: rows v, columns j
        float acc[32];
        wgs_state_x_tile<KP>(acc, sS, st + C::F_W);
        // Delta^T = U^T - (W S)^T: ldmatrix.trans of U [j][v] gives U^T's A fragment
        // of k-step kk, i.e. the bf16 pairs of n-tiles 2 kk, 2 kk + 1
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t u[4];
            ldsm_x4_t(u, st + C::F_U + wgmma_swz(16 * kk + 8 * l.lk + l.lr, 2 * warp + l.lm));
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc[8 * kk + 2 * i] = bf_lo(u[i]) - acc[8 * kk + 2 * i];
                acc[8 * kk + 2 * i + 1] = bf_hi(u[i]) - acc[8 * kk + 2 * i + 1];
            }
        }
        wgs_put_vt(sD, acc, warp, l); // Delta -> sD, stored below
        // S^T <- e^{G_L} S^T + (Delta diag(gamma))^T K; A of k-step kk (tokens 16 kk..):
        // bf16(Delta gamma_j), as k_state's acc_to_a_cols
        const float eL = sEG[L - 1];
        uint32_t ad[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const int j0 = 16 * kk + 2 * t4;
            const float f0 = sGM[j0], f1 = sGM[j0 + 1], f2 = sGM[j0 + 8], f3 = sGM[j0 + 9];
            ad[kk][0] = gdn_pack_bf16(acc[8 * kk] * f0, acc[8 * kk + 1] * f1);
            ad[kk][1] = gdn_pack_bf16(acc[8 * kk + 2] * f0, acc[8 * kk + 3] * f1);
            ad[kk][2] = gdn_pack_bf16(acc[8 * kk + 4] * f2, acc[8 * kk + 5] * f3);
            ad[kk][3] = gdn_pack_bf16(acc[8 * kk + 6] * f2, acc[8 * kk + 7] * f3);
        }
#pragma unroll
        for (int i = 0; i < KP / 2; i++)
            s[i] *= eL;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) // K [j][x] N-major: 16 tokens = two 8-row groups a step
            wgmma_rs_tb<KP>(s, ad[kk], wgmma_desc(st + C::F_K + kk * 2048, C::PAN, 1024));
        wgmma_commit();
        __syncthreads(); // sD complete (each warp fenced its part)
        if (tid == 0) {
            tma_store_3d(&m.dl, vb0, t0, bh, sD);
            tma_store_commit();
        }
        wgmma_wait<0>();
        wgmma_pin(s);
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_keep(ad[kk]);
    }
    if (a.state && a.write_final) wgs_store_state<KP>(a.state, s, bh, vb0, K, Dv);
    if (tid == 0) tma_store_wait<0>();
}

// Reverse pass (see above) for (bh = blockIdx.y, value rows blockIdx.x * 64..).
// Buffers: {Q, W, P, dO} of chunk c-1 load into the other stage while chunk c
// runs; K has one buffer, reloaded for chunk c-1 once chunk c's K dS and dO^T P
// are done (a chunk step ahead of its use too); sD is the current stage's P slot
// (P's last reader, the dO^T P product, is done by then), so that all fits 227 KB.
template <int KP>
static __device__ __forceinline__ void wgs_bwd(uint32_t base, unsigned char *gbase, const wgs_maps &m,
                                               const state_args &a) {
    typedef wgs_cfg<KP> C;
    const int T = a.T, HV = a.HV, K = a.K, Dv = a.Dv, NT = a.NT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / a.H);
    const int vb0 = blockIdx.x * 64;
    const bool wv = vb0 + 16 * warp < Dv;
    const wgs_lane l(lane);
    const uint32_t sK = base + C::R_K, sS = base + C::R_S;
    const uint32_t bar = base + C::R_BAR, bar_k = bar + 16; // bar + 8 s: stage s full; bar_k: K full
    const float *EGb = a.EG + (int64_t)bh * T, *GMb = a.GM + (int64_t)bh * T;

    float s[KP / 2]; // dS^T, laid out as S^T in wgs_fwd
#pragma unroll
    for (int n = 0; n < KP / 8; n++) {
        const int x = 8 * n + 2 * t4;
        const bool ok = a.dstate_final && wv && x < K;
        const float *sp = a.dstate_final + ((int64_t)bh * Dv + vb0 + 16 * warp + gq) * K + x;
        s[4 * n + 0] = ok ? sp[0] : 0.0f;
        s[4 * n + 1] = ok ? sp[1] : 0.0f;
        s[4 * n + 2] = ok ? sp[8 * K] : 0.0f;
        s[4 * n + 3] = ok ? sp[8 * K + 1] : 0.0f;
    }

    auto issue = [&](int c) { // thread 0: Q, W, P, dO tiles of chunk c into stage c & 1
        const uint32_t st = base + (c & 1) * C::R_STAGE, fb = bar + 8 * (c & 1);
        const int t0 = c * BT;
        mbar_arrive_expect_tx(fb, 2 * C::TK + 2 * C::PAN);
#pragma unroll
        for (int p = 0; p < C::NPAN; p++) {
            tma_load_4d(st + C::R_Q + p * C::PAN, &m.q, 64 * p, hq, t0, b, fb);
            tensor_g2s_3d(st + C::R_W + p * C::PAN, &m.w, 64 * p, t0, bh, fb);
        }
        tensor_g2s_3d(st + C::R_P, &m.p, 0, t0, bh, fb);
        tma_load_4d(st + C::R_O, &m.dout, vb0, h, t0, b, fb);
    };
    auto issue_k = [&](int c) { // thread 0: the K tile of chunk c (one buffer)
        mbar_arrive_expect_tx(bar_k, C::TK);
#pragma unroll
        for (int p = 0; p < C::NPAN; p++)
            tma_load_4d(sK + p * C::PAN, &m.k, 64 * p, hq, c * BT, b, bar_k);
    };
    auto issue_vec = [&](int c) {
        float *v = (float *)(gbase + C::R_V + (c & 1) * 2 * BT * 4);
        const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        vec_async(v, EGb + t0, L, tid);
        vec_async(v + BT, GMb + t0, L, tid);
        cp_async_commit();
    };
    if (tid == 0) {
        mbar_init(bar, 1);
        mbar_init(bar + 8, 1);
        mbar_init(bar_k, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    issue_vec(NT - 1);
    __syncthreads();
    if (tid == 0) {
        issue_k(NT - 1);
        issue(NT - 1);
    }

    // iteration it takes chunk c = NT-1-it: stage c & 1 in its (it >> 1)-th use, K in its it-th
    for (int it = 0; it < NT; it++) {
        const int c = NT - 1 - it, t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
        const uint32_t st = base + (c & 1) * C::R_STAGE, sD = st + C::R_P;
        const float *sEG = (const float *)(gbase + C::R_V + (c & 1) * 2 * BT * 4), *sGM = sEG + BT;
        cp_async_wait<0>();
        if (tid == 0) tma_store_wait_read<0>(); // chunk c+1's dh and dDelta stores have read sS and its sD
        __syncthreads(); // chunk c+1 is done everywhere: its stage and sS are free; chunk c's vectors visible
        if (c > 0) {
            if (tid == 0) issue(c - 1);
            issue_vec(c - 1);
        }
        // dh[c] = dS (bf16), also the A operand of K dS
        wgs_put_state<KP>(sS, s, warp, l);
        fence_proxy_async();
        __syncthreads(); // sS complete
        if (tid == 0) {
#pragma unroll
            for (int p = 0; p < C::NPAN; p++)
                tma_store_3d(&m.dh, 64 * p, vb0, bh * NT + c, sS + p * C::PAN);
            tma_store_commit();
        }
        mbar_wait(bar_k, it & 1); // K of chunk c

        // dDelta^T = (dS^T K^T) diag(gamma) + dO^T P
        float acc[32];
        wgs_state_x_tile<KP>(acc, sS, sK);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float gm = sGM[8 * n + 2 * t4 + e];
                acc[4 * n + e] *= gm;
                acc[4 * n + 2 + e] *= gm;
            }
        mbar_wait(bar + 8 * (c & 1), (it >> 1) & 1); // Q, W, P, dO of chunk c
        wgmma_fence();
#pragma unroll
        for (int ki = 0; ki < 4; ki++) // A = dO^T (dO [i][v]: M-major), B = P [i][j] (N-major); 16 tokens i a step
            wgmma_ss_n64<1, 1>(acc, wgmma_desc(st + C::R_O + ki * 2048, C::PAN, 1024),
                               wgmma_desc(st + C::R_P + ki * 2048, C::PAN, 1024), 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(acc);
        __syncthreads(); // every warp is done with K and P (sD overwrites P)
        if (tid == 0 && c > 0) issue_k(c - 1);
        wgs_put_vt(sD, acc, warp, l); // dDelta -> sD, stored below

        // dS^T <- e^{G_L} dS^T + (dO diag(scale e^G))^T Q - dDelta^T W. A fragments of
        // k-step ki (tokens 16 ki..): ao = bf16(bf16(dO)^T scale e^{G_i}) by ldmatrix.trans
        // of dO [i][v], ad = bf16(-dDelta^T), as k_state
        uint32_t ao[4][4], ad[4][4];
#pragma unroll
        for (int ki = 0; ki < 4; ki++) {
            ldsm_x4_t(ao[ki], st + C::R_O + wgmma_swz(16 * ki + 8 * l.lk + l.lr, 2 * warp + l.lm));
            const int i0 = 16 * ki + 2 * t4;
            const float f0 = a.scale * sEG[i0], f1 = a.scale * sEG[i0 + 1], f2 = a.scale * sEG[i0 + 8],
                        f3 = a.scale * sEG[i0 + 9];
            ao[ki][0] = gdn_pack_bf16(bf_lo(ao[ki][0]) * f0, bf_hi(ao[ki][0]) * f1);
            ao[ki][1] = gdn_pack_bf16(bf_lo(ao[ki][1]) * f0, bf_hi(ao[ki][1]) * f1);
            ao[ki][2] = gdn_pack_bf16(bf_lo(ao[ki][2]) * f2, bf_hi(ao[ki][2]) * f3);
            ao[ki][3] = gdn_pack_bf16(bf_lo(ao[ki][3]) * f2, bf_hi(ao[ki][3]) * f3);
#pragma unroll
            for (int i = 0; i < 4; i++)
                ad[ki][i] = gdn_pack_bf16(-acc[8 * ki + 2 * i], -acc[8 * ki + 2 * i + 1]);
        }
        const float eL = sEG[L - 1];
#pragma unroll
        for (int i = 0; i < KP / 2; i++)
            s[i] *= eL;
        wgmma_fence();
#pragma unroll
        for (int ki = 0; ki < 4; ki++) {
            wgmma_rs_tb<KP>(s, ao[ki], wgmma_desc(st + C::R_Q + ki * 2048, C::PAN, 1024));
            wgmma_rs_tb<KP>(s, ad[ki], wgmma_desc(st + C::R_W + ki * 2048, C::PAN, 1024));
        }
        wgmma_commit();
        __syncthreads(); // sD complete (each warp fenced its part)
        if (tid == 0) {
            tma_store_3d(&m.ddl, vb0, t0, bh, sD);
            tma_store_commit();
        }
        wgmma_wait<0>();
        wgmma_pin(s);
#pragma unroll
        for (int ki = 0; ki < 4; ki++)
            wgmma_keep(ao[ki]), wgmma_keep(ad[ki]);
    }
    if (a.dstate0) wgs_store_state<KP>(a.dstate0, s, bh, vb0, K, Dv);
    if (tid == 0) tma_store_wait<0>();
}

// Grid (ceil(Dv / 64), B*HV, passes) as k_state's; 128 threads (one warpgroup).
template <int KP>
__global__ void __launch_bounds__(128, 1) k_state_wg(const __grid_constant__ wgs_maps m, const state_args a) {
    extern __shared__ __align__(1024) unsigned char wgs_smem[];
    const uint32_t raw = smem_u32(wgs_smem), base = (raw + 1023u) & ~1023u;
    unsigned char *gbase = wgs_smem + (base - raw); // the same address, generic
    if ((int)blockIdx.z == a.rev_z)
        wgs_bwd<KP>(base, gbase, m, a);
    else
        wgs_fwd<KP>(base, gbase, m, a);
}

// ==== F4: outputs ================================================================

template <int KP> struct out_cfg {
    static constexpr int LDK = KP + 8, TK = BT * LDK * 2, TP = BT * LDT * 2;
    static constexpr int Q_OFF = 0, P_OFF = TK, G_OFF = TK + TP, ST_OFF = G_OFF + BT * 4;
    static constexpr int STAGE = TK + TP; // h tile [64 v][KP+8], Delta tile [64][LDT]
    static constexpr int SMEM = ST_OFF + 2 * STAGE;
};

// Grid (NT, B*HV), 256 threads: warp w owns rows 16 (w & 3).. and value
// columns 32 (w >> 2).. of each 64-wide Dv tile.
//   o_i = scale e^{G_i} (q_i . h[c]) + sum_{j <= i} P_ij Delta_j
template <int KP>
__global__ void __launch_bounds__(256)
    k_out(bf16 *o, const bf16 *q, const bf16 *hst, const bf16 *Dl, const bf16 *P, const float *Gs, float scale, int T,
          int H, int HV, int K, int Dv, int NT) {
    typedef out_cfg<KP> C;
    constexpr int LDK = C::LDK;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)(smem + C::Q_OFF), *sP = (bf16 *)(smem + C::P_OFF);
    float *sG = (float *)(smem + C::G_OFF);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int mi = warp & 3, vh = warp >> 2;
    const int c = blockIdx.x, bh = blockIdx.y, b = bh / HV, h = bh - b * HV, hq = h / (HV / H);
    const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
    const int64_t row0 = (int64_t)b * T + t0;
    const bf16 *hb = hst + ((int64_t)bh * NT + c) * Dv * K, *Db = Dl + ((int64_t)bh * T + t0) * Dv;
    tile_async<BT, KP, 256>(sQ, LDK, q + (row0 * H + hq) * K, (int64_t)H * K, L, K, tid);
    tile_async<BT, BT, 256>(sP, LDT, P + ((int64_t)bh * T + t0) * BT, BT, L, BT, tid);
    vec_async(sG, Gs + (int64_t)bh * T + t0, L, tid);
    const int nvt = (Dv + 63) / 64;
    auto issue = [&](int vt) {
        unsigned char *st = smem + C::ST_OFF + (vt & 1) * C::STAGE;
        tile_async<BT, KP, 256>((bf16 *)st, LDK, hb + (int64_t)64 * vt * K, K, Dv - 64 * vt, K, tid);
        tile_async<BT, BT, 256>((bf16 *)(st + C::TK), LDT, Db + 64 * vt, Dv, L, Dv - 64 * vt, tid);
        cp_async_commit();
    };
    issue(0);
    uint32_t qf[KP / 16][4], pf[4][4];
    float eg[2];
    for (int vt = 0; vt < nvt; vt++) {
        cp_async_wait<0>();
        __syncthreads();
        if (vt + 1 < nvt) issue(vt + 1);
        if (vt == 0) {
#pragma unroll
            for (int ks = 0; ks < KP / 16; ks++)
                lda_mk(qf[ks], sQ, LDK, 16 * mi, 16 * ks, lane);
#pragma unroll
            for (int kk2 = 0; kk2 < 4; kk2++)
                lda_mk(pf[kk2], sP, LDT, 16 * mi, 16 * kk2, lane);
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * mi + gq + 8 * hr;
                eg[hr] = i < L ? scale * expf(sG[i]) : 0.0f;
            }
        }
        const unsigned char *st = smem + C::ST_OFF + (vt & 1) * C::STAGE;
        const bf16 *sH = (const bf16 *)st, *sD = (const bf16 *)(st + C::TK);
        float acc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[nt][r] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KP / 16; ks++)
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t bb[4];
                ldb_nk(bb, sH, LDK, 16 * ks, 32 * vh + 16 * np, lane); // B[x][v] = h[v][x]
                mma_bf16(acc[2 * np], qf[ks], bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], qf[ks], bb[2], bb[3]);
            }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[nt][r] *= eg[r >> 1];
#pragma unroll
        for (int kk2 = 0; kk2 < 4; kk2++)
#pragma unroll
            for (int np = 0; np < 2; np++) {
                uint32_t bb[4];
                ldb_kn(bb, sD, LDT, 16 * kk2, 32 * vh + 16 * np, lane);
                mma_bf16(acc[2 * np], pf[kk2], bb[0], bb[1]);
                mma_bf16(acc[2 * np + 1], pf[kk2], bb[2], bb[3]);
            }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * mi + gq + 8 * hr, col = 64 * vt + 32 * vh + 8 * nt + 2 * t4;
                if (i < L && col < Dv)
                    *(uint32_t *)(o + ((row0 + i) * HV + h) * Dv + col) =
                        gdn_pack_bf16(acc[nt][2 * hr], acc[nt][2 * hr + 1]);
            }
    }
}

// ==== B5: dq, dk (output and state paths), dW, dG partials ==================================

enum {
    DQ_T = BT * LDT * 2, // one [64][LDT] bf16 tile
    DQ_Q = 0,            // q, k slices
    DQ_K = DQ_T,
    DQ_H = 2 * DQ_T,             // per Dv tile: h, dh, Delta, dO, dDelta
    DQ_DS = 7 * DQ_T,            // ds [64][LDT]
    DQ_G = 8 * DQ_T,             // G [64], block reduction [8]
    DQ_ACC = DQ_G + BT * 4 + 64, // GVA accumulators dq, dk fp32 [64][LDF] each
    DQ_SMEM = DQ_ACC,
    DQ_SMEM_GVA = DQ_ACC + 2 * BT * LDF * 4
};

// Grid (ceil(K/64), NT, B*H), 128 threads: columns x in [64 xb, 64 xb + 64) of
// chunk c for q/k head hq, looping over its value heads h. Warp w owns token
// rows 16w.. of every product.
//   dq_i = scale e^{G_i} (S dO_i) + sum_{j <= i} ds_ij k_j, ds_ij = scale Gamma_ij (dO_i . Delta_j)
//   dk_j = gamma_j (dS' Delta_j) + sum_{i >= j} ds_ij q_i
//   dW_i = -S dDelta_i
//   dG_i = q_i . dq_i - k_i . dk_i; last row += e^{G_L} <S, dS'> + sum_j k_j . dk_j^state
// (S = h[c], dS' = dh[c]; every sum over x restricted to this block's columns.)
__global__ void __launch_bounds__(128)
    k_dqkw(const bf16 *q, const bf16 *k, const bf16 *hst, const bf16 *dhst, const bf16 *Dl, const bf16 *dO,
           const bf16 *dDl, const float *Gs, bf16 *dq, float *dk5, bf16 *dWo, float *dGp, float scale, int T, int H,
           int HV, int K, int Dv, int NT) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = (bf16 *)(smem + DQ_Q), *sK = (bf16 *)(smem + DQ_K);
    bf16 *sH = (bf16 *)(smem + DQ_H), *sdH = sH + BT * LDT, *sDel = sdH + BT * LDT, *sdO = sDel + BT * LDT,
         *sdD = sdO + BT * LDT, *sDs = (bf16 *)(smem + DQ_DS);
    float *sG = (float *)(smem + DQ_G), *sRed = sG + BT;
    float *sAq = (float *)(smem + DQ_ACC), *sAk = sAq + BT * LDF;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int xb = blockIdx.x, c = blockIdx.y, bq = blockIdx.z, b = bq / H, hq = bq - b * H, grp = HV / H;
    const int x0 = 64 * xb, t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
    const int64_t row0 = (int64_t)b * T + t0;
    const int nvt = (Dv + 63) / 64;
    const int64_t BHV = (int64_t)(gridDim.z / H) * HV;
    tile_async<BT, 64, 128>(sQ, LDT, q + (row0 * H + hq) * K + x0, (int64_t)H * K, L, K - x0, tid);
    tile_async<BT, 64, 128>(sK, LDT, k + (row0 * H + hq) * K + x0, (int64_t)H * K, L, K - x0, tid);
    cp_async_commit();

    for (int hi = 0; hi < grp; hi++) {
        const int h = hq * grp + hi, bh = b * HV + h;
        if (tid < BT) sG[tid] = tid < L ? Gs[(int64_t)bh * T + t0 + tid] : 0.0f;
        float aq[8][4], aw[8][4], ak[8][4], as[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                aq[nt][r] = aw[nt][r] = ak[nt][r] = as[nt][r] = 0.0f;
        float sdot = 0.0f; // partial <S, dS'>
        const bf16 *hb = hst + ((int64_t)bh * NT + c) * Dv * K + x0, *dhb = dhst + ((int64_t)bh * NT + c) * Dv * K + x0;
        for (int vt = 0; vt < nvt; vt++) {
            const int vc = 64 * vt, nv = Dv - vc;
            tile_async<BT, 64, 128>(sH, LDT, hb + (int64_t)vc * K, K, nv, K - x0, tid);
            tile_async<BT, 64, 128>(sdH, LDT, dhb + (int64_t)vc * K, K, nv, K - x0, tid);
            tile_async<BT, 64, 128>(sDel, LDT, Dl + ((int64_t)bh * T + t0) * Dv + vc, Dv, L, nv, tid);
            tile_async<BT, 64, 128>(sdO, LDT, dO + (row0 * HV + h) * Dv + vc, (int64_t)HV * Dv, L, nv, tid);
            tile_async<BT, 64, 128>(sdD, LDT, dDl + ((int64_t)bh * T + t0) * Dv + vc, Dv, L, nv, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            for (int e = tid; e < BT * 32; e += 128) {
                const int r = e >> 5, cc = 2 * (e & 31);
                const uint32_t u = *(const uint32_t *)(sH + r * LDT + cc), w = *(const uint32_t *)(sdH + r * LDT + cc);
                sdot += bf_lo(u) * bf_lo(w) + bf_hi(u) * bf_hi(w);
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t ado[4], add[4], adl[4];
                lda_mk(ado, sdO, LDT, 16 * warp, 16 * ks, lane);
                lda_mk(add, sdD, LDT, 16 * warp, 16 * ks, lane);
                lda_mk(adl, sDel, LDT, 16 * warp, 16 * ks, lane);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_kn(bb, sH, LDT, 16 * ks, 16 * np, lane); // B[v][x] = h[v][x]
                    mma_bf16(aq[2 * np], ado, bb[0], bb[1]);
                    mma_bf16(aq[2 * np + 1], ado, bb[2], bb[3]);
                    mma_bf16(aw[2 * np], add, bb[0], bb[1]);
                    mma_bf16(aw[2 * np + 1], add, bb[2], bb[3]);
                    ldb_kn(bb, sdH, LDT, 16 * ks, 16 * np, lane);
                    mma_bf16(ak[2 * np], adl, bb[0], bb[1]);
                    mma_bf16(ak[2 * np + 1], adl, bb[2], bb[3]);
                    ldb_nk(bb, sDel, LDT, 16 * ks, 16 * np, lane); // B[v][j] = Delta[j][v]
                    mma_bf16(as[2 * np], ado, bb[0], bb[1]);
                    mma_bf16(as[2 * np + 1], ado, bb[2], bb[3]);
                }
            }
            __syncthreads();
        }
        const float gl = sG[L - 1], eL = expf(gl);
        // dq = scale e^{G_i} (S dO) + ds K; ds masked (j <= i < L), rounded to bf16 as A fragments
        float gi[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int i = 16 * warp + gq + 8 * hr;
            gi[hr] = sG[i];
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const float f = i < L ? scale * expf(gi[hr]) : 0.0f;
                aq[nt][2 * hr] *= f;
                aq[nt][2 * hr + 1] *= f;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 8 * nt + 2 * t4 + e;
                    as[nt][2 * hr + e] = (j <= i && i < L) ? scale * expf(gi[hr] - sG[j]) * as[nt][2 * hr + e] : 0.0f;
                }
            }
        }
#pragma unroll
        for (int kj = 0; kj < 4; kj++) {
            uint32_t a[4];
            acc_to_a(a, as[2 * kj], as[2 * kj + 1], 1.0f);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_kn(bb, sK, LDT, 16 * kj, 16 * np, lane);
                mma_bf16(aq[2 * np], a, bb[0], bb[1]);
                mma_bf16(aq[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        // ds -> shared (bf16) for ds^T Q
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++)
                *(uint32_t *)(sDs + (16 * warp + gq + 8 * hr) * LDT + 8 * nt + 2 * t4) =
                    gdn_pack_bf16(as[nt][2 * hr], as[nt][2 * hr + 1]);
        // dk state part: gamma_j (dS' Delta_j); its k . dk^state for the last row
        float kstate = 0.0f;
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int j = 16 * warp + gq + 8 * hr;
            const float gm = j < L ? expf(gl - gi[hr]) : 0.0f;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                ak[nt][2 * hr] *= gm;
                ak[nt][2 * hr + 1] *= gm;
                const uint32_t kv = *(const uint32_t *)(sK + j * LDT + 8 * nt + 2 * t4);
                kstate += bf_lo(kv) * ak[nt][2 * hr] + bf_hi(kv) * ak[nt][2 * hr + 1];
            }
        }
        __syncthreads(); // ds rows of every warp
#pragma unroll
        for (int ki = 0; ki < 4; ki++) {
            uint32_t a[4];
            lda_km(a, sDs, LDT, 16 * warp, 16 * ki, lane); // A[j][i] = ds[i][j]
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t bb[4];
                ldb_kn(bb, sQ, LDT, 16 * ki, 16 * np, lane);
                mma_bf16(ak[2 * np], a, bb[0], bb[1]);
                mma_bf16(ak[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        // dW = -(dDelta S^T), dG row partials, dq / dk out
        float rowg[2] = {0.0f, 0.0f};
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int i = 16 * warp + gq + 8 * hr;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const int col = 8 * nt + 2 * t4, x = x0 + col;
                const uint32_t qv = *(const uint32_t *)(sQ + i * LDT + col),
                               kv = *(const uint32_t *)(sK + i * LDT + col);
                rowg[hr] += bf_lo(qv) * aq[nt][2 * hr] + bf_hi(qv) * aq[nt][2 * hr + 1] - bf_lo(kv) * ak[nt][2 * hr] -
                            bf_hi(kv) * ak[nt][2 * hr + 1];
                if (i < L && x < K) {
                    const int64_t rq = (row0 + i) * H + hq;
                    *(uint32_t *)(dWo + ((int64_t)bh * T + t0 + i) * K + x) =
                        gdn_pack_bf16(-aw[nt][2 * hr], -aw[nt][2 * hr + 1]);
                    if (grp == 1) {
                        *(uint32_t *)(dq + rq * K + x) = gdn_pack_bf16(aq[nt][2 * hr], aq[nt][2 * hr + 1]);
                        *(float2 *)(dk5 + rq * K + x) = make_float2(ak[nt][2 * hr], ak[nt][2 * hr + 1]);
                    }
                }
                if (grp > 1) {
                    float *pq = sAq + i * LDF + col, *pk = sAk + i * LDF + col;
                    pq[0] = (hi ? pq[0] : 0.0f) + aq[nt][2 * hr];
                    pq[1] = (hi ? pq[1] : 0.0f) + aq[nt][2 * hr + 1];
                    pk[0] = (hi ? pk[0] : 0.0f) + ak[nt][2 * hr];
                    pk[1] = (hi ? pk[1] : 0.0f) + ak[nt][2 * hr + 1];
                }
            }
            rowg[hr] = quad_sum(rowg[hr]);
        }
        // block sums of <S, dS'> and k . dk^state, fixed order
        sdot = warp_sum(sdot);
        kstate = warp_sum(kstate);
        if (lane == 0) sRed[warp] = sdot, sRed[4 + warp] = kstate;
        __syncthreads();
        const float last = eL * (sRed[0] + sRed[1] + sRed[2] + sRed[3]) + (sRed[4] + sRed[5] + sRed[6] + sRed[7]);
        if (t4 == 0)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * warp + gq + 8 * hr;
                if (i < L) dGp[((int64_t)xb * BHV + bh) * T + t0 + i] = rowg[hr] + (i == L - 1 ? last : 0.0f);
            }
        __syncthreads(); // sG, sRed, sDs reused by the next head
    }
    if (grp > 1)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * warp + gq + 8 * hr, col = 8 * nt + 2 * t4, x = x0 + col;
                if (i < L && x < K) {
                    const int64_t rq = (row0 + i) * H + hq;
                    *(uint32_t *)(dq + rq * K + x) = gdn_pack_bf16(sAq[i * LDF + col], sAq[i * LDF + col + 1]);
                    *(float2 *)(dk5 + rq * K + x) = make_float2(sAk[i * LDF + col], sAk[i * LDF + col + 1]);
                }
            }
}

// ==== B6 + B7: WY backward, reverse cumsum of dG ========================================

enum {
    WY_KK = 0,                      // K K^T fp32 [64][LDF]
    WY_TAF = WY_KK + BT * LDF * 4,  // T_A fp32 [64][LDF]
    WY_TAB = WY_TAF + BT * LDF * 4, // T_A bf16 [64][LDT]
    WY_R1 = WY_TAB + BT * LDT * 2,  // two bf16 tiles [64][LDT] | dT_A, then R (fp32 [64][72])
    WY_R2 = WY_R1 + BT * 72 * 4,    // X (fp32 [64][72]) | dMg, dMg beta (bf16 [64][LDT] each)
    WY_VEC = WY_R2 + BT * 72 * 4,   // G, beta, e^G, dG, dbeta [64] each
    WY_SMEM = WY_VEC + 5 * BT * 4
};

// Grid (NT, B*H), 128 threads; value heads of the q/k head in turn. Warp w
// owns rows 16w.. of every product. With dU = dDelta, dW from B5,
// Vb = diag(beta) V, Kg = diag(beta e^G) K:
//   dV = beta (T_A^T dU); dbeta_j = (T_A^T dU)_j . V_j + e^{G_j} (T_A^T dW)_j . K_j + sum_m dMg_jm KK_jm
//   dK += diag(beta e^G) T_A^T dW + diag(beta) dMg K + dMg^T diag(beta) K
//   dT_A = dU Vb^T + dW Kg^T (strictly lower); dM = -T_A^T dT_A T_A^T; dMg = dM * Gamma
//   dG_j += beta_j e^{G_j} (T_A^T dW)_j . K_j + sum_m R_jm - sum_a R_aj, R = dMg * beta_i KK
// then dg = reverse cumsum of dG within the chunk (dG starts from B5's partials).
__global__ void __launch_bounds__(128)
    k_wy(const bf16 *k, const bf16 *v, const float *betain, const float *Gs, const bf16 *TA, const bf16 *dDl,
         const bf16 *dWs, const float *dGp, float *dk5, bf16 *dk, bf16 *dv, float *dbeta, float *dg, int T, int H,
         int HV, int K, int Dv) {
    extern __shared__ __align__(128) unsigned char smem[];
    float *sKK = (float *)(smem + WY_KK), *sTAf = (float *)(smem + WY_TAF);
    bf16 *sTAb = (bf16 *)(smem + WY_TAB);
    bf16 *bufA = (bf16 *)(smem + WY_R1), *bufB = bufA + BT * LDT;
    float *sdTA = (float *)(smem + WY_R1), *sX = (float *)(smem + WY_R2);
    bf16 *sDMg = (bf16 *)(smem + WY_R2), *sDMb = sDMg + BT * LDT;
    float *sG = (float *)(smem + WY_VEC), *sBeta = sG + BT, *sEG = sBeta + BT, *sDG = sEG + BT, *sDB = sDG + BT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t4 = lane & 3;
    const int c = blockIdx.x, bq = blockIdx.y, b = bq / H, hq = bq - b * H, grp = HV / H;
    const int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
    const int64_t row0 = (int64_t)b * T + t0, BHV = (int64_t)(gridDim.y / H) * HV;
    const int nks = (K + 63) / 64, nvt = (Dv + 63) / 64;
    const bf16 *kb = k + (row0 * H + hq) * K;
    const int64_t kst = (int64_t)H * K;

    // K K^T (fp32)
    {
        float kk[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                kk[nt][r] = 0.0f;
        for (int xs = 0; xs < nks; xs++) {
            tile_async<BT, 64, 128>(bufB, LDT, kb + 64 * xs, kst, L, K - 64 * xs, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[4];
                lda_mk(a, bufB, LDT, 16 * warp, 16 * ks, lane);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_nk(bb, bufB, LDT, 16 * ks, 16 * np, lane);
                    mma_bf16(kk[2 * np], a, bb[0], bb[1]);
                    mma_bf16(kk[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                sKK[(16 * warp + gq + 8 * (r >> 1)) * LDF + 8 * nt + 2 * t4 + (r & 1)] = kk[nt][r];
    }

    for (int hi = 0; hi < grp; hi++) {
        const int h = hq * grp + hi, bh = b * HV + h;
        tile_async<BT, BT, 128>(sTAb, LDT, TA + ((int64_t)bh * T + t0) * BT, BT, L, BT, tid);
        cp_async_commit();
        if (tid < BT) {
            const bool ok = tid < L;
            const float gg = ok ? Gs[(int64_t)bh * T + t0 + tid] : 0.0f;
            sG[tid] = gg;
            sBeta[tid] = ok ? betain[(row0 + tid) * HV + h] : 0.0f;
            sEG[tid] = ok ? expf(gg) : 0.0f;
            float acc = 0.0f;
            for (int xb = 0; xb < nks; xb++) // B5's partials, fixed order
                acc += ok ? dGp[((int64_t)xb * BHV + bh) * T + t0 + tid] : 0.0f;
            sDG[tid] = acc;
            sDB[tid] = 0.0f;
        }
        cp_async_wait<0>();
        __syncthreads();
        for (int e = tid; e < BT * BT; e += 128)
            sTAf[(e >> 6) * LDF + (e & 63)] = bf2f(sTAb[(e >> 6) * LDT + (e & 63)]);
        uint32_t taf[4][4]; // A[j][i] = T_A[i][j], rows j of the warp
#pragma unroll
        for (int ki = 0; ki < 4; ki++)
            lda_km(taf[ki], sTAb, LDT, 16 * warp, 16 * ki, lane);

        // Dv tiles: dV, dbeta (V part), dU V^T
        float rb[2] = {0.0f, 0.0f}, tu[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                tu[nt][r] = 0.0f;
        for (int vt = 0; vt < nvt; vt++) {
            const int vc = 64 * vt;
            tile_async<BT, 64, 128>(bufA, LDT, dDl + ((int64_t)bh * T + t0) * Dv + vc, Dv, L, Dv - vc, tid);
            tile_async<BT, 64, 128>(bufB, LDT, v + (row0 * HV + h) * Dv + vc, (int64_t)HV * Dv, L, Dv - vc, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            float at[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    at[nt][r] = 0.0f;
#pragma unroll
            for (int ki = 0; ki < 4; ki++)
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_kn(bb, bufA, LDT, 16 * ki, 16 * np, lane);
                    mma_bf16(at[2 * np], taf[ki], bb[0], bb[1]);
                    mma_bf16(at[2 * np + 1], taf[ki], bb[2], bb[3]);
                }
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int j = 16 * warp + gq + 8 * hr;
                const float bj = sBeta[j];
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    const int cl = 8 * nt + 2 * t4, col = vc + cl;
                    const uint32_t vv = *(const uint32_t *)(bufB + j * LDT + cl);
                    rb[hr] += at[nt][2 * hr] * bf_lo(vv) + at[nt][2 * hr + 1] * bf_hi(vv);
                    if (j < L && col < Dv)
                        *(uint32_t *)(dv + ((row0 + j) * HV + h) * Dv + col) =
                            gdn_pack_bf16(bj * at[nt][2 * hr], bj * at[nt][2 * hr + 1]);
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[4];
                lda_mk(a, bufA, LDT, 16 * warp, 16 * ks, lane); // dU rows i
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_nk(bb, bufB, LDT, 16 * ks, 16 * np, lane); // B[v][j] = V[j][v]
                    mma_bf16(tu[2 * np], a, bb[0], bb[1]);
                    mma_bf16(tu[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            __syncthreads();
        }

        // K tiles, pass 1: T_A^T dW -> dk, dbeta, dG; dW K^T
        float tkr[2] = {0.0f, 0.0f}, tk[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                tk[nt][r] = 0.0f;
        for (int xs = 0; xs < nks; xs++) {
            const int xc = 64 * xs;
            tile_async<BT, 64, 128>(bufA, LDT, dWs + ((int64_t)bh * T + t0) * K + xc, K, L, K - xc, tid);
            tile_async<BT, 64, 128>(bufB, LDT, kb + xc, kst, L, K - xc, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            float aw[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    aw[nt][r] = 0.0f;
#pragma unroll
            for (int ki = 0; ki < 4; ki++)
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_kn(bb, bufA, LDT, 16 * ki, 16 * np, lane);
                    mma_bf16(aw[2 * np], taf[ki], bb[0], bb[1]);
                    mma_bf16(aw[2 * np + 1], taf[ki], bb[2], bb[3]);
                }
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int j = 16 * warp + gq + 8 * hr;
                const float f = sBeta[j] * sEG[j];
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    const int cl = 8 * nt + 2 * t4, x = xc + cl;
                    const uint32_t kv = *(const uint32_t *)(bufB + j * LDT + cl);
                    tkr[hr] += aw[nt][2 * hr] * bf_lo(kv) + aw[nt][2 * hr + 1] * bf_hi(kv);
                    if (j < L && x < K) {
                        float2 *p = (float2 *)(dk5 + ((row0 + j) * H + hq) * K + x);
                        float2 d = *p;
                        d.x += f * aw[nt][2 * hr];
                        d.y += f * aw[nt][2 * hr + 1];
                        *p = d;
                    }
                }
            }
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                uint32_t a[4];
                lda_mk(a, bufA, LDT, 16 * warp, 16 * ks, lane); // dW rows i
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_nk(bb, bufB, LDT, 16 * ks, 16 * np, lane); // B[x][j] = K[j][x]
                    mma_bf16(tk[2 * np], a, bb[0], bb[1]);
                    mma_bf16(tk[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float vsum = quad_sum(rb[hr]), ksum = quad_sum(tkr[hr]);
            const int j = 16 * warp + gq + 8 * hr;
            if (t4 == 0) {
                sDB[j] = vsum + sEG[j] * ksum;
                sDG[j] += sBeta[j] * sEG[j] * ksum;
            }
        }
        // dT_A (strictly lower, rows < L) into R1
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = 16 * warp + gq + 8 * (r >> 1), j = 8 * nt + 2 * t4 + (r & 1);
                sdTA[i * 72 + j] = (j < i && i < L) ? sBeta[j] * (tu[nt][r] + sEG[j] * tk[nt][r]) : 0.0f;
            }
        __syncthreads();
        // X = dT_A T_A^T (tf32), rows i of the warp
        {
            float ax[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    ax[nt][r] = 0.0f;
            mma_tf32_tile<8, 8>(ax, sdTA + 16 * warp * 72, 72, 1, sTAf, 1, LDF, lane);
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    sX[(16 * warp + gq + 8 * (r >> 1)) * 72 + 8 * nt + 2 * t4 + (r & 1)] = ax[nt][r];
        }
        __syncthreads();
        // dM = -T_A^T X, rows a of the warp; dMg = dM * Gamma (m < a < L)
        float am[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                am[nt][r] = 0.0f;
        mma_tf32_tile<8, 8>(am, sTAf + 16 * warp, 1, LDF, sX, 72, 1, lane);
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int a = 16 * warp + gq + 8 * (r >> 1), m = 8 * nt + 2 * t4 + (r & 1);
                const float dmg = (m < a && a < L) ? -am[nt][r] * expf(sG[a] - sG[m]) : 0.0f;
                am[nt][r] = dmg;
                rs[r >> 1] += dmg * sKK[a * LDF + m];
            }
        __syncthreads(); // X (R2) and dT_A (R1) are dead from here
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int a = 16 * warp + gq + 8 * hr, m = 8 * nt + 2 * t4;
                const float ba = sBeta[a];
                *(uint32_t *)(sDMg + a * LDT + m) = gdn_pack_bf16(am[nt][2 * hr], am[nt][2 * hr + 1]);
                *(uint32_t *)(sDMb + a * LDT + m) = gdn_pack_bf16(am[nt][2 * hr] * ba, am[nt][2 * hr + 1] * ba);
                sdTA[a * 72 + m] = am[nt][2 * hr] * ba * sKK[a * LDF + m];
                sdTA[a * 72 + m + 1] = am[nt][2 * hr + 1] * ba * sKK[a * LDF + m + 1];
            }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float rsum = quad_sum(rs[hr]);
            const int a = 16 * warp + gq + 8 * hr;
            if (t4 == 0) {
                sDB[a] += rsum;
                sDG[a] += sBeta[a] * rsum;
            }
        }
        __syncthreads();
        if (tid < BT) { // column sums of R, fixed order
            float cs = 0.0f;
            for (int a = 0; a < BT; a++)
                cs += sdTA[a * 72 + tid];
            sDG[tid] -= cs;
        }
        uint32_t fg[4][4], fb[4][4];
#pragma unroll
        for (int kj = 0; kj < 4; kj++) {
            lda_mk(fg[kj], sDMg, LDT, 16 * warp, 16 * kj, lane); // dMg rows i
            lda_km(fb[kj], sDMb, LDT, 16 * warp, 16 * kj, lane); // (dMg^T diag beta)[i][j] = dMg[j][i] beta_j
        }
        __syncthreads(); // R (R1) read; R1 holds K tiles from here
        // K tiles, pass 2: dk += beta_i (dMg K)_i + (dMg^T diag(beta) K)_i
        for (int xs = 0; xs < nks; xs++) {
            const int xc = 64 * xs;
            tile_async<BT, 64, 128>(bufB, LDT, kb + xc, kst, L, K - xc, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            float a1[8][4], a2[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    a1[nt][r] = a2[nt][r] = 0.0f;
#pragma unroll
            for (int kj = 0; kj < 4; kj++)
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t bb[4];
                    ldb_kn(bb, bufB, LDT, 16 * kj, 16 * np, lane);
                    mma_bf16(a1[2 * np], fg[kj], bb[0], bb[1]);
                    mma_bf16(a1[2 * np + 1], fg[kj], bb[2], bb[3]);
                    mma_bf16(a2[2 * np], fb[kj], bb[0], bb[1]);
                    mma_bf16(a2[2 * np + 1], fb[kj], bb[2], bb[3]);
                }
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = 16 * warp + gq + 8 * hr;
                const float bi = sBeta[i];
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    const int x = xc + 8 * nt + 2 * t4;
                    if (i < L && x < K) {
                        float2 *p = (float2 *)(dk5 + ((row0 + i) * H + hq) * K + x);
                        float2 d = *p;
                        d.x += bi * a1[nt][2 * hr] + a2[nt][2 * hr];
                        d.y += bi * a1[nt][2 * hr + 1] + a2[nt][2 * hr + 1];
                        *p = d;
                    }
                }
            }
            __syncthreads();
        }
        // B7: dgamma_i = sum_{j >= i} dG_j within the chunk (the reference's order)
        if (tid == 0)
            for (int i = L - 2; i >= 0; i--)
                sDG[i] += sDG[i + 1];
        __syncthreads();
        if (tid < L) {
            dg[(row0 + tid) * HV + h] = sDG[tid];
            dbeta[(row0 + tid) * HV + h] = sDB[tid];
        }
        __syncthreads();
    }
    // dk (fp32 accumulator, every term of every value head of the group) -> bf16
    const int kp = K / 2;
    for (int e = tid; e < L * kp; e += 128) {
        const int i = e / kp, x = 2 * (e - i * kp);
        const int64_t off = ((row0 + i) * H + hq) * K + x;
        const float2 d = *(const float2 *)(dk5 + off);
        *(uint32_t *)(dk + off) = gdn_pack_bf16(d.x, d.y);
    }
}

// ==== host side =====================================================================

// ---- optional per-kernel timing (bench/bench_gdn.c) ------------------------------
// gdn_cuda_timing(1): every chunked op records a CUDA event after each of its
// kernels and waits for the last one, accumulating the time between
// consecutive events per kernel name (the ops become synchronous: for
// benchmarks only). gdn_cuda_timing_read() returns and clears the totals.
enum { TM_MAX = 16 };
static int tm_on;
static struct {
    const char *name;
    double ms;
    int calls;
} tm_tab[TM_MAX];
static cudaEvent_t tm_ev[TM_MAX];
static const char *tm_evname[TM_MAX];
static int tm_nev;
static void tm_mark(be_t *be, const char *name) { // name: the kernel that ends here (NULL: start)
    if (!tm_on || tm_nev >= TM_MAX) return;
    if (!tm_ev[tm_nev] && cudaEventCreate(&tm_ev[tm_nev]) != cudaSuccess) return;
    cudaEventRecord(tm_ev[tm_nev], cuda_stream(be));
    tm_evname[tm_nev++] = name;
}
static void tm_finish(void) {
    if (!tm_on || tm_nev < 2) {
        tm_nev = 0;
        return;
    }
    cudaEventSynchronize(tm_ev[tm_nev - 1]);
    for (int i = 1; i < tm_nev; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, tm_ev[i - 1], tm_ev[i]);
        int j = 0;
        while (j < TM_MAX && tm_tab[j].name && strcmp(tm_tab[j].name, tm_evname[i]))
            j++;
        if (j == TM_MAX) continue;
        tm_tab[j].name = tm_evname[i];
        tm_tab[j].ms += ms;
        tm_tab[j].calls++;
    }
    tm_nev = 0;
}
extern "C" void gdn_cuda_timing(int on) { tm_on = on; }
extern "C" int gdn_cuda_timing_read(const char **names, double *ms, int *calls, int max) {
    int n = 0;
    for (int j = 0; j < TM_MAX && tm_tab[j].name; j++) {
        if (n < max) names[n] = tm_tab[j].name, ms[n] = tm_tab[j].ms, calls[n] = tm_tab[j].calls, n++;
        tm_tab[j].name = NULL, tm_tab[j].ms = 0, tm_tab[j].calls = 0;
    }
    return n;
}

// Marks outputs as failed (NaN: 0xFF bytes are NaN in bf16 and fp32).
static void gdn_poison(be_t *be, void *p, size_t bytes) {
    if (!p || !bytes) return;
    cudaMemsetAsync(p, 0xff, bytes, cuda_stream(be));
}

static int gdn_check(be_t *be, const char *op, int B, int T, int H, int HV, int K, int Dv, uintptr_t ptr_or) {
    if (B < 1 || T < 1 || H < 1 || HV < H || HV % H || K < 16 || K > 256 || K % 16 || Dv < 16 || Dv % 16) {
        cu_op_error(be,
                    "%s: unsupported shape B %d T %d H %d HV %d K %d Dv %d (the CUDA kernels need HV a multiple of "
                    "H, K a multiple of 16 up to 256, Dv a multiple of 16)",
                    op, B, T, H, HV, K, Dv);
        return 0;
    }
    if (ptr_or % 16) {
        cu_op_error(be, "%s: q, k, v, o / dout must be 16-byte aligned device pointers", op);
        return 0;
    }
    return 1;
}

typedef struct {
    float *G, *EG, *GM, *dk5, *dGp;
    bf16 *W, *U, *P, *TA, *Dl, *h, *dh, *dD;
} gdn_tmp_t;

// Scratch bytes of gdn_chunk_fwd (bwd = 0) or gdn_chunk_bwd (bwd = 1).
extern "C" size_t gdn_chunk_scratch_bytes(int B, int T, int H, int HV, int K, int Dv, int bwd) {
    const size_t NT = ((size_t)T + BT - 1) / BT, BHV = (size_t)B * HV, NK = ((size_t)K + 63) / 64;
    size_t n = 256 + 3 * cu_round256(4 * BHV * T) + cu_round256(2 * BHV * T * K) + cu_round256(2 * BHV * T * Dv) +
               cu_round256(2 * BHV * T * BT) + cu_round256(2 * BHV * T * Dv) + cu_round256(2 * BHV * NT * Dv * K);
    if (bwd)
        n += cu_round256(2 * BHV * T * BT) + cu_round256(2 * BHV * NT * Dv * K) + cu_round256(2 * BHV * T * Dv) +
             cu_round256(4 * (size_t)B * T * H * K) + cu_round256(4 * NK * BHV * T);
    return n;
}

static int gdn_take(be_t *be, gdn_tmp_t *t, const char *op, int B, int T, int H, int HV, int K, int Dv, int bwd) {
    const size_t NT = ((size_t)T + BT - 1) / BT, BHV = (size_t)B * HV, NK = ((size_t)K + 63) / 64;
    const size_t need = gdn_chunk_scratch_bytes(B, T, H, HV, K, Dv, bwd);
    arena_t *a = &be->scratch;
    memset(t, 0, sizeof *t);
    if (!a->base || a->cap - (a->used < a->cap ? a->used : a->cap) < need) {
        cu_op_error(be,
                    "%s: scratch arena too small: needs %zu bytes for B %d T %d H %d HV %d K %d Dv %d, %zu of %zu "
                    "free (see gdn_chunk_scratch_bytes)",
                    op, need, B, T, H, HV, K, Dv, a->cap > a->used ? a->cap - a->used : 0, a->cap);
        return 0;
    }
    t->G = (float *)cu_scratch_try(be, 4 * BHV * T);
    t->EG = (float *)cu_scratch_try(be, 4 * BHV * T);
    t->GM = (float *)cu_scratch_try(be, 4 * BHV * T);
    t->W = (bf16 *)cu_scratch_try(be, 2 * BHV * T * K);
    t->U = (bf16 *)cu_scratch_try(be, 2 * BHV * T * Dv);
    t->P = (bf16 *)cu_scratch_try(be, 2 * BHV * T * BT);
    t->Dl = (bf16 *)cu_scratch_try(be, 2 * BHV * T * Dv);
    t->h = (bf16 *)cu_scratch_try(be, 2 * BHV * NT * Dv * K);
    int ok = t->G && t->EG && t->GM && t->W && t->U && t->P && t->Dl && t->h;
    if (bwd) {
        t->TA = (bf16 *)cu_scratch_try(be, 2 * BHV * T * BT);
        t->dh = (bf16 *)cu_scratch_try(be, 2 * BHV * NT * Dv * K);
        t->dD = (bf16 *)cu_scratch_try(be, 2 * BHV * T * Dv);
        t->dk5 = (float *)cu_scratch_try(be, 4 * (size_t)B * T * H * K);
        t->dGp = (float *)cu_scratch_try(be, 4 * NK * BHV * T);
        ok = ok && t->TA && t->dh && t->dD && t->dk5 && t->dGp;
    }
    if (!ok) cu_op_error(be, "%s: scratch arena allocation failed (needs %zu bytes)", op, need);
    return ok;
}

// Warps (16 value rows each) per state-pass block. (A 2-warp configuration,
// selectable by environment, was never measured faster and is gone.)
enum { GDN_NW = 4 };

template <int KP, int NW> static void launch_state_t(be_t *be, dim3 grid, const state_args &a) {
    auto kfn = k_state<KP, NW>;
    const size_t sm = state_cfg<KP, NW>::SMEM;
    if (cuda_smem_limit(be, (const void *)kfn, sm, "gdn k_state") < 0) return;
    kfn<<<grid, dim3(NW * 32), sm, cuda_stream(be)>>>(a);
    cuda_check_launch(be, "gdn k_state");
}

// A bf16 tensor map over `rank` dims (dims[0] innermost, in elements; strides of
// dims 1.. in bytes) with boxes of 64 elements of dim 0 by 64 of dim `rdim` (1
// of the others), 128-byte swizzle, zeros outside the tensor.
static bool wgs_map(cuda_encode_tiled_fn enc, CUtensorMap *m, const void *p, int rank, const cuuint64_t *dims,
                    const cuuint64_t *strides, int rdim) {
    cuuint32_t box[4], es[4];
    for (int i = 0; i < rank; i++)
        box[i] = i == 0 || i == rdim ? 64 : 1, es[i] = 1;
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)p, dims, strides, box, es,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int KP> static void launch_state_wg_t(be_t *be, dim3 grid, const wgs_maps &m, const state_args &a) {
    auto kfn = k_state_wg<KP>;
    const size_t sm = wgs_cfg<KP>::SMEM;
    if (cuda_smem_limit(be, (const void *)kfn, sm, "gdn k_state_wg") < 0) return;
    kfn<<<grid, dim3(128), sm, cuda_stream(be)>>>(m, a);
    cuda_check_launch(be, "gdn k_state_wg");
}

// k_state_wg in place of k_state; false (nothing launched) without a tensor-map
// encoder or where a map cannot describe the shape: k_state runs then.
static bool launch_state_wg(be_t *be, int B, int passes, const state_args &a) {
    cuda_encode_tiled_fn enc = cuda_tensor_encoder();
    if (!enc) return false;
    const cuuint64_t T = (cuuint64_t)a.T, H = (cuuint64_t)a.H, HV = (cuuint64_t)a.HV, K = (cuuint64_t)a.K,
                     Dv = (cuuint64_t)a.Dv, BHV = (cuuint64_t)B * a.HV, NT = (cuuint64_t)a.NT;
    wgs_maps m;
    memset(&m, 0, sizeof m);
    // head-major scratch [BHV][T][X] (W: X = K; U, Delta, dDelta: Dv; P: 64), rows t
    const cuuint64_t dimW[3] = {K, T, BHV}, strW[2] = {2 * K, 2 * T * K};
    const cuuint64_t dimU[3] = {Dv, T, BHV}, strU[2] = {2 * Dv, 2 * T * Dv};
    const cuuint64_t dimP[3] = {(cuuint64_t)BT, T, BHV}, strP[2] = {2 * BT, 2 * T * BT};
    // k, q [B][T][H][K] and dO [B][T][HV][Dv], rows t of one head (zeros past T and K / Dv)
    const cuuint64_t dimK[4] = {K, H, T, (cuuint64_t)B}, strK[3] = {2 * K, 2 * H * K, 2 * T * H * K};
    const cuuint64_t dimO[4] = {Dv, HV, T, (cuuint64_t)B}, strO[3] = {2 * Dv, 2 * HV * Dv, 2 * T * HV * Dv};
    // h, dh [BHV][NT][Dv][K] as [BHV NT][Dv][K], rows v
    const cuuint64_t dimH[3] = {K, Dv, BHV * NT}, strH[2] = {2 * K, 2 * Dv * K};
    bool ok = wgs_map(enc, &m.w, a.W, 3, dimW, strW, 1) && wgs_map(enc, &m.k, a.k, 4, dimK, strK, 2);
    if (a.rev_z < 0 || passes > 1)
        ok = ok && wgs_map(enc, &m.u, a.U, 3, dimU, strU, 1) && wgs_map(enc, &m.h, a.hst, 3, dimH, strH, 1) &&
             wgs_map(enc, &m.dl, a.Dl, 3, dimU, strU, 1);
    if (a.rev_z >= 0)
        ok = ok && wgs_map(enc, &m.q, a.q, 4, dimK, strK, 2) && wgs_map(enc, &m.p, a.P, 3, dimP, strP, 1) &&
             wgs_map(enc, &m.dout, a.dO, 4, dimO, strO, 2) && wgs_map(enc, &m.dh, a.dhst, 3, dimH, strH, 1) &&
             wgs_map(enc, &m.ddl, a.dDl, 3, dimU, strU, 1);
    if (!ok) return false;
    const dim3 grid((unsigned)((a.Dv + 63) / 64), (unsigned)(B * a.HV), (unsigned)passes);
    if (a.K <= 64)
        launch_state_wg_t<64>(be, grid, m, a);
    else if (a.K <= 128)
        launch_state_wg_t<128>(be, grid, m, a);
    else
        launch_state_wg_t<256>(be, grid, m, a);
    return true;
}

// passes = 1: forward pass only (rev_z = -1); 2: reverse (z = 0) and forward (z = 1) together.
static void launch_state(be_t *be, int B, int passes, const state_args &a) {
    // k_state_wg (wgmma, 1.30-1.36x faster forward + backward on an H100:
    // docs/PERFORMANCE.md); k_state where a tensor map cannot describe the
    // shape, and in the bench-variants build under HYLO_GDN_STATE=2 (the
    // comparison bench_gdn --compare prints)
    bool mma_only = false;
#ifdef HYLO_BENCH_VARIANTS
    mma_only = cu_env_int("HYLO_GDN_STATE", 0) == 2;
#endif
    if (!mma_only && launch_state_wg(be, B, passes, a)) return;
    const dim3 grid((unsigned)((a.Dv + 16 * GDN_NW - 1) / (16 * GDN_NW)), (unsigned)(B * a.HV), (unsigned)passes);
    if (a.K <= 64)
        launch_state_t<64, GDN_NW>(be, grid, a);
    else if (a.K <= 128)
        launch_state_t<128, GDN_NW>(be, grid, a);
    else
        launch_state_t<256, GDN_NW>(be, grid, a);
}

static void launch_prep(be_t *be, const void *q, const void *k, const void *v, const float *g, const float *beta,
                        const gdn_tmp_t *t, float scale, int B, int T, int H, int HV, int K, int Dv) {
    auto kfn = k_prep;
    if (cuda_smem_limit(be, (const void *)kfn, PREP_SMEM, "gdn k_prep") < 0) return;
    const dim3 grid((unsigned)((T + BT - 1) / BT), (unsigned)(B * HV));
    kfn<<<grid, dim3(128), PREP_SMEM, cuda_stream(be)>>>((const bf16 *)q, (const bf16 *)k, (const bf16 *)v, g, beta,
                                                         t->G, t->EG, t->GM, t->W, t->U, t->P, t->TA, scale, T, H, HV,
                                                         K, Dv);
    cuda_check_launch(be, "gdn k_prep");
}

template <int KP>
static void launch_out_t(be_t *be, void *o, const void *q, const gdn_tmp_t *t, float scale, int B, int T, int H, int HV,
                         int K, int Dv) {
    auto kfn = k_out<KP>;
    const size_t sm = out_cfg<KP>::SMEM;
    if (cuda_smem_limit(be, (const void *)kfn, sm, "gdn k_out") < 0) return;
    const int NT = (T + BT - 1) / BT;
    kfn<<<dim3((unsigned)NT, (unsigned)(B * HV)), dim3(256), sm, cuda_stream(be)>>>(
        (bf16 *)o, (const bf16 *)q, t->h, t->Dl, t->P, t->G, scale, T, H, HV, K, Dv, NT);
    cuda_check_launch(be, "gdn k_out");
}

static void cu_gdn_chunk_fwd(be_t *be, void *o, float *state, int init, const void *q, const void *k, const void *v,
                             const float *g, const float *beta, float scale, int B, int T, int H, int HV, int K,
                             int Dv) {
    const size_t no = (size_t)B * T * HV * Dv * 2, ns = (size_t)B * HV * Dv * K * 4;
    if (!gdn_check(be, "gdn_chunk_fwd", B, T, H, HV, K, Dv,
                   (uintptr_t)o | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v)) {
        gdn_poison(be, o, B > 0 && T > 0 ? no : 0), gdn_poison(be, state, B > 0 ? ns : 0);
        return;
    }
    const size_t mark = arena_mark(&be->scratch);
    gdn_tmp_t t;
    if (!gdn_take(be, &t, "gdn_chunk_fwd", B, T, H, HV, K, Dv, 0)) {
        arena_reset(&be->scratch, mark);
        gdn_poison(be, o, no), gdn_poison(be, state, ns);
        return;
    }
    const int NT = (T + BT - 1) / BT;
    tm_mark(be, NULL);
    launch_prep(be, q, k, v, g, beta, &t, scale, B, T, H, HV, K, Dv);
    tm_mark(be, "fwd: k_prep");
    state_args a;
    memset(&a, 0, sizeof a);
    a.W = t.W, a.U = t.U, a.k = (const bf16 *)k, a.EG = t.EG, a.GM = t.GM, a.hst = t.h, a.Dl = t.Dl;
    a.state = state, a.init = state && init, a.write_final = state != NULL;
    a.scale = scale, a.rev_z = -1, a.T = T, a.H = H, a.HV = HV, a.K = K, a.Dv = Dv, a.NT = NT;
    launch_state(be, B, 1, a);
    tm_mark(be, "fwd: k_state (forward pass)");
    if (K <= 64)
        launch_out_t<64>(be, o, q, &t, scale, B, T, H, HV, K, Dv);
    else if (K <= 128)
        launch_out_t<128>(be, o, q, &t, scale, B, T, H, HV, K, Dv);
    else
        launch_out_t<256>(be, o, q, &t, scale, B, T, H, HV, K, Dv);
    tm_mark(be, "fwd: k_out");
    tm_finish();
    arena_reset(&be->scratch, mark); // later users of this memory queue behind these kernels
}

// Packed sequences (cuda.h cu_seqs_run): a padding row has g = 0 and beta =
// 0, so it neither decays nor writes the state, and each sequence ends with
// its own final state.
typedef struct {
    float scale;
    int H, HV, K, Dv;
} gdn_seqs_t;

static size_t gdn_seqs_scratch(const void *ctx, int n, int T) {
    const gdn_seqs_t *c = (const gdn_seqs_t *)ctx;
    return gdn_chunk_scratch_bytes(n, T, c->H, c->HV, c->K, c->Dv, 0);
}

static void gdn_seqs_call(be_t *be, const void *ctx, const cu_seqs_arr_t *in, void *out, int64_t ldo, float *states,
                          int n, int T) {
    const gdn_seqs_t *c = (const gdn_seqs_t *)ctx;
    cu_gdn_chunk_fwd(be, out, states, 1, in[0].p, in[1].p, in[2].p, (const float *)in[3].p, (const float *)in[4].p,
                     c->scale, n, T, c->H, c->HV, c->K, c->Dv);
}

static void cu_gdn_chunk_seqs(be_t *be, void *o, void *const *state, const void *q, const void *k, const void *v,
                              const float *g, const float *beta, float scale, be_seqs_t sq, int H, int HV, int K,
                              int Dv) {
    const int kd = H * K, vd = HV * Dv;
    const cu_seqs_arr_t in[5] = {{q, kd, kd, 2}, {k, kd, kd, 2}, {v, vd, vd, 2}, {g, HV, HV, 4}, {beta, HV, HV, 4}};
    const gdn_seqs_t c = {scale, H, HV, K, Dv};
    cu_seqs_run(be, "gdn_chunk_seqs", sq, state, (size_t)HV * Dv * K * sizeof(float), in, 5, {o, vd, vd, 2},
                gdn_seqs_scratch, gdn_seqs_call, &c);
}

static void cu_gdn_chunk_bwd(be_t *be, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dstate0,
                             const void *dout, const float *dstate_final, const void *q, const void *k, const void *v,
                             const float *g, const float *beta, const float *state0, float scale, int B, int T, int H,
                             int HV, int K, int Dv) {
    const size_t nqk = (size_t)B * T * H * K * 2, nv = (size_t)B * T * HV * Dv * 2, ng = (size_t)B * T * HV * 4,
                 ns = (size_t)B * HV * Dv * K * 4;
    auto poison_all = [&]() {
        gdn_poison(be, dq, nqk), gdn_poison(be, dk, nqk), gdn_poison(be, dv, nv);
        gdn_poison(be, dg, ng), gdn_poison(be, dbeta, ng), gdn_poison(be, dstate0, ns);
    };
    if (!gdn_check(be, "gdn_chunk_bwd", B, T, H, HV, K, Dv,
                   (uintptr_t)dq | (uintptr_t)dk | (uintptr_t)dv | (uintptr_t)dout | (uintptr_t)q | (uintptr_t)k |
                       (uintptr_t)v)) {
        if (B > 0 && T > 0) poison_all();
        return;
    }
    const size_t mark = arena_mark(&be->scratch);
    gdn_tmp_t t;
    if (!gdn_take(be, &t, "gdn_chunk_bwd", B, T, H, HV, K, Dv, 1)) {
        arena_reset(&be->scratch, mark);
        poison_all();
        return;
    }
    const int NT = (T + BT - 1) / BT, NK = (K + 63) / 64;
    // B1: G, W, U, P, T_A
    tm_mark(be, NULL);
    launch_prep(be, q, k, v, g, beta, &t, scale, B, T, H, HV, K, Dv);
    tm_mark(be, "bwd: k_prep");
    // B2 (h, Delta) and B4 (dh, dDelta, dstate0): independent, one launch
    state_args a;
    memset(&a, 0, sizeof a);
    a.W = t.W, a.U = t.U, a.k = (const bf16 *)k, a.q = (const bf16 *)q, a.P = t.P, a.dO = (const bf16 *)dout;
    a.EG = t.EG, a.GM = t.GM, a.hst = t.h, a.Dl = t.Dl;
    a.state = (float *)state0, a.init = state0 != NULL, a.write_final = 0;
    a.dhst = t.dh, a.dDl = t.dD, a.dstate0 = dstate0, a.dstate_final = dstate_final;
    a.scale = scale, a.rev_z = 0, a.T = T, a.H = H, a.HV = HV, a.K = K, a.Dv = Dv, a.NT = NT;
    launch_state(be, B, 2, a);
    tm_mark(be, "bwd: k_state (both passes)");
    // B5: dq, dk (partial, fp32), dW (into W's place: nothing reads W any more), dG partials
    {
        auto kfn = k_dqkw;
        const size_t sm = HV > H ? DQ_SMEM_GVA : DQ_SMEM;
        if (cuda_smem_limit(be, (const void *)kfn, sm, "gdn k_dqkw") == 0) {
            kfn<<<dim3((unsigned)NK, (unsigned)NT, (unsigned)(B * H)), dim3(128), sm, cuda_stream(be)>>>(
                (const bf16 *)q, (const bf16 *)k, t.h, t.dh, t.Dl, (const bf16 *)dout, t.dD, t.G, (bf16 *)dq, t.dk5,
                t.W, t.dGp, scale, T, H, HV, K, Dv, NT);
            cuda_check_launch(be, "gdn k_dqkw");
        }
    }
    tm_mark(be, "bwd: k_dqkw");
    // B6 + B7: dv, dbeta, dg, dk
    {
        auto kfn = k_wy;
        if (cuda_smem_limit(be, (const void *)kfn, WY_SMEM, "gdn k_wy") == 0) {
            kfn<<<dim3((unsigned)NT, (unsigned)(B * H)), dim3(128), WY_SMEM, cuda_stream(be)>>>(
                (const bf16 *)k, (const bf16 *)v, beta, t.G, t.TA, t.dD, t.W, t.dGp, t.dk5, (bf16 *)dk, (bf16 *)dv,
                dbeta, dg, T, H, HV, K, Dv);
            cuda_check_launch(be, "gdn k_wy");
        }
    }
    tm_mark(be, "bwd: k_wy");
    tm_finish();
    arena_reset(&be->scratch, mark);
}

// Launches k_recurrent over B sequences of T tokens: states in `state` [B,
// HV, Dv, K], or (rows non-NULL) sequence b's at rows[b].
static void gdn_recurrent(be_t *be, const char *op, void *o, float *state, float *const *rows, const void *q,
                          const void *k, const void *v, const float *g, const float *beta, float scale, int B, int T,
                          int H, int HV, int K, int Dv) {
    if (B < 1 || T < 1) return;
    if (H < 1 || HV < H || HV % H || K < 2 || K > 256 || K % 2 || (int64_t)B * HV > 65535) {
        cu_op_error(
            be, "%s: unsupported shape B %d H %d HV %d K %d Dv %d (HV a multiple of H, even K <= 256, B HV <= 65535)",
            op, B, H, HV, K, Dv);
        gdn_poison(be, o, (size_t)B * T * HV * Dv * 2);
        return;
    }
    const dim3 grid((unsigned)((Dv + REC_ROWS * REC_WARPS - 1) / (REC_ROWS * REC_WARPS)), (unsigned)(B * HV));
    const dim3 block(REC_WARPS * 32);
    bf16 *ob = (bf16 *)o;
    const bf16 *qb = (const bf16 *)q, *kb = (const bf16 *)k, *vb = (const bf16 *)v;
    if (K <= 64) {
        cu_launch_pdl(k_recurrent<2>, grid, block, 0, cuda_stream(be), ob, state, rows, qb, kb, vb, g, beta, scale, T,
                      H, HV, K, Dv);
    } else if (K <= 128) {
        cu_launch_pdl(k_recurrent<4>, grid, block, 0, cuda_stream(be), ob, state, rows, qb, kb, vb, g, beta, scale, T,
                      H, HV, K, Dv);
    } else {
        cu_launch_pdl(k_recurrent<8>, grid, block, 0, cuda_stream(be), ob, state, rows, qb, kb, vb, g, beta, scale, T,
                      H, HV, K, Dv);
    }
    cuda_check_launch(be, "gdn k_recurrent");
}

static void cu_gdn_recurrent_fwd(be_t *be, void *o, float *state, const void *q, const void *k, const void *v,
                                 const float *g, const float *beta, float scale, int B, int T, int H, int HV, int K,
                                 int Dv) {
    gdn_recurrent(be, "gdn_recurrent_fwd", o, state, NULL, q, k, v, g, beta, scale, B, T, H, HV, K, Dv);
}

// ==== decode step inputs ===============================================================
//
// k_step_inputs: what conv1d_step x 3, l2norm_fwd x 2 and gdn_gate_fwd do for
// a decode step, in one launch. Grid (H + ceil(vd / STEP_THREADS), N): block
// x < H takes q/k head x of row y (its K channels of q and of k: conv, SiLU,
// the bf16 rounding conv1d_step's output has, then the head's L2 norm); the
// blocks after it take STEP_THREADS v channels each, the first of them also the
// HV gates. Every window channel belongs to one thread, which reads it and
// rolls it, as k_conv_step does.

enum { STEP_THREADS = 256 };

// One channel's conv of the new input xc over its window s (act [W]; the
// last W - 1 are read), SiLU, rounded as conv1d_step's act output is.
static __device__ float conv_out(const bf16 *s, const bf16 *w, bf16 xc, int W) {
    float p = 0.0f;
    for (int i = 0; i + 1 < W; i++)
        p += __bfloat162float(w[i]) * __bfloat162float(s[i + 1]);
    p += __bfloat162float(w[W - 1]) * __bfloat162float(xc);
    return bf2f(__float2bfloat16_rn(dev_silu(p)));
}

// The window rolled forward: the oldest input out, xc in as the newest.
static __device__ void conv_roll(bf16 *s, bf16 xc, int W) {
    for (int j = 0; j + 1 < W; j++)
        s[j] = s[j + 1];
    s[W - 1] = xc;
}

// conv_out, then the window rolled (the thread that reads a window rolls it).
static __device__ float step_conv(bf16 *s, const bf16 *w, bf16 xc, int W) {
    const float y = conv_out(s, w, xc, W);
    conv_roll(s, xc, W);
    return y;
}

// Dynamic shared memory: 2 K floats (the head's q and k conv outputs) + 32 (reduction).
__global__ void __launch_bounds__(STEP_THREADS)
    k_step_inputs(bf16 *q, bf16 *k, bf16 *v, float *g, float *beta, bf16 *const *rows, const bf16 *xq, int64_t ldq,
                  const bf16 *xk, int64_t ldk, const bf16 *xv, int64_t ldv, const bf16 *a, int64_t lda, const bf16 *b,
                  int64_t ldb, const bf16 *q_conv, const bf16 *k_conv, const bf16 *v_conv, const bf16 *A_log,
                  const bf16 *dt_bias, int N, int H, int HV, int K, int Dv, int W, float eps, float beta_scale) {
    griddep_enter(); // a programmatic dependent launch (cuda_vec.cuh)
    extern __shared__ float ssm[];
    const int r = blockIdx.y, x = blockIdx.x, tid = threadIdx.x;
    const int64_t kd = (int64_t)H * K, vd = (int64_t)HV * Dv;
    if (x < H) { // q/k head x
        float *cq = ssm, *ck = ssm + K, *red = ssm + 2 * K;
        bf16 *wq = rows[N + r], *wk = rows[2 * N + r];
        float sq = 0.0f, sk = 0.0f;
        for (int i = tid; i < K; i += blockDim.x) {
            const int64_t c = (int64_t)x * K + i;
            const float fq = step_conv(wq + c * W, q_conv + c * W, xq[(int64_t)r * ldq + c], W);
            const float fk = step_conv(wk + c * W, k_conv + c * W, xk[(int64_t)r * ldk + c], W);
            cq[i] = fq, ck[i] = fk;
            sq += fq * fq, sk += fk * fk;
        }
        const float rq = 1.0f / sqrtf(block_reduce(sq, false, red) + eps);
        const float rk = 1.0f / sqrtf(block_reduce(sk, false, red) + eps);
        for (int i = tid; i < K; i += blockDim.x) {
            const int64_t o = (int64_t)r * kd + (int64_t)x * K + i;
            q[o] = __float2bfloat16_rn(cq[i] * rq);
            k[o] = __float2bfloat16_rn(ck[i] * rk);
        }
        return;
    }
    const int64_t c = (int64_t)(x - H) * blockDim.x + tid; // v channel
    bf16 *wv = rows[3 * N + r];
    if (c < vd)
        v[(int64_t)r * vd + c] =
            __float2bfloat16_rn(step_conv(wv + c * W, v_conv + c * W, xv[(int64_t)r * ldv + c], W));
    if (x == H)
        for (int h = tid; h < HV; h += blockDim.x) {
            g[(int64_t)r * HV + h] =
                -expf(bf2f(A_log[h])) * dev_softplus(bf2f(a[(int64_t)r * lda + h]) + bf2f(dt_bias[h]));
            beta[(int64_t)r * HV + h] = beta_scale * dev_sigmoid(bf2f(b[(int64_t)r * ldb + h]));
        }
}

static void cu_gdn_step_inputs(be_t *be, void *q, void *k, void *v, float *g, float *beta, void *const *rows,
                               const void *xq, int64_t ldq, const void *xk, int64_t ldk, const void *xv, int64_t ldv,
                               const void *a, int64_t lda, const void *b, int64_t ldb, const void *q_conv,
                               const void *k_conv, const void *v_conv, const void *A_log, const void *dt_bias, int N,
                               int H, int HV, int K, int Dv, int W, float eps, int allow_neg) {
    if (N < 1) return;
    if (H < 1 || HV < 1 || K < 1 || Dv < 1 || W < 1 || N > 65535) {
        cu_op_error(be, "cuda gdn_step_inputs: N=%d H=%d HV=%d K=%d Dv=%d W=%d not supported (N <= 65535)", N, H, HV, K,
                    Dv, W);
        return;
    }
    const int64_t vblocks = ((int64_t)HV * Dv + STEP_THREADS - 1) / STEP_THREADS;
    const size_t smem = (2 * (size_t)K + 32) * sizeof(float);
    if (cuda_smem_limit(be, (const void *)k_step_inputs, smem, "k_step_inputs") < 0) return;
    cu_launch_pdl(k_step_inputs, dim3((unsigned)(H + vblocks), (unsigned)N), dim3(STEP_THREADS), smem, cuda_stream(be),
                  (bf16 *)q, (bf16 *)k, (bf16 *)v, g, beta, (bf16 *const *)rows, (const bf16 *)xq, ldq,
                  (const bf16 *)xk, ldk, (const bf16 *)xv, ldv, (const bf16 *)a, lda, (const bf16 *)b, ldb,
                  (const bf16 *)q_conv, (const bf16 *)k_conv, (const bf16 *)v_conv, (const bf16 *)A_log,
                  (const bf16 *)dt_bias, N, H, HV, K, Dv, W, eps, allow_neg ? 2.0f : 1.0f);
    cuda_check_launch(be, "gdn k_step_inputs");
}

static void cu_gdn_recurrent_step(be_t *be, void *o, void *const *rows, const void *q, const void *k, const void *v,
                                  const float *g, const float *beta, float scale, int N, int H, int HV, int K, int Dv) {
    gdn_recurrent(be, "gdn_recurrent_step", o, NULL, (float *const *)rows, q, k, v, g, beta, scale, N, 1, H, HV, K, Dv);
}

// ==== fused decode step ================================================================
//
// k_gdn_step: a decode step from the projections to o_proj's input in one
// launch, what k_step_inputs, k_recurrent and the gated norm (cuda_norm.cu
// k_gnorm_fwd) do in three: a small step's cost is its launches, not its
// bytes (docs/SERVING.md). The same roundings as the three (conv outputs,
// the normalised q and k, and o to bf16), the same fp32 formulas.
//
// Grid (G S, H, N) in clusters of G S blocks along x: the cluster owns q/k
// head x of row r and its G = HV / H value heads, each cut into S slices of
// R value rows, one per block (cluster rank j: value head x G + j / S, rows
// [(j % S) R, (j % S + 1) R) of it). Two things need more than a block's rows:
//  - q and k: every block convolves and L2-normalises the whole q/k head
//    itself (K channels each, cheap), only reading the windows; rank 0 rolls
//    them forward after a cluster barrier, when every block has read them.
//    A v channel belongs to one block, which reads and rolls its window.
//  - the output norm's sum of squares over a value head's Dv: each block
//    writes its part into every block of its head (distributed shared
//    memory) before the one cluster barrier, and each sums the S parts in
//    rank order (the same bits whichever block runs first). Nothing reads
//    another block's memory after the barrier, so none waits at a second.
// The rule is k_recurrent's: a warp takes RW value rows at a time with their
// state rows in registers, K spread over the lanes (E each), the same
// formulas and summation order, so o and the state have k_recurrent's bits.
// 256 threads as k_step_inputs: q and k get its reduction order and bits;
// only the norm's sum of squares is summed in another order than k_gnorm_fwd.
// Clusters of up to 16 blocks: 16 (past the portable 8) where the step's
// clusters all fit the device at once (cu_gdn_step). G must be a power
// of two up to 8 and K a multiple of 8 up to 256; other shapes run the three
// kernels.

namespace cg = cooperative_groups;

enum { GS_THREADS = 256, GS_WARPS = GS_THREADS / 32, GS_CLUSTER = 8, GS_CLUSTER_MAX = 16 };

typedef struct {
    bf16 *y;
    void *const *rows;
    const bf16 *xq, *xk, *xv, *a, *b, *z;
    int64_t ldq, ldk, ldv, lda, ldb, ldz;
    const bf16 *q_conv, *k_conv, *v_conv, *A_log, *dt_bias, *o_norm;
    float scale, l2_eps, eps, beta_scale;
    int N, H, HV, K, Dv, W, S, R;
} gdn_step_args;

// E consecutive floats (E = 2: one 8-byte access, else 16-byte ones).
template <int E> static __device__ __forceinline__ void ld_f32v(const float *p, float (&f)[E]) {
    if constexpr (E == 2) {
        const float2 u = *reinterpret_cast<const float2 *>(p);
        f[0] = u.x, f[1] = u.y;
    } else {
#pragma unroll
        for (int i = 0; i < E; i += 4) {
            const float4 u = *reinterpret_cast<const float4 *>(p + i);
            f[i] = u.x, f[i + 1] = u.y, f[i + 2] = u.z, f[i + 3] = u.w;
        }
    }
}
template <int E> static __device__ __forceinline__ void st_f32v(float *p, const float (&f)[E]) {
    if constexpr (E == 2) {
        *reinterpret_cast<float2 *>(p) = make_float2(f[0], f[1]);
    } else {
#pragma unroll
        for (int i = 0; i < E; i += 4)
            *reinterpret_cast<float4 *>(p + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
    }
}

// A cluster barrier in two halves: a block may write another's shared memory
// only once that one has started, which the arrive at the start and the wait
// before the first write ensure without holding anyone up (by then every
// block has long arrived).
static __device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// Dynamic shared memory: q, k [K], v, o [R] (the block's rows), 32 for
// block_reduce, the head's parts of the sum of squares [GS_CLUSTER_MAX], g
// and beta (gdn_step_smem). One block per SM in
// the bounds: the 8 x 8 state tile of <8, 8> spilled under a register cap of
// 128 (two blocks), and without a cap ptxas capped <8, 4> at 80 and spilled.
template <int E, int RW> __global__ void __launch_bounds__(GS_THREADS, 1) k_gdn_step(const gdn_step_args p) {
    extern __shared__ __align__(16) float gsm[];
    float *qs = gsm, *ks = qs + p.K, *vs = ks + p.K, *os = vs + p.R, *red = os + p.R, *part = red + 32,
          *gate = part + GS_CLUSTER_MAX;
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rank = (int)cl.block_rank(), x = blockIdx.y, r = blockIdx.z, K = p.K, Dv = p.Dv, W = p.W, N = p.N;
    const int h = x * (p.HV / p.H) + rank / p.S, v_lo = (rank % p.S) * p.R;
    const int nv = Dv - v_lo < p.R ? (Dv > v_lo ? Dv - v_lo : 0) : p.R; // this block's value rows
    cluster_arrive_relaxed();                                           // (this block has started; cluster_wait below)
    // Launched as a programmatic dependent launch (cuda_vec.cuh), the block
    // may run while the kernel before it (the step's input product) still
    // does. The state rows and conv windows it reads were written by earlier
    // steps, so it asks L2 for them now, as the decode products do their
    // weights; then waits. A hint only: nothing read here is used after.
    {
        const int64_t c0 = (int64_t)h * Dv + v_lo;
        block_prefetch_l2((const float *)p.rows[r] + c0 * K, (int64_t)nv * K * 4, tid, GS_THREADS);
        block_prefetch_l2((const bf16 *)p.rows[N + r] + (int64_t)x * K * W, (int64_t)K * W * 2, tid, GS_THREADS);
        block_prefetch_l2((const bf16 *)p.rows[2 * N + r] + (int64_t)x * K * W, (int64_t)K * W * 2, tid, GS_THREADS);
        block_prefetch_l2((const bf16 *)p.rows[3 * N + r] + c0 * W, (int64_t)nv * W * 2, tid, GS_THREADS);
    }
    griddep_enter();
    // the output norm's gain and gate of the thread's first value row, asked
    // for now: they are used after the cluster barrier, at the end
    const int64_t c0 = (int64_t)h * Dv + v_lo;
    const float gain0 = tid < nv ? bf2f(p.o_norm[v_lo + tid]) : 0.0f;
    const float gate0 = p.z && tid < nv ? dev_silu(bf2f(p.z[(int64_t)r * p.ldz + c0 + tid])) : 1.0f;

    // g, beta of value head h (gdn_gate_fwd)
    if (tid == 0) {
        gate[0] = -expf(bf2f(p.A_log[h])) * dev_softplus(bf2f(p.a[(int64_t)r * p.lda + h]) + bf2f(p.dt_bias[h]));
        gate[1] = p.beta_scale * dev_sigmoid(bf2f(p.b[(int64_t)r * p.ldb + h]));
    }
    // q, k: the whole head's conv (windows read, not rolled), SiLU, L2 norm
    bf16 *wq = (bf16 *)p.rows[N + r], *wk = (bf16 *)p.rows[2 * N + r], *wv = (bf16 *)p.rows[3 * N + r];
    const bf16 *xq = p.xq + (int64_t)r * p.ldq + (int64_t)x * K, *xk = p.xk + (int64_t)r * p.ldk + (int64_t)x * K;
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < K; i += GS_THREADS) {
        const int64_t c = (int64_t)x * K + i;
        const float fq = conv_out(wq + c * W, p.q_conv + c * W, xq[i], W);
        const float fk = conv_out(wk + c * W, p.k_conv + c * W, xk[i], W);
        qs[i] = fq, ks[i] = fk;
        sq += fq * fq, sk += fk * fk;
    }
    const float rq = 1.0f / sqrtf(block_reduce(sq, false, red) + p.l2_eps);
    const float rk = 1.0f / sqrtf(block_reduce(sk, false, red) + p.l2_eps);
    for (int i = tid; i < K; i += GS_THREADS) {
        qs[i] = bf2f(__float2bfloat16_rn(qs[i] * rq));
        ks[i] = bf2f(__float2bfloat16_rn(ks[i] * rk));
    }
    // v: the block's rows of head h, windows read and rolled
    for (int i = tid; i < nv; i += GS_THREADS)
        vs[i] = step_conv(wv + (c0 + i) * W, p.v_conv + (c0 + i) * W, p.xv[(int64_t)r * p.ldv + c0 + i], W);
    __syncthreads();

    // the rule on the block's rows (k_recurrent, T = 1): o rounded to bf16 into os
    float *st = (float *)p.rows[r] + c0 * K; // row v_lo of head h's state [Dv, K]
    const float alpha = expf(gate[0]), bt = gate[1];
    const int x0 = lane * E;
    const bool kval = x0 < K;
    float kk[E], qq[E];
    if (kval) {
        ld_f32v<E>(ks + x0, kk);
        ld_f32v<E>(qs + x0, qq);
    } else {
#pragma unroll
        for (int e = 0; e < E; e++)
            kk[e] = qq[e] = 0.0f;
    }
    for (int v0 = warp * RW; v0 < nv; v0 += GS_WARPS * RW) {
        float s[RW][E];
#pragma unroll
        for (int j = 0; j < RW; j++) {
            if (kval && v0 + j < nv) {
                ld_f32v<E>(st + (int64_t)(v0 + j) * K + x0, s[j]);
            } else {
#pragma unroll
                for (int e = 0; e < E; e++)
                    s[j][e] = 0.0f;
            }
        }
        float vv[RW];
#pragma unroll
        for (int j = 0; j < RW; j++)
            vv[j] = v0 + j < nv ? vs[v0 + j] : 0.0f;
        const float mine = delta_rule_rows<RW, E>(s, kk, qq, vv, alpha, bt, lane);
        if (lane < RW && v0 + lane < nv) os[v0 + lane] = bf2f(__float2bfloat16_rn(p.scale * mine));
#pragma unroll
        for (int j = 0; j < RW; j++)
            if (kval && v0 + j < nv) st_f32v<E>(st + (int64_t)(v0 + j) * K + x0, s[j]);
    }
    __syncthreads();

    // output norm over head h's Dv: the block's part, then its head's S parts
    float ss = 0.0f;
    for (int i = tid; i < nv; i += GS_THREADS)
        ss += os[i] * os[i];
    ss = block_reduce(ss, false, red);
    const int first = rank - rank % p.S; // the head's first block
    cluster_wait();                      // every block of the cluster has started
    if (tid < p.S) *cl.map_shared_rank(part + rank % p.S, first + tid) = ss;
    cl.sync(); // every part written everywhere, every block done reading the q and k windows
    float tot = 0.0f;
    for (int j = 0; j < p.S; j++)
        tot += part[j];
    const float rn = 1.0f / sqrtf(tot / (float)Dv + p.eps);
    const bf16 *zr = p.z ? p.z + (int64_t)r * p.ldz + c0 : nullptr;
    bf16 *yr = p.y + (int64_t)r * p.HV * Dv + c0;
    for (int i = tid; i < nv; i += GS_THREADS) {
        // the gate after the norm (GNORM_NORM_THEN_GATE)
        const float gn = i == tid ? gain0 : bf2f(p.o_norm[v_lo + i]);
        const float gz = i == tid ? gate0 : zr ? dev_silu(bf2f(zr[i])) : 1.0f;
        float f = os[i] * rn * gn;
        if (zr) f *= gz;
        yr[i] = __float2bfloat16_rn(f);
    }
    if (rank == 0)
        for (int i = tid; i < K; i += GS_THREADS) {
            const int64_t c = (int64_t)x * K + i;
            conv_roll(wq + c * W, xq[i], W);
            conv_roll(wk + c * W, xk[i], W);
        }
}

typedef void (*gdn_step_kern_t)(const gdn_step_args);

// The instance of k_gdn_step for K and a block's R rows: E = K / 32 values a
// lane, 8 rows a warp when a pass of 4 does not cover the rows.
static gdn_step_kern_t gdn_step_kernel(int K, int R) {
    const bool rw8 = R > 4 * GS_WARPS;
    if (K <= 64) return rw8 ? k_gdn_step<2, 8> : k_gdn_step<2, 4>;
    if (K <= 128) return rw8 ? k_gdn_step<4, 8> : k_gdn_step<4, 4>;
    return rw8 ? k_gdn_step<8, 8> : k_gdn_step<8, 4>;
}

// Slices of a value head in clusters of at most cs blocks: as many as the
// cluster holds, but each of a pass of 8 warps x 4 rows at least (smaller
// blocks would leave warps idle for no gain).
static int gdn_step_slices(int cs, int G, int Dv) {
    int S = cs / G;
    while (S > 1 && Dv / S < 4 * GS_WARPS)
        S /= 2;
    return S;
}

static size_t gdn_step_smem(int K, int R) { // the layout above k_gdn_step
    return ((size_t)2 * K + 2 * (size_t)R + 32 + GS_CLUSTER_MAX + 2) * sizeof(float);
}

// The shapes k_gdn_step does not take: the three ops' kernels, through
// temporaries in the scratch arena.
static void gdn_step_unfused(be_t *be, const gdn_step_args &p, int allow_neg) {
    const size_t mark = arena_mark(&be->scratch);
    const size_t N = (size_t)p.N, kd = (size_t)p.H * p.K, vd = (size_t)p.HV * p.Dv;
    bf16 *q = (bf16 *)cu_scratch_try(be, 2 * N * kd), *k = (bf16 *)cu_scratch_try(be, 2 * N * kd);
    bf16 *v = (bf16 *)cu_scratch_try(be, 2 * N * vd), *o = (bf16 *)cu_scratch_try(be, 2 * N * vd);
    float *g = (float *)cu_scratch_try(be, 4 * N * p.HV), *beta = (float *)cu_scratch_try(be, 4 * N * p.HV);
    if (!q || !k || !v || !o || !g || !beta) {
        arena_reset(&be->scratch, mark);
        cu_op_error(be, "cuda gdn_step: the scratch arena has no room for the %zu bytes of the unfused step",
                    cu_round256(2 * N * kd) * 2 + cu_round256(2 * N * vd) * 2 + cu_round256(4 * N * p.HV) * 2);
        gdn_poison(be, p.y, 2 * N * vd);
        return;
    }
    cu_gdn_step_inputs(be, q, k, v, g, beta, p.rows, p.xq, p.ldq, p.xk, p.ldk, p.xv, p.ldv, p.a, p.lda, p.b, p.ldb,
                       p.q_conv, p.k_conv, p.v_conv, p.A_log, p.dt_bias, p.N, p.H, p.HV, p.K, p.Dv, p.W, p.l2_eps,
                       allow_neg);
    gdn_recurrent(be, "gdn_step", o, NULL, (float *const *)p.rows, q, k, v, g, beta, p.scale, p.N, 1, p.H, p.HV, p.K,
                  p.Dv);
    if (p.z)
        be->gated_rmsnorm_fwd(be, p.y, NULL, o, p.z, p.ldz, p.o_norm, p.Dv, p.N, p.HV, p.Dv, p.eps,
                              GNORM_NORM_THEN_GATE);
    else
        be->rmsnorm_fwd(be, p.y, NULL, o, p.o_norm, (int64_t)p.N * p.HV, p.Dv, p.eps);
    arena_reset(&be->scratch, mark);
}

static void cu_gdn_step(be_t *be, void *y, void *const *rows, const void *xq, int64_t ldq, const void *xk, int64_t ldk,
                        const void *xv, int64_t ldv, const void *a, int64_t lda, const void *b, int64_t ldb,
                        const void *z, int64_t ldz, const void *q_conv, const void *k_conv, const void *v_conv,
                        const void *A_log, const void *dt_bias, const void *o_norm, float scale, int N, int H, int HV,
                        int K, int Dv, int W, float l2_eps, float eps, int allow_neg) {
    if (N < 1) return;
    if (H < 1 || HV < H || HV % H || K < 1 || Dv < 1 || W < 1 || N > 65535 || H > 65535) {
        cu_op_error(be, "cuda gdn_step: N=%d H=%d HV=%d K=%d Dv=%d W=%d not supported (HV a multiple of H, N <= 65535)",
                    N, H, HV, K, Dv, W);
        gdn_poison(be, y, (size_t)N * HV * Dv * 2);
        return;
    }
    gdn_step_args p;
    p.y = (bf16 *)y, p.rows = rows;
    p.xq = (const bf16 *)xq, p.xk = (const bf16 *)xk, p.xv = (const bf16 *)xv;
    p.a = (const bf16 *)a, p.b = (const bf16 *)b, p.z = (const bf16 *)z;
    p.ldq = ldq, p.ldk = ldk, p.ldv = ldv, p.lda = lda, p.ldb = ldb, p.ldz = ldz;
    p.q_conv = (const bf16 *)q_conv, p.k_conv = (const bf16 *)k_conv, p.v_conv = (const bf16 *)v_conv;
    p.A_log = (const bf16 *)A_log, p.dt_bias = (const bf16 *)dt_bias, p.o_norm = (const bf16 *)o_norm;
    p.scale = scale, p.l2_eps = l2_eps, p.eps = eps, p.beta_scale = allow_neg ? 2.0f : 1.0f;
    p.N = N, p.H = H, p.HV = HV, p.K = K, p.Dv = Dv, p.W = W, p.S = 1, p.R = Dv;
    const int G = HV / H;
    if (G > GS_CLUSTER || (G & (G - 1)) || K % 8 || K > 256) {
        gdn_step_unfused(be, p, allow_neg);
        return;
    }
    // 16 blocks a head (a non-portable cluster) where the step's clusters all
    // fit the device at once, else the portable 8
    const int S16 = gdn_step_slices(GS_CLUSTER_MAX, G, Dv), R16 = (Dv + S16 - 1) / S16;
    const bool big = G * S16 > GS_CLUSTER &&
                     cuda_clusters_fit_cached(be, (const void *)gdn_step_kernel(K, R16), "k_gdn_step", GS_THREADS,
                                              gdn_step_smem(K, R16), (int)(G * S16)) >= (int64_t)H * N;
    p.S = big ? S16 : gdn_step_slices(GS_CLUSTER, G, Dv);
#ifdef HYLO_BENCH_VARIANTS
    // bench-only: HYLO_GDN_STEP = 1 runs the three kernels; HYLO_GDN_SLICES = S
    // (a power of two, G S <= 16) sets the slices of a value head, to see
    // what a block's rows cost
    if (cu_env_int("HYLO_GDN_STEP", 0) == 1) {
        gdn_step_unfused(be, p, allow_neg);
        return;
    }
    const int forced = cu_env_int("HYLO_GDN_SLICES", 0);
    if (forced > 0 && !(forced & (forced - 1)) && G * forced <= GS_CLUSTER_MAX) p.S = forced;
#endif
    p.R = (Dv + p.S - 1) / p.S;
    const unsigned cs = (unsigned)(G * p.S);
    const gdn_step_kern_t kern = gdn_step_kernel(K, p.R);
    const size_t smem = gdn_step_smem(K, p.R);
    if (cuda_smem_limit(be, (const void *)kern, smem, "k_gdn_step") < 0) return;
    if (cs > GS_CLUSTER && cuda_clusters_fit_cached(be, (const void *)kern, "k_gdn_step", GS_THREADS, smem, (int)cs) <
                               1) { // (the bench-only knob past what fits)
        cu_op_error(be, "cuda gdn_step: clusters of %u blocks do not fit this device", cs);
        gdn_poison(be, y, (size_t)N * HV * Dv * 2);
        return;
    }
    cu_launch_pdl_cluster(kern, dim3(cs, (unsigned)H, (unsigned)N), dim3(GS_THREADS), dim3(cs, 1, 1), smem,
                          cuda_stream(be), p);
    cuda_check_launch(be, "gdn k_gdn_step");
}

static void cu_gdn_gate_fwd(be_t *be, float *g, float *beta, const void *a, int64_t lda, const void *b, int64_t ldb,
                            const void *A_log, const void *dt_bias, int64_t N, int HV, int allow_neg) {
    if (N < 1 || HV < 1) return;
    auto kfn = k_gate_fwd;
    kfn<<<dim3(cu_grid(be, N * HV, 256)), dim3(256), 0, cuda_stream(be)>>>(
        g, beta, (const bf16 *)a, lda, (const bf16 *)b, ldb, (const bf16 *)A_log, (const bf16 *)dt_bias, N, HV,
        allow_neg ? 2.0f : 1.0f);
    cuda_check_launch(be, "gdn k_gate_fwd");
}

// dA_log, ddt_bias: per (block of rows, head) partial sums in double, then a
// fixed-order sum per head. The number of row blocks depends on N only, so
// the result does not depend on the device or on timing.
static void cu_gdn_gate_bwd(be_t *be, void *da, int64_t ldda, void *db, int64_t lddb, float *dA_log, float *ddt_bias,
                            const float *dg, const float *dbeta, const void *a, int64_t lda, const void *b, int64_t ldb,
                            const void *A_log, const void *dt_bias, int64_t N, int HV, int allow_neg) {
    if (N < 1 || HV < 1) return;
    int64_t nblk = (N + 2047) / 2048;
    if (nblk > 256) nblk = 256;
    const int64_t R = (N + nblk - 1) / nblk;
    const size_t mark = arena_mark(&be->scratch);
    double *part = (double *)cu_scratch_try(be, (size_t)HV * nblk * 2 * sizeof(double));
    if (!part) {
        cu_op_error(be, "gdn_gate_bwd: scratch arena too small for %zu bytes of partial sums",
                    (size_t)HV * nblk * 2 * sizeof(double));
        return;
    }
    auto k1 = k_gate_bwd1;
    k1<<<dim3((unsigned)nblk, (unsigned)HV), dim3(GATE_THREADS), 2 * GATE_THREADS * sizeof(double), cuda_stream(be)>>>(
        (bf16 *)da, ldda, (bf16 *)db, lddb, part, dg, dbeta, (const bf16 *)a, lda, (const bf16 *)b, ldb,
        (const bf16 *)A_log, (const bf16 *)dt_bias, N, HV, allow_neg ? 2.0f : 1.0f, R);
    cuda_check_launch(be, "gdn k_gate_bwd1");
    auto k2 = k_gate_bwd2;
    k2<<<dim3((unsigned)((HV + 63) / 64)), dim3(64), 0, cuda_stream(be)>>>(dA_log, ddt_bias, (const double *)part,
                                                                           (int)nblk, HV);
    cuda_check_launch(be, "gdn k_gate_bwd2");
    arena_reset(&be->scratch, mark);
}

extern "C" void cuda_register_gdn(be_t *be) {
    be->gdn_gate_fwd = cu_gdn_gate_fwd;
    be->gdn_gate_bwd = cu_gdn_gate_bwd;
    be->gdn_chunk_fwd = cu_gdn_chunk_fwd;
    be->gdn_chunk_seqs = cu_gdn_chunk_seqs;
    be->gdn_chunk_bwd = cu_gdn_chunk_bwd;
    be->gdn_recurrent_fwd = cu_gdn_recurrent_fwd;
    be->gdn_recurrent_step = cu_gdn_recurrent_step;
    be->gdn_step_inputs = cu_gdn_step_inputs;
    be->gdn_step = cu_gdn_step;
}
