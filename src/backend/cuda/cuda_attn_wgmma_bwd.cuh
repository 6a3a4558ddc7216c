// Causal attention backward on Hopper's warpgroup matrix instructions (wgmma)
// with tiles fed by the tensor copy engine (TMA): the production backward
// (cuda_attn.cu bwd_wgmma) for (dqk, dv) = (64, 64), (128, 128) and MLA's
// (192, 128); the mma.sync kernels keep the other head dims and deterministic
// mode (the bench-variants build's HYLO_ATTN_BWD=4 runs them everywhere).
//
// Same contract as k_attn_bwd2: D = rowsum(dO O) and lse2 = lse log2(e) from
// k_attn_bwd_pre ([B H][Tqp], zeros past Tq); dK = scale dS^T Q and dV = P^T dO
// written in bf16; dQ = dS K added into the fp32 accumulator [units x grp][Tq][dqk]
// that k_attn_dq_out scales and converts (as run_bwd, in passes of as many
// (b, kv head) units as the scratch arena holds). GQA as k_attn_bwd: a block
// walks every query head of its kv head, so dK / dV sum over the group in registers.
//
// One block per (key tile of 128 rows, b, kv head), 384 threads = 3 warpgroups:
//  - warpgroup 0, the producer (setmaxnreg down to 24): one thread loads the K
//    and V tiles once, then, for each step (query head of the group, query
//    tile of BM rows at or after the key tile when causal), the Q and dO tiles
//    and the step's lse2 and D into a ring of WB_NS stages: "full" barrier per
//    stage (the copies' bytes), "empty" barrier (one arrival per consumer warpgroup).
//  - warpgroups 1 and 2 (setmaxnreg up to 240; w = 0, 1) own keys [64 w, 64 w
//    + 64) of the tile. Per step:
//      S^T = K_w Q^T, dP^T = V_w dO^T   m64 x nBM, both operands K-major in smem.
//        Keys on M ("swapped" products) put P^T and dS^T in accumulators whose
//        rows are keys: packed to bf16 they are directly the register A
//        operand of the next two products, no transpose through shared memory.
//      P^T = exp2(S^T sl2 - lse2), dS^T = P^T (dP^T - D), fp32.
//      dV += P^T dO, dK += dS^T Q        A from registers, dO / Q MN-major (transpose bit).
//      dS^T -> shared (bf16, 128-byte swizzle, two buffers), barrier of both
//      warpgroups, dQ tile = dS K: A = dS MN-major (the dS^T rows), B = K
//      MN-major; added to the fp32 accumulator with red.global.add.v4.f32.
//  - Tiles are [rows][64 columns] panels of 128-byte rows in the 128-byte
//    swizzle, as the copy engine writes them (cuda_attn_wgmma.cuh); a head dim
//    of 128 is two panels, 192 three.
//
// Tiles and registers (per consumer thread: dK, dV accumulators (dqk + dv) / 2
// floats; S^T and dP^T QS / 2 each, QS the queries of a sub-block of the step):
//  - dqk 64: BM = QS = 128 (S^T m64n128): 32 + 32 + 64 + 64 = 192. The dQ tile
//    is split by rows (warpgroup w: queries [64 w, 64 w + 64), all 64 columns).
//  - dqk 128: BM = QS = 64: 64 + 64 + 32 + 32 = 192; dQ split by columns, 64 + 64.
//  - 192/128: BM = 64 but QS = 32, two sub-blocks per step (S^T m64n32): 96 +
//    64 + 16 + 16 = 192, where whole-step S^T and dP^T (224 in all) made ptxas
//    serialize the wgmma and spill. dQ split by columns 128 + 64, warpgroup 0
//    in two passes of 64 (32 registers each beside the 160 of dK, dV).
//  The consumers take 240 registers (setmaxnreg; 2 x 128 x 240 + 128 x 24 =
//  64,512 of the SM's 65,536), the kernel being capped at 168 at entry. ptxas
//  (nvcc 13.0): no spill, no serialized wgmma at any of the three pairs; the
//  consumer code reaches R229 (128/128) to R234 (192/128).
//  dQ columns split on 64-column panel boundaries, so that no MN-major operand
//  descriptor starts inside a panel's row (K-major ones do, by 32-byte k-steps,
//  as in the forward).
// Shared memory: K, V (128 rows), 2 stages of Q, dO (BM rows), 2 dS^T buffers
// (128 keys x BM), 2 stages of lse2 / D, 1 KB for alignment: 166,952 bytes at
// 64/64, 165,928 at 128/128, 198,696 at 192/128 (one block per SM).
//
// dQ by bulk reductions (k_attn_bwd_wgmma_dqb, the production kernel at head
// dims of 128 and more: bwd_wgmma in cuda_attn.cu): the same kernel, but each
// warpgroup writes its dQ share into 16 KB of shared memory and one of its
// threads adds it into the accumulator with two bulk tensor reductions
// (wb_dq_bulk), in place of 1024 red.global.add.v4 issued by the warpgroup per
// 64 x 64 share. Shared memory 32 KB more: 199,720 / 198,696 / 231,464 bytes
// (192/128 reuses warpgroup 0's slot for its second pass of 64 columns).
#pragma once

