// hylo data + hylo train end to end on tiny models with the default model's
// real tokenizer: KD with a resume after kill -9 that reproduces every logged
// loss bit for bit, ILD on a pure-linear student, checkpoints that load, and
// the refusals (checkpoints already there, a shard of another tokenizer).
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fs.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "testutil.h"
#include "tok/tok.h"

// A tiny model of kind `kind` per layer (LAYER_ATTN: a plain teacher) over the
// default model's tokenizer and vocabulary, written as a checkpoint folder.
static void write_tiny(const char *dir, layer_kind_t kind, uint64_t seed) {
    gguf_t g;
    assert_int_equal(gguf_open(&g, tu_model_path()), 0);
    tok_t tok;
    assert_int_equal(tok_load_gguf(&tok, &g), 0);
    arch_t a;
    arch_init(&a);
    snprintf(a.model_type, sizeof a.model_type, "llama");
    a.d = 32, a.n_layers = 2, a.H = 4, a.Hkv = 2, a.dh = 8, a.ffn = 64, a.V = tok.n_vocab, a.tie_embeddings = 1;
    a.eps = 1e-5f, a.rope.theta = 10000.0f, a.max_pos = 2048;
    a.bos_id = 1, a.eos_id = 2, a.pad_id = 2, a.n_eos = 1, a.eos_ids[0] = 2;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = kind;
    a.mla = (mla_dims_t){.r_q = 16, .r_kv = 12, .d_nope = 4, .d_rope = 4, .d_v = 8, .n_kv = 2};
    a.mla.rope = a.rope;
    a.gdn = (gdn_dims_t){
        .n_heads = 2, .n_v_heads = 2, .head_k = 8, .head_v = 16, .conv = 4, .use_gate = 1, .norm_eps = 1e-6f};
    a.is_hybrid = kind != LAYER_ATTN;
    ptable_t pt;
    assert_int_equal(ptable_build(&pt, &a), 0);
    float *w = tu_params(&pt, seed, 0.1f);
    assert_int_equal(ckpt_write(dir, &a, &pt, w, ST_F32, &tok, NULL), 0);
    free(w);
    ptable_free(&pt);
    tok_free(&tok);
    gguf_close(&g);
}

static char corpus[1100];
static void write_recipe(const char *path, const char *student_dir, const char *teacher_dir, const char *out, int ild,
                         int steps) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "model_name_or_path: %s\nteacher_model_name_or_path: %s\nILD: %s\nmax_seq_length: 32\n"
                     "per_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nlearning_rate: 1.0e-3\n"
                     "warmup_steps: 2\nmax_steps: %d\nce_weight: 0.5\ndataset_mixer:\n  %s: 1.0\noutput_dir: %s\n"
                     "save_steps: 1\nsave_total_limit: 2\nlogging_steps: 1\nseed: 7\n",
                     student_dir, teacher_dir, ild ? "true" : "false", steps, corpus, out);
    assert_int_equal(fs_write_all(path, buf, (size_t)n), 0);
}

// The deterministic fields of every metrics line ("tokens_per_s" and
// "mem_gib" are measurements), one line per step, into a malloc'ed string.
static char *losses(const char *out_dir) {
    char path[1100], *buf, *res = calloc(1, 1 << 16);
    size_t len, used = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    assert_int_equal(fs_read_all(path, &buf, &len), 0);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char *cut = strstr(line, ", \"tokens_per_s\"");
        assert_non_null(cut);
        used += (size_t)snprintf(res + used, (1 << 16) - used, "%.*s\n", (int)(cut - line), line);
    }
    free(buf);
    return res;
}

// tu_tmp_path's buffers rotate: the paths a test keeps are copied here.
static char student[1100], teacher[1100];

