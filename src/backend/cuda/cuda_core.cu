// Elementwise ops, strided copies, embedding, and the matrix products through
// cuBLASLt (bf16 operands, fp32 accumulation, bf16 or fp32 C).
#include <cub/device/device_radix_sort.cuh> // the embedding backward's (id, position) sort
#include <pthread.h>
#include <string.h>

#include "backend/cuda/cuda_vec.cuh"
#include "base/log.h"

// ---- elementwise ---------------------------------------------------------------

// Raw storage of V bf16 values, for copies that must not touch the bits.
template <int V> struct raw_of;
template <> struct raw_of<8> { typedef uint4 t; };
template <> struct raw_of<2> { typedef unsigned int t; };
template <> struct raw_of<1> { typedef unsigned short t; };

// y += x over nv vectors of V elements (fp32 add, one rounding: the CPU sum rounded).
template <int V> __global__ void k_add(bf16 *y, const bf16 *x, int64_t nv) {
    GRID_STRIDE(i, nv) {
        float a[V], b[V];
        ld_bf16<V>(y + i * V, a);
        ld_bf16<V>(x + i * V, b);
#pragma unroll
        for (int k = 0; k < V; k++)
            a[k] += b[k];
        st_bf16<V>(y + i * V, a);
    }
}

// y = a x; element i is read and written by the same thread, so y may alias x.
template <int V> __global__ void k_scale(bf16 *y, const bf16 *x, float s, int64_t nv) {
    GRID_STRIDE(i, nv) {
        float a[V];
        ld_bf16<V>(x + i * V, a);
#pragma unroll
        for (int k = 0; k < V; k++)
            a[k] *= s;
        st_bf16<V>(y + i * V, a);
    }
}

static void cu_add(be_t *be, void *y, const void *x, int64_t n) {
    if (n <= 0) return;
    int V = cu_vec_width((uintptr_t)y | (uintptr_t)x, (uint64_t)n);
    int64_t nv = n / V;
    LAUNCH_V(V, k_add, cu_grid(be, nv, 256), 256, cuda_stream(be), (bf16 *)y, (const bf16 *)x, nv);
    cuda_check_launch(be, "add");
}

static void cu_scale(be_t *be, void *y, const void *x, float a, int64_t n) {
    if (n <= 0) return;
    int V = cu_vec_width((uintptr_t)y | (uintptr_t)x, (uint64_t)n);
    int64_t nv = n / V;
    LAUNCH_V(V, k_scale, cu_grid(be, nv, 256), 256, cuda_stream(be), (bf16 *)y, (const bf16 *)x, a, nv);
    cuda_check_launch(be, "scale");
}

// dst[r*ldd + c] (=|+=) src[r*lds + c] over rows x (cv vectors of V). A plain
// copy moves raw bits; accumulation adds in fp32 and rounds once.
template <int V>
__global__ void k_copy2d(bf16 *dst, int64_t ldd, const bf16 *src, int64_t lds, int64_t rows, int64_t cv, int acc) {
    typedef typename raw_of<V>::t raw_t;
    GRID_STRIDE(i, rows * cv) {
        int64_t r = i / cv, c = (i - r * cv) * V;
        bf16 *d = dst + r * ldd + c;
        const bf16 *s = src + r * lds + c;
        if (acc) {
            float a[V], b[V];
            ld_bf16<V>(d, a);
            ld_bf16<V>(s, b);
#pragma unroll
            for (int k = 0; k < V; k++)
                a[k] += b[k];
            st_bf16<V>(d, a);
        } else {
            *reinterpret_cast<raw_t *>(d) = *reinterpret_cast<const raw_t *>(s);
        }
    }
}

// Source and destination regions must not overlap (every caller splits or
// concatenates distinct buffers).
static void cu_copy2d(be_t *be, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows, int64_t cols,
                      int accumulate) {
    if (rows <= 0 || cols <= 0) return;
    uint64_t lens = (uint64_t)cols | (rows > 1 ? (uint64_t)ldd | (uint64_t)lds : 0);
    int V = cu_vec_width((uintptr_t)dst | (uintptr_t)src, lens);
    int64_t cv = cols / V;
    LAUNCH_V(V, k_copy2d, cu_grid(be, rows * cv, 256), 256, cuda_stream(be), (bf16 *)dst, ldd, (const bf16 *)src, lds,
             rows, cv, accumulate);
    cuda_check_launch(be, "copy2d");
}

// Pages of copy_pages by value: page[k] holds the sequence's rows
// [(blk0 + k) BE_PAGE_ROWS, (blk0 + k + 1) BE_PAGE_ROWS).
enum { CU_PAGES_MAX = 512 };
typedef struct {
    int32_t page[CU_PAGES_MAX];
} cu_pages_t;

template <int V>
__global__ void k_copy_pages(bf16 *x, int64_t ldx, bf16 *pool, int64_t ld, int64_t u0, int64_t blk0, int64_t rows,
                             int64_t cv, int to_pool, const __grid_constant__ cu_pages_t t) {
    typedef typename raw_of<V>::t raw_t;
    GRID_STRIDE(i, rows * cv) {
        const int64_t r = i / cv, c = (i - r * cv) * V, u = u0 + r;
        bf16 *p = pool + ((int64_t)t.page[u / BE_PAGE_ROWS - blk0] * BE_PAGE_ROWS + u % BE_PAGE_ROWS) * ld + c;
        bf16 *xr = x + r * ldx + c;
        if (to_pool)
            *reinterpret_cast<raw_t *>(p) = *reinterpret_cast<const raw_t *>(xr);
        else
            *reinterpret_cast<raw_t *>(xr) = *reinterpret_cast<const raw_t *>(p);
    }
}

static void cu_copy_pages(be_t *be, void *x, int64_t ldx, void *pool, int64_t ld, const int32_t *pages, int64_t u0,
                          int64_t rows, int64_t cols, int to_pool) {
    if (rows <= 0 || cols <= 0) return;
    const int V = cu_vec_width((uintptr_t)x | (uintptr_t)pool, (uint64_t)cols | (uint64_t)ldx | (uint64_t)ld);
    const int64_t cv = cols / V;
    cu_pages_t t;
    for (int64_t i = 0; i < rows;) { // rows of up to CU_PAGES_MAX pages a launch
        const int64_t u = u0 + i, blk0 = u / BE_PAGE_ROWS, end = (blk0 + CU_PAGES_MAX) * BE_PAGE_ROWS;
        const int64_t n = u0 + rows < end ? rows - i : end - u;
        for (int64_t k = 0; k <= (u + n - 1) / BE_PAGE_ROWS - blk0; k++)
            t.page[k] = pages[blk0 + k];
        bf16 *xi = (bf16 *)x + i * ldx;
        LAUNCH_V(V, k_copy_pages, cu_grid(be, n * cv, 256), 256, cuda_stream(be), xi, ldx, (bf16 *)pool, ld, u, blk0, n,
                 cv, to_pool, t);
        cuda_check_launch(be, "copy_pages");
        i += n;
    }
}

// ---- embedding -----------------------------------------------------------------

template <int V>
__global__ void k_embed_fwd(bf16 *out, const bf16 *table, const int32_t *ids, int64_t N, int64_t dv, int d) {
    typedef typename raw_of<V>::t raw_t;
    GRID_STRIDE(i, N * dv) {
        int64_t r = i / dv, c = (i - r * dv) * V;
        *reinterpret_cast<raw_t *>(out + r * d + c) = *reinterpret_cast<const raw_t *>(table + (int64_t)ids[r] * d + c);
    }
}

// Backward, deterministic (no atomics: the same inputs give the same bits).
// The N (id, position) pairs are sorted by id with a stable radix sort (CUB),
// so each id's rows form a run in position order. The sorted list is cut into
// tiles of EMB_TILE rows; a block per (tile, column slab) sums each run piece
// of its tile in order from 0. A run inside one tile is added to its table row
// directly (its only writer). A run that crosses tiles is added by the tile
// that holds its first row: k_embed_bwd_fix adds that tile's piece, then the
// pieces of the following tiles in tile order (kept in scratch). Long runs
// (frequent tokens) are thus spread over many blocks. Without the scratch for
// the sort, k_embed_bwd_serial walks the rows in position order, one thread
// per column chunk (slow; the same sums as the CPU reference).
enum { EMB_TILE = 256, EMB_THREADS = 128 };

