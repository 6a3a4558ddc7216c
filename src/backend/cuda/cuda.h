// CUDA backend internals. Kernels are CUDA C (C style: plain functions and
// structs, no classes or templates beyond what a kernel needs). Activations and
// the weights' working copy are bf16; accumulation, recurrent states, weight
// gradients and optimizer state are fp32 (see backend.h for the dtype rules).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "base/err.h"

typedef __nv_bfloat16 bf16;

// Row u of step row r's cache (backend.h be_pages_t): the row of its page in
// the pool, or u itself without page tables.
static_assert((BE_PAGE_ROWS & (BE_PAGE_ROWS - 1)) == 0, "BE_PAGE_ROWS must be a power of two");
static __device__ __forceinline__ int64_t cu_page_row(be_pages_t pg, int64_t r, int64_t u) {
    if (!pg.pages) return u;
    return (int64_t)__ldg(pg.pages + r * pg.stride + u / BE_PAGE_ROWS) * BE_PAGE_ROWS + (u & (BE_PAGE_ROWS - 1));
}

typedef struct {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;
    size_t lt_workspace_size;
    int sm_count;
    size_t smem_optin;  // max dynamic shared memory per block (opt-in)
    float *stage;       // fp32 staging buffer of download_act, kept between calls
    size_t stage_bytes; // (a decode step downloads logits every token)
    int first_error;    // first asynchronous/launch error seen (reported by sync)
    char first_error_msg[512];
    int error_before_graph; // first_error when the recording began (graph_begin)
    // proj_add_rmsnorm's state across its blocks (cuda_core.cu): how many
    // blocks have finished (the last one resets it to 0), then each block's
    // sums of squares of its columns of every row, float [CUDA_NORM_BLOCKS,
    // BE_FEW_ROWS]. Kernels on the stream run one after another, so one
    // buffer serves every launch, recorded ones included.
    unsigned *norm_done;
    float *norm_partial;
    unsigned *dec_count; // [CUDA_DEC_COUNTERS] zeroed at creation; decode kernels that merge their
                         // slices in the last block count on them and leave them 0 (cuda_attn.cu)
} cuda_impl_t;

// The most blocks of proj_add_rmsnorm's kernel (its columns are spread over them).
enum { CUDA_NORM_BLOCKS = 1024 };
enum { CUDA_DEC_COUNTERS = 4096 };

static inline cuda_impl_t *cuda_impl(be_t *be) { return (cuda_impl_t *)be->impl; }
static inline cudaStream_t cuda_stream(be_t *be) { return cuda_impl(be)->stream; }

// Keeps `msg` as the error sync() reports (the first one recorded wins), puts it
// in the error slot now and returns `code`.
int cuda_record_error(be_t *be, int code, const char *msg);
// Records a CUDA failure naming the call (first one wins) and returns ERR_RUNTIME.
int cuda_fail(be_t *be, const char *what, cudaError_t e);
// Lets kernel `kern` (named `name` in messages) take `bytes` of dynamic shared
// memory: an argument error when the device has less, cudaFuncSetAttribute
// when above the 48 KB default and above what was set for this kernel and
// device before (remembered here, so callers keep no flags). 0, or < 0 with
// the error recorded.
int cuda_smem_limit(be_t *be, const void *kern, size_t bytes, const char *name);
// Checks the last launch error; `what` names the kernel for the message.
void cuda_check_launch(be_t *be, const char *what);

// Runs `call` (a cudaError_t expression); on failure records and returns.
#define CUDA_TRY(be, call)                                                                                             \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return cuda_fail((be), #call, e_);                                                      \
    } while (0)

static inline unsigned cuda_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// ---- packed sequences as padded batches (cuda_seqs.cu) ----------------------
// gdn_chunk_seqs and ssd_chunk_seqs run a be_seqs_t's sequences in groups,
// each one call of the uniform chunked kernels over [n, T], T its longest
// member. cu_seqs_groups skips empty sequences, orders the rest longest first
// (equal lengths in index order) and starts a new group where the next one
// would take the group's padded rows (n T) past twice its real rows, or past
// CU_SEQS_GROUP members. Fills groups (room for sq.n); returns how many, -1
// when out of host memory.
enum { CU_SEQS_GROUP = 64, CU_PACK_ARRAYS = 6 };
typedef struct {
    int n, T;
    int idx[CU_SEQS_GROUP]; // sequence numbers in sq
} cu_seqs_group_t;
int cu_seqs_groups(be_seqs_t sq, cu_seqs_group_t *groups);
// Whether the group's rows are already its [n, T] batch: sequences idx[0],
// idx[0] + 1, ... in order, all of length T (no copy needed).
int cu_seqs_consecutive(be_seqs_t sq, const cu_seqs_group_t *g);
// Whether the group's states (ptr[idx[i]], bytes each) lie one after another.
int cu_seqs_adjacent(void *const *ptr, const cu_seqs_group_t *g, size_t bytes);
// Up to CU_PACK_ARRAYS arrays copied between the packed rows (packed[a], rows
// ld[a] elements apart) and dense [n, T, cols[a]] buffers (dense[a]), esz[a]
// bytes an element (2 or 4). Passed to the kernel by value.
typedef struct {
    int n_arr, T;
    const void *packed[CU_PACK_ARRAYS];
    void *dense[CU_PACK_ARRAYS];
    int64_t ld[CU_PACK_ARRAYS];
    int cols[CU_PACK_ARRAYS], esz[CU_PACK_ARRAYS];
    int32_t row0[CU_SEQS_GROUP], len[CU_SEQS_GROUP];
} cu_pack_t;
// unpack 0: the group's rows into the dense buffers, zeros after each
// sequence's end; 1: the dense rows back (padding rows dropped). One launch.
void cu_seqs_pack(be_t *be, cu_pack_t *p, be_seqs_t sq, const cu_seqs_group_t *g, int unpack);
// The group's states (ptr[idx[i]], bytes each) into dense [n] (back 0), or
// dense back into them (1). 0, or < 0 with the error recorded.
int cu_seqs_states(be_t *be, void *dense, void *const *ptr, const cu_seqs_group_t *g, size_t bytes, int back);

#ifdef __cplusplus
extern "C" {
#endif
void cuda_register_core(be_t *be);  // cuda_core.cu: elementwise, copies, GEMM (cuBLASLt), embedding
void cuda_register_norm(be_t *be);  // cuda_norm.cu
void cuda_register_rope(be_t *be);  // cuda_rope.cu
void cuda_register_attn(be_t *be);  // cuda_attn.cu: flash attention forward/backward, decode over caches
void cuda_register_mlp(be_t *be);   // cuda_mlp.cu
void cuda_register_conv(be_t *be);  // cuda_conv.cu
void cuda_register_gdn(be_t *be);   // cuda_gdn.cu
void cuda_register_ssd(be_t *be);   // cuda_ssd.cu
void cuda_register_mla(be_t *be);   // cuda_mla.cu: latent-cache decode
void cuda_register_loss(be_t *be);  // cuda_loss.cu: fused CE / KL, ILD distance
void cuda_register_optim(be_t *be); // cuda_optim.cu: sumsq, AdamW
#ifdef __cplusplus
}
#endif
