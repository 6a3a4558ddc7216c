// hylo eval MODEL --task ... and hylo bench MODEL: the evaluation module's commands. Loads the model
// (and, with --against, the teacher), runs the asked tasks through src/eval,
// and writes result.json, report.html and the per-item samples to --out.
#include <omp.h>
#include <sys/resource.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "cli/cli.h"
#include "eval/ev_lmeval.h"
#include "eval/ev_model.h"
#include "eval/ev_report.h"
#include "eval/ev_ruler.h"
#include "eval/ev_run.h"

#ifndef HYLO_VERSION
#define HYLO_VERSION "unknown"
#endif

static const char *help =
    "usage: hylo eval MODEL --task LIST [options]\n"
    "       hylo eval --report RESULT.json [--against OTHER.json] [--metrics FILE] [--out DIR]\n"
    "\n"
    "Evaluates MODEL (a GGUF file or checkpoint folder) and writes DIR/result.json (model, data, settings,\n"
    "version, date, scores), DIR/report.html (tables and SVG plots) and DIR/samples/*.jsonl (every item).\n"
    "\n"
    "tasks (comma-separated, --task may repeat):\n"
    "  arc_easy arc_challenge openbookqa piqa winogrande copa siqa boolq\n"
    "                      multiple choice by log-likelihood, acc and acc_norm as lm-evaluation-harness\n"
    "  lambada_openai      last-word accuracy (greedy) and perplexity\n"
    "  gsm8k               0-shot greedy generation, strict and flexible answer extraction\n"
    "  niah_single_1 .. niah_single_3, niah_multikey_1 .. niah_multikey_3, niah_multivalue,\n"
    "  niah_multiquery, vt, cwe, fwe, qa_1, qa_2   RULER tasks\n"
    "  ppl                 perplexity of text files (rolling windows; --ppl-stride adds the strided one)\n"
    "  groups: mc (the 8 multiple-choice tasks), short (mc, lambada_openai, gsm8k), ruler (all 13), all\n"
    "\n"
    "data (nothing is bundled; ../shared/data is used when it exists and no --data is given):\n"
    "  --data DIR          folder with eval/*.jsonl, essays/, words/\n"
    "  --file TASK=PATH    the JSONL of one short task (repeatable)\n"
    "  --haystack PATH     RULER essay haystack: a folder of .txt files (sorted, concatenated) or a file\n"
    "  --words DIR         RULER word lists (wonderwords adjectivelist.txt, nounlist.txt, verblist.txt)\n"
    "  --squad FILE        SQuAD v2.0 dev JSON for qa_1; --hotpotqa FILE: HotpotQA dev distractor JSON for\n"
    "                      qa_2 (without them qa_1 / qa_2 are reported as missing)\n"
    "  --text PATH         perplexity input, a file or a folder of .txt files (repeatable; default DATA/essays)\n"
    "\n"
    "settings:\n"
    "  --limit N           first N items of each short task (default all)\n"
    "  --bos P             none | auto | always: BOS handling of every prompt (default auto = the\n"
    "                      tokenizer's own, lm-eval >= 0.4.9.2; none = lm-eval <= 0.4.9.1)\n"
    "  --max-len N         tokens the model sees at once for log-likelihoods (default: its\n"
    "                      max_position_embeddings)\n"
    "  --gen-toks N        GSM8K max new tokens (default 256)\n"
    "  --lengths LIST      RULER sequence lengths, e.g. 4K,8K,16K (default 4K)\n"
    "  --samples N         RULER samples per task and length (default 500, as RULER)\n"
    "  --seed S            RULER seed (default 42)\n"
    "  --generate-only     RULER: write the generated samples, do not run the model\n"
    "  --ruler-max-new N   cap the tokens generated per RULER sample (a quick check, not RULER's\n"
    "                      numbers; the prompts stay the same; recorded in the settings)\n"
    "  --ppl-len N         perplexity rolling window (default --max-len)\n"
    "  --ppl-window N, --ppl-stride S   the strided perplexity (window N, default --ppl-len; off without S)\n"
    "\n"
    "report:\n"
    "  --out DIR           output folder (default eval_out)\n"
    "  --against T         the teacher: a model (evaluated the same way) or a result.json of an earlier run\n"
    "  --metrics FILE      training curves from a JSONL file of {\"step\": N, \"...loss...\": x} lines\n"
    "  --report FILE       draw report.html again from a saved result.json (runs nothing)\n"
    "\n"
    "device:\n"
    "  --device D          cpu or cuda (default cpu)\n"
    "  --threads N         CPU threads (default: all)\n"
    "  --chunk N           prefill chunk for generation (default 512)\n";

