// The evaluation module's one door to the model: every call into the model and
// generation API (src/model, src/infer) is made in ev_model.c, behind the
// three operations the scorers need. The rest of src/eval sees only ev_lm_t,
// so a change of the model API touches this file alone, and tests can hand the
// scorers a model of their own (a table of known distributions).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "tok/tok.h"

// One continuation: token ids.
typedef struct {
    const int32_t *ids;
    int n;
} ev_span_t;

// What a continuation scores: sum of log p(token | everything before) in nats,
// and whether every token is the model's argmax at its position.
typedef struct {
    double ll;
    int greedy;
} ev_ll_t;

// A greedy generation: the decoded text (cut at the first stop string), the
// number of new tokens, whether a stop string or stop token ended it.
typedef struct {
    char *text;
    int n_new, stopped;
    double prefill_s, decode_s;
} ev_gen_t;

typedef struct ev_lm ev_lm_t;
struct ev_lm {
    const tok_t *tok;
    int max_len;       // the most tokens the model is given at once (lm-eval max_length)
    int32_t prefix_id; // lm-eval's prefix token: BOS, or EOS when there is none
    void *impl;
    // 1. Log-likelihood of each continuation conts[i] after the same context
    //    ctx (n_ctx >= 1), as lm-eval computes it: the model sees
    //    (ctx + cont)[-(max_len + 1):][:-1]; out[i] gets the sum of the
    //    continuation's log-probabilities and its greedy flag.
    int (*loglik)(ev_lm_t *lm, const int32_t *ctx, int n_ctx, const ev_span_t *conts, int n_conts, ev_ll_t *out);
    // 2. Log-probabilities of a token window: lp[i] = log p(ids[i] | ids[0..i))
    //    for first <= i < n (1 <= first < n <= max_len + 1); the model sees ids[0..n-1).
    int (*window)(ev_lm_t *lm, const int32_t *ids, int n, int first, double *lp);
    // 3. Greedy generation of at most max_new tokens after prompt, ending at the
    //    model's stop tokens or at the first of the stop strings (the text is cut
    //    there, as lm-eval's generate_until does). out->text is malloc'ed.
    int (*generate)(ev_lm_t *lm, const int32_t *prompt, int n_prompt, int max_new, const char *const *stops,
                    int n_stops, ev_gen_t *out);
};

// A loaded model and its tokenizer (the CLI loads them with cli_load_model) as
// an ev_lm_t. max_len 0: the model's max_position_embeddings (2048 when the
// config has none). prefill_chunk: tokens per prefill step of generation.
int ev_model_wrap(ev_lm_t *lm, model_t *m, const tok_t *tok, int max_len, int prefill_chunk);
void ev_model_unwrap(ev_lm_t *lm);

// hylo bench: one point of a latency sweep on the wrapped model, with random
// token ids (seeded): prefill of T tokens in chunks, then n_decode greedy decode
// steps timed after 2 untimed ones; the cache bytes for T + n_decode + 3 tokens.
typedef struct {
    int T, n_decode;
    double prefill_s, decode_s; // wall time (the backend synchronised)
    size_t cache_bytes, weight_bytes;
} ev_bench_t;
int ev_model_bench(ev_lm_t *lm, int T, int n_decode, uint64_t seed, ev_bench_t *out);
// A short description of the model for reports: architecture name, layer
// mixers, parameter count, backend.
typedef struct {
    char arch[64], backend[16], mixers[128];
    int64_t params;
    int n_layers, V, max_pos;
} ev_model_info_t;
void ev_model_info(const ev_lm_t *lm, ev_model_info_t *info);
