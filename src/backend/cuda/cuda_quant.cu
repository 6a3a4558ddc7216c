// Products and embedding lookups on weights kept in their GGUF block formats
// (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) or bf16, the CUDA side of backend.h's
// "quantised weights" ops. Layouts: docs/FORMATS.md, io/quant.c.
//
// Numerics: every weight is dequantised to fp32 exactly as ggml_dequant does
// (fp16 scales, the same products and sums, each rounded on its own: the
// __fmul_rn / __fadd_rn below keep nvcc from fusing them into an fma the CPU
// does not do), so a dequantised value is the CPU's bit for bit.
//  - few rows (N <= BE_FEW_ROWS, decode): k_qgemv, x as it is (bf16) against
//    those fp32 weights, fp32 sums, one bf16 rounding at the end;
//  - more rows (prefill): the matrix dequantised to bf16 into the scratch
//    arena (in slabs of rows) and multiplied by be->gemm (cuBLASLt): the
//    weights then carry one bf16 rounding, as every act weight on CUDA does.
// bf16 weights go to be->gemm / be->embed_fwd as they are.
#include <pthread.h>

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
        if (sub < 4) {
            sc = s[sub] & 63u, mn = s[sub + 4] & 63u;
        } else {
            sc = (s[sub + 4] & 0xfu) | ((unsigned)(s[sub - 4] >> 6) << 4);
            mn = (unsigned)(s[sub + 4] >> 4) | ((unsigned)(s[sub] >> 6) << 4);
        }
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
// y [M, rows] = x [M, K] W^T for M <= BE_FEW_ROWS: the weight's whole cost is
// its bytes, read once. A block of QG_WARPS warps first copies x into shared
// memory (once per block: the grid is at most what the SMs hold at once, each
// block taking rows in turn), then each warp takes R consecutive weight rows
// at a time (R rows share each load of x from shared memory, which at M > 2
// would otherwise be what limits) and streams them in steps of QSTEP_V values:
// the step's bytes of each row go into the warp's stage buffers by 16-byte
// cp.async from the 16-byte boundary below them (the 18-, 20-, 34- and
// 210-byte blocks do not keep 16-byte alignment), QG_STAGES steps in flight,
// the pipeline running on from one group of rows to the next. In a step lane l
// takes values 8 l + 256 c (c < QSTEP_V / 256): x's 16-byte pieces of a row
// read by the 32 lanes side by side, no bank conflicts. fp32 sums per lane,
// then a warp sum; deterministic.
enum { QG_WARPS = 8, QG_STAGES = 3 };

static __host__ __device__ constexpr int qg_rows_per_warp(int M) { return M <= 4 ? 2 : 4; }
// Values of a step: 1024 (4 pieces of 8 a lane) where that is at most 640 bytes, else 512.
static __host__ __device__ constexpr int qg_step_values(int T) { return T == GGML_Q8_0 || T == GGML_Q6_K ? 512 : 1024; }
static __host__ __device__ constexpr int qg_step_bytes(int T) {
    return qg_step_values(T) / q_block_values(T) * q_block_bytes(T);
}
// A stage buffer of one row: the step's bytes from the 16-byte boundary below them.
static __host__ __device__ constexpr int qg_win_bytes(int T) { return (qg_step_bytes(T) + 15) / 16 * 16 + 16; }
static __host__ __device__ constexpr int qg_stage_smem(int T, int M) {
    return QG_WARPS * QG_STAGES * qg_rows_per_warp(M) * qg_win_bytes(T);
}

// A 16-byte cp.async of which the first n bytes (1..16) are read, the rest zeroed.
static __device__ __forceinline__ void qg_cp16(uint32_t dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

// Queues the bytes of step s of rows g R .. g R + R - 1 (clamped to the last
// row) into the warp's stage buffer buf, row i at buf + i WIN.
template <int T, int R>
static __device__ __forceinline__ void qg_issue(unsigned char *buf, const uint8_t *W, const uint8_t *end, int64_t rows,
                                                int64_t rb, int64_t row_data, int64_t g, int s, int lane) {
    const int64_t b0 = (int64_t)s * qg_step_bytes(T);
    const int bytes = (int)(row_data - b0 < qg_step_bytes(T) ? row_data - b0 : qg_step_bytes(T));
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int64_t r = g * R + i < rows ? g * R + i : rows - 1;
        const uint8_t *src = W + r * rb + b0;
        const int off = (int)((uintptr_t)src & 15);
        const uint8_t *al = src - off;
        const int n16 = (off + bytes + 15) >> 4;
        for (int c = lane; c < n16; c += 32) {
            const uint8_t *q = al + 16 * c;
            qg_cp16(smem_u32(buf + i * qg_win_bytes(T) + 16 * c), q, end - q < 16 ? (int)(end - q) : 16);
        }
    }
}

