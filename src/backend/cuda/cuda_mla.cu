// MLA decode attention over the latent cache (weight absorption), split-K
// flash-decoding on tensor cores.
//
// For one sequence the H query heads all read the same cache rows, so the op
// is a small attention with M = heads, N = cache rows, K = r_kv + dr (scores,
// keys = whole rows [c | kpe]) and V = the c part of the same rows. Memory
// bound: every cache row is read from device memory exactly once.
//
// k_mla_short (further down): short caches (max_len <= MLA_SHORT_MAX, where
// the shape fits its shared memory) in one cluster of blocks a sequence,
// fp32 FMAs, merged through distributed shared memory, one launch. Longer
// caches, two versions. v2 (k_mla_decode2, and k_mla_combine2 for merges too large
// for one block; further down) is the default: a producer warp and a ring of
// 32-row tiles, described there. v1
// (the fallback for shapes v2 does not lay out):
// k_mla_decode: grid (n_split, B). A block takes one contiguous slice of the
// visible rows of its sequence and streams it through shared memory in stages
// of RS * 32 rows (cp.async, 3 stages in flight). Warp (ht, cc, rs) computes,
// for the 16 heads of head tile ht and the 32 rows rs of each stage, the scores
// S = Q rows^T (mma.sync m16n8k16, Q from shared memory), an online softmax in
// the exp2 domain, and O[:, cc-th column chunk of width CW] += P c. Warps of
// different cc recompute the same scores (cheap next to the bytes: the P c
// product is the larger one), so that the O accumulators fit in registers for
// r_kv up to 512. At the end the RS row groups merge in shared memory and the
// block writes one partial (m, l, unnormalised O) for its slice.
// k_mla_combine: grid (H, B), merges the n_split partials of each (b, h).
#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_vec.cuh"

// ---- kernels -----------------------------------------------------------------

enum { MLA_NR = 32, MLA_NSTG = 3 }; // rows per warp per stage; stages in flight

typedef struct {
    int H, r_kv, dr, L, Lp; // L = r_kv + dr; Lp = L rounded up to 16 (zero columns)
    int HT, CC, RS;         // head tiles of 16, column chunks of CW, row groups
    int SQ, SR;             // shared row strides (elements) of Q and of the cache stages
    int n_split;            // blocks per sequence
    float sl2;              // scale * log2(e)
    int64_t qp_ld, qp_hs;   // q_pe's row and head strides (elements, multiples of 8)
    be_pages_t pg;          // the sequences' page tables (backend.h), or none
} mla_args_t;

// The (m, l) of head row h over a block's RS row groups (cm, cl: [RS][HR]):
// the largest m, and the sum of the groups' l rescaled to it.
static __device__ __forceinline__ void rowgroups_ml(const float *cm, const float *cl, int RS, int HR, int h,
                                                    float *M_out, float *S_out) {
    float M = -INFINITY, S = 0.f;
    for (int r = 0; r < RS; r++)
        M = fmaxf(M, cm[r * HR + h]);
    for (int r = 0; r < RS; r++) {
        float l = cl[r * HR + h];
        if (l > 0.f) S += l * exp2_approx(cm[r * HR + h] - M);
    }
    *M_out = M, *S_out = S;
}

template <int CW>
__global__ void __launch_bounds__(512, 1)
    k_mla_decode(float *__restrict__ part_o, float *__restrict__ part_ml, const bf16 *__restrict__ q_lat,
                 const bf16 *__restrict__ q_pe, const bf16 *const *__restrict__ rows, int64_t max_rows,
                 const int32_t *__restrict__ len, mla_args_t a) {
    constexpr int NR = MLA_NR, NSTG = MLA_NSTG;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int HR = a.HT * 16, SQ = a.SQ, SR = a.SR, L = a.L, RS = a.RS;
    const int ST_ROWS = RS * NR;
    bf16 *sQ = (bf16 *)smem_raw;
    bf16 *sC = sQ + HR * SQ; // [NSTG][ST_ROWS][SR]

    const int b = blockIdx.y, split = blockIdx.x;
    const int tid = threadIdx.x, nthr = blockDim.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int nwarps = nthr >> 5;
    const int ht = warp % a.HT, cc = (warp / a.HT) % a.CC, rs = warp / (a.HT * a.CC);

    int64_t n = len[b];
    if (n > max_rows) n = max_rows;
    if (n < 0) n = 0;
    // this block's rows [start, end): equal slices rounded up to whole row tiles
    int64_t rps = (n + a.n_split - 1) / a.n_split;
    rps = (rps + NR - 1) / NR * NR;
    const int64_t start = (int64_t)split * rps;
    const int64_t end = start + rps < n ? start + rps : n;
    const int nrows = end > start ? (int)(end - start) : 0;
    const int n_st = (nrows + ST_ROWS - 1) / ST_ROWS;
    const bf16 *cache = rows[b]; // row 0 of this sequence's cache (or of its pages' pool)

    // Q [HR][SQ] = [q_lat | q_pe | 0], zero rows past H (plain 16-byte loads)
    for (int i = tid; i < HR * (SQ / 8); i += nthr) {
        int r = i / (SQ / 8), c = (i - r * (SQ / 8)) * 8;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < a.H && c < L)
            x = c < a.r_kv ? *(const uint4 *)(q_lat + ((int64_t)b * a.H + r) * a.r_kv + c)
                           : *(const uint4 *)(q_pe + (int64_t)b * a.qp_ld + (int64_t)r * a.qp_hs + (c - a.r_kv));
        *(uint4 *)(sQ + r * SQ + c) = x;
    }
    // columns [L, SR) of every stage row stay zero (cp.async writes [0, L) only)
    for (int i = tid; i < NSTG * ST_ROWS * ((SR - L) / 8); i += nthr) {
        int r = i / ((SR - L) / 8), c = L + (i - r * ((SR - L) / 8)) * 8;
        *(uint4 *)(sC + r * SR + c) = make_uint4(0, 0, 0, 0);
    }

    // stage st: rows [st * ST_ROWS, +ST_ROWS) of the slice; rows past the slice zero-filled
    auto load_stage = [&](int st, int buf) {
        bf16 *dst = sC + buf * ST_ROWS * SR;
        const int r0 = st * ST_ROWS;
        for (int r = warp; r < ST_ROWS; r += nwarps) {
            bool ok = r0 + r < nrows;
            const bf16 *src = ok ? cache + cu_page_row(a.pg, b, start + r0 + r) * L : cache;
            for (int c = lane * 8; c < L; c += 256)
                cp_async16(smem_u32(dst + r * SR + c), ok ? src + c : cache, ok);
        }
    };
#pragma unroll
    for (int st = 0; st < NSTG - 1; st++) {
        if (st < n_st) load_stage(st, st);
        cp_async_commit();
    }

    const uint32_t aQ = smem_u32(sQ) + (uint32_t)(((ht * 16 + (lane & 15)) * SQ + (lane >> 4) * 8) * 2);
    const uint32_t oB = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SR + ((lane >> 3) & 1) * 8) * 2);
    const uint32_t oT = (uint32_t)(((lane & 15) * SR + (lane >> 4) * 8 + cc * CW) * 2);
    float o[CW / 8][4];
#pragma unroll
    for (int i = 0; i < CW / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    const int kchunks = a.Lp / 16;

    for (int i = 0; i < n_st; i++) {
        cp_async_wait<NSTG - 2>();
        __syncthreads(); // stage i landed; everyone is done with stage i-1's buffer
        if (i + NSTG - 1 < n_st) load_stage(i + NSTG - 1, (i + NSTG - 1) % NSTG);
        cp_async_commit();
        const int rbase = i * ST_ROWS + rs * NR; // first row of this warp within the slice
        if (rbase >= nrows) continue;
        const uint32_t stage = smem_u32(sC + ((i % NSTG) * ST_ROWS + rs * NR) * SR);

        float s[NR / 8][4];
#pragma unroll
        for (int j = 0; j < NR / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        for (int kk = 0; kk < kchunks; kk++) {
            uint32_t qa[4];
            ldsm_x4(qa, aQ + kk * 32);
#pragma unroll
            for (int n2 = 0; n2 < NR / 16; n2++) {
                uint32_t bb[4];
                ldsm_x4(bb, stage + oB + (n2 * 16 * SR + kk * 16) * 2);
                mma_bf16(s[2 * n2], qa, bb[0], bb[1]);
                mma_bf16(s[2 * n2 + 1], qa, bb[2], bb[3]);
            }
        }
        // scale first (any sign of scale), mask rows past the slice
#pragma unroll
        for (int nt = 0; nt < NR / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = rbase + nt * 8 + 2 * t4 + (e & 1);
                s[nt][e] = r < nrows ? s[nt][e] * a.sl2 : -INFINITY;
            }
#pragma unroll
        for (int h = 0; h < 2; h++) { // heads g (h = 0) and g + 8 (h = 1)
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NR / 8; nt++)
                mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mnew = fmaxf(mrow[h], mx);
            float mu = mnew == -INFINITY ? 0.f : mnew;
            float alpha = exp2_approx(mrow[h] - mu);
            mrow[h] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NR / 8; nt++) {
                float p0 = exp2_approx(s[nt][2 * h] - mu), p1 = exp2_approx(s[nt][2 * h + 1] - mu);
                s[nt][2 * h] = p0, s[nt][2 * h + 1] = p1;
                sum += p0 + p1;
            }
            lrow[h] = lrow[h] * alpha + sum;
#pragma unroll
            for (int nt = 0; nt < CW / 8; nt++)
                o[nt][2 * h] *= alpha, o[nt][2 * h + 1] *= alpha;
        }
        // O[:, chunk] += P c
#pragma unroll
        for (int kc = 0; kc < NR / 16; kc++) {
            uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                              pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int d2 = 0; d2 < CW / 16; d2++) {
                uint32_t bb[4];
                ldsm_x4_t(bb, stage + oT + (kc * 16 * SR + d2 * 16) * 2);
                mma_bf16(o[2 * d2], pa, bb[0], bb[1]);
                mma_bf16(o[2 * d2 + 1], pa, bb[2], bb[3]);
            }
        }
    }

    // merge the RS row groups in shared memory (reusing the stage buffers)
    cp_async_wait<0>();
    __syncthreads();
    const int CCW = a.CC * CW;
    float *cm = (float *)sC;  // [RS][HR] running max (log2 domain)
    float *cl = cm + RS * HR; // [RS][HR] sum
    float *co = cl + RS * HR; // [HR][CCW] unnormalised output
    for (int i = tid; i < HR * CCW; i += nthr)
        co[i] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = quad_sum(lrow[h]);
        lrow[h] = l;
        if (cc == 0 && t4 == 0) {
            cm[rs * HR + ht * 16 + g + 8 * h] = mrow[h];
            cl[rs * HR + ht * 16 + g + 8 * h] = l;
        }
    }
    __syncthreads();
    // The RS row groups add into co in turn (group 0 first), one writer per
    // element per turn: a fixed order, so the sum has the same bits every run
    // (shared-memory atomics would add 3 or 4 groups in any order).
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int hr = ht * 16 + g + 8 * h;
        float M = -INFINITY;
        for (int r = 0; r < RS; r++)
            M = fmaxf(M, cm[r * HR + hr]);
        f[h] = mrow[h] == -INFINITY ? 0.f : exp2_approx(mrow[h] - M);
    }
    for (int r = 0; r < RS; r++) { // every thread reaches each barrier
        if (rs == r) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (f[h] == 0.f) continue;
                float *dst = co + (ht * 16 + g + 8 * h) * CCW + cc * CW + 2 * t4;
#pragma unroll
                for (int nt = 0; nt < CW / 8; nt++) {
                    dst[nt * 8] += o[nt][2 * h] * f[h];
                    dst[nt * 8 + 1] += o[nt][2 * h + 1] * f[h];
                }
            }
        }
        __syncthreads();
    }
    const int64_t pidx = (int64_t)b * a.n_split + split; // partial index
    for (int i = tid; i < a.H * a.r_kv; i += nthr) {
        int h = i / a.r_kv, c = i - h * a.r_kv;
        part_o[pidx * a.H * a.r_kv + i] = co[h * CCW + c];
    }
    for (int h = tid; h < a.H; h += nthr) {
        float M, S;
        rowgroups_ml(cm, cl, RS, HR, h, &M, &S);
        part_ml[(pidx * a.H + h) * 2] = M;
        part_ml[(pidx * a.H + h) * 2 + 1] = S;
    }
}

