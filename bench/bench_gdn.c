// Gated DeltaNet timings on the GPU (CUDA backend): CUDA events on the
// backend's stream, warm-up runs first, the median of the timed runs.
//
//   build-X/bench/bench_gdn [--quick] [--no-chunk] [--no-decode] [--kernels]
//   build-X/bench-variants/bench/bench_gdn [same] [--compare]
//
// Chunked rule (the HyLo GDN layer core, B = 1, K = 256, Dv = 512; HyLo-Llama-1B
// H = HV = 6, HyLo-Llama-3B H = HV = 9; T = 8192 and 65536, --quick: 8192):
// forward = l2norm(q), l2norm(k), gdn_chunk_fwd; forward + backward adds
// gdn_chunk_bwd and the two l2norm backwards. The l2norms are included so the
// numbers compare with FLA's chunk_gated_delta_rule(use_qk_l2norm_in_kernel=
// True) timed by scripts/ref/bench_fla_gdn.py on the same shapes (same table);
// the note column gives the chunk ops alone. No initial or final state (training).
// Inputs: q, k, v, dout ~ N(0, 1) bf16; g, beta from gdn_gate_fwd with A_log in
// [0, 2.8], dt_bias in [-5, -2], a, b ~ N(0, 1) (per-token log decays mostly
// in [-0.5, 0]).
// TFLOP/s use the spec's cost model (linear_blocks.md 2.5): forward FLOPs per
// token per value head = L (3K + 2Dv) + 6 K Dv + L^2 / 1.5 with L = 64 (0.90
// MFLOP at K = 256, Dv = 512), backward = 2.5 x forward, so fwd + bwd = 3.5 x.
// --kernels: per-kernel times of the chunk ops (gdn_cuda_timing, which makes
// the ops synchronous; run separately from the end-to-end timings).
//
// --compare (the bench-variants build: -DHYLO_BENCH_VARIANTS, against the
// library whose cuda_gdn.cu keeps the bench-only variants) times the chunk ops
// alone (no l2norms) under HYLO_GDN_STATE = 2 (the state passes on mma.sync,
// k_state) and under the default kernels (on wgmma, k_state_wg) for the same shapes (--quick: 8K),
// with the state passes' own times from gdn_cuda_timing, and gives the
// relative L2 difference of the variant's outputs (o, dq, dk, dv, dg, dbeta)
// from the default's on the same inputs: ~1e-3 is bf16 rounding taking other
// turns, O(1) a broken variant (the test has the exact check). Then nothing else runs.
//
// Decode (gdn_recurrent_fwd, T = 1) at B = 1, 8, 64 for both layers: time per
// token and GB/s of the state bytes read and written (2 B HV Dv K 4 bytes; q, k,
// v, o, g, beta are < 0.1% of it) against a device-to-device copy of a 4 GiB
// buffer measured in the same run (read + write bytes). Several copies of the
// states are rotated so that repeated calls do not hit in the 50 MB L2.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_gdn.h"
#include "base/err.h"
#include "base/rng.h"

#define BENCH_NAME "bench_gdn"
#include "bench_util.h"

static void *dev_unif(int64_t n, uint64_t seed, float lo, float hi) {
    float *h = malloc((size_t)n * sizeof(float));
    rng_t r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        h[i] = lo + (hi - lo) * rng_uniform(&r);
    void *d = dalloc((size_t)n * 2);
    if (be->upload_act(be, d, h, n) < 0) die("upload");
    free(h);
    return d;
}

// ---- chunked rule ----------------------------------------------------------------

typedef struct {
    const char *name;
    int B, T, H, HV, K, Dv;
} shape_t;

typedef struct {
    const shape_t *s;
    int with_l2;
    void *qraw, *kraw, *q, *k, *v, *o, *dout, *dq, *dk, *dv, *dqraw, *dkraw;
    float *g, *beta, *dg, *dbeta, *rq, *rk, scale;
} chunk_ctx_t;

