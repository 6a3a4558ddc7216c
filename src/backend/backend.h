// The device: memory and the op set, as a table of functions chosen at run time
// (--device cpu|cuda). model/ calls only through this table and never knows
// which device it runs on.
//
// Dtypes. Every op argument is one of:
//   act    `void *`  the backend's activation dtype (be->act_dtype): fp32 on the
//                    CPU, bf16 on CUDA. Activations, activation gradients and
//                    the working copy of the weights are act.
//   float  `float *` always fp32: weight gradients (accumulated with +=),
//                    recurrent states, decays, beta, norms' saved rstd, lse,
//                    losses, optimizer state.
//   int    `int32_t *` token ids, targets.
// All pointers are device pointers. All shapes are row-major, leftmost slowest,
// written [B, T, H, dh] in comments; N is a row count (usually B*T). Sizes that
// can exceed 2^31 are int64_t.
//
// Conventions. "dX" outputs of a backward op are overwritten unless the op says
// "+=" (weight gradients always accumulate, so gradient accumulation over
// micro-batches is free). Ops never allocate device memory except through the
// scratch arena passed in `be->scratch`, which the caller resets.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { BE_CPU = 0, BE_CUDA = 1 };
enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

// RoPE pair conventions.
enum {
    ROPE_NEOX = 0,       // HF Llama/Qwen rotate_half: pairs (i, i + dr/2), in place
    ROPE_INTERLEAVED = 1 // MLA (DeepSeek as in Zebra-Llama): pairs (2j, 2j+1) in the
                         // input, result stored de-interleaved [evens' outputs | odds' outputs]
};

// Gated RMSNorm variants.
enum {
    GNORM_NORM_THEN_GATE = 0, // GDN: y = rmsnorm(x) * w * silu(z)
    GNORM_GATE_THEN_NORM = 1  // Mamba-2 (norm_before_gate=False): y = rmsnorm(x * silu(z)) * w
};

// Per-row distances of the layer-wise distillation loss (ild_dist).
enum { DIST_L2 = 0, DIST_MSE = 1 };

typedef struct be be_t;

// The most rows a decode step's fused projections (proj_swiglu,
// proj_add_rmsnorm, proj_rope_kv_append) take in one launch on CUDA (their
// one-warp-per-column product reads the weights once for this many rows); a
// step with more rows takes the separate products, whose tiles reuse the
// weights across rows.
enum { BE_FEW_ROWS = 8 };

// The paged cache: a sequence's cache rows in pages of BE_PAGE_ROWS rows, a
// whole number of every decode kernel's tiles (attn_decode reads a slice in
// steps of 16 rows or fewer, MLA decode in tiles of 32), so that a step of
// rows never straddles two pages. A decode step's page tables: row u of the
// sequence of step row r is row
//   pages[r * stride + u / BE_PAGE_ROWS] * BE_PAGE_ROWS + u % BE_PAGE_ROWS
// of the rows that start at its base pointer (the page pool of its layer).
// pages NULL: every row's cache is contiguous, row u is row u (a cache of
// consecutive pages, without a table to read).
enum { BE_PAGE_ROWS = 256 };

// The most rows argmax_rows writes into a host ring in one call.
enum { BE_ARGMAX_RING_ROWS = 64 };
typedef struct {
    const int32_t *pages; // device int32 [N, stride], or NULL
    int64_t stride;       // pages per step row
} be_pages_t;

// row(r, u) above, for code that reads the tables where they are (the CPU
// backend, whose device memory is the host's).
static inline int64_t be_page_row(be_pages_t pg, int64_t r, int64_t u) {
    if (!pg.pages) return u;
    return (int64_t)pg.pages[r * pg.stride + u / BE_PAGE_ROWS] * BE_PAGE_ROWS + u % BE_PAGE_ROWS;
}

// Packed sequences of different lengths (a batched prefill's requests):
// sequence s of n has rows [cu[s], cu[s + 1]) of the packed inputs, cu[0] =
// 0, each at least 0 rows. cu is a host array: the CPU backend loops over it,
// CUDA passes it to its kernels by value or groups by it.
typedef struct {
    int n;
    const int32_t *cu; // host [n + 1]
} be_seqs_t;

// A weight matrix W [rows, cols] kept in its file's storage format for
// inference (CPU: the ggml block formats of a GGUF, or bf16), instead of the
// act copy. type: a ggml type number (io/gguf.h enum ggml_type); row r is
// row_bytes bytes at data + r * row_bytes (host memory, the file's mapping or
// a copy). cols is a multiple of the format's block size.
typedef struct {
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
    const void *data;
} be_qmat_t;

struct be {
    int kind;      // BE_CPU or BE_CUDA
    int act_dtype; // DT_F32 (cpu) or DT_BF16 (cuda)
    size_t act_size;
    const char *name;
    arena_t scratch; // per-op temporaries on the device; reset by the caller
    void *impl;      // backend private state (cuBLASLt handle, stream, ...)
    // 1: reductions that CUDA kernels do with atomic adds in the order the
    // blocks happen to run are done in a fixed order instead (attention's dQ:
    // the key tiles add in turn), so a run repeats bit for bit, a little
    // slower. The CPU backend is always deterministic. Default 0.
    int deterministic;

