// hylo data + hylo train end to end on tiny models with the default model's
// real tokenizer: KD with a resume after kill -9 that reproduces every logged
// loss bit for bit, ILD on a pure-linear student, checkpoints that load, and
// the refusals (checkpoints already there, a shard of another tokenizer); the
// same under mpirun -np 2 (data-parallel ranks, ZeRO-1), against one process.
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
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
static void write_recipe_b(const char *path, const char *student_dir, const char *teacher_dir, const char *out, int ild,
                           int B, int steps) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "model_name_or_path: %s\nteacher_model_name_or_path: %s\nILD: %s\nmax_seq_length: 32\n"
                     "per_device_train_batch_size: %d\ngradient_accumulation_steps: 2\nlearning_rate: 1.0e-3\n"
                     "warmup_steps: 2\nmax_steps: %d\nce_weight: 0.5\ndataset_mixer:\n  %s: 1.0\noutput_dir: %s\n"
                     "save_steps: 1\nsave_total_limit: 2\nlogging_steps: 1\nseed: 7\n",
                     student_dir, teacher_dir, ild ? "true" : "false", B, steps, corpus, out);
    assert_int_equal(fs_write_all(path, buf, (size_t)n), 0);
}
static void write_recipe(const char *path, const char *student_dir, const char *teacher_dir, const char *out, int ild,
                         int steps) {
    write_recipe_b(path, student_dir, teacher_dir, out, ild, 2, steps);
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
// The processes whose parent is `parent` (the ranks of an mpirun, which
// OpenMPI puts into process groups of their own), at most cap.
static int children_of(pid_t parent, pid_t *out, int cap) {
    int n = 0;
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = e->d_name[0] >= '1' && e->d_name[0] <= '9' ? fopen(path, "r") : NULL;
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        const char *rp = strrchr(buf, ')'); // "pid (comm) state ppid"
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

// Runs the shell command `cmd` (exec'ed, so its pid is the process's: hylo or
// mpirun) with its output discarded, and kills it and its children (an
// mpirun's ranks) with SIGKILL once the file `ck` exists (a checkpoint is
// complete); the run must still have been going then.
static void kill_at_checkpoint(const char *cmd, const char *ck) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        char line[8400];
        snprintf(line, sizeof line, "exec %s", cmd);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    int status = 0, killed = 0;
    for (int i = 0; i < 12000 && !killed; i++) {
        if (fs_exists(ck)) { // the process and its children, all at once
            pid_t kids[16];
            int n = children_of(pid, kids, 16);
            kill(pid, SIGKILL);
            for (int j = 0; j < n; j++)
                kill(kids[j], SIGKILL);
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
}

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

    // the same run on 1 and on 3 threads: the same losses, bit for bit (the
    // CPU's products and sums are cut into pieces fixed by the shapes, not
    // by the thread count: backend/cpu/cpu.h cpu_sgemm, cpu_optim.c)
    for (int threads = 1; threads <= 3; threads += 2) {
        char rt[1100], ot[1100], nt[16];
        snprintf(rt, sizeof rt, "%s", tu_tmp_path("kd_threads.yaml"));
        snprintf(ot, sizeof ot, "%s/out_threads_%d", tu_tmpdir(), threads);
        write_recipe(rt, student, teacher, ot, 0, 6);
        snprintf(nt, sizeof nt, "%d", threads);
        setenv("OMP_NUM_THREADS", nt, 1);
        snprintf(args, sizeof args, "train %s", rt);
        const int rc = tu_run_hylo(args, NULL);
        unsetenv("OMP_NUM_THREADS");
        assert_int_equal(rc, 0);
        char *lt = losses(ot);
        assert_string_equal(la, lt);
        free(lt);
    }

    // B: the same run killed with SIGKILL once checkpoint-3 is complete, then resumed
    char rb[1100], ob[1100], ck[1200];
    snprintf(rb, sizeof rb, "%s", tu_tmp_path("kd_b.yaml"));
    snprintf(ob, sizeof ob, "%s", tu_tmp_path("out_b"));
    write_recipe(rb, student, teacher, ob, 0, 6);
    snprintf(ck, sizeof ck, "%s/checkpoint-3/trainer_state.json", ob);
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "%s train %s", getenv("HYLO_BIN"), rb);
    kill_at_checkpoint(cmd, ck);
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

// ILD on a pure-GDN student: its checkpoints hold the moments of the
// parameters that train (all but the embedding), each under its name, and the
// master weights once (model.safetensors); a run killed after checkpoint 2 and
// resumed reproduces every logged loss bit for bit.
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
    snprintf(args, sizeof args, "compare %s %s/final --text docs/ARCHITECTURE.md --windows 1 --tokens 16", teacher, o);
    assert_int_equal(tu_run_hylo(args, NULL), 0);

    // the moments of every parameter but the (tied) embedding, each under its name
    char path[1200];
    snprintf(path, sizeof path, "%s/final/model.safetensors", o);
    st_file_t mf, f;
    assert_int_equal(st_open(&mf, path), 0);
    snprintf(path, sizeof path, "%s/final/optimizer.safetensors", o);
    assert_int_equal(st_open(&f, path), 0);
    assert_int_equal(f.n_tensors, 2 * (mf.n_tensors - 1));
    assert_null(st_find(&f, "master"));
    assert_null(st_find(&f, "exp_avg.model.embed_tokens.weight"));
    assert_null(st_find(&f, "exp_avg_sq.model.embed_tokens.weight"));
    for (int64_t i = 0; i < mf.n_tensors; i++) {
        const st_tensor_t *w = &mf.tensors[i];
        if (!strcmp(w->name, "model.embed_tokens.weight")) continue;
        for (int k = 0; k < 2; k++) {
            char nm[300];
            snprintf(nm, sizeof nm, "%s.%s", k ? "exp_avg_sq" : "exp_avg", w->name);
            const st_tensor_t *t = st_find(&f, nm);
            assert_non_null(t);
            assert_int_equal(t->numel, w->numel);
        }
    }
    const st_tensor_t *t = st_find(&f, "exp_avg_sq.model.layers.1.gdn.q_proj.weight");
    assert_non_null(t);
    float *v = malloc((size_t)t->numel * sizeof(float));
    assert_int_equal(st_read_f32(&f, t, v), 0);
    double sum = 0;
    for (int64_t i = 0; i < t->numel; i++)
        sum += v[i];
    assert_true(sum > 0); // it trained
    free(v);
    st_close(&mf);
    st_close(&f);

    // killed once checkpoint-2 is complete, then resumed
    char rb[1100], ob[1100], ck[1200], cmd[2400];
    snprintf(rb, sizeof rb, "%s", tu_tmp_path("ild_b.yaml"));
    snprintf(ob, sizeof ob, "%s", tu_tmp_path("out_ild_b"));
    write_recipe(rb, gdn, teacher, ob, 1, 4);
    snprintf(ck, sizeof ck, "%s/checkpoint-2/trainer_state.json", ob);
    snprintf(cmd, sizeof cmd, "%s train %s", getenv("HYLO_BIN"), rb);
    kill_at_checkpoint(cmd, ck);
    snprintf(args, sizeof args, "train %s --resume", rb);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    char *lb = losses(ob);
    assert_string_equal(l, lb);
    free(l), free(lb);
}

// ---- data-parallel ranks (mpirun) ---------------------------------------------

// `mpirun -np 2 hylo train ARGS` (2 processes on however many cores: as root
// it needs --allow-run-as-root; one OpenMP thread each): the command line.
// Under MODE=asan the ranks run without the leak checker: OpenMPI's own
// threads keep allocations past MPI_Finalize (src/train/dist.c turns the
// checker off around the MPI calls of the main thread, which covers a run of
// one process, not those threads).
static void mpi_cmd(char *cmd, size_t cap, int np, const char *args) {
    const char *asan = getenv("ASAN_OPTIONS");
    snprintf(cmd, cap,
             "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
             "ASAN_OPTIONS=%s%sdetect_leaks=0 mpirun --allow-run-as-root --oversubscribe --bind-to none -np %d %s %s",
             asan ? asan : "", asan && *asan ? ":" : "", np, getenv("HYLO_BIN"), args);
}
static int run_mpi(int np, const char *args) {
    char cmd[8192], line[8400];
    mpi_cmd(cmd, sizeof cmd, np, args);
    snprintf(line, sizeof line, "%s > %s/out.txt 2>&1", cmd, tu_tmpdir());
    int rc = system(line);
    char path[1100], *out;
    snprintf(path, sizeof path, "%s/out.txt", tu_tmpdir());
    if (fs_read_all(path, &out, NULL) == 0) {
        printf("  mpirun -np %d hylo %s -> %d\n%s", np, args, WEXITSTATUS(rc), out);
        free(out);
    }
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// One rank alone, with one OpenMP thread as the ranks have.
static int run_one(const char *args) {
    setenv("OMP_NUM_THREADS", "1", 1);
    int rc = tu_run_hylo(args, NULL);
    unsetenv("OMP_NUM_THREADS");
    return rc;
}

typedef struct {
    long long step, tokens;
    double loss, gnorm;
} logged_t;

// The logged steps of a metrics text (losses()), at most cap.
static int parse_losses(const char *txt, logged_t *o, int cap) {
    int n = 0;
    for (const char *p = txt; p && *p && n < cap; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *l = strstr(p, "\"loss\": "), *g = strstr(p, "\"grad_norm\": "), *t = strstr(p, "\"tokens\": ");
        assert_true(sscanf(p, "{\"step\": %lld", &o[n].step) == 1 && l && g && t);
        o[n].loss = atof(l + 8), o[n].gnorm = atof(g + 13), o[n].tokens = atoll(t + 10);
        n++;
    }
    return n;
}

// Two logs of the same global batches agree to fp32 reduction order. The rows
// of each optimizer step are the same (position j of the epoch order is rank
// j % world's, so 2 ranks x 2 rows take the 4 rows 1 rank takes), the loss is
// normalised by the global batch and the gradient summed over the ranks: what
// differs is only the order of fp32 sums (the gradient: each rank's half of
// the batch summed, then the halves; the loss terms in double). One fp32
// rounding is 6e-8 relative; over the ~1e4 terms of a gradient entry (a
// random walk of roundings) the gradients differ by up to ~6e-6, and
// AdamW at lr 1e-3 (its update m / sqrt(v) nearly insensitive to that)
// moves the weights apart by far less than that. 1e-5 relative on the loss
// and the gradient norm is 200 times what was measured (at most 4.7e-8 over
// the 4 steps on the CPU) and still fails on any real difference: a row
// counted twice, a batch normalised by the local instead of the global size
// (x2), a missing rank's gradient (~1e-1).
static void assert_close_logs(const char *a, const char *b, int first, int n_expect) {
    logged_t la[16], lb[16];
    int na = parse_losses(a, la, 16), nb = parse_losses(b, lb, 16);
    assert_int_equal(na, n_expect);
    assert_int_equal(nb, n_expect);
    for (int i = first; i < na; i++) {
        assert_int_equal(la[i].step, lb[i].step);
        assert_int_equal(la[i].tokens, lb[i].tokens); // all ranks' tokens counted once
        double dl = fabs(la[i].loss - lb[i].loss) / fabs(la[i].loss);
        double dg = fabs(la[i].gnorm - lb[i].gnorm) / fabs(la[i].gnorm);
        printf("  step %lld: loss %.9g vs %.9g (rel %.2e), grad norm %.9g vs %.9g (rel %.2e)\n", la[i].step, la[i].loss,
               lb[i].loss, dl, la[i].gnorm, lb[i].gnorm, dg);
        assert_true(dl <= 1e-5);
        assert_true(dg <= 1e-5);
    }
}

// mpirun -np 2 with 2 rows per rank against one process with 4 rows: the
// same losses to reduction order (KD, then ILD: each layer's gradient is
// reduced as its backward ends, train/dist.h); 2 ranks killed with SIGKILL after a
// checkpoint and resumed: the uninterrupted 2-rank losses bit for bit; a
// 2-rank checkpoint resumed by one process and a 1-process checkpoint by 2
// ranks: the same losses to reduction order; one process with
// --force-collectives: the plain run's losses bit for bit.
static void test_mpi_ranks(void **st) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("mpirun is not installed (scripts/setup.sh: openmpi-bin)\n");
        skip();
    }
    tu_model_path(); // skips without the default model, as the first test (which made the student) did
    if (!getenv("HYLO_BIN")) {
        printf("HYLO_BIN is not set (run through make test)\n");
        skip();
    }
    char r1[1100], o1[1100], r2[1100], o2[1100], rk[1100], ok[1100], args[2400];
    snprintf(r1, sizeof r1, "%s", tu_tmp_path("mpi_1.yaml"));
    snprintf(o1, sizeof o1, "%s", tu_tmp_path("mpi_out_1"));
    snprintf(r2, sizeof r2, "%s", tu_tmp_path("mpi_2.yaml"));
    snprintf(o2, sizeof o2, "%s", tu_tmp_path("mpi_out_2"));
    snprintf(rk, sizeof rk, "%s", tu_tmp_path("mpi_k.yaml"));
    snprintf(ok, sizeof ok, "%s", tu_tmp_path("mpi_out_k"));
    write_recipe_b(r1, student, teacher, o1, 0, 4, 4); // 1 process x 4 rows
    write_recipe_b(r2, student, teacher, o2, 0, 2, 4); // 2 ranks x 2 rows
    write_recipe_b(rk, student, teacher, ok, 0, 2, 4);
    snprintf(args, sizeof args, "train %s", r1);
    assert_int_equal(run_one(args), 0);
    snprintf(args, sizeof args, "train %s", r2);
    assert_int_equal(run_mpi(2, args), 0);
    char *l1 = losses(o1), *l2 = losses(o2);
    printf("1 process x 4 rows:\n%s2 ranks x 2 rows:\n%s", l1, l2);
    assert_close_logs(l1, l2, 0, 4);

    // one process through the collectives' path (--force-collectives): a
    // reduction and broadcast over one rank leave every buffer as it is, so
    // the losses are the plain run's bit for bit
    char of[1100];
    snprintf(of, sizeof of, "%s", tu_tmp_path("mpi_out_f"));
    snprintf(args, sizeof args, "train %s --out %s --force-collectives", r1, of);
    assert_int_equal(run_one(args), 0);
    char *lf = losses(of);
    assert_string_equal(l1, lf);
    free(lf);

    // killed with SIGKILL (mpirun and both ranks) once checkpoint-2 is complete
    char ck[1200], cmd[8192];
    snprintf(ck, sizeof ck, "%s/checkpoint-2/trainer_state.json", ok);
    snprintf(args, sizeof args, "train %s", rk);
    mpi_cmd(cmd, sizeof cmd, 2, args);
    kill_at_checkpoint(cmd, ck);
    char fin[1200];
    snprintf(fin, sizeof fin, "%s/checkpoint-4", ok);
    assert_false(fs_exists(fin)); // killed midway
    // a copy of the killed run, to resume on one process below
    char oc[1100], rc1[1100];
    snprintf(oc, sizeof oc, "%s", tu_tmp_path("mpi_out_c"));
    snprintf(rc1, sizeof rc1, "%s", tu_tmp_path("mpi_c.yaml"));
    snprintf(cmd, sizeof cmd, "cp -r %s %s", ok, oc);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "train %s --resume", rk);
    assert_int_equal(run_mpi(2, args), 0);
    char *lk = losses(ok);
    assert_string_equal(l2, lk); // every logged loss, bit for bit

    // the 2-rank checkpoint resumed by one process with 4 rows
    write_recipe_b(rc1, student, teacher, oc, 0, 4, 4);
    snprintf(args, sizeof args, "train %s --resume", rc1);
    assert_int_equal(run_one(args), 0);
    char *lc = losses(oc);
    printf("2 ranks, then 1 process from checkpoint-%s:\n%s", "2 or 3", lc);
    assert_close_logs(l1, lc, 0, 4);

    // a 1-process checkpoint (the one of step 3) resumed by 2 ranks
    char od[1100], rd[1100];
    snprintf(od, sizeof od, "%s", tu_tmp_path("mpi_out_d"));
    snprintf(rd, sizeof rd, "%s", tu_tmp_path("mpi_d.yaml"));
    snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -rf %s/checkpoint-4 %s/final", o1, od, od, od);
    assert_int_equal(system(cmd), 0);
    write_recipe_b(rd, student, teacher, od, 0, 2, 4);
    snprintf(args, sizeof args, "train %s --resume", rd);
    assert_int_equal(run_mpi(2, args), 0);
    char *ld = losses(od);
    assert_close_logs(l1, ld, 0, 4);

    // ILD (stage 1), whose backward finishes the layers in forward order:
    // 2 ranks x 2 rows against 1 process x 4 rows
    char ri1[1100], oi1[1100], ri2[1100], oi2[1100];
    snprintf(ri1, sizeof ri1, "%s", tu_tmp_path("mpi_ild_1.yaml"));
    snprintf(oi1, sizeof oi1, "%s", tu_tmp_path("mpi_ild_out_1"));
    snprintf(ri2, sizeof ri2, "%s", tu_tmp_path("mpi_ild_2.yaml"));
    snprintf(oi2, sizeof oi2, "%s", tu_tmp_path("mpi_ild_out_2"));
    write_recipe_b(ri1, student, teacher, oi1, 1, 4, 2);
    write_recipe_b(ri2, student, teacher, oi2, 1, 2, 2);
    snprintf(args, sizeof args, "train %s", ri1);
    assert_int_equal(run_one(args), 0);
    snprintf(args, sizeof args, "train %s", ri2);
    assert_int_equal(run_mpi(2, args), 0);
    char *li1 = losses(oi1), *li2 = losses(oi2);
    printf("ILD, 1 process x 4 rows:\n%sILD, 2 ranks x 2 rows:\n%s", li1, li2);
    assert_close_logs(li1, li2, 0, 2);
    free(l1), free(l2), free(lk), free(lc), free(ld), free(li1), free(li2);
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
        cmocka_unit_test(test_mpi_ranks),
        cmocka_unit_test(test_unknown_key),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
