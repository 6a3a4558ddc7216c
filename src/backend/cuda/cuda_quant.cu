// Products and embedding lookups on weights kept in their GGUF block formats
// (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) or bf16, the CUDA side of backend.h's
// "quantised weights" ops. Layouts: docs/FORMATS.md, io/quant.c.
//
// Numerics:
//  - few rows (N <= BE_FEW_ROWS, decode): k_qgemv, the CPU's arithmetic for
//    few rows (cpu_quant.c): x rounded to 8-bit blocks of 32, exact integer
//    dot products per weight block, each block's fp32 term by the same
//    expression, one bf16 rounding at the end; only the order of the fp32
//    additions differs from the CPU;
//  - more rows (prefill): the matrix dequantised exactly as ggml_dequant does
//    (fp16 scales, the same products and sums, each rounded on its own: the
//    __fmul_rn / __fadd_rn below keep nvcc from fusing them into an fma the
//    CPU does not do) and rounded to bf16, into the scratch arena in slabs of
//    rows, multiplied by be->gemm (cuBLASLt): the weights then carry one bf16
//    rounding, as every act weight on CUDA does. qembed_fwd dequantises the
//    same way.
// bf16 weights go to be->gemm / be->embed_fwd as they are.
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_vec.cuh"

extern "C" {
#include "io/gguf.h"
}

// ---- block formats -------------------------------------------------------------

// Values and bytes of a block of format T; 0 for a type without one here.
static __host__ __device__ constexpr int q_block_values(int T) {
    return T == GGML_Q4_K || T == GGML_Q6_K ? 256 : T == GGML_BF16 ? 1 : 32;
}
static __host__ __device__ constexpr int q_block_bytes(int T) {
    return T == GGML_Q4_0   ? 18
           : T == GGML_Q4_1 ? 20
           : T == GGML_Q8_0 ? 34
           : T == GGML_Q4_K ? 144
           : T == GGML_Q6_K ? 210
           : T == GGML_BF16 ? 2
                            : 0;
}
// The alignment every block start has when the matrix starts 16-byte aligned
// and rows are a whole number of blocks apart: what q_dq8's loads rely on.
static __host__ __device__ constexpr int q_block_align(int T) { return T == GGML_Q4_K ? 16 : T == GGML_Q4_1 ? 4 : 2; }

static __device__ __forceinline__ float q_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short *>(p)));
}
// 8 bytes from a 2-byte aligned address (the 18-, 34- and 210-byte blocks).
static __device__ __forceinline__ uint2 q_ld8_a2(const uint8_t *p) {
    const unsigned short *h = reinterpret_cast<const unsigned short *>(p);
    return make_uint2((unsigned)h[0] | (unsigned)h[1] << 16, (unsigned)h[2] | (unsigned)h[3] << 16);
}
static __device__ __forceinline__ unsigned q_byte(uint2 v, int j) {
    return (j < 4 ? v.x >> (8 * j) : v.y >> (8 * j - 32)) & 0xffu;
}

// The 6-bit scale and min of sub-block sub (< 8) of a Q4_K super-block's 12
// packed bytes s (as io/quant.c and cpu_quant.c read them).
static __device__ __forceinline__ void q4k_scale_min(const uint8_t *s, int sub, unsigned &sc, unsigned &mn) {
    if (sub < 4) {
        sc = s[sub] & 63u, mn = s[sub + 4] & 63u;
    } else {
        sc = (s[sub + 4] & 0xfu) | ((unsigned)(s[sub - 4] >> 6) << 4);
        mn = (unsigned)(s[sub + 4] >> 4) | ((unsigned)(s[sub] >> 6) << 4);
    }
}

// w[0..8) = values v..v+7 (v a multiple of 8 below the block's size) of the
// block of format T at b, dequantised as io/quant.c does.
template <int T> static __device__ __forceinline__ void q_dq8(const uint8_t *b, int v, float (&w)[8]) {
    if constexpr (T == GGML_Q4_0 || T == GGML_Q4_1) {
        // values 0..15: low nibbles of qs[0..16), 16..31: high nibbles
        const int off = T == GGML_Q4_0 ? 2 : 4, j0 = (v & 8), sh = (v & 16) >> 2;
        const float d = q_f16(b);
        uint2 q;
        if constexpr (T == GGML_Q4_1) { // 20-byte blocks: 4-byte aligned
            const unsigned *u = reinterpret_cast<const unsigned *>(b + off + j0);
            q = make_uint2(u[0], u[1]);
        } else {
            q = q_ld8_a2(b + off + j0);
        }
        if constexpr (T == GGML_Q4_0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                w[j] = __fmul_rn((float)((int)((q_byte(q, j) >> sh) & 0xfu) - 8), d);
        } else {
            const float m = q_f16(b + 2);
#pragma unroll
            for (int j = 0; j < 8; j++)
                w[j] = __fadd_rn(__fmul_rn((float)((q_byte(q, j) >> sh) & 0xfu), d), m);
        }
    } else if constexpr (T == GGML_Q8_0) {
        const float d = q_f16(b);
        const uint2 q = q_ld8_a2(b + 2 + v);
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = __fmul_rn((float)(int8_t)q_byte(q, j), d);
    } else if constexpr (T == GGML_Q4_K) {
        // 4 chunks of 64 values: 32 low nibbles of qs[32 c ..], then their high
        // nibbles; sub-block v / 32 has its own 6-bit scale and min.
        const int sub = v >> 5, c = v >> 6, l0 = v & 31;
        const uint8_t *s = b + 4;
        unsigned sc, mn;
        q4k_scale_min(s, sub, sc, mn);
        const float d1 = __fmul_rn(q_f16(b), (float)sc), m1 = __fmul_rn(q_f16(b + 2), (float)mn);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 32 * c + l0);
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int j = 0; j < 8; j++)
            w[j] = __fsub_rn(__fmul_rn(d1, (float)((q_byte(q, j) >> sh) & 0xfu)), m1);
    } else {
        static_assert(T == GGML_Q6_K, "q_dq8: no such block format");
        // Two halves of 128; in a half, value 32 qd + l (qd < 4, l < 32) takes
        // the low (qd 0, 1) or high (qd 2, 3) nibble of ql[l + 32 (qd & 1)] and
        // bits 2 qd of qh[l], scale sc[l / 16 + 2 qd].
        const int h = v >> 7, qd = (v >> 5) & 3, l0 = v & 31;
        const uint2 ql = q_ld8_a2(b + 64 * h + l0 + 32 * (qd & 1)), qh = q_ld8_a2(b + 128 + 32 * h + l0);
        const float ds = __fmul_rn(q_f16(b + 208), (float)(int8_t)b[192 + 8 * h + (l0 >> 4) + 2 * qd]);
        const int shl = (qd & 2) * 2, shh = 2 * qd;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int q = (int)(((q_byte(ql, j) >> shl) & 0xfu) | (((q_byte(qh, j) >> shh) & 3u) << 4)) - 32;
            w[j] = __fmul_rn(ds, (float)q);
        }
    }
}