    // ---- memory -------------------------------------------------------------
    void *(*alloc)(be_t *be, size_t bytes); // NULL + error slot on failure
    void (*free)(be_t *be, void *p);
    int (*memset0)(be_t *be, void *p, size_t bytes);
    int (*copy_h2d)(be_t *be, void *dst, const void *src, size_t bytes);
    int (*copy_d2h)(be_t *be, void *dst, const void *src, size_t bytes);
    int (*copy_d2d)(be_t *be, void *dst, const void *src, size_t bytes);
    // Host memory that device results are copied into (logits): page-locked
    // on CUDA (cudaMallocHost), so that a copy runs at the bus's rate instead
    // of through the driver's staging buffer; the CPU backend's alloc on the
    // CPU. NULL + error slot on failure; host_free(NULL) does nothing.
    void *(*host_alloc)(be_t *be, size_t bytes);
    void (*host_free)(be_t *be, void *p);
    // Queues a copy from host memory of host_alloc's and returns: src must
    // stay as it is until the device has done the copy (the next sync; later
    // work on the device is ordered after it). copy_h2d waits for its copy,
    // a round trip to the device each (a decode step's inputs took three).
    int (*copy_h2d_async)(be_t *be, void *dst, const void *src, size_t bytes);
    // Points in the queue of work, so that the host waits for one step of
    // several it queued: fence_new makes a fence (NULL + error slot on
    // failure), fence_mark(f) names all work queued so far f (its mark before
    // forgotten), fence_wait(f) waits until the device has done it and
    // reports asynchronous errors as sync does (a fence never marked: at
    // once). The CPU does work as it is queued: mark and wait return at once.
    void *(*fence_new)(be_t *be);
    int (*fence_mark)(be_t *be, void *f);
    int (*fence_wait)(be_t *be, void *f);
    void (*fence_free)(be_t *be, void *f); // NULL: nothing
    // Optional (NULL: nothing happens): nothing in [p, p + bytes) is needed any
    // more, and the whole pages inside it may go back to the system until they
    // are written again (CPU: madvise DONTNEED; their bytes are then undefined).
    void (*discard)(be_t *be, void *p, size_t bytes);
    // Bytes the device can still allocate now (CUDA: cudaMemGetInfo's free;
    // CPU: MemAvailable of /proc/meminfo); -1 when unknown. For plans that
    // size themselves to the machine (hylo serve's cache budget).
    int64_t (*mem_free)(be_t *be);
    // host fp32 <-> device act (conversion happens on the way)
    int (*upload_act)(be_t *be, void *dst, const float *src, int64_t n);
    int (*download_act)(be_t *be, float *dst, const void *src, int64_t n);
    int (*sync)(be_t *be); // waits for queued work; reports asynchronous errors
    void (*destroy)(be_t *be);
    // Recorded op sequences (CUDA graphs; NULL on backends without them): a
    // decode step's hundreds of small launches replayed as one. graph_begin:
    // the ops queued from now on are recorded instead of run (nothing that
    // waits for the device may be called until graph_end). graph_end: stops
    // recording; *g becomes an executable replay of what was recorded (the
    // one *g held updated in place when it has the same shape, else freed and
    // replaced), or, when an op could not be recorded or failed
    // while recording, an error and *g as it was (nothing recorded ran, and the
    // failure is not reported again by sync). graph_launch queues a replay:
    // the same ops with the same arguments, over what device memory holds now.
    int (*graph_begin)(be_t *be);
    int (*graph_end)(be_t *be, void **g);
    int (*graph_launch)(be_t *be, void *g);
    void (*graph_free)(be_t *be, void *g);

    // ---- elementwise and copies ---------------------------------------------
    // y += x (act)
    void (*add)(be_t *be, void *y, const void *x, int64_t n);
    // y = a * x (act), may alias
    void (*scale)(be_t *be, void *y, const void *x, float a, int64_t n);
    // 2-D strided copy of act rows: dst[r*ldd + c] (=|+=) src[r*lds + c], c < cols.
    // Serves every split / concat / broadcast of a projection output.
    void (*copy2d)(be_t *be, void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows, int64_t cols,
                   int accumulate);
    // Rows of one sequence of a paged cache and a dense buffer: row i < rows
    // of x (ldx apart) and the sequence's row u0 + i, which is row
    // pages[(u0 + i) / BE_PAGE_ROWS] * BE_PAGE_ROWS + (u0 + i) % BE_PAGE_ROWS of
    // pool (rows ld apart); cols elements of each. pages: the sequence's page
    // table, a host array. to_pool 1: x into the pool (an append), 0: the
    // pool's rows into x (a gather). CUDA: one launch per 512 pages (the
    // pages ride in the kernel parameters), where a copy per run of
    // consecutive pages was one host-issued copy each.
    void (*copy_pages)(be_t *be, void *x, int64_t ldx, void *pool, int64_t ld, const int32_t *pages, int64_t u0,
                       int64_t rows, int64_t cols, int to_pool);

    // ---- matrix products (row-major; cuBLASLt / OpenBLAS) -------------------
    // C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T, all act.
    // lda/ldb/ldc are row strides in elements of the matrices as stored.
    void (*gemm)(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc);
    // Same with a float C (weight gradients: beta = 1 accumulates in fp32).
    void (*gemm_f32out)(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                        int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc);
    // batch of independent products with constant strides between matrices.
    void (*gemm_batched)(be_t *be, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                         int64_t lda, int64_t strideA, const void *B, int64_t ldb, int64_t strideB, float beta, void *C,
                         int64_t ldc, int64_t strideC, int64_t batch);

    // ---- quantised weights (inference; NULL on backends without them) ----
    // y[N, W->rows] = x[N, W->cols] W^T, x and y act. On the CPU, with few
    // rows (decode) block formats take x quantised on the fly to 8-bit blocks
    // of 32 (one fp32 scale each), so the result differs from the dequantised
    // weights' product by that rounding; with many (prefill) the CPU
    // dequantises the matrix and the product is exact (see cpu_quant.c). CUDA
    // does the same, its dequantised weights rounded to bf16 (cuda_quant.cu).
    void (*qmatmul)(be_t *be, void *y, const void *x, const be_qmat_t *W, int64_t N);
    // A decode step's product on a block-format matrix with the ops around
    // it: x [N, W->cols] (rows ldx apart), RMS-normalised with gain xw first
    // when xw is not NULL (rmsnorm_fwd's formula, eps), or SwiGLU(x, xu)
    // (swiglu_fwd; up rows xu, ldx apart) when xu is not NULL (one of the
    // two at most), times W^T, into y [N, W->rows] (res NULL) or added to res
    // [N, W->rows] (y NULL). The same results as rmsnorm_fwd or swiglu_fwd,
    // qmatmul and add, but for roundings: CUDA keeps the normed rows and the
    // product in fp32 (the sum rounded once). One launch on CUDA for N <=
    // BE_FEW_ROWS (any N works there too).
    void (*qproj)(be_t *be, void *y, void *res, const void *x, const void *xu, int64_t ldx, const void *xw, float eps,
                  const be_qmat_t *W, int64_t N);
    // out[N, W->cols] = rows ids[n] of W, dequantised (a quantised embedding table).
    void (*qembed_fwd)(be_t *be, void *out, const be_qmat_t *W, const int32_t *ids, int64_t N);

