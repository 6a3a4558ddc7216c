// The whole hybrid on CUDA against the CPU reference: a small model with every
// mixer kind (attention, MLA, GDN, Mamba-2), the same weights (rounded to bf16
// for both), logits of a full forward, decode steps after a chunked prefill,
// and the gradient of every parameter through the training forward/backward.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/half.h"
#include "infer/sampler.h"
#include "model/train_fwd.h"
#include "testutil.h"

// Dimensions the CUDA kernels take (head dims multiples of 16).
static arch_t small_hybrid(void) {
    arch_t a;
    arch_init(&a);
    a.d = 64, a.n_layers = 5, a.H = 4, a.Hkv = 2, a.dh = 16, a.ffn = 96, a.V = 300, a.tie_embeddings = 0;
    a.rope.theta = 10000.0f;
    layer_kind_t plan[5] = {LAYER_MLA, LAYER_GDN, LAYER_ATTN, LAYER_M2, LAYER_MLA};
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = plan[l];
    a.mla = (mla_dims_t){.r_q = 32, .r_kv = 32, .d_nope = 8, .d_rope = 8, .d_v = 16, .n_kv = 2};
    a.mla.rope = a.rope;
    a.mla.rope.scaling = ROPE_SCALE_YARN, a.mla.rope.factor = 4, a.mla.rope.orig_max_pos = 64;
    a.mla.rope.beta_fast = 32, a.mla.rope.beta_slow = 1, a.mla.rope.mscale = 1;
    a.gdn = (gdn_dims_t){
        .n_heads = 2, .n_v_heads = 2, .head_k = 32, .head_v = 32, .conv = 4, .use_gate = 1, .norm_eps = 1e-6f};
    a.m2 = (m2_dims_t){.d_inner = 64,
                       .d_xb = 32,
                       .n_heads = 4,
                       .headdim = 16,
                       .d_state = 16,
                       .conv = 4,
                       .chunk = 16,
                       .norm_eps = 1e-5f};
    a.is_hybrid = 1;
    return a;
}

typedef struct {
    model_t cpu, gpu;
    model_run_t rcpu, rgpu;
    float *w; // bf16-rounded weights (host)
} pair_t;

// Weights like a trained residual network's: every block's output projection
// (o_proj, out_proj, down_proj) scaled down so that each block perturbs the
// residual stream instead of replacing it. With all projections at full
// scale the random 5-layer net amplified bf16 rounding to 3.5e-2 on the logits
// and 1e-1..5e-1 on gradients (seen on the H200), which hides what the test is
// for: whether the composed GPU forward/backward computes the same function.
static void make_pair(pair_t *p, const arch_t *a) {
    be_t *gbe = tu_gpu();
    assert_int_equal(model_create(&p->cpu, a, tu_cpu()), 0);
    assert_int_equal(model_create(&p->gpu, a, gbe), 0);
    assert_int_equal(model_run_create(&p->rcpu, &p->cpu, 256u << 20), 0);
    assert_int_equal(model_run_create(&p->rgpu, &p->gpu, 256u << 20), 0);
    p->w = tu_params(&p->cpu.pt, 77, 0.15f);
    for (int i = 0; i < p->cpu.pt.n; i++) {
        const param_t *q = &p->cpu.pt.p[i];
        if (strstr(q->name, "o_proj") || strstr(q->name, "out_proj") || strstr(q->name, "down_proj"))
            for (int64_t k = 0; k < q->numel; k++)
                p->w[q->off + k] *= 0.25f;
    }
    tu_round_bf16(p->w, p->cpu.pt.total);
    memcpy(p->cpu.w, p->w, (size_t)p->cpu.pt.total * sizeof(float));
    assert_int_equal(gbe->upload_act(gbe, p->gpu.w, p->w, p->gpu.pt.total), 0);
}

static void free_pair(pair_t *p) {
    model_run_free(&p->rcpu);
    model_run_free(&p->rgpu);
    model_free(&p->cpu);
    model_free(&p->gpu);
    free(p->w);
}

// bf16 activations through 5 layers with norms: a few 1e-3 per layer. This
// test's full forward measured 2.2e-2 on the H200 (run 7, with the output
// projections scaled down as in make_pair); bound 3e-2 (1.4x that).
static const double LOGIT_TOL = 3e-2;

