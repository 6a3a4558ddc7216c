// Timings of the CUDA shared ops (cuda_core / norm / rope / mlp / conv) at
// training sizes, against the two ceilings of METHOD.md: bytes moved over
// memory bandwidth (memory-bound ops) or FLOPs over the bf16 matrix rate
// (GEMMs). Prints one line per op: the time per call of `reps` back-to-back
// launches (CUDA events around the batch; a warm-up batch, then the median of
// 5), the effective GB/s or TFLOP/s. Inputs are random (never zeros). Last,
// the decode-step products (a few rows by a weight) as GB/s of the weight.
//
//   build-*/bench/bench_cuda_core [--decode] [reps]
// (--decode: the decode-step products alone, 1 to 8 rows, and MLA's absorbed
// per-head products; the bench-variants build's HYLO_GEMV_COLS = 1, 2 or 4
// runs the plain ones with that many columns a warp instead of production's
// choice, and its HYLO_BATCHED_LT = 1 the absorbed ones on cuBLASLt)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"

#define BENCH_NAME "bench_cuda_core"
#include "bench_util.h"

// n act values N(0, 1), a seed per size
static void *act(int64_t n) { return dev_rand(n, (uint64_t)n * 7919u + 1, 0.0f, 1.0f); }

static float *f32(int64_t n) {
    float *d = dalloc((size_t)n * sizeof(float));
    if (be->memset0(be, d, (size_t)n * sizeof(float)) < 0) die("f32 buffer");
    return d;
}

// `reps` launches of one op back to back, timed as one unit, so the launch
// gaps are hidden as they are in training.
typedef struct {
    void (*op)(void *ctx);
    void *ctx;
    int reps;
} batch_t;

static void run_batch(void *p, int rep) {
    batch_t *b = p;
    for (int i = 0; i < b->reps; i++)
        b->op(b->ctx);
}

// Seconds per call: the median of 5 batches after a warm-up batch (plan
// creation, module load).
static double timeit(void (*op)(void *ctx), void *ctx, int reps) {
    batch_t b = {op, ctx, reps};
    return time_op(run_batch, &b, 1, 5, 0) * 1e-3 / reps;
}

typedef struct {
    void *a, *b, *c, *d;
    float *f, *g, *h;
    int32_t *ids;
    int64_t M, N, K;
    int W, T, C;
} ctx_t;

static void op_gemm_nt(void *p) { // y = x W^T
    ctx_t *c = p;
    be->gemm(be, 0, 1, c->M, c->N, c->K, 1.0f, c->a, c->K, c->b, c->K, 0.0f, c->c, c->N);
}
static void op_proj_swiglu(void *p) { // c [M, f] = silu(a Wg^T) * (a Wu^T), b = [Wg | Wu]
    ctx_t *c = p;
    be->proj_swiglu(be, c->c, c->a, c->K, NULL, 0.0f, c->b, (const char *)c->b + c->N * c->K * 2, c->M, c->K, c->N);
}
static void op_proj_swiglu_normed(void *p) { // the same of rmsnorm(a) (b's first K values: the gain)
    ctx_t *c = p;
    be->proj_swiglu(be, c->c, c->a, c->K, c->b, 1e-5f, c->b, (const char *)c->b + c->N * c->K * 2, c->M, c->K, c->N);
}
static void op_proj_add_rmsnorm(void *p) { // a [M, d] += c [M, f] Wd^T, d = rmsnorm(a) (b's first d rows: the gain)
    ctx_t *c = p;
    be->proj_add_rmsnorm(be, c->d, c->a, c->c, c->N, c->b, c->b, c->M, c->N, (int)c->K, 1e-5f);
}
static void op_proj_add(void *p) { // the same, the add alone (the next product norms its input)
    ctx_t *c = p;
    be->proj_add_rmsnorm(be, NULL, c->a, c->c, c->N, c->b, NULL, c->M, c->N, (int)c->K, 1e-5f);
}
static void op_gemm_nn(void *p) { // dx = dy W
    ctx_t *c = p;
    be->gemm(be, 0, 0, c->M, c->N, c->K, 1.0f, c->a, c->K, c->b, c->N, 0.0f, c->c, c->N);
}
static void op_gemm_dw(void *p) { // dW += dy^T x (fp32)
    ctx_t *c = p;
    be->gemm_f32out(be, 1, 0, c->M, c->N, c->K, 1.0f, c->a, c->M, c->b, c->N, 1.0f, c->f, c->N);
}
static void op_rms_fwd(void *p) {
    ctx_t *c = p;
    be->rmsnorm_fwd(be, c->c, c->f, c->a, c->b, c->M, (int)c->N, 1e-5f);
}
static void op_rms_bwd(void *p) {
    ctx_t *c = p;
    be->rmsnorm_bwd(be, c->c, c->g, c->d, c->a, c->b, c->f, c->M, (int)c->N);
}
static void op_swiglu_fwd(void *p) {
    ctx_t *c = p;
    be->swiglu_fwd(be, c->c, c->a, c->b, c->N, c->M, c->N);
}
static void op_swiglu_bwd(void *p) {
    ctx_t *c = p;
    be->swiglu_bwd(be, c->c, c->d, c->a, c->a, c->b, c->M * c->N);
}
static void op_rope(void *p) {
    ctx_t *c = p;
    be->rope_fwd(be, c->a, c->N, 128, c->ids, c->f, c->g, c->M, (int)(c->N / 128), 128, ROPE_NEOX);
}
static void op_conv_fwd(void *p) {
    ctx_t *c = p;
    be->conv1d_fwd(be, c->c, c->a, c->C, c->b, NULL, NULL, 1, c->T, c->C, c->W, 1);
}
static void op_conv_bwd(void *p) {
    ctx_t *c = p;
    be->conv1d_bwd(be, c->d, c->C, c->f, NULL, NULL, c->c, c->a, c->C, c->b, NULL, NULL, 1, c->T, c->C, c->W, 1);
}
static void op_copy2d(void *p) {
    ctx_t *c = p;
    be->copy2d(be, c->c, c->N / 2, c->a, c->N, c->M, c->N / 2, 0);
}
static void op_embed_fwd(void *p) {
    ctx_t *c = p;
    be->embed_fwd(be, c->c, c->a, c->ids, c->M, (int)c->N);
}