static void run_fwd(void *p, int rep) {
    chunk_ctx_t *c = p;
    const shape_t *s = c->s;
    const int64_t rows = (int64_t)s->B * s->T * s->H;
    if (c->with_l2) {
        be->l2norm_fwd(be, c->q, c->rq, c->qraw, s->K, rows, s->K, 1e-6f);
        be->l2norm_fwd(be, c->k, c->rk, c->kraw, s->K, rows, s->K, 1e-6f);
    }
    be->gdn_chunk_fwd(be, c->o, NULL, 0, c->q, c->k, c->v, c->g, c->beta, c->scale, s->B, s->T, s->H, s->HV, s->K,
                      s->Dv);
}

static void run_fwd_bwd(void *p, int rep) {
    chunk_ctx_t *c = p;
    const shape_t *s = c->s;
    const int64_t rows = (int64_t)s->B * s->T * s->H;
    run_fwd(p, rep);
    be->gdn_chunk_bwd(be, c->dq, c->dk, c->dv, c->dg, c->dbeta, NULL, c->dout, NULL, c->q, c->k, c->v, c->g, c->beta,
                      NULL, c->scale, s->B, s->T, s->H, s->HV, s->K, s->Dv);
    if (c->with_l2) {
        be->l2norm_bwd(be, c->dqraw, s->K, c->dq, c->q, c->rq, rows, s->K);
        be->l2norm_bwd(be, c->dkraw, s->K, c->dk, c->k, c->rk, rows, s->K);
    }
}

typedef struct {
    char line[320];
} row_t;

// Spec 2.5 forward FLOPs.
static double fwd_flops(const shape_t *s) {
    const double L = 64;
    return (double)s->B * s->T * s->HV * (L * (3.0 * s->K + 2.0 * s->Dv) + 6.0 * s->K * s->Dv + L * L / 1.5);
}

// Inputs (q, k through l2norm_fwd; gates as the layer makes them) and output buffers.
static void chunk_setup(chunk_ctx_t *cp, const shape_t *s) {
    chunk_ctx_t c = {.s = s, .scale = 1.0f / sqrtf((float)s->K)};
    const int64_t N = (int64_t)s->B * s->T, nq = N * s->H * s->K, nv = N * s->HV * s->Dv, ng = N * s->HV;
    c.qraw = dev_rand(nq, 1, 0.0f, 1.0f), c.kraw = dev_rand(nq, 2, 0.0f, 1.0f), c.v = dev_rand(nv, 3, 0.0f, 1.0f);
    c.dout = dev_rand(nv, 4, 0.0f, 1.0f);
    c.q = dalloc((size_t)nq * 2), c.k = dalloc((size_t)nq * 2), c.o = dalloc((size_t)nv * 2);
    c.dq = dalloc((size_t)nq * 2), c.dk = dalloc((size_t)nq * 2), c.dv = dalloc((size_t)nv * 2);
    c.dqraw = dalloc((size_t)nq * 2), c.dkraw = dalloc((size_t)nq * 2);
    c.rq = dalloc((size_t)N * s->H * 4), c.rk = dalloc((size_t)N * s->H * 4);
    c.g = dalloc((size_t)ng * 4), c.beta = dalloc((size_t)ng * 4), c.dg = dalloc((size_t)ng * 4);
    c.dbeta = dalloc((size_t)ng * 4);
    // gates as the layer makes them
    void *a = dev_rand(ng, 5, 0.0f, 1.0f), *b = dev_rand(ng, 6, 0.0f, 1.0f);
    void *A_log = dev_unif(s->HV, 7, 0.0f, 2.8f), *dt_bias = dev_unif(s->HV, 8, -5.0f, -2.0f);
    be->gdn_gate_fwd(be, c.g, c.beta, a, s->HV, b, s->HV, A_log, dt_bias, N, s->HV, 0);
    const int64_t rows = N * s->H;
    be->l2norm_fwd(be, c.q, c.rq, c.qraw, s->K, rows, s->K, 1e-6f);
    be->l2norm_fwd(be, c.k, c.rk, c.kraw, s->K, rows, s->K, 1e-6f);
    check_sync("inputs");
    be->free(be, a), be->free(be, b), be->free(be, A_log), be->free(be, dt_bias);
    *cp = c;
}

