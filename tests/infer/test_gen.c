// Stop ids of the generation loop: the tokenizer's end-of-turn ids plus every
// eos id of the model's config, once each, on the real SmolLM2 tokenizer.
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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stop_ids)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
