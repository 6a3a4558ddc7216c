#include "infer/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int sampler_cfg_check(const sampler_cfg_t *cfg, int V) {
    if (cfg->temperature < 0) return err_set(ERR_INPUT, "--temp must be >= 0 (got %g)", cfg->temperature);
    if (!(fabsf(cfg->presence_penalty) <= 2) || !(fabsf(cfg->frequency_penalty) <= 2))
        return err_set(ERR_INPUT, "presence and frequency penalties must be in [-2, 2] (got %g, %g)",
                       cfg->presence_penalty, cfg->frequency_penalty);
    if (cfg->top_p <= 0 || cfg->top_p > 1) return err_set(ERR_INPUT, "--top-p must be in (0, 1] (got %g)", cfg->top_p);
    if (cfg->top_k < 0) return err_set(ERR_INPUT, "--top-k must be >= 0 (got %d)", cfg->top_k);
    if (cfg->n_bias < 0) return err_set(ERR_INPUT, "a negative count of logit biases");
    for (int i = 0; i < cfg->n_bias; i++) {
        if (cfg->bias_id[i] < 0 || cfg->bias_id[i] >= V)
            return err_set(ERR_INPUT, "logit bias of token %d: not a token id in [0, %d)", cfg->bias_id[i], V);
        if (!(fabsf(cfg->bias[i]) <= 100))
            return err_set(ERR_INPUT, "logit bias of token %d must be in [-100, 100] (got %g)", cfg->bias_id[i],
                           cfg->bias[i]);
    }
    return 0;
}

int sampler_init(sampler_t *s, const sampler_cfg_t *cfg, int V) {
    s->prob = NULL, s->idx = NULL, s->pen = NULL, s->count = NULL;
    int rc = sampler_cfg_check(cfg, V);
    if (rc < 0) return rc;
    s->cfg = *cfg;
    s->V = V;
    rng_seed(&s->rng, cfg->seed);
    s->prob = malloc((size_t)V * sizeof(float));
    s->idx = malloc((size_t)V * sizeof(int));
    const int pens = cfg->presence_penalty != 0 || cfg->frequency_penalty != 0 || cfg->n_bias > 0;
    if (pens) s->pen = malloc((size_t)V * sizeof(float)), s->count = calloc((size_t)V, sizeof(int));
    if (!s->prob || !s->idx || (pens && (!s->pen || !s->count))) {
        sampler_free(s);
        return err_set(ERR_NOMEM, "out of memory");
    }
    return 0;
}

void sampler_free(sampler_t *s) {
    free(s->prob);
    free(s->idx);
    free(s->pen);
    free(s->count);
    s->prob = NULL;
    s->idx = NULL;
    s->pen = NULL;
    s->count = NULL;
}

int sampler_sample_after(sampler_t *s, const float *logits, const int32_t *prev, int n_prev) {
    if (!s->pen) return sampler_sample(s, logits);
    memcpy(s->pen, logits, (size_t)s->V * sizeof(float));
    for (int i = 0; i < s->cfg.n_bias; i++)
        s->pen[s->cfg.bias_id[i]] += s->cfg.bias[i];
    for (int j = 0; j < n_prev; j++)
        if (prev[j] >= 0 && prev[j] < s->V) s->count[prev[j]]++;
    // each id once (its count back to 0 as it is applied)
    for (int j = 0; j < n_prev; j++) {
        const int t = prev[j];
        if (t < 0 || t >= s->V || !s->count[t]) continue;
        s->pen[t] -= s->cfg.frequency_penalty * (float)s->count[t] + s->cfg.presence_penalty;
        s->count[t] = 0;
    }
    return sampler_sample(s, s->pen);
}

