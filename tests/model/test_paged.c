// The paged cache (model.h model_pool_t, model_state_alloc_paged): a paged
// state gives the bits of a contiguous one (memcmp, no tolerance) through
// prefills and decode steps that cross page boundaries, with its pages
// scattered in the pool by another state; pages freed by one state serve the
// next; states that share pages (the prefix cache's model_state_share /
// model_state_restore_pages) copy a shared page before writing into it, so
// that neither sees the other's rows; a pool without free pages says so and
// leaves the state usable.
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/model.h"
#include "testutil.h"

// Every mixer kind: two MLA layers and one attention layer grow, GDN and
// Mamba-2 states are fixed (test_state.c's tiny hybrid).
static arch_t tiny_hybrid(void) {
    const layer_kind_t plan[6] = {LAYER_MLA, LAYER_M2, LAYER_ATTN, LAYER_GDN, LAYER_MLA, LAYER_M2};
    return tu_tiny_arch(plan, 6, 0, 0);
}

typedef struct {
    model_t m;
    model_run_t r;
    int V;
} tiny_t;

static void tiny_open(tiny_t *t) {
    arch_t a = tiny_hybrid();
    assert_int_equal(model_create(&t->m, &a, tu_cpu()), 0);
    assert_int_equal(model_run_create(&t->r, &t->m, 64u << 20), 0);
    float *w = tu_params(&t->m.pt, 11, 0.3f);
    memcpy(t->m.w, w, (size_t)t->m.pt.total * sizeof(float)); // CPU backend: act == float
    free(w);
    t->V = t->m.a.V;
}

static void tiny_close(tiny_t *t) {
    model_run_free(&t->r);
    model_free(&t->m);
}

static void make_ids(int32_t *ids, int n, int V, int salt) {
    for (int i = 0; i < n; i++)
        ids[i] = (i * 7 + salt) % V;
}

// Prefills n tokens in chunks of ch into both states; the last chunk's logits
// must agree bit for bit.
static void prefill_both(tiny_t *t, model_state_t *a, model_state_t *b, const int32_t *ids, int n, int ch, float *la,
                         float *lb) {
    assert_int_equal(model_prefill(&t->r, a, ids, n, ch, la), 0);
    assert_int_equal(model_prefill(&t->r, b, ids, n, ch, lb), 0);
    assert_memory_equal(la, lb, (size_t)t->V * sizeof(float));
}

// A paged state whose pages alternate with another paged state's (so that
// every page boundary is a jump in the pool, and a prefill over the cache
// gathers its keys), prefilled in chunks that end inside pages, then decoded
// past another page boundary: every logit equals a contiguous state's. Then
// both paged states decode together in one step (page tables of two
// sequences), each row equal to its contiguous twin's.
static void test_paged_equals_contiguous(void **state) {
    tiny_t t;
    tiny_open(&t);
    model_pool_t pool;
    assert_int_equal(model_pool_create(&t.m, &pool, 12), 0);
    assert_int_equal(pool.page_bytes, BE_PAGE_ROWS * model_cache_bytes_per_token(&t.m));
    enum { N = 750, CH = 100, D = 20 };
    int32_t ids[N + 2 * D], other[N + 2 * D];
    make_ids(ids, N + 2 * D, t.V, 3);
    make_ids(other, N + 2 * D, t.V, 5);
    size_t vb = (size_t)t.V * sizeof(float);
    float *la = malloc(2 * vb), *lb = malloc(2 * vb);
    model_state_t pa, pb, ca, cb;
    assert_int_equal(model_state_alloc_paged(&t.m, &pa, &pool, 1024), 0);
    assert_int_equal(model_state_alloc_paged(&t.m, &pb, &pool, 1024), 0);
    assert_int_equal(model_state_alloc(&t.m, &ca, 1, 1024), 0);
    assert_int_equal(model_state_alloc(&t.m, &cb, 1, 1024), 0);
    assert_int_equal(pa.cap, 0);
    // chunks of CH: the two paged states take pages in turn
    for (int t0 = 0; t0 < N; t0 += CH) {
        int n = N - t0 < CH ? N - t0 : CH;
        prefill_both(&t, &pa, &ca, ids + t0, n, n, la, lb);
        prefill_both(&t, &pb, &cb, other + t0, n, n, la, lb);
    }
    assert_int_equal(pa.n_pages, 3);
    assert_true(pa.pages[1] != pa.pages[0] + 1 && pa.pages[2] != pa.pages[1] + 1); // scattered
    assert_int_equal(pa.cap, 3 * BE_PAGE_ROWS);
    assert_int_equal(pa.cache_bytes, 3 * (size_t)pool.page_bytes);
    assert_int_equal(pa.bytes, pa.fixed_bytes + pa.cache_bytes);
    assert_int_equal(pool.n_free, 12 - 6);
    // one step at a time, each alone: pa crosses into its fourth page
    for (int i = 0; i < D; i++) {
        assert_int_equal(model_step(&t.r, &pa, &ids[N + i], la), 0);
        assert_int_equal(model_step(&t.r, &ca, &ids[N + i], lb), 0);
        assert_memory_equal(la, lb, vb);
        assert_int_equal(model_step(&t.r, &pb, &other[N + i], la), 0);
        assert_int_equal(model_step(&t.r, &cb, &other[N + i], lb), 0);
        assert_memory_equal(la, lb, vb);
    }
    assert_int_equal(pa.n_pages, 4);
    // both paged states in one step, against the contiguous ones in one step
    model_state_t *ps[2] = {&pa, &pb}, *cs[2] = {&ca, &cb};
    for (int i = D; i < 2 * D; i++) {
        int32_t two[2] = {ids[N + i], other[N + i]};
        assert_int_equal(model_step_batch(&t.r, ps, 2, two, la), 0);
        assert_int_equal(model_step_batch(&t.r, cs, 2, two, lb), 0);
        assert_memory_equal(la, lb, 2 * vb);
    }
    model_state_free(&t.m, &pa);
    model_state_free(&t.m, &pb);
    assert_int_equal(pool.n_free, 12);
    model_state_free(&t.m, &ca);
    model_state_free(&t.m, &cb);
    model_pool_free(&t.m, &pool);
    free(la), free(lb);
    tiny_close(&t);
}

