// The inference state's growing caches (model_state_t): a state for a huge
// context starts small; growth by use gives the bits of a state allocated at
// full size; an allocation that fails says what it asked for and leaves a
// usable state; and `hylo info`'s bytes per token are the bytes a state
// allocates per token.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/err.h"
#include "base/fs.h"
#include "model/checkpoint.h"
#include "model/layer.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "testutil.h"

// Every mixer kind: two MLA layers and one attention layer grow, GDN and
// Mamba-2 states are fixed (test_model.c's tiny hybrid without YaRN).
static arch_t tiny_hybrid(void) {
    const layer_kind_t plan[6] = {LAYER_MLA, LAYER_M2, LAYER_ATTN, LAYER_GDN, LAYER_MLA, LAYER_M2};
    return tu_tiny_arch(plan, 6, 0, 0);
}

// Per token of one sequence in fp32: MLA 2 x (12 + 4) x 4 + attention 2 x 2 x 8 x 4.
enum { PER_TOKEN = 2 * 16 * 4 + 2 * 2 * 8 * 4 };

typedef struct {
    model_t m;
    model_run_t r;
} tiny_t;

static void tiny_open(tiny_t *t, const arch_t *a) {
    assert_int_equal(model_create(&t->m, a, tu_cpu()), 0);
    assert_int_equal(model_run_create(&t->r, &t->m, 64u << 20), 0);
    float *w = tu_params(&t->m.pt, 11, 0.3f);
    memcpy(t->m.w, w, (size_t)t->m.pt.total * sizeof(float)); // CPU backend: act == float
    free(w);
}

static void tiny_close(tiny_t *t) {
    model_run_free(&t->r);
    model_free(&t->m);
}

// What info prints, what the model's backend allocates and the state's
// bytes: all one figure.
static void assert_accounted(const model_t *m, const model_state_t *st) {
    assert_int_equal(model_cache_bytes_per_token(m), PER_TOKEN);
    assert_int_equal(arch_cache_bytes_per_token(&m->a, (int)be_act_size_of("cpu")), PER_TOKEN);
    assert_int_equal(st->cache_bytes, (size_t)st->B * st->cap * PER_TOKEN);
    assert_int_equal(st->bytes, st->fixed_bytes + st->cache_bytes);
}

// A context of 2^20 tokens for 2 sequences would be 2 x 2^20 x 256 B = 512 MiB
// allocated and zeroed up front; the state takes room for MODEL_STATE_CAP0
// tokens, and reserving grows it to what is asked and no further than ctx.
static void test_huge_ctx_starts_small(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 2, 1 << 20), 0);
    printf("  ctx 2^20, 2 sequences: room for %d tokens, %zu bytes of cache + %zu of fixed states\n", st.cap,
           st.cache_bytes, st.fixed_bytes);
    assert_int_equal(st.ctx, 1 << 20);
    assert_int_equal(st.cap, MODEL_STATE_CAP0);
    assert_int_equal(st.cache_bytes, 2 * MODEL_STATE_CAP0 * PER_TOKEN); // 128 KiB
    assert_true(st.fixed_bytes < 64 * 1024);
    assert_accounted(&t.m, &st);
    // doubling while that covers the request, else the request
    assert_int_equal(model_state_reserve(&t.m, &st, 300), 0);
    assert_int_equal(st.cap, 2 * MODEL_STATE_CAP0);
    assert_int_equal(model_state_reserve(&t.m, &st, 5000), 0);
    assert_int_equal(st.cap, 5000);
    assert_accounted(&t.m, &st);
    assert_int_equal(model_state_reserve(&t.m, &st, 100), 0); // never shrinks
    assert_int_equal(st.cap, 5000);
    assert_int_equal(model_state_reserve(&t.m, &st, (1 << 20) + 1), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "exceed the state's context of 1048576"));
    // the last doubling stops at ctx
    model_state_t small;
    assert_int_equal(model_state_alloc(&t.m, &small, 1, 700), 0);
    assert_int_equal(small.cap, MODEL_STATE_CAP0);
    assert_int_equal(model_state_reserve(&t.m, &small, 400), 0);
    assert_int_equal(small.cap, 512);
    assert_int_equal(model_state_reserve(&t.m, &small, 513), 0);
    assert_int_equal(small.cap, 700);
    model_state_free(&t.m, &small);
    assert_int_equal(model_state_alloc(&t.m, &small, 1, 20), 0); // smaller than the first room
    assert_int_equal(small.cap, 20);
    assert_accounted(&t.m, &small);
    model_state_free(&t.m, &small);
    model_state_free(&t.m, &st);
    tiny_close(&t);
}

