// One KD training step on one GPU at the HyLo shapes, with random weights:
// student HyLo-Llama-1B-4MLA12GDN (MLA at layers 1, 5, 10, 14; GDN elsewhere;
// built from the teacher by upc_student_arch, as convert does), teacher
// Llama-3.2-1B or Llama-3.1-8B shaped. A step is what hylo train runs for one
// micro-batch plus the optimizer: teacher forward to its final hidden states,
// student training forward, fused KL, student backward, AdamW with clipping.
// Each phase is timed with CUDA events (a sync between phases); tokens/s, MFU
// (6 N_student + 2 N_teacher matrix FLOPs per token against 989.4 TFLOP/s dense
// bf16) and memory (weights, optimizer state, the activation arena's peak, the
// teacher's forward inside it, and the op scratch's peak) are printed.
// Usage: bench_train [--teacher8b] [--T8k|--T64k|--T128k] [--recompute]
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/train_fwd.h"
#include "train/distill.h"
#include "train/optim.h"
#include "upcycle/upcycle.h"

#define BENCH_NAME "bench_train"
#include "bench_util.h"

static arch_t llama(int big) {
    arch_t a;
    arch_init(&a);
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.V = 128256, a.eps = 1e-5f;
    a.rope.theta = 500000.0f, a.rope.scaling = ROPE_SCALE_LLAMA3, a.rope.factor = big ? 8.0f : 32.0f;
    a.rope.low_freq_factor = 1, a.rope.high_freq_factor = 4, a.rope.orig_max_pos = 8192;
    if (big)
        a.d = 4096, a.n_layers = 32, a.H = 32, a.Hkv = 8, a.dh = 128, a.ffn = 14336, a.tie_embeddings = 0;
    else
        a.d = 2048, a.n_layers = 16, a.H = 32, a.Hkv = 8, a.dh = 64, a.ffn = 8192, a.tie_embeddings = 1;
    a.max_pos = 131072;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = LAYER_ATTN;
    return a;
}

static float ms_since(void) {
    float t;
    cudaEventRecord(ev1, stream);
    cudaEventSynchronize(ev1);
    check_sync("phase");
    cudaEventElapsedTime(&t, ev0, ev1);
    cudaEventRecord(ev0, stream);
    return t;
}