static void chunk_free(chunk_ctx_t *c) {
    void *bufs[] = {c->qraw, c->kraw,  c->v,     c->dout, c->q,  c->k, c->o,    c->dq, c->dk,
                    c->dv,   c->dqraw, c->dkraw, c->rq,   c->rk, c->g, c->beta, c->dg, c->dbeta};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
}

// Per-kernel ms per call of `runs` forward + backward runs (gdn_cuda_timing):
// rows into krow when given; the state passes' times into k_fwd, k_bwd when given.
static void kernel_times(chunk_ctx_t *c, int runs, row_t *krow, int *n_krow, double *k_fwd, double *k_bwd) {
    const shape_t *s = c->s;
    gdn_cuda_timing(1);
    for (int i = 0; i < runs; i++)
        run_fwd_bwd(c, i);
    check_sync("kernel timing");
    gdn_cuda_timing(0);
    const char *names[16];
    double ms[16];
    int calls[16];
    int n = gdn_cuda_timing_read(names, ms, calls, 16);
    for (int i = 0; i < n; i++) {
        const double t = ms[i] / (calls[i] ? calls[i] : 1);
        if (krow && *n_krow < 64)
            snprintf(krow[(*n_krow)++].line, sizeof krow[0].line, "| %-8s | %6d | %-28s | %9.3f |", s->name, s->T,
                     names[i], t);
        if (k_fwd && strstr(names[i], "k_state (forward pass)")) *k_fwd = t;
        if (k_bwd && strstr(names[i], "k_state (both passes)")) *k_bwd = t;
    }
}

static void bench_chunk(const shape_t *s, int kernels, row_t *row, row_t *krow, int *n_krow) {
    chunk_ctx_t c;
    chunk_setup(&c, s);
    const int reps = s->T <= 8192 ? 20 : 10;
    c.with_l2 = 1;
    const float t_f = time_op(run_fwd, &c, 2, reps, 0), t_fb = time_op(run_fwd_bwd, &c, 2, reps, 0);
    c.with_l2 = 0;
    const float t_fc = time_op(run_fwd, &c, 2, reps, 0), t_fbc = time_op(run_fwd_bwd, &c, 2, reps, 0);
    const double F = fwd_flops(s);
    snprintf(row->line, sizeof row->line,
             "| %-8s | %d | %6d | %2d | %2d | %3d | %3d | %9.3f | %8.1f | %10.3f | %8.1f | chunk ops alone: fwd %.3f, "
             "fwd+bwd %.3f ms",
             s->name, s->B, s->T, s->H, s->HV, s->K, s->Dv, t_f, F / (t_f * 1e-3) / 1e12, t_fb,
             3.5 * F / (t_fb * 1e-3) / 1e12, t_fc, t_fbc);
    printf("%s\n", row->line);
    fflush(stdout);

    if (kernels) kernel_times(&c, 5, krow, n_krow, NULL, NULL);
    chunk_free(&c);
}

#ifdef HYLO_BENCH_VARIANTS
static void set_env(const char *name, const char *val) {
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
}

// n device elements (bf16 when act, else fp32) as host floats.
static float *host_copy(const void *d, int64_t n, int act) {
    float *h = malloc((size_t)n * sizeof(float));
    if (!h) die("host memory");
    if (act) {
        uint16_t *raw = malloc((size_t)n * 2);
        if (!raw || cudaMemcpy(raw, d, (size_t)n * 2, cudaMemcpyDeviceToHost) != cudaSuccess) die("download");
        for (int64_t i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)raw[i] << 16;
            memcpy(&h[i], &u, 4);
        }
        free(raw);
    } else if (cudaMemcpy(h, d, (size_t)n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        die("download");
    }
    return h;
}