// Pages given back and taken again: a state freed leaves its pages (and the
// rows it wrote) to the next, which, reading no row past its own length,
// decodes as a fresh contiguous state does.
static void test_pages_reused(void **state) {
    tiny_t t;
    tiny_open(&t);
    model_pool_t pool;
    assert_int_equal(model_pool_create(&t.m, &pool, 3), 0);
    enum { N = 530 };
    int32_t ids[N + 8], other[N];
    make_ids(ids, N + 8, t.V, 9);
    make_ids(other, N, t.V, 1);
    size_t vb = (size_t)t.V * sizeof(float);
    float *la = malloc(vb), *lb = malloc(vb);
    model_state_t p, c;
    assert_int_equal(model_state_alloc_paged(&t.m, &p, &pool, 1024), 0);
    assert_int_equal(model_prefill(&t.r, &p, other, N, 128, la), 0);
    assert_int_equal(pool.n_free, 0);
    int32_t held[3];
    memcpy(held, p.pages, sizeof held);
    model_state_free(&t.m, &p);
    assert_int_equal(pool.n_free, 3);
    assert_int_equal(model_state_alloc_paged(&t.m, &p, &pool, 1024), 0);
    assert_int_equal(model_state_alloc(&t.m, &c, 1, 1024), 0);
    prefill_both(&t, &p, &c, ids, N, 128, la, lb);
    assert_memory_equal(p.pages, held, sizeof held); // the same pages again, lowest first
    for (int i = 0; i < 8; i++) {
        assert_int_equal(model_step(&t.r, &p, &ids[N + i], la), 0);
        assert_int_equal(model_step(&t.r, &c, &ids[N + i], lb), 0);
        assert_memory_equal(la, lb, vb);
    }
    model_state_free(&t.m, &p);
    model_state_free(&t.m, &c);
    model_pool_free(&t.m, &pool);
    free(la), free(lb);
    tiny_close(&t);
}

