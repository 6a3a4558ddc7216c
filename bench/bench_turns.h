// A server's prefill turns on any backend (bench_long --batch-prefill on the
// GPU with random weights, bench_prefill on a model file): 8 requests, paged
// states as hylo serve's, chunks of 128-512 tokens (2,720 in all), each turn
// fed one request per forward ("apart") and all of them in one forward
// (model_prefill_batch: the products over the packed rows, the recurrent
// layers over packed sequences, MLA's keys expanded together); a first turn
// from length 0 and a second over the first's cache. Each turn takes its
// rows' logits, as a server's does. Medians of `reps` runs after one
// warm-up. Static functions: each bench/*.c is its own program.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "model/model.h"

enum { TURN_SEQS = 8, TURN_REPS_MAX = 16 };

static double turn_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int turn_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// ms of one turn into *ms; 0 or < 0 with the error slot set.
static int turn_run(model_run_t *r, model_state_t **sts, int32_t *const *ids, const int *n, int together, float *logits,
                    double *ms) {
    double t0 = turn_now_s();
    int rc = 0;
    if (together)
        rc = model_prefill_batch(r, sts, TURN_SEQS, (const int32_t *const *)ids, n, NULL, logits);
    else
        for (int k = 0; k < TURN_SEQS && rc == 0; k++)
            rc = model_prefill_batch(r, sts + k, 1, (const int32_t *const *)ids + k, n + k, NULL, logits);
    *ms = 1e3 * (turn_now_s() - t0);
    return rc;
}

// Both turns apart and together on model m (run r), printed under `name`.
// 0, or < 0 with the error slot set.
static int bench_turns(const char *name, model_t *m, model_run_t *r, int reps) {
    static const int n[TURN_SEQS] = {512, 384, 256, 448, 320, 192, 480, 128};
    if (reps < 1 || reps > TURN_REPS_MAX) return err_set(ERR_INPUT, "reps %d: 1 to %d", reps, TURN_REPS_MAX);
    be_t *be = m->be;
    int total = 0, rc = 0, made = 0;
    for (int k = 0; k < TURN_SEQS; k++)
        total += n[k];
    model_pool_t pool;
    model_state_t st[TURN_SEQS], *sts[TURN_SEQS];
    int32_t *ids[TURN_SEQS] = {0};
    float *logits = NULL;
    TRY(model_pool_create(m, &pool, TURN_SEQS * 2 * model_pages_for(512) + 8));
    for (; made < TURN_SEQS && rc == 0; made++) {
        rc = model_state_alloc_paged(m, &st[made], &pool, 2048);
        if (rc < 0) break;
        sts[made] = &st[made];
        ids[made] = malloc((size_t)n[made] * sizeof(int32_t));
        if (!ids[made]) rc = err_set(ERR_NOMEM, "out of memory");
        for (int i = 0; rc == 0 && i < n[made]; i++)
            ids[made][i] = (int32_t)(((unsigned)(made * 1000 + i) * 7919u + 13u) % (unsigned)m->a.V);
    }
    if (rc == 0 && !(logits = be->host_alloc(be, (size_t)TURN_SEQS * m->a.V * sizeof(float)))) rc = ERR_NOMEM;
    double t[2][2][TURN_REPS_MAX];                   // [together][turn][rep]
    for (int rep = -1; rep < reps && rc == 0; rep++) // rep -1: warm-up
        for (int tog = 0; tog < 2 && rc == 0; tog++) {
            double t1 = 0, t2 = 0;
            for (int k = 0; k < TURN_SEQS; k++)
                model_state_reset(m, &st[k]);
            rc = turn_run(r, sts, ids, n, tog, logits, &t1);
            if (rc == 0) rc = turn_run(r, sts, ids, n, tog, logits, &t2);
            if (rep >= 0) t[tog][0][rep] = t1, t[tog][1][rep] = t2;
        }
    for (int turn = 0; turn < 2 && rc == 0; turn++) {
        qsort(t[0][turn], (size_t)reps, sizeof(double), turn_cmp);
        qsort(t[1][turn], (size_t)reps, sizeof(double), turn_cmp);
        double ap = t[0][turn][reps / 2], tg = t[1][turn][reps / 2];
        printf("%-12s turn %d (%s): %d tokens of 8 requests  apart %9.2f ms (%8.0f tok/s)  together %9.2f ms (%8.0f "
               "tok/s)  apart / together %.2fx\n",
               name, turn + 1, turn ? "over the first's cache" : "from length 0", total, ap, 1e3 * total / ap, tg,
               1e3 * total / tg, ap / tg);
    }
    fflush(stdout);
    if (logits) be->host_free(be, logits);
    for (int k = 0; k < made; k++)
        model_state_free(m, &st[k]), free(ids[k]);
    model_pool_free(m, &pool);
    return rc;
}