// out[b, h, :] = sum_s w_s O_s / sum_s w_s l_s, w_s = 2^(m_s - max m); zero when
// the sequence has no visible rows.
__global__ void k_mla_combine(bf16 *__restrict__ out, const float *__restrict__ part_o,
                              const float *__restrict__ part_ml, int H, int r_kv, int n_split) {
    extern __shared__ float w[]; // [n_split]
    __shared__ float red[32];
    const int h = blockIdx.x, b = blockIdx.y;
    const float *ml = part_ml + ((int64_t)b * n_split * H + h) * 2; // split s at ml[s * H * 2]
    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x)
        if (ml[(int64_t)s * H * 2 + 1] > 0.f) M = fmaxf(M, ml[(int64_t)s * H * 2]);
    M = block_reduce(M, true, red);
    float S = 0.f;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x) {
        float l = ml[(int64_t)s * H * 2 + 1];
        float ws = l > 0.f ? exp2f(ml[(int64_t)s * H * 2] - M) : 0.f;
        w[s] = ws;
        S += ws * l;
    }
    S = block_reduce(S, false, red); // its barriers also publish w[]
    const float inv = S > 0.f ? 1.f / S : 0.f;
    const float *po = part_o + ((int64_t)b * n_split * H + h) * r_kv; // split s at po[s * H * r_kv]
    for (int c = threadIdx.x; c < r_kv; c += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < n_split; s++)
            if (w[s] != 0.f) acc += w[s] * po[(int64_t)s * H * r_kv + c];
        out[((int64_t)b * H + h) * r_kv + c] = __float2bfloat16_rn(acc * inv);
    }
}

// ---- v2: warp-specialised pipeline (the default) ------------------------------
//
// Two numbers (H200, H = 32, r_kv = 128, dr = 32): a cache row is 320 bytes and
// costs 4.5 mma.sync m16n8k16 (scores 32 x 160, P c 32 x 128), so at 3 TB/s
// (70% of the 4.3 TB/s copy) an SM must take a row every ~25 clocks while
// tensor work needs ~7 and shared-memory traffic (row written once, read by the
// two head tiles) ~12. v1 reached ~8 GB/s per SM (~4.8 us per 128-row stage):
// its 8 warps load, wait on one __syncthreads and compute in lockstep, so the
// latency of every phase is exposed. v2 separates the roles:
//  - one producer warp streams 32-row tiles into a ring of NSTG slots (TMA
//    tensor copies of 64-column boxes, completing on an mbarrier with the byte
//    count; the other ways to fill a slot are listed at MLA2_LOAD_TILES);
//  - HT * CC * RS consumer warps; row group rs takes tiles rs, rs + RS, ...
//    (NSTG a multiple of RS: each slot serves one row group, launch_mla2)
//    and each warp waits only for its own tile's "full" barrier and frees the
//    slot with one arrival on its "empty" barrier: no block-wide barrier in the
//    loop, so warps drift apart and load, mma, softmax overlap across warps;
//  - the ring holds NSTG - RS tiles ahead of the consumers (>= ~100 KB per SM
//    in flight at the shapes above);
//  - O is rescaled only when a row maximum moves (warp vote): after the first
//    tiles the maximum rarely changes, so the 64 FMUL per tile mostly go.
// Predicted: 70-85% of the copy bandwidth at len >= 256K. Measured with one
// bulk copy per row (run 7): 21-31% at r_kv 128, 74.8% only at r_kv 512, 1M;
// the time followed the row count, not the bytes or the heads (the per-row
// copies were the limit, not the mma work as first guessed). With the tiled
// copies (run 9, docs/PERFORMANCE.md): at 1M, 64% (B = 1, H = 32) to 98%
// (B = 8, H = 9); at 64K, B = 1, 18-31%: the fixed cost of the two launches
// and the combine (~20 us) is most of a 5 us read.
// Why not attn_decode's scheme (k_attn_decode: rows streamed into registers,
// fp32 FMAs and shuffle reductions per lane): there each row serves the few
// query heads of one KV head; here every row serves all H heads (9 to 32), so
// the same per-lane work would cost several times the issue slots a row's
// bytes allow at full bandwidth. The products stay on the tensor cores, fed
// through shared memory by the tensor copies.
//
// Slices and their merge. The grid's n_split is set by host arguments only
// (one wave of blocks over the batch, at least MLA_MIN_SLICE_TILES tiles of
// max_len each; one when max_len <= short_rows), so a recorded step replays
// it; each sequence then uses ns = mla_slices() of them by its own length,
// read in the kernel (the other blocks exit at once):
//  - n <= short_rows (one fill of the ring: every tile in flight at once; and
//    up to MLA_MIN_SLICE_TILES tiles, the least a slice holds): one block
//    takes every row and writes the output, no partials (production); in
//    the bench-variants build (HYLO_MLA_CLUSTER = 8, launch_mla2) the csize
//    blocks of one cluster may share its tiles instead, each merges its row groups
//    into a partial in its shared memory, and block 0 merges the cluster's
//    partials from theirs (distributed shared memory) and writes the output:
//    no partials in global memory, fence or counter. A block that the tiles
//    do not reach contributes m = -inf, l = 0, O = 0, which the merge weighs 0;
//  - else slices of at least MLA_MIN_SLICE_TILES tiles, each block writing
//    its partial (m, l, unnormalised O); when ns <= merge_max the last block
//    of the sequence to finish (a counter per sequence, cuda_impl_t.dec_count,
//    left at 0) merges them in the same launch;
//  - more slices are merged by k_mla_combine2, a second kernel launched with
//    programmatic dependent launch (it starts while the decode drains and
//    waits on griddepcontrol.wait; its blocks exit for the sequences the
//    decode merged). Why not always the last block: the merge reads ns H
//    r_kv 4 bytes of partials, 1.6 MB at B = 1 (132 slices, H 24, r_kv 128),
//    ~15 us for one SM at ~100 GB/s from L2, where the combine's H B blocks
//    share it. merge_max holds one block's read to MLA_MERGE_BYTES (~2 us).
// At n = max_len, ns = n_split (host and kernel apply the same minimum).

enum { MLA2_NR = 32, MLA2_MAXW = 11, MLA2_MAXSTG = 32, MLA2_BAR_BYTES = 2 * MLA2_MAXSTG * 8 };
// Slices of at least this many tiles (of max_len on the host, of the length in
// the kernel): at short contexts more slices only add partials to merge.
enum { MLA_MIN_SLICE_TILES = 8 };
// The most partial bytes (ns H r_kv 4) one block merges (see above). One
// block reads them at far less than L2's rate (a chain of loads a thread):
// at 8,192 rows, 32 slices, the last-block merge of 147 KB (H 9, r_kv 128)
// took 8 us more than the combine kernel, of 55 KB (r_kv 48) 4 us more (run 35,
// docs/PERFORMANCE.md), so only a few KB stay in the decode.
enum { MLA_MERGE_BYTES = 32 << 10 };
// Blocks of a short sequence's cluster (the portable cluster size), and the
// longest max_len that launches clusters (launch_mla2), as attention decode's
// DEC_CLUSTER and DEC_CLUSTER_MAX_LEN.
enum { MLA_CLUSTER = 8, MLA_CLUSTER_MAX_LEN = 4096 };
namespace cg = cooperative_groups;

// How the producer fills a ring slot (template argument LOAD of k_mla_decode2):
//  - MLA2_LOAD_TILES: a few TMA tensor copies per tile, boxes of 64 columns x
//    32 rows in the 128-byte swizzled layout (one copy per 4 KB instead of one
//    per row); slot = NB boxes of [32 rows][128 bytes], 16-byte chunk j of row r
//    stored at chunk j ^ (r % 8), so ldmatrix reads stay free of bank conflicts
//    without padding. Columns past L come back as zeros (out of the tensor).
//  - MLA2_LOAD_ROWS: one 1-D bulk copy per row into padded rows of SR elements.
//  - MLA2_LOAD_CPASYNC: 16-byte cp.async by the producer's 32 lanes, same layout
//    (bench-only: 2-7x slower than the tiles in run 9; instantiated only in
//    the bench-variants build).
// Run 7 measured the same ~25M rows/s per SM at r_kv 128 and 512 with
// MLA2_LOAD_ROWS, whatever the bytes per row or the heads: the per-row copies
// were the limit, hence the tiled copies.
enum { MLA2_LOAD_TILES = 0, MLA2_LOAD_ROWS = 1, MLA2_LOAD_CPASYNC = 2 };
enum { MLA2_BOX = 64, MLA2_BOX_BYTES = MLA2_NR * 128 }; // box columns (128 bytes); bytes of one box

typedef struct {
    int H, r_kv, dr, L, Lp;
    int HT, CC, RS, NCW;  // head tiles, column chunks, row groups; NCW = HT * CC * RS consumer warps
    int SQ, SR;           // shared row strides (elements) of Q and of the ring slots
    int NSTG;             // ring slots of MLA2_NR rows
    int NB;               // MLA2_LOAD_TILES: boxes of MLA2_BOX columns per slot
    int n_split;          // slices of the grid (per sequence)
    int short_rows;       // a sequence of at most this many rows: one block (or cluster), no partials (NSTG tiles)
    int csize;            // blocks of a short sequence: a cluster along x (1: one block)
    int merge_max;        // a sequence of at most this many slices is merged by its last block
    int neg;              // scale < 0: Q is negated in shared memory and sl2 = |scale| log2 e
    float sl2;            // > 0
    int64_t qp_ld, qp_hs; // q_pe's row and head strides (elements, multiples of 8)
    be_pages_t pg;        // the sequences' page tables (backend.h), or none: a tile of 32 rows lies in one page
} mla2_args_t;

// Slices a sequence of n rows uses of the grid's n_split (the comment above
// MLA2_NR): the cluster's csize blocks when short; the same in every block of
// the sequence and in the combine.
static __device__ __forceinline__ int mla_slices(int64_t n, int n_split, int short_rows, int csize) {
    if (n <= short_rows) return csize;
    const int64_t s = (n + MLA_MIN_SLICE_TILES * MLA2_NR - 1) / (MLA_MIN_SLICE_TILES * MLA2_NR);
    return s < n_split ? (int)s : n_split;
}