// Sharing (the prefix cache): an entry's references to a state's pages at
// NT tokens (the last page partial), a second state restored from them at NT
// and a third at PRE < NT (the fixed states taken there), each then going its
// own way, and the original going on too: every one decodes as a contiguous
// state fed the same tokens does, so no state wrote into rows another reads.
// The full first page stays shared; the partial one is copied by each writer.
static void test_share_copy_on_write(void **state) {
    tiny_t t;
    tiny_open(&t);
    be_t *be = t.m.be;
    model_pool_t pool;
    assert_int_equal(model_pool_create(&t.m, &pool, 8), 0);
    enum { NT = 300, PRE = 264, D = 6 };
    int32_t ids[NT + D], alt[NT + D];
    make_ids(ids, NT + D, t.V, 3);
    memcpy(alt, ids, sizeof alt);
    for (int i = PRE; i < NT + D; i++) // another continuation after PRE
        alt[i] = (ids[i] + 1) % t.V;
    size_t vb = (size_t)t.V * sizeof(float);
    float *la = malloc(vb), *lb = malloc(vb);
    int64_t fb = model_snapshot_fixed_bytes(&t.m);
    void *fix_pre = be->alloc(be, (size_t)fb), *fix_nt = be->alloc(be, (size_t)fb);
    model_state_t orig;
    assert_int_equal(model_state_alloc_paged(&t.m, &orig, &pool, 1024), 0);
    assert_int_equal(model_prefill(&t.r, &orig, ids, PRE, 64, NULL), 0);
    assert_int_equal(model_state_snapshot(&t.m, &orig, 0, PRE, NULL, fix_pre), 0);
    assert_int_equal(model_prefill(&t.r, &orig, ids + PRE, NT - PRE, 64, NULL), 0);
    assert_int_equal(model_state_snapshot(&t.m, &orig, 0, NT, NULL, fix_nt), 0);
    int32_t entry[2];
    assert_int_equal(model_state_share(&t.m, &orig, NT, entry), 0);
    assert_int_equal(pool.ref[entry[0]], 2);
    assert_int_equal(pool.ref[entry[1]], 2);
    assert_int_equal(pool.n_free, 6);
    // bad requests
    assert_int_equal(model_state_share(&t.m, &orig, NT + 1, entry), ERR_INPUT);
    model_state_t cont;
    assert_int_equal(model_state_alloc(&t.m, &cont, 1, 1024), 0);
    assert_int_equal(model_state_share(&t.m, &cont, 0, entry), ERR_INPUT);

    model_state_t at_nt, at_pre;
    assert_int_equal(model_state_alloc_paged(&t.m, &at_nt, &pool, 1024), 0);
    assert_int_equal(model_state_alloc_paged(&t.m, &at_pre, &pool, 1024), 0);
    assert_int_equal(model_state_restore_pages(&t.m, &at_nt, entry, fix_nt, NT), 0);
    assert_int_equal(model_state_restore_pages(&t.m, &at_pre, entry, fix_pre, PRE), 0);
    assert_int_equal(at_nt.len, NT);
    assert_int_equal(pool.ref[entry[0]], 4);
    assert_int_equal(pool.n_free, 6); // nothing copied yet
    // at_pre writes rows [PRE, NT) of its own: its copy of page 1 (rows below PRE)
    assert_int_equal(model_prefill(&t.r, &at_pre, alt + PRE, NT - PRE, 64, la), 0);
    assert_int_equal(model_prefill(&t.r, &cont, alt, PRE, 64, NULL), 0); // the chunks orig was fed in
    assert_int_equal(model_prefill(&t.r, &cont, alt + PRE, NT - PRE, 64, lb), 0);
    assert_memory_equal(la, lb, vb);
    assert_true(at_pre.pages[1] != entry[1]);
    assert_int_equal(at_pre.pages[0], entry[0]);
    assert_int_equal(pool.n_free, 5);
    for (int i = NT; i < NT + D; i++) {
        assert_int_equal(model_step(&t.r, &at_pre, &alt[i], la), 0);
        assert_int_equal(model_step(&t.r, &cont, &alt[i], lb), 0);
        assert_memory_equal(la, lb, vb);
    }
    // the original and the state restored at NT: the entry's rows as they were
    model_state_reset(&t.m, &cont);
    assert_int_equal(cont.len, 0);
    assert_int_equal(model_prefill(&t.r, &cont, ids, PRE, 64, NULL), 0);
    assert_int_equal(model_prefill(&t.r, &cont, ids + PRE, NT - PRE, 64, NULL), 0);
    model_state_t *both[2] = {&orig, &at_nt};
    for (int i = NT; i < NT + D; i++) {
        for (int k = 0; k < 2; k++) {
            assert_int_equal(model_step(&t.r, both[k], &ids[i], la), 0);
            if (k == 0) assert_int_equal(model_step(&t.r, &cont, &ids[i], lb), 0);
            assert_memory_equal(la, lb, vb);
        }
    }
    assert_true(orig.pages[1] != entry[1] && at_nt.pages[1] != entry[1] && orig.pages[1] != at_nt.pages[1]);
    assert_int_equal(pool.ref[entry[1]], 1); // the entry's alone now
    assert_int_equal(pool.ref[entry[0]], 4);
    model_pool_release(&pool, entry, 2);
    model_state_free(&t.m, &orig);
    model_state_free(&t.m, &at_nt);
    model_state_free(&t.m, &at_pre);
    assert_int_equal(pool.n_free, 8);
    model_state_free(&t.m, &cont);
    be->free(be, fix_pre), be->free(be, fix_nt);
    model_pool_free(&t.m, &pool);
    free(la), free(lb);
    tiny_close(&t);
}

