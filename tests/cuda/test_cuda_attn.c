// CUDA attention ops (attn_fwd causal and unmasked, attn_merge, attn_bwd,
// mla_decode_attn, attn_decode, kv_append, proj_mla_rope_append) against the CPU
// reference (tu_cpu()) on the GPU machine. Inputs are rounded to bf16 first, so
// both backends see the same numbers and differences come only from the
// computation; every GPU output is poisoned with NaN before the call, so an
// element the kernel forgot to write fails the comparison.
//
// Tolerances (L2 relative error ||gpu - cpu|| / ||cpu||):
//  - attention out 1e-2: the GPU rounds P to bf16 before the P V product
//    (relative error <= 2^-9 per weight, ~1e-3 on the output in L2) and rounds
//    the output to bf16 (2^-9 per element, ~1.1e-3 in L2); expected ~2e-3.
//  - dq, dk, dv 2e-2: on top of the same roundings, dS = P (dP - D) is rounded
//    to bf16 before the dK / dQ products, and the GPU's D = rowsum(dO * O) uses
//    its own bf16 O (the CPU uses fp32), an error that dP - D can amplify where
//    the two nearly cancel; expected ~5e-3.
//  - lse max |diff| 1e-4 (absolute): fp32 throughout (scores are exact products
//    of bf16 inputs summed in fp32, exp2 approximations ~2^-22 relative), so the
//    error is ~1e-6 on values of order log(Tk); one key masked wrongly changes a
//    row's lse by about log(1 + 1/Tk) >= 1e-3 at these sizes.
//  - mla_decode_attn out 1e-2: the same two bf16 roundings as the forward (P
//    rounded to bf16 for the tensor-core P c product, ~1e-3 in L2, and the
//    output's, ~1.1e-3); the merges (of a block's row groups, of the split's
//    slices by the last block or the combine kernel, of a short sequence's
//    cluster blocks by block 0) are fp32 and add only summation-order noise
//    (~1e-6), so a cluster case keeps the one-block case's tolerance.
//    k_mla_short (production for max_len <= 4096 where it fits) keeps P in
//    fp32 (fp32 FMAs throughout, its cluster's merge fp32 too): only the
//    output's rounding, ~1.1e-3, so the same 1e-2 leaves it more room.
//  - attn_decode out 5e-3: scores, softmax and P V are fp32 on the GPU (P is
//    not rounded), so the one bf16 rounding is the output's (2^-9 relative per
//    element, ~1.1e-3 in L2) plus fp32 summation-order noise (~1e-6); expected
//    ~1.2e-3. The kernel's online softmax in the exp2 domain (scale * log2(e)
//    folded into q: one more fp32 rounding per score, ex2 ~2^-22 relative) and
//    its merges of lane groups, warps and slices (a few fp32 roundings each;
//    a one-block pair has no slice merge) stay at that order of noise; 5e-3
//    leaves 4x room over the bf16 output rounding, while one wrong row or
//    weight is ~1e-1.
//  - kv_append: exact (memcmp of the caches): bf16 copies of bf16-rounded inputs.
//  - proj_mla_rope_append: q 1e-2, the caches element by element (at
//    test_proj_mla_rope_append).
// A wrong index, mask, GQA mapping or tile boundary gives errors of order 0.1-1.
// A failure prints the shape, the error, and the first element off by more
// than 8 * tol * rms(reference) with its coordinates.
//
// Built twice (Makefile): build/tests/cuda/test_cuda_attn against libhylo.a
// runs the production kernels (one per job, no variants); the bench-variants
// build (build/bench-variants/tests/cuda/test_cuda_attn, -DHYLO_BENCH_VARIANTS,
// against the library whose CUDA files hold the bench-only kernel variants) also
// runs every case under each variant the benchmarks compare, chosen through the
// environment variables that only that library reads.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

// Sets (val) or clears (NULL) a kernel variant knob of the bench-variants build.
static void set_knob(const char *name, const char *val) {
    if (val)
        setenv(name, val, 1);
    else
        unsetenv(name);
}

typedef struct {
    int B, Tq, Tk, H, Hkv, dqk, dv;
    float qstd; // std of q (scores have std ~ qstd with scale 1/sqrt(dqk)); large = peaky softmax
} shape_t;

// Compares gpu against ref (n elements of a tensor with dims[0..3] named by
// the 4 letters of `axes`); prints one line, and on failure the first bad
// element. Returns 1 on failure.
static int cmp(const char *label, const char *what, const float *gpu, const float *ref, int64_t n,
               const int64_t dims[4], const char *axes, double tol, int abs_mode) {
    // located on failure: the first element off by more than tol (abs_mode) or
    // 8 tol rms(ref), and the worst one
    tu_cmp_t c = tu_compare(gpu, ref, n, 0.0, abs_mode ? 0.0 : 8 * tol, abs_mode ? tol : 0.0);
    double err = abs_mode ? c.max_abs : c.rel;
    int fail = c.nonfinite || !(err <= tol);
    printf("  %-44s %-3s %s %.3e (tol %.0e)%s\n", label, what, abs_mode ? "max|d|" : "rel", err, tol,
           fail ? "  FAIL" : "");
    if (fail) {
        char first[64], worst[64];
        snprintf(first, sizeof first, "    first bad %s element", what);
        snprintf(worst, sizeof worst, "    worst     %s element", what);
        tu_print_elem(first, gpu, ref, c.first >= 0 ? c.first : c.worst, dims, axes, c.rms);
        tu_print_elem(worst, gpu, ref, c.worst, dims, axes, c.rms);
    }
    return fail;
}

// One shape through the forward and the backward on both backends; `gpu` may
// be a backend with a small scratch arena. Returns the number of failures.
static int run_attn(be_t *gpu, const shape_t *s, uint64_t seed, const char *tag) {
    be_t *cpu = tu_cpu();
    const int B = s->B, Tq = s->Tq, Tk = s->Tk, H = s->H, Hkv = s->Hkv, dqk = s->dqk, dv = s->dv;
    const int64_t nq = (int64_t)B * Tq * H * dqk, nk = (int64_t)B * Tk * Hkv * dqk, nv = (int64_t)B * Tk * Hkv * dv;
    const int64_t no = (int64_t)B * Tq * H * dv, nl = (int64_t)B * H * Tq;
    const float scale = 1.0f / sqrtf((float)dqk);
    char label[160];
    snprintf(label, sizeof label, "B%d Tq%d Tk%d H%d Hkv%d %d/%d%s%s", B, Tq, Tk, H, Hkv, dqk, dv,
             s->qstd > 1.5f ? " peaky" : "", tag);

    float *q = tu_rnd(nq, seed, s->qstd), *k = tu_rnd(nk, seed + 1, 1.0f), *v = tu_rnd(nv, seed + 2, 1.0f);
    float *dout = tu_rnd(no, seed + 3, 1.0f);
    // CPU reference (fp32 on the bf16-rounded inputs)
    float *o_c = malloc(no * sizeof(float) + 4), *lse_c = malloc(nl * sizeof(float) + 4);
    float *dq_c = malloc(nq * sizeof(float) + 4), *dk_c = malloc(nk * sizeof(float) + 4);
    float *dv_c = malloc(nv * sizeof(float) + 4);
    cpu->attn_fwd(cpu, o_c, lse_c, q, k, v, B, Tq, Tk, H, Hkv, dqk, dv, scale, 1);
    cpu->attn_bwd(cpu, dq_c, dk_c, dv_c, dout, q, k, v, o_c, lse_c, B, Tq, Tk, H, Hkv, dqk, dv, scale);

    // GPU: forward with lse, then the backward on the GPU's own out and lse
    void *q_d = tu_dev_act(gpu, q, nq), *k_d = tu_dev_act(gpu, k, nk), *v_d = tu_dev_act(gpu, v, nv);
    void *do_d = tu_dev_act(gpu, dout, no);
    int64_t nmax = nq;
    const int64_t sizes[4] = {nk, nv, no, nl};
    for (int i = 0; i < 4; i++)
        nmax = sizes[i] > nmax ? sizes[i] : nmax;
    float *poison = tu_nans(nmax);
    void *o_d = tu_dev_act(gpu, poison, no), *dq_d = tu_dev_act(gpu, poison, nq), *dk_d = tu_dev_act(gpu, poison, nk);
    void *dv_d = tu_dev_act(gpu, poison, nv);
    float *lse_d = tu_dev_f32(gpu, poison, nl);
    gpu->attn_fwd(gpu, o_d, lse_d, q_d, k_d, v_d, B, Tq, Tk, H, Hkv, dqk, dv, scale, 1);
    int rc = gpu->sync(gpu);
    if (rc) printf("  %s: attn_fwd failed: %s\n", label, err_msg());
    assert_int_equal(rc, 0);
    float *o_g = tu_host_act(gpu, o_d, no), *lse_g = tu_host_f32(gpu, lse_d, nl);
    gpu->attn_bwd(gpu, dq_d, dk_d, dv_d, do_d, q_d, k_d, v_d, o_d, lse_d, B, Tq, Tk, H, Hkv, dqk, dv, scale);
    rc = gpu->sync(gpu);
    if (rc) printf("  %s: attn_bwd failed: %s\n", label, err_msg());
    assert_int_equal(rc, 0);
    float *dq_g = tu_host_act(gpu, dq_d, nq), *dk_g = tu_host_act(gpu, dk_d, nk), *dv_g = tu_host_act(gpu, dv_d, nv);

    int fails = 0;
    const int64_t dq_dims[4] = {B, Tq, H, dqk}, do_dims[4] = {B, Tq, H, dv}, dk_dims[4] = {B, Tk, Hkv, dqk};
    const int64_t dvv_dims[4] = {B, Tk, Hkv, dv}, l_dims[4] = {1, B, H, Tq};
    fails += cmp(label, "out", o_g, o_c, no, do_dims, "btHc", 1e-2, 0);
    fails += cmp(label, "lse", lse_g, lse_c, nl, l_dims, "-bHt", 1e-4, 1);
    fails += cmp(label, "dq", dq_g, dq_c, nq, dq_dims, "btHc", 2e-2, 0);
    fails += cmp(label, "dk", dk_g, dk_c, nk, dk_dims, "btKc", 2e-2, 0);
    fails += cmp(label, "dv", dv_g, dv_c, nv, dvv_dims, "btKc", 2e-2, 0);

    // inference form: lse NULL must give the same output bit for bit
    assert_int_equal(gpu->upload_act(gpu, o_d, poison, no), 0);
    gpu->attn_fwd(gpu, o_d, NULL, q_d, k_d, v_d, B, Tq, Tk, H, Hkv, dqk, dv, scale, 1);
    assert_int_equal(gpu->sync(gpu), 0);
    float *o_g2 = tu_host_act(gpu, o_d, no);
    if (memcmp(o_g, o_g2, (size_t)no * sizeof(float)) != 0) {
        printf("  %s: attn_fwd with lse = NULL differs from the call with lse  FAIL\n", label);
        fails++;
    }

    gpu->free(gpu, q_d), gpu->free(gpu, k_d), gpu->free(gpu, v_d), gpu->free(gpu, do_d), gpu->free(gpu, o_d);
    gpu->free(gpu, dq_d), gpu->free(gpu, dk_d), gpu->free(gpu, dv_d), gpu->free(gpu, lse_d);
    free(q), free(k), free(v), free(dout), free(o_c), free(lse_c), free(dq_c), free(dk_c), free(dv_c);
    free(o_g), free(lse_g), free(dq_g), free(dk_g), free(dv_g), free(o_g2), free(poison);
    return fails;
}

// Shapes: T not a multiple of any tile (1, 17, 100, 257, ...), Tq < Tk
// (prefill after a cache, including Tq = 1), H/Hkv = 1, 3, 4, every
// instantiated head-dim pair and padded ones through the generic path. The last
// four are for the backward v2 (128-key, 64-query tiles): several key tiles with
// a partial last one, Tq < Tk with the diagonal inside a tile, GQA, a peaky
// softmax, dv < dqk. The five after them are for the wgmma backward (128-key
// tiles, 128-query steps at 64/64, 64 at 128/128 and 192/128): B = 2 with GQA
// at each head-dim pair and T not a multiple of a tile (Tq == Tk, Tq < Tk), a
// step past Tq whose lse2 / D load is short (Tq 200: Tqp 256), and Tq = 150,
// where the second warpgroup's keys of the last key tile see no query.
static const shape_t attn_shapes[] = {
    {1, 1, 1, 1, 1, 64, 64, 1.0f},       {2, 17, 17, 4, 4, 64, 64, 1.0f},     {2, 257, 257, 8, 2, 64, 64, 1.0f},
    {1, 1000, 1000, 2, 1, 64, 64, 1.0f}, {1, 129, 1000, 2, 1, 64, 64, 1.0f},  {1, 100, 100, 3, 1, 128, 128, 1.0f},
    {1, 100, 257, 4, 1, 128, 128, 1.0f}, {1, 1, 300, 4, 2, 128, 128, 1.0f},   {1, 1024, 1024, 2, 2, 128, 128, 3.0f},
    {3, 200, 200, 4, 4, 128, 64, 1.0f},  {1, 257, 257, 2, 2, 192, 128, 1.0f}, {1, 17, 100, 6, 2, 192, 128, 1.0f},
    {1, 100, 100, 3, 3, 96, 64, 1.0f},   {2, 257, 257, 3, 1, 96, 64, 3.0f},   {1, 300, 300, 2, 1, 192, 192, 1.0f},
    {1, 70, 70, 4, 2, 160, 96, 1.0f},    {1, 130, 130, 2, 1, 256, 256, 1.0f}, {1, 513, 513, 2, 2, 256, 128, 1.0f},
    {1, 65, 65, 2, 2, 16, 32, 1.0f},     {1, 40, 333, 4, 4, 64, 64, 3.0f},    {1, 300, 300, 4, 2, 128, 128, 1.0f},
    {2, 200, 455, 6, 2, 128, 128, 3.0f}, {1, 385, 385, 3, 3, 64, 64, 1.0f},   {1, 97, 160, 2, 1, 64, 48, 1.0f},
    {2, 333, 333, 4, 2, 192, 128, 1.0f}, {2, 200, 333, 6, 2, 64, 64, 3.0f},   {2, 333, 600, 4, 1, 128, 128, 1.0f},
    {2, 200, 700, 4, 2, 192, 128, 3.0f}, {1, 150, 150, 2, 1, 64, 64, 1.0f},
};

