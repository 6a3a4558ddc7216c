// RULER data: the word keys and haystack as the reference builds them,
// generator determinism (the same seed gives the same prompt bytes), length
// fitting with the real SmolLM2 tokenizer, and the QA generator on a tiny
// SQuAD-format file. scripts/ref/ruler_ref.py checks the prompt bytes against
// a Python implementation; these tests keep what it found.
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "eval/ev_ruler.h"
#include "io/gguf.h"
#include "testutil.h"

static const char *words_dir = "../shared/data/words", *essays_dir = "../shared/data/essays";

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

static ev_ruler_data_t *data(void) {
    static ev_ruler_data_t d;
    static int loaded;
    if (!fs_is_dir(words_dir) || !fs_is_dir(essays_dir)) {
        printf("../shared/data is not here\n");
        skip();
    }
    if (!loaded) {
        if (ev_ruler_load_words(&d, words_dir, 42) < 0) fail_msg("%s", err_msg());
        if (ev_ruler_load_haystack(&d, essays_dir) < 0) fail_msg("%s", err_msg());
        loaded = 1;
    }
    return &d;
}

// sorted(set(adj + "-" + noun)) over wonderwords 3.0 (values from Python),
// including the clusters where "blue-eyed-..." interleaves with "blue-...".
static void test_word_keys(void **st) {
    ev_ruler_data_t *d = data();
    assert_int_equal(d->n_keys, 6171620);
    struct {
        int64_t i;
        const char *w;
    } c[] = {{0, "Early-ATM"},
             {1, "Early-CD"},
             {610380, "blue-ATM"},
             {612613, "blue-eyebrows"},
             {612614, "blue-eyed-ATM"},
             {612615, "blue-eyed-CD"},
             {2000000, "foregoing-test"},
             {3000000, "lackadaisical-finisher"},
             {4000000, "permissible-shine"},
             {5555555, "ugliest-cinema"},
             {5970393, "wide-eyebrows"},
             {5970394, "wide-eyed-ATM"},
             {6171619, "zonked-zucchini"}};
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        char w[128];
        ev_ruler_word_key(d, c[k].i, w, sizeof w);
        if (strcmp(w, c[k].w)) fail_msg("key %lld: got '%s', want '%s'", (long long)c[k].i, w, c[k].w);
    }
    // the haystack: re.sub(r"\s+", " ", 49 essays concatenated).split(" ") has 111877 words
    assert_int_equal(d->n_hw, 111877);
    assert_int_equal(d->hw_len[1], 8);
    assert_memory_equal(d->hay + d->hw_start[1], "2010What", 8); // essays join without a separator
    assert_int_equal(d->n_cwe, 8166);                            // sorted(set(noun + adj + verb))
}

static char *prompt(const ev_ruler_sample_t *s) {
    size_t a = strlen(s->input), b = strlen(s->answer_prefix);
    char *p = malloc(a + b + 1);
    memcpy(p, s->input, a);
    memcpy(p + a, s->answer_prefix, b + 1);
    return p;
}

