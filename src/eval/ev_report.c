#include "eval/ev_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "base/svg.h"
#include "eval/ev_text.h"

static double num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *obj(const cJSON *o, const char *key) { return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL; }

// ---- grouped bars: n groups x s series, values in [0, ymax], optional errors ----
typedef struct {
    const char *name;
    double v[64], err[64]; // NAN = absent
} bar_series_t;

static void svg_bars(strbuf_t *b, const char *title, const char *ylabel, const char *const *labels, int n,
                     const bar_series_t *s, int ns, double ymax) {
    int W = 200 + n * (ns * 22 + 18), H = 320 + 16 * ns, x0 = 60, y0 = 40, ph = 200; // room for the slanted labels
    if (W < 420) W = 420;
    strbuf_printf(
        b, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='11'>\n",
        W, H);
    strbuf_printf(b, "<text x='%d' y='18' font-size='14' font-weight='bold'>", x0);
    svg_esc(b, title);
    strbuf_puts(b, "</text>\n");
    double step = svg_nice_step(ymax, 5);
    for (double t = 0; t <= ymax + 1e-9; t += step) {
        double y = y0 + ph - t / ymax * ph;
        char lab[32];
        svg_fmt_num(lab, sizeof lab, t);
        strbuf_printf(b,
                      "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/><text x='%d' y='%.1f' "
                      "text-anchor='end'>%s</text>\n",
                      x0, W - 10, y, y, x0 - 4, y + 4, lab);
    }
    strbuf_printf(b, "<text transform='translate(14,%d) rotate(-90)' text-anchor='middle'>", y0 + ph / 2);
    svg_esc(b, ylabel);
    strbuf_puts(b, "</text>\n");
    for (int g = 0; g < n; g++) {
        int gx = x0 + 10 + g * (ns * 22 + 18);
        for (int k = 0; k < ns; k++) {
            double v = s[k].v[g];
            if (isnan(v)) continue;
            double h = (v < 0 ? 0 : v > ymax ? ymax : v) / ymax * ph;
            strbuf_printf(b, "<rect x='%d' y='%.1f' width='20' height='%.1f' fill='%s'><title>", gx + k * 22,
                          y0 + ph - h, h, svg_palette[k % 6]);
            svg_esc(b, s[k].name);
            strbuf_printf(b, ": %.2f</title></rect>\n", v);
            double e = s[k].err[g];
            if (!isnan(e) && e > 0) {
                double ya = y0 + ph - fmin(v + e, ymax) / ymax * ph, yb = y0 + ph - fmax(v - e, 0) / ymax * ph;
                strbuf_printf(b, "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#222'/>\n", gx + k * 22 + 10,
                              gx + k * 22 + 10, ya, yb);
            }
        }
        strbuf_printf(b, "<text transform='translate(%d,%d) rotate(35)'>", gx + 4, y0 + ph + 12);
        svg_esc(b, labels[g]);
        strbuf_puts(b, "</text>\n");
    }
    strbuf_printf(b, "<line x1='%d' x2='%d' y1='%d' y2='%d' stroke='#444'/>\n", x0, W - 10, y0 + ph, y0 + ph);
    for (int k = 0; k < ns; k++) {
        int ly = H - 16 * (ns - k) - 4;
        strbuf_printf(b, "<rect x='%d' y='%d' width='12' height='12' fill='%s'/><text x='%d' y='%d'>", x0 + 10, ly,
                      svg_palette[k % 6], x0 + 28, ly + 10);
        svg_esc(b, s[k].name);
        strbuf_puts(b, "</text>\n");
    }
    strbuf_puts(b, "</svg>\n");
}