// dst[0..V) (+)= s; 16-byte accesses when al16 (V = 8: every offset is then a
// multiple of 8 floats from a 16-byte aligned base).
template <int V> __device__ __forceinline__ void emb_put(float *dst, const float (&s)[V], bool add, bool al16) {
    if constexpr (V == 8) {
        if (al16) {
#pragma unroll
            for (int k = 0; k < V; k += 4) {
                float4 o = add ? *reinterpret_cast<const float4 *>(dst + k) : make_float4(0.f, 0.f, 0.f, 0.f);
                o.x += s[k], o.y += s[k + 1], o.z += s[k + 2], o.w += s[k + 3];
                *reinterpret_cast<float4 *>(dst + k) = o;
            }
            return;
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++)
        dst[k] = add ? dst[k] + s[k] : s[k];
}

__global__ void k_iota(int32_t *p, int64_t n) { GRID_STRIDE(i, n) p[i] = (int32_t)i; }

// Block (tile t, slab of EMB_THREADS column chunks of V). Rows [t0, t0 + n) of
// the sorted list. A run piece goes to in_part[t] when it continues a run of
// an earlier tile (the tile's first piece), else to out_part[t] when its run
// goes on past the tile (the last piece), else into the table.
template <int V>
__global__ void __launch_bounds__(EMB_THREADS)
    k_embed_bwd_tile(float *__restrict__ dtable, float *__restrict__ in_part, float *__restrict__ out_part,
                     const bf16 *__restrict__ dout, const uint32_t *__restrict__ skey,
                     const int32_t *__restrict__ sperm, int64_t N, int64_t dv, int d, int al16) {
    __shared__ uint32_t sk[EMB_TILE];
    __shared__ int32_t sp[EMB_TILE];
    const int64_t t = blockIdx.x, t0 = t * EMB_TILE;
    const int n = N - t0 < EMB_TILE ? (int)(N - t0) : EMB_TILE;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        sk[i] = skey[t0 + i], sp[i] = sperm[t0 + i];
    __syncthreads();
    const int64_t cv = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (cv >= dv) return; // no barrier below
    const int64_t c = cv * V;
    const bool cont_in = t0 > 0 && skey[t0 - 1] == sk[0];
    const bool cont_out = t0 + n < N && skey[t0 + n] == sk[n - 1];
    float s[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        s[k] = 0.f;
    int i0 = 0; // first row of the current piece
#pragma unroll 4
    for (int i = 0; i < n; i++) {
        float g[V];
        ld_bf16<V>(dout + (int64_t)sp[i] * d + c, g);
#pragma unroll
        for (int k = 0; k < V; k++)
            s[k] += g[k];
        if (i + 1 == n || sk[i + 1] != sk[i]) { // the piece ends here (the same branch for the whole block)
            if (i0 == 0 && cont_in)
                emb_put<V>(in_part + t * d + c, s, false, true);
            else if (i + 1 == n && cont_out)
                emb_put<V>(out_part + t * d + c, s, false, true);
            else
                emb_put<V>(dtable + (int64_t)sk[i] * d + c, s, true, al16);
#pragma unroll
            for (int k = 0; k < V; k++)
                s[k] = 0.f;
            i0 = i + 1;
        }
    }
}

// Block (tile t, slab): when the tile's last run starts in it and goes on past
// it, adds out_part[t] + in_part[t+1] + ... + in_part[u_last] (tile order)
// into the run's table row; u_last = the tile of the run's last row.
template <int V>
__global__ void __launch_bounds__(EMB_THREADS)
    k_embed_bwd_fix(float *__restrict__ dtable, const float *__restrict__ in_part, const float *__restrict__ out_part,
                    const uint32_t *__restrict__ skey, int64_t N, int64_t dv, int d, int al16) {
    const int64_t t = blockIdx.x, t0 = t * EMB_TILE, t1 = t0 + EMB_TILE < N ? t0 + EMB_TILE : N;
    const uint32_t key = skey[t1 - 1];
    if (t1 >= N || skey[t1] != key) return;    // the last run ends in this tile
    if (t0 > 0 && skey[t0 - 1] == key) return; // it began in an earlier tile, which adds it
    const int64_t cv = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (cv >= dv) return;
    const int64_t c = cv * V;
    int64_t lo = t1, hi = N; // first row past the run: skey[lo] == key, skey[hi] != key (or hi == N)
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (skey[mid] == key)
            lo = mid;
        else
            hi = mid;
    }
    const int64_t u_last = (hi - 1) / EMB_TILE;
    float s[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        s[k] = out_part[t * d + c + k];
    for (int64_t u = t + 1; u <= u_last; u++) {
#pragma unroll
        for (int k = 0; k < V; k++)
            s[k] += in_part[u * d + c + k];
    }
    emb_put<V>(dtable + (int64_t)key * d + c, s, true, al16);
}

// Rows in position order, one thread per column chunk: dtable[ids[n]] += dout[n]
// exactly as the CPU reference (no scratch; used when the sort has none).
template <int V>
__global__ void k_embed_bwd_serial(float *dtable, const bf16 *dout, const int32_t *ids, int64_t N, int64_t dv, int d) {
    GRID_STRIDE(cv, dv) {
        const int64_t c = cv * V;
        for (int64_t n = 0; n < N; n++) {
            float g[V];
            ld_bf16<V>(dout + n * d + c, g);
            float *row = dtable + (int64_t)ids[n] * d + c;
#pragma unroll
            for (int k = 0; k < V; k++)
                row[k] += g[k];
        }
    }
}

static void cu_embed_fwd(be_t *be, void *out, const void *table, const int32_t *ids, int64_t N, int d) {
    if (N <= 0 || d <= 0) return;
    int V = cu_vec_width((uintptr_t)out | (uintptr_t)table, (uint64_t)d);
    int64_t dv = d / V;
    LAUNCH_V(V, k_embed_fwd, cu_grid(be, N * dv, 256), 256, cuda_stream(be), (bf16 *)out, (const bf16 *)table, ids, N,
             dv, d);
    cuda_check_launch(be, "embed_fwd");
}

// The sorted path of the backward (see k_embed_bwd_tile). 0 when the scratch
// arena lacks room (nothing queued), else 1 (errors recorded).
static int embed_bwd_sorted(be_t *be, float *dtable, const bf16 *dout, const int32_t *ids, int64_t N, int d, int V) {
    cudaStream_t st = cuda_stream(be);
    const int64_t ntiles = (N + EMB_TILE - 1) / EMB_TILE, dv = d / V;
    const uint32_t *keys = (const uint32_t *)ids; // ids are in [0, V): bits 0..30
    size_t tmp_bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, tmp_bytes, keys, (uint32_t *)NULL, (const int32_t *)NULL,
                                                    (int32_t *)NULL, (int)N, 0, 31, st);
    if (e != cudaSuccess) {
        cuda_fail(be, "embed_bwd: cub::DeviceRadixSort::SortPairs (size query)", e);
        return 1;
    }
    arena_t *ar = &be->scratch;
    const size_t mark = arena_mark(ar);
    uint32_t *skey = (uint32_t *)cu_scratch_try(be, (size_t)N * sizeof(uint32_t));
    int32_t *pos = skey ? (int32_t *)cu_scratch_try(be, (size_t)N * sizeof(int32_t)) : NULL;
    int32_t *sperm = pos ? (int32_t *)cu_scratch_try(be, (size_t)N * sizeof(int32_t)) : NULL;
    void *tmp = sperm ? cu_scratch_try(be, tmp_bytes ? tmp_bytes : 1) : NULL;
    // piece sums of runs that cross tiles: in_part, out_part [ntiles, d] each
    float *parts = tmp && ntiles > 1 ? (float *)cu_scratch_try(be, (size_t)2 * ntiles * d * sizeof(float)) : NULL;
    if (!tmp || (ntiles > 1 && !parts)) {
        arena_reset(ar, mark);
        static int warned;
        if (!warned) {
            warned = 1;
            size_t need = 3 * cu_round256((size_t)N * 4) + cu_round256(tmp_bytes) +
                          (ntiles > 1 ? cu_round256((size_t)2 * ntiles * d * sizeof(float)) : 0);
            size_t off = cu_round256(ar->used), avail = off < ar->cap ? ar->cap - off : 0;
            log_warn("cuda embed_bwd: the scratch arena has %zu of the %zu bytes the sorted backward needs (N %lld, "
                     "d %d): rows are added serially (slow); warned once",
                     avail, need, (long long)N, d);
        }
        return 0;
    }
    float *in_part = parts, *out_part = parts ? parts + ntiles * d : NULL;
    k_iota<<<cu_grid(be, N, 256), 256, 0, st>>>(pos, N);
    cuda_check_launch(be, "embed_bwd (iota)");
    e = cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, skey, pos, sperm, (int)N, 0, 31, st);
    if (e != cudaSuccess) {
        arena_reset(ar, mark);
        cuda_fail(be, "embed_bwd: cub::DeviceRadixSort::SortPairs", e);
        return 1;
    }
    const int al16 = (uintptr_t)dtable % 16 == 0 && d % 4 == 0;
    dim3 grid((unsigned)ntiles, cuda_blocks(dv, EMB_THREADS));
    LAUNCH_V(V, k_embed_bwd_tile, grid, EMB_THREADS, st, dtable, in_part, out_part, dout, skey, sperm, N, dv, d, al16);
    cuda_check_launch(be, "embed_bwd (tiles)");
    if (ntiles > 1) {
        LAUNCH_V(V, k_embed_bwd_fix, grid, EMB_THREADS, st, dtable, in_part, out_part, skey, N, dv, d, al16);
        cuda_check_launch(be, "embed_bwd (runs across tiles)");
    }
    arena_reset(ar, mark); // later users of this memory queue behind these kernels
    return 1;
}

static void cu_embed_bwd(be_t *be, float *dtable, const void *dout, const int32_t *ids, int64_t N, int d) {
    if (N <= 0 || d <= 0) return;
    int V = cu_vec_width((uintptr_t)dout, (uint64_t)d);
    int64_t dv = d / V;
    if (N <= INT32_MAX && embed_bwd_sorted(be, dtable, (const bf16 *)dout, ids, N, d, V)) return;
    LAUNCH_V(V, k_embed_bwd_serial, cuda_blocks(dv, 128), 128, cuda_stream(be), dtable, (const bf16 *)dout, ids, N, dv,
             d);
    cuda_check_launch(be, "embed_bwd (serial)");
}

// ---- matrix products ---------------------------------------------------------------
//
// Row-major C[M,N] = op(A) op(B) is, read column-major, C^T[N,M] = op(B)^T
// op(A)^T: a row-major matrix with row stride ld is the column-major matrix
// of its transpose with the same ld. So cuBLASLt's "A" is our B, its "B" is
// our A, the transpose flags carry over unchanged, and C is an N x M
// column-major matrix with leading dimension ldc.

// Everything that decides the descriptors and the algorithm. Zero-filled
// before use so that memcmp and the hash see no padding garbage.
typedef struct {
    int device, ta, tb, c_f32;
    int64_t M, N, K, lda, ldb, ldc, sa, sb, sc, batch;
    unsigned al_a, al_b, al_c; // guaranteed byte alignment of each operand
} gemm_key_t;

typedef struct {
    int used;
    gemm_key_t key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; // cuBLASLt's A (our B), B (our A), C = D
    cublasLtMatmulAlgo_t algo;
    int naive; // cuBLASLt offered no algorithm (unusual alignment): k_gemm_naive
} gemm_plan_t;

// A small process-wide table (the descriptors are host objects, the key names
// the device). Steady-state training and decoding use a few dozen shapes;
// when a probe window is full its first slot is replaced. The lock also
// covers the cublasLtMatmul call, so no thread can free a plan in use.
enum { GEMM_CACHE = 512, GEMM_PROBE = 8 };
static gemm_plan_t g_plans[GEMM_CACHE];
static pthread_mutex_t g_plans_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const gemm_key_t *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void plan_release(gemm_plan_t *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

// Largest power of two (<= 256) dividing the address, and, because every row
// and every batch entry starts at such an offset too, the row and batch
// strides in bytes. cuBLASLt's heuristic assumes 256 unless told otherwise,
// and sub-matrix views (column slices of a wider projection) are often less.
static unsigned byte_align(const void *p, int64_t ld, int64_t stride, int64_t batch, size_t es) {
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)ld * es;
    if (batch > 1) v |= (uint64_t)stride * es;
    unsigned a = 256;
    while (a > 1 && v % a)
        a >>= 1;
    return a;
}

static void lt_fail(be_t *be, const char *what, cublasStatus_t st, const gemm_key_t *k) {
    char msg[512];
    snprintf(msg, sizeof msg,
             "cuda: %s failed: %s (%s) for gemm transA=%d transB=%d M=%lld N=%lld K=%lld lda=%lld ldb=%lld ldc=%lld "
             "batch=%lld %s C, alignment A/B/C %u/%u/%u bytes",
             what, cublasLtGetStatusString(st), cublasLtGetStatusName(st), k->ta, k->tb, (long long)k->M,
             (long long)k->N, (long long)k->K, (long long)k->lda, (long long)k->ldb, (long long)k->ldc,
             (long long)k->batch, k->c_f32 ? "fp32" : "bf16", k->al_a, k->al_b, k->al_c);
    cuda_record_error(be, ERR_RUNTIME, msg);
}

static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                             int64_t stride, int64_t batch) {
    // A single column never steps by ld; accept any ld there, as BLAS does for n = 1.
    if (cols == 1 && ld < rows) ld = rows;
    cublasStatus_t st = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (st == CUBLAS_STATUS_SUCCESS && batch > 1) {
        int32_t bc = (int32_t)batch;
        st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof stride);
    }
    return st;
}

