// The serving engine: the thread in srv_engine_run owns the model and runs
// every accepted request to its end; HTTP threads submit requests and get
// their tokens back through callbacks. Each running request has its own cache
// (model_state_t, B = 1), paged: its attention / MLA rows in pages of one
// pool shared with the prefix cache (model.h model_pool_t), taken as it
// grows; its GDN / Mamba-2 states its own. Each turn runs one forward:
// every request still in its prompt feeds one prefill chunk and every request
// already decoding gets its next token, its row riding in the batched prefill
// (model_prefill_batch) when there are chunks, else one decode step of all of
// them together (model_step_batch); continuous batching, each request at its
// own length. A token budget per turn (max_batched_tokens) may cut or defer
// the chunks, never a decode token. Up to max_seqs run at once, others wait
// in a bounded queue. A request starts when
// the pages of its prompt are free; when a running one needs a page and none
// is, the prefix cache's least recently used entries give theirs back, then
// the newest running request is preempted: its pages freed, it goes back to
// the head of the queue and is prefilled again (its answer so far included)
// when pages free up, its client's stream going on (docs/SERVING.md).
#pragma once
#include <stdint.h>

#include "infer/sampler.h"
#include "model/model.h"
#include "serve/metrics.h"
#include "serve/prefix.h"

typedef struct srv_engine srv_engine_t;

typedef struct {
    int max_seqs;            // sequences running at once
    int queue;               // requests waiting beyond them
    int ctx;                 // most tokens of one sequence (prompt + answer)
    int chunk;               // prefill tokens per turn of a sequence
    int threads;             // OpenMP threads of srv_engine_run (0: the default)
    const int32_t *stop_ids; // token ids that end a generation (not output)
    int n_stop_ids;
    int64_t prefix_bytes; // the prefix cache's budget (serve/prefix.h); 0: none
    // Bytes of the running requests' caches (0: no limit): max_seqs
    // sequences' fixed states, the rest pages of the pool (srv_pool_pages).
    // A request that could not run alone in the pool is refused at submit
    // (ERR_INPUT naming both figures).
    int64_t cache_budget;
    int prefix_block; // its boundaries of recurrent states, in tokens
    // Tokens of one turn's forward (0: no limit but max_seqs x chunk), as
    // vLLM's max_num_batched_tokens. The decode tokens count first (one a
    // decoding request; never deferred), then the prefilling requests get
    // their chunks in the order they entered the batch (oldest first), each
    // cut to what the budget has left; those that get nothing wait for the
    // next turn. The oldest prefilling request always gets a token at least,
    // so a forward holds at most max(max_batched_tokens, max_seqs) tokens.
    int max_batched_tokens;
} srv_engine_cfg_t;

typedef enum { SRV_FINISH_STOP, SRV_FINISH_LENGTH, SRV_FINISH_CANCELLED, SRV_FINISH_ERROR } srv_finish_t;

typedef struct {
    srv_finish_t finish;
    int n_prompt, n_new; // tokens prefilled, tokens generated (handed to on_token)
    int status;          // SRV_FINISH_ERROR / CANCELLED: the HTTP status that fits (503, 500, 400)
    char msg[320];       // and the message
} srv_done_t;

typedef struct {
    const int32_t *prompt; // copied by srv_engine_submit
    int n_prompt;
    int max_new; // n_prompt + max_new <= ctx
    sampler_cfg_t sampler;
    int logprobs;     // nonzero: each token's log-probability goes to on_token,
    int top_logprobs; // with this many alternatives (<= SAMPLER_MAX_TOP)
    double t_arrival; // time_now() when the request arrived (time to first token)
    // Called on the engine thread. on_token gets every generated token (never
    // a stop id) and, when logprobs is set, its log-probabilities (else lp is
    // NULL); nonzero ends the request with SRV_FINISH_STOP. on_done is
    // called exactly once for every accepted request, last: after it the
    // engine never touches user again.
    int (*on_token)(void *user, int32_t id, const sampler_logprob_t *lp);
    void (*on_done)(void *user, const srv_done_t *d);
    void *user;
} srv_submit_t;

// The cache bytes a request of n tokens (prompt + max_new) plans on m's
// device: n rows of every attention / MLA layer, and the GDN / Mamba-2
// states and conv windows (allocation padding aside).
int64_t srv_request_bytes(const model_t *m, int n);
// Pages of the engine's pool for cfg (model.h model_pool_t): what the cache
// budget holds after max_seqs sequences' fixed states, at most what max_seqs
// requests of ctx tokens and a full prefix cache can hold (all of that when
// there is no budget); < 1 when the budget holds no page.
int64_t srv_pool_pages(const model_t *m, const srv_engine_cfg_t *cfg);

// What the engine has run: turns with a request to feed the model (in its
// prompt or decoding), the forwards they ran (one a turn: a batched prefill,
// or a decode step when no request was in its prompt; fewer only where every
// request of a turn failed before it), the forwards that carried decode tokens beside prefill chunks
// (mixed), and those tokens (rode); the tokens of all forwards (prefill
// chunks and decode tokens) and the most that one forward carried
// (max_tokens); and, under a token budget (max_batched_tokens), the chunks
// it shortened (cut) and the prefilling requests it left without a chunk for
// a turn (deferred, counted once a turn each); the decode steps whose tokens
// were chosen on the device, every request in them greedy without penalties,
// biases or log-probabilities (greedy: model_greedy_queue, no logits copied).
typedef srv_engine_counts_t srv_engine_stats_t; // serve/metrics.h, which exports them

// srv_engine_submit's refusals (positive: not errors of the engine).
enum { SRV_QUEUE_FULL = 1, SRV_SHUTTING_DOWN = 2 };

// An engine over m (the caller keeps m alive until srv_engine_free); nothing
// runs until srv_engine_run. metrics may be NULL.
int srv_engine_create(srv_engine_t **e, model_t *m, const srv_engine_cfg_t *cfg, srv_metrics_t *metrics);
// Queues a request: 0 (accepted: *id names it, on_done will come),
// SRV_QUEUE_FULL, SRV_SHUTTING_DOWN, or a negative ERR_* (bad sizes, a
// prompt token outside the model's vocabulary, memory).
int srv_engine_submit(srv_engine_t *e, const srv_submit_t *s, uint64_t *id);
// Ends request id as soon as the engine thread sees it (within one step):
// its cache is freed and on_done comes with SRV_FINISH_CANCELLED. Nothing
// when it has finished already.
void srv_engine_cancel(srv_engine_t *e, uint64_t id);
int srv_engine_ctx(const srv_engine_t *e);
// The counts so far (any thread).
srv_engine_stats_t srv_engine_stats(srv_engine_t *e);
// Pages of the engine's pool (srv_pool_pages).
int srv_engine_pages(const srv_engine_t *e);
// The engine loop, on the calling thread, until srv_engine_shutdown: then
// everything queued and running is cancelled (each gets on_done) and it
// returns. Call it on the thread that loaded the model, so that the model's
// OpenMP regions run in the process's one thread pool: a second pool (an
// engine thread of its own) makes libgomp count more threads than cores and
// stop spinning between regions, and every region of a decode step then
// waits for a futex wake-up (docs/SERVING.md: it halved single-stream speed).
void srv_engine_run(srv_engine_t *e);
// Asks srv_engine_run to cancel everything and return; any thread, does not
// wait. Later submits are refused. Idempotent.
void srv_engine_shutdown(srv_engine_t *e);
// Frees the engine, once srv_engine_run has returned (if it never ran, what
// was queued is cancelled first).
void srv_engine_free(srv_engine_t *e);
