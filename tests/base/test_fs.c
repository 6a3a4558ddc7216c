// Input files that are not regular files (a FIFO, a directory in a file's
// place) are refused by every reader before anything can block on them, with
// a message naming the path and what it is. They used to be opened first: a
// FIFO blocked forever (waiting for a writer), a directory named config.json
// asked for 2^63 bytes. Each case runs under a watchdog (alarm): a reader
// that blocks kills the test binary instead of hanging it.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "base/err.h"
#include "base/fs.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/recipe.h"
#include "io/safetensors.h"
#include "tok/tok.h"

// Seconds before a blocked reader is taken for a hang. The readers answer at
// once; this only has to exceed a slow machine's worst stall.
#define WATCHDOG_S 60

static void expect_refused(int rc, const char *path, const char *what) {
    if (rc != ERR_INPUT || !strstr(err_msg(), path) || !strstr(err_msg(), what))
        fail_msg("rc %d, message \"%s\" (want ERR_INPUT naming %s and \"%s\")", rc, err_msg(), path, what);
}

// Every reader of the library on one path that is not a regular file.
static void every_reader(const char *path, const char *what) {
    alarm(WATCHDOG_S);
    mfile_t mf;
    expect_refused(mfile_open(&mf, path), path, what);
    char *text = NULL;
    expect_refused(fs_read_all(path, &text, NULL), path, what);
    assert_null(text);
    arch_t a;
    expect_refused(cfg_read_config_json(path, &a), path, what);
    expect_refused(cfg_read_hybrid_config(path, &a), path, what);
    recipe_t r;
    expect_refused(recipe_load(&r, path), path, what);
    gguf_t g;
    expect_refused(gguf_open(&g, path), path, what);
    st_file_t f;
    expect_refused(st_open(&f, path), path, what);
    tok_t t;
    expect_refused(tok_load_json(&t, path, NULL), path, what);
    alarm(0);
}

static void test_fifo(void **state) {
    (void)state;
    const char *p = tu_tmp_path("fifo.json");
    assert_int_equal(mkfifo(p, 0600), 0);
    every_reader(p, "is a FIFO, not a regular file");
}

static void test_directory(void **state) {
    (void)state;
    const char *p = tu_tmp_path("config.json");
    assert_int_equal(mkdir(p, 0755), 0);
    every_reader(p, "is a directory, not a regular file");
}

static void test_missing(void **state) {
    (void)state;
    const char *p = tu_tmp_path("no_such_file.json");
    char *text = NULL;
    assert_int_equal(fs_read_all(p, &text, NULL), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "no_such_file.json: cannot open: No such file"));
    // a regular file still reads, whole and NUL-terminated
    assert_int_equal(fs_write_all(p, "abc", 3), 0);
    size_t n = 0;
    assert_int_equal(fs_read_all(p, &text, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(text, "abc");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_directory),
        cmocka_unit_test(test_missing),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