// bf16 / fp32 C element access for the fallback kernels below.
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void from_f(float *p, float v) { *p = v; }
__device__ __forceinline__ void from_f(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

// Builds descriptors and asks the heuristic once for this key.
static cublasStatus_t plan_build(be_t *be, gemm_plan_t *p, const gemm_key_t *k, const char **what) {
    cuda_impl_t *ci = cuda_impl(be);
    memset(p, 0, sizeof *p);
    p->key = *k;
    cublasStatus_t st;
    *what = "cublasLtMatmulDescCreate";
    if ((st = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) return st;
    cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    *what = "cublasLtMatmulDescSetAttribute";
    if ((st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) !=
        CUBLAS_STATUS_SUCCESS)
        return st;
    if ((st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) !=
        CUBLAS_STATUS_SUCCESS)
        return st;
    *what = "cublasLtMatrixLayoutCreate";
    // cuBLASLt A = our B as stored: row-major [K,N] (tb = 0) is column-major N x K.
    if ((st = layout(&p->la, CUDA_R_16BF, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb, k->sb, k->batch)) !=
        CUBLAS_STATUS_SUCCESS)
        return st;
    // cuBLASLt B = our A as stored: row-major [M,K] (ta = 0) is column-major K x M.
    if ((st = layout(&p->lb, CUDA_R_16BF, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda, k->sa, k->batch)) !=
        CUBLAS_STATUS_SUCCESS)
        return st;
    if ((st = layout(&p->lc, k->c_f32 ? CUDA_R_32F : CUDA_R_16BF, k->N, k->M, k->ldc, k->sc, k->batch)) !=
        CUBLAS_STATUS_SUCCESS)
        return st;

    cublasLtMatmulPreference_t pref = NULL;
    *what = "cublasLtMatmulPreferenceCreate";
    if ((st = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) return st;
    uint64_t ws = ci->lt_workspace_size;
    uint32_t al_a = k->al_b, al_b = k->al_a, al_c = k->al_c; // swapped: cuBLASLt's A is our B
    *what = "cublasLtMatmulPreferenceSetAttribute";
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int nres = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
        *what = "cublasLtMatmulAlgoGetHeuristic";
        st = cublasLtMatmulAlgoGetHeuristic(ci->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
        if (st == CUBLAS_STATUS_SUCCESS && (nres < 1 || res.state != CUBLAS_STATUS_SUCCESS))
            st = nres < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : res.state;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) { // correct but slow beats failing
        log_warn("cuda gemm: no cuBLASLt algorithm for transA=%d transB=%d M=%lld N=%lld K=%lld lda=%lld ldb=%lld "
                 "ldc=%lld batch=%lld, alignment A/B/C %u/%u/%u bytes; using the simple kernel",
                 k->ta, k->tb, (long long)k->M, (long long)k->N, (long long)k->K, (long long)k->lda, (long long)k->ldb,
                 (long long)k->ldc, (long long)k->batch, k->al_a, k->al_b, k->al_c);
        p->naive = 1;
        p->used = 1;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    p->algo = res.algo;
    p->used = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// One thread per output element, fp32 accumulation: only for shapes cuBLASLt
// declines (see plan_build).
template <typename T>
__global__ void k_gemm_naive(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16 *A, int64_t lda,
                             int64_t sa, const bf16 *B, int64_t ldb, int64_t sb, float beta, T *C, int64_t ldc,
                             int64_t sc, int64_t batch) {
    GRID_STRIDE(i, batch * M * N) {
        int64_t b = i / (M * N), r = i - b * (M * N), m = r / N, n = r - m * N;
        const bf16 *a = A + b * sa, *bb = B + b * sb;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
            acc += __bfloat162float(ta ? a[k * lda + m] : a[m * lda + k]) *
                   __bfloat162float(tb ? bb[n * ldb + k] : bb[k * ldb + n]);
        T *p = C + b * sc + m * ldc + n;
        from_f(p, alpha * acc + (beta == 0.0f ? 0.0f : beta * to_f(*p)));
    }
}

// C = beta C (0 where beta == 0, as BLAS) for the K = 0 products cuBLASLt
// does not take.
template <typename T>
__global__ void k_gemm_beta(T *C, int64_t ldc, int64_t sc, int64_t M, int64_t N, int64_t batch, float beta) {
    GRID_STRIDE(i, batch * M * N) {
        int64_t b = i / (M * N), r = i - b * (M * N), m = r / N, n = r - m * N;
        T *p = C + b * sc + m * ldc + n;
        from_f(p, beta == 0.0f ? 0.0f : beta * to_f(*p));
    }
}

static void lt_gemm(be_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                    int64_t sa, const void *B, int64_t ldb, int64_t sb, float beta, void *C, int64_t ldc, int64_t sc,
                    int64_t batch, int c_f32) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    if (K <= 0) {
        int64_t n = batch * M * N;
        if (c_f32)
            k_gemm_beta<float>
                <<<cu_grid(be, n, 256), 256, 0, cuda_stream(be)>>>((float *)C, ldc, sc, M, N, batch, beta);
        else
            k_gemm_beta<bf16><<<cu_grid(be, n, 256), 256, 0, cuda_stream(be)>>>((bf16 *)C, ldc, sc, M, N, batch, beta);
        cuda_check_launch(be, "gemm (K = 0)");
        return;
    }
    cuda_impl_t *ci = cuda_impl(be);
    gemm_key_t k;
    memset(&k, 0, sizeof k);
    k.device = ci->device;
    k.ta = !!ta, k.tb = !!tb, k.c_f32 = c_f32;
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc, k.batch = batch;
    if (batch > 1) k.sa = sa, k.sb = sb, k.sc = sc;
    k.al_a = byte_align(A, lda, sa, batch, 2);
    k.al_b = byte_align(B, ldb, sb, batch, 2);
    k.al_c = byte_align(C, ldc, sc, batch, c_f32 ? 4 : 2);

    pthread_mutex_lock(&g_plans_lock);
    uint64_t h = key_hash(&k);
    gemm_plan_t *p = NULL, *slot = NULL;
    for (int i = 0; i < GEMM_PROBE; i++) {
        gemm_plan_t *q = &g_plans[(h + i) % GEMM_CACHE];
        if (q->used && !memcmp(&q->key, &k, sizeof k)) {
            p = q;
            break;
        }
        if (!q->used && !slot) slot = q;
    }
    if (!p) {
        if (!slot) slot = &g_plans[h % GEMM_CACHE];
        plan_release(slot);
        const char *what = "";
        cublasStatus_t st = plan_build(be, slot, &k, &what);
        if (st != CUBLAS_STATUS_SUCCESS) {
            plan_release(slot);
            pthread_mutex_unlock(&g_plans_lock);
            lt_fail(be, what, st, &k);
            return;
        }
        p = slot;
    }
    if (p->naive) {
        pthread_mutex_unlock(&g_plans_lock);
        unsigned grid = cu_grid(be, batch * M * N, 256);
        if (c_f32)
            k_gemm_naive<float><<<grid, 256, 0, ci->stream>>>(k.ta, k.tb, M, N, K, alpha, (const bf16 *)A, lda, sa,
                                                              (const bf16 *)B, ldb, sb, beta, (float *)C, ldc, sc,
                                                              batch);
        else
            k_gemm_naive<bf16><<<grid, 256, 0, ci->stream>>>(k.ta, k.tb, M, N, K, alpha, (const bf16 *)A, lda, sa,
                                                             (const bf16 *)B, ldb, sb, beta, (bf16 *)C, ldc, sc, batch);
        cuda_check_launch(be, "gemm (simple kernel)");
        return;
    }
    cublasStatus_t st = cublasLtMatmul(ci->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc, &p->algo,
                                       ci->lt_workspace, ci->lt_workspace_size, ci->stream);
    pthread_mutex_unlock(&g_plans_lock);
    if (st != CUBLAS_STATUS_SUCCESS) lt_fail(be, "cublasLtMatmul", st, &k);
}

// ---- a few rows times a weight: C [M, N] = alpha A [M, K] B [N, K]^T, M <= 8 ----
// A decode step multiplies a few rows by each weight matrix: bound by the
// weight's bytes, where cuBLASLt's smallest tiles took about 5.5 us each (run
// 21's profile of a decode token, docs/RESULTS.md). One warp per output
// column: 16-byte loads of B's row, the M rows of A read beside it (cached),
// fp32 sums, a warp reduction, bf16 out. Batched products (MLA's per-head
// absorption) take a grid row per batch entry: blockIdx.y, with element
// strides sa, sb, sc between the entries' A, B and C (0 and one row when
// unbatched).
enum { GEMV_ROWS = BE_FEW_ROWS, GEMV_WARPS = 4 };

// A row of the few-row products normed inside the product (rmsnorm_fwd's
// formula, a gain xw [K]): the warp reads every value of the row anyway, so
// each lane adds its values' squares to ss and multiplies them by the gain
// as it loads them, and the row's scale multiplies the warp's sums at the end.
// V values of the row at p into x; with a gain (xw not NULL, its V values in
// g), ss += their squares and x *= g.
template <int V>
__device__ __forceinline__ void ld_row_normed(float (&x)[V], const bf16 *p, const bf16 *xw, const float (&g)[V],
                                              float &ss) {
    ld_bf16<V>(p, x);
    if (xw)
#pragma unroll
        for (int i = 0; i < V; i++)
            ss = fmaf(x[i], x[i], ss), x[i] *= g[i];
}
// The row's scale 1 / sqrt(mean square + eps), from the lanes' shares of its
// sum of squares over K.
static __device__ __forceinline__ float gemv_norm_scale(float ss, int64_t K, float eps) {
    return 1.0f / sqrtf(warp_sum(ss) / (float)K + eps);
}

// acc[m] += this lane's share of A[m, :] . b[:] (K values; every lane's share
// summed by warp_sum gives the dot product). With a gain xw [K] (else NULL):
// of A's rows normed (ld_row_normed; ss[m]: the lane's share of row m's sum of
// squares).
template <int M, int V>
__device__ __forceinline__ void gemv_lane_dot(float (&acc)[M], float (&ss)[M], const bf16 *__restrict__ A, int64_t lda,
                                              const bf16 *__restrict__ b, int64_t K, int lane,
                                              const bf16 *__restrict__ xw) {
    for (int64_t k = (int64_t)lane * V; k < K; k += 32 * V) {
        float w[V], g[V];
        ld_bf16<V>(b + k, w);
        if (xw) ld_bf16<V>(xw + k, g);
#pragma unroll
        for (int m = 0; m < M; m++) {
            float x[V];
            ld_row_normed<V>(x, A + m * lda + k, xw, g, ss[m]);
#pragma unroll
            for (int i = 0; i < V; i++)
                acc[m] = fmaf(x[i], w[i], acc[m]);
        }
    }
}

// s0[m] = A[m, :] . b0[:] and s1[m] = A[m, :] . b1[:], two weight rows read
// side by side and the rows of A once for both: each lane's share, then summed
// over the warp (every lane holds the sums). With a gain xw [K] (else NULL),
// of A's rows normed (ld_row_normed): a decode step so feeds the residual
// stream to its next product without a launch to norm it.
template <int M, int V>
__device__ __forceinline__ void gemv_warp_dot2(float (&s0)[M], float (&s1)[M], const bf16 *__restrict__ A, int64_t lda,
                                               const bf16 *__restrict__ b0, const bf16 *__restrict__ b1, int64_t K,
                                               int lane, const bf16 *__restrict__ xw, float eps) {
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        s0[m] = s1[m] = ss[m] = 0.0f;
    for (int64_t k = (int64_t)lane * V; k < K; k += 32 * V) {
        float w0[V], w1[V], g[V];
        ld_bf16<V>(b0 + k, w0);
        ld_bf16<V>(b1 + k, w1);
        if (xw) ld_bf16<V>(xw + k, g);
#pragma unroll
        for (int m = 0; m < M; m++) {
            float x[V];
            ld_row_normed<V>(x, A + m * lda + k, xw, g, ss[m]);
#pragma unroll
            for (int i = 0; i < V; i++) {
                s0[m] = fmaf(x[i], w0[i], s0[m]);
                s1[m] = fmaf(x[i], w1[i], s1[m]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        s0[m] = warp_sum(s0[m]), s1[m] = warp_sum(s1[m]);
        if (xw) {
            const float r = gemv_norm_scale(ss[m], K, eps);
            s0[m] *= r, s1[m] *= r;
        }
    }
}

// The bytes of its weight row a decode product's warp asks L2 for before the
// kernel before it ends (griddep_enter): all of them when the whole matrix
// is at most GEMV_PREFETCH_MAX bytes, so that a small model's next products
// arrive in that kernel's shadow; none for larger ones, where a launch's
// first wave asked for up to ~100 MB at once (a 3B model's gate and up),
// overflowing L2 and evicting lines before their loads: the 3B hybrid's
// bf16 decode step took 4.31 ms with the prefetches, 3.44 without
// (docs/PERFORMANCE.md, run 36). The bench-variants build's
// HYLO_GEMV_PREFETCH = bytes caps every row's prefetch at that instead (0:
// none; more than any row: all), to measure it.
enum { GEMV_PREFETCH_MAX = 8 << 20 };
#ifdef HYLO_BENCH_VARIANTS
__device__ int64_t g_gemv_prefetch_cap = -1;
#endif
static __device__ __forceinline__ int64_t gemv_prefetch_bytes(int64_t row_bytes, int64_t matrix_bytes) {
#ifdef HYLO_BENCH_VARIANTS
    if (g_gemv_prefetch_cap >= 0) return row_bytes < g_gemv_prefetch_cap ? row_bytes : g_gemv_prefetch_cap;
#endif
    return matrix_bytes <= GEMV_PREFETCH_MAX ? row_bytes : 0;
}

// Launches kern<M, V> for M = rows (1..GEMV_ROWS), as a programmatic dependent
// launch (cuda_vec.cuh: each of these kernels starts with griddep_enter()).
#define GEMV_LAUNCH_M(rows, V, kern, grid, stream, ...)                                                                \
    do {                                                                                                               \
        switch (rows) {                                                                                                \
        case 1: cu_launch_pdl(kern<1, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 2: cu_launch_pdl(kern<2, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 3: cu_launch_pdl(kern<3, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 4: cu_launch_pdl(kern<4, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 5: cu_launch_pdl(kern<5, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 6: cu_launch_pdl(kern<6, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        case 7: cu_launch_pdl(kern<7, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;             \
        default: cu_launch_pdl(kern<8, V>, (grid), dim3(GEMV_WARPS * 32), 0, (stream), __VA_ARGS__); break;            \
        }                                                                                                              \
    } while (0)

// C [M, N] = alpha A B^T, one column a warp, batch entry blockIdx.y; with a
// gain xw [K] (else NULL), of A's rows RMS-normalised with it (proj_rmsnorm).
template <int M, int V>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(bf16 *__restrict__ C, int64_t ldc, int64_t sc, const bf16 *__restrict__ A, int64_t lda, int64_t sa,
           const bf16 *__restrict__ B, int64_t ldb, int64_t sb, int64_t N, int64_t K, float alpha,
           const bf16 *__restrict__ xw, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), z = blockIdx.y;
    A += z * sa, B += z * sb, C += z * sc;
    if (n < N)
        warp_prefetch_l2(B + n * ldb, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), N * K * (int64_t)sizeof(bf16)),
                         lane);
    griddep_enter();
    if (n >= N) return; // the whole warp
    float acc[M], ss[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        acc[m] = ss[m] = 0.0f;
    gemv_lane_dot<M, V>(acc, ss, A, lda, B + n * ldb, K, lane, xw);
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = warp_sum(acc[m]);
        if (xw) v *= gemv_norm_scale(ss[m], K, eps);
        if (lane == 0) C[m * ldc + n] = __float2bfloat16_rn(alpha * v);
    }
}

// The rows-times-weight products the few-row kernels take: A as stored, 1 to
// GEMV_ROWS rows, nothing to add to C, a batch entry a grid row (at most
// 65535), and 16-byte loads of B along its rows. B transposed (k_gemv,
// k_gemv_cols): along K, A's rows too (K, lda, ldb multiples of 8, A and B
// aligned). B as stored (k_gemv_xw, A read a value at a time): along N (N,
// ldb multiples of 8, B aligned). Batch strides count past one entry only; C
// is written a value at a time.
static bool gemv_fits(int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, int64_t sa,
                      const void *B, int64_t ldb, int64_t sb, float beta, int64_t batch) {
    if (ta || M < 1 || M > GEMV_ROWS || N <= 0 || K <= 0 || beta != 0.0f || batch < 1 || batch > 65535) return false;
    const int64_t sab = batch > 1 ? sa : 0, sbb = batch > 1 ? sb : 0;
    if (tb) return (K | lda | ldb | sab | sbb) % 8 == 0 && !(((uintptr_t)A | (uintptr_t)B) & 15);
    return (N | ldb | sbb) % 8 == 0 && !((uintptr_t)B & 15);
}

// Several output columns a warp, for products of 5 to 8 rows. The
// one-column kernel reads the M rows of A once per column, so at M = 8 a warp
// moves 8 bytes of A (L1) per byte of weight; here each lane's 8 values of
// A's M rows serve R weight rows (A read once per R rows). 16-byte loads only.
// Where each wins: docs/PERFORMANCE.md, run 31 (gemv() below).

// acc[r][m] += this lane's share of A[m, :] . w[r][:] (K values); with a
// gain xw, of A's rows normed (ld_row_normed, as gemv_lane_dot).
template <int M, int R>
__device__ __forceinline__ void gemv_lane_dotr(float (&acc)[R][M], float (&ss)[M], const bf16 *__restrict__ A,
                                               int64_t lda, const bf16 *const (&w)[R], int64_t K, int lane,
                                               const bf16 *__restrict__ xw) {
    for (int64_t k = (int64_t)lane * 8; k < K; k += 32 * 8) {
        float x[M][8], g[8];
        if (xw) ld_bf16<8>(xw + k, g);
#pragma unroll
        for (int m = 0; m < M; m++)
            ld_row_normed<8>(x[m], A + m * lda + k, xw, g, ss[m]);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[8];
            ld_bf16<8>(w[r] + k, v);
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[r][m] = fmaf(x[m][i], v[i], acc[r][m]);
        }
    }
}

// C [M, N] = alpha A B^T with CW columns a warp (columns past N repeat the
// last one: their sums are not written), batch entry blockIdx.y; with a gain
// xw, of A's rows RMS-normalised with it (as k_gemv).
template <int M, int CW>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_cols(bf16 *__restrict__ C, int64_t ldc, int64_t sc, const bf16 *__restrict__ A, int64_t lda, int64_t sa,
                const bf16 *__restrict__ B, int64_t ldb, int64_t sb, int64_t N, int64_t K, float alpha,
                const bf16 *__restrict__ xw, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * CW, z = blockIdx.y;
    A += z * sa, B += z * sb, C += z * sc;
    const int nc = N - n0 < CW ? (int)(N - n0) : CW; // columns of this warp (warp-uniform)
    for (int c = 0; c < nc; c++)
        warp_prefetch_l2(B + (n0 + c) * ldb,
                         gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), N * K * (int64_t)sizeof(bf16)), lane);
    griddep_enter();
    if (nc <= 0) return; // the whole warp
    const bf16 *w[CW];
#pragma unroll
    for (int c = 0; c < CW; c++)
        w[c] = B + (n0 + (c < nc ? c : nc - 1)) * ldb;
    float acc[CW][M] = {}, ss[M] = {}, rs[M]; // rs: each row's norm scale
    gemv_lane_dotr<M, CW>(acc, ss, A, lda, w, K, lane, xw);
#pragma unroll
    for (int m = 0; m < M; m++)
        rs[m] = xw ? gemv_norm_scale(ss[m], K, eps) : 1.0f;
#pragma unroll
    for (int c = 0; c < CW; c++) {
        if (c >= nc) break;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float v = warp_sum(acc[c][m]) * rs[m];
            if (lane == 0) C[m * ldc + n0 + c] = __float2bfloat16_rn(alpha * v);
        }
    }
}

// A product of M <= 8 rows (batch entries: a grid row each): one column a
// warp (k_gemv) up to 4 rows, 4 columns a warp (k_gemv_cols) from 5 rows,
// where run 31 measured them as fast or faster at every shape of SmolLM2 and
// Llama-3.2-3B (up to 1.8x at 8 rows). The bench-variants build's
// HYLO_GEMV_COLS = 1, 2 or 4 forces one form at every row count, to measure
// them side by side.
static void gemv(be_t *be, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda, int64_t sa,
                 const void *B, int64_t ldb, int64_t sb, void *C, int64_t ldc, int64_t sc, int64_t batch,
                 const void *xw, float eps) {
    int cols = M >= 5 ? 4 : 1;
#ifdef HYLO_BENCH_VARIANTS
    const int forced = cu_env_int("HYLO_GEMV_COLS", 0);
    if (forced == 1 || forced == 2 || forced == 4) cols = forced;
#endif
    if (cols > 1) {
        const int64_t per = (int64_t)GEMV_WARPS * cols; // columns a block
        const dim3 grid((unsigned)((N + per - 1) / per), (unsigned)batch);
        // (GEMV_LAUNCH_M's second argument is the kernel's second template argument: CW here)
#ifdef HYLO_BENCH_VARIANTS
        if (cols == 2)
            GEMV_LAUNCH_M((int)M, 2, k_gemv_cols, grid, cuda_stream(be), (bf16 *)C, ldc, sc, (const bf16 *)A, lda, sa,
                          (const bf16 *)B, ldb, sb, N, K, alpha, (const bf16 *)xw, eps);
        else
#endif
            GEMV_LAUNCH_M((int)M, 4, k_gemv_cols, grid, cuda_stream(be), (bf16 *)C, ldc, sc, (const bf16 *)A, lda, sa,
                          (const bf16 *)B, ldb, sb, N, K, alpha, (const bf16 *)xw, eps);
        cuda_check_launch(be, "k_gemv_cols");
        return;
    }
    const dim3 grid((unsigned)((N + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)batch);
    GEMV_LAUNCH_M((int)M, 8, k_gemv, grid, cuda_stream(be), (bf16 *)C, ldc, sc, (const bf16 *)A, lda, sa,
                  (const bf16 *)B, ldb, sb, N, K, alpha, (const bf16 *)xw, eps);
    cuda_check_launch(be, "k_gemv");
}

// ---- a few rows times a weight as stored: C [M, N] = alpha A [M, K] B [K, N] ----
// MLA's absorbed decode step multiplies each head's query by its KV group's
// block of kv_b as stored (q_lat = q_nope wk_g: "x W", mla.c), batched over the
// groups. A block takes XW_CHUNKS chunks of CT consecutive columns; thread t
// owns chunk t % XW_CHUNKS (16-byte loads along a row of B, the chunks side by
// side: 64 contiguous bytes a row) and every XW_SLICES-th row of B from
// t / XW_CHUNKS, so that a product of a few dozen rows of B (d_nope) still
// spreads over the block's threads, and a grid of (N / 32 columns, batch)
// blocks spreads the weight over the SMs. The slices' sums meet in shared
// memory and are added in slice order: the same bits every run.
enum { XW_CHUNKS = 4, XW_SLICES = GEMV_WARPS * 32 / XW_CHUNKS };

// Batch entry blockIdx.y; N a multiple of CT, B's rows and stride aligned for
// CT-wide loads (gemv_fits).
template <int M, int CT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_xw(bf16 *__restrict__ C, int64_t ldc, int64_t sc, const bf16 *__restrict__ A, int64_t lda, int64_t sa,
              const bf16 *__restrict__ B, int64_t ldb, int64_t sb, int64_t N, int64_t K, float alpha) {
    // Partial sums [slice][m][i][chunk], a slice P floats (XW_CHUNKS of
    // padding): the 32 lanes of a warp (8 slices of 4 chunks) store to 32
    // different banks, and the reduction reads consecutive floats.
    enum { P = (M * CT + 1) * XW_CHUNKS };
    __shared__ float part[XW_SLICES * P];
    const int c = threadIdx.x % XW_CHUNKS, s = threadIdx.x / XW_CHUNKS;
    const int64_t z = blockIdx.y, n0 = (int64_t)blockIdx.x * (XW_CHUNKS * CT); // the block's first column
    const int nb = N - n0 < XW_CHUNKS * CT ? (int)(N - n0) : XW_CHUNKS * CT;   // its columns, a multiple of CT
    A += z * sa, B += z * sb, C += z * sc;
    // The block's part of each row of B: at most 64 bytes from a 16-byte
    // boundary, so in the lines of its first and last values.
    for (int64_t k = threadIdx.x; k < K; k += GEMV_WARPS * 32) {
        prefetch_l2(B + k * ldb + n0);
        prefetch_l2(B + k * ldb + n0 + nb - 1);
    }
    griddep_enter();
    float acc[M][CT] = {};
    if (c * CT < nb) {
        const bf16 *b = B + n0 + c * CT;
#pragma unroll 4
        for (int64_t k = s; k < K; k += XW_SLICES) {
            float w[CT];
            ld_bf16<CT>(b + k * ldb, w);
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float a = __bfloat162float(A[m * lda + k]);
#pragma unroll
                for (int i = 0; i < CT; i++)
                    acc[m][i] = fmaf(a, w[i], acc[m][i]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int i = 0; i < CT; i++)
            part[s * P + (m * CT + i) * XW_CHUNKS + c] = acc[m][i];
    __syncthreads();
    for (int e = threadIdx.x; e < M * CT * XW_CHUNKS; e += GEMV_WARPS * 32) {
        const int m = e / (CT * XW_CHUNKS), i = e / XW_CHUNKS % CT, j = e % XW_CHUNKS * CT + i; // j: column in block
        if (j >= nb) continue;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < XW_SLICES; q++)
            v += part[q * P + e];
        C[m * ldc + n0 + j] = __float2bfloat16_rn(alpha * v);
    }
}

static void gemv_xw(be_t *be, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda, int64_t sa,
                    const void *B, int64_t ldb, int64_t sb, void *C, int64_t ldc, int64_t sc, int64_t batch) {
    const int64_t per = (int64_t)XW_CHUNKS * 8; // columns a block
    const dim3 grid((unsigned)((N + per - 1) / per), (unsigned)batch);
    // (GEMV_LAUNCH_M's second argument is the kernel's second template argument: CT, the columns a thread)
    GEMV_LAUNCH_M((int)M, 8, k_gemv_xw, grid, cuda_stream(be), (bf16 *)C, ldc, sc, (const bf16 *)A, lda, sa,
                  (const bf16 *)B, ldb, sb, N, K, alpha);
    cuda_check_launch(be, "k_gemv_xw");
}

// A product gemv_fits takes, on the few-row kernels (programmatic dependent
// launches, as the rest of a decode step); false for any other, which the
// caller gives to cuBLASLt.
static bool gemv_gemm(be_t *be, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                      int64_t lda, int64_t sa, const void *B, int64_t ldb, int64_t sb, float beta, void *C, int64_t ldc,
                      int64_t sc, int64_t batch) {
    if (!gemv_fits(ta, tb, M, N, K, A, lda, sa, B, ldb, sb, beta, batch)) return false;
    if (tb)
        gemv(be, M, N, K, alpha, A, lda, sa, B, ldb, sb, C, ldc, sc, batch, NULL, 0.0f);
    else
        gemv_xw(be, M, N, K, alpha, A, lda, sa, B, ldb, sb, C, ldc, sc, batch);
    return true;
}

// ---- a decode step's products fused with what follows them (M <= 8 rows) ----
// The same one-warp-per-column product as k_gemv, with V = 8 (16-byte loads:
// K, the row strides and the pointers allow it) or 1 (scalar loads). The
// sums stay in fp32 into the op that follows, so one launch replaces two or
// three and the product is rounded once, at the end.

// h[m, n] = silu(A[m] . Wg[n]) * (A[m] . Wu[n]): the warp of column n reads
// row n of both matrices beside each other, the rows of A once for both (A's
// rows normed with gain xw first, when there is one: gemv_warp_dot2).
template <int M, int V>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_swiglu(bf16 *__restrict__ h, const bf16 *__restrict__ A, int64_t lda, const bf16 *__restrict__ xw, float eps,
                  const bf16 *__restrict__ Wg, const bf16 *__restrict__ Wu, int64_t f, int64_t K) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const bf16 *g = Wg + n * K, *u = Wu + n * K;
    if (n < f) {
        warp_prefetch_l2(g, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), 2 * f * K * (int64_t)sizeof(bf16)), lane);
        warp_prefetch_l2(u, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), 2 * f * K * (int64_t)sizeof(bf16)), lane);
    }
    griddep_enter();
    if (n >= f) return; // the whole warp
    float gs[M], us[M];
    gemv_warp_dot2<M, V>(gs, us, A, lda, g, u, K, lane, xw, eps);
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < M; m++)
            h[m * f + n] = __float2bfloat16_rn(dev_silu(gs[m]) * us[m]);
}

// The end of k_gemv_add_rmsnorm: each block's sums of squares ss (lane 0 of
// each warp holds its own) into partial[block], and the last block to count
// in `done` writes xn = rmsnorm(x) w for all M rows, then resets `done` for
// the next launch.
template <int M, int V>
__device__ __forceinline__ void add_rmsnorm_end(bf16 *__restrict__ xn, const bf16 *x, const bf16 *__restrict__ w, int d,
                                                float eps, unsigned *done, float *partial, const float (&ss)[M]) {
    __shared__ float ss_warp[GEMV_WARPS][M];
    __shared__ float rstd[M];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < M; m++)
            ss_warp[warp][m] = ss[m];
    __syncthreads();
    if (threadIdx.x < M) {
        float s = 0.0f;
        for (int k = 0; k < GEMV_WARPS; k++)
            s += ss_warp[k][threadIdx.x];
        partial[blockIdx.x * M + threadIdx.x] = s;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    for (int m = warp; m < M; m += GEMV_WARPS) {
        float s = 0.0f;
        for (unsigned b = lane; b < gridDim.x; b += 32)
            s += __ldcg(partial + b * M + m);
        s = warp_sum(s);
        if (lane == 0) rstd[m] = 1.0f / sqrtf(s / (float)d + eps);
    }
    __syncthreads();
    const int64_t nv = (int64_t)M * d / V; // rows are contiguous, and d % V == 0
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
        const int64_t e = j * V;
        const int m = (int)(e / d), i = (int)(e - (int64_t)m * d);
        float f[V], g[V];
        if constexpr (V == 8) {
            uint4 u = __ldcg(reinterpret_cast<const uint4 *>(x + e));
            ld_bf16<8>(reinterpret_cast<const bf16 *>(&u), f);
        } else {
            f[0] = __bfloat162float(__ldcg(x + e));
        }
        ld_bf16<V>(w + i, g);
#pragma unroll
        for (int k = 0; k < V; k++)
            f[k] = f[k] * rstd[m] * g[k];
        st_bf16<V>(xn + e, f);
    }
    if (threadIdx.x == 0) *done = 0; // every other block has counted: ready for the next launch
}

// x[m, n] += A[m] . W[n] (rounded once), then, with a gain w, xn = rmsnorm(x).
// The norm needs every column of a row, which the blocks share out: each
// block leaves the sums of squares of its columns in partial[block, m], and
// the last block to finish (a count in `done`, which it resets for the next
// launch) adds them in block order (the same bits every run) and writes xn
// for all rows. The fences make every block's x and partials visible before
// its count; the last block reads them from L2 (__ldcg), past its own L1.
// Columns go round the grid (at most CUDA_NORM_BLOCKS blocks: the partials'
// room).
template <int M, int V>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_add_rmsnorm(bf16 *__restrict__ xn, bf16 *__restrict__ x, const bf16 *__restrict__ A, int64_t lda,
                       const bf16 *__restrict__ W, const bf16 *__restrict__ w, int d, int64_t K, float eps,
                       unsigned *done, float *partial) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + warp; n < d; n += (int64_t)gridDim.x * GEMV_WARPS)
        warp_prefetch_l2(W + n * K, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), d * K * (int64_t)sizeof(bf16)),
                         lane);
    griddep_enter();
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        ss[m] = 0.0f;
    for (int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + warp; n < d; n += (int64_t)gridDim.x * GEMV_WARPS) {
        float acc[M], unused[M];
#pragma unroll
        for (int m = 0; m < M; m++)
            acc[m] = 0.0f;
        gemv_lane_dot<M, V>(acc, unused, A, lda, W + n * K, K, lane, nullptr);
#pragma unroll
        for (int m = 0; m < M; m++) {
            const float s = warp_sum(acc[m]);
            if (lane == 0) { // x and the sums of squares: lane 0 alone
                const bf16 v = __float2bfloat16_rn(__bfloat162float(x[m * d + n]) + s);
                x[m * d + n] = v;
                ss[m] = fmaf(__bfloat162float(v), __bfloat162float(v), ss[m]);
            }
        }
    }
    if (!w) return; // the last layer: the add alone
    add_rmsnorm_end<M, V>(xn, x, w, d, eps, done, partial, ss);
}