// WB_DQ_BOX: the dQ slots' box, 64 rows x 32 fp32 (wb_dq_bulk)
enum { WB_BN = 128, WB_NS = 2, WB_THREADS = 384, WB_DQ_BOX = 64 * 32 * 4 };

template <int DQK, int DV, bool DQB = false> struct wb_cfg {
    static_assert((DQK == 64 && DV == 64) || (DQK == 128 && DV == 128) || (DQK == 192 && DV == 128), "head dims");
    static constexpr int BM = DQK <= 64 ? 128 : 64; // query rows per step
    static constexpr int QK_PANELS = DQK / 64, V_PANELS = DV / 64;
    static constexpr int K_BYTES = WB_BN * DQK * 2, V_BYTES = WB_BN * DV * 2;
    static constexpr int Q_BYTES = BM * DQK * 2, O_BYTES = BM * DV * 2; // one stage each
    static constexpr int DS_BYTES = WB_BN * BM * 2; // one dS^T buffer: BM / 64 panels of [128 keys][64 queries]
    static constexpr int LD_BYTES = 2 * BM * 4;     // one stage's lse2 (BM floats), then D
    // dQ: warpgroup w's columns [w ? NQ0 : 0, + NQ_w) (BM = 64) or rows [64 w, + 64) (BM = 128)
    static constexpr int NQ0 = BM == 128 ? DQK : (DQK == 192 ? 128 : DQK / 2);
    static constexpr int NQ1 = BM == 128 ? DQK : DQK - NQ0;
    // warpgroup 0 at BM = 64 adds its NQ0 columns in passes of NQP: at 192/128
    // two of 64, as the dK, dV accumulators (160 registers) leave no room for 64 more
    static constexpr int NQP = DQK == 192 ? 64 : NQ0;
    // S^T, dP^T in sub-blocks of QS queries: at 192/128 two of 32 (16 + 16
    // registers), as 160 of dK, dV + 32 + 32 of whole-step S^T, dP^T exceed 240
    static constexpr int QS = DQK == 192 ? 32 : BM;
    static constexpr int OFF_V = K_BYTES, OFF_Q = OFF_V + V_BYTES, OFF_O = OFF_Q + WB_NS * Q_BYTES;
    static constexpr int OFF_DS = OFF_O + WB_NS * O_BYTES, OFF_LD = OFF_DS + 2 * DS_BYTES;
    // DQB (wb_dq_bulk): one fp32 dQ slot per consumer
    // warpgroup, two boxes of [64 rows][32 floats] (16 KB), between lse2 / D and the barriers
    static constexpr int DQ_SLOT = 2 * WB_DQ_BOX;
    static constexpr int OFF_DQ = OFF_LD + WB_NS * LD_BYTES;
    static constexpr int OFF_BAR = OFF_DQ + (DQB ? 2 * DQ_SLOT : 0);
    // 1 KB to align the panels (the swizzle pattern repeats every 1024 bytes); barriers: K/V, full, empty
    static constexpr int SMEM = 1024 + OFF_BAR + 8 * (1 + 2 * WB_NS);
    static_assert(Q_BYTES % 1024 == 0 && O_BYTES % 1024 == 0 && DS_BYTES % 1024 == 0, "panel alignment");
    static_assert((NQ0 == 64 || NQ0 == 128) && (NQ1 == 64 || NQ1 == 128), "dQ column split");
    static_assert(!DQB || (OFF_DQ % 1024 == 0 && SMEM <= 232448), "dQ slots: alignment, 227 KB a block");
    static_assert(!DQB || ((BM == 128 ? NQ0 : NQP) == 64 && NQ1 == 64), "dQ slots: passes of 64 columns");
};

template <int R> static __device__ __forceinline__ void wb_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> static __device__ __forceinline__ void wb_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
static __device__ __forceinline__ void wb_sts32(uint32_t addr, uint32_t x) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
static __device__ __forceinline__ float2 wb_lds2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}
static __device__ __forceinline__ void wb_sts_v2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
static __device__ __forceinline__ void wb_red_add_v4(float *p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// Keeps the A fragments of register-operand wgmma live and unchanged until the wait.
template <int M> static __device__ __forceinline__ void wb_pin_a(uint32_t (&a)[M][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(a[i][e])::"memory");
}

// S^T / dP^T step: d (m64 x nN) (+)= A B, both K-major (N = BM queries).
template <int N> static __device__ __forceinline__ void wb_ss(float (&d)[N / 2], uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 32)
        wgmma_ss_n32<0, 0>(d, da, db, acc);
    else if constexpr (N == 64)
        wgmma_ss_n64<0, 0>(d, da, db, acc);
    else
        wgmma_ss_n128<0, 0>(d, da, db, acc);
}
// dQ step: d (m64 x nN) (+)= A B, both MN-major.
template <int N> static __device__ __forceinline__ void wb_ss_tt(float (&d)[N / 2], uint64_t da, uint64_t db, int acc) {
    if constexpr (N == 64)
        wgmma_ss_n64<1, 1>(d, da, db, acc);
    else
        wgmma_ss_n128<1, 1>(d, da, db, acc);
}
// dV / dK step: d (m64 x nN, N = 64, 128, 192) += A (registers) B, B MN-major at
// addr with its 64-column panels lbo bytes apart. 192 = n128 then n64 on the
// third panel: d[64 ..] is then laid out as an m64n192 accumulator would be
// (register 4 j + e <-> column 8 j + 2 t + (e & 1) throughout).
template <int N>
static __device__ __forceinline__ void wb_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint32_t addr, uint32_t lbo) {
    if constexpr (N == 64) {
        wgmma_rs_tb<64>(d, a, wgmma_desc(addr, lbo, 1024));
    } else if constexpr (N == 128) {
        wgmma_rs_tb<128>(d, a, wgmma_desc(addr, lbo, 1024));
    } else {
        static_assert(N == 192, "n");
        wgmma_rs_tb<128>(*reinterpret_cast<float(*)[64]>(&d[0]), a, wgmma_desc(addr, lbo, 1024));
        wgmma_rs_tb<64>(*reinterpret_cast<float(*)[32]>(&d[64]), a, wgmma_desc(addr + 2 * lbo, lbo, 1024));
    }
}

