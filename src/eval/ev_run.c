#include "eval/ev_run.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/timer.h"
#include "eval/ev_lmeval.h"
#include "eval/ev_ppl.h"
#include "eval/ev_progress.h"
#include "eval/ev_ruler.h"
#include "eval/ev_text.h"

static const char *file_override(const ev_run_cfg_t *cfg, const char *task) {
    for (int i = 0; i < cfg->n_files; i++)
        if (!strcmp(cfg->file_task[i], task)) return cfg->file_path[i];
    return NULL;
}

static int samples_path(const ev_run_cfg_t *cfg, const char *name, char *out, size_t cap) {
    if (!cfg->samples_dir) return 0;
    TRY(fs_mkdir_p(cfg->samples_dir));
    if ((size_t)snprintf(out, cap, "%s/%s.jsonl", cfg->samples_dir, name) >= cap)
        return err_set(ERR_INPUT, "%s: path too long", cfg->samples_dir);
    return 1;
}

// ---- short tasks -------------------------------------------------------------

static int run_short(ev_lm_t *lm, const ev_run_cfg_t *cfg, cJSON *out) {
    cJSON *tasks = cJSON_AddObjectToObject(out, "tasks");
    if (!tasks) return err_set(ERR_NOMEM, "out of memory");
    int flags = ev_bos_flags(cfg->bos);
    for (int i = 0; i < cfg->n_short; i++) {
        const ev_task_t *t = ev_task_find(cfg->short_tasks[i]);
        if (!t) return err_set(ERR_INPUT, "unknown task '%s'", cfg->short_tasks[i]);
        char path[1100], sp[1100];
        TRY(ev_data_path(&cfg->data, t->name, file_override(cfg, t->name), t->file, t->what, t->origin, path,
                         sizeof path));
        cJSON **rows;
        int n;
        TRY(ev_read_jsonl(path, &rows, &n));
        if (!n) {
            ev_free_jsonl(rows, n);
            return err_set(ERR_INPUT, "%s: %s has no items", t->name, path);
        }
        int have_sp = samples_path(cfg, t->name, sp, sizeof sp);
        if (have_sp < 0) {
            ev_free_jsonl(rows, n);
            return have_sp;
        }
        ev_task_cfg_t tc = {
            .flags = flags, .limit = cfg->limit, .max_gen = cfg->max_gen, .samples_path = have_sp ? sp : NULL};
        ev_task_result_t r;
        int rc = ev_task_run(lm, t, rows, n, &tc, &r);
        ev_free_jsonl(rows, n);
        if (rc < 0) return rc;
        cJSON *o = cJSON_AddObjectToObject(tasks, t->name);
        if (!o) return err_set(ERR_NOMEM, "out of memory");
        cJSON_AddStringToObject(o, "file", path);
        cJSON_AddNumberToObject(o, "items_in_file", n);
        cJSON_AddNumberToObject(o, "n", r.n);
        if (t->kind == EV_GEN) {
            cJSON_AddNumberToObject(o, "exact_match_strict", r.em_strict);
            cJSON_AddNumberToObject(o, "exact_match_strict_stderr", r.em_strict_stderr);
            cJSON_AddNumberToObject(o, "exact_match_flexible", r.em_flexible);
            cJSON_AddNumberToObject(o, "exact_match_flexible_stderr", r.em_flexible_stderr);
            cJSON_AddNumberToObject(o, "generated_tokens", (double)r.gen_tokens);
            cJSON_AddStringToObject(o, "headline", "exact_match_flexible");
        } else {
            cJSON_AddNumberToObject(o, "acc", r.acc);
            cJSON_AddNumberToObject(o, "acc_stderr", r.acc_stderr);
            if (t->kind == EV_MC && strcmp(t->name, "winogrande")) { // lm-eval reports acc alone for WinoGrande
                cJSON_AddNumberToObject(o, "acc_norm", r.acc_norm);
                cJSON_AddNumberToObject(o, "acc_norm_stderr", r.acc_norm_stderr);
            }
            if (t->kind == EV_LASTWORD) cJSON_AddNumberToObject(o, "perplexity", r.perplexity);
            cJSON_AddStringToObject(o, "headline", t->norm ? "acc_norm" : "acc");
        }
        cJSON_AddNumberToObject(o, "truncated", r.truncated);
        cJSON_AddNumberToObject(o, "seconds", r.seconds);
        if (t->kind == EV_GEN)
            log_info("%s: exact match strict %.4f, flexible %.4f (n=%d, %.1f s)", t->name, r.em_strict, r.em_flexible,
                     r.n, r.seconds);
        else if (t->kind == EV_MC && strcmp(t->name, "winogrande"))
            log_info("%s: acc %.4f, acc_norm %.4f (n=%d, %.1f s)", t->name, r.acc, r.acc_norm, r.n, r.seconds);
        else
            log_info("%s: acc %.4f (n=%d, %.1f s)", t->name, r.acc, r.n, r.seconds);
    }
    return 0;
}

