// The default model loaded with MODEL_QUANT (matrices kept in the GGUF's
// Q4_1 / Q8_0 blocks) against the same model loaded in fp32 (model_load, the
// path test_smollm2_ref checks against transformers). The weights are the
// same values; products of fewer than 16 rows (decode steps, short prompts)
// round their input activations to 8 bits, longer ones dequantise the matrix
// and are exact up to fp32 order (cpu_quant.c). So the next-token
// distributions must stay close, not equal. Checked for the all-positions
// forward and for prefill + decode steps (any fp32 difference may flip an
// 8-bit rounding further on, so the steps are held to the same bounds against
// fp32, not to equality with the all-positions forward):
//   - mean KL(p_f32 || p_quant) over the fixture's prompts' positions below
//     KL_MEAN_TOL and every position below KL_MAX_TOL;
//   - the same top-1 token wherever fp32's best logit leads the second by
//     more than MARGIN (a near-tie may flip under any rounding change), and
//     at 85% of all positions at least (95-100% seen: the flips are
//     near-ties).
// Also: the quantised matrices take at most the file's size, not fp32's; and
// sequences decoded together in one step are bitwise as decoded alone.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fs.h"
#include "io/gguf.h"
#include "model/model.h"
#include "testutil.h"

// Measured over the fixture's 3 prompts (97 positions; 53 decoded): mean KL
// 1.5e-4 (all positions) and 2.4e-3 (steps) nats, max 6.8e-3 and 1.4e-2; with
// every product on 8-bit activations (before the sgemm path) 4.5e-3 / 2.1e-2.
// Bounds about 3x the latter: 8-bit activations are ~0.4% relative noise per
// product through 30 layers, while a wrong block layout, scale or row order
// gives KL of O(1) (the text becomes noise).
#define KL_MEAN_TOL 1.5e-2
#define KL_MAX_TOL 1e-1
// Logit margin (the logits are ~10-30) beyond which the top-1 must agree: the
// top-1 logit moved by at most 1.1 in those runs (any logit by 3, in the
// unlikely tail); top-1 and runner-up moving 1.25 apart each way is beyond
// anything seen.
#define MARGIN 2.5

static int *json_ints(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *v = malloc((size_t)(*n ? *n : 1) * sizeof(int));
    for (int i = 0; i < *n; i++)
        v[i] = cJSON_GetArrayItem(arr, i)->valueint;
    return v;
}

// KL(p || q) of two logit rows, in nats.
static double kl_logits(const float *lp, const float *lq, int V) {
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
    for (int v = 0; v < V; v++)
        mp = fmax(mp, lp[v]), mq = fmax(mq, lq[v]);
    for (int v = 0; v < V; v++)
        zp += exp(lp[v] - mp), zq += exp(lq[v] - mq);
    for (int v = 0; v < V; v++) {
        double a = lp[v] - mp - log(zp), b = lq[v] - mq - log(zq);
        kl += exp(a) * (a - b);
    }
    return kl;
}

static int argmax2(const float *l, int V, double *margin) {
    int a = 0, b = -1;
    for (int v = 1; v < V; v++)
        if (l[v] > l[a])
            b = a, a = v;
        else if (b < 0 || l[v] > l[b])
            b = v;
    *margin = l[a] - l[b];
    return a;
}

typedef struct {
    int n_pos, n_margin, agree, same_top1;
    double kl_sum, kl_max, dtop_max;
} agree_t;

// One position: fp32 logits a against quantised logits b.
static void compare(agree_t *g, const float *a, const float *b, int V, const char *what, int pos) {
    double kl = kl_logits(a, b, V), ma, mb;
    g->kl_sum += kl, g->kl_max = fmax(g->kl_max, kl), g->n_pos++;
    int ta = argmax2(a, V, &ma), tb = argmax2(b, V, &mb);
    g->dtop_max = fmax(g->dtop_max, fabs(a[ta] - b[ta]));
    g->same_top1 += ta == tb;
    if (ma > MARGIN) {
        g->n_margin++;
        if (ta == tb)
            g->agree++;
        else
            printf("  %s position %d: top-1 %d (fp32, margin %.2f) vs %d\n", what, pos, ta, ma, tb);
    }
}

static void check(const agree_t *g, const char *what) {
    printf("  %s: %d positions, KL(fp32 || quant) mean %.2e max %.2e nats; top-1 logit moved <= %.3f; same top-1 "
           "at %d positions, at %d of %d with margin > %.1f\n",
           what, g->n_pos, g->kl_sum / g->n_pos, g->kl_max, g->dtop_max, g->same_top1, g->agree, g->n_margin, MARGIN);
    assert_true(g->kl_sum / g->n_pos < KL_MEAN_TOL);
    assert_true(g->kl_max < KL_MAX_TOL);
    assert_int_equal(g->agree, g->n_margin);
    assert_true(g->n_margin >= g->n_pos / 8); // the check above must have had something to check
    assert_true(g->same_top1 >= 0.85 * g->n_pos);
}