static void test_model_logits(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    int B = 2, T = 100;
    int32_t *ids = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 37 + 11) % a.V;
    float *lc = malloc(sizeof(float) * B * T * a.V), *lg = tu_nans((int64_t)B * T * a.V); // NaN: must be written
    assert_int_equal(model_logits_all(&p.rcpu, ids, B, T, lc), 0);
    assert_int_equal(model_logits_all(&p.rgpu, ids, B, T, lg), 0);
    double e = tu_rel_err(lg, lc, (int64_t)B * T * a.V);
    // The decode below is judged by its worst single position; the full
    // forward's worst single position is the like-for-like figure (over all
    // rows, and over the positions 36..T-1 of sequence 0 that decode covers).
    double pos_worst = 0, pos_worst_dec = 0;
    for (int r = 0; r < B * T; r++) {
        double er = tu_rel_err(lg + (int64_t)r * a.V, lc + (int64_t)r * a.V, a.V);
        if (!(er <= pos_worst)) pos_worst = er;
        if (r >= 36 && r < T && !(er <= pos_worst_dec)) pos_worst_dec = er;
    }
    printf("  full forward logits, B=%d T=%d: rel err %.2e; worst single position %.2e (%.2e over the decoded "
           "positions)\n",
           B, T, e, pos_worst, pos_worst_dec);
    assert_true(e < LOGIT_TOL);
    // prefill 37 tokens in chunks of 16, then decode steps
    model_state_t sc, sg;
    assert_int_equal(model_state_alloc(&p.cpu, &sc, 1, T), 0);
    assert_int_equal(model_state_alloc(&p.gpu, &sg, 1, T), 0);
    float *c1 = malloc(sizeof(float) * a.V), *g1 = tu_nans(a.V);
    assert_int_equal(model_prefill(&p.rcpu, &sc, ids, 37, 16, c1), 0);
    assert_int_equal(model_prefill(&p.rgpu, &sg, ids, 37, 16, g1), 0);
    double worst = tu_rel_err(g1, c1, a.V);
    for (int t = 37; t < T; t++) {
        assert_int_equal(model_step(&p.rcpu, &sc, &ids[t], c1), 0);
        assert_int_equal(model_step(&p.rgpu, &sg, &ids[t], g1), 0);
        double et = tu_rel_err(g1, c1, a.V);
        if (et > worst) worst = et;
    }
    printf("  prefill + %d decode steps: worst rel err %.2e\n", T - 37, worst);
    // The decode path computes the same function by other algorithms (GDN and
    // SSD recurrences instead of chunks, absorbed MLA over the latent cache),
    // each in bf16, so its worst position is judged against the full forward's
    // worst single position over the decoded positions, the like-for-like
    // figure of bf16 rounding for these weights: run 13 measured 5.82e-2
    // against 5.11e-2 (1.14x); after the parameter table put q_a and kv_a side
    // by side (other random draws), an H100 measured 1.35e-1 against 1.09e-1
    // (1.24x), the full forward alone then over the old fixed bound of 1e-1.
    // Bound: 2x that figure (at least 5e-2); a wrong cache or state update
    // gives O(1).
    double dec_tol = 2.0 * (pos_worst_dec > 2.5e-2 ? pos_worst_dec : 2.5e-2);
    printf("  decode bound %.2e (2x the full forward's worst decoded position)\n", dec_tol);
    assert_true(worst < dec_tol);
    model_state_free(&p.cpu, &sc);
    model_state_free(&p.gpu, &sg);
    free(ids), free(lc), free(lg), free(c1), free(g1);
    free_pair(&p);
}

// MLA's prefill over a long cache in tiles of keys (mla.c attend_cache) on the
// GPU: a run with a 1 MiB arena makes the tiles 256 keys (1/16 of the arena
// holds 292 keys' kvd, k and v of this model, rounded down to a multiple of
// 64; 128 keys when the CPU stands in for the GPU: fp32), so a 1,000-token
// prompt prefilled in chunks of 128 attends over up to 3 unmasked tiles
// merged with a causal one. Against the CPU with its 256 MiB
// arena (one tile: today's untiled attention), the last position's logits are
// judged as one decoded position of test_model_logits (bound 1e-1, the same
// bf16 argument); a tile lost or attended with the wrong mask moves a quarter
// or more of an MLA layer's attention weight.
static void test_prefill_key_tiles(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { T = 1000, CHUNK = 128 };
    model_run_t small;
    assert_int_equal(model_run_create(&small, &p.gpu, (size_t)1 << 20), 0);
    int32_t *ids = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++)
        ids[i] = (i * 53 + 5) % a.V;
    model_state_t sc, sg;
    assert_int_equal(model_state_alloc(&p.cpu, &sc, 1, T), 0);
    assert_int_equal(model_state_alloc(&p.gpu, &sg, 1, T), 0);
    float *c1 = malloc(sizeof(float) * a.V), *g1 = tu_nans(a.V);
    assert_int_equal(model_prefill(&p.rcpu, &sc, ids, T, CHUNK, c1), 0);
    int rc = model_prefill(&small, &sg, ids, T, CHUNK, g1);
    if (rc) printf("  prefill with a 1 MiB arena failed: %s\n", err_msg());
    assert_int_equal(rc, 0);
    double e = tu_rel_err(g1, c1, a.V);
    printf("  prefill of %d tokens in chunks of %d, MLA keys in tiles (small arena) / in one tile: last "
           "position's logits rel err %.2e\n",
           T, CHUNK, e);
    assert_true(e < 1e-1);
    model_state_free(&p.cpu, &sc);
    model_state_free(&p.gpu, &sg);
    model_run_free(&small);
    free(ids), free(c1), free(g1);
    free_pair(&p);
}