// Address of the 16-byte chunk `chunk` (column / 8) of row r in a MLA2_LOAD_TILES slot.
static __device__ __forceinline__ uint32_t tile_chunk(uint32_t slot, int r, int chunk) {
    return slot + (uint32_t)((chunk >> 3) * MLA2_BOX_BYTES + r * 128 + (((chunk & 7) ^ (r & 7)) << 4));
}
// The barrier receives one arrival once all earlier cp.async of this thread landed.
static __device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Where mla_merge finds its T partial results (m, l and unnormalised O of H
// heads of r_kv columns):
//  - MLA_PARTS_GLOBAL: a sequence's slices in global memory, which other
//    blocks wrote (read through L2, __ldcg);
//  - MLA_PARTS_ROWS: this block's row groups in its shared memory, whose
//    (m, l) the merge uses in place (the weights replace m);
//  - MLA_PARTS_CLUSTER: one partial in the shared memory of each block of
//    the cluster, t the block's rank (distributed shared memory).
enum { MLA_PARTS_GLOBAL = 0, MLA_PARTS_ROWS = 1, MLA_PARTS_CLUSTER = 2 };

// T partials as mla_merge reads them: (m, l) of partial t, head h at
// ml[t ml_t + h]; its O from column c at o[t o_t + h o_h + c] (16-byte
// aligned). MLA_PARTS_CLUSTER: ml and o in this block's shared memory, partial
// t at the same offsets in the block of rank t (ml_t, o_t unused).
typedef struct {
    float2 *ml;
    const float *o;
    int64_t o_t;
    int ml_t, o_h;
} mla_parts_t;

template <int SRC> static __device__ __forceinline__ float2 mla_part_ml(const mla_parts_t &p, int t, int h) {
    if (SRC == MLA_PARTS_CLUSTER) return cg::this_cluster().map_shared_rank(p.ml, t)[h];
    const float2 *q = p.ml + (int64_t)t * p.ml_t + h;
    return SRC == MLA_PARTS_GLOBAL ? __ldcg(q) : *q;
}
template <int SRC> static __device__ __forceinline__ float4 mla_part_o4(const mla_parts_t &p, int t, int h, int c) {
    const float *q = SRC == MLA_PARTS_CLUSTER ? cg::this_cluster().map_shared_rank(p.o, t) : p.o + t * p.o_t;
    q += (int64_t)h * p.o_h + c;
    return SRC == MLA_PARTS_GLOBAL ? __ldcg((const float4 *)q) : *(const float4 *)q;
}
// Columns c..c+3 of head h of a merge's result: out normalised by sinv[h]
// (bf16), or without out, the unnormalised partial po.
static __device__ __forceinline__ void mla_merge_put(bf16 *out, float *po, const float *sinv, int h, int c, int r_kv,
                                                     float4 acc) {
    const int64_t at = (int64_t)h * r_kv + c;
    if (!out) {
        *(float4 *)(po + at) = acc;
        return;
    }
    const float inv = sinv[h];
    out[at] = __float2bfloat16_rn(acc.x * inv), out[at + 1] = __float2bfloat16_rn(acc.y * inv);
    out[at + 2] = __float2bfloat16_rn(acc.z * inv), out[at + 3] = __float2bfloat16_rn(acc.w * inv);
}

// Merges T partial results, by the whole block (every thread calls it):
// M = max m_t over the partials with l_t > 0, w_t = 2^(m_t - M) (0 where
// l_t = 0, so an empty partial, m = -inf, weighs nothing), S = sum_t w_t l_t,
// O = sum_t w_t O_t, as k_mla_combine2; in a fixed order (t ascending, or
// strided subsets of t added in subset order when there are fewer 4-column
// units than threads and the partials are not the block's own row groups),
// so the same bits on every run. Writes out = O / S ([H][r_kv] bf16, zeros
// where S = 0) when out is given, else the partial: O to po ([H][r_kv]) and
// (M, S) to pml[h]. Shared sm (16-byte aligned): the (m, l) table, 2 T H
// floats (none for MLA_PARTS_ROWS, merged in place), then H floats rounded up
// to 4, then a float4 per thread (none for MLA_PARTS_ROWS).
template <int SRC>
static __device__ void mla_merge(const mla_parts_t p, int T, int H, int r_kv, float *sm, bf16 *__restrict__ out,
                                 float *po, float2 *pml) {
    const int tid = threadIdx.x, nthr = blockDim.x, cq = r_kv / 4;
    const int tabf = SRC == MLA_PARTS_ROWS ? 0 : 2 * T * H;
    float2 *tab = SRC == MLA_PARTS_ROWS ? p.ml : (float2 *)sm; // [T][tld] (m, l), then (weight, l)
    const int tld = SRC == MLA_PARTS_ROWS ? p.ml_t : H;
    float *sinv = sm + tabf; // [H] 1 / S
    float4 *red = (float4 *)(sm + ((tabf + H + 3) & ~3));
    if (SRC != MLA_PARTS_ROWS) { // every (m, l) loaded at once (one round trip)
        for (int i = tid; i < T * H; i += nthr) {
            const int t = i / H;
            tab[i] = mla_part_ml<SRC>(p, t, i - t * H);
        }
        __syncthreads();
    }
    for (int h = tid; h < H; h += nthr) {
        float M = -INFINITY;
        for (int t = 0; t < T; t++)
            if (tab[t * tld + h].y > 0.f) M = fmaxf(M, tab[t * tld + h].x);
        float S = 0.f;
        for (int t = 0; t < T; t++) {
            const float2 v = tab[t * tld + h];
            const float w = v.y > 0.f ? exp2f(v.x - M) : 0.f;
            tab[t * tld + h].x = w;
            S += w * v.y;
        }
        sinv[h] = S > 0.f ? 1.f / S : 0.f;
        if (!out) pml[h] = make_float2(M, S);
    }
    __syncthreads();
    // unit i = h cq + q: columns 4q..4q+3 of head h
    const int units = H * cq;
    if (SRC == MLA_PARTS_ROWS || units >= nthr) {
        for (int i = tid; i < units; i += nthr) {
            const int h = i / cq, c = (i - h * cq) * 4;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
            for (int t = 0; t < T; t++) {
                const float w = tab[t * tld + h].x;
                const float4 x = mla_part_o4<SRC>(p, t, h, c);
                acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y);
                acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
            }
            mla_merge_put(out, po, sinv, h, c, r_kv, acc);
        }
        return;
    }
    // fewer units than threads: nsub subsets of the partials per unit (more
    // loads in flight), added in subset order
    const int nsub = nthr / units, sub = tid / units, i = tid - sub * units;
    if (sub < nsub) {
        const int h = i / cq, c = (i - h * cq) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int t = sub; t < T; t += nsub) {
            const float w = tab[t * tld + h].x;
            const float4 x = mla_part_o4<SRC>(p, t, h, c);
            acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y);
            acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
        }
        red[tid] = acc;
    }
    __syncthreads();
    if (tid < units) {
        float4 acc = red[tid];
        for (int k = 1; k < nsub; k++) {
            const float4 x = red[k * units + tid];
            acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
        }
        const int h = tid / cq;
        mla_merge_put(out, po, sinv, h, (tid - h * cq) * 4, r_kv, acc);
    }
}

// Float offset in the ring of a clustered block's merged partial (O [H][r_kv]
// then (m, l) [H]): past the larger of its row groups' merge area ((m, l)
// [RS][HR], O [RS][HR][CCWp]) and block 0's scratch for the cluster merge
// (mla_merge), which use the ring's start one after the other.
static __host__ __device__ __forceinline__ int64_t mla2_cluster_part(int RS, int HR, int CCWp, int H, int cs,
                                                                     int nthr) {
    const int64_t rows = (int64_t)RS * HR * (2 + CCWp), merge = ((2 * cs * H + H + 3) & ~3) + 4 * (int64_t)nthr;
    return rows > merge ? rows : merge;
}