static const char *mc_tasks[] = {"arc_easy",   "arc_challenge", "openbookqa", "piqa",
                                 "winogrande", "copa",          "siqa",       "boolq"};

typedef struct {
    const char *model, *device, *out, *against, *metrics, *report, *data;
    long threads, chunk, max_len;
    ev_run_cfg_t run;
} eval_opts_t;

static int add_unique(const char **list, int *n, const char *s) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(list[i], s)) return 0;
    if (*n >= EV_MAX_ITEMS) return err_set(ERR_INPUT, "too many tasks");
    list[(*n)++] = s;
    return 0;
}

static int add_task(ev_run_cfg_t *c, const char *name) {
    int mc = !strcmp(name, "mc"), sh = !strcmp(name, "short"), all = !strcmp(name, "all");
    if (mc || sh || all) {
        for (size_t i = 0; i < sizeof mc_tasks / sizeof *mc_tasks; i++)
            TRY(add_unique(c->short_tasks, &c->n_short, mc_tasks[i]));
        if (mc) return 0;
        TRY(add_unique(c->short_tasks, &c->n_short, "lambada_openai"));
        TRY(add_unique(c->short_tasks, &c->n_short, "gsm8k"));
        if (sh) return 0;
    }
    if (!strcmp(name, "ruler") || all) {
        for (int i = 0; i < ev_ruler_n_tasks; i++)
            TRY(add_unique(c->ruler_tasks, &c->n_ruler, ev_ruler_tasks[i].name));
        if (!all) return 0;
    }
    if (!strcmp(name, "ppl") || all) {
        c->ppl = 1;
        return 0;
    }
    if (ev_task_find(name)) return add_unique(c->short_tasks, &c->n_short, ev_task_find(name)->name);
    if (ev_ruler_find(name)) return add_unique(c->ruler_tasks, &c->n_ruler, ev_ruler_find(name)->name);
    return err_set(ERR_INPUT, "unknown task '%s' (see 'hylo eval --help')", name);
}

// "4K,8K,16384" -> lengths
static int parse_lengths(const char *s, ev_run_cfg_t *c) {
    c->n_lengths = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end == 'K' || *end == 'k') v *= 1024, end++;
        if (*end || v < 16 || v > (1L << 24) || c->n_lengths >= 16)
            return err_set(ERR_INPUT, "--lengths: '%s' is not a length (e.g. 4K,8K or 4096)", tok);
        c->lengths[c->n_lengths++] = (int)v;
    }
    return c->n_lengths ? 0 : err_set(ERR_INPUT, "--lengths: no length given");
}

