// The generation loop: chunked prefill of a prompt into the hybrid cache, then
// decode steps with the sampler until a stop token or the token budget,
// handing each new token to a callback as it comes.
#pragma once
#include <stdint.h>

#include "infer/sampler.h"
#include "model/model.h"
#include "tok/tok.h"

typedef struct {
    int max_new; // new tokens at most
    sampler_cfg_t sampler;
    const int32_t *stop; // stop ids (not fed back, not counted as output)
    int n_stop;
    int prefill_chunk; // tokens per prefill step (0 = all at once)
} gen_cfg_t;

typedef struct {
    int n_prompt, n_new;
    double prefill_s, decode_s; // wall time of the prefill and of the decode loop
    int stopped;                // 1 when a stop id ended generation
    int32_t stop_id;
    int stop_fed; // 1 when the cache holds the stop id too (greedy decoding, see gen_run)
} gen_stats_t;

// The ids that end generation: the tokenizer's end-of-turn ids (tok_eot_ids)
// and every eos id of the model's config (generation_config.json may list
// more, as Llama-3.1's <|end_of_text|> beside <|eot_id|>), as transformers'
// generate stops on them; deduplicated, at most cap. Returns the count.
int gen_stop_ids(const tok_t *t, const arch_t *a, int32_t *ids, int cap);

// Called for every generated token; return nonzero to stop early.
typedef int (*gen_token_fn)(void *user, int32_t id);

// Feeds `prompt` after whatever st already holds and generates (B = 1). On
// return the cache holds the prompt and every emitted token, and, where
// stats->stop_fed, the stop id after them. Greedy decoding (temperature 0)
// chooses each token on the device and queues the next step before the host
// has read the token (model_greedy_queue): the step after a stop id has then
// fed it already; sampling feeds no stop id.
int gen_run(model_run_t *r, model_state_t *st, const int32_t *prompt, int n_prompt, const gen_cfg_t *cfg,
            gen_token_fn on_token, void *user, gen_stats_t *stats);
