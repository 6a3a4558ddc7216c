// A progress bar with an ETA on stderr for evaluations that run for minutes:
// redrawn in place on a terminal, a plain line every 10% (or minute) when
// stderr is a file or pipe, silent at the quiet log level.
#pragma once
#include <stdint.h>

typedef struct {
    char label[64];
    int64_t total, done;
    double t0, last;
    int tty, last_pct, quiet;
} ev_progress_t;

void ev_progress_start(ev_progress_t *p, const char *label, int64_t total);
void ev_progress_add(ev_progress_t *p, int64_t n);
void ev_progress_end(ev_progress_t *p);