// One sequence's absorbed MLA products (mla.c per_head_products at B = 1): the
// hpg query heads of each of the G KV groups as rows, batched over the groups,
// with mla_step's strides. q [H, qd], kv_b [G, dn + dv, rkv], latents [H, rkv].
typedef struct {
    int64_t H, G, dn, dr, rkv, dv;
    void *q, *kvb, *qlat, *olat, *att;
} absorb_t;
static void op_absorb_xw(void *p) { // q_lat[h] = q_nope[h] wk_g(h)
    absorb_t *a = p;
    const int64_t hpg = a->H / a->G, qd = a->dn + a->dr;
    be->gemm_batched(be, 0, 0, hpg, a->rkv, a->dn, 1.0f, a->q, qd, hpg * qd, a->kvb, a->rkv, (a->dn + a->dv) * a->rkv,
                     0.0f, a->qlat, a->rkv, hpg * a->rkv, a->G);
}
static void op_absorb_xwt(void *p) { // att[h] = olat[h] wv_g(h)^T
    absorb_t *a = p;
    const int64_t hpg = a->H / a->G;
    be->gemm_batched(be, 0, 1, hpg, a->dv, a->rkv, 1.0f, a->olat, a->rkv, hpg * a->rkv,
                     (const char *)a->kvb + a->dn * a->rkv * 2, a->rkv, (a->dn + a->dv) * a->rkv, 0.0f, a->att, a->dv,
                     hpg * a->dv, a->G);
}

static void row(const char *name, const char *shape, double s, double bytes, double flops) {
    printf("%-18s %-34s %9.1f us", name, shape, s * 1e6);
    if (bytes > 0) printf("  %7.0f GB/s", bytes / s * 1e-9);
    if (flops > 0) printf("  %7.1f TFLOP/s", flops / s * 1e-12);
    printf("\n");
}

