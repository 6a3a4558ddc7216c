// Attention and MLA decode timings on the GPU (CUDA backend): CUDA events on
// the backend's stream, warm-up runs first, the median of the timed runs.
//
//   build-X/bench/bench_attn [--quick | --mid] [--no-attn] [--no-decode]
//   build-X/bench-variants/bench/bench_attn [same] [--compare] [--sweep]
//
// build-X/bench/bench_attn links libhylo.a: the production kernels, one per
// job. The bench-variants build (Makefile: compiled with -DHYLO_BENCH_VARIANTS
// against the library whose CUDA files keep the bench-only kernel variants)
// adds --compare, which times every variant in one run, set through the
// environment variables only that library reads: attention forward
// HYLO_ATTN_FWD = 2 (mma.sync, k_attn_fwd, at every head dim; the default is
// wgmma, cuda_attn_wgmma.cuh, at (dqk, dv) = (64, 64), (128, 128) and
// (192, 128)), 3 (the wgmma forward with its blocks in sections of (b, kv head)
// units whose K and V fit in L2, k_attn_fwd_wgmma_l2), 4 (the same order on
// one persistent wave of blocks), both tuned by HYLO_ATTN_FWD_L2MB (the
// section budget, default 32), HYLO_ATTN_FWD_UNITS (units per section in its
// place) and HYLO_ATTN_FWD_BLOCKS (the persistent grid);
// attention backward HYLO_ATTN_BWD = 3 (v2, k_attn_bwd2), 2 (v1 with its
// default tiles), 1 (v1's alternative tiles), all mma.sync (the default is
// wgmma, cuda_attn_wgmma_bwd.cuh, at the wgmma forward's head dims, its dQ
// added by bulk tensor reductions at head dims of 128 and more), 6 (the wgmma
// backward with dQ by register adds: "f+b wgmma"), 5 (with dQ by bulk tensor
// reductions: "f+b dQ bulk");
// MLA decode HYLO_MLA_DECODE = 1 (v1), 3 (v2, one bulk copy per row), 2 (v2,
// cp.async), 0 (v2, tiled tensor copies: the default). --sweep adds default
// decode runs over HYLO_MLA_WARPS x HYLO_MLA_STAGES.
//
// Attention (B = 1, T = 8192 and 65536; --quick: 8192 only; --mid: 16384 and
// 32768, where the L2 block order of the forward has not been measured): forward (with
// lse) and forward + backward, in ms and TFLOP/s with causal FLOPs
// fwd = 2 B H T^2 (dqk + dv) / 2, bwd = 2.5 x fwd. The same shapes go through
// scripts/ref/bench_sdpa.py (torch SDPA, cuDNN and flash backends) for the ratio.
// MLA decode at len 65536, 262144, 1048576 rows per sequence: GB/s of the
// cache bytes read (B len (r_kv + dr) 2) against a device-to-device copy of a
// 4 GiB buffer measured in the same run (read + write bytes). Several copies
// of the cache are rotated so that repeated calls do not run out of L2.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"
#include "base/rng.h"

#define BENCH_NAME "bench_attn"
#include "bench_util.h"

// ---- attention ----------------------------------------------------------------

typedef struct {
    const char *name;
    int B, T, H, Hkv, dqk, dv;
} attn_shape_t;

typedef struct {
    const attn_shape_t *s;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, scale;
} attn_ctx_t;

static void run_fwd(void *p, int rep) {
    attn_ctx_t *c = p;
    const attn_shape_t *s = c->s;
    be->attn_fwd(be, c->o, c->lse, c->q, c->k, c->v, s->B, s->T, s->T, s->H, s->Hkv, s->dqk, s->dv, c->scale, 1);
}

static void run_fwd_bwd(void *p, int rep) {
    attn_ctx_t *c = p;
    const attn_shape_t *s = c->s;
    be->attn_fwd(be, c->o, c->lse, c->q, c->k, c->v, s->B, s->T, s->T, s->H, s->Hkv, s->dqk, s->dv, c->scale, 1);
    be->attn_bwd(be, c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->o, c->lse, s->B, s->T, s->T, s->H, s->Hkv,
                 s->dqk, s->dv, c->scale);
}

typedef struct {
    char line[256];
} row_t;

static int compare; // time every variant (--compare; bench-variants build only)

static void set_env(const char *name, const char *val) {
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
}

