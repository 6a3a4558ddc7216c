// The CUDA device layer: one device, one stream, a cuBLASLt handle with its
// workspace; memory through cudaMalloc (never managed memory); errors name
// the failing call. Ops are queued on the stream; sync() reports the first
// asynchronous error.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"

int cuda_record_error(be_t *be, int code, const char *msg) {
    cuda_impl_t *ci = be ? cuda_impl(be) : NULL;
    if (ci && !ci->first_error) {
        ci->first_error = code;
        snprintf(ci->first_error_msg, sizeof ci->first_error_msg, "%s", msg);
    }
    return err_set(code, "%s", msg);
}

int cuda_fail(be_t *be, const char *what, cudaError_t e) {
    char msg[512];
    snprintf(msg, sizeof msg, "cuda: %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return cuda_record_error(be, ERR_RUNTIME, msg);
}

void cuda_check_launch(be_t *be, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) cuda_fail(be, what, e);
}

// The kernels whose shared-memory limit was raised: per kernel and device, the
// bytes set. Past SMEM_SET_MAX entries the limit is simply set on every call.
// Process-wide, so locked like the gemm plan table (backends may run on
// several threads).
enum { SMEM_SET_MAX = 256 };
static struct {
    const void *kern;
    int device;
    size_t bytes;
} smem_set[SMEM_SET_MAX];
static int n_smem_set;
static pthread_mutex_t smem_set_lock = PTHREAD_MUTEX_INITIALIZER;

int cuda_smem_limit(be_t *be, const void *kern, size_t bytes, const char *name) {
    cuda_impl_t *ci = cuda_impl(be);
    char msg[256];
    if (bytes > ci->smem_optin) {
        snprintf(msg, sizeof msg, "cuda %s: needs %zu bytes of shared memory, the device allows %zu", name, bytes,
                 ci->smem_optin);
        return cuda_record_error(be, ERR_INPUT, msg);
    }
    if (bytes <= 48 * 1024) return 0; // within the default limit
    pthread_mutex_lock(&smem_set_lock);
    int i = 0;
    while (i < n_smem_set && !(smem_set[i].kern == kern && smem_set[i].device == ci->device))
        i++;
    cudaError_t e = cudaSuccess;
    if (i == n_smem_set || smem_set[i].bytes < bytes) {
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e == cudaSuccess && i == n_smem_set && i < SMEM_SET_MAX)
            smem_set[i].kern = kern, smem_set[i].device = ci->device, n_smem_set++;
        if (e == cudaSuccess && i < n_smem_set) smem_set[i].bytes = bytes;
    }
    pthread_mutex_unlock(&smem_set_lock);
    if (e != cudaSuccess) {
        snprintf(msg, sizeof msg, "cudaFuncSetAttribute(%s)", name);
        return cuda_fail(be, msg, e);
    }
    return 0;
}

int cuda_clusters_fit(const void *kern, int threads, size_t smem, int cs) {
    cudaError_t e =
        cs <= 8 ? cudaSuccess : cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int n = 0;
    if (e == cudaSuccess) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)cs), cfg.blockDim = dim3((unsigned)threads), cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)cs, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr, cfg.numAttrs = 1;
        e = cudaOccupancyMaxActiveClusters(&n, kern, &cfg);
    }
    if (e != cudaSuccess) (void)cudaGetLastError(), n = 0;
    return n;
}