    // ---- embedding ----------------------------------------------------------
    // out[N,d] = table[ids[n]]
    void (*embed_fwd)(be_t *be, void *out, const void *table, const int32_t *ids, int64_t N, int d);
    // dtable[ids[n]] += dout[n] (float)
    void (*embed_bwd)(be_t *be, float *dtable, const void *dout, const int32_t *ids, int64_t N, int d);

    // ---- norms --------------------------------------------------------------
    // out[N,d] = x / sqrt(mean(x^2) + eps) * w; rstd[N] saved (may be NULL in inference)
    void (*rmsnorm_fwd)(be_t *be, void *out, float *rstd, const void *x, const void *w, int64_t N, int d, float eps);
    // The residual add fused with the next norm: x += y (act, rounded), then
    // out = rmsnorm(x) as rmsnorm_fwd. Same results as add then rmsnorm_fwd.
    void (*add_rmsnorm_fwd)(be_t *be, void *out, float *rstd, void *x, const void *y, const void *w, int64_t N, int d,
                            float eps);
    // A decode step's output projection fused with the residual add and the
    // next norm: x[N, d] += a[N, K] W[d, K]^T (a rows lda apart), then, when w
    // is not NULL, xn[N, d] = rmsnorm(x) with gain w as rmsnorm_fwd; w NULL:
    // the add alone (after the last layer). x, xn contiguous, xn != x. The
    // same results as gemm into y, then add_rmsnorm_fwd (or add), but for the
    // rounding of y: CUDA adds the product to x in fp32 and rounds once. One
    // launch on CUDA for N <= BE_FEW_ROWS (any N works, in launches of that
    // many rows).
    void (*proj_add_rmsnorm)(be_t *be, void *xn, void *x, const void *a, int64_t lda, const void *W, const void *w,
                             int64_t N, int64_t K, int d, float eps);
    // y [N, out] contiguous = rmsnorm(x) W^T: x [N, K] (rows ldx apart)
    // RMS-normalised with gain xw (rmsnorm_fwd's formula, eps), then times W
    // [out, K]^T: a decode step's first product fed the residual stream (a
    // GDN layer's input projections, MLA's q_a and kv_a), as proj_swiglu.
    // The same results as rmsnorm_fwd then gemm, but for the norm's rounding:
    // CUDA keeps the normed rows in fp32. One launch on CUDA for N <=
    // BE_FEW_ROWS (any N works, in launches of that many rows).
    void (*proj_rmsnorm)(be_t *be, void *y, const void *x, int64_t ldx, const void *xw, float eps, const void *W,
                         int64_t N, int64_t K, int64_t out);
    // dx = ..., dw += ... (float)
    void (*rmsnorm_bwd)(be_t *be, void *dx, float *dw, const void *dout, const void *x, const void *w,
                        const float *rstd, int64_t N, int d);
    // Gated RMSNorm over groups of `gs` channels: x, z [N, G*gs] (z row stride ldz),
    // w has length w_len = gs (shared by the groups, GDN) or G*gs (Mamba-2).
    void (*gated_rmsnorm_fwd)(be_t *be, void *out, float *rstd, const void *x, const void *z, int64_t ldz,
                              const void *w, int64_t w_len, int64_t N, int G, int gs, float eps, int mode);
    void (*gated_rmsnorm_bwd)(be_t *be, void *dx, void *dz, int64_t lddz, float *dw, const void *dout, const void *x,
                              const void *z, int64_t ldz, const void *w, int64_t w_len, const float *rstd, int64_t N,
                              int G, int gs, int mode);
    // L2 norm of each of N rows of length dim (row stride ld): y = x / sqrt(sum x^2 + eps); rnorm[N] saved.
    void (*l2norm_fwd)(be_t *be, void *y, float *rnorm, const void *x, int64_t ld, int64_t N, int dim, float eps);
    void (*l2norm_bwd)(be_t *be, void *dx, int64_t ld, const void *dy, const void *y, const float *rnorm, int64_t N,
                       int dim);

    // ---- rotary embeddings ---------------------------------------------------
    // Rotates N rows x nh heads x dr dims in place: element (n, h, i) at
    // x[n*ld + h*hs + i]. Row n has position pos[n]. cos/sin tables are float
    // [n_pos, dr/2] (attention scaling such as YaRN's mscale already folded in).
    void (*rope_fwd)(be_t *be, void *x, int64_t ld, int64_t hs, const int32_t *pos, const float *cos, const float *sin,
                     int64_t N, int nh, int dr, int style);
    // The transpose: gradient w.r.t. the unrotated input, in place.
    void (*rope_bwd)(be_t *be, void *dx, int64_t ld, int64_t hs, const int32_t *pos, const float *cos, const float *sin,
                     int64_t N, int nh, int dr, int style);