static void bench_attn_shape(const attn_shape_t *s, row_t *row) {
    attn_ctx_t c = {.s = s, .scale = 1.0f / sqrtf((float)s->dqk)};
    const int64_t nq = (int64_t)s->B * s->T * s->H * s->dqk, nk = (int64_t)s->B * s->T * s->Hkv * s->dqk;
    const int64_t nv = (int64_t)s->B * s->T * s->Hkv * s->dv, no = (int64_t)s->B * s->T * s->H * s->dv;
    c.q = dev_rand(nq, 1, 0.0f, 1.0f), c.k = dev_rand(nk, 2, 0.0f, 1.0f), c.v = dev_rand(nv, 3, 0.0f, 1.0f);
    c.dout = dev_rand(no, 4, 0.0f, 1.0f), c.o = dev_rand(no, 5, 0.0f, 1.0f);
    c.dq = dalloc((size_t)nq * 2), c.dk = dalloc((size_t)nk * 2), c.dv = dalloc((size_t)nv * 2);
    c.lse = dalloc((size_t)s->B * s->H * s->T * sizeof(float));
    int reps = s->T <= 8192 ? 20 : 10;
    float t_f = time_op(run_fwd, &c, 2, reps, 0);
    double flop_f = 2.0 * s->B * s->H * (double)s->T * s->T * (s->dqk + s->dv) / 2.0;
    if (!compare) {
        float t_fb = time_op(run_fwd_bwd, &c, 2, reps, 0);
        snprintf(row->line, sizeof row->line,
                 "| %-12s | %d | %6d | %2d | %2d | %3d | %3d | %9.3f | %7.1f | %10.3f | %7.1f |", s->name, s->B, s->T,
                 s->H, s->Hkv, s->dqk, s->dv, t_f, flop_f / (t_f * 1e-3) / 1e12, t_fb,
                 3.5 * flop_f / (t_fb * 1e-3) / 1e12);
    } else {
        // backward variants: v2 (3), v1 with its default tiles (2), v1's alternative tiles (1)
        static const char *vars[3] = {"3", "2", "1"};
        float t_fb[3];
        char *saved = getenv("HYLO_ATTN_BWD") ? strdup(getenv("HYLO_ATTN_BWD")) : NULL; // setenv may move it
        for (int i = 0; i < 3; i++) {
            setenv("HYLO_ATTN_BWD", vars[i], 1);
            t_fb[i] = time_op(run_fwd_bwd, &c, 2, reps, 0);
        }
        // the forward variants: mma.sync, k_attn_fwd (HYLO_ATTN_FWD = 2; the
        // default forward is wgmma at the head dims it takes, elsewhere the
        // columns agree), wgmma in L2-sized sections (3) and persistent (4)
        static const char *fvars[3] = {"2", "3", "4"};
        float t_fv[3];
        for (int i = 0; i < 3; i++) {
            setenv("HYLO_ATTN_FWD", fvars[i], 1);
            t_fv[i] = time_op(run_fwd, &c, 2, reps, 0);
        }
        unsetenv("HYLO_ATTN_FWD");
        // the wgmma backward with dQ by register adds (6; where it does not
        // apply, as v2's column); bwd wg/v2 compares the backward parts alone
        // (each f+b less the default forward)
        setenv("HYLO_ATTN_BWD", "6", 1);
        float t_fbw = time_op(run_fwd_bwd, &c, 2, reps, 0);
        // the wgmma backward with its dQ tiles added by bulk tensor reductions (5)
        setenv("HYLO_ATTN_BWD", "5", 1);
        float t_fbq = time_op(run_fwd_bwd, &c, 2, reps, 0);
        set_env("HYLO_ATTN_BWD", saved);
        free(saved);
        snprintf(row->line, sizeof row->line,
                 "| %-12s | %6d | %2d | %2d | %3d | %3d | %8.3f | %8.3f | %8.3f | %8.3f | %10.3f | %10.3f | %10.3f | "
                 "%5.3f | %9.3f | %9.3f | %11.3f |",
                 s->name, s->T, s->H, s->Hkv, s->dqk, s->dv, t_f, t_fv[0], t_fv[1], t_fv[2], t_fb[0], t_fb[1], t_fb[2],
                 (t_fb[0] - t_f) / (t_fb[1] - t_f), t_fbw, (t_fbw - t_f) / (t_fb[0] - t_f), t_fbq);
    }
    printf("%s\n", row->line);
    fflush(stdout);
    void *bufs[] = {c.q, c.k, c.v, c.o, c.dout, c.dq, c.dk, c.dv, c.lse};
    for (int i = 0; i < 9; i++)
        be->free(be, bufs[i]);
}

// ---- MLA decode -----------------------------------------------------------------

typedef struct {
    int B, H, r_kv, dr;
    int64_t len;
    int n_copies;
    void **cache, *q_lat, *q_pe, *out;
    void ***rows; // per copy: device array of the B sequences' row 0 (the op takes a pointer per row)
    int32_t *len_d;
} mla_ctx_t;