static int parse(int argc, char **argv, eval_opts_t *o) {
    ev_run_cfg_t *c = &o->run;
    o->device = "cpu", o->out = "eval_out", o->chunk = 512;
    c->bos = "auto", c->max_gen = 256, c->ruler_samples = 500, c->seed = 42;
    c->lengths[0] = 4096, c->n_lengths = 1;
    static char task_buf[4096];
    size_t tb = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        long x;
        int r = 0;
        if ((r = cli_opt("eval", argc, argv, &i, "--task", &v))) {
            TRY(r);
            size_t l = strlen(v);
            if (tb + l + 1 > sizeof task_buf) return err_set(ERR_INPUT, "--task: list too long");
            char *copy = task_buf + tb;
            memcpy(copy, v, l + 1);
            tb += l + 1;
            for (char *s = copy, *e; s && *s; s = e ? e + 1 : NULL) {
                if ((e = strchr(s, ','))) *e = 0;
                if (*s) TRY(add_task(c, s));
            }
        } else if ((r = cli_opt("eval", argc, argv, &i, "--out", &v))) {
            TRY(r);
            o->out = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--data", &v))) {
            TRY(r);
            o->data = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--file", &v))) {
            TRY(r);
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1]) return err_set(ERR_INPUT, "--file expects TASK=PATH, got '%s'", v);
            if (c->n_files >= EV_MAX_ITEMS) return err_set(ERR_INPUT, "too many --file options");
            char *t = c->file_task[c->n_files];
            if (eq - v >= (ptrdiff_t)sizeof c->file_task[0])
                return err_set(ERR_INPUT, "--file: unknown task '%.*s'", (int)(eq - v), v);
            snprintf(t, sizeof c->file_task[0], "%.*s", (int)(eq - v), v);
            if (!ev_task_find(t)) return err_set(ERR_INPUT, "--file: unknown task '%s'", t);
            c->file_path[c->n_files++] = eq + 1;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--haystack", &v))) {
            TRY(r);
            c->haystack = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--words", &v))) {
            TRY(r);
            c->words = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--squad", &v))) {
            TRY(r);
            c->squad = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--hotpotqa", &v))) {
            TRY(r);
            c->hotpot = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--text", &v))) {
            TRY(r);
            if (c->n_texts >= EV_MAX_ITEMS) return err_set(ERR_INPUT, "too many --text options");
            c->texts[c->n_texts++] = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--limit", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--limit", v, 0, 1 << 30, &x));
            c->limit = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--bos", &v))) {
            TRY(r);
            c->bos = v;
            if (ev_bos_flags(v) < 0) return err_set(ERR_INPUT, "--bos expects none, auto or always, got '%s'", v);
        } else if ((r = cli_opt("eval", argc, argv, &i, "--max-len", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--max-len", v, 16, 1 << 24, &x));
            o->max_len = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--gen-toks", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--gen-toks", v, 1, 1 << 16, &x));
            c->max_gen = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--lengths", &v))) {
            TRY(r);
            TRY(parse_lengths(v, c));
        } else if ((r = cli_opt("eval", argc, argv, &i, "--samples", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--samples", v, 1, 1 << 20, &x));
            c->ruler_samples = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--ruler-max-new", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--ruler-max-new", v, 1, 1 << 16, &x));
            c->ruler_max_new = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--seed", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--seed", v, 0, 0xffffffffL, &x));
            c->seed = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--ppl-len", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--ppl-len", v, 2, 1 << 24, &x));
            c->ppl_max_len = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--ppl-window", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--ppl-window", v, 2, 1 << 24, &x));
            c->ppl_window = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--ppl-stride", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--ppl-stride", v, 1, 1 << 24, &x));
            c->ppl_stride = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--against", &v))) {
            TRY(r);
            o->against = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--metrics", &v))) {
            TRY(r);
            o->metrics = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--report", &v))) {
            TRY(r);
            o->report = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--device", &v))) {
            TRY(r);
            o->device = v;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--threads", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--threads", v, 1, 1024, &x));
            o->threads = x;
        } else if ((r = cli_opt("eval", argc, argv, &i, "--chunk", &v))) {
            TRY(r);
            TRY(cli_int("eval", "--chunk", v, 1, 1 << 20, &x));
            o->chunk = x;
        } else if (!strcmp(argv[i], "--generate-only")) {
            c->generate_only = 1;
        } else if (argv[i][0] == '-') {
            return err_set(ERR_INPUT, "unknown option '%s' (see 'hylo eval --help')", argv[i]);
        } else if (!o->model) {
            o->model = argv[i];
        } else {
            return err_set(ERR_INPUT, "unexpected argument '%s' (see 'hylo eval --help')", argv[i]);
        }
    }
    if (o->report) return 0;
    if (!o->model) return err_set(ERR_INPUT, "expected MODEL (see 'hylo eval --help')");
    if (!c->n_short && !c->n_ruler && !c->ppl)
        return err_set(ERR_INPUT, "no task given: --task LIST (see 'hylo eval --help')");
    return 0;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int read_json_file(const char *path, cJSON **out) {
    char *buf;
    size_t len;
    TRY(fs_read_all(path, &buf, &len));
    *out = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        return err_set(ERR_INPUT, "%s: not a hylo result JSON object", path);
    }
    return 0;
}

