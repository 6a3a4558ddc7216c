// Causal flash attention (forward and backward) on tensor cores: mma.sync
// m16n8k16 bf16 -> fp32, operands staged in shared memory by cp.async (two
// buffers: the next tile loads while the current one is multiplied) and read
// with ldmatrix. Rows in shared memory are padded by 16 bytes so that the 8 rows
// an ldmatrix phase reads fall in 8 distinct bank groups (conflict-free).
//
// Forward (FA2): one block per (query tile of BR = 16 * MT * WARPS rows, b, h);
// each warp owns 16 * MT query rows, keeps O in fp32 registers, and walks the
// key tiles up to the causal limit (or all of them, causal = 0) with an online
// softmax (exp2 domain). P is rounded to bf16 for the P V product. lse = m +
// log(l) per row. k_attn_merge combines two such results over disjoint keys.
//
// Backward v2 (k_attn_bwd2, the default for head dims 65..128): the FA2
// partition of the S / dP, dK / dV and dQ products across warps, with P and dS
// staged in shared memory; described at the kernel.
//
// Backward v1 (FA2): D = rowsum(dO * O) and lse * log2(e) are precomputed. One
// block per (key tile of BN = 16 * WARPS rows, b, kv head): each warp owns 16
// key rows and keeps their dK, dV in fp32 registers while it loops over every
// query head of the group and every causally visible query tile, recomputing
// S^T = K Q^T and P^T from lse, so the GQA reduction over the heads sharing a
// kv head happens in registers. dQ = dS K is reduced across the block's warps
// through shared memory and added to an fp32 accumulator in the scratch arena
// with vector atomics (red.global.add.v2.f32); a last kernel scales it to bf16.
// Under be->deterministic the key tiles add in turn (dq_turn_wait), so the sum
// is the same on every run. When dqk + dv is too large for registers the block computes a column slice
// of dK / dV / dQ (NSL slices, each recomputing S and dP).
//
// Head dims: kernels are instantiated for padded (DQK, DV) pairs; any dqk, dv
// that are multiples of 16 up to 256 run on the smallest pair that holds them
// (columns past the true size are zero-filled on load and never stored).
#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_vec.cuh"

// ---- device helpers ---------------------------------------------------------

static __device__ __forceinline__ void red_add_v2(float *p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// Deterministic dQ (be->deterministic): the key tiles that add into one (query
// tile, head, column slice) take turns in key-tile order, so its fp32 sum is
// always formed in the same order. Tile jt waits until *turn == jt (tiles 0 ..
// jt - 1 have added: every key tile before one that reaches a query tile
// reaches it too), adds, then counts itself. Those tiles come earlier in the
// grid (blockIdx = key tile slowest), so they have run or are running and the
// wait ends. All threads of the block call both.
static __device__ __forceinline__ void dq_turn_wait(const int *turn, int jt) {
    if (threadIdx.x == 0) {
        int seen;
        do {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
        } while (seen < jt);
    }
    __syncthreads();
}
static __device__ __forceinline__ void dq_turn_done(int *turn) {
    __threadfence(); // this thread's adds are performed before the count
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(turn, 1);
}

// Copies rows [row0, row0 + ROWS) x columns [0, D) of a global matrix (row
// stride gs elements) into shared memory (row stride ss). Rows >= nrows and
// columns >= d are zero-filled.
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void load_tile(bf16 *s, int ss, const bf16 *g, int64_t gs, int row0, int nrows, int d,
                                                 int tid) {
    constexpr int CH = D / 8, TOTAL = ROWS * CH, ITERS = (TOTAL + NT - 1) / NT;
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
        int i = tid + it * NT;
        if (TOTAL % NT == 0 || i < TOTAL) {
            int r = i / CH, c = i - r * CH;
            bool ok = row0 + r < nrows && c * 8 < d;
            const bf16 *src = ok ? g + (int64_t)(row0 + r) * gs + c * 8 : g;
            cp_async16(smem_u32(s + r * ss + c * 8), src, ok);
        }
    }
}

// ---- forward ----------------------------------------------------------------

// Each warp owns MT m16 tiles (16 * MT query rows): every K / V fragment read
// from shared memory feeds MT products, which halves the shared-memory traffic
// per FLOP at MT = 2 (at MT = 1 the loop is bound by ldmatrix bandwidth).
template <int DQK, int DV, int WARPS, int BC, int MT> struct fwd_cfg {
    static constexpr int BR = 16 * MT * WARPS, NT = 32 * WARPS;
    static constexpr int SQ = DQK + 8, SV = DV + 8; // padded row strides (elements)
    static constexpr size_t smem = sizeof(bf16) * ((size_t)BR * SQ + 2 * (size_t)BC * SQ + 2 * (size_t)BC * SV);
};

// Grid: n_qt * B * H blocks, the heaviest query tiles (the last ones) first.
// causal 0: every key visible to every row (only keys >= Tk are masked).
template <int DQK, int DV, int WARPS, int BC, int MT, bool QREG, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    k_attn_fwd(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q, const bf16 *__restrict__ k,
               const bf16 *__restrict__ v, int B, int Tq, int Tk, int H, int Hkv, int dqk, int dv, float sl2, int n_qt,
               int causal) {
    typedef fwd_cfg<DQK, DV, WARPS, BC, MT> C;
    constexpr int BR = C::BR, NT = C::NT, SQ = C::SQ, SV = C::SV;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sQ = (bf16 *)smem_raw;
    bf16 *sK = sQ + BR * SQ;
    bf16 *sV = sK + 2 * BC * SQ;

    const int BH = B * H;
    const int bh = blockIdx.x % BH, qt = n_qt - 1 - blockIdx.x / BH;
    const int b = bh / H, h = bh - b * H, hk = h / (H / Hkv);
    const int q0 = qt * BR, off = Tk - Tq;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t qs = (int64_t)H * dqk, ks = (int64_t)Hkv * dqk, vs = (int64_t)Hkv * dv;
    const bf16 *qb = q + (int64_t)b * Tq * qs + (int64_t)h * dqk;
    const bf16 *kb = k + (int64_t)b * Tk * ks + (int64_t)hk * dqk;
    const bf16 *vb = v + (int64_t)b * Tk * vs + (int64_t)hk * dv;

    // keys [0, kv_end) are visible to at least one valid query row of the block
    const int q_last = min(q0 + BR, Tq) - 1;
    const int kv_end = causal ? off + q_last + 1 : Tk;
    const int n_kv = (kv_end + BC - 1) / BC;

    load_tile<BR, DQK, NT>(sQ, SQ, qb, qs, q0, Tq, dqk, tid);
    load_tile<BC, DQK, NT>(sK, SQ, kb, ks, 0, Tk, dqk, tid);
    load_tile<BC, DV, NT>(sV, SV, vb, vs, 0, Tk, dv, tid);
    cp_async_commit();

    // Per-lane ldmatrix offsets (bytes). A operand (row-major 16x16): rows
    // lane&15, column half lane>>4. B operand from [n][k] rows (K): rows
    // (lane&7) + 8*(lane>>4), column half (lane>>3)&1. B from [k][n] rows via
    // .trans (V): like A.
    const int wrow0 = q0 + warp * 16 * MT; // first query row of this warp
    const uint32_t aQ = smem_u32(sQ) + (uint32_t)(((warp * 16 * MT + (lane & 15)) * SQ + (lane >> 4) * 8) * 2);
    const uint32_t offB_k = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SQ + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t offT_v = (uint32_t)(((lane & 15) * SV + (lane >> 4) * 8) * 2);

    uint32_t qf[QREG ? MT : 1][QREG ? DQK / 16 : 1][4];
    float o[MT][DV / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DV / 8; i++)
            o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        mrow[mt][0] = mrow[mt][1] = -INFINITY, lrow[mt][0] = lrow[mt][1] = 0.f;

    for (int j = 0; j < n_kv; j++) {
        cp_async_wait<0>();
        __syncthreads(); // tile j visible to all; everyone is done with tile j-1's buffer
        if (j + 1 < n_kv) {
            int nb = (j + 1) & 1;
            load_tile<BC, DQK, NT>(sK + nb * BC * SQ, SQ, kb, ks, (j + 1) * BC, Tk, dqk, tid);
            load_tile<BC, DV, NT>(sV + nb * BC * SV, SV, vb, vs, (j + 1) * BC, Tk, dv, tid);
            cp_async_commit();
        }
        if (QREG && j == 0) {
#pragma unroll
            for (int mt = 0; mt < (QREG ? MT : 1); mt++)
#pragma unroll
                for (int kk = 0; kk < (QREG ? DQK / 16 : 1); kk++)
                    ldsm_x4(qf[mt][kk], aQ + (mt * 16 * SQ + kk * 16) * 2);
        }
        const int n0 = j * BC;
        if (causal && n0 > off + wrow0 + 16 * MT - 1) continue; // no key of this tile is visible to this warp's rows
        const uint32_t bK = smem_u32(sK + (j & 1) * BC * SQ) + offB_k;
        const uint32_t bV = smem_u32(sV + (j & 1) * BC * SV) + offT_v;

        // S = Q K^T (16 MT x BC per warp)
        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BC / 8; i++)
                s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (QREG) {
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        a[mt][r] = qf[QREG ? mt : 0][QREG ? kk : 0][r];
                } else {
                    ldsm_x4(a[mt], aQ + (mt * 16 * SQ + kk * 16) * 2);
                }
            }
#pragma unroll
            for (int n2 = 0; n2 < BC / 16; n2++) {
                uint32_t bb[4];
                ldsm_x4(bb, bK + (n2 * 16 * SQ + kk * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * n2], a[mt], bb[0], bb[1]);
                    mma_bf16(s[mt][2 * n2 + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
        // causal mask (also hides keys >= Tk from valid rows: off + row <= Tk - 1);
        // without it only the keys >= Tk of the last tile (zero-filled rows)
        if (causal ? n0 + BC - 1 > off + wrow0 : n0 + BC > Tk) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int col = n0 + nt * 8 + 2 * t4 + (e & 1), row = wrow0 + mt * 16 + g + (e >> 1) * 8;
                        if (col > (causal ? off + row : Tk - 1)) s[mt][nt][e] = -INFINITY;
                    }
        }
        // online softmax; rows g (i = 0) and g + 8 (i = 1) of each m-tile; a row is spread over a quad
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mnew = fmaxf(mrow[mt][i], mx * sl2); // sl2 > 0 (checked on the host)
                float mu = mnew == -INFINITY ? 0.f : mnew;
                float alpha = exp2_approx(mrow[mt][i] - mu);
                mrow[mt][i] = mnew;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++) {
                    float p0 = exp2_approx(fmaf(s[mt][nt][2 * i], sl2, -mu));
                    float p1 = exp2_approx(fmaf(s[mt][nt][2 * i + 1], sl2, -mu));
                    s[mt][nt][2 * i] = p0, s[mt][nt][2 * i + 1] = p1;
                    rs += p0 + p1;
                }
                lrow[mt][i] = lrow[mt][i] * alpha + rs; // per-thread partial sum; reduced over the quad at the end