// Grid (n_split rounded up to csize, B) in clusters of (csize, 1), (NCW + 1)
// warps; the last warp is the producer. Shared: [barriers 512 B][Q HR x SQ]
// [ring NSTG slots] (MLA2_LOAD_TILES: the ring starts at the next 1024-byte
// boundary, which the swizzle pattern needs); the ring is reused for the final
// merge of the RS row groups (its scratch in Q's place), then for the merge
// of the slices or of the cluster's blocks. out [B, H, r_kv]; part_o,
// part_ml, count: unused when n_split = 1.
template <int CW, int LOAD>
__global__ void __launch_bounds__((MLA2_MAXW + 1) * 32, 1)
    k_mla_decode2(bf16 *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml,
                  unsigned *__restrict__ count, const bf16 *__restrict__ q_lat, const bf16 *__restrict__ q_pe,
                  const bf16 *const *__restrict__ rows, const bf16 *pool, int64_t max_rows,
                  const int32_t *__restrict__ len, mla2_args_t a, const __grid_constant__ CUtensorMap tmap) {
    constexpr int NR = MLA2_NR;
    constexpr bool TILES = LOAD == MLA2_LOAD_TILES;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int HR = a.HT * 16, SQ = a.SQ, SR = a.SR, L = a.L, RS = a.RS, NCW = a.NCW, NSTG = a.NSTG;
    const uint32_t bar_full = smem_u32(smem_raw), bar_empty = bar_full + MLA2_MAXSTG * 8;
    bf16 *sQ = (bf16 *)(smem_raw + MLA2_BAR_BYTES);
    bf16 *sC = sQ + HR * SQ; // [NSTG][NR][SR], or [NSTG][NB][NR][128 bytes] swizzled
    if (TILES) sC = (bf16 *)((unsigned char *)sC + ((1024u - (smem_u32(sC) & 1023u)) & 1023u));
    const uint32_t slot_bytes = TILES ? (uint32_t)(a.NB * MLA2_BOX_BYTES) : (uint32_t)(NR * SR * 2);

    const int b = blockIdx.y, split = blockIdx.x; // split: the block's rank in a short sequence's cluster
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // the ring's barriers read nothing the kernel before writes: set up while it may still run
    if (tid == 0) {
        for (int s = 0; s < NSTG; s++) {
            mbar_init(bar_full + 8 * s, LOAD == MLA2_LOAD_CPASYNC ? 32 : 1);
            mbar_init(bar_empty + 8 * s, a.HT * a.CC);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    // launched as a programmatic dependent launch (cuda_vec.cuh): the kernel
    // before it has finished once this returns; then the combine may be
    // scheduled (it waits for this grid to finish)
    griddep_wait();
    griddep_launch_dependents();

    int64_t n = len[b];
    const bf16 *cache = rows[b]; // row 0 of this sequence's cache (or of its pages' pool)
    if (n > max_rows) n = max_rows;
    if (n < 0) n = 0;
    const int ns = mla_slices(n, a.n_split, a.short_rows, a.csize);
    // a short sequence over the cluster's blocks: every one of them stays to
    // the end (ns = csize) and takes part in both cluster barriers below
    const bool clustered = a.csize > 1 && n <= a.short_rows;
    // a slice this sequence's length leaves unused: the whole block exits,
    // before any __syncthreads (a cluster all of whose blocks exit, or one of
    // a long sequence, whose blocks share no barrier). The test also reads the
    // cache pointer (never 1: rows are 16-byte aligned), so that its load is
    // issued with len's, not one round trip after it (past the branch, where
    // the compiler may put it)
    if ((split >= ns) & ((uintptr_t)cache != 1)) return;
    int64_t rps = (n + ns - 1) / ns;
    rps = (rps + NR - 1) / NR * NR; // slices of whole tiles: a tile lies in one page
    const int64_t start = (int64_t)split * rps;
    const int64_t end = start + rps < n ? start + rps : n;
    const int nrows = end > start ? (int)(end - start) : 0;
    const int n_tiles = (nrows + NR - 1) / NR;
    // MLA2_LOAD_TILES: the sequence's row 0 as a row of the pool the tensor map describes
    const int64_t row0 = TILES ? (int64_t)(cache - pool) / L : 0;

    __syncthreads(); // the barriers are initialised

    float o[CW / 8][4];
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < CW / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const int ht = warp % a.HT, cc = (warp / a.HT) % a.CC, rs = warp / (a.HT * a.CC);

    if (warp == NCW) {
        // ---- producer: tile t -> slot t % NSTG once its previous tile is consumed
        for (int t = 0; t < n_tiles; t++) {
            const int slot = t % NSTG, fill = t / NSTG;
            if (fill > 0) mbar_wait(bar_empty + 8 * slot, (fill - 1) & 1);
            const int valid = nrows - t * NR < NR ? nrows - t * NR : NR;
            bf16 *dst = (bf16 *)((unsigned char *)sC + slot * slot_bytes);
            // the tile's rows: one run of NR rows in memory (a page holds whole tiles)
            const bf16 *src = cache + cu_page_row(a.pg, b, start + (int64_t)t * NR) * L;
            if (TILES) {
                // whole boxes, rows past the slice included (the consumers zero those)
                if (lane == 0) {
                    const uint32_t bar = bar_full + 8 * slot;
                    mbar_arrive_expect_tx(bar, slot_bytes);
                    const int y = (int)(row0 + cu_page_row(a.pg, b, start + (int64_t)t * NR));
                    for (int bx = 0; bx < a.NB; bx++)
                        tensor_g2s(smem_u32(dst) + bx * MLA2_BOX_BYTES, &tmap, bx * MLA2_BOX, y, bar);
                }
            } else if (LOAD == MLA2_LOAD_ROWS) {
                // rows past the slice (last tile only) are zeroed: their weight is 0 and 0 * stale must stay 0
                if (valid < NR) {
                    for (int i = lane; i < (NR - valid) * (L / 8); i += 32) {
                        int r = valid + i / (L / 8), c = (i % (L / 8)) * 8;
                        *(uint4 *)(dst + r * SR + c) = make_uint4(0, 0, 0, 0);
                    }
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                }
                __syncwarp();
                if (lane == 0) mbar_arrive_expect_tx(bar_full + 8 * slot, (uint32_t)(valid * L * 2));
                __syncwarp();
                if (lane < valid)
                    bulk_g2s(smem_u32(dst + lane * SR), src + (int64_t)lane * L, (uint32_t)(L * 2),
                             bar_full + 8 * slot);
            } else {
                // 16-byte chunks over the tile's rows; rows past the slice are zero-filled
                const int cpr = L / 8;
                int r = lane / cpr, c = lane - r * cpr;
                for (int i = lane; i < NR * cpr; i += 32) {
                    bool ok = r < valid;
                    cp_async16(smem_u32(dst + r * SR + c * 8), ok ? src + (int64_t)r * L + c * 8 : cache, ok);
                    c += 32;
                    while (c >= cpr)
                        c -= cpr, r++;
                }
                cp_async_mbar_arrive(bar_full + 8 * slot);
            }
        }
        if (LOAD == MLA2_LOAD_CPASYNC) cp_async_wait<0>();
    } else {
        // ---- consumers
        const int nct = NCW * 32;
        for (int i = tid; i < HR * (SQ / 8); i += nct) {
            int r = i / (SQ / 8), c = (i - r * (SQ / 8)) * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (r < a.H && c < L) {
                x = c < a.r_kv ? *(const uint4 *)(q_lat + ((int64_t)b * a.H + r) * a.r_kv + c)
                               : *(const uint4 *)(q_pe + (int64_t)b * a.qp_ld + (int64_t)r * a.qp_hs + (c - a.r_kv));
                if (a.neg) x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
            }
            *(uint4 *)(sQ + r * SQ + c) = x;
        }
        // columns [L, SR) of every slot row stay zero (the copies write [0, L) only)
        for (int i = tid; !TILES && i < NSTG * NR * ((SR - L) / 8); i += nct) {
            int r = i / ((SR - L) / 8), c = L + (i - r * ((SR - L) / 8)) * 8;
            *(uint4 *)(sC + r * SR + c) = make_uint4(0, 0, 0, 0);
        }
        named_sync(1, nct);

        const uint32_t aQ = smem_u32(sQ) + (uint32_t)(((ht * 16 + (lane & 15)) * SQ + (lane >> 4) * 8) * 2);
        const uint32_t oB = (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * SR + ((lane >> 3) & 1) * 8) * 2);
        const uint32_t oT = (uint32_t)(((lane & 15) * SR + (lane >> 4) * 8 + cc * CW) * 2);
        const int rB = (lane & 7) + ((lane >> 4) << 3); // MLA2_LOAD_TILES: row of this lane's ldmatrix address
        const int kchunks = a.Lp / 16;
        const float sl2 = a.sl2;

        for (int t = rs; t < n_tiles; t += RS) {
            const int slot = t % NSTG;
            mbar_wait(bar_full + 8 * slot, (t / NSTG) & 1);
            const uint32_t stage = smem_u32(sC) + slot * slot_bytes;
            const int valid = nrows - t * NR;
            if (TILES && valid < NR) {
                // last tile: the boxes brought rows past the slice (another slice's,
                // or never written: maybe NaN). Their weights are 0, and 0 * NaN
                // would poison P c, so each warp zeroes them before reading the
                // slot; warps sharing the slot write the same zeros.
                unsigned char *sl = (unsigned char *)sC + slot * slot_bytes;
                for (int i = lane; i < (NR - valid) * a.NB * 8; i += 32) {
                    const int bx = i / ((NR - valid) * 8), rem = i - bx * (NR - valid) * 8;
                    *(uint4 *)(sl + bx * MLA2_BOX_BYTES + (valid + (rem >> 3)) * 128 + (rem & 7) * 16) =
                        make_uint4(0, 0, 0, 0);
                }
                __syncwarp();
            }

            float s[NR / 8][4];
#pragma unroll
            for (int j = 0; j < NR / 8; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 2
            for (int kk = 0; kk < kchunks; kk++) {
                uint32_t qa[4];
                ldsm_x4(qa, aQ + kk * 32);
#pragma unroll
                for (int n2 = 0; n2 < NR / 16; n2++) {
                    uint32_t bb[4];
                    if (TILES)
                        ldsm_x4(bb, tile_chunk(stage, n2 * 16 + rB, kk * 2 + ((lane >> 3) & 1)));
                    else
                        ldsm_x4(bb, stage + oB + (n2 * 16 * SR + kk * 16) * 2);
                    mma_bf16(s[2 * n2], qa, bb[0], bb[1]);
                    mma_bf16(s[2 * n2 + 1], qa, bb[2], bb[3]);
                }
            }
            if (valid < NR) { // last tile of the slice
#pragma unroll
                for (int nt = 0; nt < NR / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (nt * 8 + 2 * t4 + (e & 1) >= valid) s[nt][e] = -INFINITY;
            }
            // online softmax on raw scores (sl2 > 0); heads g (h = 0) and g + 8 (h = 1)
            float mnew[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NR / 8; nt++)
                    mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                mnew[h] = fmaxf(mrow[h], mx * sl2); // finite: every tile has a visible row
            }
            if (__any_sync(0xffffffffu, mnew[0] > mrow[0] || mnew[1] > mrow[1])) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float alpha = exp2_approx(mrow[h] - mnew[h]); // 0 on the first tile (mrow = -inf)
                    mrow[h] = mnew[h];
                    lrow[h] *= alpha;
#pragma unroll
                    for (int nt = 0; nt < CW / 8; nt++)
                        o[nt][2 * h] *= alpha, o[nt][2 * h + 1] *= alpha;
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NR / 8; nt++) {
                    float p0 = exp2_approx(fmaf(s[nt][2 * h], sl2, -mrow[h]));
                    float p1 = exp2_approx(fmaf(s[nt][2 * h + 1], sl2, -mrow[h]));
                    s[nt][2 * h] = p0, s[nt][2 * h + 1] = p1;
                    sum += p0 + p1;
                }
                lrow[h] += sum;
            }
            // O[:, chunk] += P c
#pragma unroll
            for (int kc = 0; kc < NR / 16; kc++) {
                uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                  pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                  pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
                for (int d2 = 0; d2 < CW / 16; d2++) {
                    uint32_t bb[4];
                    if (TILES)
                        ldsm_x4_t(bb, tile_chunk(stage, kc * 16 + (lane & 15), (cc * CW + d2 * 16) / 8 + (lane >> 4)));
                    else
                        ldsm_x4_t(bb, stage + oT + (kc * 16 * SR + d2 * 16) * 2);
                    mma_bf16(o[2 * d2], pa, bb[0], bb[1]);
                    mma_bf16(o[2 * d2 + 1], pa, bb[2], bb[3]);
                }
            }
            __syncwarp(); // every lane's reads of the slot are done
            if (lane == 0) mbar_arrive(bar_empty + 8 * slot);
        }
    }

    // ---- merge the RS row groups (the ring is free: every tile was consumed)
    __syncthreads();
    const int CCW = a.CC * CW, CCWp = CCW + 4;
    float2 *eml = (float2 *)sC;           // [RS][HR] (running max in the log2 domain, sum) of each row group
    float *eo = (float *)(eml + RS * HR); // [RS][HR][CCWp] unnormalised O of each row group
    if (warp < NCW) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int hr = ht * 16 + g + 8 * h;
            const float l = quad_sum(lrow[h]);
            if (cc == 0 && t4 == 0) eml[rs * HR + hr] = make_float2(mrow[h], l);
            float *dst = eo + (rs * HR + hr) * CCWp + cc * CW + 2 * t4;
#pragma unroll
            for (int nt = 0; nt < CW / 8; nt++)
                *(float2 *)(dst + nt * 8) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
        }
    }
    __syncthreads();
    // the block's result: the output when it is the sequence's only slice; a
    // partial in its shared memory for block 0 of its cluster; else its
    // slice's partial in global memory. The merge's scratch in Q's place,
    // which nothing reads any more (H floats: Q holds HR SQ bf16, SQ >= 24).
    const int64_t pidx = (int64_t)b * a.n_split + split;
    float *cpo = (float *)sC + mla2_cluster_part(RS, HR, CCWp, a.H, a.csize, blockDim.x); // [H][r_kv]
    float2 *cpml = (float2 *)(cpo + a.H * a.r_kv);                                        // [H]
    bf16 *ob = out + (int64_t)b * a.H * a.r_kv;
    float *po = NULL;
    float2 *pml = NULL;
    if (clustered)
        po = cpo, pml = cpml;
    else if (ns > 1)
        po = part_o + pidx * a.H * a.r_kv, pml = (float2 *)part_ml + pidx * a.H;
    const mla_parts_t groups = {eml, eo, (int64_t)HR * CCWp, HR, CCWp};
    mla_merge<MLA_PARTS_ROWS>(groups, RS, a.H, a.r_kv, (float *)sQ, ns == 1 ? ob : NULL, po, pml);
    if (ns == 1) return;
    if (clustered) {
        // block 0 merges the cluster's partials from their blocks' shared
        // memory in rank order (= row order), its scratch over its own row
        // groups' area, which every thread of it is past (first sync)
        cg::cluster_group cl = cg::this_cluster();
        cl.sync(); // every block's partial written (release / acquire at cluster scope)
        if (split == 0) {
            const mla_parts_t blocks = {cpml, cpo, 0, 0, a.r_kv};
            mla_merge<MLA_PARTS_CLUSTER>(blocks, ns, a.H, a.r_kv, (float *)sC, ob, NULL, NULL);
        }
        cl.sync(); // no block leaves while block 0 may still read its memory
        return;
    }
    if (ns > a.merge_max) return; // k_mla_combine2 merges this sequence

    // the last block of the sequence to finish merges its ns partials; the
    // flag in Q's shared memory, which nothing reads any more (static shared
    // memory would come out of the ring's budget, sized to the last slot)
    unsigned *s_last = (unsigned *)sQ;
    __threadfence(); // this block's partial is visible before its count
    __syncthreads(); // (also: every read of the row groups' merge, its scratch in sQ included, is done)
    if (tid == 0) *s_last = atomicAdd(&count[b], 1u) == (unsigned)ns - 1;
    __syncthreads();
    if (!*s_last) return;
    __threadfence();                           // the other blocks' partials are read after their counts
    const int64_t pb = (int64_t)b * a.n_split; // the sequence's first partial
    const mla_parts_t slices = {(float2 *)part_ml + pb * a.H, part_o + pb * a.H * a.r_kv, (int64_t)a.H * a.r_kv, a.H,
                                a.r_kv};
    mla_merge<MLA_PARTS_GLOBAL>(slices, ns, a.H, a.r_kv, (float *)sC, ob, NULL, NULL);
    if (tid == 0) count[b] = 0; // ready for the next launch (stream order)
}