static int write_text(const char *dir, const char *name, const char *text) {
    char p[1200];
    TRY(fs_join(p, sizeof p, dir, name));
    return fs_write_all(p, text, strlen(text));
}

// A model loaded for evaluation: backend, weights, tokenizer, the adapter.
typedef struct {
    be_t *be;
    model_t m;
    tok_t tok;
    ev_lm_t lm;
    int loaded;
} loaded_t;

static int load(const char *device, const char *path, long max_len, long chunk, loaded_t *l) {
    memset(l, 0, sizeof *l);
    TRY(cli_backend(device, &l->be));
    TRY(cli_load_model(path, l->be, &l->m, &l->tok, 0));
    l->loaded = 1;
    return ev_model_wrap(&l->lm, &l->m, &l->tok, (int)max_len, (int)chunk);
}

static void unload(loaded_t *l) {
    if (l->lm.impl) ev_model_unwrap(&l->lm);
    if (l->loaded) model_free(&l->m), tok_free(&l->tok);
    if (l->be) be_destroy(l->be);
    memset(l, 0, sizeof *l);
}

// A result object with what identifies the run: version, date, command, model.
static cJSON *result_head(const loaded_t *l, const char *path, const char *cmdline) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(r, "hylo_version", HYLO_VERSION);
    cJSON_AddStringToObject(r, "date", date);
    cJSON_AddStringToObject(r, "command", cmdline);
    ev_model_info_t mi;
    ev_model_info(&l->lm, &mi);
    cJSON *mo = cJSON_AddObjectToObject(r, "model");
    cJSON_AddStringToObject(mo, "path", path);
    cJSON_AddStringToObject(mo, "arch", mi.arch);
    cJSON_AddStringToObject(mo, "mixers", mi.mixers);
    cJSON_AddNumberToObject(mo, "params", (double)mi.params);
    cJSON_AddNumberToObject(mo, "layers", mi.n_layers);
    cJSON_AddNumberToObject(mo, "vocab", mi.V);
    cJSON_AddNumberToObject(mo, "max_position_embeddings", mi.max_pos);
    cJSON_AddNumberToObject(mo, "max_len", l->lm.max_len);
    cJSON_AddStringToObject(mo, "backend", mi.backend);
    cJSON_AddStringToObject(mo, "tokenizer", l->tok.pre_name);
    return r;
}

// Loads a model, evaluates it as cfg says, and returns its result object.
static int eval_model(const eval_opts_t *o, const char *path, const char *samples_dir, const char *cmdline,
                      cJSON **out) {
    loaded_t l;
    int rc = load(o->device, path, o->max_len, o->chunk, &l);
    cJSON *r = rc == 0 ? result_head(&l, path, cmdline) : NULL;
    if (rc == 0 && !r) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) {
        cJSON *da = cJSON_AddObjectToObject(r, "data");
        if (o->run.data.root[0])
            cJSON_AddStringToObject(da, "root", o->run.data.root);
        else
            cJSON_AddNullToObject(da, "root");
        cJSON_AddBoolToObject(da, "root_by_default", o->run.data.defaulted);
        cJSON *st = ev_run_settings(&o->run);
        if (st) cJSON_AddItemToObject(r, "settings", st);
        ev_run_cfg_t c = o->run;
        c.samples_dir = samples_dir;
        rc = ev_run(&l.lm, &c, r);
    }
    if (rc == 0)
        *out = r;
    else
        cJSON_Delete(r);
    unload(&l);
    return rc;
}