// One warpgroup's share of dQ for a step: rows [row0, row0 + 64) x columns
// [c0, c0 + NQ) of dS K over the tile's 128 keys. a0: the dS^T buffer's panel
// of these 64 queries; b0: the K panel of column c0. Added to dqh ([Tq][dqk]
// fp32). (Skipping the key chunks that no query of a diagonal step sees would
// put the wgmma under a branch, which ptxas pays for with a warpgroup arrive
// before each one: C7519.)
template <int NQ>
static __device__ __forceinline__ void wb_dq(float *dqh, int dqk, uint32_t a0, uint32_t b0, int row0, int c0, int Tq,
                                             int wi, int g, int t4) {
    float acc[NQ / 2];
#pragma unroll
    for (int i = 0; i < NQ / 2; i++)
        acc[i] = 0.f;
    wgmma_pin(acc); // the zeros are set before the fence (no warpgroup arrive added per wgmma)
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < WB_BN / 16; kc++) // 16 keys a step: two 8-row groups of both operands (2048 bytes)
        wb_ss_tt<NQ>(acc, wgmma_desc(a0 + kc * 2048, WB_BN * 128, 1024), wgmma_desc(b0 + kc * 2048, WB_BN * 128, 1024),
                     kc > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(acc);
    // Lanes t and t ^ 1 trade pairs so that each adds 4 consecutive columns:
    // an even t keeps row g, columns 8 j + 2 t .. + 3; an odd t row g + 8,
    // columns 8 j + 2 (t - 1) .. + 3 (half the atomic operations of v2 pairs).
    const bool odd = t4 & 1;
    const int row = row0 + 16 * wi + g + (odd ? 8 : 0);
    float *dst = dqh + (int64_t)row * dqk + c0 + 2 * (t4 & 2);
#pragma unroll
    for (int j = 0; j < NQ / 8; j++) {
        const float s0 = odd ? acc[4 * j] : acc[4 * j + 2], s1 = odd ? acc[4 * j + 1] : acc[4 * j + 3];
        const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        if (row < Tq) {
            if (odd)
                wb_red_add_v4(dst + 8 * j, r0, r1, acc[4 * j + 2], acc[4 * j + 3]);
            else
                wb_red_add_v4(dst + 8 * j, acc[4 * j], acc[4 * j + 1], r0, r1);
        }
    }
}

// DQB: one warpgroup's dQ share of 64 rows [row0, row0
// + 64) x 64 columns [c0, c0 + 64), computed as in wb_dq, then added into the
// accumulator by the copy engine instead of 1024 red.global.add.v4 (8 a thread):
//  - each thread stores its 32 floats into the warpgroup's slot, the two boxes
//    (columns c0.., c0 + 32..) of tdq, the accumulator's tensor map ([heads][Tq]
//    [dqk] fp32, boxes of 64 rows x 32 columns, 128-byte swizzle: row r of a box
//    is 128 bytes, its 16-byte chunk c at c ^ r % 8);
//  - fence.proxy.async (the copy engine reads what ordinary stores wrote), the
//    warpgroup's barrier, then one thread (issuer) adds both boxes with
//    cp.reduce.async.bulk.tensor (.add, fp32) in one bulk group (empty when
//    all 64 rows are past Tq). The map's bounds drop the rows at or past Tq
//    (the next head's rows in the accumulator; their dS, so dQ, is 0 anyway).
//  - wait: the slot still holds an earlier pass of this step (192/128's second
//    pass): the issuer first waits until that group has read it, then the
//    barrier. The first pass of a step needs no wait here: the issuer waited
//    before the step's "stage done" barrier (k_attn_bwd_wgmma).
// Banks: a store writes registers 4 j + 2 h, + 1 (row 16 wi + g + 8 h, columns
// 8 j + 2 t4, + 1) as 8 bytes at chunk (2 (j % 4) + t4 / 2) ^ g of box j / 4. For
// one j and h a warp writes 8 rows x 2 chunks; with g = 0..7 each of the 8 chunk
// positions (4 banks) gets two chunk halves from two rows: 256 bytes in 2
// wavefronts, the least there is. (Unswizzled rows of 256 or 512 bytes would put
// all 8 rows in the same banks, 4 wavefronts.)
static __device__ __forceinline__ void wb_dq_bulk(const CUtensorMap *tdq, int head, uint32_t slot, uint32_t a0,
                                                  uint32_t b0, int row0, int c0, int Tq, bool wait, bool issuer,
                                                  int bar, int wi, int g, int t4) {
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        acc[i] = 0.f;
    wgmma_pin(acc);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < WB_BN / 16; kc++)
        wb_ss_tt<64>(acc, wgmma_desc(a0 + kc * 2048, WB_BN * 128, 1024), wgmma_desc(b0 + kc * 2048, WB_BN * 128, 1024),
                     kc > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(acc);
    if (wait) {
        if (issuer) tma_store_wait_read<0>();
        named_sync(bar, 128);
    }
    const uint32_t x = (uint32_t)((t4 >> 1) ^ g), at = slot + (16 * wi + g) * 128 + 8 * (t4 & 1);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wb_sts_v2(at + (j >> 2) * WB_DQ_BOX + h * 1024 + (((2u * (j & 3)) ^ x) << 4), acc[4 * j + 2 * h],
                      acc[4 * j + 2 * h + 1]);
    fence_proxy_async();
    named_sync(bar, 128);
    if (issuer) {
        if (row0 < Tq) { // else every row is past Tq (64/64: warpgroup 1 at Tq % 128 <= 64)
            tma_reduce_add_3d(tdq, c0, row0, head, slot);
            tma_reduce_add_3d(tdq, c0 + 32, row0, head, slot + WB_DQ_BOX);
        }
        tma_store_commit();
    }
}

