#include "model/model.h"

#include <assert.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "io/weights.h"
#include "model/bind.h"
#include "model/linear.h"
#include "model/rope.h"

int model_bind(const model_t *m, void *flat, size_t elt, layer_w_t *lw, void **embed, void **final_norm,
               void **lm_head) {
    const arch_t *a = &m->a;
    TRY(bind_param(embed, &m->pt, flat, elt, -1, "model.embed_tokens.weight", 0));
    TRY(bind_param(final_norm, &m->pt, flat, elt, -1, "model.norm.weight", 0));
    TRY(bind_param(lm_head, &m->pt, flat, elt, -1, "lm_head.weight", 1));
    if (!*lm_head) *lm_head = *embed;
    for (int l = 0; l < a->n_layers; l++) {
        layer_w_t *w = &lw[l];
        memset(w, 0, sizeof *w);
        w->kind = a->kind[l];
        TRY(bind_param(&w->norm1, &m->pt, flat, elt, l, "input_layernorm.weight", 0));
        TRY(bind_param(&w->norm2, &m->pt, flat, elt, l, "post_attention_layernorm.weight", 0));
        TRY(mlp_w_bind(&w->mlp, &m->pt, flat, elt, l));
        switch (w->kind) {
        case LAYER_ATTN: TRY(attn_w_bind(&w->attn, &m->pt, flat, elt, l)); break;
        case LAYER_MLA: TRY(mla_w_bind(&w->mla, &m->pt, flat, elt, l)); break;
        case LAYER_GDN: TRY(gdn_w_bind(&w->gdn, &m->pt, flat, elt, l)); break;
        case LAYER_M2: TRY(m2_w_bind(&w->m2, &m->pt, flat, elt, l)); break;
        default: return err_set(ERR_UNSUP, "layer %d: %s layers are not supported yet", l, layer_kind_name(w->kind));
        }
    }
    return 0;
}

// The ops each layer kind needs; a backend that lacks one cannot run the model.
static int check_ops(const be_t *be, const arch_t *a) {
    struct {
        const void *fn;
        const char *name;
        int kind; // -1: every model
    } need[] = {
        {be->gemm, "gemm", -1},
        {be->rmsnorm_fwd, "rmsnorm_fwd", -1},
        {be->add_rmsnorm_fwd, "add_rmsnorm_fwd", -1},
        {be->embed_fwd, "embed_fwd", -1},
        {be->swiglu_fwd, "swiglu_fwd", -1},
        {be->proj_swiglu, "proj_swiglu", -1},
        {be->proj_add_rmsnorm, "proj_add_rmsnorm", -1},
        {be->argmax_rows, "argmax_rows", -1},
        {be->proj_rmsnorm_argmax, "proj_rmsnorm_argmax", -1},
        {be->fence_new, "fence_new", -1},
        {be->proj_rmsnorm, "proj_rmsnorm", LAYER_GDN},
        {be->proj_rmsnorm, "proj_rmsnorm", LAYER_MLA},
        {be->attn_fwd, "attn_fwd", LAYER_ATTN},
        {be->rope_fwd, "rope_fwd", LAYER_ATTN},
        {be->attn_fwd, "attn_fwd", LAYER_MLA},
        {be->attn_merge, "attn_merge", LAYER_MLA},
        {be->attn_decode, "attn_decode", LAYER_ATTN},
        {be->kv_append, "kv_append", LAYER_ATTN},
        {be->rope_kv_append, "rope_kv_append", LAYER_ATTN},
        {be->proj_rope_kv_append, "proj_rope_kv_append", LAYER_ATTN},
        {be->mla_decode_attn, "mla_decode_attn", LAYER_MLA},
        {be->mla_rope_append, "mla_rope_append", LAYER_MLA},
        {be->proj_mla_rope_append, "proj_mla_rope_append", LAYER_MLA},
        {be->conv1d_fwd, "conv1d_fwd", LAYER_GDN},
        {be->gdn_chunk_fwd, "gdn_chunk_fwd", LAYER_GDN},
        {be->gdn_recurrent_fwd, "gdn_recurrent_fwd", LAYER_GDN},
        {be->gdn_step, "gdn_step", LAYER_GDN},
        {be->conv1d_fwd, "conv1d_fwd", LAYER_M2},
        {be->ssd_chunk_fwd, "ssd_chunk_fwd", LAYER_M2},
        {be->ssd_recurrent_fwd, "ssd_recurrent_fwd", LAYER_M2},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        int used = need[i].kind < 0 || arch_count(a, (layer_kind_t)need[i].kind);
        if (used && !need[i].fn)
            return err_set(ERR_UNSUP, "the %s backend has no %s op yet, so it cannot run %s layers", be->name,
                           need[i].name, need[i].kind < 0 ? "any" : layer_kind_name((layer_kind_t)need[i].kind));
    }
    return 0;
}

// The descriptor p is when it is one of m->qw, else NULL.
static const be_qmat_t *qmat_of(const model_t *m, const void *p) {
    uintptr_t u = (uintptr_t)p, lo = (uintptr_t)m->qw, hi = (uintptr_t)(m->qw + m->n_qw);
    return m->n_qw && u >= lo && u < hi ? (const be_qmat_t *)p : NULL;
}

static int64_t round64(int64_t n) { return (n + 63) & ~(int64_t)63; }

// Places the quantised matrices (those of src that ptable_quantisable allows
// and the source stores in a block format) in m->qw / m->qmem and the other
// parameters packed in m->w; m->addr says where each one is. Nothing is kept
// quantised when none qualifies (then the caller lays out m->w by pt).
static int place_quantised(model_t *m, wsrc_t *src) {
    const ptable_t *pt = &m->pt;
    be_t *be = m->be;
    if (!be->qmatmul || !be->qproj || !be->qembed_fwd) return 0;
    m->qw = calloc((size_t)pt->n, sizeof *m->qw);
    size_t *qoff = malloc((size_t)pt->n * sizeof *qoff); // per parameter: offset in qmem, or SIZE_MAX
    if (!m->qw || !qoff) {
        free(qoff);
        return err_set(ERR_NOMEM, "out of memory");
    }
    size_t qbytes = 0;
    int64_t dense = 0;
    for (int i = 0; i < pt->n; i++) {
        const param_t *p = &pt->p[i];
        uint32_t type;
        size_t rb;
        qoff[i] = SIZE_MAX;
        if (ptable_quantisable(p) && wsrc_raw_info(src, p->name, p->shape, p->nd, &type, &rb)) {
            m->qw[m->n_qw++] = (be_qmat_t){type, p->shape[0], p->shape[1], rb, NULL};
            qoff[i] = qbytes;
            qbytes += ((size_t)p->shape[0] * rb + 63) & ~(size_t)63;
        } else {
            dense += round64(p->numel);
        }
    }
    int rc = 0;
    if (m->n_qw) {
        m->w = be->alloc(be, (size_t)dense * be->act_size);
        m->qmem = be->alloc(be, qbytes);
        m->addr = malloc((size_t)pt->n * sizeof *m->addr);
        if (!m->w || !m->qmem || !m->addr)
            rc = err_wrap(ERR_NOMEM, "weights of %.1f MiB quantised + %.1f MiB act: ", qbytes / 1048576.0,
                          dense * (double)be->act_size / 1048576.0);
    }
    if (rc == 0 && m->n_qw) {
        be->memset0(be, m->w, (size_t)dense * be->act_size);
        int64_t off = 0;
        for (int i = 0, k = 0; i < pt->n; i++) {
            if (qoff[i] != SIZE_MAX) {
                m->qw[k].data = (const char *)m->qmem + qoff[i];
                m->addr[i] = &m->qw[k++];
            } else {
                m->addr[i] = act_at(be, m->w, off);
                off += round64(pt->p[i].numel);
            }
        }
    }
    free(qoff);
    if (rc == 0 && !m->n_qw) { // nothing qualified: the caller lays out every weight as act
        free(m->qw);
        m->qw = NULL;
    }
    return rc;
}

// src NULL, or flags without MODEL_QUANT: every weight act, laid out by pt.
static int create(model_t *m, const arch_t *a, be_t *be, wsrc_t *src, int flags) {
    memset(m, 0, sizeof *m);
    TRY(check_ops(be, a));
    m->a = *a;
    m->be = be;
    TRY(arch_validate(a, "model"));
    TRY(ptable_build(&m->pt, a));
    m->lw = calloc((size_t)a->n_layers, sizeof *m->lw);
    int rc = m->lw ? 0 : err_set(ERR_NOMEM, "out of memory");
    if (rc == 0 && src && (flags & MODEL_QUANT)) rc = place_quantised(m, src);
    if (rc < 0) {
        model_free(m);
        return rc;
    }
    if (m->n_qw) {
        rc = model_bind(m, m->addr, 0, m->lw, &m->embed, &m->final_norm, &m->lm_head);
    } else {
        size_t bytes = (size_t)m->pt.total * be->act_size;
        if (!(m->w = be->alloc(be, bytes))) {
            long long n = (long long)m->pt.total;
            model_free(m);
            return err_wrap(ERR_NOMEM, "weights of a model of %lld parameters (%.1f MiB): ", n, bytes / 1048576.0);
        }
        be->memset0(be, m->w, bytes); // the alignment gaps stay zero
        rc = model_bind(m, m->w, be->act_size, m->lw, &m->embed, &m->final_norm, &m->lm_head);
    }
    if (rc == 0) rc = model_ensure_positions(m, MODEL_ROPE_POS0);
    if (rc < 0) model_free(m);
    return rc;
}

int model_create(model_t *m, const arch_t *a, be_t *be) { return create(m, a, be, NULL, 0); }

void model_free(model_t *m) {
    be_t *be = m->be;
    if (be) {
        be->free(be, m->w);
        be->free(be, m->rope_cos);
        be->free(be, m->rope_sin);
        be->free(be, m->mla_cos);
        be->free(be, m->mla_sin);
    }
    if (be) be->free(be, m->qmem);
    free(m->qw);
    free(m->addr);
    free(m->lw);
    ptable_free(&m->pt);
    memset(m, 0, sizeof *m);
}

int model_run_create(model_run_t *r, model_t *m, size_t arena_bytes) {
    memset(r, 0, sizeof *r);
    void *amem = arena_bytes ? m->be->alloc(m->be, arena_bytes) : NULL; // 0: a run that borrows (model_run_lend)
    if (arena_bytes && !amem) return err_wrap(ERR_NOMEM, "activation arena of %.1f MiB: ", arena_bytes / 1048576.0);
    r->m = m;
    arena_init(&r->arena, amem, arena_bytes, "activation arena");
    return 0;
}

void model_run_free(model_run_t *r) {
    if (r->m) {
        be_t *be = r->m->be;
        be->free(be, r->arena.base);
        be->free(be, r->pos_buf);
        be->free(be, r->cache_buf);
        be->free(be, r->page_buf);
        for (int i = 0; i < MODEL_STEP_GRAPHS; i++)
            if (r->graphs[i].graph) be->graph_free(be, r->graphs[i].graph);
        be->host_free(be, r->pos_host);
        be->host_free(be, r->cache_host);
        be->host_free(be, r->page_host);
        be->host_free(be, r->ids_host);
        be->free(be, r->greedy_ids);
        be->host_free(be, r->greedy_host);
        if (be->fence_free) {
            be->fence_free(be, r->greedy_inputs);
            for (int i = 0; i < MODEL_GREEDY_AHEAD; i++)
                be->fence_free(be, r->greedy_done[i]);
        }
    }
    for (int i = 0; i < MODEL_STEP_GRAPHS; i++)
        free(r->graphs[i].key.v);
    free(r->key_seen.v);
    free(r->key_new.v);
    free(r->runs);
    free(r->cache_off);
    memset(r, 0, sizeof *r);
}