// q, k and v of an attention decode step from one product, rotated and
// appended (proj_rope_kv_append). Warp u takes columns c and c + dh/2 of head
// h of W's rows [q | k | v] (c = h dh + j, j < dh/2): for a q or k head the
// two halves of a NEOX rotation pair, rotated from the fp32 sums; for a v
// head two columns stored as they are (A's rows normed with gain xw first,
// when there is one: gemv_warp_dot2). Lane m < M stores row m's pair, so it
// alone loads that row's destination (its q row, or its cache entry through
// the page tables) and angle, before the product. The bounds ask for one
// resident block per SM: without that ptxas held a variant to 64 registers,
// and it spilled.
template <int M, int V>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 1)
    k_gemv_rope_kv_append(bf16 *__restrict__ q, int64_t ldq, const bf16 *__restrict__ A, int64_t lda,
                          const bf16 *__restrict__ xw, float eps, const bf16 *__restrict__ W, int64_t K,
                          const int32_t *__restrict__ pos, const float *__restrict__ cosb,
                          const float *__restrict__ sinb, bf16 *const *__restrict__ k_rows,
                          bf16 *const *__restrict__ v_rows, be_pages_t pg, int H, int Hkv, int dh) {
    const int lane = threadIdx.x & 31, half = dh >> 1;
    const int64_t u = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (u >= (int64_t)(H + 2 * Hkv) * half) return; // the whole warp
    const int h = (int)u / half, j = (int)u - h * half;
    const bf16 *w0 = W + ((int64_t)h * dh + j) * K, *w1 = w0 + (int64_t)half * K;
    const int64_t wbytes = (int64_t)(H + 2 * Hkv) * dh * K * (int64_t)sizeof(bf16);
    warp_prefetch_l2(w0, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), wbytes), lane);
    warp_prefetch_l2(w1, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), wbytes), lane);
    griddep_enter();
    const bool rotate = h < H + Hkv; // q and k heads; v heads are stored as they are
    bf16 *dst = NULL;
    float cj = 0.0f, sj = 0.0f;
    if (lane < M) {
        const int64_t p = pos[lane];
        if (h < H) {
            dst = q + lane * ldq + (int64_t)h * dh + j;
        } else {
            const int64_t row = cu_page_row(pg, lane, p) * ((int64_t)Hkv * dh);
            dst = h < H + Hkv ? k_rows[lane] + row + (int64_t)(h - H) * dh + j
                              : v_rows[lane] + row + (int64_t)(h - H - Hkv) * dh + j;
        }
        if (rotate) cj = cosb[p * half + j], sj = sinb[p * half + j];
    }
    float s0[M], s1[M];
    gemv_warp_dot2<M, V>(s0, s1, A, lda, w0, w1, K, lane, xw, eps);
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == m) {
            dst[0] = __float2bfloat16_rn(rotate ? s0[m] * cj - s1[m] * sj : s0[m]);
            dst[half] = __float2bfloat16_rn(rotate ? s1[m] * cj + s0[m] * sj : s1[m]);
        }
}

