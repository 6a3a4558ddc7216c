#include "train/plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/strbuf.h"
#include "base/svg.h"

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
    // a log y axis when the positive values span more than a factor of 20
    double y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < s->n; i++)
        if (isfinite(s->y[i])) y0 = fmin(y0, s->y[i]), y1 = fmax(y1, s->y[i]);
    int logy = s->n > 1 && y0 > 0 && y1 / y0 > 20;
    svg_series_t ser = {"loss", s->x, s->y, s->n};
    strbuf_t b = {0};
    svg_line_chart(&b, title, "optimizer step", logy ? "loss (log scale)" : "loss", &ser, 1, logy ? SVG_LOGY : 0);
    if (!b.n) strbuf_puts(&b, "<svg xmlns='http://www.w3.org/2000/svg' width='560' height='330'/>\n"); // no point yet
    int rc = b.oom ? err_set(ERR_NOMEM, "out of memory") : fs_write_all(path, b.s, b.n);
    free(b.s);
    return rc;
}