static void run_mla(void *p, int rep) {
    mla_ctx_t *c = p;
    int i = rep % c->n_copies;
    // one buffer holds the B sequences: it is the pool (the tiled copies' tensor map)
    be->mla_decode_attn(be, c->out, c->q_lat, c->q_pe, (int64_t)c->H * c->dr, c->dr, c->rows[i], (be_pages_t){0},
                        c->len_d, (int)c->len, c->cache[i], c->B * c->len, c->B, c->H, c->r_kv, c->dr,
                        1.0f / sqrtf((float)(c->r_kv + c->dr)));
}

static int sweep; // v2 decode over HYLO_MLA_WARPS x HYLO_MLA_STAGES (--sweep; bench-variants build only)

static void bench_mla(int B, int H, int r_kv, int dr, int64_t len, double copy_gbs, row_t *row) {
    mla_ctx_t c = {.B = B, .H = H, .r_kv = r_kv, .dr = dr, .len = len};
    const double bytes = (double)B * len * (r_kv + dr) * 2;
    c.n_copies = (int)ceil(1.0e9 / bytes); // >= 1 GB in rotation: far beyond the 50 MB L2
    if (c.n_copies < 2) c.n_copies = 2;
    if (c.n_copies > 48) c.n_copies = 48;
    c.cache = calloc((size_t)c.n_copies, sizeof(void *));
    c.cache[0] = dev_rand((int64_t)B * len * (r_kv + dr), 11, 0.0f, 1.0f);
    for (int i = 1; i < c.n_copies; i++) {
        c.cache[i] = dalloc((size_t)bytes);
        if (be->copy_d2d(be, c.cache[i], c.cache[0], (size_t)bytes) < 0) die("cache copy");
    }
    c.rows = calloc((size_t)c.n_copies, sizeof(void **));
    for (int i = 0; i < c.n_copies; i++) {
        void *h[64];
        for (int b = 0; b < B; b++)
            h[b] = (char *)c.cache[i] + (size_t)b * len * (r_kv + dr) * 2;
        c.rows[i] = dalloc(sizeof(void *) * B);
        if (be->copy_h2d(be, c.rows[i], h, sizeof(void *) * B) < 0) die("upload rows");
    }
    c.q_lat = dev_rand((int64_t)B * H * r_kv, 12, 0.0f, 1.0f), c.q_pe = dev_rand((int64_t)B * H * dr, 13, 0.0f, 1.0f);
    c.out = dalloc((size_t)B * H * r_kv * 2);
    c.len_d = dalloc(sizeof(int32_t) * B);
    int32_t lens[64];
    for (int b = 0; b < B; b++)
        lens[b] = (int32_t)len;
    if (be->copy_h2d(be, c.len_d, lens, sizeof(int32_t) * B) < 0) die("upload lens");
    if (!compare) {
        float t = time_op(run_mla, &c, 3, 30, 0);
        double gbs = bytes / (t * 1e-3) / 1e9;
        snprintf(row->line, sizeof row->line, "| mla_decode | %d | %7lld | %2d | %3d | %2d | %8.4f | %7.1f | %5.1f%% |",
                 B, (long long)len, H, r_kv, dr, t, gbs, 100.0 * gbs / copy_gbs);
    } else {
        // v1 (1), v2 with a bulk copy per row (3), with cp.async (2), with tiled tensor copies (0)
        enum { NV = 4 };
        static const char *vars[NV] = {"1", "3", "2", "0"};
        char *saved = getenv("HYLO_MLA_DECODE") ? strdup(getenv("HYLO_MLA_DECODE")) : NULL;
        float t[NV];
        for (int i = 0; i < NV; i++) {
            setenv("HYLO_MLA_DECODE", vars[i], 1);
            t[i] = time_op(run_mla, &c, 3, 30, 0);
        }
        set_env("HYLO_MLA_DECODE", saved);
        free(saved);
        int n =
            snprintf(row->line, sizeof row->line, "| %d | %7lld | %2d | %3d | %2d |", B, (long long)len, H, r_kv, dr);
        for (int i = 0; i < NV; i++) {
            double gbs = bytes / (t[i] * 1e-3) / 1e9;
            n += snprintf(row->line + n, sizeof row->line - n, " %8.4f %5.1f%% |", t[i], 100.0 * gbs / copy_gbs);
        }
        if (sweep) { // the default (tiled copies) over consumer warps x ring slots, printed as they come
            static const char *warps[] = {"4", "8", "11"}, *stages[] = {"6", "12", "32"};
            setenv("HYLO_MLA_DECODE", "0", 1);
            for (int wi = 0; wi < 3; wi++)
                for (int si = 0; si < 3; si++) {
                    setenv("HYLO_MLA_WARPS", warps[wi], 1);
                    setenv("HYLO_MLA_STAGES", stages[si], 1);
                    float ts = time_op(run_mla, &c, 3, 30, 0);
                    printf("  sweep B=%d len=%lld H=%d r_kv=%d dr=%d warps=%s stages=%s: %.4f ms, %.1f%% copy\n", B,
                           (long long)len, H, r_kv, dr, warps[wi], stages[si], ts,
                           100.0 * bytes / (ts * 1e-3) / 1e9 / copy_gbs);
                }
            unsetenv("HYLO_MLA_WARPS");
            unsetenv("HYLO_MLA_STAGES");
            unsetenv("HYLO_MLA_DECODE");
        }
    }
    printf("%s\n", row->line);
    fflush(stdout);
    for (int i = 0; i < c.n_copies; i++)
        be->free(be, c.cache[i]), be->free(be, c.rows[i]);
    free(c.cache), free(c.rows);
    be->free(be, c.q_lat), be->free(be, c.q_pe), be->free(be, c.out), be->free(be, c.len_d);
}

