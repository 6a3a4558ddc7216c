// Stop ids of the generation loop: the tokenizer's end-of-turn ids plus every
// eos id of the model's config, once each, on the real SmolLM2 tokenizer.
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "infer/gen.h"
#include "io/gguf.h"
#include "testutil.h"

static void test_stop_ids(void **st) {
    gguf_t g;
    tok_t t;
    if (gguf_open(&g, tu_model_path()) < 0) fail_msg("gguf_open: %s", err_msg());
    if (tok_load_gguf(&t, &g) < 0) fail_msg("tok_load_gguf: %s", err_msg());
    gguf_close(&g);
    int32_t eot[16], ids[16];
    int n_eot = tok_eot_ids(&t, eot, 16); // SmolLM2: <|im_end|> 2, <|endoftext|> 0
    assert_int_equal(n_eot, 2);

    arch_t a;
    arch_init(&a);
    a.V = 49152;
    // the config's eos repeats the tokenizer's (2), adds 7 and 9, and one id
    // outside the vocabulary that must be dropped
    a.n_eos = 4, a.eos_ids[0] = 2, a.eos_ids[1] = 7, a.eos_ids[2] = 60000, a.eos_ids[3] = 9;
    int n = gen_stop_ids(&t, &a, ids, 16);
    printf("  stop ids:");
    for (int i = 0; i < n; i++)
        printf(" %d", ids[i]);
    printf("\n");
    assert_int_equal(n, 4);
    assert_memory_equal(ids, eot, 2 * sizeof(int32_t));
    assert_int_equal(ids[2], 7);
    assert_int_equal(ids[3], 9);
    // cap respected
    assert_int_equal(gen_stop_ids(&t, &a, ids, 3), 3);
    a.n_eos = 0;
    assert_int_equal(gen_stop_ids(&t, &a, ids, 16), 2);
    tok_free(&t);
}

// gen_run takes the cache for the whole request up front, exactly: a state
// for 4096 tokens (room for MODEL_STATE_CAP0 at first) holds room for the
// prompt and the answer, not the doubled 512 that growing with use gives;
// a second turn adds its own request to what is cached.
static void test_cache_fits_request(void **st_) {
    const layer_kind_t plan[2] = {LAYER_ATTN, LAYER_ATTN};
    arch_t a = tu_tiny_arch(plan, 2, 0, 0);
    model_t m;
    model_run_t r;
    assert_int_equal(model_create(&m, &a, tu_cpu()), 0);
    assert_int_equal(model_run_create(&r, &m, 64u << 20), 0);
    float *w = tu_params(&m.pt, 3, 0.3f);
    memcpy(m.w, w, (size_t)m.pt.total * sizeof(float)); // CPU backend: act == float
    free(w);
    model_state_t st;
    assert_int_equal(model_state_alloc(&m, &st, 1, 4096), 0);
    int32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (i * 7 + 1) % a.V;
    gen_cfg_t c = {.max_new = 40, .sampler = {.top_p = 1}}; // greedy, no stop ids: 40 new tokens
    gen_stats_t gs;
    assert_int_equal(gen_run(&r, &st, ids, 300, &c, NULL, NULL, &gs), 0);
    assert_int_equal(gs.n_new, 40);
    assert_int_equal(st.len, 340);
    assert_int_equal(st.cap, 340);
    assert_int_equal(st.cache_bytes, (size_t)340 * model_cache_bytes_per_token(&m));
    c.max_new = 10;
    assert_int_equal(gen_run(&r, &st, ids, 5, &c, NULL, NULL, &gs), 0);
    assert_int_equal(st.len, 355);
    assert_int_equal(st.cap, 355);
    model_state_free(&m, &st);
    model_run_free(&r);
    model_free(&m);
}

// A tiny hybrid (attention, MLA, GDN, Mamba-2) with random weights on the CPU.
typedef struct {
    arch_t a;
    model_t m;
    model_run_t r;
} tiny_t;

static void tiny_open(tiny_t *t) {
    const layer_kind_t plan[4] = {LAYER_ATTN, LAYER_MLA, LAYER_GDN, LAYER_M2};
    t->a = tu_tiny_arch(plan, 4, 0, 0);
    assert_int_equal(model_create(&t->m, &t->a, tu_cpu()), 0);
    assert_int_equal(model_run_create(&t->r, &t->m, 64u << 20), 0);
    float *w = tu_params(&t->m.pt, 5, 0.5f);
    memcpy(t->m.w, w, (size_t)t->m.pt.total * sizeof(float)); // CPU backend: act == float
    free(w);
}

static void tiny_close(tiny_t *t) {
    model_run_free(&t->r);
    model_free(&t->m);
}

typedef struct {
    int32_t ids[64];
    int n, stop_at; // the callback asks to stop at token stop_at (-1: never)
} got_t;

static int keep_token(void *user, int32_t id) {
    got_t *g = user;
    if (g->n < 64) g->ids[g->n++] = id;
    return g->n == g->stop_at;
}

// The sampling loop's tokens at temperature 0: model_step, then the host's
// argmax of the logits, each token fed back (gen_run before greedy decoding
// ran on the device).
static void reference_tokens(tiny_t *t, const int32_t *prompt, int n_prompt, int n, int32_t *out) {
    model_state_t st;
    assert_int_equal(model_state_alloc(&t->m, &st, 1, 256), 0);
    float *logits = malloc((size_t)t->a.V * sizeof(float));
    assert_int_equal(model_prefill(&t->r, &st, prompt, n_prompt, 0, logits), 0);
    for (int i = 0; i < n; i++) {
        out[i] = sampler_argmax(logits, t->a.V);
        assert_int_equal(model_step(&t->r, &st, &out[i], logits), 0);
    }
    free(logits);
    model_state_free(&t->m, &st);
}