// ||x - ref|| / ||ref|| (NaN anywhere: returned as NaN)
static double rel_l2(const float *x, const float *ref, int64_t n) {
    double se = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)x[i] - ref[i];
        se += d * d, ss += (double)ref[i] * ref[i];
    }
    return sqrt(se) / (ss > 0 ? sqrt(ss) : 1.0);
}

// One --compare row: the chunk ops alone under the default and the wgmma state
// passes, their k_state times, and the largest relative difference of the outputs.
static void compare_chunk(const shape_t *s, row_t *row) {
    chunk_ctx_t c;
    chunk_setup(&c, s);
    c.with_l2 = 0;
    const int reps = s->T <= 8192 ? 20 : 10;
    static const char *vars[2] = {"2", NULL}; // k_state, then the default (k_state_wg)
    float t_f[2], t_fb[2];
    double k_f[2] = {0, 0}, k_b[2] = {0, 0}, worst = 0;
    const int64_t N = (int64_t)s->B * s->T, nq = N * s->H * s->K, nv = N * s->HV * s->Dv, ng = N * s->HV;
    struct {
        const char *name;
        void *d;
        int64_t n;
        int act;
        float *ref;
    } outs[6] = {{"o", c.o, nv, 1, NULL},   {"dq", c.dq, nq, 1, NULL}, {"dk", c.dk, nq, 1, NULL},
                 {"dv", c.dv, nv, 1, NULL}, {"dg", c.dg, ng, 0, NULL}, {"dbeta", c.dbeta, ng, 0, NULL}};
    const char *worst_name = "-";
    for (int v = 0; v < 2; v++) {
        set_env("HYLO_GDN_STATE", vars[v]);
        // NaN in the whole scratch arena first: no intermediate (h, Delta, ...)
        // of the other variant's runs can stand in for one this variant skipped
        if (cudaMemset(be->scratch.base, 0xff, be->scratch.cap) != cudaSuccess) die("scratch poison");
        t_f[v] = time_op(run_fwd, &c, 2, reps, 0);
        t_fb[v] = time_op(run_fwd_bwd, &c, 2, reps, 0); // leaves this variant's outputs in c
        for (int i = 0; i < 6; i++) {
            float *h = host_copy(outs[i].d, outs[i].n, outs[i].act);
            if (v == 0) {
                outs[i].ref = h;
                continue;
            }
            const double r = rel_l2(h, outs[i].ref, outs[i].n);
            if (isnan(r) || (!isnan(worst) && r > worst)) worst = r, worst_name = outs[i].name; // NaN sticks
            free(h), free(outs[i].ref);
        }
        kernel_times(&c, 3, NULL, NULL, &k_f[v], &k_b[v]);
    }
    set_env("HYLO_GDN_STATE", NULL);
    snprintf(row->line, sizeof row->line,
             "| %-8s | %6d | %2d | %8.3f | %8.3f | %10.3f | %10.3f | %5.2fx | %7.3f | %7.3f | %7.3f | %7.3f | %.1e "
             "(%s)%s",
             s->name, s->T, s->HV, t_f[0], t_f[1], t_fb[0], t_fb[1], t_fb[0] / t_fb[1], k_f[0], k_f[1], k_b[0], k_b[1],
             worst, worst_name, worst < 5e-2 ? "" : " MISMATCH");
    printf("%s\n", row->line);
    fflush(stdout);
    chunk_free(&c);
}
#endif

// ---- decode ------------------------------------------------------------------------

typedef struct {
    int B, H, HV, K, Dv, n_copies;
    void *q, *k, *v, *o;
    float *g, *beta, **state, scale;
} dec_ctx_t;