// W 16-byte aligned, rows rb bytes apart (a multiple of q_block_align(T)), K
// a multiple of the block size; x rows K apart; dynamic shared memory M K
// bf16 then qg_stage_smem(T, M).
template <int M, int T>
__global__ void __launch_bounds__(QG_WARPS * 32)
    k_qgemv(bf16 *__restrict__ y, const bf16 *__restrict__ x, const uint8_t *__restrict__ W, int64_t rows, int K,
            int64_t rb) {
    enum { R = qg_rows_per_warp(M), STEP_V = qg_step_values(T), WIN = qg_win_bytes(T), PIECES = STEP_V / 256 };
    extern __shared__ __align__(16) unsigned char qg_smem[];
    bf16 *xs = reinterpret_cast<bf16 *>(qg_smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned char *stage = qg_smem + (size_t)M * K * sizeof(bf16) + (size_t)warp * QG_STAGES * R * WIN;
    const int64_t groups = (rows + R - 1) / R, stride = (int64_t)gridDim.x * QG_WARPS;
    const int64_t g0 = (int64_t)blockIdx.x * QG_WARPS + warp;
    const int nsteps = (K + STEP_V - 1) / STEP_V;
    const int64_t row_data = (int64_t)(K / q_block_values(T)) * q_block_bytes(T);
    const int64_t ntiles = g0 < groups ? (groups - g0 + stride - 1) / stride * nsteps : 0; // (group, step) pairs
    const uint8_t *end = W + (rows - 1) * rb + row_data;

    // The weights are read-only: their first steps are asked for before the
    // kernel before this one has finished (griddep_enter).
#pragma unroll
    for (int t = 0; t < QG_STAGES - 1; t++) {
        if (t < ntiles)
            qg_issue<T, R>(stage + t * R * WIN, W, end, rows, rb, row_data, g0 + t / nsteps * stride, t % nsteps, lane);
        cp_async_commit();
    }
    griddep_enter();
    const int64_t nx = (int64_t)M * K;
    if (!((uintptr_t)x & 15))
        for (int64_t i = threadIdx.x; i < nx / 8; i += QG_WARPS * 32)
            reinterpret_cast<uint4 *>(xs)[i] = reinterpret_cast<const uint4 *>(x)[i];
    else
        for (int64_t i = threadIdx.x; i < nx; i += QG_WARPS * 32)
            xs[i] = x[i];
    __syncthreads();

    float acc[R][M] = {};
    for (int64_t t = 0; t < ntiles; t++) {
        cp_async_wait<QG_STAGES - 2>(); // this lane's copies of step t have landed
        __syncwarp();                   // every lane's, and step t - 1's buffer is free
        const int64_t tn = t + QG_STAGES - 1;
        if (tn < ntiles)
            qg_issue<T, R>(stage + (tn % QG_STAGES) * R * WIN, W, end, rows, rb, row_data, g0 + tn / nsteps * stride,
                           (int)(tn % nsteps), lane);
        cp_async_commit();
        const int64_t g = g0 + t / nsteps * stride;
        const int s = (int)(t % nsteps), k0 = s * STEP_V;
        const unsigned char *buf = stage + (t % QG_STAGES) * R * WIN;
#pragma unroll
        for (int c = 0; c < PIECES; c++) {
            const int p = lane * 8 + c * 256;
            if (k0 + p >= K) break; // the last step of a row not a multiple of STEP_V
            float xv[M][8];
#pragma unroll
            for (int m = 0; m < M; m++)
                ld_bf16<8>(xs + (size_t)m * K + k0 + p, xv[m]);
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int64_t r = g * R + i < rows ? g * R + i : rows - 1;
                const int off = (int)((r * rb + (int64_t)s * qg_step_bytes(T)) & 15);
                float w[8];
                q_dq8_at<T>(buf + i * WIN + off, p, w);
#pragma unroll
                for (int m = 0; m < M; m++)
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        acc[i][m] = fmaf(xv[m][j], w[j], acc[i][m]);
            }
        }
        if (s == nsteps - 1) { // the group's rows are done
#pragma unroll
            for (int i = 0; i < R; i++)
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const float v = warp_sum(acc[i][m]);
                    acc[i][m] = 0.0f;
                    if (lane == 0 && g * R + i < rows) y[(int64_t)m * rows + g * R + i] = __float2bfloat16_rn(v);
                }
        }
    }
    cp_async_wait<0>();
}

typedef void (*qgemv_fn)(bf16 *, const bf16 *, const uint8_t *, int64_t, int, int64_t);