// The first id of the largest logit: the maximum over 8 lanes (a pass the
// compiler vectorises), then its first occurrence; a running argmax is a
// chain of dependent selects. NaNs are never the maximum (all NaN: id 0).
int sampler_argmax(const float *logits, int V) {
    float lane[8];
    for (int j = 0; j < 8; j++)
        lane[j] = -INFINITY;
    int v = 0;
    for (; v + 8 <= V; v += 8)
        for (int j = 0; j < 8; j++)
            lane[j] = logits[v + j] > lane[j] ? logits[v + j] : lane[j];
    float mx = -INFINITY;
    for (int j = 0; j < 8; j++)
        mx = lane[j] > mx ? lane[j] : mx;
    for (; v < V; v++)
        mx = logits[v] > mx ? logits[v] : mx;
    for (v = 0; v < V; v++)
        if (logits[v] == mx) return v;
    return 0;
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

// e^x for x <= 0 (a scaled logit minus the largest) within ~2e-7 relative,
// as 2^n 2^f: n = round(x log2 e) into the exponent bits, 2^f (|f| <= 1/2)
// by its Taylor polynomial of degree 6 (error < 1.2e-7); 0 below 2^-126, a
// masked logit's -inf included. Plain arithmetic, so that the loop over the
// vocabulary vectorises: expf, a call per token, took ~4.5 ns each (223.7 us
// a row of 49,152 on the 2-core machine).
static inline float exp_nonpos(float x) {
    float t = x * 1.44269504f;
    t = t < -126.0f ? -127.0f : t;
    const float n = rintf(t), f = t - n;
    float p = 1.54035304e-4f;
    p = p * f + 1.33335581e-3f;
    p = p * f + 9.61812911e-3f;
    p = p * f + 5.55041087e-2f;
    p = p * f + 2.40226507e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; // n = -127: 0
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// Mass of prob over ids[0..n) (or ids 0..n when ids is NULL), in 8 lanes of
// doubles (a loop the compiler vectorises), then the lanes in order.
static double mass_of(const float *prob, const int *ids, int n) {
    double lane[8] = {0};
    int i = 0;
    if (ids) {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                lane[j] += prob[ids[i + j]];
    } else {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                lane[j] += prob[i + j];
    }
    double sum = 0;
    for (int j = 0; j < 8; j++)
        sum += lane[j];
    for (; i < n; i++)
        sum += prob[ids ? ids[i] : i];
    return sum;
}

// Radix selection of the probability where the nucleus ends, by the bits of
// the (non-negative) floats, which order as the values do: 12, 12 and 8 bits
// a level; only the bin holding the boundary goes on to the next level.
enum { NUC_BINS = 4096 };

static uint32_t prob_key(float p) {
    uint32_t key;
    memcpy(&key, &p, sizeof key);
    return key;
}

int sampler_nucleus(const float *prob, int V, float top_p, int *ids, double *mass) {
    const double total = mass_of(prob, NULL, V), target = (double)top_p * total;
    // Candidates: a token below t = (1 - top_p) total / V is never kept, since
    // all of those together weigh less than the (1 - top_p) total the nucleus
    // leaves out, so the tokens above t reach the target (t a little lower,
    // for rounding). On peaked logits few tokens are left.
    const double t = (1.0 - (double)top_p) * total / V * 0.999;
    int n_in = 0; // tokens in the boundary's bin, in id order: the candidates at level 0
    for (int v = 0; v < V; v++)
        if (prob[v] >= t) ids[n_in++] = v;
    static const int shift[3] = {20, 8, 0}, width[3] = {12, 12, 8};
    double bin_mass[NUC_BINS]; // 48 KB of stack with the counts
    int bin_count[NUC_BINS];
    uint32_t prefix = 0; // the boundary's key, its bits above shift[level] so far
    double above = 0;    // mass of the tokens above the boundary's bin
    int at_boundary = 0; // tokens whose key is the boundary's
    for (int level = 0; level < 3; level++) {
        const int nb = 1 << width[level];
        memset(bin_mass, 0, (size_t)nb * sizeof(double));
        memset(bin_count, 0, (size_t)nb * sizeof(int));
        for (int i = 0; i < n_in; i++) {
            const int v = ids[i];
            const uint32_t bin = (prob_key(prob[v]) >> shift[level]) & (uint32_t)(nb - 1);
            bin_mass[bin] += prob[v];
            bin_count[bin]++;
        }
        int b = nb - 1, low = -1; // the bin where the mass from the top reaches the target
        for (; b >= 0; b--) {
            if (bin_mass[b] <= 0) continue;
            low = b;
            if (above + bin_mass[b] >= target) break;
            above += bin_mass[b];
        }
        if (b < 0) { // rounding left the target just out of reach: the lowest bin with mass
            b = low;
            above -= bin_mass[b];
        }
        prefix = (prefix << width[level]) | (uint32_t)b;
        at_boundary = bin_count[b];
        if (level == 2) break;
        int n = 0; // the bin's tokens, in id order, for the next level
        for (int i = 0; i < n_in; i++)
            if ((prob_key(prob[ids[i]]) >> shift[level]) == prefix) ids[n++] = ids[i];
        n_in = n;
    }
    // Kept: every token above the boundary's value, then of the tokens at it
    // (ties: lower ids first) as many as the mass needs, one at least.
    const uint32_t key_b = prefix;
    float value_b;
    memcpy(&value_b, &key_b, sizeof value_b);
    const double p_b = value_b;
    double acc = above;
    int need = 0;
    while (need < at_boundary && (need == 0 || acc < target))
        acc += p_b, need++;
    int n = 0;
    double kept = 0;
    for (int v = 0; v < V; v++) {
        const uint32_t key = prob_key(prob[v]);
        if (key > key_b || (key == key_b && need-- > 0)) ids[n++] = v, kept += prob[v];
    }
    *mass = kept;
    return n;
}

// The inverse CDF: the first position i of the list (ids, or 0..n) at which
// the running mass passes r; blocks of 64 are skipped by their sums, then the
// block holding r is walked a token at a time. The last one when rounding
// leaves r beyond the whole mass.
static int draw_position(const float *prob, const int *ids, int n, double r) {
    double acc = 0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        const double block = ids ? mass_of(prob, ids + i, 64) : mass_of(prob + i, NULL, 64);
        if (r < acc + block) break;
        acc += block;
    }
    for (; i < n; i++) {
        acc += prob[ids ? ids[i] : i];
        if (r < acc) return i;
    }
    return n - 1;
}

void sampler_logprobs(const float *logits, int V, int id, int n_top, sampler_logprob_t *out) {
    int32_t *top_id = out->top_id;
    const float m = logits[sampler_argmax(logits, V)];
    // log sum exp(logits - m): the terms by exp_nonpos, summed in 8 double
    // lanes (the loop vectorises; expf / exp per token took 10x longer:
    // bench_sampler)
    double lane[8] = {0};
    int v = 0;
    for (; v + 8 <= V; v += 8) {
        float e[8];
        for (int j = 0; j < 8; j++)
            e[j] = exp_nonpos(logits[v + j] - m);
        for (int j = 0; j < 8; j++)
            lane[j] += e[j];
    }
    for (; v < V; v++)
        lane[0] += exp_nonpos(logits[v] - m);
    double sum = 0;
    for (int j = 0; j < 8; j++)
        sum += lane[j];
    const double lse = m + log(sum);
    if (n_top > SAMPLER_MAX_TOP) n_top = SAMPLER_MAX_TOP;
    if (n_top > V) n_top = V;
    if (n_top < 0) n_top = 0;
    // the n_top largest by insertion (a strictly larger logit moves up, so an
    // equal one stays behind the lower id that came first)
    int n = 0;
    for (v = 0; v < V && n_top > 0; v++) {
        if (n == n_top && logits[v] <= logits[top_id[n - 1]]) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && logits[v] > logits[top_id[j - 1]]) {
            top_id[j] = top_id[j - 1];
            j--;
        }
        top_id[j] = v;
    }
    for (int j = 0; j < n; j++)
        out->top_lp[j] = (float)(logits[top_id[j]] - lse);
    out->n_top = n;
    out->logprob = (float)(logits[id] - lse);
}

