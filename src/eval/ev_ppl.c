#include "eval/ev_ppl.h"

#include <math.h>
#include <stdlib.h>

#include "base/err.h"

int64_t ev_rolling_windows(int64_t n, int max_len, ev_window_t *out, int64_t cap) {
    int64_t k = 0, pred = 0;
    if (n <= 0) return 0;
    // first window: [prefix] + T[0 : L - 1] predicts T[0 : L]
    int64_t L = n < max_len ? n : max_len;
    if (k >= cap) return -1;
    out[k++] = (ev_window_t){0, L + 1, (int)L};
    pred = L;
    while (pred < n) {
        int64_t len = n - pred < max_len ? n - pred : max_len, e = pred + len; // block T[pred : e]
        // input T[e - max_len - 1 : e - 1] = S[e - max_len : e], targets up to S[e]
        if (k >= cap) return -1;
        out[k++] = (ev_window_t){e - max_len, e + 1, (int)len};
        pred = e;
    }
    return k;
}

int64_t ev_strided_windows(int64_t n, int Lw, int stride, ev_window_t *out, int64_t cap) {
    int64_t k = 0, prev = 1, N = n + 1; // S = [prefix] + T; S[0] is never a target
    if (n <= 0) return 0;
    for (int64_t begin = 0;; begin += stride) {
        int64_t end = begin + Lw + 1 < N ? begin + Lw + 1 : N;
        int64_t start = end - Lw - 1 > 0 ? end - Lw - 1 : 0;
        if (end > prev) {
            if (k >= cap) return -1;
            out[k++] = (ev_window_t){start, end, (int)(end - prev)};
            prev = end;
        }
        if (end == N) break;
    }
    return k;
}

int ev_ppl_doc(ev_lm_t *lm, const int32_t *ids, int64_t n, const ev_window_t *w, int64_t nw, double *ll) {
    *ll = 0;
    int64_t maxw = 0;
    for (int64_t i = 0; i < nw; i++)
        if (w[i].end - w[i].start > maxw) maxw = w[i].end - w[i].start;
    int32_t *s = malloc((size_t)(maxw > 0 ? maxw : 1) * sizeof *s);
    double *lp = malloc((size_t)(maxw > 0 ? maxw : 1) * sizeof *lp);
    int rc = s && lp ? 0 : err_set(ERR_NOMEM, "out of memory");
    for (int64_t i = 0; rc == 0 && i < nw; i++) {
        int len = (int)(w[i].end - w[i].start);
        for (int j = 0; j < len; j++) {
            int64_t p = w[i].start + j; // position in S = [prefix] + ids
            s[j] = p == 0 ? lm->prefix_id : ids[p - 1];
        }
        rc = lm->window(lm, s, len, len - w[i].n_score, lp);
        for (int j = len - w[i].n_score; rc == 0 && j < len; j++)
            *ll += lp[j];
    }
    free(s), free(lp);
    return rc;
}

double ev_ppl_token(const ev_ppl_sums_t *s) { return exp(-s->ll / (double)s->tokens); }
double ev_ppl_word(const ev_ppl_sums_t *s) { return exp(-s->ll / (double)s->words); }
double ev_ppl_byte(const ev_ppl_sums_t *s) { return exp(-s->ll / (double)s->bytes); }
double ev_bits_per_byte(const ev_ppl_sums_t *s) { return -s->ll / (double)s->bytes / log(2.0); }