// Greedy gen_run (each token chosen by argmax_rows, the next step queued
// before it is read) gives the sampling loop's tokens; a stop id ends it and
// is fed (stop_fed), a callback's stop feeds the token it stopped at and no
// more, and the state's length says so.
static void test_greedy_on_device(void **st_) {
    tiny_t t;
    tiny_open(&t);
    int32_t prompt[9], ref[24];
    for (int i = 0; i < 9; i++)
        prompt[i] = (i * 13 + 5) % t.a.V;
    reference_tokens(&t, prompt, 9, 24, ref);
    printf("  greedy tokens:");
    for (int i = 0; i < 24; i++)
        printf(" %d", ref[i]);
    printf("\n");

    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 256), 0);
    gen_cfg_t c = {.max_new = 24, .sampler = {.top_p = 1}}; // greedy
    gen_stats_t gs;
    got_t g = {.stop_at = -1};
    if (gen_run(&t.r, &st, prompt, 9, &c, keep_token, &g, &gs) < 0) fail_msg("gen_run: %s", err_msg());
    assert_int_equal(gs.n_new, 24);
    assert_int_equal(g.n, 24);
    assert_memory_equal(g.ids, ref, sizeof ref);
    assert_int_equal(st.len, 9 + 24);
    assert_int_equal(gs.stop_fed, 0);

    // a stop id: the first token whose first occurrence is at index j >= 3
    int j = 3;
    for (;; j++) {
        assert_true(j < 24);
        int seen = 0;
        for (int i = 0; i < j; i++)
            seen |= ref[i] == ref[j];
        if (!seen) break;
    }
    int32_t stop = ref[j];
    c.stop = &stop, c.n_stop = 1;
    model_state_reset(&t.m, &st);
    g = (got_t){.stop_at = -1};
    assert_int_equal(gen_run(&t.r, &st, prompt, 9, &c, keep_token, &g, &gs), 0);
    assert_int_equal(gs.n_new, j);
    assert_int_equal(g.n, j);
    assert_memory_equal(g.ids, ref, (size_t)j * sizeof(int32_t));
    assert_true(gs.stopped && gs.stop_fed && gs.stop_id == stop);
    assert_int_equal(st.len, 9 + j + 1);

    // the callback stops at token 5: fed, nothing after it
    c.n_stop = 0;
    model_state_reset(&t.m, &st);
    g = (got_t){.stop_at = 5};
    assert_int_equal(gen_run(&t.r, &st, prompt, 9, &c, keep_token, &g, &gs), 0);
    assert_int_equal(gs.n_new, 5);
    assert_int_equal(st.len, 9 + 5);
    assert_int_equal(gs.stop_fed, 0);

    // the run took every step it queued: other calls go on
    float *logits = malloc((size_t)t.a.V * sizeof(float));
    assert_int_equal(model_step(&t.r, &st, &ref[0], logits), 0);
    free(logits);
    model_state_free(&t.m, &st);
    tiny_close(&t);
}

// model_greedy_queue's rules: no other call while a step is in flight, at
// most MODEL_GREEDY_AHEAD in flight, NULL ids only after a step of as many
// rows; take with none in flight is refused.
static void test_greedy_rules(void **st_) {
    tiny_t t;
    tiny_open(&t);
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 64), 0);
    int32_t prompt[4] = {1, 2, 3, 4}, id = 7, out;
    float *logits = malloc((size_t)t.a.V * sizeof(float));
    assert_int_equal(model_prefill(&t.r, &st, prompt, 4, 0, logits), 0);
    assert_int_equal(model_greedy_take(&t.r, &out), ERR_INPUT);
    model_state_t *sts[1] = {&st};
    assert_int_equal(model_greedy_queue(&t.r, sts, 1, NULL), ERR_INPUT); // no step before it
    assert_int_equal(model_greedy_queue(&t.r, sts, 1, &id), 0);
    assert_int_equal(model_step(&t.r, &st, &id, logits), ERR_INPUT); // a step in flight
    assert_int_equal(model_prefill(&t.r, &st, prompt, 4, 0, logits), ERR_INPUT);
    assert_int_equal(model_greedy_queue(&t.r, sts, 1, NULL), 0);
    assert_int_equal(model_greedy_queue(&t.r, sts, 1, NULL), ERR_INPUT); // two in flight
    assert_int_equal(st.len, 6);
    int32_t a, b;
    assert_int_equal(model_greedy_take(&t.r, &a), 0);
    assert_int_equal(model_greedy_take(&t.r, &b), 0);
    // the same as the step by step: prompt, 7, then a, fed, gives b
    model_state_t st2;
    assert_int_equal(model_state_alloc(&t.m, &st2, 1, 64), 0);
    assert_int_equal(model_prefill(&t.r, &st2, prompt, 4, 0, logits), 0);
    assert_int_equal(model_step(&t.r, &st2, &id, logits), 0);
    assert_int_equal(sampler_argmax(logits, t.a.V), a);
    assert_int_equal(model_step(&t.r, &st2, &a, logits), 0);
    assert_int_equal(sampler_argmax(logits, t.a.V), b);
    assert_int_equal(model_greedy_drain(&t.r), 0);
    model_state_free(&t.m, &st2);
    model_state_free(&t.m, &st);
    free(logits);
    tiny_close(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stop_ids), cmocka_unit_test(test_cache_fits_request),
                                       cmocka_unit_test(test_greedy_on_device), cmocka_unit_test(test_greedy_rules)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
