#include "base/arena.h"

#include "base/err.h"

void arena_init(arena_t *a, void *base, size_t cap, const char *what) {
    a->base = base;
    a->cap = cap;
    a->used = 0;
    a->peak = 0;
    a->overflowed = 0;
    a->n_alloc = 0;
    a->what = what;
}

void *arena_alloc(arena_t *a, size_t bytes) {
    size_t off = (a->used + 255) & ~(size_t)255;
    if (off + bytes > a->cap || off + bytes < off) {
        a->overflowed = 1;
        err_set(ERR_NOMEM, "%s: arena full: need %zu more bytes, %zu of %zu used", a->what, bytes, a->used, a->cap);
        return NULL;
    }
    a->used = off + bytes;
    a->n_alloc++;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + off;
}

size_t arena_mark(const arena_t *a) { return a->used; }
void arena_reset(arena_t *a, size_t mark) { a->used = mark; }

void arena_lend(arena_t *parent, arena_t *child) {
    size_t off = (parent->used + 255) & ~(size_t)255;
    if (off > parent->cap) off = parent->cap;
    child->base = parent->base ? parent->base + off : NULL;
    child->cap = parent->cap - off;
    child->used = child->peak = child->n_alloc = 0;
    child->overflowed = 0;
}

void arena_settle(arena_t *parent, arena_t *child) {
    size_t off = child->base ? (size_t)(child->base - parent->base) : parent->cap;
    if (off + child->peak > parent->peak) parent->peak = off + child->peak;
    parent->overflowed |= child->overflowed;
    parent->n_alloc += child->n_alloc;
    child->base = NULL;
    child->cap = child->used = 0;
}
