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
    dist_t *d;          // the ranks (c->dist, or `single`)
    dist_t single;      // a run of one process
    int64_t saved_step; // the step of the newest checkpoint (-1: none)
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

// CE targets (>= 0) among n.
static int64_t count_ce(const int32_t *tgt, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        k += tgt[i] >= 0;
    return k;
}

// One distillation micro-batch on the runs (rt NULL: no teacher). The loss is
// normalised by the global micro-batch (B rows on each of `world` ranks;
// n_ce_all CE targets over all of them), so that the gradients summed over
// the ranks are those of one rank running all the rows.
static int micro_step(const train_cfg_t *c, model_run_t *rs, model_run_t *rt, float *grad, block_saved_t *blocks,
                      const int32_t *ids, const int32_t *tgt, int B, int world, int64_t n_ce_all,
                      const grad_done_t *done, distill_loss_t *l) {
    distill_t d = {rs, rt, grad, c->recompute, c->ild_mode, blocks, done};
    double rows = (double)B * world;
    if (c->ild) return distill_ild(&d, ids, B, c->T, (float)(1.0 / (rows * c->T * c->GA)), l);
    // KL "batchmean" (per sequence) as the published runs; CE a token mean.
    float kl = (float)(c->kl_weight / (rows * c->GA));
    float ce = n_ce_all ? (float)(c->ce_weight / ((double)n_ce_all * c->GA)) : 0.0f;
    return distill_kd(&d, ids, tgt, B, c->T, kl, ce, l);
}

// Probes of the plan: a micro-batch of B x T rows fills an arena whose peak is
// sum_i round256(B T c_i) + const (every saved tensor and temporary is c_i
// bytes per token, c_i a multiple of 2; the GDN / Mamba-2 initial states and
// the loss slots are constants). At B T a multiple of 128 nothing is rounded,
// so two such lengths give the line exactly.
enum { PLAN_T0 = 128, PLAN_T1 = 256 };