// Values p..p+7 (p a multiple of 8) of a run of blocks of format T at row.
template <int T> static __device__ __forceinline__ void q_dq8_at(const uint8_t *row, int p, float (&w)[8]) {
    q_dq8<T>(row + (p / q_block_values(T)) * q_block_bytes(T), p % q_block_values(T), w);
}

// ---- few rows: k_qgemv ------------------------------------------------------------
// y [M, rows] = x [M, K] W^T for M <= BE_FEW_ROWS, in the CPU's arithmetic for
// few rows (cpu_quant.c): each row of x rounded to 8-bit blocks of 32 (codes
// q, scale dx, s = dx sum q), each weight block's or sub-block's integer dot
// product with them (dp4a, exact), scaled in fp32 by the same expression as
// the reference kernels there (each operation rounded on its own: __fmul_rn);
// GPU and CPU differ only in the order of the fp32 additions. Integer dot
// products keep the kernel on the weights' bytes: dequantising every value to
// fp32 (int-to-float conversions at a quarter of the FMA rate) held it to a
// quarter of the bandwidth.
//
// A block of QG_WARPS warps first rounds x into shared memory (each block
// its own copy: x is a few KB), then each warp takes one weight row at a time
// and streams it in steps of QG_STEP_V values: the step's bytes go into the
// warp's stage buffers by 16-byte cp.async from the 16-byte boundary below
// them (the 18-, 20-, 34- and 210-byte blocks do not keep 16-byte alignment),
// QG_STAGES - 1 steps in flight, the pipeline running on from one row to the
// next. In a step lane l takes the step's 32-value block (or sub-block) l.
// fp32 sums per lane, then a warp sum; deterministic.
enum { QG_WARPS = 8, QG_STAGES = 6, QG_STEP_V = 1024, QG_ROUND_BATCH = 2, QG_NORM_BATCH = 4 };

static __host__ __device__ constexpr int qg_step_bytes(int T) {
    return QG_STEP_V / q_block_values(T) * q_block_bytes(T);
}
// A stage buffer: the step's bytes from the 16-byte boundary below them, and
// room for the word qg_words reads past a block's end.
static __host__ __device__ constexpr int qg_win_bytes(int T) { return (qg_step_bytes(T) + 15) / 16 * 16 + 32; }
static __host__ __device__ constexpr int qg_stage_smem(int T) { return QG_WARPS * QG_STAGES * qg_win_bytes(T); }
// x rounded, per row: K codes padded to whole steps, then (dx, s) per block of 32.
static __host__ __device__ constexpr int64_t qg_x_row_bytes(int64_t K) {
    return (K + QG_STEP_V - 1) / QG_STEP_V * QG_STEP_V * 5 / 4;
}

// A 16-byte cp.async of which the first n bytes (1..16) are read, the rest zeroed.
static __device__ __forceinline__ void qg_cp16(uint32_t dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

// The most 16-byte pieces a step's bytes span from the boundary below them.
static __host__ __device__ constexpr int qg_step_chunks(int T) { return (qg_step_bytes(T) + 15 + 15) / 16; }

// Queues the bytes of step s of the weight row at row (16-byte aligned:
// row_data bytes, the matrix ending at end) into the stage buffer buf. Pieces
// past end read only up to it (the rest zeroed). A lane takes pieces lane,
// lane + 32, ...: a fixed count, no loop to run.
template <int T>
static __device__ __forceinline__ void qg_issue(unsigned char *buf, const uint8_t *row, const uint8_t *end,
                                                int row_data, int s, int lane) {
    enum { STEP_B = qg_step_bytes(T), PASSES = (qg_step_chunks(T) + 31) / 32 };
    const int b0 = s * STEP_B, bytes = row_data - b0 < STEP_B ? row_data - b0 : STEP_B;
    const uint8_t *src = row + b0;
    const int off = (int)((uintptr_t)src & 15);
    const uint8_t *al = src - off;
    const int n16 = (off + bytes + 15) >> 4;
    const int64_t left64 = end - al; // bytes from al to the matrix's end, at least 1
    const int left = left64 < 32 * 16 * PASSES ? (int)left64 : 32 * 16 * PASSES;
    const uint32_t dst = smem_u32(buf);
#pragma unroll
    for (int i = 0; i < PASSES; i++) {
        const int c = lane + 32 * i;
        if (c < n16) qg_cp16(dst + 16 * c, al + 16 * c, left - 16 * c < 16 ? left - 16 * c : 16);
    }
}

#ifdef HYLO_BENCH_VARIANTS
// Bench-only (HYLO_QGEMV_BULK=1, qgemv()): a step's bytes by one bulk copy
// of lane 0 into the stage, completing on the stage's mbarrier, instead of
// the lanes' 16-byte cp.async pieces: fewer instructions a step, to see
// whether k_qgemv is bound by their issue. It reads the 16-byte pieces the
// step's bytes touch whole, so up to 15 bytes past the matrix's end (model.c
// rounds each block-format matrix to 64 bytes).
static __device__ __forceinline__ void qg_bar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
}
static __device__ __forceinline__ void qg_bar_wait(uint64_t *bar, uint32_t phase) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(phase)
            : "memory");
    } while (!done);
}
template <int T>
static __device__ __forceinline__ void qg_issue_bulk(unsigned char *buf, uint64_t *bar, const uint8_t *row,
                                                     int row_data, int s) {
    enum { STEP_B = qg_step_bytes(T) };
    const int b0 = s * STEP_B, bytes = row_data - b0 < STEP_B ? row_data - b0 : STEP_B;
    const uint8_t *src = row + b0;
    const int off = (int)((uintptr_t)src & 15), n = (off + bytes + 15) & ~15;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(n) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(buf)),
                 "l"(src - off), "r"(n), "r"(smem_u32(bar))
                 : "memory");
}
#endif

