#include "infer/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "base/err.h"

int sampler_init(sampler_t *s, const sampler_cfg_t *cfg, int V) {
    s->prob = NULL, s->idx = NULL;
    if (cfg->temperature < 0) return err_set(ERR_INPUT, "--temp must be >= 0 (got %g)", cfg->temperature);
    if (cfg->top_p <= 0 || cfg->top_p > 1) return err_set(ERR_INPUT, "--top-p must be in (0, 1] (got %g)", cfg->top_p);
    if (cfg->top_k < 0) return err_set(ERR_INPUT, "--top-k must be >= 0 (got %d)", cfg->top_k);
    s->cfg = *cfg;
    s->V = V;
    rng_seed(&s->rng, cfg->seed);
    s->prob = malloc((size_t)V * sizeof(float));
    s->idx = malloc((size_t)V * sizeof(int));
    if (!s->prob || !s->idx) {
        sampler_free(s);
        return err_set(ERR_NOMEM, "out of memory");
    }
    return 0;
}

void sampler_free(sampler_t *s) {
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

int sampler_argmax(const float *logits, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

static int cmp_desc(const void *a, const void *b, void *base) {
    const float *p = base;
    float x = p[*(const int *)a], y = p[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int *)a - *(const int *)b);
}

// Heap of the k best candidates seen so far, the worst of them at the root
// (cmp_desc order), so each new candidate is one comparison with the root.
static void sift_down(int *h, int k, int i, const float *p) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= k) return;
        if (c + 1 < k && cmp_desc(&h[c + 1], &h[c], (void *)p) > 0) c++;
        if (cmp_desc(&h[c], &h[i], (void *)p) <= 0) return;
        int t = h[c];
        h[c] = h[i], h[i] = t;
        i = c;
    }
}

// idx[0..k) = the first k of all V candidates sorted by cmp_desc, in order,
// in O(V log k): top-k sampling then never sorts the whole vocabulary.
static void best_candidates(int *idx, int V, int k, const float *p) {
    for (int v = 0; v < k; v++)
        idx[v] = v;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(idx, k, i, p);
    for (int v = k; v < V; v++)
        if (cmp_desc(&v, &idx[0], (void *)p) < 0) {
            idx[0] = v;
            sift_down(idx, k, 0, p);
        }
    qsort_r(idx, (size_t)k, sizeof(int), cmp_desc, (void *)p);
}

int sampler_sample(sampler_t *s, const float *logits) {
    int V = s->V;
    if (s->cfg.temperature == 0.0f) return sampler_argmax(logits, V);
    float m = logits[sampler_argmax(logits, V)];
    for (int v = 0; v < V; v++)
        s->prob[v] = expf((logits[v] - m) / s->cfg.temperature);
    int n = s->cfg.top_k > 0 && s->cfg.top_k < V ? s->cfg.top_k : V;
    // Candidates: for plain temperature sampling every id in id order (the
    // inverse CDF needs no order, and sorting V per token dominated batched
    // sampling); else sorted by probability (ties by id), the top k kept, then
    // the smallest prefix whose mass reaches top_p.
    if (n == V && s->cfg.top_p >= 1.0f)
        for (int v = 0; v < V; v++)
            s->idx[v] = v;
    else
        best_candidates(s->idx, V, n, s->prob);
    double kept = 0;
    for (int i = 0; i < n; i++)
        kept += s->prob[s->idx[i]];
    if (s->cfg.top_p < 1.0f) {
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += s->prob[s->idx[i]];
            if (acc >= s->cfg.top_p * kept) {
                n = i + 1;
                kept = acc;
                break;
            }
        }
    }
    double r = (double)rng_uniform(&s->rng) * kept, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}