// A pool without a free page: the reserve fails with ERR_NOMEM naming the
// pool, keeps the pages it got, and the state serves on within them; a state
// freed gives them back. A pool of no pages is refused.
static void test_pool_exhaustion(void **state) {
    tiny_t t;
    tiny_open(&t);
    model_pool_t pool;
    assert_int_equal(model_pool_create(&t.m, &pool, 0), ERR_INPUT);
    assert_int_equal(model_pool_create(&t.m, &pool, 2), 0);
    model_state_t st;
    assert_int_equal(model_state_alloc_paged(&t.m, &st, &pool, 2048), 0);
    assert_int_equal(model_state_reserve(&t.m, &st, 600), ERR_NOMEM);
    printf("  %s\n", err_msg());
    assert_non_null(strstr(err_msg(), "the page pool is full: 600 tokens need 3 pages of 256 tokens"));
    assert_int_equal(st.n_pages, 2);
    assert_int_equal(st.cap, 2 * BE_PAGE_ROWS);
    assert_int_equal(pool.n_free, 0);
    assert_int_equal(model_state_reserve(&t.m, &st, 4096), ERR_INPUT); // beyond its context
    enum { N = 2 * BE_PAGE_ROWS };
    int32_t ids[N];
    make_ids(ids, N, t.V, 2);
    float *lg = malloc((size_t)t.V * sizeof(float));
    assert_int_equal(model_prefill(&t.r, &st, ids, N - 1, 100, lg), 0);
    assert_int_equal(model_step(&t.r, &st, &ids[N - 1], lg), 0); // the last row of the pool
    assert_int_equal(model_step(&t.r, &st, &ids[0], lg), ERR_NOMEM);
    assert_int_equal(st.len, N);
    model_state_free(&t.m, &st);
    assert_int_equal(pool.n_free, 2);
    model_pool_free(&t.m, &pool);
    free(lg);
    tiny_close(&t);
}

// A prefill over a paged cache whose pages lie out of order (page 0 of the
// sequence last in the buffer) in tiles of 64 keys, gathered page by page
// (attention: attn.c cached_attn; MLA: mla.c attend_cache), chunk after
// chunk across the page boundaries: every position within fp32 association
// of one cache-less forward over the whole sequence (1e-5 relative, as
// test_mla.c's tiles; a key dropped, counted twice or read from the wrong
// page moves an output by ~1/T or more).
static void paged_tiles_case(int layer) {
    tiny_t t;
    tiny_open(&t);
    const arch_t *a = &t.m.a;
    enum { T = 600, ROOM = 3 * BE_PAGE_ROWS };
    int d = a->d;
    int64_t w = a->kind[layer] == LAYER_ATTN ? (int64_t)a->Hkv * a->dh : arch_mla_rkv(a, layer) + a->mla.d_rope;
    layer_ctx_t c;
    tu_ctx(&c, a, layer);
    float *x = tu_rnd((int64_t)T * d, 40 + layer, 1.0f), *ref = malloc(sizeof(float) * T * d);
    float *got = malloc(sizeof(float) * T * d);
    const layer_w_t *lw = &t.m.lw[layer];
    assert_int_equal(model_mixer_forward(&c, lw, ref, x, 1, T, 0, NULL, NULL), 0);
    int32_t pages[3] = {2, 0, 1};
    layer_cache_t cache = {.B = 1, .cap = ROOM, .ctx = ROOM, .pages = pages, .page_stride = 3, .pool_rows = ROOM};
    float *k = calloc((size_t)ROOM * w, sizeof(float)), *v = calloc((size_t)ROOM * w, sizeof(float));
    if (a->kind[layer] == LAYER_ATTN)
        cache.u.attn.k = k, cache.u.attn.v = v;
    else
        cache.u.mla.kv = k;
    c.cache_tile_keys = 64;
    const int chunks[4] = {200, 100, 250, 50};
    for (int i = 0, t0 = 0; i < 4; t0 += chunks[i++]) {
        tu_ctx_reset(&c);
        assert_int_equal(
            model_mixer_forward(&c, lw, got + (int64_t)t0 * d, x + (int64_t)t0 * d, 1, chunks[i], t0, &cache, NULL), 0);
        cache.len += chunks[i];
    }
    double worst = 0;
    for (int r = 0; r < T; r++) {
        double e = tu_rel_err(got + (int64_t)r * d, ref + (int64_t)r * d, d);
        if (!(e <= worst)) worst = e;
    }
    printf("  layer %d (%s): paged prefill in tiles of 64 keys, max rel err per position %.2e\n", layer,
           layer_kind_name(a->kind[layer]), worst);
    assert_true(worst < 1e-5);
    free(x), free(ref), free(got), free(k), free(v);
    tu_ctx_free(&c);
    tiny_close(&t);
}
static void test_paged_prefill_tiles(void **state) {
    paged_tiles_case(2); // attention
    paged_tiles_case(0); // MLA
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_equals_contiguous), cmocka_unit_test(test_pages_reused),
        cmocka_unit_test(test_share_copy_on_write),     cmocka_unit_test(test_pool_exhaustion),
        cmocka_unit_test(test_paged_prefill_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