int train_plan(const train_cfg_t *c, be_t *be, model_t *s, model_t *t, optim_t *o, train_plan_t *p) {
    memset(p, 0, sizeof *p);
    // T <= PLAN_T1: one probe at T itself, exact.
    p->n_probe = c->T <= PLAN_T1 ? 1 : 2;
    p->Ts[0] = p->n_probe == 1 ? c->T : PLAN_T0, p->Ts[1] = p->n_probe == 1 ? c->T : PLAN_T1;
    int Tmax = p->Ts[1];
    size_t probe = (size_t)64 << 20; // doubled until the probe step fits
    int64_t n = (int64_t)c->B * Tmax;
    int32_t *ids = malloc((size_t)n * sizeof(int32_t)), *tgt = malloc((size_t)n * sizeof(int32_t));
    block_saved_t *blocks = calloc((size_t)s->a.n_layers, sizeof *blocks);
    if (!ids || !tgt || !blocks) {
        free(ids), free(tgt), free(blocks);
        return err_set(ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7919) % s->a.V), tgt[i] = (int32_t)((i * 104729 + 1) % s->a.V);
    int rc = 0;
    for (int k = 0; k < p->n_probe && rc == 0; k++) {
        train_cfg_t cc = *c;
        cc.T = p->Ts[k];
        for (;;) {
            be->scratch.peak = 0;
            model_run_t rs, rt;
            memset(&rt, 0, sizeof rt);
            // the teacher has no arena of its own: its forward runs in the student's (distill.c)
            rc = model_run_create(&rs, s, probe);
            if (rc == 0 && t) rc = model_run_create(&rt, t, 0);
            distill_loss_t l;
            if (rc == 0)
                rc = micro_step(&cc, &rs, t ? &rt : NULL, o->grad, blocks, ids, tgt, c->B, 1,
                                count_ce(tgt, (int64_t)c->B * cc.T), NULL, &l);
            p->peak[k] = rs.arena.peak, p->teacher_peak[k] = rt.arena.peak, p->scratch_peak[k] = be->scratch.peak;
            p->scratch_loss[k] = rc == 0 ? l.scratch_loss : 0, p->scratch_rest[k] = rc == 0 ? l.scratch_rest : 0;
            p->n_alloc = rs.arena.n_alloc;
            int full = rc == ERR_NOMEM && rs.arena.overflowed;
            model_run_free(&rs);
            model_run_free(&rt);
            if (!full || probe >= ((size_t)1 << 36)) break;
            probe *= 2; // the arena ran full: measure again with more room
            rc = optim_zero_grad(o, s);
            if (rc < 0) break;
        }
    }
    free(ids), free(tgt), free(blocks);
    if (p->n_probe == 1)
        p->peak[1] = p->peak[0], p->teacher_peak[1] = p->teacher_peak[0], p->scratch_peak[1] = p->scratch_peak[0],
        p->scratch_loss[1] = p->scratch_loss[0], p->scratch_rest[1] = p->scratch_rest[0];
    if (rc == 0) rc = optim_zero_grad(o, s);
    if (rc < 0) return err_wrap(rc, "measuring the activation plan: ");
    // The line through the probes, at T (exact when B T is a multiple of 128),
    // plus the rounding of every allocation live at the peak (< 256 bytes
    // each; n_alloc, all the longest probe's allocations, bounds their count).
    size_t d = p->peak[1] - p->peak[0];
    int64_t dT = (int64_t)p->Ts[1] - p->Ts[0];
    p->arena = p->peak[1] + (dT ? (d * (size_t)(c->T - p->Ts[1]) + (size_t)dT - 1) / (size_t)dT : 0);
    if (p->n_probe == 2) p->arena += 256 * p->n_alloc;
    // The ops' scratch grows with T too. The fused losses' part stops growing
    // at be->loss_rows_max rows (a line to all N rows was 513 KB per token at
    // V 128K: 32 GiB at 64K); the rest (chunked recurrences, attention
    // backward) is a line. Some ops take what is free in it (attention's
    // backward, the losses' chunks), so the margin stays.
    double per_x = dT ? ((double)p->scratch_rest[1] - (double)p->scratch_rest[0]) / dT : 0;
    double need_x = p->scratch_rest[1] + (per_x > 0 ? per_x : 0) * (c->T - p->Ts[1]);
    int64_t rmax = be->loss_rows_max(be, s->a.V), rows[3];
    int64_t Ns[3] = {(int64_t)c->B * p->Ts[0], (int64_t)c->B * p->Ts[1], (int64_t)c->B * c->T};
    for (int i = 0; i < 3; i++)
        rows[i] = Ns[i] < rmax ? Ns[i] : rmax;
    double per_row =
        rows[1] > rows[0] ? ((double)p->scratch_loss[1] - (double)p->scratch_loss[0]) / (rows[1] - rows[0]) : 0;
    double need_l = p->scratch_loss[1] + (per_row > 0 && rows[2] > rows[1] ? per_row * (rows[2] - rows[1]) : 0);
    if (need_l > need_x) need_x = need_l;
    p->scratch = (size_t)(need_x * 1.05) + ((size_t)64 << 20);
    return 0;
}

// ---- checkpoints ---------------------------------------------------------------

typedef struct {
    trainer_t *tr;
    int64_t epoch, index; // the data position: positions of the epoch's order taken by all ranks together
    float *opt[3];        // master, exp_avg, exp_avg_sq [n] (host), gathered from every rank's slice
} save_ctx_t;