#pragma unroll
                for (int nt = 0; nt < DV / 8; nt++)
                    o[mt][nt][2 * i] *= alpha, o[mt][nt][2 * i + 1] *= alpha;
            }
            // O += P V: the S accumulators of n-tiles 2kc, 2kc+1 are the A fragment of k-chunk kc
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack_bf16(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                a[mt][1] = pack_bf16(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                a[mt][2] = pack_bf16(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                a[mt][3] = pack_bf16(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
#pragma unroll
            for (int d2 = 0; d2 < DV / 16; d2++) {
                uint32_t bb[4];
                ldsm_x4_t(bb, bV + (kc * 16 * SV + d2 * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(o[mt][2 * d2], a[mt], bb[0], bb[1]);
                    mma_bf16(o[mt][2 * d2 + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
    }

    cp_async_wait<0>(); // the first tile's loads are still in flight when there was no key tile (Tk = 0)
    // epilogue: O / l -> bf16; lse = (m + log2 l) * ln 2
    const int64_t os = (int64_t)H * dv;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float l = quad_sum(lrow[mt][i]);
            int row = wrow0 + mt * 16 + g + 8 * i;
            if (row >= Tq) continue;
            float inv = l > 0.f ? 1.f / l : 0.f;
            bf16 *orow = out + ((int64_t)b * Tq + row) * os + (int64_t)h * dv;
#pragma unroll
            for (int nt = 0; nt < DV / 8; nt++) {
                int c = nt * 8 + 2 * t4;
                if (c < dv) *(uint32_t *)(orow + c) = pack_bf16(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
            }
            if (lse && t4 == 0)
                lse[((int64_t)b * H + h) * Tq + row] = (mrow[mt][i] + __log2f(l)) * 0.69314718055994531f;
        }
}

// (acc, lse) += (out_i, lse_i) by the log-sum-exp rule (backend.h attn_merge):
// one warp per (b, t, h) row, fp32 arithmetic and fp32 acc, out (if any) acc
// rounded to bf16. dv is even (a multiple of 16), so each lane takes pairs.
__global__ void k_attn_merge(float *__restrict__ acc, float *__restrict__ lse, const bf16 *__restrict__ out_i,
                             const float *__restrict__ lse_i, bf16 *__restrict__ out, int first, int Tq, int H, int dv,
                             int64_t rows) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; // row (b, t, h) of acc
    int lane = threadIdx.x & 31;
    if (w >= rows) return;
    int h = (int)(w % H);
    int64_t bt = w / H, b = bt / Tq, t = bt - b * Tq, li = (b * H + h) * Tq + t;
    float la = first ? -INFINITY : lse[li], lb = lse_i[li], m = fmaxf(la, lb);
    float wa = 0.f, wb = 0.f, lnew = -INFINITY;
    if (m != -INFINITY) { // else neither set has a key: acc 0
        wa = __expf(la - m), wb = __expf(lb - m);
        float s = wa + wb;
        lnew = m + __logf(s);
        wa /= s, wb /= s;
    }
    float2 *a2 = (float2 *)(acc + w * dv);
    const __nv_bfloat162 *i2 = (const __nv_bfloat162 *)(out_i + w * dv);
    __nv_bfloat162 *o2 = out ? (__nv_bfloat162 *)(out + w * dv) : NULL;
    for (int c = lane; c < dv / 2; c += 32) {
        float2 a = wa > 0.f ? a2[c] : make_float2(0.f, 0.f); // a side of weight 0 is not read
        float2 x = wb > 0.f ? __bfloat1622float2(i2[c]) : make_float2(0.f, 0.f);
        float2 r = make_float2(wa * a.x + wb * x.x, wa * a.y + wb * x.y);
        a2[c] = r;
        if (o2) o2[c] = __floats2bfloat162_rn(r.x, r.y);
    }
    if (lane == 0) lse[li] = lnew;
}

// ---- backward ---------------------------------------------------------------

// D[bh, t] = sum_c dO[b,t,h,c] O[b,t,h,c] and lse2 = lse * log2(e), both laid out
// [B*H, Tqp] (Tqp = Tq rounded up to 64, zeros past Tq) so a query tile's
// values load as aligned 16-byte chunks. One warp per (bh, t).
__global__ void k_attn_bwd_pre(float *__restrict__ Dd, float *__restrict__ lse2, const bf16 *__restrict__ dout,
                               const bf16 *__restrict__ out, const float *__restrict__ lse, int BH, int H, int Tq,
                               int Tqp, int dv) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (int64_t)BH * Tqp) return;
    int bh = (int)(w / Tqp), t = (int)(w - (int64_t)bh * Tqp);
    float s = 0.f;
    if (t < Tq) {
        int b = bh / H, h = bh - b * H;
        int64_t base = (((int64_t)b * Tq + t) * H + h) * dv;
        for (int c = lane * 8; c < dv; c += 256) {
            uint4 x = *(const uint4 *)(dout + base + c), y = *(const uint4 *)(out + base + c);
            const __nv_bfloat162 *xa = (const __nv_bfloat162 *)&x, *ya = (const __nv_bfloat162 *)&y;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 xf = __bfloat1622float2(xa[e]), yf = __bfloat1622float2(ya[e]);
                s += xf.x * yf.x + xf.y * yf.y;
            }
        }
        s = warp_sum(s);
    }
    if (lane == 0) {
        Dd[w] = s;
        lse2[w] = t < Tq ? lse[(int64_t)bh * Tq + t] * 1.4426950408889634f : 0.f;
    }
}

template <int DQK, int DV, int NSL, int WARPS, int BM> struct bwd_cfg {
    static constexpr int BN = 16 * WARPS, NT = 32 * WARPS;
    static constexpr int SK = DQK / NSL, SVS = DV / NSL; // column slice of dK / dQ and of dV
    static constexpr int SQ = DQK + 8, SV = DV + 8, SS = BM + 8;
    static constexpr size_t smem = sizeof(bf16) * ((size_t)BN * SQ + (size_t)BN * SV + 2 * (size_t)BM * SQ +
                                                   2 * (size_t)BM * SV + (size_t)BN * SS) +
                                   sizeof(float) * 4 * BM;
};

// Grid: n_kt * n_units * NSL blocks, key tile slowest (tile 0, the heaviest,
// first). unit = (b, kv head) = u0 + local index; dqacc is [n_units * grp, Tq, dqk].
template <int DQK, int DV, int NSL, int WARPS, int BM>
__global__ void __launch_bounds__(WARPS * 32, 1)
    k_attn_bwd(bf16 *__restrict__ dk, bf16 *__restrict__ dvo, float *__restrict__ dqacc, const bf16 *__restrict__ dout,
               const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
               const float *__restrict__ lse2, const float *__restrict__ Dd, int Tq, int Tk, int H, int Hkv, int dqk,
               int dv, float sl2, float scale, int u0, int n_units, int Tqp, int *dq_turns) {
    typedef bwd_cfg<DQK, DV, NSL, WARPS, BM> C;
    constexpr int BN = C::BN, NT = C::NT, SK = C::SK, SVS = C::SVS, SQ = C::SQ, SV = C::SV, SS = C::SS;
    constexpr bool KVREG = DQK + DV <= 160; // keep the warp's K and V rows (A operands) in registers
    constexpr int MTQ = BM / 16;            // m16 tiles of the dQ tile
    constexpr int WPM = WARPS / MTQ;        // warps per m16 tile in the dQ product
    constexpr int NQ = SK / 8 / WPM;        // n8 tiles of dQ per warp
    static_assert(WARPS % MTQ == 0 && (SK / 8) % WPM == 0 && NQ % 2 == 0, "dQ warp partition");
    static_assert(DQK % NSL == 0 && DV % NSL == 0 && SK % 16 == 0 && SVS % 16 == 0, "slices");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw;
    bf16 *sV = sK + BN * SQ;
    bf16 *sQ = sV + BN * SV;              // [2][BM][SQ]
    bf16 *sdO = sQ + 2 * BM * SQ;         // [2][BM][SV]
    bf16 *sdS = sdO + 2 * BM * SV;        // [BN][SS]: dS^T, key rows
    float *sL = (float *)(sdS + BN * SS); // [2][BM] lse * log2 e
    float *sD = sL + 2 * BM;              // [2][BM]

    const int per = n_units * NSL;
    const int jt = blockIdx.x / per, rem = blockIdx.x - jt * per;
    const int ul = rem / NSL, sl = rem - ul * NSL;
    const int u = u0 + ul, b = u / Hkv, hk = u - b * Hkv, grp = H / Hkv;
    const int n0 = jt * BN, off = Tk - Tq;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t qs = (int64_t)H * dqk, ks = (int64_t)Hkv * dqk, vs = (int64_t)Hkv * dv, os = (int64_t)H * dv;
    const bf16 *kb = k + (int64_t)b * Tk * ks + (int64_t)hk * dqk;
    const bf16 *vb = v + (int64_t)b * Tk * vs + (int64_t)hk * dv;

    // query tiles that see at least one key of this tile: t >= n0 - off
    const int mt0 = max(0, n0 - off) / BM;
    const int n_mt = (Tq + BM - 1) / BM;
    const int per_head = n_mt > mt0 ? n_mt - mt0 : 0;
    const int n_it = grp * per_head;

    load_tile<BN, DQK, NT>(sK, SQ, kb, ks, n0, Tk, dqk, tid);
    load_tile<BN, DV, NT>(sV, SV, vb, vs, n0, Tk, dv, tid);
    // stage `it` of the flattened (head, query tile) loop into buffer `buf`
    auto load_stage = [&](int it, int buf) {
        int hh = it / per_head, mt = mt0 + (it - hh * per_head), h = hk * grp + hh;
        int m0 = mt * BM;
        load_tile<BM, DQK, NT>(sQ + buf * BM * SQ, SQ, q + (int64_t)b * Tq * qs + (int64_t)h * dqk, qs, m0, Tq, dqk,
                               tid);
        load_tile<BM, DV, NT>(sdO + buf * BM * SV, SV, dout + (int64_t)b * Tq * os + (int64_t)h * dv, os, m0, Tq, dv,
                              tid);
        const float *l2 = lse2 + ((int64_t)b * H + h) * Tqp + m0, *dd = Dd + ((int64_t)b * H + h) * Tqp + m0;
        if (tid < BM / 2) { // BM/4 chunks of lse2, then BM/4 of D (m0 + BM <= Tqp)
            int c = tid % (BM / 4);
            const float *src = tid < BM / 4 ? l2 : dd;
            float *dst = (tid < BM / 4 ? sL : sD) + buf * BM;
            cp_async16(smem_u32(dst + c * 4), src + c * 4, true);
        }
    };
    if (n_it > 0) load_stage(0, 0);
    cp_async_commit();

    // A operand rows of this warp (K or V rows warp*16 + (lane&15)), column half lane>>4
    const uint32_t aK = smem_u32(sK) + (uint32_t)(((warp * 16 + (lane & 15)) * SQ + (lane >> 4) * 8) * 2);
    const uint32_t aV = smem_u32(sV) + (uint32_t)(((warp * 16 + (lane & 15)) * SV + (lane >> 4) * 8) * 2);
    // B operand from [n][k] rows (Q, dO as the n side of S^T, dP^T)
    const uint32_t oBq = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SQ + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t oBo = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SV + ((lane >> 3) & 1) * 8) * 2);
    // B operand from [k][n] rows via .trans (Q, dO as the k side of dK, dV; K in dQ)
    const uint32_t oTq = (uint32_t)(((lane & 15) * SQ + (lane >> 4) * 8) * 2);
    const uint32_t oTo = (uint32_t)(((lane & 15) * SV + (lane >> 4) * 8) * 2);
    // dQ: A = dS from dS^T rows via .trans
    const int mq = warp % MTQ, nq0 = (warp / MTQ) * NQ;
    const uint32_t aS =
        smem_u32(sdS) + (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SS + mq * 16 + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t bKq = smem_u32(sK) + oTq + (uint32_t)((sl * SK + nq0 * 8) * 2);

    uint32_t kf[KVREG ? DQK / 16 : 1][4], vf[KVREG ? DV / 16 : 1][4];
    float dka[SK / 8][4], dva[SVS / 8][4];
#pragma unroll
    for (int i = 0; i < SK / 8; i++)
        dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < SVS / 8; i++)
        dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.f;
    const int wn0 = n0 + warp * 16; // first key row of this warp

    for (int it = 0; it < n_it; it++) {
        cp_async_wait<0>();
        __syncthreads(); // stage it landed; everyone is done with stage it-1 and with sdS
        if (it + 1 < n_it) {
            load_stage(it + 1, (it + 1) & 1);
            cp_async_commit();
        }
        if (KVREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KVREG ? DQK / 16 : 1); kk++)
                ldsm_x4(kf[kk], aK + kk * 32);
#pragma unroll
            for (int kk = 0; kk < (KVREG ? DV / 16 : 1); kk++)
                ldsm_x4(vf[kk], aV + kk * 32);
        }
        const int buf = it & 1;
        const int hh = it / per_head, mt = mt0 + (it - hh * per_head), m0 = mt * BM;
        const int q_last = min(m0 + BM, Tq) - 1;
        const bool active = wn0 <= off + q_last; // some query of the tile sees this warp's first key
        const uint32_t bQ = smem_u32(sQ + buf * BM * SQ), bO = smem_u32(sdO + buf * BM * SV);
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;

        if (active) {
            // S^T = K_w Q^T and dP^T = V_w dO^T (16 keys x BM queries)
            float st[BM / 8][4], dp[BM / 8][4];
#pragma unroll
            for (int i = 0; i < BM / 8; i++)
                st[i][0] = st[i][1] = st[i][2] = st[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++) {
                uint32_t a[4];
                if (KVREG) {
                    a[0] = kf[KVREG ? kk : 0][0], a[1] = kf[KVREG ? kk : 0][1];
                    a[2] = kf[KVREG ? kk : 0][2], a[3] = kf[KVREG ? kk : 0][3];
                } else {
                    ldsm_x4(a, aK + kk * 32);
                }
#pragma unroll
                for (int m2 = 0; m2 < BM / 16; m2++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bQ + oBq + (m2 * 16 * SQ + kk * 16) * 2);
                    mma_bf16(st[2 * m2], a, bb[0], bb[1]);
                    mma_bf16(st[2 * m2 + 1], a, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < DV / 16; kk++) {
                uint32_t a[4];
                if (KVREG) {
                    a[0] = vf[KVREG ? kk : 0][0], a[1] = vf[KVREG ? kk : 0][1];
                    a[2] = vf[KVREG ? kk : 0][2], a[3] = vf[KVREG ? kk : 0][3];
                } else {
                    ldsm_x4(a, aV + kk * 32);
                }
#pragma unroll
                for (int m2 = 0; m2 < BM / 16; m2++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, bO + oBo + (m2 * 16 * SV + kk * 16) * 2);
                    mma_bf16(dp[2 * m2], a, bb[0], bb[1]);
                    mma_bf16(dp[2 * m2 + 1], a, bb[2], bb[3]);
                }
            }
            // P^T = exp2(S^T sl2 - lse2[m]), masked; dS^T = P^T (dP^T - D[m]) (into dp)
            const bool need_mask = wn0 + 15 > off + m0 || m0 + BM > Tq;
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
                int mc = nt * 8 + 2 * t4; // query column within the tile
                float l0 = cL[mc], l1 = cL[mc + 1], d0 = cD[mc], d1 = cD[mc + 1];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2_approx(fmaf(st[nt][e], sl2, -((e & 1) ? l1 : l0)));
                    if (need_mask) {
                        int key = wn0 + g + (e >> 1) * 8, qr = m0 + mc + (e & 1);
                        if (key > off + qr || qr >= Tq) p = 0.f;
                    }
                    st[nt][e] = p;
                    dp[nt][e] = p * (dp[nt][e] - ((e & 1) ? d1 : d0));
                }
            }
            // dV[:, slice] += P^T dO[:, slice]; dK[:, slice] += dS^T Q[:, slice] (unscaled)
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++) {
                uint32_t a[4] = {pack_bf16(st[2 * kc][0], st[2 * kc][1]), pack_bf16(st[2 * kc][2], st[2 * kc][3]),
                                 pack_bf16(st[2 * kc + 1][0], st[2 * kc + 1][1]),
                                 pack_bf16(st[2 * kc + 1][2], st[2 * kc + 1][3])};
#pragma unroll
                for (int d2 = 0; d2 < SVS / 16; d2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bO + oTo + (kc * 16 * SV + sl * SVS + d2 * 16) * 2);
                    mma_bf16(dva[2 * d2], a, bb[0], bb[1]);
                    mma_bf16(dva[2 * d2 + 1], a, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int kc = 0; kc < BM / 16; kc++) {
                uint32_t a[4] = {pack_bf16(dp[2 * kc][0], dp[2 * kc][1]), pack_bf16(dp[2 * kc][2], dp[2 * kc][3]),
                                 pack_bf16(dp[2 * kc + 1][0], dp[2 * kc + 1][1]),
                                 pack_bf16(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
#pragma unroll
                for (int d2 = 0; d2 < SK / 16; d2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bQ + oTq + (kc * 16 * SQ + sl * SK + d2 * 16) * 2);
                    mma_bf16(dka[2 * d2], a, bb[0], bb[1]);
                    mma_bf16(dka[2 * d2 + 1], a, bb[2], bb[3]);
                }
                // dS^T rows of this warp -> shared (bf16), the A operand of dQ = dS K
                *(uint32_t *)(sdS + (warp * 16 + g) * SS + kc * 16 + 2 * t4) = a[0];
                *(uint32_t *)(sdS + (warp * 16 + g + 8) * SS + kc * 16 + 2 * t4) = a[1];
                *(uint32_t *)(sdS + (warp * 16 + g) * SS + kc * 16 + 8 + 2 * t4) = a[2];
                *(uint32_t *)(sdS + (warp * 16 + g + 8) * SS + kc * 16 + 8 + 2 * t4) = a[3];
            }
        }
        __syncthreads(); // dS^T of all active warps in shared memory

        // dQ[m0.., slice] += dS K[:, slice]: contraction over the key rows of the
        // active warps (a prefix: earlier keys are visible to more queries)
        const int n_act = min(WARPS, (off + q_last - n0) / 16 + 1);
        float acc[NQ][4];
#pragma unroll
        for (int i = 0; i < NQ; i++)
            acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < WARPS; kc++) {
            if (kc < n_act) {
                uint32_t a[4];
                ldsm_x4_t(a, aS + kc * 16 * SS * 2);
#pragma unroll
                for (int n2 = 0; n2 < NQ / 2; n2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bKq + (kc * 16 * SQ + n2 * 16) * 2);
                    mma_bf16(acc[2 * n2], a, bb[0], bb[1]);
                    mma_bf16(acc[2 * n2 + 1], a, bb[2], bb[3]);
                }
            }
        }
        float *dqh = dqacc + (int64_t)(ul * grp + hh) * Tq * dqk;
        int *turn = dq_turns ? dq_turns + ((int64_t)(ul * grp + hh) * n_mt + mt) * NSL + sl : nullptr;
        if (turn) dq_turn_wait(turn, jt);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int row = m0 + mq * 16 + g + 8 * i;
            if (row < Tq) {
#pragma unroll
                for (int nt = 0; nt < NQ; nt++) {
                    int c = sl * SK + (nq0 + nt) * 8 + 2 * t4;
                    if (c < dqk) red_add_v2(dqh + (int64_t)row * dqk + c, acc[nt][2 * i], acc[nt][2 * i + 1]);
                }
            }
        }
        if (turn) dq_turn_done(turn);
    }

    cp_async_wait<0>(); // nothing may stay in flight at exit (n_it == 0 when Tq == 0)
    // epilogue: dK = scale * dS^T Q, dV = P^T dO -> bf16
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int key = wn0 + g + 8 * i;
        if (key >= Tk) continue;
        bf16 *dkr = dk + ((int64_t)b * Tk + key) * ks + (int64_t)hk * dqk;
        bf16 *dvr = dvo + ((int64_t)b * Tk + key) * vs + (int64_t)hk * dv;