// Decode-step products (a few rows by a weight: k_gemv), where the weight's
// bytes are the cost: GB/s of the weight read, against the copy bandwidth
// printed first. Shapes of SmolLM2-135M (q|k|v, gate, down, head) and of
// Llama-3.2-3B (q|k|v, gate, down, head); 1 and 8 rows, with every_m 1 to 8.
static void decode_products(int reps, int every_m) {
    const double es = 2.0;
    char shape[64];
    copy_bandwidth_gbs();
    const int64_t Ns[] = {960, 1536, 576, 49152, 5120, 8192, 3072, 128256};
    const int64_t Ks[] = {576, 576, 1536, 576, 3072, 3072, 8192, 3072};
    for (int i = 0; i < 8; i++)
        for (int64_t M = 1; M <= 8; M += every_m ? 1 : 7) {
            ctx_t c = {.M = M, .N = Ns[i], .K = Ks[i]};
            c.a = act(c.M * c.K), c.b = act(c.N * c.K), c.c = act(c.M * c.N);
            snprintf(shape, sizeof shape, "rows=%lld out=%lld in=%lld", (long long)c.M, (long long)c.N, (long long)c.K);
            row("decode x W^T", shape, timeit(op_gemm_nt, &c, reps), (double)c.N * c.K * es, 0);
            be->free(be, c.a), be->free(be, c.b), be->free(be, c.c);
        }
    if (!every_m) return;
    // the fused decode products (--decode only): gate and up into SwiGLU (of
    // the rows as they are, and RMS-normalised in the product), and the down
    // product added into the residual (and normed, and alone), SmolLM2's and
    // Llama-3.2-3B's MLP shapes; GB/s of the weights read
    const int64_t Ds[] = {576, 3072}, Fs[] = {1536, 8192};
    for (int i = 0; i < 2; i++)
        for (int64_t M = 1; M <= 8; M++) {
            ctx_t c = {.M = M, .N = Fs[i], .K = Ds[i]};
            c.a = act(M * Ds[i]), c.b = act(2 * Fs[i] * Ds[i]), c.c = act(M * Fs[i]), c.d = act(M * Ds[i]);
            snprintf(shape, sizeof shape, "rows=%lld d=%lld f=%lld", (long long)M, (long long)Ds[i], (long long)Fs[i]);
            row("decode swiglu", shape, timeit(op_proj_swiglu, &c, reps), 2.0 * Fs[i] * Ds[i] * es, 0);
            row("decode norm+swiglu", shape, timeit(op_proj_swiglu_normed, &c, reps), 2.0 * Fs[i] * Ds[i] * es, 0);
            row("decode add+norm", shape, timeit(op_proj_add_rmsnorm, &c, reps), (double)Fs[i] * Ds[i] * es, 0);
            row("decode add", shape, timeit(op_proj_add, &c, reps), (double)Fs[i] * Ds[i] * es, 0);
            be->free(be, c.a), be->free(be, c.b), be->free(be, c.c), be->free(be, c.d);
        }
    // MLA's absorbed products of one sequence (--decode only): the SmolLM2-135M
    // 10MLA20GDN hybrid (H 9, G 3, d_nope = d_rope 32, r_kv 48, d_v 64) and
    // HyLo-Llama-3B's MLA (H 24, G 8, d_nope = d_rope 64, r_kv 128, d_v 128);
    // GB/s of the kv_b blocks read
    const absorb_t dims[] = {{.H = 9, .G = 3, .dn = 32, .dr = 32, .rkv = 48, .dv = 64},
                             {.H = 24, .G = 8, .dn = 64, .dr = 64, .rkv = 128, .dv = 128}};
    const char *names[] = {"SmolLM2 hybrid", "Llama-3B MLA"};
    for (int i = 0; i < 2; i++) {
        absorb_t a = dims[i];
        a.q = act(a.H * (a.dn + a.dr)), a.kvb = act(a.G * (a.dn + a.dv) * a.rkv), a.qlat = act(a.H * a.rkv);
        a.olat = act(a.H * a.rkv), a.att = act(a.H * a.dv);
        snprintf(shape, sizeof shape, "%s rows=%lld out=%lld in=%lld b=%lld", names[i], (long long)(a.H / a.G),
                 (long long)a.rkv, (long long)a.dn, (long long)a.G);
        row("absorb x W", shape, timeit(op_absorb_xw, &a, reps), (double)a.G * a.dn * a.rkv * es, 0);
        snprintf(shape, sizeof shape, "%s rows=%lld out=%lld in=%lld b=%lld", names[i], (long long)(a.H / a.G),
                 (long long)a.dv, (long long)a.rkv, (long long)a.G);
        row("absorb x W^T", shape, timeit(op_absorb_xwt, &a, reps), (double)a.G * a.dv * a.rkv * es, 0);
        be->free(be, a.q), be->free(be, a.kvb), be->free(be, a.qlat), be->free(be, a.olat), be->free(be, a.att);
    }
}