    // ---- attention (flash-style: no Tq x Tk matrix in memory) ----------------
    // q [B,Tq,H,dqk], k [B,Tk,Hkv,dqk], v [B,Tk,Hkv,dv] -> out [B,Tq,H,dv], lse [B,H,Tq]
    // (lse may be NULL). causal 1: query t sits at absolute position Tk - Tq + t
    // and sees keys 0..that position (bottom-right causal; Tk >= Tq; Tq == Tk in
    // training, Tq < Tk when prefilling after a cache). causal 0: every query
    // sees all Tk keys, any Tk >= 0 (0: out 0, lse -inf) - a tile of a long
    // cache that lies wholly before the queries (MLA's cached prefill, merged
    // with attn_merge). Query head h reads KV head h / (H / Hkv).
    void (*attn_fwd)(be_t *be, void *out, float *lse, const void *q, const void *k, const void *v, int B, int Tq,
                     int Tk, int H, int Hkv, int dqk, int dv, float scale, int causal);
    // Log-sum-exp merge of attentions of the same queries over disjoint sets of
    // keys (a long context attended tile by tile) into a running result kept
    // in fp32, so that many merges round to act only once: acc float
    // [B,Tq,H,dv] and lse float [B,H,Tq] hold the attention over the keys
    // merged so far, (out_i act [B,Tq,H,dv], lse_i) that over another set;
    // afterwards (acc, lse) is the attention over their union:
    // lse' = log(exp(lse) + exp(lse_i)), acc' = exp(lse - lse') acc + exp(lse_i - lse') out_i.
    // first: nothing merged yet, (acc, lse) = (out_i, lse_i) (neither read).
    // out (act [B,Tq,H,dv], or NULL): also receives acc' rounded to act. An
    // lse of -inf means no keys (both -inf: acc' 0, lse' -inf).
    void (*attn_merge)(be_t *be, float *acc, float *lse, const void *out_i, const float *lse_i, void *out, int first,
                       int B, int Tq, int H, int dv);
    void (*attn_bwd)(be_t *be, void *dq, void *dk, void *dv_, const void *dout, const void *q, const void *k,
                     const void *v, const void *out, const float *lse, int B, int Tq, int Tk, int H, int Hkv, int dqk,
                     int dv, float scale);

    // ---- MLP ----------------------------------------------------------------
    // out [N, f] = silu(gate) * up, gate and up rows of f at row stride ld (ld
    // = f: contiguous, and out may then be gate or up; ld = 2 f with up = gate
    // + f: the two halves of one product's output)
    void (*swiglu_fwd)(be_t *be, void *out, const void *gate, const void *up, int64_t ld, int64_t N, int64_t f);
    void (*swiglu_bwd)(be_t *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up, int64_t n);
    // A decode step's gate and up products fused with SwiGLU: h[N, f] =
    // silu(x Wg^T) * (x Wu^T), x [N, K] rows ldx apart, Wg, Wu [f, K] (any two
    // matrices), h contiguous. With a gain xw [K] (else NULL), x's rows are
    // RMS-normalised with it first (rmsnorm_fwd's formula, eps): a decode step
    // feeds the residual stream without a launch to norm it. The same results
    // as rmsnorm_fwd, the two products then swiglu_fwd, but for their rounding:
    // CUDA keeps the normed rows, gate and up in fp32. One launch on CUDA for
    // N <= BE_FEW_ROWS (any N works, in launches of that many rows).
    void (*proj_swiglu)(be_t *be, void *h, const void *x, int64_t ldx, const void *xw, float eps, const void *Wg,
                        const void *Wu, int64_t N, int64_t K, int64_t f);

    // ---- depthwise causal conv (GDN short convs, Mamba-2 conv1d) -------------
    // x [B,T,C] with row stride ldx; w [C,W] (weight [C,1,W] as stored), bias [C]
    // or NULL; state [B,C,W] act or NULL: the W previous inputs (oldest first;
    // only the last W-1 are read) that precede x. y [B,T,C] contiguous,
    // y = silu(conv) when `silu`, else conv.
    void (*conv1d_fwd)(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                       const void *state, int B, int T, int C, int W, int silu);
    // dx (row stride lddx) =, dw += and dbias += (float; dbias may be NULL); dstate
    // (float [B,C,W] or NULL) receives the gradient of the state's inputs.
    void (*conv1d_bwd)(be_t *be, void *dx, int64_t lddx, float *dw, float *dbias, float *dstate, const void *dy,
                       const void *x, int64_t ldx, const void *w, const void *bias, const void *state, int B, int T,
                       int C, int W, int silu);
    // Rolls the last W inputs of each sequence into state [B,C,W] after a
    // forward over x [B,T,C] (state on entry = the inputs before x, may be zeros).
    void (*conv1d_update_state)(be_t *be, void *state, const void *x, int64_t ldx, int B, int T, int C, int W);

    // ---- Gated DeltaNet ------------------------------------------------------
    // Gates: g = -exp(A_log) * softplus(a + dt_bias) (natural-log decay per token),
    // beta = sigmoid(b) (x2 if allow_neg). a, b [N, HV] with row strides lda, ldb.
    void (*gdn_gate_fwd)(be_t *be, float *g, float *beta, const void *a, int64_t lda, const void *b, int64_t ldb,
                         const void *A_log, const void *dt_bias, int64_t N, int HV, int allow_neg);
    void (*gdn_gate_bwd)(be_t *be, void *da, int64_t ldda, void *db, int64_t lddb, float *dA_log, float *ddt_bias,
                         const float *dg, const float *dbeta, const void *a, int64_t lda, const void *b, int64_t ldb,
                         const void *A_log, const void *dt_bias, int64_t N, int HV, int allow_neg);
    // Gated delta rule, chunked (chunk 64): q, k [B,T,H,K] (L2-normalised), v
    // [B,T,HV,Dv], g, beta float [B,T,HV]; value head h uses q/k head h/(HV/H).
    // o [B,T,HV,Dv]; state float [B,HV,Dv,K] ("V-first" as FLA): read as the
    // initial state when init != 0 (else zeros), overwritten with the final state
    // when non-NULL.
    void (*gdn_chunk_fwd)(be_t *be, void *o, float *state, int init, const void *q, const void *k, const void *v,
                          const float *g, const float *beta, float scale, int B, int T, int H, int HV, int K, int Dv);
    // dq, dk, dv =; dg, dbeta = (float); dstate0 (float, NULL when no initial
    // state) = gradient of the initial state; dstate_final (NULL = 0) the
    // incoming gradient of the final state.
    void (*gdn_chunk_bwd)(be_t *be, void *dq, void *dk, void *dv, float *dg, float *dbeta, float *dstate0,
                          const void *dout, const float *dstate_final, const void *q, const void *k, const void *v,
                          const float *g, const float *beta, const float *state0, float scale, int B, int T, int H,
                          int HV, int K, int Dv);
    // Token-by-token recurrence (decode steps; also the oracle on the CPU).
    // state float [B,HV,Dv,K] read and updated in place.
    void (*gdn_recurrent_fwd)(be_t *be, void *o, float *state, const void *q, const void *k, const void *v,
                              const float *g, const float *beta, float scale, int B, int T, int H, int HV, int K,
                              int Dv);

