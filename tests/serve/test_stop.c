// Stop strings over text fed in pieces (serve/stop.c): what is handed on
// never contains a stop string or its start, wherever the pieces are cut.
#include <stdlib.h>
#include <string.h>

#include "serve/stop.h"
#include "testutil.h"

// Feeds text cut every `step` bytes; returns what was handed on (and flushed
// when no stop string appeared) and whether one did.
static char *run(const char *const *stops, int n_stops, const char *text, size_t step, int *hit) {
    srv_stop_t st;
    assert_int_equal(srv_stop_init(&st, stops, n_stops), 0);
    strbuf_t out = {0};
    *hit = 0;
    size_t len = strlen(text);
    for (size_t i = 0; i < len && !*hit; i += step) {
        size_t n = len - i < step ? len - i : step;
        *hit = srv_stop_feed(&st, text + i, n, &out);
    }
    if (!*hit) srv_stop_flush(&st, &out);
    assert_false(out.oom);
    srv_stop_free(&st);
    char *s = out.s ? out.s : strdup("");
    return s;
}

static void test_stop_any_cut(void **state) {
    const char *stops[] = {"\n\nUser:", "END", "x"};
    struct {
        const char *text, *want;
        int hit;
    } cases[] = {
        {"Hello there.\n\nUser: more", "Hello there.", 1},
        {"no stop here\n\nUse it", "no stop here\n\nUse it", 0}, // a prefix held, then released at the end
        {"ENEND", "EN", 1},                                      // the earliest match, after a false start
        {"box", "bo", 1},
        {"\n\nUser", "\n\nUser", 0}, // a whole prefix at the very end: released by the flush
        {"", "", 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t step = 1; step <= 8; step++) {
            int hit;
            char *got = run(stops, 3, cases[c].text, step, &hit);
            if (strcmp(got, cases[c].want) || hit != cases[c].hit)
                fail_msg("case %zu step %zu: got '%s' (hit %d), want '%s' (hit %d)", c, step, got, hit, cases[c].want,
                         cases[c].hit);
            free(got);
        }
}

// Without stop strings everything passes through at once; empty strings are
// ignored (they would match everywhere).
static void test_stop_none(void **state) {
    const char *stops[] = {"", NULL};
    srv_stop_t st;
    assert_int_equal(srv_stop_init(&st, stops, 2), 0);
    assert_int_equal(st.n, 0);
    strbuf_t out = {0};
    assert_int_equal(srv_stop_feed(&st, "abc", 3, &out), 0);
    assert_string_equal(out.s, "abc");
    free(out.s);
    srv_stop_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_any_cut),
        cmocka_unit_test(test_stop_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
