// Mamba-2 SSD timings on the GPU (CUDA backend, src/backend/cuda/cuda_ssd.cu):
// CUDA events on the backend's stream, warm-up runs first, the median of >= 10
// timed runs.
//
//   build-X/bench/bench_ssd [--quick] [--no-chunk] [--no-decode]
//
// Chunked scan (B = 1, chunk 256, T = 8192 and 65536; --quick: 8192 only) for
// the Mamba-2 cores of the Zebra / HyLo Llama students (MambaInLlama layout: x
// and B at KV width, C per head):
//   Llama-3.2-1B: H = 32, P = N = 64,  Hx = GB = 8, GC = 32
//   Llama-3.2-3B: H = 24, P = N = 128, Hx = GB = 8, GC = 24
// x, B, C are column slices of one [T, Hx P + GB N + GC N] bf16 buffer (as the
// layer's conv output), dt = softplus(N(-3, 1)) fp32, A_log = ln U(1, 16).
// "fwd" = ssd_chunk_fwd; "fwd+bwd" = ssd_chunk_fwd + ssd_chunk_bwd (no initial
// state, no final-state gradient: the training layer's call).
//
// Cost model (useful FLOPs of the chunked algorithm, per token and head, chunk
// L; masked halves of the L x L products not counted, recomputation not counted):
//   fwd = L (N + P)  [C B^T, W x]  + 4 P N  [chunk state, inter-chunk C prev]
//   bwd = L (3N + 2P) [C B^T, dy x^T, W^T dy, dCB^T C, dCB B]
//         + 10 P N    [state recompute, dprev, dstates B, x dstates, dy prev]
// times B T H; TF/s = that / time. (scripts/ref/bench_mamba_ssd.py uses the same
// model for the PyTorch reference.)
//
// Decode (ssd_recurrent_fwd, T = 1) at B = 1, 8, 64 for both models: us per step
// and GB/s of the state bytes moved (B H P N 4 read + written; the inputs are
// < 1%) against a 4 GiB device-to-device copy measured in the same run (read +
// write bytes). Enough state copies are rotated (>= 1 GB) that repeated steps do
// not run from the 50 MB L2. At B = 1 the step is a few microseconds of launch
// latency, not bandwidth.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ssd.h"
#include "base/err.h"
#include "base/rng.h"

#define BENCH_NAME "bench_ssd"
#include "bench_util.h"

static float *dev_f32(const float *h, int64_t n) {
    float *d = dalloc((size_t)n * sizeof(float));
    if (be->copy_h2d(be, d, h, (size_t)n * sizeof(float)) < 0) die("f32 upload");
    return d;
}

static void *dev_act(const float *h, int64_t n) {
    void *d = dalloc((size_t)n * 2);
    if (be->upload_act(be, d, h, n) < 0) die("act upload");
    return d;
}

typedef struct {
    const char *name;
    int H, P, N, Hx, GB, GC;
} ssd_shape_t;

static const ssd_shape_t shapes[] = {
    {"1B 64/64", 32, 64, 64, 8, 8, 32},
    {"3B 128/128", 24, 128, 128, 8, 8, 24},
};

// Host inputs of a shape: dt = softplus(N(-3, 1)), A_log = ln U(1, 16), D = 1.
static void host_params(int64_t ndt, int H, uint64_t seed, float **dt, float **A_log, float **D) {
    rng_t r;
    rng_seed(&r, seed);
    *dt = malloc((size_t)ndt * sizeof(float));
    rng_fill_normal(&r, *dt, ndt, -3.0f, 1.0f);
    for (int64_t i = 0; i < ndt; i++) {
        float v = (*dt)[i];
        (*dt)[i] = v > 20.0f ? v : log1pf(expf(v));
    }
    *A_log = malloc((size_t)H * sizeof(float));
    *D = malloc((size_t)H * sizeof(float));
    for (int h = 0; h < H; h++) {
        (*A_log)[h] = logf(1.0f + 15.0f * (float)(h + 0.5f) / (float)H);
        (*D)[h] = 1.0f;
    }
}

// ---- chunked scan --------------------------------------------------------------

typedef struct {
    const ssd_shape_t *s;
    int B, T, chunk;
    int64_t ld, oB, oC;
    void *xbc, *y, *dy, *dxbc, *A_log, *D;
    float *dt, *ddt, *dA_log, *dD;
} chunk_ctx_t;

static void *at(void *p, int64_t off) { return (char *)p + off * 2; }

static void run_fwd(void *p, int rep) {
    chunk_ctx_t *c = p;
    const ssd_shape_t *s = c->s;
    be->ssd_chunk_fwd(be, c->y, NULL, 0, c->xbc, c->ld, at(c->xbc, c->oB), c->ld, at(c->xbc, c->oC), c->ld, c->dt,
                      c->A_log, c->D, c->B, c->T, s->H, s->Hx, s->GB, s->GC, s->P, s->N, c->chunk);
}