// An MLA step's q_b product, its RoPE and the latent cache append
// (proj_mla_rope_append). Each head's qd output columns share out among
// per_head = ceil(d_nope / 2) + dr / 2 warps: warp t < ceil(d_nope / 2) of
// head h takes the plain columns 2t and 2t + 1 (the second absent at an odd
// d_nope's end), warp plain + j the interleaved q_pe pair (2j, 2j + 1) of W's
// rows, whose fp32 sums are rotated into outputs j and j + dr/2 of q_pe (one
// product for two columns: A's rows read once, gemv_warp_dot2). Lane m < M
// stores row m's pair, loading its angle before the product. Warp H per_head
// + m (m < M), after the product's, writes row m's cache row: the latent
// copied, the rope key rotated (both the previous kernel's output, so read
// after griddep_enter, like A).
template <int M, int V>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 1)
    k_gemv_mla_rope_append(bf16 *__restrict__ q, int64_t ldq, const bf16 *__restrict__ A, int64_t lda,
                           const bf16 *__restrict__ W, int64_t K, const bf16 *c, int64_t ldc, const bf16 *kpe,
                           int64_t ldk, const int32_t *__restrict__ pos, const float *__restrict__ cosb,
                           const float *__restrict__ sinb, bf16 *const *__restrict__ rows, be_pages_t pg, int H, int qd,
                           int r_kv, int dr) {
    const int lane = threadIdx.x & 31, half = dr >> 1, dn = qd - dr, plain = (dn + 1) >> 1, per_head = plain + half;
    const int64_t u = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), pairs = (int64_t)H * per_head;
    if (u >= pairs) { // the cache append of row m (c and kpe are not restrict: they may lie in A's buffer)
        const int m = (int)(u - pairs);
        if (m >= M) return; // the whole warp
        griddep_enter();
        const int64_t p = pos[m];
        const float *cs = cosb + p * half, *sn = sinb + p * half;
        bf16 *row = rows[m] + cu_page_row(pg, m, p) * (int64_t)(r_kv + dr);
        for (int i = lane; i < r_kv; i += 32)
            row[i] = c[m * ldc + i];
        for (int j = lane; j < half; j += 32) {
            const float x0 = __bfloat162float(kpe[m * ldk + 2 * j]), x1 = __bfloat162float(kpe[m * ldk + 2 * j + 1]);
            row[r_kv + j] = __float2bfloat16_rn(x0 * cs[j] - x1 * sn[j]);
            row[r_kv + j + half] = __float2bfloat16_rn(x1 * cs[j] + x0 * sn[j]);
        }
        return;
    }
    const int h = (int)(u / per_head), t = (int)(u - (int64_t)h * per_head);
    // j: the q_pe pair (when rotate); col: W's first row of the pair within
    // the head; the outputs go to columns out and out + step. An odd d_nope's
    // last plain column has no partner (second false).
    const bool rotate = t >= plain;
    const int j = t - plain, col = rotate ? dn + 2 * j : 2 * t;
    const bool second = rotate || col + 1 < dn;
    const int out = rotate ? dn + j : col, step = rotate ? half : 1;
    const bf16 *w0 = W + ((int64_t)h * qd + col) * K, *w1 = second ? w0 + K : w0;
    const int64_t wbytes = (int64_t)H * qd * K * (int64_t)sizeof(bf16);
    warp_prefetch_l2(w0, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), wbytes), lane);
    if (second) warp_prefetch_l2(w1, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), wbytes), lane);
    griddep_enter();
    bf16 *dst = NULL;
    float cj = 0.0f, sj = 0.0f;
    if (lane < M) {
        dst = q + lane * ldq + (int64_t)h * qd + out;
        if (rotate) {
            const int64_t p = pos[lane];
            cj = cosb[p * half + j], sj = sinb[p * half + j];
        }
    }
    float s0[M], s1[M];
    gemv_warp_dot2<M, V>(s0, s1, A, lda, w0, w1, K, lane, nullptr, 0.0f);