// The producer's place in a warp's stream: the row and step it asks for
// next, and the stage slot they go to. qg_produce queues them and moves on
// (counters, not divisions: a decode product is bound by the instructions of
// its stream as much as by bytes). bars: the BULK variant's mbarriers.
typedef struct {
    const uint8_t *row;
    int step, slot;
} qg_prod_t;

template <int T, bool BULK>
static __device__ __forceinline__ void qg_produce(qg_prod_t &p, unsigned char *stage, uint64_t *bars,
                                                  const uint8_t *end, int row_data, int nsteps, int64_t stride_b,
                                                  int lane) {
    unsigned char *buf = stage + p.slot * qg_win_bytes(T);
    if constexpr (BULK) {
#ifdef HYLO_BENCH_VARIANTS
        if (lane == 0) qg_issue_bulk<T>(buf, bars + p.slot, p.row, row_data, p.step);
#endif
    } else {
        qg_issue<T>(buf, p.row, end, row_data, p.step, lane);
    }
    if (++p.step == nsteps) p.step = 0, p.row += stride_b;
}

// N words from the 2-byte aligned p in shared memory: N + 1 aligned loads,
// shifted into place.
template <int N> static __device__ __forceinline__ void qg_words(const unsigned char *p, uint32_t (&w)[N]) {
    const uint32_t *a = reinterpret_cast<const uint32_t *>((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = (unsigned)((uintptr_t)p & 2) * 8;
    uint32_t lo = a[0];
#pragma unroll
    for (int j = 0; j < N; j++) {
        const uint32_t hi = a[j + 1];
        w[j] = __funnelshift_r(lo, hi, sh);
        lo = hi;
    }
}

// Rounds x [M, K] (bf16, rows ldx apart) into the block's shared copy xs: per
// row (qg_x_row_bytes apart) the codes of block b at 1024 (b / 32) + 16 (b %
// 32), its first 16 codes there and the other 16 512 bytes on (so the 32
// lanes of a step read 16-byte pieces side by side), then float2 (dx, s) per
// block after the row's codes. The arithmetic of cpu_quant.c's ref_quantize,
// a block with a NaN or infinity included. Four threads a block, 8 values
// each (few registers: the kernel's occupancy is set by its largest phase).
// With a gain xw, the rows RMS-normalised first (rmsnorm_fwd's formula, in
// fp32; the squares summed by QG_WARPS / M warps a row). With up rows xu
// (then no xw), SwiGLU(x, xu) instead of x, each value rounded to bf16 as
// swiglu_fwd stores it: the MLP's down product takes its input so.
template <int M>
static __device__ __forceinline__ void qg_round_x(unsigned char *xs, const bf16 *x, const bf16 *xu, int64_t ldx, int K,
                                                  const bf16 *xw, float eps) {
    const int nb = K / 32, kp = (K + QG_STEP_V - 1) / QG_STEP_V * QG_STEP_V, n = M * nb * 4;
    const int64_t xrb = qg_x_row_bytes(K);
    const bool v8 = !(((uintptr_t)x | (uintptr_t)xu | (uintptr_t)xw) & 15) && ldx % 8 == 0;
    __shared__ float rstd[M], part[QG_WARPS];
    if (xw) {
        // QG_WARPS / M warps a row, each every (QG_WARPS / M)-th piece of 8
        // values, all of a lane's loads out at once where they fit
        // QG_NORM_BATCH: the sum of squares is one round trip to L2, not
        // one per piece, ahead of every normed product of a decode step
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpr = QG_WARPS / M, m = warp / wpr;
        const int j = warp - m * wpr;
        float ss = 0.0f;
        if (m < M) {
            const bf16 *p = x + m * ldx;
            if (v8) {
                for (int q0 = 32 * j + lane; 8 * q0 < K; q0 += 32 * wpr * QG_NORM_BATCH) {
                    float f[QG_NORM_BATCH][8];
#pragma unroll
                    for (int u = 0; u < QG_NORM_BATCH; u++)
                        if (8 * (q0 + 32 * wpr * u) < K) ld_bf16<8>(p + 8 * (q0 + 32 * wpr * u), f[u]);
#pragma unroll
                    for (int u = 0; u < QG_NORM_BATCH; u++)
                        if (8 * (q0 + 32 * wpr * u) < K)
#pragma unroll
                            for (int i = 0; i < 8; i++)
                                ss = fmaf(f[u][i], f[u][i], ss);
                }
            } else {
                for (int k = 32 * j + lane; k < K; k += 32 * wpr) {
                    const float f = __bfloat162float(p[k]);
                    ss = fmaf(f, f, ss);
                }
            }
        }
        ss = warp_sum(ss);
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        if ((int)threadIdx.x < M) { // the row's warps' parts in order
            float t = 0.0f;
            for (int w = 0; w < wpr; w++)
                t += part[threadIdx.x * wpr + w];
            rstd[threadIdx.x] = 1.0f / sqrtf(t / (float)K + eps);
        }
        __syncthreads();
    }
    // every lane of a warp runs each pass (the shuffles); a pass's loads all
    // go out before its math, QG_ROUND_BATCH pieces a thread
    for (int i0 = 0; i0 < n; i0 += QG_WARPS * 32 * QG_ROUND_BATCH) {
        float v[QG_ROUND_BATCH][8] = {};
#pragma unroll
        for (int u = 0; u < QG_ROUND_BATCH; u++) {
            const int i = i0 + u * QG_WARPS * 32 + (int)threadIdx.x, m = (i >> 2) / nb, b = (i >> 2) - m * nb;
            if (i >= n) continue;
            const int64_t o = m * ldx + 32 * b + 8 * (i & 3);
            if (v8) {
                ld_bf16<8>(x + o, v[u]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[u][j] = __bfloat162float(x[o + j]);
            }
            if (xu) { // SwiGLU(gate x, up xu), rounded as swiglu_fwd stores it
                float up[8];
                if (v8) {
                    ld_bf16<8>(xu + o, up);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        up[j] = __bfloat162float(xu[o + j]);
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[u][j] = __bfloat162float(__float2bfloat16_rn(dev_silu(v[u][j]) * up[j]));
            }
        }
#pragma unroll
        for (int u = 0; u < QG_ROUND_BATCH; u++) {
            const int i = i0 + u * QG_WARPS * 32 + (int)threadIdx.x, c = i & 3, m = (i >> 2) / nb,
                      b = (i >> 2) - m * nb;
            if (xw && i < n) { // x r w, as rmsnorm_fwd (each product rounded on its own)
                float g[8];
                const bf16 *gp = xw + 32 * b + 8 * c;
                if (v8) {
                    ld_bf16<8>(gp, g);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        g[j] = __bfloat162float(gp[j]);
                }
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[u][j] = __fmul_rn(__fmul_rn(v[u][j], rstd[m]), g[j]);
            }
            float amax = 0.0f, z = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) // z: NaN unless all finite
                amax = fmaxf(amax, fabsf(v[u][j])), z = __fadd_rn(z, __fmul_rn(v[u][j], 0.0f));
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, o));
            }
            const bool finite = z == 0.0f;
            const float d = finite ? __fdiv_rn(amax, 127.0f) : NAN;
            const float id = finite && d > 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
            uint32_t w[2] = {0, 0};
            int sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int q = __float2int_rn(__fmul_rn(v[u][j], id));
                sum += q;
                w[j >> 2] |= (uint32_t)(q & 0xff) << (8 * (j & 3));
            }
#pragma unroll
            for (int o = 1; o < 4; o <<= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (i < n) {
                unsigned char *row = xs + m * xrb;
                *reinterpret_cast<uint2 *>(row + 1024 * (b / 32) + 16 * (b % 32) + 512 * (c >> 1) + 8 * (c & 1)) =
                    make_uint2(w[0], w[1]);
                if (c == 0)
                    reinterpret_cast<float2 *>(row + kp)[b] = make_float2(d, finite ? __fmul_rn(d, (float)sum) : NAN);
            }
        }
    }
}