// ---- heat map: rows x cols of values in [0, 100] (NAN: not run) ----
static void svg_heatmap(strbuf_t *b, const char *title, const char *const *rows, int nr, const char *const *cols,
                        int nc, const double *v) {
    int cw = 64, chh = 24, x0 = 130, y0 = 50, W = x0 + nc * cw + 20, H = y0 + nr * chh + 30;
    strbuf_printf(
        b, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='11'>\n",
        W, H);
    strbuf_printf(b, "<text x='10' y='18' font-size='14' font-weight='bold'>");
    svg_esc(b, title);
    strbuf_puts(b, "</text>\n");
    for (int c = 0; c < nc; c++) {
        strbuf_printf(b, "<text x='%d' y='%d' text-anchor='middle'>", x0 + c * cw + cw / 2, y0 - 8);
        svg_esc(b, cols[c]);
        strbuf_puts(b, "</text>\n");
    }
    for (int r = 0; r < nr; r++) {
        strbuf_printf(b, "<text x='%d' y='%d' text-anchor='end'>", x0 - 6, y0 + r * chh + 16);
        svg_esc(b, rows[r]);
        strbuf_puts(b, "</text>\n");
        for (int c = 0; c < nc; c++) {
            double x = v[r * nc + c];
            int px = x0 + c * cw, py = y0 + r * chh;
            if (isnan(x)) {
                strbuf_printf(
                    b,
                    "<rect x='%d' y='%d' width='%d' height='%d' fill='#eee' stroke='#fff'/><text x='%d' y='%d' "
                    "text-anchor='middle' fill='#999'>n/a</text>\n",
                    px, py, cw, chh, px + cw / 2, py + 16);
                continue;
            }
            double t = fmax(0, fmin(100, x)) / 100; // red (0) -> yellow -> green (100)
            strbuf_printf(
                b,
                "<rect x='%d' y='%d' width='%d' height='%d' fill='hsl(%.0f,65%%,%.0f%%)' stroke='#fff'/><text "
                "x='%d' y='%d' text-anchor='middle'>%.1f</text>\n",
                px, py, cw, chh, 120 * t, 55 + 10 * (1 - fabs(t - 0.5) * 2), px + cw / 2, py + 16, x);
        }
    }
    strbuf_puts(b, "</svg>\n");
}

// ---- sections ----------------------------------------------------------------------

static const char *model_name(const cJSON *r) {
    const char *p = str(obj(r, "model"), "path");
    return p ? p : "model";
}

// "model: NAME" / "teacher: NAME" with the path's last component, for legends.
static const char *legend_name(const cJSON *r, int teacher, char *buf, size_t cap) {
    const char *p = model_name(r), *e = p + strlen(p);
    while (e > p && e[-1] == '/')
        e--;
    const char *b = e;
    while (b > p && b[-1] != '/')
        b--;
    snprintf(buf, cap, "%s: %.*s", teacher ? "teacher" : "model", (int)(e - b), b);
    return buf;
}

static void section_short(strbuf_t *b, const cJSON *r, const cJSON *a) {
    const cJSON *tasks = obj(r, "tasks");
    if (!tasks || !cJSON_GetArraySize(tasks)) return;
    strbuf_puts(b, "<h2>Short benchmarks (lm-evaluation-harness scoring, 0-shot)</h2>\n");
    strbuf_puts(b, "<table><tr><th>task</th><th>n</th><th>metric</th><th>model</th>");
    if (a) strbuf_puts(b, "<th>teacher</th>");
    strbuf_puts(b, "<th>other metrics (model)</th></tr>\n");
    const char *labels[64];
    bar_series_t s[2];
    char n0[256], n1[256];
    memset(s, 0, sizeof s);
    s[0].name = legend_name(r, 0, n0, sizeof n0);
    if (a) s[1].name = legend_name(a, 1, n1, sizeof n1);
    int n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tasks) {
        const char *h = str(t, "headline");
        if (!h || n >= 64) continue;
        char se[64];
        snprintf(se, sizeof se, "%s_stderr", h);
        const cJSON *at = a ? obj(obj(a, "tasks"), t->string) : NULL;
        double v = 100 * num(t, h, NAN), e = 100 * num(t, se, NAN), va = at ? 100 * num(at, h, NAN) : NAN;
        labels[n] = t->string;
        s[0].v[n] = v, s[0].err[n] = e;
        s[1].v[n] = va, s[1].err[n] = at ? 100 * num(at, se, NAN) : NAN;
        strbuf_printf(b, "<tr><td>%s</td><td>%d</td><td>%s</td><td>%.2f &plusmn; %.2f</td>", t->string,
                      (int)num(t, "n", 0), h, v, e);
        if (a) {
            if (isnan(va))
                strbuf_puts(b, "<td>&mdash;</td>");
            else
                strbuf_printf(b, "<td>%.2f (n=%d)</td>", va, (int)num(at, "n", 0));
        }
        strbuf_puts(b, "<td>");
        static const char *others[] = {"acc", "acc_norm", "exact_match_strict", "exact_match_flexible", "perplexity"};
        for (size_t k = 0; k < sizeof others / sizeof *others; k++) {
            double x = num(t, others[k], NAN);
            if (isnan(x) || !strcmp(others[k], h)) continue;
            if (!strcmp(others[k], "perplexity"))
                strbuf_printf(b, "%s %.3f; ", others[k], x);
            else
                strbuf_printf(b, "%s %.2f; ", others[k], 100 * x);
        }
        if (num(t, "truncated", 0) > 0) strbuf_printf(b, "<b>%d truncated</b>", (int)num(t, "truncated", 0));
        strbuf_puts(b, "</td></tr>\n");
        n++;
    }
    strbuf_puts(b, "</table>\n<p class='note'>Percent; &plusmn; is lm-eval's standard error (sample std / &radic;n). "
                   "The headline metric follows mapping (a): acc_norm for ARC-E, ARC-C, OpenBookQA, PIQA; acc for "
                   "the others; flexible-extract exact match for GSM8K.</p>\n");
    if (n) svg_bars(b, a ? "Accuracy: model vs teacher (%)" : "Accuracy (%)", "percent", labels, n, s, a ? 2 : 1, 100);
}