// The kernel variants the attention tests run, as the knobs of the
// bench-variants build (NULL: unset): the default kernels (wgmma forward and
// backward at (dqk, dv) = (64, 64), (128, 128) and (192, 128), mma.sync
// elsewhere); the mma.sync backward variants (HYLO_ATTN_BWD = 1: v1's
// alternative tiles, 2: v1 with its default tiles at d 128, 3: k_attn_bwd2 at
// d <= 64, where they exist); the mma.sync forward (HYLO_ATTN_FWD = 2,
// k_attn_fwd); the mma.sync backward at every head dim (HYLO_ATTN_BWD = 4, the
// production backward before run 25); the wgmma forward in L2-sized sections
// of (b, kv head) units (HYLO_ATTN_FWD = 3) and on a persistent grid (4).
// The test shapes are far below the L2 budget (one section, fewer tiles than
// SMs), so the three after them force small sections (HYLO_ATTN_FWD_UNITS,
// some shorter at the end) and a few persistent blocks (HYLO_ATTN_FWD_BLOCKS,
// each claiming several tiles in turn). Last, the wgmma backward with its dQ
// tiles added by bulk tensor reductions from shared memory at every wgmma
// head dim (HYLO_ATTN_BWD = 5; production does so at 128/128 and 192/128):
// the shapes with T not a multiple of 64 check that rows at or past Tq add
// nothing (the next head's rows in the accumulator); and the wgmma backward
// with its dQ added from registers at every wgmma head dim (6).
typedef struct {
    const char *bwd, *fwd, *units, *blocks, *tag;
} attn_var_t;
#ifdef HYLO_BENCH_VARIANTS
static const attn_var_t attn_vars[] = {
    {NULL, NULL, NULL, NULL, ""},
    {"1", NULL, NULL, NULL, " [bwd variant 1]"},
    {"2", NULL, NULL, NULL, " [bwd variant 2]"},
    {"3", NULL, NULL, NULL, " [bwd variant 3]"},
    {NULL, "2", NULL, NULL, " [fwd mma.sync]"},
    {"4", NULL, NULL, NULL, " [bwd mma.sync]"},
    {NULL, "3", "2", NULL, " [fwd L2 order, 2 units a section]"},
    {NULL, "4", "1", "3", " [fwd persistent, 3 blocks, 1 unit a section]"},
    {NULL, "4", NULL, "5", " [fwd persistent, 5 blocks]"},
    {"5", NULL, NULL, NULL, " [bwd wgmma, dQ by bulk reduce]"},
    {"6", NULL, NULL, NULL, " [bwd wgmma, dQ by register adds]"},
};
#else
static const attn_var_t attn_vars[] = {{NULL, NULL, NULL, NULL, ""}};
#endif
enum { N_ATTN_VARS = (int)(sizeof attn_vars / sizeof attn_vars[0]) };

// Sets the knobs of variant v (v < 0: clears them all); 0 where
// HYLO_ATTN_TEST_VARIANTS (e.g. "0,5": indices into attn_vars, for a short GPU
// run) leaves it out.
static int set_attn_var(int v) {
    const attn_var_t *a = v >= 0 ? &attn_vars[v] : NULL;
    const char *only = getenv("HYLO_ATTN_TEST_VARIANTS");
    if (a && only && !tu_list_has(only, v)) return 0;
    set_knob("HYLO_ATTN_BWD", a ? a->bwd : NULL);
    set_knob("HYLO_ATTN_FWD", a ? a->fwd : NULL);
    set_knob("HYLO_ATTN_FWD_UNITS", a ? a->units : NULL);
    set_knob("HYLO_ATTN_FWD_BLOCKS", a ? a->blocks : NULL);
    return 1;
}

// Every shape under every variant of attn_vars.
static void test_attn(void **st) {
    be_t *gpu = tu_gpu();
    int fails = 0, n = (int)(sizeof attn_shapes / sizeof attn_shapes[0]);
    for (int var = 0; var < N_ATTN_VARS; var++) {
        if (!set_attn_var(var)) continue;
        for (int i = 0; i < n; i++)
            fails += run_attn(gpu, &attn_shapes[i], 1000 + 17 * i, attn_vars[var].tag);
    }
    set_attn_var(-1);
    printf("attention: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// Rows [u0, u0 + n) of each of the B sequences of x [B, T, w] (host), contiguous.
static float *key_rows(const float *x, int B, int T, int u0, int n, int w) {
    float *p = tu_hbuf((int64_t)B * n * w);
    for (int b = 0; b < B; b++)
        memcpy(p + (int64_t)b * n * w, x + ((int64_t)b * T + u0) * w, sizeof(float) * n * w);
    return p;
}

// attn_fwd of keys [u0, u0 + n) of k, v (host [B, Tk, Hkv, d]) on the GPU,
// causal or not, into out / lse (device, poisoned first).
static void gpu_part(be_t *gpu, void *o_d, float *lse_d, const void *q_d, const float *k, const float *v,
                     const shape_t *s, int u0, int n, int causal, const float *poison) {
    float *kp = key_rows(k, s->B, s->Tk, u0, n, s->Hkv * s->dqk), *vp = key_rows(v, s->B, s->Tk, u0, n, s->Hkv * s->dv);
    void *k_d = tu_dev_act(gpu, kp, (int64_t)s->B * n * s->Hkv * s->dqk);
    void *v_d = tu_dev_act(gpu, vp, (int64_t)s->B * n * s->Hkv * s->dv);
    assert_int_equal(gpu->upload_act(gpu, o_d, poison, (int64_t)s->B * s->Tq * s->H * s->dv), 0);
    assert_int_equal(gpu->copy_h2d(gpu, lse_d, poison, sizeof(float) * s->B * s->H * s->Tq), 0);
    gpu->attn_fwd(gpu, o_d, lse_d, q_d, k_d, v_d, s->B, s->Tq, n, s->H, s->Hkv, s->dqk, s->dv,
                  1.0f / sqrtf((float)s->dqk), causal);
    int rc = gpu->sync(gpu);
    if (rc) printf("  attn_fwd (causal %d) failed: %s\n", causal, err_msg());
    assert_int_equal(rc, 0);
    gpu->free(gpu, k_d), gpu->free(gpu, v_d);
    free(kp), free(vp);
}

// attn_fwd with causal = 0 (every key visible; Tk < Tq, no key at all) and
// the tiles of MLA's cached prefill: keys [0, a) unmasked, [a, Tk) causal,
// merged by attn_merge (fp32 running result, out at the second merge), which
// must equal the CPU's causal attention over all Tk keys. Tolerances of
// test_attn: out 1e-2 (the result carries three bf16 roundings, each part's P
// and output and the merged output, expected ~3e-3), lse 1e-4 absolute (fp32;
// a key lost or counted twice moves a row's lse by log(1 + 1/Tk) >= 1e-3). No
// key: out exactly 0, lse -inf. Run under the default kernels and each
// forward variant of attn_vars (the backward ones do not change it). Returns
// the number of failures.
static int no_mask_merge(be_t *gpu, be_t *cpu, const char *tag) {
    static const shape_t shapes[] = {
        {1, 1, 1, 1, 1, 64, 64, 1.0f},       {2, 100, 17, 4, 2, 64, 64, 1.0f},  {1, 257, 1000, 6, 2, 128, 128, 1.0f},
        {1, 129, 333, 6, 2, 128, 128, 3.0f}, {2, 64, 65, 2, 2, 192, 128, 1.0f}, {2, 40, 300, 3, 1, 96, 64, 1.0f},
        {1, 70, 0, 2, 1, 64, 64, 1.0f},
    };
    int fails = 0;
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        const shape_t *s = &shapes[i];
        const int B = s->B, Tq = s->Tq, Tk = s->Tk, H = s->H, Hkv = s->Hkv, dqk = s->dqk, dv = s->dv;
        const int64_t nq = (int64_t)B * Tq * H * dqk, no = (int64_t)B * Tq * H * dv, nl = (int64_t)B * H * Tq;
        const float scale = 1.0f / sqrtf((float)dqk);
        float *q = tu_rnd(nq, 6000 + 7 * i, s->qstd), *k = tu_rnd((int64_t)B * Tk * Hkv * dqk, 6001 + 7 * i, 1.0f);
        float *v = tu_rnd((int64_t)B * Tk * Hkv * dv, 6002 + 7 * i, 1.0f);
        float *poison = tu_nans(no > nl ? no : nl), *o_c = tu_hbuf(no), *lse_c = tu_hbuf(nl);
        void *q_d = tu_dev_act(gpu, q, nq), *o_d = tu_dev_act(gpu, poison, no), *o2_d = tu_dev_act(gpu, poison, no);
        float *lse_d = tu_dev_f32(gpu, poison, nl), *lse2_d = tu_dev_f32(gpu, poison, nl);
        float *acc_d = tu_dev_f32(gpu, poison, no), *lacc_d = tu_dev_f32(gpu, poison, nl);
        void *m_d = tu_dev_act(gpu, poison, no);
        const int64_t o_dims[4] = {B, Tq, H, dv}, l_dims[4] = {1, B, H, Tq};
        char label[160];

        // every key visible
        snprintf(label, sizeof label, "B%d Tq%d Tk%d H%d Hkv%d %d/%d%s no mask%s", B, Tq, Tk, H, Hkv, dqk, dv,
                 s->qstd > 1.5f ? " peaky" : "", tag);
        cpu->attn_fwd(cpu, o_c, lse_c, q, k, v, B, Tq, Tk, H, Hkv, dqk, dv, scale, 0);
        gpu_part(gpu, o_d, lse_d, q_d, k, v, s, 0, Tk, 0, poison);
        float *o_g = tu_host_act(gpu, o_d, no), *lse_g = tu_host_f32(gpu, lse_d, nl);
        if (Tk == 0) {
            int bad = 0;
            for (int64_t j = 0; j < no; j++)
                bad += o_g[j] != 0.0f;
            for (int64_t j = 0; j < nl; j++)
                bad += lse_g[j] != -INFINITY;
            printf("  %-44s no key: %s\n", label, bad ? "out not 0 or lse not -inf  FAIL" : "out 0, lse -inf");
            fails += bad > 0;
        } else {
            fails += cmp(label, "out", o_g, o_c, no, o_dims, "btHc", 1e-2, 0);
            fails += cmp(label, "lse", lse_g, lse_c, nl, l_dims, "-bHt", 1e-4, 1);
        }
        free(o_g), free(lse_g);

        // two tiles as mla.c makes them: [0, a) before every query, [a, Tk) causal
        if (Tk >= Tq && Tk > 0) {
            int a = (Tk - Tq) / 2;
            snprintf(label, sizeof label, "B%d Tq%d Tk%d H%d Hkv%d %d/%d%s split at %d%s", B, Tq, Tk, H, Hkv, dqk, dv,
                     s->qstd > 1.5f ? " peaky" : "", a, tag);
            cpu->attn_fwd(cpu, o_c, lse_c, q, k, v, B, Tq, Tk, H, Hkv, dqk, dv, scale, 1);
            gpu_part(gpu, o_d, lse_d, q_d, k, v, s, 0, a, 0, poison);
            gpu_part(gpu, o2_d, lse2_d, q_d, k, v, s, a, Tk - a, 1, poison);
            gpu->attn_merge(gpu, acc_d, lacc_d, o_d, lse_d, NULL, 1, B, Tq, H, dv);
            gpu->attn_merge(gpu, acc_d, lacc_d, o2_d, lse2_d, m_d, 0, B, Tq, H, dv);
            int rc = gpu->sync(gpu);
            if (rc) printf("  %s: attn_merge failed: %s\n", label, err_msg());
            assert_int_equal(rc, 0);
            o_g = tu_host_act(gpu, m_d, no), lse_g = tu_host_f32(gpu, lacc_d, nl);
            fails += cmp(label, "out", o_g, o_c, no, o_dims, "btHc", 1e-2, 0);
            fails += cmp(label, "lse", lse_g, lse_c, nl, l_dims, "-bHt", 1e-4, 1);
            free(o_g), free(lse_g);
        }
        gpu->free(gpu, q_d), gpu->free(gpu, o_d), gpu->free(gpu, o2_d), gpu->free(gpu, lse_d), gpu->free(gpu, lse2_d);
        gpu->free(gpu, acc_d), gpu->free(gpu, lacc_d), gpu->free(gpu, m_d);
        free(q), free(k), free(v), free(poison), free(o_c), free(lse_c);
    }
    return fails;
}

static void test_attn_no_mask_merge(void **st) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    set_attn_var(-1);
    int fails = no_mask_merge(gpu, cpu, attn_vars[0].tag); // the default kernels, whatever the list
    for (int var = 1; var < N_ATTN_VARS; var++)
        if (attn_vars[var].fwd && set_attn_var(var)) fails += no_mask_merge(gpu, cpu, attn_vars[var].tag);
    set_attn_var(-1);
    printf("attention without mask, tiles merged: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// attn_merge alone on the same inputs as the CPU's: three random results
// (outputs and lse with a spread of several nats, some rows -inf, row 4 -inf
// in all three) merged in turn, the first with first = 1 over NaN-filled acc
// and lse (not to be read), the last also writing out. Tolerances: acc and out
// 5e-3 as attn_decode (fp32 weights and acc; out carries the one bf16
// rounding, ~1.1e-3 in L2); lse 1e-5 absolute (fp32 exp and log of values of
// order 1-10, ~1e-6). Rows -inf in all: acc and out 0, lse -inf.
static void test_attn_merge(void **st) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    enum { B = 2, Tq = 77, H = 5, dv = 96, P = 3 };
    const int64_t no = (int64_t)B * Tq * H * dv, nl = (int64_t)B * H * Tq;
    float *o[P], *l[P];
    void *o_d[P];
    float *l_d[P];
    for (int i = 0; i < P; i++) {
        o[i] = tu_rnd(no, 7001 + 2 * i, 1.0f), l[i] = tu_rnd(nl, 7002 + 2 * i, 3.0f);
        for (int64_t j = i; j < nl; j += 7 + 4 * i) // rows where this part saw no key
            l[i][j] = -INFINITY;
        l[i][4] = -INFINITY;
        for (int b = 0; b < B; b++) // a row of no keys has out 0 (attn_fwd's convention)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < Tq; t++)
                    if (l[i][((int64_t)b * H + h) * Tq + t] == -INFINITY)
                        memset(o[i] + (((int64_t)b * Tq + t) * H + h) * dv, 0, sizeof(float) * dv);
        o_d[i] = tu_dev_act(gpu, o[i], no), l_d[i] = tu_dev_f32(gpu, l[i], nl);
    }
    float *poison = tu_nans(no), *acc_c = tu_hdup(poison, no), *lse_c = tu_hdup(poison, nl);
    float *out_c = tu_hdup(poison, no);
    float *acc_d = tu_dev_f32(gpu, poison, no), *lse_d = tu_dev_f32(gpu, poison, nl);
    void *out_d = tu_dev_act(gpu, poison, no);
    for (int i = 0; i < P; i++) {
        cpu->attn_merge(cpu, acc_c, lse_c, o[i], l[i], i == P - 1 ? out_c : NULL, i == 0, B, Tq, H, dv);
        gpu->attn_merge(gpu, acc_d, lse_d, o_d[i], l_d[i], i == P - 1 ? out_d : NULL, i == 0, B, Tq, H, dv);
    }
    int rc = gpu->sync(gpu);
    if (rc) printf("  attn_merge failed: %s\n", err_msg());
    assert_int_equal(rc, 0);
    float *acc_g = tu_host_f32(gpu, acc_d, no), *lse_g = tu_host_f32(gpu, lse_d, nl);
    float *out_g = tu_host_act(gpu, out_d, no);
    // the rows -inf in all parts: exact; the rest compared with those set aside
    int fails = 0, bad = 0;
    for (int64_t j = 0; j < nl; j++)
        if (lse_c[j] == -INFINITY) {
            bad += lse_g[j] != -INFINITY;
            lse_g[j] = lse_c[j] = 0.0f;
        }
    const int64_t o_dims[4] = {B, Tq, H, dv}, l_dims[4] = {1, B, H, Tq};
    printf("  %-44s rows of no key: %s\n", "attn_merge", bad ? "lse not -inf  FAIL" : "lse -inf");
    fails += bad > 0;
    fails += cmp("attn_merge", "acc", acc_g, acc_c, no, o_dims, "btHc", 5e-3, 0);
    fails += cmp("attn_merge", "out", out_g, out_c, no, o_dims, "btHc", 5e-3, 0);
    fails += cmp("attn_merge", "lse", lse_g, lse_c, nl, l_dims, "-bHt", 1e-5, 1);
    for (int i = 0; i < P; i++)
        gpu->free(gpu, o_d[i]), gpu->free(gpu, l_d[i]), free(o[i]), free(l[i]);
    gpu->free(gpu, acc_d), gpu->free(gpu, lse_d), gpu->free(gpu, out_d);
    free(poison), free(acc_c), free(lse_c), free(out_c), free(acc_g), free(lse_g), free(out_g);
    assert_int_equal(fails, 0);
}

// The backward with a scratch arena that holds the fp32 dQ accumulator of only
// some (b, kv head) units, so it runs in several passes.
static void test_attn_bwd_small_arena(void **st) {
    (void)tu_gpu();            // skips without a GPU
    if (tu_fake_gpu()) skip(); // a second CUDA backend
    be_t *small = NULL;
    // D and lse2: 2 x 8 x 320 x 4 x 2 = 40 KB; one unit: 4 x 257 x 64 x 4 = 263 KB -> 3 of 4 units per pass
    if (be_create(&small, "cuda", 1u << 20) < 0) {
        printf("cannot create a second CUDA backend: %s\n", err_msg());
        fail();
    }
    const shape_t s = {2, 257, 257, 8, 2, 64, 64, 1.0f};
    int fails = run_attn(small, &s, 77, " [1 MiB arena]");
#ifdef HYLO_BENCH_VARIANTS
    // the mma.sync backward keeps its own passes over the units (run_bwd)
    set_knob("HYLO_ATTN_BWD", "4");
    fails += run_attn(small, &s, 78, " [1 MiB arena, bwd mma.sync]");
    set_knob("HYLO_ATTN_BWD", NULL);
#endif
    be_destroy(small);
    assert_int_equal(fails, 0);
}

// be->deterministic: the key tiles add dQ in turn. Each shape (v1 with one
// and two column slices, v2, GQA, Tq < Tk, several key tiles) is compared with
// the CPU as in test_attn, and its backward run twice must give the same dq,
// dk and dv bit for bit. (Without the flag dq may differ in its last bits
// between runs: the adds land in the order the blocks run.)
static void test_attn_bwd_deterministic(void **st) {
    be_t *gpu = tu_gpu();
    static const shape_t shapes[] = {
        {2, 257, 257, 8, 2, 64, 64, 1.0f},   {1, 1000, 1000, 2, 1, 64, 64, 1.0f}, {2, 200, 455, 6, 2, 128, 128, 3.0f},
        {1, 257, 257, 2, 2, 192, 128, 1.0f}, {1, 300, 300, 2, 1, 192, 192, 1.0f}, {1, 513, 513, 2, 2, 256, 128, 1.0f},
    };
    gpu->deterministic = 1;
    int fails = 0;
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) {
        const shape_t *s = &shapes[i];
        fails += run_attn(gpu, s, 4000 + 31 * i, " [deterministic]");
        const int64_t nq = (int64_t)s->B * s->Tq * s->H * s->dqk, nk = (int64_t)s->B * s->Tk * s->Hkv * s->dqk;
        const int64_t nv = (int64_t)s->B * s->Tk * s->Hkv * s->dv, no = (int64_t)s->B * s->Tq * s->H * s->dv;
        const float scale = 1.0f / sqrtf((float)s->dqk);
        float *q = tu_rnd(nq, 5000 + i, s->qstd), *k = tu_rnd(nk, 5100 + i, 1.0f), *v = tu_rnd(nv, 5200 + i, 1.0f);
        float *dout = tu_rnd(no, 5300 + i, 1.0f);
        void *q_d = tu_dev_act(gpu, q, nq), *k_d = tu_dev_act(gpu, k, nk), *v_d = tu_dev_act(gpu, v, nv);
        void *do_d = tu_dev_act(gpu, dout, no), *o_d = tu_dev_act(gpu, dout, no);
        float *lse_d = tu_dev_f32(gpu, dout, (int64_t)s->B * s->H * s->Tq);
        gpu->attn_fwd(gpu, o_d, lse_d, q_d, k_d, v_d, s->B, s->Tq, s->Tk, s->H, s->Hkv, s->dqk, s->dv, scale, 1);
        float *g[2][3];
        for (int r = 0; r < 2; r++) {
            void *dq_d = tu_dev_act(gpu, q, nq), *dk_d = tu_dev_act(gpu, k, nk), *dv_d = tu_dev_act(gpu, v, nv);
            gpu->attn_bwd(gpu, dq_d, dk_d, dv_d, do_d, q_d, k_d, v_d, o_d, lse_d, s->B, s->Tq, s->Tk, s->H, s->Hkv,
                          s->dqk, s->dv, scale);
            assert_int_equal(gpu->sync(gpu), 0);
            g[r][0] = tu_host_act(gpu, dq_d, nq), g[r][1] = tu_host_act(gpu, dk_d, nk);
            g[r][2] = tu_host_act(gpu, dv_d, nv);
            gpu->free(gpu, dq_d), gpu->free(gpu, dk_d), gpu->free(gpu, dv_d);
        }
        const int64_t n[3] = {nq, nk, nv};
        const char *what[3] = {"dq", "dk", "dv"};
        for (int j = 0; j < 3; j++) {
            int same = memcmp(g[0][j], g[1][j], (size_t)n[j] * sizeof(float)) == 0;
            printf("  B%d Tq%d Tk%d H%d Hkv%d %d/%d: two backward runs, %s %s\n", s->B, s->Tq, s->Tk, s->H, s->Hkv,
                   s->dqk, s->dv, what[j], same ? "identical" : "DIFFER  FAIL");
            fails += !same;
            free(g[0][j]), free(g[1][j]);
        }
        gpu->free(gpu, q_d), gpu->free(gpu, k_d), gpu->free(gpu, v_d), gpu->free(gpu, do_d), gpu->free(gpu, o_d);
        gpu->free(gpu, lse_d);
        free(q), free(k), free(v), free(dout);
    }
    gpu->deterministic = 0;
    printf("deterministic attention backward: %d failure(s)\n", fails);
    assert_int_equal(fails, 0);
}

