// What every layer function receives besides its weights, and the inference
// caches of each layer kind.
//
// Layer file contract (attn.c, mla.c, gdn.c, m2.c, mlp.c), in this order:
//   X_w_t       parameter views (pointers into the flat weight buffer, act); the
//               same struct pointed into the flat gradient buffer holds the
//               gradients (float) - fields are void * for that reason.
//   X_saved_t   exactly what X_backward needs, allocated by X_forward from ctx->arena.
//   X_forward   x [B,T,d] (already normed) -> out [B,T,d] (mixer output);
//               pos0 = position of x's first token (same for every sequence);
//               cache NULL in training, else read and appended to;
//               sv NULL in inference, else filled for the backward.
//   X_forward_runs  the same inference over runs of sequences of caches
//               (step_run_t), each run its own T tokens at its own position,
//               the rows packed (a batched prefill): the products and norms
//               once over all rows; the recurrent layers' convolutions and
//               rules once over all sequences (backend.h be_seqs_t); MLA's
//               cached keys expanded together where they fit one tile;
//               attention's appends and attention once per sequence.
//   X_backward  dout -> dx (overwritten) and weight gradients (+=).
//   X_step      one new token per sequence, x [N,d], with the caches: the N
//               rows are runs of sequences (step_run_t), each sequence at its
//               own position (its cache's len): a continuous batch.
//   X_init_from_attention (in upcycle/) upcycling from a teacher attention layer.
#pragma once
#include <stdint.h>

#include "backend/backend.h"
#include "base/arena.h"
#include "model/arch.h"

// A device position array prepared once per forward and shared by every
// layer (so a forward does not upload positions once per layer).
typedef struct {
    int32_t *d; // [B*T]: pos0 + t for each of B rows; NULL: none prepared
    int B, T, pos0;
} ctx_pos_t;

typedef struct {
    be_t *be;
    const arch_t *a;
    int layer;
    arena_t *arena;        // device memory for this step's activations and saved tensors
    const float *rope_cos; // device RoPE tables for this layer kind [rope_npos, dr/2]
    const float *rope_sin;
    int rope_npos;        // positions covered by the tables
    const ctx_pos_t *pos; // the forward's prepared positions (may be NULL)
    // A decode step's prepared positions (NULL: X_step uploads its own): the
    // N rows' positions, then their visible lengths (position + 1), [2N].
    const int32_t *step_pos;
    // A decode step's per-row cache bases of this layer (NULL: X_step uploads
    // its own; step_cache_bases says what they are), for the backend's decode
    // ops (backend.h kv_append, attn_decode, mla_decode_attn, conv1d_step,
    // gdn_step, ssd_recurrent_step), and, prepared with them, the
    // rows' page tables (step_page_tables; pages NULL: every cache contiguous).
    void *const *step_cache;
    be_pages_t step_pages;
    // The model's matrices kept in their stored format (quantised inference,
    // model.h MODEL_QUANT): a weight view pointing into qw[0..n_qw) is one of
    // them, and lin_fwd runs be->qmatmul on it. NULL / 0 otherwise.
    const be_qmat_t *qw;
    int n_qw;
    // A prefill over a cache attends over the cached keys in tiles of at most
    // this many keys per sequence (MLA always, mla.c; attention when a
    // sequence's keys are not one run in memory, attn.c); 0: as many as a
    // fixed part of the arena holds. Tests shrink it to exercise several tiles.
    int cache_tile_keys;
    // A batched prefill's positions of every row of its runs, [N] (NULL:
    // ctx_run_positions uploads them).
    const int32_t *run_pos;
} layer_ctx_t;

// Element i of an act buffer (i elements of be->act_size bytes past p).
static inline void *act_at(const be_t *be, const void *p, int64_t i) { return (char *)p + i * (int64_t)be->act_size; }

// n act / float elements from the ctx arena (NULL + error slot when full).
void *ctx_act(const layer_ctx_t *c, int64_t n);
float *ctx_f32(const layer_ctx_t *c, int64_t n);
// Whether p (may be NULL) holds the positions of B rows of T at pos0.
int ctx_pos_is(const ctx_pos_t *p, int B, int T, int pos0);

// ---- inference caches (one per layer, by kind) ------------------------------
// All sequences of one cache share the cached length `len` (prefill and decode
// advance them together); the caller advances len after the whole model step.
// A decode step may take sequences of several caches, of different lengths
// (step_run_t).
typedef struct {
    void *k, *v; // act [B, cap, Hkv, dh]
} attn_cache_t;