// out[b, h, :] = sum_s w_s O_s / sum_s w_s l_s, w_s = 2^(m_s - max m), as k_mla_combine,
// but 256 threads per (h, b), each summing float4 columns over a strided subset of
// the splits (several loads in flight), then a reduction over the subsets. May
// start before the decode grid finishes (programmatic dependent launch): reads
// nothing before griddepcontrol.wait. Only for the sequences of more than
// merge_max slices (mla_slices of its length; k_mla_decode2 wrote the others).
__global__ void __launch_bounds__(256)
    k_mla_combine2(bf16 *__restrict__ out, const float *__restrict__ part_o, const float *__restrict__ part_ml,
                   const int32_t *__restrict__ len, int64_t max_rows, int H, int r_kv, int n_split, int short_rows,
                   int merge_max) {
    extern __shared__ __align__(16) float cw_s[]; // [n_split] weights, then [G][CQ] float4 partial sums
    __shared__ float red[32];
    griddep_wait();
    const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    int64_t n = len[b];
    n = n < 0 ? 0 : n > max_rows ? max_rows : n;
    // partials of this sequence (the stride stays n_split); a short one has
    // none (its one block or cluster wrote the output), so csize 1 here
    const int ns = mla_slices(n, n_split, short_rows, 1);
    if (ns <= merge_max) return;                                    // the decode wrote this sequence's output
    const float *ml = part_ml + ((int64_t)b * n_split * H + h) * 2; // split s at ml[s * H * 2]
    float M = -INFINITY;
    for (int s = tid; s < ns; s += blockDim.x)
        if (ml[(int64_t)s * H * 2 + 1] > 0.f) M = fmaxf(M, ml[(int64_t)s * H * 2]);
    M = block_reduce(M, true, red);
    float S = 0.f;
    for (int s = tid; s < ns; s += blockDim.x) {
        float l = ml[(int64_t)s * H * 2 + 1];
        float ws = l > 0.f ? exp2f(ml[(int64_t)s * H * 2] - M) : 0.f;
        cw_s[s] = ws;
        S += ws * l;
    }
    S = block_reduce(S, false, red); // its barriers also publish the weights
    const float inv = S > 0.f ? 1.f / S : 0.f;
    const int CQ = r_kv / 4;
    const int64_t sstride = (int64_t)H * CQ; // float4 stride between splits
    const float4 *po = (const float4 *)(part_o + ((int64_t)b * n_split * H + h) * r_kv);
    bf16 *orow = out + ((int64_t)b * H + h) * r_kv;
    if (CQ >= (int)blockDim.x) {
        for (int q = tid; q < CQ; q += blockDim.x) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
            for (int s = 0; s < ns; s++) {
                float w = cw_s[s];
                float4 x = po[s * sstride + q];
                acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y);
                acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
            }
            orow[4 * q] = __float2bfloat16_rn(acc.x * inv), orow[4 * q + 1] = __float2bfloat16_rn(acc.y * inv);
            orow[4 * q + 2] = __float2bfloat16_rn(acc.z * inv), orow[4 * q + 3] = __float2bfloat16_rn(acc.w * inv);
        }
        return;
    }
    const int G = blockDim.x / CQ, grp = tid / CQ, q = tid - grp * CQ;
    float4 *part = (float4 *)(cw_s + (n_split + 3) / 4 * 4);
    if (grp < G) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = grp; s < ns; s += G) {
            float w = cw_s[s];
            float4 x = po[s * sstride + q];
            acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y);
            acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
        }
        part[grp * CQ + q] = acc;
    }
    __syncthreads();
    if (tid < CQ) {
        float4 acc = part[tid];
        for (int gi = 1; gi < G; gi++) {
            float4 x = part[gi * CQ + tid];
            acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
        }
        orow[4 * tid] = __float2bfloat16_rn(acc.x * inv), orow[4 * tid + 1] = __float2bfloat16_rn(acc.y * inv);
        orow[4 * tid + 2] = __float2bfloat16_rn(acc.z * inv), orow[4 * tid + 3] = __float2bfloat16_rn(acc.w * inv);
    }
}

// ---- short sequences: one cluster of blocks a sequence, fp32 FMAs -------------
//
// k_mla_short, the path of every max_len <= MLA_SHORT_MAX (mla_decode) whose
// shape fits its shared memory: at a few thousand rows or less the op is a
// few hundred thousand FMAs and tens of KB, and what costs is latency (v2's
// producer warp, ring barriers and merges took ~11 us at 256 rows of the
// SmolLM2 hybrid's layer), so this is one pass with no ring, no partials in
// global memory, no atomics and no tensor copies:
//  - grid (S, B) in clusters of (S, 1, 1): the S blocks of a cluster share
//    sequence b, block s (its rank) rows [s rps, (s + 1) rps) of its n =
//    min(len[b], max_len) rows, rps = ceil(n / S) (a block past the rows
//    has none: m = -inf, l = 0, O = 0). S and the shared memory come from
//    max_len alone (host), so a recorded step replays while lengths grow;
//  - each block copies its rows into shared memory with 16-byte cp.async
//    (through L2) before griddepcontrol.wait, all but the sequence's newest
//    row (u = n - 1), which the step's append wrote: as k_attn_decode, the
//    lengths, row pointers and page tables are the step's uploads and every
//    other row was written by earlier steps, so only q and the newest row
//    wait for the kernel before;
//  - q_lat and q_pe into shared memory as fp32 [HP][L] (HP = H rounded up to
//    MS_HT, zero rows past H); scores s = (q . row) scale log2(e): lane =
//    row, a warp takes MS_HT heads of 32 rows at a time; per-head max and
//    sum of 2^(s - m) (a warp a head); O[h, c] = sum_r p[h, r] c_r[c] by
//    (MS_HT heads x 8 columns) units of threads, each over every rsp-th row
//    (rsp row splits, summed in shared memory in split order);
//  - the cluster merge: after a cluster barrier (every block's (m, l) and O
//    written, release / acquire at cluster scope), block s computes the
//    output units (4 columns of one head) j = s, s + S, ... from all S
//    blocks' (m, l, O) through distributed shared memory, in rank order
//    (fixed: the same bits on every run), out = O / l (zeros where l = 0);
//    then a second cluster barrier, so that no block exits while another
//    may still read its shared memory. Every thread of every block reaches
//    both barriers (no early exit anywhere in the kernel).
enum { MS_THREADS = 256, MS_HT = 3, MS_MIN_ROWS = 64, MS_CLUSTER_MAX = 16 };
// The longest max_len that takes k_mla_short (at 4,096 rows a block of 16
// holds 256 of them), and the most FMAs one of its blocks may have to do,
// rows x H x (L + r_kv): its products run on the FMA pipes (~128 a cycle an
// SM), ~4 us at this cap before overheads. The SmolLM2 hybrid's layer (H 9,
// r_kv 48, dr 32) at 4,096 rows: 256 x 9 x 128 = 0.3M; HyLo-3B's (H 24,
// r_kv 128, dr 64): 64 rows x 24 x 320 = 0.5M at max_len 1,024, 1M at 2,048,
// 2M at 4,096 (past the cap: v2). An estimate, not a measurement: tune it
// with bench_decode's HYLO_MLA_SHORT=0 / 1 A/B (bench-variants build).
enum { MLA_SHORT_MAX = 4096, MS_MAX_FMA = 1 << 20 };

typedef struct {
    int H, HP, r_kv, L;              // HP: H rounded up to MS_HT
    int SR, PLD;                     // shared row strides: cache rows (bf16, SR / 8 odd), scores (fp32, odd)
    int S, rsp;                      // blocks a sequence (the cluster), row splits of the P c product
    int off_q, off_p, off_o, off_ml; // shared memory offsets (bytes) of sQ, sP, sO, sML
    int max_rows;                    // max_len
    float sl2;                       // scale * log2(e) (any sign)
    int64_t qp_ld, qp_hs;            // q_pe's row and head strides (elements, multiples of 8)
    be_pages_t pg;                   // the sequences' page tables (backend.h), or none
} ms_args_t;

// 8 bf16 (a 16-byte load) to fp32.
static __device__ __forceinline__ void ms_unpack8(const uint4 x, float f[8]) {
    f[0] = __uint_as_float(x.x << 16), f[1] = __uint_as_float(x.x & 0xffff0000u);
    f[2] = __uint_as_float(x.y << 16), f[3] = __uint_as_float(x.y & 0xffff0000u);
    f[4] = __uint_as_float(x.z << 16), f[5] = __uint_as_float(x.z & 0xffff0000u);
    f[6] = __uint_as_float(x.w << 16), f[7] = __uint_as_float(x.w & 0xffff0000u);
}

