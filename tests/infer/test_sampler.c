// The sampler against an independent computation of the distribution it must
// draw from: temperature softmax, top-k (ties by token id), top-p (smallest
// prefix reaching the mass), then empirical frequencies of many seeded draws.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "infer/sampler.h"
#include "testutil.h"

#define V 64

static const float *g_logits;
static int by_logit_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_logits[i], y = g_logits[j];
    return x < y ? 1 : x > y ? -1 : i - j;
}

// The target distribution, in double, from the definition.
static void expected(const float *logits, float temp, int top_k, float top_p, double *p) {
    int idx[V];
    for (int v = 0; v < V; v++)
        idx[v] = v;
    g_logits = logits;
    qsort(idx, V, sizeof(int), by_logit_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double w[V], kept = 0;
    for (int i = 0; i < n; i++)
        kept += w[i] = exp(((double)logits[idx[i]] - logits[idx[0]]) / temp);
    if (top_p < 1) {
        double acc = 0;
        for (int i = 0; i < n; i++)
            if ((acc += w[i]) >= top_p * kept) {
                n = i + 1, kept = acc;
                break;
            }
    }
    memset(p, 0, V * sizeof(double));
    for (int i = 0; i < n; i++)
        p[idx[i]] = w[i] / kept;
}

// Draws `draws` tokens and checks every frequency against p within 5 standard
// deviations of a binomial count (seeded, so the outcome is fixed; a wrong
// kept set or a wrong renormalisation moves frequencies by far more); tokens
// with p = 0 must never come.
static void check_frequencies(const float *logits, float temp, int top_k, float top_p) {
    double p[V];
    expected(logits, temp, top_k, top_p, p);
    sampler_t s;
    sampler_cfg_t cfg = {.temperature = temp, .top_k = top_k, .top_p = top_p, .seed = 7};
    assert_int_equal(sampler_init(&s, &cfg, V), 0);
    const int draws = 200000;
    int count[V] = {0};
    for (int i = 0; i < draws; i++) {
        int t = sampler_sample(&s, logits);
        assert_true(t >= 0 && t < V);
        count[t]++;
    }
    int support = 0;
    double worst = 0;
    for (int v = 0; v < V; v++) {
        if (p[v] == 0) {
            if (count[v]) printf("  token %d drawn %d times, outside the kept set\n", v, count[v]);
            assert_int_equal(count[v], 0);
            continue;
        }
        support++;
        double f = (double)count[v] / draws, sd = sqrt(p[v] * (1 - p[v]) / draws);
        double z = fabs(f - p[v]) / fmax(sd, 1.0 / draws); // p = 1 (top-k 1): sd 0
        if (z > worst) worst = z;
    }
    printf("  temp %.2f top-k %d top-p %.2f: %d tokens kept, worst |freq - p| = %.2f sd\n", temp, top_k, top_p, support,
           worst);
    assert_true(worst < 5);
    sampler_free(&s);
}

static void random_logits(float *x, uint64_t seed) { tu_randn(x, V, seed, 2.0f); }

static void test_distributions(void **st) {
    float x[V];
    random_logits(x, 1);
    check_frequencies(x, 1.0f, 0, 1.0f);  // plain softmax
    check_frequencies(x, 0.5f, 0, 1.0f);  // sharper
    check_frequencies(x, 1.0f, 10, 1.0f); // top-k
    check_frequencies(x, 1.0f, 0, 0.6f);  // top-p
    check_frequencies(x, 0.8f, 20, 0.9f); // both
    check_frequencies(x, 1.0f, 1, 1.0f);  // top-k 1 = greedy
    check_frequencies(x, 1.0f, V, 1.0f);  // top-k = V = off
}

// Equal logits across the top-k boundary: the lower token ids are kept.
static void test_ties(void **st) {
    float x[V];
    for (int v = 0; v < V; v++)
        x[v] = (v % 8 == 3) ? 1.0f : -1.0f; // tokens 3, 11, 19, ... tie for first
    double p[V];
    expected(x, 1.0f, 3, 1.0f, p);
    assert_true(p[3] > 0 && p[11] > 0 && p[19] > 0 && p[27] == 0);
    check_frequencies(x, 1.0f, 3, 1.0f);
    check_frequencies(x, 1.0f, 12, 1.0f); // all 8 tied tokens + the 4 lowest others
}

static void test_greedy(void **st) {
    float x[V];
    random_logits(x, 2);
    int best = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;
    x[40] = x[best]; // a tie: the first index wins
    int want = best < 40 ? best : 40;
    assert_int_equal(sampler_argmax(x, V), want);
    sampler_t s;
    sampler_cfg_t cfg = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    assert_int_equal(sampler_init(&s, &cfg, V), 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(sampler_sample(&s, x), want);
    sampler_free(&s);
}

static void draw(uint64_t seed, int *out, int n, const float *x) {
    sampler_t s;
    sampler_cfg_t cfg = {.temperature = 1, .top_k = 0, .top_p = 1, .seed = seed};
    assert_int_equal(sampler_init(&s, &cfg, V), 0);
    for (int i = 0; i < n; i++)
        out[i] = sampler_sample(&s, x);
    sampler_free(&s);
}

static void test_seed(void **st) {
    float x[V];
    random_logits(x, 3);
    int a[100], b[100], c[100];
    draw(5, a, 100, x), draw(5, b, 100, x), draw(6, c, 100, x);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
}

static void test_bad_config(void **st) {
    sampler_cfg_t bad[] = {{.temperature = -1, .top_p = 1},
                           {.temperature = 1, .top_p = 0},
                           {.temperature = 1, .top_p = 1.5f},
                           {.temperature = 1, .top_p = 1, .top_k = -2}};
    const char *flag[] = {"--temp", "--top-p", "--top-p", "--top-k"};
    for (int i = 0; i < 4; i++) {
        sampler_t s;
        assert_int_equal(sampler_init(&s, &bad[i], V), ERR_INPUT);
        printf("  %s\n", err_msg());
        assert_non_null(strstr(err_msg(), flag[i]));
    }
}

// Top-p over a real vocabulary's size (sampler_nucleus, radix selection
// without a sort) against its definition: the probabilities sorted (ties by
// id), the smallest prefix whose mass reaches top_p of the whole. For smooth
// probabilities (random logits) and for ties across the boundary (four
// distinct values, many tokens each, where the lower ids must be kept).
enum { VB = 49152 };
static const float *g_prob;
static int by_prob_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_prob[i], y = g_prob[j];
    return x < y ? 1 : x > y ? -1 : i - j;
}

static void check_nucleus(const float *prob, float top_p) {
    static int order[VB], ids[VB];
    static unsigned char want[VB];
    double total = 0;
    for (int v = 0; v < VB; v++)
        total += prob[v], order[v] = v;
    g_prob = prob;
    qsort(order, VB, sizeof(int), by_prob_desc);
    memset(want, 0, sizeof want);
    double acc = 0;
    int n_want = 0;
    for (int i = 0; i < VB; i++) {
        want[order[i]] = 1, n_want++;
        if ((acc += prob[order[i]]) >= top_p * total) break;
    }
    double mass = -1;
    int n = sampler_nucleus(prob, VB, top_p, ids, &mass);
    printf("  top-p %.3f: %d tokens kept (definition: %d), mass %.6f of %.6f\n", top_p, n, n_want, mass, total);
    assert_int_equal(n, n_want);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        assert_true(want[ids[i]]);
        if (i) assert_true(ids[i] > ids[i - 1]); // id order
        sum += prob[ids[i]];
    }
    assert_true(fabs(sum - mass) <= 1e-9 * total);
}

