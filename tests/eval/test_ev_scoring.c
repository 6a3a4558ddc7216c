// The scorers on hand-made items with known answers: lm-eval's acc / acc_norm
// decisions, WinoGrande partial scoring, the GSM8K answer filters, RULER's
// string match, and perplexity over a model whose distribution is known
// exactly (a bigram table behind the ev_lm_t interface).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/rng.h"
#include "eval/ev_lmeval.h"
#include "eval/ev_ppl.h"
#include "eval/ev_ruler.h"
#include "eval/ev_text.h"
#include "io/gguf.h"
#include "testutil.h"

// ---- a model with a known distribution -------------------------------------------
// log p(cur | prev) from a table over a small vocabulary (ids mod 4), so every
// score has a closed form. It records the longest input it was given.
static double bigram(int32_t prev, int32_t cur) {
    static const double P[4][4] = {
        {0.5, 0.25, 0.125, 0.125}, {0.1, 0.2, 0.3, 0.4}, {0.25, 0.25, 0.25, 0.25}, {0.7, 0.1, 0.1, 0.1}};
    return log(P[prev & 3][cur & 3]);
}

static int fake_max_seen;

static int fake_window(ev_lm_t *lm, const int32_t *ids, int n, int first, double *lp) {
    if (first < 1 || n - 1 > lm->max_len) return err_set(ERR_INPUT, "bad window");
    if (n - 1 > fake_max_seen) fake_max_seen = n - 1;
    for (int i = first; i < n; i++)
        lp[i] = bigram(ids[i - 1], ids[i]);
    return 0;
}

static int fake_loglik(ev_lm_t *lm, const int32_t *ctx, int n_ctx, const ev_span_t *conts, int n, ev_ll_t *out) {
    for (int i = 0; i < n; i++) {
        out[i].ll = 0, out[i].greedy = 1;
        int32_t prev = ctx[n_ctx - 1];
        for (int k = 0; k < conts[i].n; k++)
            out[i].ll += bigram(prev, conts[i].ids[k]), prev = conts[i].ids[k];
    }
    return 0;
}

static ev_lm_t fake_lm(const tok_t *tok, int max_len) {
    ev_lm_t lm = {.tok = tok, .max_len = max_len, .prefix_id = 0, .loglik = fake_loglik, .window = fake_window};
    return lm;
}

static tok_t *smol_tok(void) {
    static tok_t t;
    static int loaded;
    if (!loaded) {
        gguf_t g;
        if (gguf_open(&g, tu_model_path()) < 0) fail_msg("gguf_open: %s", err_msg());
        if (tok_load_gguf(&t, &g) < 0) fail_msg("tok_load_gguf: %s", err_msg());
        gguf_close(&g);
        loaded = 1;
    }
    return &t;
}

// ---- multiple choice ----------------------------------------------------------------

static void test_acc_vs_acc_norm(void **st) {
    // choice 0 has the higher total log-likelihood, choice 1 the higher per
    // character: acc picks 0, acc_norm picks 1
    double ll[2] = {-10, -12};
    int64_t len[2] = {5, 20};
    int p, pn;
    ev_mc_decide(ll, len, 2, &p, &pn);
    assert_int_equal(p, 0);
    assert_int_equal(pn, 1);
    // equal values: the first index, as numpy's argmax
    double tie[3] = {-3, -1, -1};
    int64_t one[3] = {1, 1, 1};
    ev_mc_decide(tie, one, 3, &p, &pn);
    assert_int_equal(p, 1);
    assert_int_equal(pn, 1);
    // lm-eval's stderr: sample std (n - 1) over sqrt(n); for 0,1,1,1 std = 0.5
    double x[4] = {0, 1, 1, 1}, m, se;
    ev_mean_stderr(x, 4, &m, &se);
    assert_true(fabs(m - 0.75) < 1e-15 && fabs(se - 0.25) < 1e-15);
}

