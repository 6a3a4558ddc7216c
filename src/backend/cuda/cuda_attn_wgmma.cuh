// Causal / unmasked attention forward on Hopper's warpgroup matrix instructions
// (wgmma) with tiles fed by the tensor copy engine (TMA): cu_attn_fwd's kernel
// (cuda_attn.cu) for (dqk, dv) = (64, 64), (128, 128) and MLA's (192, 128);
// k_attn_fwd (mma.sync) keeps the other head dims. docs/PERFORMANCE.md has its
// times against k_attn_fwd and cuDNN.
//
// One block per (128 query rows, head, sequence), 9 warps: warps 0-3 and 4-7
// are two consumer warpgroups of 64 query rows each, warp 8 the producer.
//  - The producer's lane 0 loads the Q tile once, then K and V tiles of 128
//    keys into a ring of WG_NS stages, each with its own "full" barrier (the
//    copy's bytes) and "empty" barrier (one arrival per consumer warpgroup).
//  - Tiles are [rows][64 columns] panels of 128 bytes a row in the 128-byte
//    swizzle (the copy engine's layout, which the wgmma descriptors name), a
//    head dim of 128 being two panels, 192 three. q, k, v are seen as 3-D tensors
//    [B][T][heads x d] so that rows past T come in as zeros.
//  - S = Q K^T: wgmma m64n128k16 with both operands K-major in shared memory.
//  - Online softmax on the accumulator fragments (each warp's 16 rows, the
//    mma.sync m16n8 layout repeated along n), then O += P V: wgmma with P from
//    registers (bf16, the m16n8k16 A fragment) and V MN-major (transposed B).
// Output and lse as k_attn_fwd: O / l in bf16, lse = (m + log2 l) ln 2.
// The bench-variants build adds k_attn_fwd_wgmma_l2, the same tile work in
// other block orders (below).

#include "backend/cuda/cuda_wgmma.cuh"

enum { WG_BR = 128, WG_BC = 128, WG_NS = 2, WG_THREADS = 288 };

template <int DQK, int DV> struct wg_cfg {
    static constexpr int QK_PANELS = DQK / 64, V_PANELS = DV / 64;
    static constexpr int Q_BYTES = WG_BR * DQK * 2; // QK_PANELS panels of [WG_BR rows][128 B]
    static constexpr int K_BYTES = WG_BC * DQK * 2; // one K stage
    static constexpr int V_BYTES = WG_BC * DV * 2;  // one V stage
    // 1 KB to align the tiles (the swizzle pattern repeats every 1024 bytes), the barriers last
    static constexpr int SMEM = 1024 + Q_BYTES + WG_NS * (K_BYTES + V_BYTES) + 8 * (1 + 3 * WG_NS);
};

// The shared-memory addresses of the forward's tiles and barriers.
typedef struct {
    uint32_t sQ, sK, sV, bar_q, bar_k, bar_v, bar_e;
} wg_smem_t;

template <int DQK, int DV> static __device__ __forceinline__ wg_smem_t wg_fwd_smem(void) {
    typedef wg_cfg<DQK, DV> C;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const uint32_t base = (smem_u32(wg_smem) + 1023u) & ~1023u;
    const uint32_t sQ = base, sK = sQ + C::Q_BYTES, sV = sK + WG_NS * C::K_BYTES, bars = sV + WG_NS * C::V_BYTES;
    const uint32_t bar_q = bars, bar_k = bars + 8, bar_v = bar_k + 8 * WG_NS, bar_e = bar_v + 8 * WG_NS;
    return wg_smem_t{sQ, sK, sV, bar_q, bar_k, bar_v, bar_e};
}

// Key tiles that the query tile at q0 reads (off = Tk - Tq).
static __device__ __forceinline__ int wg_fwd_n_kv(int off, int q0, int Tq, int Tk, int causal) {
    const int q_last = min(q0 + WG_BR, Tq) - 1;
    const int kv_end = causal ? off + q_last + 1 : Tk; // keys some valid row of the block sees
    return (kv_end + WG_BC - 1) / WG_BC;
}

