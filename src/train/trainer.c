#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/timer.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/checkpoint.h"
#include "train/data.h"
#include "train/distill.h"
#include "train/plot.h"
#include "tok/tok.h"

// Everything a run holds.
typedef struct {
    const train_cfg_t *c;
    be_t *be;
    tok_t tok;
    model_t s, t; // student, teacher
    model_run_t rs, rt;
    optim_t o;
    data_loader_t *dl;
    block_saved_t *blocks;
    int have_t;
    int64_t total_steps, warmup, tokens_seen;
    double flops_per_token; // 6 N_student + 2 N_teacher (matrix products only)
    plot_series_t curve;    // the logged loss, for the plot
} trainer_t;

// ---- models -------------------------------------------------------------------

// The student from a hybrid folder, with the recipe's YaRN on its MLA RoPE.
static int load_student(trainer_t *tr, const char *path) {
    const train_cfg_t *c = tr->c;
    arch_t a;
    wsrc_t *src;
    TRY(wsrc_open(&src, path, &a));
    int rc = a.is_hybrid ? 0
                         : err_set(ERR_INPUT,
                                   "%s: not a hybrid checkpoint (no hybrid_config.json): convert the teacher "
                                   "first (hylo convert), or let hylo train do it from the recipe",
                                   path);
    if (rc == 0 && c->yarn_factor > 1 && arch_count(&a, LAYER_MLA)) {
        a.mla.rope.scaling = ROPE_SCALE_YARN;
        a.mla.rope.factor = (float)c->yarn_factor;
        a.mla.rope.orig_max_pos = c->yarn_orig;
        if (a.mla.rope.beta_fast == 0) a.mla.rope.beta_fast = 32, a.mla.rope.beta_slow = 1;
        if (a.mla.rope.mscale == 0) a.mla.rope.mscale = 1;
    }
    if (rc == 0) rc = model_load_src(&tr->s, src, &a, tr->be, 0);
    wsrc_close(src);
    return rc;
}

static int load_tokenizer(tok_t *tok, const char *dir) {
    char tj[1100], tc[1100];
    TRY(fs_join(tj, sizeof tj, dir, "tokenizer.json"));
    TRY(fs_join(tc, sizeof tc, dir, "tokenizer_config.json"));
    return tok_load_json(tok, tj, fs_exists(tc) ? tc : NULL);
}

// One distillation micro-batch on the runs as they are.
static int micro_step(trainer_t *tr, const int32_t *ids, const int32_t *tgt, int B, distill_loss_t *l) {
    const train_cfg_t *c = tr->c;
    distill_t d = {&tr->rs, tr->have_t ? &tr->rt : NULL, tr->o.grad, c->recompute, c->ild_mode, tr->blocks};
    int64_t N = (int64_t)B * c->T;
    if (c->ild) return distill_ild(&d, ids, B, c->T, (float)(1.0 / ((double)N * c->GA)), l);
    int64_t n_ce = 0;
    for (int64_t i = 0; i < N; i++)
        n_ce += tgt[i] >= 0;
    // KL "batchmean" (per sequence) as the published runs; CE a token mean.
    float kl = (float)(c->kl_weight / ((double)B * c->GA));
    float ce = n_ce ? (float)(c->ce_weight / ((double)n_ce * c->GA)) : 0.0f;
    return distill_kd(&d, ids, tgt, B, c->T, kl, ce, l);
}

