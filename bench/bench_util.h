// Shared pieces of the GPU benchmarks bench_attn, bench_cuda_core, bench_gdn,
// bench_loss and bench_ssd (each bench/*.c is its own program, so these are
// static, the functions inline: not every program uses all of them): the
// CUDA backend with its stream and a pair of timing events, device memory
// that exits on failure (dalloc), random device inputs, CUDA-event timing
// (warm-up runs, then the median of the timed runs), the device-to-device
// copy bandwidth the decode tables compare against, and flag parsing.
//
// Define BENCH_NAME (the program's name, the prefix of its error messages)
// before including this file.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"
#include "base/rng.h"

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_util.h"
#endif

static be_t *be;
static cudaStream_t stream; // the backend's stream: every op and event goes on it
static cudaEvent_t ev0, ev1;

static inline void die(const char *what) {
    fprintf(stderr, BENCH_NAME ": %s: %s\n", what, err_msg());
    exit(1);
}

static inline void check_sync(const char *what) {
    if (be->sync(be) < 0) die(what);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, BENCH_NAME ": %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

// The CUDA backend with a scratch arena of `scratch` bytes, its stream, the events.
static inline void bench_init(size_t scratch) {
    if (be_create(&be, "cuda", scratch) < 0) die("cuda backend");
    stream = (cudaStream_t)cuda_stream_of(be);
    cudaEventCreate(&ev0);
    cudaEventCreate(&ev1);
}

static inline void bench_finish(void) {
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    be_destroy(be);
}

// Device memory, or exit with the error (0 bytes: a small buffer, never NULL).
static inline void *dalloc(size_t bytes) {
    void *p = be->alloc(be, bytes ? bytes : 256);
    if (!p) die("alloc");
    return p;
}

// n random act values N(mean, std^2) into device memory d (random weights of a
// model: m.w, m.pt.total): up to 16M values drawn on the host, repeated on the
// device.
static inline void dev_fill_rand(void *d, int64_t n, uint64_t seed, float mean, float std) {
    int64_t m = n < (1 << 24) ? n : (1 << 24);
    float *h = malloc((size_t)(m ? m : 1) * sizeof(float));
    rng_t r;
    rng_seed(&r, seed);
    rng_fill_normal(&r, h, m, mean, std);
    if (be->upload_act(be, d, h, m) < 0) die("upload");
    free(h);
    for (int64_t done = m; done < n;) {
        int64_t c = done < n - done ? done : n - done;
        if (be->copy_d2d(be, (char *)d + done * 2, d, (size_t)c * 2) < 0) die("copy_d2d");
        done += c;
    }
    check_sync("dev_rand");
}

// Random act values N(mean, std^2) in new device memory (dev_fill_rand).
static inline void *dev_rand(int64_t n, uint64_t seed, float mean, float std) {
    void *d = dalloc((size_t)n * 2);
    dev_fill_rand(d, n, seed, mean, std);
    return d;
}

static inline int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef void (*op_fn)(void *ctx, int rep);

// Median time in ms of `reps` (at most 128) runs after `warm` warm-up runs.
// The warm-ups get rep = 0..warm-1 and timed run i gets rep = rep0 + i (the
// ops that rotate buffer copies by rep: rep0 = 0 starts the timed runs on the
// warm-ups' copies again, rep0 = warm continues after them).
static inline float time_op(op_fn fn, void *ctx, int warm, int reps, int rep0) {
    for (int i = 0; i < warm; i++)
        fn(ctx, i);
    check_sync("warm-up");
    float t[128];
    if (reps > 128) reps = 128;
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(ev0, stream);
        fn(ctx, rep0 + i);
        cudaEventRecord(ev1, stream);
        cudaEventSynchronize(ev1);
        check_sync("timed run");
        cudaEventElapsedTime(&t[i], ev0, ev1);
    }
    qsort(t, (size_t)reps, sizeof(float), cmp_float);
    return reps % 2 ? t[reps / 2] : 0.5f * (t[reps / 2 - 1] + t[reps / 2]);
}

typedef struct {
    void *a, *b;
    size_t n;
} copy_ctx_t;

static inline void run_copy(void *p, int rep) {
    copy_ctx_t *c = p;
    cudaMemcpyAsync(c->b, c->a, c->n, cudaMemcpyDeviceToDevice, stream);
}

// GB/s (bytes read + written) of a device-to-device copy of a 4 GiB buffer
// (2 warm-ups, median of 10), printed as a line of its own.
static inline double copy_bandwidth_gbs(void) {
    copy_ctx_t cc = {.n = (size_t)4 << 30};
    cc.a = be->alloc(be, cc.n), cc.b = be->alloc(be, cc.n);
    if (!cc.a || !cc.b) die("alloc copy buffers");
    be->memset0(be, cc.a, cc.n);
    float t = time_op(run_copy, &cc, 2, 10, 0);
    double gbs = 2.0 * (double)cc.n / (t * 1e-3) / 1e9;
    printf("device-to-device copy of 4 GiB: %.3f ms, %.1f GB/s (read + write)\n", t, gbs);
    be->free(be, cc.a), be->free(be, cc.b);
    return gbs;
}

// A command-line flag: seen, it sets *var = value. Several entries may share a
// name (one flag that sets several variables).
typedef struct {
    const char *name;
    int *var, value;
} bench_flag_t;

// Applies the flags named in argv; on anything else prints the usage ("usage:
// PROGRAM [--a] [--b] ...", each name once) and returns -1 (exit status 2).
static inline int bench_flags(int argc, char **argv, const bench_flag_t *flags, int n) {
    for (int i = 1; i < argc; i++) {
        int found = 0;
        for (int k = 0; k < n; k++)
            if (!strcmp(argv[i], flags[k].name)) *flags[k].var = flags[k].value, found = 1;
        if (!found) {
            fprintf(stderr, "usage: %s", argv[0]);
            for (int k = 0; k < n; k++)
                if (k == 0 || strcmp(flags[k].name, flags[k - 1].name)) fprintf(stderr, " [%s]", flags[k].name);
            fprintf(stderr, "\n");
            return -1;
        }
    }
    return 0;
}
