// A whole model on a backend, in two parts: its weights (model_t: architecture,
// flat weights, per-layer views, RoPE tables), shared read-only by everything
// that runs it, and a run's execution context (model_run_t: activation arena and
// the step's position arrays), one per concurrent user of the weights (a
// teacher and a student, the trainer and an evaluation, later each server
// worker). Inference (prefill / decode step with a hybrid cache) and the
// training forward/backward run on a model_run_t.
#pragma once
#include <stdint.h>

#include "backend/backend.h"
#include "base/arena.h"
#include "io/weights.h"
#include "model/arch.h"
#include "model/attn.h"
#include "model/layer.h"
#include "model/gdn.h"
#include "model/m2.h"
#include "model/mla.h"
#include "model/mlp.h"
#include "model/params.h"

typedef struct {
    layer_kind_t kind;
    void *norm1, *norm2; // input_layernorm, post_attention_layernorm [d]
    attn_w_t attn;
    mla_w_t mla;
    gdn_w_t gdn;
    m2_w_t m2;
    mlp_w_t mlp;
} layer_w_t;

typedef struct {
    arch_t a;
    ptable_t pt;
    be_t *be;
    void *w;                            // flat weights (act), on the device; laid out by pt unless n_qw > 0
    layer_w_t *lw;                      // [n_layers] views into w
    void *embed, *final_norm, *lm_head; // lm_head == embed when tied
    float *rope_cos, *rope_sin;         // attention RoPE tables on the device [rope_npos, dh/2]
    float *mla_cos, *mla_sin;           // MLA RoPE tables [rope_npos, d_rope/2]
    int rope_npos;
    // Quantised inference (MODEL_QUANT): the matrices kept in their stored
    // format (the views point at these descriptors, see layer_ctx_t), the
    // memory behind them, and where every parameter lives (w then holds only
    // the others, packed, not laid out by pt: such a model cannot train).
    be_qmat_t *qw;
    int n_qw;
    void *qmem;
    void **addr; // [pt.n]
} model_t;

// What a recorded decode step's launches depend on, as values (model.c step_key).
typedef struct {
    uint64_t *v;
    int64_t n, room;
} step_key_t;

// A recorded decode step: the replay, the key of what its launches took, where
// its logits land, when it last ran (model_run_t graph_clock). A batch whose
// row count changes (requests that finish, new ones) keeps one for each count
// it comes back to.
enum { MODEL_STEP_GRAPHS = 8 };
typedef struct {
    void *graph; // NULL: an empty slot
    step_key_t key;
    void *lg;
    uint64_t used;
} model_step_graph_t;

// Greedy decode steps a run holds in flight (model_greedy_queue): one runs
// while the host reads the one before and queues the next.
enum { MODEL_GREEDY_AHEAD = 2 };
// The most rows of a recorded decode step (the head's logits of all rows in
// one product), and of a greedy step.
enum { MODEL_STEP_GRAPH_ROWS = 64 };