void model_run_lend(model_run_t *host, model_run_t *r) { arena_lend(&host->arena, &r->arena); }
void model_run_settle(model_run_t *host, model_run_t *r) { arena_settle(&host->arena, &r->arena); }

void model_run_trim(model_run_t *r) {
    be_t *be = r->m->be;
    arena_reset(&r->arena, 0);
    if (!be->discard) return;
    be->discard(be, r->arena.base, r->arena.peak);
    if (be->scratch.used == 0) be->discard(be, be->scratch.base, be->scratch.peak);
}

static int upload_tables(be_t *be, const rope_cfg_t *r, int dr, int n_pos, float **dcos, float **dsin) {
    size_t n = (size_t)n_pos * (dr / 2);
    float *hc = malloc(n * sizeof(float)), *hs = malloc(n * sizeof(float));
    float *dc = be->alloc(be, n * sizeof(float)), *ds = be->alloc(be, n * sizeof(float));
    int rc = (!hc || !hs || !dc || !ds) ? err_set(ERR_NOMEM, "RoPE tables for %d positions", n_pos) : 0;
    if (rc == 0) {
        rope_tables(r, dr, n_pos, hc, hs);
        rc = be->copy_h2d(be, dc, hc, n * sizeof(float));
        if (rc == 0) rc = be->copy_h2d(be, ds, hs, n * sizeof(float));
    }
    free(hc);
    free(hs);
    if (rc < 0) {
        be->free(be, dc);
        be->free(be, ds);
        return rc;
    }
    be->free(be, *dcos);
    be->free(be, *dsin);
    *dcos = dc;
    *dsin = ds;
    return 0;
}

int model_ensure_positions(model_t *m, int n_pos) {
    if (n_pos <= m->rope_npos) return 0;
    int n = m->rope_npos ? m->rope_npos : MODEL_ROPE_POS0;
    if (n_pos > 2 * n) // a far target: just that (rounded up), not the power of two above it
        n = n_pos > INT_MAX - 4095 ? n_pos : (n_pos + 4095) / 4096 * 4096;
    else
        while (n < n_pos)
            n *= 2;
    const arch_t *a = &m->a;
    // the attention layers' tables (none for a hybrid of MLA and linear layers)
    if (arch_count(a, LAYER_ATTN)) TRY(upload_tables(m->be, &a->rope, a->dh, n, &m->rope_cos, &m->rope_sin));
    if (arch_count(a, LAYER_MLA)) TRY(upload_tables(m->be, &a->mla.rope, a->mla.d_rope, n, &m->mla_cos, &m->mla_sin));
    m->rope_npos = n;
    return 0;
}

// One parameter into out (numel floats), honouring MODEL_ALLOW_MISSING.
static int read_param(wsrc_t *src, const param_t *p, int flags, float *out) {
    if ((flags & MODEL_ALLOW_MISSING) && !wsrc_has(src, p->name)) {
        log_warn("%s: missing tensor %s: left at zero (--allow-missing)", wsrc_path(src), p->name);
        memset(out, 0, (size_t)p->numel * sizeof(float));
        return 0;
    }
    return wsrc_read(src, p->name, p->shape, p->nd, out);
}

// Every tensor of a folder must be a parameter of the architecture.
static int check_unknown(wsrc_t *src, const ptable_t *pt, int flags) {
    const char **names = malloc((size_t)pt->n * sizeof *names);
    if (!names) return err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; i < pt->n; i++)
        names[i] = pt->p[i].name;
    int rc = wsrc_check_unknown(src, names, pt->n, flags & MODEL_ALLOW_MISSING);
    free(names);
    return rc;
}

int model_read_host(wsrc_t *src, const ptable_t *pt, float *host, int flags) {
    for (int i = 0; i < pt->n; i++)
        TRY(read_param(src, &pt->p[i], flags, host + pt->p[i].off));
    return check_unknown(src, pt, flags);
}

// Rows of a quantised matrix copied at a time: the host buffer stays small and
// the file's pages are given back part by part (peak memory: the copy, not the
// copy plus the file).
#define LOAD_CHUNK_BYTES ((size_t)4 << 20)

static int64_t load_rows(const wsrc_t *src, const param_t *p, const be_qmat_t *q) {
    if (wsrc_raw_permuted(src, p->name)) return q->rows;
    int64_t n = (int64_t)(LOAD_CHUNK_BYTES / q->row_bytes);
    return n < 1 ? 1 : n > q->rows ? q->rows : n;
}

int model_load_src(model_t *m, wsrc_t *src, const arch_t *a, be_t *be, int flags) {
    TRY(create(m, a, be, src, flags));
    // One tensor (or chunk of rows) at a time through a host buffer of the
    // largest: floats for act weights, stored bytes for the quantised ones.
    size_t maxb = 0;
    for (int i = 0; i < m->pt.n; i++) {
        const param_t *p = &m->pt.p[i];
        const be_qmat_t *q = m->n_qw ? qmat_of(m, m->addr[i]) : NULL;
        size_t b = q ? (size_t)load_rows(src, p, q) * q->row_bytes : (size_t)p->numel * sizeof(float);
        if (b > maxb) maxb = b;
    }
    void *host = malloc(maxb ? maxb : 4);
    int rc = host ? 0 : err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < m->pt.n; i++) {
        const param_t *p = &m->pt.p[i];
        const be_qmat_t *q = m->n_qw ? qmat_of(m, m->addr[i]) : NULL;
        if (q) {
            int64_t step = load_rows(src, p, q);
            for (int64_t r0 = 0; rc == 0 && r0 < q->rows; r0 += step) {
                int64_t n = q->rows - r0 < step ? q->rows - r0 : step;
                rc = wsrc_read_raw(src, p->name, p->shape, p->nd, r0, n, host);
                if (rc == 0)
                    rc = be->copy_h2d(be, (char *)q->data + (size_t)r0 * q->row_bytes, host, (size_t)n * q->row_bytes);
            }
        } else {
            rc = read_param(src, p, 0, host);
            void *dst = m->n_qw ? m->addr[i] : act_at(be, m->w, p->off);
            if (rc == 0) rc = be->upload_act(be, dst, host, p->numel);
        }
    }
    if (rc == 0) rc = check_unknown(src, &m->pt, 0);
    free(host);
    if (rc < 0 && m->be) model_free(m);
    return rc;
}

int model_load_ex(model_t *m, const char *path, be_t *be, int flags) {
    arch_t a;
    wsrc_t *src;
    TRY(wsrc_open(&src, path, &a));
    int rc = model_load_src(m, src, &a, be, flags);
    wsrc_close(src);
    return rc;
}

int model_load(model_t *m, const char *path, be_t *be) { return model_load_ex(m, path, be, 0); }

// ---- inference state -----------------------------------------------------------

// Rounds each fixed-state buffer up so the next one starts 256-byte aligned.
static int64_t round256(int64_t n) { return (n + 255) & ~(int64_t)255; }

int64_t model_cache_bytes_per_token(const model_t *m) {
    return arch_cache_bytes_per_token(&m->a, (int)m->be->act_size);
}

// Layer l's growing buffers: how many, their bytes per token of one sequence
// (w, in arch_cache_parts' order) and the cache fields holding them (slot;
// a paged state's point into its pool).
static int grow_parts(const model_t *m, const model_state_t *st, int l, int64_t w[4], void **slot[2]) {
    if (!arch_cache_grows(&m->a, l)) return 0;
    layer_cache_t *c = &st->layers[l];
    if (m->a.kind[l] == LAYER_ATTN)
        slot[0] = &c->u.attn.k, slot[1] = &c->u.attn.v;
    else
        slot[0] = &c->u.mla.kv;
    return arch_cache_parts(&m->a, l, 1, 1, sizeof(float), (int)m->be->act_size, w);
}

// Moves layer l's growing buffers to new ones of cap tokens per sequence,
// copying each sequence's st->len cached rows; the layer is as it was when
// this fails.
static int grow_layer(const model_t *m, model_state_t *st, int l, int cap) {
    be_t *be = m->be;
    layer_cache_t *c = &st->layers[l];
    int64_t w[4];
    void **slot[2], *nb[2] = {NULL, NULL};
    int np = grow_parts(m, st, l, w, slot), rc = 0;
    for (int i = 0; i < np && rc == 0; i++)
        if (!(nb[i] = be->alloc(be, (size_t)((int64_t)st->B * cap * w[i])))) rc = ERR_NOMEM;
    for (int i = 0; i < np && rc == 0 && st->len > 0; i++)
        for (int b = 0; b < st->B && rc == 0; b++)
            rc = be->copy_d2d(be, (char *)nb[i] + (int64_t)b * cap * w[i],
                              (char *)*slot[i] + (int64_t)b * c->cap * w[i], (size_t)((int64_t)st->len * w[i]));
    for (int i = 0; i < np; i++) { // the old buffers go on success, the new ones on failure
        void *drop = rc == 0 ? *slot[i] : nb[i];
        if (rc == 0) {
            st->cache_bytes += (size_t)((int64_t)st->B * (cap - c->cap) * w[i]);
            *slot[i] = nb[i];
        }
        be->free(be, drop);
    }
    if (rc == 0) c->cap = cap;
    return rc;
}

// Grows every growing layer to at least cap tokens; st->cap becomes the room
// all of them have, also when one fails halfway.
static int grow_all(const model_t *m, model_state_t *st, int cap) {
    int rc = 0, room = st->ctx;
    for (int l = 0; l < m->a.n_layers; l++) {
        if (!arch_cache_grows(&m->a, l)) continue;
        if (rc == 0 && st->layers[l].cap < cap) rc = grow_layer(m, st, l, cap);
        if (st->layers[l].cap < room) room = st->layers[l].cap;
    }
    st->cap = room;
    st->bytes = st->fixed_bytes + st->cache_bytes;
    return rc;
}

// Grows to want tokens (n when want does not fit and is more); n is what the
// caller needs, named in the error.
static int grow_to(const model_t *m, model_state_t *st, int n, int want) {
    int rc = grow_all(m, st, want);
    if (rc == ERR_NOMEM && want > n) rc = grow_all(m, st, n);
    if (rc < 0) {
        int64_t per = model_cache_bytes_per_token(m);
        return err_wrap(rc,
                        "cannot grow the cache to %d tokens for %d sequence%s: %lld bytes (%lld per token), %zu "
                        "held now: ",
                        n, st->B, st->B == 1 ? "" : "s", (long long)((int64_t)st->B * n * per), (long long)per,
                        st->cache_bytes);
    }
    return 0;
}

int model_pages_for(int64_t n) { return (int)((n + BE_PAGE_ROWS - 1) / BE_PAGE_ROWS); }

// ---- the page pool ---------------------------------------------------------------

int64_t model_page_bytes(const model_t *m) { return (int64_t)BE_PAGE_ROWS * model_cache_bytes_per_token(m); }