// MLA decode: sequences of different lengths in one call (len = 0, 1, around
// the 32-row tiles and slice boundaries, long ones split over many blocks), B
// = 1 and 8, SmolLM2-size (r_kv 128, dr 32) and r_kv 512 + dr 64 latents.
// Rows at or past len[b] hold NaN: reading any of them would poison the output.
// v2 finishes a sequence one of three ways, by its length (cuda_mla.cu,
// mla_slices): one block (up to one ring of tiles; in the bench-variants
// build under HYLO_MLA_CLUSTER=8 the 8 blocks of a cluster merged by block 0
// through distributed shared memory, when B * 8 <= the SMs and max_len <=
// 4096, MLA_CLUSTER_MAX_LEN), the last of its
// slices' blocks merging their partials, or the combine kernel (more slices
// than merge_max); the cases take each, and all of them in one call. Every case runs under the production dispatch (v2
// with tiled tensor copies, and v1 for the shape v2 does not lay out), with the sequences in one buffer (the pool) and
// each in its own allocation (no pool: v2 then takes a bulk copy per row, whose ring of other slots has another
// one-block threshold). In the bench-variants build each case also runs under each kernel forced (HYLO_MLA_DECODE 1 =
// v1, 2 = v2 with cp.async, 3 = v2 with a bulk copy per row), under small v2 rings (HYLO_MLA_STAGES / HYLO_MLA_WARPS),
// so that the slots wrap many times and one or two row groups consume them
// (and the one-block threshold drops to 96 rows), with every split sequence
// merged in its last block or every one in the combine kernel (HYLO_MLA_MERGE
// 1, 2), and with short sequences over a cluster of blocks
// (HYLO_MLA_CLUSTER=8; with the tensor copies and with a copy per row).
// k_mla_short (max_len <= 4096, MLA_SHORT_MAX, a cluster of up to 16 blocks
// a sequence merged through distributed shared memory; cases at the end)
// takes production's short cases where their shape fits it (since run 35):
// the bench-variants build runs every case once more with HYLO_MLA_SHORT=0
// (v2 / v1 for them, production's choice before), and the cases of q_pe
// inside the projected q under both; its other variants run what they name.
// HYLO_MLA_TEST_VARIANTS (e.g. "0,1": production and HYLO_MLA_SHORT=0) runs
// only those variants.
typedef struct {
    int B, H, r_kv, dr;
    int64_t cap;
    int32_t len[8];
    float scale_mul; // scale = scale_mul / sqrt(r_kv + dr)
    int max_pad;     // max_len = the longest length + max_pad (a recorded step's context limit); <= cap - longest
} mla_case_t;

// separate: every sequence in an allocation of its own (a server's states; no
// pool: the kernels copy row by row), else all in one buffer passed as the pool
// (one state: tiled tensor copies under the default variant).
// qp_off > 0: q_pe read in place in a projected q of heads [q_nope (qp_off) |
// q_pe], row stride H (qp_off + dr) and head stride qp_off + dr (an offset
// that is not a multiple of 8 takes the op's copy of q_pe).
static int run_mla(const mla_case_t *c, uint64_t seed, int separate, int qp_off) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int B = c->B, H = c->H, R = c->r_kv, DR = c->dr, L = R + DR;
    const int64_t ncache = (int64_t)B * c->cap * L, nq = (int64_t)B * H * R, hs = qp_off + DR, np = (int64_t)B * H * hs;
    const float scale = c->scale_mul / sqrtf((float)L);
    char label[160];
    int n = snprintf(label, sizeof label, "mla%s%s B%d H%d r_kv%d dr%d cap%lld len", separate ? " sep" : "",
                     qp_off ? (qp_off % 8 ? " q_pe odd" : " q_pe in q") : "", B, H, R, DR, (long long)c->cap);
    for (int b = 0; b < B && n < (int)sizeof label - 12; b++)
        n += snprintf(label + n, sizeof label - n, " %d", c->len[b]);
    if (c->max_pad && n < (int)sizeof label - 16) snprintf(label + n, sizeof label - n, " max_len+%d", c->max_pad);

    float *cache = tu_rnd(ncache, seed, 1.0f), *ql = tu_rnd(nq, seed + 1, 1.0f), *qp = tu_rnd(np, seed + 2, 1.0f);
    for (int b = 0; b < B; b++)
        for (int64_t u = c->len[b]; u < c->cap; u++)
            for (int i = 0; i < L; i++)
                cache[((int64_t)b * c->cap + u) * L + i] = NAN;
    float *out_c = malloc(nq * sizeof(float));
    int max_len = 0;
    void *rows_h[8];
    for (int b = 0; b < B; b++) {
        max_len = c->len[b] > max_len ? c->len[b] : max_len;
        rows_h[b] = cache + (int64_t)b * c->cap * L;
    }
    max_len += c->max_pad;
    cpu->mla_decode_attn(cpu, out_c, ql, qp + qp_off, H * hs, hs, rows_h, (be_pages_t){0}, c->len, max_len, NULL, 0, B,
                         H, R, DR, scale);

    void *cache_d = tu_dev_act(gpu, cache, ncache), *ql_d = tu_dev_act(gpu, ql, nq), *qp_d = tu_dev_act(gpu, qp, np);
    void *seq_d[8] = {0}; // separate: each sequence's copy
    for (int b = 0; b < B; b++) {
        seq_d[b] = separate ? tu_dev_act(gpu, cache + (int64_t)b * c->cap * L, c->cap * L) : NULL;
        rows_h[b] = separate ? seq_d[b] : tu_gat(gpu, cache_d, (int64_t)b * c->cap * L);
    }
    void **rows_d = gpu->alloc(gpu, sizeof(void *) * 8);
    assert_non_null(rows_d);
    assert_int_equal(gpu->copy_h2d(gpu, rows_d, rows_h, sizeof(void *) * B), 0);
    float *poison = tu_nans(nq);
    void *out_d = tu_dev_act(gpu, poison, nq);
    int32_t *len_d = gpu->alloc(gpu, sizeof(int32_t) * 8);
    assert_non_null(len_d);
    assert_int_equal(gpu->copy_h2d(gpu, len_d, c->len, sizeof(int32_t) * B), 0);
    gpu->mla_decode_attn(gpu, out_d, ql_d, tu_gat(gpu, qp_d, qp_off), H * hs, hs, rows_d, (be_pages_t){0}, len_d,
                         max_len, separate ? NULL : cache_d, separate ? 0 : B * c->cap, B, H, R, DR, scale);
    int rc = gpu->sync(gpu);
    if (rc) printf("  %s: mla_decode_attn failed: %s\n", label, err_msg());
    assert_int_equal(rc, 0);
    float *out_g = tu_host_act(gpu, out_d, nq);
    const int64_t dims[4] = {1, B, H, R};
    int fails = cmp(label, "out", out_g, out_c, nq, dims, "-bHc", 1e-2, 0);
    // per sequence, so a failure names the length that broke
    for (int b = 0; b < B && fails; b++) {
        const int64_t off = (int64_t)b * H * R;
        double e = tu_rel_err(out_g + off, out_c + off, (int64_t)H * R);
        printf("    sequence %d (len %d): rel %.3e\n", b, c->len[b], e);
    }
    gpu->free(gpu, cache_d), gpu->free(gpu, ql_d), gpu->free(gpu, qp_d), gpu->free(gpu, out_d), gpu->free(gpu, len_d);
    gpu->free(gpu, rows_d);
    for (int b = 0; b < B; b++)
        gpu->free(gpu, seq_d[b]);
    free(cache), free(ql), free(qp), free(out_c), free(out_g), free(poison);
    return fails;
}

