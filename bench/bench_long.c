// Long-context inference of one sequence on one GPU at the HyLo-Llama-3B
// shapes, random weights (issue 12): the Llama-3.2-3B teacher and its hybrids
// HyLo-Llama-3B-6MLA22GDN and 14MLA14GDN (the released layouts,
// configs/hylo/hylo_llama_*_64k.yaml: MLA ranks 1536 / 128, rope 64, nope 64,
// v 128, YaRN 32 over 2,048; built from the teacher by upc_student_arch, as
// convert does). For each context length: prefill the T tokens in chunks of
// 8,192, then D greedy decode steps after two untimed ones (the step's graph
// is recorded in the second): gen_run, as hylo generate (each token chosen on
// the device, the next step queued before the host reads it).
// Printed per point: prefill seconds and tokens/s, decode ms per token, the
// cache's bytes (one allocation of exactly T + D + 2 tokens) and the device memory
// in use. A length whose cache does not fit says so and the sweep goes on.
// Wall-clock times around calls that end in a host sync.
// Usage: bench_long [--teacher|--6mla22gdn|--14mla14gdn] [--2m|--upto128k] [--decode64] [--trace]
//                   [--q8_0|--q4_0|--q4_1]
//        bench_long --smollm2 [--trace] [--q8_0|--q4_0|--q4_1] | --batch-prefill
//   (default: all three models; lengths 8K, 32K, 128K, 512K, 1M, and 2M with
//   --2m, up to 128K only with --upto128k (a profiler's run); 32 decode steps,
//   64 with --decode64)
// bench_long --smollm2: instead, single-stream decode of the SmolLM2-135M
//   shape and its 10MLA20GDN hybrid (convert --mla-every 3, default MLA dims)
//   after prompts of 256, 2K, 8K and 32K tokens, 256 decode steps: the decode
//   speed of `hylo generate --stats` on the real model (the GPU holds its
//   weights as bf16 either way) without carrying the 98 MB GGUF to the GPU.
// --q8_0, --q4_0, --q4_1: the models' matrices in that ggml block format on
//   the device (quantised inference: a decode step's products read the blocks
//   as they are, cuda_quant.cu's k_qgemv),
//   loaded from a quantised checkpoint of the random weights written under
//   /tmp first (make_model).
// bench_long --batch-prefill: a server's prefill turns (issue 12;
//   bench_turns.h: 8 requests apart and in one forward, two turns, medians
//   of 5) for the SmolLM2 shape, its 10MLA20GDN hybrid and the HyLo-3B
//   6MLA22GDN hybrid.
// bench_long --smollm2 --trace: the same two models after a 256-token prompt
//   only, then three more steps traced through CUPTI (bench_trace.h): per
//   step the GPU span and the host time around it, every kernel of the last
//   step with its cost on the critical path, and those costs by kernel.
//   Its timed line runs under the tracer. With a 3B model (--teacher,
//   --6mla22gdn or --14mla14gdn) instead, the same after an 8K prompt.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/fs.h"
#include "infer/gen.h"
#include "io/gguf.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "upcycle/upcycle.h"

#define BENCH_NAME "bench_long"
#include "bench_trace.h"
#include "bench_turns.h"
#include "bench_util.h"

static int tracing; // --trace

// Llama-3.2-3B (config.json of the released model)
static arch_t llama_3b(void) {
    arch_t a;
    arch_init(&a);
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.V = 128256, a.eps = 1e-5f, a.tie_embeddings = 1;
    a.d = 3072, a.n_layers = 28, a.H = 24, a.Hkv = 8, a.dh = 128, a.ffn = 8192;
    a.rope.theta = 500000.0f, a.rope.scaling = ROPE_SCALE_LLAMA3, a.rope.factor = 32.0f;
    a.rope.low_freq_factor = 1, a.rope.high_freq_factor = 4, a.rope.orig_max_pos = 8192;
    a.max_pos = 131072;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = LAYER_ATTN;
    return a;
}