static int ruler_grid(const cJSON *ru, const char **rows, int *nr, const char **cols, int *nc, int *lens) {
    const cJSON *sc = obj(ru, "scores"), *t, *l;
    *nr = *nc = 0;
    cJSON_ArrayForEach(t, sc) {
        if (*nr < 32) rows[(*nr)++] = t->string;
        cJSON_ArrayForEach(l, t) {
            int len = atoi(l->string), seen = 0;
            for (int i = 0; i < *nc; i++)
                seen |= lens[i] == len;
            if (!seen && *nc < 16) lens[(*nc)++] = len;
        }
    }
    for (int i = 1; i < *nc; i++) // lengths ascending
        for (int j = i; j > 0 && lens[j - 1] > lens[j]; j--) {
            int x = lens[j];
            lens[j] = lens[j - 1], lens[j - 1] = x;
        }
    (void)cols;
    return 0;
}

static void ruler_heat(strbuf_t *b, const cJSON *ru, const char *title) {
    const char *rows[34], *cols[16];
    char colbuf[16][16];
    int nr, nc, lens[16];
    ruler_grid(ru, rows, &nr, cols, &nc, lens);
    if (!nr || !nc) return;
    for (int c = 0; c < nc; c++) {
        if (lens[c] >= 1024 && lens[c] % 1024 == 0)
            snprintf(colbuf[c], 16, "%dK", lens[c] / 1024);
        else
            snprintf(colbuf[c], 16, "%d", lens[c]);
        cols[c] = colbuf[c];
    }
    double v[34 * 16];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            char key[16];
            snprintf(key, sizeof key, "%d", lens[c]);
            v[r * nc + c] = num(obj(obj(obj(ru, "scores"), rows[r]), key), "score", NAN);
        }
    // the average row
    rows[nr] = "average";
    for (int c = 0; c < nc; c++) {
        char key[16];
        snprintf(key, sizeof key, "%d", lens[c]);
        v[nr * nc + c] = num(obj(obj(ru, "per_length"), key), "average", NAN);
    }
    svg_heatmap(b, title, rows, nr + 1, cols, nc, v);
}

