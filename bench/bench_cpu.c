// CPU prefill and decode speed of a model, against ceilings measured in the
// same run: memory bandwidth (a large memcpy, bytes read + written) for
// decode, which must stream every weight once per token, and OpenBLAS SGEMM
// throughput for prefill, which is matrix bound.
//
//   build-cpu/bench/bench_cpu MODEL.gguf [prompt_tokens=256] [decode_tokens=64] [threads=0]
// Run it with the settings hylo chooses for itself (cli/main.c), e.g.
//   OMP_WAIT_POLICY=passive OPENBLAS_CORETYPE=SkylakeX build-cpu/bench/bench_cpu MODEL
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"
#include "model/model.h"

char *openblas_get_corename(void);

static double memcpy_gbps(void) {
    size_t n = (size_t)1 << 30;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = time_now();
#pragma omp parallel for schedule(static)
        for (int c = 0; c < 64; c++)
            memcpy(b + (size_t)c * (n / 64), a + (size_t)c * (n / 64), n / 64);
        double t = time_now() - t0;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return 2.0 * (double)n / best / 1e9;
}

static double sgemm_gflops(void) {
    int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++)
        a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = time_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = time_now() - t0;
        if (t < best) best = t;
    }
    free(a), free(b), free(c);
    return 2.0 * n * (double)n * n / best / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cpu MODEL [prompt_tokens=256] [decode_tokens=64] [threads=0]\n");
        return 2;
    }
    int P = argc > 2 ? atoi(argv[2]) : 256, D = argc > 3 ? atoi(argv[3]) : 64;
    if (argc > 4 && atoi(argv[4]) > 0) omp_set_num_threads(atoi(argv[4]));
    be_t *be;
    model_t m;
    model_run_t r;
    if (be_create(&be, "cpu", 64u << 20) < 0 || model_load(&m, argv[1], be) < 0 ||
        model_run_create(&r, &m, (size_t)1 << 30) < 0) {
        fprintf(stderr, "bench_cpu: %s\n", err_msg());
        return 1;
    }
    double bw = memcpy_gbps(), gf = sgemm_gflops();
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P + D));
    for (int i = 0; i < P + D; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % m.a.V);
    float *logits = malloc(sizeof(float) * (size_t)m.a.V);
    model_state_t st;
    // the whole room at once: no growth inside the timed runs
    if (model_state_alloc(&m, &st, 1, P + D + 1) < 0 || model_state_reserve(&m, &st, P + D + 1) < 0) {
        fprintf(stderr, "bench_cpu: %s\n", err_msg());
        return 1;
    }
    // warm-up, then timed runs
    model_prefill(&r, &st, ids, 32, 0, logits);
    model_state_reset(&m, &st);
    double t0 = time_now();
    if (model_prefill(&r, &st, ids, P, 512, logits) < 0) {
        fprintf(stderr, "bench_cpu: %s\n", err_msg());
        return 1;
    }
    double tp = time_now() - t0;
    t0 = time_now();
    for (int i = 0; i < D; i++)
        model_step(&r, &st, &ids[P + i], logits);
    double td = time_now() - t0;
    int64_t params = ptable_count(&m.pt);
    double wbytes = (double)params * sizeof(float); // fp32 weights streamed per decode step
    double flops_tok = 2.0 * (double)params;        // matmul FLOPs per token (attention over a short prompt is small)
    double prefill_tps = P / tp, decode_tps = D / td;
    printf("threads              %d (OpenBLAS kernels %s, OMP_WAIT_POLICY %s)\n", omp_get_max_threads(),
           openblas_get_corename(), getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "default");
    printf("parameters           %lld (fp32 weights: %.1f MB)\n", (long long)params, wbytes / 1e6);
    printf("memcpy bandwidth     %.1f GB/s (read + write, 1 GiB, best of 5)\n", bw);
    printf("sgemm                %.1f GFLOP/s (1024^3, best of 5)\n", gf);
    printf("prefill              %d tokens in %.3f s: %.1f tok/s = %.1f GFLOP/s = %.0f%% of sgemm\n", P, tp,
           prefill_tps, prefill_tps * flops_tok / 1e9, 100.0 * prefill_tps * flops_tok / 1e9 / gf);
    printf("decode               %d tokens in %.3f s: %.2f tok/s; bandwidth bound %.2f tok/s (%.0f%%)\n", D, td,
           decode_tps, bw * 1e9 / wbytes, 100.0 * decode_tps / (bw * 1e9 / wbytes));
    model_state_free(&m, &st);
    model_run_free(&r);
    model_free(&m);
    be_destroy(be);
    free(ids);
    free(logits);
    return 0;
}
