// The CPU forward of the real default model against Hugging Face transformers:
// tests/fixtures/model/smollm2_ref.json holds, for 3 prompts, transformers'
// top-20 logits at every position and its 32 greedy tokens, computed in
// float32 on the folder `hylo export` wrote (scripts/ref/smollm2_logits.py, run
// on the GPU machine). Same weights (the GGUF's dequantised values), same
// float32 arithmetic in another order: logits agree to ~1e-4.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "model/model.h"
#include "testutil.h"

// |ours - transformers| over the logits (magnitude ~10-30) of SmolLM2: fp32
// rounding in two different summation orders through 30 layers; 5.7e-5 seen
// (transformers 5.17, torch 2.11, CPU). Bound 5e-4; a wrong RoPE pair or norm
// changes logits by O(1).
#define LOGIT_TOL 5e-4

static int *json_ints(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *v = malloc((size_t)(*n ? *n : 1) * sizeof(int));
    for (int i = 0; i < *n; i++)
        v[i] = cJSON_GetArrayItem(arr, i)->valueint;
    return v;
}

static void test_smollm2_against_transformers(void **st) {
    const char *model_path = tu_model_path();
    char *text;
    const char *fx = "tests/fixtures/model/smollm2_ref.json";
    if (fs_read_all(fx, &text, NULL) < 0) {
        fail_msg("%s is missing (committed; regenerate with scripts/gpu/smollm2_ref.sh on the GPU machine)", fx);
    }
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    model_t m;
    assert_int_equal(model_load(&m, model_path, tu_cpu()), 0);
    model_run_t r_m;
    assert_int_equal(model_run_create(&r_m, &m, (size_t)1 << 30), 0);
    const cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
    int np = cJSON_GetArraySize(prompts);
    assert_true(np >= 3);
    double worst = 0;
    for (int p = 0; p < np; p++) {
        const cJSON *pr = cJSON_GetArrayItem(prompts, p);
        int T, ng;
        int32_t *ids = (int32_t *)json_ints(cJSON_GetObjectItem(pr, "ids"), &T);
        int *greedy = json_ints(cJSON_GetObjectItem(pr, "greedy"), &ng);
        const cJSON *top_ids = cJSON_GetObjectItem(pr, "top_ids"), *top_lg = cJSON_GetObjectItem(pr, "top_logits");
        assert_int_equal(cJSON_GetArraySize(top_ids), T);
        float *lg = malloc((size_t)T * m.a.V * sizeof(float));
        assert_int_equal(model_logits_all(&r_m, ids, 1, T, lg), 0);
        double pw = 0;
        for (int t = 0; t < T; t++) {
            const cJSON *ri = cJSON_GetArrayItem(top_ids, t), *rl = cJSON_GetArrayItem(top_lg, t);
            for (int k = 0; k < cJSON_GetArraySize(ri); k++) {
                int id = cJSON_GetArrayItem(ri, k)->valueint;
                double d = fabs(lg[(int64_t)t * m.a.V + id] - cJSON_GetArrayItem(rl, k)->valuedouble);
                if (d > pw) pw = d;
            }
            // our argmax must be transformers' argmax unless the two top logits tie within the tolerance
            int am = 0;
            for (int v = 1; v < m.a.V; v++)
                if (lg[(int64_t)t * m.a.V + v] > lg[(int64_t)t * m.a.V + am]) am = v;
            double l0 = cJSON_GetArrayItem(rl, 0)->valuedouble, l1 = cJSON_GetArrayItem(rl, 1)->valuedouble;
            if (l0 - l1 > 2 * LOGIT_TOL) assert_int_equal(am, cJSON_GetArrayItem(ri, 0)->valueint);
        }
        printf("  prompt %d: %d tokens, max |logit diff| over the top-20 ids %.2e\n", p, T, pw);
        if (pw > worst) worst = pw;
        // 32 greedy tokens through prefill + decode steps, identical to transformers'
        model_state_t s;
        assert_int_equal(model_state_alloc(&m, &s, 1, T + ng + 1), 0);
        float *l = malloc((size_t)m.a.V * sizeof(float));
        assert_int_equal(model_prefill(&r_m, &s, ids, T, 0, l), 0);
        for (int i = 0; i < ng; i++) {
            int am = 0;
            for (int v = 1; v < m.a.V; v++)
                if (l[v] > l[am]) am = v;
            if (am != greedy[i]) printf("  prompt %d: greedy token %d is %d, transformers %d\n", p, i, am, greedy[i]);
            assert_int_equal(am, greedy[i]);
            int32_t id = am;
            assert_int_equal(model_step(&r_m, &s, &id, l), 0);
        }
        model_state_free(&m, &s);
        free(l), free(lg), free(ids), free(greedy);
    }
    printf("  worst |logit diff| %.2e (bound %.0e)\n", worst, LOGIT_TOL);
    assert_true(worst < LOGIT_TOL);
    model_run_free(&r_m);
    model_free(&m);
    cJSON_Delete(root);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_smollm2_against_transformers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