    // ---- Mamba-2 SSD ---------------------------------------------------------
    // dt' = softplus(dt + dt_bias) (identity above 20); dt [N, H] row stride ld.
    void (*softplus_bias_fwd)(be_t *be, float *out, const void *dt, int64_t ld, const void *dt_bias, int64_t N, int H);
    // ddt (act, row stride ldd) = dout * sigmoid(dt + dt_bias) (dout where identity); ddt_bias += sum
    void (*softplus_bias_bwd)(be_t *be, void *ddt, int64_t ldd, float *ddt_bias, const float *dout, const void *dt,
                              int64_t ld, const void *dt_bias, int64_t N, int H);
    // Chunked SSD. x [B,T,Hx,P] (row stride ldx), Bm [B,T,GB,N] (ldb), Cm
    // [B,T,GC,N] (ldc); head h reads x head h/(H/Hx), B group h/(H/GB), C group
    // h/(H/GC). dt float [B,T,H] (after softplus), A_log [H] (A = -exp(A_log)),
    // D [H] act. y [B,T,H,P] = ssm + D*x. state float [B,H,P,N] as in gdn.
    void (*ssd_chunk_fwd)(be_t *be, void *y, float *state, int init, const void *x, int64_t ldx, const void *Bm,
                          int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log, const void *D,
                          int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk);
    // dx, dB, dC (act, same strides as the inputs) =; ddt (float [B,T,H]) =;
    // dA_log, dD (float [H]) +=; dstate0 as in gdn.
    void (*ssd_chunk_bwd)(be_t *be, void *dx, void *dB, void *dC, float *ddt, float *dA_log, float *dD, float *dstate0,
                          const void *dy, const float *dstate_final, const void *x, int64_t ldx, const void *Bm,
                          int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log, const void *D,
                          const float *state0, int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk);
    void (*ssd_recurrent_fwd)(be_t *be, void *y, float *state, const void *x, int64_t ldx, const void *Bm, int64_t ldb,
                              const void *Cm, int64_t ldc, const float *dt, const void *A_log, const void *D, int B,
                              int T, int H, int Hx, int GB, int GC, int P, int N);