// The weight (sub)block a lane takes in a step, as integer words to pair
// with x's codes (word j with x's word j: codes 4j..4j+3 of the block) and the
// fp32 terms of its value: isum -> a * isum + c * s (c = 0 but for Q4_0, Q4_1,
// Q4_K, whose offsets pair with x's s). Q6_K's two sub-blocks of 16 have
// scales of their own, so it keeps the products of its halves apart.
struct qg_wblock {
    uint32_t u[8];
    float a, c;
    int sc0, sc1; // Q6_K: the halves' scales
};

template <int T>
static __device__ __forceinline__ void qg_load_block(qg_wblock &wb, const unsigned char *buf, int lane) {
    if constexpr (T == GGML_Q4_0 || T == GGML_Q4_1) {
        const unsigned char *bp = buf + lane * q_block_bytes(T);
        uint32_t q[4];
        qg_words<4>(bp + (T == GGML_Q4_0 ? 2 : 4), q);
#pragma unroll
        for (int j = 0; j < 4; j++)
            wb.u[j] = q[j] & 0x0f0f0f0fu, wb.u[4 + j] = (q[j] >> 4) & 0x0f0f0f0fu; // values j.., 16 + j..
        wb.a = q_f16(bp);
        wb.c = T == GGML_Q4_0 ? __fmul_rn(-8.0f, wb.a) : q_f16(bp + 2);
    } else if constexpr (T == GGML_Q8_0) {
        const unsigned char *bp = buf + lane * q_block_bytes(T);
        qg_words<8>(bp + 2, wb.u);
        wb.a = q_f16(bp), wb.c = 0.0f;
    } else if constexpr (T == GGML_Q4_K) {
        // lane l: sub-block l % 8 of super-block l / 8 (16-byte aligned)
        const unsigned char *bp = buf + (lane >> 3) * q_block_bytes(T);
        const int sub = lane & 7;
        const unsigned char *s = bp + 4;
        unsigned sc, mn;
        q4k_scale_min(s, sub, sc, mn);
        const uint4 *q = reinterpret_cast<const uint4 *>(bp + 16 + 32 * (sub >> 1));
        const uint4 q0 = q[0], q1 = q[1];
        const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const int sh = (sub & 1) * 4;
#pragma unroll
        for (int j = 0; j < 8; j++)
            wb.u[j] = (qw[j] >> sh) & 0x0f0f0f0fu;
        wb.a = __fmul_rn(q_f16(bp), (float)sc);
        wb.c = -__fmul_rn(q_f16(bp + 2), (float)mn);
    } else {
        static_assert(T == GGML_Q6_K, "qg_load_block: no such block format");
        // lane l: 32-value group g = l % 8 of super-block l / 8, half h = g / 4,
        // k = g % 4: nibble k / 2 of ql[64 h + 32 (k & 1) + i], bits 2k of
        // qh[128 + 32 h + i], scales sc[8 h + 2 k] and the next one
        const unsigned char *bp = buf + (lane >> 3) * q_block_bytes(T);
        const int g = lane & 7, h = g >> 2, k = g & 3;
        uint32_t ql[8], qh[8];
        qg_words<8>(bp + 64 * h + 32 * (k & 1), ql);
        qg_words<8>(bp + 128 + 32 * h, qh);
        const int shl = (k >> 1) * 4, shh = 2 * k;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t q = ((ql[j] >> shl) & 0x0f0f0f0fu) | (((qh[j] >> shh) & 0x03030303u) << 4);
            wb.u[j] = __vsub4(q, 0x20202020u); // q - 32, a signed byte each
        }
        wb.sc0 = (int8_t)bp[192 + 8 * h + 2 * k], wb.sc1 = (int8_t)bp[193 + 8 * h + 2 * k];
        wb.a = q_f16(bp + 208), wb.c = 0.0f;
    }
}