// SmolLM2-135M(-Instruct) (its GGUF's metadata)
static arch_t smollm2(void) {
    arch_t a;
    arch_init(&a);
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.V = 49152, a.eps = 1e-5f, a.tie_embeddings = 1;
    a.d = 576, a.n_layers = 30, a.H = 9, a.Hkv = 3, a.dh = 64, a.ffn = 1536;
    a.rope.theta = 100000.0f, a.max_pos = 8192;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = LAYER_ATTN;
    return a;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double gib(double bytes) { return bytes / (double)(1u << 30); }

// The times tokens reach the host (gen_run's callback): seconds, and the
// tracer's clock with --trace.
typedef struct {
    double *t;
    uint64_t *mark;
    int n, cap;
} tok_times_t;

static int time_token(void *user, int32_t id) {
    tok_times_t *tt = user;
    if (tt->n < tt->cap) {
        tt->t[tt->n] = now_s();
        tt->mark[tt->n] = tracing ? trace_now() : 0;
        tt->n++;
    }
    return 0;
}

static int qtype; // --q8_0, --q4_0, --q4_1: the ggml type of the models' matrices (0: bf16)

// The model with random weights N(0, 0.02^2): bf16 on the device; or, with
// qtype, its matrices in that block format (quantised inference, model.h
// MODEL_QUANT), written as a quantised checkpoint folder under /tmp
// (checkpoint.h CKPT_QUANT; 16M values drawn, repeated as dev_fill_rand
// repeats them) and loaded from it, as hylo generate loads one.
static void make_model(model_t *m, const arch_t *a, const char *name) {
    if (!qtype) {
        if (model_create(m, a, be) < 0) die(name);
        dev_fill_rand(m->w, m->pt.total, 1, 0.0f, 0.02f);
        return;
    }
    ptable_t pt;
    float *host;
    if (ptable_build(&pt, a) < 0 || ptable_alloc_host(&pt, name, 0, &host) < 0) die(name);
    const int64_t n = pt.total, d = n < (1 << 24) ? n : (1 << 24);
    rng_t r;
    rng_seed(&r, 1);
    rng_fill_normal(&r, host, d, 0.0f, 0.02f);
    for (int64_t done = d; done < n; done += d)
        memcpy(host + done, host, (size_t)(n - done < d ? n - done : d) * sizeof(float));
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/bench_long_%s_%d", ggml_type_name((uint32_t)qtype), (int)getpid());
    double t0 = now_s();
    if (ckpt_write(dir, a, &pt, host, CKPT_QUANT + qtype, NULL, NULL) < 0) die("quantised checkpoint");
    free(host);
    ptable_free(&pt);
    const double t1 = now_s();
    const int rc = model_load_ex(m, dir, be, MODEL_QUANT);
    fs_remove_tree(dir);
    if (rc < 0) die("quantised checkpoint's load");
    printf("%s: matrices in %s (%d of them; written in %.1f s, loaded in %.1f s)\n", name,
           ggml_type_name((uint32_t)qtype), m->n_qw, t1 - t0, now_s() - t1);
}

// One model over the lengths: prefill, decode, memory.
static void sweep(const char *name, const arch_t *a, const int *lengths, int n_len, int D) {
    model_t m;
    make_model(&m, a, name);
    model_run_t r;
    if (model_run_create(&r, &m, (size_t)4 << 30) < 0) die("run");
    printf("%s: %lld parameters, %d layers (%d attention, %d MLA, %d GDN), cache %lld bytes per token\n", name,
           (long long)ptable_count(&m.pt), a->n_layers, arch_count(a, LAYER_ATTN), arch_count(a, LAYER_MLA),
           arch_count(a, LAYER_GDN), (long long)model_cache_bytes_per_token(&m));
    fflush(stdout);
    for (int li = 0; li < n_len; li++) {
        const int T = lengths[li];
        int32_t *ids = malloc((size_t)T * sizeof(int32_t));
        for (int i = 0; i < T; i++)
            ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)a->V);
        model_state_t st;
        memset(&st, 0, sizeof st);
        size_t fr, tot;
        const int room = T + D + 6; // the steps below, and the stop id gen_run may feed
        if (model_state_alloc(&m, &st, 1, room) < 0 || model_state_fit(&m, &st, room) < 0) {
            printf("%-12s T=%-8d does not fit: %s\n", name, T, err_msg());
            if (st.layers) model_state_free(&m, &st);
            free(ids);
            continue;
        }
        // hylo generate's loop (gen_run: greedy, each token chosen on the
        // device and the next step queued before it is read), the time each
        // token reached the host kept
        const int n_tok = D + 3 + (tracing ? 3 : 0);
        tok_times_t tt = {calloc((size_t)n_tok, sizeof(double)), calloc((size_t)n_tok, sizeof(uint64_t)), 0, n_tok};
        gen_cfg_t cfg = {.max_new = n_tok, .sampler = {.temperature = 0, .top_p = 1}, .prefill_chunk = 8192};
        gen_stats_t stats;
        int rc = gen_run(&r, &st, ids, T, &cfg, time_token, &tt, &stats);
        if (rc == 0 && tt.n < n_tok) rc = err_set(ERR_RUNTIME, "%d of %d tokens", tt.n, n_tok);
        const double t_pre = stats.prefill_s;
        // tokens 1 and 2: the step run op by op and the one that records the
        // graph (model.c step_forward); D replays after them
        const double t_dec = rc == 0 ? tt.t[2 + D] - tt.t[2] : 0.0;
        if (tracing && rc == 0) trace_report(name, tt.mark + 2 + D, 3);
        free(tt.t), free(tt.mark);
        cudaMemGetInfo(&fr, &tot);
        if (rc < 0)
            printf("%-12s T=%-8d failed: %s\n", name, T, err_msg());
        else
            printf("%-12s T=%-8d prefill %9.3f s (%9.1f tok/s)  decode %8.3f ms/token (%7.1f tok/s)  cache %8.3f "
                   "GiB  device in use %6.2f of %6.2f GiB\n",
                   name, T, t_pre, T / t_pre, 1e3 * t_dec / D, D / t_dec, gib((double)st.bytes),
                   gib((double)(tot - fr)), gib((double)tot));
        fflush(stdout);
        model_state_free(&m, &st);
        free(ids);
    }
    model_run_free(&r);
    model_free(&m);
}

