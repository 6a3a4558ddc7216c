// Kernel timelines of a few steps through CUPTI's activity API, for the
// benchmarks that need to know where a decode step's time goes (bench_long
// --trace). libcupti is opened with dlopen when a trace is asked for, so that
// the benchmarks link and run without it. Each kernel (and copy) the GPU runs
// while tracing is recorded with its start and end on the GPU clock, which
// cuptiGetTimestamp shares with the host, so the host marks the steps'
// boundaries on the same clock.
//
// Why the end-to-end costs: under programmatic dependent launch a kernel's
// blocks start while the kernel before it still runs, so its duration counts
// time spent waiting. On one stream the kernels end in order, and
// end[i] - end[i-1] is what kernel i adds to the step (its cost on the critical
// path); those costs sum to the step's GPU span.
//
// Define BENCH_NAME before including this file (bench_util.h does).
#pragma once
#include <cupti_activity.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t start, end;
    char name[48];   // the kernel's base name (demangled from _Z<len><name>), or "memcpy" / "memset"
    int grid, block; // total blocks and threads per block; 0 for copies
    uint64_t bytes;  // copies and sets
} trace_rec_t;

static struct {
    void *lib;
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*timestamp)(uint64_t *);
    trace_rec_t *recs;
    int n, cap;
    int dropped;
} trace;

static void trace_base_name(char *out, size_t cap, const char *mangled) {
    const char *s = mangled ? mangled : "?";
    if (s[0] == '_' && s[1] == 'Z') {
        char *end;
        long len = strtol(s + 2, &end, 10);
        if (len > 0 && end != s + 2 && (long)strnlen(end, (size_t)len) == len) {
            snprintf(out, cap, "%.*s", (int)len, end);
            return;
        }
    }
    snprintf(out, cap, "%s", s);
}

static void CUPTIAPI trace_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = (size_t)8 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void trace_push(const trace_rec_t *r) {
    if (trace.n == trace.cap) {
        int cap = trace.cap ? 2 * trace.cap : 65536;
        trace_rec_t *p = realloc(trace.recs, (size_t)cap * sizeof *p);
        if (!p) {
            trace.dropped++;
            return;
        }
        trace.recs = p, trace.cap = cap;
    }
    trace.recs[trace.n++] = *r;
}

static void CUPTIAPI trace_buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buf, size_t size,
                                            size_t valid) {
    (void)ctx, (void)stream_id, (void)size;
    CUpti_Activity *a = NULL;
    while (trace.next_record(buf, valid, &a) == CUPTI_SUCCESS) {
        trace_rec_t r;
        memset(&r, 0, sizeof r);
        if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
            r.start = k->start, r.end = k->end;
            r.grid = k->gridX * k->gridY * k->gridZ, r.block = k->blockX * k->blockY * k->blockZ;
            trace_base_name(r.name, sizeof r.name, k->name);
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
            r.start = m->start, r.end = m->end, r.bytes = m->bytes;
            snprintf(r.name, sizeof r.name, "memcpy");
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
            r.start = m->start, r.end = m->end, r.bytes = m->bytes;
            snprintf(r.name, sizeof r.name, "memset");
        } else {
            continue;
        }
        trace_push(&r);
    }
    free(buf);
}

// Loads libcupti and starts recording kernels, copies and sets; exits with a
// message naming the library on failure. Call it before the work to trace is
// recorded into CUDA graphs.
static inline void trace_start(void) {
    const char *names[] = {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                           "/usr/local/cuda/lib64/libcupti.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !trace.lib; i++)
        trace.lib = dlopen(names[i], RTLD_NOW);
    if (!trace.lib) {
        fprintf(stderr,
                BENCH_NAME ": --trace needs CUPTI: libcupti.so.13 not found on the library path or under "
                           "/usr/local/cuda (%s)\n",
                dlerror());
        exit(1);
    }
    *(void **)&trace.register_callbacks = dlsym(trace.lib, "cuptiActivityRegisterCallbacks");
    *(void **)&trace.enable = dlsym(trace.lib, "cuptiActivityEnable");
    *(void **)&trace.flush_all = dlsym(trace.lib, "cuptiActivityFlushAll");
    *(void **)&trace.next_record = dlsym(trace.lib, "cuptiActivityGetNextRecord");
    *(void **)&trace.timestamp = dlsym(trace.lib, "cuptiGetTimestamp");
    if (!trace.register_callbacks || !trace.enable || !trace.flush_all || !trace.next_record || !trace.timestamp) {
        fprintf(stderr, BENCH_NAME ": --trace: libcupti lacks the activity API\n");
        exit(1);
    }
    if (trace.register_callbacks(trace_buffer_requested, trace_buffer_completed) != CUPTI_SUCCESS ||
        trace.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        trace.enable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        trace.enable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": --trace: CUPTI would not record activity\n");
        exit(1);
    }
}