static void test_mla_decode(void **st) {
    static const mla_case_t cases[] = {
        {3, 9, 128, 32, 5000, {1, 4099, 1000}, 1.0f, 0},
        {2, 32, 16, 32, 300, {77, 300}, 1.0f, 0},
        {2, 16, 512, 64, 3000, {2050, 33}, 1.0f, 0},
        {1, 24, 160, 64, 70000, {65537}, 1.0f, 0},
        {8, 32, 64, 32, 1500, {0, 1, 2, 31, 32, 33, 1000, 1500}, 1.0f, 0},
        {4, 17, 128, 64, 2000, {1999, 5, 64, 128}, 4.0f, 0},
        {1, 32, 128, 64, 40000, {39999}, 4.0f, 0},
        // B > 1 with lengths that are not multiples of the split or the tile, long
        // slices (the ring wraps at the default size), a negative scale (v2
        // negates Q instead), r_kv not a multiple of 16 (zero columns of the tile)
        {2, 32, 128, 32, 200000, {200000, 150001}, 1.0f, 0},
        {3, 9, 128, 64, 9000, {8999, 4097, 7}, -1.0f, 0},
        {2, 5, 136, 16, 3000, {2999, 1234}, 2.0f, 0},
        // 3 head tiles x 4 column chunks = 12 warps per row group, more than v2's
        // 11 (MLA2_MAXW): the production dispatch falls back to v1
        {2, 48, 512, 64, 3000, {2999, 1000}, 1.0f, 0},
        // B = 8 with mixed lengths up to 70K (SmolLM2-size latents; r_kv 512 +
        // dr 64 up to 9K), B = 1 at 70K and around the 32-row tiles for both,
        // and max_len past every length (slices sized for rows that are not
        // there, as a recorded decode step passes its context limit)
        {8, 9, 128, 32, 70003, {70000, 0, 1, 31, 32, 33, 4096, 12345}, 1.0f, 0},
        {8, 16, 512, 64, 9003, {9000, 33, 4096, 0, 1, 2500, 32, 31}, 1.0f, 0},
        {1, 9, 128, 32, 70000, {70000}, 1.0f, 0},
        {1, 16, 512, 64, 70000, {69999}, 1.0f, 0},
        {4, 9, 128, 32, 40, {1, 31, 32, 33}, 1.0f, 0},
        {4, 16, 512, 64, 40, {33, 32, 31, 1}, 1.0f, 0},
        {2, 24, 128, 64, 9000, {100, 2000}, 1.0f, 7000},
        {1, 9, 128, 32, 5000, {0}, 1.0f, 4999},
        // around the one-block threshold (one fill of v2's ring, NSTG 32 rows,
        // at least the 8 tiles of a slice: 576 at H 9, r_kv 128, dr 32 with the
        // tiled copies and 227 KB of shared memory, 672 with the per-row ones;
        // 256 at H 16, r_kv 512, dr 64), one launch each (576: one block, 577:
        // 2 slices), then in one launch under a recorded step's max_len (577
        // and 257: slices merged by the last block, the rest one block each)
        {1, 9, 128, 32, 600, {576}, 1.0f, 0},
        {1, 9, 128, 32, 600, {577}, 1.0f, 0},
        {4, 9, 128, 32, 8200, {0, 1, 576, 577}, 1.0f, 7600},
        {1, 16, 512, 64, 600, {256}, 1.0f, 0},
        {1, 16, 512, 64, 600, {512}, 1.0f, 0},
        {4, 16, 512, 64, 4300, {257, 256, 1, 0}, 1.0f, 4000},
        // the three ways in one launch: 44 slices per sequence (one wave of 132
        // SMs over 3), of which 70,000 rows take all (more than the 6 the
        // last block merges at this shape: the combine kernel), 1,500 rows 6
        // (the last block's merge), 300 rows one block
        {3, 9, 128, 32, 70000, {70000, 1500, 300}, 1.0f, 0},
        // short sequences (over a cluster of 8 blocks under
        // HYLO_MLA_CLUSTER=8, each block whole tiles of its sequence's rows,
        // else one block): the SmolLM2 hybrid's MLA layer (H 9, r_kv
        // 48, dr 32: 704 rows fill one ring with either copy) and a
        // Llama-3.2-3B-like one (H 24, r_kv 128, dr 64: 480 rows). 1 to 200
        // rows (1 to 7 tiles) leave blocks without tiles, 256 gives each block
        // one, 704 and 480 fill the ring (3 tiles in all but the last block);
        // one row more takes the slices (in a cluster launch when clusters are
        // on: max_len <= 4096); one batch mixes lengths (an empty sequence among them), a
        // short sequence beside a long one, and a negative scale
        {1, 9, 48, 32, 800, {1}, 1.0f, 0},
        {1, 9, 48, 32, 800, {31}, 1.0f, 0},
        {1, 9, 48, 32, 800, {32}, 1.0f, 0},
        {1, 9, 48, 32, 800, {33}, 1.0f, 0},
        {1, 9, 48, 32, 800, {200}, 1.0f, 0},
        {1, 9, 48, 32, 800, {256}, 1.0f, 0},
        {1, 9, 48, 32, 800, {704}, 1.0f, 0},
        {1, 9, 48, 32, 800, {705}, 1.0f, 0},
        {2, 9, 48, 32, 800, {33, 256}, -1.0f, 0},
        {2, 9, 48, 32, 800, {704, 0}, 1.0f, 0},
        {2, 9, 48, 32, 800, {1, 200}, 1.0f, 500},
        {2, 9, 48, 32, 4000, {3000, 96}, 1.0f, 1000},
        {1, 24, 128, 64, 600, {33}, 1.0f, 0},
        {1, 24, 128, 64, 600, {256}, 1.0f, 0},
        {1, 24, 128, 64, 600, {480}, 1.0f, 0},
        {1, 24, 128, 64, 600, {481}, 1.0f, 0},
        {2, 24, 128, 64, 600, {31, 480}, 1.0f, 0},
        {2, 24, 128, 64, 4096, {200, 4000}, 1.0f, 96},
        // max_len past 4096 (MLA_CLUSTER_MAX_LEN): the same short sequences
        // in one block each, clusters on or not
        {1, 9, 48, 32, 5000, {256}, 1.0f, 4744},
        {2, 24, 128, 64, 5000, {200, 33}, 1.0f, 4800},
        // k_mla_short (max_len <= 4096, MLA_SHORT_MAX): the SmolLM2 hybrid's
        // layer at the power-of-two max_len buckets a recorded step passes
        // (256 .. 4096: clusters of 4 to 16 blocks of ceil(max_len / S) rows
        // each, the rows split by the length: blocks without rows at 1 and
        // 17, the newest row at a block's first or last row), alone and
        // batched with an empty sequence, a negative scale and a sharper
        // softmax (scale x 4); the HyLo-3B layer (H 24, r_kv 128, dr 64) at
        // short lengths
        {1, 9, 48, 32, 4200, {1}, 1.0f, 255},
        {1, 9, 48, 32, 4200, {17}, 1.0f, 239},
        {1, 9, 48, 32, 4200, {255}, 1.0f, 1},
        {1, 9, 48, 32, 4200, {256}, 1.0f, 0},
        {1, 9, 48, 32, 4200, {257}, 1.0f, 255},
        {1, 9, 48, 32, 4200, {1000}, 1.0f, 24},
        {1, 9, 48, 32, 4200, {2048}, 1.0f, 0},
        {1, 9, 48, 32, 4200, {4096}, 1.0f, 0},
        {3, 9, 48, 32, 4200, {0, 1000, 257}, 1.0f, 24},
        {3, 9, 48, 32, 4200, {4096, 0, 17}, 1.0f, 0},
        {3, 9, 48, 32, 4200, {255, 2048, 0}, 1.0f, 0},
        {3, 9, 48, 32, 4200, {2047, 1, 300}, -1.0f, 1},
        {2, 9, 48, 32, 4200, {600, 1500}, 4.0f, 548},
        {8, 9, 48, 32, 4200, {0, 1, 17, 255, 256, 257, 1000, 4095}, 1.0f, 1},
        {1, 24, 128, 64, 1100, {1}, 1.0f, 255},
        {1, 24, 128, 64, 1100, {33}, 1.0f, 223},
        {1, 24, 128, 64, 1100, {256}, 1.0f, 0},
        {1, 24, 128, 64, 1100, {1000}, 1.0f, 24},
        {3, 24, 128, 64, 1100, {0, 700, 129}, 1.0f, 324},
    };
    // q_pe in place in the projected q (a decode step): d_nope 32 (the
    // hybrid's head of 64), k_mla_short and v2
    static const mla_case_t in_q[] = {{3, 9, 48, 32, 4200, {0, 1000, 257}, 1.0f, 24},
                                      {2, 9, 48, 32, 4200, {4096, 33}, 1.0f, 0},
                                      {2, 24, 128, 64, 1100, {1000, 1}, 1.0f, 24},
                                      {1, 9, 48, 32, 9000, {8999}, 1.0f, 0}};
    // (the bench-variants build: HYLO_MLA_SHORT=0 sends max_len <= 4096 to
    // v2 / v1 instead of k_mla_short; the other variants run what they name)
    static const struct {
        const char *dec, *stages, *warps, *merge, *cluster, *shrt;
#ifdef HYLO_BENCH_VARIANTS
    } vars[] = {
        {NULL, NULL, NULL, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL, "0"}, {"1", NULL, NULL, NULL, NULL, "0"},
        {"2", NULL, NULL, NULL, NULL, "0"},   {"3", NULL, NULL, NULL, NULL, "0"},  {"0", "3", NULL, NULL, NULL, "0"},
        {"0", "4", "2", NULL, NULL, "0"},     {"3", "3", NULL, NULL, NULL, "0"},   {"2", "5", "2", NULL, NULL, "0"},
        {"0", NULL, NULL, "1", NULL, "0"},    {"0", NULL, NULL, "2", NULL, "0"},   {"0", "3", NULL, "1", NULL, "0"},
        {"0", NULL, NULL, NULL, "8", "0"},    {"3", NULL, NULL, NULL, "8", "0"}};
#else
    } vars[] = {{NULL, NULL, NULL, NULL, NULL, NULL}};
#endif
    int fails = 0;
    const char *only = getenv("HYLO_MLA_TEST_VARIANTS"); // e.g. "0,1": indices into vars, for a short GPU run
    for (int v = 0; v < (int)(sizeof vars / sizeof vars[0]); v++) {
        if (only && !tu_list_has(only, v)) continue;
        set_knob("HYLO_MLA_DECODE", vars[v].dec);
        set_knob("HYLO_MLA_STAGES", vars[v].stages);
        set_knob("HYLO_MLA_WARPS", vars[v].warps);
        set_knob("HYLO_MLA_MERGE", vars[v].merge);
        set_knob("HYLO_MLA_CLUSTER", vars[v].cluster);
        set_knob("HYLO_MLA_SHORT", vars[v].shrt);
        if (v) // variants only exist in the bench-variants build
            printf("  [HYLO_MLA_DECODE=%s HYLO_MLA_STAGES=%s HYLO_MLA_WARPS=%s HYLO_MLA_MERGE=%s "
                   "HYLO_MLA_CLUSTER=%s HYLO_MLA_SHORT=%s]\n",
                   vars[v].dec, vars[v].stages ? vars[v].stages : "-", vars[v].warps ? vars[v].warps : "-",
                   vars[v].merge ? vars[v].merge : "-", vars[v].cluster ? vars[v].cluster : "-",
                   vars[v].shrt ? vars[v].shrt : "-");
        for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++)
            for (int sep = 0; sep < 2; sep++)
                fails += run_mla(&cases[i], 500 + 11 * i + 1000 * v + 7 * sep, sep, 0); // fresh inputs per variant
    }
    set_knob("HYLO_MLA_DECODE", NULL);
    set_knob("HYLO_MLA_STAGES", NULL);
    set_knob("HYLO_MLA_WARPS", NULL);
    set_knob("HYLO_MLA_MERGE", NULL);
    set_knob("HYLO_MLA_CLUSTER", NULL);
    // q_pe in place in the projected q (a decode step): d_nope 32, and 4 (the
    // copy); production, and in the bench-variants build v2 / v1 for the
    // short ones too (HYLO_MLA_SHORT=0)
    for (int shrt = 0; shrt < (int)(sizeof vars / sizeof vars[0]) && shrt < 2; shrt++) {
        set_knob("HYLO_MLA_SHORT", shrt ? "0" : NULL);
        fails += run_mla(&cases[0], 90001, 0, 32) + run_mla(&cases[4], 90002, 0, 32) + run_mla(&cases[0], 90003, 0, 4);
        for (int i = 0; i < (int)(sizeof in_q / sizeof in_q[0]); i++)
            fails += run_mla(&in_q[i], 90011 + i, i & 1, 32);
    }
    set_knob("HYLO_MLA_SHORT", NULL);
    printf("mla_decode_attn: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// MLA decode, run twice on the same inputs: the outputs must agree bit for bit
// (memcmp). v2 merges in a fixed order: B = 2 at 1,500 and 1,000 rows of a
// 5,000-row context (6 and 4 slices, merged by the last block of each
// sequence; past 4,096 rows, so not k_mla_short), B = 1 at 20,000
// rows (78 slices at H 9, r_kv 128: the combine kernel), and short sequences
// in one block (B = 2 at 576 rows, a whole ring, and 33; B = 1 at 256). In the bench-variants
// build also v1 forced (HYLO_MLA_DECODE=1): it merges its row groups in shared
// memory; at H <= 16 and r_kv <= 128 it has 4 of them per block, whose sums an
// unordered merge could associate differently from run to run (production
// runs v1 only for shapes of more than 11 warps per row group, one row group
// per block). Also checked against the CPU (tolerance as in test_mla_decode).
static void test_mla_decode_deterministic(void **st) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    static const struct {
        int B;
        int32_t len[2];
        int64_t cap;
    } runs[] = {{2, {1500, 1000}, 5000}, {1, {20000, 0}, 20000}, {2, {576, 33}, 576}, {1, {256, 0}, 256}};
    const int H = 9, R = 128, DR = 32, L = R + DR;
    const float scale = 1.0f / sqrtf((float)L);
#ifdef HYLO_BENCH_VARIANTS
    static const char *vars[] = {"1", NULL};
#else
    static const char *vars[] = {NULL};
#endif
    int fails = 0;
    for (int k = 0; k < (int)(sizeof runs / sizeof runs[0]); k++) {
        const int B = runs[k].B, max_len = (int)runs[k].cap;
        const int64_t cap = runs[k].cap;
        const int64_t ncache = (int64_t)B * cap * L, nq = (int64_t)B * H * R, np = (int64_t)B * H * DR;
        float *cache = tu_rnd(ncache, 9001 + k, 1.0f), *ql = tu_rnd(nq, 9002 + k, 1.0f);
        float *qp = tu_rnd(np, 9003 + k, 1.0f), *out_c = malloc(nq * sizeof(float)), *poison = tu_nans(nq);
        void *rows_h[2] = {cache, cache + cap * L};
        cpu->mla_decode_attn(cpu, out_c, ql, qp, H * DR, DR, rows_h, (be_pages_t){0}, runs[k].len, max_len, NULL, 0, B,
                             H, R, DR, scale);
        void *cache_d = tu_dev_act(gpu, cache, ncache), *ql_d = tu_dev_act(gpu, ql, nq);
        void *qp_d = tu_dev_act(gpu, qp, np);
        rows_h[0] = cache_d, rows_h[1] = tu_gat(gpu, cache_d, cap * L);
        void **rows_d = gpu->alloc(gpu, sizeof rows_h);
        assert_non_null(rows_d);
        assert_int_equal(gpu->copy_h2d(gpu, rows_d, rows_h, sizeof(void *) * B), 0);
        int32_t *len_d = tu_dev_i32(gpu, runs[k].len, B);
        const int64_t dims[4] = {1, B, H, R};
        for (int v = 0; v < (int)(sizeof vars / sizeof vars[0]); v++) {
            set_knob("HYLO_MLA_DECODE", vars[v]);
            char label[96];
            snprintf(label, sizeof label, "mla twice B%d H%d r_kv%d len %d%s%s", B, H, R, max_len,
                     vars[v] ? " HYLO_MLA_DECODE=" : "", vars[v] ? vars[v] : "");
            float *got[2];
            for (int r = 0; r < 2; r++) {
                void *out_d = tu_dev_act(gpu, poison, nq);
                gpu->mla_decode_attn(gpu, out_d, ql_d, qp_d, H * DR, DR, rows_d, (be_pages_t){0}, len_d, max_len,
                                     cache_d, B * cap, B, H, R, DR, scale);
                int rc = gpu->sync(gpu);
                if (rc) printf("  %s: mla_decode_attn failed: %s\n", label, err_msg());
                assert_int_equal(rc, 0);
                got[r] = tu_host_act(gpu, out_d, nq);
                gpu->free(gpu, out_d);
            }
            fails += cmp(label, "out", got[0], out_c, nq, dims, "-bHc", 1e-2, 0);
            int same = memcmp(got[0], got[1], (size_t)nq * sizeof(float)) == 0;
            printf("  %-44s run 2 == run 1: %s\n", label, same ? "bitwise equal" : "DIFFERENT  FAIL");
            fails += !same;
            free(got[0]), free(got[1]);
        }
        set_knob("HYLO_MLA_DECODE", NULL);
        gpu->free(gpu, cache_d), gpu->free(gpu, ql_d), gpu->free(gpu, qp_d), gpu->free(gpu, len_d);
        gpu->free(gpu, rows_d);
        free(cache), free(ql), free(qp), free(out_c), free(poison);
    }
    assert_int_equal(fails, 0);
}

