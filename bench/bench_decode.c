// Decode attention against the memory bandwidth (CUDA backend): attn_decode
// and mla_decode_attn over caches of 256 to 1M rows per sequence, B = 1 and
// 8, every sequence at the same length. CUDA events on the backend's stream,
// warm-up runs first, the median of the timed runs.
//
//   build/bench/bench_decode [--quick] [--no-attn] [--no-mla]
//
// Each row compares the op with the hardware on the same bytes in the same
// run: GB/s of the cache bytes the op reads (attention: B len Hkv (dqk + dv)
// 2; MLA: B len (r_kv + dr) 2) against a cudaMemcpyAsync device-to-device
// copy of as many bytes (its GB/s counts read + write, as bench_attn's
// table), so "% copy" is the share of the copy's bandwidth the op reaches.
// Several copies of the cache are rotated (at least 1 GB in all, at most 48
// copies: the short caches stay in the L2) so that repeated calls do not run
// from the L2; the memcpy rotates over the same copies. Cases of more than 16
// GiB of cache are skipped (one 80 GB card).
// Two timings of each: "call us", one call between two events as before (it
// includes the host's time to queue the launches, which the GPU waits for),
// and "graph us", per call of GRAPH_CALLS calls recorded into one CUDA graph
// and replayed (as a decode step runs: no host work between launches). The
// short points (256 and 2K rows) show the fixed cost; "256 of 4K" passes
// max_len 4096 for 256-row caches, as a step recorded at hylo generate's
// default context limit does (the grid is sized for 4K rows, the kernels use
// what the lengths need).
// The bench-variants build (build/bench-variants/bench/bench_decode) reads
// the kernels' knobs on every call, e.g. HYLO_MLA_SHORT=0 (MLA's caches of
// max_len <= 4096 through v2, not k_mla_short), HYLO_MLA_CLUSTER=8 (v2's
// short caches over a cluster, not one block) or HYLO_DEC_CLUSTER=1
// (attention's in one block, not a cluster):
// run it with and without for an A/B on the same card.
// --quick: 256, 256 of 4K, 2K, 4K, 8K, 64K and 1M only; --64k, --1m: that length only;
// --b1, --b8: that batch only (one point under compute-sanitizer or ncu);
// --rows=N, --batch=N (1 to 8): any one length or batch (the MLA B = 8, 1M
// fault's bisection: kernel_checks.sh MLA_DIAG, SERVING.md run 27).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"
#include "base/rng.h"

#define BENCH_NAME "bench_decode"
#include "bench_util.h"

enum { MAX_B = 8, MAX_COPIES = 48, GRAPH_CALLS = 16 };

typedef struct {
    const char *name;
    int mla;           // 0: attn_decode (H, Hkv, d); 1: mla_decode_attn (H, r_kv, dr)
    int H, a, b;       // attention: Hkv, head dim; MLA: r_kv, dr
    int64_t row_bytes; // cache bytes of one row (one sequence, one token)
} shape_t;

typedef struct {
    const shape_t *s;
    int B, n_copies;
    int64_t len, max_len;    // rows of every sequence; the op's max_len (>= len)
    size_t bytes;            // cache bytes the op reads per call
    void *cache[MAX_COPIES]; // per copy: attention [K of B sequences | V of B sequences]; MLA the B sequences
    void **ptr[MAX_COPIES];  // per copy: device row pointers (attention: B K then B V; MLA: B rows)
    void *q, *q_pe, *out, *dst;
    int32_t *len_d;
} dec_ctx_t;

static void run_dec(void *p, int rep) {
    dec_ctx_t *c = p;
    const shape_t *s = c->s;
    const int i = rep % c->n_copies;
    if (!s->mla) {
        be->attn_decode(be, c->out, c->q, (int64_t)s->H * s->b, c->ptr[i], c->ptr[i] + c->B, (be_pages_t){0}, c->len_d,
                        (int)c->max_len, c->B, s->H, s->a, s->b, s->b, 1.0f / sqrtf((float)s->b));
    } else {
        // one buffer holds the B sequences: it is the pool (the tiled copies' tensor map)
        be->mla_decode_attn(be, c->out, c->q, c->q_pe, (int64_t)s->H * s->b, s->b, c->ptr[i], (be_pages_t){0}, c->len_d,
                            (int)c->max_len, c->cache[i], c->B * c->len, c->B, s->H, s->a, s->b,
                            1.0f / sqrtf((float)(s->a + s->b)));
    }
}

static void run_memcpy(void *p, int rep) {
    dec_ctx_t *c = p;
    cudaMemcpyAsync(c->dst, c->cache[rep % c->n_copies], c->bytes, cudaMemcpyDeviceToDevice, stream);
}