    // ---- decode over per-sequence caches --------------------------------------
    // A decode step has N rows, one new token per sequence, and every sequence
    // has a cache of its own: rows (cache entries, one per token) `ld` elements
    // apart, row u of the sequence of step row r at base[r] + row(r, u) * ld,
    // where base is a device array of N device pointers (act) and row(r, u) is
    // u, or with page tables (pg, be_pages_t above) the row its page holds it
    // at. The sequences may come from different allocations (contiguous
    // caches each own their buffer) or share one pool of pages (the server's
    // paged caches: base[r] is then the pool of the layer, the same for every
    // row), so these ops take one pointer per row and the step's tables
    // rather than one buffer and a stride; the caller uploads the step's
    // pointer arrays and tables once per step (model.c), and each op is one
    // launch for all N rows whatever buffers and pages they live in.
    //
    // Appends each row's new entry at its own position pos[r] (device int32
    // [N]): k[r, 0..kw) to k_rows[r] + row(r, pos[r]) * ld and v[r, 0..vw) to
    // v_rows[r] + row(r, pos[r]) * ld + v_off. k, v act rows at strides ldk, ldv (kw,
    // vw when contiguous; the row width of one product's output when k and v
    // are parts of it).
    // Attention: K and V caches (v_off 0); MLA: k_rows = v_rows = the latent
    // cache, k = the latent c, v = the rotated rope key at column v_off = r_kv.
    void (*kv_append)(be_t *be, void *const *k_rows, void *const *v_rows, be_pages_t pg, int64_t ld, int64_t v_off,
                      const int32_t *pos, const void *k, int64_t ldk, int kw, const void *v, int64_t ldv, int vw,
                      int N);
    // An attention step's RoPE and cache append in one call: q [N, H, dh] (row
    // r at q + r * ldq) rotated in place, k [N, Hkv, dh] (rows ldk apart)
    // rotated into the K caches and v [N, Hkv, dh] (rows ldv apart) copied into
    // the V caches, rows kw = Hkv dh apart (kv_append with ld = kw, v_off 0).
    // Rotation as rope_fwd with ROPE_NEOX over all dh dims, row r at position
    // pos[r] (cos / sin [n_pos, dh / 2]). k itself is not written. The same
    // results as rope_fwd of q and of k, then kv_append.
    void (*rope_kv_append)(be_t *be, void *q, int64_t ldq, const void *k, int64_t ldk, const void *v, int64_t ldv,
                           const int32_t *pos, const float *cos, const float *sin, void *const *k_rows,
                           void *const *v_rows, be_pages_t pg, int N, int H, int Hkv, int dh);
    // A decode step's q, k, v product fused with rope_kv_append: x [N, K]
    // (rows ldx apart) times W [(H + 2 Hkv) dh, K]^T, the q, k and v
    // projections one matrix (rows [q heads | k heads | v heads]); q [N, H,
    // dh] rotated into q (row r at q + r * ldq), k rotated and v as it is
    // into row r's K and V cache entries as rope_kv_append writes them
    // (rotation, positions, tables and pages as there). q, the caches and x
    // do not overlap. With a gain xw [K] (else NULL), x's rows are
    // RMS-normalised with it first, as in proj_swiglu. The same results as
    // gemm into [q | k | v] then rope_kv_append, but for the product's
    // rounding: CUDA rotates its fp32 sums and rounds once. One launch on CUDA
    // for N <= BE_FEW_ROWS (any N works, in launches of that many rows).
    void (*proj_rope_kv_append)(be_t *be, void *q, int64_t ldq, const void *x, int64_t ldx, const void *xw, float eps,
                                const void *W, const int32_t *pos, const float *cos, const float *sin,
                                void *const *k_rows, void *const *v_rows, be_pages_t pg, int N, int64_t K, int H,
                                int Hkv, int dh);
    // An MLA step's RoPE and cache append in one call: the q_pe of head h of
    // row r, dr values at q + r * ldq + h * hs, rotated in place; row r's
    // latent c (r_kv values at c + r * ldc) and its rope key (dr values at kpe
    // + r * ldk, rotated; kpe itself is not written) written as [c | k_pe] to
    // the cache row rows[r] + row(r, pos[r]) * (r_kv + dr). Rotation as rope_fwd with
    // ROPE_INTERLEAVED over dr dims (cos / sin [n_pos, dr / 2]), row r at
    // position pos[r]. The same results as rope_fwd of q_pe and of k_pe, then
    // kv_append (v_off = r_kv).
    void (*mla_rope_append)(be_t *be, void *q, int64_t ldq, int64_t hs, const void *c, int64_t ldc, const void *kpe,
                            int64_t ldk, const int32_t *pos, const float *cos, const float *sin, void *const *rows,
                            be_pages_t pg, int N, int H, int r_kv, int dr);
    // An MLA step's q_b product fused with mla_rope_append: q [N, H, qd] (row
    // r at q + r * ldq) = x [N, K] (rows ldx apart) times W [H qd, K]^T, each
    // head's q_pe (its last dr values, after d_nope = qd - dr) rotated; row
    // r's latent c (r_kv values at c + r * ldc) and its rope key (dr values at
    // kpe + r * ldk, rotated; kpe itself is not written) written as [c | k_pe]
    // to the cache row rows[r] + row(r, pos[r]) * (r_kv + dr) (rotation,
    // positions, tables and pages as mla_rope_append). c and kpe may lie in
    // x's buffer (parts of the joint q_a / kv_a product's rows); q overlaps
    // none of x, c, kpe and the caches. The same results as gemm into q then
    // mla_rope_append, but for the product's rounding: CUDA rotates its fp32
    // sums and rounds once. One launch on CUDA for N <= BE_FEW_ROWS (any N
    // works, in launches of that many rows).
    void (*proj_mla_rope_append)(be_t *be, void *q, int64_t ldq, const void *x, int64_t ldx, const void *W,
                                 const void *c, int64_t ldc, const void *kpe, int64_t ldk, const int32_t *pos,
                                 const float *cos, const float *sin, void *const *rows, be_pages_t pg, int N, int64_t K,
                                 int H, int qd, int r_kv, int dr);
    // One query per row over its own sequence's cache: q [N, H, dqk] (rotated;
    // row r at q + r * ldq, ldq >= H dqk),
    // keys and values are the cache rows u < len[r] (device int32 [N]; the new
    // token's row included), K row u at k_rows[r] + row(r, u) * Hkv * dqk laid
    // out [Hkv, dqk], V row at v_rows[r] + row(r, u) * Hkv * dv, [Hkv, dv]; query head h
    // reads KV head h / (H / Hkv). out [N, H, dv] = softmax(scale q k^T) v (zero
    // where len[r] <= 0). max_len (host) >= every len[r]: sizes the work.
    void (*attn_decode)(be_t *be, void *out, const void *q, int64_t ldq, void *const *k_rows, void *const *v_rows,
                        be_pages_t pg, const int32_t *len, int max_len, int N, int H, int Hkv, int dqk, int dv,
                        float scale);
    // MLA over the latent cache (weight absorption). For each row b and head h:
    // scores over cache rows u < len[b] of (q_lat[b,h] . c_u + q_pe[b,h] . kpe_u)
    // * scale, softmax, out[b,h] = sum p_u c_u. q_lat, out [B, H, r_kv]; q_pe
    // [b, h] (dr values) at q_pe + b * ldqp + h * hsqp (contiguous: H dr, dr; a
    // part of each head of the projected q: H qd, qd); cache rows [c | rotated k_pe] of r_kv + dr elements, row u of
    // row b's sequence at rows[b] + row(b, u) * (r_kv + dr). max_len (host) >=
    // every len[b]. pool / pool_rows: optional (NULL, 0), a buffer of
    // pool_rows cache rows that holds every row's cache, each rows[b] at a
    // whole row of it (one state's cache, or the paged cache's page pool):
    // CUDA then reads tiles of 32 rows through one TMA tensor map over it
    // (a tile's first row at rows[b]'s row of the pool + row(b, u)), else one
    // copy per row.
    void (*mla_decode_attn)(be_t *be, void *out, const void *q_lat, const void *q_pe, int64_t ldqp, int64_t hsqp,
                            void *const *rows, be_pages_t pg, const int32_t *len, int max_len, const void *pool,
                            int64_t pool_rows, int B, int H, int r_kv, int dr, float scale);

