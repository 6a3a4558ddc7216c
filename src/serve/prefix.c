#include "serve/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"

typedef struct {
    int32_t *ids; // the prompt [n] (host)
    int n;
    int32_t *pages;     // [model_pages_for(n)] the pool's pages holding rows [0, n), one reference each
    srv_prefix_rec_t b; // the boundaries with their fixed states
    int64_t bytes;
    uint64_t used; // LRU clock of the last hit or insert
} entry_t;

struct srv_prefix {
    const model_t *m;
    model_pool_t *pool;
    int64_t budget, fixed_bytes;
    int block;
    entry_t *e;
    int n, cap;
    uint64_t tick;
    srv_prefix_stats_t s;
};

int srv_prefix_create(srv_prefix_t **out, const model_t *m, model_pool_t *pool, int64_t budget, int block) {
    *out = NULL;
    if (budget < 1 || block < 1)
        return err_set(ERR_INPUT, "prefix cache: budget %lld bytes, block %d tokens: both must be positive",
                       (long long)budget, block);
    srv_prefix_t *pc = calloc(1, sizeof *pc);
    if (!pc) return err_set(ERR_NOMEM, "out of memory");
    pc->m = m, pc->pool = pool, pc->budget = budget, pc->block = block;
    pc->fixed_bytes = model_snapshot_fixed_bytes(m);
    *out = pc;
    return 0;
}

int srv_prefix_block(const srv_prefix_t *pc) { return pc->block; }

void srv_prefix_rec_free(srv_prefix_t *pc, srv_prefix_rec_t *rec) {
    for (int i = 0; i < rec->n; i++)
        pc->m->be->free(pc->m->be, rec->fixed[i]);
    free(rec->pos);
    free(rec->fixed);
    memset(rec, 0, sizeof *rec);
}

// A new boundary at pos (after the last) with its fixed-state buffer, to be
// filled by the caller; NULL when out of memory.
static void *rec_add(srv_prefix_t *pc, srv_prefix_rec_t *rec, int pos) {
    be_t *be = pc->m->be;
    if (rec->n == rec->cap) {
        int cap = rec->cap ? 2 * rec->cap : 8;
        int *p = realloc(rec->pos, (size_t)cap * sizeof *p);
        if (p) rec->pos = p;
        void **f = p ? realloc(rec->fixed, (size_t)cap * sizeof *f) : NULL;
        if (!f) return NULL;
        rec->fixed = f, rec->cap = cap;
    }
    void *buf = be->alloc(be, (size_t)pc->fixed_bytes);
    if (!buf) return NULL;
    rec->pos[rec->n] = pos, rec->fixed[rec->n] = buf;
    rec->n++;
    return buf;
}

static void entry_drop(srv_prefix_t *pc, int i) {
    entry_t *e = &pc->e[i];
    pc->s.bytes -= e->bytes;
    pc->s.snapshots -= e->b.n, pc->s.snapshot_bytes -= (int64_t)e->b.n * pc->fixed_bytes;
    srv_prefix_rec_free(pc, &e->b);
    model_pool_release(pc->pool, e->pages, model_pages_for(e->n));
    free(e->pages);
    free(e->ids);
    pc->e[i] = pc->e[--pc->n];
    pc->s.entries = pc->n;
}

void srv_prefix_free(srv_prefix_t *pc) {
    if (!pc) return;
    while (pc->n)
        entry_drop(pc, pc->n - 1);
    free(pc->e);
    free(pc);
}

srv_prefix_stats_t srv_prefix_stats(const srv_prefix_t *pc) { return pc->s; }

