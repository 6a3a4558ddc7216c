#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

static void *cpu_alloc(be_t *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        err_set(ERR_NOMEM, "cpu: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    return p;
}
static void cpu_free(be_t *be, void *p) { free(p); }
static int cpu_memset0(be_t *be, void *p, size_t n) {
    memset(p, 0, n);
    return 0;
}
static int cpu_copy(be_t *be, void *dst, const void *src, size_t n) {
    if (n) memmove(dst, src, n);
    return 0;
}
static int cpu_upload_act(be_t *be, void *dst, const float *src, int64_t n) {
    memmove(dst, src, (size_t)n * sizeof(float));
    return 0;
}
static int cpu_download_act(be_t *be, float *dst, const void *src, int64_t n) {
    memmove(dst, src, (size_t)n * sizeof(float));
    return 0;
}
static void cpu_discard(be_t *be, void *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
              e = ((uintptr_t)p + n) & ~(pg - 1); // the whole pages inside: no neighbour's bytes
    if (p && e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}
static int64_t cpu_mem_free(be_t *be) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}
static int cpu_sync(be_t *be) { return 0; }
// Work is done as it is queued: a fence has nothing to hold.
static void *cpu_fence_new(be_t *be) {
    static char fence;
    return &fence;
}
static int cpu_fence(be_t *be, void *f) { return 0; }
static void cpu_fence_free(be_t *be, void *f) {}
static void cpu_destroy(be_t *be) {
    free(be->scratch.base);
    free(be);
}

int cpu_backend_create(be_t **out, size_t scratch_bytes) {
    be_t *be = calloc(1, sizeof *be);
    if (!be) return err_set(ERR_NOMEM, "out of memory");
    be->kind = BE_CPU;
    be->act_dtype = DT_F32;
    be->act_size = 4;
    be->name = "cpu";
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->host_alloc = cpu_alloc;
    be->host_free = cpu_free;
    be->memset0 = cpu_memset0;
    be->copy_h2d = cpu_copy;
    be->copy_h2d_async = cpu_copy;
    be->copy_d2h = cpu_copy;
    be->copy_d2d = cpu_copy;
    be->discard = cpu_discard;
    be->mem_free = cpu_mem_free;
    be->upload_act = cpu_upload_act;
    be->download_act = cpu_download_act;
    be->sync = cpu_sync;
    be->fence_new = cpu_fence_new;
    be->fence_mark = cpu_fence;
    be->fence_wait = cpu_fence;
    be->fence_free = cpu_fence_free;
    be->destroy = cpu_destroy;
    void *scratch = scratch_bytes ? cpu_alloc(be, scratch_bytes) : NULL;
    if (scratch_bytes && !scratch) {
        free(be);
        return ERR_NOMEM;
    }
    arena_init(&be->scratch, scratch, scratch_bytes, "cpu scratch");
    // OpenBLAS single-threaded: the products split themselves over the
    // OpenMP threads in a fixed grid of tiles (cpu.h cpu_sgemm), so that
    // their results do not depend on the thread count.
    openblas_set_num_threads(1);
    cpu_register_core(be);
    cpu_register_norm(be);
    cpu_register_rope(be);
    cpu_register_attn(be);
    cpu_register_mlp(be);
    cpu_register_conv(be);
    cpu_register_gdn(be);
    cpu_register_ssd(be);
    cpu_register_mla(be);
    cpu_register_loss(be);
    cpu_register_optim(be);
    cpu_register_quant(be);
    *out = be;
    return 0;
}