int model_pool_create(const model_t *m, model_pool_t *pool, int n_pages) {
    const arch_t *a = &m->a;
    be_t *be = m->be;
    memset(pool, 0, sizeof *pool);
    if (n_pages < 1) return err_set(ERR_INPUT, "a page pool of %d pages", n_pages);
    // each part's pages one after another, every part 256-byte aligned
    int64_t total = 0, w[4];
    for (int l = 0; l < a->n_layers; l++) {
        int np = arch_cache_grows(a, l) ? arch_cache_parts(a, l, 1, 1, sizeof(float), (int)be->act_size, w) : 0;
        for (int i = 0; i < np; i++)
            total += round256((int64_t)n_pages * BE_PAGE_ROWS * w[i]);
    }
    pool->part = calloc((size_t)2 * (a->n_layers ? a->n_layers : 1), sizeof *pool->part);
    pool->ref = calloc((size_t)n_pages, sizeof *pool->ref);
    if (!pool->part || !pool->ref) {
        model_pool_free(m, pool);
        return err_set(ERR_NOMEM, "out of memory");
    }
    if (total > 0 && !(pool->mem = be->alloc(be, (size_t)total))) {
        model_pool_free(m, pool);
        return err_wrap(ERR_NOMEM, "a page pool of %d pages of %d tokens (%.1f MiB): ", n_pages, BE_PAGE_ROWS,
                        total / 1048576.0);
    }
    char *p = pool->mem;
    for (int l = 0; l < a->n_layers; l++) {
        int np = arch_cache_grows(a, l) ? arch_cache_parts(a, l, 1, 1, sizeof(float), (int)be->act_size, w) : 0;
        for (int i = 0; i < np; i++) {
            pool->part[2 * l + i] = p;
            p += round256((int64_t)n_pages * BE_PAGE_ROWS * w[i]);
        }
    }
    pool->n_pages = pool->n_free = n_pages;
    pool->bytes = (size_t)total;
    pool->page_bytes = model_page_bytes(m);
    return 0;
}

void model_pool_free(const model_t *m, model_pool_t *pool) {
    if (pool->mem) m->be->free(m->be, pool->mem);
    free(pool->ref);
    free(pool->part);
    memset(pool, 0, sizeof *pool);
}

// A free page with one reference (the lowest, so that a sequence's pages
// tend to follow each other: fewer copies when a prefill gathers them), or
// -1 when none is left.
static int pool_take(model_pool_t *pool) {
    if (pool->n_free == 0) return -1;
    for (int p = pool->hint; p < pool->n_pages; p++)
        if (pool->ref[p] == 0) {
            pool->ref[p] = 1;
            pool->n_free--;
            pool->hint = p + 1;
            return p;
        }
    assert(0 && "n_free counts a page that is not free");
    return -1;
}

void model_pool_hold(model_pool_t *pool, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++) {
        assert(pool->ref[pages[i]] > 0);
        pool->ref[pages[i]]++;
    }
}

void model_pool_release(model_pool_t *pool, const int32_t *pages, int n) {
    for (int i = 0; i < n; i++) {
        int p = pages[i];
        assert(pool->ref[p] > 0);
        if (--pool->ref[p] == 0) {
            pool->n_free++;
            if (p < pool->hint) pool->hint = p;
        }
    }
}

// ---- paged states ----------------------------------------------------------------

// The room and bytes of a paged state after its pages changed.
static void paged_sync(const model_t *m, model_state_t *st) {
    int64_t rows = (int64_t)st->n_pages * BE_PAGE_ROWS;
    st->cap = rows < st->ctx ? (int)rows : st->ctx;
    for (int l = 0; l < m->a.n_layers; l++)
        if (arch_cache_grows(&m->a, l)) st->layers[l].cap = st->cap;
    st->cache_bytes = (size_t)((int64_t)st->n_pages * st->pool->page_bytes);
    st->bytes = st->fixed_bytes + st->cache_bytes;
}

// Replaces the state's page i (shared) by a copy of its rows below len.
static int paged_copy_on_write(const model_t *m, model_state_t *st, int i) {
    model_pool_t *pool = st->pool;
    int q = pool_take(pool);
    if (q < 0) return ERR_NOMEM;
    int64_t rows = (int64_t)st->len - (int64_t)i * BE_PAGE_ROWS, w[4];
    if (rows > BE_PAGE_ROWS) rows = BE_PAGE_ROWS;
    int rc = 0;
    for (int l = 0; l < m->a.n_layers && rc == 0 && rows > 0; l++) {
        int np =
            arch_cache_grows(&m->a, l) ? arch_cache_parts(&m->a, l, 1, 1, sizeof(float), (int)m->be->act_size, w) : 0;
        for (int k = 0; k < np && rc == 0; k++) {
            char *part = pool->part[2 * l + k];
            int64_t page = (int64_t)BE_PAGE_ROWS * w[k];
            rc = m->be->copy_d2d(m->be, part + q * page, part + st->pages[i] * page, (size_t)(rows * w[k]));
        }
    }
    int32_t drop = rc == 0 ? st->pages[i] : q;
    model_pool_release(pool, &drop, 1);
    if (rc == 0) st->pages[i] = q;
    return rc;
}

static int paged_reserve(const model_t *m, model_state_t *st, int n) {
    model_pool_t *pool = st->pool;
    int need = model_pages_for(n), rc = 0;
    // pages that rows [len, n) write into and others hold too: copies first
    for (int i = st->len / BE_PAGE_ROWS; i < st->n_pages && i < need && rc == 0; i++)
        if (pool->ref[st->pages[i]] > 1) rc = paged_copy_on_write(m, st, i);
    while (rc == 0 && st->n_pages < need) {
        int p = pool_take(pool);
        if (p < 0)
            rc = ERR_NOMEM;
        else
            st->pages[st->n_pages++] = p;
    }
    paged_sync(m, st);
    if (rc == ERR_NOMEM)
        return err_set(
            ERR_NOMEM,
            "the page pool is full: %d tokens need %d pages of %d tokens, the sequence holds %d, and none of "
            "the %d pages is free (%lld bytes a page)",
            n, need, BE_PAGE_ROWS, st->n_pages, pool->n_pages, (long long)pool->page_bytes);
    return rc;
}

static void paged_drop(const model_t *m, model_state_t *st) {
    model_pool_release(st->pool, st->pages, st->n_pages);
    st->n_pages = 0;
    paged_sync(m, st);
}

int model_state_reserve(const model_t *m, model_state_t *st, int n) {
    if (n <= st->cap && !st->pool) return 0;
    if (n > st->ctx) return err_set(ERR_INPUT, "%d tokens per sequence exceed the state's context of %d", n, st->ctx);
    if (st->pool) return paged_reserve(m, st, n); // also when it has the room: a shared page is copied
    // Doubling keeps the copies at O(1) per token; near the memory's end the
    // exact room asked for may still fit where double does not.
    int want = st->cap > st->ctx / 2 ? st->ctx : 2 * st->cap;
    return grow_to(m, st, n, want < n ? n : want);
}

int model_state_fit(const model_t *m, model_state_t *st, int n) {
    if (n <= st->cap && !st->pool) return 0;
    if (n > st->ctx) return err_set(ERR_INPUT, "%d tokens per sequence exceed the state's context of %d", n, st->ctx);
    if (st->pool) return paged_reserve(m, st, n);
    return grow_to(m, st, n, n);
}

// What both forms share: the layers and the fixed states, allocated and
// zeroed; no growing room yet (cap 0 when a layer grows).
static int state_alloc(const model_t *m, model_state_t *st, int B, int ctx) {
    const arch_t *a = &m->a;
    be_t *be = m->be;
    memset(st, 0, sizeof *st);
    if (B < 1 || ctx < 1)
        return err_set(ERR_INPUT, "an inference state needs at least 1 sequence of 1 token, asked for %d of %d", B,
                       ctx);
    st->B = B;
    st->ctx = ctx;
    st->layers = calloc((size_t)a->n_layers, sizeof *st->layers);
    if (!st->layers) return err_set(ERR_NOMEM, "out of memory");
    // The fixed-size states: sizes first, then one block, zeroed.
    int64_t part[4], total = 0;
    int grows = 0;
    for (int l = 0; l < a->n_layers; l++) {
        grows |= arch_cache_grows(a, l);
        if (arch_cache_grows(a, l)) continue;
        int np = arch_cache_parts(a, l, B, 1, sizeof(float), (int)be->act_size, part);
        for (int i = 0; i < np; i++)
            total += round256(part[i]);
    }
    if (total) {
        st->fixed = be->alloc(be, (size_t)total);
        if (!st->fixed)
            return err_wrap(ERR_NOMEM, "recurrent states of %d sequence%s (%lld bytes): ", B, B == 1 ? "" : "s",
                            (long long)total);
        st->fixed_bytes = (size_t)total;
        TRY(be->memset0(be, st->fixed, st->fixed_bytes));
    }
    char *p = st->fixed;
    for (int l = 0; l < a->n_layers; l++) {
        layer_cache_t *c = &st->layers[l];
        c->B = B, c->len = 0, c->ctx = ctx;
        c->cap = arch_cache_grows(a, l) ? 0 : ctx; // fixed states hold any length
        if (arch_cache_grows(a, l)) continue;
        void *buf[4];
        int np = arch_cache_parts(a, l, B, 1, sizeof(float), (int)be->act_size, part);
        for (int i = 0; i < np; i++)
            buf[i] = p, p += round256(part[i]);
        if (a->kind[l] == LAYER_GDN)
            c->u.gdn.state = buf[0], c->u.gdn.conv_q = buf[1], c->u.gdn.conv_k = buf[2], c->u.gdn.conv_v = buf[3];
        else if (a->kind[l] == LAYER_M2)
            c->u.m2.state = buf[0], c->u.m2.conv = buf[1];
    }
    st->cap = grows ? 0 : ctx;
    st->bytes = st->fixed_bytes;
    return 0;
}

int model_state_alloc(const model_t *m, model_state_t *st, int B, int ctx) {
    int rc = state_alloc(m, st, B, ctx);
    if (rc == 0) rc = model_state_reserve(m, st, ctx < MODEL_STATE_CAP0 ? ctx : MODEL_STATE_CAP0);
    if (rc < 0) model_state_free(m, st);
    return rc;
}

int model_state_alloc_paged(const model_t *m, model_state_t *st, model_pool_t *pool, int ctx) {
    int rc = state_alloc(m, st, 1, ctx);
    if (rc == 0 && !(st->pages = calloc((size_t)model_pages_for(ctx), sizeof *st->pages)))
        rc = err_set(ERR_NOMEM, "out of memory");
    if (rc < 0) {
        model_state_free(m, st);
        return rc;
    }
    st->pool = pool;
    for (int l = 0; l < m->a.n_layers; l++) {
        if (!arch_cache_grows(&m->a, l)) continue;
        layer_cache_t *c = &st->layers[l];
        c->pages = st->pages, c->page_stride = model_pages_for(ctx);
        c->pool_rows = (int64_t)pool->n_pages * BE_PAGE_ROWS;
        if (m->a.kind[l] == LAYER_ATTN)
            c->u.attn.k = pool->part[2 * l], c->u.attn.v = pool->part[2 * l + 1];
        else
            c->u.mla.kv = pool->part[2 * l];
    }
    paged_sync(m, st);
    return 0;
}