// ---- RULER --------------------------------------------------------------------

static int ruler_needs(const ev_run_cfg_t *cfg, int *words, int *hay, int *squad, int *hotpot) {
    *words = *hay = *squad = *hotpot = 0;
    for (int i = 0; i < cfg->n_ruler; i++) {
        const ev_ruler_task_t *t = ev_ruler_find(cfg->ruler_tasks[i]);
        if (!t) return err_set(ERR_INPUT, "unknown RULER task '%s'", cfg->ruler_tasks[i]);
        if ((t->gen == EV_GEN_NIAH && (t->k == EV_KEY_WORDS || t->v == EV_KEY_WORDS)) || t->gen == EV_GEN_CWE)
            *words = 1;
        if (t->gen == EV_GEN_NIAH && t->hay == EV_HAY_ESSAY) *hay = 1;
        if (t->gen == EV_GEN_QA) *(t->qa == 1 ? squad : hotpot) = 1;
    }
    return 0;
}

static cJSON *sample_json(const ev_ruler_sample_t *s, int index, const char *pred, double score) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "input", s->input);
    cJSON_AddItemToObject(o, "outputs", cJSON_CreateStringArray((const char *const *)s->outputs.s, s->outputs.n));
    cJSON_AddNumberToObject(o, "length", s->length);
    cJSON_AddStringToObject(o, "answer_prefix", s->answer_prefix);
    cJSON_AddNumberToObject(o, "haystack", s->n_haystack);
    if (pred) {
        cJSON_AddStringToObject(o, "pred", pred);
        cJSON_AddNumberToObject(o, "score", score);
    }
    return o;
}

static int write_line(afile_t *af, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return err_set(ERR_NOMEM, "out of memory");
    int rc = fs_write(af, s, strlen(s));
    if (rc == 0) rc = fs_write(af, "\n", 1);
    free(s);
    return rc;
}