static void print_summary(const cJSON *r) {
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(r, "tasks")) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(t, "headline");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(t, "n");
        if (!cJSON_IsString(h)) continue;
        printf("%-16s n=%-5d", t->string, n ? n->valueint : 0);
        static const char *keys[] = {"acc", "acc_norm", "exact_match_strict", "exact_match_flexible", "perplexity"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, keys[k]);
            if (cJSON_IsNumber(v))
                printf("  %s %.2f", keys[k], strcmp(keys[k], "perplexity") ? 100 * v->valuedouble : v->valuedouble);
        }
        printf("\n");
    }
    const cJSON *ru = cJSON_GetObjectItemCaseSensitive(r, "ruler");
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(ru, "scores")) {
        const cJSON *l;
        printf("%-16s", t->string);
        cJSON_ArrayForEach(l, t) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(l, "score");
            if (cJSON_IsNumber(s))
                printf("  %s: %.2f", l->string, s->valuedouble);
            else
                printf("  %s: generated", l->string);
        }
        printf("\n");
    }
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(ru, "per_length")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(t, "average"),
                    *n = cJSON_GetObjectItemCaseSensitive(t, "tasks");
        printf("ruler average %s: %.2f over %d tasks\n", t->string, a ? a->valuedouble : 0, n ? n->valueint : 0);
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "perplexity"), "rolling");
    if (p) {
        const cJSON *tp = cJSON_GetObjectItemCaseSensitive(p, "token_perplexity"),
                    *wp = cJSON_GetObjectItemCaseSensitive(p, "word_perplexity"),
                    *bp = cJSON_GetObjectItemCaseSensitive(p, "bits_per_byte");
        printf("perplexity       token %.4f  word %.4f  bits/byte %.4f\n", tp ? tp->valuedouble : 0,
               wp ? wp->valuedouble : 0, bp ? bp->valuedouble : 0);
    }
}

static char *command_line(int argc, char **argv) {
    strbuf_t cmd = {0};
    strbuf_puts(&cmd, "hylo");
    for (int i = 0; i < argc; i++) {
        strbuf_puts(&cmd, " ");
        strbuf_puts(&cmd, argv[i]);
    }
    if (cmd.oom) free(cmd.s);
    return cmd.oom ? NULL : cmd.s;
}

static int write_outputs(const char *dir, cJSON *r) {
    const cJSON *against = cJSON_GetObjectItemCaseSensitive(r, "against");
    char *html = NULL, *json = NULL;
    TRY(fs_mkdir_p(dir));
    int rc = ev_report_html(r, against, &html);
    if (rc == 0 && !(json = cJSON_Print(r))) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) rc = write_text(dir, "result.json", json);
    if (rc == 0) rc = write_text(dir, "report.html", html);
    free(html), free(json);
    return rc;
}

static int run(int argc, char **argv) {
    eval_opts_t o = {0};
    TRY(parse(argc, argv, &o));
    if (o.threads) omp_set_num_threads((int)o.threads);
    if (o.report) { // redraw only
        cJSON *r;
        TRY(read_json_file(o.report, &r));
        int rc = 0;
        if (o.against) {
            cJSON *a;
            if ((rc = read_json_file(o.against, &a)) == 0) {
                cJSON_DeleteItemFromObject(r, "against");
                cJSON_AddItemToObject(r, "against", a);
            }
        }
        cJSON *tr = NULL;
        if (rc == 0 && o.metrics && (rc = ev_read_metrics(o.metrics, &tr)) == 0) {
            cJSON_DeleteItemFromObject(r, "training");
            cJSON_AddItemToObject(r, "training", tr);
        }
        char *html = NULL;
        if (rc == 0) rc = fs_mkdir_p(o.out);
        if (rc == 0) rc = ev_report_html(r, cJSON_GetObjectItemCaseSensitive(r, "against"), &html);
        if (rc == 0) rc = write_text(o.out, "report.html", html);
        if (rc == 0) printf("wrote %s/report.html\n", o.out);
        free(html);
        cJSON_Delete(r);
        return rc;
    }
    TRY(ev_data_init(&o.run.data, o.data));
    // the metrics file is read first: a bad one fails before the evaluation
    cJSON *training = NULL;
    if (o.metrics) TRY(ev_read_metrics(o.metrics, &training));
    char *cmd = command_line(argc, argv);
    char sd[1200], sdt[1200];
    snprintf(sd, sizeof sd, "%s/samples", o.out);
    snprintf(sdt, sizeof sdt, "%s/samples_teacher", o.out);
    // folders this run makes: an evaluation that fails before writing into
    // them leaves none behind (rmdir removes only empty ones)
    const char *made[3] = {fs_exists(o.out) ? NULL : o.out, fs_exists(sd) ? NULL : sd, fs_exists(sdt) ? NULL : sdt};
    cJSON *r = NULL, *a = NULL;
    int rc = !cmd ? err_set(ERR_NOMEM, "out of memory") : eval_model(&o, o.model, sd, cmd, &r);
    if (rc == 0 && o.against) {
        if (ends_with(o.against, ".json"))
            rc = read_json_file(o.against, &a);
        else {
            log_info("eval: the teacher %s", o.against);
            rc = eval_model(&o, o.against, sdt, cmd, &a);
        }
        if (rc == 0) cJSON_AddItemToObject(r, "against", a);
    }
    if (rc == 0 && training) cJSON_AddItemToObject(r, "training", training), training = NULL;
    if (rc == 0) rc = write_outputs(o.out, r);
    if (rc == 0) {
        print_summary(r);
        printf("wrote %s/result.json and %s/report.html\n", o.out, o.out);
    }
    for (int i = 2; rc < 0 && i >= 0; i--)
        if (made[i]) rmdir(made[i]);
    cJSON_Delete(r);
    cJSON_Delete(training);
    free(cmd);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    int rc = run(argc, argv);
    return rc < 0 ? cli_fail(rc) : 0;
}