enum { B = 2, T = 700, P = 300 };

// model_state_fit: exactly the room asked for (reserve would double), never
// shrinking, never past ctx.
static void test_fit_is_exact(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 1 << 20), 0);
    assert_int_equal(st.cap, MODEL_STATE_CAP0);
    assert_int_equal(model_state_fit(&t.m, &st, 300), 0);
    assert_int_equal(st.cap, 300);
    assert_accounted(&t.m, &st);
    assert_int_equal(model_state_fit(&t.m, &st, 100), 0);
    assert_int_equal(st.cap, 300);
    assert_int_equal(model_state_fit(&t.m, &st, (1 << 20) + 1), ERR_INPUT);
    assert_int_equal(st.cap, 300);
    model_state_free(&t.m, &st);
    tiny_close(&t);
}

// A prefill readies the RoPE tables for twice what it feeds (at most the
// state's context limit), so that the decode steps after it do not rebuild them: tables grown
// only to what a prefill fed were rebuilt on the host inside the first decode
// step after a prompt of a power of two tokens (run 23's 3B long-context
// decode paid it at every length). A hybrid with no attention layer has no
// attention tables.
static void test_rope_tables_ahead(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    assert_int_equal(t.m.rope_npos, MODEL_ROPE_POS0);
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 1 << 30), 0); // a far limit: not what is readied
    int32_t ids[512];
    for (int i = 0; i < 512; i++)
        ids[i] = (i * 7 + 3) % a.V;
    float *lg = malloc(sizeof(float) * a.V);
    assert_int_equal(model_prefill(&t.r, &st, ids, 512, 128, lg), 0);
    assert_int_equal(t.m.rope_npos, 1024); // twice the 512 fed (chunk by chunk: doubling)
    const float *cos0 = t.m.rope_cos, *mla0 = t.m.mla_cos;
    assert_non_null(cos0);
    assert_non_null(mla0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(model_step(&t.r, &st, &ids[i], lg), 0);
    assert_ptr_equal(t.m.rope_cos, cos0); // not rebuilt
    assert_ptr_equal(t.m.mla_cos, mla0);
    model_state_free(&t.m, &st);
    free(lg);
    tiny_close(&t);

    const layer_kind_t plan[3] = {LAYER_MLA, LAYER_GDN, LAYER_GDN};
    arch_t h = tu_tiny_arch(plan, 3, 0, 0);
    tiny_open(&t, &h);
    assert_null(t.m.rope_cos);
    assert_non_null(t.m.mla_cos);
    tiny_close(&t);
}

// Resident pages of [p, p + n) (mincore; whole pages inside the range).
static size_t resident_pages(const void *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
              e = ((uintptr_t)p + n) & ~(pg - 1);
    if (e <= a) return 0;
    size_t np = (e - a) / pg, r = 0;
    unsigned char *v = malloc(np);
    assert_non_null(v);
    assert_int_equal(mincore((void *)a, e - a, v), 0);
    for (size_t i = 0; i < np; i++)
        r += v[i] & 1;
    free(v);
    return r;
}

// model_run_trim after a prefill (what gen_run does): the arena's and the
// scratch's pages leave the resident set, and the decode steps that follow
// give the bits they give without it.
static void test_trim_after_prefill(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    be_t *be = t.m.be;
    int V = t.m.a.V, n = 200;
    int32_t ids[201];
    for (int i = 0; i < 201; i++)
        ids[i] = (i * 13 + 1) % V;
    float *lg = malloc(4 * (size_t)V * sizeof(float));
    model_state_t st[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(model_state_alloc(&t.m, &st[k], 1, 512), 0);
        assert_int_equal(model_prefill(&t.r, &st[k], ids, n, 0, lg + (size_t)k * 2 * V), 0);
        if (k == 1) {
            size_t before = resident_pages(t.r.arena.base, t.r.arena.peak);
            printf("  arena: %zu pages resident after the prefill\n", before);
            assert_true(before > 0);
            model_run_trim(&t.r);
            assert_int_equal(t.r.arena.used, 0);
            assert_int_equal(resident_pages(t.r.arena.base, t.r.arena.peak), 0);
            assert_int_equal(resident_pages(be->scratch.base, be->scratch.peak), 0);
        }
        assert_int_equal(model_step(&t.r, &st[k], &ids[n], lg + (size_t)k * 2 * V + V), 0);
    }
    assert_memory_equal(lg, lg + 2 * (size_t)V, 2 * (size_t)V * sizeof(float));
    for (int k = 0; k < 2; k++)
        model_state_free(&t.m, &st[k]);
    free(lg);
    tiny_close(&t);
}