// What a launch shape of kern fits, behind the kernel's shared memory limit,
// remembered per (device, kernel, threads, bytes, cluster size cs): clusters
// of cs the device holds at once (cuda_clusters_fit), or for cs = 0 the
// blocks an SM holds at once. A decode step asks on every launch, and the
// answer only changes with those.
static int launch_fit_cached(be_t *be, const void *kern, const char *name, int threads, size_t smem, int cs) {
    static struct {
        int device;
        const void *kern;
        int threads, cs;
        size_t smem;
        int n;
    } cache[64];
    static int used;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    const int dev = cuda_impl(be)->device;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < used; i++)
        if (cache[i].device == dev && cache[i].kern == kern && cache[i].threads == threads && cache[i].cs == cs &&
            cache[i].smem == smem) {
            const int n = cache[i].n;
            pthread_mutex_unlock(&lock);
            return n;
        }
    int n = 0;
    if (cuda_smem_limit(be, kern, smem, name) == 0) {
        if (cs > 0)
            n = cuda_clusters_fit(kern, threads, smem, cs);
        else if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, threads, smem) != cudaSuccess)
            (void)cudaGetLastError(), n = 0;
    }
    if (used < 64) {
        cache[used].device = dev, cache[used].kern = kern, cache[used].threads = threads, cache[used].cs = cs;
        cache[used].smem = smem, cache[used].n = n, used++;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

int cuda_clusters_fit_cached(be_t *be, const void *kern, const char *name, int threads, size_t smem, int cs) {
    return launch_fit_cached(be, kern, name, threads, smem, cs);
}

int cuda_blocks_per_sm_cached(be_t *be, const void *kern, const char *name, int threads, size_t smem) {
    return launch_fit_cached(be, kern, name, threads, smem, 0);
}

// The backend's stream, for benchmarks that time ops with CUDA events from C
// (backend/cuda/cuda.h is C++ only; declared in backend/backend.h).
extern "C" void *cuda_stream_of(be_t *be) { return (void *)cuda_stream(be); }

static void *cu_alloc(be_t *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        cudaGetLastError();
        err_set(ERR_NOMEM, "cuda: cannot allocate %zu bytes (%zu of %zu free): %s", bytes, fr, tot,
                cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static int64_t cu_mem_free(be_t *be) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return (int64_t)fr;
}

static void cu_free(be_t *be, void *p) {
    if (p) cudaFree(p);
}

static void *cu_host_alloc(be_t *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        err_set(ERR_NOMEM, "cuda: cannot allocate %zu bytes of page-locked host memory: %s", bytes,
                cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_host_free(be_t *be, void *p) {
    if (p) cudaFreeHost(p);
}

static int cu_memset0(be_t *be, void *p, size_t n) {
    CUDA_TRY(be, cudaMemsetAsync(p, 0, n, cuda_stream(be)));
    return 0;
}

static int cu_copy_h2d_async(be_t *be, void *dst, const void *src, size_t n) {
    CUDA_TRY(be, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cuda_stream(be)));
    return 0;
}

static int cu_copy_h2d(be_t *be, void *dst, const void *src, size_t n) {
    // Synchronous: the host buffer may be reused as soon as we return.
    CUDA_TRY(be, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cuda_stream(be)));
    CUDA_TRY(be, cudaStreamSynchronize(cuda_stream(be)));
    return 0;
}

static int cu_copy_d2h(be_t *be, void *dst, const void *src, size_t n) {
    CUDA_TRY(be, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cuda_stream(be)));
    CUDA_TRY(be, cudaStreamSynchronize(cuda_stream(be)));
    return 0;
}

// The first error recorded since the last report (launch failures, an op's
// refused arguments) into the error slot, and cleared; 0 when none.
static int report_first_error(cuda_impl_t *ci) {
    if (!ci->first_error) return 0;
    int rc = err_set(ci->first_error, "%s", ci->first_error_msg);
    ci->first_error = 0;
    return rc;
}

// A fence is an event recorded on the stream (timing off: the cheaper kind
// to record and wait for).
static void *cu_fence_new(be_t *be) {
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cuda_fail(be, "cudaEventCreateWithFlags", e);
        return NULL;
    }
    return ev;
}

static int cu_fence_mark(be_t *be, void *f) {
    CUDA_TRY(be, cudaEventRecord((cudaEvent_t)f, cuda_stream(be)));
    return 0;
}

static int cu_fence_wait(be_t *be, void *f) {
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)f);
    if (e != cudaSuccess) return cuda_fail(be, "cudaEventSynchronize", e);
    return report_first_error(cuda_impl(be));
}