// ---- hylo bench ----------------------------------------------------------------

static const char *bench_help =
    "usage: hylo bench MODEL [--against TEACHER] [options]\n"
    "\n"
    "Prefill and decode latency and cache memory over a sweep of context lengths, for the model and\n"
    "(with --against) its teacher in the same run. Each point prefills T random tokens in chunks, then\n"
    "decodes N tokens greedily after them, timed after 2 untimed steps (the first runs op by op, the\n"
    "second records the step's graph on CUDA). Writes DIR/result.json and DIR/report.html.\n"
    "\n"
    "options:\n"
    "  --lengths LIST      context lengths, e.g. 512,1K,2K,4K (default 512,1K,2K,4K)\n"
    "  --decode N          decode steps per point (default 16)\n"
    "  --seed S            seed of the random token ids (default 1)\n"
    "  --out DIR           output folder (default bench_out)\n"
    "  --device D, --threads N, --chunk N   as for 'hylo eval'\n";

static int bench_model(const char *device, const char *path, long chunk, const int *lens, int n_lens, long n_decode,
                       long seed, const char *cmdline, cJSON **out) {
    loaded_t l;
    int rc = load(device, path, 0, chunk, &l);
    cJSON *r = rc == 0 ? result_head(&l, path, cmdline) : NULL;
    if (rc == 0 && !r) rc = err_set(ERR_NOMEM, "out of memory");
    cJSON *b = r ? cJSON_AddObjectToObject(r, "bench") : NULL, *pts = b ? cJSON_AddArrayToObject(b, "points") : NULL;
    if (rc == 0 && !pts) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) {
        cJSON_AddNumberToObject(b, "decode_tokens", (double)n_decode);
        cJSON_AddNumberToObject(b, "prefill_chunk", (double)chunk);
        cJSON_AddStringToObject(b, "memory",
                                "cache_bytes: the hybrid cache for context + decode tokens + 3 (2 "
                                "untimed warm-up steps, 1 spare); "
                                "weight_bytes: the flat weights on the device; peak_rss_bytes: the "
                                "process's peak resident memory so far (host)");
    }
    for (int i = 0; rc == 0 && i < n_lens; i++) {
        ev_bench_t bp;
        rc = ev_model_bench(&l.lm, lens[i], (int)n_decode, (uint64_t)seed, &bp);
        if (rc < 0) break;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "context", lens[i]);
        cJSON_AddNumberToObject(p, "prefill_s", bp.prefill_s);
        cJSON_AddNumberToObject(p, "prefill_tok_s", bp.prefill_s > 0 ? lens[i] / bp.prefill_s : 0);
        cJSON_AddNumberToObject(p, "decode_ms_per_token", n_decode ? 1000 * bp.decode_s / (double)n_decode : 0);
        cJSON_AddNumberToObject(p, "cache_bytes", (double)bp.cache_bytes);
        cJSON_AddNumberToObject(p, "weight_bytes", (double)bp.weight_bytes);
        cJSON_AddNumberToObject(p, "peak_rss_bytes", (double)ru.ru_maxrss * 1024);
        cJSON_AddItemToArray(pts, p);
        printf("%-40s T=%-7d prefill %8.3f s (%8.1f tok/s)  decode %7.2f ms/token  cache %8.1f MiB\n", path, lens[i],
               bp.prefill_s, bp.prefill_s > 0 ? lens[i] / bp.prefill_s : 0,
               n_decode ? 1000 * bp.decode_s / (double)n_decode : 0, bp.cache_bytes / 1048576.0);
        fflush(stdout);
    }
    if (rc == 0)
        *out = r;
    else
        cJSON_Delete(r);
    unload(&l);
    return rc;
}

