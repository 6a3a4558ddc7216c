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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stop_ids), cmocka_unit_test(test_cache_fits_request)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