void model_state_free(const model_t *m, model_state_t *st) {
    if (st->pool) {
        paged_drop(m, st);
    } else if (st->layers) {
        for (int l = 0; l < m->a.n_layers; l++) {
            int64_t w[4];
            void **slot[2];
            int np = grow_parts(m, st, l, w, slot);
            for (int i = 0; i < np; i++)
                m->be->free(m->be, *slot[i]);
        }
    }
    if (st->fixed) m->be->free(m->be, st->fixed);
    free(st->layers);
    free(st->pages);
    memset(st, 0, sizeof *st);
}

static void set_len(const model_t *m, model_state_t *st, int len) {
    st->len = len;
    for (int l = 0; l < m->a.n_layers; l++)
        st->layers[l].len = len;
}

// A fresh sequence: every state and conv window back to zero, nothing cached.
void model_state_reset(const model_t *m, model_state_t *st) {
    if (st->fixed) m->be->memset0(m->be, st->fixed, st->fixed_bytes);
    set_len(m, st, 0);
    if (st->pool) paged_drop(m, st);
}

// ---- snapshots -------------------------------------------------------------------

int64_t model_snapshot_rows_bytes(const model_t *m, int n) { return (int64_t)n * model_cache_bytes_per_token(m); }

// Layer l's fixed buffers (none when it grows): their bytes for one sequence
// (w, arch_cache_parts' order) and where they are (slot: [B, ...] each).
static int fixed_parts(const model_t *m, const model_state_t *st, int l, int64_t w[4], void *slot[4]) {
    if (arch_cache_grows(&m->a, l)) return 0;
    const layer_cache_t *c = &st->layers[l];
    if (m->a.kind[l] == LAYER_GDN)
        slot[0] = c->u.gdn.state, slot[1] = c->u.gdn.conv_q, slot[2] = c->u.gdn.conv_k, slot[3] = c->u.gdn.conv_v;
    else if (m->a.kind[l] == LAYER_M2)
        slot[0] = c->u.m2.state, slot[1] = c->u.m2.conv;
    else
        return 0;
    return arch_cache_parts(&m->a, l, 1, 1, sizeof(float), (int)m->be->act_size, w);
}

int64_t model_snapshot_fixed_bytes(const model_t *m) {
    int64_t w[4], total = 0;
    for (int l = 0; l < m->a.n_layers; l++) {
        if (arch_cache_grows(&m->a, l)) continue;
        int np = arch_cache_parts(&m->a, l, 1, 1, sizeof(float), (int)m->be->act_size, w);
        for (int i = 0; i < np; i++)
            total += w[i];
    }
    return total;
}

// The copies of a snapshot or a restore: sequence b's rows [0, n) between the
// state (contiguous or paged: run by run of consecutive rows) and a compact
// buffer of n_rows rows, and its fixed states; to_state says which way.
static int snap_copy(const model_t *m, model_state_t *st, int b, int n, int n_rows, void *rows, void *fixed,
                     int to_state) {
    be_t *be = m->be;
    char *pr = rows, *pf = fixed;
    for (int l = 0; l < m->a.n_layers; l++) {
        int64_t w[4];
        void **gslot[2], *fslot[4];
        const layer_cache_t *lc = &st->layers[l];
        int np = grow_parts(m, st, l, w, gslot);
        for (int i = 0; i < np && rows; i++) {
            for (int64_t u = 0; u < n;) {
                int64_t run = cache_run(lc, b, u, n - u);
                char *s = (char *)*gslot[i] + cache_row(lc, b, u) * w[i], *c = pr + u * w[i];
                size_t bytes = (size_t)(run * w[i]);
                TRY(to_state ? be->copy_d2d(be, s, c, bytes) : be->copy_d2d(be, c, s, bytes));
                u += run;
            }
            pr += (int64_t)n_rows * w[i];
        }
        np = fixed_parts(m, st, l, w, fslot);
        for (int i = 0; i < np && fixed; i++) {
            char *s = (char *)fslot[i] + (int64_t)b * w[i];
            TRY(to_state ? be->copy_d2d(be, s, pf, (size_t)w[i]) : be->copy_d2d(be, pf, s, (size_t)w[i]));
            pf += w[i];
        }
    }
    return 0;
}

int model_state_snapshot(const model_t *m, const model_state_t *st, int b, int n, void *rows, void *fixed) {
    if (b < 0 || b >= st->B || n < 0 || n > st->len)
        return err_set(ERR_INPUT, "snapshot of sequence %d, %d rows: the state has %d sequences of %d tokens", b, n,
                       st->B, st->len);
    return snap_copy(m, (model_state_t *)st, b, n, n, rows, fixed, 0);
}

int model_state_restore(const model_t *m, model_state_t *st, const void *rows, int n_rows, const void *fixed, int len) {
    if (st->B != 1 || len < 0 || len > n_rows || len > st->ctx || (!fixed && model_snapshot_fixed_bytes(m) > 0) ||
        (!rows && model_snapshot_rows_bytes(m, len) > 0))
        return err_set(ERR_INPUT,
                       "restore of %d tokens from a snapshot of %d rows%s%s into a state of %d sequences of at most %d",
                       len, n_rows, rows ? "" : " (no rows)", fixed ? "" : " (no fixed states)", st->B, st->ctx);
    if (st->pool) set_len(m, st, 0); // nothing held is kept: no shared page copied for rows to be overwritten
    TRY(model_state_reserve(m, st, len));
    int rc = snap_copy(m, st, 0, len, n_rows, (void *)rows, (void *)fixed, 1);
    if (rc < 0) { // half copied: a fresh sequence rather than a mixed one
        model_state_reset(m, st);
        return rc;
    }
    set_len(m, st, len);
    return 0;
}

int model_state_share(const model_t *m, const model_state_t *st, int n, int32_t *pages) {
    if (!st->pool || n < 0 || n > st->len)
        return err_set(ERR_INPUT, "sharing %d rows of a %s state of %d tokens", n, st->pool ? "paged" : "contiguous",
                       st->len);
    int k = model_pages_for(n);
    memcpy(pages, st->pages, (size_t)k * sizeof *pages);
    model_pool_hold(st->pool, pages, k);
    return 0;
}

int model_state_restore_pages(const model_t *m, model_state_t *st, const int32_t *pages, const void *fixed, int len) {
    if (!st->pool || len < 0 || len > st->ctx || (!fixed && model_snapshot_fixed_bytes(m) > 0))
        return err_set(ERR_INPUT, "restore of %d tokens%s into a %s state of at most %d", len,
                       fixed ? "" : " (no fixed states)", st->pool ? "paged" : "contiguous", st->ctx);
    paged_drop(m, st);
    if (fixed) {
        int rc = snap_copy(m, st, 0, 0, 0, NULL, (void *)fixed, 1);
        if (rc < 0) {
            model_state_reset(m, st);
            return rc;
        }
    }
    int k = model_pages_for(len);
    memcpy(st->pages, pages, (size_t)k * sizeof *pages);
    model_pool_hold(st->pool, pages, k);
    st->n_pages = k;
    paged_sync(m, st);
    set_len(m, st, len);
    return 0;
}
// ---- forward (inference) ---------------------------------------------------------

// Room for `need` elements of `elt` bytes in a device buffer and its host
// staging twin, at least `least`: grown, never shrunk, so that a decode token
// allocates nothing. 1 when they were replaced (what they held is gone).
static int mirror_room(be_t *be, void **dev, void **host, int64_t *cap, int64_t need, int64_t least, size_t elt,
                       const char *what) {
    if (need <= *cap) return 0;
    int64_t n = need > least ? need : least;
    void *d = be->alloc(be, (size_t)n * elt), *h = be->host_alloc(be, (size_t)n * elt);
    if (!d || !h) {
        be->free(be, d);
        be->host_free(be, h);
        return err_set(ERR_NOMEM, "%s for %lld rows", what, (long long)need);
    }
    be->free(be, *dev);
    be->host_free(be, *host);
    *dev = d, *host = h, *cap = n;
    return 1;
}

// Room for `need` elements in the position buffers (device and host).
static int pos_room(model_run_t *r, int64_t need) {
    int rc = mirror_room(r->m->be, (void **)&r->pos_buf, (void **)&r->pos_host, &r->pos_cap, need, 4096,
                         sizeof(int32_t), "position arrays");
    if (rc > 0) r->pos.d = NULL, r->step_pos = NULL, r->run_pos = NULL; // what was prepared is gone
    return rc < 0 ? rc : 0;
}

int model_prepare_positions(model_run_t *r, int B, int T, int pos0) {
    be_t *be = r->m->be;
    if (ctx_pos_is(&r->pos, B, T, pos0)) return 0;
    int64_t need = (int64_t)B * T;
    TRY(pos_room(r, need));
    int32_t *h = r->pos_host;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            h[(int64_t)b * T + t] = pos0 + t;
    // a failed upload leaves nothing prepared
    r->pos.d = NULL, r->step_pos = NULL, r->step_cache = NULL, r->run_pos = NULL;
    TRY(be->copy_h2d(be, r->pos_buf, h, (size_t)need * sizeof(int32_t)));
    r->pos = (ctx_pos_t){r->pos_buf, B, T, pos0};
    return 0;
}

// A decode step's positions (layer_ctx_t step_pos): every sequence of sts[k]
// at sts[k]->len, for the N rows in order, then the visible lengths len + 1.
static int prepare_step_positions(model_run_t *r, model_state_t *const *sts, int n_st, int N) {
    TRY(pos_room(r, 2 * (int64_t)N));
    int32_t *h = r->pos_host;
    for (int k = 0, row = 0; k < n_st; k++)
        for (int b = 0; b < sts[k]->B; b++, row++)
            h[row] = sts[k]->len, h[N + row] = sts[k]->len + 1;
    r->pos.d = NULL, r->step_pos = NULL, r->run_pos = NULL;
    TRY(r->m->be->copy_h2d_async(r->m->be, r->pos_buf, h, (size_t)2 * N * sizeof(int32_t)));
    r->step_pos = r->pos_buf;
    return 0;
}

// Room for n_st runs in r->runs (grown, never shrunk).
static int runs_room(model_run_t *r, int n_st) {
    if (n_st <= r->runs_cap) return 0;
    step_run_t *p = realloc(r->runs, (size_t)n_st * sizeof *p);
    if (!p) return err_set(ERR_NOMEM, "out of memory");
    r->runs = p, r->runs_cap = n_st;
    return 0;
}