// One run's execution context over a model's weights.
typedef struct {
    model_t *m;
    arena_t arena; // device memory for one step's activations
    ctx_pos_t pos; // the current forward's positions (model_prepare_positions; pos.d NULL: none)
    // A batched prefill's positions of the rows of its runs (layer.h
    // step_run_t), [N] in pos_buf; NULL when none is prepared.
    const int32_t *run_pos;
    int32_t *pos_buf;  // device memory behind pos (outlives arena resets)
    int32_t *pos_host; // its host staging buffer (page-locked: be->host_alloc)
    int64_t pos_cap;   // elements of each
    // A decode step's positions (model_step_batch): the rows' positions then
    // their visible lengths, [2N] in pos_buf; NULL when no step is prepared.
    const int32_t *step_pos;
    step_run_t *runs; // host: one layer's runs of a step (rebuilt per layer)
    int runs_cap;
    // A decode step's per-row cache bases of every attention / MLA layer
    // (layer.h step_cache_bases), uploaded in one copy per step: layer l's at
    // step_cache + cache_off[l] (cache_off [n_layers], -1: none); step_cache
    // NULL when no step is prepared.
    void **cache_buf, **cache_host; // device, host staging
    int64_t cache_cap;              // pointers of each
    int64_t *cache_off;
    void *const *step_cache;
    // ... and, uploaded with them when a state of the step is paged, the
    // rows' page tables (layer.h step_page_tables; pages NULL: none).
    int32_t *page_buf, *page_host; // device, host staging
    int64_t page_cap;              // entries of each
    // The host staging (page-locked: be->host_alloc, as the others above) of
    // a decode step's ids, which step_inputs queues without waiting.
    int32_t *ids_host;
    int64_t ids_cap;
    be_pages_t step_pages;
    // The recorded decode steps (model.c step_forward; backends with graphs):
    // up to MODEL_STEP_GRAPHS replays, each with the key it was recorded with
    // and where its logits land, the least recently used one replaced; the
    // key of the last step that ran op by op (a key is recorded when it comes
    // twice in a row), the current step's, and graph_off once a recording
    // failed (steps then run op by op).
    model_step_graph_t graphs[MODEL_STEP_GRAPHS];
    uint64_t graph_clock;
    step_key_t key_seen, key_new;
    int graph_off;
    // Greedy decoding on the device (model_greedy_queue): the rows' ids
    // (device: a step's inputs, then the argmax its head chose; then
    // argmax_rows's turn), their host ring (page-locked, MODEL_GREEDY_AHEAD
    // arrays of MODEL_STEP_GRAPH_ROWS: step k's in array k % 2), the rows of
    // the step in each array, steps queued and taken, and the fences of the
    // latest step's inputs and of each array's step.
    int32_t *greedy_ids, *greedy_host;
    int64_t greedy_rows[MODEL_GREEDY_AHEAD];
    uint64_t greedy_queued, greedy_taken;
    void *greedy_inputs, *greedy_done[MODEL_GREEDY_AHEAD];
    // Decode steps so far: replays of the recorded step, steps that recorded
    // a new one (and replayed it), steps run op by op (no graph: a key seen
    // once, a fresh state, too many rows, or a backend without graphs).
    uint64_t steps_replayed, steps_recorded, steps_op_by_op;
} model_run_t;

// Builds an empty model (weights uninitialised) for an architecture.
int model_create(model_t *m, const arch_t *a, be_t *be);
// MODEL_ALLOW_MISSING (model_read_host): missing tensors stay zero and
// unknown ones are ignored, each with a warning (the opt-out of
// --allow-missing). MODEL_QUANT (model_load_ex / model_load_src): on a
// backend with quantised products (be->qmatmul: the CPU and CUDA), the linear and
// embedding matrices that the source stores in a block format or bf16 stay in
// it (inference only: about the file's size instead of fp32 / bf16; the CPU's
// products round the activations to 8 bits, backend.h qmatmul). Without it every weight is
// act, as training and exact evaluation need.
enum { MODEL_ALLOW_MISSING = 1, MODEL_QUANT = 2 };
// Loads a GGUF file or a checkpoint folder onto the backend (all weights act).
// Strict: a missing, unknown or wrongly shaped tensor is an error naming it.
int model_load(model_t *m, const char *path, be_t *be);
int model_load_ex(model_t *m, const char *path, be_t *be, int flags);
// The same from an open source and the architecture wsrc_open filled, for a
// caller that reads more from it (the tokenizer in a GGUF's metadata) without
// opening and parsing the file a second time.
int model_load_src(model_t *m, wsrc_t *src, const arch_t *a, be_t *be, int flags);
// A run over m's weights with an activation arena of arena_bytes on m's device
// (0: none of its own; it runs in another run's, model_run_lend).
int model_run_create(model_run_t *r, model_t *m, size_t arena_bytes);
void model_run_free(model_run_t *r);
// Gives r (created with no arena) the free part of host's arena, above what
// host holds now, until model_run_settle, which folds r's peak into host's
// (arena_lend / arena_settle). host must allocate nothing in between. The
// trainer's teacher forward runs so inside the student's arena: only the KD
// target it writes (in host's part) outlives it.
void model_run_lend(model_run_t *host, model_run_t *r);
void model_run_settle(model_run_t *host, model_run_t *r);
// Between inference forwards (nothing of the run lives in its arena): empties
// the arena and gives the pages the run's arena and the backend's scratch
// touched back to the system (be->discard; a no-op where the backend has
// none). After a prefill, whose temporaries are MBs that decode steps never
// touch again, this takes them out of the resident memory the cache then
// grows into.
void model_run_trim(model_run_t *r);
// Reads every parameter of an open source into a host fp32 flat buffer laid
// out by pt (export and convert); flags 0 is model_load's strictness.
int model_read_host(wsrc_t *src, const ptable_t *pt, float *host, int flags);
void model_free(model_t *m);
// Uploads a forward's positions for every layer to share: pos0 + t for B rows
// of T tokens (nothing to do when the last call prepared the same). They stay
// valid (arena resets do not touch them) until the next call. (A decode step's
// per-sequence positions are model_step_batch's own.)
int model_prepare_positions(model_run_t *r, int B, int T, int pos0);
// Grows the RoPE tables to cover positions [0, n_pos), doubling from
// MODEL_ROPE_POS0, or to n_pos rounded up to 4096 when that is more than
// twice the tables: a model starts with tables for MODEL_ROPE_POS0 positions
// (fp32 cos + sin: 64 KiB for head dim 64) and the forwards grow them to what
// they run (a prefill to twice what it feeds, at most the state's context
// limit, so that the decode steps after it do not rebuild them), where 4096
// from the start were 1 MiB that a short generation never reads. The
// attention layers' tables exist only when the model has attention layers,
// the MLA layers' only when it has MLA layers.
enum { MODEL_ROPE_POS0 = 256 };
int model_ensure_positions(model_t *m, int n_pos);
// Binds a weight-view struct set to any flat buffer laid out by m->pt
// (elt: element size: act for weights, 4 for float gradients).
int model_bind(const model_t *m, void *flat, size_t elt, layer_w_t *lw, void **embed, void **final_norm,
               void **lm_head);