int sampler_sample(sampler_t *s, const float *logits) {
    int V = s->V;
    if (s->cfg.temperature == 0.0f) return sampler_argmax(logits, V);
    const float m = logits[sampler_argmax(logits, V)], inv_t = 1.0f / s->cfg.temperature;
    float *prob = s->prob;
#pragma omp simd
    for (int v = 0; v < V; v++)
        prob[v] = exp_nonpos((logits[v] - m) * inv_t);
    int n = s->cfg.top_k > 0 && s->cfg.top_k < V ? s->cfg.top_k : V;
    double kept = 0;
    if (n == V && s->cfg.top_p >= 1.0f) {
        // plain temperature sampling: every id in id order (the inverse CDF
        // needs no order)
        kept = mass_of(prob, NULL, V);
        return draw_position(prob, NULL, V, (double)rng_uniform(&s->rng) * kept);
    }
    if (n == V) {
        // top-p alone: the nucleus by radix selection, in id order (sorting
        // the vocabulary took ~4.7 ms a row of 49,152)
        n = sampler_nucleus(prob, V, s->cfg.top_p, s->idx, &kept);
    } else {
        // top-k: sorted by probability (ties by id), the top k kept, then
        // the smallest prefix whose mass reaches top_p
        best_candidates(s->idx, V, n, prob);
        kept = mass_of(prob, s->idx, n);
        if (s->cfg.top_p < 1.0f) {
            double acc = 0;
            for (int i = 0; i < n; i++) {
                acc += prob[s->idx[i]];
                if (acc >= s->cfg.top_p * kept) {
                    n = i + 1;
                    kept = acc;
                    break;
                }
            }
        }
    }
    return s->idx[draw_position(prob, s->idx, n, (double)rng_uniform(&s->rng) * kept)];
}