// The block's term of one row of x: codes xw, scale and sum ds.
template <int T>
static __device__ __forceinline__ float qg_block_dot(const qg_wblock &wb, const uint32_t (&xw)[8], float2 ds) {
    if constexpr (T == GGML_Q6_K) {
        int p0 = 0, p1 = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
            p0 = __dp4a((int)wb.u[j], (int)xw[j], p0), p1 = __dp4a((int)wb.u[4 + j], (int)xw[4 + j], p1);
        return __fmul_rn(__fmul_rn(wb.a, ds.x), (float)(wb.sc0 * p0 + wb.sc1 * p1));
    } else {
        int isum = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            isum = __dp4a((int)wb.u[j], (int)xw[j], isum);
        const float t = __fmul_rn(__fmul_rn(wb.a, ds.x), (float)isum);
        if constexpr (T == GGML_Q8_0) return t;
        return __fadd_rn(t, __fmul_rn(wb.c, ds.y));
    }
}

// W 16-byte aligned, rows rb bytes apart (a multiple of q_block_align(T)), K
// a multiple of the block size; x rows ldx apart, normed with gain xw first
// when xw is not NULL, or SwiGLU(x, xu) when xu is not NULL (qg_round_x);
// the result into y [M, rows], or added to res [M,
// rows] (y NULL; rounded once); dynamic shared memory M qg_x_row_bytes(K)
// then qg_stage_smem(T). BULK: the bench-only bulk copies (qg_issue_bulk).
template <int M, int T, bool BULK>
__global__ void __launch_bounds__(QG_WARPS * 32)
    k_qgemv(bf16 *__restrict__ y, bf16 *__restrict__ res, const bf16 *__restrict__ x, const bf16 *__restrict__ xu,
            int64_t ldx, const bf16 *__restrict__ xw, float eps, const uint8_t *__restrict__ W, int64_t rows, int K,
            int64_t rb) {
    enum { WIN = qg_win_bytes(T), STEP_B = qg_step_bytes(T) };
    extern __shared__ __align__(16) unsigned char qg_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t xrb = qg_x_row_bytes(K);
    unsigned char *stage = qg_smem + M * xrb + (size_t)warp * QG_STAGES * WIN;
    const int64_t stride = (int64_t)gridDim.x * QG_WARPS, r0 = (int64_t)blockIdx.x * QG_WARPS + warp;
    const int nsteps = (K + QG_STEP_V - 1) / QG_STEP_V, nb = K / 32, kp = nsteps * QG_STEP_V;
    const int row_data = K / q_block_values(T) * q_block_bytes(T);
    const int64_t ntiles = r0 < rows ? (rows - r0 + stride - 1) / stride * nsteps : 0; // (row, step) pairs
    const uint8_t *end = W + (rows - 1) * rb + row_data;

    // The producer (qg_produce) runs QG_STAGES - 1 steps ahead of the
    // consumer's (r, s), both on counters.
    const int64_t stride_b = stride * rb;
    qg_prod_t prod = {W + r0 * rb, 0, 0};
    uint64_t *bars = nullptr; // BULK: the warp's stages' mbarriers
#ifdef HYLO_BENCH_VARIANTS
    uint32_t phases = 0; // BULK: the parity each stage's next wait is for
    if constexpr (BULK) {
        __shared__ uint64_t qg_bars[QG_WARPS * QG_STAGES];
        bars = qg_bars + warp * QG_STAGES;
        if (lane == 0) {
            for (int i = 0; i < QG_STAGES; i++)
                qg_bar_init(bars + i);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncwarp();
    }
#endif
    // The weights are read-only: their first steps are asked for before the
    // kernel before this one has finished (griddep_enter).
#pragma unroll
    for (int t = 0; t < QG_STAGES - 1; t++) {
        if (t < ntiles) qg_produce<T, BULK>(prod, stage, bars, end, row_data, nsteps, stride_b, lane);
        prod.slot++;
        if constexpr (!BULK) cp_async_commit();
    }
    griddep_enter();
    qg_round_x<M>(qg_smem, x, xu, ldx, K, xw, eps);
    __syncthreads();

    float acc[M] = {};
    int64_t r = r0;
    int s = 0, slot = 0;
    const uint8_t *crow = W + r0 * rb; // the consumer's row (for its 16-byte offsets)
    for (int64_t t = 0; t < ntiles; t++) {
        if constexpr (BULK) {
#ifdef HYLO_BENCH_VARIANTS
            qg_bar_wait(bars + slot, (phases >> slot) & 1u); // step t's bytes have landed
            phases ^= 1u << slot;
#endif
        } else {
            cp_async_wait<QG_STAGES - 2>(); // this lane's copies of step t have landed
        }
        __syncwarp(); // every lane's, and step t - 1's buffer is free
        if (t + QG_STAGES - 1 < ntiles) qg_produce<T, BULK>(prod, stage, bars, end, row_data, nsteps, stride_b, lane);
        if (++prod.slot == QG_STAGES) prod.slot = 0;
        if constexpr (!BULK) cp_async_commit();
        const int b = s * 32 + lane; // the lane's block of 32 in the row
        if (b < nb) {
            const unsigned char *buf = stage + slot * WIN + ((uintptr_t)(crow + s * STEP_B) & 15);
            qg_wblock wb;
            qg_load_block<T>(wb, buf, lane);
#pragma unroll
            for (int m = 0; m < M; m++) {
                const unsigned char *xr = qg_smem + m * xrb;
                const uint4 lo = *reinterpret_cast<const uint4 *>(xr + 1024 * s + 16 * lane);
                const uint4 hi = *reinterpret_cast<const uint4 *>(xr + 1024 * s + 512 + 16 * lane);
                const uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                acc[m] += qg_block_dot<T>(wb, xw, reinterpret_cast<const float2 *>(xr + kp)[b]);
            }
        }
        if (s == nsteps - 1) { // the row is done
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float v = warp_sum(acc[m]);
                acc[m] = 0.0f;
                if (lane == 0 && res)
                    res[(int64_t)m * rows + r] = __float2bfloat16_rn(__bfloat162float(res[(int64_t)m * rows + r]) + v);
                else if (lane == 0)
                    y[(int64_t)m * rows + r] = __float2bfloat16_rn(v);
            }
        }
        if (++s == nsteps) s = 0, r += stride, crow += stride_b;
        if (++slot == QG_STAGES) slot = 0;
    }
    if constexpr (!BULK) cp_async_wait<0>();
}

