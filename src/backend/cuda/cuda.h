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
    // argmax_rows's and proj_rmsnorm_argmax's state (cuda_core.cu
    // argmax_state_bytes, zeroed at creation): counters of blocks done, then
    // each block's (value, index); the last block merges and resets them.
    unsigned *argmax_count;
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
// How many clusters of cs blocks of kern (threads, smem bytes each; its
// shared memory limit already raised) the device holds at once: clusters of
// more than the portable 8 are allowed for kern first. 0 where the driver
// refuses (no such clusters; the error state is cleared).
int cuda_clusters_fit(const void *kern, int threads, size_t smem, int cs);
// cuda_clusters_fit after cuda_smem_limit (0 where that fails; name names
// kern), the answers kept per device, kernel and shape.
int cuda_clusters_fit_cached(be_t *be, const void *kern, const char *name, int threads, size_t smem, int cs);
// The blocks of kern an SM holds at once (the occupancy query) after
// cuda_smem_limit, kept the same way; 0 where either fails.
int cuda_blocks_per_sm_cached(be_t *be, const void *kern, const char *name, int threads, size_t smem);
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
// gdn_chunk_seqs and ssd_chunk_seqs run a be_seqs_t's sequences through the
// uniform chunked kernels, which take B sequences of one length T: in
// groups, each one call over [n, T], T its longest member. Empty sequences
// are skipped; the rest go longest first (equal lengths in index order), and
// a new group starts where the next sequence would take the group's padded
// rows (n T) past twice its real rows, or past 64 members.

// One array of a chunked rule's packed rows: rows ld elements apart, the
// first cols of each used, esz bytes an element.
typedef struct {
    const void *p;
    int64_t ld;
    int cols, esz;
} cu_seqs_arr_t;
// The uniform call on one group: n sequences of T rows, in[] at the group's
// first row (rows in[k].ld apart), out rows ldo apart, states float, n of
// them one after another, read and replaced. ctx: the op's shape.
typedef void (*cu_seqs_fn)(be_t *be, const void *ctx, const cu_seqs_arr_t *in, void *out, int64_t ldo, float *states,
                           int n, int T);
// Bytes of scratch the uniform call takes for n sequences of T rows.
typedef size_t (*cu_seqs_scratch_fn)(const void *ctx, int n, int T);
// A chunked rule over packed sequences: groups (above) run by `run` on their
// rows in place where they are already a batch (consecutive sequences of one
// length), else on dense copies of in[0..n_in) (zeros after each sequence's end, so
// the caller's inputs must leave a state as it is on zero rows) whose out is
// copied back; states in place where adjacent, else gathered and scattered
// (state[s]: sequence s's, state_bytes each). A group of one sequence, and
// every group when the scratch arena lacks room for the copies beside the
// call's own `scratch`, runs one sequence at a time in place. op names the
// op in errors.
void cu_seqs_run(be_t *be, const char *op, be_seqs_t sq, void *const *state, size_t state_bytes,
                 const cu_seqs_arr_t *in, int n_in, cu_seqs_arr_t out, cu_seqs_scratch_fn scratch, cu_seqs_fn run,
                 const void *ctx);

// Bytes of cuda_impl_t.argmax_count's allocation (cuda_core.cu).
size_t argmax_state_bytes(void);

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
void cuda_register_quant(be_t *be); // cuda_quant.cu: products and embedding on GGUF block formats
#ifdef __cplusplus
}
#endif