// ---- inference ----------------------------------------------------------------
// The page pool of paged states (hylo serve): page p holds BE_PAGE_ROWS
// token rows of every growing layer (attention K and V apart, MLA latent +
// rope key), at row p * BE_PAGE_ROWS of the layer's part of one device block
// (part[2 l] K or the latents, part[2 l + 1] V; NULL for fixed-state
// layers). A state's table and the prefix cache's entries hold references to
// pages; a page is free when none does. Every use is on one thread (the
// engine's).
typedef struct {
    int n_pages, n_free;
    int32_t *ref;       // [n_pages] references (host); 0: free
    int hint;           // no page below it is free
    void *mem;          // the device block
    size_t bytes;       // its size
    void **part;        // [2 n_layers] each growing layer's parts
    int64_t page_bytes; // bytes of one page over every part (model_page_bytes)
} model_pool_t;

// Bytes of one page on m's backend: BE_PAGE_ROWS * model_cache_bytes_per_token.
int64_t model_page_bytes(const model_t *m);
// A pool of n_pages pages (one allocation; ERR_NOMEM naming its bytes), all free.
int model_pool_create(const model_t *m, model_pool_t *pool, int n_pages);
void model_pool_free(const model_t *m, model_pool_t *pool);
// One more reference on each of n pages, or one fewer (a page whose count
// reaches 0 is free again).
void model_pool_hold(model_pool_t *pool, const int32_t *pages, int n);
void model_pool_release(model_pool_t *pool, const int32_t *pages, int n);

