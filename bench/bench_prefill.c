// A server's prefill turns (bench_turns.h: 8 requests of 128-512 tokens fed
// apart and in one forward, two turns) on the CPU with a model file, held as
// hylo serve holds it there (the stored formats: MODEL_QUANT).
//
//   build/bench/bench_prefill MODEL [reps=3] [threads=0]
// Run it with the settings hylo chooses for itself (cli/main.c), e.g.
//   OMP_WAIT_POLICY=passive build/bench/bench_prefill MODEL
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "bench_turns.h"
#include "model/model.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_prefill MODEL [reps=3] [threads=0]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (argc > 3 && atoi(argv[3]) > 0) omp_set_num_threads(atoi(argv[3]));
    be_t *be;
    model_t m;
    model_run_t r;
    if (be_create(&be, "cpu", 64u << 20) < 0 || model_load_ex(&m, argv[1], be, MODEL_QUANT) < 0 ||
        model_run_create(&r, &m, (size_t)1 << 30) < 0) {
        fprintf(stderr, "bench_prefill: %s\n", err_msg());
        return 1;
    }
    printf("bench_prefill: %s, %d layers (%d attention, %d MLA, %d GDN, %d Mamba-2), %d threads\n", argv[1],
           m.a.n_layers, arch_count(&m.a, LAYER_ATTN), arch_count(&m.a, LAYER_MLA), arch_count(&m.a, LAYER_GDN),
           arch_count(&m.a, LAYER_M2), omp_get_max_threads());
    const char *slash = strrchr(argv[1], '/'), *name = slash && slash[1] ? slash + 1 : argv[1];
    int rc = bench_turns(name, &m, &r, reps);
    if (rc < 0) fprintf(stderr, "bench_prefill: %s\n", err_msg());
    model_run_free(&r);
    model_free(&m);
    be_destroy(be);
    return rc < 0;
}