    // The recurrent layers' decode step over per-row states: row r's conv
    // window and recurrent state are wherever rows[r] points (device arrays
    // of N device pointers, uploaded once per step with the attention rows'
    // ones), so each op is one launch for every row of every cache, as
    // kv_append / attn_decode are for attention.
    //
    // Depthwise causal conv of one new token per row, then the window rolled
    // forward: x [N, C] (row stride ldx), w [C, W], bias [C] or NULL; rows[r]
    // is row r's window, act [C, W] (the W previous inputs, oldest first; the
    // last W - 1 are read), which afterwards holds the last W inputs (x[r]
    // newest). y [N, C] contiguous (silu as conv1d_fwd). The same results as
    // conv1d_fwd (T = 1) then conv1d_update_state on each row's window.
    void (*conv1d_step)(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                        void *const *rows, int N, int C, int W, int silu);
    // Gated delta rule, one token per row: q, k [N, H, K], v [N, HV, Dv], g,
    // beta float [N, HV] as gdn_recurrent_fwd; rows[r] is row r's state, float
    // [HV, Dv, K], read and updated in place. o [N, HV, Dv]. The same results
    // as gdn_recurrent_fwd (B = 1, T = 1) on each row.
    void (*gdn_recurrent_step)(be_t *be, void *o, void *const *rows, const void *q, const void *k, const void *v,
                               const float *g, const float *beta, float scale, int N, int H, int HV, int K, int Dv);
    // The inputs of gdn_recurrent_step from a decode step's projections, in one
    // call: the depthwise convs (no bias, SiLU) of one new token of q and k
    // (kd = H K channels) and v (vd = HV Dv), each row's windows rolled
    // forward (rows[N + r], rows[2N + r], rows[3N + r]: row r's q, k and v
    // windows, act [C, W], as conv1d_step); q and k L2-normalised per head
    // (eps, as l2norm_fwd); g, beta from a, b as gdn_gate_fwd. xq, xk, xv, a,
    // b: row strides ldq, ldk, ldv, lda, ldb. Out: q, k [N, kd], v [N, vd]
    // contiguous, g, beta float [N, HV]. The same results as conv1d_step x 3,
    // l2norm_fwd x 2 and gdn_gate_fwd.
    void (*gdn_step_inputs)(be_t *be, void *q, void *k, void *v, float *g, float *beta, void *const *rows,
                            const void *xq, int64_t ldq, const void *xk, int64_t ldk, const void *xv, int64_t ldv,
                            const void *a, int64_t lda, const void *b, int64_t ldb, const void *q_conv,
                            const void *k_conv, const void *v_conv, const void *A_log, const void *dt_bias, int N,
                            int H, int HV, int K, int Dv, int W, float eps, int allow_neg);
    // A Gated DeltaNet decode step from its projections to the input of
    // o_proj, in one call: gdn_step_inputs (l2_eps for the L2 norms; rows as
    // there, each state at least 16-byte aligned), gdn_recurrent_step (scale),
    // then per value head over Dv y = rmsnorm(o) * o_norm * silu(z)
    // (gated_rmsnorm_fwd, GNORM_NORM_THEN_GATE, eps), or without the gate (z
    // NULL) y = rmsnorm(o) * o_norm (rmsnorm_fwd). z [N, HV Dv] with row
    // stride ldz; y [N, HV Dv] contiguous. The same results as those ops in
    // sequence (CUDA: one launch; o rounded to act before the norm, as between
    // the ops; the norm's sum of squares in another order).
    void (*gdn_step)(be_t *be, void *y, void *const *rows, const void *xq, int64_t ldq, const void *xk, int64_t ldk,
                     const void *xv, int64_t ldv, const void *a, int64_t lda, const void *b, int64_t ldb, const void *z,
                     int64_t ldz, const void *q_conv, const void *k_conv, const void *v_conv, const void *A_log,
                     const void *dt_bias, const void *o_norm, float scale, int N, int H, int HV, int K, int Dv, int W,
                     float l2_eps, float eps, int allow_neg);
    // Mamba-2 SSD, one token per row: x, Bm, Cm, dt, A_log, D as
    // ssd_recurrent_fwd with B = N, T = 1; rows[r] is row r's state, float
    // [H, P, N], read and updated in place. y [N, H, P]. The same results as
    // ssd_recurrent_fwd (B = 1, T = 1) on each row.
    void (*ssd_recurrent_step)(be_t *be, void *y, void *const *rows, const void *x, int64_t ldx, const void *Bm,
                               int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                               const void *D, int N, int H, int Hx, int GB, int GC, int P, int Ns);

    // ---- a batched prefill's recurrent work over packed sequences ------------
    // Sequences of different lengths, their rows packed one after another
    // (cu_seqlens style: be_seqs_t), each continuing its own conv windows and
    // recurrent state, which sit wherever its pointer says: win[s], state[s]
    // are host arrays of n device pointers (one per sequence). Each op gives
    // the results of its uniform op (B = 1, T = the sequence's length) run on
    // every sequence in turn; CUDA runs them together (the chunked rules as
    // padded batches of similar lengths: docs/SERVING.md).
    //
    // conv1d_fwd then conv1d_update_state per sequence: x rows ldx apart, y
    // [rows, C] contiguous; win[s] act [C, W] (read, then its last W inputs).
    void (*conv1d_seqs)(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                        void *const *win, be_seqs_t sq, int C, int W, int silu);
    // gdn_chunk_fwd (init 1) per sequence: q, k [rows, H, K], v [rows, HV, Dv],
    // g, beta float [rows, HV]; o [rows, HV, Dv]; state[s] float [HV, Dv, K],
    // read and replaced by the final state.
    void (*gdn_chunk_seqs)(be_t *be, void *o, void *const *state, const void *q, const void *k, const void *v,
                           const float *g, const float *beta, float scale, be_seqs_t sq, int H, int HV, int K, int Dv);
    // ssd_chunk_fwd (init 1) per sequence: x, Bm, Cm rows ldx, ldb, ldc apart,
    // dt float [rows, H]; y [rows, H, P]; state[s] float [H, P, N], read and
    // replaced.
    void (*ssd_chunk_seqs)(be_t *be, void *y, void *const *state, const void *x, int64_t ldx, const void *Bm,
                           int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log, const void *D,
                           be_seqs_t sq, int H, int Hx, int GB, int GC, int P, int N, int chunk);

