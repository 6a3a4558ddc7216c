#include "eval/ev_progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"

static void fmt_time(char *out, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else
        snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
}

static void draw(ev_progress_t *p, int final) {
    double el = time_now() - p->t0;
    double eta = p->done ? el / (double)p->done * (double)(p->total - p->done) : 0;
    char e1[32], e2[32];
    fmt_time(e1, sizeof e1, el);
    fmt_time(e2, sizeof e2, eta);
    int pct = p->total ? (int)(100 * p->done / p->total) : 100;
    if (p->tty) {
        char bar[31];
        int fill = p->total ? (int)(30 * p->done / p->total) : 30;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r%-18s [%s] %3d%% %lld/%lld  %s elapsed, ETA %s ", p->label, bar, pct, (long long)p->done,
                (long long)p->total, e1, final ? "0m00s" : e2);
        if (final) fputc('\n', stderr);
    } else {
        fprintf(stderr, "hylo: %s: %lld/%lld (%d%%), %s elapsed, ETA %s\n", p->label, (long long)p->done,
                (long long)p->total, pct, e1, final ? "0m00s" : e2);
    }
    fflush(stderr);
}

void ev_progress_start(ev_progress_t *p, const char *label, int64_t total) {
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t0 = p->last = time_now();
    p->tty = isatty(2);
    p->quiet = log_level() > LOG_INFO;
    if (!p->quiet && p->tty) draw(p, 0);
}

void ev_progress_add(ev_progress_t *p, int64_t n) {
    p->done += n;
    if (p->quiet) return;
    double now = time_now();
    int pct = p->total ? (int)(100 * p->done / p->total) : 100;
    if (p->tty) {
        if (now - p->last >= 0.2) draw(p, 0), p->last = now;
    } else if (p->done < p->total && (pct / 10 > p->last_pct / 10 || now - p->last >= 60)) {
        draw(p, 0);
        p->last = now, p->last_pct = pct;
    }
}

void ev_progress_end(ev_progress_t *p) {
    if (!p->quiet) draw(p, 1);
}