typedef struct {
    void *kv; // act [B, cap, r_kv + d_rope]: latent c (after latent norm) | rotated k_pe
} mla_cache_t;

typedef struct {
    float *state;                   // [B, HV, Dv, K]
    void *conv_q, *conv_k, *conv_v; // act [B, C, W] last W pre-conv inputs
} gdn_cache_t;

typedef struct {
    float *state; // [B, H, P, N]
    void *conv;   // act [B, C, W] pre-conv [x | B | C]
} m2_cache_t;

// The growing caches (attention K and V, MLA latents) are contiguous or
// paged. Contiguous: k, v, kv hold [B, cap, ...], row u of sequence b at row
// b cap + u. Paged (model.h model_pool_t; pages not NULL): k, v, kv point at
// the layer's page pool, and row u of sequence b is row
// pages[b page_stride + u / BE_PAGE_ROWS] BE_PAGE_ROWS + u % BE_PAGE_ROWS of
// it (cache_row); the table (host) is the state's, shared by its layers.
typedef struct {
    int B, cap, len;      // sequences, room in tokens (contiguous: the sequence stride of k, v, kv), tokens cached
    int ctx;              // the most tokens it may grow to (model_state_alloc's ctx; 0: cap)
    const int32_t *pages; // paged: [B, page_stride] page of each BE_PAGE_ROWS rows (host); NULL: contiguous
    int page_stride;
    int64_t pool_rows; // paged: the rows of the pool k, v, kv point at
    union {
        attn_cache_t attn;
        mla_cache_t mla;
        gdn_cache_t gdn;
        m2_cache_t m2;
    } u;
} layer_cache_t;

// Row u of sequence b of a growing cache, as a row of its buffer (k, v, kv).
static inline int64_t cache_row(const layer_cache_t *c, int b, int64_t u) {
    if (!c->pages) return (int64_t)b * c->cap + u;
    return (int64_t)c->pages[(int64_t)b * c->page_stride + u / BE_PAGE_ROWS] * BE_PAGE_ROWS + u % BE_PAGE_ROWS;
}
// How many of rows [u, u + n) of sequence b follow row u in memory (>= 1 for
// n >= 1): all of them in a contiguous cache, else up to the end of the run
// of consecutive pages that u's page starts.
int64_t cache_run(const layer_cache_t *c, int b, int64_t u, int64_t n);

// A decode step's rows come in runs: run i is sequences [seq0, seq0 + n) of
// `cache`, at position cache->len, taking the step's next n rows. One cache of
// B sequences in lockstep is one run; a server's requests, each with its own
// cache, are one run each. The per-sequence ops of a step (cache appends,
// attention over the cache, convolution windows, recurrent states) take one
// pointer per row (step_cache_bases), so they too run once over all N rows,
// whatever runs the rows come from.
// A forward over caches takes its sequences in runs too (X_forward_runs): run
// i is sequences [seq0, seq0 + n) of `cache`, T tokens each at positions
// [pos0, pos0 + T), its n T rows packed after the runs before it; a batched
// prefill's requests are one run each, with their own T. (A step's runs: T 1
// and pos0 the cache's len, which is what the step reads.)
typedef struct {
    layer_cache_t *cache;
    int seq0, n;
    int T, pos0; // forward runs only
} step_run_t;
// Device int32 positions of the rows of a forward's runs [sum n T]: the
// prepared ctx->run_pos, else one run's prepared ctx->pos when it matches,
// else uploaded into the arena.
int32_t *ctx_run_positions(const layer_ctx_t *c, const step_run_t *runs, int n_runs);
// Rows of a forward's runs: sum of n T.
int64_t run_rows(const step_run_t *runs, int n_runs);
// X_forward_runs' check of its runs: each with a cache, n >= 1 sequences of
// it and T >= 1 tokens; else ERR_INPUT naming the run (the caller names the
// layer: model_mixer_forward_runs).
int forward_runs_check(const step_run_t *runs, int n_runs);

// Where a mixer's output projection y = a W^T [N, d] goes: into y (x NULL),
// or, in a decode step of at most BE_FEW_ROWS rows, added into the residual
// stream x [N, d], which is then normed into xn with gain norm (the next
// sub-layer's input; norm NULL: the add alone, after the last layer or where
// the next sub-layer's first product norms x itself), one fused op (linear.h
// lin_fwd_out). xn may be the mixer's input x: the projection is the mixer's
// last op.
typedef struct {
    void *y;
    void *x, *xn;
    const void *norm;
} lin_out_t;

