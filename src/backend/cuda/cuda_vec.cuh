// Device helpers shared by the elementwise, norm, MLP, conv, rope, GDN and SSD
// kernels (cuda_core.cu, cuda_norm.cu, cuda_mlp.cu, cuda_conv.cu, cuda_rope.cu,
// cuda_gdn.cu, cuda_ssd.cu): bf16 vector loads/stores converted to and from
// fp32, warp and quad sums, the choice of vector width on the host, grid
// sizing, scratch-arena partials, op argument errors, and programmatic
// dependent launch.
#pragma once
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda.h"

// ---- bf16 <-> fp32 vectors ---------------------------------------------------
// V consecutive elements: V = 8 is one 16-byte access, V = 2 one 4-byte access,
// V = 1 a scalar. The caller guarantees the alignment (see cu_vec_width).
template <int V> __device__ __forceinline__ void ld_bf16(const bf16 *p, float (&f)[V]) {
    if constexpr (V == 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(p);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 t = __bfloat1622float2(h[k]);
            f[2 * k] = t.x;
            f[2 * k + 1] = t.y;
        }
    } else if constexpr (V == 2) {
        float2 t = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
        f[0] = t.x;
        f[1] = t.y;
    } else {
        static_assert(V == 1, "V must be 1, 2 or 8");
        f[0] = __bfloat162float(*p);
    }
}

// Round to nearest even, as the CPU side's f32_to_bf16 (base/half.h).
template <int V> __device__ __forceinline__ void st_bf16(bf16 *p, const float (&f)[V]) {
    if constexpr (V == 8) {
        uint4 u;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
        for (int k = 0; k < 4; k++)
            h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
        *reinterpret_cast<uint4 *>(p) = u;
    } else if constexpr (V == 2) {
        *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(f[0], f[1]);
    } else {
        static_assert(V == 1, "V must be 1, 2 or 8");
        *p = __float2bfloat16_rn(f[0]);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the 4 lanes of a quad (the lanes that hold one mma accumulator row).
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// Block-wide sum (is_max: maximum) in a fixed order, every thread gets it: the
// warp's shuffle tree, then the warps' values in warp order. red holds 32 floats.
static __device__ float block_reduce(float v, bool is_max, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = is_max ? -INFINITY : 0.f;
    for (int i = 0; i < nw; i++)
        v = is_max ? fmaxf(v, red[i]) : v + red[i];
    return v;
}

// Same formulas as the CPU twins (cpu.h) so both sides compute one function.
__device__ __forceinline__ float dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float dev_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float dev_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Grid-stride loop over i in [0, n), 64-bit indices.
#define GRID_STRIDE(i, n)                                                                                              \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// Dispatches a kernel templated on the vector width V chosen by cu_vec_width.
#define LAUNCH_V(V, kern, grid, threads, stream, ...)                                                                  \
    do {                                                                                                               \
        if ((V) == 8)                                                                                                  \
            kern<8><<<(grid), (threads), 0, (stream)>>>(__VA_ARGS__);                                                  \
        else if ((V) == 2)                                                                                             \
            kern<2><<<(grid), (threads), 0, (stream)>>>(__VA_ARGS__);                                                  \
        else                                                                                                           \
            kern<1><<<(grid), (threads), 0, (stream)>>>(__VA_ARGS__);                                                  \
    } while (0)

// ---- host side ---------------------------------------------------------------
// Largest vector width V in {8, 2, 1} such that every address in `addr_or` (the
// bitwise OR of all pointers involved) is V*2-byte aligned and every element
// count or stride in `len_or` (the OR of them all) is a multiple of V. OR-ing
// keeps the test exact: all values are multiples of 2^k iff their OR is.
static inline int cu_vec_width(uintptr_t addr_or, uint64_t len_or) {
    if (addr_or % 16 == 0 && len_or % 8 == 0) return 8;
    if (addr_or % 4 == 0 && len_or % 2 == 0) return 2;
    return 1;
}

// Blocks for a grid-stride loop over n items: enough to fill the chip, never 0.
static inline unsigned cu_grid(be_t *be, int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads, cap = (int64_t)cuda_impl(be)->sm_count * 16;
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b);
}

#ifdef HYLO_BENCH_VARIANTS
// An integer environment knob that picks a kernel variant; `dflt` when unset or
// empty. Only in the bench-only build of the CUDA files that hold variants
// (Makefile: $(BUILD)/bench-variants/); production builds have one kernel per
// job and no such knobs, so a use outside #ifdef HYLO_BENCH_VARIANTS does not
// compile.
static inline int cu_env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}
#endif