// The hybrid cache of B sequences, the one owner of its capacity. Fixed-size
// parts (GDN / Mamba-2 states and conv windows) are allocated and zeroed once.
// The growing ones (attention K and V, MLA latent + rope key) hold room for
// `cap` tokens per sequence and grow with use up to `ctx`
// (model_state_reserve, which prefill and step call): nothing is allocated
// or zeroed for tokens never fed. Their elements are the backend's act dtype
// (fp32 on the CPU, bf16 on CUDA). Two forms (layer.h layer_cache_t):
// - contiguous (model_state_alloc; generate, eval, training tools): one
//   device buffer per part per layer, [B, cap, ...], starting small and
//   reallocated to twice the room (its rows copied) as it grows, so
//   cache_bytes = B * cap * model_cache_bytes_per_token(m), the figure
//   `hylo info` prints for that device (a growth that runs out of memory
//   halfway leaves some layers larger than cap: then cache_bytes, the real
//   total, is more);
// - paged (model_state_alloc_paged; one sequence, the server's requests):
//   the rows live in pages of a model_pool_t, listed in the state's table
//   (pages, shared by its layers), and growing takes pages, copying
//   nothing; cap = min(n_pages * BE_PAGE_ROWS, ctx), cache_bytes = n_pages *
//   model_page_bytes. Pages may be shared with the prefix cache and other
//   states (model_state_share / model_state_restore_pages): before rows are
//   written into a shared page the state takes a copy of it (copy on
//   write), so what others hold never changes.
typedef struct {
    int B, ctx, cap, len;  // sequences, most tokens (the context limit), room now, tokens consumed
    layer_cache_t *layers; // [n_layers]
    void *fixed;           // one device block holding every fixed-size state (NULL when none)
    size_t fixed_bytes;    // its size
    size_t cache_bytes;    // the growing buffers' bytes now
    size_t bytes;          // fixed_bytes + cache_bytes: everything the state holds on the device
    model_pool_t *pool;    // paged: where its pages come from; NULL: contiguous
    int32_t *pages;        // paged: [pages_of(ctx)] the sequence's pages, n_pages of them held (host)
    int n_pages;
} model_state_t;

// Tokens of room a new state starts with (fewer when ctx is smaller).
enum { MODEL_STATE_CAP0 = 256 };

// Bytes of growing cache per token of one sequence on m's backend.
int64_t model_cache_bytes_per_token(const model_t *m);
// A state for B sequences of at most ctx tokens each, with room for
// min(ctx, MODEL_STATE_CAP0) tokens.
int model_state_alloc(const model_t *m, model_state_t *st, int B, int ctx);
// A paged state of one sequence of at most ctx tokens over pool (which must
// outlive it): no pages yet (room 0; its fixed states allocated and zeroed).
int model_state_alloc_paged(const model_t *m, model_state_t *st, model_pool_t *pool, int ctx);
// Room for n tokens per sequence (n <= ctx, else ERR_INPUT). Contiguous:
// when n > cap the growing buffers are reallocated to max(n, min(ctx, 2
// cap)) tokens (n alone when that does not fit) and the cached rows copied.
// Paged: pages are taken from the pool up to n tokens, and a shared page
// that rows [len, n) would write is first replaced by a copy (copy on
// write). Out of memory (a paged state: a pool without free pages) is
// ERR_NOMEM naming the tokens and bytes asked for; the cache keeps what it
// held (a paged one, the pages it got) and stays usable.
int model_state_reserve(const model_t *m, model_state_t *st, int n);
// Room for exactly n tokens per sequence when cap < n (no doubling; errors as
// model_state_reserve): for a caller that knows the whole request (gen_run:
// the prompt and the answer), whose cache is then one allocation of its size.
int model_state_fit(const model_t *m, model_state_t *st, int n);
void model_state_free(const model_t *m, model_state_t *st);
// len = 0, fixed states zeroed; contiguous growing buffers keep their room
// (rows past len are never read), a paged state gives its pages back.
void model_state_reset(const model_t *m, model_state_t *st);