static void test_nucleus_vocabulary(void **st) {
    static float logits[VB], prob[VB];
    tu_randn(logits, VB, 17, 3.0f);
    float m = logits[sampler_argmax(logits, VB)];
    for (int v = 0; v < VB; v++)
        prob[v] = expf((logits[v] - m) / 0.7f);
    const float ps[] = {0.05f, 0.5f, 0.9f, 0.999f}; // (1 is no top-p: sampler_sample never asks)
    for (int i = 0; i < 4; i++)
        check_nucleus(prob, ps[i]);
    // ties: 1, 1/2, 1/4, 1/8 over ids in turn; the boundary inside a tie group
    for (int v = 0; v < VB; v++)
        prob[v] = ldexpf(1.0f, -(v % 4));
    check_nucleus(prob, 0.3f);
    check_nucleus(prob, 0.6f);
}

// sampler_logprobs against a sort of every id by logit (ties by id) and a
// long-double softmax: the id's log-probability, the top ids in order, their
// log-probabilities; n_top 0, 1, 5, SAMPLER_MAX_TOP and more than asked for.
static void check_logprobs(const float *x, int n_top) {
    int order[V];
    for (int v = 0; v < V; v++)
        order[v] = v;
    g_logits = x;
    qsort(order, V, sizeof order[0], by_logit_desc);
    long double mx = x[order[0]], sum = 0;
    for (int v = 0; v < V; v++)
        sum += expl((long double)x[v] - mx);
    const long double lse = mx + logl(sum);
    sampler_logprob_t lp;
    for (int id = 0; id < V; id += 7) {
        sampler_logprobs(x, V, id, n_top, &lp);
        assert_true(fabsl(lp.logprob - ((long double)x[id] - lse)) < 1e-5);
        int want = n_top < SAMPLER_MAX_TOP ? n_top : SAMPLER_MAX_TOP;
        assert_int_equal(lp.n_top, want);
        for (int j = 0; j < want; j++) {
            assert_int_equal(lp.top_id[j], order[j]);
            assert_true(fabsl(lp.top_lp[j] - ((long double)x[order[j]] - lse)) < 1e-5);
        }
    }
}