// Grid (S, B) in clusters of (S, 1, 1), MS_THREADS threads. Shared memory
// (offsets in a): sC [rows of the block][SR] bf16 at 0, sQ [HP][L] fp32, sP
// [H][PLD] fp32 (scores, then 2^(s - m)), sO [rsp][HP][r_kv] fp32 (the row
// splits' P c; split 0 then the block's O, which the other blocks read), sML
// [H] (m, l) (read by the other blocks). out [B, H, r_kv].
__global__ void __launch_bounds__(MS_THREADS)
    k_mla_short(bf16 *__restrict__ out, const bf16 *__restrict__ q_lat, const bf16 *__restrict__ q_pe,
                const bf16 *const *__restrict__ rows, const int32_t *__restrict__ len, const ms_args_t a) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *sC = (bf16 *)smem_raw;
    float *sQ = (float *)(smem_raw + a.off_q), *sP = (float *)(smem_raw + a.off_p);
    float *sO = (float *)(smem_raw + a.off_o);
    float2 *sML = (float2 *)(smem_raw + a.off_ml);
    cg::cluster_group cl = cg::this_cluster();
    const int S = a.S, s = (int)cl.block_rank(), b = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int H = a.H, L = a.L, SR = a.SR, PLD = a.PLD, r_kv = a.r_kv, cpr = L / 8;

    // this block's rows [u0, u1) of the sequence's n
    int n = len[b];
    n = n < 0 ? 0 : n > a.max_rows ? a.max_rows : n;
    const bf16 *cache = rows[b]; // row 0 of this sequence's cache (or of its pages' pool)
    const int rps = (n + S - 1) / S, u0 = s * rps, u1 = u0 + rps < n ? u0 + rps : n;
    const int nr = u1 > u0 ? u1 - u0 : 0;
    // Launched as a programmatic dependent launch (cuda_vec.cuh): the rows
    // but the newest now (the kernel before may still run), through L2
    for (int i = tid; i < nr * cpr; i += MS_THREADS) {
        const int r = i / cpr, c = (i - r * cpr) * 8;
        if (u0 + r != n - 1) cp_async16(smem_u32(sC + r * SR + c), cache + cu_page_row(a.pg, b, u0 + r) * L + c, true);
    }
    cp_async_commit();
    griddep_enter();
    if (n - 1 >= u0 && n - 1 < u1) { // the newest row, appended by an earlier kernel of the step
        const bf16 *src = cache + cu_page_row(a.pg, b, n - 1) * L;
        for (int c = tid * 8; c < L; c += MS_THREADS * 8)
            cp_async16(smem_u32(sC + (n - 1 - u0) * SR + c), src + c, true);
    }
    cp_async_commit();
    // Q [HP][L] = [q_lat | q_pe] as fp32, zero rows past H (r_kv a multiple
    // of 8: a 16-byte piece lies in one of the two)
    for (int i = tid; i < a.HP * cpr; i += MS_THREADS) {
        const int h = i / cpr, c = (i - h * cpr) * 8;
        float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (h < H)
            ms_unpack8(c < r_kv ? *(const uint4 *)(q_lat + ((int64_t)b * H + h) * r_kv + c)
                                : *(const uint4 *)(q_pe + (int64_t)b * a.qp_ld + (int64_t)h * a.qp_hs + (c - r_kv)),
                       f);
        *(float4 *)(sQ + h * L + c) = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(sQ + h * L + c + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
    cp_async_wait<0>();
    __syncthreads(); // the rows and Q are in shared memory

    // scores: item (head tile ht, 32 rows), lane = row; rows past nr skipped
    const int HT = a.HP / MS_HT, items = HT * ((nr + 31) / 32);
    for (int it = warp; it < items; it += MS_THREADS / 32) {
        const int ht = it % HT, r = (it / HT) * 32 + lane;
        if (r >= nr) continue;
        const float *q = sQ + ht * MS_HT * L;
        const bf16 *row = sC + r * SR;
        float acc[MS_HT][2];
#pragma unroll
        for (int j = 0; j < MS_HT; j++)
            acc[j][0] = acc[j][1] = 0.f;
#pragma unroll 2
        for (int k = 0; k < L; k += 8) {
            float c[8];
            ms_unpack8(*(const uint4 *)(row + k), c);
#pragma unroll
            for (int j = 0; j < MS_HT; j++) {
                const float4 q0 = *(const float4 *)(q + j * L + k), q1 = *(const float4 *)(q + j * L + k + 4);
                acc[j][0] = fmaf(q0.x, c[0], acc[j][0]), acc[j][1] = fmaf(q0.y, c[1], acc[j][1]);
                acc[j][0] = fmaf(q0.z, c[2], acc[j][0]), acc[j][1] = fmaf(q0.w, c[3], acc[j][1]);
                acc[j][0] = fmaf(q1.x, c[4], acc[j][0]), acc[j][1] = fmaf(q1.y, c[5], acc[j][1]);
                acc[j][0] = fmaf(q1.z, c[6], acc[j][0]), acc[j][1] = fmaf(q1.w, c[7], acc[j][1]);
            }
        }
#pragma unroll
        for (int j = 0; j < MS_HT; j++) {
            const int h = ht * MS_HT + j;
            if (h < H) sP[h * PLD + r] = (acc[j][0] + acc[j][1]) * a.sl2;
        }
    }
    __syncthreads();

    // softmax numerators and the block's (m, l), a warp a head; no rows: (-inf, 0)
    for (int h = warp; h < H; h += MS_THREADS / 32) {
        float *p = sP + h * PLD, mx = -INFINITY, sum = 0.f;
        for (int r = lane; r < nr; r += 32)
            mx = fmaxf(mx, p[r]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int r = lane; r < nr; r += 32) {
            const float e = exp2_approx(p[r] - mx);
            p[r] = e;
            sum += e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) sML[h] = make_float2(mx, sum);
    }
    __syncthreads();

    // O = P c: unit (head tile ht, columns c..c+7) x row split sp (rows sp, sp + rsp, ...)
    const int CQ = r_kv / 8, units = HT * CQ, rsp = a.rsp;
    for (int w = tid; w < units * rsp; w += MS_THREADS) {
        const int unit = w % units, sp = w / units, ht = unit / CQ, c = (unit - ht * CQ) * 8;
        float acc[MS_HT][8];
#pragma unroll
        for (int j = 0; j < MS_HT; j++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[j][e] = 0.f;
        for (int r = sp; r < nr; r += rsp) {
            float cv[8];
            ms_unpack8(*(const uint4 *)(sC + r * SR + c), cv);
#pragma unroll
            for (int j = 0; j < MS_HT; j++) {
                const int h = ht * MS_HT + j;
                const float p = h < H ? sP[h * PLD + r] : 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[j][e] = fmaf(p, cv[e], acc[j][e]);
            }
        }
#pragma unroll
        for (int j = 0; j < MS_HT; j++) {
            float *dst = sO + ((int64_t)sp * a.HP + ht * MS_HT + j) * r_kv + c;
            *(float4 *)dst = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
            *(float4 *)(dst + 4) = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
        }
    }
    if (rsp > 1) { // the splits summed into split 0, in split order
        __syncthreads();
        for (int i = tid; i < H * (r_kv / 4); i += MS_THREADS) {
            const int h = i / (r_kv / 4), c = (i - h * (r_kv / 4)) * 4;
            float4 acc = *(const float4 *)(sO + h * r_kv + c);
            for (int sp = 1; sp < rsp; sp++) {
                const float4 x = *(const float4 *)(sO + ((int64_t)sp * a.HP + h) * r_kv + c);
                acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
            }
            *(float4 *)(sO + h * r_kv + c) = acc;
        }
    }

    // the cluster's merge: (m, l) and O of every block (sML, sO split 0) once
    // all of them are written, block s taking the 4-column units j = s mod S
    cl.sync();
    const int CQ4 = r_kv / 4;
    for (int j = tid * S + s; j < H * CQ4; j += MS_THREADS * S) {
        const int h = j / CQ4, c = (j - h * CQ4) * 4;
        float2 ml[MS_CLUSTER_MAX];
        float M = -INFINITY;
#pragma unroll
        for (int t = 0; t < MS_CLUSTER_MAX; t++) {
            ml[t] = make_float2(-INFINITY, 0.f);
            if (t < S) ml[t] = *cl.map_shared_rank(sML + h, t);
            if (ml[t].y > 0.f) M = fmaxf(M, ml[t].x);
        }
        float l = 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int t = 0; t < MS_CLUSTER_MAX; t++)
            if (t < S && ml[t].y > 0.f) { // (M finite)
                const float wt = exp2_approx(ml[t].x - M);
                const float4 x = *(const float4 *)cl.map_shared_rank(sO + h * r_kv + c, t);
                l = fmaf(wt, ml[t].y, l);
                o.x = fmaf(wt, x.x, o.x), o.y = fmaf(wt, x.y, o.y), o.z = fmaf(wt, x.z, o.z), o.w = fmaf(wt, x.w, o.w);
            }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        bf16 *dst = out + ((int64_t)b * H + h) * r_kv + c;
        dst[0] = __float2bfloat16_rn(o.x * inv), dst[1] = __float2bfloat16_rn(o.y * inv);
        dst[2] = __float2bfloat16_rn(o.z * inv), dst[3] = __float2bfloat16_rn(o.w * inv);
    }
    cl.sync(); // no block exits while another may still read its shared memory
}

// ---- host side --------------------------------------------------------------

// What a decode kernel's launches keep between calls (one per kernel instance).
typedef struct {
    int occ_threads, occ; // blocks per SM for (occ_threads, occ_smem)
    size_t occ_smem;
    int cl_threads, clusters; // v2: clusters of MLA_CLUSTER blocks the GPU holds at once for (cl_threads, cl_smem)
    size_t cl_smem;
} mla_launch_state_t;

#ifdef HYLO_BENCH_VARIANTS
// Clusters of MLA_CLUSTER blocks of kern (threads, smem; its shared memory
// limit already raised) that the GPU holds at once (cuda_clusters_fit),
// cached in *ls.
static int mla2_clusters(const void *kern, int threads, size_t smem, mla_launch_state_t *ls) {
    if (ls->cl_threads != threads || ls->cl_smem != smem) {
        ls->clusters = cuda_clusters_fit(kern, threads, smem, MLA_CLUSTER);
        ls->cl_threads = threads, ls->cl_smem = smem;
    }
    return ls->clusters;
}
#endif

// Everything v1 and v2 set up alike before their launches: raises the kernel's
// shared memory limit (cuda_smem_limit), reads its occupancy (cached in *ls), picks the slices per sequence (one wave
// of blocks over the batch, each at least MLA_MIN_SLICE_TILES tiles of `rows_per_tile` rows of max_rows; one when
// max_rows <= short_rows, v2's one-block or cluster path, which needs no partials: < 0 for v1) and takes the partial
// results (m, l, unnormalised O per slice and head) from the scratch arena after *mark. 0 slices when a call failed
// (recorded; *mark restored).
static int64_t mla_launch_setup(be_t *be, const void *kern, const char *name, mla_launch_state_t *ls, int threads,
                                size_t smem, int B, int64_t max_rows, int64_t short_rows, int rows_per_tile, int H,
                                int r_kv, float **part_o, float **part_ml, size_t *mark) {
    cuda_impl_t *ci = cuda_impl(be);
    if (cuda_smem_limit(be, kern, smem, name) < 0) return 0;
    if (ls->occ_threads != threads || ls->occ_smem != smem) {
        int nb = 0;
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kern, threads, smem);
        if (e != cudaSuccess) {
            char what[128];
            snprintf(what, sizeof what, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(%s)", name);
            cuda_fail(be, what, e);
            return 0;
        }
        ls->occ = nb > 0 ? nb : 1;
        ls->occ_threads = threads, ls->occ_smem = smem;
    }
    int64_t ns = (int64_t)ls->occ * ci->sm_count / B;
    // at least MLA_MIN_SLICE_TILES tiles of max_rows per slice: at short contexts
    // more slices only add partials (H r_kv floats each) for the combine to read
    int64_t tiles = (max_rows + rows_per_tile - 1) / rows_per_tile / MLA_MIN_SLICE_TILES;
    if (ns > tiles) ns = tiles;
#ifdef HYLO_BENCH_VARIANTS
    // bench-only: HYLO_MLA_SLICES = N caps the slices per sequence at N (the
    // split-K sweep of kernel_checks.sh MLA_SPLIT=1; the kernel's mla_slices
    // applies the same minimum slice, so fewer slices is all a cap can ask)
    const int64_t cap = cu_env_int("HYLO_MLA_SLICES", 0);
    if (cap > 0 && ns > cap) ns = cap;
#endif
    if (ns < 1) ns = 1;
    arena_t *ar = &be->scratch;
    *mark = arena_mark(ar);
    if (max_rows <= short_rows) { // every sequence is short (mla_slices): one block or cluster each, the output itself
        *part_o = *part_ml = NULL;
        return 1;
    }
    *part_o = (float *)arena_alloc(ar, (size_t)B * ns * H * r_kv * sizeof(float));
    *part_ml = (float *)arena_alloc(ar, (size_t)B * ns * H * 2 * sizeof(float));
    if (!*part_o || !*part_ml) {
        cu_op_error(be, "cuda mla_decode_attn: scratch arena too small for %lld partial results",
                    (long long)(B * ns * H));
        arena_reset(ar, *mark);
        return 0;
    }
    return ns;
}

template <int CW>
static void launch_mla(be_t *be, void *out, const void *q_lat, const void *q_pe, void *const *rows, int64_t max_rows,
                       const int32_t *len, int B, mla_args_t a) {
    cuda_impl_t *ci = cuda_impl(be);
    auto kern = k_mla_decode<CW>;
    const int HR = a.HT * 16;
    // Fewer row groups per block when a wide latent (r_kv = 512) would not fit:
    // each halving halves the staged rows.
    int threads;
    size_t smem;
    for (;;) {
        threads = a.HT * a.CC * a.RS * 32;
        size_t stages = (size_t)MLA_NSTG * a.RS * MLA_NR * a.SR * sizeof(bf16);
        size_t merge = (size_t)(2 * a.RS * HR + HR * a.CC * CW) * sizeof(float);
        smem = (size_t)HR * a.SQ * sizeof(bf16) + (stages > merge ? stages : merge);
        if (smem <= ci->smem_optin || a.RS == 1) break;
        a.RS /= 2;
    }
    if (smem > ci->smem_optin) {
        cu_op_error(be, "cuda mla_decode_attn: r_kv=%d dr=%d H=%d needs %zu bytes of shared memory (%zu available)",
                    a.r_kv, a.dr, a.H, smem, ci->smem_optin);
        return;
    }
    static mla_launch_state_t ls;
    float *part_o, *part_ml;
    size_t mark;
    const int64_t ns = mla_launch_setup(be, (const void *)kern, "k_mla_decode", &ls, threads, smem, B, max_rows, -1,
                                        MLA_NR, a.H, a.r_kv, &part_o, &part_ml, &mark);
    if (ns == 0) return;
    a.n_split = (int)ns;
    kern<<<dim3((unsigned)ns, (unsigned)B), threads, smem, cuda_stream(be)>>>(
        part_o, part_ml, (const bf16 *)q_lat, (const bf16 *)q_pe, (const bf16 *const *)rows, max_rows, len, a);
    cuda_check_launch(be, "k_mla_decode");
    k_mla_combine<<<dim3((unsigned)a.H, (unsigned)B), 128, ns * sizeof(float), cuda_stream(be)>>>(
        (bf16 *)out, part_o, part_ml, a.H, a.r_kv, (int)ns);
    cuda_check_launch(be, "k_mla_combine");
    arena_reset(&be->scratch, mark); // stream order protects the partials from later users
}

// The pool [rows, L] bf16 (every sequence's cache) as a 2-D tensor of boxes MLA2_BOX x MLA2_NR,
// 128-byte swizzle, zeros outside; false when it cannot be described.
static bool cache_tensor_map(CUtensorMap *m, const void *cache, int64_t rows, int L) {
    cuda_encode_tiled_fn enc = cuda_tensor_encoder();
    if (!enc || rows <= 0 || rows >= ((int64_t)1 << 31)) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)L, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)L * 2};
    const cuuint32_t box[2] = {MLA2_BOX, MLA2_NR}, estr[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)cache, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Launches v2; false when the shape does not fit its layout (the caller runs v1).