// Grid: n_kt * n_units blocks, key tile slowest (tile 0, the heaviest when
// causal, first). unit = (b, kv head) = u0 + local index ul; dqacc is [n_units
// * grp][Tq][dqk] (head hh of the unit at ul * grp + hh). CAUSAL false: every
// query sees every key (not reachable through attn_bwd, which is causal). A
// template argument rather than a flag: the flag's extra live values made the
// 192/128 consumers spill loop counters. The body of k_attn_bwd_wgmma and of
// k_attn_bwd_wgmma_dqb (DQB: dQ by wb_dq_bulk into tdq, the
// accumulator's tensor map; NULL otherwise).
template <int DQK, int DV, bool CAUSAL, bool DQB>
static __device__ __forceinline__ void
wb_bwd(bf16 *__restrict__ dk, bf16 *__restrict__ dvo, float *__restrict__ dqacc, const CUtensorMap *tq,
       const CUtensorMap *tdo, const CUtensorMap *tk, const CUtensorMap *tv, const CUtensorMap *tdq,
       const float *__restrict__ lse2, const float *__restrict__ Dd, int Tq, int Tk, int H, int Hkv, float sl2,
       float scale, int u0, int n_units, int Tqp) {
    typedef wb_cfg<DQK, DV, DQB> C;
    constexpr int BM = C::BM, QS = C::QS;
    extern __shared__ __align__(1024) unsigned char wb_smem[];
    const uint32_t raw = smem_u32(wb_smem), base = (raw + 1023u) & ~1023u;
    const uint32_t sK = base, sV = base + C::OFF_V, sQ = base + C::OFF_Q, sO = base + C::OFF_O;
    const uint32_t sDS = base + C::OFF_DS, sLD = base + C::OFF_LD, sDQ = base + C::OFF_DQ;
    const uint32_t bar_kv = base + C::OFF_BAR, bar_full = bar_kv + 8, bar_empty = bar_full + 8 * WB_NS;

    const int jt = blockIdx.x / n_units, ul = blockIdx.x - jt * n_units;
    const int u = u0 + ul, b = u / Hkv, hk = u - b * Hkv, grp = H / Hkv;
    const int n0 = jt * WB_BN, off = Tk - Tq;
    // query tiles that see a key of this tile (causal: t >= n0 - off), for each head of the group
    const int mt0 = CAUSAL ? max(0, n0 - off) / BM : 0;
    const int n_mt = (Tq + BM - 1) / BM;
    const int per_head = n_mt > mt0 ? n_mt - mt0 : 0;
    const int n_it = grp * per_head;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // lse2 / D: a step at BM = 128 may load only its first 64 rows (Tqp is a
    // multiple of 64); zeros make the rest finite (those queries are masked)
    for (int i = tid; i < WB_NS * 2 * BM; i += WB_THREADS)
        ((float *)(wb_smem + (sLD - raw)))[i] = 0.f;
    fence_proxy_async(); // before the copy engine writes the same bytes
    if (tid == 0) {
        mbar_init(bar_kv, 1);
        for (int s = 0; s < WB_NS; s++) {
            mbar_init(bar_full + 8 * s, 1);
            mbar_init(bar_empty + 8 * s, 2); // one arrival per consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) { // producer warpgroup
        wb_setmaxnreg_dec<24>();
        if (tid == 0) {
            mbar_arrive_expect_tx(bar_kv, C::K_BYTES + C::V_BYTES);
            for (int p = 0; p < C::QK_PANELS; p++)
                tensor_g2s_3d(sK + p * WB_BN * 128, tk, hk * DQK + 64 * p, n0, b, bar_kv);
            for (int p = 0; p < C::V_PANELS; p++)
                tensor_g2s_3d(sV + p * WB_BN * 128, tv, hk * DV + 64 * p, n0, b, bar_kv);
            for (int it = 0; it < n_it; it++) {
                const int s = it % WB_NS, r = it / WB_NS;
                if (r > 0) mbar_wait(bar_empty + 8 * s, (r - 1) & 1); // both warpgroups are done with the stage
                const int hh = it / per_head, m0 = (mt0 + it - hh * per_head) * BM, h = hk * grp + hh;
                const uint32_t lb = (uint32_t)min(BM, Tqp - m0) * 4; // m0 + 64 <= Tqp always
                const uint32_t fb = bar_full + 8 * s, q_s = sQ + s * C::Q_BYTES, o_s = sO + s * C::O_BYTES;
                const uint32_t l_s = sLD + s * C::LD_BYTES;
                mbar_arrive_expect_tx(fb, C::Q_BYTES + C::O_BYTES + 2 * lb);
                for (int p = 0; p < C::QK_PANELS; p++)
                    tensor_g2s_3d(q_s + p * BM * 128, tq, h * DQK + 64 * p, m0, b, fb);
                for (int p = 0; p < C::V_PANELS; p++)
                    tensor_g2s_3d(o_s + p * BM * 128, tdo, h * DV + 64 * p, m0, b, fb);
                const int64_t li = ((int64_t)b * H + h) * Tqp + m0;
                bulk_g2s(l_s, lse2 + li, lb, fb);
                bulk_g2s(l_s + BM * 4, Dd + li, lb, fb);
            }
        }
        return;
    }

    // consumers: warpgroup w owns key rows [64 w, 64 w + 64) of the tile; this
    // thread's accumulator rows are kr and kr + 8, columns 8 j + 2 t4 (+1)
    wb_setmaxnreg_inc<240>();
    // w through a shuffle: the compiler then knows it is the same in the warp,
    // so the wgmma under branches on it are not serialized (ptxas C7520)
    const int w = __shfl_sync(0xffffffffu, (warp >> 2) - 1, 0), wi = warp & 3, g = lane >> 2, t4 = lane & 3;
    const int kr = 64 * w + 16 * wi + g;
    const bool issuer = wi == 0 && lane == 0; // DQB: the thread of the warpgroup that issues its bulk reductions
    float dka[DQK / 2], dva[DV / 2];
#pragma unroll
    for (int i = 0; i < DQK / 2; i++)
        dka[i] = 0.f;
#pragma unroll
    for (int i = 0; i < DV / 2; i++)
        dva[i] = 0.f;
    const uint32_t k_w = sK + w * 64 * 128, v_w = sV + w * 64 * 128; // this warpgroup's rows in each panel
    mbar_wait(bar_kv, 0);

    for (int it = 0; it < n_it; it++) {
        const int s = it % WB_NS, ph = (it / WB_NS) & 1;
        const int hh = it / per_head, m0 = (mt0 + it - hh * per_head) * BM;
        const int q_last = min(m0 + BM, Tq) - 1;
        const int k_lim = CAUSAL ? off + q_last : Tk - 1; // the last key a query of the step sees (>= n0)
        const uint32_t q_s = sQ + s * C::Q_BYTES, o_s = sO + s * C::O_BYTES, l_s = sLD + s * C::LD_BYTES;
        const uint32_t dsb = sDS + (it & 1) * C::DS_BYTES;
        mbar_wait(bar_full + 8 * s, ph);

        // some pair of the warpgroup's keys and the step's queries is masked
        const bool edge =
            CAUSAL ? (n0 + 64 * w + 63 > off + m0 || m0 + BM > Tq) : (n0 + 64 * w + 64 > Tk || m0 + BM > Tq);
        if (n0 + 64 * w <= k_lim) { // else all of this warpgroup's P and dS are 0 (zeros for dQ below)
            // queries in sub-blocks of QS columns (QS = BM but at 192/128: registers, see wb_cfg)
#pragma unroll
            for (int sb = 0; sb < BM / QS; sb++) {
                float st[QS / 2], dp[QS / 2];
                wgmma_fence();
                // S^T = K_w Q^T over DQK / 16 steps of 16 columns (4 per 64-column panel, 32 bytes each);
                // the sub-block's queries are rows [QS sb, QS sb + QS) of each Q panel
#pragma unroll
                for (int kk = 0; kk < DQK / 16; kk++) {
                    const uint32_t pan = kk >> 2, sub = (kk & 3) * 32;
                    wb_ss<QS>(st, wgmma_desc(k_w + pan * WB_BN * 128 + sub, 16, 1024),
                              wgmma_desc(q_s + pan * BM * 128 + sb * QS * 128 + sub, 16, 1024), kk > 0);
                }
                wgmma_commit();
                // dP^T = V_w dO^T
#pragma unroll
                for (int kk = 0; kk < DV / 16; kk++) {
                    const uint32_t pan = kk >> 2, sub = (kk & 3) * 32;
                    wb_ss<QS>(dp, wgmma_desc(v_w + pan * WB_BN * 128 + sub, 16, 1024),
                              wgmma_desc(o_s + pan * BM * 128 + sb * QS * 128 + sub, 16, 1024), kk > 0);
                }
                wgmma_commit();
                wgmma_wait<1>(); // S^T done; dP^T may still run
                wgmma_pin(st);

                // P^T = exp2(S^T sl2 - lse2[query]); masked: a key past the query's
                // causal limit (past Tk when not causal), a query past Tq
#pragma unroll
                for (int j = 0; j < QS / 8; j++) {
                    const int qc =
                        sb * QS + 8 * j + 2 * t4; // query (in the tile) of registers 4 j, 4 j + 2; +1: 4 j + 1, 4 j + 3
                    const float2 l2 = wb_lds2(l_s + qc * 4);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float p = exp2_approx(fmaf(st[4 * j + e], sl2, -((e & 1) ? l2.y : l2.x)));
                        if (edge) {
                            const int key = n0 + kr + 8 * (e >> 1), qr = m0 + qc + (e & 1);
                            if (qr >= Tq || (CAUSAL ? key > off + qr : key >= Tk)) p = 0.f;
                        }
                        st[4 * j + e] = p;
                    }
                }
                wgmma_wait<0>();
                wgmma_pin(dp);
                // dS^T = P^T (dP^T - D[query]) (unscaled), into dp
#pragma unroll
                for (int j = 0; j < QS / 8; j++) {
                    const float2 dd = wb_lds2(l_s + BM * 4 + (sb * QS + 8 * j + 2 * t4) * 4);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        dp[4 * j + e] = st[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? dd.y : dd.x));
                }
                // P^T and dS^T as bf16 A fragments of QS / 16 steps of 16 queries:
                // n-tiles 2 kq, 2 kq + 1 of the accumulator are the step's columns
                uint32_t pa[QS / 16][4], sa[QS / 16][4];
#pragma unroll
                for (int kq = 0; kq < QS / 16; kq++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        pa[kq][i] = pack_bf16(st[8 * kq + 2 * i], st[8 * kq + 2 * i + 1]);
                        sa[kq][i] = pack_bf16(dp[8 * kq + 2 * i], dp[8 * kq + 2 * i + 1]);
                    }
                    // dS^T -> buffer dsb: key row r (128 bytes = 64 queries of one
                    // panel), query q at panel q / 64, 16-byte chunk (q % 64) / 8 ^ r % 8
                    // (r % 8 = g). sa[kq][0..3] = (row kr, n-tile 2 kq), (kr + 8, 2 kq),
                    // (kr, 2 kq + 1), (kr + 8, 2 kq + 1). A warp's 32 stores of one
                    // n-tile hit 8 rows x 4 words in 8 distinct chunks: no bank conflict.
#pragma unroll
                for (int kq = 0; kq < QS / 16; kq++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int j = sb * (QS / 8) + 2 * kq + hf; // n-tile of the whole step
                        const uint32_t at = dsb + (j >> 3) * (WB_BN * 128) + kr * 128 + (((j & 7) ^ g) << 4) + 4 * t4;
                        wb_sts32(at, sa[kq][2 * hf]);
                        wb_sts32(at + 8 * 128, sa[kq][2 * hf + 1]);
                    }
                fence_proxy_async();
                // dV += P^T dO, dK += dS^T Q: 16 queries (two 8-row groups, 2048 bytes) a step.
                // The fragments are pinned first so that no conversion lands after
                // the fence (ptxas would add a warpgroup arrive per wgmma, C7519).
                wb_pin_a(pa);
                wb_pin_a(sa);
                wgmma_fence();
#pragma unroll
                for (int kq = 0; kq < QS / 16; kq++) {
                    const uint32_t row16 = (sb * (QS / 16) + kq) * 2048;
                    wb_rs<DV>(dva, pa[kq], o_s + row16, BM * 128);
                    wb_rs<DQK>(dka, sa[kq], q_s + row16, BM * 128);
                }
                wgmma_commit();
                wgmma_wait<0>(); // also before dQ's accumulator exists: the registers do not hold both at 192/128
                wgmma_pin(dva);
                wgmma_pin(dka);
                wb_pin_a(pa);
                wb_pin_a(sa);
            }
        } else {
#pragma unroll
            for (int j = 0; j < BM / 8; j++) {
                const uint32_t at = dsb + (j >> 3) * (WB_BN * 128) + kr * 128 + (((j & 7) ^ g) << 4) + 4 * t4;
                wb_sts32(at, 0u);
                wb_sts32(at + 8 * 128, 0u);
            }
            fence_proxy_async();
        }
        // this warpgroup is done with the stage (DQB: and the bulk reduction of its
        // dQ slot, issued the step before, has read it; the slot is written below)
        if constexpr (DQB)
            if (issuer) tma_store_wait_read<0>();
        named_sync(1 + w, 128);
        if (wi == 0 && lane == 0) mbar_arrive(bar_empty + 8 * s);
        // both warpgroups' dS^T in the buffer. Two buffers make this the only
        // barrier of the step: a warpgroup writes buffer it & 1 after this
        // barrier of step it - 1, which the other passes only after its dQ of
        // step it - 2 (the last reader of that buffer) has completed.
        named_sync(3, 256);

        if constexpr (DQB) { // the same shares and passes, through warpgroup w's slot
            const int head = ul * grp + hh;
            const uint32_t slot = sDQ + w * C::DQ_SLOT;
            if (BM == 128)
                wb_dq_bulk(tdq, head, slot, dsb + w * WB_BN * 128, sK, m0 + 64 * w, 0, Tq, false, issuer, 1 + w, wi, g,
                           t4);
            else if (w == 0) {
#pragma unroll
                for (int c = 0; c < C::NQ0; c += 64)
                    wb_dq_bulk(tdq, head, slot, dsb, sK + (c / 64) * WB_BN * 128, m0, c, Tq, c > 0, issuer, 1 + w, wi,
                               g, t4);
            } else
                wb_dq_bulk(tdq, head, slot, dsb, sK + (C::NQ0 / 64) * WB_BN * 128, m0, C::NQ0, Tq, false, issuer, 1 + w,
                           wi, g, t4);
        } else {
            float *dqh = dqacc + (int64_t)(ul * grp + hh) * Tq * DQK;
            if (BM == 128) // rows [64 w, 64 w + 64): panel w of the buffer, all columns
                wb_dq<C::NQ0>(dqh, DQK, dsb + w * WB_BN * 128, sK, m0 + 64 * w, 0, Tq, wi, g, t4);
            else if (w == 0) {
#pragma unroll
                for (int c = 0; c < C::NQ0; c += C::NQP) // passes of NQP columns (registers: see wb_cfg)
                    wb_dq<C::NQP>(dqh, DQK, dsb, sK + (c / 64) * WB_BN * 128, m0, c, Tq, wi, g, t4);
            } else
                wb_dq<C::NQ1>(dqh, DQK, dsb, sK + (C::NQ0 / 64) * WB_BN * 128, m0, C::NQ0, Tq, wi, g, t4);
        }
    }

    // epilogue: dK = scale dS^T Q, dV = P^T dO -> bf16 (rows past Tk not stored)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int key = n0 + kr + 8 * i;
        if (key >= Tk) continue;
        bf16 *dkr = dk + ((int64_t)b * Tk + key) * Hkv * DQK + (int64_t)hk * DQK;
        bf16 *dvr = dvo + ((int64_t)b * Tk + key) * Hkv * DV + (int64_t)hk * DV;
