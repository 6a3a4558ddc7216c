// Host time of building RoPE tables (model_ensure_positions' work: rope.c
// rope_tables, then one upload): what a model pays each time its tables grow,
// for the attention tables of a Llama-3.2-3B layer (head dim 128, llama3
// scaling) and the MLA tables of its HyLo hybrids (rope dim 64, YaRN 32 over
// 2,048), at 1M and 2M positions. Tables grown inside a decode step cost a
// step this much (docs/SERVING.md, run 23).
//
//   build/bench/bench_rope      (or build-cpu/bench/bench_rope)
#include <stdio.h>
#include <stdlib.h>

#include "base/timer.h"
#include "model/arch.h"
#include "model/rope.h"

static void time_tables(const char *name, const rope_cfg_t *r, int dr, int n_pos) {
    size_t n = (size_t)n_pos * (dr / 2);
    float *c = malloc(n * sizeof(float)), *s = malloc(n * sizeof(float));
    if (!c || !s) {
        fprintf(stderr, "bench_rope: out of memory for %d positions\n", n_pos);
        exit(1);
    }
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = time_now();
        rope_tables(r, dr, n_pos, c, s);
        double t = time_now() - t0;
        if (t < best) best = t;
    }
    printf("%-34s dim %3d  %8d positions  %7.3f s (best of 3)\n", name, dr, n_pos, best);
    free(c);
    free(s);
}

int main(void) {
    arch_t a;
    arch_init(&a);
    rope_cfg_t llama = a.rope, yarn = a.rope;
    llama.theta = 500000.0f, llama.scaling = ROPE_SCALE_LLAMA3, llama.factor = 32.0f;
    llama.low_freq_factor = 1, llama.high_freq_factor = 4, llama.orig_max_pos = 8192;
    yarn.theta = 500000.0f, yarn.scaling = ROPE_SCALE_YARN, yarn.factor = 32.0f, yarn.orig_max_pos = 2048;
    for (int n = 1 << 20; n <= 1 << 21; n *= 2) {
        time_tables("Llama-3.2-3B attention (llama3)", &llama, 128, n);
        time_tables("HyLo-3B MLA rope key (YaRN 32)", &yarn, 64, n);
    }
    return 0;
}
