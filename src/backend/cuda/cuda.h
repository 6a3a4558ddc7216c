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