template <int CW, int LOAD>
static bool launch_mla2(be_t *be, void *out, const void *q_lat, const void *q_pe, void *const *rows, const void *pool,
                        int64_t pool_rows, int64_t max_rows, const int32_t *len, int B, mla2_args_t a) {
    cuda_impl_t *ci = cuda_impl(be);
    auto kern = k_mla_decode2<CW, LOAD>;
    const int HR = a.HT * 16, wpr = a.HT * a.CC; // warps per row group
    if (wpr > MLA2_MAXW) return false;
    CUtensorMap tmap;
    memset(&tmap, 0, sizeof tmap);
    // the tensor map needs the pool that holds every sequence's rows
    if (LOAD == MLA2_LOAD_TILES && (!pool || !cache_tensor_map(&tmap, pool, pool_rows, a.L))) return false;
    const int wide = a.Lp > a.CC * CW ? a.Lp : a.CC * CW; // columns the consumers read
    a.NB = (wide + MLA2_BOX - 1) / MLA2_BOX;
    const size_t slot = LOAD == MLA2_LOAD_TILES ? (size_t)a.NB * MLA2_BOX_BYTES : (size_t)MLA2_NR * a.SR * sizeof(bf16);
    // MLA2_LOAD_TILES: up to 1 KB to align the ring
    const size_t fixed = MLA2_BAR_BYTES + (size_t)HR * a.SQ * sizeof(bf16) + (LOAD == MLA2_LOAD_TILES ? 1024 : 0);
    if (ci->smem_optin < fixed + 3 * slot) return false;
    int fit = (int)((ci->smem_optin - fixed) / slot);
    // ring slots: as many as fit, at most MLA2_MAXSTG; consumer warps: MLA2_MAXW
    // (run 11's sweep of both: docs/PERFORMANCE.md)
    int cap = MLA2_MAXSTG, want = MLA2_MAXW;
#ifdef HYLO_BENCH_VARIANTS
    // bench-only (bench_attn --sweep; the small rings of test_cuda_attn's variant build)
    cap = cu_env_int("HYLO_MLA_STAGES", MLA2_MAXSTG);
    if (cap > MLA2_MAXSTG) cap = MLA2_MAXSTG;
    if (cap < 3) cap = 3;
    want = cu_env_int("HYLO_MLA_WARPS", MLA2_MAXW);
    if (want > MLA2_MAXW) want = MLA2_MAXW;
#endif
    const int nstg = fit < cap ? fit : cap;
    // row groups: up to the warp target, and at most half the slots so that the
    // other half can be in flight while every group computes
    int rs = want / wpr;
    if (rs > nstg / 2) rs = nstg / 2;
    a.RS = rs < 1 ? 1 : rs;
    // Slots: a multiple of RS, so that a slot is always filled for the same row
    // group. A consumer's wait on its tile's "full" barrier tests the phase's
    // parity, which tells its phase from the one before only if that one is
    // complete; with a slot shared by two groups, a group could wait for fill
    // k + 1 while fill k, another group's, had not landed yet, read the slot
    // early and arrive on "empty" for the wrong fill (runs 25-27: B = 8 at 1M
    // rows, 2,048 tiles a block, hung or faulted; memcheck's slow pace hid it).
    // The merge area (per row group m, l and O) reuses the ring.
    for (;;) {
        a.NSTG = nstg / a.RS * a.RS;
        size_t merge = (size_t)(2 * a.RS * HR + a.RS * HR * (a.CC * CW + 4)) * sizeof(float);
        if (merge <= (size_t)a.NSTG * slot) break;
        if (a.RS == 1) return false;
        a.RS--;
    }
    a.NCW = wpr * a.RS;
    const int threads = (a.NCW + 1) * 32;
    const size_t smem = fixed + (size_t)a.NSTG * slot;
    a.short_rows = a.NSTG * MLA2_NR; // one fill of the ring: a short sequence's tiles all in flight at once
    static mla_launch_state_t ls;
    float *part_o, *part_ml;
    size_t mark;
    const int64_t ns = mla_launch_setup(be, (const void *)kern, "k_mla_decode2", &ls, threads, smem, B, max_rows,
                                        a.short_rows, MLA2_NR, a.H, a.r_kv, &part_o, &part_ml, &mark);
    if (ns == 0) return true;
    a.n_split = (int)ns;
    // sequences of up to merge_max slices merge in their last block: at most
    // MLA_MERGE_BYTES of partials, and weights and sums that fit the ring
    // (mla_merge: 2 ns H + H + 3 floats, then a float4 per thread)
    const int64_t part_bytes = (int64_t)a.H * a.r_kv * (int64_t)sizeof(float); // one slice's partial O
    const int64_t ring = (int64_t)a.NSTG * (int64_t)slot - 16 * (int64_t)threads - 4 * (int64_t)(a.H + 3);
    int64_t by_smem = ring > 0 ? ring / (8 * (int64_t)a.H) : 0, mm = MLA_MERGE_BYTES / part_bytes;
#ifdef HYLO_BENCH_VARIANTS
    // bench-only: HYLO_MLA_MERGE = 1 merges in the last block whatever the bytes (as far as
    // the ring holds the weights), 2 always in k_mla_combine2 (the split's two launches)
    const int merge_var = cu_env_int("HYLO_MLA_MERGE", 0);
    if (merge_var == 1) mm = ns;
    if (merge_var == 2) mm = 1;
#endif
    if (mm > by_smem) mm = by_smem;
    if (mm > ns) mm = ns;
    if (mm < 1 || B > CUDA_DEC_COUNTERS) mm = 1; // (a counter per sequence)
    a.merge_max = (int)mm;
    // Production: a short sequence in one block. The bench-variants build's
    // HYLO_MLA_CLUSTER = 8 spreads it over a cluster of MLA_CLUSTER blocks
    // (the grid's slices a multiple of it) by attention decode's rule
    // (cuda_attn.cu dec_launch): few sequences, an SM a block for all the
    // clusters, max_len at most MLA_CLUSTER_MAX_LEN, the GPU holding all B
    // clusters at once (a block fills an SM) and the ring the blocks' merged
    // partials past their merge areas (mla2_cluster_part). Run 33 measured
    // it slower than one block at every short point (docs/PERFORMANCE.md).
    int cs = 1;
#ifdef HYLO_BENCH_VARIANTS
    const int64_t part_end = mla2_cluster_part(a.RS, HR, a.CC * CW + 4, a.H, MLA_CLUSTER, threads) +
                             (int64_t)a.H * a.r_kv + 2 * (int64_t)a.H; // floats
    if (cu_env_int("HYLO_MLA_CLUSTER", 1) == MLA_CLUSTER && (int64_t)B * MLA_CLUSTER <= ci->sm_count &&
        max_rows <= MLA_CLUSTER_MAX_LEN && 4 * part_end <= (int64_t)a.NSTG * (int64_t)slot &&
        mla2_clusters((const void *)kern, threads, smem, &ls) >= B)
        cs = MLA_CLUSTER;
#endif
    a.csize = cs;
    const unsigned gx = (unsigned)((ns + cs - 1) / cs * cs); // slices past n_split: short sequences' blocks only
    if (cs > 1)
        cu_launch_pdl_cluster(kern, dim3(gx, (unsigned)B), dim3(threads), dim3((unsigned)cs, 1, 1), smem,
                              cuda_stream(be), (bf16 *)out, part_o, part_ml, ci->dec_count, (const bf16 *)q_lat,
                              (const bf16 *)q_pe, (const bf16 *const *)rows, (const bf16 *)pool, max_rows, len, a,
                              tmap);
    else
        cu_launch_pdl(kern, dim3(gx, (unsigned)B), dim3(threads), smem, cuda_stream(be), (bf16 *)out, part_o, part_ml,
                      ci->dec_count, (const bf16 *)q_lat, (const bf16 *)q_pe, (const bf16 *const *)rows,
                      (const bf16 *)pool, max_rows, len, a, tmap);
    cuda_check_launch(be, "k_mla_decode2");
    if (ns <= a.merge_max) { // every sequence's output is written by the decode
        arena_reset(&be->scratch, mark);
        return true;
    }

    // the combine, launched early (programmatic dependent launch); plain launch if refused
    const int CQ = a.r_kv / 4, G = CQ >= 256 ? 1 : 256 / CQ;
    const size_t csmem = (size_t)(ns + 3) / 4 * 4 * sizeof(float) + (CQ >= 256 ? 0 : (size_t)G * CQ * 16);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)a.H, (unsigned)B);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = csmem;
    cfg.stream = cuda_stream(be);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_mla_combine2, (bf16 *)out, (const float *)part_o, (const float *)part_ml,
                                       len, max_rows, a.H, a.r_kv, (int)ns, a.short_rows, a.merge_max);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        k_mla_combine2<<<cfg.gridDim, 256, csmem, cuda_stream(be)>>>((bf16 *)out, part_o, part_ml, len, max_rows, a.H,
                                                                     a.r_kv, (int)ns, a.short_rows, a.merge_max);
    }
    cuda_check_launch(be, "k_mla_combine2");
    arena_reset(&be->scratch, mark); // stream order protects the partials from later users
    return true;
}

template <int LOAD>
static bool launch_mla2_cw(int CW, be_t *be, void *out, const void *q_lat, const void *q_pe, void *const *rows,
                           const void *pool, int64_t pool_rows, int64_t max_rows, const int32_t *len, int B,
                           mla2_args_t a) {
    return CW == 32   ? launch_mla2<32, LOAD>(be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a)
           : CW == 64 ? launch_mla2<64, LOAD>(be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a)
                      : launch_mla2<128, LOAD>(be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a);
}