static void test_logprobs(void **st) {
    (void)st;
    float x[V];
    uint64_t r = 12345;
    for (int v = 0; v < V; v++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[v] = (float)((r >> 40) % 2000) / 100.0f - 10.0f;
    }
    int ns[] = {0, 1, 5, SAMPLER_MAX_TOP, SAMPLER_MAX_TOP + 3};
    for (int i = 0; i < 5; i++)
        check_logprobs(x, ns[i]);
    for (int v = 0; v < V; v++) // ties across the top-n boundary: 8 ids at the top, 8 next, ...
        x[v] = (float)(v % 8);
    for (int i = 0; i < 5; i++)
        check_logprobs(x, ns[i]);
}

// Penalties on the tokens so far: greedy picks the id that wins after
// logit -= frequency * count + presence * (count > 0), the counts are left at
// zero (the same answer twice); logit biases move the pick; out-of-range
// penalties, biases and bias ids are refused.
static void test_penalties(void **st) {
    (void)st;
    float x[V];
    for (int v = 0; v < V; v++)
        x[v] = -1.0f;
    x[5] = 2.0f, x[6] = 1.0f, x[7] = 0.5f; // 5 leads 6 by 1
    const int32_t prev[] = {5, 9, 5, 6};
    struct {
        float presence, frequency;
        int want;
    } cases[] = {
        {0, 0, 5},     // none
        {0.5f, 0, 5},  // 5 and 6 both lose 0.5
        {0, 0.8f, 7},  // 5: 2 - 1.6 = 0.4, 6: 1 - 0.8 = 0.2, 7: 0.5
        {0, 0.4f, 5},  // 5: 1.2, 6: 0.6
        {2.0f, 0, 7},  // 5: 0, 6: -1, 7: 0.5
        {-1.0f, 0, 5}, // a negative penalty favours them: 5: 3
        {0.2f, -0.5f, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sampler_t s;
        sampler_cfg_t cfg = {.temperature = 0,
                             .top_p = 1,
                             .presence_penalty = cases[i].presence,
                             .frequency_penalty = cases[i].frequency};
        assert_int_equal(sampler_init(&s, &cfg, V), 0);
        assert_int_equal(sampler_sample_after(&s, x, prev, 4), cases[i].want);
        assert_int_equal(sampler_sample_after(&s, x, prev, 4), cases[i].want);
        assert_int_equal(sampler_sample_after(&s, x, prev, 0), 5); // nothing generated yet
        sampler_free(&s);
    }
    // logit biases: +3 on 7 makes it the greedy pick; -100 on 7 and 5 with a
    // frequency penalty of 0.8 leaves 6 (1 - 0.8 = 0.2, above the others' -1.8)
    const int32_t bid[] = {7, 5};
    const float up[] = {3.0f, 0.0f}, down[] = {-100.0f, -100.0f};
    sampler_t b;
    sampler_cfg_t bc = {.temperature = 0, .top_p = 1, .bias_id = bid, .bias = up, .n_bias = 2};
    assert_int_equal(sampler_init(&b, &bc, V), 0);
    assert_int_equal(sampler_sample_after(&b, x, prev, 0), 7);
    sampler_free(&b);
    bc.bias = down, bc.frequency_penalty = 0.8f;
    assert_int_equal(sampler_init(&b, &bc, V), 0);
    assert_int_equal(sampler_sample_after(&b, x, prev, 4), 6);
    sampler_free(&b);
    const int32_t bad_id[] = {V};
    bc = (sampler_cfg_t){.temperature = 0, .top_p = 1, .bias_id = bad_id, .bias = up, .n_bias = 1};
    assert_true(sampler_init(&b, &bc, V) < 0);
    const float too_big[] = {101.0f};
    bc.bias_id = bid, bc.bias = too_big;
    assert_true(sampler_init(&b, &bc, V) < 0);

    sampler_t s;
    sampler_cfg_t bad = {.temperature = 1, .top_p = 1, .frequency_penalty = 2.5f};
    assert_true(sampler_init(&s, &bad, V) < 0);
    bad.frequency_penalty = 0, bad.presence_penalty = NAN;
    assert_true(sampler_init(&s, &bad, V) < 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributions), cmocka_unit_test(test_ties),
        cmocka_unit_test(test_greedy),        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_bad_config),    cmocka_unit_test(test_nucleus_vocabulary),
        cmocka_unit_test(test_logprobs),      cmocka_unit_test(test_penalties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