#pragma unroll
    for (int m = 0; m < M; m++)
        if (lane == m) {
            dst[0] = __float2bfloat16_rn(rotate ? s0[m] * cj - s1[m] * sj : s0[m]);
            if (second) dst[step] = __float2bfloat16_rn(rotate ? s1[m] * cj + s0[m] * sj : s1[m]);
        }
}

static void cu_proj_swiglu(be_t *be, void *h, const void *x, int64_t ldx, const void *xw, float eps, const void *Wg,
                           const void *Wu, int64_t N, int64_t K, int64_t f) {
    if (N <= 0 || f <= 0) return;
    const bool v8 = (K | ldx) % 8 == 0 && !(((uintptr_t)x | (uintptr_t)xw | (uintptr_t)Wg | (uintptr_t)Wu) & 15);
    const bf16 *g = (const bf16 *)xw;
    const dim3 grid((unsigned)((f + GEMV_WARPS - 1) / GEMV_WARPS));
    cudaStream_t st = cuda_stream(be);
    for (int64_t r = 0; r < N; r += GEMV_ROWS) { // BE_FEW_ROWS rows per launch
        const int rows = (int)(N - r < (int64_t)GEMV_ROWS ? N - r : (int64_t)GEMV_ROWS);
        bf16 *hr = (bf16 *)h + r * f;
        const bf16 *xr = (const bf16 *)x + r * ldx;
        if (v8)
            GEMV_LAUNCH_M(rows, 8, k_gemv_swiglu, grid, st, hr, xr, ldx, g, eps, (const bf16 *)Wg, (const bf16 *)Wu, f,
                          K);
        else
            GEMV_LAUNCH_M(rows, 1, k_gemv_swiglu, grid, st, hr, xr, ldx, g, eps, (const bf16 *)Wg, (const bf16 *)Wu, f,
                          K);
    }
    cuda_check_launch(be, "k_gemv_swiglu");
}

static void cu_proj_add_rmsnorm(be_t *be, void *xn, void *x, const void *a, int64_t lda, const void *W, const void *w,
                                int64_t N, int64_t K, int d, float eps) {
    if (N <= 0 || d <= 0) return;
    cuda_impl_t *ci = cuda_impl(be);
    const uintptr_t addr = (uintptr_t)a | (uintptr_t)W | (uintptr_t)x | (uintptr_t)xn | (uintptr_t)w;
    const bool v8 = (K | lda | (int64_t)d) % 8 == 0 && !(addr & 15);
    int64_t blocks = ((int64_t)d + GEMV_WARPS - 1) / GEMV_WARPS;
    const dim3 grid((unsigned)(blocks < (int64_t)CUDA_NORM_BLOCKS ? blocks : (int64_t)CUDA_NORM_BLOCKS));
    cudaStream_t st = cuda_stream(be);
    for (int64_t r = 0; r < N; r += GEMV_ROWS) { // BE_FEW_ROWS rows per launch
        const int rows = (int)(N - r < (int64_t)GEMV_ROWS ? N - r : (int64_t)GEMV_ROWS);
        bf16 *xr = (bf16 *)x + r * d, *xnr = w ? (bf16 *)xn + r * d : NULL;
        const bf16 *ar = (const bf16 *)a + r * lda;
        if (v8)
            GEMV_LAUNCH_M(rows, 8, k_gemv_add_rmsnorm, grid, st, xnr, xr, ar, lda, (const bf16 *)W, (const bf16 *)w, d,
                          K, eps, ci->norm_done, ci->norm_partial);
        else
            GEMV_LAUNCH_M(rows, 1, k_gemv_add_rmsnorm, grid, st, xnr, xr, ar, lda, (const bf16 *)W, (const bf16 *)w, d,
                          K, eps, ci->norm_done, ci->norm_partial);
    }
    cuda_check_launch(be, "k_gemv_add_rmsnorm");
}