int main(int argc, char **argv) {
    // --decode: the decode-step products alone, at every row count 1 to 8
    const int decode_only = argc > 1 && !strcmp(argv[1], "--decode");
    int reps = argc > 1 + decode_only ? atoi(argv[1 + decode_only]) : 20;
    if (reps < 1) reps = 1;
    bench_init(512u << 20);
    if (decode_only) {
        decode_products(reps, 1);
        check_sync("end");
        bench_finish();
        return 0;
    }
    const double es = 2.0;
    char shape[64];
    {
        const int64_t Ms[] = {8192, 8192, 8192}, Ns[] = {2048, 8192, 2048}, Ks[] = {2048, 2048, 8192};
        for (int i = 0; i < 3; i++) {
            ctx_t c = {.M = Ms[i], .N = Ns[i], .K = Ks[i]};
            c.a = act(c.M * c.K), c.b = act(c.N * c.K), c.c = act(c.M * c.N);
            snprintf(shape, sizeof shape, "M=%lld N=%lld K=%lld", (long long)c.M, (long long)c.N, (long long)c.K);
            double fl = 2.0 * c.M * c.N * c.K;
            row("gemm x W^T", shape, timeit(op_gemm_nt, &c, reps), 0, fl);
            row("gemm dy W", shape, timeit(op_gemm_nn, &c, reps), 0, fl);
            be->free(be, c.a), be->free(be, c.b), be->free(be, c.c);
            // dW[M=out, N=in] += dy[K tokens, out]^T x[K, in]
            ctx_t w = {.M = Ns[i], .N = Ks[i], .K = Ms[i]};
            w.a = act(w.K * w.M), w.b = act(w.K * w.N), w.f = f32(w.M * w.N);
            snprintf(shape, sizeof shape, "out=%lld in=%lld tokens=%lld", (long long)w.M, (long long)w.N,
                     (long long)w.K);
            row("gemm dW f32", shape, timeit(op_gemm_dw, &w, reps), 0, 2.0 * w.M * w.N * w.K);
            be->free(be, w.a), be->free(be, w.b), be->free(be, w.f);
        }
    }
    {
        ctx_t c = {.M = 16384, .N = 2048};
        int64_t n = c.M * c.N;
        c.a = act(n), c.b = act(c.N), c.c = act(n), c.d = act(n), c.f = f32(c.M), c.g = f32(c.N);
        snprintf(shape, sizeof shape, "N=%lld d=%lld", (long long)c.M, (long long)c.N);
        row("rmsnorm fwd", shape, timeit(op_rms_fwd, &c, reps), 2 * n * es, 0);
        op_rms_fwd(&c); // a real rstd for the backward
        row("rmsnorm bwd", shape, timeit(op_rms_bwd, &c, reps), 3 * n * es, 0);
        row("copy2d half", shape, timeit(op_copy2d, &c, reps), n * es, 0);
        be->free(be, c.a), be->free(be, c.b), be->free(be, c.c), be->free(be, c.d), be->free(be, c.f);
        be->free(be, c.g);
    }
    {
        ctx_t c = {.M = 16384, .N = 8192};
        int64_t n = c.M * c.N;
        c.a = act(n), c.b = act(n), c.c = act(n), c.d = act(n);
        snprintf(shape, sizeof shape, "n=%lld", (long long)n);
        row("swiglu fwd", shape, timeit(op_swiglu_fwd, &c, reps), 3 * n * es, 0);
        row("swiglu bwd", shape, timeit(op_swiglu_bwd, &c, reps), 5 * n * es, 0);
        be->free(be, c.a), be->free(be, c.b), be->free(be, c.c), be->free(be, c.d);
    }
    {
        ctx_t c = {.M = 16384, .N = 32 * 128};
        int64_t n = c.M * c.N;
        c.a = act(n);
        int32_t *pos = malloc((size_t)c.M * sizeof(int32_t));
        for (int64_t i = 0; i < c.M; i++)
            pos[i] = (int32_t)i;
        c.ids = dalloc((size_t)c.M * sizeof(int32_t));
        be->copy_h2d(be, c.ids, pos, (size_t)c.M * sizeof(int32_t));
        c.f = f32(c.M * 64), c.g = f32(c.M * 64);
        snprintf(shape, sizeof shape, "N=%lld heads=32 dr=128", (long long)c.M);
        row("rope neox", shape, timeit(op_rope, &c, reps), 2 * n * es, 0);
        // embedding rows out of a 32768 x 4096 table
        ctx_t e = {.M = 16384, .N = 4096, .ids = c.ids};
        e.a = act(32768 * e.N), e.c = act(e.M * e.N);
        snprintf(shape, sizeof shape, "N=%lld d=%lld", (long long)e.M, (long long)e.N);
        row("embed fwd", shape, timeit(op_embed_fwd, &e, reps), 2 * e.M * e.N * es, 0);
        be->free(be, c.a), be->free(be, c.ids), be->free(be, c.f), be->free(be, c.g), be->free(be, e.a);
        be->free(be, e.c);
        free(pos);
    }
    {
        ctx_t c = {.T = 16384, .C = 8448, .W = 4};
        int64_t n = (int64_t)c.T * c.C;
        c.a = act(n), c.b = act((int64_t)c.C * c.W), c.c = act(n), c.d = act(n), c.f = f32((int64_t)c.C * c.W);
        snprintf(shape, sizeof shape, "T=%d C=%d W=%d silu", c.T, c.C, c.W);
        row("conv1d fwd", shape, timeit(op_conv_fwd, &c, reps), 2 * n * es, 0);
        row("conv1d bwd", shape, timeit(op_conv_bwd, &c, reps), 3 * n * es, 0);
        be->free(be, c.a), be->free(be, c.b), be->free(be, c.c), be->free(be, c.d), be->free(be, c.f);
    }
    decode_products(reps, 0);
    check_sync("end");
    bench_finish();
    return 0;
}