// The worst relative error of the N rows of V logits g against c.
static double worst_row_err(const float *g, const float *c, int N, int V) {
    double worst = 0;
    for (int k = 0; k < N; k++) {
        double e = tu_rel_err(g + (int64_t)k * V, c + (int64_t)k * V, V);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

// `steps` batched decode steps of the N states on each side (the same token
// ids), the worst row error over all of them (c1, g1: [N, V] scratch).
static double decode_steps_worst(pair_t *p, model_state_t **pc, model_state_t **pg, int N, int steps, int V, float *c1,
                                 float *g1) {
    double worst = 0;
    for (int t = 0; t < steps; t++) {
        int32_t ids[8];
        assert_true(N <= 8);
        for (int k = 0; k < N; k++)
            ids[k] = (t * 13 + k * 101 + 1) % V;
        assert_int_equal(model_step_batch(&p->rcpu, pc, N, ids, c1), 0);
        assert_int_equal(model_step_batch(&p->rgpu, pg, N, ids, g1), 0);
        double e = worst_row_err(g1, c1, N, V);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

// Continuous batching on the GPU: three prompts of different lengths
// prefilled in one forward (model_prefill_batch), then decoding together
// with model_step_batch (the per-row cache pointers and lengths of the
// decode ops), against the same on the CPU. Each row is judged as
// test_model_logits judges one decoded position (bound 1e-1, the same bf16
// argument); a row that read another row's cache or state, or the wrong
// length, is O(1) off.
static void test_step_batch(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { N = 3, STEPS = 24 };
    const int len[N] = {5, 23, 41};
    model_state_t sc[N], sg[N];
    model_state_t *pc[N], *pg[N];
    float *c1 = malloc(sizeof(float) * N * a.V), *g1 = tu_nans((int64_t)N * a.V);
    // the prompts in one batched prefill on each side (model_prefill_batch)
    int32_t prompt[N][64];
    const int32_t *chunk[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < len[k]; i++)
            prompt[k][i] = (i * 41 + 7 * k + 3) % a.V;
        chunk[k] = prompt[k];
        assert_int_equal(model_state_alloc(&p.cpu, &sc[k], 1, 128), 0);
        assert_int_equal(model_state_alloc(&p.gpu, &sg[k], 1, 128), 0);
        pc[k] = &sc[k], pg[k] = &sg[k];
    }
    assert_int_equal(model_prefill_batch(&p.rcpu, pc, N, chunk, len, NULL, c1), 0);
    assert_int_equal(model_prefill_batch(&p.rgpu, pg, N, chunk, len, NULL, g1), 0);
    double worst_pre = worst_row_err(g1, c1, N, a.V);
    printf("  batched prefill of the 3 prompts: worst rel err of a row %.2e\n", worst_pre);
    assert_true(worst_pre < 1e-1);
    double worst = decode_steps_worst(&p, pc, pg, N, STEPS, a.V, c1, g1);
    printf("  %d sequences (lengths %d, %d, %d) x %d batched decode steps: worst rel err of a row %.2e\n", N, len[0],
           len[1], len[2], STEPS, worst);
    assert_true(worst < 1e-1);
    for (int k = 0; k < N; k++) {
        assert_int_equal(sg[k].len, len[k] + STEPS);
        model_state_free(&p.cpu, &sc[k]);
        model_state_free(&p.gpu, &sg[k]);
    }
    free(c1), free(g1);
    free_pair(&p);
}

// Greedy decoding on the device (model_greedy_queue: argmax_rows in the
// recorded step, the next step queued before the ids are read) gives, for
// three sequences decoded together, the ids the host's argmax of the same
// backend's logits gives (model_step_batch, sampler_argmax), step for step:
// the same launches but for the head's argmax, so the same ids (EXACT). With
// contiguous states (hylo generate's), then paged ones in one pool (the
// server's).
static void test_greedy_steps(void **st) {
    arch_t a = small_hybrid();
    enum { N = 3, STEPS = 20 };
    const int len[N] = {7, 19, 33};
    for (int paged = 0; paged < 2; paged++) {
        pair_t p;
        make_pair(&p, &a);
        model_pool_t pool;
        if (paged) assert_int_equal(model_pool_create(&p.gpu, &pool, 8), 0);
        model_state_t sa[N], sb[N];
        model_state_t *pa[N], *pb[N];
        float *lg = malloc(sizeof(float) * N * a.V);
        int32_t first[N], ref[STEPS][N], got[N];
        for (int k = 0; k < N; k++) {
            int32_t prompt[64];
            for (int i = 0; i < len[k]; i++)
                prompt[i] = (i * 37 + 11 * k + 2) % a.V;
            assert_int_equal(paged ? model_state_alloc_paged(&p.gpu, &sa[k], &pool, 128)
                                   : model_state_alloc(&p.gpu, &sa[k], 1, 128),
                             0);
            assert_int_equal(paged ? model_state_alloc_paged(&p.gpu, &sb[k], &pool, 128)
                                   : model_state_alloc(&p.gpu, &sb[k], 1, 128),
                             0);
            pa[k] = &sa[k], pb[k] = &sb[k];
            assert_int_equal(model_prefill(&p.rgpu, &sa[k], prompt, len[k], 0, lg), 0);
            assert_int_equal(model_prefill(&p.rgpu, &sb[k], prompt, len[k], 0, lg), 0);
            first[k] = sampler_argmax(lg, a.V);
        }
        int32_t ids[N];
        memcpy(ids, first, sizeof ids);
        for (int t = 0; t < STEPS; t++) {
            assert_int_equal(model_step_batch(&p.rgpu, pa, N, ids, lg), 0);
            for (int k = 0; k < N; k++)
                ids[k] = ref[t][k] = sampler_argmax(lg + (int64_t)k * a.V, a.V);
        }
        int differ = 0;
        assert_int_equal(model_greedy_queue(&p.rgpu, pb, N, first), 0);
        for (int t = 0; t < STEPS; t++) {
            if (t + 1 < STEPS) assert_int_equal(model_greedy_queue(&p.rgpu, pb, N, NULL), 0);
            assert_int_equal(model_greedy_take(&p.rgpu, got), 0);
            differ += memcmp(got, ref[t], sizeof got) != 0;
        }
        printf("  %d %s sequences x %d greedy steps on the device: %d steps differ from the host's argmax; replays "
               "%llu, recorded %llu\n",
               N, paged ? "paged" : "contiguous", STEPS, differ, (unsigned long long)p.rgpu.steps_replayed,
               (unsigned long long)p.rgpu.steps_recorded);
        assert_int_equal(differ, 0);
        for (int k = 0; k < N; k++) {
            assert_int_equal(sb[k].len, len[k] + STEPS);
            model_state_free(&p.gpu, &sa[k]);
            model_state_free(&p.gpu, &sb[k]);
        }
        if (paged) {
            assert_int_equal(pool.n_free, 8);
            model_pool_free(&p.gpu, &pool);
        }
        free(lg);
        free_pair(&p);
    }
}

// The end of a paged test: the N state pairs freed, every page of the GPU's
// 8-page pool back, the pool and the pair freed.
static void free_paged(pair_t *p, model_state_t *sc, model_state_t *sg, int N, model_pool_t *pool) {
    for (int k = 0; k < N; k++) {
        model_state_free(&p->cpu, &sc[k]);
        model_state_free(&p->gpu, &sg[k]);
    }
    assert_int_equal(pool->n_free, 8);
    model_pool_free(&p->gpu, pool);
    free_pair(p);
}

// N states of 512 tokens each side: contiguous on the CPU, paged on the GPU
// in a pool of 8 pages (the server's layout), and pointers to them; free_paged
// frees them.
static void open_paged(pair_t *p, model_state_t *sc, model_state_t *sg, model_state_t **pc, model_state_t **pg, int N,
                       model_pool_t *pool) {
    assert_int_equal(model_pool_create(&p->gpu, pool, 8), 0);
    for (int k = 0; k < N; k++) {
        assert_int_equal(model_state_alloc(&p->cpu, &sc[k], 1, 512), 0);
        assert_int_equal(model_state_alloc_paged(&p->gpu, &sg[k], pool, 512), 0);
        pc[k] = &sc[k], pg[k] = &sg[k];
    }
}

// The same through paged caches on the GPU (the server's: one pool, page
// tables; model_state_alloc_paged) against contiguous ones on the CPU: the
// prompts prefilled in two batched rounds, so that a second chunk attends over
// a cache whose pages are not consecutive (gathered key tiles), then 24
// batched decode steps in which a sequence takes a new page (the recorded
// step replayed with other page tables: a paged state's room is not in the
// step's key). Each row judged as in test_step_batch.
static void test_step_batch_paged(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { N = 3, STEPS = 24 };
    const int round1[N] = {200, 200, 280}, round2[N] = {40, 100, 50};
    model_pool_t pool;
    model_state_t sc[N], sg[N];
    model_state_t *pc[N], *pg[N];
    open_paged(&p, sc, sg, pc, pg, N, &pool);
    float *c1 = malloc(sizeof(float) * N * a.V), *g1 = tu_nans((int64_t)N * a.V);
    static int32_t prompt[N][400];
    const int32_t *chunk[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < round1[k] + round2[k]; i++)
            prompt[k][i] = (i * 41 + 7 * k + 3) % a.V;
    }
    double worst_pre = 0;
    for (int round = 0; round < 2; round++) {
        const int *n = round ? round2 : round1;
        for (int k = 0; k < N; k++)
            chunk[k] = prompt[k] + (round ? round1[k] : 0);
        assert_int_equal(model_prefill_batch(&p.rcpu, pc, N, chunk, n, NULL, c1), 0);
        assert_int_equal(model_prefill_batch(&p.rgpu, pg, N, chunk, n, NULL, g1), 0);
        double e = worst_row_err(g1, c1, N, a.V);
        if (!(e <= worst_pre)) worst_pre = e;
    }
    printf("  paged: the 3 prompts (%d, %d, %d tokens) in two batched rounds: worst rel err of a row %.2e; pages of "
           "sequence 1: %d %d\n",
           round1[0] + round2[0], round1[1] + round2[1], round1[2] + round2[2], worst_pre, sg[1].pages[0],
           sg[1].pages[1]);
    assert_true(sg[1].pages[1] != sg[1].pages[0] + 1); // its second chunk gathered its keys
    assert_true(worst_pre < 1e-1);
    double worst = decode_steps_worst(&p, pc, pg, N, STEPS, a.V, c1, g1);
    printf("  paged: %d batched decode steps (sequence 0 into its second page): worst rel err of a row %.2e\n", STEPS,
           worst);
    assert_int_equal(sg[0].n_pages, 2);
    assert_true(worst < 1e-1);
    free(c1), free(g1);
    free_paged(&p, sc, sg, N, &pool);
}

// One recorded decode step serves other paged states of the same shape: the
// step of states A and B is recorded, then C and D (other prompts, lengths,
// caches and recurrent states, the same pool and context limit) step with the
// same recording (model.c step_key: a paged state's launches take the pool,
// never the state), each row against the CPU as in test_step_batch. A
// replay that kept A's or B's pointers reads their caches and states: O(1)
// off. Where the backend records steps (a GPU), C and D's steps must be
// replays, no recording; and after a batch of three rows (recorded in turn),
// C and D again replay the two-row recording, which is kept beside it.
static void test_step_other_states(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { N = 4 };
    const int len[N] = {60, 130, 90, 17};
    model_pool_t pool;
    model_state_t sc[N], sg[N];
    model_state_t *pc[N], *pg[N];
    open_paged(&p, sc, sg, pc, pg, N, &pool);
    float *c1 = malloc(sizeof(float) * 2 * a.V), *g1 = tu_nans((int64_t)2 * a.V);
    static int32_t prompt[N][130];
    const int32_t *chunk[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < len[k]; i++)
            prompt[k][i] = (i * 37 + 13 * k + 2) % a.V;
        chunk[k] = prompt[k];
    }
    float *all_c = malloc(sizeof(float) * N * a.V), *all_g = malloc(sizeof(float) * N * a.V);
    assert_int_equal(model_prefill_batch(&p.rcpu, pc, N, chunk, len, NULL, all_c), 0);
    assert_int_equal(model_prefill_batch(&p.rgpu, pg, N, chunk, len, NULL, all_g), 0);
    free(all_c), free(all_g);
    // A and B: op by op, recorded, replayed
    double worst_ab = decode_steps_worst(&p, pc, pg, 2, 3, a.V, c1, g1);
    const uint64_t rec0 = p.rgpu.steps_recorded, rep0 = p.rgpu.steps_replayed;
    // C and D with A and B's recording
    double worst_cd = decode_steps_worst(&p, pc + 2, pg + 2, 2, 3, a.V, c1, g1);
    printf("  A, B: 3 steps, worst rel err of a row %.2e; then C, D: 3 steps, %.2e (%llu recorded, %llu replayed "
           "of them)\n",
           worst_ab, worst_cd, (unsigned long long)(p.rgpu.steps_recorded - rec0),
           (unsigned long long)(p.rgpu.steps_replayed - rep0));
    assert_true(worst_ab < 1e-1);
    assert_true(worst_cd < 1e-1);
    if (p.gpu.be->graph_begin) { // a backend that records: C and D never recorded
        assert_true(rec0 >= 1);
        assert_int_equal(p.rgpu.steps_recorded, rec0);
        assert_int_equal(p.rgpu.steps_replayed, rep0 + 3);
    }
    // three rows (A, B, C: op by op, then recorded), then C and D again: the
    // two-row recording is still kept (model_run_t graphs), a replay
    model_state_t *pc3[3] = {pc[0], pc[1], pc[2]}, *pg3[3] = {pg[0], pg[1], pg[2]};
    float *c3 = malloc(sizeof(float) * 3 * a.V), *g3 = tu_nans((int64_t)3 * a.V);
    double worst_abc = decode_steps_worst(&p, pc3, pg3, 3, 2, a.V, c3, g3);
    const uint64_t rec1 = p.rgpu.steps_recorded, rep1 = p.rgpu.steps_replayed;
    double worst_cd2 = decode_steps_worst(&p, pc + 2, pg + 2, 2, 1, a.V, c1, g1);
    printf("  A, B, C: 2 steps, %.2e; C, D again: %.2e (%llu recorded, %llu replayed)\n", worst_abc, worst_cd2,
           (unsigned long long)(p.rgpu.steps_recorded - rec1), (unsigned long long)(p.rgpu.steps_replayed - rep1));
    assert_true(worst_abc < 1e-1);
    assert_true(worst_cd2 < 1e-1);
    if (p.gpu.be->graph_begin) {
        assert_int_equal(rec1, rec0 + 1);
        assert_int_equal(p.rgpu.steps_recorded, rec1);
        assert_int_equal(p.rgpu.steps_replayed, rep1 + 1);
    }
    free(c3), free(g3);
    free(c1), free(g1);
    free_paged(&p, sc, sg, N, &pool);
}

// Decode rows riding in a prefill (model_prefill_batch with one-token
// chunks: the server's turn when requests prefill while others decode),
// paged on the GPU as the server's requests are, against contiguous states on
// the CPU. Three prompts prefilled together and decoded for 4 steps (the
// step recorded and replayed where the backend records); then three forwards
// in which those three decode one token each while a fourth state, fresh,
// takes its prompt in chunks of 70, 70 and 30 tokens, and in the first a
// fifth, fresh, takes a one-token prompt (its Mamba-2 states zeroed by the
// riding rows' step), in the order 0, 3, 4, 1, 2 (the forward puts the
// one-token rows last and gives the logits back in this order); then 4
// decode steps of all five (recorded anew after the positions and cache
// bases the mixed forwards overwrote). Each row judged as in test_step_batch.
static double mixed_forward_worst(pair_t *p, model_state_t **pc, model_state_t **pg, int n_st,
                                  const int32_t *const *ids, const int *n, const uint8_t *want, int V, float *c1,
                                  float *g1) {
    int n_want = 0;
    for (int k = 0; k < n_st; k++)
        n_want += want[k];
    assert_int_equal(model_prefill_batch(&p->rcpu, pc, n_st, ids, n, want, c1), 0);
    assert_int_equal(model_prefill_batch(&p->rgpu, pg, n_st, ids, n, want, g1), 0);
    return worst_row_err(g1, c1, n_want, V);
}

static void test_decode_rows_in_prefill(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { N = 5, STEPS = 4 };
    const int len[3] = {40, 90, 200};
    model_pool_t pool;
    model_state_t sc[N], sg[N];
    model_state_t *pc[N], *pg[N];
    open_paged(&p, sc, sg, pc, pg, N, &pool);
    float *c1 = malloc(sizeof(float) * N * a.V), *g1 = tu_nans((int64_t)N * a.V);
    static int32_t prompt[N][200];
    const int32_t *chunk[N];
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < 200; i++)
            prompt[k][i] = (i * 43 + 11 * k + 5) % a.V;
        chunk[k] = prompt[k];
    }
    assert_int_equal(model_prefill_batch(&p.rcpu, pc, 3, chunk, len, NULL, c1), 0);
    assert_int_equal(model_prefill_batch(&p.rgpu, pg, 3, chunk, len, NULL, g1), 0);
    double worst = worst_row_err(g1, c1, 3, a.V);
    double e = decode_steps_worst(&p, pc, pg, 3, STEPS, a.V, c1, g1);
    if (!(e <= worst)) worst = e;
    printf("  3 prompts prefilled and %d decode steps: worst rel err of a row %.2e\n", STEPS, worst);
    // three forwards of decode rows riding in state 3's prompt (and state 4's one token)
    double worst_mixed = 0;
    const int chunks3[3] = {70, 70, 30};
    for (int f = 0, fed = 0; f < 3; fed += chunks3[f++]) {
        int32_t tok[N];
        const int32_t *ids[N];
        int n[N];
        uint8_t want[N];
        model_state_t *oc[N], *og[N];
        const int order[N] = {0, 3, 4, 1, 2};
        int n_st = f == 0 ? N : N - 1;
        for (int j = 0, o = 0; j < N; j++) {
            int k = order[j];
            if (k == 4 && f > 0) continue;
            tok[k] = (int32_t)((f * 31 + k * 7 + 2) % a.V);
            ids[o] = k == 3 ? prompt[3] + fed : &tok[k];
            n[o] = k == 3 ? chunks3[f] : 1;
            want[o] = k != 3 || f == 2;
            oc[o] = pc[k], og[o] = pg[k];
            o++;
        }
        e = mixed_forward_worst(&p, oc, og, n_st, ids, n, want, a.V, c1, g1);
        if (!(e <= worst_mixed)) worst_mixed = e;
    }
    assert_int_equal(sg[3].len, 170);
    assert_int_equal(sg[4].len, 1);
    for (int k = 0; k < 3; k++)
        assert_int_equal(sg[k].len, len[k] + STEPS + 3);
    double worst_after = decode_steps_worst(&p, pc, pg, N, STEPS, a.V, c1, g1);
    printf("  3 forwards of 3 decode rows riding in a 170-token prompt (and a one-token prompt): worst rel err of a "
           "row %.2e; then %d decode steps of all five: %.2e\n",
           worst_mixed, STEPS, worst_after);
    assert_true(worst < 1e-1);
    assert_true(worst_mixed < 1e-1);
    assert_true(worst_after < 1e-1);
    free(c1), free(g1);
    free_paged(&p, sc, sg, N, &pool);
}

