// Decode attention against the memory bandwidth (CUDA backend): attn_decode
// and mla_decode_attn over caches of 8K to 1M rows per sequence, B = 1 and 8,
// every sequence at the same length (max_len = that length). CUDA events on
// the backend's stream, warm-up runs first, the median of the timed runs.
//
//   build/bench/bench_decode [--quick] [--no-attn] [--no-mla]
//
// Each row compares the op with the hardware on the same bytes in the same
// run: GB/s of the cache bytes the op reads (attention: B len Hkv (dqk + dv)
// 2; MLA: B len (r_kv + dr) 2) against a cudaMemcpyAsync device-to-device
// copy of as many bytes (its GB/s counts read + write, as bench_attn's
// table), so "% copy" is the share of the copy's bandwidth the op reaches.
// Several copies of the cache are rotated (at least 1 GB in all) so that
// repeated calls do not run from the L2; the memcpy rotates over the same
// copies. Cases of more than 16 GiB of cache are skipped (one 80 GB card).
// --quick: lengths 8K, 64K and 1M only.
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

enum { MAX_B = 8, MAX_COPIES = 48 };

typedef struct {
    const char *name;
    int mla;           // 0: attn_decode (H, Hkv, d); 1: mla_decode_attn (H, r_kv, dr)
    int H, a, b;       // attention: Hkv, head dim; MLA: r_kv, dr
    int64_t row_bytes; // cache bytes of one row (one sequence, one token)
} shape_t;

typedef struct {
    const shape_t *s;
    int B, n_copies;
    int64_t len;
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
                        (int)c->len, c->B, s->H, s->a, s->b, s->b, 1.0f / sqrtf((float)s->b));
    } else {
        // one buffer holds the B sequences: it is the pool (the tiled copies' tensor map)
        be->mla_decode_attn(be, c->out, c->q, c->q_pe, (int64_t)s->H * s->b, s->b, c->ptr[i], (be_pages_t){0}, c->len_d,
                            (int)c->len, c->cache[i], c->B * c->len, c->B, s->H, s->a, s->b,
                            1.0f / sqrtf((float)(s->a + s->b)));
    }
}

static void run_memcpy(void *p, int rep) {
    dec_ctx_t *c = p;
    cudaMemcpyAsync(c->dst, c->cache[rep % c->n_copies], c->bytes, cudaMemcpyDeviceToDevice, stream);
}

static void bench_case(const shape_t *s, int B, int64_t len) {
    dec_ctx_t c = {.s = s, .B = B, .len = len};
    c.bytes = (size_t)B * len * s->row_bytes;
    if (c.bytes > ((size_t)16 << 30)) {
        printf("| %-14s | %d | %7lld | skipped: %.1f GiB of cache |\n", s->name, B, (long long)len,
               (double)c.bytes / (1 << 30));
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
    const double gbs = (double)c.bytes / (t_op * 1e-3) / 1e9, cp_gbs = 2.0 * (double)c.bytes / (t_cp * 1e-3) / 1e9;
    printf("| %-14s | %d | %7lld | %9.1f | %9.4f | %7.1f | %9.4f | %7.1f | %5.1f%% |\n", s->name, B, (long long)len,
           (double)c.bytes / 1e6, t_op, gbs, t_cp, cp_gbs, 100.0 * gbs / cp_gbs);
    fflush(stdout);
    for (int i = 0; i < c.n_copies; i++)
        be->free(be, c.cache[i]), be->free(be, c.ptr[i]);
    be->free(be, c.q), be->free(be, c.out), be->free(be, c.dst), be->free(be, c.len_d);
    if (c.q_pe) be->free(be, c.q_pe);
}

int main(int argc, char **argv) {
    int quick = 0, do_attn = 1, do_mla = 1;
    const bench_flag_t flags[] = {{"--quick", &quick, 1}, {"--no-attn", &do_attn, 0}, {"--no-mla", &do_mla, 0}};
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    bench_init((size_t)1 << 30);
    printf("bench_decode: production kernels\n");
    // teachers' attention layers (GQA groups 3, 3, 4) and HyLo MLA layers
    static const shape_t shapes[] = {
        {"llama3.2-3b", 0, 24, 8, 128, 8 * 256 * 2}, {"smollm2-135m", 0, 9, 3, 64, 3 * 128 * 2},
        {"llama3.1-8b", 0, 32, 8, 128, 8 * 256 * 2}, {"mla hylo-3b", 1, 24, 128, 64, 192 * 2},
        {"mla smollm2", 1, 9, 128, 32, 160 * 2},     {"mla r512", 1, 16, 512, 64, 576 * 2},
    };
    static const int64_t all_lens[] = {8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576};
    static const int64_t quick_lens[] = {8192, 65536, 1048576};
    const int64_t *lens = quick ? quick_lens : all_lens;
    const int n_lens = quick ? 3 : 8;
    copy_bandwidth_gbs(); // the asymptotic reference, on a line of its own
    printf("| shape          | B |     len | cache MB  |   op ms   |  GB/s   | memcpy ms | GB/s r+w | %% copy |\n");
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        if (shapes[si].mla ? !do_mla : !do_attn) continue;
        for (int bi = 0; bi < 2; bi++)
            for (int li = 0; li < n_lens; li++)
                bench_case(&shapes[si], bi ? 8 : 1, lens[li]);
    }
    bench_finish();
    return 0;
}