// B sequences: a prefill of P tokens in chunks of 64, then decode steps to T
// tokens; the logits of every step into lg [T - P + 1][B, V].
static void run(tiny_t *t, model_state_t *st, const int32_t *ids, float *lg, int *caps, int *n_caps) {
    int V = t->m.a.V;
    int32_t prompt[B * P], step[B];
    for (int b = 0; b < B; b++)
        memcpy(prompt + b * P, ids + b * T, P * sizeof(int32_t));
    assert_int_equal(model_prefill(&t->r, st, prompt, P, 64, lg), 0);
    *n_caps = 0;
    caps[(*n_caps)++] = st->cap;
    for (int i = P; i < T; i++) {
        for (int b = 0; b < B; b++)
            step[b] = ids[b * T + i];
        assert_int_equal(model_step(&t->r, st, step, lg + (int64_t)(i - P + 1) * B * V), 0);
        if (st->cap != caps[*n_caps - 1]) caps[(*n_caps)++] = st->cap;
        assert_accounted(&t->m, st);
    }
}

// Growing by use is a copy of the rows held: the same operations on the same
// values as in a state that had room for everything from the start, so the
// same bits (B = 2: each sequence's rows move to a new stride).
static void test_growth_is_exact(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    int V = t.m.a.V;
    int32_t ids[B * T];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 13 + 1) % V;
    size_t n = (size_t)(T - P + 1) * B * V;
    float *grown = malloc(n * sizeof(float)), *full = malloc(n * sizeof(float));
    int caps[8], n_caps, caps_full[8], n_full;
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, B, T), 0);
    assert_int_equal(st.cap, MODEL_STATE_CAP0);
    run(&t, &st, ids, grown, caps, &n_caps);
    printf("  room along the run:");
    for (int i = 0; i < n_caps; i++)
        printf(" %d", caps[i]);
    printf(" tokens\n");
    // the prefill of 300 took 512 at once; decoding went on to 700 (= ctx)
    assert_int_equal(n_caps, 2);
    assert_int_equal(caps[0], 512);
    assert_int_equal(caps[1], T);
    // a second sequence in the grown state: reset keeps the room, zeroes the states
    model_state_reset(&t.m, &st);
    float *again = malloc(n * sizeof(float));
    run(&t, &st, ids, again, caps, &n_caps);
    assert_int_equal(n_caps, 1);
    model_state_free(&t.m, &st);
    assert_int_equal(model_state_alloc(&t.m, &st, B, T), 0);
    assert_int_equal(model_state_reserve(&t.m, &st, T), 0);
    assert_int_equal(st.cap, T);
    run(&t, &st, ids, full, caps_full, &n_full);
    assert_int_equal(n_full, 1);
    assert_memory_equal(grown, full, n * sizeof(float));
    assert_memory_equal(again, full, n * sizeof(float));
    model_state_free(&t.m, &st);
    free(grown), free(full), free(again);
    tiny_close(&t);
}

// The process's address space now, in bytes (/proc/self/statm: pages; read
// with stdio, as the file's size reads as 0).
static size_t vm_size(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    size_t pages = 0;
    assert_int_equal(fscanf(f, "%zu", &pages), 1);
    fclose(f);
    return pages * (size_t)sysconf(_SC_PAGESIZE);
}