static void run_decode(void *p, int rep) {
    dec_ctx_t *c = p;
    be->gdn_recurrent_fwd(be, c->o, c->state[rep % c->n_copies], c->q, c->k, c->v, c->g, c->beta, c->scale, c->B, 1,
                          c->H, c->HV, c->K, c->Dv);
}

static void bench_decode(const char *name, int B, int H, int HV, int K, int Dv, double copy_gbs, row_t *row) {
    dec_ctx_t c = {.B = B, .H = H, .HV = HV, .K = K, .Dv = Dv, .scale = 1.0f / sqrtf((float)K)};
    const double sbytes = (double)B * HV * Dv * K * 4;
    c.n_copies = (int)ceil(1.0e9 / sbytes);
    if (c.n_copies < 2) c.n_copies = 2;
    if (c.n_copies > 400) c.n_copies = 400;
    c.state = calloc((size_t)c.n_copies, sizeof(float *));
    float *h = malloc((size_t)B * HV * Dv * K * sizeof(float));
    rng_t r;
    rng_seed(&r, 21);
    rng_fill_normal(&r, h, (int64_t)B * HV * Dv * K, 0.0f, 0.1f);
    for (int i = 0; i < c.n_copies; i++) {
        c.state[i] = dalloc((size_t)sbytes);
        if (be->copy_h2d(be, c.state[i], h, (size_t)sbytes) < 0) die("state upload");
    }
    free(h);
    c.q = dev_rand((int64_t)B * H * K, 22, 0.0f, 0.0625f), c.k = dev_rand((int64_t)B * H * K, 23, 0.0f, 0.0625f);
    c.v = dev_rand((int64_t)B * HV * Dv, 24, 0.0f, 1.0f), c.o = dalloc((size_t)B * HV * Dv * 2);
    void *a = dev_rand((int64_t)B * HV, 25, 0.0f, 1.0f), *b = dev_rand((int64_t)B * HV, 26, 0.0f, 1.0f);
    void *A_log = dev_unif(HV, 27, 0.0f, 2.8f), *dt_bias = dev_unif(HV, 28, -5.0f, -2.0f);
    c.g = dalloc((size_t)B * HV * 4), c.beta = dalloc((size_t)B * HV * 4);
    be->gdn_gate_fwd(be, c.g, c.beta, a, HV, b, HV, A_log, dt_bias, B, HV, 0);
    check_sync("decode inputs");
    const float t = time_op(run_decode, &c, 3, 50, 0);
    const double gbs = 2.0 * sbytes / (t * 1e-3) / 1e9;
    snprintf(row->line, sizeof row->line, "| %-8s | %2d | %2d | %3d | %3d | %9.2f | %7.1f | %5.1f%% |", name, B, HV, K,
             Dv, t * 1e3, gbs, 100.0 * gbs / copy_gbs);
    printf("%s\n", row->line);
    fflush(stdout);
    for (int i = 0; i < c.n_copies; i++)
        be->free(be, c.state[i]);
    free(c.state);
    void *bufs[] = {c.q, c.k, c.v, c.o, c.g, c.beta, a, b, A_log, dt_bias};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(be, bufs[i]);
}

