// The server's prefix cache: requests' states keyed by the prompt tokens they
// hold, so that a request whose prompt starts with a cached prefix (a
// follow-up turn of a chat, a shared system prompt) restores it and prefills
// only the rest.
//
// An entry is one prompt's tokens [0, n) with references to the pages of its
// paged state that hold its attention / MLA rows [0, n) (model.h
// model_state_share: no copy; a state restored from them shares them and
// copies a partial last page before writing into it) and snapshots of the
// fixed (GDN / Mamba-2) states at a few boundaries: every `block` tokens
// while the prompt was prefilled, and n, the end of the turn. Rows [0, p) of
// an entry serve any p <= n, so the growing part is held once per entry (a
// snapshot per boundary would cost O(n^2) bytes);
// the fixed states, a constant size each, are what a restore point needs
// besides, so a restore lands on a boundary (on any p for a model without
// fixed states). A request restores at the longest such point that its
// prompt shares with an entry, short of its last token (whose logits it
// needs). Entries whose tokens and boundaries a newer entry holds too (the
// earlier turns of the same chat) are dropped; beyond the byte budget the
// least recently used go. Everything runs on the engine thread (no lock).
#pragma once
#include <stdint.h>

#include "model/model.h"

typedef struct srv_prefix srv_prefix_t;

// The fixed-state snapshots a request takes while its prompt is prefilled
// (and those it restored), to become its entry at the end of the prompt.
typedef struct {
    int n, cap;
    int *pos;     // [n] ascending
    void **fixed; // [n] device buffers of model_snapshot_fixed_bytes
} srv_prefix_rec_t;

typedef struct {
    uint64_t hits, misses, reused_tokens, evictions;
    int64_t bytes; // held by the entries: their rows (n x the cache bytes per token), fixed snapshots, token ids
    int entries;
    // the entries' fixed-state snapshots: buffers of their own on the model's
    // device (their rows are pages of the pool, allocated up front)
    int64_t snapshots, snapshot_bytes;
} srv_prefix_stats_t;

// A cache of at most `budget` bytes (> 0) with fixed-state boundaries every
// `block` tokens (> 0), over the paged states of pool (the entries' pages
// are pool's; a partial last page is held whole, so the pages an entry pins
// are up to one page more than its bytes).
int srv_prefix_create(srv_prefix_t **out, const model_t *m, model_pool_t *pool, int64_t budget, int block);
void srv_prefix_free(srv_prefix_t *pc);
int srv_prefix_block(const srv_prefix_t *pc);
// Restores into st (one fresh sequence) the longest cached prefix of
// ids[0, n) shorter than n, and starts rec with its boundaries. Returns the
// tokens restored (0: none; a failed restore is a miss and leaves st fresh).
int srv_prefix_restore(srv_prefix_t *pc, model_state_t *st, const int32_t *ids, int n, srv_prefix_rec_t *rec);
// After a prefill chunk: st->len on a block boundary gets its fixed states
// recorded (nothing for a model without them). Failures only lose the point.
void srv_prefix_mark(srv_prefix_t *pc, srv_prefix_rec_t *rec, const model_state_t *st);
// At the end of a prompt (st->len == n): rec and the rows become the entry
// of ids[0, n), unless one covers it already; older entries it covers are
// dropped, then the least recently used until the budget holds. rec is
// emptied. Failures (no memory) only skip the entry.
void srv_prefix_insert(srv_prefix_t *pc, srv_prefix_rec_t *rec, const model_state_t *st, const int32_t *ids, int n);
// Drops the least recently used entry, giving its pages back (the engine,
// when the pool runs out of pages): 1, or 0 when there is none.
int srv_prefix_evict(srv_prefix_t *pc);
void srv_prefix_rec_free(srv_prefix_t *pc, srv_prefix_rec_t *rec);
srv_prefix_stats_t srv_prefix_stats(const srv_prefix_t *pc);
