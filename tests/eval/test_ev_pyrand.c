// The Python / numpy random streams RULER draws from, against values printed
// by CPython 3.11 (random) and numpy 2 (legacy RandomState), seeds 42 and 7
// (eval.md §1.11 lists the seed-42 vectors).
#include <string.h>

#include "eval/ev_pyrand.h"
#include "testutil.h"

static void test_python_random(void **st) {
    ev_mt_t r;
    ev_py_seed(&r, 42);
    assert_true(ev_py_random(&r) == 0.6394267984578837); // exact: both are the same double
    ev_py_seed(&r, 42);
    assert_int_equal(ev_py_getrandbits(&r, 32), 2746317213u);
    ev_py_seed(&r, 42);
    assert_int_equal(ev_py_randint(&r, 1000000, 9999999), 2867825);
    assert_int_equal(ev_py_randint(&r, 1000000, 9999999), 1419610);
    assert_int_equal(ev_py_randint(&r, 1000000, 9999999), 5614226);
}

static void test_uuid_and_choices(void **st) {
    ev_mt_t r;
    char u[37];
    ev_py_seed(&r, 42);
    ev_py_uuid4(&r, u);
    assert_string_equal(u, "bdd640fb-0667-4ad1-9c80-317fa3b1799d");
    ev_py_seed(&r, 42);
    char name[6];
    for (int i = 0; i < 5; i++)
        name[i] = (char)('A' + ev_py_choices_index(&r, 26));
    name[5] = 0;
    assert_string_equal(name, "QAHFT");
}

static void test_sample_and_shuffle(void **st) {
    ev_mt_t r;
    int64_t out[5];
    // n <= setsize: the pool branch; n > setsize: the rejection branch
    ev_py_seed(&r, 42);
    assert_int_equal(ev_py_sample(&r, 100, 5, out), 0);
    int64_t want1[5] = {81, 14, 3, 94, 35};
    assert_memory_equal(out, want1, sizeof want1);
    ev_py_seed(&r, 42);
    assert_int_equal(ev_py_sample(&r, 1000, 5, out), 0);
    int64_t want2[5] = {654, 114, 25, 759, 281};
    assert_memory_equal(out, want2, sizeof want2);
    // sample(DEPTHS, 4) picks indices 7, 1, 17, 15 of the 40 depths: 18, 3, 44, 38
    ev_py_seed(&r, 42);
    int64_t d[4];
    assert_int_equal(ev_py_sample(&r, 40, 4, d), 0);
    int64_t want3[4] = {7, 1, 17, 15};
    assert_memory_equal(d, want3, sizeof want3);
    assert_int_equal(ev_py_sample(&r, 3, 4, d), -1); // k > n
    ev_py_seed(&r, 42);
    int x[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, want4[10] = {7, 3, 2, 8, 5, 6, 9, 4, 0, 1};
    ev_py_shuffle(&r, x, 10, sizeof *x);
    assert_memory_equal(x, want4, sizeof x);
    // k > 5 widens the set size (pool branch for 30, rejection for 100000);
    // then a 23-bit randbelow and a two-word getrandbits continue the stream
    ev_py_seed(&r, 7);
    int64_t a[10], b[12];
    int64_t wa[10] = {10, 4, 12, 20, 1, 2, 17, 3, 11, 18};
    int64_t wb[12] = {7602, 66510, 28140, 4914, 11265, 56838, 54810, 9156, 31544, 11889, 72226, 55642};
    assert_int_equal(ev_py_sample(&r, 30, 10, a), 0);
    assert_memory_equal(a, wa, sizeof wa);
    assert_int_equal(ev_py_sample(&r, 100000, 12, b), 0);
    assert_memory_equal(b, wb, sizeof wb);
    assert_int_equal(ev_py_randint(&r, 0, 6171619), 495854);
    assert_true(ev_py_getrandbits(&r, 40) == 622026593455ull);
}

static void test_numpy_randint(void **st) {
    ev_mt_t r;
    ev_np_seed(&r, 42);
    assert_int_equal(ev_np_randint(&r, 10000, 99999), 25795);
    assert_int_equal(ev_np_randint(&r, 10000, 99999), 10860);
    assert_int_equal(ev_np_randint(&r, 10000, 99999), 86820);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_random),
        cmocka_unit_test(test_uuid_and_choices),
        cmocka_unit_test(test_sample_and_shuffle),
        cmocka_unit_test(test_numpy_randint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