// A decode step's cache bases (layer_ctx_t step_cache) of every layer, for
// the N rows of the states sts[0..n_st) in order: one upload per step, so
// that a layer's decode ops take every row of every state in one call.
static int prepare_step_caches(model_run_t *r, model_state_t *const *sts, int n_st) {
    const model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    r->step_cache = NULL, r->step_pages = (be_pages_t){NULL, 0};
    TRY(runs_room(r, n_st));
    if (!r->cache_off && !(r->cache_off = malloc((size_t)(a->n_layers ? a->n_layers : 1) * sizeof(int64_t))))
        return err_set(ERR_NOMEM, "out of memory");
    int64_t need = 0;
    for (int l = 0; l < a->n_layers; l++) {
        for (int k = 0; k < n_st; k++)
            r->runs[k] = (step_run_t){&sts[k]->layers[l], 0, sts[k]->B, 1, sts[k]->len};
        int n = step_cache_bases(a, l, be->act_size, r->runs, n_st, NULL);
        r->cache_off[l] = n ? need : -1;
        need += n;
    }
    if (need == 0) return 0;
    int rc = mirror_room(be, (void **)&r->cache_buf, (void **)&r->cache_host, &r->cache_cap, need, 1024, sizeof(void *),
                         "cache pointers");
    if (rc < 0) return rc;
    for (int l = 0; l < a->n_layers; l++) {
        if (r->cache_off[l] < 0) continue;
        for (int k = 0; k < n_st; k++)
            r->runs[k] = (step_run_t){&sts[k]->layers[l], 0, sts[k]->B, 1, sts[k]->len};
        step_cache_bases(a, l, be->act_size, r->runs, n_st, r->cache_host + r->cache_off[l]);
    }
    TRY(be->copy_h2d_async(be, r->cache_buf, r->cache_host, (size_t)need * sizeof(void *)));
    // The rows' page tables, shared by the layers (those of the first growing
    // one; every growing layer of a state has the same pages), when a state
    // is paged; else none (contiguous caches need no table).
    r->step_pages = (be_pages_t){NULL, 0};
    for (int l = 0; l < a->n_layers; l++) {
        if (!arch_cache_grows(a, l)) continue;
        for (int k = 0; k < n_st; k++)
            r->runs[k] = (step_run_t){&sts[k]->layers[l], 0, sts[k]->B, 1, sts[k]->len};
        int stride = step_page_stride(r->runs, n_st), N = step_rows(r->runs, n_st);
        if (!stride) break;
        int64_t n = (int64_t)N * stride;
        rc = mirror_room(be, (void **)&r->page_buf, (void **)&r->page_host, &r->page_cap, n, 1024, sizeof(int32_t),
                         "page tables");
        if (rc < 0) return rc;
        step_page_tables(r->runs, n_st, stride, r->page_host);
        TRY(be->copy_h2d_async(be, r->page_buf, r->page_host, (size_t)n * sizeof(int32_t)));
        r->step_pages = (be_pages_t){r->page_buf, stride};
        break;
    }
    r->step_cache = r->cache_buf;
    return 0;
}

layer_ctx_t model_layer_ctx(model_run_t *r, int l) {
    const model_t *m = r->m;
    layer_ctx_t c = {.be = m->be,
                     .a = &m->a,
                     .layer = l,
                     .arena = &r->arena,
                     .rope_cos = m->rope_cos,
                     .rope_sin = m->rope_sin,
                     .rope_npos = m->rope_npos,
                     .pos = &r->pos,
                     .run_pos = r->run_pos,
                     .step_pos = r->step_pos,
                     .qw = m->qw,
                     .n_qw = m->n_qw};
    if (r->step_cache && r->cache_off[l] >= 0)
        c.step_cache = r->step_cache + r->cache_off[l], c.step_pages = r->step_pages;
    if (m->a.kind[l] == LAYER_MLA) c.rope_cos = m->mla_cos, c.rope_sin = m->mla_sin;
    return c;
}

// Every id of the model's vocabulary, or an input error naming the first that is not.
static int check_ids(const model_t *m, const int32_t *ids, int64_t N) {
    for (int64_t i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= m->a.V)
            return err_set(ERR_INPUT, "token id %d out of range [0, %d)", ids[i], m->a.V);
    return 0;
}

// The ids (host) checked and uploaded to d_ids.
static int upload_ids(const model_t *m, const int32_t *ids, int64_t N, int32_t *d_ids) {
    TRY(check_ids(m, ids, N));
    return m->be->copy_h2d(m->be, d_ids, ids, (size_t)N * sizeof(int32_t));
}

// x [N, d] = the embeddings of the device ids d_ids.
static void embed_rows(const model_t *m, const int32_t *d_ids, int64_t N, void *x) {
    const be_qmat_t *q = qmat_of(m, m->embed);
    if (q)
        m->be->qembed_fwd(m->be, x, q, d_ids, N);
    else
        m->be->embed_fwd(m->be, x, m->embed, d_ids, N, m->a.d);
}

int model_embed(const model_t *m, const int32_t *ids, int64_t N, int32_t *d_ids, void *x) {
    TRY(upload_ids(m, ids, N, d_ids));
    embed_rows(m, d_ids, N, x);
    return 0;
}

int model_mixer_forward(const layer_ctx_t *c, const layer_w_t *w, void *out, const void *x, int B, int T, int pos0,
                        layer_cache_t *cache, mixer_saved_t *sv) {
    int rc;
    switch (w->kind) {
    case LAYER_ATTN: rc = attn_forward(c, &w->attn, out, x, B, T, pos0, cache, sv ? &sv->attn : NULL); break;
    case LAYER_MLA: rc = mla_forward(c, &w->mla, out, x, B, T, pos0, cache, sv ? &sv->mla : NULL); break;
    case LAYER_GDN: rc = gdn_forward(c, &w->gdn, out, x, B, T, pos0, cache, sv ? &sv->gdn : NULL); break;
    case LAYER_M2: rc = m2_forward(c, &w->m2, out, x, B, T, pos0, cache, sv ? &sv->m2 : NULL); break;
    default: rc = err_set(ERR_UNSUP, "unknown layer kind %d", (int)w->kind);
    }
    if (rc < 0) return err_wrap(rc, "layer %d (%s): ", c->layer, layer_kind_name(w->kind));
    return 0;
}

int model_mixer_forward_runs(const layer_ctx_t *c, const layer_w_t *w, void *out, const void *x, int n_runs,
                             const step_run_t *runs) {
    int rc;
    switch (w->kind) {
    case LAYER_ATTN: rc = attn_forward_runs(c, &w->attn, out, x, n_runs, runs); break;
    case LAYER_MLA: rc = mla_forward_runs(c, &w->mla, out, x, n_runs, runs); break;
    case LAYER_GDN: rc = gdn_forward_runs(c, &w->gdn, out, x, n_runs, runs); break;
    case LAYER_M2: rc = m2_forward_runs(c, &w->m2, out, x, n_runs, runs); break;
    default: rc = err_set(ERR_UNSUP, "unknown layer kind %d", (int)w->kind);
    }
    if (rc < 0) return err_wrap(rc, "layer %d (%s): ", c->layer, layer_kind_name(w->kind));
    return 0;
}

int model_mixer_step_norms_input(const layer_ctx_t *c, const layer_w_t *w, int N) {
    switch (w->kind) {
    case LAYER_ATTN: return attn_step_norms_input(c, &w->attn, N);
    case LAYER_MLA: return mla_step_norms_input(c, &w->mla);
    case LAYER_GDN: return gdn_step_norms_input(c, &w->gdn);
    default: return 0; // Mamba-2: its input normed
    }
}

int model_mixer_step(const layer_ctx_t *c, const layer_w_t *w, const lin_out_t *out, const void *x, const void *xw,
                     int n_runs, const step_run_t *runs) {
    int rc;
    if (xw && w->kind == LAYER_M2)
        return err_set(ERR_UNSUP, "layer %d (%s): its step takes normed input only", c->layer,
                       layer_kind_name(w->kind));
    switch (w->kind) {
    case LAYER_ATTN: rc = attn_step(c, &w->attn, out, x, xw, n_runs, runs); break;
    case LAYER_MLA: rc = mla_step(c, &w->mla, out, x, xw, n_runs, runs); break;
    case LAYER_GDN: rc = gdn_step(c, &w->gdn, out, x, xw, n_runs, runs); break;
    case LAYER_M2: rc = m2_step(c, &w->m2, out, x, n_runs, runs); break;
    default: rc = err_set(ERR_UNSUP, "unknown layer kind %d", (int)w->kind);
    }
    if (rc < 0) return err_wrap(rc, "layer %d (%s): ", c->layer, layer_kind_name(w->kind));
    return 0;
}

// Runs every layer over x [B*T, d] (the residual stream, updated in place).
// With states: a decode step when T == 1 (one token for each sequence of the
// n_st states, B = their total, each at its own length: the layers' X_step
// over one run per state), else T tokens per sequence at sts[0]->len (n_st
// is 1). With run_len: a batched prefill, B = 1, T the total, state k's
// run_len[k] tokens packed after those of the states before it, the mixers
// over them as runs (model_mixer_forward_runs); its last n_one states
// (run_len 1 each: decode tokens riding in the prefill) instead step
// together, one X_step over their rows, with the step's positions and cache
// bases prepared (r->step_pos, r->step_cache).
// rec (may be NULL) records each layer's input and mixer output.
static int run_layers(model_run_t *r, void *x, int B, int T, model_state_t *const *sts, int n_st, const int *run_len,
                      int n_one, const model_record_t *rec) {
    const model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = (int64_t)B * T;
    int step = n_st > 0 && T == 1 && !run_len, pos0 = n_st ? sts[0]->len : 0;
    assert(step || run_len || n_st <= 1);
    assert(!n_one || (run_len && n_one <= n_st && r->step_pos));
    if (step) TRY(runs_room(r, n_st));
    if (run_len) TRY(runs_room(r, n_st));
    // xn: the normed input of the next sub-layer; the residual adds are fused
    // with the norm that follows them. A decode step of a few rows fuses them
    // with the output projections before them too (layer.h lin_out_t: a step
    // is launch-bound on a GPU), unless the mixer outputs are recorded; and
    // where the next sub-layer's first product can norm its input rows itself
    // (attention's fused q/k/v, MLA's and GDN's joint input products, the
    // MLP's gate and up), the add goes alone and that product takes x with
    // the norm's gain, `pend` (no launch, and no pass over the rows, to norm
    // them).
    int fused = step && N <= BE_FEW_ROWS && !rec;
    void *xn = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
    void *y = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
    if (!xn || !y) return ERR_NOMEM;
    const void *pend = NULL;
    if (a->n_layers) {
        layer_ctx_t c0 = model_layer_ctx(r, 0);
        if (fused && model_mixer_step_norms_input(&c0, &m->lw[0], (int)N))
            pend = m->lw[0].norm1;
        else
            be->rmsnorm_fwd(be, xn, NULL, x, m->lw[0].norm1, N, a->d, a->eps);
    }
    for (int l = 0; l < a->n_layers; l++) {
        // cs: the riding rows' mixer's context, the only one with the
        // prepared step; the chunks' mixers, the norms and the MLP (over
        // every row) run as a prefill's
        layer_ctx_t c = model_layer_ctx(r, l), cs = c;
        if (n_one) c.step_pos = NULL, c.step_cache = NULL, c.step_pages = (be_pages_t){NULL, 0};
        const layer_w_t *w = &m->lw[l];
        size_t mark = arena_mark(&r->arena);
        if (rec && rec->x) be->copy_d2d(be, rec->x[l], x, (size_t)N * a->d * be->act_size);
        if (step) {
            for (int k = 0; k < n_st; k++)
                r->runs[k] = (step_run_t){&sts[k]->layers[l], 0, sts[k]->B, 1, sts[k]->len};
            // the MLP norms its input itself (pend) or takes xn
            const int mlp_norms = fused && mlp_step_norms_input(&c, &w->mlp);
            lin_out_t o = !fused      ? (lin_out_t){y, NULL, NULL, NULL}
                          : mlp_norms ? (lin_out_t){NULL, x, NULL, NULL}
                                      : (lin_out_t){NULL, x, xn, w->norm2};
            TRY(model_mixer_step(&c, w, &o, pend ? x : xn, pend, n_st, r->runs));
            pend = mlp_norms ? w->norm2 : NULL;
        } else if (run_len) {
            int row = 0, n_multi = n_st - n_one;
            for (int k = 0; k < n_multi; row += run_len[k++])
                r->runs[k] = (step_run_t){&sts[k]->layers[l], 0, 1, run_len[k], sts[k]->len};
            if (n_multi) TRY(model_mixer_forward_runs(&c, w, y, xn, n_multi, r->runs));
            arena_reset(&r->arena, mark); // y and xn were allocated before the mark
            // the riding decode rows, after the chunks: one step of them all
            if (n_one) {
                for (int k = 0; k < n_one; k++)
                    r->runs[k] = (step_run_t){&sts[n_st - n_one + k]->layers[l], 0, 1, 1, sts[n_st - n_one + k]->len};
                lin_out_t o = {act_at(be, y, (int64_t)row * a->d), NULL, NULL, NULL};
                TRY(model_mixer_step(&cs, w, &o, act_at(be, xn, (int64_t)row * a->d), NULL, n_one, r->runs));
            }
        } else {
            TRY(model_mixer_forward(&c, w, y, xn, B, T, pos0, n_st ? &sts[0]->layers[l] : NULL, NULL));
        }
        if (rec && rec->a) be->copy_d2d(be, rec->a[l], y, (size_t)N * a->d * be->act_size);
        arena_reset(&r->arena, mark); // the mixer's temporaries: only y is used from here
        // fused: the mixer left x up to date, and xn unless the MLP norms x
        // itself; the MLP does likewise for the next mixer
        if (fused) {
            // the next mixer norms its input itself (pend) or takes xn
            const void *next = l + 1 < a->n_layers ? m->lw[l + 1].norm1 : NULL;
            layer_ctx_t cn = next ? model_layer_ctx(r, l + 1) : c;
            const int next_norms = next && model_mixer_step_norms_input(&cn, &m->lw[l + 1], (int)N);
            lin_out_t o = {NULL, x, next_norms ? NULL : xn, next_norms ? NULL : next};
            TRY(mlp_step(&c, &w->mlp, &o, pend ? x : xn, pend, N));
            pend = next_norms ? next : NULL;
            arena_reset(&r->arena, mark);
            continue;
        }
        be->add_rmsnorm_fwd(be, xn, NULL, x, y, w->norm2, N, a->d, a->eps);
        TRY(mlp_forward(&c, &w->mlp, y, xn, N, NULL));
        if (l + 1 < a->n_layers)
            be->add_rmsnorm_fwd(be, xn, NULL, x, y, m->lw[l + 1].norm1, N, a->d, a->eps);
        else
            be->add(be, x, y, N * a->d);
        arena_reset(&r->arena, mark);
    }
    if (rec && rec->x) be->copy_d2d(be, rec->x[a->n_layers], x, (size_t)N * a->d * be->act_size);
    return 0;
}