// The activation plan: each run's arena peak measured on one micro-batch of
// B x T0 and B x 2 T0 tokens (every saved tensor and temporary is linear in
// the token count), extrapolated to B x T, with a margin for alignment.
static int plan_arenas(trainer_t *tr, size_t *bytes_s, size_t *bytes_t) {
    const train_cfg_t *c = tr->c;
    int T0 = c->T < 128 ? c->T : 128;
    int Ts[2] = {T0 / 2 > 0 ? T0 / 2 : 1, T0};
    size_t peak_s[2], peak_t[2], peak_x[2];
    size_t probe = (size_t)64 << 20; // doubled until the probe step fits
    int64_t n = (int64_t)c->B * T0;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t)), *tgt = malloc((size_t)n * sizeof(int32_t));
    if (!ids || !tgt) {
        free(ids), free(tgt);
        return err_set(ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919) % tr->s.a.V), tgt[i] = (int32_t)((i * 104729 + 1) % tr->s.a.V);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        train_cfg_t cc = *c;
        cc.T = Ts[k];
        for (;;) {
            tr->be->scratch.peak = 0;
            trainer_t probe_tr = *tr;
            probe_tr.c = &cc;
            rc = model_run_create(&probe_tr.rs, &tr->s, probe);
            if (rc == 0 && tr->have_t) rc = model_run_create(&probe_tr.rt, &tr->t, probe);
            distill_loss_t l;
            if (rc == 0) rc = micro_step(&probe_tr, ids, tgt, c->B, &l);
            peak_s[k] = probe_tr.rs.arena.peak, peak_t[k] = probe_tr.rt.arena.peak, peak_x[k] = tr->be->scratch.peak;
            int full = rc == ERR_NOMEM && (probe_tr.rs.arena.overflowed || probe_tr.rt.arena.overflowed);
            model_run_free(&probe_tr.rs);
            model_run_free(&probe_tr.rt);
            if (!full || probe >= ((size_t)1 << 36)) break;
            probe *= 2; // an arena ran full: measure again with more room
            TRY(optim_zero_grad(&tr->o, &tr->s));
        }
    }
    free(ids), free(tgt);
    if (rc == 0) rc = optim_zero_grad(&tr->o, &tr->s);
    if (rc < 0) return err_wrap(rc, "measuring the activation plan: ");
    double per_s = (double)(peak_s[1] - peak_s[0]) / (Ts[1] - Ts[0]);
    double per_t = (double)(peak_t[1] - peak_t[0]) / (Ts[1] - Ts[0]);
    *bytes_s = (size_t)((peak_s[1] + per_s * (c->T - Ts[1])) * 1.05) + ((size_t)16 << 20);
    *bytes_t = tr->have_t ? (size_t)((peak_t[1] + per_t * (c->T - Ts[1])) * 1.05) + ((size_t)16 << 20) : 0;
    // The ops' scratch (chunked recurrences, fused losses) grows with T too.
    double per_x = ((double)peak_x[1] - (double)peak_x[0]) / (Ts[1] - Ts[0]);
    double need_x = peak_x[1] + (per_x > 0 ? per_x : 0) * (c->T - Ts[1]);
    return be_scratch_reserve(tr->be, (size_t)(need_x * 1.05) + ((size_t)64 << 20));
}

// ---- checkpoints ---------------------------------------------------------------

typedef struct {
    trainer_t *tr;
    data_pos_t pos;
} save_ctx_t;

static int write_state(const char *tmp, void *user) {
    save_ctx_t *sc = user;
    trainer_t *tr = sc->tr;
    const train_cfg_t *c = tr->c;
    be_t *be = tr->be;
    int64_t n = tr->o.n;
    float *h = malloc((size_t)n * sizeof(float));
    if (!h) return err_set(ERR_NOMEM, "out of memory");
    // optimizer.safetensors: the fp32 master weights and both moments, flat.
    st_writer_t w;
    st_writer_init(&w);
    const char *names[3] = {"master", "exp_avg", "exp_avg_sq"};
    float *bufs[3] = {tr->o.master, tr->o.m1, tr->o.m2};
    float *copies[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (!(copies[i] = malloc((size_t)n * sizeof(float)))) rc = err_set(ERR_NOMEM, "out of memory");
        if (rc == 0) rc = be->copy_d2h(be, copies[i], bufs[i], (size_t)n * sizeof(float));
        if (rc == 0) rc = st_writer_add(&w, names[i], ST_F32, 1, &n, copies[i]);
    }
    char path[1100];
    if (rc == 0) rc = fs_join(path, sizeof path, tmp, "optimizer.safetensors");
    if (rc == 0) rc = st_writer_write(&w, path, NULL);
    st_writer_free(&w);
    for (int i = 0; i < 3; i++)
        free(copies[i]);
    free(h);
    if (rc < 0) return rc;
    char js[2048];
    int len = snprintf(js, sizeof js,
                       "{\n  \"global_step\": %lld,\n  \"max_steps\": %lld,\n  \"tokens_seen\": %lld,\n"
                       "  \"data_epoch\": %lld,\n  \"data_index\": %lld,\n  \"seed\": %llu,\n"
                       "  \"stage\": \"%s\",\n  \"max_seq_length\": %d,\n  \"per_device_train_batch_size\": %d,\n"
                       "  \"gradient_accumulation_steps\": %d,\n  \"parameters\": %lld\n}\n",
                       (long long)tr->o.step, (long long)tr->total_steps, (long long)tr->tokens_seen,
                       (long long)sc->pos.epoch, (long long)sc->pos.index, (unsigned long long)c->seed,
                       c->ild ? "ild" : "kd", c->T, c->B, c->GA, (long long)n);
    TRY(fs_join(path, sizeof path, tmp, "trainer_state.json"));
    TRY(fs_write_all(path, js, (size_t)len));
    TRY(fs_join(path, sizeof path, tmp, "loss.svg"));
    return plot_write_svg(&tr->curve, path, c->ild ? "ILD loss" : "KD loss");
}