// ---- snapshots (prefix caching) -------------------------------------------------
// A sequence's state copied into compact buffers on m's device and back, so
// that a later sequence starting with the same tokens skips their prefill
// (the server's prefix cache, docs/SERVING.md). Two parts, exactly the bytes
// needed:
// - rows: every growing layer's cached rows [0, n) (attention K then V, MLA
//   latent + rope key), layer by layer, each part's n rows contiguous:
//   model_snapshot_rows_bytes(m, n) = n * model_cache_bytes_per_token(m).
//   The first p rows of each part are what a snapshot of p would hold, so one
//   snapshot of n rows serves every shorter prefix (restore's n_rows).
// - fixed: every GDN / Mamba-2 recurrent state and convolution window of one
//   sequence, model_snapshot_fixed_bytes(m) (0 for attention / MLA alone).
//   They sum up the whole prefix: a restore to length p needs the fixed part
//   taken at exactly p.
int64_t model_snapshot_rows_bytes(const model_t *m, int n);
int64_t model_snapshot_fixed_bytes(const model_t *m);
// Copies sequence b's rows [0, n) (n <= st->len) into rows and its fixed
// states into fixed (device buffers; either NULL: that part is not taken).
int model_state_snapshot(const model_t *m, const model_state_t *st, int b, int n, void *rows, void *fixed);
// Makes a state of one sequence hold a prefix of len tokens: the first len
// rows of rows (a snapshot of n_rows >= len rows) and fixed (taken at len;
// NULL when the model has no fixed states). Room for len tokens is reserved
// first (errors as model_state_reserve, the state then as it was); after it
// st->len = len, as if those tokens had been prefilled.
int model_state_restore(const model_t *m, model_state_t *st, const void *rows, int n_rows, const void *fixed, int len);
// The paged form of a snapshot's rows: no copy, references. model_state_share
// puts the first pages_of(n) pages of a paged state (n <= st->len, rows [0,
// n) and whatever else those pages hold) into pages, with a reference taken
// on each; the holder gives them back with model_pool_release. Rows [0, p)
// of them serve any prefix p <= n, as a snapshot's.
int model_state_share(const model_t *m, const model_state_t *st, int n, int32_t *pages);
// Makes a paged state hold a prefix of len tokens: the pages covering rows
// [0, len) of `pages` (references taken; the state's own pages given back
// first) and fixed (taken at len; NULL when the model has none). After it
// st->len = len, as if those tokens had been prefilled; the last page, when
// partial and shared, is copied before the state writes into it.
int model_state_restore_pages(const model_t *m, model_state_t *st, const int32_t *pages, const void *fixed, int len);
// Pages that n tokens of one sequence take: ceil(n / BE_PAGE_ROWS).
int model_pages_for(int64_t n);
// Feeds T tokens per sequence (ids host [B*T]) in chunks of `chunk` tokens,
// extending the cache (room for all T is reserved first: out of memory leaves
// the state as it was); logits (host, [B, V]) of each sequence's last token.
int model_prefill(model_run_t *r, model_state_t *st, const int32_t *ids, int T, int chunk, float *logits);
// A prefill chunk of each of n_st single-sequence states in one forward
// (continuous batching of prompts): state k takes n[k] >= 1 tokens ids[k]
// (host) after its own len. The products, norms and MLPs run once over the
// chunks packed together; the mixers take the chunks as runs
// (model_mixer_forward_runs; layer.h X_forward_runs says what runs once per
// state). The one-token chunks (decode
// tokens riding in a prefill, as a server's turn gives them: the next token
// of a decoding request) are packed after the others and their mixers run as
// one decode step of them all (model_mixer_step, each row over its own cache at its own
// length, a state at length 0 included), so one forward serves a turn's
// prefill chunks and decode tokens; when every chunk is one token the call is
// a decode step of the states (model_step_batch's path). Room is reserved in
// every state first (a state that cannot grow fails the call, the states as
// they were); then each len advances by its n[k]. logits (host) gets, for
// each state k with want[k] (want NULL: every state), in state order, the
// logits of its chunk's last token. Without one-token chunks the forward is
// the chunks in state order; with them, the rows a one-token chunk and a
// chunk of several tokens share (products, norms, MLPs) round as the
// rows of a prefill do, not as a decode step's fused ops.
int model_prefill_batch(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *const *ids, const int *n,
                        const uint8_t *want, float *logits);