// acc_norm divides by code points, not bytes: "naïve" is 5 code points, 6 bytes.
static void test_norm_length_in_code_points(void **st) {
    cJSON *row = cJSON_Parse("{\"query\": \"Question: q?\", \"choices\": [\"na\\u00efve\", \"ab\"], \"gold\": 0}");
    ev_doc_t d = {0};
    assert_int_equal(ev_task_find("arc_easy")->build(row, &d), 0);
    assert_string_equal(d.ctx[0], "Question: q?\nAnswer:");
    assert_string_equal(d.cont[0], " na\xc3\xafve");
    assert_int_equal(d.norm_len[0], 5);
    assert_int_equal(d.norm_len[1], 2);
    ev_doc_free(&d);
    cJSON_Delete(row);
}

// Each task's prompt from a row in the file's layout, as lm-eval writes it.
static void test_prompts(void **st) {
    struct {
        const char *task, *row, *ctx, *cont0;
        int n, gold;
    } c[] = {
        {"piqa",
         "{\"query\": \"Question: How to dry a towel?\\n\", \"choices\": [\"hang it\", \"soak it\"], \"gold\": 0}",
         "Question: How to dry a towel?\nAnswer:", " hang it", 2, 0},
        {"openbookqa", "{\"query\": \"Predators eat\", \"choices\": [\"lions\", \"grass\"], \"gold\": 0}",
         "Predators eat", " lions", 2, 0},
        {"copa",
         "{\"query\": \"The man turned on the faucet, therefore\", \"choices\": [\"The toilet filled.\", \"water "
         "flowed.\"], \"gold\": 1}",
         "The man turned on the faucet therefore", " the toilet filled.", 2, 1},
        {"copa",
         "{\"query\": \"My body cast a shadow, because\", \"choices\": [\"the sun rose.\", \"grass was cut.\"], "
         "\"gold\": 0}",
         "My body cast a shadow because", " the sun rose.", 2, 0},
        {"siqa",
         "{\"query\": \"Context: Tracy left.\\nQuestion: Why?\\nChoices:\\nA. to rest\\nB. to run\\nAnswer:\", "
         "\"choices\": [\"A\", \"B\"], \"gold\": 1}",
         "Q: Tracy left. Why?\nA:", " to rest", 2, 1},
        {"boolq",
         "{\"query\": \"Passage: Line one.\\nQuestion: two\\nQuestion: is it?\", \"choices\": [\"no\", \"yes\"], "
         "\"gold\": 1}",
         "Line one.\nQuestion: two\nQuestion: is it?\nAnswer:", " no", 2, 1},
        {"lambada_openai", "{\"context\": \"He said hello to\", \"continuation\": \"her\"}", "He said hello to", " her",
         1, 0},
        {"gsm8k", "{\"context\": \"What is 2+2?\", \"chain_of_thought\": \"2+2=4\", \"answer\": \"4\"}",
         "Question: What is 2+2?\nAnswer:", NULL, 1, 0},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        cJSON *row = cJSON_Parse(c[i].row);
        assert_non_null(row);
        ev_doc_t d = {0};
        int rc = ev_task_find(c[i].task)->build(row, &d);
        if (rc < 0) fail_msg("%s: %s", c[i].task, err_msg());
        assert_string_equal(d.ctx[0], c[i].ctx);
        if (c[i].cont0) assert_string_equal(d.cont[0], c[i].cont0);
        assert_int_equal(d.n, c[i].n);
        assert_int_equal(d.gold, c[i].gold);
        if (!strcmp(c[i].task, "gsm8k")) assert_string_equal(d.gold_text, "2+2=4\n#### 4");
        ev_doc_free(&d);
        cJSON_Delete(row);
    }
    // a row that does not have the expected layout is an error naming the field
    cJSON *bad = cJSON_Parse("{\"query\": \"no prefix\", \"choices\": [\"a\"], \"gold\": 0}");
    ev_doc_t d = {0};
    assert_int_equal(ev_task_find("arc_easy")->build(bad, &d), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "query"));
    ev_doc_free(&d);
    cJSON_Delete(bad);
    bad = cJSON_Parse("{\"query\": \"Question: x\", \"choices\": [\"a\", \"b\"], \"gold\": 2}");
    assert_int_equal(ev_task_find("arc_easy")->build(bad, &d), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "gold"));
    ev_doc_free(&d);
    cJSON_Delete(bad);
}