// checkpoint-N folders of out_dir, newest first; returns the count.
static int list_checkpoints(const char *dir, int64_t *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char rest;
        if (sscanf(e->d_name, "checkpoint-%lld%c", &s, &rest) == 1 && n < cap) steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) // newest first
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1], steps[j - 1] = t;
        }
    return n;
}

static int save_checkpoint(trainer_t *tr, const char *name) {
    const train_cfg_t *c = tr->c;
    model_t *m = &tr->s;
    char dir[1100];
    TRY(fs_join(dir, sizeof dir, c->out_dir, name));
    if (fs_exists(dir)) return 0; // this step is saved already (the last periodic save)
    float *host = malloc((size_t)tr->o.n * sizeof(float));
    if (!host) return err_set(ERR_NOMEM, "checkpoint: %lld parameters", (long long)tr->o.n);
    int rc = m->be->copy_d2h(m->be, host, tr->o.master, (size_t)tr->o.n * sizeof(float));
    save_ctx_t sc = {tr, data_loader_pos(tr->dl)};
    if (rc == 0) rc = ckpt_write_with(dir, &m->a, &m->pt, host, ST_F32, &tr->tok, NULL, write_state, &sc);
    free(host);
    if (rc < 0) return err_wrap(rc, "saving %s (the previous checkpoints are intact): ", dir);
    log_info("saved %s", dir);
    if (c->save_total_limit > 0) {
        int64_t steps[4096];
        int n = list_checkpoints(c->out_dir, steps, 4096);
        for (int i = c->save_total_limit; i < n; i++) {
            char old[1100], nm[64];
            snprintf(nm, sizeof nm, "checkpoint-%lld", (long long)steps[i]);
            if (fs_join(old, sizeof old, c->out_dir, nm) == 0) fs_remove_tree(old);
        }
    }
    return 0;
}

// output_dir/final -> the last checkpoint (what the next stage names), replaced
// atomically.
static int link_final(const char *out_dir, const char *name) {
    char link[1100], tmp[1200];
    TRY(fs_join(link, sizeof link, out_dir, "final"));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", link, (int)getpid());
    unlink(tmp);
    if (symlink(name, tmp) != 0 || rename(tmp, link) != 0) {
        unlink(tmp);
        return err_set(ERR_IO, "%s: cannot link it to %s: %s", link, name, strerror(errno));
    }
    return 0;
}