#pragma unroll
        for (int nt = 0; nt < SK / 8; nt++) {
            int c = sl * SK + nt * 8 + 2 * t4;
            if (c < dqk) *(uint32_t *)(dkr + c) = pack_bf16(dka[nt][2 * i] * scale, dka[nt][2 * i + 1] * scale);
        }
#pragma unroll
        for (int nt = 0; nt < SVS / 8; nt++) {
            int c = sl * SVS + nt * 8 + 2 * t4;
            if (c < dv) *(uint32_t *)(dvr + c) = pack_bf16(dva[nt][2 * i], dva[nt][2 * i + 1]);
        }
    }
}

// ---- backward v2: tiles shared across warps (the default for d <= 128) -------
//
// Why: k_attn_bwd gives each warp 16 keys with all their dK / dV columns, so
// every warp reads the whole Q and dO tiles from shared memory for S^T, dP^T,
// dV and dK: at d = 128, BM = 32 that is ~110 bytes of ldmatrix traffic per
// (query, key) pair against ~2 mma-clocks of work, and shared memory (128 B per
// clock per SM) is the bound: ~190 of the ~276 ms of the 64K 128/128 backward.
// v2 (the FA2 partition, one block per 128-key tile, 8 warps, 64-query tiles):
//  - S = Q K^T and dP = dO V^T: warps 2 (queries) x 4 (keys), 32 x 32 each, so
//    each fragment read from shared memory feeds two mma instead of one;
//  - P and dS go to shared memory as bf16 (64 x 128 each);
//  - dV += P^T dO, dK += dS^T Q: warps 4 (keys) x 2 (columns), 32 keys x d/2
//    columns each, P^T / dS^T read with ldmatrix.trans;
//  - dQ = dS K: warps 2 (queries) x 4 (columns), 32 x d/4 each, added to the
//    fp32 accumulator with red.global.add.v2.f32 as before.
// ldmatrix traffic per pair at d = 128: S 16 + dP 16 + P/dS stores 4 + dV 12 +
// dK 12 + dQ 16 + tile loads 2 = ~78 bytes (-29%). Predicted for 64K 128/128:
// forward + backward 360 -> ~290-305 ms (0.94-0.99x SDPA); measured (run 7):
// 334.8 ms, 0.85x SDPA. At d = 64 no gain is expected (v1 holds K, V in registers there: ~48
// bytes per pair against v2's ~50), so v1 stays the default at d <= 64.
// Registers: dK, dV 2 x 32 x (d/2) / 32 = 64 + 64 floats, S, dP 32 + 32: 255,
// no spill at d = 128 (ptxas), 8 bytes at d = 64.
// Bench-only builds (HYLO_BENCH_VARIANTS) also run v2 at d = 64 and v1 at d = 128
// (cu_attn_bwd's variants).
template <int D> struct bwd2_cfg {
    static constexpr int BM = 64, BN = 128, WARPS = 8, NT = 256;
    static constexpr int SD = D + 8, SP = BN + 8; // padded row strides (elements)
    static constexpr size_t smem =
        sizeof(bf16) * ((size_t)2 * BN * SD + 4 * (size_t)BM * SD + 2 * (size_t)BM * SP) + sizeof(float) * 4 * BM;
};