typedef void (*qgemv_fn)(bf16 *, bf16 *, const bf16 *, const bf16 *, int64_t, const bf16 *, float, const uint8_t *,
                         int64_t, int, int64_t);

template <int T, bool BULK> static qgemv_fn qgemv_kernel_t(int M) {
    switch (M) {
    case 1: return k_qgemv<1, T, BULK>;
    case 2: return k_qgemv<2, T, BULK>;
    case 3: return k_qgemv<3, T, BULK>;
    case 4: return k_qgemv<4, T, BULK>;
    case 5: return k_qgemv<5, T, BULK>;
    case 6: return k_qgemv<6, T, BULK>;
    case 7: return k_qgemv<7, T, BULK>;
    default: return k_qgemv<8, T, BULK>;
    }
}
template <bool BULK> static qgemv_fn qgemv_kernel_b(uint32_t type, int M) {
    switch (type) {
    case GGML_Q4_0: return qgemv_kernel_t<GGML_Q4_0, BULK>(M);
    case GGML_Q4_1: return qgemv_kernel_t<GGML_Q4_1, BULK>(M);
    case GGML_Q8_0: return qgemv_kernel_t<GGML_Q8_0, BULK>(M);
    case GGML_Q4_K: return qgemv_kernel_t<GGML_Q4_K, BULK>(M);
    case GGML_Q6_K: return qgemv_kernel_t<GGML_Q6_K, BULK>(M);
    default: return NULL;
    }
}
static qgemv_fn qgemv_kernel(uint32_t type, int M) {
#ifdef HYLO_BENCH_VARIANTS
    if (cu_env_int("HYLO_QGEMV_BULK", 0) == 1) return qgemv_kernel_b<true>(type, M); // bench-only (qg_issue_bulk)
#endif
    return qgemv_kernel_b<false>(type, M);
}
static int qgemv_stage_smem(uint32_t type) {
    switch (type) {
    case GGML_Q4_0: return qg_stage_smem(GGML_Q4_0);
    case GGML_Q4_1: return qg_stage_smem(GGML_Q4_1);
    case GGML_Q8_0: return qg_stage_smem(GGML_Q8_0);
    case GGML_Q4_K: return qg_stage_smem(GGML_Q4_K);
    default: return qg_stage_smem(GGML_Q6_K);
    }
}

// The product on k_qgemv (x rows ldx apart, normed with gain xw first when
// not NULL, or SwiGLU(x, xu) when xu is not NULL; into y, or added to res
// when not NULL), in launches of as many
// rows of x as shared memory holds (all N but for long rows: 8 rows of K =
// 14336 take 140 KiB). false when not even one row fits, for the caller's
// other path.
static bool qgemv(be_t *be, bf16 *y, bf16 *res, const bf16 *x, const bf16 *xu, int64_t ldx, const bf16 *xw, float eps,
                  const be_qmat_t *W, int64_t N) {
    const int64_t K = W->cols, rows = W->rows;
    // the dynamic shared memory, beside the norm's static rstd[M] and part[QG_WARPS] (qg_round_x)
    // (and the bench-only BULK's mbarriers)
    const size_t optin =
        cuda_impl(be)->smem_optin - (BE_FEW_ROWS + QG_WARPS) * sizeof(float) - QG_WARPS * QG_STAGES * sizeof(uint64_t);
    const size_t stage = (size_t)qgemv_stage_smem(W->type);
    int mx = (int)N;
    while (mx > 0 && (size_t)mx * (size_t)qg_x_row_bytes(K) + stage > optin)
        mx--;
    if (mx < 1) return false;
    for (int64_t m0 = 0; m0 < N; m0 += mx) {
        const int M = (int)(N - m0 < mx ? N - m0 : mx);
        const qgemv_fn kern = qgemv_kernel(W->type, M);
        const size_t smem = (size_t)M * (size_t)qg_x_row_bytes(K) + stage;
        if (cuda_smem_limit(be, (const void *)kern, smem, "qmatmul (k_qgemv)") < 0) return true; // error recorded
        const int per_sm = cuda_blocks_per_sm_cached(be, (const void *)kern, "qmatmul (k_qgemv)", QG_WARPS * 32, smem);
        int64_t blocks = (rows + QG_WARPS - 1) / QG_WARPS;
        const int64_t cap = (int64_t)cuda_impl(be)->sm_count * (per_sm > 0 ? per_sm : 1);
        if (blocks > cap) blocks = cap;
        cu_launch_pdl(kern, dim3((unsigned)blocks), dim3(QG_WARPS * 32), smem, cuda_stream(be), y ? y + m0 * rows : y,
                      res ? res + m0 * rows : res, x + m0 * ldx, xu ? xu + m0 * ldx : xu, ldx, xw, eps,
                      (const uint8_t *)W->data, rows, (int)K, (int64_t)W->row_bytes);
        cuda_check_launch(be, "qmatmul (k_qgemv)");
    }
    return true;
}