static int common_prefix(const int32_t *a, const int32_t *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

// Index of boundary pos in rec, or -1.
static int rec_find(const srv_prefix_rec_t *rec, int pos) {
    for (int i = 0; i < rec->n; i++)
        if (rec->pos[i] == pos) return i;
    return -1;
}

// Where a request of ids[0, n) can restore from entry e: the longest shared
// prefix short of the last token, down to e's last boundary within it when
// the model has fixed states; *bi that boundary (-1: none needed).
static int restore_point(const srv_prefix_t *pc, const entry_t *e, const int32_t *ids, int n, int *bi) {
    int L = common_prefix(e->ids, ids, e->n < n - 1 ? e->n : n - 1);
    *bi = -1;
    if (!pc->fixed_bytes) return L;
    for (int i = e->b.n - 1; i >= 0; i--)
        if (e->b.pos[i] <= L) return *bi = i, e->b.pos[i];
    return 0;
}

int srv_prefix_restore(srv_prefix_t *pc, model_state_t *st, const int32_t *ids, int n, srv_prefix_rec_t *rec) {
    int best = -1, p = 0, bi = -1;
    for (int i = 0; i < pc->n; i++) {
        int b, q = restore_point(pc, &pc->e[i], ids, n, &b);
        if (q > p || (q == p && q > 0 && pc->e[i].used > pc->e[best].used)) best = i, p = q, bi = b;
    }
    if (p > 0 &&
        model_state_restore_pages(pc->m, st, pc->e[best].pages, bi >= 0 ? pc->e[best].b.fixed[bi] : NULL, p) < 0) {
        log_warn("prefix cache: restoring %d tokens failed (%s); prefilling them", p, err_msg());
        model_state_reset(pc->m, st);
        p = 0;
    }
    if (p == 0) {
        pc->s.misses++;
        return 0;
    }
    entry_t *e = &pc->e[best];
    e->used = ++pc->tick;
    pc->s.hits++;
    pc->s.reused_tokens += (uint64_t)p;
    // The entry's boundaries up to p become the request's, so that its own
    // entry covers this one (which then goes).
    be_t *be = pc->m->be;
    for (int i = 0; i <= bi; i++) {
        void *buf = rec_add(pc, rec, e->b.pos[i]);
        if (!buf || be->copy_d2d(be, buf, e->b.fixed[i], (size_t)pc->fixed_bytes) < 0) {
            if (buf) be->free(be, buf), rec->n--;
            break;
        }
    }
    return p;
}

// Takes st's fixed states as the boundary st->len of rec.
static void mark_at(srv_prefix_t *pc, srv_prefix_rec_t *rec, const model_state_t *st) {
    if (!pc->fixed_bytes || st->len == 0 || (rec->n && rec->pos[rec->n - 1] >= st->len)) return;
    void *buf = rec_add(pc, rec, st->len);
    if (buf && model_state_snapshot(pc->m, st, 0, st->len, NULL, buf) < 0) {
        pc->m->be->free(pc->m->be, buf);
        rec->n--;
    }
}

void srv_prefix_mark(srv_prefix_t *pc, srv_prefix_rec_t *rec, const model_state_t *st) {
    if (st->len % pc->block == 0) mark_at(pc, rec, st);
}

// Whether entry e holds everything of the prompt ids[0, n) with boundaries
// rec: its tokens start with them and, with fixed states, it has every
// boundary of rec.
static int covers(const srv_prefix_t *pc, const entry_t *e, const int32_t *ids, int n, const srv_prefix_rec_t *rec) {
    if (e->n < n || common_prefix(e->ids, ids, n) < n) return 0;
    for (int i = 0; pc->fixed_bytes && i < rec->n; i++)
        if (rec_find(&e->b, rec->pos[i]) < 0) return 0;
    return 1;
}

void srv_prefix_insert(srv_prefix_t *pc, srv_prefix_rec_t *rec, const model_state_t *st, const int32_t *ids, int n) {
    mark_at(pc, rec, st);                                                     // the end of the turn
    if (pc->fixed_bytes && (!rec->n || rec->pos[rec->n - 1] != n)) goto skip; // it could not be taken
    for (int i = 0; i < pc->n; i++)
        if (covers(pc, &pc->e[i], ids, n, rec)) {
            pc->e[i].used = ++pc->tick;
            goto skip;
        }
    int64_t rows_bytes = model_snapshot_rows_bytes(pc->m, n);
    int64_t bytes = rows_bytes + (int64_t)rec->n * pc->fixed_bytes + (int64_t)n * (int64_t)sizeof(int32_t);
    if (bytes > pc->budget) goto skip;
    entry_t e = {.n = n, .bytes = bytes, .b = *rec};
    e.ids = malloc((size_t)n * sizeof(int32_t));
    e.pages = malloc((size_t)(model_pages_for(n) ? model_pages_for(n) : 1) * sizeof(int32_t));
    if (pc->n == pc->cap) {
        int cap = pc->cap ? 2 * pc->cap : 16;
        entry_t *grown = realloc(pc->e, (size_t)cap * sizeof *grown);
        if (grown) pc->e = grown, pc->cap = cap;
    }
    if (!e.ids || !e.pages || pc->n == pc->cap || model_state_share(pc->m, st, n, e.pages) < 0) {
        free(e.ids);
        free(e.pages);
        goto skip;
    }
    memcpy(e.ids, ids, (size_t)n * sizeof(int32_t));
    memset(rec, 0, sizeof *rec); // the entry owns the boundaries now
    // Earlier entries that this one holds go (the earlier turns of a chat).
    for (int i = pc->n - 1; i >= 0; i--)
        if (covers(pc, &e, pc->e[i].ids, pc->e[i].n, &pc->e[i].b)) entry_drop(pc, i);
    e.used = ++pc->tick;
    pc->e[pc->n++] = e;
    pc->s.bytes += bytes;
    pc->s.snapshots += e.b.n, pc->s.snapshot_bytes += (int64_t)e.b.n * pc->fixed_bytes;
    pc->s.entries = pc->n;
    while (pc->s.bytes > pc->budget) // the newest fits alone, so it stays
        srv_prefix_evict(pc);
    return;
skip:
    srv_prefix_rec_free(pc, rec);
}

int srv_prefix_evict(srv_prefix_t *pc) {
    if (!pc->n) return 0;
    int lru = 0;
    for (int i = 1; i < pc->n; i++)
        if (pc->e[i].used < pc->e[lru].used) lru = i;
    entry_drop(pc, lru);
    pc->s.evictions++;
    return 1;
}