// Grid: n_kt * n_units blocks, key tile slowest (tile 0, the heaviest, first);
// dqacc as for k_attn_bwd.
template <int D>
__global__ void __launch_bounds__(256, 1)
    k_attn_bwd2(bf16 *__restrict__ dk, bf16 *__restrict__ dvo, float *__restrict__ dqacc, const bf16 *__restrict__ dout,
                const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                const float *__restrict__ lse2, const float *__restrict__ Dd, int Tq, int Tk, int H, int Hkv, int dqk,
                int dv, float sl2, float scale, int u0, int n_units, int Tqp, int *dq_turns) {
    typedef bwd2_cfg<D> C;
    constexpr int BM = C::BM, BN = C::BN, NT = C::NT, SD = C::SD, SP = C::SP;
    constexpr int NKV = D / 2 / 8; // n8 tiles of a warp's dK / dV columns
    constexpr int NQ = D / 4 / 8;  // n8 tiles of a warp's dQ columns
    static_assert(NQ % 2 == 0 && NKV % 2 == 0, "column split");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw;
    bf16 *sV = sK + BN * SD;
    bf16 *sQ = sV + BN * SD;              // [2][BM][SD]
    bf16 *sdO = sQ + 2 * BM * SD;         // [2][BM][SD]
    bf16 *sP = sdO + 2 * BM * SD;         // [BM][SP] P (bf16), query rows
    bf16 *sdS = sP + BM * SP;             // [BM][SP] dS (bf16, unscaled), query rows
    float *sL = (float *)(sdS + BM * SP); // [2][BM] lse * log2 e
    float *sD = sL + 2 * BM;              // [2][BM]

    const int jt = blockIdx.x / n_units, ul = blockIdx.x - jt * n_units;
    const int u = u0 + ul, b = u / Hkv, hk = u - b * Hkv, grp = H / Hkv;
    const int n0 = jt * BN, off = Tk - Tq;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t qs = (int64_t)H * dqk, ks = (int64_t)Hkv * dqk, vs = (int64_t)Hkv * dv, os = (int64_t)H * dv;
    const bf16 *kb = k + (int64_t)b * Tk * ks + (int64_t)hk * dqk;
    const bf16 *vb = v + (int64_t)b * Tk * vs + (int64_t)hk * dv;

    const int mt0 = max(0, n0 - off) / BM;
    const int n_mt = (Tq + BM - 1) / BM;
    const int per_head = n_mt > mt0 ? n_mt - mt0 : 0;
    const int n_it = grp * per_head;

    load_tile<BN, D, NT>(sK, SD, kb, ks, n0, Tk, dqk, tid);
    load_tile<BN, D, NT>(sV, SD, vb, vs, n0, Tk, dv, tid);
    auto load_stage = [&](int it, int buf) {
        int hh = it / per_head, mt = mt0 + (it - hh * per_head), h = hk * grp + hh;
        int m0 = mt * BM;
        load_tile<BM, D, NT>(sQ + buf * BM * SD, SD, q + (int64_t)b * Tq * qs + (int64_t)h * dqk, qs, m0, Tq, dqk, tid);
        load_tile<BM, D, NT>(sdO + buf * BM * SD, SD, dout + (int64_t)b * Tq * os + (int64_t)h * dv, os, m0, Tq, dv,
                             tid);
        const float *l2 = lse2 + ((int64_t)b * H + h) * Tqp + m0, *dd = Dd + ((int64_t)b * H + h) * Tqp + m0;
        if (tid < BM / 2) { // BM/4 chunks of lse2, then BM/4 of D (m0 + BM <= Tqp)
            int c = tid % (BM / 4);
            const float *src = tid < BM / 4 ? l2 : dd;
            float *dst = (tid < BM / 4 ? sL : sD) + buf * BM;
            cp_async16(smem_u32(dst + c * 4), src + c * 4, true);
        }
    };
    if (n_it > 0) load_stage(0, 0);
    cp_async_commit();

    // warp roles: S / dP / dQ over (wm: 32 queries) x (wn: 32 keys or D/4 columns);
    // dK / dV over (wk: 32 keys) x (wd: D/2 columns)
    const int wm = warp >> 2, wn = warp & 3, wk = warp & 3, wd = warp >> 2;
    // ldmatrix lane offsets (bytes): A row-major; B from [n][k] rows; B / A^T from [k][n] rows via .trans
    const uint32_t oA = (uint32_t)(((lane & 15) * SD + (lane >> 4) * 8) * 2);
    const uint32_t oB = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SD + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t oT = (uint32_t)(((lane & 15) * SD + (lane >> 4) * 8) * 2);
    const uint32_t oAt = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SP + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t oAs = (uint32_t)(((lane & 15) * SP + (lane >> 4) * 8) * 2);
    const uint32_t aKs = smem_u32(sK) + oB + (uint32_t)(wn * 32 * SD * 2);   // K rows of S (B operand)
    const uint32_t aVs = smem_u32(sV) + oB + (uint32_t)(wn * 32 * SD * 2);   // V rows of dP
    const uint32_t aKq = smem_u32(sK) + oT + (uint32_t)(wn * (D / 4) * 2);   // K as [k][n] for dQ
    const uint32_t aPt = smem_u32(sP) + oAt + (uint32_t)(wk * 32 * 2);       // P^T (A) for dV
    const uint32_t aSt = smem_u32(sdS) + oAt + (uint32_t)(wk * 32 * 2);      // dS^T (A) for dK
    const uint32_t aSq = smem_u32(sdS) + oAs + (uint32_t)(wm * 32 * SP * 2); // dS (A) for dQ

    float dka[2][NKV][4], dva[2][NKV][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < NKV; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dka[mt][i][e] = dva[mt][i][e] = 0.f;
    const int wkey0 = n0 + wn * 32; // first key of this warp's S / dP sub-tile

    for (int it = 0; it < n_it; it++) {
        cp_async_wait<0>();
        __syncthreads(); // stage it landed; everyone is done with stage it-1, sP and sdS
        if (it + 1 < n_it) {
            load_stage(it + 1, (it + 1) & 1);
            cp_async_commit();
        }
        const int buf = it & 1;
        const int hh = it / per_head, mt_ = mt0 + (it - hh * per_head), m0 = mt_ * BM;
        const int q_last = min(m0 + BM, Tq) - 1;
        const uint32_t bQ = smem_u32(sQ + buf * BM * SD), bO = smem_u32(sdO + buf * BM * SD);
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;

        // ---- S, dP (32 queries x 32 keys per warp); P, dS -> shared
        const int wq0 = m0 + wm * 32;
        const bool vis = wkey0 <= off + min(wq0 + 31, q_last); // some pair of the sub-tile is visible
        if (vis) {
            float s[2][4][4], dp[2][4][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[mt][i][e] = dp[mt][i][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[2][4], bb[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4(a[mt], bQ + oA + ((wm * 32 + mt * 16) * SD + kk * 16) * 2);
#pragma unroll
                for (int n2 = 0; n2 < 2; n2++)
                    ldsm_x4(bb[n2], aKs + (n2 * 16 * SD + kk * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int n2 = 0; n2 < 2; n2++) {
                        mma_bf16(s[mt][2 * n2], a[mt], bb[n2][0], bb[n2][1]);
                        mma_bf16(s[mt][2 * n2 + 1], a[mt], bb[n2][2], bb[n2][3]);
                    }
            }
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[2][4], bb[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4(a[mt], bO + oA + ((wm * 32 + mt * 16) * SD + kk * 16) * 2);
#pragma unroll
                for (int n2 = 0; n2 < 2; n2++)
                    ldsm_x4(bb[n2], aVs + (n2 * 16 * SD + kk * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int n2 = 0; n2 < 2; n2++) {
                        mma_bf16(dp[mt][2 * n2], a[mt], bb[n2][0], bb[n2][1]);
                        mma_bf16(dp[mt][2 * n2 + 1], a[mt], bb[n2][2], bb[n2][3]);
                    }
            }
            // P = exp2(S sl2 - lse2[q]) (masked), dS = P (dP - D[q]); rows g / g + 8 of each m-tile
            const bool need_mask = wkey0 + 31 > off + wq0 || wq0 + 31 > q_last;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int ql = wm * 32 + mt * 16 + g + 8 * i; // query row within the tile
                    const float l2 = cL[ql], d0 = cD[ql];
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        float p0 = exp2_approx(fmaf(s[mt][nt][2 * i], sl2, -l2));
                        float p1 = exp2_approx(fmaf(s[mt][nt][2 * i + 1], sl2, -l2));
                        if (need_mask) {
                            const int key = wkey0 + nt * 8 + 2 * t4, qr = m0 + ql;
                            if (key > off + qr || qr >= Tq) p0 = 0.f;
                            if (key + 1 > off + qr || qr >= Tq) p1 = 0.f;
                        }
                        const float ds0 = p0 * (dp[mt][nt][2 * i] - d0), ds1 = p1 * (dp[mt][nt][2 * i + 1] - d0);
                        const int col = wn * 32 + nt * 8 + 2 * t4;
                        *(uint32_t *)(sP + ql * SP + col) = pack_bf16(p0, p1);
                        *(uint32_t *)(sdS + ql * SP + col) = pack_bf16(ds0, ds1);
                    }
                }
        } else {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int ql = wm * 32 + mt * 16 + g + 8 * i;
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const int col = wn * 32 + nt * 8 + 2 * t4;
                        *(uint32_t *)(sP + ql * SP + col) = 0u;
                        *(uint32_t *)(sdS + ql * SP + col) = 0u;
                    }
                }
        }
        __syncthreads(); // P and dS of the whole tile in shared memory

        // ---- dV += P^T dO, dK += dS^T Q (32 keys x D/2 columns per warp)
        if (n0 + wk * 32 <= off + q_last) { // else every P / dS entry of these keys is 0
#pragma unroll
            for (int kq = 0; kq < BM / 16; kq++) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4_t(a[mt], aPt + (kq * 16 * SP + mt * 16) * 2);
#pragma unroll
                for (int d2 = 0; d2 < NKV / 2; d2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bO + oT + (kq * 16 * SD + wd * (D / 2) + d2 * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_bf16(dva[mt][2 * d2], a[mt], bb[0], bb[1]);
                        mma_bf16(dva[mt][2 * d2 + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
#pragma unroll
            for (int kq = 0; kq < BM / 16; kq++) {
                uint32_t a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    ldsm_x4_t(a[mt], aSt + (kq * 16 * SP + mt * 16) * 2);
#pragma unroll
                for (int d2 = 0; d2 < NKV / 2; d2++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, bQ + oT + (kq * 16 * SD + wd * (D / 2) + d2 * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma_bf16(dka[mt][2 * d2], a[mt], bb[0], bb[1]);
                        mma_bf16(dka[mt][2 * d2 + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
        }

        // ---- dQ[m0.., :] += dS K (32 queries x D/4 columns per warp), keys of the visible prefix
        int *turn = dq_turns ? dq_turns + (int64_t)(ul * grp + hh) * n_mt + mt_ : nullptr;
        if (turn) dq_turn_wait(turn, jt);
        if (wq0 <= q_last) {
            const int n_kc = min(BN / 16, (off + q_last - n0) / 16 + 1); // key chunks visible to the tile
            float acc[2][NQ][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < NQ; i++)
                    acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < BN / 16; kc++) {
                if (kc < n_kc) {
                    uint32_t a[2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        ldsm_x4(a[mt], aSq + (mt * 16 * SP + kc * 16) * 2);
#pragma unroll
                    for (int d2 = 0; d2 < NQ / 2; d2++) {
                        uint32_t bb[4];
                        ldsm_x4_t(bb, aKq + (kc * 16 * SD + d2 * 16) * 2);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            mma_bf16(acc[mt][2 * d2], a[mt], bb[0], bb[1]);
                            mma_bf16(acc[mt][2 * d2 + 1], a[mt], bb[2], bb[3]);
                        }
                    }
                }
            }
            float *dqh = dqacc + (int64_t)(ul * grp + hh) * Tq * dqk;
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int row = wq0 + mt * 16 + g + 8 * i;
                    if (row < Tq) {
#pragma unroll
                        for (int nt = 0; nt < NQ; nt++) {
                            const int c = wn * (D / 4) + nt * 8 + 2 * t4;
                            if (c < dqk)
                                red_add_v2(dqh + (int64_t)row * dqk + c, acc[mt][nt][2 * i], acc[mt][nt][2 * i + 1]);
                        }
                    }
                }
        }
        if (turn) dq_turn_done(turn);
    }

    cp_async_wait<0>(); // nothing may stay in flight at exit (n_it == 0 when Tq == 0)
    // epilogue: dK = scale * dS^T Q, dV = P^T dO -> bf16
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int key = n0 + wk * 32 + mt * 16 + g + 8 * i;
            if (key >= Tk) continue;
            bf16 *dkr = dk + ((int64_t)b * Tk + key) * ks + (int64_t)hk * dqk;
            bf16 *dvr = dvo + ((int64_t)b * Tk + key) * vs + (int64_t)hk * dv;
#pragma unroll
            for (int nt = 0; nt < NKV; nt++) {
                const int c = wd * (D / 2) + nt * 8 + 2 * t4;
                if (c < dqk)
                    *(uint32_t *)(dkr + c) = pack_bf16(dka[mt][nt][2 * i] * scale, dka[mt][nt][2 * i + 1] * scale);
                if (c < dv) *(uint32_t *)(dvr + c) = pack_bf16(dva[mt][nt][2 * i], dva[mt][nt][2 * i + 1]);
            }
        }
}

// dq[b, t, h, :] = scale * acc[(u - u0) * grp + hh, t, :] for the units of one chunk.
__global__ void k_attn_dq_out(bf16 *__restrict__ dq, const float *__restrict__ acc, int Tq, int H, int Hkv, int dqk,
                              float scale, int u0, int n_units) {
    const int grp = H / Hkv, cq = dqk / 4;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // one float4 each
    int64_t n = (int64_t)n_units * grp * Tq * cq;
    if (i >= n) return;
    int c = (int)(i % cq) * 4;
    int64_t r = i / cq;
    int t = (int)(r % Tq), hl = (int)(r / Tq);
    int u = u0 + hl / grp, b = u / Hkv, h = (u - b * Hkv) * grp + hl % grp;
    float4 x = *(const float4 *)(acc + r * dqk + c);
    uint2 y = make_uint2(pack_bf16(x.x * scale, x.y * scale), pack_bf16(x.z * scale, x.w * scale));
    *(uint2 *)(dq + (((int64_t)b * Tq + t) * H + h) * dqk + c) = y;
}

#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_attn_wgmma.cuh"
#include "backend/cuda/cuda_attn_wgmma_bwd.cuh"

// ---- host side --------------------------------------------------------------

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// causal: Tk >= Tq is needed (the bottom-right mask); without, any Tk >= 0.
static bool attn_check(be_t *be, const char *op, int B, int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale,
                       const void *const *ptrs, int n_ptrs, int causal) {
    if (B < 0 || Tq < 0 || Tk < 0 || (causal && Tk < Tq) || H <= 0 || Hkv <= 0 || H % Hkv) {
        cu_op_error(be,
                    "cuda %s: bad shape B=%d Tq=%d Tk=%d H=%d Hkv=%d causal=%d (need sizes >= 0, Tk >= Tq when causal, "
                    "H a multiple of Hkv)",
                    op, B, Tq, Tk, H, Hkv, causal);
        return false;
    }
    if (dqk <= 0 || dv <= 0 || dqk % 16 || dv % 16 || dqk > 256 || dv > 256) {
        cu_op_error(be, "cuda %s: head dims dqk=%d dv=%d not supported (multiples of 16 up to 256)", op, dqk, dv);
        return false;
    }
    if (!(scale > 0.f)) {
        cu_op_error(be, "cuda %s: scale %g must be positive", op, (double)scale);
        return false;
    }
    for (int i = 0; i < n_ptrs; i++)
        if (!aligned16(ptrs[i])) {
            cu_op_error(be, "cuda %s: tensor argument %d is not 16-byte aligned", op, i);
            return false;
        }
    return true;
}

template <int DQK, int DV, int WARPS, int BC, int MT, bool QREG, int MINB>
static void launch_fwd(be_t *be, void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tq,
                       int Tk, int H, int Hkv, int dqk, int dv, float scale, int causal) {
    typedef fwd_cfg<DQK, DV, WARPS, BC, MT> C;
    auto kern = k_attn_fwd<DQK, DV, WARPS, BC, MT, QREG, MINB>;
    if (cuda_smem_limit(be, (const void *)kern, C::smem, "k_attn_fwd") < 0) return;
    int n_qt = (Tq + C::BR - 1) / C::BR;
    int64_t blocks = (int64_t)n_qt * B * H;
    if (blocks == 0) return;
    kern<<<(unsigned)blocks, C::NT, C::smem, cuda_stream(be)>>>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                                                                (const bf16 *)v, B, Tq, Tk, H, Hkv, dqk, dv,
                                                                scale * 1.4426950408889634f, n_qt, causal ? 1 : 0);
    cuda_check_launch(be, "k_attn_fwd");
}

static void cu_attn_fwd(be_t *be, void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tq,
                        int Tk, int H, int Hkv, int dqk, int dv, float scale, int causal) {
    const void *ptrs[] = {out, q, k, v};
    if (!attn_check(be, "attn_fwd", B, Tq, Tk, H, Hkv, dqk, dv, scale, ptrs, 4, causal)) return;
    if (B == 0 || Tq == 0) return;
    // The wgmma forward (cuda_attn_wgmma.cuh) at the head dims the hybrids
    // use; k_attn_fwd (mma.sync) for the others, and where the tensor maps
    // cannot describe a shape. Bench-only builds (bench_attn --compare times
    // each): HYLO_ATTN_FWD=2 runs k_attn_fwd at every shape; 3 the wgmma
    // forward with its blocks in L2-sized sections of (b, kv head) units
    // (k_attn_fwd_wgmma_l2), 4 the same order on one persistent wave of
    // blocks; 3 and 4 fall back to the default elsewhere.
    bool mma_only = false;
#ifdef HYLO_BENCH_VARIANTS
    const int fvar = cu_env_int("HYLO_ATTN_FWD", 0);
    mma_only = fvar == 2;
    if (fvar == 3 || fvar == 4) {
        const int pers = fvar == 4;
        bool done = false;
        if (dqk == 64 && dv == 64)
            done = launch_fwd_wgmma_l2<64, 64>(be, pers, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        else if (dqk == 128 && dv == 128)
            done = launch_fwd_wgmma_l2<128, 128>(be, pers, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        else if (dqk == 192 && dv == 128)
            done = launch_fwd_wgmma_l2<192, 128>(be, pers, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        if (done) return;
    }
#endif
    if (!mma_only) {
        bool done = false;
        if (dqk == 64 && dv == 64)
            done = launch_fwd_wgmma<64, 64>(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        else if (dqk == 128 && dv == 128)
            done = launch_fwd_wgmma<128, 128>(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        else if (dqk == 192 && dv == 128)
            done = launch_fwd_wgmma<192, 128>(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, scale, causal);
        if (done) return;
    }
#define FWD(...) launch_fwd<__VA_ARGS__>(be, out, lse, q, k, v, B, Tq, Tk, H, Hkv, dqk, dv, scale, causal)
    // FWD(DQK, DV, WARPS, BC, MT, QREG, MINB)
    if (dqk <= 64 && dv <= 64) {
        FWD(64, 64, 4, 64, 2, true, 2);
    } else if (dqk <= 96 && dv <= 64) {
        FWD(96, 64, 4, 64, 2, false, 2);
    } else if (dqk <= 128 && dv <= 128) {
        FWD(128, 128, 4, 32, 2, false, 2);
    } else if (dqk <= 192 && dv <= 128) {
        FWD(192, 128, 4, 32, 2, false, 1);
    } else if (dqk <= 192 && dv <= 192) {
        FWD(192, 192, 4, 64, 1, false, 1);
    } else {
        FWD(256, 256, 4, 64, 1, false, 1);
    }
#undef FWD
}

static void cu_attn_merge(be_t *be, float *acc, float *lse, const void *out_i, const float *lse_i, void *out, int first,
                          int B, int Tq, int H, int dv) {
    if (B < 0 || Tq < 0 || H <= 0 || dv <= 0 || dv % 2) {
        cu_op_error(be, "cuda attn_merge: bad shape B=%d Tq=%d H=%d dv=%d (dv even)", B, Tq, H, dv);
        return;
    }
    int64_t rows = (int64_t)B * Tq * H;
    if (rows == 0) return;
    k_attn_merge<<<cuda_blocks(rows * 32, 256), 256, 0, cuda_stream(be)>>>(acc, lse, (const bf16 *)out_i, lse_i,
                                                                           (bf16 *)out, first ? 1 : 0, Tq, H, dv, rows);
    cuda_check_launch(be, "k_attn_merge");
}

typedef void (*bwd_kern_t)(bf16 *, bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, const bf16 *,
                           const float *, const float *, int, int, int, int, int, int, float, float, int, int, int,
                           int *);

// Runs a backward kernel (v1 or v2) over chunks of (b, kv head) units, as many
// per pass as the arena holds fp32 dQ accumulators for, then writes dq.
static void run_bwd(be_t *be, bwd_kern_t kern, size_t smem, int nt, int bn, int bm, int nsl, void *dq, void *dk,
                    void *dv_, const void *dout, const void *q, const void *k, const void *v, const float *lse2,
                    const float *Dd, int B, int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale, int Tqp) {
    if (cuda_smem_limit(be, (const void *)kern, smem, "k_attn_bwd") < 0) return;
    const int grp = H / Hkv, units = B * Hkv, n_kt = (Tk + bn - 1) / bn;
    // the fp32 dQ accumulator of one (b, kv head) unit, and under be->deterministic
    // its turn counters (one per query tile, head and slice); as many units per
    // pass as the arena holds
    const size_t acc_bytes = (size_t)grp * Tq * dqk * sizeof(float);
    const size_t turn_bytes = be->deterministic ? (size_t)grp * ((Tq + bm - 1) / bm) * nsl * sizeof(int) : 0;
    const size_t unit_bytes = acc_bytes + turn_bytes;
    arena_t *ar = &be->scratch;
    size_t avail = ar->cap > ar->used + 1024 ? ar->cap - ar->used - 1024 : 0;
    int upc = unit_bytes ? (int)(avail / unit_bytes < (size_t)units ? avail / unit_bytes : (size_t)units) : units;
    if (upc < 1) {
        cu_op_error(be,
                    "cuda attn_bwd: scratch arena too small: %zu bytes free, the dQ accumulator of one kv head "
                    "needs %zu",
                    avail, unit_bytes);
        return;
    }
    float *acc = (float *)arena_alloc(ar, acc_bytes * (size_t)upc);
    int *turns = turn_bytes ? (int *)arena_alloc(ar, turn_bytes * (size_t)upc) : NULL;
    if (!acc || (turn_bytes && !turns)) {
        cu_op_error(be, "cuda attn_bwd: cannot take %zu bytes from the scratch arena", unit_bytes * (size_t)upc);
        return;
    }
    for (int u0 = 0; u0 < units; u0 += upc) {
        int n = units - u0 < upc ? units - u0 : upc;
        cudaError_t e = cudaMemsetAsync(acc, 0, acc_bytes * (size_t)n, cuda_stream(be));
        if (e == cudaSuccess && turns) e = cudaMemsetAsync(turns, 0, turn_bytes * (size_t)n, cuda_stream(be));
        if (e != cudaSuccess) {
            cuda_fail(be, "cudaMemsetAsync(attn dQ accumulator)", e);
            return;
        }
        int64_t blocks = (int64_t)n_kt * n * nsl;
        kern<<<(unsigned)blocks, nt, smem, cuda_stream(be)>>>(
            (bf16 *)dk, (bf16 *)dv_, acc, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse2,
            Dd, Tq, Tk, H, Hkv, dqk, dv, scale * 1.4426950408889634f, scale, u0, n, Tqp, turns);
        cuda_check_launch(be, "k_attn_bwd");
        int64_t nv = (int64_t)n * grp * Tq * (dqk / 4);
        if (nv > 0) {
            k_attn_dq_out<<<cuda_blocks(nv, 256), 256, 0, cuda_stream(be)>>>((bf16 *)dq, acc, Tq, H, Hkv, dqk, scale,
                                                                             u0, n);
            cuda_check_launch(be, "k_attn_dq_out");
        }
    }
}

template <int DQK, int DV, int NSL, int WARPS, int BM>
static void launch_bwd(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                       const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H, int Hkv,
                       int dqk, int dv, float scale, int Tqp) {
    typedef bwd_cfg<DQK, DV, NSL, WARPS, BM> C;
    run_bwd(be, k_attn_bwd<DQK, DV, NSL, WARPS, BM>, C::smem, C::NT, C::BN, BM, NSL, dq, dk, dv_, dout, q, k, v, lse2,
            Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp);
}

template <int D>
static void launch_bwd2(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                        const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H, int Hkv,
                        int dqk, int dv, float scale, int Tqp) {
    typedef bwd2_cfg<D> C;
    run_bwd(be, k_attn_bwd2<D>, C::smem, C::NT, C::BN, C::BM, 1, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H,
            Hkv, dqk, dv, scale, Tqp);
}

#ifdef HYLO_BENCH_VARIANTS
// Bench-only backward variants (bench-variants build, bench_attn --compare; the
// production build has none), chosen by HYLO_ATTN_BWD: 1 = v1 with its
// alternative tiles (d 64 and 128), 2 = v1 with its default tiles at d 128,
// 3 = v2 at d 64; each falls back to the mma.sync kernels below elsewhere.
// 4 = the mma.sync kernels at every shape (the production backward before the
// wgmma one). All lost in runs 7 and 25 (docs/PERFORMANCE.md). True when a
// variant ran. (5 and 6, the wgmma backward with dQ by bulk reductions or by
// register adds at every head dim it takes, are in cu_attn_bwd.)
static bool bwd_variant(int var, be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q,
                        const void *k, const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H,
                        int Hkv, int dqk, int dv, float scale, int Tqp) {
    if (dqk <= 64 && dv <= 64) {
        if (var == 1)
            launch_bwd<64, 64, 1, 4, 64>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale,
                                         Tqp);
        else if (var == 3)
            launch_bwd2<64>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp);
        else
            return false;
        return true;
    }
    if (dqk <= 96 && dv <= 64) return false;
    if (dqk <= 128 && dv <= 128) {
        if (var == 1)
            launch_bwd<128, 128, 1, 8, 64>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale,
                                           Tqp);
        else if (var == 2)
            launch_bwd<128, 128, 1, 8, 32>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale,
                                           Tqp);
        else
            return false;
        return true;
    }
    return false;
}
#endif

// The wgmma backward (cuda_attn_wgmma_bwd.cuh) at the head dims the hybrids
// use; false where it does not apply (another head dim, deterministic mode,
// a shape the tensor maps cannot describe). dQ by bulk tensor reductions
// (k_attn_bwd_wgmma_dqb): 7-20% faster than adding it from registers at
// every head dim, 8K to 64K (runs 27 and 29, docs/PERFORMANCE.md); the
// register adds (dq_bulk false) only in the bench-variants build.
template <int DQK, int DV>
static bool bwd_wgmma_at(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                         const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H, int Hkv,
                         float scale, int Tqp, bool dq_bulk) { // attn_bwd is causal
#ifdef HYLO_BENCH_VARIANTS
    if (!dq_bulk)
        return launch_bwd_wgmma<DQK, DV>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, scale, Tqp, 1);
#endif
    return launch_bwd_wgmma<DQK, DV, true>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, scale, Tqp, 1);
}
static bool bwd_wgmma(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                      const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H, int Hkv, int dqk,
                      int dv, float scale, int Tqp, bool dq_bulk) {
    if (dqk == 64 && dv == 64)
        return bwd_wgmma_at<64, 64>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, scale, Tqp, dq_bulk);
    if (dqk == 128 && dv == 128)
        return bwd_wgmma_at<128, 128>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, scale, Tqp, dq_bulk);
    if (dqk == 192 && dv == 128)
        return bwd_wgmma_at<192, 128>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, scale, Tqp, dq_bulk);
    return false;
}
static void cu_attn_bwd(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                        const void *v, const void *out, const float *lse, int B, int Tq, int Tk, int H, int Hkv,
                        int dqk, int dv, float scale) {
    const void *ptrs[] = {dq, dk, dv_, dout, q, k, v, out};
    if (!attn_check(be, "attn_bwd", B, Tq, Tk, H, Hkv, dqk, dv, scale, ptrs, 8, 1)) return;
    if (B == 0 || Tk == 0) return;
    arena_t *ar = &be->scratch;
    size_t mark = arena_mark(ar);
    const int Tqp = (Tq + 63) / 64 * 64;
    const size_t nD = (size_t)B * H * (Tqp ? Tqp : 1);
    float *Dd = (float *)arena_alloc(ar, nD * sizeof(float));
    float *lse2 = (float *)arena_alloc(ar, nD * sizeof(float));
    if (!Dd || !lse2) {
        cu_op_error(be, "cuda attn_bwd: scratch arena too small for D and lse (%zu bytes)", 2 * nD * sizeof(float));
        arena_reset(ar, mark);
        return;
    }
    if (Tqp > 0) {
        int64_t threads = (int64_t)B * H * Tqp * 32;
        k_attn_bwd_pre<<<cuda_blocks(threads, 256), 256, 0, cuda_stream(be)>>>(
            Dd, lse2, (const bf16 *)dout, (const bf16 *)out, lse, B * H, H, Tq, Tqp, dv);
        cuda_check_launch(be, "k_attn_bwd_pre");
    }
#define BWD(...)                                                                                                       \
    launch_bwd<__VA_ARGS__>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp)
    // the wgmma backward where it applies, else the mma.sync kernels
    int var = 0;
#ifdef HYLO_BENCH_VARIANTS
    var = cu_env_int("HYLO_ATTN_BWD", 0);
#endif
    bool done =
        var ? false : bwd_wgmma(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp, true);
#ifdef HYLO_BENCH_VARIANTS
    // 5 and 6: the wgmma backward with dQ by bulk reductions (5) or by register
    // adds (6) at every head dim it takes (else the mma.sync kernels below)
    if (!done && (var == 5 || var == 6))
        done = bwd_wgmma(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp, var == 5);
    if (!done && var && var != 5 && var != 6)
        done = bwd_variant(var, be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp);
#endif
    if (!done) {
        // v2 at d <= 128, where it cuts ldmatrix traffic by ~29%. At d <= 64 v1
        // keeps K and V fragments in registers and already moves ~48 bytes per
        // pair against v2's ~50: v1 stays there (run 7: v2 1.11-1.17x slower).
        if (dqk <= 64 && dv <= 64) {
            BWD(64, 64, 1, 8, 64);
        } else if (dqk <= 96 && dv <= 64) {
            BWD(96, 64, 1, 8, 64);
        } else if (dqk <= 128 && dv <= 128) {
            launch_bwd2<128>(be, dq, dk, dv_, dout, q, k, v, lse2, Dd, B, Tq, Tk, H, Hkv, dqk, dv, scale, Tqp);
        } else if (dqk <= 192 && dv <= 128) {
            BWD(192, 128, 1, 8, 32);
        } else if (dqk <= 192 && dv <= 192) {
            BWD(192, 192, 2, 4, 32);
        } else {
            BWD(256, 256, 2, 4, 32);
        }
    }
#undef BWD
    arena_reset(ar, mark); // later work on the stream may reuse the memory: stream order protects it
}

// ---- decode over per-sequence caches (attn_decode, kv_append) -----------------
//
// One query row per sequence, each over its own cache (backend.h): a step's
// rows arrive as per-row cache pointers, and both ops are one launch for all
// rows. Decode attention reads every cache row once per KV head and does a few
// FLOP per byte, so it is bound by those bytes: k_attn_decode streams them
// straight from device memory into registers.
//
// Block = (row r, KV head g, head chunk hc, slice s) of DEC_WARPS warps. A lane
// owns 8 consecutive columns of the head dim (one 16-byte load of K and one of
// V per cache row); LPR = the power of two >= max(dqk, dv) / 8 lanes read one
// row, so a warp reads KPW = 32 / LPR rows per load instruction and keeps
// U (dec_cfg) such loads of K and of V in flight before it uses any. Each
// group of LPR lanes keeps its own online softmax (m, l, unnormalised O in fp32
// registers, exp2 domain) over the rows it reads; no barrier in the loop. At
// the end the lane groups merge by shuffles, the warps through shared memory.
//
// Paged caches: a warp's loads of one iteration are the U * KPW rows [ub, ub
// + U * KPW), a power of two of at most 256 rows (BE_PAGE_ROWS), and slices
// start on multiples of it, so the rows of an iteration lie in one page: the
// warp looks the page up once per iteration.
//
// Slices (split-K): the grid's n_split depends on host arguments only (a
// recorded graph replays it with other lengths): enough blocks for one wave
// at the kernel's occupancy, never slices shorter than DEC_MIN_SLICE rows of
// max_len (a quarter of that below 8 DEC_MIN_SLICE rows), and one slice when
// max_len is short (below). Each pair then uses, by its own length n read in
// the kernel, ns = dec_slices() of them, the rest of its blocks exiting at
// once:
//  - short (n <= short_rows, DEC_SHORT_ROUNDS block iterations): the csize
//    blocks of one cluster share the rows (DEC_CLUSTER for a few pairs under
//    a short max_len, else 1: dec_launch), each block's warps merge in its
//    shared memory, then block 0 merges the blocks' (m, l, O) from theirs
//    (distributed shared memory) and writes the output, with no partials,
//    fence or counter. A split through global memory would add at least four
//    dependent memory round trips (partial stores and fence, the counter, the
//    last block's (m, l) loads, its O loads), so below that it does not pay;
//  - split: slices of at least one block iteration (DEC_WARPS U KPW rows:
//    fewer leave warps idle and add a partial without shortening the chain),
//    each block writes its partial (m, l, O) to the scratch arena and counts
//    itself on a per-(row, KV head, chunk) counter; the last block to arrive
//    merges the ns partials, writes the output and sets the counter back to 0
//    (cuda_impl_t.dec_count, zeroed once at backend creation). At n = max_len
//    ns = n_split (the host's slices hold at least that many rows).
// So the op is one launch and leaves no state behind, and a step recorded
// with a long context limit takes the short path while its caches are short.
// Query heads of one KV head are done G at a time (G <= 8 registers of q and O
// per column); a group larger than 8 takes several head chunks.
enum { DEC_WARPS = 8, DEC_THREADS = DEC_WARPS * 32 };
enum { DEC_MIN_SLICE = 256, DEC_MAX_SPLIT = 256 }; // rows a slice holds at least; slices at most
// Block iterations (each: every warp's U KPW rows in flight at once) up to
// which one block takes a pair's rows: short_rows = DEC_SHORT_ROUNDS
// DEC_WARPS U KPW, 512 rows for SmolLM2's layer (dh 64, 3 heads per KV head),
// 256 for Llama-3.2-3B's (dh 128, 3), 512 for Llama-3.1-8B's (dh 128, 4: U 8).
enum { DEC_SHORT_ROUNDS = 4 };
// Blocks of a short pair's cluster (the portable cluster size), and the
// longest max_len that launches clusters (dec_launch).
enum { DEC_CLUSTER = 8, DEC_CLUSTER_MAX_LEN = 4096 };
namespace cg = cooperative_groups;

typedef struct {
    bf16 *out;
    float *part_o;   // [pair][n_split][G][dv] unnormalised O of each slice (n_split > 1)
    float2 *part_ml; // [pair][n_split][G] (m, l) of each slice, m in the exp2 domain
    unsigned *count; // [pair] blocks of the pair done; 0 between launches
    const bf16 *q;
    int64_t ldq;
    const bf16 *const *k_rows, *const *v_rows;
    be_pages_t pg; // the rows' page tables (backend.h), or none
    const int32_t *len;
    int max_len, H, Hkv, grp, nhc, dqk, dv, lpr, n_split;
    int short_rows; // a pair of at most this many rows: one cluster, no partials (DEC_SHORT_ROUNDS)
    int csize;      // blocks of a short pair: a cluster along y (1: one block)
    float sl2;      // scale * log2(e): scores in the exp2 domain
} dec_args_t;

// Rows of K and V each lane group keeps in flight: fewer for 6 and 8 heads,
// whose q and O registers leave less room. 4 heads at 2 blocks per SM (128
// registers) spilled in the row loop (q and O alone take 64), so they run one
// block per SM with twice the rows in flight: the same bytes per SM.
template <int G> struct dec_cfg {
    static constexpr int U = G == 4 ? 8 : G < 4 ? 4 : 2;
    static constexpr int MINB = G < 4 ? 2 : 1; // blocks per SM the registers are capped for
    // a warp's U KPW <= 32 U rows of an iteration: a power of two within one page
    static_assert((U & (U - 1)) == 0 && 32 * U <= BE_PAGE_ROWS, "dec_cfg: rows of an iteration");
};

// 8 bf16 of a cache row from column c of a row with `cols` valid columns past
// p (<= 0: none). VEC: one 16-byte load that skips L1 (read once), the row
// 16-byte aligned with cols 0 or >= 8; else scalar loads of the valid ones.
// CG: through L2 only (the loads before griddep_wait, k_attn_decode).
template <bool VEC, bool CG = false> static __device__ __forceinline__ uint4 dec_ld8(const bf16 *p, int cols) {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (VEC) {
        if (cols > 0) {
            if (CG)
                asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                             : "l"(p));
            else
                asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                    : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                    : "l"(p));
        }
    } else {
        unsigned short *h = reinterpret_cast<unsigned short *>(&u);
        const unsigned short *ph = reinterpret_cast<const unsigned short *>(p);
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (e < cols) h[e] = CG ? __ldcg(ph + e) : ph[e];
    }
    return u;
}