static void section_ruler(strbuf_t *b, const cJSON *r, const cJSON *a) {
    const cJSON *ru = obj(r, "ruler"), *ra = obj(a, "ruler");
    if (!ru) return;
    strbuf_puts(b, "<h2>RULER</h2>\n");
    const cJSON *l0 = cJSON_GetArrayItem(cJSON_GetArrayItem(obj(ru, "scores"), 0), 0);
    strbuf_printf(b,
                  "<p>%d samples per task and length; scores are RULER's string match (0&ndash;100), the average is "
                  "the unweighted mean over the tasks that ran.</p>\n",
                  (int)num(l0, "n", 0));
    const cJSON *miss = obj(ru, "missing"), *m;
    if (miss && cJSON_GetArraySize(miss)) {
        strbuf_puts(b, "<p class='note'>Not run (data missing): ");
        cJSON_ArrayForEach(m, miss) {
            strbuf_printf(b, "<b>%s</b> ", m->string);
            svg_esc(b, cJSON_IsString(m) ? m->valuestring : "");
            strbuf_puts(b, "; ");
        }
        strbuf_puts(b, "the averages are over the other tasks.</p>\n");
    }
    strbuf_puts(b, "<div class='row'>");
    ruler_heat(b, ru, "model: score by task and length");
    if (ra) ruler_heat(b, ra, "teacher: score by task and length");
    strbuf_puts(b, "</div>\n");
    // average per length as a curve when there are several lengths
    svg_series_t s[2];
    double xs[2][16], ys[2][16];
    int ns = 0;
    const cJSON *src[2] = {ru, ra};
    char n0[256], n1[256];
    const char *names[2] = {legend_name(r, 0, n0, sizeof n0), a ? legend_name(a, 1, n1, sizeof n1) : NULL};
    for (int k = 0; k < 2; k++) {
        if (!src[k]) continue;
        const cJSON *pl = obj(src[k], "per_length"), *e;
        int n = 0;
        cJSON_ArrayForEach(e, pl) if (n < 16) xs[ns][n] = atof(e->string), ys[ns][n] = num(e, "average", 0), n++;
        if (n > 1) s[ns] = (svg_series_t){names[k], xs[ns], ys[ns], n}, ns++;
    }
    if (ns)
        svg_line_chart(b, "RULER average by context length", "context length (tokens)", "average score", s, ns,
                       SVG_LOGX);
    double avg = num(ru, "average", NAN);
    if (!isnan(avg))
        strbuf_printf(b, "<p>Average over lengths: <b>%.2f</b>%s</p>\n", avg, a && obj(ra, "average") ? "" : "");
    if (ra && !isnan(num(ra, "average", NAN)))
        strbuf_printf(b, "<p>Teacher average over lengths: <b>%.2f</b></p>\n", num(ra, "average", NAN));
}

static void ppl_row(strbuf_t *b, const char *who, const char *kind, const cJSON *p) {
    if (!p) return;
    strbuf_printf(
        b,
        "<tr><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.4f</td></tr>\n",
        who, kind, (int)num(p, "docs", 0), (int)num(p, "tokens", 0), num(p, "token_perplexity", NAN),
        num(p, "word_perplexity", NAN), num(p, "byte_perplexity", NAN), num(p, "bits_per_byte", NAN));
}

static void section_ppl(strbuf_t *b, const cJSON *r, const cJSON *a) {
    const cJSON *p = obj(r, "perplexity"), *pa = obj(a, "perplexity");
    if (!p) return;
    strbuf_puts(b, "<h2>Perplexity</h2>\n<table><tr><th>model</th><th>windows</th><th>docs</th><th>tokens</th>"
                   "<th>token ppl</th><th>word ppl</th><th>byte ppl</th><th>bits/byte</th></tr>\n");
    char k1[64], k2[80];
    snprintf(k1, sizeof k1, "rolling, %d", (int)num(obj(p, "rolling"), "max_len", 0));
    ppl_row(b, "model", k1, obj(p, "rolling"));
    if (obj(p, "strided")) {
        snprintf(k2, sizeof k2, "strided, window %d stride %d", (int)num(obj(p, "strided"), "window", 0),
                 (int)num(obj(p, "strided"), "stride", 0));
        ppl_row(b, "model", k2, obj(p, "strided"));
    }
    if (pa) {
        snprintf(k1, sizeof k1, "rolling, %d", (int)num(obj(pa, "rolling"), "max_len", 0));
        ppl_row(b, "teacher", k1, obj(pa, "rolling"));
        ppl_row(b, "teacher", "strided", obj(pa, "strided"));
    }
    strbuf_puts(b, "</table>\n<p class='note'>Rolling windows as lm-eval's loglikelihood_rolling (each token scored "
                   "once); words = whitespace-separated pieces, bytes = UTF-8 bytes of the files.</p>\n");
}

