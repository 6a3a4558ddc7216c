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
    const char *what; // for error messages ("host scratch", "cuda activations")
} arena_t;

void arena_init(arena_t *a, void *base, size_t cap, const char *what);
// 256-byte aligned; returns NULL and sets the error slot when full.
void *arena_alloc(arena_t *a, size_t bytes);
size_t arena_mark(const arena_t *a);
void arena_reset(arena_t *a, size_t mark);

#ifdef __cplusplus
}
#endif