int main(int argc, char **argv) {
    int quick = 0, mid = 0, do_attn = 1, do_decode = 1;
    const bench_flag_t flags[] = {
        {"--quick", &quick, 1},         {"--mid", &mid, 1},       {"--no-attn", &do_attn, 0},
        {"--no-decode", &do_decode, 0},
#ifdef HYLO_BENCH_VARIANTS
        {"--compare", &compare, 1},     {"--sweep", &compare, 1}, {"--sweep", &sweep, 1},
#endif
    };
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    bench_init((size_t)4 << 30);
#ifdef HYLO_BENCH_VARIANTS
    const char *vb = getenv("HYLO_ATTN_BWD"), *vm = getenv("HYLO_MLA_DECODE"), *vf = getenv("HYLO_ATTN_FWD");
    if (compare)
        printf("bench_attn (bench-variants build): --compare: every variant\n");
    else
        printf("bench_attn (bench-variants build): kernel variants fwd %s, bwd %s, mla decode %s\n", vf ? vf : "0",
               vb ? vb : "0", vm ? vm : "0");
#else
    printf("bench_attn: production kernels\n");
#endif

    static const attn_shape_t shapes[] = {
        {"MLA 64/64", 1, 0, 32, 32, 64, 64},     {"MLA 128/128", 1, 0, 24, 24, 128, 128},
        {"MLA 192/128", 1, 0, 32, 32, 192, 128}, {"GQA 64", 1, 0, 32, 8, 64, 64},
        {"GQA 128", 1, 0, 24, 8, 128, 128},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    row_t rows[32], drows[32];
    int n_rows = 0, n_drows = 0;
    const char *hdr =
        compare ? "| shape        |      T |  H | Hkv | dqk |  dv |   fwd ms |  fwd mma |   fwd L2 | fwd pers | "
                  "f+b ms v2  | f+b ms v1  | f+b v1-alt | bwd v2/v1 | f+b wgmma | bwd wg/v2 | f+b dQ bulk |"
                : "| shape        | B |      T |  H | Hkv | dqk |  dv |    fwd ms | fwd TF/s | fwd+bwd ms | "
                  "f+b TF/s |";
    if (do_attn) {
        printf("%s\n", hdr);
        const int Ts[2] = {mid ? 16384 : 8192, mid ? 32768 : 65536};
        for (int ti = 0; ti < (quick ? 1 : 2); ti++)
            for (int i = 0; i < n_shapes; i++) {
                attn_shape_t s = shapes[i];
                s.T = Ts[ti];
                bench_attn_shape(&s, &rows[n_rows++]);
            }
    }
    double copy_gbs = 0;
    if (do_decode) {
        copy_gbs = copy_bandwidth_gbs();
        static const int cfg[][4] = {{1, 32, 128, 32}, {8, 32, 128, 32}, {1, 9, 128, 64},
                                     {1, 16, 512, 64}, {1, 32, 128, 64}, {8, 9, 128, 64}};
        const int64_t lens[3] = {65536, 262144, 1048576};
        for (int ci = 0; ci < (compare ? 6 : 4); ci++)
            for (int li = 0; li < 3; li++)
                bench_mla(cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][3], lens[li], copy_gbs, &drows[n_drows++]);
    }

    printf("\n==== summary (hylo CUDA) ====\n");
    if (do_attn) {
        printf("%s\n", hdr);
        for (int i = 0; i < n_rows; i++)
            printf("%s\n", rows[i].line);
    }
    if (do_decode) {
        printf("\ncopy bandwidth (4 GiB device-to-device, read + write): %.1f GB/s\n", copy_gbs);
        if (compare)
            printf("| B |     len |  H | r_kv | dr | v1 ms   %%copy | v2 rows ms %%copy | v2 cp.async ms %%copy | v2 "
                   "tiles "
                   "ms %%copy |\n");
        else
            printf("| op         | B |     len |  H | r_kv | dr |       ms |    GB/s | %% copy |\n");
        for (int i = 0; i < n_drows; i++)
            printf("%s\n", drows[i].line);
    }
    bench_finish();
    return 0;
}