#pragma unroll
        for (int j = 0; j < DQK / 8; j++)
            *(uint32_t *)(dkr + 8 * j + 2 * t4) = pack_bf16(dka[4 * j + 2 * i] * scale, dka[4 * j + 2 * i + 1] * scale);
#pragma unroll
        for (int j = 0; j < DV / 8; j++)
            *(uint32_t *)(dvr + 8 * j + 2 * t4) = pack_bf16(dva[4 * j + 2 * i], dva[4 * j + 2 * i + 1]);
    }
    if constexpr (DQB) // the slot's last bulk reduction done before the block's shared memory goes
        if (issuer) tma_store_wait<0>();
}

template <int DQK, int DV, bool CAUSAL>
__global__ void __launch_bounds__(WB_THREADS, 1)
    k_attn_bwd_wgmma(bf16 *__restrict__ dk, bf16 *__restrict__ dvo, float *__restrict__ dqacc,
                     const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo,
                     const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                     const float *__restrict__ lse2, const float *__restrict__ Dd, int Tq, int Tk, int H, int Hkv,
                     float sl2, float scale, int u0, int n_units, int Tqp) {
    wb_bwd<DQK, DV, CAUSAL, false>(dk, dvo, dqacc, &tq, &tdo, &tk, &tv, nullptr, lse2, Dd, Tq, Tk, H, Hkv, sl2, scale,
                                   u0, n_units, Tqp);
}

