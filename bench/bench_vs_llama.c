// hylo against llama.cpp on the CPU, same GGUF, same tokens, same threads, in
// one run: prefill of P tokens (chunks of 512 on both sides) and D decode steps, alternating
// hylo and llama.cpp (scripts/ref/bench_llama_cpp.py through llama-cpp-python)
// for R rounds so both see the same machine load; prints every round, the
// median of each side and the ratios hylo / llama.cpp (>= 1: hylo is faster).
//
//   GOMP_SPINCOUNT=10000 OPENBLAS_THREAD_TIMEOUT=4 OPENBLAS_CORETYPE=SkylakeX
//       build-cpu/bench/bench_vs_llama MODEL.gguf [--python .venv-llama/bin/python] [--prompt 256]
//       [--decode 64] [--threads 2] [--rounds 3] [--f32] [--no-llama]
//
// The environment is the one hylo generate / chat set for themselves
// (cli/main.c); llama.cpp's process gets it without those variables (its
// OpenMP threads spin by default, as in its own tools). --f32: hylo with every
// weight dequantised at load (the path before quantised products), for the
// record; run it with OMP_WAIT_POLICY=passive, what hylo sets for that path.
// --no-llama: hylo's side alone (its rounds, medians and peak RSS).
// hylo's side does what gen_run does: the cache sized to the request (P + D
// + 1 tokens) up front, the prefill's temporaries given back before decoding.
// Memory: peak RSS of each process (hylo's: the weights, the cache, the
// touched pages of its arenas, code and libraries; llama.cpp's the mapped
// file and its buffers); MB are 10^6 bytes.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "base/err.h"
#include "base/timer.h"
#include "model/model.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "bench_vs_llama: %s: %s\n", what, err_msg());
    exit(1);
}

int main(int argc, char **argv) {
    const char *model = NULL, *py = ".venv-llama/bin/python";
    int P = 256, D = 64, threads = 2, R = 3, f32 = 0, no_llama = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--python") && i + 1 < argc)
            py = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--f32"))
            f32 = 1;
        else if (!strcmp(argv[i], "--no-llama"))
            no_llama = 1;
        else if (argv[i][0] != '-' && !model)
            model = argv[i];
        else {
            fprintf(stderr, "usage: bench_vs_llama MODEL [--python PY] [--prompt P] [--decode D] [--threads N] "
                            "[--rounds R] [--f32] [--no-llama]\n");
            return 2;
        }
    }
    if (!model || P < 32 || P > 16384 || D < 1 || threads < 1 || R < 1 || R > 20) {
        fprintf(stderr, "bench_vs_llama: MODEL needed; 32 <= prompt <= 16384, decode >= 1, 1 <= rounds <= 20\n");
        return 2;
    }
    omp_set_num_threads(threads);
    be_t *be;
    model_t m;
    model_run_t r;
    model_state_t st;
    if (be_create(&be, "cpu", 64u << 20) < 0) die("backend");
    if (model_load_ex(&m, model, be, f32 ? 0 : MODEL_QUANT) < 0) die(model);
    if (model_run_create(&r, &m, (size_t)1 << 30) < 0 || model_state_alloc(&m, &st, 1, P + D + 1) < 0 ||
        model_state_fit(&m, &st, P + D + 1) < 0) // the whole request up front, as gen_run takes it
        die("run");
    size_t qbytes = 0;
    for (int i = 0; i < m.n_qw; i++)
        qbytes += (size_t)m.qw[i].rows * m.qw[i].row_bytes;
    printf("model                %s\n", model);
    printf("hylo weights         %d matrices in their stored format (%.1f MB), the rest fp32\n", m.n_qw, qbytes / 1e6);
    printf("threads              %d; prompt %d tokens (%s), decode %d tokens; %d rounds\n", threads, P,
           P > 512 ? "chunks of 512" : "one chunk", D, R);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P + D));
    for (int i = 0; i < P + D; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % m.a.V);
    float *logits = malloc(sizeof(float) * (size_t)m.a.V);
    double hp[20], hd[20], lp[20], ld[20], lrss = 0;
    model_prefill(&r, &st, ids, 32, 0, logits); // warm-up, as the script's
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_THREAD_TIMEOUT -u OPENBLAS_CORETYPE %s "
             "scripts/ref/bench_llama_cpp.py '%s' --prompt %d "
             "--decode %d --threads %d",
             py, model, P, D, threads);
    for (int k = 0; k < R; k++) {
        model_state_reset(&m, &st);
        double t0 = time_now();
        if (model_prefill(&r, &st, ids, P, 512, logits) < 0) die("prefill");
        model_run_trim(&r); // as gen_run
        double tp = time_now() - t0;
        t0 = time_now();
        for (int i = 0; i < D; i++)
            if (model_step(&r, &st, &ids[P + i], logits) < 0) die("decode");
        double td = time_now() - t0;
        hp[k] = P / tp, hd[k] = D / td;
        if (no_llama) {
            printf("round %d              hylo prefill %7.1f tok/s decode %6.2f tok/s\n", k + 1, hp[k], hd[k]);
            fflush(stdout);
            continue;
        }
        FILE *f = popen(cmd, "r");
        char line[512];
        int got = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "llama.cpp prefill %lf decode %lf rss_mb %lf", &lp[k], &ld[k], &lrss) == 3) got = 1;
        if (!f || pclose(f) != 0 || !got) {
            fprintf(stderr, "bench_vs_llama: '%s' gave no result (llama-cpp-python installed? see the script)\n", cmd);
            return 1;
        }
        printf("round %d              hylo prefill %7.1f tok/s decode %6.2f tok/s | llama.cpp prefill %7.1f tok/s "
               "decode %6.2f tok/s\n",
               k + 1, hp[k], hd[k], lp[k], ld[k]);
        fflush(stdout);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    struct stat sb;
    double file = stat(model, &sb) == 0 ? (double)sb.st_size / 1e6 : 0, cache = st.bytes / 1e6;
    double rss = ru.ru_maxrss * 1024.0 / 1e6; // ru_maxrss: KiB
    double mhp = median(hp, R), mhd = median(hd, R);
    if (no_llama) {
        printf("median               hylo prefill %7.1f tok/s decode %6.2f tok/s\n", mhp, mhd);
    } else {
        double mlp = median(lp, R), mld = median(ld, R);
        printf("median               hylo prefill %7.1f tok/s decode %6.2f tok/s | llama.cpp prefill %7.1f tok/s "
               "decode %6.2f tok/s\n",
               mhp, mhd, mlp, mld);
        printf("ratio hylo/llama.cpp prefill %.2fx  decode %.2fx (medians)\n", mhp / mlp, mhd / mld);
    }
    printf("peak RSS             hylo %.1f MB", rss);
    if (!no_llama) printf(" | llama.cpp %.1f MB", lrss * 1048576.0 / 1e6); // the script's MiB
    printf("\ntarget file + cache  %.1f MB + %.1f MB = %.1f MB: hylo %s by %.1f MB\n", file, cache, file + cache,
           rss <= file + cache ? "under it" : "over it", fabs(rss - file - cache));
    model_state_free(&m, &st);
    model_run_free(&r);
    model_free(&m);
    be_destroy(be);
    free(ids);
    free(logits);
    return 0;
}