static void cu_proj_rope_kv_append(be_t *be, void *q, int64_t ldq, const void *x, int64_t ldx, const void *xw,
                                   float eps, const void *W, const int32_t *pos, const float *cosb, const float *sinb,
                                   void *const *k_rows, void *const *v_rows, be_pages_t pg, int N, int64_t K, int H,
                                   int Hkv, int dh) {
    if (N <= 0) return;
    if (dh <= 0 || dh % 2 || H <= 0 || Hkv <= 0 || K <= 0) {
        cu_op_error(be, "cuda proj_rope_kv_append: H=%d Hkv=%d dh=%d K=%lld not supported (dh even, all positive)", H,
                    Hkv, dh, (long long)K);
        return;
    }
    const bool v8 = (K | ldx) % 8 == 0 && !(((uintptr_t)x | (uintptr_t)xw | (uintptr_t)W) & 15);
    const bf16 *g = (const bf16 *)xw;
    const int64_t pairs = (int64_t)(H + 2 * Hkv) * (dh / 2); // one warp each
    const dim3 grid((unsigned)((pairs + GEMV_WARPS - 1) / GEMV_WARPS));
    cudaStream_t st = cuda_stream(be);
    for (int r = 0; r < N; r += GEMV_ROWS) { // BE_FEW_ROWS rows per launch
        const int rows = N - r < GEMV_ROWS ? N - r : GEMV_ROWS;
        bf16 *qr = (bf16 *)q + r * ldq;
        const bf16 *xr = (const bf16 *)x + r * ldx;
        bf16 *const *kr = (bf16 *const *)k_rows + r, *const *vr = (bf16 *const *)v_rows + r;
        const be_pages_t pr = {pg.pages ? pg.pages + r * pg.stride : NULL, pg.stride};
        if (v8)
            GEMV_LAUNCH_M(rows, 8, k_gemv_rope_kv_append, grid, st, qr, ldq, xr, ldx, g, eps, (const bf16 *)W, K,
                          pos + r, cosb, sinb, kr, vr, pr, H, Hkv, dh);
        else
            GEMV_LAUNCH_M(rows, 1, k_gemv_rope_kv_append, grid, st, qr, ldq, xr, ldx, g, eps, (const bf16 *)W, K,
                          pos + r, cosb, sinb, kr, vr, pr, H, Hkv, dh);
    }
    cuda_check_launch(be, "k_gemv_rope_kv_append");
}

static void cu_proj_mla_rope_append(be_t *be, void *q, int64_t ldq, const void *x, int64_t ldx, const void *W,
                                    const void *c, int64_t ldc, const void *kpe, int64_t ldk, const int32_t *pos,
                                    const float *cosb, const float *sinb, void *const *rows, be_pages_t pg, int N,
                                    int64_t K, int H, int qd, int r_kv, int dr) {
    if (N <= 0) return;
    if (dr <= 0 || dr % 2 || qd < dr || H <= 0 || r_kv < 0 || K <= 0) {
        cu_op_error(be,
                    "cuda proj_mla_rope_append: H=%d qd=%d r_kv=%d dr=%d K=%lld not supported (dr even and positive, "
                    "qd >= dr, H and K positive)",
                    H, qd, r_kv, dr, (long long)K);
        return;
    }
    const bool v8 = (K | ldx) % 8 == 0 && !(((uintptr_t)x | (uintptr_t)W) & 15);
    const int64_t pairs = (int64_t)H * ((qd - dr + 1) / 2 + dr / 2); // one warp each, then one per row's append
    cudaStream_t st = cuda_stream(be);
    for (int r = 0; r < N; r += GEMV_ROWS) { // BE_FEW_ROWS rows per launch
        const int n = N - r < GEMV_ROWS ? N - r : GEMV_ROWS;
        const dim3 grid((unsigned)((pairs + n + GEMV_WARPS - 1) / GEMV_WARPS));
        bf16 *qr = (bf16 *)q + r * ldq;
        const bf16 *xr = (const bf16 *)x + r * ldx, *cr = (const bf16 *)c + r * ldc, *kr = (const bf16 *)kpe + r * ldk;
        bf16 *const *rr = (bf16 *const *)rows + r;
        const be_pages_t pr = {pg.pages ? pg.pages + r * pg.stride : NULL, pg.stride};
        if (v8)
            GEMV_LAUNCH_M(n, 8, k_gemv_mla_rope_append, grid, st, qr, ldq, xr, ldx, (const bf16 *)W, K, cr, ldc, kr,
                          ldk, pos + r, cosb, sinb, rr, pr, H, qd, r_kv, dr);
        else
            GEMV_LAUNCH_M(n, 1, k_gemv_mla_rope_append, grid, st, qr, ldq, xr, ldx, (const bf16 *)W, K, cr, ldc, kr,
                          ldk, pos + r, cosb, sinb, rr, pr, H, qd, r_kv, dr);
    }
    cuda_check_launch(be, "k_gemv_mla_rope_append");
}

// ---- greedy decoding: the argmax of each row -------------------------------
// A row of logits (49,152 to 128,256 values) read by one block took ~9 us on
// an H100 (one SM's bandwidth); here a row's slices of at least ARGMAX_SLICE
// values go to their own blocks, each writes its (value, index), and the
// last block of the row (a counter, reset by it) merges them and writes the
// id. With a host ring the last row to finish flips the turn.
enum {
    ARGMAX_THREADS = 256,
    ARGMAX_SLICE = 4096,                           // values a block at least (a multiple of 8 * ARGMAX_THREADS / 16)
    ARGMAX_MAX_SLICES = 128,                       // more values a block past ARGMAX_MAX_SLICES * ARGMAX_SLICE
    ARGMAX_ROWS = BE_ARGMAX_RING_ROWS,             // rows a launch (the counters' room)
    ARGMAX_PAIRS = ARGMAX_ROWS * ARGMAX_MAX_SLICES // (value, index) partials (k_gemv_argmax's too)
};

// The counters (one per row, then the rows done, then k_gemv_argmax's
// blocks done), then ARGMAX_PAIRS values and as many indices.
size_t argmax_state_bytes(void) { return (size_t)(ARGMAX_ROWS + 2) * sizeof(unsigned) + (size_t)ARGMAX_PAIRS * 8; }

// Keeps (v, i) in (bv, bi) when it beats it: larger, or equal at a smaller
// index (the first of equal maxima, as cpu_argmax_rows); a NaN never; bi < 0:
// nothing kept yet.
static __device__ __forceinline__ void argmax_keep(float &bv, int &bi, float v, int i) {
    if (v == v && (bi < 0 || v > bv || (v == bv && i < bi))) bv = v, bi = i;
}

// The block's (bv, bi) into thread 0's (any block of whole warps, at most
// 32); ends with a barrier, so that it may be called again at once.
static __device__ __forceinline__ void argmax_block(float &bv, int &bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0) argmax_keep(bv, bi, ov, oi);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (si[w] >= 0) argmax_keep(bv, bi, sv[w], si[w]);
    __syncthreads();
}