    // ---- losses (CE / KL over vocabulary tiles: never a T x V tensor) -------
    // Normalisation is the caller's, through `scale`: 1/(valid rows) for a per
    // token mean (FLA, Liger), 1/B for a per sequence "batchmean" (MambaInLlama,
    // Zebra-Llama KD), times 1/(accumulation steps) where needed.
    // Cross entropy of logits = h W^T (h [N,d], W [V,d]): targets < 0 are ignored
    // (loss 0, dh row 0); a target >= V makes the loss NaN. loss (float, one
    // value) = sum over rows of -log p(target) * scale; dh = d loss / dh (act),
    // dW += (float). dh/dW may be NULL (evaluation).
    void (*fused_ce)(be_t *be, float *loss, void *dh, float *dW, const void *h, const void *W, const int32_t *targets,
                     int64_t N, int d, int64_t V, float scale);
    // KL(p_teacher || p_student) of logits hs Ws^T and ht Wt^T (hs [N,ds], Ws
    // [V,ds], ht [N,dt], Wt [V,dt]) summed over rows, times scale; gradients for
    // the student only (dhs =, dWs +=; either may be NULL). mask NULL: every row
    // counts; else rows with mask[n] < 0 are skipped (the CE target convention,
    // so the target array can be passed).
    void (*fused_kl)(be_t *be, float *loss, void *dhs, float *dWs, const void *hs, const void *Ws, const void *ht,
                     const void *Wt, const int32_t *mask, int64_t N, int ds, int dt, int64_t V, float scale);
    // The most token rows fused_ce / fused_kl take in one chunk at vocabulary
    // V: their scratch stops growing with N there (the trainer's plan sizes the
    // scratch by it rather than extrapolating the chunks to all N rows).
    int64_t (*loss_rows_max)(be_t *be, int64_t V);
    // Layer-wise distillation distance between a student's rows x and a teacher's rows y ([N, d] act each):
    // loss (float, one value, overwritten) = scale * sum_n dist_n with dist_n = ||x_n - y_n||_2 (DIST_L2, the
    // Zebra-Llama / HyLo ILD loss) or ||x_n - y_n||^2 / d (DIST_MSE, torch's MSELoss per row); dx (act,
    // overwritten, may be NULL for evaluation) = d loss / d x. For DIST_L2 a row with x_n == y_n has gradient 0.
    // The rows' distances are summed in a fixed order (bitwise-reproducible loss). An invalid mode or d < 1
    // with N > 0 records an error and makes the loss (and dx) NaN.
    void (*ild_dist)(be_t *be, float *loss, void *dx, const void *x, const void *y, int64_t N, int d, float scale,
                     int mode);

    // ---- greedy decoding on the device --------------------------------------
    // ids[n] (device int32) = the first index of the largest of x[n, 0..V)
    // (act rows ld apart), n < N: sampler_argmax's choice for each row (NaNs
    // never the largest; a row of NaNs gives 0). A decode step so chooses its
    // next tokens without its logits leaving the device (model_greedy_queue).
    // With a ring (host_alloc's memory, two arrays of `stride` >= N ids; else
    // NULL), the ids go to ring array *turn too (device int32, 0 or 1), which
    // is then flipped: a step recorded once writes each replay's ids where
    // the host reads them while the next replay runs, without a copy after
    // it (CUDA writes them through the page-locked memory's mapping). N <=
    // BE_ARGMAX_RING_ROWS with a ring.
    void (*argmax_rows)(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x, int64_t ld,
                        int64_t N, int64_t V);
    // argmax_rows of the logits proj_rmsnorm gives (x [N, K] rows ldx apart,
    // normed with gain xw, times W [V, K]^T), the logits never stored: a
    // greedy step's head in one call. The same ids as proj_rmsnorm then
    // argmax_rows (CUDA: the same sums, rounded to bf16 before they are
    // compared). One launch on CUDA for N <= BE_FEW_ROWS.
    void (*proj_rmsnorm_argmax)(be_t *be, int32_t *ids, int32_t *ring, int64_t stride, int32_t *turn, const void *x,
                                int64_t ldx, const void *xw, float eps, const void *W, int64_t N, int64_t K, int64_t V);

    // ---- optimizer -----------------------------------------------------------
    // *out = sum of squares of a float buffer (device float; overwritten)
    void (*sumsq)(be_t *be, float *out, const float *x, int64_t n);
    // AdamW step on n parameters (torch.optim.AdamW): g = grad * grad_scale;
    // m, v moments; bias correction by step (1-based); decoupled weight decay
    // p *= 1 - lr*wd; master (float) updated, work (act) = master.
    void (*adamw)(be_t *be, float *master, void *work, const float *grad, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step);
};

// Creates a backend by name ("cpu" or "cuda"); scratch_bytes: size of the
// per-op scratch arena (be->scratch). The CPU backend takes its thread count
// from OpenMP (OMP_NUM_THREADS, or omp_set_num_threads before this call).
int be_create(be_t **out, const char *name, size_t scratch_bytes);
// The act element size of the backend called name, without creating it (what
// `hylo info` reports caches in): 4 (fp32) for "cpu", 2 (bf16) for "cuda",
// also in a build without CUDA; 0 for an unknown name.
size_t be_act_size_of(const char *name);
void be_destroy(be_t *be);
// Grows the scratch arena to at least `bytes` (its contents are dropped);
// nothing happens when it is that large already.
int be_scratch_reserve(be_t *be, size_t bytes);
// Makes the scratch arena exactly `bytes` (its contents are dropped): grows
// or gives memory back (the trainer, once its plan is known).
int be_scratch_resize(be_t *be, size_t bytes);

#ifdef HYLO_CUDA
// The CUDA backend's stream (a cudaStream_t), for timing ops with CUDA events
// from C (bench/); be must be a CUDA backend. src/backend/cuda/cuda_backend.cu.
void *cuda_stream_of(be_t *be);
#endif

#ifdef __cplusplus
}
#endif