// Out of memory while growing: ERR_NOMEM naming the tokens and bytes asked
// for, never a crash, and the state still serves. Under an address-space limit
// 192 MiB above what the process holds: 2^24 tokens (4 GiB) fail at the first
// layer; 2^21 tokens (128 MiB per buffer) grow the first MLA layer and fail at
// the attention layer's K, leaving layers of different room, which the layers
// must follow (each reads its own stride).
static void test_out_of_memory(void **state) {
#ifdef __SANITIZE_ADDRESS__ // the sanitizer reserves far more address space than it maps
    printf("  sanitizer build: an address-space limit cannot be applied\n");
    skip();
#endif
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    int V = t.m.a.V;
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 1 << 30), 0);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)(vm_size() + ((size_t)192 << 20));
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    int rc1 = model_state_reserve(&t.m, &st, 1 << 24);
    char msg1[512];
    snprintf(msg1, sizeof msg1, "%s", err_msg());
    int cap1 = st.cap;
    size_t bytes1 = st.cache_bytes;
    int rc2 = model_state_reserve(&t.m, &st, 1 << 21);
    char msg2[512];
    snprintf(msg2, sizeof msg2, "%s", err_msg());
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    printf("  %s\n  %s\n", msg1, msg2);
    assert_int_equal(rc1, ERR_NOMEM);
    assert_non_null(strstr(msg1, "cannot grow the cache to 16777216 tokens for 1 sequence: 4294967296 bytes (256 "
                                 "per token), 65536 held now"));
    assert_int_equal(cap1, MODEL_STATE_CAP0); // nothing grown
    assert_int_equal(bytes1, MODEL_STATE_CAP0 * PER_TOKEN);
    assert_int_equal(rc2, ERR_NOMEM);
    assert_non_null(strstr(msg2, "cannot grow the cache to 2097152 tokens for 1 sequence: 536870912 bytes"));
    assert_int_equal(st.layers[0].cap, 1 << 21); // the first MLA layer grew
    assert_int_equal(st.layers[2].cap, MODEL_STATE_CAP0);
    assert_int_equal(st.cap, MODEL_STATE_CAP0); // the room every layer has
    assert_int_equal(st.cache_bytes, MODEL_STATE_CAP0 * PER_TOKEN + (size_t)((1 << 21) - MODEL_STATE_CAP0) * 64);
    // The state serves on, through further growth: the logits of a fresh one.
    enum { N = 600 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (i * 7 + 2) % V;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    model_state_t ref;
    assert_int_equal(model_state_alloc(&t.m, &ref, 1, N), 0);
    assert_int_equal(model_prefill(&t.r, &st, ids, 200, 0, la), 0);
    assert_int_equal(model_prefill(&t.r, &ref, ids, 200, 0, lb), 0);
    for (int i = 200; i < N; i++) {
        assert_int_equal(model_step(&t.r, &st, &ids[i], la), 0);
        assert_int_equal(model_step(&t.r, &ref, &ids[i], lb), 0);
        assert_memory_equal(la, lb, (size_t)V * sizeof(float));
    }
    assert_int_equal(st.cap, 2 * MODEL_STATE_CAP0 * 2); // 256 -> 512 -> 1024 on the layers that had not grown
    free(la), free(lb);
    model_state_free(&t.m, &ref);
    model_state_free(&t.m, &st);
    tiny_close(&t);
}

// The number after `label` on its line of `text` ("46,080" -> 46080).
static long long figure_after(const char *text, const char *label) {
    const char *p = strstr(text, label);
    assert_non_null(p);
    p += strlen(label);
    while (*p == ' ')
        p++;
    long long v = 0;
    for (; (*p >= '0' && *p <= '9') || *p == ','; p++)
        if (*p != ',') v = v * 10 + (*p - '0');
    return v;
}

// `hylo info` on a checkpoint of the tiny hybrid (its Mamba-2 layers made GDN:
// hybrid_config.json has no form for both): its cpu figure is what a CPU state
// allocates per token (cache_bytes / cap), its cuda figure the same cache in
// bf16, and the recurrent state what the fixed block holds (less the 256-byte
// alignment of each of its 12 buffers, 4 per GDN layer).
static void test_info_is_the_allocation(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    a.kind[1] = a.kind[5] = LAYER_GDN;
    tiny_open(&t, &a);
    const char *dir = tu_tmp_path("tiny_hybrid");
    float *w = tu_params(&t.m.pt, 11, 0.3f);
    assert_int_equal(ckpt_write(dir, &t.m.a, &t.m.pt, w, ST_F32, NULL, NULL), 0);
    free(w);
    char args[600], *out;
    snprintf(args, sizeof args, "info %s", dir);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    assert_int_equal(fs_read_all(tu_tmp_path("out.txt"), &out, NULL), 0);
    long long cpu = figure_after(out, "KV cache"),
              cuda = figure_after(strstr(out, "KV cache"), "per token on cpu (fp32),");
    long long fixed = figure_after(out, "recurrent state");
    printf("  info: %lld bytes per token on cpu, %lld on cuda; recurrent state %lld bytes\n", cpu, cuda, fixed);
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 4096), 0);
    for (int n = 1; n <= 3; n++) {
        assert_int_equal(st.cache_bytes % (size_t)st.cap, 0);
        assert_int_equal((long long)(st.cache_bytes / (size_t)st.cap), cpu);
        assert_int_equal(model_state_reserve(&t.m, &st, st.cap + 1), 0);
    }
    assert_int_equal(cpu, PER_TOKEN);
    assert_int_equal(cuda, PER_TOKEN / 2); // the same elements in bf16
    assert_true((long long)st.fixed_bytes >= fixed && (long long)st.fixed_bytes < fixed + 12 * 256);
    model_state_free(&t.m, &st);
    free(out);
    tiny_close(&t);
}