// Median time per call in ms of `calls` calls (rep = 0, 1, ...) recorded into
// one graph, over `reps` replays after one warm-up replay.
static float time_graph(op_fn fn, void *ctx, int calls, int reps) {
    void *g = NULL;
    if (be->graph_begin(be) < 0) die("graph_begin");
    for (int i = 0; i < calls; i++)
        fn(ctx, i);
    if (be->graph_end(be, &g) < 0) die("graph_end");
    if (be->graph_launch(be, g) < 0) die("graph_launch");
    check_sync("graph warm-up");
    float t[128];
    if (reps > 128) reps = 128;
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(ev0, stream);
        if (be->graph_launch(be, g) < 0) die("graph_launch");
        cudaEventRecord(ev1, stream);
        cudaEventSynchronize(ev1);
        check_sync("timed graph");
        cudaEventElapsedTime(&t[i], ev0, ev1);
    }
    be->graph_free(be, g);
    qsort(t, (size_t)reps, sizeof(float), cmp_float);
    const float med = reps % 2 ? t[reps / 2] : 0.5f * (t[reps / 2 - 1] + t[reps / 2]);
    return med / (float)calls;
}

static void bench_case(const shape_t *s, int B, int64_t len, int64_t max_len) {
    dec_ctx_t c = {.s = s, .B = B, .len = len, .max_len = max_len > len ? max_len : len};
    c.bytes = (size_t)B * len * s->row_bytes;
    char rows[48]; // the len column: rows, or "rows of max_len"
    if (c.max_len > len)
        snprintf(rows, sizeof rows, "%lld of %lld", (long long)len, (long long)c.max_len);
    else
        snprintf(rows, sizeof rows, "%lld", (long long)len);
    if (c.bytes > ((size_t)16 << 30)) {
        printf("| %-14s | %d | %-11s | skipped: %.1f GiB of cache |\n", s->name, B, rows, (double)c.bytes / (1 << 30));
        return;
    }
    c.n_copies = (int)ceil(1.0e9 / (double)c.bytes);
    if (c.n_copies < 1) c.n_copies = 1;
    if (c.n_copies > MAX_COPIES) c.n_copies = MAX_COPIES;
    c.cache[0] = dev_rand((int64_t)(c.bytes / 2), 11, 0.0f, 1.0f);
    for (int i = 1; i < c.n_copies; i++) {
        c.cache[i] = dalloc(c.bytes);
        if (be->copy_d2d(be, c.cache[i], c.cache[0], c.bytes) < 0) die("cache copy");
    }
    for (int i = 0; i < c.n_copies; i++) {
        void *h[2 * MAX_B];
        char *base = c.cache[i];
        const size_t seq = (size_t)len * s->row_bytes; // one sequence's cache bytes
        if (!s->mla) {
            const size_t kseq = (size_t)len * s->a * s->b * 2; // one sequence's K (V the same)
            for (int b = 0; b < B; b++)
                h[b] = base + (size_t)b * kseq, h[B + b] = base + (size_t)B * kseq + (size_t)b * kseq;
        } else {
            for (int b = 0; b < B; b++)
                h[b] = base + (size_t)b * seq;
        }
        const size_t np = (size_t)(s->mla ? B : 2 * B) * sizeof(void *);
        c.ptr[i] = dalloc(np);
        if (be->copy_h2d(be, c.ptr[i], h, np) < 0) die("upload row pointers");
    }
    const int64_t nq = (int64_t)B * s->H * (s->mla ? s->a : s->b);
    c.q = dev_rand(nq, 12, 0.0f, 1.0f);
    c.q_pe = s->mla ? dev_rand((int64_t)B * s->H * s->b, 13, 0.0f, 1.0f) : NULL;
    c.out = dalloc((size_t)nq * 2);
    c.dst = dalloc(c.bytes);
    c.len_d = dalloc(sizeof(int32_t) * B);
    int32_t lens[MAX_B];
    for (int b = 0; b < B; b++)
        lens[b] = (int32_t)len;
    if (be->copy_h2d(be, c.len_d, lens, sizeof(int32_t) * B) < 0) die("upload lengths");

    const int reps = c.bytes < ((size_t)1 << 30) ? 30 : 10;
    const float t_op = time_op(run_dec, &c, 3, reps, 0);
    check_sync("decode op");
    const float t_cp = time_op(run_memcpy, &c, 3, reps, 0);
    check_sync("memcpy");
    // the graphs: fewer calls for the long caches (each call already long)
    const int calls = c.bytes < ((size_t)256 << 20) ? GRAPH_CALLS : 2;
    const float g_op = time_graph(run_dec, &c, calls, reps), g_cp = time_graph(run_memcpy, &c, calls, reps);
    // op GB/s over the copy's read + write GB/s = t_copy / (2 t_op)
    printf("| %-14s | %d | %-11s | %9.1f | %9.1f | %7.1f | %9.1f | %5.1f%% | %9.1f | %9.1f | %6.1f%% |\n", s->name, B,
           rows, (double)c.bytes / 1e6, 1e3 * t_op, (double)c.bytes / (t_op * 1e-3) / 1e9, 1e3 * t_cp,
           100.0 * t_cp / (2.0 * t_op), 1e3 * g_op, 1e3 * g_cp, 100.0 * g_cp / (2.0 * g_op));
    fflush(stdout);
    for (int i = 0; i < c.n_copies; i++)
        be->free(be, c.cache[i]), be->free(be, c.ptr[i]);
    be->free(be, c.q), be->free(be, c.out), be->free(be, c.dst), be->free(be, c.len_d);
    if (c.q_pe) be->free(be, c.q_pe);
}