static void test_data_and_kd_resume(void **st) {
    snprintf(student, sizeof student, "%s", tu_tmp_path("student"));
    snprintf(teacher, sizeof teacher, "%s", tu_tmp_path("teacher"));
    snprintf(corpus, sizeof corpus, "%s", tu_tmp_path("corpus.shard"));
    write_tiny(student, LAYER_MLA, 1);
    write_tiny(teacher, LAYER_ATTN, 2);
    char args[4096];
    // the corpus: this repository's documentation (in every clone)
    snprintf(args, sizeof args, "data --tokenizer %s --out %s docs", student, corpus);
    assert_int_equal(tu_run_hylo(args, NULL), 0);

    // A: 6 steps uninterrupted
    char ra[1100], oa[1100];
    snprintf(ra, sizeof ra, "%s", tu_tmp_path("kd_a.yaml"));
    snprintf(oa, sizeof oa, "%s", tu_tmp_path("out_a"));
    write_recipe(ra, student, teacher, oa, 0, 6);
    snprintf(args, sizeof args, "train %s", ra);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    char *la = losses(oa);
    printf("%s", la);

    // B: the same run killed with SIGKILL once checkpoint-3 is complete, then resumed
    char rb[1100], ob[1100], ck[1200];
    snprintf(rb, sizeof rb, "%s", tu_tmp_path("kd_b.yaml"));
    snprintf(ob, sizeof ob, "%s", tu_tmp_path("out_b"));
    write_recipe(rb, student, teacher, ob, 0, 6);
    snprintf(ck, sizeof ck, "%s/checkpoint-3/trainer_state.json", ob);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execl(getenv("HYLO_BIN"), "hylo", "train", rb, (char *)NULL);
        _exit(127);
    }
    int status = 0, killed = 0;
    for (int i = 0; i < 6000 && !killed; i++) {
        if (fs_exists(ck)) {
            kill(pid, SIGKILL);
            killed = 1;
        } else if (waitpid(pid, &status, WNOHANG) == pid) {
            break;
        } else {
            usleep(10000);
        }
    }
    assert_true(killed);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL); // it was still running
    char fin[1200];
    snprintf(fin, sizeof fin, "%s/checkpoint-6", ob);
    assert_false(fs_exists(fin)); // killed midway
    snprintf(args, sizeof args, "train %s", rb);
    assert_int_equal(tu_run_hylo(args, NULL), 2); // checkpoints there: refused without --resume
    snprintf(args, sizeof args, "train %s --resume", rb);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    char *lb = losses(ob);
    assert_string_equal(la, lb); // every logged loss, bit for bit
    free(la), free(lb);
    // the last two checkpoints kept, final -> the last, and it loads
    snprintf(fin, sizeof fin, "%s/checkpoint-4", ob);
    assert_false(fs_exists(fin));
    snprintf(args, sizeof args, "info %s/final", ob);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args, "generate %s/final --prompt Hello -n 4", ob);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(fin, sizeof fin, "%s/loss.svg", ob);
    assert_true(fs_exists(fin));
}

static void test_ild_linear(void **st) {
    char gdn[1100];
    snprintf(gdn, sizeof gdn, "%s", tu_tmp_path("student_gdn"));
    write_tiny(gdn, LAYER_GDN, 3);
    char r[1100], o[1100], args[2400];
    snprintf(r, sizeof r, "%s", tu_tmp_path("ild.yaml"));
    snprintf(o, sizeof o, "%s", tu_tmp_path("out_ild"));
    write_recipe(r, gdn, teacher, o, 1, 4);
    snprintf(args, sizeof args, "train %s", r);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    char *l = losses(o);
    printf("%s", l);
    assert_non_null(strstr(l, "\"step\": 4,"));
    free(l);
    snprintf(args, sizeof args, "compare %s %s/final --text docs/ARCHITECTURE.md --windows 1 --tokens 16", teacher, o);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
}

// A recipe key nobody knows is an error naming it.
static void test_unknown_key(void **st) {
    const char *r = tu_tmp_path("bad.yaml");
    const char *txt = "model_name_or_path: x\nlearning_rat: 1e-4\n";
    assert_int_equal(fs_write_all(r, txt, strlen(txt)), 0);
    char args[1200], *err = NULL;
    snprintf(args, sizeof args, "train %s", r);
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "learning_rat"));
    free(err);
    // a dataset_mixer fraction that is not a positive number names itself
    txt = "model_name_or_path: x\noutput_dir: y\ndataset_mixer:\n  a.shard: 1.0\n  b.shard: half\n";
    assert_int_equal(fs_write_all(r, txt, strlen(txt)), 0);
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "fraction 'half' of b.shard"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_and_kd_resume),
        cmocka_unit_test(test_ild_linear),
        cmocka_unit_test(test_unknown_key),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