// Block (s, n): values [s span, (s + 1) span) of row n (span a multiple of 8;
// 16-byte loads where vec), then the row's last block merges the slices.
__global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax_rows(int32_t *__restrict__ ids, int32_t *ring, int64_t stride, int32_t *turn, const bf16 *__restrict__ x,
                  int64_t ld, int V, int span, int vec, unsigned *count) {
    __shared__ bool last;
    griddep_enter(); // a programmatic dependent launch (cuda_vec.cuh): x is the head's output
    const int s = blockIdx.x, n = blockIdx.y, slices = gridDim.x;
    const bf16 *row = x + (int64_t)n * ld;
    const int v0 = s * span, v1 = V - v0 < span ? V : v0 + span;
    float bv = 0.0f;
    int bi = -1, i = v0 + threadIdx.x * 8;
    if (vec)
        for (; i + 8 <= v1; i += ARGMAX_THREADS * 8) {
            float w[8];
            ld_bf16<8>(row + i, w);
#pragma unroll
            for (int j = 0; j < 8; j++)
                argmax_keep(bv, bi, w[j], i + j);
        }
    for (i = (vec ? v0 + (v1 - v0) / 8 * 8 : v0) + threadIdx.x; i < v1; i += ARGMAX_THREADS)
        argmax_keep(bv, bi, __bfloat162float(row[i]), i);
    argmax_block(bv, bi);
    float *part_v = (float *)(count + ARGMAX_ROWS + 2);
    int *part_i = (int *)(part_v + ARGMAX_PAIRS);
    if (threadIdx.x == 0) {
        part_v[n * ARGMAX_MAX_SLICES + s] = bv, part_i[n * ARGMAX_MAX_SLICES + s] = bi;
        __threadfence(); // the partial before the count that announces it
        last = atomicAdd(&count[n], 1u) == (unsigned)slices - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence(); // every other slice's partial after its count
    count[n] = 0;
    bv = 0.0f, bi = -1;
    for (int k = 0; k < slices; k++) { // in slice order (the first of equal maxima stays), past L1
        const int pi = __ldcg(&part_i[n * ARGMAX_MAX_SLICES + k]);
        if (pi >= 0) argmax_keep(bv, bi, __ldcg(&part_v[n * ARGMAX_MAX_SLICES + k]), pi);
    }
    const int32_t id = bi < 0 ? 0 : bi;
    ids[n] = id;
    if (!ring) return;
    ring[*turn * stride + n] = id;
    __threadfence_system();                                    // the host's copy before the row counts as done
    if (atomicAdd(&count[ARGMAX_ROWS], 1u) == gridDim.y - 1) { // every row's last block has read the turn
        count[ARGMAX_ROWS] = 0;
        *turn ^= 1;
    }
}

static void cu_argmax_rows(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x,
                           int64_t ld, int64_t N, int64_t V) {
    if (N <= 0) return;
    if (V < 1 || V > INT32_MAX || ld < V || (ring && (N > ARGMAX_ROWS || stride < N || !turn))) {
        cu_op_error(be,
                    "cuda argmax_rows: N=%lld V=%lld ld=%lld stride=%lld not supported (V >= 1, ld >= V; with a "
                    "ring N <= %d, stride >= N and a turn)",
                    (long long)N, (long long)V, (long long)ld, (long long)stride, ARGMAX_ROWS);
        return;
    }
    const int64_t per = (V + ARGMAX_MAX_SLICES - 1) / ARGMAX_MAX_SLICES, least = ARGMAX_SLICE;
    const int span = (int)((per > least ? per : least) + 7) / 8 * 8;
    const int slices = (int)((V + span - 1) / span);
    const int vec = ld % 8 == 0 && !((uintptr_t)x & 15);
    for (int64_t r = 0; r < N; r += ARGMAX_ROWS) {
        const int64_t rows = ARGMAX_ROWS, n = N - r < rows ? N - r : rows;
        cu_launch_pdl(k_argmax_rows, dim3((unsigned)slices, (unsigned)n), dim3(ARGMAX_THREADS), 0, cuda_stream(be),
                      ids + r, ring, stride, turn, (const bf16 *)x + r * ld, ld, (int)V, span, vec,
                      cuda_impl(be)->argmax_count);
    }
    cuda_check_launch(be, "k_argmax_rows");
}

// ---- a greedy step's head: logits and their argmax in one launch ----------
// proj_rmsnorm_argmax. Production: proj_rmsnorm into the scratch arena, then
// argmax_rows. The bench-variants build's HYLO_HEAD_ARGMAX=1 runs one kernel
// instead, k_gemv_argmax (bench-only: it passed on an H100 in run 35 but saved
// about 1 us a token, docs/PERFORMANCE.md): the logits are k_gemv's normed product, the same fp32
// sums in the same order, rounded to bf16 (so the ids argmax_rows takes
// from proj_rmsnorm's logits), and never stored. Warp u takes columns
// u * CW * groups on, CW at a time (as k_gemv_cols: A's rows read once for
// them), every lane keeping each row's best; the block's best per
// row goes to the partials (at most HA_BLOCKS blocks), and the last block
// merges them, writes the ids and the ring, and flips the turn. The head of
// a greedy step so skips a launch and the argmax's own wait for the product.
enum { HA_COLS = 4, HA_BLOCKS = ARGMAX_PAIRS / GEMV_ROWS };

#ifdef HYLO_BENCH_VARIANTS
template <int M, int CW>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_argmax(int32_t *__restrict__ ids, int32_t *ring, int64_t stride, int32_t *turn, const bf16 *__restrict__ A,
                  int64_t lda, const bf16 *__restrict__ xw, float eps, const bf16 *__restrict__ W, int64_t N, int64_t K,
                  int groups, unsigned *count) {
    __shared__ float wv[GEMV_WARPS][M];
    __shared__ int wi[GEMV_WARPS][M];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * CW * groups;
    for (int64_t c = n0; c < n0 + CW * groups && c < N; c++)
        warp_prefetch_l2(W + c * K, gemv_prefetch_bytes(K * (int64_t)sizeof(bf16), N * K * (int64_t)sizeof(bf16)),
                         lane);
    griddep_enter();
    float bv[M];
    int bi[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        bv[m] = 0.0f, bi[m] = -1;
    for (int g = 0; g < groups; g++) {
        const int64_t nb = n0 + (int64_t)g * CW;
        if (nb >= N) break; // the whole warp
        const int nc = N - nb < CW ? (int)(N - nb) : CW;
        const bf16 *w[CW];
#pragma unroll
        for (int c = 0; c < CW; c++)
            w[c] = W + (nb + (c < nc ? c : nc - 1)) * K;
        float acc[CW][M] = {}, ss[M] = {}, rs[M];
        gemv_lane_dotr<M, CW>(acc, ss, A, lda, w, K, lane, xw);
#pragma unroll
        for (int m = 0; m < M; m++)
            rs[m] = gemv_norm_scale(ss[m], K, eps);
#pragma unroll
        for (int c = 0; c < CW; c++) {
            if (c >= nc) break;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float v = __bfloat162float(__float2bfloat16_rn(warp_sum(acc[c][m]) * rs[m]));
                argmax_keep(bv[m], bi[m], v, (int)(nb + c));
            }
        }
    }
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < M; m++)
            wv[warp][m] = bv[m], wi[warp][m] = bi[m];
    __syncthreads();
    float *part_v = (float *)(count + ARGMAX_ROWS + 2);
    int *part_i = (int *)(part_v + ARGMAX_PAIRS);
    if (threadIdx.x == 0) {
        for (int m = 0; m < M; m++) {
            float v = wv[0][m];
            int i = wi[0][m];
            for (int k = 1; k < GEMV_WARPS; k++)
                if (wi[k][m] >= 0) argmax_keep(v, i, wv[k][m], wi[k][m]);
            part_v[m * HA_BLOCKS + blockIdx.x] = v, part_i[m * HA_BLOCKS + blockIdx.x] = i;
        }
        __threadfence(); // the partials before the count that announces them
        last = atomicAdd(&count[ARGMAX_ROWS + 1], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); // every other block's partials after its count
    const int t = *turn;
    for (int m = 0; m < M; m++) {
        float v = 0.0f;
        int i = -1;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
            const int pi = __ldcg(&part_i[m * HA_BLOCKS + b]);
            if (pi >= 0) argmax_keep(v, i, __ldcg(&part_v[m * HA_BLOCKS + b]), pi);
        }
        argmax_block(v, i);
        if (threadIdx.x == 0) {
            const int32_t id = i < 0 ? 0 : i;
            ids[m] = id;
            if (ring) ring[t * stride + m] = id;
        }
    }
    if (threadIdx.x == 0) {
        count[ARGMAX_ROWS + 1] = 0;
        if (ring) {
            __threadfence_system(); // the host's copies before the step counts as done
            *turn = t ^ 1;
        }
    }
}

#endif

static void cu_proj_rmsnorm_argmax(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x,
                                   int64_t ldx, const void *xw, float eps, const void *W, int64_t N, int64_t K,
                                   int64_t V) {
    if (N <= 0) return;
    if (V < 1 || V > INT32_MAX || K < 1 || !xw || (ring && (N > ARGMAX_ROWS || stride < N || !turn))) {
        cu_op_error(be,
                    "cuda proj_rmsnorm_argmax: N=%lld K=%lld V=%lld stride=%lld not supported (K, V >= 1, a gain; "
                    "with a ring N <= %d, stride >= N and a turn)",
                    (long long)N, (long long)K, (long long)V, (long long)stride, ARGMAX_ROWS);
        return;
    }
    bool fused = N <= GEMV_ROWS && gemv_fits(0, 1, 1, V, K, x, ldx, 0, W, K, 0, 0.0f, 1) && !((uintptr_t)xw & 15);
#ifdef HYLO_BENCH_VARIANTS
    fused = fused && cu_env_int("HYLO_HEAD_ARGMAX", 0) == 1; // k_gemv_argmax (bench-only, above)
#else
    fused = false;
#endif
    if (!fused) { // the two ops: the logits in the scratch arena
        const size_t mark = arena_mark(&be->scratch);
        void *lg = cu_scratch_try(be, (size_t)N * V * sizeof(bf16));
        if (!lg) {
            cu_op_error(be, "cuda proj_rmsnorm_argmax: scratch arena too small for %lld x %lld logits", (long long)N,
                        (long long)V);
            return;
        }
        be->proj_rmsnorm(be, lg, x, ldx, xw, eps, W, N, K, V);
        cu_argmax_rows(be, ids, ring, stride, turn, lg, V, N, V);
        arena_reset(&be->scratch, mark); // stream order protects the logits from later users
        return;
    }
#ifdef HYLO_BENCH_VARIANTS
    // columns a block: HA_COLS a warp, `groups` times, in at most HA_BLOCKS blocks
    const int64_t per_block = (int64_t)GEMV_WARPS * HA_COLS, blocks1 = (V + per_block - 1) / per_block;
    const int groups = (int)((blocks1 + HA_BLOCKS - 1) / HA_BLOCKS);
    const int64_t blocks = (V + per_block * groups - 1) / (per_block * groups);
    // (GEMV_LAUNCH_M's second argument is the kernel's second template argument: CW, the columns a warp at a time)
    GEMV_LAUNCH_M((int)N, HA_COLS, k_gemv_argmax, dim3((unsigned)blocks), cuda_stream(be), ids, ring, stride, turn,
                  (const bf16 *)x, ldx, (const bf16 *)xw, eps, (const bf16 *)W, V, K, groups,
                  cuda_impl(be)->argmax_count);
    cuda_check_launch(be, "k_gemv_argmax");
#endif
}

static void cu_gemm(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc) {
    if (gemv_gemm(be, transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1)) return;
    lt_gemm(be, transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 0);
}

// y = rmsnorm(x; xw) W^T for a decode step's few rows: k_gemv / k_gemv_cols
// norm the rows inside the product (no launch, no pass over them), with
// 16-byte loads where rows, weights and gain allow (the model's residual
// stream always does), else k_gemv one value a lane, as proj_swiglu.
static void cu_proj_rmsnorm(be_t *be, void *y, const void *x, int64_t ldx, const void *xw, float eps, const void *W,
                            int64_t N, int64_t K, int64_t out) {
    if (N <= 0 || out <= 0) return;
    const bool v8 = gemv_fits(0, 1, 1, out, K, x, ldx, 0, W, K, 0, 0.0f, 1) && !((uintptr_t)xw & 15);
    const dim3 grid((unsigned)((out + GEMV_WARPS - 1) / GEMV_WARPS));
    for (int64_t r = 0; r < N; r += GEMV_ROWS) { // BE_FEW_ROWS rows per launch
        const int64_t rows = N - r < (int64_t)GEMV_ROWS ? N - r : (int64_t)GEMV_ROWS;
        const bf16 *xr = (const bf16 *)x + r * ldx;
        bf16 *yr = (bf16 *)y + r * out;
        if (v8)
            gemv(be, rows, out, K, 1.0f, xr, ldx, 0, W, K, 0, yr, out, 0, 1, xw, eps);
        else
            GEMV_LAUNCH_M((int)rows, 1, k_gemv, grid, cuda_stream(be), yr, out, (int64_t)0, xr, ldx, (int64_t)0,
                          (const bf16 *)W, K, (int64_t)0, out, K, 1.0f, (const bf16 *)xw, eps);
    }
    if (!v8) cuda_check_launch(be, "k_gemv");
}

static void cu_gemm_f32out(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                           const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    lt_gemm(be, transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1, 1);
}

static void cu_gemm_batched(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                            const void *A, int64_t lda, int64_t strideA, const void *B, int64_t ldb, int64_t strideB,
                            float beta, void *C, int64_t ldc, int64_t strideC, int64_t batch) {
    int lt = 0; // the bench-variants build's HYLO_BATCHED_LT = 1: cuBLASLt for every shape, to compare
#ifdef HYLO_BENCH_VARIANTS
    lt = cu_env_int("HYLO_BATCHED_LT", 0);
#endif
    if (!lt &&
        gemv_gemm(be, transA, transB, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch))
        return;
    lt_gemm(be, transA, transB, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch, 0);
}

extern "C" void cuda_register_core(be_t *be) {
#ifdef HYLO_BENCH_VARIANTS
    const int64_t cap = cu_env_int("HYLO_GEMV_PREFETCH", -1);
    if (cudaMemcpyToSymbol(g_gemv_prefetch_cap, &cap, sizeof cap) != cudaSuccess) (void)cudaGetLastError();
#endif
    be->add = cu_add;
    be->scale = cu_scale;
    be->copy2d = cu_copy2d;
    be->copy_pages = cu_copy_pages;
    be->gemm = cu_gemm;
    be->gemm_f32out = cu_gemm_f32out;
    be->gemm_batched = cu_gemm_batched;
    be->proj_swiglu = cu_proj_swiglu;
    be->proj_add_rmsnorm = cu_proj_add_rmsnorm;
    be->proj_rmsnorm = cu_proj_rmsnorm;
    be->proj_rope_kv_append = cu_proj_rope_kv_append;
    be->proj_mla_rope_append = cu_proj_mla_rope_append;
    be->argmax_rows = cu_argmax_rows;
    be->proj_rmsnorm_argmax = cu_proj_rmsnorm_argmax;
    be->embed_fwd = cu_embed_fwd;
    be->embed_bwd = cu_embed_bwd;
}
