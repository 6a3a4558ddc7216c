#include "train/plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/strbuf.h"

int plot_add(plot_series_t *s, double x, double y) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof(double));
        if (!nx) return err_set(ERR_NOMEM, "out of memory");
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof(double));
        if (!ny) return err_set(ERR_NOMEM, "out of memory");
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
    return 0;
}

void plot_free(plot_series_t *s) {
    free(s->x), free(s->y);
    memset(s, 0, sizeof *s);
}

int plot_write_svg(const plot_series_t *s, const char *path, const char *title) {
    const double W = 640, H = 400, L = 70, R = 20, Tm = 40, Bm = 50;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < s->n; i++)
        if (isfinite(s->y[i])) {
            x0 = fmin(x0, s->x[i]), x1 = fmax(x1, s->x[i]);
            y0 = fmin(y0, s->y[i]), y1 = fmax(y1, s->y[i]);
        }
    int logy = s->n > 1 && y0 > 0 && y1 / y0 > 20;
    if (!(x1 > x0)) x0 = x0 == INFINITY ? 0 : x0 - 1, x1 = x0 + 2;
    if (!(y1 > y0)) y0 = y0 == INFINITY ? 0 : y0 - 1, y1 = y0 + 2;
    double ly0 = logy ? log10(y0) : y0, ly1 = logy ? log10(y1) : y1;
    strbuf_t b = {0};
    strbuf_printf(&b,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                  "<text x=\"%.0f\" y=\"24\" font-size=\"15\">",
                  W, H, L);
    strbuf_puts(&b, title);
    strbuf_printf(&b, "%s</text>\n", logy ? " (log scale)" : "");
    strbuf_printf(&b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", L,
                  Tm, W - L - R, H - Tm - Bm);
    for (int k = 0; k <= 4; k++) { // ticks
        double fx = x0 + (x1 - x0) * k / 4, fy = ly0 + (ly1 - ly0) * k / 4;
        double px = L + (W - L - R) * k / 4, py = H - Bm - (H - Tm - Bm) * k / 4;
        strbuf_printf(&b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n", px, H - Bm + 18, fx);
        strbuf_printf(&b, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", L - 6, py + 4,
                      logy ? pow(10, fy) : fy);
        strbuf_printf(&b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L + 1, W - R - 1,
                      py, py);
    }
    strbuf_printf(&b, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">optimizer step</text>\n", (L + W - R) / 2,
                  H - 12);
    strbuf_printf(&b, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->y[i])) continue;
        double vy = logy ? log10(s->y[i]) : s->y[i];
        strbuf_printf(&b, "%.1f,%.1f ", L + (W - L - R) * (s->x[i] - x0) / (x1 - x0),
                      H - Bm - (H - Tm - Bm) * (vy - ly0) / (ly1 - ly0));
    }
    strbuf_printf(&b, "\"/>\n</svg>\n");
    int rc = b.oom ? err_set(ERR_NOMEM, "out of memory") : fs_write_all(path, b.s, b.n);
    free(b.s);
    return rc;
}