static int write_state(const char *tmp, void *user) {
    save_ctx_t *sc = user;
    trainer_t *tr = sc->tr;
    const train_cfg_t *c = tr->c;
    int64_t n = tr->o.n;
    // optimizer.safetensors: both AdamW moments of each trainable parameter,
    // named exp_avg.NAME / exp_avg_sq.NAME with the parameter's shape, whatever
    // the number of ranks that held them. Frozen parameters' moments stay zero
    // and are not written; the fp32 master weights are model.safetensors.
    const ptable_t *pt = &tr->s.pt;
    st_writer_t w;
    st_writer_init(&w);
    const char *names[2] = {"exp_avg", "exp_avg_sq"};
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        for (int i = 0; i < pt->n && rc == 0; i++) {
            if (!tr->o.trainable[i]) continue;
            char nm[320];
            snprintf(nm, sizeof nm, "%s.%s", names[k], pt->p[i].name);
            rc = st_writer_add(&w, nm, ST_F32, pt->p[i].nd, pt->p[i].shape, sc->opt[k + 1] + pt->p[i].off);
        }
    char path[1100];
    if (rc == 0) rc = fs_join(path, sizeof path, tmp, "optimizer.safetensors");
    if (rc == 0) rc = st_writer_write(&w, path, NULL);
    st_writer_free(&w);
    if (rc < 0) return rc;
    char js[2048];
    int len = snprintf(js, sizeof js,
                       "{\n  \"global_step\": %lld,\n  \"max_steps\": %lld,\n  \"tokens_seen\": %lld,\n"
                       "  \"data_epoch\": %lld,\n  \"data_index\": %lld,\n  \"seed\": %llu,\n"
                       "  \"stage\": \"%s\",\n  \"max_seq_length\": %d,\n  \"per_device_train_batch_size\": %d,\n"
                       "  \"gradient_accumulation_steps\": %d,\n  \"world_size\": %d,\n  \"parameters\": %lld\n}\n",
                       (long long)tr->o.step, (long long)tr->total_steps, (long long)tr->tokens_seen,
                       (long long)sc->epoch, (long long)sc->index, (unsigned long long)c->seed, c->ild ? "ild" : "kd",
                       c->T, c->B, c->GA, tr->d->world, (long long)n);
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

// Every rank calls it (each sends its slice of the optimizer state); rank 0
// writes.
static int save_checkpoint(trainer_t *tr, const char *name) {
    const train_cfg_t *c = tr->c;
    model_t *m = &tr->s;
    if (tr->o.step == tr->saved_step) return 0; // this step is saved already (the last periodic save)
    int root = tr->d->rank == 0;
    data_pos_t pos = data_loader_pos(tr->dl);
    save_ctx_t sc = {tr, pos.epoch, pos.index * tr->d->world, {NULL, NULL, NULL}};
    int rc = 0;
    char dir[1100] = "";
    for (int i = 0; i < 3 && root && rc == 0; i++)
        if (!(sc.opt[i] = malloc((size_t)tr->o.n * sizeof(float))))
            rc = err_set(ERR_NOMEM, "checkpoint: %lld parameters", (long long)tr->o.n);
    if (rc == 0) rc = optim_gather(&tr->o, m, sc.opt[0], sc.opt[1], sc.opt[2]);
    if (rc == 0) rc = fs_join(dir, sizeof dir, c->out_dir, name);
    if (rc == 0 && root && !fs_exists(dir))
        rc = ckpt_write_with(dir, &m->a, &m->pt, sc.opt[0], ST_F32, &tr->tok, NULL, write_state, &sc);
    for (int i = 0; i < 3; i++)
        free(sc.opt[i]);
    if (rc < 0) return err_wrap(rc, "saving %s (the previous checkpoints are intact): ", dir);
    tr->saved_step = tr->o.step;
    if (!root) return 0;
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

// Restores the optimizer (this rank's slice) and the data position (pos:
// the epoch and the positions of its order that all ranks took together)
// from checkpoint dir, written by any number of ranks (the student's weights
// were loaded from it already).
static int restore_state(trainer_t *tr, const char *dir, data_pos_t *pos, int *world) {
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
    // checkpoints from before data-parallel runs: one rank
    cJSON *ws = cJSON_GetObjectItemCaseSensitive(root, "world_size");
    *world = 1;
    if (rc == 0 && ws && (!cJSON_IsNumber(ws) || ws->valuedouble < 1 || ws->valuedouble > 1 << 20))
        rc = err_set(ERR_INPUT, "%s: world_size: expected a number of ranks", path);
    else if (ws)
        *world = (int)ws->valuedouble;
    cJSON_Delete(root);
    TRY(rc);
    tr->o.step = (int64_t)v[0], tr->tokens_seen = (int64_t)v[1];
    pos->epoch = (int64_t)v[2], pos->index = (int64_t)v[3];
    // The fp32 master weights from model.safetensors, each trainable
    // parameter's moments from optimizer.safetensors (frozen ones stay zero).
    const ptable_t *pt = &tr->s.pt;
    float *h = malloc((size_t)tr->o.n * sizeof(float));
    if (!h) return err_set(ERR_NOMEM, "checkpoint: %lld parameters", (long long)tr->o.n);
    const char *files[2] = {"model.safetensors", "optimizer.safetensors"};
    for (int fi = 0; fi < 2 && rc == 0; fi++) {
        st_file_t f;
        rc = fs_join(path, sizeof path, dir, files[fi]);
        if (rc == 0) rc = st_open(&f, path);
        if (rc < 0) break;
        const char *names[3] = {NULL, "exp_avg", "exp_avg_sq"};
        for (int k = fi ? 1 : 0; k < (fi ? 3 : 1) && rc == 0; k++) {
            memset(h, 0, (size_t)tr->o.n * sizeof(float));
            for (int i = 0; i < pt->n && rc == 0; i++) {
                const param_t *p = &pt->p[i];
                if (k && !tr->o.trainable[i]) continue;
                char nm[320];
                snprintf(nm, sizeof nm, "%s%s%s", k ? names[k] : "", k ? "." : "", p->name);
                const st_tensor_t *t = st_find(&f, nm);
                int64_t numel = 1;
                for (int d = 0; d < p->nd; d++)
                    numel *= p->shape[d];
                if (!t || t->dtype != ST_F32 || t->numel != numel)
                    rc = err_set(ERR_INPUT, "%s: tensor %s: expected fp32 of %lld elements for this model and stage",
                                 path, nm, (long long)numel);
                else
                    rc = st_read_f32(&f, t, h + p->off);
            }
            if (rc == 0) rc = optim_load(&tr->o, &tr->s, k, h);
        }
        st_close(&f);
    }
    free(h);
    return rc;
}

// This rank's place in the data from the position all ranks reached
// together, saved by a run of `saved_world` ranks. The same number of ranks
// continues exactly; another number continues at the same global position
// of the same epoch order (rounded down to a multiple of the ranks), but the
// rows left out at each epoch's end (rows % world) differ.
static int seek_data(trainer_t *tr, data_pos_t global, int saved_world) {
    int world = tr->d->world;
    data_pos_t p = {global.epoch, global.index / world};
    if (global.index % world)
        log_warn("the checkpoint's data position %lld (by %d ranks) is not a multiple of %d ranks: %lld rows are "
                 "taken again",
                 (long long)global.index, saved_world, world, (long long)(global.index % world));
    if (p.index >= data_loader_rows(tr->dl)) p.epoch++, p.index = 0; // that epoch's rows are all taken
    if (saved_world != world)
        log_info("resuming a run of %d ranks on %d: the same global data order from position %lld of epoch %lld "
                 "(docs/TRAINING.md: not bitwise the same as continuing on %d)",
                 saved_world, world, (long long)global.index, (long long)global.epoch, saved_world);
    return p.epoch || p.index ? data_loader_seek(tr->dl, p) : 0;
}

// metrics.jsonl keeps the lines up to the resumed step (a killed run may have
// logged steps after its last checkpoint; they are run again). A line that is
// not a metrics record ends what is kept, with a warning saying what went.
static int trim_metrics(const char *path, int64_t step, plot_series_t *curve) {
    char *buf;
    size_t len;
    if (!fs_exists(path)) return 0;
    TRY(fs_read_all(path, &buf, &len));
    size_t keep = 0;
    int64_t line = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) break;
        cJSON *o = cJSON_ParseWithLength(buf + i, (size_t)(nl - buf - i));
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(o, "step"),
                    *jl = cJSON_GetObjectItemCaseSensitive(o, "loss");
        int ok = cJSON_IsNumber(js) && cJSON_IsNumber(jl);
        double s = ok ? js->valuedouble : 0, loss = ok ? jl->valuedouble : 0;
        cJSON_Delete(o);
        line++;
        if (!ok) {
            log_warn("%s:%lld: not a metrics record; it and the %zu bytes after it are dropped", path, (long long)line,
                     len - i);
            break;
        }
        if (s > (double)step) break;
        plot_add(curve, s, loss);
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

// The backward's news of a finished layer (grad_done_t): its gradient starts
// its reduction over the ranks.
static int reduce_layer(void *ctx, int layer) { return optim_reduce_layer(ctx, layer); }

static int run_loop(trainer_t *tr, FILE *metrics) {
    const train_cfg_t *c = tr->c;
    be_t *be = tr->be;
    int64_t N = (int64_t)c->B * c->T;
    int world = tr->d->world, root = tr->d->rank == 0;
    int kd_ce = !c->ild && c->ce_weight > 0; // the CE token mean needs the global count of targets
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    if (!ids || !tgt) {
        free(ids), free(tgt);
        return err_set(ERR_NOMEM, "out of memory");
    }
    int rc = 0, stop = 0;
    double t_start = time_now(), t_log = t_start;
    int64_t tok_log = 0, first = tr->o.step;
    distill_loss_t acc = {0};
    int is_cuda = be->kind == BE_CUDA;
    // with more than one rank (or --force-collectives), the last micro-batch of a step reduces each
    // layer's gradient as soon as its backward is done
    const grad_done_t reduce = {reduce_layer, &tr->o};
    while (rc == 0 && tr->o.step < tr->total_steps) {
        if (stop) break;
        TRY(optim_zero_grad(&tr->o, &tr->s));
        distill_loss_t st = {0};
        for (int k = 0; k < c->GA && rc == 0; k++) {
            for (int b = 0; b < c->B && rc == 0; b++)
                rc = data_loader_next(tr->dl, ids + (int64_t)b * c->T, tgt + (int64_t)b * c->T);
            distill_loss_t l;
            double n_ce = kd_ce ? (double)count_ce(tgt, N) : 0;
            if (rc == 0 && kd_ce) rc = dist_sum(tr->d, &n_ce, 1);
            if (rc == 0)
                rc = micro_step(c, &tr->rs, tr->have_t ? &tr->rt : NULL, tr->o.grad, tr->blocks, ids, tgt, c->B, world,
                                (int64_t)n_ce, dist_active(tr->d) && k == c->GA - 1 ? &reduce : NULL, &l);
            if (rc == 0) {
                st.kl += l.kl, st.ce += l.ce, st.ild_h += l.ild_h, st.ild_a += l.ild_a;
                st.n_tok += l.n_tok, st.n_ce += l.n_ce;
            }
        }
        if (rc < 0) break;
        // The step's sums over all ranks, and whether any rank was asked to stop.
        double sums[7] = {
            st.kl, st.ce, st.ild_h, st.ild_a, (double)st.n_tok, (double)st.n_ce, c->stop && *c->stop ? 1.0 : 0.0};
        TRY(dist_sum(tr->d, sums, 7));
        st.kl = sums[0], st.ce = sums[1], st.ild_h = sums[2], st.ild_a = sums[3];
        st.n_tok = (int64_t)sums[4], st.n_ce = (int64_t)sums[5], stop = sums[6] > 0;
        TRY(optim_reduce_wait(&tr->o));
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
            double loss, n_steps = (double)acc.n_tok / ((double)N * world) / c->GA;
            if (c->ild) {
                loss = (acc.ild_h + acc.ild_a) / acc.n_tok;
            } else {
                loss = c->kl_weight * acc.kl / ((double)c->B * world * c->GA * n_steps);
                if (c->ce_weight > 0 && acc.n_ce) loss += c->ce_weight * acc.ce / acc.n_ce;
            }
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            // per rank: the whole gradient, the optimizer state of its slice
            // (the teacher's forward runs inside the student's arena: its peak covers both)
            double mem_gib = is_cuda ? (double)(tr->o.S * (4.0 * (3 + world)) + tr->s.pt.total * be->act_size +
                                                (tr->have_t ? tr->t.pt.total * be->act_size : 0) + tr->rs.arena.peak +
                                                be->scratch.peak) /
                                           (1 << 30)
                                     : ru.ru_maxrss / 1048576.0;
            char extra[160] = "";
            if (is_cuda)
                snprintf(extra, sizeof extra, "  MFU %.1f%%", 100.0 * tps * tr->flops_per_token / (989.4e12 * world));
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
            if (root)
                fprintf(
                    metrics,
                    "{\"step\": %lld, \"loss\": %.9g, \"kl_per_token\": %.9g, \"ce\": %.9g, \"ild_hidden\": %.9g, "
                    "\"ild_mixer\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %lld, \"tokens_per_s\": %.1f, "
                    "\"mem_gib\": %.3f}\n",
                    (long long)step, loss, acc.kl / acc.n_tok, acc.n_ce ? acc.ce / acc.n_ce : 0.0,
                    acc.ild_h / acc.n_tok, acc.ild_a / acc.n_tok, lr, gnorm, (long long)tr->tokens_seen, tps, mem_gib);
            if (root) fflush(metrics);
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
    if (root) TRY(link_final(c->out_dir, nm));
    if (stop) log_info("stopped at step %lld on request; resume with --resume", (long long)tr->o.step);
    return 0;
}

int train_run(const train_cfg_t *c) {
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    tr.c = c;
    tr.saved_step = -1;
    if (c->dist) {
        tr.d = c->dist;
    } else {
        dist_single(&tr.single);
        tr.d = &tr.single;
    }
    int rc = 0;
    if (!c->student[0]) return err_set(ERR_INPUT, "no student: set model_name_or_path");
    if (!c->n_data) return err_set(ERR_INPUT, "no training data: set dataset_mixer to {SHARDS: 1.0} (hylo data)");
    if (!c->out_dir[0]) return err_set(ERR_INPUT, "no output_dir");
    if (c->ild && !c->teacher[0]) return err_set(ERR_INPUT, "ILD needs teacher_model_name_or_path");
    if (!c->ild && c->kl_weight > 0 && !c->teacher[0])
        return err_set(ERR_INPUT, "KD with kl_weight %g needs teacher_model_name_or_path", c->kl_weight);
    TRY(fs_mkdir_p(c->out_dir));
    int root = tr.d->rank == 0;
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
    TRY(dist_use_device(tr.d, c->device));
    TRY(be_create(&tr.be, c->device, scratch));
    tr.be->deterministic = c->deterministic;
    rc = dist_attach(tr.d, tr.be);
    if (rc == 0) rc = load_tokenizer(&tr.tok, c->student);
    if (rc == 0) rc = load_student(&tr, start);
    if (rc == 0 && c->teacher[0] && (c->ild || c->kl_weight > 0)) {
        rc = model_load(&tr.t, c->teacher, tr.be);
        tr.have_t = rc == 0;
        if (rc == 0 && tr.t.a.V != tr.s.a.V)
            rc = err_set(ERR_INPUT, "%s: teacher vocabulary %d differs from the student's %d", c->teacher, tr.t.a.V,
                         tr.s.a.V);
    }
    if (rc == 0) rc = optim_create(&tr.o, &tr.s, tr.d);
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
    int saved_world = tr.d->world;
    if (rc == 0 && strcmp(start, c->student)) {
        rc = restore_state(&tr, start, &pos, &saved_world);
        tr.saved_step = tr.o.step;
    }
    // each rank its own slice of the rows (data.h)
    data_source_t srcs[TRAIN_MAX_SOURCES];
    for (int i = 0; i < c->n_data; i++)
        srcs[i] = (data_source_t){c->data[i], c->data_weight[i]};
    if (rc == 0) rc = data_loader_open_mix(&tr.dl, srcs, c->n_data, &tr.tok, c->T, c->seed, tr.d->rank, tr.d->world);
    if (rc == 0) rc = seek_data(&tr, pos, saved_world);
    if (rc == 0) {
        int64_t rows = data_loader_rows(tr.dl), per_step = (int64_t)c->B * c->GA;
        tr.total_steps = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * rows / per_step);
        if (tr.total_steps < 1)
            rc = err_set(ERR_INPUT, "%s: %lld rows of %d tokens make no step of %lld rows", c->data[0], (long long)rows,
                         c->T + 1, (long long)per_step);
        tr.warmup = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)ceil(c->warmup_ratio * tr.total_steps);
        tr.flops_per_token = 6.0 * (double)ptable_count(&tr.s.pt) + (tr.have_t ? 2.0 * ptable_count(&tr.t.pt) : 0);
        printf("student   %s: %lld parameters (%d layers: %d MLA, %d GDN, %d Mamba-2, %d attention)\n", start,
               (long long)ptable_count(&tr.s.pt), tr.s.a.n_layers, arch_count(&tr.s.a, LAYER_MLA),
               arch_count(&tr.s.a, LAYER_GDN), arch_count(&tr.s.a, LAYER_M2), arch_count(&tr.s.a, LAYER_ATTN));
        if (tr.have_t) printf("teacher   %s: %lld parameters\n", c->teacher, (long long)ptable_count(&tr.t.pt));
        printf("data      %s%s: %lld tokens, %lld rows of %d%s\n", c->data[0], c->n_data > 1 ? " ..." : "",
               (long long)data_loader_tokens(tr.dl), (long long)rows * tr.d->world, c->T,
               tr.d->world > 1 ? " (a slice per rank)" : "");
        if (tr.d->world > 1)
            printf("ranks     %d (data parallel; optimizer state sharded, a slice of %lld of %lld per rank)\n",
                   tr.d->world, (long long)tr.o.S, (long long)tr.o.n);
        printf("steps     %lld of %lld rows (%lld tokens each), warm-up %lld, from step %lld\n",
               (long long)tr.total_steps, (long long)per_step * tr.d->world, (long long)per_step * tr.d->world * c->T,
               (long long)tr.warmup, (long long)tr.o.step);
    }
    train_plan_t plan;
    if (rc == 0) rc = train_plan(c, tr.be, &tr.s, tr.have_t ? &tr.t : NULL, &tr.o, &plan);
    if (rc == 0) rc = be_scratch_resize(tr.be, plan.scratch); // the plan's size, smaller or larger
    if (rc == 0) {
        printf("memory    activation plan: one arena of %.1f MiB (the teacher's forward inside it, %.1f MiB of it), "
               "op scratch %.1f MiB (B %d x T %d%s)\n",
               plan.arena / 1048576.0,
               plan.teacher_peak[1] / 1048576.0 * (plan.Ts[1] == c->T ? 1.0 : (double)c->T / plan.Ts[1]),
               tr.be->scratch.cap / 1048576.0, c->B, c->T, c->recompute ? ", recomputing blocks" : "");
        rc = model_run_create(&tr.rs, &tr.s, plan.arena);
        if (rc == 0 && tr.have_t) rc = model_run_create(&tr.rt, &tr.t, 0);
    }
    FILE *metrics = NULL;
    char mpath[1100];
    if (rc == 0) rc = fs_join(mpath, sizeof mpath, c->out_dir, "metrics.jsonl");
    // the log, metrics and plot are rank 0's
    if (rc == 0 && root) rc = trim_metrics(mpath, tr.o.step, &tr.curve);
    if (rc == 0 && root && !(metrics = fopen(mpath, "a")))
        rc = err_set(ERR_IO, "%s: cannot open: %s", mpath, strerror(errno));
    fflush(stdout);
    if (rc == 0) rc = run_loop(&tr, metrics);
    if (metrics) fclose(metrics);
    if (rc == 0 && root) {
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