// Snapshot and restore (the server's prefix cache): a state restored from a
// snapshot gives the bits the original gives (the same arithmetic on the same
// bytes: memcmp, no tolerance), whether restored at the snapshot's own length
// or at a shorter prefix (the first rows of the longer snapshot with the fixed
// states taken there), into a state that must grow first (n > MODEL_STATE_CAP0)
// and into one that held another sequence. Without the fixed states the
// logits differ, so the comparison can fail.
static void test_snapshot_restore(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    be_t *be = t.m.be;
    enum { NT = 300, PRE = 264, CH = 64 };
    int V = t.m.a.V;
    int32_t ids[NT + 1];
    for (int i = 0; i <= NT; i++)
        ids[i] = (i * 7 + 3) % V;
    int64_t rb = model_snapshot_rows_bytes(&t.m, NT), fb = model_snapshot_fixed_bytes(&t.m);
    assert_int_equal(rb, (int64_t)NT * PER_TOKEN);
    assert_true(fb > 0);
    void *rows = be->alloc(be, (size_t)rb), *fix_p = be->alloc(be, (size_t)fb), *fix_n = be->alloc(be, (size_t)fb);
    size_t vb = (size_t)V * sizeof(float);
    float *want = malloc(3 * vb), *got = malloc(3 * vb);
    // the original: PRE tokens, the fixed states at PRE, the rest, everything at NT, a step
    model_state_t st;
    assert_int_equal(model_state_alloc(&t.m, &st, 1, 1024), 0);
    assert_int_equal(model_prefill(&t.r, &st, ids, PRE, CH, NULL), 0);
    assert_int_equal(model_state_snapshot(&t.m, &st, 0, PRE, NULL, fix_p), 0);
    assert_int_equal(model_prefill(&t.r, &st, ids + PRE, NT - PRE, CH, want), 0);
    assert_int_equal(model_state_snapshot(&t.m, &st, 0, NT, rows, fix_n), 0);
    assert_int_equal(model_state_snapshot(&t.m, &st, 0, NT + 1, rows, fix_n), ERR_INPUT);
    assert_int_equal(model_step(&t.r, &st, &ids[NT], want + V), 0);
    model_state_free(&t.m, &st);

    model_state_t r;
    assert_int_equal(model_state_alloc(&t.m, &r, 1, 1024), 0);
    assert_int_equal(model_prefill(&t.r, &r, ids + 5, 40, CH, NULL), 0); // something else first
    // at NT: the step's logits
    assert_int_equal(model_state_restore(&t.m, &r, rows, NT, fix_n, NT), 0);
    assert_int_equal(r.len, NT);
    assert_int_equal(model_step(&t.r, &r, &ids[NT], got + V), 0);
    assert_memory_equal(got + V, want + V, vb);
    // at PRE from the snapshot of NT: the rest's prefill, then the step
    assert_int_equal(model_state_restore(&t.m, &r, rows, NT, fix_p, PRE), 0);
    assert_int_equal(model_prefill(&t.r, &r, ids + PRE, NT - PRE, CH, got), 0);
    assert_memory_equal(got, want, vb);
    assert_int_equal(model_step(&t.r, &r, &ids[NT], got + V), 0);
    assert_memory_equal(got + V, want + V, vb);
    // the fixed states matter: those of NT at PRE give other logits
    assert_int_equal(model_state_restore(&t.m, &r, rows, NT, fix_n, PRE), 0);
    assert_int_equal(model_prefill(&t.r, &r, ids + PRE, NT - PRE, CH, got), 0);
    assert_true(memcmp(got, want, vb) != 0);
    // bad requests leave the state alone
    int len = r.len;
    assert_int_equal(model_state_restore(&t.m, &r, rows, NT, fix_n, NT + 1), ERR_INPUT);
    assert_int_equal(model_state_restore(&t.m, &r, rows, NT, NULL, PRE), ERR_INPUT);
    assert_int_equal(r.len, len);
    model_state_free(&t.m, &r);
    be->free(be, rows), be->free(be, fix_p), be->free(be, fix_n);
    free(want), free(got);
    tiny_close(&t);
}