// ---- decode over per-sequence caches (attn_decode, kv_append) -------------------
//
// A step's rows as a server makes them: n_runs states, each a buffer of its own
// holding some of the rows' sequences ([n, cap, Hkv, dqk] K, [n, cap, Hkv, dv]
// V, cap the run's longest length + 3), row r in run r % n_runs (rows of one run
// need not be adjacent for the op). Lengths 1..2000 (pseudo-random) with 0, 1,
// 31, 32, 33 and 2000 among them: an empty row (zeros) and lengths around the
// kernel's row groups; or, for the long cases (long_len), long_len - 4,001 r
// for row r: few rows with long caches, which the kernel splits into slices
// (split-K; slice ends fall inside row groups); or the lengths listed in lens
// (row r takes lens[r]). Cache rows at or past a row's length hold NaN: a read
// of any of them poisons that row's output.
// max_pad > 0 passes max_len = the longest length + max_pad, as a recorded
// decode step does (the states' context limit): the slices are sized for rows
// that are not there and many come out empty.
// Every case calls the op twice on fresh NaN outputs: a split call merges in
// the last block of each (row, KV head), found by counters the kernel must
// leave at 0; a counter left over would make the second call skip merges. The
// two outputs must be equal bit for bit (the merges add in a fixed order).
typedef struct {
    int H, Hkv, dh, B, n_runs;
    float qstd;
    int long_len;        // 0: the lengths above
    int q_pad;           // > 0: q rows at stride H dqk + q_pad (q a part of one product's rows)
    int dv;              // 0: dh (dqk = dh always)
    const int32_t *lens; // [B] or NULL
    int max_pad;
} dec_case_t;

typedef struct {
    int n, cap;     // sequences, rows of each
    float *kh, *vh; // host [n, cap, Hkv, dqk] and [n, cap, Hkv, dv]
    void *kd, *vd;  // device copies
} dec_run_t;

static int dec_len(const dec_case_t *c, int r, uint64_t seed) {
    static const int special[6] = {0, 1, 31, 32, 33, 2000};
    if (c->lens) return c->lens[r];
    if (c->long_len) return c->long_len - 4001 * r;
    if (r < 6) return special[(r + (int)seed) % 6];
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    return 1 + (int)(x % 2000);
}

static int run_attn_decode(const dec_case_t *c, uint64_t seed) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int B = c->B, H = c->H, Hkv = c->Hkv, dh = c->dh, dv = c->dv ? c->dv : c->dh, R = c->n_runs;
    const int64_t kw = (int64_t)Hkv * dh, vw = (int64_t)Hkv * dv, nq = (int64_t)B * H * dv;
    const int64_t ldq = (int64_t)H * dh + c->q_pad;
    const float scale = 1.0f / sqrtf((float)dh);
    char label[200];
    int nl = snprintf(label, sizeof label, "attn_decode B%d runs%d H%d Hkv%d dqk%d dv%d%s%s%s", B, R, H, Hkv, dh, dv,
                      c->qstd > 1.5f ? " peaky" : "", c->long_len ? " long" : "", c->q_pad ? " q strided" : "");
    if (c->max_pad) nl += snprintf(label + nl, sizeof label - nl, " max_len+%d", c->max_pad);
    for (int r = 0; c->lens && r < B && nl < (int)sizeof label - 12; r++)
        nl += snprintf(label + nl, sizeof label - nl, "%s%d", r ? " " : " len ", c->lens[r]);
    int32_t *len = malloc(sizeof(int32_t) * B);
    int max_len = 0;
    dec_run_t *runs = calloc((size_t)R, sizeof *runs);
    for (int r = 0; r < B; r++) {
        len[r] = dec_len(c, r, seed);
        max_len = len[r] > max_len ? len[r] : max_len;
        dec_run_t *u = &runs[r % R];
        u->n++;
        u->cap = len[r] + 3 > u->cap ? len[r] + 3 : u->cap;
    }
    max_len += c->max_pad;
    for (int k = 0; k < R; k++) {
        dec_run_t *u = &runs[k];
        u->kh = tu_rnd((int64_t)u->n * u->cap * kw, seed + 10 + 2 * k, 1.0f);
        u->vh = tu_rnd((int64_t)u->n * u->cap * vw, seed + 11 + 2 * k, 1.0f);
    }
    void **kb_h = malloc(sizeof(void *) * B), **vb_h = malloc(sizeof(void *) * B);
    void **kb_d = malloc(sizeof(void *) * B), **vb_d = malloc(sizeof(void *) * B);
    for (int pass = 0; pass < 2; pass++) // 0: poison the rows past each length; 1: upload, pointers
        for (int r = 0; r < B; r++) {
            dec_run_t *u = &runs[r % R];
            const int64_t seq = (int64_t)(r / R) * u->cap; // the sequence's row 0 in the run
            if (pass == 0) {
                for (int64_t i = (seq + len[r]) * kw; i < (seq + u->cap) * kw; i++)
                    u->kh[i] = NAN;
                for (int64_t i = (seq + len[r]) * vw; i < (seq + u->cap) * vw; i++)
                    u->vh[i] = NAN;
                continue;
            }
            if (!u->kd) {
                u->kd = tu_dev_act(gpu, u->kh, (int64_t)u->n * u->cap * kw);
                u->vd = tu_dev_act(gpu, u->vh, (int64_t)u->n * u->cap * vw);
            }
            kb_h[r] = u->kh + seq * kw, vb_h[r] = u->vh + seq * vw;
            kb_d[r] = tu_gat(gpu, u->kd, seq * kw), vb_d[r] = tu_gat(gpu, u->vd, seq * vw);
        }
    float *q = tu_rnd((int64_t)B * ldq, seed + 1, c->qstd), *out_c = malloc(sizeof(float) * nq);
    cpu->attn_decode(cpu, out_c, q, ldq, kb_h, vb_h, (be_pages_t){0}, len, max_len, B, H, Hkv, dh, dv, scale);

    void *q_d = tu_dev_act(gpu, q, (int64_t)B * ldq);
    float *poison = tu_nans(nq);
    void **ptr_d = gpu->alloc(gpu, sizeof(void *) * 2 * B);
    assert_non_null(ptr_d);
    assert_int_equal(gpu->copy_h2d(gpu, ptr_d, kb_d, sizeof(void *) * B), 0);
    assert_int_equal(gpu->copy_h2d(gpu, ptr_d + B, vb_d, sizeof(void *) * B), 0);
    int32_t *len_d = tu_dev_i32(gpu, len, B);
    int fails = 0;
    float *first = NULL;                   // call 1's output
    for (int call = 0; call < 2; call++) { // the second call sees the counters the first one left
        void *out_d = tu_dev_act(gpu, poison, nq);
        gpu->attn_decode(gpu, out_d, q_d, ldq, ptr_d, ptr_d + B, (be_pages_t){0}, len_d, max_len, B, H, Hkv, dh, dv,
                         scale);
        int rc = gpu->sync(gpu);
        if (rc) printf("  %s: attn_decode failed: %s\n", label, err_msg());
        assert_int_equal(rc, 0);
        float *out_g = tu_host_act(gpu, out_d, nq);
        const int64_t dims[4] = {1, B, H, dv};
        char lab[220];
        snprintf(lab, sizeof lab, "%s%s", label, call ? " (call 2)" : "");
        int f = cmp(lab, "out", out_g, out_c, nq, dims, "-rHc", 5e-3, 0);
        for (int r = 0; r < B && f; r++) { // per row, so a failure names the length that broke
            const int64_t off = (int64_t)r * H * dv;
            printf("    row %d (run %d, len %d): rel %.3e\n", r, r % R, len[r],
                   tu_rel_err(out_g + off, out_c + off, (int64_t)H * dv));
        }
        fails += f;
        gpu->free(gpu, out_d);
        if (call == 0) {
            first = out_g;
            continue;
        }
        // the slices merge in a fixed order: the same bits on every call
        if (memcmp(first, out_g, sizeof(float) * nq)) {
            printf("  %s: call 2 differs from call 1  FAIL\n", label);
            fails++;
        }
        free(out_g);
    }
    free(first);
    for (int k = 0; k < R; k++) {
        gpu->free(gpu, runs[k].kd), gpu->free(gpu, runs[k].vd);
        free(runs[k].kh), free(runs[k].vh);
    }
    gpu->free(gpu, q_d), gpu->free(gpu, ptr_d), gpu->free(gpu, len_d);
    free(runs), free(len), free(kb_h), free(vb_h), free(kb_d), free(vb_d), free(q), free(out_c), free(poison);
    return fails;
}