// One token per sequence (ids host [B]); logits host [B, V].
int model_step(model_run_t *r, model_state_t *st, const int32_t *ids, float *logits);
// One decode step over several states at once (continuous batching): one
// token for each sequence of sts[0], then of sts[1], ... (ids host [N], N the
// sum of their B), each state at its own length; logits host [N, V]. The
// projections and MLPs run once over the N rows, the caches' own parts once
// per state. Room for the token is reserved in every state first; a state
// that cannot grow fails the whole step (the caller reserves each first to
// tell which). Each state's len advances by one.
int model_step_batch(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *ids, float *logits);
// Logits of every position of B sequences of T tokens without a cache (host [B*T, V]).
// Greedy decoding with each step's argmax taken on the device, the next step
// queued while the one before still runs, so that the host's work between
// steps (reading a token, queueing the next step) overlaps the device's.
// model_greedy_queue queues one decode step of the states' rows (each
// state's length grows by one now, as model_step_batch) whose result is the
// argmax of its logits (sampler_argmax's choice), kept on the device. ids:
// the rows' inputs, or NULL for the ids the step queued before this one
// chose (the same rows: the same states in the same order). At most
// MODEL_GREEDY_AHEAD steps are in flight; model_greedy_take waits for the
// oldest and gives its rows' ids; model_greedy_drain waits for them all and
// forgets their ids. Rows: 1 to MODEL_STEP_GRAPH_ROWS. Until every queued step is taken or
// drained, the run takes no other call (ERR_INPUT).
int model_greedy_queue(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *ids);
int model_greedy_take(model_run_t *r, int32_t *ids);
int model_greedy_drain(model_run_t *r);

int model_logits_all(model_run_t *r, const int32_t *ids, int B, int T, float *logits);

// What a forward without gradients records per layer (the ILD teacher): x[l]
// the input of layer l, x[n_layers] the last layer's output, a[l] layer l's
// mixer output; [B*T, d] act buffers of the caller. Either array may be NULL.
typedef struct {
    void **x, **a;
} model_record_t;
// The final normed hidden states h [B*T, d] (act, a device buffer of the
// caller) of B rows of T tokens at positions 0..T-1, saving nothing for a
// backward: the teacher of distillation. rec (NULL: nothing) records per layer.
int model_hidden(model_run_t *r, const int32_t *ids, int B, int T, void *h, const model_record_t *rec);

// ---- pieces shared by inference and the training forward (train_fwd.c) --------
// What a mixer saves for its backward, by layer kind.
typedef union {
    attn_saved_t attn;
    mla_saved_t mla;
    gdn_saved_t gdn;
    m2_saved_t m2;
} mixer_saved_t;

// The context layer l runs in: the run's arena and prepared positions, and
// the model's RoPE tables of the layer's kind.
layer_ctx_t model_layer_ctx(model_run_t *r, int l);
// Checks the token ids (host [N]) against the vocabulary, uploads them to
// d_ids (device [N], kept for the embedding backward) and embeds them into x
// (act [N, d]).
int model_embed(const model_t *m, const int32_t *ids, int64_t N, int32_t *d_ids, void *x);
// The token mixer of layer c->layer with weights w over x [B*T, d] (normed)
// -> out: its kind's X_forward (layer.h contract). sv (training) NULL, or
// filled for the backward.
int model_mixer_forward(const layer_ctx_t *c, const layer_w_t *w, void *out, const void *x, int B, int T, int pos0,
                        layer_cache_t *cache, mixer_saved_t *sv);
// The same over runs of sequences of caches, each its own T tokens at its own
// position (a batched prefill's chunks, layer.h step_run_t): X_forward_runs.
int model_mixer_forward_runs(const layer_ctx_t *c, const layer_w_t *w, void *out, const void *x, int n_runs,
                             const step_run_t *runs);
// The same for a decode step: one token per sequence of the runs (layer.h
// step_run_t), x [N, d] -> out (layer.h lin_out_t), through its kind's X_step.
// x normed already (xw NULL), or the residual stream with its norm's gain xw
// for the step's first product to apply, where model_mixer_step_norms_input
// says the kind's step can (attention's fused q/k/v product, MLA's joint q_a
// / kv_a product, GDN's joint input product; not Mamba-2).
int model_mixer_step(const layer_ctx_t *c, const layer_w_t *w, const lin_out_t *out, const void *x, const void *xw,
                     int n_runs, const step_run_t *runs);
int model_mixer_step_norms_input(const layer_ctx_t *c, const layer_w_t *w, int N);