static void cu_fence_free(be_t *be, void *f) {
    if (f) cudaEventDestroy((cudaEvent_t)f);
}

static int cu_copy_d2d(be_t *be, void *dst, const void *src, size_t n) {
    CUDA_TRY(be, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cuda_stream(be)));
    return 0;
}

__global__ void k_f32_to_bf16(bf16 *dst, const float *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void k_bf16_to_f32(float *dst, const bf16 *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __bfloat162float(src[i]);
}

static void cu_f32_to_act(be_t *be, void *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    k_f32_to_bf16<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>((bf16 *)dst, src, n);
    cuda_check_launch(be, "f32_to_bf16");
}

static void cu_act_to_f32(be_t *be, float *dst, const void *src, int64_t n) {
    if (n <= 0) return;
    k_bf16_to_f32<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(dst, (const bf16 *)src, n);
    cuda_check_launch(be, "bf16_to_f32");
}

enum { STAGE_CHUNK = 16 << 20 }; // values per staged piece of an upload or download

// The staging buffer for min(n, STAGE_CHUNK) floats, grown when needed and kept
// (allocating per call would cost a cudaFree, which waits for the device, per
// decode step); NULL on failure, recorded by cuda_fail.
static float *cu_stage(be_t *be, int64_t n) {
    cuda_impl_t *ci = cuda_impl(be);
    const int64_t vals = n < 1 ? 1 : n < (int64_t)STAGE_CHUNK ? n : (int64_t)STAGE_CHUNK;
    const size_t want = (size_t)vals * sizeof(float);
    if (want > ci->stage_bytes) {
        cudaFree(ci->stage);
        ci->stage = NULL, ci->stage_bytes = 0;
        cudaError_t e = cudaMalloc(&ci->stage, want);
        if (e != cudaSuccess) {
            ci->stage = NULL;
            cuda_fail(be, "cudaMalloc(staging buffer)", e);
            return NULL;
        }
        ci->stage_bytes = want;
    }
    return ci->stage;
}

// Host fp32 -> device bf16 through a bounded staging buffer on the device.
static int cu_upload_act(be_t *be, void *dst, const float *src, int64_t n) {
    const int64_t chunk = STAGE_CHUNK;
    float *stage = cu_stage(be, n);
    if (!stage) return ERR_RUNTIME;
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        cudaError_t e =
            cudaMemcpyAsync(stage, src + i, (size_t)m * sizeof(float), cudaMemcpyHostToDevice, cuda_stream(be));
        if (e != cudaSuccess) rc = cuda_fail(be, "upload", e);
        if (rc == 0) cu_f32_to_act(be, (bf16 *)dst + i, stage, m);
        if (rc == 0 && (e = cudaStreamSynchronize(cuda_stream(be))) != cudaSuccess) rc = cuda_fail(be, "upload", e);
    }
    return rc;
}

static int cu_download_act(be_t *be, float *dst, const void *src, int64_t n) {
    const int64_t chunk = STAGE_CHUNK;
    float *stage = cu_stage(be, n);
    if (!stage) return ERR_RUNTIME;
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        cu_act_to_f32(be, stage, (const bf16 *)src + i, m);
        cudaError_t e =
            cudaMemcpyAsync(dst + i, stage, (size_t)m * sizeof(float), cudaMemcpyDeviceToHost, cuda_stream(be));
        if (e == cudaSuccess) e = cudaStreamSynchronize(cuda_stream(be));
        if (e != cudaSuccess) rc = cuda_fail(be, "download", e);
    }
    return rc;
}

static int cu_sync(be_t *be) {
    cuda_impl_t *ci = cuda_impl(be);
    cudaError_t e = cudaStreamSynchronize(ci->stream);
    if (e != cudaSuccess) return cuda_fail(be, "cudaStreamSynchronize", e);
    return report_first_error(ci);
}