// The final norm and the head over n consecutive rows: lg [n, V] (act), hn
// [n, d] the normed rows.
static void head_rows(model_run_t *r, const void *rows, int64_t n, void *hn, void *lg) {
    model_t *m = r->m;
    const arch_t *a = &m->a;
    layer_ctx_t c = model_layer_ctx(r, 0); // the head's product may be a quantised one
    m->be->rmsnorm_fwd(m->be, hn, NULL, rows, m->final_norm, n, a->d, a->eps);
    lin_fwd(&c, lg, hn, m->lm_head, n, a->d, a->V);
}

// The final norm and the head over rows first + i * stride of x, or rows
// idx[i] when idx is not NULL (i < n_rows), into host logits [n_rows, V].
static int head_logits(model_run_t *r, const void *x, int64_t first, int64_t stride, const int64_t *idx, int64_t n_rows,
                       float *logits) {
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    // Normalise and project the wanted rows, in slices to bound memory.
    // Consecutive rows (decode steps, every position) are read in place; others
    // are gathered: by one strided copy (each sequence's last token of a
    // prefill), or row by row (the chunks' last tokens of a batched prefill).
    int64_t slice = 64;
    int gather = idx || stride != 1;
    void *h = gather ? arena_alloc(&r->arena, (size_t)slice * a->d * be->act_size) : NULL;
    void *hn = arena_alloc(&r->arena, (size_t)slice * a->d * be->act_size);
    void *lg = arena_alloc(&r->arena, (size_t)slice * a->V * be->act_size);
    if ((gather && !h) || !hn || !lg) return ERR_NOMEM;
    for (int64_t r0 = 0; r0 < n_rows; r0 += slice) {
        int64_t n = n_rows - r0 < slice ? n_rows - r0 : slice;
        const void *rows = act_at(be, x, (first + r0 * stride) * a->d);
        if (idx) {
            for (int64_t i = 0; i < n; i++)
                TRY(be->copy_d2d(be, act_at(be, h, i * a->d), act_at(be, x, idx[r0 + i] * a->d),
                                 (size_t)a->d * be->act_size));
            rows = h;
        } else if (stride != 1) {
            be->copy2d(be, h, a->d, rows, stride * a->d, n, a->d, 0);
            rows = h;
        }
        head_rows(r, rows, n, hn, lg);
        TRY(be->download_act(be, logits + r0 * a->V, lg, n * a->V));
    }
    return be->sync(be);
}

static int step_forward(model_run_t *r, const int32_t *ids, model_state_t *const *sts, int n_st, int64_t N,
                        float *logits, int greedy);

// The RoPE positions a prefill of T tokens into st readies: twice what it
// feeds, or the state's context limit when that is less. Tables grown only to
// what each forward feeds were rebuilt on the host inside the first decode
// step after a prompt of a power of two tokens (bench/bench_rope.c times a
// rebuild; docs/SERVING.md, run 23).
static int prefill_positions(const model_state_t *st, int T) {
    int64_t fed = (int64_t)st->len + T, want = 2 * fed;
    if (want > st->ctx) want = st->ctx;
    if (want < fed) want = fed;
    return want > INT_MAX ? INT_MAX : (int)want;
}

// Embeds ids (host [N]), runs the layers (run_layers: T tokens of each of
// the B sequences of state st at st->len, or no state), final norm, and
// returns into host `logits` [n_rows, V] the logits of rows first + i * stride,
// i < n_rows (one token per sequence: a decode step, step_forward).
static int forward_logits(model_run_t *r, const int32_t *ids, int B, int T, model_state_t *st, int64_t first,
                          int64_t stride, int64_t n_rows, float *logits) {
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = (int64_t)B * T;
    if (st && T == 1) return step_forward(r, ids, &st, 1, N, logits, 0); // one token per sequence: a decode step
    TRY(model_ensure_positions(m, st ? prefill_positions(st, T) : T));
    arena_reset(&r->arena, 0);
    int32_t *d_ids = arena_alloc(&r->arena, (size_t)N * sizeof(int32_t));
    void *x = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
    if (!d_ids || !x) return ERR_NOMEM;
    TRY(model_embed(m, ids, N, d_ids, x));
    TRY(model_prepare_positions(r, B, T, st ? st->len : 0));
    TRY(run_layers(r, x, B, T, st ? &st : NULL, st ? 1 : 0, NULL, 0, NULL));
    if (!logits) return be->sync(be);
    return head_logits(r, x, first, stride, NULL, n_rows, logits);
}

// Calls other than the greedy ones wait until no greedy step is in flight.
static int run_idle(const model_run_t *r) {
    if (r->greedy_queued == r->greedy_taken) return 0;
    return err_set(ERR_INPUT, "%llu greedy decode steps are still in flight (model_greedy_take / drain first)",
                   (unsigned long long)(r->greedy_queued - r->greedy_taken));
}

int model_hidden(model_run_t *r, const int32_t *ids, int B, int T, void *h, const model_record_t *rec) {
    TRY(run_idle(r));
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = (int64_t)B * T;
    TRY(model_ensure_positions(m, T));
    size_t mark = arena_mark(&r->arena);
    int32_t *d_ids = arena_alloc(&r->arena, (size_t)N * sizeof(int32_t));
    void *x = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
    if (!d_ids || !x) return ERR_NOMEM;
    TRY(model_embed(m, ids, N, d_ids, x));
    TRY(model_prepare_positions(r, B, T, 0));
    TRY(run_layers(r, x, B, T, NULL, 0, NULL, 0, rec));
    be->rmsnorm_fwd(be, h, NULL, x, m->final_norm, N, a->d, a->eps);
    arena_reset(&r->arena, mark);
    return 0;
}

int model_prefill(model_run_t *r, model_state_t *st, const int32_t *ids, int T, int chunk, float *logits) {
    TRY(run_idle(r));
    int B = st->B;
    if (T < 0 || (int64_t)st->len + T > st->ctx)
        return err_set(ERR_INPUT, "prompt of %d tokens after %d cached exceeds the context capacity %d", T, st->len,
                       st->ctx);
    TRY(model_state_reserve(r->m, st, st->len + T));
    if (chunk <= 0) chunk = T;
    int32_t *part = malloc((size_t)B * chunk * sizeof(int32_t));
    if (!part) return err_set(ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int t0 = 0; t0 < T && rc == 0; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int b = 0; b < B; b++)
            memcpy(part + (size_t)b * n, ids + (size_t)b * T + t0, (size_t)n * sizeof(int32_t));
        int last = t0 + n == T;
        // each sequence's last token: rows n - 1, 2n - 1, ...
        rc = forward_logits(r, part, B, n, st, n - 1, n, B, last ? logits : NULL);
        if (rc == 0) set_len(r->m, st, st->len + n);
    }
    free(part);
    return rc;
}

// A batched prefill's positions: state k's n[k] rows at sts[k]->len + t,
// k < n_st, N rows in all (r->run_pos, for its mixers' runs); then, in the same
// upload, the step positions (r->step_pos: positions, then visible lengths)
// of the n_one states sts[n_st..n_st + n_one) that step one token each.
static int prepare_run_positions(model_run_t *r, model_state_t *const *sts, int n_st, const int *n, int64_t N,
                                 int n_one) {
    be_t *be = r->m->be;
    int64_t all = N + 2 * (int64_t)n_one;
    TRY(pos_room(r, all));
    int32_t *h = r->pos_host;
    for (int k = 0, row = 0; k < n_st; k++)
        for (int t = 0; t < n[k]; t++)
            h[row++] = sts[k]->len + t;
    for (int k = 0; k < n_one; k++)
        h[N + k] = sts[n_st + k]->len, h[N + n_one + k] = sts[n_st + k]->len + 1;
    // a failed upload leaves nothing prepared
    r->pos.d = NULL, r->step_pos = NULL, r->step_cache = NULL, r->run_pos = NULL;
    TRY(be->copy_h2d(be, r->pos_buf, h, (size_t)all * sizeof(int32_t)));
    if (N) r->run_pos = r->pos_buf;
    if (n_one) r->step_pos = r->pos_buf + N;
    return 0;
}