int main(int argc, char **argv) {
    int quick = 0, do_chunk = 1, do_decode = 1, kernels = 0;
#ifdef HYLO_BENCH_VARIANTS
    int compare = 0;
#endif
    const bench_flag_t flags[] = {
        {"--quick", &quick, 1},         {"--no-chunk", &do_chunk, 0},
        {"--no-decode", &do_decode, 0}, {"--kernels", &kernels, 1},
#ifdef HYLO_BENCH_VARIANTS
        {"--compare", &compare, 1},
#endif
    };
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    static const shape_t shapes[] = {
        {"1B GDN", 1, 0, 6, 6, 256, 512},
        {"3B GDN", 1, 0, 9, 9, 256, 512},
    };
    const int Ts[2] = {8192, 65536}, nT = quick ? 1 : 2;
    size_t scratch = 0;
    for (int i = 0; i < 2; i++)
        for (int ti = 0; ti < nT; ti++) {
            const shape_t *s = &shapes[i];
            size_t n = gdn_chunk_scratch_bytes(s->B, Ts[ti], s->H, s->HV, s->K, s->Dv, 1);
            if (n > scratch) scratch = n;
        }
    scratch += (size_t)64 << 20; // gate partials and alignment
    bench_init(scratch);
    printf("bench_gdn: scratch %.2f GB\n", scratch / 1e9);
#ifdef HYLO_BENCH_VARIANTS
    if (compare) {
        const char *chdr =
            "| layer    |      T | HV | fwd mma  | fwd wgmma | f+b mma    | f+b wgmma  | f+b    | k_state "
            "fwd ms | wgmma  | k_state bwd ms | wgmma | max rel diff (output)";
        printf("bench_gdn (bench-variants build): --compare: chunk ops alone, HYLO_GDN_STATE=2 (mma.sync "
               "state passes) vs the default (wgmma)\n%s\n",
               chdr);
        row_t crows[4];
        int n_c = 0;
        for (int ti = 0; ti < nT; ti++)
            for (int i = 0; i < 2; i++) {
                shape_t s = shapes[i];
                s.T = Ts[ti];
                compare_chunk(&s, &crows[n_c++]);
            }
        printf("\n==== summary (hylo CUDA, bench-variants: mma.sync vs wgmma state passes) ====\n%s\n", chdr);
        for (int i = 0; i < n_c; i++)
            printf("%s\n", crows[i].line);
        bench_finish();
        return 0;
    }
#endif

    row_t rows[8], krows[64], drows[16];
    int n_rows = 0, n_krows = 0, n_drows = 0;
    const char *hdr =
        "| layer    | B |      T |  H | HV |   K |  Dv |    fwd ms | fwd TF/s | fwd+bwd ms | f+b TF/s | note";
    if (do_chunk) {
        printf("%s\n", hdr);
        for (int ti = 0; ti < nT; ti++)
            for (int i = 0; i < 2; i++) {
                shape_t s = shapes[i];
                s.T = Ts[ti];
                bench_chunk(&s, kernels, &rows[n_rows++], krows, &n_krows);
            }
    }
    double copy_gbs = 0;
    if (do_decode) {
        copy_gbs = copy_bandwidth_gbs();
        const int Bs[3] = {1, 8, 64};
        for (int i = 0; i < 2; i++)
            for (int bi = 0; bi < 3; bi++)
                bench_decode(shapes[i].name, Bs[bi], shapes[i].H, shapes[i].HV, shapes[i].K, shapes[i].Dv, copy_gbs,
                             &drows[n_drows++]);
    }

    printf("\n==== summary (hylo CUDA) ====\n");
    if (do_chunk) {
        printf("TFLOP/s by the spec's 2.5 cost model: fwd 0.90 MFLOP/token/head (K 256, Dv 512), fwd+bwd 3.5x.\n");
        printf("%s\n", hdr);
        for (int i = 0; i < n_rows; i++)
            printf("%s\n", rows[i].line);
    }
    if (n_krows) {
        printf("\nper kernel (ms per call, from gdn_cuda_timing; one fwd+bwd = both lists):\n");
        printf("| layer    |      T | kernel                       |        ms |\n");
        for (int i = 0; i < n_krows; i++)
            printf("%s\n", krows[i].line);
    }
    if (do_decode) {
        printf("\ndecode (gdn_recurrent_fwd, T = 1); copy bandwidth %.1f GB/s (read + write)\n", copy_gbs);
        printf("| layer    |  B | HV |   K |  Dv |  us/token |    GB/s | %% copy |\n");
        for (int i = 0; i < n_drows; i++)
            printf("%s\n", drows[i].line);
    }
    bench_finish();
    return 0;
}