// Restores the optimizer and the data position from checkpoint dir (the
// student's weights were loaded from it already).
static int restore_state(trainer_t *tr, const char *dir, data_pos_t *pos) {
    char path[1100];
    TRY(fs_join(path, sizeof path, dir, "trainer_state.json"));
    char *js;
    size_t len;
    TRY(fs_read_all(path, &js, &len));
    cJSON *root = cJSON_ParseWithLength(js, len);
    free(js);
    if (!root) return err_set(ERR_INPUT, "%s: not valid JSON", path);
    const char *keys[4] = {"global_step", "tokens_seen", "data_epoch", "data_index"};
    double v[4];
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++) {
        cJSON *x = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0)
            rc = err_set(ERR_INPUT, "%s: %s: expected a non-negative number", path, keys[i]);
        else
            v[i] = x->valuedouble;
    }
    cJSON_Delete(root);
    TRY(rc);
    tr->o.step = (int64_t)v[0], tr->tokens_seen = (int64_t)v[1];
    pos->epoch = (int64_t)v[2], pos->index = (int64_t)v[3];
    TRY(fs_join(path, sizeof path, dir, "optimizer.safetensors"));
    st_file_t f;
    TRY(st_open(&f, path));
    const char *names[3] = {"master", "exp_avg", "exp_avg_sq"};
    float *bufs[3] = {tr->o.master, tr->o.m1, tr->o.m2};
    float *h = malloc((size_t)tr->o.n * sizeof(float));
    if (!h) rc = err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; i < 3 && rc == 0; i++) {
        const st_tensor_t *t = st_find(&f, names[i]);
        if (!t || t->ndim != 1 || t->shape[0] != tr->o.n)
            rc = err_set(ERR_INPUT, "%s: tensor %s: expected [%lld] fp32 for this model", path, names[i],
                         (long long)tr->o.n);
        if (rc == 0) rc = st_read_f32(&f, t, h);
        if (rc == 0) rc = tr->be->copy_h2d(tr->be, bufs[i], h, (size_t)tr->o.n * sizeof(float));
    }
    free(h);
    st_close(&f);
    return rc;
}

// metrics.jsonl keeps the lines up to the resumed step (a killed run may have
// logged steps after its last checkpoint; they are run again).
static int trim_metrics(const char *path, int64_t step, plot_series_t *curve) {
    char *buf;
    size_t len;
    if (!fs_exists(path)) return 0;
    TRY(fs_read_all(path, &buf, &len));
    size_t keep = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) break;
        long long s;
        double loss;
        if (sscanf(buf + i, "{\"step\": %lld, \"loss\": %lf", &s, &loss) != 2 || s > step) break;
        plot_add(curve, (double)s, loss);
        i = keep = (size_t)(nl - buf) + 1;
    }
    int rc = fs_write_all(path, buf, keep);
    free(buf);
    return rc;
}

// ---- the loop ------------------------------------------------------------------

static void progress(int64_t step, int64_t total, double elapsed, int64_t done_here) {
    if (!isatty(2)) return;
    int w = 30, fill = total ? (int)(w * step / total) : w;
    double eta = done_here ? elapsed / done_here * (total - step) : 0;
    fprintf(stderr, "\r[");
    for (int i = 0; i < w; i++)
        fputc(i < fill ? '=' : (i == fill ? '>' : ' '), stderr);
    fprintf(stderr, "] %lld/%lld  ETA %dm%02ds ", (long long)step, (long long)total, (int)eta / 60, (int)eta % 60);
    fflush(stderr);
}

static int keep_not_embed(const char *name) {
    return strcmp(name, "model.embed_tokens.weight") && strcmp(name, "lm_head.weight");
}
// X-EcoMLA's freeze_non_mla: only parameters whose name contains "mla" train.
static int keep_mla(const char *name) { return strstr(name, "mla") != NULL; }