static void test_quant_against_f32(void **st) {
    const char *path = tu_model_path();
    char *text;
    assert_int_equal(fs_read_all("tests/fixtures/model/smollm2_ref.json", &text, NULL), 0);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    model_t mf, mq;
    model_run_t rf, rq;
    assert_int_equal(model_load(&mf, path, tu_cpu()), 0);
    assert_int_equal(model_load_ex(&mq, path, tu_cpu(), MODEL_QUANT), 0);
    assert_int_equal(model_run_create(&rf, &mf, (size_t)1 << 30), 0);
    assert_int_equal(model_run_create(&rq, &mq, (size_t)1 << 30), 0);
    // every projection, the MLPs and the tied embedding / head: 30 x 7 + 1
    assert_int_equal(mq.n_qw, 30 * 7 + 1);
    size_t qbytes = 0, fsize;
    for (int i = 0; i < mq.n_qw; i++)
        qbytes += (size_t)mq.qw[i].rows * mq.qw[i].row_bytes;
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    fsize = (size_t)sb.st_size;
    printf("  quantised matrices %.1f MB, file %.1f MB, fp32 weights %.1f MB\n", qbytes / 1e6, fsize / 1e6,
           ptable_count(&mf.pt) * 4 / 1e6);
    assert_true(qbytes <= fsize);
    int V = mf.a.V;
    agree_t all = {0}, steps = {0};
    const cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
    for (int p = 0; p < cJSON_GetArraySize(prompts); p++) {
        int T;
        int32_t *ids = (int32_t *)json_ints(cJSON_GetObjectItem(cJSON_GetArrayItem(prompts, p), "ids"), &T);
        float *lf = malloc((size_t)T * V * sizeof(float)), *lq = malloc((size_t)T * V * sizeof(float));
        assert_int_equal(model_logits_all(&rf, ids, 1, T, lf), 0);
        assert_int_equal(model_logits_all(&rq, ids, 1, T, lq), 0);
        for (int t = 0; t < T; t++)
            compare(&all, lf + (int64_t)t * V, lq + (int64_t)t * V, V, "all positions", t);
        // prefill of the first half, then one decode step per token
        model_state_t s;
        assert_int_equal(model_state_alloc(&mq, &s, 1, T + 1), 0);
        float *l = malloc((size_t)V * sizeof(float));
        int h = T / 2;
        assert_int_equal(model_prefill(&rq, &s, ids, h, 0, l), 0);
        for (int t = h; t <= T; t++) {
            compare(&steps, lf + (int64_t)(t - 1) * V, l, V, "decode steps", t - 1);
            if (t < T) assert_int_equal(model_step(&rq, &s, &ids[t], l), 0);
        }
        model_state_free(&mq, &s);
        free(l), free(lf), free(lq), free(ids);
    }
    check(&all, "all positions");
    check(&steps, "prefill + decode steps");
    model_run_free(&rf), model_run_free(&rq);
    model_free(&mf), model_free(&mq);
    cJSON_Delete(root);
    free(text);
}

