// Time to open (or reject) input files with very many names: a GGUF of N
// tensors and N / 4 metadata keys, the same with the last tensor's name a
// duplicate of the first (rejected), and a config.json of N keys (its
// duplicate-key check). Before the names were sorted, a GGUF of 200K tensors
// took about 4 minutes to reject and 50K keys 6-9 s (pairwise comparisons).
//
//   build-cpu/bench/bench_load [N=200000] [repeats=3]
// The files are written to $TMPDIR (default /tmp) and removed afterwards.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timer.h"
#include "io/config.h"
#include "io/gguf.h"

static void put(FILE *f, const void *p, size_t n) {
    if (fwrite(p, 1, n, f) != n) {
        perror("bench_load: write");
        exit(1);
    }
}
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s) {
    put_u64(f, strlen(s));
    put(f, s, strlen(s));
}

// n_t one-element-row F32 tensors of 8 values, n_kv uint32 keys; dup: the
// last tensor repeats the first name.
static void write_gguf(const char *path, int n_t, int n_kv, int dup) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    put_u32(f, 0x46554747u);
    put_u32(f, 3);
    put_u64(f, (uint64_t)n_t);
    put_u64(f, (uint64_t)n_kv);
    char s[32];
    for (int i = 0; i < n_kv; i++) {
        snprintf(s, sizeof s, "key.%d", i);
        put_str(f, s);
        put_u32(f, GGUF_UINT32);
        put_u32(f, (uint32_t)i);
    }
    for (int i = 0; i < n_t; i++) {
        snprintf(s, sizeof s, "blk.%d.weight", dup && i == n_t - 1 ? 0 : i);
        put_str(f, s);
        put_u32(f, 1);
        put_u64(f, 8);
        put_u32(f, GGML_F32);
        put_u64(f, (uint64_t)i * 32);
    }
    long pos = ftell(f);
    static const char zero[32];
    put(f, zero, (size_t)((32 - pos % 32) % 32));
    float v[8] = {0};
    for (int i = 0; i < n_t; i++)
        put(f, v, sizeof v);
    fclose(f);
}

static double best_of(int repeats, const char *path, int want_rc) {
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        gguf_t g;
        double t0 = time_now();
        int rc = gguf_open(&g, path);
        double t = time_now() - t0;
        if ((rc < 0) != (want_rc < 0)) {
            fprintf(stderr, "bench_load: %s: rc %d: %s\n", path, rc, err_msg());
            exit(1);
        }
        if (rc == 0) gguf_close(&g);
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000, repeats = argc > 2 ? atoi(argv[2]) : 3;
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/bench_load_%d.gguf", tmp, (int)getpid());
    snprintf(p2, sizeof p2, "%s/bench_load_dup_%d.gguf", tmp, (int)getpid());
    write_gguf(p1, n, n / 4, 0);
    write_gguf(p2, n, n / 4, 1);
    printf("gguf_open, %d tensors + %d keys: %.3f s (best of %d)\n", n, n / 4, best_of(repeats, p1, 0), repeats);
    printf("gguf_open, the same with a duplicate name (rejected): %.3f s\n", best_of(repeats, p2, -1));
    remove(p1);
    remove(p2);

    // config.json with n keys ahead of the real ones (each an unknown key: ignored after the duplicate check).
    size_t cap = (size_t)n * 24 + 512, len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text + len, cap - len, "{");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "\"extra_%d\": %d, ", i, i);
    snprintf(text + len, cap - len,
             "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}");
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        arch_t a;
        double t0 = time_now();
        if (cfg_parse_config_json(text, "bench", &a) < 0) {
            fprintf(stderr, "bench_load: config: %s\n", err_msg());
            return 1;
        }
        double t = time_now() - t0;
        if (t < best) best = t;
    }
    printf("cfg_parse_config_json, %d keys: %.3f s (best of %d)\n", n + 6, best, repeats);
    free(text);
    return 0;
}