// Rows of a step: the sum of the runs' n.
int step_rows(const step_run_t *runs, int n_runs);
// Device int32 [2N] of a step's N rows: positions (their cache's len), then
// visible lengths (len + 1); c->step_pos when prepared, else uploaded into the
// arena.
int32_t *ctx_step_positions(const layer_ctx_t *c, const step_run_t *runs, int n_runs);
// A decode step's per-row cache bases for layer `layer` of kind a->kind[layer]
// (act elements of `act` bytes): attention 2N pointers, row r's sequence's K
// cache (its row 0; a paged one's: the pool's row 0, its rows found through
// the step's page tables) then its V cache; MLA N, the latent cache; GDN 4N, the
// recurrent state (float [HV, Dv, K]) then the q, k and v conv windows (act
// [C, W]); Mamba-2 2N, the state (float [H, P, N]) then the conv window.
// Written to out (may be NULL: only counted); returns how many.
int step_cache_bases(const arch_t *a, int layer, size_t act, const step_run_t *runs, int n_runs, void **out);
// A batched prefill's sequences as the backend's packed-sequence ops take
// them (backend.h be_seqs_t): one per sequence of each run, in order, its T
// rows after the rows of those before it, with its cache bases
// (step_cache_bases' layout, one entry per sequence). Host arrays in one
// allocation (base; cu after it); run_seqs_free releases it.
typedef struct {
    be_seqs_t sq;
    void **base;
} run_seqs_t;
int run_seqs(const layer_ctx_t *c, const step_run_t *runs, int n_runs, run_seqs_t *out);
void run_seqs_free(run_seqs_t *rs);
// Device array of the step's cache bases of c's layer: c->step_cache when
// prepared, else uploaded into the arena (NULL + error slot on failure).
void *const *ctx_step_caches(const layer_ctx_t *c, const step_run_t *runs, int n_runs);
// Copies rows [u0, u0 + n) of sequence b of a growing cache's buffer buf
// (rows of w act elements), columns [col, col + cols), to x (to_cache 0: a
// gather) or from it (1: an append), x's rows ldx apart: one copy2d, or
// through a paged cache's page table one copy_pages.
void cache_copy_rows(be_t *be, const layer_cache_t *c, void *buf, int64_t w, int b, int64_t u0, int64_t n, int64_t col,
                     int64_t cols, void *x, int64_t ldx, int to_cache);
// Pages per step row of a step's page tables, 0 when no run is paged (no
// tables: every cache contiguous, backend.h be_pages_t); else the most pages
// a run's sequence may span: a paged run's context limit (so that the
// tables' shape holds while the caches grow), a contiguous one's room.
int step_page_stride(const step_run_t *runs, int n_runs);
// The step's page tables [N, stride] into out (stride from step_page_stride,
// > 0): a paged sequence's pages, a contiguous one's rows as consecutive
// pages from its row 0 (0, 1, 2, ...); entries past what a sequence holds 0.
void step_page_tables(const step_run_t *runs, int n_runs, int stride, int32_t *out);
// The step's page tables on the device: c->step_pages when prepared (with
// c->step_cache), else uploaded into the arena; pages NULL when no run is
// paged. 0, or ERR_NOMEM.
int ctx_step_pages(const layer_ctx_t *c, const step_run_t *runs, int n_runs, be_pages_t *pg);
// The bound of a step's visible lengths that the attention and MLA ops size
// their work by: for each cache, the rows it holds after this step's row
// rounded up to a power of two (at least STEP_CTX_MIN), at most its context
// limit (ctx, else cap); the largest over the runs. Lengths within one bucket
// give the same launches, so a recorded step replays while they grow
// (model.c's step key lists every state's bucket), and a short cache takes
// the short-cache kernels however long its state may grow. The split of a
// cache over blocks, and so the rounding, does not depend on the room.
enum { STEP_CTX_MIN = 256 };
int step_ctx_bucket(int len, int ctx, int cap);
int step_max_ctx(const step_run_t *runs, int n_runs);
// 0, or an error naming the layer when a run's sequences lie outside its
// cache, or (room) its cache has no room for another token, or (rope) its
// position is beyond the RoPE tables.
int step_check(const layer_ctx_t *c, const step_run_t *runs, int n_runs, int room, int rope);