// n rounded up to the arena's 256-byte alignment (base/arena.c): what a piece
// of n bytes takes from an arena, padding included.
static inline size_t cu_round256(size_t n) { return (n + 255) & ~(size_t)255; }

// A temporary device buffer from the scratch arena, or NULL when it does not
// fit (the caller then takes a path that needs none). Checked first so that a
// full arena does not leave a message in the error slot. The caller resets the
// arena to its mark right after queueing the kernels that use the buffer: the
// next user of that memory is queued later on the same stream.
static inline void *cu_scratch_try(be_t *be, size_t bytes) {
    arena_t *a = &be->scratch;
    size_t off = cu_round256(a->used);
    if (!a->base || off + bytes > a->cap || off + bytes < off) return NULL;
    return arena_alloc(a, bytes);
}

// Records an invalid-argument error the same way as a CUDA failure: reported by
// the next sync() (first one wins) and left in the error slot now.
static inline void cu_op_error(be_t *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void cu_op_error(be_t *be, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cuda_record_error(be, ERR_INPUT, msg);
}

// ---- programmatic dependent launch -------------------------------------------
// A kernel launched by cu_launch_pdl may be scheduled while the kernel before
// it on the stream still runs, its blocks resident and waiting, which hides
// the launch gap between the many small kernels of a decode step (recorded
// graphs keep the dependency as a programmatic edge). Such a kernel calls
// griddep_wait() before it touches any memory (the kernel before it has then
// finished and its writes are visible), then griddep_launch_dependents() so
// that the next one can be scheduled the same way while it runs. Launched
// without the attribute, both return at once.
// So a kernel that starts early finds every kernel but the one just before it
// finished (that one has passed its wait), and the step's uploads done: the
// decode kernels read what earlier steps wrote before they wait (through L2:
// ld.global.cg), and only the kernel before's outputs after.
static __device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
static __device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
// Asks L2 for the line holding p.
static __device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
// Warms L2 with `bytes` from p, one prefetch per 128-byte line spread over a
// warp's lanes: a decode product's weight rows (read-only) asked for before
// griddep_wait, so they arrive while the kernel before still runs.
static __device__ __forceinline__ void warp_prefetch_l2(const void *p, int64_t bytes, int lane) {
    const char *c = (const char *)p;
    for (int64_t o = (int64_t)lane * 128; o < bytes; o += 32 * 128)
        prefetch_l2(c + o);
}
// The same over a block's nthr threads: state a decode kernel reads that
// earlier steps wrote, asked for before griddep_wait.
static __device__ __forceinline__ void block_prefetch_l2(const void *p, int64_t bytes, int tid, int nthr) {
    const char *c = (const char *)p;
    for (int64_t o = (int64_t)tid * 128; o < bytes; o += (int64_t)nthr * 128)
        prefetch_l2(c + o);
}
static __device__ __forceinline__ void griddep_enter() {
    griddep_wait();
    griddep_launch_dependents();
}
// The bench-variants build's HYLO_PDL=0 launches them plainly (the files of
// that build only: attention, MLA and GDN), to tell a fault of the overlap from
// one of the kernel.
template <typename... P, typename... A>
static inline void cu_launch_pdl(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
#ifdef HYLO_BENCH_VARIANTS
    if (!cu_env_int("HYLO_PDL", 1)) {
        kern<<<grid, block, smem, st>>>(args...);
        return;
    }
#endif
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kern, args...) != cudaSuccess) { // refused: a plain launch
        (void)cudaGetLastError();
        kern<<<grid, block, smem, st>>>(args...);
    }
}
// The same for a kernel that runs in clusters of `cluster` blocks (the grid a
// multiple of it). Refused with the dependency: the cluster launch alone; a
// refusal of that stays for cuda_check_launch to report.
template <typename... P, typename... A>
static inline void cu_launch_pdl_cluster(void (*kern)(P...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                                         cudaStream_t st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x, attr[0].val.clusterDim.y = cluster.y, attr[0].val.clusterDim.z = cluster.z;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 2;
    if (cudaLaunchKernelEx(&cfg, kern, args...) != cudaSuccess) {
        (void)cudaGetLastError();
        cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, kern, args...);
    }
}
