// Bump allocator over one block. Per-step scratch comes from an arena that is
// reset each step; nothing in it is freed individually. The same struct serves
// host memory and device memory (the backend hands it a device block).
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *base;
    size_t cap;
    size_t used;
    size_t peak;
    int overflowed;   // an allocation did not fit since arena_init (the trainer's plan grows its probe)
    size_t n_alloc;   // allocations since arena_init (each rounded up by < 256 bytes: the plan's margin)
    const char *what; // for error messages ("host scratch", "cuda activations")
} arena_t;

void arena_init(arena_t *a, void *base, size_t cap, const char *what);
// 256-byte aligned; returns NULL and sets the error slot when full.
void *arena_alloc(arena_t *a, size_t bytes);
size_t arena_mark(const arena_t *a);
void arena_reset(arena_t *a, size_t mark);
// Lends child the free part of parent (from parent's aligned top to its end),
// for allocations that all end before parent allocates again: the trainer's
// teacher forward runs inside the student's arena, above the KD target, so the
// two runs never hold separate memory. child keeps its `what`.
void arena_lend(arena_t *parent, arena_t *child);
// Ends the loan: parent's peak covers child's, an overflow or allocation in
// child counts as parent's; child keeps its own peak (what the borrower
// needed) and holds no memory again.
void arena_settle(arena_t *parent, arena_t *child);

#ifdef __cplusplus
}
#endif