static int run_ruler(ev_lm_t *lm, const ev_run_cfg_t *cfg, cJSON *out) {
    int need_words, need_hay, need_squad, need_hotpot;
    TRY(ruler_needs(cfg, &need_words, &need_hay, &need_squad, &need_hotpot));
    ev_ruler_data_t d = {0};
    char p[1100];
    int rc = 0;
    if (need_words) {
        rc = ev_data_path(&cfg->data, "ruler", cfg->words, "words/", "the wonderwords adjective/noun/verb lists",
                          "wonderwords 3.0 adjectivelist.txt, nounlist.txt, verblist.txt; pass --words DIR", p,
                          sizeof p);
        if (rc == 0) rc = ev_ruler_load_words(&d, p, cfg->seed);
    }
    if (rc == 0 && need_hay) {
        rc = ev_data_path(&cfg->data, "ruler", cfg->haystack, "essays/", "the essay haystack (a folder of .txt files)",
                          "the 49 Paul Graham essays of gkamradt/LLMTest_NeedleInAHaystack; pass --haystack DIR|FILE",
                          p, sizeof p);
        if (rc == 0) rc = ev_ruler_load_haystack(&d, p);
    }
    // QA needs its file by flag; without one the task is reported missing
    if (rc == 0 && need_squad && cfg->squad) rc = ev_ruler_load_squad(&d, cfg->squad);
    if (rc == 0 && need_hotpot && cfg->hotpot) rc = ev_ruler_load_hotpot(&d, cfg->hotpot);
    cJSON *r = rc == 0 ? cJSON_AddObjectToObject(out, "ruler") : NULL;
    if (rc == 0 && !r) rc = err_set(ERR_NOMEM, "out of memory");
    cJSON *scores = r ? cJSON_AddObjectToObject(r, "scores") : NULL,
          *missing = r ? cJSON_AddObjectToObject(r, "missing") : NULL;
    int flags = ev_bos_flags(cfg->bos);
    ev_progress_t pg;
    int64_t total = 0;
    for (int i = 0; i < cfg->n_ruler; i++) {
        const ev_ruler_task_t *t = ev_ruler_find(cfg->ruler_tasks[i]);
        if (t->gen == EV_GEN_QA && !(t->qa == 1 ? d.have_squad : d.have_hotpot)) continue;
        total += (int64_t)cfg->n_lengths * cfg->ruler_samples;
    }
    if (rc == 0) ev_progress_start(&pg, cfg->generate_only ? "ruler (generate)" : "ruler", total);
    double len_sum[16] = {0};
    int len_n[16] = {0};
    for (int i = 0; rc == 0 && i < cfg->n_ruler; i++) {
        const ev_ruler_task_t *t = ev_ruler_find(cfg->ruler_tasks[i]);
        if (t->gen == EV_GEN_QA && !(t->qa == 1 ? d.have_squad : d.have_hotpot)) {
            cJSON_AddStringToObject(missing, t->name,
                                    t->qa == 1 ? "no SQuAD v2.0 dev file (dev-v2.0.json): pass --squad FILE"
                                               : "no HotpotQA dev distractor file (hotpot_dev_distractor_v1.json): "
                                                 "pass --hotpotqa FILE");
            continue;
        }
        cJSON *ts = cJSON_AddObjectToObject(scores, t->name);
        for (int li = 0; rc == 0 && li < cfg->n_lengths; li++) {
            int L = cfg->lengths[li];
            ev_ruler_cfg_t rcfg = {.tok = lm->tok, .max_len = L, .n_samples = cfg->ruler_samples, .seed = cfg->seed};
            ev_ruler_sample_t *ss = calloc((size_t)cfg->ruler_samples, sizeof *ss);
            if (!ss) {
                rc = err_set(ERR_NOMEM, "out of memory");
                break;
            }
            double t0 = time_now();
            rc = ev_ruler_generate(&d, t, &rcfg, ss);
            if (rc < 0) rc = err_wrap(rc, "ruler %s at %d: ", t->name, L);
            char name[128], sp[1100];
            snprintf(name, sizeof name, "ruler_%s_%d", t->name, L);
            int have_sp = rc == 0 ? samples_path(cfg, name, sp, sizeof sp) : 0;
            if (have_sp < 0) rc = have_sp;
            afile_t af;
            int open = 0;
            if (rc == 0 && have_sp) open = (rc = fs_atomic_open(&af, sp)) == 0;
            double sum = 0, in_tokens = 0;
            int nulls = 0;
            for (int s = 0; rc == 0 && s < cfg->ruler_samples; s++) {
                in_tokens += ss[s].length - t->max_new;
                char *pred = NULL;
                double score = 0;
                if (!cfg->generate_only) {
                    strbuf_t prompt = {0};
                    strbuf_puts(&prompt, ss[s].input);
                    strbuf_puts(&prompt, ss[s].answer_prefix);
                    int32_t *ids = NULL;
                    int n = 0;
                    rc = prompt.oom ? err_set(ERR_NOMEM, "out of memory")
                                    : ev_encode(lm->tok, flags, prompt.s, &ids, &n);
                    free(prompt.s);
                    ev_gen_t g = {0};
                    int max_new =
                        cfg->ruler_max_new > 0 && cfg->ruler_max_new < t->max_new ? cfg->ruler_max_new : t->max_new;
                    if (rc == 0) rc = lm->generate(lm, ids, n, max_new, NULL, 0, &g);
                    free(ids);
                    if (rc == 0) {
                        pred = g.text;
                        ev_ruler_postprocess(pred);
                        nulls += !pred[0];
                        score = t->part ? ev_ruler_match_part(pred, ss[s].outputs.s, ss[s].outputs.n)
                                        : ev_ruler_match_all(pred, ss[s].outputs.s, ss[s].outputs.n);
                        sum += score;
                    }
                }
                if (rc == 0 && open) rc = write_line(&af, sample_json(&ss[s], s, pred, score));
                free(pred);
                ev_progress_add(&pg, 1);
            }
            if (open) {
                if (rc == 0)
                    rc = fs_atomic_commit(&af);
                else
                    fs_atomic_abort(&af);
            }
            if (rc == 0) {
                char key[16];
                snprintf(key, sizeof key, "%d", L);
                cJSON *o = cJSON_AddObjectToObject(ts, key);
                double sc = ev_round2(100.0 * sum / cfg->ruler_samples);
                if (!cfg->generate_only) {
                    cJSON_AddNumberToObject(o, "score", sc);
                    cJSON_AddNumberToObject(o, "nulls", nulls);
                    len_sum[li] += sc, len_n[li]++;
                }
                cJSON_AddNumberToObject(o, "n", cfg->ruler_samples);
                cJSON_AddNumberToObject(o, "mean_input_tokens", in_tokens / cfg->ruler_samples);
                cJSON_AddNumberToObject(o, "haystack", ss[0].n_haystack);
                cJSON_AddNumberToObject(o, "seconds", time_now() - t0);
            }
            for (int s = 0; s < cfg->ruler_samples; s++)
                ev_ruler_sample_free(&ss[s]);
            free(ss);
        }
    }
    if (rc == 0) ev_progress_end(&pg);
    if (rc == 0 && !cfg->generate_only) {
        cJSON *pl = cJSON_AddObjectToObject(r, "per_length");
        double all = 0;
        int nall = 0;
        for (int li = 0; li < cfg->n_lengths; li++) {
            if (!len_n[li]) continue;
            char key[16];
            snprintf(key, sizeof key, "%d", cfg->lengths[li]);
            cJSON *o = cJSON_AddObjectToObject(pl, key);
            cJSON_AddNumberToObject(o, "average", len_sum[li] / len_n[li]);
            cJSON_AddNumberToObject(o, "tasks", len_n[li]);
            all += len_sum[li] / len_n[li], nall++;
        }
        if (nall) cJSON_AddNumberToObject(r, "average", all / nall);
    }
    ev_ruler_data_free(&d);
    return rc;
}