// Batched prefill (model_prefill_batch): chunks of 5, 23 and 41 tokens of
// three states already at 0, 10 and 37 tokens, through every mixer kind, in
// one forward against each state's chunk alone (model_prefill): the logits
// asked for, the lengths, and a decode step of all three afterwards. The
// projections see 69 rows instead of each chunk's own: OpenBLAS may round a
// row differently with another row count, so the bound is fp32's (1e-5);
// a mixer that read another state's cache or position is O(1) off.
static void test_prefill_batch(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    int V = t.m.a.V;
    enum { K = 3 };
    const int pre[K] = {0, 10, 37}, n[K] = {5, 23, 41};
    const uint8_t want[K] = {1, 0, 1};
    int32_t ids[K][100];
    for (int k = 0; k < K; k++)
        for (int i = 0; i < 100; i++)
            ids[k][i] = (i * 13 + k * 29 + 5) % V;
    model_state_t alone[K], batch[K];
    model_state_t *pa[K], *pb[K];
    float *la = malloc(sizeof(float) * K * V), *lb = malloc(sizeof(float) * K * V);
    for (int k = 0; k < K; k++) {
        assert_int_equal(model_state_alloc(&t.m, &alone[k], 1, 512), 0);
        assert_int_equal(model_state_alloc(&t.m, &batch[k], 1, 512), 0);
        if (pre[k]) {
            assert_int_equal(model_prefill(&t.r, &alone[k], ids[k], pre[k], 16, NULL), 0);
            assert_int_equal(model_prefill(&t.r, &batch[k], ids[k], pre[k], 16, NULL), 0);
        }
        pa[k] = &alone[k], pb[k] = &batch[k];
    }
    for (int k = 0, j = 0; k < K; k++) {
        assert_int_equal(model_prefill(&t.r, &alone[k], ids[k] + pre[k], n[k], n[k], la + (size_t)j * V), 0);
        j += want[k];
    }
    const int32_t *chunks[K] = {ids[0] + pre[0], ids[1] + pre[1], ids[2] + pre[2]};
    assert_int_equal(model_prefill_batch(&t.r, pb, K, chunks, n, want, lb), 0);
    double worst = tu_rel_err(lb, la, (int64_t)2 * V);
    for (int k = 0; k < K; k++)
        assert_int_equal(batch[k].len, pre[k] + n[k]);
    int32_t next[K] = {7, 8, 9};
    assert_int_equal(model_step_batch(&t.r, pa, K, next, la), 0);
    assert_int_equal(model_step_batch(&t.r, pb, K, next, lb), 0);
    double worst_step = tu_rel_err(lb, la, (int64_t)K * V);
    printf("  3 chunks in one forward vs alone: logits rel err %.2e, the next decode step %.2e\n", worst, worst_step);
    assert_true(worst < 1e-5);
    assert_true(worst_step < 1e-5);
    // refused: a state of 2 sequences, an empty chunk, a chunk past the context
    model_state_t two;
    assert_int_equal(model_state_alloc(&t.m, &two, 2, 64), 0);
    model_state_t *pt[1] = {&two};
    assert_int_equal(model_prefill_batch(&t.r, pt, 1, chunks, n, NULL, lb), ERR_INPUT);
    const int zero[1] = {0}, big[1] = {600};
    assert_int_equal(model_prefill_batch(&t.r, pb, 1, chunks, zero, NULL, lb), ERR_INPUT);
    assert_int_equal(model_prefill_batch(&t.r, pb, 1, chunks, big, NULL, lb), ERR_INPUT);
    assert_int_equal(batch[0].len, pre[0] + n[0] + 1); // refusals leave the states as they were
    model_state_free(&t.m, &two);
    for (int k = 0; k < K; k++) {
        model_state_free(&t.m, &alone[k]);
        model_state_free(&t.m, &batch[k]);
    }
    free(la), free(lb);
    tiny_close(&t);
}

// Decode rows riding in a prefill (model_prefill_batch with one-token
// chunks, as the server's turns give it): five states in the caller's order
// C, A, E, D, B, where A (at 10 tokens) and B (at 0) take chunks of 23 and 41
// tokens, C (at 7) and D (at 30, paged) decode one token and E (at 0) is a
// one-token prompt, in one forward. Against the same states fed apart (A and
// B by model_prefill_batch, C, E and D by one model_step_batch): the logits
// asked for, in the caller's order, the lengths, every cached row and fixed
// state, and a decode step of all five afterwards. The rows the forward
// shares go through products of 69 rows instead of 64 and 3 (OpenBLAS may
// round a row differently with another row count) and the decode rows'
// output projections, adds and norms run unfused (a step of few rows fuses
// them), so the bound is fp32's, 1e-5 (measured on the development
// machine: 1.2e-7 on a logits row, the caches and the next step equal); a
// decode row that read another state's cache, position or window is O(1)
// off (a state fed one other token: 0.47). Then a batch of one-token chunks
// alone is a decode step: its logits are model_step_batch's bit for bit
// (memcmp).
enum { RIDE_K = 5 };
static const int ride_pre[RIDE_K] = {7, 10, 0, 30, 0}; // C, A, E, D, B
static const int ride_n[RIDE_K] = {1, 23, 1, 1, 41};