// --batch-prefill on one model with random weights (bench_turns.h).
static void batch_prefill(const char *name, const arch_t *a) {
    model_t m;
    if (model_create(&m, a, be) < 0) die(name);
    dev_fill_rand(m.w, m.pt.total, 1, 0.0f, 0.02f);
    model_run_t r;
    if (model_run_create(&r, &m, (size_t)4 << 30) < 0) die("run");
    if (bench_turns(name, &m, &r, 5) < 0) die("prefill turns");
    model_run_free(&r);
    model_free(&m);
}

int main(int argc, char **argv) {
    int only = 0, n_len = 5, D = 32, small = 0, batch = 0;
    bench_flag_t flags[] = {
        {"--teacher", &only, 1},       {"--6mla22gdn", &only, 2},     {"--14mla14gdn", &only, 3},
        {"--2m", &n_len, 6},           {"--upto128k", &n_len, 3},     {"--decode64", &D, 64},
        {"--smollm2", &small, 1},      {"--trace", &tracing, 1},      {"--batch-prefill", &batch, 1},
        {"--q8_0", &qtype, GGML_Q8_0}, {"--q4_0", &qtype, GGML_Q4_0}, {"--q4_1", &qtype, GGML_Q4_1}};
    if (bench_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0])) < 0) return 2;
    if (qtype && batch) {
        fprintf(stderr, "bench_long: --batch-prefill runs bf16 weights only\n");
        return 2;
    }
    if (tracing && batch) {
        fprintf(stderr, "bench_long: --trace goes with --smollm2 or one 3B model\n");
        return 2;
    }
    if (tracing && !small) n_len = 1; // 8K only
    if (tracing) trace_start();       // before the CUDA context and the graphs it records
    bench_init((size_t)8 << 30);      // op scratch: chunked GDN and attention at 8K-token chunks
    if (batch) {
        arch_t t = smollm2(), s;
        int mla[10];
        for (int i = 0; i < 10; i++)
            mla[i] = 3 * i;
        batch_prefill("SmolLM2-135M", &t);
        if (upc_student_arch(&t, mla, 10, LAYER_GDN, &(upc_dims_t){0}, &s) < 0) die("10MLA20GDN arch");
        batch_prefill("10MLA20GDN", &s);
        arch_t l = llama_3b(), h;
        upc_dims_t dims = {
            .r_q = 1536, .r_kv = 128, .d_rope = 64, .d_nope = 64, .d_v = 128, .yarn_factor = 32, .yarn_orig = 2048};
        const int mla6[6] = {0, 5, 10, 16, 21, 26};
        if (upc_student_arch(&l, mla6, 6, LAYER_GDN, &dims, &h) < 0) die("6MLA22GDN arch");
        batch_prefill("6MLA22GDN", &h);
        bench_finish();
        return 0;
    }
    if (small) {
        const int short_lengths[4] = {256, 2048, 8192, 32768};
        arch_t t = smollm2(), s;
        t.max_pos = 32768 + 256 + 2; // random weights: positions past the trained 8K time the same
        int mla[10];
        for (int i = 0; i < 10; i++)
            mla[i] = 3 * i;
        const int n_short = tracing ? 1 : 4;
        sweep("SmolLM2-135M", &t, short_lengths, n_short, 256);
        if (upc_student_arch(&t, mla, 10, LAYER_GDN, &(upc_dims_t){0}, &s) < 0) die("10MLA20GDN arch");
        sweep("10MLA20GDN", &s, short_lengths, n_short, 256);
        bench_finish();
        return 0;
    }
    const int lengths[6] = {8192, 32768, 131072, 524288, 1048576, 2097152};
    arch_t t = llama_3b();
    upc_dims_t dims = {
        .r_q = 1536, .r_kv = 128, .d_rope = 64, .d_nope = 64, .d_v = 128, .yarn_factor = 32, .yarn_orig = 2048};
    const int mla6[6] = {0, 5, 10, 16, 21, 26};
    int mla14[14];
    for (int i = 0; i < 14; i++)
        mla14[i] = 2 * i;
    if (!only || only == 1) sweep("Llama-3.2-3B", &t, lengths, n_len, D);
    arch_t s;
    if (!only || only == 2) {
        if (upc_student_arch(&t, mla6, 6, LAYER_GDN, &dims, &s) < 0) die("6MLA22GDN arch");
        sweep("6MLA22GDN", &s, lengths, n_len, D);
    }
    if (!only || only == 3) {
        if (upc_student_arch(&t, mla14, 14, LAYER_GDN, &dims, &s) < 0) die("14MLA14GDN arch");
        sweep("14MLA14GDN", &s, lengths, n_len, D);
    }
    bench_finish();
    return 0;
}