// ---- perplexity ------------------------------------------------------------------

static int list_texts(const char *path, ev_strs_t *out) {
    if (!fs_is_dir(path)) {
        if (!fs_exists(path))
            return err_set(ERR_INPUT, "perplexity: %s not found: expected a text file or a folder of .txt files", path);
        return ev_strs_add(out, path, strlen(path));
    }
    struct dirent **ents;
    int k = scandir(path, &ents, NULL, alphasort), rc = 0, before = out->n;
    if (k < 0) return err_set(ERR_INPUT, "%s: cannot list", path);
    for (int i = 0; i < k; i++) {
        size_t l = strlen(ents[i]->d_name);
        if (rc == 0 && l > 4 && !strcmp(ents[i]->d_name + l - 4, ".txt")) {
            char p[2048];
            snprintf(p, sizeof p, "%s/%s", path, ents[i]->d_name);
            rc = ev_strs_add(out, p, strlen(p));
        }
        free(ents[i]);
    }
    free(ents);
    if (rc == 0 && out->n == before) rc = err_set(ERR_INPUT, "perplexity: %s has no .txt files", path);
    return rc;
}

static void add_ppl(cJSON *o, const ev_ppl_sums_t *s) {
    cJSON_AddNumberToObject(o, "docs", (double)s->docs);
    cJSON_AddNumberToObject(o, "tokens", (double)s->tokens);
    cJSON_AddNumberToObject(o, "words", (double)s->words);
    cJSON_AddNumberToObject(o, "bytes", (double)s->bytes);
    cJSON_AddNumberToObject(o, "windows", (double)s->windows);
    cJSON_AddNumberToObject(o, "loglikelihood", s->ll);
    cJSON_AddNumberToObject(o, "token_perplexity", ev_ppl_token(s));
    cJSON_AddNumberToObject(o, "word_perplexity", ev_ppl_word(s));
    cJSON_AddNumberToObject(o, "byte_perplexity", ev_ppl_byte(s));
    cJSON_AddNumberToObject(o, "bits_per_byte", ev_bits_per_byte(s));
}