static __device__ __forceinline__ void dec_cvt8(uint4 u, float (&f)[8]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x, f[2 * k + 1] = t.y;
    }
}

// Slices a pair of n rows uses of the grid's n_split: the cluster's csize
// blocks when short, else slices of at least `rit` rows (one block iteration).
// The same in every block of the pair (same n), so they agree on who counts
// and who merges.
static __device__ __forceinline__ int dec_slices(int n, int n_split, int short_rows, int rit, int csize) {
    if (n <= short_rows) return csize;
    const int s = (n + rit - 1) / rit;
    return s < n_split ? s : n_split;
}

// exp2(x - m) for a running maximum m that may still be -inf (nothing seen):
// then every x is -inf as well and the weight is 0, not NaN.
static __device__ __forceinline__ float dec_w(float x, float m) { return m == -INFINITY ? 0.f : exp2f(x - m); }

// acc = sum over slices t = t0, t0 + dt, ... of weight ws[t][j] times the W
// floats at unit i of slice t's partial O. Every slice wrote its partial (an
// empty one zeros, weight 0), so the loads need no condition and several are
// in flight.
template <int W>
static __device__ __forceinline__ void dec_sum(float (&acc)[W], const float *po, const float *ws, int i, int j,
                                               int slice_stride, int t0, int dt, int n_split, int G) {
#pragma unroll
    for (int e = 0; e < W; e++)
        acc[e] = 0.f;
#pragma unroll 8
    for (int t = t0; t < n_split; t += dt) {
        const float wt = ws[t * G + j];
        const float *p = po + (int64_t)t * slice_stride + (int64_t)i * W;
        if constexpr (W == 4) {
            const float4 x = __ldcg(reinterpret_cast<const float4 *>(p));
            acc[0] = fmaf(wt, x.x, acc[0]), acc[1] = fmaf(wt, x.y, acc[1]);
            acc[2] = fmaf(wt, x.z, acc[2]), acc[3] = fmaf(wt, x.w, acc[3]);
        } else {
            acc[0] = fmaf(wt, __ldcg(p), acc[0]);
        }
    }
}

