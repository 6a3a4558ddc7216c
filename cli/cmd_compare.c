// hylo compare TEACHER STUDENT: how close a student's next-token distributions
// are to its teacher's on real text. The baseline a converted hybrid starts
// from, and the number distillation must improve.
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "model/model.h"
#include "tok/tok.h"

static const char *help = "usage: hylo compare TEACHER STUDENT [options]\n"
                          "\n"
                          "Feeds the same token windows to both models (they must share the tokenizer and\n"
                          "vocabulary) and reports, over all positions and at the last position of each\n"
                          "window (the first token the model would generate):\n"
                          "  KL(teacher || student) in nats, and top-1 agreement (how often both models'\n"
                          "  most likely next token is the same).\n"
                          "\n"
                          "options:\n"
                          "  --text DIR|FILE   text to cut windows from (default ../shared/data/essays)\n"
                          "  --windows N       number of windows (default 16, the start of one file each)\n"
                          "  --tokens T        tokens per window (default 64)\n"
                          "  --device D        cpu or cuda (default cpu)\n";

typedef struct {
    double kl, top1, n;
} acc_t;

static void add_position(acc_t *a, const float *lt, const float *ls, int V) {
    double mt = -INFINITY, ms = -INFINITY;
    int at = 0, as = 0;
    for (int v = 0; v < V; v++) {
        if (lt[v] > mt) mt = lt[v], at = v;
        if (ls[v] > ms) ms = ls[v], as = v;
    }
    double zt = 0, zs = 0;
    for (int v = 0; v < V; v++)
        zt += exp(lt[v] - mt), zs += exp(ls[v] - ms);
    double lzt = mt + log(zt), lzs = ms + log(zs), kl = 0;
    for (int v = 0; v < V; v++) {
        double lpt = lt[v] - lzt;
        kl += exp(lpt) * (lpt - (ls[v] - lzs));
    }
    a->kl += kl;
    a->top1 += at == as;
    a->n += 1;
}

// Up to n text files from a folder (sorted), or the one file.
static int list_texts(const char *path, char ***out, int *n, int max) {
    *n = 0;
    *out = calloc((size_t)max, sizeof(char *));
    if (!*out) return err_set(ERR_NOMEM, "out of memory");
    if (!fs_is_dir(path)) {
        if (!((*out)[0] = strdup(path))) return err_set(ERR_NOMEM, "out of memory");
        *n = 1;
        return 0;
    }
    struct dirent **ents;
    int k = scandir(path, &ents, NULL, alphasort), oom = 0;
    if (k < 0) return err_set(ERR_INPUT, "%s: cannot list", path);
    for (int i = 0; i < k; i++) {
        size_t l = strlen(ents[i]->d_name);
        if (!oom && *n < max && l > 4 && !strcmp(ents[i]->d_name + l - 4, ".txt")) {
            char p[2048];
            snprintf(p, sizeof p, "%s/%s", path, ents[i]->d_name);
            (*out)[*n] = strdup(p);
            if ((*out)[*n])
                ++*n;
            else
                oom = 1;
        }
        free(ents[i]);
    }
    free(ents);
    if (oom) return err_set(ERR_NOMEM, "out of memory");
    return *n ? 0 : err_set(ERR_INPUT, "%s: no .txt files", path);
}