// The short path (k_mla_short): true when it took the call (launched, or a
// CUDA failure recorded), false when the shape does not fit it (the caller
// runs v2 / v1). Blocks a sequence: one per MS_MIN_ROWS rows of max_len, at
// most MS_CLUSTER_MAX (a non-portable cluster, where the device holds one of
// that many blocks) or else 8 (the portable size); rows a block holds at
// most: ceil(max_len / S). The shape fits when the shared memory does and a
// block's FMAs are at most MS_MAX_FMA.
static bool launch_mla_short(be_t *be, void *out, const void *q_lat, const void *q_pe, int64_t ldqp, int64_t hsqp,
                             void *const *rows, be_pages_t pg, const int32_t *len, int max_len, int B, int H, int r_kv,
                             int dr, float scale) {
    cuda_impl_t *ci = cuda_impl(be);
    if (max_len > MLA_SHORT_MAX) return false;
    ms_args_t a;
    memset(&a, 0, sizeof a);
    a.H = H, a.HP = (H + MS_HT - 1) / MS_HT * MS_HT, a.r_kv = r_kv, a.L = r_kv + dr;
    a.SR = (a.L / 8) % 2 ? a.L : a.L + 8; // an odd number of 16-byte pieces: a warp's row reads miss no bank
    a.max_rows = max_len;
    a.sl2 = scale * 1.4426950408889634f;
    a.qp_ld = ldqp, a.qp_hs = hsqp, a.pg = pg;
    const int units = a.HP / MS_HT * (r_kv / 8); // of the P c product
    int S = (max_len + MS_MIN_ROWS - 1) / MS_MIN_ROWS;
    S = S < 1 ? 1 : S > MS_CLUSTER_MAX ? MS_CLUSTER_MAX : S;
    size_t smem = 0;
    for (;;) {
        int chunk = (max_len + S - 1) / S; // the most rows a block takes
        if (chunk < 1) chunk = 1;
        a.S = S;
        a.PLD = chunk | 1; // odd: the P c product's reads of several heads' p miss no bank
        a.rsp = units >= MS_THREADS ? 1 : MS_THREADS / units;
        if (a.rsp > chunk) a.rsp = chunk;
        const size_t c_bytes = ((size_t)chunk * a.SR * sizeof(bf16) + 15) & ~(size_t)15;
        const size_t q_bytes = (size_t)a.HP * a.L * sizeof(float);
        const size_t p_bytes = ((size_t)H * a.PLD * sizeof(float) + 15) & ~(size_t)15;
        const size_t o_bytes = (size_t)a.rsp * a.HP * r_kv * sizeof(float);
        a.off_q = (int)c_bytes, a.off_p = (int)(c_bytes + q_bytes), a.off_o = (int)(c_bytes + q_bytes + p_bytes);
        a.off_ml = (int)(c_bytes + q_bytes + p_bytes + o_bytes);
        smem = a.off_ml + (size_t)H * sizeof(float2);
        bool ok = smem <= ci->smem_optin && (int64_t)chunk * H * (a.L + r_kv) <= MS_MAX_FMA;
        if (ok && S > 8)
            ok = cuda_clusters_fit_cached(be, (const void *)k_mla_short, "k_mla_short", MS_THREADS, smem, S) > 0;
        if (ok) break;
        if (S <= 8) return false; // the shape does not fit
        S = 8;
    }
    if (cuda_smem_limit(be, (const void *)k_mla_short, smem, "k_mla_short") < 0) return true;
    cu_launch_pdl_cluster(k_mla_short, dim3((unsigned)S, (unsigned)B), dim3(MS_THREADS), dim3((unsigned)S, 1, 1), smem,
                          cuda_stream(be), (bf16 *)out, (const bf16 *)q_lat, (const bf16 *)q_pe,
                          (const bf16 *const *)rows, len, a);
    cuda_check_launch(be, "k_mla_short");
    return true;
}

// max_len <= MLA_SHORT_MAX: k_mla_short where the shape fits it; else v2
// with tiled tensor copies (MLA2_LOAD_TILES); where there is no tensor map
// or its ring does not fit, v2 with one bulk copy per row; where v2 does not
// lay out the shape, v1.
// The bench-variants build (HYLO_BENCH_VARIANTS, Makefile) also takes, read on
// every call (bench_attn --compare switches them within one process):
//   HYLO_MLA_DECODE = 0 / unset: the above; 1: v1 only; 2: v2 with a cp.async
//   producer; 3: v2 with one bulk copy per row (the default of run 7).
//   HYLO_MLA_WARPS = consumer warps per block for v2 (default and most: 11);
//   HYLO_MLA_STAGES = most ring slots for v2 (default: as many as fit, <= 32);
//   HYLO_MLA_MERGE = 1: v2 merges every split sequence in its last block; 2:
//   always in k_mla_combine2 (default: by MLA_MERGE_BYTES);
//   HYLO_MLA_CLUSTER = 8: v2 spreads a short sequence over a cluster of
//   MLA_CLUSTER blocks where launch_mla2's rule allows (default: one block);
//   HYLO_MLA_SHORT = 0: max_len <= MLA_SHORT_MAX through v2 / v1 too, not
//   k_mla_short.
static void mla_decode(be_t *be, void *out, const void *q_lat, const void *q_pe, int64_t ldqp, int64_t hsqp,
                       void *const *rows, be_pages_t pg, const int32_t *len, int max_len, const void *pool,
                       int64_t pool_rows, int B, int H, int r_kv, int dr, float scale) {
    if (r_kv < 8 || r_kv % 8 || dr < 0 || dr % 8 || max_len < 0 || pool_rows < 0) {
        cu_op_error(be, "cuda mla_decode_attn: r_kv=%d dr=%d max_len=%d not supported (r_kv, dr multiples of 8)", r_kv,
                    dr, max_len);
        return;
    }
    // The per-row cache pointers live on the device and are not checked here:
    // each must be 16-byte aligned as well (rows of r_kv + dr, a multiple of 8
    // bf16, keep every row so), and within pool at a whole row when pool is given.
    if (((uintptr_t)q_lat | (uintptr_t)pool) & 15) {
        cu_op_error(be, "cuda mla_decode_attn: q_lat and the pool must be 16-byte aligned");
        return;
    }
    // max_len <= MLA_SHORT_MAX: k_mla_short, where its shape fits. The
    // bench-variants build's HYLO_MLA_SHORT=0, or a forced HYLO_MLA_DECODE
    // variant (1 to 3, so that the variant tests run the kernel they name),
    // sends them to v2 / v1.
#ifdef HYLO_BENCH_VARIANTS
    const bool short_path = cu_env_int("HYLO_MLA_SHORT", 1) != 0 && cu_env_int("HYLO_MLA_DECODE", 0) == 0;
#else
    const bool short_path = true;
#endif
    if (short_path && launch_mla_short(be, out, q_lat, q_pe, ldqp, hsqp, rows, pg, len, max_len, B, H, r_kv, dr, scale))
        return;
    const int64_t max_rows = max_len;
    const int HT = (H + 15) / 16, CC = (r_kv + 127) / 128;
    const int per = (r_kv + CC - 1) / CC;
    const int CW = per <= 32 ? 32 : per <= 64 ? 64 : 128;
    const int L = r_kv + dr, Lp = (L + 15) / 16 * 16;
    const int wide = Lp > CC * CW ? Lp : CC * CW;
#ifdef HYLO_BENCH_VARIANTS
    const int var = cu_env_int("HYLO_MLA_DECODE", 0);
#else
    const int var = 0; // production: no variants
#endif
    if (var != 1) {
        mla2_args_t a;
        memset(&a, 0, sizeof a);
        a.H = H, a.r_kv = r_kv, a.dr = dr, a.L = L, a.Lp = Lp, a.HT = HT, a.CC = CC;
        a.qp_ld = ldqp, a.qp_hs = hsqp, a.pg = pg;
        a.SQ = Lp + 8;                    // (SQ / 8) odd: ldmatrix rows in distinct bank groups
        a.SR = (wide + 15) / 16 * 16 + 8; // the same for the ring rows
        float sl2 = fabsf(scale) * 1.4426950408889634f;
        a.neg = scale < 0.f;
        a.sl2 = sl2 > 1e-30f ? sl2 : 1e-30f; // scale 0: uniform weights (a zero sl2 would turn -inf * 0 into NaN)
        bool done = false;
        if (var == 0)
            done =
                launch_mla2_cw<MLA2_LOAD_TILES>(CW, be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a);
        // the per-row copies also take what the tiled copies cannot (no tensor map)
        if (!done && (var == 0 || var == 3))
            done = launch_mla2_cw<MLA2_LOAD_ROWS>(CW, be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a);
#ifdef HYLO_BENCH_VARIANTS
        if (var == 2)
            done =
                launch_mla2_cw<MLA2_LOAD_CPASYNC>(CW, be, out, q_lat, q_pe, rows, pool, pool_rows, max_rows, len, B, a);
#endif
        if (done) return;
    }
    mla_args_t a;
    memset(&a, 0, sizeof a);
    a.H = H, a.r_kv = r_kv, a.dr = dr, a.L = L, a.Lp = Lp;
    a.qp_ld = ldqp, a.qp_hs = hsqp, a.pg = pg;
    a.HT = HT;
    a.CC = CC;
    if (a.HT * a.CC > 16) {
        cu_op_error(be, "cuda mla_decode_attn: H=%d with r_kv=%d needs more than 16 warps per block", H, r_kv);
        return;
    }
    int rs = 8 / (a.HT * a.CC);
    a.RS = rs < 1 ? 1 : rs > 4 ? 4 : rs;
    a.SQ = a.Lp + 8; // (SQ / 8) odd: ldmatrix rows in distinct bank groups
    a.SR = (wide + 15) / 16 * 16 + 8;
    a.sl2 = scale * 1.4426950408889634f;
    if (CW == 32)
        launch_mla<32>(be, out, q_lat, q_pe, rows, max_rows, len, B, a);
    else if (CW == 64)
        launch_mla<64>(be, out, q_lat, q_pe, rows, max_rows, len, B, a);
    else
        launch_mla<128>(be, out, q_lat, q_pe, rows, max_rows, len, B, a);
}

// q_pe is read in 16-byte pieces: an address or strides that do not allow
// them (a q_pe inside the projected q of a d_nope not a multiple of 8) get a
// contiguous copy first.
static void cu_mla_decode_attn(be_t *be, void *out, const void *q_lat, const void *q_pe, int64_t ldqp, int64_t hsqp,
                               void *const *rows, be_pages_t pg, const int32_t *len, int max_len, const void *pool,
                               int64_t pool_rows, int B, int H, int r_kv, int dr, float scale) {
    if (B <= 0 || H <= 0) return;
    const size_t mark = arena_mark(&be->scratch);
    if (((uintptr_t)q_pe & 15) || (ldqp | hsqp) % 8) {
        bf16 *qp = (bf16 *)cu_scratch_try(be, (size_t)B * H * dr * sizeof(bf16));
        if (!qp) {
            cu_op_error(be, "cuda mla_decode_attn: scratch arena too small for a copy of q_pe");
            return;
        }
        if (ldqp == (int64_t)H * hsqp)
            be->copy2d(be, qp, dr, q_pe, hsqp, (int64_t)B * H, dr, 0);
        else
            for (int b = 0; b < B; b++)
                be->copy2d(be, qp + (int64_t)b * H * dr, dr, (const bf16 *)q_pe + (int64_t)b * ldqp, hsqp, H, dr, 0);
        q_pe = qp, ldqp = (int64_t)H * dr, hsqp = dr;
    }
    mla_decode(be, out, q_lat, q_pe, ldqp, hsqp, rows, pg, len, max_len, pool, pool_rows, B, H, r_kv, dr, scale);
    arena_reset(&be->scratch, mark); // stream order protects the copy from later users
}

extern "C" void cuda_register_mla(be_t *be) { be->mla_decode_attn = cu_mla_decode_attn; }
