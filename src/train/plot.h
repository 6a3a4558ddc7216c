// A loss curve as an SVG line plot (written beside each checkpoint and in the
// output folder).
#pragma once
#include <stdint.h>

typedef struct {
    double *x, *y;
    int n, cap;
} plot_series_t;

int plot_add(plot_series_t *s, double x, double y);
void plot_free(plot_series_t *s);
// Writes the series as a self-contained SVG (axes with ticks, a log-scaled y
// axis when the values span more than a factor of 20), atomically.
// The title is escaped.
int plot_write_svg(const plot_series_t *s, const char *path, const char *title);