// This block's rows [u_begin, u_end) of a pair of n rows in ns slices:
// slices of whole steps of max(16, U KPW) rows (so that an iteration's rows
// lie in one page), the last ones may be short or empty.
static __device__ __forceinline__ void dec_block_rows(int n, int ns, int split, int ra, int &u_begin, int &u_end) {
    const int per = ((n + ns - 1) / ns + ra - 1) / ra * ra;
    u_begin = (int)min((int64_t)split * per, (int64_t)n), u_end = min(u_begin + per, n);
}

// Rows of a block that are asked of L2 before griddep_wait (below), at most:
// the first of a long slice (the rest follow the loads' own stream).
enum { DEC_PREFETCH_ROWS = 512 };

// Grid (N * Hkv * nhc pairs, n_split) in clusters of (1, csize), DEC_THREADS
// threads; dynamic shared memory dec_smem_bytes(). out [N, H, dv] bf16; zeros
// where len[r] <= 0.
template <int G, bool VEC>
__global__ void __launch_bounds__(DEC_THREADS, dec_cfg<G>::MINB) k_attn_decode(const dec_args_t a) {
    constexpr int U = dec_cfg<G>::U;
    extern __shared__ float dsm[];
    const int pair = blockIdx.x, split = blockIdx.y;
    const int hc = pair % a.nhc, g = pair / a.nhc % a.Hkv, r = pair / a.nhc / a.Hkv;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int LPR = a.lpr, KPW = 32 / LPR, li = lane & (LPR - 1), slot = lane / LPR;
    const int c0 = 8 * li, kc = a.dqk - c0, vc = a.dv - c0; // this lane's columns; valid ones past c0
    const int h0 = g * a.grp + hc * G;                      // the chunk's first query head
    const int gh = min(G, a.grp - hc * G);                  // heads of the chunk (the rest compute on zeros)
    const int step = DEC_WARPS * U * KPW;                   // rows the block reads per iteration
    const int ra = U * KPW > 16 ? U * KPW : 16;
    const int64_t ldK = (int64_t)a.Hkv * a.dqk, ldV = (int64_t)a.Hkv * a.dv;

    // Launched as a programmatic dependent launch (cuda_vec.cuh), the block
    // may run while the kernel before it (the step's K/V append and q) still
    // does. Every kernel before that one has finished (griddep_enter), and the
    // lengths and row addresses are the step's uploads, done before its first
    // kernel; every cache row but the newest was written by earlier steps. So
    // the block reads its first iteration's rows now, all but the newest,
    // through L2 (dec_ld8<CG>), and asks L2 for its next rows; after the wait
    // only q and the newest row are read before the first scores.
    int n = a.len[r];
    n = n < 0 ? 0 : n > a.max_len ? a.max_len : n;
    const int ns = dec_slices(n, a.n_split, a.short_rows, step, a.csize);
    int u_begin = 0, u_end = 0; // this block's rows
    if (split < ns) dec_block_rows(n, ns, split, ra, u_begin, u_end);
    const bf16 *kb = a.k_rows[r] + (int64_t)g * a.dqk + c0, *vb = a.v_rows[r] + (int64_t)g * a.dv + c0;
    const int ub0 = u_begin + warp * U * KPW; // the warp's first rows (rows [ub, ub + U KPW) lie in one page)
    const int64_t at0 = ub0 < u_end ? cu_page_row(a.pg, r, ub0) - ub0 : 0;
    uint4 kr[U], vr[U];
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = ub0 + i * KPW + slot;
        const bool ok = u < u_end && u < n - 1;
        kr[i] = dec_ld8<VEC, true>(kb + (u + at0) * ldK, ok ? kc : 0);
        vr[i] = dec_ld8<VEC, true>(vb + (u + at0) * ldV, ok ? vc : 0);
    }
    {
        const int hi = min(min(u_end, n - 1), u_begin + DEC_PREFETCH_ROWS);
        const char *kp = (const char *)(kb - c0), *vp = (const char *)(vb - c0);
        for (int u = u_begin + step + tid; u < hi; u += DEC_THREADS) {
            const int64_t at = cu_page_row(a.pg, r, u);
            for (int o = 0; o < a.dqk * 2; o += 128)
                prefetch_l2(kp + at * ldK * 2 + o);
            for (int o = 0; o < a.dv * 2; o += 128)
                prefetch_l2(vp + at * ldV * 2 + o);
        }
    }
    griddep_enter();
    if (split >= ns) return; // a slice this pair's length leaves unused

    float q[G][8];