static int run_ppl(ev_lm_t *lm, const ev_run_cfg_t *cfg, cJSON *out) {
    ev_strs_t files = {0};
    int rc = 0;
    char p[1100];
    if (cfg->n_texts == 0) {
        rc = ev_data_path(&cfg->data, "ppl", NULL, "essays/", "text files to score (a folder of .txt files)",
                          "any plain text; pass --text FILE|DIR", p, sizeof p);
        if (rc == 0) rc = list_texts(p, &files);
    }
    for (int i = 0; rc == 0 && i < cfg->n_texts; i++)
        rc = list_texts(cfg->texts[i], &files);
    int L = cfg->ppl_max_len > 0 ? cfg->ppl_max_len : lm->max_len;
    if (rc == 0 && L > lm->max_len) rc = err_set(ERR_INPUT, "--ppl-len %d exceeds the model length %d", L, lm->max_len);
    int Lw = cfg->ppl_window > 0 ? cfg->ppl_window : L;
    if (rc == 0 && cfg->ppl_stride > Lw)
        rc = err_set(ERR_INPUT, "--ppl-stride %d exceeds the window %d", cfg->ppl_stride, Lw);
    ev_ppl_sums_t roll = {0}, strd = {0};
    cJSON *o = rc == 0 ? cJSON_AddObjectToObject(out, "perplexity") : NULL;
    cJSON *per = o ? cJSON_AddArrayToObject(o, "files") : NULL;
    if (rc == 0 && !per) rc = err_set(ERR_NOMEM, "out of memory");
    // tokenise first, to size the progress bar in windows
    int32_t **ids = calloc((size_t)(files.n ? files.n : 1), sizeof *ids);
    int *nt = calloc((size_t)(files.n ? files.n : 1), sizeof *nt);
    int64_t *words = calloc((size_t)(files.n ? files.n : 1), sizeof *words),
            *bytes = calloc((size_t)(files.n ? files.n : 1), sizeof *bytes);
    if (rc == 0 && (!ids || !nt || !words || !bytes)) rc = err_set(ERR_NOMEM, "out of memory");
    int64_t total = 0;
    for (int f = 0; rc == 0 && f < files.n; f++) {
        char *buf;
        size_t len;
        if ((rc = fs_read_all(files.s[f], &buf, &len)) < 0) break;
        rc = tok_encode_ex(lm->tok, buf, len, TOK_SPECIAL, &ids[f], &nt[f]);
        words[f] = ev_count_words(buf, len), bytes[f] = (int64_t)len;
        free(buf);
        total += nt[f] / L + 1;
        if (cfg->ppl_stride) total += nt[f] / cfg->ppl_stride + 1;
    }
    ev_progress_t pg;
    if (rc == 0) ev_progress_start(&pg, "perplexity", total);
    for (int f = 0; rc == 0 && f < files.n; f++) {
        if (!nt[f]) continue;
        int64_t cap = (int64_t)nt[f] + 2; // the most windows any length gives
        ev_window_t *w = malloc((size_t)cap * sizeof *w);
        if (!w) {
            rc = err_set(ERR_NOMEM, "out of memory");
            break;
        }
        int64_t nw = ev_rolling_windows(nt[f], L, w, cap);
        double ll = 0, lls = 0;
        rc = ev_ppl_doc(lm, ids[f], nt[f], w, nw, &ll);
        ev_progress_add(&pg, nw);
        roll.ll += ll, roll.tokens += nt[f], roll.words += words[f], roll.bytes += bytes[f], roll.docs++,
            roll.windows += nw;
        if (rc == 0 && cfg->ppl_stride) {
            int64_t ns = ev_strided_windows(nt[f], Lw, cfg->ppl_stride, w, cap);
            rc = ns < 0 ? err_set(ERR_NOMEM, "too many windows") : ev_ppl_doc(lm, ids[f], nt[f], w, ns, &lls);
            ev_progress_add(&pg, ns);
            strd.ll += lls, strd.tokens += nt[f], strd.words += words[f], strd.bytes += bytes[f], strd.docs++,
                strd.windows += ns;
        }
        free(w);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", files.s[f]);
        cJSON_AddNumberToObject(e, "tokens", nt[f]);
        cJSON_AddNumberToObject(e, "words", (double)words[f]);
        cJSON_AddNumberToObject(e, "bytes", (double)bytes[f]);
        cJSON_AddNumberToObject(e, "loglikelihood", ll);
        if (cfg->ppl_stride) cJSON_AddNumberToObject(e, "loglikelihood_strided", lls);
        cJSON_AddItemToArray(per, e);
    }
    if (rc == 0) {
        ev_progress_end(&pg);
        cJSON *ro = cJSON_AddObjectToObject(o, "rolling");
        cJSON_AddNumberToObject(ro, "max_len", L);
        add_ppl(ro, &roll);
        if (cfg->ppl_stride) {
            cJSON *so = cJSON_AddObjectToObject(o, "strided");
            cJSON_AddNumberToObject(so, "window", Lw);
            cJSON_AddNumberToObject(so, "stride", cfg->ppl_stride);
            add_ppl(so, &strd);
        }
        cJSON_AddStringToObject(o, "prefix", "the tokenizer's BOS (EOS when it has none) before each document");
    }
    for (int f = 0; ids && f < files.n; f++)
        free(ids[f]);
    free(ids), free(nt), free(words), free(bytes);
    ev_strs_free(&files);
    return rc;
}