static void test_model_gradients(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    be_t *gbe = p.gpu.be;
    int B = 2, T = 70;
    int32_t *ids = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 53 + 5) % a.V;
    int64_t nh = (int64_t)B * T * a.d;
    float *R = malloc(sizeof(float) * nh);
    tu_randn(R, nh, 3, 1.0f);
    tu_round_bf16(R, nh);
    block_saved_t bc[8], bg[8];
    model_acts_t ac = {.blocks = bc}, ag = {.blocks = bg};
    float *gc = calloc((size_t)p.cpu.pt.total, sizeof(float));
    assert_int_equal(model_forward_train(&p.rcpu, ids, B, T, 0, &ac), 0);
    assert_int_equal(model_backward(&p.rcpu, &ac, R, gc), 0);
    float *dgrad = gbe->alloc(gbe, (size_t)p.gpu.pt.total * sizeof(float));
    assert_non_null(dgrad);
    gbe->memset0(gbe, dgrad, (size_t)p.gpu.pt.total * sizeof(float));
    void *dR = tu_dev_act(gbe, R, nh);
    assert_int_equal(model_forward_train(&p.rgpu, ids, B, T, 0, &ag), 0);
    assert_int_equal(model_backward(&p.rgpu, &ag, dR, dgrad), 0);
    float *gg = tu_host_f32(gbe, dgrad, p.gpu.pt.total);
    // Per tensor: bf16 activations and bf16 products in the backward; the
    // relative error of a gradient tensor grows with the depth it flows
    // through. Matrices and norm weights: bound 1e-1. Per-head vectors (A_log,
    // dt_bias, D) are sums over all tokens of terms of both signs, whose error
    // is relative to the terms, not to the result (test_cuda_gdn and
    // test_cuda_ssd hold them so, layer by layer): relative to the result it
    // depends on how much the draw cancels (run 24: worst 8.2e-2; run 26, the
    // same backward with other GDN weights: 3.6e-1). What this test adds is
    // the wiring, and a gradient dropped or doubled on its way is off by 1:
    // bound 5e-1. The seen values are printed.
    double worst = 0, worst_vec = 0;
    for (int i = 0; i < p.cpu.pt.n; i++) {
        const param_t *q = &p.cpu.pt.p[i];
        if (!strcmp(q->name, "lm_head.weight")) continue; // not in this loss
        double e = tu_rel_err(gg + q->off, gc + q->off, q->numel);
        int vec = q->nd == 1 && (strstr(q->name, "A_log") || strstr(q->name, "dt_bias") || strstr(q->name, ".D"));
        printf("  %-52s rel err %.2e\n", q->name, e);
        if (vec && e > worst_vec) worst_vec = e;
        if (!vec && e > worst) worst = e;
    }
    printf("  worst parameter-gradient rel err %.2e (matrices, norms), %.2e (per-head vectors)\n", worst, worst_vec);
    assert_true(worst < 1e-1);
    assert_true(worst_vec < 5e-1);
    gbe->free(gbe, dgrad);
    gbe->free(gbe, dR);
    free(gg), free(gc), free(R), free(ids);
    free_pair(&p);
}

