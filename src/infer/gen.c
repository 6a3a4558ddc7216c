#include "infer/gen.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timer.h"

int gen_stop_ids(const tok_t *t, const arch_t *a, int32_t *ids, int cap) {
    int n = tok_eot_ids(t, ids, cap);
    if (n > cap) n = cap;
    for (int i = 0; i < a->n_eos; i++) {
        int32_t id = a->eos_ids[i];
        int seen = id < 0 || id >= a->V;
        for (int j = 0; j < n; j++)
            seen |= ids[j] == id;
        if (!seen && n < cap) ids[n++] = id;
    }
    return n;
}

static int is_stop(const gen_cfg_t *cfg, int32_t id) {
    for (int i = 0; i < cfg->n_stop; i++)
        if (cfg->stop[i] == id) return 1;
    return 0;
}

// Greedy decoding after the prefill chose `id` (not a stop id), a step
// always queued ahead: step k + 1, fed the id step k chose on the device, is
// queued before step k's id is read, so the device runs it while the host
// reads, emits and queues. At most max_new steps, as the sampling loop (each
// emitted token fed, the callback's verdict after it), but a stop id is fed
// by the step queued after it (stats->stop_fed).
static int decode_greedy(model_run_t *r, model_state_t *st, const gen_cfg_t *cfg, int32_t id, gen_token_fn on_token,
                         void *user, gen_stats_t *stats) {
    stats->n_new = 1;
    int rc = model_greedy_queue(r, &st, 1, &id); // step 1, fed the first token
    int stop = rc < 0 || (on_token && on_token(user, id));
    for (int k = 1; !stop && k < cfg->max_new; k++) {
        rc = model_greedy_queue(r, &st, 1, NULL); // step k + 1, fed step k's choice
        if (rc == 0) rc = model_greedy_take(r, &id);
        if (rc < 0) break;
        if (is_stop(cfg, id)) {
            stats->stopped = stats->stop_fed = 1;
            stats->stop_id = id;
            break;
        }
        stats->n_new++;
        stop = on_token && on_token(user, id);
    }
    // the steps still in flight (the last one's choice is not emitted)
    int drc = model_greedy_drain(r);
    return rc < 0 ? rc : drc;
}

int gen_run(model_run_t *r, model_state_t *st, const int32_t *prompt, int n_prompt, const gen_cfg_t *cfg,
            gen_token_fn on_token, void *user, gen_stats_t *stats) {
    memset(stats, 0, sizeof *stats);
    if (st->B != 1) return err_set(ERR_INPUT, "gen_run generates one sequence at a time");
    if (n_prompt < 1) return err_set(ERR_INPUT, "empty prompt");
    const model_t *m = r->m;
    // Room for the whole request at once (the prompt and every answer token,
    // within the context): one allocation of exactly that, where growing with
    // use would double the cache (half of it unused) and copy it, both
    // buffers held during the copy. Without that much memory the cache grows
    // with use as before (a step may then run out of memory).
    int64_t need = (int64_t)st->len + n_prompt + (cfg->max_new > 0 ? cfg->max_new : 0);
    if (model_state_fit(m, st, need < st->ctx ? (int)need : st->ctx) < 0) err_clear();
    sampler_t smp;
    TRY(sampler_init(&smp, &cfg->sampler, m->a.V));
    float *logits = m->be->host_alloc(m->be, (size_t)m->a.V * sizeof(float)); // (page-locked on a GPU)
    if (!logits) {
        sampler_free(&smp);
        return ERR_NOMEM;
    }
    double t0 = time_now();
    int rc = model_prefill(r, st, prompt, n_prompt, cfg->prefill_chunk, logits);
    model_run_trim(r); // the prefill's temporaries: decode steps need a fraction of them
    stats->n_prompt = n_prompt;
    stats->prefill_s = time_now() - t0;
    t0 = time_now();
    if (rc == 0 && cfg->sampler.temperature == 0.0f && cfg->max_new > 0) {
        int32_t id = sampler_argmax(logits, m->a.V);
        if (is_stop(cfg, id))
            stats->stopped = 1, stats->stop_id = id;
        else
            rc = decode_greedy(r, st, cfg, id, on_token, user, stats);
    }
    for (int i = 0; rc == 0 && cfg->sampler.temperature != 0.0f && i < cfg->max_new; i++) {
        int32_t id = sampler_sample(&smp, logits);
        if (is_stop(cfg, id)) {
            stats->stopped = 1;
            stats->stop_id = id;
            break;
        }
        stats->n_new++;
        // Fed back before the callback's verdict, so the cache always holds the
        // prompt and every emitted token (a chat continues from there).
        rc = model_step(r, st, &id, logits);
        if (on_token && on_token(user, id)) break;
    }
    stats->decode_s = time_now() - t0;
    m->be->host_free(m->be, logits);
    sampler_free(&smp);
    return rc;
}