// Same seed: the same bytes; another seed: other bytes. Every sample fits its
// target length with the real tokenizer, and comes near it (the search does
// not settle for a short haystack).
static void test_generate_and_fit(void **st) {
    ev_ruler_data_t *d = data();
    const tok_t *tok = smol_tok();
    const char *tasks[] = {"niah_single_1",
                           "niah_single_2",
                           "niah_single_3",
                           "niah_multikey_1",
                           "niah_multikey_2",
                           "niah_multikey_3",
                           "niah_multivalue",
                           "niah_multiquery",
                           "vt",
                           "cwe",
                           "fwe"};
    for (size_t k = 0; k < sizeof tasks / sizeof *tasks; k++) {
        const ev_ruler_task_t *t = ev_ruler_find(tasks[k]);
        ev_ruler_cfg_t cfg = {.tok = tok, .max_len = 4096, .n_samples = 2, .seed = 42};
        ev_ruler_sample_t a[2], b[2], c[2];
        if (ev_ruler_generate(d, t, &cfg, a) < 0) fail_msg("%s: %s", t->name, err_msg());
        assert_int_equal(ev_ruler_generate(d, t, &cfg, b), 0);
        cfg.seed = 43;
        assert_int_equal(ev_ruler_generate(d, t, &cfg, c), 0);
        for (int s = 0; s < 2; s++) {
            char *pa = prompt(&a[s]), *pb = prompt(&b[s]), *pc = prompt(&c[s]);
            assert_string_equal(pa, pb);
            assert_true(strcmp(pa, pc) != 0);
            int32_t *ids;
            int n;
            assert_int_equal(tok_encode_ex(tok, pa, strlen(pa), TOK_SPECIAL, &ids, &n), 0);
            free(ids);
            assert_int_equal(a[s].length, n + t->max_new); // the recorded length is the real token count
            // within the target; and at least 75% of it (one search step of the
            // coarsest haystack, 500 essay words, is about 650 tokens of 4096)
            if (a[s].length > 4096 || a[s].length < 3072)
                fail_msg("%s sample %d: %d tokens for a 4096 target", t->name, s, a[s].length);
            assert_true(a[s].outputs.n >= 1);
            for (int i = 0; i < a[s].outputs.n && t->gen != EV_GEN_CWE && t->gen != EV_GEN_FWE; i++)
                assert_non_null(strstr(a[s].input, a[s].outputs.s[i])); // the needle answers are in the text
            free(pa), free(pb), free(pc);
            ev_ruler_sample_free(&a[s]), ev_ruler_sample_free(&b[s]), ev_ruler_sample_free(&c[s]);
        }
    }
}

// QA on a tiny SQuAD v2.0 file: the gold paragraph is always in the context,
// unanswerable questions are skipped, and without the file the task is an
// error that says so.
static void test_qa_squad(void **st) {
    const char *path = tu_tmp_path("squad.json");
    const char *json =
        "{\"data\": [{\"title\": \"A\", \"paragraphs\": ["
        "{\"context\": \"Paris is the capital of France.\", \"qas\": ["
        "{\"question\": \"What is the capital of France?\", \"is_impossible\": false, \"answers\": [{\"text\": "
        "\"Paris\"}, {\"text\": \"Paris\"}]},"
        "{\"question\": \"Unanswerable?\", \"is_impossible\": true, \"answers\": []}]},"
        "{\"context\": \"Berlin is in Germany.\", \"qas\": []}]},"
        "{\"title\": \"B\", \"paragraphs\": [{\"context\": \"Cats purr when content.\", \"qas\": ["
        "{\"question\": \"What do cats do?\", \"is_impossible\": false, \"answers\": [{\"text\": \"purr\"}]}]}]}]}";
    assert_int_equal(fs_write_all(path, json, strlen(json)), 0);
    ev_ruler_data_t d = {0};
    const ev_ruler_task_t *t = ev_ruler_find("qa_1");
    ev_ruler_cfg_t cfg = {.tok = smol_tok(), .max_len = 300, .n_samples = 2, .seed = 42};
    ev_ruler_sample_t s[3]; // room for the 3-sample request at the end
    assert_int_equal(ev_ruler_generate(&d, t, &cfg, s), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "SQuAD"));
    assert_int_equal(ev_ruler_load_squad(&d, path), 0);
    assert_int_equal(d.squad.n_docs, 3);
    assert_int_equal(d.squad.n_qas, 2);
    if (ev_ruler_generate(&d, t, &cfg, s) < 0) fail_msg("%s", err_msg());
    assert_non_null(strstr(s[0].input, "Paris is the capital of France."));
    assert_non_null(strstr(s[0].input, "Question: What is the capital of France?"));
    assert_string_equal(s[0].answer_prefix, " Answer:");
    assert_int_equal(s[0].outputs.n, 2); // duplicates kept, as RULER does
    assert_non_null(strstr(s[1].input, "Cats purr when content."));
    assert_true(s[0].length <= 300);
    for (int i = 0; i < 2; i++)
        ev_ruler_sample_free(&s[i]);
    cfg.n_samples = 3; // more samples than questions
    assert_int_equal(ev_ruler_generate(&d, t, &cfg, s), ERR_INPUT);
    ev_ruler_data_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_word_keys),
        cmocka_unit_test(test_generate_and_fit),
        cmocka_unit_test(test_qa_squad),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