// WinoGrande: one context per option, the same continuation scored under each;
// the option words belong to the context and are not scored.
static void test_winogrande_partial(void **st) {
    const tok_t *tok = smol_tok();
    cJSON *row = cJSON_Parse("{\"context_options\": [\"Sarah was a much better surgeon than Maria so Sarah\", "
                             "\"Sarah was a much better surgeon than Maria so Maria\"], \"continuation\": "
                             "\"always got the harder cases.\", \"gold\": 0}");
    ev_doc_t d = {0};
    assert_int_equal(ev_task_find("winogrande")->build(row, &d), 0);
    assert_int_equal(d.n, 2);
    assert_string_equal(d.cont[0], " always got the harder cases.");
    assert_string_equal(d.cont[1], d.cont[0]);
    int32_t *cx[2], *cc[2];
    int ncx[2], ncc[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(ev_encode_pair(tok, TOK_SPECIAL, 0, d.ctx[i], d.cont[i], &cx[i], &ncx[i], &cc[i], &ncc[i]), 0);
    assert_int_equal(ncc[0], ncc[1]); // the scored tokens are the same for both options
    assert_memory_equal(cc[0], cc[1], (size_t)ncc[0] * sizeof(int32_t));
    assert_true(cx[0][ncx[0] - 1] != cx[1][ncx[1] - 1]); // only the contexts' last (option) tokens differ
    // the score of each option: the continuation under the bigram table
    double want[2];
    for (int i = 0; i < 2; i++) {
        want[i] = 0;
        int32_t prev = cx[i][ncx[i] - 1];
        for (int k = 0; k < ncc[i]; k++)
            want[i] += bigram(prev, cc[i][k]), prev = cc[i][k];
    }
    ev_lm_t lm = fake_lm(tok, 2048);
    cJSON *rows[1] = {row};
    const char *sp = tu_tmp_path("wino.jsonl");
    ev_task_cfg_t cfg = {.flags = TOK_SPECIAL, .max_gen = 16, .samples_path = sp};
    ev_task_result_t res;
    assert_int_equal(ev_task_run(&lm, ev_task_find("winogrande"), rows, 1, &cfg, &res), 0);
    char *buf;
    size_t len;
    assert_int_equal(fs_read_all(sp, &buf, &len), 0);
    cJSON *o = cJSON_Parse(buf);
    const cJSON *ll = cJSON_GetObjectItem(o, "ll");
    // tolerance: the same sums in the same order, printed by cJSON with 17 significant digits
    for (int i = 0; i < 2; i++)
        assert_true(fabs(cJSON_GetArrayItem(ll, i)->valuedouble - want[i]) < 1e-12);
    int pred = want[1] > want[0];
    assert_int_equal(cJSON_GetObjectItem(o, "pred")->valueint, pred);
    assert_true(res.acc == (pred == 0));
    cJSON_Delete(o);
    free(buf);
    for (int i = 0; i < 2; i++)
        free(cx[i]), free(cc[i]);
    ev_doc_free(&d);
    cJSON_Delete(row);
}

// lm-eval's _encode_pair: the context's trailing whitespace moves to the
// continuation, the pair is encoded whole and split at the context's length.
static void test_encode_pair(void **st) {
    const tok_t *tok = smol_tok();
    int32_t *cx, *cc, *w, *c2;
    int ncx, ncc, nw, nc2;
    assert_int_equal(ev_encode_pair(tok, TOK_SPECIAL, 0, "Question: x\nAnswer: ", "yes", &cx, &ncx, &cc, &ncc), 0);
    assert_int_equal(tok_encode_ex(tok, "Question: x\nAnswer: yes", 23, TOK_SPECIAL, &w, &nw), 0);
    assert_int_equal(tok_encode_ex(tok, "Question: x\nAnswer:", 19, TOK_SPECIAL, &c2, &nc2), 0);
    assert_int_equal(ncx, nc2); // the context lost its trailing space
    assert_memory_equal(cx, c2, (size_t)nc2 * sizeof(int32_t));
    assert_int_equal(ncx + ncc, nw); // context + continuation = the whole encoded at once
    assert_memory_equal(cc, w + ncx, (size_t)ncc * sizeof(int32_t));
    free(cx), free(cc), free(w), free(c2);
    // the empty context is the prefix token
    assert_int_equal(ev_encode_pair(tok, TOK_SPECIAL, 7, "", " hi", &cx, &ncx, &cc, &ncc), 0);
    assert_int_equal(ncx, 1);
    assert_int_equal(cx[0], 7);
    free(cx), free(cc);
}

// ---- GSM8K --------------------------------------------------------------------------

static void check_filter(char *(*f)(const char *), const char *gen, const char *want) {
    char *got = f(gen);
    assert_non_null(got);
    if (strcmp(got, want)) fail_msg("filter of '%s': got '%s', want '%s'", gen, got, want);
    free(got);
}

static void test_gsm8k_extraction(void **st) {
    const char *gold =
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18";
    // a 0-shot answer without "####": strict finds nothing, flexible takes the last number
    const char *gen = " She sells 16 - 3 - 4 = 9 eggs, so she makes $18.";
    check_filter(ev_gsm8k_strict, gen, "[invalid]");
    check_filter(ev_gsm8k_flexible, gen, "$18.");
    assert_int_equal(ev_gsm8k_match("[invalid]", gold), 0);
    assert_int_equal(ev_gsm8k_match("$18.", gold), 1); // "$" and the final "." are ignored
    // with "####": strict takes the first match's group, flexible the last number
    gen = "3 + 4 = 7 apples\n#### 1,234\nQuestion";
    check_filter(ev_gsm8k_strict, gen, "1,234");
    check_filter(ev_gsm8k_flexible, gen, "1,234");
    assert_int_equal(ev_gsm8k_match("1,234", "so\n#### 1234"), 1); // commas ignored
    check_filter(ev_gsm8k_strict, "#### -5.5 and #### 3", "-5.5");
    check_filter(ev_gsm8k_flexible, "3 apples and 12 pears", "12");
    check_filter(ev_gsm8k_flexible, "just 7", "7"); // one digit: the second alternative
    check_filter(ev_gsm8k_flexible, "no digits here", "[invalid]");
    assert_int_equal(ev_gsm8k_match("17", gold), 0);
    // Python's $ also matches before a final newline: "18.\n" -> "18\n"
    assert_int_equal(ev_gsm8k_match("18.\n", "#### 18\n"), 1);
    assert_int_equal(ev_gsm8k_match("18.\n", "#### 18"), 0);
}

// ---- RULER string match ------------------------------------------------------------

static void test_ruler_scoring(void **st) {
    char p[64];
    snprintf(p, sizeof p,
             "  \x01"
             "Answer: 123\x02 ");
    ev_ruler_postprocess(p);
    assert_string_equal(p, "Answer: 123");
    snprintf(p, sizeof p, "a\tb");
    ev_ruler_postprocess(p);
    assert_string_equal(p, "a\nb");
    char *refs[3] = {"123", "456", "789"};
    assert_true(ev_ruler_match_all("The numbers are 123 and 456.", refs, 3) == 2.0 / 3);
    assert_true(ev_ruler_match_part("The numbers are 123 and 456.", refs, 3) == 1);
    assert_true(ev_ruler_match_part("none", refs, 3) == 0);
    char *up[1] = {"ABC-def"};
    assert_true(ev_ruler_match_all("x abc-DEF y", up, 1) == 1); // case-insensitive
    char *num[1] = {"2867825"};
    assert_true(ev_ruler_match_all(" 2867825.", num, 1) == 1); // eval.md §6
    assert_true(ev_ruler_match_all("The number is 2,867,825", num, 1) == 0);
    char *uni[1] = {"\xc3\x89t\xc3\xa9"}; // "Été": Python's str.lower() on non-ASCII letters
    assert_true(ev_ruler_match_part("\xc3\xa9t\xc3\xa9 ici", uni, 1) == 1);
    // Python round(x, 2) on binary doubles
    assert_true(ev_round2(200.0 / 3) == 66.67);
    assert_true(ev_round2(0.125) == 0.12);
    assert_true(ev_round2(0.375) == 0.38);
    assert_true(ev_round2(2.675) == 2.67);
    assert_true(ev_round2(12.345) == 12.35);
}

// ---- perplexity ----------------------------------------------------------------------

static void test_windows_layout(void **st) {
    ev_window_t w[8], s[8];
    // 10 tokens, length 4: [prefix T0..T3], then T4..T7 after T3, then T8, T9
    // in a window left-extended to 4 inputs
    assert_int_equal(ev_rolling_windows(10, 4, w, 8), 3);
    ev_window_t want[3] = {{0, 5, 4}, {4, 9, 4}, {6, 11, 2}};
    for (int i = 0; i < 3; i++)
        assert_true(w[i].start == want[i].start && w[i].end == want[i].end && w[i].n_score == want[i].n_score);
    // the strided variant with stride = window is the same
    assert_int_equal(ev_strided_windows(10, 4, 4, s, 8), 3);
    for (int i = 0; i < 3; i++)
        assert_true(s[i].start == w[i].start && s[i].end == w[i].end && s[i].n_score == w[i].n_score);
    assert_int_equal(ev_rolling_windows(10, 4, w, 2), -1); // no room: an error, not a cut
    assert_int_equal(ev_count_words(" a b  c\n", 8), 5);   // Python: len(re.split(r"\s+", " a b  c\n"))
}

static void test_ppl_known_distribution(void **st) {
    int n = 1000;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    rng_t r;
    rng_seed(&r, 5);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(rng_u64(&r) % 4);
    double want = bigram(0, ids[0]); // the prefix token 0 before the first
    for (int i = 1; i < n; i++)
        want += bigram(ids[i - 1], ids[i]);
    ev_lm_t lm = fake_lm(NULL, 5000);
    ev_window_t *w = malloc((size_t)(n + 2) * sizeof *w);
    int lens[5] = {1, 7, 64, 1000, 5000};
    for (int k = 0; k < 5; k++) {
        lm.max_len = lens[k];
        fake_max_seen = 0;
        int64_t nw = ev_rolling_windows(n, lens[k], w, n + 2);
        int64_t scored = 0;
        for (int64_t i = 0; i < nw; i++)
            scored += w[i].n_score;
        assert_int_equal(scored, n); // every token exactly once
        double ll;
        assert_int_equal(ev_ppl_doc(&lm, ids, n, w, nw, &ll), 0);
        assert_true(fake_max_seen <= lens[k]);
        // tolerance: the same terms summed in another order, 1000 terms of size ~1
        assert_true(fabs(ll - want) < 1e-9 * fabs(want));
    }
    int strides[3][2] = {{64, 64}, {64, 16}, {7, 3}};
    for (int k = 0; k < 3; k++) {
        lm.max_len = strides[k][0];
        int64_t nw = ev_strided_windows(n, strides[k][0], strides[k][1], w, n + 2);
        double ll;
        assert_int_equal(ev_ppl_doc(&lm, ids, n, w, nw, &ll), 0);
        assert_true(fabs(ll - want) < 1e-9 * fabs(want));
    }
    // uniform: the third row of the table, p = 1/4 whatever comes next
    for (int i = 0; i < n; i++)
        ids[i] = 2;
    lm.max_len = 64;
    int64_t nw = ev_rolling_windows(n, 64, w, n + 2);
    ev_ppl_sums_t s = {.tokens = n, .words = 250, .bytes = 2000};
    assert_int_equal(ev_ppl_doc(&lm, ids, n, w, nw, &s.ll), 0);
    s.ll -= bigram(0, 2) - log(0.25); // the first token follows the prefix 0, not a 2
    assert_true(fabs(ev_ppl_token(&s) - 4) < 1e-12);
    assert_true(fabs(ev_ppl_word(&s) - 256) < 1e-9);     // 4^(1000/250)
    assert_true(fabs(ev_bits_per_byte(&s) - 1) < 1e-12); // 2 bits per token, 2 bytes per token
    assert_true(fabs(ev_ppl_byte(&s) - 2) < 1e-12);
    free(w), free(ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acc_vs_acc_norm),
        cmocka_unit_test(test_norm_length_in_code_points),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_winogrande_partial),
        cmocka_unit_test(test_encode_pair),
        cmocka_unit_test(test_gsm8k_extraction),
        cmocka_unit_test(test_ruler_scoring),
        cmocka_unit_test(test_windows_layout),
        cmocka_unit_test(test_ppl_known_distribution),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