// A batched prefill whose chunks are all one token: a decode step of the
// states (step_forward, as model_step_batch runs it), the wanted rows'
// logits kept, in order.
static int prefill_one_each(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *const *ids,
                            const uint8_t *want, int n_want, float *logits) {
    int64_t V = r->m->a.V;
    int some = logits && n_want > 0 && n_want < n_st; // only some rows' logits: all of them into a buffer first
    int32_t *h = malloc((size_t)n_st * sizeof(int32_t));
    float *all = some ? malloc((size_t)n_st * V * sizeof(float)) : NULL;
    if (!h || (some && !all)) {
        free(h), free(all);
        return err_set(ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n_st; k++)
        h[k] = ids[k][0];
    int rc = step_forward(r, h, sts, n_st, n_st, some ? all : n_want ? logits : NULL, 0);
    for (int k = 0, j = 0; rc == 0 && some && k < n_st; k++)
        if (want[k]) memcpy(logits + V * j++, all + V * k, (size_t)V * sizeof(float));
    if (rc == 0)
        for (int k = 0; k < n_st; k++)
            set_len(r->m, sts[k], sts[k]->len + 1);
    free(h), free(all);
    return rc;
}

int model_prefill_batch(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *const *ids, const int *n,
                        const uint8_t *want, float *logits) {
    TRY(run_idle(r));
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    int64_t N = 0;
    int end = 0, n_want = 0, n_one = 0;
    if (n_st < 1) return err_set(ERR_INPUT, "a batched prefill of %d states", n_st);
    for (int k = 0; k < n_st; k++) {
        const model_state_t *st = sts[k];
        if (st->B != 1)
            return err_set(ERR_INPUT, "batched prefill: state %d holds %d sequences (expected 1)", k, st->B);
        if (n[k] < 1 || (int64_t)st->len + n[k] > st->ctx)
            return err_set(ERR_INPUT, "batched prefill: state %d: %d tokens after %d cached (context capacity %d)", k,
                           n[k], st->len, st->ctx);
        N += n[k];
        const int want_pos = prefill_positions(st, n[k]);
        if (want_pos > end) end = want_pos;
        n_want += !want || want[k];
        n_one += n[k] == 1;
    }
    if (N > (1 << 24)) return err_set(ERR_INPUT, "batched prefill of %lld tokens", (long long)N);
    for (int k = 0; k < n_st; k++)
        TRY(model_state_reserve(m, sts[k], sts[k]->len + n[k]));
    TRY(model_ensure_positions(m, end));
    if (!logits) n_want = 0;
    if (n_one == n_st) return prefill_one_each(r, sts, n_st, ids, want, n_want, logits);
    // The forward's order: the chunks of several tokens in the caller's
    // order, then the one-token ones (decode tokens, or the last token of a
    // prompt restored from a prefix cache), which step together (run_layers);
    // last[] lists the wanted rows in the caller's order. Without one-token
    // chunks this is the caller's order. A one-token state at length 0 (a
    // one-token prompt) steps too, as model_prefill runs it: the step zeroes
    // its Mamba-2 states as a forward does (m2.c), its GDN states and windows
    // are zero since allocation or reset either way, and only a recorded step
    // must not start a state (step_forward), which this forward never is.
    arena_reset(&r->arena, 0);
    int32_t *h_ids = malloc((size_t)N * sizeof(int32_t));
    int64_t *last = malloc((size_t)n_st * sizeof(int64_t));
    model_state_t **ord = malloc((size_t)n_st * sizeof *ord);
    int *ord_n = malloc((size_t)n_st * sizeof(int));
    int32_t *d_ids = arena_alloc(&r->arena, (size_t)N * sizeof(int32_t));
    void *x = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
    int rc = 0, n_multi = n_st - n_one;
    if (!h_ids || !last || !ord || !ord_n)
        rc = err_set(ERR_NOMEM, "out of memory");
    else if (!d_ids || !x)
        rc = ERR_NOMEM;
    int64_t row[2] = {0, N - n_one}; // the next row of the chunks of several tokens, of the one-token ones
    int slot[2] = {0, n_multi};
    for (int k = 0, j = 0; k < n_st && rc == 0; k++) {
        int one = n[k] == 1;
        memcpy(h_ids + row[one], ids[k], (size_t)n[k] * sizeof(int32_t));
        ord[slot[one]] = sts[k], ord_n[slot[one]++] = n[k];
        row[one] += n[k];
        if (!want || want[k]) last[j++] = row[one] - 1;
    }
    if (rc == 0) rc = model_embed(m, h_ids, N, d_ids, x);
    if (rc == 0) rc = prepare_run_positions(r, ord, n_multi, ord_n, N - n_one, n_one);
    if (rc == 0 && n_one) rc = prepare_step_caches(r, ord + n_multi, n_one);
    if (rc == 0) rc = run_layers(r, x, 1, (int)N, ord, n_st, ord_n, n_one, NULL);
    if (rc == 0) rc = n_want ? head_logits(r, x, 0, 1, last, n_want, logits) : be->sync(be);
    if (rc == 0)
        for (int k = 0; k < n_st; k++)
            set_len(m, sts[k], sts[k]->len + n[k]);
    // the riding rows' step is no step of the run's, nor are its positions any
    // other forward's: nothing of them stays prepared
    r->step_pos = NULL, r->step_cache = NULL, r->step_pages = (be_pages_t){NULL, 0}, r->run_pos = NULL;
    free(h_ids), free(last), free(ord), free(ord_n);
    return rc;
}

// ---- decode steps -------------------------------------------------------------
//
// A step uploads its inputs (ids, positions, cache bases) into buffers that
// keep their addresses from step to step, then computes on the device
// (step_body). On a backend with recorded op sequences (CUDA graphs) the body
// is recorded once and replayed while nothing its launches were given has
// changed: the step key lists all of it (rows, states, their capacities and
// cache buffers, the run's buffers, the RoPE tables); the kernels read the
// per-step values (positions, lengths, cache rows) from device memory.
// Attention and MLA bound their work by the lengths' power-of-two buckets
// (step_max_ctx), so the launches stay the same while lengths grow within
// one, and a step is recorded again once per bucket.

// Everything a step's launches depend on, as values, into r->key_new.
static int step_key(model_run_t *r, model_state_t *const *sts, int n_st, int64_t N, int greedy) {
    const model_t *m = r->m;
    int64_t need = 19 + (int64_t)n_st * (5 + 2 * (int64_t)m->a.n_layers), n = 0;
    step_key_t *kn = &r->key_new;
    if (need > kn->room) {
        uint64_t *p = realloc(kn->v, (size_t)need * sizeof *p);
        if (!p) return err_set(ERR_NOMEM, "out of memory");
        kn->v = p, kn->room = need;
    }
    uint64_t *k = kn->v;
    k[n++] = (uint64_t)N, k[n++] = (uint64_t)n_st, k[n++] = (uintptr_t)r->arena.base;
    k[n++] = (uintptr_t)m->be->scratch.base, k[n++] = (uintptr_t)r->pos_buf, k[n++] = (uintptr_t)r->cache_buf;
    k[n++] = (uintptr_t)r->step_pages.pages, k[n++] = (uint64_t)r->step_pages.stride;
    k[n++] = (uintptr_t)m->rope_cos, k[n++] = (uintptr_t)m->rope_sin, k[n++] = (uintptr_t)m->mla_cos;
    k[n++] = (uintptr_t)m->mla_sin;
    k[n++] = greedy ? (uintptr_t)r->greedy_ids : 0; // a greedy step's ids, and its argmax after the head
    // the bound attention and MLA size their work by (layer.h step_max_ctx:
    // every growing layer of a state has its ctx and cap, so its bucket)
    int bucket = 0;
    for (int s = 0; s < n_st; s++) {
        const int b = step_ctx_bucket(sts[s]->len, sts[s]->ctx, sts[s]->cap);
        if (b > bucket) bucket = b;
    }
    k[n++] = (uint64_t)bucket;
    for (int s = 0; s < n_st; s++) {
        model_state_t *st = sts[s];
        k[n++] = (uint64_t)st->B, k[n++] = (uint64_t)st->ctx;
        if (st->pool) {
            // A paged state: its rows, recurrent states and windows reach the
            // step's ops through the per-step pointer arrays and page tables
            // (step_cache_bases, step_page_tables: device memory), and its
            // attention and MLA rows lie in the pool (MLA decode's tensor map):
            // the launches take the pool, never the state, so a batch of other
            // paged states of the same shape replays the same recording.
            k[n++] = (uintptr_t)st->pool;
            continue;
        }
        // a contiguous state's buffers and room are launch arguments
        k[n++] = (uintptr_t)st, k[n++] = (uint64_t)st->cap;
        k[n++] = (uintptr_t)st->fixed;
        for (int l = 0; l < m->a.n_layers; l++) {
            int64_t w[4];
            void **slot[2] = {NULL, NULL};
            int parts = grow_parts(m, st, l, w, slot);
            for (int i = 0; i < 2; i++)
                k[n++] = i < parts ? (uintptr_t)*slot[i] : 0;
        }
    }
    kn->n = n;
    return 0;
}

static int key_equal(const step_key_t *a, const step_key_t *b) {
    return a->n == b->n && (a->n == 0 || !memcmp(a->v, b->v, (size_t)a->n * sizeof(uint64_t)));
}

static void key_swap(step_key_t *a, step_key_t *b) {
    step_key_t t = *a;
    *a = *b, *b = t;
}

// A step's ids (host) checked and queued for d_ids from the run's page-locked
// staging (the step's other inputs likewise): no round trip to the device.
static int upload_step_ids(model_run_t *r, const int32_t *ids, int64_t N, int32_t *d_ids) {
    const model_t *m = r->m;
    TRY(check_ids(m, ids, N));
    if (N > r->ids_cap) {
        int32_t *h = m->be->host_alloc(m->be, (size_t)N * sizeof(int32_t));
        if (!h) return ERR_NOMEM;
        m->be->host_free(m->be, r->ids_host);
        r->ids_host = h, r->ids_cap = N;
    }
    memcpy(r->ids_host, ids, (size_t)N * sizeof(int32_t));
    return m->be->copy_h2d_async(m->be, d_ids, r->ids_host, (size_t)N * sizeof(int32_t));
}

// The step's inputs queued for the device (copy_h2d_async from the run's
// page-locked staging, which nothing writes again before the step's closing
// sync): ids into *d_ids, the rows' positions and visible lengths
// (r->step_pos), every layer's cache bases (r->step_cache); *x the residual
// stream's rows. Nothing here may be recorded. On an error, the copies
// already queued are waited for, so that the staging may be written again.
static int step_inputs(model_run_t *r, const int32_t *ids, model_state_t *const *sts, int n_st, int64_t N,
                       int32_t *fixed_ids, int32_t **d_ids, void **x) {
    model_t *m = r->m;
    int end = 0; // the positions' limit (prefill sized the tables ahead: prefill_positions)
    for (int k = 0; k < n_st; k++)
        if (sts[k]->len + 1 > end) end = sts[k]->len + 1;
    TRY(model_ensure_positions(m, end));
    arena_reset(&r->arena, 0);
    *d_ids = fixed_ids ? fixed_ids : arena_alloc(&r->arena, (size_t)N * sizeof(int32_t));
    *x = arena_alloc(&r->arena, (size_t)N * m->a.d * m->be->act_size);
    if (!*d_ids || !*x) return ERR_NOMEM;
    int rc = ids ? upload_step_ids(r, ids, N, *d_ids) : 0;
    if (rc == 0) rc = prepare_step_positions(r, sts, n_st, (int)N);
    if (rc == 0) rc = prepare_step_caches(r, sts, n_st);
    if (rc < 0) (void)m->be->sync(m->be);
    return rc;
}

// What a step computes on the device with its inputs in place: the embedding
// and every layer, x then the last hidden rows; with lg (a recording or a
// greedy step, at most MODEL_STEP_GRAPH_ROWS rows) also the head. A few rows
// and a head not quantised take the final norm inside the head's product
// (proj_rmsnorm), and a greedy step of them only the argmax of its logits
// (proj_rmsnorm_argmax: *lg NULL); else *lg [N, V] (act, in the arena) are
// the logits, and a greedy step takes their argmax (argmax_rows). A greedy
// step's ids go to r->greedy_ids and the host ring.
static int step_body(model_run_t *r, const int32_t *d_ids, void *x, int64_t N, model_state_t *const *sts, int n_st,
                     void **lg, int greedy) {
    model_t *m = r->m;
    be_t *be = m->be;
    const arch_t *a = &m->a;
    embed_rows(m, d_ids, N, x);
    TRY(run_layers(r, x, (int)N, 1, sts, n_st, NULL, 0, NULL));
    if (!lg) return 0;
    layer_ctx_t c = model_layer_ctx(r, 0);
    const int fused = N <= BE_FEW_ROWS && !lin_qmat(&c, m->lm_head);
    int32_t *turn = greedy ? r->greedy_ids + MODEL_STEP_GRAPH_ROWS : NULL; // (greedy_ids NULL until a greedy step)
    *lg = NULL;
    if (greedy && fused) {
        be->proj_rmsnorm_argmax(be, r->greedy_ids, r->greedy_host, MODEL_STEP_GRAPH_ROWS, turn, x, a->d, m->final_norm,
                                a->eps, m->lm_head, N, a->d, a->V);
        return 0;
    }
    *lg = arena_alloc(&r->arena, (size_t)N * a->V * be->act_size);
    if (!*lg) return ERR_NOMEM;
    if (fused) {
        be->proj_rmsnorm(be, *lg, x, a->d, m->final_norm, a->eps, m->lm_head, N, a->d, a->V);
    } else {
        void *hn = arena_alloc(&r->arena, (size_t)N * a->d * be->act_size);
        if (!hn) return ERR_NOMEM;
        head_rows(r, x, N, hn, *lg);
    }
    if (greedy) be->argmax_rows(be, r->greedy_ids, r->greedy_host, MODEL_STEP_GRAPH_ROWS, turn, *lg, a->V, N, a->V);
    return 0;
}

// One decode step of the N rows of sts: into host logits [N, V] (NULL: none)
// and waited for; or, greedy, fed r->greedy_ids (ids NULL: as the step
// before left them) with its argmax there and copied into the host slot of
// step number r->greedy_queued, queued without waiting (model_greedy_queue).
// Recorded and replayed where the backend can (see above), else run op by op
// (logits: the head in slices, head_logits).
static int step_forward(model_run_t *r, const int32_t *ids, model_state_t *const *sts, int n_st, int64_t N,
                        float *logits, int greedy) {
    be_t *be = r->m->be;
    int32_t *d_ids;
    void *x, *lg = NULL;
    TRY(step_inputs(r, ids, sts, n_st, N, greedy ? r->greedy_ids : NULL, &d_ids, &x));
    if (greedy) TRY(be->fence_mark(be, r->greedy_inputs)); // its staging may be written again after this
    // A state starting at length 0 has its Mamba-2 states zeroed by the step
    // (m2.c): a launch only that step has, so such a step is never recorded.
    int fresh = 0;
    for (int k = 0; k < n_st; k++)
        fresh |= sts[k]->len == 0;
    int graph = be->graph_begin && !r->graph_off && N <= MODEL_STEP_GRAPH_ROWS && !fresh;
    int recorded = 0;
    model_step_graph_t *g = NULL; // the recording this step replays
    if (graph) {
        TRY(step_key(r, sts, n_st, N, greedy));
        for (int i = 0; i < MODEL_STEP_GRAPHS && !g; i++)
            if (r->graphs[i].graph && key_equal(&r->key_new, &r->graphs[i].key)) g = &r->graphs[i];
        // a key seen only once (a batch that changes every step) runs op by
        // op: recording costs more than one step
        if (!g && !(graph = key_equal(&r->key_new, &r->key_seen))) key_swap(&r->key_new, &r->key_seen);
        if (graph && !g) {
            // into an empty slot, else over the least recently used replay
            // (updated in place where its ops form the same graph)
            g = &r->graphs[0];
            for (int i = 1; i < MODEL_STEP_GRAPHS && g->graph; i++)
                if (!r->graphs[i].graph || r->graphs[i].used < g->used) g = &r->graphs[i];
            size_t mark = arena_mark(&r->arena);
            int rc_begin = be->graph_begin(be), rc = 0, rc_end = 0;
            if (rc_begin == 0) {
                rc = step_body(r, d_ids, x, N, sts, n_st, &lg, greedy);
                rc_end = be->graph_end(be, &g->graph);
            }
            if (rc_begin < 0 || rc < 0 || rc_end < 0) {
                // no recording possible: op by op from now on, said once; an
                // op's own error: this step op by op, which reports it
                if (rc_begin < 0 || rc == 0) {
                    log_warn("decode steps run op by op, without a recorded graph: %s", err_msg());
                    r->graph_off = 1;
                }
                be->graph_free(be, g->graph);
                g->graph = NULL, g->key.n = 0, g = NULL, graph = 0;
                arena_reset(&r->arena, mark);
            } else {
                key_swap(&g->key, &r->key_new); // the new key is the recorded one
                g->lg = lg;
                recorded = 1;
            }
        }
        if (graph) {
            lg = g->lg;
            g->used = ++r->graph_clock;
            if (recorded)
                r->steps_recorded++;
            else
                r->steps_replayed++;
            TRY(be->graph_launch(be, g->graph));
        }
    }
    if (!graph) {
        r->steps_op_by_op++;
        if (greedy) {
            TRY(step_body(r, d_ids, x, N, sts, n_st, &lg, 1));
        } else {
            TRY(step_body(r, d_ids, x, N, sts, n_st, NULL, 0));
            return logits ? head_logits(r, x, 0, 1, NULL, N, logits) : be->sync(be);
        }
    }
    // the ids are in the host ring once the step is done (argmax_rows)
    if (greedy) return be->fence_mark(be, r->greedy_done[r->greedy_queued % MODEL_GREEDY_AHEAD]);
    if (logits) TRY(be->download_act(be, logits, lg, N * r->m->a.V));
    return be->sync(be);
}

// The decode step's checks and room, shared by model_step_batch and
// model_greedy_queue: *N the rows.
static int step_prepare(model_run_t *r, model_state_t *const *sts, int n_st, int64_t *N) {
    *N = 0;
    for (int k = 0; k < n_st; k++) {
        model_state_t *st = sts[k];
        if (st->len + 1 > st->ctx) return err_set(ERR_INPUT, "context capacity %d reached", st->ctx);
        TRY(model_state_reserve(r->m, st, st->len + 1));
        *N += st->B;
    }
    if (*N < 1 || *N > (1 << 20)) return err_set(ERR_INPUT, "a decode step of %lld sequences", (long long)*N);
    return 0;
}

int model_step(model_run_t *r, model_state_t *st, const int32_t *ids, float *logits) {
    return model_step_batch(r, &st, 1, ids, logits);
}

int model_step_batch(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *ids, float *logits) {
    int64_t N;
    TRY(run_idle(r));
    TRY(step_prepare(r, sts, n_st, &N));
    TRY(step_forward(r, ids, sts, n_st, N, logits, 0));
    for (int k = 0; k < n_st; k++)
        set_len(r->m, sts[k], sts[k]->len + 1);
    return 0;
}

// The device ids and argmax_rows's turn after them (zeroed: the ring's first
// array for step number 0), their host ring and the fences, made on the
// first greedy step.
static int greedy_buffers(model_run_t *r) {
    be_t *be = r->m->be;
    if (r->greedy_ids) return 0;
    r->greedy_host = be->host_alloc(be, (size_t)MODEL_GREEDY_AHEAD * MODEL_STEP_GRAPH_ROWS * sizeof(int32_t));
    r->greedy_ids = be->alloc(be, (size_t)(MODEL_STEP_GRAPH_ROWS + 1) * sizeof(int32_t));
    int ok = r->greedy_host && r->greedy_ids &&
             be->memset0(be, r->greedy_ids, (size_t)(MODEL_STEP_GRAPH_ROWS + 1) * sizeof(int32_t)) == 0 &&
             (r->greedy_inputs = be->fence_new(be));
    for (int i = 0; ok && i < MODEL_GREEDY_AHEAD; i++)
        ok = (r->greedy_done[i] = be->fence_new(be)) != NULL;
    if (ok) return 0;
    be->free(be, r->greedy_ids); // (the rest is freed with the run)
    r->greedy_ids = NULL;
    return err_wrap(ERR_NOMEM, "greedy decoding's buffers: ");
}

int model_greedy_queue(model_run_t *r, model_state_t *const *sts, int n_st, const int32_t *ids) {
    be_t *be = r->m->be;
    const uint64_t flight = r->greedy_queued - r->greedy_taken;
    if (flight >= MODEL_GREEDY_AHEAD)
        return err_set(ERR_INPUT, "%d greedy decode steps are in flight already (model_greedy_take first)",
                       MODEL_GREEDY_AHEAD);
    int64_t N;
    TRY(step_prepare(r, sts, n_st, &N)); // the room, and the rows
    if (N > MODEL_STEP_GRAPH_ROWS)
        return err_set(ERR_INPUT, "a greedy decode step of %lld rows (1 to %d)", (long long)N, MODEL_STEP_GRAPH_ROWS);
    const int64_t before = r->greedy_queued ? r->greedy_rows[(r->greedy_queued - 1) % MODEL_GREEDY_AHEAD] : 0;
    if (!ids && before != N)
        return err_set(ERR_INPUT, "a greedy decode step of %lld rows fed the ids of a step of %lld", (long long)N,
                       (long long)before);
    TRY(greedy_buffers(r));
    // the step in flight has its inputs copied before the staging is written again
    if (flight) TRY(be->fence_wait(be, r->greedy_inputs));
    TRY(step_forward(r, ids, sts, n_st, N, NULL, 1));
    for (int k = 0; k < n_st; k++)
        set_len(r->m, sts[k], sts[k]->len + 1);
    r->greedy_rows[r->greedy_queued % MODEL_GREEDY_AHEAD] = N;
    r->greedy_queued++;
    return 0;
}

int model_greedy_take(model_run_t *r, int32_t *ids) {
    if (r->greedy_taken == r->greedy_queued) return err_set(ERR_INPUT, "no greedy decode step in flight to take");
    const int slot = (int)(r->greedy_taken % MODEL_GREEDY_AHEAD);
    r->greedy_taken++;
    TRY(r->m->be->fence_wait(r->m->be, r->greedy_done[slot]));
    memcpy(ids, r->greedy_host + slot * MODEL_STEP_GRAPH_ROWS, (size_t)r->greedy_rows[slot] * sizeof(int32_t));
    return 0;
}

// Waits for everything queued; the step count's parity again the ring's turn
// (a step that failed after its argmax ran is not counted as queued).
int model_greedy_drain(model_run_t *r) {
    be_t *be = r->m->be;
    int rc = be->sync(be);
    int32_t turn = 0;
    if (rc == 0 && r->greedy_ids) rc = be->copy_d2h(be, &turn, r->greedy_ids + MODEL_STEP_GRAPH_ROWS, sizeof turn);
    r->greedy_queued = r->greedy_taken = (uint64_t)turn;
    return rc;
}

int model_logits_all(model_run_t *r, const int32_t *ids, int B, int T, float *logits) {
    TRY(run_idle(r));
    return forward_logits(r, ids, B, T, NULL, 0, 1, (int64_t)B * T, logits);
}