// The real default model on both backends: prompt 1 of the transformers
// fixture (the chat-formatted question). The CPU side gets the same
// bf16-rounded weights, so differences come from bf16 activations alone.
static void test_smollm2_cuda_vs_cpu(void **st) {
    const char *path = tu_model_path();
    be_t *gbe = tu_gpu();
    char *text;
    assert_int_equal(fs_read_all("tests/fixtures/model/smollm2_ref.json", &text, NULL), 0);
    cJSON *root = cJSON_Parse(text);
    const cJSON *ids_j = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "prompts"), 1), "ids");
    int T = cJSON_GetArraySize(ids_j);
    int32_t *ids = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++)
        ids[i] = cJSON_GetArrayItem(ids_j, i)->valueint;
    model_t mc, mg;
    assert_int_equal(model_load(&mc, path, tu_cpu()), 0);
    model_run_t r_mc;
    assert_int_equal(model_run_create(&r_mc, &mc, (size_t)1 << 30), 0);
    assert_int_equal(model_load(&mg, path, gbe), 0);
    model_run_t r_mg;
    assert_int_equal(model_run_create(&r_mg, &mg, (size_t)1 << 30), 0);
    int V = mc.a.V;
    float *lc32 = malloc(sizeof(float) * T * V), *lc = malloc(sizeof(float) * T * V),
          *lg = malloc(sizeof(float) * T * V);
    assert_int_equal(model_logits_all(&r_mc, ids, 1, T, lc32), 0);
    tu_round_bf16((float *)mc.w, mc.pt.total);
    assert_int_equal(model_logits_all(&r_mc, ids, 1, T, lc), 0);
    assert_int_equal(model_logits_all(&r_mg, ids, 1, T, lg), 0);
    int agree = 0, agree32 = 0;
    for (int t = 0; t < T; t++) {
        int ac = 0, ag = 0, a32 = 0;
        for (int v = 1; v < V; v++) {
            if (lc[(int64_t)t * V + v] > lc[(int64_t)t * V + ac]) ac = v;
            if (lg[(int64_t)t * V + v] > lg[(int64_t)t * V + ag]) ag = v;
            if (lc32[(int64_t)t * V + v] > lc32[(int64_t)t * V + a32]) a32 = v;
        }
        agree += ac == ag, agree32 += a32 == ag;
        if (t == T - 1)
            printf("  last position: argmax cpu fp32 %d (%.3f), cpu bf16-weights %d (%.3f), cuda %d (%.3f)\n", a32,
                   lc32[(int64_t)t * V + a32], ac, lc[(int64_t)t * V + ac], ag, lg[(int64_t)t * V + ag]);
    }
    double e = tu_rel_err(lg, lc, (int64_t)T * V), e32 = tu_rel_err(lg, lc32, (int64_t)T * V);
    double ew = tu_rel_err(lc, lc32, (int64_t)T * V);
    printf("  SmolLM2, %d tokens: cuda vs cpu (bf16 weights) rel err %.2e, argmax agree %d/%d\n", T, e, agree, T);
    printf("  cuda vs cpu fp32 weights rel err %.2e (argmax agree %d/%d); bf16 weight rounding alone %.2e\n", e32,
           agree32, T, ew);
    // bf16 activations through 30 layers: seen 3.35e-2 relative on the logits
    // on the H200 (run 4; argmax agreeing at 36 of 37 positions).
    assert_true(e < 5e-2);
    model_run_free(&r_mc);
    model_free(&mc);
    model_run_free(&r_mg);
    model_free(&mg);
    free(lc32), free(lc), free(lg), free(ids);
    cJSON_Delete(root);
    free(text);
}

