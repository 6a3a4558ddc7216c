// The bulk tensor copy engine (TMA) and shared-memory barriers (mbarrier),
// shared by the kernels that feed tiles through them (MLA decode, the Hopper
// attention of the bench-variants build): the driver's tensor-map encoder,
// found through the runtime, and the PTX wrappers.
#pragma once
#include <cuda.h> // CUtensorMap
#include <stdint.h>

// The driver's cuTensorMapEncodeTiled, found through the runtime (no -lcuda);
// NULL when the driver lacks it.
typedef CUresult (*cuda_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                         const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                         CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                         CUtensorMapFloatOOBfill);
// (one lookup per process; each .cu that includes this keeps its own)
static inline cuda_encode_tiled_fn cuda_tensor_encoder(void) {
    static int looked;
    static cuda_encode_tiled_fn fn;
    if (!looked) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (cuda_encode_tiled_fn)p;
        else
            (void)cudaGetLastError();
        looked = 1;
    }
    return fn;
}

static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}
// 1-D bulk copy global -> shared on the copy engine; completes `bytes` on bar.
static __device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// 2-D tensor copy global -> shared of the box at (x = column, y = row) of tmap;
// completes the box's bytes on bar (out-of-tensor elements arrive as zeros).
static __device__ __forceinline__ void tensor_g2s(uint32_t dst, const CUtensorMap *tmap, int x, int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(dst),
        "l"((uint64_t)tmap), "r"(x), "r"(y), "r"(bar)
        : "memory");
}
// 3-D tensor copy global -> shared of the box at (x, y, z) of tmap; completes
// the box's bytes on bar (out-of-tensor elements arrive as zeros).
static __device__ __forceinline__ void tensor_g2s_3d(uint32_t dst, const CUtensorMap *tmap, int x, int y, int z,
                                                     uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(dst),
                 "l"((uint64_t)tmap), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
}
// Barrier over `threads` threads (a multiple of 32) of the block, numbered id
// (1-15; 0 is __syncthreads'): the warps of one role wait only for each other.
static __device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// 3-D tensor reduction shared -> global: each element of the box at (x, y, z)
// of tmap, read from shared memory at src (laid out as a load of that box
// would write it), is added into the tensor's element (.add in the map's
// element type); elements outside the tensor are not written. In this
// thread's current bulk group (cp.async.bulk.commit_group / wait_group).
static __device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap *tmap, int x, int y, int z, uint32_t src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
                 " [%0, {%1, %2, %3}], [%4];\n" ::"l"((uint64_t)tmap),
                 "r"(x), "r"(y), "r"(z), "r"(src)
                 : "memory");
}