// The five states of a set at their lengths (the same tokens, chunks of 16:
// every set the same bits); D paged over pool.
static void ride_states(tiny_t *t, model_state_t *st, model_state_t **p, model_pool_t *pool, int32_t ids[][64]) {
    for (int k = 0; k < RIDE_K; k++) {
        if (k == 3)
            assert_int_equal(model_state_alloc_paged(&t->m, &st[k], pool, 512), 0);
        else
            assert_int_equal(model_state_alloc(&t->m, &st[k], 1, 512), 0);
        if (ride_pre[k]) assert_int_equal(model_prefill(&t->r, &st[k], ids[k], ride_pre[k], 16, NULL), 0);
        p[k] = &st[k];
    }
}

// The worst relative error between two states' cached rows and fixed states.
static double state_err(tiny_t *t, const model_state_t *x, const model_state_t *y) {
    be_t *be = t->m.be;
    assert_int_equal(x->len, y->len);
    int64_t rb = model_snapshot_rows_bytes(&t->m, x->len), fb = model_snapshot_fixed_bytes(&t->m);
    float *rx = be->alloc(be, (size_t)rb), *ry = be->alloc(be, (size_t)rb);
    float *fx = be->alloc(be, (size_t)fb), *fy = be->alloc(be, (size_t)fb);
    assert_int_equal(model_state_snapshot(&t->m, x, 0, x->len, rx, fx), 0);
    assert_int_equal(model_state_snapshot(&t->m, y, 0, y->len, ry, fy), 0);
    double e = tu_rel_err(rx, ry, rb / 4), f = tu_rel_err(fx, fy, fb / 4);
    be->free(be, rx), be->free(be, ry), be->free(be, fx), be->free(be, fy);
    return e > f ? e : f;
}

static void test_decode_rows_in_prefill(void **state) {
    tiny_t t;
    arch_t a = tiny_hybrid();
    tiny_open(&t, &a);
    int V = t.m.a.V;
    int32_t ids[RIDE_K][64];
    for (int k = 0; k < RIDE_K; k++)
        for (int i = 0; i < 64; i++)
            ids[k][i] = (i * 17 + k * 23 + 2) % V;
    model_pool_t pool;
    assert_int_equal(model_pool_create(&t.m, &pool, 6), 0);
    model_state_t mix[RIDE_K], ref[RIDE_K], one[RIDE_K];
    model_state_t *pm[RIDE_K], *pr[RIDE_K], *po[RIDE_K];
    ride_states(&t, mix, pm, &pool, ids);
    ride_states(&t, ref, pr, &pool, ids);
    ride_states(&t, one, po, &pool, ids);
    size_t vb = (size_t)V * sizeof(float);
    float *lm = malloc(RIDE_K * vb), *lr = malloc(RIDE_K * vb), *lo = malloc(RIDE_K * vb);

    // one forward: C, A, E, D, B; A's logits not asked for
    const uint8_t want[RIDE_K] = {1, 0, 1, 1, 1};
    const int32_t *chunks[RIDE_K];
    for (int k = 0; k < RIDE_K; k++)
        chunks[k] = ids[k] + ride_pre[k];
    assert_int_equal(model_prefill_batch(&t.r, pm, RIDE_K, chunks, ride_n, want, lm), 0);
    // apart: A and B prefilled together (B's logits), C, E, D one step
    model_state_t *pre2[2] = {pr[1], pr[4]}, *dec3[3] = {pr[0], pr[2], pr[3]};
    const int32_t *ch2[2] = {chunks[1], chunks[4]};
    const int n2[2] = {ride_n[1], ride_n[4]};
    const uint8_t want2[2] = {0, 1};
    const int32_t tok3[3] = {chunks[0][0], chunks[2][0], chunks[3][0]};
    assert_int_equal(model_prefill_batch(&t.r, pre2, 2, ch2, n2, want2, lr + 3 * V), 0);
    assert_int_equal(model_step_batch(&t.r, dec3, 3, tok3, lr), 0); // rows C, E, D, then B: the caller's order
    double worst = tu_rel_err(lm, lr, (int64_t)4 * V), worst_row = 0, worst_state = 0;
    for (int j = 0; j < 4; j++) {
        double e = tu_rel_err(lm + (size_t)j * V, lr + (size_t)j * V, V);
        if (e > worst_row) worst_row = e;
    }
    for (int k = 0; k < RIDE_K; k++) {
        assert_int_equal(mix[k].len, ride_pre[k] + ride_n[k]);
        double e = state_err(&t, &mix[k], &ref[k]);
        if (e > worst_state) worst_state = e;
    }
    // the next decode step of all five
    int32_t next[RIDE_K] = {3, 5, 7, 11, 13};
    assert_int_equal(model_step_batch(&t.r, pm, RIDE_K, next, lm), 0);
    assert_int_equal(model_step_batch(&t.r, pr, RIDE_K, next, lr), 0);
    double worst_step = tu_rel_err(lm, lr, (int64_t)RIDE_K * V);
    printf("  2 chunks + 3 one-token rows in one forward vs apart: logits rel err %.2e (worst row %.2e), caches "
           "%.2e, the next decode step %.2e\n",
           worst, worst_row, worst_state, worst_step);
    assert_true(worst_row < 1e-5);
    assert_true(worst_state < 1e-5);
    assert_true(worst_step < 1e-5);

    // one-token chunks alone (C, E, D; E's logits not asked for): the step of
    // the same states and tokens, bit for bit
    model_state_t *one3[3] = {po[0], po[2], po[3]};
    const int32_t *ch3[3] = {chunks[0], chunks[2], chunks[3]};
    const int n1[3] = {1, 1, 1};
    const uint8_t want3[3] = {1, 0, 1};
    assert_int_equal(model_prefill_batch(&t.r, one3, 3, ch3, n1, want3, lo), 0);
    // lr's rows were overwritten by the step above: the reference again, on
    // fresh states of the same bits
    model_state_t again[RIDE_K];
    model_state_t *pa[RIDE_K];
    ride_states(&t, again, pa, &pool, ids);
    model_state_t *dec3b[3] = {pa[0], pa[2], pa[3]};
    assert_int_equal(model_step_batch(&t.r, dec3b, 3, tok3, lr), 0);
    assert_memory_equal(lo, lr, vb);
    assert_memory_equal(lo + V, lr + 2 * V, vb);
    for (int k = 0; k < 3; k++)
        assert_int_equal(one3[k]->len, dec3b[k]->len);

    for (int k = 0; k < RIDE_K; k++) {
        model_state_free(&t.m, &mix[k]);
        model_state_free(&t.m, &ref[k]);
        model_state_free(&t.m, &one[k]);
        model_state_free(&t.m, &again[k]);
    }
    assert_int_equal(pool.n_free, 6);
    model_pool_free(&t.m, &pool);
    free(lm), free(lr), free(lo);
    tiny_close(&t);
}