// ---- many rows: dequantise, then the GEMM -------------------------------------------

// out [n, cols] bf16 = rows of W (rb bytes apart) dequantised, rounded once.
template <int T>
__global__ void k_qdequant(bf16 *__restrict__ out, const uint8_t *__restrict__ W, int64_t rb, int64_t n, int cols) {
    const int64_t per = cols / 8;
    GRID_STRIDE(i, n * per) {
        const int64_t r = i / per;
        const int p = (int)(i - r * per) * 8;
        float w[8];
        q_dq8_at<T>(W + r * rb, p, w);
        st_bf16<8>(out + r * cols + p, w);
    }
}

// k_qdequant of the format of type (a supported one, q_usable).
static void qdequant_launch(be_t *be, uint32_t type, bf16 *out, const uint8_t *W, int64_t rb, int64_t n, int cols) {
    const unsigned grid = cu_grid(be, n * (cols / 8), 256);
    cudaStream_t st = cuda_stream(be);
    switch (type) {
    case GGML_Q4_0: k_qdequant<GGML_Q4_0><<<grid, 256, 0, st>>>(out, W, rb, n, cols); break;
    case GGML_Q4_1: k_qdequant<GGML_Q4_1><<<grid, 256, 0, st>>>(out, W, rb, n, cols); break;
    case GGML_Q8_0: k_qdequant<GGML_Q8_0><<<grid, 256, 0, st>>>(out, W, rb, n, cols); break;
    case GGML_Q4_K: k_qdequant<GGML_Q4_K><<<grid, 256, 0, st>>>(out, W, rb, n, cols); break;
    default: k_qdequant<GGML_Q6_K><<<grid, 256, 0, st>>>(out, W, rb, n, cols); break;
    }
    cuda_check_launch(be, "qmatmul (k_qdequant)");
}

// Slabs of rows dequantised into the scratch arena, each multiplied by
// be->gemm into its columns of y: as many rows as the free arena holds (a
// multiple of 64 when less than all), so a 3B model's largest matrix takes
// one or two slabs of a few hundred MB arena.
static void qmatmul_dequant(be_t *be, bf16 *y, const bf16 *x, const be_qmat_t *W, int64_t N) {
    const int64_t rows = W->rows, cols = W->cols;
    arena_t *a = &be->scratch;
    const size_t mark = arena_mark(a), row_b = (size_t)cols * sizeof(bf16);
    const size_t off = cu_round256(a->used), avail = a->base && a->cap > off ? a->cap - off : 0;
    int64_t slab = (int64_t)(avail / row_b) < rows ? (int64_t)(avail / row_b) : rows;
    if (slab < rows && slab >= 64) slab &= ~(int64_t)63;
    bf16 *w = slab > 0 ? (bf16 *)cu_scratch_try(be, (size_t)slab * row_b) : NULL;
    if (!w) {
        cu_op_error(be, "cuda qmatmul: the scratch arena has %zu bytes free, one dequantised row of %lld takes %zu",
                    avail, (long long)cols, row_b);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
        const int64_t n = rows - r0 < slab ? rows - r0 : slab;
        qdequant_launch(be, W->type, w, (const uint8_t *)W->data + r0 * (int64_t)W->row_bytes, (int64_t)W->row_bytes, n,
                        (int)cols);
        be->gemm(be, 0, 1, N, n, cols, 1.0f, x, cols, w, cols, 0.0f, y + r0, rows);
    }
    arena_reset(a, mark); // the next user of the slab is queued after the GEMMs
}

// ---- the ops --------------------------------------------------------------------------

// Whether the kernels here take W (else the error is recorded, naming op):
// a supported type, whole blocks, rows at least a row of blocks apart and
// aligned as q_dq8 reads them, the data 16-byte aligned (be->alloc's are).
static bool q_usable(be_t *be, const char *op, const be_qmat_t *W) {
    const int qk = q_block_values((int)W->type), qb = q_block_bytes((int)W->type);
    if (!qk || !qb ||
        !(W->type == GGML_Q4_0 || W->type == GGML_Q4_1 || W->type == GGML_Q8_0 || W->type == GGML_Q4_K ||
          W->type == GGML_Q6_K || W->type == GGML_BF16)) {
        cu_op_error(be, "cuda %s: weights of type %s are not supported (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, BF16)", op,
                    ggml_type_name(W->type));
        return false;
    }
    const int al = W->type == GGML_BF16 ? 2 : q_block_align((int)W->type);
    if (W->cols <= 0 || W->cols % qk || W->cols > INT32_MAX / 2 || W->row_bytes < (size_t)(W->cols / qk) * (size_t)qb ||
        W->row_bytes % (size_t)al || ((uintptr_t)W->data & 15)) {
        cu_op_error(be,
                    "cuda %s: %s weights of %lld columns, rows %zu bytes apart at %p: need whole blocks of %d, rows "
                    "a multiple of %d bytes apart, 16-byte aligned data",
                    op, ggml_type_name(W->type), (long long)W->cols, W->row_bytes, W->data, qk, al);
        return false;
    }
    return true;
}

static void cu_qmatmul(be_t *be, void *y, const void *x, const be_qmat_t *W, int64_t N) {
    if (N <= 0 || W->rows <= 0 || !q_usable(be, "qmatmul", W)) return;
    if (W->type == GGML_BF16) {
        be->gemm(be, 0, 1, N, W->rows, W->cols, 1.0f, x, W->cols, W->data, (int64_t)(W->row_bytes / 2), 0.0f, y,
                 W->rows);
        return;
    }
    if (N <= BE_FEW_ROWS && qgemv(be, (bf16 *)y, NULL, (const bf16 *)x, NULL, W->cols, NULL, 0.0f, W, N)) return;
    qmatmul_dequant(be, (bf16 *)y, (const bf16 *)x, W, N);
}

