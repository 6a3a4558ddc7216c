#include "base/svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *const svg_palette[6] = {"#3b6fb6", "#d9822b", "#4a9c5d", "#b04a7a", "#7a5cc2", "#8c8c2e"};

void svg_esc(strbuf_t *b, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': strbuf_puts(b, "&lt;"); break;
        case '>': strbuf_puts(b, "&gt;"); break;
        case '&': strbuf_puts(b, "&amp;"); break;
        case '"': strbuf_puts(b, "&quot;"); break;
        default: strbuf_putn(b, s, 1);
        }
    }
}

double svg_nice_step(double span, int n) {
    if (span <= 0) return 1;
    double raw = span / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

void svg_fmt_num(char *out, size_t cap, double v) {
    if (fabs(v) >= 1e6 || (fabs(v) < 1e-3 && v != 0))
        snprintf(out, cap, "%.3g", v);
    else
        snprintf(out, cap, "%g", round(v * 1000) / 1000);
}

// x and y of point i of a series on the chart's (possibly log) scales
static double sx(const svg_series_t *s, int i, int flags) { return flags & SVG_LOGX ? log2(s->x[i]) : s->x[i]; }
static double sy(const svg_series_t *s, int i, int flags) { return flags & SVG_LOGY ? log10(s->y[i]) : s->y[i]; }
static int usable(const svg_series_t *s, int i, int flags) {
    return isfinite(sx(s, i, flags)) && isfinite(sy(s, i, flags));
}

// Axis ticks on a log scale: one per power of `base` (2: "4K" labels, 10:
// numbers), at most about 12.
static void log_ticks(strbuf_t *b, double lo, double hi, double base, int vertical, int x0, int y0, int pw, int ph) {
    double step = ceil((hi - lo) / 12);
    if (step < 1) step = 1;
    for (double e = ceil(lo); e <= hi + 1e-9; e += step) {
        double v = pow(base, e);
        char lab[32];
        if (base == 2 && v >= 1024)
            snprintf(lab, sizeof lab, "%gK", v / 1024);
        else
            svg_fmt_num(lab, sizeof lab, v);
        if (vertical) {
            double y = y0 + ph - (e - lo) / (hi - lo) * ph;
            strbuf_printf(b,
                          "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/><text x='%d' y='%.1f' "
                          "text-anchor='end'>%s</text>\n",
                          x0, x0 + pw, y, y, x0 - 4, y + 4, lab);
        } else {
            double x = x0 + (e - lo) / (hi - lo) * pw;
            strbuf_printf(b,
                          "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#eee'/><text x='%.1f' y='%d' "
                          "text-anchor='middle'>%s</text>\n",
                          x, x, y0, y0 + ph, x, y0 + ph + 14, lab);
        }
    }
}

void svg_line_chart(strbuf_t *b, const char *title, const char *xlabel, const char *ylabel, const svg_series_t *s,
                    int ns, int flags) {
    int W = 560, H = 330, x0 = 70, y0 = 36, pw = 440, ph = 210;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            if (usable(&s[k], i, flags)) {
                double x = sx(&s[k], i, flags), y = sy(&s[k], i, flags);
                xmin = fmin(xmin, x), xmax = fmax(xmax, x), ymin = fmin(ymin, y), ymax = fmax(ymax, y);
            }
    if (!isfinite(xmin)) return;
    if (xmax == xmin) xmax = xmin + 1;
    double ys = 0;
    if (flags & SVG_LOGY) {
        ymin = floor(ymin), ymax = ceil(ymax);
        if (ymax == ymin) ymax = ymin + 1;
    } else {
        if (ymin > 0 && ymin < 0.5 * ymax) ymin = 0;
        if (ymax == ymin) ymax = ymin + 1;
        ys = svg_nice_step(ymax - ymin, 5);
        ymin = floor(ymin / ys) * ys, ymax = ceil(ymax / ys) * ys;
    }
    strbuf_printf(
        b, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='11'>\n",
        W, H);
    strbuf_printf(b,
                  "<rect width='100%%' height='100%%' fill='white'/>\n<text x='%d' y='18' font-size='14' "
                  "font-weight='bold'>",
                  x0);
    svg_esc(b, title);
    strbuf_puts(b, "</text>\n");
    if (flags & SVG_LOGY) {
        log_ticks(b, ymin, ymax, 10, 1, x0, y0, pw, ph);
    } else {
        for (double t = ymin; t <= ymax + ys * 1e-6; t += ys) {
            double y = y0 + ph - (t - ymin) / (ymax - ymin) * ph;
            char lab[32];
            svg_fmt_num(lab, sizeof lab, t);
            strbuf_printf(b,
                          "<line x1='%d' x2='%d' y1='%.1f' y2='%.1f' stroke='#ddd'/><text x='%d' y='%.1f' "
                          "text-anchor='end'>%s</text>\n",
                          x0, x0 + pw, y, y, x0 - 4, y + 4, lab);
        }
    }
    if (flags & SVG_LOGX) {
        log_ticks(b, xmin, xmax, 2, 0, x0, y0, pw, ph);
    } else {
        double xs = svg_nice_step(xmax - xmin, 6);
        for (double t = ceil(xmin / xs) * xs; t <= xmax + 1e-9; t += xs) {
            double x = x0 + (t - xmin) / (xmax - xmin) * pw;
            char lab[32];
            svg_fmt_num(lab, sizeof lab, t);
            strbuf_printf(b,
                          "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#eee'/><text x='%.1f' y='%d' "
                          "text-anchor='middle'>%s</text>\n",
                          x, x, y0, y0 + ph, x, y0 + ph + 14, lab);
        }
    }
    strbuf_printf(b, "<rect x='%d' y='%d' width='%d' height='%d' fill='none' stroke='#444'/>\n", x0, y0, pw, ph);
    strbuf_printf(b, "<text x='%d' y='%d' text-anchor='middle'>", x0 + pw / 2, y0 + ph + 32);
    svg_esc(b, xlabel);
    strbuf_printf(b, "</text><text transform='translate(16,%d) rotate(-90)' text-anchor='middle'>", y0 + ph / 2);
    svg_esc(b, ylabel);
    strbuf_puts(b, "</text>\n");
    for (int k = 0; k < ns; k++) {
        strbuf_t pts = {0};
        int shown = 0;
        for (int i = 0; i < s[k].n; i++)
            shown += usable(&s[k], i, flags);
        for (int i = 0; i < s[k].n; i++) {
            if (!usable(&s[k], i, flags)) continue;
            double x = x0 + (sx(&s[k], i, flags) - xmin) / (xmax - xmin) * pw;
            double y = y0 + ph - (sy(&s[k], i, flags) - ymin) / (ymax - ymin) * ph;
            strbuf_printf(&pts, "%.1f,%.1f ", x, y);
            if (shown <= 40)
                strbuf_printf(b, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n", x, y, svg_palette[k % 6]);
        }
        strbuf_printf(b, "<polyline fill='none' stroke='%s' stroke-width='2' points='%s'/>\n", svg_palette[k % 6],
                      pts.s ? pts.s : "");
        free(pts.s);
        strbuf_printf(b, "<rect x='%d' y='%d' width='12' height='3' fill='%s'/><text x='%d' y='%d'>",
                      x0 + 10 + (k % 2) * 230, H - 30 + (k / 2) * 14, svg_palette[k % 6], x0 + 26 + (k % 2) * 230,
                      H - 25 + (k / 2) * 14);
        svg_esc(b, s[k].name);
        strbuf_puts(b, "</text>\n");
    }
    strbuf_puts(b, "</svg>\n");
}