// The growing caches on the GPU (bf16): a state that starts with room for
// MODEL_STATE_CAP0 tokens and grows twice while 2 sequences decode to 700
// tokens gives the logits of a state with room for all of them from the start
// bit for bit (growth copies the rows held; the attention and MLA decodes
// split the rows over blocks by the length's bucket under the context limit,
// the same in both, not by the room); its bytes per token are `hylo info`'s
// cuda figure. On a GPU the steps are recorded CUDA graphs: the grown state's
// are recorded again at each growth (new buffers), and both at the bucket
// boundary they cross (512 rows).
static void test_state_growth(void **st) {
    arch_t a = small_hybrid();
    pair_t p;
    make_pair(&p, &a);
    enum { B = 2, T = 700, P = 300 };
    int32_t *ids = malloc(sizeof(int32_t) * B * T), prompt[B * P], step[B];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 37 + 11) % a.V;
    for (int b = 0; b < B; b++)
        memcpy(prompt + b * P, ids + b * T, P * sizeof(int32_t));
    size_t n = (size_t)(T - P + 1) * B * a.V;
    float *lg[2] = {tu_nans((int64_t)n), tu_nans((int64_t)n)};
    // hylo info's cuda figure on a GPU; the CPU standing in for one (HYLO_TEST_CPU_AS_GPU) keeps fp32 rows
    if (p.gpu.be->kind == BE_CUDA) assert_int_equal(p.gpu.be->act_size, be_act_size_of("cuda"));
    int64_t per = arch_cache_bytes_per_token(&a, (int)p.gpu.be->act_size);
    assert_int_equal(model_cache_bytes_per_token(&p.gpu), per);
    for (int full = 0; full < 2; full++) {
        model_state_t s;
        assert_int_equal(model_state_alloc(&p.gpu, &s, B, T), 0);
        assert_int_equal(s.cap, MODEL_STATE_CAP0);
        if (full) assert_int_equal(model_state_reserve(&p.gpu, &s, T), 0);
        int grew = 0, cap = s.cap;
        assert_int_equal(model_prefill(&p.rgpu, &s, prompt, P, 64, lg[full]), 0);
        for (int t = P; t < T; t++) {
            for (int b = 0; b < B; b++)
                step[b] = ids[b * T + t];
            assert_int_equal(model_step(&p.rgpu, &s, step, lg[full] + (size_t)(t - P + 1) * B * a.V), 0);
            grew += s.cap != cap, cap = s.cap;
        }
        assert_int_equal(s.cap, T);
        assert_int_equal(s.cache_bytes, (size_t)B * s.cap * per);
        printf("  %s: room %d tokens, %zu cache bytes (%lld per token), %d growth%s while decoding\n",
               full ? "preallocated" : "grown", s.cap, s.cache_bytes, (long long)per, grew, grew == 1 ? "" : "s");
        model_state_free(&p.gpu, &s);
    }
    assert_memory_equal(lg[0], lg[1], n * sizeof(float));
    free(ids), free(lg[0]), free(lg[1]);
    free_pair(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_logits),        cmocka_unit_test(test_state_growth),
        cmocka_unit_test(test_step_batch),          cmocka_unit_test(test_model_gradients),
        cmocka_unit_test(test_smollm2_cuda_vs_cpu), cmocka_unit_test(test_prefill_key_tiles),
        cmocka_unit_test(test_step_batch_paged),    cmocka_unit_test(test_decode_rows_in_prefill),
        cmocka_unit_test(test_step_other_states),   cmocka_unit_test(test_greedy_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