static int run_loop(trainer_t *tr, FILE *metrics) {
    const train_cfg_t *c = tr->c;
    be_t *be = tr->be;
    int64_t N = (int64_t)c->B * c->T;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    if (!ids || !tgt) {
        free(ids), free(tgt);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int rc = 0;
    double t_start = time_now(), t_log = t_start;
    int64_t tok_log = 0, first = tr->o.step;
    distill_loss_t acc = {0};
    int is_cuda = be->kind == BE_CUDA;
    while (rc == 0 && tr->o.step < tr->total_steps) {
        if (c->stop && *c->stop) break;
        TRY(optim_zero_grad(&tr->o, &tr->s));
        distill_loss_t st = {0};
        for (int k = 0; k < c->GA && rc == 0; k++) {
            for (int b = 0; b < c->B && rc == 0; b++)
                rc = data_loader_next(tr->dl, ids + (int64_t)b * c->T, tgt + (int64_t)b * c->T);
            distill_loss_t l;
            if (rc == 0) rc = micro_step(tr, ids, tgt, c->B, &l);
            if (rc == 0) {
                st.kl += l.kl, st.ce += l.ce, st.ild_h += l.ild_h, st.ild_a += l.ild_a;
                st.n_tok += l.n_tok, st.n_ce += l.n_ce;
            }
        }
        if (rc < 0) break;
        double gnorm;
        TRY(optim_grad_norm(&tr->o, &tr->s, &gnorm));
        if (!isfinite(gnorm)) {
            rc = err_set(ERR_RUNTIME,
                         "step %lld: the gradient norm is %g (the loss diverged; the last checkpoint is "
                         "intact)",
                         (long long)tr->o.step + 1, gnorm);
            break;
        }
        float clip = c->max_grad_norm > 0 && gnorm > c->max_grad_norm ? (float)(c->max_grad_norm / (gnorm + 1e-6)) : 1;
        double lr = lr_at(c->sched, c->lr, tr->o.step, tr->warmup, tr->total_steps);
        TRY(optim_step(&tr->o, &tr->s, (float)lr, clip));
        tr->tokens_seen += st.n_tok;
        tok_log += st.n_tok;
        acc.kl += st.kl, acc.ce += st.ce, acc.ild_h += st.ild_h, acc.ild_a += st.ild_a;
        acc.n_tok += st.n_tok, acc.n_ce += st.n_ce;
        int64_t step = tr->o.step;
        if (step % c->logging_steps == 0 || step == tr->total_steps) {
            TRY(be->sync(be));
            double now = time_now(), dt = now - t_log;
            double tps = tok_log / (dt > 0 ? dt : 1e-9);
            // the optimised objective, averaged over the logging window
            double loss, n_steps = (double)acc.n_tok / N / c->GA;
            if (c->ild) {
                loss = (acc.ild_h + acc.ild_a) / acc.n_tok;
            } else {
                loss = c->kl_weight * acc.kl / (c->B * c->GA * n_steps);
                if (c->ce_weight > 0 && acc.n_ce) loss += c->ce_weight * acc.ce / acc.n_ce;
            }
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            double mem_gib = is_cuda ? (double)(tr->o.n * (4.0 * 4) + tr->s.pt.total * be->act_size +
                                                (tr->have_t ? tr->t.pt.total * be->act_size : 0) + tr->rs.arena.peak +
                                                tr->rt.arena.peak) /
                                           (1 << 30)
                                     : ru.ru_maxrss / 1048576.0;
            char extra[160] = "";
            if (is_cuda) snprintf(extra, sizeof extra, "  MFU %.1f%%", 100.0 * tps * tr->flops_per_token / 989.4e12);
            if (isatty(2)) fputc('\n', stderr);
            if (c->ild)
                printf("step %6lld  loss %.5f  (hidden %.5f  mixer %.5f)  lr %.3e  gnorm %.3f  %.0f tok/s%s  mem %.2f "
                       "GiB\n",
                       (long long)step, loss, acc.ild_h / acc.n_tok, acc.ild_a / acc.n_tok, lr, gnorm, tps, extra,
                       mem_gib);
            else
                printf("step %6lld  loss %.5f  (KL/token %.5f  CE %.4f)  lr %.3e  gnorm %.3f  %.0f tok/s%s  mem %.2f "
                       "GiB\n",
                       (long long)step, loss, acc.kl / acc.n_tok, acc.n_ce ? acc.ce / acc.n_ce : 0.0, lr, gnorm, tps,
                       extra, mem_gib);
            fflush(stdout);
            fprintf(metrics,
                    "{\"step\": %lld, \"loss\": %.9g, \"kl_per_token\": %.9g, \"ce\": %.9g, \"ild_hidden\": %.9g, "
                    "\"ild_mixer\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %lld, \"tokens_per_s\": %.1f, "
                    "\"mem_gib\": %.3f}\n",
                    (long long)step, loss, acc.kl / acc.n_tok, acc.n_ce ? acc.ce / acc.n_ce : 0.0,
                    acc.ild_h / acc.n_tok, acc.ild_a / acc.n_tok, lr, gnorm, (long long)tr->tokens_seen, tps, mem_gib);
            fflush(metrics);
            plot_add(&tr->curve, (double)step, loss);
            memset(&acc, 0, sizeof acc);
            tok_log = 0, t_log = time_now();
        }
        progress(step, tr->total_steps, time_now() - t_start, step - first);
        if (c->save_steps > 0 && step % c->save_steps == 0 && step < tr->total_steps) {
            char nm[64];
            snprintf(nm, sizeof nm, "checkpoint-%lld", (long long)step);
            TRY(save_checkpoint(tr, nm));
            t_log = time_now(); // the save is not training time
        }
    }
    if (isatty(2)) fputc('\n', stderr);
    free(ids), free(tgt);
    if (rc < 0) return rc;
    // the last step (or where a stop request left it)
    char nm[64];
    snprintf(nm, sizeof nm, "checkpoint-%lld", (long long)tr->o.step);
    TRY(save_checkpoint(tr, nm));
    TRY(link_final(c->out_dir, nm));
    if (c->stop && *c->stop) log_info("stopped at step %lld on request; resume with --resume", (long long)tr->o.step);
    return 0;
}

int train_run(const train_cfg_t *c) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    tr.c = c;
    int rc = 0;
    if (!c->student[0]) return err_set(ERR_INPUT, "no student: set model_name_or_path");
    if (!c->data[0]) return err_set(ERR_INPUT, "no training data: set dataset_mixer to {SHARDS: 1.0} (hylo data)");
    if (!c->out_dir[0]) return err_set(ERR_INPUT, "no output_dir");
    if (c->ild && !c->teacher[0]) return err_set(ERR_INPUT, "ILD needs teacher_model_name_or_path");
    if (!c->ild && c->kl_weight > 0 && !c->teacher[0])
        return err_set(ERR_INPUT, "KD with kl_weight %g needs teacher_model_name_or_path", c->kl_weight);
    TRY(fs_mkdir_p(c->out_dir));
    // Where to start: the newest checkpoint when resuming.
    char start[1100];
    snprintf(start, sizeof start, "%s", c->student);
    int64_t steps[4096];
    int n_ck = list_checkpoints(c->out_dir, steps, 4096);
    if (c->resume && n_ck) {
        char nm[64];
        snprintf(nm, sizeof nm, "checkpoint-%lld", (long long)steps[0]);
        TRY(fs_join(start, sizeof start, c->out_dir, nm));
        log_info("resuming from %s", start);
    } else if (c->resume) {
        log_info("--resume: no checkpoint in %s; starting from %s", c->out_dir, c->student);
    } else if (n_ck) {
        return err_set(ERR_INPUT, "%s holds checkpoints already: --resume to continue, or choose another output_dir",
                       c->out_dir);
    }
    size_t scratch = !strcmp(c->device, "cuda") ? (size_t)2 << 30 : (size_t)64 << 20;
    TRY(be_create(&tr.be, c->device, scratch));
    rc = load_tokenizer(&tr.tok, c->student);
    if (rc == 0) rc = load_student(&tr, start);
    if (rc == 0 && c->teacher[0] && (c->ild || c->kl_weight > 0)) {
        rc = model_load(&tr.t, c->teacher, tr.be);
        tr.have_t = rc == 0;
        if (rc == 0 && tr.t.a.V != tr.s.a.V)
            rc = err_set(ERR_INPUT, "%s: teacher vocabulary %d differs from the student's %d", c->teacher, tr.t.a.V,
                         tr.s.a.V);
    }
    if (rc == 0) rc = optim_create(&tr.o, &tr.s);
    if (rc == 0) {
        tr.o.weight_decay = (float)c->weight_decay;
        tr.o.beta1 = (float)c->beta1, tr.o.beta2 = (float)c->beta2, tr.o.eps = (float)c->adam_eps;
        // ILD: the embedding's output is replaced and the logits are not in
        // the loss, so embedding and head take no gradient (hybrid_model.md §9).
        if (c->ild) optim_train_only(&tr.o, &tr.s, keep_not_embed);
        if (c->freeze_non_mla) optim_train_only(&tr.o, &tr.s, keep_mla);
    }
    if (rc == 0 && !(tr.blocks = calloc((size_t)tr.s.a.n_layers, sizeof *tr.blocks)))
        rc = err_set(ERR_NOMEM, "out of memory");
    data_pos_t pos = {0, 0};
    if (rc == 0 && strcmp(start, c->student)) rc = restore_state(&tr, start, &pos);
    if (rc == 0) rc = data_loader_open(&tr.dl, c->data, &tr.tok, c->T, c->seed, 0, 1);
    if (rc == 0 && (pos.epoch || pos.index)) rc = data_loader_seek(tr.dl, pos);
    if (rc == 0) {
        int64_t rows = data_loader_rows(tr.dl), per_step = (int64_t)c->B * c->GA;
        tr.total_steps = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * rows / per_step);
        if (tr.total_steps < 1)
            rc = err_set(ERR_INPUT, "%s: %lld rows of %d tokens make no step of %lld rows", c->data, (long long)rows,
                         c->T + 1, (long long)per_step);
        tr.warmup = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)ceil(c->warmup_ratio * tr.total_steps);
        tr.flops_per_token = 6.0 * (double)ptable_count(&tr.s.pt) + (tr.have_t ? 2.0 * ptable_count(&tr.t.pt) : 0);
        printf("student   %s: %lld parameters (%d layers: %d MLA, %d GDN, %d Mamba-2, %d attention)\n", start,
               (long long)ptable_count(&tr.s.pt), tr.s.a.n_layers, arch_count(&tr.s.a, LAYER_MLA),
               arch_count(&tr.s.a, LAYER_GDN), arch_count(&tr.s.a, LAYER_M2), arch_count(&tr.s.a, LAYER_ATTN));
        if (tr.have_t) printf("teacher   %s: %lld parameters\n", c->teacher, (long long)ptable_count(&tr.t.pt));
        printf("data      %s: %lld tokens, %lld rows of %d\n", c->data, (long long)data_loader_tokens(tr.dl),
               (long long)rows, c->T);
        printf("steps     %lld of %lld rows (%lld tokens each), warm-up %lld, from step %lld\n",
               (long long)tr.total_steps, (long long)per_step, (long long)per_step * c->T, (long long)tr.warmup,
               (long long)tr.o.step);
    }
    size_t as = 0, at = 0;
    if (rc == 0) rc = plan_arenas(&tr, &as, &at);
    if (rc == 0) {
        printf("memory    activation plan: student %.1f MiB, teacher %.1f MiB, op scratch %.1f MiB (B %d x T %d%s)\n",
               as / 1048576.0, at / 1048576.0, tr.be->scratch.cap / 1048576.0, c->B, c->T,
               c->recompute ? ", recomputing blocks" : "");
        rc = model_run_create(&tr.rs, &tr.s, as);
        if (rc == 0 && tr.have_t) rc = model_run_create(&tr.rt, &tr.t, at);
    }
    FILE *metrics = NULL;
    char mpath[1100];
    if (rc == 0) rc = fs_join(mpath, sizeof mpath, c->out_dir, "metrics.jsonl");
    if (rc == 0) rc = trim_metrics(mpath, tr.o.step, &tr.curve);
    if (rc == 0 && !(metrics = fopen(mpath, "a"))) rc = err_set(ERR_IO, "%s: cannot open: %s", mpath, strerror(errno));
    fflush(stdout);
    if (rc == 0) rc = run_loop(&tr, metrics);
    if (metrics) fclose(metrics);
    if (rc == 0) {
        char svg[1100];
        if (fs_join(svg, sizeof svg, c->out_dir, "loss.svg") == 0)
            rc = plot_write_svg(&tr.curve, svg, c->ild ? "ILD loss" : "KD loss");
    }
    plot_free(&tr.curve);
    data_loader_close(tr.dl);
    free(tr.blocks);
    if (tr.o.n) optim_free(&tr.o, &tr.s);
    model_run_free(&tr.rs);
    model_run_free(&tr.rt);
    if (tr.t.be) model_free(&tr.t);
    if (tr.s.be) model_free(&tr.s);
    tok_free(&tr.tok);
    be_destroy(tr.be);
    return rc;
}