// A bf16 hybrid checkpoint (`hylo convert --dtype bf16`: MLA + GDN layers,
// from the default model) loaded with MODEL_QUANT keeps its projections in
// bf16 (every *_proj but MLA's kv_b, and the embedding / tied head) and
// multiplies them with fp32 activations: the same values as the fp32 load,
// summed in another order. Both run the same prefill + decode steps, so the
// logits differ by fp32 rounding only, amplified through 30 untrained hybrid
// layers: 4.3e-3 measured on logits up to 32 (1.3e-4 relative); bound 2e-2,
// where a wrong row, type or stride moves logits by O(1).
#define BF16_TOL 2e-2
static void test_hybrid_bf16(void **st) {
    char dir[600], args[1400];
    snprintf(dir, sizeof dir, "%s/hybrid_bf16", tu_tmpdir());
    snprintf(args, sizeof args, "convert --teacher %s --out %s --mla-every 3 --linear gdn --dtype bf16",
             tu_model_path(), dir);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    model_t mf, mq;
    model_run_t rf, rq;
    assert_int_equal(model_load(&mf, dir, tu_cpu()), 0);
    assert_int_equal(model_load_ex(&mq, dir, tu_cpu(), MODEL_QUANT), 0);
    int kvb = 0;
    for (int l = 0; l < mq.a.n_layers; l++)
        kvb += mq.a.kind[l] == LAYER_MLA;
    // 10 MLA layers x 4 (q_proj, kv_a, out; kv_b stays fp32) + 20 GDN x 7 (+ g_proj when used: here
    // counted from the table) + 30 MLPs x 3 + the embedding: at least that many, all bf16
    assert_true(mq.n_qw >= kvb * 3 + (mq.a.n_layers - kvb) * 6 + mq.a.n_layers * 3 + 1);
    for (int i = 0; i < mq.n_qw; i++)
        assert_int_equal(mq.qw[i].type, GGML_BF16);
    assert_int_equal(model_run_create(&rf, &mf, (size_t)1 << 28), 0);
    assert_int_equal(model_run_create(&rq, &mq, (size_t)1 << 28), 0);
    int T = 20, V = mf.a.V;
    int32_t ids[20];
    for (int t = 0; t < T; t++)
        ids[t] = (t * 7919 + 13) % V;
    // both loads: a prefill of 4 tokens (the bf16 kernels: fewer than 16 rows), then decode steps
    float *lf = malloc((size_t)V * sizeof(float)), *lq = malloc((size_t)V * sizeof(float));
    model_state_t sf, sq;
    assert_int_equal(model_state_alloc(&mf, &sf, 1, T + 1), 0);
    assert_int_equal(model_state_alloc(&mq, &sq, 1, T + 1), 0);
    assert_int_equal(model_prefill(&rf, &sf, ids, 4, 0, lf), 0);
    assert_int_equal(model_prefill(&rq, &sq, ids, 4, 0, lq), 0);
    double worst = 0, big = 0;
    for (int t = 4; t <= T; t++) {
        for (int v = 0; v < V; v++)
            worst = fmax(worst, fabs(lq[v] - lf[v])), big = fmax(big, fabs(lf[v]));
        if (t < T) {
            assert_int_equal(model_step(&rf, &sf, &ids[t], lf), 0);
            assert_int_equal(model_step(&rq, &sq, &ids[t], lq), 0);
        }
    }
    printf("  bf16 hybrid: %d matrices kept in bf16; decode logits (max |logit| %.1f) vs the fp32 load: max |diff| "
           "%.2e\n",
           mq.n_qw, big, worst);
    assert_true(worst < BF16_TOL);
    model_state_free(&mf, &sf), model_state_free(&mq, &sq);
    free(lf), free(lq);
    model_run_free(&rf), model_run_free(&rq);
    model_free(&mf), model_free(&mq);
}

// `hylo export --quantize q8_0` stores the teacher's projections and
// embedding as Q8_0 blocks (U8 tensors + the format in the metadata). Read
// back dequantised (the fp32 load) it must stay close to the GGUF: the GGUF's
// Q4_1 values re-rounded to 8 bits, half a step of max|w| / 127 per block,
// measured 1.4e-3 nats mean KL on hylo compare's essays; here over 24
// arbitrary tokens (flat distributions: 3.0e-3 mean, same top-1 at 22 of 24)
// bound 1e-2 mean and the same top-1 at 80% of positions (4-bit or wrongly
// laid out blocks give KL of O(0.1-1): re-rounding to Q4_0 gives 0.39). A
// MODEL_QUANT load keeps all 211 matrices as Q8_0 and decodes the same tokens.
static void test_export_quantised(void **st) {
    char dir[600], args[1400];
    snprintf(dir, sizeof dir, "%s/teacher_q8", tu_tmpdir());
    snprintf(args, sizeof args, "export %s --out %s --quantize q8_0", tu_model_path(), dir);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    model_t mg, mf, mq;
    model_run_t rg, rf;
    assert_int_equal(model_load(&mg, tu_model_path(), tu_cpu()), 0);
    assert_int_equal(model_load(&mf, dir, tu_cpu()), 0);
    assert_int_equal(model_load_ex(&mq, dir, tu_cpu(), MODEL_QUANT), 0);
    assert_int_equal(mq.n_qw, 30 * 7 + 1);
    for (int i = 0; i < mq.n_qw; i++)
        assert_int_equal(mq.qw[i].type, GGML_Q8_0);
    assert_int_equal(model_run_create(&rg, &mg, (size_t)1 << 28), 0);
    assert_int_equal(model_run_create(&rf, &mf, (size_t)1 << 28), 0);
    int T = 24, V = mg.a.V;
    int32_t ids[24];
    for (int t = 0; t < T; t++)
        ids[t] = (t * 7919 + 13) % V;
    float *lg = malloc((size_t)T * V * sizeof(float)), *lf = malloc((size_t)T * V * sizeof(float));
    assert_int_equal(model_logits_all(&rg, ids, 1, T, lg), 0);
    assert_int_equal(model_logits_all(&rf, ids, 1, T, lf), 0);
    agree_t g = {0};
    for (int t = 0; t < T; t++)
        compare(&g, lg + (int64_t)t * V, lf + (int64_t)t * V, V, "Q8_0 checkpoint", t);
    printf("  Q8_0 checkpoint vs the GGUF: KL mean %.2e max %.2e nats, same top-1 at %d of %d positions\n",
           g.kl_sum / g.n_pos, g.kl_max, g.same_top1, g.n_pos);
    assert_true(g.kl_sum / g.n_pos < 1e-2);
    assert_true(g.same_top1 >= 0.8 * g.n_pos);
    // the kept blocks run: greedy tokens of the MODEL_QUANT load equal the dequantised load's where clear
    model_run_t rq;
    model_state_t sq;
    assert_int_equal(model_run_create(&rq, &mq, (size_t)1 << 28), 0);
    assert_int_equal(model_state_alloc(&mq, &sq, 1, T + 1), 0);
    float *l = malloc((size_t)V * sizeof(float));
    assert_int_equal(model_prefill(&rq, &sq, ids, T, 0, l), 0);
    agree_t g2 = {0};
    compare(&g2, lf + (int64_t)(T - 1) * V, l, V, "Q8_0 checkpoint kept as blocks", T - 1);
    assert_true(g2.kl_max < KL_MAX_TOL);
    free(l), free(lg), free(lf);
    model_state_free(&mq, &sq);
    model_run_free(&rg), model_run_free(&rf), model_run_free(&rq);
    model_free(&mg), model_free(&mf), model_free(&mq);
}

