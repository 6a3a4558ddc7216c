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

template <int DQK, int DV>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_attn_fwd_wgmma(bf16 *__restrict__ out, float *__restrict__ lse, const __grid_constant__ CUtensorMap tq,
                     const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, int B, int Tq,
                     int Tk, int H, int Hkv, float sl2, int n_qt, int causal) {
    typedef wg_cfg<DQK, DV> C;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const uint32_t base = (smem_u32(wg_smem) + 1023u) & ~1023u;
    const uint32_t sQ = base, sK = sQ + C::Q_BYTES, sV = sK + WG_NS * C::K_BYTES, bars = sV + WG_NS * C::V_BYTES;
    const uint32_t bar_q = bars, bar_k = bars + 8, bar_v = bar_k + 8 * WG_NS, bar_e = bar_v + 8 * WG_NS;

    const int BH = B * H;
    const int bh = blockIdx.x % BH, qt = n_qt - 1 - blockIdx.x / BH; // longest causal rows first
    const int b = bh / H, h = bh - b * H, hk = h / (H / Hkv);
    const int q0 = qt * WG_BR, off = Tk - Tq;
    const int q_last = min(q0 + WG_BR, Tq) - 1;
    const int kv_end = causal ? off + q_last + 1 : Tk; // keys some valid row of the block sees
    const int n_kv = (kv_end + WG_BC - 1) / WG_BC;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    if (tid == 0) {
        mbar_init(bar_q, 1);
        for (int s = 0; s < WG_NS; s++) {
            mbar_init(bar_k + 8 * s, 1);
            mbar_init(bar_v + 8 * s, 1);
            mbar_init(bar_e + 8 * s, 2); // one arrival per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 8) { // producer
        if (lane == 0) {
            mbar_arrive_expect_tx(bar_q, C::Q_BYTES);
            for (int p = 0; p < C::QK_PANELS; p++)
                tensor_g2s_3d(sQ + p * WG_BR * 128, &tq, h * DQK + 64 * p, q0, b, bar_q);
            for (int j = 0; j < n_kv; j++) {
                const int s = j % WG_NS, u = j / WG_NS;
                if (u > 0) mbar_wait(bar_e + 8 * s, (u - 1) & 1); // both warpgroups are done with this stage
                const uint32_t k_s = sK + s * C::K_BYTES, v_s = sV + s * C::V_BYTES;
                mbar_arrive_expect_tx(bar_k + 8 * s, C::K_BYTES);
                for (int p = 0; p < C::QK_PANELS; p++)
                    tensor_g2s_3d(k_s + p * WG_BC * 128, &tk, hk * DQK + 64 * p, j * WG_BC, b, bar_k + 8 * s);
                mbar_arrive_expect_tx(bar_v + 8 * s, C::V_BYTES);
                for (int p = 0; p < C::V_PANELS; p++)
                    tensor_g2s_3d(v_s + p * WG_BC * 128, &tv, hk * DV + 64 * p, j * WG_BC, b, bar_v + 8 * s);
            }
        }
        return;
    }

    // consumers: warpgroup w takes rows [64 w, 64 w + 64) of the tile; this
    // thread holds rows r0 and r0 + 8 (tile coordinates), columns 8 n + 2 t4 (+1)
    const int w = warp >> 2, wi = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int r0 = 64 * w + 16 * wi + g;
    float o[DV / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++)
        o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    float s[64];
    mbar_wait(bar_q, 0);
    const uint32_t q_w = sQ + w * 64 * 128; // this warpgroup's rows in each Q panel
    for (int j = 0; j < n_kv; j++) {
        const int st = j % WG_NS, ph = (j / WG_NS) & 1, n0 = j * WG_BC;
        const uint32_t k_s = sK + st * C::K_BYTES, v_s = sV + st * C::V_BYTES;
        mbar_wait(bar_k + 8 * st, ph);
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
        mbar_wait(bar_v + 8 * st, ph);
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
        if (wi == 0 && lane == 0) mbar_arrive(bar_e + 8 * st);
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

// Launches the wgmma forward; false (nothing launched) where it does not apply
// (no tensor-map encoder, a shape the maps cannot describe): the caller then
// runs k_attn_fwd.
template <int DQK, int DV>
static bool launch_fwd_wgmma(be_t *be, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                             int Tq, int Tk, int H, int Hkv, float scale, int causal) {
    cuda_encode_tiled_fn enc = cuda_tensor_encoder();
    if (!enc || Tq <= 0 || Tk <= 0) return false;
    CUtensorMap mq, mk, mv;
    if (!wg_tensor_map(enc, &mq, q, H * DQK, Tq, B, WG_BR) || !wg_tensor_map(enc, &mk, k, Hkv * DQK, Tk, B, WG_BC) ||
        !wg_tensor_map(enc, &mv, v, Hkv * DV, Tk, B, WG_BC))
        return false;
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