// The bound a decode step's attention and MLA size their work by: the rows
// after the step's row, rounded up to a power of two from STEP_CTX_MIN, never
// past the context limit (ctx, else cap), and the largest over the runs.
static void test_step_ctx_bucket(void **st) {
    (void)st;
    assert_int_equal(step_ctx_bucket(0, 8192, 0), STEP_CTX_MIN);
    assert_int_equal(step_ctx_bucket(STEP_CTX_MIN - 1, 8192, 0), STEP_CTX_MIN);
    assert_int_equal(step_ctx_bucket(STEP_CTX_MIN, 8192, 0), 2 * STEP_CTX_MIN);
    assert_int_equal(step_ctx_bucket(4095, 8192, 4096), 4096);
    assert_int_equal(step_ctx_bucket(4096, 8192, 4096), 8192);
    assert_int_equal(step_ctx_bucket(5000, 6000, 5001), 6000); // the limit, not 8192
    assert_int_equal(step_ctx_bucket(10, 100, 0), 100);        // a limit under STEP_CTX_MIN
    assert_int_equal(step_ctx_bucket(10, 0, 100), 100);        // no ctx: the cap
    assert_int_equal(step_ctx_bucket(1 << 30, 2000000000, 0), 2000000000);
    layer_cache_t c[2] = {{.len = 300, .ctx = 1 << 20}, {.len = 3000, .ctx = 2048}};
    step_run_t runs[2] = {{.cache = &c[0], .n = 1}, {.cache = &c[1], .n = 1}};
    assert_int_equal(step_max_ctx(runs, 1), 512);
    assert_int_equal(step_max_ctx(runs, 2), 2048);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_ctx_bucket),        cmocka_unit_test(test_huge_ctx_starts_small),
        cmocka_unit_test(test_fit_is_exact),           cmocka_unit_test(test_rope_tables_ahead),
        cmocka_unit_test(test_trim_after_prefill),     cmocka_unit_test(test_growth_is_exact),
        cmocka_unit_test(test_out_of_memory),          cmocka_unit_test(test_info_is_the_allocation),
        cmocka_unit_test(test_snapshot_restore),       cmocka_unit_test(test_prefill_batch),
        cmocka_unit_test(test_decode_rows_in_prefill),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