// qproj: k_qgemv for a few rows of a block format; bf16 weights on the fused
// products of cuda_core.cu (at most one of the norm and the add there, no
// SwiGLU); otherwise the ops one after another, the product's input (normed
// rows, or SwiGLU's) and the product in the scratch arena.
static void cu_qproj(be_t *be, void *y, void *res, const void *x, const void *xu, int64_t ldx, const void *xw,
                     float eps, const be_qmat_t *W, int64_t N) {
    if (N <= 0 || W->rows <= 0 || !q_usable(be, "qproj", W)) return;
    const int64_t K = W->cols, R = W->rows;
    if (xu && xw) {
        cu_op_error(be, "cuda qproj: a norm and SwiGLU both on the input");
        return;
    }
    if (W->type != GGML_BF16 && N <= BE_FEW_ROWS &&
        qgemv(be, (bf16 *)y, (bf16 *)res, (const bf16 *)x, (const bf16 *)xu, ldx, (const bf16 *)xw, eps, W, N))
        return;
    if (W->type == GGML_BF16 && W->row_bytes == (size_t)K * 2 && !(xw && res) && !xu && R <= INT32_MAX) {
        if (res)
            be->proj_add_rmsnorm(be, NULL, res, x, ldx, W->data, NULL, N, K, (int)R, eps);
        else if (xw)
            be->proj_rmsnorm(be, y, x, ldx, xw, eps, W->data, N, K, R);
        else
            be->gemm(be, 0, 1, N, R, K, 1.0f, x, ldx, W->data, K, 0.0f, y, R);
        return;
    }
    arena_t *a = &be->scratch;
    const size_t mark = arena_mark(a);
    const bf16 *in = (const bf16 *)x;
    if (xw || xu || ldx != K) {
        bf16 *xn = (bf16 *)cu_scratch_try(be, (size_t)N * K * sizeof(bf16));
        if (!xn) {
            cu_op_error(be, "cuda qproj: no scratch room for %lld input rows of %lld", (long long)N, (long long)K);
            return;
        }
        if (xu) {
            be->swiglu_fwd(be, xn, x, xu, ldx, N, K);
        } else {
            be->copy2d(be, xn, K, x, ldx, N, K, 0);
            if (xw) be->rmsnorm_fwd(be, xn, NULL, xn, xw, N, (int)K, eps);
        }
        in = xn;
    }
    bf16 *out = (bf16 *)y;
    if (res && !(out = (bf16 *)cu_scratch_try(be, (size_t)N * R * sizeof(bf16)))) {
        cu_op_error(be, "cuda qproj: no scratch room for a product of %lld x %lld", (long long)N, (long long)R);
        arena_reset(a, mark);
        return;
    }
    cu_qmatmul(be, out, in, W, N);
    if (res) be->add(be, res, out, N * R);
    arena_reset(a, mark); // the next user of the scratch is queued after these ops
}

// out [N, cols] = rows ids[n] of W dequantised: a block a row, 8 values a thread at a time.
template <int T>
__global__ void k_qembed(bf16 *__restrict__ out, const uint8_t *__restrict__ W, int64_t rb, const int32_t *ids,
                         int cols, int vec) {
    const int64_t n = blockIdx.x;
    const uint8_t *row = W + (int64_t)ids[n] * rb;
    for (int p = threadIdx.x * 8; p < cols; p += blockDim.x * 8) {
        float w[8];
        q_dq8_at<T>(row, p, w);
        if (vec)
            st_bf16<8>(out + n * cols + p, w);
        else
#pragma unroll
            for (int j = 0; j < 8; j++)
                out[n * cols + p + j] = __float2bfloat16_rn(w[j]);
    }
}

static void cu_qembed_fwd(be_t *be, void *out, const be_qmat_t *W, const int32_t *ids, int64_t N) {
    if (N <= 0 || !q_usable(be, "qembed_fwd", W)) return;
    if (W->type == GGML_BF16) {
        if (W->row_bytes != (size_t)W->cols * 2) {
            cu_op_error(be, "cuda qembed_fwd: BF16 rows %zu bytes apart for %lld columns", W->row_bytes,
                        (long long)W->cols);
            return;
        }
        be->embed_fwd(be, out, W->data, ids, N, (int)W->cols);
        return;
    }
    if (N > INT32_MAX) {
        cu_op_error(be, "cuda qembed_fwd: %lld rows in one call", (long long)N);
        return;
    }
    const int vec = !((uintptr_t)out & 15); // cols is a multiple of 32
    bf16 *o = (bf16 *)out;
    const uint8_t *w = (const uint8_t *)W->data;
    const int64_t rb = (int64_t)W->row_bytes;
    const int cols = (int)W->cols;
    cudaStream_t st = cuda_stream(be);
    switch (W->type) {
    case GGML_Q4_0: k_qembed<GGML_Q4_0><<<(unsigned)N, 128, 0, st>>>(o, w, rb, ids, cols, vec); break;
    case GGML_Q4_1: k_qembed<GGML_Q4_1><<<(unsigned)N, 128, 0, st>>>(o, w, rb, ids, cols, vec); break;
    case GGML_Q8_0: k_qembed<GGML_Q8_0><<<(unsigned)N, 128, 0, st>>>(o, w, rb, ids, cols, vec); break;
    case GGML_Q4_K: k_qembed<GGML_Q4_K><<<(unsigned)N, 128, 0, st>>>(o, w, rb, ids, cols, vec); break;
    default: k_qembed<GGML_Q6_K><<<(unsigned)N, 128, 0, st>>>(o, w, rb, ids, cols, vec); break;
    }
    cuda_check_launch(be, "qembed_fwd (k_qembed)");
}

extern "C" void cuda_register_quant(be_t *be) {
    be->qmatmul = cu_qmatmul;
    be->qproj = cu_qproj;
    be->qembed_fwd = cu_qembed_fwd;
}