static int bench_run(int argc, char **argv) {
    const char *model = NULL, *against = NULL, *device = "cpu", *out = "bench_out";
    long n_decode = 16, seed = 1, threads = 0, chunk = 512;
    ev_run_cfg_t lc = {0};
    static const int dflt[4] = {512, 1024, 2048, 4096};
    memcpy(lc.lengths, dflt, sizeof dflt);
    lc.n_lengths = 4;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if ((r = cli_opt("bench", argc, argv, &i, "--lengths", &v))) {
            TRY(r);
            TRY(parse_lengths(v, &lc));
        } else if ((r = cli_opt("bench", argc, argv, &i, "--decode", &v))) {
            TRY(r);
            TRY(cli_int("bench", "--decode", v, 0, 1 << 20, &n_decode));
        } else if ((r = cli_opt("bench", argc, argv, &i, "--seed", &v))) {
            TRY(r);
            TRY(cli_int("bench", "--seed", v, 0, 1L << 40, &seed));
        } else if ((r = cli_opt("bench", argc, argv, &i, "--out", &v))) {
            TRY(r);
            out = v;
        } else if ((r = cli_opt("bench", argc, argv, &i, "--against", &v))) {
            TRY(r);
            against = v;
        } else if ((r = cli_opt("bench", argc, argv, &i, "--device", &v))) {
            TRY(r);
            device = v;
        } else if ((r = cli_opt("bench", argc, argv, &i, "--threads", &v))) {
            TRY(r);
            TRY(cli_int("bench", "--threads", v, 1, 1024, &threads));
        } else if ((r = cli_opt("bench", argc, argv, &i, "--chunk", &v))) {
            TRY(r);
            TRY(cli_int("bench", "--chunk", v, 1, 1 << 20, &chunk));
        } else if (argv[i][0] == '-') {
            return err_set(ERR_INPUT, "unknown option '%s' (see 'hylo bench --help')", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return err_set(ERR_INPUT, "unexpected argument '%s' (see 'hylo bench --help')", argv[i]);
        }
    }
    if (!model) return err_set(ERR_INPUT, "expected MODEL (see 'hylo bench --help')");
    if (threads) omp_set_num_threads((int)threads);
    char *cmd = command_line(argc, argv);
    if (!cmd) return err_set(ERR_NOMEM, "out of memory");
    cJSON *r = NULL, *a = NULL;
    int rc = bench_model(device, model, chunk, lc.lengths, lc.n_lengths, n_decode, seed, cmd, &r);
    if (rc == 0 && against) {
        rc = bench_model(device, against, chunk, lc.lengths, lc.n_lengths, n_decode, seed, cmd, &a);
        if (rc == 0) cJSON_AddItemToObject(r, "against", a);
    }
    if (rc == 0) rc = write_outputs(out, r);
    if (rc == 0) printf("wrote %s/result.json and %s/report.html\n", out, out);
    cJSON_Delete(r);
    free(cmd);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(bench_help, stdout);
        return 0;
    }
    int rc = bench_run(argc, argv);
    return rc < 0 ? cli_fail(rc) : 0;
}