static void section_bench(strbuf_t *b, const cJSON *r, const cJSON *a) {
    const cJSON *bn = obj(r, "bench");
    if (!bn) return;
    strbuf_puts(b, "<h2>Latency and memory</h2>\n<table><tr><th>model</th><th>context</th><th>prefill s</th>"
                   "<th>prefill tok/s</th><th>decode ms/token</th><th>cache MiB</th></tr>\n");
    const cJSON *src[2] = {bn, obj(a, "bench")};
    char n0[256], n1[256];
    const char *who[2] = {legend_name(r, 0, n0, sizeof n0), a ? legend_name(a, 1, n1, sizeof n1) : NULL};
    double X[2][64], P[2][64], D[2][64], M[2][64];
    int n[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const cJSON *e;
        cJSON_ArrayForEach(e, obj(src[k], "points")) {
            if (n[k] >= 64) break;
            double T = num(e, "context", 0), ps = num(e, "prefill_s", 0), ds = num(e, "decode_ms_per_token", 0),
                   mb = num(e, "cache_bytes", 0) / 1048576.0;
            X[k][n[k]] = T, P[k][n[k]] = ps, D[k][n[k]] = ds, M[k][n[k]] = mb, n[k]++;
            strbuf_printf(b, "<tr><td>%s</td><td>%d</td><td>%.3f</td><td>%.1f</td><td>%.2f</td><td>%.1f</td></tr>\n",
                          k ? "teacher" : "model", (int)T, ps, ps > 0 ? T / ps : 0, ds, mb);
        }
    }
    strbuf_puts(b, "</table>\n<div class='row'>");
    svg_series_t s[2];
    int ns = 0;
    for (int k = 0; k < 2; k++)
        if (n[k]) s[ns++] = (svg_series_t){who[k], X[k], P[k], n[k]};
    svg_line_chart(b, "Prefill time", "context length (tokens)", "seconds", s, ns, SVG_LOGX);
    ns = 0;
    for (int k = 0; k < 2; k++)
        if (n[k]) s[ns++] = (svg_series_t){who[k], X[k], D[k], n[k]};
    svg_line_chart(b, "Decode latency after the context", "context length (tokens)", "ms per token", s, ns, SVG_LOGX);
    ns = 0;
    for (int k = 0; k < 2; k++)
        if (n[k]) s[ns++] = (svg_series_t){who[k], X[k], M[k], n[k]};
    svg_line_chart(b, "Cache memory", "context length (tokens)", "MiB", s, ns, SVG_LOGX);
    strbuf_puts(b, "</div>\n");
}

static void section_training(strbuf_t *b, const cJSON *r) {
    const cJSON *tr = obj(r, "training");
    if (!tr) return;
    strbuf_puts(b, "<h2>Training curves</h2>\n<p>");
    svg_esc(b, str(tr, "file"));
    strbuf_puts(b, "</p>\n");
    const cJSON *ser = obj(tr, "series"), *e;
    svg_series_t s[6];
    int ns = 0;
    double *bufs[12] = {0};
    cJSON_ArrayForEach(e, ser) {
        if (ns >= 6) break;
        int n = cJSON_GetArraySize(e), k = 0;
        double *x = malloc((size_t)(n ? n : 1) * sizeof *x), *y = malloc((size_t)(n ? n : 1) * sizeof *y);
        bufs[2 * ns] = x, bufs[2 * ns + 1] = y;
        if (!x || !y) break;
        const cJSON *pt;
        cJSON_ArrayForEach(pt, e) {
            x[k] = cJSON_GetArrayItem(pt, 0)->valuedouble, y[k] = cJSON_GetArrayItem(pt, 1)->valuedouble;
            if (isfinite(y[k])) k++;
        }
        s[ns++] = (svg_series_t){e->string, x, y, k};
    }
    if (ns) svg_line_chart(b, "Training losses", "step", "loss", s, ns, 0);
    for (int i = 0; i < 12; i++)
        free(bufs[i]);
}