// Head layouts of the teachers (SmolLM2 9/3 x 64, Llama 32/8 x 128, Qwen3 16/8
// x 128), plain MHA, wide groups (6, 8), dh 96 and 256, B up to 64 rows over
// 1 to 7 runs, and a peaky softmax; then one to three long caches (SmolLM2 at
// 30,011 and below, Llama at 12,000 with a peaky softmax, dh 256 at 9,000),
// split into slices; q read at a row stride, as a decode step's one product
// [q | k | v] leaves it. Then B = 1 at lengths 1, 31, 32, 33, 4,096 and 70,000
// for GQA groups 1, 3 and 8 (dh 64 and 128); B = 8 with mixed lengths (0 to
// 70,000) in one call; groups of 10 and 12 (more than the 8 heads a block
// takes: head chunks); dqk 128 with dv 64; dh 36 (not a multiple of 8: the
// scalar loads); a max_len far past every length (a recorded step's context
// limit: empty slices), and a single empty row under such a max_len.
// Then both sides of the one-block threshold (k_attn_decode's short_rows,
// DEC_SHORT_ROUNDS block iterations: 512 rows at dh 64 with 3 heads per KV
// head, 256 at dh 128 with 3, 512 at dh 128 with 4, 128 at dh 128 with 8, 64
// at dh 256 with 8): B = 1 at the threshold and one row past it with max_len
// the length (the host launches one block per pair, or slices), and B = 4 at
// 0, 1, the threshold and one past it in one call under max_len 8192 (the
// kernel picks each pair's path by its length).
static void test_attn_decode(void **st) {
    static const int32_t mixed8[8] = {70000, 0, 1, 31, 32, 33, 4096, 12345};
    static const int32_t mixed8b[8] = {9000, 33, 4096, 0, 1, 2500, 32, 31};
    static const int32_t two[2] = {100, 3000}, empty[1] = {0};
    static const dec_case_t cases[] = {
        {9, 3, 64, 64, 5, 1.0f, 0, 0, 0, NULL, 0},      {32, 8, 128, 24, 4, 1.0f, 0, 0, 0, NULL, 0},
        {16, 8, 128, 33, 3, 1.0f, 0, 0, 0, NULL, 0},    {4, 4, 64, 7, 7, 1.0f, 0, 0, 0, NULL, 0},
        {12, 2, 128, 20, 2, 3.0f, 0, 0, 0, NULL, 0},    {8, 1, 256, 6, 1, 1.0f, 0, 0, 0, NULL, 0},
        {6, 2, 96, 10, 2, 1.0f, 0, 0, 0, NULL, 0},      {9, 3, 64, 1, 1, 3.0f, 0, 0, 0, NULL, 0},
        {9, 3, 64, 3, 2, 1.0f, 30011, 0, 0, NULL, 0},   {32, 8, 128, 1, 1, 3.0f, 12000, 0, 0, NULL, 0},
        {8, 1, 256, 2, 1, 1.0f, 9000, 0, 0, NULL, 0},   {9, 3, 64, 16, 3, 1.0f, 0, 2 * 3 * 64, 0, NULL, 0},
        {9, 3, 64, 8, 8, 1.0f, 0, 0, 0, mixed8, 0},     {24, 8, 128, 8, 3, 1.0f, 0, 0, 0, mixed8b, 0},
        {8, 1, 128, 8, 2, 2.0f, 0, 0, 0, mixed8b, 0},   {20, 2, 64, 2, 1, 1.0f, 7001, 0, 0, NULL, 0},
        {24, 2, 128, 3, 3, 1.0f, 0, 0, 0, NULL, 0},     {16, 4, 128, 8, 2, 1.0f, 0, 0, 64, mixed8b, 0},
        {6, 3, 36, 8, 2, 1.0f, 0, 0, 0, mixed8b, 0},    {9, 3, 64, 2, 2, 1.0f, 0, 0, 0, two, 60000},
        {24, 8, 128, 1, 1, 1.0f, 0, 0, 0, empty, 5000},
    };
    // B = 1 over lengths around the row groups and long ones, groups 1, 3, 8
    static const int32_t b1_len[6] = {1, 31, 32, 33, 4096, 70000};
    static const struct { int H, Hkv, dh; } b1_shapes[] = {{4, 4, 64}, {9, 3, 64}, {24, 8, 128}, {8, 1, 128}};
    static const struct {
        int H, Hkv, dh;
        int32_t at[4]; // B = 1: at[2], at[3]; B = 4: all, max_len 8192
    } edge[] = {{9, 3, 64, {0, 1, 512, 513}},
                {24, 8, 128, {0, 1, 256, 257}},
                {32, 8, 128, {0, 1, 512, 513}},
                {8, 1, 128, {0, 1, 128, 129}},
                {8, 1, 256, {0, 1, 64, 65}}};
    int fails = 0;
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++)
        fails += run_attn_decode(&cases[i], 7000 + 31 * i);
    for (int i = 0; i < (int)(sizeof b1_shapes / sizeof b1_shapes[0]); i++)
        for (int k = 0; k < 6; k++) {
            const dec_case_t c = {
                b1_shapes[i].H, b1_shapes[i].Hkv, b1_shapes[i].dh, 1, 1, 1.0f, 0, 0, 0, &b1_len[k], 0};
            fails += run_attn_decode(&c, 8000 + 17 * i + k);
        }
    for (int i = 0; i < (int)(sizeof edge / sizeof edge[0]); i++) {
        for (int k = 2; k < 4; k++) {
            const dec_case_t c = {edge[i].H, edge[i].Hkv, edge[i].dh, 1, 1, 1.0f, 0, 0, 0, &edge[i].at[k], 0};
            fails += run_attn_decode(&c, 8500 + 13 * i + k);
        }
        const dec_case_t c = {edge[i].H, edge[i].Hkv, edge[i].dh,          4, 2, 1.0f, 0, 0,
                              0,         edge[i].at,  8192 - edge[i].at[3]};
        fails += run_attn_decode(&c, 8600 + 13 * i);
    }
    printf("attn_decode: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// kv_append: N rows over 3 runs, each row's new K and V at its own position
// (random, the last row of a cache among them) of its own cache; the attention
// form (K and V caches, v_off 0) and the MLA form (one cache, [c | k_pe] at
// column v_off = r_kv). The whole caches must equal the CPU's bit for bit.
static void test_kv_append(void **st) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    enum { N = 40, R = 3, CAP = 50 };
    static const struct {
        int kw, vw;
        int64_t ld, v_off;
        int one_cache;  // MLA: k_rows = v_rows
        int64_t q_cols; // > 0: k and v are parts of rows [q (q_cols) | k | v], one product's output
    } forms[] = {{3 * 64, 3 * 64, 3 * 64, 0, 0, 0},
                 {128, 32, 160, 128, 1, 0},
                 {512, 64, 576, 512, 1, 0},
                 {3 * 64, 3 * 64, 3 * 64, 0, 0, 9 * 64}};
    int fails = 0;
    for (int f = 0; f < 4; f++) {
        const int kw = forms[f].kw, vw = forms[f].vw;
        const int64_t P = forms[f].q_cols + kw + vw, ldk = forms[f].q_cols ? P : kw, ldv = forms[f].q_cols ? P : vw;
        const int64_t ko = forms[f].q_cols, vo = forms[f].q_cols ? forms[f].q_cols + kw : 0; // k, v in their buffers
        const int64_t ld = forms[f].ld, per = (int64_t)((N + R - 1) / R) * CAP * ld;         // one run's cache
        float *kh[R], *vh[R];
        void *kd[R], *vd[R], *kb_h[N], *vb_h[N], *kb_d[N], *vb_d[N];
        int32_t pos[N];
        for (int k = 0; k < R; k++) {
            kh[k] = tu_rnd(per, 100 + k + 10 * f, 1.0f), vh[k] = tu_rnd(per, 200 + k + 10 * f, 1.0f);
            kd[k] = tu_dev_act(gpu, kh[k], per), vd[k] = tu_dev_act(gpu, vh[k], per);
        }
        for (int r = 0; r < N; r++) {
            int k = r % R;
            int64_t first = (int64_t)(r / R) * CAP * ld;
            pos[r] = r == 0 ? CAP - 1 : dec_len(&(dec_case_t){0}, r, 5 + f) % CAP;
            kb_h[r] = kh[k] + first, kb_d[r] = tu_gat(gpu, kd[k], first);
            vb_h[r] = forms[f].one_cache ? kb_h[r] : vh[k] + first;
            vb_d[r] = forms[f].one_cache ? kb_d[r] : tu_gat(gpu, vd[k], first);
        }
        // k and v: their own buffers, or both one buffer of rows [q | k | v]
        const int64_t nk = forms[f].q_cols ? N * P : (int64_t)N * kw, nv = forms[f].q_cols ? 0 : (int64_t)N * vw;
        float *k = tu_rnd(nk, 300 + f, 1.0f), *v = nv ? tu_rnd(nv, 400 + f, 1.0f) : k;
        cpu->kv_append(cpu, kb_h, vb_h, (be_pages_t){0}, ld, forms[f].v_off, pos, k + ko, ldk, kw, v + vo, ldv, vw, N);
        void *k_d = tu_dev_act(gpu, k, nk), *v_d = nv ? tu_dev_act(gpu, v, nv) : k_d;
        void **ptr_d = gpu->alloc(gpu, sizeof(void *) * 2 * N);
        assert_non_null(ptr_d);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d, kb_d, sizeof kb_d), 0);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d + N, vb_d, sizeof vb_d), 0);
        int32_t *pos_d = tu_dev_i32(gpu, pos, N);
        gpu->kv_append(gpu, ptr_d, ptr_d + N, (be_pages_t){0}, ld, forms[f].v_off, pos_d, tu_gat(gpu, k_d, ko), ldk, kw,
                       tu_gat(gpu, v_d, vo), ldv, vw, N);
        int rc = gpu->sync(gpu);
        if (rc) printf("  kv_append failed: %s\n", err_msg());
        assert_int_equal(rc, 0);
        int bad = 0;
        for (int c = 0; c < R; c++) {
            float *kg = tu_host_act(gpu, kd[c], per), *vg = tu_host_act(gpu, vd[c], per);
            bad += memcmp(kg, kh[c], sizeof(float) * per) != 0;
            bad += memcmp(vg, vh[c], sizeof(float) * per) != 0;
            free(kg), free(vg);
        }
        printf("  kv_append kw %d vw %d ld %lld v_off %lld%s%s: %s\n", kw, vw, (long long)ld, (long long)forms[f].v_off,
               forms[f].one_cache ? " (one cache)" : "", forms[f].q_cols ? " (k, v in rows [q | k | v])" : "",
               bad ? "caches DIFFER  FAIL" : "caches equal");
        fails += bad > 0;
        for (int c = 0; c < R; c++)
            gpu->free(gpu, kd[c]), gpu->free(gpu, vd[c]), free(kh[c]), free(vh[c]);
        gpu->free(gpu, k_d), gpu->free(gpu, ptr_d), gpu->free(gpu, pos_d);
        if (nv) gpu->free(gpu, v_d), free(v);
        free(k);
    }
    assert_int_equal(fails, 0);
}

// ---- paged caches (backend.h be_pages_t: a step's page tables) ------------------
//
// B sequences' caches of lengths len[] in one pool of pages of BE_PAGE_ROWS
// rows, in a shuffled order, with spare pages nobody holds: every pool row
// that is no sequence's row u < len[r] holds NaN (a read of it poisons the
// output). Each row's table has one entry more than it holds (0, as a step's
// tables past what a sequence holds). The reference reads contiguous copies
// of the same rows without tables (rows[r], [len[r] + room, w]).
typedef struct {
    int B, stride, n_pages;
    int32_t *pages; // [B, stride]
    float *pool;    // host [n_pages BE_PAGE_ROWS, w]
    float **rows;   // [B] host contiguous copies
    int64_t w;
} paged_t;

static int64_t pg_row(const paged_t *p, int r, int64_t u) {
    return (int64_t)p->pages[(int64_t)r * p->stride + u / BE_PAGE_ROWS] * BE_PAGE_ROWS + u % BE_PAGE_ROWS;
}

// room: rows past each length its pages must hold too (an append's).
static void paged_make(paged_t *p, int B, const int32_t *len, int room, int64_t w, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->B = B, p->w = w;
    int held[64], total = 0;
    assert_true(B <= 64);
    for (int r = 0; r < B; r++) {
        held[r] = (len[r] + room + BE_PAGE_ROWS - 1) / BE_PAGE_ROWS;
        if (held[r] < 1) held[r] = 1;
        total += held[r];
        if (held[r] + 1 > p->stride) p->stride = held[r] + 1;
    }
    p->n_pages = total + 2;
    int32_t *perm = malloc(sizeof(int32_t) * p->n_pages);
    for (int i = 0; i < p->n_pages; i++)
        perm[i] = i;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = p->n_pages - 1; i > 0; i--) { // Fisher-Yates
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    p->pages = calloc((size_t)B * p->stride, sizeof(int32_t));
    for (int r = 0, k = 0; r < B; r++)
        for (int i = 0; i < held[r]; i++)
            p->pages[(int64_t)r * p->stride + i] = perm[k++];
    free(perm);
    p->pool = tu_nans((int64_t)p->n_pages * BE_PAGE_ROWS * w);
    p->rows = calloc((size_t)B, sizeof *p->rows);
    for (int r = 0; r < B; r++) {
        p->rows[r] = tu_rnd(((int64_t)len[r] + room) * w + 1, seed + 7 * r + 1, 1.0f);
        for (int64_t u = 0; u < len[r]; u++)
            memcpy(p->pool + pg_row(p, r, u) * w, p->rows[r] + u * w, sizeof(float) * w);
    }
}

static void paged_free(paged_t *p) {
    for (int r = 0; r < p->B; r++)
        free(p->rows[r]);
    free(p->rows), free(p->pages), free(p->pool);
}

// attn_decode over a paged pool against the CPU over contiguous copies
// (tolerance as run_attn_decode), lengths around page boundaries and long
// ones (split into slices that end inside pages), max_len the rows' context
// limit as a recorded step passes it; twice, bit for bit the same.
static int run_paged_attn(int H, int Hkv, int dh, int B, const int32_t *len, uint64_t seed) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int64_t kw = (int64_t)Hkv * dh, nq = (int64_t)B * H * dh;
    const float scale = 1.0f / sqrtf((float)dh);
    paged_t pk, pv;
    paged_make(&pk, B, len, 0, kw, seed);
    paged_make(&pv, B, len, 0, kw, seed); // the same page order (seed), other values below
    for (int r = 0; r < B; r++) {
        float *v = tu_rnd((int64_t)len[r] * kw + 1, seed + 100 + r, 1.0f);
        memcpy(pv.rows[r], v, sizeof(float) * len[r] * kw);
        for (int64_t u = 0; u < len[r]; u++)
            memcpy(pv.pool + pg_row(&pv, r, u) * kw, v + u * kw, sizeof(float) * kw);
        free(v);
    }
    const int max_len = (pk.stride - 1) * BE_PAGE_ROWS;
    float *q = tu_rnd(nq, seed + 1, 1.0f), *out_c = malloc(sizeof(float) * nq);
    void **kb_h = malloc(sizeof(void *) * B), **vb_h = malloc(sizeof(void *) * B);
    for (int r = 0; r < B; r++)
        kb_h[r] = pk.rows[r], vb_h[r] = pv.rows[r];
    cpu->attn_decode(cpu, out_c, q, H * dh, kb_h, vb_h, (be_pages_t){0}, len, max_len, B, H, Hkv, dh, dh, scale);
    const int64_t npool = (int64_t)pk.n_pages * BE_PAGE_ROWS * kw;
    void *k_d = tu_dev_act(gpu, pk.pool, npool), *v_d = tu_dev_act(gpu, pv.pool, npool), *q_d = tu_dev_act(gpu, q, nq);
    void **ptr_d = gpu->alloc(gpu, sizeof(void *) * 2 * B);
    assert_non_null(ptr_d);
    for (int r = 0; r < B; r++) // every row's base: the pool
        kb_h[r] = k_d, vb_h[r] = v_d;
    assert_int_equal(gpu->copy_h2d(gpu, ptr_d, kb_h, sizeof(void *) * B), 0);
    assert_int_equal(gpu->copy_h2d(gpu, ptr_d + B, vb_h, sizeof(void *) * B), 0);
    int32_t *pages_d = tu_dev_i32(gpu, pk.pages, (int64_t)B * pk.stride), *len_d = tu_dev_i32(gpu, len, B);
    char label[160];
    int nl = snprintf(label, sizeof label, "paged attn_decode B%d H%d Hkv%d dh%d len", B, H, Hkv, dh);
    for (int r = 0; r < B && nl < (int)sizeof label - 12; r++)
        nl += snprintf(label + nl, sizeof label - nl, " %d", len[r]);
    float *poison = tu_nans(nq), *first = NULL;
    int fails = 0;
    for (int call = 0; call < 2; call++) {
        void *out_d = tu_dev_act(gpu, poison, nq);
        gpu->attn_decode(gpu, out_d, q_d, H * dh, ptr_d, ptr_d + B, (be_pages_t){pages_d, pk.stride}, len_d, max_len, B,
                         H, Hkv, dh, dh, scale);
        int rc = gpu->sync(gpu);
        if (rc) printf("  %s: attn_decode failed: %s\n", label, err_msg());
        assert_int_equal(rc, 0);
        float *out_g = tu_host_act(gpu, out_d, nq);
        gpu->free(gpu, out_d);
        const int64_t dims[4] = {1, B, H, dh};
        fails += cmp(label, "out", out_g, out_c, nq, dims, "-rHc", 5e-3, 0);
        if (call == 0) {
            first = out_g;
        } else {
            if (memcmp(first, out_g, sizeof(float) * nq)) printf("  %s: call 2 differs from call 1  FAIL\n", label);
            fails += memcmp(first, out_g, sizeof(float) * nq) != 0;
            free(out_g);
        }
    }
    free(first), free(poison), free(q), free(out_c), free(kb_h), free(vb_h);
    gpu->free(gpu, k_d), gpu->free(gpu, v_d), gpu->free(gpu, q_d), gpu->free(gpu, ptr_d);
    gpu->free(gpu, pages_d), gpu->free(gpu, len_d);
    paged_free(&pk), paged_free(&pv);
    return fails;
}

