// The CPU products on quantised weights alone, on the real matrices of a
// model loaded with MODEL_QUANT: one pass over every matrix with one token
// (decode: weight bytes streamed per second) and with N tokens (prefill:
// multiply-adds per second), for each kernel set this CPU runs, against the
// same products on the fp32 weights through OpenBLAS (--f32 load).
//
//   build-cpu/bench/bench_qmatmul MODEL.gguf [N=256] [threads=1] [reps=5]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_quant.h"
#include "base/err.h"
#include "base/timer.h"
#include "model/model.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_qmatmul MODEL [N=256] [threads=1] [reps=5]\n");
        return 2;
    }
    int N = argc > 2 ? atoi(argv[2]) : 256, threads = argc > 3 ? atoi(argv[3]) : 1, reps = argc > 4 ? atoi(argv[4]) : 5;
    omp_set_num_threads(threads);
    be_t *be;
    model_t m;
    if (be_create(&be, "cpu", 64u << 20) < 0 || model_load_ex(&m, argv[1], be, MODEL_QUANT) < 0) {
        fprintf(stderr, "bench_qmatmul: %s\n", err_msg());
        return 1;
    }
    int64_t maxc = 0, maxr = 0;
    double bytes = 0, macs = 0;
    for (int i = 0; i < m.n_qw; i++) {
        if (m.qw[i].cols > maxc) maxc = m.qw[i].cols;
        if (m.qw[i].rows > maxr) maxr = m.qw[i].rows;
        bytes += (double)m.qw[i].rows * m.qw[i].row_bytes;
        macs += (double)m.qw[i].rows * m.qw[i].cols;
    }
    float *x = malloc(sizeof(float) * N * maxc), *y = malloc(sizeof(float) * N * maxr);
    for (int64_t i = 0; i < N * maxc; i++)
        x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    cpu_q8_t *q = malloc(sizeof(cpu_q8_t) * N * (maxc / 32));
    const cpu_qkernels_t *sets[] = {&cpu_qk_ref, &cpu_qk_avx2};
    printf("%d matrices, %.1f MB, %d threads\n", m.n_qw, bytes / 1e6, threads);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (!cpu_qk_runnable(sets[s])) continue;
        for (int pass = 0; pass < 2; pass++) {
            int64_t n = pass ? N : 1;
            // the prefill pass skips the vocabulary matrix: prefill projects one row per sequence
            double best = 1e30, mc = 0;
            for (int r = 0; r < (pass ? 1 : reps) + 1; r++) {
                double t0 = time_now();
                mc = 0;
                for (int i = 0; i < m.n_qw; i++) {
                    if (pass && m.qw[i].rows == m.a.V) continue;
                    cpu_qmatmul_with(sets[s], y, x, &m.qw[i], n, q);
                    mc += (double)m.qw[i].rows * m.qw[i].cols * n;
                }
                double t = time_now() - t0;
                if (r && t < best) best = t; // the first pass warms up
            }
            if (!pass)
                printf("%-5s N = 1:   %8.2f ms per pass, %6.2f GB/s of weights\n", sets[s]->name, best * 1e3,
                       bytes / best / 1e9);
            else
                printf("%-5s N = %d: %8.2f ms per pass, %6.1f GMAC/s (%.1f tok/s of matrix work)\n", sets[s]->name, N,
                       best * 1e3, mc / best / 1e9, N / best);
        }
        if (sets[s] == &cpu_qk_ref) continue;
    }
    (void)macs;
    model_free(&m);
    be_destroy(be);
    free(x), free(y), free(q);
    return 0;
}