static void run_fwd_bwd(void *p, int rep) {
    chunk_ctx_t *c = p;
    const ssd_shape_t *s = c->s;
    run_fwd(p, rep);
    be->ssd_chunk_bwd(be, c->dxbc, at(c->dxbc, c->oB), at(c->dxbc, c->oC), c->ddt, c->dA_log, c->dD, NULL, c->dy, NULL,
                      c->xbc, c->ld, at(c->xbc, c->oB), c->ld, at(c->xbc, c->oC), c->ld, c->dt, c->A_log, c->D, NULL,
                      c->B, c->T, s->H, s->Hx, s->GB, s->GC, s->P, s->N, c->chunk);
}

typedef struct {
    char line[256];
} row_t;

static double flops_fwd(const ssd_shape_t *s, int B, int T, int L) {
    return (double)B * T * s->H * ((double)L * (s->N + s->P) + 4.0 * s->P * s->N);
}
static double flops_bwd(const ssd_shape_t *s, int B, int T, int L) {
    return (double)B * T * s->H * ((double)L * (3.0 * s->N + 2.0 * s->P) + 10.0 * s->P * s->N);
}

static void bench_chunk(const ssd_shape_t *s, int T, row_t *row) {
    chunk_ctx_t c = {.s = s, .B = 1, .T = T, .chunk = 256};
    const int64_t rows = (int64_t)c.B * T;
    c.oB = (int64_t)s->Hx * s->P, c.oC = c.oB + (int64_t)s->GB * s->N, c.ld = c.oC + (int64_t)s->GC * s->N;
    c.xbc = dev_rand(rows * c.ld, 1, 0.0f, 0.7f); // silu(conv) outputs: O(0.5)
    c.dy = dev_rand(rows * s->H * s->P, 2, 0.0f, 1.0f);
    c.y = dalloc((size_t)rows * s->H * s->P * 2);
    c.dxbc = dalloc((size_t)rows * c.ld * 2);
    float *dt, *A_log, *D;
    host_params(rows * s->H, s->H, 3, &dt, &A_log, &D);
    c.dt = dev_f32(dt, rows * s->H);
    c.A_log = dev_act(A_log, s->H), c.D = dev_act(D, s->H);
    c.ddt = dalloc((size_t)rows * s->H * sizeof(float));
    float zero[256] = {0};
    c.dA_log = dev_f32(zero, s->H), c.dD = dev_f32(zero, s->H);
    free(dt), free(A_log), free(D);

    int reps = T <= 8192 ? 20 : 10;
    float t_f = time_op(run_fwd, &c, 2, reps, 2);
    float t_fb = time_op(run_fwd_bwd, &c, 2, reps, 2);
    double ff = flops_fwd(s, c.B, T, c.chunk), fb = ff + flops_bwd(s, c.B, T, c.chunk);
    snprintf(row->line, sizeof row->line,
             "| %-10s | %d | %6d | %2d | %3d | %3d | %d/%d/%2d | %9.3f | %7.1f | %10.3f | %7.1f | %7.0f |", s->name,
             c.B, T, s->H, s->P, s->N, s->Hx, s->GB, s->GC, t_f, ff / (t_f * 1e-3) / 1e12, t_fb,
             fb / (t_fb * 1e-3) / 1e12,
             (double)cuda_ssd_scratch_bytes(c.B, T, s->H, s->P, s->N, c.chunk, 1) / (1 << 20));
    printf("%s\n", row->line);
    fflush(stdout);
    void *bufs[] = {c.xbc, c.dy, c.y, c.dxbc, c.dt, c.A_log, c.D, c.ddt, c.dA_log, c.dD};
    for (int i = 0; i < 10; i++)
        be->free(be, bufs[i]);
}

// ---- decode ----------------------------------------------------------------------

typedef struct {
    const ssd_shape_t *s;
    int B, n_copies;
    int64_t ld, oB, oC;
    float **state, *dt;
    void *xbc, *y, *A_log, *D;
} step_ctx_t;

static void run_step(void *p, int rep) {
    step_ctx_t *c = p;
    const ssd_shape_t *s = c->s;
    be->ssd_recurrent_fwd(be, c->y, c->state[rep % c->n_copies], c->xbc, c->ld, at(c->xbc, c->oB), c->ld,
                          at(c->xbc, c->oC), c->ld, c->dt, c->A_log, c->D, c->B, 1, s->H, s->Hx, s->GB, s->GC, s->P,
                          s->N);
}