int main(int argc, char **argv) {
    int big = 0, T = 8192, recompute = 0;
    bench_flag_t flags[] = {{"--teacher8b", &big, 1},
                            {"--T8k", &T, 8192},
                            {"--T64k", &T, 65536},
                            {"--T128k", &T, 131072},
                            {"--recompute", &recompute, 1}};
    if (bench_flags(argc, argv, flags, 5) < 0) return 2;
    // op scratch: the GDN chunk backward needs ~5 GB at 64K tokens
    size_t scratch = (size_t)4 << 30;
    if ((size_t)T * (96u << 10) > scratch) scratch = (size_t)T * (96u << 10);
    bench_init(scratch);
    arch_t t1 = llama(0), ta = llama(big), as;
    int mla[4] = {1, 5, 10, 14};
    upc_dims_t dims = {.r_q = 1344,
                       .r_kv = 128,
                       .d_rope = 32,
                       .d_nope = 32,
                       .d_v = 64,
                       .yarn_factor = T > 8192 ? 32 : 4,
                       .yarn_orig = 2048};
    if (upc_student_arch(&t1, mla, 4, LAYER_GDN, &dims, &as) < 0) die("student arch");
    model_t s, t;
    if (model_create(&s, &as, be) < 0 || model_create(&t, &ta, be) < 0) die("models");
    dev_fill_rand(s.w, s.pt.total, 1, 0.0f, 0.02f),
        dev_fill_rand(t.w, t.pt.total, 2, 0.0f, 0.02f); // random bf16 weights
    optim_t o;
    if (optim_create(&o, &s, NULL) < 0) die("optimizer");
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    // One arena, most of what is left (its peak, not its size, is reported):
    // the teacher's run has none of its own and runs in the student's, as in
    // hylo train (distill.c).
    size_t as_bytes = (size_t)((double)fr * 0.92);
    model_run_t rs, rt;
    if (model_run_create(&rs, &s, as_bytes) < 0 || model_run_create(&rt, &t, 0) < 0) die("runs");
    if (model_ensure_positions(&s, T) < 0 || model_ensure_positions(&t, T) < 0) die("rope tables");
    int32_t *ids = malloc((size_t)T * sizeof(int32_t));
    for (int i = 0; i < T; i++)
        ids[i] = (int32_t)((i * 7919u) % (unsigned)as.V);
    int64_t N = T, nd = N * as.d;
    block_saved_t *blocks = calloc((size_t)as.n_layers, sizeof *blocks);
    printf("student HyLo-Llama-1B-4MLA12GDN %lld parameters; teacher %s %lld parameters; B 1 x T %d%s\n",
           (long long)ptable_count(&s.pt), big ? "Llama-3.1-8B" : "Llama-3.2-1B", (long long)ptable_count(&t.pt), T,
           recompute ? ", blocks recomputed" : "");
    double ph[5] = {0}; // teacher, student fwd, loss, backward, optimizer
    int warm = 1, reps = 3;
    float *dloss = dalloc(sizeof(float));
    for (int it = 0; it < warm + reps; it++) {
        arena_reset(&rs.arena, 0);
        if (optim_zero_grad(&o, &s) < 0) die("zero grad");
        check_sync("start");
        cudaEventRecord(ev0, stream);
        void *ht = arena_alloc(&rs.arena, (size_t)N * ta.d * 2), *dh = arena_alloc(&rs.arena, (size_t)nd * 2);
        if (!ht || !dh) die("arena");
        model_run_lend(&rs, &rt);
        if (model_hidden(&rt, ids, 1, T, ht, NULL) < 0) die("teacher");
        model_run_settle(&rs, &rt);
        float t_teacher = ms_since();
        model_acts_t acts;
        acts.blocks = blocks;
        if (model_forward_train(&rs, ids, 1, T, recompute, &acts) < 0) die("student forward");
        float t_fwd = ms_since();
        int64_t head = ptable_off(&s.pt, "lm_head.weight");
        if (head < 0) head = ptable_off(&s.pt, "model.embed_tokens.weight");
        be->fused_kl(be, dloss, dh, o.grad + head, acts.h, s.lm_head, ht, t.lm_head, NULL, N, as.d, ta.d, as.V, 1.0f);
        float t_loss = ms_since();
        if (model_backward(&rs, &acts, dh, o.grad) < 0) die("backward");
        float t_bwd = ms_since();
        double gn;
        if (optim_grad_norm(&o, &s, &gn) < 0 || optim_step(&o, &s, 1e-5f, 1.0f) < 0) die("optimizer");
        float t_opt = ms_since();
        if (it >= warm) {
            ph[0] += t_teacher / reps, ph[1] += t_fwd / reps, ph[2] += t_loss / reps, ph[3] += t_bwd / reps;
            ph[4] += t_opt / reps;
        }
    }
    double total = ph[0] + ph[1] + ph[2] + ph[3] + ph[4];
    double tps = T / (total * 1e-3);
    double flops = 6.0 * ptable_count(&s.pt) + 2.0 * ptable_count(&t.pt);
    double gib = 1.0 / (1 << 30);
    double w_b = (double)(s.pt.total + t.pt.total) * 2, o_b = (double)o.n * 16;
    printf("phase ms: teacher %.1f  student fwd %.1f  loss %.1f  backward %.1f  optimizer %.1f  = step %.1f\n", ph[0],
           ph[1], ph[2], ph[3], ph[4], total);
    printf("tokens/s %.0f  MFU %.1f%% (%.3g FLOP/token)\n", tps, 100.0 * tps * flops / 989.4e12, flops);
    printf("memory GiB: weights %.2f + optimizer %.2f + arena peak %.2f (the teacher's forward %.2f inside it) + op "
           "scratch peak %.2f = %.2f\n",
           w_b * gib, o_b * gib, rs.arena.peak * gib, rt.arena.peak * gib, be->scratch.peak * gib,
           (w_b + o_b + rs.arena.peak + be->scratch.peak) * gib);
    free(ids), free(blocks);
    model_run_free(&rs), model_run_free(&rt);
    optim_free(&o, &s);
    model_free(&s), model_free(&t);
    bench_finish();
    return 0;
}
