// Perplexity on text files (eval.md §3): lm-eval's rolling loglikelihood
// windows (wikitext convention, context_len 1) and the strided sliding window;
// token, word and byte perplexity and bits per byte.
#pragma once
#include <stdint.h>

#include "eval/ev_model.h"

// One scoring window over the sequence S = [prefix] + T (T the document's
// tokens): the model is given S[start .. end - 1) and the last n_score tokens
// of S[start .. end) are scored.
typedef struct {
    int64_t start, end;
    int n_score;
} ev_window_t;

// lm-eval's get_rolling_token_windows + make_disjoint_window for a document of
// n tokens and a model length max_len: windows into out (cap entries), the
// count returned (or -1 when cap is too small). Every token of T is scored
// exactly once; the first window is [prefix] + T[0..max_len-1), each later
// one predicts a block of up to max_len tokens from the max_len tokens before
// its end (so a full block is conditioned on one token of context).
int64_t ev_rolling_windows(int64_t n, int max_len, ev_window_t *out, int64_t cap);
// The strided variant: windows of Lw model inputs started every `stride`
// tokens over S; each scores the tokens the previous one did not (stride ==
// Lw gives ev_rolling_windows' windows).
int64_t ev_strided_windows(int64_t n, int Lw, int stride, ev_window_t *out, int64_t cap);

// Sum of log p over a document's tokens (ids[0..n)) through the windows.
int ev_ppl_doc(ev_lm_t *lm, const int32_t *ids, int64_t n, const ev_window_t *w, int64_t nw, double *ll);

typedef struct {
    double ll; // sum over documents, nats
    int64_t tokens, words, bytes, docs, windows;
} ev_ppl_sums_t;
// Token, word and byte perplexity and bits per byte of the pooled sums.
double ev_ppl_token(const ev_ppl_sums_t *s);
double ev_ppl_word(const ev_ppl_sums_t *s);
double ev_ppl_byte(const ev_ppl_sums_t *s);
double ev_bits_per_byte(const ev_ppl_sums_t *s);
