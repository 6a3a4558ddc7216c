// The Python string semantics the scorers rely on (str.strip / lower /
// isspace on code points, len(str)), word lists, and the rule-based sentence
// splitter that stands in for NLTK Punkt on the essay haystack.
#include <stdlib.h>
#include <string.h>

#include "base/fs.h"
#include "eval/ev_text.h"
#include "testutil.h"

static void test_python_strings(void **st) {
    // "\u00a0 x y\u3000\n": Python strips the no-break and ideographic spaces too
    const char *s = "\xc2\xa0 x y\xe3\x80\x80\n";
    char *d = ev_strip_dup(s, strlen(s));
    assert_string_equal(d, "x y");
    free(d);
    d = ev_strip_dup(" \t\n", 3);
    assert_string_equal(d, "");
    free(d);
    assert_int_equal(ev_codepoints("na\xc3\xafve \xe2\x82\xac", 10), 7); // "naïve €"
    char *l = ev_lower_dup("ABC \xc3\x89T\xc3\x89 \xce\xa3");            // "ABC ÉTÉ Σ" -> "abc été σ"
    assert_string_equal(l, "abc \xc3\xa9t\xc3\xa9 \xcf\x83");
    free(l);
    assert_true(ev_is_space(0x1c) && ev_is_space(0x85) && ev_is_space(0x2028) && !ev_is_space(0x200b));
    char *r = strdup("a are b are");
    assert_int_equal(ev_replace_all(&r, "are", "is"), 0);
    assert_string_equal(r, "a is b is");
    free(r);
}

static void test_sentences(void **st) {
    const char *t = "Mr. Smith went to Washington. He said \"hi!\" Then J. R. Jones left... "
                    "Really? Yes (mostly). e.g. this stays. Last one";
    size_t *b, *e;
    int n;
    assert_int_equal(ev_split_sentences(t, strlen(t), &b, &e, &n), 0);
    const char *want[] = {"Mr. Smith went to Washington.",
                          "He said \"hi!\"",
                          "Then J. R. Jones left...",
                          "Really?",
                          "Yes (mostly).",
                          "e.g. this stays.",
                          "Last one"};
    assert_int_equal(n, 7);
    for (int i = 0; i < n; i++) {
        if (e[i] - b[i] != strlen(want[i]) || memcmp(t + b[i], want[i], e[i] - b[i]))
            fail_msg("sentence %d: '%.*s', want '%s'", i, (int)(e[i] - b[i]), t + b[i], want[i]);
    }
    free(b), free(e);
}

static void test_lines_and_jsonl(void **st) {
    const char *p = tu_tmp_path("w.txt");
    assert_int_equal(fs_write_all(p, "nasty \nad hoc\r\n\nzoo", 20), 0);
    ev_strs_t l = {0};
    assert_int_equal(ev_read_lines(p, &l), 0);
    assert_int_equal(l.n, 3); // right-stripped, the empty line dropped
    assert_string_equal(l.s[0], "nasty");
    assert_string_equal(l.s[1], "ad hoc");
    assert_string_equal(l.s[2], "zoo");
    ev_strs_free(&l);
    const char *j = tu_tmp_path("j.jsonl");
    assert_int_equal(fs_write_all(j, "{\"a\": 1}\n\n{\"a\": 2}\nnot json\n", 27), 0);
    cJSON **rows;
    int n;
    assert_int_equal(ev_read_jsonl(j, &rows, &n), -1); // ERR_INPUT naming the line
    assert_int_equal(fs_write_all(j, "{\"a\": 1}\n\n{\"a\": 2}\n", 18), 0);
    assert_int_equal(ev_read_jsonl(j, &rows, &n), 0);
    assert_int_equal(n, 2);
    ev_free_jsonl(rows, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_strings),
        cmocka_unit_test(test_sentences),
        cmocka_unit_test(test_lines_and_jsonl),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