// mla_decode_attn over a paged pool (rows [c | k_pe]) against the CPU over
// contiguous copies (tolerance as test_mla_decode): with the pool given (the
// tensor map over it: a tile's row is its page's row) and without it (the
// per-row copies).
static int run_paged_mla(int H, int R, int DR, int B, const int32_t *len, uint64_t seed) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    const int L = R + DR;
    const int64_t nq = (int64_t)B * H * R, np = (int64_t)B * H * DR;
    const float scale = 1.0f / sqrtf((float)L);
    paged_t pc;
    paged_make(&pc, B, len, 0, L, seed);
    const int max_len = (pc.stride - 1) * BE_PAGE_ROWS;
    float *ql = tu_rnd(nq, seed + 2, 1.0f), *qp = tu_rnd(np, seed + 3, 1.0f), *out_c = malloc(sizeof(float) * nq);
    void **rows_h = malloc(sizeof(void *) * B);
    for (int r = 0; r < B; r++)
        rows_h[r] = pc.rows[r];
    cpu->mla_decode_attn(cpu, out_c, ql, qp, H * DR, DR, rows_h, (be_pages_t){0}, len, max_len, NULL, 0, B, H, R, DR,
                         scale);
    const int64_t pool_rows = (int64_t)pc.n_pages * BE_PAGE_ROWS;
    void *pool_d = tu_dev_act(gpu, pc.pool, pool_rows * L), *ql_d = tu_dev_act(gpu, ql, nq);
    void *qp_d = tu_dev_act(gpu, qp, np);
    for (int r = 0; r < B; r++)
        rows_h[r] = pool_d;
    void **rows_d = gpu->alloc(gpu, sizeof(void *) * B);
    assert_non_null(rows_d);
    assert_int_equal(gpu->copy_h2d(gpu, rows_d, rows_h, sizeof(void *) * B), 0);
    int32_t *pages_d = tu_dev_i32(gpu, pc.pages, (int64_t)B * pc.stride), *len_d = tu_dev_i32(gpu, len, B);
    float *poison = tu_nans(nq);
    int fails = 0;
    for (int with_pool = 1; with_pool >= 0; with_pool--) {
        char label[160];
        int nl = snprintf(label, sizeof label, "paged mla B%d H%d r_kv%d dr%d%s len", B, H, R, DR,
                          with_pool ? "" : " (no pool)");
        for (int r = 0; r < B && nl < (int)sizeof label - 12; r++)
            nl += snprintf(label + nl, sizeof label - nl, " %d", len[r]);
        void *out_d = tu_dev_act(gpu, poison, nq);
        gpu->mla_decode_attn(gpu, out_d, ql_d, qp_d, H * DR, DR, rows_d, (be_pages_t){pages_d, pc.stride}, len_d,
                             max_len, with_pool ? pool_d : NULL, with_pool ? pool_rows : 0, B, H, R, DR, scale);
        int rc = gpu->sync(gpu);
        if (rc) printf("  %s: mla_decode_attn failed: %s\n", label, err_msg());
        assert_int_equal(rc, 0);
        float *out_g = tu_host_act(gpu, out_d, nq);
        const int64_t dims[4] = {1, B, H, R};
        fails += cmp(label, "out", out_g, out_c, nq, dims, "-bHc", 1e-2, 0);
        free(out_g);
        gpu->free(gpu, out_d);
    }
    free(poison), free(ql), free(qp), free(out_c), free(rows_h);
    gpu->free(gpu, pool_d), gpu->free(gpu, ql_d), gpu->free(gpu, qp_d), gpu->free(gpu, rows_d);
    gpu->free(gpu, pages_d), gpu->free(gpu, len_d);
    paged_free(&pc);
    return fails;
}

// The appends into a paged pool, each row at position len[r] (the first row
// of a page among them, and the last): kv_append (attention's K and V pools;
// MLA's one pool with the rope key at column r_kv), rope_kv_append and
// mla_rope_append. Each pool after the GPU's op against the CPU's op on the
// same pool and tables: kv_append bit for bit, the rotations within bf16
// rounding (check 1e-2 relative); NaN rows stay NaN (compared as such).
static int run_paged_appends(uint64_t seed) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    enum { N = 6, H = 4, HKV = 2, DH = 64, RKV = 128, DR = 32 };
    static const int32_t pos[N] = {0, 255, 256, 511, 300, 1000};
    const int64_t kw = (int64_t)HKV * DH, L = RKV + DR;
    int fails = 0;
    for (int form = 0; form < 4; form++) { // kv_append attention, kv_append MLA, rope_kv_append, mla_rope_append
        const int mla = form == 1 || form == 3;
        const int64_t w = mla ? L : kw;
        paged_t pk, pv;
        paged_make(&pk, N, pos, 1, w, seed + form);
        paged_make(&pv, N, pos, 1, w, seed + form);
        const int64_t npool = (int64_t)pk.n_pages * BE_PAGE_ROWS * w;
        // inputs apart: q (H heads of DH, or of DR: MLA's q_pe), k and v rows of the cache's width
        const int64_t nqa = (int64_t)N * H * DH, nqm = (int64_t)N * H * DR, nk = (int64_t)N * w;
        float *q = tu_rnd(mla ? nqm : nqa, seed + 10 + form, 1.0f), *k = tu_rnd(nk, seed + 20 + form, 1.0f);
        float *v = tu_rnd(nk, seed + 30 + form, 1.0f);
        float *cs = malloc(sizeof(float) * 1024 * 32), *sn = malloc(sizeof(float) * 1024 * 32);
        for (int i = 0; i < 1024 * 32; i++)
            cs[i] = cosf(0.001f * i), sn[i] = sinf(0.001f * i);
        void *k_d = tu_dev_act(gpu, pk.pool, npool), *v_d = tu_dev_act(gpu, pv.pool, npool);
        void *qd = tu_dev_act(gpu, q, mla ? nqm : nqa), *kd = tu_dev_act(gpu, k, nk), *vd = tu_dev_act(gpu, v, nk);
        float *cs_d = tu_dev_f32(gpu, cs, 1024 * 32), *sn_d = tu_dev_f32(gpu, sn, 1024 * 32);
        void *bases[2 * N];
        for (int r = 0; r < N; r++)
            bases[r] = k_d, bases[N + r] = mla ? k_d : v_d;
        void **ptr_d = gpu->alloc(gpu, sizeof bases);
        assert_non_null(ptr_d);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d, bases, sizeof bases), 0);
        int32_t *pages_d = tu_dev_i32(gpu, pk.pages, (int64_t)N * pk.stride), *pos_d = tu_dev_i32(gpu, pos, N);
        be_pages_t pg_c = {pk.pages, pk.stride}, pg_g = {pages_d, pk.stride};
        for (int r = 0; r < N; r++)
            bases[r] = pk.pool, bases[N + r] = mla ? pk.pool : pv.pool;
        const char *name = form == 0   ? "paged kv_append (K, V)"
                           : form == 1 ? "paged kv_append (MLA)"
                           : form == 2 ? "paged rope_kv_append"
                                       : "paged mla_rope_append";
        if (form < 2) {
            cpu->kv_append(cpu, bases, bases + N, pg_c, w, mla ? RKV : 0, pos, k, w, mla ? RKV : (int)w, v, w,
                           mla ? DR : (int)w, N);
            gpu->kv_append(gpu, ptr_d, ptr_d + N, pg_g, w, mla ? RKV : 0, pos_d, kd, w, mla ? RKV : (int)w, vd, w,
                           mla ? DR : (int)w, N);
        } else if (form == 2) {
            cpu->rope_kv_append(cpu, q, H * DH, k, kw, v, kw, pos, cs, sn, bases, bases + N, pg_c, N, H, HKV, DH);
            gpu->rope_kv_append(gpu, qd, H * DH, kd, kw, vd, kw, pos_d, cs_d, sn_d, ptr_d, ptr_d + N, pg_g, N, H, HKV,
                                DH);
        } else {
            cpu->mla_rope_append(cpu, q, H * DR, DR, k, L, tu_gat(cpu, k, RKV), L, pos, cs, sn, bases, pg_c, N, H, RKV,
                                 DR);
            gpu->mla_rope_append(gpu, qd, H * DR, DR, kd, L, tu_gat(gpu, kd, RKV), L, pos_d, cs_d, sn_d, ptr_d, pg_g, N,
                                 H, RKV, DR);
        }
        int rc = gpu->sync(gpu);
        if (rc) printf("  %s failed: %s\n", name, err_msg());
        assert_int_equal(rc, 0);
        float *kg = tu_host_act(gpu, k_d, npool), *vg = tu_host_act(gpu, v_d, npool);
        int bad = 0;
        // every pool row: NaN where the CPU's is, else equal (kv_append) or close (rotated)
        for (int64_t i = 0; i < npool; i++) {
            for (int which = 0; which < 2; which++) {
                float g = which ? vg[i] : kg[i], c = which ? pv.pool[i] : pk.pool[i];
                if (isnan(c) != isnan(g))
                    bad++;
                else if (!isnan(c) && (form < 2 || which == 1 ? g != c : fabsf(g - c) > 1e-2f * (1.0f + fabsf(c))))
                    bad++;
            }
        }
        printf("  %-44s pools %s\n", name, bad ? "DIFFER  FAIL" : "agree");
        fails += bad > 0;
        free(kg), free(vg), free(q), free(k), free(v), free(cs), free(sn);
        gpu->free(gpu, k_d), gpu->free(gpu, v_d), gpu->free(gpu, qd), gpu->free(gpu, kd), gpu->free(gpu, vd);
        gpu->free(gpu, cs_d), gpu->free(gpu, sn_d), gpu->free(gpu, ptr_d), gpu->free(gpu, pages_d);
        gpu->free(gpu, pos_d);
        paged_free(&pk), paged_free(&pv);
    }
    return fails;
}