int ev_report_html(const cJSON *r, const cJSON *a, char **html) {
    strbuf_t b = {0};
    strbuf_puts(&b, "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>hylo eval: ");
    svg_esc(&b, model_name(r));
    strbuf_puts(&b, "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1200px;color:#222}"
                    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
                    "font-size:13px;text-align:left}th{background:#f2f2f2}.note{color:#555;font-size:12px}"
                    ".row{display:flex;flex-wrap:wrap;gap:16px}svg{margin:6px 0}pre{background:#f7f7f7;padding:8px;"
                    "font-size:12px;overflow-x:auto}</style></head><body>\n");
    strbuf_puts(&b, "<h1>hylo evaluation report</h1>\n<table>");
    const cJSON *m = obj(r, "model");
    strbuf_printf(&b, "<tr><th>model</th><td>");
    svg_esc(&b, model_name(r));
    strbuf_printf(&b, " (%s; %s; %.1fM parameters; %s backend)</td></tr>\n", str(m, "arch") ? str(m, "arch") : "?",
                  str(m, "mixers") ? str(m, "mixers") : "?", num(m, "params", 0) / 1e6,
                  str(m, "backend") ? str(m, "backend") : "?");
    if (a) {
        strbuf_printf(&b, "<tr><th>teacher</th><td>");
        svg_esc(&b, model_name(a));
        strbuf_printf(&b, " (%s)</td></tr>\n", str(obj(a, "model"), "mixers") ? str(obj(a, "model"), "mixers") : "?");
    }
    static const char *meta[] = {"date", "hylo_version", "command"};
    for (size_t i = 0; i < 3; i++) {
        strbuf_printf(&b, "<tr><th>%s</th><td>", meta[i]);
        svg_esc(&b, str(r, meta[i]));
        strbuf_puts(&b, "</td></tr>\n");
    }
    const char *dr = str(obj(r, "data"), "root");
    strbuf_puts(&b, "<tr><th>data</th><td>");
    svg_esc(&b, dr ? dr : "(files by flag)");
    strbuf_puts(&b, "</td></tr></table>\n");
    section_short(&b, r, a);
    section_ruler(&b, r, a);
    section_ppl(&b, r, a);
    section_bench(&b, r, a);
    section_training(&b, r);
    const cJSON *st = obj(r, "settings");
    if (st) {
        char *s = cJSON_Print(st);
        strbuf_puts(&b, "<h2>Settings</h2>\n<pre>");
        svg_esc(&b, s);
        strbuf_puts(&b, "</pre>\n");
        free(s);
    }
    strbuf_puts(&b, "</body></html>\n");
    if (b.oom) {
        free(b.s);
        return err_set(ERR_NOMEM, "out of memory");
    }
    *html = b.s;
    return 0;
}

int ev_read_metrics(const char *path, cJSON **out) {
    cJSON **rows;
    int n;
    TRY(ev_read_jsonl(path, &rows, &n));
    cJSON *o = cJSON_CreateObject(), *ser = o ? cJSON_AddObjectToObject(o, "series") : NULL;
    if (o) cJSON_AddStringToObject(o, "file", path);
    int rc = ser ? 0 : err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(rows[i], "step"), *f;
        if (!cJSON_IsNumber(step)) continue;
        cJSON_ArrayForEach(f, rows[i]) {
            if (!cJSON_IsNumber(f) || !strstr(f->string, "loss")) continue;
            cJSON *arr = cJSON_GetObjectItemCaseSensitive(ser, f->string);
            if (!arr) arr = cJSON_AddArrayToObject(ser, f->string);
            double pt[2] = {step->valuedouble, f->valuedouble};
            if (!arr || !cJSON_AddItemToArray(arr, cJSON_CreateDoubleArray(pt, 2)))
                rc = err_set(ERR_NOMEM, "out of memory");
        }
    }
    ev_free_jsonl(rows, n);
    if (rc == 0 && !cJSON_GetArraySize(ser))
        rc = err_set(ERR_INPUT, "%s: no lines with \"step\" and a numeric \"...loss...\" field", path);
    if (rc < 0) {
        cJSON_Delete(o);
        return rc;
    }
    *out = o;
    return 0;
}