// Stream capture, thread-local: other threads' CUDA calls (an HTTP thread's)
// do not break this thread's recording.
static int cu_graph_begin(be_t *be) {
    cuda_impl_t *ci = cuda_impl(be);
    ci->error_before_graph = ci->first_error;
    CUDA_TRY(be, cudaStreamBeginCapture(ci->stream, cudaStreamCaptureModeThreadLocal));
    return 0;
}

static int cu_graph_end(be_t *be, void **g) {
    cuda_impl_t *ci = cuda_impl(be);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(ci->stream, &graph);
    (void)cudaGetLastError(); // a call refused while recording leaves its error here too
    char msg[600];
    int failed = e != cudaSuccess || !graph;
    if (ci->first_error && !ci->error_before_graph) { // an op failed while recording: nothing of it ran
        snprintf(msg, sizeof msg, "cuda graph: an op failed while recording: %s", ci->first_error_msg);
        ci->first_error = 0;
        failed = 1;
    } else if (failed) {
        snprintf(msg, sizeof msg, "cuda graph: recording failed: %s", cudaGetErrorString(e));
    }
    // the replay *g holds takes the new arguments in place when the ops form
    // the same graph (a cache that grew, other rows: much cheaper than a new
    // instantiation); else a new one replaces it
    if (!failed && *g) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate((cudaGraphExec_t)*g, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return 0;
        }
        (void)cudaGetLastError();
    }
    cudaGraphExec_t exec = NULL;
    if (!failed && (e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) {
        snprintf(msg, sizeof msg, "cuda graph: cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        failed = 1;
    }
    if (graph) cudaGraphDestroy(graph);
    if (failed) return err_set(ERR_RUNTIME, "%s", msg);
    if (*g) cudaGraphExecDestroy((cudaGraphExec_t)*g);
    *g = exec;
    return 0;
}

static int cu_graph_launch(be_t *be, void *g) {
    CUDA_TRY(be, cudaGraphLaunch((cudaGraphExec_t)g, cuda_stream(be)));
    return 0;
}

static void cu_graph_free(be_t *be, void *g) {
    if (g) cudaGraphExecDestroy((cudaGraphExec_t)g);
}

static void cu_destroy(be_t *be) {
    cuda_impl_t *ci = cuda_impl(be);
    if (ci) {
        cudaStreamSynchronize(ci->stream);
        if (be->scratch.base) cudaFree(be->scratch.base);
        if (ci->stage) cudaFree(ci->stage);
        if (ci->lt_workspace) cudaFree(ci->lt_workspace);
        if (ci->norm_done) cudaFree(ci->norm_done);
        if (ci->dec_count) cudaFree(ci->dec_count);
        if (ci->argmax_count) cudaFree(ci->argmax_count);
        if (ci->lt) cublasLtDestroy(ci->lt);
        if (ci->stream) cudaStreamDestroy(ci->stream);
        free(ci);
    }
    free(be);
}

extern "C" int cuda_backend_create(be_t **out, size_t scratch_bytes) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return err_set(ERR_RUNTIME, "--device cuda: no CUDA device is available (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    be_t *be = (be_t *)calloc(1, sizeof *be);
    cuda_impl_t *ci = (cuda_impl_t *)calloc(1, sizeof *ci);
    if (!be || !ci) {
        free(be);
        free(ci);
        return err_set(ERR_NOMEM, "out of memory");
    }
    be->impl = ci;
    be->kind = BE_CUDA;
    be->act_dtype = DT_BF16;
    be->act_size = 2;
    be->name = "cuda";
    be->destroy = cu_destroy;
    int rc = 0;
    cudaDeviceProp prop;
    if ((e = cudaGetDevice(&ci->device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, ci->device)) != cudaSuccess)
        rc = cuda_fail(be, "cudaGetDeviceProperties", e);
    if (rc == 0 && prop.major < 9)
        rc = err_set(ERR_UNSUP, "cuda: device %s has compute capability %d.%d; hylo's kernels need 9.0 (Hopper)",
                     prop.name, prop.major, prop.minor);
    if (rc == 0) {
        ci->sm_count = prop.multiProcessorCount;
        ci->smem_optin = prop.sharedMemPerBlockOptin;
        if ((e = cudaStreamCreateWithFlags(&ci->stream, cudaStreamNonBlocking)) != cudaSuccess)
            rc = cuda_fail(be, "cudaStreamCreate", e);
    }
    if (rc == 0 && cublasLtCreate(&ci->lt) != CUBLAS_STATUS_SUCCESS)
        rc = err_set(ERR_RUNTIME, "cuda: cublasLtCreate failed");
    ci->lt_workspace_size = 64u << 20;
    if (rc == 0 && (e = cudaMalloc(&ci->lt_workspace, ci->lt_workspace_size)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMalloc(cuBLASLt workspace)", e);
    // one allocation: the counter, then the partial sums 256 bytes on
    size_t norm_bytes = 256 + (size_t)CUDA_NORM_BLOCKS * BE_FEW_ROWS * sizeof(float);
    if (rc == 0 && (e = cudaMalloc(&ci->norm_done, norm_bytes)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMalloc(norm state)", e);
    if (rc == 0 && (e = cudaMemsetAsync(ci->norm_done, 0, norm_bytes, ci->stream)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMemset(norm state)", e);
    if (rc == 0) ci->norm_partial = (float *)((char *)ci->norm_done + 256);
    if (rc == 0 && (e = cudaMalloc(&ci->dec_count, CUDA_DEC_COUNTERS * sizeof(unsigned))) != cudaSuccess)
        rc = cuda_fail(be, "cudaMalloc(decode counters)", e);
    if (rc == 0 &&
        (e = cudaMemsetAsync(ci->dec_count, 0, CUDA_DEC_COUNTERS * sizeof(unsigned), ci->stream)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMemsetAsync(decode counters)", e);
    const size_t argmax_bytes = argmax_state_bytes();
    if (rc == 0 && (e = cudaMalloc(&ci->argmax_count, argmax_bytes)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMalloc(argmax state)", e);
    if (rc == 0 && (e = cudaMemsetAsync(ci->argmax_count, 0, argmax_bytes, ci->stream)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMemsetAsync(argmax state)", e);
    void *scratch = NULL;
    if (rc == 0 && scratch_bytes && (e = cudaMalloc(&scratch, scratch_bytes)) != cudaSuccess)
        rc = cuda_fail(be, "cudaMalloc(scratch)", e);
    if (rc < 0) {
        cu_destroy(be);
        return rc;
    }
    arena_init(&be->scratch, scratch, scratch_bytes, "cuda scratch");
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->mem_free = cu_mem_free;
    be->memset0 = cu_memset0;
    be->copy_h2d = cu_copy_h2d;
    be->copy_h2d_async = cu_copy_h2d_async;
    be->copy_d2h = cu_copy_d2h;
    be->copy_d2d = cu_copy_d2d;
    be->upload_act = cu_upload_act;
    be->download_act = cu_download_act;
    be->sync = cu_sync;
    be->fence_new = cu_fence_new;
    be->fence_mark = cu_fence_mark;
    be->fence_wait = cu_fence_wait;
    be->fence_free = cu_fence_free;
    be->graph_begin = cu_graph_begin;
    be->graph_end = cu_graph_end;
    be->graph_launch = cu_graph_launch;
    be->graph_free = cu_graph_free;
    cuda_register_core(be);
    cuda_register_norm(be);
    cuda_register_rope(be);
    cuda_register_attn(be);
    cuda_register_mlp(be);
    cuda_register_conv(be);
    cuda_register_gdn(be);
    cuda_register_ssd(be);
    cuda_register_mla(be);
    cuda_register_loss(be);
    cuda_register_optim(be);
    cuda_register_quant(be);
    *out = be;
    return 0;
}