static __device__ __forceinline__ void wg_fwd_init(wg_smem_t sm) {
    if (threadIdx.x == 0) {
        mbar_init(sm.bar_q, 1);
        for (int s = 0; s < WG_NS; s++) {
            mbar_init(sm.bar_k + 8 * s, 1);
            mbar_init(sm.bar_v + 8 * s, 1);
            mbar_init(sm.bar_e + 8 * s, 2); // one arrival per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// The producer's loads for one query tile: Q once, then its n_kv K and V
// tiles through the ring, from ring slot g0 on where CARRY (a block that runs
// several tiles keeps counting), else from 0 (g0 unread: the one-tile kernel's
// code as it was). Slot g is stage g % WG_NS, its (g / WG_NS)-th use.
template <int DQK, int DV, bool CARRY>
static __device__ __forceinline__ void wg_fwd_load(wg_smem_t sm, const CUtensorMap *tq, const CUtensorMap *tk,
                                                   const CUtensorMap *tv, int b, int h, int hk, int q0, int n_kv,
                                                   int g0) {
    typedef wg_cfg<DQK, DV> C;
    mbar_arrive_expect_tx(sm.bar_q, C::Q_BYTES);
    for (int p = 0; p < C::QK_PANELS; p++)
        tensor_g2s_3d(sm.sQ + p * WG_BR * 128, tq, h * DQK + 64 * p, q0, b, sm.bar_q);
    for (int j = 0; j < n_kv; j++) {
        const int gj = CARRY ? g0 + j : j, s = gj % WG_NS, u = gj / WG_NS;
        if (u > 0) mbar_wait(sm.bar_e + 8 * s, (u - 1) & 1); // both warpgroups are done with this stage
        const uint32_t k_s = sm.sK + s * C::K_BYTES, v_s = sm.sV + s * C::V_BYTES;
        mbar_arrive_expect_tx(sm.bar_k + 8 * s, C::K_BYTES);
        for (int p = 0; p < C::QK_PANELS; p++)
            tensor_g2s_3d(k_s + p * WG_BC * 128, tk, hk * DQK + 64 * p, j * WG_BC, b, sm.bar_k + 8 * s);
        mbar_arrive_expect_tx(sm.bar_v + 8 * s, C::V_BYTES);
        for (int p = 0; p < C::V_PANELS; p++)
            tensor_g2s_3d(v_s + p * WG_BC * 128, tv, hk * DV + 64 * p, j * WG_BC, b, sm.bar_v + 8 * s);
    }
}

// The consumers' part of one query tile (rows q0.. of head h of sequence b):
// its n_kv key tiles from ring slot g0 on (CARRY; else 0, as wg_fwd_load), Q
// behind bar_q's phase of parity qph, then the output and lse.
template <int DQK, int DV, bool CARRY>
static __device__ __forceinline__ void wg_fwd_compute(wg_smem_t sm, bf16 *__restrict__ out, float *__restrict__ lse,
                                                      int warp, int lane, int b, int h, int q0, int n_kv, int g0,
                                                      int qph, int Tq, int Tk, int H, float sl2, int causal) {
    typedef wg_cfg<DQK, DV> C;
    const int off = Tk - Tq;
    // warpgroup w takes rows [64 w, 64 w + 64) of the tile; this thread holds
    // rows r0 and r0 + 8 (tile coordinates), columns 8 n + 2 t4 (+1)
    const int w = warp >> 2, wi = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int r0 = 64 * w + 16 * wi + g;
    float o[DV / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++)
        o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    float s[64];
    mbar_wait(sm.bar_q, qph);
    const uint32_t q_w = sm.sQ + w * 64 * 128; // this warpgroup's rows in each Q panel
    for (int j = 0; j < n_kv; j++) {
        const int gj = CARRY ? g0 + j : j, st = gj % WG_NS, ph = (gj / WG_NS) & 1, n0 = j * WG_BC;
        const uint32_t k_s = sm.sK + st * C::K_BYTES, v_s = sm.sV + st * C::V_BYTES;
        mbar_wait(sm.bar_k + 8 * st, ph);
        // S = Q K^T over DQK / 16 steps of 16 columns (4 per 64-column panel)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            const uint32_t pan = kk >> 2, sub = (kk & 3) * 32;
            wgmma_ss_n128<0, 0>(s, wgmma_desc(q_w + pan * WG_BR * 128 + sub, 16, 1024),
                                wgmma_desc(k_s + pan * WG_BC * 128 + sub, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(s);

        // mask: keys past the causal limit of the row (or past Tk)
        const int row_a = q0 + r0; // absolute query index of this thread's first row
        if (causal ? n0 + WG_BC - 1 > off + q0 + 64 * w + 16 * wi : n0 + WG_BC > Tk) {
#pragma unroll
            for (int jn = 0; jn < 16; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = n0 + jn * 8 + 2 * t4 + (e & 1), row = row_a + 8 * (e >> 1);
                    if (col > (causal ? off + row : Tk - 1)) s[jn * 4 + e] = -INFINITY;
                }
        }
        // online softmax, log2 domain (sl2 = scale log2 e > 0)
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int jn = 0; jn < 16; jn++)
                mx = fmaxf(mx, fmaxf(s[jn * 4 + 2 * i], s[jn * 4 + 2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m_r[i], mx * sl2);
            const float mu = mnew == -INFINITY ? 0.f : mnew;
            alpha[i] = exp2_approx(m_r[i] - mu);
            m_r[i] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int jn = 0; jn < 16; jn++) {
                const float p0 = exp2_approx(fmaf(s[jn * 4 + 2 * i], sl2, -mu));
                const float p1 = exp2_approx(fmaf(s[jn * 4 + 2 * i + 1], sl2, -mu));
                s[jn * 4 + 2 * i] = p0, s[jn * 4 + 2 * i + 1] = p1;
                sum += p0 + p1;
            }
            l_r[i] = l_r[i] * alpha[i] + sum;
        }
#pragma unroll
        for (int jn = 0; jn < DV / 8; jn++) {
            o[jn * 4 + 0] *= alpha[0], o[jn * 4 + 1] *= alpha[0];
            o[jn * 4 + 2] *= alpha[1], o[jn * 4 + 3] *= alpha[1];
        }
        // P as the A fragments of 8 steps of 16 keys
        uint32_t pa[8][4];
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
        // O += P V: V [128 keys][DV] MN-major, 16 keys (two 8-row groups) a step
        mbar_wait(sm.bar_v + 8 * st, ph);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
            wgmma_rs_tb<DV>(o, pa[kk], wgmma_desc(v_s + kk * 2048, WG_BC * 128, 1024));
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(o);
        // the A registers are read until the wait: kept live (unchanged) up to here
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                asm volatile("" : "+r"(pa[kk][i])::"memory");
        // this warpgroup is done with the stage
        named_sync(1 + w, 128);
        if (wi == 0 && lane == 0) mbar_arrive(sm.bar_e + 8 * st);
    }

    // epilogue: O / l -> bf16; lse = (m + log2 l) ln 2
    const int64_t os = (int64_t)H * DV;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float l = l_r[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = q0 + r0 + 8 * i;
        if (row >= Tq) continue;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        bf16 *orow = out + ((int64_t)b * Tq + row) * os + (int64_t)h * DV;
#pragma unroll
        for (int jn = 0; jn < DV / 8; jn++)
            *(uint32_t *)(orow + jn * 8 + 2 * t4) = pack_bf16(o[jn * 4 + 2 * i] * inv, o[jn * 4 + 2 * i + 1] * inv);
        if (lse && t4 == 0) lse[((int64_t)b * H + h) * Tq + row] = (m_r[i] + __log2f(l)) * 0.69314718055994531f;
    }
}

template <int DQK, int DV>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_attn_fwd_wgmma(bf16 *__restrict__ out, float *__restrict__ lse, const __grid_constant__ CUtensorMap tq,
                     const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, int B, int Tq,
                     int Tk, int H, int Hkv, float sl2, int n_qt, int causal) {
    const wg_smem_t sm = wg_fwd_smem<DQK, DV>();
    const int BH = B * H;
    const int bh = blockIdx.x % BH, qt = n_qt - 1 - blockIdx.x / BH; // longest causal rows first
    const int b = bh / H, h = bh - b * H, hk = h / (H / Hkv);
    const int q0 = qt * WG_BR, off = Tk - Tq, n_kv = wg_fwd_n_kv(off, q0, Tq, Tk, causal);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    wg_fwd_init(sm);
    if (warp == 8) { // producer
        if (lane == 0) wg_fwd_load<DQK, DV, false>(sm, &tq, &tk, &tv, b, h, hk, q0, n_kv, 0);
        return;
    }
    wg_fwd_compute<DQK, DV, false>(sm, out, lse, warp, lane, b, h, q0, n_kv, 0, 0, Tq, Tk, H, sl2, causal);
}

#ifdef HYLO_BENCH_VARIANTS
// Bench-only block orders (cu_attn_fwd's HYLO_ATTN_FWD = 3 and 4). The
// default order above runs the (b, h) pairs fastest: the blocks resident at
// once are every head at a few q-tiles, so a K/V tile is shared by few of them
// and at long T each head's K and V may stream from memory again and again
// (the hypothesis these variants test). Here the (b, kv head) units go in
// sections of `sect` units (the last may be shorter), sized on the host so
// that a section's K and V fit in L2; within a section q-tiles go longest
// first and the section's query heads fastest. With sect = B Hkv this is the
// default order.
static __device__ __forceinline__ void wg_l2_tile(int t, int n_qt, int B, int H, int Hkv, int sect, int *b, int *h,
                                                  int *qt) {
    const int R = H / Hkv, U = B * Hkv;
    const int full = sect * R * n_qt; // tiles of a full section (<= n_qt B H)
    const int sec = t / full, i = t - sec * full;
    const int w = min(sect, U - sec * sect) * R; // tiles of this section per q-tile
    const int qi = i / w, u = i - qi * w, unit = sec * sect + u / R;
    *qt = n_qt - 1 - qi;
    *b = unit / Hkv;
    *h = (unit - *b * Hkv) * R + u % R;
}

// L2 prefetch of the box at (x, y, z) of tmap: the next tile's Q, so that its
// load at the tile boundary comes from L2.
static __device__ __forceinline__ void tensor_prefetch_3d(const CUtensorMap *tmap, int x, int y, int z) {
    asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"((uint64_t)tmap), "r"(x),
                 "r"(y), "r"(z)
                 : "memory");
}

// The forward in the sectioned order, tile t of wg_l2_tile first taken by
// block t. Without `next` (HYLO_ATTN_FWD = 3) the grid has a block per tile
// and each runs one. With it (= 4) a smaller grid (one wave) stays resident:
// once a block's producer has queued a tile's loads it claims tile
// G + atomicAdd(next, 1) (as the hardware hands the next block to the first
// SM free, so longest first is kept; a fixed schedule of these uneven tiles
// leaves some blocks far busier) and prefetches its Q; the ring and the
// barriers' phases carry on from tile to tile, so the next tile's loads start
// as soon as both warpgroups are done with this one's last key tile, under
// its output, not after a block exit and launch. The producer hands the tile
// to the consumers in tile_s, behind bar_q (n_tiles: none left).
template <int DQK, int DV>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_attn_fwd_wgmma_l2(bf16 *__restrict__ out, float *__restrict__ lse, const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, int B, int Tq,
                        int Tk, int H, int Hkv, float sl2, int n_qt, int causal, int sect, int *next) {
    __shared__ int tile_s;
    const wg_smem_t sm = wg_fwd_smem<DQK, DV>();
    const int n_tiles = n_qt * B * H, R = H / Hkv; // n_tiles: at most the default grid
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    wg_fwd_init(sm);
    if (warp == 8) { // producer
        if (lane != 0) return;
        int g = 0, t = blockIdx.x; // ring slots taken by the earlier tiles; this tile
        for (int it = 0;; it++) {
            // Q's stage and tile_s are free once both warpgroups are done
            // with the previous tile's last key tile
            if (it > 0) mbar_wait(sm.bar_e + 8 * ((g - 1) % WG_NS), ((g - 1) / WG_NS) & 1);
            tile_s = t;
            if (t >= n_tiles) {
                mbar_arrive(sm.bar_q); // no tile: the phase completes without bytes
                return;
            }
            int b, h, qt;
            wg_l2_tile(t, n_qt, B, H, Hkv, sect, &b, &h, &qt);
            const int q0 = qt * WG_BR, n_kv = wg_fwd_n_kv(Tk - Tq, q0, Tq, Tk, causal);
            wg_fwd_load<DQK, DV, true>(sm, &tq, &tk, &tv, b, h, h / R, q0, n_kv, g);
            if (!next) return;
            g += n_kv;
            t = (int)gridDim.x + atomicAdd(next, 1);
            if (t < n_tiles) {
                wg_l2_tile(t, n_qt, B, H, Hkv, sect, &b, &h, &qt);
                for (int p = 0; p < DQK / 64; p++)
                    tensor_prefetch_3d(&tq, h * DQK + 64 * p, qt * WG_BR, b);
            }
        }
    }
    int g = 0;
    for (int it = 0;; it++) {
        mbar_wait(sm.bar_q, it & 1);
        const int t = tile_s;
        if (t >= n_tiles) return;
        int b, h, qt;
        wg_l2_tile(t, n_qt, B, H, Hkv, sect, &b, &h, &qt);
        const int q0 = qt * WG_BR, n_kv = wg_fwd_n_kv(Tk - Tq, q0, Tq, Tk, causal);
        wg_fwd_compute<DQK, DV, true>(sm, out, lse, warp, lane, b, h, q0, n_kv, g, it & 1, Tq, Tk, H, sl2, causal);
        if (!next) return;
        g += n_kv;
    }
}
#endif

// [B][T][cols] bf16 (cols = heads x d) as a 3-D tensor of boxes of 64 columns x
// box_rows rows, 128-byte swizzle, zeros outside.
static bool wg_tensor_map(cuda_encode_tiled_fn enc, CUtensorMap *m, const void *p, int cols, int T, int B,
                          int box_rows) {
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * 2, (cuuint64_t)T * cols * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)p, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The forward's tensor maps of q, k and v; false where the maps cannot
// describe the shape (or no encoder).
template <int DQK, int DV>
static bool wg_fwd_maps(CUtensorMap *mq, CUtensorMap *mk, CUtensorMap *mv, const void *q, const void *k, const void *v,
                        int B, int Tq, int Tk, int H, int Hkv) {
    cuda_encode_tiled_fn enc = cuda_tensor_encoder();
    if (!enc || Tq <= 0 || Tk <= 0) return false;
    return wg_tensor_map(enc, mq, q, H * DQK, Tq, B, WG_BR) && wg_tensor_map(enc, mk, k, Hkv * DQK, Tk, B, WG_BC) &&
           wg_tensor_map(enc, mv, v, Hkv * DV, Tk, B, WG_BC);
}

// Launches the wgmma forward; false (nothing launched) where it does not apply
// (no tensor-map encoder, a shape the maps cannot describe): the caller then
// runs k_attn_fwd.
template <int DQK, int DV>
static bool launch_fwd_wgmma(be_t *be, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                             int Tq, int Tk, int H, int Hkv, float scale, int causal) {
    CUtensorMap mq, mk, mv;
    if (!wg_fwd_maps<DQK, DV>(&mq, &mk, &mv, q, k, v, B, Tq, Tk, H, Hkv)) return false;
    auto kern = k_attn_fwd_wgmma<DQK, DV>;
    if (cuda_smem_limit(be, (const void *)kern, wg_cfg<DQK, DV>::SMEM, "k_attn_fwd_wgmma") < 0)
        return true; // error recorded
    const int n_qt = (Tq + WG_BR - 1) / WG_BR;
    const int64_t blocks = (int64_t)n_qt * B * H;
    kern<<<(unsigned)blocks, WG_THREADS, wg_cfg<DQK, DV>::SMEM, cuda_stream(be)>>>(
        (bf16 *)out, lse, mq, mk, mv, B, Tq, Tk, H, Hkv, scale * 1.4426950408889634f, n_qt, causal ? 1 : 0);
    cuda_check_launch(be, "k_attn_fwd_wgmma");
    return true;
}

#ifdef HYLO_BENCH_VARIANTS
// Launches k_attn_fwd_wgmma_l2, one block per tile (persist 0) or one wave at
// the kernel's occupancy claiming tiles from a counter in the scratch arena
// (persist 1); false where launch_fwd_wgmma would be, or the arena has no room
// for the counter. Knobs: HYLO_ATTN_FWD_L2MB, the L2 budget of a section's K
// and V in MiB (default 32 of the 50 MB L2: the rest for Q, O and the
// sections' overlap), HYLO_ATTN_FWD_UNITS, units per section (> 0: in place
// of the budget), HYLO_ATTN_FWD_BLOCKS, the persistent grid (> 0: in place of
// one wave).
template <int DQK, int DV>
static bool launch_fwd_wgmma_l2(be_t *be, int persist, void *out, float *lse, const void *q, const void *k,
                                const void *v, int B, int Tq, int Tk, int H, int Hkv, float scale, int causal) {
    CUtensorMap mq, mk, mv;
    if (!wg_fwd_maps<DQK, DV>(&mq, &mk, &mv, q, k, v, B, Tq, Tk, H, Hkv)) return false;
    auto kern = k_attn_fwd_wgmma_l2<DQK, DV>;
    const int smem = wg_cfg<DQK, DV>::SMEM;
    if (cuda_smem_limit(be, (const void *)kern, smem, "k_attn_fwd_wgmma_l2") < 0) return true; // error recorded
    const int n_qt = (Tq + WG_BR - 1) / WG_BR, U = B * Hkv;
    int64_t sect = cu_env_int("HYLO_ATTN_FWD_UNITS", 0);
    if (sect <= 0) {
        const int64_t unit = (int64_t)Tk * (DQK + DV) * 2; // one unit's K and V bytes
        sect = ((int64_t)cu_env_int("HYLO_ATTN_FWD_L2MB", 32) << 20) / unit;
    }
    sect = sect < 1 ? 1 : sect > U ? U : sect;
    int64_t grid = (int64_t)n_qt * B * H;
    int *next = NULL;
    arena_t *ar = &be->scratch;
    const size_t mark = arena_mark(ar);
    if (persist) {
        static int occ; // per instance: one launch configuration
        if (!occ) {
            cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, WG_THREADS, smem);
            if (e != cudaSuccess) {
                occ = 0;
                cuda_fail(be, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(k_attn_fwd_wgmma_l2)", e);
                return true;
            }
            if (occ < 1) occ = 1;
        }
        int64_t cap = cu_env_int("HYLO_ATTN_FWD_BLOCKS", 0);
        if (cap <= 0) cap = (int64_t)occ * cuda_impl(be)->sm_count;
        if (grid > cap) grid = cap;
        next = (int *)cu_scratch_try(be, sizeof(int));
        if (!next) return false;
        cudaError_t e = cudaMemsetAsync(next, 0, sizeof(int), cuda_stream(be));
        if (e != cudaSuccess) {
            arena_reset(ar, mark);
            cuda_fail(be, "cudaMemsetAsync(attn tile counter)", e);
            return true;
        }
    }
    kern<<<(unsigned)grid, WG_THREADS, smem, cuda_stream(be)>>>((bf16 *)out, lse, mq, mk, mv, B, Tq, Tk, H, Hkv,
                                                                scale * 1.4426950408889634f, n_qt, causal ? 1 : 0,
                                                                (int)sect, next);
    cuda_check_launch(be, "k_attn_fwd_wgmma_l2");
    arena_reset(ar, mark); // stream order protects the counter from later users of the scratch
    return true;
}
#endif
