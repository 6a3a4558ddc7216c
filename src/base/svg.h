// SVG pieces shared by the training plots (train/plot.c) and the evaluation
// report (eval/ev_report.c): text escaping, tick steps, number labels, the
// colour cycle and a line chart.
#pragma once
#include "base/strbuf.h"

extern const char *const svg_palette[6];

// s with <, >, & and " escaped.
void svg_esc(strbuf_t *b, const char *s);
// A "nice" step (1, 2 or 5 x 10^k) for about n ticks over [0, span].
double svg_nice_step(double span, int n);
// A tick label: %g rounded to 3 decimals, %.3g for very large or small values.
void svg_fmt_num(char *out, size_t cap, double v);

typedef struct {
    const char *name;
    const double *x, *y;
    int n;
} svg_series_t;

enum { SVG_LOGX = 1, SVG_LOGY = 2 };
// A line chart of ns series (points with a non-finite y are skipped) with
// ticks, axis labels and a legend; SVG_LOGX: log2 x axis with K suffixes
// (context-length sweeps); SVG_LOGY: log10 y axis. Nothing when no point is
// finite.
void svg_line_chart(strbuf_t *b, const char *title, const char *xlabel, const char *ylabel, const svg_series_t *s,
                    int ns, int flags);