static void bench_step(const ssd_shape_t *s, int B, double copy_gbs, row_t *row) {
    step_ctx_t c = {.s = s, .B = B};
    c.oB = (int64_t)s->Hx * s->P, c.oC = c.oB + (int64_t)s->GB * s->N, c.ld = c.oC + (int64_t)s->GC * s->N;
    const int64_t nst = (int64_t)B * s->H * s->P * s->N;
    const double bytes = 2.0 * (double)nst * sizeof(float);
    c.n_copies = (int)ceil(1.0e9 / (nst * sizeof(float)));
    if (c.n_copies < 2) c.n_copies = 2;
    if (c.n_copies > 2048) c.n_copies = 2048;
    float *h = malloc((size_t)nst * sizeof(float));
    rng_t r;
    rng_seed(&r, 9);
    rng_fill_normal(&r, h, nst, 0.0f, 0.5f);
    c.state = calloc((size_t)c.n_copies, sizeof(float *));
    c.state[0] = dev_f32(h, nst);
    for (int i = 1; i < c.n_copies; i++) {
        c.state[i] = dalloc((size_t)nst * sizeof(float));
        if (be->copy_d2d(be, c.state[i], c.state[0], (size_t)nst * sizeof(float)) < 0) die("state copy");
    }
    free(h);
    c.xbc = dev_rand((int64_t)B * c.ld, 5, 0.0f, 0.7f);
    c.y = dalloc((size_t)B * s->H * s->P * 2);
    float *dt, *A_log, *D;
    host_params((int64_t)B * s->H, s->H, 6, &dt, &A_log, &D);
    c.dt = dev_f32(dt, (int64_t)B * s->H);
    c.A_log = dev_act(A_log, s->H), c.D = dev_act(D, s->H);
    free(dt), free(A_log), free(D);
    float t = time_op(run_step, &c, 5, 100, 5);
    double gbs = bytes / (t * 1e-3) / 1e9;
    snprintf(row->line, sizeof row->line, "| %-10s | %2d | %2d | %3d | %3d | %9.2f | %9.3f | %8.1f | %5.1f%% |",
             s->name, B, s->H, s->P, s->N, t * 1e3, bytes / 1e6, gbs, 100.0 * gbs / copy_gbs);
    printf("%s\n", row->line);
    fflush(stdout);
    for (int i = 0; i < c.n_copies; i++)
        be->free(be, c.state[i]);
    free(c.state);
    be->free(be, c.xbc), be->free(be, c.y), be->free(be, c.dt), be->free(be, c.A_log), be->free(be, c.D);
}

int main(int argc, char **argv) {
    int quick = 0, do_chunk = 1, do_decode = 1;
    const bench_flag_t flags[] = {{"--quick", &quick, 1}, {"--no-chunk", &do_chunk, 0}, {"--no-decode", &do_decode, 0}};
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    bench_init((size_t)4 << 30);
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    row_t rows[16], drows[16];
    int n_rows = 0, n_drows = 0;
    const char *hdr = "| shape      | B |      T |  H |   P |   N | Hx/GB/GC |    fwd ms | fwd TF/s | fwd+bwd ms | "
                      "f+b TF/s | bwd scratch MiB |";
    if (do_chunk) {
        printf("%s\n", hdr);
        const int Ts[2] = {8192, 65536};
        for (int ti = 0; ti < (quick ? 1 : 2); ti++)
            for (int i = 0; i < n_shapes; i++)
                bench_chunk(&shapes[i], Ts[ti], &rows[n_rows++]);
    }
    double copy_gbs = 0;
    const char *dhdr = "| shape      |  B |  H |   P |   N |  us/step | state MB |     GB/s | % copy |";
    if (do_decode) {
        copy_gbs = copy_bandwidth_gbs();
        printf("%s\n", dhdr);
        const int Bs[3] = {1, 8, 64};
        for (int i = 0; i < n_shapes; i++)
            for (int bi = 0; bi < 3; bi++)
                bench_step(&shapes[i], Bs[bi], copy_gbs, &drows[n_drows++]);
    }

    printf("\n==== summary (hylo CUDA SSD, chunk 256) ====\n");
    if (do_chunk) {
        printf("cost model per token and head: fwd L(N+P) + 4PN, bwd L(3N+2P) + 10PN FLOPs\n%s\n", hdr);
        for (int i = 0; i < n_rows; i++)
            printf("%s\n", rows[i].line);
    }
    if (do_decode) {
        printf("\ndecode step (ssd_recurrent_fwd, T = 1); copy bandwidth (4 GiB d2d, read + write): %.1f GB/s\n%s\n",
               copy_gbs, dhdr);
        for (int i = 0; i < n_drows; i++)
            printf("%s\n", drows[i].line);
    }
    bench_finish();
    return 0;
}