#pragma unroll
    for (int j = 0; j < G; j++) {
        const bf16 *qp = a.q + (int64_t)r * a.ldq + (int64_t)(h0 + j) * a.dqk + c0;
#pragma unroll
        for (int e = 0; e < 8; e++)
            q[j][e] = j < gh && e < kc ? __bfloat162float(qp[e]) * a.sl2 : 0.f;
    }
    // the newest row, appended by the kernel before, when among the warp's first rows
#pragma unroll
    for (int i = 0; i < U; i++) {
        const int u = ub0 + i * KPW + slot;
        if (u == n - 1 && u < u_end) {
            kr[i] = dec_ld8<VEC>(kb + (u + at0) * ldK, kc);
            vr[i] = dec_ld8<VEC>(vb + (u + at0) * ldV, vc);
        }
    }
    float m[G], l[G], o[G][8];
#pragma unroll
    for (int j = 0; j < G; j++) {
        m[j] = -INFINITY, l[j] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[j][e] = 0.f;
    }

    // Every lane of a warp runs the same iterations (the score shuffles need
    // them all); a lane group's rows past u_end load nothing and weigh 0.
    for (int ub = ub0; ub < u_end; ub += step) {
        if (ub != ub0) {                                      // (the first iteration's rows are loaded above)
            const int64_t at = cu_page_row(a.pg, r, ub) - ub; // rows [ub, ub + U KPW) are at u + at
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int u = ub + i * KPW + slot;
                const bool ok = u < u_end;
                kr[i] = dec_ld8<VEC>(kb + (u + at) * ldK, ok ? kc : 0);
                vr[i] = dec_ld8<VEC>(vb + (u + at) * ldV, ok ? vc : 0);
            }
        }
        float s[G][U];
#pragma unroll
        for (int i = 0; i < U; i++) {
            float kf[8];
            dec_cvt8(kr[i], kf);
#pragma unroll
            for (int j = 0; j < G; j++) {
                float acc = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc = fmaf(q[j][e], kf[e], acc);
                for (int x = LPR >> 1; x > 0; x >>= 1) // the row's dot product over its LPR lanes
                    acc += __shfl_xor_sync(0xffffffffu, acc, x);
                s[j][i] = ub + i * KPW + slot < u_end ? acc : -INFINITY;
            }
        }
#pragma unroll
        for (int j = 0; j < G; j++) {
            float mx = m[j];
#pragma unroll
            for (int i = 0; i < U; i++)
                mx = fmaxf(mx, s[j][i]);
            const float alpha = dec_w(m[j], mx);
            m[j] = mx;
            l[j] *= alpha;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[j][e] *= alpha;
#pragma unroll
            for (int i = 0; i < U; i++) {
                const float p = dec_w(s[j][i], mx);
                float vf[8];
                dec_cvt8(vr[i], vf);
                l[j] += p;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    o[j][e] = fmaf(p, vf[e], o[j][e]);
            }
        }
    }

    // merge the lane groups of the warp (same columns, other rows)
    for (int x = LPR; x < 32; x <<= 1) {
#pragma unroll
        for (int j = 0; j < G; j++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[j], x), lo = __shfl_xor_sync(0xffffffffu, l[j], x);
            const float mx = fmaxf(m[j], mo), wa = dec_w(m[j], mx), wb = dec_w(mo, mx);
            m[j] = mx, l[j] = wa * l[j] + wb * lo;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[j][e] = wa * o[j][e] + wb * __shfl_xor_sync(0xffffffffu, o[j][e], x);
        }
    }
    // then the warps: [DEC_WARPS][G][DVP] O, [DEC_WARPS][G] m and l
    const int DVP = LPR * 8;
    float *so = dsm, *sm = so + DEC_WARPS * G * DVP, *sl = sm + DEC_WARPS * G;
    if (slot == 0) {
#pragma unroll
        for (int j = 0; j < G; j++) {
#pragma unroll
            for (int e = 0; e < 8; e++)
                so[(warp * G + j) * DVP + c0 + e] = o[j][e];
            if (li == 0) sm[warp * G + j] = m[j], sl[warp * G + j] = l[j];
        }
    }
    __syncthreads();
    const int dv = a.dv, E = gh * dv;
    const int64_t pbase = (int64_t)pair * a.n_split + split;           // this block's partial (n_split per pair)
    const bool clustered = ns > 1 && n <= a.short_rows;                // a short pair over the cluster's blocks
    float *co = sl + DEC_WARPS * G, *cm = co + G * DVP, *cl2 = cm + G; // then the block's O [G][DVP], m, l
    for (int i = tid; i < E; i += DEC_THREADS) {
        const int j = i / dv, c = i - j * dv;
        float M = -INFINITY, L = 0.f, O = 0.f;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, sm[w * G + j]);
        for (int w = 0; w < DEC_WARPS; w++) {
            const float wt = dec_w(sm[w * G + j], M);
            L = fmaf(wt, sl[w * G + j], L);
            O = fmaf(wt, so[(w * G + j) * DVP + c], O);
        }
        if (ns == 1) {
            a.out[((int64_t)r * a.H + h0 + j) * dv + c] = __float2bfloat16_rn(L > 0.f ? O / L : 0.f);
        } else if (clustered) {
            co[j * DVP + c] = O;
            if (c == 0) cm[j] = M, cl2[j] = L;
        } else {
            a.part_o[(pbase * G + j) * dv + c] = O;
            if (c == 0) a.part_ml[pbase * G + j] = make_float2(M, L);
        }
    }
    if (ns == 1) return;
    if (clustered) {
        // block 0 merges the cluster's blocks from their shared memory, in rank order
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        if (split == 0)
            for (int i = tid; i < E; i += DEC_THREADS) {
                const int j = i / dv, c = i - j * dv;
                float M = -INFINITY, L = 0.f, O = 0.f;
                for (int t = 0; t < ns; t++)
                    M = fmaxf(M, *cl.map_shared_rank(cm + j, t));
                for (int t = 0; t < ns; t++) {
                    const float wt = dec_w(*cl.map_shared_rank(cm + j, t), M);
                    L = fmaf(wt, *cl.map_shared_rank(cl2 + j, t), L);
                    O = fmaf(wt, *cl.map_shared_rank(co + j * DVP + c, t), O);
                }
                a.out[((int64_t)r * a.H + h0 + j) * dv + c] = __float2bfloat16_rn(L > 0.f ? O / L : 0.f);
            }
        cl.sync(); // no block leaves while block 0 may still read its memory
        return;
    }

    // the last block of the pair to finish merges the ns partials
    __shared__ unsigned s_last;
    __threadfence(); // this block's partial is visible before its count
    __syncthreads();
    if (tid == 0) {
        const unsigned done = atomicAdd(&a.count[pair], 1u);
        s_last = done == (unsigned)ns - 1;
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence(); // the other blocks' partials are read after their counts
    // shared: [ns][G] m then weights, [ns][G] l, [G] sums, then per-subset sums
    // of O. Every (m, l) loaded at once (one round trip), then reduced per head.
    float *ws = dsm, *wl = ws + ns * G, *sL = wl + ns * G, *red = sL + G;
    const float2 *ml = a.part_ml + (int64_t)pair * a.n_split * G;
    for (int i = tid; i < ns * G; i += DEC_THREADS)
        if (i % G < gh) { // (heads past gh have no partial)
            const float2 v = __ldcg(&ml[i]);
            ws[i] = v.x, wl[i] = v.y;
        }
    __syncthreads();
    if (tid < gh) {
        float M = -INFINITY;
        for (int t = 0; t < ns; t++)
            M = fmaxf(M, ws[t * G + tid]);
        float L = 0.f;
        for (int t = 0; t < ns; t++) {
            const float wt = dec_w(ws[t * G + tid], M);
            ws[t * G + tid] = wt;
            L = fmaf(wt, wl[t * G + tid], L);
        }
        sL[tid] = L;
    }
    __syncthreads();
    // thread -> (unit i of W floats of the E = gh dv, subset of the slices):
    // a small E takes several threads per unit, so more loads are in flight;
    // the subsets add in a fixed order (the same result on every run). VEC
    // (dv a multiple of 8): float4 units, which never straddle two heads.
    constexpr int W = VEC ? 4 : 1;
    const int EW = E / W;
    const float *po = a.part_o + (int64_t)pair * a.n_split * G * dv;
    bf16 *ob = a.out + ((int64_t)r * a.H + h0) * dv;
    if (EW >= DEC_THREADS) {
        for (int i = tid; i < EW; i += DEC_THREADS) {
            const int j = i * W / dv;
            float acc[W];
            dec_sum<W>(acc, po, ws, i, j, G * dv, 0, 1, ns, G);
            const float L = sL[j], inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
            for (int e = 0; e < W; e++)
                ob[i * W + e] = __float2bfloat16_rn(acc[e] * inv);
        }
    } else {
        const int nsub = DEC_THREADS / EW, sub = tid / EW, i = tid - sub * EW;
        if (sub < nsub) { // red[sub][i][W]
            float acc[W];
            dec_sum<W>(acc, po, ws, i, i * W / dv, G * dv, sub, nsub, ns, G);
#pragma unroll
            for (int e = 0; e < W; e++)
                red[tid * W + e] = acc[e];
        }
        __syncthreads();
        if (tid < EW) {
            const float L = sL[tid * W / dv], inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
            for (int e = 0; e < W; e++) {
                float acc = 0.f;
                for (int t = 0; t < nsub; t++)
                    acc += red[(t * EW + tid) * W + e];
                ob[tid * W + e] = __float2bfloat16_rn(acc * inv);
            }
        }
    }
    if (tid == 0) a.count[pair] = 0; // ready for the next launch (stream order)
}

