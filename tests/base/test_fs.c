// Files: inputs that are not regular files, temporaries of interrupted
// runs, output folders.
//
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
#include <sys/wait.h>
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

// The pid of a process that has exited (a child, reaped).
static pid_t dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    assert_true(p > 0);
    assert_int_equal(waitpid(p, NULL, 0), p);
    return p;
}

// Temporaries carry a recognisable name, "<path>.hylo-tmp.<pid>"; those of a
// path whose process is gone (files or whole folders) are removed by the next
// write of that path, and nothing else is touched.
static void test_stale_temporaries(void **state) {
    (void)state;
    char path[600], stale[700], live[700], other[700], notpid[700], inside[800];
    snprintf(path, sizeof path, "%s", tu_tmp_path("out.json"));
    pid_t dead = dead_pid();
    snprintf(stale, sizeof stale, "%s.hylo-tmp.%d", path, (int)dead);
    snprintf(live, sizeof live, "%s.hylo-tmp.%d", path, (int)getppid());
    snprintf(other, sizeof other, "%s/xout.json.hylo-tmp.%d", tu_tmpdir(), (int)dead);
    snprintf(notpid, sizeof notpid, "%s.hylo-tmp.12x", path);
    assert_int_equal(mkdir(stale, 0755), 0); // a folder, with a file in it
    snprintf(inside, sizeof inside, "%s/part", stale);
    FILE *f = fopen(inside, "w");
    fclose(f);
    const char *files[3] = {live, other, notpid};
    for (int i = 0; i < 3; i++) {
        f = fopen(files[i], "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(fs_write_all(path, "{}", 2), 0);
    assert_false(fs_exists(stale));
    for (int i = 0; i < 3; i++)
        assert_true(fs_exists(files[i]));
    char name[700];
    fs_tmp_name(name, sizeof name, path);
    assert_false(fs_exists(name)); // our own is gone once committed
    for (int i = 0; i < 3; i++)
        unlink(files[i]);
}

// Output folders: a trailing slash is the folder itself; an existing
// non-empty folder or a file is refused before anything is written; the
// temporary exists from begin on and is gone after commit or abort.
static void test_outdir(void **state) {
    (void)state;
    char dir[600], slash[700], file[1200];
    snprintf(dir, sizeof dir, "%s/outdir", tu_tmpdir());
    snprintf(slash, sizeof slash, "%s//", dir);
    outdir_t o;
    assert_int_equal(fs_outdir_begin(&o, slash), 0);
    assert_string_equal(o.path, dir);
    assert_true(fs_is_dir(o.tmp));
    snprintf(file, sizeof file, "%s/a.txt", o.tmp);
    assert_int_equal(fs_write_all(file, "a", 1), 0);
    assert_int_equal(fs_outdir_commit(&o), 0);
    snprintf(file, sizeof file, "%s/a.txt", dir);
    assert_true(fs_exists(file));
    assert_int_equal(fs_outdir_begin(&o, dir), ERR_INPUT); // not empty now
    assert_non_null(strstr(err_msg(), "outdir: output folder exists and is not empty"));
    assert_int_equal(fs_outdir_begin(&o, file), ERR_INPUT); // a file
    assert_non_null(strstr(err_msg(), "a.txt: output folder exists and is not a folder"));
    snprintf(dir, sizeof dir, "%s/outdir2", tu_tmpdir());
    assert_int_equal(fs_outdir_begin(&o, dir), 0);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s", o.tmp);
    fs_outdir_abort(&o);
    assert_false(fs_exists(tmp));
    assert_false(fs_exists(dir));
    assert_int_equal(fs_outdir_begin(&o, ""), ERR_INPUT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo),    cmocka_unit_test(test_directory),
        cmocka_unit_test(test_missing), cmocka_unit_test(test_stale_temporaries),
        cmocka_unit_test(test_outdir),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