int ev_run(ev_lm_t *lm, const ev_run_cfg_t *cfg, cJSON *out) {
    if (ev_bos_flags(cfg->bos) < 0) return err_set(ERR_INPUT, "--bos %s: expected none, auto or always", cfg->bos);
    if (cfg->n_short) TRY(run_short(lm, cfg, out));
    if (cfg->n_ruler) TRY(run_ruler(lm, cfg, out));
    if (cfg->ppl) TRY(run_ppl(lm, cfg, out));
    return 0;
}

cJSON *ev_run_settings(const ev_run_cfg_t *cfg) {
    cJSON *s = cJSON_CreateObject();
    if (!s) return NULL;
    cJSON_AddStringToObject(s, "bos", cfg->bos);
    cJSON_AddNumberToObject(s, "limit", cfg->limit);
    cJSON_AddNumberToObject(s, "num_fewshot", 0);
    cJSON_AddNumberToObject(s, "gsm8k_max_gen_toks", cfg->max_gen);
    cJSON_AddStringToObject(s, "chat_template", "none (plain concatenation, as lm-eval's default and RULER's base)");
    cJSON_AddStringToObject(s, "logprob_precision", "float64 log-softmax over the model's float logits");
    cJSON *l = cJSON_AddArrayToObject(s, "ruler_lengths");
    for (int i = 0; i < cfg->n_lengths; i++)
        cJSON_AddItemToArray(l, cJSON_CreateNumber(cfg->lengths[i]));
    cJSON_AddNumberToObject(s, "ruler_samples", cfg->ruler_samples);
    if (cfg->ruler_max_new) cJSON_AddNumberToObject(s, "ruler_max_new_cap", cfg->ruler_max_new);
    cJSON_AddNumberToObject(s, "seed", (double)cfg->seed);
    cJSON_AddStringToObject(s, "ruler_variant", "head (binary-search length fitting)");
    cJSON_AddStringToObject(s, "ruler_sentence_splitter", "rule-based (NLTK Punkt stands in the reference)");
    cJSON_AddStringToObject(s, "ruler_template", "base (no chat wrapper)");
    cJSON_AddNumberToObject(s, "ppl_max_len", cfg->ppl_max_len);
    cJSON_AddNumberToObject(s, "ppl_window", cfg->ppl_window);
    cJSON_AddNumberToObject(s, "ppl_stride", cfg->ppl_stride);
    return s;
}