int main(int argc, char **argv) {
    int quick = 0, do_attn = 1, do_mla = 1, only_len = 0, only_b = 0;
    int64_t any_rows = 0; // --rows=N
    int nargs = 1;        // argv without --rows= and --batch=, for bench_flags
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strncmp(argv[i], "--rows=", 7)) {
            any_rows = strtoll(argv[i] + 7, &end, 10);
            if (*end || any_rows < 1 || any_rows > ((int64_t)1 << 30)) die("--rows=N: N from 1 to 2^30");
        } else if (!strncmp(argv[i], "--batch=", 8)) {
            only_b = (int)strtol(argv[i] + 8, &end, 10);
            if (*end || only_b < 1 || only_b > MAX_B) die("--batch=N: N from 1 to 8");
        } else {
            argv[nargs++] = argv[i];
        }
    }
    argc = nargs;
    const bench_flag_t flags[] = {{"--quick", &quick, 1},      {"--no-attn", &do_attn, 0},   {"--no-mla", &do_mla, 0},
                                  {"--64k", &only_len, 65536}, {"--1m", &only_len, 1048576}, {"--b1", &only_b, 1},
                                  {"--b8", &only_b, 8}};
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    bench_init((size_t)1 << 30);
    printf("bench_decode: production kernels\n");
    // teachers' attention layers (GQA groups 3, 3, 4) and HyLo MLA layers;
    // "mla smol-hyb": the SmolLM2 10MLA20GDN hybrid's (upc_student_arch's
    // default dims: r_kv 48, d_rope 32); MLA at max_len <= 4096 runs
    // k_mla_short where it fits (HYLO_MLA_SHORT=0 in the bench-variants
    // build: v2)
    static const shape_t shapes[] = {
        {"llama3.2-3b", 0, 24, 8, 128, 8 * 256 * 2}, {"smollm2-135m", 0, 9, 3, 64, 3 * 128 * 2},
        {"llama3.1-8b", 0, 32, 8, 128, 8 * 256 * 2}, {"mla hylo-3b", 1, 24, 128, 64, 192 * 2},
        {"mla smollm2", 1, 9, 128, 32, 160 * 2},     {"mla smol-hyb", 1, 9, 48, 32, 80 * 2},
        {"mla r512", 1, 16, 512, 64, 576 * 2},
    };
    // rows per sequence, max_len (0: the rows)
    // (4K: the longest max_len of k_mla_short)
    static const int64_t all_lens[][2] = {{256, 0},    {256, 4096}, {1024, 0},   {2048, 0},  {4096, 0},
                                          {8192, 0},   {16384, 0},  {32768, 0},  {65536, 0}, {131072, 0},
                                          {262144, 0}, {524288, 0}, {1048576, 0}};
    static const int64_t quick_lens[][2] = {{256, 0},  {256, 4096}, {2048, 0},   {4096, 0},
                                            {8192, 0}, {65536, 0},  {1048576, 0}};
    const int64_t one_len[][2] = {{any_rows, 0}};
    const int64_t(*lens)[2] = any_rows ? one_len : quick ? quick_lens : all_lens;
    const int n_lens = any_rows ? 1
                       : quick  ? (int)(sizeof quick_lens / sizeof quick_lens[0])
                                : (int)(sizeof all_lens / sizeof all_lens[0]);
    copy_bandwidth_gbs(); // the asymptotic reference, on a line of its own
    printf("| shape          | B | len         | cache MB  |  call us  |  GB/s   | memcpy us | %% copy |  graph us "
           "| g.memcpy  | g.%%copy |\n");
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        if (shapes[si].mla ? !do_mla : !do_attn) continue;
        const int batches[2] = {only_b ? only_b : 1, 8};
        for (int bi = 0; bi < (only_b ? 1 : 2); bi++)
            for (int li = 0; li < n_lens; li++)
                if (!only_len || lens[li][0] == only_len)
                    bench_case(&shapes[si], batches[bi], lens[li][0], lens[li][1]);
    }
    bench_finish();
    return 0;
}