// Dynamic shared memory of k_attn_decode: the warps' merge and the block's
// merged (m, l, O) that a cluster's block 0 reads, or the last block's merge
// of up to n_split partials (the same memory, used one after the other).
static size_t dec_smem_bytes(int G, int lpr, int n_split) {
    const size_t warps = (size_t)(DEC_WARPS + 1) * G * (lpr * 8 + 2);
    const size_t last = n_split > 1 ? (size_t)2 * n_split * G + G + 4 * DEC_THREADS : 0;
    return (warps > last ? warps : last) * sizeof(float);
}

// What the launches of one kernel instance keep between calls: its occupancy
// for the shared memory last asked about.
typedef struct {
    size_t occ_smem;
    int occ;
} dec_occ_t;

template <int G, bool VEC> static void dec_launch(be_t *be, dec_args_t a, int64_t pairs) {
    cuda_impl_t *ci = cuda_impl(be);
    auto kern = k_attn_decode<G, VEC>;
    static dec_occ_t oc; // per instance; read again when the shared memory asked about changes
    // slices: one wave of blocks at the kernel's occupancy over the pairs, at
    // least DEC_MIN_SLICE rows of max_len each, none when max_len is short
    // (host arguments only; the kernel uses fewer for shorter lengths)
    size_t smem = dec_smem_bytes(G, a.lpr, 1);
    if (cuda_smem_limit(be, (const void *)kern, dec_smem_bytes(G, a.lpr, DEC_MAX_SPLIT), "k_attn_decode") < 0) return;
    dec_occ_t *o = &oc;
    if (o->occ_smem != smem) {
        int nb = 0;
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, DEC_THREADS, smem);
        if (e != cudaSuccess) {
            cuda_fail(be, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(k_attn_decode)", e);
            return;
        }
        o->occ = nb > 0 ? nb : 1, o->occ_smem = smem;
    }
    // below 2K rows, slices of a quarter of that: a few hundred rows in one
    // block are a chain of dependent loads (docs/SERVING.md, run 23), while
    // the partials of at most 32 slices are little for the last block to merge;
    // and never less than one block iteration (dec_slices)
    const int rit = DEC_WARPS * dec_cfg<G>::U * (32 / a.lpr); // rows per block iteration
    a.short_rows = DEC_SHORT_ROUNDS * rit;
    int min_slice = a.max_len < 8 * DEC_MIN_SLICE ? DEC_MIN_SLICE / 4 : DEC_MIN_SLICE;
    if (min_slice < rit) min_slice = rit;
    int64_t ns = (int64_t)o->occ * ci->sm_count / pairs, by_len = a.max_len / min_slice;
    if (ns > by_len) ns = by_len;
    if (ns > DEC_MAX_SPLIT) ns = DEC_MAX_SPLIT;
    if (a.max_len <= a.short_rows) ns = 1;           // every pair is short (dec_slices)
    if (ns < 1 || pairs > CUDA_DEC_COUNTERS) ns = 1; // (many pairs fill the GPU without slices)
    // a short pair over a cluster of DEC_CLUSTER blocks (the grid's slices a
    // multiple of it) only where that was measured faster or no slower
    // (docs/PERFORMANCE.md, run 32): few pairs, one block an SM for all the
    // clusters, and max_len at most DEC_CLUSTER_MAX_LEN. A cluster launch made
    // long caches' slices slower, and a batch's short caches no faster.
    int64_t cs = pairs * DEC_CLUSTER <= ci->sm_count && a.max_len <= DEC_CLUSTER_MAX_LEN && pairs <= CUDA_DEC_COUNTERS
                     ? DEC_CLUSTER
                     : 1;
#ifdef HYLO_BENCH_VARIANTS
    if (cu_env_int("HYLO_DEC_CLUSTER", DEC_CLUSTER) < DEC_CLUSTER) cs = 1; // bench-only: 1, one block a short pair
#endif
    if (cs > 1) ns = (ns + cs - 1) / cs * cs;
    arena_t *ar = &be->scratch;
    const size_t mark = arena_mark(ar);
    a.part_o = NULL, a.part_ml = NULL, a.count = ci->dec_count;
    if (ns > 1) {
        a.part_o = (float *)arena_alloc(ar, (size_t)pairs * ns * G * a.dv * sizeof(float));
        a.part_ml = (float2 *)arena_alloc(ar, (size_t)pairs * ns * G * sizeof(float2));
        if (!a.part_o || !a.part_ml) ns = cs = 1; // no room for the partials: one slice per cache, as correct, slower
    }
    a.n_split = (int)ns, a.csize = (int)cs;
    if (cs > 1)
        cu_launch_pdl_cluster(kern, dim3((unsigned)pairs, (unsigned)ns), dim3(DEC_THREADS), dim3(1, (unsigned)cs, 1),
                              dec_smem_bytes(G, a.lpr, (int)ns), cuda_stream(be), a);
    else
        cu_launch_pdl(kern, dim3((unsigned)pairs, (unsigned)ns), dim3(DEC_THREADS), dec_smem_bytes(G, a.lpr, (int)ns),
                      cuda_stream(be), a);
    cuda_check_launch(be, "k_attn_decode");
    arena_reset(ar, mark); // stream order protects the partials from later users of the scratch
}

template <bool VEC> static void dec_launch_g(be_t *be, int G, const dec_args_t &a, int64_t pairs) {
    switch (G) {
    case 1: dec_launch<1, VEC>(be, a, pairs); break;
    case 2: dec_launch<2, VEC>(be, a, pairs); break;
    case 3: dec_launch<3, VEC>(be, a, pairs); break;
    case 4: dec_launch<4, VEC>(be, a, pairs); break;
    case 6: dec_launch<6, VEC>(be, a, pairs); break;
    default: dec_launch<8, VEC>(be, a, pairs); break;
    }
}

// dqk and dv up to 256 (one 8-column piece per lane). The 16-byte loads need
// dqk and dv multiples of 8 and 16-byte aligned caches (k_rows, v_rows live on
// the device and are not checked: rows of a multiple of 8 bf16 in buffers from
// the allocator keep them so); other head dims take scalar loads.
static void cu_attn_decode(be_t *be, void *out, const void *q, int64_t ldq, void *const *k_rows, void *const *v_rows,
                           be_pages_t pg, const int32_t *len, int max_len, int N, int H, int Hkv, int dqk, int dv,
                           float scale) {
    if (N <= 0 || H <= 0) return;
    if (Hkv <= 0 || H % Hkv || dqk <= 0 || dv <= 0 || dqk > 256 || dv > 256 || max_len < 0 || N > 0x7fffffff / H) {
        cu_op_error(be, "cuda attn_decode: N=%d H=%d Hkv=%d dqk=%d dv=%d max_len=%d not supported", N, H, Hkv, dqk, dv,
                    max_len);
        return;
    }
    dec_args_t a;
    memset(&a, 0, sizeof a);
    a.out = (bf16 *)out, a.q = (const bf16 *)q, a.ldq = ldq;
    a.k_rows = (const bf16 *const *)k_rows, a.v_rows = (const bf16 *const *)v_rows, a.pg = pg, a.len = len;
    a.max_len = max_len, a.H = H, a.Hkv = Hkv, a.grp = H / Hkv, a.dqk = dqk, a.dv = dv;
    a.sl2 = scale * 1.4426950408889634f;
    const int pieces = ((dqk > dv ? dqk : dv) + 7) / 8;
    a.lpr = 1;
    while (a.lpr < pieces)
        a.lpr *= 2;
    // head chunks of at most 8, then the smallest instantiated G that holds one
    a.nhc = (a.grp + 7) / 8;
    const int per = (a.grp + a.nhc - 1) / a.nhc;
    const int G = per <= 4 ? per : per <= 6 ? 6 : 8;
    const int64_t pairs = (int64_t)N * Hkv * a.nhc;
    if (pairs > 0x7fffffff) {
        cu_op_error(be, "cuda attn_decode: N=%d Hkv=%d: too many blocks", N, Hkv);
        return;
    }
    if (dqk % 8 == 0 && dv % 8 == 0)
        dec_launch_g<true>(be, G, a, pairs);
    else
        dec_launch_g<false>(be, G, a, pairs);
}

// Grid N (one block per row): the row's k and v into its own cache rows.
__global__ void k_kv_append(bf16 *const *__restrict__ k_rows, bf16 *const *__restrict__ v_rows, be_pages_t pg,
                            int64_t ld, int64_t v_off, const int32_t *__restrict__ pos, const bf16 *__restrict__ k,
                            int64_t ldk, int kw, const bf16 *__restrict__ v, int64_t ldv, int vw) {
    const int r = blockIdx.x;
    const int64_t p = cu_page_row(pg, r, pos[r]);
    bf16 *kd = k_rows[r] + p * ld, *vd = v_rows[r] + p * ld + v_off;
    for (int i = threadIdx.x; i < kw; i += blockDim.x)
        kd[i] = k[(int64_t)r * ldk + i];
    for (int i = threadIdx.x; i < vw; i += blockDim.x)
        vd[i] = v[(int64_t)r * ldv + i];
}

static void cu_kv_append(be_t *be, void *const *k_rows, void *const *v_rows, be_pages_t pg, int64_t ld, int64_t v_off,
                         const int32_t *pos, const void *k, int64_t ldk, int kw, const void *v, int64_t ldv, int vw,
                         int N) {
    if (N <= 0) return;
    k_kv_append<<<(unsigned)N, 128, 0, cuda_stream(be)>>>((bf16 *const *)k_rows, (bf16 *const *)v_rows, pg, ld, v_off,
                                                          pos, (const bf16 *)k, ldk, kw, (const bf16 *)v, ldv, vw);
    cuda_check_launch(be, "k_kv_append");
}

extern "C" void cuda_register_attn(be_t *be) {
    be->attn_fwd = cu_attn_fwd;
    be->attn_merge = cu_attn_merge;
    be->attn_bwd = cu_attn_bwd;
    be->attn_decode = cu_attn_decode;
    be->kv_append = cu_kv_append;
}
