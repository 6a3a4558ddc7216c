// Where hylo's memory goes on the CPU with quantised weights: the steps of
// hylo generate (backend, model, tokenizer, run, state, prefill of P tokens in
// one chunk, D decode steps with greedy sampling, each of gen_run's steps
// (cache fitted to the request, prefill, trim, decode) on its own; the token
// ids of bench_vs_llama), and after each step the process's resident memory
// (/proc/self/status: VmRSS, VmHWM, RssAnon, RssFile), glibc's heap
// (mallinfo2: bytes in use from the heap and from mmap) and the resident bytes
// of each of hylo's large buffers (mincore over the buffer's pages: pages the
// buffer shares with its neighbours are counted in both).
//
//   build-cpu/bench/bench_mem MODEL.gguf [--prompt 256] [--decode 64] [--threads 2] [--ctx 4096]
//
// The budget the issue sets (file + cache) is printed at the end beside the
// peak; MB here are 10^6 bytes throughout.
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/timer.h"
#include "infer/sampler.h"
#include "io/weights.h"
#include "model/model.h"
#include "tok/tok.h"

static void die(const char *what) {
    fprintf(stderr, "bench_mem: %s: %s\n", what, err_msg());
    exit(1);
}

// Resident bytes of [p, p + n) (whole pages).
static size_t resident(const void *p, size_t n) {
    if (!p || !n) return 0;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = ((uintptr_t)p + n + pg - 1) & ~(uintptr_t)(pg - 1);
    size_t np = (e - a) / pg, r = 0;
    unsigned char *v = malloc(np);
    if (!v || mincore((void *)a, e - a, v) != 0) {
        free(v);
        return 0;
    }
    for (size_t i = 0; i < np; i++)
        r += v[i] & 1;
    free(v);
    return r * pg;
}

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') v = atol(line + k + 1);
    if (f) fclose(f);
    return v;
}

static double mb(double b) { return b / 1e6; }

typedef struct {
    be_t *be;
    model_t *m;
    model_run_t *r;
    model_state_t *st;
} bufs_t;

static void report(const char *stage, const bufs_t *b) {
    struct mallinfo2 mi = mallinfo2();
    printf("%-22s rss %7.2f hwm %7.2f anon %7.2f file %6.2f | heap %6.2f mmap %7.2f |", stage,
           mb(status_kb("VmRSS") * 1024.0), mb(status_kb("VmHWM") * 1024.0), mb(status_kb("RssAnon") * 1024.0),
           mb(status_kb("RssFile") * 1024.0), mb((double)mi.uordblks), mb((double)mi.hblkhd));
    if (b->m && b->m->be) {
        size_t q = 0;
        for (int i = 0; i < b->m->n_qw; i++)
            q += (size_t)b->m->qw[i].rows * b->m->qw[i].row_bytes;
        size_t rope = (size_t)b->m->rope_npos * (b->m->a.dh / 2) * sizeof(float);
        printf(" qw %.2f rope %.2f", mb((double)resident(b->m->qmem, q)),
               mb((double)(resident(b->m->rope_cos, rope) + resident(b->m->rope_sin, rope))));
    }
    if (b->be) printf(" scratch %.2f", mb((double)resident(b->be->scratch.base, b->be->scratch.cap)));
    if (b->r && b->r->m)
        printf(" arena %.2f (peak %.2f)", mb((double)resident(b->r->arena.base, b->r->arena.cap)),
               mb((double)b->r->arena.peak));
    if (b->st && b->st->layers) {
        size_t res = 0;
        for (int l = 0; l < b->m->a.n_layers; l++) {
            const layer_cache_t *c = &b->st->layers[l];
            if (b->m->a.kind[l] != LAYER_ATTN) continue;
            size_t n = (size_t)c->cap * b->m->a.Hkv * b->m->a.dh * sizeof(float);
            res += resident(c->u.attn.k, n) + resident(c->u.attn.v, n);
        }
        printf(" cache %.2f of %.2f", mb((double)res), mb((double)b->st->bytes));
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int P = 256, D = 64, threads = 2, ctx = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_mem MODEL [--prompt P] [--decode D] [--threads N] [--ctx C]\n");
            return 2;
        }
    }
    if (!path || P < 1 || D < 1 || threads < 1 || ctx < P + D + 1) {
        fprintf(stderr, "bench_mem: MODEL needed; prompt, decode, threads >= 1; ctx >= prompt + decode + 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    bufs_t b = {0};
    report("start", &b);
    be_t *be;
    if (be_create(&be, "cpu", (size_t)64 << 20) < 0) die("backend"); // cli_backend's scratch
    b.be = be;
    report("backend", &b);
    arch_t a;
    wsrc_t *src;
    model_t m;
    tok_t tok;
    if (wsrc_open(&src, path, &a) < 0) die(path);
    report("source open", &b);
    if (model_load_src(&m, src, &a, be, MODEL_QUANT) < 0) die("model");
    b.m = &m;
    report("model loaded", &b);
    if (tok_load_gguf(&tok, wsrc_gguf(src)) < 0) die("tokenizer");
    report("tokenizer loaded", &b);
    wsrc_close(src);
    report("source closed", &b);
    model_run_t r;
    model_state_t st;
    if (model_run_create(&r, &m, (size_t)1 << 30) < 0) die("run"); // CLI_RUN_ARENA
    b.r = &r;
    if (model_state_alloc(&m, &st, 1, ctx) < 0) die("state");
    b.st = &st;
    report("run + state", &b);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)P);
    for (int i = 0; i < P; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % m.a.V);
    // gen_run's steps one by one (greedy, no stop ids), reporting between them.
    if (model_state_fit(&m, &st, P + D) < 0) die("cache");
    report("cache fitted", &b);
    sampler_t smp;
    sampler_cfg_t sc = {.top_p = 1};
    float *logits = malloc((size_t)m.a.V * sizeof(float));
    if (!logits || sampler_init(&smp, &sc, m.a.V) < 0) die("sampler");
    double t0 = time_now();
    if (model_prefill(&r, &st, ids, P, 512, logits) < 0) die("prefill");
    double tp = time_now() - t0;
    report("prefilled", &b);
    model_run_trim(&r);
    report("trimmed", &b);
    t0 = time_now();
    for (int i = 0; i < D; i++) {
        int32_t id = sampler_sample(&smp, logits);
        if (model_step(&r, &st, &id, logits) < 0) die("decode");
        if (i == 0) report("1 step", &b);
    }
    double td = time_now() - t0;
    sampler_free(&smp);
    free(logits);
    report("decoded", &b);
    printf("prefill %d tokens %.1f tok/s, decode %d tokens %.2f tok/s\n", P, P / tp, D, D / td);
    struct stat sb;
    double file = stat(path, &sb) == 0 ? (double)sb.st_size : 0;
    double cache = (double)(P + D) * (double)model_cache_bytes_per_token(&m);
    printf("peak RSS %.2f MB; file %.2f MB + cache of %d tokens %.2f MB = %.2f MB\n", mb(status_kb("VmHWM") * 1024.0),
           mb(file), P + D, mb(cache), mb(file + cache));
    model_state_free(&m, &st);
    model_run_free(&r);
    tok_free(&tok);
    model_free(&m);
    be_destroy(be);
    free(ids);
    return 0;
}