// The serving path: the default model on its quantised weights, three
// sequences of different prompt lengths decoded in one batch
// (model_step_batch) get bitwise the logits each gets decoded alone. Every
// product of a step of fewer than 16 rows treats each row by itself
// (test_quant_ops test_rows_independent) and attention runs per sequence, so
// nothing mixes rows; a server's answers then never depend on what runs
// beside them.
static void test_batch_decode_bitwise(void **st) {
    model_t m;
    model_run_t r;
    assert_int_equal(model_load_ex(&m, tu_model_path(), tu_cpu(), MODEL_QUANT), 0);
    assert_int_equal(model_run_create(&r, &m, (size_t)1 << 28), 0);
    enum { NS = 3, STEPS = 5 };
    const int P[NS] = {3, 11, 6};
    int V = m.a.V;
    float *alone = malloc((size_t)NS * STEPS * V * sizeof(float)), *lg = malloc((size_t)NS * V * sizeof(float));
    model_state_t sts[NS], *in[NS];
    int32_t prompt[16], ids[NS];
    for (int pass = 0; pass < 2; pass++) { // 0: each alone, 1: together
        for (int s = 0; s < NS; s++) {
            for (int t = 0; t < P[s]; t++)
                prompt[t] = (int32_t)((s * 977 + t * 131 + 17) % V);
            assert_int_equal(model_state_alloc(&m, &sts[s], 1, 64), 0);
            assert_int_equal(model_prefill(&r, &sts[s], prompt, P[s], 0, lg), 0);
            in[s] = &sts[s];
        }
        for (int k = 0; k < STEPS; k++) {
            for (int s = 0; s < NS; s++)
                ids[s] = (int32_t)((s * 389 + k * 71 + 5) % V);
            if (pass == 0) {
                for (int s = 0; s < NS; s++)
                    assert_int_equal(model_step(&r, &sts[s], &ids[s], alone + ((int64_t)s * STEPS + k) * V), 0);
                continue;
            }
            assert_int_equal(model_step_batch(&r, in, NS, ids, lg), 0);
            for (int s = 0; s < NS; s++)
                if (memcmp(lg + (int64_t)s * V, alone + ((int64_t)s * STEPS + k) * V, (size_t)V * sizeof(float)))
                    fail_msg("step %d: sequence %d (prompt of %d) differs from its decode alone", k, s, P[s]);
        }
        for (int s = 0; s < NS; s++)
            model_state_free(&m, &sts[s]);
    }
    free(alone), free(lg);
    model_run_free(&r);
    model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_quant_against_f32), cmocka_unit_test(test_hybrid_bf16),
                                       cmocka_unit_test(test_export_quantised),
                                       cmocka_unit_test(test_batch_decode_bitwise)};
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
