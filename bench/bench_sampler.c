// The host's share of a generated token: drawing it from a row of logits
// (infer/sampler.c) at SmolLM2's vocabulary (49,152) and Llama-3's (128,256),
// one thread, per row: greedy (sampler_argmax), temperature 0.7, top-p 0.9,
// top-k 50, each beside the plain form a C programmer writes first (a running
// argmax; expf per token, a sort for top-p), which is what hylo did before
// 2026-12-06; and a token's log-probability with 5 alternatives (the server's
// logprobs) beside exp per token in double. Logits: N(0, 3^2) pseudo-random, so that the running argmax's
// branches mispredict as they do on real logits.
//
//   build/bench/bench_sampler [reps=200]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/rng.h"
#include "base/timer.h"
#include "infer/sampler.h"

static int plain_argmax(const float *x, int n) {
    int k = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[k]) k = i;
    return k;
}

// Log-probabilities the plain way: exp per token in double, then the same
// insertion of the n largest as sampler_logprobs.
static float plain_logprobs(const float *x, int V, int id, int n_top, sampler_logprob_t *out) {
    float m = x[plain_argmax(x, V)];
    double sum = 0;
    for (int v = 0; v < V; v++)
        sum += exp((double)x[v] - m);
    const double lse = m + log(sum);
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (n == n_top && x[v] <= x[out->top_id[n - 1]]) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && x[v] > x[out->top_id[j - 1]]) {
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_id[j] = v;
    }
    for (int j = 0; j < n; j++)
        out->top_lp[j] = (float)(x[out->top_id[j]] - lse);
    out->n_top = n;
    return out->logprob = (float)(x[id] - lse);
}

static const float *g_p;
static int by_p_desc(const void *a, const void *b) {
    float x = g_p[*(const int *)a], y = g_p[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : *(const int *)a - *(const int *)b;
}

// Temperature (and top-p by a full sort when top_p < 1), as before 466e1a2.
static int plain_sample(const float *logits, int V, float temp, float top_p, float *p, int *idx, rng_t *r) {
    float m = logits[plain_argmax(logits, V)];
    for (int v = 0; v < V; v++)
        p[v] = expf((logits[v] - m) / temp), idx[v] = v;
    int n = V;
    double kept = 0;
    if (top_p < 1) {
        g_p = p;
        qsort(idx, (size_t)V, sizeof(int), by_p_desc);
        double total = 0;
        for (int v = 0; v < V; v++)
            total += p[v];
        for (int i = 0; i < V; i++)
            if ((kept += p[idx[i]]) >= top_p * total) {
                n = i + 1;
                break;
            }
    } else {
        for (int v = 0; v < V; v++)
            kept += p[v];
    }
    double u = (double)rng_uniform(r) * kept, acc = 0;
    for (int i = 0; i < n; i++)
        if (u < (acc += p[idx[i]])) return idx[i];
    return idx[n - 1];
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    const int vocab[2] = {49152, 128256};
    printf("bench_sampler: us per row, one thread, %d rows each\n", reps);
    printf("| V | what | hylo | plain | plain / hylo |\n| --- | --- | --- | --- | --- |\n");
    for (int iv = 0; iv < 2; iv++) {
        const int V = vocab[iv];
        float *x = malloc((size_t)V * sizeof(float)), *p = malloc((size_t)V * sizeof(float));
        int *idx = malloc((size_t)V * sizeof(int));
        rng_t r;
        rng_seed(&r, 5);
        rng_fill_normal(&r, x, V, 0.0f, 3.0f);
        const float temps[4] = {0, 0.7f, 0.7f, 0.7f}, tops[4] = {1, 1, 0.9f, 1};
        const int ks[4] = {0, 0, 0, 50};
        const char *what[4] = {"greedy", "temperature 0.7", "top-p 0.9", "top-k 50"};
        for (int c = 0; c < 4; c++) {
            sampler_t s;
            sampler_cfg_t cfg = {.temperature = temps[c], .top_k = ks[c], .top_p = tops[c], .seed = 1};
            if (sampler_init(&s, &cfg, V) < 0) return 1;
            volatile int sink = 0;
            double t0 = time_now();
            for (int i = 0; i < reps; i++) {
                x[i % V] += 1e-3f; // a new row each time (as far as the caches can tell)
                sink += sampler_sample(&s, x);
            }
            const double hylo_us = (time_now() - t0) * 1e6 / reps;
            sampler_free(&s);
            double plain_us = -1;
            if (c < 3) { // (top-k's heap is the same code in both)
                rng_t pr;
                rng_seed(&pr, 1);
                t0 = time_now();
                for (int i = 0; i < reps; i++) {
                    x[i % V] += 1e-3f;
                    sink += c == 0 ? plain_argmax(x, V) : plain_sample(x, V, temps[c], tops[c], p, idx, &pr);
                }
                plain_us = (time_now() - t0) * 1e6 / reps;
            }
            if (plain_us > 0)
                printf("| %d | %s | %.1f | %.1f | %.1fx |\n", V, what[c], hylo_us, plain_us, plain_us / hylo_us);
            else
                printf("| %d | %s | %.1f | | |\n", V, what[c], hylo_us);
            (void)sink;
        }
        // a token's log-probability and 5 alternatives (the server's logprobs)
        {
            sampler_logprob_t lp = {0}, lq = {0};
            volatile float sink = 0;
            double t0 = time_now();
            for (int i = 0; i < reps; i++) {
                x[i % V] += 1e-3f;
                sampler_logprobs(x, V, i % V, 5, &lp);
                sink += lp.logprob;
            }
            const double hylo_us = (time_now() - t0) * 1e6 / reps;
            t0 = time_now();
            for (int i = 0; i < reps; i++) {
                x[i % V] += 1e-3f;
                sink += plain_logprobs(x, V, i % V, 5, &lq);
            }
            const double plain_us = (time_now() - t0) * 1e6 / reps;
            sampler_logprobs(x, V, 7, 5, &lp); // both on one row
            plain_logprobs(x, V, 7, 5, &lq);
            double d = fabs((double)lp.logprob - lq.logprob);
            for (int j = 0; j < 5; j++)
                d = fmax(d, fabs((double)lp.top_lp[j] - lq.top_lp[j]));
            printf("| %d | logprobs, 5 alternatives (largest difference %.1e) | %.1f | %.1f | %.1fx |\n", V, d, hylo_us,
                   plain_us, plain_us / hylo_us);
            (void)sink;
        }
        free(x), free(p), free(idx);
    }
    return 0;
}
