// Next-token sampling from logits: greedy (temperature 0), or temperature,
// then top-k, then top-p (nucleus) on the renormalised distribution, with a
// seeded generator so a seed reproduces a sample exactly.
#pragma once
#include <stdint.h>

#include "base/rng.h"

typedef struct {
    float temperature; // 0 = greedy
    int top_k;         // 0 = off
    float top_p;       // 1 = off
    uint64_t seed;
    // OpenAI's penalties on the tokens generated so far (sampler_sample_after),
    // in [-2, 2]: logit -= frequency_penalty * count + presence_penalty * (count > 0)
    float presence_penalty, frequency_penalty;
    // OpenAI's logit_bias: bias[i] (in [-100, 100]) added to the logit of
    // bias_id[i] before sampling (sampler_sample_after); the arrays are the
    // caller's and must outlive the sampler
    const int32_t *bias_id;
    const float *bias;
    int n_bias;
} sampler_cfg_t;

typedef struct {
    sampler_cfg_t cfg;
    rng_t rng;
    int V;
    float *prob; // scratch [V]
    int *idx;    // scratch [V]
    float *pen;  // with penalties or biases: the adjusted logits [V]
    int *count;  // each id's count among the tokens so far [V], zeros between calls
} sampler_t;

// ERR_INPUT naming the first setting out of its range (biases: ids in [0, V)),
// else 0: what sampler_init checks, for a caller that holds the settings
// before it makes a sampler (the server's submit).
int sampler_cfg_check(const sampler_cfg_t *cfg, int V);
int sampler_init(sampler_t *s, const sampler_cfg_t *cfg, int V);
void sampler_free(sampler_t *s);
int sampler_sample(sampler_t *s, const float *logits);
// The same after the logit biases and the penalties of s->cfg over prev, the
// n_prev tokens generated so far (none set: sampler_sample itself). Penalties
// apply to the answer's tokens only, not the prompt's (as vLLM applies
// OpenAI's two).
int sampler_sample_after(sampler_t *s, const float *logits, const int32_t *prev, int n_prev);
int sampler_argmax(const float *logits, int V);
// The most alternatives sampler_logprobs reports (OpenAI's top_logprobs limit).
enum { SAMPLER_MAX_TOP = 20 };
// A token's log-probability and its n_top most probable alternatives.
typedef struct {
    float logprob;
    int n_top;
    int32_t top_id[SAMPLER_MAX_TOP];
    float top_lp[SAMPLER_MAX_TOP];
} sampler_logprob_t;
// Log-probabilities under the model's own distribution, softmax(logits) (no
// temperature, top-k or top-p: what the model assigns, as vLLM's default
// raw logprobs): id's, and the n_top (clamped to 0..SAMPLER_MAX_TOP) most
// probable ids and theirs, most probable first (ties: lower id first).
void sampler_logprobs(const float *logits, int V, int id, int n_top, sampler_logprob_t *out);
// Top-p over all V tokens without sorting them: ids = the smallest set of
// the most probable tokens (ties: lower ids first) whose mass reaches top_p
// of the whole, in id order, and *mass = their mass (prob: non-negative
// weights, not necessarily normalised). Returns how many.
int sampler_nucleus(const float *prob, int V, float top_p, int *ids, double *mass);