// The decode ops through page tables (the server's paged caches): every
// length class of attn_decode (page boundaries, a split long cache, an empty
// row), MLA decode with and without the pool's tensor map, and the appends.
// MLA's short sequences in one block, whose tiles cross page boundaries (704
// rows): the SmolLM2 hybrid's layer (H 9, r_kv 48, dr 32) and a
// Llama-3.2-3B-like one (H 24, r_kv 128, dr 64).
static void test_paged_decode(void **st) {
    static const int32_t lens8[8] = {1, 255, 256, 257, 511, 700, 0, 3000};
    static const int32_t long1[2] = {20000, 513};
    static const int32_t short2[2] = {704, 200}, short1[1] = {256}, llama2[2] = {31, 480};
    static const int32_t hyb3a[3] = {4000, 0, 1000}, hyb3b[3] = {1, 257, 2047}, llama3[3] = {1, 300, 0};
    int fails = 0;
    fails += run_paged_attn(9, 3, 64, 8, lens8, 11);
    fails += run_paged_attn(32, 8, 128, 8, lens8, 12);
    fails += run_paged_attn(9, 3, 64, 2, long1, 13);
    fails += run_paged_attn(4, 4, 32, 8, lens8, 14); // head dim 32: 32 rows a warp reads per iteration
    fails += run_paged_mla(9, 128, 32, 8, lens8, 21);
    fails += run_paged_mla(32, 512, 64, 2, long1, 22);
    fails += run_paged_mla(9, 48, 32, 2, short2, 23);
    fails += run_paged_mla(9, 48, 32, 1, short1, 24);
    fails += run_paged_mla(24, 128, 64, 2, llama2, 25);
    fails += run_paged_mla(9, 48, 32, 3, hyb3a, 26); // max_len 4096 (k_mla_short's: 16 blocks a sequence)
    fails += run_paged_mla(9, 48, 32, 3, hyb3b, 27); // max_len 2048
    fails += run_paged_mla(24, 128, 64, 3, llama3, 28);
    fails += run_paged_appends(31);
    printf("paged decode ops: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// proj_mla_rope_append (k_gemv_mla_rope_append): an MLA step's q_b product
// with its RoPE and the latent cache append in one op, against the CPU's
// (gemm then mla_rope_append, bit for bit: test_decode_ops). x's rows are the
// joint q_a / kv_a product's [cq | c | k_pe] (slack after them), the op
// reading cq, c and k_pe in place as mla_step does. Each row its own sequence
// at its own position (page boundaries among them): caches of their own in
// two buffers, or one pool through page tables (paged_make: pages shuffled,
// NaN where nothing was written). Tolerances:
//  - q, rel 1e-2: the GPU's fp32 sums (another order than BLAS, ~1e-6),
//    rotated in fp32 and rounded to bf16 once (2^-9 relative per element,
//    ~1.1e-3 in L2); expected ~1.2e-3. q's columns are NaN on the GPU
//    before the call (slack columns after each row's H qd must survive), so
//    a column it does not write fails; a pair rotated from the wrong columns
//    or written to another head or row is O(1) off.
//  - caches, element by element: the latent c and every row not appended
//    exact (bf16 copies of bf16 values; NaN where the CPU's is NaN); the
//    rotated k_pe within 2^-8 |cpu| + 1e-5 (the fp32 rotation of the same
//    bf16 values, fma-contracted or not: ~1e-7, then the GPU's bf16 rounding,
//    at most 2^-9 relative; twice that leaves room, while a wrong angle, pair
//    or row is O(1e-1) off).
typedef struct {
    int N, H, dn, dr, rkv;
    int64_t K;
    int paged;
} pmcase_t;

static int proj_mla_case(be_t *gpu, pmcase_t c) {
    be_t *cpu = tu_cpu();
    enum { NPOS = 600, R = 2, MAXN = 16 };
    static const int32_t edges[6] = {255, 256, 511, 0, 599, 77};
    assert_true(c.N <= MAXN);
    const int qd = c.dn + c.dr, half = c.dr / 2, L = c.rkv + c.dr;
    const int64_t pad = c.K % 8 ? 1 : (8 - (c.K + L) % 8) % 8; // 16-byte rows where K allows them
    const int64_t ldx = c.K + L + pad, ldq = (int64_t)c.H * qd + 3, nx = c.N * ldx, nq = c.N * ldq;
    const int64_t nw = (int64_t)c.H * qd * c.K;
    char label[128];
    snprintf(label, sizeof label, "proj_mla_rope_append N%d H%d d_nope%d dr%d r_kv%d K%lld %s", c.N, c.H, c.dn, c.dr,
             c.rkv, (long long)c.K, c.paged ? "paged" : "contiguous");
    float *cs = tu_hbuf((int64_t)NPOS * half), *sn = tu_hbuf((int64_t)NPOS * half);
    for (int p = 0; p < NPOS; p++)
        for (int i = 0; i < half; i++) {
            float ang = (float)p * powf(10000.0f, -(float)i / (float)half);
            cs[p * half + i] = cosf(ang), sn[p * half + i] = sinf(ang);
        }
    int32_t pos[MAXN];
    for (int r = 0; r < c.N; r++)
        pos[r] = edges[r % 6];
    // the caches: R buffers of sequences of NPOS rows, or one page pool
    paged_t pk = {0};
    const int nbuf = c.paged ? 1 : R;
    const int64_t per = c.paged ? 0 : (int64_t)((c.N + R - 1) / R) * NPOS * L;
    float *ch[R];
    void *cd[R], *rows_h[MAXN], *rows_d[MAXN];
    int64_t nbuf_el = per;
    if (c.paged) {
        paged_make(&pk, c.N, pos, 1, L, 4000 + c.N);
        nbuf_el = (int64_t)pk.n_pages * BE_PAGE_ROWS * L;
        ch[0] = pk.pool;
    } else {
        for (int b = 0; b < R; b++)
            ch[b] = tu_rnd(per, 4100 + b, 1.0f);
    }
    for (int b = 0; b < nbuf; b++)
        cd[b] = tu_dev_act(gpu, ch[b], nbuf_el);
    // k_pe of each appended row: compared within the rotation's tolerance, the rest exactly
    char *rot[R];
    for (int b = 0; b < nbuf; b++)
        rot[b] = calloc((size_t)nbuf_el, 1);
    for (int r = 0; r < c.N; r++) {
        const int b = c.paged ? 0 : r % R;
        const int64_t first = c.paged ? 0 : (int64_t)(r / R) * NPOS * L; // the sequence's row 0
        const int64_t row = c.paged ? pg_row(&pk, r, pos[r]) : pos[r];
        rows_h[r] = ch[b] + first, rows_d[r] = tu_gat(gpu, cd[b], first);
        memset(rot[b] + first + row * L + c.rkv, 1, (size_t)c.dr);
    }
    float *x = tu_rnd(nx, 4200, 1.0f), *W = tu_rnd(nw, 4201, 0.05f), *q = tu_rnd(nq, 4202, 1.0f);
    float *qg0 = tu_hdup(q, nq); // the GPU's q before the call: NaN in every column the op writes
    for (int r = 0; r < c.N; r++)
        for (int64_t i = 0; i < (int64_t)c.H * qd; i++)
            qg0[r * ldq + i] = NAN;
    void *xd = tu_dev_act(gpu, x, nx), *Wd = tu_dev_act(gpu, W, nw), *q_d = tu_dev_act(gpu, qg0, nq);
    float *csd = tu_dev_f32(gpu, cs, (int64_t)NPOS * half), *snd = tu_dev_f32(gpu, sn, (int64_t)NPOS * half);
    int32_t *posd = tu_dev_i32(gpu, pos, c.N), *pagesd = c.paged ? tu_dev_i32(gpu, pk.pages, c.N * pk.stride) : NULL;
    void **rowsd = gpu->alloc(gpu, sizeof(void *) * c.N);
    assert_non_null(rowsd);
    assert_int_equal(gpu->copy_h2d(gpu, rowsd, rows_d, sizeof(void *) * c.N), 0);
    const be_pages_t pg_h = {c.paged ? pk.pages : NULL, c.paged ? pk.stride : 0};
    const be_pages_t pg_d = {pagesd, c.paged ? pk.stride : 0};
    cpu->proj_mla_rope_append(cpu, q, ldq, x, ldx, W, x + c.K, ldx, x + c.K + c.rkv, ldx, pos, cs, sn, rows_h, pg_h,
                              c.N, c.K, c.H, qd, c.rkv, c.dr);
    gpu->proj_mla_rope_append(gpu, q_d, ldq, xd, ldx, Wd, tu_gat(gpu, xd, c.K), ldx, tu_gat(gpu, xd, c.K + c.rkv), ldx,
                              posd, csd, snd, rowsd, pg_d, c.N, c.K, c.H, qd, c.rkv, c.dr);
    int fails = !tu_sync(gpu, "proj_mla_rope_append", label);
    if (!fails) {
        float *qg = tu_host_act(gpu, q_d, nq);
        const int64_t dims[4] = {1, 1, c.N, ldq};
        fails += cmp(label, "q", qg, q, nq, dims, "--rc", 1e-2, 0);
        int bad = 0;
        for (int b = 0; b < nbuf; b++) {
            float *cg = tu_host_act(gpu, cd[b], nbuf_el);
            for (int64_t i = 0; i < nbuf_el; i++) {
                const float g = cg[i], e = ch[b][i];
                if (isnan(e) || isnan(g))
                    bad += isnan(e) != isnan(g);
                else if (rot[b][i] ? fabsf(g - e) > 0x1p-8f * fabsf(e) + 1e-5f : g != e)
                    bad++;
            }
            free(cg);
        }
        printf("  %-44s caches %s (%d element(s) off)\n", label, bad ? "DIFFER  FAIL" : "agree", bad);
        fails += bad > 0;
        free(qg);
    }
    for (int b = 0; b < nbuf; b++) {
        free(rot[b]);
        gpu->free(gpu, cd[b]);
        if (!c.paged) free(ch[b]);
    }
    if (c.paged) paged_free(&pk);
    free(cs), free(sn), free(x), free(W), free(q), free(qg0);
    gpu->free(gpu, xd), gpu->free(gpu, Wd), gpu->free(gpu, q_d), gpu->free(gpu, csd), gpu->free(gpu, snd);
    gpu->free(gpu, posd), gpu->free(gpu, rowsd);
    if (pagesd) gpu->free(gpu, pagesd);
    return fails;
}

static void test_proj_mla_rope_append(void **st) {
    be_t *gpu = tu_gpu();
    static const pmcase_t cases[] = {
        {1, 9, 32, 32, 48, 288, 0},   // the SmolLM2 hybrid's layer (r_q 288), one row
        {1, 9, 32, 32, 48, 288, 1},   // the same through page tables
        {3, 9, 32, 32, 48, 288, 1},   // three rows, pages
        {8, 24, 64, 64, 128, 768, 1}, // a HyLo-3B-like layer, eight rows
        {5, 2, 5, 6, 10, 333, 0},     // odd K (one value a lane) and an odd d_nope
        {2, 4, 0, 160, 70, 64, 0},    // no d_nope; dr 160 and r_kv 70: more than a lane pass, a partial one
        {11, 3, 16, 16, 512, 64, 1},  // more than 8 rows: two launches; DeepSeek's r_kv 512
    };
    int fails = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fails += proj_mla_case(gpu, cases[i]);
    printf("proj_mla_rope_append: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

// The arguments of one decode op as a step records them (the lengths from len).
typedef struct {
    int mla, B, H, Hkv, dh, R, DR, max_len;
    float scale;
    void *out;
    const void *q, *q_pe, *pool;
    void *const *ptr; // attention: B K bases then B V bases; MLA: B row bases
    const int32_t *len;
} dec_op_t;

static void dec_op_run(be_t *be, const dec_op_t *o) {
    if (o->mla)
        be->mla_decode_attn(be, o->out, o->q, o->q_pe, (int64_t)o->H * o->DR, o->DR, o->ptr, (be_pages_t){0}, o->len,
                            o->max_len, o->pool, o->pool ? (int64_t)o->B * o->max_len : 0, o->B, o->H, o->R, o->DR,
                            o->scale);
    else
        be->attn_decode(be, o->out, o->q, (int64_t)o->H * o->dh, o->ptr, o->ptr + o->B, (be_pages_t){0}, o->len,
                        o->max_len, o->B, o->H, o->Hkv, o->dh, o->dh, o->scale);
}

// A recorded decode step replays its launches over the lengths the device
// holds at each replay (model.c step_forward): attn_decode (SmolLM2's 9 heads
// over 3 KV heads of 64) and mla_decode_attn (9 heads, r_kv 128, dr 32, the
// sequences in one pool) recorded once into a graph under max_len 20,000,
// then replayed with other lengths uploaded before each replay, so that a
// sequence's path (one block; slices merged by the last block; for MLA, the
// combine kernel) changes between replays of the same launches, and a counter
// left set by one replay would break the next. MLA also under max_len 3,000:
// a sequence goes between a short one in one block (up to 576 rows) and
// slices. Each replay against the CPU at its
// lengths (tolerances as test_attn_decode and test_mla_decode). Every cache
// row up to max_len is valid: a kernel that read past a length would miss
// the reference by ~1e-1. Without graphs (the fake GPU) the same calls run
// one by one.
static void test_decode_graph_replay(void **st) {
    be_t *gpu = tu_gpu(), *cpu = tu_cpu();
    enum { B = 3, STEPS = 5 };
    static const int32_t lens[STEPS][B] = {
        {300, 2000, 20000}, {20000, 0, 577}, {1, 513, 9000}, {0, 20000, 4096}, {300, 2000, 20000}};
    static const int32_t lens_short[STEPS][B] = {
        {300, 2000, 3000}, {3000, 0, 577}, {1, 513, 256}, {0, 3000, 576}, {300, 2000, 3000}};
    static const struct {
        int mla, max_len;
        const int32_t (*lens)[B];
    } runs[] = {{0, 20000, lens}, {1, 20000, lens}, {1, 3000, lens_short}};
    int fails = 0;
    for (int ri = 0; ri < (int)(sizeof runs / sizeof runs[0]); ri++) {
        const int mla = runs[ri].mla, maxlen = runs[ri].max_len;
        const int32_t(*rl)[B] = runs[ri].lens;
        const char *name = mla ? "mla_decode_attn" : "attn_decode";
        dec_op_t o = {.mla = mla, .B = B, .H = 9, .Hkv = 3, .dh = 64, .R = 128, .DR = 32, .max_len = maxlen};
        const int64_t w = mla ? o.R + o.DR : (int64_t)o.Hkv * o.dh; // a cache row (attention: of K, and of V)
        const int64_t nout = (int64_t)B * o.H * (mla ? o.R : o.dh), np = (int64_t)B * o.H * o.DR;
        const int64_t ncache = (int64_t)B * maxlen * w;
        o.scale = 1.0f / sqrtf((float)(mla ? o.R + o.DR : o.dh));
        float *kh = tu_rnd(ncache, 9101 + mla, 1.0f), *vh = mla ? NULL : tu_rnd(ncache, 9102, 1.0f);
        float *q = tu_rnd(nout, 9103 + mla, 1.0f), *qp = tu_rnd(np, 9104, 1.0f); // q: as many as out
        float *out_c = malloc(sizeof(float) * nout), *poison = tu_nans(nout);
        void *kd = tu_dev_act(gpu, kh, ncache), *vd = mla ? NULL : tu_dev_act(gpu, vh, ncache);
        void *qd = tu_dev_act(gpu, q, nout), *qpd = tu_dev_act(gpu, qp, np), *out_d = tu_dev_act(gpu, poison, nout);
        void *ptr_h[2 * B], *ptr_c[2 * B]; // device bases (K then V, or the MLA rows); the CPU's
        for (int b = 0; b < B; b++) {
            ptr_h[b] = tu_gat(gpu, kd, b * maxlen * w), ptr_c[b] = kh + b * maxlen * w;
            ptr_h[B + b] = mla ? NULL : tu_gat(gpu, vd, b * maxlen * w);
            ptr_c[B + b] = mla ? NULL : vh + b * maxlen * w;
        }
        void **ptr_d = gpu->alloc(gpu, sizeof ptr_h);
        assert_non_null(ptr_d);
        assert_int_equal(gpu->copy_h2d(gpu, ptr_d, ptr_h, sizeof ptr_h), 0);
        int32_t *len_d = tu_dev_i32(gpu, rl[0], B);
        o.out = out_d, o.q = qd, o.q_pe = qpd, o.pool = mla ? kd : NULL, o.ptr = ptr_d, o.len = len_d;
        dec_op_run(gpu, &o); // a first call outside the recording (model.c records a step the second time)
        assert_int_equal(gpu->sync(gpu), 0);
        void *g = NULL;
        const int graph = gpu->graph_begin != NULL;
        if (graph) {
            assert_int_equal(gpu->graph_begin(gpu), 0);
            dec_op_run(gpu, &o);
            int rc = gpu->graph_end(gpu, &g);
            if (rc) printf("  recording %s failed: %s\n", name, err_msg());
            assert_int_equal(rc, 0);
        }
        for (int k = 0; k < STEPS; k++) {
            assert_int_equal(gpu->copy_h2d(gpu, len_d, rl[k], sizeof(int32_t) * B), 0);
            tu_upload_act(gpu, out_d, poison, nout);
            if (graph)
                assert_int_equal(gpu->graph_launch(gpu, g), 0);
            else
                dec_op_run(gpu, &o);
            int rc = gpu->sync(gpu);
            if (rc) printf("  %s replay %d failed: %s\n", name, k, err_msg());
            assert_int_equal(rc, 0);
            dec_op_t c = o; // the CPU over the host caches, at this replay's lengths
            c.out = out_c, c.q = q, c.q_pe = qp, c.pool = NULL, c.ptr = ptr_c, c.len = rl[k];
            dec_op_run(cpu, &c);
            float *out_g = tu_host_act(gpu, out_d, nout);
            char label[128];
            snprintf(label, sizeof label, "%s max_len %d %s %d: len %d %d %d", name, maxlen, graph ? "replay" : "call",
                     k, rl[k][0], rl[k][1], rl[k][2]);
            const int64_t dims[4] = {1, B, o.H, mla ? o.R : o.dh};
            fails += cmp(label, "out", out_g, out_c, nout, dims, "-bHc", mla ? 1e-2 : 5e-3, 0);
            free(out_g);
        }
        if (graph) gpu->graph_free(gpu, g);
        gpu->free(gpu, kd), gpu->free(gpu, qd), gpu->free(gpu, qpd), gpu->free(gpu, out_d), gpu->free(gpu, ptr_d);
        gpu->free(gpu, len_d);
        if (vd) gpu->free(gpu, vd);
        free(kh), free(vh), free(q), free(qp), free(out_c), free(poison);
    }
    printf("decode graph replays: %d comparison(s) failed\n", fails);
    assert_int_equal(fails, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn),
        cmocka_unit_test(test_attn_bwd_small_arena),
        cmocka_unit_test(test_attn_bwd_deterministic),
        cmocka_unit_test(test_attn_no_mask_merge),
        cmocka_unit_test(test_attn_merge),
        cmocka_unit_test(test_mla_decode),
        cmocka_unit_test(test_mla_decode_deterministic),
        cmocka_unit_test(test_attn_decode),
        cmocka_unit_test(test_kv_append),
        cmocka_unit_test(test_paged_decode),
        cmocka_unit_test(test_proj_mla_rope_append),
        cmocka_unit_test(test_decode_graph_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