// The GPU clock as the records carry it (nanoseconds).
static inline uint64_t trace_now(void) {
    uint64_t t = 0;
    trace.timestamp(&t);
    return t;
}

static int trace_by_end(const void *a, const void *b) {
    const trace_rec_t *x = a, *y = b;
    return x->end < y->end ? -1 : x->end > y->end;
}

typedef struct {
    char name[48];
    int count;
    double cost_us, dur_us;
} trace_sum_t;

// Prints the steps between the host marks m[0] < m[1] < ... < m[n] (step s
// from m[s] to m[s + 1]: everything that ended in it): per step the kernels,
// the GPU span from the first start to the last end and the host time around
// it; for the last step every record in order of its end with its cost
// (above); and per base name over all n steps the count, the cost and the
// mean duration per step, most costly first.
static inline void trace_report(const char *what, const uint64_t *m, int n) {
    if (trace.flush_all(1) != CUPTI_SUCCESS) fprintf(stderr, BENCH_NAME ": --trace: flush failed\n");
    qsort(trace.recs, (size_t)trace.n, sizeof *trace.recs, trace_by_end);
    trace_sum_t sums[256];
    int n_sum = 0, unnamed = 0;
    printf("trace %s: %d steps%s\n", what, n, trace.dropped ? " (records dropped: out of memory)" : "");
    for (int s = 0; s < n; s++) {
        int first = -1, last = -1;
        for (int i = 0; i < trace.n; i++)
            if (trace.recs[i].end > m[s] && trace.recs[i].end <= m[s + 1]) {
                if (first < 0) first = i;
                last = i;
            }
        if (first < 0) {
            printf("  step %d: no records\n", s);
            continue;
        }
        uint64_t t0 = trace.recs[first].start;
        for (int i = first; i <= last; i++)
            if (trace.recs[i].start < t0) t0 = trace.recs[i].start;
        printf("  step %d: %d records, host %.1f us to the first start, GPU span %.1f us, host %.1f us after the "
               "last end; step %.1f us\n",
               s, last - first + 1, (double)(t0 - m[s]) * 1e-3, (double)(trace.recs[last].end - t0) * 1e-3,
               (double)(m[s + 1] - trace.recs[last].end) * 1e-3, (double)(m[s + 1] - m[s]) * 1e-3);
        for (int i = first; i <= last; i++) {
            const trace_rec_t *r = &trace.recs[i];
            const uint64_t prev = i > first ? trace.recs[i - 1].end : t0;
            const double cost = (double)(r->end - prev) * 1e-3, dur = (double)(r->end - r->start) * 1e-3;
            if (s == n - 1)
                printf("    %4d %-32s grid %6d x %4d  dur %7.2f us  cost %7.2f us%s\n", i - first, r->name, r->grid,
                       r->block, dur, cost, r->bytes ? "  (copy/set)" : "");
            int k = 0;
            while (k < n_sum && strcmp(sums[k].name, r->name))
                k++;
            if (k == n_sum) {
                if (n_sum == 256) { // (the table's room: said below)
                    unnamed++;
                    continue;
                }
                memset(&sums[n_sum], 0, sizeof sums[n_sum]);
                snprintf(sums[n_sum].name, sizeof sums[n_sum].name, "%s", r->name);
                n_sum++;
            }
            sums[k].count++, sums[k].cost_us += cost, sums[k].dur_us += dur;
        }
    }
    for (int i = 1; i < n_sum; i++) // most costly first (insertion sort: few names)
        for (int j = i; j > 0 && sums[j].cost_us > sums[j - 1].cost_us; j--) {
            trace_sum_t t = sums[j];
            sums[j] = sums[j - 1], sums[j - 1] = t;
        }
    printf("  per step, by kernel (%d steps): count, cost on the critical path, mean duration%s\n", n,
           unnamed ? " (records of more than 256 names left out of this table)" : "");
    for (int k = 0; k < n_sum; k++)
        printf("    %-32s %6.1f  %8.1f us  %7.2f us\n", sums[k].name, (double)sums[k].count / n, sums[k].cost_us / n,
               sums[k].dur_us / sums[k].count);
    trace.n = 0;
}