// dQ added by bulk tensor reductions through tdq,
// the accumulator [n_units * grp][Tq][dqk] fp32 as a 3-D tensor map of boxes of
// 32 columns x 64 rows, 128-byte swizzle (launch_bwd_wgmma's wb_dq_map).
template <int DQK, int DV, bool CAUSAL>
__global__ void __launch_bounds__(WB_THREADS, 1)
    k_attn_bwd_wgmma_dqb(bf16 *__restrict__ dk, bf16 *__restrict__ dvo, float *__restrict__ dqacc,
                         const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo,
                         const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                         const __grid_constant__ CUtensorMap tdq, const float *__restrict__ lse2,
                         const float *__restrict__ Dd, int Tq, int Tk, int H, int Hkv, float sl2, float scale, int u0,
                         int n_units, int Tqp) {
    wb_bwd<DQK, DV, CAUSAL, true>(dk, dvo, dqacc, &tq, &tdo, &tk, &tv, &tdq, lse2, Dd, Tq, Tk, H, Hkv, sl2, scale, u0,
                                  n_units, Tqp);
}

// The dQ accumulator acc ([heads][Tq][dqk] fp32) as the 3-D tensor map of
// k_attn_bwd_wgmma_dqb: boxes of 32 columns (128 bytes, the 128-byte swizzle's
// row) x 64 rows x 1 head. Rows at or past Tq lie outside it, so a box over
// them adds nothing there (the next head's rows).
static bool wb_dq_map(cuda_encode_tiled_fn enc, CUtensorMap *m, float *acc, int dqk, int Tq, int heads) {
    const cuuint64_t dims[3] = {(cuuint64_t)dqk, (cuuint64_t)Tq, (cuuint64_t)heads};
    const cuuint64_t strides[2] = {(cuuint64_t)dqk * 4, (cuuint64_t)Tq * dqk * 4};
    const cuuint32_t box[3] = {32, 64, 1}, estr[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)acc, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Launches the wgmma backward and k_attn_dq_out, in passes over (b, kv head)
// units as run_bwd does; false (nothing launched) where it does not apply (no
// tensor-map encoder, be->deterministic (its dQ adds land in the order the
// blocks run), an empty or undescribable shape): the caller then runs the
// default kernels. lse2, Dd: k_attn_bwd_pre's, [B H][Tqp]. DQB:
// k_attn_bwd_wgmma_dqb, dQ by bulk tensor reductions.
template <int DQK, int DV, bool DQB = false>
static bool launch_bwd_wgmma(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                             const void *v, const float *lse2, const float *Dd, int B, int Tq, int Tk, int H, int Hkv,
                             float scale, int Tqp, int causal) {
    typedef wb_cfg<DQK, DV, DQB> C;
    cuda_encode_tiled_fn enc = cuda_tensor_encoder();
    if (!enc || be->deterministic || B <= 0 || Tq <= 0 || Tk <= 0) return false;
    CUtensorMap mq, mdo, mk, mv;
    if (!wg_tensor_map(enc, &mq, q, H * DQK, Tq, B, C::BM) || !wg_tensor_map(enc, &mdo, dout, H * DV, Tq, B, C::BM) ||
        !wg_tensor_map(enc, &mk, k, Hkv * DQK, Tk, B, WB_BN) || !wg_tensor_map(enc, &mv, v, Hkv * DV, Tk, B, WB_BN))
        return false;
    // each instantiation names only its own kernel (production builds only the DQB one)
    const void *kfn;
    if constexpr (DQB)
        kfn = causal ? (const void *)k_attn_bwd_wgmma_dqb<DQK, DV, true>
                     : (const void *)k_attn_bwd_wgmma_dqb<DQK, DV, false>;
    else
        kfn = causal ? (const void *)k_attn_bwd_wgmma<DQK, DV, true> : (const void *)k_attn_bwd_wgmma<DQK, DV, false>;
    if (cuda_smem_limit(be, kfn, C::SMEM, "k_attn_bwd_wgmma") < 0) return true; // error recorded
    const int grp = H / Hkv, units = B * Hkv, n_kt = (Tk + WB_BN - 1) / WB_BN;
    const size_t unit_bytes = (size_t)grp * Tq * DQK * sizeof(float); // one unit's fp32 dQ accumulator
    arena_t *ar = &be->scratch;
    const size_t avail = ar->cap > ar->used + 1024 ? ar->cap - ar->used - 1024 : 0;
    const int upc = avail / unit_bytes < (size_t)units ? (int)(avail / unit_bytes) : units;
    if (upc < 1) {
        cu_op_error(be,
                    "cuda attn_bwd: scratch arena too small: %zu bytes free, the dQ accumulator of one kv head "
                    "needs %zu",
                    avail, unit_bytes);
        return true;
    }
    const size_t mark = arena_mark(ar);
    float *acc = (float *)arena_alloc(ar, unit_bytes * (size_t)upc);
    if (!acc) {
        cu_op_error(be, "cuda attn_bwd: cannot take %zu bytes from the scratch arena", unit_bytes * (size_t)upc);
        return true;
    }
    CUtensorMap mdq = {};
    if constexpr (DQB)
        if (!wb_dq_map(enc, &mdq, acc, DQK, Tq, upc * grp)) {
            arena_reset(ar, mark);
            return false;
        }
    for (int u0 = 0; u0 < units; u0 += upc) {
        const int n = units - u0 < upc ? units - u0 : upc;
        cudaError_t e = cudaMemsetAsync(acc, 0, unit_bytes * (size_t)n, cuda_stream(be));
        if (e != cudaSuccess) {
            cuda_fail(be, "cudaMemsetAsync(attn dQ accumulator)", e);
            return true;
        }
        const int64_t blocks = (int64_t)n_kt * n;
        if constexpr (DQB) {
            auto kern = causal ? k_attn_bwd_wgmma_dqb<DQK, DV, true> : k_attn_bwd_wgmma_dqb<DQK, DV, false>;
            kern<<<(unsigned)blocks, WB_THREADS, C::SMEM, cuda_stream(be)>>>(
                (bf16 *)dk, (bf16 *)dv_, acc, mq, mdo, mk, mv, mdq, lse2, Dd, Tq, Tk, H, Hkv,
                scale * 1.4426950408889634f, scale, u0, n, Tqp);
        } else {
            auto kern = causal ? k_attn_bwd_wgmma<DQK, DV, true> : k_attn_bwd_wgmma<DQK, DV, false>;
            kern<<<(unsigned)blocks, WB_THREADS, C::SMEM, cuda_stream(be)>>>(
                (bf16 *)dk, (bf16 *)dv_, acc, mq, mdo, mk, mv, lse2, Dd, Tq, Tk, H, Hkv, scale * 1.4426950408889634f,
                scale, u0, n, Tqp);
        }
        cuda_check_launch(be, "k_attn_bwd_wgmma");
        const int64_t nv = (int64_t)n * grp * Tq * (DQK / 4);
        k_attn_dq_out<<<cuda_blocks(nv, 256), 256, 0, cuda_stream(be)>>>((bf16 *)dq, acc, Tq, H, Hkv, DQK, scale, u0,
                                                                         n);
        cuda_check_launch(be, "k_attn_dq_out");
    }
    return true;
}