int cmd_compare(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    const char *paths[2] = {NULL, NULL}, *text = "../shared/data/essays", *device = "cpu";
    long windows = 16, T = 64;
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if ((r = cli_opt("compare", argc, argv, &i, "--text", &v))) {
            if (r < 0) return cli_fail(r);
            text = v;
        } else if ((r = cli_opt("compare", argc, argv, &i, "--device", &v))) {
            if (r < 0) return cli_fail(r);
            device = v;
        } else if ((r = cli_opt("compare", argc, argv, &i, "--windows", &v))) {
            if (r < 0 || (r = cli_int("compare", "--windows", v, 1, 100000, &windows)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("compare", argc, argv, &i, "--tokens", &v))) {
            if (r < 0 || (r = cli_int("compare", "--tokens", v, 2, 1 << 20, &T)) < 0) return cli_fail(r);
        } else if (argv[i][0] == '-') {
            return cli_usage("compare", "unknown option '%s'", argv[i]);
        } else if (np < 2) {
            paths[np++] = argv[i];
        } else {
            return cli_usage("compare", "unexpected argument '%s'", argv[i]);
        }
    }
    if (np != 2) return cli_usage("compare", "expected TEACHER and STUDENT");
    be_t *be = NULL;
    model_t mt = {0}, ms = {0};
    model_run_t rt = {0}, rs = {0};
    tok_t tok = {0};
    char **files = NULL;
    int nf = 0, rc = cli_backend(device, &be);
    if (rc == 0) rc = cli_load_model(paths[0], be, &mt, &tok, 0);
    if (rc == 0) rc = cli_load_model(paths[1], be, &ms, NULL, 0);
    if (rc == 0) rc = model_run_create(&rt, &mt, CLI_RUN_ARENA);
    if (rc == 0) rc = model_run_create(&rs, &ms, CLI_RUN_ARENA);
    if (rc == 0 && mt.a.V != ms.a.V)
        rc = err_set(ERR_INPUT, "vocabularies differ: teacher %d, student %d", mt.a.V, ms.a.V);
    if (rc == 0) rc = list_texts(text, &files, &nf, (int)windows);
    int V = mt.a.V;
    float *lt = malloc((size_t)T * V * sizeof(float)), *ls = malloc((size_t)T * V * sizeof(float));
    if (rc == 0 && (!lt || !ls)) rc = err_set(ERR_NOMEM, "out of memory");
    acc_t all = {0}, last = {0};
    int used = 0;
    double t0 = time_now();
    for (int f = 0; f < nf && rc == 0; f++) {
        char *buf;
        size_t len;
        int32_t *ids = NULL;
        int n = 0;
        if ((rc = fs_read_all(files[f], &buf, &len)) < 0) break;
        rc = tok_encode_ex(&tok, buf, len, 0, &ids, &n);
        free(buf);
        if (rc == 0 && n >= T) {
            rc = model_logits_all(&rt, ids, 1, (int)T, lt);
            if (rc == 0) rc = model_logits_all(&rs, ids, 1, (int)T, ls);
            for (int t = 0; rc == 0 && t < T; t++)
                add_position(&all, lt + (int64_t)t * V, ls + (int64_t)t * V, V);
            if (rc == 0) add_position(&last, lt + (int64_t)(T - 1) * V, ls + (int64_t)(T - 1) * V, V);
            used++;
        }
        free(ids);
    }
    if (rc == 0 && used == 0) rc = err_set(ERR_INPUT, "%s: no text of at least %ld tokens", text, T);
    if (rc == 0) {
        printf("teacher  %s\nstudent  %s\n", paths[0], paths[1]);
        printf("windows  %d x %ld tokens from %s (%.1f s)\n", used, T, text, time_now() - t0);
        printf("%-28s %12s %12s\n", "", "KL (nats)", "top-1 agree");
        printf("%-28s %12.4f %11.1f%%\n", "all positions", all.kl / all.n, 100.0 * all.top1 / all.n);
        printf("%-28s %12.4f %11.1f%%\n", "first generated token", last.kl / last.n, 100.0 * last.top1 / last.n);
    }
    for (int f = 0; f < nf; f++)
        free(files[f]);
    free(files);
    free(lt), free(ls);
    tok_free(&tok);
    model_run_free(&rt);
    model_run_free(&rs);
    if (mt.be) model_free(&mt);
    if (ms.be) model_free(&ms);
    be_destroy(be);
    return rc < 0 ? cli_fail(rc) : 0;
}