template <int T> static qgemv_fn qgemv_kernel_t(int M) {
    switch (M) {
    case 1: return k_qgemv<1, T>;
    case 2: return k_qgemv<2, T>;
    case 3: return k_qgemv<3, T>;
    case 4: return k_qgemv<4, T>;
    case 5: return k_qgemv<5, T>;
    case 6: return k_qgemv<6, T>;
    case 7: return k_qgemv<7, T>;
    default: return k_qgemv<8, T>;
    }
}
static qgemv_fn qgemv_kernel(uint32_t type, int M) {
    switch (type) {
    case GGML_Q4_0: return qgemv_kernel_t<GGML_Q4_0>(M);
    case GGML_Q4_1: return qgemv_kernel_t<GGML_Q4_1>(M);
    case GGML_Q8_0: return qgemv_kernel_t<GGML_Q8_0>(M);
    case GGML_Q4_K: return qgemv_kernel_t<GGML_Q4_K>(M);
    case GGML_Q6_K: return qgemv_kernel_t<GGML_Q6_K>(M);
    default: return NULL;
    }
}
static int qgemv_stage_smem(uint32_t type, int M) {
    switch (type) {
    case GGML_Q4_0: return qg_stage_smem(GGML_Q4_0, M);
    case GGML_Q4_1: return qg_stage_smem(GGML_Q4_1, M);
    case GGML_Q8_0: return qg_stage_smem(GGML_Q8_0, M);
    case GGML_Q4_K: return qg_stage_smem(GGML_Q4_K, M);
    default: return qg_stage_smem(GGML_Q6_K, M);
    }
}

// Blocks of kern (smem bytes) an SM holds at once, at least 1: the
// occupancy query, remembered per (device, kernel, bytes), since a decode
// step's products ask on every launch.
static int qgemv_blocks_per_sm(be_t *be, qgemv_fn kern, size_t smem) {
    static struct {
        int device;
        qgemv_fn kern;
        size_t smem;
        int n;
    } cache[64];
    static int used;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    const int dev = cuda_impl(be)->device;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < used; i++)
        if (cache[i].device == dev && cache[i].kern == kern && cache[i].smem == smem) {
            const int n = cache[i].n;
            pthread_mutex_unlock(&lock);
            return n;
        }
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, QG_WARPS * 32, smem) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        n = 1;
    }
    if (used < 64)
        cache[used].device = dev, cache[used].kern = kern, cache[used].smem = smem, cache[used].n = n, used++;
    pthread_mutex_unlock(&lock);
    return n;
}

// The product on k_qgemv, in launches of as many rows of x as shared memory
// holds (all N but for long rows: 8 rows of K = 14336 take 224 KiB). false
// when not even one row fits, for the caller's other path.
static bool qgemv(be_t *be, bf16 *y, const bf16 *x, const be_qmat_t *W, int64_t N) {
    const int64_t K = W->cols, rows = W->rows;
    const size_t optin = cuda_impl(be)->smem_optin;
    int mx = (int)N;
    while (mx > 0 && (size_t)mx * K * sizeof(bf16) + (size_t)qgemv_stage_smem(W->type, mx) > optin)
        mx--;
    if (mx < 1) return false;
    for (int64_t m0 = 0; m0 < N; m0 += mx) {
        const int M = (int)(N - m0 < mx ? N - m0 : mx), R = qg_rows_per_warp(M);
        const int64_t groups = (rows + R - 1) / R;
        const qgemv_fn kern = qgemv_kernel(W->type, M);
        const size_t smem = (size_t)M * K * sizeof(bf16) + (size_t)qgemv_stage_smem(W->type, M);
        if (cuda_smem_limit(be, (const void *)kern, smem, "qmatmul (k_qgemv)") < 0) return true; // error recorded
        const int per_sm = qgemv_blocks_per_sm(be, kern, smem);
        int64_t blocks = (groups + QG_WARPS - 1) / QG_WARPS, cap = (int64_t)cuda_impl(be)->sm_count * per_sm;
        if (blocks > cap) blocks = cap;
        cu_launch_pdl(kern, dim3((unsigned)blocks), dim3(QG_WARPS * 32), smem, cuda_stream(be), y + m0 * rows,
                      x + m0 * K, (const uint8_t *)W->data, rows, (int)K, (int64_t)W->row_bytes);
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
    if (N <= BE_FEW_ROWS && qgemv(be, (bf16 *)y, (const bf16 *)x, W, N)) return;
    qmatmul_dequant(be, (bf16 *)y, (const bf16 *)x, W, N);
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
    be->qembed_fwd = cu_qembed_fwd;
}
