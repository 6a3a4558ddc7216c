// The adapter to the model (ev_model.c) on the default SmolLM2: the batched
// log-likelihood (several continuations of one context, right-padded, and
// left-truncated to the model length) agrees with the per-window
// log-probabilities of the same tokens, one sequence at a time; the greedy
// flags agree with the argmax; generation stops at a stop string and cuts it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "eval/ev_lmeval.h"
#include "eval/ev_model.h"
#include "io/gguf.h"
#include "testutil.h"

static model_t g_m;
static model_run_t g_run; // the test's own run for its direct model_logits_all reference
static tok_t g_tok;

static int setup(void **st) {
    const char *p = getenv("HYLO_MODEL");
    if (!p) return 0; // the tests skip themselves
    if (model_load(&g_m, p, tu_cpu()) < 0 || model_run_create(&g_run, &g_m, (size_t)1 << 30) < 0) return -1;
    gguf_t g;
    if (gguf_open(&g, p) < 0) return -1;
    int rc = tok_load_gguf(&g_tok, &g);
    gguf_close(&g);
    return rc < 0 ? -1 : 0;
}

static int teardown(void **st) {
    model_run_free(&g_run);
    if (g_m.be) model_free(&g_m), tok_free(&g_tok);
    return 0;
}

static int32_t *enc(const char *s, int *n) {
    int32_t *ids;
    if (tok_encode_ex(&g_tok, s, strlen(s), TOK_SPECIAL, &ids, n) < 0) fail_msg("%s", err_msg());
    return ids;
}

// ll of cont after ctx, from one window over (ctx + cont)[-(L + 1):]
static double window_ll(ev_lm_t *lm, const int32_t *ctx, int nc, const int32_t *cont, int nk) {
    int n = nc + nk, s = n - (lm->max_len + 1) > 0 ? n - (lm->max_len + 1) : 0;
    int32_t *all = malloc((size_t)n * sizeof *all);
    double *lp = malloc((size_t)n * sizeof *lp);
    memcpy(all, ctx, (size_t)nc * sizeof *all);
    memcpy(all + nc, cont, (size_t)nk * sizeof *all);
    if (lm->window(lm, all + s, n - s, n - s - nk, lp) < 0) fail_msg("%s", err_msg());
    double ll = 0;
    for (int i = n - s - nk; i < n - s; i++)
        ll += lp[i];
    free(all), free(lp);
    return ll;
}

static void test_loglik_matches_windows(void **st) {
    tu_model_path();
    int lens[2] = {8192, 9}; // the model's own length, and one that left-truncates every request
    for (int li = 0; li < 2; li++) {
        ev_lm_t lm;
        assert_int_equal(ev_model_wrap(&lm, &g_m, &g_tok, lens[li], 64), 0);
        int nc, nk[3];
        int32_t *ctx = enc("Question: Which gas do plants take in from the air?\nAnswer:", &nc);
        int32_t *c[3] = {enc(" Carbon dioxide", &nk[0]), enc(" Oxygen gas that animals breathe out", &nk[1]),
                         enc(" N", &nk[2])};
        ev_span_t sp[3] = {{c[0], nk[0]}, {c[1], nk[1]}, {c[2], nk[2]}};
        ev_ll_t out[3];
        assert_int_equal(lm.loglik(&lm, ctx, nc, sp, 3, out), 0);
        for (int i = 0; i < 3; i++) {
            double w = window_ll(&lm, ctx, nc, c[i], nk[i]);
            printf("  L=%d choice %d: batched %.6f, window %.6f\n", lens[li], i, out[i].ll, w);
            // tolerance: the same fp32 forward in another batch shape (3 padded
            // sequences vs 1); BLAS blocking changes the fp32 sums at ~1e-6
            // relative, which moves a log-probability by ~1e-4 at most
            assert_true(fabs(out[i].ll - w) < 1e-3 * (1 + fabs(w)));
        }
        // one-token continuations take the single pass over the context
        int32_t one[2] = {c[0][0], c[1][0]};
        ev_span_t s1[2] = {{&one[0], 1}, {&one[1], 1}};
        assert_int_equal(lm.loglik(&lm, ctx, nc, s1, 2, out), 0);
        for (int i = 0; i < 2; i++)
            assert_true(fabs(out[i].ll - window_ll(&lm, ctx, nc, &one[i], 1)) < 1e-3 * (1 + fabs(out[i].ll)));
        // greedy: a continuation made of the model's own argmax tokens is greedy
        int32_t g[4];
        int ng = 0;
        int32_t *seq = malloc(((size_t)nc + 4) * sizeof *seq);
        memcpy(seq, ctx, (size_t)nc * sizeof *seq);
        float *lg = malloc((size_t)(nc + 4) * g_m.a.V * sizeof(float));
        for (; ng < 3; ng++) { // argmax continuation, one token at a time
            int T = nc + ng, s = T > lm.max_len ? T - lm.max_len : 0;
            assert_int_equal(model_logits_all(&g_run, seq + s, 1, T - s, lg), 0);
            const float *row = lg + (int64_t)(T - s - 1) * g_m.a.V;
            int am = 0;
            for (int v = 1; v < g_m.a.V; v++)
                if (row[v] > row[am]) am = v;
            g[ng] = seq[T] = am;
        }
        ev_span_t sg[2] = {{g, ng}, {c[1], nk[1]}};
        assert_int_equal(lm.loglik(&lm, ctx, nc, sg, 2, out), 0);
        assert_int_equal(out[0].greedy, 1);
        assert_int_equal(out[1].greedy, 0); // a long unlikely answer is not the argmax path
        free(seq), free(lg), free(ctx);
        for (int i = 0; i < 3; i++)
            free(c[i]);
        ev_model_unwrap(&lm);
    }
}

// Generation: greedy text, cut at the first stop string; the same text without
// stop strings starts with the cut one.
static void test_generate_stops(void **st) {
    tu_model_path();
    ev_lm_t lm;
    assert_int_equal(ev_model_wrap(&lm, &g_m, &g_tok, 0, 64), 0);
    int n;
    int32_t *p = enc("Count: one, two, three, four, five,", &n);
    ev_gen_t free_run, stopped;
    assert_int_equal(lm.generate(&lm, p, n, 12, NULL, 0, &free_run), 0);
    printf("  free run: '%s' (%d tokens)\n", free_run.text, free_run.n_new);
    assert_true(free_run.n_new >= 1);
    // stop at the first comma it writes
    const char *stops[2] = {"nothing-like-this", ","};
    assert_int_equal(lm.generate(&lm, p, n, 12, stops, 2, &stopped), 0);
    printf("  with stop ',': '%s' (%d tokens)\n", stopped.text, stopped.n_new);
    char *comma = strchr(free_run.text, ',');
    if (comma) {
        assert_int_equal(stopped.stopped, 1);
        assert_int_equal(strlen(stopped.text), (size_t)(comma - free_run.text));
        assert_memory_equal(stopped.text, free_run.text, strlen(stopped.text));
        assert_true(stopped.n_new <= free_run.n_new);
    }
    free(free_run.text), free(stopped.text), free(p);
    ev_model_unwrap(&lm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loglik_matches_windows),
        cmocka_unit_test(test_generate_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
